"""A/B between kernels: one experiment in two kernels, interleaved.

Both kernels are booted (two Guests) and stay up; the trials alternate
between them as uffdkvm.testing.compare alternates two configs (A B, B A,
...: drift of the host hits both alike), and the statistic is the same:
the median of the per-pair ratios B / A with its bootstrap interval. Under
TCG the absolute values are the emulator's: only the ratio means anything,
and the table says so.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from ..config import Config
from ..errors import ConfigError, RunError
from ..result import Result
from ..testing import Comparison, _check_args, _check_metric, _interleaved
from ._guest import Guest


@dataclasses.dataclass(frozen=True)
class KernelComparison(Comparison):
    """A :class:`uffdkvm.testing.Comparison` of one config in two kernels:
    ``a`` and ``b`` are the two kernels' values per trial.

    kernel_a, kernel_b    each kernel's name (a Debian name, or the release
                          of a kernel brought)
    release_a, release_b  the ``uname -r`` every one of that side's runs
                          reported (Result.host.kernel_release)
    accel                 how QEMU ran them: "kvm" or "tcg" (emulated)
    accel_why             why that one
    """
    kernel_a: str
    kernel_b: str
    release_a: str
    release_b: str
    accel: str
    accel_why: str

    def table(self) -> str:
        lines = [f"a: {self.kernel_a} ({self.release_a})",
                 f"b: {self.kernel_b} ({self.release_b})",
                 f"under QEMU {self.accel.upper()} ({self.accel_why})"]
        if self.accel == "tcg":
            lines.append("emulated: absolute values are the emulator's; only b / a means "
                         "anything")
        return "\n".join(lines) + "\n" + super().table()


def compare(a: Any, b: Any, config: Config | None = None, metric: str = "pages_per_s",
            trials: int = 9, *, warmup: int = 1, seed: int | None = None,
            higher_is_better: bool | None = None, **guest: Any) -> KernelComparison:
    """Runs ``config`` (default: Config()) in kernel ``a`` and in kernel
    ``b``, ``trials`` interleaved pairs, and compares ``metric`` as
    uffdkvm.testing.compare does (the same metrics, the same statistic).

    a, b        Debian kernel names, bzImage paths (or IMAGE:MODULES),
                Kernels, or Guests already booted (left running)
    guest       Guest's options for the kernels it boots (accel,
                memory_mib, cpus, hugepages, gigantic_pages,
                call_timeout_s, boot_timeout_s)
    the rest    as uffdkvm.testing.compare

    Returns a KernelComparison; ``.verdict(tolerance)`` says "worse",
    "better", "same" or "unclear" for b against a. Both sides run on one
    accelerator (KVM against TCG would compare the emulator).
    """
    if config is None:
        config = Config()
    better = _check_metric(metric, higher_is_better)
    _check_args(config, config, trials, warmup, None, None, seed, metric)
    with _booted([a, b], guest) as (guest_a, guest_b):
        run_a, releases_a = _recording(guest_a)
        run_b, releases_b = _recording(guest_b)
        c = _interleaved(config, config, metric, better, trials, warmup, seed,
                         run_a=run_a, run_b=run_b)
        return KernelComparison(
            **{f.name: getattr(c, f.name) for f in dataclasses.fields(Comparison)},
            kernel_a=guest_a.kernel.name, kernel_b=guest_b.kernel.name,
            release_a=_one(releases_a, "a"), release_b=_one(releases_b, "b"),
            accel=guest_a.accel.name, accel_why=guest_a.accel.why)


def _recording(guest: Guest) -> tuple[Callable[[Config], Result], set[str]]:
    """guest.run, noting the kernel release each Result says it ran on."""
    releases: set[str] = set()

    def run(config: Config) -> Result:
        r = guest.run(config)
        releases.add(r.host.kernel_release if r.host is not None else "")
        return r
    return run, releases


def _one(releases: set[str], side: str) -> str:
    if len(releases) != 1:
        raise RunError(f"the runs of side {side} reported kernels {sorted(releases)}, "
                       f"not one")
    return releases.pop()


@contextlib.contextmanager
def _booted(kernels: list[Any], options: dict[str, Any]) -> Iterator[list[Guest]]:
    """A Guest for each kernel: one given, as it is; else one booted for the
    comparison alone. They boot side by side (each mostly one CPU's work);
    whatever happens, the ones booted here are powered off at the end."""
    booted: list[Guest] = []
    try:
        if options and all(isinstance(k, Guest) for k in kernels):
            raise ConfigError(f"{', '.join(sorted(options))}: Guest options apply to the "
                              f"kernels compare() boots, and a and b are both Guests "
                              f"booted already", field=sorted(options)[0])
        guests = []
        for k in kernels:
            if isinstance(k, Guest):
                guests.append(k)
            else:
                booted.append(Guest(k, **options, _started_only=True))
                guests.append(booted[-1])
        for g in booted:
            g._until_ready()
        if guests[0].accel.name != guests[1].accel.name:
            raise ConfigError(f"accel: a runs under {guests[0].accel} and b under "
                              f"{guests[1].accel}: a ratio between them is the "
                              f"accelerator's; boot both with one accel", field="accel")
        yield guests
    finally:
        for g in booted:
            g.shutdown(wait=False, cancel_futures=True)
