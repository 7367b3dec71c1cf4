"""What one experiment measured: :class:`Result` and its per-thread parts.

All types are frozen dataclasses of plain values, defined here in one place.
Units are in the names where a name alone would leave them open.
"""
from __future__ import annotations

import os
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from . import _core
from . import _invariants as invariants
from . import _touchorder as touchorder
from .config import Config, format_size
from .errors import ResultError
from .histogram import Histogram
from .host.facts import HostInfo
from .io import frames, serial, tables
from .pages.server import PageServerStats
from .schema import results as schema_results

if TYPE_CHECKING:  # pragma: no cover
    import pandas

NS = 1e-9
_SOURCE_NAMES = {_core.SOURCE_SYNTHETIC: "synthetic", _core.SOURCE_FILE: "file",
                 _core.SOURCE_REMOTE: "remote"}
_CLOCK_SYNC = {_core.CLOCK_SYNC_KVM_OFFSET: "kvm_tsc_offset",
               _core.CLOCK_SYNC_EXITS: "sync_exits"}
_T = TypeVar("_T")
# The core's latency buckets, in nanoseconds (see Histogram).
LATENCY_BOUNDS = tuple(_core.HIST_BOUNDS)


def _latency(h: dict[str, Any]) -> Histogram:
    return Histogram(LATENCY_BOUNDS, tuple(h["buckets"]), h["count"], h["sum"],
                     h["min"], h["max"])


def _access_latency(counts: Sequence[int], cycles: int, tsc_khz: int) -> Histogram | None:
    """The guest's log2 histogram of TSC cycles, in nanoseconds."""
    if not tsc_khz:
        return None
    ns_per_cycle = 1e6 / tsc_khz
    bounds = tuple(float(2 ** i) * ns_per_cycle for i in range(len(counts) + 1))
    used = [i for i, n in enumerate(counts) if n]
    if not used:
        return Histogram.empty(bounds)
    return Histogram(bounds, tuple(counts), sum(counts), cycles * ns_per_cycle,
                     bounds[used[0]], bounds[used[-1] + 1])


@dataclass(frozen=True)
class VcpuStats:
    # BEGIN GENERATED VcpuStats by uffdkvm/schema/results.py
    """One vCPU.

    Each fault in stages (ns Histograms; stats="full"). A fault is raised when
    the guest is about to make the access, read when a reader's read()
    returns its message, resolved when the resolving ioctl returns, resumed
    when the guest's access completes. Raised and resumed come from the
    guest's own rdtsc stamps, so they need guest_timing=True. faults counts
    what it does at every level (this vCPU, a reader, the run): faults
    resolved, EEXIST ones not included; faults + eexist are the messages.

    index              the vCPU's index
    tid                the host thread that ran it
    seconds            from its first KVM_RUN until the guest reported done
    pages              4 KiB pages the guest says it touched (all passes)
    exits              VM exits during the run, from KVM's own "exits" counter (None where the
                       kernel has no binary stats)
    userspace_exits    returns from KVM_RUN to the vCPU thread, not counting the EAGAIN retries
                       that never entered the guest (with guest_timing, 32 of them are the
                       clock-sync exits; with auto_converge, the throttle's kicks, up to 100 a
                       second)
    fault_exits        with resolver="vcpu": those returns that were a fault this vCPU's own
                       thread resolved (0 with readers)
    regs_fault_exits   of fault_exits, those where KVM_RUN's EFAULT did not name the page (stock
                       x86 KVM) and the thread found it from the guest's registers
                       (KVM_GET_REGS: the walk's access at %rip, its page in %rax)
    kvm_stats          KVM's own statistics for this vCPU over the run, by the kernel's names:
                       counters as deltas, the rest as they stood at the end (empty without
                       KVM_GET_STATS_FD)
    pass_seconds       how long each pass took (the first one demand-pages)
    cpu_seconds        CPU time the thread used (getrusage)
    throttled_seconds  a migration's source with auto_converge: the thread's throttle sleeps,
                       the guest's time given up (0 otherwise)
    cpus               the CPUs the thread could run on, as it saw them itself
    faults             faults of this vCPU that a reader resolved (UFFD_FEATURE_THREAD_ID): as
                       Result.faults and ReaderStats.faults count, EEXIST ones not included;
                       with uffd_mode="wp", the write-protect faults: first writes to pages
                       (reads do not fault); None with stats="basic"
    eexist             fault messages of this vCPU that a reader found already resolved (another
                       vCPU's fault on the same page came first): faults + eexist are the
                       messages it caused; None with stats="basic"
    blocked_seconds    time with a fault of this vCPU outstanding (QEMU's per-vCPU blocktime):
                       raised -> resumed with guest_timing, read -> resolved without it
    service_latency    read -> the page's arrival: the reader's work, delay_us included (service
                       time only: not the whole fault). The page arrives when the resolving
                       ioctl returns, or, with guest_timing, when the vCPU resumed if that came
                       first (the ioctl wakes the vCPU before it returns)
    queue_latency      raised -> read: delivery, the wakeup, the herd (guest_timing, else None)
    resume_latency     the page's arrival -> resumed: waking the vCPU and finishing the access
                       (guest_timing, else None)
    fault_latency      raised -> resumed: the whole fault as the vCPU lived it, = queue +
                       service + resume; with overlap also stalls another vCPU's fault ended
                       (EEXIST) (guest_timing, else None)
    access_latency     guest_timing: Histogram of every access as the guest timed it with rdtsc
                       (ns), faulting or not, all passes
    """

    index: int
    tid: int
    seconds: float
    pages: int
    exits: int | None
    userspace_exits: int
    fault_exits: int = 0
    regs_fault_exits: int = 0
    kvm_stats: dict[str, int] = field(default_factory=dict, hash=False)
    pass_seconds: tuple[float, ...] = ()
    cpu_seconds: float = 0.0
    throttled_seconds: float = 0.0
    cpus: tuple[int, ...] = ()
    faults: int | None = None
    eexist: int | None = None
    blocked_seconds: float | None = None
    service_latency: Histogram | None = None
    queue_latency: Histogram | None = None
    resume_latency: Histogram | None = None
    fault_latency: Histogram | None = None
    access_latency: Histogram | None = None
    # END GENERATED VcpuStats

    @property
    def all_passes_pages_per_s(self) -> float:
        """Pages touched per second over the whole run, every pass: pages /
        seconds."""
        return self.pages / self.seconds if self.seconds > 0 else 0.0

    @property
    def first_pass_pages_per_s(self) -> float:
        """Pages per second over the first pass, the one that demand-pages
        (as Result.paging_rate): the pass's pages / pass_seconds[0]."""
        if not self.pass_seconds or self.pass_seconds[0] <= 0:
            return 0.0
        return self.pages / len(self.pass_seconds) / self.pass_seconds[0]

    def __repr__(self) -> str:
        return (f"VcpuStats(index={self.index}, pages={self.pages}, "
                f"seconds={self.seconds:.3g}, faults={self.faults}, "
                f"first_pass_pages_per_s={self.first_pass_pages_per_s:.0f})")


@dataclass(frozen=True)
class DirtyPass:
    # BEGIN GENERATED DirtyPass by uffdkvm/schema/results.py
    """One pass under dirty tracking (Config.dirty_tracking), as
    dirty_log_perf_test reports an iteration: pass ``iteration + 1`` of the
    run (pass 1 populates, untracked). The vCPUs wait at the pass's end
    while the host harvests and re-protects (docs/dirty-tracking.md).

    iteration          1, 2, ...: dirty_log_perf_test's iteration number
    dirty_seconds      the vCPUs let into the pass to the last one ending it ("Iteration N dirty
                       memory time")
    harvest_seconds    collecting what the tracker found: KVM_GET_DIRTY_LOG, the rings' entries,
                       PAGEMAP_SCAN ("get dirty log time"); for "bitmap" and "wp_async" the same
                       call also re-protects
    reprotect_seconds  re-protecting it: KVM_CLEAR_DIRTY_LOG (bitmap_manual),
                       KVM_RESET_DIRTY_RINGS (ring); 0.0 for "bitmap" and "wp_async", whose
                       harvest did it ("clear dirty log time")
    reprotect_calls    the ioctls that re-protected: one KVM_CLEAR_DIRTY_LOG per
                       dirty_clear_pages chunk (bitmap_manual), one KVM_RESET_DIRTY_RINGS
                       (ring), 0 for the others
    found_pages        4 KiB pages the tracker reported dirty
    written_pages      4 KiB pages the guest wrote in the pass, from its own write counts (word
                       2 of each page); a written page the tracker missed fails the run
    excess_pages       found but not written: bitmap_manual's first iteration (INITIALLY_SET
                       reports every page), and with wp_async, hugetlb pages (PAGEMAP_SCAN
                       reports the whole page); 0 otherwise
    ring_full_exits    ring: KVM_EXIT_DIRTY_RING_FULL exits in the pass, all vCPUs (each vCPU
                       then harvests its own ring and resets)
    """

    iteration: int
    dirty_seconds: float
    harvest_seconds: float
    reprotect_seconds: float
    reprotect_calls: int
    found_pages: int
    written_pages: int
    excess_pages: int
    ring_full_exits: int = 0
    # END GENERATED DirtyPass


@dataclass(frozen=True)
class MigrationRound:
    # BEGIN GENERATED MigrationRound by uffdkvm/schema/results.py
    """One pre-copy round of a migration's source (Config.migration), its
    vCPUs running (docs/migration.md). Round 1 sends every page; each later
    round sends the pages the tracker found written during the one before.

    round             1, 2, ...
    send_seconds      its pages onto the link, paced to link_bandwidth_mbps (round 1: after
                      re-protecting the whole region)
    harvest_seconds   the tracker's harvest and re-protect at its end
    sent_pages        4 KiB pages it sent
    dirty_pages       4 KiB pages the tracker found written during it: the next round's, or at
                      the switch-over the start of the stop-copy (or of what post-copy fetches)
    ring_full_exits   dirty_tracking="ring": KVM_EXIT_DIRTY_RING_FULL exits, every vCPU's, from
                      the round's start to its harvest (the last round's: to the final harvest
                      at the stop); a vCPU whose ring fills stops to harvest its own (0
                      otherwise)
    throttle_percent  auto_converge: the throttle set for the round, the share of each vCPU's
                      time it takes from the guest (0: none). The setting, not a measure: the
                      vCPUs' sleeps are VcpuStats.throttled_seconds
    """

    round: int
    send_seconds: float
    harvest_seconds: float
    sent_pages: int
    dirty_pages: int
    ring_full_exits: int = 0
    throttle_percent: int = 0
    # END GENERATED MigrationRound

    @property
    def seconds(self) -> float:
        """The round, end to end: sending, then the harvest."""
        return self.send_seconds + self.harvest_seconds

    @property
    def dirty_rate(self) -> float:
        """Distinct pages found dirty per second of the round (0.0 for an
        instant one). A page written twice counts once, so with a guest that
        rewrites the same pages the rate falls as the round grows: it is the
        tracker's, and the guest's own only while its dirty set is not all
        dirty yet."""
        return self.dirty_pages / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class ReaderStats:
    # BEGIN GENERATED ReaderStats by uffdkvm/schema/results.py
    """One reader thread of one uffd. Every counter is kept by the reader
    thread itself and kept on every exit.

    uffd                        which uffd of the experiment
    index                       which reader of that uffd
    faults                      faults this reader resolved
    wakeups                     returns from its wait (poll, epoll_wait or read)
    spurious_wakeups            wakeups after which the read found nothing (EAGAIN, or EINTR
                                when the run's stop kicked the read): another reader took the
                                message, or the vCPU, kicked at the stop, left its fault
    eexist                      faults it found already resolved by another reader
    busy_seconds                service time summed: from reading a message to its resolving
                                ioctl returning (the per-fault delay included); None with
                                stats="basic", which reads no clocks
    context_switches            times the thread was switched out in all its life (getrusage):
                                counts in-kernel herd wakeups that spurious_wakeups cannot see
                                (a waiter the kernel wakes and puts back to sleep without
                                returning to userspace)
    cpu_seconds                 CPU time the thread used, user and system, all its life (with
                                resolver="vcpu" the thread is the vCPU's, and this, cpus and
                                context_switches are its counters, guest work included)
    tid                         the reader's host thread
    copies                      messages it resolved with UFFDIO_COPY (EEXIST ones included)
    zeropages                   messages it resolved with UFFDIO_ZEROPAGE (EEXIST ones included)
    continues                   messages it resolved with UFFDIO_CONTINUE (EEXIST ones included)
    moves                       messages it resolved with UFFDIO_MOVE (EEXIST ones included); 0
                                in older JSON
    unprotects                  uffd_mode="wp": WP fault messages it answered by saving the
                                page's old contents and un-protecting it with
                                UFFDIO_WRITEPROTECT (EEXIST ones included: another vCPU's write
                                to a page already being saved); 0 for the other modes and in
                                older JSON
    reads                       read()s of the uffd that returned messages: (faults + eexist) /
                                reads is messages per read, reads / wakeups reads per wakeup
                                (above 1 only with read_batch above 1)
    read_sizes                  [n]: reads that returned n messages (Config.read_batch caps n);
                                [0]: reads after a full batch that found the uffd empty (not in
                                reads); empty in older JSON
    ring_completions            wait="io_uring": completions of the reader's ring's reads of the
                                uffd that brought messages, each one of ``reads`` (the mode
                                reads nothing with read(2), so the two are equal); 0 for the
                                other modes and in older JSON
    prefetched                  prefetch="readahead": pages it installed after its faults
                                (UFFDIO_COPY_MODE_DONTWAKE)
    prefetch_eexist             of its readahead copies, those that found the page there already
                                (a fault or another prefetch got it first): races, not errors
    wakes                       UFFDIO_WAKEs it made after a fault found its page there
                                (EEXIST): the failed ioctl wakes nobody, a prefetched page comes
                                without a wake, and the faulting vCPU may be asleep on it (one
                                per EEXIST of a 4 KiB page, of a huge page only with prefetch;
                                none with resolver "vcpu")
    voluntary_context_switches  of those, the ones where it went to sleep itself (a spinning
                                reader has next to none); 0 in older JSON
    cpus                        the CPUs the thread could run on, as it saw them itself
    service_latency             Histogram of the busy_seconds intervals, message read to ioctl
                                done (ns); None with stats="basic"
    queue_latency               guest_timing with stats="full": Histogram of the time from the
                                guest raising each fault this reader read to the read returning
                                (ns), else None
    source_bytes                bytes it fetched from the page source (Config.source) for the
                                pages it installed; 0 in older JSON
    source_seconds              stats="full" with a source other than "synthetic": the time
                                those fetches took (a file's pread or memcpy, page-cache misses
                                included); None otherwise
    """

    uffd: int
    index: int
    faults: int
    wakeups: int
    spurious_wakeups: int
    eexist: int
    busy_seconds: float | None
    context_switches: int
    cpu_seconds: float
    tid: int = 0
    copies: int = 0
    zeropages: int = 0
    continues: int = 0
    moves: int = 0
    unprotects: int = 0
    reads: int = 0
    read_sizes: tuple[int, ...] = ()
    ring_completions: int = 0
    prefetched: int = 0
    prefetch_eexist: int = 0
    wakes: int = 0
    voluntary_context_switches: int = 0
    cpus: tuple[int, ...] = ()
    service_latency: Histogram | None = None
    queue_latency: Histogram | None = None
    source_bytes: int = 0
    source_seconds: float | None = None
    # END GENERATED ReaderStats

    def __repr__(self) -> str:
        busy = "None" if self.busy_seconds is None else f"{self.busy_seconds:.3g}"
        return (f"ReaderStats(uffd={self.uffd}, index={self.index}, faults={self.faults}, "
                f"eexist={self.eexist}, wakeups={self.wakeups}, "
                f"spurious_wakeups={self.spurious_wakeups}, busy_seconds={busy})")


@dataclass(frozen=True)
class FaultTrace:
    # BEGIN GENERATED FaultTrace by uffdkvm/schema/results.py
    """Every fault of a run (trace_faults=True), as columns, by read time.
    Times are CLOCK_MONOTONIC nanoseconds:

    raised_ns    the guest was about to make the access (guest_timing, from its rdtsc stamp;
                 None without guest timing)
    read_ns      a reader's read() returned the fault message
    resolved_ns  the resolving ioctl returned
    resumed_ns   the guest's access completed (guest_timing, else None)
    gpa          the 4 KiB page the vCPU touched, guest-physical (hugetlb on a kernel without
                 UFFD_FEATURE_EXACT_ADDRESS, Linux 5.18+: the huge page's start)
    vcpu         the vCPU that faulted (UFFD_FEATURE_THREAD_ID), or -1 if unknown
    uffd         the uffd of the reader that resolved it
    reader       the reader (of that uffd) that resolved it
    eexist       another reader had resolved it first
    write        the kernel reported a write fault (UFFD_PAGEFAULT_FLAG_WRITE): the guest's
                 access was a write (None in JSON from before uffdkvm recorded it)
    start_ns     the run's start: the vCPU threads' creation, where Result.seconds begins
                 (faults_frame's t_s counts from it); None in JSON from before uffdkvm recorded
                 it
    """

    raised_ns: tuple[int | None, ...]
    read_ns: tuple[int, ...]
    resolved_ns: tuple[int, ...]
    resumed_ns: tuple[int | None, ...]
    gpa: tuple[int, ...]
    vcpu: tuple[int, ...]
    uffd: tuple[int, ...]
    reader: tuple[int, ...]
    eexist: tuple[bool, ...]
    write: tuple[bool | None, ...]
    start_ns: int | None = None
    # END GENERATED FaultTrace

    def __len__(self) -> int:
        return len(self.read_ns)

    def __repr__(self) -> str:
        return f"FaultTrace({len(self)} faults)"


@dataclass(frozen=True)
class Result:
    # BEGIN GENERATED Result by uffdkvm/schema/results.py
    """One experiment.

    config                        the Config the run ran
    seconds                       demand_paging_test's "Total guest execution time": from just
                                  before the first vCPU thread is created to just after the last
                                  one is joined (with guest_timing, the guest's clock-sync exits
                                  before and after its walk fall inside)
    paging_rate                   pages/s as upstream's demand_paging_test computes it:
                                  pages_per_vcpu * vcpus / seconds; with passes > 1, over the
                                  first pass (the one that demand-pages): from the threads'
                                  creation to the last vCPU ending that pass
    pages_per_vcpu                4 KiB pages each vCPU's part of the region holds
    page_size                     the unit faults are resolved in, bytes
    uffds                         the run's userfaultfds
    faults                        faults resolved by all readers (EEXIST not counted; see
                                  ``eexist`` for those); with uffd_mode="wp", write-protect
                                  faults: one per page the guest writes (write_percent), none
                                  for pages it only reads
    vcpus                         one VcpuStats per vCPU, by index
    readers                       one ReaderStats per reader thread, uffd by uffd
    verified                      every page of the region held what it must after the run, and
                                  every vCPU touched and read what it should have
    bad_pages                     pages that did not (0 when verified)
    verify_message                the first problem found, or "" when verified
    kvm_run_seconds               the narrower window: the first KVM_RUN of any vCPU to the last
                                  vCPU reporting done (thread start-up and joining left out)
    startup_seconds               the first vCPU thread's creation to the first KVM_RUN of any
                                  vCPU (a migration's destination: its vCPUs' start, in the
                                  downtime)
    pass_seconds                  for each pass, first vCPU starting it to last vCPU ending it
    region_gpa                    the guest physical address where the test region starts
                                  (fault_trace's gpa less this is the offset into the region);
                                  None in JSON from before uffdkvm recorded it
    blocktime_seconds             time during which every vCPU had a fault outstanding at once
                                  (QEMU's postcopy-blocktime), with each fault's span as in
                                  VcpuStats.blocked_seconds; None with stats="basic"
    clock_sync                    guest_timing with stats="full": how the guest's TSC stamps
                                  were put on the readers' clock (CLOCK_MONOTONIC):
                                  "kvm_tsc_offset" (KVM's offset, confirmed by the guest's
                                  clock-sync exits before and after the walk) or "sync_exits"
                                  (the exits' bracket alone); None where they could not be
                                  (clock_sync_message says why): then queue, resume and fault
                                  latencies are None too, and blocked time falls back to read ->
                                  resolved
    clock_error_ns                a bound on that conversion's error, ns (None with it)
    clock_sync_message            why clock_sync is None where guest_timing with stats="full"
                                  asked for the conversion: KVM's TSC offset moved during the
                                  run (as KVM moves it where the host kernel marked its TSC
                                  unstable, e.g. Debian's 6.1 booted nested), the sync exits
                                  before and after the walk bracket no one offset, or the
                                  guest's TSC ran at another rate than the host's; None where
                                  clock_sync is set, where no conversion was asked for, and in
                                  JSON from before uffdkvm recorded it
    misordered_faults             faults whose stamps contradict the readers' clock (raised
                                  after the read, or resumed before it), left out of the stages:
                                  0 when the clocks agree (None without a conversion)
    fault_trace                   trace_faults: every fault (FaultTrace), by start time, else
                                  None
    eexist                        fault messages the readers found already resolved (not in
                                  faults), every reader's
    spurious_wakeups              every reader's wakeups that found nothing to read
    wakes                         UFFDIO_WAKEs after EEXIST, every reader's (ReaderStats.wakes):
                                  a failed ioctl wakes nobody, and a prefetched page comes
                                  without a wake; in JSON of schema 3, which named it
                                  prefetch_wakes, None where pages were not tracked
    source_bytes                  bytes fetched from the page source: every reader's, and the
                                  prefetch pusher's (pusher_source_bytes)
    source_seconds                time spent fetching from the page source, over every reader
                                  (stats="full", a source other than "synthetic"), else None
    reader_cpus                   the reader pins the core was handed (Config.reader_cpus as the
                                  run had it: reader k of all uffds, a uffd's readers together,
                                  on entry k modulo the length), or None: the readers ran where
                                  the scheduler put them (and in JSON from before uffdkvm
                                  recorded it: unknown there, see readers_with_vcpus)
    readers_with_vcpus            whether each reader ran on the CPU of the vCPU it serves
                                  (Config.readers_with_vcpus as the run had it:
                                  pin_readers="vcpus", or the default pin_readers=None with
                                  pinned vCPUs and readers that share CPUs: every wait but
                                  "spin"); False for a CPU list, "scheduler" and runs without
                                  readers. None in JSON from before uffdkvm recorded it, when
                                  pin_readers=None left the readers to the scheduler: the
                                  Config's property would misread those runs
    reader_wait                   how the readers waited, as the core was handed it
                                  (Config.reader_wait as the run had it: wait, or for the
                                  default wait=None "spin_idle" beside pinned vCPUs, else
                                  "epoll_exclusive"); None for a run without readers (uffd_mode
                                  None, resolver "vcpu") and in JSON from before uffdkvm
                                  recorded it
    kvm_stats                     KVM's VM-wide statistics over the run, like VcpuStats':
                                  cumulative ones as deltas, instant and peak ones at the end
                                  (empty where the kernel has no KVM_GET_STATS_FD)
    dirty_pages                   wp_async: the pages PAGEMAP_SCAN found written (their uffd-wp
                                  bit cleared by the kernel on the first write); verification
                                  checks they are exactly the pages the guest wrote. None
                                  otherwise
    dirty_passes                  dirty_tracking: one DirtyPass per pass after the first (the
                                  tracked ones), else empty
    dirty_enable_seconds          dirty_tracking: turning it on after pass 1
                                  (KVM_MEM_LOG_DIRTY_PAGES set on the region's memslot;
                                  wp_async: UFFDIO_WRITEPROTECT of the region), as
                                  dirty_log_perf_test's "Enabling dirty logging time"; None
                                  without tracking
    dirty_disable_seconds         dirty_tracking: turning it off after the last pass, as
                                  dirty_log_perf_test's "Disabling dirty logging time"; None
                                  without tracking
    migration_rounds              migration (the source side, docs/migration.md): one
                                  MigrationRound per pre-copy round, else empty
    migration_converged           migration: precopy's rounds ended because the last one's dirty
                                  set fit downtime_target_ms on the link (not at max_rounds);
                                  False for postcopy and hybrid; else None
    precopy_seconds               migration: round 1's start to the source's stop (the last vCPU
                                  at the end of its pass); 0.0 for postcopy
    stopcopy_pages                migration: 4 KiB pages sent with the vCPUs stopped
    stopcopy_seconds              migration: the stop to the last stop-copy page on the link,
                                  the final harvest included (the source's share of the
                                  downtime; the link's latency is not in it)
    postcopy_pages                migration: 4 KiB pages the destination does not hold at the
                                  stop (never sent, or written since): post-copy's
    precopy_pages                 migration: 4 KiB pages sent while the vCPUs ran (all rounds)
    migrated_pages                migration: the 4 KiB pages (indices from the region's start)
                                  the destination holds at the stop, each compared byte for byte
                                  with the source's then, ascending
    source                        the page source that ran, as the core reports it ("synthetic"
                                  in older JSON)
    source_cached_pages_at_start  source="file": the file's pages in the page cache as the vCPUs
                                  started, counted with mincore() (0 with source_cache="cold";
                                  the whole region's pages with "warm"), else None
    page_server                   source="remote": the page server's own counters after the run
                                  (requests, urgent and background, bytes, queue time beyond its
                                  latency), else None
    touched_pages                 the distinct 4 KiB pages the guest touched, all vCPUs: the
                                  region's pages, or fewer with touch_percent < 100 or
                                  access="zipf" (each fault resolves one, or the huge page
                                  around it)
    guest_accesses                the guest's page accesses, all vCPUs and passes (with
                                  access="zipf", hot pages count once per visit)
    page_visits                   trace_faults with touch_percent < 100 or access="zipf": the
                                  accesses in one pass to each 4 KiB page of the region, all
                                  vCPUs together (0: never touched); verification checks them
                                  against the guest's own count of writes to each page it
                                  writes. Else None
    prefetched_pages              pages installed by prefetch (readahead and the pusher); None
                                  where pages are not tracked (uffd_mode other than "missing",
                                  resolve other than "copy", prefault)
    preinstalled_pages            Config.preinstall: the pages put in from the page source's
                                  local copy before the vCPU threads started (a migration's
                                  pre-copied pages: they never fault); None where no resident
                                  map was kept
    preinstall_seconds            Config.preinstall: the time putting those pages in took
                                  (outside every window above, and demand_paging_test's); None
                                  where no resident map was kept
    wasted_prefetch_pages         prefetched pages the guest never touches
    faulted_pages                 pages (of page_size) a vCPU faulted on and waited for, whoever
                                  installed them: a fault whose page prefetch installed while
                                  the vCPU waited (counted in eexist, not in faults) is one, as
                                  it is a stall; None where pages are not tracked
    faults_avoided                the pages the guest touches less faulted_pages: those no vCPU
                                  waited for, since prefetch had installed them before the guest
                                  touched them (the same run without prefetch faults once per
                                  page touched)
    resident_seconds              from the first vCPU's start until every page of the region was
                                  resident (faulted or prefetched), as the thread that installed
                                  the last one stamped it after its ioctl returned (so a
                                  descheduled installer stamps it late, even after the vCPUs
                                  finished); None if that never happened, where pages are not
                                  tracked, or with stats="basic" (which reads no clock per
                                  fault)
    pushed_pages                  of prefetched_pages, the ones the pusher installed
                                  (background, replay)
    prefetch_eexist               prefetch copies that found the page there already (the
                                  readers' readahead and the pusher's): races counted, not
                                  errors
    pusher_source_bytes           prefetch background or replay: bytes the pusher fetched from
                                  the page source, over a connection of its own (counted in
                                  source_bytes, not in any reader's); 0 otherwise and in older
                                  JSON
    touch_order                   with Config.record_touch_order=True (uffd_mode="missing" with
                                  resolve="copy"): the pages faults installed, in the order they
                                  were resolved (first installs only, EEXIST ones left out), as
                                  page indices: pages of page_size counted from the region's
                                  start. What replay prefetch (Config.replay_from) takes;
                                  save_touch_order writes it. Empty elsewhere
    contents_verified             whether verified compared the pages' bytes: False for
                                  source="remote" with source_address and no local copy
                                  (source_path), when only the counts (every fault resolved
                                  once, every page touched) were checked, not the bytes the
                                  server sent
    host                          the machine it ran on (None for a Result made by hand)
    """

    config: Config
    seconds: float
    paging_rate: float
    pages_per_vcpu: int
    page_size: int
    uffds: int
    faults: int
    vcpus: tuple[VcpuStats, ...]
    readers: tuple[ReaderStats, ...]
    verified: bool
    bad_pages: int
    verify_message: str
    kvm_run_seconds: float | None = None
    startup_seconds: float | None = None
    pass_seconds: tuple[float, ...] = ()
    region_gpa: int | None = None
    blocktime_seconds: float | None = None
    clock_sync: str | None = None
    clock_error_ns: float | None = None
    clock_sync_message: str | None = None
    misordered_faults: int | None = None
    fault_trace: FaultTrace | None = field(default=None, repr=False)
    eexist: int = 0
    spurious_wakeups: int = 0
    wakes: int | None = None
    source_bytes: int = 0
    source_seconds: float | None = None
    reader_cpus: tuple[int, ...] | None = None
    readers_with_vcpus: bool | None = None
    reader_wait: str | None = None
    kvm_stats: dict[str, int] = field(default_factory=dict, repr=False, hash=False)
    dirty_pages: int | None = None
    dirty_passes: tuple[DirtyPass, ...] = ()
    dirty_enable_seconds: float | None = None
    dirty_disable_seconds: float | None = None
    migration_rounds: tuple[MigrationRound, ...] = ()
    migration_converged: bool | None = None
    precopy_seconds: float | None = None
    stopcopy_pages: int | None = None
    stopcopy_seconds: float | None = None
    postcopy_pages: int | None = None
    precopy_pages: int | None = None
    migrated_pages: tuple[int, ...] = field(default=(), repr=False)
    source: str = "synthetic"
    source_cached_pages_at_start: int | None = None
    page_server: PageServerStats | None = None
    touched_pages: int | None = None
    guest_accesses: int | None = None
    page_visits: tuple[int, ...] | None = field(default=None, repr=False)
    prefetched_pages: int | None = None
    preinstalled_pages: int | None = None
    preinstall_seconds: float | None = None
    wasted_prefetch_pages: int | None = None
    faulted_pages: int | None = None
    faults_avoided: int | None = None
    resident_seconds: float | None = None
    pushed_pages: int | None = None
    prefetch_eexist: int | None = None
    pusher_source_bytes: int = 0
    touch_order: tuple[int, ...] = field(default=(), repr=False)
    contents_verified: bool = True
    host: HostInfo | None = field(default=None, repr=False)
    # END GENERATED Result

    @property
    def per_vcpu_rate(self) -> float:
        """Upstream's "Per-vcpu demand paging rate", pages/s per vCPU."""
        return self.paging_rate / len(self.vcpus) if self.vcpus else 0.0

    def _merged(self, name: str) -> Histogram | None:
        hists = [getattr(v, name) for v in self.vcpus if getattr(v, name) is not None]
        return sum(hists) if hists else None

    @property
    def queue_latency(self) -> Histogram | None:
        """Every vCPU's queue stage merged (guest_timing), else None."""
        return self._merged("queue_latency")

    @property
    def service_latency(self) -> Histogram | None:
        """Every vCPU's service stage merged (stats="full"), else None."""
        return self._merged("service_latency")

    @property
    def resume_latency(self) -> Histogram | None:
        """Every vCPU's resume stage merged (guest_timing), else None."""
        return self._merged("resume_latency")

    @property
    def fault_latency(self) -> Histogram | None:
        """Every vCPU's whole faults, raised to resumed, merged (guest_timing), else None."""
        return self._merged("fault_latency")

    @property
    def access_latency(self) -> Histogram | None:
        """Every vCPU's guest-timed accesses merged (guest_timing), else None."""
        return self._merged("access_latency")

    def save_touch_order(self, path: str | os.PathLike[str]) -> None:
        """Writes touch_order to path as text: a ``#`` comment line saying
        what it is, then one page index a line, in order. Config.replay_from
        (and uffdkvm.read_touch_order) read it back."""
        if not self.touch_order:
            raise ResultError("touch_order: this run recorded none (it needs "
                              "record_touch_order=True, uffd_mode='missing' with "
                              "resolve='copy' and faults)")
        touchorder.write(path, self.touch_order, self.page_size)

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain JSON values, as :meth:`to_json` writes them (the
        schema version and the config included, non-finite floats as
        "inf"/"-inf"/"nan"), with the derived ``per_vcpu_rate``."""
        d: dict[str, Any] = {"schema": serial.SCHEMA, **serial.encode(self)}
        d["per_vcpu_rate"] = self.per_vcpu_rate
        return d

    # ---- display: a one-line repr, the full table as str() and in notebooks

    def __repr__(self) -> str:
        c = self.config
        return (f"Result(vcpus={c.vcpus}, mem_per_vcpu={format_size(c.mem_per_vcpu)!r}, "
                f"backing={c.backing!r}, uffd_mode={c.uffd_mode!r}, readers={c.readers}, "
                f"paging_rate={self.paging_rate:.0f}, seconds={self.seconds:.3g}, "
                f"faults={self.faults}, verified={self.verified})")

    def __str__(self) -> str:
        return tables.text(self._tables())

    def _repr_markdown_(self) -> str:
        return tables.markdown(self._tables())

    def _repr_html_(self) -> str:
        return tables.html(self._tables())

    def _tables(self) -> list[tables.Table]:
        """The summary, then a table per vCPU and per reader."""
        c = self.config
        summary = [
            ("config", f"vcpus={c.vcpus} mem_per_vcpu={format_size(c.mem_per_vcpu)} "
                       f"backing={c.backing} uffd_mode={c.uffd_mode} readers={c.readers} "
                       f"wait={self.reader_wait or c.wait}"),
            ("paging_rate", f"{self.paging_rate:.0f} pages/s "
                            f"({self.per_vcpu_rate:.0f} per vCPU)"),
            ("seconds", f"{self.seconds:.6f}"),
            ("faults", f"{self.faults} resolved, {self.eexist} EEXIST, "
                       f"{self.spurious_wakeups} spurious wakeups"),
            ("verified", f"NO: {self.verify_message}" if not self.verified else "yes"
             if self.contents_verified else "counts only: the pages' bytes were not "
             "checked (no local copy: give source_path)"),
        ]
        if self.blocktime_seconds is not None:
            summary.append(("blocktime_seconds", f"{self.blocktime_seconds:.6f}"))
        if self.clock_sync is not None:
            bound = "" if self.clock_error_ns is None else \
                f" (within {self.clock_error_ns:.0f} ns)"
            summary.append(("clock_sync", f"{self.clock_sync}{bound}"))
        elif self.clock_sync_message is not None:
            summary.append(("clock_sync", f"none, no stages: {self.clock_sync_message}"))
        if c.prefetch != "none" and self.prefetched_pages is not None:
            summary.append(("prefetch", f"{c.prefetch}: {self.prefetched_pages} pages "
                                        f"({self.wasted_prefetch_pages} never touched), "
                                        f"{self.faults_avoided} faults avoided"))
        vcpus = tables.Table(
            "vCPUs", ("vcpu", "seconds", "pages", "first_pass_pages_per_s", "faults", "eexist",
                      "exits", "cpu_seconds"),
            [(v.index, f"{v.seconds:.6f}", v.pages, f"{v.first_pass_pages_per_s:.0f}",
              v.faults, v.eexist, v.exits, f"{v.cpu_seconds:.6f}") for v in self.vcpus])
        readers = tables.Table(
            "readers", ("uffd", "reader", "faults", "eexist", "wakeups", "spurious_wakeups",
                        "busy_seconds", "context_switches"),
            [(x.uffd, x.index, x.faults, x.eexist, x.wakeups, x.spurious_wakeups,
              None if x.busy_seconds is None else f"{x.busy_seconds:.6f}",
              x.context_switches) for x in self.readers])
        return [tables.Table("uffdkvm run", ("", ""), summary, header=False), vcpus, readers]

    # ---- frames (pandas, loaded on call) and JSON

    def to_frame(self) -> pandas.DataFrame:
        """One row: Config fields, results and aggregates (see uffdkvm.io.frames)."""
        return frames.run_frame(self)

    def vcpus_frame(self) -> pandas.DataFrame:
        """One row per vCPU, KVM's statistics as ``kvm_*`` columns."""
        return frames.vcpus_frame(self)

    def readers_frame(self) -> pandas.DataFrame:
        """One row per reader thread."""
        return frames.readers_frame(self)

    def dirty_passes_frame(self) -> pandas.DataFrame:
        """One row per tracked pass (dirty_tracking), see DirtyPass."""
        return frames.dirty_passes_frame(self)

    def faults_frame(self) -> pandas.DataFrame:
        """One row per fault, from fault_trace (needs trace_faults=True)."""
        return frames.faults_frame(self)

    def to_json(self, **dumps_kwargs: Any) -> str:
        """Everything, losslessly, as one line of strict JSON (see uffdkvm.io.serial)."""
        return serial.to_json(self, **dumps_kwargs)

    @classmethod
    def from_json(cls, text: str | bytes, max_bytes: int = serial.MAX_JSON_BYTES) -> Result:
        """The Result that :meth:`to_json` wrote: ``Result.from_json(r.to_json()) == r``.
        Raises ResultError (a ValueError) naming what is wrong, for anything
        but a valid Result: text that is not JSON or over max_bytes, values
        of the wrong type, and values no run could have made (uffdkvm._invariants:
        a negative count, a total that is not the sum of its parts)."""
        result: Result = serial.from_json(cls, text, max_bytes)
        invariants.check_result(result)
        return result

    @classmethod
    def _from_core(cls, config: Config, raw: dict[str, Any]) -> Result:
        """The Result of the core's dict (csrc/python/result.c's tables): each field
        by its own name (see _from_raw), None where this run did not measure
        it (the schema's ``measured``, against _measured), and the times of
        _times."""
        timing = config.guest_timing
        measured = _measured(config, raw)
        staged = measured["staged"]
        times = _times(raw)
        unmeasured = {s: schema_results.unmeasured(s, measured)
                      for s in ("Result", "VcpuStats", "ReaderStats")}
        vcpus = tuple(
            _from_raw(VcpuStats, v, unmeasured["VcpuStats"], **vcpu_times,
                      access_latency=_access_latency(v["access_hist"], v["access_cycles"],
                                                     raw["tsc_khz"]) if timing else None)
            for v, vcpu_times in zip(raw["vcpus"], times.pop("vcpus"), strict=True))
        readers = tuple(
            _from_raw(ReaderStats, r, unmeasured["ReaderStats"],
                      read_sizes=tuple(r["read_sizes"][:config.read_batch + 1]))
            for r in raw["readers"])
        trace = raw["fault_trace"]
        dirty_passes = tuple(_from_raw(DirtyPass, p) for p in raw["dirty_passes"])
        rounds = tuple(_from_raw(MigrationRound, r) for r in raw["migration_rounds"])
        return _from_raw(
            cls, raw, unmeasured["Result"], **times, config=config, vcpus=vcpus,
            readers=readers, host=None, page_server=None, source=_SOURCE_NAMES[raw["source"]],
            dirty_passes=dirty_passes, migration_rounds=rounds,
            fault_trace=None if trace is None else FaultTrace(
                **{name: tuple(column) for name, column in trace.items()},
                start_ns=raw["threads_start_ns"]),
            clock_sync=_CLOCK_SYNC.get(raw["clock_sync"]) if staged else None,
            clock_error_ns=float(raw["clock_error_ns"]) if staged else None,
            # The core says why wherever it could not convert, and only there.
            clock_sync_message=raw["clock_sync_message"] or None,
            reader_cpus=config.reader_cpus, readers_with_vcpus=config.readers_with_vcpus,
            reader_wait=config.reader_wait
            if config.uffd_mode is not None and config.resolver == "readers" else None)


def _measured(config: Config, raw: dict[str, Any]) -> dict[str, bool]:
    """Which of the schema's CONDITIONS held for this run (a field measured
    under a condition that did not hold is None)."""
    full = bool(raw["stats_full"])
    # The guest's stamps give the stages around service, where its clock
    # could be put on the readers'.
    staged = full and config.guest_timing and raw["clock_sync"] != _core.CLOCK_SYNC_NONE
    timed_source = full and raw["source"] != _core.SOURCE_SYNTHETIC
    return {"full": full, "staged": staged, "timed_source": timed_source,
            "timed_source_read": timed_source and bool(raw["readers"]),
            "wp_async": config.wp_async,
            "dirty_tracking": config.dirty_tracking is not None,
            "migration": config.migration is not None,
            "source_file": raw["source"] == _core.SOURCE_FILE,
            "tracked": bool(raw["resident_tracked"])}


def _from_raw(cls: type[_T], raw: dict[str, Any], unmeasured: Sequence[str] = (),
              **given: Any) -> _T:
    """A cls (VcpuStats, ReaderStats, Result, ...) from one of the core's dicts.

    Every field the core counts has the core's own name (the schema's value,
    uffdkvm/schema/results.py), so this is mechanical: field X is raw["X"],
    and the one conversion is a unit, field X_seconds being the core's
    duration raw["X_ns"] / 1e9 (None stays None: the core could not measure
    it). A list is a tuple, a histogram's dict a Histogram. Fields in
    ``unmeasured`` are None (this run did not measure them, e.g. latencies
    with stats="basic"); ``given`` are what the core has no counter for
    (names, times, the Config). A field found in none of these is a
    KeyError: a counter the core stopped reporting cannot pass unnoticed.
    """
    kwargs = dict(given)
    for v in schema_results.BY_PY[cls.__name__].fields:
        name = typing.cast(str, v.py_name)
        if name in kwargs:
            continue
        if name in unmeasured:
            kwargs[name] = None
            continue
        if v.conversion is None:
            raise KeyError(f"{cls.__name__}.{name}: a field of Python's, not given")
        value = raw[v.name]
        if v.unit == "s" and value is not None:
            value = value * NS
        elif v.conversion == "HIST":
            value = _latency(value)
        kwargs[name] = tuple(value) if isinstance(value, list) else value
    return cls(**kwargs)


def _times(raw: dict[str, Any]) -> dict[str, Any]:
    """The one place Python derives a measurement: the durations between the
    core's time stamps, and the rate over them (docs/results.md).

    seconds          demand_paging_test's window: the vCPU threads' creation
                     to their join
    kvm_run_seconds  the first KVM_RUN of any vCPU to the last vCPU done
    startup_seconds  the vCPU threads' creation to that first KVM_RUN
    pass_seconds     pass p: the first vCPU starting it to the last ending it
                     (under dirty tracking, from the vCPUs' release into it)
    paging_rate      pages_per_vcpu * vcpus / seconds; with several passes over
                     the one that demand-pages, from the threads' creation to
                     the last vCPU ending the first pass
    vcpus            each vCPU's seconds and pass_seconds
    """
    seconds = (raw["threads_joined_ns"] - raw["threads_start_ns"]) * NS
    # A pass starts where the last ended, or under dirty tracking where the
    # vCPUs were let into it (the harvest between is no pass's).
    gates = [p["start_ns"] for p in raw["dirty_passes"]]
    starts = [[v["start_ns"], *(gates or v["pass_end_ns"][:-1])] for v in raw["vcpus"]]
    ends = [v["pass_end_ns"] for v in raw["vcpus"]]
    paging_seconds = seconds
    if raw["passes"] > 1 and ends:
        paging_seconds = (max(e[0] for e in ends) - raw["threads_start_ns"]) * NS
    pages = raw["pages_per_vcpu"] * len(raw["vcpus"])
    return {
        "seconds": seconds,
        # migration: round 1's start to the stop (postcopy: the stop, no rounds)
        **({"precopy_seconds": (raw["migration_stop_ns"] - raw["migration_start_ns"]) * NS}
           if raw["migration_stop_ns"] else {}),
        "kvm_run_seconds": (raw["end_ns"] - raw["start_ns"]) * NS,
        "startup_seconds": (raw["start_ns"] - raw["threads_start_ns"]) * NS,
        "pass_seconds": tuple((max(e[p] for e in ends) - min(s[p] for s in starts)) * NS
                              for p in range(raw["passes"])),
        "paging_rate": pages / paging_seconds if paging_seconds > 0 else 0.0,
        "vcpus": [{"seconds": (v["end_ns"] - v["start_ns"]) * NS,
                   "pass_seconds": tuple((b - a) * NS for a, b in
                                         zip(s, v["pass_end_ns"], strict=False))}
                  for v, s in zip(raw["vcpus"], starts, strict=True)],
    }
