"""The guest's side of an experiment: order, reads and writes, passes, page size."""
import re

import numpy as np
import pytest

import uffdkvm
from helpers.runs import run_or_skip, small
from helpers.skips import needs_test_hooks

pytestmark = pytest.mark.kvm


@pytest.mark.parametrize("pattern", ["sequential", "reverse", "random"])
@pytest.mark.parametrize("overlap", [False, True], ids=["partitioned", "overlap"])
def test_every_pattern_visits_every_page_once_per_pass(kvm, pattern, overlap):
    # Verification checks each page's count of guest writes: passes x writers.
    r = small(mem_per_vcpu="4M", pattern=pattern, seed=11, passes=3, overlap=overlap,
              readers=2)
    pages = 1024
    assert r.faults == (pages if overlap else 2 * pages)
    assert all(v.pages == 3 * pages for v in r.vcpus)


@pytest.mark.parametrize("write_percent", [0, 50, 100])
@pytest.mark.parametrize("mode,backing", [("missing", "anonymous"), ("minor", "shmem")])
def test_reads_and_writes_verify(kvm, write_percent, mode, backing):
    """Reads are checked too: each vCPU sums what it read, and the host
    checks the sum against what the resolver supplied."""
    r = small(mem_per_vcpu="4M", write_percent=write_percent, uffd_mode=mode,
              backing=backing, pattern="random")
    assert r.faults == 2048


def test_later_passes_do_not_fault(kvm):
    r = small(vcpus=1, mem_per_vcpu="4M", passes=4)
    assert r.faults == 1024
    assert len(r.pass_seconds) == 4
    for v in r.vcpus:
        assert len(v.pass_seconds) == 4
        # The first pass demand-pages; the others find every page mapped.
        assert v.pass_seconds[0] > min(v.pass_seconds[1:])
    # The rate covers the demand-paging pass, from upstream's start (the
    # threads' creation): a little longer than the pass itself.
    assert 1024 / r.paging_rate > r.pass_seconds[0]
    assert 1024 / r.paging_rate < r.seconds


def unmapped_leaf_fault(size, page):
    """The address the guest's #PF handler reports (CR2) when the page-table
    leaf that maps vCPU 0's page `page` is cleared before the run: the
    guest's first access under that leaf, which walks its pages in order."""
    from uffdkvm.testing._faults import run_with_fault
    with pytest.raises(uffdkvm.RunError) as info:
        run_with_fault(vcpus=1, mem_per_vcpu="4M", guest_page_size=size, fault="guest_fault",
                       after=page)
    m = re.search(r"#PF page fault .* cr2=(0x[0-9a-f]+)", str(info.value))
    assert m, str(info.value)
    return int(m.group(1), 16)


@pytest.mark.parametrize("page", [100, 600])
def test_guest_page_size_sets_what_one_page_table_leaf_maps(kvm, page):
    """guest_page_size decides the guest's page-table levels, so a leaf (a
    PTE, or a PDE with PS set) maps 4 KiB or 2 MiB: with 2M the one cleared
    leaf takes the whole 2 MiB page around `page` away, and the guest faults
    on the first 4 KiB of it; with 4K on `page` itself. What the guest's own
    exception report says, not the config kept."""
    needs_test_hooks("clears one page-table leaf")
    small_pages = unmapped_leaf_fault("4K", page)
    huge_pages = unmapped_leaf_fault("2M", page)
    region = small_pages - page * 4096   # the region's first guest address
    assert region % (1 << 30) == 0, hex(small_pages)
    assert huge_pages == region + (page * 4096 & ~((2 << 20) - 1)), (hex(huge_pages), page)
    assert huge_pages != small_pages or page % 512 == 0


def test_random_order_depends_on_the_seed_and_still_verifies(kvm):
    """The order the kernel reported the faults in (one vCPU, one reader: one
    fault at a time, so the guest's access order) is a permutation of the
    pages that the seed picks. Sequential and reverse: tests/core/test_effects_guest.py."""
    def order(seed):
        r = small(vcpus=1, mem_per_vcpu="1M", readers=1, pattern="random", seed=seed,
                  trace_faults=True)
        assert r.faults == 256
        t = r.fault_trace
        first = min(t.gpa)
        return np.array([(gpa - first) // 4096 for _, gpa in sorted(zip(t.read_ns, t.gpa))])

    a, b, again = order(1), order(2), order(1)
    for o in (a, b):
        assert sorted(o.tolist()) == list(range(256)), "every page exactly once"
        assert np.any(np.diff(o) < 0) and np.any(np.diff(o) > 0), \
            "neither ascending nor descending"
        # Not a near-sequential shuffle: consecutive accesses jump around.
        assert np.median(np.abs(np.diff(o))) > 256 / 8
    assert a.tolist() == again.tolist(), "the same seed, the same order"
    # Two independent permutations of 256 agree in about one place.
    assert np.sum(a == b) < 16, "another seed, another order"
