"""The matrix's results as a table, and docs/where-it-runs.md from them.

A target's result is guest.py's result.json (and wall_seconds, problem from
matrix.py). record() keeps one in tests/matrix/recorded/<target>.json;
render() turns the recorded ones into the "Where it runs" page, which
tests/project/test_matrix.py checks is current.
"""
from __future__ import annotations

import datetime
import json
import pathlib

import parts

HERE = pathlib.Path(__file__).resolve().parent
RECORDED = HERE / "recorded"
DOCS = HERE.parents[1] / "docs" / "where-it-runs.md"
# Debian's kernels oldest first, then the host; kernels brought with
# --kernel after them, by name.
ORDER = [*parts.KERNELS, "host"]


def _counts(r: dict) -> tuple[int, int, int]:
    p = r.get("pytest", {})
    return p.get("passed", 0), p.get("failed", 0) + p.get("errors", 0), p.get("skipped", 0)


def _exit(r: dict) -> str:
    if r.get("unavailable"):
        return "none: unavailable"
    p = r.get("pytest", {})
    if p.get("timed_out"):
        return f"none: stopped at the bound, after {p.get('seconds', 0):.0f} s"
    return str(p.get("exit_status"))


def _where(r: dict) -> str:
    return f"{r.get('kernel_release', '?')}, {r.get('kvm_module', '?')}"


def line(r: dict) -> str:
    if r.get("unavailable"):
        return f"matrix: {r['target']}: unavailable: {r['unavailable']}"
    passed, failed, skipped = _counts(r)
    return (f"matrix: {r['target']} ({_where(r)}): {passed} passed, {failed} failed, "
            f"{skipped} skipped, pytest exit {_exit(r)}, {r.get('wall_seconds', 0):.0f} s")


def table(results: list[dict]) -> str:
    rows = ["| target | kernel, KVM | part | passed | failed | skipped | pytest exit | wall s |",
            "|---|---|---|---|---|---|---|---|"]
    for r in results:
        passed, failed, skipped = _counts(r)
        rows.append(f"| {r['target']} | {_where(r)} | {r.get('part', '?')} | {passed} | "
                    f"{failed} | {skipped} | {_exit(r)} | "
                    f"{r.get('wall_seconds', 0):.0f} |")
    return "\n".join(rows)


def record(r: dict) -> None:
    RECORDED.mkdir(exist_ok=True)
    kept = {k: v for k, v in r.items() if k != "problem" or v}
    kept.setdefault("recorded", datetime.date.today().isoformat())
    (RECORDED / f"{r['target']}.json").write_text(json.dumps(kept, indent=1, sort_keys=True)
                                                  + "\n")


def recorded_of(target: str) -> dict:
    return json.loads((RECORDED / f"{target}.json").read_text())


# Why a failed test is not run again: no test of its name is in the tree now.
GONE = "renamed or removed since the recorded run"


def with_rerun(target: str, again: dict, left_out: dict[str, str] | None = None) -> dict:
    """The target's recorded result, with the tests of `again` (a rerun's
    pytest outcome) taking their new outcomes; the rerun is kept under
    "reruns" (which tests, and how they came out), as the page says.
    left_out: failed tests (junit name -> why) not run again: those the
    part deselects since the recorded run leave the failures, and the
    deselected list becomes the part's present one; those GONE from the
    tree stay failures, listed as such."""
    r = recorded_of(target)
    p = r["pytest"]
    left_out = left_out or {}
    gone = sorted(t for t, why in left_out.items() if why == GONE)
    deselected = sorted(t for t in left_out if t not in gone)
    names = [f["test"] for f in p["failures"] if f["test"] not in left_out]
    p["passed"] += again["passed"]
    p["skipped"] += again["skipped"]
    p["skips"] += again["skips"]
    kept = [f for f in p["failures"] if f["test"] in gone]
    p["failures"] = kept + again["failures"]
    p["failed"], p["errors"] = len(kept) + again["failed"], again["errors"]
    if again["exit_status"] == 0 and not p["failures"]:
        p["exit_status"] = 0
    entry = {"tests": names, "passed": again["passed"],
             "failed": again["failed"] + again["errors"], "skipped": again["skipped"]}
    if gone:
        entry["gone"] = gone
    if deselected:
        entry["deselected"] = deselected
        r["deselected"] = parts.DESELECTED
    r.setdefault("reruns", []).append(entry)
    return r


def recorded() -> list[dict]:
    found = {p.stem: json.loads(p.read_text()) for p in RECORDED.glob("*.json")}
    return [found[t] for t in sorted(found, key=lambda t: (t not in ORDER,
                                                          ORDER.index(t) if t in ORDER else 0, t))]


def _features(r: dict) -> dict[tuple[str, str], str | None]:
    """(group, feature) -> None where it runs, else why not."""
    out: dict[tuple[str, str], str | None] = {}
    for backing, modes in r.get("backings", {}).items():
        for mode, why in modes.items():
            out[("backing, uffd_mode", f"{backing}, {mode}")] = why
    for group, choices in r.get("fault_paths", {}).items():
        for choice, why in choices.items():
            out[(group, choice)] = why
    return out


def render(results: list[dict]) -> str:
    notes: dict[str, int] = {}

    def cell(why: str | None) -> str:
        if why is None:
            return "yes"
        n = notes.setdefault(why, len(notes) + 1)
        return f"no [{n}]"

    feats = [_features(r) for r in results]
    keys: list[tuple[str, str]] = []
    for f in feats:
        keys += [k for k in f if k not in keys]
    head = ["<!-- generated by tests/matrix/report.py from tests/matrix/recorded/*.json: "
            "do not edit; rerun `python3 tests/matrix/matrix.py --part full --record` -->",
            "# Where it runs",
            "",
            "What uffdkvm runs on Debian's own kernels under stock x86 KVM (kvm_amd with",
            "nested paging, booted under QEMU by `tests/matrix/` through",
            "[uffdkvm.kernels](kernels.md)), on any kernel brought with `--kernel`, and",
            "on the development host (kvm_pvm). Every \"yes\" is a real probe or run",
            "that verified on that kernel (`uffdkvm.backing_support()`,",
            "`uffdkvm.fault_path_support()`); every \"no\" gives the reason that kernel",
            "gave. [development.md](development.md#the-kernel-matrix) says how to run",
            "the matrix.",
            "",
            "## Tests",
            "",
            "| target | kernel | from | KVM | QEMU | part | passed | failed | skipped | "
            "recorded |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        passed, failed, skipped = _counts(r)
        qemu = r.get("accel", "-") if r["target"] != "host" else "-"
        origin = r.get("kernel_origin", "this machine" if r["target"] == "host" else "?")
        head.append(f"| {r['target']} | {r.get('kernel_release', '?')} | {origin} | "
                    f"{r.get('kvm_module', '?')} | {qemu} | {r.get('part')} | {passed} | "
                    f"{failed} | {skipped} | {r.get('recorded', '?')} |")
    head += ["", "## Features", "",
             "| group | feature | " + " | ".join(f"{r['target']} ({r.get('kernel_release')})"
                                               for r in results) + " |",
             "|---|---|" + "---|" * len(results)]
    for group, feature in keys:
        head.append(f"| {group} | {feature} | " +
                    " | ".join(cell(f.get((group, feature), "not probed")) for f in feats)
                    + " |")
    for r in results:
        for again in r.get("reruns", []):
            if again["tests"]:
                head += ["", f"On {r['target']}, {len(again['tests'])} tests that failed in "
                         f"the recorded run were run again ({again['passed']} passed, "
                         f"{again['failed']} failed, {again['skipped']} skipped); the counts "
                         "above hold their second outcome: " +
                         ", ".join(f"`{t}`" for t in again["tests"]) + "."]
            if again.get("gone"):
                head += ["", f"On {r['target']}, {len(again['gone'])} more that failed there "
                         f"were not run again, {GONE}; they stay failures: " +
                         ", ".join(f"`{t}`" for t in again["gone"]) + "."]
            if again.get("deselected"):
                head += ["", f"On {r['target']}, {len(again['deselected'])} more that failed "
                         "there are deselected since (below: each holds this host's timing "
                         "to a bound), and were not run again: " +
                         ", ".join(f"`{t}`" for t in again["deselected"]) + "."]
    deselected = {node: why for r in results for node, why in r.get("deselected", {}).items()}
    if deselected:
        head += ["", "## Left out under TCG", "",
                 "The full part leaves these out on the emulated kernels (they run on the "
                 "host): each holds this host's timing to a bound that TCG cannot keep.", "",
                 "| test | its bound |", "|---|---|"]
        head += [f"| `{node}` | {why} |" for node, why in deselected.items()]
    skips = sorted({(s["reason"], r["target"]) for r in results
                    for s in r.get("pytest", {}).get("skips", [])})
    head += ["", "## Why not", ""]
    head += [f"{n}. {why}" for why, n in notes.items()]
    if skips:
        head += ["", "## Skipped tests and their host facts", "",
                 "| target | reason |", "|---|---|"]
        seen = set()
        for reason, target in skips:
            if (target, reason) not in seen:
                seen.add((target, reason))
                head.append(f"| {target} | {reason.replace('|', '/')} |")
    return "\n".join(head) + "\n"


def write_docs() -> None:
    DOCS.write_text(render(recorded()))
