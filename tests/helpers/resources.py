"""What a run must give back: this process's fds, threads and memory
mappings, compared before and after (the ``released`` fixture uses these)."""
import os
import time

import uffdkvm


def resources():
    """What a run must give back: this process's open fds and threads, and
    its memory mappings (a leaked mapping shows as one more line). A failed
    run may still be handing its memory back in the background: wait for it
    (with _core's wait_idle, which every build has; uffdkvm.testing._faults's
    only adds the exception type)."""
    uffdkvm._core.wait_idle()
    with open("/proc/self/maps") as f:
        maps = sum(1 for _ in f)
    return {"fds": len(os.listdir("/proc/self/fd")),
            "threads": len(os.listdir("/proc/self/task")),
            "maps": maps}


def assert_released(before, within_s=1.0, maps_slack=None):
    """fds and threads are back to `before` (a joined thread can stay in
    /proc/self/task for a moment after pthread_join returns, so wait a
    little). Maps are compared when maps_slack is given: the interpreter's
    own allocator may map or unmap an arena in between, by up to maps_slack;
    fewer maps than before are fine, as fewer fds and threads are (an
    earlier test's thread that ended meanwhile takes its stack's two)."""
    # A leak adds; a thread of an earlier test (a dask worker, a timer) may
    # end meanwhile, so fewer is fine.
    deadline = time.monotonic() + within_s
    while True:
        now = resources()
        ok = now["fds"] <= before["fds"] and now["threads"] <= before["threads"]
        if maps_slack is not None:
            ok = ok and abs(now["maps"] - before["maps"]) <= maps_slack
        if ok or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert now["fds"] <= before["fds"], f"open fds: {before['fds']} -> {now['fds']}"
    assert now["threads"] <= before["threads"], \
        f"threads: {before['threads']} -> {now['threads']}"
    if maps_slack is not None:
        assert now["maps"] - before["maps"] <= maps_slack, \
            f"memory mappings: {before['maps']} -> {now['maps']}"
