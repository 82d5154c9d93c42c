"""The soak figures of a test group: time lost to one fault, and the run's ETTR (pure).

A training test run in soak mode checkpoints every N optimizer steps, has one rank killed
at a seeded step and torchrun restart the job from its last checkpoint; its record's
``metrics`` then hold the ``soak_*`` figures (a record is a soak record when
``metrics.soak_ettr`` is present): ``soak_save_s`` (median time of one checkpoint save, s),
``soak_load_s`` (loading the checkpoint on the restart, s), ``soak_restart_s`` (from the
fault to the first step of the restarted attempt, s), ``soak_lost_steps`` and
``soak_lost_s`` (the steps done after the last checkpoint, lost and redone, and their
time), ``soak_wall_s`` (first step to last, s) and ``soak_ettr`` (effective training time
ratio: productive time over wall time, Kokolis et al. 2024, arXiv:2410.21680), among others.

The summary keeps per test group ``tests[g].soak`` (:func:`soak_figures`): the median of
each figure over the group's **successful** records that carry soak figures, and ``n``,
their count. A failed record is left out even when it carries figures: its job did not
finish, so its wall time and ETTR cover a run cut short (a restart that never came
back, a timeout) and would not describe the same thing; its failure is counted with the
group's others. The report projects the figures to larger jobs
(:mod:`milarun.measure.soak`) when it renders them.

A record is someone else's file: every figure is checked to be a finite, non-negative
number (not a bool) at most 1e12 (the ETTR at most 1), else it is left out of its
median; a record whose ``soak_ettr`` fails that check is not a soak record.
"""

import statistics
from typing import Any

from ..measure.stats import finite

#: The summary's figures (``tests[g].soak[key]``) and the record's metric of each.
FIELDS = (
    ("save_s", "soak_save_s"),
    ("load_s", "soak_load_s"),
    ("restart_s", "soak_restart_s"),
    ("lost_s", "soak_lost_s"),
    ("lost_steps", "soak_lost_steps"),
    ("ettr", "soak_ettr"),
    ("wall_s", "soak_wall_s"),
)
#: Largest figure kept (the summary schema's bound).
_MAX = 1e12


def _num(x, top=_MAX):
    """A finite, non-negative number at most ``top``, or None (a record is someone else's
    file)."""
    try:
        if isinstance(x, bool) or not finite(x):
            return None
        x = float(x)
    except OverflowError:  # an integer too large for a float
        return None
    return x if 0 <= x <= top else None


def _ettr(metrics):
    return _num(metrics.get("soak_ettr"), 1.0)


def soak_figures(records):
    """``tests[g].soak`` of a group's successful records, or None when none is a soak record.

    Args:
        records: the group's successful records (dicts); the caller leaves the failed
            ones out (module docstring).

    Returns:
        ``{"n": soak records, "save_s", "load_s", "restart_s", "lost_s", "lost_steps",
        "ettr", "wall_s"}``: each the median over the soak records that hold a valid
        figure (None when none does); times in s, ``lost_steps`` in optimizer steps (a
        median of two counts may end in .5), ``ettr`` a fraction from 0 to 1.
    """
    soaked = []
    for rec in records:
        m = rec.get("metrics") if isinstance(rec, dict) else None
        if isinstance(m, dict) and _ettr(m) is not None:
            soaked.append(m)
    if not soaked:
        return None
    out: dict[str, Any] = {"n": len(soaked)}
    for key, metric in FIELDS:
        top = 1.0 if key == "ettr" else _MAX
        values = [v for v in (_num(m.get(metric), top) for m in soaked) if v is not None]
        out[key] = statistics.median(values) if values else None
    return out


__all__ = ["FIELDS", "soak_figures"]
