"""Run a plan's waves in order: each wave's launches at once, a job's ``prepare`` commands
before its first wave, timeouts and stop requests, one outcome per launch, and their tally.

A FAIL record that cannot be written is one error line naming the file and the suite goes
on, except on a full disk or quota or a read-only folder: that stops the suite with
:class:`SuiteAborted`; what was written stays. A stop request stops every running child and
raises :class:`milarun.launcher.stopping.Interrupted`.
"""

import time
from pathlib import Path

from ..errors import say
from ..host import supervise
from .child import Child
from .failures import DISK_FULL, write_fail
from .outcome import Outcome, conclude
from .prepare import prepare_fields, run_prepare
from .stopping import ABANDON_S, POLL_S, Interrupted, StopRequest, stop_all

#: Children that ended at most this many seconds before a stop signal count as
#: stopped by it (a signal sent to the whole job, as by scancel, may reach them first).
STOP_WINDOW_S = 2.0


class SuiteAborted(Exception):
    """A record could not be written (full disk, read-only folder): the suite stops.

    Attributes:
        outcomes: list of ``Outcome`` so far.
    """

    def __init__(self, message, outcomes=()):
        super().__init__(message)
        self.outcomes = list(outcomes)


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
    children = [Child(launch, outdir, on_line) for launch in launches]
    synced: dict = {}
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
                c.health_end()  # its GPUs' health counters, as soon as it ended
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
            elif c.stopping is not None:  # timed out
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
    (:data:`milarun.launcher.failures.DISK_FULL`), which stops the suite.

    Args:
        stop: a :class:`StopRequest` (see :func:`milarun.launcher.stopping.stop_on_signals`).
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
    prepared: dict[tuple, tuple[bool, str | None]] = {}
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
