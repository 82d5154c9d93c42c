"""The report's LLM section: tokens/s, TFLOP/s and MFU per LLM test, the serving tables and
their latency–throughput plot.

Read from the summary's ``tests[g].llm`` (:func:`milarun.analysis.llm.llm_figures`),
so a summary sent alone shows the same section. Tests without LLM figures
are not listed; a report without LLM tests has no such section.

Server-scenario tests (``tests[g].server``, :func:`milarun.analysis.llm.server_figures`:
an OpenAI-compatible server driven by a load generator) get their own part: the latency
targets, one table of the load levels (the measured one marked), the capacity found,
the consistency check, a warning for malformed levels, and two plots (the latencies at
the SLO percentile against output tokens/s per GPU, with the targets drawn; tokens/s per
user against output tokens/s per GPU). "Per GPU" divides a server's figure by the test's
``device_count`` (the GPUs its record held: one server per GPU, or one tensor-parallel
server over them); without one the axis says "per server".
"""

from ..analysis.llm import mfu_figures
from ..formats.terminal import one_line
from .formatting import fmt_num
from .plots import svg_text
from .table import goodput_factor


def llm_rows(tests):
    """One row per LLM test group, in the summary's order.

    Returns:
        list of ``{"test", "has_llm", "tokens_per_s", "tflops", "mfu_pct", "mfu_error",
        "peak_tflops", "peak_source", "peak_test", "serving", "concurrency", "server",
        "gpus"}``: whether the test has LLM figures, mean steady-state tokens/s (the
        test's item is a token: the node's or job's under FSDP), mean achieved TFLOP/s
        per device, mean MFU in percent of the chosen peak (None without a peak, or when
        above 100 %: then ``mfu_error`` says so), the peak (TFLOP/s) and where it comes
        from (``"measured"``: the sustained matmul TFLOP/s of the same nodes and
        precision, from the matmul test ``peak_test``; else ``"datasheet"``;
        :func:`milarun.analysis.llm.mfu_figures`), the serving levels (possibly empty)
        and the measured one's concurrency; a server-scenario test's ``tests[g].server``
        (else None) and its GPUs (``device_count``, None when unknown).
    """
    rows = []
    for name, test in tests.items():
        llm = test.get("llm") if isinstance(test, dict) else None
        server = test.get("server") if isinstance(test, dict) else None
        if not isinstance(llm, dict) and not isinstance(server, dict):
            continue
        llm = llm if isinstance(llm, dict) else {}
        gpus = test.get("device_count")
        mfu = mfu_figures(llm, tests)
        rows.append(
            {
                "test": name,
                "has_llm": bool(llm),
                "tokens_per_s": (test.get("train") or {}).get("mean"),
                "tflops": (llm.get("tflops") or {}).get("mean"),
                "mfu_pct": None if mfu["mfu"] is None else 100.0 * mfu["mfu"],
                "mfu_error": mfu["mfu_error"],
                "peak_tflops": mfu["peak_tflops"],
                "peak_source": mfu["peak_source"],
                "peak_test": mfu["peak_test"],
                "serving": llm.get("serving") or [],
                "concurrency": llm.get("concurrency"),
                "server": server if isinstance(server, dict) else None,
                "gpus": gpus if isinstance(gpus, int) and gpus >= 1 else None,
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


def _aligned(cells):
    """Rows of text cells (dicts with the same keys, at least one) as lines: a header of
    the keys, every column right-aligned to its widest cell, indented by two spaces."""
    keys = list(cells[0])
    widths = {k: max(len(k), *(len(c[k]) for c in cells)) for k in keys}
    return [
        "  " + "  ".join(f"{c[k]:>{widths[k]}}" for k in keys)
        for c in [dict(zip(keys, keys)), *cells]
    ]


def text_lines(rows):
    """The section as text lines (empty without LLM tests)."""
    lines = []
    llm = [r for r in rows if r.get("has_llm", True)]
    if llm:
        lines += _llm_table(llm)
    for r in rows:
        if r.get("server"):
            if lines:
                lines.append("")
            lines += server_lines(r)
    return lines


def _llm_table(rows):
    """The LLM table and the serving levels of the offline-scenario tests, as lines."""
    lines = [
        "LLM tests: steady-state tokens/s, achieved model TFLOP/s per device, MFU of the peak:",
        "  measured (the node's sustained matmul TFLOP/s at the test's precision, slowest GPU) "
        "where a matmul test has it, else the datasheet's; - without one",
    ]
    width = max(len(r["test"]) for r in rows)
    lines.append(
        f"  {'test':{width}}  {'tokens/s':>12}  {'TFLOP/s':>9}  {'MFU':>6}  {'peak':>7}  "
        "peak source"
    )
    for r in rows:
        mfu = (
            "error"
            if r.get("mfu_error")
            else "-"
            if r["mfu_pct"] is None
            else f"{r['mfu_pct']:.1f}%"
        )
        source = r.get("peak_source") or "datasheet"
        if r.get("peak_test"):
            source += f" ({r['peak_test']})"
        lines.append(
            f"  {r['test']:{width}}  {fmt_num(r['tokens_per_s'], ',.0f'):>12}  "
            f"{fmt_num(r['tflops'], '.3g'):>9}  {mfu:>6}  "
            f"{fmt_num(r['peak_tflops'], '.0f'):>7}  "
            + (source if r["peak_tflops"] is not None else "-")
        )
    for r in rows:
        if r.get("mfu_error"):
            lines.append(
                one_line(
                    f"  {r['test']}: {r['mfu_error']}: a measurement error (wrong FLOP count, "
                    "peak or timer), not shown as a figure"
                )
            )
    for r in rows:
        if not r["serving"]:
            continue
        lines.append("")
        lines.append(
            f"serving {r['test']}: per concurrency level (requests at once); TTFT and "
            f"TPOT in ms; * the level the test's throughput measured"
        )
        lines += _aligned([serving_cells(level, r["concurrency"]) for level in r["serving"]])
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


# --- server scenario ----------------------------------------------------------------------

#: A load kind's unit in words, and its mark beside a level's value in the plots.
_LOAD_UNITS = {"rate": "requests/s", "concurrency": "concurrent requests", "burst": "requests"}
_LOAD_MARKS = {"rate": ("r", "o"), "concurrency": ("c", "s"), "burst": ("b", "^")}


def _g(x):
    """A number as short text (``4``, ``6.5``), or ``-``."""
    return "-" if x is None else format(x, "g")


def _pkey(targets):
    """``p50``, ``p90`` or ``p99``: the kept percentile nearest the targets' (p99 without
    targets); the summary keeps those three."""
    pct = (targets or {}).get("percentile") or 99
    return "p" + str(min((50, 90, 99), key=lambda p: abs(p - pct)))


def targets_text(targets):
    """The latency targets in words: ``TTFT ≤ 2000 ms and TPOT ≤ 100 ms at p99, preset
    llama3.1-8b-server``."""
    if not targets or targets.get("ttft_s") is None or targets.get("tpot_s") is None:
        return "unknown (no record with well-formed targets)"
    text = (
        f"TTFT ≤ {_g(round(1e3 * targets['ttft_s'], 6))} ms and TPOT ≤ "
        f"{_g(round(1e3 * targets['tpot_s'], 6))} ms at p{_g(targets.get('percentile'))}"
    )
    return text + (f", preset {targets['name']}" if targets.get("name") else "")


def capacity_text(capacity):
    """The capacity found, in words (or why none)."""
    if not capacity:
        return "not searched (the test ran fixed loads only)"
    n = capacity.get("records") or 0
    servers = f"{n} server{'s' if n != 1 else ''}"
    unit = _LOAD_UNITS.get(capacity.get("load"), "(load)")
    if capacity.get("value") is None:
        return (
            f"none found: on at least one of {servers} no load of the search met the "
            f"targets (the capacity is the median only when every server has one)"
        )
    return f"{_g(capacity['value'])} {unit} at the targets, median of {servers}"


def consistency_text(consistency):
    """The consistency check in words: passed, FAILED (loud) or not checked."""
    if not consistency:
        return "not checked (the test ran without --consistency)"
    n, failed = consistency.get("records") or 0, consistency.get("failed") or 0
    if consistency.get("passed"):
        return f"server tokens = in-process tokens: passed on {n} of {n} servers"
    return (
        f"FAILED on {failed} of {n} servers: the server's tokens differ from the same "
        f"model run in-process (it does not compute what it claims)"
    )


def server_cells(level, measured=None):
    """A server-scenario level's figures as text cells (ms, requests/s, tokens/s per
    server, %); the level the test's rate measured (``measured``, ``{"load", "value"}``)
    is marked ``*``."""
    g = level.get("goodput_fraction")
    mark = (
        "*"
        if measured
        and (level.get("load"), level.get("value")) == (measured.get("load"), measured.get("value"))
        else ""
    )
    return {
        "load": f"{level.get('load')}{mark}",
        "value": _g(level.get("value")),
        "requests": str(level.get("requests")),
        "failed": str(level.get("failed")),
        **{
            f"{k} (ms)": fmt_num(_ms(level.get(f"{k.lower().replace(' ', '_')}_s")), ".1f")
            for k in (
                "TTFT p50",
                "TTFT p99",
                "ITL p50",
                "ITL p99",
                "TPOT p50",
                "TPOT p99",
                "E2E p50",
            )
        },
        "req/s": fmt_num(level.get("request_throughput"), ".2f"),
        "output tok/s": fmt_num(level.get("output_tokens_per_s"), ".0f"),
        "tok/s per user": fmt_num(level.get("output_tokens_per_s_per_user"), ".1f"),
        "goodput req/s": fmt_num(level.get("goodput_requests_per_s"), ".2f"),
        "goodput tok/s": fmt_num(level.get("goodput_tokens_per_s"), ".0f"),
        "goodput %": fmt_num(None if g is None else 100 * g, ".0f"),
        "SLO met": "yes" if level.get("slo_met") else "no",
    }


def malformed_text(server):
    """The warning for levels left out, or None when there are none."""
    n = server.get("malformed") or 0
    if not n:
        return None
    return f"WARNING: {n} load level(s) with malformed request timings left out of these figures"


def score_text(server):
    """How the score takes a server-scenario test's rate, in words."""
    factor = goodput_factor({"server": server})
    if factor is None:
        return "the test's rate as measured (no fixed load level: capacity search only)"
    return (
        f"the test's rate × {factor:.2f} (the measured level's goodput tokens/s ÷ output "
        f"tokens/s: tokens of requests within the targets)"
    )


def server_lines(row):
    """A server-scenario test's part of the section, as text lines."""
    server = row["server"]
    lines = [
        one_line(f"server scenario {row['test']}: targets {targets_text(server.get('targets'))}"),
        f"  capacity: {capacity_text(server.get('capacity'))}",
        f"  consistency: {consistency_text(server.get('consistency'))}",
        f"  score: {score_text(server)}",
    ]
    warning = malformed_text(server)
    if warning:
        lines.append(f"  {warning}")
    levels = server.get("levels") or []
    if not levels:
        lines.append("  (no load level with well-formed request timings)")
        return lines
    lines.append(
        "  per load level (medians over servers; requests and failures summed); latencies "
        "in ms, rates per server; * the level the test's throughput measured"
    )
    lines += _aligned([server_cells(level, server.get("measured")) for level in levels])
    return lines


def _per_gpu(row):
    """``(divisor, axis label)`` of the plots' x axis: output tokens/s per GPU (the
    test's ``device_count``), else per server."""
    if row.get("gpus"):
        return row["gpus"], f"output tokens/s per GPU (server ÷ {row['gpus']} GPU)"
    return 1, "output tokens/s per server"


def _by_load(levels, x_of, y_of):
    """``{load kind: [(x, y, value)...] sorted by x}`` of the levels with both figures."""
    out: dict = {}
    for lv in levels:
        x, y = x_of(lv), y_of(lv)
        if x is not None and y is not None and x > 0 and y > 0:
            out.setdefault(lv.get("load"), []).append((x, y, lv.get("value")))
    return {k: sorted(v) for k, v in out.items()}


def _draw(ax, series, colour, label):
    """One line per load kind of ``series``, each point labelled by its load."""
    first = True
    for load, points in series.items():
        prefix, marker = _LOAD_MARKS.get(load, ("", "o"))
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker + "-",
            color=colour,
            linewidth=1,
            markersize=3,
            label=label if first else None,
        )
        first = False
        for x, y, value in points:
            ax.annotate(
                f"{prefix}{_g(value)}",
                (x, y),
                textcoords="offset points",
                xytext=(3, 3),
                fontsize=7,
            )


def server_latency_plot(plotter, row):
    """SVG: TTFT and TPOT at the targets' percentile (ms, log scale) against output
    tokens/s per GPU, one point per load level (labelled ``r<rate>``, ``c<concurrency>``),
    with the targets drawn as horizontal lines; None without a level that has them."""
    from matplotlib.figure import Figure

    server = row["server"]
    targets = server.get("targets") or {}
    key = _pkey(targets)
    div, xlabel = _per_gpu(row)

    def x_of(lv):
        out = lv.get("output_tokens_per_s")
        return None if out is None else out / div

    ttft = _by_load(server.get("levels") or [], x_of, lambda lv: _ms(lv.get(f"ttft_{key}_s")))
    tpot = _by_load(server.get("levels") or [], x_of, lambda lv: _ms(lv.get(f"tpot_{key}_s")))
    if not ttft and not tpot:
        return None
    with plotter.matplotlib.rc_context(plotter.rc):
        fig = Figure(figsize=(5.0, 3.0))
        ax = fig.add_subplot(1, 1, 1)
        for series, colour, name, target in (
            (ttft, plotter.colours[0], "TTFT", targets.get("ttft_s")),
            (tpot, plotter.colours[1], "TPOT", targets.get("tpot_s")),
        ):
            if series:
                _draw(ax, series, colour, f"{name} {key}")
            if target:
                ax.axhline(
                    1e3 * target,
                    color=colour,
                    linestyle="--",
                    linewidth=0.8,
                    label=f"{name} target",
                )
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"latency at {key} (ms)")
        ax.grid(True, linewidth=0.3)
        ax.legend(loc="best", fontsize=7)
        fig.tight_layout()
        return svg_text(fig)


def interactivity_plot(plotter, row):
    """SVG: output tokens/s per user (median of 1/TPOT) against output tokens/s per GPU,
    one point per load level: the throughput–interactivity curve; None without a level
    that has both."""
    from matplotlib.figure import Figure

    server = row["server"]
    div, xlabel = _per_gpu(row)
    series = _by_load(
        server.get("levels") or [],
        lambda lv: (
            None if lv.get("output_tokens_per_s") is None else lv["output_tokens_per_s"] / div
        ),
        lambda lv: lv.get("output_tokens_per_s_per_user"),
    )
    if not series:
        return None
    with plotter.matplotlib.rc_context(plotter.rc):
        fig = Figure(figsize=(5.0, 3.0))
        ax = fig.add_subplot(1, 1, 1)
        _draw(ax, series, plotter.colours[0], "tokens/s per user")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("output tokens/s per user")
        ax.grid(True, linewidth=0.3)
        ax.legend(loc="best", fontsize=7)
        fig.tight_layout()
        return svg_text(fig)


__all__ = [
    "llm_rows",
    "serving_cells",
    "text_lines",
    "latency_plot",
    "server_cells",
    "server_lines",
    "targets_text",
    "capacity_text",
    "consistency_text",
    "malformed_text",
    "score_text",
    "server_latency_plot",
    "interactivity_plot",
]
