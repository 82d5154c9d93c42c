"""Start launches, watch them, and turn every failure into a FAIL record.

The only module that starts processes. Each child runs in its own session
(so its process group can be signalled as a whole) under ``setpriv
--pdeathsig KILL`` (it dies if the launcher is SIGKILLed, see
:mod:`milarun.supervise`). Its stdout and stderr go to
``OUTDIR/logs/<suite>.<job>.J<run>.<device>.log`` and, compactly, to the
progress display. It gets a timeout: SIGTERM to the group, ``grace``
seconds, then SIGKILL.

The plan names each launch's paths; the child writes its record at
``launch.result_path`` and streams its samples to ``launch.journal_path``.
After the child ends the launcher decides the outcome from the exit status
*and* the record, so the tally and the records always agree:

* exit 0 with a successful record: PASS, the record stays where it is;
* anything else: a FAIL record at ``launch.fail_path``, written through the
  one writer (:func:`milarun.results.store.write_result`). It is the child's
  own record when there is one (samples kept), else a new one holding the
  journal's samples. ``error.reason`` is ``interrupted`` (the suite was
  stopped), ``exit-after-result`` (a successful record, then a non-zero exit
  or a hang past the timeout), ``timeout``, the child's own reason,
  ``oom-killed`` (the cgroup's OOM-kill counter went up), ``signal`` or
  ``error``.

SIGINT, SIGTERM and SIGHUP (see :class:`StopRequest`) stop every running
child (SIGTERM, ``grace``, SIGKILL; a second signal skips the grace),
write an ``interrupted`` record for each, and raise :class:`Interrupted`.
A record that cannot be written (full disk) stops the suite with
:class:`SuiteAborted`; what was written stays.
"""

import collections
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import isolation, supervise
from .results.journal import read_journal
from .results.schema import new_result
from .results.store import load_result, write_result

STDERR_TAIL_LINES = 40
POLL_S = 0.05
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

    def __call__(self, signum, frame=None):
        if self.signum is None:
            self.signum = signum
        self.count += 1


@contextmanager
def stop_on_signals(stop):
    """Route SIGINT, SIGTERM and SIGHUP to ``stop`` (a :class:`StopRequest`) while inside.

    A handler only sets a flag: the launcher acts on it at its next poll, so
    no record is ever half-written by an exception from a signal.
    """
    old = {}
    for sig in STOP_SIGNALS:
        try:
            old[sig] = signal.signal(sig, stop)
        except (ValueError, OSError):  # not the main thread
            pass
    try:
        yield stop
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def say(text, stream=None):
    """Print one line to ``stream`` (stderr); never raises (a closed SSH session gives EIO)."""
    stream = stream or sys.stderr
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):
        pass


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
        write_error: None, or why the FAIL record could not be written.
    """

    launch: object
    returncode: int
    success: bool
    result_path: Path
    reason: str = None
    duration: float = 0.0
    write_error: str = None


class _Child:
    def __init__(self, launch, outdir, on_line=None):
        self.launch = launch
        self.outdir = Path(outdir)
        self.on_line = on_line
        self.tail = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.timed_out = False
        self.stopped = False  # cut short by a stop request
        self.killed_at = None
        self.proc = None
        self.start_error = None
        self.log_error = None
        self.threads = []
        self.oom_before = isolation.oom_kill_count(launch.cgroup)
        self.lock = threading.Lock()
        try:
            logdir = self.outdir / "logs"
            logdir.mkdir(parents=True, exist_ok=True)
            self.log = open(logdir / launch.log, "ab")
        except OSError as exc:
            self.log = None
            self.log_error = f"cannot open the log: {exc.strerror}"

    def start(self):
        env = dict(os.environ)
        env.update(self.launch.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env[supervise.ENV] = str(os.getpid())
        self.t0 = time.time()
        try:
            self.proc = subprocess.Popen(supervise.supervised_argv(self.launch.argv), env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            self.start_error = f"cannot start {self.launch.argv[0]!r}: {exc.strerror}"
            self.tail.append(self.start_error)
            return
        for pipe, keep in ((self.proc.stdout, False), (self.proc.stderr, True)):
            t = threading.Thread(target=self._pump, args=(pipe, keep), daemon=True)
            t.start()
            self.threads.append(t)

    def _pump(self, pipe, keep):
        # Must never die: a dead pump would leave the child blocked on a full pipe.
        try:
            for line in iter(pipe.readline, b""):
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
                    self.tail.append(text)
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

    def signal_group(self, sig):
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def poll(self):
        return -255 if self.proc is None else self.proc.poll()

    def finish(self):
        if self.proc is not None:
            # Whatever the child left in its group (loader workers, ranks) goes with
            # it; they would also hold its pipes open. The group's ID cannot have been
            # reused while any member is alive, so this reaches only our processes.
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
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
    rec = new_result(launch.name, launch.job_id, device=launch.device,
                     devices=launch.devices, run=launch.run, partition=launch.job.partition)
    rec["job"] = launch.job.definition
    rec["call"] = {"function": launch.job.experiment, "argv": list(launch.test_argv),
                   "arguments": {}}
    rec["environ"] = dict(launch.env)
    rec["host"] = {"hostname": socket.gethostname(), "cgroup": launch.cgroup}
    return rec


def fail_record(launch, own, reason, message, returncode, stderr_tail, start, end):
    """The FAIL record of a launch: the child's own record ``own`` (samples kept) or a
    new one filled from the launch's journal; ``error`` set to ``reason`` and ``message``."""
    journal = read_journal(launch.journal_path)
    if own is None:
        rec = base_record(launch)
        rec["timings"]["program"] = {"start": journal["start"] or start, "end": end,
                                     "duration": end - (journal["start"] or start)}
        train = rec["timings"]["train"]
        train.update({k: v for k, v in journal["train"].items()
                      if k in ("sample_duration", "warmup", "max_count", "min_steady")})
        train["samples"] = journal["samples"]
        train["count"] = int(sum(s["count"] for s in journal["samples"]))
        train["warmup"] = min(int(train.get("warmup") or 0), len(journal["samples"]))
        if journal["monitor"]:
            rec["gpu_monitor"] = {"available": True, "reason": None, "interval": None,
                                  "samples": journal["monitor"]}
    else:
        rec = own
    previous = rec.get("error") if isinstance(rec.get("error"), dict) else {}
    sig = -returncode if returncode is not None and returncode < 0 else None
    rec["error"] = {"reason": reason, "type": previous.get("type") or "ChildFailure",
                    "message": message, "returncode": returncode, "signal": sig,
                    "stderr_tail": "\n".join(stderr_tail),
                    "traceback": previous.get("traceback")}
    rec["success"] = False
    rec["written_by"] = "launcher"
    return rec


def conclude(child, now=None):
    """Decide the ``Outcome`` of a finished child and write its FAIL record if it failed."""
    launch = child.launch
    end = now or time.time()
    rc = child.poll() if child.proc is not None else None
    own, problem = _read_own_record(launch.result_path)
    ok = own is not None and own.get("success") is True
    if ok and rc == 0 and not child.stopped:
        _remove(launch.journal_path)
        return Outcome(launch, rc, True, Path(launch.result_path), None, end - child.t0)
    if child.stopped:
        reason, message = "interrupted", "stopped by the launcher: the suite was interrupted"
    elif ok:
        reason = "exit-after-result"
        if child.timed_out:
            message = (f"wrote a successful result, then did not exit within the "
                       f"{launch.timeout:g} s timeout")
        else:
            message = f"wrote a successful result, then {_exit_words(rc)}"
    elif child.timed_out:
        reason, message = "timeout", f"no result after the {launch.timeout:g} s timeout"
    elif own is not None:
        err = own.get("error") if isinstance(own.get("error"), dict) else {}
        reason = err.get("reason") or "error"
        message = err.get("message") or f"the test failed and {_exit_words(rc)}"
    elif child.start_error:
        reason, message = "error", child.start_error
    else:
        reason = fail_reason(rc, False, child.oom_before,
                             isolation.oom_kill_count(launch.cgroup))
        if reason == "oom-killed":
            message = f"killed by the OOM killer in cgroup {launch.cgroup}"
        else:
            message = f"{_exit_words(rc)} without writing a result"
    for note in (problem, child.log_error):
        if note:
            message += f"; {note}"
    rec = fail_record(launch, own, reason, message, rc, list(child.tail), child.t0, end)
    outcome = Outcome(launch, rc, False, None, reason, end - child.t0)
    try:
        outcome.result_path = write_result(rec, launch.fail_path)
    except OSError as exc:
        outcome.write_error = f"cannot write {launch.fail_path}: {exc.strerror}"
        return outcome
    _remove(launch.result_path)
    _remove(launch.journal_path)
    return outcome


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def run_wave(launches, outdir, stop=None, on_line=None, grace=5.0):
    """Start every launch of a wave at once and wait for all of them.

    Args:
        stop: a :class:`StopRequest` polled every ``POLL_S`` s (None: never stops).
        on_line: ``f(launch, line)`` called with every line the children print.

    Returns:
        list of ``Outcome`` in launch order. When ``stop`` fired, the
        children still running were stopped and their outcomes are
        ``interrupted``; the caller raises.
    """
    stop = stop or StopRequest()
    children = [_Child(launch, outdir, on_line) for launch in launches]
    for child in children:
        child.start()
    while True:
        pending = [c for c in children if c.poll() is None]
        if not pending:
            break
        if stop.signum is not None:
            for c in pending:
                c.stopped = True
            stop_all(pending, grace, stop)
            break
        now = time.time()
        for c in pending:
            if not c.timed_out and now - c.t0 > c.launch.timeout:
                c.timed_out = True
                c.killed_at = now
                c.signal_group(signal.SIGTERM)
            elif c.timed_out and now - c.killed_at > grace:
                c.signal_group(signal.SIGKILL)
        time.sleep(POLL_S)
    outcomes = []
    for c in children:
        c.finish()
        outcomes.append(conclude(c))
    return outcomes


def stop_all(children, grace=5.0, stop=None):
    """SIGTERM every child's process group, wait up to ``grace`` s (less if a second
    stop signal arrives), then SIGKILL whatever is left of each group."""
    for c in children:
        c.signal_group(signal.SIGTERM)
    first = stop.count if stop is not None else 0
    deadline = time.time() + grace
    while time.time() < deadline and any(c.poll() is None for c in children):
        if stop is not None and stop.count > first:
            break
        time.sleep(POLL_S)
    for c in children:
        if c.proc is None:
            continue
        try:  # the whole group: grandchildren (torchrun ranks, loaders) too
            os.killpg(c.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            c.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass


def prepare_fields(dataroot, outdir):
    """Values of the ``prepare`` placeholders, shell-quoted (``{milarun}`` is a command)."""
    fields = {k: shlex.quote(str(v)) for k, v in
              {"dataroot": dataroot or "", "outdir": outdir, "python": sys.executable}.items()}
    fields["milarun"] = f"{shlex.quote(sys.executable)} -m milarun"
    return fields


def run_prepare(commands, fields, log_path, stop=None, echo=True, grace=5.0):
    """Run a test's prepare commands with ``sh -c``; returns (ok, message).

    ``fields`` come from :func:`prepare_fields`. Output goes to ``log_path``.
    A stop request kills the command's process group and raises
    :class:`Interrupted`.
    """
    stop = stop or StopRequest()
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        for template in commands:
            try:
                cmd = template.format(**fields)
            except (KeyError, IndexError, ValueError) as exc:
                return False, f"bad prepare command {template!r} ({exc})"
            if echo:
                say(f"milarun: prepare: {cmd}")
            proc = subprocess.Popen(supervise.supervised_argv(["sh", "-c", cmd]), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            while proc.poll() is None:
                if stop.signum is not None:
                    for sig in (signal.SIGTERM, signal.SIGKILL):
                        try:
                            os.killpg(proc.pid, sig)
                        except ProcessLookupError:
                            pass
                        try:
                            proc.wait(timeout=grace)
                            break
                        except subprocess.TimeoutExpired:
                            pass
                    raise Interrupted(stop.signum)
                time.sleep(POLL_S)
            if proc.returncode != 0:
                return False, (f"prepare command failed with status {proc.returncode}: {cmd} "
                               f"(output in logs/{Path(log_path).name})")
    return True, None


def check_ready(waves, use_cgexec=True):
    """Check, before anything runs, that the cgroups and programs the waves need exist.

    Raises:
        SetupError: naming the missing cgroups (with the command that creates
            them) or the missing program.
    """
    import shutil

    from .errors import SetupError

    launches = [lch for wave in waves for lch in wave]
    groups = sorted({lch.cgroup for lch in launches if lch.cgroup})
    if groups and use_cgexec:
        if shutil.which("cgexec") is None:
            raise SetupError("cgexec is not installed: run scripts/install-apt-packages.sh "
                             "(package cgroup-tools) or pass --no-cgexec")
        missing = isolation.missing_groups(groups)
        if missing:
            raise SetupError(
                f"student cgroup(s) {', '.join(missing)} do not exist: run "
                f"'sudo scripts/cgroup_setup.sh --students {len(groups)}' or pass --no-cgexec")
    for prefix in sorted({lch.job.exec_prefix[0] for lch in launches if lch.job.exec_prefix}):
        if shutil.which(prefix) is None:
            raise SetupError(f"exec_prefix program {prefix!r} is not installed "
                             "(scripts/install-apt-packages.sh installs nocache)")


def run_suite(waves, outdir, dataroot, stop=None, on_line=None, on_outcome=None,
              on_wave=None, echo=True, grace=5.0):
    """Run every wave in order; returns the list of all ``Outcome``.

    Prepare commands run once per (job, run), before its first wave. A
    failing prepare turns that job's launches into FAIL records. The suite
    always goes on to the next test.

    Args:
        stop: a :class:`StopRequest` (see :func:`stop_on_signals`).
        on_line: ``f(launch, line)`` for the children's output.
        on_outcome: ``f(outcome)`` after each launch (default: one line on stderr).
        on_wave: ``f(launches)`` when a wave starts.

    Raises:
        Interrupted: a stop signal arrived; running children were stopped and
            recorded as ``interrupted``; ``exc.outcomes`` holds every outcome.
        SuiteAborted: a FAIL record could not be written (full disk).
    """
    stop = stop or StopRequest()
    on_outcome = on_outcome or _report
    outcomes = []
    prepared = {}
    logdir = Path(outdir) / "logs"
    fields = prepare_fields(dataroot, outdir)

    def record(outcome):
        outcomes.append(outcome)
        on_outcome(outcome)
        if outcome.write_error:
            raise SuiteAborted(f"{outcome.write_error}; the suite stops here", outcomes)

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
                            first.job.prepare, fields,
                            logdir / f"{first.name}.J{first.run}.prepare.log", stop, echo, grace)
                    except OSError as exc:
                        prepared[key] = (False, f"cannot run prepare commands: {exc.strerror}")
            ok, message = prepared[key]
            if on_wave is not None:
                on_wave(wave)
            if not ok:
                now = time.time()
                for lch in wave:
                    rec = fail_record(lch, None, "error", message, None, [message], now, now)
                    outcome = Outcome(lch, None, False, None, "error", 0.0)
                    try:
                        outcome.result_path = write_result(rec, lch.fail_path)
                    except OSError as exc:
                        outcome.write_error = f"cannot write {lch.fail_path}: {exc.strerror}"
                    record(outcome)
                continue
            for outcome in run_wave(wave, outdir, stop=stop, on_line=on_line, grace=grace):
                record(outcome)
            if stop.signum is not None:
                raise Interrupted(stop.signum)
    except Interrupted as exc:
        exc.outcomes = outcomes
        raise
    return outcomes


def _report(o):
    status = "PASS" if o.success else f"FAIL ({o.reason})"
    say(f"milarun: {o.launch.group} J{o.launch.job_id}: {status} in {o.duration:.1f} s "
        f"-> {o.result_path}")


def tally(outcomes):
    """``"12 passed, 1 failed"`` (and ``", 2 interrupted"`` when some were) for outcomes."""
    passed = sum(o.success for o in outcomes)
    cut = sum(o.reason == "interrupted" for o in outcomes)
    text = f"{passed} passed, {len(outcomes) - passed - cut} failed"
    return text + (f", {cut} interrupted" if cut else "")
