"""Supervise child processes: tie a child's life to its parent's (Linux
``PR_SET_PDEATHSIG``), and stop a process group (:func:`terminate_group`). No torch here.

The launcher starts every child under ``setpriv --pdeathsig KILL`` (util-linux),
so a ``milarun jobs`` killed with SIGKILL takes its children with it; nothing
of the suite runs unsupervised. A parent-death signal is not inherited by
grandchildren (the ranks a torchrun agent forks), so ``milarun run`` also asks
for one itself when the launcher set ``MILARUN_PDEATHSIG`` (to its own PID).
"""

import functools
import os
import shutil
import signal
import subprocess
import time

from .. import PARENT_AT_START

#: Environment variable the launcher sets for its children.
ENV = "MILARUN_PDEATHSIG"
_PR_SET_PDEATHSIG = 1
#: Seconds between two looks at processes that are ending.
POLL_S = 0.05
#: Seconds a process group may take to end after SIGKILL before it is abandoned
#: (a process stuck in the kernel, e.g. in a driver call, never ends).
ABANDON_S = 60.0


@functools.lru_cache(maxsize=1)
def _setpriv():
    """The path of a ``setpriv`` that knows ``--pdeathsig`` (util-linux >= 2.33), or None."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    try:
        ok = (
            subprocess.run(
                [setpriv, "--pdeathsig", "KILL", "--", "true"],
                timeout=10,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        ok = False
    return setpriv if ok else None


def supervised_argv(argv):
    """``argv`` behind ``setpriv --pdeathsig KILL --`` where a setpriv that supports it
    exists, else ``argv`` (``milarun run`` still sets its own parent-death signal)."""
    setpriv = _setpriv()
    if setpriv is None:
        return list(argv)
    return [setpriv, "--pdeathsig", "KILL", "--"] + list(argv)


def set_parent_death_signal(sig=signal.SIGKILL, launcher_pid=None, parent_at_start=None):
    """Ask the kernel to send ``sig`` to this process when its parent dies.

    Returns:
        True when set; False where the call is unavailable (not Linux). If
        the parent already died before the call (the parent is no longer
        ``parent_at_start``, or is PID 1 while the launcher was not PID 1
        itself), the process exits at once with status 1.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    parent = os.getppid()
    if parent_at_start is not None and parent != parent_at_start:
        os._exit(1)  # the parent died while we started (re-parented to a subreaper)
    if parent == 1 and launcher_pid != 1:
        os._exit(1)  # orphaned before we could ask: nobody supervises us
    return True


def from_environment():
    """Call :func:`set_parent_death_signal` when the launcher asked for it."""
    value = os.environ.get(ENV, "")
    if value.isdigit():
        set_parent_death_signal(launcher_pid=int(value), parent_at_start=PARENT_AT_START)


def group_members(pgid):
    """PIDs of the processes of group ``pgid`` that are not zombies (Linux ``/proc``)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
            state, _ppid, pgrp = stat[stat.rindex(b")") + 2 :].split()[:3]
        except (OSError, ValueError):
            continue  # ended meanwhile
        if int(pgrp) == pgid and state != b"Z":
            found.append(int(entry.name))
    return found


class ProcessGroup:
    """The process group a child leads (a ``Popen`` started with
    ``start_new_session=True``: the group's ID is its PID), for :func:`terminate_group`.

    ``until`` says when the group has ended:

    - ``"leader"``: when the child has; whatever it left in the group (loader
      workers) is then swept with SIGKILL at once, as it would also hold the
      pipes open. The child stays a zombie until that sweep (``waitid`` with
      ``WNOWAIT``), so the group's ID cannot be reused meanwhile. (torchrun's
      ranks have sessions of their own: they die with their agent, by their
      parent-death signal.)
    - ``"members"``: when no live process of the group is left (a ``sleep 1000 &``
      of a prepare command), not only when the child ended.
    """

    def __init__(self, proc, until="leader"):
        if until not in ("leader", "members"):
            raise ValueError(f"until must be 'leader' or 'members', not {until!r}")
        self.proc = proc
        self.until = until

    def poll(self):
        """None while the group runs, else the child's exit status."""
        if self.until == "members":
            self.proc.poll()  # reaps the child; the group ID stays ours while a member lives
            return None if group_members(self.proc.pid) else self.proc.returncode
        if self.proc.returncode is None:
            ended: object
            try:
                ended = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                ended = True
            if ended is None:
                return None
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the sweep
            except (ProcessLookupError, PermissionError):
                pass
        return self.proc.poll()

    def send_signal(self, sig):
        """``sig`` to every process of the group, unless it has ended (its ID may
        be free again: never signal it then)."""
        if self.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class GroupStop:
    """One group's way through :func:`terminate_group`, a step at a time, for a loop
    that watches other things meanwhile (the launcher's timeout watchdog):
    SIGTERM now, SIGKILL at every step once ``grace_s`` has passed (or after
    :meth:`kill`), abandoned ``abandon_s`` after the first SIGKILL.

    ``group``: anything with ``poll()`` (None while it runs) and
    ``send_signal(sig)``: a :class:`ProcessGroup`, or a ``Popen`` for a process
    that shares its parent's group (the fan-out's agents).
    """

    def __init__(self, group, grace_s, abandon_s=ABANDON_S, now=None):
        self.group = group
        self.grace_s = grace_s
        self.abandon_s = abandon_s
        self.started = time.monotonic() if now is None else now
        self.killed_at = None
        self.abandoned = False
        group.send_signal(signal.SIGTERM)

    def kill(self, now=None):
        """End the grace now."""
        if self.killed_at is None:
            self.killed_at = time.monotonic() if now is None else now

    def step(self, now=None):
        """True once the group has ended or is abandoned, else False (it got
        SIGKILL again if its grace is over)."""
        if self.group.poll() is not None:
            return True
        now = time.monotonic() if now is None else now
        if self.killed_at is None and now - self.started > self.grace_s:
            self.killed_at = self.started + self.grace_s
        if self.killed_at is not None:
            self.group.send_signal(signal.SIGKILL)  # again: what the group forked meanwhile
            if now - self.killed_at > self.abandon_s:
                self.abandoned = True
        return self.abandoned


def terminate_group(groups, grace_s, cut_short=None, abandon_s=ABANDON_S, poll_s=POLL_S):
    """Stop process groups together: SIGTERM to each, up to ``grace_s`` seconds for
    them to end (less once ``cut_short()`` is true: a second stop signal), then
    SIGKILL to what is left of each, again until it has ended (the sweep), for up
    to ``abandon_s`` seconds.

    Args:
        groups: one group or a list of them (see :class:`GroupStop`).

    Returns:
        the list of the groups abandoned: still running ``abandon_s`` after SIGKILL.
    """
    if not isinstance(groups, (list, tuple)):
        groups = [groups]
    stops = [GroupStop(g, grace_s, abandon_s) for g in groups]
    while True:
        now = time.monotonic()
        if cut_short is not None and cut_short():
            for stop in stops:
                stop.kill(now)
        if all([stop.step(now) for stop in stops]):
            return [stop.group for stop in stops if stop.abandoned]
        time.sleep(poll_s)
