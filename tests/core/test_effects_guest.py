"""The guest's knobs change what the guest does, as the kernel saw it.

pattern, seed, write_percent, passes and guest_work each checked against a
record the counting code did not make: the fault trace (one kernel message
per fault, with its address and the kernel's write flag), the guest's own
access count, the core's absolute pass clocks, and KVM's instruction count.
"""
import numpy as np
import pytest
from scipy import stats

from helpers.evidence import Trace, run_keeping_core_output
from helpers.runs import small

pytestmark = pytest.mark.kvm

PAGES = 256  # 1 MiB


def access_order(**fields):
    """The pages one vCPU faulted on, in the order its one reader read them:
    the vCPU waits out each fault, so this is the guest's access order."""
    r = small(vcpus=1, mem_per_vcpu="1M", readers=1, trace_faults=True, **fields)
    t = Trace(r.fault_trace)
    assert len(t) == PAGES and not t.eexist.any()
    assert np.all(np.diff(t.read_ns) > 0), "one reader reads one fault at a time"
    return t.pages()


def test_sequential_walks_up_and_reverse_walks_down(kvm):
    # random, a seeded permutation: tests/core/test_workload.py
    assert access_order(pattern="sequential").tolist() == list(range(PAGES))
    assert access_order(pattern="reverse").tolist() == list(range(PAGES))[::-1]


def written_pages(write_percent, seed, mem="4M"):
    r = small(vcpus=1, mem_per_vcpu=mem, readers=1, write_percent=write_percent, seed=seed,
              pattern="random", trace_faults=True)
    t = Trace(r.fault_trace)
    assert len(t) == r.config.region_bytes // 4096
    return t.pages(), t.write


@pytest.mark.parametrize("write_percent", [0, 30, 100])
def test_write_percent_is_the_share_of_pages_the_kernel_saw_written(kvm, write_percent):
    """The trace's write column is the kernel's UFFD_PAGEFAULT_FLAG_WRITE."""
    _, write = written_pages(write_percent, seed=1)
    n, k = len(write), int(write.sum())
    if write_percent in (0, 100):
        assert k == n * write_percent // 100
    else:
        # Each page is written with probability 30%: a binomial count.
        assert stats.binomtest(k, n, write_percent / 100).pvalue > 1e-3, (k, n)


def test_the_pages_written_are_chosen_per_page_by_the_seed(kvm):
    pages_a, write_a = written_pages(30, seed=1)
    pages_b, write_b = written_pages(30, seed=1)
    pages_c, write_c = written_pages(30, seed=2)
    written = [set(p[w].tolist()) for p, w in
               ((pages_a, write_a), (pages_b, write_b), (pages_c, write_c))]
    assert written[0] == written[1], "the same seed writes the same pages"
    assert written[0] != written[2], "another seed writes other pages"
    # Independent 30% choices share about 30% of the written pages.
    assert len(written[0] & written[2]) < 0.5 * len(written[0])


def test_later_passes_walk_again_without_faulting(kvm, monkeypatch):
    # A guest that only reads: a page faulted in again reads the same data,
    # so verification alone would not notice a later pass faulting.
    passes = 3
    r, raw = run_keeping_core_output(monkeypatch, vcpus=2, mem_per_vcpu="1M", readers=1,
                                     passes=passes, pattern="random", seed=3,
                                     write_percent=0, trace_faults=True)
    assert r.verified, r.verify_message
    t = Trace(r.fault_trace)
    # Each page faulted once, in all passes together.
    assert r.faults == len(t) == 2 * PAGES
    assert sorted(t.pages().tolist()) == list(range(2 * PAGES))
    # ... and every fault was read before its vCPU ended its first pass (the
    # core's own clock at the guest's end-of-pass port write). Read, not
    # resolved: the resolving ioctl wakes the vCPU before it returns, so the
    # last fault's resolved stamp can come after the pass ended.
    for v in raw["vcpus"]:
        first_pass_end = v["pass_end_ns"][0]
        mine = t.vcpu == v["index"]
        assert mine.sum() == PAGES
        assert t.read_ns[mine].max() < first_pass_end
        assert len(v["pass_end_ns"]) == passes
    # The guest counts its own accesses: every page, every pass.
    assert [v.pages for v in r.vcpus] == [PAGES * passes] * 2


def test_guest_work_adds_guest_instructions_and_time_per_page(kvm):
    """guest_work=W runs W iterations of a 4-instruction loop after each
    access. Where KVM emulates guest instructions (software virtualization),
    it counts every one (insn_emulation); everywhere, the walk slows down.
    prefault=True and the passes after the first: no faults, the guest alone."""
    work, pages, passes = 300, 64, 4

    def walk(guest_work):
        r = small(vcpus=1, mem_per_vcpu=f"{pages * 4}K", prefault=True, passes=passes,
                  guest_work=guest_work)
        assert r.faults == 0
        return r.vcpus[0]

    plain, worked = walk(0), walk(work)
    # Time per page of the fastest fault-free pass (a loaded host preempts
    # some): the loop costs at least a few times the bare access (about 30x
    # here).
    assert min(worked.pass_seconds[1:]) > 4 * min(plain.pass_seconds[1:]), \
        (plain.pass_seconds, worked.pass_seconds)
    emulated = plain.kvm_stats.get("insn_emulation")
    if not emulated:
        return  # hardware virtualization: the kernel does not see guest instructions
    extra_per_page = (worked.kvm_stats["insn_emulation"] - emulated) / (passes * pages)
    assert 4 * work <= extra_per_page <= 4 * work + 8, extra_per_page
