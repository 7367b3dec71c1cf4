"""The one declaration of every test-only fault injection, the test side of
uffdkvm/schema/fields.py: what each breaks and which tests use it.

Pure data, the standard library only, importable without the extension.
The one command that writes the config's files writes these too:

    python tools/gen_schema.py --write     # rewrite every generated file
    python tools/gen_schema.py --check     # exit 1 naming any stale one

From FAULTS come csrc/testhooks.h (enum ukvm_inject, each entry's comment,
UKVM_INJECTS(X) that the binding walks to export INJECT_<NAME>), the
INJECT_ constants of uffdkvm/_core.pyi, and, read at import,
uffdkvm.testing._faults.FAULTS. tests/robustness/test_injected_failures.py checks that every
entry's tests name it.

A fault's ``name`` is what run_with_fault() takes; its C enumerator is
UKVM_INJECT_<c> (``c``: the name upper-cased, unless given). ``doc`` says
what goes wrong, with ``after`` the config's inject_after. ``tests`` are the
files (from the tree's root) that inject it; each names it ("name" in a
Python test, UKVM_INJECT_<c> in a C one).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    name: str                   # run_with_fault's name for it
    doc: str                    # what goes wrong; `after` is inject_after
    tests: tuple[str, ...]      # the test files that inject it
    c: str = ""                 # the enumerator after UKVM_INJECT_ ("": NAME)

    @property
    def c_name(self) -> str:
        return self.c or self.name.upper()


_INJECTED = "tests/robustness/test_injected_failures.py"

# In the enum's order (the values are the core's, kept as they were).
FAULTS: tuple[Fault, ...] = (
    Fault("resolve_eio", "resolve number `after` fails with EIO",
          (_INJECTED, "tests/fault_paths/test_resolver.py", "tests/pages/test_source_file.py",
           "tests/c/inject.c")),
    Fault("reader_exit", "the reader taking fault `after` leaves silently",
          (_INJECTED, "tests/robustness/test_interrupt.py", "tests/c/cancel.c",
           "tests/c/timeout.c")),
    Fault("guest_fault", "page `after` of vCPU 0 is unmapped: #PF",
          (_INJECTED, "tests/core/test_workload.py", "tests/c/inject.c")),
    Fault("guest_mmio", "page `after` of vCPU 0 maps no memory: an MMIO exit",
          (_INJECTED, "tests/c/inject.c")),
    Fault("thread_create", "thread number `after` fails to start (EAGAIN)",
          (_INJECTED, "tests/c/thread_create.c")),
    Fault("corrupt_page", "page `after` is damaged before verification",
          (_INJECTED, "tests/cli/test_exit.py", "tests/c/inject.c")),
    Fault("reader_stall", "a thread that will not stop: when its run is over uffd 0's last "
          "reader stays `after` milliseconds more, deaf to stop and kicks",
          (_INJECTED, "tests/c/stall.c")),
    Fault("vcpu_stall", "as reader_stall, for the last vCPU",
          (_INJECTED, "tests/fault_paths/test_move.py", "tests/c/stall.c")),
    Fault("resolve_eagain", "every resolving ioctl fails with EAGAIN for `after` ms from the "
          "first", (_INJECTED, "tests/fault_paths/test_resolver.py", "tests/c/cancel.c")),
    Fault("reader_crash", "reader 0 of uffd 0 touches a PROT_NONE page as it starts: a real "
          "SIGSEGV, which kills the process (its handler, faulthandler say, runs first). For "
          "a child process only", ("tests/robustness/test_interrupt.py",)),
    Fault("tsc_offset", "the host sees every guest TSC `after` cycles ahead",
          ("tests/measurements/test_timeline.py",)),
    Fault("no_kvm_tsc_offset", "KVM's TSC offset is taken as unknown",
          ("tests/measurements/test_timeline.py",)),
    Fault("unfaulted_page", "page `after` is mapped before userfaultfd is",
          ("tests/core/test_accounting.py",)),
    Fault("tsc_jump", "after the walk the guest TSC reads `after` cycles ahead",
          ("tests/measurements/test_timeline.py",)),
    Fault("no_exact_address", "no UFFD_FEATURE_EXACT_ADDRESS, as on Linux < 5.18: hugetlb "
          "faults name the huge page's start", ("tests/measurements/test_timeline.py",)),
    Fault("no_move", "no UFFD_FEATURE_MOVE, as on Linux < 6.8",
          ("tests/fault_paths/test_move.py",)),
    Fault("wp_no_save", "uffd_mode wp: pages are un-protected without saving the old page",
          ("tests/fault_paths/test_wp.py", "tests/c/wp.c")),
    Fault("no_wp_features", "no UFFD_FEATURE_PAGEFAULT_FLAG_WP nor WP_HUGETLBFS_SHMEM, as on "
          "a kernel without uffd-wp", ("tests/fault_paths/test_wp.py", "tests/c/wp.c")),
    Fault("source_wrong_offset", "source file or remote: the page (of the backing's size) "
          "holding byte `after` x 4 KiB of the region gets the next page's bytes of the file "
          "(the first page's, at the end), in whichever fetch brings it",
          ("tests/pages/test_source_file.py", "tests/pages/test_source_remote.py",
           "tests/c/source_file.c")),
    Fault("untouched_page", "touch_percent, access zipf: the host's record drops the first "
          "page the guest touches from page `after` on (the guest still touches it), as a "
          "host-side subset that disagreed with the guest's", ("tests/core/test_access.py",)),
    Fault("ring_nowait", "wait io_uring: the setup's check reads the uffd with RWF_NOWAIT, so "
          "the kernel completes the read of the empty uffd at once with EAGAIN, as a kernel "
          "whose io_uring does not retry reads of O_NONBLOCK files (before Linux 5.15) does",
          ("tests/fault_paths/test_io_uring.py",)),
    Fault("no_vm_guest_memfd", "backing guest_memfd: the VM's KVM_CAP_GUEST_MEMFD is taken as "
          "0, as a KVM_X86_DEFAULT_VM's is from Linux 6.8 to 6.17 (/dev/kvm's answer is still "
          "asked of /dev/kvm)", ("tests/core/test_backings.py",)),
    Fault("mincore_fail", "resolver vcpu on huge units (anonymous_thp): every resolved fault "
          "waits for its 4 KiB page to be mapped, as after another thread's half-done copy, "
          "and the `after`-th wait's mincore() fails for real (an address not page-aligned: "
          "EINVAL)", (_INJECTED, "tests/c/inject.c")),
    Fault("release_dup3", "letting go of a uffd a reader still holds "
          "(ukvm_pool_release_uffd): uffd 0's last reader stays `after` x 1.5 s after its "
          "run (as reader_stall), and the first `after` dup3() swaps of a uffd for /dev/null "
          "fail for real (onto their own fd number: EINVAL); the uffd stays held, and a vCPU "
          "waiting on it with it, until a retry succeeds (a swap, or a close once the reader "
          "has gone)", ("tests/c/pool_internals.c", "tests/c/stall.c")),
    Fault("online_drain", "stats full without guest_timing (online.h): a resolver tries a "
          "drain every `after` events it queues (not UKVM_ONLINE_DRAIN_AT), so a small run "
          "merges its events in many drains while it runs",
          ("tests/measurements/test_online_stats.py",)),
    Fault("online_skip_queue", "as online_drain, but every drain leaves the last queue out: "
          "a broken merge", ("tests/measurements/test_online_stats.py",)),
    Fault("vcpu_hang", "the last vCPU, once the run has begun, never enters the guest: it "
          "sleeps until the run is stopped, so the run makes no progress and never ends by "
          "itself. A run without a time limit (timeout_ns 0) then fails after `after` ms "
          "without progress, not after ukvm_experiment_finish()'s own limit (watch.c, "
          "NO_PROGRESS_NS; run() has no such watch: it waits for Ctrl-C)",
          (_INJECTED, "tests/c/timeout.c")),
    Fault("dirty_drop_page", "dirty_tracking: at the end of iteration `after` (1 the first "
          "tracked pass), the harvest loses the first page it found (a tracker that misses "
          "a write)", ("tests/core/test_dirty_tracking.py",)),
    Fault("dirty_skip_reprotect", "dirty_tracking: at the end of iteration `after`, the "
          "re-protect is skipped (KVM_CLEAR_DIRTY_LOG, KVM_RESET_DIRTY_RINGS, PAGEMAP_SCAN's "
          "write-protect), as a tracker that forgets to re-arm. \"bitmap\" re-protects as it "
          "reads: nothing to skip", ("tests/core/test_dirty_tracking.py",)),
    Fault("migrate_blind_page", "migration: the tracker never reports 4 KiB page `after` of "
          "the region (a tracker blind to it): a write after its send in round 1 leaves the "
          "destination's copy stale, and the check against the source's at the stop must "
          "fail the run", ("tests/migration/test_migrate.py",)),
    Fault("guest_memfd_uffd_registers", "backing guest_memfd: a shmem memfd stands in for the "
          "guest_memfd (made, mapped and given to KVM as backing shmem's is, no "
          "KVM_CAP_GUEST_MEMFD asked), so UFFDIO_REGISTER succeeds on any kernel, as on one "
          "whose userfaultfd registers guest_memfd: what follows a successful registration "
          "(experiment/gmem.c) is reached", ("tests/core/test_backings.py",),
          c="GMEM_UFFD_REGISTERS"),
    Fault("tsc_offset_moves", "guest_timing: KVM's TSC offset of each vCPU reads `after` "
          "cycles more at every reading than at the one before, as KVM's own moves on a host "
          "whose TSC it finds unstable (the guest's TSC is left alone, so the sync exits "
          "still bracket one offset)", ("tests/measurements/test_timeline.py",)),
)

BY_NAME = {f.name: f for f in FAULTS}
