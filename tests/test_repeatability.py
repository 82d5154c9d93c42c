"""benchmarks/repeatability.py on a tiny profile (the crawl fault workload: no torch, ~1 s
per run)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from milarun import stats

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "repeatability.py"


def script():
    """The script as a module (its --analyze path runs in this process)."""
    spec = importlib.util.spec_from_file_location("repeatability", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

CRAWL = {"experiment": "milarun.models.faults:crawl",
         "partition_scheme": {"type": "per-gpu"},
         "arguments": {"max-count": 30, "sample-duration": 0.05, "step-seconds": 0.005,
                       "warmup": 1}}


def test_repeatability_runs_k_times_and_gives_the_cv(tmp_path, capsys):
    profile = tmp_path / "tiny.json"
    profile.write_text(json.dumps({"crawl": CRAWL}))
    (tmp_path / "data").mkdir()
    study_file = tmp_path / "study.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(profile), "-k", "2", "-d", str(tmp_path / "data"),
         "-o", str(tmp_path / "runs"), "--json", str(study_file),
         "--", "--no-cgexec", "--cpu-slots", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
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
    assert lines[0].split() == ["test", "runs", "mean", "min", "max", "cv"]
    assert any(line.startswith("score ") and line.rstrip().endswith("%") for line in lines)
    assert lines[-1].startswith("one run's own 95% CI half-width of the score") \
        and lines[-1].endswith("%")
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
    assert module.main([str(profile), "-k", "2", "--weights", str(bad),
                        "-o", str(tmp_path / "runs")]) == 2
    assert ran == []  # hours of runs are not spent before a typo in --weights shows
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("repeatability: error: ")
