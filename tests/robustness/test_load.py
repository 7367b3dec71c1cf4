"""Load: far more threads than cores, and a region of several GiB.

64 vCPUs and 64 readers on one uffd on a 2-core host, and 4 GiB demand-paged
and verified. The large run faults in all of 4 GiB and checks every 4 KiB
page afterwards, which takes seconds even in its cheapest form; it is
marked slow (it still runs by default; -m "not slow" leaves it out).
"""
import pytest

from helpers.hostfacts import host_skip, mem_available_below, mem_info
from helpers.runs import small

# alone (tests/helpers/machine_lock.py): a 4 GiB region paged within a time bound.
pytestmark = [pytest.mark.kvm, pytest.mark.alone]

WAITS = ["poll", "epoll", "epoll_exclusive", "read", "io_uring"]


@pytest.mark.parametrize("wait", WAITS)
def test_64_vcpus_and_64_readers_on_one_uffd(kvm, released, wait):
    r = small(vcpus=64, mem_per_vcpu="256K", single_uffd=True, readers=64, wait=wait,
              timeout_s=60)
    assert r.faults == 64 * 64 and r.eexist == 0
    assert len(r.vcpus) == 64 and len(r.readers) == 64
    assert all(v.pages == 64 for v in r.vcpus)


def test_64_vcpus_each_with_its_own_uffd(kvm, released):
    r = small(vcpus=64, mem_per_vcpu="256K", readers=1, wait="read", timeout_s=60)
    assert r.uffds == 64 and r.faults == 64 * 64
    assert all(x.faults == 64 for x in r.readers)


def test_64_vcpus_overlapping_on_one_region(kvm, released):
    r = small(vcpus=64, mem_per_vcpu="256K", overlap=True, readers=64, wait="epoll_exclusive",
              pattern="random", write_percent=50, timeout_s=60)
    assert r.faults == 64


@pytest.mark.slow
def test_a_4_gib_region_demand_pages_and_verifies(kvm, released):
    """The cheapest honest 4 GiB: 2 MiB pages (anonymous THP) resolved with
    UFFDIO_COPY and mapped by the guest with 2 MiB pages, so 2048 faults
    and few exits. The guest touches a seeded tenth of the 4 KiB pages,
    spread over all 4 GiB (each 2 MiB page holds 512: every one is
    touched, and faults); the host still verifies every 4 KiB page. All of
    them took 8-20 s where the guest is emulated, a tenth 1-3 s."""
    size = 4 << 30
    if (mem_info("MemAvailable") or 0) < size + (1 << 30):
        host_skip(mem_available_below(size + (1 << 30)), "needs 5 GiB of available memory")
    r = small(vcpus=2, mem_per_vcpu="2G", backing="anonymous_thp", guest_page_size="2M",
              readers=2, touch_percent=10, timeout_s=600)
    assert r.faults == size // (2 << 20)
    # About a tenth of each vCPU's 4 KiB pages; every 2 MiB page faulted, so all over it.
    assert all(0.09 < v.pages / ((2 << 30) // 4096) < 0.11 for v in r.vcpus)
