"""The exceptions uffdkvm raises.

Every exception is a :class:`UffdkvmError`; each also derives from the
built-in exception a caller would catch anyway (ValueError for a bad config,
TimeoutError for a run over its time limit).
"""
from __future__ import annotations


class UffdkvmError(Exception):
    """Base class. ``errno`` is the errno of the failing call, or 0."""

    def __init__(self, message: str, errno: int = 0):
        super().__init__(message)
        self.errno = errno


class ConfigError(UffdkvmError, ValueError):
    """A Config field is invalid; the message names the field and the fix."""


class HostUnsupportedError(UffdkvmError):
    """The host lacks or refuses something the experiment needs (/dev/kvm,
    userfaultfd, a kernel feature); the message says which and what to do."""


class RunError(UffdkvmError):
    """A call failed while the experiment ran; the message names the thread,
    the call and the errno or guest exit."""


class RunTimeoutError(RunError, TimeoutError):
    """The run did not finish within ``Config.timeout_s``."""
