"""The score by workload family (milarun/report/family.py) and ``milarun report --family``."""

import io
import json
import math
from pathlib import Path

import pytest

from milarun.analysis.summary import summarize
from milarun.cli import main
from milarun.cli.report import run_report
from milarun.errors import MilarunError
from milarun.formats.record import new_result
from milarun.formats.summary import normalize_summary, read_summary, write_summary
from milarun.measure import stats
from milarun.report import build_report, render_html, render_text
from milarun.report.family import FAMILIES, check_families, family_of

FIX = Path(__file__).parent / "fixtures"
RESULTS = FIX / "results"


def entry(name, rates, tags=None):
    """A summary group of per-gpu results: ``rates`` one per run on device 0 (items/s)."""
    out = {
        "name": name,
        "group": name,
        "partition": "per-gpu",
        "device_count": 1,
        "n": len(rates),
        "failures": 0,
        "failure_reasons": {},
        "failed": [],
        "train": stats.describe(rates),
        "total": stats.describe([]),
        "pergpu": {"0": stats.describe(rates)},
    }
    if tags is not None:
        out["tags"] = tags
    return out


def make_summary(*entries):
    return normalize_summary(
        {"format": "milarun-summary", "version": 1, "tests": {e["group"]: e for e in entries}}
    )


def adj(rates):
    """perf_adj of a test of these rates, no failures."""
    d = stats.describe(rates)
    return d["mean"] * (1 - d["std"] / d["mean"])


RATES = {
    "s.gpt": [99.0, 101.0],
    "s.llama": [198.0, 202.0],
    "s.conv": [50.0, 50.0],
    "s.sd": [10.0, 12.0],
    "s.io": [300.0, 300.0],
    "s.toy": [5.0, 5.0],
}
TAGS = {
    "s.gpt": ["llm", "nlp"],
    "s.llama": ["nlp", "llm", "multi-gpu"],
    "s.conv": ["vision", "half"],
    "s.sd": ["vision", "generative"],
    "s.io": ["vision", "io"],
    "s.toy": ["toy"],
}
WEIGHTS = {"s.gpt": 2.0, "s.llama": 1.0, "s.conv": 1.0, "s.sd": 3.0, "s.io": 1.0, "s.toy": 0.0}


def tagged(scale=1.0):
    return make_summary(*(entry(t, [r * scale for r in rs], TAGS[t]) for t, rs in RATES.items()))


def geomean(tests):
    return math.exp(
        sum(WEIGHTS[t] * math.log(adj(RATES[t])) for t in tests) / sum(WEIGHTS[t] for t in tests)
    )


def test_family_by_priority():
    assert family_of(["nlp", "llm"]) == "llm"
    assert family_of(["vision", "generative"]) == "generative"
    assert family_of(["vision", "io"]) == "io"
    assert family_of(["rl", "cpu"]) == "rl"
    assert family_of(["inference", "vision"]) == "vision"
    assert family_of(["toy"]) == family_of([]) == "other"
    assert family_of(None) is None
    assert FAMILIES[0] == "llm" and FAMILIES[-1] == "compute"


def test_shipped_standard_profile_tests_each_have_a_family():
    profile = json.loads((Path(__file__).parent.parent / "profiles" / "standard.json").read_text())
    families = {
        name: family_of(e.get("tags", []))
        for name, e in profile.items()
        if isinstance(e, dict) and "tags" in e
    }
    assert {"llm", "generative", "io", "rl", "recommendation", "nlp", "vision"} <= set(
        families.values()
    )


def test_family_scores_by_hand():
    rep = build_report(tagged(), weights=WEIGHTS)
    view = {f["family"]: f for f in rep.families}
    assert list(view) == ["llm", "generative", "io", "vision", "other"]
    assert view["llm"]["names"] == ["s.gpt", "s.llama"] and view["llm"]["scored"] == 2
    assert view["llm"]["score"] == pytest.approx(geomean(["s.gpt", "s.llama"]))
    assert view["generative"]["score"] == pytest.approx(adj(RATES["s.sd"]))
    assert view["vision"]["score"] == pytest.approx(adj(RATES["s.conv"]))
    total = 2 + 1 + 1 + 3 + 1
    assert view["llm"]["share"] == pytest.approx(3 / total)
    assert view["generative"]["share"] == pytest.approx(3 / total)
    # weight 0: shown, not scored
    assert view["other"]["scored"] == 0 and view["other"]["score"] is None
    assert view["other"]["share"] == 0
    assert rep.score == pytest.approx(geomean([t for t in RATES if WEIGHTS[t]]))
    # the whole score is the weighted geometric mean of the families' scores
    parts = [(f["weight"], f["score"]) for f in rep.families if f["score"]]
    assert rep.score == pytest.approx(
        math.exp(sum(w * math.log(s) for w, s in parts) / sum(w for w, _ in parts))
    )
    text = render_text(rep)
    assert "score by family" in text
    assert "LLM: s.gpt, s.llama" in text
    html = render_html(rep)
    assert 'id="families"' in html and 'id="family-llm"' in html


def test_family_ratio_to_the_baseline():
    rep = build_report(tagged(), weights=WEIGHTS, baseline=tagged(scale=0.5))
    view = {f["family"]: f for f in rep.families}
    assert view["llm"]["score_base"] == pytest.approx(geomean(["s.gpt", "s.llama"]) / 2)
    assert view["llm"]["ratio"] == pytest.approx(2.0)
    assert not view["llm"]["partial"]
    text = render_text(rep)
    lines = text.splitlines()
    head = lines[lines.index(next(x for x in lines if x.startswith("score by family"))) + 1]
    assert head.split()[-2:] == ["baseline", "ratio"]
    assert "LLM: s.gpt, s.llama" in text


def test_family_filter_scores_those_families_only():
    rep = build_report(tagged(), weights=WEIGHTS, families=["llm", "vision"])
    assert rep.score == pytest.approx(geomean(["s.gpt", "s.llama", "s.conv"]))
    rows = {r["test"]: r for r in rep.rows}
    assert rows["s.sd"]["weight"] == 0 and not rows["s.sd"]["counted"]
    assert rows["s.gpt"]["weight"] == 2 and rows["s.gpt"]["counted"]
    # the score by family keeps every test's weight
    assert {f["family"]: f["score"] for f in rep.families}["generative"] == pytest.approx(
        adj(RATES["s.sd"])
    )
    assert "--family" in render_text(rep)
    html = render_html(rep)
    assert "(LLM, vision only: --family)" in html and 'id="family-filter"' in html


def test_family_cli_header_repeat_and_unknown(tmp_path, capsys):
    path = tmp_path / "summary.json"
    write_summary(tagged(), path)
    weights = tmp_path / "w.json"
    weights.write_text(json.dumps({t: {"weight": w} for t, w in WEIGHTS.items()}))
    out = io.StringIO()
    code = run_report(
        str(path), stdout=out, warn=io.StringIO(), weights=str(weights), family=["llm"]
    )
    assert code == 0
    text = out.getvalue()
    assert "families:" in text and "LLM (--family)" in text
    assert f"score: {geomean(['s.gpt', 's.llama']):.2f} (LLM only: --family)" in text
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "report",
                str(path),
                "--weights",
                str(weights),
                "--family",
                "llm",
                "--family",
                "generative",
            ]
        )
    assert exc.value.code == 0
    got = capsys.readouterr().out
    assert f"score: {geomean(['s.gpt', 's.llama', 's.sd']):.2f}" in got
    with pytest.raises(SystemExit) as exc:
        main(["report", str(path), "--family", "llms"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("milarun: error: --family: unknown family")


def test_family_filter_without_tags_is_an_error(capsys):
    with pytest.raises(MilarunError, match="no test of these results has profile tags"):
        build_report(make_summary(entry("s.a", [1.0, 1.0])), families=["llm"])
    assert check_families(["llm", "llm", "other"]) == ["llm", "other"]


def test_old_summaries_have_no_family_view():
    rep = build_report(make_summary(entry("s.a", [1.0, 1.0]), entry("s.b", [2.0, 2.0])))
    assert rep.families == []
    assert "score by family" not in render_text(rep)
    assert 'id="families"' not in render_html(rep)


def _record(name, tags, rate=100.0):
    rec = new_result(name, "0.0", device="0", devices=[0], run=0, plan_type="per-gpu")
    rec["success"] = True
    rec["timings"]["program"] = {"start": 1.0e9, "end": 1.0e9 + 21, "duration": 21.0}
    rec["timings"]["train"]["samples"] = [
        {"start": float(i), "end": float(i + 1), "count": rate, "rate": rate, "warmup": i == 0}
        for i in range(20)
    ]
    if tags is not None:
        rec["job"] = {"experiment": "x:main", "tags": tags}
    return rec


def test_summary_keeps_the_records_tags_and_only_then(tmp_path):
    summary = summarize(
        [
            _record("s.gpt", ["llm", "nlp"]),
            _record("s.gpt", ["llm", "bad tag"]),
            _record("s.old", None),
        ]
    )
    assert summary["tests"]["s.gpt"]["tags"] == ["llm", "nlp"]
    assert "tags" not in summary["tests"]["s.old"]
    path = tmp_path / "summary.json"
    write_summary(summary, path)
    back = read_summary(path)
    assert back["tests"]["s.gpt"]["tags"] == ["llm", "nlp"]
    assert "tags" not in back["tests"]["s.old"]
    rep = build_report(back)
    assert {f["family"]: f["names"] for f in rep.families} == {"llm": ["s.gpt"], "other": ["s.old"]}


def test_fixture_results_have_no_tags():
    from milarun.analysis.summary import summarize_dir

    summary = summarize_dir(RESULTS)[0]
    assert all("tags" not in t for t in summary["tests"].values())
