"""The suite's fixtures and pytest hooks, and nothing else: what the tests
share besides fixtures is in helpers/, imported from there by name.

Every skip cites a host fact (helpers/hostfacts.py, loaded as a plugin here;
its docstring says how to use and add facts): the session lists the skips at
the end and fails on one that no fact explains. Tests that need KVM and
userfaultfd take the ``kvm`` fixture; ``run_or_skip()`` (helpers/runs.py)
runs a config and skips, citing the facts that can stop that config, on
HostUnsupportedError; anything else skips with ``host_skip(FACT, detail)``::

    from helpers.hostfacts import NO_HUGEPAGES_2M, host_skip
"""
import os
import signal

import pytest

# The helpers' asserts explain themselves as the tests' do: pytest rewrites
# a module it is told of before its first import, which is below.
pytest.register_assert_rewrite("helpers")

from helpers import machine_lock  # noqa: E402
from helpers.hostfacts import HUGEPAGE_POOLS, add_hugepages, remove_hugepages  # noqa: E402
from helpers.resources import assert_released, resources  # noqa: E402
from helpers.skips import needs_io_uring, needs_keys, needs_loopback, skip_without_kvm  # noqa: E402

import uffdkvm  # noqa: E402

pytest_plugins = ("pytester", "helpers.hostfacts")

# A session started with SIGINT ignored (a background job of a shell without
# job control, nohup) would see every Ctrl-C test fail, or hang in a run
# that only Ctrl-C ends; and its children would inherit the ignore. Python's
# own handler back, here in the main thread: the children then start with
# the default, and install theirs.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, the tests in the order machine_lock.order gives
    (pyproject's --no-loadscope-reorder keeps xdist's own away)."""
    if hasattr(config, "workerinput"):
        machine_lock.order(items)


@pytest.fixture(scope="session")
def _machine_hold(request, tmp_path_factory):
    """This worker's hold on the machine; its lock files are in the session's
    temporary directory, which holds each worker's own (no workers: nothing
    is locked)."""
    directory = None
    if hasattr(request.config, "workerinput"):
        directory = str(tmp_path_factory.getbasetemp().parent)
    hold = machine_lock.Hold(directory)
    request.config.stash[machine_lock.HOLD] = hold
    yield hold
    hold.leave()


@pytest.fixture(autouse=True)
def _machine(_machine_hold, request):
    """Tests beside each other under pytest-xdist, and an ``alone`` test with
    the machine to itself (tests/helpers/machine_lock.py); let go after the
    test by pytest_runtest_teardown below."""
    _machine_hold.enter(machine_lock.is_alone(request.node))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After each test's teardown, the machine let go unless this test and
    the worker's next are both alone (then the next keeps it). Here rather
    than in _machine's teardown, so that it is let go also after a test that
    never reached the fixture (skipped by a marker, a module fixture that
    failed)."""
    try:
        return (yield)
    finally:
        hold = item.config.stash.get(machine_lock.HOLD, None)
        if hold is not None and not (machine_lock.is_alone(item) and
                                     machine_lock.is_alone(nextitem)):
            hold.leave()


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
    skip_without_kvm(kvm_reason)


@pytest.fixture(scope="session", autouse=True)
def hugepages():
    """As root, adds to the huge page pools what the tests need at once
    (HUGEPAGE_POOLS), for the session, and takes the same number out after
    (add_hugepages: by count and under a lock, so that sessions running at
    once do not take each other's pages). For every session, from its
    start: each of pytest-xdist's workers is a session, and a test that
    pages through huge pages beside another must find both workers' there.
    Without root, the tests that need huge pages skip citing NO_HUGEPAGES_2M
    or NO_HUGEPAGES_1G."""
    added = {}
    if os.geteuid() == 0:
        for size_kb, want in HUGEPAGE_POOLS.items():
            try:
                added[size_kb] = add_hugepages(size_kb, want)
            except OSError:
                pass  # no such pool here: its tests skip, citing the fact
    yield
    for size_kb, count in added.items():
        remove_hugepages(size_kb, count)


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    """An 8 MiB snapshot file (make_snapshot), one per test module, as a str:
    enough for the largest region a module pages from it (2 vCPUs of 4 MiB;
    a smaller run takes its first bytes), and served as it is by the page
    server tests. Under pytest's temporary directory, not /dev/shm: a tmpfs
    file could not be made cold (source_cache="cold")."""
    return uffdkvm.make_snapshot(tmp_path_factory.mktemp("snapshot") / "mem.img", 8 << 20)


@pytest.fixture
def released():
    """Asserts, after the test, that every fd and thread it made is gone."""
    before = resources()
    yield before
    assert_released(before)
