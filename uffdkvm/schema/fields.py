"""The one declaration of every config field, and of the limits the core and
Python share.

Pure data, the standard library only, importable without the extension, so
that the generator can run before a build:

    python tools/gen_schema.py --write     # rewrite every generated file
    python tools/gen_schema.py --check     # exit 1 naming any stale one

From FIELDS come: csrc/config_schema.h (the config enums and their names,
BACKINGS' properties (UKVM_BACKINGS), GUEST_PAGE_SIZES, struct ukvm_config's members, the
table the binding and the core's validator walk: defaults, ranges, applies
rules; the shared constants),
Config's constructor signature in uffdkvm/config.py, the constants section
of uffdkvm/_core.pyi and the field table of docs/config.md, each between
marker lines. uffdkvm/config.py builds the Config dataclass from FIELDS at
import, run.py maps a Config to the core by walking them, and the CLI takes
its choices from them. tests/project/test_schema.py fails when a checked-in file is
stale.

A field's `kind` is how the core holds it; `form` is how Python holds it
where that differs (see FORMS). `core` is the struct ukvm_config member's
name (None: a Python-side field, never seen by the core); `config` is False
for a field only the core has.

`applies` is the rule "this field may leave its default only when field F
is one of V...": ((F, (V, ...)), ...), every pair required. The core's
validator enforces it for core fields, Config's generic check for
Python-side ones; the message is the same.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = ("u32", "u64", "bool", "enum", "double", "string", "cpus", "pages")

#: Python forms that differ from the core's:
#:   size        bytes, given as an int or a string such as "64M"
#:   page_size   "4K", "2M" or "1G"; the core holds bytes
#:   none_choice the choice named "none" is Python's None
#:   seconds     seconds (a float, math.inf: no limit) or None (an automatic
#:               limit: Config.effective_timeout_s); the core holds ns, 0: none
#:   optional    None is the core's 0 (which means "unset" there)
#:   path        a str or os.PathLike, stored as a str; None is the core's ""
#:   address     a page server's "unix:/path" or "tcp:HOST:PORT"; None is the core's ""
#:   pin_readers a CPU list, "vcpus" or "scheduler"; the core gets Config.reader_cpus
#:   wait        a choice, or None: the core gets Config.reader_wait, and holds
#:               WAIT_SLEEPING (the wait a None leaves unpinned readers) as its default
#:   page_list   a path to a touch-order file or a sequence of page indices,
#:               stored as a tuple; the core gets the list
FORMS = ("size", "page_size", "none_choice", "seconds", "optional", "path", "pin_readers",
         "page_list", "address", "wait")

#: The wait that wait=None gives readers that do not go with pinned vCPUs, and
#: the core's default (Config.reader_wait).
WAIT_SLEEPING = "epoll_exclusive"
#: The wait that wait=None gives readers that go with their pinned vCPUs.
WAIT_BESIDE_VCPUS = "spin_idle"


@dataclass(frozen=True)
class Field:
    name: str                   # the Config field (or, config=False, the core's name)
    kind: str                   # one of KINDS: how the core holds it
    default: Any                # Python's stored default
    doc: str                    # one line for the docs table and Config's docstring
    core: str | None = ""       # the struct member ("" : same as name; None: Python-side)
    config: bool = True         # False: the core's only (no Config field)
    choices: tuple[str, ...] = ()   # enum: names in the core's enum order
    c_enum: str = ""            # enum: the C type's name after "ukvm_" (default: name)
    c_prefix: str = ""          # enum: the enumerators' prefix after "UKVM_" (default: NAME)
    min: int | float | None = None
    max: int | float | None = None  # double: the range is (min, max]
    applies: tuple[tuple[str, tuple[str, ...]], ...] = ()
    form: str | None = None     # one of FORMS, or None: Python holds what the core does
    size: str = ""              # string: the buffer size constant (its NUL included)
    # The command line (uffdkvm/cli/_common.py builds the flags from these):
    cli: tuple[str, ...] = ("run",)  # the commands whose flag is built from this entry:
    #                             "run": every command that takes the run flags; else
    #                             CLI_COMMANDS', beside their own flags; (): none
    cli_why: str = ""           # cli (): where the field is set instead
    flags: tuple[str, ...] = ()  # its option strings ((): --the-name-with-dashes)
    metavar: str = ""           # "": argparse's (the name upper-cased)
    cli_help: str = ""          # the flag's help where it differs from doc ("": doc);
    #                             its choices, range and default are added to either
    cli_type: str = ""          # a converter of cli_common.CONVERTERS, where the flag
    #                             takes more than the field (upstream's spellings)

    @property
    def run_flag(self) -> bool:
        """A flag of every command that takes the run flags?"""
        return "run" in self.cli

    @property
    def option_strings(self) -> tuple[str, ...]:
        """The flag's option strings."""
        return self.flags or (f"--{self.name.replace('_', '-')}",)

    @property
    def core_name(self) -> str | None:
        return self.name if self.core == "" else self.core

    @property
    def enum_type(self) -> str:
        return self.c_enum or self.name

    @property
    def enum_prefix(self) -> str:
        return self.c_prefix or self.name.upper()

    @property
    def core_default(self) -> Any:
        """The default as the core holds it."""
        if self.form == "wait":
            return to_core_value(self, WAIT_SLEEPING)
        return to_core_value(self, self.default)


_2M, _1G = 2 << 20, 1 << 30



@dataclass(frozen=True)
class Backing:
    """A backing (the config's `backing`) and what follows from its kind of
    memory; the core's checks and Python's read the same entry."""
    name: str
    page_size: int              # bytes: its faults are resolved at this size
    shared: bool                # a page cache: MINOR faults, an alias mapping
    hugetlb: bool               # hugetlbfs pages, of page_size
    private_anonymous: bool     # no file behind it: UFFDIO_MOVE moves pages into it
    #                             (resolve="move"), and uffd-wp needs no WP_HUGETLBFS_SHMEM
    wp: bool                    # uffd_mode="wp" runs on it: 4 KiB pages, saved and
    #                             verified one at a time, whose writes reach userfaultfd
    migrates: bool              # migrate() runs on it: 4 KiB pages that fault
    upstream: tuple[str, ...] = ()  # demand_paging_test's -s names for it (the CLI takes them)


#: Every backing, in the core's enum order.
BACKINGS: tuple[Backing, ...] = (
    Backing("anonymous", 4096, shared=False, hugetlb=False, private_anonymous=True, wp=True,
            migrates=True, upstream=("anonymous",)),
    Backing("shmem", 4096, shared=True, hugetlb=False, private_anonymous=False, wp=True,
            migrates=True, upstream=("shmem",)),
    Backing("anonymous_thp", _2M, shared=False, hugetlb=False, private_anonymous=True,
            wp=False, migrates=False, upstream=("anonymous_thp",)),
    Backing("anonymous_hugetlb", _2M, shared=False, hugetlb=True, private_anonymous=False,
            wp=False, migrates=False, upstream=("anonymous_hugetlb", "anonymous_hugetlb_2mb")),
    Backing("anonymous_hugetlb_1gb", _1G, shared=False, hugetlb=True, private_anonymous=False,
            wp=False, migrates=False, upstream=("anonymous_hugetlb_1gb",)),
    Backing("shared_hugetlb", _2M, shared=True, hugetlb=True, private_anonymous=False,
            wp=False, migrates=False, upstream=("shared_hugetlb",)),
    Backing("guest_memfd", 4096, shared=True, hugetlb=False, private_anonymous=False,
            wp=False, migrates=False),
)
BACKING_BY_NAME = {b.name: b for b in BACKINGS}
#: Backing's properties (its bool fields): csrc/config_schema.h's UKVM_BACKINGS
#: gives each backing's, and UKVM_BACKINGS_<PROPERTY>_NAMES lists those that have it.
BACKING_PROPERTIES = ("shared", "hugetlb", "private_anonymous", "wp", "migrates")


def backings_where(prop: str) -> tuple[str, ...]:
    """The backings that have the property (one of BACKING_PROPERTIES)."""
    assert prop in BACKING_PROPERTIES, prop
    return tuple(b.name for b in BACKINGS if getattr(b, prop))


def listed(names: tuple[str, ...] | list[str]) -> str:
    """Names as a message lists them: "'a', 'b' or 'c'"."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


#: Each backing and the page size its faults are resolved at.
BACKING_PAGE_SIZES = {b.name: b.page_size for b in BACKINGS}
GUEST_PAGE_SIZES = {"4K": 4096, "2M": _2M, "1G": _1G}

#: Limits the core and Python share: (name, value, comment). Each is a
#: UKVM_<name> macro in csrc/config_schema.h, an attribute of uffdkvm._core
#: and a key of LIMITS.
CONSTANTS = (
    ("MAX_VCPUS", 4096, "KVM's own ceiling (KVM_MAX_VCPUS); the host may allow fewer"),
    ("MAX_REGION_BYTES", 1 << 46, "the test region at most: the core puts it above 4 GiB, "
     "under the CPU's physical-address width"),
    ("MAX_READERS", 4096, "reader threads per uffd"),
    ("MAX_READ_BATCH", 64, "messages one read(2) of the uffd may return"),
    ("READS_PER_WAKEUP", 16, "reads a reader makes before it waits again, while they come "
     "back full: a bound, so that one reader cannot starve the rest"),
    ("MAX_DELAY_US", 10_000_000, "the per-fault delay at most: 10 s"),
    ("MAX_GUEST_WORK", 1_000_000, "guest loop iterations per access"),
    ("MAX_PASSES", 1_000_000, "walks of the region per vCPU"),
    ("MAX_CPU", 1023, "the largest CPU number a pin may name (CPU_SETSIZE - 1)"),
    ("MAX_ACCESSES", 1 << 24, "access lists live in the guest's system memory, 4 bytes an "
     "entry: 2^24 entries (64 MiB, a 64 GiB vCPU's pages) at most, per pass per vCPU"),
    ("MAX_PREFETCH_PAGES", 1 << 20, "readahead's window at most"),
    ("MAX_PREFETCH_BANDWIDTH_MBPS", 1 << 40, "the pusher's rate at most"),
    ("MAX_DIRTY_CLEAR_PAGES", 1 << 30, "bitmap_manual's clear chunk at most, in 4 KiB "
     "pages"),
    ("MAX_DIRTY_RING_ENTRIES", 1 << 24, "a dirty ring's entries at most (KVM caps it lower: "
     "KVM_CAP_DIRTY_LOG_RING gives the bytes)"),
    ("MAX_MIGRATION_ROUNDS", 100_000, "a migration's pre-copy rounds at most"),
    ("MAX_DOWNTIME_TARGET_MS", 3_600_000, "precopy's downtime target at most: an hour"),
    ("MAX_REMOTE_LATENCY_US", 10_000_000, "the page server's latency at most: 10 s"),
    ("MAX_REMOTE_BANDWIDTH_MBPS", 1_000_000_000, "1 Pbit/s: past any real link"),
    ("MAX_INFLIGHT", 1_000_000, "requests the page server serves at once at most"),
    ("SOURCE_PATH_MAX", 4096, "bytes of source_path, its NUL included"),
    ("SOURCE_ADDRESS_MAX", 256, "bytes of source_address, its NUL included"),
    ("READER_SRC_MAX", 2 << 20, "pages up to this size are copied from a source of each "
     "reader's own, larger ones from one per uffd (uffd/resolve.h, struct ukvm_shared_buffer)"),
    ("MOVE_STAGE_BYTES", 256 << 10, "resolve move: each resolver stages this much of 4 KiB "
     "pages, or one larger page (uffd/resolve.c)"),
    ("DIRTY_RING_ENTRY_BYTES", 16, "a dirty ring's entry, struct kvm_dirty_gfn "
     "(kvm/dirtylog.c asserts it)"),
    ("DIRTY_COUNT_BYTES", 4, "dirty_tracking's write count per 4 KiB page, beside two bits "
     "(experiment/dirty.c asserts it)"),
)
#: The float constant, kept apart: C writes it as a double.
MAX_ZIPF_THETA = 100.0

#: The limits by name: LIMITS["MAX_VCPUS"] (also uffdkvm._core.MAX_VCPUS).
LIMITS: dict[str, int] = {name: value for name, value, _ in CONSTANTS}

_U32_MAX, _U64_MAX = (1 << 32) - 1, (1 << 64) - 1
_READERS_ONLY = (("resolver", ("readers",)),)
_REMOTE_ONLY = (("source", ("remote",)),)
_MIGRATING = (("migration", ("precopy", "postcopy", "hybrid")),)
_PRECOPY_ONLY = (("migration", ("precopy",)),)
_PRECOPYING = (("migration", ("precopy", "hybrid")),)

# In Config's order (its positional order, kept as it was); struct
# ukvm_config's members follow the same order.
FIELDS: tuple[Field, ...] = (
    Field("vcpus", "u32", 1, "vCPUs, each in its own host thread", min=1, max=LIMITS["MAX_VCPUS"],
          flags=("-v",), metavar="N"),
    Field("mem_per_vcpu", "u64", 1 << 30, "bytes each vCPU demand-pages: an int or a string "
          "such as \"64M\" or \"1G\", stored in bytes; a multiple of the backing's and the "
          "guest's page size", form="size", min=4096, max=LIMITS["MAX_REGION_BYTES"],
          flags=("-b",), metavar="SIZE"),
    Field("backing", "enum", "anonymous", "the memory (docs/backings.md); faults are "
          "resolved at its page size", choices=tuple(BACKING_PAGE_SIZES),
          flags=("-s",), metavar="TYPE", cli_type="backing"),
    Field("uffd_mode", "enum", "missing", "\"missing\" (UFFDIO_COPY or UFFDIO_ZEROPAGE), "
          "\"minor\" (UFFDIO_CONTINUE after the page cache is prefilled; shared backings), "
          "\"wp\" (write-protect faults: QEMU's background snapshot), or None: no "
          "userfaultfd, the kernel pages memory in itself (the baseline)",
          choices=("none", "missing", "minor", "wp"), c_prefix="UFFD", form="none_choice",
          flags=("-u",), metavar="MODE", cli_type="uffd_mode",
          cli_help="MISSING (UFFDIO_COPY), MINOR (UFFDIO_CONTINUE, shared backings), WP "
          "(write-protect faults, a snapshot of each page before its first write; uffdkvm's "
          "own, not upstream's; anonymous and shmem) or NONE (no userfaultfd), in any case"),
    Field("single_uffd", "bool", False, "one uffd for the whole region instead of one per "
          "vCPU",
          flags=("-a",)),
    Field("resolver", "enum", "readers", "who resolves a fault: \"readers\" (reader threads "
          "read the uffd's messages) or \"vcpu\" (the uffd answers with SIGBUS and the "
          "faulting vCPU's own thread resolves it: no reader threads)",
          choices=("readers", "vcpu"),
          metavar="WHO"),
    Field("readers", "u32", 1, "reader threads per uffd", min=1, max=LIMITS["MAX_READERS"],
          applies=_READERS_ONLY,
          flags=("-r",), metavar="N"),
    Field("wait", "enum", None, "how readers wait: \"poll\", \"epoll\", "
          "\"epoll_exclusive\", \"read\", \"spin\" (a non-blocking read in a loop), "
          "\"io_uring\" (needs a build with liburing and Linux 5.15+) or \"spin_idle\" "
          "(spin at SCHED_IDLE on pinned CPUs: a reader beside its vCPU runs when the "
          "vCPU blocks in a fault). None: \"spin_idle\" with a uffd per vCPU, each vCPU "
          "pinned to a CPU of its own and pin_readers None or \"vcpus\", else "
          "\"epoll_exclusive\"",
          choices=("poll", "epoll", "epoll_exclusive", "read", "spin", "io_uring",
                   "spin_idle"),
          applies=_READERS_ONLY, form="wait",
          metavar="MODE"),
    Field("read_batch", "u32", 1, "messages one read() of the uffd may return; above 1, "
          "while reads come back full a reader reads again before it waits (16 reads at "
          "most)", min=1, max=LIMITS["MAX_READ_BATCH"], applies=_READERS_ONLY,
          metavar="N"),
    Field("allow_oversubscribe", "bool", False, "let wait=\"spin\" run more spinning "
          "readers than the CPUs left beside the vCPUs (run() refuses it otherwise)",
          core=None),
    Field("delay_us", "u32", 0, "microseconds a reader waits per fault before resolving it",
          min=0, max=LIMITS["MAX_DELAY_US"],
          flags=("-d",), metavar="USEC"),
    Field("overlap", "bool", False, "every vCPU walks the same region (implies one uffd)",
          flags=("-o",)),
    Field("guest_work", "u32", 0, "guest computation after each page access: iterations "
          "of a 4-instruction loop", min=0, max=LIMITS["MAX_GUEST_WORK"],
          metavar="N"),
    Field("guest_page_size", "u64", "4K", "how the guest's page tables map the region: "
          "\"4K\", \"2M\" or \"1G\"", form="page_size",
          metavar="SIZE"),
    Field("pattern", "enum", "sequential", "the order each vCPU visits its pages: "
          "\"sequential\", \"reverse\" or \"random\" (a seeded permutation)",
          choices=("sequential", "reverse", "random"),
          metavar="ORDER"),
    Field("seed", "u64", 0, "seeds everything random: order, reads, delays, the working "
          "set, Zipf draws"),
    Field("write_percent", "u32", 100, "the share of pages the guest writes; it reads the "
          "rest, and the host checks what it read", min=0, max=100,
          metavar="PCT"),
    Field("passes", "u32", 1, "walks of the region per vCPU; only the first faults",
          min=1, max=LIMITS["MAX_PASSES"],
          metavar="N"),
    Field("resolve", "enum", "copy", "missing faults: \"copy\" (UFFDIO_COPY), "
          "\"zeropage\" (UFFDIO_ZEROPAGE) or \"move\" (UFFDIO_MOVE of a staged page; "
          "anonymous memory, Linux 6.8+)", choices=("copy", "zeropage", "move"),
          metavar="HOW"),
    Field("delay_dist", "enum", "fixed", "the delay's distribution: \"fixed\", "
          "\"uniform\" (0 to 2 x delay_us) or \"exponential\" (mean delay_us)",
          choices=("fixed", "uniform", "exponential"), c_prefix="DELAY",
          metavar="DIST"),
    Field("pin_vcpus", "cpus", None, "host CPUs for the vCPU threads, round-robin: any "
          "iterable of CPU numbers, one number or a string \"0,2,3\"; stored as a tuple "
          "(None: unpinned)", min=0, max=LIMITS["MAX_CPU"],
          metavar="CPULIST", cli_type="cpus"),
    Field("pin_readers", "cpus", None, "host CPUs for the reader threads, likewise; or "
          "\"vcpus\": each reader on the CPU of the vCPU it serves (needs pin_vcpus); or "
          "\"scheduler\": unpinned, where the scheduler puts them (upstream's placement). "
          "None: \"vcpus\" when pin_vcpus is set and the readers share CPUs (every wait but "
          "\"spin\"), else \"scheduler\"",
          min=0, max=LIMITS["MAX_CPU"], applies=_READERS_ONLY, form="pin_readers",
          metavar="CPULIST", cli_type="reader_pins"),
    Field("prefault", "bool", False, "populate the whole region before the vCPUs start: "
          "no userfaults at all, the ceiling"),
    Field("stats", "enum", "full", "\"full\": readers time every fault (latency, "
          "attribution, blocktime); \"basic\": counters only", choices=("full", "basic")),
    Field("guest_timing", "bool", False, "the guest times every access with rdtsc"),
    Field("trace_faults", "bool", False, "return every fault (Result.fault_trace)",
          applies=(("stats", ("full",)),)),
    Field("record_touch_order", "bool", False, "record the order in which faults installed pages "
          "(Result.touch_order, what save_touch_order writes and replay_from takes): 4 bytes "
          "a page (uffd_mode=\"missing\" with resolve=\"copy\": else it stays empty)",
          applies=(("resolve", ("copy",)),),
          cli=(), cli_why="the Python API's (Result.save_touch_order writes what it records)"),
    Field("timeout_s", "u64", None, "seconds before the run is abandoned with "
          "RunTimeoutError; None: a generous limit from the run's size "
          "(Config.effective_timeout_s); math.inf: no limit", core="timeout_ns",
          form="seconds",
          flags=("--timeout",), metavar="SECONDS"),
    Field("wp_async", "bool", False, "uffd_mode=\"wp\" only: UFFD_FEATURE_WP_ASYNC (Linux "
          "6.7+): no faults, the pages written found with PAGEMAP_SCAN after the run",
          applies=(("uffd_mode", ("wp",)),)),
    Field("source", "enum", "synthetic", "where a resolved page's bytes come from: "
          "\"synthetic\", \"file\" (the snapshot source_path) or \"remote\" (a page server "
          "that run() starts, serving source_path)", choices=("synthetic", "file", "remote"),
          c_enum="source_kind",
          metavar="SRC"),
    Field("source_path", "string", None, "the snapshot file, at least the region's size "
          "(uffdkvm.make_snapshot writes one); with source_address, the local copy every "
          "page is checked against (None: contents not checked)", form="path",
          size="SOURCE_PATH_MAX",
          applies=(("source", ("file", "remote")),),
          metavar="PATH"),
    Field("source_address", "string", None, "a page server already running (uffdkvm serve), "
          "\"unix:/path\" or \"tcp:HOST:PORT\"; None: run() starts one serving "
          "source_path", form="address", size="SOURCE_ADDRESS_MAX", applies=_REMOTE_ONLY,
          metavar="ADDRESS"),
    Field("source_key_file", "string", None, "the key file of the server at source_address "
          "(uffdkvm serve --key-file; mode 0600), which a TCP server requires; run() gives "
          "the server it starts a fresh key of its own", form="path", size="SOURCE_PATH_MAX",
          applies=_REMOTE_ONLY,
          metavar="PATH"),
    Field("source_read", "enum", "pread", "how a page is read from the file: \"pread\" or "
          "\"mmap\"", choices=("pread", "mmap"), applies=(("source", ("file",)),),
          metavar="HOW"),
    Field("source_cache", "enum", "warm", "the file's page cache as the vCPUs start: "
          "\"warm\" or \"cold\" (dropped with POSIX_FADV_DONTNEED)",
          choices=("warm", "cold"), applies=(("source", ("file",)),),
          metavar="STATE"),
    Field("touch_percent", "u32", 100, "the seeded share of each vCPU's pages the guest "
          "touches at all", min=1, max=100,
          metavar="PCT"),
    Field("access", "enum", "uniform", "\"uniform\": every touched page once per pass; "
          "\"zipf\": `accesses` draws from a Zipf distribution over the touched pages",
          choices=("uniform", "zipf"),
          metavar="MODEL"),
    Field("zipf_theta", "double", None, "the Zipf skew (0.99 is the usual one)", min=0.0,
          max=MAX_ZIPF_THETA, form="optional", applies=(("access", ("zipf",)),),
          metavar="THETA"),
    Field("accesses", "u64", None, "accesses per pass per vCPU (None: as many as it has "
          "touched pages)", min=1, max=LIMITS["MAX_ACCESSES"], form="optional",
          applies=(("access", ("zipf",)),),
          metavar="N"),
    Field("prefetch", "enum", "none", "install pages before the guest asks: \"none\", "
          "\"readahead\", \"background\" (a pusher thread, in address order) or \"replay\" "
          "(the pusher installs replay_from's pages in order)",
          choices=("none", "readahead", "background", "replay"),
          metavar="POLICY"),
    Field("prefetch_pages", "u32", 8, "readahead's window, in pages of the backing's page "
          "size", min=1, max=LIMITS["MAX_PREFETCH_PAGES"], applies=(("prefetch", ("readahead",)),),
          metavar="N"),
    Field("prefetch_bandwidth_mbps", "u64", 0, "the pusher's rate in 10^6 bits/s (0: as "
          "fast as it goes)", min=0, max=LIMITS["MAX_PREFETCH_BANDWIDTH_MBPS"],
          applies=(("prefetch", ("background", "replay")),),
          metavar="MBPS"),
    Field("replay_from", "pages", None, "replay's order: a path to a file "
          "Result.save_touch_order wrote, or a sequence of page indices; stored as a tuple",
          core="replay", form="page_list", applies=(("prefetch", ("replay",)),),
          metavar="PATH"),
    Field("preinstall", "pages", None, "pages installed from the page source before the "
          "vCPUs start, which never fault (a migration's pre-copied pages): a path to a "
          "file as replay_from takes, or a sequence of page indices; stored as a tuple. "
          "uffd_mode \"missing\" with resolve \"copy\", from source \"file\" or from "
          "source \"remote\"'s local copy (source_path)", form="page_list",
          applies=(("uffd_mode", ("missing",)),),
          cli=(), cli_why="the Python API's (uffdkvm.migrate() sets it for the destination)"),
    Field("remote_transport", "enum", "unix", "how the readers reach the page server: "
          "\"unix\" or \"tcp\" (loopback)", choices=("unix", "tcp"), core=None,
          applies=_REMOTE_ONLY,
          metavar="HOW"),
    Field("remote_latency_us", "u32", 0, "the page server's time from taking up a request "
          "to its reply", min=0, max=LIMITS["MAX_REMOTE_LATENCY_US"], core=None,
          applies=_REMOTE_ONLY,
          metavar="USEC"),
    Field("remote_bandwidth_mbps", "u64", 0, "the page server's one link, 10^6 bits/s (0: "
          "unlimited)", min=0, max=LIMITS["MAX_REMOTE_BANDWIDTH_MBPS"], core=None,
          applies=_REMOTE_ONLY,
          metavar="MBPS"),
    Field("max_inflight", "u32", 0, "requests the page server serves at once (0: no cap)",
          min=0, max=LIMITS["MAX_INFLIGHT"], core=None, applies=_REMOTE_ONLY,
          metavar="N"),
    Field("write_set", "enum", "fixed", "which pages a pass writes, with write_percent below "
          "100: \"fixed\" (the same pages every pass) or \"per_pass\" (each pass draws its "
          "own, seeded by the pass number: a dirty set that moves)",
          choices=("fixed", "per_pass"),
          cli=("dirty-log",), metavar="WHICH"),
    Field("dirty_tracking", "enum", None, "track the pages each pass writes after the first "
          "(docs/dirty-tracking.md): \"bitmap\" (KVM_GET_DIRTY_LOG), \"bitmap_manual\" "
          "(MANUAL_DIRTY_LOG_PROTECT2 with INITIALLY_SET, KVM_CLEAR_DIRTY_LOG), \"ring\" "
          "(the dirty ring) or \"wp_async\" (userfaultfd WP_ASYNC and PAGEMAP_SCAN; "
          "uffd_mode None); None: off. Needs passes >= 2: pass 1 populates",
          choices=("none", "bitmap", "bitmap_manual", "ring", "wp_async"), c_prefix="DIRTY",
          form="none_choice",
          cli=("dirty-log", "migrate"), flags=("--tracking",), metavar="HOW"),
    Field("dirty_clear_pages", "u32", 0, "bitmap_manual: KVM_CLEAR_DIRTY_LOG in chunks of "
          "this many 4 KiB pages, a multiple of 64 (0: the whole memslot at once, as "
          "dirty_log_perf_test)", min=0, max=LIMITS["MAX_DIRTY_CLEAR_PAGES"],
          applies=(("dirty_tracking", ("bitmap_manual",)),),
          cli=("dirty-log",), metavar="N"),
    Field("dirty_ring_entries", "u32", 4096, "ring: each vCPU's dirty ring, in entries of "
          "16 bytes (a power of two, at least a page's worth: 256; the host's "
          "KVM_CAP_DIRTY_LOG_RING caps the bytes)",
          min=256, max=LIMITS["MAX_DIRTY_RING_ENTRIES"],
          applies=(("dirty_tracking", ("ring",)),),
          cli=("dirty-log", "migrate"), metavar="N"),
    Field("migration", "enum", None, "the source side of a live migration, which "
          "uffdkvm.migrate() sets (docs/migration.md): \"precopy\", \"postcopy\" or "
          "\"hybrid\"; None: an ordinary run. After pass 1 the guest keeps walking while "
          "the host sends its pages over the modelled link, then stops at a pass's end",
          choices=("none", "precopy", "postcopy", "hybrid"), c_prefix="MIGRATION",
          form="none_choice",
          cli=(), cli_why="uffdkvm migrate's --mode"),
    Field("max_rounds", "u32", 30, "precopy: the rounds at most; a dirty set that never "
          "fits downtime_target_ms is sent with the vCPUs stopped after the last "
          "(converged False)", min=1, max=LIMITS["MAX_MIGRATION_ROUNDS"],
          applies=_PRECOPY_ONLY,
          cli=("migrate",), metavar="N"),
    Field("downtime_target_ms", "u32", 300, "precopy: switch over once the pages still "
          "dirty can be sent in this long at link_bandwidth_mbps, with link_latency_us "
          "(QEMU's downtime-limit)", min=0, max=LIMITS["MAX_DOWNTIME_TARGET_MS"],
          applies=_PRECOPY_ONLY,
          cli=("migrate",), metavar="MS"),
    Field("precopy_rounds", "u32", 1, "hybrid: the pre-copy rounds before the switch-over; "
          "what is still dirty then is post-copied", min=1,
          max=LIMITS["MAX_MIGRATION_ROUNDS"], applies=(("migration", ("hybrid",)),),
          cli=("migrate",), metavar="N"),
    Field("link_bandwidth_mbps", "u64", 1000, "the migration link, 10^6 bits/s: the source "
          "paces its sends to it, and the destination's page server serves post-copy "
          "faults over it (0: unlimited)", min=0,
          max=LIMITS["MAX_REMOTE_BANDWIDTH_MBPS"], applies=_MIGRATING,
          cli=("migrate",), metavar="MBPS"),
    Field("link_latency_us", "u32", 0, "the migration link's one-way latency: a page "
          "arrives this long after it is sent, and each post-copy fetch waits it",
          min=0, max=LIMITS["MAX_REMOTE_LATENCY_US"], applies=_MIGRATING,
          cli=("migrate",), metavar="USEC"),
    Field("migration_dump_path", "string", None, "where the source writes its memory at "
          "the stop, the destination's page source (migrate() makes one in a private "
          "temporary directory; guest memory: keep it private)", form="path",
          size="SOURCE_PATH_MAX", applies=_MIGRATING,
          cli=(), cli_why="uffdkvm.migrate()'s (a private temporary directory)"),
    Field("auto_converge", "bool", False, "precopy and hybrid: throttle the source's "
          "vCPUs after each round whose dirty set is over half of what it sent, as "
          "QEMU's auto-converge does (docs/migration.md); needs a second round "
          "(max_rounds or precopy_rounds >= 2)", applies=_PRECOPYING,
          cli=("migrate",)),
    Field("throttle_initial_percent", "u32", 20, "auto_converge: the share of each vCPU's "
          "time taken from the guest at the first throttle (QEMU's cpu-throttle-initial)",
          min=1, max=99, applies=_PRECOPYING,
          cli=("migrate",), flags=("--throttle-initial",), metavar="PCT"),
    Field("throttle_increment_percent", "u32", 10, "auto_converge: added at each later "
          "throttle (QEMU's cpu-throttle-increment)", min=1, max=99, applies=_PRECOPYING,
          cli=("migrate",), flags=("--throttle-increment",), metavar="PCT"),
    Field("throttle_max_percent", "u32", 99, "auto_converge: the throttle at most "
          "(QEMU's max-cpu-throttle)", min=1, max=99, applies=_PRECOPYING,
          cli=("migrate",), flags=("--throttle-max",), metavar="PCT"),
)

#: The subcommands that build flags of their own from entries (Field.cli).
CLI_COMMANDS = ("dirty-log", "migrate")

BY_NAME = {f.name: f for f in FIELDS}
CONFIG_FIELDS = tuple(f for f in FIELDS if f.config)
CORE_FIELDS = tuple(f for f in FIELDS if f.core_name is not None)
BY_CORE_NAME = {f.core_name: f for f in CORE_FIELDS}


def choices(name: str) -> tuple[str, ...]:
    """A choice field's names as Config takes them (uffd_mode: without "none")."""
    f = BY_NAME[name]
    return tuple(c for c in f.choices if not (f.form == "none_choice" and c == "none"))


def python_value(f: Field, choice: str) -> Any:
    """An enum name as the Python user writes it (uffd_mode's "none": None)."""
    return None if f.form == "none_choice" and choice == "none" else choice


def to_core_value(f: Field, value: Any) -> Any:
    """value, in the stored Python form, as the core holds it. For
    pin_readers, wait and timeout_s the Config's derived value is meant
    (core_config passes Config.reader_cpus, Config.reader_wait and
    Config.effective_timeout_s)."""
    if f.kind == "enum":
        return f.choices.index("none" if value is None else value)
    if f.form == "page_size":
        return GUEST_PAGE_SIZES[value]
    if f.form == "seconds":
        if value is None or value == float("inf") or value * 1e9 >= _U64_MAX:
            return 0  # the core's "no limit"
        return max(1, int(value * 1e9))
    if f.kind == "bool":
        return bool(value)
    if f.kind == "double":
        return float(value or 0.0)
    if f.kind == "string":
        return value or ""
    if f.kind in ("cpus", "pages"):
        return list(value or ())
    if f.form == "optional":
        return value or 0
    return value


def python_repr(f: Field, value: Any) -> str:
    """How the docs and the messages spell a stored Python value."""
    if f.form == "size" and isinstance(value, int):
        for unit, size in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
            if value % size == 0:
                return repr(f"{value // size}{unit}")
    return repr(value)


# ---- the generator ----

ROOT = Path(__file__).resolve().parent.parent
HEADER = "csrc/config_schema.h"
CONFIG_PY = "uffdkvm/config.py"
CORE_PYI = "uffdkvm/_core.pyi"
CONFIG_MD = "docs/config.md"
COMMAND = "python tools/gen_schema.py --write"
BEGIN, END = "BEGIN GENERATED by uffdkvm/schema/fields.py", "END GENERATED"


def _c_number(value: int | float) -> str:
    if isinstance(value, float):
        return repr(value)
    return f"{value}ULL" if value > 0x7fffffff else str(value)


def _c_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _enumerator(f: Field, choice: str) -> str:
    return f"UKVM_{f.enum_prefix}_{choice.upper()}"


def _member(f: Field) -> list[str]:
    name = f.core_name
    if f.kind == "u32":
        return [f"uint32_t {name};"]
    if f.kind == "u64":
        return [f"uint64_t {name};"]
    if f.kind == "bool":
        return [f"bool {name};"]
    if f.kind == "double":
        return [f"double {name};"]
    if f.kind == "enum":
        return [f"enum ukvm_{f.enum_type} {name};"]
    if f.kind == "string":
        return [f"char {name}[UKVM_{f.size}];"]
    if f.kind == "cpus":
        return [f"uint32_t nr_{name};", f"const int32_t *{name};"]
    return [f"uint64_t nr_{name};", f"const uint64_t *{name};"]


def _wrap(text: str, width: int, indent: str) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent) or [indent]


def _applies_c(f: Field) -> str:
    """The applies rule as a C condition on c (a const struct ukvm_config *)
    that holds where the field may leave its default."""
    parts = []
    for other, values in f.applies:
        o = BY_NAME[other]
        parts.append("(" + " || ".join(f"c->{o.core_name} == {_enumerator(o, v)}"
                                       for v in values) + ")")
    return " && ".join(parts) or "1"


def applies_text(f: Field) -> str:
    """The rule as the user reads it: "resolver='readers'"."""
    out = []
    for other, values in f.applies:
        o = BY_NAME[other]
        out.append(" or ".join(f"{other}={python_repr(o, python_value(o, v))}" for v in values))
    return " and ".join(out)


def _comment(text: str) -> list[str]:
    """A C comment, wrapped to the tree's 100 columns."""
    lines = _wrap(text, 96, "")
    if len(lines) == 1:
        return [f"/* {lines[0]} */"]
    return ["/*", *(f" * {line}" for line in lines), " */"]


def header() -> str:
    """csrc/config_schema.h."""
    out = [
        "/* SPDX-License-Identifier: MIT */",
        "/*",
        f" * GENERATED by uffdkvm/schema/fields.py ({COMMAND}): do not edit.",
        " * Edit the field's entry in uffdkvm/schema/fields.py and run the command again;",
        " * tests/project/test_schema.py fails while this file is stale.",
        " *",
        " * The config's enums and their names, each backing's page size and the",
        " * guest's page sizes, struct ukvm_config's members (UKVM_CONFIG_MEMBERS),",
        " * the field table (UKVM_CONFIG_FIELDS) that the binding converts with and",
        " * the validator walks, and the limits the core and Python share. Included",
        " * by ukvm.h only.",
        " */",
        "#ifndef UKVM_CONFIG_SCHEMA_H",
        "#define UKVM_CONFIG_SCHEMA_H",
        "",
    ]
    out += _header_constants() + _header_enums() + _header_page_sizes()
    out.append("/* struct ukvm_config's members (ukvm.h), in the schema's order. */")
    out.append("#define UKVM_CONFIG_MEMBERS \\")
    for f in CORE_FIELDS:
        for line in _member(f):
            out.append(f"\t{line} \\")
    out.append("")
    out += _header_fields() + _header_applies()
    out.append("")
    out.append("#endif /* UKVM_CONFIG_SCHEMA_H */")
    return "\n".join(out) + "\n"


def _header_constants() -> list[str]:
    """config_schema.h's limits, and the list of them the binding exports."""
    out = []
    for name, value, comment in CONSTANTS:
        out += _comment(comment)
        out.append(f"#define UKVM_{name}\t{_c_number(value)}")
    out.append(f"#define UKVM_MAX_ZIPF_THETA\t{MAX_ZIPF_THETA!r}")
    out.append("")
    out.append("/* The integer limits above, for the binding to export: C(NAME, value). */")
    out.append("#define UKVM_CONFIG_CONSTANTS(C) \\")
    for name, _, _ in CONSTANTS:
        out.append(f"\tC({name}, UKVM_{name}) \\")
    out.append("")
    return out


def _header_enums() -> list[str]:
    """config_schema.h's enums, the list of them, and each one's names."""
    out = []
    enums = [f for f in CORE_FIELDS if f.kind == "enum"]
    for f in enums:
        out += _comment(f"{f.name}: {f.doc}")
        out.append(f"enum ukvm_{f.enum_type} {{")
        for i, c in enumerate(f.choices):
            out.append(f"\t{_enumerator(f, c)}{' = 0' if i == 0 else ''},")
        out.append(f"\tUKVM_{f.enum_prefix}__COUNT")
        out.append("};")
        out.append("")
    out.append("/*")
    out.append(" * Every enum of the config: X(type, field, PREFIX) for the name functions,")
    out.append(" * ukvm_<type>_name(), which config.c defines.")
    out.append(" */")
    out.append("#define UKVM_CONFIG_ENUMS(X) \\")
    for f in enums:
        out.append(f"\tX({f.enum_type}, {f.core_name}, {f.enum_prefix}) \\")
    out.append("")
    out.append("/* The names of each enum's values, in its order: V(ENUMERATOR, \"name\", "
               "\"Python's spelling\"). */")
    for f in enums:
        out.append(f"#define UKVM_{f.enum_prefix}_NAMES(V) \\")
        for c in f.choices:
            py = python_repr(f, python_value(f, c))
            out.append(f"\tV({_enumerator(f, c)}, {_c_string(c)}, {_c_string(py)}) \\")
        out.append("")
    return out


def _header_page_sizes() -> list[str]:
    """config_schema.h's page sizes: each backing's, and those the guest may map with."""
    out = []
    backing = BY_NAME["backing"]
    out += ["/*",
            " * Each backing and its properties (uffdkvm/schema/fields.py, Backing):",
            f" * B(ENUMERATOR, page size in bytes, {', '.join(BACKING_PROPERTIES)}).",
            " */",
            "#define UKVM_BACKINGS(B) \\"]
    for b in BACKINGS:
        props = ", ".join("true" if getattr(b, p) else "false" for p in BACKING_PROPERTIES)
        out.append(f"\tB({_enumerator(backing, b.name)}, {b.page_size}ULL, {props}) \\")
    out.append("")
    out.append("/* The backings with each property, as a message lists them. */")
    for prop in BACKING_PROPERTIES:
        names = _c_string(listed(backings_where(prop)))
        out.append(f"#define UKVM_BACKINGS_{prop.upper()}_NAMES\t{names}")
    out.append("")
    out.append("/* The page sizes the guest may map the region with: G(bytes, \"name\"). */")
    out.append("#define UKVM_GUEST_PAGE_SIZES(G) \\")
    for name, size in GUEST_PAGE_SIZES.items():
        out.append(f"\tG({size}ULL, {_c_string(name)}) \\")
    out.append("")
    out.append("/* Those names, as a message lists them. */")
    out.append(f"#define UKVM_GUEST_PAGE_SIZE_NAMES\t{_c_string(listed(tuple(GUEST_PAGE_SIZES)))}")
    out.append("")
    return out


def _c_default(f: Field) -> str:
    """A field's core default as C writes it (strings, CPU and page lists: 0, none)."""
    d = f.core_default
    if f.kind == "enum":
        return _enumerator(f, f.choices[d])
    if f.kind == "bool":
        return "true" if d else "false"
    if f.kind in ("string", "cpus", "pages"):
        return "0"
    return _c_number(d)


def _header_fields() -> list[str]:
    """config_schema.h's field table."""
    out = [
        "/*",
        " * The field table: X(KIND, member, \"name\", default, min, max, \"default\").",
        " * KIND: U32 U64 BOOL ENUM DOUBLE STRING CPUS PAGES; \"name\": the field as",
        " * Python names it; default: the core's; min, max: the range (DOUBLE: above",
        " * min, at most max, where it leaves its default; CPUS: each entry's; ENUM:",
        " * its values; 0, 0: none); \"default\": as the Python user writes it.",
        " */",
        "#define UKVM_CONFIG_FIELDS(X) \\",
    ]
    for f in CORE_FIELDS:
        lo = _c_number(f.min) if f.min is not None else "0"
        hi = _c_number(f.max) if f.max is not None else "0"
        if f.kind == "enum":
            lo, hi = "0", str(len(f.choices) - 1)
        if f.form == "optional" and f.kind == "u64":
            lo = "0"  # the core's 0 is Python's None
        pyd = "None" if f.default is None else python_repr(f, f.default)
        out.append(f"\tX({f.kind.upper()}, {f.core_name}, {_c_string(f.name)}, "
                   f"{_c_default(f)}, {lo}, {hi}, {_c_string(pyd)}) \\")
    return out


def _header_applies() -> list[str]:
    """config_schema.h's applies rules."""
    out = [
        "",
        "/*",
        " * The applies rules: A(KIND, member, \"name\", default, on, on_type, applies,",
        " * \"applies\", \"default\"): the member may leave its default only where the",
        " * condition applies (on c, the const struct ukvm_config * being checked)",
        " * holds; on is the enum member it looks at (of enum ukvm_<on_type>), and",
        " * \"applies\" the condition as the Python user writes it.",
        " */",
        "#define UKVM_CONFIG_APPLIES(A) \\",
    ]
    for f in CORE_FIELDS:
        if not f.applies:
            continue
        assert len(f.applies) == 1, f"{f.name}: one applies pair is what the core checks"
        on = BY_NAME[f.applies[0][0]]
        pyd = "None" if f.default is None else python_repr(f, f.default)
        out.append(f"\tA({f.kind.upper()}, {f.core_name}, {_c_string(f.name)}, "
                   f"{_c_default(f)}, {on.core_name}, {on.enum_type}, {_applies_c(f)}, "
                   f"{_c_string(applies_text(f))}, {_c_string(pyd)}) \\")
    return out


def _pyi_type(f: Field) -> str:
    """The constructor's annotation for a field: what Config takes."""
    if f.form == "size":
        return "SupportsIndex | str"
    if f.form == "page_size":
        return "SupportsIndex | str"
    if f.form in ("none_choice", "wait"):
        return "str | None"
    if f.form == "seconds":
        return "float | None"
    if f.form == "path":
        return "str | os.PathLike[str] | None"
    if f.form == "address":
        return "str | None"
    if f.form == "pin_readers" or f.kind == "cpus":
        return "CpuList | None"
    if f.form == "page_list":
        return "str | os.PathLike[str] | Iterable[SupportsIndex] | None"
    base = {"u32": "SupportsIndex", "u64": "SupportsIndex", "bool": "bool", "enum": "str",
            "double": "float"}[f.kind]
    return f"{base} | None" if f.form == "optional" else base


def stored_type(f: Field) -> str:
    """The annotation of what Config stores."""
    if f.form == "pin_readers":
        return "tuple[int, ...] | str | None"
    if f.kind in ("cpus", "pages"):
        return "tuple[int, ...] | None"
    if f.form in ("none_choice", "path", "address", "wait"):
        return "str | None"
    if f.form == "page_size":
        return "str"
    if f.form == "seconds":
        return "float | None"
    base = {"u32": "int", "u64": "int", "bool": "bool", "enum": "str", "double": "float",
            "string": "str"}[f.kind]
    return f"{base} | None" if f.form == "optional" else base


def config_section() -> str:
    """Between the markers in uffdkvm/config.py: the type checker's view of
    Config (its stored fields and its constructor)."""
    out = ["    if TYPE_CHECKING:",
           "        # What Config stores and what its constructor takes, for type checkers;",
           "        # at run time the dataclass fields come from uffdkvm/schema/fields.py.",
           ]
    for f in CONFIG_FIELDS:
        out.append(f"        {f.name}: {stored_type(f)}")
    out.append("")
    out.append("        def __init__(")
    out.append("            self,")
    for f in CONFIG_FIELDS:
        out.append(f"            {f.name}: {_pyi_type(f)} = ...,")
    out.append("        ) -> None: ...")
    return "\n".join(out) + "\n"


def pyi_section() -> str:
    """Between the markers in uffdkvm/_core.pyi: the constants add_constants exports."""
    out = []
    for f in CORE_FIELDS:
        if f.kind == "enum":
            out += [f"{f.enum_prefix}_{c.upper()}: int" for c in f.choices]
    out += [f"{name}: int" for name, _, _ in CONSTANTS]
    out.append("MAX_ZIPF_THETA: float")
    return "\n".join(out) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def docs_section() -> str:
    """Between the markers in docs/config.md: every field at a glance."""
    out = ["| field | takes | default | range | applies when | meaning |",
           "|---|---|---|---|---|---|"]
    for f in CONFIG_FIELDS:
        if f.kind == "enum":
            takes = ", ".join(f"`{python_repr(f, python_value(f, c))}`" for c in f.choices)
        elif f.form == "page_size":
            takes = ", ".join(f"`{k!r}`" for k in GUEST_PAGE_SIZES)
        else:
            takes = {"u32": "int", "u64": "int", "bool": "bool", "double": "float",
                     "string": "path", "cpus": "CPU list", "pages": "path or page list"}[f.kind]
            if f.form == "size":
                takes = "size"
            elif f.form == "seconds":
                takes = "seconds"
            elif f.form == "pin_readers":
                takes = "CPU list, `'vcpus'` or `'scheduler'`"
            if f.form == "optional":
                takes += " or None"
        rng = ""
        if f.min is not None and f.kind not in ("cpus",):
            rng = f"above {f.min:g}, at most {f.max:g}" if f.kind == "double" \
                else f"{f.min}-{f.max}"
        elif f.kind == "cpus":
            rng = f"each {f.min}-{f.max}"
        default = "None" if f.default is None else python_repr(f, f.default)
        side = "" if f.core_name else " (Python-side: the core never sees it)"
        out.append(f"| `{f.name}` | {takes} | `{default}` | {rng} | "
                   f"{_md(applies_text(f))} | {_md(f.doc)}{side} |")
    return "\n".join(out) + "\n"


def _splice(text: str, section: str, path: str, comment: str) -> str:
    begin, end = f"{comment} {BEGIN}", f"{comment} {END}"
    if comment == "<!--":
        begin, end = f"<!-- {BEGIN} -->", f"<!-- {END} -->"
    head, sep, rest = text.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise SystemExit(f"{path}: no {begin!r} ... {end!r} lines to write between")
    return f"{head}{begin}\n{section}{end}{tail}"


def generated(root: Path = ROOT) -> dict[str, str]:
    """Every generated file's path (from root) and the text it should hold."""
    out = {HEADER: header()}
    for path, section, comment in ((CONFIG_PY, config_section(), "    #"),
                                   (CORE_PYI, pyi_section(), "#"),
                                   (CONFIG_MD, docs_section(), "<!--")):
        out[path] = _splice((root / path).read_text(encoding="utf-8"), section, path, comment)
    return out
