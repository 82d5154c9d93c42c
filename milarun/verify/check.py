"""``milarun verify``: a vendor's results bundle checked clause by clause.

:func:`verify_bundle` reads a results folder (``OUTDIR``) as data, through the strict
bounded readers, and returns a :class:`~milarun.verify.verdict.Verdict`. One function per
section adds its clauses (names ``"<section>.<what>"``, stable: tests and tender rules
use them; docs/tender.md lists them):

* **integrity** (:func:`check_integrity`): the manifest (``.milarun/manifest.jsonl``) is
  readable and its hash chain unbroken (:func:`milarun.formats.manifest.check_chain`);
  every file's last entry matches the file on disk (SHA-256, size); no result-like
  ``*.json`` lies outside the chain (:func:`milarun.formats.store.iter_results` finds
  them); the sealed ``bundle.json`` names the chain's head, entry count and sessions;
  the head is ``--expect-head``; the signature ``bundle.json.sig`` is valid under
  ``--public-key`` (and present when the rules require it).
* **completeness** (:func:`check_completeness`): every launch of every session's plan
  (``.milarun/plan-<session>.json``, entered in the chain) has exactly one outcome (a
  record, or an ``unwritten`` event) unless a later ``--resume`` session reran a launch
  whose earlier outcome failed; no outcome that no plan names; each record's name, run
  and device are its chain entry's launch; the profile copies hash to the session's
  ``profile_sha256`` (the rule of :func:`milarun.launcher.session.digest_of_contents`) and
  the plans hold the profile's selected jobs, every repeat.
* **compliance** (:func:`check_compliance`): every override is listed in
  ``Verdict.overrides`` (``--`` arguments, ``--timeout``, ``--no-cgexec``,
  ``--cpu-slots``, ``--name``/``--select``, a record run with other arguments than its
  plan); with rules, each is a failed clause unless ``allowed_overrides`` names it; the
  profile and weights SHA-256, the repeats, the milarun version range and the dataset
  preset of the prepare commands are judged, and the host prescreen findings the rules
  make fatal (``prescreen.fatal``: recorded and ok on every node of every session).
* **consistency** (:func:`check_consistency`): from the raw samples of every record:
  each sample's rate is its count over its duration, samples are ordered, do not
  overlap and lie inside the program's start and end; counts agree with ``max_count``
  and ``min_steady``; every statistic is recomputed
  (:func:`milarun.analysis.summary.summarize`, never a summary the vendor sent); records
  lie inside their session's time in the manifest; a concurrent wave's barrier
  releases agree; GPU energy counters never go back and agree with the power readings;
  the host facts (hostname, CPU model, memory, GPU UUIDs and serials) are the same in
  every record of one node and equal the session's hardware identity where recorded;
  each record's configuration (kernel, CPU governor, per GPU power limit, application
  clocks, ECC, persistence, driver) is its node's identity's ``config`` where both hold it.
* **performance** (:func:`check_performance`, rules only): per test group, the lower
  bound of the confidence interval of the mean steady-state throughput
  (:func:`milarun.measure.confidence.mean_interval`) against ``min_throughput``; the
  failure rate; the node-to-node spread of the per-node means; the mean power of each
  node (:mod:`milarun.measure.energy`); the GPU health errors during the launches
  (``max_gpu_health_errors``, :mod:`milarun.host.health`); the fleet view (``fleet``:
  each node against the fleet's median and MAD, the nodes to send back,
  :mod:`milarun.analysis.fleet`); the acceptance thresholds
  (:func:`milarun.analysis.acceptance.verdict`); the ``serving`` rules of server-scenario
  tests (:func:`check_serving`: every load level recomputed from its raw request timings
  at the rules' latency targets); the ``convergence`` rules (every judged test's loss
  against the step compared with the buyer's reference: :mod:`milarun.verify.convergence`).

Bad input from the buyer (an unreadable rules file, convergence reference or public key,
a malformed ``--expect-head``, a folder that does not exist) raises :class:`MilarunError`;
everything wrong inside the bundle is a failed clause.
"""

import datetime
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeGuard

from ..analysis.acceptance import fabric_figures
from ..analysis.acceptance import verdict as acceptance_verdict
from ..analysis.fleet import DEFAULT_K as FLEET_K
from ..analysis.fleet import DEFAULT_MIN_NODES as FLEET_MIN_NODES
from ..analysis.fleet import DEFAULT_MIN_RELATIVE as FLEET_MIN_RELATIVE
from ..analysis.fleet import fleet_view
from ..analysis.summary import group_name, node_of, successful_records, summarize
from ..errors import MilarunError
from ..formats.bundle import bundle_path, read_bundle, signature_path
from ..formats.jsonfile import read_bytes, read_json
from ..formats.manifest import (
    EVENTS,
    check_chain,
    file_digest,
    head_of,
    manifest_path,
    read_manifest,
    relative,
)
from ..formats.rules import read_rules
from ..formats.store import iter_results, load_result
from ..formats.summary import SUMMARY_FORMAT
from ..host.prescreen import fatal_problems, findings_of
from ..launcher.chain import PLAN_FORMAT
from ..launcher.session import SESSION_ID_FORMAT, digest_of_contents, read_session
from ..measure import fabric
from ..measure.capacity import capacity_of
from ..measure.confidence import LEVEL, mean_interval
from ..measure.latency import level_figures
from ..measure.stats import steady_state
from ..profile.language import load_profile
from .convergence import check_convergence, load_reference
from .keys import check_signature, load_public
from .seal import WEIGHTS_COPY, SealError, merged_identity, read_weights
from .verdict import Verdict

#: Most failed clauses of one name listed one by one (the rest in one more clause).
MAX_LISTED = 50
#: Largest plan or profile copy read (bytes).
MAX_META_BYTES = 64 * 2**20
#: Seconds two clocks of one host may disagree (the child's samples, the launcher's
#: manifest times, barrier releases): a looser bound would let a moved record pass.
CLOCK_TOLERANCE_S = 2.0
#: Seconds a sample may overlap the one before it (the logger closes one window and
#: opens the next from two reads of the clock).
OVERLAP_TOLERANCE_S = 1e-3
#: Relative tolerance of a sample's rate against its count over its duration (the
#: record holds both, rounded by JSON's shortest repr: far below this).
RATE_TOLERANCE = 1e-6
#: Seconds between a session's id (its start time, made when the session opens) and its
#: first manifest entry (written right after, launcher/suite.py).
SESSION_START_S = 60.0
#: Seconds the barrier releases of one wave may spread (one server sends them all).
BARRIER_SPREAD_S = 1.0
#: Bounds of a GPU's energy counter's mean power over its mean power readings
#: (NVML's counter and power readings agree within a few percent).
ENERGY_POWER_RATIO = (0.5, 2.0)
#: Override kinds (``allowed_overrides`` of the rules), with their meaning.
OVERRIDES = {
    "extra_args": "arguments after -- appended to every test",
    "timeout": "--timeout replaced the profile's timeouts",
    "no_cgexec": "--no-cgexec: no student cgroups (cgroups off)",
    "cpu_slots": "--cpu-slots: CPU slots instead of the GPUs",
    "names": "--name/--select: only some of the profile's tests",
    "argv": "a record ran with other arguments than its plan",
}
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class Bundle:
    """What :func:`verify_bundle` read from a results folder (filled section by section).

    Attributes:
        outdir: the folder (``Path``).
        entries: the manifest's entries, or None when unreadable.
        last: ``{path: last file entry}``.
        records: ``{path: record dict}`` of the record entries whose file could be read.
        session: the session file's content, or None.
        plans: ``{session id: plan dict}``.
        bundle: ``bundle.json``'s content, or None.
    """

    def __init__(self, outdir):
        self.outdir = Path(outdir)
        self.entries = None
        self.last = {}
        self.records = {}
        self.session = None
        self.plans = {}
        self.bundle = None
        self.jobs = None  # {test name: Job} of the recorded profile, when re-read
        self.summary = None  # the statistics recomputed from the records

    @property
    def session_ids(self):
        """Session ids in the order the manifest first names them."""
        return list(dict.fromkeys(e["session"] for e in self.entries or []))

    def plan_launches(self):
        """``{(name, run, device): [(session, launch)]}`` over every session's plan."""
        out = defaultdict(list)
        for sid, plan in self.plans.items():
            for lch in _list(plan.get("launches")):
                if isinstance(lch, dict):
                    out[launch_key(lch)].append((sid, lch))
        return out


def _scalar(x):
    """``x`` when a string or an integer, else its short ``repr`` (hashable, shown as is):
    a plan or a manifest from elsewhere may hold anything."""
    if isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool)):
        return x
    return repr(x)[:100]


def _list(x):
    """``x`` when a list, else an empty one."""
    return x if isinstance(x, list) else []


def launch_key(d):
    """``(name, run, device)`` of a plan launch, a chain entry's ``launch`` or a record
    (the device as text)."""
    return (_scalar(d.get("name")), _scalar(d.get("run")), str(_scalar(d.get("device"))))


def _show_key(key):
    return f"{key[0]} run {key[1]} device {key[2]}"


def _report(v, section, name, problems, ok_detail):
    """Add one failed clause per ``(detail, paths)`` problem (at most :data:`MAX_LISTED`,
    then one for the rest), or one passing clause with ``ok_detail``."""
    if not problems:
        v.add(section, name, True, ok_detail)
        return
    for detail, paths in problems[:MAX_LISTED]:
        v.add(section, name, False, detail, paths)
    if len(problems) > MAX_LISTED:
        v.add(section, name, False, f"... and {len(problems) - MAX_LISTED} more")


def verify_bundle(outdir, rules=None, expect_head=None, public_key=None):
    """Check the results bundle ``outdir`` clause by clause (module docstring).

    Args:
        outdir: the results folder (a vendor's bundle).
        rules: path of a tender rules file (``formats/rules.py``), or None: without
            rules, compliance only lists overrides and performance is not judged.
        expect_head: the chain head (64 hex digits) the vendor sent when the run
            ended, or None.
        public_key: path of the vendor's Ed25519 public key (PEM), or None.

    Returns:
        :class:`~milarun.verify.verdict.Verdict`; ``exit_code`` 0 when every clause held.

    Raises:
        MilarunError: bad input from the buyer: an unreadable or invalid rules file or
            public key, a malformed ``expect_head``, ``outdir`` not a folder.
    """
    rules_path = rules
    rules = read_rules(rules) if rules is not None else None
    # the buyer's reference: one that cannot be used is exit 2 before anything is judged
    reference = (
        load_reference(rules["convergence"], rules_path)
        if rules and rules.get("convergence")
        else None
    )
    if public_key is not None:
        load_public(public_key)  # the buyer's key: a bad one is exit 2, not a clause
    if expect_head is not None and not _HEX64.match(str(expect_head).strip().lower()):
        raise MilarunError(f"--expect-head must be 64 hex digits, not {str(expect_head)[:80]!r}")
    outdir = Path(outdir)
    if not outdir.is_dir():
        raise MilarunError("not a results folder", path=outdir)
    v = Verdict(bundle=str(outdir), pinned=expect_head is not None, signed=public_key is not None)
    b = Bundle(outdir)
    steps = [
        (
            "integrity",
            lambda: check_integrity(
                b, v, expect_head=expect_head, public_key=public_key, rules=rules
            ),
        ),
        ("completeness", lambda: check_completeness(b, v)),
        ("compliance", lambda: check_compliance(b, v, rules)),
        ("consistency", lambda: check_consistency(b, v)),
    ]
    if rules is not None:
        steps.append(("performance", lambda: check_performance(b, v, rules, reference)))
    for section, step in steps:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 -- a bundle's content is never a traceback
            v.add(
                section,
                f"{section}.error",
                False,
                f"the bundle could not be checked further ({type(exc).__name__}: {str(exc)[:300]})",
            )
    return v


# --- integrity ----------------------------------------------------------------------------


def check_integrity(b, v, expect_head=None, public_key=None, rules=None):
    """The integrity clauses; fills ``b.entries``, ``b.last``, ``b.records``, ``b.bundle``."""
    mpath = manifest_path(b.outdir)
    try:
        b.entries = read_manifest(mpath)
    except MilarunError as exc:
        v.add("integrity", "integrity.manifest", False, str(exc), [".milarun/manifest.jsonl"])
        return
    if not b.entries:
        v.add(
            "integrity",
            "integrity.manifest",
            False,
            "the manifest is empty",
            [".milarun/manifest.jsonl"],
        )
        b.entries = None
        return
    v.head = head_of(b.entries)
    v.add("integrity", "integrity.manifest", True, f"{len(b.entries)} entries, head {v.head}")
    problems = check_chain(b.entries)
    v.add(
        "integrity",
        "integrity.chain",
        not problems,
        (
            f"{problems[0]}"
            + (f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else "")
        )
        if problems
        else "the hash chain is unbroken",
    )

    for e in b.entries:
        if e["kind"] not in EVENTS:
            b.last[e["path"]] = e
    missing, changed, absent = [], [], set()
    for path, e in b.last.items():
        target = b.outdir / path
        try:  # a folder on the way may be a link: nothing outside the bundle is read
            relative(b.outdir, target)
        except (ValueError, OSError):
            changed.append(
                (f"{path}: reached through a symbolic link to outside the folder; not read", [path])
            )
            absent.add(path)
            continue
        if not target.exists() and not target.is_symlink():
            missing.append((f"{path}: in the manifest ({e['kind']}), not in the folder", [path]))
            absent.add(path)
            continue
        try:
            sha, size = file_digest(target)
        except (OSError, MilarunError) as exc:
            changed.append((f"{path}: cannot be hashed ({exc})", [path]))
            continue
        if (sha, size) != (e["sha256"], e["bytes"]):
            changed.append(
                (
                    f"{path}: SHA-256 {sha[:16]}… ({size} bytes) differs from its "
                    f"manifest entry {e['sha256'][:16]}… ({e['bytes']} bytes)",
                    [path],
                )
            )
    _report(
        v,
        "integrity",
        "integrity.file-missing",
        missing,
        f"every one of the {len(b.last)} files of the chain is present",
    )
    _report(
        v,
        "integrity",
        "integrity.file-changed",
        changed,
        "every file matches its last manifest entry",
    )

    chained = set(b.last)
    outside: list = []
    found: dict[str, Any] = {}
    for path, rec in iter_results(b.outdir):
        rel = path.relative_to(b.outdir).as_posix()
        found[rel] = rec
        if rel in chained or rel == bundle_path(".").name or _not_result_like(path, rec):
            continue
        what = "a result record" if isinstance(rec, dict) else f"a JSON file ({rec})"
        outside.append((f"{rel}: {what} outside the manifest's chain: not counted", [rel]))
    _report(
        v, "integrity", "integrity.unchained-file", outside, "no result-like file outside the chain"
    )

    # every path a record entry names is read as a record, whatever entry came last: an
    # entry of another kind appended for it must not take it out of the checks
    record_paths = dict.fromkeys(e["path"] for e in b.entries if e["kind"] == "record")
    for path in record_paths:
        if path not in absent:
            try:  # read once: iter_results loaded the records it found
                record = found.get(path)
                if record is None:
                    record = load_result(b.outdir / path)
                elif isinstance(record, Exception):
                    raise record
                b.records[path] = record
            except MilarunError as exc:
                v.add("integrity", "integrity.record", False, f"unreadable record: {exc}", [path])

    _shape_clauses(b, v)
    _bundle_clauses(b, v, expect_head, public_key, rules)


def after_head_problems(entries):
    """What follows a session's end in manifest ``entries`` besides the seal's one entry:
    ``[line]``, empty when the chain has the shape ``milarun jobs`` and ``milarun seal``
    write (:mod:`milarun.launcher.chain`: a session's ``end`` is its last entry;
    :mod:`milarun.verify.seal`: at most one ``weights`` entry, at :data:`WEIGHTS_COPY`;
    a ``--resume`` after sealing puts it before the new session's entries). An entry
    appended after a head names a file whose content the checks would otherwise take
    from that entry."""
    problems: list = []
    ended: dict[str, Any] = {}
    copies = 0
    for e in entries:
        what = f"manifest entry {e['seq']} ({e['kind']}" + (
            f" {e['path']})" if e.get("path") else ")"
        )
        if e["kind"] == "weights":
            copies += 1
            if e["path"] != WEIGHTS_COPY:
                problems.append(f"{what}: the seal enters only its weights copy, {WEIGHTS_COPY}")
            elif copies > 1:
                problems.append(f"{what}: a second weights entry; the seal enters one")
            continue
        if e["session"] in ended:
            problems.append(
                f"{what}: after the end of its session {e['session']} (entry "
                f"{ended[e['session']]}); only the seal's weights copy may follow"
            )
        if e["kind"] == "end":
            ended.setdefault(e["session"], e["seq"])
    return problems


def entry_kind_problems(entries):
    """``[line]`` for each file entered under more than one kind (a record entered again
    as the weights copy, the session file as a log): each file has one kind."""
    kinds: defaultdict[str, dict] = defaultdict(dict)
    for e in entries:
        if e["kind"] not in EVENTS:
            kinds[e["path"]].setdefault(e["kind"], e["seq"])
    return [
        f"{path}: entered as " + ", ".join(f"{k} (entry {seq})" for k, seq in got.items())
        for path, got in kinds.items()
        if len(got) > 1
    ]


def _shape_clauses(b, v):
    """``integrity.after-head`` (:func:`after_head_problems`, and the weights copy a weights
    file) and ``integrity.entry-kind`` (:func:`entry_kind_problems`)."""
    problems: list[tuple[str, list]] = [(line, []) for line in after_head_problems(b.entries)]
    copy = b.last.get(WEIGHTS_COPY)
    if copy is not None and copy["kind"] == "weights" and (b.outdir / WEIGHTS_COPY).is_file():
        try:
            read_weights(b.outdir / WEIGHTS_COPY)
        except SealError as exc:
            problems.append(
                (f"the seal's weights copy is not a weights file: {exc}", [WEIGHTS_COPY])
            )
    _report(
        v,
        "integrity",
        "integrity.after-head",
        problems,
        "no entry follows a session's end but the seal's weights copy "
        f"({WEIGHTS_COPY}, a weights file)",
    )
    _report(
        v,
        "integrity",
        "integrity.entry-kind",
        [(line, [line.partition(":")[0]]) for line in entry_kind_problems(b.entries)],
        "each file is entered under one kind",
    )


def _show_identity(ident):
    """A node's identity in one short line: host name and GPU UUIDs or serials."""
    if not isinstance(ident, dict):
        return "none"
    gpus = [
        str(g.get("uuid") or g.get("serial"))
        for g in _list(ident.get("gpus"))
        if isinstance(g, dict)
    ]
    text = f"host {ident.get('hostname')!r}, {len(gpus)} GPU(s)"
    return text + (f" {', '.join(gpus)}" if gpus else "")


def _bundle_session_clause(b, v):
    """``integrity.bundle-session``: ``bundle.json``'s hardware identity (every node) and
    profile SHA-256 are those of the session file (merged over its sessions as
    :func:`milarun.verify.seal.merged_identity` does), which the chain holds."""
    try:
        saved = read_session(b.outdir)
    except MilarunError as exc:
        saved, why = None, str(exc)
    else:
        why = "no session file (.milarun/session.json)"
    if saved is None:
        v.add(
            "integrity",
            "integrity.bundle-session",
            False,
            f"bundle.json cannot be compared with the session file: {why}",
            ["bundle.json", ".milarun/session.json"],
        )
        return
    wrong = []
    sealed = b.bundle["identity"]
    recorded, _ = merged_identity(saved)
    for node in sorted(set(sealed) | set(recorded)):
        if sealed.get(node) != recorded.get(node):
            wrong.append(
                f"node {node}: bundle.json has {_show_identity(sealed.get(node))}, "
                f"the session file {_show_identity(recorded.get(node))}"
            )
    want = (saved.get("invocation") or {}).get("profile_sha256")
    if b.bundle["profile_sha256"] != want:
        wrong.append(
            f"profile_sha256 {b.bundle['profile_sha256']} is not the session file's {want}"
        )
    _report(
        v,
        "integrity",
        "integrity.bundle-session",
        [(line, ["bundle.json", ".milarun/session.json"]) for line in wrong],
        f"bundle.json's hardware identity ({len(sealed)} node(s)) and profile SHA-256 "
        "are the session file's",
    )


#: ``format`` of the JSON files a results folder may hold besides records (a summary
#: the vendor made): not result-like, so not named when outside the chain (never read
#: as figures either: verify recomputes every statistic from the records).
NOT_RESULTS = (SUMMARY_FORMAT,)


def _not_result_like(path, rec):
    """True for a JSON file that is not a record and declares another milarun format."""
    if not isinstance(rec, Exception):
        return False
    try:
        data = read_json(path, max_bytes=MAX_META_BYTES)
    except MilarunError:
        return False
    return isinstance(data, dict) and data.get("format") in NOT_RESULTS


def _bundle_clauses(b, v, expect_head, public_key, rules):
    bpath = bundle_path(b.outdir)
    if not bpath.exists():
        v.add(
            "integrity",
            "integrity.bundle-head",
            False,
            "no bundle.json: the folder was not sealed (milarun seal)",
        )
    else:
        try:
            b.bundle = read_bundle(bpath)
        except MilarunError as exc:
            v.add("integrity", "integrity.bundle-head", False, str(exc), ["bundle.json"])
        else:
            wrong = []
            if b.bundle["head"] != v.head:
                wrong.append(f"head {b.bundle['head']} is not the manifest's {v.head}")
            if b.bundle["entries"] != len(b.entries):
                wrong.append(
                    f"entries {b.bundle['entries']} is not the manifest's {len(b.entries)}"
                )
            copies = [e for e in b.entries if e["kind"] == "weights"]
            sealed = copies[-1]["sha256"] if copies else None
            if b.bundle["weights_sha256"] != sealed:
                wrong.append(
                    f"weights_sha256 {b.bundle['weights_sha256']} is not the chained "
                    f"weights copy's {sealed}"
                )
            if b.bundle.get("weights", WEIGHTS_COPY) != WEIGHTS_COPY:
                wrong.append(
                    f"weights {b.bundle['weights']!r} is not the seal's copy {WEIGHTS_COPY}"
                )
            if list(b.bundle["sessions"]) != b.session_ids:
                wrong.append(
                    f"sessions {b.bundle['sessions']} are not the manifest's {b.session_ids}"
                )
            v.add(
                "integrity",
                "integrity.bundle-head",
                not wrong,
                "; ".join(wrong)
                if wrong
                else f"bundle.json seals the chain's head and its {len(b.entries)} entries",
                ["bundle.json"],
            )
            _bundle_session_clause(b, v)
    if expect_head is not None:
        want = str(expect_head).strip().lower()
        # the head printed at the end of the run; `milarun seal --weights` may add only
        # its weights entry, at its one path, after it
        at = next((i for i, e in enumerate(b.entries or []) if e["hash"] == want), None)
        after = b.entries[at + 1 :] if at is not None else []
        ok = at is not None and (
            not after
            or (
                len(after) == 1
                and after[0]["kind"] == "weights"
                and after[0]["path"] == WEIGHTS_COPY
            )
        )
        v.add(
            "integrity",
            "integrity.expected-head",
            ok,
            f"the chain head is {v.head}"
            + (
                ""
                if v.head == want
                else f", the expected {want} followed by the seal's weights entry"
                if ok
                else f", not the expected {want} (nor it followed by the seal's weights copy "
                f"{WEIGHTS_COPY} only)"
            ),
        )
    elif rules and rules.get("require_pinned"):
        v.add(
            "integrity",
            "integrity.expected-head",
            False,
            "the rules require a pinned chain head: give --expect-head, the head the "
            "vendor sent when the run ended",
        )
    need = bool(rules and rules.get("require_signature"))
    if public_key is None:
        if need:
            v.add(
                "integrity",
                "integrity.signature",
                False,
                "the rules require a signed bundle: give the vendor's --public-key",
            )
        return
    spath = signature_path(b.outdir)
    if b.bundle is None or not spath.exists():
        v.add(
            "integrity",
            "integrity.signature",
            False,
            "no bundle.json to check"
            if b.bundle is None
            else "no bundle.json.sig: the bundle is not signed",
            ["bundle.json.sig"],
        )
        return
    try:
        raw = read_bytes(bpath, what="bundle file")
        ok, detail = check_signature(raw, spath, public_key)
    except MilarunError as exc:  # the key was checked first: this is the signature file
        ok, detail = False, str(exc)
    v.add("integrity", "integrity.signature", ok, detail, ["bundle.json.sig"])


# --- completeness ---------------------------------------------------------------------------


def _not_checked(v, section):
    v.add(section, f"{section}.unchecked", False, "not checked: no readable manifest")


def check_completeness(b, v):
    """The completeness clauses; fills ``b.session`` and ``b.plans``; sets ``v.sessions``."""
    if b.entries is None:
        _not_checked(v, "completeness")
        return
    sids = b.session_ids
    v.sessions = len(sids)
    _sessions_clause(b, v, sids)
    _plan_clause(b, v, sids)
    planned = b.plan_launches()
    resumed = {sid for sid, p in b.plans.items() if p.get("resume")}
    outcomes = defaultdict(list)  # key -> [(session, success, path)]
    extra, mismatch = [], []
    for e in b.entries:
        if e["kind"] not in ("record", "unwritten"):
            continue
        launch = e.get("launch")
        if not isinstance(launch, dict):
            extra.append(
                (
                    f"manifest entry {e['seq']} ({e['kind']}): names no launch",
                    [e.get("path")] if e.get("path") else [],
                )
            )
            continue
        key = launch_key(launch)
        path = e.get("path")
        mine = [lch for sid, lch in planned.get(key, []) if sid == e["session"]]
        if not mine:
            extra.append(
                (
                    f"{path or 'unwritten ' + _show_key(key)}: {_show_key(key)} is in no "
                    f"plan of session {e['session']}",
                    [path] if path else [],
                )
            )
            continue
        if path is not None and Path(path).name not in (mine[0].get("result"), mine[0].get("fail")):
            extra.append(
                (
                    f"{path}: not the record file session {e['session']} planned for "
                    f"{_show_key(key)}",
                    [path],
                )
            )
            continue
        rec = b.records.get(path)
        if rec is not None and launch_key(rec) != key:
            mismatch.append(
                (
                    f"{path}: the record says {_show_key(launch_key(rec))}, its "
                    f"manifest entry {_show_key(key)}",
                    [path],
                )
            )
        # the launcher writes a FAIL record only under the plan's FAIL name, and moves a
        # child's record that says it failed to that name (launcher/outcome.py): a record
        # whose success is not its name's (or its entry's) was edited
        named = Path(path).name == mine[0].get("result") if path is not None else None
        if rec is not None and (rec.get("success") is not named or e.get("success") is not named):
            mismatch.append(
                (
                    f"{path}: named as a {'PASS' if named else 'FAIL'} record, but "
                    f"the record says success {rec.get('success')!r} and its entry "
                    f"{e.get('success')!r}",
                    [path],
                )
            )
        success = bool(rec.get("success")) if rec is not None else False
        outcomes[key].append((e["session"], success, path))
    missing: list = []
    duplicate: list = []
    for key in sorted(planned, key=str):
        got = outcomes.get(key, [])
        if not got:
            missing.append((f"{_show_key(key)}: planned, no outcome record in the chain", []))
            continue
        for (s1, ok1, p1), (s2, _, p2) in zip(got, got[1:]):
            rerun = (
                not ok1 and s2 != s1 and s2 in resumed and any(sid == s2 for sid, _ in planned[key])
            )
            if not rerun:
                duplicate.append(
                    (
                        f"{_show_key(key)}: outcome twice ({p1}, {p2}) "
                        + ("both in one session" if s1 == s2 else "and the earlier did not fail"),
                        [p for p in (p1, p2) if p],
                    )
                )
    _report(
        v,
        "completeness",
        "completeness.missing",
        missing,
        f"every one of the {len(planned)} planned launches has an outcome",
    )
    _report(
        v,
        "completeness",
        "completeness.duplicate",
        duplicate,
        "no launch has two outcomes (but reruns of failures by --resume)",
    )
    _report(
        v,
        "completeness",
        "completeness.extra",
        extra,
        "every outcome in the chain is a planned launch",
    )
    _report(
        v,
        "completeness",
        "completeness.record-launch",
        mismatch,
        "every record is the launch its manifest entry names",
    )
    _tally_clause(b, v, outcomes)
    _profile_clauses(b, v)


def _sessions_clause(b, v, sids):
    """``completeness.sessions``: the session file lists the manifest's sessions, in order;
    fills ``b.session``. Shows when each session ended and the head it printed then."""
    try:
        b.session = read_session(b.outdir)
    except MilarunError as exc:
        b.session = None
        v.add("completeness", "completeness.sessions", False, str(exc), [".milarun/session.json"])
    else:
        listed = [
            s.get("id") for s in _list((b.session or {}).get("sessions")) if isinstance(s, dict)
        ]
        resumed = [
            s.get("id")
            for s in _list((b.session or {}).get("sessions"))
            if isinstance(s, dict) and s.get("resume")
        ]
        ok = b.session is not None and listed == sids
        # when each session ended and the head it printed then: what the buyer compares
        # with the heads the vendor sent, and when they came (docs/tender.md)
        ends = {e["session"]: e for e in b.entries if e["kind"] == "end"}

        def ended(sid):
            e = ends.get(sid)
            if e is None:
                return "no end"
            when = datetime.datetime.fromtimestamp(e["time"], datetime.timezone.utc)
            return f"ended {when:%Y-%m-%d %H:%M:%S} UTC, head {e['hash']}"

        v.add(
            "completeness",
            "completeness.sessions",
            ok,
            (
                f"{len(sids)} session(s): "
                + ", ".join(
                    f"{s}{' (--resume)' if s in resumed else ''} ({ended(s)})" for s in sids
                )
            )
            if ok
            else f"the session file lists {listed}, the manifest {sids}",
            [".milarun/session.json"],
        )


def _plan_clause(b, v, sids):
    """``completeness.plan``: each session's plan is in the chain and is that session's;
    fills ``b.plans``."""
    problems = []
    for sid in sids:
        rel = f".milarun/plan-{sid}.json"
        e = b.last.get(rel)
        if e is None or e["kind"] != "plan" or e["session"] != sid:
            problems.append((f"session {sid}: no plan in the chain ({rel})", [rel]))
            continue
        try:
            plan = read_json(b.outdir / rel, max_bytes=MAX_META_BYTES, what="plan")
        except MilarunError as exc:
            problems.append((str(exc), [rel]))
            continue
        if (
            not isinstance(plan, dict)
            or plan.get("format") != PLAN_FORMAT
            or plan.get("session") != sid
            or not isinstance(plan.get("launches"), list)
        ):
            problems.append((f"{rel}: not the plan of session {sid}", [rel]))
            continue
        b.plans[sid] = plan
    _report(
        v,
        "completeness",
        "completeness.plan",
        problems,
        f"a plan for each of the {len(sids)} session(s)",
    )


def _tally_clause(b, v, outcomes):
    """Each session's ``end`` event (its tally, printed with the head) against the
    outcomes the chain holds for it. A session without an end was cut off (shown)."""
    # session -> [passed, not passed]
    count: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])
    for got in outcomes.values():
        for sid, success, _ in got:
            count[sid][0 if success else 1] += 1
    ends = {e["session"]: e for e in b.entries if e["kind"] == "end"}
    problems: list = []
    cut = [sid for sid in b.session_ids if sid not in ends]
    for sid, e in ends.items():
        said = (e.get("passed"), (e.get("failed") or 0) + (e.get("interrupted") or 0))
        if said != tuple(count[sid]):
            problems.append(
                (
                    f"session {sid}: its end says {said[0]} passed, {said[1]} not, "
                    f"the chain holds {count[sid][0]} and {count[sid][1]}",
                    [],
                )
            )
    _report(
        v,
        "completeness",
        "completeness.tally",
        problems,
        "each session's tally is the outcomes in its chain"
        + (f" (cut off, no end: {', '.join(cut)})" if cut else ""),
    )


def _profile_copies(b, sid):
    """``[(n, rel path)]`` of session ``sid``'s profile copies, in order."""
    out = []
    for path, e in b.last.items():
        if e["kind"] == "profile" and e["session"] == sid:
            n, _, _ = Path(path).name.partition("-")
            out.append((int(n) if n.isdigit() else 10**9, path))
    return sorted(out)


def _profile_digest_clause(b, v, want):
    """``completeness.profile``: every session's profile copies in the chain hash to the
    session file's ``profile_sha256`` ``want``. Returns the first session's copies
    ``[(n, rel path)]``, or None when no session has a readable one."""
    problems: list = []
    first = None
    for sid in b.session_ids:
        copies = _profile_copies(b, sid)
        if not copies:
            problems.append((f"session {sid}: no copy of the profile in the chain", []))
            continue
        try:
            contents = [
                read_bytes(b.outdir / p, max_bytes=MAX_META_BYTES, what="profile copy")
                for _, p in copies
            ]
        except MilarunError as exc:
            problems.append((str(exc), [p for _, p in copies]))
            continue
        got = digest_of_contents(contents)
        if got != want:
            problems.append(
                (
                    f"session {sid}: the profile copies hash to {got}, the session "
                    f"file records {want}",
                    [p for _, p in copies],
                )
            )
        first = first or copies
    _report(
        v,
        "completeness",
        "completeness.profile",
        problems,
        f"the profile copies hash to the recorded profile_sha256 {want}",
    )
    return first


def _planned_grid(plans):
    """``{test name: {(run, device)}}`` over every plan's launches and skipped keys."""
    grid = defaultdict(set)  # name -> {(run, device)}
    for plan in plans.values():
        for lch in _list(plan.get("launches")):
            if isinstance(lch, dict):
                name, run, device = launch_key(lch)
                grid[name].add((run, device))
        for key in _list(plan.get("skipped")):
            if isinstance(key, list) and len(key) == 3:
                run = int(key[1]) if str(key[1]).isdigit() else _scalar(key[1])
                grid[_scalar(key[0])].add((run, str(_scalar(key[2]))))
    return grid


def _profile_clauses(b, v):
    inv = (b.session or {}).get("invocation") or {}
    want = inv.get("profile_sha256")
    first = _profile_digest_clause(b, v, want)
    if first is None or not b.plans:
        v.add(
            "completeness",
            "completeness.profile-jobs",
            False,
            "not checked: no profile copy or no plan",
        )
        return
    if len(first) > 1:
        v.add(
            "completeness",
            "completeness.profile-jobs",
            True,
            "the profile includes other files: its jobs are not re-planned here "
            "(its digest was checked)",
        )
        return
    names = inv.get("names")
    if names is not None and not (
        isinstance(names, list) and all(isinstance(n, str) for n in names)
    ):
        v.add(
            "completeness",
            "completeness.profile-jobs",
            False,
            f"the session file's names are not a list of job names: {repr(names)[:200]}",
            [".milarun/session.json"],
        )
        return
    try:
        jobs = load_profile(b.outdir / first[0][1], names=names)
    except MilarunError as exc:
        v.add(
            "completeness",
            "completeness.profile-jobs",
            False,
            f"the recorded profile cannot be read: {exc}",
            [first[0][1]],
        )
        return
    b.jobs = {f"{inv.get('suite')}.{j.name}": j for j in jobs}
    grid = _planned_grid(b.plans)
    runs = {name: {r for r, _ in cells} for name, cells in grid.items()}
    wrong = []
    if set(runs) != set(b.jobs):
        wrong.append(
            f"planned tests {sorted(map(str, runs))} are not the profile's selected "
            f"jobs {sorted(b.jobs)}"
        )
    repeat = inv.get("repeat")
    if isinstance(repeat, int):
        short = sorted(n for n, r in runs.items() if r != set(range(repeat)))
        if short:
            wrong.append(f"not every run 0..{repeat - 1} planned for: {', '.join(map(str, short))}")
    holes = sorted(
        str(n)
        for n, cells in grid.items()
        if len(cells) != len(runs[n]) * len({d for _, d in cells})
    )
    if holes:
        wrong.append(f"not every run on every device planned for: {', '.join(holes)}")
    # a record's job definition (what an audit reruns, prepare commands included) is the
    # recorded profile's: one edited into the records alone would run on the buyer's side
    alien = sorted(
        path
        for path, rec in b.records.items()
        if rec.get("name") in b.jobs and rec.get("job") != b.jobs[rec["name"]].definition
    )
    if alien:
        wrong.append(
            f"{len(alien)} record(s) hold another job definition than the recorded "
            f"profile's: {', '.join(alien[:5])}" + (" ..." if len(alien) > 5 else "")
        )
    derived, unchecked = _derived_labels(b.jobs, inv, b.plans)
    for name in sorted(set(derived) & set(grid)):
        got = {d for _, d in grid[name]}
        if got != derived[name]:
            wrong.append(
                f"{name}: planned on device(s) {', '.join(sorted(got))}, but the "
                f"recorded devices give {', '.join(sorted(derived[name]))}"
            )
    v.add(
        "completeness",
        "completeness.profile-jobs",
        not wrong,
        "; ".join(wrong)
        if wrong
        else f"the plans hold the profile's {len(b.jobs)} selected job(s), {repeat} run(s) each "
        "on every device the session recorded"
        + (f" (devices not re-derived for: {', '.join(unchecked)})" if unchecked else ""),
    )


def _derived_labels(jobs, inv, plans):
    """``({test name: {device label}}, [names not re-derived])``: the launches each job of
    the recorded profile has on the session's recorded devices (``invocation.devices``)
    and nodes (``invocation.nodes``, else the one node the plans name), re-derived with
    the job's own plan type (:meth:`milarun.plan.types.PlanType.expand`), so that a plan
    rewritten without some devices (and their records) is caught. A job whose plan
    type cannot expand here (e.g. multi-process on a smaller machine) is listed instead."""
    devices = inv.get("devices") if isinstance(inv.get("devices"), dict) else {}
    indices = devices.get("indices")
    if not (
        isinstance(indices, list)
        and indices
        and all(isinstance(i, int) and not isinstance(i, bool) for i in indices)
    ):
        return {}, sorted(jobs)
    names = inv.get("nodes")
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
        names = list(
            dict.fromkeys(
                str(_scalar(n))
                for plan in plans.values()
                for lch in _list(plan.get("launches"))
                if isinstance(lch, dict)
                for n in _list(lch.get("nodes"))
            )
        )[:1] or ["?"]
    nodes = [SimpleNamespace(name=n) for n in names]
    cluster = SimpleNamespace(
        devices=SimpleNamespace(kind=devices.get("kind"), indices=indices, affinity=None),
        nodes=nodes,
        main=nodes[0],
        multi=len(nodes) > 1,
    )
    out, unchecked = {}, []
    for name, job in jobs.items():
        try:
            out[name] = {slot.label for wave in job.kind.expand(job, cluster) for slot in wave}
        except Exception:  # noqa: BLE001 -- a plan type that needs the vendor's host
            unchecked.append(name)
    return out, unchecked


# --- compliance ------------------------------------------------------------------------------


def _version(text):
    parts = re.findall(r"\d+", str(text))[:4]
    return tuple(int(p) for p in parts) + (0,) * (4 - len(parts))


def find_overrides(b):
    """``[(kind, line)]``: every override of the profile the bundle shows (module
    docstring); ``kind`` is a key of :data:`OVERRIDES`."""
    out = []
    inv = (b.session or {}).get("invocation") or {}
    if inv.get("extra_args"):
        out.append(
            (
                "extra_args",
                "-- " + " ".join(map(str, _list(inv["extra_args"])))
                if isinstance(inv["extra_args"], list)
                else repr(inv["extra_args"])[:300],
            )
        )
    if inv.get("timeout") is not None:
        out.append(("timeout", f"--timeout {inv['timeout']}"))
    if inv.get("no_cgexec"):
        out.append(("no_cgexec", "--no-cgexec (no student cgroups)"))
    if inv.get("cpu_slots") is not None:
        out.append(("cpu_slots", f"--cpu-slots {inv['cpu_slots']}"))
    if inv.get("names"):
        out.append(("names", "--name/--select " + ", ".join(map(str, _list(inv["names"])))))
    planned = b.plan_launches()
    for path, rec in sorted(b.records.items()):
        argv = (rec.get("call") or {}).get("argv")
        plans = planned.get(launch_key(rec)) or []
        if plans and argv is not None and argv not in [p.get("test_argv") for _, p in plans]:
            planned_argv = " ".join(map(str, _list(plans[0][1].get("test_argv"))))
            out.append(
                (
                    "argv",
                    f"{path}: ran with {' '.join(map(str, argv))[:300]}, "
                    f"planned {planned_argv[:300]}",
                )
            )
    return out


def check_compliance(b, v, rules):
    """List the overrides (always) and, with ``rules``, the compliance clauses."""
    if b.entries is None:
        if rules is not None:
            _not_checked(v, "compliance")
        return
    found = find_overrides(b)
    v.overrides = [f"{kind}: {line}" for kind, line in found]
    if rules is None:
        return
    allowed = set(rules.get("allowed_overrides") or [])
    if "select" in allowed:
        allowed.add("names")
    by_kind = defaultdict(list)
    for kind, line in found:
        by_kind[kind].append(line)
    for kind in OVERRIDES:
        name = f"compliance.{kind.replace('_', '-')}"
        lines = by_kind.get(kind, [])
        if not lines:
            v.add("compliance", name, True, f"no override: {OVERRIDES[kind]}")
        elif kind in allowed:
            v.add(
                "compliance",
                name,
                True,
                f"allowed by the rules: {lines[0]}"
                + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""),
            )
        else:
            for line in lines[:MAX_LISTED]:
                v.add("compliance", name, False, f"not allowed by the rules: {line}")

    inv = (b.session or {}).get("invocation") or {}
    if "profile_sha256" in rules:
        want = rules["profile_sha256"]
        hashes = {inv.get("profile_sha256"), (b.bundle or {}).get("profile_sha256")}
        v.add(
            "compliance",
            "compliance.profile-sha256",
            hashes == {want},
            f"the profile is the tender's ({want})"
            if hashes == {want}
            else f"the profile's SHA-256 {sorted(map(str, hashes))} is not the tender's {want}",
        )
    if "weights_sha256" in rules:
        want, got = rules["weights_sha256"], (b.bundle or {}).get("weights_sha256")
        v.add(
            "compliance",
            "compliance.weights-sha256",
            got == want,
            f"the weights are the tender's ({want})"
            if got == want
            else f"the bundle's weights SHA-256 {got} is not the tender's {want}",
        )
    if "min_repeats" in rules or "min_steady_s" in rules:
        scored = _scored_records(b)
        if "min_repeats" in rules:
            _repeats_clause(b, v, inv, scored, rules["min_repeats"])
        if "min_steady_s" in rules:
            _steady_time_clause(v, scored, rules["min_steady_s"])
    if "milarun_version" in rules:
        lo, hi = rules["milarun_version"].get("min"), rules["milarun_version"].get("max")
        seen = {str((rec.get("host") or {}).get("milarun_version")) for rec in b.records.values()}
        if b.bundle is not None:
            seen.add(str(b.bundle.get("milarun_version")))
        bad = sorted(
            s
            for s in seen
            if (lo and _version(s) < _version(lo))
            or (hi and _version(s) > _version(hi))
            or not re.match(r"\d", s)
        )
        v.add(
            "compliance",
            "compliance.milarun-version",
            bool(seen) and not bad,
            f"milarun {', '.join(sorted(seen))} within [{lo or '-'}, {hi or '-'}]"
            if not bad
            else f"milarun {', '.join(bad)} outside [{lo or '-'}, {hi or '-'}]",
        )
    if "dataset_preset" in rules:
        _dataset_clause(b, v, rules["dataset_preset"])
    if "prescreen" in rules:
        _prescreen_clause(b, v, rules["prescreen"]["fatal"])


def _prescreen_clause(b, v, fatal):
    """``compliance.prescreen``: every finding named in ``fatal`` is recorded and ok
    (:func:`milarun.host.prescreen.fatal_problems`: unknown is not ok) in the host prescreen
    of every node of every session (the identities of the session file, else those of the
    plans and the bundle file); a failed clause per node and finding, naming both."""
    by_node = {}
    for s in _list((b.session or {}).get("sessions")):
        if isinstance(s, dict) and isinstance(s.get("identity"), dict):
            for node, ident in s["identity"].items():
                by_node[f"node {node} (session {_scalar(s.get('id'))})"] = findings_of(ident)
    if not by_node:
        by_node = {f"node {node}": findings_of(ident) for node, ident in _identity(b).items()}
    if not by_node:
        v.add(
            "compliance",
            "compliance.prescreen",
            False,
            f"no node's hardware identity, so no prescreen, in the bundle: the rules ask "
            f"{', '.join(fatal)} ok on every node",
            [".milarun/session.json"],
        )
        return
    problems = [(line, [".milarun/session.json"]) for line in fatal_problems(by_node, fatal)]
    _report(
        v,
        "compliance",
        "compliance.prescreen",
        problems,
        f"prescreen {', '.join(fatal)} ok on every node ({len(by_node)} node session(s))",
    )


def _scored_records(b):
    """``[(path, group, run, steady seconds)]`` of the chained records that passed and
    have a steady-state rate (those the score is made of), in path order; ``run`` is the
    record's run index (0 without one), the steady seconds the summed durations of the
    samples :func:`milarun.measure.stats.steady_state` chose (the time its rate is
    measured over: at most its window). A record whose samples cannot be read is left
    out here (``consistency.*`` names it)."""
    out = []
    for path, rec in sorted(b.records.items()):
        if rec.get("success") is not True:
            continue
        try:
            rate, chosen, _ = steady_state(
                ((rec.get("timings") or {}).get("train") or {})["samples"]
            )
            group = group_name(rec)
        except Exception:  # noqa: BLE001 -- a malformed record is a consistency finding
            continue
        if rate is None:
            continue
        run = rec.get("run") if isinstance(rec.get("run"), int) else 0
        seconds = math.fsum(float(x["end"]) - float(x["start"]) for x in chosen)
        out.append((path, str(group), run, seconds))
    return out


def _repeats_clause(b, v, inv, scored, want):
    """``compliance.repeats``: the session asked ``--repeat`` of at least ``want``, and
    every test has a scored record in at least ``want`` runs, counted over every session
    of the bundle (a ``--resume`` session's reruns included, and named: the runs whose
    records a resumed session wrote)."""
    repeat = inv.get("repeat")
    if not (isinstance(repeat, int) and repeat >= want):
        v.add(
            "compliance",
            "compliance.repeats",
            False,
            f"--repeat {repeat}: the rules ask at least {want} repeat(s)",
            [".milarun/session.json"],
        )
    resumed = {sid for sid, p in b.plans.items() if isinstance(p, dict) and p.get("resume")}
    session_of = {e.get("path"): e["session"] for e in b.entries or [] if e["kind"] == "record"}
    runs = defaultdict(set)
    rerun = defaultdict(set)  # group: {(run, session)} of records a resumed session wrote
    for path, group, run, _ in scored:
        runs[group].add(run)
        if session_of.get(path) in resumed:
            rerun[group].add((run, session_of[path]))

    def resumed_text(group):
        if not rerun[group]:
            return ""
        return "; from a --resume session: " + ", ".join(
            f"run {r} ({sid})" for r, sid in sorted(rerun[group], key=str)
        )

    short: list = [
        (
            f"{g}: {len(runs[g])} run(s) with a scored record (runs "
            f"{', '.join(map(str, sorted(runs[g])))}), the rules ask at least {want}"
            + resumed_text(g),
            [],
        )
        for g in sorted(runs)
        if len(runs[g]) < want
    ]
    if not runs:
        short.append((f"no test has a scored record: the rules ask {want} run(s) of each", []))
    fewest = min(runs, key=lambda g: (len(runs[g]), g)) if runs else None
    _report(
        v,
        "compliance",
        "compliance.repeats",
        short,
        f"every test has a scored record in {want} run(s) or more, over the bundle's "
        f"{len(b.session_ids)} session(s) (fewest: {fewest}, {len(runs[fewest]) if fewest else 0})"
        + "".join(resumed_text(g) for g in sorted(rerun)),
    )


def _steady_time_clause(v, scored, want):
    """``compliance.steady-time``: every scored record's steady state lasted at least
    ``want`` seconds (:func:`_scored_records`); the clause names the shortest."""
    if not scored:
        v.add(
            "compliance",
            "compliance.steady-time",
            False,
            f"no scored record: the rules ask a steady state of {want:g} s or more",
        )
        return
    path, group, run, seconds = min(scored, key=lambda x: (x[3], x[0]))
    below = sum(1 for x in scored if x[3] < want)
    v.add(
        "compliance",
        "compliance.steady-time",
        below == 0,
        f"shortest steady state {seconds:.3g} s ({group} run {run}, {path})"
        + (
            f"; {below} of {len(scored)} scored record(s) below the {want:g} s the rules ask"
            if below
            else f"; every one of the {len(scored)} scored record(s) >= {want:g} s"
        ),
        [path],
    )


def _dataset_clause(b, v, preset):
    jobs = b.jobs
    if jobs is None:
        v.add(
            "compliance",
            "compliance.datasets",
            False,
            "not checked: the recorded profile could not be re-read",
        )
        return
    bad, seen = [], 0
    for name, job in sorted(jobs.items()):
        for cmd in job.prepare or []:
            words = str(cmd).split()
            if "dataset" not in words:
                continue
            seen += 1
            size = words[words.index("--size") + 1] if "--size" in words[:-1] else "tiny"
            custom = [w for w in words if w in ("--count", "--image-size")]
            if size != preset or custom:
                bad.append(f"{name}: {cmd}")
    v.add(
        "compliance",
        "compliance.datasets",
        not bad,
        f"{seen} dataset preparation(s) use the {preset} preset"
        if not bad
        else f"not the {preset} preset: " + "; ".join(bad[:8]),
    )


# --- consistency -------------------------------------------------------------------------------


def _num(x: object) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _sample_problems(path, rec):
    """``{clause: [detail]}`` for one record's samples."""
    out = defaultdict(list)
    timings = rec.get("timings") or {}
    train = timings.get("train") or {}
    samples = train.get("samples") or []
    program = timings.get("program") or {}
    origin, start, end = program.get("origin"), program.get("start"), program.get("end")
    prev_end = None
    for i, s in enumerate(samples):
        a, z, count, rate = s.get("start"), s.get("end"), s.get("count"), s.get("rate")
        if not (_num(a) and _num(z) and z > a):
            out["consistency.sample-order"].append(f"sample {i} ends before it starts")
            continue
        if prev_end is not None and a < prev_end - OVERLAP_TOLERANCE_S:
            out["consistency.sample-order"].append(
                f"sample {i} starts {prev_end - a:.3g} s before the previous one ends"
            )
        prev_end = z
        if _num(count) and _num(rate):
            want = count / (z - a)
            if abs(rate - want) > RATE_TOLERANCE * max(abs(want), 1e-9):
                out["consistency.sample-rate"].append(
                    f"sample {i}: rate {rate:.6g} items/s is not its {count} items over "
                    f"{z - a:.6g} s = {want:.6g}"
                )
        if _num(origin) and _num(start) and _num(end):
            if origin + a < start - CLOCK_TOLERANCE_S or origin + z > end + CLOCK_TOLERANCE_S:
                out["consistency.sample-window"].append(
                    f"sample {i} ({origin + a:.3f}..{origin + z:.3f}) lies outside the "
                    f"program's {start:.3f}..{end:.3f}"
                )
    if rec.get("success") is True and not samples:
        out["consistency.counts"].append("it passed without a single sample")
    if rec.get("success") is True and samples:
        counted = sum(s["count"] for s in samples if _num(s.get("count")))
        total, max_count = train.get("count"), train.get("max_count")
        if _num(total) and counted > total:
            out["consistency.counts"].append(f"samples count {counted} items, the record {total}")
        if _num(total) and _num(max_count) and total < max_count:
            out["consistency.counts"].append(
                f"stopped at {total} items, before max_count {max_count}"
            )
        argv_max = ((rec.get("call") or {}).get("arguments") or {}).get("max_count")
        if _num(argv_max) and _num(max_count) and argv_max != max_count:
            out["consistency.counts"].append(
                f"max_count {max_count} is not the arguments' {argv_max}"
            )
        min_steady = train.get("min_steady")
        if _num(min_steady) and min_steady > 0 and _num(max_count):
            steady = sum(
                s["end"] - s["start"]
                for s in samples
                if not s.get("warmup") and _num(s.get("start")) and _num(s.get("end"))
            )
            duration = train.get("sample_duration")
            slack = duration if _num(duration) else 0
            if steady < min_steady - slack:
                out["consistency.counts"].append(
                    f"{steady:.3g} s of steady state, min_steady {min_steady:g} s"
                )
    return out


def check_consistency(b, v):
    """The consistency clauses, from the raw samples of the chained records."""
    if b.entries is None:
        _not_checked(v, "consistency")
        return
    found = defaultdict(list)
    for path, rec in sorted(b.records.items()):
        for name, details in _sample_problems(path, rec).items():
            found[name].append(
                (
                    f"{path}: {details[0]}"
                    + (f" (and {len(details) - 1} more)" if len(details) > 1 else ""),
                    [path],
                )
            )
    for name, ok in (
        ("consistency.sample-rate", "every sample's rate is its count over its duration"),
        ("consistency.sample-order", "samples are ordered and do not overlap"),
        ("consistency.sample-window", "samples lie inside their program's run"),
        ("consistency.counts", "item counts agree with max_count and min_steady"),
    ):
        _report(v, "consistency", name, found.get(name, []), ok)

    _copy_clause(b, v)

    # every statistic recomputed from the raw samples
    skipped = []
    try:
        b.summary = summarize(sorted(b.records.items()), warn=None)
        for name in b.summary.get("skipped", []):
            skipped.append((f"{name}: its samples give no statistic (malformed)", [name]))
    except (ValueError, KeyError, TypeError, AttributeError, ArithmeticError) as exc:
        b.summary = None
        skipped.append((f"the statistics cannot be recomputed: {exc}", []))
    _report(
        v,
        "consistency",
        "consistency.statistics",
        skipped,
        f"statistics recomputed from the raw samples of {len(b.records)} record(s)",
    )

    _time_clause(b, v)
    _barrier_clause(b, v)
    _energy_clause(b, v)
    _host_clause(b, v)
    _config_clause(b, v)


def _copy_clause(b, v):
    """No sample window (its start and end, seconds on the child's clock, to the bit) is
    in two records: each child reads its own clock, so a shared window is a record made
    from another's samples (a FAIL record replaced by a copy of a PASS one)."""
    seen: dict = {}
    problems: list = []
    for path, rec in sorted(b.records.items()):
        train = (rec.get("timings") or {}).get("train") or {}
        windows = {
            (s.get("start"), s.get("end"))
            for s in _list(train.get("samples"))
            if isinstance(s, dict) and _num(s.get("start")) and _num(s.get("end"))
        }
        twins = sorted({seen[w] for w in windows if w in seen})
        if twins:
            problems.append(
                (
                    f"{path}: sample windows identical to those of {twins[0]} (a "
                    "copy of another record's samples)",
                    [path, twins[0]],
                )
            )
        for w in windows:
            seen.setdefault(w, path)
    _report(
        v,
        "consistency",
        "consistency.sample-copy",
        problems,
        "no two records share a sample window",
    )


def _time_clause(b, v):
    """Session ids are their start times; records inside their session's time in the
    manifest; manifest times in order."""
    problems: list = []
    first: dict = {}
    prev = None
    for e in b.entries:
        if e["session"] not in first:
            first[e["session"]] = e["time"]
            try:
                began = (
                    datetime.datetime.strptime(e["session"], SESSION_ID_FORMAT)
                    .replace(tzinfo=datetime.timezone.utc)
                    .timestamp()
                )
            except ValueError:
                began = None
            if began is None or abs(e["time"] - began) > SESSION_START_S:
                problems.append(
                    (
                        f"session {e['session']}: its id is not the time its first "
                        f"entry was written ({e['time']:.0f})",
                        [],
                    )
                )
        if prev is not None and e["time"] < prev - CLOCK_TOLERANCE_S:
            problems.append(
                (
                    f"manifest entry {e['seq']} is {prev - e['time']:.3g} s older than "
                    "the entry before it",
                    [],
                )
            )
        prev = e["time"]
    for path, e in b.last.items():
        rec = b.records.get(path)
        if rec is None:
            continue
        program = (rec.get("timings") or {}).get("program") or {}
        start, end = program.get("start"), program.get("end")
        if _num(start) and start < first[e["session"]] - CLOCK_TOLERANCE_S:
            problems.append(
                (
                    f"{path}: started {first[e['session']] - start:.3g} s before its "
                    f"session {e['session']} began",
                    [path],
                )
            )
        if _num(end) and end > e["time"] + CLOCK_TOLERANCE_S:
            problems.append(
                (
                    f"{path}: ended {end - e['time']:.3g} s after it was entered in the manifest",
                    [path],
                )
            )
    _report(
        v,
        "consistency",
        "consistency.session-time",
        problems,
        "records lie inside their session's time in the manifest",
    )


def _barrier_clause(b, v):
    waves = defaultdict(list)
    for path, rec in b.records.items():
        bar = (rec.get("timings") or {}).get("barrier")
        if isinstance(bar, dict) and isinstance(bar.get("wave"), str) and _num(bar.get("released")):
            waves[bar["wave"]].append((bar["released"], path))
    problems = []
    for wave, got in sorted(waves.items()):
        times = [t for t, _ in got]
        if max(times) - min(times) > BARRIER_SPREAD_S:
            problems.append(
                (
                    f"wave {wave}: barrier releases spread over {max(times) - min(times):.3g} s",
                    sorted(p for _, p in got),
                )
            )
    _report(
        v,
        "consistency",
        "consistency.barrier",
        problems,
        f"barrier releases agree in each of {len(waves)} wave(s)",
    )


def _energy_clause(b, v):
    problems, checked = [], 0
    for path, rec in sorted(b.records.items()):
        mon = rec.get("gpu_monitor") or {}
        series = defaultdict(list)
        for r in mon.get("samples") or []:
            if isinstance(r, dict) and _num(r.get("t")) and "error" not in r:
                series[(r.get("node", 0), r.get("device"))].append(r)
        for (node, dev), readings in sorted(series.items(), key=str):
            readings.sort(key=lambda r: r["t"])
            counter = [(r["t"], r["energy"]) for r in readings if _num(r.get("energy"))]
            if len(counter) < 2:
                continue
            checked += 1
            where = f"{path}: GPU {dev}" + (f" (node {node})" if node else "")
            back = [i for i in range(1, len(counter)) if counter[i][1] < counter[i - 1][1]]
            if back:
                t = counter[back[0]][0]
                problems.append(
                    (
                        f"{where}: the energy counter goes back at t={t:.3f} s "
                        f"({len(back)} time(s))",
                        [path],
                    )
                )
                continue
            power = [r["power"] for r in readings if _num(r.get("power"))]
            span = counter[-1][0] - counter[0][0]
            if power and span > 0:
                mean_power = sum(power) / len(power)
                counted = (counter[-1][1] - counter[0][1]) / span
                lo, hi = ENERGY_POWER_RATIO
                if mean_power > 0 and not lo <= counted / mean_power <= hi:
                    problems.append(
                        (
                            f"{where}: the energy counter gives {counted:.4g} W, the "
                            f"power readings {mean_power:.4g} W",
                            [path],
                        )
                    )
    _report(
        v,
        "consistency",
        "consistency.energy",
        problems,
        f"energy counters monotonic and agreeing with power ({checked} GPU series)"
        if checked
        else "no energy counter readings (no GPU monitor)",
    )


#: Host facts that are the same in every record of one node.
HOST_FACTS = ("hostname", "cpu_model", "total_memory_mib")
#: Per-GPU facts that identify the hardware.
GPU_IDS = ("uuid", "serial", "name", "pci_bus_id")


def _gpu_ids(host):
    out = {}
    for g in host.get("gpus") or []:
        if isinstance(g, dict):
            ids = {k: g[k] for k in GPU_IDS if g.get(k) is not None}
            if ids:
                out[g.get("index")] = ids
    return out


def _identity(b):
    """``{node: identity}`` from the session file's sessions and the plans (the last one
    wins), and the bundle file."""
    out = {}
    for sid in b.session_ids:
        ident = (b.plans.get(sid) or {}).get("identity")
        if isinstance(ident, dict):
            out.update({k: d for k, d in ident.items() if isinstance(d, dict)})
    for s in _list((b.session or {}).get("sessions")):
        if isinstance(s, dict) and isinstance(s.get("identity"), dict):
            out.update({k: d for k, d in s["identity"].items() if isinstance(d, dict)})
    if b.bundle and isinstance(b.bundle.get("identity"), dict):
        for k, d in b.bundle["identity"].items():
            out.setdefault(k, d)
    return out


def _identity_gpus(ident):
    """The GPU UUIDs and serials of a node's identity (``gpus``: list of objects)."""
    ids: set[str] = set()
    for g in _list(ident.get("gpus")):
        if isinstance(g, dict):
            ids.update(str(g[k]) for k in ("uuid", "serial") if g.get(k))
    return ids


def _host_clause(b, v):
    nodes = defaultdict(list)
    for path, rec in sorted(b.records.items()):
        host = rec.get("host") if isinstance(rec.get("host"), dict) else {}
        nodes[node_of(rec) or host.get("hostname") or "?"].append((path, host))
    identity = _identity(b)
    problems = []
    planned = b.plan_launches()
    for node, items in sorted(nodes.items()):
        for path, _ in items:
            where = {
                _scalar(n)
                for _, lch in planned.get(launch_key(b.records[path]), [])
                for n in _list(lch.get("nodes"))
            }
            if where and node not in where:
                problems.append(
                    (
                        f"{path}: ran on {node}, its launch was planned on "
                        f"{', '.join(sorted(map(str, where)))}",
                        [path],
                    )
                )
        ref_path, ref = items[0]
        for path, host in items[1:]:
            for key in HOST_FACTS:
                if host.get(key) != ref.get(key):
                    problems.append(
                        (
                            f"node {node}: {path} has {key} {host.get(key)!r}, "
                            f"{ref_path} {ref.get(key)!r}",
                            [path, ref_path],
                        )
                    )
            mine, theirs = _gpu_ids(host), _gpu_ids(ref)
            for index in sorted(set(mine) & set(theirs), key=str):
                if mine[index] != theirs[index]:
                    problems.append(
                        (
                            f"node {node}: GPU {index} is {mine[index]} in {path}, "
                            f"{theirs[index]} in {ref_path}",
                            [path, ref_path],
                        )
                    )
        ident = identity.get(node)
        if ident:
            known = _identity_gpus(ident)
            for path, host in items:
                for key in ("hostname", "cpu_model"):
                    if (
                        ident.get(key) is not None
                        and host.get(key) is not None
                        and ident[key] != host[key]
                    ):
                        problems.append(
                            (
                                f"node {node}: {path} has {key} {host[key]!r}, the "
                                f"session's identity {ident[key]!r}",
                                [path],
                            )
                        )
                if known:
                    for index, ids in sorted(_gpu_ids(host).items(), key=str):
                        for k in ("uuid", "serial"):
                            if ids.get(k) is not None and str(ids[k]) not in known:
                                problems.append(
                                    (
                                        f"node {node}: {path} GPU {index} {k} "
                                        f"{ids[k]} is not in the session's identity",
                                        [path],
                                    )
                                )
    if identity:
        for node in sorted(set(nodes) - set(identity)):
            problems.append((f"node {node}: records, but no hardware identity in the session", []))
    _report(
        v,
        "consistency",
        "consistency.host-facts",
        problems,
        f"host facts agree in every record of each of {len(nodes)} node(s)"
        + (" and with the session's hardware identity" if identity else ""),
    )


#: The per-GPU configuration a record's ``host.gpus[]`` and the identity's
#: ``config.gpus[]`` both hold (``mig_mode`` and ``vbios`` are the identity's only).
CONFIG_GPU_FACTS = (
    "power_limit_w",
    "sm_clock_app_mhz",
    "mem_clock_app_mhz",
    "ecc_mode",
    "persistence_mode",
    "driver",
)


def _session_identity(b, sid, node):
    """The identity session ``sid`` recorded for ``node`` (the session file's, else its
    plan's), None when it recorded none."""
    for s in _list((b.session or {}).get("sessions")):
        if isinstance(s, dict) and s.get("id") == sid and isinstance(s.get("identity"), dict):
            ident = s["identity"].get(node)
            if isinstance(ident, dict):
                return ident
    ident = ((b.plans.get(sid) or {}).get("identity") or {}) if isinstance(sid, str) else {}
    found = ident.get(node) if isinstance(ident, dict) else None
    return found if isinstance(found, dict) else None


def _governors(value):
    """The set of governors of a record's ``cpu_governor`` (``"a"`` or ``"mixed: a, b"``)."""
    if not isinstance(value, str) or not value:
        return set()
    return {g.strip() for g in value.removeprefix("mixed:").split(",") if g.strip()}


def config_problems(host, config):
    """What a record's ``host`` facts say against its node's identity ``config``
    (``{"node", "gpus"}``, :func:`milarun.host.identity.config`), where both hold the
    value: the kernel, the CPU governors (the record's, of its own CPUs, among the
    node's) and per GPU (by UUID) :data:`CONFIG_GPU_FACTS`. A list of lines."""
    out = []
    node = config.get("node") if isinstance(config.get("node"), dict) else {}
    kernel = host.get("kernel")
    if node.get("kernel") is not None and kernel is not None and kernel != node["kernel"]:
        out.append(f"kernel {kernel!r}, the identity's {node['kernel']!r}")
    mine, theirs = _governors(host.get("cpu_governor")), node.get("cpu_governors")
    if mine and isinstance(theirs, list) and theirs and not mine <= set(map(str, theirs)):
        out.append(
            f"CPU governor {host.get('cpu_governor')!r}, the identity's "
            f"{', '.join(map(str, theirs))}"
        )
    by_uuid = {
        g["uuid"]: g
        for g in _list(config.get("gpus"))
        if isinstance(g, dict) and isinstance(g.get("uuid"), str) and g["uuid"]
    }
    for g in _list(host.get("gpus")):
        ref = by_uuid.get(g.get("uuid")) if isinstance(g, dict) else None
        if ref is None:
            continue
        for key in CONFIG_GPU_FACTS:
            if g.get(key) is not None and ref.get(key) is not None and g[key] != ref[key]:
                out.append(
                    f"GPU {g.get('index')} ({g['uuid']}) {key} {g[key]!r}, the "
                    f"identity's {ref[key]!r}"
                )
    return out


def _config_clause(b, v):
    """``consistency.config``: every record's host and GPU facts agree with the
    configuration in its node's identity, as its session recorded it, where both hold
    the value (:func:`config_problems`)."""
    fallback = _identity(b)
    problems, compared = [], 0
    for path, rec in sorted(b.records.items()):
        host = rec.get("host") if isinstance(rec.get("host"), dict) else {}
        node = node_of(rec) or host.get("hostname")
        entry = b.last.get(path) or {}
        ident = _session_identity(b, entry.get("session"), node) or fallback.get(node)
        config = ident.get("config") if isinstance(ident, dict) else None
        if not isinstance(config, dict):
            continue
        compared += 1
        for line in config_problems(host, config):
            problems.append((f"node {node}: {path}: {line}", [path]))
    _report(
        v,
        "consistency",
        "consistency.config",
        problems,
        f"the configuration in {compared} record(s) agrees with its node's identity"
        if compared
        else "no identity records a configuration (identity version 1): nothing to compare",
    )


# --- performance -------------------------------------------------------------------------------


def check_performance(b, v, rules, reference=None):
    """The performance clauses of ``rules``, on the statistics recomputed from the records;
    ``reference``: the convergence reference of the rules' ``convergence`` clause
    (:func:`milarun.verify.convergence.load_reference`), or None."""
    tests = ((b.summary or {}).get("tests")) or {}
    if b.entries is None or not tests:
        v.add(
            "performance",
            "performance.unchecked",
            False,
            "not checked: no statistics recomputed from the records",
        )
        return
    for group, floor in sorted((rules.get("min_throughput") or {}).items()):
        test = tests.get(group)
        train = (test or {}).get("train") or {}
        if test is None or not train.get("n"):
            v.add(
                "performance",
                "performance.min-throughput",
                False,
                f"{group}: no successful result with a rate (the rules ask >= {floor:g} items/s)",
            )
            continue
        ci = mean_interval(train["n"], train["mean"], train["std"])
        if ci is None:
            v.add(
                "performance",
                "performance.min-throughput",
                False,
                f"{group}: {train['n']} result(s): no confidence interval (needs 2); mean "
                f"{train['mean']:.4g} items/s, the rules ask a lower bound >= {floor:g}",
            )
            continue
        v.add(
            "performance",
            "performance.min-throughput",
            ci.lo >= floor,
            f"{group}: mean {train['mean']:.4g} items/s, {LEVEL:.0%} interval "
            f"[{ci.lo:.4g}, {ci.hi:.4g}] (n={train['n']}); lower bound "
            f"{'>=' if ci.lo >= floor else '<'} {floor:g}",
        )
    if "max_failure_rate" in rules:
        n = sum(t.get("n") or 0 for t in tests.values())
        failed = sum(t.get("failures") or 0 for t in tests.values())
        rate = failed / n if n else 1.0
        worst = sorted(((t.get("failures") or 0, g) for g, t in tests.items()), reverse=True)
        v.add(
            "performance",
            "performance.failure-rate",
            rate <= rules["max_failure_rate"],
            f"{failed} of {n} result(s) failed ({rate:.1%}; the rules allow "
            f"{rules['max_failure_rate']:.1%})"
            + (f"; most in {worst[0][1]} ({worst[0][0]})" if failed else ""),
        )
    if "max_node_spread" in rules:
        _spread_clause(tests, v, rules["max_node_spread"])
    if "max_node_power_w" in rules:
        _power_clause(tests, v, rules["max_node_power_w"])
    if "max_gpu_health_errors" in rules:
        _health_clauses(b, tests, v, rules["max_gpu_health_errors"])
    if "fleet" in rules:
        _fleet_clauses(tests, v, rules["fleet"])
    if "fabric" in rules:
        _fabric_clauses(b, v, rules["fabric"])
    if rules.get("acceptance"):
        hosts = (b.summary or {}).get("hosts")
        for c in acceptance_verdict(rules["acceptance"], tests, hosts):
            v.add("performance", "performance.acceptance", c["ok"], f"{c['clause']}: {c['detail']}")
    for group, rule in sorted(((rules.get("serving") or {}).get("tests") or {}).items()):
        check_serving(b, v, group, rule)
    if reference is not None:
        check_convergence(b, v, rules["convergence"], reference)


def _spread_clause(tests, v, limit):
    compared = 0
    for group, test in sorted(tests.items()):
        means = {
            n: d["mean"]
            for n, d in (test.get("pernode") or {}).items()
            if isinstance(d, dict) and _num(d.get("mean"))
        }
        if len(means) < 2:
            continue
        compared += 1
        hi, lo = max(means.values()), min(means.values())
        spread = (hi - lo) / hi if hi > 0 else 0.0
        slow = min(means, key=lambda node: means[node])
        v.add(
            "performance",
            "performance.node-spread",
            spread <= limit,
            f"{group}: node means spread {spread:.1%} (slowest {slow}; the rules allow "
            f"{limit:.1%})",
        )
    if not compared:
        v.add(
            "performance",
            "performance.node-spread",
            True,
            "one node per test: no node-to-node spread",
        )


def _health_clauses(b, tests, v, limit):
    """``performance.gpu-health``: at most ``limit`` ``gpu-health-error`` findings over the
    bundle (the summary's validation flags, recomputed from the records' ``health``:
    :mod:`milarun.host.health`); ``performance.gpu-health-read``: every record holds its
    GPUs' readings (a counter not read is unknown, never healthy)."""
    errors = [
        (group, f)
        for group, test in sorted(tests.items())
        for f in test.get("validation_flags") or []
        if f.get("check") == "gpu-health-error"
    ]
    shown = "; ".join(
        f"{group} device {f.get('device')} GPU {f.get('gpu')}: {f.get('message')}"
        for group, f in errors[:5]
    )
    v.add(
        "performance",
        "performance.gpu-health",
        len(errors) <= limit,
        f"{len(errors)} GPU health error(s) during the launches (the rules allow {limit})"
        + (f": {shown}" if shown else ""),
    )
    unread = sorted(
        path
        for path, rec in b.records.items()
        if not (isinstance(rec.get("health"), dict) and rec["health"].get("available") is True)
    )
    v.add(
        "performance",
        "performance.gpu-health-read",
        not unread,
        f"{len(unread)} record(s) without their GPUs' health readings (unknown, not healthy)"
        if unread
        else f"every record ({len(b.records)}) holds its GPUs' health readings",
        unread[:20],
    )


def _fabric_clauses(b, v, rule):
    """``performance.fabric``: per collectives group with node pairs (``--groups pairs``),
    the pairs' verdict (:func:`milarun.analysis.acceptance.fabric_figures`, recomputed from
    the records at the rules' ``pair_tolerance``) names no bad node, no bad link, no slow
    pair it cannot place and no pair without a figure, over 3 nodes or more; no such group
    among the records fails (the rule asks for the evidence)."""
    tolerance = rule.get("pair_tolerance", fabric.TOLERANCE)
    groups: dict = {}
    for _, rec in sorted(b.records.items()):
        rows = rec.get("collectives") if rec.get("success") else None
        if isinstance(rows, list) and any(
            isinstance(r, dict) and r.get("group") == "pairs" for r in rows
        ):
            groups.setdefault(group_name(rec), []).append(rec)
    if not groups:
        v.add(
            "performance",
            "performance.fabric",
            False,
            "no successful collectives record with node pairs (--groups pairs) among the "
            "records: the fabric is not shown",
        )
    for group, recs in sorted(groups.items()):
        verdict = (fabric_figures(recs, tolerance) or {}).get("pairs") or fabric.localise([])
        faults = (
            verdict["bad_nodes"]
            + [" <-> ".join(p) for p in verdict["bad_links"] + verdict["unresolved"]]
            + [" <-> ".join(p) + " (no figure)" for p in verdict["unmeasured"]]
        )
        lines = fabric.verdict_lines(verdict)
        v.add(
            "performance",
            "performance.fabric",
            verdict["judged"] and not faults,
            f"{group}: " + "; ".join(line.removeprefix("fabric: ") for line in lines),
        )


#: Nodes named one by one in the fleet's send-back clause (the rest counted).
FLEET_LISTED = 20


def _fleet_clauses(tests, v, rule):
    """The fleet view (:func:`milarun.analysis.fleet.fleet_view`, on the statistics
    recomputed from the records): ``performance.fleet``, one clause per test with
    ``min_nodes`` nodes or more (its median, spread and the nodes outside), or one
    passing clause saying no test was judged; ``performance.fleet-send-back``: the nodes
    to send back (outside in a test, a GPU health error, every run of a test failed),
    each with its reasons."""
    fleet = fleet_view(
        tests,
        k=rule.get("k", FLEET_K),
        min_relative=rule.get("min_relative", FLEET_MIN_RELATIVE),
        min_nodes=rule.get("min_nodes", FLEET_MIN_NODES),
    )
    cut = f"z below -{fleet['k']:g} and more than {fleet['min_relative']:.0%} below the median"
    for t in fleet["tests"]:
        if not t["judged"]:
            continue
        out = [r for r in t["nodes"] if r["outside"]]
        head = (
            f"{t['test']}: {t['n']} nodes, median {t['median']:.4g} items/s, 1.4826 x MAD "
            f"{t['scaled_mad']:.4g}"
        )
        shown = ", ".join(
            f"{r['node']} {r['figure']:.4g} items/s ({r['relative']:+.1%}, z {r['z']:+.1f})"
            for r in out[:FLEET_LISTED]
        )
        more = f" and {len(out) - FLEET_LISTED} more" if len(out) > FLEET_LISTED else ""
        v.add(
            "performance",
            "performance.fleet",
            not out,
            f"{head}; outside ({cut}): {shown}{more}" if out else f"{head}; none outside ({cut})",
        )
    if not fleet["judged"]:
        most = max((t["n"] for t in fleet["tests"]), default=0)
        v.add(
            "performance",
            "performance.fleet",
            True,
            f"not judged: fewer than {fleet['min_nodes']} nodes in every test (most: {most})",
        )
    back = fleet["send_back"]
    listed = "; ".join(f"{s['node']}: {', '.join(s['reasons'])}" for s in back[:FLEET_LISTED])
    more = f"; and {len(back) - FLEET_LISTED} more" if len(back) > FLEET_LISTED else ""
    v.add(
        "performance",
        "performance.fleet-send-back",
        not back,
        f"{len(back)} of {len(fleet['nodes'])} node(s) to send back: {listed}{more}"
        if back
        else f"no node to send back of {len(fleet['nodes'])} (none outside the fleet, none "
        "with a GPU health error, none whose every run of a test failed)",
    )
    for note in fleet["notes"][:FLEET_LISTED]:
        v.add("performance", "performance.fleet", False, f"cannot judge: {note}")


def _power_clause(tests, v, limit):
    seen = 0
    for group, test in sorted(tests.items()):
        for node, d in sorted(((test.get("energy") or {}).get("pernode") or {}).items()):
            if not _num(d.get("power_w")):
                continue
            seen += 1
            v.add(
                "performance",
                "performance.node-power",
                d["power_w"] <= limit,
                f"{group} on {node}: {d['power_w']:.4g} W (the rules allow {limit:g} W)",
            )
    if not seen:
        v.add(
            "performance",
            "performance.node-power",
            False,
            f"no GPU power readings: the power envelope ({limit:g} W) cannot be checked",
        )


# --- serving (server-scenario tests) ------------------------------------------------------


def _serving_records(b, group):
    """``[(path, serving_load)]`` of the successful records of ``group`` that hold one,
    and ``[path]`` of those that do not."""
    held, lacking = [], []
    for path, rec in successful_records(b.records, group):
        load = rec.get("serving_load")
        if isinstance(load, dict):
            held.append((path, load))
        else:
            lacking.append(path)
    return held, lacking


def _rejudged(path, load, targets):
    """``(figures by level index, measured index or None, problems)`` of one record's
    ``serving_load``: every level recomputed at ``targets`` (the rules'); a level that
    cannot be is a problem naming the record and the key."""
    figures: dict = {}
    problems: list = []
    levels = load.get("levels")
    if not isinstance(levels, list):
        return figures, None, [(f"{path}: serving_load.levels: not a list", [path])]
    for i, lv in enumerate(levels):
        key = f"serving_load.levels[{i}]"
        try:
            if not isinstance(lv, dict):
                raise TypeError("not an object")
            figures[i] = (
                float(lv["value"]),
                level_figures(
                    lv["requests"],
                    lv["warmup"],
                    targets["ttft_s"],
                    targets["tpot_s"],
                    targets["percentile"],
                ),
            )
        except KeyError as exc:
            problems.append((f"{path}: {key}.{exc.args[0]}: missing", [path]))
        except (ValueError, TypeError) as exc:
            problems.append((f"{path}: {key}: {str(exc)[:200]}", [path]))
    cap = load.get("capacity")
    walked = cap.get("levels") if isinstance(cap, dict) else None
    walked = walked if isinstance(walked, list) else []
    measured = 0 if levels and 0 not in walked else None
    return figures, measured, problems


def check_serving(b, v, group, rule):
    """The ``serving`` rules of one server-scenario test group (docs/tender.md): every
    level of every successful record recomputed from its raw request timings at the
    rules' ``targets`` (:func:`milarun.measure.latency.level_figures`), then

    * ``performance.serving-records``: each level that cannot be recomputed, by record
      and key (and each record of the group without ``serving_load``);
    * ``performance.serving-goodput`` (``min_goodput_tokens_per_s``): the median over
      the records (one per server) of the measured level's goodput tokens/s; a record
      whose measured level is missing or malformed counts 0;
    * ``performance.serving-capacity`` (``min_capacity``): the median over the records
      of :func:`milarun.measure.capacity.capacity_of` of the capacity search's levels
      re-judged at the targets; a record without a search or without a passing load
      fails it;
    * ``performance.serving-consistency`` (``require_consistency``): every record's
      consistency check ran and passed.
    """
    targets = rule["targets"]
    bounds = (
        f"TTFT <= {targets['ttft_s']:g} s and TPOT <= {targets['tpot_s']:g} s at "
        f"p{targets['percentile']:g}"
    )
    held, lacking = _serving_records(b, group)
    if not held:
        v.add(
            "performance",
            "performance.serving-records",
            False,
            f"{group}: no successful record with serving_load (the rules judge its serving"
            f" at {bounds})",
        )
        return
    problems = [(f"{p}: serving_load: missing (a successful record)", [p]) for p in lacking]
    judged = []
    for path, load in held:
        figures, measured, found = _rejudged(path, load, targets)
        problems += found
        judged.append((path, load, figures, measured))
    _report(
        v,
        "performance",
        "performance.serving-records",
        problems,
        f"{group}: every load level of {len(held)} record(s) recomputed from its request "
        f"timings at {bounds}",
    )
    if "min_goodput_tokens_per_s" in rule:
        _goodput_clause(v, group, judged, rule["min_goodput_tokens_per_s"], bounds)
    if "min_capacity" in rule:
        _capacity_clause(v, group, judged, rule["min_capacity"], bounds)
    if rule.get("require_consistency"):
        _consistency_clause(v, group, judged)


def _goodput_clause(v, group, judged, floor, bounds):
    goodput = []
    for path, _, figures, measured in judged:
        fig = figures.get(measured) if measured is not None else None
        good = (fig[1].get("goodput_tokens_per_s") if fig else None) or 0.0
        goodput.append((good, path))
    median = statistics.median(g for g, _ in goodput)
    low, low_path = min(goodput)
    v.add(
        "performance",
        "performance.serving-goodput",
        median >= floor,
        f"{group}: measured level's goodput {median:.4g} tokens/s at {bounds} (median over "
        f"{len(goodput)} record(s), one per server; lowest {low:.4g} in {low_path}); the "
        f"rules ask >= {floor:g}",
        [low_path] if median < floor else [],
    )


def _capacity_clause(v, group, judged, floor, bounds):
    found, none = [], []
    kinds: set = set()
    for path, load, figures, _ in judged:
        cap = load.get("capacity")
        walked = cap.get("levels") if isinstance(cap, dict) else None
        if not isinstance(walked, list):
            none.append(f"{path} (no capacity search)")
            continue
        kinds.add(cap.get("kind"))
        steps = [
            (figures[i][0], bool(figures[i][1]["slo_met"]))
            for i in walked
            if isinstance(i, int) and i in figures
        ]
        capacity = capacity_of(steps)
        if capacity is None:
            none.append(f"{path} (no load met the targets)")
        else:
            found.append(capacity)
    units = {"rate": "requests/s", "concurrency": "concurrent requests"}
    unit = units.get(kinds.pop(), "(load)") if len(kinds) == 1 else "(load)"
    if none:
        v.add(
            "performance",
            "performance.serving-capacity",
            False,
            f"{group}: no capacity at {bounds} in "
            + "; ".join(none[:5])
            + (f" and {len(none) - 5} more" if len(none) > 5 else "")
            + f"; the rules ask >= {floor:g} {unit}",
        )
        return
    median = statistics.median(found)
    v.add(
        "performance",
        "performance.serving-capacity",
        median >= floor,
        f"{group}: capacity {median:g} {unit} at {bounds} (median over {len(found)} "
        f"record(s), each search's levels re-judged); the rules ask >= {floor:g}",
    )


def _consistency_clause(v, group, judged):
    problems = []
    for path, load, _, _ in judged:
        check = load.get("consistency")
        if not isinstance(check, dict) or "passed" not in check:
            why = check.get("skipped") if isinstance(check, dict) else None
            problems.append(
                (
                    f"{path}: no consistency check" + (f" (skipped: {why})"[:200] if why else ""),
                    [path],
                )
            )
        elif check["passed"] is not True:
            problems.append(
                (
                    f"{path}: consistency FAILED: the server's tokens differ from the same "
                    f"model run in-process ({check.get('matching')} of {check.get('prompts')} "
                    f"prompt(s) matched)",
                    [path],
                )
            )
    _report(
        v,
        "performance",
        "performance.serving-consistency",
        problems,
        f"{group}: the server's tokens matched the in-process model in all {len(judged)} record(s)",
    )


__all__ = [
    "Bundle",
    "check_serving",
    "OVERRIDES",
    "after_head_problems",
    "check_compliance",
    "check_completeness",
    "check_consistency",
    "check_integrity",
    "check_performance",
    "entry_kind_problems",
    "find_overrides",
    "verify_bundle",
]
