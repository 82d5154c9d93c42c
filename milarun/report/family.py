"""Workload families: which family a test belongs to, the score by family, ``--family``.

A test's family comes from its profile tags (the summary keeps each group's tags:
``tests[g].tags``). A test has exactly one family: the first of :data:`FAMILIES` (the
priority order) among its tags, else ``other``. The order decides the tests with
several family tags: ``["llm", "nlp"]`` is ``llm``, ``["vision", "generative"]`` is
``generative``, ``["vision", "io"]`` is ``io`` (the convnet's input-pipeline test
measures the pipeline, not the convolution). Tags that are no family (``half``,
``multi-gpu``, ``inference``, ``cpu``) are ignored.

The score by family (:func:`family_view`): per family, the weighted geometric mean
of ``perf_adj`` over its scored tests (:func:`milarun.measure.stats.weighted_geomean`,
the score's formula and weights), its share of the score's total weight, and with a
baseline the family's baseline score and ratio over the tests both have (as the
score's ratio). A summary without tags (older summaries, 2020 baselines) has no
family view.
"""

from ..errors import MilarunError
from ..measure import stats
from .formatting import finite_or_warn, geomean_or_warn

#: The families in priority order: a test is the first of these among its tags.
FAMILIES = ("llm", "generative", "io", "rl", "recommendation", "nlp", "vision", "compute")

#: The family of a test whose tags name none of :data:`FAMILIES`.
OTHER = "other"

#: What the report calls each family.
LABELS = {
    "llm": "LLM",
    "generative": "generative",
    "io": "I/O",
    "rl": "RL",
    "recommendation": "recommendation",
    "nlp": "NLP",
    "vision": "vision",
    "compute": "compute",
    OTHER: "other",
}


def family_of(tags):
    """The family of a test with profile tags ``tags``: the first of :data:`FAMILIES`
    among them, :data:`OTHER` when none is, None when ``tags`` is None (no tags
    recorded: an older summary)."""
    if tags is None:
        return None
    for family in FAMILIES:
        if family in tags:
            return family
    return OTHER


def check_families(names):
    """Return ``names`` (``--family``) as a list without repeats, each one of
    :data:`FAMILIES` or :data:`OTHER`.

    Raises:
        MilarunError: an unknown name (one line listing the families).
    """
    out = []
    for name in names or []:
        if name not in FAMILIES + (OTHER,):
            raise MilarunError(
                f"--family: unknown family {name!r}; the families: "
                f"{', '.join(FAMILIES + (OTHER,))}"[:200]
            )
        if name not in out:
            out.append(name)
    return out


def has_families(tests):
    """True when some test of a normalized summary's ``tests`` has tags."""
    return any(t.get("tags") is not None for t in tests.values())


def family_view(report, rows):
    """The score by family of ``rows`` (the report's rows with ``family``, ``weight``,
    ``counted``, ``perf_adj`` and, with a baseline, ``perf_base_adj``).

    Returns ``[{"family", "label", "tests", "names", "scored", "weight", "share", "score",
    "score_base", "ratio", "partial"}]`` in :data:`FAMILIES` order (then
    :data:`OTHER`), one entry per family with a test: ``tests`` its number of tests,
    ``names`` their names,
    ``scored`` those in the score, ``weight`` their total weight, ``share`` that
    over the score's total weight (None when no test is scored), ``score`` the
    weighted geometric mean of their ``perf_adj`` (None without one); with a baseline
    (``report.has_baseline``) ``score_base`` and ``ratio`` over the scored tests the
    baseline also has, ``partial`` when it lacks some. Out-of-range figures are None
    with a warning on ``report``.
    """
    total = sum(r["weight"] for r in rows if r["counted"])
    out = []
    for family in FAMILIES + (OTHER,):
        mine = [r for r in rows if r.get("family") == family]
        if not mine:
            continue
        counted = [r for r in mine if r["counted"]]
        weight = sum(r["weight"] for r in counted)
        label = LABELS[family]
        entry = {
            "family": family,
            "label": label,
            "tests": len(mine),
            "names": [r["test"] for r in mine],
            "scored": len(counted),
            "weight": weight,
            "share": weight / total if total > 0 else None,
            "score": geomean_or_warn(
                report,
                [r["perf_adj"] for r in counted],
                [r["weight"] for r in counted],
                f"{label} family score",
            ),
            "score_base": None,
            "ratio": None,
            "partial": False,
        }
        if report.has_baseline:
            common = [r for r in counted if r.get("perf_base_adj") and r["perf_base_adj"] > 0]
            ws = [r["weight"] for r in common]
            entry["partial"] = len(common) != len(counted)
            entry["score_base"] = geomean_or_warn(
                report, [r["perf_base_adj"] for r in common], ws, f"{label} family baseline score"
            )
            entry["ratio"] = _log_ratio(
                report,
                [r["perf_adj"] for r in common],
                [r["perf_base_adj"] for r in common],
                ws,
                f"{label} family score / baseline",
            )
        out.append(entry)
    return out


def _log_ratio(report, ours, base, weights, what):
    """``exp(log geomean(ours) - log geomean(base))``, None (with a warning when out of
    range) without tests."""
    try:
        a = stats.weighted_log_mean(ours, weights)
        b = stats.weighted_log_mean(base, weights)
    except ValueError as exc:
        report.warnings.append(f"{what}: {exc}: shown as n/a")
        return None
    if a is None or b is None:
        return None
    return finite_or_warn(report, stats.exp_or_inf(a - b), what)
