"""What one experiment measured: :class:`Result` and its per-thread parts.

All types are frozen dataclasses of plain values, defined here in one place.
Units are in the names where a name alone would leave them open.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from . import _core
from .config import Config
from .histogram import Histogram
from .host import HostInfo

NS = 1e-9
_CLOCK_SYNC = {_core.CLOCK_SYNC_KVM_OFFSET: "kvm_tsc_offset",
               _core.CLOCK_SYNC_EXITS: "sync_exits"}
# The core's latency buckets, in nanoseconds (see Histogram).
LATENCY_BOUNDS = tuple(_core.HIST_BOUNDS)


def _plain(value):
    """Dicts, lists and scalars only: what json.dumps writes and reads back alike."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _latency(h: dict) -> Histogram:
    return Histogram(LATENCY_BOUNDS, tuple(h["buckets"]), h["count"], h["sum"],
                     h["min"], h["max"])


def _access_latency(counts, cycles: int, tsc_khz: int) -> Histogram | None:
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
    """One vCPU.

    seconds          from its first KVM_RUN until the guest reported done
    pages            4 KiB pages the guest says it touched (all passes)
    exits            VM exits during the run, from KVM's own "exits" counter
                     (None where the kernel has no binary stats)
    userspace_exits  returns from KVM_RUN to the vCPU thread (with
                     guest_timing, 32 of them are the clock-sync exits)
    kvm_stats        KVM's own statistics for this vCPU over the run, by the
                     kernel's names: counters as deltas, the rest as they
                     stood at the end (empty without KVM_GET_STATS_FD)
    tid              the host thread that ran it
    pass_seconds     how long each pass took (the first one demand-pages)
    cpus             the CPUs the thread could run on, as it saw them itself
    cpu_seconds      CPU time the thread used
    faults           fault messages this vCPU caused (UFFD_FEATURE_THREAD_ID),
                     EEXIST ones included; None with stats="basic"

    Each fault in stages (ns Histograms; stats="full"). A fault is raised when
    the guest is about to make the access, read when a reader's read()
    returns its message, resolved when the resolving ioctl returns, resumed
    when the guest's access completes. Raised and resumed come from the
    guest's own rdtsc stamps, so they need guest_timing=True:

    queue_latency    raised -> read: delivery, the wakeup, the herd
                     (guest_timing, else None)
    service_latency  read -> the page's arrival: the reader's work,
                     delay_us included (service time only: not the whole
                     fault). The page arrives when the resolving ioctl
                     returns, or, with guest_timing, when the vCPU resumed
                     if that came first (the ioctl wakes the vCPU before it
                     returns)
    resume_latency   the page's arrival -> resumed: waking the vCPU and
                     finishing the access (guest_timing, else None)
    fault_latency    raised -> resumed: the whole fault as the vCPU lived it,
                     = queue + service + resume (guest_timing, else None)
    blocked_seconds  time with a fault of this vCPU outstanding (QEMU's
                     per-vCPU blocktime): raised -> resumed with guest_timing,
                     read -> resolved without it
    access_latency   guest_timing: Histogram of every access as the guest
                     timed it with rdtsc (ns), faulting or not, all passes
    """

    index: int
    seconds: float
    pages: int
    exits: int | None
    userspace_exits: int
    tid: int
    kvm_stats: dict[str, int] = field(default_factory=dict, repr=False)
    pass_seconds: list[float] = field(default_factory=list)
    cpus: list[int] = field(default_factory=list, repr=False)
    cpu_seconds: float = 0.0
    faults: int | None = None
    queue_latency: Histogram | None = None
    service_latency: Histogram | None = None
    resume_latency: Histogram | None = None
    fault_latency: Histogram | None = None
    blocked_seconds: float | None = None
    access_latency: Histogram | None = None

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class ReaderStats:
    """One reader thread of one uffd.

    faults            faults this reader resolved
    wakeups           returns from its wait (poll, epoll_wait or read)
    spurious_wakeups  wakeups after which the read found nothing (EAGAIN):
                      another reader took the message
    eexist            faults it found already resolved by another reader
    copies, zeropages, continues
                      messages it resolved with UFFDIO_COPY, UFFDIO_ZEROPAGE,
                      UFFDIO_CONTINUE (EEXIST ones included)
    busy_seconds      service time summed: from reading a message to its
                      resolving ioctl returning (the per-fault delay
                      included); None with stats="basic", which reads no clocks
    service_latency   Histogram of those intervals (ns); None with stats="basic"
    queue_latency     guest_timing with stats="full": Histogram of the time
                      from the guest raising each fault this reader read to
                      the read returning (ns), else None
    tid               the reader's host thread
    context_switches  times the thread was switched out (getrusage): counts
                      in-kernel herd wakeups that spurious_wakeups cannot see
    cpu_seconds       CPU time the thread used
    cpus              the CPUs the thread could run on, as it saw them itself
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
    cpus: list[int] = field(default_factory=list, repr=False)
    service_latency: Histogram | None = None
    queue_latency: Histogram | None = None
    tid: int = 0
    copies: int = 0
    zeropages: int = 0
    continues: int = 0


@dataclass(frozen=True)
class FaultTrace:
    """Every fault of a run (trace_faults=True), as columns, by read time.
    Times are CLOCK_MONOTONIC nanoseconds:

    raised_ns     the guest was about to make the access (guest_timing,
                  from its rdtsc stamp; None without guest timing)
    read_ns       a reader's read() returned the fault message
    resolved_ns   the resolving ioctl returned
    resumed_ns    the guest's access completed (guest_timing, else None)
    gpa           the 4 KiB page the vCPU touched, guest-physical (hugetlb
                  on a kernel without UFFD_FEATURE_EXACT_ADDRESS, Linux
                  5.18+: the huge page's start)
    vcpu          the vCPU that faulted, or -1 if unknown
    uffd, reader  who resolved it
    eexist        another reader had resolved it first
    write         the kernel reported a write fault (UFFD_PAGEFAULT_FLAG_WRITE):
                  the guest's access was a write (None in JSON from before
                  uffdkvm recorded it)
    """

    raised_ns: list[int | None]
    read_ns: list[int]
    resolved_ns: list[int]
    resumed_ns: list[int | None]
    gpa: list[int]
    vcpu: list[int]
    uffd: list[int]
    reader: list[int]
    eexist: list[bool]
    write: list[bool | None]

    def __len__(self) -> int:
        return len(self.read_ns)


@dataclass(frozen=True)
class Result:
    """One experiment.

    seconds        demand_paging_test's "Total guest execution time": from
                   just before the first vCPU thread is created to just after
                   the last one is joined (with guest_timing, the guest's
                   clock-sync exits before and after its walk fall inside)
    kvm_run_seconds  the narrower window: the first KVM_RUN of any vCPU to
                   the last vCPU reporting done (thread start-up and joining
                   left out)
    faults         faults resolved by all readers (EEXIST not counted)
    paging_rate    pages/s as upstream's demand_paging_test computes it:
                   pages_per_vcpu * vcpus / seconds; with passes > 1, over the
                   first pass (the one that demand-pages): from the threads'
                   creation to the last vCPU ending that pass
    pass_seconds   for each pass, first vCPU starting it to last vCPU ending it
    blocktime_seconds  time during which every vCPU had a fault outstanding
                   at once (QEMU's postcopy-blocktime), with each fault's
                   span as in VcpuStats.blocked_seconds; None with
                   stats="basic"
    fault_trace    trace_faults: every fault (FaultTrace), else None
    clock_sync     guest_timing with stats="full": how the guest's TSC stamps
                   were put on the readers' clock (CLOCK_MONOTONIC):
                   "kvm_tsc_offset" (KVM's offset, confirmed by the guest's
                   clock-sync exits before and after the walk) or
                   "sync_exits" (the exits' bracket alone); None where they
                   could not be (the offset moved during the run, or the
                   guest's TSC ran at another rate): then queue, resume and
                   fault latencies are None too, and blocked time falls back
                   to read -> resolved
    clock_error_ns a bound on that conversion's error, ns (None with it)
    misordered_faults  faults whose stamps contradict the readers' clock
                   (raised after the read, or resumed before it), left out
                   of the stages: 0 when the clocks agree (None without a
                   conversion)
    verified       every page of the region held what it must after the run,
                   and every vCPU touched and read what it should have
    bad_pages      pages that did not (0 when verified)
    verify_message the first problem found, or "" when verified
    kvm_stats      KVM's VM-wide statistics over the run, like VcpuStats'
    host           the machine it ran on (None for a Result made by hand)
    """

    config: Config
    seconds: float
    pages_per_vcpu: int
    faults: int
    paging_rate: float
    vcpus: list[VcpuStats]
    readers: list[ReaderStats]
    verified: bool
    bad_pages: int
    verify_message: str
    page_size: int
    uffds: int
    kvm_stats: dict[str, int] = field(default_factory=dict, repr=False)
    pass_seconds: list[float] = field(default_factory=list)
    blocktime_seconds: float | None = None
    fault_trace: FaultTrace | None = field(default=None, repr=False)
    host: HostInfo | None = field(default=None, repr=False)
    kvm_run_seconds: float | None = None
    clock_sync: str | None = None
    clock_error_ns: float | None = None
    misordered_faults: int | None = None

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

    @property
    def eexist(self) -> int:
        return sum(r.eexist for r in self.readers)

    @property
    def spurious_wakeups(self) -> int:
        return sum(r.spurious_wakeups for r in self.readers)

    def to_dict(self) -> dict:
        """Everything as plain JSON-ready types (the config included)."""
        d = _plain(dataclasses.asdict(self))
        d["config"] = self.config.to_dict()
        d["per_vcpu_rate"] = self.per_vcpu_rate
        return d

    # Frames and JSON live in frames.py and serial.py; pandas loads on call.
    def to_frame(self):
        """One row: Config fields, results and aggregates (see uffdkvm.frames)."""
        from .frames import run_frame
        return run_frame(self)

    def vcpus_frame(self):
        """One row per vCPU, KVM's statistics as ``kvm_*`` columns."""
        from .frames import vcpus_frame
        return vcpus_frame(self)

    def readers_frame(self):
        """One row per reader thread."""
        from .frames import readers_frame
        return readers_frame(self)

    def faults_frame(self):
        """One row per fault, from fault_trace (needs trace_faults=True)."""
        from .frames import faults_frame
        return faults_frame(self)

    def to_json(self, **dumps_kwargs) -> str:
        """Everything, losslessly, as one line of JSON (see uffdkvm.serial)."""
        from .serial import to_json
        return to_json(self, **dumps_kwargs)

    @classmethod
    def from_json(cls, text) -> Result:
        """The Result that :meth:`to_json` wrote: ``Result.from_json(r.to_json()) == r``."""
        from .serial import from_json
        return from_json(cls, text)

    @classmethod
    def _from_core(cls, config: Config, raw: dict) -> Result:
        full = raw["stats_full"]
        timing = config.guest_timing
        # The guest's stamps give the stages around service, where its clock
        # could be put on the readers'.
        staged = full and timing and raw["clock_sync"] != _core.CLOCK_SYNC_NONE

        def stage(h: dict, present: bool) -> Histogram | None:
            return _latency(h) if present else None

        vcpus = [VcpuStats(index=v["index"], seconds=(v["end_ns"] - v["start_ns"]) * NS,
                           pages=v["pages"], exits=v["exits"],
                           userspace_exits=v["userspace_exits"], tid=v["tid"],
                           kvm_stats=v["kvm_stats"],
                           pass_seconds=[(b - a) * NS for a, b in
                                         zip([v["start_ns"]] + v["pass_end_ns"], v["pass_end_ns"])],
                           cpus=v["cpus"], cpu_seconds=v["cpu_ns"] * NS,
                           faults=v["faults"] if full else None,
                           queue_latency=stage(v["queue_latency"], staged),
                           service_latency=stage(v["service_latency"], full),
                           resume_latency=stage(v["resume_latency"], staged),
                           fault_latency=stage(v["fault_latency"], staged),
                           blocked_seconds=v["blocked_ns"] * NS if full else None,
                           access_latency=_access_latency(v["access_hist"], v["access_cycles"],
                                                          raw["tsc_khz"]) if timing else None)
                 for v in raw["vcpus"]]
        readers = [ReaderStats(uffd=r["uffd"], index=r["index"], faults=r["faults"],
                               wakeups=r["wakeups"], spurious_wakeups=r["spurious_wakeups"],
                               eexist=r["eexist"],
                               busy_seconds=r["busy_ns"] * NS if full else None,
                               context_switches=r["context_switches"],
                               cpu_seconds=r["cpu_ns"] * NS, cpus=r["cpus"],
                               service_latency=stage(r["service_latency"], full),
                               queue_latency=stage(r["queue_latency"], staged),
                               tid=r["tid"], copies=r["copies"], zeropages=r["zeropages"],
                               continues=r["continues"])
                   for r in raw["readers"]]
        # demand_paging_test's window: the vCPU threads' creation to their join.
        seconds = (raw["threads_joined_ns"] - raw["threads_start_ns"]) * NS
        pages = raw["pages_per_vcpu"]
        # Pass p runs from the first vCPU starting it to the last one ending it.
        starts = [[v["start_ns"]] + v["pass_end_ns"][:-1] for v in raw["vcpus"]]
        ends = [v["pass_end_ns"] for v in raw["vcpus"]]
        pass_seconds = [(max(e[p] for e in ends) - min(s[p] for s in starts)) * NS
                        for p in range(raw["passes"])]
        # With several passes the rate covers the one that demand-pages: from
        # the threads' creation (upstream's start) to the last vCPU ending it.
        paging_seconds = seconds
        if raw["passes"] > 1 and ends:
            paging_seconds = (max(e[0] for e in ends) - raw["threads_start_ns"]) * NS
        trace = raw["trace"]
        return cls(
            config=config,
            seconds=seconds,
            pages_per_vcpu=pages,
            faults=sum(r.faults for r in readers),
            paging_rate=pages * len(vcpus) / paging_seconds if paging_seconds > 0 else 0.0,
            vcpus=vcpus,
            readers=readers,
            verified=raw["verified"],
            bad_pages=raw["bad_pages"],
            verify_message=raw["verify_message"],
            page_size=raw["page_size"],
            uffds=raw["uffds"],
            kvm_stats=raw["kvm_stats"],
            pass_seconds=pass_seconds,
            blocktime_seconds=raw["blocktime_ns"] * NS if full else None,
            fault_trace=FaultTrace(**trace) if trace is not None else None,
            kvm_run_seconds=(raw["end_ns"] - raw["start_ns"]) * NS,
            clock_sync=_CLOCK_SYNC.get(raw["clock_sync"]) if staged else None,
            clock_error_ns=float(raw["clock_error_ns"]) if staged else None,
            misordered_faults=raw["misordered"] if staged else None,
        )
