"""No page is lost, resolved twice or corrupted under stress.

Overlapping vCPUs racing for the same pages, many readers on one uffd,
random delays, random orders, mixed reads and writes, several passes and
seeds: every run verifies every page, and the fault counts are exact. The
fault trace (every message every reader handled) shows each page of the
region resolved exactly once, with every other message for it accounted
as EEXIST.
"""
import collections

import pytest

import uffdkvm
from helpers.runs import run_or_skip, small

pytestmark = pytest.mark.kvm

GIB = 1 << 30
MODES = [("missing", "anonymous", "copy"), ("missing", "anonymous", "zeropage"),
         ("missing", "shmem", "copy"), ("minor", "shmem", "copy")]
WAITS = ["poll", "epoll", "epoll_exclusive", "read", "io_uring"]


def check_every_page_resolved_once(r):
    """The trace holds every message: per page, one resolution and the rest
    EEXIST; the resolved pages are the region, each exactly once."""
    t = r.fault_trace
    # A message names the 4 KiB page the vCPU touched; a fault resolves the
    # backing's page around it (the region starts on a 1 GiB boundary).
    pages = [gpa - gpa % r.page_size for gpa in t.gpa]
    resolved = collections.Counter(p for p, eexist in zip(pages, t.eexist) if not eexist)
    region_pages = r.config.region_bytes // r.page_size
    assert len(resolved) == region_pages, "every page was resolved"
    assert set(resolved.values()) == {1}, "no page was resolved twice"
    first = min(resolved)
    assert first % GIB == 0
    assert sorted(resolved) == [first + i * r.page_size for i in range(region_pages)]
    # A message that found its page resolved is for a page of the region.
    assert set(pages) == set(resolved)
    if min(t.vcpu) < 0:
        return  # the kernel does not name the faulting thread (UFFD_FEATURE_THREAD_ID)
    # A vCPU waits out its fault on a page, which is then mapped: no vCPU
    # faults twice on one page, EEXIST or not (the kernel's thread id and
    # address, not the counting code's).
    per_vcpu_page = collections.Counter(zip(t.vcpu, pages))
    assert max(per_vcpu_page.values()) == 1, "a vCPU faulted twice on one page"
    assert set(t.vcpu) <= set(range(r.config.vcpus))
    if not r.config.overlap:
        # Partitioned: vCPU i's faults are in its own slice of the region.
        slices = [(gpa - first) // r.config.mem_per_vcpu for gpa in t.gpa]
        assert list(t.vcpu) == slices, "a fault attributed to another vCPU's memory"


def check_counts(r, touched_per_vcpu):
    assert r.verified, r.verify_message
    assert r.bad_pages == 0
    assert r.faults == r.config.region_bytes // r.page_size
    assert all(v.pages == touched_per_vcpu for v in r.vcpus)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("mode,backing,resolve", MODES, ids=["-".join(m) for m in MODES])
def test_overlapping_vcpus_and_many_readers_lose_no_page(kvm, mode, backing, resolve, seed):
    pattern = ["sequential", "reverse", "random"][seed % 3]
    r = uffdkvm.run(vcpus=4, mem_per_vcpu="2M", overlap=True, readers=24, wait=WAITS[seed],
                    delay_us=50, delay_dist=["exponential", "uniform"][seed % 2],
                    pattern=pattern, seed=seed, write_percent=[0, 37, 100][seed % 3],
                    passes=2, uffd_mode=mode, backing=backing, resolve=resolve,
                    trace_faults=True)
    # All four vCPUs walk the same 512 pages: each page faults once into a
    # reader and is resolved once; other vCPUs' faults on it are EEXIST or
    # find it mapped.
    check_counts(r, touched_per_vcpu=512 * 2)
    assert r.faults == 512
    assert r.eexist <= 3 * 512
    # A failed ioctl wakes nobody: each EEXIST wakes the page's waiters, or a
    # vCPU may sleep on forever (Debian's 6.1, this very case).
    assert sum(x.wakes for x in r.readers) == r.eexist
    check_every_page_resolved_once(r)


def test_overlap_in_lockstep_races_on_every_page(kvm):
    """Four vCPUs in the same order hit the same page at once: many EEXIST,
    still every page resolved once and verified."""
    r = small(vcpus=4, mem_per_vcpu="2M", overlap=True, readers=32, wait="epoll",
              pattern="sequential", delay_us=20, trace_faults=True)
    check_counts(r, touched_per_vcpu=512)
    assert r.eexist > 0
    check_every_page_resolved_once(r)


@pytest.mark.parametrize("wait", WAITS)
def test_partitioned_vcpus_on_one_uffd_with_32_readers(kvm, wait):
    r = small(vcpus=4, mem_per_vcpu="1M", single_uffd=True, readers=32, wait=wait,
              pattern="random", seed=7, delay_us=30, delay_dist="exponential",
              write_percent=60, passes=3, trace_faults=True)
    check_counts(r, touched_per_vcpu=256 * 3)
    assert r.eexist == 0, "disjoint parts: no two vCPUs fault on one page"
    check_every_page_resolved_once(r)


@pytest.mark.parametrize("seed", range(4))
def test_seeds_change_the_run_not_the_outcome(kvm, seed):
    """Different seeds give different orders, reads and delays; every one
    verifies with the same counts."""
    r = small(vcpus=3, mem_per_vcpu="1M", overlap=seed % 2 == 1, single_uffd=True,
              readers=16, wait="poll", pattern="random", seed=seed * 7919,
              write_percent=seed * 33, delay_us=40, delay_dist="exponential", passes=2,
              trace_faults=True)
    check_counts(r, touched_per_vcpu=256 * 2)
    check_every_page_resolved_once(r)


@pytest.mark.parametrize("backing,mode", [("anonymous_thp", "missing"),
                                          ("anonymous_hugetlb", "missing"),
                                          ("shared_hugetlb", "minor")])
def test_overlap_on_huge_pages(kvm, hugepages, backing, mode):
    """A 2 MiB page is one fault for 512 guest pages that four vCPUs race for."""
    r = run_or_skip(vcpus=4, mem_per_vcpu="4M", overlap=True, readers=8, wait="poll",
                    backing=backing, uffd_mode=mode, pattern="random", seed=5,
                    write_percent=50, passes=2, trace_faults=True)
    check_counts(r, touched_per_vcpu=1024 * 2)
    assert r.faults == 2
    check_every_page_resolved_once(r)
