"""Convergence: how far the same test's loss curve moves, and the check's false-alarm rate.

Runs the tiny LLM pre-training test (``milarun.models.llm_pretrain``, the arguments of
:data:`ARGS`: 256 optimizer steps of 4 x 64 tokens, on the tiny corpus) as ``milarun
run`` children, and measures what docs/measurement.md ("Convergence references") states:

* the **spread over seeds**: the standard deviation of the last block's mean loss
  (steps 129-256, :func:`milarun.measure.convergence.curve_value`) over ``--seeds``
  seeds at fp32 on 2 threads;
* the **seed-for-seed differences** (:func:`milarun.measure.convergence.seed_differences`)
  of the same seeds on 1 thread (``taskset -c 0``: the thread count is the cpuset's
  size) and at bf16, against fp32 on 2 threads: the noise a tender's
  ``seed_tolerance`` must stay above, and the precision change it must catch;
* the **false-alarm rate** of the spread test, simulated
  (:func:`milarun.measure.convergence.false_alarm_rate`) at the seed counts a tender
  uses, with and without the RCP checker's olympic trimming.

``--write-reference FILE`` also writes the fp32 runs' summary (test group
``conv.pretrain``): ``tests/fixtures/convergence/reference.json``, the reference the
corner-cutting tests (tests/test_convergence.py) judge against.

Usage: ``python benchmarks/convergence.py [--seeds 8] [--write-reference FILE]``
(about 25 s a run on a 2-core VM).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from milarun.analysis.convergence import seed_curves  # noqa: E402
from milarun.analysis.summary import summarize  # noqa: E402
from milarun.formats.summary import write_summary  # noqa: E402
from milarun.measure.convergence import (  # noqa: E402
    common_steps,
    curve_value,
    false_alarm_rate,
    seed_differences,
)

#: The test's arguments (tests/test_convergence.py runs the same).
ARGS = [
    "--shape", "tiny", "--seq-len", "64", "--batch-size", "4", "--workers", "0",
    "--max-count", "65536", "--min-steady", "0", "--sample-duration", "0.5",
    "--warmup", "1", "--device", "cpu",
]  # fmt: skip
#: The first seed: the profile default (milarun.formats.child), run r at FIRST + r.
FIRST = 1234


def run(dataroot: Path, out: Path, seed: int, precision: str, one_thread: bool) -> dict:
    """One ``milarun run`` child; returns its record."""
    cmd = [sys.executable, "-m", "milarun", "run", "milarun.models.llm_pretrain:main"]
    cmd += ["-o", str(out), "-d", str(dataroot), "--experiment-name", "conv.pretrain", "--"]
    cmd += [*ARGS, "--precision", precision, "--seed", str(seed)]
    if one_thread and shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--write-reference", type=Path)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="milarun-convergence-"))
    dataroot = tmp / "data"
    subprocess.run(
        [sys.executable, "-m", "milarun", "dataset", "llm_corpus", "--size", "tiny"]
        + ["-d", str(dataroot)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    runs: dict[str, list[dict]] = {"fp32": [], "fp32-1-thread": [], "bf16": []}
    for i in range(args.seeds):
        runs["fp32"].append(run(dataroot, tmp / f"fp32-{i}.json", FIRST + i, "fp32", False))
    for i in range(min(3, args.seeds)):
        runs["fp32-1-thread"].append(run(dataroot, tmp / f"one-{i}.json", FIRST + i, "fp32", True))
        runs["bf16"].append(run(dataroot, tmp / f"bf16-{i}.json", FIRST + i, "bf16", False))
    curves = {}
    for name, recs in runs.items():
        curves[name], _ = seed_curves(summarize(recs)["tests"]
                                      ["conv.pretrain"]["convergence"])  # fmt: skip
    ref = curves["fp32"]
    steps = common_steps(list(ref.values()))
    values = [curve_value(c, steps) for c in ref.values()]
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    print(
        f"last block (steps {steps[-1] // 2 + 1}-{steps[-1]}), fp32, 2 threads, "
        f"{len(values)} seeds: mean {mean:.5f}, sd {sd:.5f} ({sd / mean:.2e} of the mean)"
    )
    for name in ("fp32-1-thread", "bf16"):
        diffs = seed_differences(ref, curves[name])
        worst = max(d for d, _ in diffs.values())
        print(
            f"{name} against fp32 2 threads, seed for seed: largest relative difference "
            f"{worst:.2e} ({', '.join(f'{s}: {d:.1e}' for s, (d, _) in diffs.items())})"
        )
    for nr, nb, alpha in ((8, 1, 0.05), (5, 5, 0.05), (5, 5, 0.005), (3, 3, 0.05)):
        plain = false_alarm_rate(nr, nb, alpha)
        trimmed = false_alarm_rate(nr, nb, alpha, trim=True)
        print(
            f"false alarms, {nr} reference / {nb} bidder seeds, alpha {alpha} a side: "
            f"faster {plain[0]:.4f}, slower {plain[1]:.4f}; with olympic trimming "
            f"{trimmed[0]:.4f}, {trimmed[1]:.4f} (20000 trials)"
        )
    if args.write_reference:
        summary = summarize(runs["fp32"])
        args.write_reference.parent.mkdir(parents=True, exist_ok=True)
        write_summary(summary, args.write_reference)
        print(f"reference written to {args.write_reference}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
