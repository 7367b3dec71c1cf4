"""Host facts: every skip in this suite names what this host lacks, and the
session fails on a skip that nothing about the host explains.

A *fact* is a statement about this host that makes some tests meaningless
here ("KVM is unusable", "KVM offers no 1 GiB guest pages"), with a probe of
its own that establishes it: the probes talk to the kernel directly (ioctls,
syscalls, sysfs), never through uffdkvm, and never through the test that
skips. So a test that skips because uffdkvm is broken, citing "no KVM" on a
host where KVM works, is caught. Facts known by the end of collection are
probed then, once, before any test runs; a fact made later is probed when
first asked. A fact that can come to hold during a session (a TSC the kernel
marks unstable: it never marks it stable again) is made with
``may_come_to_hold=True`` and probed again each time it is asked until it
holds.

Skipping a test::

    from helpers.hostfacts import NO_HUGEPAGES_2M, NO_KVM, NO_USERFAULTFD, host_skip

    host_skip(NO_HUGEPAGES_2M, "needs 16 free 2 MiB huge pages")
    host_skip((NO_KVM, NO_USERFAULTFD), str(error))   # explained if either holds

host_skip() raises pytest's skip (pass allow_module_level=True at module
level). The ``kvm`` fixture and ``run_or_skip()`` (runs.py) cite the right
facts for you; ``facts_for_run(**config_fields)`` gives the facts that can
stop a run of that config, for a test that catches HostUnsupportedError
itself. ``pytest.importorskip("x")`` counts as citing ``missing_module("x")``.
Plain ``pytest.skip()`` and ``skipif`` marks cite nothing: they fail the
session (use a fact, or add one).

Adding a fact: a probe that returns (holds, evidence), the evidence being
what the probe saw, for the summary::

    @fact("no-frobnicator", "the kernel has no frobnicator")
    def NO_FROBNICATOR():
        return not os.path.exists("/dev/frob"), "/dev/frob is missing"

or, for a family of facts, a function that returns ``_param_fact(...)`` (see
missing_module() below). Fact names hold no spaces, commas or brackets.

At the end the session prints "host skips": each skipped test with the fact
that explains it and what the probe saw. A skip that cites no fact, or only
facts that do not hold here, is listed as unexplained and makes the session
fail (exit status 1). Deselection (-m, -k, --deselect) is not a skip, nor
is xfail.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno as errno_
import fcntl
import functools
import importlib.util
import mmap
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from fcntl import ioctl
from pathlib import Path

import pytest

FACTS: dict = {}  # name -> Fact, every fact made so far


class Fact:
    """A statement about this host and the probe that establishes it."""

    def __init__(self, name, description, probe, may_come_to_hold=False):
        if re.search(r"[\s,\[\]]", name):
            raise ValueError(f"fact name {name!r}: no spaces, commas or brackets")
        self.name = name
        self.description = description
        self._probe = probe
        self._result = None
        self._again = may_come_to_hold

    def establish(self):
        """Runs the probe once; a probe that raises establishes nothing. A
        fact that may come to hold during a session is probed again each
        time it is asked while it does not hold: it can change only once."""
        if self._result is None or (self._again and not self._result[0]):
            try:
                holds, evidence = self._probe()
                self._result = (bool(holds), str(evidence))
            except Exception as e:  # noqa: BLE001 - reported as the evidence
                self._result = (False, f"the probe failed: {type(e).__name__}: {e}")
        return self._result

    @property
    def holds(self):
        return self.establish()[0]

    @property
    def evidence(self):
        return self.establish()[1]

    def __repr__(self):
        return f"<Fact {self.name}>"


def fact(name, description, may_come_to_hold=False):
    """Decorator: registers the probe as a fact and returns the Fact."""
    def register(probe):
        f = Fact(name, description, probe, may_come_to_hold)
        FACTS[name] = f
        return f
    return register


def _param_fact(name, description, probe):
    """The one fact of that name, made on first use (for fact families)."""
    if name not in FACTS:
        FACTS[name] = Fact(name, description, probe)
    return FACTS[name]


# ---- skipping ----

_CITE = re.compile(r"^\[host: ([^\]]+)\] ")


def host_skip(facts, detail, *, allow_module_level=False):
    """Skips the current test, citing one fact or several (explained if any
    holds); detail says what the test needed."""
    __tracebackhide__ = True  # the skip's location is the caller's line
    facts = (facts,) if isinstance(facts, Fact) else tuple(facts)
    if not facts or not all(isinstance(f, Fact) for f in facts):
        raise TypeError(f"host_skip cites Facts, not {facts!r}")
    names = ", ".join(f.name for f in facts)
    pytest.skip(f"[host: {names}] {detail}", allow_module_level=allow_module_level)


def cited_facts(reason):
    """The facts a skip reason cites (host_skip's prefix, importorskip's
    message), and the reason without the prefix."""
    m = _CITE.match(reason)
    if m:
        names = [n.strip() for n in m.group(1).split(",")]
        return [FACTS.get(n) or _unknown_fact(n) for n in names], reason[m.end():]
    m = re.match(r"^could not import '([^']+)'", reason)
    if m:
        return [missing_module(m.group(1))], reason
    return [], reason


def _unknown_fact(name):
    return Fact(name, "(no such fact is registered)", lambda: (False, "not registered"))


# ---- the audit ----

_FACTS_FOUND = "host facts found"  # a skip report's user property


def _skip_reason(report):
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


class HostSkipAudit:
    """Collects every skip, sorts them into explained and unexplained at the
    end, prints them, and fails the session on an unexplained one."""

    def __init__(self):
        self.skips = []  # (nodeid, reason)
        self.explained = []  # (nodeid, facts that hold, detail)
        self.unexplained = []  # (nodeid, reason, why)

    def _record(self, report):
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        self.skips.append((report.nodeid, _skip_reason(report)))
        # A fact a pytest-xdist worker made (a family's, as missing_tool's)
        # is known here only by what the worker found.
        for name, description, holds, evidence in dict(
                getattr(report, "user_properties", ())).get(_FACTS_FOUND, ()):
            if name not in FACTS:
                FACTS[name] = Fact(name, description, lambda h=holds, e=evidence: (h, e))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        """A skip carries what its facts' probes found where it ran."""
        report = (yield).get_result()
        if report.skipped and not hasattr(report, "wasxfail"):
            facts, _ = cited_facts(_skip_reason(report))
            report.user_properties.append(
                (_FACTS_FOUND, [(f.name, f.description, *f.establish()) for f in facts]))

    def pytest_runtest_logreport(self, report):
        self._record(report)

    def pytest_collectreport(self, report):
        self._record(report)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session):
        for f in list(FACTS.values()):
            f.establish()

    def classify(self):
        self.explained, self.unexplained = [], []
        for nodeid, reason in self.skips:
            facts, detail = cited_facts(reason)
            holding = [f for f in facts if f.holds]
            if holding:
                self.explained.append((nodeid, holding, detail))
            elif facts:
                why = "; ".join(f"{f.name} does not hold here ({f.evidence})" for f in facts)
                self.unexplained.append((nodeid, reason, why))
            else:
                self.unexplained.append((nodeid, reason, "it cites no host fact"))

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session):
        self.classify()
        if self.unexplained and session.exitstatus in (pytest.ExitCode.OK,
                                                       pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        if self.explained:
            tr.write_sep("=", f"host skips: {len(self.explained)} (what this host lacks)")
            by_fact = {}
            for nodeid, holding, detail in self.explained:
                by_fact.setdefault(holding[0].name, (holding[0], []))[1].append((nodeid, detail))
            for f, tests in by_fact.values():
                tr.write_line(f"{f.name}: {f.description}")
                tr.write_line(f"    probe: {f.evidence}")
                for nodeid, detail in tests:
                    tr.write_line(f"  SKIP {nodeid}")
                    tr.write_line(f"       {detail}")
        if self.unexplained:
            tr.write_sep("=", f"unexplained skips: {len(self.unexplained)} (the session fails)",
                         red=True)
            for nodeid, reason, why in self.unexplained:
                tr.write_line(f"UNEXPLAINED SKIP {nodeid}: {reason}", red=True)
                tr.write_line(f"    {why}")
            tr.write_line("A skip must cite a host fact that holds here (tests/helpers/hostfacts.py): "
                          "fix the test, or cite or add the fact.", red=True)


def pytest_configure(config):
    if not config.pluginmanager.has_plugin("hostskip-audit"):
        config.pluginmanager.register(HostSkipAudit(), "hostskip-audit")


# ---- kernel interfaces the probes use (numbers from the kernel's uapi) ----

KVMIO = 0xAE


def _io(kind, nr):
    return (kind << 8) | nr


def _iowr(kind, nr, size):
    return (3 << 30) | (size << 16) | (kind << 8) | nr


def _iow(kind, nr, size):
    return (1 << 30) | (size << 16) | (kind << 8) | nr


def _ior(kind, nr, size):
    return (2 << 30) | (size << 16) | (kind << 8) | nr


KVM_GET_API_VERSION = _io(KVMIO, 0x00)
KVM_CREATE_VM = _io(KVMIO, 0x01)
KVM_CHECK_EXTENSION = _io(KVMIO, 0x03)
KVM_GET_SUPPORTED_CPUID = _iowr(KVMIO, 0x05, 8)
KVM_CREATE_GUEST_MEMFD = _iowr(KVMIO, 0xD4, 64)
KVM_CAP_BINARY_STATS_FD = 203
KVM_CAP_GUEST_MEMFD = 234
KVM_CAP_GUEST_MEMFD_FLAGS = 244
GUEST_MEMFD_FLAG_MMAP = 1 << 0
GUEST_MEMFD_FLAG_INIT_SHARED = 1 << 1
# KVM Userfault's capability, out of tree (upstream gave 245 to an arm64 capability,
# which x86 KVM answers 0): csrc/uapi_compat.h
KVM_CAP_USERFAULT = 245
KVM_GET_VCPU_MMAP_SIZE = _io(KVMIO, 0x04)
KVM_SET_USER_MEMORY_REGION2 = _iow(KVMIO, 0x49, 160)  # struct kvm_userspace_memory_region2
KVM_MEM_GUEST_MEMFD = 1 << 2
KVM_SET_TSS_ADDR = _io(KVMIO, 0x47)
KVM_RUN = _io(KVMIO, 0x80)
KVM_SET_REGS = _iow(KVMIO, 0x82, 144)  # struct kvm_regs
KVM_GET_SREGS = _ior(KVMIO, 0x83, 312)  # struct kvm_sregs (x86)
KVM_SET_SREGS = _iow(KVMIO, 0x84, 312)
KVM_EXIT_IO = 2

UFFDIO = 0xAA
UFFD_API = 0xAA
UFFDIO_API = _iowr(UFFDIO, 0x3F, 24)
UFFDIO_REGISTER = _iowr(UFFDIO, 0x00, 32)
USERFAULTFD_IOC_NEW = _io(UFFDIO, 0x00)
UFFDIO_REGISTER_MODE_MISSING = 1
UFFD_FEATURE_SIGBUS = 1 << 7
UFFD_FEATURE_MINOR_HUGETLBFS = 1 << 9
UFFD_FEATURE_MINOR_SHMEM = 1 << 10
UFFD_FEATURE_WP_ASYNC = 1 << 15
UFFD_FEATURE_MOVE = 1 << 16
SYS_userfaultfd = 323  # x86_64, the only architecture uffdkvm builds a guest for

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def _err(what, e):
    code = errno_.errorcode.get(e, str(e))
    return f"{what}: {os.strerror(e)} ({code})"


class _Fds:
    """Closes every fd it was given."""

    def __init__(self):
        self.fds = []

    def __enter__(self):
        return self

    def add(self, fd):
        self.fds.append(fd)
        return fd

    def __exit__(self, *exc):
        for fd in reversed(self.fds):
            os.close(fd)


def _open_kvm(fds):
    """(fd, None) or (None, why not)."""
    try:
        fd = fds.add(os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC))
    except OSError as e:
        return None, _err("open(/dev/kvm)", e.errno)
    return fd, None


def _create_vm(fds):
    kvm, why = _open_kvm(fds)
    if kvm is None:
        return None, None, why
    try:
        version = ioctl(kvm, KVM_GET_API_VERSION)
        if version != 12:
            return None, None, f"KVM_GET_API_VERSION is {version}, not 12"
    except OSError as e:
        return None, None, _err("KVM_GET_API_VERSION", e.errno)
    # EINTR: a signal pending as the VM's MMU notifier registered (CI saw a
    # probe fail so once, and a false fact skipped 13 tests): ask again.
    tries = 0
    while True:
        try:
            return kvm, fds.add(ioctl(kvm, KVM_CREATE_VM, 0)), None
        except OSError as e:
            tries += 1
            if e.errno != errno_.EINTR or tries == 8:
                return None, None, _err("KVM_CREATE_VM", e.errno)


def _uffd_open(fds):
    """A userfaultfd that can take kernel-mode (KVM) faults: the syscall,
    else /dev/userfaultfd, as uffdkvm tries them. (fd, None) or (None, why)."""
    flags = os.O_CLOEXEC | os.O_NONBLOCK
    fd = _libc.syscall(SYS_userfaultfd, flags)
    if fd >= 0:
        return fds.add(fd), None
    sys_errno = ctypes.get_errno()
    try:
        dev = os.open("/dev/userfaultfd", os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        return None, (f"{_err('userfaultfd()', sys_errno)}; "
                      f"{_err('open(/dev/userfaultfd)', e.errno)}")
    try:
        return fds.add(ioctl(dev, USERFAULTFD_IOC_NEW, flags)), None
    except OSError as e:
        return None, (f"{_err('userfaultfd()', sys_errno)}; "
                      f"{_err('USERFAULTFD_IOC_NEW', e.errno)}")
    finally:
        os.close(dev)


def _uffd_api(fd, features=0):
    """The features the kernel grants, after the UFFDIO_API handshake."""
    buf = bytearray(struct.pack("QQQ", UFFD_API, features, 0))
    ioctl(fd, UFFDIO_API, buf)
    return struct.unpack("QQQ", buf)[1]


def _uffd_features():
    """(features, None) or (None, why not)."""
    with _Fds() as fds:
        fd, why = _uffd_open(fds)
        if fd is None:
            return None, why
        try:
            # Asking for no feature returns every feature the kernel has.
            return _uffd_api(fd), None
        except OSError as e:
            return None, _err("UFFDIO_API", e.errno)


# ---- KVM and userfaultfd ----

@fact("no-kvm", "KVM is unusable: /dev/kvm is missing, not accessible, or cannot create a VM")
def NO_KVM():
    with _Fds() as fds:
        _, vm, why = _create_vm(fds)
        return vm is None, why or "/dev/kvm opened and KVM_CREATE_VM succeeded"


@fact("no-userfaultfd", "userfaultfd is unusable for kernel-mode faults: the syscall is "
      "refused (no CAP_SYS_PTRACE, vm.unprivileged_userfaultfd=0) and /dev/userfaultfd too")
def NO_USERFAULTFD():
    features, why = _uffd_features()
    return features is None, why or "userfaultfd and UFFDIO_API succeeded"


MISC_MAJOR = 10  # include/uapi/linux/major.h


def misc_device(name):
    """(major, minor) of the misc device of that name, as the kernel lists it
    in /proc/misc, or None. Most misc minors are dynamic (userfaultfd's is
    MISC_DYNAMIC_MINOR: 257 on Linux 6.18, 126 in Debian's 6.1), so a node made by hand
    needs this number."""
    with open("/proc/misc") as f:
        for line in f:
            minor, _, dev = line.strip().partition(" ")
            if dev == name:
                return MISC_MAJOR, int(minor)
    return None


@fact("no-dev-userfaultfd", "this kernel has no /dev/userfaultfd (Linux 6.1+): /proc/misc "
      "lists no userfaultfd device")
def NO_DEV_USERFAULTFD():
    dev = misc_device("userfaultfd")
    return dev is None, (f"/proc/misc lists userfaultfd at minor {dev[1]}" if dev
                         else "/proc/misc lists no userfaultfd")


def _missing_uffd_feature(bit, name):
    features, why = _uffd_features()
    if features is None:
        return True, f"no userfaultfd at all: {why}"
    has = bool(features & bit)
    return not has, f"UFFDIO_API features 0x{features:x} {'have' if has else 'lack'} {name}"


@fact("no-uffd-minor-shmem", "this kernel's userfaultfd has no MINOR faults on shmem (Linux 5.14+)")
def NO_UFFD_MINOR_SHMEM():
    return _missing_uffd_feature(UFFD_FEATURE_MINOR_SHMEM, "UFFD_FEATURE_MINOR_SHMEM")


@fact("no-uffd-minor-hugetlbfs", "this kernel's userfaultfd has no MINOR faults on hugetlbfs "
      "(Linux 5.13+)")
def NO_UFFD_MINOR_HUGETLBFS():
    return _missing_uffd_feature(UFFD_FEATURE_MINOR_HUGETLBFS, "UFFD_FEATURE_MINOR_HUGETLBFS")


@fact("no-uffd-move", "this kernel's userfaultfd has no UFFDIO_MOVE (Linux 6.8+)")
def NO_UFFD_MOVE():
    return _missing_uffd_feature(UFFD_FEATURE_MOVE, "UFFD_FEATURE_MOVE")


@fact("no-uffd-wp-async", "this kernel's userfaultfd has no asynchronous write-protect "
      "(UFFD_FEATURE_WP_ASYNC, Linux 6.7+)")
def NO_UFFD_WP_ASYNC():
    return _missing_uffd_feature(UFFD_FEATURE_WP_ASYNC, "UFFD_FEATURE_WP_ASYNC")


TMPFS_MAGIC = 0x01021994


@fact("tmpdir-on-tmpfs", "the temporary directory (where tmp_path and tempfile put files) is "
      "on tmpfs, which has no disk to drop a file's page cache to: source_cache cold is refused")
def TMPDIR_ON_TMPFS():
    where = tempfile.gettempdir()
    buf = ctypes.create_string_buffer(120)  # struct statfs: f_type first
    if _libc.statfs(os.fsencode(where), buf) != 0:
        return False, _err(f"statfs({where})", ctypes.get_errno())
    f_type = struct.unpack_from("q", buf, 0)[0]
    return f_type == TMPFS_MAGIC, f"statfs({where}).f_type = 0x{f_type:x}"


# io_uring (include/uapi/linux/io_uring.h), x86-64
SYS_io_uring_setup = 425
SYS_io_uring_enter = 426
IORING_OFF_SQ_RING = 0
IORING_OFF_CQ_RING = 0x8000000
IORING_OFF_SQES = 0x10000000
IORING_OP_READ = 22


def _uring_read_waits(uffd):
    """Sets up a one-entry io_uring by hand (io_uring_setup, its three
    mappings), submits a read of the empty non-blocking uffd and looks at the
    completion queue: (True, evidence) if the read waits, (False, why) if it
    completed at once or io_uring is refused."""
    params = ctypes.create_string_buffer(120)  # struct io_uring_params
    ring = _libc.syscall(SYS_io_uring_setup, 1, params)
    if ring < 0:
        return False, _err("io_uring_setup", ctypes.get_errno())
    sq_entries, cq_entries = struct.unpack_from("II", params, 0)
    # struct io_sqring_offsets at 40, struct io_cqring_offsets at 80
    sq_head, sq_tail, sq_mask, _, _, _, sq_array = struct.unpack_from("7I", params, 40)
    cq_head, cq_tail, cq_mask, _, _, cqes = struct.unpack_from("6I", params, 80)
    maps = []
    try:
        sq = mmap.mmap(ring, sq_array + 4 * sq_entries, offset=IORING_OFF_SQ_RING)
        cq = mmap.mmap(ring, cqes + 16 * cq_entries, offset=IORING_OFF_CQ_RING)
        sqes = mmap.mmap(ring, 64 * sq_entries, offset=IORING_OFF_SQES)
        maps = [sq, cq, sqes]
        buf = ctypes.create_string_buffer(32)  # one struct uffd_msg
        # struct io_uring_sqe: opcode, flags, ioprio, fd, off, addr, len, rw_flags, user_data
        struct.pack_into("BBHiQQIIQ", sqes, 0, IORING_OP_READ, 0, 0, uffd, 0,
                         ctypes.addressof(buf), 32, 0, 1)
        tail = struct.unpack_from("I", sq, sq_tail)[0]
        struct.pack_into("I", sq, sq_array + 4 * (tail & struct.unpack_from("I", sq, sq_mask)[0]), 0)
        struct.pack_into("I", sq, sq_tail, tail + 1)
        if _libc.syscall(SYS_io_uring_enter, ring, 1, 0, 0, None, 0) < 0:
            return False, _err("io_uring_enter", ctypes.get_errno())
        head, ctail = struct.unpack_from("I", cq, cq_head)[0], struct.unpack_from("I", cq, cq_tail)[0]
        if head == ctail:
            return True, "an io_uring read of the empty non-blocking uffd waits"
        res = struct.unpack_from("i", cq, cqes + 16 * (head & struct.unpack_from("I", cq, cq_mask)[0]) + 8)[0]
        return False, (f"an io_uring read of the empty non-blocking uffd completed at once: "
                       f"{_err('IORING_OP_READ', -res) if res < 0 else res}")
    finally:
        for m in maps:
            m.close()
        os.close(ring)  # the kernel cancels the read


@fact("no-io-uring-uffd", "the kernel cannot wait for a userfaultfd through io_uring: no "
      "io_uring, io_uring refused to this process (kernel.io_uring_disabled, seccomp), or an "
      "io_uring that completes a read of a non-blocking file at once (no retry of O_NONBLOCK "
      "files, before Linux 5.15)")
def NO_IO_URING_UFFD():
    with _Fds() as fds:
        fd, why = _uffd_open(fds)
        if fd is None:
            return True, f"no userfaultfd at all: {why}"
        try:
            _uffd_api(fd)
        except OSError as e:
            return True, _err("UFFDIO_API", e.errno)
        waits, why = _uring_read_waits(fd)
        return not waits, why


@fact("no-kvm-stats", "this KVM has no binary statistics (KVM_CAP_BINARY_STATS_FD, Linux 5.14+)")
def NO_KVM_STATS():
    with _Fds() as fds:
        kvm, why = _open_kvm(fds)
        if kvm is None:
            return True, why
        cap = ioctl(kvm, KVM_CHECK_EXTENSION, KVM_CAP_BINARY_STATS_FD)
        return cap <= 0, f"KVM_CHECK_EXTENSION(KVM_CAP_BINARY_STATS_FD) = {cap}"


KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 = 168
KVM_DIRTY_LOG_INITIALLY_SET = 1 << 1
KVM_CAP_DIRTY_LOG_RING = 192
KVM_CAP_DIRTY_LOG_RING_ACQ_REL = 223


def _vm_cap(cap, name):
    """A VM's answer to KVM_CHECK_EXTENSION(cap): (value, why) or (None, why)."""
    with _Fds() as fds:
        _kvm, vm, why = _create_vm(fds)
        if vm is None:
            return None, why
        value = ioctl(vm, KVM_CHECK_EXTENSION, cap)
        return value, f"a VM's KVM_CHECK_EXTENSION({name}) = {value}"


@fact("no-manual-dirty-log", "this KVM has no KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 with "
      "KVM_DIRTY_LOG_INITIALLY_SET (Linux 5.8+): dirty_tracking='bitmap_manual' is refused")
def NO_MANUAL_DIRTY_LOG():
    value, why = _vm_cap(KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2, "KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2")
    return value is None or not value & KVM_DIRTY_LOG_INITIALLY_SET, why


@fact("no-dirty-ring", "this KVM has no dirty ring (KVM_CAP_DIRTY_LOG_RING, Linux 5.11+ on "
      "x86): dirty_tracking='ring' is refused")
def NO_DIRTY_RING():
    value, why = _vm_cap(KVM_CAP_DIRTY_LOG_RING_ACQ_REL, "KVM_CAP_DIRTY_LOG_RING_ACQ_REL")
    if value:
        return False, why
    value, why = _vm_cap(KVM_CAP_DIRTY_LOG_RING, "KVM_CAP_DIRTY_LOG_RING")
    return not value, why


KVM_CREATE_VCPU = _io(KVMIO, 0x41)
KVM_GET_DEVICE_ATTR = (1 << 30) | (24 << 16) | (KVMIO << 8) | 0xE2  # _IOW, struct kvm_device_attr
KVM_VCPU_TSC_CTRL = 0  # the attribute group, and KVM_VCPU_TSC_OFFSET in it (Linux 5.16+)
KVM_VCPU_TSC_OFFSET = 0


def _kvm_tsc_offset(vcpu):
    value = ctypes.c_uint64()
    attr = bytearray(struct.pack("IIQQ", 0, KVM_VCPU_TSC_CTRL, KVM_VCPU_TSC_OFFSET,
                                 ctypes.addressof(value)))
    ioctl(vcpu, KVM_GET_DEVICE_ATTR, attr)
    return ctypes.c_int64(value.value).value


@functools.cache
def _kvm_tsc_offsets():
    """KVM_VCPU_TSC_OFFSET of a new vCPU read twice, 20 ms apart: (first,
    second), or (None, why) where KVM does not say. Once, for both facts."""
    with _Fds() as fds:
        _, vm, why = _create_vm(fds)
        if vm is None:
            return None, why
        try:
            vcpu = fds.add(ioctl(vm, KVM_CREATE_VCPU, 0))
            first = _kvm_tsc_offset(vcpu)
            time.sleep(0.02)  # each ioctl loads the vCPU: an unstable TSC moves the offset
            return first, _kvm_tsc_offset(vcpu)
        except OSError as e:
            return None, _err("KVM_GET_DEVICE_ATTR(KVM_VCPU_TSC_OFFSET)", e.errno)


@fact("no-kvm-tsc-offset", "KVM does not report a vCPU's TSC offset (KVM_VCPU_TSC_OFFSET, "
      "Linux 5.16+), so a run cannot tell whether the guest's TSC kept one offset from the "
      "host's: the sync exits' brackets are wider than the moves KVM makes where the host's "
      "TSC is unstable")
def NO_KVM_TSC_OFFSET():
    first, second = _kvm_tsc_offsets()
    if first is None:
        return True, second
    return False, f"KVM_VCPU_TSC_OFFSET read {first}"


# A kernel may mark its TSC unstable at any time (KVM began to move the offset
# in Debian's 7.2 booted nested, once, ten minutes into the full part, while
# this host ran another suite beside it): asked again until it holds.
@fact("no-steady-kvm-tsc-offset", "KVM moves a vCPU's TSC offset while it runs: the host "
      "kernel marked its TSC unstable, so KVM rewrites the offset each time a vCPU thread is "
      "scheduled in (the guest's TSC stands still while the thread is out), and a run with "
      "guest_timing gives no stages, saying why (clock_sync None)", may_come_to_hold=True)
def NO_STEADY_KVM_TSC_OFFSET():
    first, second = _kvm_tsc_offsets()
    if first is None:
        return False, f"unknown: {second} (see no-kvm-tsc-offset)"
    return first != second, (f"KVM_VCPU_TSC_OFFSET read 20 ms apart on an idle vCPU: "
                             f"{first}, then {second}")


KVM_CAP_MAX_VCPUS = 66
CONFIG_MAX_VCPUS = 4096  # the most vCPUs a uffdkvm Config takes


@fact("kvm-takes-every-config-vcpus", f"KVM allows {CONFIG_MAX_VCPUS} vCPUs per VM or more, so "
      "no Config can ask for more vCPUs than KVM allows")
def KVM_TAKES_EVERY_CONFIG_VCPUS():
    with _Fds() as fds:
        kvm, why = _open_kvm(fds)
        if kvm is None:
            return False, why
        cap = ioctl(kvm, KVM_CHECK_EXTENSION, KVM_CAP_MAX_VCPUS)
        return cap >= CONFIG_MAX_VCPUS, f"KVM_CHECK_EXTENSION(KVM_CAP_MAX_VCPUS) = {cap}"


@fact("no-1g-guest-pages", "KVM offers no 1 GiB pages to guests (no pdpe1gb in "
      "KVM_GET_SUPPORTED_CPUID)")
def NO_1G_GUEST_PAGES():
    with _Fds() as fds:
        kvm, why = _open_kvm(fds)
        if kvm is None:
            return True, why
        nent = 128
        while True:
            buf = bytearray(struct.pack("II", nent, 0) + bytes(40 * nent))
            try:
                ioctl(kvm, KVM_GET_SUPPORTED_CPUID, buf)
                break
            except OSError as e:
                if e.errno != errno_.E2BIG or nent >= 4096:
                    return True, _err("KVM_GET_SUPPORTED_CPUID", e.errno)
                nent *= 2
        count = struct.unpack_from("I", buf)[0]
        for i in range(count):
            function, index, flags, eax, ebx, ecx, edx = struct.unpack_from("7I", buf, 8 + 40 * i)
            if function == 0x80000001:
                has = bool(edx & (1 << 26))
                return not has, f"CPUID 0x80000001 EDX bit 26 (pdpe1gb) is {int(has)}"
        return True, "KVM_GET_SUPPORTED_CPUID has no leaf 0x80000001"


def _guest_memfd(fds, vm, pages=1):
    """An mmap-able guest_memfd of `pages` pages: (fd, None) or (None, why not)."""
    try:
        if ioctl(vm, KVM_CHECK_EXTENSION, KVM_CAP_GUEST_MEMFD) <= 0:
            return None, "KVM_CHECK_EXTENSION(KVM_CAP_GUEST_MEMFD) = 0"
        caps = ioctl(vm, KVM_CHECK_EXTENSION, KVM_CAP_GUEST_MEMFD_FLAGS)
        if caps <= 0 or not caps & GUEST_MEMFD_FLAG_MMAP:
            return None, f"KVM_CAP_GUEST_MEMFD_FLAGS = {caps}: no GUEST_MEMFD_FLAG_MMAP"
        flags = GUEST_MEMFD_FLAG_MMAP | (caps & GUEST_MEMFD_FLAG_INIT_SHARED)
        arg = bytearray(struct.pack("QQ", pages * mmap.PAGESIZE, flags) + bytes(48))
        return fds.add(ioctl(vm, KVM_CREATE_GUEST_MEMFD, arg)), None
    except OSError as e:
        return None, _err("KVM_CREATE_GUEST_MEMFD", e.errno)


@fact("no-guest-memfd", "KVM cannot make a guest_memfd the host can mmap (Linux 6.18+)")
def NO_GUEST_MEMFD():
    with _Fds() as fds:
        _, vm, why = _create_vm(fds)
        if vm is None:
            return True, why
        gmem, why = _guest_memfd(fds, vm)
        return gmem is None, why or "an mmap-able guest_memfd was created"


@fact("no-guest-memfd-uffd", "this kernel's userfaultfd cannot register guest_memfd memory")
def NO_GUEST_MEMFD_UFFD():
    with _Fds() as fds:
        _, vm, why = _create_vm(fds)
        if vm is None:
            return True, why
        gmem, why = _guest_memfd(fds, vm)
        if gmem is None:
            return True, why
        uffd, why = _uffd_open(fds)
        if uffd is None:
            return True, why
        _uffd_api(uffd)
        size = mmap.PAGESIZE
        addr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, gmem, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return True, _err("mmap(guest_memfd)", ctypes.get_errno())
        try:
            reg = bytearray(struct.pack("QQQQ", addr, size, UFFDIO_REGISTER_MODE_MISSING, 0))
            ioctl(uffd, UFFDIO_REGISTER, reg)
            return False, "UFFDIO_REGISTER(MISSING) of an mmap'ed guest_memfd succeeded"
        except OSError as e:
            return True, _err("UFFDIO_REGISTER(MISSING) of an mmap'ed guest_memfd", e.errno)
        finally:
            _libc.munmap(addr, size)


@contextlib.contextmanager
def _deadline(seconds, what):
    """A blocking call in the main thread gives up after `seconds`: SIGALRM
    interrupts it (EINTR) and its handler raises TimeoutError. Elsewhere
    (signals reach only the main thread) no bound."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"{what} still blocked after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# The probe's guest, 16-bit real mode at guest-physical 0: reads the byte at
# 0x1000 (the second page), writes it to port 0x10, halts.
_READ_PAGE_1 = bytes([0xA0, 0x00, 0x10,   # mov al, [0x1000]
                      0xE6, 0x10,         # out 0x10, al
                      0xF4])              # hlt
_PROBE_PORT = 0x10


def _guest_reads_page_1(fds, kvm, vm):
    """Runs _READ_PAGE_1 in a fresh vCPU of vm: (the byte the guest read,
    None), or (None, how KVM_RUN ended instead)."""
    # Real mode on Intel without unrestricted guests needs it; elsewhere it costs
    # nothing. The address is an unsigned long, beyond what fcntl.ioctl passes.
    if _libc.ioctl(vm, KVM_SET_TSS_ADDR, ctypes.c_ulong(0xFFFBD000)) < 0:
        return None, _err("KVM_SET_TSS_ADDR", ctypes.get_errno())
    vcpu = fds.add(ioctl(vm, KVM_CREATE_VCPU, 0))
    kvm_run = mmap.mmap(vcpu, ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE))
    try:
        sregs = bytearray(312)
        ioctl(vcpu, KVM_GET_SREGS, sregs)
        struct.pack_into("Q", sregs, 0, 0)    # cs.base (struct kvm_segment cs comes first)
        struct.pack_into("H", sregs, 12, 0)   # cs.selector
        ioctl(vcpu, KVM_SET_SREGS, bytes(sregs))
        regs = bytearray(144)
        struct.pack_into("QQ", regs, 128, 0, 2)  # rip 0; rflags: bit 1 is always set
        ioctl(vcpu, KVM_SET_REGS, bytes(regs))
        try:
            with _deadline(10, "KVM_RUN"):
                ioctl(vcpu, KVM_RUN, 0)
        except OSError as e:
            return None, _err("KVM_RUN", e.errno)
        reason = struct.unpack_from("I", kvm_run, 8)[0]
        # struct kvm_run's io: direction, size, port, count, data_offset, at 32
        _, size, port, _, offset = struct.unpack_from("BBHIQ", kvm_run, 32)
        if reason != KVM_EXIT_IO or port != _PROBE_PORT or size != 1:
            return None, f"KVM_RUN exited with reason {reason}, not the guest's port 0x10 write"
        return kvm_run[offset], None
    finally:
        kvm_run.close()


@fact("guest-memfd-bypasses-uffd", "userfaultfd registers guest_memfd memory, but the guest's "
      "accesses do not fault through it: KVM maps guest_memfd pages for the guest from the "
      "file itself, not through the host's mapping userfaultfd watches (only KVM Userfault, "
      "KVM_MEM_USERFAULT, makes them exit), so a uffd_mode on guest_memfd is refused")
def GUEST_MEMFD_BYPASSES_UFFD():
    """A 2-page guest_memfd as the VM's memory at guest-physical 0: the
    guest's code in page 0, page 1 never filled and registered MISSING with
    a uffd that fails faults at once (UFFD_FEATURE_SIGBUS, so a fault that
    went through it would end KVM_RUN with EFAULT rather than wait). The
    fact holds if the guest reads page 1 and no fault reached the uffd."""
    with _Fds() as fds:
        kvm, vm, why = _create_vm(fds)
        if vm is None:
            return False, why
        gmem, why = _guest_memfd(fds, vm, pages=2)
        if gmem is None:
            return False, why
        size = 2 * mmap.PAGESIZE
        addr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, gmem, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return False, _err("mmap(guest_memfd)", ctypes.get_errno())
        try:
            ctypes.memmove(addr, _READ_PAGE_1, len(_READ_PAGE_1))
            region = struct.pack("IIQQQQII", 0, KVM_MEM_GUEST_MEMFD, 0, size, addr, 0, gmem, 0)
            try:
                ioctl(vm, KVM_SET_USER_MEMORY_REGION2, region + bytes(112))
            except OSError as e:
                return False, _err("KVM_SET_USER_MEMORY_REGION2(KVM_MEM_GUEST_MEMFD)", e.errno)
            uffd, why = _uffd_open(fds)
            if uffd is None:
                return False, why
            try:
                _uffd_api(uffd, UFFD_FEATURE_SIGBUS)
                reg = struct.pack("QQQQ", addr + mmap.PAGESIZE, mmap.PAGESIZE,
                                  UFFDIO_REGISTER_MODE_MISSING, 0)
                ioctl(uffd, UFFDIO_REGISTER, bytearray(reg))
            except OSError as e:
                return False, _err("UFFDIO_REGISTER(MISSING) of an mmap'ed guest_memfd", e.errno)
            byte, why = _guest_reads_page_1(fds, kvm, vm)
            if byte is None:
                return False, f"{why}: the guest's read of the registered page did not complete"
            try:
                os.read(uffd, 32)
                return False, "the guest's read completed, but a fault reached the uffd"
            except BlockingIOError:
                pass
            cap = ioctl(vm, KVM_CHECK_EXTENSION, KVM_CAP_USERFAULT)
            return True, (f"the guest read 0x{byte:02x} from a guest_memfd page registered "
                          "MISSING with userfaultfd and never filled, and no fault reached the "
                          f"uffd; KVM_CHECK_EXTENSION(KVM_CAP_USERFAULT, 245) = {cap}")
        finally:
            _libc.munmap(addr, size)


# ---- memory ----

HUGEPAGES = "/sys/kernel/mm/hugepages"
# Huge pages the session may need at once, by size in kB: the `hugepages`
# fixture in conftest adds these to the pools, as root.
HUGEPAGE_POOLS = {2048: 16, 1048576: 1}
# Sessions that run at once on one host (several worktrees, say) change the
# pools under this lock, and by counts, never to absolute sizes: a session
# that set the pool back to what it saw at its start would take away the
# pages another session had added meanwhile.
HUGEPAGES_LOCK = os.path.join(tempfile.gettempdir(), "uffdkvm-hugepages.lock")


def _read_int(path):
    with open(path) as f:
        return int(f.read())


@contextlib.contextmanager
def _pools_locked():
    fd = os.open(HUGEPAGES_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def hugepage_pool(size_kb):
    return f"{HUGEPAGES}/hugepages-{size_kb}kB"


def add_hugepages(size_kb, count):
    """As root: adds count pages to the pool; returns how many the kernel
    found (fewer when memory is short or too fragmented)."""
    path = f"{hugepage_pool(size_kb)}/nr_hugepages"
    with _pools_locked():
        before = _read_int(path)
        with open(path, "w") as f:
            f.write(str(before + count))
        return max(_read_int(path) - before, 0)


def remove_hugepages(size_kb, count):
    """Takes back count pages that add_hugepages() added."""
    path = f"{hugepage_pool(size_kb)}/nr_hugepages"
    with _pools_locked():
        now = _read_int(path)
        with open(path, "w") as f:
            f.write(str(max(now - count, 0)))


def _hugepages(size_kb):
    want = HUGEPAGE_POOLS[size_kb]
    base = hugepage_pool(size_kb)
    try:
        free = _read_int(f"{base}/free_hugepages")
        resv = _read_int(f"{base}/resv_hugepages")
    except OSError as e:
        return True, f"no pool: {e}"
    available = free - resv
    if os.geteuid() != 0:
        return (available < want,
                f"{available} free in {base}, {want} needed, and only root can add more")
    # Root adds them for the session (the hugepages fixture): try it for real.
    try:
        got = add_hugepages(size_kb, want)
    except OSError as e:
        return True, f"adding to {base}/nr_hugepages: {e}"
    remove_hugepages(size_kb, got)
    if got < want:
        return True, (f"asked the kernel for {want} more in {base} and it found {got} "
                      f"(memory short or too fragmented)")
    return False, f"root can add {want} to {base} (added, then taken back)"


@fact("no-hugepages-2m", f"{HUGEPAGE_POOLS[2048]} free 2 MiB huge pages cannot be had here "
      "(not root and fewer are free, or the kernel cannot find them)")
def NO_HUGEPAGES_2M():
    return _hugepages(2048)


@fact("no-hugepages-1g", f"{HUGEPAGE_POOLS[1048576]} free 1 GiB huge page cannot be had here "
      "(not root and none is free, or the kernel cannot find 1 GiB in one piece)")
def NO_HUGEPAGES_1G():
    return _hugepages(1048576)


@fact("no-thp", "this kernel has no transparent huge pages")
def NO_THP():
    path = "/sys/kernel/mm/transparent_hugepage/enabled"
    try:
        with open(path) as f:
            return False, f"{path}: {f.read().strip()}"
    except OSError as e:
        return True, str(e)


def mem_info(key):
    """A /proc/meminfo value in bytes, or None. Read here, not through
    uffdkvm.host.facts.meminfo_bytes: a probe never goes through uffdkvm."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


@fact("no-memavailable", "/proc/meminfo has no MemAvailable (Linux before 3.14)")
def NO_MEMAVAILABLE():
    return mem_info("MemAvailable") is None, "looked for MemAvailable in /proc/meminfo"


def mem_available_below(nbytes):
    """Less than nbytes of MemAvailable at session start."""
    gib = nbytes / (1 << 30)

    def probe():
        have = mem_info("MemAvailable")
        if have is None:
            return True, "no MemAvailable in /proc/meminfo"
        return have < nbytes, f"MemAvailable {have / (1 << 30):.1f} GiB"
    return _param_fact(f"mem-available-below:{gib:g}GiB",
                       f"less than {gib:g} GiB of memory is available", probe)


# ---- the build and the checkout under test ----
# Facts about what is being tested rather than the host, with the same rule:
# a skip that cites one is explained only if the probe confirms it.

@fact("built-without-test-hooks", "uffdkvm._core was built without test hooks (fault "
      "injection, uffdkvm.testing._faults): build with UFFDKVM_TEST_HOOKS=1")
def BUILT_WITHOUT_TEST_HOOKS():
    # The tests decide by _core.TEST_HOOKS; the probe looks at something
    # else the build leaves: the INJECT_* constants the binding exports only
    # under UKVM_TEST_HOOKS (a build that misreported TEST_HOOKS as False
    # would leave its skips unexplained).
    from uffdkvm import _core
    injects = sorted(n for n in dir(_core) if n.startswith("INJECT_"))
    if injects:
        return False, f"{_core.__file__} exports {len(injects)} INJECT_* constants"
    return True, f"{_core.__file__} exports no INJECT_* constant"


@fact("without-libcrypto", "uffdkvm cannot check page server keys here (built without "
      "OpenSSL's headers, or no libcrypto to load), so TCP page servers and keys are refused: "
      "apt-get install libssl-dev and build again")
def WITHOUT_LIBCRYPTO():
    # The probe looks at the binary and the library, not at _core.HAVE_LIBCRYPTO:
    # auth.c compiles the soname it loads in only with the headers.
    from uffdkvm import _core
    found = re.search(rb"libcrypto\.so\.\d+", Path(_core.__file__).read_bytes())
    if found is None:
        return True, f"{_core.__file__} names no libcrypto soname (built without its headers)"
    soname = found.group().decode()
    try:
        ctypes.CDLL(soname)
    except OSError as e:
        return True, f"{_core.__file__} loads {soname}, which does not load here: {e}"
    return False, f"{_core.__file__} loads {soname}, which loads here"


@fact("built-without-liburing", "uffdkvm._core was built without liburing, so without "
      "wait=\"io_uring\": apt-get install liburing-dev and build again")
def BUILT_WITHOUT_LIBURING():
    # The tests decide by _core.HAVE_IO_URING; the probe looks at the binary
    # instead: the refusal csrc/uffd/ring.c compiles in only without liburing.
    from uffdkvm import _core
    built_without = b"was built without liburing" in Path(_core.__file__).read_bytes()
    return built_without, (f"{_core.__file__} {'holds' if built_without else 'lacks'} "
                           "ring.c's refusal of a build without liburing")


ROOT = Path(__file__).resolve().parents[2]


@fact("not-a-git-checkout", "the tests run outside a git checkout of uffdkvm (an unpacked "
      "sdist, say): there is no git ls-files to compare with")
def NOT_A_GIT_CHECKOUT():
    p = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--show-toplevel"],
                       capture_output=True, text=True, timeout=60)
    if p.returncode:
        return True, f"git rev-parse in {ROOT}: {p.stderr.strip()}"
    top = Path(p.stdout.strip()).resolve()
    return top != ROOT, f"git's top level is {top}, the project's {ROOT}"


# ---- the network ----

IFF_UP = 0x1
SIOCGIFFLAGS = 0x8913


@fact("loopback-down", "the loopback interface (lo) is not up here, so nothing can listen "
      "on 127.0.0.1 (a VM or container started without networking, say)")
def LOOPBACK_DOWN():
    # SIOCGIFFLAGS asks this network namespace (/sys/class/net may show another's).
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            ifreq = ioctl(s.fileno(), SIOCGIFFLAGS, struct.pack("16sH22x", b"lo", 0))
        flags = struct.unpack("16sH22x", ifreq)[1]
    except OSError as e:
        return True, _err("SIOCGIFFLAGS(lo)", e.errno)
    if not flags & IFF_UP:
        return True, f"SIOCGIFFLAGS(lo) = {flags:#x}: IFF_UP is clear"
    # Up by its flags: a TCP connection to ourselves on 127.0.0.1 must work too.
    try:
        with socket.create_server(("127.0.0.1", 0)) as server:
            port = server.getsockname()[1]
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
    except OSError as e:
        return True, f"lo is up ({flags:#x}) but TCP on 127.0.0.1 failed: {e}"
    return False, f"lo is up ({flags:#x}) and a TCP connection to 127.0.0.1:{port} worked"


@fact("no-netns", "this host cannot give a test two network namespaces joined by a veth "
      "pair (it needs root, iproute2's ip and a kernel with network namespaces and veth)")
def NO_NETNS():
    ip = shutil.which("ip")
    if os.geteuid() != 0 or ip is None:
        return True, f"euid {os.geteuid()}, ip at {ip}"
    name = f"uffdkvm-probe-{os.getpid()}"
    try:
        made = subprocess.run([ip, "netns", "add", name], capture_output=True, text=True,
                              timeout=30)
        if made.returncode:
            return True, f"ip netns add: {made.stderr.strip()}"
        veth = subprocess.run([ip, "-n", name, "link", "add", "p0", "type", "veth", "peer",
                               "name", "p1"], capture_output=True, text=True, timeout=30)
        if veth.returncode:
            return True, f"ip link add type veth: {veth.stderr.strip()}"
    except (OSError, subprocess.SubprocessError) as e:
        return True, f"ip: {e}"
    finally:
        subprocess.run([ip, "netns", "delete", name], capture_output=True, timeout=30)
    return False, "ip netns add and a veth pair in it worked"


@fact("debian-archive-unreachable", "Debian's archive (deb.debian.org, or the mirror "
      "UFFDKVM_DEBIAN_MIRROR names) cannot be reached from here, so no Debian kernel can be "
      "fetched to boot")
def DEBIAN_ARCHIVE_UNREACHABLE():
    import urllib.request
    base = os.environ.get("UFFDKVM_DEBIAN_MIRROR", "http://deb.debian.org").rstrip("/")
    url = f"{base}/debian/dists/bookworm/Release"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"),
                                    timeout=20) as r:
            return False, f"HEAD {url}: {r.status}"
    except OSError as e:
        return True, f"HEAD {url}: {e}"


@fact("no-static-busybox", "no static busybox at /bin/busybox (Debian's busybox-static), "
      "which a booted kernel's initramfs needs as its /init")
def NO_STATIC_BUSYBOX():
    if not os.path.exists("/bin/busybox"):
        return True, "no /bin/busybox"
    ldd = subprocess.run(["ldd", "/bin/busybox"], capture_output=True, text=True, timeout=30)
    return ldd.returncode == 0, f"ldd /bin/busybox: {(ldd.stdout or ldd.stderr).strip()}"


# ---- privileges, CPUs, tools ----

@fact("not-root", "the tests do not run as root")
def NOT_ROOT():
    return os.geteuid() != 0, f"euid {os.geteuid()}"


@fact("unprivileged-userfaultfd", "vm.unprivileged_userfaultfd=1: every user may call "
      "userfaultfd(), so a host that refuses it cannot be built")
def UNPRIVILEGED_USERFAULTFD():
    path = "/proc/sys/vm/unprivileged_userfaultfd"
    try:
        with open(path) as f:
            value = f.read().strip()
    except OSError as e:
        return False, str(e)
    return value != "0", f"{path} = {value}"


@fact("all-cpu-numbers-usable", "this process may run on every CPU number a Config takes "
      "(0-1023), so there is no CPU it may not run on")
def ALL_CPU_NUMBERS_USABLE():
    top = max(os.sched_getaffinity(0))
    return top + 1 > 1023, f"highest usable CPU {top}"


def nofile_hard_limit_below(n):
    """The process may not raise its soft RLIMIT_NOFILE to n."""
    def probe():
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return hard != resource.RLIM_INFINITY and hard < n, \
            f"RLIMIT_NOFILE soft {soft}, hard {hard}"
    return _param_fact(f"nofile-hard-limit-below:{n}",
                       f"the hard limit on open files is below {n}", probe)


def fewer_cpus_than(n):
    """This process may run on fewer than n CPUs."""
    def probe():
        allowed = os.sched_getaffinity(0)
        return len(allowed) < n, f"sched_getaffinity: {sorted(allowed)}"
    return _param_fact(f"fewer-cpus-than:{n}", f"this process may run on fewer than {n} CPUs",
                       probe)


def cpus_unavailable(*cpus):
    """This process may not run on some of these CPUs."""
    def probe():
        allowed = os.sched_getaffinity(0)
        return not set(cpus) <= allowed, f"sched_getaffinity: {sorted(allowed)}"
    names = "+".join(map(str, cpus))
    return _param_fact(f"cpus-unavailable:{names}",
                       f"this process may not run on CPUs {', '.join(map(str, cpus))}", probe)


def missing_tool(name):
    """No program of that name on PATH."""
    def probe():
        where = shutil.which(name)
        return where is None, where or f"{name} is not on PATH"
    return _param_fact(f"missing-tool:{name}", f"{name} is not installed", probe)


def missing_module(name):
    """No Python module of that name (the [test] extra installs them all)."""
    def probe():
        try:
            spec = importlib.util.find_spec(name)
        except ImportError as e:  # a parent package is missing
            return True, str(e)
        return spec is None, spec.origin if spec else f"no module {name}"
    return _param_fact(f"missing-module:{name}",
                       f"the Python module {name} is not installed", probe)


# ---- the C toolchain (tests/c) ----

def c_compiler():
    """What make's $(CC) will be."""
    return shlex.split(os.environ.get("CC", "cc"))


@fact("no-cc", "no C compiler: $CC (or cc) is not on PATH")
def NO_CC():
    cc = c_compiler()
    where = shutil.which(cc[0])
    return where is None, where or f"{cc[0]!r} is not on PATH"


SANITIZER_FLAGS = {  # the flags that need a runtime library; tests/c/Makefile adds the rest
    "asan": ["-fsanitize=address,undefined"],
    "tsan": ["-fsanitize=thread"],
}


def _cannot_link(flags):
    cc = c_compiler()
    if not shutil.which(cc[0]):
        return True, f"no compiler {cc[0]!r}"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text("int main(void) { return 0; }\n")
        p = subprocess.run([*cc, *flags, "-pthread", "-o", str(Path(tmp) / "probe"), str(src)],
                           capture_output=True, text=True, timeout=60)
    if p.returncode:
        return True, f"{' '.join(cc + flags)} cannot link: {p.stderr.strip()[-300:]}"
    return False, f"{' '.join(cc + flags)} links"


@fact("no-asan-runtime", "the C compiler cannot link AddressSanitizer + UBSan programs "
      "(libasan, libubsan missing)")
def NO_ASAN_RUNTIME():
    return _cannot_link(SANITIZER_FLAGS["asan"])


@fact("no-tsan-runtime", "the C compiler cannot link ThreadSanitizer programs (libtsan missing)")
def NO_TSAN_RUNTIME():
    return _cannot_link(SANITIZER_FLAGS["tsan"])


# The fuzz targets' compiler (tests/fuzz/Makefile's CLANG): libFuzzer is clang's.
FUZZ_CLANG = os.environ.get("CLANG", "clang-14")


@fact("no-libfuzzer", f"{FUZZ_CLANG} cannot link libFuzzer targets with ASan+UBSan "
      "(clang-14 and libclang-rt-14-dev missing)")
def NO_LIBFUZZER():
    if not shutil.which(FUZZ_CLANG):
        return True, f"{FUZZ_CLANG} is not on PATH"
    flags = ["-fsanitize=fuzzer,address,undefined"]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text("#include <stddef.h>\n#include <stdint.h>\n"
                       "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) "
                       "{ return 0; }\n")
        p = subprocess.run([FUZZ_CLANG, *flags, "-o", str(Path(tmp) / "probe"), str(src)],
                           capture_output=True, text=True, timeout=60)
    if p.returncode:
        return True, f"{FUZZ_CLANG} {flags[0]} cannot link: {p.stderr.strip()[-300:]}"
    return False, f"{FUZZ_CLANG} {flags[0]} links"


# ---- which facts can stop a run ----

HUGETLB_FACTS = {
    "anonymous_hugetlb": NO_HUGEPAGES_2M,
    "shared_hugetlb": NO_HUGEPAGES_2M,
    "anonymous_hugetlb_1gb": NO_HUGEPAGES_1G,
}
_NOT_GIVEN = object()


def facts_for_run(**fields):
    """The facts that can make a run of this config raise HostUnsupportedError."""
    facts = [NO_KVM]
    mode = fields.get("uffd_mode", _NOT_GIVEN)
    backing = fields.get("backing", "anonymous")
    if mode is not None:
        facts.append(NO_USERFAULTFD)
    if backing in HUGETLB_FACTS:
        facts.append(HUGETLB_FACTS[backing])
    if backing == "anonymous_thp":
        facts.append(NO_THP)
    if backing == "guest_memfd":
        facts.append(NO_GUEST_MEMFD)
        if mode is not None:
            facts += [NO_GUEST_MEMFD_UFFD, GUEST_MEMFD_BYPASSES_UFFD]
    if mode == "minor":
        facts.append(NO_UFFD_MINOR_HUGETLBFS if backing == "shared_hugetlb"
                     else NO_UFFD_MINOR_SHMEM)
    if fields.get("resolve") == "move" and mode in ("missing", _NOT_GIVEN):
        facts.append(NO_UFFD_MOVE)
    if str(fields.get("guest_page_size", "")).upper() in ("1G", str(1 << 30)):
        facts.append(NO_1G_GUEST_PAGES)
    if fields.get("wait") == "io_uring" and mode is not None:
        facts += [BUILT_WITHOUT_LIBURING, NO_IO_URING_UFFD]
    if fields.get("wp_async") or fields.get("dirty_tracking") == "wp_async":
        facts.append(NO_UFFD_WP_ASYNC)
    if fields.get("dirty_tracking") == "bitmap_manual":
        facts.append(NO_MANUAL_DIRTY_LOG)
    if fields.get("dirty_tracking") == "ring":
        facts.append(NO_DIRTY_RING)
    if fields.get("source_cache") == "cold":
        facts.append(TMPDIR_ON_TMPFS)
    return tuple(facts)
