"""Self-contained HTML rendering: jinja2 templates shipped in ``milarun/report/templates``.

Autoescaping is on for every template, so each name and string from results is
escaped; only the SVG produced by :mod:`milarun.report.plots` is inserted as
markup.
"""

import functools
from collections import defaultdict
from pathlib import Path

from ..analysis.summary import group_name, judge_result
from ..formats.store import inside
from ..measure.anomalies import merged, short_kinds
from .acceptance import html_view as acceptance_view
from .checks import diff_line, energy_plot_rows, flag_html, perf_per_watt_line
from .family import LABELS as FAMILY_LABELS
from .formatting import fmt_num, fmt_pct
from .iostudy import plot_svg
from .llm import (
    capacity_text,
    consistency_text,
    interactivity_plot,
    latency_plot,
    malformed_text,
    score_text,
    server_cells,
    server_latency_plot,
    serving_cells,
    targets_text,
)
from .plots import FLAG_COLOUR, Plotter
from .soak import html_view as soak_view
from .text import (
    FAMILY_HEADER,
    FLEET_COLUMNS,
    GPU_ONE_RUN,
    NOISE_HEADER,
    anomalies_by_test,
    cell,
    concurrent_note,
    family_columns,
    family_filter,
    family_rows,
    fleet_cells,
    fleet_header,
    fleet_send_back,
    fleet_test_line,
    fleet_unjudged,
    fmt_interval,
    header_items,
    held_note,
    node_flag,
    node_header,
    node_verdict,
    noise_cell,
    noise_columns,
    nothing_to_compare,
    one_run_note,
    overlap_line,
    protocol_lines,
    ratio_verdict,
    scaling_cell,
    scaling_note,
)

#: Lines of log shown per failure.
LOG_TAIL_LINES = 40
#: Bytes read from the end of a log to find them.
LOG_TAIL_BYTES = 256 * 1024


def fleet_page(fleet):
    """What the template's fleet section shows (:func:`milarun.analysis.fleet.fleet_view`,
    all strings, autoescaped there), or None without a fleet view."""
    if fleet is None:
        return None
    unjudged = fleet_unjudged(fleet)
    return {
        "header": fleet_header(fleet),
        "columns": FLEET_COLUMNS,
        "tests": [
            {
                "line": fleet_test_line(t),
                "rows": [
                    {
                        "node": row["node"],
                        "outside": row["outside"],
                        "failed": row["failed"],
                        "cells": fleet_cells(t, row),
                    }
                    for row in t["nodes"]
                ],
            }
            for t in fleet["tests"]
            if t["judged"]
        ],
        "unjudged": unjudged if fleet["judged"] else None,
        "empty": None if fleet["judged"] else (unjudged or "no test has results from a node"),
        "send_back": fleet_send_back(fleet),
        "has_send_back": bool(fleet["send_back"]),
        "notes": fleet["notes"],
    }


def ratio_band(value):
    """CSS class of a ratio: ``bad`` < 0.9 ≤ ``near`` ≤ 1.1 < ``good``."""
    if value is None:
        return ""
    if value < 0.9:
        return "bad"
    if value > 1.1:
        return "good"
    return "near"


def gpu_band(value):
    """CSS class of a per-GPU ratio to the best GPU (1.0 is the best)."""
    if value is None:
        return ""
    if value < 0.9:
        return "bad"
    if value < 0.97:
        return "near"
    return "good"


def _tail_lines(text, lines=LOG_TAIL_LINES):
    if not text:
        return None
    return "\n".join(str(text).splitlines()[-lines:])


def log_tail(results_dir, failure):
    """Tail of a failure's log: ``RESULTS/logs/<suite>.<job>.J<run>.<device>.log`` if present
    and inside ``results_dir`` (symlinks resolved), otherwise the result's
    ``error.stderr_tail``. Returns ``(text, source)``."""
    if results_dir is not None:
        name = f"{failure['name']}.J{failure.get('run')}.{failure.get('device')}.log"
        path = inside(results_dir, Path(results_dir) / "logs" / name)
        if path is not None:
            try:
                with open(path, "rb") as f:
                    # only the end is shown: a log of gigabytes is not read whole
                    f.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
                    text = f.read(LOG_TAIL_BYTES).decode("utf-8", errors="replace")
                return _tail_lines(text), f"logs/{name}"
            except OSError:
                pass
    return _tail_lines(failure.get("stderr_tail")), "stderr"


def trace_refs(records):
    """``[(record path, trace path, group)]``: the ``--profile-trace`` paths that
    ``records`` (``(path, record)`` pairs) name, unchecked (:func:`trace_links` checks
    them when the page is made)."""
    refs = []
    for item in records or ():
        path, rec = item if isinstance(item, tuple) else (None, item)
        trace = (rec.get("profile_trace") or {}).get("path")
        if isinstance(trace, str) and path is not None:
            refs.append((str(path), trace, group_name(rec)))
    return refs


def trace_links(refs, results_dir, html_path=None):
    """``{group: [href]}``: the ``--profile-trace`` files of each test's records
    (``refs`` from :func:`trace_refs`).

    A record's ``profile_trace.path`` is relative to the record's folder (or
    absolute); it is linked only when the file exists inside ``results_dir``
    (symlinks resolved), as a path relative to the folder of ``html_path``
    (URL-quoted), or as a ``file://`` URI without one.
    """
    import os
    from urllib.parse import quote

    links: defaultdict = defaultdict(list)
    if results_dir is None:
        return links
    for path, trace, group in refs:
        found = inside(results_dir, Path(path).parent / trace)
        if found is None:
            continue
        if html_path is not None:
            href = quote(os.path.relpath(found, Path(html_path).resolve().parent))
        else:
            href = found.as_uri()
        links[group].append(href)
    return links


@functools.cache
def _plotter():
    """This process's plotter (one figure, reused: a plot does not depend on the ones
    drawn before it)."""
    return Plotter()


def throughput_plot(group, results):
    """The throughput plot of one test (``results``: its
    :class:`milarun.analysis.summary.Result` list, as
    :func:`milarun.analysis.summary.summarize_with` passes it to ``extra``) as plain
    values: ``(svg, legend, marks)`` as :meth:`milarun.report.plots.Plotter.throughput`
    draws it, legend entries as lists and ``marks`` a sorted list; None when there is
    nothing to draw."""
    svg, legend, marks = _plotter().throughput(results)
    return (svg, [list(entry) for entry in legend], sorted(marks)) if svg else None


def throughput_plots(records):
    """``{group: (svg, legend, marks)}``: :func:`throughput_plot` of every test of
    ``records`` (result dicts or ``(path, record)`` pairs, each judged once here:
    :func:`milarun.analysis.summary.judge_result`); tests with nothing to draw are
    left out."""
    by_group = defaultdict(list)
    for item in records or ():
        path, rec = item if isinstance(item, tuple) else (None, item)
        by_group[group_name(rec)].append(judge_result(path, rec))
    drawn = {group: throughput_plot(group, by_group[group]) for group in sorted(by_group)}
    return {group: value for group, value in drawn.items() if value is not None}


def _env():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("milarun.report", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = fmt_num
    env.filters["pct"] = fmt_pct
    return env


def render_html(
    report, records=None, results_dir=None, generated=None, html_path=None, plots=None, traces=None
):
    """Return the report as one self-contained HTML page (str).

    ``records`` are result records (for the throughput plots; without them, nor
    ``plots``, the page says plots need the results directory); ``results_dir`` is where
    failure logs are looked up; ``generated`` is the creation time shown;
    ``html_path`` is where the page will be written (links to profiler traces
    are relative to it, see :func:`trace_links`). ``plots`` (from
    :func:`throughput_plots`) and ``traces`` (from :func:`trace_refs`), when given,
    stand for what would be drawn and read from ``records`` (the report's cache
    keeps them: :mod:`milarun.report.inputs`).
    """
    from markupsafe import Markup

    plotter = None
    has_records = bool(records) or plots is not None  # {}: records, nothing to draw
    if plots is None:
        plots = throughput_plots(records)
    if traces is None:
        traces = trace_refs(records)

    flags = {
        test: [flag_html(test, f) for f in merged(fl)] for test, fl in anomalies_by_test(report)
    }
    validation_rows = [flag_html(test, f) for test, f in report.validation_flags]
    drawn_plots = plots
    plots = []
    for row in report.rows:
        svg, legend, marks = drawn_plots.get(row["test"]) or (None, [], [])
        plots.append(
            {
                "test": row["test"],
                "svg": Markup(svg) if svg else None,
                "legend": [tuple(entry) for entry in legend],
                "marks": set(marks),
                "flags": flags.get(row["test"], []),
            }
        )
    drawn = {p["test"] for p in plots if p["svg"]}

    gpu = []
    if report.gpu_tables:
        for stat, tab in report.gpu_tables.items():
            svg = None
            if stat == "mean":
                plotter = plotter or Plotter()
                svg = plotter.heatmap(tab)
            gpu.append(
                {
                    "stat": stat,
                    "devices": tab["devices"],
                    "rows": [
                        {
                            "test": g,
                            "cells": [
                                (fmt_num(v.get(d), ".3f"), gpu_band(v.get(d)))
                                for d in tab["devices"]
                            ],
                        }
                        for g, v in tab["rows"]
                    ],
                    "svg": Markup(svg) if svg else None,
                }
            )

    traces = trace_links(traces, results_dir, html_path)
    table = []
    for row in report.rows:
        cells = []
        for c in report.columns:
            cls = ""
            if c in ("perf_ratio", "perf_ratio_adj"):
                cls = ratio_band(row.get(c))
            elif c == "fail" and row["fail"]:
                cls = "failcell"
            cells.append((cell(row, c), cls))
        table.append(
            {
                "test": row["test"],
                "cells": cells,
                "failed": row["fail"] > 0,
                "counted": row["counted"],
                "traces": traces.get(row["test"], []),
                "plot": row["test"] in drawn,
                "flags": short_kinds(row.get("anomalies") or []),
                "flag_count": len(row.get("anomalies") or []),
            }
        )

    nodes = None
    if report.node_compare is not None:
        cmp = report.node_compare
        nodes = {
            "threshold": cmp["threshold"],
            "empty": nothing_to_compare(cmp) if not cmp["tests"] else None,
            "header": node_header(cmp),
            "verdict": node_verdict(cmp) if cmp["tests"] else [],
            "has_slow": bool(cmp["slow"]),
            "has_failed": bool(cmp["failed"]),
            "rows": [
                {
                    "test": t["test"],
                    "node": row["node"],
                    "n": row["n"],
                    "fail": row["fail"],
                    "mean": fmt_num(row["mean"]),
                    "ref": fmt_num(row["ref"]),
                    "ratio": fmt_num(row["ratio"], ".3f"),
                    "flag": node_flag(row),
                    "first": i == 0,
                    "span": len(t["nodes"]),
                }
                for t in cmp["tests"]
                for i, row in enumerate(t["nodes"])
            ],
        }

    fleet = fleet_page(getattr(report, "fleet", None))

    scaling = []
    for tab in report.scaling:
        plotter = plotter or Plotter()
        svg = plotter.scaling(tab)
        scaling.append(
            {
                "test": tab["test"],
                "gpus": tab["gpus"],
                "note": scaling_note(tab),
                "rows": [
                    {
                        "nodes": n,
                        "cells": [scaling_cell(tab["cells"].get((n, g))) for g in tab["gpus"]],
                    }
                    for n in tab["nodes"]
                ],
                "svg": Markup(svg) if svg else None,
            }
        )

    concurrent = [
        {
            "test": e["test"],
            "note": concurrent_note(e),
            "rows": [
                (d["device"], fmt_num(d["own"]), fmt_num(d["effective"])) for d in e["devices"]
            ],
        }
        for e in getattr(report, "concurrent", None) or []
    ]
    overlap = overlap_line(report.overlap) if getattr(report, "overlap", None) else None
    io_study = []
    for tab in report.io:
        svg = plot_svg(tab)
        io_study.append({**tab, "svg": Markup(svg) if svg else None})

    llm = []
    for row in report.llm:
        svg = None
        if len(row["serving"]) > 1:
            plotter = plotter or Plotter()
            svg = latency_plot(plotter, row["serving"])
        llm.append(
            {
                **row,
                "levels": [serving_cells(lv, row["concurrency"]) for lv in row["serving"]],
                "svg": Markup(svg) if svg else None,
                "server_view": None,
            }
        )
        if row.get("server"):
            plotter = plotter or Plotter()
            llm[-1]["server_view"] = server_view(plotter, row, Markup)

    if report.acceptance:
        plotter = plotter or Plotter()
    acceptance = acceptance_view(report.acceptance, report.acceptance_verdict, plotter)

    failures = []
    for f in report.failures:
        text, source = log_tail(results_dir, f)
        failures.append({**f, "tail": text, "tail_source": source})

    energy_rows = energy_plot_rows(report)
    energy_svg = None
    if energy_rows:
        plotter = plotter or Plotter()
        energy_svg = plotter.energy(energy_rows)
    checks = {
        "perf_per_watt": perf_per_watt_line(report),
        "diffs": [diff_line(d) for d in report.host_diffs],
        "energy_tests": [r for r in report.rows if r.get("items/J")],
        "energy_svg": Markup(energy_svg) if energy_svg else None,
    }

    one_run = (
        GPU_ONE_RUN if report.gpu_tables is not None and "min" not in report.gpu_tables else None
    )
    return (
        _env()
        .get_template("report.html.j2")
        .render(
            gpu_one_run=one_run,
            r=report,
            table=table,
            plots=plots,
            gpu=gpu,
            failures=failures,
            nodes=nodes,
            fleet=fleet,
            scaling=scaling,
            concurrent=concurrent,
            overlap=overlap,
            noise=noise_view(report),
            io_study=io_study,
            llm=llm,
            soak=soak_view(report.soak),
            acceptance=acceptance,
            families=family_view(report),
            checks=checks,
            flags=flags,
            validation_rows=validation_rows,
            flag_colour=FLAG_COLOUR,
            inputs=header_items(report.inputs) if report.inputs is not None else None,
            has_records=has_records,
            generated=generated,
            ratio_class=ratio_band(report.score_ratio),
        )
    )


def server_view(plotter, row, markup):
    """A server-scenario test's part of the LLM section: the targets, capacity,
    consistency (``consistency_failed`` to show it loudly) and malformed warning in
    words, the level cells, and the two plots (``markup``: markupsafe's ``Markup``)."""
    server = row["server"]
    consistency = server.get("consistency")
    latency, interactivity = server_latency_plot(plotter, row), interactivity_plot(plotter, row)
    return {
        "targets": targets_text(server.get("targets")),
        "capacity": capacity_text(server.get("capacity")),
        "consistency": consistency_text(consistency),
        "consistency_failed": bool(consistency) and not consistency.get("passed"),
        "malformed": malformed_text(server),
        "score": score_text(server),
        "per_gpu": bool(row.get("gpus")),
        "levels": [server_cells(lv, server.get("measured")) for lv in server.get("levels") or []],
        "latency_svg": markup(latency) if latency else None,
        "interactivity_svg": markup(interactivity) if interactivity else None,
    }


def family_view(report):
    """What the template's score by family shows (all strings), or None without one."""
    if not getattr(report, "families", None):
        return None
    cols = family_columns(report)
    rows = []
    for f, (label, cells) in zip(report.families, family_rows(report)):
        rows.append(
            {
                "family": f["family"],
                "label": label,
                "names": f["names"],
                "cells": [(cells[c], ratio_band(f["ratio"]) if c == "ratio" else "") for c in cols],
            }
        )
    return {
        "header": FAMILY_HEADER,
        "columns": cols,
        "rows": rows,
        "filter": family_filter(report),
        "only": ", ".join(FAMILY_LABELS.get(f, f) for f in report.family_filter),
    }


def sig_band(row):
    """CSS class of a significant difference from the baseline: ``good`` faster, ``bad``
    slower; none within noise or with noise unknown."""
    if row.get("sig") != "significant" or row.get("perf_ratio") is None:
        return ""
    return "good" if row["perf_ratio"] > 1 else "bad"


def noise_view(report):
    """What the template's noise and node section and score boxes show (all strings)."""
    cols = noise_columns(report)
    ratio = None
    if report.has_baseline and report.score_ratio is not None:
        ci = report.score_ratio_ci
        ratio = (
            f"{fmt_interval(ci, '.3f')} ({ratio_verdict(ci)})"
            + held_note(report.score_ratio_ci_held)
            if ci
            else f"noise unknown ({report.score_ratio_ci_note})"
        )
    return {
        "header": NOISE_HEADER,
        "columns": cols,
        "rows": [
            {
                "test": r["test"],
                "cells": [
                    (noise_cell(r, c), sig_band(r) if c == "vs baseline" else "") for c in cols
                ],
            }
            for r in report.rows
        ],
        "score_ci": (
            None
            if report.score is None
            else fmt_interval(report.score_ci) + held_note(report.score_ci_held)
            if report.score_ci
            else f"n/a ({report.score_ci_note})"
        ),
        "node_score": fmt_num(report.node_score) if report.node_score is not None else "n/a",
        "node_incomplete": bool(report.incomplete or report.node_missing),
        "node_score_ci": fmt_interval(report.node_score_ci)
        + (held_note(report.node_score_ci_held) if report.node_score_ci else ""),
        "node_rpp": fmt_num(report.node_rpp),
        "ratio_ci": ratio,
        # the run protocol (repeats, aggregate, run-to-run spread) shares the one-run line
        "one_run": " ".join(
            line.strip() for line in [one_run_note(report) or "", *protocol_lines(report)] if line
        )
        or None,
        "baseline_note": (
            None
            if not report.has_baseline
            else "vs baseline: Welch's two-sample t-test of the mean rates, 95%"
            + ("" if report.baseline_noise else "; noise unknown: the baseline is a 2020 summary")
        ),
    }
