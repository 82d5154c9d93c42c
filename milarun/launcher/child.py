"""Run one child: start it, copy its output, signal its process group, see it end.

Each child runs in its own session (so its process group can be signalled as a whole) under
``setpriv --pdeathsig KILL`` (it dies if the launcher is SIGKILLed, see
:mod:`milarun.host.supervise`). Its stdout and stderr go to
``OUTDIR/logs/<suite>.<job>.J<run>.<device>.log`` and, compactly, to the progress display;
the last lines of its stderr are kept for its FAIL record. The timeout and the stop are the
wave's (:mod:`milarun.launcher.waves`); the outcome is decided by
:mod:`milarun.launcher.outcome`. The health counters of its GPUs
(:mod:`milarun.host.health`) are read just before it starts and once it ended
(:meth:`Child.health_end`).
"""

import collections
import os
import resource
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

from ..errors import SetupError
from ..formats.outfile import open_append, own_dir
from ..host import isolation, supervise
from ..host.health import LaunchHealth

#: Lines of a child's stderr kept for its FAIL record.
STDERR_TAIL_LINES = 40
#: Longest line read from a child at once, and kept of a tail line (bytes, characters).
LINE_BYTES = 65536
TAIL_LINE_CHARS = 4096
#: Descriptors the launcher holds per running child: its stdout and stderr pipes, its log
#: and its connection to the start barrier (measured: 4,079 at 1,024 children).
FDS_PER_CHILD = 4
#: Descriptors the launcher holds besides its children's (its files, the barrier's socket).
FDS_SPARE = 64


def ensure_descriptors(children, limits=resource):
    """Make room for a wave of ``children`` processes: raise this process's soft limit of
    open descriptors (``RLIMIT_NOFILE``) to what the wave needs, never past the hard limit.
    A wave that outgrows the limit would otherwise stall: the start barrier cannot accept
    the last children's connections and the wave waits out ``--barrier-timeout``.

    Args:
        children: the most children running at once (the largest wave).
        limits: the ``resource`` module (tests give a fake).

    Returns:
        the soft limit now (descriptors).

    Raises:
        SetupError: the hard limit is below the need (``FDS_PER_CHILD`` per child and
            ``FDS_SPARE``).
    """
    soft, hard = limits.getrlimit(limits.RLIMIT_NOFILE)
    need = FDS_PER_CHILD * children + FDS_SPARE
    if soft == limits.RLIM_INFINITY or soft >= need:
        return soft
    if hard != limits.RLIM_INFINITY and hard < need:
        raise SetupError(
            f"a wave of {children} process(es) needs {need} open files in the launcher, "
            f"above this shell's hard limit of {hard}: raise it (ulimit -Hn {need}, or "
            f"nofile in /etc/security/limits.conf) or run fewer devices per host"
        )
    limits.setrlimit(limits.RLIMIT_NOFILE, (need, hard))
    return need


class Child:
    """One launch's process, its log and the last lines of its stderr.

    Attributes:
        launch: the ``plan.Launch``.
        tail: the last :data:`STDERR_TAIL_LINES` lines of its stderr.
        timed_out, stopped, abandoned: set by the wave that runs it.
        start_error, log_error: None, or why it could not start or be logged.
    """

    def __init__(self, launch, outdir, on_line=None):
        self.launch = launch
        self.outdir = Path(outdir)
        self.on_line = on_line
        self.tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
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
        self.health = LaunchHealth.for_launch(launch)  # None: CPU slots, nothing recorded
        try:
            # never through a symlink, nor into a FIFO or device (milarun.formats.outfile)
            logdir = own_dir(self.outdir / "logs")
            self.log: IO[bytes] | None = open_append(logdir / launch.log)
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
        if self.health is not None:
            self.health.begin()  # the counters before the launch (never raises)
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
                stdin = self.proc.stdin
                assert stdin is not None  # opened as a pipe when there is a feed
                stdin.write(feed.encode())
                stdin.close()
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
        if self.log is None:
            return
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

    def health_end(self):
        """The record's ``health`` field: the counters read once the child ended (the first
        call reads them, later ones give the same), or None for CPU slots."""
        return None if self.health is None else self.health.end()

    def finish(self):
        for t in self.threads:
            t.join(timeout=5)
        with self.lock:
            self._close_log()
