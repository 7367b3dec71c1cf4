"""Runs that cannot fit the cgroups and limits they run in are refused
before they start, naming the limit; those that fit run; and where the
kernel starves a run after the check, the run fails with an error that user
space can see, or (a memory cgroup) the kernel kills it, as documented.

Every case makes real cgroups (tests/helpers/cgroups.py) and runs the experiment
in a child process that moves itself into them first, so that only the
child is limited. The child either goes through uffdkvm.run() (the checks)
or calls the core directly (``_core.run``: the checks bypassed), to see
what the kernel does without them.
"""
import importlib
import json
import mmap
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time

import pytest
from helpers.cgroups import Cgroup, v1_mounted, v2_available
from helpers.children import ENV, python
from helpers.hostfacts import (NOT_ROOT, NO_HUGEPAGES_2M, add_hugepages, fact, host_skip,
                               missing_tool, remove_hugepages)

import uffdkvm
from uffdkvm.host import limits

pytestmark = pytest.mark.kvm


@fact("no-cgroup-v1-memory", "no cgroup v1 hierarchy has the memory controller")
def NO_V1_MEMORY():
    return v1_mounted("memory") is None, f"memory in v1: {v1_mounted('memory')}"


@fact("no-cgroup-v1-pids", "no cgroup v1 hierarchy has the pids controller")
def NO_V1_PIDS():
    return v1_mounted("pids") is None, f"pids in v1: {v1_mounted('pids')}"


@fact("no-cgroup-v2-hugetlb", "the cgroup v2 hierarchy is not mounted or does not offer "
      "the hugetlb controller")
def NO_V2_HUGETLB():
    return v2_available("hugetlb") is None, f"v2 with hugetlb: {v2_available('hugetlb')}"


def need(*facts_):
    for f in facts_:
        if f.holds:
            host_skip(f, "makes cgroups of its own")


# The child's part: a JSON line of what became of the run.
RESULT = r'''
import json, os, sys, uffdkvm
from uffdkvm import _core, config

def outcome(fn):
    try:
        r = fn()
        return {"ok": r.verified if hasattr(r, "verified") else r["verified"]}
    except uffdkvm.UffdkvmError as e:
        return {"error": type(e).__name__, "errno": e.errno, "message": str(e)}
    except _core.CoreError as e:
        kind, errnum, message = e.args
        return {"error": "RunError" if kind == _core.ERR_RUN else f"CoreError {kind}",
                "errno": errnum, "message": message}
'''


def child(cgroups, body, timeout=120):
    """Runs body (Python, after RESULT) in a child that joined cgroups first;
    its last line as JSON, or {"signal": N} if the kernel killed it."""
    code = "".join(cg.join_code() for cg in cgroups) + RESULT + body
    p = subprocess.run(python(code=code), env=ENV, capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode < 0:
        return {"signal": -p.returncode}
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


RUN = "print(json.dumps(outcome(lambda: uffdkvm.run({}))))\n"
CORE = ("print(json.dumps(outcome(lambda: _core.run(config.core_config("
        "uffdkvm.Config({}))))))\n")
PROBE = "print(json.dumps(outcome(lambda: uffdkvm.probe({}))))\n"


def test_limits_are_none_where_nothing_is_set():
    """This session's own cgroups set nothing, and reading them raises nothing."""
    found = limits.hierarchies()
    for lim in (limits.memory(found), limits.pids(found), limits.hugetlb(2 << 20, found)):
        assert lim is None or lim.room > 0


def test_hierarchies_in_a_cgroup_namespace():
    """Inside a cgroup namespace /proc/self/cgroup says "/", which is the
    mount point itself; a v1 controller wins over v2's."""
    if NO_V1_MEMORY.holds:   # hierarchies() keeps only directories that exist
        host_skip(NO_V1_MEMORY, "the mount point the case names is this host's")
    mountinfo = ("31 23 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
                 "41 23 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")
    found = limits.hierarchies("4:memory:/\n0::/\n", mountinfo)
    assert found["memory"].directory == "/sys/fs/cgroup/memory"
    assert found["memory"].version == 1
    # A container's bind mount of its own cgroup at the mount point.
    mountinfo = "31 23 0:28 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    found = limits.hierarchies("4:memory:/docker/abc\n", mountinfo)
    assert found["memory"].directory == "/sys/fs/cgroup/memory"


def test_memory_limit_v1_refuses_a_run_it_cannot_hold():
    """The issue's case: in a 96 MiB memory cgroup, mem_per_vcpu="256M" was
    OOM-killed after 2 s without a word. It is refused, naming the file, its
    value and the fix; probe() says the same; and a run that fits runs."""
    need(NOT_ROOT, NO_V1_MEMORY)
    with Cgroup("memory") as cg:
        cg.write("memory.limit_in_bytes", 96 << 20)
        limit_file = os.path.join(cg.path, "memory.limit_in_bytes")
        for how in (RUN, PROBE):
            out = child([cg], how.format('mem_per_vcpu="256M"'))
            assert out.get("error") == "HostUnsupportedError", out
            m = out["message"]
            assert f"{limit_file} = {96 << 20}" in m, m
            assert "mem_per_vcpu" in m and "echo " in m and limit_file in m, m
        # The CLI: the same message, and the exit status of a host that cannot.
        p = subprocess.run(python(code=cg.join_code() + "import sys, uffdkvm.cli\n"
                                  "sys.exit(uffdkvm.cli.main(['-b', '256M']))"),
                           env=ENV, capture_output=True, text=True, timeout=120)
        assert p.returncode == 4 and f"{limit_file} = {96 << 20}" in p.stderr, p  # EXIT_SKIP
        assert child([cg], RUN.format('mem_per_vcpu="32M"')) == {"ok": True}
        assert cg.read("memory.oom_control").endswith("oom_kill 0")


def test_memory_limit_counts_the_bookkeeping():
    """The bookkeeping the estimate adds (stats="full": the resident map,
    the page bitmaps, the page tables) is what the run charges: a run whose
    region fits but whose bookkeeping does not is refused."""
    need(NOT_ROOT, NO_V1_MEMORY)
    run_module = importlib.import_module("uffdkvm.run")
    region = 64 << 20
    c = uffdkvm.Config(mem_per_vcpu=region)
    bookkeeping = run_module._bookkeeping_bytes(c)
    with Cgroup("memory") as cg:
        cg.write("memory.limit_in_bytes", 1 << 30)
        # The child sets its own limit: room for the region and half the bookkeeping.
        body = (f"import uffdkvm.host.limits\n"
                f"lim = uffdkvm.host.limits.memory()\n"
                f"open(lim.path, 'w').write(str(lim.used + {region} + {bookkeeping} // 2))\n"
                + RUN.format(f"mem_per_vcpu={region}"))
        out = child([cg], body)
        assert out.get("error") == "HostUnsupportedError", out
        assert "of bookkeeping at stats='full'" in out["message"], out


def test_memory_limit_v1_leaves_out_page_cache_read_twice(tmp_path):
    """Page cache is reclaimed before a charge fails, active (read twice) as
    well as inactive: a run that fits beside 128 MiB of it in a 192 MiB
    cgroup is not refused, and runs. Red when only inactive_file was left
    out of the usage: the cache read twice is active, and the room left
    looked smaller than the run."""
    need(NOT_ROOT, NO_V1_MEMORY)
    cached = tmp_path / "cached"
    with open(cached, "wb") as f:
        for _ in range(128):
            f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # read by the child
    body = (f"for _ in range(2):\n"
            f"    with open({str(cached)!r}, 'rb') as f:\n"
            f"        while f.read(1 << 20): pass\n"
            f"import uffdkvm.host.limits\n"
            f"lim = uffdkvm.host.limits.memory()\n"
            f"stat = dict(line.split() for line in open(os.path.join(os.path.dirname(lim.path),"
            f" 'memory.stat')))\n"
            f"print(json.dumps({{'active_file': int(stat['total_active_file'])}}))\n"
            + RUN.format('mem_per_vcpu="64M"'))
    with Cgroup("memory") as cg:
        cg.write("memory.limit_in_bytes", 192 << 20)
        p = subprocess.run(python(code=cg.join_code() + RESULT + body), env=ENV,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        lines = [json.loads(line) for line in p.stdout.splitlines()]
        assert lines[0]["active_file"] >= 64 << 20, lines  # the case: cache read twice
        assert lines[-1] == {"ok": True}, lines
        assert cg.read("memory.oom_control").endswith("oom_kill 0")


MEASURE = r'''
uffdkvm.run(mem_per_vcpu="4M", stats=STATS, backing=BACKING)  # the first use
JOIN
import uffdkvm.host.limits
cg = uffdkvm.host.limits.hierarchies()["memory"].directory
charged = []
for region in REGIONS:
    uffdkvm.testing._faults.wait_idle()
    open(cg + "/memory.max_usage_in_bytes", "w").write("0")
    base = int(open(cg + "/memory.usage_in_bytes").read())
    r = uffdkvm.run(mem_per_vcpu=region, stats=STATS, backing=BACKING)
    assert r.verified
    charged.append(int(open(cg + "/memory.max_usage_in_bytes").read()) - base)
    del r
print(json.dumps({"ok": True, "charged": charged}))
'''


# The huge page cases count the free 2 MiB pages, then take them: alone.
@pytest.mark.parametrize("backing, stats", [
    ("anonymous", "full"), ("anonymous", "basic"),
    pytest.param("anonymous_hugetlb", "full", marks=pytest.mark.alone),
    pytest.param("anonymous_hugetlb", "basic", marks=pytest.mark.alone)])
def test_the_bookkeeping_estimate_covers_what_a_run_charges(backing, stats, hugepages):
    """Measured again, as the constants were: the peak charge of a run to its
    memory cgroup, less what the process held before, at two sizes. Each is
    at most what the check counts (the region for all but hugetlb, whose
    pages are not the memory cgroup's, and the estimate), and the margin per
    page between them is at most the estimate's and not far below it (a
    stale constant fails one side or the other)."""
    need(NOT_ROOT, NO_V1_MEMORY)
    run_module = importlib.import_module("uffdkvm.run")
    huge = backing == "anonymous_hugetlb"
    regions = (16 << 20, 64 << 20) if huge else (64 << 20, 320 << 20)
    # The session's pool (HUGEPAGE_POOLS) holds 16; the 64 MiB region takes 32,
    # which this test adds for itself (root here: NOT_ROOT skips above) and
    # takes back: a host with no pages of its own skipped it unexplained.
    added = add_hugepages(2048, max(32 - _free_2m(), 0)) if huge else 0
    try:
        if huge and _free_2m() < 32:
            host_skip(NO_HUGEPAGES_2M, "needs 32 free 2 MiB pages")
        with Cgroup("memory") as cg:
            out = child([], "import uffdkvm.testing._faults\n" +
                        MEASURE.replace("JOIN", cg.join_code()).replace("STATS", repr(stats))
                        .replace("REGIONS", repr(regions)).replace("BACKING", repr(backing)))
    finally:
        if added:
            remove_hugepages(2048, added)
    assert out["ok"] is True
    counted = []
    for region, charged in zip(regions, out["charged"], strict=True):
        counted.append((0 if huge else region) + run_module._bookkeeping_bytes(
            uffdkvm.Config(mem_per_vcpu=region, stats=stats, backing=backing)))
        assert charged <= counted[-1], (region, charged, counted[-1])
    pages = (regions[1] - regions[0]) // 4096
    margin = (out["charged"][1] - out["charged"][0]) / pages - (0 if huge else 1) * 4096
    per_page = (counted[1] - counted[0]) / pages - (0 if huge else 1) * 4096
    # The two peaks differ by 1 MiB or so of noise (the interpreter's own
    # allocations, page cache): over a hugetlb run's few pages that is much.
    noise = (1 << 20) / pages
    assert margin - noise <= per_page <= 2 * (margin + noise) + 16, (margin, per_page, noise)


def test_a_memory_cgroup_out_of_room_during_uffdio_copy_kills_the_process():
    """What the kernel does without the check (Linux 6.18): a charge that
    UFFDIO_COPY cannot make (shmem_mfill_atomic_pte -> try_charge_memcg)
    invokes the memory cgroup's OOM killer at once; the ioctl never returns
    ENOMEM to the reader. So only the check before the run protects."""
    need(NOT_ROOT, NO_V1_MEMORY)
    with Cgroup("memory") as cg:
        cg.write("memory.limit_in_bytes", 96 << 20)
        out = child([cg], CORE.format('mem_per_vcpu="256M", backing="shmem"'))
        assert out == {"signal": signal.SIGKILL}, out
        assert "oom_kill 1" in cg.read("memory.oom_control")


def _pids_body(extra, how, fields):
    """Sets the child's own pids.max to what it has now plus the run's
    threads plus extra, then runs."""
    return (f"import importlib\n"
            f"rm = importlib.import_module('uffdkvm.run')\n"
            f"lim = uffdkvm.host.limits.pids()\n"
            f"c = uffdkvm.Config({fields})\n"
            f"n, _ = rm._threads_needed(c)\n"
            f"used = int(open(lim.path.replace('pids.max', 'pids.current')).read())\n"
            f"open(lim.path, 'w').write(str(used + n + {extra}))\n"
            + how.format(fields))


PIDS_FIELDS = 'vcpus=2, readers=2, mem_per_vcpu="8M"'


def test_pids_max_below_the_threads_refuses_the_run():
    """pids.max counts threads: one fewer than the run's (controller, vCPUs,
    readers, KVM's worker) is refused naming pids.max; exactly enough runs."""
    need(NOT_ROOT, NO_V1_PIDS)
    with Cgroup("pids") as cg:
        cg.write("pids.max", 1000)
        pids_max = os.path.join(cg.path, "pids.max")
        out = child([cg], "import uffdkvm.host.limits\n" + _pids_body(-1, RUN, PIDS_FIELDS))
        assert out.get("error") == "HostUnsupportedError", out
        m = out["message"]
        assert f"{pids_max} = " in m and "starts 8 threads" in m and "echo " in m, m
        assert "kvm-nx-lpage-recovery" in m, m
        out = child([cg], "import uffdkvm.host.limits\n" + _pids_body(-1, PROBE, PIDS_FIELDS))
        assert out.get("error") == "HostUnsupportedError", out
        out = child([cg], "import uffdkvm.host.limits\n" + _pids_body(0, RUN, PIDS_FIELDS))
        assert out == {"ok": True}, out


@pytest.mark.parametrize("extra", [-1, -2, -6])
def test_threads_refused_mid_run_fail_the_run_naming_the_thread(extra):
    """The check bypassed (the core called directly, as a limit tightened
    after the check would): the thread that cannot be made fails the run
    with a RunError naming it, within seconds: pthread_create for the
    core's, KVM_RUN's EAGAIN for the worker KVM starts (which, retried for
    ever, used to run into the timeout)."""
    need(NOT_ROOT, NO_V1_PIDS)
    with Cgroup("pids") as cg:
        cg.write("pids.max", 1000)
        start = time.monotonic()
        out = child([cg], "import uffdkvm.host.limits\n" + _pids_body(extra, CORE, PIDS_FIELDS))
        assert time.monotonic() - start < 30
        assert out.get("error") == "RunError" and out["errno"] == 11, out
        assert "pthread_create(" in out["message"] or \
            "KVM_RUN failed with EAGAIN" in out["message"], out


def test_kvm_run_retried_for_its_worker_counts_no_userspace_exits():
    """KVM's worker refused at the first KVM_RUN (pids.max one short), then
    allowed 0.3 s later: the vCPUs retried KVM_RUN's EAGAIN 1 ms apart and
    the run goes on. A retry never entered the guest, so userspace_exits is
    what the same run counts without one (2 a vCPU: the guest's reports).
    Red when every EAGAIN was counted: some 300 more a vCPU."""
    need(NOT_ROOT, NO_V1_PIDS)
    body = (f"import threading, time, uffdkvm.host.limits\n"
            f"lim = uffdkvm.host.limits.pids()\n"
            f"def allow():\n"
            f"    time.sleep(0.3)\n"
            f"    open(lim.path, 'w').write(str(used + n + 8))\n"
            f"t = threading.Thread(target=allow)\n"
            f"t.start()\n"  # before pids.current is read: it counts the thread
            f"rm = importlib.import_module('uffdkvm.run')\n"
            f"c = uffdkvm.Config({PIDS_FIELDS})\n"
            f"n, _ = rm._threads_needed(c)\n"
            f"used = int(open(lim.path.replace('pids.max', 'pids.current')).read())\n"
            f"if REFUSE: open(lim.path, 'w').write(str(used + n - 1))\n"
            f"start = time.monotonic()\n"
            f"r = _core.run(config.core_config(c))\n"
            f"seconds = time.monotonic() - start\n"
            f"t.join()\n"
            f"print(json.dumps({{'exits': [v['userspace_exits'] for v in r['vcpus']],\n"
            f"                  'seconds': seconds}}))\n")
    with Cgroup("pids") as cg:
        cg.write("pids.max", 1000)
        plain = child([cg], "import importlib\nREFUSE = False\n" + body)
        retried = child([cg], "import importlib\nREFUSE = True\n" + body)
    assert plain["exits"] == [2, 2], plain
    # The worker was refused, and the vCPUs retried until it was allowed
    # 0.3 s in: the retried run lasts past that, and longer than the plain
    # one by most of it (the plain run's own length varies with the load).
    assert retried["seconds"] >= 0.25, (plain, retried)
    assert retried["seconds"] - plain["seconds"] >= 0.15, (plain, retried)
    assert retried["exits"] == plain["exits"], (plain, retried)


HUGE = 'backing="anonymous_hugetlb", mem_per_vcpu="16M"'


def _free_2m():
    with open("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages") as f:
        free = int(f.read())
    with open("/sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages") as f:
        return free - int(f.read())


@pytest.mark.alone  # counts the free 2 MiB pages first: no other worker may take them
def test_hugetlb_limit_v2_refuses_a_huge_page_run(hugepages):
    """A v2 hugetlb cgroup (hugetlb.2MB.max) below the region refuses the run
    naming the file, even with the pool's pages free; probe() says the same;
    a limit that holds the region runs."""
    need(NOT_ROOT, NO_V2_HUGETLB)
    if _free_2m() < 8:
        host_skip(NO_HUGEPAGES_2M, "needs 8 free 2 MiB pages")
    with Cgroup("hugetlb", version=2) as cg:
        cg.write("hugetlb.2MB.max", 4 << 20)
        limit_file = os.path.join(cg.path, "hugetlb.2MB.max")
        for how in (RUN, PROBE):
            out = child([cg], how.format(HUGE))
            assert out.get("error") == "HostUnsupportedError", out
            assert f"{limit_file} = {4 << 20}" in out["message"], out
            assert f"echo {16 << 20} > {limit_file}" in out["message"], out
        cg.write("hugetlb.2MB.max", 16 << 20)
        assert child([cg], RUN.format(HUGE)) == {"ok": True}


@pytest.mark.alone  # counts the free 2 MiB pages first: no other worker may take them
def test_hugetlb_limit_met_mid_run_fails_the_resolving_ioctl(hugepages):
    """The check bypassed, as a limit lowered after it: the pages are
    reserved at mmap (not charged to hugetlb.2MB.max until faulted), so the
    resolving UFFDIO_COPY meets the limit: ENOMEM, a RunError naming the
    ioctl, not a SIGBUS."""
    need(NOT_ROOT, NO_V2_HUGETLB)
    if _free_2m() < 8:
        host_skip(NO_HUGEPAGES_2M, "needs 8 free 2 MiB pages")
    with Cgroup("hugetlb", version=2) as cg:
        cg.write("hugetlb.2MB.max", 4 << 20)
        out = child([cg], CORE.format(HUGE))
        assert out.get("error") == "RunError", out
        assert "UFFDIO_COPY" in out["message"] and out["errno"] == 12, out


@pytest.mark.alone  # takes every free 2 MiB page of the host
def test_a_huge_page_pool_drained_mid_run_does_not_starve_the_run(hugepages):
    """Another mapping takes every free huge page while the run pages (a
    thread of this process: the pool is the host's, whoever maps it): the
    run's were reserved when it mapped its region (no MAP_NORESERVE), so it
    finishes and verifies; the drainer got the rest."""
    need(NOT_ROOT)
    if _free_2m() < 8:
        host_skip(NO_HUGEPAGES_2M, "needs 8 free 2 MiB pages")
    running, stop = threading.Event(), threading.Event()
    taken = []

    def drain():
        # Once the run is running (its region mapped), takes what is free, briefly.
        if not running.wait(20):
            return
        n = _free_2m()
        if n <= 0:
            return
        try:
            m = mmap.mmap(-1, n << 21, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                          | 0x40000)  # MAP_HUGETLB
        except OSError:
            return
        try:
            for off in range(0, n << 21, 2 << 20):
                m[off] = 1
            taken.append(n)
            stop.wait(5)  # until the run is over
        finally:
            m.close()

    def progress(p):
        if p.phase == "running":
            running.set()

    t = threading.Thread(target=drain)
    t.start()
    try:
        # 8 faults 250 ms apart: the drainer has the pool from the first progress
        # report (0.25 s in) on, with most of the run's pages still to come.
        r = uffdkvm.run(backing="anonymous_hugetlb", mem_per_vcpu="16M", delay_us=250000,
                        progress=progress)
    finally:
        running.set()
        stop.set()
        t.join()
    assert r.verified
    assert taken, "the drainer took no pages during the run"


def _tree(tmp_path, levels):
    """A cgroup v2 tree of files as the kernel writes them, for what this
    host cannot mount (its memory controller is v1's): levels, from the
    mount down, of {file: text}."""
    d = tmp_path
    for files in levels:
        d = d / "c"
        d.mkdir()
        for name, text in files.items():
            (d / name).write_text(text)
    return d


def test_v2_memory_takes_the_least_room_over_max_high_and_ancestors(tmp_path):
    """This host's v2 hierarchy has no memory controller (v1 has it), so v2's
    files are read from a tree written as the kernel writes them."""
    leaf = _tree(tmp_path, [
        {"memory.max": "max\n", "memory.high": "max\n", "memory.current": "0\n"},
        {"memory.max": f"{1 << 30}\n", "memory.high": f"{512 << 20}\n",
         "memory.current": f"{100 << 20}\n", "memory.stat": f"anon 1\ninactive_file {20 << 20}\n"},
        {"memory.max": "max\n", "memory.high": "max\n", "memory.current": f"{90 << 20}\n"},
    ])
    found = {"memory": limits._Hierarchy(2, str(tmp_path), str(leaf))}
    lim = limits.memory(found)
    assert lim.path == str(leaf.parent / "memory.high")
    assert (lim.limit, lim.used, lim.room) == (512 << 20, 80 << 20, 432 << 20)


def test_v1_no_limit_and_unreadable_files_are_no_limit(tmp_path):
    leaf = _tree(tmp_path, [{"memory.limit_in_bytes": "9223372036854771712\n",
                             "memory.usage_in_bytes": "12345\n"},
                            {"memory.limit_in_bytes": "garbage\n"}])
    found = {"memory": limits._Hierarchy(1, str(tmp_path), str(leaf)),
             "pids": limits._Hierarchy(1, str(tmp_path), str(tmp_path / "gone")),
             "hugetlb": limits._Hierarchy(2, str(tmp_path), str(leaf))}
    assert limits.memory(found) is None
    assert limits.pids(found) is None
    assert limits.hugetlb(2 << 20, found) is None
    assert limits.memory({}) is None


def test_v2_hugetlb_and_its_reservations(tmp_path):
    leaf = _tree(tmp_path, [{"hugetlb.2MB.max": f"{64 << 20}\n",
                             "hugetlb.2MB.current": f"{4 << 20}\n",
                             "hugetlb.2MB.rsvd.max": f"{32 << 20}\n",
                             "hugetlb.2MB.rsvd.current": f"{30 << 20}\n",
                             "hugetlb.1GB.max": "max\n", "hugetlb.1GB.current": "0\n"}])
    found = {"hugetlb": limits._Hierarchy(2, str(tmp_path), str(leaf))}
    lim = limits.hugetlb(2 << 20, found)
    assert lim.path.endswith("hugetlb.2MB.rsvd.max") and lim.room == 2 << 20
    assert limits.hugetlb(1 << 30, found) is None


def test_rlimit_nproc_is_not_enforced_for_root_or_the_capabilities():
    assert not limits.nproc_enforced(uid=0, status="CapEff:\t0000000000000000\n")
    assert not limits.nproc_enforced(uid=1000, status=f"CapEff:\t{1 << 21:016x}\n")
    assert not limits.nproc_enforced(uid=1000, status=f"CapEff:\t{1 << 24:016x}\n")
    assert limits.nproc_enforced(uid=1000, status=f"CapEff:\t{1 << 12:016x}\n")
    assert limits.nproc_enforced(uid=1000, status="")


def test_the_region_mmap_refused_is_an_error_not_a_kill():
    """The mapping of the region refused (here by RLIMIT_AS, as a container's
    address-space limit would): the run fails with the call and ENOMEM, and
    the process lives on to run again."""
    out = child([], """
import resource
uffdkvm.run(mem_per_vcpu="4M")
with open("/proc/self/status") as f:
    size = next(int(line.split()[1]) for line in f if line.startswith("VmSize")) << 10
resource.setrlimit(resource.RLIMIT_AS, (size + (64 << 20), resource.RLIM_INFINITY))
first = outcome(lambda: uffdkvm.run(mem_per_vcpu="256M"))
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print(json.dumps({**first, "next": outcome(lambda: uffdkvm.run(mem_per_vcpu="4M"))}))
""")
    assert out["error"] == "HostUnsupportedError" and out["errno"] == 12, out
    assert out["message"].startswith("mmap(anonymous guest memory, 268435456 bytes)"), out
    assert out["next"] == {"ok": True}


@pytest.mark.parametrize("remount", [False, True], ids=["host-mount", "own-mount"])
def test_a_cgroup_namespace_still_finds_the_limit(remount):
    """In a cgroup namespace /proc/self/cgroup says "/". With the host's
    mount (mountinfo's root "/..": the namespace's root is not named) the
    cgroup is found by its cgroup.procs; with the namespace's own mount
    (root "/", as a container mounts it) it is the mount point. Either way
    the 96 MiB limit refuses the run."""
    need(NOT_ROOT, NO_V1_MEMORY)
    if shutil.which("unshare") is None:
        host_skip(missing_tool("unshare"), "enters a cgroup namespace with unshare(1)")
    mount = v1_mounted("memory")
    code = RESULT + RUN.format('mem_per_vcpu="256M"')
    cmd = " ".join(shlex.quote(a) for a in python(code=code))
    with Cgroup("memory") as cg:
        cg.write("memory.limit_in_bytes", 96 << 20)
        if remount:
            inner = (f"umount -l {mount} && mount -t cgroup -o memory none {mount} && "
                     f"exec {cmd}")
            enter = (f"unshare --cgroup --mount --propagation private sh -c "
                     f"{shlex.quote(inner)}")
        else:
            enter = f"unshare --cgroup {cmd}"
        p = subprocess.run(["sh", "-c", f"echo $$ > {cg.path}/cgroup.procs && exec {enter}"],
                           env=ENV, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout.strip().splitlines()[-1])
        assert out.get("error") == "HostUnsupportedError", out
        where = mount if remount else cg.path
        assert f"{where}/memory.limit_in_bytes = {96 << 20}" in out["message"], out
