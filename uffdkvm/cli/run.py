"""The run command: one experiment, printed as upstream's three lines and
uffdkvm's tables (or JSON). Its flags are uffdkvm's own (``uffdkvm -v 4``):
the other commands are subcommands of its parser (uffdkvm/cli/__init__.py)."""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from ..config import PIN_SCHEDULER, Config
from ..histogram import Histogram
from ..io import tables
from ..result import Result
from ..run import run
from ..support import backing_support, fault_path_support
from ._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    MAIN_CPU_IN_GUEST,
    Boot,
    CliError,
    add_run_arguments,
    as_is,
    booted,
    called,
    console_progress,
    format_backing_support,
    format_fault_path_support,
    pin_main_thread,
    pop_cli_options,
    split_pins,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="uffdkvm",
        description="Run one KVM demand-paging experiment over userfaultfd. The flags "
                    "are those of the kernel's KVM selftest demand_paging_test, plus "
                    "long options for what uffdkvm adds.",
        epilog="Unlike upstream, the default is -u MISSING (upstream runs without "
               "userfaultfd unless -u is given; here that is -u NONE). "
               + EXIT_STATUS_HELP + " To run a grid of experiments and compare "
               "them in one table: uffdkvm sweep --help. To serve a snapshot to runs "
               "on this host or another: uffdkvm serve --help. To track the pages a "
               "guest dirties, with dirty_log_perf_test's flags and lines: uffdkvm "
               "dirty-log --help. To migrate a running guest live: uffdkvm migrate --help. "
               "To run in another kernel, or compare two: uffdkvm kernel --help.")
    add_run_arguments(p, as_is, "print the whole result as one line of JSON "
                      "(Result.to_json(), as sweep --out writes it) instead of text")
    return p


def _table(headers: Sequence[str], rows: list[Sequence[object]]) -> str:
    return "\n".join(tables.aligned(headers, rows, cell=_cell))


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6f}" if v < 10 else f"{v:.1f}"
    return str(v)


def remote_line(r: Result) -> str:
    """source="remote": the server's model and what it served (its own
    counters, Result.page_server)."""
    c = r.config
    fetch = "" if r.source_seconds is None else f" in {r.source_seconds:.6f}s"
    bandwidth = f"{c.remote_bandwidth_mbps} Mbit/s" if c.remote_bandwidth_mbps else "unlimited"
    inflight = str(c.max_inflight) if c.max_inflight else "no cap"
    if c.source_address is not None:
        return (f"Page source:\tthe page server at {c.source_address}, {r.source_bytes} bytes "
                f"fetched{fetch}")
    line = (f"Page source:\tremote page server for {c.source_path} ({c.remote_transport}, "
            f"latency {c.remote_latency_us} us, bandwidth {bandwidth}, max in flight "
            f"{inflight}), {r.source_bytes} bytes fetched{fetch}")
    s = r.page_server
    if s is not None:
        line += (f"; the server: {s.requests} requests ({s.urgent} urgent, {s.background} "
                 f"background), {s.bytes} bytes, queued {s.queue_seconds_total:.6f}s in all "
                 f"(max {s.queue_seconds_max:.6f}s)")
    return line


def prefetch_line(r: Result) -> str:
    """What prefetch did: pages, waste, faults avoided, races, time to resident."""
    resident = "never" if r.resident_seconds is None else f"{r.resident_seconds:.6f}s"
    return (f"Prefetch ({r.config.prefetch}):\t{r.prefetched_pages} pages prefetched "
            f"({r.pushed_pages} by the pusher), {r.wasted_prefetch_pages} never touched; "
            f"{r.faults_avoided} faults avoided; {r.prefetch_eexist} prefetch races, "
            f"{r.wakes} wakes after EEXIST; all resident after {resident}")


def format_text(r: Result) -> str:
    """Upstream's three lines, then the memory check and per-thread tables."""
    whole, frac = divmod(round(r.seconds * 1e9), 10**9)
    lines = [
        f"Total guest execution time:\t{whole}.{frac:09d}s",
        f"Per-vcpu demand paging rate:\t{r.per_vcpu_rate:f} pgs/sec/vcpu",
        f"Overall demand paging rate:\t{r.paging_rate:f} pgs/sec",
        "",
    ]
    if r.verified and not r.contents_verified:
        lines.append(f"Memory counted, NOT verified:\tuserfaultfd resolved each page once, "
                     f"but the bytes the page server at {r.config.source_address} sent were "
                     f"not checked: give --source-path, a local copy of its snapshot")
    elif r.verified:
        listed = r.touched_pages is not None and \
            r.touched_pages < r.config.region_bytes // 4096
        how = ((f", and userfaultfd resolved only what the guest touched "
                f"({r.touched_pages} pages), once each" if listed else
                ", and userfaultfd resolved each page once")
               if r.config.uffd_mode is not None and not r.config.prefault else "")
        lines.append(f"Memory verified:\t{r.config.region_bytes // 4096} pages hold what "
                     f"they must{how}")
    else:
        lines.append(f"MEMORY VERIFICATION FAILED:\t{r.bad_pages} bad pages; {r.verify_message}")
    if r.source == "file":
        fetch = "" if r.source_seconds is None else f" in {r.source_seconds:.6f}s"
        lines.append(f"Page source:\tfile {r.config.source_path} ({r.config.source_read}, "
                     f"cache {r.config.source_cache}: {r.source_cached_pages_at_start} pages "
                     f"cached at start), {r.source_bytes} bytes fetched{fetch}")
    if r.source == "remote":
        lines.append(remote_line(r))
    if r.config.prefetch != "none" and r.prefetched_pages is not None:
        lines.append(prefetch_line(r))
    timed = r.config.guest_timing and r.config.stats == "full"
    lines += ["", "vCPUs:", _table(
        ["vcpu", "seconds", "pages", "all_passes_pages_per_s", "exits", "userspace_exits", "faults",
         "blocked_s", "service_p50_us", "service_p99_us"] +
        (["queue_p50_us", "queue_p99_us", "resume_p50_us", "resume_p99_us",
          "fault_p50_us", "fault_p99_us", "access_p50_us", "access_p99_us"] if timed else []),
        [[v.index, v.seconds, v.pages, round(v.all_passes_pages_per_s), v.exits, v.userspace_exits,
          v.faults, v.blocked_seconds, _us(v.service_latency, 50),
          _us(v.service_latency, 99)] +
         ([_us(v.queue_latency, 50), _us(v.queue_latency, 99), _us(v.resume_latency, 50),
           _us(v.resume_latency, 99), _us(v.fault_latency, 50), _us(v.fault_latency, 99),
           _us(v.access_latency, 50), _us(v.access_latency, 99)] if timed else [])
         for v in r.vcpus])]
    by_vcpu = r.config.resolver == "vcpu"
    if r.readers:
        lines += ["", f"Resolvers (each vCPU's own thread, {r.uffds} uffd(s)):" if by_vcpu else
                  f"Readers ({r.reader_wait}, {r.uffds} uffd(s) x {r.config.readers}):",
                  _table(["uffd", "reader", "faults", "wakeups", "spurious", "eexist",
                          "busy_s", "ctx_switches", "cpu_s", "service_p50_us",
                          "service_p99_us", "service_max_us"] +
                         (["queue_p50_us", "queue_p99_us"] if timed else []),
                         [[x.uffd, x.index, x.faults, x.wakeups, x.spurious_wakeups,
                           x.eexist, x.busy_seconds, x.context_switches, x.cpu_seconds,
                           _us(x.service_latency, 50), _us(x.service_latency, 99),
                           _us(x.service_latency, 100)] +
                          ([_us(x.queue_latency, 50), _us(x.queue_latency, 99)] if timed else [])
                          for x in r.readers])]
        lines.append(f"Total faults resolved: {r.faults}, eexist: {r.eexist}, "
                     f"spurious wakeups: {r.spurious_wakeups}")
    if r.blocktime_seconds is not None:
        lines.append(f"Blocktime (every vCPU blocked at once): {r.blocktime_seconds:.6f}s")
    if r.config.stats == "full" and r.config.uffd_mode is not None:
        lines += ["", ("Service = the vCPU's return from KVM_RUN with the fault to its "
                       "resolving ioctl returning (delay included)" if by_vcpu else
                       "Service = a reader's read() of the fault message to its resolving ioctl "
                       "returning (delay included)") +
                      ("; a vCPU's ends at its resume if that came first." if timed else ".")]
        lines.append("Queue = the guest raising the fault to that read; resume = the ioctl to "
                     "the guest's access completing; fault = the whole stall." if timed else
                     "The wait before the read (queue) and the vCPU's return after it (resume) "
                     "need --guest-timing.")
    return "\n".join(lines)


def _us(h: Histogram | None, q: float) -> str | None:
    """Percentile q of a nanosecond histogram, in microseconds (None if none)."""
    value = h.percentile(q) if h is not None and h.count else None
    return None if value is None else f"{value / 1000:.1f}"


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``uffdkvm`` once its flags are parsed: returns its exit status. (Its
    prog is uffdkvm's own, whose guard, in cli.main, maps what it raises.)"""
    return run_fields(vars(args))


def run_fields(fields: dict[str, Any], boot: Boot | None = None) -> int:
    """The run command once its flags are parsed: one experiment here, or,
    with ``boot`` (which boots a uffdkvm.kernels.Guest, once the flags have
    been checked), in that guest's kernel."""
    pop_cli_options(fields)
    as_json, quiet = fields.pop("json"), fields.pop("quiet")
    if fields.pop("list_backings"):
        with booted(boot) as guest:
            backings = called(guest, backing_support)
            paths = called(guest, fault_path_support)
        print(format_backing_support(backings))
        print(format_fault_path_support(paths))
        return EXIT_OK
    cpus = fields.pop("cpus")
    main_cpu = None
    if cpus is not None:
        fields["pin_vcpus"], main_cpu = split_pins(cpus, fields["vcpus"])
    if main_cpu is not None and boot is not None:
        raise CliError(MAIN_CPU_IN_GUEST)
    if main_cpu is not None and fields["pin_readers"] is None and \
            fields["resolver"] == "readers":
        # -c's main-thread entry: the readers inherit its CPU, as upstream's do
        # (resolver="vcpu" has no readers, and pin_readers applies to none).
        fields["pin_readers"] = PIN_SCHEDULER
    config = Config(**fields)  # ConfigError for a bad value, before anything is pinned
    if main_cpu is not None:
        pin_main_thread(main_cpu)
    with booted(boot) as guest:
        if guest is not None:
            result = guest.run(config)
        else:
            result = run(config, progress=console_progress(quiet))
    print(result.to_json() if as_json else format_text(result))
    return EXIT_OK if result.verified else EXIT_FAILED
