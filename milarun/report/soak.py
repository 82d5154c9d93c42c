"""The report's "Time lost to faults" section: what one fault cost a soak run, and the
effective training time ratio (ETTR) it projects at 512, 1,024 and 8,192 GPUs.

Read from the summary's ``tests[g].soak`` (:func:`milarun.analysis.soak.soak_figures`),
so a summary sent alone shows the same section; a report without soak runs has none.
Per soak test: the measured figures (medians over its records: the restart, one
checkpoint save, the checkpoint load, the work lost and redone, the run's ETTR), then
the projection (:func:`milarun.measure.soak.projection`): a job of N GPUs meets an
interruption every ``M_N = M_1024 × 1024 / N`` hours on average, checkpoints at Young's
interval ``T* = sqrt(2 C M_N)`` with the measured save time ``C`` and loses the measured
restart time ``R`` and half an interval per interruption. ``M_1024`` is ``milarun report
--fault-mtbf HOURS`` (default 7.9 h, Kokolis et al. 2024). The projection is computed
here, when the report is rendered, so the option is not part of the report's cache key
(:mod:`milarun.report.inputs`).
"""

import math

from ..errors import MilarunError
from ..measure.soak import MAX_MTBF_H, PUBLISHED_MTBF_1024_H, SCALES, projection
from .formatting import fmt_num


def check_fault_mtbf(value):
    """``--fault-mtbf`` (hours) as a float: finite, > 0, at most a century.

    Raises:
        MilarunError: anything else (one line).
    """
    try:
        hours = float(value)
    except (TypeError, ValueError, OverflowError):
        hours = math.nan
    if isinstance(value, bool) or not 0 < hours <= MAX_MTBF_H:  # NaN fails both
        raise MilarunError(
            f"--fault-mtbf must be a number of hours > 0 (at most {MAX_MTBF_H:,.0f}), "
            f"not {value!r}"[:160]
        )
    return hours


def soak_rows(tests, mtbf_1024_h=PUBLISHED_MTBF_1024_H):
    """One row per soak test group, in the summary's order.

    Args:
        tests: the summary's ``tests``.
        mtbf_1024_h: a 1,024-GPU job's mean time between interruptions (hours, > 0;
            :func:`check_fault_mtbf`).

    Returns:
        list of ``{"test", "n", "save_s", "load_s", "restart_s", "lost_s", "lost_steps",
        "ettr", "wall_s", "mtbf_1024_h", "projection"}``: the summary's figures, the
        ``M_1024`` used, and the rows of :func:`milarun.measure.soak.projection` at
        :data:`milarun.measure.soak.SCALES` (empty when the save or the restart time is
        unknown).
    """
    rows = []
    for name, test in tests.items():
        soak = test.get("soak") if isinstance(test, dict) else None
        if not isinstance(soak, dict):
            continue
        save, restart = soak.get("save_s"), soak.get("restart_s")
        rows.append(
            {
                "test": name,
                **{
                    k: soak.get(k)
                    for k in (
                        "n",
                        "save_s",
                        "load_s",
                        "restart_s",
                        "lost_s",
                        "lost_steps",
                        "ettr",
                        "wall_s",
                    )
                },
                "mtbf_1024_h": mtbf_1024_h,
                "projection": (
                    projection(save, restart, mtbf_1024_h, SCALES)
                    if save is not None and restart is not None
                    else []
                ),
            }
        )
    return rows


def measured_cells(row):
    """A soak test's measured figures as text cells (s, steps, ETTR)."""
    return {
        "test": row["test"],
        "records": str(row.get("n")),
        "restart s": fmt_num(row.get("restart_s"), ".1f"),
        "save s": fmt_num(row.get("save_s"), ".2f"),
        "load s": fmt_num(row.get("load_s"), ".2f"),
        "lost steps": fmt_num(row.get("lost_steps"), "g"),
        "lost s": fmt_num(row.get("lost_s"), ".1f"),
        "wall s": fmt_num(row.get("wall_s"), ".1f"),
        "ETTR": fmt_num(row.get("ettr"), ".3f"),
    }


def projection_cells(point):
    """A projection row as text cells: GPUs, ``M_N`` (h), ``T*`` (min), ETTR."""
    return {
        "GPUs": f"{point['gpus']:,}",
        "M_N (h)": fmt_num(point["mtbf_h"], ".3g"),
        "T* (min)": fmt_num(point["interval_s"] / 60.0, ".1f"),
        "ETTR": fmt_num(point["ettr"], ".3f"),
    }


def model_lines(mtbf_1024_h):
    """The projection's model, as a few lines (the HTML page joins them)."""
    m = fmt_num(mtbf_1024_h, "g")
    source = ", Kokolis et al. 2024" if mtbf_1024_h == PUBLISHED_MTBF_1024_H else ""
    return [
        f"projected ETTR at scale: a job of N GPUs is interrupted every M_N = {m} h × 1,024 / N",
        f"on average (--fault-mtbf {m}{source}; independent failures: pessimistic at",
        "large N), checkpoints every T* = sqrt(2·C·M_N) (Young 1974), C the measured save time,",
        "and loses the measured restart time R plus half an interval per interruption:",
        "ETTR = T*/(T*+C) × (1 − (R + (T*+C)/2) / M_N)",
    ]


def _aligned(cells, indent="  ", first_left=True):
    """Rows of text cells (dicts with the same keys, at least one) as lines: a header of
    the keys, the first column left-aligned (``first_left``), the others right-aligned to
    their widest cell."""
    keys = list(cells[0])
    widths = {k: max(len(k), *(len(c[k]) for c in cells)) for k in keys}
    return [
        indent
        + "  ".join(
            f"{c[k]:<{widths[k]}}" if i == 0 and first_left else f"{c[k]:>{widths[k]}}"
            for i, k in enumerate(keys)
        )
        for c in [dict(zip(keys, keys)), *cells]
    ]


def text_lines(rows):
    """The section as text lines (empty without soak tests)."""
    if not rows:
        return []
    lines = [
        "Time lost to faults (soak runs: one rank killed at a seeded step, the job restarted",
        "from its last checkpoint; medians over the records):",
        *_aligned([measured_cells(r) for r in rows]),
        "  restart: from the fault to the first step of the restarted job; lost: the steps done",
        "  after the last checkpoint, redone; ETTR: productive time / wall time",
        *("  " + line for line in model_lines(rows[0]["mtbf_1024_h"])),
    ]
    for r in rows:
        if r["projection"]:
            lines.append(f"  {r['test']}:")
            lines += _aligned(
                [projection_cells(p) for p in r["projection"]], indent="    ", first_left=False
            )
        else:
            lines.append(f"  {r['test']}: no projection (no save or restart time)")
    return lines


def html_view(rows):
    """The section's view for ``report.html.j2`` (None without soak tests): ``{"model",
    "measured": [cells], "tests": [{"test", "cells": [projection cells]}]}``."""
    if not rows:
        return None
    return {
        "model": " ".join(model_lines(rows[0]["mtbf_1024_h"])),
        "measured": [measured_cells(r) for r in rows],
        "tests": [
            {"test": r["test"], "cells": [projection_cells(p) for p in r["projection"]]}
            for r in rows
        ],
    }


__all__ = [
    "check_fault_mtbf",
    "soak_rows",
    "measured_cells",
    "projection_cells",
    "model_lines",
    "text_lines",
    "html_view",
]
