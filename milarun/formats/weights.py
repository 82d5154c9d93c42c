"""The weights file of a report (``milarun report --weights FILE``): each test's weight in
the score, read strictly (:func:`milarun.formats.jsonfile.read_json`) and checked against
``milarun/formats/schemas/weights.schema.json``::

    {"standard.convnet": {"weight": 1}, "standard.llm-pretrain": {"weight": 2}}

Names are summary groups (``suite.test``), weights finite numbers >= 0. How a weight
applies to a group (a progression's ``suite.job`` entry covers each of its groups) is
the plan type's rule (:func:`milarun.plan.types.weight_for`); how the score uses them:
:mod:`milarun.report.table`.
"""

from __future__ import annotations

from typing import Any

from .jsonfile import StrPath, check, read_json


def load_weights(path: StrPath) -> dict[str, float]:
    """Read a weights file (strictly): ``{"suite.test": {"weight": w}}`` with ``w >= 0``.

    Returns ``{name: float}``.

    Raises:
        ResultFormatError: unreadable, not UTF-8, not JSON, or a bad entry
            (naming the key).
    """
    return check_weights(read_json(path), path)


def check_weights(data: Any, path: StrPath | None = None) -> dict[str, float]:
    """Check a weights mapping against ``milarun/formats/schemas/weights.schema.json``
    (names like ``suite.test``, finite weights >= 0) and return ``{name: float}``.

    Raises:
        ResultFormatError: one line naming the key.
    """
    check(data, "weights", path=path)
    return {name: float(entry["weight"]) for name, entry in data.items()}


__all__ = ["check_weights", "load_weights"]
