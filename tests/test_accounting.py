"""`verified` means the experiment happened as configured: the pages hold what
they must, and they got there the way the Config says, every page through
userfaultfd exactly once in a uffd mode, none without userfaultfd or with
prefault. A page mapped behind userfaultfd's back (as a kernel that maps
guest memory directly would) must fail verification even though its
contents are right."""
import pytest

import uffdkvm

from conftest import run_with_fault, small


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
