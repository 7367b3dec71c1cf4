"""Run from a directory that holds a stray ``uffdkvm/`` package (a clone's
root, whose uffdkvm/ has no built extension, is one), uffdkvm and its
children still import the installed package (issue 17).

The stray package here records that it was imported, and fails. The runs
are real: a source="remote" run, whose page server is a child process that
uffdkvm starts, and the command line, through its installed entry point and
through the tests' helper (and its page server, a grandchild).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import uffdkvm
from helpers.children import ENV, PACKAGE_ROOT, python, uffdkvm_command
from helpers.hostfacts import host_skip, missing_tool
from uffdkvm._spawn import python_command
from uffdkvm.pages.server import PageServer

INSTALLED = str(Path(uffdkvm.__file__).resolve())


@pytest.fixture
def stray(tmp_path, monkeypatch):
    """A working directory with a uffdkvm/ of its own; the marker file that
    exists once anything imported it."""
    where = tmp_path / "stray"
    (where / "uffdkvm").mkdir(parents=True)
    marker = tmp_path / "stray-imported"
    (where / "uffdkvm" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'a').write(__file__ + '\\n')\n"
        "raise ImportError('the stray uffdkvm/ in the working directory was imported')\n")
    monkeypatch.chdir(where)
    return marker


def test_the_stray_package_shadows_an_unsafe_child(stray):
    """The control: `python -c` with the working directory on its path
    imports the stray package (so the tests below would see it)."""
    p = subprocess.run([sys.executable, "-c", "import uffdkvm"], capture_output=True,
                       text=True, timeout=60, env=ENV)
    assert p.returncode != 0 and "stray uffdkvm/" in p.stderr, p
    assert stray.exists()


def test_a_remote_run_from_there_uses_the_installed_page_server(kvm, stray, snapshot):
    r = uffdkvm.run(vcpus=1, mem_per_vcpu="2M", source="remote", source_path=snapshot)
    assert r.verified, r.verify_message
    assert r.page_server.requests > 0 and r.page_server.bytes == 2 << 20
    assert not stray.exists(), stray.read_text()


def test_a_page_server_from_there_serves(stray, snapshot):
    with PageServer(snapshot) as server:
        stats = server.stats()
        cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0")
    assert stats.errors == 0
    assert b"uffdkvm.pages.process" in cmdline
    assert not stray.exists(), stray.read_text()


def entry_point():
    here = Path(sys.executable).parent / "uffdkvm"
    found = str(here) if here.exists() else shutil.which("uffdkvm")
    if found is None:
        host_skip(missing_tool("uffdkvm"), "runs the installed command")
    return found


@pytest.mark.parametrize("how", ["entry-point", "helper"])
def test_the_command_line_from_there_uses_the_installed_package(kvm, stray, snapshot, how):
    args = ["-v", "1", "-b", "2M", "--source", "remote", "--source-path", str(snapshot)]
    argv = [entry_point(), *args] if how == "entry-point" else uffdkvm_command(*args)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=ENV)
    assert p.returncode == 0, p.stderr
    assert "Memory verified" in p.stdout
    assert not stray.exists(), stray.read_text()


@pytest.mark.parametrize("safe_path", [True, False], ids=["-P", "3.10-bootstrap"])
def test_both_ways_of_spawning_keep_the_working_directory_off_the_path(stray, safe_path):
    """-P where the interpreter has it, and the -c bootstrap Python 3.10 uses
    (which runs here too): a module run as -m would be, and code as -c,
    each with its arguments."""
    code = "import sys, uffdkvm; print(uffdkvm.__file__, sys.argv[1:], '' in sys.path)"
    p = subprocess.run(python_command(code=code, args=["a", "b"], safe_path=safe_path),
                       capture_output=True, text=True, timeout=60, env=ENV)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [INSTALLED, "['a',", "'b']", "False"]
    p = subprocess.run(python_command(module="uffdkvm", args=["--version"],
                                      safe_path=safe_path),
                       capture_output=True, text=True, timeout=60, env=ENV)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"uffdkvm {uffdkvm.__version__}"
    assert not stray.exists(), stray.read_text()


def test_the_tests_helper_is_the_same(stray):
    p = subprocess.run(python(code="import uffdkvm; print(uffdkvm.__file__)"),
                       capture_output=True, text=True, timeout=60, env=ENV)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == INSTALLED
    assert ENV["PYTHONPATH"].split(os.pathsep)[0] == PACKAGE_ROOT
    assert not stray.exists()
