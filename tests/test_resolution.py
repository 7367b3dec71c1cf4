"""How faults are resolved: copy, zero page, delays, prefault, pinned threads."""
import os

import pytest

import uffdkvm
from conftest import fewer_cpus_than, host_skip, run_watching_affinity, small

pytestmark = pytest.mark.kvm


@pytest.mark.parametrize("backing", ["anonymous", "shmem", "anonymous_thp"])
def test_zeropage_resolves_with_zeros(kvm, backing):
    # Verification checks every byte the guest did not write is zero, and
    # that every page the guest read summed to zero.
    r = small(mem_per_vcpu="4M", resolve="zeropage", backing=backing, write_percent=50)
    assert r.faults == 2 * (4 << 20) // r.page_size


def test_zeropage_is_refused_where_it_cannot_work():
    with pytest.raises(uffdkvm.ConfigError, match="^resolve:"):
        uffdkvm.Config(resolve="zeropage", uffd_mode="minor", backing="shmem")
    with pytest.raises(uffdkvm.ConfigError, match="hugetlb"):
        uffdkvm.Config(resolve="zeropage", backing="anonymous_hugetlb", mem_per_vcpu="2M")


@pytest.mark.parametrize("dist", ["fixed", "uniform", "exponential"])
def test_delay_distributions_have_the_configured_mean(kvm, dist):
    r = small(vcpus=1, mem_per_vcpu="1M", delay_us=1000, delay_dist=dist, seed=5)
    busy = sum(x.busy_seconds for x in r.readers)
    # 256 faults with a mean delay of 1 ms: the sleeps alone add up to about
    # 0.256 s (seeded, so the same draws every run; oversleeping only adds).
    # Each distribution's shape, and the seeding: test_effects_resolution.py.
    assert 0.256 * 0.7 < busy < 0.256 * 3


@pytest.mark.parametrize("mode,backing", [("missing", "anonymous"), ("minor", "shmem"),
                                          (None, "anonymous")])
def test_prefault_leaves_nothing_to_fault(kvm, mode, backing):
    r = small(mem_per_vcpu="4M", prefault=True, uffd_mode=mode, backing=backing,
              write_percent=50)
    assert r.faults == 0
    assert all(x.wakeups == 0 for x in r.readers)


def test_threads_run_where_they_were_pinned(kvm):
    cpus = sorted(os.sched_getaffinity(0))
    vcpu_pins, reader_pins = cpus[::-1], cpus
    r, kernel = run_watching_affinity(vcpus=3, readers=2, pin_vcpus=vcpu_pins,
                                      pin_readers=reader_pins, mem_per_vcpu="4M", delay_us=300)
    # Each thread reports the affinity it saw from inside itself, and the
    # kernel says the same of it.
    for v in r.vcpus:
        assert v.cpus == (vcpu_pins[v.index % len(vcpu_pins)],)
        assert kernel[v.tid] == set(v.cpus)
    for k, x in enumerate(sorted(r.readers, key=lambda x: (x.uffd, x.index))):
        assert x.cpus == (reader_pins[k % len(reader_pins)],)
        assert kernel[x.tid] == set(x.cpus)


def test_unpinned_threads_may_run_anywhere_beside_pinned_ones(kvm):
    """vCPUs pinned, readers not, in one run: the readers keep every CPU the
    process may use (in the kernel's record too), while the vCPUs have their
    one. A run that pinned nothing, or everything, fails this."""
    allowed = frozenset(os.sched_getaffinity(0))
    if fewer_cpus_than(2).holds:
        host_skip(fewer_cpus_than(2), "needs two CPUs to tell pinned from unpinned")
    pin = min(allowed)
    r, kernel = run_watching_affinity(vcpus=2, readers=1, pin_vcpus=[pin], mem_per_vcpu="4M",
                                      delay_us=300)
    for v in r.vcpus:
        assert v.cpus == (pin,)
        assert kernel[v.tid] == {pin}
    for x in r.readers:
        assert x.cpus == tuple(sorted(allowed))
        assert kernel[x.tid] == allowed


def test_pinning_to_a_cpu_the_process_cannot_use_is_a_host_error(kvm):
    with pytest.raises(uffdkvm.HostUnsupportedError, match="^pin_vcpus: CPU 1000 "):
        uffdkvm.run(mem_per_vcpu="1M", pin_vcpus=[1000])
