"""wait="io_uring": each reader keeps a read of the uffd in flight in an
io_uring of its own and sleeps in the ring.

Checked against the kernel's own count of the process's read(2) calls
(/proc/self/io syscr, which counts read(2) and its kin but not io_uring's
reads): an io_uring run makes none for its faults where an epoll one makes
one a read. Refusals are real: a seccomp filter makes the kernel refuse
io_uring_setup to a child process, RWF_NOWAIT on the check's read makes the
kernel complete it at once with EAGAIN (as an io_uring that does not retry
O_NONBLOCK files, before Linux 5.15, completes every such read), and a build
made with UFFDKVM_NO_LIBURING=1 has no io_uring at all. Support is what the
kernel answers, whatever its release says.
"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import uffdkvm
import uffdkvm.host.facts
from helpers.children import PACKAGE_ROOT, python
from helpers.hostfacts import NO_CC, NO_IO_URING_UFFD, host_skip
from helpers.resources import assert_released
from helpers.runs import run_with_fault, small
from helpers.skips import needs_io_uring

ROOT = Path(__file__).resolve().parents[2]

# Each reads the uffd through the ring; 1024 to 2048 faults each.
CONFIGS = {
    "missing-uffd-per-vcpu": dict(vcpus=2, mem_per_vcpu="4M", readers=2),
    "missing-single-uffd": dict(vcpus=2, mem_per_vcpu="4M", single_uffd=True, readers=3),
    "minor-shmem": dict(vcpus=2, mem_per_vcpu="4M", backing="shmem", uffd_mode="minor",
                        single_uffd=True, readers=2),
    # four vCPUs queue faults for one reader: reads of several messages
    "batches": dict(vcpus=4, mem_per_vcpu="2M", single_uffd=True, readers=1, read_batch=8),
}


def read_syscalls():
    """read(2)-family calls this process has made, its exited threads' included."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("syscr:"):
                return int(line.split()[1])
    raise AssertionError("no syscr in /proc/self/io")


def counted_run(**fields):
    before = read_syscalls()
    r = small(**fields)
    return r, read_syscalls() - before


@pytest.fixture
def io_uring(kvm):
    needs_io_uring()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_read_is_a_completion_of_the_readers_ring(io_uring, name):
    fields = CONFIGS[name]
    epoll, epoll_syscalls = counted_run(**fields, wait="epoll_exclusive")
    ring, ring_syscalls = counted_run(**fields, wait="io_uring")
    assert ring.faults == epoll.faults == ring.config.region_bytes // ring.page_size
    for x in ring.readers:
        # Every read through the ring; a full batch is followed by another
        # ring read, never by an empty read(2).
        assert x.ring_completions == x.reads, x
        assert x.read_sizes[0] == 0
        assert x.wakeups == x.reads + x.spurious_wakeups
    assert sum(x.ring_completions for x in ring.readers) >= ring.faults / ring.config.read_batch
    assert all(x.ring_completions == 0 for x in epoll.readers)
    # The other threads' read(2)s (KVM's statistics, /proc) are the same in
    # both runs; beyond them the epoll run read once a read, the ring run not.
    others = epoll_syscalls - sum(x.reads for x in epoll.readers)
    assert ring_syscalls - others < ring.faults / 20, (ring_syscalls, epoll_syscalls)
    if name == "batches":
        assert max(n for n, c in enumerate(ring.readers[0].read_sizes) if c) > 1


def test_ring_completions_reach_json_and_frames_and_read_as_0_from_older_json(io_uring):
    pytest.importorskip("pandas")
    r = small(vcpus=1, mem_per_vcpu="1M", wait="io_uring")
    (x,) = r.readers
    assert x.ring_completions == x.reads == 256
    assert uffdkvm.Result.from_json(r.to_json()).readers[0].ring_completions == 256
    assert list(uffdkvm.io.frames.readers_frame(r)["ring_completions"]) == [256]
    data = json.loads(r.to_json())
    del data["readers"][0]["ring_completions"]  # as uffdkvm wrote it before the field
    assert uffdkvm.Result.from_json(json.dumps(data)).readers[0].ring_completions == 0


def test_a_cancelled_run_ends_promptly_and_gives_back_every_thread_and_fd(io_uring, released):
    """Readers asleep in their rings (one vCPU, four readers on its uffd,
    each fault held 2 ms: 4 s in all) leave when the run is cancelled."""
    calls = []

    def stop(progress):
        calls.append(time.monotonic())
        raise KeyboardInterrupt  # as Ctrl-C would, from the progress callback

    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        uffdkvm.run(vcpus=1, mem_per_vcpu="8M", readers=4, delay_us=2000, wait="io_uring",
                    progress=stop)
    assert calls, "the progress callback was never called"
    assert time.monotonic() - calls[0] < 1.0
    assert time.monotonic() - start < 3.0
    assert_released(released)
    r = small(vcpus=1, mem_per_vcpu="1M", readers=2, wait="io_uring")
    assert r.faults == 256


def test_host_info_says_whether_a_ring_can_wait_for_a_uffd():
    # The fact's own probe sets up a ring by hand and reads an empty uffd
    # through it; where it found no usable userfaultfd, HostInfo asks the
    # ring alone.
    no_uffd = NO_IO_URING_UFFD.evidence.startswith(("no userfaultfd", "UFFDIO_API"))
    refused = NO_IO_URING_UFFD.holds and not no_uffd
    h = uffdkvm.HostInfo.current()
    assert (h.io_uring == "allowed") is not refused, (h.io_uring, NO_IO_URING_UFFD.evidence)


RWF_NOWAIT = 0x8
# What the kernel says to the read with RWF_NOWAIT: what an io_uring that
# does not retry O_NONBLOCK files says to every read of the non-blocking uffd.
NO_RETRY = ("IORING_OP_READ of an empty non-blocking uffd completed at once: Resource "
            "temporarily unavailable (EAGAIN). This kernel's io_uring does not wait for a "
            "non-blocking file to become readable: it completes the read with EAGAIN instead "
            "of polling (io_uring retries O_NONBLOCK files from Linux 5.15)")
# Where the uffd is not FMODE_NOWAIT (6.1), the kernel refuses RWF_NOWAIT on
# it outright: the stand-in then fails the read another way, refused alike.
NOWAIT_REFUSED = ("IORING_OP_READ of an empty non-blocking uffd completed at once: "
                  "Operation not supported (EOPNOTSUPP). A ring cannot wait for this uffd")
STAND_INS = (NO_RETRY, NOWAIT_REFUSED)


def test_a_ring_that_does_not_wait_for_the_uffd_is_refused_saying_so(io_uring, monkeypatch):
    monkeypatch.setattr(uffdkvm.host.facts, "_RING_READ_RW_FLAGS", RWF_NOWAIT)
    said = uffdkvm.HostInfo.current().io_uring
    assert said in STAND_INS
    with pytest.raises(uffdkvm.HostUnsupportedError) as info:
        run_with_fault(vcpus=1, mem_per_vcpu="64K", wait="io_uring", fault="ring_nowait")
    assert str(info.value) == f"wait io_uring: {said}; use another wait mode"
    # the same hook leaves the other wait modes alone
    r = run_with_fault(vcpus=1, mem_per_vcpu="64K", wait="epoll", fault="ring_nowait")
    assert r.verified and r.faults == 16


def fake_release(monkeypatch, release):
    real = os.uname()
    fake = os.uname_result((real.sysname, real.nodename, release, real.version, real.machine))
    monkeypatch.setattr(os, "uname", lambda: fake)


def test_io_uring_support_is_the_kernels_answer_not_its_release(io_uring, monkeypatch):
    """Issue 17: readers verify on 6.1.192, where the docs said 6.10+. No
    release is consulted: an old one whose ring waits is allowed, a new one
    whose ring does not wait (RWF_NOWAIT) is refused."""
    fake_release(monkeypatch, "6.1.0")
    h = uffdkvm.HostInfo.current()
    assert (h.kernel_release, h.io_uring) == ("6.1.0", "allowed")
    uffdkvm.probe(vcpus=1, mem_per_vcpu="64K", wait="io_uring")
    assert small(vcpus=1, mem_per_vcpu="1M", wait="io_uring").readers[0].ring_completions == 256
    fake_release(monkeypatch, "6.18.0")
    monkeypatch.setattr(uffdkvm.host.facts, "_RING_READ_RW_FLAGS", RWF_NOWAIT)
    h = uffdkvm.HostInfo.current()
    assert h.kernel_release == "6.18.0" and h.io_uring in STAND_INS


# A child whose threads the kernel refuses io_uring_setup (seccomp, EPERM).
SECCOMP_CHILD = r"""
import ctypes, json, struct, uffdkvm
libc = ctypes.CDLL(None, use_errno=True)
# BPF: load the syscall number; io_uring_setup (425) -> ERRNO(EPERM); else allow.
code = [(0x20, 0, 0, 0), (0x15, 0, 1, 425), (0x06, 0, 0, 0x00050000 | 1),
        (0x06, 0, 0, 0x7FFF0000)]
filt = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *c) for c in code))
prog = struct.pack("HxxxxxxQ", len(code), ctypes.addressof(filt))
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.c_char_p(prog), 0, 0) == 0  # PR_SET_SECCOMP, FILTER
out = {"host": uffdkvm.HostInfo.current().io_uring}
for name, call in (("probe", uffdkvm.probe), ("run", uffdkvm.run)):
    try:
        call(vcpus=1, mem_per_vcpu="64K", wait="io_uring")
        out[name] = "ran"
    except uffdkvm.HostUnsupportedError as e:
        out[name] = str(e)
out["epoll"] = uffdkvm.run(vcpus=1, mem_per_vcpu="64K", wait="epoll").faults
print(json.dumps(out))
"""


def test_a_kernel_that_refuses_io_uring_is_host_unsupported_in_probe_and_run(io_uring):
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT}
    p = subprocess.run(python(code=SECCOMP_CHILD), capture_output=True, text=True,
                       timeout=120, cwd="/", env=env)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    sysctl = Path("/proc/sys/kernel/io_uring_disabled")
    disabled = sysctl.read_text().strip() if sysctl.exists() else "unreadable"
    refused = ("io_uring_setup: Operation not permitted (EPERM). The kernel refuses io_uring "
               f"to this process (/proc/sys/kernel/io_uring_disabled is {disabled}: 0 allows "
               "it to all, "
               "1 only to CAP_SYS_ADMIN or the group in io_uring_group, 2 to none; or a "
               "seccomp filter forbids it)")
    assert out["host"] == refused
    for call in ("probe", "run"):
        assert out[call] == f"wait io_uring: {refused}; use another wait mode", out[call]
    assert out["epoll"] == 16


# A child with the package built without liburing first on its path.
NO_LIBURING_CHILD = r"""
import json, uffdkvm
from uffdkvm import _core
out = {"core": _core.__file__, "have": _core.HAVE_IO_URING,
       "config": uffdkvm.Config(wait="io_uring").wait}
for name, call in (("probe", uffdkvm.probe), ("run", uffdkvm.run)):
    try:
        call(vcpus=1, mem_per_vcpu="64K", wait="io_uring")
        out[name] = "ran"
    except uffdkvm.HostUnsupportedError as e:
        out[name] = str(e)
r = uffdkvm.run(vcpus=1, mem_per_vcpu="64K", wait="epoll")
out["epoll"] = [r.verified, r.faults]
print(json.dumps(out))
"""


def test_a_build_without_liburing_refuses_io_uring_saying_how_and_runs_epoll(kvm, tmp_path):
    """Built from this tree with UFFDKVM_NO_LIBURING=1 (as a host without
    liburing-dev would build it), into tmp_path."""
    if NO_CC.holds:
        host_skip(NO_CC, "compiles the extension")
    env = {k: v for k, v in os.environ.items() if k != "UFFDKVM_TEST_HOOKS"}
    build = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--parallel", "2",
         "--build-temp", str(tmp_path / "temp"), "--build-lib", str(tmp_path / "lib")],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**env, "UFFDKVM_NO_LIBURING": "1"})
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    package = tmp_path / "pkg" / "uffdkvm"
    shutil.copytree(ROOT / "uffdkvm", package,
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy(tmp_path / "lib" / "uffdkvm" / "_core.abi3.so", package)
    p = subprocess.run(python(code=NO_LIBURING_CHILD), capture_output=True,
                       text=True, timeout=120, cwd="/",
                       env={**env, "PYTHONPATH": str(package.parent)})
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["core"] == str(package / "_core.abi3.so")
    assert out["have"] is False and out["config"] == "io_uring"
    for call in ("probe", "run"):
        assert out[call] == (
            'wait: this uffdkvm was built without liburing, so wait "io_uring" is not '
            "available; install liburing's headers and static library (Debian, Ubuntu: "
            "apt-get install liburing-dev) and build uffdkvm again (without "
            "UFFDKVM_NO_LIBURING=1), or use another wait mode"), out[call]
    assert out["epoll"] == [True, 16]
