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
the median over the records that timed that concurrency (requests summed).
"""

import math
import statistics

from ..measure.stats import describe, finite

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
        ``{"flops_per_token", "peak_tflops", "tflops": stats, "mfu": stats,
        "serving": [{"concurrency", "requests", <SERVING_FIELDS>...}], "concurrency"}``
        (TFLOP/s per device; MFU as a fraction; serving levels by concurrency;
        ``concurrency``, serving tests only: the level the test's rate measured).
    """
    flops, peaks, tflops, mfu = [], [], [], []
    levels = {}
    measured = None  # the first level of a record is the one its rate measured
    for rec in records:
        m = rec.get("metrics") if isinstance(rec.get("metrics"), dict) else {}
        f = _num(m.get("flops_per_token"))
        if f is None:
            continue
        flops.append(f)
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


def mfu_percent(stats_):
    """Mean MFU of a ``describe`` dict as a percentage, or None."""
    mean = (stats_ or {}).get("mean")
    return None if mean is None or not math.isfinite(mean) else 100.0 * mean


__all__ = ["SERVING_FIELDS", "llm_figures", "mfu_percent"]
