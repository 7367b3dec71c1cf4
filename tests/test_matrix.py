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
