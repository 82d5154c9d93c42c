"""Time ``milarun --help`` and every command's ``--help`` (target: at most 100 ms each).

Usage: ``.venv/bin/python benchmarks/cli_startup.py [REPEATS] [--compare DIR]``.
Prints the median and max wall time, and the median CPU time (user + system,
which a loaded machine inflates far less than the wall time), in ms, of
``python -c pass`` (for reference), ``milarun --help``, ``milarun --version``
and ``milarun COMMAND --help`` for every command, over REPEATS runs (default 10).

``--compare DIR``: also time the milarun package found in DIR (a folder holding
a ``milarun/`` package, e.g. ``git archive BASE milarun | tar -x -C DIR``, put
first on ``PYTHONPATH``), interleaved run by run with the one this Python has
installed, so that every column sees the same load on a noisy machine. It may
be given several times (a column each, e.g. a base and a work tree).

Time byte-compiled trees (``python -m compileall -q DIR/milarun``), as an
install is: where ``PYTHONDONTWRITEBYTECODE`` is set and a tree has no
``__pycache__``, every run compiles the modules it imports (about 30 ms more on
the 2-core development VM), and the script says so when the modules of ``milarun/cli``
have no ``.pyc``.
"""

import os
import resource
import statistics
import subprocess
import sys
import time

from milarun.cli import COMMANDS


def _cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def once(argv, env):
    """(wall time, CPU time) of one run of ``argv``, in seconds."""
    t0, c0 = time.perf_counter(), _cpu()
    subprocess.run(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=env, cwd="/"
    )  # not a tree's folder: ``-m`` puts the cwd first
    return time.perf_counter() - t0, _cpu() - c0


def main():
    args = sys.argv[1:]
    compare = []
    while "--compare" in args:
        i = args.index("--compare")
        compare.append(os.path.abspath(args[i + 1]))
        del args[i : i + 2]
    repeats = int(args[0]) if args else 10
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    trees = [
        (tree if len(tree) <= 31 else "…" + tree[-30:], dict(env, PYTHONPATH=tree))
        for tree in compare
    ] + [("installed", env)]
    for _, tree_env in trees:
        package = subprocess.run(
            [sys.executable, "-c", "import milarun; print(milarun.__file__)"],
            env=tree_env,
            cwd="/",
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        cli = os.path.join(os.path.dirname(package), "cli")
        cache = os.path.join(cli, "__pycache__")
        compiled = {f.split(".")[0] for f in os.listdir(cache)} if os.path.isdir(cache) else set()
        modules = {f[:-3] for f in os.listdir(cli) if f.endswith(".py")}
        if sys.flags.dont_write_bytecode and not modules <= compiled:
            print(
                f"note: {os.path.dirname(package)} is not byte-compiled and "
                "PYTHONDONTWRITEBYTECODE is set: its runs include compiling "
                f"(python -m compileall -q {os.path.dirname(package)})"
            )
    milarun = [sys.executable, "-m", "milarun"]
    cases = [
        ("python -c pass", [sys.executable, "-c", "pass"]),
        ("milarun --help", milarun + ["--help"]),
        ("milarun --version", milarun + ["--version"]),
    ] + [(f"milarun {c} --help", milarun + [c, "--help"]) for c in COMMANDS]
    header = "".join(f"   {name:>31s}" for name, _ in trees)
    print(f"{'':24s}{header}\n{'':24s}" + "   median ms   max ms   cpu ms" * len(trees))
    for label, argv in cases:
        times = {name: [] for name, _ in trees}
        for _ in range(repeats):
            for name, tree_env in trees:  # interleaved: both see the same load
                times[name].append(once(argv, tree_env))
        cols = "".join(
            f"   {statistics.median(w for w, _ in t) * 1000:9.0f} "
            f"{max(w for w, _ in t) * 1000:8.0f} "
            f"{statistics.median(c for _, c in t) * 1000:8.0f}"
            for t in times.values()
        )
        print(f"{label:24s}{cols}", flush=True)


if __name__ == "__main__":
    main()
