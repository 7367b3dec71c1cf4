"""What the commands share: the run flags, upstream's names for backings,
guest modes and CPU lists, the exit codes, the top-level guard that turns
every way out into one of them, and how a command runs here or in a
booted kernel (Boot, booted, called).

cli_run.py (the run command), cli_sweep.py, cli_dirty.py, cli_migrate.py
and cli_kernel.py import this module; cli.py only dispatches to them.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import schema
from ._version import __version__
from .config import (
    ACCESSES,
    BACKINGS,
    DELAY_DISTS,
    GUEST_PAGE_SIZES,
    PATTERNS,
    PIN_WORDS,
    PREFETCHES,
    REMOTE_TRANSPORTS,
    RESOLVERS,
    RESOLVES,
    SOURCE_CACHES,
    SOURCE_READS,
    SOURCES,
    STATS,
    WAITS,
    Config,
    parse_cpu_list,
)
from .errors import ConfigError, HostUnsupportedError, UffdkvmError
from .progress import ConsoleProgress

# Exit status, in the conventions test harnesses read (kselftest: 4 is a skip).
EXIT_OK = 0              # the run passed: memory verified
EXIT_FAILED = 1          # the run failed, or its memory did not verify
EXIT_USAGE = 2           # bad arguments (argparse's own code, and ConfigError)
EXIT_INTERNAL = 3        # a bug in uffdkvm: an exception nothing else caught
EXIT_SKIP = 4            # this host cannot run it (kselftest's KSFT_SKIP)
EXIT_INTERRUPTED = 130   # Ctrl-C (128 + SIGINT, as a shell reports it)
EXIT_BROKEN_PIPE = 141   # stdout's reader left (128 + SIGPIPE, as a C program dies)

EXIT_STATUS_HELP = (
    "Exit status: 0 passed (memory verified); 1 the run failed or its memory did not "
    "verify; 2 bad arguments; 3 internal error (a bug: the message names the exception, "
    "--debug or UFFDKVM_DEBUG=1 shows the traceback); 4 this host cannot run it (no "
    "/dev/kvm, no userfaultfd, no huge pages...: kselftest's skip); 130 interrupted "
    "(Ctrl-C); 141 stdout closed early (uffdkvm ... | head), as upstream's binary dies of "
    "SIGPIPE.")

# Progress shows only for runs longer than this: short runs print nothing extra.
PROGRESS_DELAY_S = 2.0

# Upstream's -s names (tools/testing/selftests/kvm/lib/test_util.c) and what
# uffdkvm backs each with: each backing's `upstream` names in the schema, and
# None for the huge page sizes uffdkvm does not have (x86-64 has only 2 MiB
# and 1 GiB), which are refused by name. guest_memfd is uffdkvm's own.
UPSTREAM_HUGE_PAGES_NOT_HERE = ("16kb", "64kb", "512kb", "1mb", "8mb", "16mb", "32mb", "256mb",
                                "512mb", "2gb", "16gb")
UPSTREAM_BACKINGS: dict[str, str | None] = {
    **{name: b.name for b in schema.BACKINGS for name in b.upstream},
    **{f"anonymous_hugetlb_{size}": None for size in UPSTREAM_HUGE_PAGES_NOT_HERE},
}

# Upstream's guest modes (enum vm_guest_mode in kvm_util.h, as `-h` lists
# them). uffdkvm's guest is x86-64 with 4-level paging and 4 KiB pages,
# VM_MODE_PXXV48_4K: the one mode upstream itself runs on x86-64.
GUEST_MODES = (
    "PA-bits:52,  VA-bits:48,  4K pages",
    "PA-bits:52,  VA-bits:48, 16K pages",
    "PA-bits:52,  VA-bits:48, 64K pages",
    "PA-bits:48,  VA-bits:48,  4K pages",
    "PA-bits:48,  VA-bits:48, 16K pages",
    "PA-bits:48,  VA-bits:48, 64K pages",
    "PA-bits:40,  VA-bits:48,  4K pages",
    "PA-bits:40,  VA-bits:48, 16K pages",
    "PA-bits:40,  VA-bits:48, 64K pages",
    "PA-bits:ANY, VA-bits:48,  4K pages",
    "PA-bits:47,  VA-bits:64,  4K pages",
    "PA-bits:44,  VA-bits:64,  4K pages",
    "PA-bits:36,  VA-bits:48,  4K pages",
    "PA-bits:36,  VA-bits:48, 16K pages",
    "PA-bits:36,  VA-bits:48, 64K pages",
    "PA-bits:36,  VA-bits:47, 16K pages",
)
GUEST_MODE = 9  # VM_MODE_PXXV48_4K


class CliError(Exception):
    """A usage error found after argparse (exit 2), message ready to print."""


# ---- argument types ----

Convert = Callable[[str], Any]


def uffd_mode(value: str) -> str | None:
    v = value.strip().lower()
    if v == "none":
        return None
    if v in ("missing", "minor", "wp"):
        return v
    raise argparse.ArgumentTypeError(
        f"invalid choice: {value!r} (choose from 'MISSING', 'MINOR', 'WP', 'NONE')")


def backing(value: str) -> str:
    """-s: a uffdkvm backing, or upstream's name for one."""
    v = value.strip().lower()
    if v in BACKINGS:
        return v
    if v in UPSTREAM_BACKINGS:
        mapped = UPSTREAM_BACKINGS[v]
        if mapped is not None:
            return mapped
        size = v.rpartition("_")[2]  # "16kb"
        raise argparse.ArgumentTypeError(
            f"{value!r}: upstream's backing with {size[:-2]} {size[-2].upper()}iB huge "
            f"pages is not one uffdkvm has (x86-64 huge pages are 2 MiB and 1 GiB): use "
            f"anonymous_hugetlb_2mb (uffdkvm's anonymous_hugetlb) or anonymous_hugetlb_1gb")
    raise argparse.ArgumentTypeError(
        f"invalid choice: {value!r} (choose from {', '.join(BACKINGS)}, or upstream's "
        f"anonymous_hugetlb_2mb; see --list-backings)")


def guest_mode(value: str) -> int:
    """-m: upstream's guest mode ID; only the x86-64 one runs here."""
    try:
        mode = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a guest mode ID (a number; "
                                         f"{GUEST_MODE} is the one uffdkvm runs)") from None
    if mode != GUEST_MODE:
        what = f" ({GUEST_MODES[mode]})" if 0 <= mode < len(GUEST_MODES) else ""
        raise argparse.ArgumentTypeError(
            f"guest mode {mode}{what} is not supported: uffdkvm runs x86-64 guests in mode "
            f"{GUEST_MODE} only ({GUEST_MODES[GUEST_MODE]}: 4-level paging); "
            f"--guest-page-size maps the test memory with 2M or 1G pages instead")
    return mode


def choice(choices: Sequence[str], normalize: Convert = str.lower) -> Convert:
    """An argparse type that checks its value itself, so that a sweep can
    wrap it in a list type (argparse's choices= would see the list)."""
    def parse(value: str) -> Any:
        v = normalize(value.strip())
        if v not in choices:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {value!r} (choose from {', '.join(map(repr, choices))})")
        return v
    parse.__name__ = "choice"
    return parse


def cpu_list(value: str) -> tuple[int, ...]:
    """-c and --pin-*: Config's own parser (config.parse_cpu_list)."""
    try:
        return parse_cpu_list(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def reader_pins(value: str) -> tuple[int, ...] | str:
    """--pin-readers: a CPU list, "vcpus" or "scheduler" (Config.pin_readers)."""
    if value.strip().lower() in PIN_WORDS:
        return value.strip().lower()
    try:
        return parse_cpu_list(value, PIN_WORDS)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def split_pins(cpus: tuple[int, ...], vcpus: int) -> tuple[tuple[int, ...], int | None]:
    """-c, as upstream's kvm_parse_vcpu_pinning reads it: one CPU per vCPU,
    then optionally one more for the main thread. Returns (vCPU pins, main
    thread's CPU or None)."""
    if len(cpus) == vcpus:
        return cpus, None
    if len(cpus) == vcpus + 1:
        return cpus[:-1], cpus[-1]
    raise CliError(
        f"-c: {len(cpus)} CPUs for {vcpus} vCPU(s): give one per vCPU ({vcpus}), plus "
        f"optionally one for the main thread ({vcpus + 1}), as upstream does; "
        f"--pin-vcpus assigns any number of CPUs round-robin")


def pin_main_thread(cpu: int) -> None:
    """The last entry of -c: this thread, and the threads it starts after
    (the reader threads, which the caller leaves to the scheduler unless
    --pin-readers says otherwise), run on that CPU only."""
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError as e:
        raise HostUnsupportedError(
            f"pin_vcpus: cannot pin the main thread to CPU {cpu} (the last entry of -c): "
            f"{e.strerror}; this process may use CPUs "
            f"{','.join(map(str, sorted(os.sched_getaffinity(0))))}", e.errno or 0) from None


# ---- the flags both commands take ----

def add_run_arguments(p: argparse.ArgumentParser, listed: Callable[[Convert], Convert],
                      json_help: str) -> None:
    """The run command's flags. ``listed`` wraps the type of every flag that
    sets one Config field: the identity for a run, a comma-separated list
    for a sweep. CPU lists (-c, --pin-*) are one value either way."""
    d = Config()
    p.add_argument("--version", action="version", version=f"uffdkvm {__version__}")
    p.add_argument("-m", dest="guest_modes", type=guest_mode, action="append", metavar="MODE",
                   help=f"upstream's guest mode ID; uffdkvm runs mode {GUEST_MODE} only "
                   f"({GUEST_MODES[GUEST_MODE]}), x86-64's, the default")
    p.add_argument("-u", dest="uffd_mode", type=listed(uffd_mode), default=d.uffd_mode,
                   metavar="MODE", help="MISSING (UFFDIO_COPY), MINOR (UFFDIO_CONTINUE, "
                   "shared backings), WP (write-protect faults, a snapshot of each page "
                   "before its first write; uffdkvm's own, not upstream's; anonymous and "
                   "shmem) or NONE (no userfaultfd). Default: MISSING")
    p.add_argument("-a", dest="single_uffd", action="store_true",
                   help="one userfaultfd for all guest memory instead of one per vCPU")
    p.add_argument("-d", dest="delay_us", type=listed(int), default=d.delay_us,
                   metavar="USEC", help="delay per fault before resolving it, in microseconds")
    p.add_argument("-r", dest="readers", type=listed(int), default=d.readers, metavar="N",
                   help="reader threads per userfaultfd (default 1)")
    p.add_argument("-b", dest="mem_per_vcpu", type=listed(str), default="1G", metavar="SIZE",
                   help="memory each vCPU demand-pages, e.g. 64M or 2G (default 1G)")
    p.add_argument("-s", dest="backing", type=listed(backing), default=d.backing,
                   metavar="TYPE", help=f"backing memory: {', '.join(BACKINGS)} (default "
                   f"{d.backing}); upstream's names too (anonymous_hugetlb_2mb, "
                   "anonymous_hugetlb_1gb); see --list-backings")
    p.add_argument("-v", dest="vcpus", type=listed(int), default=d.vcpus, metavar="N",
                   help="vCPUs (default 1)")
    p.add_argument("-o", dest="overlap", action="store_true",
                   help="every vCPU walks the same memory (implies -a)")
    pins = p.add_mutually_exclusive_group()
    pins.add_argument("-c", dest="cpus", type=cpu_list, default=None, metavar="CPULIST",
                      help="pin vCPU i to the i-th CPU, e.g. 0,1 for 2 vCPUs; one more entry "
                      "pins the main thread (and the readers it starts), as upstream does")
    pins.add_argument("--pin-vcpus", dest="pin_vcpus", type=cpu_list, default=None,
                      metavar="CPULIST", help="pin vCPU threads to these CPUs round-robin "
                      "(any number of CPUs)")
    p.add_argument("--pin-readers", dest="pin_readers", type=reader_pins, default=None,
                   metavar="CPULIST", help="pin reader threads to host CPUs, round-robin; "
                   "'vcpus': each reader on the CPU of the vCPU it serves (with -c or "
                   "--pin-vcpus; the default when the vCPUs are pinned and the readers "
                   "share CPUs); 'scheduler': unpinned, where the scheduler puts them "
                   "(upstream's placement, and with the default --wait upstream's wait)")
    p.add_argument("--resolver", type=listed(choice(RESOLVERS)), default=d.resolver,
                   metavar="WHO", help="who resolves faults: readers (reader threads, the "
                   "default) or vcpu (each vCPU's own thread, through UFFD_FEATURE_SIGBUS: "
                   "no reader threads)")
    p.add_argument("--wait", type=listed(choice(WAITS)), default=d.wait, metavar="MODE",
                   help=f"how readers wait: {', '.join(WAITS)} (default: spin_idle with a uffd "
                        f"per vCPU and each vCPU on a CPU of its own, -c or --pin-vcpus, else "
                        f"epoll_exclusive)")
    p.add_argument("--allow-oversubscribe", dest="allow_oversubscribe", action="store_true",
                   help="let --wait spin run more spinning readers than the CPUs beside the "
                   "vCPUs")
    p.add_argument("--read-batch", dest="read_batch", type=listed(int), default=d.read_batch,
                   metavar="N", help="messages one read() of a uffd may return (1-64); above 1 "
                   "a reader reads again while reads come back full (default "
                   f"{d.read_batch})")
    p.add_argument("--guest-page-size", dest="guest_page_size",
                   type=listed(choice(tuple(GUEST_PAGE_SIZES), str.upper)),
                   default=d.guest_page_size, metavar="SIZE",
                   help="how the guest maps its memory: 4K, 2M or 1G (default 4K)")
    p.add_argument("--pattern", type=listed(choice(PATTERNS)), default=d.pattern,
                   metavar="ORDER", help=f"page order: {', '.join(PATTERNS)}")
    p.add_argument("--seed", type=listed(int), default=d.seed, help="seed for everything random")
    p.add_argument("--write-percent", dest="write_percent", type=listed(int),
                   default=d.write_percent, metavar="PCT",
                   help="share of pages written; the rest are read (default 100)")
    p.add_argument("--passes", type=listed(int), default=d.passes, metavar="N",
                   help="walks of the memory per vCPU; only the first faults")
    p.add_argument("--touch-percent", dest="touch_percent", type=listed(int),
                   default=d.touch_percent, metavar="PCT",
                   help="share of its pages each vCPU touches at all, a seeded subset; the "
                   "rest never fault (default 100)")
    p.add_argument("--access", type=listed(choice(ACCESSES)), default=d.access, metavar="MODEL",
                   help="uniform (every touched page once a pass, the default) or zipf "
                   "(--accesses draws a pass from a Zipf distribution over the touched pages)")
    p.add_argument("--zipf-theta", dest="zipf_theta", type=listed(float), default=d.zipf_theta,
                   metavar="THETA", help="with --access zipf: the skew, above 0 (e.g. 0.99)")
    p.add_argument("--accesses", type=listed(int), default=d.accesses, metavar="N",
                   help="with --access zipf: accesses per pass per vCPU (default: its "
                   "touched pages)")
    p.add_argument("--resolve", type=listed(choice(RESOLVES)), default=d.resolve,
                   metavar="HOW",
                   help=f"missing faults: {', '.join(RESOLVES)} (default copy; move: "
                   "UFFDIO_MOVE, Linux 6.8+, anonymous memory)")
    p.add_argument("--delay-dist", dest="delay_dist", type=listed(choice(DELAY_DISTS)),
                   default=d.delay_dist, metavar="DIST",
                   help=f"distribution of -d: {', '.join(DELAY_DISTS)}")
    p.add_argument("--prefault", action="store_true",
                   help="populate all memory before the vCPUs start (no faults)")
    p.add_argument("--wp-async", dest="wp_async", action="store_true",
                   help="with -u WP: UFFD_FEATURE_WP_ASYNC (Linux 6.7+), no faults; the "
                   "pages written are collected with PAGEMAP_SCAN after the run")
    p.add_argument("--source", type=listed(choice(SOURCES)), default=d.source, metavar="SRC",
                   help="where a resolved page's bytes come from: synthetic (default), "
                   "file (--source-path; -u MISSING with --resolve copy or move) or remote "
                   "(a page server process serving --source-path over a socket, with the "
                   "--remote-* model and --max-inflight)")
    p.add_argument("--source-path", dest="source_path", default=d.source_path, metavar="PATH",
                   help="--source file or remote: the snapshot file, at least the region's "
                   "size (uffdkvm.make_snapshot writes one)")
    p.add_argument("--source-address", dest="source_address", default=d.source_address,
                   metavar="ADDRESS",
                   help="--source remote: a page server already running (uffdkvm serve), "
                   "unix:/path or tcp:HOST:PORT, instead of one the run starts; "
                   "--source-path is then the local copy every page is checked against")
    p.add_argument("--source-key-file", dest="source_key_file", default=d.source_key_file,
                   metavar="PATH", help="with --source-address: the server's key file "
                   "(uffdkvm serve --key-file; mode 0600)")
    p.add_argument("--source-read", dest="source_read", type=listed(choice(SOURCE_READS)),
                   default=d.source_read, metavar="HOW",
                   help="--source file: pread (default) or mmap (memcpy from a mapping)")
    p.add_argument("--source-cache", dest="source_cache",
                   type=listed(choice(SOURCE_CACHES)), default=d.source_cache, metavar="STATE",
                   help="--source file: the file's page cache as the vCPUs start: warm "
                   "(default: read once first) or cold (dropped)")
    p.add_argument("--prefetch", type=listed(choice(PREFETCHES)), default=d.prefetch,
                   metavar="POLICY", help="install pages before the guest asks (-u MISSING "
                   "with --resolve copy): none (default), readahead (the next "
                   "--prefetch-pages after each fault), background (a pusher thread, the "
                   "memory in address order) or replay (the pusher, in --replay-from's order)")
    p.add_argument("--prefetch-pages", dest="prefetch_pages", type=listed(int),
                   default=d.prefetch_pages, metavar="N",
                   help=f"readahead's window in pages (default {d.prefetch_pages})")
    p.add_argument("--prefetch-bandwidth-mbps", dest="prefetch_bandwidth_mbps",
                   type=listed(int), default=d.prefetch_bandwidth_mbps, metavar="MBPS",
                   help="the pusher's rate in megabits per second (background, replay; "
                   "default 0: as fast as it goes)")
    p.add_argument("--replay-from", dest="replay_from", default=None, metavar="PATH",
                   help="with --prefetch replay: a touch order file (Result.save_touch_order: "
                   "one page index a line)")
    p.add_argument("--remote-transport", dest="remote_transport",
                   type=listed(choice(REMOTE_TRANSPORTS)), default=d.remote_transport,
                   metavar="HOW", help="with a remote source: how readers reach the page "
                   "server, unix (a Unix socket, the default) or tcp (loopback TCP)")
    p.add_argument("--remote-latency-us", dest="remote_latency_us", type=listed(int),
                   default=d.remote_latency_us, metavar="USEC",
                   help="with a remote source: the page server's latency per request, in "
                   "microseconds (default 0)")
    p.add_argument("--remote-bandwidth-mbps", dest="remote_bandwidth_mbps", type=listed(int),
                   default=d.remote_bandwidth_mbps, metavar="MBPS",
                   help="with a remote source: the page server's link, in megabits per "
                   "second (default 0: unlimited)")
    p.add_argument("--max-inflight", dest="max_inflight", type=listed(int),
                   default=d.max_inflight, metavar="N",
                   help="with a remote source: requests the page server serves at once, "
                   "the rest queue, faults first (default 0: no cap)")
    p.add_argument("--guest-work", dest="guest_work", type=listed(int), default=d.guest_work,
                   metavar="N", help="guest busy-loop iterations after each page access "
                   "(4 instructions each; default 0)")
    p.add_argument("--timeout", dest="timeout_s", type=listed(float), default=d.timeout_s,
                   metavar="SECONDS", help="abandon a run that takes longer than this")
    p.add_argument("--stats", type=listed(choice(STATS)), default=d.stats,
                   help="full (default): time every fault; basic: counters only")
    p.add_argument("--guest-timing", dest="guest_timing", action="store_true",
                   help="the guest stamps every access with rdtsc: each fault's queue, "
                   "service and resume stages")
    p.add_argument("--trace-faults", dest="trace_faults", action="store_true",
                   help="keep every fault in the result (with --json)")
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument("-q", "--quiet", "--no-progress", dest="quiet", action="store_true",
                   help=f"no progress line on stderr (it shows only when stderr is a "
                   f"terminal, for runs longer than {PROGRESS_DELAY_S:g} s)")
    p.add_argument("--debug", action="store_true",
                   help="on an internal error, print the traceback (also UFFDKVM_DEBUG=1)")
    p.add_argument("--list-backings", action="store_true",
                   help="say which backings and uffd modes this host runs, then which wait "
                   "modes and resolvers (each a 16-page run), and why not")


#: What boots the guest a command runs in (uffdkvm kernel): a Guest, which
#: the command closes when done.
Boot = Callable[[], Any]

MAIN_CPU_IN_GUEST = ("-c: its last CPU pins this process's main thread, which does not run "
                     "in the guest; give one CPU per vCPU, or use --pin-vcpus")


@contextlib.contextmanager
def booted(boot: Boot | None) -> Iterator[Any]:
    """The guest ``boot`` boots, closed at the end (at once, on an
    exception); None where the command runs here."""
    if boot is None:
        yield None
        return
    with boot() as guest:
        yield guest


def called(guest: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) here, or in the guest."""
    return fn(*args) if guest is None else guest.submit(fn, *args).result()


def as_is(convert: Any) -> Any:
    """add_run_arguments' wrap for a command whose flags take one value each."""
    return convert


def pop_cli_options(fields: dict[str, Any]) -> None:
    """Drops the flags that are not Config fields and that main() has no
    use for once argparse has checked them."""
    fields.pop("guest_modes")  # only mode 9 gets past guest_mode()
    fields.pop("debug")        # guarded() read it from argv


def console_progress(quiet: bool) -> ConsoleProgress | None:
    """The progress line, where someone is watching: stderr a terminal and
    not --quiet; after PROGRESS_DELAY_S, so short runs print nothing extra."""
    if quiet or not _isatty(sys.stderr):
        return None
    return ConsoleProgress(sys.stderr, delay_s=PROGRESS_DELAY_S)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced, or closed
        return False


def format_backing_support(support: dict[str, dict[str | None, str | None]]) -> str:
    lines = []
    for name, modes in support.items():
        works = [str(m or "none") for m, why in modes.items() if why is None]
        lines.append(f"{name}: " + (f"runs with uffd_mode {', '.join(works)}"
                                    if works else "cannot run here"))
        reasons: dict[str, list[str]] = {}
        for mode, why in modes.items():
            if why is not None:
                reasons.setdefault(why, []).append(str(mode or "none"))
        for why, ms in reasons.items():
            lines.append(f"    not {', '.join(ms)}: {why}")
    return "\n".join(lines)


def format_fault_path_support(support: dict[str, dict[str, str | None]]) -> str:
    lines = []
    for field, modes in support.items():
        works = [m for m, why in modes.items() if why is None]
        lines.append(f"{field}: " + (", ".join(works) if works else "none runs here"))
        lines += [f"    not {m}: {why}" for m, why in modes.items() if why is not None]
    return "\n".join(lines)


# ---- the way out ----

def _say(prog: str, message: str) -> None:
    # stderr closed too (a harness gone): the exit status is all that is left.
    with contextlib.suppress(OSError):
        print(f"{prog}: {message}", file=sys.stderr)


def guarded(prog: str, argv: Sequence[str], body: Callable[[], int]) -> int:
    """Runs a command's body and returns its exit status, mapping every
    exception that reaches here to its code and a one-line message."""
    debug = "--debug" in argv or os.environ.get("UFFDKVM_DEBUG", "") not in ("", "0")
    try:
        try:
            return body()
        finally:
            # Flush here, not at interpreter exit, so that a reader that left
            # shows up as BrokenPipeError below rather than as a traceback
            # Python prints while it shuts down.
            sys.stdout.flush()
    except BrokenPipeError:
        # Python's documented recipe (library/signal, "Note on SIGPIPE"):
        # point stdout at /dev/null so that the final flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        except (AttributeError, ValueError, OSError):  # stdout is not a file (a capture)
            pass
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        _say(prog, "interrupted")
        return EXIT_INTERRUPTED
    except CliError as e:
        _say(prog, str(e))
        return EXIT_USAGE
    except ConfigError as e:
        _say(prog, str(e))
        return EXIT_USAGE
    except HostUnsupportedError as e:
        _say(prog, f"this host cannot run the experiment: {e}")
        return EXIT_SKIP
    except UffdkvmError as e:
        _say(prog, f"the run failed: {type(e).__name__}: {e}")
        return EXIT_FAILED
    except Exception as e:  # anything else is a bug in uffdkvm
        if debug:
            traceback.print_exc()
        _say(prog, f"internal error: {type(e).__name__}: {e}. This is a bug in uffdkvm "
             f"{__version__}: please report it with the command line"
             + ("" if debug else " and the traceback (--debug or UFFDKVM_DEBUG=1 prints it)"))
        return EXIT_INTERNAL
