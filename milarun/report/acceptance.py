"""The report's acceptance section (docs/acceptance.md) and the verdict of ``--thresholds``.

Read from the summary's ``tests[g].acceptance``
(:func:`milarun.analysis.acceptance.acceptance_figures`), so a summary sent alone shows the
same section. Per test: the measure, the expected peak and
the ratio; the bus bandwidth by message size (a log-log plot in the HTML, one line per
collective), the host-device copies, the device-to-device matrix (a heatmap in the HTML),
STREAM; matmul's best TFLOP/s per precision against the datasheet, its burst and sustained
TFLOP/s (``--soak``) and each node's figure (its slowest GPU's sustained TFLOP/s, the
spread and the slowest GPU); the per-GPU burn-in
table, where a GPU more than ``burn_threshold`` percent below the median of every GPU of
the test (all nodes) is ``SLOW``.

The thresholds file (``milarun/formats/schemas/thresholds.schema.json``, docs/acceptance.md)
gives clauses; :func:`milarun.analysis.acceptance.verdict` checks each against every group
of its test: one line per clause and group, PASS or FAIL with the figures. A clause with
nothing to check (no such test, a size not measured, no expected peak) fails: acceptance
is shown, not assumed. With the file's ``"floors": true``, the reference floors of the
detected GPU model (:mod:`milarun.formats.floors`) judge the figures it leaves unset: their
clauses are named ``floor: ...``, and the lines name the model and each source used.
"""

# the verdict of a thresholds file is pure: it lives in analysis/ (milarun verify uses it)
from ..analysis.acceptance import BURN_THRESHOLD_PCT, burn_table, size_text, verdict
from ..analysis.acceptance import figure_text as _gb
from ..analysis.acceptance import gpu_where as _where
from ..analysis.acceptance import pct_text as _pct
from ..errors import MilarunError
from ..measure import fabric
from .formatting import fmt_num
from .plots import svg_text

#: The collectives in the order the tests measure them.
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
#: Host-device copy figures, as the summary names them (without ``_gbps``).
COPIES = (
    "h2d_pinned",
    "h2d_pageable",
    "d2h_pinned",
    "d2h_pageable",
    "bidir_pinned",
    "bidir_pageable",
)
KERNELS = ("copy", "scale", "add", "triad")


def check_burn_threshold(value):
    """``--burn-threshold`` as a float from 0 to 100.

    Raises:
        MilarunError: anything else.
    """
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = None
    if v is None or not 0 <= v <= 100:
        raise MilarunError(f"--burn-threshold must be a percentage from 0 to 100, not {value!r}")
    return v


def _ratio(x, peak):
    return x / peak if x is not None and peak else None


def acceptance_sections(tests, burn_threshold=BURN_THRESHOLD_PCT):
    """One section per acceptance test group, in the summary's order.

    Returns:
        list of ``{"test", "kind", ...}``: ``collectives`` (``rows``, ``peak``, ``bound``,
        ``ops``: per collective its best busbw, the size that reached it, the busbw at the
        largest size and the ratios to the peak), ``bandwidth`` (``copies``, ``d2d``,
        ``stream``, ``not_applicable``), ``matmul`` (``precisions`` with ``ratio``),
        ``burn`` (``gpus`` with ``pct`` below/above the median and ``flags``, ``median``).
    """
    out = []
    for name, test in tests.items():
        acc = test.get("acceptance") if isinstance(test, dict) else None
        if not isinstance(acc, dict) or acc.get("test") not in acc:
            continue
        kind = acc["test"]
        body = acc[kind]
        section = {"test": name, "kind": kind}
        if kind == "collectives":
            section.update(_collectives(body))
            section["shape"] = (
                f"{test['node_count']}x{test['gpus_per_node']}"
                if test.get("node_count") and test.get("gpus_per_node")
                else None
            )
        elif kind == "bandwidth":
            section.update(body)
        elif kind == "matmul":
            section["precisions"] = [
                {
                    **p,
                    "ratio": _ratio(p.get("best_tflops"), p.get("peak_tflops")),
                    "ratio_min": _ratio(p.get("best_tflops_min"), p.get("peak_tflops")),
                }
                for p in body
            ]
        else:
            section.update(burn_table(body.get("gpus") or [], burn_threshold))
        out.append(section)
    return out


def _collectives(body):
    rows = body.get("rows") or []
    peak = body.get("expected_busbw_gbps")
    ops = []
    for op in [o for o in OPS if any(r["op"] == o for r in rows)] + sorted(
        {r["op"] for r in rows} - set(OPS)
    ):
        mine = [r for r in rows if r["op"] == op and r.get("busbw_gbps") is not None]
        if not mine:
            continue
        best = max(mine, key=lambda r: r["busbw_gbps"])
        last = mine[-1]
        ops.append(
            {
                "op": op,
                "best": best["busbw_gbps"],
                "best_bytes": best["bytes"],
                "largest": last["busbw_gbps"],
                "largest_bytes": last["bytes"],
                "ratio": _ratio(best["busbw_gbps"], peak),
                "ranks": best.get("ranks"),
            }
        )
    return {
        "rows": rows,
        "peak": peak,
        "bound": body.get("expected_bound"),
        "ops": ops,
        "fabric": body.get("fabric"),
    }


def fabric_lines(fab):
    """The fabric block of a collectives group (``--groups``) as text lines: the slowest
    group of each kind at the largest size, then the pairs' verdict
    (:func:`milarun.measure.fabric.verdict_lines`). Empty without one."""
    if not fab:
        return []
    lines = ["  the fabric: each group kind's slowest group at the largest size (GB/s busbw):"]
    rows = []
    for sp in fab.get("splits") or []:
        where = " <-> ".join(sp.get("slowest_nodes") or []) or "-"
        if sp.get("slowest_rail") is not None:
            where = f"rail {sp['slowest_rail']} ({where})"
        rows.append(
            [
                sp["group"],
                str(sp.get("op")),
                size_text(sp["bytes"]),
                fmt_num(sp.get("groups"), "d"),
                _gb(sp.get("min_busbw_gbps")),
                _gb(sp.get("median_busbw_gbps")),
                where,
            ]
        )
    lines += _table(
        ["groups", "collective", "size", "count", "slowest", "median", "slowest is"], rows
    )
    if fab.get("pairs"):
        lines += ["  " + line for line in fabric.verdict_lines(fab["pairs"])]
    return lines


def _table(header, body, indent="  "):
    widths = [
        max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)
    ]
    lines = [indent + "  ".join(f"{h:>{w}}" for h, w in zip(header, widths))]
    lines += [indent + "  ".join(f"{c:>{w}}" for c, w in zip(r, widths)) for r in body]
    return lines


def scaling_table(sections):
    """How bus bandwidth holds across the collectives groups (a node-progression's node
    counts, the multi-node job): ``(header, rows)`` of text cells, each collective's best
    busbw and its ratio to the peak per group; None with fewer than two groups."""
    groups = [s for s in sections if s["kind"] == "collectives"]
    if len(groups) < 2:
        return None
    ops = list(dict.fromkeys(o["op"] for s in groups for o in s["ops"]))
    header = ["test", "nodes x GPUs", "ranks", *ops, "peak"]
    rows = []
    for s in groups:
        best = {o["op"]: o for o in s["ops"]}
        ranks = max((o["ranks"] for o in s["ops"] if o.get("ranks")), default=None)
        rows.append(
            [
                s["test"],
                s.get("shape") or "-",
                fmt_num(ranks, "d"),
                *(
                    (
                        "-"
                        if op not in best
                        else _gb(best[op]["best"])
                        + ("" if best[op]["ratio"] is None else f" ({_pct(best[op]['ratio'])})")
                    )
                    for op in ops
                ),
                _gb(s["peak"]),
            ]
        )
    return header, rows


def text_lines(sections, verdict=None):
    """The section (and the verdict of ``--thresholds``) as text lines; empty without
    acceptance tests or thresholds."""
    lines = []
    for s in sections:
        lines.append("")
        lines.extend(_section_lines(s))
    table = scaling_table(sections)
    if table is not None:
        lines.append("")
        lines.append(
            "acceptance collectives across groups: best busbw (GB/s; of the expected "
            "peak) as nodes are added"
        )
        lines += _table(*table)
    if verdict is not None:
        lines.append("")
        lines.extend(verdict_lines(verdict))
    return lines[1:] if lines and lines[0] == "" else lines


def _section_lines(s):
    test, kind = s["test"], s["kind"]
    if kind == "collectives":
        peak = s["peak"]
        lines = [
            f"acceptance {test}: collectives, bus bandwidth (GB/s; nccl-tests' busbw); "
            f"expected peak {_gb(peak)} GB/s"
            + (f" ({s['bound']})" if s["bound"] else "")
            + ("" if peak else " (none recorded: no ratio)")
        ]
        lines += _table(
            ["collective", "ranks", "best busbw", "at", "of peak", "busbw at largest", "largest"],
            [
                [
                    o["op"],
                    fmt_num(o["ranks"], "d"),
                    _gb(o["best"]),
                    size_text(o["best_bytes"]),
                    _pct(o["ratio"]),
                    _gb(o["largest"]),
                    size_text(o["largest_bytes"]),
                ]
                for o in s["ops"]
            ],
        )
        ops = [o["op"] for o in s["ops"]]
        sizes = sorted({r["bytes"] for r in s["rows"]})
        cell = {(r["op"], r["bytes"]): r.get("busbw_gbps") for r in s["rows"]}
        lines.append("  busbw (GB/s) by message size:")
        lines += _table(
            ["size", *ops], [[size_text(b), *(_gb(cell.get((o, b))) for o in ops)] for b in sizes]
        )
        return lines + fabric_lines(s.get("fabric"))
    if kind == "bandwidth":
        lines = [f"acceptance {test}: copies and memory bandwidth (GB/s)"]
        if s.get("not_applicable") and not s.get("copies"):
            lines.append("  host-device and device-device copies: not applicable (no GPU)")
        if s.get("copies"):
            lines += _table(
                ["gpu", *COPIES],
                [
                    [_where({**c, "device": c["gpu"]}), *(_gb(c.get(f"{k}_gbps")) for k in COPIES)]
                    for c in s["copies"]
                ],
            )
        for node, matrix in d2d_matrices(s.get("d2d") or []):
            lines.append(
                "  device to device"
                + (f" on {node}" if node else "")
                + " (row: source, column: destination; * no peer access):"
            )
            lines += _table(
                ["src\\dst", *map(str, matrix["gpus"])],
                [[str(src), *matrix["cells"][i]] for i, src in enumerate(matrix["gpus"])],
            )
        if s.get("stream"):
            lines.append("  STREAM (best of the runs):")
            lines += _table(
                ["device", *KERNELS],
                [[_where(r), *(_gb(r.get(f"{k}_gbps")) for k in KERNELS)] for r in s["stream"]],
            )
        return lines
    if kind == "matmul":
        lines = [
            f"acceptance {test}: matmul TFLOP/s by precision: fixed shape, best of the "
            f"shape sweep (median and lowest of the GPUs), against the datasheet peak"
        ]
        body = []
        for p in s["precisions"]:
            if not p.get("supported"):
                body.append(
                    [p["precision"], "-", "-", "-", "not supported on this device", "-", "-"]
                )
                continue
            body.append(
                [
                    p["precision"],
                    _gb(p.get("tflops")),
                    _gb(p.get("best_tflops")),
                    _gb(p.get("best_tflops_min")),
                    p.get("best_shape") or "-",
                    fmt_num(p.get("peak_tflops"), ".4g"),
                    _pct(p.get("ratio")),
                ]
            )
        lines += _table(
            ["precision", "TFLOP/s", "best", "lowest", "shape", "peak", "of peak"], body
        )
        return lines + matmul_node_lines(s["precisions"])
    lines = [
        f"acceptance {test}: burn-in per GPU: TFLOP/s against the median of all GPUs "
        f"({_gb(s['median'])}); SLOW: more than {s['threshold']:g}% below it"
    ]
    lines += _table(
        ["gpu", "run", "TFLOP/s", "vs median", "throttled", "clock MHz start", "steady", "flags"],
        [
            [
                _where(g),
                fmt_num(g.get("run"), "d"),
                _gb(g.get("tflops")),
                "-" if g["pct"] is None else f"{g['pct']:+.1f}%",
                _pct(g.get("throttled_fraction")),
                fmt_num(g.get("clock_start_mhz"), ".0f"),
                fmt_num(g.get("clock_steady_mhz"), ".0f"),
                " ".join(g["flags"]) or "ok",
            ]
            for g in s["gpus"]
        ],
    )
    return lines


def matmul_node_lines(precisions):
    """The burst and sustained TFLOP/s (``--soak``) and the node figures of a matmul
    section, as text lines (none without them)."""
    lines = []
    soaked = [p for p in precisions if p.get("supported") and p.get("burst_tflops")]
    if soaked:
        lines.append(
            f"  burst (first blocks after warm-up) and sustained (after the "
            f"{fmt_num(soaked[0].get('soak_s'), 'g')} s soak, every GPU at once) "
            "TFLOP/s, medians of the GPUs:"
        )
        lines += _table(
            ["precision", "burst", "sustained", "change"],
            [
                [
                    p["precision"],
                    _gb(p["burst_tflops"]),
                    _gb(p.get("tflops")),
                    "-"
                    if p.get("tflops") is None
                    else f"{100 * (p['tflops'] / p['burst_tflops'] - 1):+.1f}%",
                ]
                for p in soaked
            ],
        )
    rows = [
        [
            n.get("node") or "-",
            p["precision"],
            _gb(n.get("tflops")),
            _gb(n.get("max_tflops")),
            fmt_num(n.get("spread"), ".3f"),
            str(n.get("slowest")),
            fmt_num(n.get("devices"), "d"),
        ]
        for p in precisions
        if p.get("supported")
        for n in p.get("nodes") or []
    ]
    if rows:
        lines.append(
            "  node figure: the slowest GPU's sustained fixed-shape TFLOP/s (a node running "
            "all its GPUs at once is as fast as its slowest); spread = fastest / slowest:"
        )
        lines += _table(
            ["node", "precision", "TFLOP/s", "fastest", "spread", "slowest GPU", "GPUs"], rows
        )
    return lines


def d2d_matrices(cells):
    """``[(node, {"gpus", "cells", "values"})]``: per node, the device-to-device matrix as
    text cells (``-`` on the diagonal and where not measured; ``*`` without peer access)
    and as numbers (None there)."""
    out = []
    for node in dict.fromkeys(c.get("node") for c in cells):
        mine = [c for c in cells if c.get("node") == node]
        gpus = sorted({c["src"] for c in mine} | {c["dst"] for c in mine})
        at = {(c["src"], c["dst"]): c for c in mine}
        values = [[(at.get((s, d)) or {}).get("gbps") for d in gpus] for s in gpus]
        text = [
            [
                (
                    "-"
                    if (s, d) not in at
                    else _gb(at[(s, d)].get("gbps"))
                    + ("*" if at[(s, d)].get("peer") is False else "")
                )
                for d in gpus
            ]
            for s in gpus
        ]
        out.append((node, {"gpus": gpus, "cells": text, "values": values}))
    return out


def verdict_lines(clauses):
    """``acceptance thresholds: PASS|FAIL (k of n clauses failed)`` and one line per clause;
    with reference floors (the thresholds' ``floors``), which model's floors the ``floor:``
    clauses used, for which GPU names, what its table leaves out, and each source used
    (id, title, address)."""
    failed = sum(not c["ok"] for c in clauses)
    head = "PASS" if not failed else "FAIL"
    lines = [
        f"acceptance thresholds: {head} ({len(clauses) - failed} of {len(clauses)} "
        f"clause(s) passed)"
    ]
    used = [c["floor"] for c in clauses if isinstance(c.get("floor"), dict)]
    if used:
        first = used[0]
        lines.append(
            f"  reference floors of {first['label']} ({first['model']}; GPUs named "
            f"{', '.join(first['gpu_names'])}) for the figures the thresholds leave unset"
        )
        lines += [f"  not in its floors: {text}" for text in first["omitted"]]
    lines += [f"  {'PASS' if c['ok'] else 'FAIL'}  {c['clause']}: {c['detail']}" for c in clauses]
    if used:
        lines.append("  floor sources:")
        sources = {f["source"]: f for f in used}
        lines += [f"    {k}: {f['title']}, {f['url']}" for k, f in sources.items()]
    return lines


def _clause_view(clause):
    """A verdict clause for the HTML table: a ``floor:`` clause's detail names its
    source's title and address (the text report lists them below the clauses)."""
    floor = clause.get("floor")
    if not isinstance(floor, dict):
        return clause
    return {
        **clause,
        "detail": f"{clause['detail']}; {floor['source']}: {floor['title']}, {floor['url']}; "
        f"measured: {floor['measured']}",
    }


# --- the HTML view --------------------------------------------------------------------------


def html_view(sections, verdict_, plotter):
    """What ``acceptance.html.j2`` shows: the sections' tables as text cells and their plots
    (inline SVG, :class:`markupsafe.Markup`), and the verdict. ``plotter`` is a
    :class:`milarun.report.plots.Plotter` (its rc and colours), or None without sections."""
    from markupsafe import Markup

    def markup(svg):
        return Markup(svg) if svg else None

    out = []
    for s in sections:
        view = {"test": s["test"], "kind": s["kind"], "lines": _section_lines(s)}
        if s["kind"] == "collectives":
            view["peak"] = _gb(s["peak"])
            view["bound"] = s["bound"]
            view["ops"] = [
                [
                    o["op"],
                    fmt_num(o["ranks"], "d"),
                    _gb(o["best"]),
                    size_text(o["best_bytes"]),
                    _pct(o["ratio"]),
                    _gb(o["largest"]),
                    size_text(o["largest_bytes"]),
                ]
                for o in s["ops"]
            ]
            view["svg"] = markup(busbw_plot(plotter, s["rows"], s["peak"]))
            view["fabric"] = fabric_lines(s.get("fabric"))
        elif s["kind"] == "bandwidth":
            view["copies"] = [
                [_where({**c, "device": c["gpu"]}), *(_gb(c.get(f"{k}_gbps")) for k in COPIES)]
                for c in s.get("copies") or []
            ]
            view["not_applicable"] = bool(s.get("not_applicable") and not s.get("copies"))
            view["d2d"] = [
                {
                    "node": node,
                    "gpus": m["gpus"],
                    "cells": m["cells"],
                    "svg": markup(d2d_heatmap(plotter, m, node)),
                }
                for node, m in d2d_matrices(s.get("d2d") or [])
            ]
            view["stream"] = [
                [_where(r), *(_gb(r.get(f"{k}_gbps")) for k in KERNELS)]
                for r in s.get("stream") or []
            ]
        elif s["kind"] == "matmul":
            view["precisions"] = [
                [
                    p["precision"],
                    _gb(p.get("tflops")),
                    _gb(p.get("best_tflops")),
                    _gb(p.get("best_tflops_min")),
                    p.get("best_shape") or "-",
                    fmt_num(p.get("peak_tflops"), ".4g"),
                    _pct(p.get("ratio")),
                ]
                if p.get("supported")
                else [p["precision"], "-", "-", "-", "not supported on this device", "-", "-"]
                for p in s["precisions"]
            ]
            view["node_lines"] = matmul_node_lines(s["precisions"])
        else:
            view["median"] = _gb(s["median"])
            view["threshold"] = f"{s['threshold']:g}"
            view["gpus"] = [
                {
                    "cells": [
                        _where(g),
                        fmt_num(g.get("run"), "d"),
                        _gb(g.get("tflops")),
                        "-" if g["pct"] is None else f"{g['pct']:+.1f}%",
                        _pct(g.get("throttled_fraction")),
                        fmt_num(g.get("clock_start_mhz"), ".0f"),
                        fmt_num(g.get("clock_steady_mhz"), ".0f"),
                        g.get("throttle_reasons") or "-",
                    ],
                    "flags": g["flags"],
                }
                for g in s["gpus"]
            ]
        out.append(view)
    verdict_view = None
    if verdict_ is not None:
        failed = sum(not c["ok"] for c in verdict_)
        verdict_view = {
            "ok": not failed,
            "passed": len(verdict_) - failed,
            "total": len(verdict_),
            "clauses": [_clause_view(c) for c in verdict_],
        }
    table = scaling_table(sections)
    return {
        "sections": out,
        "verdict": verdict_view,
        "copies": COPIES,
        "kernels": KERNELS,
        "scaling": {"header": table[0], "rows": table[1]} if table else None,
    }


# --- the plots -----------------------------------------------------------------------------


def busbw_plot(plotter, rows, peak=None):
    """SVG: bus bandwidth (GB/s) against message size (bytes), log-log, one line per
    collective, the expected peak dashed. None without a positive figure."""
    from matplotlib.figure import Figure

    ops = [o for o in OPS if any(r["op"] == o for r in rows)] + sorted(
        {r["op"] for r in rows} - set(OPS)
    )
    lines = [
        (
            op,
            [
                (r["bytes"], r["busbw_gbps"])
                for r in rows
                if r["op"] == op and r["bytes"] and r.get("busbw_gbps")
            ],
        )
        for op in ops
    ]
    lines = [(op, pts) for op, pts in lines if pts]
    if not lines:
        return None
    with plotter.matplotlib.rc_context(plotter.rc):
        fig = Figure(figsize=(5.5, 3.2))
        ax = fig.add_subplot(1, 1, 1)
        for i, (op, pts) in enumerate(lines):
            ax.plot(
                *zip(*pts),
                "o-",
                color=plotter.colours[i % len(plotter.colours)],
                linewidth=1,
                markersize=2.5,
                label=op,
            )
        if peak:
            ax.axhline(
                peak,
                color="#555555",
                linestyle="--",
                linewidth=0.8,
                label=f"expected peak {peak:.3g} GB/s",
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.grid(True, linewidth=0.3)
        ax.legend(loc="best", fontsize=7)
        fig.tight_layout()
        return svg_text(fig)


def d2d_heatmap(plotter, matrix, node=None):
    """SVG: the device-to-device GB/s matrix as a heatmap (row: source, column:
    destination), each cell labelled. None without a figure."""
    from matplotlib.figure import Figure

    values = matrix["values"]
    if not any(v is not None for row in values for v in row):
        return None
    n = len(matrix["gpus"])
    data = [[float("nan") if v is None else v for v in row] for row in values]
    with plotter.matplotlib.rc_context(plotter.rc):
        size = min(8.0, 1.6 + 0.45 * n)
        fig = Figure(figsize=(size + 1.0, size))
        ax = fig.add_subplot(1, 1, 1)
        image = ax.imshow(data, cmap="viridis", origin="upper", vmin=0)
        fig.colorbar(image, ax=ax, label="GB/s", shrink=0.8)
        ax.set_xticks(range(n), [str(g) for g in matrix["gpus"]])
        ax.set_yticks(range(n), [str(g) for g in matrix["gpus"]])
        ax.set_xlabel("destination GPU")
        ax.set_ylabel("source GPU")
        if node:
            ax.set_title(f"device to device, {node}")
        if n <= 16:
            top = max(v for row in values for v in row if v is not None)
            for i, row in enumerate(values):
                for j, v in enumerate(row):
                    if v is not None:
                        ax.text(
                            j,
                            i,
                            f"{v:.3g}",
                            ha="center",
                            va="center",
                            fontsize=6,
                            color="black" if v > 0.6 * top else "white",
                        )
        fig.tight_layout()
        return svg_text(fig)


__all__ = [
    "BURN_THRESHOLD_PCT",
    "acceptance_sections",
    "burn_table",
    "busbw_plot",
    "check_burn_threshold",
    "d2d_heatmap",
    "d2d_matrices",
    "html_view",
    "matmul_node_lines",
    "scaling_table",
    "size_text",
    "text_lines",
    "verdict",
    "verdict_lines",
]
