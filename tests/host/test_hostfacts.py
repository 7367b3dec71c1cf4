"""The skip audit (tests/helpers/hostfacts.py): a skip that no fact about the host
explains fails the session, an explained one does not, and the summary lists
every host skip with its fact. Each case is a real pytest session (pytester,
in this process) with the plugin loaded.

And the facts themselves: their probes, not uffdkvm, tell a broken host from
a working one, so they agree with what a run says on hosts built for real.
"""
import json
import os
from pathlib import Path

import pytest

from helpers import hostfacts
from helpers.broken_host import KVM, Stage, skip_unless_namespaces
from helpers.children import python
from helpers.hostfacts import NO_KVM, NO_USERFAULTFD

TESTS = Path(__file__).resolve().parents[1]

FACTS_CONFTEST = """
from helpers.hostfacts import fact

@fact("test-holds", "a fact that holds")
def HOLDS():
    return True, "the probe saw it"

@fact("test-does-not-hold", "a fact that does not hold")
def DOES_NOT_HOLD():
    return False, "the probe did not see it"

@fact("test-probe-raises", "a fact whose probe fails")
def PROBE_RAISES():
    raise OSError("no such thing")
"""


@pytest.fixture
def session(pytester, monkeypatch):
    """run(test_source, *args): a pytest session (in this process) with the
    plugin loaded and three facts of its own (one holds, one does not, one's
    probe raises), kept out of this session's registry."""
    monkeypatch.setattr(hostfacts, "FACTS", dict(hostfacts.FACTS))
    pytester.makeconftest(FACTS_CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    slow: a marker to deselect by\n")

    def run(source, *args):
        pytester.makepyfile(test_it=source)
        return pytester.runpytest("-p", "helpers.hostfacts", "-p", "no:cacheprovider", *args)
    return run


def test_an_explained_skip_passes_and_is_listed(session):
    r = session("""
from helpers.hostfacts import FACTS, host_skip

def test_needs_the_thing():
    host_skip(FACTS["test-holds"], "needs the thing")

def test_either_will_do():
    host_skip((FACTS["test-does-not-hold"], FACTS["test-holds"]), "needs one of them")

def test_runs():
    pass
""")
    assert r.ret == 0, r.stdout.str()
    r.assert_outcomes(passed=1, skipped=2)
    r.stdout.re_match_lines([
        r"=+ host skips: 2 \(what this host lacks\) =+",
        r"test-holds: a fact that holds",
        r"    probe: the probe saw it",
        r"  SKIP test_it.py::test_needs_the_thing",
        r"       needs the thing",
        r"  SKIP test_it.py::test_either_will_do",
        r"       needs one of them",
    ], consecutive=True)
    assert "unexplained skips" not in r.stdout.str()


@pytest.mark.parametrize("how,nodeid,reason", [
    ("def test_plain():\n    pytest.skip('flaky here')", "test_it.py::test_plain", "flaky here"),
    ("@pytest.mark.skipif(True, reason='not today')\ndef test_marked():\n    pass",
     "test_it.py::test_marked", "not today"),
    ("pytest.skip('whole module', allow_module_level=True)", "test_it.py", "whole module"),
], ids=["pytest.skip", "skipif", "module-level"])
def test_a_skip_that_cites_no_fact_fails_the_session(session, how, nodeid, reason):
    r = session(f"import pytest\n\ndef test_runs():\n    pass\n\n{how}\n")
    assert r.ret == 1, r.stdout.str()
    r.stdout.fnmatch_lines([
        "*= unexplained skips: 1 (the session fails) =*",
        f"UNEXPLAINED SKIP {nodeid}: {reason}",
        "    it cites no host fact",
    ])


def test_a_skip_citing_a_fact_that_does_not_hold_fails_the_session(session):
    r = session("""
from helpers.hostfacts import FACTS, host_skip

def test_wrong_excuse():
    host_skip(FACTS["test-does-not-hold"], "the host surely lacks it")

def test_broken_probe():
    host_skip(FACTS["test-probe-raises"], "cannot tell")

def test_runs():
    pass
""")
    assert r.ret == 1, r.stdout.str()
    r.assert_outcomes(passed=1, skipped=2)
    r.stdout.fnmatch_lines([
        "*= unexplained skips: 2 (the session fails) =*",
        "UNEXPLAINED SKIP test_it.py::test_wrong_excuse: "
        "[[]host: test-does-not-hold] the host surely lacks it",
        "    test-does-not-hold does not hold here (the probe did not see it)",
        "UNEXPLAINED SKIP test_it.py::test_broken_probe: [[]host: test-probe-raises] cannot tell",
        "    test-probe-raises does not hold here (the probe failed: OSError: no such thing)",
    ])


def test_a_failing_session_stays_failed_and_still_lists_its_skips(session):
    r = session("""
import pytest
from helpers.hostfacts import FACTS, host_skip

def test_fails():
    assert False

def test_host():
    host_skip(FACTS["test-holds"], "needs the thing")
""")
    assert r.ret == 1
    r.assert_outcomes(failed=1, skipped=1)
    r.stdout.fnmatch_lines(["*= host skips: 1 (what this host lacks) =*"])


def test_deselection_xfail_and_a_missing_module_are_not_unexplained(session):
    r = session("""
import pytest

@pytest.mark.slow
def test_slow_and_skipping():
    pytest.skip("no reason")

def test_by_name_skipping():
    pytest.skip("no reason either")

@pytest.mark.xfail(reason="known bug")
def test_known_bug():
    assert False

def test_needs_a_module():
    pytest.importorskip("uffdkvm_no_such_module")

def test_runs():
    pass
""", "-m", "not slow", "-k", "not by_name")
    assert r.ret == 0, r.stdout.str()
    r.assert_outcomes(passed=1, skipped=1, xfailed=1, deselected=2)
    r.stdout.fnmatch_lines([
        "missing-module:uffdkvm_no_such_module: "
        "the Python module uffdkvm_no_such_module is not installed",
        "  SKIP test_it.py::test_needs_a_module",
    ])
    assert "unexplained skips" not in r.stdout.str()


def test_an_import_that_fails_for_another_reason_is_unexplained(session, pytester):
    """A module that is there but broken is a bug, not a host fact."""
    pytester.makepyfile(brokenmod="raise ImportError('broken on purpose')")
    r = session("""
import pytest

def test_needs_brokenmod():
    pytest.importorskip("brokenmod", exc_type=ImportError)
""")
    assert r.ret == 1, r.stdout.str()
    r.stdout.fnmatch_lines(["UNEXPLAINED SKIP test_it.py::test_needs_brokenmod: "
                            "could not import 'brokenmod': broken on purpose",
                            "    missing-module:brokenmod does not hold here (*brokenmod.py)"])


# ---- the facts against hosts built for real ----

FACTS_PROBE = """
import json, uffdkvm
from helpers import hostfacts
try:
    uffdkvm.run(mem_per_vcpu="64K")
    run = None
except uffdkvm.HostUnsupportedError as e:
    run = str(e)
print(json.dumps({"run": run, "no-kvm": hostfacts.NO_KVM.establish(),
                  "no-userfaultfd": hostfacts.NO_USERFAULTFD.establish()}))
"""


@pytest.mark.kvm
@pytest.mark.parametrize("devices,drop_caps,lacking", [
    ([KVM], ("sys_ptrace",), "no-userfaultfd"),
    ([], (), "no-kvm"),
], ids=["no-userfaultfd", "no-dev-kvm"])
def test_kvm_facts_see_what_a_run_meets(kvm, devices, drop_caps, lacking):
    """Where a run raises HostUnsupportedError, the fact that explains it
    holds, by its own probe; on this host neither does."""
    assert not NO_KVM.holds and not NO_USERFAULTFD.holds
    skip_unless_namespaces()
    stage = Stage()
    try:
        # Site-packages too: hostfacts imports pytest. The staged uffdkvm comes first.
        env = stage.env(PYTHONPATH=os.pathsep.join([str(stage.pythonpath), str(TESTS)]))
        p = stage.run(devices, python(code=FACTS_PROBE), drop_caps=drop_caps,
                      env=env)
    finally:
        stage.remove()
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["run"], out  # the run met the broken host
    holds, evidence = out[lacking]
    assert holds, out
    if lacking == "no-userfaultfd":
        assert not out["no-kvm"][0], out  # /dev/kvm is there and works
        assert "userfaultfd(): Operation not permitted (EPERM)" in evidence
    else:
        assert "open(/dev/kvm): No such file or directory (ENOENT)" in evidence


def test_a_probe_asks_again_when_kvm_create_vm_is_interrupted(kvm, monkeypatch):
    """CI saw KVM_CREATE_VM fail with EINTR in a probe once (a signal pending
    as the VM's MMU notifier registered), and the false fact it made skipped
    13 tests. The probe asks again; any other error is the host's answer."""
    import errno

    calls = []

    def interrupted_once(fd, request, *args):
        if request == hostfacts.KVM_CREATE_VM:
            calls.append(request)
            if len(calls) == 1:
                raise OSError(errno.EINTR, "Interrupted system call")
        return real(fd, request, *args)

    real = hostfacts.ioctl
    monkeypatch.setattr(hostfacts, "ioctl", interrupted_once)
    with hostfacts._Fds() as fds:
        kvm_fd, vm, why = hostfacts._create_vm(fds)
        assert vm is not None and why is None and len(calls) == 2
    calls.clear()

    def refused(fd, request, *args):
        if request == hostfacts.KVM_CREATE_VM:
            calls.append(request)
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return real(fd, request, *args)

    monkeypatch.setattr(hostfacts, "ioctl", refused)
    with hostfacts._Fds() as fds:
        kvm_fd, vm, why = hostfacts._create_vm(fds)
        assert vm is None and "KVM_CREATE_VM" in why and len(calls) == 1


def test_a_fact_that_may_come_to_hold_is_asked_again_until_it_does():
    """A kernel marks its TSC unstable once, at any time, for good: the
    fact's probe runs again while it does not hold, and never after. Any
    other fact is probed once."""
    answers = iter([(False, "steady"), (False, "steady"), (True, "moved"), (False, "steady")])
    calls = []

    def probe():
        calls.append(1)
        return next(answers)
    later = hostfacts.Fact("test-comes-to-hold", "a test's", probe, may_come_to_hold=True)
    assert [later.holds, later.holds, later.holds, later.holds] == [False, False, True, True]
    assert later.evidence == "moved" and len(calls) == 3
    once = hostfacts.Fact("test-once", "a test's", lambda: (calls.append(1), (False, "no"))[1])
    assert [once.holds, once.holds] == [False, False] and len(calls) == 4
