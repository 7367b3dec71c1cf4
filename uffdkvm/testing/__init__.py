"""A/B assertions for pytest suites: is B slower than A, or faster, beyond noise?

    >>> from uffdkvm import Config
    >>> from uffdkvm.testing import compare, assert_not_slower, assert_faster
    >>> a = Config(vcpus=1, mem_per_vcpu="4M")
    >>> b = Config(vcpus=1, mem_per_vcpu="4M", wait="epoll_exclusive")
    >>> assert_not_slower(a, b, tolerance=0.05)        # AssertionError with the table
    >>> c = compare(a, b, trials=15)
    >>> c.ratio, c.ci_low, c.ci_high                     # b / a, its 95% interval
    >>> print(c.table())

How it measures:

- ``a`` and ``b`` are :class:`uffdkvm.Config` objects; each trial runs
  ``uffdkvm.run()`` once for each. The two sides alternate, A B, B A, A B,
  ...: each pair runs close together, so drift of the host hits both alike,
  and neither side is always first (the first run of a pair can pay for the
  other's leftovers: page cache, huge pages, a cold CPU).
- ``warmup`` pairs run first and are thrown away.
- ``setup_a`` / ``setup_b``: a callable called before each of its side's
  runs (warmup included), such as a sysctl write; what it returns, if it is
  callable, is called after that run (the undo), even when the run failed.
- The ratio is b / a of each pair, and its estimate is the **median of the
  per-pair ratios**; the interval is the percentile bootstrap of that
  median, resampling pairs (:func:`uffdkvm.ratio_of` with ``paired=True``,
  the package's one bootstrap).
- A run that raises is not caught: a test that cannot run its experiment
  should fail with the run's own error, not with a statistic.

Metrics (``metric=``):

- ``"pages_per_s"`` (``Result.paging_rate``): higher is better.
- ``"overhead_ns_per_page"``: the per-fault overhead, as
  benchmarks/overhead.py measures it: each trial also runs each side with
  ``uffd_mode=None`` (the same config without userfaultfd; a field that
  means nothing without it, such as ``resolve="zeropage"``, at its
  default), and the side's
  value is ``vcpus * (1 / rate(uffd) - 1 / rate(none)) * 1e9``, the guest's
  own time per page cancelled. Lower is better. Each trial then runs four
  experiments (A's two, then B's two; reversed every other trial).
- Any other :class:`uffdkvm.Result` attribute that holds a number
  (``seconds``, ``blocktime_seconds``, ``faults``, ...), with
  ``higher_is_better=`` given (required: uffdkvm cannot know what you want of
  it). A run whose attribute is None counts as a failed trial and its pair
  is left out.

The testing package holds, beside this public API, uffdkvm's pytest plugin
(pytest_plugin.py, the ``pytest11`` entry point), the files it records
(_recorded.py) and, in test builds only, fault injection (_faults.py).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..analysis.spread import CONFIDENCE, RESAMPLES, SEED, Ratio, ratio_of, spread_of
from ..config import Config
from ..errors import ConfigError
from ..result import Result

__all__ = ["Comparison", "assert_faster", "assert_not_slower", "compare", "trials_needed"]

#: What each built-in metric's better direction is.
KNOWN_METRICS = {"pages_per_s": True, "overhead_ns_per_page": False}

Setup = Callable[[], Any]
Runner = Callable[[Config], Result]


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` measured: B against A.

    metric            the metric's name
    higher_is_better  True when a larger value of the metric is better
    a, b              each side's value per trial, in the order run (None
                      for a trial whose metric was not measured)
    ratio             the median of the per-pair ratios b[i] / a[i]
    ci_low, ci_high   its percentile bootstrap interval at ``confidence``
    n                 the pairs the ratio is computed from
    confidence        the interval's level (0.95)
    """
    metric: str
    higher_is_better: bool
    a: tuple[float | None, ...]
    b: tuple[float | None, ...]
    ratio: float
    ci_low: float
    ci_high: float
    n: int
    confidence: float

    @property
    def worse_by(self) -> float:
        """How much worse b is than a at the interval's most favourable end
        for b (a fraction: 0.1 is 10% worse; negative when even that end
        says b is better). assert_not_slower fails when this exceeds its
        tolerance."""
        return 1 - self.ci_high if self.higher_is_better else self.ci_low - 1

    @property
    def better_by(self) -> float:
        """How much better b is than a at the interval's least favourable end
        for b (a fraction). assert_faster fails unless this exceeds its
        margin."""
        return self.ci_low - 1 if self.higher_is_better else 1 - self.ci_high

    def verdict(self, tolerance: float = 0.05) -> str:
        """What the interval shows at ``tolerance`` (a fraction), for b
        against a:

        "worse"    b is worse by more than the tolerance even at the end of
                   the interval most favourable to b (assert_not_slower
                   would fail)
        "better"   b is better by more than it even at the end least
                   favourable to b (assert_faster with margin=tolerance
                   would pass)
        "same"     the whole interval lies within the tolerance: no
                   difference larger than it
        "unclear"  none of these: the interval, from too few or too noisy
                   trials, reaches past the tolerance without showing a
                   difference (more trials: trials_needed())
        """
        _check_fraction("tolerance", tolerance)
        if self.worse_by > tolerance:
            return "worse"
        if self.better_by > tolerance:
            return "better"
        if self.ci_low >= 1 - tolerance and self.ci_high <= 1 + tolerance:
            return "same"
        return "unclear"

    def verdict_line(self, tolerance: float = 0.05) -> str:
        """verdict() in a sentence, with how far the interval goes."""
        v = self.verdict(tolerance)
        if v == "worse":
            return (f"b is worse than a by more than {tolerance:.0%} "
                    f"(at least {self.worse_by:.1%})")
        if v == "better":
            return (f"b is better than a by more than {tolerance:.0%} "
                    f"(at least {self.better_by:.1%})")
        if v == "same":
            return f"b is within {tolerance:.0%} of a: no larger difference"
        return (f"no difference beyond {tolerance:.0%} shown, nor ruled out: b / a lies in "
                f"[{self.ci_low:#.3g}, {self.ci_high:#.3g}] (more trials narrow it)")

    def table(self) -> str:
        """Each side's median with its bootstrap interval, cv and trials, and
        the ratio b / a with its interval, as plain text."""
        sa, sb = spread_of(self.a), spread_of(self.b)
        better = "higher" if self.higher_is_better else "lower"
        lines = [f"{self.metric} ({better} is better), {len(self.a)} trials per side",
                 f"  a: {sa}",
                 f"  b: {sb}",
                 f"  b / a: {self.ratio:#.3g} [{self.ci_low:#.3g}, {self.ci_high:#.3g}] "
                 f"(median of {self.n} paired ratios, {self.confidence:.0%} interval)"]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _check_metric(metric: Any, higher_is_better: Any) -> bool:
    if not isinstance(metric, str):
        raise ConfigError(f"metric: expected a name such as 'pages_per_s', not {metric!r}")
    if higher_is_better is not None and not isinstance(higher_is_better, bool):
        raise ConfigError(f"higher_is_better: expected True, False or None, "
                         f"not {higher_is_better!r}")
    if metric in KNOWN_METRICS:
        known = KNOWN_METRICS[metric]
        if higher_is_better is not None and higher_is_better != known:
            raise ConfigError(f"higher_is_better: {metric!r} is "
                             f"{'higher' if known else 'lower'} is better; leave "
                             f"higher_is_better out for it")
        return known
    names = {f.name for f in dataclasses.fields(Result)} | {
        n for n, v in vars(Result).items() if isinstance(v, property)}
    if metric not in names:
        raise ConfigError(f"metric: {metric!r} is not 'pages_per_s', 'overhead_ns_per_page' "
                         f"or an attribute of Result (such as 'seconds', "
                         f"'blocktime_seconds', 'faults')")
    if higher_is_better is None:
        raise ConfigError(f"higher_is_better: required for metric {metric!r} (True if a "
                         f"larger {metric} is better, False if smaller is)")
    return higher_is_better


def _value(r: Result, metric: str) -> float | None:
    v = r.paging_rate if metric == "pages_per_s" else getattr(r, metric)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"metric: Result.{metric} is {type(v).__name__}, not a number")
    x = float(v)
    return None if math.isnan(x) else x


def _without_uffd(config: Config) -> Config:
    """config with uffd_mode=None; a field that has no meaning without
    userfaultfd (resolve="zeropage", say) goes back to its default, as the
    refusing check names it."""
    fields = {**config.to_dict(), "uffd_mode": None}
    defaults = Config()
    for _ in range(len(fields)):
        try:
            return Config(**fields)
        except ConfigError as e:
            name = getattr(e, "field", None)
            if name not in fields or fields[name] == getattr(defaults, name):
                raise ConfigError(f"overhead_ns_per_page: {config!r} has no run without "
                                 f"userfaultfd to match it: {e}") from None
            fields[name] = getattr(defaults, name)
    raise AssertionError("unreachable")  # pragma: no cover


def _run_side(config: Config, setup: Setup | None, metric: str,
              runner: Runner | None = None) -> float | None:
    """One trial of one side: its metric, from ``runner`` (uffdkvm.run, or
    a Guest's run for a kernel under QEMU)."""
    if runner is None:
        from ..run import run
        runner = run
    configs = [config]
    if metric == "overhead_ns_per_page":
        configs.append(_without_uffd(config))
    rates: list[float] = []
    values: list[float | None] = []
    for c in configs:
        undo = setup() if setup is not None else None
        try:
            r = runner(c)
        finally:
            if callable(undo):
                undo()
        if metric == "overhead_ns_per_page":
            rates.append(r.paging_rate)
        else:
            values.append(_value(r, metric))
    if metric == "overhead_ns_per_page":
        uffd, none = rates
        if not uffd or not none:
            return None
        return config.vcpus * (1 / uffd - 1 / none) * 1e9
    return values[0]


def _check_args(a: Any, b: Any, trials: Any, warmup: Any, setup_a: Any, setup_b: Any,
                seed: Any, metric: str) -> None:
    for name, c in (("a", a), ("b", b)):
        if not isinstance(c, Config):
            raise ConfigError(f"{name}: expected a uffdkvm.Config, not {type(c).__name__} "
                             f"(make one: uffdkvm.Config(**fields))")
        if metric == "overhead_ns_per_page" and c.uffd_mode is None:
            raise ConfigError(f"{name}.uffd_mode: overhead_ns_per_page compares a run with "
                             f"userfaultfd to one without; {name} has uffd_mode=None")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 3:
        raise ConfigError(f"trials: expected an int of at least 3 (6 or more for an "
                         f"interval that means 95%; see trials_needed()), not {trials!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"warmup: expected an int of 0 or more, not {warmup!r}")
    for name, s in (("setup_a", setup_a), ("setup_b", setup_b)):
        if s is not None and not callable(s):
            raise ConfigError(f"{name}: expected a callable (called before each run, what it "
                             f"returns called after) or None, not {s!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"seed: expected an int or None, not {seed!r}")


def compare(a: Config, b: Config, metric: str = "pages_per_s", trials: int = 15, *,
            setup_a: Setup | None = None, setup_b: Setup | None = None, warmup: int = 1,
            seed: int | None = None, higher_is_better: bool | None = None) -> Comparison:
    """Run a and b interleaved, ``trials`` pairs, and compare their metric.

    a, b              the two Configs
    metric            "pages_per_s" (default), "overhead_ns_per_page", or a
                      numeric Result attribute (with higher_is_better)
    trials            pairs of runs (default 15; see :func:`trials_needed`)
    setup_a, setup_b  called before each run of that side; a callable it
                      returns is called after the run
    warmup            pairs run first and discarded (default 1)
    seed              the bootstrap's seed (default 0: the same trials give
                      the same interval)
    higher_is_better  required for a metric other than the two built in

    Returns a :class:`Comparison`. See the module's notes for the order of
    runs and the statistic.
    """
    better = _check_metric(metric, higher_is_better)
    _check_args(a, b, trials, warmup, setup_a, setup_b, seed, metric)
    return _interleaved(a, b, metric, better, trials, warmup, seed, setup_a=setup_a,
                        setup_b=setup_b)


def _interleaved(a: Config, b: Config, metric: str, better: bool, trials: int, warmup: int,
                 seed: int | None, *, setup_a: Setup | None = None,
                 setup_b: Setup | None = None, run_a: Runner | None = None,
                 run_b: Runner | None = None) -> Comparison:
    """compare()'s trials, the two sides alternating, each run by its runner."""
    sides = [(a, setup_a, run_a), (b, setup_b, run_b)]
    for t in range(warmup):
        for config, setup, runner in (sides if t % 2 == 0 else sides[::-1]):
            _run_side(config, setup, metric, runner)
    va: list[float | None] = []
    vb: list[float | None] = []
    for t in range(trials):
        if t % 2 == 0:
            va.append(_run_side(a, setup_a, metric, run_a))
            vb.append(_run_side(b, setup_b, metric, run_b))
        else:
            vb.append(_run_side(b, setup_b, metric, run_b))
            va.append(_run_side(a, setup_a, metric, run_a))
    ratio = _ratio(va, vb, SEED if seed is None else seed)
    return Comparison(metric=metric, higher_is_better=better, a=tuple(va), b=tuple(vb),
                      ratio=ratio.estimate, ci_low=ratio.ci_low, ci_high=ratio.ci_high,
                      n=ratio.n_a, confidence=ratio.confidence)


def _ratio(va: Sequence[float | None], vb: Sequence[float | None], seed: int) -> Ratio:
    # ratio_of(b, a) is b[i] / a[i]; a zero a[i] (an overhead of exactly 0) is left out.
    pairs = [(x, y) if x != 0 else (None, None) for x, y in zip(va, vb, strict=True)]
    return ratio_of([y for _, y in pairs], [x for x, _ in pairs], paired=True,
                    confidence=CONFIDENCE, resamples=RESAMPLES, seed=seed)


def _check_fraction(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"{name}: expected a fraction from 0 to below 1 such as 0.05 "
                         f"(5%), not {value!r}", field=name)


def assert_not_slower(a: Config, b: Config, tolerance: float = 0.05,
                      **kw: Any) -> Comparison:
    """Fail (AssertionError with the table) only when the interval says b is
    worse than a by more than ``tolerance`` (a fraction: 0.05 is 5%): for a
    higher-is-better metric when even the interval's upper end of b / a is
    below 1 - tolerance, for a lower-is-better one when even its lower end
    is above 1 + tolerance. Too few trials give a wide interval, which
    passes: see :func:`trials_needed`. ``kw`` goes to :func:`compare`.
    Returns the Comparison."""
    _check_fraction("tolerance", tolerance)
    c = compare(a, b, **kw)
    if c.worse_by > tolerance:
        raise AssertionError(f"b is slower than a by more than {tolerance:.0%} "
                             f"(at least {c.worse_by:.1%}):\n{c.table()}")
    return c


def assert_faster(a: Config, b: Config, margin: float = 0.0, **kw: Any) -> Comparison:
    """Fail (AssertionError with the table) unless the interval says b is
    better than a by more than ``margin`` (a fraction): for a
    higher-is-better metric the interval's lower end of b / a must be above
    1 + margin, for a lower-is-better one its upper end below 1 - margin.
    ``kw`` goes to :func:`compare`. Returns the Comparison."""
    _check_fraction("margin", margin)
    c = compare(a, b, **kw)
    if not c.better_by > margin:
        raise AssertionError(f"b is not shown faster than a by more than {margin:.0%} "
                             f"(at least {c.better_by:.1%}):\n{c.table()}")
    return c


#: The 97.5% point of the normal distribution (a 95% two-sided interval).
_Z = 1.959964
#: The standard error of a median is this times the mean's, for normal noise.
_MEDIAN_EFFICIENCY = math.sqrt(math.pi / 2)
#: Fewer trials than this give the sample's [min, max] as the interval (spread.py).
MIN_TRIALS = 6


def trials_needed(cv: float, tolerance: float) -> int:
    """The pairs of trials for the 95% interval of b / a to be about
    ``tolerance`` wide on each side, when each side's runs vary with
    coefficient of variation ``cv`` (as ``uffdkvm.spread_of(values).cv``
    gives; fractions both: 0.04 and 0.05).

    A normal approximation: the ratio of a pair varies with about
    sqrt(2) * cv (the two sides' noise independent), the median of n such
    ratios with sqrt(pi / 2) * sqrt(2) * cv / sqrt(n), and the interval's
    half width is 1.96 of that. So n = (1.96 * sqrt(pi) * cv / tolerance)**2,
    rounded up, and never fewer than 6 (below 6 the bootstrap's interval is
    the sample's extremes). A difference that is the tolerance itself is
    then resolved about half of the time; for b slower than a by d to fail
    assert_not_slower(tolerance) reliably, d must be about the tolerance
    plus twice the half width. The two sides' noise is taken as independent:
    where the two runs of a pair share it (drift of the host), the ratios
    vary less and fewer trials do; a first comparison shows which.
    """
    for name, v in (("cv", cv), ("tolerance", tolerance)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 \
                or math.isinf(v):
            raise ConfigError(f"{name}: expected a positive fraction such as 0.05, not {v!r}")
    n = (_Z * _MEDIAN_EFFICIENCY * math.sqrt(2) * cv / tolerance) ** 2
    return max(MIN_TRIALS, math.ceil(n - 1e-9))
