"""Capabilities of this host, probed once, and the small runs tests share.

Tests that need KVM and userfaultfd take the ``kvm`` fixture: where the host
lacks either, they skip with the exact HostUnsupportedError message.
"""
import os
import time

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


HUGEPAGE_POOLS = {  # huge page size in kB -> pages the tests may need at once
    2048: 16,
    1048576: 1,
}


def _read_int(path):
    with open(path) as f:
        return int(f.read())


def _write_int(path, value):
    with open(path, "w") as f:
        f.write(str(value))


@pytest.fixture(scope="session")
def hugepages():
    """As root, grow the huge page pools to what the tests need, for the
    session only: the pools go back to their sizes afterwards. Without root
    the tests that need huge pages skip with the reason the run gave."""
    restore = {}
    for size_kb, want in HUGEPAGE_POOLS.items():
        base = f"/sys/kernel/mm/hugepages/hugepages-{size_kb}kB"
        try:
            total, free = _read_int(f"{base}/nr_hugepages"), _read_int(f"{base}/free_hugepages")
        except OSError:
            continue
        if IS_ROOT and free < want:
            try:
                _write_int(f"{base}/nr_hugepages", total + want - free)
                restore[base] = total
            except OSError:
                pass
    yield
    for base, total in restore.items():
        _write_int(f"{base}/nr_hugepages", total)


def run_or_skip(**fields):
    """Runs an experiment that must verify; skips with the host's reason if
    this host cannot run it."""
    try:
        r = uffdkvm.run(**fields)
    except uffdkvm.HostUnsupportedError as e:
        pytest.skip(f"this host cannot: {e}")
    assert r.verified, r.verify_message
    return r


def resources():
    """What a run must give back: this process's open fds and threads, and
    its memory mappings (a leaked mapping shows as one more line). A failed
    run may still be handing its memory back in the background: wait for it."""
    from uffdkvm._testing import wait_idle
    wait_idle()
    with open("/proc/self/maps") as f:
        maps = sum(1 for _ in f)
    return {"fds": len(os.listdir("/proc/self/fd")),
            "threads": len(os.listdir("/proc/self/task")),
            "maps": maps}


def assert_released(before, within_s=1.0, maps_slack=None):
    """fds and threads are back to `before` (a joined thread can stay in
    /proc/self/task for a moment after pthread_join returns, so wait a
    little). Maps are compared when maps_slack is given: the interpreter's
    own allocator may map or unmap an arena in between."""
    # A leak adds; a thread of an earlier test (a dask worker, a timer) may
    # end meanwhile, so fewer is fine.
    deadline = time.monotonic() + within_s
    while True:
        now = resources()
        ok = now["fds"] <= before["fds"] and now["threads"] <= before["threads"]
        if maps_slack is not None:
            ok = ok and abs(now["maps"] - before["maps"]) <= maps_slack
        if ok or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert now["fds"] <= before["fds"], f"open fds: {before['fds']} -> {now['fds']}"
    assert now["threads"] <= before["threads"], \
        f"threads: {before['threads']} -> {now['threads']}"
    if maps_slack is not None:
        assert abs(now["maps"] - before["maps"]) <= maps_slack, \
            f"memory mappings: {before['maps']} -> {now['maps']}"


@pytest.fixture
def released():
    """Asserts, after the test, that every fd and thread it made is gone."""
    before = resources()
    yield before
    assert_released(before)


def mem_info(key):
    """A /proc/meminfo value in bytes (e.g. "MemAvailable"), or None."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None
