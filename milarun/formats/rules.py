"""The tender rules file (``milarun verify OUTDIR --rules FILE``): read strictly
(:func:`milarun.formats.jsonfile.read_json`) and checked against
``milarun/formats/schemas/rules.schema.json``. What each key means: ``docs/tender.md``,
"The rules file"; how each is judged: :mod:`milarun.verify.check`."""

from __future__ import annotations

from typing import Any

from ..errors import ResultFormatError
from .jsonfile import StrPath, check, read_json

#: Largest rules file read (bytes).
MAX_RULES_BYTES = 1 << 20


class RulesError(ResultFormatError):
    """A rules file that cannot be used: one line naming the file and the key."""


def read_rules(path: StrPath) -> dict[str, Any]:
    """The tender rules of ``path`` (a dict, as in the file).

    Raises:
        RulesError: unreadable, not UTF-8, not JSON, larger than
            :data:`MAX_RULES_BYTES`, or a bad or unknown key (one line naming the
            file and the key).
    """
    return check(
        read_json(path, error_cls=RulesError, max_bytes=MAX_RULES_BYTES, what="rules file"),
        "rules",
        path=path,
        error_cls=RulesError,
    )


__all__ = ["MAX_RULES_BYTES", "RulesError", "read_rules"]
