"""fault_path_support(): every wait mode, resolver, resolve, page source and
prefetch policy, by a real run; source_support(): the page sources."""
from __future__ import annotations

import subprocess
import tempfile

import pytest

import uffdkvm
from uffdkvm.config import PREFETCHES, RESOLVERS, WAITS
from helpers.children import ENV, python, uffdkvm_command
from helpers.hostfacts import BUILT_WITHOUT_LIBURING, LOOPBACK_DOWN, TMPDIR_ON_TMPFS, host_skip

pytestmark = pytest.mark.kvm


def test_every_mode_is_tried_and_the_defaults_run(kvm):
    support = uffdkvm.fault_path_support()
    assert set(support["wait"]) == set(WAITS)
    assert set(support["resolver"]) == set(RESOLVERS)
    assert support["wait"]["epoll_exclusive"] is None
    assert support["resolver"]["readers"] is None
    # Every reason is a sentence of uffdkvm's, naming what is missing.
    for modes in support.values():
        for why in modes.values():
            assert why is None or len(why) > 20


def test_the_cli_lists_them(kvm):
    p = subprocess.run(uffdkvm_command("--list-backings"), capture_output=True, text=True,
                       env=ENV)
    assert p.returncode == 0, p.stderr
    assert any(line.startswith("wait: ") and "epoll_exclusive" in line
               for line in p.stdout.splitlines())
    assert any(line.startswith("resolver: ") for line in p.stdout.splitlines())
    source = next(line for line in p.stdout.splitlines() if line.startswith("source: "))
    assert "remote (unix)" in source
    if LOOPBACK_DOWN.holds:  # listed as unavailable, with why
        assert "not remote (tcp): " in p.stdout, p.stdout
    else:
        assert "remote (tcp)" in source, source
    assert any(line.startswith("prefetch: ") and "replay" in line
               for line in p.stdout.splitlines())


def test_a_mode_the_kernel_refuses_is_reported_with_the_reason(kvm):
    """Every mode is really tried: in a child whose io_uring_setup the kernel
    refuses (a seccomp filter), io_uring alone is reported, with why."""
    import json
    import os

    from fault_paths.test_io_uring import PACKAGE_ROOT, SECCOMP_CHILD
    if not uffdkvm._core.HAVE_IO_URING:
        host_skip(BUILT_WITHOUT_LIBURING, "this build has no io_uring mode to refuse")
    child = SECCOMP_CHILD.split("out = {")[0] + (
        "print(json.dumps(uffdkvm.fault_path_support()))\n")
    p = subprocess.run(python(code=child), capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": PACKAGE_ROOT})
    assert p.returncode == 0, p.stderr
    support = json.loads(p.stdout)
    assert "io_uring_setup" in support["wait"]["io_uring"]
    assert {w: why for w, why in support["wait"].items() if w != "io_uring"} == \
        {w: None for w in WAITS if w != "io_uring"}
    assert support["resolver"] == {"readers": None, "vcpu": None}


def test_source_support_runs_every_source_here(kvm):
    """Each page source verified a real run here, from a snapshot written for it
    in the temporary directory: where that is on tmpfs, a cold cache cannot
    be had and the probe must say why (the next test shows the message)."""
    support = uffdkvm.source_support()
    if LOOPBACK_DOWN.holds:  # a page server over TCP cannot listen: it says why
        assert support.pop("remote (tcp)"), "no reason given for remote (tcp)"
    else:
        assert support.pop("remote (tcp)") is None
    if TMPDIR_ON_TMPFS.holds:
        assert "stayed in the page cache" in support.pop("file, cold cache")
    else:
        assert support.pop("file, cold cache") is None
    assert support == {"synthetic": None, "file": None, "remote (unix)": None}


def test_source_support_says_why_a_cold_cache_cannot_be_had(kvm, monkeypatch):
    """A snapshot on tmpfs has nowhere to drop its page cache to: the probe
    of a cold file source says so, while a warm one still runs."""
    monkeypatch.setattr(tempfile, "tempdir", "/dev/shm")
    support = uffdkvm.source_support()
    assert support["file"] is None
    assert "stayed in the page cache" in support["file, cold cache"]
    assert support["remote (unix)"] is None


def test_fault_path_support_covers_sources_and_prefetch(kvm):
    support = uffdkvm.fault_path_support()
    assert set(support["prefetch"]) == set(PREFETCHES)
    assert support["prefetch"] == {p: None for p in PREFETCHES}
    assert set(support["source"]) == {"synthetic", "file", "file, cold cache",
                                      "remote (unix)", "remote (tcp)"}


def test_source_support_says_why_when_no_snapshot_can_be_written(kvm, monkeypatch):
    """A temporary directory with no room (ENOSPC from make_snapshot, forced
    here): every source that needs the snapshot says so, and the synthetic
    one still runs."""
    import errno

    from uffdkvm import support

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(support, "make_snapshot", full)
    result = uffdkvm.source_support()
    assert result["synthetic"] is None
    for name in ("file", "file, cold cache", "remote (unix)", "remote (tcp)"):
        assert "could not write a snapshot" in result[name] and "No space" in result[name]
