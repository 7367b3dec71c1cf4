"""The command line's exit status, each code from a real subprocess:

    0 passed, 1 failed or unverified, 2 usage, 3 internal error, 4 the host
    cannot run it (kselftest's skip), 130 Ctrl-C, 141 stdout's reader left.

Where nothing real can produce the condition (a bug in uffdkvm, a corrupted
page), the child replaces the run command's run (uffdkvm.cli.run.run) with
run_with_fault from uffdkvm.testing._faults, the core's own fault injection, or
with a function that raises; everything else about the command is the real
one.
"""
import os
import signal
import subprocess
import time

import pandas
import pytest

import uffdkvm
from helpers.broken_host import Stage, skip_unless_namespaces
from helpers.children import ENV as CHILD_ENV
from helpers.children import python, uffdkvm_command
from helpers.skips import needs_test_hooks
from uffdkvm import cli

pytestmark = pytest.mark.kvm


def command(*args, **popen):
    return uffdkvm_command(*args)


def uffdkvm_cli(*args, env=CHILD_ENV, **kwargs):
    return subprocess.run(command(*args), capture_output=True, text=True, timeout=120,
                          env=env, **kwargs)


# The command, with run() replaced (see the module docstring).
CHILD = """
import sys
import uffdkvm.cli as cli
import uffdkvm.cli.run as cli_run
{replacement}
cli_run.run = run
sys.exit(cli.main(sys.argv[1:]))
"""
CORRUPT_PAGE = """
from uffdkvm.testing._faults import run_with_fault
def run(config, progress=None):
    return run_with_fault(config, "corrupt_page", after=3)
"""
BUG = """
def run(config, progress=None):
    return {}["no such key"]
"""


def child(replacement, *args, env=CHILD_ENV):
    return subprocess.run(python(*args, code=CHILD.format(replacement=replacement)),
                          capture_output=True, text=True, timeout=120, env=env)


def test_0_when_memory_verifies(kvm):
    p = uffdkvm_cli("-b", "1M")
    assert p.returncode == cli.EXIT_OK == 0, p.stderr
    assert "Memory verified" in p.stdout


def test_1_when_memory_does_not_verify(kvm):
    needs_test_hooks("the child corrupts a page with uffdkvm.testing._faults")
    p = child(CORRUPT_PAGE, "-b", "1M")
    assert p.returncode == cli.EXIT_FAILED == 1, p.stderr
    assert "MEMORY VERIFICATION FAILED:\t1 bad pages" in p.stdout


def test_1_when_the_run_fails(kvm):
    # 16384 faults, each resolved after 1 ms: the 0.5 s limit ends the run.
    p = uffdkvm_cli("-b", "64M", "-d", "1000", "--timeout", "0.5")
    assert p.returncode == cli.EXIT_FAILED == 1, p.stderr
    assert p.stderr.startswith("uffdkvm: the run failed: RunTimeoutError: ")
    assert p.stdout == ""


@pytest.mark.parametrize("args,message", [
    (["-r", "x"], "argument -r: invalid int value: 'x'"),        # argparse's
    (["-v", "0"], "uffdkvm: vcpus"),                              # ConfigError
    (["-v", "2", "-c", "0,1,0,1"], "-c: 4 CPUs for 2 vCPU(s)"),  # after argparse
    # a run flag before a subcommand would be parsed into the run's namespace and lost
    (["-v", "2", "sweep", "--trials", "2"], "-v before 'sweep' would be ignored"),
    (["-b", "8M", "--wait", "poll", "dirty-log"], "-b, --wait before 'dirty-log'"),
])
def test_2_for_usage_errors(args, message):
    p = uffdkvm_cli(*args)
    assert p.returncode == cli.EXIT_USAGE == 2
    assert message in p.stderr
    assert "Traceback" not in p.stderr


def test_3_for_a_bug_with_one_line_and_the_traceback_on_request(kvm):
    p = child(BUG, "-b", "1M")
    assert p.returncode == cli.EXIT_INTERNAL == 3
    assert p.stderr == (
        "uffdkvm: internal error: KeyError: 'no such key'. This is a bug in uffdkvm "
        f"{uffdkvm.__version__}: please report it with the command line and the traceback "
        "(--debug or UFFDKVM_DEBUG=1 prints it)\n")
    for extra, env in (["--debug"], CHILD_ENV), ([], {**CHILD_ENV, "UFFDKVM_DEBUG": "1"}):
        p = child(BUG, "-b", "1M", *extra, env=env)
        assert p.returncode == 3
        assert p.stderr.startswith("Traceback (most recent call last):")
        assert ', in run\n' in p.stderr and "\nKeyError: 'no such key'\n" in p.stderr
        assert p.stderr.splitlines()[-1].startswith("uffdkvm: internal error: KeyError")


@pytest.fixture(scope="module")
def stage():
    skip_unless_namespaces()
    s = Stage()
    yield s
    s.remove()


def no_kvm(stage, *args):
    """The command on a host without /dev/kvm (a private /dev, tests/helpers/broken_host.py),
    with pandas importable beside the staged package."""
    site = os.path.dirname(os.path.dirname(pandas.__file__))
    env = stage.env(PYTHONPATH=os.pathsep.join([str(stage.pythonpath), site]))
    return stage.run([], stage.python("-m", "uffdkvm", *args), env=env)


def test_4_when_the_host_has_no_kvm(kvm, stage):
    p = no_kvm(stage, "-b", "1M")
    assert p.returncode == cli.EXIT_SKIP == 4, p.stderr
    assert p.stderr.startswith("uffdkvm: this host cannot run the experiment: open(/dev/kvm): "
                               "No such file or directory")
    assert p.stdout == ""


def test_4_for_a_sweep_that_no_point_can_run_before_running_any(kvm, stage, tmp_path):
    out = tmp_path / "runs.jsonl"
    p = no_kvm(stage, "sweep", "-b", "1M", "-r", "1,2,4", "--trials", "3", "--out", str(out))
    assert p.returncode == cli.EXIT_SKIP == 4, p.stderr
    assert p.stdout == ""  # no table of failed cells
    assert p.stderr.splitlines() == [
        "uffdkvm sweep: this host cannot run the experiment: none of the 3 points can run "
        "here; the first: " + p.stderr.split("the first: ", 1)[1].strip()]
    assert "open(/dev/kvm): No such file or directory" in p.stderr
    assert not out.exists()  # nothing ran, so nothing was written


def ctrl_c(args):
    """The command, SIGINT once its run is under way (its vCPU and reader
    threads exist: past the imports, which take seconds in an emulated
    guest): its exit status, output and the seconds it took to stop."""
    proc = subprocess.Popen(command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=CHILD_ENV)
    deadline = time.monotonic() + 120
    while len(os.listdir(f"/proc/{proc.pid}/task")) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, "the run never started"
        time.sleep(0.05)
    time.sleep(0.5)                       # into the run
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    return proc.returncode, out, err, time.monotonic() - t0


def test_130_on_ctrl_c(kvm):
    # 16384 faults, each resolved after 1 ms: a run of 16 s or more, asleep.
    code, out, err, seconds = ctrl_c(["-b", "64M", "-d", "1000"])
    assert code == cli.EXIT_INTERRUPTED == 130, err
    assert err == "uffdkvm: interrupted\n"
    assert out == ""
    assert seconds < 10  # stopped, not run to its end


def test_130_on_ctrl_c_in_a_sweep_with_the_finished_runs_kept(kvm, tmp_path):
    out_file = tmp_path / "runs.jsonl"
    code, out, err, seconds = ctrl_c(["sweep", "-b", "64M", "-d", "1000", "-r", "1,2",
                                      "--out", str(out_file)])
    assert code == cli.EXIT_INTERRUPTED == 130, err
    assert err == f"uffdkvm sweep: interrupted; finished runs are in {out_file}\n"
    assert out == ""
    assert seconds < 10


def without_reader(*args):
    """The command with a stdout nobody reads, as in `uffdkvm ... | head -1`
    once head has gone: every write fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(command(*args), stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=120, env=CHILD_ENV)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("args", [["-b", "1M"], ["-b", "1M", "--json"],
                                  ["sweep", "-b", "1M", "-r", "1,2"]])
def test_141_and_silence_when_stdout_has_no_reader(kvm, args):
    p = without_reader(*args)
    assert p.returncode == cli.EXIT_BROKEN_PIPE == 141
    assert p.stderr == ""


def test_help_into_a_closed_pipe_is_silent():
    # argparse ignores the failed write itself and exits 0; nothing may follow it.
    p = without_reader("--help")
    assert p.returncode in (0, cli.EXIT_BROKEN_PIPE)
    assert p.stderr == ""


def test_the_codes_are_in_the_help():
    for args in ([], ["sweep"]):
        p = uffdkvm_cli(*args, "--help")
        assert p.returncode == 0
        text = " ".join(p.stdout.split())
        for code in ("0 passed", "1 ", "2 bad arguments", "3 internal error", "4 ",
                     "130 interrupted", "141 stdout closed early"):
            assert code in text, (args, code)
        assert "kselftest's skip" in text
