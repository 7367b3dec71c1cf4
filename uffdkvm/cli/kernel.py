"""``uffdkvm kernel``: the run and sweep commands in another kernel, and A/B
between two kernels, booted under QEMU (uffdkvm.kernels).

    uffdkvm kernel list
    uffdkvm kernel run 6.18 -v 2 -b 16M
    uffdkvm kernel sweep ~/linux/arch/x86/boot/bzImage:/tmp/mods -r 1,2 --trials 3
    uffdkvm kernel compare 6.12 7.2 -b 16M --trials 9 --fail-if worse

KERNEL is a Debian kernel's name (uffdkvm kernel list), a bzImage's path
(what the guest needs built in), or IMAGE:MODULES with the tree that `make
modules_install INSTALL_MOD_PATH=MODULES` filled.
"""
from __future__ import annotations

import argparse
import inspect
import json
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from .. import kernels
from ..config import Config
from ..errors import ConfigError
from ..kernels import _debian, _guest, _qemu
from ..testing import Comparison, _check_fraction
from . import run as cli_run
from . import sweep as cli_sweep
from ._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    MAIN_CPU_IN_GUEST,
    CliError,
    add_run_arguments,
    alone,
    as_is,
    guarded,
    pop_cli_options,
    split_pins,
)

NAME = "kernel"
PROG = f"uffdkvm {NAME}"
HELP = "run, sweep or compare in another kernel, booted under QEMU"
# compare's flags take their defaults where they are declared.
COMPARE_DEFAULTS = {
    **{name: p.default for name, p in inspect.signature(kernels.compare).parameters.items()
       if name in ("trials", "warmup")},
    "tolerance": inspect.signature(Comparison.verdict).parameters["tolerance"].default}
KERNEL_HELP = (f"a Debian kernel ({', '.join(kernels.DEBIAN_KERNELS)}: uffdkvm kernel "
               f"list), a bzImage's path, or IMAGE:MODULES with its module tree (the "
               f"INSTALL_MOD_PATH of make modules_install)")
VERDICTS = ("worse", "better", "same", "unclear")


def _guest_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the guest (QEMU)")
    g.add_argument("--accel", choices=_qemu.ACCELS, default="auto",
                   help="kvm: the guest's KVM nested on this host's; tcg: emulated (only "
                        "ratios mean anything); auto: kvm where this host's KVM nests "
                        "(default auto)")
    g.add_argument("--guest-memory", type=int, default=_guest.MEMORY_MIB, metavar="MIB",
                   help="the guest's memory in MiB (default %(default)s)")
    g.add_argument("--guest-cpus", type=int, default=_guest.CPUS, metavar="N",
                   help="the guest's CPUs (default %(default)s)")
    g.add_argument("--guest-hugepages", type=int, default=0, metavar="N",
                   help="2 MiB huge pages the guest reserves (default 0)")
    g.add_argument("--guest-gigantic-pages", type=int, default=0, metavar="N",
                   help="1 GiB pages the guest reserves at boot (default 0)")
    g.add_argument("--call-timeout", type=float, default=_guest.CALL_TIMEOUT_S, metavar="S",
                   help="seconds one run may take in the guest (default %(default)g)")


def _guest_options(fields: dict[str, Any]) -> dict[str, Any]:
    return {"accel": fields.pop("accel"), "memory_mib": fields.pop("guest_memory"),
            "cpus": fields.pop("guest_cpus"), "hugepages": fields.pop("guest_hugepages"),
            "gigantic_pages": fields.pop("guest_gigantic_pages"),
            "call_timeout_s": fields.pop("call_timeout")}


PARSER: dict[str, Any] = dict(
    description="Run uffdkvm's experiments in another kernel, booted under "
    "QEMU with this host's / as its root (read-only): Debian's own kernels, fetched "
    "with apt, or one you built. Each command's output is what it prints here, from "
    "the guest; under TCG (no KVM that nests here) every rate is the emulator's, and "
    "only ratios between runs mean anything.",
    epilog=EXIT_STATUS_HELP + " A kernel that cannot be had (not in Debian's archive "
    "any more, no network, no QEMU) exits 4, saying why.")


def build_parser() -> argparse.ArgumentParser:
    return alone(PROG, PARSER, add_arguments)


def add_arguments(p: argparse.ArgumentParser) -> None:
    # Plain parsers below (not uffdkvm's, which hand a subcommand's flags over
    # as one value): this command reads its subcommand's flags beside its own.
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=argparse.ArgumentParser)
    sub.add_parser("list", help="Debian's kernels by name, what each tracks, and which "
                   "are fetched")

    run = sub.add_parser("run", help="one experiment in KERNEL: the run command's flags "
                         "(uffdkvm --help)")
    run.add_argument("kernel", metavar="KERNEL", help=KERNEL_HELP)
    _guest_arguments(run)
    add_run_arguments(run, as_is, "print the whole result as one line of JSON")

    sweep = sub.add_parser("sweep", help="a sweep in KERNEL: the sweep command's flags "
                           "(uffdkvm sweep --help)")
    sweep.add_argument("kernel", metavar="KERNEL", help=KERNEL_HELP)
    _guest_arguments(sweep)
    cli_sweep.add_arguments(sweep)

    compare = sub.add_parser("compare", help="one experiment in kernel A and in kernel B, "
                             "interleaved trials, B / A with its interval and a verdict")
    compare.add_argument("a", metavar="A", help="the kernel compared against: " + KERNEL_HELP)
    compare.add_argument("b", metavar="B", help="the kernel compared")
    _guest_arguments(compare)
    c = compare.add_argument_group("the comparison (uffdkvm.testing.compare)")
    c.add_argument("--trials", type=int, default=COMPARE_DEFAULTS["trials"], metavar="N",
                   help="pairs of runs, A then B or B then A (default %(default)s)")
    c.add_argument("--warmup", type=int, default=COMPARE_DEFAULTS["warmup"], metavar="N",
                   help="pairs run first and thrown away (default %(default)s)")
    c.add_argument("--metric", default="pages_per_s", metavar="NAME",
                   help="pages_per_s (default), overhead_ns_per_page, or a numeric Result "
                        "attribute with --higher-is-better or --lower-is-better")
    better = c.add_mutually_exclusive_group()
    better.add_argument("--higher-is-better", dest="higher_is_better", action="store_true",
                        default=None)
    better.add_argument("--lower-is-better", dest="higher_is_better", action="store_false")
    c.add_argument("--tolerance", type=float, default=COMPARE_DEFAULTS["tolerance"],
                   metavar="F",
                   help="the difference the verdict ignores, a fraction (default %(default)s)")
    c.add_argument("--fail-if", choices=VERDICTS, action="append", default=[],
                   help="exit 1 when the verdict is this (repeatable), as a CI gate: "
                        "--fail-if worse")
    add_run_arguments(compare, as_is, "print the comparison as one line of JSON")


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``uffdkvm kernel`` once its flags are parsed: returns its exit status."""
    # SIGTERM (a CI job cancelled, `kill`) ends the command as an exception
    # does, so that the guest is powered off (Python's default would skip
    # every cleanup and leave QEMU running). Only where signals can be set.
    if threading.current_thread() is not threading.main_thread():
        return guarded(PROG, argv, lambda: _command(vars(args)))
    before = signal.signal(signal.SIGTERM, _terminated)
    try:
        return guarded(PROG, argv, lambda: _command(vars(args)))
    finally:
        signal.signal(signal.SIGTERM, before)


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _command(fields: dict[str, Any]) -> int:
    command = fields.pop("command")
    if command == "list":
        print(_list())
        return EXIT_OK
    if command == "compare":
        return _compare(fields)
    options = _guest_options(fields)
    kernel = fields.pop("kernel")

    def boot() -> kernels.Guest:
        guest = kernels.Guest(kernel, **options)
        print(f"{PROG}: in {guest.kernel} under {guest.accel}"
              + ("; emulated: compare rates with each other only" if guest.accel.emulated
                 else ""), file=sys.stderr, flush=True)
        return guest
    # Each command checks its flags first, then boots.
    if command == "run":
        return cli_run.run_fields(fields, boot)
    return cli_sweep.sweep_fields(fields, boot)


def _list() -> str:
    lines = []
    for name, track in kernels.DEBIAN_KERNELS.items():
        have = _debian.fetched(name)
        lines.append(f"{name:10} {track} ({track.about}); "
                     + (f"fetched: {have.release}" if have else "not fetched yet"))
    lines.append(f"fetched into {kernels.cache_dir()} (UFFDKVM_KERNEL_CACHE); a kernel you "
                 f"built: its bzImage's path, or IMAGE:MODULES")
    return "\n".join(lines)


def _compare(fields: dict[str, Any]) -> int:
    options = _guest_options(fields)
    a, b = fields.pop("a"), fields.pop("b")
    trials, warmup, metric = fields.pop("trials"), fields.pop("warmup"), fields.pop("metric")
    higher, tolerance = fields.pop("higher_is_better"), fields.pop("tolerance")
    fail_if = fields.pop("fail_if")
    try:
        _check_fraction("tolerance", tolerance)
    except ConfigError as e:
        raise CliError(f"--{e}") from None
    pop_cli_options(fields)
    as_json = fields.pop("json")
    fields.pop("quiet")
    if fields.pop("list_backings"):
        raise CliError("--list-backings: use uffdkvm kernel run KERNEL --list-backings")
    cpus = fields.pop("cpus")
    if cpus is not None:
        fields["pin_vcpus"], main_cpu = split_pins(cpus, fields["vcpus"])
        if main_cpu is not None:
            raise CliError(MAIN_CPU_IN_GUEST)
    config = Config(**fields)
    c = kernels.compare(a, b, config, metric, trials, warmup=warmup,
                        higher_is_better=higher, **options)
    verdict = c.verdict(tolerance)
    if as_json:
        print(json.dumps({"kernel_a": c.kernel_a, "kernel_b": c.kernel_b,
                          "release_a": c.release_a, "release_b": c.release_b, "accel": c.accel,
                          "metric": c.metric, "a": c.a, "b": c.b, "ratio": c.ratio,
                          "ci_low": c.ci_low, "ci_high": c.ci_high,
                          "confidence": c.confidence, "tolerance": tolerance,
                          "verdict": verdict}))
    else:
        print(c.table())
        print(f"verdict: {verdict}: {c.verdict_line(tolerance)}")
    return EXIT_FAILED if verdict in fail_if else EXIT_OK
