"""run(): one experiment, from a Config to a Result."""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import resource
import time
from collections.abc import Iterable, Iterator
from typing import Any

from . import _core
from .config import (
    BACKING_PAGE_SIZES,
    HUGETLB_BACKINGS,
    PAGE_SIZE,
    Config,
    core_config,
    format_size,
)
from .errors import ConfigError, HostUnsupportedError, RunError, RunTimeoutError, UffdkvmError
from .host import limits
from .host.facts import HostInfo, meminfo_bytes, usable_cpus_at_import
from .pages.server import PageServer, PageServerError
from .progress import ProgressCallback, _Reporter, make_callback
from .result import Result
from .schema import fields as schema

_ERRORS: dict[int, type[UffdkvmError]] = {
    _core.ERR_HOST: HostUnsupportedError, _core.ERR_RUN: RunError,
    _core.ERR_TIMEOUT: RunTimeoutError}


def _mem_available() -> int | None:
    # A function of its own so that tests can stand in for a smaller host.
    return meminfo_bytes("MemAvailable")


def _check_pins(c: Config) -> None:
    # Those of import time too: a CLI's -c may have pinned the main thread since.
    allowed = usable_cpus_at_import() | os.sched_getaffinity(0)
    for field, cpus in (("pin_vcpus", c.pin_vcpus), ("pin_readers", c.reader_cpus)):
        bad = [cpu for cpu in cpus or () if cpu not in allowed]
        if bad:
            raise HostUnsupportedError(
                f"{field}: CPU {bad[0]} is not one this process may run on "
                f"(it may use {_cpu_ranges(allowed)})")


def _check_spinners(c: Config) -> None:
    """Spinning readers need CPUs of their own: on a shared CPU a spinner
    holds the CPU until the scheduler takes it away, and the run measures
    that instead of the fault path."""
    if c.wait != "spin" or c.uffd_mode is None or c.allow_oversubscribe:
        return
    spinners = c.readers * c.uffds
    insist = "or allow_oversubscribe=True to run it anyway"
    readers = c.reader_cpus
    if readers:
        # Reader k of all pools runs on readers[k % n], vCPU i on pin_vcpus[i % n].
        mine = [readers[k % len(readers)] for k in range(spinners)]
        vcpus = {c.pin_vcpus[i % len(c.pin_vcpus)] for i in range(c.vcpus)} \
            if c.pin_vcpus else set()
        if len(set(mine)) < spinners or set(mine) & vcpus:
            raise HostUnsupportedError(
                f"pin_readers: 'spin' needs a CPU of its own for each of its {spinners} "
                f"reader(s), and these pins share one (with another spinner or a vCPU); "
                f"spinning on a shared CPU measures the scheduler. Give each spinner its "
                f"own CPU, {insist}")
        return
    cpus = len(os.sched_getaffinity(0))
    if spinners > cpus - c.vcpus:
        raise HostUnsupportedError(
            f"wait: 'spin' runs {spinners} reader(s) that never sleep, and this process may "
            f"use {cpus} CPU(s), {max(cpus - c.vcpus, 0)} beside the {c.vcpus} vCPU(s); "
            f"spinning on a shared CPU measures the scheduler. Use fewer readers or "
            f"vCPUs, another wait mode, {insist}")


def _cpu_ranges(cpus: Iterable[int]) -> str:
    out: list[list[int]] = []
    for cpu in sorted(cpus):
        if out and out[-1][1] == cpu - 1:
            out[-1][1] = cpu
        else:
            out.append([cpu, cpu])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


# Pages up to this size are copied from a source of each reader's own; larger
# ones from one source per uffd; resolve="move" stages this much per resolver
# (csrc/uffd/resolve.h and resolve.c use the same constants, from the schema).
_READER_SOURCE_MAX = schema.LIMITS["READER_SRC_MAX"]
_MOVE_STAGE_BYTES = schema.LIMITS["MOVE_STAGE_BYTES"]


def _copy_source_bytes(c: Config) -> int:
    """The ordinary memory UFFDIO_COPY copies from, whatever the backing: a
    2 MiB source per resolver (a reader, or with resolver="vcpu" a vCPU) for
    2 MiB pages, a 1 GiB source per uffd for 1 GiB pages. 4 KiB pages use a
    page per resolver: nothing to speak of.
    resolve="move" stages pages in a staging area per resolver instead."""
    page = BACKING_PAGE_SIZES[c.backing]
    if c.uffd_mode == "missing" and c.resolve == "move":
        per_uffd = c.readers if c.resolver == "readers" else c.vcpus // c.uffds
        return max(page, _MOVE_STAGE_BYTES) * per_uffd * c.uffds
    if c.uffd_mode != "missing" or c.resolve != "copy" or page == PAGE_SIZE:
        return 0
    # prefetch background or replay: the pusher's page (csrc/uffd/prefetch.c)
    pusher = page if c.prefetch in ("background", "replay") else 0
    if page <= _READER_SOURCE_MAX:
        # One per resolver: the readers, or the vCPUs each resolving its own.
        per_uffd = c.readers if c.resolver == "readers" else c.vcpus // c.uffds
        return page * per_uffd * c.uffds + pusher
    return page * c.uffds + pusher


def _snapshot_bytes(c: Config) -> int:
    """uffd_mode="wp": the snapshot, a 4 KiB slot of ordinary memory per page
    of the region (filled as the guest writes pages: all of them at most);
    wp_async saves nothing, so it has none."""
    return c.region_bytes if c.uffd_mode == "wp" and c.write_percent and not c.wp_async else 0


# The memory a run charges beyond its region and copy sources, by what the
# statistics keep: per 4 KiB page of the region (the resident map, the
# verification bits, page tables) and per backing page, which is a fault (the
# fault records, the per-fault state). Measured as the peak charge of a
# memory cgroup less the region (memory.max_usage_in_bytes, at two sizes,
# one vCPU, Linux 6.18), the margin per 4 KiB page: 196 bytes with fault
# records (stats="full" with trace_faults or guest_timing) and 46 at "basic"
# with 4 KiB pages; 25 and 12 with 2 MiB hugetlb pages, 14 with THP. Plain
# stats="full" keeps no record per fault (its statistics are computed during
# the run) and charges as "basic" does (27 bytes measured). Rounded up;
# tests/host/test_limits.py measures "full" and "basic" again and fails if a run
# charges more.
_BOOKKEEPING_PER_PAGE = {"records": 32, "full": 16, "basic": 16}
_BOOKKEEPING_PER_FAULT = {"records": 192, "full": 48, "basic": 48}
# What any run charges besides: thread stacks as they are touched, the VM,
# the result's Python objects.
_BOOKKEEPING_FIXED = 8 << 20


# dirty_tracking's page maps (csrc/experiment/dirty.c): each page's write
# count and two bits (found, written), by their sizes, not measured; and each
# vCPU's dirty ring, an entry's bytes a slot. The sizes are the schema's,
# which the C asserts.
_DIRTY_PER_PAGE = schema.LIMITS["DIRTY_COUNT_BYTES"] + 1  # the two bits, rounded up
_DIRTY_RING_ENTRY_BYTES = schema.LIMITS["DIRTY_RING_ENTRY_BYTES"]


def _bookkeeping_bytes(c: Config) -> int:
    kept = "records" if c.stats == "full" and (c.trace_faults or c.guest_timing) else c.stats
    dirty = 0
    if c.dirty_tracking is not None:
        dirty = c.region_bytes // PAGE_SIZE * _DIRTY_PER_PAGE
        if c.dirty_tracking == "ring":
            dirty += c.vcpus * c.dirty_ring_entries * _DIRTY_RING_ENTRY_BYTES
    return (c.region_bytes // PAGE_SIZE * _BOOKKEEPING_PER_PAGE[kept]
            + c.region_bytes // BACKING_PAGE_SIZES[c.backing] * _BOOKKEEPING_PER_FAULT[kept]
            + dirty + _BOOKKEEPING_FIXED)


def _mib(n: int) -> str:
    return format_size(max(n, 0) // (1 << 20) << 20) if n >= 1 << 20 else format_size(n)


def _memory_fix(lim: limits.Limit, needed: int) -> str:
    want = -(-(lim.used + needed) // (64 << 20)) * (64 << 20)  # up to 64 MiB
    also = " (and memory.max, if lower)" if lim.path.endswith("memory.high") else ""
    return (f"use less memory per vCPU or fewer vCPUs, or give the cgroup more: "
            f"echo {want} > {lim.path}{also}")


def _check_memory_cgroup(c: Config, charged: int, found: limits.Hierarchies) -> None:
    """charged: the ordinary memory the run puts on its memory cgroup."""
    lim = limits.memory(found)
    if lim is None or charged <= lim.room:
        return
    what = "mem_per_vcpu" if c.overlap else "vcpus * mem_per_vcpu"
    region = (f"{format_size(c.region_bytes)} ({what})" if c.backing not in HUGETLB_BACKINGS
              else f"{format_size(charged - _bookkeeping_bytes(c))} of copy sources")
    raise HostUnsupportedError(
        f"mem_per_vcpu: the run would charge {_mib(charged)} to its memory cgroup "
        f"({region} and {_mib(_bookkeeping_bytes(c))} of bookkeeping at stats="
        f"{c.stats!r}), more than the {_mib(lim.room)} left under {lim.path} = {lim.limit} "
        f"(of which {lim.used} are in use); past it the kernel OOM-kills the process. "
        f"{_memory_fix(lim, charged)}", errno.ENOMEM)


def _check_hugetlb_cgroup(c: Config, found: limits.Hierarchies) -> None:
    page = BACKING_PAGE_SIZES[c.backing]
    lim = limits.hugetlb(page, found)
    if lim is None or c.region_bytes <= lim.room:
        return
    want = lim.used + c.region_bytes
    raise HostUnsupportedError(
        f"mem_per_vcpu: the run needs {format_size(c.region_bytes)} of "
        f"{format_size(page)} huge pages ({c.region_bytes // page}), more than the "
        f"{format_size(lim.room)} left under its hugetlb cgroup's {lim.path} = {lim.limit} "
        f"(of which {lim.used} are in use); use less memory per vCPU or fewer vCPUs, or "
        f"give the cgroup more: echo {want} > {lim.path}", errno.ENOMEM)


def _threads_needed(c: Config) -> tuple[int, str]:
    """The threads (tasks) a run of c adds to this process's: the core's
    own count, and the page server's process of a remote source."""
    n, why = _core.threads_needed(core_config(c))
    if c.source == "remote":
        n, why = n + 1, why + ", 1 page server process"
    return n, why


def _check_threads(c: Config, found: limits.Hierarchies) -> None:
    """The pids cgroup (pids.max counts threads) and RLIMIT_NPROC."""
    pids, nproc = limits.pids(found), limits.nproc()
    if pids is None and nproc is None:
        return
    needed, why = _threads_needed(c)
    fewer = "use fewer vCPUs or readers (resolver='vcpu' starts no readers)"
    if pids is not None and needed > pids.room:
        raise HostUnsupportedError(
            f"vcpus: the run starts {needed} threads ({why}), and its pids cgroup "
            f"has room for {pids.room}: {pids.path} = {pids.limit} with {pids.used} "
            f"tasks in it; {fewer}, or raise the limit: echo {pids.used + needed} > "
            f"{pids.path}", errno.EAGAIN)
    if nproc is not None and needed > nproc.room:
        _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        hard_s = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
        want = nproc.used + needed
        raise HostUnsupportedError(
            f"vcpus: the run starts {needed} threads ({why}), and RLIMIT_NPROC "
            f"(ulimit -u) = {nproc.limit} (hard limit {hard_s}) leaves room for "
            f"{nproc.room}: this user (uid {os.getuid()}) has {nproc.used} threads; "
            f"{fewer}, or raise the soft limit: 'ulimit -u {want}' in the shell that "
            f"starts the program, or resource.setrlimit(resource.RLIMIT_NPROC, ({want}, "
            f"hard)) in Python before the run", errno.EAGAIN)


def _check_fits_host(c: Config) -> None:
    """Refuse a run the host, or the cgroups and limits this process is in,
    cannot hold before the OOM killer or a refused thread decides."""
    source = _copy_source_bytes(c)
    snapshot = _snapshot_bytes(c)
    bookkeeping = _bookkeeping_bytes(c)
    found = limits.hierarchies()
    _check_threads(c, found)
    if c.backing in HUGETLB_BACKINGS:
        _check_hugetlb_cgroup(c, found)
        _check_memory_cgroup(c, source + bookkeeping, found)
    else:
        _check_memory_cgroup(c, c.region_bytes + source + snapshot + bookkeeping, found)
    available = _mem_available()
    if c.backing in HUGETLB_BACKINGS:
        # From the reserved huge page pool, which the core checks; but no pool
        # can be larger than the host.
        total = meminfo_bytes("MemTotal")
        if total is not None and c.region_bytes > total:
            raise HostUnsupportedError(
                f"mem_per_vcpu: the run needs {format_size(c.region_bytes)} of huge pages, "
                f"more than this host's {format_size(total // (1 << 20) << 20)} of memory; "
                f"use less memory per vCPU or fewer vCPUs")
        # The copy source is not from the pool: ordinary memory.
        if available is not None and source > available:
            raise HostUnsupportedError(
                f"backing: the run copies each {format_size(BACKING_PAGE_SIZES[c.backing])} "
                f"page from {format_size(source)} of ordinary memory, more than the "
                f"{format_size(available // (1 << 20) << 20)} this host has available "
                f"(MemAvailable); free memory, or use fewer readers (vCPUs, with "
                f"resolver='vcpu') or smaller pages")
        return
    if available is not None and c.region_bytes + source + snapshot > available:
        what = "mem_per_vcpu" if c.overlap else "vcpus * mem_per_vcpu"
        what_for = "move staging areas" if c.resolve == "move" else "copy sources"
        plus = f" plus {format_size(source)} of {what_for}" if source else ""
        plus += f" plus a {format_size(snapshot)} snapshot (uffd_mode='wp')" if snapshot else ""
        raise HostUnsupportedError(
            f"mem_per_vcpu: the run would demand-page {format_size(c.region_bytes)} "
            f"({what}){plus}, more than the {format_size(available // (1 << 20) << 20)} "
            f"this host has available (MemAvailable); use less memory per vCPU or fewer "
            f"vCPUs")


# How long run() waits for earlier failed runs to hand back their memory
# before it checks what the host has; past that it goes on (the core's own
# start waits a bounded while too).
_EARLIER_RUNS_WAIT_S = 2.0


def _wait_for_earlier_runs() -> None:
    """A failed run hands its memory back in the background: wait for it (a
    bounded while, in slices so that Ctrl-C is answered) so that the memory
    check sees it back."""
    deadline = time.monotonic() + _EARLIER_RUNS_WAIT_S
    while True:
        try:
            _core.wait_idle(0.1)
            return
        except _core.CoreError:
            if time.monotonic() >= deadline:
                return


def _config_of(config: Config | None, fields: dict[str, Any]) -> Config:
    if config is None:
        return Config().replace(**fields) if fields else Config()
    if not isinstance(config, Config):
        raise ConfigError(f"config: expected a uffdkvm.Config (or keywords), not "
                          f"{type(config).__name__}")
    return config.replace(**fields) if fields else config


def _raise_from_core(e: _core.CoreError) -> None:
    kind, errnum, message = e.args
    if kind == _core.ERR_CONFIG:
        # The core names the field first, as Config does: "vcpus: ...".
        name = message.partition(":")[0]
        raise ConfigError(message, errnum,
                          field=name if name in schema.BY_NAME else None) from None
    raise _ERRORS.get(kind, UffdkvmError)(message, errnum) from None


def _check_snapshot(config: Config) -> None:
    """source="remote": the snapshot is there and covers the region (the
    core checks a file source's itself; a server would only refuse the
    first fetch past its end)."""
    path = config.source_path or ""
    try:
        size = os.stat(path).st_size
    except OSError as e:
        raise ConfigError(f"source_path: {path}: {e.strerror}; write a snapshot there with "
                          f"uffdkvm.make_snapshot(path, {config.region_bytes})",
                          field="source_path") from None
    if size < config.region_bytes:
        raise ConfigError(f"source_path: {path} is {size} bytes, smaller than the test region "
                          f"({config.region_bytes} bytes), which it maps onto byte for byte; "
                          f"write a large enough one with uffdkvm.make_snapshot(path, "
                          f"{config.region_bytes})", field="source_path")


@contextlib.contextmanager
def _page_server(config: Config) -> Iterator[PageServer | None]:
    """source="remote": a page server process for this run, stopped after it
    on every way out (its socket, key and directory removed); else None (a
    run with source_address pages from a server already running)."""
    if config.source != "remote" or config.source_address is not None:
        yield None
        return
    _check_snapshot(config)
    assert config.source_path is not None
    server = PageServer(config.source_path, transport=config.remote_transport,
                        latency_us=config.remote_latency_us,
                        bandwidth_mbps=config.remote_bandwidth_mbps,
                        max_inflight=config.max_inflight)
    try:
        yield server
    finally:
        server.stop()


def _core_config(config: Config, server: PageServer | None) -> dict[str, Any]:
    """Every core field, from the schema; source="remote": the server's
    address and key file, unless the Config names a server of its own."""
    return core_config(config, server.address if server else None,
                       (server.key_file or None) if server else None)


# How long a run whose fetch from the server failed waits for the server's
# exit status: a killed server's sockets close as it dies, a moment before
# it can be reaped.
_SERVER_EXIT_WAIT_S = 1.0


def _server_fate(server: PageServer | None, message: str = "") -> str:
    """Why a remote run failed, if its server is gone: to add to the error.
    message: the core's, which names the server's address if a fetch from
    it failed (the server then may be on its way out)."""
    if server is None:
        return ""
    status = server.returncode()
    if status is None and server.address in message:
        status = server.wait(_SERVER_EXIT_WAIT_S)
    if status is None:
        return ""
    how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
    return f"; the page server (pid {server.pid}) {how} during the run"


def probe(config: Config | None = None, **fields: Any) -> None:
    """Checks that this host can run the config without running it.

    Builds the VM, the backing memory and the uffds and registers them, then
    releases everything. Returns None, or raises what run() would raise while
    setting up: HostUnsupportedError for a missing capability.
    """
    config = _config_of(config, fields)
    _wait_for_earlier_runs()
    _check_fits_host(config)
    _check_pins(config)
    _check_spinners(config)
    with _page_server(config) as server:
        try:
            _core.probe(_core_config(config, server))
        except _core.CoreError as e:
            _raise_from_core(e)


def run(config: Config | None = None, *, progress: bool | ProgressCallback | None = None,
        **fields: Any) -> Result:
    """Run one experiment and return its Result.

    ``run()`` runs the default Config; ``run(vcpus=2, mem_per_vcpu="64M")``
    makes one from keywords; ``run(cfg, readers=4)`` overrides fields of cfg.
    The GIL is released while the experiment runs, and Ctrl-C stops it
    (every thread joined, every fd closed) and raises KeyboardInterrupt within
    a second; a thread that would not stop is left, with what it may still
    touch, to be reaped in the background when it leaves.

    ``progress=True`` shows a tqdm bar (a console line without tqdm) of the
    pages the guest has touched; a callable gets a :class:`Progress` about
    every 0.25 s while the run goes, and a last one: phase "done" with the
    Result's counts, or phase "failed" when the run raises (the exception
    then propagates). An exception the callable raises cancels the run and
    propagates, as Ctrl-C does.
    """
    return _run(_config_of(config, fields), progress=make_callback(progress))


def _run(config: Config, progress: ProgressCallback | None = None,
         **core_fields: Any) -> Result:
    """run() for a Config; core_fields go to the core as they are (tests
    inject failures this way, see uffdkvm.testing._faults)."""
    _wait_for_earlier_runs()
    _check_fits_host(config)
    _check_pins(config)
    _check_spinners(config)
    reporter = _Reporter(progress, config.vcpus) if progress else None
    host = HostInfo.current()  # before: free huge pages as the run found them
    try:
        with _page_server(config) as server:
            try:
                core_config = {**_core_config(config, server), **core_fields}
                raw = _core.run(core_config, reporter) if reporter else _core.run(core_config)
            except _core.CoreError as e:
                if server:  # a failure it caused says what became of it
                    e.args = (*e.args[:2], e.args[2] + _server_fate(server, e.args[2]))
                _raise_from_core(e)
            try:
                server_stats = server.stats() if server else None
            except (PageServerError, OSError) as e:
                raise RunError(f"the page server's counters after the run: {e}"
                               f"{_server_fate(server)}") from None
    except BaseException:
        if reporter:
            reporter.fail()  # a display clears its line or closes its bar
        raise
    # The reader pins and wait as the core was handed them (Config.reader_cpus
    # and Config.reader_wait unless a test's core_fields said otherwise).
    pins = tuple(core_config["pin_readers"]) or None
    readers = config.uffd_mode is not None and config.resolver == "readers"
    wait = schema.BY_NAME["wait"].choices[core_config["wait"]] if readers else None
    result = dataclasses.replace(Result._from_core(config, raw), host=host,
                                 page_server=server_stats, reader_cpus=pins, reader_wait=wait)
    if reporter:
        reporter.finish([v.pages for v in result.vcpus])
    return result
