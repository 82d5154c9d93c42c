"""Synchronized starts, inside the child: wait at the wave's start barrier.

:func:`synchronize` runs once, right before the rate logger opens its first
window (the loops of :mod:`milarun.bench.rate` call it after the set-up: the
model is built, the loader's iterator created and its first batch fetched).
A process launched alone has no ``MILARUN_BARRIER`` in its environment and
does not wait. Under torchrun, rank 0 waits at the launcher's barrier for
the other launches of the wave, then every rank of the job meets at a
``torch.distributed`` barrier, so the whole job starts its timed loop at once.
A job torchrun restarted (``TORCHELASTIC_RESTART_COUNT`` above 0: the soak mode's
injected fault, :mod:`milarun.models.soak`) does not wait at the wave's barrier again, as
its wave started long ago; its ranks still meet at their own barrier.

What it records (``timings.barrier`` of the result, and a ``barrier`` line in
the journal): see :func:`milarun.formats.barrier.wait`, plus ``released_at``, the
release in seconds since the experiment's origin (the zero of the sample
times), which places this process's samples on the server's clock.
"""

import os
import time
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from ..formats import barrier
from .distributed import World


def synchronize(exp: Any, environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """Wait at the start barrier of ``exp``'s wave; returns what was recorded, or None
    when the process was launched alone.

    Raises:
        barrier.BarrierTimeout: no release within the wave's timeout (the child's
            record then fails with reason ``barrier-timeout``).
        ValueError: malformed barrier variables.
    """
    environ = os.environ if environ is None else environ
    config = barrier.from_environment(environ)
    if config is None:
        return None
    if World.from_environment(environ).restart_count > 0:
        _rank_barrier(environ)
        return None
    info: dict[str, Any] | None = None
    if World.from_environment(environ).rank == 0:
        try:
            info = barrier.wait(
                config["address"],
                config["wave"],
                config["label"],
                config["timeout"],
                secret=config["secret"],
            )
        except barrier.BarrierTimeout:
            exp.result["timings"]["barrier"] = {
                "address": config["address"],
                "wave": config["wave"],
                "label": config["label"],
                "timeout_s": config["timeout"],
                "released": None,
            }
            raise
    _rank_barrier(environ)
    if info is None:
        info = {
            "address": config["address"],
            "wave": config["wave"],
            "label": config["label"],
            "timeout_s": config["timeout"],
        }
    info["released_at"] = max(0.0, time.perf_counter() - exp.origin)
    exp.result["timings"]["barrier"] = info
    if exp.journal is not None:
        exp.journal.write("barrier", **info)
    return info


def _rank_barrier(environ: Mapping[str, str]) -> None:
    """Every rank of a torchrun job waits for rank 0 (which waited for the wave)."""
    if World.from_environment(environ).size <= 1:
        return
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
