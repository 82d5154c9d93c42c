"""The LLM figures of a test group: achieved TFLOP/s, MFU and the serving levels (pure).

The LLM workloads (``milarun.models.llm_*``) record ``metrics.flops_per_token``,
``metrics.tflops`` (achieved model TFLOP/s per device over the steady state),
``metrics.mfu`` (its fraction of the datasheet peak, None without one) and,
for serving, a ``serving`` list of concurrency levels
(:mod:`milarun.measure.latency`). The summary keeps them per test group as
``tests[g].llm``; the report's LLM section reads them from there, so a summary
sent alone (a baseline) shows them too.

Across the runs and devices of a group: TFLOP/s and MFU are described like
the rates (``n, min, max, mean, std``), and each serving level's figures are
the median over the records that timed that concurrency (requests summed). The
group's ``precision`` (its ``--precision``) and ``nodes`` are kept for the report's
choice of peak (:func:`mfu_figures`): the measured sustained matmul TFLOP/s of the
same nodes and precision where the summary holds a matmul test, else the datasheet's.
"""

import math
import statistics
from typing import Any

from ..measure.capacity import capacity_of
from ..measure.latency import level_figures
from ..measure.mfu import checked_mfu, choose_peak, limit_mfu
from ..measure.stats import describe, finite
from .acceptance import measured_peak

#: Figures of a serving level that the summary keeps (medians over records).
SERVING_FIELDS = (
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "tpot_p99_s",
    "ttft_mean_s",
    "tpot_mean_s",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "output_tokens_per_s",
    "goodput_requests_per_s",
    "goodput_fraction",
)
#: Largest figure kept (the summary schema's bound).
_MAX = 1e12


def _num(x):
    """A finite, non-negative, bounded number, or None (a record is someone else's file)."""
    if isinstance(x, bool) or not finite(x):
        return None
    x = float(x)
    return x if 0 <= x <= _MAX else None


def llm_figures(records):
    """``tests[g].llm`` of a group's successful records, or None when none is an LLM test.

    Returns:
        ``{"flops_per_token", "peak_tflops", "precision", "nodes", "tflops": stats,
        "mfu": stats, "serving": [{"concurrency", "requests", <SERVING_FIELDS>...}],
        "concurrency"}`` (TFLOP/s per device; MFU as a fraction of the datasheet peak;
        ``precision``: the first record's ``--precision`` or None; ``nodes``: the nodes
        the records ran on; serving levels by concurrency; ``concurrency``, serving
        tests only: the level the test's rate measured).
    """
    flops, peaks, tflops, mfu = [], [], [], []
    precision, nodes = None, set()
    levels: dict = {}
    measured = None  # the first level of a record is the one its rate measured
    for rec in records:
        m = rec.get("metrics") if isinstance(rec.get("metrics"), dict) else {}
        f = _num(m.get("flops_per_token"))
        if f is None:
            continue
        flops.append(f)
        precision = precision or precision_of(rec)
        nodes.update(_nodes(rec))
        peaks.append(_num(m.get("peak_tflops")))
        tflops.append(_num(m.get("tflops")))
        mfu.append(_num(m.get("mfu")))
        serving = rec.get("serving")
        first = serving[0] if isinstance(serving, list) and serving else None
        if measured is None and isinstance(first, dict):
            c = first.get("concurrency")
            measured = c if isinstance(c, int) and not isinstance(c, bool) and c >= 1 else None
        for level in serving if isinstance(serving, list) else ():
            c = level.get("concurrency") if isinstance(level, dict) else None
            if isinstance(c, int) and not isinstance(c, bool) and c >= 1:
                levels.setdefault(c, []).append(level)
    if not flops:
        return None
    known = [p for p in peaks if p is not None]
    out = {
        "flops_per_token": statistics.median(flops),
        "peak_tflops": known[0] if known else None,
        "precision": precision,
        "nodes": sorted(nodes)[:4096],
        "tflops": describe(tflops),
        "mfu": describe(mfu),
        "serving": [],
    }
    if measured is not None:
        out["concurrency"] = measured
    for c in sorted(levels):
        entry = {
            "concurrency": c,
            "requests": sum(
                lv["requests"]
                for lv in levels[c]
                if isinstance(lv.get("requests"), int)
                and not isinstance(lv.get("requests"), bool)
                and lv["requests"] >= 0
            ),
        }
        for key in SERVING_FIELDS:
            values = [v for v in (_num(lv.get(key)) for lv in levels[c]) if v is not None]
            entry[key] = statistics.median(values) if values else None
        out["serving"].append(entry)
    return out


def precision_of(rec):
    """The record's ``--precision`` (``call.arguments.precision``), or None."""
    call = rec.get("call")
    args = call.get("arguments") if isinstance(call, dict) else None
    p = args.get("precision") if isinstance(args, dict) else None
    return p if isinstance(p, str) and 0 < len(p) <= 32 else None


def _nodes(rec):
    """The nodes a record ran on: its ``nodes`` (a job over several), else its ``node``,
    else ``host.hostname``; names of at most 200 characters."""
    names = rec.get("nodes")
    if not isinstance(names, list) or not names:
        host = rec.get("host") if isinstance(rec.get("host"), dict) else {}
        names = [rec.get("node") or host.get("hostname")]
    return {n for n in names if isinstance(n, str) and 0 < len(n) <= 200}


def mfu_figures(llm, tests):
    """The MFU of an LLM test against the peak the report chooses.

    Args:
        llm: the test's ``tests[g].llm`` (:func:`llm_figures`).
        tests: the summary's ``tests`` (for its matmul tests' node figures,
            :func:`milarun.analysis.acceptance.measured_peak`).

    Returns:
        ``{"peak_tflops", "peak_source" ("measured" or "datasheet"), "peak_test" (the
        matmul test of a measured peak, else None), "mfu" (mean fraction, None without a
        peak or above :data:`milarun.measure.mfu.MFU_LIMIT`), "mfu_error" (one line, or
        None)}``: the measured sustained matmul TFLOP/s of the test's nodes and precision
        where the summary has it, MFU = the mean achieved TFLOP/s per device ÷ that peak
        (:func:`milarun.measure.mfu.checked_mfu`); else the datasheet's, MFU = the mean of
        the records' MFU (each of its datasheet peak).
    """
    precision = llm.get("precision")
    found = measured_peak(tests, precision, llm.get("nodes") or []) if precision else None
    peak, source = choose_peak(found and found["tflops"], llm.get("peak_tflops"))
    if source == "measured":
        fraction, error = checked_mfu((llm.get("tflops") or {}).get("mean"), peak, source)
    else:  # the records' own MFU, each of its datasheet peak
        mean = mfu_percent(llm.get("mfu"))
        fraction, error = limit_mfu(None if mean is None else mean / 100.0, source)
    return {
        "peak_tflops": peak,
        "peak_source": source,
        "peak_test": found["test"] if found and source == "measured" else None,
        "mfu": fraction,
        "mfu_error": error,
    }


def mfu_percent(stats_):
    """Mean MFU of a ``describe`` dict as a percentage, or None."""
    mean = (stats_ or {}).get("mean")
    return None if mean is None or not math.isfinite(mean) else 100.0 * mean


#: Figures of a server-scenario level that the summary keeps (medians over records).
SERVER_FIELDS = (
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "tpot_p99_s",
    "itl_p50_s",
    "itl_p99_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "request_throughput",
    "output_tokens_per_s",
    "output_tokens_per_s_per_user",
    "goodput_requests_per_s",
    "goodput_tokens_per_s",
    "goodput_fraction",
)


def _walked(load):
    """The level indices of a record's capacity search (empty without one)."""
    cap = load.get("capacity")
    walked = cap.get("levels") if isinstance(cap, dict) else None
    return walked if isinstance(walked, list) else []


def server_figures(records):
    """``tests[g].server`` of a group's records, or None when none has ``serving_load``.

    Every level's figures are recomputed here from its raw request timings
    (:func:`milarun.measure.latency.level_figures`) at the targets the record names;
    a record's own ``figures`` are never read. A level whose timings are malformed
    is left out and counted in ``malformed``. Across records (one server per GPU,
    or a tensor-parallel server over the node), each level (``load``, ``value``)
    has the median of each figure, the requests and failures summed, and
    ``slo_met`` true only when it holds in every record. The capacity is the
    median over records of the highest load of the search whose recomputed level
    met the targets (:func:`milarun.measure.capacity.capacity_of`).

    Returns:
        ``{"targets": {"ttft_s", "tpot_s", "percentile", "name"}, "measured": {"load",
        "value"} | None (the first ``--load`` level, whose output tokens the rate logger
        counted; None when the test ran only a capacity search), "levels": [{"load",
        "value", "records", "requests", "failed", "slo_met", <SERVER_FIELDS>...}],
        "capacity": {"load", "value", "records"} | None, "consistency": {"records",
        "passed", "failed"} | None, "malformed": int}``; latencies in s, rates in
        requests/s or tokens/s (per server).
    """
    targets = measured = None
    levels: dict = {}
    capacities, kind = [], None
    consistent = inconsistent = malformed = 0
    for rec in records:
        load = rec.get("serving_load")
        if not isinstance(load, dict) or not isinstance(load.get("levels"), list):
            continue
        t = load.get("targets")
        t = t if isinstance(t, dict) else {}
        ttft, tpot, pct = (_num(t.get(k)) for k in ("ttft_s", "tpot_s", "percentile"))
        if not ttft or not tpot or not pct or pct > 100:
            malformed += len(load["levels"])
            continue
        if targets is None:
            name = t.get("name")
            targets = {
                "name": name if isinstance(name, str) else None,
                "ttft_s": ttft,
                "tpot_s": tpot,
                "percentile": pct,
            }
        met = {}
        for i, lv in enumerate(load["levels"]):
            try:
                key = (str(lv["load"]), float(lv["value"]))
                fig = level_figures(lv["requests"], lv["warmup"], ttft, tpot, pct)
            except (ValueError, TypeError, KeyError):
                malformed += 1
                continue
            met[i] = (key[1], bool(fig["slo_met"]))
            if i == 0 and measured is None and 0 not in _walked(load):
                measured = {"load": key[0], "value": key[1]}
            levels.setdefault(key, []).append(fig)
        cap = load.get("capacity")
        if isinstance(cap, dict) and isinstance(cap.get("levels"), list):
            kind = cap.get("kind") if cap.get("kind") in ("rate", "concurrency") else kind
            walked = [met[i] for i in cap["levels"] if isinstance(i, int) and i in met]
            capacities.append(capacity_of(walked))
        check = load.get("consistency")
        if isinstance(check, dict) and isinstance(check.get("passed"), bool):
            if check["passed"]:
                consistent += 1
            else:
                inconsistent += 1
    if targets is None and not malformed:
        return None
    out: dict[str, Any] = {
        "targets": targets,
        "measured": measured,
        "levels": [],
        "capacity": None,
        "consistency": None,
        "malformed": malformed,
    }
    for (load_kind, value), figs in sorted(levels.items()):
        entry = {
            "load": load_kind,
            "value": value,
            "records": len(figs),
            "requests": sum(f["requests"] for f in figs),
            "failed": sum(f["failed"] for f in figs),
            "slo_met": all(f["slo_met"] for f in figs),
        }
        for field in SERVER_FIELDS:
            values = [v for v in (_num(f.get(field)) for f in figs) if v is not None]
            entry[field] = statistics.median(values) if values else None
        out["levels"].append(entry)
    if capacities:
        known = [c for c in capacities if c is not None]
        out["capacity"] = {
            "load": kind,
            "value": statistics.median(known) if len(known) == len(capacities) else None,
            "records": len(capacities),
        }
    if consistent or inconsistent:
        out["consistency"] = {
            "records": consistent + inconsistent,
            "passed": inconsistent == 0,
            "failed": inconsistent,
        }
    return out


__all__ = [
    "SERVING_FIELDS",
    "SERVER_FIELDS",
    "llm_figures",
    "server_figures",
    "mfu_figures",
    "precision_of",
    "mfu_percent",
]
