"""Every failure the core can meet mid-run ends the run with the right
exception, errno and a message naming the thread and the call, and gives
back every thread and fd.

The failures are real: uffdkvm._testing makes the core's own code fail at a
chosen point (csrc/ukvm.h, enum ukvm_inject), and the run goes down its
normal error path.
"""
import errno
import re

import pytest

import uffdkvm
from conftest import facts_for_run, host_skip, run_or_skip
from uffdkvm._testing import FAULTS, run_with_fault

pytestmark = pytest.mark.kvm

TINY = dict(vcpus=2, mem_per_vcpu="1M", readers=2)
PAGES = 2 * 256
WAITS = ["poll", "epoll", "epoll_exclusive", "read"]
GIB = 1 << 30

# (uffd_mode, backing, resolve) -> the ioctl that resolves its faults
RESOLVERS = [
    (("missing", "anonymous", "copy"), "UFFDIO_COPY"),
    (("missing", "anonymous", "zeropage"), "UFFDIO_ZEROPAGE"),
    (("missing", "shmem", "copy"), "UFFDIO_COPY"),
    (("missing", "shmem", "zeropage"), "UFFDIO_ZEROPAGE"),
    (("minor", "shmem", "copy"), "UFFDIO_CONTINUE"),
]


@pytest.fixture(autouse=True)
def every_thread_and_fd_given_back(released):
    yield


def test_every_fault_kind_is_tested():
    """A fault added to the core without a test fails this: the failures are
    tested here; the clock shifts in test_timeline.py, the unfaulted page in
    test_accounting.py."""
    assert set(FAULTS) == {"resolve_eio", "reader_exit", "guest_fault", "guest_mmio",
                           "thread_create", "corrupt_page", "tsc_offset",
                           "no_kvm_tsc_offset", "unfaulted_page"}


def test_an_unknown_fault_is_refused():
    with pytest.raises(ValueError, match="^fault: 'oom' is not one of resolve_eio"):
        run_with_fault(fault="oom", mem_per_vcpu="64K")


@pytest.mark.parametrize("wait", WAITS)
@pytest.mark.parametrize("mode,ioctl", RESOLVERS, ids=["-".join(m) for m, _ in RESOLVERS])
def test_resolve_eio_names_the_reader_and_the_ioctl(kvm, mode, ioctl, wait):
    uffd_mode, backing, resolve = mode
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
