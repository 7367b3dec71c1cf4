"""read_batch: one read(2) of the uffd returns up to that many messages.

Checked against the fault trace: every message of one read is stamped with
that read's return, so the trace's records of one reader grouped by read_ns
are the reads themselves, and their sizes must be what ReaderStats counted.
Four vCPUs on one uffd with one reader queue faults while the reader works,
so reads of more than one message happen when the knob reaches the core.
"""
from collections import Counter

import pytest

from helpers.runs import small

pytestmark = pytest.mark.kvm

QUEUEING = dict(vcpus=4, mem_per_vcpu="4M", single_uffd=True, readers=1, trace_faults=True)


def reads_in_trace(r):
    """Sizes of the reads, from the trace: records sharing a read stamp."""
    t = r.fault_trace
    return Counter(Counter(zip(t.uffd, t.reader, t.read_ns, strict=True)).values())


@pytest.mark.parametrize("wait", ["epoll_exclusive", "poll", "read"])
def test_a_read_returns_several_messages_and_the_counts_match_the_trace(kvm, wait):
    r = small(**QUEUEING, read_batch=8, wait=wait)
    (x,) = r.readers
    sizes = dict(enumerate(x.read_sizes))
    assert len(x.read_sizes) == 9
    assert sum(n * c for n, c in sizes.items()) == x.faults + x.eexist == r.faults
    assert sum(x.read_sizes[1:]) == x.reads
    assert {n: c for n, c in sizes.items() if c and n} == dict(reads_in_trace(r))
    assert max(n for n, c in sizes.items() if c) > 1, sizes
    assert x.reads < r.faults


def test_after_a_full_batch_a_reader_reads_again_before_it_waits(kvm):
    # Batches of 2 from 4 vCPUs come back full often: then the reader reads again.
    r = small(**QUEUEING, read_batch=2, delay_us=20)
    (x,) = r.readers
    assert x.read_sizes[2] > 0
    assert x.reads > x.wakeups - x.spurious_wakeups


def test_one_message_per_read_and_one_read_per_wakeup_by_default(kvm):
    r = small(**QUEUEING)
    (x,) = r.readers
    assert x.read_sizes == (0, x.reads) and x.reads == r.faults
    assert dict(reads_in_trace(r)) == {1: r.faults}
    assert x.reads == x.wakeups - x.spurious_wakeups


def test_draining_stops_at_a_short_read_and_at_sixteen_reads(kvm):
    """A read that comes back short emptied the queue: the reader waits then,
    rather than read once more for nothing. And however fast faults come, a
    reader makes 16 reads at most before it waits again (the others' turn)."""
    one = small(vcpus=1, mem_per_vcpu="4M", readers=1, read_batch=8).readers[0]
    assert one.read_sizes[1] == one.reads == 1024  # one vCPU: one message at a time
    assert one.read_sizes[0] == 0  # and never a read after it
    busy = small(vcpus=4, mem_per_vcpu="2M", single_uffd=True, readers=1, read_batch=1,
                 delay_us=20)
    assert busy.readers[0].reads == busy.readers[0].wakeups  # no batches: no draining
    full = small(vcpus=4, mem_per_vcpu="2M", single_uffd=True, readers=1, read_batch=2,
                 delay_us=50).readers[0]
    assert full.read_sizes[2] > 0
    assert full.reads <= 16 * (full.wakeups - full.spurious_wakeups)
