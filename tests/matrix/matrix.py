"""The kernel x KVM matrix: a part of the suite on Debian's kernels, nested.

    python3 tests/matrix/matrix.py                    # smoke part: host, 6.1, 6.12
    python3 tests/matrix/matrix.py --part full        # the whole suite on each
    python3 tests/matrix/matrix.py --target 6.12 --part full --record

Each kernel is booted under QEMU TCG (boot.py) with stock kvm_amd; "host" is
this machine as it is. Every target runs guest.py, which probes what runs
there and runs the part's tests from the repository root. The results go to
OUT/<target>/ (result.json, pytest.log, junit.xml, console.log) and
OUT/matrix.json; the table of passed, failed and skipped per target is
printed. --record keeps the targets' results in tests/matrix/recorded/ and
regenerates docs/where-it-runs.md from them (report.py).

Exit status: 0 when every target passed its part with every skip explained
(the suite itself fails on an unexplained one), 1 otherwise, 2 when a
target could not be booted or run at all.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time

import boot
import kernels
import parts
import report

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TARGETS = ["host", *kernels.KERNELS]


def job_script(target: str, part: str, out: pathlib.Path, hugepages: int,
               timeout_s: float, extra: list[str]) -> str:
    """job.sh: what the guest's init runs in its chroot of the host's /."""
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "HOME": "/run/home", "TMPDIR": "/run/tmp", "PYTHONDONTWRITEBYTECODE": "1",
           "LANG": "C.UTF-8"}
    for name, value in os.environ.items():
        if name.startswith("UFFDKVM_") or name in ("VIRTUAL_ENV",):
            env[name] = value
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines += [f"cd {shlex.quote(str(ROOT))}",
              "echo \"matrix: $(uname -r), $(cat /proc/cpuinfo | grep -c ^processor) CPUs\"",
              shlex.join([sys.executable, str(HERE / "guest.py"), "--target", target,
                          "--part", part, "--out", str(out), "--hugepages", str(hugepages),
                          "--timeout", str(timeout_s), *extra])]
    return "\n".join(lines) + "\n"


def run_target(target: str, part: str, out: pathlib.Path, hugepages: int,
               timeout_s: float, memory_mib: int, rerun: list[str] | None = None) -> dict:
    """Runs guest.py for target (on the host, or booted); its result.json, or,
    with rerun (junit names), the earlier result with those tests run again."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").unlink(missing_ok=True)
    (out / "rerun.json").unlink(missing_ok=True)
    extra: list[str] = []
    if rerun is not None:
        (out / "rerun-tests.json").write_text(json.dumps(rerun))
        extra = ["--rerun", str(out / "rerun-tests.json")]
    start = time.monotonic()
    problem = None
    if target == "host":
        p = subprocess.run([sys.executable, str(HERE / "guest.py"), "--target", "host",
                            "--part", part, "--out", str(out), "--hugepages", str(hugepages),
                            "--timeout", str(timeout_s), *extra], cwd=ROOT)
        if p.returncode not in (0, 1):
            problem = f"guest.py exited {p.returncode}"
    else:
        kernel = kernels.fetch(target)
        b = boot.run(kernel, job_script(target, part, out, hugepages, timeout_s, extra), out,
                     timeout_s + 600, memory_mib=memory_mib)
        if b.exit_status not in (0, 1):
            tail = "\n".join(b.console.splitlines()[-15:])
            problem = (f"the {kernel.package} guest's job did not finish "
                       f"(status {b.exit_status}, {b.seconds:.0f} s); its console ended:\n{tail}")
    try:
        if rerun is not None:
            result = report.with_rerun(target, json.loads((out / "rerun.json").read_text()))
        else:
            result = json.loads((out / "result.json").read_text())
    except (OSError, ValueError) as e:
        result = {"target": target, "part": part, "problem": problem or f"no result: {e}"}
    result["wall_seconds"] = time.monotonic() - start
    if problem:
        result["problem"] = problem
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", action="append", choices=TARGETS,
                    help="host, 6.1 or 6.12 (repeatable; default: all)")
    ap.add_argument("--part", choices=sorted(parts.PARTS), default="smoke")
    ap.add_argument("--out", type=pathlib.Path,
                    default=kernels.cache_dir() / "out",
                    help="where each target's results go (default: %(default)s)")
    ap.add_argument("--hugepages", type=int, default=16,
                    help="2 MiB huge pages each target reserves while it runs (default 16)")
    ap.add_argument("--timeout", type=float, default=3600,
                    help="seconds a target's tests may take (default 3600)")
    ap.add_argument("--memory", type=int, default=6144, help="guest MiB (default 6144)")
    ap.add_argument("--record", action="store_true",
                    help="keep the results in tests/matrix/recorded/ and regenerate "
                         "docs/where-it-runs.md")
    ap.add_argument("--rerun-failed", action="store_true",
                    help="run again only the tests that failed in each target's recorded "
                         "result, and record the result with their new outcomes (kept "
                         "under 'rerun')")
    ap.add_argument("--jobs", type=int, default=1,
                    help="targets run at once (each guest's TCG takes one host CPU)")
    args = ap.parse_args(argv)
    targets = args.target or TARGETS

    def one(target: str) -> dict:
        print(f"matrix: {target}: {args.part} part ...", flush=True)
        rerun = None
        if args.rerun_failed:
            rerun = [f["test"] for f in report.recorded_of(target)["pytest"]["failures"]]
        r = run_target(target, args.part, args.out / target, args.hugepages,
                       args.timeout, args.memory, rerun)
        print(report.line(r), flush=True)
        return r

    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs))
    try:
        results = list(pool.map(one, targets))
    finally:
        boot.kill_all()  # a Ctrl-C or SIGTERM leaves no guest running
        pool.shutdown(wait=True, cancel_futures=True)
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
            report.record(r)
        report.write_docs()
    if any(r.get("problem") for r in results):
        return 2
    return 0 if all(r["pytest"]["exit_status"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
