"""The guest's side of an experiment: order, reads and writes, passes, page size."""
import numpy as np
import pytest

import uffdkvm
from conftest import run_or_skip, small

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


@pytest.mark.parametrize("size", ["4K", "2M", "1G"])
def test_guest_page_sizes(kvm, size):
    mem = "1G" if size == "1G" else "4M"
    r = run_or_skip(vcpus=1, mem_per_vcpu=mem, guest_page_size=size, uffd_mode=None)
    assert r.config.guest_page_size == size


def test_random_order_depends_on_the_seed_and_still_verifies(kvm):
    """The order the kernel reported the faults in (one vCPU, one reader: one
    fault at a time, so the guest's access order) is a permutation of the
    pages that the seed picks. Sequential and reverse: test_effects_guest.py."""
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
