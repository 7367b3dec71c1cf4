"""uffdkvm sweep: flags that take lists, the comparison table, --out, exit codes."""
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from helpers.children import ENV as CHILD_ENV
from helpers.children import uffdkvm_command
from helpers.hostfacts import cpus_unavailable, host_skip
from uffdkvm import cli, read_results, spread_of
from uffdkvm.cli import sweep as cli_sweep

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
    cell = rf"{NUMBER} \[{NUMBER}, {NUMBER}\]"  # median [95% interval]
    for line, readers in zip(lines[2:5], (1, 2, 4)):
        assert re.fullmatch(rf"\| {readers} \| {cell} \| {cell} \|", line), line
    assert lines[5] == ""
    assert lines[6] == ("median pages_per_s of 2 trials [bootstrap 95% confidence interval "
                        "of the median]; 12 runs")
    assert lines[7] == ("with 2 trials the interval is the trials' min-max: it holds the true "
                        "median 50% of the time (6 or more trials for 95%)")
    assert re.fullmatch(r"cv \(stdev/mean of the trials, lowest-highest cell per column\): "
                        r"poll [\d.]+%(-[\d.]+%)?, epoll_exclusive [\d.]+%(-[\d.]+%)?",
                        lines[8]), lines[8]


def test_every_wait_mode_and_resolver_sweep_side_by_side(kvm, capsys, tmp_path):
    """The CLI compares all the fault paths in one sweep: every wait mode this
    host runs (spinners allowed to share CPUs; the vCPUs pinned, which
    spin_idle needs), then both resolvers; each column is its own mode's runs
    (read back from --out)."""
    from uffdkvm import fault_path_support
    waits = [w for w, why in fault_path_support()["wait"].items() if why is None]
    out_file = tmp_path / "modes.jsonl"
    pins = ",".join(map(str, sorted(os.sched_getaffinity(0))[:2]))
    code, out, err = sweep(capsys, "-v", "2", "--wait", ",".join(waits), "--allow-oversubscribe",
                           "--pin-vcpus", pins, "--trials", "1", "--out", str(out_file))
    assert code == 0, err
    assert out.splitlines()[0] == "| " + " | ".join(waits) + " |"
    runs = {r.config.wait: r for r in read_results(out_file)}
    assert sorted(runs) == sorted(waits)
    assert all(r.reader_wait == w for w, r in runs.items())
    # Each column ran its own mode in the core: io_uring read through its rings,
    # no other mode did.
    rings = {w: sum(x.ring_completions for x in r.readers) for w, r in runs.items()}
    assert all((n > 0) == (w == "io_uring") for w, n in rings.items()), rings
    out_file = tmp_path / "resolvers.jsonl"
    code, out, err = sweep(capsys, "-v", "2", "--resolver", "readers,vcpu", "--trials", "1",
                           "--out", str(out_file))
    assert code == 0, err
    exits = {r.config.resolver: sum(v.fault_exits for v in r.vcpus)
             for r in read_results(out_file)}
    assert exits == {"readers": 0, "vcpu": 512}  # 2 vCPUs x 1 MiB, each fault its vCPU's


def _runs(path):
    """pages/s of each run in an --out file, by (readers, the wait it ran)."""
    rates = {}
    for r in read_results(path):
        rates.setdefault((r.config.readers, r.reader_wait), []).append(r.paging_rate)
    return rates


def _si(x):
    return f"{x / 1e3:.3g}k" if x >= 1e3 else f"{x:.3g}"


def _percent(x):
    return f"{100 * x:.2g}%" if x < 0.1 else f"{100 * x:.0f}%"


def test_cells_are_the_median_and_bootstrap_interval_of_the_trials(kvm, capsys, tmp_path):
    # Six trials: the interval moves inside the min-max, so a table that
    # showed the extremes (or the quartiles) would not match.
    out = tmp_path / "runs.jsonl"
    code, text, err = sweep(capsys, "-r", "1,2", "--wait", "poll,read", "--trials", "6",
                            "--out", str(out))
    assert code == 0, err
    rates = _runs(out)
    lines = text.splitlines()
    for row, readers in zip(lines[2:4], (1, 2)):
        cells = []
        for wait in ("poll", "read"):
            s = spread_of(rates[readers, wait])
            assert s.n == 6
            assert s.min <= s.ci_low <= s.median <= s.ci_high <= s.max
            cells.append(f"{_si(s.median)} [{_si(s.ci_low)}, {_si(s.ci_high)}]")
        assert row == f"| {readers} | {cells[0]} | {cells[1]} |"
    assert "with 6 trials" not in text  # from 6 trials on the interval means 95%
    # The cv line: per column (wait mode), its lowest and highest cell.
    expected = []
    for wait in ("poll", "read"):
        low, high = map(_percent, sorted(spread_of(rates[n, wait]).cv for n in (1, 2)))
        expected.append(f"{wait} {low}" if low == high else f"{wait} {low}-{high}")
    assert lines[-1] == ("cv (stdev/mean of the trials, lowest-highest cell per column): "
                         + ", ".join(expected))


@pytest.mark.parametrize("spread,low,high,footer", [
    ("minmax", "min", "max", "(min-max)"),
    ("iqr", "q1", "q3", "(interquartile range: 25th-75th percentile)"),
])
def test_spread_shows_the_extremes_or_the_quartiles(kvm, capsys, tmp_path, spread, low, high,
                                                    footer):
    out = tmp_path / "runs.jsonl"
    code, text, err = sweep(capsys, "-r", "1", "--trials", "4", "--out", str(out),
                            "--spread", spread)
    assert code == 0, err
    s = spread_of(_runs(out)[1, "epoll_exclusive"])
    assert text.splitlines()[2] == \
        f"| {_si(s.median)} ({_si(getattr(s, low))}-{_si(getattr(s, high))}) |"
    assert f"median pages_per_s of 4 trials {footer}; 4 runs" in text
    assert "interval" not in text.replace("interquartile", "")  # no CI caveat


def test_one_trial_shows_the_median_alone(kvm, capsys):
    code, out, _ = sweep(capsys, "-r", "1,2")
    assert code == 0
    lines = out.splitlines()
    assert re.fullmatch(rf"\| 1 \| {NUMBER} \|", lines[2]), lines[2]
    assert lines[5:] == ["median pages_per_s of 1 trial; 2 runs"]


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


def test_a_run_without_the_metric_is_not_a_failure(kvm, capsys):
    # access_latency_* is empty without guest_timing: no value, no failure.
    code, out, _ = sweep(capsys, "-r", "1,2", "--trials", "2", "--metric",
                         "access_latency_p50_ns")
    assert code == 0
    assert out.splitlines()[2:4] == ["| 1 | - |", "| 2 | - |"]
    assert "failed" not in out


@pytest.mark.parametrize("metric,message", [
    ("wait", "--metric: column 'wait' is not numeric; the numeric columns are "),
    ("pages_per_second", "--metric: no column 'pages_per_second'; the numeric columns are "),
])
def test_a_bad_metric_exits_2_before_the_first_run(kvm, capsys, tmp_path, metric, message):
    out = tmp_path / "runs.jsonl"
    code, text, err = sweep(capsys, "-r", "1,2", "--trials", "3", "--metric", metric,
                            "--out", str(out))
    assert code == cli.EXIT_USAGE
    assert err.startswith("uffdkvm sweep: " + message)
    assert "pages_per_s, " in err and "context_switches_per_fault" in err
    assert text == ""
    assert not out.exists()  # the sweep never started: --out is made by its first run


def test_json_prints_every_run(kvm, capsys):
    code, out, _ = sweep(capsys, "-v", "1,2", "--json")
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["vcpus"], r["trial"], r["faults"], r["error"]) for r in rows] == \
        [(1, 0, 256, None), (2, 0, 512, None)]


def test_json_is_strict_and_keeps_an_infinite_timeout(kvm, capsys):
    code, out, _ = sweep(capsys, "--timeout", "inf", "--json")
    assert code == 0

    def refuse(constant):
        raise AssertionError(f"not strict JSON: {constant}")

    rows = [json.loads(line, parse_constant=refuse) for line in out.splitlines()]
    assert [r["timeout_s"] for r in rows] == ["inf"]


def test_failed_runs_are_reported_and_exit_1(kvm, capsys):
    code, out, err = sweep(capsys, "-b", "1M,1T")
    assert code == cli.EXIT_FAILED
    lines = out.splitlines()
    assert lines[:2] == ["| mem_per_vcpu | pages_per_s |", "|---|---|"]
    assert re.fullmatch(rf"\| 1M \| {NUMBER} \|", lines[2]), lines[2]
    assert lines[3] == "| 1T | 1 failed |"
    assert "2 runs, 1 failed" in out
    assert "1 run(s) failed: HostUnsupportedError: mem_per_vcpu" in err


@pytest.mark.parametrize("args,message", [
    (["-r", "1,0"], "readers: must be between 1 and 4096"),
    (["-b", "1M,12Q"], "mem_per_vcpu"),
    (["--trials", "0"], "--trials"),
    (["-v", "1,2", "-c", "0,1"], "-c: one CPU per vCPU needs one -v, not 1,2"),
    (["-v", "2", "-c", "0"], "-c: 1 CPUs for 2 vCPU(s)"),
    (["-r", "1", "--set", "vcpus=1,2", "-c", "0"], "-c: one CPU per vCPU needs one -v"),
])
def test_bad_values_exit_2_before_anything_runs(capsys, tmp_path, args, message):
    out = tmp_path / "runs.jsonl"
    code, _, err = sweep(capsys, *args, "--out", str(out))
    assert code == cli.EXIT_USAGE and message in err
    assert not out.exists()


@pytest.mark.parametrize("args", [["--wait", "poll,select"], ["-r", "1,x"],
                                  ["--set", "reader=1,2"], ["--set", "readers"]])
def test_malformed_lists_are_argparse_errors(capsys, args):
    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", *args])
    assert e.value.code == 2
    assert "usage: uffdkvm sweep" in capsys.readouterr().err


def test_the_command_dispatches_sweep_and_keeps_flat_usage(kvm):
    # From /, with the uffdkvm under test first on the path (not the installed one).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(cli.__file__).resolve().parents[2]),
         *filter(None, [os.environ.get("PYTHONPATH")])]))

    def uffdkvm(*args):
        return subprocess.run(uffdkvm_command(*args), capture_output=True,
                              text=True, timeout=120, env=env)
    p = uffdkvm("sweep", "-b", "1M", "-r", "1,2")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("| readers | pages_per_s |\n|---|---|\n| 1 | ")
    assert "\nmedian pages_per_s of 1 trial; 2 runs\n" in p.stdout  # this uffdkvm's footer
    assert p.stderr == ""  # no bar: stderr is not a terminal (tests/cli/test_progress.py)
    p = uffdkvm("-b", "1M", "-r", "2")
    assert p.returncode == 0 and p.stdout.startswith("Total guest execution time:")


def test_out_that_cannot_be_written_exits_2_before_the_first_run(kvm, capsys, tmp_path):
    code, _, err = sweep(capsys, "-r", "1,2", "--out", str(tmp_path / "no" / "runs.jsonl"))
    assert code == cli.EXIT_USAGE
    assert err.startswith("uffdkvm sweep: --out: cannot create ")
    code, _, err = sweep(capsys, "-r", "1,2", "--out", str(tmp_path))
    assert code == cli.EXIT_USAGE and "a directory" in err


def test_upstream_names_in_a_list(capsys):
    args = cli_sweep.build_parser().parse_args(["-s", "anonymous_hugetlb_2mb,shmem,anonymous",
                                                "-m", "9", "-u", "MISSING,NONE"])
    assert args.backing == ["anonymous_hugetlb", "shmem", "anonymous"]
    assert args.uffd_mode == ["missing", None]
    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", "-s", "anonymous,anonymous_hugetlb_64kb"])
    assert e.value.code == 2
    assert "upstream's backing with 64 KiB huge pages" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["sweep", "-m", "0"])
    assert "uffdkvm runs x86-64 guests in mode 9 only" in capsys.readouterr().err


def test_c_in_a_sweep_pins_the_main_thread_with_the_extra_cpu(kvm, tmp_path):
    if cpus_unavailable(0, 1).holds:
        host_skip(cpus_unavailable(0, 1), "needs CPUs 0 and 1")
    out = tmp_path / "runs.jsonl"
    p = subprocess.run(uffdkvm_command("sweep", "-b", "1M", "-v", "1",
                                       "-r", "1,2", "-c", "0,1", "--out", str(out)),
                       capture_output=True,
                       text=True, timeout=120, env=CHILD_ENV)
    assert p.returncode == 0, p.stderr
    runs = read_results(out)
    assert sorted(r.config.readers for r in runs) == [1, 2]
    for r in runs:
        assert list(r.config.pin_vcpus) == [0]
        assert [list(v.cpus) for v in r.vcpus] == [[0]]
        # Readers start from the main thread, pinned to the last entry of -c.
        assert all(list(x.cpus) == [1] for x in r.readers), r.readers
        # The host as the command found it, before it pinned itself.
        assert r.host.usable_cpus == len(os.sched_getaffinity(0))


def sample(doc):
    """The command (the first indented line starting `uffdkvm `) and the
    indented block of output after it, from a docstring."""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    uffdkvm "))
    block = []
    for line in lines[start + 2:]:
        if line and not line.startswith("    "):
            break
        block.append(line[4:])
    return lines[start].split()[1:], "\n".join(block).strip("\n")


def shape(text):
    """Text with every number (and a number's k/M/G) turned into N, and a
    range N-N as N (the cv line shows one value when lowest and highest agree)."""
    return re.sub(rf"{NUMBER}%?", "N", text).replace("N-N", "N")


def test_the_docstrings_sample_is_what_the_command_prints(kvm, capsys):
    args, shown = sample(cli_sweep.__doc__)
    assert args[0] == "sweep"
    code = cli.main([*args, "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert shape(out.strip("\n")) == shape(shown)
    # The headers and each row's key, word for word.
    def keys(text):
        return [line.split(" | ")[0] for line in text.splitlines() if line.startswith("|")]
    assert keys(out) == keys(shown)
