"""The kernel matrix (tests/matrix/) and what it generates.

docs/where-it-runs.md is generated from the matrix's recorded results
(tests/matrix/recorded/*.json) and must be what report.py renders from them
now: a hand edit of the page, or a recorded result the page was not
regenerated from, fails here. The matrix's smoke part names only tests that
exist, so that a renamed test cannot silently drop out of what .ci/run
proves on stock KVM.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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
            assert f"def {name}(" in source, f"{spec}: no such test"


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
    r = guest.run_tests("smoke", out, timeout_s=20, emulated=False, nodes=[str(tests)])
    assert r["timed_out"] and r["exit_status"] is None, r
    assert r["passed"] == 1, (r, (out / "pytest.log").read_text()[-2000:])
    assert r["seconds"] < 20 + guest.INTERRUPT_GRACE_S
    assert "stopped at the bound" in report.line({"target": "6.1", "pytest": r})
