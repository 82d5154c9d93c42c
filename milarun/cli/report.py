"""``milarun report RESULTS_or_SUMMARY [options]``: table, score, optional HTML.

Heavy modules (pandas, matplotlib, jinja2) are imported only when the
command runs, so ``milarun --help`` stays fast.
"""

import sys

from ..formats.terminal import one_line
from .options import flag, option, positional

OPTIONS = (
    positional("results", "Results directory, or a summary JSON file"),
    option(
        "weights",
        'Weights file: {"suite.test": {"weight": w}} (default: the shipped '
        "weights of the results' profile, e.g. weights/cpu.json for results of "
        "profiles/cpu.json; else every test weighs 1)",
    ),
    flag("unweighted", "Every test weighs 1, even for results of a shipped profile"),
    option("compare", "Baseline summary to compare with (ours or the 2020 flat format)"),
    option(
        "price",
        "Price of one node in dollars: adds RPP = price / score and price / node "
        "score (the one to quote in a tender: see docs/report.md)",
        type=float,
    ),
    flag("compare_gpus", "Add per-GPU comparison tables (rate / best GPU of the test)"),
    flag(
        "compare_nodes",
        "Compare each node's throughput with the median of the other nodes, "
        "per test, and flag the slow and the failed nodes",
    ),
    option(
        "node_threshold",
        "Percentage below the other nodes' median that makes a node "
        "SLOW, 0 to 100 (default 5; implies --compare-nodes)",
        type=float,
    ),
    flag(
        "penalize_variance", "Leave the variance factor (1 - std/mean) out of perf_adj", negate=True
    ),
    option("title", "Title of the report"),
    option("html", "Also write a self-contained HTML report to this file"),
    flag("strict", "Exit with status 1 when a weighted test is missing or has perf_adj 0"),
    option(
        "throughput",
        "Throughput scored for tests run as concurrent processes: effective "
        "(over the interval when all were in steady state) or own (each one's own "
        "steady state, the 2020 rule)",
        default="effective",
    ),
    option(
        "repeat_score",
        "How a test's perf is taken over its runs (--repeat): mean (over every result, "
        "the default), median or trimmed-mean (each run's mean over its devices, then the "
        "median, or the mean without the fastest and slowest run: MLPerf's rule; "
        "docs/report.md)",
        default="mean",
    ),
    option(
        "thresholds",
        "Acceptance thresholds file (e.g. profiles/acceptance-thresholds.json; "
        "docs/acceptance.md): print PASS/FAIL per clause and overall, and exit with status 1 "
        "when a clause fails",
    ),
    option(
        "family",
        "Score only these workload families' tests (llm, generative, io, rl, "
        "recommendation, nlp, vision, compute, other; from the profile tags: "
        "docs/report.md); the others are shown with weight 0. Repeatable: "
        "--family llm --family vision",
        nargs="+",
        repeat=True,
    ),
    flag(
        "cache",
        "Compute everything again: neither read nor write this user's cache of what "
        'the report read of a results folder (docs/report.md, "The report\'s cache")',
        negate=True,
    ),
    option(
        "burn_threshold",
        "Percentage below the median TFLOP/s of all GPUs that flags a "
        "burn-in GPU SLOW in the acceptance section, 0 to 100 (default 5)",
        type=float,
    ),
    option(
        "fault_mtbf",
        "A job's mean time between interruptions at 1,024 GPUs, in hours (default 7.9, "
        "Kokolis et al. 2024): the projection of the time lost to faults (docs/report.md)",
        type=float,
    ),
)


def command(opts, rest):
    """Print the report table and score of a results directory or summary file."""
    return run_report(
        opts.results,
        weights=opts.weights,
        compare=opts.compare,
        price=opts.price,
        compare_gpus=opts.compare_gpus,
        penalize_variance=opts.penalize_variance,
        title=opts.title,
        html=opts.html,
        strict=opts.strict,
        compare_nodes=opts.compare_nodes,
        node_threshold=opts.node_threshold,
        throughput=opts.throughput,
        unweighted=opts.unweighted,
        thresholds=opts.thresholds,
        burn_threshold=opts.burn_threshold,
        family=opts.family,
        cache=opts.cache,
        repeat_score=opts.repeat_score,
        fault_mtbf=opts.fault_mtbf,
    )


def run_report(results, strict=False, stdout=None, warn=None, **options):
    """Build, print (and write as HTML) the report; returns the exit code.

    Exit code 1 with ``strict`` when the score is incomplete (a weighted test
    is missing or every run of one failed), or with ``thresholds`` when a clause of the
    acceptance thresholds fails, else 0. Each figure shown "n/a"
    because it is out of range (``Report.warnings``) is one warning line on ``warn``.

    Raises:
        MilarunError: ``price`` is not a finite number > 0 or ``repeat_score`` not one
            of :data:`milarun.report.table.REPEAT_SCORES` (checked before anything
            is read), or a bad input (see :func:`milarun.report.make_report`).
    """
    # lazy, for start-up: `milarun --help` imports every cli module (the report: pandas)
    from ..formats.prices import check_price
    from ..report import make_report
    from ..report.table import check_repeat_score

    stdout = stdout or sys.stdout
    warn = warn or sys.stderr

    if options.get("price") is not None:
        options["price"] = check_price(options["price"])
    if options.get("repeat_score") is not None:
        options["repeat_score"] = check_repeat_score(options["repeat_score"])
    report, text = make_report(results, warn=warn, **options)
    for line in report.warnings:
        print(one_line(f"milarun: warning: {line}"), file=warn)
    stdout.write(text)
    if strict and report.incomplete:
        print(
            one_line(
                "milarun: error: --strict: the score is incomplete ("
                + "; ".join(
                    filter(
                        None,
                        [
                            report.missing and "missing: " + ", ".join(report.missing),
                            report.zero and "every run failed: " + ", ".join(report.zero),
                        ],
                    )
                )
                + ")"
            ),
            file=warn,
        )
        return 1
    clauses = report.acceptance_verdict
    if clauses is not None and not all(c["ok"] for c in clauses):
        print(
            f"milarun: error: --thresholds {options.get('thresholds')}: "
            f"{sum(not c['ok'] for c in clauses)} of {len(clauses)} acceptance clause(s) "
            f"failed",
            file=warn,
        )
        return 1
    return 0
