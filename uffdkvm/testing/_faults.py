"""Test-only: make one thing go wrong inside a run, for real.

The C core has a private fault-injection hook (enum ukvm_inject) so that
every error path can be exercised by the test suites. This module is its
only Python door; nothing else in uffdkvm uses it. Both exist only in builds
made for the tests, with UFFDKVM_TEST_HOOKS=1 in the environment (setup.py
leaves this file out of other builds; _core.TEST_HOOKS says which build
this is).

    from uffdkvm.testing._faults import run_with_fault
    run_with_fault(cfg, "resolve_eio", after=3)    # raises RunError (EIO)
"""
from __future__ import annotations

from typing import Any

from .. import _core
from ..config import Config
from ..migration.migrate import KNOBS, MigrationResult, _migrate
from ..result import Result
from ..run import _config_of, _raise_from_core, _run
from ..schema import faults as schema_faults

if not _core.TEST_HOOKS:
    raise ImportError("uffdkvm.testing._faults needs a uffdkvm._core built with test hooks "
                      f"({_core.__file__} has none): build it with UFFDKVM_TEST_HOOKS=1 "
                      "in the environment")
#: Each fault's name and the core's constant for it, from uffdkvm/schema/faults.py
#: (which says what each breaks and which tests use it).
FAULTS = {f.name: getattr(_core, f"INJECT_{f.c_name}") for f in schema_faults.FAULTS}


def run_with_fault(config: Config | None = None, fault: str = "resolve_eio",
                   after: int = 1, **fields: Any) -> Result:
    """run(), with one injected failure (see FAULTS)."""
    if fault not in FAULTS:
        raise ValueError(f"fault: {fault!r} is not one of {', '.join(FAULTS)}")
    return _run(_config_of(config, fields), inject=FAULTS[fault], inject_after=after)


def migrate_with_fault(config: Config | None = None, mode: str = "precopy",
                       fault: str = "migrate_blind_page", after: int = 0,
                       **fields: Any) -> MigrationResult:
    """migrate(), with one injected failure in the source's run (see FAULTS)."""
    if fault not in FAULTS:
        raise ValueError(f"fault: {fault!r} is not one of {', '.join(FAULTS)}")
    knobs = {name: fields.pop(name) for name in KNOBS if name in fields}
    return _migrate(_config_of(config, fields), mode, knobs, inject=FAULTS[fault],
                    inject_after=after)


def wait_idle(timeout_s: float = 10.0) -> None:
    """Waits until failed or interrupted runs have released their threads,
    fds and memory, timeout_s at most.

    Such a run raises as soon as its threads are joined and its fds closed,
    and the core frees its memory in the background (freeing a few GiB can
    take the kernel seconds); the next run waits for that. A run with a
    thread that would not stop raises at once and keeps everything that
    thread may touch until it leaves. Tests that count threads or memory
    call this first. Raises RunError, naming what still holds on, if that
    takes longer than timeout_s.
    """
    try:
        _core.wait_idle(timeout_s)
    except _core.CoreError as e:
        _raise_from_core(e)
