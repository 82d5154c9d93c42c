"""Start launches, watch them, and turn every failure into a FAIL record.

The only module that starts processes. Each child runs in its own session
(so its process group can be signalled as a whole) under ``setpriv
--pdeathsig KILL`` (it dies if the launcher is SIGKILLed, see
:mod:`milarun.host.supervise`). Its stdout and stderr go to
``OUTDIR/logs/<suite>.<job>.J<run>.<device>.log`` and, compactly, to the
progress display. It gets a timeout: SIGTERM to the group, ``grace``
seconds, then SIGKILL.

The plan names each launch's paths; the child writes its record at
``launch.result_path`` and streams its samples to ``launch.journal_path``.
After the child ends the launcher decides the outcome from the exit status
*and* the record, so the tally and the records always agree:

* exit 0 with a successful record: PASS, the record stays where it is;
* anything else: a FAIL record at ``launch.fail_path``, written through the
  one writer (:func:`milarun.formats.store.write_result`). It is the child's
  own record when there is one (samples kept), else a new one holding the
  journal's valid events (the lines dropped are counted in
  ``error.journal_dropped``), else, when even that one fails the schema, a
  minimal one (name, job id, run, device, why). ``error.reason`` is
  ``interrupted`` (the suite was stopped), ``exit-after-result`` (a
  successful record, then a non-zero exit or a hang past the timeout),
  ``timeout``, the child's own reason,
  ``oom-killed`` (the cgroup's OOM-kill counter went up), ``signal`` or
  ``error``.

SIGINT, SIGTERM and SIGHUP (see :class:`StopRequest`) stop every running
child (SIGTERM, ``grace``, SIGKILL; a second signal skips the grace),
write an ``interrupted`` record for each, and raise :class:`Interrupted`.
A record that cannot be written is one error line naming the file and the
suite goes on, except on a full disk or quota or a read-only folder: that
stops the suite with :class:`SuiteAborted`; what was written stays.
"""

import collections
import errno
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import SetupError, say
from ..formats.barrier import without_secret
from ..formats.journal import read_journal
from ..formats.outfile import open_append, own_dir
from ..formats.record import new_result
from ..formats.store import load_result, write_result
from ..host import isolation, supervise

STDERR_TAIL_LINES = 40
#: Longest line read from a child at once, and kept of a tail line (bytes, characters).
LINE_BYTES = 65536
TAIL_LINE_CHARS = 4096
#: Longest ``error.message`` a FAIL record gets (characters).
MESSAGE_CHARS = 65536
POLL_S = supervise.POLL_S
#: Seconds after SIGKILL before a child that will not die is given up on.
ABANDON_S = supervise.ABANDON_S
#: Children that ended at most this many seconds before a stop signal count as
#: stopped by it (a signal sent to the whole job, as by scancel, may reach them first).
STOP_WINDOW_S = 2.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """The suite was stopped by a signal; ``outcomes`` holds what finished or was cut short.

    Attributes:
        signum: the signal number (exit status is ``128 + signum``).
        outcomes: list of ``Outcome``.
    """

    def __init__(self, signum, outcomes=()):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.outcomes = list(outcomes)


class SuiteAborted(Exception):
    """A record could not be written (full disk, read-only folder): the suite stops.

    Attributes:
        outcomes: list of ``Outcome`` so far.
    """

    def __init__(self, message, outcomes=()):
        super().__init__(message)
        self.outcomes = list(outcomes)


class StopRequest:
    """Set by the signal handlers of :func:`stop_on_signals`, polled by the launcher.

    Attributes:
        signum: the first stop signal received, or None.
        count: how many stop signals arrived (2 or more: no grace period).
    """

    def __init__(self):
        self.signum = None
        self.count = 0
        self.at = None  # time.monotonic() of the first stop signal

    def __call__(self, signum, frame=None):
        if self.signum is None:
            self.signum = signum
            self.at = time.monotonic()
        self.count += 1


@contextmanager
def stop_on_signals(stop):
    """Route SIGINT, SIGTERM and SIGHUP to ``stop`` (a :class:`StopRequest`) while inside.

    A handler only sets a flag: the launcher acts on it at its next poll, so
    no record is ever half-written by an exception from a signal.
    """
    old = {}
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:
            continue  # e.g. SIGHUP under nohup: the operator asked to survive it
        try:
            old[sig] = signal.signal(sig, stop)
        except (ValueError, OSError):  # not the main thread
            pass
    try:
        yield stop
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


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
    returncode: int
    success: bool
    result_path: Path
    reason: str = None
    duration: float = 0.0
    write_error: str = None
    write_errno: int = None


class _Child:
    def __init__(self, launch, outdir, on_line=None):
        self.launch = launch
        self.outdir = Path(outdir)
        self.on_line = on_line
        self.tail = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.timed_out = False
        self.stopped = False  # cut short by a stop request
        self.stopping = None  # the timeout's supervise.GroupStop
        self.abandoned = False  # still there after SIGKILL and a long wait
        self.ended_at = None  # time.monotonic() when first seen ended
        self.proc = None
        self.start_error = None
        self.log_error = None
        self.threads = []
        self.oom_before = isolation.oom_kill_count(launch.cgroup)
        self.lock = threading.Lock()
        try:
            # never through a symlink, nor into a FIFO or device (milarun.formats.outfile)
            logdir = own_dir(self.outdir / "logs")
            self.log = open_append(logdir / launch.log)
        except OSError as exc:
            self.log = None
            self.log_error = f"cannot open the log: {exc.strerror}"

    def start(self):
        env = dict(os.environ)
        env.update(self.launch.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env[supervise.ENV] = str(os.getpid())
        self.t0 = time.time()  # for the record
        self.m0 = time.monotonic()  # for the watchdog: immune to clock steps
        feed = self.launch.stdin
        try:
            self.proc = subprocess.Popen(
                supervise.supervised_argv(self.launch.argv),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL if feed is None else subprocess.PIPE,
                start_new_session=True,
            )
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in an argument
            why = exc.strerror if isinstance(exc, OSError) else exc
            self.start_error = f"cannot start {self.launch.argv[0]!r}: {why}"
            self.tail.append(self.start_error)
            return
        self.group = supervise.ProcessGroup(self.proc)  # ends with the child, swept then
        if feed is not None:  # one line fits a pipe's buffer: this never blocks
            try:
                self.proc.stdin.write(feed.encode())
                self.proc.stdin.close()
            except OSError:  # already ended: its status and output say why
                pass
        for pipe, keep in ((self.proc.stdout, False), (self.proc.stderr, True)):
            t = threading.Thread(target=self._pump, args=(pipe, keep), daemon=True)
            t.start()
            self.threads.append(t)

    def _pump(self, pipe, keep):
        # Must never die: a dead pump would leave the child blocked on a full pipe.
        try:
            for line in iter(lambda: pipe.readline(LINE_BYTES), b""):
                with self.lock:
                    if self.log is not None:
                        try:
                            self.log.write(line)
                            self.log.flush()
                        except OSError as exc:
                            self.log_error = f"log writes stopped: {exc.strerror}"
                            self._close_log()
                text = line.decode(errors="replace").rstrip("\n")
                if keep:
                    self.tail.append(text[-TAIL_LINE_CHARS:])
                if self.on_line is not None:
                    try:
                        self.on_line(self.launch, text)
                    except Exception:  # display problems never stop the copy
                        pass
        finally:
            pipe.close()

    def _close_log(self):
        try:
            self.log.close()
        except OSError:
            pass
        self.log = None

    def send_signal(self, sig):
        """``sig`` to the child's process group while it runs."""
        if self.proc is not None:
            self.group.send_signal(sig)

    def poll(self):
        """The exit status once the child ended (and its group was swept), else None."""
        if self.proc is None:
            return -255
        return self.group.poll()

    def finish(self):
        for t in self.threads:
            t.join(timeout=5)
        with self.lock:
            if self.log is not None:
                self._close_log()


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


def base_record(launch):
    """A new record for ``launch`` holding what the launcher knows (no samples)."""
    where = {}
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


def conclude(child, now=None):
    """Decide the ``Outcome`` of a finished child and write its FAIL record if it failed."""
    launch = child.launch
    end = now or time.time()
    rc = child.poll() if child.proc is not None else None
    own, problem = _read_own_record(launch.result_path)
    ok = own is not None and own.get("success") is True
    if ok and rc == 0 and not child.timed_out:
        # (a child stopped while finishing its teardown still measured everything)
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
    hidden = Path(launch.result_path).with_name(f".{Path(launch.result_path).name}.superseded")
    try:
        os.replace(launch.result_path, hidden)
    except OSError:
        hidden = None
    if not write_fail(outcome, own, message, list(child.tail), child.t0, end):
        if hidden is not None:  # kept, but not under a name that would contradict the tally
            outcome.write_error += f"; the child's own record is kept as {hidden.name}"
        return outcome
    for path in (hidden, launch.journal_path):
        if path is not None:
            _remove(path)
    return outcome


#: ``errno`` of a record write that stops the suite: no later record could be written either.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def write_fail(outcome, own, message, tail, start, end):
    """Write the FAIL record of ``outcome``; on failure set ``outcome.write_error``
    (one line naming the file) and ``outcome.write_errno``.

    Records are never lost to bad values: the child's own record (``own``, samples
    kept) is tried first, then a new one from the launch's journal (only its valid
    events, see :func:`milarun.formats.journal.read_journal`), then the
    :func:`minimal_record`; each refused one is named in the next one's message.
    Returns True when written.
    """
    launch = outcome.launch
    rc = outcome.returncode
    builds = [
        lambda m: fail_record(launch, own, outcome.reason, m, rc, tail, start, end),
        lambda m: fail_record(launch, None, outcome.reason, m, rc, tail, start, end),
        lambda m: minimal_record(launch, outcome.reason, m, rc),
    ]
    if own is None:
        builds.pop(0)
    refused = []
    for build in builds:
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
            what = "the child's record" if own is not None and not refused else "the FAIL record"
            refused.append(f"{what} was unusable ({exc.__class__.__name__}: {exc})"[:4096])
    outcome.write_error = f"cannot write {launch.fail_path}: {refused[-1]}"
    return False


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def run_wave(launches, outdir, stop=None, on_line=None, grace=5.0, barrier=None):
    """Start every launch of a wave at once and wait for all of them.

    Args:
        stop: a :class:`StopRequest` polled every ``POLL_S`` s (None: never stops).
        on_line: ``f(launch, line)`` called with every line the children print.
        barrier: the :class:`milarun.formats.barrier.BarrierServer` whose address the
            plan gave the launches (``launch.barrier_wave``): told the wave's
            labels before they start, and each child that ends without arriving.

    Returns:
        list of ``Outcome`` in launch order. When ``stop`` fired, the
        children still running were stopped and their outcomes are
        ``interrupted``; the caller raises.
    """
    stop = stop or StopRequest()
    children = [_Child(launch, outdir, on_line) for launch in launches]
    synced = {}
    for launch in launches:
        if barrier is not None and getattr(launch, "barrier_wave", None):
            synced.setdefault(launch.barrier_wave, []).append(launch.device)
    for wave, labels in synced.items():
        barrier.expect(wave, labels)
    for child in children:
        child.start()
    while True:
        pending = [c for c in children if not c.abandoned and c.poll() is None]
        now = time.monotonic()
        for c in children:
            if c not in pending and c.ended_at is None:
                c.ended_at = now
                if getattr(c.launch, "barrier_wave", None) in synced:  # never wait for the gone
                    barrier.drop(c.launch.barrier_wave, c.launch.device)
        if not pending:
            break
        if stop.signum is not None:
            for c in pending:
                c.stopped = True
            stop_all(pending, grace, stop)
            break
        now = time.monotonic()
        for c in pending:
            if not c.timed_out and now - c.m0 > c.launch.timeout:
                c.timed_out = True
                c.stopping = supervise.GroupStop(c, grace, ABANDON_S, now)  # SIGTERM
            elif c.timed_out:
                c.stopping.step(now)  # SIGKILL once the grace is over
                c.abandoned = c.stopping.abandoned
        time.sleep(POLL_S)
    if stop.signum is not None:
        # A stop that reached the whole process tree at once (Slurm's scancel
        # signals every step as well as milarun) may end children before this
        # loop sees the request: those ended by the same stop.
        for c in children:
            if c.ended_at is not None and c.ended_at >= stop.at - STOP_WINDOW_S:
                c.stopped = True
    outcomes = []
    for c in children:
        c.finish()
        outcomes.append(conclude(c))
    return outcomes


def stop_all(children, grace=5.0, stop=None):
    """SIGTERM every child's process group, wait up to ``grace`` s (less if a second
    stop signal arrives), then SIGKILL whatever is left of each group
    (:func:`milarun.host.supervise.terminate_group`); a group still there
    ``ABANDON_S`` s later is marked ``abandoned``."""
    first = stop.count if stop is not None else 0
    cut_short = (lambda: stop.count > first) if stop is not None else None
    for c in supervise.terminate_group(list(children), grace, cut_short, ABANDON_S, POLL_S):
        c.abandoned = True


def prepare_fields(dataroot, outdir):
    """Values of the ``prepare`` placeholders, shell-quoted (``{milarun}`` is a command)."""
    fields = {
        k: shlex.quote(str(v))
        for k, v in {"dataroot": dataroot or "", "outdir": outdir, "python": sys.executable}.items()
    }
    fields["milarun"] = f"{shlex.quote(sys.executable)} -m milarun"
    return fields


def run_prepare(commands, fields, log_path, stop=None, echo=True, grace=5.0, timeout=None):
    """Run a test's prepare commands with ``sh -c``; returns (ok, message).

    ``fields`` come from :func:`prepare_fields`. Output goes to ``log_path``.
    Each command gets ``timeout`` seconds (the test's own timeout) and runs in
    a process group of its own, which is swept (:func:`stop_all`: SIGTERM,
    ``grace`` s, SIGKILL) when the command ends, so nothing it started in the
    background outlives it. A stop request does the same and raises
    :class:`Interrupted`.
    """
    stop = stop or StopRequest()
    own_dir(Path(log_path).parent)
    with open_append(log_path) as log:  # never through a symlink (milarun.formats.outfile)
        for template in commands:
            try:
                cmd = template.format(**fields)
            except (KeyError, IndexError, ValueError, OverflowError, MemoryError) as exc:
                return False, f"bad prepare command {template!r} ({exc})"
            if echo:
                say(f"milarun: prepare: {cmd}")
            env = dict(os.environ, **{supervise.ENV: str(os.getpid())})
            try:
                proc = subprocess.Popen(
                    supervise.supervised_argv(["sh", "-c", cmd]),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env=env,
                )
            except (OSError, ValueError) as exc:  # ValueError: a NUL byte
                return False, f"cannot run prepare command {cmd!r}: {exc}"
            # it lasts while any process of its group is left, not only its shell
            group = supervise.ProcessGroup(proc, until="members")
            t0 = time.monotonic()
            try:
                while proc.poll() is None:
                    late = timeout is not None and time.monotonic() - t0 > timeout
                    if stop.signum is not None or late:
                        stop_all([group], min(grace, 1.0), stop)
                        if late and stop.signum is None:
                            return False, f"prepare command timed out after {timeout:g} s: {cmd}"
                        raise Interrupted(stop.signum)
                    time.sleep(POLL_S)
            finally:
                stop_all([group], grace, stop)  # what it left running in the background
            if proc.returncode != 0:
                return False, (
                    f"prepare command failed with status {proc.returncode}: {cmd} "
                    f"(output in logs/{Path(log_path).name})"
                )
    return True, None


def check_ready(waves, use_cgexec=True):
    """Check, before anything runs, that the cgroups and programs the waves need exist
    (cgexec, numactl for pinned launches, exec prefixes).

    Raises:
        SetupError: naming the missing cgroups (with the command that creates
            them) or the missing program.
    """
    launches = [lch for wave in waves for lch in wave]
    groups = sorted({lch.cgroup for lch in launches if lch.cgroup})
    if groups and use_cgexec:
        if shutil.which("cgexec") is None:
            raise SetupError(
                "cgexec is not installed: run scripts/install-apt-packages.sh "
                "(package cgroup-tools) or pass --no-cgexec"
            )
        missing = isolation.missing_groups(groups)
        if missing:
            raise SetupError(
                f"student cgroup(s) {', '.join(missing)} do not exist: run "
                f"'sudo scripts/cgroup_setup.sh --students {len(groups)}' or pass --no-cgexec"
            )
    if any(getattr(lch, "cpus", None) for lch in launches) and shutil.which("numactl") is None:
        raise SetupError(
            "numactl is not installed (multi-process tests pin their processes "
            "with it): run scripts/install-apt-packages.sh or pass --no-cgexec"
        )
    for prefix in sorted({lch.job.exec_prefix[0] for lch in launches if lch.job.exec_prefix}):
        if shutil.which(prefix) is None:
            raise SetupError(
                f"exec_prefix program {prefix!r} is not installed "
                "(scripts/install-apt-packages.sh installs nocache)"
            )


def run_suite(
    waves,
    outdir,
    dataroot,
    stop=None,
    on_line=None,
    on_outcome=None,
    on_wave=None,
    echo=True,
    grace=5.0,
    barrier=None,
    on_message=None,
):
    """Run every wave in order; returns the list of all ``Outcome``.

    Prepare commands run once per (job, run), before its first wave. A
    failing prepare turns that job's launches into FAIL records. The suite
    always goes on to the next test. A FAIL record that cannot be written is
    one ``on_message`` line naming the file (the launch counts as failed, with
    no record), except on a full disk or quota or a read-only folder
    (:data:`DISK_FULL`), which stops the suite.

    Args:
        stop: a :class:`StopRequest` (see :func:`stop_on_signals`).
        on_line: ``f(launch, line)`` for the children's output.
        on_outcome: ``f(outcome)`` after each launch (default: one line on stderr).
        on_wave: ``f(launches)`` when a wave starts.
        barrier: the start barrier's server (see :func:`run_wave`), or None.
        on_message: ``f(line)`` for the launcher's own error lines (default: stderr).

    Raises:
        Interrupted: a stop signal arrived; running children were stopped and
            recorded as ``interrupted``; ``exc.outcomes`` holds every outcome.
        SuiteAborted: a FAIL record could not be written for lack of space
            (full disk or quota) or on a read-only folder.
    """
    stop = stop or StopRequest()
    on_outcome = on_outcome or _report
    on_message = on_message or say
    outcomes = []
    prepared = {}
    logdir = Path(outdir) / "logs"
    fields = prepare_fields(dataroot, outdir)

    def record(wave_outcomes):
        # every outcome of the wave is counted before the suite may stop, so the
        # tally matches the records already written
        for outcome in wave_outcomes:
            outcomes.append(outcome)
            on_outcome(outcome)
        unwritten = [o for o in wave_outcomes if o.write_error]
        for outcome in unwritten:
            if outcome.write_errno in DISK_FULL:  # no later record could be written either
                raise SuiteAborted(f"{outcome.write_error}; the suite stops here", outcomes)
        for outcome in unwritten:  # this launch only: the suite goes on
            on_message(
                f"milarun: error: {outcome.launch.group} J{outcome.launch.job_id}: "
                f"{outcome.write_error}; counted as failed, with no record"
            )

    try:
        for wave in waves:
            if stop.signum is not None:
                raise Interrupted(stop.signum)
            first = wave[0]
            key = (first.name, first.run)
            if key not in prepared:
                prepared[key] = (True, None)
                if first.job.prepare:
                    try:
                        prepared[key] = run_prepare(
                            first.job.prepare,
                            fields,
                            logdir / f"{first.name}.J{first.run}.prepare.log",
                            stop,
                            echo,
                            grace,
                            timeout=first.timeout,
                        )
                    except OSError as exc:
                        prepared[key] = (False, f"cannot run prepare commands: {exc.strerror}")
            ok, message = prepared[key]
            if on_wave is not None:
                on_wave(wave)
            if not ok:
                now = time.time()
                failed = [Outcome(lch, None, False, None, "error", 0.0) for lch in wave]
                for outcome in failed:
                    write_fail(outcome, None, message, [message], now, now)
                record(failed)
                continue
            record(run_wave(wave, outdir, stop=stop, on_line=on_line, grace=grace, barrier=barrier))
            if stop.signum is not None:
                raise Interrupted(stop.signum)
    except Interrupted as exc:
        exc.outcomes = outcomes
        raise
    return outcomes


def _report(o):
    status = "PASS" if o.success else f"FAIL ({o.reason})"
    say(
        f"milarun: {o.launch.group} J{o.launch.job_id}: {status} in {o.duration:.1f} s "
        f"-> {o.result_path}"
    )


def tally(outcomes):
    """``"12 passed, 1 failed"`` (and ``", 2 interrupted"`` when some were) for outcomes."""
    passed = sum(o.success for o in outcomes)
    cut = sum(o.reason == "interrupted" for o in outcomes)
    text = f"{passed} passed, {len(outcomes) - passed - cut} failed"
    return text + (f", {cut} interrupted" if cut else "")
