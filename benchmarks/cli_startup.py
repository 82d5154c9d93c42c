"""Time ``milarun --help`` (target: under 1 s, because the parent never imports torch).

Usage: ``.venv/bin/python benchmarks/cli_startup.py [REPEATS]``. Prints the
median and max wall time of ``milarun --help`` and ``milarun jobs --help``
over REPEATS runs (default 10), plus ``python -c pass`` for reference.
"""

import statistics
import subprocess
import sys
import time


def timed(argv, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), max(times)


def main():
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    for label, argv in [("python -c pass", [sys.executable, "-c", "pass"]),
                        ("milarun --help", [sys.executable, "-m", "milarun", "--help"]),
                        ("milarun jobs --help", [sys.executable, "-m", "milarun", "jobs", "--help"])]:
        med, worst = timed(argv, repeats)
        print(f"{label:22s} median {med * 1000:6.0f} ms   max {worst * 1000:6.0f} ms")


if __name__ == "__main__":
    main()
