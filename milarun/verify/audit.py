"""Audit reruns on the delivered hardware (the buyer's side, docs/tender.md).

Two steps, both reading the vendor's bundle as data (the strict bounded
readers; nothing the bundle names is imported or run):

* :func:`plan_audit` (``milarun audit plan``): after delivery, the buyer picks K
  of the vendor's successful launches at random with a seed of their own
  (``random.Random(seed).sample`` over the launches sorted by name, run and
  device: the same bundle and seed always pick the same launches) and writes a
  profile that reruns exactly those tests, and the audit plan (bundle head,
  seed, K, the chosen launches with their records' paths and SHA-256) next to
  it. The plan is also embedded in the profile as its ``"_audit"`` template
  entry (a ``_`` entry never runs), so the rerun's folder carries the plan it
  was run from in its own profile copy.
* :func:`check_audit` (``milarun audit check``): the rerun's hardware identity
  must be the bundle's, its configuration (the identity's ``config``: power limits,
  clocks, ECC, MIG and persistence modes, driver, VBIOS, kernel, CPU governors,
  container image) the bid's (:func:`compare_config`, one failed ``audit.config``
  clause per difference), and each chosen launch's throughput must be reproduced
  by the rerun of its test on the same device.

**A per-GPU launch reruns as its whole test.** The profile language cannot pin
one device, and a per-GPU test's rates were measured with every device of the
node training at once (their shared CPUs, memory bandwidth, PCIe switches and
power budget); a launch picked on device 3 is compared with the rerun's record
on device 3 of the same whole-test rerun. So is every other plan type: its
record is matched by job name and device label.

**"Reproduced".** For one launch, the vendor's and the rerun's records each
give the rates of their steady-state samples (:func:`milarun.measure.stats.steady_state`
chooses them; each sample's rate is ``count / (end - start)``, items/s),
summarised as ``(n, mean, std)`` by :func:`milarun.measure.stats.describe`. The
launch is **not reproduced** when the rerun's mean is significantly below
``(1 - tolerance)`` times the vendor's: Welch's two-sample t-test
(:func:`milarun.measure.confidence.welch_test`, the test of ``milarun report
--compare``) of the rerun's samples against the vendor's samples scaled by
``1 - tolerance`` (scaling a sample scales its mean and std), significant at
the report's level (95 %, two-tailed). A rerun faster than the claim is
reproduced: the claim is what the buyer was promised, at least. With fewer than
two samples on a side (noise unknown) it is reproduced when the ratio is at
least ``1 - tolerance``. Shown with it: the ratio of the steady-state rates
(rerun / vendor) and its interval (:func:`milarun.measure.confidence.geomean_interval`,
delta method on the log ratio), and the vendor's interval of its mean sample
rate (:func:`milarun.measure.confidence.mean_interval`).
"""

import datetime
import hashlib
import math
import os
import random
import re
from pathlib import Path

from .. import __version__
from ..analysis.summary import device_key, node_of
from ..errors import MilarunError, ResultFormatError
from ..formats import entrypoint
from ..formats.jsonfile import read_bytes, read_json
from ..formats.manifest import (
    check_chain,
    file_digest,
    head_of,
    manifest_path,
    read_manifest,
    relative,
)
from ..formats.outfile import UnsafeFileError
from ..formats.rules import read_rules
from ..formats.store import iter_results, load_result, write_json_atomic
from ..launcher.session import meta_dir, read_session
from ..measure import confidence, stats
from ..profile.language import load_profile
from .check import after_head_problems, entry_kind_problems
from .verdict import Verdict

#: ``format`` and ``version`` of the audit plan.
AUDIT_FORMAT = "milarun-audit-plan"
AUDIT_VERSION = 1
#: The profile entry that carries the audit plan (a ``_`` template: never run).
AUDIT_ENTRY = "_audit"
#: Default tolerance: a rerun more than 5 % slower than the claim, significantly, fails.
DEFAULT_TOLERANCE = 0.05
#: The GPU fields an identity compares, and the DMI ones (where both sides read them).
GPU_KEYS = ("uuid", "serial")


class AuditError(MilarunError):
    """Bad input to ``milarun audit``: one line naming the file and the key (exit 2)."""


# --- reading the vendor's bundle ---------------------------------------------------------


def read_chain(outdir):
    """The manifest entries of bundle ``outdir``, the chain checked.

    Raises:
        AuditError: ``outdir`` is not a folder, has no manifest, or its chain is
            broken (the first problem, one line).
        ManifestError: the manifest cannot be read (its file, line and key).
    """
    outdir = Path(outdir)
    if not outdir.is_dir():
        raise AuditError("not a results folder", path=outdir)
    path = manifest_path(outdir)
    if not os.path.lexists(path):
        raise AuditError("no manifest (.milarun/manifest.jsonl): not a milarun bundle", path=outdir)
    entries = read_manifest(path)
    problems = check_chain(entries)
    if problems:
        raise AuditError(
            f"{problems[0]}; a broken chain is not audited (milarun verify names every problem)",
            path=path,
        )
    if not entries:
        raise AuditError("the manifest is empty", path=path)
    return entries


def launch_key(launch):
    """``(name, run, device)`` of a manifest entry's ``launch``, or None when malformed."""
    if not isinstance(launch, dict):
        return None
    name, run, device = launch.get("name"), launch.get("run"), launch.get("device")
    if (
        isinstance(name, str)
        and isinstance(run, int)
        and not isinstance(run, bool)
        and isinstance(device, str)
    ):
        return name, run, device
    return None


def successful_launches(entries):
    """The launches with a successful record in the chain: ``{(name, run, device): entry}``
    (the last such entry of a launch), sorted by name, run and device."""
    found = {}
    for entry in entries:
        key = launch_key(entry.get("launch")) if entry.get("kind") == "record" else None
        if key is not None and entry.get("success") is True:
            found[key] = entry
    return dict(sorted(found.items(), key=lambda kv: (kv[0][0], kv[0][1], device_key(kv[0][2]))))


def _matches_entry(outdir, entry):
    """None when the file of manifest ``entry`` is the one it names, else why not."""
    path = Path(outdir) / entry["path"]
    try:  # a folder on the way may be a link: nothing outside the bundle is read
        relative(outdir, path)
    except (ValueError, OSError):
        return "reached through a symbolic link to outside the folder (not read)"
    try:
        sha, size = file_digest(path)
    except FileNotFoundError:
        return "missing"
    except (OSError, UnsafeFileError) as exc:
        return f"cannot be read ({getattr(exc, 'strerror', None) or exc})"
    if sha != entry["sha256"] or size != entry["bytes"]:
        return (
            f"changed since manifest entry {entry['seq']} (SHA-256 {sha[:12]}…, "
            f"entered {entry['sha256'][:12]}…)"
        )
    return None


def _last_entry(entries, kind, path=None):
    found = [e for e in entries if e.get("kind") == kind and (path is None or e["path"] == path)]
    return found[-1] if found else None


def _sha256_file(path, error_cls, what):
    return hashlib.sha256(read_bytes(path, error_cls=error_cls, what=what)).hexdigest()


# --- planning ----------------------------------------------------------------------------


def plan_path(profile_path):
    """Where the audit plan goes next to the audit profile: ``X.json`` → ``X.plan.json``."""
    p = Path(profile_path)
    stem = p.name[:-5] if p.name.endswith(".json") else p.name
    return p.with_name(stem + ".plan.json")


def _vendor_invocation(outdir, entries):
    """The vendor's session file (checked against its last manifest entry) or AuditError."""
    session = read_session(outdir)
    if session is None:
        raise AuditError("no session file (.milarun/session.json)", path=outdir)
    entry = _last_entry(entries, "session", ".milarun/session.json")
    problem = "not in the manifest" if entry is None else _matches_entry(outdir, entry)
    if problem:
        raise AuditError(
            f"the session file is {problem}; run milarun verify",
            path=meta_dir(outdir) / "session.json",
        )
    return session


def suggested_command(profile_path, invocation):
    """The ``milarun jobs`` command line (argv) that reruns the audit profile with the
    vendor's options: ``--cpu-slots``, ``--no-cgexec``, ``--timeout`` and the ``--``
    arguments the vendor's session used (an override the buyer did not want is for
    ``milarun verify`` to report; the rerun repeats it, so that the commands compare)."""
    argv = ["milarun", "jobs", str(profile_path), "-o", "AUDITDIR", "-d", "DATAROOT"]
    inv = invocation if isinstance(invocation, dict) else {}
    if isinstance(inv.get("cpu_slots"), int) and not isinstance(inv.get("cpu_slots"), bool):
        argv += ["--cpu-slots", str(inv["cpu_slots"])]
    if inv.get("no_cgexec") is True:
        argv.append("--no-cgexec")
    if stats.finite(inv.get("timeout")):
        argv += ["--timeout", f"{inv['timeout']:g}"]
    extra = inv.get("extra_args")
    if isinstance(extra, list) and extra and all(isinstance(a, str) for a in extra):
        argv += ["--", *extra]
    return argv


def plan_audit(
    outdir, sample, seed, out, rules=None, tolerance=DEFAULT_TOLERANCE, expect_head=None
):
    """Pick ``sample`` launches of bundle ``outdir`` at random and write the audit profile
    ``out`` and its plan (:func:`plan_path`).

    Args:
        outdir: the vendor's results folder.
        sample: K, how many launches (1 to the number of successful launches).
        seed: the buyer's seed (an int), recorded in the plan.
        out: the audit profile to write (its stem is the rerun's suite name).
        rules: the tender's rules file, whose SHA-256 is recorded (optional).
        tolerance: fraction in [0, 1): how much slower than the claim a rerun may be
            before the Welch test may fail it (see the module's docstring).
        expect_head: the chain head (64 hex digits) the bidder sent; the plan is refused
            when the bundle's head is another, and records whether it was pinned.

    Returns:
        the plan (dict), also written to ``plan_path(out)`` and embedded in ``out``.

    Raises:
        AuditError: a bad K, seed, tolerance or ``expect_head``; a bundle whose chain head
            is not ``expect_head``; a broken chain; a chosen record that is
            not the one the chain entered; a job definition that names something other
            than a milarun workload, differs between the records of one test, or is not
            the one of the (single-file) profile copy its session chained.
        ManifestError, ResultFormatError, SetupError, ProfileError: an unreadable
            manifest, record or session file (one line naming the file and key).
    """
    if not isinstance(sample, int) or isinstance(sample, bool) or sample <= 0:
        raise AuditError(f"--sample must be a whole number >= 1, got {sample!r}", key="sample")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise AuditError(f"--seed must be a whole number, got {seed!r}", key="seed")
    if not (stats.finite(tolerance) and 0 <= tolerance < 1):
        raise AuditError(
            f"--tolerance must be a fraction in [0, 1), got {tolerance!r}", key="tolerance"
        )
    if expect_head is not None:
        expect_head = str(expect_head).strip().lower()
        if not re.fullmatch(r"[0-9a-f]{64}", expect_head):
            raise AuditError(
                f"--expect-head must be 64 hex digits, not {expect_head[:80]!r}",
                key="expect_head",
            )
    outdir = Path(outdir)
    entries = read_chain(outdir)
    head = head_of(entries)
    if expect_head is not None and head != expect_head:
        raise AuditError(
            f"the bundle's chain head is {head}, not {expect_head} (--expect-head): this "
            "is not the bundle that was bid; nothing planned",
            path=outdir,
            key="expect_head",
        )
    session = _vendor_invocation(outdir, entries)
    launches = successful_launches(entries)
    if sample > len(launches):
        raise AuditError(
            f"--sample {sample} is more than the {len(launches)} launch(es) with a "
            "successful record in the chain",
            path=outdir,
            key="sample",
        )
    rules_info = None
    if rules is not None:
        read_rules(rules)  # the schema verify and tender read it with (RulesError: exit 2)
        rules_info = {"path": str(rules), "sha256": _sha256_file(rules, AuditError, "rules file")}
    keys = random.Random(seed).sample(list(launches), sample)
    order = {k: i for i, k in enumerate(launches)}
    chosen: list = []
    jobs: dict = {}
    profiles: dict = {}
    for key in sorted(keys, key=lambda k: order[k]):
        entry = launches[key]
        path = outdir / entry["path"]
        problem = _matches_entry(outdir, entry)
        if problem:
            raise AuditError(
                f"the record of {key[0]} J{key[1]} on device {key[2]} is {problem}; "
                "run milarun verify",
                path=path,
            )
        record = load_result(path)
        job_name, job = record.get("job_name"), record.get("job")
        if not isinstance(job_name, str) or not isinstance(job, dict):
            raise AuditError("no job_name or job definition to rerun", path=path, key="job")
        spec = job.get("experiment")
        if not entrypoint.is_shipped(spec):
            raise AuditError(
                f"experiment {str(spec)[:80]!r} is not a workload of milarun.models: "
                "an audit reruns nothing else",
                path=path,
                key="job.experiment",
            )
        defs = profiles.setdefault(
            entry["session"], _profile_definitions(outdir, entries, entry["session"])
        )
        if defs is not None and defs.get(job_name) != job:
            raise AuditError(
                f"test {job_name!r}: the record's job definition is not the one of "
                "the profile its session ran (what the rerun would run: prepare "
                "commands too); run milarun verify",
                path=path,
                key="job",
            )
        if job_name in jobs and jobs[job_name] != _in_argv_order(
            job, (record.get("call") or {}).get("argv")
        ):
            raise AuditError(
                f"test {job_name!r} has another definition here than in an earlier "
                "record of the bundle; run milarun verify",
                path=path,
                key="job",
            )
        job = _in_argv_order(job, (record.get("call") or {}).get("argv"))
        jobs[job_name] = job
        chosen.append(
            {
                "name": key[0],
                "job": job_name,
                "run": key[1],
                "device": key[2],
                "node": _node_of(record),
                "session": entry["session"],
                "record": entry["path"],
                "sha256": entry["sha256"],
                "seq": entry["seq"],
            }
        )
    plan = {
        "format": AUDIT_FORMAT,
        "version": AUDIT_VERSION,
        "bundle": str(outdir.resolve()),
        "head": head,
        "pinned": expect_head is not None,
        "seed": seed,
        "sample": sample,
        "launches": len(launches),
        "tolerance": tolerance,
        "rules": rules_info,
        "profiles": [
            {"path": e["path"], "sha256": e["sha256"]} for e in entries if e["kind"] == "profile"
        ],
        "vendor": {
            k: session["invocation"].get(k)
            for k in (
                "suite",
                "extra_args",
                "cpu_slots",
                "no_cgexec",
                "timeout",
                "devices",
                "nodes",
            )
        },
        "chosen": chosen,
        # shell commands and wrappers the rerun will run, from the vendor's records: to read
        "review": {
            name: {k: job[k] for k in ("prepare", "exec_prefix") if job.get(k)}
            for name, job in jobs.items()
            if job.get("prepare") or job.get("exec_prefix")
        },
        "command": suggested_command(out, session["invocation"]),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "milarun_version": __version__,
    }
    profile = {AUDIT_ENTRY: plan, **jobs}
    write_json_atomic(out, profile)
    try:  # the buyer runs it with milarun jobs: refuse one that would not load
        load_profile(out)
    except MilarunError:
        os.unlink(out)
        raise
    write_json_atomic(plan_path(out), plan)
    return plan


def _profile_definitions(outdir, entries, session_id):
    """``{job name: definition}`` of session ``session_id``'s chained profile copy, or None
    when the profile had several files (its copies are not re-read as one profile).

    Raises:
        AuditError: the copy is missing or not the file its entry hashed.
        ProfileError: it cannot be read as a profile.
    """
    copies = [e for e in entries if e["kind"] == "profile" and e["session"] == session_id]
    if len(copies) > 1:
        return None
    if not copies:
        raise AuditError(
            f"session {session_id} has no profile copy in the chain; run milarun verify",
            path=outdir,
        )
    problem = _matches_entry(outdir, copies[0])
    if problem:
        raise AuditError(
            f"the profile copy is {problem}; run milarun verify",
            path=Path(outdir) / copies[0]["path"],
        )
    return {job.name: job.definition for job in load_profile(Path(outdir) / copies[0]["path"])}


def _in_argv_order(job, argv):
    """``job`` with its ``arguments`` in the order of the command line ``argv`` the vendor
    ran (a record stores its job with sorted keys, but a profile runs its arguments in the
    order written); flags not on the command line (``false``) keep their place at the end."""
    args = job.get("arguments")
    if not isinstance(args, dict) or not isinstance(argv, list):
        return job
    first: dict = {}
    for i, word in enumerate(argv):
        if isinstance(word, str):
            first.setdefault(word, i)
    end = len(argv)

    def where(flag):
        return first.get(flag if flag.startswith("-") else f"--{flag}", end)

    ordered = dict(sorted(args.items(), key=lambda kv: where(kv[0])))
    return {**job, "arguments": ordered}


def _node_of(record):
    return node_of(record)


# --- checking ----------------------------------------------------------------------------


def read_audit_plan(auditdir):
    """The audit plan the rerun in ``auditdir`` ran: the ``_audit`` entry of its profile
    copy (``.milarun/profile-<session>/0-*``), read strictly and checked for its shape.

    Raises:
        AuditError: no session, no profile copy, no ``_audit`` entry, or a malformed one.
    """
    auditdir = Path(auditdir)
    if not auditdir.is_dir():
        raise AuditError("not a results folder", path=auditdir)
    session = read_session(auditdir)
    if session is None:
        raise AuditError(
            "no milarun session here (.milarun/session.json): run the audit "
            "profile with milarun jobs first",
            path=auditdir,
        )
    plan, where = None, None
    for s in session["sessions"]:
        sid = s.get("id") if isinstance(s, dict) else None
        folder = meta_dir(auditdir) / f"profile-{sid}"
        if not isinstance(sid, str) or not folder.is_dir() or folder.is_symlink():
            continue
        for copy in sorted(folder.glob("0-*")):
            data = read_json(copy, error_cls=AuditError, what="profile copy")
            if isinstance(data, dict) and AUDIT_ENTRY in data:
                if plan is not None and data[AUDIT_ENTRY] != plan:
                    raise AuditError(
                        "the sessions of this folder ran different audit plans",
                        path=copy,
                        key=AUDIT_ENTRY,
                    )
                plan, where = data[AUDIT_ENTRY], copy
    if plan is None:
        raise AuditError(
            "was not run from an audit profile (no '_audit' entry in its "
            "profile copy): run the profile milarun audit plan wrote",
            path=auditdir,
        )
    _check_plan(plan, where)
    return plan, session


def _check_plan(plan, path):
    def need(cond, key, what):
        if not cond:
            raise AuditError(what, path=path, key=f"{AUDIT_ENTRY}.{key}")

    need(isinstance(plan, dict), "", "must be an object")
    need(plan.get("format") == AUDIT_FORMAT, "format", f"must be {AUDIT_FORMAT!r}")
    need(
        plan.get("version") == AUDIT_VERSION,
        "version",
        f"version {plan.get('version')!r} is not supported",
    )
    need(isinstance(plan.get("head"), str), "head", "must be a string")
    tol = plan.get("tolerance")
    need(stats.finite(tol) and 0 <= tol < 1, "tolerance", "must be a fraction in [0, 1)")
    need(
        isinstance(plan.get("chosen"), list) and plan["chosen"],
        "chosen",
        "must be a non-empty list",
    )
    for i, c in enumerate(plan["chosen"]):
        need(isinstance(c, dict), f"chosen.{i}", "must be an object")
        for key, kind in (
            ("name", str),
            ("job", str),
            ("run", int),
            ("device", str),
            ("session", str),
            ("record", str),
            ("sha256", str),
        ):
            need(
                isinstance(c.get(key), kind) and not isinstance(c.get(key), bool),
                f"chosen.{i}.{key}",
                f"must be {kind.__name__}",
            )


def sample_stats(record):
    """``(rate, (n, mean, std))`` of a record's steady state: its steady-state throughput
    (items/s, :func:`milarun.measure.stats.steady_state`) and the ``describe`` statistics of
    its chosen samples' rates ``count / (end - start)`` (items/s).

    Raises:
        ValueError: no samples, or samples the steady-state rule refuses.
    """
    timings = record.get("timings") if isinstance(record, dict) else None
    train = timings.get("train") if isinstance(timings, dict) else None
    samples = train.get("samples") if isinstance(train, dict) else None
    if not isinstance(samples, list):
        raise ValueError("no timings.train.samples")
    rate, chosen, _ = stats.steady_state(samples)
    if not rate:
        raise ValueError("no steady-state rate")
    values = [s["count"] / (s["end"] - s["start"]) for s in chosen if s["end"] > s["start"]]
    d = stats.describe(values)
    return rate, (d["n"], d["mean"], d["std"])


def compare_rates(vendor, rerun, tolerance=DEFAULT_TOLERANCE):
    """Whether a rerun reproduces a vendor's launch (the rule: the module's docstring).

    Args:
        vendor, rerun: ``(rate, (n, mean, std))`` of :func:`sample_stats` (items/s).
        tolerance: fraction in [0, 1).

    Returns:
        dict: ``reproduced`` (bool), ``ratio`` (rerun rate / vendor rate), ``ratio_ci``
        (``[lo, hi]`` or None), ``vendor_ci`` (``[lo, hi]`` of the vendor's mean sample
        rate, items/s, or None), ``t`` and ``df`` (Welch, None when the noise is unknown),
        ``basis`` (``"welch"`` or ``"noise unknown"``).
    """
    (v_rate, v), (r_rate, r) = vendor, rerun
    ratio = r_rate / v_rate
    keep = 1.0 - tolerance
    scaled = (v[0], v[1] * keep, v[2] * keep)
    test = confidence.welch_test(r, scaled)
    if test is None:
        reproduced, basis = ratio >= keep, "noise unknown"
    else:
        reproduced, basis = not (test.significant and r[1] < scaled[1]), "welch"
    ci = confidence.geomean_interval(ratio, [(1.0, [r, v])])
    vci = confidence.mean_interval(*v)
    return {
        "reproduced": reproduced,
        "ratio": ratio,
        "ratio_ci": [ci.lo, ci.hi] if ci else None,
        "vendor_ci": [vci.lo, vci.hi] if vci else None,
        "t": None if test is None else (test.t if math.isfinite(test.t) else None),
        "df": None if test is None else test.df,
        "basis": basis,
    }


def identity_of(session, session_id, node):
    """The hardware identity a session file recorded for ``node`` (None when not recorded):
    ``sessions[i]["identity"][node]`` of the session ``session_id``; when ``node`` is not
    there and the session recorded one node only, that node's."""
    for s in session.get("sessions", []) if isinstance(session, dict) else []:
        if not isinstance(s, dict) or (session_id is not None and s.get("id") != session_id):
            continue
        ident = s.get("identity")
        if not isinstance(ident, dict) or not ident:
            continue
        if node in ident and isinstance(ident[node], dict):
            return ident[node]
        if len(ident) == 1:
            only = next(iter(ident.values()))
            return only if isinstance(only, dict) else None
    return None


def recorded_identity(folder, session, session_id, node, entries=None):
    """The identity of ``node`` that session ``session_id`` of ``folder`` recorded:
    :func:`identity_of` its session file, else the ``identity`` of its plan file
    (``.milarun/plan-<session>.json``, where :class:`milarun.launcher.chain.SessionChain`
    may put it; read strictly, and with ``entries``, only when it is the file the chain
    entered). None when neither has one."""
    found = identity_of(session, session_id, node)
    if found is not None or not isinstance(session_id, str):
        return found
    rel = f".milarun/plan-{session_id}.json"
    path = Path(folder) / rel
    if not path.is_file():
        return None
    if entries is not None:
        entry = _last_entry(entries, "plan", rel)
        if entry is None or _matches_entry(folder, entry):
            return None
    try:
        plan = read_json(path, error_cls=AuditError, what="plan file")
    except AuditError:
        return None
    ident = plan.get("identity") if isinstance(plan, dict) else None
    return identity_of({"sessions": [{"id": session_id, "identity": ident}]}, session_id, node)


def _gpu_values(ident, key):
    gpus = ident.get("gpus")
    return (
        {g[key] for g in gpus if isinstance(g, dict) and isinstance(g.get(key), str) and g[key]}
        if isinstance(gpus, list)
        else set()
    )


def _str_values(mapping):
    return (
        {k: v for k, v in mapping.items() if isinstance(v, str) and v.strip()}
        if isinstance(mapping, dict)
        else {}
    )


def _show(values):
    return ", ".join(sorted(values)) or "none"


def compare_identity(vendor, rerun):
    """``(ok, detail)``: whether two node identities are one machine.

    GPUs decide when either side lists any: the sets of UUIDs and of serial numbers must
    be equal (where both sides read them). DMI serials and UUID (``dmi``) must be equal
    where both sides read them. With neither GPUs nor a DMI value on both sides, the CPU
    model must be equal and the two must share a MAC address. A side without an identity
    fails: "identity not recorded".
    """
    if vendor is None or rerun is None:
        side = "the bundle" if vendor is None else "the rerun"
        return False, f"identity not recorded in {side}"
    problems, matched = [], []
    for key in GPU_KEYS:
        a, b = _gpu_values(vendor, key), _gpu_values(rerun, key)
        if a or b:
            if a != b:
                problems.append(f"GPU {key}s differ: bundle {_show(a)}; rerun {_show(b)}")
            else:
                matched.append(f"{len(a)} GPU {key}s")
    dv, dr = _str_values(vendor.get("dmi")), _str_values(rerun.get("dmi"))
    for key in sorted(set(dv) & set(dr)):
        if dv[key] != dr[key]:
            problems.append(f"DMI {key} differs: bundle {dv[key]}; rerun {dr[key]}")
        else:
            matched.append(f"DMI {key}")
    if not matched and not problems:
        cv, cr = vendor.get("cpu_model"), rerun.get("cpu_model")
        mv, mr = (
            set(_str_values(vendor.get("nics")).values()),
            set(_str_values(rerun.get("nics")).values()),
        )
        if cv != cr:
            problems.append(f"CPU model differs: bundle {cv}; rerun {cr}")
        if not (mv & mr):
            problems.append(f"no MAC address in common: bundle {_show(mv)}; rerun {_show(mr)}")
        if not problems:
            matched.append("CPU model and a MAC address (no GPU or DMI serial recorded)")
    if problems:
        return False, "; ".join(problems)
    return True, "the same machine: " + ", ".join(matched)


#: The configuration an audit compares (the identity's ``config``,
#: :func:`milarun.host.identity.config`), with its words and unit.
NODE_CONFIG = (
    ("kernel", "kernel", ""),
    ("cpu_governors", "CPU governors", ""),
    ("container_image_id", "container image", ""),
)
GPU_CONFIG = (
    ("power_limit_w", "power limit", " W"),
    ("sm_clock_app_mhz", "SM application clock", " MHz"),
    ("mem_clock_app_mhz", "memory application clock", " MHz"),
    ("ecc_mode", "ECC", ""),
    ("mig_mode", "MIG mode", ""),
    ("persistence_mode", "persistence mode", ""),
    ("driver", "driver", ""),
    ("vbios", "VBIOS", ""),
)


def _config_value(value, unit):
    if value is None:
        return "not read"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return f"{value}{unit}"


def _config_gpus(config):
    """``{key: GPU config}`` of a ``config``: by UUID, else by index."""
    out = {}
    for g in config.get("gpus") if isinstance(config.get("gpus"), list) else []:
        if isinstance(g, dict):
            uuid = g.get("uuid")
            out[uuid if isinstance(uuid, str) and uuid else f"index {g.get('index')}"] = g
    return out


def compare_config(vendor, rerun):
    """The differences between the configuration (``config``) of the bundle's node
    identity ``vendor`` and the rerun's ``rerun``: one line each ("GPU 3 power limit
    700 W in the bid, 500 W delivered"); every difference counts, a value read on one
    side only included (a lowered power limit is a finding, as a raised one). A side
    whose identity has no ``config`` (identity version 1) gives one line saying so."""
    configs = []
    for side, ident in (("the bundle", vendor), ("the rerun", rerun)):
        config = ident.get("config") if isinstance(ident, dict) else None
        if not isinstance(config, dict):
            return [f"configuration not recorded in {side} (its identity has no config)"]
        configs.append(config)
    bid, got = configs
    out = []
    nb, ng = bid.get("node"), got.get("node")
    nb, ng = (nb if isinstance(nb, dict) else {}), (ng if isinstance(ng, dict) else {})
    for key, words, unit in NODE_CONFIG:
        if nb.get(key) != ng.get(key):
            out.append(
                f"{words} {_config_value(nb.get(key), unit)} in the bid, "
                f"{_config_value(ng.get(key), unit)} delivered"
            )
    gb, gg = _config_gpus(bid), _config_gpus(got)
    for key in list(gb) + [k for k in gg if k not in gb]:
        a, b = gb.get(key), gg.get(key)
        label = f"GPU {(a or b).get('index')}"
        if a is None or b is None:
            out.append(
                f"{label} ({key}) configured only in the "
                + ("delivered machine" if a is None else "bid")
            )
            continue
        for name, words, unit in GPU_CONFIG:
            if a.get(name) != b.get(name):
                out.append(
                    f"{label} {words} {_config_value(a.get(name), unit)} in the bid, "
                    f"{_config_value(b.get(name), unit)} delivered"
                )
    return out


def _rerun_records(auditdir):
    """``{(job_name, device): [(path, record)]}`` of the rerun's records (PASS first, then
    by run)."""
    found: dict = {}
    for path, rec in iter_results(auditdir):
        if isinstance(rec, Exception) or not isinstance(rec, dict):
            continue
        key = (rec.get("job_name"), str(rec.get("device")))
        found.setdefault(key, []).append((path, rec))
    for items in found.values():
        items.sort(
            key=lambda pr: (
                pr[1].get("success") is not True,
                pr[1].get("run") if isinstance(pr[1].get("run"), int) else 0,
            )
        )
    return found


def check_audit(outdir, auditdir):
    """Check an audit rerun (``auditdir``) against the vendor's bundle (``outdir``).

    Returns:
        ``(verdict, rows, plan)``: a :class:`milarun.verify.verdict.Verdict` whose clauses are in
        section ``"audit"`` (``audit.bundle-head``, ``audit.vendor-record``,
        ``audit.identity``, ``audit.config``, ``audit.rerun``, ``audit.command``,
        ``audit.throughput``), and
        one dict per chosen launch (``name``, ``job``, ``run``, ``device``, ``vendor_rate``,
        ``rerun_rate`` in items/s, ``ratio``, ``ratio_ci``, ``vendor_ci``, ``verdict``:
        ``"reproduced"``, ``"not reproduced"`` or ``"not compared"``, ``why``), and the
        audit plan the rerun ran (:func:`read_audit_plan`).

    Raises:
        AuditError, ManifestError, SetupError, ResultFormatError: bad input (a missing
            folder, a broken chain, an audit folder not run from an audit profile).
    """
    outdir, auditdir = Path(outdir), Path(auditdir)
    entries = read_chain(outdir)
    plan, audit_session = read_audit_plan(auditdir)
    vendor_session = read_session(outdir) or {}
    verdict = Verdict(
        bundle=str(outdir),
        head=head_of(entries),
        sessions=len(vendor_session.get("sessions") or []),
    )
    verdict.add(
        "audit",
        "audit.bundle-head",
        plan["head"] == verdict.head,
        f"the bundle's chain head is {verdict.head}"
        + (
            ""
            if plan["head"] == verdict.head
            else f", not {plan['head']}, the head the audit was planned on"
        ),
    )
    entry = _last_entry(entries, "session", ".milarun/session.json")
    problem = "not in the manifest" if entry is None else _matches_entry(outdir, entry)
    if problem:  # its identity is not the one the vendor sealed
        vendor_session = {}
        verdict.add(
            "audit",
            "audit.vendor-record",
            False,
            f"the bundle's session file is {problem}",
            [".milarun/session.json"],
        )
    # the identity is read only from a chain whose shape milarun verify accepts: an entry
    # appended after a session's end, or a file entered again under another kind, could
    # stand for a session or plan file rewritten with other hardware
    unaccepted = after_head_problems(entries) + entry_kind_problems(entries)
    if unaccepted:
        vendor_session = {}
        verdict.add(
            "audit",
            "audit.vendor-record",
            False,
            f"the bundle's chain has entries milarun verify does not accept "
            f"(integrity.after-head, integrity.entry-kind): {unaccepted[0]}"
            + (f" (and {len(unaccepted) - 1} more)" if len(unaccepted) > 1 else "")
            + "; its hardware identity is not read",
            [".milarun/manifest.jsonl"],
        )
    tolerance = plan["tolerance"]
    reruns = _rerun_records(auditdir)
    rows, identities = [], {}
    for c in plan["chosen"]:
        label = f"{c['name']} J{c['run']} device {c['device']}"
        row = {k: c[k] for k in ("name", "job", "run", "device")}
        row.update(
            vendor_rate=None,
            rerun_rate=None,
            ratio=None,
            ratio_ci=None,
            vendor_ci=None,
            verdict="not compared",
            why=None,
        )
        rows.append(row)
        vendor = _vendor_record(outdir, entries, c, verdict, label)
        found = reruns.get((c["job"], c["device"]), [])
        rerun_path, rerun = found[0] if found else (None, None)
        if vendor is not None and rerun is not None:
            node = _node_of(rerun)
            pair = (c["session"], c.get("node"), node)
            if pair not in identities:
                rerun_sid = _session_of(audit_session, rerun_path)
                bid = (
                    None
                    if unaccepted
                    else recorded_identity(
                        outdir, vendor_session, c["session"], c.get("node"), entries
                    )
                )
                delivered = recorded_identity(auditdir, audit_session, rerun_sid, node)
                ok, detail = compare_identity(bid, delivered)
                identities[pair] = ok
                where = f"bundle node {c.get('node')} / rerun node {node}"
                verdict.add("audit", "audit.identity", ok, f"{where}: {detail}")
                if ok:  # another machine's configuration is not compared
                    differences = compare_config(bid, delivered)
                    for line in differences:
                        verdict.add("audit", "audit.config", False, f"{where}: {line}")
                    if not differences:
                        verdict.add(
                            "audit", "audit.config", True, f"{where}: the configuration of the bid"
                        )
        if vendor is None:
            row["why"] = "the vendor's record cannot be used"
            continue
        if rerun is None or rerun.get("success") is not True:
            why = (
                "no record of it in the rerun"
                if rerun is None
                else f"the rerun failed ({(rerun.get('error') or {}).get('type', 'FAIL')})"
                if isinstance(rerun.get("error"), dict)
                else "the rerun failed"
            )
            row["why"] = why
            verdict.add(
                "audit",
                "audit.rerun",
                False,
                f"{label}: {why} (test {c['job']!r} on device {c['device']} in {auditdir})",
            )
            continue
        assert rerun_path is not None  # a rerun record was found
        rel = os.path.relpath(rerun_path, auditdir)
        v_argv = (vendor.get("call") or {}).get("argv")
        r_argv = (rerun.get("call") or {}).get("argv")
        verdict.add(
            "audit",
            "audit.command",
            v_argv == r_argv,
            f"{label}: the rerun ran "
            + (
                "the vendor's command line"
                if v_argv == r_argv
                else f"{r_argv}, the vendor {v_argv}"
            ),
            [c["record"]],
        )
        try:
            v_stats, r_stats = sample_stats(vendor), sample_stats(rerun)
        except ValueError as exc:
            row["why"] = str(exc)
            verdict.add("audit", "audit.throughput", False, f"{label}: not compared ({exc})")
            continue
        result = compare_rates(v_stats, r_stats, tolerance)
        row.update(
            vendor_rate=v_stats[0],
            rerun_rate=r_stats[0],
            ratio=result["ratio"],
            ratio_ci=result["ratio_ci"],
            vendor_ci=result["vendor_ci"],
            verdict="reproduced" if result["reproduced"] else "not reproduced",
            t=result["t"],
            df=result["df"],
            basis=result["basis"],
            rerun_record=rel,
        )
        verdict.add(
            "audit",
            "audit.throughput",
            result["reproduced"],
            f"{label}: {row['verdict']}: rerun {r_stats[0]:.4g} items/s, vendor "
            f"{v_stats[0]:.4g} items/s, ratio {_ratio_text(result)} "
            f"(Welch at 95 %, tolerance {tolerance:g}"
            + (", noise unknown" if result["basis"] != "welch" else "")
            + ")",
            [c["record"]],
        )
    return verdict, rows, plan


def _session_of(session, path):
    """The session id whose stamp ends the name of record ``path`` (None if none)."""
    name = Path(path).name
    for s in session.get("sessions", []):
        sid = s.get("id") if isinstance(s, dict) else None
        if isinstance(sid, str) and name.endswith(f".{sid}.json"):
            return sid
    return None


def _vendor_record(outdir, entries, c, verdict, label):
    """The vendor's record of chosen launch ``c`` when it is the one planned and chained
    (else a failed ``audit.vendor-record`` clause and None)."""
    entry = next(
        (
            e
            for e in entries
            if e.get("kind") == "record" and e["path"] == c["record"] and e["sha256"] == c["sha256"]
        ),
        None,
    )
    problem = (
        "not in the chain with the SHA-256 the audit planned"
        if entry is None
        else _matches_entry(outdir, entry)
    )
    record = None
    if problem is None:
        try:
            record = load_result(outdir / c["record"])
        except ResultFormatError as exc:
            problem = f"unreadable ({exc})"
    if problem is not None:
        verdict.add(
            "audit",
            "audit.vendor-record",
            False,
            f"{label}: record {c['record']} is {problem}",
            [c["record"]],
        )
        return None
    verdict.add(
        "audit",
        "audit.vendor-record",
        True,
        f"{label}: record {c['record']} is the one the chain entered",
        [c["record"]],
    )
    return record


def _ratio_text(result):
    ci = result.get("ratio_ci")
    return f"{result['ratio']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else " [n/a]")


def _num(x):
    """A rate for the table (items/s): whole numbers from 1000 up, else 4 significant digits."""
    if x is None:
        return "n/a"
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def format_check(verdict, rows):
    """The text of ``milarun audit check``: one line per chosen launch, the identity, the
    failed clauses and the outcome."""
    lines = [f"Audit of {verdict.bundle} (chain head {verdict.head})", ""]
    header = (
        "test",
        "run",
        "device",
        "vendor items/s [95% CI]",
        "rerun items/s",
        "ratio [95% CI]",
        "verdict",
    )
    table = [header]
    for r in rows:
        vci = r.get("vendor_ci")
        table.append(
            (
                r["name"],
                f"J{r['run']}",
                r["device"],
                _num(r["vendor_rate"]) + (f" [{_num(vci[0])}, {_num(vci[1])}]" if vci else ""),
                _num(r["rerun_rate"]),
                _ratio_text(r) if r.get("ratio") is not None else "n/a",
                r["verdict"] + (f" ({r['why']})" if r.get("why") else ""),
            )
        )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for row in table:
        lines.append("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())
    lines.append("")
    for c in verdict.clauses:
        if c.name == "audit.identity":
            lines.append(f"identity: {'matched' if c.ok else 'MISMATCH'}: {c.detail}")
    failed = [c for c in verdict.failed if c.name not in ("audit.identity",)]
    for c in failed:
        lines.append(f"FAILED {c.name}: {c.detail}")
    done = sum(r["verdict"] == "reproduced" for r in rows)
    lines.append(
        f"{done} of {len(rows)} launch(es) reproduced; "
        + ("AUDIT PASSED" if verdict.ok else "AUDIT FAILED")
    )
    return "\n".join(lines) + "\n"


def check_json(verdict, rows, plan=None):
    """The JSON of ``milarun audit check --json``: the verdict and the per-launch rows."""
    return {**verdict.to_json(), "launches": rows, "plan": plan}
