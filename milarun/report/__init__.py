"""The report: summary + weights + optional baseline + price → table, score, text and HTML.

* :mod:`.table` -- the score formula and the table (:func:`build_report`);
* :mod:`.text` -- terminal output (:func:`render_text`);
* :mod:`.html` and :mod:`.plots` -- the self-contained HTML page with SVG plots.

:func:`make_report` is what ``milarun report`` calls.
"""

import sys
from pathlib import Path

from .table import Report, build_report, check_weights, load_weights, weight_for

__all__ = ["Report", "build_report", "check_weights", "load_weights", "weight_for",
           "load_source", "make_report", "render_text", "render_html"]


def render_text(report):
    """Plain-text report (see :func:`milarun.report.text.render_text`)."""
    from .text import render_text as _render
    return _render(report)


def render_html(report, records=None, results_dir=None, generated=None, html_path=None):
    """HTML report (see :func:`milarun.report.html.render_html`)."""
    from .html import render_html as _render
    return _render(report, records=records, results_dir=results_dir, generated=generated,
                   html_path=html_path)


def load_source(source, warn=None):
    """Read a results directory or a summary JSON file.

    Returns ``(summary, records, results_dir)``; ``records`` and
    ``results_dir`` are ``None`` for a summary file. Skipped result files
    are listed in one warning line on ``warn`` (default: stderr).

    Raises:
        ResultFormatError: missing path, or a file that is not a summary.
    """
    from ..errors import ResultFormatError
    from ..summary import read_summary, summarize_dir

    warn = warn or sys.stderr
    path = Path(source)
    if path.is_dir():
        summary, records = summarize_dir(path, warn=warn)
        return summary, records, path
    if path.is_file():
        return read_summary(path), None, None
    raise ResultFormatError("no such results directory or summary file", path=path)


def make_report(source, weights=None, compare=None, price=None, compare_gpus=False,
                penalize_variance=True, title=None, html=None, warn=None,
                compare_nodes=False, node_threshold=None, throughput="effective"):
    """Build the report of ``source`` (results dir or summary file).

    ``weights`` and ``compare`` are file paths (or ``None``); ``price`` is in
    dollars; ``html`` is an output path; ``compare_nodes`` adds the node
    comparison, with ``node_threshold`` percent (default
    :data:`~milarun.report.table.NODE_THRESHOLD_PCT`; giving one implies
    ``compare_nodes``). Returns ``(report, text)``.

    Raises:
        MilarunError: a bad file, ``price`` <= 0, or ``node_threshold`` outside
            0..100 (checked before anything is read). ``throughput`` is ``"effective"``
    or ``"own"`` (the 2020 rule; see :func:`milarun.report.table.perf_basis`).
    """
    import datetime

    from ..summary import read_summary
    from .table import NODE_THRESHOLD_PCT, check_node_threshold

    if node_threshold is not None:
        node_threshold = check_node_threshold(node_threshold)
        compare_nodes = True
    else:
        node_threshold = NODE_THRESHOLD_PCT

    from .table import check_throughput
    throughput = check_throughput(throughput)
    weights_map = load_weights(weights) if weights else None
    baseline = read_summary(compare) if compare else None
    if price is not None and not price > 0:
        from ..errors import MilarunError
        raise MilarunError(f"--price must be a positive number of dollars, not {price!r}")
    summary, records, results_dir = load_source(source, warn=warn)
    report = build_report(summary, weights=weights_map, baseline=baseline, price=price,
                          penalize_variance=penalize_variance, compare_gpus=compare_gpus,
                          title=title, compare_nodes=compare_nodes,
                          node_threshold=node_threshold, throughput=throughput)
    from .io import io_tables
    report.io = io_tables(summary, records)
    from .checks import diff_line
    for diff in report.host_diffs:
        print(f"milarun: warning: {compare}: host fact differs from the baseline's: "
              f"{diff_line(diff)}", file=warn or sys.stderr)
    text = render_text(report)
    if html:
        generated = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        page = render_html(report, records=records, results_dir=results_dir,
                           generated=generated, html_path=html)
        write_text(html, page)
    return report, text


def write_text(path, text):
    """Write ``text`` to ``path`` atomically (temporary file in the same folder, rename)."""
    import os
    import tempfile

    from ..errors import MilarunError

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=path.suffix, dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as exc:
        raise MilarunError(f"cannot write ({exc.strerror})", path=path)
    return path
