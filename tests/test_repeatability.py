"""benchmarks/repeatability.py on a tiny profile (the crawl fault workload: no torch, ~1 s
per run)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from milarun.measure import stats

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "repeatability.py"


def script():
    """The script as a module (its --analyze path runs in this process)."""
    spec = importlib.util.spec_from_file_location("repeatability", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CRAWL = {
    "experiment": "milarun.models.faults:crawl",
    "partition_scheme": {"type": "per-gpu"},
    "arguments": {"max-count": 30, "sample-duration": 0.05, "step-seconds": 0.005, "warmup": 1},
}


def test_repeatability_runs_k_times_and_gives_the_cv(tmp_path, capsys):
    profile = tmp_path / "tiny.json"
    profile.write_text(json.dumps({"crawl": CRAWL}))
    (tmp_path / "data").mkdir()
    study_file = tmp_path / "study.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            str(profile),
            "-k",
            "2",
            "-d",
            str(tmp_path / "data"),
            "-o",
            str(tmp_path / "runs"),
            "--json",
            str(study_file),
            "--",
            "--no-cgexec",
            "--cpu-slots",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    study = json.loads(study_file.read_text())
    # K runs, each in its own results directory
    assert study["runs"] == [str(tmp_path / "runs" / f"run-{i}") for i in range(2)]
    assert all(list(Path(d).glob("tiny.crawl.*.json")) for d in study["runs"])
    assert list(study["tests"]) == ["tiny.crawl"]
    for t in [study["tests"]["tiny.crawl"], study["score"], study["node_score"]]:
        assert len(t["values"]) == 2 and all(v > 0 for v in t["values"])
        d = stats.describe(t["values"])
        assert t["cv"] == pytest.approx(d["std"] / d["mean"])
    # each run's score is the report's: one test of weight 1, perf * (1 - std%); the node
    # score sums the 2 CPU slots
    crawl = study["tests"]["tiny.crawl"]["values"]
    for i in range(2):
        assert study["score"]["values"][i] <= crawl[i]
        assert study["node_score"]["values"][i] == pytest.approx(2 * study["score"]["values"][i])
        assert 0 <= study["score_ci_half"][i]
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["test", "runs", "mean", "min", "max", "cv", "within"]
    # within: a result's own standard error from its windows (crawl's steps are regular)
    assert 0 < study["tests"]["tiny.crawl"]["within"] < 0.5
    assert any(line.startswith("score ") and line.split()[-2].endswith("%") for line in lines)
    assert lines[-1].startswith("one run's own 95% CI half-width of the score") and lines[
        -1
    ].endswith("%")
    # --analyze reads the same folders again and gives the same study
    assert script().main(["--analyze", *study["runs"]]) == 0
    assert capsys.readouterr().out.splitlines()[:4] == lines[:4]


def test_repeatability_bad_weights_is_one_line(tmp_path, capsys):
    bad = tmp_path / "w.json"
    bad.write_text('{"a.b": {"weight": -1}}')
    (tmp_path / "r").mkdir()
    assert script().main(["--analyze", str(tmp_path / "r"), "--weights", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("repeatability: error: ")


def test_repeatability_checks_the_weights_before_running_the_profile(tmp_path, capsys):
    module = script()
    ran = []
    module.run_profile = lambda *a, **k: ran.append(a) or []
    bad = tmp_path / "w.json"
    bad.write_text('{"a.b": {"weight": -1}}')
    profile = tmp_path / "tiny.json"
    profile.write_text(json.dumps({"crawl": CRAWL}))
    assert (
        module.main([str(profile), "-k", "2", "--weights", str(bad), "-o", str(tmp_path / "runs")])
        == 2
    )
    assert ran == []  # hours of runs are not spent before a typo in --weights shows
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("repeatability: error: ")


def _windows(rates, start=1.0, length=0.5, warmup=2):
    out, t = [], start
    for i, r in enumerate(rates):
        out.append(
            {"start": t, "end": t + length, "count": r * length, "rate": r, "warmup": i < warmup}
        )
        t += length
    return out


def test_steady_rules_change_only_what_they_name():
    mod = script()
    # 2 warm-up windows, a slow ramp of 2 windows, then a steady 100 items/s with one dip;
    # the run is short (< 11 s), so the 2020 rule takes every steady window before the last 1 s
    samples = _windows([10, 10, 50, 60] + [100] * 8 + [40] + [100] * 3)
    chosen_2020 = stats.steady_state(samples)[1]
    rates = sorted(s["rate"] for s in chosen_2020)
    with mod.steady_rule("2020 mean"):
        assert stats.steady_state(samples)[0] == pytest.approx(sum(rates) / len(rates))
    with mod.steady_rule("median of windows"):
        assert stats.steady_state(samples)[0] == pytest.approx(100)
    with mod.steady_rule("20%-trimmed mean"):
        n = int(len(rates) * 0.1)
        core = rates[n : len(rates) - n]
        assert stats.steady_state(samples)[0] == pytest.approx(sum(core) / len(core))
    with mod.steady_rule("adaptive warm-up"):
        rate, chosen, _ = stats.steady_state(samples)
        assert min(s["rate"] for s in chosen) == 40  # the ramp is gone, the dip stays
        assert [s["rate"] for s in chosen][0] == 100
    with mod.steady_rule("warm-up + 1 s"):  # two 0.5 s windows more: the ramp
        assert [s["rate"] for s in stats.steady_state(samples)[1]][0] == 100
    # the module's rule is back after each block
    assert stats.steady_state(samples)[1] == chosen_2020


def test_within_noise_is_a_results_standard_error():
    mod = script()
    samples = _windows([10, 10] + [90, 110] * 6, warmup=2)
    record = {
        "name": "s.t",
        "success": True,
        "partition": "per-gpu",
        "timings": {"train": {"samples": samples}},
    }
    chosen = [s["rate"] for s in stats.steady_state(samples)[1]]
    d = stats.describe(chosen)
    expected = d["std"] / d["mean"] / len(chosen) ** 0.5
    assert mod.within_noise([record, {**record, "success": False}]) == {
        "s.t": pytest.approx(expected)
    }
