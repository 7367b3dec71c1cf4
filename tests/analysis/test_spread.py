"""spread_of(), ratio_of() and summarize(): the statistics against numpy and
scipy, the bootstrap interval against the exact bootstrap distribution and
against its promise (about 95% of intervals hold the true median), small n
and failed runs, and summarize() on a real sweep."""
import math
import subprocess
import warnings

import pytest

import uffdkvm
from helpers.children import ENV as CHILD_ENV
from helpers.children import python
from uffdkvm import Ratio, SweepWarning, ratio_of, spread_of, summarize

np = pytest.importorskip("numpy")
stats = pytest.importorskip("scipy.stats")
pd = pytest.importorskip("pandas")

NAN = float("nan")


def samples():
    """Samples of many shapes and sizes: normal, skewed, with ties, tiny."""
    rng = np.random.default_rng(2024)
    out = [rng.normal(30_000, 1_200, n) for n in (3, 4, 7, 10, 15, 50)]
    out += [rng.lognormal(10, 0.5, n) for n in (5, 12, 31)]
    out += [np.round(rng.normal(5, 1, 20)), np.array([2.0, 2.0, 2.0, 9.0]),
            np.array([-3.5, 0.25, 1e-3, 7.0, -1.0])]
    return out


@pytest.mark.parametrize("x", samples(), ids=lambda x: f"n{len(x)}")
def test_statistics_match_numpy_and_scipy(x):
    s = spread_of(list(x))
    assert s.n == len(x) and s.failed == 0
    assert s.median == pytest.approx(np.median(x), rel=1e-12, abs=1e-12)
    q1, q3 = np.percentile(x, [25, 75], method="linear")
    assert s.q1 == pytest.approx(q1, rel=1e-12, abs=1e-12)
    assert s.q3 == pytest.approx(q3, rel=1e-12, abs=1e-12)
    assert s.iqr == pytest.approx(stats.iqr(x), rel=1e-12, abs=1e-12)
    assert s.mean == pytest.approx(np.mean(x), rel=1e-12, abs=1e-12)
    assert s.stdev == pytest.approx(np.std(x, ddof=1), rel=1e-12)
    assert s.cv == pytest.approx(stats.variation(x, ddof=1), rel=1e-9)
    assert (s.min, s.max) == (x.min(), x.max())
    assert s.confidence == 0.95


def _exact_bootstrap_quantile(ordered, p):
    """Where the exact bootstrap distribution of the median of an odd number
    of distinct values first reaches p: the 0-based index j of the order
    statistic. The resample's median is at most ordered[j] when at least
    (n + 1) / 2 of its n draws come from the j + 1 smallest values, a
    binomial with success probability (j + 1) / n."""
    n = len(ordered)
    for j in range(n):
        if stats.binom.sf((n + 1) // 2 - 1, n, (j + 1) / n) >= p:
            return j
    return n - 1


@pytest.mark.parametrize("n", [21, 41, 61])
def test_interval_is_the_exact_bootstrap_percentiles(n):
    x = np.sort(np.random.default_rng(n).normal(100, 10, n))
    resamples = 2000
    s = spread_of(x, resamples=resamples)
    # The Monte Carlo quantile is off the exact one by sqrt(p (1 - p) / B)
    # in probability: allow four times that, and the interpolation step.
    for p, end in ((0.025, s.ci_low), (0.975, s.ci_high)):
        tol = 4 * math.sqrt(p * (1 - p) / resamples)
        lo = _exact_bootstrap_quantile(x, p - tol)
        hi = _exact_bootstrap_quantile(x, p + 1 / resamples + tol)
        assert x[lo] <= end <= x[hi], (p, end, x[lo:hi + 1])
        assert hi - lo <= 3  # a few order statistics, of n


def test_interval_agrees_with_scipy_bootstrap():
    x = np.random.default_rng(5).lognormal(10, 0.4, 30)
    ours = spread_of(x, resamples=20000)
    theirs = stats.bootstrap((x,), np.median, method="percentile", n_resamples=20000,
                             random_state=np.random.default_rng(0)).confidence_interval
    width = theirs.high - theirs.low
    assert ours.ci_low == pytest.approx(theirs.low, abs=0.05 * width)
    assert ours.ci_high == pytest.approx(theirs.high, abs=0.05 * width)


def test_about_95_percent_of_intervals_hold_the_true_median():
    # 400 samples of 40 from a normal distribution (median 0): the share of
    # intervals that hold 0 is near 95% (one standard error is 1.1%), and the
    # width is near the normal theory's 2 * 1.96 * 1.2533 / sqrt(n). The
    # min-max or the interquartile range hold it 99.8% of the time or more
    # and do not shrink with n; mean +- stdev/sqrt(n) would be too narrow.
    rng = np.random.default_rng(11)
    n, simulations = 40, 400
    held, widths = 0, []
    for i in range(simulations):
        s = spread_of(rng.normal(0, 1, n), resamples=1000, seed=i)
        held += s.ci_low <= 0 <= s.ci_high
        widths.append(s.ci_high - s.ci_low)
    coverage = held / simulations
    assert 0.91 <= coverage <= 0.98, coverage
    assert np.mean(widths) == pytest.approx(2 * 1.96 * 1.2533 / math.sqrt(n), rel=0.12)


def test_interval_holds_the_sample_median():
    rng = np.random.default_rng(3)
    for i in range(60):
        n = 3 + i % 28
        x = rng.lognormal(0, 1.5, n) if i % 2 else rng.normal(0, 1, n)
        s = spread_of(x, seed=i)
        assert s.ci_low <= s.median <= s.ci_high, (n, s)
        assert s.min <= s.ci_low and s.ci_high <= s.max


def test_interval_narrows_with_n():
    rng = np.random.default_rng(8)
    widths = []
    for n in (10, 40, 160):
        s = spread_of(rng.normal(0, 1, n))
        widths.append(s.ci_high - s.ci_low)
    assert widths[0] > widths[1] > widths[2]
    # about 1 / sqrt(n): a quarter of the width for 16 times the trials
    assert widths[2] / widths[0] == pytest.approx(0.25, abs=0.12)


def test_seed_reproduces_and_another_seed_moves_the_ends():
    x = list(np.random.default_rng(4).normal(50, 5, 30))
    a, b = spread_of(x, seed=1), spread_of(x, seed=1)
    assert a == b
    assert spread_of(list(reversed(x)), seed=1) == a  # the order of trials does not matter
    c = spread_of(x, seed=2)
    assert (c.ci_low, c.ci_high) != (a.ci_low, a.ci_high)
    assert c.median == a.median and c.q1 == a.q1 and c.stdev == a.stdev
    # more resamples: the same interval, up to Monte Carlo error
    d = spread_of(x, resamples=20000, seed=3)
    assert d.ci_low == pytest.approx(a.ci_low, abs=0.2 * (a.ci_high - a.ci_low))


def test_same_interval_without_numpy():
    # The bootstrap draws only from random.Random(seed).random(): a process
    # where numpy cannot be imported gives the same numbers to the last bit.
    x = [float(v) for v in np.random.default_rng(6).normal(10, 2, 17)]
    code = ("import sys; sys.modules['numpy'] = None; sys.modules['pandas'] = None\n"
            "import uffdkvm\n"
            f"s = uffdkvm.spread_of({x!r}, seed=5)\n"
            "r = uffdkvm.ratio_of(" + repr(x) + ", " + repr(x[::-1]) + ", seed=5)\n"
            "print(repr((s.ci_low, s.ci_high, r.ci_low, r.ci_high)))\n")
    p = subprocess.run(python(code=code), capture_output=True, text=True,
                       timeout=60, env=CHILD_ENV)
    assert p.returncode == 0, p.stderr
    s, r = spread_of(x, seed=5), ratio_of(x, x[::-1], seed=5)
    assert p.stdout.strip() == repr((s.ci_low, s.ci_high, r.ci_low, r.ci_high))


# Small samples and failed runs: what the module's notes promise.

def test_no_values_and_all_failed_give_nan():
    for values in ([], [None, NAN]):
        s = spread_of(values)
        assert s.n == 0 and s.failed == len(values)
        assert all(math.isnan(getattr(s, f)) for f in
                   ("median", "q1", "q3", "mean", "stdev", "cv", "min", "max",
                    "ci_low", "ci_high"))


def test_one_value_has_no_spread():
    s = spread_of([None, 12.5])
    assert (s.n, s.failed) == (1, 1)
    assert s.median == s.q1 == s.q3 == s.mean == s.min == s.max == 12.5
    assert math.isnan(s.stdev) and math.isnan(s.cv)
    assert math.isnan(s.ci_low) and math.isnan(s.ci_high)


def test_two_values_give_the_min_max():
    s = spread_of([40.0, NAN, 10.0])
    assert (s.n, s.failed) == (2, 1)
    assert (s.ci_low, s.ci_high) == (10.0, 40.0)
    assert s.median == 25.0 and s.stdev == pytest.approx(np.std([10, 40], ddof=1))


@pytest.mark.parametrize("n", [3, 4, 5])
def test_up_to_five_values_the_interval_is_the_min_max(n):
    rng = np.random.default_rng(n)
    for seed in range(5):
        x = rng.normal(0, 1, n)
        s = spread_of(x, seed=seed)
        assert (s.ci_low, s.ci_high) == (x.min(), x.max())


def test_from_six_values_the_interval_moves_inside():
    x = np.random.default_rng(6).normal(0, 1, 6)
    s = spread_of(x)
    assert x.min() < s.ci_low and s.ci_high < x.max()


def test_failed_runs_are_left_out_and_counted():
    x = [3.0, None, 1.0, NAN, 2.0, np.nan, 5.0, 4.0]
    s = spread_of(pd.Series(x, dtype=object))
    assert (s.n, s.failed) == (5, 3)
    clean = spread_of([1.0, 2.0, 3.0, 4.0, 5.0])
    nullable = spread_of(pd.Series([3.0, None, 1.0, 2.0, 5.0, 4.0], dtype="Float64"))
    assert (nullable.n, nullable.failed, nullable.ci_low) == (5, 1, clean.ci_low)
    assert (s.median, s.ci_low, s.ci_high, s.stdev) == \
        (clean.median, clean.ci_low, clean.ci_high, clean.stdev)


@pytest.mark.parametrize("values,field", [
    (["12"], "values[0]"), ([1.0, "fast"], "values[1]"), ([1.0, object()], "values[1]"),
    ("123", "a string"),
])
def test_values_that_are_not_numbers_are_named(values, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[")):
        spread_of(values)


@pytest.mark.parametrize("kwargs,field", [
    (dict(confidence=95), "confidence"), (dict(confidence=0), "confidence"),
    (dict(resamples=10), "resamples"), (dict(resamples=2000.0), "resamples"),
    (dict(seed=None), "seed"), (dict(seed="a"), "seed"),
])
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        spread_of([1.0, 2.0, 3.0], **kwargs)


def test_confidence_sets_the_level():
    x = np.random.default_rng(9).normal(0, 1, 60)
    wide, narrow = spread_of(x, confidence=0.99), spread_of(x, confidence=0.5)
    default = spread_of(x)
    assert wide.ci_low < default.ci_low < narrow.ci_low
    assert narrow.ci_high < default.ci_high < wide.ci_high
    assert narrow.confidence == 0.5


# ratio_of

def test_ratio_unpaired_is_the_ratio_of_medians_with_scipys_interval():
    rng = np.random.default_rng(12)
    a, b = rng.normal(110, 10, 25), rng.normal(100, 8, 30)
    r = ratio_of(a, b, resamples=20000)
    assert r.estimate == pytest.approx(np.median(a) / np.median(b), rel=1e-12)
    assert (r.n_a, r.n_b, r.paired) == (25, 30, False)
    theirs = stats.bootstrap(
        (a, b), lambda x, y, axis: np.median(x, axis=axis) / np.median(y, axis=axis),
        paired=False, method="percentile", n_resamples=20000,
        random_state=np.random.default_rng(1)).confidence_interval
    width = theirs.high - theirs.low
    assert r.ci_low == pytest.approx(theirs.low, abs=0.05 * width)
    assert r.ci_high == pytest.approx(theirs.high, abs=0.05 * width)


def test_ratio_paired_is_the_median_of_per_trial_ratios():
    rng = np.random.default_rng(13)
    b = rng.normal(100, 10, 21)
    a = b * rng.normal(1.1, 0.03, 21)
    r = ratio_of(a, b, paired=True, resamples=20000)
    assert r.estimate == pytest.approx(np.median(a / b), rel=1e-12)
    theirs = stats.bootstrap((a / b,), np.median, method="percentile", n_resamples=20000,
                             random_state=np.random.default_rng(2)).confidence_interval
    width = theirs.high - theirs.low
    assert r.ci_low == pytest.approx(theirs.low, abs=0.05 * width)
    assert r.ci_high == pytest.approx(theirs.high, abs=0.05 * width)


def test_pairing_takes_out_the_drift_both_points_share():
    # Each round's host speed (drift, 30%) hits both points; A is 5% faster.
    rng = np.random.default_rng(14)
    drift = rng.uniform(0.7, 1.3, 15)
    b = 1000 * drift * rng.normal(1, 0.01, 15)
    a = 1050 * drift * rng.normal(1, 0.01, 15)
    paired, unpaired = ratio_of(a, b, paired=True), ratio_of(a, b)
    assert paired.ci_low > 1.0 and paired.ci_low <= 1.05 <= paired.ci_high
    assert unpaired.ci_low < 1.0 < unpaired.ci_high  # the drift hides the 5%
    assert paired.ci_high - paired.ci_low < (unpaired.ci_high - unpaired.ci_low) / 5


def test_ratio_exact_multiples_and_formatting():
    b = [10.0, 12.0, 11.0, 13.0, 9.0, 10.5]
    r = ratio_of([2 * x for x in b], b, paired=True)
    assert (r.estimate, r.ci_low, r.ci_high) == (2.0, 2.0, 2.0)
    assert str(Ratio(1.0712, 1.0234, 1.1189, 7, 7, True, 0.95)) == "1.07 [1.02, 1.12]"


def test_ratio_small_and_failed():
    r = ratio_of([2.0, None, 4.0], [1.0, 1.0, NAN], paired=True)
    assert (r.n_a, r.n_b, r.estimate) == (1, 1, 2.0)
    assert math.isnan(r.ci_low) and math.isnan(r.ci_high)
    r = ratio_of([2.0, 4.0], [1.0])
    assert r.estimate == 3.0 and math.isnan(r.ci_low)
    r = ratio_of([2.0, 4.0], [1.0, 2.0], paired=True)
    assert (r.ci_low, r.ci_high) == (2.0, 2.0)
    r = ratio_of([NAN], [1.0])
    assert math.isnan(r.estimate) and (r.n_a, r.n_b) == (0, 1)


def test_ratio_bad_input_is_named():
    with pytest.raises(ValueError, match="a has 2 trials and b 3"):
        ratio_of([1, 2], [1, 2, 3], paired=True)
    with pytest.raises(ValueError, match="median of b is 0"):
        ratio_of([1, 2], [0, 0, 1])
    with pytest.raises(ValueError, match="b has a zero"):
        ratio_of([1, 2], [1, 0], paired=True)
    with pytest.raises(ValueError, match=r"b\[1\]"):
        ratio_of([1, 2], [1, "x"])


def test_spread_formats_as_median_and_interval():
    s = spread_of([29_000.0, 31_000.0, 30_000.0, 28_500.0, 30_500.0, 29_500.0, 30_200.0])
    assert str(s) == f"{s.median:.0f} [{s.ci_low:.0f}, {s.ci_high:.0f}] (n=7, cv {s.cv:.1%})"


# summarize()

def test_summarize_groups_by_what_varies_and_keeps_missing_keys():
    df = pd.DataFrame({
        "trial": [0, 1, 2, 0, 1, 2, 0, 1],
        "readers": [1, 1, 1, 2, 2, 2, 4, 4],
        "wait": ["poll"] * 8,                           # held fixed: not a key
        # varies, with missing values of both kinds
        "uffd_mode": pd.Series(["missing"] * 6 + [None, NAN], dtype=object),
        "faults": [256, 250, 260, 256, 256, 256, 256, 256],  # varies, not a Config field
        "pages_per_s": [10.0, 12.0, 11.0, 20.0, NAN, 22.0, 5.0, 7.0],
    })
    out = summarize(df)
    assert list(out.columns[:2]) == ["uffd_mode", "readers"]  # Config's order
    assert out["readers"].tolist() == [1, 2, 4]
    assert out["uffd_mode"].tolist()[:2] == ["missing", "missing"]
    assert pd.isna(out["uffd_mode"].iloc[2])
    assert out["pages_per_s_n"].tolist() == [3, 2, 2]
    assert out["pages_per_s_failed"].tolist() == [0, 1, 0]
    assert out["pages_per_s_median"].tolist() == [11.0, 21.0, 6.0]
    both = summarize(df, ["pages_per_s", "faults"], by="readers")
    assert list(both.columns[:1]) == ["readers"] and "faults_median" in both
    assert both["faults_median"].tolist() == [256, 256, 256]
    whole = summarize(df, by=[])
    assert whole["pages_per_s_n"].tolist() == [7]
    with pytest.raises(ValueError, match="metric: no column 'rate'"):
        summarize(df, "rate")
    with pytest.raises(ValueError, match="by: no column 'reader'"):
        summarize(df, by="reader")


@pytest.mark.kvm
def test_summarize_a_real_sweep(kvm):
    # 2 points x 3 trials of tiny runs, and a point whose every run fails.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SweepWarning)
        df = uffdkvm.sweep(uffdkvm.Config(vcpus=1), mem_per_vcpu=["1M", "1T"],
                           readers=[1, 2], trials=3, progress=False)
    assert len(df) == 12 and df["error"].notna().sum() == 6
    out = summarize(df)
    # trial, the measurements and Config's derived columns (region_bytes)
    # vary too, but only swept Config fields tell the points apart.
    assert list(out.columns[:2]) == ["mem_per_vcpu", "readers"]
    assert out[["mem_per_vcpu", "readers"]].values.tolist() == \
        [[1 << 20, 1], [1 << 20, 2], [1 << 40, 1], [1 << 40, 2]]
    for row in out.itertuples(index=False):
        group = df[(df["mem_per_vcpu"] == row.mem_per_vcpu) & (df["readers"] == row.readers)]
        values = group["pages_per_s"]
        if row.mem_per_vcpu == 1 << 40:
            assert (row.pages_per_s_n, row.pages_per_s_failed) == (0, 3)
            assert math.isnan(row.pages_per_s_median)
            continue
        assert (row.pages_per_s_n, row.pages_per_s_failed) == (3, 0)
        assert row.pages_per_s_median == pytest.approx(np.median(values), rel=1e-12)
        q1, q3 = np.percentile(values, [25, 75])
        assert (row.pages_per_s_q1, row.pages_per_s_q3) == pytest.approx((q1, q3), rel=1e-12)
        assert row.pages_per_s_cv == pytest.approx(stats.variation(values, ddof=1), rel=1e-9)
        s = spread_of(list(values))
        assert (row.pages_per_s_ci_low, row.pages_per_s_ci_high) == (s.ci_low, s.ci_high)
        assert (row.pages_per_s_min, row.pages_per_s_max) == (values.min(), values.max())
