"""uffdkvm: KVM demand-paging experiments over userfaultfd, from Python.

    >>> import uffdkvm
    >>> r = uffdkvm.run(vcpus=2, mem_per_vcpu="64M", readers=4)
    >>> r.paging_rate, r.faults, r.verified

See README.md for the host requirements, the API and the CLI.
"""
from ._version import __version__
from .config import Config, parse_size
from .errors import (ConfigError, HostUnsupportedError, RunError, RunTimeoutError,
                     UffdkvmError)
from .histogram import Histogram
from .result import FaultTrace, ReaderStats, Result, VcpuStats
from .host import backing_support
from .run import probe, run

__all__ = [
    "Config", "ConfigError", "FaultTrace", "Histogram", "HostUnsupportedError", "ReaderStats", "Result",
    "RunError", "RunTimeoutError", "UffdkvmError", "VcpuStats", "__version__",
    "backing_support", "parse_size", "probe", "run",
]
