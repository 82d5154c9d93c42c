"""Distributed end loop: launch one test of a profile N times and count how its launches end.

A distributed test can write its successful record and still fail afterwards: a
rank that dies in its teardown (``terminate called without an active
exception``, SIGABRT) makes torchrun stop the job, and the launcher classifies
the launch FAIL ``exit-after-result``. Such a fault is intermittent, so one
passing run says little; this script repeats the launch and counts.

Each run is a whole ``milarun jobs PROFILE --name TEST -o OUTROOT/TEST-<i>``
(its own results directory and session), one after the other. A run's outcome
is read from its record (``success``, ``error.reason``, as the launcher wrote
it); a run that left no record counts as ``no-record``, and a run whose log
holds ``terminate called`` is counted in the ``terminate`` column, whatever its
outcome. The table (stdout) gives, per test: runs, passed, failed, the failures
by reason, the runs with ``terminate called`` and the mean wall seconds of one
run (the whole ``milarun jobs``: start-up, prepare, the launch, the teardown).

Usage::

    python benchmarks/dist_end_loop.py PROFILE TEST [TEST ...] -n 30 [-d DATAROOT]
        [-o OUTROOT] [--json out.json] [-- ARGS for milarun jobs]

For example, two gloo ranks on a CPU host with short runs::

    python benchmarks/dist_end_loop.py profiles/cpu.json llm_fsdp ddp_convnet -n 30 \\
        -d /tmp/data -- --cpu-slots 2 --no-cgexec -- --min-steady 1

Everything after the first ``--`` goes to ``milarun jobs`` after the profile (a
second ``--`` there reaches the tests). Progress goes to stderr. Exits 1 when a
run failed, 2 when ``milarun jobs`` itself refused to run (exit 2: bad profile
or options).
"""

import argparse
import collections
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_once(profile, test, out, dataroot=None, jobs_args=(), stream=sys.stderr):
    """One ``milarun jobs PROFILE --name TEST -o OUT``; returns its outcome (a dict:
    ``test``, ``passed`` (bool), ``reason`` (None, the record's ``error.reason`` or
    ``no-record``), ``terminate`` (a log line says ``terminate called``), ``seconds``
    (wall seconds of the whole command), ``code`` (its exit status)).

    Raises:
        SystemExit: ``milarun jobs`` exited with 2 (bad profile or options).
    """
    cmd = [sys.executable, "-m", "milarun", "jobs", str(profile), "--name", test, "-o", str(out)]
    if dataroot:
        cmd += ["-d", str(dataroot)]
    cmd += list(jobs_args)
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    seconds = time.perf_counter() - start
    if proc.returncode == 2:
        raise SystemExit(f"dist_end_loop: milarun jobs exited with 2:\n{proc.stderr[-2000:]}")
    records = sorted(Path(out).glob("*.json"))
    logs = "".join(p.read_text(errors="replace") for p in sorted(Path(out).glob("logs/*.log")))
    terminate = "terminate called" in logs or "terminate called" in proc.stderr
    if not records:
        passed, reason = False, "no-record"
    else:
        record = json.loads(records[0].read_text())
        passed = record.get("success") is True
        reason = None if passed else (record.get("error") or {}).get("reason") or "unknown"
    return {
        "test": test,
        "passed": passed,
        "reason": reason,
        "terminate": terminate,
        "seconds": seconds,
        "code": proc.returncode,
    }


def tally(outcomes):
    """Per test, in first-seen order: ``{test: {"runs", "passed", "failed", "reasons"
    (reason -> count), "terminate" (runs), "s_per_run" (mean wall seconds)}}``."""
    table = {}
    for o in outcomes:
        row = table.setdefault(
            o["test"],
            {
                "runs": 0,
                "passed": 0,
                "failed": 0,
                "reasons": collections.Counter(),
                "terminate": 0,
                "seconds": 0.0,
            },
        )
        row["runs"] += 1
        row["passed" if o["passed"] else "failed"] += 1
        if not o["passed"]:
            row["reasons"][o["reason"]] += 1
        row["terminate"] += bool(o["terminate"])
        row["seconds"] += o["seconds"]
    for row in table.values():
        row["s_per_run"] = row.pop("seconds") / row["runs"]
        row["reasons"] = dict(row["reasons"])
    return table


def render(table):
    """The table as text lines."""
    head = (
        f"{'test':<16} {'runs':>5} {'passed':>7} {'failed':>7} {'terminate':>10} "
        f"{'s/run':>7}  failures by reason"
    )
    lines = [head, "-" * len(head)]
    for test, row in table.items():
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(row["reasons"].items())) or "-"
        lines.append(
            f"{test:<16} {row['runs']:>5} {row['passed']:>7} {row['failed']:>7} "
            f"{row['terminate']:>10} {row['s_per_run']:>7.1f}  {reasons}"
        )
    return lines


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    jobs_args = []
    if "--" in argv:
        cut = argv.index("--")
        argv, jobs_args = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile")
    parser.add_argument("tests", nargs="+", help="test names of the profile, run in turn")
    parser.add_argument("-n", "--runs", type=int, default=30, help="runs of each test")
    parser.add_argument("-d", "--dataroot")
    parser.add_argument(
        "-o",
        "--outroot",
        help="results directories (default: a temporary folder, removed at the end)",
    )
    parser.add_argument("--json", help="write the outcomes and the table here")
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="alternate the tests run by run (default: all runs of one, then the next)",
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    with contextlib.ExitStack() as stack:
        outroot = args.outroot or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="dist_end_loop-")
        )
        order = (
            [(i, t) for i in range(args.runs) for t in args.tests]
            if args.interleave
            else [(i, t) for t in args.tests for i in range(args.runs)]
        )
        outcomes = []
        for i, test in order:
            o = run_once(
                args.profile, test, Path(outroot) / f"{test}-{i}", args.dataroot, jobs_args
            )
            outcomes.append(o)
            verdict = "PASS" if o["passed"] else f"FAIL {o['reason']}"
            extra = " (terminate called)" if o["terminate"] else ""
            print(
                f"dist_end_loop: {test} run {i + 1}/{args.runs}: {verdict}{extra} in "
                f"{o['seconds']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    table = tally(outcomes)
    print("\n".join(render(table)))
    if args.json:
        Path(args.json).write_text(json.dumps({"outcomes": outcomes, "table": table}, indent=1))
    return 1 if any(not o["passed"] for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
