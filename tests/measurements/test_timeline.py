"""A fault's whole timeline (guest_timing): the guest's own stamps of each
access, raised and resumed, put on the readers' clock, so that every fault
splits into queue (raised -> read), service (read -> page arrived) and resume
(-> the access completed).

What proves the stamps right is not their sum (the stages partition the stall
by construction) but order against an independent clock: every reader's
read() of a fault message happens after the guest raised that fault and
before the guest's access completed. A guest clock converted with the wrong
offset puts reads outside that window; one converted at the wrong rate
disagrees with the guest's own measurement of each access. Where no one
offset exists (KVM moves it on a host whose TSC is unstable), the run must
say so and give no stage: guest_clock_converted() (helpers/guest_clock.py) asserts which
this host must get, against the host fact's own reading of KVM's offset.
"""
import re
import statistics

import numpy as np
import pytest

import uffdkvm

from helpers.guest_clock import guest_clock_converted, no_stages
from helpers.hostfacts import NO_KVM_TSC_OFFSET, NO_STEADY_KVM_TSC_OFFSET, facts_for_run, host_skip
from helpers.runs import run_or_skip, run_with_fault, small

TIMED = dict(vcpus=2, mem_per_vcpu="8M", guest_timing=True, trace_faults=True)
PAGES = 2 * 8 * 256
SYNC_EXITS = 2 * 16  # each vCPU's clock-sync exits, before and after its walk


def check_timeline(r, error_ns=None, huge=False):
    """Every fault of r sits inside the guest's own stall, and the stage
    histograms say what the trace says; or, on a host that allows no
    conversion, r says why and has no stage."""
    assert r.verified, r.verify_message
    if not guest_clock_converted(r):
        return
    t = r.fault_trace
    raised = np.array(t.raised_ns, dtype=np.int64)
    read = np.array(t.read_ns, dtype=np.int64)
    resolved = np.array(t.resolved_ns, dtype=np.int64)
    resumed = np.array(t.resumed_ns, dtype=np.int64)
    slack = error_ns if error_ns is not None else r.clock_error_ns
    assert r.misordered_faults == 0
    # The read of each message falls inside the stall the guest timed itself.
    assert (raised < read + slack).all()
    assert (read < resumed + slack).all()
    assert (read <= resolved).all()

    f = r.faults_frame()
    arrived = np.minimum(resolved, resumed)
    assert (f["queue_ns"].to_numpy(dtype=np.int64) == read - raised).all()
    assert (f["service_ns"].to_numpy(dtype=np.int64) == arrived - read).all()
    assert (f["resume_ns"].to_numpy(dtype=np.int64) == resumed - arrived).all()
    for v in r.vcpus:
        mine = f[f["vcpu"] == v.index]
        for name in ("queue", "service", "resume", "fault"):
            h = getattr(v, f"{name}_latency")
            assert h.count == len(mine) == v.faults
            assert h.sum == mine[f"{name}_ns"].sum()
        if huge:
            continue
        # With 4 KiB pages and one pass every access faults, so the guest's
        # own histogram of its accesses (cycles, converted with KVM's TSC
        # frequency) times the same stalls as raised -> resumed (converted
        # with the host clock's measured rate).
        assert v.access_latency.count == v.fault_latency.count == PAGES // 2
        assert v.fault_latency.sum == pytest.approx(v.access_latency.sum, rel=1e-3)
    for x in r.readers:
        mine = f[(f["uffd"] == x.uffd) & (f["reader"] == x.index)]
        assert x.queue_latency.count == len(mine) == x.faults + x.eexist
        assert x.queue_latency.sum == mine["queue_ns"].sum()


def test_every_fault_read_falls_inside_the_guests_own_stall(kvm):
    r = small(**TIMED)
    if not guest_clock_converted(r):
        return
    assert r.clock_sync == "kvm_tsc_offset"
    assert 0 < r.clock_error_ns < 1000
    check_timeline(r)
    # The stages are real durations here: delivery and the vCPU's return
    # cost microseconds on any host.
    assert r.queue_latency.percentile(50) > 1000
    assert r.resume_latency.percentile(50) > 1000


def test_a_guest_tsc_far_ahead_of_the_hosts_is_converted(kvm):
    """KVM reports the offset between guest and host TSC; shift it by ~6
    minutes and nothing may change: the conversion must use it."""
    cfg = uffdkvm.Config(**TIMED)
    r = run_with_fault(cfg, "tsc_offset", after=10**12)
    if not guest_clock_converted(r):
        return
    assert r.clock_sync == "kvm_tsc_offset"
    check_timeline(r)
    assert r.queue_latency.percentile(50) < 1_000_000


def test_without_kvms_offset_the_sync_exits_bracket_it(kvm):
    """Where KVM does not report its offset, the guest's clock-sync exits
    bracket it: less exact (the error bound says by how much), still right
    where the offset held still. Where KVM moves it (the host's TSC is
    unstable), nothing but KVM's own offset shows the moves, which are
    narrower than a sync exit's bracket: with it withheld, as by a KVM
    before Linux 5.16, the brackets may still meet, and then the conversion
    stands on them (docs/measurements.md). That is the limit this test pins
    there: the brackets' verdict, whichever it is."""
    r = run_with_fault(uffdkvm.Config(**TIMED), "no_kvm_tsc_offset", after=1)
    if NO_STEADY_KVM_TSC_OFFSET.holds and r.clock_sync is None:
        no_stages(r, "the clock-sync exits of vCPU ")
        return
    assert r.verified, r.verify_message
    assert r.clock_sync == "sync_exits" and r.clock_sync_message is None
    assert 0 < r.clock_error_ns < 200_000
    if NO_STEADY_KVM_TSC_OFFSET.holds:
        assert r.misordered_faults is not None
        return
    check_timeline(r)


def test_a_kvm_offset_that_moves_gives_no_stages_and_says_why(kvm):
    """Where the host's TSC is unstable KVM rewrites each vCPU's offset
    whenever it loads the vCPU, by less than a sync exit's bracket is wide:
    the brackets before and after the walk still meet, and only KVM's
    offset, read at every sync exit and after the run, shows it moving.
    Injected here on any host: each reading of it 10^6 cycles on from the
    one before (the guest's TSC left alone). No conversion, no stages, and
    the reason, with what was read."""
    if NO_KVM_TSC_OFFSET.holds:
        host_skip(NO_KVM_TSC_OFFSET, "the injection moves the offset KVM reports")
    step = 10**6
    r = run_with_fault(uffdkvm.Config(**TIMED), "tsc_offset_moves", after=step)
    no_stages(r, "KVM's TSC offset of vCPU 0 moved during the run")
    m = re.search(r"KVM_VCPU_TSC_OFFSET read (\d+) times, .*: (\d+) changes, (\d+) cycles "
                  r"apart\), as KVM moves it where the host kernel marked its TSC unstable",
                  r.clock_sync_message)
    assert m, r.clock_sync_message
    reads, changes, spread = map(int, m.groups())
    assert (reads, changes) == (SYNC_EXITS + 1, SYNC_EXITS)
    if not NO_STEADY_KVM_TSC_OFFSET.holds:
        assert spread == SYNC_EXITS * step
    for v in r.vcpus:
        assert v.access_latency.count == PAGES // 2  # the guest's own view still holds
    # Blocked time falls back to the readers' own span, read to resolved.
    t = r.fault_trace
    for v in r.vcpus:
        spans = [(a, b) for vcpu, a, b in zip(t.vcpu, t.read_ns, t.resolved_ns, strict=True)
                 if vcpu == v.index]
        assert v.blocked_seconds * 1e9 == pytest.approx(union(spans), abs=2)
    assert str(r).count(f"none, no stages: {r.clock_sync_message}") == 1


def test_stages_hold_with_every_reader_layout(kvm):
    for fields in (dict(single_uffd=True, readers=4, wait="poll"),
                   dict(uffd_mode="minor", backing="shmem", readers=2),
                   dict(delay_us=50, delay_dist="exponential")):
        check_timeline(small(**TIMED, **fields))


def test_a_delay_lands_in_service_not_in_queue_or_resume(kvm):
    """delay_us is spent by the reader between read and resolve: it must
    move the service stage by about that much and leave the others alone."""
    base = small(**TIMED)
    delayed = small(**TIMED, delay_us=300)
    service = delayed.service_latency.percentile(50) - base.service_latency.percentile(50)
    assert 250_000 < service < 600_000
    if not guest_clock_converted(delayed):
        return
    assert delayed.queue_latency.percentile(50) < 250_000
    assert delayed.resume_latency.percentile(50) < 250_000


def union(intervals):
    """The length of the union of (start, end) intervals, by brute force."""
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def test_blocked_time_spans_raised_to_resumed(kvm):
    """With the guest's stamps a vCPU is blocked from raising a fault to
    completing the access: recompute the union of those spans by brute force.
    Where the stamps are on no clock, from the read to the resolve."""
    r = small(**TIMED, single_uffd=True, readers=1, delay_us=100)
    t = r.fault_trace
    converted = guest_clock_converted(r)
    ends = (t.raised_ns, t.resumed_ns) if converted else (t.read_ns, t.resolved_ns)
    spans = {}
    for vcpu, a, b in zip(t.vcpu, *ends, strict=True):
        spans.setdefault(vcpu, []).append((a, b))

    for v in r.vcpus:
        assert v.blocked_seconds * 1e9 == pytest.approx(union(spans[v.index]), abs=2)
    # Blocktime: the instants at which both vCPUs were blocked.
    events = sorted([(a, 1, v) for v, s in spans.items() for a, _ in s] +
                    [(b, -1, v) for v, s in spans.items() for _, b in s],
                    key=lambda e: (e[0], e[1]))
    depth, both, since = {0: 0, 1: 0}, 0, None
    for when, delta, v in events:
        before = all(depth.values())
        depth[v] += delta
        after = all(depth.values())
        if after and not before:
            since = when
        elif before and not after:
            both += when - since
    # The one reader has one fault in hand at a time: read to resolved, no
    # two vCPUs are blocked at once; raised to resumed, they are.
    assert (r.blocktime_seconds > 0) == converted
    assert r.blocktime_seconds * 1e9 == pytest.approx(both, abs=2)


def test_without_guest_timing_only_service_is_known(kvm):
    r = small(vcpus=2, mem_per_vcpu="8M", trace_faults=True)
    assert r.clock_sync is None and r.misordered_faults is None
    for v in r.vcpus:
        assert v.service_latency.count == v.faults
        assert v.queue_latency is v.resume_latency is v.fault_latency is None
    for x in r.readers:
        assert x.queue_latency is None and x.service_latency.count == x.faults + x.eexist
    assert set(r.fault_trace.raised_ns) == {None} == set(r.fault_trace.resumed_ns)
    f = r.faults_frame()
    assert f["queue_ns"].isna().all() and not f["service_ns"].isna().any()


def test_guest_timing_with_basic_stats_keeps_only_the_guests_histogram(kvm):
    r = small(vcpus=2, mem_per_vcpu="8M", guest_timing=True, stats="basic")
    for v in r.vcpus:
        assert v.access_latency.count == PAGES // 2
        assert v.queue_latency is v.service_latency is v.fault_latency is None


def test_the_poll_herd_shows_in_queue(kvm):
    """One uffd, 64 readers: poll wakes every reader for every fault, and the
    one that gets it waits its turn behind the others (this host has two
    CPUs). The wait is between the fault and the read: queue, which the
    readers' own timestamps cannot see. (With 32 readers the herd's share of
    the queue was 2x here but once only 1.05x in CI, where a cross-CPU wakeup
    of ~30 us dwarfed it; 64 readers double the herd, and the medians of
    three interleaved runs each keep one slow run from deciding.)"""
    fields = dict(vcpus=2, mem_per_vcpu="4M", single_uffd=True, readers=64,
                  guest_timing=True)
    if not guest_clock_converted(small(**fields, wait="poll")):
        return
    queue = {"poll": [], "epoll_exclusive": []}
    for _ in range(3):
        for wait in queue:
            queue[wait].append(small(**fields, wait=wait).queue_latency.percentile(50))
    assert statistics.median(queue["poll"]) > 1.5 * statistics.median(queue["epoll_exclusive"]), queue


@pytest.mark.parametrize("backing,mode", [("anonymous_thp", "missing"),
                                          ("anonymous_hugetlb", "missing"),
                                          ("shared_hugetlb", "minor")])
def test_huge_page_faults_take_the_stamps_of_their_first_touch(kvm, hugepages, backing, mode):
    """Walking backwards, the guest first touches a 2 MiB page at its last
    4 KiB: the fault is that access, not one 511 accesses later. The trace
    names the 4 KiB page touched (hugetlb needs UFFD_FEATURE_EXACT_ADDRESS
    for that, which the core asks for), and every fault gets its stages."""
    r = run_or_skip(vcpus=2, mem_per_vcpu="8M", backing=backing, uffd_mode=mode,
                    pattern="reverse", readers=2, guest_timing=True, trace_faults=True)
    assert r.faults == 8
    assert {gpa % (2 << 20) for gpa in r.fault_trace.gpa} == {(2 << 20) - 4096}
    check_timeline(r, huge=True)


def test_a_guest_clock_that_moves_during_the_run_gives_no_stages(kvm):
    """The sync exits after the walk must bracket the same offset as those
    before it. Where the guest's TSC has moved meanwhile (here it reads 10^9
    cycles on after the walk: KVM may rewrite the offset on a host whose TSC
    it finds unstable), no stamp can be trusted: no conversion, no stages,
    and blocked time falls back to the readers' own span."""
    r = run_with_fault(uffdkvm.Config(**TIMED), "tsc_jump", after=10**9)
    # Where KVM's offset moves too, that is found first.
    no_stages(r, "KVM's TSC offset of vCPU 0 moved" if NO_STEADY_KVM_TSC_OFFSET.holds else
              "the clock-sync exits of vCPU 0 before and after its walk bracket no one offset")
    for v in r.vcpus:
        assert v.access_latency.count == PAGES // 2  # the guest's own view still holds


@pytest.mark.parametrize("backing,mode", [("anonymous_hugetlb", "missing"),
                                          ("shared_hugetlb", "minor")])
def test_hugetlb_faults_named_by_their_huge_page_still_take_their_stamps(kvm, hugepages,
                                                                         backing, mode):
    """A kernel without UFFD_FEATURE_EXACT_ADDRESS (Linux < 5.18; injected
    here) names a hugetlb fault by its huge page's start. The fault is still
    the guest's first touch of that huge page (the last 4 KiB of it, walking
    backwards), not its later access to the start."""
    cfg = uffdkvm.Config(vcpus=2, mem_per_vcpu="8M", backing=backing, uffd_mode=mode,
                         pattern="reverse", readers=2, guest_timing=True, trace_faults=True)
    try:
        r = run_with_fault(cfg, "no_exact_address", after=1)
    except uffdkvm.HostUnsupportedError as e:
        host_skip(facts_for_run(**cfg.to_dict()), str(e))
    assert r.faults == 8
    assert {gpa % (2 << 20) for gpa in r.fault_trace.gpa} == {0}
    check_timeline(r, huge=True)


def test_overlap_stalls_ended_by_another_vcpus_fault_are_not_clock_errors(kvm):
    """With overlap, vCPUs fault on the same pages: the first resolution
    wakes every vCPU waiting on the page, and the others' messages (EEXIST)
    may be read after their vCPUs resumed. That is the kernel's order, not a
    clock error: such a stall counts whole in fault_latency and has no
    queue, service or resume stage of its own, in the histograms and in
    faults_frame() alike."""
    for _ in range(30):  # a race: none in some runs here, up to 81 in others
        r = uffdkvm.run(vcpus=4, mem_per_vcpu="2M", overlap=True, readers=32, wait="epoll",
                        delay_us=20, guest_timing=True, trace_faults=True)
        assert r.verified, r.verify_message
        if not guest_clock_converted(r):
            return
        assert r.clock_sync is not None and r.eexist > 0
        t = r.fault_trace
        eexist = np.array(t.eexist, dtype=bool)
        raised = np.array(t.raised_ns, dtype=np.int64)
        read = np.array(t.read_ns, dtype=np.int64)
        resumed = np.array(t.resumed_ns, dtype=np.int64)
        late = resumed <= read
        if late.any():
            break
    assert late.any(), "no vCPU was woken by another's fault in 30 runs"
    assert r.misordered_faults == 0
    assert (eexist | ~late).all(), "only EEXIST messages may be read after their vCPU resumed"
    f = r.faults_frame()
    assert (f["woken"].to_numpy() == late).all()
    slack = r.clock_error_ns
    assert (raised < read + slack).all()
    assert (read[~late] < resumed[~late] + slack).all()
    for v in r.vcpus:
        mine = f[f["vcpu"] == v.index]
        for name in ("queue", "service", "resume", "fault"):
            h = getattr(v, f"{name}_latency")
            column = mine[f"{name}_ns"]
            assert h.count == column.notna().sum(), (v.index, name)
            assert h.sum == column.sum(), (v.index, name)
        assert v.fault_latency.count == len(mine)
        assert v.queue_latency.count == len(mine) - mine["woken"].sum()
