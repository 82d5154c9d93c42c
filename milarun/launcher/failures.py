"""The FAIL record of a launch, built and written by the launcher.

Records are never lost to bad values. The record is the child's own one when there is one
(samples kept), else a new one holding the journal's valid events (the lines dropped are
counted in ``error.journal_dropped``), else, when even that one fails the schema, a minimal
one (name, job id, run, device, why); each is written through the one writer
(:func:`milarun.formats.store.write_result`) at ``launch.fail_path``. The launch's ``health``
(:mod:`milarun.host.health`), when read, goes in every one but the minimal record.
"""

import errno
import socket
from typing import Any

from ..formats.barrier import without_secret
from ..formats.journal import read_journal
from ..formats.record import new_result, validate
from ..formats.store import finite_json, write_result

#: Longest ``error.message`` a FAIL record gets (characters).
MESSAGE_CHARS = 65536

#: ``errno`` of a record write that stops the suite: no later record could be written either.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def base_record(launch):
    """A new record for ``launch`` holding what the launcher knows (no samples)."""
    where: dict[str, Any] = {}
    cluster = getattr(launch, "cluster", None)
    if cluster is not None and cluster.kind != "local" and launch.nodes:
        # as the plan told the child (plan.plan_job): the summary groups by these
        where = {"nodes": list(launch.nodes), "gpus_per_node": len(launch.devices)}
        if len(launch.nodes) == 1:
            where["node"] = launch.nodes[0]
    rec = new_result(
        launch.name,
        launch.job_id,
        device=launch.device,
        devices=launch.devices,
        run=launch.run,
        plan_type=launch.job.plan_type,
        **where,
    )
    rec["job"] = launch.job.definition
    if launch.job.tags:
        rec["tags"] = list(launch.job.tags)
    if getattr(launch, "placeholders", None):
        rec["placeholders"] = dict(launch.placeholders)
    rec["call"] = {
        "function": launch.job.experiment,
        "argv": list(launch.test_argv),
        "arguments": {},
    }
    test_env = getattr(launch, "test_env", None)
    # the barrier's secret stays out: a record is read by others
    rec["environ"] = without_secret(launch.env if test_env is None else test_env)
    rec["host"] = {"hostname": socket.gethostname(), "cgroup": launch.cgroup}
    return rec


def fail_record(launch, own, reason, message, returncode, stderr_tail, start, end):
    """The FAIL record of a launch: the child's own record ``own`` (samples kept) or a
    new one filled from the launch's journal; ``error`` set to ``reason`` and ``message``."""
    journal = read_journal(launch.journal_path)
    if own is None:
        rec = base_record(launch)
        first = journal["start"] or start
        rec["timings"]["program"] = {
            "start": first,
            "end": max(end, first),
            "duration": max(0.0, end - first),
        }
        train = rec["timings"]["train"]
        train.update(
            {
                k: v
                for k, v in journal["train"].items()
                if k in ("sample_duration", "warmup", "max_count", "min_steady")
            }
        )
        train["samples"] = journal["samples"]
        train["count"] = int(sum(s["count"] for s in journal["samples"]))
        train["warmup"] = min(int(train.get("warmup") or 0), len(journal["samples"]))
        if journal["monitor"]:
            rec["gpu_monitor"] = {
                "available": True,
                "reason": None,
                "interval": None,
                "samples": journal["monitor"],
            }
        if journal["host_load"]:
            rec["host_load"] = {
                "available": True,
                "reason": None,
                "interval": None,
                "cpu_count": None,
                "samples": journal["host_load"],
            }
        if journal.get("distributed"):
            rec["distributed"] = journal["distributed"]  # the nodes and hosts it had gathered
    else:
        rec = own
    previous = rec.get("error") if isinstance(rec.get("error"), dict) else {}
    rec["error"] = {
        **_fail_error(reason, message, returncode),
        "type": previous.get("type") or "ChildFailure",
        "stderr_tail": "\n".join(stderr_tail),
        "traceback": previous.get("traceback"),
    }
    if journal["bad_lines"]:  # the journal lines left out (malformed or out-of-range values)
        rec["error"]["journal_dropped"] = journal["bad_lines"]
    rec["success"] = False
    rec["written_by"] = "launcher"
    return rec


def _fail_error(reason, message, returncode):
    """The ``error`` fields every FAIL record has."""
    sig = -returncode if returncode is not None and returncode < 0 else None
    return {
        "reason": reason,
        "type": "ChildFailure",
        "message": message,
        "returncode": returncode,
        "signal": sig,
    }


def minimal_record(launch, reason, message, returncode):
    """The smallest FAIL record of ``launch``: what identifies it (name, job id, run,
    device) and why it failed; the last resort of :func:`write_fail`, when the full
    record does not pass the schema."""
    rec = new_result(
        launch.name,
        launch.job_id,
        device=launch.device,
        run=launch.run,
        devices=launch.devices,
        plan_type=launch.job.plan_type,
    )
    rec["error"] = _fail_error(reason, message, returncode)
    rec["written_by"] = "launcher"
    return rec


def write_fail(outcome, own, message, tail, start, end, health=None):
    """Write the FAIL record of ``outcome``; on failure set ``outcome.write_error``
    (one line naming the file) and ``outcome.write_errno``. ``health``: the record's
    ``health`` field (:mod:`milarun.host.health`), or None.

    Records are never lost to bad values: the child's own record (``own``, samples
    kept) is tried first, then a new one from the launch's journal (only its valid
    events, see :func:`milarun.formats.journal.read_journal`), then the
    :func:`minimal_record`; each refused one is named in the next one's message.
    Returns True when written.
    """
    launch = outcome.launch
    rc = outcome.returncode

    refused = []
    if health is not None and (bad := _refused_health(health)) is not None:
        refused.append(bad)  # named in the message; the record goes without it
        health = None

    def with_health(rec):
        if health is not None:
            rec["health"] = health
        return rec

    builds = [
        lambda m: with_health(fail_record(launch, own, outcome.reason, m, rc, tail, start, end)),
        lambda m: with_health(fail_record(launch, None, outcome.reason, m, rc, tail, start, end)),
        lambda m: minimal_record(launch, outcome.reason, m, rc),
    ]
    if own is None:
        builds.pop(0)
    for i, build in enumerate(builds):
        text = "; ".join([message, *refused])[:MESSAGE_CHARS]
        try:
            rec = build(text)
            outcome.result_path = write_result(rec, launch.fail_path)
            return True
        except OSError as exc:
            outcome.write_error = f"cannot write {launch.fail_path}: {exc.strerror or exc}"
            outcome.write_errno = exc.errno
            return False
        except Exception as exc:  # the schema refused it, or values that break building it
            what = "the child's record" if own is not None and i == 0 else "the FAIL record"
            refused.append(f"{what} was unusable ({exc.__class__.__name__}: {exc})"[:4096])
    outcome.write_error = f"cannot write {launch.fail_path}: {refused[-1]}"
    return False


def _refused_health(health):
    """None when the record schema takes ``health`` (a record's ``health`` field), else
    why not, one line: a bad health reading never costs a FAIL record its samples."""
    probe = new_result("health.check")
    probe["health"] = health
    try:
        validate(finite_json(probe), parsed=True)
    except Exception as exc:
        return f"the health field was unusable ({exc.__class__.__name__}: {exc})"[:4096]
    return None
