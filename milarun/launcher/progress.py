"""Progress of a suite run: launches done / total, passed / failed, elapsed time, time left.

``milarun jobs`` creates one ``SuiteProgress`` over every launch of its plan and tells it when a
wave of launches starts (``started``), when a launch ends (``finished``), each line a child
prints (``child_output``) and its own messages (``message``). Two displays:

* live (a terminal): a ``rich`` progress bar on the stream; messages and finished launches are
  printed above it, the last line of each running launch is shown dimmed under it;
  ``verbose=True`` prints every child line above the bar instead.
* plain (a log file, a pipe, CI): plain lines and no escape codes at all — one line per started
  wave and per finished launch, each with ``[done/total]``; child lines only when verbose.

Time left. A launch's expected duration is, in order of preference: the mean duration measured
for its summary group so far in this run; the baseline's duration for that group; the floor
``estimate_seconds(job)`` derived from the job's own options. Launches started together run at
once, so a wave costs its longest launch; launches not started yet are grouped into waves by
(group, run) — the per-device launches of one per-gpu job share a group, while each step of a
gpu-progression has its own group and runs alone. Running launches count for what is left of
their expected duration.

Robustness: a closed terminal (SIGHUP, a closed SSH session: EIO, BrokenPipeError, ValueError on
a closed file) never raises out of this module. The display stops silently and ``display_lost``
records why; the launcher goes on. No torch here: the launcher imports this module.
"""

import math
import os
import re
import sys
import threading
import time
from typing import IO, cast

from ..formats import child

DEFAULT_STARTUP_S = 10.0  # interpreter, torch import, model and data set up before the first sample
TAIL_LINES = 8  # running launches whose last line is shown under the live bar
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?"
    r"|[\x00-\x08\x0b-\x1f\x7f]"
)


def _option_defaults():
    """Defaults of the options every experiment accepts (:data:`child.COMMON_DEFAULTS`)."""
    return child.COMMON_DEFAULTS


def _number(value, default):
    """``value`` as a finite non-negative float, else ``default``."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return float(default)
    ok = math.isfinite(out) and out >= 0 and not isinstance(value, bool)
    return out if ok else float(default)


def estimate_seconds(job, startup=DEFAULT_STARTUP_S):
    """Expected wall time (s) of one launch of ``job``, from its floor.

    The floor is ``--min-steady`` (s) of steady state plus ``--warmup`` windows of
    ``--sample-duration`` (s) plus ``startup`` (s); options the job does not set take the defaults
    of the child protocol (:data:`milarun.formats.child.COMMON_DEFAULTS`). It is a lower bound
    when ``--max-count`` lasts longer than that floor. Never more than ``job.timeout`` (s). Bad
    values fall back to the defaults.

    Args:
        job: a ``milarun.profile.job.Job`` (``.arguments`` as ``{flag: value}``,
            ``.timeout``).
        startup: seconds allowed for the child's start-up.
    """
    defaults = _option_defaults()
    args = {str(k).lstrip("-").replace("-", "_"): v for k, v in (job.arguments or {}).items()}

    def get(key):
        return _number(args.get(key, defaults[key]), defaults[key])

    seconds = get("min_steady") + get("warmup") * get("sample_duration") + float(startup)
    return min(seconds, _number(job.timeout, seconds) or seconds)


def format_duration(seconds):
    """``"45 s"``, ``"3 min 5 s"``, ``"1 h 5 min"`` for a number of seconds."""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def decide_live(stream, environ=None):
    """True when ``stream`` should get a live bar: a terminal, not CI, not ``TERM=dumb``."""
    environ = os.environ if environ is None else environ
    if environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        return False
    if environ.get("TERM", "") == "dumb":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False


def clean_line(line):
    """A child's output line without its newline, escape sequences and control characters.

    A carriage return keeps only what follows it (what a terminal would show).
    """
    if isinstance(line, bytes):
        line = line.decode(errors="replace")
    line = line.rstrip("\r\n")
    line = line.rsplit("\r", 1)[-1]
    return _CONTROL.sub("", line)


def _key(launch):
    return (launch.group, launch.job_id)


class _SafeStream:
    """File wrapper whose writes never raise: the first failure calls ``on_error`` and mutes it."""

    def __init__(self, stream, on_error):
        self._stream = stream
        self._on_error = on_error
        self.dead = False

    @property
    def encoding(self):
        return getattr(self._stream, "encoding", None) or "utf-8"

    def isatty(self):
        try:
            return self._stream.isatty()
        except (AttributeError, OSError, ValueError):
            return False

    def write(self, text):
        if self.dead:
            return len(text)
        try:
            try:
                return self._stream.write(text)
            except UnicodeEncodeError:  # e.g. an ASCII terminal: not a closed one
                enc = self.encoding
                return self._stream.write(text.encode(enc, "replace").decode(enc))
        except (OSError, ValueError) as exc:  # EIO, EPIPE, closed file
            self.dead = True
            self._on_error(exc)
            return len(text)

    def flush(self):
        if self.dead:
            return
        try:
            self._stream.flush()
        except (OSError, ValueError) as exc:
            self.dead = True
            self._on_error(exc)


class SuiteProgress:
    """Where a suite run stands; see the module docstring.

    Args:
        launches: every ``plan.Launch`` to run (``.group``, ``.job_id``, ``.job``, ``.name``,
            ``.run``, ``.device``, ``.timeout``). A launch is known by ``(group, job_id)``.
        stream: text file to display on (default ``sys.stderr``).
        live: True for the live bar, False for plain lines, None to decide from the stream and
            the environment (``decide_live``).
        verbose: print every child line, prefixed ``[group Jrun.device] ``.
        baseline: optional ``{group: mean duration (s)}``; bad values are ignored.
        startup: start-up allowance (s) for ``estimate_seconds``.
        clock: monotonic clock (s), for tests.

    Attributes:
        display_lost: None, or why the display stopped (the stream failed: closed terminal).
    """

    def __init__(
        self,
        launches,
        stream=None,
        live=None,
        verbose=False,
        baseline=None,
        startup=DEFAULT_STARTUP_S,
        clock=time.monotonic,
    ):
        self.launches = list(launches)
        self.total = len(self.launches)
        self.verbose = verbose
        self.baseline = {g: float(v) for g, v in (baseline or {}).items() if _number(v, -1) > 0}
        self.clock = clock
        self.display_lost = None
        stream = sys.stderr if stream is None else stream
        self._is_stderr = stream is sys.stderr
        self._stream = _SafeStream(stream, self._lost)
        self.live = decide_live(self._stream) if live is None else bool(live)
        self._lock = threading.RLock()
        self._floor = {}  # id(job) -> estimate_seconds(job)
        self._startup = startup
        self._pending = {_key(lch): lch for lch in self.launches}
        self._running = {}  # key -> (launch, start time)
        self._durations = {}  # group -> [s]
        self._done = set()
        self.passed = self.failed = 0
        self._tails = {}  # key -> (label, last line)
        # Read without the lock by the live display (no lock-order cycle with rich's locks)
        self._snap = (0, 0, 0, 0.0, None)  # done, passed, failed, pending waves (s), running end
        self._tail_view: tuple[tuple[str, str], ...] = ()
        self._progress = self._task = None
        with self._lock:
            self._update()
        self.t0 = clock()  # after the floors are computed (their first call imports coleo)

    # -- estimates -------------------------------------------------------------------------
    def expected(self, launch):
        """Expected duration (s) of ``launch``: measured mean, else baseline, else floor."""
        measured = self._durations.get(launch.group)
        if measured:
            seconds = sum(measured) / len(measured)
        elif launch.group in self.baseline:
            seconds = self.baseline[launch.group]
        else:
            job = launch.job
            if id(job) not in self._floor:
                self._floor[id(job)] = estimate_seconds(job, self._startup)
            seconds = self._floor[id(job)]
        return min(seconds, _number(launch.timeout, seconds) or seconds)

    def _update(self):
        """Recompute the snapshot read by ``status`` and the live display (lock held)."""
        waves: dict = {}
        for lch in self._pending.values():
            key = (lch.group, lch.run)
            waves[key] = max(waves.get(key, 0.0), self.expected(lch))
        ends = [t + self.expected(lch) for lch, t in self._running.values()]
        self._snap = (
            len(self._done),
            self.passed,
            self.failed,
            sum(waves.values()),
            max(ends) if ends else None,
        )
        self._tail_view = tuple(self._tails.values())[-TAIL_LINES:]
        if self.display_lost is not None:
            self._stop_live()
        if self._progress is not None:
            self._progress.update(self._task, completed=len(self._done))

    def _eta(self, now, snap):
        done, _, _, pending_s, running_end = snap
        if done >= self.total:
            return 0.0
        return pending_s + (max(0.0, running_end - now) if running_end is not None else 0.0)

    def status(self):
        """``{"done", "total", "passed", "failed", "elapsed_s", "eta_s"}`` (times in s)."""
        snap, now = self._snap, self.clock()
        return {
            "done": snap[0],
            "total": self.total,
            "passed": snap[1],
            "failed": snap[2],
            "elapsed_s": now - self.t0,
            "eta_s": self._eta(now, snap),
        }

    def summary_line(self):
        """``"2 min 10 s elapsed, about 3 min 5 s left"`` (or the tally once all are done)."""
        st = self.status()
        head = f"{format_duration(st['elapsed_s'])} elapsed"
        if st["done"] >= self.total:
            return f"{head}, {st['passed']} passed, {st['failed']} failed"
        return f"{head}, about {format_duration(st['eta_s'])} left"

    # -- events ----------------------------------------------------------------------------
    def started(self, launches):
        """A wave of ``launches`` began now (they run concurrently)."""
        with self._lock:
            now = self.clock()
            launches = list(launches)
            for lch in launches:
                self._pending.pop(_key(lch), None)
                self._running[_key(lch)] = (lch, now)
            self._update()
            if not self.live and launches:
                names = ", ".join(f"{lch.group} J{lch.job_id}" for lch in launches[:4])
                more = f" and {len(launches) - 4} more" if len(launches) > 4 else ""
                self._plain(f"{self._counter()} {self.summary_line()}; starting {names}{more}")

    def finished(self, outcome):
        """A launch ended: ``outcome`` has ``.launch``, ``.success``, ``.reason``, ``.duration``
        (s, or None: measured here from ``started``) and ``.result_path``."""
        with self._lock:
            lch = outcome.launch
            key = _key(lch)
            start = self._running.pop(key, (None, None))[1]
            self._pending.pop(key, None)
            self._tails.pop(key, None)
            duration = _number(getattr(outcome, "duration", None), -1)
            if duration < 0 and start is not None:
                duration = self.clock() - start
            if duration >= 0:
                self._durations.setdefault(lch.group, []).append(duration)
            if key not in self._done:
                self._done.add(key)
                if outcome.success:
                    self.passed += 1
                else:
                    self.failed += 1
            self._update()
            status = "PASS" if outcome.success else f"FAIL ({outcome.reason or 'error'})"
            took = f" in {duration:.1f} s" if duration >= 0 else ""
            path = f" -> {outcome.result_path}" if getattr(outcome, "result_path", None) else ""
            line = f"{self._counter()} {lch.group} J{lch.job_id}: {status}{took}{path}"
            if self.live:
                self._print(line)
            else:
                self._plain(line)
                if not self._running:
                    self._plain(f"{self._counter()} {self.summary_line()}")

    def child_output(self, launch, line):
        """One line of a child's stdout/stderr (thread-safe). Verbose: printed with the prefix
        ``[group Jrun.device] ``; live: kept as the launch's last line under the bar; plain:
        dropped (it is in the launch's log file)."""
        if not (self.verbose or self.live):
            return  # plain: the line is in the log; never wait on the display lock
        text = clean_line(line)
        label = f"{launch.group} J{launch.job_id}"
        if not self.verbose:
            # Kept without the lock: a pump thread must never wait on a terminal that
            # blocks (Ctrl-S, a sleeping SSH client) or the child stalls on its pipe.
            if text.strip():
                try:
                    self._tails[_key(launch)] = (label, text)
                    self._tail_view = tuple(self._tails.values())[-TAIL_LINES:]
                except RuntimeError:  # resized by another thread: the next line redraws
                    pass
            return
        with self._lock:
            if self.live:
                self._print(f"[{label}] {text}")
            else:
                self._plain(f"[{label}] {text}", prefix="")

    def message(self, text):
        """A line of the launcher's own, printed above the bar (or as a plain line)."""
        with self._lock:
            if self.live:
                self._print(str(text))
            else:
                self._plain(str(text), prefix="")

    # -- output ----------------------------------------------------------------------------
    def _counter(self):
        return f"[{len(self._done)}/{self.total}]"

    def _lost(self, exc):
        # May run in rich's refresh thread: only record here; _stop_live runs on the next event
        if self.display_lost is None:
            self.display_lost = f"{type(exc).__name__}: {exc}"

    def _plain(self, text, prefix="milarun: "):
        self._stream.write(f"{prefix}{clean_line(text)}\n")
        self._stream.flush()

    def _print(self, text):
        if self.display_lost is not None:
            return self._stop_live()
        if self._progress is None:
            return self._plain(text, prefix="")
        from rich.text import Text

        try:
            self._progress.console.print(Text(clean_line(text)), soft_wrap=True)
        except (OSError, ValueError) as exc:  # normally caught by _SafeStream already
            self._lost(exc)

    def __enter__(self):
        with self._lock:
            if self.live and self._progress is None and self.display_lost is None:
                self._start_live()
        return self

    def __exit__(self, *exc):
        with self._lock:
            self._stop_live()
        return False

    def _stop_live(self):
        progress, self._progress = self._progress, None
        if progress is not None:
            try:
                progress.stop()
            except (OSError, ValueError) as err:
                self._lost(err)

    def _start_live(self):
        from rich.console import Console, Group
        from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn
        from rich.text import Text

        owner = self

        class CountColumn(ProgressColumn):
            def render(self, task):
                done, passed, failed = owner._snap[:3]
                return Text(
                    f"{done}/{owner.total} ({passed} passed, {failed} failed)",
                    no_wrap=True,
                    overflow="ellipsis",
                )

        class SuiteBar(Progress):
            def get_renderables(self):
                yield self.make_tasks_table(self.tasks)
                lines = [Text(f"  {owner.summary_line()}", no_wrap=True, overflow="ellipsis")]
                lines += [
                    Text(f"  {label}: {line}", style="dim", no_wrap=True, overflow="ellipsis")
                    for label, line in owner._tail_view
                ]
                yield Group(*lines)

        # a text stream by duck typing (write, flush, isatty, encoding)
        console = Console(file=cast(IO[str], self._stream), force_terminal=True)
        # Never capture sys.stdout: it may be a file while the bar is on the terminal
        self._progress = SuiteBar(
            TextColumn("milarun"),
            BarColumn(bar_width=20),
            CountColumn(),
            console=console,
            transient=False,
            refresh_per_second=4,
            redirect_stdout=False,
            redirect_stderr=self._is_stderr,
        )
        self._task = self._progress.add_task(
            "suite", total=max(self.total, 1), completed=len(self._done)
        )
        self._progress.start()
