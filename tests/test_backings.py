"""Every backing x uffd_mode runs and verifies, or says exactly why not."""
import pytest

import uffdkvm
from conftest import run_or_skip
from uffdkvm.config import BACKING_PAGE_SIZES
from uffdkvm.support import modes_for

pytestmark = pytest.mark.kvm

COMBOS = [(b, m) for b in BACKING_PAGE_SIZES for m in modes_for(b)]


def size_for(backing):
    """Small, but at least two of the backing's pages per vCPU."""
    page = BACKING_PAGE_SIZES[backing]
    return (1, page) if page >= 1 << 30 else (2, max(2 * page, 4 << 20))


@pytest.mark.parametrize("backing,mode", COMBOS, ids=[f"{b}-{m}" for b, m in COMBOS])
def test_backing_runs_and_verifies(kvm, hugepages, backing, mode):
    vcpus, mem = size_for(backing)
    r = run_or_skip(vcpus=vcpus, mem_per_vcpu=mem, backing=backing, uffd_mode=mode,
                    readers=2)
    page = BACKING_PAGE_SIZES[backing]
    assert r.page_size == page
    # Faults are resolved a backing page at a time, each exactly once.
    assert r.faults == (0 if mode is None else vcpus * mem // page)
    assert all(v.pages == mem // 4096 for v in r.vcpus)


def test_guest_memfd_with_userfaultfd_says_what_is_missing(kvm):
    try:
        r = uffdkvm.run(mem_per_vcpu="1M", backing="guest_memfd")
    except uffdkvm.HostUnsupportedError as e:
        assert "guest_memfd" in str(e)
    else:  # a kernel with userfaultfd on guest_memfd
        assert r.verified


def test_backing_support_probes_every_combination(kvm):
    support = uffdkvm.backing_support()
    assert set(support) == set(BACKING_PAGE_SIZES)
    for backing, modes in support.items():
        assert set(modes) == set(modes_for(backing))
        for why in modes.values():
            assert why is None or (isinstance(why, str) and why)
    assert support["anonymous"] == {"missing": None, "wp": None, None: None}


def test_too_few_huge_pages_fail_before_the_vm_with_the_fix(kvm):
    """Asking for more huge pages than the pool holds says how many and where."""
    free = int(open("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages").read())
    pages = free + 64
    with pytest.raises(uffdkvm.HostUnsupportedError) as info:
        uffdkvm.run(mem_per_vcpu=pages * (2 << 20), backing="anonymous_hugetlb")
    message = str(info.value)
    assert f"needs {pages} free huge pages of 2 MiB" in message
    assert "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages" in message


def test_no_pool_can_outgrow_the_host(kvm):
    total = int(open("/proc/meminfo").read().split("MemTotal:")[1].split()[0]) * 1024
    with pytest.raises(uffdkvm.HostUnsupportedError, match="^mem_per_vcpu: the run needs"):
        uffdkvm.run(vcpus=2, mem_per_vcpu=(total // 2 + (1 << 30)) >> 21 << 21,
                    backing="anonymous_hugetlb")


def test_hugetlb_sizes_must_be_whole_pages():
    with pytest.raises(uffdkvm.ConfigError, match="mem_per_vcpu: must be a positive multiple "
                                                  "of 2097152"):
        uffdkvm.Config(backing="anonymous_hugetlb", mem_per_vcpu="3M")
    with pytest.raises(uffdkvm.ConfigError, match="1073741824"):
        uffdkvm.Config(backing="anonymous_hugetlb_1gb", mem_per_vcpu="512M")
