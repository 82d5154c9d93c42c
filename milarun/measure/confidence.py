"""Noise: confidence intervals and significance tests (numbers only, no I/O, no scipy).

The report's inputs are a summary's ``(n, mean, std)`` of the per-result
steady-state rates of each test (``std`` the sample standard deviation,
divisor ``n - 1``). These are the sufficient statistics of every method
here, so a summary or a baseline needs no per-result list:

* :func:`mean_interval` -- the Student t interval of a test's mean rate,
  ``mean ± t(1 - a/2, n - 1) * std / sqrt(n)`` (the textbook one-sample t
  interval, e.g. NIST/SEMATECH e-Handbook of Statistical Methods, 7.2.2.1).
* :func:`welch_test` -- is a difference of two means more than noise?
  Welch's two-sample t-test (B. L. Welch, "The generalization of Student's
  problem when several different population variances are involved",
  Biometrika 34, 1947), two-tailed at ``1 - level``. pyperf's ``compare_to``
  asks the same question with Student's pooled-variance two-sample t-test
  (``pyperf/_utils.py: is_significant``); Welch's form is used here because
  two machines (or a 4-GPU and an 8-GPU node) differ in both noise and
  sample size, which the pooled test assumes away.
* :func:`geomean_interval` -- the interval of a weighted geometric mean
  (the score) or of a ratio of two (score / baseline): the delta method on
  the logarithm, ``Var(log mean_i) ~ std_i^2 / (n_i mean_i^2)``, summed with
  the squared normalized weights, and a t quantile whose degrees of freedom
  come from the Welch-Satterthwaite equation (F. E. Satterthwaite, "An
  approximate distribution of estimates of variance components",
  Biometrics Bulletin 2, 1946).
* :func:`median_interval` -- the distribution-free interval of a median from
  order statistics: ``[x_(k), x_(n+1-k)]`` with the largest ``k`` such that
  ``P(Bin(n, 1/2) <= k - 1) <= (1 - level) / 2`` (the sign-test interval;
  W. J. Conover, Practical Nonparametric Statistics, 3rd ed., 1999, 3.2);
  ``benchmarks/overhead.py`` gives it for the median of paired ratios.
* :func:`t_quantile` -- Student's t quantile for any real ``df > 0``,
  from the regularized incomplete beta function, ``P(T <= t) = 1 -
  I_x(df/2, 1/2) / 2`` with ``x = df / (df + t^2)`` (Abramowitz & Stegun
  26.7.1 and 26.5.27), evaluated by its continued fraction with the modified
  Lentz method (Press et al., Numerical Recipes, 3rd ed., 6.4) and inverted
  by bisection.

With fewer than two results a variance is unknown: every function returns
``None`` then, and the report prints ``n/a``, never a zero-width interval. So
do they when the inputs (a baseline's numbers, which only have to be finite)
make the interval itself overflow: the arithmetic is scaled so that no square
of a std under- or overflows on the way.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import NamedTuple

#: Confidence level of every interval and test in the report.
LEVEL = 0.95

#: ``(n, mean, std)`` of one sample (std with divisor ``n - 1``); any may be None (unknown).
Stats = tuple["int | None", "float | None", "float | None"]


class Interval(NamedTuple):
    """``lo``, ``hi`` (same unit as the estimate) and ``df`` (degrees of freedom; ``inf``
    when the interval has zero width because every result was the same)."""

    lo: float
    hi: float
    df: float


class Test(NamedTuple):
    """``t`` (Welch's statistic, ``inf`` when both variances are 0 and the means differ),
    ``df`` and ``significant`` (``|t|`` above the two-tailed critical value)."""

    t: float
    df: float
    significant: bool


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz, NR 6.4)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function ``I_x(a, b)`` for ``a, b > 0``, ``0 <= x <= 1``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    # the continued fraction converges fast on this side of the mean of the beta law
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df > 0`` degrees of freedom (``inf``: normal)."""
    if math.isinf(df):
        return statistics.NormalDist().cdf(t)
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=1024)  # a report asks the same few (p, df) for every test
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``df`` real, > 0,
    or ``inf`` for the normal law), to about 1e-12 relative.

    ``t_quantile(0.975, 4) == 2.7764451...``; ``t_quantile(0.975, inf) == 1.9599639...``.

    Raises:
        ValueError: ``p`` not in (0, 1), or ``df`` not > 0.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"quantile level {p!r} not in (0, 1)")
    if not df > 0:
        raise ValueError(f"degrees of freedom {df!r} not > 0")
    if math.isinf(df) or df > 1e7:
        return statistics.NormalDist().inv_cdf(p)
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    lo, hi = 0.0, 2.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):  # bisection: 200 halvings reach the float's resolution
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _known(n: int | None, mean: float | None, std: float | None) -> bool:
    return (
        n is not None
        and n >= 2
        and mean is not None
        and std is not None
        and math.isfinite(mean)
        and math.isfinite(std)
        and std >= 0
    )


def _finite(interval: Interval) -> Interval | None:
    return interval if math.isfinite(interval.lo) and math.isfinite(interval.hi) else None


def mean_interval(
    n: int | None, mean: float | None, std: float | None, level: float = LEVEL
) -> Interval | None:
    """The Student t confidence interval of a mean: ``mean ± t * std / sqrt(n)``.

    ``n`` values (results), their ``mean`` and sample ``std`` (divisor
    ``n - 1``), any unit (items/s in the report); ``level`` e.g. 0.95.

    Returns:
        :data:`Interval` ``(lo, hi, df = n - 1)``, or ``None`` when the
        variance is unknown (``n < 2``, or no mean/std) or the bounds overflow.
    """
    if not _known(n, mean, std):
        return None
    assert n is not None and mean is not None and std is not None  # _known says so
    half = t_quantile(0.5 + level / 2.0, n - 1) * (std / math.sqrt(n))
    return _finite(Interval(mean - half, mean + half, float(n - 1)))


def median_interval(values: Iterable[float], level: float = LEVEL) -> tuple[float, float] | None:
    """The distribution-free confidence interval of the median of ``values`` (any
    unit): ``(lo, hi)``, the order statistics ``x_(k)`` and ``x_(n+1-k)`` of the
    sign-test interval (module docstring), whose coverage is at least ``level``.

    Returns None when ``values`` are too few for ``level`` (at 0.95: fewer than 6).
    """
    xs = sorted(values)
    n = len(xs)
    alpha = (1.0 - level) / 2.0
    k, tail = 0, 0.0  # tail: P(Bin(n, 1/2) <= k - 1)
    while k < n // 2:
        nxt = tail + math.comb(n, k) / 2.0**n
        if nxt > alpha:
            break
        k, tail = k + 1, nxt
    if k == 0:
        return None
    return xs[k - 1], xs[n - k]


def welch_test(a: Stats, b: Stats, level: float = LEVEL) -> Test | None:
    """Welch's two-sample, two-tailed t-test of ``mean_a == mean_b``.

    ``a`` and ``b`` are ``(n, mean, std)`` of two samples (std with divisor
    ``n - 1``). ``t = (mean_a - mean_b) / sqrt(std_a^2/n_a + std_b^2/n_b)``;
    the degrees of freedom follow Welch-Satterthwaite. The difference is
    significant when ``|t| >= t_quantile(1 - (1 - level)/2, df)``. Two
    samples without spread: significant exactly when the means differ.

    Returns:
        :data:`Test`, or ``None`` when either side has fewer than 2 values
        (noise unknown).
    """
    if not (_known(*a) and _known(*b)):
        return None
    (na, ma, sa), (nb, mb, sb) = a, b
    # _known says so
    assert na is not None and ma is not None and sa is not None
    assert nb is not None and mb is not None and sb is not None
    scale = max(sa, sb)  # the variances in units of scale^2: no square under/overflows
    if scale == 0.0:
        return Test(math.inf if ma != mb else 0.0, float(na + nb - 2), ma != mb)
    va, vb = (sa / scale) ** 2 / na, (sb / scale) ** 2 / nb
    t = (ma - mb) / scale / math.sqrt(va + vb)
    if math.isnan(t):
        return None
    # Welch-Satterthwaite, (va + vb)^2 / (va^2/(na-1) + vb^2/(nb-1)), in shares of va + vb
    fa, fb = va / (va + vb), vb / (va + vb)
    df = 1.0 / (fa * fa / (na - 1) + fb * fb / (nb - 1))
    return Test(t, df, abs(t) >= t_quantile(0.5 + level / 2.0, df))


def log_variance(n: int | None, mean: float | None, std: float | None) -> float | None:
    """``Var(log mean) ~ std^2 / (n * mean^2)`` (delta method); None when unknown, mean <= 0
    or the ratio overflows."""
    if not _known(n, mean, std):
        return None
    assert n is not None and mean is not None and std is not None  # _known says so
    if mean <= 0:
        return None
    value = (std / mean) ** 2 / n if std / mean < 1e150 else math.inf
    return value if math.isfinite(value) else None


def geomean_interval(
    value: float | None,
    parts: Sequence[tuple[float, Iterable[Stats]]],
    level: float = LEVEL,
    hold_unknown: bool = False,
) -> Interval | None:
    """Confidence interval of a weighted geometric mean (or of a ratio of two).

    ``value`` is the estimate (the score, or score / baseline score);
    ``parts`` is a list of ``(weight, components)``, one per term of the
    mean, where ``components`` lists the ``(n, mean, std)`` whose logarithms
    add up to the term's logarithm: one for a score (the test's mean rate),
    two for a ratio (ours and the baseline's: ``log(a/b) = log a - log b``,
    independent samples, so the variances add).

    With ``a_i = w_i / sum(w)``, ``V = sum_i a_i^2 sum_k log_variance_ik``
    and the interval is ``value * exp(± t(df) * sqrt(V))``: asymmetric,
    always positive. ``df = V^2 / sum (a_i^2 log_variance_ik)^2 / (n_ik - 1)``
    (Welch-Satterthwaite). Scale factors that multiply a term (perf_adj's
    ``(1 - std%) * (1 - fail/n)``) are taken as fixed.

    ``hold_unknown``: a component whose variance is unknown (fewer than 2
    results: a whole-node or gpu-progression test has one per run) is held
    fixed, adding no variance, instead of voiding the interval; the interval
    is then conditional on those components (the caller names them). With
    every component unknown there is still no interval.

    Returns:
        :data:`Interval`, or ``None`` when ``value`` is None, ``parts`` is
        empty, a component's variance is unknown (without ``hold_unknown``;
        with it, when every one is), or the bounds overflow.
    """
    if value is None or not parts:
        return None
    total = sum(w for w, _ in parts)
    if not total > 0:
        return None
    terms: list[tuple[float, int]] = []  # (c_ik = a_i^2 log_variance_ik, n_ik)
    for w, components in parts:
        for n, mean, std in components:
            lv = log_variance(n, mean, std)
            if lv is None:
                if hold_unknown and _known_mean(n, mean):
                    continue
                return None
            assert n is not None  # a known variance has a count
            terms.append(((w / total) ** 2 * lv, n))
    if not terms:
        return None
    var = math.fsum(c for c, _ in terms)
    if var == 0.0:
        return Interval(value, value, math.inf)
    if not math.isfinite(var):
        return None
    # df = var^2 / sum c^2/(n-1), in shares of var: c^2 would underflow for tiny c
    df = 1.0 / math.fsum((c / var) ** 2 / (n - 1) for c, n in terms)
    half = t_quantile(0.5 + level / 2.0, df) * math.sqrt(var)
    if half > 700.0:  # exp(half) overflows: no finite upper bound
        return None
    return _finite(Interval(value * math.exp(-half), value * math.exp(half), df))


def _known_mean(n: object, mean: object) -> bool:
    """A component with a positive, finite mean of at least one result (its variance may be
    unknown): one that can be held fixed."""
    return (
        isinstance(n, int)
        and n >= 1
        and isinstance(mean, (int, float))
        and math.isfinite(mean)
        and mean > 0
    )
