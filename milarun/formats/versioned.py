"""Versioned files: one ``version`` field and one chain of migrations per format.

Each format that carries a ``version`` (the result record, :mod:`.record`; the
summary, :mod:`.summary`; the session file, :mod:`milarun.launcher.session`) is
a :class:`VersionedFormat`: its current version, its :class:`Migration` steps
(a step takes data of version v and returns data of version v + 1), and the
words its errors use. :meth:`VersionedFormat.upgrade` is the one migration
mechanism: it refuses a version newer than ours or one without a step, checks
each old version against its schema when it has one, runs the steps on a copy
(the input is never modified), and says in one line why a step could not run.
What is checked after the last step (the current schema) is the format's own.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import MilarunError, ResultFormatError
from .jsonfile import StrPath, check


@dataclass(frozen=True)
class Migration:
    """One step: ``step(data of version v)`` returns the data of version v + 1.

    ``schema``: the ``ref`` (:func:`milarun.formats.jsonfile.check`) that data of
    version v is checked against before the step runs; None: not checked (then an
    exception of the step becomes a "cannot migrate" error)."""

    step: Callable[[dict[str, Any]], dict[str, Any]]
    schema: str | None = None


class VersionedFormat:
    """A file format with a ``version`` field and its migrations.

    Args:
        version: the current version.
        migrations: ``{version: Migration}``, from that version to the next.
        error_cls: what its errors raise (``ResultFormatError``, ``SetupError`` ...).
        what: the words before "format version" in its errors (``"summary "``).
        bad, too_new, unknown: the messages of a version that is not an integer, newer
            than ours, older without a step (``{version}``, ``{current}``, ``{what}``
            are filled).
    """

    def __init__(
        self,
        version: int,
        migrations: Mapping[int, Migration] | None = None,
        *,
        error_cls: type[MilarunError] = ResultFormatError,
        what: str = "",
        bad: str = "bad {what}format version {version!r}",
        too_new: str = "{what}format version {version} is newer than this milarun ({current})",
        unknown: str = "unknown {what}format version {version}",
    ) -> None:
        self.version = version
        self.migrations = dict(migrations or {})
        self.error_cls, self.what = error_cls, what
        self.bad, self.too_new, self.unknown = bad, too_new, unknown

    def _error(
        self, template: str, version: Any, path: StrPath | None, limit: int | None = None
    ) -> MilarunError:
        text = template.format(what=self.what, version=version, current=self.version)
        return self.error_cls(text[:limit], path=path, key="version")

    def version_of(
        self, data: Mapping[str, Any], path: StrPath | None = None, default: int | None = None
    ) -> int:
        """``data``'s ``version`` (``default`` when it has none), an integer.

        Raises:
            error_cls: not an integer (``bad``).
        """
        version = data.get("version", default)
        if isinstance(version, bool) or not isinstance(version, int):
            raise self._error(self.bad, version, path, limit=80)  # any JSON value: bounded
        return version

    def upgrade(
        self, data: dict[str, Any], version: int, path: StrPath | None = None
    ) -> dict[str, Any]:
        """``data`` (of ``version``) brought to the current version: itself when current,
        else a migrated copy.

        Raises:
            error_cls: a version newer than ours (``too_new``) or without a step
                (``unknown``); an old version that breaks its schema; a step that fails.
        """
        if version > self.version:
            raise self._error(self.too_new, version, path)
        if version == self.version:
            return data
        data = copy.deepcopy(data)
        while version < self.version:
            migration = self.migrations.get(version)
            if migration is None:
                raise self._error(self.unknown, version, path)
            if migration.schema is not None:
                check(data, migration.schema, path=path, error_cls=self.error_cls)
            try:
                data = migration.step(data)
            except (TypeError, AttributeError, KeyError, ValueError) as exc:
                raise self.error_cls(
                    f"cannot migrate from {self.what}format version {version} "
                    f"({exc.__class__.__name__}: {exc})"[:200],
                    path=path,
                )
            version = data["version"]
        return data
