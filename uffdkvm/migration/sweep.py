"""migration_sweep(): every combination of migrate()'s keywords, as one DataFrame.

    df = uffdkvm.migration_sweep(mode=["precopy", "postcopy", "hybrid"],
                                 write_percent=[0, 10, 30, 100],
                                 link_bandwidth_mbps=1000, trials=3,
                                 vcpus=2, mem_per_vcpu="64M")
    df.pivot_table(index="write_percent", columns="migration",
                   values="total_seconds", aggfunc="median")

Trials are interleaved: trial 1 of every point, then trial 2 of every point,
so that a host that drifts moves every point alike. A migration that raises
does not stop the sweep: its row carries the exception in ``error``, and a
SweepWarning at the end counts the failures. Ctrl-C stops the sweep.
"""
from __future__ import annotations

import itertools
import warnings
from typing import TYPE_CHECKING, Any

from ..analysis.sweep import SweepWarning, _axis
from ..config import Config
from ..errors import ConfigError, UffdkvmError
from ..io.frames import _pandas, migration_row
from .migrate import KNOBS, migrate

if TYPE_CHECKING:  # pragma: no cover
    import pandas


def migration_points(**grid: Any) -> list[dict[str, Any]]:
    """The keyword sets of a grid, in order (the last keyword varies
    fastest); any iterable but a string is an axis, anything else fixed."""
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True))
            for combo in itertools.product(*(_axis(v) for v in grid.values()))]


def migration_sweep(config: Config | None = None, *, trials: int = 1,
                    **grid: Any) -> pandas.DataFrame:
    """Runs migrate() at every point of the grid (``mode`` among its
    keywords), ``trials`` times, interleaved; one row per migration
    (MigrationResult.to_frame's columns, ``trial``, and ``error``)."""
    if not isinstance(trials, int) or trials < 1:
        raise ConfigError(f"trials: a positive int, not {trials!r}", field="trials")
    points = migration_points(**grid)
    rows: list[dict[str, Any]] = []
    failed = []
    for trial in range(trials):
        for point in points:
            try:
                m = migrate(config, **point)
            except UffdkvmError as e:
                failed.append(f"{point}: {type(e).__name__}: {e}")
                rows.append({**point, "trial": trial, "error": f"{type(e).__name__}: {e}"})
                continue
            rows.append({**migration_row(m, KNOBS), "trial": trial, "error": None})
    if failed:
        warnings.warn(f"{len(failed)} of {len(rows)} migrations failed; the first: "
                      f"{failed[0]}", SweepWarning, stacklevel=2)
    df: pandas.DataFrame = _pandas().DataFrame(rows)
    return df
