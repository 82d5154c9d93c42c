"""Convergence: does a run's loss, step for step, follow the reference's runs?

A training record's ``timings.train.loss_curve`` holds the mean loss over the steps
``(2^(k-1), 2^k]`` at each step ``2^k`` (:mod:`milarun.bench.rate`): the same steps
whatever the machine's speed. Run ``r`` of a test runs at seed ``--seed + r``, so a
test's repeats are independent draws of its curve, and the records of one seed (its
devices) are one draw.

The check, after MLPerf Training's reference convergence points (RCP; MLCommons
``mlperf_logging/rcp_checker/rcp_checker.py``, and the Training rules, "Reference
Convergence Points"). There, each run gives the epochs it took to reach the quality
target; the reference's olympic mean ``m`` and standard deviation ``s`` give the
smallest submission mean that a one-sided two-sample t-test (pooled variance, the
reference's ``s`` for both sides) at ``alpha = 0.05`` does not call faster; a
submission whose olympic mean is below it fails. Here a run has no target to reach in
a few minutes, so each seed's draw is one number, its **curve value**: its mean loss
over the last block of steps that every run of both sides completed, ``(S/2, S]`` for
the largest common checkpoint ``S`` (:func:`curve_value`), lower when it converges
faster. The last block is the one a corner cut moves most (its effect accumulates over
the steps before) and the least noisy one (it averages the most steps); the earlier
checkpoints sit near the initial loss, where every run agrees. Then, with ``n_r``
reference seeds and ``n_b`` bidder seeds (:func:`judge`):

* ``m``, ``s``: the mean and the sample standard deviation (divisor ``n - 1``) of the
  reference's values. The RCP checker takes both after dropping the lowest and the
  highest value (its olympic mean); :func:`false_alarm_rate` shows what that costs: the
  standard deviation of the middle values underestimates the law's, and at 5 seeds a
  side's false-alarm rate is about 0.12 where 0.05 was asked. So nothing is dropped here,
  and the test is exact for normal values;
* ``scale = max(s, tolerance * |m|)``: a floor under ``s`` for a reference whose seeds
  happen to agree closely; ``tolerance`` is measured (docs/measurement.md);
* ``half = t(1 - alpha, n_r - 1) * scale * sqrt(1/n_r + 1/n_b)``, the one-sided t-test's
  margin (Student's t quantile, :func:`milarun.measure.confidence.t_quantile`): the RCP
  checker's bisection for its "min acceptable mean" in closed form, with one change. The
  checker calls a pooled test with ``n_r + n_b - 2`` degrees of freedom while both sides
  use the reference's ``s``; the spread comes from ``n_r`` values only, so the degrees
  of freedom are ``n_r - 1``, and the test is then exact (with ``n_r + n_b - 2`` and 5
  seeds a side, a side's false-alarm rate is about 0.07 where 0.05 was asked);
* the bidder's mean value below ``m - half``: **faster** than the reference can converge
  (a step that does more than the profile's, data it should not see); above
  ``m + half``: **slower**, it does not converge like the reference (a skipped step, a
  dropped layer, another precision). Both are findings; ``alpha`` is each side's
  false-alarm rate when the values are normal (:func:`false_alarm_rate` measures it).

**Seed for seed.** Both sides run the profile's seeds (run ``r`` at ``--seed + r``), so
the bidder's run at a seed repeats the reference's run at that seed, step for step, up
to rounding: on CPU, 2 threads against 1 moved the loss curve of the tiny LLM by at
most 1.5e-7 of its value over 256 steps, bf16 against fp32 by 1e-6 to 3e-5, a skipped
step in 10 by up to 2e-2 (docs/measurement.md). :func:`seed_differences` gives the
largest relative difference of each seed both sides ran; a tender's ``seed_tolerance``
bounds it, which catches what the spread over seeds is too wide to see (another
precision).

No I/O: the records' curves are read in :mod:`milarun.analysis.convergence`, the verdict
is taken in :mod:`milarun.verify.convergence`.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from .confidence import t_quantile

#: ``{step: loss}`` of one seed's curve (the mean over that seed's records).
Curve = Mapping[int, float]


class Judgement(NamedTuple):
    """One test's comparison (:func:`judge`).

    Attributes:
        verdict: ``"ok"``, ``"faster"`` or ``"slower"``.
        steps: the checkpoints both sides share (steps, ascending); the last is judged.
        bidder: the bidder's mean curve value (the loss's unit).
        reference: the reference's (olympic) mean curve value.
        lo, hi: the bounds the bidder's mean must lie within.
        scale: the spread used (``max(s, tolerance * |m|)``).
        spread: the reference's own standard deviation ``s``.
        n_reference, n_bidder: seeds on each side.
    """

    verdict: str
    steps: tuple[int, ...]
    bidder: float
    reference: float
    lo: float
    hi: float
    scale: float
    spread: float
    n_reference: int
    n_bidder: int


def common_steps(curves: Sequence[Curve]) -> tuple[int, ...]:
    """The steps every curve of ``curves`` has, ascending (empty when none)."""
    if not curves:
        return ()
    shared = set(curves[0])
    for c in curves[1:]:
        shared &= set(c)
    return tuple(sorted(shared))


def curve_value(curve: Curve, steps: Sequence[int]) -> float:
    """A curve's value: its mean loss over the last block of ``steps``, the curve's point
    at the largest of them (the loss's unit).

    Raises:
        KeyError: the curve lacks that step.
        ValueError: ``steps`` is empty.
    """
    if not steps:
        raise ValueError("no checkpoint to judge")
    return float(curve[max(steps)])


def bounds(
    reference: Sequence[float], n_bidder: int, alpha: float, tolerance: float
) -> tuple[float, float, float, float, float]:
    """``(m, s, scale, lo, hi)`` of the module docstring for the reference's values and
    a bidder mean over ``n_bidder`` values.

    Raises:
        ValueError: fewer than 2 reference values (no spread), ``n_bidder`` < 1,
            ``alpha`` not in (0, 0.5), or a negative ``tolerance``.
    """
    kept = list(reference)
    if len(kept) < 2:
        raise ValueError(f"the reference has {len(reference)} seed(s): a spread needs 2 or more")
    if n_bidder < 1:
        raise ValueError("no bidder value")
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha {alpha!r} not in (0, 0.5)")
    if tolerance < 0:
        raise ValueError(f"tolerance {tolerance!r} is negative")
    m = statistics.fmean(kept)
    s = statistics.stdev(kept)
    scale = max(s, tolerance * abs(m))
    half = (
        t_quantile(1.0 - alpha, len(kept) - 1) * scale * math.sqrt(1.0 / len(kept) + 1.0 / n_bidder)
    )
    return m, s, scale, m - half, m + half


def judge(
    reference: Sequence[Curve], bidder: Sequence[Curve], alpha: float, tolerance: float
) -> Judgement | None:
    """Compare the bidder's seeds' curves with the reference's (module docstring) on the
    checkpoints that every curve of both sides has.

    Args:
        reference: one curve per reference seed.
        bidder: one curve per bidder seed.
        alpha: the false-alarm rate of each side (each of "faster" and "slower").
        tolerance: the floor of the spread, relative to the reference's mean value.

    Returns:
        the :class:`Judgement`, or None when the two sides share no checkpoint.

    Raises:
        ValueError: as :func:`bounds` (fewer than 2 reference seeds, no bidder seed, a
            bad ``alpha`` or ``tolerance``).
    """
    steps = common_steps([*reference, *bidder])
    if not steps:
        return None
    ref = [curve_value(c, steps) for c in reference]
    bid = [curve_value(c, steps) for c in bidder]
    m, s, scale, lo, hi = bounds(ref, len(bid), alpha, tolerance)
    mean_b = statistics.fmean(bid)
    verdict = "faster" if mean_b < lo else "slower" if mean_b > hi else "ok"
    return Judgement(verdict, steps, mean_b, m, lo, hi, scale, s, len(ref), len(bid))


def false_alarm_rate(
    n_reference: int,
    n_bidder: int,
    alpha: float,
    tolerance: float = 0.0,
    trials: int = 20000,
    seed: int = 0,
    trim: bool = False,
) -> tuple[float, float]:
    """The rates at which :func:`bounds` calls honest bidders faster and slower, by
    simulation: reference and bidder values drawn from one normal law (mean 1, standard
    deviation 0.01, the scale of a loss curve's seed spread), ``trials`` times. With
    ``trim``, both sides first drop their lowest and highest value when they have 5 or
    more, as the RCP checker does (what the module docstring says it costs).

    Returns:
        ``(faster rate, slower rate)``, fractions of ``trials``.

    Raises:
        ValueError: as :func:`bounds`.
    """
    rng = random.Random(seed)
    faster = slower = 0
    for _ in range(trials):
        ref = [rng.gauss(1.0, 0.01) for _ in range(n_reference)]
        bid = [rng.gauss(1.0, 0.01) for _ in range(n_bidder)]
        if trim:
            ref, bid = _olympic(ref), _olympic(bid)
        _, _, _, lo, hi = bounds(ref, len(bid), alpha, tolerance)
        mean_b = statistics.fmean(bid)
        faster += mean_b < lo
        slower += mean_b > hi
    return faster / trials, slower / trials


def seed_differences(
    reference: Mapping[object, Curve], bidder: Mapping[object, Curve]
) -> dict[object, tuple[float, int]]:
    """For each seed both sides ran, the largest relative difference of the bidder's curve
    from the reference's, ``|b - r| / |r|`` over the steps both have, and its step.

    Returns:
        ``{seed: (relative difference, step)}`` (empty when no seed or step is shared; a
        reference loss of 0 compares as a difference of ``|b|``).
    """
    out: dict[object, tuple[float, int]] = {}
    for seed in sorted(set(reference) & set(bidder), key=repr):
        ref, bid = reference[seed], bidder[seed]
        worst = None
        for step in sorted(set(ref) & set(bid)):
            diff = abs(bid[step] - ref[step]) / (abs(ref[step]) or 1.0)
            if worst is None or diff > worst[0]:
                worst = (diff, step)
        if worst is not None:
            out[seed] = worst
    return out


def _olympic(values: list[float]) -> list[float]:
    """``values`` without the lowest and the highest when there are 5 or more (the RCP
    checker's olympic trimming; only :func:`false_alarm_rate` uses it)."""
    return sorted(values)[1:-1] if len(values) >= 5 else values


__all__ = [
    "Curve",
    "Judgement",
    "bounds",
    "common_steps",
    "curve_value",
    "false_alarm_rate",
    "judge",
    "seed_differences",
]
