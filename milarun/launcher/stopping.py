"""Stopping the launcher's children: the stop signals, the request they set, the exception a
stopped suite raises, and stopping a set of process groups.

SIGINT, SIGTERM and SIGHUP (see :class:`StopRequest`) stop every running child (SIGTERM,
``grace``, SIGKILL; a second signal skips the grace), each gets an ``interrupted`` record
(:mod:`milarun.launcher.outcome`), and the suite raises :class:`Interrupted`. A handler only
sets a flag: the launcher acts on it at its next poll.
"""

import signal
import time
from contextlib import contextmanager

from ..host import supervise

#: Seconds between two looks at the running children.
POLL_S = supervise.POLL_S
#: Seconds after SIGKILL before a child that will not die is given up on.
ABANDON_S = supervise.ABANDON_S
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


def stop_all(children, grace=5.0, stop=None):
    """SIGTERM every child's process group, wait up to ``grace`` s (less if a second
    stop signal arrives), then SIGKILL whatever is left of each group
    (:func:`milarun.host.supervise.terminate_group`); a group still there
    ``ABANDON_S`` s later is marked ``abandoned``."""
    first = stop.count if stop is not None else 0
    cut_short = (lambda: stop.count > first) if stop is not None else None
    for c in supervise.terminate_group(list(children), grace, cut_short, ABANDON_S, POLL_S):
        c.abandoned = True
