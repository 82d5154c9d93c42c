"""Time ``summary`` + ``report`` (text and HTML) on 10,000 generated result files.

    python benchmarks/report_scale.py [--tests 50] [--devices 8] [--runs 25] [--samples 60]
                                      [--dir DIR]

Generates ``tests × devices × runs`` per-gpu result files (about 60 samples
each) in a temporary directory, then, in this one process, times: reading and
summarizing the directory, building the report with a weights file and
``--compare-gpus``, rendering text, and rendering HTML (one SVG plot per test
plus the heat-map). Prints the figures in seconds. Target (issue 21): 3 s at most in total
on a 2-core machine (generation is not counted). ``--dir DIR`` generates the
files into ``DIR`` once and reuses them afterwards (for before/after runs),
instead of a temporary directory.
"""

import argparse
import io
import os
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def generate(directory, tests, devices, runs, nsamples, seed=0):
    rng = random.Random(seed)
    host = {"hostname": "bench", "cpu_model": "Bench CPU", "cpu_count": 64,
            "gpus": [{"index": i, "name": "GPU", "driver": "1"} for i in range(devices)],
            "torch": "2.13.0", "cuda": "13.0", "memory_limit_mib": 1024.0}
    count = 0
    for t in range(tests):
        base = 50.0 + 10 * t
        for run in range(runs):
            for dev in range(devices):
                rate = base * (1 + 0.02 * rng.random())
                samples = []
                for i in range(nsamples):
                    r = rate * (0.3 if i < 4 else 1.0)
                    samples.append({"start": 0.5 * i, "end": 0.5 * i + 0.5,
                                    "count": r * 0.5, "rate": r, "warmup": i < 4})
                ok = rng.random() > 0.002
                rec = {"version": 1, "name": f"bench.t{t:02d}", "suite": "bench",
                       "job_name": f"t{t:02d}", "job_id": f"{run}.{dev}", "run": run,
                       "device": str(dev), "devices": [dev], "device_count": 1,
                       "partition": "per-gpu", "call": {"function": "x:y", "argv": []},
                       "host": host,
                       "timings": {"program": {"start": 1.8e9, "end": 1.8e9 + 31,
                                               "duration": 31.0},
                                   "train": {"samples": samples if ok else []}},
                       "peak_memory_mib": 1000.0, "success": ok,
                       "error": None if ok else {"reason": "error", "message": "boom",
                                                 "stderr_tail": "Traceback\nboom\n"}}
                name = f"bench.t{t:02d}.J{run}.{dev}{'' if ok else '.FAIL'}.x.json"
                (directory / name).write_text(json.dumps(rec))
                count += 1
    return count


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=50)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--dir", type=Path, default=None,
                        help="generate into DIR once and reuse it (not deleted)")
    args = parser.parse_args(argv)

    from milarun.report import build_report, check_weights, render_html, render_text
    from milarun.analysis.summary import summarize_dir
    from milarun.measure.stats import steady_states_once

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.dir is not None:
            tmp = args.dir
            tmp.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        if args.dir is not None and any(tmp.glob("*.json")):
            print(f"reusing the result files in {tmp}")
        else:
            n = generate(tmp, args.tests, args.devices, args.runs, args.samples)
            print(f"generated {n} result files in {time.perf_counter() - t0:.2f} s "
                  "(not counted)")

        times = {}   # phase: (wall s, CPU s of this process)
        clock = (time.perf_counter(), time.process_time())

        def lap(name):
            nonlocal clock
            now = (time.perf_counter(), time.process_time())
            times[name] = (now[0] - clock[0], now[1] - clock[1])
            clock = now

        # as in milarun report (make_report): the HTML reuses the summary's steady
        # states and anomaly flags
        with steady_states_once():
            summary, records = summarize_dir(tmp, warn=sys.stderr)
            lap("summary (read + group + stats)")
            weights = check_weights({f"bench.t{i:02d}": {"weight": 1}
                                     for i in range(args.tests)})
            report = build_report(summary, weights=weights, compare_gpus=True, price=30000)
            text = render_text(report)
            lap("report: table + text")
            html = render_html(report, records=records, results_dir=tmp)
            lap("report: HTML with plots")
        out = io.StringIO(text)
        print(out.readline().strip(), f"| {len(report.rows)} tests | score {report.score:.2f}")
        print(f"{'':34s} {'wall':>6s}   {'CPU':>6s}")
        for k, (wall, cpu) in times.items():
            print(f"{k:34s} {wall:6.2f} s {cpu:6.2f} s")
        total = [sum(t[i] for t in times.values()) for i in (0, 1)]
        print(f"{'total':34s} {total[0]:6.2f} s {total[1]:6.2f} s   (HTML "
              f"{len(html) / 1e6:.1f} MB, {html.count('<svg')} SVG plots; target <= 3 s)")
        print(f"CPU: this process's time (wall minus waiting on a busy machine; load "
              f"average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
