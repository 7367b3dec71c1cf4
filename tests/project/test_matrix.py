"""The kernel matrix (tests/matrix/) and what it generates.

docs/where-it-runs.md is generated from the matrix's recorded results
(tests/matrix/recorded/*.json) and must be what report.py renders from them
now: a hand edit of the page, or a recorded result the page was not
regenerated from, fails here. The matrix's smoke part names only tests that
exist, so that a renamed test cannot silently drop out of what .ci/run
proves on stock KVM.
"""
import json
import pathlib
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.archive import unreachable_archive

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "matrix"))

import parts  # noqa: E402
import report  # noqa: E402


def test_where_it_runs_is_generated_from_the_recorded_matrix():
    results = report.recorded()
    assert {r["target"] for r in results} >= {"6.1", "6.12", "host"}, \
        "record every target: python3 tests/matrix/matrix.py --part full --record"
    assert report.DOCS.read_text() == report.render(results), \
        "docs/where-it-runs.md is stale: rerun tests/matrix/report.py's write_docs()"
    kvm = {r["target"]: r.get("kvm_module") for r in results}
    assert kvm["6.1"] == kvm["6.12"] == "kvm_amd", kvm  # stock KVM, not this host's


def test_smoke_part_names_tests_that_exist():
    for spec in parts.SMOKE:
        path, _, name = spec.partition("::")
        source = (ROOT / path).read_text()
        if name:
            assert f"def {name.partition('[')[0]}(" in source, f"{spec}: no such test"


def test_the_kernel_log_holds_what_the_kernel_said_last(tmp_path):
    """What a guest's job keeps of its kernel's log (kernel.log): here, this
    kernel's, with a line written into it just before."""
    import os
    import uuid

    import guest
    from helpers.hostfacts import NOT_ROOT, host_skip

    if NOT_ROOT.holds:
        host_skip(NOT_ROOT, "writes a line into the kernel's log (/dev/kmsg)")
    marker = f"uffdkvm-test-{uuid.uuid4().hex}"
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        os.write(fd, f"{marker}\n".encode())
    finally:
        os.close(fd)
    lines = guest.kernel_log().splitlines()
    mine = [line for line in lines if line.endswith(marker)]
    assert len(mine) == 1, lines[-5:]
    assert mine[0].startswith("[") and float(mine[0][1:].split("]")[0]) > 0, mine


def test_a_part_stopped_at_its_bound_still_counts_what_ran(tmp_path):
    # A bound that kills pytest outright loses its junit file, and the table
    # said "0 passed" for a kernel that had run most of its part.
    import guest

    tests = tmp_path / "test_bounded.py"
    tests.write_text("import time\n\n"
                     "def test_quick():\n    pass\n\n"
                     "def test_past_the_bound():\n    time.sleep(300)\n")
    out = tmp_path / "out"
    out.mkdir()
    r = guest.run_tests("smoke", out, timeout_s=5, emulated=False, nodes=[str(tests)])
    assert r["timed_out"] and r["exit_status"] is None, r
    assert r["passed"] == 1, (r, (out / "pytest.log").read_text()[-2000:])
    assert r["seconds"] < 5 + guest.INTERRUPT_GRACE_S
    assert "stopped at the bound" in report.line({"target": "6.1", "pytest": r})


def test_a_kernel_that_cannot_be_had_is_unavailable_never_passed(tmp_path, monkeypatch,
                                                                  capsys):
    # Nothing listens on 127.0.0.1:9: the archive cannot be reached, as
    # without a network, so the kernel cannot be fetched.
    import matrix

    unreachable_archive(monkeypatch, tmp_path)
    assert matrix.main(["--target", "7.2", "--out", str(tmp_path / "out")]) == 2
    out = capsys.readouterr().out
    assert "matrix: 7.2: unavailable: Debian kernel 7.2 (the newest 7.2 in sid)" in out
    assert "| 7.2 | ?, ? | smoke | 0 | 0 | 0 | none: unavailable |" in out
    (r,) = json.loads((tmp_path / "out" / "matrix.json").read_text())
    assert "Could not connect to 127.0.0.1:9" in r["unavailable"] and "pytest" not in r


def test_a_brought_kernel_whose_tree_was_never_indexed_is_refused_before_a_boot(
        tmp_path, capsys):
    import matrix
    from helpers.bzimage import write_bzimage

    image = write_bzimage(tmp_path / "bzImage", b"6.19.0-mine #1")
    # Its tree lacks modules.dep: refused before anything boots, naming --kernel.
    with pytest.raises(SystemExit):
        matrix.main(["--kernel", f"{image}:{tmp_path}", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "--kernel: modules: no " in err and "6.19.0-mine/modules.dep" in err, err
    assert not (tmp_path / "out").exists()


def _recorded_with_failures(tmp_path, monkeypatch, failures):
    """A recorded 6.1 result, in tmp_path, whose failures are these junit names."""
    monkeypatch.setattr(report, "RECORDED", tmp_path)
    (tmp_path / "6.1.json").write_text(json.dumps({
        "target": "6.1", "part": "full", "kernel_release": "6.1.0", "deselected": {},
        "pytest": {"exit_status": 1, "passed": 5, "failed": len(failures), "errors": 0,
                   "skipped": 0, "skips": [],
                   "failures": [{"test": t, "message": "m"} for t in failures]}}))


def _reruns_that_pass(monkeypatch):
    """matrix.run_target replaced by the guest's part as its rerun would come
    back, every test passed (booting one is not these tests' point); returns
    the list each call's rerun list is appended to."""
    import matrix

    ran = []

    def rerun_guest(target, part, out, hugepages, timeout_s, memory_mib, accel, rerun,
                    left_out):
        ran.append(rerun)
        return report.with_rerun(target, {"passed": 1, "failed": 0, "errors": 0,
                                          "skipped": 0, "skips": [], "failures": [],
                                          "exit_status": 0}, left_out)
    monkeypatch.setattr(matrix, "run_target", rerun_guest)
    return ran


def test_a_failure_deselected_since_leaves_the_failures_and_is_named(tmp_path, monkeypatch):
    """--rerun-failed: of two recorded failures, one the part deselects
    since is not run again; the merged result has only the other's new
    outcome, the present deselected list, and the page names both."""
    import matrix

    # junit names of tests in this very file, as a guest's junit file names them
    gone = "tests.project.test_matrix::test_bound[x]"
    kept = "tests.project.test_matrix::test_smoke_part_names_tests_that_exist"
    monkeypatch.setitem(parts.DESELECTED, "tests/project/test_matrix.py::test_bound", "a bound")
    _recorded_with_failures(tmp_path, monkeypatch, [gone, kept])
    ran = _reruns_that_pass(monkeypatch)
    assert matrix.main(["--target", "6.1", "--rerun-failed", "--out", str(tmp_path / "o")]) == 0
    assert ran == [[kept]]
    (r,) = json.loads((tmp_path / "o" / "matrix.json").read_text())
    p = r["pytest"]
    assert (p["passed"], p["failed"], p["failures"], p["exit_status"]) == (6, 0, [], 0), p
    assert r["deselected"]["tests/project/test_matrix.py::test_bound"] == "a bound"
    assert r["reruns"] == [{"tests": [kept], "passed": 1, "failed": 0, "skipped": 0,
                            "deselected": [gone]}]
    page = report.render([r])
    assert "were run again (1 passed, 0 failed, 0 skipped)" in page and f"`{gone}`" in page


def test_a_failure_renamed_since_stays_a_failure_and_is_named(tmp_path, monkeypatch):
    """--rerun-failed: a recorded failure whose test is no longer in the
    tree is not run again (pytest would run none of the list); it stays a
    failure, and the page says why."""
    import matrix

    renamed = "tests.project.test_matrix::test_that_was_renamed[a]"
    kept = "tests.project.test_matrix::test_smoke_part_names_tests_that_exist"
    _recorded_with_failures(tmp_path, monkeypatch, [renamed, kept])
    ran = _reruns_that_pass(monkeypatch)
    assert matrix.main(["--target", "6.1", "--rerun-failed", "--out", str(tmp_path / "o")]) == 1
    assert ran == [[kept]]
    (r,) = json.loads((tmp_path / "o" / "matrix.json").read_text())
    p = r["pytest"]
    assert (p["passed"], p["failed"], p["exit_status"]) == (6, 1, 1), p
    assert [f["test"] for f in p["failures"]] == [renamed]
    assert r["reruns"] == [{"tests": [kept], "passed": 1, "failed": 0, "skipped": 0,
                            "gone": [renamed]}]
    assert f"were not run again, {report.GONE}" in report.render([r])


def test_a_rerun_that_ran_nothing_leaves_the_recording_as_it_was(tmp_path, monkeypatch):
    """A rerun whose pytest ran none of its tests (exit 4: a node id it
    did not know) is a problem, never "0 failed", and is not recorded."""
    import matrix

    kept = "tests.project.test_matrix::test_smoke_part_names_tests_that_exist"
    _recorded_with_failures(tmp_path, monkeypatch, [kept])
    (tmp_path / "host.json").write_text((tmp_path / "6.1.json").read_text()
                                        .replace('"6.1"', '"host"'))
    before = (tmp_path / "host.json").read_text()

    def host_job(cmd, cwd=None):
        out = pathlib.Path(cmd[cmd.index("--out") + 1])
        (out / "rerun.json").write_text(json.dumps({
            "passed": 0, "failed": 0, "errors": 0, "skipped": 0, "skips": [],
            "failures": [], "exit_status": 4}))
        return subprocess.CompletedProcess(cmd, 1)
    monkeypatch.setattr(matrix.subprocess, "run", host_job)
    monkeypatch.setattr(matrix.report, "write_docs", lambda: None)
    code = matrix.main(["--target", "host", "--rerun-failed", "--record",
                        "--out", str(tmp_path / "o")])
    assert code == 2
    (r,) = json.loads((tmp_path / "o" / "matrix.json").read_text())
    assert "the rerun ran nothing: pytest exited 4" in r["problem"], r
    assert r["pytest"]["failed"] == 1 and r["pytest"]["failures"][0]["test"] == kept
    assert (tmp_path / "host.json").read_text() == before
