"""Latency histograms: what the C core counts, with the questions you ask of it."""
from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ConfigError, ResultError


@dataclass(frozen=True)
class Histogram:
    """Counts of values in buckets: bucket i holds [bounds[i], bounds[i+1]).

    The core's latency histograms (nanoseconds) are exact below 16 ns and
    have four buckets per power of two above, so percentile() is within 25%;
    the guest's access histograms (guest_timing) have one per power of two.
    count, sum, min and max are exact where the source kept them.

        h.count, h.mean, h.percentile(99), h.max
        h1 + h2                   # the same buckets, merged
    """

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    count: int
    sum: float
    min: float
    max: float
    unit: str = "ns"

    def __post_init__(self) -> None:
        # One type per field, however the histogram was made (from the core
        # or from JSON), so that equal histograms compare and tabulate alike.
        put = object.__setattr__
        put(self, "bounds", tuple(float(b) for b in self.bounds))
        put(self, "counts", tuple(int(n) for n in self.counts))
        for name in ("sum", "min", "max"):
            put(self, name, float(getattr(self, name)))
        if len(self.bounds) != len(self.counts) + 1:
            raise ResultError("bounds: need one more bound than there are counts")
        if sum(self.counts) != self.count:
            raise ResultError(f"counts: they add up to {sum(self.counts)}, not count={self.count}")

    @classmethod
    def empty(cls, bounds: Sequence[float], unit: str = "ns") -> Histogram:
        return cls(tuple(bounds), (0,) * (len(bounds) - 1), 0, 0, 0, 0, unit)

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    def percentile(self, q: float) -> float | None:
        """The value below which q percent of the values fall (q from 0 to
        100), interpolated within its bucket and clamped to [min, max]."""
        if not 0 <= q <= 100:
            raise ConfigError(f"q: a percentile is between 0 and 100, not {q}")
        if not self.count:
            return None
        if q == 0:
            return self.min
        if q == 100:
            return self.max
        rank = q / 100 * self.count
        seen = 0
        for i, n in enumerate(self.counts):
            if n and seen + n >= rank:
                lo, hi = self.bounds[i], self.bounds[i + 1]
                value = lo + (hi - lo) * (rank - seen) / n
                return min(max(value, self.min), self.max)
            seen += n
        return self.max

    def __add__(self, other: Histogram) -> Histogram:
        if not isinstance(other, Histogram):
            return NotImplemented
        if other.bounds != self.bounds or other.unit != self.unit:
            raise ResultError("only histograms with the same buckets and unit add up")
        if not other.count:
            return self
        if not self.count:
            return other
        return Histogram(self.bounds, tuple(a + b for a, b in zip(self.counts, other.counts,
                                                                 strict=True)),
                         self.count + other.count, self.sum + other.sum,
                         min(self.min, other.min), max(self.max, other.max), self.unit)

    def __radd__(self, other: object) -> Histogram:
        if other == 0:  # sum(histograms)
            return self
        return NotImplemented

    def cdf(self) -> list[tuple[float, float]]:
        """(value, fraction of values at or below it) at each non-empty
        bucket's upper bound: the points of a cumulative distribution plot."""
        out, seen = [], 0
        for i, n in enumerate(self.counts):
            if n:
                seen += n
                out.append((min(self.bounds[i + 1], self.max), seen / self.count))
        return out

    def bucket_of(self, value: float) -> int:
        """The index of the bucket that holds value."""
        return max(0, min(bisect.bisect_right(self.bounds, value) - 1, len(self.counts) - 1))

    def __repr__(self) -> str:
        if not self.count:
            return f"Histogram(count=0, unit={self.unit!r})"
        return (f"Histogram(count={self.count}, mean={self.mean:.0f}, "
                f"p50={self.percentile(50):.0f}, p99={self.percentile(99):.0f}, "
                f"max={self.max:.0f}, unit={self.unit!r})")
