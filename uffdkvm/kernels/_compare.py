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
from collections.abc import Iterator
from typing import Any

from ..config import Config
from ..testing import Comparison, _check_args, _check_metric, _interleaved
from ._guest import Guest


@dataclasses.dataclass(frozen=True)
class KernelComparison(Comparison):
    """A :class:`uffdkvm.testing.Comparison` of one config in two kernels:
    ``a`` and ``b`` are the two kernels' values per trial.

    kernel_a, kernel_b  each kernel's name and release
    accel               how QEMU ran them: "kvm" or "tcg" (emulated)
    accel_why           why that one
    """
    kernel_a: str
    kernel_b: str
    accel: str
    accel_why: str

    def table(self) -> str:
        lines = [f"a: {self.kernel_a}", f"b: {self.kernel_b}",
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
    "better" or "same" for b against a.
    """
    if config is None:
        config = Config()
    better = _check_metric(metric, higher_is_better)
    _check_args(config, config, trials, warmup, None, None, seed, metric)
    with _booted([a, b], guest) as (guest_a, guest_b):
        c = _interleaved(config, config, metric, better, trials, warmup, seed,
                         run_a=guest_a.run, run_b=guest_b.run)
        return KernelComparison(
            **{f.name: getattr(c, f.name) for f in dataclasses.fields(Comparison)},
            kernel_a=f"{guest_a.kernel.name} ({guest_a.release})",
            kernel_b=f"{guest_b.kernel.name} ({guest_b.release})",
            accel=guest_a.accel.name, accel_why=guest_a.accel.why)


@contextlib.contextmanager
def _booted(kernels: list[Any], options: dict[str, Any]) -> Iterator[list[Guest]]:
    """A Guest for each kernel: one given, as it is; else one booted for the
    comparison alone. They boot side by side (each mostly one CPU's work);
    whatever happens, the ones booted here are powered off at the end."""
    booted: list[Guest] = []
    try:
        guests = []
        for k in kernels:
            if isinstance(k, Guest):
                guests.append(k)
            else:
                booted.append(Guest(k, **options, _started_only=True))
                guests.append(booted[-1])
        for g in booted:
            g._until_ready()
        yield guests
    finally:
        for g in booted:
            g.shutdown(wait=False, cancel_futures=True)
