"""benchmarks/vs_dirty_log_perf.py in its tiny mode (one trial of a 1 MiB
run): it runs, the JSON holds every command's iterations, and every figure
is the one its runs give by the docstring's formulas. With upstream's
binary (UFFDKVM_DIRTY_LOG_PERF_TEST, or dirty_log_perf_test on PATH) the
same with upstream's rows and the ratios.

    python benchmarks/vs_dirty_log_perf.py --upstream PATH --trials 11 --json dirty.json
"""
import json
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys

import pytest
from helpers.hostfacts import NO_UFFD_WP_ASYNC, host_skip, missing_tool
from helpers.skips import skip_without_kvm

from uffdkvm._spawn import child_env

pytestmark = pytest.mark.kvm

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "vs_dirty_log_perf.py"
UPSTREAM = os.environ.get("UFFDKVM_DIRTY_LOG_PERF_TEST") or shutil.which("dirty_log_perf_test")
# The trackers this kernel has (wp_async: Linux 6.7+), which the script is told.
TRACKERS = ["bitmap", "bitmap_manual", "ring"] + ([] if NO_UFFD_WP_ASYNC.holds else ["wp_async"])
PAGES = 256  # -b 1M


def tiny(tmp_path, *extra):
    out = tmp_path / "dirty.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--trials", "1", "--flags",
                        "-v 1 -b 1M -i 2", "--json", str(out), "--trackers",
                        ",".join(TRACKERS), *extra],
                       capture_output=True, text=True, timeout=300, env=child_env())
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text()), p.stdout


def steady(values):
    return statistics.fmean(values[1:])


def check_figures(record, rows):
    runs, got = record["runs"], record["figures"]
    assert record["pages_per_vcpu"] == PAGES and record["gib"] == 1 / 1024
    for name, trials in runs.items():
        assert len(trials) == 1 and trials[0] is not None, name  # every tiny run succeeds
        assert len(trials[0]["dirty"]) == 2, name  # -i 2: two iterations each
    for row in rows:
        w100, w0 = runs[f"{row} w100"][0], runs[f"{row} w0"][0]
        write = (steady(w100["dirty"]) - steady(w0["dirty"])) / PAGES * 1e6
        assert math.isclose(got[row]["write_us_per_page"][0], write, rel_tol=1e-9)
        harvest = steady([h + r for h, r in zip(w100["harvest"], w100["reprotect"],
                                                    strict=True)]) * 1024
        assert math.isclose(got[row]["harvest_s_per_gib"][0], harvest, rel_tol=1e-9)
        if row.startswith("uffdkvm"):
            off = runs["uffdkvm off w100"][0]
            assert math.isclose(got[row]["vs_off_us_per_page"][0],
                                (steady(w100["dirty"]) - steady(off["dirty"])) / PAGES * 1e6,
                                rel_tol=1e-9)
    off100, off0 = runs["uffdkvm off w100"][0], runs["uffdkvm off w0"][0]
    assert math.isclose(got["uffdkvm off"]["write_us_per_page"][0],
                        (steady(off100["dirty"]) - steady(off0["dirty"])) / PAGES * 1e6,
                        rel_tol=1e-9)


def test_uffdkvm_alone(kvm_reason, tmp_path):
    skip_without_kvm(kvm_reason)
    record, out = tiny(tmp_path)
    rows = [f"uffdkvm {t}" for t in TRACKERS]
    assert set(record["figures"]) == {*rows, "uffdkvm off"}
    check_figures(record, rows)
    # -g-less trackers: no re-protect time; the others have one
    for t in {"bitmap", "wp_async"} & set(TRACKERS):
        assert record["runs"][f"uffdkvm {t} w100"][0]["reprotect"] == [0.0, 0.0]
    assert "| tool | tracker | (a) write us/page | (b) harvest+reprotect s/GiB |" in out
    for t in TRACKERS + ["off"]:
        assert f"| uffdkvm | {t} |" in out


def test_with_upstream(kvm_reason, tmp_path):
    skip_without_kvm(kvm_reason)
    if not UPSTREAM:
        host_skip(missing_tool("dirty_log_perf_test"), "upstream's binary: set "
                  "UFFDKVM_DIRTY_LOG_PERF_TEST to its path, or put it on PATH")
    record, out = tiny(tmp_path, "--upstream", UPSTREAM)
    rows = ["upstream bitmap_manual", "upstream bitmap"] + [f"uffdkvm {t}" for t in TRACKERS]
    check_figures(record, rows)
    # upstream's default clears, -g does not
    assert all(x > 0 for x in record["runs"]["upstream bitmap_manual w100"][0]["reprotect"])
    assert record["runs"]["upstream bitmap w100"][0]["reprotect"] == [0.0, 0.0]
    assert set(record["ratios"]) == {"bitmap_manual", "bitmap"}
    assert "| upstream / uffdkvm (a) | upstream / uffdkvm (b) |" in out
    assert "| upstream | bitmap_manual |" in out and "| upstream | bitmap |" in out


def test_flags_the_script_sets_are_refused(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPT), "--trials", "1", "--flags", "-b 1M -w 50"],
                       capture_output=True, text=True, timeout=60, env=child_env())
    assert p.returncode != 0 and "-w is not one of upstream's flags" in p.stderr
