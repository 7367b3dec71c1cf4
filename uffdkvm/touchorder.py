"""The touch-order file: the one definition of its format, which
Result.save_touch_order writes and Config.replay_from (read_touch_order)
reads back.

A ``#`` comment line saying what it is and the page size its indices count
in, then one non-negative page index a line, in the order faults installed
the pages. Blank lines and other ``#`` lines are skipped.
"""
from __future__ import annotations

import os
import re
from collections.abc import Sequence

_HEADER = ("# uffdkvm touch_order: {count} page indices ({page_size}-byte pages from the "
           "region's start), in the order faults installed them\n")
# The header's page size, as _HEADER writes it.
_PAGE_SIZE_RE = re.compile(r"\((\d+)-byte pages")


class FormatError(ValueError):
    """The file cannot be read, or a line is not a page index (the message
    names the path and the line)."""


def write(path: str | os.PathLike[str], order: Sequence[int], page_size: int) -> None:
    """Writes order (page indices of page_size-byte pages) to path."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(_HEADER.format(count=len(order), page_size=page_size))
        f.write("".join(f"{page}\n" for page in order))


def read(path: str | os.PathLike[str]) -> tuple[tuple[int, ...], int | None]:
    """The page indices path holds, and the page size its first comment line
    says they count in (None: it says none)."""
    pages = []
    page_size = None
    seen_comment = False
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                text = line.strip()
                if text.startswith("#"):
                    if not seen_comment:
                        m = _PAGE_SIZE_RE.search(text)
                        if m and len(m.group(1)) > 20:
                            raise FormatError(f"{os.fspath(path)!r} line {n}: "
                                              f"{m.group(1)[:24]}... is not a page size")
                        page_size = int(m.group(1)) if m else None
                        seen_comment = True
                    continue
                if not text:
                    continue
                # 20 digits at most: int() of thousands raises, and no page is past 2**64.
                if not text.isdecimal() or len(text) > 20 or int(text) >= 1 << 64:
                    raise FormatError(f"{os.fspath(path)!r} line {n}: {text!r} is not a page "
                                      f"index (one integer from 0 to 2**64 - 1 a line, as "
                                      f"Result.save_touch_order writes)")
                pages.append(int(text))
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path, bytes not UTF-8
        if isinstance(e, FormatError):
            raise
        why = e.strerror if isinstance(e, OSError) else str(e)
        raise FormatError(f"cannot read {os.fspath(path)!r}: {why}") from None
    return tuple(pages), page_size
