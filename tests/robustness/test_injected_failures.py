"""Every failure the core can meet mid-run ends the run with the right
exception, errno and a message naming the thread and the call, and gives
back every thread and fd.

The failures are real: uffdkvm.testing._faults makes the core's own code fail at a
chosen point (csrc/testhooks.h, enum ukvm_inject), and the run goes down its
normal error path.
"""
import errno
import re
import runpy
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import uffdkvm
from helpers.hostfacts import NO_UFFD_MOVE, facts_for_run, host_skip
from helpers.resources import assert_released, resources
from helpers.runs import run_or_skip
from helpers.skips import needs_test_hooks

needs_test_hooks("every test here injects a failure", allow_module_level=True)
from uffdkvm.testing._faults import FAULTS, run_with_fault, wait_idle  # noqa: E402

pytestmark = pytest.mark.kvm

TINY = dict(vcpus=2, mem_per_vcpu="1M", readers=2)
PAGES = 2 * 256
WAITS = ["poll", "epoll", "epoll_exclusive", "read", "io_uring"]
GIB = 1 << 30

# (uffd_mode, backing, resolve) -> the ioctl that resolves its faults
RESOLVERS = [
    (("missing", "anonymous", "copy"), "UFFDIO_COPY"),
    (("missing", "anonymous", "zeropage"), "UFFDIO_ZEROPAGE"),
    (("missing", "shmem", "copy"), "UFFDIO_COPY"),
    (("missing", "shmem", "zeropage"), "UFFDIO_ZEROPAGE"),
    (("minor", "shmem", "copy"), "UFFDIO_CONTINUE"),
    (("missing", "anonymous", "move"), "UFFDIO_MOVE"),
    (("wp", "anonymous", "copy"), "UFFDIO_WRITEPROTECT"),
]


@pytest.fixture(autouse=True)
def every_thread_and_fd_given_back(released):
    yield


def test_every_fault_kind_is_tested():
    """A fault added to the core without a test fails this: each entry of
    uffdkvm/schema/faults.py names the test files that inject it, and each
    of them names it (a Python test by its name, a C one by its enumerator).
    The failures are tested here; the rest where their effect is: the clock
    shifts in tests/measurements/test_timeline.py, the broken dirty trackers in
    tests/core/test_dirty_tracking.py, the failed swap of a uffd for /dev/null in
    tests/c/pool_internals.c (a vCPU blocked on a uffd it cannot be let go
    of needs a KVM whose kick does not interrupt a userfault wait), ..."""
    root = Path(__file__).resolve().parents[2]
    # The tree's declaration, not the installed copy's: the paths it names
    # are the tree's tests, and an install made before a test moved would
    # name where it used to be.
    declared = runpy.run_path(str(root / "uffdkvm" / "schema" / "faults.py"),
                              run_name="tree_faults")["FAULTS"]
    assert set(FAULTS) == {f.name for f in declared}
    unnamed = []
    for f in declared:
        assert f.tests, f"{f.name}: no test injects it"
        for path in f.tests:
            text = (root / path).read_text(encoding="utf-8")
            token = f"UKVM_INJECT_{f.c_name}" if path.endswith(".c") else f'"{f.name}"'
            if token not in text:
                unnamed.append(f"{path} does not name {token}")
    assert not unnamed


@pytest.mark.parametrize("after", [1, 3])
def test_a_vcpus_failed_mincore_fails_the_run_naming_it(kvm, after):
    """A vCPU that resolves its own fault on a huge unit waits for its 4 KiB
    page to be mapped; a mincore() that fails there cannot be taken for
    "mapped" (the access after it could take SIGBUS): the run fails, naming
    the vCPU and the call."""
    fields = dict(vcpus=2, mem_per_vcpu="8M", backing="anonymous_thp", resolver="vcpu")
    try:
        run_with_fault(**fields, fault="mincore_fail", after=after)
    except uffdkvm.HostUnsupportedError as e:
        host_skip(facts_for_run(**fields), f"this host cannot: {e}")
    except uffdkvm.RunError as e:
        error = e
    else:
        pytest.fail("the failed mincore() did not fail the run")
    e = error
    assert e.errno == errno.EINVAL, str(e)
    assert re.match(r"vCPU [01], resolving on uffd [01]: mincore\(the page at 0x[0-9a-f]+, "
                    r"whose unit another thread is copying\)", str(e)), str(e)


def test_a_build_without_the_hooks_never_says_injected():
    """Every message that says "(injected)" sits under UKVM_TEST_HOOKS: the
    core preprocessed as a user's build (setup.py without UFFDKVM_TEST_HOOKS)
    holds none, so no real failure is ever reported as an injected one."""
    csrc = Path(__file__).resolve().parents[2] / "csrc"
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler: the extension was built with one")
    found = []
    for source in sorted(csrc.rglob("*.c")):
        if source.parent.name == "python":
            continue  # the binding needs Python.h; it names no failure itself
        p = subprocess.run([cc, "-E", "-P", "-std=gnu11", "-D_GNU_SOURCE", f"-I{csrc}",
                            str(source)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        if "(injected)" in p.stdout:
            found.append(str(source.relative_to(csrc)))
    assert not found, f"'(injected)' outside UKVM_TEST_HOOKS in {found}"


def test_a_run_that_stops_making_progress_fails_at_its_time_limit(kvm):
    """The last vCPU never enters the guest (vcpu_hang): the run never ends
    by itself, and fails at its time limit naming the vCPU still running.
    (Without a limit, C callers get the no-progress watch: tests/c/timeout.c;
    run() waits as long as the run goes on, for Ctrl-C.)"""
    t0 = time.monotonic()
    with pytest.raises(uffdkvm.RunTimeoutError) as e:
        run_with_fault(fault="vcpu_hang", after=100, vcpus=2, mem_per_vcpu="1M",
                       timeout_s=1.0)
    assert time.monotonic() - t0 < 30
    assert "within timeout_s=1.000: 1 of 2 vCPUs were still running" in str(e.value)


def test_an_unknown_fault_is_refused():
    with pytest.raises(ValueError, match="^fault: 'oom' is not one of resolve_eio"):
        run_with_fault(fault="oom", mem_per_vcpu="64K")


@pytest.mark.parametrize("wait", WAITS)
@pytest.mark.parametrize("mode,ioctl", RESOLVERS, ids=["-".join(m) for m, _ in RESOLVERS])
def test_resolve_eio_names_the_reader_and_the_ioctl(kvm, mode, ioctl, wait):
    uffd_mode, backing, resolve = mode
    if resolve == "move" and NO_UFFD_MOVE.holds:
        host_skip(NO_UFFD_MOVE, f"resolve='move': {NO_UFFD_MOVE.evidence}")
    with pytest.raises(uffdkvm.RunError) as info:
        run_with_fault(**TINY, uffd_mode=uffd_mode, backing=backing, resolve=resolve,
                       wait=wait, fault="resolve_eio", after=5)
    e = info.value
    assert type(e) is uffdkvm.RunError
    assert e.errno == errno.EIO
    assert re.fullmatch(rf"reader [01] of uffd [01]: {ioctl}\(4096 bytes at gpa 0x[0-9a-f]+\) "
                        r"\(injected\): Input/output error \(EIO\)", str(e)), str(e)


def test_resolve_eio_on_huge_pages_names_their_size(kvm, hugepages):
    try:
        run_with_fault(vcpus=1, mem_per_vcpu="4M", backing="shared_hugetlb",
                       uffd_mode="minor", fault="resolve_eio", after=2)
    except uffdkvm.HostUnsupportedError as e:
        host_skip(facts_for_run(backing="shared_hugetlb", uffd_mode="minor"),
                  f"this host cannot: {e}")
    except uffdkvm.RunError as e:
        assert e.errno == errno.EIO
        assert "UFFDIO_CONTINUE(2097152 bytes at gpa 0x" in str(e), str(e)
    else:
        pytest.fail("the injected EIO did not fail the run")


MODES = [("missing", "anonymous"), ("minor", "shmem"), (None, "anonymous")]


@pytest.mark.parametrize("mode,backing", MODES, ids=[f"{m}-{b}" for m, b in MODES])
@pytest.mark.parametrize("page", [0, 7])
def test_a_guest_page_fault_names_the_vcpu_the_exception_and_its_registers(
        kvm, mode, backing, page):
    with pytest.raises(uffdkvm.RunError) as info:
        run_with_fault(**TINY, uffd_mode=mode, backing=backing, fault="guest_fault",
                       after=page)
    e, message = info.value, str(info.value)
    assert type(e) is uffdkvm.RunError and e.errno == 0
    assert message.startswith("vCPU 0: guest exception #PF page fault (vector 14"), message
    cr2 = int(re.search(r"cr2=0x([0-9a-f]+)", message).group(1), 16)
    assert cr2 % GIB == page * 4096, "cr2 is the page that was unmapped"
    for register in ("rip", "rsp", "rax", "rflags"):
        assert re.search(rf"\b{register}=0x[0-9a-f]+", message), message


@pytest.mark.parametrize("mode,backing", MODES, ids=[f"{m}-{b}" for m, b in MODES])
def test_an_mmio_exit_names_the_vcpu_the_address_and_registers(kvm, mode, backing):
    with pytest.raises(uffdkvm.RunError) as info:
        run_with_fault(**TINY, uffd_mode=mode, backing=backing, fault="guest_mmio", after=3)
    message = str(info.value)
    assert info.value.errno == 0
    assert re.match(r"vCPU 0: unexpected exit from the guest: exit reason 6 MMIO "
                    r"\(address 0x[0-9a-f]+\); rip=0x", message), message


def test_a_guest_fault_beyond_vcpu_0s_pages_is_refused():
    with pytest.raises(uffdkvm.ConfigError, match="^inject_after: beyond vCPU 0's pages"):
        run_with_fault(**TINY, fault="guest_fault", after=256)


# The core starts each pool's readers (uffd 0's, then uffd 1's, ...), then the
# vCPUs, each through one checked pthread_create; the controller is not counted.
def threads_in_order(vcpus, uffds, readers):
    return ([f"uffd {u}: pthread_create(reader {k} of {readers})"
             for u in range(uffds) for k in range(readers)] +
            [f"pthread_create(vCPU {i} of {vcpus})" for i in range(vcpus)])


THREAD_LAYOUTS = {
    "2-uffds-2-readers": (dict(vcpus=2, readers=2), 2),
    "single-uffd-3-readers": (dict(vcpus=2, readers=3, single_uffd=True), 1),
    "overlap-1-reader": (dict(vcpus=3, readers=1, overlap=True), 1),
    "no-uffd": (dict(vcpus=2, uffd_mode=None), 0),
}


@pytest.mark.parametrize("wait", ["epoll_exclusive", "read"])
@pytest.mark.parametrize("layout", list(THREAD_LAYOUTS))
def test_a_thread_that_cannot_start_fails_the_run_with_eagain_naming_it(kvm, layout, wait):
    fields, uffds = THREAD_LAYOUTS[layout]
    names = threads_in_order(fields["vcpus"], uffds, fields.get("readers", 1))
    for after, name in enumerate(names, start=1):
        with pytest.raises(uffdkvm.RunError) as info:
            run_with_fault(**fields, mem_per_vcpu="256K", wait=wait, fault="thread_create",
                           after=after)
        assert type(info.value) is uffdkvm.RunError
        assert info.value.errno == errno.EAGAIN
        assert str(info.value) == f"{name}: Resource temporarily unavailable (EAGAIN)"
    # Those are all the threads the run makes: one more start is never reached.
    r = run_with_fault(**fields, mem_per_vcpu="256K", wait=wait, fault="thread_create",
                       after=len(names) + 1)
    assert r.verified


@pytest.mark.parametrize("mode,backing,resolve", [
    ("missing", "anonymous", "copy"), ("missing", "anonymous", "zeropage"),
    ("minor", "shmem", "copy"), (None, "anonymous", "copy"), (None, "shmem", "copy"),
])
@pytest.mark.parametrize("overlap", [False, True], ids=["partitioned", "overlap"])
def test_a_corrupted_page_is_found_and_named(kvm, mode, backing, resolve, overlap):
    page = 300 if not overlap else 200  # vCPU 1's part of a partitioned region
    r = run_with_fault(**TINY, uffd_mode=mode, backing=backing, resolve=resolve,
                       overlap=overlap, write_percent=50, fault="corrupt_page", after=page)
    assert r.verified is False
    assert r.bad_pages == 1
    gpa = int(re.match(r"page at gpa 0x([0-9a-f]+): ", r.verify_message).group(1), 16)
    assert gpa % GIB == page * 4096, r.verify_message
    # Everything else about the run is intact.
    assert r.faults == (0 if mode is None else 256 if overlap else PAGES)


# The pages at the edges, where an off-by-one in verification's bounds would
# look: the region's first and last, and either side of the vCPUs' boundary.
EDGES = {"region_first": 0, "vcpu0_last": PAGES // 2 - 1, "vcpu1_first": PAGES // 2,
         "region_last": PAGES - 1}


@pytest.mark.parametrize("page", list(EDGES.values()), ids=list(EDGES))
def test_a_corrupted_page_at_an_edge_is_found(kvm, page):
    r = run_with_fault(**TINY, fault="corrupt_page", after=page)
    assert r.verified is False and r.bad_pages == 1, r.verify_message
    gpa = int(re.match(r"page at gpa 0x([0-9a-f]+): ", r.verify_message).group(1), 16)
    assert gpa % GIB == page * 4096, r.verify_message


def test_a_corruption_beyond_the_region_touches_nothing(kvm):
    r = run_with_fault(**TINY, fault="corrupt_page", after=PAGES)
    assert r.verified and r.bad_pages == 0 and r.verify_message == ""


@pytest.mark.parametrize("wait", WAITS)
@pytest.mark.parametrize("single_uffd", [False, True], ids=["uffd_per_vcpu", "single_uffd"])
def test_a_reader_that_vanishes_is_a_timeout_not_a_hang(kvm, wait, single_uffd):
    """The fault it took is never resolved: the run ends at timeout_s with
    RunTimeoutError, and every other reader, blocking ones included, is
    stopped (the autouse fixture counts the threads)."""
    with pytest.raises(uffdkvm.RunTimeoutError) as info:
        run_with_fault(**TINY, wait=wait, single_uffd=single_uffd, fault="reader_exit",
                       after=3, timeout_s=0.2)
    assert isinstance(info.value, TimeoutError)
    assert info.value.errno == 0
    assert re.match(r"the run did not finish within timeout_s=0\.200: [12] of 2 vCPUs were "
                    r"still running", str(info.value)), str(info.value)


def test_after_each_failure_the_next_run_is_clean(kvm):
    for fault, after in [("resolve_eio", 3), ("guest_fault", 3), ("guest_mmio", 3),
                         ("thread_create", 2), ("corrupt_page", 3)]:
        try:
            run_with_fault(**TINY, fault=fault, after=after)
        except uffdkvm.RunError:
            pass
        r = run_or_skip(**TINY)
        assert r.faults == PAGES and r.bad_pages == 0


# ---- a thread that will not stop ----

# The core waits 2 s for each kind of thread (vCPUs, then readers) before it
# names one that would not stop; the error must come well before the thread
# leaves (STALL_MS), and a few seconds at most in all. The stall outlasts the
# error by some 2.5 s, so that the test still finds the thread there on a
# loaded host (with 1 s, two test suites at once on 2 CPUs once missed it).
STALL_MS = 4500
ERROR_WITHIN_S = 4.0
STALLED = {
    # fault, fields, the thread it names
    "reader-poll": ("reader_stall", dict(readers=3, wait="poll"), "reader 2 of uffd 0"),
    # the other uffd's readers block in read(2): stopping must kick them meanwhile
    "reader-read": ("reader_stall", dict(readers=2, wait="read"), "reader 1 of uffd 0"),
    "vcpu": ("vcpu_stall", dict(vcpus=3), "vCPU 2"),
}


@pytest.mark.parametrize("name", list(STALLED))
def test_a_thread_that_will_not_stop_fails_the_run_naming_it_within_seconds(kvm, name):
    """The run raises RunError naming the thread and where it was (its own
    words and the kernel's) long before the thread leaves; the thread's
    experiment is kept until it does, then every fd and thread is given back."""
    fault, fields, who = STALLED[name]
    before = resources()
    start = time.monotonic()
    with pytest.raises(uffdkvm.RunError) as info:
        run_with_fault(**{"vcpus": 2, **fields}, mem_per_vcpu="1M", fault=fault,
                       after=STALL_MS)
    took = time.monotonic() - start
    message = str(info.value)
    assert type(info.value) is uffdkvm.RunError and info.value.errno == 0
    assert took < ERROR_WITHIN_S and took < STALL_MS / 1000, f"{took:.1f} s: {message}"
    assert re.fullmatch(rf"{who} did not stop within 2\.0 s: it was stalled \(injected: it "
                        r"ignores stop and kicks\) \(thread \d+: in clock_nanosleep.*\)",
                        message), message
    # The thread still runs, so its experiment is still there...
    with pytest.raises(uffdkvm.RunError) as idle:
        wait_idle(timeout_s=0.1)
    assert re.match(rf"an earlier experiment still holds its threads, fds and memory: {who} "
                    r"did not stop within 2\.0 s: .*, and it is still running \d+\.\d s later",
                    str(idle.value)), str(idle.value)
    assert resources_now()["threads"] > before["threads"]
    # ...until it leaves: then all of it is given back.
    wait_idle()
    assert time.monotonic() - start >= STALL_MS / 1000
    assert_released(before)
    r = run_or_skip(**TINY)
    assert r.faults == PAGES


def resources_now():
    """resources() without waiting for earlier runs."""
    import os
    return {"threads": len(os.listdir("/proc/self/task"))}


def test_a_thread_that_will_not_stop_after_a_failure_is_appended_to_it(kvm):
    """The first failure keeps its kind and words; the thread is named after it."""
    start = time.monotonic()
    with pytest.raises(uffdkvm.RunTimeoutError) as info:
        run_with_fault(vcpus=1, mem_per_vcpu="1M", delay_us=5000, timeout_s=0.2,
                       fault="vcpu_stall", after=STALL_MS)
    assert time.monotonic() - start < 0.2 + ERROR_WITHIN_S
    assert re.match(r"the run did not finish within timeout_s=0\.200: 1 of 1 vCPUs were still "
                    r"running .*; then vCPU 0 did not stop within 2\.0 s: it was stalled",
                    str(info.value)), str(info.value)
    wait_idle()


def test_the_next_run_does_not_wait_for_a_thread_that_will_not_stop(kvm):
    """An earlier experiment that holds on delays the next run a bounded
    while at most (the core waits 10 s from when the caller left it), and
    the next run is whole."""
    with pytest.raises(uffdkvm.RunError, match="did not stop"):
        run_with_fault(**TINY, fault="reader_stall", after=STALL_MS)
    start = time.monotonic()
    r = run_or_skip(**TINY)
    assert r.faults == PAGES
    assert time.monotonic() - start < STALL_MS / 1000, "the next run waited it out"
    wait_idle()


def guest_memory_mappings():
    """This process's mappings of a shmem-backed guest region (the memfd)."""
    with open("/proc/self/maps") as f:
        return sum("memfd:uffdkvm-guest" in line for line in f)


def test_probe_waits_for_an_earlier_runs_memory(kvm):
    """probe() waits, as run() does, for a failed run's memory: here a MINOR
    run on shmem whose stalled reader keeps its memfd mapped in the
    background until it leaves. When probe returns, that memory is back."""
    with pytest.raises(uffdkvm.RunError, match="did not stop"):
        run_with_fault(vcpus=1, mem_per_vcpu="64M", backing="shmem", uffd_mode="minor",
                       readers=2, fault="reader_stall", after=STALL_MS)
    assert guest_memory_mappings() == 2, "the guest's mapping and its alias are held"
    uffdkvm.probe(vcpus=1, mem_per_vcpu="64K")
    assert guest_memory_mappings() == 0, "probe() did not wait for the earlier run's memory"
    wait_idle()


def test_runs_memory_check_sees_an_earlier_runs_memory_back(kvm, monkeypatch):
    """run() checks MemAvailable after earlier failed runs have handed their
    memory back (a bounded wait, then it goes on)."""
    run_module = sys.modules["uffdkvm.run"]  # uffdkvm.run is the function
    seen, available = [], run_module._mem_available

    def spy():
        seen.append(guest_memory_mappings())
        return available()

    with pytest.raises(uffdkvm.RunError, match="did not stop"):
        run_with_fault(vcpus=1, mem_per_vcpu="64M", backing="shmem", uffd_mode="minor",
                       readers=2, fault="reader_stall", after=2500)
    assert guest_memory_mappings() == 2
    monkeypatch.setattr(run_module, "_mem_available", spy)
    run_or_skip(**TINY)
    assert seen == [0], "the memory check ran while the earlier run still held its memory"
    wait_idle()


# ---- EAGAIN from the resolving ioctls ----

@pytest.mark.parametrize("mode,ioctl", RESOLVERS, ids=["-".join(m) for m, _ in RESOLVERS])
def test_eagain_for_a_while_is_retried_until_it_passes(kvm, mode, ioctl):
    """EAGAIN (the address space changing under the ioctl) is retried by time
    with backoff, not by count: 100 ms of it is waited out and every page
    still arrives."""
    uffd_mode, backing, resolve = mode
    if resolve == "move" and NO_UFFD_MOVE.holds:
        host_skip(NO_UFFD_MOVE, f"resolve='move': {NO_UFFD_MOVE.evidence}")
    r = run_with_fault(**TINY, uffd_mode=uffd_mode, backing=backing, resolve=resolve,
                       fault="resolve_eagain", after=100)
    assert r.verified, r.verify_message
    assert r.faults == PAGES


def test_eagain_that_does_not_pass_fails_the_run_naming_the_ioctl_and_how_long(kvm):
    start = time.monotonic()
    with pytest.raises(uffdkvm.RunError) as info:
        run_with_fault(**TINY, fault="resolve_eagain", after=10**9)
    assert time.monotonic() - start < 3.0
    assert info.value.errno == errno.EAGAIN
    assert re.fullmatch(r"reader [01] of uffd [01]: UFFDIO_COPY\(4096 bytes at 0x[0-9a-f]+\) "
                        r"still failed after retrying for 1\.\d s \(\d+ tries, the last ones "
                        r"1 ms apart\): Resource temporarily unavailable \(EAGAIN\)",
                        str(info.value)), str(info.value)


def test_a_vcpu_slow_to_leave_after_a_good_run_keeps_the_readers_data(kvm):
    """A vCPU past its walk that takes 0.8 s to leave its thread (longer
    than the 0.5 s after which the core lets go of the uffds to free a vCPU
    stuck in a fault, shorter than the 2 s it waits in all): the run
    succeeded, and its readers' counters and fault log must survive to be
    collected, so it verifies with every fault accounted."""
    r = run_with_fault(**TINY, trace_faults=True, fault="vcpu_stall", after=800)
    assert r.verified, r.verify_message
    assert r.faults == PAGES == len(r.fault_trace)
    assert r.seconds >= 0.8  # upstream's window ends when the last thread is joined
