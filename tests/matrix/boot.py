"""Boot one matrix kernel under QEMU and run a job in it.

TCG with `-cpu max` emulates an AMD CPU with SVM and nested paging, so the
guest's kvm_amd loads and its KVM is stock x86 KVM (AVX2 is taken out: CPU
below). thread=single: with
multi-threaded TCG and two vCPUs the 6.12 guest panicked on a stale int3 in
__schedule, twice in two boots. The host's / is shared read-only over 9p
(the guest runs the host's Python, packages and checkout as they are); the
output directory is shared writable and appears in the guest at its own
host path.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import signal
import subprocess
import time

import initramfs
from kernels import Kernel

QEMU = "qemu-system-x86_64"
# Without AVX2: QEMU 7.2's TCG (Debian 12's) faults on a vector load that
# ends at the last mapped byte before an unmapped page, which real CPUs do
# not: numpy's AVX2 sort of a float64 array placed there dies of SIGSEGV in
# the guest (tests/matrix found it: pandas, inside cli_sweep, in both guests
# at the same test), and runs on the host. numpy then takes its X86_V2 code.
CPU = os.environ.get("UFFDKVM_MATRIX_CPU", "max,-avx2")


# Every QEMU still running, for kill_all(): a worker thread's own handler
# never sees the main thread's KeyboardInterrupt or SIGTERM.
RUNNING: set[subprocess.Popen[bytes]] = set()


def kill_all() -> None:
    """Kills every QEMU this process started that is still running."""
    for proc in list(RUNNING):
        proc.kill()


@dataclasses.dataclass(frozen=True)
class Boot:
    exit_status: int | None   # the job's, or None where it never finished
    seconds: float            # from QEMU's start to its end
    console: str              # what the guest kernel and init printed


def qemu_argv(kernel: Kernel, initrd: pathlib.Path, out: pathlib.Path,
              memory_mib: int, cpus: int) -> list[str]:
    return [QEMU, "-accel", "tcg,thread=single", "-cpu", CPU, "-smp", str(cpus),
            "-m", str(memory_mib), "-kernel", str(kernel.vmlinuz), "-initrd", str(initrd),
            "-append", "console=ttyS0 panic=-1 quiet loglevel=4",
            "-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio",
            "-virtfs", "local,path=/,mount_tag=hostroot,security_model=passthrough,"
                       "readonly=on,multidevs=remap",
            "-virtfs", f"local,path={out},mount_tag=out,security_model=passthrough,"
                       "multidevs=remap"]


def run(kernel: Kernel, job: str, out: pathlib.Path, timeout_s: float,
        memory_mib: int = 6144, cpus: int = 2) -> Boot:
    """Runs the shell script `job` in `kernel`'s guest with `out` as its output
    directory; gives up (killing QEMU) after timeout_s."""
    if shutil.which(QEMU) is None:
        raise RuntimeError(f"the matrix needs {QEMU}: apt-get install qemu-system-x86")
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("job.exit", "job.log"):
        (out / stale).unlink(missing_ok=True)
    (out / "job.sh").write_text(job)
    initrd = initramfs.build(kernel, str(out), out / "initrd.gz")
    start = time.monotonic()
    with open(out / "console.log", "w") as console:
        proc = subprocess.Popen(qemu_argv(kernel, initrd, out, memory_mib, cpus),
                                stdin=subprocess.DEVNULL, stdout=console,
                                stderr=subprocess.STDOUT, start_new_session=True)
        RUNNING.add(proc)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            RUNNING.discard(proc)
    seconds = time.monotonic() - start
    status_file = out / "job.exit"
    status = int(status_file.read_text()) if status_file.exists() else None
    return Boot(status, seconds, (out / "console.log").read_text(errors="replace"))
