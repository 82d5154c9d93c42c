"""Run one agent command per node (``ssh`` commands) as one launch, like
``srun --kill-on-bad-exit``.

``python -m milarun.launcher.fanout '[[argv of node 1], [argv of node 2], ...]'``

Starts every agent at once, copies their output (prefixed by nothing: the
launcher's log already names the launch), and waits. When one agent fails
(non-zero exit or signal) the others get SIGTERM, then SIGKILL after a grace
period, so a multi-node job never leaves a half of itself waiting in a
rendezvous. SIGTERM, SIGINT and SIGHUP received here are passed on to every
agent. The exit status is the first failing agent's (``ssh`` returns 255 when
its connection failed or dropped: then the line ``milarun.launcher.fanout: node-lost
<agent index>`` goes to stderr), or 0 when all succeeded.

The start barrier's secret comes in this process's environment
(``MILARUN_BARRIER_SECRET``; never in its argv, which ``ps`` shows to every
user) and goes to each agent's stdin as one line, then EOF: the remote command
reads it from there (``milarun.plan.nodes.READ_SECRET``). Without it, agents get
/dev/null.

No torch here.
"""

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

from ..formats.barrier import ENV_SECRET
from ..host import supervise

#: Seconds between SIGTERM and SIGKILL for the remaining agents.
GRACE_S = 10.0


def _pump(src, dst):
    for line in iter(src.readline, b""):
        try:
            dst.write(line)
            dst.flush()
        except (OSError, ValueError):
            pass


def _signal_all(procs, sig):
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(sig)
            except OSError:
                pass


def _feed(proc, text):
    """Write ``text`` to ``proc``'s stdin and close it; an agent that already ended
    (its pipe broken) is left to report its own failure."""
    try:
        proc.stdin.write(text.encode())
        proc.stdin.close()
    except OSError:
        pass


def run(agents, grace=GRACE_S, secret=None):
    """Run ``agents`` (list of argv lists) at once; return the exit status (see module doc).

    ``secret``: the barrier secret (str) each agent reads as one line on stdin, or None
    (stdin is /dev/null)."""
    procs = []
    threads = []
    for argv in agents:
        p = subprocess.Popen(
            supervise.supervised_argv(argv),
            stdin=subprocess.DEVNULL if secret is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        procs.append(p)
        if secret is not None:  # a pipe buffer holds one line: this never blocks
            _feed(p, secret + "\n")
        for src, dst in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer)):
            t = threading.Thread(target=_pump, args=(src, dst), daemon=True)
            t.start()
            threads.append(t)

    def forward(signum, frame):
        _signal_all(procs, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    status = 0
    stopping = []  # supervise.GroupStop of every agent once one failed
    while any(p.poll() is None for p in procs):
        for i, p in enumerate(procs):
            rc = p.poll()
            if rc is not None and rc != 0 and status == 0:
                status = rc if rc > 0 else 128 - rc
                if rc == 255:
                    sys.stderr.write(f"milarun.launcher.fanout: node-lost {i}\n")
                    sys.stderr.flush()
                # SIGTERM to the others (they share this process's group: each agent
                # alone), SIGKILL after the grace, never given up on
                stopping = [supervise.GroupStop(q, grace, math.inf) for q in procs]
        for stop in stopping:
            stop.step()
        time.sleep(0.1)
    for i, p in enumerate(procs):
        if p.returncode != 0 and status == 0:
            status = p.returncode if p.returncode > 0 else 128 - p.returncode
            if p.returncode == 255:
                sys.stderr.write(f"milarun.launcher.fanout: node-lost {i}\n")
    for t in threads:
        t.join(timeout=5)
    return status


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    supervise.from_environment()
    try:
        agents = json.loads(argv[0])
        if not (
            isinstance(agents, list)
            and agents
            and all(
                isinstance(a, list) and a and all(isinstance(x, str) for x in a) for a in agents
            )
        ):
            raise ValueError("expected a non-empty list of argv lists")
    except (IndexError, ValueError) as exc:
        sys.stderr.write(f"milarun.launcher.fanout: error: {exc}\n")
        return 2
    return run(agents, secret=os.environ.get(ENV_SECRET))


if __name__ == "__main__":
    sys.exit(main())
