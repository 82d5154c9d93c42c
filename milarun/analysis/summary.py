"""Results → summary: results grouped by test, with steady-state statistics.

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
         "overlap": smallest steady-state overlap of a wave (fraction),
         "sync": {"waves": k, "synchronized": results that met the start barrier,
                  "skew_s": largest start skew of a wave, s, or null},
         "validation_flags": [{"device", "node", "run", "check", "gpu", "value",
                               "threshold", "message", "file"}],   # only when any
         "energy": {"n", "source", "power_w": {n, min, max, mean, std}, "energy_j",
                    "items", "j_per_item", "items_per_j",
                    "pernode": {node: {"power_w", "j_per_item", "runs"}}},  # only with GPU energy
         "anomalies": [{"kind", "device", "run", "file", ...}]}},
     "provenance": {"results": folder name, "suites": [suite names],
                    "profile": path or null, "profile_sha256": hex or null,
                    "milarun": [versions that wrote the results], "first": ISO-8601
                    UTC start of the earliest result or null}}

GROUP comes from the result's plan type (:func:`milarun.plan.types.group_name`):
``suite.job`` for normal, per-gpu, njobs and multi-node tests,
``suite.job.<device_count>`` for gpu-progression tests and
``suite.job.<n>x<g>`` (n nodes × g GPUs per node) for node-progression tests.
``train``, ``pergpu`` and ``pernode`` use successful results that have a
steady-state rate; ``total`` uses successful results that recorded a program
duration. ``steady`` counts results by the note of
:func:`milarun.measure.stats.steady_state` (``short``: fewer than 10 s of steady
state, every non-warm-up sample was used).

``pernode`` keys a result by the node it ran on (:func:`node_of`): its
``node`` field, else its ``host.hostname`` (a single-host run). A result that
spanned several nodes (``nodes`` lists more than one) measured the whole job,
not one node, so it is left out of ``pernode``; so is one whose node name is
not a safe name. Failed results are keyed by the same rule: each ``failed``
entry has its ``node`` (null when the rule gives none) and
``pernode_failures`` counts them per node (interrupted launches are not
failures). A node whose every run failed is thus in ``pernode_failures`` and
not in ``pernode``. Both are what ``milarun report --compare-nodes``
compares. ``node_count`` and ``gpus_per_node`` (the n and g of the group
name) are present in node-progression groups, and in multi-node groups (the
nodes and devices per node of the job) only.

A *concurrent wave* is the successful results of one run of a test when
there are two or more (per-GPU children, the processes of a multi-process
test): ``effective``, ``pergpu_effective``, ``adjusted``, ``overlap`` and
``sync`` describe them (:func:`milarun.measure.throughput.summarize_waves`: own,
effective and adjusted throughput as DLBS defines them) and are present only
in tests that have one.

``anomalies`` are the flags of :mod:`milarun.measure.anomalies` (its module doc has
the rules): each result's ``slow-windows``, ``stall``, ``short-steady`` and
``no-steady-state`` flags, then the group's ``outlier`` flags, each naming the
result's ``device``, ``run`` and ``file`` (and ``node`` on several nodes), with
the numbers of its rule (``spans`` are left out: the HTML plots recompute them
from the records). ``provenance`` says where the results came from: the
results folder's name, the suites of the records, the profile file and its
SHA-256 when the folder's ``.milarun/session.json`` names them, the milarun
versions the records name (``host.milarun_version``, with ``milarun_commit``)
and the earliest start.

``pernode``, ``pernode_failures``, ``failed[].node``, ``node_count``,
``gpus_per_node``, the concurrent-wave fields, ``anomalies`` and ``provenance``
were added without changing the version: they are optional, a summary without
them is still version 1 and reads as before (``pernode``, ``pernode_failures``
and ``anomalies`` are then empty, ``failed[].node`` is null).

Validation (:mod:`milarun.measure.validation`): every record goes through
:func:`milarun.measure.validation.judge` first, so a successful record with a NaN
loss or no steady state counts as a failure (``nan-loss``,
``no-steady-state``) whenever it was written. ``validation_flags`` lists the
flags of the group's successful results (GPU load or memory below the job's
threshold, host busy outside the suite, steal time), with the thresholds of
the job's ``validation`` block. ``energy`` is the power and energy per item
over the steady states (:mod:`milarun.measure.energy`), present only when GPU energy
or power readings cover them. ``hosts`` entries also carry the facts of
:mod:`milarun.host.facts` that the results recorded (milarun version and
commit, kernel, CPU governor and boost, GPU power limits, clocks,
persistence and ECC; ``student_cpus``, ``memory_limit_mib`` and
``cgroup_cpu_quota``: the tightest student limits seen). These are optional
additions to version 1 as well.

The same format is a **baseline** for ``milarun report --compare``. Its
declared schema is ``milarun/formats/schemas/summary.schema.json`` (finite,
non-negative statistics; safe group and device names); it is checked when a
summary is written and when one is read. :func:`read_summary` also reads the
flat 2020 milarun format ``{"suite.test": {"n", "failures", "total", "train",
"pergpu", "peak_memory"}}`` as version 0, migrated on read (``_MIGRATIONS``).
"""

import datetime
import gc
import re
import sys
from collections import defaultdict
from pathlib import Path

from ..errors import ResultFormatError, SetupError
from ..formats.jsonfile import check, first_error, key_path, read_json
from ..formats.store import iter_results, write_json_atomic
from ..formats.terminal import terminal_safe
from ..host import facts as hostfacts
from ..launcher.session import read_session
from ..measure import anomalies, energy, stats, throughput, validation
from ..measure.stats import finite
from ..plan import types as plantypes

SUMMARY_FORMAT = "milarun-summary"
SUMMARY_VERSION = 1

#: Characters of stderr tail kept per failure in a summary.
TAIL_CHARS = 4000


def group_name(record):
    """Return the summary group of a result (the plan type's rule, :mod:`milarun.plan.types`):
    ``suite.job``, ``suite.job.<device_count>`` or ``suite.job.<nodes>x<gpus>``."""
    return plantypes.group_name(record)


def load_results(directory, warn=None):
    """Read every result under ``directory`` (see :func:`milarun.formats.store.iter_results`).

    Returns ``(records, skipped)``: records are ``(path, record)`` pairs;
    ``skipped`` lists ``(path, error)`` for files that are corrupt, of another
    format version, invalid or not results. When ``warn`` (a file such as
    ``sys.stderr``) is given, each skipped file gets one warning line on it,
    naming the file and the key.

    Raises:
        ResultFormatError: ``directory`` is not a directory, or holds no
            usable result.
    """

    directory = Path(directory)
    if not directory.is_dir():
        raise ResultFormatError("not a results directory", path=directory)
    records, skipped = [], []
    # Records are trees of dicts and lists, without cycles: the cyclic garbage
    # collector would walk the growing pile of them again and again (about 5 % of
    # reading 10,000 records) and find nothing to free. It is off while they load.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for path, rec in iter_results(directory):
            if isinstance(rec, Exception):
                skipped.append((path, rec))
            else:
                records.append((path, rec))
    finally:
        if collecting:
            gc.enable()
    if warn is not None and skipped:
        warn_skipped(skipped, warn)
    if not records:
        raise ResultFormatError(f"no usable result in {directory}"
                                + (f" ({len(skipped)} file(s) skipped)" if skipped else ""))
    return records, skipped


def warn_skipped(skipped, stream=None):
    """Write one warning line per skipped file: ``milarun: warning: skipped <file>: <key>:
    <message>`` (control characters of a file name or message shown escaped:
    :func:`milarun.formats.terminal.terminal_safe`)."""
    stream = stream or sys.stderr
    for path, exc in skipped:
        print(terminal_safe(f"milarun: warning: skipped {exc if str(exc) else path}"),
              file=stream)


def _tail(text, limit=TAIL_CHARS):
    if not text:
        return None
    text = str(text)
    return text[-limit:]


def _host_facts(host):
    """Machine-level facts of one result; per-student facts (cpuset, memory
    limit, the GPUs visible to that child) are left out so that every result
    of one machine maps to the same host."""
    gpus = [g for g in host.get("gpus") or [] if isinstance(g, dict)]
    return {
        "hostname": host.get("hostname"),
        "cpu_model": host.get("cpu_model"),
        "cpu_count": host.get("cpu_count"),
        "driver": next((g.get("driver") for g in gpus if g.get("driver")), None),
        "torch": host.get("torch"),
        "cuda": host.get("cuda"),
        **hostfacts.machine_facts(host),
    }


def _host_gpus(host):
    """``{global GPU index: name}`` of the GPUs one result saw."""
    return {g.get("index", i): g.get("name")
            for i, g in enumerate(host.get("gpus") or []) if isinstance(g, dict)}


# validation, the summary, the flags and the waves share each result's steady state
@stats.steady_states_once()
def summarize(records, skipped=(), warn=None):
    """Group result records by test and compute their statistics.

    ``records`` are result dicts or ``(path, record)`` pairs (as from
    :func:`load_results`). A record whose samples are malformed (a sample that
    ends before it starts, a steady-state rate outside
    :func:`milarun.measure.stats.check_rate`'s range) is moved to ``skipped``, with one
    warning line on ``warn`` when given. Returns the summary dict described in
    the module docstring.
    """
    groups = defaultdict(list)
    hosts = {}
    skipped_names = [Path(p).name for p, _ in skipped]
    last_end = first_start = None
    suites, versions = set(), set()
    for item in records:
        path, rec = item if isinstance(item, tuple) else (None, item)
        try:
            rec = validation.judge(rec)  # records written before the checks existed too
            samples = rec["timings"].get("train", {}).get("samples", [])
            rate, chosen, note = stats.steady_state(samples)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            skipped_names.append(Path(path).name if path else rec.get("name", "?"))
            if warn is not None:
                warn_skipped([(path, ResultFormatError(str(exc) or type(exc).__name__,
                                                       path=path))], warn)
            continue
        groups[group_name(rec)].append((path, rec, rate, note, chosen))
        host = rec.get("host") or {}
        if isinstance(host, dict) and host.get("cpu_model"):
            facts = _host_facts(host)
            entry = hosts.setdefault(repr(sorted(facts.items())), {**facts, "_gpus": {}})
            entry["_gpus"].update(_host_gpus(host))
            hostfacts.accumulate(entry, host)
        end = (rec["timings"].get("program") or {}).get("end")
        if finite(end):
            last_end = end if last_end is None else max(last_end, end)
        start = (rec["timings"].get("program") or {}).get("start")
        if finite(start):
            first_start = start if first_start is None else min(first_start, start)
        if isinstance(rec.get("suite"), str):
            suites.add(rec["suite"])
        if isinstance(host, dict) and isinstance(host.get("milarun_version"), str):
            commit = host.get("milarun_commit")
            versions.add(host["milarun_version"] + (
                f" (commit {commit[:12]}{', modified' if host.get('milarun_dirty') else ''})"
                if isinstance(commit, str) and commit else ""))

    tests = {}
    for gname in sorted(groups):
        tests[gname] = _summarize_group(gname, groups[gname])
    return {
        "format": SUMMARY_FORMAT,
        "version": SUMMARY_VERSION,
        "date": _iso(last_end),
        "steady_state": {"window_s": stats.STEADY_WINDOW_S, "tail_s": stats.STEADY_TAIL_S},
        "hosts": [{**{k: v for k, v in h.items() if not k.startswith("_")},
                   "gpus": [h["_gpus"][i] for i in sorted(h["_gpus"])],
                   **hostfacts.collapse(h)}
                  for h in hosts.values()],
        "skipped": sorted(skipped_names),
        "tests": tests,
        "provenance": {"results": None, "suites": sorted(suites), "profile": None,
                       "profile_sha256": None, "milarun": sorted(versions),
                       "first": _iso(first_start)},
    }


def _iso(stamp):
    """Unix time → ISO-8601 UTC to the second, or None."""
    if stamp is None:
        return None
    return datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).isoformat(
        timespec="seconds")


def device_key(label):
    """Sort key for device labels: ``"2"`` before ``"10"``, ``"0-3"`` by its first
    device, non-numeric labels (``"all"``) last."""
    label = str(label)
    head = label.split("-")[0]
    return (0, int(head), label) if head.isdigit() else (1, 0, label)


def node_key(name):
    """Sort key for node names: ``node2`` before ``node10``."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name)]


def node_of(record):
    """The node a result ran on: its ``node``, else ``host.hostname``; None when it
    spanned several nodes (its rate is the whole job's) or the name is not a safe
    name (``common.schema.json#/$defs/name``)."""
    nodes = record.get("nodes")
    if isinstance(nodes, list) and len(nodes) > 1:
        return None
    node = record.get("node")
    if node is None:
        host = record.get("host")
        node = host.get("hostname") if isinstance(host, dict) else None
    if not isinstance(node, str) or first_error(node, "common#/$defs/name") is not None:
        return None
    return node


def _summarize_group(gname, items):
    first = items[0][1]
    rates, durations, memory = [], [], []
    pergpu = defaultdict(list)
    scored = []  # successful results with a rate: the concurrent waves' members
    pernode = defaultdict(list)
    pernode_failures = defaultdict(int)
    reasons = defaultdict(int)
    failed = []
    interrupted = 0
    steady = {stats.FULL: 0, stats.SHORT: 0, stats.NONE: 0}
    flags, rated = [], []
    for path, rec, rate, note, chosen in sorted(
            items, key=lambda it: (device_key(it[1].get("device", "")),
                                   it[1].get("run", 0) if isinstance(it[1].get("run"), int)
                                   else 0)):
        mem = rec.get("peak_memory_mib")
        if finite(mem):
            memory.append(float(mem))
        where = _flag_where(path, rec)
        if where is not None:
            flags += [{**f, **where} for f in anomalies.result_flags(rec)]
        if not rec["success"]:
            err = rec.get("error") or {}
            if not isinstance(err, dict):
                err = {"message": str(err)}
            reason = err.get("reason") or "error"
            if reason == "interrupted":
                # the operator stopped it: not the machine's failure, not a result
                interrupted += 1
                continue
            reasons[reason] += 1
            node = node_of(rec)
            if node is not None:
                pernode_failures[node] += 1
            failed.append({
                "device": str(rec.get("device", "")),
                "node": node,
                "run": rec.get("run"),
                "reason": reason,
                "message": err.get("message"),
                "returncode": err.get("returncode"),
                "stderr_tail": _tail(err.get("stderr_tail")),
                "file": Path(path).name if path else None,
            })
            continue
        steady[note] += 1
        duration = (rec["timings"].get("program") or {}).get("duration")
        if finite(duration):
            durations.append(float(duration))
        if rate is not None:
            rates.append(rate)
            scored.append(rec)
            rated.append((path, rec, rate))
            pergpu[str(rec.get("device", ""))].append(rate)
            node = node_of(rec)
            if node is not None:
                pernode[node].append(rate)
    outliers = anomalies.group_flags([(rec.get("device", ""), rec.get("run"), rate)
                                      for _, rec, rate in rated])
    for flag in outliers:
        path, rec, _ = rated[flag.pop("index")]
        flag.update(_flag_where(path, rec) or {})
    flags = [{k: v for k, v in f.items() if k != "spans"} for f in flags + outliers]
    partition = first.get("partition", "normal")
    # the group holds one shape of the study: its records all say it (a multi-node
    # job's too: the node score divides its rate by its node count)
    shape = (plantypes.TYPES["node-progression"].shape(first)
             if partition in ("node-progression", "multi-node") else None)
    return {
        "name": first["name"],
        "group": gname,
        "partition": partition,
        "device_count": first.get("device_count"),
        **({"node_count": shape[0], "gpus_per_node": shape[1]} if shape else {}),
        "n": len(items) - interrupted,
        "failures": len(failed),
        "runs": len({r.get("run") if isinstance(r.get("run"), int) else 0 for r in scored}),
        "interrupted": interrupted,
        "failure_reasons": dict(sorted(reasons.items())),
        "failed": failed,
        "train": stats.describe(rates),
        "total": stats.describe(durations),
        "pergpu": {dev: stats.describe(pergpu[dev]) for dev in sorted(pergpu, key=device_key)},
        "pernode": {node: stats.describe(pernode[node]) for node in sorted(pernode, key=node_key)},
        "pernode_failures": {node: pernode_failures[node]
                             for node in sorted(pernode_failures, key=node_key)},
        "peak_memory": max(memory) if memory else None,
        "steady": steady,
        **throughput.summarize_waves(scored),
        "anomalies": flags,
        **_checks(items),
    }


def _checks(items):
    """The validation flags and the energy of a group (:mod:`milarun.measure.validation`,
    :mod:`milarun.measure.energy`), each only when there is one."""
    out = {}
    flags = validation.summary_flags(items, node_of)
    if flags:
        out["validation_flags"] = flags
    power = energy.summarize_energy(items, node_of)
    if power is not None:
        out["energy"] = power
    return out


def _flag_where(path, rec):
    """What names a result in its flags: ``file`` (and ``node`` on several nodes);
    None for an interrupted launch (stopped by the operator: no anomaly of the machine)."""
    err = rec.get("error")
    if not rec.get("success") and isinstance(err, dict) and err.get("reason") == "interrupted":
        return None
    where = {"file": Path(path).name if path else None}
    if rec.get("node") is not None or rec.get("nodes"):
        where["node"] = node_of(rec)
    return where


def summarize_dir(directory, warn=None):
    """Load ``directory`` and summarize it. Returns ``(summary, records)``.

    The summary's ``provenance`` names the folder, and the profile its
    ``.milarun/session.json`` was started with (when it has a readable one).
    """
    records, skipped = load_results(directory, warn=warn)
    summary = summarize(records, skipped, warn=warn)
    prov = summary["provenance"]
    prov["results"] = Path(directory).resolve().name
    try:
        invocation = (read_session(directory) or {}).get("invocation") or {}
    except SetupError:
        invocation = {}
    for key in ("profile", "profile_sha256"):
        if isinstance(invocation.get(key), str):
            prov[key] = invocation[key]
    return summary, records


# --- reading summaries (ours and the 2020 flat format) -------------------------------

_STAT_KEYS = ("n", "min", "max", "mean", "std")


def _from_2020(data):
    """Version 0 (the flat 2020 format, already checked) → version 1."""
    tests = {}
    for gname, entry in sorted(data.items()):
        mem = entry.get("peak_memory")
        if isinstance(mem, dict):   # some 2020 files kept one value per GPU
            mem = max((v for v in mem.values() if v is not None), default=None)
        tests[gname] = {"name": gname, "group": gname, "partition": None,
                        "device_count": None,
                        **{k: entry[k] for k in ("n", "failures", "train", "total", "pergpu")
                           if k in entry},
                        "peak_memory": mem}
    return {"format": SUMMARY_FORMAT, "version": 1, "origin": "milarun-2020",
            "date": None, "hosts": [], "skipped": [], "tests": tests}


#: Summary migrations: ``{version: (schema of that version, step to version + 1)}``.
#: Version 0 is the flat 2020 milarun format, which has no version field.
_MIGRATIONS = {
    0: ("summary#/$defs/flat2020", _from_2020),
}

_NOT_A_SUMMARY = (
    "not a milarun summary: expected {\"format\": \"milarun-summary\", \"version\": 1, "
    "\"tests\": {...}} or the 2020 flat format {\"suite.test\": {\"n\", \"failures\", "
    "\"train\", ...}}")


def summary_version(data, path=None):
    """The format version of summary ``data``: its ``version``, or 0 for the flat
    2020 format (an object of ``{"suite.test": {"n", "train", ...}}``).

    Raises:
        ResultFormatError: neither format.
    """
    if isinstance(data, dict) and "format" in data:
        if data["format"] != SUMMARY_FORMAT:
            raise ResultFormatError(_NOT_A_SUMMARY, path=path)
        version = data.get("version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise ResultFormatError(f"bad summary format version {version!r}"[:80],
                                    path=path, key="version")
        return version
    if (isinstance(data, dict) and data
            and all(isinstance(v, dict) and "train" in v and "n" in v for v in data.values())):
        return 0
    raise ResultFormatError(_NOT_A_SUMMARY, path=path)


def _stats(value):
    out = {k: (value or {}).get(k) for k in _STAT_KEYS}
    out["n"] = int(out["n"] or 0)
    return out


def _complete(data, path):
    """Fill the optional fields of a checked version-1 summary with their defaults
    and check what the schema cannot (failures <= n, per-node failures <= failures)."""
    out = dict(data)
    out.setdefault("hosts", [])
    out.setdefault("skipped", [])
    out.setdefault("date", None)
    out["provenance"] = {"results": None, "suites": [], "profile": None,
                         "profile_sha256": None, "milarun": [], "first": None,
                         **(data.get("provenance") or {})}
    tests = {}
    for gname, entry in data["tests"].items():
        n, failures = int(entry["n"]), int(entry.get("failures", 0))
        if failures > n:
            raise ResultFormatError(f"more failures ({failures}) than results ({n})",
                                    path=path, key=key_path(["tests", gname, "failures"]))
        # None: a summary written before runs were counted; 2.0 is an integer to the schema
        runs = None if entry.get("runs") is None else int(entry["runs"])
        rates = int((entry["train"] or {}).get("n") or 0)
        if runs is not None and runs > rates:
            # a run is counted only with a rate: more would hide the one-run note
            raise ResultFormatError(f"more runs with a rate ({runs}) than rates ({rates})",
                                    path=path, key=key_path(["tests", gname, "runs"]))
        runs = entry.get("runs")
        runs = None if runs is None else int(runs)   # JSON's 2.0 passes the schema as an integer
        rated = _stats(entry["train"])["n"]
        if runs is not None and runs > rated:
            raise ResultFormatError(
                f"more runs with a rate ({runs}) than rates ({rated})",
                path=path, key=key_path(["tests", gname, "runs"]))
        pernode_failures = {d: int(c) for d, c in (entry.get("pernode_failures") or {}).items()}
        if sum(pernode_failures.values()) > failures:
            raise ResultFormatError(
                f"more failures per node ({sum(pernode_failures.values())}) than failures "
                f"({failures})", path=path, key=key_path(["tests", gname, "pernode_failures"]))
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
            "pergpu_effective": {d: _stats(v)
                                 for d, v in (entry.get("pergpu_effective") or {}).items()},
            "adjusted": _stats(entry["adjusted"]) if entry.get("adjusted") else None,
            "overlap": entry.get("overlap"),
            "sync": dict(entry["sync"]) if entry.get("sync") else None,
            "validation_flags": list(entry.get("validation_flags") or []),
            "energy": entry.get("energy"),
            "anomalies": [dict(f) for f in entry.get("anomalies") or []],
        }
    out["tests"] = tests
    return out


def normalize_summary(data, path=None):
    """Check a summary (ours, any version, or the 2020 flat format), migrate it to
    the current version and return it with every optional field filled.

    Each version is checked against its schema (``milarun/formats/schemas/summary.schema.json``
    and its ``$defs/flat2020``) before its migration step runs.

    Raises:
        ResultFormatError: neither format, an unsupported version, or a
            malformed entry (one line naming the key).
    """
    version = summary_version(data, path)
    if version > SUMMARY_VERSION or (version < SUMMARY_VERSION and version not in _MIGRATIONS):
        raise ResultFormatError(f"summary format version {version} is not supported (expected "
                                f"{SUMMARY_VERSION})", path=path, key="version")
    while version < SUMMARY_VERSION:
        ref, step = _MIGRATIONS[version]
        check(data, ref, path=path)
        data = step(data)
        version = data["version"]
    check_summary(data, path=path)
    return _complete(data, path)


def read_summary(path):
    """Read a summary or baseline JSON file (either format, strictly).

    Raises:
        ResultFormatError: unreadable, not UTF-8, not JSON, neither format, or
            a malformed entry.
    """
    return normalize_summary(read_json(path), path=path)


def check_summary(summary, path=None):
    """Check a current-version summary against ``summary.schema.json``; return it.

    Raises:
        ResultFormatError: one line naming the key.
    """
    return check(summary, "summary", path=path)


def write_summary(summary, out):
    """Check ``summary`` (:func:`check_summary`) and write it to ``out`` atomically
    (a ``.json`` path).

    Raises:
        ResultFormatError: the summary breaks its own schema (a bug).
    """
    check_summary(summary, path=out)
    return write_json_atomic(out, summary)
