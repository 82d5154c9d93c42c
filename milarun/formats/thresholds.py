"""The acceptance thresholds file (``milarun report --thresholds FILE``): read strictly
(:func:`milarun.formats.jsonfile.read_json`) and checked against
``milarun/formats/schemas/thresholds.schema.json``. What the clauses mean and how the
report checks them: ``docs/acceptance.md`` and :mod:`milarun.report.acceptance`."""

from __future__ import annotations

from typing import Any

from ..errors import ResultFormatError
from .jsonfile import StrPath, check, read_json


def read_thresholds(path: StrPath) -> dict[str, Any]:
    """The thresholds of ``path`` (a dict, as in the file).

    Raises:
        ResultFormatError: unreadable, not UTF-8, not JSON, or a bad clause (one line
            naming the file and the key).
    """
    return check(
        read_json(path, error_cls=ResultFormatError, max_bytes=1 << 20), "thresholds", path=path
    )


__all__ = ["read_thresholds"]
