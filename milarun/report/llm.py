"""The report's LLM section: tokens/s, TFLOP/s and MFU per LLM test, the serving tables and
their latency–throughput plot.

Read from the summary's ``tests[g].llm`` (:func:`milarun.analysis.llm.llm_figures`),
so a summary sent alone shows the same section. Tests without LLM figures
are not listed; a report without LLM tests has no such section.
"""

from ..analysis.llm import mfu_percent
from .formatting import fmt_num
from .plots import svg_text


def llm_rows(tests):
    """One row per LLM test group, in the summary's order.

    Returns:
        list of ``{"test", "tokens_per_s", "tflops", "mfu_pct", "peak_tflops",
        "serving", "concurrency"}``: mean steady-state tokens/s (the test's item is a token:
        the node's or job's under FSDP), mean achieved TFLOP/s per device, mean
        MFU in percent (None without a datasheet peak), the peak (TFLOP/s), and
        the serving levels (possibly empty) and the measured one's concurrency.
    """
    rows = []
    for name, test in tests.items():
        llm = test.get("llm") if isinstance(test, dict) else None
        if not isinstance(llm, dict):
            continue
        rows.append(
            {
                "test": name,
                "tokens_per_s": (test.get("train") or {}).get("mean"),
                "tflops": (llm.get("tflops") or {}).get("mean"),
                "mfu_pct": mfu_percent(llm.get("mfu")),
                "peak_tflops": llm.get("peak_tflops"),
                "serving": llm.get("serving") or [],
                "concurrency": llm.get("concurrency"),
            }
        )
    return rows


def _ms(x):
    return None if x is None else 1e3 * x


def serving_cells(level, measured=None):
    """A serving level's figures as text cells (ms, tokens/s, %); the level the test's
    rate measured (``measured``, a concurrency) is marked ``*``."""
    g = level.get("goodput_fraction")
    mark = "*" if level["concurrency"] == measured else ""
    return {
        "concurrency": f"{level['concurrency']}{mark}",
        "requests": str(level.get("requests")),
        **{
            f"{k} (ms)": fmt_num(_ms(level.get(f"{k.lower().replace(' ', '_')}_s")), ".1f")
            for k in ("TTFT p50", "TTFT p90", "TTFT p99", "TPOT p50", "TPOT p90", "TPOT p99")
        },
        "prefill tok/s": fmt_num(level.get("prefill_tokens_per_s"), ".0f"),
        "decode tok/s": fmt_num(level.get("decode_tokens_per_s"), ".0f"),
        "output tok/s": fmt_num(level.get("output_tokens_per_s"), ".0f"),
        "goodput req/s": fmt_num(level.get("goodput_requests_per_s"), ".2f"),
        "goodput %": fmt_num(None if g is None else 100 * g, ".0f"),
    }


def text_lines(rows):
    """The section as text lines (empty without LLM tests)."""
    if not rows:
        return []
    lines = [
        "LLM tests: steady-state tokens/s, achieved model TFLOP/s per device, MFU "
        "(of the datasheet peak; - without one)"
    ]
    width = max(len(r["test"]) for r in rows)
    lines.append(f"  {'test':{width}}  {'tokens/s':>12}  {'TFLOP/s':>9}  {'MFU':>6}  {'peak':>7}")
    for r in rows:
        mfu = "-" if r["mfu_pct"] is None else f"{r['mfu_pct']:.1f}%"
        lines.append(
            f"  {r['test']:{width}}  {fmt_num(r['tokens_per_s'], ',.0f'):>12}  "
            f"{fmt_num(r['tflops'], '.3g'):>9}  {mfu:>6}  "
            f"{fmt_num(r['peak_tflops'], '.0f'):>7}"
        )
    for r in rows:
        if not r["serving"]:
            continue
        lines.append("")
        lines.append(
            f"serving {r['test']}: per concurrency level (requests at once); TTFT and "
            f"TPOT in ms; * the level the test's throughput measured"
        )
        cells = [serving_cells(level, r["concurrency"]) for level in r["serving"]]
        keys = list(cells[0])
        widths = {k: max(len(k), *(len(c[k]) for c in cells)) for k in keys}
        lines.append("  " + "  ".join(f"{k:>{widths[k]}}" for k in keys))
        for c in cells:
            lines.append("  " + "  ".join(f"{c[k]:>{widths[k]}}" for k in keys))
    return lines


def latency_plot(plotter, levels):
    """SVG: TPOT p50 and TTFT p50 (ms, log scale) against output tokens/s, one point per
    concurrency level (labelled by it): the latency–throughput curve of a serving test.
    None with fewer than one level that has both figures."""
    from matplotlib.figure import Figure

    points = [
        (
            lv["output_tokens_per_s"],
            _ms(lv.get("tpot_p50_s")),
            _ms(lv.get("ttft_p50_s")),
            lv["concurrency"],
        )
        for lv in levels
        if lv.get("output_tokens_per_s") and lv.get("tpot_p50_s")
    ]
    if not points:
        return None
    points.sort()
    with plotter.matplotlib.rc_context(plotter.rc):
        fig = Figure(figsize=(5.0, 3.0))
        ax = fig.add_subplot(1, 1, 1)
        xs = [p[0] for p in points]
        ax.plot(
            xs,
            [p[1] for p in points],
            "o-",
            color=plotter.colours[0],
            linewidth=1,
            markersize=3,
            label="TPOT p50",
        )
        ttft = [(p[0], p[2]) for p in points if p[2]]
        if ttft:
            ax.plot(
                *zip(*ttft),
                "s--",
                color=plotter.colours[1],
                linewidth=1,
                markersize=3,
                label="TTFT p50",
            )
        for x, y, _, c in points:
            ax.annotate(str(c), (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
        ax.set_yscale("log")
        ax.set_xlabel("output tokens/s (points: concurrent requests)")
        ax.set_ylabel("latency (ms)")
        ax.grid(True, linewidth=0.3)
        ax.legend(loc="best", fontsize=7)
        fig.tight_layout()
        return svg_text(fig)


__all__ = ["llm_rows", "serving_cells", "text_lines", "latency_plot"]
