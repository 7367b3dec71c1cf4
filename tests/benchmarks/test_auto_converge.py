"""benchmarks/auto_converge.py at its smallest (one trial each way of a
1 MiB guest that can never meet a 0 ms target): it runs, every migration
verifies, and without the throttle the rounds run to --max-rounds.

    python benchmarks/auto_converge.py --trials 5 --json out.json
"""
import json
import pathlib
import subprocess
import sys

import pytest
from helpers.skips import skip_without_kvm

from uffdkvm._spawn import child_env

pytestmark = pytest.mark.kvm

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "auto_converge.py"


def test_a_tiny_run_compares_the_throttle_off_and_on(kvm_reason, tmp_path):
    skip_without_kvm(kvm_reason)
    out = tmp_path / "auto.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--trials", "1", "--vcpus", "1",
                        "--mem", "1M", "--bandwidth", "20", "--downtime-target-ms", "0",
                        "--max-rounds", "3", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=child_env())
    assert p.returncode == 0, p.stderr
    rows = {r["auto_converge"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {False, True} and all(r["verified"] for r in rows.values())
    assert rows[False]["round_count"] == 3 and not rows[False]["converged"]
    assert "| False | 0/1 | 3 [" in p.stdout and "| True |" in p.stdout, p.stdout
    assert "| paired |" in p.stdout
