"""Time a test process's start: ``milarun run MODULE:main`` with almost no training.

Usage: ``.venv/bin/python benchmarks/run_startup.py [REPEATS] [--compare DIR ...]``.

A profile's wave waits for its slowest process, and every test of every wave starts new
interpreters (one a device, one a rank), so their start (imports, the model, the data) is
paid about 30 times by the CPU profile. For each workload below this prints the median wall
and CPU time (s) of one ``milarun run`` that trains for one warm-up window and one
sample window of 1 ms, over REPEATS runs (default 5).

``--compare DIR``: also time the milarun package in DIR (a folder holding ``milarun/``,
e.g. ``git archive BASE milarun | tar -x -C DIR``), put first on ``PYTHONPATH``,
interleaved run by run with this checkout's, so that both columns see the same load on a
noisy machine. It may be given several times.
"""

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (workload, its arguments): ones with a dataset use their tiny preset, prepared once.
WORKLOADS = [
    ("toy_reg", ["--batch-size", "64", "--max-count", "256"]),
    ("loader", ["--batch-size", "16", "--max-count", "64"]),
    (
        "llm_pretrain",
        ["--shape", "tiny", "--seq-len", "32", "--batch-size", "2", "--max-count", "256"],
    ),
]
PREPARE = {"loader": "fake_imagenet", "llm_pretrain": "llm_corpus"}
SHORT = ["--warmup", "1", "--sample-duration", "0.001", "--min-steady", "0"]


def _cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def once(tree, workload, args, dataroot, out):
    """(wall, CPU) time (s) of one ``milarun run`` of ``workload`` with the package in
    ``tree``; the CPU time (user + system) is inflated far less by a loaded machine."""
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "milarun", "run", f"milarun.models.{workload}:main"]
    cmd += ["-d", str(dataroot), "-o", str(out), "--", *args, *SHORT]
    t0, c0 = time.perf_counter(), _cpu()
    # from outside every tree: ``python -m`` puts the current folder first on sys.path
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=out.parent)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    if proc.returncode != 0:
        sys.exit(f"run_startup: {' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return wall, cpu


def main(argv):
    repeats, trees = 5, [("this", ROOT)]
    it = iter(argv)
    for arg in it:
        if arg == "--compare":
            folder = Path(next(it)).resolve()
            trees.insert(0, (folder.name, folder))
        else:
            repeats = int(arg)
    with tempfile.TemporaryDirectory() as tmp:
        dataroot = Path(tmp) / "data"
        dataroot.mkdir()
        for name in sorted(set(PREPARE.values())):
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "milarun",
                    "dataset",
                    name,
                    "--size",
                    "tiny",
                    "-d",
                    dataroot,
                ],
                check=True,
                capture_output=True,
                env=dict(os.environ, PYTHONPATH=str(ROOT)),
            )
        print("median wall / CPU time (s) of one run")
        print(f"{'workload':14s}" + "".join(f"{label:>22s}" for label, _ in trees))
        for workload, args in WORKLOADS:
            times = {label: [] for label, _ in trees}
            for i in range(repeats):
                for label, tree in trees:
                    out = Path(tmp) / f"{workload}-{label}-{i}.json"
                    times[label].append(once(tree, workload, args, dataroot, out))
            cells = [
                f"{statistics.median(w for w, _ in times[label]):6.2f} / "
                f"{statistics.median(c for _, c in times[label]):5.2f} s"
                for label, _ in trees
            ]
            print(f"{workload:14s}" + "".join(f"{c:>22s}" for c in cells), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
