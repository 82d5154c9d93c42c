"""The acceptance figures of a test group (docs/acceptance.md): what the report needs (pure).

The acceptance tests (``milarun.models.collectives``, ``bandwidth``, ``matmul`` with its
``--sweep``, ``burn``; :doc:`docs/acceptance.md`) write their figures into each record's
``metrics`` (and ``collectives``). The summary keeps them per test group as
``tests[g].acceptance = {"test": T, T: figures}`` (only for those tests, as
``tests[g].llm`` is only for LLM tests), so a summary sent alone shows the report's
acceptance section too. The figures of each T:

* ``collectives``: ``rows``, one per (collective, message size): busbw and algbw, the
  median over the group's records (the ``world`` group's); the expected peak
  (``expected_busbw_gbps``, ``expected_bound``: the first record that has one); with
  ``--groups`` beyond the world, ``fabric`` (:func:`fabric_figures`): the slowest node, rail or
  pair of nodes and the pairs' verdict;
* ``bandwidth``: ``copies`` per node and GPU (H2D, D2H, both at once; pinned, pageable),
  ``d2d`` per node and ordered GPU pair (GB/s, peer access), ``stream`` per node and device
  (STREAM's copy, scale, add, triad); medians over runs; ``not_applicable`` when the copies
  were not applicable (CPU slots);
* ``matmul`` (with its ``--sweep`` or its ``--soak``): per precision, the fixed-shape
  TFLOP/s and the best (the shape sweep's, or the fixed shape's when higher) as the median
  and the lowest over the records (GPUs), the best shape, the datasheet peak; with
  ``--soak`` the burst TFLOP/s (median), the soak (s) and ``nodes``: per node its figure,
  the slowest device's sustained fixed-shape TFLOP/s (a node running all its GPUs at once
  is as fast as its slowest; each device's median over its runs first), the fastest
  device's, the spread (fastest ÷ slowest) and which device is slowest; ``supported``
  false where FP8 could not run;
* ``burn``: one row per record (GPU, node, run): TFLOP/s, the throttle figures, the clock
  drop, and the failure reason of a failed one (``data-corruption``).

Ratios to the peaks and the per-GPU comparison of the burn-in are the report's
(:mod:`milarun.report.acceptance`): its threshold is an option of ``milarun report``.
The verdict of a thresholds file against a summary's tests (:func:`verdict`) is here, pure,
so that ``milarun report --thresholds`` and ``milarun verify`` share it.
"""

import re
import statistics
from typing import Any

from ..formats.floors import JUDGED, UNITS, detect, floor_of, shipped_floors
from ..measure import fabric
from ..measure.stats import finite

#: The experiments (entry points) of the acceptance tests, by kind.
EXPERIMENTS = {
    "milarun.models.collectives:main": "collectives",
    "milarun.models.bandwidth:main": "bandwidth",
    "milarun.models.matmul:main": "matmul",
    "milarun.models.burn:main": "burn",
}
#: Host-device copy figures of the bandwidth test (``<key>_gbps_gpu<i>``).
COPY_KEYS = tuple(f"{d}_{k}" for d in ("h2d", "d2h", "bidir") for k in ("pinned", "pageable"))
#: STREAM kernels.
STREAM_KERNELS = ("copy", "scale", "add", "triad")
#: Figures of a burn-in record kept per GPU (numbers).
BURN_NUMBERS = (
    "tflops",
    "throttled_fraction",
    "clock_start_mhz",
    "clock_steady_mhz",
    "clock_low_fraction",
)
#: Largest figure kept (the summary schema's bound).
_MAX = 1e12
#: Longest text kept (names, shapes, reasons).
_TEXT = 200

_COPY = re.compile(r"^(h2d|d2h|bidir)_(pinned|pageable)_gbps_gpu(\d{1,4})$")
_D2D = re.compile(r"^d2d_gbps_(\d{1,4})_(\d{1,4})$")
_STREAM = re.compile(r"^stream_(copy|scale|add|triad)_gbps(?:_gpu(\d{1,4}))?$")
_PRECISION = re.compile(r"^tflops_([a-z0-9_]{1,32})$")


def _num(x):
    """A finite, non-negative, bounded number, or None (a record is someone else's file)."""
    if isinstance(x, bool) or not finite(x):
        return None
    x = float(x)
    return x if 0 <= x <= _MAX else None


def _text(x):
    return x[:_TEXT] if isinstance(x, str) else None


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _metrics(rec):
    m = rec.get("metrics")
    return m if isinstance(m, dict) else {}


def _experiment(rec):
    job = rec.get("job")
    return job.get("experiment") if isinstance(job, dict) else None


def kind_of(rec):
    """The acceptance test a record is, or None: matmul counts only with its shape sweep
    (``mamf_tflops_<p>``) or its soak (``soak_s`` > 0), the acceptance profiles' matmul."""
    kind = EXPERIMENTS.get(_experiment(rec))
    m = _metrics(rec)
    if (
        kind == "matmul"
        and not any(k.startswith("mamf_tflops_") for k in m)
        and not _num(m.get("soak_s"))
    ):
        return None
    return kind


def acceptance_figures(records, node_of):
    """``tests[g].acceptance`` of a group's records (successful and failed), or None when
    the group is no acceptance test. ``node_of(record)`` names a record's node (or None)."""
    records = [r for r in records if isinstance(r, dict)]
    kinds = {kind_of(r) for r in records} - {None}
    if len(kinds) != 1:
        return None
    kind = kinds.pop()
    mine = [r for r in records if kind_of(r) == kind]
    if kind == "burn":
        return {"test": kind, "burn": _burn(mine, node_of)}
    ok = [r for r in mine if r.get("success")]
    if not ok:
        return None
    if kind == "collectives":
        return {"test": kind, "collectives": _collectives(ok)}
    if kind == "bandwidth":
        return {"test": kind, "bandwidth": _bandwidth(ok, node_of)}
    return {"test": kind, "matmul": _matmul(ok, node_of)}


def _collectives(records):
    cells: dict = {}
    peak = bound = None
    for rec in records:
        m = _metrics(rec)
        if peak is None and _num(m.get("expected_busbw_gbps")):
            peak, bound = _num(m["expected_busbw_gbps"]), _text(m.get("expected_bound"))
        rows = rec.get("collectives")
        for row in rows if isinstance(rows, list) else ():
            if not isinstance(row, dict) or not isinstance(row.get("op"), str):
                continue
            if row.get("group", "world") != "world":  # the split groups: fabric_figures
                continue
            nbytes = row.get("bytes")
            if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
                continue
            cell = cells.setdefault(
                (row["op"][:64], nbytes), {"ranks": set(), "busbw": [], "algbw": []}
            )
            if isinstance(row.get("ranks"), int) and not isinstance(row["ranks"], bool):
                cell["ranks"].add(row["ranks"])
            cell["busbw"].append(_num(row.get("busbw_gbps")))
            cell["algbw"].append(_num(row.get("algbw_gbps")))
    order = {
        op: i
        for i, op in enumerate(
            ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
        )
    }
    rows = [
        {
            "op": op,
            "bytes": nbytes,
            "ranks": max(c["ranks"]) if c["ranks"] else None,
            "busbw_gbps": _median(c["busbw"]),
            "algbw_gbps": _median(c["algbw"]),
            "n": sum(v is not None for v in c["busbw"]),
        }
        for (op, nbytes), c in sorted(
            cells.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0])
        )
    ]
    out = {"rows": rows[:1000], "expected_busbw_gbps": peak, "expected_bound": bound}
    fab = fabric_figures(records)
    if fab:
        out["fabric"] = fab
    return out


def fabric_figures(records, tolerance=None):
    """The split groups of ``collectives --groups`` (:mod:`milarun.measure.fabric`), or None.

    ``splits``: per group kind (``node``, ``rail``, ``pairs``) and collective, at the
    largest size measured: each group's busbw (the median over the records), the slowest
    group (its nodes, its rail) and the median group. ``pairs``: the verdict of
    :func:`milarun.measure.fabric.localise` on each pair's median busbw over the records,
    at ``tolerance`` (a fraction; None: the one the records ran with, ``--pair-tolerance``),
    recomputed: the records' own verdict is not read.

    Raises:
        ValueError: ``tolerance`` outside [0, 1).
    """
    cells: dict = {}
    told_tolerance = fabric.TOLERANCE
    for rec in records:
        told = rec.get("fabric")
        told = told.get("tolerance") if isinstance(told, dict) else None
        given = _num(told)
        if given is not None and given < 1:
            told_tolerance = given
        top: dict = {}
        for row in rec.get("collectives") if isinstance(rec.get("collectives"), list) else ():
            if not isinstance(row, dict) or row.get("group") not in ("node", "rail", "pairs"):
                continue
            key = (row["group"], _text(row.get("op")))
            nbytes = row.get("bytes")
            if isinstance(nbytes, int) and not isinstance(nbytes, bool) and nbytes >= 0:
                if key not in top or nbytes > top[key]["bytes"]:
                    top[key] = row
        for (kind, op), row in top.items():
            cell = cells.setdefault((kind, op, row["bytes"]), {})
            for g in row.get("groups") if isinstance(row.get("groups"), list) else ():
                nodes = g.get("nodes") if isinstance(g, dict) else None
                if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
                    continue
                label = (tuple(n[:_TEXT] for n in nodes[:2]), g.get("rail"))
                cell.setdefault(label, []).append(_num(g.get("busbw_gbps")))
    if not cells:
        return None
    order = {k: i for i, k in enumerate(fabric.GROUP_KINDS)}
    splits, pairs = [], {}
    for (kind, op, nbytes), groups in sorted(
        cells.items(), key=lambda kv: (order[kv[0][0]], str(kv[0][1]), kv[0][2])
    ):
        figures = {label: _median(v) for label, v in groups.items()}
        known = {label: f for label, f in figures.items() if f is not None}
        slowest = min(known, key=lambda label: known[label]) if known else None
        splits.append(
            {
                "group": kind,
                "op": op,
                "bytes": nbytes,
                "groups": len(groups),
                "min_busbw_gbps": known[slowest] if slowest else None,
                "median_busbw_gbps": _median(known.values()),
                "slowest_nodes": list(slowest[0]) if slowest else [],
                "slowest_rail": slowest[1] if slowest and isinstance(slowest[1], int) else None,
            }
        )
        if kind == "pairs":
            pairs[op] = [
                {"a": nodes[0], "b": nodes[-1], "busbw_gbps": f}
                for (nodes, _), f in figures.items()
                if len(nodes) == 2
            ]
    out: dict[str, Any] = {"splits": splits[:1000]}
    if pairs:  # judged on all-reduce where measured (as fabric.pair_figures), else one op
        judged = pairs.get("all_reduce") or pairs[min(pairs, key=str)]
        verdict = fabric.localise(judged, told_tolerance if tolerance is None else tolerance)
        verdict["slow_pairs"] = verdict["slow_pairs"][:1000]
        out["pairs"] = verdict
    return out


def _device(rec):
    return str(rec.get("device", ""))[:64]


def _bandwidth(records, node_of):
    copies: dict = {}
    d2d: dict = {}
    peer: dict = {}
    stream: dict = {}
    not_applicable = False
    for rec in records:
        m, node = _metrics(rec), node_of(rec)
        if any(isinstance(m.get(k), str) for k in ("h2d", "d2h", "d2d")):
            not_applicable = True
        for key, value in m.items():
            if match := _COPY.match(key):
                copies.setdefault((node, int(match[3])), {}).setdefault(
                    f"{match[1]}_{match[2]}_gbps", []
                ).append(_num(value))
            elif match := _D2D.match(key):
                d2d.setdefault((node, int(match[1]), int(match[2])), []).append(_num(value))
                p = m.get(f"d2d_peer_{match[1]}_{match[2]}")
                peer[(node, int(match[1]), int(match[2]))] = p if isinstance(p, bool) else None
            elif match := _STREAM.match(key):
                dev = match[2] if match[2] is not None else _device(rec)
                stream.setdefault((node, dev), {}).setdefault(f"{match[1]}_gbps", []).append(
                    _num(value)
                )
    key = lambda k: ("" if k[0] is None else k[0], *k[1:])  # noqa: E731
    return {
        "not_applicable": not_applicable,
        "copies": [
            {
                "node": n,
                "gpu": g,
                **{f"{k}_gbps": _median(figs.get(f"{k}_gbps", [])) for k in COPY_KEYS},
            }
            for (n, g), figs in sorted(copies.items(), key=key)
        ][:10000],
        "d2d": [
            {"node": n, "src": s, "dst": d, "gbps": _median(values), "peer": peer.get((n, s, d))}
            for (n, s, d), values in sorted(d2d.items(), key=key)
        ][:100000],
        "stream": [
            {
                "node": n,
                "device": dev,
                **{f"{k}_gbps": _median(figs.get(f"{k}_gbps", [])) for k in STREAM_KERNELS},
            }
            for (n, dev), figs in sorted(stream.items(), key=key)
        ][:10000],
    }


def _matmul(records, node_of):
    precisions: dict = {}
    for rec in records:
        m = _metrics(rec)
        for key in m:
            match = _PRECISION.match(key)
            if match is None or match[1].endswith(("_vs_peak", "_burst")):
                continue
            p = match[1]
            entry = precisions.setdefault(
                p,
                {
                    "fixed": [],
                    "best": [],
                    "shape": {},
                    "peak": None,
                    "supported": False,
                    "burst": [],
                    "soak": [],
                    "devices": {},
                },
            )
            fixed, mamf = _num(m.get(key)), _num(m.get(f"mamf_tflops_{p}"))
            if fixed is None and mamf is None:
                continue
            entry["supported"] = True
            entry["fixed"].append(fixed)
            entry["burst"].append(_num(m.get(f"tflops_{p}_burst")))
            entry["soak"].append(_num(m.get("soak_s")))
            if fixed is not None:
                entry["devices"].setdefault((node_of(rec), _device(rec)), []).append(fixed)
            best = max(v for v in (fixed, mamf) if v is not None)
            entry["best"].append(best)
            shape = (
                _text(m.get(f"mamf_shape_{p}"))
                if mamf == best
                else _text(str(m.get("size")))
                if m.get("size") is not None
                else None
            )
            entry["shape"][best] = shape
            if entry["peak"] is None:
                entry["peak"] = _num(m.get(f"peak_tflops_{p}"))
    out = []
    for p, e in precisions.items():
        top = max(e["best"]) if e["best"] else None
        out.append(
            {
                "precision": p,
                "supported": e["supported"],
                "n": len(e["best"]),
                "tflops": _median(e["fixed"]),
                "best_tflops": _median(e["best"]),
                "best_tflops_min": min(e["best"]) if e["best"] else None,
                "best_shape": e["shape"].get(top) if top is not None else None,
                "peak_tflops": e["peak"],
            }
        )
        if any(e["soak"]):  # --soak: sustained figures, all GPUs at once
            out[-1].update(
                {
                    "burst_tflops": _median(e["burst"]),
                    "soak_s": _median(e["soak"]),
                    "nodes": node_figures(
                        {k: statistics.median(v) for k, v in e["devices"].items()}
                    ),
                }
            )
    return out[:64]


def node_figures(per_device):
    """Each node's matmul figure: its slowest device's sustained TFLOP/s.

    Args:
        per_device: ``{(node or None, device label): TFLOP/s}`` (each device's median
            over its runs).

    Returns:
        ``[{"node", "tflops" (the slowest device's), "max_tflops" (the fastest's),
        "spread" (fastest ÷ slowest; None when the slowest is 0), "slowest" (its
        label), "devices"}]`` by node name (None last).
    """
    nodes: dict = {}
    for (node, device), tflops in per_device.items():
        nodes.setdefault(node, []).append((tflops, device))
    out = []
    for node in sorted(nodes, key=lambda n: (n is None, n or "")):
        ranked = sorted(nodes[node], key=lambda td: (td[0], _devkey(td[1])))
        (low, slowest), high = ranked[0], ranked[-1][0]
        out.append(
            {
                "node": node,
                "tflops": low,
                "max_tflops": high,
                "spread": high / low if low > 0 else None,
                "slowest": slowest,
                "devices": len(ranked),
            }
        )
    return out[:4096]


def measured_peak(tests, precision, nodes):
    """The measured peak for MFU: the node figure of a matmul test of the summary.

    Args:
        tests: the summary's ``tests`` (``tests[g].acceptance.matmul``).
        precision: the precision (``bf16``...).
        nodes: the nodes the workload ran on (may be empty: unknown).

    Returns:
        ``{"tflops", "test", "nodes"}``: the lowest node figure over ``nodes`` (a job
        over several nodes runs at its slowest node's pace) from the first matmul test,
        in the summary's order, that measured every one of them at ``precision``; with
        ``nodes`` empty, a test that measured a single node. None when no test fits.
    """
    for name, test in tests.items():
        acc = test.get("acceptance") if isinstance(test, dict) else None
        if not isinstance(acc, dict) or acc.get("test") != "matmul":
            continue
        entry = next((e for e in acc.get("matmul") or [] if e.get("precision") == precision), None)
        figures = {
            n["node"]: n["tflops"] for n in (entry or {}).get("nodes") or [] if n.get("tflops")
        }
        if not figures:
            continue
        if nodes:
            if all(n in figures for n in nodes):
                return {
                    "tflops": min(figures[n] for n in nodes),
                    "test": name,
                    "nodes": sorted(nodes),
                }
        elif len(figures) == 1:
            ((node, tflops),) = figures.items()
            return {"tflops": tflops, "test": name, "nodes": [] if node is None else [node]}
    return None


def _burn(records, node_of):
    rows = []
    for rec in records:
        m = _metrics(rec)
        err = rec.get("error") if isinstance(rec.get("error"), dict) else {}
        reason = None if rec.get("success") else _text(err.get("reason") or "error")
        if reason == "interrupted":
            continue
        reasons = m.get("throttle_reasons")
        rows.append(
            {
                "node": node_of(rec),
                "device": _device(rec),
                "run": rec.get("run")
                if isinstance(rec.get("run"), int)
                and not isinstance(rec.get("run"), bool)
                and rec["run"] >= 0
                else None,
                **{k: _num(m.get(k)) for k in BURN_NUMBERS},
                "throttled": m["throttled"] if isinstance(m.get("throttled"), bool) else None,
                "clock_drop": m["clock_drop"] if isinstance(m.get("clock_drop"), bool) else None,
                "throttle_reasons": _text(
                    reasons
                    if isinstance(reasons, str)
                    else ",".join(r for r in reasons if isinstance(r, str))
                    if isinstance(reasons, list)
                    else None
                ),
                "failure": reason,
            }
        )
    rows.sort(
        key=lambda r: ("" if r["node"] is None else r["node"], _devkey(r["device"]), r["run"] or 0)
    )
    return {"gpus": rows[:100000]}


def _devkey(label):
    head = label.split("-")[0]
    return (0, int(head), label) if head.isdigit() else (1, 0, label)


__all__ = [
    "EXPERIMENTS",
    "COPY_KEYS",
    "STREAM_KERNELS",
    "acceptance_figures",
    "floor_clauses",
    "kind_of",
    "measured_peak",
    "node_figures",
]

# --- the verdict of a thresholds file (milarun report --thresholds, milarun verify) ----

#: Default percentage below the median of all GPUs that flags a burn-in GPU SLOW.
BURN_THRESHOLD_PCT = 5.0


def size_text(nbytes):
    """``8 B``, ``64 KiB``, ``1 GiB``, ``1.5 MiB``."""
    if nbytes is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            v = nbytes / scale
            return f"{v:g} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{nbytes} B"


def pct_text(fraction):
    """A fraction as a percentage to one decimal (``-`` for None)."""
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


def burn_table(gpus, threshold=BURN_THRESHOLD_PCT):
    """The per-GPU burn-in rows with ``pct`` (difference from the median TFLOP/s of every
    GPU of the test, all nodes, in percent) and ``flags``: ``SLOW`` (more than
    ``threshold`` percent below), ``THROTTLED``, ``CLOCK-DROP``, the failure reason
    (``DATA-CORRUPTION``...)."""
    rates = [g["tflops"] for g in gpus if g.get("tflops") is not None and not g.get("failure")]
    median = statistics.median(rates) if rates else None
    rows = []
    for g in gpus:
        t = g.get("tflops")
        pct = 100.0 * (t / median - 1.0) if t is not None and median else None
        flags = []
        if g.get("failure"):
            flags.append(str(g["failure"]).upper())
        if pct is not None and not g.get("failure") and pct < -threshold:
            flags.append("SLOW")
        if g.get("throttled"):
            flags.append("THROTTLED")
        if g.get("clock_drop"):
            flags.append("CLOCK-DROP")
        rows.append({**g, "pct": pct, "flags": flags})
    return {"gpus": rows, "median": median, "threshold": threshold}


def gpu_where(row):
    """``node:device`` of a burn-in row (``device`` alone on one node)."""
    node = row.get("node")
    return f"{node}:{row['device']}" if node else str(row["device"])


def figure_text(x):
    """A figure to three significant digits, whole from 100 up (no exponent there)."""
    return "-" if x is None else format(x, ".0f" if x >= 100 else ".3g")


def verdict(thresholds, tests, hosts=None, floors=None):
    """The clauses of ``thresholds`` (a checked thresholds file) against the summary's
    tests: ``[{"ok": bool, "clause": str, "detail": str}]``, one per clause and test group.
    A clause with nothing to check (no such test, a size not measured, no expected peak)
    fails: acceptance is shown, not assumed (docs/acceptance.md, "Thresholds").

    With ``thresholds["floors"]`` true, the clauses of :func:`floor_clauses` follow:
    each figure of the reference floors table that ``thresholds`` does not set, judged
    against the floor of the GPU model ``hosts`` (the summary's ``hosts``, whose
    ``gpus`` are the records' GPU names) name; ``floors``: a table as
    :func:`milarun.formats.floors.read_floors` returns it (default: the shipped one).

    Raises:
        ResultFormatError: the shipped floors table is broken (a broken install).
    """
    out = []
    groups: dict = {}
    for name, test in tests.items():
        acc = test.get("acceptance") if isinstance(test, dict) else None
        if isinstance(acc, dict) and acc.get("test") in acc:
            groups.setdefault(acc["test"], []).append((name, acc[acc["test"]]))
    for op, clause in (thresholds.get("collectives") or {}).items():
        out += _collective_clauses(op, clause, groups.get("collectives", []))
    if thresholds.get("bandwidth"):
        out += _bandwidth_clauses(thresholds["bandwidth"], groups.get("bandwidth", []))
    for p, clause in (thresholds.get("matmul") or {}).items():
        out += _matmul_clauses(p, clause, groups.get("matmul", []))
    if thresholds.get("burn"):
        out += _burn_clauses(thresholds["burn"], groups.get("burn", []))
    if thresholds.get("floors"):
        out += floor_clauses(thresholds, tests, hosts, floors)
    return out


# --- the reference floors per GPU model (thresholds' "floors": true) --------------------


def _fail(clause, detail):
    return {"ok": False, "clause": clause, "detail": detail}


def floor_clauses(thresholds, tests, hosts, floors=None):
    """The clauses the reference floors add (docs/acceptance.md, "Reference floors per GPU
    model"): for each figure of the detected model's entry that ``thresholds`` does not set
    (a tender's figure always wins), the clause the thresholds would hold with that floor
    as its absolute minimum (``min_tflops``, the GB/s of a bandwidth key, ``min_busbw_gbps``
    at the floor's ``at_bytes``), for the tests the summary holds: a floor of a test the
    results lack adds nothing. Each such clause carries ``floor``: ``{"model", "label",
    "figure", "floor", "reference", "fraction", "unit", "source", "title", "url",
    "measured", "gpu_names", "omitted"}``, and its ``detail`` ends with the model and the
    source.

    The all-reduce floor is an intra-node figure (Azure's health checks measure one node):
    it judges the collectives groups of one node only (no ``node_count``, or 1), at its
    ``at_bytes`` when measured there, else at the largest size measured, said in the detail
    (the acceptance profile's sweep stops at 8 GiB, the sources measure at 16 GiB).

    Fails, in one line each, rather than passing silently: no GPU names given
    (``hosts`` None), no GPU named in the records, a GPU name without floors ("no
    reference floors for <name>"), GPUs of several models, or a model whose floors find
    no test to judge.

    Raises:
        ResultFormatError: the shipped floors table is broken (a broken install).
    """
    table = floors if floors is not None else shipped_floors()
    if hosts is None:
        return [_fail("reference floors", "no GPU names given (the summary's hosts): no model")]
    found = detect(hosts, table)
    names = found["names"]
    if not names:
        return [_fail("reference floors", "no GPU named in the records (host.gpus): no model")]
    out = [
        _fail("reference floors", f"no reference floors for {name}")
        for name, model in names.items()
        if model is None
    ]
    models = sorted({m for m in names.values() if m is not None})
    if len(models) > 1:
        labels = ", ".join(table["models"][m]["label"] for m in models)
        out.append(
            _fail(
                "reference floors",
                f"GPUs of several models ({labels}): one model's floors cannot judge them all; "
                "set the figures in the thresholds",
            )
        )
    if len(models) != 1:
        return out
    model = models[0]
    entry = table["models"][model]
    info = {
        "model": model,
        "label": entry["label"],
        "gpu_names": [n for n, m in names.items() if m == model],
        "omitted": list(entry["omitted"]),
    }
    kinds: dict = {}
    for name, test in tests.items():
        acc = test.get("acceptance") if isinstance(test, dict) else None
        if isinstance(acc, dict) and acc.get("test") in acc:
            kinds.setdefault(acc["test"], []).append((name, acc[acc["test"]], test))
    judged = []
    for section in JUDGED:
        given = thresholds.get(section) or {}
        for key, figure in entry[section].items():
            if key in given or not kinds.get(section):
                continue  # the tender's figure wins; no such test: nothing to judge
            floor = floor_of(figure)
            source = table["sources"][figure["source"]]
            meta = {
                **info,
                "figure": f"{section}.{key}",
                "floor": floor,
                "reference": figure["reference"],
                "fraction": figure["fraction"],
                "unit": UNITS[section],
                "source": figure["source"],
                "title": source["title"],
                "url": source["url"],
                "measured": figure["measured"],
            }
            for clause in _floor_clause(section, key, figure, floor, kinds[section]):
                words = (
                    f"floor of {entry['label']}: {floor:g} {UNITS[section]}"
                    + (
                        f" = {figure['fraction']:g} x {figure['reference']:g}"
                        if figure["fraction"] != 1
                        else ""
                    )
                    + f" (source: {figure['source']})"
                )
                judged.append(
                    {
                        **clause,
                        "clause": f"floor: {clause['clause']}",
                        "detail": f"{clause['detail']}; {words}",
                        "floor": meta,
                    }
                )
    if not judged:
        out.append(
            _fail(
                "reference floors",
                f"no test of the results to judge against the floors of {entry['label']}",
            )
        )
    return out + judged


def _floor_clause(section, key, figure, floor, groups):
    """The thresholds clauses of one floor (see :func:`floor_clauses`)."""
    pairs = [(name, body) for name, body, _ in groups]
    if section == "matmul":
        return _matmul_clauses(key, {"min_tflops": floor}, pairs)
    if section == "bandwidth":
        return _bandwidth_clauses({key: floor}, pairs)
    at = figure["at_bytes"]
    out = []
    for name, body, test in groups:
        if test.get("node_count") not in (None, 1):
            continue  # across nodes: the network's figure, not the intra-node floor
        rows = [r for r in body.get("rows") or [] if r["op"] == key]
        if any(r["bytes"] == at and r.get("busbw_gbps") is not None for r in rows):
            out += _collective_clauses(
                key, {"min_busbw_gbps": floor, "at_bytes": at}, [(name, body)]
            )
            continue
        for clause in _collective_clauses(key, {"min_busbw_gbps": floor}, [(name, body)]):
            clause["detail"] += f" (the floor is stated at {size_text(at)}, not measured here)"
            out.append(clause)
    return out


def _missing(clause, test):
    return [{"ok": False, "clause": clause, "detail": f"no {test} results"}]


def _collective_clauses(op, clause, groups):
    at = clause.get("at_bytes")
    name = f"collectives {op}" + (f" at {size_text(at)}" if at else " at the largest size")
    if not groups:
        return _missing(name, "collectives")
    out = []
    for test, body in groups:
        rows = [r for r in body.get("rows") or [] if r["op"] == op]
        row = (
            ([r for r in rows if r["bytes"] == at] or [None])[0]
            if at
            else (rows[-1] if rows else None)
        )
        label = f"{name} ({test})"
        if row is None or row.get("busbw_gbps") is None:
            out.append(
                {
                    "ok": False,
                    "clause": label,
                    "detail": f"{op} not measured at {size_text(at)}"
                    if at
                    else f"{op} not measured",
                }
            )
            continue
        busbw = row["busbw_gbps"]
        ok, parts = _floors(
            busbw,
            body.get("expected_busbw_gbps"),
            clause.get("min_busbw_fraction"),
            clause.get("min_busbw_gbps"),
            "GB/s",
            "no expected peak recorded",
            lambda peak: f"the expected {figure_text(peak)} GB/s",
        )
        out.append(
            {
                "ok": ok,
                "clause": label,
                "detail": " ".join(
                    [f"busbw {figure_text(busbw)} GB/s at {size_text(row['bytes'])};", *parts]
                ),
            }
        )
    return out


def _floors(value, peak, fraction, minimum, unit, no_peak, peak_words):
    """``(ok, detail parts)`` of a measure against a clause's two floors: ``fraction`` of
    ``peak`` (failed when there is no peak) and an absolute ``minimum`` in ``unit``; either
    may be None (not asked)."""
    parts, ok = [], True
    if fraction is not None:
        if not peak:
            ok = False
            parts.append(f"{no_peak} (needed: >= {pct_text(fraction)} of it)")
        else:
            ok &= value / peak >= fraction
            parts.append(
                f"= {pct_text(value / peak)} of {peak_words(peak)} "
                f"(needed: >= {pct_text(fraction)})"
            )
    if minimum is not None:
        ok &= value >= minimum
        parts.append(f"(needed: >= {minimum:g} {unit})")
    return bool(ok), parts


def _bandwidth_clauses(clause, groups):
    out = []
    for key, want in clause.items():
        name = f"bandwidth {key} >= {want:g} GB/s"
        if not groups:
            out += _missing(name, "bandwidth")
            continue
        for test, body in groups:
            if key == "d2d_gbps":
                figures = [
                    (f"{c['src']}->{c['dst']}", c, c.get("gbps")) for c in body.get("d2d") or []
                ]
            elif key.startswith("stream_"):
                figures = [
                    (r["device"], r, r.get(key[len("stream_") :])) for r in body.get("stream") or []
                ]
            else:
                figures = [(str(c["gpu"]), c, c.get(key)) for c in body.get("copies") or []]
            measured = [
                (f"{r['node']}:{w}" if r.get("node") else w, v)
                for w, r, v in figures
                if v is not None
            ]
            label = f"{name} ({test})"
            if not measured:
                out.append(
                    {
                        "ok": False,
                        "clause": label,
                        "detail": "not measured"
                        + (" (not applicable: no GPU)" if body.get("not_applicable") else ""),
                    }
                )
                continue
            where, low = min(measured, key=lambda m: m[1])
            bad = [w for w, v in measured if v < want]
            out.append(
                {
                    "ok": not bad,
                    "clause": label,
                    "detail": f"lowest {figure_text(low)} GB/s ({where}) of {len(measured)}"
                    + (
                        f"; below: {', '.join(bad[:8])}" + (" ..." if len(bad) > 8 else "")
                        if bad
                        else ""
                    ),
                }
            )
    return out


def _matmul_clauses(p, clause, groups):
    name = f"matmul {p}"
    if not groups:
        return _missing(name, "matmul")
    out = []
    for test, body in groups:
        label = f"{name} ({test})"
        entry = next((e for e in body if e["precision"] == p), None)
        if entry is None or not entry.get("supported") or entry.get("best_tflops_min") is None:
            out.append(
                {
                    "ok": False,
                    "clause": label,
                    "detail": "not measured" if entry is None else "not supported on this device",
                }
            )
            continue
        low = entry["best_tflops_min"]
        ok, parts = _floors(
            low,
            entry.get("peak_tflops"),
            clause.get("min_peak_fraction"),
            clause.get("min_tflops"),
            "TFLOP/s",
            "no datasheet peak for this device",
            lambda peak: f"the peak {peak:g}",
        )
        out.append(
            {
                "ok": ok,
                "clause": label,
                "detail": " ".join([f"best {figure_text(low)} TFLOP/s (lowest GPU);", *parts]),
            }
        )
    return out


def _burn_clauses(clause, groups):
    out = []
    checks = []
    if "max_below_median_pct" in clause:
        checks.append(
            ("below", f"burn no GPU more than {clause['max_below_median_pct']:g}% below the median")
        )
    for key, text in (
        ("data_corruption", "burn no data corruption"),
        ("throttled", "burn no throttling"),
        ("clock_drop", "burn no clock drop"),
    ):
        if key in clause:
            checks.append((key, text))
    for key, name in checks:
        if not groups:
            out += _missing(name, "burn")
            continue
        for test, body in groups:
            gpus = body.get("gpus") or []
            label = f"{name} ({test})"
            if key == "below":
                table = burn_table(gpus, clause["max_below_median_pct"])
                bad = [g for g in table["gpus"] if "SLOW" in g["flags"]]
                rated = [g for g in table["gpus"] if g["pct"] is not None]
                if not rated:
                    out.append({"ok": False, "clause": label, "detail": "no GPU measured"})
                    continue
                worst = min(rated, key=lambda g: g["pct"])
                detail = (
                    f"median {figure_text(table['median'])} TFLOP/s over {len(rated)} "
                    f"GPU(s); lowest {gpu_where(worst)} {worst['pct']:+.1f}%"
                )
            elif key == "data_corruption":
                bad = [g for g in gpus if g.get("failure") == "data-corruption"]
                detail = f"{len(gpus)} GPU run(s) checked"
            else:
                bad = [g for g in gpus if g.get(key)]
                known = [g for g in gpus if g.get(key) is not None]
                if not known:
                    out.append(
                        {
                            "ok": False,
                            "clause": label,
                            "detail": "no clock readings (no GPU backend reads them)",
                        }
                    )
                    continue
                detail = f"{len(known)} GPU(s) with clock readings"
            if bad:
                detail += (
                    "; flagged: "
                    + ", ".join(gpu_where(g) for g in bad[:8])
                    + (" ..." if len(bad) > 8 else "")
                )
            out.append({"ok": not bad, "clause": label, "detail": detail})
    return out
