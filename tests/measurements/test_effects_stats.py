"""The statistics say what happened, checked against what they summarise.

Histograms against numpy on the raw trace, blocktime against a brute-force
sweep of the trace's intervals, attribution against the region's layout,
KVM's counters against the run's own work, and stats="basic" against what
its threads did (clock reads and allocations counted by an LD_PRELOAD shim).
"""
import dataclasses
import json
import os
import shutil
import subprocess
import typing

import numpy as np
import pytest

import uffdkvm
from helpers.children import ENV as CHILD_ENV
from helpers.children import python
from helpers.evidence import Trace, intersect, length, union
from helpers.runs import small
from uffdkvm.result import LATENCY_BOUNDS, ReaderStats, VcpuStats

pytestmark = pytest.mark.kvm

HERE = os.path.dirname(os.path.abspath(__file__))
MEM = "512K"
PAGES_PER_VCPU = 128


@pytest.fixture(scope="module")
def traced():
    """Two vCPUs on one uffd, two readers, uniform delays of 0-200 us (and
    the sleep's ~60 us of slack): service times spread over many buckets,
    faults of both vCPUs in flight at once, each vCPU's faults resolved by
    both readers. Two readers, not one: a fault spans read -> resolved here
    (no guest_timing), and one reader has one fault in hand at a time, so
    with one reader no two faults overlap and blocktime is 0."""
    r = small(vcpus=2, mem_per_vcpu=MEM, single_uffd=True, readers=2, wait="poll",
              delay_us=100, delay_dist="uniform", pattern="random", seed=4,
              trace_faults=True)
    if min(r.fault_trace.vcpu) < 0:
        pytest.skip("the kernel does not name the faulting thread (UFFD_FEATURE_THREAD_ID)")
    return r


def histogram_of(values):
    """The core's bucket counts, recomputed: bucket i holds [bounds[i], bounds[i+1]),
    the last one everything above."""
    index = np.searchsorted(np.asarray(LATENCY_BOUNDS), values, side="right") - 1
    index = np.clip(index, 0, len(LATENCY_BOUNDS) - 2)
    return np.bincount(index, minlength=len(LATENCY_BOUNDS) - 1)


def check_histogram(h, values):
    values = np.asarray(values, dtype=np.int64)
    assert h.count == len(values)
    assert h.sum == values.sum() and h.min == values.min() and h.max == values.max()
    assert list(h.counts) == histogram_of(values).tolist()
    # percentile(q) interpolates within the bucket that holds the value of
    # rank q% x count: numpy's "inverted_cdf" percentile (the smallest value
    # with at least q% at or below it). Numpy's default interpolates between
    # two samples, which in a sparse tail (p99 of 128 faults, one straggler)
    # can be far apart: not what a histogram estimates.
    for q in (1, 10, 25, 50, 75, 90, 99):
        want = float(np.percentile(values, q, method="inverted_cdf"))
        got = h.percentile(q)
        lo, hi = h.bounds[h.bucket_of(want)], h.bounds[h.bucket_of(want) + 1]
        assert lo <= got <= hi, (q, got, want, lo, hi)  # so |got - want| <= hi - lo


def test_reader_histograms_summarise_the_readers_faults(kvm, traced):
    t = Trace(traced.fault_trace)
    buckets = {traced.readers[0].service_latency.bucket_of(x) for x in t.service_ns}
    assert len(buckets) >= 6, "service times spread over many buckets"
    for x in traced.readers:
        mine = (t.uffd == x.uffd) & (t.reader == x.index)
        check_histogram(x.service_latency, t.service_ns[mine])
        assert x.busy_seconds == pytest.approx(t.service_ns[mine].sum() * 1e-9, abs=1e-9)


def test_vcpu_histograms_summarise_each_vcpus_faults(kvm, traced):
    t = Trace(traced.fault_trace)
    for v in traced.vcpus:
        check_histogram(v.service_latency, t.service_ns[t.vcpu == v.index])
    check_histogram(traced.service_latency, t.service_ns)


def test_faults_are_attributed_to_the_vcpu_whose_memory_they_hit(kvm, traced):
    """Partitioned memory: vCPU i walks [region + i * mem_per_vcpu, ...).
    The trace's vcpu comes from the kernel's thread id; the gpa from the
    fault address: both must name the same vCPU."""
    t = Trace(traced.fault_trace)
    slice_of_gpa = (t.gpa - t.gpa.min()) // traced.config.mem_per_vcpu
    assert t.vcpu.tolist() == slice_of_gpa.tolist()
    for v in traced.vcpus:
        assert v.faults == PAGES_PER_VCPU == int(np.sum(t.vcpu == v.index))
        assert v.service_latency.count == v.faults
        # Both readers served both vCPUs: attribution is not by reader.
        assert set(t.reader[t.vcpu == v.index].tolist()) == {0, 1}


def test_blocktime_is_the_time_every_vcpu_waited_at_once(kvm, traced):
    """QEMU's postcopy blocktime, recomputed by brute force: the union of
    each vCPU's fault intervals [read, resolved), intersected over vCPUs."""
    t = Trace(traced.fault_trace)
    per_vcpu = [union(t.of(t.vcpu == v.index)) for v in traced.vcpus]
    for v, spans in zip(traced.vcpus, per_vcpu):
        assert round(v.blocked_seconds * 1e9) == length(spans)
    all_blocked = per_vcpu[0]
    for spans in per_vcpu[1:]:
        all_blocked = intersect(all_blocked, spans)
    assert length(all_blocked) > 0, "the run must have had vCPUs waiting at once"
    assert round(traced.blocktime_seconds * 1e9) == length(all_blocked)


def test_untraced_stats_say_the_same_kinds_of_things(kvm, traced):
    """Without trace_faults no record is kept: the statistics are computed
    while the run goes on (online.c), as they are with trace_faults
    (tests/measurements/test_online_stats.py compares the two with the trace, number for
    number): the traced run's settings again, untraced,
    give every vCPU's faults (one per page of its own memory), EEXIST as
    the readers counted it, a service time for every message, blocked time
    and a blocktime no longer than any vCPU's blocked time."""
    fields = {k: v for k, v in traced.config.to_dict().items() if k != "trace_faults"}
    r = small(**fields, trace_faults=False)
    assert r.fault_trace is None
    assert sum(v.faults for v in r.vcpus) == r.faults == 2 * PAGES_PER_VCPU
    assert all(v.faults == PAGES_PER_VCPU for v in r.vcpus)
    assert sum(v.eexist for v in r.vcpus) == sum(x.eexist for x in r.readers)
    for v in r.vcpus:
        assert v.service_latency.count == v.faults + v.eexist
        assert v.blocked_seconds > 0
        assert r.blocktime_seconds <= v.blocked_seconds
    assert r.blocktime_seconds > 0, "as in the traced run, vCPUs waited at once"


# The *_seconds fields that time faults. seconds, pass_seconds and
# cpu_seconds stay: the vCPU's clock at each pass end and getrusage, not a
# clock per fault.
TIMING_FIELDS = {"blocked_seconds", "busy_seconds"}


def timing_fields(cls):
    """Every Histogram field of cls, and its per-fault *_seconds fields."""
    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls)
            if "Histogram" in str(hints[f.name]) or f.name in TIMING_FIELDS]


def test_basic_stats_keep_no_timing(kvm):
    assert set(timing_fields(VcpuStats)) >= {"service_latency", "blocked_seconds"}
    assert set(timing_fields(ReaderStats)) >= {"service_latency", "busy_seconds"}
    r = small(stats="basic", readers=2)
    assert r.faults == 2 * 4096
    for v in r.vcpus:
        assert {name: getattr(v, name) for name in timing_fields(VcpuStats)} == \
            dict.fromkeys(timing_fields(VcpuStats))
        assert v.faults is None  # attribution needs the fault log
    for x in r.readers:
        assert {name: getattr(x, name) for name in timing_fields(ReaderStats)} == \
            dict.fromkeys(timing_fields(ReaderStats))
    assert r.blocktime_seconds is None and r.fault_trace is None


COUNTED_RUN = """
import ctypes, json, sys
import uffdkvm
count = ctypes.CDLL(None).callcount_of
count.restype, count.argtypes = ctypes.c_long, [ctypes.c_int, ctypes.c_int]
out = {}
for stats, mem in (("full", "1M"), ("basic", "1M"), ("full_32x", "32M"), ("basic_32x", "32M")):
    r = uffdkvm.run(vcpus=1, mem_per_vcpu=mem, single_uffd=True, readers=2,
                    stats=stats.split("_")[0])
    assert r.verified, r.verify_message
    out[stats] = {"faults": r.faults + r.eexist,
                  "clock_reads": sum(count(x.tid, 0) for x in r.readers),
                  "allocations": sum(count(x.tid, 1) for x in r.readers)}
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def callcount(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build the call-counting shim")
    lib = tmp_path_factory.mktemp("callcount") / "callcount.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib),
                    os.path.join(HERE, "callcount.c"), "-ldl"], check=True)
    return lib


def test_basic_stats_read_no_clock_and_keep_no_log_per_fault(kvm, callcount):
    """What a reader thread calls, counted by a preloaded shim in a child
    process: with stats="full" two clock reads per fault (read and resolved);
    with "basic" none, however many faults. Neither allocates per fault: the
    fault log is reserved before the run (a reader claims a chunk of 1024
    records from it now and then), not grown as faults come."""
    out = subprocess.run(python(code=COUNTED_RUN), check=True,
                         env={**CHILD_ENV, "LD_PRELOAD": str(callcount)},
                         capture_output=True, text=True, timeout=120)
    counts = json.loads(out.stdout)
    full, basic = counts["full"], counts["basic"]
    assert full["faults"] == basic["faults"] == 256
    assert counts["full_32x"]["faults"] == counts["basic_32x"]["faults"] == 8192
    assert full["clock_reads"] >= 2 * full["faults"], counts  # the shim sees clocks
    assert basic["clock_reads"] == counts["basic_32x"]["clock_reads"] == 0, counts
    # A thread may allocate as it starts (its thread-local storage, say),
    # never per fault: 32 times the faults, the same allocations (a log grown
    # by realloc as it fills would allocate more for more faults).
    for mode in ("full", "basic"):
        assert counts[mode]["allocations"] == counts[mode + "_32x"]["allocations"], counts


def kernel_has_kvm_stats():
    """KVM_GET_STATS_FD came with Linux 5.14."""
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    return (major, minor) >= (5, 14)


def test_kvm_statistics_are_deltas_of_this_run(kvm):
    """KVM counts for the VM's whole life; the core reports each cumulative
    counter's change over the run. Each run makes a new VM, so two runs in
    one process must give the same counts for the same deterministic guest
    (no faults: prefault), and counts that grow with the run's pages, from
    a small intercept: the guest's code outside its page loop.

    What this cannot check here: on this host no counter moves between the
    VM's creation and the core's snapshot (the vCPU ioctls of setup count
    nothing), so totals would equal deltas; a core reporting totals passes."""
    if not kernel_has_kvm_stats():
        pytest.skip("this kernel has no KVM binary statistics (KVM_GET_STATS_FD)")

    def vcpu(pages):
        r = small(vcpus=1, mem_per_vcpu=f"{pages * 4}K", prefault=True)
        assert r.faults == 0 and r.kvm_stats
        return r.vcpus[0]

    a, b, c = vcpu(64), vcpu(64), vcpu(256)
    assert a.kvm_stats and set(a.kvm_stats) == set(c.kvm_stats)
    for v in (a, b, c):
        # Every return of KVM_RUN to the vCPU thread was an exit (KVM takes
        # more: a loaded host's interrupts and preemptions, dozens here).
        assert v.exits >= v.userspace_exits
    emulated = [v.kvm_stats.get("insn_emulation", 0) for v in (a, b, c)]
    if not emulated[0]:
        return  # hardware virtualization: no per-instruction count to compare
    assert emulated[0] == emulated[1], "the same guest, the same count, run after run"
    per_page = (emulated[2] - emulated[0]) / (256 - 64)
    intercept = emulated[0] - 64 * per_page
    assert per_page == int(per_page) > 0, per_page
    assert 0 <= intercept < 64, f"{intercept} instructions not explained by the pages"
