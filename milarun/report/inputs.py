"""What the report reads from its source, kept in this user's cache.

Of a results folder the report needs the summary
(:func:`milarun.analysis.summary.summarize`) and, beyond it, three facts of the
records: the input-pipeline study's points (:func:`milarun.report.iostudy.io_points`),
the profiler traces they name (:func:`milarun.report.html.trace_refs`) and, for
the HTML page, each test's throughput plot
(:func:`milarun.report.html.throughput_plots`). :func:`load_inputs` computes them
once per folder content and keeps them in the private cache
(:mod:`milarun.formats.cache`), under a key made of milarun's code and the path
and SHA-256 of every file the reader looks at. The report of a folder that has not
changed, asked again with other options, reads every file's bytes to hash them,
but parses, checks, summarizes and draws nothing again; its text and HTML are the
same as those of the first report. The warnings of skipped files are kept too and
printed again. What can change without a result file changing is read every time:
the session file's profile (the summary's provenance), the failure logs and the
trace files the page links to.

A folder with a session (``.milarun/session.json``) is judged by the rule of
``milarun jobs --resume`` (:func:`milarun.launcher.session.successful_keys`, the
one place of that rule): a successful record that none of the folder's sessions
wrote (copied in from another folder, another session's stamp) is skipped, named in
the report's header, never scored; the session ids are part of the cache key. The
seal's own files (``bundle.json``, ``bundle.json.sig``) are not records: they are
not read, and no warning names them.
"""

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

from ..analysis.summary import load_results, provenance, summarize_with
from ..errors import ResultFormatError
from ..formats.bundle import bundle_path, signature_path
from ..formats.cache import entry_key
from ..formats.store import result_files
from ..formats.summary import check_summary, read_summary
from ..launcher.session import read_session, session_times, successful_keys
from .html import throughput_plot, trace_refs
from .iostudy import io_points

#: The cache's kind of entry.
KIND = "report"


@dataclass
class Inputs:
    """What :func:`load_inputs` read.

    ``summary``: the summary (with its provenance). ``results_dir``: the results
    folder (None for a summary file). ``count``: the records read (None for a
    summary file). ``io_points``, ``traces`` and
    ``plots``: as :func:`~milarun.report.iostudy.io_points`,
    :func:`~milarun.report.html.trace_refs` and
    :func:`~milarun.report.html.throughput_plots` give them (None for a summary
    file; ``plots`` also when not asked for). ``cached``: read from the cache.
    ``foreign``: the POSIX paths, relative to the folder, of the successful records
    that no session of the folder wrote (skipped, not scored; empty without a session).
    """

    summary: dict
    results_dir: Path | None = None
    count: int | None = None
    io_points: dict | None = None
    traces: list | None = None
    plots: dict | None = None
    cached: bool = False
    foreign: list | None = None


class _Tee(io.TextIOBase):
    """Writes to ``stream`` and keeps a copy (the warnings an entry replays)."""

    def __init__(self, stream):
        self.stream, self.parts = stream, []

    def write(self, text):
        self.parts.append(text)
        return self.stream.write(text)


#: Why a record that no session of the folder wrote is not scored.
FOREIGN = "not written by a session of this folder (copied in?); not counted"


def _key(directory, files, sessions):
    # the folder as given too: the warnings kept name each file by it (results/a.json);
    # the sessions: they decide which records count
    parts = [
        str(directory.resolve()),
        str(directory),
        "sessions\0"
        + ("-" if sessions is None else ",".join(sorted(t.isoformat() for t in sessions))),
    ]
    for path, raw in files:
        rel = path.relative_to(directory).as_posix()
        # an error is a message (it names the path), a file is its bytes' digest
        parts.append(
            rel
            + "\0"
            + (f"!{raw}" if isinstance(raw, ResultFormatError) else hashlib.sha256(raw).hexdigest())
        )
    return entry_key(KIND, parts)


def _from_value(value, directory):
    traces = [(str(directory / rel), trace, group) for rel, trace, group in value["traces"]]
    plots = value["plots"]
    if plots is not None:
        plots = {group: (svg, legend, marks) for group, (svg, legend, marks) in plots.items()}
    if not (
        isinstance(value["summary"], dict)
        and isinstance(value["count"], int)
        and isinstance(value["io_points"], dict)
        and isinstance(value["warnings"], str)
    ):
        raise ValueError("malformed entry")
    check_summary(value["summary"])  # an entry edited by hand is a miss, not a crash
    if not (
        isinstance(value["foreign"], list) and all(isinstance(p, str) for p in value["foreign"])
    ):
        raise ValueError("malformed entry")
    return Inputs(
        summary=value["summary"],
        results_dir=directory,
        count=value["count"],
        io_points=value["io_points"],
        traces=traces,
        plots=plots,
        cached=True,
        foreign=value["foreign"],
    )


def load_inputs(source, warn, plots=False, cache=None, only=None):
    """Read ``source`` (a results folder or a summary file) for the report.

    Args:
        source: a results folder, or a summary JSON file.
        warn: the stream of the warning lines (each skipped file, named).
        plots: also draw every test's throughput plot (for the HTML page).
        cache: a :class:`milarun.formats.cache.Cache`, or None to compute
            everything (``milarun report --no-cache``).
        only: the records to read, as :func:`milarun.analysis.summary.load_results`
            takes it (a bundle's chained records; the cache is then not used).

    Returns:
        an :class:`Inputs`.

    Raises:
        ResultFormatError: a missing source, a file that is not a summary, or a
            folder without a usable result.
    """
    path = Path(source)
    if path.is_file():
        return Inputs(summary=read_summary(path))
    if not path.is_dir():
        raise ResultFormatError("no such results directory or summary file", path=path)
    seal = {bundle_path(path), signature_path(path)}  # not records (weights: in .milarun/)
    files = [(p, raw) for p, raw in result_files(path) if p not in seal]
    saved = read_session(path)
    sessions = session_times(saved) if saved is not None else None
    key = _key(path, files, sessions) if cache is not None and only is None else None
    inputs = _cached(cache, key, path, plots, warn) if key is not None else None
    if inputs is None:
        inputs, warnings = _read(path, files, sessions, warn, plots, only)
        if key is not None:
            cache.put(KIND, key, _entry(inputs, path, warnings))
    provenance(inputs.summary, path)
    return inputs


def _cached(cache, key, directory, plots, warn):
    """The :class:`Inputs` of ``cache``'s entry ``key`` (its warnings written again on
    ``warn``), or None: no entry, one without the plots asked for, a malformed one."""
    value = cache.get(KIND, key)
    if not isinstance(value, dict) or (plots and value.get("plots") is None):
        return None
    try:
        inputs = _from_value(value, directory)
    except (KeyError, TypeError, ValueError, AttributeError, ResultFormatError):
        return None  # a malformed entry is a miss
    warn.write(value["warnings"])
    return inputs


def _read(directory, files, sessions, warn, plots, only):
    """Read, check and summarize the records of ``files`` (and draw their plots):
    ``(Inputs, the warning lines written on warn)``."""
    foreign: list = []
    if sessions is not None:  # the rule of --resume: only this folder's sessions count
        alien = {p for p, _ in successful_keys(directory, sessions)[1]}
        files = [(p, ResultFormatError(FOREIGN, path=p) if p in alien else raw) for p, raw in files]
        foreign = sorted(p.relative_to(directory).as_posix() for p in alien)
    tee = _Tee(warn)
    records, skipped = load_results(directory, warn=tee, only=only, files=files)
    # each test's plot reads the steady states and flags its summary computed
    summary, drawn = summarize_with(
        records, skipped, warn=tee, extra=throughput_plot if plots else None
    )
    inputs = Inputs(
        summary=summary,
        results_dir=directory,
        count=len(records),
        io_points=io_points(records),
        traces=trace_refs(records),
        plots={group: plot for group, plot in drawn.items() if plot is not None} if plots else None,
        foreign=foreign,
    )
    return inputs, "".join(tee.parts)


def _entry(inputs, directory, warnings):
    """The cache entry of ``inputs`` (read from ``directory``; ``warnings``: the lines
    to write again): plain JSON values, paths relative to the folder."""
    return {
        "summary": inputs.summary,
        "count": inputs.count,
        "io_points": inputs.io_points,
        "traces": [
            (Path(p).relative_to(directory).as_posix(), trace, group)
            for p, trace, group in inputs.traces
        ],
        "plots": inputs.plots,
        "warnings": warnings,
        "foreign": inputs.foreign,
    }
