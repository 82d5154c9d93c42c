"""A test group's loss curves in the summary, and each seed's curve from them.

The summary keeps every successful record's ``timings.train.loss_curve`` (the mean loss
over the steps ``(2^(k-1), 2^k]`` at each step ``2^k``, :mod:`milarun.bench.rate`) with
its seed, run and device: a summary is then a convergence reference a buyer can keep
(``milarun verify --reference``), and the bundle's own summary is what is judged
against it (:mod:`milarun.verify.convergence`, statistics in
:mod:`milarun.measure.convergence`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .llm import precision_of

#: Records of a group whose curves the summary keeps (a summary stays small).
MAX_CURVES = 4096


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def loss_curves(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``convergence`` entry of a test group from its successful records.

    Returns:
        ``{"precision": the first record's --precision or None, "curves": [{"seed",
        "run", "device", "step": [...], "items": [...], "loss": [...]}]}`` (steps and
        items as counts, losses in the loss's unit; at most :data:`MAX_CURVES` records),
        or None when no record has a loss curve.
    """
    curves = []
    precision = None
    for rec in records:
        train = (rec.get("timings") or {}).get("train") or {}
        points = train.get("loss_curve") if isinstance(train, dict) else None
        if not isinstance(points, list) or not points:
            continue
        precision = precision or precision_of(rec)
        curves.append(
            {
                "seed": _int(rec.get("seed")),
                "run": _int(rec.get("run")),
                "device": str(rec.get("device", "")),
                "step": [p["step"] for p in points],
                "items": [p["items"] for p in points],
                "loss": [p["loss"] for p in points],
            }
        )
        if len(curves) >= MAX_CURVES:
            break
    if not curves:
        return None
    return {"precision": precision, "curves": curves}


def seed_curves(entry: dict[str, Any]) -> tuple[dict[Any, dict[int, float]], dict[int, int]]:
    """One curve per seed of a ``convergence`` entry: the mean over the seed's records
    (its devices; a record with no seed is a seed of its own, keyed by its run and
    device), and the items processed by each step.

    Returns:
        ``({seed: {step: loss}}, {step: items})``; a step whose records disagree on the
        items keeps the first (:func:`items_conflicts` finds them).

    Raises:
        KeyError, TypeError, ValueError: a malformed entry (checked by the summary's
            schema before; a caller that reads one from elsewhere catches them).
    """
    sums: dict[Any, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    items: dict[int, int] = {}
    for c in entry["curves"]:
        key = c["seed"] if c["seed"] is not None else ("run", c["run"], c["device"])
        if not len(c["step"]) == len(c["items"]) == len(c["loss"]):
            raise ValueError("step, items and loss differ in length")
        for step, n, loss in zip(c["step"], c["items"], c["loss"], strict=True):
            sums[key][step].append(float(loss))
            items.setdefault(step, n)
    curves = {k: {s: sum(v) / len(v) for s, v in steps.items()} for k, steps in sums.items()}
    return curves, items


def items_conflicts(a: dict[int, int], b: dict[int, int]) -> list[tuple[int, int, int]]:
    """``[(step, items in a, items in b)]`` for the steps both have where the items
    differ: another batch size (items per step), so the curves do not compare."""
    return [(s, a[s], b[s]) for s in sorted(set(a) & set(b)) if a[s] != b[s]]


__all__ = ["MAX_CURVES", "items_conflicts", "loss_curves", "seed_curves"]
