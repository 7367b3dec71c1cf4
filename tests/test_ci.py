"""CI cannot be green by skipping: .ci/run stops before the tests, saying why
and what to do, on a host where KVM or userfaultfd is unusable, unless
UFFDKVM_ALLOW_NO_KVM=1 says to go on (and then it says so, loudly).

The hosts are built for real (tests/broken_host.py): a private mount
namespace without /dev/kvm, an unprivileged user without access to it, a
root without the capability userfaultfd() needs. The preflight and .ci/run
run there on a copy of the uffdkvm this session imported.
"""
import os
import subprocess
from pathlib import Path

import pytest

from broken_host import (KVM, KVM_ROOT_ONLY, NOBODY, USERFAULTFD_OWNED, Stage,
                         skip_unless_namespaces)
from conftest import UNPRIVILEGED_USERFAULTFD, host_skip

pytestmark = pytest.mark.kvm

ROOT = Path(__file__).resolve().parent.parent
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


def test_ci_run_installs_a_build_with_test_hooks(tmp_path):
    """.ci/run's pip install builds the test hooks in (UFFDKVM_TEST_HOOKS=1):
    without them the fault-injection tests would all skip. The interpreter
    it is given records how it was called, and fails, which stops .ci/run
    there (set -e)."""
    log = tmp_path / "calls"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "UFFDKVM_TEST_HOOKS=${{UFFDKVM_TEST_HOOKS-unset}} $*" '
                      f'>> {log}\nexit 3\n')
    python.chmod(0o755)
    p = subprocess.run(["sh", str(CI_RUN)], capture_output=True, text=True, timeout=120,
                       env={"PATH": os.environ["PATH"], "PYTHON": str(python)})
    assert p.returncode == 3, (p.stdout, p.stderr)
    assert log.read_text() == "UFFDKVM_TEST_HOOKS=1 -m pip install .[test]\n"
