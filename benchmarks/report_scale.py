"""Time ``summary`` + ``report`` (text and HTML) on 10,000 generated result files.

    python benchmarks/report_scale.py [--tests 50] [--devices 8] [--runs 25] [--samples 60]
                                      [--dir DIR]

Generates ``tests × devices × runs`` per-gpu result files (about 60 samples
each) in a temporary directory, then, in this one process, times ``milarun report``
(:func:`milarun.report.make_report`: reading and summarizing the directory, the
table with a weights file, ``--compare-gpus`` and ``--price``, the text, and the HTML
page with one SVG plot per test plus the heat-map) three times: with ``--no-cache``,
with an empty cache (which it fills) and with the filled cache
(:mod:`milarun.report.inputs`), and says whether the three gave the same text and
HTML. Prints the figures in seconds, wall and CPU (the report runs in this one
process; generation is not counted). ``--dir DIR`` generates the files into ``DIR``
once and reuses them afterwards (for before/after runs), instead of a temporary
directory. For a fair before/after comparison on a loaded machine, pin both to one
core (``taskset -c 0``) and alternate their runs.
"""

import argparse
import io
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def generate(directory, tests, devices, runs, nsamples, seed=0, per_node=None):
    """Write ``tests × devices × runs`` records into ``directory``; returns their number.
    ``per_node``: devices a node (``devices`` are then spread over nodes ``node0``… of
    ``per_node`` GPUs each, as a multi-node session names them); None: one host."""
    # records of the current version: the benchmark times a reading, not a migration
    # (imported here: sys.path names this tree only once the module is loaded)
    from milarun.formats.record import FORMAT_VERSION

    rng = random.Random(seed)
    width = per_node or devices
    hosts = [
        {
            "hostname": f"node{k}" if per_node else "bench",
            "cpu_model": "Bench CPU",
            "cpu_count": 64,
            "gpus": [{"index": i, "name": "GPU", "driver": "1"} for i in range(width)],
            "torch": "2.13.0",
            "cuda": "13.0",
            "memory_limit_mib": 1024.0,
        }
        for k in range(-(-devices // width))
    ]
    count = 0
    for t in range(tests):
        base = 50.0 + 10 * t
        for run in range(runs):
            for slot in range(devices):
                node, dev = divmod(slot, width)
                rate = base * (1 + 0.02 * rng.random())
                samples = []
                for i in range(nsamples):
                    r = rate * (0.3 if i < 4 else 1.0)
                    samples.append(
                        {
                            "start": 0.5 * i,
                            "end": 0.5 * i + 0.5,
                            "count": r * 0.5,
                            "rate": r,
                            "warmup": i < 4,
                        }
                    )
                ok = rng.random() > 0.002
                rec = {
                    "version": FORMAT_VERSION,
                    "name": f"bench.t{t:02d}",
                    "suite": "bench",
                    "job_name": f"t{t:02d}",
                    "job_id": f"{run}.{dev}",
                    "run": run,
                    "device": str(dev),
                    "devices": [dev],
                    "device_count": 1,
                    "partition": "per-gpu",
                    "call": {"function": "x:y", "argv": []},
                    "host": hosts[node],
                    "timings": {
                        "program": {"start": 1.8e9, "end": 1.8e9 + 31, "duration": 31.0},
                        "train": {"samples": samples if ok else []},
                    },
                    "peak_memory_mib": 1000.0,
                    "success": ok,
                    "error": None
                    if ok
                    else {"reason": "error", "message": "boom", "stderr_tail": "Traceback\nboom\n"},
                }
                where = f"{dev}"
                if per_node:
                    rec["node"] = hosts[node]["hostname"]
                    where = f"{rec['node']}.{dev}"
                name = f"bench.t{t:02d}.J{run}.{where}{'' if ok else '.FAIL'}.x.json"
                (directory / name).write_text(json.dumps(rec))
                count += 1
    return count


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=50)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument(
        "--dir", type=Path, default=None, help="generate into DIR once and reuse it (not deleted)"
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        work = tmp / "work"
        work.mkdir()
        results = tmp / "results"
        if args.dir is not None:
            results = args.dir
            results.mkdir(parents=True, exist_ok=True)
        else:
            results.mkdir()
        t0 = time.perf_counter()
        if args.dir is not None and any(results.glob("*.json")):
            print(f"reusing the result files in {results}")
        else:
            n = generate(results, args.tests, args.devices, args.runs, args.samples)
            print(f"generated {n} result files in {time.perf_counter() - t0:.2f} s (not counted)")
        weights = work / "weights.json"
        weights.write_text(
            json.dumps({f"bench.t{i:02d}": {"weight": 1} for i in range(args.tests)})
        )
        # a cache of this run's own: the user's is neither read nor written
        os.environ["MILARUN_CACHE_DIR"] = str(work / "cache")

        from milarun.report import make_report

        runs = {}  # name: (wall s, CPU s, text, html)
        for name, cache in (
            ("no cache (--no-cache)", False),
            ("cache empty (cold)", True),
            ("cache filled (warm)", True),
        ):
            html = work / f"report-{len(runs)}.html"
            wall, cpu = time.perf_counter(), _cpu()
            report, text = make_report(
                results,
                weights=str(weights),
                compare_gpus=True,
                price=30000,
                html=str(html),
                warn=io.StringIO(),
                cache=cache,
            )
            wall, cpu = time.perf_counter() - wall, _cpu() - cpu
            page = html.read_text()
            runs[name] = (wall, cpu, text, page)
        first = next(iter(runs.values()))
        print(
            text.splitlines()[0],
            f"| {len(report.rows)} tests | score {report.score:.2f} "
            f"| HTML {len(first[3]) / 1e6:.1f} MB, {first[3].count('<svg')} SVG plots",
        )
        print(f"{'summary + text + HTML':34s} {'wall':>6s}   {'CPU':>6s}   same output")
        for name, (wall, cpu, text, page) in runs.items():
            same = text == first[2] and _no_stamp(page) == _no_stamp(first[3])
            print(f"{name:34s} {wall:6.2f} s {cpu:6.2f} s   {'yes' if same else 'NO'}")
        print(
            f"on {len(os.sched_getaffinity(0))} usable CPU(s); "
            f"load average {os.getloadavg()[0]:.1f}"
        )
    return 0


def _cpu():
    """CPU seconds of this process."""
    t = os.times()
    return t.user + t.system


def _no_stamp(page):
    """The page without its generation time (the one line that differs run to run)."""
    import re

    return re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", "", page)


if __name__ == "__main__":
    sys.exit(main())
