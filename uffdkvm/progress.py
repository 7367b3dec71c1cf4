"""Live progress of a run: what run(progress=...) reports, and two displays.

The counts come from the guest itself: its page walk publishes its step in
the vCPU's args page every 256 pages and at each pass's end
(csrc/kvm/guest_abi.h, GA_STEP), which the core reads while the vCPUs run.
So ``pages_done`` is pages the guest has touched, every pass counted, to the
last 256, not faults resolved.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from .errors import ConfigError

# How often a callback hears about a run (the core offers a report every 50 ms).
INTERVAL_S = 0.25


@dataclass(frozen=True)
class Progress:
    """One report on a running experiment.

    phase: what the core is doing ("setting up", "running", "verifying",
    "releasing"), and in the last report "done" (the Result exists, its
    counts are these) or "failed" (run() is raising).
    pages_done / pages_total: per vCPU, pages touched so far and in all
    (all passes). elapsed_s: since run() was called.
    """

    phase: str
    pages_done: tuple[int, ...]
    pages_total: tuple[int, ...]
    elapsed_s: float

    @property
    def done(self) -> int:
        return sum(self.pages_done)

    @property
    def total(self) -> int:
        return sum(self.pages_total)

    @property
    def fraction(self) -> float:
        """0.0 to 1.0; 0.0 while the total is not known yet."""
        return self.done / self.total if self.total else 0.0


ProgressCallback = Callable[[Progress], object]


class _Reporter:
    """Adapts the core's reports (every 50 ms, totals 0 outside the walk) to
    a callback: throttled to INTERVAL_S, counts that never go back."""

    def __init__(self, callback: ProgressCallback, vcpus: int) -> None:
        self.callback = callback
        self.start = time.monotonic()
        self.last_call = -INTERVAL_S
        self.done = [0] * vcpus
        self.total = [0] * vcpus
        self.phase = ""

    def __call__(self, phase: str, done: list[int], total: list[int]) -> None:
        if any(total):
            self.total = list(total)
            self.done = [max(a, b) for a, b in zip(self.done, done, strict=True)]
        now = time.monotonic()
        if phase == self.phase and now - self.last_call < INTERVAL_S:
            return
        self.phase = phase
        self.last_call = now
        self.callback(self._report(phase, now))

    def fail(self) -> None:
        """The last report of a run that raises (also when the callback's own
        exception, or Ctrl-C inside it, ended the run: a display still clears
        its line); its own errors give way to the run's."""
        try:
            self.callback(self._report("failed", time.monotonic()))
        except Exception:
            pass

    def finish(self, pages: list[int]) -> None:
        """The last report: the Result's own page counts."""
        self.done = list(pages)
        self.total = [max(t, p) for t, p in zip(self.total, pages, strict=True)]
        self.callback(self._report("done", time.monotonic()))

    def _report(self, phase: str, now: float) -> Progress:
        return Progress(phase, tuple(self.done), tuple(self.total), now - self.start)


class ConsoleProgress:
    """A one-line display on a terminal stream (stderr by default), redrawn in
    place: ``running  12.3 s  40%  131072/327680 pages  (slowest vCPU 38%)``.

    delay_s: draw nothing until the run has gone on this long, so that short
    runs leave no trace (the command line waits 2 s).
    """

    def __init__(self, stream: IO[str] | None = None, delay_s: float = 0.0) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.delay_s = delay_s
        self.width = 0

    def __call__(self, p: Progress) -> None:
        if p.phase in ("done", "failed"):
            self.close()
            return
        if p.elapsed_s < self.delay_s:
            return
        line = f"{p.phase:<12} {p.elapsed_s:6.1f} s"
        if p.total:
            slowest = min(d / t for d, t in zip(p.pages_done, p.pages_total, strict=True) if t)
            line += (f"  {100 * p.fraction:3.0f}%  {p.done}/{p.total} pages"
                     f"  (slowest vCPU {100 * slowest:.0f}%)")
        # Wider than the terminal, each redraw would wrap onto a new line.
        line = line[:max(20, self._columns() - 1)]
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()
        self.width = len(line)

    def _columns(self) -> int:
        """The stream's terminal width (80 when it is not a terminal)."""
        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, ValueError, OSError):
            return 80

    def close(self) -> None:
        if self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0


class TqdmProgress:
    """A tqdm bar (tqdm.auto: a widget in notebooks) over all vCPUs' pages."""

    def __init__(self, **tqdm_args: Any) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=0, unit="page", unit_scale=True, **tqdm_args)

    def __call__(self, p: Progress) -> None:
        if p.total and self.bar.total != p.total:
            self.bar.total = p.total
        self.bar.set_description(p.phase, refresh=False)
        self.bar.update(p.done - self.bar.n)
        if p.phase in ("done", "failed"):
            self.bar.close()


def make_callback(progress: bool | ProgressCallback | None) -> ProgressCallback | None:
    """run()'s progress argument as a callback: True means a tqdm bar where
    tqdm is installed, else the console line on stderr."""
    if progress is None or progress is False:
        return None
    if progress is True:
        try:
            return TqdmProgress()
        except ImportError:
            return ConsoleProgress()
    if not callable(progress):
        raise ConfigError(f"progress: expected True, False, None or a callable taking a "
                          f"uffdkvm.Progress, got {type(progress).__name__}")
    return progress
