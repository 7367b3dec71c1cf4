"""resolver="vcpu": each vCPU's own thread resolves its faults.

The uffd is opened with UFFD_FEATURE_SIGBUS, so a fault is never queued:
KVM_RUN comes back to the vCPU thread, which resolves the page and runs on.
What proves it here is where the work was done, read from the threads
themselves: every fault came back to its vCPU as an exit (fault_exits), and
the thread that resolved each page is the vCPU's own (the resolvers' tids).
Forcing the knob back to readers in the mapping to the core (run.py) turns
every test of an effect red: fault_exits drop to 0 and reader threads of
their own resolve.
"""
from __future__ import annotations

import pytest
from helpers.children import ENV as CHILD_ENV
from helpers.children import uffdkvm_command
from helpers.guest_clock import guest_clock_converted
from helpers.resources import resources
from helpers.runs import run_or_skip
from helpers.skips import needs_test_hooks

import uffdkvm
from uffdkvm import Config, ConfigError

pytestmark = pytest.mark.kvm


def _resolved_by_the_vcpus(r: uffdkvm.Result) -> None:
    assert r.verified, r.verify_message
    for v in r.vcpus:
        # every fault of this vCPU came back to its thread, and it resolved them
        assert v.fault_exits == v.faults + (v.eexist or 0) > 0, v
    by_tid = {v.tid: v for v in r.vcpus}
    assert {x.tid for x in r.readers} == set(by_tid)
    for x in r.readers:
        v = by_tid[x.tid]
        assert x.faults + x.eexist == v.fault_exits
        assert x.wakeups == 0 and x.spurious_wakeups == 0  # it never waited for a message
        # The resolver is the vCPU thread: its thread counters are that thread's.
        assert (x.cpu_seconds, x.cpus) == (v.cpu_seconds, v.cpus) and x.cpu_seconds > 0


@pytest.mark.parametrize("fields", [
    dict(),
    dict(single_uffd=True),
    dict(uffd_mode="minor", backing="shmem"),
    dict(resolve="zeropage"),
    dict(write_percent=0),     # every access a read: the resolved page's bytes reach the guest
    dict(backing="anonymous_thp"),
], ids=["per-vcpu", "single", "minor-shmem", "zeropage", "reads", "thp"])
def test_each_vcpu_resolves_its_own_faults(kvm, fields):
    r = run_or_skip(vcpus=2, mem_per_vcpu="4M", resolver="vcpu", **fields)
    _resolved_by_the_vcpus(r)
    assert r.faults == r.config.region_bytes // r.page_size


def test_hugetlb(kvm, hugepages):
    r = run_or_skip(vcpus=2, mem_per_vcpu="4M", resolver="vcpu", backing="anonymous_hugetlb")
    _resolved_by_the_vcpus(r)


def test_overlap_counts_the_losers_of_a_race_as_eexist(kvm):
    r = run_or_skip(vcpus=2, mem_per_vcpu="4M", resolver="vcpu", overlap=True)
    _resolved_by_the_vcpus(r)
    assert r.faults == r.config.region_bytes // r.page_size


def test_readers_take_no_fault_exits(kvm):
    r = run_or_skip(vcpus=2, mem_per_vcpu="4M")
    assert [v.fault_exits for v in r.vcpus] == [0, 0]
    assert not {x.tid for x in r.readers} & {v.tid for v in r.vcpus}


def test_stages_are_timed_from_the_vcpus_own_exit(kvm):
    r = run_or_skip(vcpus=1, mem_per_vcpu="2M", resolver="vcpu", guest_timing=True,
                    trace_faults=True)
    _resolved_by_the_vcpus(r)  # the timed walk's accesses resolve too, wherever the clock is
    if not guest_clock_converted(r):
        return  # no stages where KVM moved the guest's TSC offset, and the run says why
    assert r.misordered_faults == 0
    f = r.faults_frame()
    assert (f["raised_ns"] <= f["read_ns"]).all() and (f["resolved_ns"] <= f["resumed_ns"]).all()


def test_no_reader_threads_run(kvm):
    """While the vCPUs run, the process has no more threads than a run
    without userfaultfd: nobody waits on the uffd."""
    seen: dict[str, int] = {}

    def during(label):
        def progress(p):
            if p.phase == "running" and label not in seen:
                seen[label] = resources()["threads"]
        return progress

    for label, fields in (("none", dict(uffd_mode=None)), ("vcpu", dict(resolver="vcpu")),
                          ("readers", dict(readers=3))):
        uffdkvm.run(vcpus=2, mem_per_vcpu="64M", progress=during(label), **fields)
    assert seen["vcpu"] == seen["none"]
    assert seen["readers"] == seen["none"] + 2 * 3


@pytest.mark.parametrize("field,value", [("readers", 2), ("wait", "poll"), ("read_batch", 4),
                                         ("pin_readers", "0")])
def test_reader_fields_are_refused(field, value):
    with pytest.raises(ConfigError, match="resolver='vcpu'") as e:
        Config(resolver="vcpu", **{field: value})
    assert e.value.field == field


def test_a_stopped_run_leaves_nothing(kvm, released):
    """A run cut short (its time limit) while the vCPUs resolve their own
    slow faults: a clear error, every thread and fd given back."""
    with pytest.raises(uffdkvm.RunTimeoutError):
        uffdkvm.run(vcpus=2, mem_per_vcpu="64M", resolver="vcpu", delay_us=2000, timeout_s=1)


def test_cli(kvm):
    import subprocess
    base = uffdkvm_command("-v", "2", "-b", "2M", "--resolver", "vcpu")
    p = subprocess.run(base, capture_output=True, text=True, env=CHILD_ENV)
    assert p.returncode == 0, p.stderr
    assert "Resolvers (each vCPU's own thread, 2 uffd(s))" in p.stdout
    p = subprocess.run(base + ["--json"], capture_output=True, text=True, env=CHILD_ENV)
    _resolved_by_the_vcpus(uffdkvm.Result.from_json(p.stdout))


@pytest.mark.parametrize("fault,after,message", [
    ("resolve_eio", 100, r"vCPU (\d), resolving on uffd \1: UFFDIO_COPY\(.*\) \(injected\)"),
    ("reader_exit", 100,
     r"vCPU (\d), resolving on uffd \1: left its fault unresolved \(injected\)"),
    # EAGAIN for 1.5 s: the vCPU's retries give up after 1 s, saying so (its
    # thread knows its run and name from its first fault on)
    ("resolve_eagain", 1500,
     r"vCPU (\d), resolving on uffd \1: UFFDIO_COPY\(.*\) still failed after retrying"),
])
def test_a_resolution_that_fails_fails_the_run_at_once_naming_the_vcpu(kvm, released, fault,
                                                                        after, message):
    """A vCPU's own resolution failing is the run's failure, said at once and
    naming that vCPU: not a timeout, not a reader's name."""
    import time
    needs_test_hooks()      # a plain `pip install .` has no fault injection: a host skip
    from uffdkvm.testing import _faults as testing
    start = time.monotonic()
    with pytest.raises(uffdkvm.RunError, match=message):
        testing.run_with_fault(vcpus=2, mem_per_vcpu="4M", resolver="vcpu", fault=fault,
                               after=after, timeout_s=30)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("write_percent", [0, 100])
def test_each_fault_is_found_where_this_kvm_says_it_and_as_the_access_it_was(
        kvm, write_percent):
    """How the vCPU thread learns the page depends on the KVM: stock x86 KVM
    (kvm_intel, kvm_amd) returns a bare EFAULT and the thread reads the
    guest's registers, counted in regs_fault_exits; kvm_pvm hands the
    emulated access back as MMIO, and a KVM with memory-fault exits names the
    page. Whichever it is, every page verifies and the fault trace records
    each fault as the access the guest made (write_percent 0: all reads;
    100: all writes), which only the registers' access site and the MMIO
    exit know (a memory-fault exit does not say, and is recorded as a write).
    On purpose a tripwire: a stock KVM that began to name the page for shared
    memory would fail here, and docs/config.md would need to say so.
    """
    from uffdkvm.host import facts as host

    r = run_or_skip(vcpus=2, mem_per_vcpu="2M", resolver="vcpu", write_percent=write_percent,
                    trace_faults=True)
    _resolved_by_the_vcpus(r)
    stock = host.capture().kvm_module in ("kvm_intel", "kvm_amd")
    for v in r.vcpus:
        assert v.regs_fault_exits == (v.fault_exits if stock else 0), (host.capture(), v)
    if stock or host.capture().kvm_module == "kvm_pvm":
        assert set(r.fault_trace.write) == {bool(write_percent)}
