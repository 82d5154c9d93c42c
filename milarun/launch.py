"""Start launches, watch them, and turn every failure into a FAIL result.

The only module that starts processes. Each child runs in its own session
(so its process group can be signalled as a whole), its stdout and stderr are
copied to the terminal and to ``OUTDIR/logs/<suite>.<job>.J<run>.<device>.log``,
and it gets a timeout: SIGTERM to the group, ``grace`` seconds, then SIGKILL.
Ctrl-C stops every group and leaves no orphans; results already written stay.

When a child ends without writing its result, the parent writes a FAIL
result with the exit code or signal, the tail of stderr and a reason:
``oom-killed`` (the cgroup's OOM-kill counter went up), ``timeout``,
``signal`` or ``error``.
"""

import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import isolation
from .results.schema import new_result
from .results.store import write_result

STDERR_TAIL_LINES = 40
POLL_S = 0.05


@dataclass
class Outcome:
    """What became of one launch.

    Attributes:
        launch: the ``plan.Launch``.
        returncode: exit status (negative: killed by that signal).
        success: True when the child wrote a successful result and exited 0.
        result_path: the result file (the child's, or the FAIL one we wrote).
        reason: None, or ``oom-killed``/``timeout``/``signal``/``error``.
        duration: seconds.
    """

    launch: object
    returncode: int
    success: bool
    result_path: Path
    reason: str = None
    duration: float = 0.0


class _Child:
    def __init__(self, launch, outdir, echo):
        self.launch = launch
        self.outdir = Path(outdir)
        self.echo = echo
        self.tail = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.timed_out = False
        self.killed_at = None
        self.proc = None
        self.threads = []
        self.oom_before = isolation.oom_kill_count(launch.cgroup)
        logdir = self.outdir / "logs"
        logdir.mkdir(parents=True, exist_ok=True)
        self.log = open(logdir / launch.log, "ab")
        self.lock = threading.Lock()

    def start(self):
        env = dict(os.environ)
        env.update(self.launch.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.t0 = time.time()
        self.start_wall = self.t0
        try:
            self.proc = subprocess.Popen(self.launch.argv, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        except OSError as exc:
            self.proc = None
            self.start_error = f"cannot start {self.launch.argv[0]!r}: {exc.strerror}"
            self.tail.append(self.start_error)
            return
        prefix = f"[{self.launch.group} J{self.launch.job_id}] ".encode()
        for pipe, stream, keep in ((self.proc.stdout, sys.stdout, False),
                                   (self.proc.stderr, sys.stderr, True)):
            t = threading.Thread(target=self._pump, args=(pipe, stream, keep, prefix),
                                 daemon=True)
            t.start()
            self.threads.append(t)

    def _pump(self, pipe, stream, keep, prefix):
        for line in iter(pipe.readline, b""):
            with self.lock:
                self.log.write(line)
                self.log.flush()
            if keep:
                self.tail.append(line.decode(errors="replace").rstrip("\n"))
            if self.echo:
                try:
                    stream.buffer.write(prefix + line)
                    stream.flush()
                except (AttributeError, ValueError):
                    stream.write((prefix + line).decode(errors="replace"))
        pipe.close()

    def signal_group(self, sig):
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def poll(self):
        return -255 if self.proc is None else self.proc.poll()

    def finish(self):
        for t in self.threads:
            t.join(timeout=5)
        self.log.close()


def _find_result(outdir, launch, since):
    """The result file the child wrote for ``launch`` after ``since`` (Unix time), if any."""
    prefix = f"{launch.name}.J{launch.run}.{launch.device}."
    found = None
    for path in Path(outdir).glob(prefix + "*.json"):
        rest = path.name[len(prefix):]
        # guard against a device label that is a prefix of another ("1" vs "1-3")
        if not (rest.startswith("FAIL.") or rest[:1].isdigit()):
            continue
        if path.stat().st_mtime >= since - 1:
            found = path
    return found


def _result_ok(path):
    import json
    try:
        return json.loads(path.read_text()).get("success") is True
    except (OSError, ValueError):
        return False


def fail_reason(returncode, timed_out, oom_before, oom_after):
    """Classify a failed child: ``timeout``, ``oom-killed``, ``signal`` or ``error``.

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


def write_fail_result(launch, outdir, returncode, reason, stderr_tail, start, end,
                      message=None):
    """Write the FAIL result for a child that left none; returns its path."""
    rec = new_result(launch.name, launch.job_id, device=launch.device,
                     devices=launch.devices, run=launch.run, partition=launch.job.partition)
    rec["job"] = launch.job.definition
    rec["call"] = {"function": launch.job.experiment, "argv": list(launch.test_argv),
                   "arguments": {}}
    rec["environ"] = dict(launch.env)
    rec["host"] = {"hostname": socket.gethostname(), "cgroup": launch.cgroup}
    rec["timings"]["program"] = {"start": start, "end": end, "duration": end - start}
    sig = -returncode if returncode is not None and returncode < 0 else None
    if message is None:
        if reason == "timeout":
            message = f"no result after the {launch.timeout:g} s timeout"
        elif reason == "oom-killed":
            message = f"killed by the OOM killer in cgroup {launch.cgroup}"
        elif sig:
            message = f"killed by signal {signal.Signals(sig).name}"
        else:
            message = f"exited with status {returncode} without writing a result"
    rec["error"] = {"reason": reason, "type": "ChildFailure", "message": message,
                    "returncode": returncode, "signal": sig,
                    "stderr_tail": "\n".join(stderr_tail), "traceback": None}
    rec["success"] = False
    rec["written_by"] = "launcher"
    return write_result(rec, outdir)


def run_wave(launches, outdir, echo=True, grace=5.0):
    """Start every launch of a wave at once and wait for all of them.

    Returns:
        list of ``Outcome`` in launch order.

    Raises:
        KeyboardInterrupt: after stopping every child's process group.
    """
    children = [_Child(launch, outdir, echo) for launch in launches]
    for child in children:
        child.start()
    try:
        while True:
            pending = [c for c in children if c.poll() is None]
            if not pending:
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
    except KeyboardInterrupt:
        stop_all(children, grace)
        for c in children:
            c.finish()
        raise
    outcomes = []
    for c in children:
        c.finish()
        end = time.time()
        rc = c.poll()
        path = _find_result(outdir, c.launch, c.start_wall)
        if path is not None and rc == 0:
            ok = _result_ok(path)
            outcomes.append(Outcome(c.launch, rc, ok, path, None if ok else "error",
                                    end - c.t0))
            continue
        if path is not None and not c.timed_out:
            # the child recorded its own failure (an exception in the test)
            outcomes.append(Outcome(c.launch, rc, False, path, "error", end - c.t0))
            continue
        reason = fail_reason(rc, c.timed_out, c.oom_before,
                             isolation.oom_kill_count(c.launch.cgroup))
        msg = getattr(c, "start_error", None)
        path = write_fail_result(c.launch, outdir, rc, reason, list(c.tail), c.t0, end,
                                 message=msg)
        outcomes.append(Outcome(c.launch, rc, False, path, reason, end - c.t0))
    return outcomes


def stop_all(children, grace=5.0):
    """SIGTERM every child's process group, wait up to ``grace`` s, then SIGKILL."""
    for c in children:
        c.signal_group(signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline and any(c.poll() is None for c in children):
        time.sleep(POLL_S)
    for c in children:
        c.signal_group(signal.SIGKILL)
        if c.proc is not None:
            try:
                c.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass


def run_prepare(commands, fields, log_path, echo=True):
    """Run a test's prepare commands with ``sh -c``; returns (ok, message).

    Placeholders ``{dataroot}``, ``{outdir}``, ``{python}``, ``{milarun}``
    are filled (shell-quoted) from ``fields``. Output goes to ``log_path``.
    """
    import shlex
    quoted = {k: shlex.quote(str(v)) for k, v in fields.items()}
    quoted["milarun"] = f"{shlex.quote(sys.executable)} -m milarun"
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        for template in commands:
            cmd = template.format(**quoted)
            if echo:
                print(f"milarun: prepare: {cmd}", file=sys.stderr)
            proc = subprocess.run(["sh", "-c", cmd], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            log.write(proc.stdout)
            if echo and proc.stdout:
                sys.stderr.write(proc.stdout.decode(errors="replace"))
            if proc.returncode != 0:
                return False, f"prepare command failed with status {proc.returncode}: {cmd}"
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


def run_suite(waves, outdir, dataroot, echo=True, grace=5.0):
    """Run every wave in order; returns the list of all ``Outcome``.

    Prepare commands run once per (job, run), before its first wave. A
    failing prepare turns that job's launches into FAIL results. The suite
    always goes on to the next test. Ctrl-C stops the children, then
    re-raises ``KeyboardInterrupt`` with the outcomes so far in
    ``exc.outcomes``.
    """
    outcomes = []
    prepared = {}
    logdir = Path(outdir) / "logs"
    fields = {"dataroot": dataroot or "", "outdir": outdir, "python": sys.executable}
    try:
        for wave in waves:
            first = wave[0]
            key = (first.name, first.run)
            if key not in prepared:
                prepared[key] = (True, None)
                if first.job.prepare:
                    prepared[key] = run_prepare(
                        first.job.prepare, fields,
                        logdir / f"{first.name}.J{first.run}.prepare.log", echo)
            ok, message = prepared[key]
            if not ok:
                now = time.time()
                for lch in wave:
                    path = write_fail_result(lch, outdir, None, "error", [message], now, now,
                                             message=message)
                    outcomes.append(Outcome(lch, None, False, path, "error", 0.0))
                    _report(outcomes[-1])
                continue
            for outcome in run_wave(wave, outdir, echo=echo, grace=grace):
                outcomes.append(outcome)
                _report(outcome)
    except KeyboardInterrupt as exc:
        exc.outcomes = outcomes
        raise
    return outcomes


def _report(o):
    status = "PASS" if o.success else f"FAIL ({o.reason})"
    print(f"milarun: {o.launch.group} J{o.launch.job_id}: {status} in {o.duration:.1f} s "
          f"-> {o.result_path}", file=sys.stderr)


def tally(outcomes):
    """``"12 passed, 1 failed"`` for a list of outcomes."""
    passed = sum(o.success for o in outcomes)
    return f"{passed} passed, {len(outcomes) - passed} failed"
