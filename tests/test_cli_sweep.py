"""uffdkvm sweep: flags that take lists, the comparison table, --out, exit codes."""
import json
import re
import subprocess
import sys

import pytest

from uffdkvm import cli

pytest.importorskip("pandas")
pytestmark = pytest.mark.kvm

NUMBER = r"[\d.]+[kMG]?"
SMALL = ["-b", "1M", "--no-progress"]


def sweep(capsys, *args):
    code = cli.main(["sweep", *SMALL, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_one_row_per_reader_count_one_column_per_wait_mode(kvm, capsys):
    code, out, err = sweep(capsys, "-a", "-r", "1,2,4", "--wait", "poll,epoll_exclusive",
                           "--trials", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[:2] == ["| readers | poll | epoll_exclusive |", "|---|---|---|"]
    cell = rf"{NUMBER} \({NUMBER}-{NUMBER}\)"  # median (min-max)
    for line, readers in zip(lines[2:5], (1, 2, 4)):
        assert re.fullmatch(rf"\| {readers} \| {cell} \| {cell} \|", line), line
    assert lines[5] == ""
    assert lines[6] == "median pages_per_s of 2 trial(s) (min-max); 12 runs"


def test_out_is_resumed_and_reprints_the_same_table(kvm, capsys, tmp_path):
    out = tmp_path / "runs.jsonl"
    args = ["-r", "1,2", "--wait", "poll,read", "--out", str(out)]
    code, first, _ = sweep(capsys, *args)
    assert code == 0
    assert len(out.read_text().splitlines()) == 4
    code, again, _ = sweep(capsys, *args)
    assert code == 0 and again == first  # nothing ran: the same numbers, from the file
    assert len(out.read_text().splitlines()) == 4
    assert f"every run is in {out}" in first


def test_any_config_field_sweeps_with_set(kvm, capsys):
    code, out, _ = sweep(capsys, "-r", "1,2", "--set", "single_uffd=false,true",
                         "--set", "guest_work=0", "--metric", "context_switches_per_fault")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "| single_uffd | readers=1 | readers=2 |"
    assert [line.split(" | ")[0] for line in lines[2:4]] == ["| False", "| True"]
    assert "median context_switches_per_fault" in out


def test_json_prints_every_run(kvm, capsys):
    code, out, _ = sweep(capsys, "-v", "1,2", "--json")
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["vcpus"], r["trial"], r["faults"], r["error"]) for r in rows] == \
        [(1, 0, 256, None), (2, 0, 512, None)]


def test_failed_runs_are_reported_and_exit_4(kvm, capsys):
    code, out, err = sweep(capsys, "-b", "1M,1T")
    assert code == cli.EXIT_RUN
    lines = out.splitlines()
    assert lines[:2] == ["| mem_per_vcpu | pages_per_s |", "|---|---|"]
    assert re.fullmatch(rf"\| 1M \| {NUMBER} \|", lines[2]), lines[2]
    assert lines[3] == "| 1T | 1 failed |"
    assert "2 runs, 1 failed" in out
    assert "1 run(s) failed: ConfigError: mem_per_vcpu" in err


@pytest.mark.parametrize("args,message", [
    (["-r", "1,0"], "readers: must be between 1 and 4096"),
    (["-b", "1M,12Q"], "mem_per_vcpu"),
    (["--trials", "0"], "--trials"),
])
def test_bad_values_exit_2_before_anything_runs(capsys, tmp_path, args, message):
    out = tmp_path / "runs.jsonl"
    code, _, err = sweep(capsys, *args, "--out", str(out))
    assert code == cli.EXIT_CONFIG and message in err
    assert not out.exists()


@pytest.mark.parametrize("args", [["--wait", "poll,select"], ["-r", "1,x"],
                                  ["--set", "reader=1,2"], ["--set", "readers"]])
def test_malformed_lists_are_argparse_errors(capsys, args):
    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", *args])
    assert e.value.code == 2
    assert "usage: uffdkvm sweep" in capsys.readouterr().err


def test_the_command_dispatches_sweep_and_keeps_flat_usage(kvm):
    def uffdkvm(*args):
        return subprocess.run([sys.executable, "-m", "uffdkvm", *args], capture_output=True,
                              text=True, timeout=120, cwd="/")
    p = uffdkvm("sweep", "-b", "1M", "-r", "1,2")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("| readers | pages_per_s |\n|---|---|\n| 1 | ")
    assert "2/2" in p.stderr  # the progress bar
    p = uffdkvm("-b", "1M", "-r", "2")
    assert p.returncode == 0 and p.stdout.startswith("Total guest execution time:")
