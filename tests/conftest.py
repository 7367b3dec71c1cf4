"""Capabilities of this host, probed once, and the small runs tests share.

Every skip cites a host fact (tests/hostfacts.py, loaded as a plugin here;
its docstring says how to use and add facts): the session lists the skips at
the end and fails on one that no fact explains. Tests that need KVM and
userfaultfd take the ``kvm`` fixture; ``run_or_skip()`` runs a config and
skips, citing the facts that can stop that config, on HostUnsupportedError;
anything else skips with ``host_skip(FACT, detail)``::

    from conftest import host_skip, NO_HUGEPAGES_2M
"""
import os
import signal
import time

import pytest

pytest.register_assert_rewrite("hostfacts", "broken_host")

import machine_lock  # noqa: E402
import uffdkvm  # noqa: E402
from hostfacts import (  # noqa: F401 - re-exported for the tests
    ALL_CPU_NUMBERS_USABLE, BUILT_WITHOUT_TEST_HOOKS, FACTS, HUGEPAGE_POOLS,
    KVM_TAKES_EVERY_CONFIG_VCPUS, LOOPBACK_DOWN, NO_1G_GUEST_PAGES, NOT_A_GIT_CHECKOUT,
    NO_ASAN_RUNTIME, NO_CC, NO_DEV_USERFAULTFD,
    GUEST_MEMFD_BYPASSES_UFFD, NO_GUEST_MEMFD, NO_GUEST_MEMFD_UFFD, NO_HUGEPAGES_1G, NO_HUGEPAGES_2M, NO_KVM,
    NO_KVM_TSC_OFFSET, NO_STEADY_KVM_TSC_OFFSET,
    NO_KVM_STATS, NO_MEMAVAILABLE, NO_THP, NO_TSAN_RUNTIME, NO_UFFD_MINOR_HUGETLBFS,
    NO_UFFD_MINOR_SHMEM, NO_USERFAULTFD, NOT_ROOT, UNPRIVILEGED_USERFAULTFD, Fact,
    add_hugepages, cpus_unavailable, fact, fewer_cpus_than, facts_for_run, host_skip, mem_available_below,
    mem_info, missing_module, missing_tool, nofile_hard_limit_below, remove_hugepages)
from hostfacts import BUILT_WITHOUT_LIBURING, NO_IO_URING_UFFD  # noqa: F401, E402
from hostfacts import WITHOUT_LIBCRYPTO  # noqa: E402

pytest_plugins = ("pytester", "hostfacts")

# A session started with SIGINT ignored (a background job of a shell without
# job control, nohup) would see every Ctrl-C test fail, or hang in a run
# that only Ctrl-C ends; and its children would inherit the ignore. Python's
# own handler back, here in the main thread: the children then start with
# the default, and install theirs.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# What stops every experiment: the kvm fixture cites these.
KVM_FACTS = (NO_KVM, NO_USERFAULTFD)

# Small enough to keep each run well under a second, large enough that every
# reader sees work: 2 vCPUs x 16 MiB is 8192 faults.
SMALL = dict(vcpus=2, mem_per_vcpu="16M")
SMALL_PAGES = 2 * 16 * 1024 * 1024 // 4096

IS_ROOT = os.geteuid() == 0

# Fault injection (uffdkvm.testing._faults) is only in builds made with
# UFFDKVM_TEST_HOOKS=1; tests that inject skip elsewhere, citing the fact.
TEST_HOOKS = uffdkvm._core.TEST_HOOKS


def needs_test_hooks(detail="injects a failure", *, allow_module_level=False):
    """Skips, citing BUILT_WITHOUT_TEST_HOOKS, in a build without fault injection."""
    __tracebackhide__ = True
    if not TEST_HOOKS:
        host_skip(BUILT_WITHOUT_TEST_HOOKS, f"{detail}: build with UFFDKVM_TEST_HOOKS=1",
                  allow_module_level=allow_module_level)


def needs_io_uring(detail='wait="io_uring"'):
    """Skips, citing the fact, where this build or kernel cannot run
    wait="io_uring" (a build without liburing; a kernel that cannot wait for
    a uffd through io_uring)."""
    __tracebackhide__ = True
    if not uffdkvm._core.HAVE_IO_URING:
        host_skip(BUILT_WITHOUT_LIBURING, f"{detail}: build with liburing (liburing-dev)")
    if NO_IO_URING_UFFD.holds:
        host_skip(NO_IO_URING_UFFD, f"{detail}: {NO_IO_URING_UFFD.evidence}")


def needs_loopback(detail="talks TCP on 127.0.0.1"):
    """Skips, citing LOOPBACK_DOWN, where lo is not up (a page server over
    transport="tcp" listens on 127.0.0.1)."""
    __tracebackhide__ = True
    if LOOPBACK_DOWN.holds:
        host_skip(LOOPBACK_DOWN, f"{detail}: {LOOPBACK_DOWN.evidence}")


def needs_keys(detail="a page server with a key (every TCP one)"):
    """Skips, citing WITHOUT_LIBCRYPTO, where uffdkvm cannot check keys."""
    __tracebackhide__ = True
    if WITHOUT_LIBCRYPTO.holds:
        host_skip(WITHOUT_LIBCRYPTO, f"{detail}: {WITHOUT_LIBCRYPTO.evidence}")


@pytest.fixture(scope="session")
def _machine_lock_dir(request, tmp_path_factory):
    """Where pytest-xdist's workers keep the machine's lock files: the
    session's temporary directory, which holds each worker's own; None
    without workers."""
    if not hasattr(request.config, "workerinput"):
        return None
    return str(tmp_path_factory.getbasetemp().parent)


@pytest.fixture(autouse=True)
def _machine(request, _machine_lock_dir):
    """Tests beside each other under pytest-xdist, and an ``alone`` test with
    the machine to itself (tests/machine_lock.py)."""
    alone = request.node.get_closest_marker("alone") is not None
    with machine_lock.machine(_machine_lock_dir, alone):
        yield


@pytest.fixture(autouse=True)
def _io_uring_cases(request):
    """A parametrized test's io_uring case (wait="io_uring", or an id that
    names io_uring) runs only where io_uring can, and skips elsewhere, citing
    the fact; its TCP case (transport="tcp") only where loopback is up."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and (callspec.params.get("wait") == "io_uring" or
                                 "io_uring" in callspec.id):
        needs_io_uring()
    if callspec is not None and callspec.params.get("transport") == "tcp":
        needs_loopback('transport="tcp"')
        needs_keys('transport="tcp"')


def run_with_fault(*args, **kwargs):
    """uffdkvm.testing._faults.run_with_fault(), or a skip in a build without test hooks."""
    __tracebackhide__ = True
    needs_test_hooks()
    from uffdkvm.testing._faults import run_with_fault as run
    return run(*args, **kwargs)


@pytest.fixture(scope="session")
def kvm_reason():
    """None when this host can run experiments, else why not."""
    try:
        uffdkvm.run(vcpus=1, mem_per_vcpu="64K")
    except uffdkvm.HostUnsupportedError as e:
        return str(e)
    return None


def skip_without_kvm(kvm_reason):
    """Skips, citing the host facts, when kvm_reason says the host cannot
    run experiments (for fixtures whose scope is wider than kvm's)."""
    __tracebackhide__ = True
    if kvm_reason:
        host_skip(KVM_FACTS, f"host cannot run experiments: {kvm_reason}")


@pytest.fixture
def kvm(kvm_reason):
    skip_without_kvm(kvm_reason)


def _cpu_list(text):
    """ "0-2,5" as {0, 1, 2, 5}."""
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cpus)


def run_watching_affinity(**fields):
    """Runs an experiment that must verify, while another thread reads
    every thread's Cpus_allowed_list from /proc/self/task/TID/status: the
    kernel's own record of where each may run, independent of what the
    threads report of themselves. Returns (result, {tid: CPUs}), each
    thread's last reading (after it pinned itself: it pins as it starts)."""
    import threading
    seen, done = {}, threading.Event()

    def watch():
        while not done.is_set():
            for tid in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{tid}/status") as f:
                        for line in f:
                            if line.startswith("Cpus_allowed_list:"):
                                seen[int(tid)] = _cpu_list(line.split(":")[1].strip())
                except OSError:
                    pass  # the thread left
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        r = uffdkvm.run(**fields)
    finally:
        done.set()
        watcher.join()
    assert r.verified, r.verify_message
    return r, seen


def small(**fields):
    """A small experiment that must verify."""
    r = uffdkvm.run(**{**SMALL, **fields})
    assert r.verified, r.verify_message
    assert r.bad_pages == 0
    return r


@pytest.fixture(scope="session", autouse=True)
def hugepages():
    """As root, adds to the huge page pools what the tests need at once
    (HUGEPAGE_POOLS), for the session, and takes the same number out after
    (add_hugepages: by count and under a lock, so that sessions running at
    once do not take each other's pages). For every session, from its
    start: each of pytest-xdist's workers is a session, and a test that
    pages through huge pages beside another must find both workers' there.
    Without root, the tests that need huge pages skip citing
    NO_HUGEPAGES_2M or NO_HUGEPAGES_1G."""
    added = {}
    if IS_ROOT:
        for size_kb, want in HUGEPAGE_POOLS.items():
            try:
                added[size_kb] = add_hugepages(size_kb, want)
            except OSError:
                pass  # no such pool here: its tests skip, citing the fact
    yield
    for size_kb, count in added.items():
        remove_hugepages(size_kb, count)


def no_stages(r, why):
    """r's guest stamps were put on no clock, for the reason that starts with
    why (Result.clock_sync_message): no bound, no stage anywhere, and blocked
    time from the readers' own clock; the guest's own view of its accesses
    still whole."""
    __tracebackhide__ = True
    assert r.verified, r.verify_message
    assert r.clock_sync is None and r.clock_error_ns is None and r.misordered_faults is None
    assert r.clock_sync_message and r.clock_sync_message.startswith(why), r.clock_sync_message
    for v in r.vcpus:
        assert v.queue_latency is v.resume_latency is v.fault_latency is None
        assert v.service_latency.count == v.faults + v.eexist
        assert v.access_latency.count > 0
    for x in r.readers:
        assert x.queue_latency is None
    if r.fault_trace is not None:
        assert set(r.fault_trace.raised_ns) == {None} == set(r.fault_trace.resumed_ns)


def guest_clock_converted(r):
    """Whether r (guest_timing, stats="full") put the guest's stamps on the
    readers' clock, asserting that it did what this host allows: where KVM
    moves each vCPU's TSC offset as its thread comes and goes (the host
    kernel marked its TSC unstable: Debian's 6.1 booted nested), the stamps
    are the host's TSC plus no one offset, and the run must say so and give
    no stage (False); elsewhere it must convert them (True). Where KVM does
    not report its offset (before Linux 5.16), no run can tell which holds."""
    __tracebackhide__ = True
    if NO_KVM_TSC_OFFSET.holds:
        host_skip(NO_KVM_TSC_OFFSET, "needs KVM's TSC offset to tell whether the guest's "
                  "clock kept one offset from the host's")
    if NO_STEADY_KVM_TSC_OFFSET.holds:
        no_stages(r, "KVM's TSC offset of vCPU ")
        assert " moved during the run " in r.clock_sync_message, r.clock_sync_message
        return False
    assert r.clock_sync is not None, r.clock_sync_message
    assert r.clock_sync_message is None
    return True


def run_or_skip(**fields):
    """Runs an experiment that must verify; on HostUnsupportedError, skips
    citing the facts that can stop this config (facts_for_run)."""
    __tracebackhide__ = True
    try:
        r = uffdkvm.run(**fields)
    except uffdkvm.HostUnsupportedError as e:
        host_skip(facts_for_run(**fields), f"this host cannot: {e}")
    assert r.verified, r.verify_message
    return r


def resources():
    """What a run must give back: this process's open fds and threads, and
    its memory mappings (a leaked mapping shows as one more line). A failed
    run may still be handing its memory back in the background: wait for it
    (with _core's wait_idle, which every build has; uffdkvm.testing._faults's
    only adds the exception type)."""
    uffdkvm._core.wait_idle()
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
