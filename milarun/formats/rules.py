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
#: Runs a trimmed mean needs: it drops the fastest and the slowest and averages the rest
#: (MLPerf Training rules, "Benchmark Results": drop the fastest and slowest runs).
TRIMMED_MEAN_MIN_RUNS = 3


class RulesError(ResultFormatError):
    """A rules file that cannot be used: one line naming the file and the key."""


def read_rules(path: StrPath) -> dict[str, Any]:
    """The tender rules of ``path`` (a dict, as in the file).

    Raises:
        RulesError: unreadable, not UTF-8, not JSON, larger than
            :data:`MAX_RULES_BYTES`, a bad or unknown key, or a run protocol that
            cannot be met (``repeat_score: trimmed-mean`` without ``min_repeats`` of
            :data:`TRIMMED_MEAN_MIN_RUNS` or more): one line naming the file and the key.
    """
    rules: dict[str, Any] = check(
        read_json(path, error_cls=RulesError, max_bytes=MAX_RULES_BYTES, what="rules file"),
        "rules",
        path=path,
        error_cls=RulesError,
    )
    check_protocol(rules, path)
    return rules


def check_protocol(rules: dict[str, Any], path: StrPath | None = None) -> None:
    """Refuse a run protocol no bundle can meet (what the schema cannot say: two keys
    together). A trimmed mean drops the fastest and the slowest run, so it needs at
    least :data:`TRIMMED_MEAN_MIN_RUNS` runs of every test, asked by ``min_repeats``.

    Raises:
        RulesError: ``repeat_score`` is ``trimmed-mean`` and ``min_repeats`` is absent
            or below :data:`TRIMMED_MEAN_MIN_RUNS` (one line naming the file and the key).
    """
    if rules.get("repeat_score") != "trimmed-mean":
        return
    repeats = rules.get("min_repeats")
    if repeats is None or repeats < TRIMMED_MEAN_MIN_RUNS:
        raise RulesError(
            f"trimmed-mean drops the fastest and the slowest run: it needs min_repeats of "
            f"{TRIMMED_MEAN_MIN_RUNS} or more, not {'none' if repeats is None else repeats}",
            path=path,
            key="repeat_score",
        )


__all__ = [
    "MAX_RULES_BYTES",
    "TRIMMED_MEAN_MIN_RUNS",
    "RulesError",
    "check_protocol",
    "read_rules",
]
