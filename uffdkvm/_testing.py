"""Test-only: make one thing go wrong inside a run, for real.

The C core has a private fault-injection hook (enum ukvm_inject) so that
every error path can be exercised by the test suites. This module is its
only Python door; nothing else in uffdkvm uses it. Both exist only in builds
made for the tests, with UFFDKVM_TEST_HOOKS=1 in the environment (setup.py
leaves this file out of other builds; _core.TEST_HOOKS says which build
this is).

    from uffdkvm._testing import run_with_fault
    run_with_fault(cfg, "resolve_eio", after=3)    # raises RunError (EIO)
"""
from __future__ import annotations

from typing import Any

from . import _core
from .config import Config
from .migration import KNOBS, MigrationResult, _migrate
from .result import Result
from .run import _config_of, _raise_from_core, _run

if not _core.TEST_HOOKS:
    raise ImportError("uffdkvm._testing needs a uffdkvm._core built with test hooks "
                      f"({_core.__file__} has none): build it with UFFDKVM_TEST_HOOKS=1 "
                      "in the environment")
FAULTS = {
    "resolve_eio": _core.INJECT_RESOLVE_EIO,       # resolve number `after` fails with EIO
    "reader_exit": _core.INJECT_READER_EXIT,       # the reader taking fault `after` vanishes
    "guest_fault": _core.INJECT_GUEST_FAULT,       # vCPU 0's page `after` is unmapped: #PF
    "guest_mmio": _core.INJECT_GUEST_MMIO,         # vCPU 0's page `after` maps nothing: MMIO
    "thread_create": _core.INJECT_THREAD_CREATE,   # thread number `after` fails to start
    "corrupt_page": _core.INJECT_CORRUPT_PAGE,     # page `after` is damaged before the check
    # A thread that will not stop: when the run is over it stays `after`
    # milliseconds more, deaf to stop and kicks (uffd 0's last reader; the
    # last vCPU).
    "reader_stall": _core.INJECT_READER_STALL,
    "vcpu_stall": _core.INJECT_VCPU_STALL,
    # every resolving ioctl fails with EAGAIN for `after` milliseconds
    "resolve_eagain": _core.INJECT_RESOLVE_EAGAIN,
    # reader 0 of uffd 0 segfaults as it starts: kills the process (child
    # processes only), after faulthandler or any SIGSEGV handler has run
    "reader_crash": _core.INJECT_READER_CRASH,
    # the host reads every guest TSC `after` cycles ahead
    "tsc_offset": _core.INJECT_TSC_OFFSET,
    "no_kvm_tsc_offset": _core.INJECT_NO_KVM_TSC_OFFSET,  # KVM's TSC offset taken as unknown
    "unfaulted_page": _core.INJECT_UNFAULTED_PAGE,  # page `after` is mapped before userfaultfd
    # the guest TSC reads `after` cycles on after the walk
    "tsc_jump": _core.INJECT_TSC_JUMP,
    "no_exact_address": _core.INJECT_NO_EXACT_ADDRESS,  # hugetlb faults name the huge page's start
    "no_move": _core.INJECT_NO_MOVE,  # userfaultfd offers no UFFDIO_MOVE, as before Linux 6.8
    "wp_no_save": _core.INJECT_WP_NO_SAVE,  # uffd_mode wp: un-protected without saving the old page
    "no_wp_features": _core.INJECT_NO_WP_FEATURES,  # a kernel without uffd-wp (features masked)
    # source="file": the fetch of the page holding 4 KiB page `after` of the
    # region reads the next page's bytes of the file
    "source_wrong_offset": _core.INJECT_SOURCE_WRONG_OFFSET,
    # touch_percent/zipf: the host's record forgets a page the guest touches (from page `after`)
    "untouched_page": _core.INJECT_UNTOUCHED_PAGE,
    # wait="io_uring": the setup's check reads the uffd with RWF_NOWAIT, so the kernel
    # completes it at once with EAGAIN, as an io_uring without retry of O_NONBLOCK files
    "ring_nowait": _core.INJECT_RING_NOWAIT,
    # backing="guest_memfd": the VM's KVM_CAP_GUEST_MEMFD is taken as 0 (/dev/kvm's is asked)
    "no_vm_guest_memfd": _core.INJECT_NO_VM_GUEST_MEMFD,
    # resolver="vcpu" on anonymous_thp: every fault waits for its 4 KiB page to be
    # mapped, and wait number `after` has its mincore() fail for real (EINVAL)
    "mincore_fail": _core.INJECT_MINCORE_FAIL,
    # uffd 0's last reader stays 1 s after the run, and the first `after` swaps of a
    # uffd for /dev/null (dup3) while a reader holds its number fail for real (EINVAL)
    "release_dup3": _core.INJECT_RELEASE_DUP3,
    # stats="full" without guest_timing: resolvers merge their events every `after` events
    # they queue (a small run drains many times while it runs); skip_queue: and every
    # merge leaves the last resolver's events out (a broken merge, for the tests)
    "online_drain": _core.INJECT_ONLINE_DRAIN,
    "online_skip_queue": _core.INJECT_ONLINE_SKIP_QUEUE,
    # dirty_tracking: iteration `after`'s harvest loses the first page it found
    # (a tracker that misses a write), or its re-protect is skipped (one that
    # forgets to re-arm: KVM_CLEAR_DIRTY_LOG, KVM_RESET_DIRTY_RINGS, PAGEMAP_SCAN's WP)
    "dirty_drop_page": _core.INJECT_DIRTY_DROP_PAGE,
    "dirty_skip_reprotect": _core.INJECT_DIRTY_SKIP_REPROTECT,
    # migration: the tracker never reports page inject_after, so the destination
    # holds it stale once written after its send (the check against the source fails)
    "migrate_blind_page": _core.INJECT_MIGRATE_BLIND_PAGE,
    # backing="guest_memfd": a shmem memfd stands in for the guest_memfd, so userfaultfd
    # registers it on any kernel, as on a kernel whose userfaultfd registers guest_memfd
    "guest_memfd_uffd_registers": _core.INJECT_GMEM_UFFD_REGISTERS,
    # guest_timing: KVM's TSC offset reads `after` cycles more at every reading, as
    # KVM's own moves where the host's TSC is unstable (the guest's TSC is left alone)
    "tsc_offset_moves": _core.INJECT_TSC_OFFSET_MOVES,
}


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
