"""Values in and out: numpy integers and any iterable as a sweep axis; one
meaning per name (faults, pages_per_s, t_s); frozen results that hold tuples
and hash; short reprs and full tables; the host facts a Result records."""
import json
import os
import subprocess

import numpy as np
import pandas as pd
import pytest

import uffdkvm
from helpers.children import ENV as CHILD_ENV
from helpers.children import python
from helpers.hostfacts import cpus_unavailable, host_skip
from helpers.skips import skip_without_kvm
from uffdkvm import Config, HostInfo, Result
from uffdkvm.host.facts import UFFD_FEATURES

TINY = dict(vcpus=1, mem_per_vcpu="64K")


@pytest.fixture(scope="module")
def traced(kvm_reason):
    skip_without_kvm(kvm_reason)
    r = uffdkvm.run(vcpus=2, mem_per_vcpu="256K", passes=2, trace_faults=True)
    assert r.verified, r.verify_message
    return r


# ---- numpy scalars and iterables ----------------------------------------------

def test_numpy_integers_are_ints():
    c = Config(vcpus=np.int64(2), readers=np.int32(4), mem_per_vcpu=np.uint64(1 << 20),
               delay_us=np.int16(3), seed=np.uint64(2**63), pin_vcpus=np.array([0, 1]),
               pin_readers=np.int64(0), guest_page_size=np.int64(4096),
               single_uffd=np.bool_(True))
    assert (c.vcpus, c.readers, c.mem_per_vcpu, c.delay_us, c.seed) == (2, 4, 1 << 20, 3, 2**63)
    assert c.pin_vcpus == (0, 1) and c.pin_readers == (0,) and c.single_uffd is True
    for name in ("vcpus", "readers", "mem_per_vcpu", "delay_us", "seed"):
        assert type(getattr(c, name)) is int, name
    assert all(type(cpu) is int for cpu in c.pin_vcpus)
    assert c == Config(vcpus=2, readers=4, mem_per_vcpu=1 << 20, delay_us=3, seed=2**63,
                       pin_vcpus=[0, 1], pin_readers=[0], single_uffd=True)
    with pytest.raises(uffdkvm.ConfigError, match="readers: expected an int"):
        Config(readers=np.float64(4.0))  # a float is still no count


def test_a_numpy_run_runs(kvm):
    r = uffdkvm.run(vcpus=np.int64(1), mem_per_vcpu=np.int64(64 << 10), readers=np.int64(2))
    assert r.verified and r.faults == 16 and len(r.readers) == 2


@pytest.mark.parametrize("axis", [
    np.array([1, 2]), pd.Series([1, 2]), range(1, 3), (n for n in (1, 2)), [1, 2],
], ids=["numpy", "series", "range", "generator", "list"])
def test_any_iterable_is_a_sweep_axis(axis):
    from uffdkvm.analysis.sweep import points
    configs = points(Config(**TINY), readers=axis, wait="poll")
    assert [c.readers for c in configs] == [1, 2]
    assert {c.wait for c in configs} == {"poll"}  # a string is held fixed


def test_a_sweep_over_a_numpy_axis_runs_each_point(kvm):
    df = uffdkvm.sweep(Config(**TINY), readers=np.array([1, 2]), progress=False)
    assert list(df["readers"]) == [1, 2] and df["error"].isna().all()


# ---- one meaning per name ---------------------------------------------------

# Several vCPUs over the same pages in the same order: their faults on a page
# race, and the readers find some already resolved (EEXIST).
OVERLAP_RACE = dict(vcpus=4, mem_per_vcpu="2M", overlap=True, readers=32, wait="epoll",
                    delay_us=20, trace_faults=True)


def test_faults_count_resolved_faults_for_the_run_each_vcpu_and_each_reader(kvm):
    r = uffdkvm.run(**OVERLAP_RACE)
    assert r.verified and r.eexist > 0, "the race made no EEXIST: nothing to tell apart"
    t = r.fault_trace
    for v in r.vcpus:  # against the trace, an independent record of every message
        mine = [e for vcpu, e in zip(t.vcpu, t.eexist, strict=True) if vcpu == v.index]
        assert v.faults == mine.count(False) and v.eexist == mine.count(True), v
    assert sum(v.faults for v in r.vcpus) == r.faults == sum(x.faults for x in r.readers)
    assert sum(v.eexist for v in r.vcpus) == r.eexist
    assert r.faults == 512  # one per page: EEXIST is not a fault resolved
    assert r.vcpus_frame()["faults"].sum() == r.to_frame()["faults"].iloc[0] == r.faults


def test_pages_per_s_is_the_runs_first_pass_rate_and_vcpu_rates_say_which(traced):
    r = traced
    row = r.to_frame().iloc[0]
    assert row["pages_per_s"] == r.paging_rate
    df = r.vcpus_frame()
    assert "pages_per_s" not in df
    for v, (_, x) in zip(r.vcpus, df.iterrows(), strict=True):
        assert v.pages == 2 * r.pages_per_vcpu  # both passes
        assert x["all_passes_pages_per_s"] == pytest.approx(v.pages / v.seconds)
        assert x["first_pass_pages_per_s"] == pytest.approx(r.pages_per_vcpu / v.pass_seconds[0])


def test_fault_times_count_from_the_runs_start(traced):
    r = traced
    f = r.faults_frame()
    t_s = f["t_s"]
    # The vCPU threads are made, enter KVM_RUN, and only then fault: the first
    # fault is read after the start, and every one inside the run's window.
    assert t_s.min() > 0
    assert t_s.max() < r.seconds
    start_ns = r.fault_trace.start_ns
    assert ((f["read_ns"] - start_ns) / 1e9 == t_s).all()


# ---- frozen results ---------------------------------------------------------

def test_results_hold_tuples_and_hash(traced):
    r = traced
    for value in (r.vcpus, r.readers, r.pass_seconds, r.vcpus[0].pass_seconds,
                  r.vcpus[0].cpus, r.readers[0].cpus, r.fault_trace.read_ns):
        assert isinstance(value, tuple)
    back = Result.from_json(r.to_json())
    assert back == r and hash(back) == hash(r)
    assert len({r, back}) == 1
    with pytest.raises(AttributeError):
        r.vcpus.append(r.vcpus[0])


# ---- display ----------------------------------------------------------------

def test_reprs_are_one_short_line(traced):
    r = traced
    for obj in (r, r.vcpus[0], r.readers[0], r.fault_trace):
        text = repr(obj)
        assert "\n" not in text and len(text) < 250, text
    assert repr(r).startswith("Result(vcpus=2, mem_per_vcpu='256K', ")
    assert f"faults={r.faults}" in repr(r) and "verified=True" in repr(r)


def test_the_full_table_is_str_markdown_and_html(traced):
    r = traced
    text = str(r)
    lines = text.splitlines()
    assert lines[0] == "uffdkvm run"
    assert f"{r.paging_rate:.0f} pages/s" in text
    vcpu_rows = [line.split() for line in lines if line.split()[:1] in (["0"], ["1"])]
    assert [row[2] for row in vcpu_rows[:2]] == [str(v.pages) for v in r.vcpus]
    md = r._repr_markdown_()
    assert "| vcpu | seconds | pages |" in md and md.count("\n| 0 |") >= 2
    html = r._repr_html_()
    assert html.count("<table>") == 3 and f"<td>{r.vcpus[1].pages}</td>" in html


# ---- the host -----------------------------------------------------------------

def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def test_host_facts_match_the_kernels_files():
    h = uffdkvm.host.facts.capture()
    enabled = read("/sys/kernel/mm/transparent_hugepage/enabled")
    if enabled is not None:
        assert f"[{h.thp_enabled}]" in enabled
        assert f"[{h.thp_defrag}]" in read("/sys/kernel/mm/transparent_hugepage/defrag")
    pool = read("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
    if pool is not None:
        assert h.hugepages_2m == int(pool)
    tdp = read("/sys/module/kvm/parameters/tdp_mmu")
    if tdp is not None:
        assert h.kvm_params["kvm.tdp_mmu"] == tdp
    for vendor in ("kvm_intel", "kvm_amd", "kvm_pvm"):
        if os.path.isdir(f"/sys/module/{vendor}"):
            assert h.kvm_module == vendor
    assert h.sys_vendor == (read("/sys/class/dmi/id/sys_vendor") or "")
    with open("/proc/cpuinfo") as f:
        assert h.hypervisor == (" hypervisor" in f.read())


def test_host_facts_agree_with_what_a_run_needs(kvm):
    h = HostInfo.current()
    # A full-stats run needs UFFD_FEATURE_THREAD_ID and the kernel's binary
    # stats fill kvm_stats: what a run got, the host's facts must show.
    r = uffdkvm.run(**TINY)
    assert r.vcpus[0].faults is not None and h.uffd_features & UFFD_FEATURES["thread_id"]
    assert "thread_id" in h.uffd_feature_names
    assert bool(r.kvm_stats) == bool(h.kvm_caps.get("binary_stats_fd"))
    assert h.kvm_caps["max_vcpus"] >= h.kvm_caps["nr_vcpus"] >= 1
    assert r.host == h



def test_one_refused_kvm_create_vm_does_not_empty_the_vm_facts(kvm, monkeypatch):
    """CI saw a run's host facts lose every VM answer once: one KVM_CREATE_VM
    refused between two that worked. The probe asks again before it gives up."""
    import fcntl

    from uffdkvm.host import facts as host

    real, refusals = fcntl.ioctl, []

    def refuse_the_first_create_vm(fd, request, *args):
        if request == host._KVM_CREATE_VM and not refusals:
            refusals.append(request)
            raise OSError(12, "Cannot allocate memory")
        return real(fd, request, *args)

    monkeypatch.setattr(host.fcntl, "ioctl", refuse_the_first_create_vm)
    h = host.capture()
    assert refusals and h.vm_caps == HostInfo.current().vm_caps != {}

PINNED_CHILD = """
import json, os, uffdkvm
before = len(os.sched_getaffinity(0))
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})   # as the CLI's -c does
print(json.dumps({"before": before, "usable": uffdkvm.HostInfo.current().usable_cpus}))
"""


def test_usable_cpus_are_read_before_anything_pins_the_process():
    if len(os.sched_getaffinity(0)) < 2:
        host_skip(cpus_unavailable(0, 1), "needs two usable CPUs")
    p = subprocess.run(python(code=PINNED_CHILD), capture_output=True, text=True,
                       timeout=60, env=CHILD_ENV)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["usable"] == out["before"] >= 2


def test_each_run_carries_the_host_facts_of_its_own_time(kvm):
    """A fact that changes between runs (here the 2 MiB pool, as root) is
    read again for the next Result, not kept from the first."""
    from helpers.hostfacts import NOT_ROOT, add_hugepages, remove_hugepages
    if os.geteuid() != 0:
        host_skip(NOT_ROOT, "only root can change the huge page pool")
    before = uffdkvm.run(vcpus=1, mem_per_vcpu="64K").host.hugepages_2m
    added = add_hugepages(2048, 1)
    try:
        after = uffdkvm.run(vcpus=1, mem_per_vcpu="64K").host.hugepages_2m
    finally:
        remove_hugepages(2048, added)
    assert after == before + added and added == 1
