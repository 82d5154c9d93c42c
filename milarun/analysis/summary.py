"""Results → summary: results grouped by test, with steady-state statistics.

Writes the summary file of :mod:`milarun.formats.summary` (its format, field by field,
is described there); what each field holds:

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

``perrun`` holds, per run index (a repeat of ``--repeat``; a ``--resume`` rerun of a
failed launch keeps its run's index), the steady-state rates of that run's devices;
``perrun_effective`` the same of the effective throughputs, in tests with concurrent
waves only: ``milarun report --repeat-score`` takes each run's figure from them.

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

``soak`` (:func:`milarun.analysis.soak.soak_figures`) is present in the groups whose
successful records carry soak figures (the training tests' soak mode: one rank killed,
the job restarted from its last checkpoint): the medians of the time of a checkpoint
save and load, of the restart, of the work lost and of the run's effective training time
ratio; an optional addition to version 1 as well.

``pernode``, ``pernode_failures``, ``failed[].node``, ``node_count``,
``gpus_per_node``, the concurrent-wave fields, ``anomalies`` and ``provenance``
were added without changing the version: they are optional, a summary without
them is still version 1 and reads as before (``pernode``, ``pernode_failures``
and ``anomalies`` are then empty, ``failed[].node`` is null).

Validation (:mod:`milarun.measure.plausibility`): every record goes through
:func:`milarun.measure.plausibility.judge` first, so a successful record with a NaN
loss or no steady state counts as a failure (``nan-loss``,
``no-steady-state``) whenever it was written. ``validation_flags`` lists the
flags of the group's successful results (GPU load or memory below the job's
threshold, host busy outside the suite, steal time), with the thresholds of
the job's ``validation`` block, then the GPU health flags of all its records
(``gpu-health-error``, ``gpu-health-warning``: :func:`milarun.measure.flags.health_flags`
of a record's ``health``). ``energy`` is the power and energy per item
over the steady states (:mod:`milarun.measure.energy`), present only when GPU energy
or power readings cover them. ``hosts`` entries also carry the facts of
:mod:`milarun.host.facts` that the results recorded (milarun version and
commit, kernel, CPU governor and boost, GPU power limits, clocks,
persistence and ECC; ``student_cpus``, ``memory_limit_mib`` and
``cgroup_cpu_quota``: the tightest student limits seen). These are optional
additions to version 1 as well.
"""

import datetime
import gc
import re
import sys
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from ..errors import ResultFormatError, SetupError
from ..formats.jsonfile import first_error, parse_json
from ..formats.record import accepted, migrate
from ..formats.store import result_files
from ..formats.summary import SUMMARY_FORMAT, SUMMARY_VERSION
from ..formats.terminal import one_line
from ..host import facts as hostfacts
from ..launcher.session import read_session
from ..measure import anomalies, energy, plausibility, stats, throughput
from ..measure import flags as flagmodel
from ..measure.stats import finite
from ..plan import types as plantypes
from .acceptance import acceptance_figures
from .convergence import loss_curves
from .llm import llm_figures, server_figures
from .soak import soak_figures

#: Characters of stderr tail kept per failure in a summary.
TAIL_CHARS = 4000


def group_name(record):
    """Return the summary group of a result (the plan type's rule, :mod:`milarun.plan.types`):
    ``suite.job``, ``suite.job.<device_count>`` or ``suite.job.<nodes>x<gpus>``."""
    return plantypes.group_name(record)


def successful_records(records, group):
    """``[(path, record)]`` of the successful records of ``group`` among ``{path:
    record}``, sorted by path; a record too malformed to name its group is left out."""
    out = []
    for path, rec in sorted(records.items()):
        try:
            if rec.get("success") and group_name(rec) == group:
                out.append((path, rec))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return out


def load_results(directory, warn=None, only=None, files=None):
    """Read every result under ``directory`` (see :func:`milarun.formats.store.iter_results`),
    or, with ``only`` (a set of POSIX paths relative to ``directory``: a bundle's chained
    records), those only; the others are skipped, each named. ``files``: what
    :func:`milarun.formats.store.result_files` gave for ``directory``, when it was read
    before (the bytes are parsed, not read again).

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
        for path, raw in result_files(directory) if files is None else files:
            if only is not None and path.relative_to(directory).as_posix() not in only:
                raw = ResultFormatError(
                    "not in the bundle's manifest chain; not counted", path=path
                )
            if isinstance(raw, Exception):
                skipped.append((path, raw))
                continue
            try:
                records.append((path, _read_record(path, raw)))
            except ResultFormatError as exc:
                skipped.append((path, exc))
    finally:
        if collecting:
            gc.enable()
    if warn is not None and skipped:
        warn_skipped(skipped, warn)
    if not records:
        raise ResultFormatError(
            f"no usable result in {directory}"
            + (f" ({len(skipped)} file(s) skipped)" if skipped else "")
        )
    return records, skipped


def _read_record(path, raw):
    """The record of one file's bytes ``raw``: parsed strictly, checked against the
    schema once, migrated when the schema does not accept it (an older version).

    Raises:
        ResultFormatError: not JSON, or refused by the schema or the migration (the
            reason named).
    """
    doc = parse_json(raw, path=path, error_cls=ResultFormatError)
    return doc if accepted(doc) else migrate(doc, path=path, parsed=True)


def warn_skipped(skipped, stream=None):
    """Write one warning line per skipped file: ``milarun: warning: skipped <file>: <key>:
    <message>`` (control characters of a file name or message, newlines included,
    shown escaped: :func:`milarun.formats.terminal.one_line`)."""
    stream = stream or sys.stderr
    for path, exc in skipped:
        print(one_line(f"milarun: warning: skipped {exc if str(exc) else path}"), file=stream)


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
    return {
        g.get("index", i): g.get("name")
        for i, g in enumerate(host.get("gpus") or [])
        if isinstance(g, dict)
    }


def summarize(records, skipped=(), warn=None):
    """Group result records by test and compute their statistics.

    ``records`` are result dicts or ``(path, record)`` pairs (as from
    :func:`load_results`). A record whose samples are malformed (a sample that
    ends before it starts, a steady-state rate outside
    :func:`milarun.measure.stats.check_rate`'s range) is moved to ``skipped``, with one
    warning line on ``warn`` when given. Returns the summary dict described in
    the module docstring.
    """
    return summarize_with(records, skipped, warn)[0]


#: What makes :func:`judge_result` refuse a record (it is then skipped, named).
_MALFORMED = (ValueError, KeyError, TypeError, AttributeError)


@dataclass
class Result:
    """One result record as the summary judged it.

    ``path``: its file (None for a record given without one). ``record``: the record
    as read. ``steady``: ``(rate items/s or None, chosen samples, note)`` of
    :func:`milarun.measure.stats.steady_state` of its samples, computed once here and
    passed to every reader. ``judged``: the record with its validation verdict
    (:func:`milarun.measure.plausibility.judge`: the record itself when it passes, a
    failed copy when not). ``error``: why the record is refused (malformed samples),
    or None; ``steady`` and ``judged`` are then None.
    """

    path: object
    record: dict
    steady: tuple | None = None
    judged: Mapping[str, Any] | None = None
    error: str | None = None

    @cached_property
    def flags(self):
        """The anomaly flags of the judged record
        (:func:`milarun.measure.anomalies.result_flags`); only of a readable record."""
        assert self.judged is not None and self.steady is not None
        return anomalies.result_flags(self.judged, self.steady[:2])

    @cached_property
    def record_flags(self):
        """The anomaly flags of the record as read (those of :attr:`flags` when the
        verdict left it as it was; a refused record's are computed from its samples)."""
        if self.judged is self.record:
            return self.flags
        return anomalies.result_flags(self.record, None if self.steady is None else self.steady[:2])


def judge_result(path, record):
    """The :class:`Result` of one record: its steady state and validation verdict, or
    the reason it is refused (``error``: a malformed sample, as
    :func:`milarun.measure.stats.steady_state` raises it)."""
    try:
        try:
            steady = stats.steady_state(record["timings"].get("train", {}).get("samples", []))
        except _MALFORMED:
            plausibility.judge(record)  # what judging raises first is the reason given
            raise
        return Result(path, record, steady, plausibility.judge(record, steady))
    except _MALFORMED as exc:
        return Result(path, record, error=str(exc) or type(exc).__name__)


def summarize_with(records, skipped=(), warn=None, extra=None):
    """:func:`summarize`, and ``extra(group, results)`` for every group.

    Each record is judged once (:func:`judge_result`: its steady state and verdict),
    and every step reads that. ``extra`` receives a group's :class:`Result` list, in
    the records' order, refused ones included (the report's throughput plot). The
    warnings come out in the records' order; a group's error is raised after them,
    the first test in sorted order first.

    Returns:
        ``(summary, {group: extra's value})``; the dict is empty without ``extra``.
    """
    results = [
        judge_result(*(item if isinstance(item, tuple) else (None, item))) for item in records
    ]
    groups = defaultdict(list)  # group: its results, in the records' order
    unnamed = {}  # index: the error of a record whose group is unknown
    for i, res in enumerate(results):
        try:
            groups[group_name(res.record)].append(res)
        except Exception as exc:  # raised below, unless the record is refused
            unnamed[i] = exc
    summary = _summary_document(results, unnamed, skipped, warn)
    names = sorted(groups)  # a name of another type raises here
    for name in names:
        kept = [res for res in groups[name] if res.error is None]
        if kept:
            summary["tests"][name] = _summarize_group(name, kept)
    return summary, ({name: extra(name, groups[name]) for name in names} if extra else {})


def _summary_document(results, unnamed, skipped, warn):
    """The summary without its tests: the hosts, the skipped files and the provenance
    of ``results`` (each refused one warned about on ``warn``, in order).

    Raises:
        what a record's group name raised (``unnamed``: ``{index: error}``), at the
        first such record that is not refused.
    """
    hosts: dict = {}
    seen_hosts: dict = {}
    skipped_names = [Path(p).name for p, _ in skipped]
    last_end = first_start = None
    suites, versions = set(), set()
    for i, res in enumerate(results):
        path, rec = res.path, res.record
        if res.error is not None:
            skipped_names.append(Path(path).name if path else rec.get("name", "?"))
            if warn is not None:
                warn_skipped([(path, ResultFormatError(res.error, path=path))], warn)
            continue
        if i in unnamed:
            raise unnamed[i]
        host = rec.get("host") or {}
        if isinstance(host, dict) and host.get("cpu_model"):
            _fold_host(hosts, seen_hosts, host)
        program = rec["timings"].get("program") or {}
        if finite(program.get("end")):
            last_end = program["end"] if last_end is None else max(last_end, program["end"])
        if finite(program.get("start")):
            first_start = (
                program["start"] if first_start is None else min(first_start, program["start"])
            )
        if isinstance(rec.get("suite"), str):
            suites.add(rec["suite"])
        if isinstance(host, dict) and isinstance(host.get("milarun_version"), str):
            versions.add(_version_of(host))
    return {
        "format": SUMMARY_FORMAT,
        "version": SUMMARY_VERSION,
        "date": _iso(last_end),
        "steady_state": {"window_s": stats.STEADY_WINDOW_S, "tail_s": stats.STEADY_TAIL_S},
        "hosts": [
            {
                **{k: v for k, v in h.items() if not k.startswith("_")},
                "gpus": [h["_gpus"][i] for i in sorted(h["_gpus"])],
                **hostfacts.collapse(h),
            }
            for h in hosts.values()
        ],
        "skipped": sorted(skipped_names),
        "tests": {},
        "provenance": {
            "results": None,
            "suites": sorted(suites),
            "profile": None,
            "profile_sha256": None,
            "milarun": sorted(versions),
            "first": _iso(first_start),
        },
    }


def _version_of(host):
    """The milarun that wrote a record: ``version`` or ``version (commit abc…[, modified])``."""
    commit = host.get("milarun_commit")
    if not (isinstance(commit, str) and commit):
        return host["milarun_version"]
    dirty = ", modified" if host.get("milarun_dirty") else ""
    return f"{host['milarun_version']} (commit {commit[:12]}{dirty})"


def _fold_host(hosts, seen, host):
    """Fold one result's ``host`` into ``hosts`` (its entry by host facts), unless the
    last host folded into that entry had the same content: folding it again right
    after itself changes nothing (the eight children of a node repeat theirs), but
    after another one it does (the GPU names and facts of the last one win).
    ``seen``: ``{repr(host): entry key}``, and ``(entry key, None): last repr``. Equal
    ``repr`` means equal content for parsed JSON (1 and 1.0, True and 1 differ)."""
    text = repr(host)
    key = seen.get(text)
    if key is None:
        facts = _host_facts(host)
        key = seen[text] = repr(sorted(facts.items()))
        hosts.setdefault(key, {**facts, "_gpus": {}})
    if seen.get((key, None)) == text:
        return
    seen[(key, None)] = text
    entry = hosts[key]
    entry["_gpus"].update(_host_gpus(host))
    hostfacts.accumulate(entry, host)


def _iso(stamp):
    """Unix time → ISO-8601 UTC to the second, or None."""
    if stamp is None:
        return None
    return datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).isoformat(
        timespec="seconds"
    )


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


def _summarize_group(gname, results):
    """The summary of one test (its entry in ``tests``) from its :class:`Result` list
    (the records that were not refused)."""
    first = results[0].judged
    rates, durations, memory = [], [], []
    pergpu = defaultdict(list)
    scored = []  # successful results with a rate: the concurrent waves' members
    pernode = defaultdict(list)
    pernode_failures: defaultdict = defaultdict(int)
    reasons: defaultdict = defaultdict(int)
    failed = []
    interrupted = 0
    steady = {stats.FULL: 0, stats.SHORT: 0, stats.NONE: 0}
    flags, rated = [], []
    for res in sorted(
        results,
        key=lambda res: (
            device_key(res.judged.get("device", "")),
            res.judged.get("run", 0) if isinstance(res.judged.get("run"), int) else 0,
        ),
    ):
        path, rec, (rate, _, note) = res.path, res.judged, res.steady
        mem = rec.get("peak_memory_mib")
        if finite(mem):
            memory.append(float(mem))
        where = _flag_where(path, rec)
        if where is not None:
            flags += [f.at(**where) for f in res.flags]
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
            failed.append(
                {
                    "device": str(rec.get("device", "")),
                    "node": node,
                    "run": rec.get("run"),
                    "reason": reason,
                    "message": err.get("message"),
                    "returncode": err.get("returncode"),
                    "stderr_tail": _tail(err.get("stderr_tail")),
                    "file": Path(path).name if path else None,
                }
            )
            continue
        steady[note] += 1
        duration = (rec["timings"].get("program") or {}).get("duration")
        if finite(duration):
            durations.append(float(duration))
        if rate is not None:
            rates.append(rate)
            scored.append(res)
            rated.append((path, rec, rate))
            pergpu[str(rec.get("device", ""))].append(rate)
            node = node_of(rec)
            if node is not None:
                pernode[node].append(rate)
    waves = throughput.summarize_waves(
        [res.judged for res in scored], steady=[res.steady for res in scored]
    )
    outliers = anomalies.group_flags(
        [(rec.get("device", ""), rec.get("run"), rate) for _, rec, rate in rated]
    )
    for index, flag in outliers:
        path, rec, _ = rated[index]
        flags.append(flag.at(**(_flag_where(path, rec) or {})))
    # the summary's shape of a flag (spans are left out: the plots recompute them)
    flags = [flagmodel.to_summary(f.without("spans")) for f in flags]
    plan_type = first.get("partition", "normal")  # the plan type, "partition" on disk
    # the group holds one shape of the study: its records all say it (a multi-node
    # job's too: the node score divides its rate by its node count)
    shape = (
        cast(plantypes.NodeProgression, plantypes.TYPES["node-progression"]).shape(first)
        if plan_type in ("node-progression", "multi-node")
        else None
    )
    return {
        "name": first["name"],
        "group": gname,
        "partition": plan_type,
        "device_count": first.get("device_count"),
        **({"node_count": shape[0], "gpus_per_node": shape[1]} if shape else {}),
        "n": len(results) - interrupted,
        "failures": len(failed),
        "runs": len(
            {
                res.judged.get("run") if isinstance(res.judged.get("run"), int) else 0
                for res in scored
            }
        ),
        "interrupted": interrupted,
        "failure_reasons": dict(sorted(reasons.items())),
        "failed": failed,
        "train": stats.describe(rates),
        "total": stats.describe(durations),
        "pergpu": {dev: stats.describe(pergpu[dev]) for dev in sorted(pergpu, key=device_key)},
        "pernode": {node: stats.describe(pernode[node]) for node in sorted(pernode, key=node_key)},
        "pernode_failures": {
            node: pernode_failures[node] for node in sorted(pernode_failures, key=node_key)
        },
        "peak_memory": max(memory) if memory else None,
        "steady": steady,
        **waves,
        **_perrun(scored, waves),
        "anomalies": flags,
        **_checks(results),
        **(
            {"llm": llm} if (llm := llm_figures([res.judged for res in scored])) is not None else {}
        ),
        **(
            {"server": server}
            if (server := server_figures([res.judged for res in scored])) is not None
            else {}
        ),
        **(
            {"soak": soak}
            if (soak := soak_figures([res.judged for res in results if res.judged["success"]]))
            is not None
            else {}
        ),
        **(
            {"acceptance": acc}
            if (acc := acceptance_figures([res.judged for res in results], node_of)) is not None
            else {}
        ),
        **({"tags": tags} if (tags := _tags(results)) is not None else {}),
        **(
            {"convergence": curves}
            if (curves := loss_curves([res.judged for res in scored])) is not None
            else {}
        ),
    }


def _run_of(rec):
    """A record's run index (0 when it has none, as ``runs`` counts it)."""
    run = rec.get("run")
    return run if isinstance(run, int) else 0


def _perrun(scored, waves):
    """``perrun``: ``{run: stats}`` of each run's steady-state rates (items/s) over its
    devices, and, when the test has concurrent waves, ``perrun_effective``: the same of
    each run's effective throughputs (:func:`milarun.measure.throughput.summarize_waves`
    over that run's results alone: a wave is one run's processes). The report's repeat
    aggregates (``milarun report --repeat-score``) take each run's mean from these."""
    byrun = defaultdict(list)
    for res in scored:
        byrun[_run_of(res.judged)].append(res)
    out = {
        "perrun": {
            str(run): stats.describe(res.steady[0] for res in byrun[run]) for run in sorted(byrun)
        }
    }
    if waves.get("effective"):
        if len(byrun) == 1:
            out["perrun_effective"] = {str(run): waves["effective"] for run in byrun}
        else:
            out["perrun_effective"] = {}
            for run in sorted(byrun):
                eff = throughput.summarize_waves(
                    [res.judged for res in byrun[run]], steady=[res.steady for res in byrun[run]]
                ).get("effective")
                if eff and eff.get("n"):
                    out["perrun_effective"][str(run)] = eff
    return out


def _tags(results):
    """The profile tags of a group's records (each record's ``tags``, else its job
    definition's ``tags``), in the order first seen, without repeats; None when no
    record has any (records written before the tags were kept: the summary then has
    no ``tags``, as before)."""
    out, seen = [], False
    for res in results:
        rec = res.judged
        job = rec.get("job") if isinstance(rec.get("job"), dict) else {}
        tags = rec.get("tags") if rec.get("tags") is not None else job.get("tags")
        if not isinstance(tags, list):
            continue
        seen = True
        out += [t for t in tags if isinstance(t, str) and _TAG.fullmatch(t) and t not in out]
    return out[:64] if seen else None


#: A tag as the profile schema allows it (a record's other strings are left out).
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")


def _checks(results):
    """The validation flags and the energy of a group (:mod:`milarun.measure.plausibility`,
    :mod:`milarun.measure.energy`), each only when there is one."""
    items = [(res.path, res.judged, res.steady) for res in results]
    out: dict[str, Any] = {}
    flags = plausibility.summary_flags(items, node_of)
    flags += _health_flags(results)
    if flags:
        out["validation_flags"] = [flagmodel.to_summary(f) for f in flags]
    power = energy.summarize_energy(items, node_of)
    if power is not None:
        out["energy"] = power
    return out


def _health_flags(results):
    """The GPU health flags of a group (:func:`milarun.measure.flags.health_flags`) of
    every record, passed or failed (a GPU fault may be why it failed), each at its
    ``device``, ``node``, ``run`` and ``file``."""
    out = []
    for res in results:
        rec = res.record
        for f in flagmodel.health_flags(rec):
            out.append(
                f.at(
                    device=str(rec.get("device", "")),
                    node=node_of(rec),
                    run=rec.get("run"),
                    file=Path(res.path).name if res.path else None,
                )
            )
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


def summarize_dir(directory, warn=None, only=None):
    """Load ``directory`` (``only``: as :func:`load_results`) and summarize it. Returns
    ``(summary, records)``, the summary with its :func:`provenance`."""
    records, skipped = load_results(directory, warn=warn, only=only)
    summary = summarize(records, skipped, warn=warn)
    return provenance(summary, directory), records


def provenance(summary, directory):
    """Name in ``summary``'s ``provenance`` (changed in place and returned) the results
    folder ``directory`` and the profile its ``.milarun/session.json`` was started
    with (when it has a readable one)."""
    prov = summary["provenance"]
    prov["results"] = Path(directory).resolve().name
    try:
        invocation = (read_session(directory) or {}).get("invocation") or {}
    except SetupError:
        invocation = {}
    for key in ("profile", "profile_sha256"):
        if isinstance(invocation.get(key), str):
            prov[key] = invocation[key]
    return summary
