"""Repeatability: run a profile K times back to back and measure how much its numbers move.

Each run is a whole ``milarun jobs PROFILE -o OUTROOT/run-<i>`` (its own results
directory, its own session), one after the other. Each directory is then
summarized and scored by the report's code (:func:`milarun.report.build_report`,
with ``--weights`` when given), and for each test's perf (mean steady-state
throughput, items/s), for the score and for the node score the script gives the
mean over the K runs and the coefficient of variation ``cv = std / mean``
(sample std, divisor K - 1: :func:`milarun.measure.stats.describe` and
:func:`milarun.measure.stats.cv`). It also gives the mean of each run's own 95 %
confidence half-width of the score (:mod:`milarun.measure.confidence`), to set the noise one
run predicts against the spread the K runs show.

Two diagnostics say which part of the noise milarun could still remove:

* ``within`` (per test): the noise the steady-state window itself leaves, the
  standard error of one result's steady-state rate estimated from its own
  sample windows, ``cv(window rates) / sqrt(n windows)`` (the standard error
  of a mean; windows treated as independent), median over every result of the
  runs. When a test's ``cv`` across runs is many times its ``within``, longer
  windows or more of them cannot make the test repeatable: the machine's speed
  moved between runs.
* ``--rules`` re-scores the same runs under other steady-state rules
  (:data:`RULES`: the 2020 mean, the median or a 20 %-trimmed mean of the
  window rates, one more second of warm-up, an adaptive warm-up), all on the
  ``own`` basis, and gives the score's cv under each. Paired on the same runs,
  the comparison is free of run-to-run noise in the runs themselves.

A run whose ``milarun jobs`` exits 1 (some launch failed) is still analysed (its
failures cost its perf_adj as in any report); exit 2 (bad profile or options)
stops the study.

Usage::

    python benchmarks/repeatability.py PROFILE -k 5 [-d DATAROOT] [-o OUTROOT]
        [--weights W] [--json out.json] [-- ARGS for milarun jobs]
    python benchmarks/repeatability.py --analyze DIR DIR ... [--weights W] [--json out.json]
        [--rules]

Everything after ``--`` goes to ``milarun jobs`` after the profile, for example
``-- --no-cgexec --cpu-slots 2`` (and a second ``--`` there reaches the tests).
The table goes to stdout, progress to stderr.
"""

import argparse
import contextlib
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run_profile(profile, k, outroot, dataroot=None, jobs_args=(), stream=sys.stderr):
    """Run ``milarun jobs`` K times; return the K results directories (paths).

    Raises:
        SystemExit: ``milarun jobs`` exited with a status other than 0 or 1.
    """
    dirs = []
    for i in range(k):
        out = Path(outroot) / f"run-{i}"
        cmd = [sys.executable, "-m", "milarun", "jobs", str(profile), "-o", str(out)]
        if dataroot:
            cmd += ["-d", str(dataroot)]
        cmd += list(jobs_args)
        print(f"repeatability: run {i + 1}/{k}: {' '.join(cmd[2:])}", file=stream, flush=True)
        code = subprocess.run(cmd, cwd=ROOT, stdout=stream, stderr=stream).returncode
        if code not in (0, 1):
            raise SystemExit(f"repeatability: milarun jobs exited with {code}; stopping")
        if code == 1:
            print(f"repeatability: run {i + 1}: some launches failed; analysed anyway", file=stream)
        dirs.append(out)
    return dirs


def _spread(values):
    """``{values, mean, std, cv}`` over the runs (cv None with fewer than 2 values)."""
    from milarun.measure import stats

    d = stats.describe(values)
    return {
        "values": list(values),
        "mean": d["mean"],
        "std": d["std"],
        "cv": stats.cv(d["mean"], d["std"]) if d["n"] >= 2 else None,
    }


def _window_se(samples):
    """Relative standard error of one result's steady-state rate from its chosen
    windows: ``cv(window rates) / sqrt(n)``; None with fewer than 2 windows."""
    from milarun.measure import stats

    _, chosen, _ = stats.steady_state(samples)
    rates = [s["count"] / (s["end"] - s["start"]) for s in chosen if s["end"] > s["start"]]
    if len(rates) < 2 or not statistics.fmean(rates):
        return None
    return statistics.stdev(rates) / statistics.fmean(rates) / math.sqrt(len(rates))


def within_noise(records):
    """``{group: median relative standard error of a result's rate}`` over every
    successful result with samples among ``records`` (see the module docstring)."""
    from milarun.analysis.summary import group_name

    out = {}
    for record in records:
        samples = ((record.get("timings") or {}).get("train") or {}).get("samples")
        if not record.get("success") or not samples:
            continue
        try:
            se = _window_se(samples)
        except ValueError:
            continue
        if se is not None:
            out.setdefault(group_name(record), []).append(se)
    return {k: statistics.median(v) for k, v in out.items()}


def _rates(chosen):
    return sorted(s["count"] / (s["end"] - s["start"]) for s in chosen if s["end"] > s["start"])


def _median_rule(rule2020):
    def rule(samples, *a, **k):
        rate, chosen, note = rule2020(samples, *a, **k)
        return (statistics.median(_rates(chosen)) if rate is not None else None), chosen, note

    return rule


def _trimmed_rule(rule2020, cut=0.2):
    def rule(samples, *a, **k):
        rate, chosen, note = rule2020(samples, *a, **k)
        if rate is None:
            return rate, chosen, note
        rates = _rates(chosen)
        n = int(len(rates) * cut / 2)
        core = rates[n : len(rates) - n] or rates
        return statistics.fmean(core), chosen, note

    return rule


def _warmup_rule(rule2020, pick):
    """The 2020 rule after ``pick(rates) -> k`` more leading windows count as warm-up."""

    def rule(samples, *a, **k):
        steady = [s for s in samples if not s.get("warmup")]
        rates = [
            s["count"] / (s["end"] - s["start"]) if s["end"] > s["start"] else 0.0 for s in steady
        ]
        extra = {id(s) for s in steady[: pick(rates, steady)]}
        return rule2020([dict(s, warmup=True) if id(s) in extra else s for s in samples], *a, **k)

    return rule


def _one_more_second(rates, steady):
    k, t = 0, 0.0
    while k < len(steady) // 2 and t < 1.0:
        t += steady[k]["end"] - steady[k]["start"]
        k += 1
    return k


def _adaptive(rates, steady):
    """Leading windows slower than 95 % of the median of the windows after them
    (at most half of them): a ramp that outlasted the fixed warm-up."""
    k = 0
    while k < len(rates) // 2 and rates[k] < 0.95 * statistics.median(rates[k + 1 :]):
        k += 1
    return k


#: Steady-state rules ``--rules`` compares: name -> f(rule2020) -> rule.
RULES = {
    "2020 mean": lambda r: r,
    "median of windows": _median_rule,
    "20%-trimmed mean": _trimmed_rule,
    "warm-up + 1 s": lambda r: _warmup_rule(r, _one_more_second),
    "adaptive warm-up": lambda r: _warmup_rule(r, _adaptive),
}


@contextlib.contextmanager
def steady_rule(name):
    """Within the block, :func:`milarun.measure.stats.steady_state` is rule ``name`` of
    :data:`RULES`."""
    from milarun.measure import stats

    original = stats.steady_state
    stats.steady_state = RULES[name](original)
    try:
        yield
    finally:
        stats.steady_state = original


def compare_rules(dirs, weights=None):
    """``{rule: {"score": spread, "tests_median_cv": fraction}}``: the runs in ``dirs``
    scored on the ``own`` basis under each rule of :data:`RULES`."""
    out = {}
    for name in RULES:
        with steady_rule(name):
            study = analyze(dirs, weights=weights, throughput="own")
        cvs = [t["cv"] for t in study["tests"].values() if t["cv"] is not None]
        out[name] = {
            "score": study["score"],
            "tests_median_cv": statistics.median(cvs) if cvs else None,
        }
    return out


def analyze(dirs, weights=None, warn=None, throughput="effective"):
    """Score each results directory and return the study as a dict.

    ``{"runs": [dir], "tests": {group: {values, mean, std, cv}}, "score": {...},
    "node_score": {...}, "score_ci_half": [per run, fraction of the score, or
    None]}``; ``values`` lists each run's number (items/s for tests; None where a
    run has no rate for the test, left out of mean, std and cv).
    """
    from milarun.analysis.summary import summarize_dir
    from milarun.report import build_report, load_weights

    weights_map = load_weights(weights) if weights else None
    per_test, scores, node_scores, halves, records = {}, [], [], [], []
    for d in dirs:
        summary, loaded = summarize_dir(d, warn=warn)
        records += [record for _, record in loaded]
        report = build_report(summary, weights=weights_map, throughput=throughput)
        for row in report.rows:
            per_test.setdefault(row["test"], {})[str(d)] = row["perf"]
        scores.append(report.score)
        node_scores.append(report.node_score)
        ci = report.score_ci
        halves.append((ci.hi - ci.lo) / 2 / report.score if ci and report.score else None)
    tests = {}
    within = within_noise(records)
    for group in sorted(per_test):
        values = [per_test[group].get(str(d)) for d in dirs]
        tests[group] = {
            **_spread([v for v in values if v is not None]),
            "values": values,
            "within": within.get(group),
        }
    return {
        "runs": [str(d) for d in dirs],
        "tests": tests,
        "score": {**_spread([s for s in scores if s is not None]), "values": scores},
        "node_score": {**_spread([s for s in node_scores if s is not None]), "values": node_scores},
        "score_ci_half": halves,
    }


def _pct(x):
    return "-" if x is None else f"{100 * x:.2f}%"


def _num(x):
    return "-" if x is None else f"{x:.2f}"


def table(study):
    """The study as text lines: one row per test, then the score and the node score."""
    rows = [(name, t) for name, t in study["tests"].items()]
    rows += [("score", study["score"]), ("node score", study["node_score"])]
    width = max(len(name) for name, _ in rows)
    lines = [
        f"{'test':{width}} {'runs':>4} {'mean':>12} {'min':>12} {'max':>12} {'cv':>8} {'within':>8}"
    ]
    for name, t in rows:
        vals = [v for v in t["values"] if v is not None]
        lines.append(
            f"{name:{width}} {len(vals):4d} {_num(t['mean']):>12} "
            f"{_num(min(vals) if vals else None):>12} "
            f"{_num(max(vals) if vals else None):>12} {_pct(t['cv']):>8} "
            f"{_pct(t.get('within')):>8}"
        )
    halves = [h for h in study["score_ci_half"] if h is not None]
    lines.append(
        f"{len(study['runs'])} runs; cv = std / mean over the runs (sample std); "
        "within = a result's own standard error from its windows (median); "
        "perf in items/s"
    )
    lines.append(
        "one run's own 95% CI half-width of the score, mean over the runs: "
        + (
            _pct(sum(halves) / len(halves))
            if halves
            else "n/a (a scored test has fewer than 2 results in every run)"
        )
    )
    if study.get("rules"):
        lines.append("steady-state rules on the same runs (own basis): score cv, median test cv")
        for name, r in study["rules"].items():
            lines.append(f"  {name:20} {_pct(r['score']['cv']):>8} {_pct(r['tests_median_cv']):>8}")
    return lines


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    jobs_args = []
    if "--" in argv:
        cut = argv.index("--")
        argv, jobs_args = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile", nargs="?", help="job profile to run K times")
    parser.add_argument("-k", type=int, default=5, help="number of runs (default 5)")
    parser.add_argument("-d", "--dataroot", help="dataset root (default: $MILARUN_DATAROOT)")
    parser.add_argument(
        "-o",
        "--outroot",
        help="folder of the runs' results directories (default: a new one "
        "under the temporary folder, kept)",
    )
    parser.add_argument("--weights", help="weights file of the score (default: every test 1)")
    parser.add_argument(
        "--analyze", nargs="+", metavar="DIR", help="analyse these results directories; run nothing"
    )
    parser.add_argument("--json", help="also write the study to this file")
    parser.add_argument(
        "--rules",
        action="store_true",
        help="also re-score the runs under each steady-state rule of RULES",
    )
    args = parser.parse_args(argv)
    from milarun.errors import MilarunError

    if args.weights:  # before K runs of the profile, not after them
        from milarun.report import load_weights

        try:
            load_weights(args.weights)
        except MilarunError as exc:
            print(f"repeatability: error: {exc}", file=sys.stderr)
            return 2
    if args.analyze:
        dirs = [Path(d) for d in args.analyze]
    else:
        if not args.profile:
            parser.error("a profile, or --analyze DIR ...")
        if not 2 <= args.k <= 100:
            parser.error(f"-k must be between 2 and 100, not {args.k}")
        outroot = Path(args.outroot or tempfile.mkdtemp(prefix="milarun-repeatability-"))
        dirs = run_profile(args.profile, args.k, outroot, args.dataroot, jobs_args)
    try:
        study = analyze(dirs, weights=args.weights, warn=sys.stderr)
        if args.rules:
            study["rules"] = compare_rules(dirs, weights=args.weights)
    except MilarunError as exc:  # a bad weights file or results folder: one line
        print(f"repeatability: error: {exc}", file=sys.stderr)
        return 2
    study["profile"] = args.profile
    print("\n".join(table(study)))
    if args.json:
        Path(args.json).write_text(json.dumps(study, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
