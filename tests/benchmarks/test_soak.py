"""benchmarks/soak.py, 200 runs: its matrix and its measures, imported, so
that the benchmark and the test are one definition. Every case of the
feature matrix runs (the host's refusals aside, each named), every Result
verifies and passes uffdkvm._invariants, every failing case fails as it
should, and nothing the process holds grows: fds, threads, child processes,
mappings, RSS, the C heap (the tolerances are soak.TOLERANCE's).

    python benchmarks/soak.py --runs 2000     # the long one (benchmarks/RESULTS.md)
"""
import importlib.util
import pathlib
import sys

import pytest

import uffdkvm

pytestmark = pytest.mark.kvm

RUNS = 200
PATH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def load_soak():
    spec = importlib.util.spec_from_file_location("soak", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


soak = load_soak()


def test_the_matrix_covers_the_features():
    """What soak.py says it cycles through is in MATRIX."""
    assert len({c.name for c in soak.MATRIX}) == len(soak.MATRIX)
    names = {c.name for c in soak.MATRIX}
    for needed in ("poll", "epoll", "epoll_exclusive", "read-batch", "io_uring",
                   "resolver-vcpu", "minor-shmem", "wp", "move", "file-pread", "file-mmap",
                   "remote-unix", "remote-tcp", "readahead", "background", "replay",
                   "stats-basic", "timeout-at-once", "interrupted", "cancelled"):
        assert needed in names
    if uffdkvm._core.TEST_HOOKS:
        assert {"resolve-eio", "reader-thread", "corrupt-page", "timeout-stuck"} <= names


def test_200_runs_across_the_matrix_grow_nothing(kvm):
    report = soak.soak(RUNS)
    text = soak.table(report)
    print("\n" + text)
    assert report.runs == RUNS and sum(report.by_case.values()) == RUNS
    # A case left out is one this host refused (HostUnsupportedError), said why.
    assert set(report.by_case) | set(report.left_out) == {c.name for c in soak.MATRIX}
    assert not report.wrong, text
    assert not report.grown(), text
