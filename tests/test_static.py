"""Static checks the package must pass: ``mypy --strict uffdkvm`` and ``ruff
check uffdkvm benchmarks``, with the settings in pyproject.toml. Each runs as
a subprocess of this interpreter (``python -m``), from the repository root
so that it reads pyproject.toml and checks this tree; any finding fails."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def check(tool, *args):
    pytest.importorskip(tool)
    p = subprocess.run([sys.executable, "-m", tool, *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, f"{tool} found problems:\n{p.stdout}{p.stderr}"


def test_mypy_strict_is_clean():
    # No cache: nothing written into the tree, nothing stale read from it.
    check("mypy", "--strict", "--cache-dir", "/dev/null", "uffdkvm")


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
    p = subprocess.run([sys.executable, "-m", "mypy.stubtest", "uffdkvm._core",
                        "--allowlist", str(allow)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"stubtest found differences:\n{p.stdout}{p.stderr}"
