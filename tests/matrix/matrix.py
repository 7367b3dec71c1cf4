"""The kernel x KVM matrix: a part of the suite on Debian's kernels, nested.

    python3 tests/matrix/matrix.py                    # smoke part: host and Debian's kernels
    python3 tests/matrix/matrix.py --part full        # the whole suite on each
    python3 tests/matrix/matrix.py --target 6.18 --target 7.2 --part smoke
    python3 tests/matrix/matrix.py --kernel ~/linux/arch/x86/boot/bzImage:/tmp/mods
    python3 tests/matrix/matrix.py --target 6.12 --part full --record

Each kernel is booted under QEMU (uffdkvm.kernels: TCG here, with stock
kvm_amd in the guest; KVM where the host's KVM nests); "host" is this
machine as it is. The Debian targets are uffdkvm.kernels.DEBIAN_KERNELS,
fetched with apt's own configuration; --kernel adds a kernel you built,
named by its release. Every target runs guest.py, which probes what runs
there and runs the part's tests from the repository root. The results go to
OUT/<target>/ (result.json, pytest.log, junit.xml, console.log, a guest's
kernel.log) and
OUT/matrix.json; the table of passed, failed and skipped per target is
printed. --record keeps the targets' results in tests/matrix/recorded/ and
regenerates docs/where-it-runs.md from them (report.py).

Exit status: 0 when every target passed its part with every skip explained
(the suite itself fails on an unexplained one), 1 otherwise, 2 when a
target could not be had, booted or run at all (a Debian kernel the archive
no longer carries is reported unavailable, with the reason, never passed).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import pathlib
import signal
import subprocess
import sys
import threading
import time

import guest
import parts
import report

from uffdkvm import kernels
from uffdkvm.kernels import _qemu

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TARGETS = ["host", *kernels.DEBIAN_KERNELS]
# Each guest's memory: the part's tests and the 1 GiB page it reserves.
MEMORY_MIB = 6144


def _exists(node: str) -> bool:
    """Whether the test a node id names is in the tree now: its file, and a
    function of its name (parameters aside)."""
    path, _, name = node.partition("::")
    source = ROOT / path
    return source.is_file() and f"def {name.partition('[')[0]}(" in source.read_text()


def run_target(target: str | kernels.Kernel, part: str, out: pathlib.Path, hugepages: int,
               timeout_s: float, memory_mib: int, accel: str,
               rerun: list[str] | None = None, left_out: dict[str, str] | None = None) -> dict:
    """Runs guest.py for target ("host", a Debian name, or a Kernel brought
    with --kernel) on the host or booted; its result.json, or, with rerun
    (junit names), the earlier result with those tests run again and the
    ones in left_out (deselected since) taken out of its failures."""
    name = target.name if isinstance(target, kernels.Kernel) else target
    if rerun == []:     # nothing failed, or only tests deselected since: no boot
        result = report.with_rerun(name, {"passed": 0, "failed": 0, "errors": 0,
                                          "skipped": 0, "skips": [], "failures": [],
                                          "exit_status": 0}, left_out) \
            if left_out else report.recorded_of(name)
        return {**result, "wall_seconds": 0.0}
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").unlink(missing_ok=True)
    (out / "rerun.json").unlink(missing_ok=True)
    extra: list[str] = []
    if rerun is not None:
        (out / "rerun-tests.json").write_text(json.dumps(rerun))
        extra = ["--rerun", str(out / "rerun-tests.json")]
    job = [sys.executable, str(HERE / "guest.py"), "--target", name, "--part", part,
           "--out", str(out), "--hugepages", str(hugepages), "--timeout", str(timeout_s),
           *extra]
    start = time.monotonic()
    problem = None
    where: dict = {}
    if name == "host":
        p = subprocess.run(job, cwd=ROOT)
        if p.returncode not in (0, 1):
            problem = f"guest.py exited {p.returncode}"
    else:
        try:
            kernel = target if isinstance(target, kernels.Kernel) else kernels.fetch(name)
            mode = _qemu.choose_accel(accel)
            where = {"kernel_origin": kernel.origin, "accel": mode.name,
                     "accel_why": mode.why}
            b = _qemu.run_job(kernel, _qemu.job_script([job], ROOT), out, timeout_s + 600,
                              accel=mode, memory_mib=memory_mib, gigantic_pages=1)
        except kernels.KernelUnavailableError as e:
            return {"target": name, "part": part, "unavailable": str(e),
                    "problem": f"unavailable: {e}", "wall_seconds": time.monotonic() - start}
        if b.exit_status not in (0, 1):
            tail = "\n".join(b.console.splitlines()[-15:])
            problem = (f"the {kernel} guest's job did not finish "
                       f"(status {b.exit_status}, {b.seconds:.0f} s); its console ended:\n{tail}")
    try:
        if rerun is not None:
            again = json.loads((out / "rerun.json").read_text())
            if again["exit_status"] not in (0, 1):  # pytest ran none of them
                problem = problem or (f"the rerun ran nothing: pytest exited "
                                      f"{again['exit_status']} (see {out / 'pytest.log'})")
                result = report.recorded_of(name)
            else:
                result = report.with_rerun(name, again, left_out)
        else:
            result = json.loads((out / "result.json").read_text())
    except (OSError, ValueError) as e:
        result = {"target": name, "part": part, "problem": problem or f"no result: {e}"}
    result.update(where)
    result["wall_seconds"] = time.monotonic() - start
    if problem:
        result["problem"] = problem
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", action="append", choices=TARGETS,
                    help="host, or a Debian kernel: " + ", ".join(
                        f"{n} ({t})" for n, t in kernels.DEBIAN_KERNELS.items()) +
                    " (repeatable; default: host, " + ", ".join(parts.KERNELS) +
                    ", unless --kernel is given)")
    ap.add_argument("--kernel", action="append", default=[], metavar="IMAGE[:MODULES]",
                    help="a kernel you built: its bzImage, and after a colon its module "
                         "tree (the INSTALL_MOD_PATH of `make modules_install`) unless "
                         "KVM, virtio-pci, 9p, virtio-blk and ext4 are built in; a target "
                         "named by its release (repeatable)")
    ap.add_argument("--part", choices=sorted(parts.PARTS), default="smoke")
    ap.add_argument("--out", type=pathlib.Path,
                    default=pathlib.Path.home() / ".cache" / "uffdkvm" / "matrix",
                    help="where each target's results go (default: %(default)s)")
    ap.add_argument("--hugepages", type=int, default=16,
                    help="2 MiB huge pages each target reserves while it runs (default 16); "
                         "a booted kernel also reserves one 1 GiB page at boot")
    ap.add_argument("--timeout", type=float, default=3600,
                    help="seconds a target's tests may take (default 3600)")
    ap.add_argument("--memory", type=int, default=MEMORY_MIB,
                    help=f"guest MiB (default {MEMORY_MIB})")
    ap.add_argument("--accel", choices=_qemu.ACCELS, default="auto",
                    help="QEMU's accelerator: kvm (the guest's KVM nested on the host's), "
                         "tcg (emulated) or auto: kvm where the host's KVM nests "
                         "(default auto)")
    ap.add_argument("--record", action="store_true",
                    help="keep the results in tests/matrix/recorded/ and regenerate "
                         "docs/where-it-runs.md")
    ap.add_argument("--rerun-failed", action="store_true",
                    help="run again only the tests that failed in each target's recorded "
                         "result, and record the result with their new outcomes (kept "
                         "under 'reruns'); a failure the part deselects since is not run "
                         "again but leaves the failures, named")
    ap.add_argument("--jobs", type=int, default=1,
                    help="targets run at once (each guest's TCG takes one host CPU)")
    args = ap.parse_args(argv)
    try:
        brought = [kernels.resolve(spec) for spec in args.kernel]
    except (kernels.KernelUnavailableError, ValueError) as e:
        ap.error(f"--kernel: {e}")
    targets: list[str | kernels.Kernel] = list(args.target or [])
    if not targets and not brought:
        targets = ["host", *parts.KERNELS]
    targets += brought
    names = [t.name if isinstance(t, kernels.Kernel) else t for t in targets]
    if len(set(names)) != len(names):
        ap.error(f"two targets have one name: {names}")

    stopping = threading.Event()

    def one(target: str | kernels.Kernel) -> dict:
        name = target.name if isinstance(target, kernels.Kernel) else target
        if stopping.is_set():
            return {"target": name, "part": args.part, "problem": "not run: interrupted"}
        print(f"matrix: {name}: {args.part} part ...", flush=True)
        rerun = left_out = None
        if args.rerun_failed:
            failed = [f["test"] for f in report.recorded_of(name)["pytest"]["failures"]]
            # A failure the part deselects since (on an emulated kernel) is not
            # run again: it leaves the failures, saying so.
            left_out = {t: why for t in failed if name != "host" and
                        (why := parts.deselected_by(guest.node_id(t)))}
            # One renamed or removed since cannot be run again (pytest would
            # run none): it stays a failure, and the page says why.
            left_out |= {t: report.GONE for t in failed
                         if t not in left_out and not _exists(guest.node_id(t))}
            rerun = [t for t in failed if t not in left_out]
        r = run_target(target, args.part, args.out / name, args.hugepages,
                       args.timeout, args.memory, args.accel, rerun, left_out)
        print(report.line(r), flush=True)
        return r

    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, terminated)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs))
    futures = [pool.submit(one, t) for t in targets]
    try:
        results = [f.result() for f in futures]
    finally:
        signal.signal(signal.SIGTERM, before)   # main() may be called from a test
        # A Ctrl-C or SIGTERM leaves no guest running: no target starts after
        # it, and a guest that was booting as it came is ended as it starts.
        stopping.set()
        pool.shutdown(wait=False, cancel_futures=True)
        while concurrent.futures.wait(futures, timeout=0.5).not_done:
            _qemu.kill_all()
        _qemu.kill_all()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "matrix.json").write_text(json.dumps(results, indent=1))
    print()
    print(report.table(results))
    for r in results:
        for f in r.get("pytest", {}).get("failures", []):
            print(f"FAILED on {r['target']}: {f['test']}: {f['message'][:300]}")
        if r.get("problem"):
            print(f"PROBLEM on {r['target']}: {r['problem']}")
    if args.record:
        for r in results:
            # A rerun that ran nothing leaves the recording as it was.
            if not r.get("unavailable") and not (args.rerun_failed and r.get("problem")):
                report.record(r)
        report.write_docs()
    if any(r.get("problem") for r in results):
        return 2
    return 0 if all(r["pytest"]["exit_status"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
