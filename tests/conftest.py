"""Capabilities of this host, probed once, and the small runs tests share.

Tests that need KVM and userfaultfd take the ``kvm`` fixture: where the host
lacks either, they skip with the exact HostUnsupportedError message.
"""
import os

import pytest

import uffdkvm

# Small enough to keep each run well under a second, large enough that every
# reader sees work: 2 vCPUs x 16 MiB is 8192 faults.
SMALL = dict(vcpus=2, mem_per_vcpu="16M")
SMALL_PAGES = 2 * 16 * 1024 * 1024 // 4096

IS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="session")
def kvm_reason():
    """None when this host can run experiments, else why not."""
    try:
        uffdkvm.run(vcpus=1, mem_per_vcpu="64K")
    except uffdkvm.HostUnsupportedError as e:
        return str(e)
    return None


@pytest.fixture
def kvm(kvm_reason):
    if kvm_reason:
        pytest.skip(f"host cannot run experiments: {kvm_reason}")


def small(**fields):
    """A small experiment that must verify."""
    r = uffdkvm.run(**{**SMALL, **fields})
    assert r.verified, r.verify_message
    assert r.bad_pages == 0
    return r
