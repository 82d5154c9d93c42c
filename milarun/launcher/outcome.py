"""Decide what became of a launch once its child ended, and write its FAIL record when it
failed.

The plan names each launch's paths; the child writes its record at ``launch.result_path`` and
streams its samples to ``launch.journal_path``. After the child ends the launcher decides the
outcome from the exit status *and* the record, so the tally and the records always agree:

* exit 0 with a successful record: PASS, the record stays where it is;
* anything else: a FAIL record at ``launch.fail_path`` (:mod:`milarun.launcher.failures`).
  ``error.reason`` is ``interrupted`` (the suite was stopped), ``exit-after-result`` (a
  successful record, then a non-zero exit or a hang past the timeout), ``timeout``, the
  child's own reason, ``oom-killed`` (the cgroup's OOM-kill counter went up),
  ``node-lost``, ``rendezvous-timeout`` or ``rank-failed`` (a launch of several processes or
  nodes), ``signal`` or ``error``.

Either way the record gets the launch's ``health`` (:mod:`milarun.host.health`: the GPUs'
health counters before and after it, and what changed), when its GPUs were read: a PASS
record is rewritten with it (through the one writer); when that write fails the child's
record stays as it was.
"""

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from ..formats.journal import read_journal
from ..formats.store import load_result, write_result
from ..host import isolation
from .failures import write_fail


@dataclass
class Outcome:
    """What became of one launch.

    Attributes:
        launch: the ``plan.Launch``.
        returncode: exit status (negative: killed by that signal), None if never started.
        success: True when the child wrote a successful record and exited 0.
        result_path: the record (the child's, or the FAIL one), None if it could not be written.
        reason: None, or the ``error.reason`` of the FAIL record.
        duration: seconds.
        write_error: None, or why the FAIL record could not be written (one line naming it).
        write_errno: the ``errno`` of that failed write, None when it was not an ``OSError``.
    """

    launch: object
    returncode: int | None
    success: bool
    result_path: Path | None
    reason: str | None = None
    duration: float = 0.0
    write_error: str | None = None
    write_errno: int | None = None


def fail_reason(returncode, timed_out, oom_before, oom_after):
    """Classify a child that left no record: ``timeout``, ``oom-killed``, ``signal`` or ``error``.

    ``oom_before``/``oom_after`` are the cgroup's OOM-kill counters around the
    run (None when unknown). A timeout wins, since we sent the signal ourselves.
    """
    if timed_out:
        return "timeout"
    if oom_before is not None and oom_after is not None and oom_after > oom_before:
        return "oom-killed"
    if returncode is not None and returncode < 0:
        return "signal"
    return "error"


#: torchrun's words for a rendezvous that did not complete, and for a failed worker.
_RDZV_FAILED = (
    "RendezvousTimeoutError",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "Timed out waiting for rendezvous",
)
_RANK_FAILED = ("ChildFailedError", "Root Cause (first observed failure)")


def distributed_reason(launch, returncode, tail, rendezvous_done=False):
    """``node-lost``, ``rendezvous-timeout`` or ``rank-failed`` for a failed launch of
    several processes or nodes, or None when its output says none of these.

    ``node-lost`` comes from the cluster's transport (ssh's status 255, srun's
    node-failure messages); the other two from torchrun's messages in ``tail``.
    ``rendezvous_done``: the job got past its rendezvous (rank 0 journaled the
    gathered nodes), so a rendezvous error is a lost peer, not a node that never joined.
    """
    cluster = getattr(launch, "cluster", None)
    if cluster is not None:
        lost = cluster.failure_reason(returncode, tail)
        if lost:
            return lost
    if getattr(launch, "launcher", "python") == "python":
        return None
    text = "\n".join(tail)
    if not rendezvous_done and any(word in text for word in _RDZV_FAILED):
        return "rendezvous-timeout"
    if any(word in text for word in _RANK_FAILED + _RDZV_FAILED):
        return "rank-failed"
    return None


def _spans_processes(launch):
    """True for a launch of several ranks or nodes (one failing rank fails them all)."""
    return getattr(launch, "launcher", "python") != "python" and (
        len(getattr(launch, "devices", [])) > 1 or len(getattr(launch, "nodes", [])) > 1
    )


def _exit_words(returncode):
    if returncode is not None and returncode < 0:
        return f"was killed by signal {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


def _read_own_record(path):
    """The child's record at ``path``: ``(record or None, problem or None)``."""
    if not Path(path).exists():
        return None, None
    try:
        return load_result(path), None
    except Exception as exc:  # a corrupt record is reported, never trusted
        return None, f"its record {Path(path).name} is unreadable ({exc})"


def conclude(child, now=None):
    """Decide the ``Outcome`` of a finished child and write its FAIL record if it failed."""
    launch = child.launch
    end = now or time.time()
    rc = child.poll() if child.proc is not None else None
    own, problem = _read_own_record(launch.result_path)
    ok = own is not None and own.get("success") is True
    health = _health(child)
    if ok and rc == 0 and not child.timed_out:
        # (a child stopped while finishing its teardown still measured everything)
        _add_health(own, health, launch.result_path)
        _remove(launch.journal_path)
        return Outcome(launch, rc, True, Path(launch.result_path), None, end - child.t0)
    if child.abandoned:
        reason = "timeout"
        message = (
            "did not end after SIGKILL (stuck in the kernel, e.g. in a driver call); abandoned"
        )
    elif child.stopped:
        reason, message = "interrupted", "stopped by the launcher: the suite was interrupted"
    elif ok:
        reason = "exit-after-result"
        if child.timed_out:
            message = (
                f"wrote a successful result, then did not exit within the "
                f"{launch.timeout:g} s timeout"
            )
        else:
            message = f"wrote a successful result, then {_exit_words(rc)}"
    elif child.timed_out:
        reason, message = "timeout", f"no result after the {launch.timeout:g} s timeout"
    elif own is not None:
        err = own.get("error") if isinstance(own.get("error"), dict) else {}
        reason = err.get("reason") or "error"
        done = bool(own.get("distributed"))
        if reason == "interrupted":
            # the child saw an interrupt the launcher did not send (a peer's, a node's)
            reason = distributed_reason(launch, rc, list(child.tail), done) or "signal"
        elif reason == "error" and _spans_processes(launch):
            # rank 0 saw its peer vanish ("Connection closed by peer"): say which fault it was
            reason = distributed_reason(launch, rc, list(child.tail), done) or reason
        message = err.get("message") or f"the test failed and {_exit_words(rc)}"
    elif child.start_error:
        reason, message = "error", child.start_error
    else:
        reason = fail_reason(rc, False, child.oom_before, isolation.oom_kill_count(launch.cgroup))
        if reason == "oom-killed":
            message = f"killed by the OOM killer in cgroup {launch.cgroup}"
        else:
            message = f"{_exit_words(rc)} without writing a result"
            done = bool(read_journal(launch.journal_path).get("distributed"))
            reason = distributed_reason(launch, rc, list(child.tail), done) or reason
            if reason in ("node-lost", "rendezvous-timeout", "rank-failed"):
                message = f"{reason}: {message} (see the output's last lines)"
    for note in (problem, child.log_error):
        if note:
            message += f"; {note}"
    outcome = Outcome(launch, rc, False, None, reason, end - child.t0)
    # The child's record leaves its success name before the FAIL one exists: a
    # launcher killed in between leaves no record (``--resume`` reruns it), never
    # a PASS and a FAIL for one launch. Hidden files are not read as results.
    superseded = Path(launch.result_path).with_name(f".{Path(launch.result_path).name}.superseded")
    hidden: Path | None = superseded
    try:
        os.replace(launch.result_path, superseded)
    except OSError:
        hidden = None
    if not write_fail(outcome, own, message, list(child.tail), child.t0, end, health=health):
        if hidden is not None:  # kept, but not under a name that would contradict the tally
            outcome.write_error = (
                f"{outcome.write_error}; the child's own record is kept as {hidden.name}"
            )
        return outcome
    for path in (hidden, launch.journal_path):
        if path is not None:
            _remove(path)
    return outcome


def _health(child):
    """The ``health`` field of ``child``'s record (:meth:`Child.health_end`), or None."""
    end = getattr(child, "health_end", None)  # a test's stand-in child may have none
    return end() if end is not None else None


def _add_health(record, health, path):
    """Rewrite the successful ``record`` at ``path`` with its ``health`` field (None:
    nothing to add); on any failure (a full disk, a value the schema refuses) the record
    stays as the child wrote it."""
    if health is None:
        return
    try:
        write_result({**record, "health": health}, path)
    except Exception:  # the measurement is kept whatever the health reading holds
        pass


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass
