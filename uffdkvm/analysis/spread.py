"""Run-to-run spread: what the trials of one point say, and how sure.

This project's runs are noisy (a coefficient of variation of a few percent
with one vCPU per core, tens of percent with more threads than cores), so a
median alone says little. Three helpers, in pure Python (``import uffdkvm``
needs nothing; pandas only for :func:`summarize`):

    >>> s = uffdkvm.spread_of(df["pages_per_s"])       # any sequence of numbers
    >>> s.median, s.ci_low, s.ci_high, s.cv
    >>> uffdkvm.summarize(df)                           # a sweep frame, per point
    >>> print(uffdkvm.ratio_of(rates_a, rates_b, paired=True))
    1.07 [1.02, 1.12]

How they compute:

- quantiles (median, q1, q3, the interval's ends) interpolate linearly
  between order statistics: numpy's default ``method="linear"``, pandas'
  ``quantile()``, R's type 7 (the median is ``statistics.median``);
- ``stdev`` is the sample standard deviation (n - 1 in the denominator),
  ``cv`` is stdev / mean;
- the interval is a percentile bootstrap: ``resamples`` times, draw n values
  with replacement from the n trials and take their median; the interval's
  ends are the (1 - confidence) / 2 and (1 + confidence) / 2 quantiles of
  those medians. The draws come from ``random.Random(seed)``, through
  ``random()`` only, whose sequence Python keeps the same across versions:
  the same values and seed give the same interval everywhere, numpy or not.

What small samples give (n counts the values that are numbers):

- n = 0 (no values, or all None/NaN): every statistic NaN.
- n = 1: median, q1, q3, mean, min and max are the value; stdev, cv and the
  interval NaN: one run says nothing about the spread.
- n = 2: stdev and cv as usual; the interval is exactly [min, max], which
  holds the true median only half of the time.
- n = 3, 4, 5: the bootstrap interval is still [min, max] (the sample's
  extremes are the median of more than 2.5% of the resamples); it holds the
  true median with probability 1 - 2**(1 - n): 75%, 87.5%, 93.75%, not 95%.
  From n = 6 on, the ends move inside: run 6 or more trials for an interval
  that means 95%. (Measured on normal samples, 400 each, the interval held
  the true median 92-95% of the time for n from 6 to 40: the percentile
  bootstrap of a median runs a little short of its level at small n.)
- None and NaN (and pandas' NA) are failed runs: left out of every statistic
  and counted in ``failed``. Anything else that is not a number is a
  ValueError naming its position.

Cost: the bootstrap draws n x resamples values in pure Python, about 0.2 s
per million draws on this project's development host: nothing for trials,
seconds for a point with thousands of values (lower ``resamples`` there).
"""
from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ResultError

if TYPE_CHECKING:  # pragma: no cover
    import pandas

NAN = float("nan")
CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0
MIN_RESAMPLES = 100  # fewer cannot place the ends of a 95% interval


@dataclass(frozen=True)
class Spread:
    """The trials of one point, summarised. Values keep the unit of the
    numbers given (pages/s for ``pages_per_s``); ``cv`` is a fraction.

    n           values that are numbers (the trials that ran)
    failed      values that were None or NaN (trials that failed, or that
                did not measure this metric)
    median      the middle value (the mean of the middle two for even n)
    q1, q3      the 25th and 75th percentiles (linear interpolation): the
                interquartile range ``iqr`` = q3 - q1 holds the middle half
    mean        arithmetic mean
    stdev       sample standard deviation (n - 1 denominator)
    cv          coefficient of variation, stdev / mean (0.04: 4%)
    min, max    the extremes
    ci_low,     the bootstrap interval of the median at ``confidence``
    ci_high     (see the module's notes for n < 6)
    confidence  the interval's nominal level, 0.95 for 95%
    """
    n: int
    failed: int
    median: float
    q1: float
    q3: float
    mean: float
    stdev: float
    cv: float
    min: float
    max: float
    ci_low: float
    ci_high: float
    confidence: float

    @property
    def iqr(self) -> float:
        """q3 - q1: the width of the middle half of the trials."""
        return self.q3 - self.q1

    def __str__(self) -> str:
        """'29123 [27410, 32200] (n=5, cv 4.1%)'"""
        return (f"{_fmt(self.median)} [{_fmt(self.ci_low)}, {_fmt(self.ci_high)}] "
                f"(n={self.n}, cv {self.cv:.1%})")


@dataclass(frozen=True)
class Ratio:
    """A over B, with its bootstrap interval: ``str()`` gives the form
    benchmarks quote, "1.07 [1.02, 1.12]" (A 7% above B, the 95% interval of
    that from 2% to 12%: an interval that holds 1 means no difference shown).

    estimate    paired: the median of the per-trial ratios a[i] / b[i];
                unpaired: median(a) / median(b)
    ci_low,     the percentile bootstrap interval of the estimate
    ci_high     (NaN with fewer than 2 values on either side; with 2 pairs,
                the two ratios)
    n_a, n_b    values used on each side (paired: both the number of pairs)
    paired      whether trials were paired by position
    confidence  the interval's nominal level
    """
    estimate: float
    ci_low: float
    ci_high: float
    n_a: int
    n_b: int
    paired: bool
    confidence: float

    def __str__(self) -> str:
        return f"{self.estimate:#.3g} [{self.ci_low:#.3g}, {self.ci_high:#.3g}]"


def _fmt(x: float) -> str:
    if math.isnan(x):
        return "nan"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _check(confidence: float, resamples: int, seed: int) -> None:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) \
            or not 0 < confidence < 1:
        raise ConfigError(f"confidence: expected a level between 0 and 1 such as 0.95, "
                         f"not {confidence!r}")
    if isinstance(resamples, bool) or not isinstance(resamples, int) \
            or resamples < MIN_RESAMPLES:
        raise ConfigError(f"resamples: expected an int of at least {MIN_RESAMPLES} "
                         f"(default {RESAMPLES}), not {resamples!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed: expected an int (the same seed gives the same interval), "
                         f"not {seed!r}")


def _numbers(values: Iterable[Any], name: str = "values") -> tuple[list[float | None], int]:
    """values as floats, None for a failed run (None or NaN); and how many failed."""
    if isinstance(values, (str, bytes)):
        raise ConfigError(f"{name}: expected a sequence of numbers, not a string")
    out: list[float | None] = []
    for i, v in enumerate(values):
        if v is None:
            out.append(None)
            continue
        if isinstance(v, (str, bytes)):
            raise ConfigError(f"{name}[{i}]: {v!r} is not a number")
        try:
            x = float(v)
        except (TypeError, ValueError):
            if type(v).__name__ == "NAType":  # pandas' missing value, in nullable columns
                out.append(None)
                continue
            raise ConfigError(f"{name}[{i}]: {v!r} is not a number") from None
        out.append(None if math.isnan(x) else x)
    return out, sum(1 for x in out if x is None)


def quantile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of sorted values, interpolated linearly
    between order statistics (numpy's "linear" method).

    Not ``statistics.quantiles(..., method="inclusive")``, which computes the
    same cut points but as (x[j] * (n - d) + x[j + 1] * d) / n: a cut that
    falls on a value comes back an ulp off it (x * 40 / 40), and the interval
    of 3 to 5 values would no longer be exactly their [min, max]
    (tests/analysis/test_spread.py's test_up_to_five_values_the_interval_is_the_min_max).
    It also takes only cut points i / n, not any level."""
    h = (len(ordered) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (h - lo) * (ordered[hi] - ordered[lo])


def _resampled_medians(values: Sequence[float], resamples: int,
                       rng: random.Random) -> list[float]:
    """The medians of ``resamples`` draws of len(values) values with
    replacement. Only rng.random() is used: its sequence for a seed is the
    one part of the random module Python promises not to change."""
    n = len(values)
    draw = rng.random
    return [statistics.median([values[int(draw() * n)] for _ in range(n)])
            for _ in range(resamples)]


def _interval(estimates: list[float], confidence: float) -> tuple[float, float]:
    estimates.sort()
    tail = (1 - confidence) / 2
    return quantile(estimates, tail), quantile(estimates, 1 - tail)


def spread_of(values: Iterable[Any], *, confidence: float = CONFIDENCE,
              resamples: int = RESAMPLES, seed: int = SEED) -> Spread:
    """The spread of a point's trials: median and quartiles, mean, stdev,
    cv, extremes, and a bootstrap interval of the median.

    values      numbers, one per trial (a list, a pandas Series, ...); None
                and NaN are failed trials, counted in ``failed``
    confidence  the interval's level (default 0.95)
    resamples   bootstrap resamples (default 2000); more narrows the Monte
                Carlo error of the ends, not the interval
    seed        the bootstrap's seed: the same values and seed give the same
                interval; another seed moves the ends by its Monte Carlo error

    Small n and failed values: see the module's notes (n = 1 gives no
    interval, n <= 5 gives [min, max]).
    """
    _check(confidence, resamples, seed)
    numbers, failed = _numbers(values)
    ordered = sorted(x for x in numbers if x is not None)
    n = len(ordered)
    if n == 0:
        return Spread(0, failed, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN,
                      confidence)
    median = statistics.median(ordered)
    mean = statistics.fmean(ordered)
    if n == 1:
        stdev = NAN
        low = high = NAN
    else:
        stdev = statistics.stdev(ordered)
        if n == 2:  # what the bootstrap gives, without the Monte Carlo
            low, high = ordered
        else:
            low, high = _interval(_resampled_medians(ordered, resamples, random.Random(seed)),
                                  confidence)
    cv = stdev / mean if mean else NAN
    return Spread(n=n, failed=failed, median=median, q1=quantile(ordered, 0.25),
                  q3=quantile(ordered, 0.75), mean=mean, stdev=stdev, cv=cv,
                  min=ordered[0], max=ordered[-1], ci_low=low, ci_high=high,
                  confidence=confidence)


def ratio_of(a: Iterable[Any], b: Iterable[Any], *, paired: bool = False,
             confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
             seed: int = SEED) -> Ratio:
    """A / B for two points' trials, with a bootstrap interval.

    a, b        the trials of each point (None/NaN: failed, left out)
    paired      False: the two are independent samples; the estimate is
                median(a) / median(b), and the bootstrap resamples each side
                on its own. True: a[i] and b[i] ran together (the same
                round of interleaved trials), so drift of the host hits both;
                the estimate is the median of a[i] / b[i], and the bootstrap
                resamples the pairs. Needs len(a) == len(b); a pair with a
                failed side is left out.
    confidence, resamples, seed: as for :func:`spread_of`

    A median of B (or a b[i]) of zero is a ValueError: the ratio is undefined.
    """
    _check(confidence, resamples, seed)
    xs, _ = _numbers(a, "a")
    ys, _ = _numbers(b, "b")
    rng = random.Random(seed)
    if paired:
        if len(xs) != len(ys):
            raise ConfigError(f"ratio_of(paired=True): a has {len(xs)} trials and b "
                             f"{len(ys)}; pairs need as many of each (or paired=False)")
        pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if x is not None and y is not None]
        if any(y == 0 for _, y in pairs):
            raise ResultError("ratio_of: b has a zero: a / b is undefined")
        ratios = sorted(x / y for x, y in pairs)
        n_a = n_b = len(ratios)
        estimate = statistics.median(ratios) if ratios else NAN
        low = high = NAN
        if len(ratios) == 2:
            low, high = ratios
        elif len(ratios) > 2:
            low, high = _interval(_resampled_medians(ratios, resamples, rng), confidence)
        return Ratio(estimate, low, high, n_a, n_b, True, confidence)

    a_sorted = sorted(x for x in xs if x is not None)
    b_sorted = sorted(y for y in ys if y is not None)
    n_a, n_b = len(a_sorted), len(b_sorted)
    if not n_a or not n_b:
        return Ratio(NAN, NAN, NAN, n_a, n_b, False, confidence)
    if statistics.median(b_sorted) == 0:
        raise ResultError("ratio_of: the median of b is 0: a / b is undefined")
    estimate = statistics.median(a_sorted) / statistics.median(b_sorted)
    if n_a < 2 or n_b < 2:
        return Ratio(estimate, NAN, NAN, n_a, n_b, False, confidence)
    top = _resampled_medians(a_sorted, resamples, rng)
    bottom = _resampled_medians(b_sorted, resamples, rng)
    low, high = _interval([t / u if u else math.copysign(math.inf, t)
                           for t, u in zip(top, bottom, strict=True)], confidence)
    return Ratio(estimate, low, high, n_a, n_b, False, confidence)


STATISTICS = ("n", "failed", "median", "q1", "q3", "mean", "stdev", "cv", "min", "max",
              "ci_low", "ci_high")


def _key(value: Any) -> Any:
    """A hashable stand-in for a cell, NaN and None alike (a missing value)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, list):
        return tuple(_key(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def swept_fields(df: pandas.DataFrame) -> list[str]:
    """The Config fields that vary between the rows of a sweep frame, in
    Config's order: what tells its points apart (``trial`` and measurements
    are not Config fields; Config's derived columns, ``region_bytes`` and
    such, are left out too)."""
    from ..config import Config
    fields = [f.name for f in dataclasses.fields(Config)]
    return [f for f in fields if f in df.columns
            and len({_key(v) for v in df[f]}) > 1]


def summarize(df: pandas.DataFrame, metric: str | Sequence[str] = "pages_per_s",
              by: None | str | Sequence[str] = None, *,
              confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
              seed: int = SEED) -> pandas.DataFrame:
    """One row per point of a sweep frame: the :func:`spread_of` of its trials.

    df          rows of runs: what uffdkvm.sweep() returns (or any frame)
    metric      the column to summarise, or a list of them (default
                pages_per_s)
    by          the columns that tell the points apart (default: every
                Config field that varies between the rows, see
                :func:`swept_fields`; none vary: one row for the whole frame)
    confidence, resamples, seed: as for :func:`spread_of`

    Returns the ``by`` columns, then per metric ``<metric>_n``, ``_failed``,
    ``_median``, ``_q1``, ``_q3``, ``_mean``, ``_stdev``, ``_cv``, ``_min``,
    ``_max``, ``_ci_low``, ``_ci_high``, in the metric's unit (``_cv`` a
    fraction, ``_n`` and ``_failed`` counts), one row per point in the order
    the points first appear. A run that failed (its metric NaN, as in a
    sweep's error rows) counts in ``_failed``. Points whose ``by`` values
    are missing (None, NaN) group together, not dropped.
    """
    from ..io.frames import _pandas
    pd = _pandas()
    _check(confidence, resamples, seed)
    metrics = [metric] if isinstance(metric, str) else list(metric)
    if by is None:
        keys = swept_fields(df)
    else:
        keys = [by] if isinstance(by, str) else list(by)
    for column in [*metrics, *keys]:
        if column not in df.columns:
            role = "metric" if column in metrics else "by"
            raise ConfigError(f"summarize: {role}: no column {column!r} in the frame; "
                             f"columns include {', '.join(map(str, list(df.columns)[:40]))}")
    groups: dict[tuple[Any, ...], list[int]] = {}
    firsts: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for i, values in enumerate(df[keys].itertuples(index=False, name=None)
                               if keys else [()] * len(df)):
        k = tuple(_key(v) for v in values)
        groups.setdefault(k, []).append(i)
        firsts.setdefault(k, values)
    rows = []
    for k, positions in groups.items():
        row = dict(zip(keys, firsts[k], strict=True))
        for m in metrics:
            try:
                s = spread_of(df[m].iloc[positions], confidence=confidence,
                              resamples=resamples, seed=seed)
            except (ConfigError, ResultError) as e:
                raise type(e)(f"summarize: metric {m!r}: {e}") from None
            row.update({f"{m}_{name}": getattr(s, name) for name in STATISTICS})
        rows.append(row)
    columns = [*keys, *(f"{m}_{name}" for m in metrics for name in STATISTICS)]
    df_out: pandas.DataFrame = pd.DataFrame(rows, columns=columns)
    return df_out
