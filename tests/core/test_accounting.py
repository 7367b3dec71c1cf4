"""`verified` means the experiment happened as configured: the pages hold what
they must, and they got there the way the Config says, every page through
userfaultfd exactly once in a uffd mode, none without userfaultfd or with
prefault. A page mapped behind userfaultfd's back (as a kernel that maps
guest memory directly would) must fail verification even though its
contents are right.

And each vCPU's row and each reader's row of a Result holds what that
thread did, not another's (below)."""
import bisect
import os

import pytest

import uffdkvm

from helpers.hostfacts import NO_STEADY_KVM_TSC_OFFSET
from helpers.runs import run_with_fault, small


@pytest.mark.parametrize("fields", [
    dict(),
    dict(stats="basic"),
    dict(resolve="zeropage", write_percent=0),
    dict(uffd_mode="minor", backing="shmem"),
    dict(single_uffd=True, readers=3),
], ids=["missing", "basic", "zeropage", "minor", "single_uffd"])
def test_a_page_that_never_faulted_fails_verification(kvm, fields):
    cfg = uffdkvm.Config(vcpus=2, mem_per_vcpu="4M", **fields)
    r = run_with_fault(cfg, "unfaulted_page", after=7)
    assert r.bad_pages == 0  # the contents are right...
    assert not r.verified    # ...but the page did not come through userfaultfd
    assert "expected 2048: one per page" in r.verify_message
    assert r.faults < 2048


def test_every_page_faults_exactly_once(kvm):
    r = small(vcpus=2, mem_per_vcpu="4M", trace_faults=True, passes=2)
    resolved = [g for g, e in zip(r.fault_trace.gpa, r.fault_trace.eexist) if not e]
    assert len(resolved) == len(set(resolved)) == 2048


def test_huge_pages_fault_once_per_huge_page(kvm):
    r = small(vcpus=2, mem_per_vcpu="8M", backing="anonymous_thp", trace_faults=True)
    assert r.faults == 8  # 16 MiB of 2 MiB pages
    assert len({g // (2 << 20) for g in r.fault_trace.gpa}) == 8


@pytest.mark.parametrize("fields", [dict(uffd_mode=None), dict(prefault=True)],
                         ids=["no_uffd", "prefault"])
def test_runs_without_faults_verify_with_none(kvm, fields):
    r = small(vcpus=2, mem_per_vcpu="4M", **fields)
    assert r.faults == 0 and r.eexist == 0 and r.verified


# ---- each vCPU's row and each reader's row is its own ----
#
# Owns the per-vCPU and per-reader rows of a Result (experiment/collect.c's
# fill, the online and fault-log accounting, python/result.c's tables): in
# these runs the two vCPUs, and their readers, do different amounts of
# work, and every counter of a row that can differ is held against an
# independent record of what that thread did: the host's access model
# (page_visits), the config (which pages were preinstalled, where each
# thread was pinned) and the fault trace, attributed by address (each vCPU
# faults only in its own slice). A fill that copied vCPU 0's or reader 0's
# counters into every row, or counted one thread's work in another's row,
# goes red. Not held: the times that no record gives (seconds, pass_seconds,
# cpu_seconds) and KVM's statistics other than exits.

SLICE = 256  # pages per vCPU: mem_per_vcpu 1 MiB of 4 KiB pages


def pinned_cpus():
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs to pin the two vCPUs apart")
    return tuple(cpus)


def two_vcpus(tmp_path, **fields):
    """Two vCPUs of 1 MiB each, a uffd each, pinned to CPUs of their own,
    their pages from a snapshot file (which preinstall needs)."""
    snap = uffdkvm.make_snapshot(tmp_path / "snap", "2M")
    return small(vcpus=2, mem_per_vcpu="1M", source="file", source_path=snap,
                 pin_vcpus=pinned_cpus(), trace_faults=True, timeout_s=10, **fields)


def histogram_of(values, h):
    """The Histogram h must be, of these values (ns): count, sum, min, max and buckets."""
    counts = [0] * len(h.counts)
    for v in values:
        counts[min(bisect.bisect_right(h.bounds, v) - 1, len(counts) - 1)] += 1
    return (len(values), float(sum(values)), float(min(values, default=0)),
            float(max(values, default=0)), tuple(counts))


def hist_fields(h):
    return (h.count, h.sum, h.min, h.max, h.counts)


def union_ns(spans):
    total, end = 0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total, end = total + (b - a), b
        elif b > end:
            total, end = total + (b - end), b
    return total


def fault_stages(r, k):
    """Fault k of the trace in stages, as the vCPU's accounting takes them
    (csrc/uffd/faultlog.c, account): the stages with the guest's stamps,
    else only service (read -> resolved); and its blocked span."""
    t = r.fault_trace
    raised, read = t.raised_ns[k], t.read_ns[k]
    resolved, resumed = t.resolved_ns[k], t.resumed_ns[k]
    if raised is None or resumed is None or raised >= read or resumed <= read:
        return dict(service=resolved - read), (read, resolved)
    arrived = min(resolved, resumed)
    return dict(queue=read - raised, service=arrived - read, resume=resumed - arrived,
                fault=resumed - raised), (raised, resumed)


def check_rows_are_their_own(r, cpus):
    t = r.fault_trace
    readers = r.config.resolver == "readers"
    # The guest's stamps on the readers' clock: stages. Where KVM moves the
    # guest's TSC offset (Debian's 6.1 nested) a guest_timing run may have
    # none (helpers/guest_clock.py); anywhere else it must have them.
    staged = r.config.guest_timing and r.clock_sync is not None
    if r.config.guest_timing and not NO_STEADY_KVM_TSC_OFFSET.holds:
        assert staged, r.clock_sync_message
    assert [v.index for v in r.vcpus] == [0, 1]
    assert len({v.tid for v in r.vcpus} | {x.tid for x in r.readers}) == \
        2 + (len(r.readers) if readers else 0)
    # Partitioned: the vCPU of a fault is the slice its address is in.
    slice_of = [(gpa - r.region_gpa) // r.config.mem_per_vcpu for gpa in t.gpa]
    assert all(v in (-1, s) for v, s in zip(t.vcpu, slice_of, strict=True)), \
        "the kernel's thread ids put a fault in another vCPU's slice"
    assert not (r.config.guest_timing and any(t.eexist)), "account's woken_by_other not mirrored"
    for v in r.vcpus:
        rows = [k for k, s in enumerate(slice_of) if s == v.index]
        eexist = sum(t.eexist[k] for k in rows)
        assert (v.faults, v.eexist) == (len(rows) - eexist, eexist), v
        stages = [fault_stages(r, k) for k in rows]
        assert v.blocked_seconds == pytest.approx(union_ns(s for _, s in stages) / 1e9,
                                                  rel=1e-9, abs=1e-9), v
        for name in ("service", "queue", "resume", "fault"):
            h = getattr(v, f"{name}_latency")
            if name != "service" and not staged:
                assert h is None
                continue
            values = [st[name] for st, _ in stages if name in st]
            assert hist_fields(h) == histogram_of(values, h), (v.index, name)
        if r.config.guest_timing:
            assert v.access_latency.count == v.pages  # every access, timed
        assert v.cpus == (cpus[v.index],)
        assert v.fault_exits == (v.faults if not readers else 0)
        assert v.regs_fault_exits <= v.fault_exits
        if v.exits is not None:
            # KVM's own count: each message is an exit, KVM may map a few
            # pages without one (tests/core/test_run.py's slack). No upper bound: a
            # loaded host adds exits (preemption), to a few-fault vCPU
            # several times its faults.
            assert v.exits >= 0.95 * (v.faults + v.eexist), v
            assert v.kvm_stats.get("exits", v.exits) == v.exits
    for x in r.readers:
        rows = [k for k in range(len(t.gpa)) if (t.uffd[k], t.reader[k]) == (x.uffd, x.index)]
        assert all(slice_of[k] == x.uffd for k in rows)  # a uffd per vCPU
        eexist = sum(t.eexist[k] for k in rows)
        assert (x.faults, x.eexist) == (len(rows) - eexist, eexist), x
        assert x.wakes == (x.eexist if readers else 0), x
        assert x.copies == x.faults and x.source_bytes == 4096 * x.copies, x
        assert x.reads == (len(rows) if readers else 0), x  # read_batch 1
        busy = [t.resolved_ns[k] - t.read_ns[k] for k in rows]
        assert x.busy_seconds == pytest.approx(sum(busy) / 1e9, rel=1e-9, abs=1e-9), x
        assert hist_fields(x.service_latency) == histogram_of(busy, x.service_latency), x
        if staged:
            queued = [fault_stages(r, k)[0].get("queue") for k in rows]
            assert x.queue_latency.count == sum(q is not None for q in queued), x
        else:
            assert x.queue_latency is None, x
        assert x.cpus == (cpus[x.uffd],), x  # with its vCPU (pin_readers "vcpus")
        if not readers:
            assert x.tid == r.vcpus[x.uffd].tid and x.faults == r.vcpus[x.uffd].faults


# vCPU 0's slice is preinstalled but for its last 32 pages: it faults on a
# few, vCPU 1 on every page it touches. vCPU 0 the light one: a row copied
# from it falls short of KVM's exits floor too, which only rises on a busy
# host.
PREINSTALL = range(0, SLICE - 32)


@pytest.mark.parametrize("how", [
    dict(readers=2, wait="epoll"),
    dict(readers=2, wait="epoll", guest_timing=True),
    dict(resolver="vcpu"),
], ids=["readers", "guest_timing", "vcpu_resolver"])
def test_each_vcpu_and_reader_row_counts_its_own_work(kvm, tmp_path, how):
    """vCPU 0 faults about 16 times, vCPU 1 about 130, and with touch_percent
    50 each touches its own number of pages (seeded): every row must say
    so. With guest_timing the stages come from the fault log (after the
    run), without it from the online accounting: each path is held."""
    r = two_vcpus(tmp_path, touch_percent=50, seed=3, passes=2, preinstall=PREINSTALL, **how)
    visits = r.page_visits
    touched = [[p for p in range(i * SLICE, (i + 1) * SLICE) if visits[p]] for i in (0, 1)]
    faults = [len([p for p in touched[0] if p not in PREINSTALL]), len(touched[1])]
    pages = [r.config.passes * sum(visits[i * SLICE:(i + 1) * SLICE]) for i in (0, 1)]
    # The premise: the two did different work (the seed makes it so).
    assert pages[0] != pages[1] and faults[1] > 4 * faults[0] > 0, (pages, faults)
    assert [v.pages for v in r.vcpus] == pages
    assert [v.faults for v in r.vcpus] == faults
    check_rows_are_their_own(r, pinned_cpus())


def test_a_vcpu_that_met_eexist_and_one_that_faulted_keep_their_own_rows(kvm, tmp_path):
    """vCPU 0 meets one EEXIST and faults on nothing; vCPU 1 faults twice and
    meets no EEXIST (the trick of tests/fault_paths/test_resolution.py's wake test): vCPU 0
    walks down from its last page, which a paced pusher (replay of vCPU 0's
    pages in address order) installs while the reader sleeps out its delay;
    vCPU 1's slice is preinstalled but for its last two pages, which it
    faults on, one delay each."""
    r = two_vcpus(tmp_path, pattern="reverse", delay_us=120_000, readers=1, wait="epoll",
                  preinstall=range(SLICE, 2 * SLICE - 2), prefetch="replay",
                  replay_from=range(SLICE), prefetch_bandwidth_mbps=150)
    assert [(v.faults, v.eexist) for v in r.vcpus] == [(0, 1), (2, 0)]
    assert [(x.faults, x.eexist, x.wakes) for x in r.readers] == [(0, 1, 1), (2, 0, 0)]
    assert [v.pages for v in r.vcpus] == [SLICE, SLICE]
    check_rows_are_their_own(r, pinned_cpus())
