"""One matrix target's job, run inside the guest (or on the host itself).

It records what the kernel and its KVM are (HostInfo), which backings and
fault paths run (uffdkvm's own probes: backing_support, fault_path_support),
and the outcome of the part's tests, run from the repository root as the
README runs them, into OUT/result.json:

    {"target", "kernel_release", "kvm_module", "host": {...HostInfo},
     "backings": {backing: {uffd_mode: null | why not}},
     "fault_paths": {group: {choice: null | why not}},
     "pytest": {"exit_status" (null: stopped at --timeout), "timed_out",
                "passed", "failed", "skipped", "errors",
                "skips": [{"test", "reason"}], "failures": [{"test", "message"}],
                "seconds"},
     "seconds"}
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import parts

ROOT = pathlib.Path(__file__).resolve().parents[2]
HUGEPAGES = "/proc/sys/vm/nr_hugepages"
GIGANTIC_HUGEPAGES = "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"
INTERRUPT_GRACE_S = 120    # from the SIGINT at the bound to pytest's exit


def _keyed(support: dict) -> dict:
    """JSON has no None keys: uffd_mode None is "none"."""
    return {str(k).lower() if k is not None else "none":
            _keyed(v) if isinstance(v, dict) else v for k, v in support.items()}


def probe() -> dict:
    import uffdkvm
    from uffdkvm.host import facts as host

    info = dataclasses.asdict(host.capture())
    return {"kernel_release": info["kernel_release"], "kvm_module": info["kvm_module"],
            "host": info, "backings": _keyed(uffdkvm.backing_support()),
            "fault_paths": _keyed(uffdkvm.fault_path_support())}


def junit_outcomes(path: pathlib.Path) -> dict:
    out: dict = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0,
                 "skips": [], "failures": []}
    if not path.exists():
        return out
    for case in ET.parse(path).iter("testcase"):
        if not case.get("name"):
            continue    # the test a SIGINT at the bound interrupted: no outcome
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag: child for child in case}
        if "failure" in kinds or "error" in kinds:
            tag = "failure" if "failure" in kinds else "error"
            out["failed" if tag == "failure" else "errors"] += 1
            out["failures"].append({"test": name,
                                    "message": (kinds[tag].get("message") or "")[:2000]})
        elif "skipped" in kinds:
            out["skipped"] += 1
            out["skips"].append({"test": name, "reason": kinds["skipped"].get("message", "")})
        else:
            out["passed"] += 1
    return out


def node_id(test: str) -> str:
    """pytest's node id for a junit test name ("tests.core.test_run::name",
    "tests.core.test_run.TestY::name"): the module is the longest prefix that is a file."""
    classname, _, name = test.partition("::")
    if classname.endswith(".py"):
        return test     # already a node id (a file, or a file's test)
    words = classname.split(".")
    for n in range(len(words), 0, -1):
        path = "/".join(words[:n]) + ".py"
        if (ROOT / path).exists():
            return "::".join([path, *words[n:], name])
    return test


def run_tests(part: str, out: pathlib.Path, timeout_s: float, emulated: bool,
              nodes: list[str] | None = None) -> dict:
    junit = out / "junit.xml"
    junit.unlink(missing_ok=True)
    # The README's `pytest`: its entry point beside this interpreter, which
    # (unlike `python -m pytest`) does not put the root's source tree on sys.path.
    script = pathlib.Path(sys.executable).with_name("pytest")
    runner = [str(script)] if script.exists() else [sys.executable, "-P", "-m", "pytest"]
    # One test at a time (-n 0): two guests already share this machine's CPUs,
    # and a bound's SIGINT then stops one pytest, which writes its junit file.
    # -v names each test's outcome in pytest.log as it ends, so that a run cut
    # short (a full part takes hours under TCG) still says what failed, and
    # --durations says where a part's hours went.
    argv = [*runner, "-p", "no:cacheprovider", "-v", "-rfEs", "--durations=40", "-n", "0",
            f"--junitxml={junit}", *(nodes or parts.pytest_args(part, emulated))]
    start = time.monotonic()
    timed_out = False
    with open(out / "pytest.log", "w") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            status = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # SIGINT, as Ctrl-C: pytest ends the test it is in and still writes
            # the junit file, so the table counts what ran before the bound.
            timed_out = True
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=INTERRUPT_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            status = None
    return {"exit_status": status, "timed_out": timed_out, "argv": argv[1:],
            "seconds": time.monotonic() - start, **junit_outcomes(junit)}


def kernel_log() -> str:
    """The kernel's log as dmesg prints it, read from /dev/kmsg: what the
    guest's kernel said during the job (a TSC marked unstable, a KVM
    warning), which the console's early lines do not hold."""
    lines = []
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return f"(no kernel log: /dev/kmsg: {e.strerror})"
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break                       # the end of the buffer
            except OSError as e:
                if e.errno == errno.EPIPE:  # records overwritten meanwhile: go on
                    continue
                break
            header, _, text = record.partition(";")
            fields = header.split(",")
            usec = int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else 0
            lines.append(f"[{usec / 1e6:12.6f}] {text.rstrip()}")
    finally:
        os.close(fd)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--part", choices=sorted(parts.PARTS), default="smoke")
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--hugepages", type=int, default=0,
                    help="2 MiB huge pages to reserve for the probes and tests, given back after")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--rerun", type=pathlib.Path, metavar="JSON",
                    help="run only these tests again (a JSON list of junit names), "
                         "no probes; the outcome goes to rerun.json")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    before = pathlib.Path(HUGEPAGES).read_text().strip()
    gigantic = pathlib.Path(GIGANTIC_HUGEPAGES)
    gigantic_before = gigantic.read_text().strip() if gigantic.exists() else None
    try:
        # Reruns too: a huge-page test failed for want of them runs again with them.
        if args.hugepages:
            pathlib.Path(HUGEPAGES).write_text(str(args.hugepages))
        # A booted kernel reserves a 1 GiB page at boot (matrix.py); here the
        # host gets one more for the probes, so that its row says what a 1 GiB
        # page does rather than that the pool was empty.
        if args.target == "host" and gigantic_before is not None:
            with contextlib.suppress(OSError):  # no 1 GiB in one piece: the probe says so
                gigantic.write_text(str(int(gigantic_before) + 1))
        if args.rerun:
            nodes = [node_id(t) for t in json.loads(args.rerun.read_text())]
            again = run_tests(args.part, args.out, args.timeout,
                              emulated=args.target != "host", nodes=nodes)
            (args.out / "rerun.json").write_text(json.dumps(again, indent=1))
            return 0 if again["exit_status"] == 0 else 1
        result = {"target": args.target, "part": args.part, **probe()}
        result["pytest"] = run_tests(args.part, args.out, args.timeout,
                                     emulated=args.target != "host")
        if args.target != "host" and args.part == "full":
            result["deselected"] = parts.DESELECTED
    finally:
        if args.target != "host":  # the host's own log is its business, not the job's
            (args.out / "kernel.log").write_text(kernel_log())
        if args.hugepages:
            pathlib.Path(HUGEPAGES).write_text(before)
        if args.target == "host" and gigantic_before is not None:
            gigantic.write_text(gigantic_before)
    result["seconds"] = time.monotonic() - start
    (args.out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    return 0 if result["pytest"]["exit_status"] == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
