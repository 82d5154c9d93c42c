"""Run a test's ``prepare`` commands, once per (job, run), before its first wave."""

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from ..errors import say
from ..formats.outfile import open_append, own_dir
from ..host import supervise
from .stopping import POLL_S, Interrupted, StopRequest, stop_all


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
    a process group of its own, which is swept (:func:`milarun.launcher.stopping.stop_all`: SIGTERM,
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
