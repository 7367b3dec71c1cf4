"""CI cannot be green by skipping: .ci/run stops before the tests, saying why
and what to do, on a host where KVM or userfaultfd is unusable, unless
UFFDKVM_ALLOW_NO_KVM=1 says to go on (and then it says so, loudly).

The hosts are built for real (tests/helpers/broken_host.py): a private mount
namespace without /dev/kvm, an unprivileged user without access to it, a
root without the capability userfaultfd() needs. The preflight and .ci/run
run there on a copy of the uffdkvm this session imported.
"""
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.broken_host import (KVM, KVM_ROOT_ONLY, NOBODY, USERFAULTFD_OWNED, Stage,
                                 skip_unless_namespaces)
from helpers.hostfacts import UNPRIVILEGED_USERFAULTFD, host_skip

pytestmark = pytest.mark.kvm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "matrix"))
from parts import KERNELS  # noqa: E402 - the matrix's Debian kernels, .ci/run's targets

PREFLIGHT = ROOT / ".ci" / "preflight"
CI_RUN = ROOT / ".ci" / "run"

# (devices in /dev, capabilities dropped, user, what the HostUnsupportedError says)
BROKEN = {
    "no-dev-kvm": ([], (), None, "open(/dev/kvm): No such file or directory"),
    "user-without-dev-kvm": ([KVM_ROOT_ONLY, USERFAULTFD_OWNED], (), NOBODY,
                             "read/write access to /dev/kvm"),
    "no-userfaultfd": ([KVM], ("sys_ptrace",), None, "userfaultfd(): Operation not permitted"),
}


@pytest.fixture(scope="module")
def stage():
    skip_unless_namespaces()
    s = Stage(extra_files=[PREFLIGHT])
    yield s
    s.remove()


def preflight_in(stage, case, **env):
    devices, drop_caps, user, _ = BROKEN[case]
    if case == "no-userfaultfd" and UNPRIVILEGED_USERFAULTFD.holds:
        host_skip(UNPRIVILEGED_USERFAULTFD, "userfaultfd() is open to everyone here")
    return stage.run(devices, stage.python(str(stage.files["preflight"])),
                     drop_caps=drop_caps, user=user, env=stage.env(**env))


def test_preflight_passes_where_experiments_run(kvm, stage):
    p = subprocess.run(stage.python(str(PREFLIGHT)), capture_output=True, text=True,
                       timeout=60, cwd="/", env=stage.env())
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("preflight: ok, a 64 KiB experiment ran and verified")
    assert str(stage.pythonpath) in p.stdout  # the uffdkvm under test, not another


@pytest.mark.parametrize("case", BROKEN)
def test_preflight_stops_ci_where_experiments_cannot_run(kvm, stage, case):
    p = preflight_in(stage, case)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert p.stdout == ""
    assert p.stderr.startswith("preflight: this host cannot run uffdkvm experiments:\n"), p.stderr
    assert BROKEN[case][3] in p.stderr  # the HostUnsupportedError's own message
    assert "would be skipped here,\nso CI stops now" in p.stderr  # why
    assert "set UFFDKVM_ALLOW_NO_KVM=1" in p.stderr  # and what to do
    assert "/dev/userfaultfd" in p.stderr


@pytest.mark.parametrize("case", BROKEN)
def test_allow_no_kvm_goes_on_and_says_so(kvm, stage, case):
    p = preflight_in(stage, case, UFFDKVM_ALLOW_NO_KVM="1")
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "UFFDKVM_ALLOW_NO_KVM is set: going on, and the KVM tests WILL BE SKIPPED" in p.stderr
    assert BROKEN[case][3] in p.stderr


@pytest.mark.parametrize("allow", ["", "0"])
def test_only_a_set_variable_allows(kvm, stage, allow):
    assert preflight_in(stage, "no-dev-kvm", UFFDKVM_ALLOW_NO_KVM=allow).returncode == 1


def ci_run_in(stage, case, **env):
    """.ci/run --version in a broken host, on the staged uffdkvm (nothing
    installed): pytest --version prints pytest's version, so it shows
    whether .ci/run got as far as starting pytest."""
    devices, drop_caps, user, _ = BROKEN[case]
    env = stage.env(UFFDKVM_CI_NO_INSTALL="1", PYTHON=stage.python()[0], **env)
    return stage.run(devices, ["sh", str(CI_RUN), "--version"], drop_caps=drop_caps,
                     user=user, env=env, timeout=120)


def test_ci_run_stops_before_pytest_without_kvm(kvm, stage):
    p = ci_run_in(stage, "no-dev-kvm")
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "open(/dev/kvm): No such file or directory" in p.stderr
    assert "pytest" not in p.stdout.lower()


def test_ci_run_with_allow_no_kvm_starts_pytest(kvm, stage):
    p = ci_run_in(stage, "no-dev-kvm", UFFDKVM_ALLOW_NO_KVM="1")
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "the KVM tests WILL BE SKIPPED" in p.stderr
    assert f"pytest {pytest.__version__}" in p.stdout + p.stderr


README = ROOT / "README.md"


def readme_test_command():
    """The command under README.md's "Run the test suite", the one line of
    the sh block that follows it."""
    text = README.read_text()
    at = text.index("\nRun the test suite")
    block = re.search(r"```sh\n(.*?)\n```", text[at:], re.S)
    assert block, "no sh block after 'Run the test suite' in README.md"
    lines = block.group(1).splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_ci_run_holds_the_readme_test_command_as_written():
    """Character for character: a change to either side alone fails here."""
    command = readme_test_command()
    held = re.findall(r"^README_TEST_COMMAND=(.*)$", CI_RUN.read_text(), re.M)
    assert len(held) == 1, held
    assert shlex.split(held[0]) == [command], (held[0], command)
    # and runs that text (with its own arguments for pytest), not a copy
    runs = re.findall(r"^eval .*$", CI_RUN.read_text(), re.M)
    assert runs == ["""eval "$README_TEST_COMMAND"' "$@"'"""], runs


STUB = """#!{python}
import json, os, sys
with open({log!r}, "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0]), os.getcwd(),
                        os.environ.get("UFFDKVM_TEST_HOOKS"), sys.argv[1:]]) + "\\n")
"""

FAKE_PYTHON = """#!{python}
# `python -m venv DIR` makes a venv whose pip, pytest and python only record
# how they were called.
import os, sys
assert sys.argv[1:3] == ["-m", "venv"], sys.argv
bin = os.path.join(sys.argv[3], "bin")
os.makedirs(bin)
with open(os.path.join(bin, "activate"), "w") as f:
    f.write(f'PATH="{{bin}}:$PATH"; export PATH\\n')
for name in ("pip", "pytest", "python"):
    path = os.path.join(bin, name)
    with open(path, "w") as f:
        f.write({stub!r})
    os.chmod(path, 0o755)
"""


def expected_calls(command, extra_args):
    """What running `command` (`VAR=value program args && ...`) then
    `extra_args` to its last program records: per program, its name, the
    root as its directory, UFFDKVM_TEST_HOOKS as it sees it, and its
    arguments."""
    calls = []
    steps = [shlex.split(step) for step in command.split("&&")]
    for i, words in enumerate(steps):
        env = {}
        while "=" in words[0]:
            k, v = words.pop(0).split("=", 1)
            env[k] = v
        args = words[1:] + (extra_args if i == len(steps) - 1 else [])
        calls.append([words[0], str(ROOT), env.get("UFFDKVM_TEST_HOOKS"), args])
    return calls


def test_ci_run_runs_the_readme_test_command_from_the_root_in_a_new_venv(tmp_path):
    """.ci/run makes a venv with $PYTHON, outside the tree, and runs README.md's
    command in it from the root (started from elsewhere), the preflight just
    before pytest, and its own arguments after pytest's. The venv's programs
    record how they were called; what they must record is read from the
    README, so a change to the README alone fails here too."""
    log = tmp_path / "calls"
    stub = STUB.format(python=sys.executable, log=str(log))
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON.format(python=sys.executable, stub=stub))
    python.chmod(0o755)
    # An apt-get that does nothing: where a matrix tool is missing, .ci/run
    # would install it, which is not this test's to do.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "apt-get").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(python),
           "TMPDIR": str(tmp_path)}
    p = subprocess.run(["sh", str(CI_RUN), "-x", "tests/project/test_ci.py"], capture_output=True,
                       text=True, timeout=120, env=env, cwd=tmp_path)
    assert p.returncode == 0, (p.stdout, p.stderr)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    # The matrix's output goes into the venv's directory, whose name is random.
    out = calls[-1][3][-1]
    assert out.startswith(f"{tmp_path}/uffdkvm-ci-venv.") and out.endswith("/matrix"), out
    calls[-1][3][-1] = "<venv>/matrix"
    preflight = ["python", str(ROOT), None, [".ci/preflight"]]
    # After the suite, the kernel matrix's smoke part on the matrix's Debian kernels,
    # two at a time, with the venv's Python.
    targets = [w for k in KERNELS for w in ("--target", k)]
    matrix = ["python", str(ROOT), None, ["tests/matrix/matrix.py", *targets, "--part",
                                          "smoke", "--jobs", "2", "--timeout", "1800",
                                          "--out", "<venv>/matrix"]]
    want = expected_calls(readme_test_command(), ["-x", "tests/project/test_ci.py"])
    assert calls == want[:-1] + [preflight, want[-1], matrix]
    assert [c[0] for c in calls] == ["pip", "python", "pytest", "python"]
    assert not list(tmp_path.glob("uffdkvm-ci-venv.*")), "the venv is left behind"
