#!/usr/bin/env python3
"""Per-fault counts, uffdkvm beside the kernel's demand_paging_test.

What each tool's threads do per fault, from the kernel's own tracepoints
(`perf record` of the tool's process and every thread it starts, nothing
system-wide): the system calls by kind, the context switches (voluntary:
the thread blocked; involuntary: it was preempted), the CPU time
(`sched_stat_runtime`), the migrations, and every wakeup one of its threads
made of another, local (the wakee placed on the waker's CPU) or across
CPUs: the waker and its CPU from `sched_waking` (which fires in the
waker's context), the CPU the wakee was placed on from the `target_cpu` of
the `sched_wakeup` that follows for the same wakee (`sched_wakeup` alone
can fire on the target CPU, for a queued wakeup, and so cannot say where
the waker was). A thread's role comes from what it calls: a vCPU thread calls
`ioctl(KVM_RUN)`, a reader a resolving ioctl (`UFFDIO_COPY`, `CONTINUE`,
...) or waits on the uffd; every other thread of the process (Python's main
thread, uffdkvm's controller and watch, upstream's main thread) is "other",
and its context switches are reported per second of the vCPUs' run.

Counts are divided by the run's faults (pages: every page of 4 KiB faults
once in these settings). perf slows every command (each event is a record),
so its paging rates are not rates to quote: `overhead.py` times, this script
counts.

    python benchmarks/tax_counts.py --upstream PATH/demand_paging_test \\
        --trials 3 --json tax_counts.json

Configurations are upstream's flags, "LABEL=FLAGS" (--config, repeatable;
the default: the three settings of overhead.py, pinned with -c 0,1, and
MINOR unpinned). --variant LABEL=FLAGS adds a uffdkvm command with extra
flags (repeatable; default: uffdkvm as it is, and
`--pin-readers scheduler`, upstream's placement).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from uffdkvm._spawn import child_env, python_command
from uffdkvm.config import parse_size

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead import RATE, rotated, table, vcpus_of  # noqa: E402  (benchmarks/overhead.py)

CONFIGS = {
    "MISSING, one uffd per vCPU, 1 reader, -c 0,1": "-u MISSING -v 2 -b 64M -r 1 -c 0,1",
    "MISSING, one uffd, 4 readers, -c 0,1": "-u MISSING -v 2 -b 64M -a -r 4 -c 0,1",
    "MINOR shmem, 2 readers per uffd, -c 0,1": "-u MINOR -s shmem -v 2 -b 64M -r 2 -c 0,1",
    "MINOR shmem, 2 readers per uffd, unpinned": "-u MINOR -s shmem -v 2 -b 64M -r 2",
}
# sched_waking fires in the waker's context, on the waker's CPU; sched_wakeup
# can fire on the target CPU (a queued wakeup, TTWU_QUEUE) and then names
# neither the waker nor its CPU. Its target_cpu is where the wakee was put.
EVENTS = ["sched:sched_switch", "sched:sched_waking", "sched:sched_wakeup",
          "sched:sched_migrate_task",
          "sched:sched_stat_runtime", "raw_syscalls:sys_enter"]
# x86-64 system call numbers of the calls these tools make on their hot paths.
SYSCALLS = {0: "read", 1: "write", 7: "poll", 16: "ioctl", 24: "sched_yield",
            35: "nanosleep", 98: "getrusage", 186: "gettid", 202: "futex",
            228: "clock_gettime", 230: "clock_nanosleep", 232: "epoll_wait",
            271: "ppoll", 281: "epoll_pwait", 426: "io_uring_enter", 441: "epoll_pwait2"}
IOCTLS = {0xAE80: "KVM_RUN", 0xC028AA03: "UFFDIO_COPY", 0xC020AA04: "UFFDIO_ZEROPAGE",
          0x8010AA02: "UFFDIO_WAKE", 0xC020AA07: "UFFDIO_CONTINUE",
          0xC028AA05: "UFFDIO_MOVE", 0xC018AA06: "UFFDIO_WRITEPROTECT"}
RESOLVING = {"UFFDIO_COPY", "UFFDIO_ZEROPAGE", "UFFDIO_CONTINUE", "UFFDIO_MOVE",
             "UFFDIO_WRITEPROTECT"}
WAITS = {"epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "io_uring_enter"}

LINE = re.compile(r"^\s*(?P<comm>.*?)\s+(?P<tid>\d+)\s+\[(?P<cpu>\d+)\]\s+(?P<time>[\d.]+):\s+"
                  r"(?P<event>[\w:]+):\s+(?P<rest>.*)$")
FIELD = re.compile(r"(\w+)=(\S+)")
NR = re.compile(r"NR (\d+) \(([0-9a-fx]+)?,?\s*([0-9a-fx]+)?")


class Thread:
    def __init__(self) -> None:
        self.syscalls: collections.Counter[str] = collections.Counter()
        self.voluntary = 0
        self.involuntary = 0
        self.runtime_ns = 0
        self.migrations = 0
        self.cpus: collections.Counter[int] = collections.Counter()  # switch-outs by CPU
        self.first = self.last = 0.0

    def role(self) -> str:
        if self.syscalls["ioctl(KVM_RUN)"]:
            return "vcpu"
        if any(self.syscalls[f"ioctl({n})"] for n in RESOLVING):
            return "reader"
        return "other"


def parse(script: str) -> tuple[dict[int, Thread], list[tuple[int, int, int, int]]]:
    """Threads by tid, and the wakeups (waker tid, waker CPU, wakee tid, target CPU):
    the waker and its CPU from sched_waking (its context), the target CPU
    from the sched_wakeup of the same wakee that follows it."""
    threads: dict[int, Thread] = collections.defaultdict(Thread)
    wakeups: list[tuple[int, int, int, int]] = []
    waking: dict[int, tuple[int, int]] = {}  # wakee -> (waker, waker's CPU), not yet placed
    for line in script.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        tid, cpu, t = int(m["tid"]), int(m["cpu"]), float(m["time"])
        ev, rest = m["event"], m["rest"]
        th = threads[tid]
        th.first = th.first or t
        th.last = t
        if ev == "raw_syscalls:sys_enter":
            n = NR.search(rest)
            if not n:
                continue
            nr = int(n[1])
            name = SYSCALLS.get(nr, f"nr {nr}")
            if nr == 16 and n[3]:
                req = int(n[3], 16)
                name = f"ioctl({IOCTLS.get(req, hex(req))})"
            th.syscalls[name] += 1
            continue
        f = dict(FIELD.findall(rest))
        if ev == "sched:sched_switch":
            prev = int(f["prev_pid"])
            p = threads[prev]
            p.cpus[cpu] += 1
            if f["prev_state"].startswith("R"):
                p.involuntary += 1
            else:
                p.voluntary += 1
        elif ev == "sched:sched_waking":
            waking[int(f["pid"])] = (tid, cpu)
        elif ev == "sched:sched_wakeup":
            wakee = int(f["pid"])
            if wakee in waking:  # a wakeup whose waking perf missed is left out
                waker, wcpu = waking.pop(wakee)
                wakeups.append((waker, wcpu, wakee, int(f["target_cpu"])))
        elif ev == "sched:sched_stat_runtime":
            threads[int(f.get("pid", tid))].runtime_ns += int(f["runtime"].rstrip("[ns]"))
        elif ev == "sched:sched_migrate_task":
            threads[int(f["pid"])].migrations += 1
    return threads, wakeups


def count_run(cmd: list[str], pages: int) -> dict[str, Any]:
    """One run of cmd under perf: its counts per fault, and its (perf-slowed) rate."""
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        p = subprocess.run(["perf", "record", "-q", "-o", data, "-m", "4M",
                            "-e", ",".join(EVENTS), "--"] + cmd,
                           capture_output=True, text=True, timeout=1800, env=child_env())
        m = RATE.search(p.stdout)
        if p.returncode or not m:
            raise SystemExit(f"{shlex.join(cmd)} failed under perf ({p.returncode}):\n"
                             f"{p.stdout}\n{p.stderr}")
        s = subprocess.run(["perf", "script", "-i", data, "-F", "comm,tid,cpu,time,event,trace"],
                           capture_output=True, text=True, check=True)
    threads, wakeups = parse(s.stdout)
    ours = {tid for tid, th in threads.items() if th.syscalls}  # the process's own threads
    roles = {tid: threads[tid].role() for tid in ours}
    vcpus = [t for t in ours if roles[t] == "vcpu"]
    start = min(threads[t].first for t in vcpus)
    end = max(threads[t].last for t in vcpus)
    out: dict[str, Any] = {"rate_under_perf": float(m[1]), "pages": pages,
                           "threads": {r: sum(1 for t in ours if roles[t] == r)
                                       for r in ("vcpu", "reader", "other")}}
    for role in ("reader", "vcpu", "other"):
        ts = [threads[t] for t in ours if roles[t] == role]
        calls: collections.Counter[str] = collections.Counter()
        for th in ts:
            calls.update(th.syscalls)
        out[role] = {
            "syscalls_per_fault": {k: v / pages for k, v in sorted(calls.items())},
            "voluntary_per_fault": sum(th.voluntary for th in ts) / pages,
            "involuntary_per_fault": sum(th.involuntary for th in ts) / pages,
            "cpu_us_per_fault": sum(th.runtime_ns for th in ts) / pages / 1e3,
            "migrations_per_fault": sum(th.migrations for th in ts) / pages,
        }
    out["other"]["switches_per_s"] = sum(
        threads[t].voluntary + threads[t].involuntary for t in ours if roles[t] == "other"
    ) / max(end - start, 1e-9)
    # Wakeups between the process's threads, by who woke whom and where.
    pairs: collections.Counter[str] = collections.Counter()
    for waker, wcpu, wakee, target in wakeups:
        if waker in roles and wakee in roles:
            where = "local" if wcpu == target else "cross"
            pairs[f"{roles[waker]}->{roles[wakee]} {where}"] += 1
    out["wakeups_per_fault"] = {k: v / pages for k, v in sorted(pairs.items())}
    # Where each reader's switch-outs happened: the CPUs a reader used.
    out["reader_cpus"] = [dict(sorted(threads[t].cpus.items())) for t in sorted(ours)
                          if roles[t] == "reader"]
    return out


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def sample_run(cmd: list[str], pages: int, uffds: int, readers: int,
               every_s: float) -> dict[str, Any]:
    """One run of cmd without perf, its threads sampled from /proc every
    every_s: each thread's last context-switch counts and CPU time
    (schedstat), the CPUs it was seen on, and what it was in (syscall).
    Threads are numbered in the order they were made (tids), which both
    tools make vCPU i's uffd's readers in: reader k serves uffd k // readers,
    which serves vCPU k // readers (one uffd per vCPU). What the last sample
    missed (at most every_s of the run's end) is missing here."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=child_env())
    seen: dict[int, dict[str, Any]] = {}
    while p.poll() is None:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{p.pid}/task")]
        except OSError:
            break
        for tid in tids:
            base = f"/proc/{p.pid}/task/{tid}"
            st = _read(f"{base}/stat")
            status = _read(f"{base}/status")
            sched = _read(f"{base}/schedstat").split()
            call = _read(f"{base}/syscall").split()
            if not st or not sched:
                continue
            d = seen.setdefault(tid, {"cpus": collections.Counter(), "calls": set()})
            fields = st[st.rindex(")") + 2:].split()
            d["cpus"][int(fields[36])] += 1  # field 39, the CPU it last ran on
            for line in status.splitlines():
                if line.startswith("Cpus_allowed_list"):
                    d["allowed"] = line.split()[1]
                elif line.startswith("voluntary_ctxt_switches"):
                    d["voluntary"] = int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    d["involuntary"] = int(line.split()[1])
            d["cpu_ns"] = int(sched[0])
            if call and call[0].isdigit():
                nr = int(call[0])
                d["calls"].add(f"ioctl({IOCTLS.get(int(call[2], 16), call[2])})"
                               if nr == 16 and len(call) > 2 else SYSCALLS.get(nr, f"nr {nr}"))
        __import__("time").sleep(every_s)
    out_text, err = p.communicate()
    m = RATE.search(out_text)
    if p.returncode or not m:
        raise SystemExit(f"{shlex.join(cmd)} failed ({p.returncode}):\n{out_text}\n{err}")
    # The vCPU threads spend the most CPU (the guest's emulated instructions),
    # the readers block the most; the process's first thread is neither.
    nv = int(cmd[cmd.index("-v") + 1]) if "-v" in cmd else 1
    rest = [t for t in seen if t != p.pid]
    vcpus = sorted(sorted(rest, key=lambda t: -seen[t]["cpu_ns"])[:nv])
    if "-c" in cmd:  # pinned: vCPU i is the busiest thread allowed only the i-th CPU
        pins = cmd[cmd.index("-c") + 1].split(",")[:nv]
        vcpus = [max((t for t in rest if seen[t].get("allowed") == cpu),
                     key=lambda t: seen[t]["cpu_ns"], default=0) for cpu in pins]
        vcpus = [t for t in vcpus if t]
    rdrs = sorted(sorted((t for t in rest if t not in vcpus),
                         key=lambda t: -seen[t].get("voluntary", 0))[:uffds * readers])
    others = [t for t in seen if t not in vcpus and t not in rdrs]

    def where(t: int) -> int:
        return seen[t]["cpus"].most_common(1)[0][0]
    with_vcpu = None
    if uffds == len(vcpus) and len(rdrs) == uffds * readers:
        with_vcpu = sum(where(r) == where(vcpus[k // readers])
                        for k, r in enumerate(rdrs)) / len(rdrs)
    return {
        "rate": float(m[1]), "pages": pages, "sample_s": every_s,
        "reader_voluntary_per_fault": sum(seen[t].get("voluntary", 0) for t in rdrs) / pages,
        "reader_involuntary_per_fault": sum(seen[t].get("involuntary", 0) for t in rdrs) / pages,
        "reader_cpu_us_per_fault": sum(seen[t]["cpu_ns"] for t in rdrs) / pages / 1e3,
        "vcpu_involuntary_per_fault": sum(seen[t].get("involuntary", 0) for t in vcpus) / pages,
        "readers_with_their_vcpu": with_vcpu,
        "reader_cpus": [where(t) for t in rdrs], "vcpu_cpus": [where(t) for t in vcpus],
        "readers_moved": sum(len(seen[t]["cpus"]) > 1 for t in rdrs),
        "other_threads": len(others),
    }


def pages_of(flags: list[str]) -> int:
    size = flags[flags.index("-b") + 1] if "-b" in flags else "1G"
    return vcpus_of(flags) * parse_size(size, "-b") // 4096


def median_of(runs: list[dict[str, Any]], path: list[str]) -> float:
    vals = []
    for r in runs:
        v: Any = r
        for k in path:
            v = v.get(k, 0.0) if isinstance(v, dict) else 0.0
        vals.append(float(v))
    return statistics.median(vals)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", help="path to demand_paging_test (else uffdkvm only)")
    ap.add_argument("--trials", type=int, default=3, help="runs per command (default 3)")
    ap.add_argument("--config", action="append", metavar="LABEL=FLAGS")
    ap.add_argument("--variant", action="append", metavar="LABEL=FLAGS",
                    help="a uffdkvm command with these flags added (repeatable)")
    ap.add_argument("--json", metavar="PATH", help="every run's counts")
    ap.add_argument("--proc", type=float, metavar="SECONDS", default=None,
                    help="instead of perf, sample each thread's /proc files this often "
                    "(e.g. 0.01): placement and switches of runs perf does not slow")
    a = ap.parse_args()
    configs = dict(c.split("=", 1) for c in a.config) if a.config else CONFIGS
    variants = dict(v.split("=", 1) for v in a.variant) if a.variant else {
        "uffdkvm": "", "uffdkvm, scheduler's placement": "--pin-readers scheduler"}
    me = python_command(module="uffdkvm")
    record: dict[str, Any] = {"trials": a.trials, "upstream": a.upstream, "configs": []}
    rows = []
    for label, text in configs.items():
        flags = shlex.split(text)
        pages = pages_of(flags)
        cmds = {name: me + flags + shlex.split(extra) for name, extra in variants.items()}
        if "-c" not in flags:  # --pin-readers scheduler needs no pins; "vcpus" does
            cmds = {k: v for k, v in cmds.items() if "--pin-readers vcpus" not in shlex.join(v)}
        if a.upstream:
            cmds = {"upstream": [a.upstream] + flags, **cmds}
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in cmds}
        for t in range(a.trials):
            for name in rotated(list(cmds), t):
                if a.proc:
                    uffds = 1 if "-a" in flags or "-o" in flags else vcpus_of(flags)
                    r = int(flags[flags.index("-r") + 1]) if "-r" in flags else 1
                    runs[name].append(sample_run(cmds[name], pages, uffds, r, a.proc))
                else:
                    runs[name].append(count_run(cmds[name], pages))
            print(f"{label}: trial {t + 1}/{a.trials}", file=sys.stderr)
        record["configs"].append({"label": label, "flags": text, "runs": runs})
        for name, rs in runs.items():
            if a.proc:
                rows.append([label, name] + [
                    f"{statistics.median(x[k] for x in rs):.2f}" for k in
                    ("reader_voluntary_per_fault", "reader_involuntary_per_fault",
                     "reader_cpu_us_per_fault", "vcpu_involuntary_per_fault")] + [
                    " ".join("-" if x["readers_with_their_vcpu"] is None else
                             f"{x['readers_with_their_vcpu']:.2f}" for x in rs),
                    " ".join(f"{x['rate'] / 1e3:.0f}k" for x in rs)])
                continue
            rd = rs[0]["reader"]["syscalls_per_fault"]
            kinds = sorted({k for r in rs for k in r["reader"]["syscalls_per_fault"]} | set(rd))
            # Calls made fewer than once in 200 faults (start-up, the end) are left out.
            sysc = ", ".join(f"{k} {v:.2f}" for k in kinds
                             if (v := median_of(rs, ['reader', 'syscalls_per_fault', k])) >= 0.005)
            wk = sorted({k for r in rs for k in r["wakeups_per_fault"]})
            wake = ", ".join(f"{k} {v:.2f}" for k in wk
                             if (v := median_of(rs, ['wakeups_per_fault', k])) >= 0.005)
            rows.append([
                label, name, sysc or "-",
                f"{median_of(rs, ['reader', 'voluntary_per_fault']):.2f} / "
                f"{median_of(rs, ['reader', 'involuntary_per_fault']):.2f}",
                f"{median_of(rs, ['vcpu', 'voluntary_per_fault']):.2f} / "
                f"{median_of(rs, ['vcpu', 'involuntary_per_fault']):.2f}",
                wake or "-",
                f"{median_of(rs, ['reader', 'cpu_us_per_fault']):.1f}",
                f"{median_of(rs, ['vcpu', 'migrations_per_fault']):.3f} / "
                f"{median_of(rs, ['reader', 'migrations_per_fault']):.3f}",
                f"{median_of(rs, ['other', 'switches_per_s']):.0f}",
            ])
    if a.proc:
        print(f"\nPer fault, median of {a.trials} runs sampled from /proc every {a.proc} s "
              "(no perf; the last sample's interval is missed)")
        head = ["config", "tool", "reader switches vol / fault", "reader switches invol / fault",
                "reader CPU us / fault", "vCPU switches invol / fault",
                "share of readers on their vCPU's CPU, each run", "rate, each run"]
        print(table(head, rows))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(record, f, indent=1, default=list)
        return
    head = ["config", "tool", "reader syscalls / fault", "reader switches vol / invol",
            "vCPU switches vol / invol", "wakeups / fault (waker->wakee, CPU)",
            "reader CPU us / fault", "migrations / fault, vCPU / reader",
            "other threads' switches / s"]
    print(f"\nPer fault, median of {a.trials} runs under perf (counts; no timing)")
    print(table(head, rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
