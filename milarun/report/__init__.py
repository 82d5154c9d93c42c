"""The report: summary + weights + optional baseline + price → table, score, text and HTML.

* :mod:`.table` -- the score formula and the table (:func:`build_report`);
* :mod:`.text` -- terminal output (:func:`render_text`);
* :mod:`.html` and :mod:`.plots` -- the self-contained HTML page with SVG plots.

:func:`make_report` is what ``milarun report`` calls.
"""

import sys
from pathlib import Path

from .. import __version__
from ..analysis.fleet import DEFAULT_MIN_NODES as FLEET_MIN_NODES
from ..analysis.fleet import fleet_nodes, fleet_view
from ..errors import MilarunError
from ..formats.cache import Cache
from ..formats.outfile import UnsafeFileError, write_atomic
from ..formats.summary import read_summary
from ..formats.thresholds import read_thresholds
from ..formats.weights import check_weights, load_weights
from ..measure.soak import PUBLISHED_MTBF_1024_H
from .acceptance import BURN_THRESHOLD_PCT, acceptance_sections, check_burn_threshold, verdict
from .breakdown import NODE_THRESHOLD_PCT, check_node_threshold
from .checks import diff_line
from .family import check_families
from .html import render_html as _render_html
from .inputs import load_inputs
from .iostudy import io_tables
from .llm import llm_rows
from .soak import check_fault_mtbf, soak_rows
from .table import Report, build_report, check_throughput, weight_for
from .text import render_text as _render_text

__all__ = [
    "Report",
    "build_report",
    "check_weights",
    "load_weights",
    "weight_for",
    "make_report",
    "render_text",
    "render_html",
    "shipped_weights",
    "inputs_of",
]


def render_text(report):
    """Plain-text report (see :func:`milarun.report.text.render_text`)."""
    return _render_text(report)


def render_html(report, records=None, results_dir=None, generated=None, html_path=None):
    """HTML report (see :func:`milarun.report.html.render_html`)."""
    return _render_html(
        report, records=records, results_dir=results_dir, generated=generated, html_path=html_path
    )


def shipped_weights(suite):
    """The weights file shipped for profile ``suite`` (``weights/<suite>.json`` beside
    ``profiles/<suite>.json`` in milarun's source tree), or None."""
    root = Path(__file__).resolve().parent.parent.parent
    path = root / "weights" / f"{suite}.json"
    if (root / "profiles" / f"{suite}.json").is_file() and path.is_file():
        return path
    return None


def shown_path(path):
    """``path`` relative to the current folder when it lies under it, else absolute."""
    path = Path(path).absolute()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def summary_suites(summary):
    """The suites of a summary: its ``provenance.suites``, else the first part of
    its test names (a 2020 summary or an older one)."""
    suites = (summary.get("provenance") or {}).get("suites")
    return sorted(suites) if suites else sorted({g.split(".")[0] for g in summary["tests"]})


def inputs_of(source, summary, count, weights, weights_default, compare, price, families=None):
    """What the report's header names (see :func:`milarun.report.text.header_items`).

    ``count`` is the number of records read, None for a summary file.

    ``weights_default`` is True when ``weights`` is the shipped file of the
    results' profile, picked because no ``--weights`` was given; ``families`` the
    ``--family`` names (named only when given).
    """
    prov = summary.get("provenance") or {}
    return {
        "source": shown_path(source),
        "kind": "results" if count is not None else "summary",
        "records": count,
        "skipped": len(summary.get("skipped") or []),
        "folder": prov.get("results"),
        "suites": summary_suites(summary),
        "profile": prov.get("profile"),
        "profile_sha256": prov.get("profile_sha256"),
        "weights": shown_path(weights) if weights else None,
        "weights_default": bool(weights_default),
        "baseline": shown_path(compare) if compare else None,
        "price": price,
        "milarun_results": list(prov.get("milarun") or []),
        "milarun_report": __version__,
        "first": prov.get("first"),
        "last": summary.get("date"),
        **({"families": list(families)} if families else {}),
    }


def make_report(
    source,
    weights=None,
    compare=None,
    price=None,
    compare_gpus=False,
    penalize_variance=True,
    title=None,
    html=None,
    warn=None,
    compare_nodes=False,
    node_threshold=None,
    throughput="effective",
    unweighted=False,
    thresholds=None,
    burn_threshold=None,
    family=None,
    cache=True,
    repeat_score="mean",
    fault_mtbf=None,
):
    """Build the report of ``source`` (results dir or summary file).

    ``weights`` and ``compare`` are file paths (or ``None``); ``price`` is in
    dollars; ``html`` is an output path; ``compare_nodes`` adds the node
    comparison, with ``node_threshold`` percent (default
    :data:`~milarun.report.breakdown.NODE_THRESHOLD_PCT`; giving one implies
    ``compare_nodes``). The fleet view (:func:`milarun.analysis.fleet.fleet_view`, in
    ``report.fleet``; None when not shown) comes with ``compare_nodes`` or when the
    results hold 3 nodes or more. Without ``weights``, results of one shipped profile
    are weighted by its shipped weights file (:func:`shipped_weights`), and
    the header says so; ``unweighted`` gives every test weight 1 instead.
    ``thresholds``: an acceptance thresholds file (its verdict in ``report.acceptance_verdict``);
    ``burn_threshold``: percent below the median that flags a burn-in GPU (default 5);
    ``family``: the ``--family`` names, the families the score is over
    (:mod:`milarun.report.family`; checked before anything is read);
    ``cache``: keep and reuse what is read of a results folder in this user's
    cache (:mod:`milarun.report.inputs`; False: ``--no-cache``); ``repeat_score``: how
    a test's perf is taken over its runs (:data:`milarun.report.table.REPEAT_SCORES`);
    ``fault_mtbf``: a 1,024-GPU job's mean time between interruptions in hours, the
    projection of the "Time lost to faults" section (:mod:`milarun.report.soak`; default
    :data:`milarun.measure.soak.PUBLISHED_MTBF_1024_H`).
    Returns ``(report, text)``.

    Raises:
        MilarunError: a bad file, ``price`` <= 0, ``node_threshold`` outside
            0..100 or ``fault_mtbf`` not a finite number of hours > 0 (checked before
            anything is read), or both ``weights`` and ``unweighted``. ``throughput`` is
            ``"effective"`` or ``"own"`` (the 2020 rule; see
            :func:`milarun.report.table.perf_basis`).
    """
    import datetime

    if node_threshold is not None:
        node_threshold = check_node_threshold(node_threshold)
        compare_nodes = True
    else:
        node_threshold = NODE_THRESHOLD_PCT

    throughput = check_throughput(throughput)
    families = check_families(family)

    if weights and unweighted:
        raise MilarunError("--weights and --unweighted exclude each other")
    weights_map = load_weights(weights) if weights else None
    burn_threshold = (
        BURN_THRESHOLD_PCT if burn_threshold is None else check_burn_threshold(burn_threshold)
    )
    fault_mtbf = PUBLISHED_MTBF_1024_H if fault_mtbf is None else check_fault_mtbf(fault_mtbf)
    clauses = read_thresholds(thresholds) if thresholds else None
    baseline = read_summary(compare) if compare else None
    if price is not None and not price > 0:
        raise MilarunError(f"--price must be a positive number of dollars, not {price!r}")
    inputs = load_inputs(
        source, warn or sys.stderr, plots=bool(html), cache=Cache.from_env() if cache else None
    )
    summary = inputs.summary
    weights_default = False
    if weights is None and not unweighted:
        suites = summary_suites(summary)
        default = shipped_weights(suites[0]) if len(suites) == 1 else None
        if default is not None:
            weights, weights_map, weights_default = default, load_weights(default), True
    report = build_report(
        summary,
        weights=weights_map,
        baseline=baseline,
        price=price,
        penalize_variance=penalize_variance,
        compare_gpus=compare_gpus,
        title=title,
        compare_nodes=compare_nodes,
        node_threshold=node_threshold,
        throughput=throughput,
        families=families,
        repeat_score=repeat_score,
    )
    # the fleet view: shown with 3 nodes or more (or --compare-nodes), beside the
    # leave-one-out node comparison (docs/acceptance.md, The fleet view)
    report.fleet = (
        fleet_view(summary["tests"])
        if compare_nodes or len(fleet_nodes(summary["tests"])) >= FLEET_MIN_NODES
        else None
    )
    report.io = io_tables(summary, points=inputs.io_points)
    report.llm = llm_rows(summary["tests"])
    report.soak = soak_rows(summary["tests"], fault_mtbf)
    report.acceptance = acceptance_sections(summary["tests"], burn_threshold)
    report.acceptance_verdict = (
        verdict(clauses, summary["tests"], summary.get("hosts")) if clauses is not None else None
    )
    report.inputs = inputs_of(
        source, summary, inputs.count, weights, weights_default, compare, price, families
    )
    if inputs.foreign:  # records no session of the folder wrote: named, not scored
        report.inputs["foreign"] = list(inputs.foreign)
    for diff in report.host_diffs:
        print(
            f"milarun: warning: {compare}: host fact differs from the baseline's: "
            f"{diff_line(diff)}",
            file=warn or sys.stderr,
        )
    text = render_text(report)
    if html:
        generated = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        page = _render_html(
            report,
            results_dir=inputs.results_dir,
            generated=generated,
            html_path=html,
            plots=inputs.plots,
            traces=inputs.traces,
        )
        write_text(html, page)
    return report, text


def write_text(path, text):
    """Write ``text`` to ``path`` atomically (:func:`milarun.formats.outfile.write_atomic`:
    temporary file in the same folder, rename; never through a symlink nor over a
    FIFO, device or folder).

    Raises:
        MilarunError: ``path`` is not a regular file, or cannot be written
            (one line naming it).
    """
    try:
        return write_atomic(path, text, durable=False)
    except UnsafeFileError:
        raise
    except OSError as exc:
        raise MilarunError(f"cannot write ({exc.strerror})", path=path)
