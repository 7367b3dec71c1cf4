"""The exceptions uffdkvm raises.

Every exception is a :class:`UffdkvmError`; each also derives from the
built-in exception a caller would catch anyway (ValueError for a bad config
or bad data, TimeoutError for a run over its time limit)::

    UffdkvmError
    ├── ConfigError (ValueError)      a bad Config field or argument; .field
    ├── ResultError (ValueError)      data that cannot give what was asked
    ├── HostUnsupportedError          this host cannot run it (a skip, not a failure)
    └── RunError                      a call failed while the experiment ran
        └── RunTimeoutError (TimeoutError)

Every one pickles with its attributes (message, errno, field), so errors
cross process boundaries (concurrent.futures.ProcessPoolExecutor, dask)
whole.
"""
from __future__ import annotations

from typing import Any


class UffdkvmError(Exception):
    """Base class. ``message`` is the text; ``errno`` is the errno of the
    failing call, or 0."""

    message: str
    # errno: an int here; TimeoutError (an OSError) keeps it in its own slot.

    def __init__(self, message: str, errno: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.errno: int = errno

    def __reduce__(self) -> tuple[Any, ...]:
        # OSError's own reduce (TimeoutError's) drops attributes that live in
        # its slots, errno among them: rebuild from the message, then restore.
        return type(self), (self.message,), self._state()

    def _state(self) -> dict[str, Any]:
        state = {**self.__dict__, "errno": self.errno}
        if isinstance(self, ImportError):  # name and path live in its slots
            state.update(name=self.name, path=self.path)
        return state

    def __setstate__(self, state: dict[str, Any] | None) -> None:
        for name, value in (state or {}).items():
            setattr(self, name, value)


class ConfigError(UffdkvmError, ValueError):
    """A Config field (or an argument) is invalid; the message names it and
    the fix. ``field`` is the Config field's name, or None for an argument
    that is not one (``sweep(trials=0)``)."""

    field: str | None

    def __init__(self, message: str, errno: int = 0, *, field: str | None = None) -> None:
        super().__init__(message, errno)
        self.field = field


class ResultError(UffdkvmError, ValueError):
    """Data that cannot give what was asked of it: JSON that is not a
    Result, faults_frame() of a run that kept no trace, histograms with
    different buckets added together. The message says where and why."""


class MissingDependencyError(UffdkvmError, ImportError):
    """An optional dependency is not installed (pandas, for DataFrames and
    sweeps); the message says what to pip install."""


class HostUnsupportedError(UffdkvmError):
    """The host lacks or refuses something the experiment needs (/dev/kvm,
    userfaultfd, a kernel feature, the memory or CPUs it asks for); the
    message says which and what to do."""


class RunError(UffdkvmError):
    """A call failed while the experiment ran; the message names the thread,
    the call and the errno or guest exit."""


# OSError types errno as int | None; ours is always an int.
class RunTimeoutError(RunError, TimeoutError):  # type: ignore[misc]
    """The run did not finish within ``Config.timeout_s``."""
