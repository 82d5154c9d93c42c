"""The summary file (``milarun summary``, ``milarun report``'s input and baseline).

Summary format (version 1), a JSON object::

    {"format": "milarun-summary", "version": 1,
     "date": ISO-8601 UTC end of the latest result (or null),
     "steady_state": {"window_s": 10.0, "tail_s": 1.0},
     "hosts": [{"hostname", "cpu_model", "gpus": [names], "driver", "torch", "cuda",
                "cpu_count", "memory_limit_mib"}],
     "skipped": [file names that could not be read],
     "tests": {GROUP: {
         "name": "suite.job", "group": GROUP, "partition": ..., "device_count": k,
         "n": results, "failures": failed results,
         "runs": runs (repeats of the test) with a steady-state rate,
         "interrupted": records of launches the operator stopped (not in n),
         "failure_reasons": {reason: count},
         "failed": [{"device", "node", "run", "reason", "message", "returncode",
                     "stderr_tail", "file"}],
         "train": {n, min, max, mean, std},   # steady-state rates, items/s
         "total": {n, min, max, mean, std},   # program durations, s
         "pergpu": {device: {n, min, max, mean, std}},  # steady-state rates, items/s
         "pernode": {node: {n, min, max, mean, std}},   # steady-state rates, items/s
         "pernode_failures": {node: failed results},    # nodes with a failure only
         "node_count": n, "gpus_per_node": g,  # node-progression, multi-node groups only
         "peak_memory": MiB (max over results) or null,
         "steady": {"full": k, "short": k, "none": k},
         # tests with concurrent waves only (milarun.measure.throughput):
         "effective": {n, min, max, mean, std},          # effective rates, items/s
         "pergpu_effective": {device: {n, min, max, mean, std}},
         "adjusted": {n, min, max, mean, std},           # per-wave adjusted totals, items/s
         "perrun": {run: {n, min, max, mean, std}},  # each run's steady-state rates, items/s
         "perrun_effective": {run: {n, min, max, mean, std}},  # with concurrent waves only
         "overlap": smallest steady-state overlap of a wave (fraction),
         "sync": {"waves": k, "synchronized": results that met the start barrier,
                  "skew_s": largest start skew of a wave, s, or null},
         "validation_flags": [{"device", "node", "run", "check", "gpu", "value",
                               "threshold", "message", "file"}],   # only when any
         "energy": {"n", "source", "power_w": {n, min, max, mean, std}, "energy_j",
                    "items", "j_per_item", "items_per_j",
                    "pernode": {node: {"power_w", "j_per_item", "runs"}}},  # only with GPU energy
         "anomalies": [{"kind", "device", "run", "file", ...}],
         "soak": {"n", "save_s", "load_s", "restart_s", "lost_s", "lost_steps", "ettr",
                  "wall_s"},   # soak runs only: medians, s (milarun.analysis.soak)
         "tags": [the profile tags of its records],   # only when they have some
         "convergence": {"precision", "curves": [{"seed", "run", "device", "step": [...],
                         "items": [...], "loss": [...]}]}}},  # tests that log a loss
     "provenance": {"results": folder name, "suites": [suite names],
                    "profile": path or null, "profile_sha256": hex or null,
                    "milarun": [versions that wrote the results], "first": ISO-8601
                    UTC start of the earliest result or null}}

What each field holds and how it is computed: :mod:`milarun.analysis.summary`.

The same format is a **baseline** for ``milarun report --compare``. Its
declared schema is ``milarun/formats/schemas/summary.schema.json`` (finite,
non-negative statistics; safe group and device names); it is checked when a
summary is written and when one is read. :func:`read_summary` also reads the
flat 2020 milarun format ``{"suite.test": {"n", "failures", "total", "train",
"pergpu", "peak_memory"}}`` as version 0, migrated on read (:data:`FORMAT`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ResultFormatError
from .jsonfile import StrPath, check, key_path, read_json
from .store import write_json_atomic
from .versioned import Migration, VersionedFormat

SUMMARY_FORMAT = "milarun-summary"
SUMMARY_VERSION = 1
_UNSUPPORTED = "summary format version {version} is not supported (expected {current})"

_STAT_KEYS = ("n", "min", "max", "mean", "std")


def _from_2020(data: dict[str, Any]) -> dict[str, Any]:
    """Version 0 (the flat 2020 format, already checked) → version 1."""
    tests: dict[str, Any] = {}
    for gname, entry in sorted(data.items()):
        mem = entry.get("peak_memory")
        if isinstance(mem, dict):  # some 2020 files kept one value per GPU
            mem = max((v for v in mem.values() if v is not None), default=None)
        tests[gname] = {
            "name": gname,
            "group": gname,
            "partition": None,
            "device_count": None,
            **{k: entry[k] for k in ("n", "failures", "train", "total", "pergpu") if k in entry},
            "peak_memory": mem,
        }
    return {
        "format": SUMMARY_FORMAT,
        "version": 1,
        "origin": "milarun-2020",
        "date": None,
        "hosts": [],
        "skipped": [],
        "tests": tests,
    }


#: The summary's versions and migrations (:mod:`milarun.formats.versioned`): each old
#: version is checked against its schema before its step. Version 0 is the flat 2020
#: milarun format, which has no version field.
FORMAT = VersionedFormat(
    SUMMARY_VERSION,
    {
        0: Migration(_from_2020, schema="summary#/$defs/flat2020"),
    },
    what="summary ",
    too_new=_UNSUPPORTED,
    unknown=_UNSUPPORTED,
)

_NOT_A_SUMMARY = (
    'not a milarun summary: expected {"format": "milarun-summary", "version": 1, '
    '"tests": {...}} or the 2020 flat format {"suite.test": {"n", "failures", '
    '"train", ...}}'
)


def summary_version(data: Any, path: StrPath | None = None) -> int:
    """The format version of summary ``data``: its ``version``, or 0 for the flat
    2020 format (an object of ``{"suite.test": {"n", "train", ...}}``).

    Raises:
        ResultFormatError: neither format.
    """
    if isinstance(data, dict) and "format" in data:
        if data["format"] != SUMMARY_FORMAT:
            raise ResultFormatError(_NOT_A_SUMMARY, path=path)
        return FORMAT.version_of(data, path)
    if (
        isinstance(data, dict)
        and data
        and all(isinstance(v, dict) and "train" in v and "n" in v for v in data.values())
    ):
        return 0
    raise ResultFormatError(_NOT_A_SUMMARY, path=path)


def _stats(value: dict[str, Any] | None) -> dict[str, Any]:
    out = {k: (value or {}).get(k) for k in _STAT_KEYS}
    out["n"] = int(out["n"] or 0)
    return out


def _complete(data: dict[str, Any], path: StrPath | None) -> dict[str, Any]:
    """Fill the optional fields of a checked version-1 summary with their defaults
    and check what the schema cannot (failures <= n, per-node failures <= failures)."""
    out = dict(data)
    out.setdefault("hosts", [])
    out.setdefault("skipped", [])
    out.setdefault("date", None)
    out["provenance"] = {
        "results": None,
        "suites": [],
        "profile": None,
        "profile_sha256": None,
        "milarun": [],
        "first": None,
        **(data.get("provenance") or {}),
    }
    tests: dict[str, Any] = {}
    for gname, entry in data["tests"].items():
        n, failures = int(entry["n"]), int(entry.get("failures", 0))
        if failures > n:
            raise ResultFormatError(
                f"more failures ({failures}) than results ({n})",
                path=path,
                key=key_path(["tests", gname, "failures"]),
            )
        # None: a summary written before runs were counted; 2.0 is an integer to the schema
        runs = None if entry.get("runs") is None else int(entry["runs"])
        rates = int((entry["train"] or {}).get("n") or 0)
        if runs is not None and runs > rates:
            # a run is counted only with a rate: more would hide the one-run note
            raise ResultFormatError(
                f"more runs with a rate ({runs}) than rates ({rates})",
                path=path,
                key=key_path(["tests", gname, "runs"]),
            )
        runs = entry.get("runs")
        runs = None if runs is None else int(runs)  # JSON's 2.0 passes the schema as an integer
        rated = _stats(entry["train"])["n"]
        if runs is not None and runs > rated:
            raise ResultFormatError(
                f"more runs with a rate ({runs}) than rates ({rated})",
                path=path,
                key=key_path(["tests", gname, "runs"]),
            )
        pernode_failures = {d: int(c) for d, c in (entry.get("pernode_failures") or {}).items()}
        if sum(pernode_failures.values()) > failures:
            raise ResultFormatError(
                f"more failures per node ({sum(pernode_failures.values())}) than failures "
                f"({failures})",
                path=path,
                key=key_path(["tests", gname, "pernode_failures"]),
            )
        tests[gname] = {
            "name": entry.get("name", gname),
            "group": gname,
            "partition": entry.get("partition"),
            "device_count": entry.get("device_count"),
            "n": n,
            "failures": failures,
            "runs": runs,
            "interrupted": int(entry.get("interrupted") or 0),
            "failure_reasons": dict(entry.get("failure_reasons") or {}),
            "failed": [{"node": None, **f} for f in entry.get("failed") or []],
            "train": _stats(entry["train"]),
            "total": _stats(entry.get("total")),
            "pergpu": {d: _stats(v) for d, v in (entry.get("pergpu") or {}).items()},
            "pernode": {d: _stats(v) for d, v in (entry.get("pernode") or {}).items()},
            "pernode_failures": pernode_failures,
            "node_count": entry.get("node_count"),
            "gpus_per_node": entry.get("gpus_per_node"),
            "peak_memory": entry.get("peak_memory"),
            "steady": dict(entry.get("steady") or {}),
            # concurrent waves (milarun.measure.throughput); None / {} without any
            "effective": _stats(entry["effective"]) if entry.get("effective") else None,
            "pergpu_effective": {
                d: _stats(v) for d, v in (entry.get("pergpu_effective") or {}).items()
            },
            "adjusted": _stats(entry["adjusted"]) if entry.get("adjusted") else None,
            # each run's rates (milarun report --repeat-score); {} in older summaries
            "perrun": {r: _stats(v) for r, v in (entry.get("perrun") or {}).items()},
            "perrun_effective": {
                r: _stats(v) for r, v in (entry.get("perrun_effective") or {}).items()
            },
            "overlap": entry.get("overlap"),
            "sync": dict(entry["sync"]) if entry.get("sync") else None,
            "validation_flags": list(entry.get("validation_flags") or []),
            "energy": entry.get("energy"),
            "anomalies": [dict(f) for f in entry.get("anomalies") or []],
        }
        if entry.get("llm") is not None:  # LLM tests only (milarun.analysis.llm)
            tests[gname]["llm"] = entry["llm"]
        if entry.get("server") is not None:  # server-scenario tests (milarun.analysis.llm)
            tests[gname]["server"] = entry["server"]
        if entry.get("soak") is not None:  # soak runs only (milarun.analysis.soak)
            tests[gname]["soak"] = dict(entry["soak"])
        if entry.get("acceptance") is not None:  # acceptance tests only (analysis.acceptance)
            tests[gname]["acceptance"] = entry["acceptance"]
        if entry.get("tags") is not None:  # the profile tags, when the records kept them
            tests[gname]["tags"] = list(entry["tags"])
        if entry.get("convergence") is not None:  # loss curves (milarun.analysis.convergence)
            tests[gname]["convergence"] = entry["convergence"]
    out["tests"] = tests
    return out


def normalize_summary(data: Any, path: StrPath | None = None) -> dict[str, Any]:
    """Check a summary (ours, any version, or the 2020 flat format), migrate it to
    the current version and return it with every optional field filled.

    Each version is checked against its schema (``milarun/formats/schemas/summary.schema.json``
    and its ``$defs/flat2020``) before its migration step runs.

    Raises:
        ResultFormatError: neither format, an unsupported version, or a
            malformed entry (one line naming the key).
    """
    data = FORMAT.upgrade(data, summary_version(data, path), path)
    check_summary(data, path=path)
    return _complete(data, path)


def read_summary(path: StrPath) -> dict[str, Any]:
    """Read a summary or baseline JSON file (either format, strictly).

    Raises:
        ResultFormatError: unreadable, not UTF-8, not JSON, neither format, or
            a malformed entry.
    """
    return normalize_summary(read_json(path), path=path)


def check_summary(summary: dict[str, Any], path: StrPath | None = None) -> dict[str, Any]:
    """Check a current-version summary against ``summary.schema.json``; return it.

    Raises:
        ResultFormatError: one line naming the key.
    """
    return check(summary, "summary", path=path)


def write_summary(summary: dict[str, Any], out: StrPath) -> Path:
    """Check ``summary`` (:func:`check_summary`) and write it to ``out`` atomically
    (a ``.json`` path).

    Raises:
        ResultFormatError: the summary breaks its own schema (a bug).
    """
    check_summary(summary, path=out)
    return write_json_atomic(out, summary)
