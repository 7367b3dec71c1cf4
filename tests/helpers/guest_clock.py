"""Whether a run put the guest's TSC stamps on the readers' clock, and what
a run that could not must say (docs/measurements.md, "How the guest's clock
becomes the readers'")."""
from .hostfacts import NO_KVM_TSC_OFFSET, NO_STEADY_KVM_TSC_OFFSET, host_skip


def no_stages(r, why):
    """r's guest stamps were put on no clock, for the reason that starts with
    why (Result.clock_sync_message): no bound, no stage anywhere, and blocked
    time from the readers' own clock; the guest's own view of its accesses
    still whole."""
    __tracebackhide__ = True
    assert r.verified, r.verify_message
    assert r.clock_sync is None and r.clock_error_ns is None and r.misordered_faults is None
    assert r.clock_sync_message and r.clock_sync_message.startswith(why), r.clock_sync_message
    for v in r.vcpus:
        assert v.queue_latency is v.resume_latency is v.fault_latency is None
        assert v.service_latency.count == v.faults + v.eexist
        assert v.access_latency.count > 0
    for x in r.readers:
        assert x.queue_latency is None
    if r.fault_trace is not None:
        assert set(r.fault_trace.raised_ns) == {None} == set(r.fault_trace.resumed_ns)


def guest_clock_converted(r):
    """Whether r (guest_timing, stats="full") put the guest's stamps on the
    readers' clock, asserting that it did what this host allows: where KVM
    moves each vCPU's TSC offset as its thread comes and goes (the host
    kernel marked its TSC unstable: Debian's 6.1 booted nested), the stamps
    are the host's TSC plus no one offset, and the run must say so and give
    no stage (False); elsewhere it must convert them (True). Where KVM does
    not report its offset (before Linux 5.16), no run can tell which holds."""
    __tracebackhide__ = True
    if NO_KVM_TSC_OFFSET.holds:
        host_skip(NO_KVM_TSC_OFFSET, "needs KVM's TSC offset to tell whether the guest's "
                  "clock kept one offset from the host's")
    if NO_STEADY_KVM_TSC_OFFSET.holds:
        no_stages(r, "KVM's TSC offset of vCPU ")
        assert " moved during the run " in r.clock_sync_message, r.clock_sync_message
        return False
    assert r.clock_sync is not None, r.clock_sync_message
    assert r.clock_sync_message is None
    return True
