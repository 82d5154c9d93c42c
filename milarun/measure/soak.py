"""Time lost to faults at scale: the projection of the effective training time ratio (pure).

A soak run (the training tests' soak mode) measures, on the machine under test, what one
fault costs: ``C``, the time to save one checkpoint, and ``R``, the time from the fault to
the first training step of the restarted job (failure detection, teardown, new processes,
set-up, checkpoint load). This module projects what these two figures mean for a job of
``N`` GPUs on a cluster of such machines. The model and its sources:

* **Effective training time ratio** (ETTR): productive training time over wall-clock time
  (Kokolis et al. 2024, "Revisiting Reliability in Large-Scale Machine Learning Research
  Clusters", arXiv:2410.21680).
* **Failures are independent**, so a job's mean time between interruptions falls as ``1/N``::

      M_N = M_1024 × 1024 / N            (hours)

  The default ``M_1024`` = 7.9 h (:data:`PUBLISHED_MTBF_1024_H`) is Kokolis et al. 2024's
  fitted mean time to failure of a 1,024-GPU job. Their own fit gives 1.8 h at 16,384 GPUs
  where this linear scaling gives 0.49 h: linear scaling is pessimistic at large ``N``
  (failures of a large job are not all independent GPU faults), so the ETTR projected at
  large scale is a lower bound of what such a cluster would show.
* **Checkpoint interval**: Young's optimum ``T* = sqrt(2 C M_N)`` (Young 1974, "A first
  order approximation to the optimum checkpoint interval", CACM 17(9)).
* **Expected ETTR**, first order (Young 1974; Daly 2006, "A higher order estimate of the
  optimum checkpoint interval for restart dumps", FGCS 22(3), its first-order terms)::

      ETTR = T / (T + C) × max(0, 1 − (R + (T + C) / 2) / M_N)

  The first factor is the time lost to saving (one save of ``C`` every ``T`` of work); the
  second the time lost to failures: each of the ``1 / M_N`` failures per unit of time costs
  the restart ``R`` plus, on average, half an interval of work done since the last
  checkpoint. It holds while ``C`` and ``R`` are small against ``M_N`` (Daly's higher-order
  terms matter when they are not); a failure during a restart or a save is not counted.

Units: seconds for times, hours for ``M_1024`` and the rows' ``mtbf_h``. Every function
raises ValueError on a negative or non-finite input (a bool is not a number here).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

#: Kokolis et al. 2024 (arXiv:2410.21680): the fitted mean time to failure of a 1,024-GPU
#: job, in hours: the default of ``milarun report --fault-mtbf``.
PUBLISHED_MTBF_1024_H = 7.9
#: The job size (GPUs) that ``M_1024`` is given at.
REFERENCE_GPUS = 1024
#: The scales (GPUs) of the report's projection.
SCALES = (512, 1024, 8192)
#: Largest ``M_1024`` accepted (hours): a century.
MAX_MTBF_H = 876_000.0


def _check(name: str, value: float, positive: bool = False) -> float:
    """``value`` as a float; ValueError when it is not a finite number ≥ 0 (> 0: ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, not {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        kind = "a finite number > 0" if positive else "a finite number ≥ 0"
        raise ValueError(f"{name} must be {kind}, not {value!r}")
    return v


def scaled_mtbf_s(mtbf_1024_h: float, gpus: int) -> float:
    """A job's mean time between interruptions at ``gpus`` GPUs, in seconds.

    ``M_N = M_1024 × 1024 / N`` (independent failures; the module's docstring has the
    source and why it is pessimistic at large ``N``).

    Args:
        mtbf_1024_h: the mean time between interruptions of a 1,024-GPU job (hours, > 0).
        gpus: the job's GPUs (an integer ≥ 1).

    Raises:
        ValueError: ``mtbf_1024_h`` not finite and > 0, or ``gpus`` not an integer ≥ 1.
    """
    m = _check("mtbf_1024_h", mtbf_1024_h, positive=True)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be an integer ≥ 1, not {gpus!r}")
    return m * 3600.0 * REFERENCE_GPUS / gpus


def young_interval(save_s: float, mtbf_s: float) -> float:
    """Young's optimal checkpoint interval ``T* = sqrt(2 C M)``, in seconds.

    Young 1974, "A first order approximation to the optimum checkpoint interval",
    CACM 17(9): the work between two checkpoints that minimises the time lost to saving
    and to the work redone after a failure, to first order in ``C / M``.

    Args:
        save_s: ``C``, the time to save one checkpoint (s, ≥ 0).
        mtbf_s: ``M``, the job's mean time between interruptions (s, > 0).

    Raises:
        ValueError: ``save_s`` negative or not finite, ``mtbf_s`` not finite and > 0.
    """
    c = _check("save_s", save_s)
    m = _check("mtbf_s", mtbf_s, positive=True)
    return math.sqrt(2.0 * c * m)


def expected_ettr(save_s: float, restart_s: float, mtbf_s: float, interval_s: float) -> float:
    """The expected effective training time ratio, first order, from 0 to 1.

    ``T / (T + C) × max(0, 1 − (R + (T + C) / 2) / M)`` (Young 1974; Daly 2006, "A higher
    order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3), its
    first-order terms): saving costs ``C`` every ``T`` of work, each failure the restart
    ``R`` and half an interval on average. With ``T = C = 0`` (free, continuous
    checkpoints) the first factor is 1.

    Args:
        save_s: ``C``, the time to save one checkpoint (s, ≥ 0).
        restart_s: ``R``, from a fault to the first step of the restarted job (s, ≥ 0).
        mtbf_s: ``M``, the job's mean time between interruptions (s, > 0).
        interval_s: ``T``, the work between two checkpoints (s, ≥ 0), e.g.
            :func:`young_interval`.

    Raises:
        ValueError: a negative or non-finite input, or ``mtbf_s`` = 0.
    """
    c = _check("save_s", save_s)
    r = _check("restart_s", restart_s)
    m = _check("mtbf_s", mtbf_s, positive=True)
    t = _check("interval_s", interval_s)
    useful = t / (t + c) if t + c > 0 else 1.0
    return useful * max(0.0, 1.0 - (r + (t + c) / 2.0) / m)


def projection(
    save_s: float,
    restart_s: float,
    mtbf_1024_h: float = PUBLISHED_MTBF_1024_H,
    scales: Iterable[int] = SCALES,
) -> list[dict[str, Any]]:
    """The projected ETTR of a job at each scale, checkpointing at Young's interval.

    For each ``N`` of ``scales``: ``M_N`` (:func:`scaled_mtbf_s`), ``T* = sqrt(2 C M_N)``
    (:func:`young_interval`) and the expected ETTR at ``T*`` (:func:`expected_ettr`); the
    module's docstring has the model, its sources and its limits.

    Args:
        save_s: ``C``, the measured time to save one checkpoint (s, ≥ 0).
        restart_s: ``R``, the measured time from a fault to the first step of the
            restarted job (s, ≥ 0).
        mtbf_1024_h: a 1,024-GPU job's mean time between interruptions (hours, > 0;
            default :data:`PUBLISHED_MTBF_1024_H`, Kokolis et al. 2024).
        scales: job sizes in GPUs (integers ≥ 1), in the rows' order.

    Returns:
        ``[{"gpus": N, "mtbf_h": M_N in hours, "interval_s": T* in s, "ettr": 0..1}]``.

    Raises:
        ValueError: a negative or non-finite input, ``mtbf_1024_h`` = 0, or a scale that
            is not an integer ≥ 1.
    """
    _check("save_s", save_s)
    _check("restart_s", restart_s)
    _check("mtbf_1024_h", mtbf_1024_h, positive=True)
    rows = []
    for gpus in scales:
        m = scaled_mtbf_s(mtbf_1024_h, gpus)
        t = young_interval(save_s, m)
        rows.append(
            {
                "gpus": gpus,
                "mtbf_h": m / 3600.0,
                "interval_s": t,
                "ettr": expected_ettr(save_s, restart_s, m, t),
            }
        )
    return rows


__all__ = [
    "PUBLISHED_MTBF_1024_H",
    "REFERENCE_GPUS",
    "SCALES",
    "MAX_MTBF_H",
    "scaled_mtbf_s",
    "young_interval",
    "expected_ettr",
    "projection",
]
