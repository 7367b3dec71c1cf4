"""Boot a Kernel under QEMU and run a job in it.

The host's / is shared read-only over 9p (the guest runs the host's Python,
packages and files as they are); the job's directory is shared writable and
appears in the guest at its own host path; a sparse ext4 disk is the
guest's TMPDIR. QEMU uses KVM where the host's KVM can run a guest that runs
KVM itself (kvm_intel or kvm_amd with nested on): the guest's KVM is then
nested on hardware. Elsewhere it emulates with TCG: `-cpu max` is an AMD CPU
with SVM and nested paging, so the guest's kvm_amd loads and its KVM is
stock x86 KVM, 5 to 50 times slower than hardware, so that only ratios
between runs mean anything there.
"""
from __future__ import annotations

import atexit
import dataclasses
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time

from ..errors import ConfigError, HostUnsupportedError
from ..host.facts import _kvm_params
from . import _initramfs
from ._kernel import Kernel, KernelUnavailableError

QEMU = "qemu-system-x86_64"
# Without AVX2: QEMU 7.2's TCG (Debian 12's) faults on a vector load that
# ends at the last mapped byte before an unmapped page, which real CPUs do
# not: numpy's AVX2 sort of a float64 array placed there died of SIGSEGV in
# the guest (the kernel matrix found it), never on the host.
TCG_CPU = os.environ.get("UFFDKVM_QEMU_CPU", "max,-avx2")
ACCELS = ("auto", "kvm", "tcg")
TMPDIR_DISK_GIB = 8

# Every QEMU still running, for kill_all(): a worker thread's own handler
# never sees the main thread's KeyboardInterrupt or SIGTERM.
RUNNING: set[subprocess.Popen[bytes]] = set()
_RUNNING_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Accel:
    """How QEMU runs the guest: "kvm" (the guest's KVM nested on the host's)
    or "tcg" (emulated), and why that one."""
    name: str
    why: str

    @property
    def emulated(self) -> bool:
        return self.name == "tcg"

    def __str__(self) -> str:
        return f"QEMU {self.name.upper()} ({self.why})"


def _nested_kvm() -> tuple[str | None, str]:
    """The host's KVM module where QEMU can run a guest that runs KVM on it
    (None, and why not, elsewhere)."""
    vendor, params = _kvm_params()
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return None, "no /dev/kvm to open"
    if vendor not in ("kvm_intel", "kvm_amd"):
        return None, (f"this host's KVM is {vendor or 'unknown'}, which cannot run a guest "
                      f"that runs KVM itself")
    nested = params.get(f"{vendor}.nested", "")
    if nested not in ("Y", "1"):
        return None, (f"{vendor}'s nested virtualization is off "
                      f"(/sys/module/{vendor}/parameters/nested is {nested or 'missing'})")
    return vendor, f"{vendor} with nested={nested}"


def choose_accel(accel: str = "auto") -> Accel:
    """The accelerator for ``accel`` ("auto": KVM where it can nest, else TCG)."""
    if accel not in ACCELS:
        raise ConfigError(f"accel: expected one of {', '.join(ACCELS)}, not {accel!r}",
                          field="accel")
    if accel == "tcg":
        return Accel("tcg", "asked for")
    vendor, why = _nested_kvm()
    if vendor is not None:
        return Accel("kvm", why)
    if accel == "kvm":
        raise HostUnsupportedError(f"accel='kvm': {why}; use accel='tcg' (emulated)")
    return Accel("tcg", why)


def guest_kvm_module(accel: Accel) -> str:
    """The KVM module the guest loads: TCG's CPU is AMD's; KVM's is the host's."""
    if accel.emulated:
        return "kvm_amd"
    vendor, _ = _nested_kvm()
    return vendor or "kvm_amd"


def check_tools() -> None:
    """KernelUnavailableError naming what is missing to boot a kernel here."""
    # zstd: the modules of Debian's 6.18 and 7.2 are zstd-compressed.
    missing = [pkg for tool, pkg in ((QEMU, "qemu-system-x86"), ("cpio", "cpio"),
                                     ("modprobe", "kmod"), ("mkfs.ext4", "e2fsprogs"),
                                     ("zstd", "zstd"))
               if shutil.which(tool) is None and
               not os.path.exists(f"/sbin/{tool}") and not os.path.exists(f"/usr/sbin/{tool}")]
    if missing:
        raise KernelUnavailableError(f"booting a kernel needs {', '.join(missing)}: "
                                     f"apt-get install {' '.join(missing)}")
    _initramfs.static_busybox()


def _mkfs() -> str:
    for d in ("", "/sbin/", "/usr/sbin/"):
        if (found := shutil.which(f"{d}mkfs.ext4" if d else "mkfs.ext4")):
            return found
    return "/sbin/mkfs.ext4"


def _option_value(path: os.PathLike[str] | str) -> str:
    """A path as a value in QEMU's comma-separated options (a comma doubled)."""
    return os.fspath(path).replace(",", ",,")


def argv(kernel: Kernel, accel: Accel, initrd: pathlib.Path, out: pathlib.Path,
         disk: pathlib.Path | None, memory_mib: int, cpus: int,
         gigantic_pages: int) -> list[str]:
    append = "console=ttyS0 panic=-1 quiet loglevel=4"
    if gigantic_pages:
        # At boot, before memory fragments: a 1 GiB page rarely frees later.
        append += f" hugepagesz=1G hugepages={gigantic_pages}"
    cpu = ["-accel", "kvm", "-cpu", "host"] if not accel.emulated else \
        ["-accel", "tcg,thread=single", "-cpu", TCG_CPU]
    args = [QEMU, *cpu, "-smp", str(cpus), "-m", str(memory_mib),
            "-kernel", _option_value(kernel.image), "-initrd", _option_value(initrd),
            "-append", append,
            "-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio",
            # security_model=none: files the guest makes are this user's (the
            # job's output), so that QEMU need not run as root.
            "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,"
                       "readonly=on,multidevs=remap",
            "-virtfs", f"local,path={_option_value(out)},mount_tag=out,security_model=none,"
                       "multidevs=remap"]
    if disk is not None:
        args += ["-drive", f"file={_option_value(disk)},if=virtio,format=raw,cache=unsafe"]
    return args


def job_script(commands: list[list[str]], cwd: os.PathLike[str] | str) -> str:
    """job.sh for the guest's init: this process's environment as far as it
    carries over (PATH, the venv, UFFDKVM_* settings, PYTHONPATH), HOME and
    TMPDIR where the guest can write, then ``commands`` from ``cwd``."""
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "HOME": "/run/home", "TMPDIR": "/run/tmp", "PYTHONDONTWRITEBYTECODE": "1",
           "LANG": "C.UTF-8"}
    for name, value in os.environ.items():
        if (name.startswith("UFFDKVM_") and re.fullmatch(r"\w+", name, re.ASCII)) or \
                name in ("VIRTUAL_ENV", "PYTHONPATH"):
            env[name] = value
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines += [f"cd {shlex.quote(str(cwd))}",
              'echo "uffdkvm-job: $(uname -r), $(grep -c ^processor /proc/cpuinfo) CPUs"']
    lines += [shlex.join(c) for c in commands]
    return "\n".join(lines) + "\n"


def _dying_with_this_thread(argv: list[str]) -> list[str]:
    """argv run so that it gets SIGKILL when the thread that started it ends
    (PR_SET_PDEATHSIG, kept across exec): util-linux's setpriv sets it, as
    no Python code may safely run between fork and exec in a process with
    threads."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv else argv


def kill_all() -> None:
    """Kills every QEMU this process started that is still running."""
    with _RUNNING_LOCK:
        for proc in list(RUNNING):
            proc.kill()


# A Guest never closed, or an interpreter that exits with one running,
# leaves no QEMU behind.
atexit.register(kill_all)


def disk_dir() -> pathlib.Path:
    """Where guests' TMPDIR disks are: beside the kernel cache."""
    from ._debian import cache_dir
    return cache_dir().parent / "disks"


def _disk_file() -> pathlib.Path:
    """A new file for the guest's TMPDIR disk, beside the kernel cache (a
    disk, where /tmp may be tmpfs and the guest's writes would take this
    host's memory), named by this process's pid; the disks of processes
    that died without removing theirs (killed outright) go first."""
    where = disk_dir()
    where.mkdir(parents=True, exist_ok=True)
    for old in where.glob("tmpdir-*-*.img"):
        if not _alive(old.name.split("-")[1]):
            old.unlink(missing_ok=True)
    fd, name = tempfile.mkstemp(prefix=f"tmpdir-{os.getpid()}-", suffix=".img", dir=where)
    os.close(fd)
    return pathlib.Path(name)


def _alive(pid: str) -> bool:
    """Whether a process of that pid exists (one that is not ours counts)."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


class Machine:
    """One QEMU guest running ``job`` (a shell script, run in a chroot of the
    host's / with ``out`` as its directory). Start it, then wait() for it or
    stop() it; the console is out/console.log."""

    def __init__(self, kernel: Kernel, job: str, out: pathlib.Path, *, accel: Accel,
                 memory_mib: int = 6144, cpus: int = 2, gigantic_pages: int = 0):
        check_tools()
        self.kernel, self.accel, self.out = kernel, accel, out
        self.memory_mib, self.cpus = memory_mib, cpus
        out.mkdir(parents=True, exist_ok=True)
        for stale in ("job.exit", "job.log"):
            (out / stale).unlink(missing_ok=True)
        (out / "job.sh").write_text(job)
        initrd = _initramfs.build(kernel, guest_kvm_module(accel), str(out), out / "initrd.gz")
        self._console = open(out / "console.log", "w")
        self.disk: pathlib.Path | None = None
        try:
            self.disk = _disk_file()
            with open(self.disk, "wb") as f:
                f.truncate(TMPDIR_DISK_GIB << 30)
            mkfs = subprocess.run([_mkfs(), "-q", "-F", "-E", "nodiscard", str(self.disk)],
                                  capture_output=True, text=True, timeout=120)
            if mkfs.returncode:  # the guest's TMPDIR is then its tmpfs, and init says so
                self.disk.unlink()
                self.disk = None
            self.argv = argv(kernel, accel, initrd, out, self.disk, memory_mib, cpus,
                             gigantic_pages)
            self.start = time.monotonic()
            # A session of its own: a Ctrl-C at the terminal (or a Jupyter
            # interrupt, sent to the kernel's group) reaches Python, which
            # powers the guest off, and never kills a guest the user keeps.
            # Nothing outlives this process: kill_all at exit, and from the
            # main thread (which lives as long as the process) PDEATHSIG.
            main = threading.current_thread() is threading.main_thread()
            with _RUNNING_LOCK:
                self.proc = subprocess.Popen(
                    _dying_with_this_thread(self.argv) if main else self.argv,
                    stdin=subprocess.DEVNULL, stdout=self._console,
                    stderr=subprocess.STDOUT, start_new_session=True)
                RUNNING.add(self.proc)
        except BaseException:
            self._console.close()
            if self.disk is not None:
                self.disk.unlink(missing_ok=True)
            raise

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout_s: float) -> bool:
        """Waits up to timeout_s for the guest to power off; True if it did."""
        try:
            self.proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop(self) -> None:
        """Ends QEMU (SIGTERM, then SIGKILL) and frees what the boot made,
        even when interrupted on the way."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                if not self.wait(10):
                    self.proc.kill()
                    self.proc.wait()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            with _RUNNING_LOCK:
                RUNNING.discard(self.proc)
            self._console.close()
            if self.disk is not None:
                self.disk.unlink(missing_ok=True)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.start

    def exit_status(self) -> int | None:
        """The job's exit status, or None where it never finished."""
        status = self.out / "job.exit"
        try:
            return int(status.read_text())
        except (OSError, ValueError):
            return None

    def console(self) -> str:
        try:
            return (self.out / "console.log").read_text(errors="replace")
        except OSError as e:
            return f"(no console: {e})"

    def console_tail(self, lines: int = 15) -> str:
        return "\n".join(self.console().splitlines()[-lines:])


@dataclasses.dataclass(frozen=True)
class Boot:
    exit_status: int | None   # the job's, or None where it never finished
    seconds: float            # from QEMU's start to its end
    console: str              # what the guest kernel and init printed
    accel: Accel


def run_job(kernel: Kernel, job: str, out: pathlib.Path, timeout_s: float, *,
            accel: Accel, memory_mib: int = 6144, cpus: int = 2,
            gigantic_pages: int = 0) -> Boot:
    """Boots ``kernel``, runs the shell script ``job`` there with ``out`` as
    its directory and waits for the guest to power off; gives up (ending
    QEMU) after timeout_s."""
    m = Machine(kernel, job, out, accel=accel, memory_mib=memory_mib, cpus=cpus,
                gigantic_pages=gigantic_pages)
    try:
        m.wait(timeout_s)
    finally:
        m.stop()
    return Boot(m.exit_status(), m.seconds, m.console(), accel)
