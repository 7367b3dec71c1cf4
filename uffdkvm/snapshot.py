"""Snapshot files for source="file": :func:`make_snapshot`."""
from __future__ import annotations

import os

from . import _core
from .config import _as_int, parse_size
from .errors import ConfigError
from .run import _raise_from_core


def make_snapshot(path: str | os.PathLike[str], size: int | str, seed: int = 0) -> str:
    """Write a raw memory image of ``size`` bytes to ``path`` and return the
    path (as a str).

    Every 8-byte word is a seeded pseudo-random function of (seed, its
    offset), so every page differs from every other page and from the
    synthetic fill: a page installed at the wrong place, or from the wrong
    source, fails verification. ``size`` is bytes or a string such as
    "64M" (a multiple of 4096); a run with ``source="file"`` needs at least
    ``Config.region_bytes``. The core writes it with the GIL released, a
    few seconds per GiB at most. Raises ConfigError for a bad size or seed,
    HostUnsupportedError when the file cannot be written.
    """
    try:
        where = os.fspath(path)
    except TypeError:
        raise ConfigError(f"path: expected a str or os.PathLike, not {path!r}",
                          field="path") from None
    if not isinstance(where, str) or not where:
        raise ConfigError(f"path: expected a file name, not {path!r}", field="path")
    nbytes = parse_size(size, "size")
    if nbytes <= 0 or nbytes % 4096:
        raise ConfigError(f"size: a snapshot is a whole number of 4 KiB pages, at least one; "
                          f"not {nbytes} bytes", field="size")
    number = _as_int(seed)
    if number is None or not 0 <= number < 1 << 64:
        raise ConfigError(f"seed: expected an int between 0 and 2**64 - 1, not {seed!r}",
                          field="seed")
    try:
        _core.make_snapshot(where, nbytes, number)
    except _core.CoreError as e:
        _raise_from_core(e)
    return where
