"""Numbers only: the steady-state rule, descriptive statistics, perf_adj and the score.

This module does no I/O and imports nothing heavy, so the summary and the
report share exactly one definition of every formula:

* :func:`steady_state` -- the steady-state throughput (items/s) of one result;
* :func:`describe` -- ``{n, min, max, mean, std}`` of a list of numbers;
* :func:`cv` -- the coefficient of variation (``std%`` of the report);
* :func:`perf_adj` -- performance penalised for variance and failures;
* :func:`weighted_geomean` -- the score (:func:`weighted_log_mean`, its logarithm).

Bounds (why a vendor's numbers cannot overflow a sum or inflate a score): a
steady-state rate outside [:data:`MIN_RATE`, :data:`MAX_RATE`] items/s, or a
sample whose end is before its start, makes :func:`steady_state` raise
``ValueError``, so the summary skips that record with a warning. Sums of up to
10^6 rates of at most 10^12 (and their squares, at most 10^30) stay far from a
float's 1.8e308, and no ratio divides by a rate below 10^-9.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterable, Sequence
from typing import Any, TypeGuard

#: A rate sample of a record (``timings.train.samples``: parsed JSON).
Sample = dict[str, Any]
#: What :func:`steady_state` returns: ``(rate or None, chosen samples, note)``.
Steady = tuple[float | None, list[Sample], str]

#: Length of the steady-state window, in seconds of training time.
STEADY_WINDOW_S = 10.0
#: Training time left out at the very end of a run, in seconds.
STEADY_TAIL_S = 1.0

#: ``note`` values returned by :func:`steady_state`.
FULL = "full"  # a whole 10 s window was available
SHORT = "short"  # less than 10 s of steady state: every non-warm-up sample used
NONE = "none"  # no usable sample: no steady-state rate

#: Largest steady-state rate accepted (items/s): 10^12, far above any device's images,
#: tokens or matmuls per second; 10^6 of them sum to 10^18, squared 10^24 each.
MAX_RATE = 1e12
#: Smallest positive steady-state rate accepted (items/s): 10^-9, one item every 30
#: years; a smaller divisor (a baseline of 5e-324) would make a ratio overflow.
MIN_RATE = 1e-9


def check_rate(rate: Any, what: str = "steady-state rate") -> Any:
    """Return ``rate`` (items/s) when it is None, 0 or in [MIN_RATE, MAX_RATE].

    Raises:
        ValueError: any other value (NaN, infinite, negative, tiny or huge).
    """
    if rate is None or rate == 0 or (finite(rate) and MIN_RATE <= rate <= MAX_RATE):
        return rate
    raise ValueError(f"{what} {rate!r} items/s is out of range ({MIN_RATE:g} to {MAX_RATE:g})")


def finite(x: object) -> TypeGuard[float]:
    """True for an int or float (not a bool) that is neither NaN nor infinite: the one
    test every reader of recorded numbers uses."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# A sample's fields, read by C loops.
_GET_START, _GET_END = operator.methodcaller("get", "start"), operator.methodcaller("get", "end")
_GET_WARMUP = operator.methodcaller("get", "warmup", False)
_GET_PROFILED = operator.methodcaller("get", "profiled", False)

#: Types of the numbers a parsed JSON document holds (bool is not one).
_NUMBER_TYPES = frozenset((int, float))


def _column(samples: Sequence[Sample], key: str) -> list[float]:
    """The ``key`` field of every sample, checked to be numbers (C loops only)."""
    try:
        values = list(map(operator.itemgetter(key), samples))
    except (KeyError, TypeError):
        raise ValueError(f"a sample has no {key!r}")
    if not set(map(type, values)) <= _NUMBER_TYPES:
        raise ValueError(f"a sample's {key!r} is not a number")
    return values


def steady_state(
    samples: Sequence[Sample], window: float = STEADY_WINDOW_S, tail: float = STEADY_TAIL_S
) -> Steady:
    """Return ``(rate, chosen, note)``: the steady-state throughput of one result.

    ``samples`` are the result's ``timings.train.samples``: dicts with
    ``start`` and ``end`` (s since program start), ``count`` (items),
    ``rate`` (items/s), ``warmup`` (bool) and optionally ``profiled`` (bool).

    The rule (from the 2020 milarun methodology: "the average performance over
    the last 10 seconds of the run ... we also ignore the last second, because
    we have observed some artifacts due to early stoppage"):

    1. Samples flagged ``warmup`` are never used (data loading, cudnn
       autotuning and compilation make them slow and unrepresentative), nor
       are those flagged ``profiled`` (steps run under ``--profile-trace``'s
       profiler, which slows them down).
    2. Let ``T`` be the end of the last sample. The window is
       ``[T - tail - window, T - tail]``, i.e. the 10 s of training before the
       final 1 s. A sample is chosen when it lies entirely inside the window.
    3. If the non-warm-up samples start after the window opens (the run had
       less than ``window + tail`` seconds of steady training), every
       non-warm-up sample that ends by ``T - tail`` is used instead, and
       ``note`` is ``"short"``. If that leaves nothing (a very short run), all
       non-warm-up samples are used, still ``"short"``.
    4. No non-warm-up sample, or a zero total duration: ``rate`` is ``None``
       and ``note`` is ``"none"``.

    Every sample, warm-up included, must end at or after its start: one that
    ends before it would subtract time and inflate the rate (a sample of -0.9 s
    among 0.5 s ones made a rate 10x), so it is refused, not dropped (a writer
    that produces one is not to be trusted for the others either).

    The mean rate is ``sum(count) / sum(end - start)`` over the chosen samples
    (items/s): total items over total measured time. This is the time-weighted
    mean of the per-sample rates, so a short sample (the window that closes
    when training stops) counts for its duration only; a plain mean of the
    ``rate`` fields would let such a sample weigh as much as a full one.

    Returns:
        ``(rate or None, chosen samples, note)`` with note ``"full"``,
        ``"short"`` or ``"none"``.

    Raises:
        ValueError: a sample lacks ``start``/``end``/``count`` or has a
            non-numeric one, a sample ends before it starts, or the rate is out
            of range (:func:`check_rate`).
    """
    return _steady_state(samples, window, tail)


def _first_backwards(samples: Sequence[Sample]) -> int | None:
    """Index of the first sample whose ``end`` is before its ``start`` (both finite
    numbers), or None. Raises AttributeError when a sample is not a dict."""
    starts = list(map(_GET_START, samples))
    ends = list(map(_GET_END, samples))
    if set(map(type, starts)) <= _NUMBER_TYPES and set(map(type, ends)) <= _NUMBER_TYPES:
        # all numbers (the usual case): compare in C first, check finiteness on the
        # few candidates only (an infinite bound is not a backwards sample)
        if not any(map(operator.lt, ends, starts)):
            return None
        candidates: Iterable[int] = (i for i, (a, b) in enumerate(zip(starts, ends)) if b < a)
    else:
        candidates = range(len(samples))
    return next(
        (i for i in candidates if finite(starts[i]) and finite(ends[i]) and ends[i] < starts[i]),
        None,
    )


def _steady_state(samples: Sequence[Sample], window: float, tail: float) -> Steady:
    """:func:`steady_state` itself, computed."""
    try:
        if any(map(_GET_PROFILED, samples)):
            steady = [
                s for s in samples if not s.get("warmup", False) and not s.get("profiled", False)
            ]
        else:  # the usual case, in C loops
            steady = list(
                itertools.compress(samples, map(operator.not_, map(_GET_WARMUP, samples)))
            )
        backwards = _first_backwards(samples)
    except AttributeError:
        raise ValueError("a sample is not an object")
    if backwards is not None:
        s = samples[backwards]
        raise ValueError(
            f"timings.train.samples.{backwards}: end {s['end']!r} is before start {s['start']!r}"
        )
    if not steady:
        return None, [], NONE
    starts, ends, counts = (
        _column(steady, "start"),
        _column(steady, "end"),
        _column(steady, "count"),
    )
    everyone = range(len(steady))
    hi = max(ends) - tail
    lo = hi - window
    chosen: Sequence[int]
    if min(starts) <= lo:
        chosen = [i for i, start, end in zip(everyone, starts, ends) if start >= lo and end <= hi]
        note = FULL
    else:
        chosen = [i for i, end in zip(everyone, ends) if end <= hi]
        note = SHORT
        if not chosen:
            chosen = everyone
    if not chosen:
        # Full window but no sample inside it (samples longer than the window).
        chosen = [i for i, end in zip(everyone, ends) if end <= hi] or everyone
        note = SHORT
    # summed in sample order, as always: the same floats to the last bit
    duration = sum(ends[i] - starts[i] for i in chosen)
    if duration <= 0:
        return None, [], NONE
    items = sum(counts[i] for i in chosen)
    try:
        rate = items / duration
    except OverflowError:  # an int count beyond a float
        rate = math.inf
    return check_rate(rate), [steady[i] for i in chosen], note


def describe(values: Iterable[float | None]) -> dict[str, Any]:
    """Return ``{n, min, max, mean, std}`` of ``values`` (any unit; same unit out).

    ``std`` is the sample standard deviation (divisor ``n - 1``): the runs are
    a sample of what the machine does, and this is what pandas' ``std()``
    gives. With ``n == 1`` it is 0. With ``n == 0`` every statistic is
    ``None``.
    """
    numbers = [float(v) for v in values if v is not None]
    n = len(numbers)
    if n == 0:
        return {"n": 0, "min": None, "max": None, "mean": None, "std": None}
    mean = math.fsum(numbers) / n
    if n > 1:
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in numbers) / (n - 1))
    else:
        std = 0.0
    return {"n": n, "min": min(numbers), "max": max(numbers), "mean": mean, "std": std}


def cv(mean: float | None, std: float | None) -> float:
    """Coefficient of variation ``std / mean`` as a fraction (``std%`` in the report).

    ``None`` or zero mean, or ``None`` std (no data), gives 0.0; with one
    result the std is 0, so std% is 0.
    """
    if not mean or std is None:
        return 0.0
    return float(std) / float(mean)


def perf_adj(
    perf: float | None,
    std_frac: float | None,
    fail: int,
    n: int,
    penalize_variance: bool = True,
) -> float:
    """Adjusted performance (items/s), from the 2020 milarun report.

    ``perf_adj = perf * (1 - std%) * (1 - fail / n)``; without variance
    penalty ``perf * (1 - fail / n)``. ``perf`` is the mean steady-state rate
    (items/s), ``std_frac`` the coefficient of variation (a fraction),
    ``fail`` and ``n`` the failed and total result counts.

    A test with no rate (``perf`` is ``None``: every run failed) has
    ``perf_adj`` 0. The variance factor is clamped at 0, so a std% above 100 %
    gives 0 rather than a negative number.
    """
    if perf is None or not n:
        return 0.0
    factor = 1.0 - fail / n
    if penalize_variance:
        factor *= max(0.0, 1.0 - (std_frac or 0.0))
    return max(0.0, float(perf) * factor)


def weighted_log_mean(values: Iterable[float | None], weights: Iterable[float]) -> float | None:
    """``sum(w_i * log(v_i)) / sum(w_i)``: the logarithm of :func:`weighted_geomean`.

    Computed on weights divided by the largest one (the mean is unchanged) and
    with ``math.fsum``, so no weight or sum overflows (weights of 1e308 gave NaN).

    Returns:
        the mean logarithm, or ``None`` when the total weight is 0.

    Raises:
        ValueError: a positively weighted value is not positive and finite,
            or a weight is negative or not finite.
    """
    pairs: list[tuple[float, float]] = []
    for v, w in zip(values, weights):
        if not finite(w) or w < 0:
            raise ValueError(f"weight {w!r} is not a finite number >= 0")
        if w == 0:
            continue
        if v is None or not finite(v) or v <= 0:
            raise ValueError(f"value {v!r} with weight {w!r} has no logarithm")
        pairs.append((math.log(v), w))
    if not pairs:
        return None
    top = max(w for _, w in pairs)
    return math.fsum(w / top * lv for lv, w in pairs) / math.fsum(w / top for _, w in pairs)


def weighted_geomean(values: Iterable[float | None], weights: Iterable[float]) -> float | None:
    """Score: ``exp(sum(w_i * log(v_i)) / sum(w_i))``, the weighted geometric mean.

    The 2020 milarun report's score, and the mean that keeps the ranking of
    two machines independent of the reference they are normalized to
    (P. J. Fleming and J. J. Wallace, "How not to lie with statistics: the
    correct way to summarize benchmark results", CACM 29(3), 1986). It is
    computed in log space (:func:`weighted_log_mean`): no product of the
    values is ever formed.

    Pairs with weight 0 are ignored. Every value with a positive weight must
    be positive and finite: the caller (the report) decides what to do with
    missing tests and zero ``perf_adj`` before calling, so this never returns
    NaN or 0 in silence.

    Returns:
        the score (within the range of the values, so finite), or ``None``
        when the total weight is 0.

    Raises:
        ValueError: a positively weighted value is not positive and finite,
            or a weight is negative.
    """
    log_mean = weighted_log_mean(values, weights)
    if log_mean is None:
        return None
    return exp_or_inf(log_mean)


def exp_or_inf(x: float) -> float:
    """``math.exp(x)``, or ``inf`` where it overflows (the caller shows "n/a")."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf
