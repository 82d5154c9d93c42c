"""Tie a child's life to its parent's (Linux ``PR_SET_PDEATHSIG``). No torch here.

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

from .. import PARENT_AT_START

#: Environment variable the launcher sets for its children.
ENV = "MILARUN_PDEATHSIG"
_PR_SET_PDEATHSIG = 1


@functools.lru_cache(maxsize=1)
def _setpriv():
    """The path of a ``setpriv`` that knows ``--pdeathsig`` (util-linux >= 2.33), or None."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    try:
        ok = subprocess.run([setpriv, "--pdeathsig", "KILL", "--", "true"], timeout=10,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL).returncode == 0
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
