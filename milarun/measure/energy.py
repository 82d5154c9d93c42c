"""Power and energy per item over a result's steady state, from the GPU monitor's readings.

Pure code: no torch, no I/O. The monitor (:mod:`milarun.bench.monitor`)
records, per GPU and every ``interval`` seconds, the power draw (W) and the
energy used since it started (J, from NVML's total-energy counter,
``nvmlDeviceGetTotalEnergyConsumption``, in mJ, on Volta and newer).

For one result, over its steady state ``[a, b]`` (the first start and the
last end of the samples :func:`milarun.measure.stats.steady_state` chose, s since
program start), for each of its GPUs:

* with the energy counter: ``E = E(b) - E(a)``, ``E(t)`` linearly
  interpolated between readings;
* without it (older GPUs): the trapezoidal integral of the power readings
  over ``[a, b]`` (power interpolated at the ends).

Where the readings do not reach an end of the interval, the interval is cut
to the readings, provided at least half of it stays covered. The result's
mean power is ``P = sum over its GPUs of E / (b - a)`` (W), its energy per
item ``J/item = P / rate`` (``rate`` the steady-state throughput, items/s)
and ``items/J = rate / P``.

A record of a job over several nodes (``multi-node``, ``node-progression``)
sums over every node's GPUs: its monitor readings carry ``"node"`` (gathered to
rank 0, :func:`milarun.bench.monitor.merge_node_monitors`), and a record whose
readings do not cover each of its nodes (``gpu_monitor.nodes_sampled`` short of
its node count, or a record from before the gathering) has no energy, with the
reason, never one node's energy over every node's items.

A node's power in a test is the sum of its results' powers in one run
(the per-GPU processes run at once), averaged over runs; its J/item is the
energy of its results over their items.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from . import stats
from .plausibility import steady_window
from .stats import Steady, finite

#: Sorted ``(t, value)`` readings of one GPU.
Points = Sequence[tuple[float, float]]

#: Least fraction of the steady state the readings must cover.
MIN_COVERAGE = 0.5
#: Largest mean power of one result accepted (W): above it the readings are refused, so
#: sums over 10^6 results (energy up to 10^9 W x 10^9 s each) cannot overflow.
MAX_POWER_W = 1e9
#: Largest item count of one steady state accepted (items).
MAX_ITEMS = 1e21


def _interp(points: Points, t: float) -> float | None:
    """Linear interpolation of sorted ``[(t, value)]`` at ``t`` (inside their span)."""
    for (t0, v0), (t1, v1) in zip(points, points[1:]):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return points[-1][1] if points and t == points[-1][0] else None


def _at(points: Points, t: float) -> float:
    """:func:`_interp` at a ``t`` inside the span of ``points`` (where it has a value)."""
    value = _interp(points, t)
    assert value is not None, "interpolated inside the readings' span"
    return value


def _integral(points: Points, a: float, b: float) -> float:
    """Trapezoidal integral of sorted ``[(t, value)]`` over [a, b] (inside their span)."""
    inside = [(t, v) for t, v in points if a < t < b]
    pts = [(a, _at(points, a))] + inside + [(b, _at(points, b))]
    return sum((t1 - t0) * (v0 + v1) / 2 for (t0, v0), (t1, v1) in zip(pts, pts[1:]))


def _cut(points: Points, a: float, b: float) -> tuple[float, float] | None:
    """``[a, b]`` cut to the span of ``points``, or None when less than
    :data:`MIN_COVERAGE` of it is left (or fewer than 2 readings)."""
    if len(points) < 2:
        return None
    lo, hi = max(a, points[0][0]), min(b, points[-1][0])
    if hi <= lo or (hi - lo) < MIN_COVERAGE * (b - a):
        return None
    return lo, hi


def device_energy(
    readings: Iterable[Mapping[str, Any]], a: float, b: float
) -> tuple[float, float, str] | None:
    """Energy (J) and the interval it covers for one GPU's monitor readings over [a, b].

    Returns ``(joules, seconds, source)`` with ``source`` ``"counter"`` or
    ``"power"``, or None when neither the counter nor power readings cover
    enough of the interval.
    """
    for key, source in (("energy", "counter"), ("power", "power")):
        points = sorted(
            (r["t"], r[key])
            for r in readings
            if finite(r.get("t")) and finite(r.get(key)) and "error" not in r
        )
        span = _cut(points, a, b)
        if span is None:
            continue
        lo, hi = span
        if source == "counter":
            joules = _at(points, hi) - _at(points, lo)
        else:
            joules = _integral(points, lo, hi)
        if joules >= 0:
            return joules, hi - lo, source
    return None


def record_nodes(record: Mapping[str, Any]) -> int:
    """Nodes one record's rate was measured over: its ``node_count``, or the nodes its
    ``distributed`` job gathered, whichever is larger (1 without either)."""
    count = record.get("node_count")
    count = count if isinstance(count, int) and not isinstance(count, bool) else 1
    names = (record.get("distributed") or {}).get("node_names")
    return max(1, count, len(names) if isinstance(names, list) else 0)


def _nodes_missing(record: Mapping[str, Any], monitor: Mapping[str, Any]) -> str | None:
    """Why a multi-node record's readings do not cover all of its nodes, or None."""
    nodes = record_nodes(record)
    if nodes <= 1:
        return None
    sampled = monitor.get("nodes_sampled")
    sampled = sampled if isinstance(sampled, int) and not isinstance(sampled, bool) else 1
    if sampled >= nodes:
        return None
    gaps = monitor.get("node_gaps")
    return (
        f"GPU readings of {sampled} of the job's {nodes} nodes only"
        + (f" ({gaps})" if isinstance(gaps, str) and gaps else "")
        + ": the energy of the others is unknown"
    )


def result_energy(record: Mapping[str, Any], steady: Steady | None = None) -> dict[str, Any]:
    """Power and energy of one successful result over its steady state.

    Returns ``{"power_w", "energy_j", "items", "j_per_item", "items_per_j",
    "rate", "source", "gpus"}`` (``energy_j`` and ``items`` over the chosen
    samples' duration; ``source`` ``"counter"``, ``"power"`` or ``"mixed"``;
    ``gpus`` the number of GPUs summed), or ``{"reason": why}`` when not
    available: no GPU monitor, no steady state, readings that do not cover it, or
    (a record over several nodes) readings that miss a node. ``gpus`` counts every
    node's GPUs; ``power_w`` is the job's, summed over them (W). ``steady``:
    ``(rate, chosen, note)`` of :func:`milarun.measure.stats.steady_state` of its
    samples when the caller has it; else it is computed.
    """
    monitor = record.get("gpu_monitor") or {}
    if not monitor.get("available"):
        return {"reason": "no GPU monitor readings (" + (monitor.get("reason") or "off") + ")"}
    try:
        rate, a, b, items, duration, _ = steady_window(record, steady)
    except ValueError:
        return {"reason": "malformed samples"}
    if not rate or a is None or b is None or b <= a:  # a and b: both None, or neither
        return {"reason": "no steady state"}
    missing = _nodes_missing(record, monitor)
    if missing:
        return {"reason": missing}
    by_device: defaultdict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in monitor.get("samples") or []:
        if isinstance(r, dict) and isinstance(r.get("device"), int):
            node = r.get("node", 0)
            by_device[(node if isinstance(node, int) else -1, r["device"])].append(r)
    if not by_device:
        return {"reason": "no GPU monitor readings"}
    power = 0.0
    sources: set[str] = set()
    for (node, dev), readings in sorted(by_device.items()):
        got = device_energy(readings, a, b)
        if got is None:
            where = f"node {node} GPU {dev}" if node else f"GPU {dev}"
            return {"reason": f"{where}: the readings do not cover the steady state"}
        joules, seconds, source = got
        power += joules / seconds
        sources.add(source)
    energy = power * duration
    # Readings of 1e308 J, or ones 1e-300 s apart, overflow: no energy rather than inf
    # (the schema bounds rates and times; a power above 1e9 W is no GPU's either).
    items_per_j = rate / power if power > 0 else None
    if not (
        stats.finite(energy)
        and 0 <= power <= MAX_POWER_W
        and items <= MAX_ITEMS
        and (items_per_j is None or stats.finite(items_per_j))
    ):
        return {"reason": "GPU readings out of range"}
    return {
        "power_w": power,
        "energy_j": energy,
        "items": items,
        "rate": rate,
        "j_per_item": power / rate,
        "items_per_j": items_per_j,
        "source": sources.pop() if len(sources) == 1 else "mixed",
        "gpus": len(by_device),
    }


def summarize_energy(
    items: Iterable[Sequence[Any]], node_of: Callable[[Mapping[str, Any]], str | None]
) -> dict[str, Any] | None:
    """The summary's ``energy`` entry of one group, or None when no result has one.

    ``items`` are ``(path, record)`` or ``(path, record, steady)`` tuples (``steady``:
    as for :func:`result_energy`); successful records count.
    Returns ``{"n": results with energy, "source": "counter"|"power"|"mixed",
    "power_w": {n, min, max, mean, std} of per-result power (W), "energy_j":
    J over the steady states, "items": items over them, "j_per_item",
    "items_per_j", "pernode": {node: {"power_w": W summed over the node's
    results of a run, mean over runs, "j_per_item", "runs"}}}``.
    """
    got: list[tuple[Mapping[str, Any], dict[str, Any]]] = []
    for item in items:
        rec = item[1]
        if rec.get("success") is not True:
            continue
        e = result_energy(rec, item[2] if len(item) > 2 else None)
        if "power_w" in e:
            got.append((rec, e))
    if not got:
        return None
    energy = math.fsum(e["energy_j"] for _, e in got)
    count = math.fsum(e["items"] for _, e in got)
    node_runs: defaultdict[str, defaultdict[Any, float]] = defaultdict(lambda: defaultdict(float))
    node_totals: defaultdict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for rec, e in got:
        node = node_of(rec)
        if node is None:
            continue
        node_runs[node][rec.get("run", 0)] += e["power_w"]
        node_totals[node][0] += e["energy_j"]
        node_totals[node][1] += e["items"]
    sources = {e["source"] for _, e in got}
    return {
        "n": len(got),
        "source": sources.pop() if len(sources) == 1 else "mixed",
        "power_w": stats.describe([e["power_w"] for _, e in got]),
        "energy_j": energy,
        "items": count,
        "j_per_item": energy / count if count > 0 else None,
        "items_per_j": count / energy if energy > 0 else None,
        "pernode": {
            node: {
                "power_w": math.fsum(runs.values()) / len(runs),
                "j_per_item": (
                    node_totals[node][0] / node_totals[node][1]
                    if node_totals[node][1] > 0
                    else None
                ),
                "runs": len(runs),
            }
            for node, runs in sorted(node_runs.items())
        },
    }
