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


def seed_curves(
    entry: dict[str, Any],
) -> tuple[dict[Any, dict[int, float]], dict[Any, dict[int, int]]]:
    """One curve per seed of a ``convergence`` entry: the mean over the seed's records
    (its devices; a record with no seed is a seed of its own, keyed by its run and
    device), and the items each seed had processed by each step.

    Returns:
        ``({seed: {step: loss}}, {seed: {step: items}})``; the items of a seed's first
        record (its devices process the same items per step).

    Raises:
        KeyError, TypeError, ValueError: a malformed entry (checked by the summary's
            schema before; a caller that reads one from elsewhere catches them).
    """
    sums: dict[Any, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    items: dict[Any, dict[int, int]] = defaultdict(dict)
    for c in entry["curves"]:
        key = c["seed"] if c["seed"] is not None else ("run", c["run"], c["device"])
        if not len(c["step"]) == len(c["items"]) == len(c["loss"]):
            raise ValueError("step, items and loss differ in length")
        for step, n, loss in zip(c["step"], c["items"], c["loss"], strict=True):
            sums[key][step].append(float(loss))
            items[key].setdefault(step, n)
    curves = {k: {s: sum(v) / len(v) for s, v in steps.items()} for k, steps in sums.items()}
    return curves, dict(items)


#: How far the items processed by the judged step may lie from the reference's mean there
#: (a factor either way): the items of batches of sequences of several lengths vary with
#: the seed (the CPU profile's translator by step 4: 1711 to 4319 tokens over 3 seeds, the
#: fourth seed 1.41 times their mean); twice the batch is another test.
ITEMS_FACTOR = 1.75


def items_problem(
    reference: dict[Any, dict[int, int]], bidder: dict[Any, dict[int, int]], step: int
) -> str | None:
    """Why the bidder's runs do not process the reference's items, or None.

    At a seed both ran, the items by every common step must be equal (the same seed
    draws the same data: fewer items is a shortened sequence or a smaller batch); at the
    other seeds, the bidder's mean items by ``step`` must lie within
    :data:`ITEMS_FACTOR` of the reference's mean.
    """
    for seed in sorted(set(reference) & set(bidder), key=repr):
        for s in sorted(set(reference[seed]) & set(bidder[seed])):
            if reference[seed][s] != bidder[seed][s]:
                return (
                    f"{bidder[seed][s]} items by step {s} at seed {seed}, the reference's run "
                    f"at that seed {reference[seed][s]}: other data than the reference's"
                )
    ref = [v[step] for v in reference.values() if step in v]
    bid = [v[step] for v in bidder.values() if step in v]
    if ref and bid:
        ratio = (sum(bid) / len(bid)) / (sum(ref) / len(ref))
        if not 1 / ITEMS_FACTOR <= ratio <= ITEMS_FACTOR:
            return (
                f"{ratio:.3g} times the reference's items by step {step}: another batch size, "
                "the curves do not compare"
            )
    return None


__all__ = ["ITEMS_FACTOR", "MAX_CURVES", "items_problem", "loss_curves", "seed_curves"]
