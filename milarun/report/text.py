"""Plain-text rendering of a :class:`~milarun.report.table.Report` (terminal output).

Every string in it may come from a vendor's record, summary, baseline or host
facts, so :func:`render_text` passes the whole text through :func:`terminal_safe`
once, at the end: an escape sequence in an error message cannot clear the screen
or draw a fake score.
"""

import math

from ..formats.terminal import one_line, terminal_safe
from ..measure.anomalies import merged, short_kinds
from ..measure.throughput import MIN_OVERLAP
from .acceptance import text_lines as acceptance_text_lines
from .checks import flag_line, header_lines, perf_per_watt_line
from .checks import text_lines as check_lines
from .family import LABELS as FAMILY_LABELS
from .formatting import fmt_num, fmt_pct
from .iostudy import text_lines
from .llm import text_lines as llm_text_lines
from .soak import text_lines as soak_text_lines

#: The std% cell of a test with one successful result.
UNKNOWN_VARIANCE = "unknown (n=1)"


def cell(row, column):
    """The text of one table cell (shared by the text and HTML renderers)."""
    if column in ("n", "fail"):
        return str(row[column])
    if column == "std%":
        rates = row.get("rates")
        if rates == 0:
            return "-"
        return UNKNOWN_VARIANCE if rates == 1 else fmt_pct(row["std"])
    if column == "weight":
        return "-" if row["weight"] is None else f"{row['weight']:g}"
    if column in ("perf_ratio", "perf_ratio_adj"):
        return fmt_num(row.get(column), ".3f")
    if column in ("J/item", "items/J"):
        return fmt_num(row.get(column), ".4g")
    return fmt_num(row.get(column))


def table_frame(report):
    """The report table as a pandas DataFrame of formatted strings, indexed by test;
    an ``anomalies`` column (the kinds of its flags) ends it when a test has flags."""
    import pandas as pd

    columns = list(report.columns)
    data = {c: [cell(r, c) for r in report.rows] for c in columns}
    if any(r.get("anomalies") for r in report.rows):
        columns.append("anomalies")
        data["anomalies"] = [short_kinds(r.get("anomalies") or []) for r in report.rows]
    return pd.DataFrame(
        data, index=pd.Index([r["test"] for r in report.rows], name="test"), columns=columns
    )


def header_items(inputs):
    """``[(label, text)]``: what the report was made from (shared by text and HTML).

    ``inputs`` is :func:`milarun.report.inputs_of`'s dict: results folder or
    summary file, profile, weights, baseline, price, milarun versions and the
    date range of the results.
    """
    items = []
    if inputs["kind"] == "results":
        skipped = f", {inputs['skipped']} file(s) skipped" if inputs["skipped"] else ""
        items.append(("results", f"{inputs['source']} ({inputs['records']} result files{skipped})"))
        if inputs.get("foreign"):
            items.append(
                (
                    "not counted",
                    f"{len(inputs['foreign'])} record(s) not written by "
                    "a session of this folder: " + ", ".join(inputs["foreign"]),
                )
            )
    else:
        made = f" (made from results folder {inputs['folder']})" if inputs.get("folder") else ""
        items.append(("results", f"summary file {inputs['source']}{made}"))
    suites = ", ".join(inputs["suites"]) or "unknown"
    if inputs.get("profile"):
        sha = inputs.get("profile_sha256")
        profile = (
            f"{suites}, from {inputs['profile']}"
            + (f" (sha256 {sha[:12]})" if sha else "")
            + " as the results folder's session recorded it"
        )
    else:
        profile = f"{suites} (the suite the records name; no session file names the profile)"
    items.append(("profile", profile))
    if inputs.get("weights") is None:
        items.append(("weights", "unweighted: every test weight 1"))
    elif inputs.get("weights_default"):
        items.append(
            (
                "weights",
                f"{inputs['weights']}, the shipped weights of profile "
                f"{suites} (no --weights given; --unweighted for every "
                "test weight 1)",
            )
        )
    else:
        items.append(("weights", inputs["weights"]))
    if inputs.get("families"):
        names = ", ".join(FAMILY_LABELS.get(f, f) for f in inputs["families"])
        items.append(
            (
                "families",
                f"{names} (--family): the score is over these families' "
                "tests only; the others are shown with weight 0",
            )
        )
    items.append(("baseline", inputs.get("baseline") or "none (no --compare)"))
    price = inputs.get("price")
    items.append(("price", f"${price:,.2f}" if price is not None else "none (no --price)"))
    made = ", ".join(inputs.get("milarun_results") or []) or "not recorded"
    items.append(("milarun", f"{made} (results), {inputs['milarun_report']} (this report)"))
    first, last = inputs.get("first"), inputs.get("last")
    if first or last:
        items.append(("dates", f"{first or '?'} to {last or '?'} (UTC, first start to last end)"))
    else:
        items.append(("dates", "not recorded"))
    return items


def score_lines(report):
    """The score block as a list of lines."""
    lines = []
    if report.score is None:
        why = (
            "out of range: see the warning"
            if _out_of_range(report, "score")
            else "no weighted test has results"
        )
        lines.append(f"score: n/a ({why})")
    else:
        tag = " (incomplete)" if report.incomplete else ""
        only = getattr(report, "family_filter", None)
        if only:
            tag += " (" + ", ".join(FAMILY_LABELS.get(f, f) for f in only) + " only: --family)"
        lines.append(f"score: {report.score:.2f}{tag}")
    if report.missing:
        lines.append(f"missing tests (weighted, no results): {', '.join(report.missing)}")
    if report.zero:
        reasons = report.zero_reasons or {}
        lines.append(
            "tests with perf_adj 0, left out of the score: "
            + "; ".join(f"{t}: {reasons[t]}" if reasons.get(t) else t for t in report.zero)
        )
    lines.append(
        f"failure rate: {report.fail_total}/{report.n_total} = "
        f"{fmt_pct(report.failure_rate)} {report.verdict}"
    )
    if report.has_baseline:
        part = " (partial: over the tests both have)" if report.ratio_partial else ""
        lines.append(f"baseline score: {fmt_num(report.score_base)}")
        lines.append(
            f"score / baseline: {fmt_num(report.score_ratio, '.3f')}{part}"
            if not _out_of_range(report, "score / baseline")
            else "score / baseline: n/a (out of range: see the warning)"
        )
    if report.price is not None:
        lines.append(f"price: ${report.price:,.2f}")
        lines.append(f"RPP (price / score): {fmt_num(report.rpp)}")
    lines.append(perf_per_watt_line(report))
    if report.overlap:
        lines.append(overlap_line(report.overlap))
    if any(r.get("basis") == "effective" for r in report.rows):
        lines.append(
            "perf: effective throughput of the tests run as concurrent processes "
            "(own: their own steady-state rates; --throughput own for the 2020 rule)"
        )
    elif getattr(report, "throughput", "effective") == "own":
        lines.append("perf: own steady-state throughput (--throughput own, the 2020 rule)")
    lines += protocol_lines(report)
    if report.single:
        lines.append(
            "variance unknown (n=1): "
            + ", ".join(report.single)
            + " (one result each: std% is not measured, so no variance penalty)"
        )
    if report.anomalies:
        tests = [t for t, _ in anomalies_by_test(report)]
        lines.append(
            f"anomalies: {len(report.anomalies)} flag(s) in {', '.join(tests)} (listed below)"
        )
    if not report.penalize_variance:
        lines.append("variance not penalized (--no-penalize-variance)")
    return lines


def _out_of_range(report, what):
    """True when ``report.warnings`` says figure ``what`` was out of range."""
    return any(
        w.startswith(f"{what}:") or w.startswith(f"{what} is out of range")
        for w in getattr(report, "warnings", None) or []
    )


def overlap_line(overlap):
    """The flag line of the tests whose concurrent processes' steady states overlap too
    little (``Report.overlap``: ``[(test, fraction)]``)."""
    return (
        f"steady states of concurrent processes overlap by less than "
        f"{MIN_OVERLAP * 100:.0f}% of their length: "
        + ", ".join(f"{test} ({frac * 100:.0f}%)" for test, frac in overlap)
    )


def skew_text(skew):
    """A start skew (s) in ms, or ``-``."""
    return "-" if skew is None else f"{skew * 1000:.1f} ms"


def concurrent_note(entry):
    """The line under a test's per-process table: adjusted total, overlap, start skew."""
    sync = (
        f"{entry['synchronized']} of its processes met the start barrier"
        if entry.get("synchronized") is not None
        else ""
    )
    return (
        f"{entry['test']}: adjusted throughput {fmt_num(entry['adjusted'])} items/s "
        f"(work of every process in the common interval / its length), overlap "
        f"{fmt_pct(entry['overlap'])}, start skew {skew_text(entry['skew_s'])}"
        + (f", {sync}" if sync else "")
    )


def concurrent_lines(entries):
    """Own and effective throughput per process of the tests run as concurrent
    processes (``Report.concurrent``), each followed by :func:`concurrent_note`."""
    import pandas as pd

    index: list = []
    data: dict[str, list] = {"own": [], "effective": []}
    for e in entries:
        for d in e["devices"]:
            index.append((e["test"], d["device"]))
            data["own"].append(fmt_num(d["own"]))
            data["effective"].append(fmt_num(d["effective"]))
    frame = pd.DataFrame(data, index=pd.MultiIndex.from_tuples(index, names=["test", "device"]))
    return [
        "concurrent processes: own and effective throughput per process (mean items/s); "
        "effective = items in the interval when every process of the wave was in steady "
        "state / its length",
        frame.to_string(),
        *[concurrent_note(e) for e in entries],
    ]


def fmt_interval(ci, spec=".2f"):
    """``lo to hi`` of a :data:`milarun.measure.confidence.Interval`, or ``n/a`` (variance
    unknown)."""
    return "n/a" if ci is None else f"{format(ci.lo, spec)} to {format(ci.hi, spec)}"


def ci_pct(row):
    """Half-width of a row's perf interval as a percentage of perf: ``±1.23%``; ``n/a (n=1)``
    with one rate; ``-`` without a rate."""
    if row.get("perf") is None:
        return "-"
    ci = row.get("ci")
    if ci is None:
        return f"n/a (n={row['sample'][0]})"
    return f"±{(ci.hi - ci.lo) / 2 / row['perf'] * 100:.2f}%" if row["perf"] else "-"


def noise_cell(row, column):
    """The text of one cell of the noise and node table (text and HTML renderers)."""
    if column == "rates":
        return str(row["sample"][0])
    if column == "perf 95% CI":
        return "-" if row.get("perf") is None else fmt_interval(row.get("ci"))
    if column == "ci±":
        return ci_pct(row)
    if column == "t":
        t = row.get("t")
        return "-" if t is None else "inf" if math.isinf(t) else f"{t:.2f}"
    if column == "df":
        return fmt_num(row.get("df"), ".1f")
    if column == "perf_ratio":
        return fmt_num(row.get(column), ".3f")
    if column == "vs baseline":
        return row.get("sig") or "-"
    return fmt_num(row.get(column))


def noise_columns(report):
    """Columns of the noise and node table."""
    cols = ["rates", "perf 95% CI", "ci±", "node_perf", "node_perf_adj"]
    if report.has_baseline:
        cols += ["perf_ratio", "t", "df", "vs baseline"]
    return cols


#: The line above the noise and node table.
NOISE_HEADER = (
    "noise and throughput per node: perf 95% CI = Student t interval of the mean "
    "over the per-result rates (n/a with one rate); node_perf = items/s per node "
    "(per-gpu tests: the sum over the node's devices); node score = weighted "
    "geometric mean of node_perf_adj"
)


def noise_lines(report):
    """The noise and node table (:func:`milarun.report.table.add_node_score_and_noise`)
    as lines: a header line and one row per test."""
    import pandas as pd

    cols = noise_columns(report)
    data = {c: [noise_cell(r, c) for r in report.rows] for c in cols}
    frame = pd.DataFrame(
        data, index=pd.Index([r["test"] for r in report.rows], name="test"), columns=cols
    )
    lines = [NOISE_HEADER, frame.to_string()]
    if report.has_baseline:
        lines.append(
            "vs baseline: Welch's two-sample t-test of the mean rates, 95%"
            + ("" if report.baseline_noise else "; noise unknown: the baseline is a 2020 summary")
        )
    return lines


#: What each ``--repeat-score`` does, in words (:func:`milarun.report.table.repeat_aggregate`).
REPEAT_WORDS = {
    "mean": "the mean over every result (--repeat-score mean)",
    "median": "each run's mean over its devices, then the median over runs",
    "trimmed-mean": (
        "each run's mean over its devices, then the mean over runs without the fastest "
        "and the slowest (MLPerf's rule)"
    ),
}


def protocol_lines(report):
    """The run protocol the figures followed (:attr:`Report.protocol`): the repeats per
    test, the aggregate, the rules' ``min_repeats`` and ``min_steady_s`` when given, the
    tests with fewer runs than asked, and the run-to-run spread (min-max and CV of the
    per-run figures, items/s) of each test with 2 runs or more. Empty when no test has
    a rate."""
    p = getattr(report, "protocol", None) or {}
    if p.get("repeats_min") is None:
        return []
    lo, hi = p["repeats_min"], p["repeats_max"]
    runs = f"{lo}" if lo == hi else f"{lo} to {hi}"
    rules = []
    if p.get("min_repeats") is not None:
        rules.append(f"the rules ask {p['min_repeats']} repeat(s)")
    if p.get("min_steady_s") is not None:
        rules.append(f"a steady state of {p['min_steady_s']:g} s or more per record")
    lines = [
        f"protocol: {runs} run(s) per test; perf over runs: "
        f"{p['repeat_score']}: {REPEAT_WORDS.get(p['repeat_score'], p['repeat_score'])}"
        + (f"; {', '.join(rules)}" if rules else "")
    ]
    if p.get("short"):
        lines.append(
            f"fewer repeats than the rules ask ({p['min_repeats']}): "
            + ", ".join(f"{t} ({k} run(s))" for t, k in p["short"])
        )
    lines += [f"  {note}" for note in p.get("notes") or []]
    spread = [
        (r["test"], r["repeat_spread"])
        for r in report.rows
        if (r.get("repeat_spread") or {}).get("runs", 0) >= 2
    ]
    if spread:
        lines.append("run-to-run spread (each run's perf, items/s: min-max, cv):")
        lines += [
            f"  {t}: {sp['runs']} runs, {fmt_num(sp['min'])}-{fmt_num(sp['max'])}, "
            f"cv {fmt_pct(sp['cv'])}"
            for t, sp in spread
        ]
    return lines


def held_note(names):
    """What a score interval held fixed: `` (held fixed, one result: a, b)``, or ``""``."""
    return f" (held fixed, one result: {', '.join(names)})" if names else ""


def one_run_note(report):
    """Why a single run's intervals can be too narrow, or None: the sides of ``report``
    whose scored tests each come from one run (:attr:`Report.one_run`), when an interval
    is shown. Their spread is between the devices of that run; the drift of the machine
    between runs is not in it (docs/report.md, "Noise and significance")."""
    shown = report.score_ci is not None or report.score_ratio_ci is not None
    if not report.one_run or not shown:
        return None
    return (
        f"one run per test in {' and '.join(report.one_run)}: the intervals hold the "
        "spread between that run's results, not the drift between runs (2-3% score cv "
        "between runs of one machine in docs/report.md); use --repeat 3 or more before "
        "calling a difference of a few percent real"
    )


def ratio_verdict(ci):
    """``significant`` when a ratio's interval excludes 1, else ``within noise``."""
    return "significant" if ci.lo > 1 or ci.hi < 1 else "within noise"


def confidence_lines(report):
    """The score's interval, the node score and its price, and the score ratio's interval."""
    lines = []
    if report.score is not None:
        lines.append(
            "score 95% CI: "
            + (
                fmt_interval(report.score_ci) + held_note(report.score_ci_held)
                if report.score_ci
                else f"n/a ({report.score_ci_note})"
            )
        )
    if report.node_score is None:
        lines.append("node score: n/a (no scored test has a throughput per node)")
    else:
        tag = " (incomplete)" if report.incomplete or report.node_missing else ""
        lines.append(f"node score: {report.node_score:.2f}{tag}")
        if report.score_ci is not None or report.node_score_ci is not None:
            lines.append(
                f"node score 95% CI: {fmt_interval(report.node_score_ci)}"
                + (held_note(report.node_score_ci_held) if report.node_score_ci else "")
            )
    if report.node_missing:
        lines.append(
            "tests with no throughput per node (plan type unknown), left out of the "
            "node score: " + ", ".join(report.node_missing)
        )
    if report.price is not None:
        lines.append(f"price per node-score point (price / node score): {fmt_num(report.node_rpp)}")
    if report.has_baseline and report.score_ratio is not None:
        ci = report.score_ratio_ci
        lines.append(
            "score / baseline 95% CI: "
            + (
                f"{fmt_interval(ci, '.3f')} ({ratio_verdict(ci)})"
                + held_note(report.score_ratio_ci_held)
                if ci
                else f"noise unknown ({report.score_ratio_ci_note})"
            )
        )
    note = one_run_note(report)
    if note:
        lines.append(note)
    return lines


#: Said under the per-GPU table when min and max are left out.
GPU_ONE_RUN = (
    "(per-GPU min and max left out: each device has one run per test, so they "
    "equal the mean; --repeat gives more)"
)


def gpu_frames(report):
    """``{stat: DataFrame}`` of per-GPU ratios (formatted), for ``--compare-gpus``."""
    import pandas as pd

    out = {}
    for stat, tab in (report.gpu_tables or {}).items():
        data = {d: [fmt_num(vals.get(d), ".3f") for _, vals in tab["rows"]] for d in tab["devices"]}
        out[stat] = pd.DataFrame(
            data, index=pd.Index([g for g, _ in tab["rows"]], name="test"), columns=tab["devices"]
        )
    return out


def node_header(cmp):
    """The line that says how nodes are compared (shared by the text and HTML renderers)."""
    return (
        "node comparison: mean steady-state throughput (items/s) of each node / ref = "
        "median of the OTHER nodes' means (2 nodes: the peer's mean); SLOW: more than "
        f"{cmp['threshold']:g}% below ref; FAILED: failures, no successful result"
    )


def node_flag(row):
    """``FAILED``, ``SLOW`` or an empty string for one row of the node comparison."""
    return "FAILED" if row["failed"] else "SLOW" if row["slow"] else ""


def node_lines(cmp):
    """The node comparison (:func:`milarun.report.breakdown.node_comparison`) as lines:
    the header, one table (test, node: n, fail, mean, ref, ratio, SLOW or FAILED flag)
    and the verdict lines; or the one line saying there is nothing to compare."""
    import pandas as pd

    if not cmp["tests"]:
        return [nothing_to_compare(cmp)]
    index = []
    data: dict[str, list] = {"n": [], "fail": [], "mean": [], "ref": [], "ratio": [], "flag": []}
    for t in cmp["tests"]:
        for row in t["nodes"]:
            index.append((t["test"], row["node"]))
            data["n"].append(str(row["n"]))
            data["fail"].append(str(row["fail"]))
            data["mean"].append(fmt_num(row["mean"]))
            data["ref"].append(fmt_num(row["ref"]))
            data["ratio"].append(fmt_num(row["ratio"], ".3f"))
            data["flag"].append(node_flag(row))
    frame = pd.DataFrame(data, index=pd.MultiIndex.from_tuples(index, names=["test", "node"]))
    return [node_header(cmp), frame.to_string(), *node_verdict(cmp)]


def nothing_to_compare(cmp):
    """The line shown when no test has results from two nodes or more."""
    seen = ", ".join(cmp["nodes"]) or "none"
    return (
        "node comparison: nothing to compare: no test has results from 2 or more "
        f"nodes (nodes seen: {seen})"
    )


def node_verdict(cmp):
    """The verdict as lines: the slow nodes, then the failed nodes (each category
    only when it has a node), or one line saying there is neither."""
    pct = f"{cmp['threshold']:g}%"
    if not cmp["slow"] and not cmp["failed"]:
        return [
            f"verdict: no slow node (none more than {pct} below the median of the other "
            "nodes), no failed node"
        ]
    lines = []
    if cmp["slow"]:
        parts = [
            f"{node} ({', '.join(f'{test} {ratio:.3f}' for test, ratio in tests)})"
            for node, tests in cmp["slow"].items()
        ]
        lines.append(
            f"verdict: slow nodes (more than {pct} below the median of the other "
            f"nodes): {'; '.join(parts)}"
        )
    if cmp["failed"]:
        parts = [
            f"{node} ({', '.join(f'{test}: {k} failed' for test, k in tests)})"
            for node, tests in cmp["failed"].items()
        ]
        lines.append("verdict: failed nodes (failures, no successful result): " + "; ".join(parts))
    return lines


def fleet_header(fleet):
    """The line that says how the fleet view judges a node (text and HTML renderers)."""
    return (
        "fleet view: per test, each node's mean steady-state throughput (items/s) against the "
        "fleet's median; z = (figure - median) / (1.4826 x MAD), MAD the median absolute "
        f"deviation; OUTSIDE: z below -{fleet['k']:g} and more than "
        f"{fleet['min_relative']:.0%} below the median; FAILED: every run failed; tests with "
        f"fewer than {fleet['min_nodes']} nodes are not judged (docs/acceptance.md, The fleet "
        "view)"
    )


def fleet_z(z):
    """A robust z as text: ``+1.23``, ``-inf`` (a MAD of 0) or ``-``."""
    return "-" if z is None else f"{z:+.2f}"


def fleet_flag(row):
    """``OUTSIDE``, ``FAILED`` or an empty string for one node of the fleet view."""
    return "OUTSIDE" if row["outside"] else "FAILED" if row["failed"] else ""


def fleet_test_line(t):
    """One test's fleet figures in a line: nodes, median, MAD; or why it is not judged."""
    if not t["judged"]:
        return one_line(f"{t['test']}: {t['reason']}")
    spread = t["scaled_mad"] / t["median"] if t["median"] else None
    return one_line(
        f"{t['test']}: {t['n']} nodes, median {fmt_num(t['median'])} items/s, MAD "
        f"{fmt_num(t['mad'])}, 1.4826 x MAD {fmt_num(t['scaled_mad'])}"
        + (f" ({spread:.2%} of the median)" if spread is not None else "")
    )


def fleet_cells(t, row):
    """``{column: text}`` of one node of the fleet view (text and HTML renderers)."""
    return {
        "figure": fmt_num(row["figure"]),
        "median": fmt_num(t["median"]),
        "vs median": fmt_pct(row["relative"]) if row["relative"] is not None else "-",
        "z": fleet_z(row["z"]),
        "fail": str(row["fail"]),
        "health": f"{row['errors']}E {row['warnings']}W"
        if row["errors"] or row["warnings"]
        else "",
        "flag": fleet_flag(row),
    }


#: The columns of the fleet view's table.
FLEET_COLUMNS = ("figure", "median", "vs median", "z", "fail", "health", "flag")


def fleet_unjudged(fleet):
    """One line naming the tests not judged (fewer nodes than ``min_nodes`` with a
    figure), each with its count of nodes; None when every test was judged."""
    tests = [t for t in fleet["tests"] if not t["judged"]]
    if not tests:
        return None
    return one_line(
        f"not judged (fewer than {fleet['min_nodes']} nodes with a figure: no robust "
        "spread): " + ", ".join(f"{t['test']} ({t['n']})" for t in tests)
    )


def fleet_send_back(fleet):
    """The nodes to send back as lines: ``nodes to send back (k): none`` or one line per
    node with its reasons."""
    if not fleet["send_back"]:
        return [
            "nodes to send back: none (no node outside the fleet, none with a GPU "
            "health error, none whose every run of a test failed)"
        ]
    return [f"nodes to send back ({len(fleet['send_back'])}):"] + [
        one_line(f"  {s['node']}: {'; '.join(s['reasons'])}") for s in fleet["send_back"]
    ]


def fleet_lines(fleet):
    """The fleet view (:func:`milarun.analysis.fleet.fleet_view`) as lines, each one line
    (a name from the summary passed through :func:`one_line`): the header, per
    test its figures and its table (node: figure, median, vs median, z, fail, health
    flags as ``nE nW``, OUTSIDE or FAILED), the nodes to send back and the notes."""
    import pandas as pd

    lines = [fleet_header(fleet)]
    if not fleet["judged"]:
        most = max((t["n"] for t in fleet["tests"]), default=0)
        lines.append(
            one_line(
                f"fleet view: not judged: fewer than {fleet['min_nodes']} nodes with a figure "
                f"in every test (most: {most}; nodes seen: {', '.join(fleet['nodes']) or 'none'})"
            )
        )
    for t in fleet["tests"]:
        if not t["judged"]:
            continue
        lines.append(fleet_test_line(t))
        cells = [fleet_cells(t, row) for row in t["nodes"]]
        frame = pd.DataFrame(
            {c: [x[c] for x in cells] for c in FLEET_COLUMNS},
            index=pd.Index([one_line(row["node"]) for row in t["nodes"]], name="node"),
            columns=list(FLEET_COLUMNS),
        )
        lines += frame.to_string().splitlines()
    unjudged = fleet_unjudged(fleet)
    if unjudged and fleet["judged"]:
        lines.append(unjudged)
    lines += fleet_send_back(fleet)
    lines += [one_line(f"fleet view: {note}") for note in fleet["notes"]]
    return lines


def scaling_cell(cell):
    """``"throughput (efficiency %)"``, the throughput alone without a baseline, or ``-``."""
    if cell is None or cell["throughput"] is None:
        return "-"
    text = fmt_num(cell["throughput"])
    if cell["efficiency"] is not None:
        text += f" ({cell['efficiency'] * 100:.1f}%)"
    return text


def scaling_note(table):
    """The line under a scaling table: the formula, or why there is no efficiency."""
    if table["base"] is None:
        return (
            f"no 1x1 result for {table['test']}: there is no per-GPU baseline, so no "
            "efficiency is shown"
        )
    return (
        f"efficiency = throughput / (nodes x GPUs per node x {fmt_num(table['base'])} "
        "items/s, the 1x1 throughput)"
    )


def scaling_lines(table):
    """One node-progression test's scaling table (:func:`milarun.report.breakdown.scaling_tables`):
    rows n nodes, columns g GPUs per node, cells ``throughput (efficiency %)``."""
    import pandas as pd

    data = {
        f"{g} GPU/node": [scaling_cell(table["cells"].get((n, g))) for n in table["nodes"]]
        for g in table["gpus"]
    }
    frame = pd.DataFrame(
        data, index=pd.Index([f"{n} node(s)" for n in table["nodes"]], name="nodes")
    )
    return [
        f"scaling of {table['test']}: mean steady-state throughput in items/s (scaling efficiency)",
        frame.to_string(),
        scaling_note(table),
    ]


def anomaly_lines(report):
    """The anomalies section: a heading naming the rules, then one line per flag."""
    lines = ["anomalies (rules: docs/report.md, section Anomalies):"]
    for test, flags in anomalies_by_test(report):
        lines += [f"  {flag_line(test, f)}" for f in merged(flags)]
    return lines


def anomalies_by_test(report):
    """``[(test, [flags])]`` in table order."""
    out: dict = {}
    for test, flag in report.anomalies:
        out.setdefault(test, []).append(flag)
    return list(out.items())


#: The line above the score by family (text and HTML).
FAMILY_HEADER = (
    "score by family: the weighted geometric mean of perf_adj over each "
    "family's scored tests (the score's formula and weights); share: of the "
    "score's total weight"
)


def family_rows(report):
    """``[(label, {column: text})]`` of the score by family (``Report.families``), shared
    by the text and HTML renderers; the columns are :func:`family_columns`."""
    out = []
    for f in report.families:
        cells = {
            "tests": str(f["tests"]),
            "scored": str(f["scored"]),
            "weight": f"{f['weight']:g}",
            "share": fmt_pct(f["share"]),
            "score": fmt_num(f["score"]),
        }
        if report.has_baseline:
            cells["baseline"] = fmt_num(f["score_base"])
            cells["ratio"] = fmt_num(f["ratio"], ".3f") + (
                " (partial)" if f["partial"] and f["ratio"] is not None else ""
            )
        out.append((f["label"], cells))
    return out


def family_columns(report):
    """The columns of the score by family."""
    return ["tests", "scored", "weight", "share", "score"] + (
        ["baseline", "ratio"] if report.has_baseline else []
    )


def family_lines(report):
    """The score by family: the table, then each family's tests."""
    import pandas as pd

    rows = family_rows(report)
    columns = family_columns(report)
    frame = pd.DataFrame(
        {c: [cells[c] for _, cells in rows] for c in columns},
        index=pd.Index([label for label, _ in rows], name="family"),
        columns=columns,
    )
    lines = [FAMILY_HEADER, frame.to_string()]
    lines += [f"  {f['label']}: {', '.join(f['names'])}" for f in report.families]
    note = family_filter(report)
    return lines + ([note] if note else [])


def family_filter(report):
    """The line that says what ``--family`` did, or None without it."""
    if not report.family_filter:
        return None
    return (
        "the score is over "
        + ", ".join(FAMILY_LABELS.get(f, f) for f in report.family_filter)
        + " only (--family); the score by family uses every test's weight"
    )


def render_text(report):
    """Return the whole report as text (a str ending with a newline)."""
    lines = [report.title]
    if report.inputs is not None:
        items = header_items(report.inputs)
        width = max(len(label) for label, _ in items) + 1
        lines += [f"{label + ':':{width}} {one_line(text)}" for label, text in items]
    elif report.date:
        lines.append(f"results date: {report.date}")
    for h in report.hosts:
        names = h.get("gpus") or []
        gpus = ", ".join(f"{names.count(n)} x {n}" for n in sorted(set(names))) or "none"
        lines.append(
            one_line(
                f"host: {h.get('hostname')} | cpu: {h.get('cpu_model')} | "
                f"gpus: {gpus} | torch {h.get('torch')} | cuda {h.get('cuda')}"
            )
        )
    lines.extend(map(one_line, header_lines(report)))
    lines.append("")
    if report.rows:
        lines.append(table_frame(report).to_string())
    else:
        lines.append("(no results)")
    lines.append("")
    lines.extend(score_lines(report))
    lines.extend(confidence_lines(report))
    if report.rows:
        lines.append("")
        lines.extend(noise_lines(report))
    if getattr(report, "families", None):
        lines.append("")
        lines.extend(family_lines(report))
    for stat, frame in gpu_frames(report).items():
        lines.append("")
        lines.append(f"per-GPU {stat} steady-state rate / best GPU of the test")
        lines.append(frame.to_string())
    if report.gpu_tables is not None and "min" not in report.gpu_tables:
        lines.append(GPU_ONE_RUN)
    if report.node_compare is not None:
        lines.append("")
        lines.extend(node_lines(report.node_compare))
    if getattr(report, "fleet", None) is not None:
        lines.append("")
        lines.extend(fleet_lines(report.fleet))
    for table in report.scaling:
        lines.append("")
        lines.extend(scaling_lines(table))
    if getattr(report, "concurrent", None):
        lines.append("")
        lines.extend(concurrent_lines(report.concurrent))
    for table in report.io:
        lines.append("")
        lines.extend(text_lines(table))
    if report.llm:
        lines.append("")
        lines.extend(llm_text_lines(report.llm))
    if report.soak:
        lines.append("")
        lines.extend(soak_text_lines(report.soak))
    if report.acceptance or report.acceptance_verdict is not None:
        lines.append("")
        lines.extend(acceptance_text_lines(report.acceptance, report.acceptance_verdict))
    lines.extend(map(one_line, check_lines(report)))
    if report.anomalies:
        lines.append("")
        lines.extend(map(one_line, anomaly_lines(report)))
    if report.failures:
        lines.append("")
        lines.append("failures:")
        for f in report.failures:
            msg = (f.get("message") or "").strip().splitlines()
            lines.append(
                f"  {f['test']} run {f.get('run')} device {f.get('device')}: "
                f"{f.get('reason')}" + (f": {msg[-1]}" if msg else "")
            )
    return terminal_safe("\n".join(lines) + "\n")
