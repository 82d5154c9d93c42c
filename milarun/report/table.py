"""Summary + weights + baseline + price → the report table and the score.

This is the only place the score formula is applied. Units: ``perf``,
``perf_adj`` and the baseline columns are steady-state throughputs in items/s
(the mean over a test's results of :func:`milarun.measure.stats.steady_state`);
``std`` is a fraction (std/mean); ``price`` is in dollars.

Rules, in the order the report applies them:

* ``perf`` = ``train.mean``; ``std%`` = ``train.std / train.mean``
  (coefficient of variation of the per-result steady-state rates). With one
  result the variance is unknown: std% is shown as ``unknown (n=1)`` and
  counts as 0 in ``perf_adj``.
* Server-scenario tests (``tests[g].server`` with a ``measured`` level, the LLM Server
  scenario): ``perf``, the node throughput and the interval's sample are the rate times
  :func:`goodput_factor`, the measured level's goodput tokens/s over its output tokens/s:
  tokens served within the latency targets. 0 when no request met them (its zero reason
  says so).
* ``perf_adj = perf * (1 - std%) * (1 - fail/n)``, or ``perf * (1 - fail/n)``
  with ``penalize_variance=False`` (:func:`milarun.measure.stats.perf_adj`). The
  baseline's adjusted perf uses the same rule.
* Weights: a test's weight is ``weights[group]``; for a gpu-progression group
  ``suite.job.<k>`` (or node-progression group ``suite.job.<n>x<g>``) without
  its own entry, ``weights["suite.job"]`` applies to each one present
  (the plan type's rule, :mod:`milarun.plan.types`). Without a weights file every test weighs
  1. With one, tests it does not name weigh 0 (shown, not scored).
* Score = weighted geometric mean of ``perf_adj`` over tests with weight > 0
  and ``perf_adj`` > 0 (:func:`milarun.measure.stats.weighted_geomean`:
  ``exp(sum(w log x) / sum(w))``, computed in log space, as in the 2020
  milarun report and Fleming & Wallace, CACM 1986). A weighted
  test with no results is *missing*; a weighted test whose ``perf_adj`` is 0
  is *zero*, with its reason (:func:`zero_reason`: every run failed, or no
  successful result reached a steady state). Both are left out of the score,
  listed, and the score is marked incomplete (never NaN, never ``-inf``).
* Anomalies: the flags the summary holds (``tests[g].anomalies``, rules in
  :mod:`milarun.measure.anomalies`) are listed beside their test; they do not change
  the score.
* Failure rate = ``sum(fail) / sum(n)`` over every test shown; PASS when at
  most 1 %.
* Baseline: ``score_base`` is the weighted geometric mean of
  ``perf_base_adj`` over the scored tests the baseline also has (with
  ``perf_base_adj`` > 0), and ``score_ratio`` = our score over the same tests
  divided by ``score_base``, i.e. the weighted geometric mean of
  ``perf_ratio_adj``, computed as ``exp(log mean ours - log mean base)`` so no
  intermediate overflows. When the baseline lacks some scored tests the ratio is
  marked partial.
* Out of range: a figure that still overflows (or a geometric mean whose
  inputs are refused) is None, shown "n/a", named in ``Report.warnings``
  (``milarun report`` prints each as a warning), never a traceback or ``inf``.
* RPP (price per performance) = ``price / score`` in dollars per score unit.
* Node score (:func:`node_throughput`): ``node_perf`` is a test's throughput per
  node (items/s): for a per-gpu test (plan type ``rate_of == "device"``) the sum
  over the node's devices of each device's mean rate (the sum over every device
  divided by the number of nodes with results or failures; a device with no
  successful result counts at the others' mean, its failures being charged by
  ``1 - fail/n``); for a whole-node test (normal, njobs,
  gpu-progression) the mean rate itself; for a job over several nodes
  (multi-node, node-progression) the mean rate over ``node_count``.
  ``node_perf_adj`` applies perf_adj's rule to it, and the node score is the
  weighted geometric mean of ``node_perf_adj`` over the scored tests (same
  weights; a scored test with no node throughput, e.g. from a 2020 summary
  whose plan types are unknown, is left out and listed). With ``price``,
  ``node_rpp = price / node score`` (dollars per node-score point).
* Noise (:mod:`milarun.measure.confidence`, level 95 %): each test's ``ci`` is the
  Student t interval of ``perf`` from ``train``'s n, mean and std; the score's
  (and the node score's) interval propagates those through the geometric mean
  (delta method, Welch-Satterthwaite df), perf_adj's factors taken as fixed.
  With a baseline, each test's means are compared with Welch's t-test
  (``sig``: ``significant``, ``within noise`` or ``noise unknown``) and the score
  ratio gets its interval the same way. Fewer than 2 rates on either side, or a
  2020 baseline (its format does not define its std), gives no interval
  ("n/a", "noise unknown"), never a zero-width one.

* Throughput basis (``throughput``, ``milarun report --throughput``): with
  ``effective`` (the default), a test whose every scored result belongs to a
  concurrent wave with a common steady-state interval (the summary's
  ``effective.n`` equals ``train.n``) takes ``perf`` and ``std%`` from its
  effective throughputs (:mod:`milarun.measure.throughput`: each process's rate over
  the interval when all processes of its wave were in steady state); every
  other test, and every test with ``own``, takes them from its own
  steady-state rates (``train``), the 2020 rule. A 2020 summary has no
  effective throughputs, so its scores come out as in 2020. The row keeps both
  (``own``, ``effective``); the table shows an ``own`` column beside ``perf``
  when some test is scored on its effective throughput. A test whose
  concurrent processes' steady states overlap by less than
  :data:`milarun.measure.throughput.MIN_OVERLAP` of their length is listed in
  ``Report.overlap``.
* Repeats (``repeat_score``, ``milarun report --repeat-score``, the rules'
  ``repeat_score`` in ``milarun tender``): each run's figure is the mean over that run's
  results (its devices; the summary's ``perrun``, or ``perrun_effective`` when ``perf``
  is effective), then ``perf`` is their ``median`` or ``trimmed-mean``
  (:func:`repeat_aggregate`: the fastest and the slowest run dropped, MLPerf Training's
  rule; with fewer than 3 runs the mean of those there are, named in
  ``Report.protocol["notes"]``). ``mean`` (the default) keeps ``perf`` the mean over
  every result, as before. ``std%``, the intervals and ``perf_adj``'s variance factor
  stay those of the per-result rates; the node throughput is scaled by the same
  ``perf`` / mean ratio. Each row keeps the per-run figures, their min, max and CV
  (``repeat_spread``: the run-to-run spread, not the device-to-device one).
* Validation flags, the energy columns (``W``, ``J/item``, ``items/J``),
  ``perf/W`` and the host facts: :mod:`milarun.report.checks`.

The tables beside the score (they do not change it) are in :mod:`milarun.report.breakdown`.
"""

import math
from dataclasses import dataclass, field

from ..errors import MilarunError
from ..formats.prices import check_price
from ..measure import confidence, stats
from ..measure.flags import from_summary
from ..plan import types as plantypes
from .breakdown import (
    NODE_THRESHOLD_PCT,
    check_node_threshold,
    concurrent_tables,
    gpu_tables,
    node_comparison,
    scaling_tables,
)
from .checks import add_checks
from .family import check_families, family_of, family_view, has_families
from .formatting import finite_or_warn, geomean_or_warn

#: Failure rate (fraction) at or under which the run passes.
PASS_FAILURE_RATE = 0.01

#: What ``perf`` is (``--throughput``): see the module doc.
THROUGHPUTS = ("effective", "own")

#: How a test's ``perf`` is taken over its runs (``--repeat-score``, the rules'
#: ``repeat_score``): see :func:`repeat_aggregate`. Never the best run.
REPEAT_SCORES = ("mean", "median", "trimmed-mean")

#: Runs a trimmed mean needs (it drops the fastest and the slowest).
TRIMMED_MEAN_MIN_RUNS = 3


def weight_for(group, weights, plan_type=None):
    """Return ``(weight, key)`` of summary group ``group`` or ``(None, None)``.

    The group's plan type decides (:func:`milarun.plan.types.weight_for`): a
    gpu-progression group ``suite.job.<k>`` or a node-progression group
    ``suite.job.<n>x<g>`` falls back to the ``suite.job`` entry (every rule is
    tried when ``plan_type``, the summary's ``partition``, is unknown, as in 2020
    summaries).
    """
    return plantypes.weight_for(group, weights, plan_type)


@dataclass
class Report:
    """Everything the text and HTML renderers show. Rates in items/s."""

    title: str
    date: object
    hosts: list
    rows: list
    columns: list
    has_weights: bool
    penalize_variance: bool
    score: object = None
    missing: list = field(default_factory=list)
    zero: list = field(default_factory=list)
    n_total: int = 0
    fail_total: int = 0
    failure_rate: float = 0.0
    passed: bool = True
    has_baseline: bool = False
    score_base: object = None
    score_ratio: object = None
    ratio_partial: bool = False
    price: object = None
    rpp: object = None
    gpu_tables: object = None
    node_compare: object = None
    scaling: list = field(default_factory=list)
    failures: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    short: list = field(default_factory=list)
    throughput: str = "effective"
    #: how each test's perf was taken over its runs (:data:`REPEAT_SCORES`)
    repeat_score: str = "mean"
    #: the run protocol the figures followed (:func:`_protocol`)
    protocol: dict = field(default_factory=dict)
    overlap: list = field(default_factory=list)
    concurrent: list = field(default_factory=list)
    # node score and noise (see the module doc)
    node_score: object = None
    node_missing: list = field(default_factory=list)
    node_rpp: object = None
    score_ci: object = None
    node_score_ci: object = None
    score_ci_note: object = None
    #: tests held fixed in the score's interval (one result: variance unknown)
    score_ci_held: list = field(default_factory=list)
    node_score_ci_held: list = field(default_factory=list)
    score_ratio_ci: object = None
    score_ratio_ci_note: object = None
    score_ratio_ci_held: list = field(default_factory=list)
    baseline_noise: bool = True
    #: sides whose every scored test comes from one run: "these results", "the baseline"
    one_run: list = field(default_factory=list)
    io: list = field(default_factory=list)  # the io study's tables (report/iostudy.py)
    llm: list = field(default_factory=list)  # the LLM tests' rows (report/llm.py)
    soak: list = field(default_factory=list)  # the soak tests' rows (report/soak.py)
    acceptance: list = field(default_factory=list)  # acceptance sections (report/acceptance.py)
    acceptance_verdict: object = None  # --thresholds: [{"ok", "clause", "detail"}]
    # validation, energy and host facts (milarun.report.checks)
    #: ``[(test, flag)]``: every validation flag of the summary (milarun.measure.flags.Flag).
    validation_flags: list = field(default_factory=list)
    perf_per_watt: object = None
    perf_per_watt_tests: int = 0
    energy_nodes: list = field(default_factory=list)
    host_facts: list = field(default_factory=list)
    host_diffs: list = field(default_factory=list)
    #: ``{test: reason}`` of the tests in ``zero`` (see :func:`zero_reason`).
    zero_reasons: dict = field(default_factory=dict)
    #: ``[(test, flag)]``: every anomaly flag of the summary (milarun.measure.flags.Flag),
    #: in table order.
    anomalies: list = field(default_factory=list)
    #: The inputs the header names (:func:`milarun.report.inputs_of`), or None.
    inputs: object = None
    #: Tests whose variance is unknown (one successful result).
    single: list = field(default_factory=list)
    #: One line per figure that overflowed and is shown "n/a" (:func:`finite_or_warn`).
    warnings: list = field(default_factory=list)
    #: The score by family (:func:`milarun.report.family.family_view`); empty when no
    #: test has tags.
    families: list = field(default_factory=list)
    #: ``--family``: the families the score is over (empty: every test).
    family_filter: list = field(default_factory=list)

    @property
    def incomplete(self):
        """True when a weighted test is missing or has perf_adj 0."""
        return bool(self.missing or self.zero)

    @property
    def verdict(self):
        return "PASS" if self.passed else "FAIL"


def _ratio(a, b, report=None, what="a ratio"):
    if a is None or b is None or b <= 0:
        return None
    try:
        value = a / b
    except OverflowError:  # an int beyond a float
        value = math.inf
    return finite_or_warn(report, value, what)


class _Warnings:
    """Collects :func:`finite_or_warn` lines before the :class:`Report` exists."""

    def __init__(self):
        self.warnings = []


def _log_ratio(report, ours, base, weights):
    """Score / baseline score over the same tests: ``exp(log geomean(ours) - log
    geomean(base))`` (both :func:`milarun.measure.stats.weighted_log_mean`), None with a warning
    when it is out of range."""
    try:
        a = stats.weighted_log_mean(ours, weights)
        b = stats.weighted_log_mean(base, weights)
    except ValueError as exc:
        report.warnings.append(f"score / baseline: {exc}: shown as n/a")
        return None
    if a is None or b is None:
        return None
    return finite_or_warn(report, stats.exp_or_inf(a - b), "score / baseline")


def check_throughput(value):
    """Return ``value`` (``--throughput``) when it is one of :data:`THROUGHPUTS`.

    Raises:
        MilarunError: any other value.
    """
    if value not in THROUGHPUTS:
        raise MilarunError(f"--throughput must be {' or '.join(THROUGHPUTS)}, not {value!r}"[:120])
    return value


#: Why a server-scenario test scores 0 (:func:`zero_reason`).
NO_GOODPUT = "no request met the latency targets"


def _measured_level(t):
    """The level of a server-scenario test (``tests[g].server``) whose output tokens its
    rate counted, or None (not a server test, or no measured level)."""
    server = t.get("server")
    measured = server.get("measured") if isinstance(server, dict) else None
    if not isinstance(measured, dict):
        return None
    for level in server.get("levels") or []:
        if isinstance(level, dict) and (level.get("load"), level.get("value")) == (
            measured.get("load"),
            measured.get("value"),
        ):
            return level
    return {}  # measured, but no figures of it survived (malformed timings)


def goodput_factor(t):
    """The fraction of a server-scenario test's rate that its score keeps, or None for
    any other test: the measured level's goodput tokens/s over its output tokens/s
    (tokens of requests that met the latency targets), within 0..1; 0 when either is
    unknown or the output is 0. The test's rate (output tokens/s, per device, node or
    job as its plan type says) times it is its goodput at the same scale, so every
    aggregation of the rate (per GPU, per node, the interval) applies unchanged."""
    level = _measured_level(t)
    if level is None:
        return None
    good, out = level.get("goodput_tokens_per_s"), level.get("output_tokens_per_s")
    if not stats.finite(good) or not stats.finite(out) or out <= 0 or good <= 0:
        return 0.0
    return min(1.0, good / out)


def _scaled(value, factor):
    return value if factor is None or value is None else value * factor


def check_repeat_score(value):
    """Return ``value`` (``--repeat-score``) when it is one of :data:`REPEAT_SCORES`.

    Raises:
        MilarunError: any other value.
    """
    if value not in REPEAT_SCORES:
        raise MilarunError(
            f"--repeat-score must be {', '.join(REPEAT_SCORES)}, not {value!r}"[:120]
        )
    return value


def repeat_aggregate(values, how):
    """``(figure, note)``: ``values`` (the per-run figures of one test, any unit) taken
    together by ``how`` (:data:`REPEAT_SCORES`), in the same unit; ``(None, None)``
    without values.

    * ``mean``: their arithmetic mean.
    * ``median``: the middle value (the mean of the two middle ones for an even count).
    * ``trimmed-mean``: the mean after dropping the fastest and the slowest run, the
      MLPerf Training rule ("Benchmark Results": of the runs, the fastest and slowest are
      dropped and the rest averaged; MLCommons training_policies, training_rules.adoc).
      With fewer than :data:`TRIMMED_MEAN_MIN_RUNS` runs nothing can be dropped: the mean
      of the runs there are, and ``note`` says so.

    The best run alone is never an aggregate.
    """
    xs = sorted(float(v) for v in values if v is not None)
    if not xs:
        return None, None
    if how == "median":
        mid = len(xs) // 2
        return (xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2), None
    if how == "trimmed-mean":
        if len(xs) < TRIMMED_MEAN_MIN_RUNS:
            return math.fsum(xs) / len(xs), (
                f"{len(xs)} run(s): a trimmed mean needs {TRIMMED_MEAN_MIN_RUNS}; "
                "the mean of the runs there are"
            )
        kept = xs[1:-1]
        return math.fsum(kept) / len(kept), None
    return math.fsum(xs) / len(xs), None


def run_figures(t, basis="own"):
    """The per-run figures of a summary test (items/s), in run order: each run's mean
    over its results, effective when ``basis`` is ``"effective"`` and the summary holds
    them, a server-scenario test's scaled by :func:`goodput_factor`. Empty for a
    summary written before runs were kept (``perrun``)."""
    per = (t.get("perrun_effective") if basis == "effective" else None) or t.get("perrun")
    factor = goodput_factor(t)
    return [
        _scaled(st["mean"], factor)
        for _, st in sorted((per or {}).items(), key=lambda kv: _run_key(kv[0]))
        if isinstance(st, dict) and st.get("mean") is not None
    ]


def _run_key(label):
    try:
        return (0, int(label), "")
    except ValueError:
        return (1, 0, str(label))


def repeat_spread(figures):
    """``{"runs", "min", "max", "cv"}`` of per-run figures: the run-to-run spread (the
    CV is their sample std over their mean, a fraction; None with fewer than 2 runs)."""
    if not figures:
        return {"runs": 0, "min": None, "max": None, "cv": None}
    d = stats.describe(figures)
    return {
        "runs": d["n"],
        "min": d["min"],
        "max": d["max"],
        "cv": stats.cv(d["mean"], d["std"]) if d["n"] >= 2 else None,
    }


def perf_basis(t, throughput="effective"):
    """``(perf, std fraction, basis)`` of a summary test: its effective throughputs
    when ``throughput`` is ``"effective"`` and every scored result has one, else its
    own steady-state rates (``basis`` says which: ``"effective"`` or ``"own"``). A
    server-scenario test's perf is scaled by :func:`goodput_factor` (its std fraction
    is unchanged)."""
    factor = goodput_factor(t)
    eff = t.get("effective")
    if (
        throughput == "effective"
        and eff
        and eff.get("n")
        and eff["n"] == t["train"]["n"]
        and eff.get("mean") is not None
    ):
        return _scaled(eff["mean"], factor), stats.cv(eff["mean"], eff["std"]), "effective"
    mean = t["train"]["mean"]
    return _scaled(mean, factor), stats.cv(mean, t["train"]["std"]), "own"


def build_report(
    summary,
    weights=None,
    baseline=None,
    price=None,
    penalize_variance=True,
    compare_gpus=False,
    title=None,
    compare_nodes=False,
    node_threshold=NODE_THRESHOLD_PCT,
    throughput="effective",
    families=None,
    repeat_score="mean",
    protocol=None,
):
    """Build a :class:`Report` from a normalized summary (see :mod:`milarun.analysis.summary`).

    ``weights`` is ``{name: w}`` (from :func:`milarun.formats.weights.load_weights`) or ``None``;
    ``baseline`` a normalized summary or ``None``; ``price`` in dollars;
    ``compare_nodes`` adds :func:`node_comparison` with ``node_threshold``
    (a percentage, 0 to 100). The scaling tables of node-progression groups
    (:func:`scaling_tables`) are always built. ``throughput`` (``"effective"`` or
    ``"own"``) picks what ``perf`` is (:func:`perf_basis`). ``families`` (``--family``:
    names of :data:`milarun.report.family.FAMILIES`) scores only those families' tests:
    the others are shown with weight 0, and the weighted tests with no results (whose
    family is unknown) are not listed as missing; the score by family
    (``Report.families``) is computed before, with every test's weight.
    ``repeat_score`` (:data:`REPEAT_SCORES`) is how a test's ``perf`` is taken over its
    runs (module doc); ``protocol``: the rules' run protocol, ``{"min_repeats",
    "min_steady_s"}`` (either may be absent), shown in ``Report.protocol`` with the tests
    that have fewer runs than ``min_repeats``.

    Raises:
        MilarunError: ``node_threshold`` is not a percentage
            (:func:`check_node_threshold`), ``throughput``, ``repeat_score`` or a family is
            unknown, or ``price`` is not a finite number > 0 (:func:`check_price`).
    """
    throughput = check_throughput(throughput)
    repeat_score = check_repeat_score(repeat_score)
    families = check_families(families)
    if price is not None:
        price = check_price(price)
    if compare_nodes:
        node_threshold = check_node_threshold(node_threshold)
    tests = summary["tests"]
    has_tags = has_families(tests)
    if families and not has_tags:
        raise MilarunError(
            "--family: no test of these results has profile tags (a summary "
            "written before milarun kept them, or a 2020 one): no family "
            "is known"
        )
    report_warnings = _Warnings()
    rows, used_keys = _test_rows(
        tests,
        weights,
        baseline,
        throughput,
        penalize_variance,
        has_tags,
        report_warnings,
        repeat_score,
    )
    report = Report(
        title=title or "milarun report",
        date=summary.get("date"),
        hosts=summary.get("hosts", []),
        rows=rows,
        columns=_columns(rows, weights is not None or bool(families), baseline is not None),
        has_weights=weights is not None,
        penalize_variance=penalize_variance,
        has_baseline=baseline is not None,
        price=price,
        skipped=list(summary.get("skipped", [])),
        throughput=throughput,
        warnings=report_warnings.warnings,
        family_filter=families,
        repeat_score=repeat_score,
    )
    report.protocol = _protocol(rows, repeat_score, protocol)
    if has_tags:
        report.families = family_view(report, rows)
    _score(report, tests, weights, families, used_keys)
    if baseline is not None:
        _baseline_score(report)
    if price is not None and report.score:
        report.rpp = _ratio(price, report.score, report, "RPP (price / score)")
    add_node_score_and_noise(
        report,
        tests,
        (baseline["tests"] if baseline else {}) if baseline is not None else None,
        baseline_noise=baseline is None or baseline.get("origin") != "milarun-2020",
    )
    _side_tables(report, tests, compare_gpus, node_threshold if compare_nodes else None)
    add_checks(report, summary, baseline)
    return report


def _over_repeats(t, throughput, repeat_score):
    """``(perf, std fraction, basis, per-run figures, note)`` of a summary test:
    :func:`perf_basis`, its ``perf`` then replaced by :func:`repeat_aggregate` of the
    per-run figures unless ``repeat_score`` is ``"mean"`` (or the summary keeps no
    per-run figures: an older one, named in ``note``)."""
    perf, std, basis = perf_basis(t, throughput)
    figures = run_figures(t, basis)
    note = None
    if repeat_score != "mean" and perf is not None:
        if figures:
            perf, note = repeat_aggregate(figures, repeat_score)
        else:
            note = "no per-run figures (a summary written before they were kept): the mean"
    return perf, std, basis, figures, note


def _protocol(rows, repeat_score, rules):
    """``Report.protocol``: the repeats per test (fewest, most), the aggregate, the
    rules' ``min_repeats`` and ``min_steady_s`` when given, the tests with fewer runs
    than asked (``short``) and one note per test whose aggregate fell back."""
    rules = rules or {}
    runs = [r["repeat_spread"]["runs"] for r in rows if r["rates"]]
    want = rules.get("min_repeats")
    return {
        "repeat_score": repeat_score,
        "repeats_min": min(runs) if runs else None,
        "repeats_max": max(runs) if runs else None,
        "min_repeats": want,
        "min_steady_s": rules.get("min_steady_s"),
        "short": [
            (r["test"], r["repeat_spread"]["runs"])
            for r in rows
            if want is not None and r["repeat_spread"]["runs"] < want
        ],
        "notes": [f"{r['test']}: {r['repeat_note']}" for r in rows if r.get("repeat_note")],
    }


def _test_rows(
    tests,
    weights,
    baseline,
    throughput,
    penalize_variance,
    has_tags,
    warnings,
    repeat_score="mean",
):
    """``(rows, used weight keys)``: one row per summary test (its perf over its runs,
    perf_adj, weight, its per-run figures and their spread and, with a ``baseline``, the
    baseline's figures, taken over its runs the same way, and the ratios); a ratio out of
    range is None with a line in ``warnings``."""
    base_tests = baseline["tests"] if baseline else {}
    rows, used_keys = [], set()
    for group, t in tests.items():
        n, fail = t["n"], t["failures"]
        perf, std, basis, figures, note = _over_repeats(t, throughput, repeat_score)
        adj = stats.perf_adj(perf, std, fail, n, penalize_variance)
        if weights is None:
            weight = 1.0
        else:
            weight, key = weight_for(group, weights, t.get("partition"))
            if key is not None:
                used_keys.add(key)
        row = {
            "test": group,
            "n": n,
            "fail": fail,
            "perf": perf,
            "std": std,
            "perf_adj": adj,
            "weight": weight,
            "counted": bool(weight) and adj > 0,
            "own": t["train"]["mean"],
            "basis": basis,
            "effective": (t.get("effective") or {}).get("mean"),
            "goodput_factor": goodput_factor(t),
            "rates": t["train"]["n"],
            "anomalies": [from_summary(f) for f in t.get("anomalies") or []],
            "family": family_of(t.get("tags") or []) if has_tags else None,
            "run_figures": figures,
            "repeat_spread": repeat_spread(figures),
            "repeat_note": note,
            # what the node throughput is scaled by: perf over its runs / the mean perf
            "repeat_factor": _ratio(perf, perf_basis(t, throughput)[0]),
        }
        if baseline is not None:
            b = base_tests.get(group)
            if b is not None:
                bperf, bstd, _, _, _ = _over_repeats(b, throughput, repeat_score)
                badj = stats.perf_adj(bperf, bstd, b["failures"], b["n"], penalize_variance)
            else:
                bperf, badj = None, None
            row.update(
                perf_base=bperf,
                perf_ratio=_ratio(perf, bperf, warnings, f"{group} perf_ratio"),
                perf_base_adj=badj,
                perf_ratio_adj=_ratio(adj, badj, warnings, f"{group} perf_ratio_adj"),
            )
        rows.append(row)
    return rows, used_keys


def _columns(rows, weighted, has_baseline):
    """The table's columns: ``own`` beside ``perf`` when some test is scored on its
    effective throughput, ``weight`` when weighted, the baseline's when there is one."""
    columns = ["n", "fail", "perf", "std%", "perf_adj"]
    if any(r["basis"] == "effective" for r in rows):
        columns.insert(columns.index("perf") + 1, "own")
    if weighted:
        columns.append("weight")
    if has_baseline:
        columns += ["perf_base", "perf_ratio", "perf_base_adj", "perf_ratio_adj"]
    return columns


def _score(report, tests, weights, families, used_keys):
    """The score and what it leaves out: ``--family``'s filter applied to the rows,
    the missing and zero tests, the single-result ones, the anomalies, the failure
    rate and the verdict (set on ``report``)."""
    rows = report.rows
    for r in rows:
        if families and r["family"] not in families:
            r["weight"], r["counted"] = 0.0, False
    if weights is not None and not families:
        report.missing = sorted(k for k, w in weights.items() if w > 0 and k not in used_keys)
    report.zero = [r["test"] for r in rows if r["weight"] and r["perf_adj"] <= 0]
    report.zero_reasons = {g: zero_reason(tests[g]) for g in report.zero}
    report.single = [r["test"] for r in rows if r["rates"] == 1]
    report.anomalies = [(r["test"], f) for r in rows for f in r["anomalies"]]
    counted = [r for r in rows if r["counted"]]
    report.score = geomean_or_warn(
        report, [r["perf_adj"] for r in counted], [r["weight"] for r in counted], "score"
    )
    report.n_total = sum(r["n"] for r in rows)
    report.fail_total = sum(r["fail"] for r in rows)
    report.failure_rate = report.fail_total / report.n_total if report.n_total else 0.0
    report.passed = report.failure_rate <= PASS_FAILURE_RATE


def _baseline_score(report):
    """The baseline's score over the scored tests it also has, and our score's ratio to
    it over the same tests (set on ``report``; partial when some are missing)."""
    counted = [r for r in report.rows if r["counted"]]
    common = [r for r in counted if r["perf_base_adj"] and r["perf_base_adj"] > 0]
    report.ratio_partial = len(common) != len(counted)
    ws = [r["weight"] for r in common]
    report.score_base = geomean_or_warn(
        report, [r["perf_base_adj"] for r in common], ws, "baseline score"
    )
    report.score_ratio = _log_ratio(
        report, [r["perf_adj"] for r in common], [r["perf_base_adj"] for r in common], ws
    )


def _side_tables(report, tests, compare_gpus, node_threshold):
    """The tables beside the score (set on ``report``): the GPU tables with
    ``compare_gpus``, the node comparison when ``node_threshold`` (a percentage) is
    given, the scaling tables, the short steady states, the concurrent waves and the
    failures."""
    if compare_gpus:
        report.gpu_tables = gpu_tables(tests)
    if node_threshold is not None:
        report.node_compare = node_comparison(tests, node_threshold)
    report.scaling = scaling_tables(tests)
    report.short = [
        g
        for g, t in tests.items()
        if any(f.get("kind") == "short-steady" for f in t.get("anomalies") or [])
    ]
    report.overlap, report.concurrent = concurrent_tables(tests)
    for group, t in tests.items():
        for f in t.get("failed", []):
            report.failures.append({"test": group, "name": t.get("name", group), **f})


def zero_reason(test):
    """Why a test (a normalized summary entry) has no ``perf_adj``, in words.

    ``"no steady state in 2 result(s): <the record's message>"`` when every
    failure is ``no-steady-state`` (:mod:`milarun.measure.plausibility`: the results ran,
    but no rate was measured); ``"every run failed (timeout x2)"`` with the
    recorded reasons otherwise; the clamp when the rates have a std% of 100 %
    or more; ``"no results"`` (and how many launches were interrupted) when
    nothing was recorded.
    """
    n, fail = test.get("n", 0), test.get("failures", 0)
    reasons = test.get("failure_reasons") or {}
    if ((test.get("train") or {}).get("n") or 0) > 0 and goodput_factor(test) == 0:
        return NO_GOODPUT
    if ((test.get("train") or {}).get("n") or 0) > 0:
        return "std% of 100% or more (perf_adj is clamped at 0)"
    if fail and set(reasons) == {"no-steady-state"}:
        messages = {f.get("message") for f in test.get("failed") or [] if f.get("message")}
        why = f": {messages.pop().removeprefix('no steady state: ')}" if len(messages) == 1 else ""
        return f"no steady state in {fail} result(s){why}"
    if fail:
        text = ", ".join(f"{k}" + (f" x{v}" if v > 1 else "") for k, v in sorted(reasons.items()))
        head = "every run failed" if fail == n else f"{fail} of {n} run(s) failed"
        return f"{head} ({text})" if text else head
    interrupted = test.get("interrupted") or 0
    return "no results" + (f" ({interrupted} launch(es) interrupted)" if interrupted else "")


def node_throughput(t, basis="own"):
    """Throughput per node (items/s) of one normalized summary group ``t``, or None.

    ``basis`` (from :func:`perf_basis`) picks own or effective rates, so a node's
    throughput is measured the way the test's ``perf`` is.

    The group's plan type (:attr:`milarun.plan.types.PlanType.rate_of`) says what one
    record's rate measures:

    * ``"device"`` (per-gpu): the sum of the devices' mean rates (``pergpu``) over
      the number of nodes that have results or failures (``pernode``,
      ``pernode_failures``; 1 without them): the average node's sum over its
      devices. A device whose every run failed (in ``failed`` only) counts at the
      mean of the other devices: its failures already cost the test its
      ``(1 - fail/n)`` factor, and counting it at 0 as well would charge them
      twice (a node with 1 dead GPU of 8 then scores 7/8 of a whole one);
    * ``"node"`` (normal, njobs, gpu-progression): ``train.mean``;
    * ``"job"`` (multi-node, node-progression): ``train.mean / node_count``.

    None when the plan type is unknown (2020 summaries) or there is no rate.
    """
    kind = plantypes.TYPES.get(t.get("partition"))
    if kind is None:
        return None
    return _scaled(_node_rate(t, kind, basis), goodput_factor(t))


def _node_rate(t, kind, basis):
    """:func:`node_throughput` before a server-scenario test's goodput factor."""
    if kind.rate_of == "device":
        per = t.get("pergpu_effective") if basis == "effective" else None
        means = [
            st["mean"]
            for st in (per or t.get("pergpu") or {}).values()
            if st.get("mean") is not None
        ]
        if not means:
            return None
        devices = set(t.get("pergpu") or {}) | {f.get("device") for f in t.get("failed") or []}
        nodes = set(t.get("pernode") or {}) | set(t.get("pernode_failures") or {})
        return math.fsum(means) / len(means) * len(devices) / max(1, len(nodes))
    perf = _sample(t, basis, scaled=False)[1]
    if perf is None:
        return None
    if kind.rate_of == "job":
        count = t.get("node_count")
        return perf / count if count else None
    return perf


def _sample(t, basis="own", scaled=True):
    """``(n, mean, std)`` of a group's per-result rates: effective ones when ``basis``
    is ``"effective"`` (:func:`perf_basis`), else the own steady-state rates; a
    server-scenario test's scaled by :func:`goodput_factor` (unless ``scaled`` is False)."""
    st = t.get("effective") if basis == "effective" else None
    st = st or t["train"]
    factor = goodput_factor(t) if scaled else None
    return (st["n"], _scaled(st["mean"], factor), _scaled(st["std"], factor))


def _few(rows, key="sample"):
    """Tests of ``rows`` whose ``key`` sample has fewer than 2 rates."""
    return [r["test"] for r in rows if (r[key][0] or 0) < 2]


def _no_interval(few):
    """Why a score has no interval: the tests with fewer than 2 results, else spreads
    too wide for finite bounds (:mod:`milarun.measure.confidence` returns None for both)."""
    if few:
        return "fewer than 2 results in " + ", ".join(few)
    return "the spread of the results is too wide for finite bounds"


def _one_run(counted, tests):
    """Whether every scored test of ``tests`` that has a rate comes from at most one run
    (``runs`` unknown in a summary written before it was counted: taken as one)."""
    runs = [
        (tests.get(r["test"]) or {}).get("runs")
        for r in counted
        if (tests.get(r["test"]) or {}).get("train", {}).get("n")
    ]
    return bool(runs) and all(not isinstance(k, int) or k <= 1 for k in runs)


def add_node_score_and_noise(report, tests, base_tests=None, baseline_noise=True):
    """Add the node score and the confidence intervals to ``report`` (rules in the module
    doc). ``tests`` and ``base_tests`` are normalized summaries' ``tests`` (no baseline:
    None); ``baseline_noise`` False says the baseline's std cannot be used (2020 format).
    """
    report.baseline_noise = baseline_noise
    for r in report.rows:
        t = tests[r["test"]]
        r["sample"] = _sample(t, r["basis"])
        r["ci"] = confidence.mean_interval(*r["sample"])
        node = node_throughput(t, r["basis"])
        if node is not None and report.repeat_score != "mean":
            node = None if r["repeat_factor"] is None else node * r["repeat_factor"]
        r["node_perf"] = node
        r["node_perf_adj"] = (
            None
            if node is None
            else stats.perf_adj(node, r["std"], r["fail"], r["n"], report.penalize_variance)
        )
        if base_tests is None:
            continue
        b = base_tests.get(r["test"])
        r["base_sample"] = None if b is None else _sample(b, perf_basis(b, report.throughput)[2])
        test = (
            confidence.welch_test(r["sample"], r["base_sample"])
            if b is not None and baseline_noise
            else None
        )
        r["t"], r["df"] = (test.t, test.df) if test else (None, None)
        r["sig"] = (
            None
            if b is None or r["perf"] is None or b["train"]["mean"] is None
            else "noise unknown"
            if test is None
            else "significant"
            if test.significant
            else "within noise"
        )

    counted = [r for r in report.rows if r["counted"]]
    node_rows = [r for r in counted if r["node_perf_adj"]]
    report.node_missing = [r["test"] for r in counted if not r["node_perf_adj"]]
    report.node_score = geomean_or_warn(
        report,
        [r["node_perf_adj"] for r in node_rows],
        [r["weight"] for r in node_rows],
        "node score",
    )
    if report.price is not None and report.node_score:
        report.node_rpp = _ratio(report.price, report.node_score, report, "price / node score")

    # Tests with one result (whole-node, gpu-progression) are held fixed, so a profile
    # that has any still gets an interval; the report names them (docs/report.md).
    report.score_ci = confidence.geomean_interval(
        report.score, [(r["weight"], [r["sample"]]) for r in counted], hold_unknown=True
    )
    report.node_score_ci = confidence.geomean_interval(
        report.node_score, [(r["weight"], [r["sample"]]) for r in node_rows], hold_unknown=True
    )
    if report.score is not None and report.score_ci is None:
        report.score_ci_note = _no_interval(_few(counted))
    elif report.score_ci is not None:
        report.score_ci_held = _few(counted)
    if report.node_score_ci is not None:
        report.node_score_ci_held = _few(node_rows)
    report.one_run = [
        side
        for side, tests_ in (
            ("these results", tests),
            ("the baseline", base_tests if baseline_noise else None),
        )
        if tests_ is not None and _one_run(counted, tests_)
    ]

    if base_tests is not None and report.score_ratio is not None:
        common = [r for r in counted if r["perf_base_adj"] and r["perf_base_adj"] > 0]
        if not baseline_noise:
            report.score_ratio_ci_note = (
                "the baseline is a 2020 summary, whose format does not define its std"
            )
            return
        report.score_ratio_ci = confidence.geomean_interval(
            report.score_ratio,
            [(r["weight"], [r["sample"], r["base_sample"]]) for r in common],
            hold_unknown=True,
        )
        if report.score_ratio_ci is not None:
            held = set(_few(common)) | set(_few(common, "base_sample"))
            report.score_ratio_ci_held = sorted(held)
        if report.score_ratio_ci is None:
            few = [
                f"{side} {', '.join(names)}"
                for side, names in (
                    ("ours:", _few(common)),
                    ("baseline:", _few(common, "base_sample")),
                )
                if names
            ]
            report.score_ratio_ci_note = _no_interval(["; ".join(few)] if few else [])
