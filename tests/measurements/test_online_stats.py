"""stats="full" without guest_timing: the statistics computed while the run
goes on (csrc/uffd/online.c), against the same run's fault trace.

With trace_faults=True the core still computes every statistic online (the
trace is only kept beside them), so one run gives both: the numbers the
core reports and the records they summarise. Each test recomputes, in
Python and without the core's code, each vCPU's faults, EEXISTs,
service_latency histogram bucket by bucket, blocked time and the VM's
blocktime (a sweep over the faults' start and end events), and compares.
The runs merge their events in many small drains while they run
(uffdkvm.testing._faults's "online_drain": a drain every few events), so the
watermarks and the waiting flags of every way of waiting are exercised,
not only the drain at the end. The C side of the merge (many producers,
random timings, some waiting) is tests/c/online_drain.c.
"""
import numpy as np
import pytest

import uffdkvm
from helpers.hostfacts import facts_for_run, host_skip
from helpers.skips import needs_io_uring, needs_test_hooks

pytestmark = pytest.mark.kvm

DRAIN_EVERY = 8  # events a resolver queues before it tries a drain

CONFIGS = {
    "1 vCPU": dict(vcpus=1, mem_per_vcpu="2M"),
    # two readers on each vCPU's uffd, both vCPUs on every page: EEXIST
    "overlap, 2 readers a uffd": dict(vcpus=2, mem_per_vcpu="2M", readers=2, overlap=True,
                                      delay_us=20, delay_dist="uniform", seed=3),
    "single_uffd, 4 readers": dict(vcpus=2, mem_per_vcpu="2M", single_uffd=True, readers=4,
                                   wait="poll", pattern="random", seed=5, delay_us=50,
                                   delay_dist="uniform"),
    "read, batch 4": dict(vcpus=2, mem_per_vcpu="2M", single_uffd=True, readers=2,
                          wait="read", read_batch=4),
    # counts, not timing: a spinner may share its CPU here
    "spin": dict(vcpus=2, mem_per_vcpu="2M", single_uffd=True, readers=1, wait="spin",
                 allow_oversubscribe=True),
    "io_uring": dict(vcpus=2, mem_per_vcpu="2M", single_uffd=True, readers=2, wait="io_uring"),
    'resolver="vcpu"': dict(vcpus=2, mem_per_vcpu="2M", resolver="vcpu"),
    "MINOR shmem": dict(vcpus=2, mem_per_vcpu="2M", uffd_mode="minor", backing="shmem",
                        readers=2),
}


def bucket(v):
    """The core's histogram bucket of v ns (csrc/base/hist.c, written again):
    exact below 16, then four linear sub-buckets per power of two."""
    if v < 16:
        return v
    msb = v.bit_length() - 1
    b = 16 + (msb - 4) * 4 + ((v >> (msb - 2)) & 3)
    return min(b, 159)


def sweep(events, nr_vcpus):
    """Each vCPU's blocked time and the time all were blocked at once, from
    (t, +1 start | -1 end, vcpu) events: in time order, ends first at one
    instant (touching faults do not overlap)."""
    depth = [0] * nr_vcpus
    since = [0] * nr_vcpus
    blocked_ns = [0] * nr_vcpus
    blocktime = 0
    blocked = 0
    last = None
    for t, delta, v in sorted(events):
        if blocked == nr_vcpus and last is not None:
            blocktime += t - last
        last = t
        if delta > 0:
            if depth[v] == 0:
                since[v] = t
                blocked += 1
            depth[v] += 1
        elif depth[v]:
            depth[v] -= 1
            if depth[v] == 0:
                blocked_ns[v] += t - since[v]
                blocked -= 1
    return blocked_ns, blocktime


def traced_run(fields, fault="online_drain"):
    needs_test_hooks("makes the online statistics drain every few events")
    from uffdkvm.testing._faults import run_with_fault

    if fields.get("wait") == "io_uring":
        needs_io_uring()
    cfg = dict(stats="full", trace_faults=True, **fields)
    try:
        r = run_with_fault(**cfg, fault=fault, after=DRAIN_EVERY)
    except uffdkvm.HostUnsupportedError as e:
        host_skip(facts_for_run(**cfg), f"this host cannot: {e}")
    assert r.verified, r.verify_message
    return r


def mismatches(r):
    """Where the core's statistics and the trace's recomputation differ."""
    t = r.fault_trace
    read = np.asarray(t.read_ns, dtype=np.int64)
    resolved = np.asarray(t.resolved_ns, dtype=np.int64)
    vcpu = np.asarray(t.vcpu, dtype=np.int64)
    eexist = np.asarray(t.eexist, dtype=bool)
    out = []
    events = []
    for i in range(len(read)):
        # a span of no time blocks for none: no events, as in the core's sweep
        if vcpu[i] >= 0 and resolved[i] != read[i]:
            events.append((int(read[i]), +1, int(vcpu[i])))
            events.append((int(resolved[i]), -1, int(vcpu[i])))
    blocked_ns, blocktime = sweep(events, len(r.vcpus))
    for v in r.vcpus:
        mine = vcpu == v.index
        if v.faults != int(np.sum(mine & ~eexist)):
            out.append((v.index, "faults", v.faults, int(np.sum(mine & ~eexist))))
        if v.eexist != int(np.sum(mine & eexist)):
            out.append((v.index, "eexist", v.eexist, int(np.sum(mine & eexist))))
        want = [0] * len(v.service_latency.counts)
        for s in (resolved[mine] - read[mine]).tolist():
            want[bucket(s)] += 1
        if list(v.service_latency.counts) != want:
            out.append((v.index, "service_latency", list(v.service_latency.counts), want))
        if round(v.blocked_seconds * 1e9) != blocked_ns[v.index]:
            out.append((v.index, "blocked_ns", round(v.blocked_seconds * 1e9),
                        blocked_ns[v.index]))
    if round(r.blocktime_seconds * 1e9) != blocktime:
        out.append(("vm", "blocktime_ns", round(r.blocktime_seconds * 1e9), blocktime))
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_online_statistics_equal_the_traces(kvm, name):
    r = traced_run(CONFIGS[name])
    assert len(r.fault_trace.read_ns) == r.faults + r.eexist
    assert mismatches(r) == []
    if "overlap" in name:
        assert r.eexist > 0, "both vCPUs faulted on a page at once somewhere"
    if "delay_us" in CONFIGS[name]:
        assert r.blocktime_seconds > 0, "with delays, the vCPUs waited at once at some point"


def test_a_merge_that_leaves_a_queue_out_is_caught(kvm):
    """The same comparison fails when every drain leaves the last resolver's
    events out: the check can fail."""
    r = traced_run(CONFIGS["single_uffd, 4 readers"], fault="online_skip_queue")
    assert any(m[1] in ("blocked_ns", "blocktime_ns") for m in mismatches(r))


def test_untraced_online_run_keeps_the_same_counts(kvm):
    """Without the trace: the same counts (one fault per page, none twice),
    and the run verifies (pages_not_once 0, from the online bitmaps)."""
    r = uffdkvm.run(stats="full", vcpus=2, mem_per_vcpu="2M", readers=2)
    assert r.verified, r.verify_message
    assert r.fault_trace is None
    assert sum(v.faults for v in r.vcpus) == r.faults == 2 * 512
    for v in r.vcpus:
        assert v.service_latency.count == v.faults + v.eexist
        assert v.blocked_seconds > 0
