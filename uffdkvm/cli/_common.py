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

from .._version import __version__
from ..config import BACKINGS, GUEST_PAGE_SIZES, PIN_WORDS, UFFD_MODES, parse_cpu_list
from ..errors import ConfigError, HostUnsupportedError, UffdkvmError
from ..progress import ConsoleProgress
from ..schema import fields as schema

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
    """-u: upstream's spelling, in any case; NONE is None."""
    v = value.strip().lower()
    if v == "none":
        return None
    if v in UFFD_MODES:
        return v
    raise argparse.ArgumentTypeError(
        f"invalid choice: {value!r} (choose from "
        f"{', '.join(repr(m.upper()) for m in (*UFFD_MODES, 'none'))})")


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


# ---- the run flags, from the schema ----

#: The converters a schema entry may name (Field.cli_type): the function,
#: whether a sweep takes a comma-separated list of it (CPU lists are one
#: value either way), and what the flag's help adds.
CONVERTERS: dict[str, tuple[Convert, bool, str]] = {
    "uffd_mode": (uffd_mode, True, ""),
    "backing": (backing, True, "upstream's names too (anonymous_hugetlb_2mb, "
                "anonymous_hugetlb_1gb); see --list-backings"),
    "cpus": (cpu_list, False, ""),
    "reader_pins": (reader_pins, False, ""),
}


def _shown(f: schema.Field, value: Any) -> str:
    """A value as the flag takes it: 1G, not '1G'."""
    return schema.python_repr(f, value).strip("'")


def field_help(f: schema.Field, default: Any = None) -> str:
    """A flag's help: the field's (or the flag's own) text, then its choices,
    range and default (the schema's, or the command's own where given),
    from the schema."""
    facts = []
    if f.kind == "enum" and f.cli_type != "uffd_mode":
        facts.append(f"one of {', '.join(schema.choices(f.name))}")
    elif f.form == "page_size":
        facts.append(f"one of {', '.join(GUEST_PAGE_SIZES)}")
    if f.min is not None and f.kind != "cpus":
        facts.append(f"above {f.min:g}, at most {f.max:g}" if f.kind == "double"
                     else f"{f.min}-{f.max}")
    default = f.default if default is None else default
    if default is not None and f.kind != "bool":
        facts.append(f"default {_shown(f, default)}")
    if f.applies:
        facts.append(f"only with {schema.applies_text(f)}")
    note = CONVERTERS[f.cli_type][2] if f.cli_type else ""
    text = (f.cli_help or f.doc) + (f"; {note}" if note else "")
    if facts:
        text += f" ({'; '.join(facts)})"
    return text.replace("%", "%%")


def field_argument(f: schema.Field, listed: Callable[[Convert], Convert]) -> dict[str, Any]:
    """add_argument's keywords for a Config field's flag."""
    if f.kind == "bool":
        return {"dest": f.name, "action": "store_true", "help": field_help(f)}
    kw: dict[str, Any] = {"dest": f.name, "metavar": f.metavar or None,
                          "help": field_help(f),
                          "default": f.default if f.form != "size" else _shown(f, f.default)}
    if f.cli_type:
        convert, lists, _ = CONVERTERS[f.cli_type]
        kw["type"] = listed(convert) if lists else convert
    elif f.kind == "enum":
        kw["type"] = listed(choice(schema.choices(f.name)))
    elif f.form == "page_size":
        kw["type"] = listed(choice(tuple(GUEST_PAGE_SIZES), str.upper))
    elif f.form == "size":
        kw["type"] = listed(str)
    elif f.form == "seconds" or f.kind == "double":
        kw["type"] = listed(float)
    elif f.kind in ("u32", "u64"):
        kw["type"] = listed(int)
    # strings (paths, addresses) and page lists: the text as given, one value either way
    return kw


def add_field_arguments(p: argparse.ArgumentParser, listed: Callable[[Convert], Convert],
                        groups: dict[str, Any] | None = None) -> None:
    """A flag for every Config field whose schema entry makes it a run flag
    (Field.cli "run"), in the schema's order; groups: where a field's flag
    goes instead of p (an argparse group)."""
    for f in schema.CONFIG_FIELDS:
        if f.run_flag:
            (groups or {}).get(f.name, p).add_argument(*f.option_strings,
                                                       **field_argument(f, listed))


#: add_field_argument's "not given": the schema's default.
SCHEMA_DEFAULT: Any = object()


def add_field_argument(container: Any, command: str, name: str, *,
                       default: Any = SCHEMA_DEFAULT, shown: Any = None,
                       dest: str | None = None) -> None:
    """A subcommand's own flag for a Config field whose entry names that
    command (Field.cli), built from the entry as the run flags are. default:
    the flag's, where the command's differs from the schema's (None: left
    to the function the command calls); shown: the default the help names,
    where that is neither."""
    f = schema.BY_NAME[name]
    assert command in f.cli, f"{name}: its schema entry does not name {command}"
    kw = field_argument(f, as_is)
    if default is not SCHEMA_DEFAULT:
        kw["default"] = default
    kw["help"] = field_help(f, shown if shown is not None else
                            (default if default is not SCHEMA_DEFAULT else None))
    if dest is not None:
        kw["dest"] = dest
    container.add_argument(*f.option_strings, **kw)


def add_run_arguments(p: argparse.ArgumentParser, listed: Callable[[Convert], Convert],
                      json_help: str) -> None:
    """The run command's flags: every Config field's that the schema gives
    one (add_field_arguments), and the command line's own. ``listed`` wraps
    the type of every flag that sets one Config field: the identity for a
    run, a comma-separated list for a sweep. CPU lists (-c, --pin-*) are one
    value either way."""
    p.add_argument("--version", action="version", version=f"uffdkvm {__version__}")
    p.add_argument("-m", dest="guest_modes", type=guest_mode, action="append", metavar="MODE",
                   help=f"upstream's guest mode ID; uffdkvm runs mode {GUEST_MODE} only "
                   f"({GUEST_MODES[GUEST_MODE]}), x86-64's, the default")
    pins = p.add_mutually_exclusive_group()
    pins.add_argument("-c", dest="cpus", type=cpu_list, default=None, metavar="CPULIST",
                      help="pin vCPU i to the i-th CPU, e.g. 0,1 for 2 vCPUs; one more entry "
                      "pins the main thread (and the readers it starts), as upstream does")
    add_field_arguments(p, listed, {"pin_vcpus": pins})
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


def alone(prog: str, parser: dict[str, Any],
          add_arguments: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    """A command's parser on its own (prog "uffdkvm NAME"), as uffdkvm's
    parser holds it as a subcommand: for callers that parse only its flags."""
    p = argparse.ArgumentParser(prog=prog, **parser)
    add_arguments(p)
    return p


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
