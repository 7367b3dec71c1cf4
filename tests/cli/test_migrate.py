"""``uffdkvm migrate``: the workload's flags, the link's, the text and --json."""
from __future__ import annotations

import json

import pytest

from uffdkvm import cli
from uffdkvm.cli import migrate as cli_migrate

pytestmark = pytest.mark.kvm


def test_text_gives_the_rounds_the_switch_over_and_verified(kvm, capsys):
    status = cli.main(["migrate", "--mode", "hybrid", "-v", "2", "-b", "4M",
                       "--write-percent", "30", "--link-bandwidth-mbps", "400", "-q"])
    out = capsys.readouterr().out
    assert status == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("Migration: hybrid, 2 vCPU(s) x 4 MiB, link 400 Mbit/s")
    assert "round" in lines[1] and "dirty_pages" in lines[1]
    assert lines[2].split()[:2] == ["1", "2048"]  # round 1 sends every page
    for word in ("Converged:", "Downtime:", "Total time:", "Bytes:", "Post-copy faults:"):
        assert any(line.startswith(word) for line in lines), (word, out)
    assert lines[-1] == "Verified: yes"


def test_json_is_the_migration_and_the_flags_reach_it(kvm, capsys):
    status = cli.main(["migrate", "--mode", "precopy", "-v", "1", "-b", "4M", "--json",
                       "--write-percent", "100", "--downtime-target-ms", "0",
                       "--max-rounds", "2", "--link-latency-us", "40", "--tracking",
                       "bitmap_manual", "-q"])
    d = json.loads(capsys.readouterr().out)
    assert status == 0 and d["mode"] == "precopy" and d["converged"] is False
    src = d["source"]["config"]
    assert (src["max_rounds"], src["downtime_target_ms"], src["link_latency_us"],
            src["dirty_tracking"]) == (2, 0, 40, "bitmap_manual")
    assert len(d["source"]["migration_rounds"]) == 2
    assert d["destination"]["config"]["mem_per_vcpu"] == 4 << 20


def test_auto_converge_and_its_throttle_reach_the_source(kvm, capsys):
    status = cli.main(["migrate", "-v", "1", "-b", "4M", "--json", "--write-percent", "100",
                       "--downtime-target-ms", "0", "--max-rounds", "3", "--auto-converge",
                       "--throttle-initial", "30", "--throttle-increment", "15",
                       "--throttle-max", "40", "--link-bandwidth-mbps", "50", "-q"])
    d = json.loads(capsys.readouterr().out)
    src = d["source"]["config"]
    assert status == 0 and src["auto_converge"] is True
    assert (src["throttle_initial_percent"], src["throttle_increment_percent"],
            src["throttle_max_percent"]) == (30, 15, 40)
    # Round 1 finds every page written: round 2 runs at the initial throttle.
    rounds = d["source"]["migration_rounds"]
    assert rounds[0]["throttle_percent"] == 0 and rounds[1]["throttle_percent"] == 30
    assert d["destination"]["config"]["auto_converge"] is False  # the source's alone


def test_bad_flags_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["migrate", "--mode", "live"])
    assert info.value.code == 2 and "--mode" in capsys.readouterr().err
    assert cli.main(["migrate", "--mode", "hybrid", "--max-rounds", "3", "-b", "1M"]) == 2
    assert "max_rounds: applies to migration='precopy'" in capsys.readouterr().err


def test_help_is_reached_from_uffdkvm(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "uffdkvm migrate --help" in capsys.readouterr().out
    assert cli_migrate.PROG == "uffdkvm migrate"
