"""The verdict of ``milarun verify`` as text and as an HTML section
(:class:`milarun.verify.verdict.Verdict`, built by :func:`milarun.verify.check.verify_bundle`).

Text: a header (the bundle, its chain head, the sessions), the overrides found, then each
section of :data:`milarun.verify.verdict.SECTIONS` with its clauses, the failed ones first,
one line each (``FAIL  name: detail``), and a one-line verdict. HTML: the same, from the
jinja2 template ``templates/verify.html.j2`` (autoescaped: every detail comes from the
vendor's files).
"""

from ..formats.terminal import one_line
from ..verify.verdict import LEVEL_FAILED, LEVEL_NOT_PINNED, LEVEL_VERIFIED, SECTIONS


def grouped(verdict):
    """``[(section, [clauses, failed first])]`` in :data:`SECTIONS` order, sections with
    clauses only (the order of the checks is kept within passed and within failed)."""
    out = []
    for section in SECTIONS:
        clauses = [c for c in verdict.clauses if c.section == section]
        if clauses:
            out.append((section, [c for c in clauses if not c.ok] + [c for c in clauses if c.ok]))
    return out


def summary_line(verdict):
    """The verdict's level (:attr:`milarun.verify.verdict.Verdict.level`) in one line:
    ``VERIFIED: all n clauses held (…)``, ``CONSISTENT, NOT PINNED: all n clauses held,
    but …`` or ``NOT VERIFIED: k of n clauses failed (names)``."""
    failed = verdict.failed
    n = len(verdict.clauses)
    if verdict.level == LEVEL_NOT_PINNED:
        return (
            f"{LEVEL_NOT_PINNED}: all {n} clauses held, but no --expect-head: nothing "
            "ties this chain to what ran (a chain rewritten end to end and sealed again "
            "reads the same)"
        )
    if verdict.ok:
        if verdict.pinned is None:
            return f"{LEVEL_VERIFIED}: all {n} clauses held"
        return f"{LEVEL_VERIFIED}: all {n} clauses held (chain head pinned; " + (
            "signature checked under --public-key)"
            if verdict.signed
            else "signature not checked: no --public-key)"
        )
    names = sorted({c.name for c in failed})
    return (
        f"{LEVEL_FAILED}: {len(failed)} of {n} clauses failed ("
        + ", ".join(names[:12])
        + (" ..." if len(names) > 12 else "")
        + ")"
    )


def text_lines(verdict):
    """The verdict as lines of text, each passed through
    :func:`milarun.formats.terminal.one_line`: a vendor's strings (a file name, a detail)
    can neither move the cursor, colour the terminal nor start a line of their own."""
    lines = [
        f"bundle: {verdict.bundle}",
        f"chain head: {verdict.head or '-'}"
        + (
            ""
            if verdict.pinned is None
            else " (pinned: --expect-head)"
            if verdict.pinned
            else " (not pinned)"
        ),
        f"sessions: {verdict.sessions}",
    ]
    if verdict.overrides:
        lines.append(f"overrides ({len(verdict.overrides)}):")
        lines += [f"  {o}" for o in verdict.overrides]
    else:
        lines.append("overrides: none")
    for section, clauses in grouped(verdict):
        failed = sum(not c.ok for c in clauses)
        lines.append("")
        lines.append(
            f"{section}: {'FAIL' if failed else 'PASS'} "
            f"({len(clauses) - failed} of {len(clauses)} clauses held)"
        )
        lines += [f"  {'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}" for c in clauses]
    lines.append("")
    lines.append(summary_line(verdict))
    return [one_line(line) for line in lines]


def render_text(verdict):
    """:func:`text_lines` joined, with a final newline."""
    return "\n".join(text_lines(verdict)) + "\n"


def render_html(verdict, standalone=True):
    """The verdict as an HTML section (``standalone``: a whole page around it)."""
    # lazy, for start-up: jinja2 loads only when HTML is asked for
    from .html import _env

    return (
        _env()
        .get_template("verify.html.j2")
        .render(
            verdict=verdict,
            sections=grouped(verdict),
            summary=summary_line(verdict),
            standalone=standalone,
        )
    )


__all__ = ["grouped", "render_html", "render_text", "summary_line", "text_lines"]
