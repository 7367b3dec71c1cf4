"""benchmarks/tax_counts.py's reading of `perf script`: a wakeup's waker
and its CPU come from sched_waking (the waker's context), the CPU the
wakee was placed on from the matching sched_wakeup's target_cpu, even when
that sched_wakeup was recorded on the target CPU (a queued wakeup).

    python benchmarks/tax_counts.py --trials 3 --json tax_counts.json
"""
import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"

# The lines `perf script -F comm,tid,cpu,time,event,trace` prints for these
# tracepoints (the fields as the 6.x kernel's formats name them).
SCRIPT = """\
 vcpu 101 [000] 10.000001: sched:sched_waking: comm=reader pid=202 prio=120 target_cpu=001
 swapper 0 [001] 10.000003: sched:sched_wakeup: comm=reader pid=202 prio=120 target_cpu=001
 reader 202 [001] 10.000010: sched:sched_waking: comm=vcpu pid=101 prio=120 target_cpu=000
 reader 202 [001] 10.000011: sched:sched_wakeup: comm=vcpu pid=101 prio=120 target_cpu=001
 vcpu 101 [001] 10.000020: sched:sched_wakeup: comm=reader pid=202 prio=120 target_cpu=001
"""


def load():
    sys.path.insert(0, str(BENCH))
    try:
        import tax_counts
    finally:
        sys.path.remove(str(BENCH))
    return tax_counts


def test_waker_cpu_from_waking_target_from_wakeup():
    _, wakeups = load().parse(SCRIPT)
    # the first: woken from CPU 0, placed on 1 (its sched_wakeup ran on CPU 1
    # in the idle task's context); the second: woken on CPU 1, placed on 1;
    # the last sched_wakeup has no sched_waking before it and is left out
    assert wakeups == [(101, 0, 202, 1), (202, 1, 101, 1)]


def test_sizes_by_uffdkvms_parser():
    tc = load()
    assert tc.pages_of(["-v", "2", "-b", "64M"]) == 2 * 64 * 256
    assert tc.pages_of(["-b", "1GiB"]) == 1 << 18
