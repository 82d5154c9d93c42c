"""``milarun report RESULTS_or_SUMMARY [options]``: table, score, optional HTML.

Heavy modules (pandas, matplotlib, jinja2) are imported only when the
command runs, so ``milarun --help`` stays fast.
"""

import sys

from coleo import Option, default, tooled


@tooled
def command(rest):
    """Print the report table and score of a results directory or summary file."""
    # Results directory, or a summary JSON file
    # [positional]
    results: Option
    # Weights file: {"suite.test": {"weight": w}} (default: the shipped weights of the
    # results' profile, e.g. weights/cpu.json for results of profiles/cpu.json; else
    # every test weighs 1)
    weights: Option = default(None)
    # Every test weighs 1, even for results of a shipped profile
    unweighted: Option & bool = default(False)
    # Baseline summary to compare with (ours or the 2020 flat format)
    compare: Option = default(None)
    # Price of one node in dollars: adds RPP = price / score and price / node score
    # (the one to quote in a tender: see docs/report.md)
    price: Option & float = default(None)
    # Add per-GPU comparison tables (rate / best GPU of the test)
    compare_gpus: Option & bool = default(False)
    # Compare each node's throughput with the median of the other nodes, per test,
    # and flag the slow and the failed nodes
    compare_nodes: Option & bool = default(False)
    # Percentage below the other nodes' median that makes a node SLOW, 0 to 100
    # (default 5; implies --compare-nodes)
    node_threshold: Option & float = default(None)
    # Leave the variance factor (1 - std/mean) out of perf_adj
    # [negate]
    penalize_variance: Option & bool = default(True)
    # Title of the report
    title: Option = default(None)
    # Also write a self-contained HTML report to this file
    html: Option = default(None)
    # Exit with status 1 when a weighted test is missing or has perf_adj 0
    strict: Option & bool = default(False)
    # Throughput scored for tests run as concurrent processes: effective (over the
    # interval when all were in steady state) or own (each one's own steady state,
    # the 2020 rule)
    throughput: Option = default("effective")

    return run_report(results, weights=weights, compare=compare, price=price,
                      compare_gpus=compare_gpus, penalize_variance=penalize_variance,
                      title=title, html=html, strict=strict, compare_nodes=compare_nodes,
                      node_threshold=node_threshold, throughput=throughput,
                      unweighted=unweighted)


def run_report(results, strict=False, stdout=None, warn=None, **options):
    """Build, print (and write as HTML) the report; returns the exit code.

    Exit code 1 with ``strict`` when the score is incomplete (a weighted test
    is missing or every run of one failed), else 0. Each figure shown "n/a"
    because it is out of range (``Report.warnings``) is one warning line on ``warn``.

    Raises:
        MilarunError: ``price`` is not a finite number > 0 (checked before anything
            is read), or a bad input (see :func:`milarun.report.make_report`).
    """
    from ..report import make_report
    from ..report.table import check_price
    from ..terminal import terminal_safe

    stdout = stdout or sys.stdout
    warn = warn or sys.stderr

    if options.get("price") is not None:
        options["price"] = check_price(options["price"])
    report, text = make_report(results, warn=warn, **options)
    for line in report.warnings:
        print(terminal_safe(f"milarun: warning: {line}"), file=warn)
    stdout.write(text)
    if strict and report.incomplete:
        print("milarun: error: --strict: the score is incomplete ("
              + "; ".join(filter(None, [
                  report.missing and "missing: " + ", ".join(report.missing),
                  report.zero and "every run failed: " + ", ".join(report.zero)]))
              + ")", file=warn)
        return 1
    return 0
