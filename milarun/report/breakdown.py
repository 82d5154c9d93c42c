"""The tables beside the score (they do not change it): per-GPU, per-node, scaling and the
concurrent waves, each from the summary's tests (``{group: normalized summary entry}``).

* Per-GPU comparison (``--compare-gpus``, :func:`gpu_tables`): each device's steady-state
  rate statistic (mean, min, max) over the best device's for that test.
* Node comparison (``--compare-nodes``, :func:`node_comparison`): for each
  test whose results (successful or failed: the summary's ``pernode`` and
  ``pernode_failures``) come from two nodes or more, each node's mean
  steady-state throughput divided by the median of the OTHER nodes' means
  (leave-one-out; with two nodes, the peer's mean). A node whose ratio is
  below ``1 - threshold/100`` (default threshold 5 %) is SLOW; a node with
  failures and no steady-state rate is FAILED.
* Scaling efficiency (:func:`scaling_tables`), for node-progression groups
  ``suite.job.<n>x<g>``: ``efficiency(n, g) = T(n, g) / (n * g * T(1, 1))``
  where ``T`` is a group's mean steady-state throughput (items/s; the whole
  job's rate for a multi-node record) and ``T(1, 1)``, the 1-node × 1-GPU
  group's mean, is the per-GPU baseline: 1.0 is perfect linear scaling over
  the ``n × g`` GPUs. This is the node × GPU study of torch_io_benchmark's
  multi-node DDP experiments (2 and 4 nodes × 2, 4 and 8 GPUs per node,
  throughput compared with the single-GPU run). Without a 1x1 result (or
  when every 1x1 run failed) there is no baseline and no efficiency is shown.
* Concurrent waves (:func:`concurrent_tables`): each process's own and effective
  throughput (items/s), the waves' overlap and start skew.
"""

import math
import statistics

from ..analysis.summary import device_key, node_key
from ..errors import MilarunError
from ..measure.throughput import MIN_OVERLAP

#: The per-GPU statistics :func:`gpu_tables` shows.
GPU_STATS = ("mean", "min", "max")

#: Percentage below the median of the other nodes at which ``--compare-nodes`` calls a
#: node SLOW.
NODE_THRESHOLD_PCT = 5.0


def concurrent_tables(tests, min_overlap=None):
    """The tests with concurrent waves (the summary's fields from
    :func:`milarun.measure.throughput.summarize_waves`).

    Returns ``(overlap, concurrent)``: ``overlap`` lists ``(test, fraction)`` for
    the tests whose smallest wave overlap is below ``min_overlap`` (default
    :data:`milarun.measure.throughput.MIN_OVERLAP`); ``concurrent`` has one entry per
    test with an effective throughput: ``{"test", "devices": [{"device", "own",
    "effective"}] (mean items/s of each process), "adjusted": mean per-wave
    adjusted throughput (items/s), "overlap": fraction, "skew_s": s or None,
    "waves", "synchronized"}``.
    """
    min_overlap = MIN_OVERLAP if min_overlap is None else min_overlap
    overlap, concurrent = [], []
    for group, t in tests.items():
        if t.get("overlap") is None:
            continue
        if t["overlap"] < min_overlap:
            overlap.append((group, t["overlap"]))
        eff = t.get("pergpu_effective") or {}
        if not eff:
            continue
        sync = t.get("sync") or {}
        devices = sorted(set(t.get("pergpu") or {}) | set(eff), key=device_key)
        concurrent.append(
            {
                "test": group,
                "devices": [
                    {
                        "device": d,
                        "own": ((t.get("pergpu") or {}).get(d) or {}).get("mean"),
                        "effective": (eff.get(d) or {}).get("mean"),
                    }
                    for d in devices
                ],
                "adjusted": (t.get("adjusted") or {}).get("mean"),
                "overlap": t["overlap"],
                "skew_s": sync.get("skew_s"),
                "waves": sync.get("waves"),
                "synchronized": sync.get("synchronized"),
            }
        )
    return overlap, concurrent


def gpu_tables(tests):
    """Per-GPU comparison: ``{stat: {"devices": [...], "rows": [(test, {dev: ratio})]}}``.

    For each test and each of mean, min and max, every device's steady-state
    rate statistic is divided by the best device's value for that test
    (1.0 = the best GPU of the row). Tests with no per-GPU data are left out.
    min and max are left out too when no device has more than one rate in any
    test: they would repeat the mean (:func:`gpu_runs_repeat` says whether).
    """
    out = {}
    devices = sorted({d for t in tests.values() for d in t.get("pergpu", {})}, key=device_key)
    stats_shown = GPU_STATS if gpu_runs_repeat(tests) else ("mean",)
    for stat in stats_shown:
        rows = []
        for group, t in tests.items():
            values = {
                d: s.get(stat) for d, s in t.get("pergpu", {}).items() if s.get(stat) is not None
            }
            if not values:
                continue
            best = max(values.values())
            rows.append((group, {d: (v / best if best > 0 else None) for d, v in values.items()}))
        out[stat] = {"devices": devices, "rows": rows}
    return out


def gpu_runs_repeat(tests):
    """True when some device of some test has more than one steady-state rate."""
    return any(
        (s.get("n") or 0) > 1 for t in tests.values() for s in (t.get("pergpu") or {}).values()
    )


def check_node_threshold(value):
    """Return ``value`` (``--node-threshold``, a percentage) as a float.

    Raises:
        MilarunError: not a finite number from 0 to 100.
    """
    try:
        pct = float(value)
    except (TypeError, ValueError):
        pct = math.nan
    if isinstance(value, bool) or not 0 <= pct <= 100:  # NaN fails both
        raise MilarunError(
            f"--node-threshold must be a percentage from 0 to 100, not {value!r}"[:120]
        )
    return pct


def node_comparison(tests, threshold=NODE_THRESHOLD_PCT):
    """Each node's throughput against the median of the other nodes, per test.

    ``tests`` is a normalized summary's ``tests``; ``threshold`` a percentage.
    A test takes part when two nodes or more have results in it, successful
    (``pernode``) or failed (``pernode_failures``). For each such node:

    * ``mean``: its mean steady-state rate (items/s), None without one;
    * ``ref``: the median of the means of the OTHER nodes of the test
      (items/s), None when no other node has one;
    * ``ratio`` = ``mean / ref`` and ``slow`` = ``ratio < 1 - threshold/100``;
    * ``fail``: its failed results; ``failed``: it has failures and no mean
      (no successful result with a steady-state rate: in practice every run
      of the test on it failed), so it cannot be slow but is broken. It
      stays out of the other nodes' ``ref``.

    Why leave-one-out: against the median of all node means, the node under
    test pulls its own reference towards itself. With two nodes that median
    is their average, so a node 9 % below its peer has ratio 0.953 and passes
    a 5 % threshold; against the peer's mean it is 0.91 and is flagged. With
    three nodes or more the median of the others is still robust to one
    outlier and close to the cluster median, and a slow node never lowers its
    own bar.

    Returns ``{"threshold": pct, "nodes": [every node name seen],
    "tests": [{"test", "nodes": [{"node", "n", "fail", "mean", "ref",
    "ratio", "slow", "failed"}]}], "slow": {node: [(test, ratio)]},
    "failed": {node: [(test, failures)]}}``; ``tests`` is empty when no test
    has results from two nodes.
    """
    seen: set = set()
    rows: list = []
    slow: dict = {}
    failed: dict = {}
    for group, t in tests.items():
        means = {
            node: st["mean"]
            for node, st in (t.get("pernode") or {}).items()
            if st.get("mean") is not None
        }
        fails = {node: c for node, c in (t.get("pernode_failures") or {}).items() if c}
        seen.update(t.get("pernode") or {}, fails)
        present = set(means) | set(fails)
        if len(present) < 2:
            continue
        nodes = []
        for node in sorted(present, key=node_key):
            others = [m for other, m in means.items() if other != node]
            ref = statistics.median(others) if others else None
            mean = means.get(node)
            ratio = mean / ref if mean is not None and ref else None
            is_slow = ratio is not None and ratio < 1 - threshold / 100
            is_failed = mean is None
            if is_slow:
                slow.setdefault(node, []).append((group, ratio))
            if is_failed:
                failed.setdefault(node, []).append((group, fails[node]))
            st = (t.get("pernode") or {}).get(node) or {}
            nodes.append(
                {
                    "node": node,
                    "n": st.get("n", 0),
                    "fail": fails.get(node, 0),
                    "mean": mean,
                    "ref": ref,
                    "ratio": ratio,
                    "slow": is_slow,
                    "failed": is_failed,
                }
            )
        rows.append({"test": group, "nodes": nodes})
    return {
        "threshold": threshold,
        "nodes": sorted(seen, key=node_key),
        "tests": rows,
        "slow": {node: slow[node] for node in sorted(slow, key=node_key)},
        "failed": {node: failed[node] for node in sorted(failed, key=node_key)},
    }


def scaling_tables(tests):
    """Scaling efficiency of node-progression tests (formula in the module doc).

    ``tests`` is a normalized summary's ``tests``; groups with ``node_count``
    and ``gpus_per_node`` take part. Returns one entry per test (``suite.job``),
    sorted: ``{"test", "nodes": [n, ...], "gpus": [g, ...], "base": T(1, 1)
    in items/s or None, "cells": {(n, g): {"throughput": items/s or None,
    "efficiency": fraction or None, "group"}}}``.
    """
    by_test: dict = {}
    for group, t in tests.items():
        n, g = t.get("node_count"), t.get("gpus_per_node")
        if t.get("partition") != "node-progression" or not n or not g:
            continue
        by_test.setdefault(t.get("name", group), {})[(n, g)] = (group, t["train"]["mean"])
    out = []
    for name in sorted(by_test):
        cells = by_test[name]
        base = cells.get((1, 1), (None, None))[1]
        if base is not None and base <= 0:
            base = None
        table = {}
        for (n, g), (group, rate) in cells.items():
            eff = rate / (n * g * base) if rate is not None and base else None
            table[(n, g)] = {"throughput": rate, "efficiency": eff, "group": group}
        out.append(
            {
                "test": name,
                "nodes": sorted({n for n, _ in cells}),
                "gpus": sorted({g for _, g in cells}),
                "base": base,
                "cells": table,
            }
        )
    return out
