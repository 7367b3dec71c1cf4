"""Where a run ran: :class:`HostInfo`, the facts needed to compare runs later.

Every Result that run() returns carries the HostInfo of the machine it ran on
(``r.host``), so results written to JSON today can be told apart from those of
another kernel, CPU or uffdkvm version tomorrow, and a paging rate can be read
beside what moves it: transparent huge pages, KVM's MMU, huge page pools,
userfaultfd's features, nesting.

The facts are read from /proc and /sys, and asked of the kernel itself
(KVM_CHECK_EXTENSION on /dev/kvm and on a fresh VM, UFFDIO_API on a fresh
userfaultfd, an io_uring read of one), in Python: nothing here needs the C
core, and nothing is decided by the kernel's version.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import mmap
import os
import platform
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

# The CPUs this process may use, read when uffdkvm is imported: before a
# caller (the CLI's -c) pins the main thread to one of them.
_CPUS_AT_IMPORT: frozenset[int] = frozenset(os.sched_getaffinity(0))

# KVM capabilities that bear on these experiments (include/uapi/linux/kvm.h).
KVM_CAPS = {
    "nr_vcpus": 9, "nr_memslots": 10, "sync_mmu": 16, "tsc_control": 60,
    "get_tsc_khz": 61, "max_vcpus": 66, "readonly_mem": 81, "max_vcpu_id": 128,
    "x86_disable_exits": 143, "halt_poll": 182, "binary_stats_fd": 203,
    "vm_tsc_control": 214, "user_memory2": 231, "memory_fault_info": 232,
    "guest_memfd": 234, "vm_types": 235, "pre_fault_memory": 236,
}
# Capabilities whose answer depends on the VM type, asked again of a VM of
# the type uffdkvm creates (KVM_X86_DEFAULT_VM): /dev/kvm answers for the
# KVM as a whole (virt/kvm/kvm_main.c: "!kvm || ..."). KVM_CAP_GUEST_MEMFD is
# 1 on /dev/kvm wherever KVM has private memory, and on a default VM only
# from Linux 6.18.
VM_CAPS = {
    "guest_memfd": 234, "guest_memfd_flags": 244, "memory_attributes": 233,
    "readonly_mem": 81, "multi_address_space": 118,
}
_KVM_X86_DEFAULT_VM = 0           # the VM type uffdkvm creates (KVM_CREATE_VM's argument)
# The modules that provide /dev/kvm: the generic one and a vendor one.
KVM_MODULES = ("kvm", "kvm_intel", "kvm_amd", "kvm_pvm")
# UFFD_FEATURE_* bits (include/uapi/linux/userfaultfd.h), by name.
UFFD_FEATURES = {
    "pagefault_flag_wp": 1 << 0, "event_fork": 1 << 1, "event_remap": 1 << 2,
    "event_remove": 1 << 3, "missing_hugetlbfs": 1 << 4, "missing_shmem": 1 << 5,
    "event_unmap": 1 << 6, "sigbus": 1 << 7, "thread_id": 1 << 8,
    "minor_hugetlbfs": 1 << 9, "minor_shmem": 1 << 10, "exact_address": 1 << 11,
    "wp_hugetlbfs_shmem": 1 << 12, "wp_unpopulated": 1 << 13, "poison": 1 << 14,
    "wp_async": 1 << 15, "move": 1 << 16,
}

_KVM_CREATE_VM = 0xAE01
_KVM_CHECK_EXTENSION = 0xAE03
_UFFD_API = 0xAA
_UFFDIO_API = 0xC018AA3F          # _IOWR(0xAA, 0x3F, struct uffdio_api)
_USERFAULTFD_IOC_NEW = 0xAA00     # _IO(0xAA, 0x00) on /dev/userfaultfd
_SYS_USERFAULTFD = 323            # x86-64, the only architecture uffdkvm builds on
_SYS_IO_URING_SETUP = 425         # x86-64
_SYS_IO_URING_ENTER = 426
_IO_URING_PARAMS_BYTES = 120      # sizeof(struct io_uring_params)
_IORING_OFF_SQ_RING, _IORING_OFF_CQ_RING, _IORING_OFF_SQES = 0, 0x8000000, 0x10000000
_IORING_OP_READ = 22
_UFFD_MSG_BYTES = 32              # sizeof(struct uffd_msg)
# The RWF_* flags of the probe's read: none, as the core's readers. A test
# sets RWF_NOWAIT (8) to have the kernel answer as one whose io_uring does not
# retry reads of O_NONBLOCK files (before Linux 5.15) does.
_RING_READ_RW_FLAGS = 0


@dataclass(frozen=True)
class HostInfo:
    """The host of one run. Every field has a default ("", 0, empty: unknown),
    so JSON written before a field existed still loads.

    name              host name (os.uname().nodename)
    kernel_release    kernel release, as ``uname -r``
    kernel_version    kernel build string, as ``uname -v``
    cpu_model         CPU model name from /proc/cpuinfo
    cpus              logical CPUs the host has online
    usable_cpus       logical CPUs this process could run on when uffdkvm was
                      imported (before anything pinned it)
    hypervisor        the host is itself a VM, so KVM runs nested (the
                      "hypervisor" CPU flag): expect far lower paging rates
    sys_vendor        the machine's maker from DMI (/sys/class/dmi/id/sys_vendor:
                      "QEMU", "Amazon EC2", ... for a VM), "" where absent
    memory_bytes      MemTotal
    python_version    e.g. "3.11.7"
    uffdkvm_version   the uffdkvm that ran the experiment
    thp_enabled       transparent huge pages: "always", "madvise" or "never"
    thp_defrag        their defrag mode ("madvise", "defer+madvise", ...)
    hugepages_2m, hugepages_2m_free, hugepages_1g, hugepages_1g_free
                      the huge page pools: pages reserved and free
    kvm_module        the module that provides /dev/kvm ("kvm_intel",
                      "kvm_amd", "kvm_pvm"), "" if none is loaded
    kvm_params        module parameters by "module.name" (``kvm.tdp_mmu``,
                      ``kvm_intel.ept``, ...) as the kernel prints them
    kvm_caps          KVM_CHECK_EXTENSION's answers asked of /dev/kvm, for
                      the capabilities in :data:`KVM_CAPS` (empty without
                      /dev/kvm): what this KVM offers some VM type
    vm_caps           KVM_CHECK_EXTENSION's answers asked of a VM of the type
                      uffdkvm creates (KVM_X86_DEFAULT_VM), for the
                      capabilities in :data:`VM_CAPS`, whose answer depends on
                      the VM type: what uffdkvm's VMs have. ``guest_memfd`` is
                      1 in ``kvm_caps`` on a KVM that offers guest_memfd only
                      to confidential VM types (x86, Linux 6.8 to 6.17), and 1
                      here only where backing="guest_memfd" can work (Linux
                      6.18+); empty without /dev/kvm, and in older JSON
    uffd_features     UFFDIO_API's feature mask: what this kernel's
                      userfaultfd offers (0 where no userfaultfd could be
                      opened); ``uffd_feature_names`` spells it out
    io_uring          "allowed" where this process could set up an io_uring
                      and an IORING_OP_READ of an empty non-blocking
                      userfaultfd waits in it (wait="io_uring"), as the
                      kernel answered when asked; else why not (the kernel has
                      none, /proc/sys/kernel/io_uring_disabled, a seccomp
                      filter, an io_uring that completes the read at once
                      because it does not retry O_NONBLOCK files, as before
                      Linux 5.15). Where no userfaultfd could be opened, only
                      io_uring_setup is asked. "" in older JSON. Whether this
                      uffdkvm was built with liburing is
                      ``_core.HAVE_IO_URING``

    The three dicts do not take part in the hash: a HostInfo hashes by its
    other fields and compares by all.
    """

    name: str = ""
    kernel_release: str = ""
    kernel_version: str = ""
    cpu_model: str = ""
    cpus: int = 0
    usable_cpus: int = 0
    hypervisor: bool = False
    sys_vendor: str = ""
    memory_bytes: int = 0
    python_version: str = ""
    uffdkvm_version: str = ""
    thp_enabled: str = ""
    thp_defrag: str = ""
    hugepages_2m: int = 0
    hugepages_2m_free: int = 0
    hugepages_1g: int = 0
    hugepages_1g_free: int = 0
    kvm_module: str = ""
    kvm_params: dict[str, str] = field(default_factory=dict, hash=False)
    kvm_caps: dict[str, int] = field(default_factory=dict, hash=False)
    vm_caps: dict[str, int] = field(default_factory=dict, hash=False)
    uffd_features: int = 0
    io_uring: str = ""

    @classmethod
    def current(cls) -> HostInfo:
        """This host, read now (about a millisecond): huge page pools, THP
        modes and KVM's parameters can change between runs, and each Result
        carries the facts of its own run. ``usable_cpus`` alone is the
        affinity at import, before anything (the CLI's -c) pins the process."""
        return capture()

    @property
    def uffd_feature_names(self) -> tuple[str, ...]:
        """The UFFD_FEATURE_* names in ``uffd_features``, lower case."""
        return tuple(name for name, bit in UFFD_FEATURES.items() if self.uffd_features & bit)


def usable_cpus_at_import() -> frozenset[int]:
    """The CPUs this process could run on when uffdkvm was imported."""
    return _CPUS_AT_IMPORT


def _read(path: str) -> str:
    """A /proc or /sys file's text, stripped; "" if it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _int(path: str) -> int:
    text = _read(path)
    return int(text) if text.isdigit() else 0


def _selected(path: str) -> str:
    """The [bracketed] choice of a sysfs mode file ("always [madvise] never")."""
    text = _read(path)
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else text


def _cpu_flags() -> set[str]:
    """The first CPU's flags in /proc/cpuinfo."""
    for line in _read("/proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def _cpuinfo() -> tuple[str, bool]:
    """(model name, whether the "hypervisor" flag is set) from /proc/cpuinfo."""
    model, hypervisor = "", False
    for line in _read("/proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags":
            hypervisor = "hypervisor" in value.split()
            break
    return model or platform.processor(), hypervisor


def meminfo_bytes(key: str) -> int | None:
    """A /proc/meminfo value ("MemTotal", "MemAvailable", ...) in bytes, or
    None when the file cannot be read or has no such line."""
    for line in _read("/proc/meminfo").splitlines():
        name, _, value = line.partition(":")
        if name == key:
            with contextlib.suppress(ValueError, IndexError):
                return int(value.split()[0]) * 1024
            return None
    return None


# The CPU flag without which a vendor module cannot be what /dev/kvm runs on.
VENDOR_FLAGS = {"kvm_intel": "vmx", "kvm_amd": "svm"}


def _kvm_params() -> tuple[str, dict[str, str]]:
    """(the vendor module, {"module.param": value}) from /sys/module.

    A kernel that builds both kvm_intel and kvm_amd in has both in
    /sys/module (their parameters are there), though only the one for this
    CPU initialised: the vendor is the one whose CPU flag (vmx, svm) is set.
    """
    params: dict[str, str] = {}
    present = [m for m in KVM_MODULES if m != "kvm" and os.path.isdir(f"/sys/module/{m}")]
    flags = _cpu_flags() | {""}
    vendor = next((m for m in present if VENDOR_FLAGS.get(m, "") in flags),
                  present[0] if present else "")
    for module in KVM_MODULES:
        directory = f"/sys/module/{module}"
        if not os.path.isdir(directory):
            continue
        try:
            names = sorted(os.listdir(f"{directory}/parameters"))
        except OSError:
            continue
        for name in names:
            value = _read(f"{directory}/parameters/{name}")
            if value:
                params[f"{module}.{name}"] = value
    return vendor, params


def _check_extensions(fd: int, caps: dict[str, int]) -> dict[str, int]:
    answers = {}
    for name, cap in caps.items():
        with contextlib.suppress(OSError):
            answers[name] = fcntl.ioctl(fd, _KVM_CHECK_EXTENSION, cap)
    return answers


_T = TypeVar("_T")


def _sigint_held(probe: Callable[[], _T]) -> Callable[[], _T]:
    """probe() with Ctrl-C held back until it returns: a SIGINT that lands in
    a syscall that makes an fd (KVM_CREATE_VM takes milliseconds, under TCG
    tens) raises KeyboardInterrupt as the call returns, before the fd has a
    name to close it by; in Debian's 6.1 guest every such Ctrl-C left a VM
    open. Held, it is raised as the probe ends, its fds closed. Only the main
    thread runs Python's signal handlers: elsewhere there is nothing to hold,
    and neither where SIGINT's handler is not Python's to put back."""
    @functools.wraps(probe)
    def held() -> _T:
        if threading.current_thread() is not threading.main_thread():
            return probe()
        before = signal.getsignal(signal.SIGINT)
        if before is None:
            return probe()
        came: list[int] = []
        signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
        try:
            return probe()
        finally:
            signal.signal(signal.SIGINT, before)
            if came:
                signal.raise_signal(signal.SIGINT)   # to the handler put back
    return held


def _create_vm(kvm: int) -> int:
    """A default VM's fd, or -1. A refusal is asked again a few times, 10 ms
    apart: CI once saw one KVM_CREATE_VM fail between two that worked (every
    VM answer vanished from one run's host facts), so one refusal is not
    taken for the host's. The run's own VM is the core's, which reports its
    own errors."""
    for _ in range(5):
        try:
            return fcntl.ioctl(kvm, _KVM_CREATE_VM, _KVM_X86_DEFAULT_VM)
        except OSError:
            time.sleep(0.01)
    return -1


@_sigint_held
def _kvm_caps() -> tuple[dict[str, int], dict[str, int]]:
    """(/dev/kvm's answers for KVM_CAPS, a fresh default VM's for VM_CAPS)."""
    try:
        kvm = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return {}, {}
    try:
        dev_kvm = _check_extensions(kvm, KVM_CAPS)
        vm = _create_vm(kvm)
        if vm < 0:
            return dev_kvm, {}
        try:
            return dev_kvm, _check_extensions(vm, VM_CAPS)
        finally:
            os.close(vm)
    finally:
        os.close(kvm)


def _userfaultfd() -> int:
    """A new userfaultfd (the syscall, else /dev/userfaultfd), or -1."""
    flags = os.O_CLOEXEC | os.O_NONBLOCK
    libc = ctypes.CDLL(None, use_errno=True)
    # Not UFFD_USER_MODE_ONLY: such a uffd cannot take KVM's faults (they are
    # the kernel's), so its features would be ones the core cannot use.
    fd = int(libc.syscall(_SYS_USERFAULTFD, flags))
    if fd >= 0:
        return fd
    try:
        dev = os.open("/dev/userfaultfd", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        return fcntl.ioctl(dev, _USERFAULTFD_IOC_NEW, flags)
    except OSError:
        return -1
    finally:
        os.close(dev)


def _uffd_api(fd: int) -> int:
    """UFFDIO_API on a fresh uffd, asking for no feature: those it offers."""
    api = bytearray(struct.pack("=QQQ", _UFFD_API, 0, 0))
    fcntl.ioctl(fd, _UFFDIO_API, api, True)
    return int(struct.unpack("=QQQ", api)[1])


@_sigint_held
def _uffd_features() -> int:
    """UFFDIO_API's answer: every feature this kernel's userfaultfd offers."""
    fd = _userfaultfd()
    if fd < 0:
        return 0
    try:
        return _uffd_api(fd)
    except OSError:
        return 0
    finally:
        os.close(fd)


# The kernel's names where Python's errorcode gives the userspace alias (95 is
# both EOPNOTSUPP and ENOTSUP): the core's messages use the kernel's.
_KERNEL_ERRNO_NAMES = {errno.EOPNOTSUPP: "EOPNOTSUPP"}


def _errno_text(call: str, errnum: int) -> str:
    name = _KERNEL_ERRNO_NAMES.get(errnum) or errno.errorcode.get(errnum) or str(errnum)
    return f"{call}: {os.strerror(errnum)} ({name})"


def _ring_read_refusal(ring: int, params: bytes, uffd: int) -> str | None:
    """Submits one IORING_OP_READ of the empty non-blocking uffd to the fresh
    one-entry ring and looks at its completion queue: None where the read
    waits (the ring is closed next, and the kernel cancels it), else why not."""
    sq_entries, cq_entries = struct.unpack_from("II", params, 0)
    # struct io_sqring_offsets at 40, struct io_cqring_offsets at 80
    _, sq_tail, sq_mask, _, _, _, sq_array = struct.unpack_from("7I", params, 40)
    cq_head, cq_tail, cq_mask, _, _, cqes = struct.unpack_from("6I", params, 80)
    buf = ctypes.create_string_buffer(_UFFD_MSG_BYTES)
    maps = []
    try:
        sq = mmap.mmap(ring, sq_array + 4 * sq_entries, offset=_IORING_OFF_SQ_RING)
        maps.append(sq)
        cq = mmap.mmap(ring, cqes + 16 * cq_entries, offset=_IORING_OFF_CQ_RING)
        maps.append(cq)
        sqes = mmap.mmap(ring, 64 * sq_entries, offset=_IORING_OFF_SQES)
        maps.append(sqes)
        # struct io_uring_sqe: opcode, flags, ioprio, fd, off, addr, len, rw_flags, user_data
        struct.pack_into("=BBHiQQIIQ", sqes, 0, _IORING_OP_READ, 0, 0, uffd, 0,
                         ctypes.addressof(buf), _UFFD_MSG_BYTES, _RING_READ_RW_FLAGS, 1)
        tail = struct.unpack_from("I", sq, sq_tail)[0]
        mask = struct.unpack_from("I", sq, sq_mask)[0]
        struct.pack_into("I", sq, sq_array + 4 * (tail & mask), 0)
        struct.pack_into("I", sq, sq_tail, tail + 1)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(_SYS_IO_URING_ENTER, ring, 1, 0, 0, None, 0) < 0:
            return _errno_text("io_uring_enter", ctypes.get_errno())
        head = struct.unpack_from("I", cq, cq_head)[0]
        if head == struct.unpack_from("I", cq, cq_tail)[0]:
            return None     # no completion: the read waits for a message
        at = cqes + 16 * (head & struct.unpack_from("I", cq, cq_mask)[0])
        res = struct.unpack_from("i", cq, at + 8)[0]
        what = "IORING_OP_READ of an empty non-blocking uffd completed at once"
        if res == -errno.EAGAIN:
            return (f"{_errno_text(what, errno.EAGAIN)}. This kernel's io_uring does not "
                    "wait for a non-blocking file to become readable: it completes the "
                    "read with EAGAIN instead of polling (io_uring retries O_NONBLOCK "
                    "files from Linux 5.15)")
        if res == -errno.EINVAL:
            return (f"{_errno_text(what, errno.EINVAL)}. This kernel's io_uring has no "
                    "IORING_OP_READ (Linux 5.6+; io_uring retries O_NONBLOCK files from "
                    "Linux 5.15)")
        # Worded as the core's check (ring.c) words it: one message either way.
        if res < 0:
            return f"{_errno_text(what, -res)}. A ring cannot wait for this uffd"
        return f"{what}, with {res} bytes: a ring cannot wait for this uffd"
    except OSError as e:
        return _errno_text("mmap(io_uring)", e.errno or 0)
    finally:
        for m in maps:
            m.close()


@_sigint_held
def io_uring_refusal() -> str | None:
    """Why a reader could not wait for a uffd through io_uring here, or None:
    asks the kernel, never its version. io_uring_setup for a one-entry ring
    (where it says no, naming /proc/sys/kernel/io_uring_disabled's setting),
    then an IORING_OP_READ of an empty non-blocking userfaultfd, which must
    wait rather than complete at once (where no userfaultfd can be opened,
    the ring alone is asked). Everything is closed before it returns."""
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(_IO_URING_PARAMS_BYTES)
    fd = int(libc.syscall(_SYS_IO_URING_SETUP, 1, params))
    if fd >= 0:
        try:
            uffd = _userfaultfd()
            if uffd < 0:
                return None
            try:
                _uffd_api(uffd)
            except OSError:
                return None     # an unusable userfaultfd is uffd_features' to report
            try:
                return _ring_read_refusal(fd, params.raw, uffd)
            finally:
                os.close(uffd)
        finally:
            os.close(fd)
    errnum = ctypes.get_errno()
    failed = _errno_text("io_uring_setup", errnum)
    if errnum == errno.ENOSYS:
        return f"{failed}. This kernel has no io_uring (CONFIG_IO_URING)"
    if errnum in (errno.EPERM, errno.EACCES):
        disabled = _read("/proc/sys/kernel/io_uring_disabled") or "unreadable"
        return (f"{failed}. The kernel refuses io_uring to this process "
                f"(/proc/sys/kernel/io_uring_disabled is {disabled}: 0 allows it to all, 1 "
                f"only to CAP_SYS_ADMIN or the group in io_uring_group, 2 to none; or a "
                f"seccomp filter forbids it)")
    return failed


def capture() -> HostInfo:
    """This host's facts, read now (as HostInfo.current())."""
    from .._version import __version__

    uname = os.uname()
    model, hypervisor = _cpuinfo()
    vendor, params = _kvm_params()
    pools = "/sys/kernel/mm/hugepages/hugepages-"
    dev_kvm_caps, vm_caps = _kvm_caps()
    return HostInfo(
        name=uname.nodename or socket.gethostname(),
        kernel_release=uname.release,
        kernel_version=uname.version,
        cpu_model=model,
        cpus=os.cpu_count() or 0,
        usable_cpus=len(_CPUS_AT_IMPORT),
        hypervisor=hypervisor,
        sys_vendor=_read("/sys/class/dmi/id/sys_vendor"),
        memory_bytes=meminfo_bytes("MemTotal") or 0,
        python_version=platform.python_version(),
        uffdkvm_version=__version__,
        thp_enabled=_selected("/sys/kernel/mm/transparent_hugepage/enabled"),
        thp_defrag=_selected("/sys/kernel/mm/transparent_hugepage/defrag"),
        hugepages_2m=_int(f"{pools}2048kB/nr_hugepages"),
        hugepages_2m_free=_int(f"{pools}2048kB/free_hugepages"),
        hugepages_1g=_int(f"{pools}1048576kB/nr_hugepages"),
        hugepages_1g_free=_int(f"{pools}1048576kB/free_hugepages"),
        kvm_module=vendor,
        kvm_params=params,
        kvm_caps=dev_kvm_caps,
        vm_caps=vm_caps,
        uffd_features=_uffd_features(),
        io_uring=io_uring_refusal() or "allowed",
    )

