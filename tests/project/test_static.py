"""Static checks the package must pass: ``mypy --strict uffdkvm`` and ``ruff
check uffdkvm benchmarks``, with the settings in pyproject.toml. Each runs as
a subprocess of this interpreter (``python -m``), from the repository root
so that it reads pyproject.toml and checks this tree; any finding fails."""
import subprocess
from pathlib import Path

import pytest

from helpers.children import ENV as CHILD_ENV
from helpers.children import PACKAGE_ROOT, python

ROOT = Path(__file__).resolve().parents[2]


def check(tool, *args):
    pytest.importorskip(tool)
    p = subprocess.run(python(*args, module=tool), cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, f"{tool} found problems:\n{p.stdout}{p.stderr}"


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory):
    """mypy's cache for this module's checks: outside the tree (which may be
    read-only, and goes into the sdist), new each session so that nothing
    stale is read, shared so that the typeshed and numpy's and pandas's
    stubs are read once (6 s of the second check)."""
    return tmp_path_factory.mktemp("mypy-cache")


def test_mypy_strict_is_clean(mypy_cache):
    check("mypy", "--strict", "--cache-dir", mypy_cache, "uffdkvm")


def test_ruff_is_clean():
    check("ruff", "check", "--no-cache", "uffdkvm", "benchmarks")


def test_the_core_stub_matches_the_built_module(tmp_path):
    """uffdkvm/_core.pyi against the extension itself (mypy's stubtest):
    every name, signature and constant in one is in the other."""
    pytest.importorskip("mypy")
    from uffdkvm import _core

    allow = tmp_path / "allowlist"
    # The stub declares the fault-injection constants, which only a build with
    # test hooks (UFFDKVM_TEST_HOOKS=1) has.
    allow.write_text("" if _core.TEST_HOOKS else "uffdkvm._core.INJECT_.*\n")
    # The built extension is what is checked: from a directory of its own,
    # with the package under test first on the path (an installed one, or
    # this tree built in place). stubtest writes .mypy_cache where it runs,
    # whatever MYPY_CACHE_DIR says: from / it left one there, and on a
    # read-only / (a matrix guest's) it failed; from the tree it would write
    # into the tree and the sdist.
    env = dict(CHILD_ENV)
    if "site-packages" not in PACKAGE_ROOT:  # mypy refuses site-packages in MYPYPATH
        env["MYPYPATH"] = PACKAGE_ROOT
    where = tmp_path / "cwd"
    where.mkdir()
    p = subprocess.run(python("uffdkvm._core", "--allowlist", allow, module="mypy.stubtest"),
                       cwd=where, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"stubtest found differences:\n{p.stdout}{p.stderr}"


USER_CODE = '''
import numpy as np
import uffdkvm

cfg = uffdkvm.Config(vcpus=2, mem_per_vcpu="64M", pin_vcpus="0,1", readers=np.int64(4))
cfg = uffdkvm.Config(pin_readers=[0, 1], guest_page_size="2M", timeout_s=float("inf"))
stored: int = cfg.mem_per_vcpu
pins: tuple[int, ...] | None = cfg.reader_cpus  # pin_readers may also be "vcpus"
'''


def test_users_code_type_checks(tmp_path, mypy_cache):
    """What the docs show a user writing passes mypy --strict against the
    shipped types: README's Python blocks, and Config given what it accepts
    (sizes as strings, CPU lists as strings or lists, numpy integers)."""
    import re
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", readme, re.S | re.M)
    assert blocks, "README has Python blocks"
    files = []
    for i, code in enumerate([*blocks, USER_CODE]):
        f = tmp_path / f"user_{i}.py"
        f.write_text(code)
        files.append(str(f))
    check("mypy", "--strict", "--cache-dir", mypy_cache, *files)
