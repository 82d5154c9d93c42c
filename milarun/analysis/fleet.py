"""The fleet view: each node's figure against the fleet's median, with a robust spread.

A buyer accepting a cluster of hundreds of nodes wants the list of machines to send back
(SuperBench's question: which nodes of a fleet are defective). Per test with results from
``min_nodes`` nodes or more (the summary's ``pernode``), the node figure is the node's
mean steady-state throughput (items/s) and:

* ``median``: the fleet's median of the node figures (items/s);
* ``mad``: the median absolute deviation, ``median(|x_i - median|)`` (items/s);
* ``scaled_mad`` = :data:`MAD_SCALE` × ``mad``: a consistent estimator of the standard
  deviation for normally distributed figures. The constant is ``1 / Phi^-1(3/4)``
  = 1.4826 (Rousseeuw and Croux 1993, "Alternatives to the Median Absolute Deviation",
  JASA 88(424): 1273-1283; Huber 1981, Robust Statistics, section 5.1);
* each node's robust z = ``(x - median) / scaled_mad`` (no unit).

A node is **outside** the fleet in a test when it is *below* the median by more than ``k``
scaled MADs (default :data:`DEFAULT_K` = 3, the "very conservative" cut of Leys, Ley,
Klein, Bernard and Licata 2013, "Detecting outliers: Do not use standard deviation around
the mean, use absolute deviation around the median", J. Exp. Soc. Psychol. 49(4): 764-766;
sending a machine back is costly, so the conservative cut) **and** by more than
``min_relative`` of the median (default :data:`DEFAULT_MIN_RELATIVE`, 2 %): on a uniform
fleet the MAD is near zero and a 0.1 % difference would be many scaled MADs away. A MAD of
0 gives an infinite z for any node off the median, and the relative floor alone decides. A
node faster than the fleet is never outside: it is not defective.

With fewer than ``min_nodes`` nodes (3 by default) a test is *not judged*: with two nodes
the median is their average and the MAD half their gap, so each node is exactly one MAD
away from the median whatever the gap, and no spread tells which of the two is slow.

Besides the figures, per node: its failed runs in each test (``pernode_failures``; a node
failed in a test when it has failures and no figure: every run failed) and its GPU health
findings (the ``gpu-health-error`` and ``gpu-health-warning`` validation flags of the
records that ran on it, failed records included: :func:`milarun.measure.flags.health_flags`).

The nodes to **send back** are those outside in some test, with a GPU health error, or
whose every run of some test failed; each with its reasons. Pure: no I/O, no torch.
Malformed input (a node without a mean, a NaN or negative figure, a test that is not an
object) is never a crash: it is left out and named in one line of ``notes``.
"""

import math
import statistics

from ..errors import MilarunError
from .summary import node_key

#: 1 / Phi^-1(3/4): the MAD times this estimates the standard deviation of normal data
#: (Rousseeuw and Croux 1993).
MAD_SCALE = 1.4826
#: Scaled MADs below the median beyond which a node is outside (Leys et al. 2013).
DEFAULT_K = 3.0
#: Fraction of the median a node must also be below it by to be outside.
DEFAULT_MIN_RELATIVE = 0.02
#: Fewest nodes with a figure for a test to be judged.
DEFAULT_MIN_NODES = 3
#: The validation flags of the GPU health findings, and the count each goes to.
HEALTH_CHECKS = {"gpu-health-error": "errors", "gpu-health-warning": "warnings"}


def check_parameters(k, min_relative, min_nodes):
    """Return ``(k, min_relative, min_nodes)`` as ``(float, float, int)``.

    Raises:
        MilarunError: ``k`` not a finite number above 0, ``min_relative`` not a fraction
            from 0 to 1, or ``min_nodes`` not a whole number of 3 or more.
    """
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not 0 < k < math.inf:
        raise MilarunError(f"fleet k must be a number of scaled MADs above 0, not {k!r}")
    if (
        isinstance(min_relative, bool)
        or not isinstance(min_relative, (int, float))
        or not 0 <= min_relative <= 1
    ):
        raise MilarunError(
            f"fleet min_relative must be a fraction from 0 to 1, not {min_relative!r}"
        )
    if isinstance(min_nodes, bool) or not isinstance(min_nodes, int) or min_nodes < 3:
        raise MilarunError(
            f"fleet min_nodes must be a whole number of 3 or more (2 nodes have no robust "
            f"spread), not {min_nodes!r}"
        )
    return float(k), float(min_relative), min_nodes


def _key(name):
    return node_key(str(name))


def _figure(stats):
    """``(figure, problem)``: the node's mean (items/s) when it is a finite number >= 0,
    else None and why."""
    mean = stats.get("mean") if isinstance(stats, dict) else None
    if mean is None:
        return None, "no mean"
    if isinstance(mean, bool) or not isinstance(mean, (int, float)):
        return None, f"mean is not a number ({type(mean).__name__})"
    if not math.isfinite(mean) or mean < 0:
        return None, f"mean is not a finite number >= 0 ({mean!r})"
    return float(mean), None


def _count(value):
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def health_counts(test):
    """``{node: {"errors": n, "warnings": n}}``: the GPU health flags of one test entry
    (its ``validation_flags``) by the node of their record; a flag without a node (a
    record that spanned several nodes) is no node's."""
    out: dict = {}
    flags = test.get("validation_flags") if isinstance(test, dict) else None
    for f in flags if isinstance(flags, list) else []:
        if not isinstance(f, dict) or f.get("check") not in HEALTH_CHECKS:
            continue
        node = f.get("node")
        if isinstance(node, str) and node:
            counts = out.setdefault(node, {"errors": 0, "warnings": 0})
            counts[HEALTH_CHECKS[f["check"]]] += 1
    return out


def fleet_nodes(tests):
    """Every node named in ``tests``' ``pernode`` or ``pernode_failures``, sorted."""
    seen: set = set()
    for t in (tests if isinstance(tests, dict) else {}).values():
        if isinstance(t, dict):
            for key in ("pernode", "pernode_failures"):
                part = t.get(key)
                if isinstance(part, dict):
                    seen.update(str(n) for n in part)
    return sorted(seen, key=_key)


def _robust(values):
    """``(median, mad)`` of ``values`` (items/s)."""
    med = statistics.median(values)
    return med, statistics.median(abs(x - med) for x in values)


def _z(x, med, scaled):
    """The robust z of ``x``; with a spread of 0, 0 on the median and +-inf off it."""
    if scaled > 0:
        return (x - med) / scaled
    return 0.0 if x == med else math.copysign(math.inf, x - med)


def _test_view(group, t, k, min_relative, min_nodes, notes):
    """One test's rows (see :func:`fleet_view`); appends a line to ``notes`` for each
    node left out."""
    pernode = t.get("pernode")
    pernode = pernode if isinstance(pernode, dict) else {}
    fails = t.get("pernode_failures")
    fails = {str(n): _count(c) for n, c in fails.items()} if isinstance(fails, dict) else {}
    health = health_counts(t)
    figures = {}
    for node, st in pernode.items():
        figure, problem = _figure(st)
        if problem:
            notes.append(f"{group} {node}: {problem}: left out of the fleet")
        else:
            figures[str(node)] = figure
    listed = {str(n) for n in pernode}
    nodes = listed | {n for n, c in fails.items() if c}
    judged = len(figures) >= min_nodes
    med = mad = scaled = None
    if judged:
        med, mad = _robust(list(figures.values()))
        scaled = MAD_SCALE * mad
    rows = []
    for node in sorted(nodes, key=_key):
        x = figures.get(node)
        z = rel = None
        outside = False
        if judged and x is not None and med is not None:
            z = _z(x, med, scaled)
            rel = x / med - 1 if med > 0 else None
            # below by more than k scaled MADs and by more than the floor (x < the
            # median less min_relative of it: exactly 2 % below is not more than 2 %)
            outside = z < -k and x < med * (1 - min_relative)
        counts = health.get(node, {"errors": 0, "warnings": 0})
        rows.append(
            {
                "node": node,
                "figure": x,
                "z": z,
                "relative": rel,
                "outside": outside,
                "fail": fails.get(node, 0),
                # every run failed: failures, and no successful run in ``pernode``
                "failed": node not in listed and fails.get(node, 0) > 0,
                "errors": counts["errors"],
                "warnings": counts["warnings"],
            }
        )
    reason = None
    if not judged:
        reason = (
            f"not judged: {len(figures)} node(s) with a figure, fewer than {min_nodes} "
            "(with fewer there is no robust spread)"
        )
    view = {
        "test": group,
        "judged": judged,
        "reason": reason,
        "n": len(figures),
        "median": med,
        "mad": mad,
        "scaled_mad": scaled,
        "nodes": rows,
    }
    return view, health


def fleet_view(tests, k=DEFAULT_K, min_relative=DEFAULT_MIN_RELATIVE, min_nodes=DEFAULT_MIN_NODES):
    """The fleet view of a normalized summary's ``tests`` (``{group: entry}``).

    ``k``: scaled MADs (no unit) below the median beyond which a node is outside;
    ``min_relative``: the fraction of the median it must also be below by; ``min_nodes``:
    the fewest nodes with a figure for a test to be judged (see the module's doc).

    Returns ``{"k", "min_relative", "min_nodes", "scale": MAD_SCALE,
    "nodes": [every node seen], "judged": number of tests judged,
    "tests": [{"test", "judged", "reason" (None when judged), "n" (nodes with a figure),
    "median", "mad", "scaled_mad" (items/s; None when not judged), "nodes": [{"node",
    "figure" (items/s or None), "z", "relative" (x / median - 1), "outside", "fail"
    (failed runs), "failed" (failures and no figure), "errors", "warnings" (GPU health
    flags)}]}], "outside": {node: [(test, figure, median, z)]}, "failed": {node: [(test,
    failures)]}, "health": {node: {"errors", "warnings"}} (over every test),
    "send_back": [{"node", "reasons": [one line each]}], "notes": [one line per input
    left out]}``. Tests are in name order, nodes in :func:`milarun.analysis.summary.node_key`
    order.

    Raises:
        MilarunError: bad ``k``, ``min_relative`` or ``min_nodes``
            (:func:`check_parameters`); never for bad ``tests``.
    """
    k, min_relative, min_nodes = check_parameters(k, min_relative, min_nodes)
    notes, rows = [], []
    outside: dict = {}
    failed: dict = {}
    health: dict = {}
    if not isinstance(tests, dict):
        notes.append(f"the summary's tests are not an object ({type(tests).__name__})")
        tests = {}
    for group in sorted(tests, key=str):
        t = tests[group]
        if not isinstance(t, dict):
            notes.append(f"{group}: not an object: left out of the fleet")
            continue
        view, counts = _test_view(str(group), t, k, min_relative, min_nodes, notes)
        rows.append(view)
        for node, c in counts.items():
            total = health.setdefault(node, {"errors": 0, "warnings": 0})
            total["errors"] += c["errors"]
            total["warnings"] += c["warnings"]
        for row in view["nodes"]:
            if row["outside"]:
                outside.setdefault(row["node"], []).append(
                    (view["test"], row["figure"], view["median"], row["z"])
                )
            if row["failed"]:
                failed.setdefault(row["node"], []).append((view["test"], row["fail"]))
    seen = set(fleet_nodes(tests)) | set(health)
    send_back = []
    for node in sorted(seen, key=_key):
        reasons = [
            f"outside in {test}: {x:.4g} items/s, {x / med - 1:+.1%} vs the median "
            f"{med:.4g}, z {z:+.1f}"
            for test, x, med, z in outside.get(node, [])
        ]
        errors = health.get(node, {}).get("errors", 0)
        if errors:
            reasons.append(f"{errors} GPU health error(s)")
        reasons += [f"every run of {test} failed ({n})" for test, n in failed.get(node, [])]
        if reasons:
            send_back.append({"node": node, "reasons": reasons})
    return {
        "k": k,
        "min_relative": min_relative,
        "min_nodes": min_nodes,
        "scale": MAD_SCALE,
        "nodes": sorted(seen, key=_key),
        "judged": sum(1 for r in rows if r["judged"]),
        "tests": rows,
        "outside": {n: outside[n] for n in sorted(outside, key=_key)},
        "failed": {n: failed[n] for n in sorted(failed, key=_key)},
        "health": {n: health[n] for n in sorted(health, key=_key)},
        "send_back": send_back,
        "notes": notes,
    }


__all__ = [
    "DEFAULT_K",
    "DEFAULT_MIN_NODES",
    "DEFAULT_MIN_RELATIVE",
    "MAD_SCALE",
    "check_parameters",
    "fleet_nodes",
    "fleet_view",
    "health_counts",
]
