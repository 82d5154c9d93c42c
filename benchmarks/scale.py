"""Measure the launcher and the reader at scale on one host (issue 37 §5).

    python benchmarks/scale.py launch --procs 1 8 64 512 1024 [--keep DIR] [--timeout S]
    python benchmarks/scale.py read --records 1000 10000 100000 [--keep DIR]
    python benchmarks/scale.py read --sealed DIR

``launch``: for each N, a real ``milarun jobs`` (the launcher's own entry point, in a
subprocess) runs one ``per-gpu`` test on N devices: one wave of N processes through the
real start barrier, journal, record writer, manifest and session. What is faked, and
nothing else:

* the device list, at the lowest level the launcher reads it: ``milarun.host.devices.
  find_gpus`` (the backend discovery) answers N CPU slots, so no ``--cpu-slots`` (which is
  bounded by the host's cores) is given;
* the children: the launcher's Python (``sys.executable``, which the plan puts at the head
  of every child's command line) is a shim that, for ``python -m milarun run …``, runs
  :func:`child` instead of the workload: it opens the real journal, waits at the real
  start barrier (:func:`milarun.formats.barrier.wait`), and writes a record of 20 samples
  with the real writer (:func:`milarun.formats.store.write_result`). Every other command
  (the node identity, the probes) goes to the real Python. A real workload imports torch
  (570 MiB and 3 CPU-s a process); this one costs 27 MiB at peak and 0.15 CPU-s.

One node only: 128 nodes over ssh or Slurm on one host would fake the fan-out (one ssh
connection per node), not the wave; see docs/multinode.md. Measured per N: the wall time
of ``milarun jobs``, the launcher's peak RSS (``ru_maxrss``), its peak open descriptors
and threads and the children's summed RSS (sampled every second from /proc; shared pages
counted in each child), the wave's span (first child's start to last record) and the files
in the results folder. An N whose children (``CHILD_BYTES`` each) would leave less than
``MIN_AVAILABLE`` of the host's memory is skipped, and a guard stops the launcher (its
children die with it) when the available memory falls under ``MIN_AVAILABLE``.

``read --records R…``: generates R records with :func:`benchmarks.report_scale.generate`
(tests × nodes of 8 devices × runs, 30 samples each, the current record version; they
have no manifest) and times ``milarun summary`` and ``milarun report`` (text, no cache).
``read --sealed DIR``: on a copy of each results folder ``launch --keep DIR`` kept, the
same, then ``milarun seal``, ``milarun verify`` and ``milarun tender`` against the
example rules less their convergence and serving clauses. Each command runs in a process
of its own: wall seconds and peak RSS (MiB). The machine is shared: figures are noisy;
compare ratios within one run.
"""

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: The memory guard: the launcher's group is stopped under this much available RAM (bytes).
MIN_AVAILABLE = 4 * 2**30
#: What a fake child costs the host at most (bytes; measured 27 MiB a child at 512 once they
#: write their records at once): a wave that would leave less than MIN_AVAILABLE is not started.
CHILD_BYTES = 28 * 2**20
#: The rules that ``verify`` and ``tender`` judge against: these, less their convergence and
#: serving clauses (which name a reference run and tests this suite has not).
RULES = ROOT / "docs" / "examples" / "tender-rules.json"


# --- the fake child ---------------------------------------------------------------------


def child(argv):
    """What a launched process does here: ``argv`` is ``milarun run``'s (function, options,
    ``--``, the test's). Exit status 0 once its record is written; 1 when the barrier failed
    (a FAIL record is then the launcher's)."""
    from milarun.formats import barrier
    from milarun.formats.child import decode_extra
    from milarun.formats.journal import Journal
    from milarun.formats.record import FORMAT_VERSION
    from milarun.formats.store import journal_path, write_result

    opts = {}
    it = iter(argv[1:])
    for arg in it:
        if arg == "--":
            break
        if arg.startswith("-"):
            opts[arg.lstrip("-")] = next(it)
    out = Path(opts["o"])
    extra = decode_extra(opts.get("extra")) or {}
    start = time.time()
    journal = Journal(journal_path(out))
    journal.write("start", pid=os.getpid(), start=start)
    where = barrier.from_environment()
    met = None
    if where is not None:
        try:
            met = barrier.wait(
                where["address"],
                where["wave"],
                where["label"],
                where["timeout"],
                secret=where["secret"],
            )
        except barrier.BarrierTimeout as exc:
            print(f"scale child: {exc}", file=sys.stderr)
            return 1
    t0 = time.time() - start  # sample times are seconds since the program's start
    samples = [
        {"start": t0 + 0.01 * i, "end": t0 + 0.01 * (i + 1), "count": 10.0, "rate": 1000.0}
        | {"warmup": i < 4}
        for i in range(20)
    ]
    timings = {"program": {"start": start}, "train": {"samples": samples}}
    if met is not None:
        timings["barrier"] = dict(met, released_at=max(0.0, met["released"] - start))
    for s in samples:
        journal.write("sample", **s)
    record = {
        "version": FORMAT_VERSION,
        "name": opts["experiment-name"],
        "suite": opts["experiment-name"].split(".")[0],
        "job_name": opts["experiment-name"].split(".", 1)[-1],
        "job_id": opts["job-id"],
        "run": extra.get("run", 0),
        "device": extra.get("device", "0"),
        "devices": extra.get("devices", [0]),
        "device_count": 1,
        "partition": extra.get("partition", "per-gpu"),
        "call": {"function": argv[0], "argv": []},
        "host": {"hostname": os.uname().nodename, "cpu_count": os.cpu_count()},
        "timings": timings,
        "peak_memory_mib": 0.0,
        "success": True,
        "error": None,
    }
    end = time.time()
    timings["program"].update(end=end, duration=end - start)
    write_result(record, out)
    journal.close()
    return 0


def shim_main():
    """The launcher's ``sys.executable``: ``-m milarun run …`` is :func:`child`, anything
    else the real Python ($SCALE_REAL_PYTHON)."""
    args = sys.argv[1:]
    if args[:3] == ["-m", "milarun", "run"]:
        sys.exit(child(args[3:]))
    real = os.environ["SCALE_REAL_PYTHON"]
    os.execv(real, [real] + args)


# --- the launcher, in its own process ---------------------------------------------------


def _fds(pid="self"):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _threads():
    return threading.active_count()


def _available():
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def _children_rss(pid):
    """Summed RSS (bytes) of the descendants of ``pid`` and their count."""
    import psutil

    total = n = 0
    try:
        for p in psutil.Process(pid).children(recursive=True):
            try:
                total += p.memory_info().rss
                n += 1
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return total, n


def launcher_main(n, stats_path, argv):
    """Run ``milarun jobs argv`` in this process with ``n`` faked devices; write the
    launcher's figures to ``stats_path`` (JSON)."""
    shim = Path(os.environ["SCALE_SHIM"])
    os.environ["SCALE_REAL_PYTHON"] = sys.executable
    sys.executable = str(shim)  # the head of every child's command line

    import milarun.host.devices as devices
    from milarun.cli import main as milarun_main

    def fake_gpus(backends=None, options=None):
        share = 256.0  # MiB per slot: what placeholders would be filled from
        return devices.Devices("cpu", list(range(n)), memory_mib=[share] * n), {}

    devices.find_gpus = fake_gpus  # discover() calls it by its module's name
    peak = {"fds": 0, "threads": 0, "children_rss": 0, "children": 0, "guard": False}
    done = threading.Event()

    def sample():
        me = os.getpid()
        while True:  # a first sample at once: a wave of one may end within a second
            peak["fds"] = max(peak["fds"], _fds())
            peak["threads"] = max(peak["threads"], _threads())
            rss, k = _children_rss(me)
            if rss > peak["children_rss"]:
                peak["children_rss"], peak["children"] = rss, k
            if done.wait(1.0):
                return

    def guard():
        # apart from the sampler, which is slow with 1,000 children: reads one file
        while not done.wait(0.05):
            if _available() < MIN_AVAILABLE:
                peak["guard"] = True
                Path(stats_path).write_text(json.dumps(peak))
                os.killpg(os.getpgid(0), signal.SIGKILL)  # the children die with it (pdeathsig)

    threading.Thread(target=sample, daemon=True).start()
    threading.Thread(target=guard, daemon=True).start()
    try:
        rc = milarun_main(["jobs"] + argv)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    done.set()
    peak["rc"] = rc
    peak["maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(stats_path).write_text(json.dumps(peak))
    return rc


def _profile(path):
    path.write_text(
        json.dumps(
            {
                "*": {"partition_scheme": {"type": "per-gpu"}, "timeout": 900},
                "tiny": {
                    "experiment": "milarun.models.faults:crawl",
                    "description": "a trivial per-gpu test (the benchmark's fake child)",
                },
            }
        )
    )


def _wave_span(results):
    """Seconds between the first child's start and the last one's record, over the wave's
    records (their program start and end)."""
    from milarun.formats.store import iter_results

    starts, ends = [], []
    for _, rec in iter_results(results):
        if isinstance(rec, dict):
            starts.append(rec["timings"]["program"]["start"])
            ends.append(rec["timings"]["program"]["end"])
    return (max(ends) - min(starts)) if starts else None, len(starts)


def launch(ns, keep=None, timeout=540):
    """One wave of each N of ``ns`` through the real launcher (see the module's docstring);
    prints and returns one dict of figures per N. ``keep``: the folder to keep the results
    in (else a temporary one, removed); ``timeout``: seconds per N, then its process group
    is killed."""
    rows = []
    for n in ns:
        if _available() - n * CHILD_BYTES < MIN_AVAILABLE:
            print(json.dumps({"procs": n, "skipped": "not enough available memory"}), flush=True)
            continue
        base = Path(keep or tempfile.mkdtemp(prefix="milarun-scale-")) / f"launch-{n}"
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        shim = base / "python"
        shim.write_text(
            f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
            f"sys.path.insert(0, {str(ROOT)!r})\nimport scale\nscale.shim_main()\n"
        )
        shim.chmod(0o755)
        profile = base / "profile.json"
        _profile(profile)
        results = base / "results"
        (base / "data").mkdir()
        stats = base / "stats.json"
        env = dict(os.environ, SCALE_SHIM=str(shim), MILARUN_CACHE_DIR=str(base / "cache"))
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "_launcher",
            str(n),
            str(stats),
            "--",
            str(profile),
            "-d",
            str(base / "data"),
            "-o",
            str(results),
            "--no-cgexec",
        ]
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        wall = time.perf_counter() - t0
        tail = out.decode(errors="replace").splitlines()[-6:]
        figures = json.loads(stats.read_text()) if stats.exists() else {}
        spread, records = _wave_span(results) if results.exists() else (None, 0)
        files = sum(len(f) for _, _, f in os.walk(results)) if results.exists() else 0
        row = {
            "procs": n,
            "rc": proc.returncode,
            "wall_s": round(wall, 2),
            "launcher_rss_mib": round(figures.get("maxrss_mib", 0), 1),
            "launcher_fds": figures.get("fds"),
            "launcher_threads": figures.get("threads"),
            "children_rss_mib": round(figures.get("children_rss", 0) / 2**20),
            "children_seen": figures.get("children"),
            "records": records,
            "files": files,
            "wave_s": None if spread is None else round(spread, 2),
            "guard": figures.get("guard"),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        if proc.returncode != 0 or records < n:
            print("\n".join(tail), flush=True)
        if keep is None:
            shutil.rmtree(base.parent, ignore_errors=True)
    return rows


# --- the reader -------------------------------------------------------------------------


def _measured(cmd, env):
    """``{"wall": s, "rss": peak RSS MiB, "rc", "tail"}`` of ``cmd``, run under a helper
    process of its own (its ``RUSAGE_CHILDREN`` is then this command's only)."""
    helper = (
        "import resource, subprocess, sys, time, json\n"
        "t = time.perf_counter()\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "w = time.perf_counter() - t\n"
        "r = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
        "print(json.dumps({'wall': w, 'rss': r, 'rc': p.returncode,"
        " 'tail': (p.stdout + p.stderr).splitlines()[-3:]}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", helper] + cmd, env=env, capture_output=True, text=True
    )
    return json.loads(out.stdout.splitlines()[-1])


def _shape(total):
    """(tests, devices, runs) of ``total`` generated records: 8 devices a node, up to 125
    nodes (1,000 devices), then tests, then runs."""
    devices = min(total, 1000)
    tests = max(1, min(50, total // devices))
    runs = max(1, total // (devices * tests))
    return tests, devices, runs


def _steps(results, base, sealed):
    milarun = [sys.executable, "-m", "milarun"]
    steps = [
        ("summary", milarun + ["summary", str(results), "-o", str(base / "summary.json")]),
        ("report", milarun + ["report", str(results), "--no-cache"]),
    ]
    if sealed:
        rules = json.loads(RULES.read_text())
        for clause in ("convergence", "serving"):
            rules.pop(clause, None)
        (base / "rules.json").write_text(json.dumps(rules))
        steps += [
            ("seal", milarun + ["seal", str(results)]),
            ("verify", milarun + ["verify", str(results), "--rules", str(base / "rules.json")]),
            (
                "tender",
                milarun + ["tender", f"vendor={results}", "--rules", str(base / "rules.json")],
            ),
        ]
    return steps


def _time_folder(row, results, base):
    """Time each step on ``results`` into ``row``: (wall s, peak RSS MiB, exit status)."""
    env = dict(os.environ, MILARUN_CACHE_DIR=str(base / "cache"), PYTHONPATH=str(ROOT))
    sealed = (results / ".milarun").exists() or any(results.glob("manifest*"))
    for name, cmd in _steps(results, base, sealed):
        m = _measured(cmd, env)
        row[name] = (round(m["wall"], 2), round(m["rss"]), m["rc"])
        if m["rc"] not in (0, 1, 3):  # 1, 3: verify's and tender's verdicts
            print(name, m["tail"], flush=True)
    print(json.dumps(row), flush=True)
    return row


def read(counts, keep=None, samples=30):
    """Generated records (``counts`` of them): summary and report."""
    from report_scale import generate

    rows = []
    for total in counts:
        base = Path(keep or tempfile.mkdtemp(prefix="milarun-scale-")) / f"read-{total}"
        shutil.rmtree(base, ignore_errors=True)
        results = base / "results"
        results.mkdir(parents=True)
        tests, devs, runs = _shape(total)
        t0 = time.perf_counter()
        n = generate(results, tests, devs, runs, samples, per_node=8)
        row = {"records": n, "shape": f"{tests} tests x {devs} devices x {runs} runs"}
        row["generate_s"] = round(time.perf_counter() - t0, 1)
        rows.append(_time_folder(row, results, base))
        if keep is None:
            shutil.rmtree(base.parent, ignore_errors=True)
    return rows


def chained(counts, keep=None, samples=30):
    """Seal, verify and tender on ``counts`` records: a real session of one launch, then
    generated records entered into its manifest by the real writer
    (:class:`milarun.formats.manifest.Manifest`, as the launcher enters each record it
    writes). Only the launches are skipped: 100,000 of them would take hours here."""
    from report_scale import generate

    from milarun.formats.manifest import Manifest, read_manifest

    rows = []
    for total in counts:
        base = Path(keep or tempfile.mkdtemp(prefix="milarun-scale-")) / f"chained-{total}"
        shutil.rmtree(base, ignore_errors=True)
        launch([1], keep=base)
        results = base / "launch-1" / "results"
        entries = read_manifest(results / ".milarun" / "manifest.jsonl")
        before = {p.name for p in results.glob("*.json")}
        tests, devs, runs = _shape(max(1, total - 1))
        t0 = time.perf_counter()
        generate(results, tests, devs, runs, samples, per_node=8)
        writer = Manifest(results, entries[-1]["session"])
        added = sorted(p for p in results.glob("*.json") if p.name not in before)
        for path in added:
            writer.add("record", path)
        row = {
            "records": len(added) + len(before),
            "shape": f"1 launched + {tests} tests x {devs} devices x {runs} runs",
            "generate_and_chain_s": round(time.perf_counter() - t0, 1),
        }
        rows.append(_time_folder(row, results, base))
        if keep is None:
            shutil.rmtree(base.parent, ignore_errors=True)
    return rows


def sealed(folder):
    """The results folders of ``launch --keep folder``: summary, report, seal, verify and
    tender on each (a copy: sealing writes into it)."""
    rows = []
    for launched in sorted(
        Path(folder).glob("launch-*/results"), key=lambda p: int(p.parent.name[7:])
    ):
        base = launched.parent / "read"
        shutil.rmtree(base, ignore_errors=True)
        results = base / "results"
        shutil.copytree(launched, results, symlinks=True)
        row = {"records": sum(1 for _ in results.glob("*.json")), "from": str(launched)}
        rows.append(_time_folder(row, results, base))
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_launcher":
        sep = argv.index("--")
        return launcher_main(int(argv[1]), argv[2], argv[sep + 1 :])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("launch", help="one wave of N processes through the real launcher")
    p.add_argument("--procs", type=int, nargs="+", default=[1, 8, 64, 1024])
    p.add_argument("--keep", type=Path, help="keep the results under this folder")
    p.add_argument("--timeout", type=float, default=540, help="seconds per N at most")
    r = sub.add_parser("read", help="summary and report on R records (or seal, verify, tender)")
    r.add_argument("--records", type=int, nargs="+", default=[1000, 10000, 100000])
    r.add_argument("--keep", type=Path, help="keep the records under this folder")
    r.add_argument(
        "--sealed",
        type=Path,
        help="instead: the --keep folder of `launch`; time seal, verify, tender too",
    )
    r.add_argument(
        "--chained",
        action="store_true",
        help="the --records in a real session's manifest: time seal, verify, tender too",
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    if args.what == "launch":
        launch(args.procs, args.keep, args.timeout)
    elif args.sealed is not None:
        sealed(args.sealed)
    elif args.chained:
        chained(args.records, args.keep)
    else:
        read(args.records, args.keep)


if __name__ == "__main__":
    sys.exit(main())
