"""Repeatability: run a profile K times back to back and measure how much its numbers move.

Each run is a whole ``milarun jobs PROFILE -o OUTROOT/run-<i>`` (its own results
directory, its own session), one after the other. Each directory is then
summarized and scored by the report's code (:func:`milarun.report.build_report`,
with ``--weights`` when given), and for each test's perf (mean steady-state
throughput, items/s), for the score and for the node score the script gives the
mean over the K runs and the coefficient of variation ``cv = std / mean``
(sample std, divisor K - 1: :func:`milarun.stats.describe` and
:func:`milarun.stats.cv`). It also gives the mean of each run's own 95 %
confidence half-width of the score (:mod:`milarun.confidence`), to set the noise one
run predicts against the spread the K runs show.

A run whose ``milarun jobs`` exits 1 (some launch failed) is still analysed (its
failures cost its perf_adj as in any report); exit 2 (bad profile or options)
stops the study.

Usage::

    python benchmarks/repeatability.py PROFILE -k 5 [-d DATAROOT] [-o OUTROOT]
        [--weights W] [--json out.json] [-- ARGS for milarun jobs]
    python benchmarks/repeatability.py --analyze DIR DIR ... [--weights W] [--json out.json]

Everything after ``--`` goes to ``milarun jobs`` after the profile, for example
``-- --no-cgexec --cpu-slots 2`` (and a second ``--`` there reaches the tests).
The table goes to stdout, progress to stderr.
"""

import argparse
import json
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
            print(f"repeatability: run {i + 1}: some launches failed; analysed anyway",
                  file=stream)
        dirs.append(out)
    return dirs


def _spread(values):
    """``{values, mean, std, cv}`` over the runs (cv None with fewer than 2 values)."""
    from milarun import stats

    d = stats.describe(values)
    return {"values": list(values), "mean": d["mean"], "std": d["std"],
            "cv": stats.cv(d["mean"], d["std"]) if d["n"] >= 2 else None}


def analyze(dirs, weights=None, warn=None):
    """Score each results directory and return the study as a dict.

    ``{"runs": [dir], "tests": {group: {values, mean, std, cv}}, "score": {...},
    "node_score": {...}, "score_ci_half": [per run, fraction of the score, or
    None]}``; ``values`` lists each run's number (items/s for tests; None where a
    run has no rate for the test, left out of mean, std and cv).
    """
    from milarun.report import build_report, load_weights
    from milarun.summary import summarize_dir

    weights_map = load_weights(weights) if weights else None
    per_test, scores, node_scores, halves = {}, [], [], []
    for d in dirs:
        summary, _ = summarize_dir(d, warn=warn)
        report = build_report(summary, weights=weights_map)
        for row in report.rows:
            per_test.setdefault(row["test"], {})[str(d)] = row["perf"]
        scores.append(report.score)
        node_scores.append(report.node_score)
        ci = report.score_ci
        halves.append((ci.hi - ci.lo) / 2 / report.score if ci and report.score else None)
    tests = {}
    for group in sorted(per_test):
        values = [per_test[group].get(str(d)) for d in dirs]
        tests[group] = {**_spread([v for v in values if v is not None]), "values": values}
    return {"runs": [str(d) for d in dirs], "tests": tests,
            "score": {**_spread([s for s in scores if s is not None]), "values": scores},
            "node_score": {**_spread([s for s in node_scores if s is not None]),
                           "values": node_scores},
            "score_ci_half": halves}


def _pct(x):
    return "-" if x is None else f"{100 * x:.2f}%"


def _num(x):
    return "-" if x is None else f"{x:.2f}"


def table(study):
    """The study as text lines: one row per test, then the score and the node score."""
    rows = [(name, t) for name, t in study["tests"].items()]
    rows += [("score", study["score"]), ("node score", study["node_score"])]
    width = max(len(name) for name, _ in rows)
    lines = [f"{'test':{width}} {'runs':>4} {'mean':>12} {'min':>12} {'max':>12} {'cv':>8}"]
    for name, t in rows:
        vals = [v for v in t["values"] if v is not None]
        lines.append(f"{name:{width}} {len(vals):4d} {_num(t['mean']):>12} "
                     f"{_num(min(vals) if vals else None):>12} "
                     f"{_num(max(vals) if vals else None):>12} {_pct(t['cv']):>8}")
    halves = [h for h in study["score_ci_half"] if h is not None]
    lines.append(f"{len(study['runs'])} runs; cv = std / mean over the runs (sample std); "
                 "perf in items/s")
    lines.append("one run's own 95% CI half-width of the score, mean over the runs: "
                 + (_pct(sum(halves) / len(halves)) if halves
                    else "n/a (a scored test has fewer than 2 results in every run)"))
    return lines


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    jobs_args = []
    if "--" in argv:
        cut = argv.index("--")
        argv, jobs_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile", nargs="?", help="job profile to run K times")
    parser.add_argument("-k", type=int, default=5, help="number of runs (default 5)")
    parser.add_argument("-d", "--dataroot", help="dataset root (default: $MILARUN_DATAROOT)")
    parser.add_argument("-o", "--outroot",
                        help="folder of the runs' results directories (default: a new one "
                             "under the temporary folder, kept)")
    parser.add_argument("--weights", help="weights file of the score (default: every test 1)")
    parser.add_argument("--analyze", nargs="+", metavar="DIR",
                        help="analyse these results directories; run nothing")
    parser.add_argument("--json", help="also write the study to this file")
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
    except MilarunError as exc:   # a bad weights file or results folder: one line
        print(f"repeatability: error: {exc}", file=sys.stderr)
        return 2
    study["profile"] = args.profile
    print("\n".join(table(study)))
    if args.json:
        Path(args.json).write_text(json.dumps(study, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
