"""What UFFDIO_COPY copies huge pages from: a page must be whole when the copy
makes it present (a vCPU may read it that very moment), so its data, the
address words included, go in with the copy. 2 MiB pages: a source of each
reader's own; 1 GiB pages, too large for that: one source per uffd, stamped
and copied under a lock (the readers of a uffd take turns with it). Each is a memfd mapping named in /proc/self/maps
("uffdkvm-reader-source", "uffdkvm-source"), which is how these tests count
them, and each is counted in run()'s memory check. 4 KiB pages keep an
anonymous page per reader.
"""
import threading
import time

import pytest

import uffdkvm
from helpers.runs import run_or_skip
from uffdkvm.config import BACKING_PAGE_SIZES

pytestmark = pytest.mark.kvm

MiB = 1 << 20


def sources_during(fields, delay_us=20_000):
    """Runs fields (slowed by delay_us per fault) while sampling
    /proc/self/maps; returns the result and the most copy-source mappings
    seen at once, as (name, bytes) pairs."""
    seen, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            now = []
            with open("/proc/self/maps") as f:
                for line in f:
                    if "memfd:uffdkvm-reader-source" in line or "memfd:uffdkvm-source" in line:
                        start, end = (int(x, 16) for x in line.split()[0].split("-"))
                        now.append((line.split("/memfd:")[1].split()[0], end - start))
            seen.append(now)
            time.sleep(0.005)

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        r = run_or_skip(**fields, delay_us=delay_us)
    finally:
        stop.set()
        thread.join()
    return r, max(seen, key=len)


LAYOUTS = {
    "uffd-per-vcpu": dict(vcpus=2, readers=4),
    "single-uffd": dict(vcpus=2, readers=8, single_uffd=True),
    "overlap": dict(vcpus=3, readers=4, overlap=True),
}


@pytest.mark.parametrize("backing", ["anonymous_thp", "anonymous_hugetlb"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_2m_pages_copy_from_a_source_per_reader(kvm, hugepages, backing, layout):
    fields = LAYOUTS[layout]
    r, sources = sources_during(dict(fields, mem_per_vcpu="4M", backing=backing))
    assert r.faults == r.config.region_bytes // (2 * MiB)
    assert sources == [("uffdkvm-reader-source", 2 * MiB)] * len(r.readers), sources


def test_1g_pages_copy_from_one_source_per_uffd(kvm, hugepages):
    # The guest touches 1% of the page's 4 KiB pages: all 262,144 take some
    # 10 s where the guest is emulated, and the one fault is the same.
    r, sources = sources_during(dict(vcpus=1, mem_per_vcpu="1G", readers=4, touch_percent=1,
                                     backing="anonymous_hugetlb_1gb"), delay_us=200_000)
    assert r.faults == 1
    assert sources == [("uffdkvm-source", 1 << 30)], sources


def test_4k_pages_need_no_shared_source(kvm):
    r, sources = sources_during(dict(vcpus=2, mem_per_vcpu="1M", readers=4), delay_us=2000)
    assert r.faults == 512
    assert sources == []


@pytest.mark.parametrize("backing", ["anonymous_thp", "anonymous_hugetlb", "shared_hugetlb"])
@pytest.mark.parametrize("layout", ["uffd-per-vcpu", "single-uffd", "overlap"])
def test_huge_pages_arrive_whole_with_many_readers(kvm, hugepages, backing, layout):
    """Every page verifies, word for word, with readers racing: for overlap,
    vCPUs touch the same pages at once and most faults are EEXIST echoes."""
    fields = {"uffd-per-vcpu": dict(vcpus=2), "single-uffd": dict(vcpus=2, single_uffd=True),
              "overlap": dict(vcpus=3, overlap=True)}[layout]
    r = run_or_skip(**fields, mem_per_vcpu="8M", backing=backing, readers=4,
                    write_percent=50, passes=2)
    page = BACKING_PAGE_SIZES[backing]
    assert r.faults == r.config.region_bytes // page
    assert r.bad_pages == 0


def test_a_1g_page_run_counts_its_source_in_the_memory_check(kvm, monkeypatch):
    """The 1 GiB source of an anonymous_hugetlb_1gb run's uffd is ordinary
    memory, not from the huge page pool: run() refuses it when MemAvailable
    cannot hold it, before anything is built."""
    run_module = __import__("sys").modules["uffdkvm.run"]
    monkeypatch.setattr(run_module, "_mem_available", lambda: (1 << 30) - 1)
    monkeypatch.setattr(uffdkvm._core, "run", lambda *a: pytest.fail("the core was called"))
    with pytest.raises(uffdkvm.HostUnsupportedError) as info:
        uffdkvm.run(vcpus=1, mem_per_vcpu="1G", backing="anonymous_hugetlb_1gb")
    assert str(info.value).startswith("backing: the run copies each 1G page from 1G of "
                                      "ordinary memory"), str(info.value)


def test_a_2m_page_run_counts_its_sources_in_the_memory_check(kvm, monkeypatch):
    """2 uffds x 3 readers: six 2 MiB sources beside the 8 MiB region."""
    run_module = __import__("sys").modules["uffdkvm.run"]
    monkeypatch.setattr(run_module, "_mem_available", lambda: 8 * MiB + 12 * MiB - 1)
    with pytest.raises(uffdkvm.HostUnsupportedError) as info:
        uffdkvm.run(vcpus=2, mem_per_vcpu="4M", backing="anonymous_thp", readers=3)
    assert "the run would demand-page 8M (vcpus * mem_per_vcpu) plus 12M of copy sources, " \
           "more than" in str(info.value), str(info.value)
    # Just enough: it runs.
    monkeypatch.setattr(run_module, "_mem_available", lambda: 8 * MiB + 12 * MiB)
    assert uffdkvm.run(vcpus=2, mem_per_vcpu="4M", backing="anonymous_thp", readers=3).verified
