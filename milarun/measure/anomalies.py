"""Anomaly flags: the rules that say a result, or a result among its group, looks wrong.

Pure: samples and rates in, flags out; no I/O, nothing heavy imported. The
summary stores the flags (``tests[GROUP].anomalies``), the report prints them
and the HTML draws them; :func:`describe` is the one sentence all of them show.

Rules within one result (its ``timings.train.samples``; times in s since
program start, rates in items/s):

* ``slow-windows``: non-warm-up windows, outside the final ``tail`` second
  (its stopping artefacts are expected), whose rate is under ``WINDOW_FLOOR``
  (half) of the result's reference rate: the larger of the median of its
  steady-state windows (the samples :func:`milarun.measure.stats.steady_state` chose)
  and the best rate it sustained, the highest running median of
  ``RUN_WINDOWS`` (5) consecutive non-warm-up windows (Tukey's running median,
  "Exploratory Data Analysis", 1977, ch. 7: robust to isolated spikes, as a
  block is high only when most of its windows are). They are flagged when
  they add up to ``WINDOW_MIN_S`` (1 s), so one short dip on a shared host is
  not. Why not ``median - k * MAD`` of the steady-state windows (the modified
  z-score of Iglewicz and Hoaglin, 1993), which the outlier rule below uses:
  when the steady-state window straddles a slow and a fast regime (the case
  of a recorded cpu.scaling run: 19 items/s for 70 s, then 1300 items/s, and a last 10 s window
  holding both), the MAD is as large as the median and that rule flags
  nothing; and on a steady run whose MAD is 1 % it flags a dip of 5 %.
* ``stall``: a stretch with no window closing longer than ``max(STALL_FACTOR
  * median window duration, STALL_MIN_S)``: one window that lasted that long,
  a gap between two windows, or, for a failed result, the time from its last
  window to its end.
* ``short-steady``: the non-warm-up windows of a successful result last less
  than its rule: the ``--min-steady`` seconds the test declared
  (``timings.train.min_steady``; the logger then trains until it has them),
  or, when it declared none, the ``window + tail`` seconds (11 s) of the 2020
  steady-state rule.
A result with no steady state at all is not an anomaly but a failure
(``no-steady-state``, :mod:`milarun.measure.plausibility`): the child and the summary
judge it so, and ``milarun run``/``rerun`` say it and exit 1.

Rule across the results of a group (:func:`group_flags`):

* ``outlier``: a result whose steady-state rate is below (or, with 3 other
  results or more, above) the median of the OTHER results of its group by
  more than ``max(K_MAD * MAD_SCALE * MAD_others, GROUP_FLOOR *
  median_others)``. ``MAD_SCALE * MAD`` (median absolute deviation) estimates
  the standard deviation of normal data without being pulled by the outliers,
  so the first term is the modified z-score rule of Iglewicz and Hoaglin
  (1993, "How to Detect and Handle Outliers", ASQC), ``|0.6745 (x - median) /
  MAD| > 3.5``; see also Leys et al. (2013), "Detecting outliers: do not use
  standard deviation around the mean, use absolute deviation around the
  median", J. Exp. Soc. Psychology 49(4). The second term (20 %) keeps noise
  quiet: two CPU slots of one test on the shared 2-core VM differ by up to
  about 20 % in ordinary runs. Leave-one-out, as the node comparison of the
  report: with two results, each is held to the other (only the slower one is
  flagged; two results cannot tell which is odd, and the slow one is what
  costs); the MAD term needs 3 other results.
"""

from __future__ import annotations

import bisect
import math
import operator
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from . import stats
from .flags import Flag, flag
from .stats import Sample

#: Cut-off of the modified z-score (Iglewicz and Hoaglin, 1993).
K_MAD = 3.5
#: ``MAD_SCALE * MAD`` estimates sigma for normal data (1 / Phi^-1(3/4)).
MAD_SCALE = 1.4826
#: A slow window runs under this fraction of the reference rate ("far below").
WINDOW_FLOOR = 0.5
#: Consecutive windows of the running median that gives the best sustained rate.
RUN_WINDOWS = 5
#: Slow windows are flagged only when they add up to this many seconds (one short
#: dip on a shared host is noise, not an anomaly).
WINDOW_MIN_S = 1.0
#: An outlier result is also at least this fraction away from the median of the others.
GROUP_FLOOR = 0.20
#: Non-warm-up windows needed before the ``slow-windows`` rule says anything.
MIN_WINDOWS = 5
#: A stall lasts more than this many median window durations...
STALL_FACTOR = 10.0
#: ...and more than this many seconds.
STALL_MIN_S = 2.0

#: The checks of this module (each has its :class:`milarun.measure.flags.Rule`).
KINDS = ("slow-windows", "stall", "short-steady", "outlier")


def _mad(values: Iterable[float], center: float) -> float:
    return statistics.median(abs(v - center) for v in values)


def reference_rate(
    steady: Sequence[Sample], chosen: Sequence[Sample]
) -> tuple[float, float, float] | None:
    """``(reference, median, best)`` of the ``slow-windows`` rule, in items/s: the
    median of the steady-state windows ``chosen``, the best sustained rate (the
    highest running median of :data:`RUN_WINDOWS` consecutive windows of
    ``steady``, the non-warm-up windows in time order), and the larger of the two.
    None when there are fewer than :data:`MIN_WINDOWS` windows."""
    if len(steady) < max(MIN_WINDOWS, RUN_WINDOWS):
        return None
    rates = [s["rate"] for s in steady]
    best = max(
        statistics.median(rates[i : i + RUN_WINDOWS]) for i in range(len(rates) - RUN_WINDOWS + 1)
    )
    med = statistics.median(s["rate"] for s in chosen) if chosen else best
    return max(med, best), med, best


def required_steady(train: object) -> tuple[float, str]:
    """Seconds of steady state a result's rule asks for, and the rule's name.

    ``train`` is the result's ``timings.train``. Returns ``(seconds,
    "min-steady")`` when the test declared ``min_steady`` > 0, else
    ``(STEADY_WINDOW_S + STEADY_TAIL_S, "window")``.
    """
    declared = train.get("min_steady") if isinstance(train, dict) else None
    if isinstance(declared, (int, float)) and not isinstance(declared, bool) and declared > 0:
        return float(declared), "min-steady"
    return stats.STEADY_WINDOW_S + stats.STEADY_TAIL_S, "window"


def stall_threshold(samples: Sequence[Sample]) -> float:
    """Seconds without a window closing that make a stall (see the module doc)."""
    steady = [s for s in samples if not s.get("warmup")] or samples
    return _stall_limit([s["end"] - s["start"] for s in steady])


def _stall_limit(durations: Sequence[float]) -> float:
    typical = statistics.median(durations) if durations else 0.0
    return max(STALL_FACTOR * typical, STALL_MIN_S)


def result_flags(
    record: Mapping[str, Any], steady: tuple[float | None, list[Sample]] | None = None
) -> list[Flag]:
    """The flags of one result record (a dict): a list of
    :class:`milarun.measure.flags.Flag`.

    ``steady`` is ``(rate, chosen)`` of :func:`milarun.measure.stats.steady_state` of its
    samples when the caller has it already; else it is computed.

    Every flag's id is one of :data:`KINDS`, its ``where`` the result's
    ``device`` and ``run``; its figures depend on the kind:

    * ``slow-windows``: ``windows`` (how many), ``seconds`` (their total
      duration), ``in_steady`` (how many lie in the steady-state samples, and
      so lowered the rate), ``first`` and ``last`` (start of the first, end of
      the last, s), ``lowest``, ``median`` and ``threshold`` (items/s),
      ``spans`` (``[[start, end], ...]`` of each window, s);
    * ``stall``: ``start``, ``end`` and ``seconds`` of the longest stall,
      ``count`` (stalls in the result), ``threshold`` (s), ``at_end`` (True:
      no window closed from ``start`` until a failed result ended),
      ``spans`` (every stall);
    * ``short-steady``: ``steady_s`` and ``required_s`` (s), ``rule``
      (``"min-steady"`` or ``"window"``).

    A result whose samples are malformed gets no flag (the summary skips it).
    """
    given = record.get("timings")
    timings: dict[str, Any] = given if isinstance(given, dict) else {}
    given = timings.get("train")
    train: dict[str, Any] = given if isinstance(given, dict) else {}
    samples = train.get("samples") or []
    where = {"device": str(record.get("device", "")), "run": record.get("run")}
    if steady is None:
        try:
            rate, chosen, _ = stats.steady_state(samples)
        except ValueError:
            return []
    else:
        rate, chosen = steady
    samples = sorted(samples, key=_START)
    running = [s for s in samples if not s.get("warmup")]
    # the samples' columns, in time order (C loops; the sums below add the same
    # floats in the same order as a loop over the samples)
    starts, ends = list(map(_START, samples)), list(map(_END, samples))
    steady_durations = [s["end"] - s["start"] for s in running]
    success = record.get("success") is True
    flags: list[Flag] = []
    if success and rate is not None:
        need, rule = required_steady(train)
        have = sum(steady_durations)
        if have + 1e-9 < need:
            flags.append(
                flag("short-steady", where=where, steady_s=have, required_s=need, rule=rule)
            )
    end = max(ends, default=0.0) - stats.STEADY_TAIL_S
    body = [s for s in running if s["end"] <= end]
    rates = [s["rate"] for s in body]
    # the reference is at most the fastest window: no window under half of that, no flag
    ref = reference_rate(body, chosen) if rates and min(rates) < WINDOW_FLOOR * max(rates) else None
    if ref is not None:
        reference, med, best = ref
        threshold = WINDOW_FLOOR * reference
        ids = {id(s) for s in chosen}
        low = [s for s in body if s["rate"] < threshold]
        if low and sum(s["end"] - s["start"] for s in low) >= WINDOW_MIN_S:
            flags.append(
                flag(
                    "slow-windows",
                    where=where,
                    windows=len(low),
                    seconds=sum(s["end"] - s["start"] for s in low),
                    in_steady=sum(1 for s in low if id(s) in ids),
                    first=low[0]["start"],
                    last=low[-1]["end"],
                    lowest=min(s["rate"] for s in low),
                    median=med,
                    best=best,
                    threshold=threshold,
                    spans=[[s["start"], s["end"]] for s in low],
                )
            )
    if samples:
        limit = _stall_limit(steady_durations if running else list(map(operator.sub, ends, starts)))
        spans: list[tuple[float, float]] = []
        # a window or a gap longer than the limit (any() in C first: most results have none)
        if any(map(limit.__lt__, map(operator.sub, ends, starts))) or any(
            map(limit.__lt__, map(operator.sub, starts[1:], ends))
        ):
            previous: list[Sample | None] = [None, *samples]
            for prev, cur in zip(previous, samples):
                if prev is not None and cur["start"] - prev["end"] > limit:
                    spans.append((prev["end"], cur["start"]))
                if cur["end"] - cur["start"] > limit:
                    spans.append((cur["start"], cur["end"]))
        at_end = False
        duration = (timings.get("program") or {}).get("duration")
        last = samples[-1]["end"]
        if (
            not success
            and isinstance(duration, (int, float))
            and math.isfinite(duration)
            and duration - last > limit
        ):
            spans.append((last, float(duration)))
            at_end = True
        if spans:
            start, stop = max(spans, key=lambda sp: sp[1] - sp[0])
            flags.append(
                flag(
                    "stall",
                    where=where,
                    start=start,
                    end=stop,
                    seconds=stop - start,
                    count=len(spans),
                    threshold=limit,
                    at_end=at_end and stop == spans[-1][1],
                    spans=[list(sp) for sp in spans],
                )
            )
    return flags


_START, _END = operator.itemgetter("start"), operator.itemgetter("end")


def group_flags(results: Sequence[tuple[Any, Any, float]]) -> list[tuple[int, Flag]]:
    """``outlier`` flags of a group: ``results`` are ``(device, run, rate)`` triples
    (rate in items/s; the successful results with a steady-state rate).

    Returns ``[(index, flag)]``: ``index`` is the result's position in
    ``results``; each :class:`milarun.measure.flags.Flag` is an ``"outlier"``
    at the result's ``device`` and ``run`` with figures ``rate``, ``ref`` (the
    median of the other results, items/s), ``ratio`` (``rate / ref``),
    ``direction`` (``"low"`` or ``"high"``) and ``others`` (how many other
    results). Fewer than 2 results: no flag.

    The leave-one-out medians come from one sorted copy of the rates (and one of
    the deviations per distinct median), not from a sort per result: the same
    floats as :func:`statistics.median` of each result's others, in O(n log n)
    rather than O(n² log n) (a test run 25 times on 8 GPUs has 200 results).
    """
    flags: list[tuple[int, Flag]] = []
    if len(results) < 2:
        return flags
    rates = [rate for _, _, rate in results]
    if not all(isinstance(r, (int, float)) and math.isfinite(r) for r in rates):
        return _group_flags_plain(results)  # NaN sorts nowhere: the plain rule decides
    ordered = sorted(rates)
    deviations: dict[float, list[float]] = {}  # ref -> sorted |rate - ref| of every result
    for i, (device, run, rate) in enumerate(results):
        ref = _median_without(ordered, rate)
        if not ref > 0:
            continue
        spread = 0.0
        if len(results) - 1 >= 3:
            spread_of = deviations.get(ref)
            if spread_of is None:
                spread_of = deviations[ref] = sorted(abs(v - ref) for v in rates)
            spread = K_MAD * MAD_SCALE * _median_without(spread_of, abs(rate - ref))
        flags += _outlier(device, run, rate, ref, spread, len(results) - 1, i)
    return flags


def _median_without(ordered: Sequence[float], value: float) -> float:
    """``statistics.median`` of the sorted list ``ordered`` less one element equal to
    ``value`` (which one does not matter: they are equal)."""
    k = bisect.bisect_left(ordered, value)
    m = len(ordered) - 1

    def at(j: int) -> float:  # the j-th element of ``ordered`` without its k-th
        return ordered[j] if j < k else ordered[j + 1]

    if m % 2 == 1:
        return at(m // 2)
    return (at(m // 2 - 1) + at(m // 2)) / 2


def _group_flags_plain(
    results: Sequence[tuple[Any, Any, float]],
) -> list[tuple[int, Flag]]:
    """:func:`group_flags` computed as its rule reads, a median per result."""
    flags: list[tuple[int, Flag]] = []
    for i, (device, run, rate) in enumerate(results):
        others = [r for j, (_, _, r) in enumerate(results) if j != i]
        ref = statistics.median(others)
        if not ref > 0:
            continue
        spread = K_MAD * MAD_SCALE * _mad(others, ref) if len(others) >= 3 else 0.0
        flags += _outlier(device, run, rate, ref, spread, len(others), i)
    return flags


def _outlier(
    device: Any, run: Any, rate: float, ref: float, spread: float, others: int, index: int
) -> list[tuple[int, Flag]]:
    """``[(index, flag)]`` when ``rate`` is beyond the margin around ``ref``, else ``[]``."""
    margin = max(spread, GROUP_FLOOR * ref)
    direction = None
    if rate < ref - margin:
        direction = "low"
    elif others >= 3 and rate > ref + margin:
        direction = "high"
    if not direction:
        return []
    return [
        (
            index,
            flag(
                "outlier",
                where={"device": str(device), "run": run},
                rate=rate,
                ref=ref,
                ratio=rate / ref,
                direction=direction,
                others=others,
            ),
        )
    ]


def describe(flag: Flag) -> str:
    """One sentence for a flag: the result it is about, then its message (shared by
    the text report and the HTML, through :mod:`milarun.report.checks`)."""
    return f"{flag.who()}: {flag.message}"


def merged(flags: Sequence[Flag]) -> list[Flag]:
    """A test's flags as the report lists them: each flag, except that the
    ``short-steady`` flags of one rule become one flag about several results (a run
    on 8 GPUs would otherwise repeat it 8 times)."""
    out: list[Flag] = []
    short: dict[tuple[Any, Any], list[Flag]] = {}
    for f in flags:
        if f.id == "short-steady":
            short.setdefault((f.figures.get("required_s"), f.figures.get("rule")), []).append(f)
    done: set[tuple[Any, Any]] = set()
    for f in flags:
        key = (f.figures.get("required_s"), f.figures.get("rule"))
        if f.id != "short-steady" or len(short[key]) == 1:
            out.append(f)
        elif key not in done:
            done.add(key)
            group = short[key]
            have = [g.figures["steady_s"] for g in group]
            who = ", ".join(g.who() for g in group)
            rule = group[0].message.split(", less than ", 1)[1]
            span = (
                f"{min(have):.1f}"
                if f"{min(have):.1f}" == f"{max(have):.1f}"
                else f"{min(have):.1f} to {max(have):.1f}"
            )
            out.append(
                replace(
                    group[0],
                    subject=f"{len(group)} results ({who})",
                    message=f"{span} s of steady state, less than {rule}",
                )
            )
    return out


#: Short words for the text table's ``anomalies`` column, in :data:`KINDS` order.
SHORT = {"slow-windows": "slow", "stall": "stall", "short-steady": "short", "outlier": "outlier"}


def short_kinds(flags: Iterable[Flag]) -> str:
    """The kinds present in ``flags`` as short words (``"slow stall"``), in a fixed order."""
    kinds = {f.id for f in flags}
    return " ".join(SHORT[k] for k in KINDS if k in kinds)
