"""atheris target: the touch-order file's reader (uffdkvm/_touchorder.py),
which Config.replay_from reads, over arbitrary file contents.

Each input is a file's bytes. ``touchorder.read`` must return page indices
(ints from 0 to 2**64 - 1, what a page index of the core can be) and a page
size or None, or raise FormatError, its one documented exception, whose
message names the path and, for a file that decodes, the line; what it
reads must write back (``touchorder.write``) to a file that reads the same.
``Config(prefetch="replay", replay_from=PATH)`` must make a Config or raise
ConfigError naming replay_from. Anything else escaping, or a crash, is a
finding.

    python tests/fuzz/touch_order.py -max_total_time=60 tests/fuzz/corpus/touch_order
"""
import os
import sys
import tempfile

import atheris

# Python coverage for uffdkvm's own modules (atheris instruments whole
# top-level packages): the reader, and Config's check of replay_from.
# Instrumenting every module uffdkvm imports, the standard library's too,
# took 7 s of each start; uffdkvm's alone, 3.
with atheris.instrument_imports(include=["uffdkvm"]):
    import uffdkvm
    from uffdkvm import _touchorder as touchorder

# Under $TMPDIR (the tests give it theirs); emptied after every input.
DIR = tempfile.mkdtemp(prefix="uffdkvm-fuzz-touch-order-")
PATH = os.path.join(DIR, "order")
AGAIN = os.path.join(DIR, "again")


@atheris.instrument_func
def TestOneInput(data):
    try:
        check(data)
    finally:
        for path in (PATH, AGAIN):
            if os.path.exists(path):
                os.unlink(path)


@atheris.instrument_func
def check(data):
    with open(PATH, "wb") as f:
        f.write(data)
    try:
        pages, page_size = touchorder.read(PATH)
    except touchorder.FormatError as e:
        message = str(e)
        if repr(PATH) not in message:
            raise AssertionError(f"FormatError without the path: {message}") from e
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            if " line " not in message:
                raise AssertionError(f"FormatError without the line: {message}") from e
        pages = None
    if pages is not None:
        if not all(type(p) is int and 0 <= p < 1 << 64 for p in pages):
            raise AssertionError(f"read {pages!r}: not page indices")
        if page_size is not None and not (type(page_size) is int and page_size >= 0):
            raise AssertionError(f"read a page size of {page_size!r}")
        touchorder.write(AGAIN, pages, 4096 if page_size is None else page_size)
        again = touchorder.read(AGAIN)
        if again != (pages, 4096 if page_size is None else page_size):
            raise AssertionError(f"read {pages!r} and {page_size!r}, wrote them, read {again!r}")
    try:
        uffdkvm.Config(prefetch="replay", replay_from=PATH)
    except uffdkvm.ConfigError as e:
        if e.field != "replay_from" or not str(e).startswith("replay_from: "):
            raise AssertionError(f"ConfigError for field {e.field!r}: {e}") from e


def main():
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
