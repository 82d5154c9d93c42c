"""The outcome of ``milarun verify``: clauses, each passed or failed, grouped by section.

A :class:`Verdict` is what :func:`milarun.verify.check.verify_bundle` returns and
what the text and HTML renderers, ``milarun tender`` and the exit status read.
"""

from dataclasses import dataclass, field

#: The sections of a verdict, in the order they are shown.
SECTIONS = ("integrity", "completeness", "compliance", "consistency", "performance", "audit")

#: Exit status of ``milarun verify``: every clause held with the chain head pinned / a
#: clause failed / every clause held but no head was pinned (bad input is a
#: ``MilarunError``: 2). Only ``VERIFIED`` is 0, so that a script's ``verify && accept``
#: never accepts a bundle nothing tied to what ran.
VERIFIED, FAILED, NOT_PINNED = 0, 1, 3

#: The verdict's level (``Verdict.level``): what it proves (docs/tender.md, "What a
#: verdict proves").
LEVEL_VERIFIED = "VERIFIED"
LEVEL_NOT_PINNED = "CONSISTENT, NOT PINNED"
LEVEL_FAILED = "NOT VERIFIED"


@dataclass
class Clause:
    """One checked clause.

    Attributes:
        section: one of :data:`SECTIONS`.
        name: a stable id, ``"<section>.<what>"`` (e.g. ``"integrity.file-changed"``):
            what tests and tender rules refer to.
        ok: True when the clause holds.
        detail: one line: what was checked, or what is wrong and where.
        paths: files of the bundle it concerns (relative to the bundle), if any.
    """

    section: str
    name: str
    ok: bool
    detail: str
    paths: list = field(default_factory=list)

    def to_json(self):
        return {
            "section": self.section,
            "name": self.name,
            "ok": self.ok,
            "detail": self.detail,
            "paths": list(self.paths),
        }


@dataclass
class Verdict:
    """Every clause checked on one bundle, and what was found on the way.

    Attributes:
        bundle: the results folder (as given).
        clauses: list of :class:`Clause`, in check order.
        overrides: one line per override of the profile found (``--`` arguments,
            ``--timeout``, ``--no-cgexec``, ``--cpu-slots``, …), listed even
            when the rules allow them.
        sessions: how many sessions wrote the folder (a resumed run is several).
        head: the manifest's chain head (hex), or None without a manifest.
        pinned: True when the chain was checked against the head the buyer received
            (``--expect-head``), False when not, None where pinning does not apply (an
            audit's verdict).
        signed: True when ``bundle.json.sig`` was checked under the buyer's public key.
    """

    bundle: str
    clauses: list = field(default_factory=list)
    overrides: list = field(default_factory=list)
    sessions: int = 0
    head: str | None = None
    pinned: bool | None = None
    signed: bool = False

    def add(self, section, name, ok, detail, paths=()):
        """Append a clause; returns it."""
        if section not in SECTIONS:
            raise ValueError(f"unknown section {section!r}")
        clause = Clause(section, name, bool(ok), detail, list(paths))
        self.clauses.append(clause)
        return clause

    @property
    def failed(self):
        """The clauses that did not hold."""
        return [c for c in self.clauses if not c.ok]

    @property
    def ok(self):
        """True when every clause held (and at least one was checked)."""
        return bool(self.clauses) and not self.failed

    @property
    def level(self):
        """:data:`LEVEL_FAILED` when a clause failed; :data:`LEVEL_NOT_PINNED` when every
        clause held but the head was not pinned (a chain rewritten end to end and sealed
        again reads the same); else :data:`LEVEL_VERIFIED`."""
        if not self.ok:
            return LEVEL_FAILED
        return LEVEL_NOT_PINNED if self.pinned is False else LEVEL_VERIFIED

    @property
    def exit_code(self):
        """:data:`VERIFIED` (0), :data:`FAILED` (1) or :data:`NOT_PINNED` (3), by
        :attr:`level`."""
        return {LEVEL_VERIFIED: VERIFIED, LEVEL_NOT_PINNED: NOT_PINNED}.get(self.level, FAILED)

    def to_json(self):
        return {
            "bundle": self.bundle,
            "level": self.level,
            "ok": self.ok,
            "pinned": self.pinned,
            "signed": self.signed,
            "sessions": self.sessions,
            "head": self.head,
            "overrides": list(self.overrides),
            "clauses": [c.to_json() for c in self.clauses],
        }
