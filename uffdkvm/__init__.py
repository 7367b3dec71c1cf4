"""uffdkvm: KVM demand-paging experiments over userfaultfd, from Python.

    >>> import uffdkvm
    >>> r = uffdkvm.run(vcpus=2, mem_per_vcpu="64M", readers=4)
    >>> r.paging_rate, r.faults, r.verified
    >>> r.to_frame(), r.vcpus_frame(), r.readers_frame()     # pandas, on request
    >>> df = uffdkvm.sweep(readers=[1, 2, 4], wait=["poll", "epoll_exclusive"], trials=3)
    >>> uffdkvm.summarize(df)     # per point: median, IQR, CV, bootstrap 95% CI

See README.md for the host requirements and docs/ for the API (guide.md), what
every number means (measurements.md) and the CLI (cli.md).
"""
from ._version import __version__
from .analysis.spread import Ratio, Spread, ratio_of, spread_of, summarize
from .analysis.sweep import SweepWarning, read_results, sweep
from .config import Config, parse_size, read_touch_order
from .errors import (
    ConfigError,
    HostUnsupportedError,
    MissingDependencyError,
    ResultError,
    RunError,
    RunTimeoutError,
    UffdkvmError,
)
from .histogram import Histogram
from .host.facts import HostInfo
from .migration.migrate import MigrationResult, migrate
from .migration.sweep import migration_sweep
from .progress import Progress
from .result import DirtyPass, FaultTrace, MigrationRound, ReaderStats, Result, VcpuStats
from .run import probe, run
from .snapshot import make_snapshot
from .support import backing_support, fault_path_support, source_support
from .testing._recorded import load_results

__all__ = [
    "Config", "ConfigError", "DirtyPass", "FaultTrace", "Histogram", "HostInfo",
    "HostUnsupportedError", "MigrationResult", "MigrationRound", "MissingDependencyError",
    "Progress", "Ratio", "ReaderStats",
    "Result", "ResultError",
    "RunError", "RunTimeoutError", "Spread", "SweepWarning",
    "UffdkvmError", "VcpuStats", "__version__", "backing_support", "fault_path_support",
    "load_results", "make_snapshot", "migrate", "migration_sweep", "parse_size", "probe",
    "ratio_of", "read_results", "read_touch_order", "run", "source_support", "spread_of",
    "summarize", "sweep",
]
