"""wait="spin": readers that poll the non-blocking uffd in a loop, never
sleeping, and the refusal to spin on CPUs the vCPUs need.

Checked against the kernel's own account of the threads (getrusage's
voluntary context switches: a thread that blocks in poll, epoll_wait or
read sleeps once per wakeup; one that spins never does)."""
import os

import pytest

import uffdkvm
from helpers.runs import small

pytestmark = pytest.mark.kvm

ONE = dict(vcpus=1, mem_per_vcpu="4M", readers=1)  # 1024 faults


def test_a_spinning_reader_never_sleeps_where_an_epoll_one_sleeps_per_fault(kvm):
    # (allowed even on one CPU: there the spinner is preempted, which is not
    # a sleep of its own)
    spin = small(**ONE, wait="spin", allow_oversubscribe=True).readers[0]
    epoll = small(**ONE, wait="epoll_exclusive").readers[0]
    assert spin.faults == epoll.faults == 1024
    # A few sleeps at most (starting, pinning, taking a lock), not one a fault.
    assert spin.voluntary_context_switches < 50, spin
    assert epoll.voluntary_context_switches > 500, epoll
    assert spin.spurious_wakeups == 0 and 1 <= spin.wakeups <= spin.reads


def test_spinners_beyond_the_free_cpus_are_refused_unless_asked(kvm):
    cpus = len(os.sched_getaffinity(0))
    fields = dict(vcpus=cpus, mem_per_vcpu="1M", readers=1, wait="spin")
    with pytest.raises(uffdkvm.HostUnsupportedError, match="allow_oversubscribe=True"):
        uffdkvm.run(**fields)
    r = small(**fields, allow_oversubscribe=True)
    assert r.faults == cpus * 256


@pytest.mark.parametrize("fields", [
    dict(vcpus=1, pin_vcpus=(0,), pin_readers=(0,)),        # the spinner on the vCPU's CPU
    dict(vcpus=1, readers=2, pin_readers=(1,)),              # two spinners, one CPU
    dict(vcpus=len(os.sched_getaffinity(0)), prefault=True),  # prefaulted: readers spin still
], ids=["pinned-on-the-vcpu", "pinned-together", "prefault"])
def test_spinners_on_shared_cpus_are_refused_by_run_and_probe(kvm, fields):
    cfg = uffdkvm.Config(mem_per_vcpu="1M", wait="spin", **fields)
    for call in (uffdkvm.run, uffdkvm.probe):
        with pytest.raises(uffdkvm.HostUnsupportedError, match="allow_oversubscribe=True"):
            call(cfg)
