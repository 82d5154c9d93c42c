"""Scoring a tender: every bidder's bundle verified and ranked in one table (``milarun
tender``; docs/tender.md, "Ranking the bidders (the buyer)").

The bidders come from a bidders file (``--bidders``, :mod:`milarun.formats.bidders`:
each bidder's bundle, public key, the head received and when, its price), or from the
command line (``BUNDLE...``: a folder's name or ``NAME=PATH``; no head, no key: every such
bidder is unpinned, at best ``CONSISTENT, NOT PINNED``).

* **verification**: :func:`verify_one` (:func:`milarun.verify.check.verify_bundle` with
  the tender's rules, the bidder's head and public key: the call ``milarun verify
  --expect-head HEAD --public-key KEY`` makes): the verdict's level, ``VERIFIED``,
  ``CONSISTENT, NOT PINNED`` or ``NOT VERIFIED`` (N clauses failed), and whether the
  signature was checked; a bundle whose manifest cannot be read (missing, torn), or whose
  files verify or the report refuse as bad input (an error naming a file inside the
  bundle) is ``unreadable`` with that error line, and has no score, no clause count and
  no failure rate.
* **score, node score, their 95 % intervals, the score by family, the failure rate**:
  the report's own (:func:`milarun.report.table.build_report` on the bundle's summary,
  read by :func:`milarun.report.inputs.load_inputs`): the score formula lives there only.
  Every bidder is scored with the same weights (``--weights``, else the shipped weights of the one
  profile every bundle ran, else every test weighs 1: :func:`resolve_weights`).
* **price per score point** = ``price / score`` and **per node-score point** =
  ``price / node score``: the report's RPP and ``node_rpp``, computed by
  :func:`~milarun.report.table.build_report` from the bidder's price (prices file:
  :mod:`milarun.formats.prices`); ``-`` without a price.
* **perf/W** (items/J): the report's ``perf_per_watt``, the weighted geometric mean of
  items/J over the scored tests with GPU energy readings; a column only when some
  bidder's records hold GPU energy.
* **energy per score point** (J, :func:`energy_per_point`) = ``1 / perf/W``: the weighted
  geometric mean of J/item over the same tests. The score is a weighted geometric mean of
  items/s, and J/item = W / (items/s), so over those tests this is the mean power per
  score point: what one point of throughput costs in energy, read beside the price per
  point (lower is better for both).
* **pairwise significance** (:func:`pairwise`): for each pair of scored bidders A, B,
  A's report with B's summary as baseline (exactly ``milarun report A --compare B``):
  the score ratio over the tests both have and its interval
  (:func:`milarun.measure.confidence.geomean_interval` over each test's two samples,
  Welch-Satterthwaite degrees of freedom; each test's difference is Welch's t-test,
  :func:`milarun.measure.confidence.welch_test`, as ``--compare`` shows it). The
  difference is ``significant`` when the ratio's 95 % interval excludes 1
  (:func:`milarun.report.text.ratio_verdict`), ``within noise`` when it holds 1,
  ``noise unknown`` when no interval exists (fewer than 2 results in every test).

Ranking (:func:`rank`): ``VERIFIED`` bidders first (the head pinned), then the
``CONSISTENT, NOT PINNED`` ones (ranked after them, marked ``unpinned``), each tier by
score (highest first; no score last), then by name; a bidder that failed verification or
is unreadable is never ranked: it is shown below, without a rank, whatever its score.
"""

import math
import sys
from collections import namedtuple
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import MilarunError, ResultFormatError
from ..formats.bidders import read_bidders
from ..formats.manifest import manifest_path, read_manifest
from ..formats.prices import BIDDER_NAME, read_prices
from ..formats.rules import read_rules
from ..formats.terminal import one_line, terminal_safe
from ..formats.weights import load_weights
from . import shipped_weights, shown_path, summary_suites, write_text
from .family import FAMILIES, OTHER
from .family import LABELS as FAMILY_LABELS
from .formatting import fmt_num, fmt_pct
from .html import _env
from .inputs import load_inputs
from .table import build_report
from .text import REPEAT_WORDS, fmt_interval, ratio_verdict

#: A verdict's levels (:attr:`milarun.verify.verdict.Verdict.level`), and the tender's
#: own for a bundle that could not be read.
VERIFIED, NOT_PINNED, NOT_VERIFIED, UNREADABLE = (
    "VERIFIED",
    "CONSISTENT, NOT PINNED",
    "NOT VERIFIED",
    "unreadable",
)

#: What a pair's difference is called (``Pair.sig``).
SIGNIFICANT, WITHIN_NOISE, NOISE_UNKNOWN = "significant", "within noise", "noise unknown"

#: The mark of each in the text and HTML matrix.
MARKS = {SIGNIFICANT: "*", WITHIN_NOISE: "=", NOISE_UNKNOWN: "?"}

#: The line under the ranking table.
RANK_LEGEND = (
    "ranked: VERIFIED bidders (head pinned) by score, then CONSISTENT, NOT PINNED "
    "ones by score, marked (unpinned); a bidder that failed verification or is "
    "unreadable is shown without a rank, below them"
)

#: The line under the pairwise matrix.
PAIR_LEGEND = (
    "row / column: the row's score over the column's, over the tests both have "
    "(milarun report ROW --compare COLUMN); * significant: the ratio's 95% "
    "interval excludes 1; = within noise; ? noise unknown (fewer than 2 results "
    "per test); the interval combines each test's two samples as Welch's t-test "
    "does (measure/confidence.py: geomean_interval, welch_test)"
)

#: ``ratio`` (row score / column score, over the tests both have), ``ci``
#: (:data:`milarun.measure.confidence.Interval` or None), ``sig`` (:data:`SIGNIFICANT`,
#: :data:`WITHIN_NOISE`, :data:`NOISE_UNKNOWN`), ``partial`` (some scored test of the row
#: is not in the column), ``note`` (why there is no interval, or None).
Pair = namedtuple("Pair", "ratio ci sig partial note")


@dataclass
class Bidder:
    """One bidder of a tender.

    Attributes:
        name: its name (the bidders file's, the bundle folder's name, or NAME of
            ``NAME=PATH``).
        path: the bundle folder (resolved against the bidders file's folder).
        head: the chain head the buyer received (hex), or None: unpinned.
        head_received: when it arrived (ISO 8601, as the bidders file says), or None.
        public_key: the bidder's public key file, or None: the signature not checked.
        verdict: :class:`milarun.verify.verdict.Verdict` of the bundle, or None
            (unreadable).
        error: the one-line error that made the bundle unreadable, or None.
        report: its :class:`milarun.report.table.Report`, or None (unreadable).
        price: its price (the prices file's currency), or None.
        rank: 1, 2, ... among the verified bidders; None for the others.
    """

    name: str
    path: str
    head: object = None
    head_received: object = None
    public_key: object = None
    verdict: Any = None
    error: str | None = None
    report: Any = None
    price: object = None
    rank: object = None

    @property
    def level(self):
        """:data:`VERIFIED`, :data:`NOT_PINNED`, :data:`NOT_VERIFIED` (the verdict's
        level) or :data:`UNREADABLE`."""
        if self.error is not None or self.verdict is None:
            return UNREADABLE
        return self.verdict.level

    @property
    def verified(self):
        """True when every clause held with the head pinned (level ``VERIFIED``)."""
        return self.level == VERIFIED

    @property
    def unpinned(self):
        """True when every clause held but no head was given (``CONSISTENT, NOT
        PINNED``): ranked after every verified bidder, marked."""
        return self.level == NOT_PINNED

    @property
    def status(self):
        """``VERIFIED``, ``CONSISTENT, NOT PINNED``, ``NOT VERIFIED: N clause(s) failed``
        or ``unreadable``."""
        if self.level != NOT_VERIFIED:
            return self.level
        failed = len(self.verdict.failed)
        return (
            f"{NOT_VERIFIED}: {failed} clause(s) failed"
            if failed
            else f"{NOT_VERIFIED}: no clause checked"
        )

    @property
    def signed(self):
        """``yes`` (the signature checked under the bidder's key and it held), ``BAD``
        (checked, and it failed), ``no key`` (not checked) or ``-`` (unreadable)."""
        if self.level == UNREADABLE:
            return "-"
        if self.public_key is None:
            return "no key"
        bad = any(c.name == "integrity.signature" for c in self.verdict.failed)
        return "BAD" if bad else "yes"

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

    #: The bidders file (shown path), or None: bidders from the command line.
    bidders_file: object = None
    #: How every bidder's perf is taken over its runs: the rules' ``repeat_score``
    #: (``mean`` when they give none; :data:`milarun.report.table.REPEAT_SCORES`).
    repeat_score: str = "mean"
    #: The rules' ``min_repeats`` and ``min_steady_s``, those they give.
    protocol: dict = field(default_factory=dict)

    @property
    def exit_code(self):
        """0 when at least one bidder is ``VERIFIED``; else 3 when one is ``CONSISTENT,
        NOT PINNED`` (as ``milarun verify``); else 1."""
        if any(b.verified for b in self.bidders):
            return 0
        return 3 if any(getattr(b, "unpinned", False) for b in self.bidders) else 1


# --- pure functions (no files) ----------------------------------------------------------


def tier(bidder):
    """0 ``VERIFIED``, 1 ``CONSISTENT, NOT PINNED`` (``unpinned``), 2 failed or
    unreadable."""
    if bidder.verified:
        return 0
    return 1 if getattr(bidder, "unpinned", False) else 2


def sort_key(bidder):
    """The ranking order: verified first, then unpinned, then the others; within each,
    the highest score (no score last), then the name. An unpinned bidder sorts after
    every verified one and a failed one after both, whatever its score."""
    score = bidder.score
    return (tier(bidder), score is None, -(score or 0.0), bidder.name)


def rank(bidders):
    """``bidders`` (objects with ``verified``, ``unpinned`` (optional), ``score``,
    ``name`` and a settable ``rank``) sorted by :func:`sort_key`; each verified, then
    each unpinned one given its rank 1, 2, ..., the others ``rank`` None. Returns the
    sorted list."""
    ordered = sorted(bidders, key=sort_key)
    position = 0
    for b in ordered:
        if tier(b) < 2:
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
    out: list = []
    seen: dict = {}
    for arg in args:
        name, path = None, arg
        if not Path(arg).is_dir() and "=" in arg:
            name, path = arg.split("=", 1)
        if not Path(path).is_dir():
            raise MilarunError("no such bundle folder", path=path)
        if name is None:
            name = Path(path).resolve().name
        if not BIDDER_NAME.fullmatch(name):
            raise MilarunError(
                f"{name!r} is not a bidder name (1 to 64 letters, digits, '.', "
                "'_', '+', '-'): give one as NAME=PATH"[:200],
                path=arg,
            )
        if name in seen:
            raise MilarunError(
                f"two bidders named {name!r} ({seen[name]} and {path}): name them as NAME=PATH"[
                    :300
                ],
                path=arg,
            )
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
            raise ResultFormatError(
                f"no such bidder (the bidders: {', '.join(names)})"[:300],
                path=path,
                key=f"bidders.{name}",
            )


def pair(row_summary, column_summary, weights, repeat_score="mean"):
    """:data:`Pair` of two normalized summaries: the report of ``row_summary`` with
    ``column_summary`` as its baseline (:func:`milarun.report.table.build_report`, the
    ``--compare`` path), so the ratio, its interval and the verdict are the report's;
    both sides' perf taken over their runs by ``repeat_score``."""
    report = build_report(
        row_summary, weights=weights, baseline=column_summary, repeat_score=repeat_score
    )
    ci = report.score_ratio_ci
    if report.score_ratio is None:
        sig = None
    elif ci is None:
        sig = NOISE_UNKNOWN
    else:
        sig = SIGNIFICANT if ratio_verdict(ci) == "significant" else WITHIN_NOISE
    return Pair(report.score_ratio, ci, sig, report.ratio_partial, report.score_ratio_ci_note)


def pairwise(summaries, weights, repeat_score="mean"):
    """``{(a, b): Pair}`` for every ordered pair of distinct names of ``summaries``
    (``{name: normalized summary}``; ``weights`` ``{test: w}`` or None), each from
    :func:`pair` with ``repeat_score``."""
    names = list(summaries)
    return {
        (a, b): pair(summaries[a], summaries[b], weights, repeat_score)
        for a in names
        for b in names
        if a != b
    }


def family_labels(bidders):
    """The family labels of the bidders' reports (``Report.families``), in
    :data:`milarun.report.family.FAMILIES` order."""
    present = {f["family"] for b in bidders if b.report is not None for f in b.report.families}
    return [FAMILY_LABELS[f] for f in FAMILIES + (OTHER,) if f in present]


def family_score(bidder, label):
    """The bidder's score of the family ``label``, or None."""
    for f in bidder.report.families if bidder.report is not None else []:
        if f["label"] == label:
            return f["score"]
    return None


# --- building a tender (reads files) ----------------------------------------------------


def verify_one(path, rules, expect_head=None, public_key=None):
    """The :class:`milarun.verify.verdict.Verdict` of bundle ``path`` against ``rules``
    (a rules file path), pinned to ``expect_head`` and its signature checked under
    ``public_key`` when given: :func:`milarun.verify.check.verify_bundle`, the call
    ``milarun verify`` makes.

    Raises:
        MilarunError: what ``verify_bundle`` raises on bad input.
    """
    # why: one seam, so tests can replace the verification with a fake; the import stays
    # inside because verify/check.py is built beside this module
    from ..verify.check import verify_bundle

    return verify_bundle(path, rules=rules, expect_head=expect_head, public_key=public_key)


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
    ``weights`` when given (:func:`milarun.formats.weights.load_weights`); else the shipped
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
        return (
            load_weights(default),
            shown_path(default),
            f"the shipped weights of profile {next(iter(suites))} (no --weights)",
        )
    return None, None, "unweighted: every test weight 1 (no --weights)"


def _chained(path):
    """The records a bidder's score counts: those its manifest's entries name (verify
    names any other as a failure; a broken chain fails verification, and its score still
    counts only what the manifest names).

    Raises:
        ManifestError: the manifest is missing, unreadable or torn: the bidder is
            unreadable (no score, no failure rate).
    """
    return {e["path"] for e in read_manifest(manifest_path(path)) if e["kind"] == "record"}


def _manifest_unreadable(verdict):
    """The detail of a failed ``integrity.manifest`` clause (no manifest, or one that
    cannot be read: torn, malformed, empty), or None."""
    return next((c.detail for c in verdict.failed if c.name == "integrity.manifest"), None)


def _from_bidders_file(path, bundles, prices):
    """``(currency, [Bidder])`` of the bidders file ``path``; every public key loaded
    first, so a bad one is bad input naming the file and the key.

    Raises:
        MilarunError: BUNDLE arguments or ``--prices`` beside ``--bidders``, or a bad
            bidders file or key (:func:`milarun.formats.bidders.read_bidders`).
    """
    # why: verify/keys.py loads `cryptography`; only a bidders file with keys needs it
    from ..verify.keys import load_public

    if bundles:
        raise MilarunError("give the bidders either in --bidders or as BUNDLE arguments, not both")
    if prices is not None:
        raise MilarunError(
            "--prices folds into --bidders: give each bidder's price and "
            "currency in the bidders file (docs/tender.md)"
        )
    currency, entries = read_bidders(path)
    for e in entries:
        if e.public_key is not None:
            try:
                load_public(e.public_key)
            except MilarunError as exc:
                raise ResultFormatError(
                    one_line(str(exc))[:400], path=path, key=f"{e.key}.public_key"
                )
    return currency, [
        Bidder(
            name=e.name,
            path=e.bundle,
            head=e.head,
            head_received=e.head_received,
            public_key=e.public_key,
            price=e.price,
        )
        for e in entries
    ]


def build_tender(bundles, rules, prices=None, weights=None, warn=None, bidders_file=None):
    """Verify, score and rank the bidders against the rules file ``rules``: those of the
    bidders file ``bidders_file`` (:mod:`milarun.formats.bidders`: each pinned to its
    head, its signature checked under its key, its price), else those of ``bundles``
    (command-line arguments: :func:`parse_bidders`; unpinned, unsigned) with ``prices`` a
    prices file (:func:`milarun.formats.prices.read_prices`) or None; ``weights`` a
    weights file, or None. Returns a :class:`Tender`.

    Raises:
        MilarunError: a missing bundle folder, a bad bidders, prices or weights file or
            public key, a price for an unknown bidder, ``--prices`` or BUNDLE arguments
            beside ``--bidders``, a bad rules file (verify's error): one line naming the
            file and the key.
    """
    warn = warn or sys.stderr
    # the rules first: a bad one (an impossible run protocol included) is one line,
    # exit 2, before any bundle is judged; a missing one is the first verify's error,
    # the same line milarun verify gives
    rules_doc = read_rules(rules) if Path(rules).exists() else {}
    repeat_score = rules_doc.get("repeat_score", "mean")
    protocol = {k: rules_doc[k] for k in ("min_repeats", "min_steady_s") if k in rules_doc}
    if bidders_file is not None:
        currency, bidders = _from_bidders_file(bidders_file, bundles, prices)
    else:
        named = parse_bidders(bundles)
        currency, price_map = (None, {})
        if prices is not None:
            currency, price_map = read_prices(prices)
            check_prices(price_map, [n for n, _ in named], prices)
        bidders = [Bidder(name=name, path=path, price=price_map.get(name)) for name, path in named]
    if weights is not None:
        load_weights(weights)  # a bad weights file is refused before any bundle is read
    summaries = {}
    for bidder in bidders:
        path = bidder.path
        try:
            bidder.verdict = verify_one(
                path, rules, expect_head=bidder.head, public_key=bidder.public_key
            )
            torn = _manifest_unreadable(bidder.verdict)
            if torn is not None:  # no chain: nothing to count, no clause to show
                bidder.error = one_line(torn)
                continue
            summaries[bidder.name] = load_inputs(path, warn, only=_chained(path)).summary
        except MilarunError as exc:
            if not _inside(exc.path, path):
                raise
            bidder.error = one_line(str(exc))
    weights_map, weights_shown, note = resolve_weights(weights, summaries.values())
    for bidder in bidders:
        if bidder.name in summaries:
            bidder.report = build_report(
                summaries[bidder.name],
                weights=weights_map,
                price=bidder.price,
                title=bidder.name,
                repeat_score=repeat_score,
                protocol=protocol,
            )
    ordered = rank(bidders)
    scored = {b.name: summaries[b.name] for b in ordered if b.score is not None}
    tender = Tender(
        bidders=ordered,
        rules=shown_path(rules),
        currency=currency,
        prices=shown_path(prices) if prices else None,
        bidders_file=shown_path(bidders_file) if bidders_file else None,
        weights=weights_shown,
        weights_note=note,
        pairs=pairwise(scored, weights_map, repeat_score),
        families=family_labels(ordered),
        repeat_score=repeat_score,
        protocol=protocol,
    )
    tender.warnings = [f"{b.name}: {w}" for b in ordered if b.report for w in b.report.warnings]
    return tender


# --- output -----------------------------------------------------------------------------


def columns(tender):
    """The columns of the ranking table."""
    cols = ["rank", "verification", "signed"]
    if any(b.head_received for b in tender.bidders):
        cols += ["head received"]
    cols += ["score", "score 95% CI", "node score", "node score 95% CI"]
    cols += [f"{label} score" for label in tender.families]
    cols += ["failure rate"]
    if any(b.report is not None and b.report.perf_per_watt is not None for b in tender.bidders):
        cols += ["perf/W (items/J)", "energy / score (J)"]
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
    rank = "-" if bidder.rank is None else str(bidder.rank)
    row = {
        "rank": rank + " (unpinned)" if bidder.rank is not None and not bidder.verified else rank,
        "verification": bidder.status,
        "signed": bidder.signed,
        "head received": bidder.head_received or "-",
        "score": fmt_num(bidder.score),
        "score 95% CI": _ci(r, "score"),
        "node score": fmt_num(r.node_score if r else None),
        "node score 95% CI": _ci(r, "node_score"),
        "failure rate": "-" if r is None else fmt_pct(r.failure_rate),
        "perf/W (items/J)": fmt_num(r.perf_per_watt if r else None, ".4g"),
        "energy / score (J)": fmt_num(energy_per_point(r), ".4g"),
    }
    for label in tender.families:
        row[f"{label} score"] = fmt_num(family_score(bidder, label))
    if tender.currency is not None:
        row[f"price ({tender.currency})"] = fmt_num(bidder.price, ",.2f")
        row["price / score"] = fmt_money(r.rpp if r and bidder.price else None)
        row["price / node score"] = fmt_money(r.node_rpp if r and bidder.price else None)
    return row


def energy_per_point(report):
    """Energy per score point in J (``1 / report.perf_per_watt``; see the module doc), or
    None when the report has no perf/W (no energy readings) or none to invert."""
    ppw = None if report is None else report.perf_per_watt
    return 1.0 / ppw if ppw else None


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
    ci = f"95% CI {fmt_interval(p.ci, '.3f')}" if p.ci is not None else f"no interval ({p.note})"
    part = " (partial: over the tests both have)" if p.partial else ""
    return f"{a} / {b}: {p.ratio:.3f}{part}, {ci}: {p.sig}"


def header_items(tender):
    """``[(label, text)]``: what the tender table was made from."""
    if tender.bidders_file:
        who = (
            f"{tender.bidders_file} (each bundle verified with the head received and "
            "the public key the file gives)"
        )
    else:
        who = "the command line (no head, no key: every bidder unpinned; give them in --bidders)"
    if tender.bidders_file:
        priced = (
            f"{tender.bidders_file} ({tender.currency})"
            if tender.currency
            else "none (no price in the bidders file)"
        )
    else:
        priced = f"{tender.prices} ({tender.currency})" if tender.prices else "none (no --prices)"
    return [
        ("bidders", who),
        ("rules", tender.rules),
        (
            "weights",
            tender.weights_note
            if tender.weights is None
            else f"{tender.weights} ({tender.weights_note})",
        ),
        ("prices", priced),
        ("protocol", protocol_text(tender)),
        ("milarun", __version__),
    ]


def protocol_text(tender):
    """The run protocol every bidder's figures followed: the aggregate over runs (the
    rules' ``repeat_score``) and what the rules ask (``min_repeats``, ``min_steady_s``)."""
    p = tender.protocol or {}
    asks = [f"{p['min_repeats']} repeat(s) per test"] if "min_repeats" in p else []
    if "min_steady_s" in p:
        asks.append(f"a steady state of {p['min_steady_s']:g} s or more per record")
    return f"perf over runs: {tender.repeat_score} ({REPEAT_WORDS[tender.repeat_score]}); " + (
        f"the rules ask {', '.join(asks)}" if asks else "the rules ask no repeats"
    )


def protocol_lines(tender):
    """One line per scored bidder: its runs per test, the run-to-run spread (the largest
    CV of the per-run figures over its tests, and which) and the tests with fewer runs
    than the rules ask."""
    lines = []
    for b in tender.bidders:
        p = getattr(b.report, "protocol", None)
        if not p or p.get("repeats_min") is None:
            continue
        lo, hi = p["repeats_min"], p["repeats_max"]
        runs = f"{lo}" if lo == hi else f"{lo} to {hi}"
        cvs = [
            (r["repeat_spread"]["cv"], r["test"])
            for r in b.report.rows
            if (r.get("repeat_spread") or {}).get("cv") is not None
        ]
        spread = (
            f"run-to-run cv up to {fmt_pct(max(cvs)[0])} ({max(cvs)[1]})"
            if cvs
            else "run-to-run spread unknown (one run)"
        )
        short = (
            "; fewer repeats than the rules ask: " + ", ".join(f"{t} ({k})" for t, k in p["short"])
            if p.get("short")
            else ""
        )
        lines.append(f"{b.name}: {runs} run(s) per test, {spread}{short}")
        lines += [f"  {b.name}: {note}" for note in p.get("notes") or []]
    return lines


def _one_run(tender, with_protocol=False):
    """The one-run note (and, with ``with_protocol``, every :func:`protocol_lines` line
    after it, for the HTML page's one paragraph), or None."""
    names = [b.name for b in tender.bidders if b.report is not None and b.report.one_run]
    if with_protocol:
        text = " ".join(
            line.strip() for line in [_one_run(tender) or "", *protocol_lines(tender)] if line
        )
        return text or None
    if not names:
        return None
    return (
        f"one run per test in {', '.join(names)}: the intervals hold the spread between "
        "that run's results, not the drift between runs; ask for --repeat 3 or more "
        "before calling a difference of a few percent real (docs/report.md)"
    )


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
    frame = pd.DataFrame(
        {c: [row[c] for row in rows] for c in cols},
        index=pd.Index([b.name for b in tender.bidders], name="bidder"),
        columns=cols,
    )
    lines.append(frame.to_string())
    lines.append(RANK_LEGEND)
    for b in tender.bidders:
        if b.unpinned:
            lines.append(
                f"{b.name}: {NOT_PINNED}: every clause held, but no head was given: "
                "a chain rewritten end to end reads the same"
            )
        elif b.error is not None:
            lines.append(f"{b.name}: unreadable: {b.error}")
        elif b.verdict is not None and not b.verdict.ok:
            lines.append(f"{b.name}: not verified:")
            lines += [f"  {c.name}: {one_line(c.detail)}" for c in b.verdict.failed]
    names = [b.name for b in tender.bidders if b.score is not None]
    if len(names) >= 2:
        lines.append("")
        lines.append("score differences between bidders (row / column):")
        matrix = pd.DataFrame(
            {
                c: [pair_cell(tender.pairs.get((r, c))) if r != c else "-" for r in names]
                for c in names
            },
            index=pd.Index(names, name="row / column"),
            columns=names,
        )
        lines.append(matrix.to_string())
        lines.append(PAIR_LEGEND)
        lines += [
            pair_line(a, b, tender.pairs[(a, b)])
            for i, a in enumerate(names)
            for b in names[i + 1 :]
        ]
    protocol = protocol_lines(tender)
    if protocol:
        lines.append("")
        lines.append("run protocol (per bidder):")
        lines += protocol
    note = _one_run(tender)
    if note:
        lines.append(note)
    return lines


def render_text(tender):
    """The tender as terminal-safe text (ends with a newline)."""
    return terminal_safe("\n".join(text_lines(tender)) + "\n")


def _interval_json(ci):
    return (
        None
        if ci is None
        else {"lo": ci.lo, "hi": ci.hi, "df": ci.df if math.isfinite(ci.df) else None}
    )


def to_json(tender):
    """The tender as a JSON-ready dict: inputs, ``bidders`` in ranking order (rank,
    status, failed clauses, score, node score and intervals, families, failure rate,
    price and prices per point), ``pairs`` (each ordered pair: ratio, interval, verdict)."""
    bidders = []
    for b in tender.bidders:
        r = b.report
        bidders.append(
            {
                "name": b.name,
                "bundle": b.path,
                "rank": b.rank,
                "verified": b.verified,
                "level": b.level,
                "pinned": b.head is not None,
                "head": b.head,
                "head_received": b.head_received,
                "public_key": b.public_key,
                "signed": b.signed,
                "status": b.status,
                "error": b.error,
                "failed": (
                    [c.to_json() for c in b.verdict.failed] if b.verdict and b.error is None else []
                ),
                "score": b.score,
                "score_ci": _interval_json(r.score_ci if r else None),
                "node_score": r.node_score if r else None,
                "node_score_ci": _interval_json(r.node_score_ci if r else None),
                "families": {f["label"]: f["score"] for f in (r.families if r else [])},
                "failure_rate": r.failure_rate if r else None,
                "perf_per_watt": r.perf_per_watt if r else None,
                "energy_per_score_j": energy_per_point(r),
                "price": b.price,
                "price_per_score": r.rpp if r and b.price else None,
                "price_per_node_score": r.node_rpp if r and b.price else None,
                "repeats": (
                    {
                        "min": r.protocol.get("repeats_min"),
                        "max": r.protocol.get("repeats_max"),
                        "short": [list(x) for x in r.protocol.get("short") or []],
                        "spread": {row["test"]: row.get("repeat_spread") for row in r.rows},
                    }
                    if getattr(r, "protocol", None)
                    else None
                ),
            }
        )
    return {
        "format": "milarun-tender",
        "milarun": __version__,
        "rules": tender.rules,
        "protocol": {"repeat_score": tender.repeat_score, **(tender.protocol or {})},
        "bidders_file": tender.bidders_file,
        "weights": tender.weights,
        "prices": tender.prices,
        "currency": tender.currency,
        "bidders": bidders,
        "pairs": [
            {
                "row": a,
                "column": b,
                "ratio": p.ratio,
                "ci": _interval_json(p.ci),
                "significance": p.sig,
                "partial": p.partial,
            }
            for (a, b), p in tender.pairs.items()
        ],
    }


def render_html(tender, generated=None):
    """The tender as one self-contained HTML page (``templates/tender.html.j2``, jinja2
    with autoescaping: every bidder name and clause detail is escaped)."""
    cols = columns(tender)
    names = [b.name for b in tender.bidders if b.score is not None]
    return (
        _env()
        .get_template("tender.html.j2")
        .render(
            inputs=header_items(tender),
            columns=cols,
            generated=generated,
            rank_legend=RANK_LEGEND,
            rows=[
                {
                    "name": b.name,
                    "verified": b.verified,
                    "level": b.level,
                    "tier": ("verified", "unpinned", "unverified")[tier(b)],
                    "cells": cells(tender, b),
                    "failed": (
                        [f"{c.name}: {c.detail}" for c in b.verdict.failed]
                        if b.verdict is not None and b.error is None
                        else []
                    )
                    + ([f"unreadable: {b.error}"] if b.error else []),
                }
                for b in tender.bidders
            ],
            names=names,
            matrix=[
                {
                    "row": r,
                    "cells": [
                        ("-", "")
                        if r == c
                        else (pair_cell(tender.pairs.get((r, c))), _band(tender.pairs.get((r, c))))
                        for c in names
                    ],
                }
                for r in names
            ],
            legend=PAIR_LEGEND,
            one_run=_one_run(tender, with_protocol=True),
            pairs=[
                pair_line(a, b, tender.pairs[(a, b)])
                for i, a in enumerate(names)
                for b in names[i + 1 :]
            ],
        )
    )


def _band(p):
    """CSS class of a matrix cell: ``good`` significantly higher, ``bad`` lower."""
    if p is None or p.sig != SIGNIFICANT or p.ratio is None:
        return ""
    return "good" if p.ratio > 1 else "bad"


def make_tender(
    bundles,
    rules,
    prices=None,
    weights=None,
    html=None,
    json_out=None,
    warn=None,
    generated=None,
    bidders_file=None,
):
    """Build the tender (:func:`build_tender`), write its HTML page and JSON file when
    asked; returns ``(tender, text)``.

    Raises:
        MilarunError: bad input (see :func:`build_tender`), or an output that cannot be
            written.
    """
    import datetime
    import json

    tender = build_tender(
        bundles, rules, prices=prices, weights=weights, warn=warn, bidders_file=bidders_file
    )
    text = render_text(tender)
    if html:
        generated = generated or datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        )
        write_text(html, render_html(tender, generated=generated))
    if json_out:
        write_text(json_out, json.dumps(to_json(tender), indent=1, allow_nan=False) + "\n")
    return tender, text


__all__ = [
    "NOT_PINNED",
    "NOT_VERIFIED",
    "UNREADABLE",
    "VERIFIED",
    "Bidder",
    "Pair",
    "Tender",
    "build_tender",
    "make_tender",
    "pair",
    "pairwise",
    "parse_bidders",
    "rank",
    "render_html",
    "render_text",
    "sort_key",
    "tier",
    "to_json",
    "verify_one",
]
