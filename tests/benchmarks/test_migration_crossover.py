"""benchmarks/migration_crossover.py at its smallest (one trial of 1 MiB at
two dirty rates): it runs, every migration verifies, the JSON holds every
(write_percent, mode) point, and the printed figures are the JSON's trials
by the docstring's formulas (a paired ratio of one trial is its quotient).

    python benchmarks/migration_crossover.py --trials 7 --json out.json
"""
import json
import math
import pathlib
import re
import subprocess
import sys

import pytest
from helpers.skips import skip_without_kvm

from uffdkvm._spawn import child_env

pytestmark = pytest.mark.kvm

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "migration_crossover.py"
MODES = ("precopy", "postcopy", "hybrid")
PERCENTS = (0, 100)


def test_a_tiny_sweep_gives_every_point_and_its_ratios(kvm_reason, tmp_path):
    skip_without_kvm(kvm_reason)
    out = tmp_path / "crossover.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--trials", "1", "--vcpus", "1",
                        "--mem", "1M", "--bandwidth", "100",
                        "--write-percent", ",".join(map(str, PERCENTS)), "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=child_env())
    assert p.returncode == 0, p.stderr
    points = {(e["write_percent"], e["mode"]): e for e in json.loads(out.read_text())["points"]}
    assert set(points) == {(w, m) for w in PERCENTS for m in MODES}
    assert all(e["verified"] and len(e["total_seconds"]) == 1 for e in points.values())
    # A guest that writes nothing: pre-copy ends in its first round, with no
    # stop-copy to speak of; post-copy moves no round at all.
    assert points[0, "precopy"]["round_count"] == [1]
    assert points[0, "postcopy"]["round_count"] == [0]
    assert points[100, "precopy"]["dirty_rate_mbs"][0] > 0 == points[0, "precopy"][
        "dirty_rate_mbs"][0]
    ratios = {}
    for line in p.stdout.splitlines():
        m = re.match(r"\| (\d+) \| ([0-9.e+-]+) \[", line)
        if m and line.count("|") == 5:
            ratios[int(m.group(1))] = float(m.group(2))
    assert set(ratios) == set(PERCENTS), p.stdout
    for w in PERCENTS:
        quotient = (points[w, "postcopy"]["total_seconds"][0]
                    / points[w, "precopy"]["total_seconds"][0])
        assert math.isclose(ratios[w], quotient, rel_tol=6e-3), (w, ratios[w], quotient)  # 3 digits
