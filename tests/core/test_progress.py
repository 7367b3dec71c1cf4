"""run(progress=...): live counts read from the guest's own step counter.

Checked against the fault trace, a record the progress code did not make: a
guest cannot have touched a page before the fault on it was resolved, so at
any moment a vCPU's pages_done is at most its faults resolved by then (+1 for
the access in flight); and counts come in while the vCPUs run, not only at
pass ends.
"""
import io
import time

import numpy as np
import pytest

import uffdkvm
from uffdkvm.progress import ConsoleProgress, Progress

# alone (tests/helpers/machine_lock.py): progress reported against time bounds.
pytestmark = [pytest.mark.kvm, pytest.mark.alone]

MEM = "128M"       # 32768 pages per vCPU: about a second here, several reports


def recorded_run(**fields):
    seen = []

    def record(p):
        seen.append((time.monotonic_ns(), p))

    r = uffdkvm.run(vcpus=2, mem_per_vcpu=MEM, readers=1, trace_faults=True,
                    progress=record, **fields)
    assert r.verified, r.verify_message
    return r, seen


def test_counts_come_from_the_running_guest_and_never_run_ahead_of_faults(kvm):
    r, seen = recorded_run()
    pages = r.config.region_bytes // 4096 // 2
    running = [(t, p) for t, p in seen if p.phase == "running" and p.total]
    assert len(running) >= 2, [p for _, p in seen]
    # Mid-walk counts: the step counter is read live, not only at a pass's end.
    assert any(0 < d < pages for _, p in running for d in p.pages_done), running
    trace = r.fault_trace
    vcpu = np.asarray(trace.vcpu)
    resolved = np.asarray(trace.resolved_ns)
    for t, p in running:
        for i, done in enumerate(p.pages_done):
            assert done <= np.count_nonzero((vcpu == i) & (resolved <= t)) + 1, (i, p)
    for (_, a), (_, b) in zip(seen, seen[1:]):
        assert all(y >= x for x, y in zip(a.pages_done, b.pages_done)), (a, b)
    last = seen[-1][1]
    assert last.phase == "done"
    assert last.pages_done == last.pages_total == tuple(v.pages for v in r.vcpus)
    assert last.fraction == 1.0


def test_every_pass_counts(kvm):
    r, seen = recorded_run(passes=3, pattern="reverse")
    pages = r.config.region_bytes // 4096 // 2
    assert seen[-1][1].pages_total == (3 * pages, 3 * pages)
    totals = {p.pages_total for _, p in seen if p.total}
    assert totals == {(3 * pages, 3 * pages)}


def test_an_exception_in_the_callback_cancels_the_run(kvm):
    calls = []

    def stop(p):
        calls.append(p)
        if p.done:
            raise RuntimeError("enough")

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="enough"):
        uffdkvm.run(vcpus=1, mem_per_vcpu="1G", progress=stop)
    # The default walk takes ~20 s here: stopping means well under that.
    assert time.monotonic() - t0 < 10
    assert not any(p.phase == "done" for p in calls)
    assert calls[-1].phase == "failed"      # a display clears its line even so
    uffdkvm.run(vcpus=1, mem_per_vcpu="4M")     # and the next run is fine


def test_bad_progress_names_the_argument():
    with pytest.raises(uffdkvm.ConfigError, match="progress"):
        uffdkvm.run(vcpus=1, mem_per_vcpu="4M", progress="yes")


def test_console_line_redraws_in_place_and_clears():
    out = io.StringIO()
    show = ConsoleProgress(out)
    show(Progress("running", (10, 30), (100, 100), 1.5))
    show(Progress("running", (50, 70), (100, 100), 2.5))
    assert out.getvalue().count("\r") == 2
    assert "60%" in out.getvalue() and "120/200 pages" in out.getvalue()
    assert "slowest vCPU 50%" in out.getvalue()
    show(Progress("done", (100, 100), (100, 100), 3.0))
    assert out.getvalue().endswith("\r")


def test_a_failed_run_clears_the_line_and_reports_failed(kvm):
    out = io.StringIO()
    show = ConsoleProgress(out)
    seen = []

    def both(p):
        seen.append(p.phase)
        show(p)

    with pytest.raises(uffdkvm.RunTimeoutError):
        uffdkvm.run(vcpus=1, mem_per_vcpu="1G", timeout_s=0.7, progress=both)
    assert seen[-1] == "failed" and "running" in seen
    text = out.getvalue()
    assert "pages" in text, "the line was drawn"
    assert text.endswith("\r") and text.rstrip("\r").split("\r")[-1].strip() == "", \
        "the last write clears the line"


def test_a_line_never_outgrows_a_narrow_terminal():
    import fcntl
    import os
    import pty
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))
    with os.fdopen(slave, "w") as stream:
        show = ConsoleProgress(stream)
        show(Progress("waiting for a thread that would not stop", (10**6,), (10**7,), 1.0))
        assert show.width <= 39
    os.close(master)
