"""The one declaration of every result value: what the core measures and
what Python makes of it, the result side of uffdkvm/schema/fields.py.

Pure data, the standard library only, importable without the extension.
Everything below is generated from STRUCTS by the one command that writes
the config's files too (see uffdkvm/schema/fields.py):

    python tools/gen_schema.py --write     # rewrite every generated file
    python tools/gen_schema.py --check     # exit 1 naming any stale one


- csrc/result_schema.h: each result struct's members (ukvm.h builds
  struct ukvm_result and the rest from UKVM_<STRUCT>_MEMBERS) and the
  X-macro tables the binding walks to hand them over (csrc/python/result.c,
  UKVM_<STRUCT>_FIELDS);
- in uffdkvm/result.py, between marker lines, each dataclass's docstring
  and fields (Result, VcpuStats, ReaderStats, DirtyPass, MigrationRound,
  FaultTrace);
- the field tables of docs/results.md.

At run time result.py reads STRUCTS too: which fields a run did not measure
(:func:`unmeasured`) and how each field comes from the core's dict
(Result._from_core).

A value is one entry of its struct, in the C struct's order (which is its
layout). ``name`` is the C member and the key of the binding's dict; the
Python field has the same name, but for a duration (``unit="s"``): member
``X_ns`` is field ``X_seconds``, ``X_ns / 1e9``. An entry is one of:

- the core's and Python's (``c`` and ``field`` both set): handed over by
  the binding and read into the field;
- the core's only (``field`` None): handed over by the binding for Python
  to derive fields from (``threads_start_ns``), or, ``to_py`` None, kept in
  the struct only (an array's count, the stats' names);
- Python's only (``c`` None): a field Python derives or is given (the
  durations between the core's stamps, the Config, the host).

``measured``: a key of CONDITIONS. Where a run's condition is false the
field is None ("not measured", not 0).
"""
from __future__ import annotations

from dataclasses import dataclass

#: When a field is measured: the name of each condition result.py computes
#: for a run, and what it means.
CONDITIONS = {
    "full": 'stats="full"',
    "staged": 'guest_timing with stats="full", the guest\'s stamps put on the readers\' '
              'clock (clock_sync)',
    "timed_source": 'stats="full" with a source other than "synthetic"',
    "timed_source_read": 'stats="full" with a source other than "synthetic", and readers',
    "wp_async": "wp_async=True",
    "dirty_tracking": "dirty_tracking set",
    "migration": "migration set",
    "source_file": 'source="file"',
    "tracked": 'pages tracked: uffd_mode="missing" with resolve="copy", no prefault',
}

#: How each unit reads in docs/results.md's tables.
UNITS = {"s": "seconds", "ns": "ns", "pages": "pages", "bytes": "bytes", "count": "count",
         "cycles": "TSC cycles", "%": "percent", "": ""}


@dataclass(frozen=True)
class Value:
    name: str                   # the C member (Python-only: the field), see the module doc
    c: str | None               # the member's C type ("uint64_t", "char[320]", ...);
    #                             None: Python's only
    doc: str                    # what it means, for the docstring, the header and the docs
    field: str | None = None    # the dataclass field's annotation and default
    #                             ("int | None = None"); None: no field (the core's only)
    unit: str = ""              # one of UNITS; "s": the core's X_ns is Python's X_seconds
    measured: str = ""          # a key of CONDITIONS, or "": whenever the struct is
    to_py: str | None = ""      # the binding's conversion (R_<to_py>, csrc/python/result.c);
    #                             "": from c; None: not handed over

    @property
    def py_name(self) -> str | None:
        """The dataclass field's name, or None."""
        if self.field is None:
            return None
        if self.c is not None and self.unit == "s":
            return self.name.removesuffix("_ns") + "_seconds"
        return self.name

    @property
    def conversion(self) -> str | None:
        """How the binding hands it over (R_<this>), or None."""
        if self.c is None or self.to_py is None:
            return None
        if self.to_py:
            return self.to_py
        if self.c.startswith("char["):
            return "STRING"
        if self.c.startswith("uint64_t["):
            return "U64_ARRAY"
        if self.c.startswith("enum "):
            return "ENUM"
        simple = {"uint64_t": "U64", "uint32_t": "U32", "int32_t": "I32", "uint16_t": "U16",
                  "bool": "BOOL", "struct ukvm_hist": "HIST"}
        # A declaration's mistake, found when the generator or the binding's
        # table reads it, never by a user.
        assert self.c in simple, f"{self.name}: give to_py for a {self.c}"
        return simple[self.c]


@dataclass(frozen=True)
class Struct:
    c: str                      # the C struct, after "struct ukvm_"
    py: str                     # the dataclass in uffdkvm/result.py
    doc: str                    # the dataclass docstring's text before its field list
    values: tuple[Value, ...]

    @property
    def macro(self) -> str:
        """UKVM_<C>_MEMBERS and UKVM_<C>_FIELDS."""
        return f"UKVM_{self.c.upper()}"

    @property
    def fields(self) -> tuple[Value, ...]:
        """The values that are dataclass fields, in the dataclass's order:
        those without a default first (as a dataclass requires), then the
        rest, each in the schema's order."""
        own = [v for v in self.values if v.field is not None]
        return (*(v for v in own if "=" not in v.field),  # type: ignore[operator]
                *(v for v in own if "=" in v.field))  # type: ignore[operator]


def V(name: str, c: str | None, doc: str, field: str | None = None, **kw: str | None) -> Value:
    return Value(name, c, doc, field, **kw)  # type: ignore[arg-type]


U64, U32 = "uint64_t", "uint32_t"
_HIST = "struct ukvm_hist"
_CPUS = dict(c="uint64_t[16]", to_py="CPUS", field="tuple[int, ...] = ()",
             doc="the CPUs the thread could run on, as it saw them itself")

FAULT_RECORD = Struct("fault_record", "FaultTrace", (
    "Every fault of a run (trace_faults=True), as columns, by read time.\n"
    "Times are CLOCK_MONOTONIC nanoseconds:"), (
    V("raised_ns", U64, "the guest was about to make the access (guest_timing, from its "
      "rdtsc stamp; None without guest timing)",
      "tuple[int | None, ...]", unit="ns", to_py="STAMP"),
    V("read_ns", U64, "a reader's read() returned the fault message", "tuple[int, ...]",
      unit="ns"),
    V("resolved_ns", U64, "the resolving ioctl returned", "tuple[int, ...]", unit="ns"),
    V("resumed_ns", U64, "the guest's access completed (guest_timing, else None)",
      "tuple[int | None, ...]", unit="ns", to_py="STAMP"),
    V("gpa", U64, "the 4 KiB page the vCPU touched, guest-physical (hugetlb on a kernel "
      "without UFFD_FEATURE_EXACT_ADDRESS, Linux 5.18+: the huge page's start)",
      "tuple[int, ...]"),
    V("vcpu", "int32_t", "the vCPU that faulted (UFFD_FEATURE_THREAD_ID), or -1 if unknown",
      "tuple[int, ...]"),
    V("uffd", "uint16_t", "the uffd of the reader that resolved it", "tuple[int, ...]"),
    V("reader", "uint16_t", "the reader (of that uffd) that resolved it", "tuple[int, ...]"),
    V("eexist", U32, "another reader had resolved it first", "tuple[bool, ...]",
      to_py="FLAG"),
    V("write", U32, "the kernel reported a write fault (UFFD_PAGEFAULT_FLAG_WRITE): the "
      "guest's access was a write (None in JSON from before uffdkvm recorded it)",
      "tuple[bool | None, ...]", to_py="FLAG"),
    V("start_ns", None, "the run's start: the vCPU threads' creation, where Result.seconds "
      "begins (faults_frame's t_s counts from it); None in JSON from before uffdkvm "
      "recorded it", "int | None = None", unit="ns"),
))

VCPU_RESULT = Struct("vcpu_result", "VcpuStats", (
    "One vCPU.\n\n"
    "Each fault in stages (ns Histograms; stats=\"full\"). A fault is raised when\n"
    "the guest is about to make the access, read when a reader's read()\n"
    "returns its message, resolved when the resolving ioctl returns, resumed\n"
    "when the guest's access completes. Raised and resumed come from the\n"
    "guest's own rdtsc stamps, so they need guest_timing=True. faults counts\n"
    "what it does at every level (this vCPU, a reader, the run): faults\n"
    "resolved, EEXIST ones not included; faults + eexist are the messages."), (
    V("index", U32, "the vCPU's index", "int"),
    V("tid", "int32_t", "the host thread that ran it", "int"),
    V("start_ns", U64, "its first KVM_RUN (CLOCK_MONOTONIC)", unit="ns"),
    V("end_ns", U64, "the guest reported it was done (CLOCK_MONOTONIC)", unit="ns"),
    V("seconds", None, "from its first KVM_RUN until the guest reported done", "float",
      unit="s"),
    V("pages", U64, "4 KiB pages the guest says it touched (all passes)", "int",
      unit="pages"),
    V("exits", U64, "VM exits during the run, from KVM's own \"exits\" counter (None where "
      "the kernel has no binary stats)", "int | None", unit="count"),
    V("userspace_exits", U64, "returns from KVM_RUN to the vCPU thread, not counting the "
      "EAGAIN retries that never entered the guest (with guest_timing, 32 of them are the "
      "clock-sync exits; with auto_converge, the throttle's kicks, up to 100 a second)",
      "int", unit="count"),
    V("fault_exits", U64, "with resolver=\"vcpu\": those returns that were a fault this "
      "vCPU's own thread resolved (0 with readers)", "int = 0", unit="count"),
    V("regs_fault_exits", U64, "of fault_exits, those where KVM_RUN's EFAULT did not name "
      "the page (stock x86 KVM) and the thread found it from the guest's registers "
      "(KVM_GET_REGS: the walk's access at %rip, its page in %rax)", "int = 0",
      unit="count"),
    V("kvm_stats", "uint64_t *", "KVM's own statistics for this vCPU over the run, by the "
      "kernel's names: counters as deltas, the rest as they stood at the end (empty without "
      "KVM_GET_STATS_FD)",
      "dict[str, int] = field(default_factory=dict, hash=False)", to_py="VCPU_KVM_STATS"),
    V("pass_end_ns", "uint64_t *", "when each of ukvm_result.passes ended (CLOCK_MONOTONIC)",
      unit="ns", to_py="PASS_END"),
    V("pass_seconds", None, "how long each pass took (the first one demand-pages)",
      "tuple[float, ...] = ()", unit="s"),
    V("cpu_ns", U64, "CPU time the thread used (getrusage)", "float = 0.0", unit="s"),
    V("throttled_ns", U64, "a migration's source with auto_converge: the thread's throttle "
      "sleeps, the guest's time given up (0 otherwise)", "float = 0.0", unit="s"),
    V("cpus", **_CPUS),
    V("faults", U64, "faults of this vCPU that a reader resolved (UFFD_FEATURE_THREAD_ID): "
      "as Result.faults and ReaderStats.faults count, EEXIST ones not included; with "
      "uffd_mode=\"wp\", the write-protect faults: first writes to pages (reads do not "
      "fault); None with stats=\"basic\"", "int | None = None", unit="count",
      measured="full"),
    V("eexist", U64, "fault messages of this vCPU that a reader found already resolved "
      "(another vCPU's fault on the same page came first): faults + eexist are the "
      "messages it caused; None with stats=\"basic\"", "int | None = None", unit="count",
      measured="full"),
    V("blocked_ns", U64, "time with a fault of this vCPU outstanding (QEMU's per-vCPU "
      "blocktime): raised -> resumed with guest_timing, read -> resolved without it",
      "float | None = None", unit="s", measured="full"),
    V("service_latency", _HIST, "read -> the page's arrival: the reader's work, delay_us "
      "included (service time only: not the whole fault). The page arrives when the "
      "resolving ioctl returns, or, with guest_timing, when the vCPU resumed if that came "
      "first (the ioctl wakes the vCPU before it returns)", "Histogram | None = None",
      unit="ns", measured="full"),
    V("queue_latency", _HIST, "raised -> read: delivery, the wakeup, the herd (guest_timing, "
      "else None)", "Histogram | None = None", unit="ns", measured="staged"),
    V("resume_latency", _HIST, "the page's arrival -> resumed: waking the vCPU and "
      "finishing the access (guest_timing, else None)", "Histogram | None = None",
      unit="ns", measured="staged"),
    V("fault_latency", _HIST, "raised -> resumed: the whole fault as the vCPU lived it, = "
      "queue + service + resume; with overlap also stalls another vCPU's fault ended "
      "(EEXIST) (guest_timing, else None)", "Histogram | None = None", unit="ns",
      measured="staged"),
    V("access_cycles", U64, "guest_timing: every access's TSC cycles, summed",
      unit="cycles"),
    V("access_hist", "uint64_t[64]", "guest_timing: [i] the accesses of 2^i to 2^(i+1) - 1 "
      "TSC cycles", unit="count"),
    V("access_latency", None, "guest_timing: Histogram of every access as the guest timed "
      "it with rdtsc (ns), faulting or not, all passes", "Histogram | None = None",
      unit="ns"),
))

READER_RESULT = Struct("reader_result", "ReaderStats", (
    "One reader thread of one uffd. Every counter is kept by the reader\n"
    "thread itself and kept on every exit."), (
    V("uffd", U32, "which uffd of the experiment", "int"),
    V("index", U32, "which reader of that uffd", "int"),
    V("faults", U64, "faults this reader resolved", "int", unit="count"),
    V("wakeups", U64, "returns from its wait (poll, epoll_wait or read)", "int",
      unit="count"),
    V("spurious_wakeups", U64, "wakeups after which the read found nothing (EAGAIN, or "
      "EINTR when the run's stop kicked the read): another reader took the message, or the "
      "vCPU, kicked at the stop, left its fault", "int", unit="count"),
    V("eexist", U64, "faults it found already resolved by another reader", "int",
      unit="count"),
    V("tid", "int32_t", "the reader's host thread", "int = 0"),
    V("busy_ns", U64, "service time summed: from reading a message to its resolving ioctl "
      "returning (the per-fault delay included); None with stats=\"basic\", which reads no "
      "clocks", "float | None", unit="s", measured="full"),
    V("copies", U64, "messages it resolved with UFFDIO_COPY (EEXIST ones included)",
      "int = 0", unit="count"),
    V("zeropages", U64, "messages it resolved with UFFDIO_ZEROPAGE (EEXIST ones included)",
      "int = 0", unit="count"),
    V("continues", U64, "messages it resolved with UFFDIO_CONTINUE (EEXIST ones included)",
      "int = 0", unit="count"),
    V("moves", U64, "messages it resolved with UFFDIO_MOVE (EEXIST ones included); 0 in "
      "older JSON", "int = 0", unit="count"),
    V("unprotects", U64, "uffd_mode=\"wp\": WP fault messages it answered by saving the "
      "page's old contents and un-protecting it with UFFDIO_WRITEPROTECT (EEXIST ones "
      "included: another vCPU's write to a page already being saved); 0 for the other "
      "modes and in older JSON", "int = 0", unit="count"),
    V("reads", U64, "read()s of the uffd that returned messages: (faults + eexist) / reads "
      "is messages per read, reads / wakeups reads per wakeup (above 1 only with "
      "read_batch above 1)", "int = 0", unit="count"),
    V("read_sizes", "uint64_t[UKVM_MAX_READ_BATCH + 1]", "[n]: reads that returned n "
      "messages (Config.read_batch caps n); [0]: reads after a full batch that found the "
      "uffd empty (not in reads); empty in older JSON", "tuple[int, ...] = ()",
      unit="count"),
    V("ring_completions", U64, "wait=\"io_uring\": completions of the reader's ring's reads "
      "of the uffd that brought messages, each one of ``reads`` (the mode reads nothing "
      "with read(2), so the two are equal); 0 for the other modes and in older JSON",
      "int = 0", unit="count"),
    V("prefetched", U64, "prefetch=\"readahead\": pages it installed after its faults "
      "(UFFDIO_COPY_MODE_DONTWAKE)", "int = 0", unit="pages"),
    V("prefetch_eexist", U64, "of its readahead copies, those that found the page there "
      "already (a fault or another prefetch got it first): races, not errors", "int = 0",
      unit="count"),
    V("wakes", U64, "UFFDIO_WAKEs it made after a fault found its page there (EEXIST): the "
      "failed ioctl wakes nobody, a prefetched page comes without a wake, and the faulting "
      "vCPU may be asleep on it (one per EEXIST of a 4 KiB page, of a huge page only with "
      "prefetch; none with resolver \"vcpu\")", "int = 0", unit="count"),
    V("context_switches", U64, "times the thread was switched out in all its life "
      "(getrusage): counts in-kernel herd wakeups that spurious_wakeups cannot see (a "
      "waiter the kernel wakes and puts back to sleep without returning to userspace)",
      "int", unit="count"),
    V("voluntary_context_switches", U64, "of those, the ones where it went to sleep itself "
      "(a spinning reader has next to none); 0 in older JSON", "int = 0", unit="count"),
    V("cpu_ns", U64, "CPU time the thread used, user and system, all its life (with "
      "resolver=\"vcpu\" the thread is the vCPU's, and this, cpus and context_switches are "
      "its counters, guest work included)", "float", unit="s"),
    V("cpus", **_CPUS),
    V("service_latency", _HIST, "Histogram of the busy_seconds intervals, message read to "
      "ioctl done (ns); None with stats=\"basic\"", "Histogram | None = None", unit="ns",
      measured="full"),
    V("queue_latency", _HIST, "guest_timing with stats=\"full\": Histogram of the time from "
      "the guest raising each fault this reader read to the read returning (ns), else None",
      "Histogram | None = None", unit="ns", measured="staged"),
    V("source_bytes", U64, "bytes it fetched from the page source (Config.source) for the "
      "pages it installed; 0 in older JSON", "int = 0", unit="bytes"),
    V("source_ns", U64, "stats=\"full\" with a source other than \"synthetic\": the time "
      "those fetches took (a file's pread or memcpy, page-cache misses included); None "
      "otherwise", "float | None = None", unit="s", measured="timed_source"),
))

DIRTY_PASS = Struct("dirty_pass", "DirtyPass", (
    "One pass under dirty tracking (Config.dirty_tracking), as\n"
    "dirty_log_perf_test reports an iteration: pass ``iteration + 1`` of the\n"
    "run (pass 1 populates, untracked). The vCPUs wait at the pass's end\n"
    "while the host harvests and re-protects (docs/dirty-tracking.md)."), (
    V("iteration", U32, "1, 2, ...: dirty_log_perf_test's iteration number", "int"),
    V("start_ns", U64, "the vCPUs were let into the pass (CLOCK_MONOTONIC)", unit="ns"),
    V("dirty_ns", U64, "the vCPUs let into the pass to the last one ending it "
      "(\"Iteration N dirty memory time\")", "float", unit="s"),
    V("harvest_ns", U64, "collecting what the tracker found: KVM_GET_DIRTY_LOG, the rings' "
      "entries, PAGEMAP_SCAN (\"get dirty log time\"); for \"bitmap\" and \"wp_async\" the "
      "same call also re-protects", "float", unit="s"),
    V("reprotect_ns", U64, "re-protecting it: KVM_CLEAR_DIRTY_LOG (bitmap_manual), "
      "KVM_RESET_DIRTY_RINGS (ring); 0.0 for \"bitmap\" and \"wp_async\", whose harvest did "
      "it (\"clear dirty log time\")", "float", unit="s"),
    V("reprotect_calls", U64, "the ioctls that re-protected: one KVM_CLEAR_DIRTY_LOG per "
      "dirty_clear_pages chunk (bitmap_manual), one KVM_RESET_DIRTY_RINGS (ring), 0 for the "
      "others", "int", unit="count"),
    V("found_pages", U64, "4 KiB pages the tracker reported dirty", "int", unit="pages"),
    V("written_pages", U64, "4 KiB pages the guest wrote in the pass, from its own write "
      "counts (word 2 of each page); a written page the tracker missed fails the run",
      "int", unit="pages"),
    V("excess_pages", U64, "found but not written: bitmap_manual's first iteration "
      "(INITIALLY_SET reports every page), and with wp_async, hugetlb pages (PAGEMAP_SCAN "
      "reports the whole page); 0 otherwise", "int", unit="pages"),
    V("ring_full_exits", U64, "ring: KVM_EXIT_DIRTY_RING_FULL exits in the pass, all vCPUs "
      "(each vCPU then harvests its own ring and resets)", "int = 0", unit="count"),
))

MIGRATION_ROUND = Struct("migration_round", "MigrationRound", (
    "One pre-copy round of a migration's source (Config.migration), its\n"
    "vCPUs running (docs/migration.md). Round 1 sends every page; each later\n"
    "round sends the pages the tracker found written during the one before."), (
    V("round", U32, "1, 2, ...", "int"),
    V("start_ns", U64, "the round began (CLOCK_MONOTONIC)", unit="ns"),
    V("send_ns", U64, "its pages onto the link, paced to link_bandwidth_mbps (round 1: "
      "after re-protecting the whole region)", "float", unit="s"),
    V("harvest_ns", U64, "the tracker's harvest and re-protect at its end", "float",
      unit="s"),
    V("sent_pages", U64, "4 KiB pages it sent", "int", unit="pages"),
    V("dirty_pages", U64, "4 KiB pages the tracker found written during it: the next "
      "round's, or at the switch-over the start of the stop-copy (or of what post-copy "
      "fetches)", "int", unit="pages"),
    V("ring_full_exits", U64, "dirty_tracking=\"ring\": KVM_EXIT_DIRTY_RING_FULL exits, "
      "every vCPU's, from the round's start to its harvest (the last round's: to the final "
      "harvest at the stop); a vCPU whose ring fills stops to harvest its own (0 otherwise)",
      "int = 0", unit="count"),
    V("throttle_percent", U32, "auto_converge: the throttle set for the round, the share of "
      "each vCPU's time it takes from the guest (0: none). The setting, not a measure: the "
      "vCPUs' sleeps are VcpuStats.throttled_seconds", "int = 0", unit="%"),
))

_UNTRACKED = " (\"tracked\")"
RESULT = Struct("result", "Result", "One experiment.", (
    V("config", None, "the Config the run ran", "Config"),
    V("threads_start_ns", U64, "demand_paging_test's window begins: the vCPU threads' "
      "creation (CLOCK_MONOTONIC)", unit="ns"),
    V("threads_joined_ns", U64, "... and ends: all of them joined (CLOCK_MONOTONIC)",
      unit="ns"),
    V("start_ns", U64, "the first KVM_RUN of any vCPU (CLOCK_MONOTONIC)", unit="ns"),
    V("end_ns", U64, "the last vCPU done (CLOCK_MONOTONIC)", unit="ns"),
    V("seconds", None, "demand_paging_test's \"Total guest execution time\": from just "
      "before the first vCPU thread is created to just after the last one is joined (with "
      "guest_timing, the guest's clock-sync exits before and after its walk fall inside)",
      "float", unit="s"),
    V("kvm_run_seconds", None, "the narrower window: the first KVM_RUN of any vCPU to the "
      "last vCPU reporting done (thread start-up and joining left out)",
      "float | None = None", unit="s"),
    V("startup_seconds", None, "the first vCPU thread's creation to the first KVM_RUN of "
      "any vCPU (a migration's destination: its vCPUs' start, in the downtime)",
      "float | None = None", unit="s"),
    V("pass_seconds", None, "for each pass, first vCPU starting it to last vCPU ending it",
      "tuple[float, ...] = ()", unit="s"),
    V("paging_rate", None, "pages/s as upstream's demand_paging_test computes it: "
      "pages_per_vcpu * vcpus / seconds; with passes > 1, over the first pass (the one that "
      "demand-pages): from the threads' creation to the last vCPU ending that pass",
      "float"),
    V("pages_per_vcpu", U64, "4 KiB pages each vCPU's part of the region holds", "int",
      unit="pages"),
    V("region_bytes", U64, "the test region's size", unit="bytes"),
    V("page_size", U64, "the unit faults are resolved in, bytes", "int", unit="bytes"),
    V("region_gpa", U64, "the guest physical address where the test region starts "
      "(fault_trace's gpa less this is the offset into the region); None in JSON from "
      "before uffdkvm recorded it", "int | None = None"),
    V("passes", U32, "walks of the region per vCPU", unit="count"),
    V("stats_full", "bool", "the run kept stats=\"full\" (timestamps per fault)"),
    V("blocktime_ns", U64, "time during which every vCPU had a fault outstanding at once "
      "(QEMU's postcopy-blocktime), with each fault's span as in "
      "VcpuStats.blocked_seconds; None with stats=\"basic\"", "float | None = None",
      unit="s", measured="full"),
    V("tsc_khz", U64, "the guest TSC's frequency, for guest_timing"),
    V("clock_sync", "enum ukvm_clock_sync", "guest_timing with stats=\"full\": how the "
      "guest's TSC stamps were put on the readers' clock (CLOCK_MONOTONIC): "
      "\"kvm_tsc_offset\" (KVM's offset, confirmed by the guest's clock-sync exits before "
      "and after the walk) or \"sync_exits\" (the exits' bracket alone); None where they "
      "could not be (clock_sync_message says why): then queue, resume and fault latencies "
      "are None too, and blocked time falls back to read -> resolved",
      "str | None = None"),
    V("clock_error_ns", U64, "a bound on that conversion's error, ns (None with it)",
      "float | None = None", unit="ns"),
    V("clock_sync_message", "char[320]", "why clock_sync is None where guest_timing with "
      "stats=\"full\" asked for the conversion: KVM's TSC offset moved during the run (as "
      "KVM moves it where the host kernel marked its TSC unstable, e.g. Debian's 6.1 booted "
      "nested), the sync exits before and after the walk bracket no one offset, or the "
      "guest's TSC ran at another rate than the host's; None where clock_sync is set, where "
      "no conversion was asked for, and in JSON from before uffdkvm recorded it",
      "str | None = None"),
    V("misordered_faults", U64, "faults whose stamps contradict the readers' clock (raised "
      "after the read, or resumed before it), left out of the stages: 0 when the clocks "
      "agree (None without a conversion)", "int | None = None", unit="count",
      measured="staged"),
    V("nr_fault_trace", U64, "fault_trace's records", to_py=None),
    V("fault_trace", "struct ukvm_fault_record *", "trace_faults: every fault (FaultTrace), "
      "by start time, else None",
      "FaultTrace | None = field(default=None, repr=False)", to_py="FAULT_TRACE"),
    V("uffds", U32, "the run's userfaultfds", "int", unit="count"),
    V("faults", U64, "faults resolved by all readers (EEXIST not counted; see ``eexist`` "
      "for those); with uffd_mode=\"wp\", write-protect faults: one per page the guest "
      "writes (write_percent), none for pages it only reads", "int", unit="count"),
    V("eexist", U64, "fault messages the readers found already resolved (not in faults), "
      "every reader's", "int = 0", unit="count"),
    V("spurious_wakeups", U64, "every reader's wakeups that found nothing to read",
      "int = 0", unit="count"),
    V("wakes", U64, "UFFDIO_WAKEs after EEXIST, every reader's (ReaderStats.wakes): a "
      "failed ioctl wakes nobody, and a prefetched page comes without a wake; in JSON of "
      "schema 3, which named it prefetch_wakes, None where pages were not tracked",
      "int | None = None", unit="count"),
    V("source_bytes", U64, "bytes fetched from the page source: every reader's, and the "
      "prefetch pusher's (pusher_source_bytes)", "int = 0", unit="bytes"),
    V("source_ns", U64, "time spent fetching from the page source, over every reader "
      "(stats=\"full\", a source other than \"synthetic\"), else None",
      "float | None = None", unit="s", measured="timed_source_read"),
    V("nr_vcpus", U32, "vcpus' length", to_py=None),
    V("vcpus", "struct ukvm_vcpu_result *", "one VcpuStats per vCPU, by index",
      "tuple[VcpuStats, ...]", to_py="VCPUS"),
    V("nr_readers", U32, "readers' length", to_py=None),
    V("readers", "struct ukvm_reader_result *", "one ReaderStats per reader thread, uffd "
      "by uffd", "tuple[ReaderStats, ...]", to_py="READERS"),
    V("reader_cpus", None, "the reader pins the core was handed (Config.reader_cpus as the "
      "run had it: reader k of all uffds, a uffd's readers together, on entry k modulo the "
      "length), or None: the readers ran where the scheduler put them (and in JSON from "
      "before uffdkvm recorded it: unknown there, see readers_with_vcpus)",
      "tuple[int, ...] | None = None"),
    V("readers_with_vcpus", None, "whether each reader ran on the CPU of the vCPU it serves "
      "(Config.readers_with_vcpus as the run had it: pin_readers=\"vcpus\", or the default "
      "pin_readers=None with pinned vCPUs and readers that share CPUs: every wait but "
      "\"spin\"); False for a CPU list, \"scheduler\" and runs without readers. None in "
      "JSON from before uffdkvm recorded it, when pin_readers=None left the readers to the "
      "scheduler: the Config's property would misread those runs", "bool | None = None"),
    V("reader_wait", None, "how the readers waited, as the core was handed it "
      "(Config.reader_wait as the run had it: wait, or for the default wait=None "
      "\"spin_idle\" beside pinned vCPUs, else \"epoll_exclusive\"); None for a run without "
      "readers (uffd_mode None, resolver \"vcpu\") and in JSON from before uffdkvm recorded "
      "it", "str | None = None"),
    V("nr_kvm_stats", U32, "kvm_stats' length", to_py=None),
    V("kvm_stat_names", "char **", "the kernel's names of kvm_stats", to_py=None),
    V("kvm_stats", "uint64_t *", "KVM's VM-wide statistics over the run, like VcpuStats': "
      "cumulative ones as deltas, instant and peak ones at the end (empty where the kernel "
      "has no KVM_GET_STATS_FD)",
      "dict[str, int] = field(default_factory=dict, repr=False, hash=False)",
      to_py="KVM_STATS"),
    V("nr_vcpu_stats", U32, "each vCPU's kvm_stats' length", to_py=None),
    V("vcpu_stat_names", "char **", "the kernel's names of each vCPU's kvm_stats",
      to_py=None),
    V("dirty_pages", U64, "wp_async: the pages PAGEMAP_SCAN found written (their uffd-wp "
      "bit cleared by the kernel on the first write); verification checks they are exactly "
      "the pages the guest wrote. None otherwise", "int | None = None", unit="pages",
      measured="wp_async"),
    V("nr_dirty_passes", U32, "dirty_passes' length", to_py=None),
    V("dirty_passes", "struct ukvm_dirty_pass *", "dirty_tracking: one DirtyPass per pass "
      "after the first (the tracked ones), else empty", "tuple[DirtyPass, ...] = ()",
      to_py="DIRTY_PASSES"),
    V("dirty_enable_ns", U64, "dirty_tracking: turning it on after pass 1 "
      "(KVM_MEM_LOG_DIRTY_PAGES set on the region's memslot; wp_async: UFFDIO_WRITEPROTECT "
      "of the region), as dirty_log_perf_test's \"Enabling dirty logging time\"; None "
      "without tracking", "float | None = None", unit="s", measured="dirty_tracking"),
    V("dirty_disable_ns", U64, "dirty_tracking: turning it off after the last pass, as "
      "dirty_log_perf_test's \"Disabling dirty logging time\"; None without tracking",
      "float | None = None", unit="s", measured="dirty_tracking"),
    V("nr_migration_rounds", U32, "migration_rounds' length", to_py=None),
    V("migration_rounds", "struct ukvm_migration_round *", "migration (the source side, "
      "docs/migration.md): one MigrationRound per pre-copy round, else empty",
      "tuple[MigrationRound, ...] = ()", to_py="MIGRATION_ROUNDS"),
    V("migration_converged", "bool", "migration: precopy's rounds ended because the last "
      "one's dirty set fit downtime_target_ms on the link (not at max_rounds); False for "
      "postcopy and hybrid; else None", "bool | None = None", measured="migration"),
    V("migration_start_ns", U64, "migration: round 1 began, after pass 1 (CLOCK_MONOTONIC)",
      unit="ns"),
    V("migration_stop_ns", U64, "migration: the last source vCPU stopped, at the end of "
      "pass `passes` (CLOCK_MONOTONIC)", unit="ns"),
    V("precopy_seconds", None, "migration: round 1's start to the source's stop (the last "
      "vCPU at the end of its pass); 0.0 for postcopy", "float | None = None", unit="s",
      measured="migration"),
    V("stopcopy_pages", U64, "migration: 4 KiB pages sent with the vCPUs stopped",
      "int | None = None", unit="pages", measured="migration"),
    V("stopcopy_ns", U64, "migration: the stop to the last stop-copy page on the link, the "
      "final harvest included (the source's share of the downtime; the link's latency is "
      "not in it)", "float | None = None", unit="s", measured="migration"),
    V("postcopy_pages", U64, "migration: 4 KiB pages the destination does not hold at the "
      "stop (never sent, or written since): post-copy's", "int | None = None",
      unit="pages", measured="migration"),
    V("precopy_pages", U64, "migration: 4 KiB pages sent while the vCPUs ran (all rounds)",
      "int | None = None", unit="pages", measured="migration"),
    V("nr_migrated_pages", U64, "migrated_pages' length", to_py=None),
    V("migrated_pages", "uint32_t *", "migration: the 4 KiB pages (indices from the "
      "region's start) the destination holds at the stop, each compared byte for byte with "
      "the source's then, ascending", "tuple[int, ...] = field(default=(), repr=False)",
      to_py="MIGRATED_PAGES"),
    V("source", "enum ukvm_source_kind", "the page source that ran, as the core reports it "
      "(\"synthetic\" in older JSON)", "str = \"synthetic\""),
    V("source_cached_pages_at_start", U64, "source=\"file\": the file's pages in the page "
      "cache as the vCPUs started, counted with mincore() (0 with source_cache=\"cold\"; "
      "the whole region's pages with \"warm\"), else None", "int | None = None",
      unit="pages", measured="source_file"),
    V("page_server", None, "source=\"remote\": the page server's own counters after the run "
      "(requests, urgent and background, bytes, queue time beyond its latency), else None",
      "PageServerStats | None = None"),
    V("touched_pages", U64, "the distinct 4 KiB pages the guest touched, all vCPUs: the "
      "region's pages, or fewer with touch_percent < 100 or access=\"zipf\" (each fault "
      "resolves one, or the huge page around it)", "int | None = None", unit="pages"),
    V("guest_accesses", U64, "the guest's page accesses, all vCPUs and passes (with "
      "access=\"zipf\", hot pages count once per visit)", "int | None = None",
      unit="count"),
    V("page_visits", "uint32_t *", "trace_faults with touch_percent < 100 or "
      "access=\"zipf\": the accesses in one pass to each 4 KiB page of the region, all "
      "vCPUs together (0: never touched); verification checks them against the guest's own "
      "count of writes to each page it writes. Else None",
      "tuple[int, ...] | None = field(default=None, repr=False)", unit="count",
      to_py="PAGE_VISITS"),
    V("nr_page_visits", U64, "page_visits' length", to_py=None),
    V("resident_tracked", "bool", "which pages went in how is known: uffd_mode=\"missing\" "
      "with resolve=\"copy\" (the condition \"tracked\")"),
    V("prefetched_pages", U64, "pages installed by prefetch (readahead and the pusher); None "
      "where pages are not tracked (uffd_mode other than \"missing\", resolve other than "
      "\"copy\", prefault)", "int | None = None", unit="pages", measured="tracked"),
    V("preinstalled_pages", U64, "Config.preinstall: the pages put in from the page "
      "source's local copy before the vCPU threads started (a migration's pre-copied "
      "pages: they never fault); None where no resident map was kept", "int | None = None",
      unit="pages", measured="tracked"),
    V("preinstall_ns", U64, "Config.preinstall: the time putting those pages in took "
      "(outside every window above, and demand_paging_test's); None where no resident map "
      "was kept", "float | None = None", unit="s", measured="tracked"),
    V("wasted_prefetch_pages", U64, "prefetched pages the guest never touches",
      "int | None = None", unit="pages", measured="tracked"),
    V("touched_units", U64, "pages of page_size the guest touches (any 4 KiB of them)",
      unit="pages"),
    V("faulted_pages", U64, "pages (of page_size) a vCPU faulted on and waited for, whoever "
      "installed them: a fault whose page prefetch installed while the vCPU waited (counted "
      "in eexist, not in faults) is one, as it is a stall; None where pages are not "
      "tracked", "int | None = None", unit="pages", measured="tracked"),
    V("faults_avoided", U64, "the pages the guest touches less faulted_pages: those no vCPU "
      "waited for, since prefetch had installed them before the guest touched them (the "
      "same run without prefetch faults once per page touched)", "int | None = None",
      unit="pages", measured="tracked"),
    V("resident_ns", U64, "from the first vCPU's start until every page of the region was "
      "resident (faulted or prefetched), as the thread that installed the last one stamped "
      "it after its ioctl returned (so a descheduled installer stamps it late, even after "
      "the vCPUs finished); None if that never happened, where pages are not tracked, or "
      "with stats=\"basic\" (which reads no clock per fault)",
      "float | None = None", unit="s", measured="tracked"),
    V("pushed_pages", U64, "of prefetched_pages, the ones the pusher installed (background, "
      "replay)", "int | None = None", unit="pages", measured="tracked"),
    V("pusher_eexist", U64, "the pusher's installs that found the page there", unit="count"),
    V("prefetch_eexist", U64, "prefetch copies that found the page there already (the "
      "readers' readahead and the pusher's): races counted, not errors",
      "int | None = None", unit="count", measured="tracked"),
    V("pusher_source_bytes", U64, "prefetch background or replay: bytes the pusher fetched "
      "from the page source, over a connection of its own (counted in source_bytes, not in "
      "any reader's); 0 otherwise and in older JSON", "int = 0", unit="bytes"),
    V("nr_touch_order", U64, "touch_order's length", to_py=None),
    V("touch_order", "uint32_t *", "with Config.record_touch_order=True "
      "(uffd_mode=\"missing\" with resolve=\"copy\"): the pages faults installed, in the "
      "order they were resolved (first installs only, EEXIST ones left out), as page "
      "indices: pages of page_size counted from the region's start. What replay prefetch "
      "(Config.replay_from) takes; save_touch_order writes it. Empty elsewhere",
      "tuple[int, ...] = field(default=(), repr=False)", to_py="TOUCH_ORDER"),
    V("verified", "bool", "every page of the region held what it must after the run, and "
      "every vCPU touched and read what it should have", "bool"),
    V("contents_verified", "bool", "whether verified compared the pages' bytes: False for "
      "source=\"remote\" with source_address and no local copy (source_path), when only "
      "the counts (every fault resolved once, every page touched) were checked, not the "
      "bytes the server sent", "bool = True"),
    V("bad_pages", U64, "pages that did not (0 when verified)", "int", unit="pages"),
    V("verify_message", "char[256]", "the first problem found, or \"\" when verified",
      "str"),
    V("host", None, "the machine it ran on (None for a Result made by hand)",
      "HostInfo | None = field(default=None, repr=False)"),
))

#: Every result struct, the run's last (it refers to the others).
STRUCTS = (FAULT_RECORD, VCPU_RESULT, READER_RESULT, DIRTY_PASS, MIGRATION_ROUND, RESULT)
BY_PY = {s.py: s for s in STRUCTS}


def unmeasured(struct: str, measured: dict[str, bool]) -> tuple[str, ...]:
    """The fields of dataclass ``struct`` that a run did not measure, from
    which of CONDITIONS held for it (``measured``: each key, true or false)."""
    return tuple(v.py_name for v in BY_PY[struct].values
                 if v.measured and v.py_name and not measured[v.measured])


def _check() -> None:
    """What the emitters rely on, checked at import: names unique per
    struct, conditions and units known, durations named ``_ns``."""
    for s in STRUCTS:
        names = [v.name for v in s.values]
        dup = {n for n in names if names.count(n) > 1}
        assert not dup, f"{s.c}: {dup} declared twice"
        py = [v.py_name for v in s.values if v.py_name]
        assert len(py) == len(set(py)), f"{s.py}: two values give one field"
        for v in s.values:
            assert not v.measured or v.measured in CONDITIONS, f"{v.name}: {v.measured}"
            assert v.unit in UNITS, f"{v.name}: unit {v.unit!r}"
            if v.c is not None and v.unit == "s":
                assert v.name.endswith("_ns"), f"{v.name}: a duration in ns is named _ns"
            assert v.field is not None or v.c is not None, f"{v.name}: neither core nor field"
            v.conversion  # noqa: B018  (raises for a type without a conversion)


_check()
