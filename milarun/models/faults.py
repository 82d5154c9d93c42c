"""Fault-injection experiments that check the launcher and the student cgroups.

* ``memhog``: allocates and touches ``--mib`` MiB in 64 MiB chunks (items =
  MiB); past the student's memory limit it is OOM-killed in its cgroup.
* ``crash``: raises after ``--after`` seconds (the child writes its own FAIL).
* ``hang``: sleeps ``--seconds`` (for timeouts).
* ``die``: kills itself with ``--signal`` (no result is written); with
  ``--rank R`` only the torchrun rank R does, and the others count slowly
  until they are stopped (a rank that dies under a distributed job).
* ``crawl``: counts ``--per-step`` items every ``--step-seconds`` through the
  rate logger (samples reach the journal), for ``--max-count`` items; with
  ``--exit-code N`` it exits with N *after* its record was written; with
  ``--setup S`` it first sleeps S seconds (a slow set-up, before the start barrier).
* ``flaky``: fails unless the file ``--pass-if`` exists (for ``--resume``).
* ``nan``: counts like ``crawl`` and logs a loss that becomes NaN (or
  infinite, ``--value inf``) from step ``--after`` on: the child's validation
  turns its record into a ``nan-loss`` FAIL.

They run no torch code (the harness they count through imports torch).
"""

import atexit
import os
import signal
import time

from coleo import Option, default, tooled

from ..bench.distributed import World
from ..bench.loop import rate_logger

#: These workloads train nothing: no loss (``nan`` logs one anyway, on purpose).
NO_LOSS = "fault-injection workloads train nothing"


def memhog(exp, argv):
    """Allocate memory step by step; see the module docstring."""
    exp.cli(_memhog, argv)


@tooled
def _memhog(exp):
    # MiB to allocate in all
    mib: Option & int = default(256)
    exp.options["max_count"] = mib
    chunks = []
    logger = rate_logger(exp)
    for step in logger.steps():
        block = bytearray(64 * 2**20)
        block[::4096] = b"\1" * len(block[::4096])  # touch every page
        chunks.append(block)
        step.set_count(64)
    exp.metrics["allocated_mib"] = 64 * len(chunks)


def crash(exp, argv):
    """Raise RuntimeError after ``--after`` seconds."""
    exp.cli(_crash, argv)


@tooled
def _crash(exp):
    # Seconds before the crash
    after: Option & float = default(0.1)
    time.sleep(after)
    raise RuntimeError("deliberate crash (milarun.models.faults:crash)")


def hang(exp, argv):
    """Sleep ``--seconds`` seconds, then succeed."""
    exp.cli(_hang, argv)


@tooled
def _hang(exp):
    # Seconds to sleep
    seconds: Option & float = default(3600.0)
    print("hang: sleeping", flush=True)
    time.sleep(seconds)


def die(exp, argv):
    """Kill this process with ``--signal`` (default SIGSEGV)."""
    exp.cli(_die, argv)


@tooled
def _die(exp):
    # Signal name to send to ourselves
    signal_name: Option = default("SIGSEGV")
    # Only this torchrun rank dies (-1: every process)
    rank: Option & int = default(-1)
    if rank >= 0 and World.from_environment().rank != rank:
        for step in rate_logger(exp).steps():
            time.sleep(0.05)
            step.set_count(1)
        return
    time.sleep(3.0 if rank >= 0 else 0.0)  # let the others start counting, even under load
    os.kill(os.getpid(), getattr(signal, signal_name))


def crawl(exp, argv):
    """Count items slowly through the rate logger; see the module docstring."""
    exp.cli(_crawl, argv)


@tooled
def _crawl(exp):
    # Seconds each step sleeps
    step_seconds: Option & float = default(0.02)
    # Items counted per step
    per_step: Option & int = default(1)
    # Exit status after the record was written (0: a normal exit)
    exit_code: Option & int = default(0)
    # Seconds of set-up (a sleep) before the timed loop
    setup: Option & float = default(0.0)
    time.sleep(setup)
    if exit_code:
        atexit.register(os._exit, exit_code)  # runs after the record is written
    print("crawl: started", flush=True)
    for step in rate_logger(exp).steps():
        time.sleep(step_seconds)
        step.set_count(per_step)


def flaky(exp, argv):
    """Fail unless ``--pass-if`` names an existing file."""
    exp.cli(_flaky, argv)


@tooled
def _flaky(exp):
    # The test passes only when this file exists
    pass_if: Option = default("")
    if not (pass_if and os.path.exists(pass_if)):
        raise RuntimeError(f"deliberate failure: {pass_if!r} does not exist")
    for step in rate_logger(exp).steps():
        step.set_count(1)


def nan(exp, argv):
    """Count items and log a loss that turns NaN; see the module docstring."""
    exp.cli(_nan, argv)


@tooled
def _nan(exp):
    # Seconds each step sleeps
    step_seconds: Option & float = default(0.01)
    # The step from which the loss is not finite (0: from the first step)
    after: Option & int = default(10)
    # The loss from then on: nan, inf or -inf
    value: Option = default("nan")
    for i, step in enumerate(rate_logger(exp).steps()):
        time.sleep(step_seconds)
        step.set_count(1)
        step.log(loss=float(value) if i >= after else 1.0 / (i + 1))
