"""Capacity search: the highest load at which a serving level still meets its SLO (pure).

A load is a request rate (requests/s, a float) or a concurrency (requests in flight, an
int); a level *passes* when its :func:`milarun.measure.latency.level_figures` report
``slo_met``. Measuring a level takes minutes, so the search is step-driven: the caller
asks :meth:`CapacitySearch.next_load`, measures that load, and hands the verdict back
with :meth:`CapacitySearch.record`, until the search is done.

Method: bracket, then bisect.

1. Measure ``start``. While every level passes, double the load (clamped to
   ``highest``); a pass at ``highest`` ends the search ("passes at highest").
   While every level fails, halve it (clamped to ``lowest``); a failure at
   ``lowest`` ends it ("fails at lowest").
2. Once a passing load ``lo`` and a failing load ``hi`` bracket the capacity,
   measure the arithmetic midpoint ``(lo + hi) / 2`` (in integer mode its floor)
   and replace ``lo`` or ``hi`` by it. The arithmetic midpoint, not the geometric
   one: a bracket found by doubling or halving is within a factor of two, where the
   two midpoints differ by at most 6 %, and the arithmetic one keeps a concurrency
   on integers.
3. Stop when ``hi / lo ≤ 1 + resolution`` (integer mode: ``hi − lo ≤ 1``, every
   load between measured) — "converged" — or when ``max_steps`` levels were
   measured — "max steps".

The capacity is the highest passing load (``lo``). Every measured ``(load, passed)``
is kept, in order, in :attr:`CapacitySearch.steps`: the walked curve is part of the
result. Integer mode measures no load twice.

Sources: this is what MLPerf Inference LoadGen's ``TestMode::FindPeakPerformance`` does
for the Server scenario (mlcommons/inference, ``loadgen/loadgen.cc``: ``FindBoundaries``
doubles the target QPS until a run fails its latency constraints, then
``FindPeakPerformanceBinarySearch`` bisects between the last pass and the first
failure); ``vllm bench sweep`` and AIPerf-style sweeps approximate it with a fixed grid
of request rates or concurrencies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

Load = float | int


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class CapacitySearch:
    """A bounded search for the highest passing load (module docstring for the method).

    Args:
        start: the first load to measure (requests/s, or requests in flight when
            ``integer``; rounded to the nearest integer then).
        integer: loads are integers (a concurrency) rather than rates.
        lowest, highest: the range of loads measured, ``0 < lowest ≤ start ≤
            highest`` (integer mode: an integer must lie between them).
        max_steps: the most levels measured (≥ 1).
        resolution: float mode stops once ``hi / lo ≤ 1 + resolution`` (> 0; 0.1:
            the capacity is known within 10 %). Integer mode stops at ``hi − lo ≤ 1``.

    Raises:
        ValueError: one line naming the argument out of its range.
    """

    def __init__(
        self,
        start: float,
        *,
        integer: bool,
        lowest: float,
        highest: float,
        max_steps: int,
        resolution: float = 0.1,
    ) -> None:
        for name, value in (("start", start), ("lowest", lowest), ("highest", highest)):
            if not _is_number(value) or not math.isfinite(value):
                raise ValueError(f"{name}: expected a finite number, got {value!r}")
        if not 0 < lowest <= start <= highest:
            raise ValueError(
                f"start: expected 0 < lowest <= start <= highest, got lowest {lowest}, "
                f"start {start}, highest {highest}"
            )
        if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
            raise ValueError(f"max_steps: expected an integer >= 1, got {max_steps!r}")
        if not _is_number(resolution) or not 0 < resolution < math.inf:
            raise ValueError(f"resolution: expected a finite number > 0, got {resolution!r}")
        self.integer = bool(integer)
        self.max_steps = max_steps
        self.resolution = float(resolution)
        if self.integer:
            self.lowest: Load = math.ceil(lowest)
            self.highest: Load = math.floor(highest)
            if self.lowest > self.highest:
                raise ValueError(f"highest: no integer load between {lowest} and {highest}")
            first: Load = min(max(round(start), self.lowest), self.highest)
        else:
            self.lowest, self.highest, first = float(lowest), float(highest), float(start)
        self._steps: list[tuple[Load, bool]] = []
        self._lo: Load | None = None  # highest passing load so far
        self._hi: Load | None = None  # lowest failing load so far
        self._next: Load | None = first
        self._reason: str | None = None

    @property
    def steps(self) -> list[tuple[Load, bool]]:
        """Every measured ``(load, passed)``, in the order measured (a copy)."""
        return list(self._steps)

    @property
    def capacity(self) -> Load | None:
        """The highest passing load so far; None when no load passed."""
        return self._lo

    @property
    def bracket(self) -> tuple[Load | None, Load | None]:
        """``(lo, hi)``: the highest passing and the lowest failing load so far."""
        return self._lo, self._hi

    @property
    def done(self) -> bool:
        """True once the search ended (:attr:`reason` says why)."""
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        """Why the search ended: "converged", "max steps", "passes at highest" or
        "fails at lowest"; None while it runs."""
        return self._reason

    def next_load(self) -> Load | None:
        """The next load to measure; None when the search is done."""
        return self._next

    def record(self, load: Load, passed: bool) -> None:
        """Record the verdict of measuring ``load``, the one :meth:`next_load` asked.

        Raises:
            ValueError: the search is done, ``load`` is not the one asked, or
                ``passed`` is not a bool.
        """
        if self._next is None:
            raise ValueError(f"load: the search is done ({self._reason}), nothing to record")
        if not _is_number(load) or load != self._next:
            raise ValueError(f"load: expected {self._next} (the one asked), got {load!r}")
        if not isinstance(passed, bool):
            raise ValueError(f"passed: expected a bool, got {passed!r}")
        load = self._next
        self._steps.append((load, passed))
        if passed:
            self._lo = load if self._lo is None else max(self._lo, load)
        else:
            self._hi = load if self._hi is None else min(self._hi, load)
        self._next = self._advance(load, passed)
        if self._next is not None and len(self._steps) >= self.max_steps:
            self._next, self._reason = None, "max steps"

    def _advance(self, load: Load, passed: bool) -> Load | None:
        """The load after ``load``, or None with :attr:`reason` set when the search ends."""
        lo, hi = self._lo, self._hi
        if hi is None:  # every level passed so far: double
            if load >= self.highest:
                self._reason = "passes at highest"
                return None
            return min(load * 2, self.highest)
        if lo is None:  # every level failed so far: halve
            if load <= self.lowest:
                self._reason = "fails at lowest"
                return None
            return max(load // 2 if self.integer else load / 2, self.lowest)
        if (hi - lo <= 1) if self.integer else (hi / lo <= 1 + self.resolution):
            self._reason = "converged"
            return None
        # lo < hi: loads are only measured inside the bracket once it exists.
        return (lo + hi) // 2 if self.integer else (lo + hi) / 2


def run_search(search: CapacitySearch, measure: Callable[[Load], bool]) -> CapacitySearch:
    """Measure each load ``search`` asks with ``measure(load) -> passed`` until it is done;
    returns ``search``."""
    while (load := search.next_load()) is not None:
        search.record(load, measure(load))
    return search


def capacity_of(steps: Sequence[tuple[float, bool]]) -> float | None:
    """The capacity a walked search shows: the highest passing load below every failing
    one (None when none is). For a summary or ``verify`` that re-judged each step's level
    from its raw timings: a step that passes above a failure does not count, as a search
    would not have kept it."""
    fails = [load for load, passed in steps if not passed]
    below = [load for load, passed in steps if passed and all(load < f for f in fails)]
    return max(below) if below else None


__all__ = ["CapacitySearch", "run_search", "capacity_of", "Load"]
