"""The touch-order file: the one definition of its format, which
Result.save_touch_order writes and Config.replay_from (read_touch_order)
reads back.

A ``#`` comment line saying what it is and the page size its indices count
in, then one non-negative page index a line, in the order faults installed
the pages. Blank lines and other ``#`` lines are skipped.

The reader takes the file as untrusted input: it opens only a regular file
(a FIFO would block the open, /dev/zero never end), reads it a bounded line
at a time (a gigabyte with no newline is refused at its first
MAX_LINE_BYTES), stops once it holds more indices than the region has
pages (max_pages), and names the line of anything that is not an index.
"""
from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence

_HEADER = ("# uffdkvm touch_order: {count} page indices ({page_size}-byte pages from the "
           "region's start), in the order faults installed them\n")
# The header's page size, as _HEADER writes it.
_PAGE_SIZE_RE = re.compile(r"\((\d+)-byte pages")
_WRITTEN_BY_US = "# uffdkvm touch_order:"

#: With max_pages, the most bytes read: an index line of 20 digits and CRLF
#: for each page, and this much more for comments and blank lines.
SLACK_BYTES = 1 << 20
_LINE_BYTES = 22
#: The longest line read: an index has 20 digits at most (2^64 - 1), and a
#: comment this long is not one that Result.save_touch_order wrote.
MAX_LINE_BYTES = 4096
_INDEX_RE = re.compile(r"[0-9]{1,20}")  # ASCII digits: str.isdigit() takes '²' too
_INDEX_MAX = (1 << 64) - 1

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


class FormatError(ValueError):
    """The file cannot be read, or a line is not a page index (the message
    names the path and the line)."""


def write(path: str | os.PathLike[str], order: Sequence[int], page_size: int) -> None:
    """Writes order (page indices of page_size-byte pages) to path."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(_HEADER.format(count=len(order), page_size=page_size))
        f.write("".join(f"{page}\n" for page in order))


def _open(name: str, path: str | os.PathLike[str]) -> tuple[int, int]:
    """A read-only fd of path, a regular file (else FormatError), and its size."""
    try:
        # O_NONBLOCK: a FIFO's open would wait for a writer; it is refused below instead.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        why = e.strerror if isinstance(e, OSError) else str(e)
        raise FormatError(f"cannot read {name!r}: {why}") from None
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise FormatError(f"cannot read {name!r}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = next((what for test, what in _KINDS if test(st.st_mode)), "not a regular file")
        raise FormatError(f"cannot read {name!r}: it is {kind}, not a touch-order file (a "
                          f"regular file, as Result.save_touch_order writes)")
    return fd, st.st_size


def read(path: str | os.PathLike[str], *,
         max_pages: int | None = None) -> tuple[tuple[int, ...], int | None]:
    """The page indices path holds, and the page size its first comment line
    says they count in (None: it says none). max_pages: the region's pages;
    an index past them, one given twice, or more indices than that, is an
    error naming its line, and reading stops there."""
    name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else repr(path)
    pages: list[int] = []
    seen: set[int] = set()
    page_size = None
    seen_comment = written_by_us = False
    n = done = 0

    def bad(why: str) -> FormatError:
        return FormatError(f"{name!r} line {n}: {why}")

    fd, size = _open(name, path)
    limit = None if max_pages is None else max_pages * _LINE_BYTES + SLACK_BYTES
    if limit is not None and size > limit:
        os.close(fd)
        raise FormatError(f"{name!r} is {size} bytes, more than a touch order of the region's "
                          f"{max_pages} pages can be ({limit} bytes: {_LINE_BYTES} a page and "
                          f"{SLACK_BYTES} for comments); is it the right file?")
    with os.fdopen(fd, "rb") as f:
        while True:
            n += 1
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except OSError as e:
                raise bad(f"cannot read it: {e.strerror}") from None
            if not raw:
                break
            done += len(raw)
            if len(raw) > MAX_LINE_BYTES:
                raise bad(f"longer than {MAX_LINE_BYTES} bytes: not a page index (one "
                          f"non-negative integer a line, as Result.save_touch_order writes)")
            if limit is not None and done > limit:  # it grew while being read
                raise bad(f"past {limit} bytes, more than a touch order of the region's "
                          f"{max_pages} pages can be")
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError as e:
                raise bad(f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                          f"{e.start + 1}): not a page index (one non-negative integer a "
                          f"line, as Result.save_touch_order writes)") from None
            if written_by_us and not raw.endswith(b"\n"):
                raise bad(f"{text!r} ends without a newline, and "
                          f"Result.save_touch_order ends every line: the file was cut short")
            if text.startswith("#"):
                if not seen_comment:
                    m = _PAGE_SIZE_RE.search(text)
                    if m and len(m.group(1)) > 20:
                        # As an index, at most 2^64 - 1; and written back, a
                        # longer one would make a header past MAX_LINE_BYTES.
                        raise bad(f"a page size of {len(m.group(1))} digits is not a page "
                                  f"size")
                    page_size = int(m.group(1)) if m else None
                    written_by_us = text.startswith(_WRITTEN_BY_US)
                    seen_comment = True
                continue
            if not text:
                continue
            if not _INDEX_RE.fullmatch(text):
                shown = text if len(text) <= 40 else text[:40] + "..."
                raise bad(f"{shown!r} is not a page index (one non-negative integer a line, "
                          f"as Result.save_touch_order writes)")
            page = int(text)
            if page > _INDEX_MAX:
                raise bad(f"{page} is not a page index: past 2^64 - 1")
            if max_pages is not None:
                if len(pages) == max_pages:
                    raise bad(f"more page indices than the region's {max_pages} pages: "
                              f"replay installs each page once")
                if page >= max_pages:
                    raise bad(f"page {page} is beyond the region's {max_pages} pages")
                if page in seen:
                    raise bad(f"page {page} again: replay installs each page once")
                seen.add(page)
            pages.append(page)
    return tuple(pages), page_size
