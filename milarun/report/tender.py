"""Scoring a tender: every bidder's bundle verified and ranked in one table (``milarun
tender``; docs/tender.md, "Ranking the bidders (the buyer)").

For each bidder (a results bundle: its folder's name, or ``NAME=PATH``):

* **verification**: :func:`verify_one` (:func:`milarun.verify.check.verify_bundle` with
  the tender's rules): ``verified``, or ``N clause(s) failed``; a bundle whose files
  verify or the report refuse as bad input (an error naming a file inside the bundle)
  is ``unreadable`` with that error line, and has no score.
* **score, node score, their 95 % intervals, the score by family, the failure rate**:
  the report's own (:func:`milarun.report.table.build_report` on the bundle's summary,
  read by :func:`milarun.report.inputs.load_inputs`): the score formula lives there only. Every bidder
  is scored with the same weights (``--weights``, else the shipped weights of the one
  profile every bundle ran, else every test weighs 1: :func:`resolve_weights`).
* **price per score point** = ``price / score`` and **per node-score point** =
  ``price / node score``: the report's RPP and ``node_rpp``, computed by
  :func:`~milarun.report.table.build_report` from the bidder's price (prices file:
  :mod:`milarun.formats.prices`); ``-`` without a price.
* **pairwise significance** (:func:`pairwise`): for each pair of scored bidders A, B,
  A's report with B's summary as baseline (exactly ``milarun report A --compare B``):
  the score ratio over the tests both have and its interval
  (:func:`milarun.measure.confidence.geomean_interval` over each test's two samples,
  Welch-Satterthwaite degrees of freedom; each test's difference is Welch's t-test,
  :func:`milarun.measure.confidence.welch_test`, as ``--compare`` shows it). The
  difference is ``significant`` when the ratio's 95 % interval excludes 1
  (:func:`milarun.report.text.ratio_verdict`), ``within noise`` when it holds 1,
  ``noise unknown`` when no interval exists (fewer than 2 results in every test).

Ranking (:func:`rank`): verified bidders first, then by score (highest first; no score
last), then by name; a bidder that failed verification is never ranked above one that
passed, whatever its score: it is shown, without a rank.
"""

import math
import sys
from collections import namedtuple
from dataclasses import dataclass, field
from pathlib import Path

from .. import __version__
from ..errors import MilarunError, ResultFormatError
from ..formats.manifest import ManifestError, chained_records
from ..formats.prices import BIDDER_NAME, read_prices
from ..formats.terminal import one_line, terminal_safe
from . import shipped_weights, shown_path, summary_suites, write_text
from .inputs import load_inputs
from .family import FAMILIES, LABELS as FAMILY_LABELS, OTHER
from .formatting import fmt_num, fmt_pct
from .html import _env
from .table import build_report, load_weights
from .text import fmt_interval, ratio_verdict

#: What a pair's difference is called (``Pair.sig``).
SIGNIFICANT, WITHIN_NOISE, NOISE_UNKNOWN = "significant", "within noise", "noise unknown"

#: The mark of each in the text and HTML matrix.
MARKS = {SIGNIFICANT: "*", WITHIN_NOISE: "=", NOISE_UNKNOWN: "?"}

#: The line under the pairwise matrix.
PAIR_LEGEND = ("row / column: the row's score over the column's, over the tests both have "
               "(milarun report ROW --compare COLUMN); * significant: the ratio's 95% "
               "interval excludes 1; = within noise; ? noise unknown (fewer than 2 results "
               "per test); the interval combines each test's two samples as Welch's t-test "
               "does (measure/confidence.py: geomean_interval, welch_test)")

#: ``ratio`` (row score / column score, over the tests both have), ``ci``
#: (:data:`milarun.measure.confidence.Interval` or None), ``sig`` (:data:`SIGNIFICANT`,
#: :data:`WITHIN_NOISE`, :data:`NOISE_UNKNOWN`), ``partial`` (some scored test of the row
#: is not in the column), ``note`` (why there is no interval, or None).
Pair = namedtuple("Pair", "ratio ci sig partial note")


@dataclass
class Bidder:
    """One bidder of a tender.

    Attributes:
        name: its name (the bundle folder's name, or NAME of ``NAME=PATH``).
        path: the bundle folder, as given.
        verdict: :class:`milarun.verify.verdict.Verdict` of the bundle, or None
            (unreadable).
        error: the one-line error that made the bundle unreadable, or None.
        report: its :class:`milarun.report.table.Report`, or None (unreadable).
        price: its price (the prices file's currency), or None.
        rank: 1, 2, ... among the verified bidders; None for the others.
    """

    name: str
    path: str
    verdict: object = None
    error: str = None
    report: object = None
    price: object = None
    rank: object = None

    @property
    def verified(self):
        """True when every clause of the bundle's verdict held."""
        return self.error is None and self.verdict is not None and self.verdict.ok

    @property
    def status(self):
        """``verified``, ``N clause(s) failed`` or ``unreadable``."""
        if self.error is not None or self.verdict is None:
            return "unreadable"
        if self.verdict.ok:
            return "verified"
        failed = len(self.verdict.failed)
        return f"{failed} clause(s) failed" if failed else "no clause checked"

    @property
    def score(self):
        """The report's score (None: unreadable, or no scored test)."""
        return None if self.report is None else self.report.score


@dataclass
class Tender:
    """The ranked bidders, the pairwise comparisons, and what they were made from."""

    bidders: list
    rules: str
    currency: object = None
    prices: object = None
    weights: object = None
    weights_note: str = ""
    #: ``{(row name, column name): Pair}`` for every ordered pair of scored bidders.
    pairs: dict = field(default_factory=dict)
    #: The family labels some bidder has a score for, in :data:`FAMILIES` order.
    families: list = field(default_factory=list)
    warnings: list = field(default_factory=list)

    @property
    def exit_code(self):
        """0 when at least one bidder verified, else 1."""
        return 0 if any(b.verified for b in self.bidders) else 1


# --- pure functions (no files) ----------------------------------------------------------

def sort_key(bidder):
    """The ranking order: verified first, then the highest score (no score last), then
    the name. A bidder that failed verification sorts after every verified one, whatever
    its score."""
    score = bidder.score
    return (not bidder.verified, score is None, -(score or 0.0), bidder.name)


def rank(bidders):
    """``bidders`` (objects with ``verified``, ``score``, ``name`` and a settable ``rank``)
    sorted by :func:`sort_key`, each verified one given its rank 1, 2, ... and the
    others ``rank`` None. Returns the sorted list."""
    ordered = sorted(bidders, key=sort_key)
    position = 0
    for b in ordered:
        if b.verified:
            position += 1
            b.rank = position
        else:
            b.rank = None
    return ordered


def parse_bidders(args):
    """``[(name, path)]`` of the command line's ``BUNDLE`` arguments.

    An argument that is an existing folder is a bundle named after the folder; else
    ``NAME=PATH`` names it (the first ``=`` splits). A name must match
    :data:`milarun.formats.prices.BIDDER_NAME` (the prices file's rule).

    Raises:
        MilarunError: no such folder, a name that is not a bidder name (give NAME=PATH),
            or two bidders with one name (one line naming the argument).
    """
    out, seen = [], {}
    for arg in args:
        name, path = None, arg
        if not Path(arg).is_dir() and "=" in arg:
            name, path = arg.split("=", 1)
        if not Path(path).is_dir():
            raise MilarunError("no such bundle folder", path=path)
        if name is None:
            name = Path(path).resolve().name
        if not BIDDER_NAME.fullmatch(name):
            raise MilarunError(f"{name!r} is not a bidder name (1 to 64 letters, digits, '.', "
                               "'_', '+', '-'): give one as NAME=PATH"[:200], path=arg)
        if name in seen:
            raise MilarunError(f"two bidders named {name!r} ({seen[name]} and {path}): "
                               "name them as NAME=PATH"[:300], path=arg)
        seen[name] = path
        out.append((name, path))
    if not out:
        raise MilarunError("no bundle given: milarun tender BUNDLE... --rules RULES")
    return out


def check_prices(prices, names, path):
    """Raise when ``prices`` (``{bidder: price}``) names a bidder not in ``names``.

    Raises:
        ResultFormatError: ``PATH: bidders.NAME: no such bidder (the bidders: ...)``.
    """
    for name in prices:
        if name not in names:
            raise ResultFormatError(f"no such bidder (the bidders: {', '.join(names)})"[:300],
                                    path=path, key=f"bidders.{name}")


def pair(row_summary, column_summary, weights):
    """:data:`Pair` of two normalized summaries: the report of ``row_summary`` with
    ``column_summary`` as its baseline (:func:`milarun.report.table.build_report`, the
    ``--compare`` path), so the ratio, its interval and the verdict are the report's."""
    report = build_report(row_summary, weights=weights, baseline=column_summary)
    ci = report.score_ratio_ci
    if report.score_ratio is None:
        sig = None
    elif ci is None:
        sig = NOISE_UNKNOWN
    else:
        sig = SIGNIFICANT if ratio_verdict(ci) == "significant" else WITHIN_NOISE
    return Pair(report.score_ratio, ci, sig, report.ratio_partial, report.score_ratio_ci_note)


def pairwise(summaries, weights):
    """``{(a, b): Pair}`` for every ordered pair of distinct names of ``summaries``
    (``{name: normalized summary}``; ``weights`` ``{test: w}`` or None), each from
    :func:`pair`."""
    names = list(summaries)
    return {(a, b): pair(summaries[a], summaries[b], weights)
            for a in names for b in names if a != b}


def family_labels(bidders):
    """The family labels of the bidders' reports (``Report.families``), in
    :data:`milarun.report.family.FAMILIES` order."""
    present = {f["family"] for b in bidders if b.report is not None
               for f in b.report.families}
    return [FAMILY_LABELS[f] for f in FAMILIES + (OTHER,) if f in present]


def family_score(bidder, label):
    """The bidder's score of the family ``label``, or None."""
    for f in (bidder.report.families if bidder.report is not None else []):
        if f["label"] == label:
            return f["score"]
    return None


# --- building a tender (reads files) ----------------------------------------------------

def verify_one(path, rules):
    """The :class:`milarun.verify.verdict.Verdict` of bundle ``path`` against ``rules``
    (a rules file path): :func:`milarun.verify.check.verify_bundle`.

    Raises:
        MilarunError: what ``verify_bundle`` raises on bad input.
    """
    # why: one seam, so tests can replace the verification with a fake; the import stays
    # inside because verify/check.py is built beside this module
    from ..verify.check import verify_bundle

    return verify_bundle(path, rules=rules)


def _inside(error_path, folder):
    """True when ``error_path`` (a MilarunError's ``path``) lies in ``folder``."""
    if error_path is None:
        return False
    try:
        Path(error_path).resolve().relative_to(Path(folder).resolve())
    except (ValueError, OSError, RuntimeError):
        return False
    return True


def resolve_weights(weights, summaries):
    """``(weights map or None, shown path or None, note)`` for every bidder: the file
    ``weights`` when given (:func:`milarun.report.table.load_weights`); else the shipped
    weights of the one profile every summary ran (:func:`milarun.report.shipped_weights`);
    else None (every test weighs 1).

    Raises:
        ResultFormatError: an unreadable or bad weights file (naming the file and key).
    """
    if weights is not None:
        return load_weights(weights), shown_path(weights), "--weights"
    suites = {s for summary in summaries for s in summary_suites(summary)}
    default = shipped_weights(next(iter(suites))) if len(suites) == 1 else None
    if default is not None:
        return (load_weights(default), shown_path(default),
                f"the shipped weights of profile {next(iter(suites))} (no --weights)")
    return None, None, "unweighted: every test weight 1 (no --weights)"


def _chained(path):
    """The records a bidder's score counts: those its manifest chains (verify names any
    other as a failure); every record when the manifest cannot be read (the bundle then
    fails verification and is not ranked)."""
    try:
        return chained_records(path)
    except ManifestError:
        return None


def build_tender(bundles, rules, prices=None, weights=None, warn=None):
    """Verify, score and rank the bidders of ``bundles`` (command-line arguments:
    :func:`parse_bidders`) against the rules file ``rules``; ``prices`` a prices file
    (:func:`milarun.formats.prices.read_prices`), ``weights`` a weights file, or None.
    Returns a :class:`Tender`.

    Raises:
        MilarunError: a missing bundle folder, a bad prices or weights file, a price for
            an unknown bidder, a bad rules file (verify's error): one line naming the
            file and the key.
    """
    warn = warn or sys.stderr
    named = parse_bidders(bundles)
    currency, price_map = (None, {})
    if prices is not None:
        currency, price_map = read_prices(prices)
        check_prices(price_map, [n for n, _ in named], prices)
    if weights is not None:
        load_weights(weights)   # a bad weights file is refused before any bundle is read
    bidders, summaries = [], {}
    for name, path in named:
        bidder = Bidder(name=name, path=path, price=price_map.get(name))
        try:
            bidder.verdict = verify_one(path, rules)
            summaries[name] = load_inputs(path, warn, only=_chained(path)).summary
        except MilarunError as exc:
            if not _inside(exc.path, path):
                raise
            bidder.error = one_line(str(exc))
        bidders.append(bidder)
    weights_map, weights_shown, note = resolve_weights(weights, summaries.values())
    for bidder in bidders:
        if bidder.name in summaries:
            bidder.report = build_report(summaries[bidder.name], weights=weights_map,
                                         price=bidder.price, title=bidder.name)
    ordered = rank(bidders)
    scored = {b.name: summaries[b.name] for b in ordered if b.score is not None}
    tender = Tender(bidders=ordered, rules=shown_path(rules), currency=currency,
                    prices=shown_path(prices) if prices else None,
                    weights=weights_shown, weights_note=note,
                    pairs=pairwise(scored, weights_map), families=family_labels(ordered))
    tender.warnings = [f"{b.name}: {w}" for b in ordered if b.report for w in b.report.warnings]
    return tender


# --- output -----------------------------------------------------------------------------

def columns(tender):
    """The columns of the ranking table."""
    cols = ["rank", "verification", "score", "score 95% CI", "node score",
            "node score 95% CI"]
    cols += [f"{label} score" for label in tender.families]
    cols += ["failure rate"]
    if tender.currency is not None:
        cols += [f"price ({tender.currency})", "price / score", "price / node score"]
    return cols


def _ci(report, which):
    if report is None or getattr(report, which) is None:
        return "-"
    return fmt_interval(getattr(report, f"{which}_ci"))


def cells(tender, bidder):
    """``{column: text}`` of one bidder's row (text, HTML and JSON read the same)."""
    r = bidder.report
    row = {"rank": "-" if bidder.rank is None else str(bidder.rank),
           "verification": bidder.status,
           "score": fmt_num(bidder.score),
           "score 95% CI": _ci(r, "score"),
           "node score": fmt_num(r.node_score if r else None),
           "node score 95% CI": _ci(r, "node_score"),
           "failure rate": "-" if r is None else fmt_pct(r.failure_rate)}
    for label in tender.families:
        row[f"{label} score"] = fmt_num(family_score(bidder, label))
    if tender.currency is not None:
        row[f"price ({tender.currency})"] = fmt_num(bidder.price, ",.2f")
        row["price / score"] = fmt_money(r.rpp if r and bidder.price else None)
        row["price / node score"] = fmt_money(r.node_rpp if r and bidder.price else None)
    return row


def fmt_money(value):
    """An amount per point: two decimals from 1 up (``4,250.98``), else 3 significant
    digits (``0.0123``); ``-`` for None."""
    if value is None:
        return "-"
    return f"{value:,.2f}" if abs(value) >= 1 else f"{value:.3g}"


def pair_cell(p):
    """The matrix cell of a :data:`Pair` (``1.234 *``), ``-`` without a ratio."""
    if p is None or p.ratio is None:
        return "-"
    return f"{p.ratio:.3f} {MARKS[p.sig]}" + (" (partial)" if p.partial else "")


def pair_line(a, b, p):
    """One line: ``A / B: 1.234, 95% CI 1.1 to 1.3: significant``."""
    if p.ratio is None:
        return f"{a} / {b}: no common scored test"
    ci = (f"95% CI {fmt_interval(p.ci, '.3f')}" if p.ci is not None
          else f"no interval ({p.note})")
    part = " (partial: over the tests both have)" if p.partial else ""
    return f"{a} / {b}: {p.ratio:.3f}{part}, {ci}: {p.sig}"


def header_items(tender):
    """``[(label, text)]``: what the tender table was made from."""
    return [("rules", tender.rules),
            ("weights", tender.weights_note if tender.weights is None
             else f"{tender.weights} ({tender.weights_note})"),
            ("prices", f"{tender.prices} ({tender.currency})" if tender.prices
             else "none (no --prices)"),
            ("milarun", __version__)]


def _one_run(tender):
    names = [b.name for b in tender.bidders if b.report is not None and b.report.one_run]
    if not names:
        return None
    return (f"one run per test in {', '.join(names)}: the intervals hold the spread between "
            "that run's results, not the drift between runs; ask for --repeat 3 or more "
            "before calling a difference of a few percent real (docs/report.md)")


def text_lines(tender):
    """The tender as lines of text: inputs, the ranking table, each failed or unreadable
    bidder's clauses, the pairwise matrix and lines."""
    import pandas as pd

    lines = ["milarun tender"]
    items = header_items(tender)
    width = max(len(label) for label, _ in items) + 1
    lines += [f"{label + ':':{width}} {one_line(text)}" for label, text in items]
    lines.append("")
    cols = columns(tender)
    rows = [cells(tender, b) for b in tender.bidders]
    frame = pd.DataFrame({c: [row[c] for row in rows] for c in cols},
                         index=pd.Index([b.name for b in tender.bidders], name="bidder"),
                         columns=cols)
    lines.append(frame.to_string())
    lines.append("ranked: verified bidders by score; a bidder that failed verification is "
                 "shown without a rank, below every verified one")
    for b in tender.bidders:
        if b.error is not None:
            lines.append(f"{b.name}: unreadable: {b.error}")
        elif b.verdict is not None and not b.verdict.ok:
            lines.append(f"{b.name}: not verified:")
            lines += [f"  {c.name}: {one_line(c.detail)}" for c in b.verdict.failed]
    names = [b.name for b in tender.bidders if b.score is not None]
    if len(names) >= 2:
        lines.append("")
        lines.append("score differences between bidders (row / column):")
        matrix = pd.DataFrame({c: [pair_cell(tender.pairs.get((r, c))) if r != c else "-"
                                   for r in names] for c in names},
                              index=pd.Index(names, name="row / column"), columns=names)
        lines.append(matrix.to_string())
        lines.append(PAIR_LEGEND)
        lines += [pair_line(a, b, tender.pairs[(a, b)])
                  for i, a in enumerate(names) for b in names[i + 1:]]
    note = _one_run(tender)
    if note:
        lines.append(note)
    return lines


def render_text(tender):
    """The tender as terminal-safe text (ends with a newline)."""
    return terminal_safe("\n".join(text_lines(tender)) + "\n")


def _interval_json(ci):
    return None if ci is None else {"lo": ci.lo, "hi": ci.hi, "df": ci.df
                                    if math.isfinite(ci.df) else None}


def to_json(tender):
    """The tender as a JSON-ready dict: inputs, ``bidders`` in ranking order (rank,
    status, failed clauses, score, node score and intervals, families, failure rate,
    price and prices per point), ``pairs`` (each ordered pair: ratio, interval, verdict)."""
    bidders = []
    for b in tender.bidders:
        r = b.report
        bidders.append({
            "name": b.name, "bundle": b.path, "rank": b.rank, "verified": b.verified,
            "status": b.status, "error": b.error,
            "failed": [c.to_json() for c in b.verdict.failed] if b.verdict else [],
            "score": b.score, "score_ci": _interval_json(r.score_ci if r else None),
            "node_score": r.node_score if r else None,
            "node_score_ci": _interval_json(r.node_score_ci if r else None),
            "families": {f["label"]: f["score"] for f in (r.families if r else [])},
            "failure_rate": r.failure_rate if r else None,
            "price": b.price,
            "price_per_score": r.rpp if r and b.price else None,
            "price_per_node_score": r.node_rpp if r and b.price else None})
    return {"format": "milarun-tender", "milarun": __version__, "rules": tender.rules,
            "weights": tender.weights, "prices": tender.prices, "currency": tender.currency,
            "bidders": bidders,
            "pairs": [{"row": a, "column": b, "ratio": p.ratio, "ci": _interval_json(p.ci),
                       "significance": p.sig, "partial": p.partial}
                      for (a, b), p in tender.pairs.items()]}


def render_html(tender, generated=None):
    """The tender as one self-contained HTML page (``templates/tender.html.j2``, jinja2
    with autoescaping: every bidder name and clause detail is escaped)."""
    cols = columns(tender)
    names = [b.name for b in tender.bidders if b.score is not None]
    return _env().get_template("tender.html.j2").render(
        inputs=header_items(tender), columns=cols, generated=generated,
        rows=[{"name": b.name, "verified": b.verified, "cells": cells(tender, b),
               "failed": ([f"{c.name}: {c.detail}" for c in b.verdict.failed]
                          if b.verdict is not None and b.error is None else [])
               + ([f"unreadable: {b.error}"] if b.error else [])}
              for b in tender.bidders],
        names=names,
        matrix=[{"row": r, "cells": [("-", "") if r == c else
                                     (pair_cell(tender.pairs.get((r, c))),
                                      _band(tender.pairs.get((r, c))))
                                     for c in names]} for r in names],
        legend=PAIR_LEGEND, one_run=_one_run(tender),
        pairs=[pair_line(a, b, tender.pairs[(a, b)])
               for i, a in enumerate(names) for b in names[i + 1:]])


def _band(p):
    """CSS class of a matrix cell: ``good`` significantly higher, ``bad`` lower."""
    if p is None or p.sig != SIGNIFICANT or p.ratio is None:
        return ""
    return "good" if p.ratio > 1 else "bad"


def make_tender(bundles, rules, prices=None, weights=None, html=None, json_out=None,
                warn=None, generated=None):
    """Build the tender (:func:`build_tender`), write its HTML page and JSON file when
    asked; returns ``(tender, text)``.

    Raises:
        MilarunError: bad input (see :func:`build_tender`), or an output that cannot be
            written.
    """
    import datetime
    import json

    tender = build_tender(bundles, rules, prices=prices, weights=weights, warn=warn)
    text = render_text(tender)
    if html:
        generated = generated or datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds")
        write_text(html, render_html(tender, generated=generated))
    if json_out:
        write_text(json_out, json.dumps(to_json(tender), indent=1, allow_nan=False) + "\n")
    return tender, text


__all__ = ["Bidder", "Pair", "Tender", "build_tender", "make_tender", "pair", "pairwise",
           "parse_bidders", "rank", "render_html", "render_text", "sort_key", "to_json",
           "verify_one"]
