"""Independent records of what a run did, for the effect tests.

Each helper reads something the counting code did not compute: the fault
trace (the kernel's messages, stamped as the readers read and resolved
them), /proc (where the kernel says a thread ran), the core's raw clocks,
or a brute-force recomputation from the trace.
"""
import collections
import os
import threading
import time

import numpy as np

import uffdkvm
from uffdkvm import _core


class Trace:
    """A FaultTrace as numpy columns, in read order (ties kept as given)."""

    def __init__(self, trace):
        order = np.argsort(np.asarray(trace.read_ns, dtype=np.int64), kind="stable")
        self.read_ns = np.asarray(trace.read_ns, dtype=np.int64)[order]
        self.resolved_ns = np.asarray(trace.resolved_ns, dtype=np.int64)[order]
        self.gpa = np.asarray(trace.gpa, dtype=np.int64)[order]
        self.vcpu = np.asarray(trace.vcpu, dtype=np.int64)[order]
        self.uffd = np.asarray(trace.uffd, dtype=np.int64)[order]
        self.reader = np.asarray(trace.reader, dtype=np.int64)[order]
        self.eexist = np.asarray(trace.eexist, dtype=bool)[order]
        self.write = np.asarray(trace.write, dtype=bool)[order]

    def __len__(self):
        return len(self.read_ns)

    @property
    def service_ns(self):
        """read -> resolved of each fault: what the service_latency histograms count."""
        return self.resolved_ns - self.read_ns

    def pages(self, page_size=4096):
        """Each fault's page index from the region's start (the lowest gpa:
        every run here faults on every page of the region)."""
        return (self.gpa - self.gpa.min()) // page_size

    def of(self, mask):
        """The rows where mask holds, as (read_ns, resolved_ns) intervals."""
        return list(zip(self.read_ns[mask].tolist(), self.resolved_ns[mask].tolist()))


def union(intervals):
    """The union of half-open [start, end) intervals, as sorted disjoint ones."""
    out = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [tuple(x) for x in out]


def intersect(a, b):
    """The intersection of two sorted disjoint interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def length(intervals):
    return sum(end - start for start, end in intervals)


def run_keeping_core_output(monkeypatch, config=None, **fields):
    """run(), and the core's raw dict beside the Result: it holds the
    absolute CLOCK_MONOTONIC stamps (each vCPU's start_ns and pass_end_ns)
    that Result turns into durations. The real run, observed on its way out."""
    real, kept = _core.run, []

    def keep(core_config, *progress):
        raw = real(core_config, *progress)
        kept.append(raw)
        return raw

    monkeypatch.setattr(_core, "run", keep)
    result = uffdkvm.run(config, **fields)
    monkeypatch.setattr(_core, "run", real)
    assert len(kept) == 1
    return result, kept[0]


def thread_cpu(tid):
    """The CPU the kernel last ran thread tid on (/proc/self/task/<tid>/stat
    field 39, "processor"), or None once the thread is gone."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 2 (comm) is in parentheses and may hold spaces: count after it.
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[39 - 3])


class CpuSampler:
    """Samples, from a Python thread, the CPU every thread of this process
    last ran on, while a run holds no GIL: (monotonic ns, tid, cpu) rows.

        with CpuSampler() as s:
            r = uffdkvm.run(...)
        s.cpus_of(tid, after_ns=...)
    """

    def __init__(self, interval_s=0.0005):
        self.interval_s = interval_s
        self.samples = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        own = threading.get_native_id()
        while not self._stop.is_set():
            for name in os.listdir("/proc/self/task"):
                tid = int(name)
                if tid == own:
                    continue
                # The stamp is taken before the read: the sample is no older.
                now = time.monotonic_ns()
                cpu = thread_cpu(tid)
                if cpu is not None:
                    self.samples.append((now, tid, cpu))
            time.sleep(self.interval_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def cpus_of(self, tid, after_ns=0):
        """How often thread tid was seen on each CPU, in samples taken at or
        after after_ns (CLOCK_MONOTONIC, like the fault trace's stamps)."""
        return collections.Counter(cpu for t, who, cpu in self.samples
                                   if who == tid and t >= after_ns)
