"""Report: golden text, formulas by hand, weights, baselines, missing tests, CLI errors."""

import io
import json
import math
import re
from pathlib import Path

import pytest

import milarun
from milarun.analysis.summary import summarize_dir
from milarun.cli import main
from milarun.cli.report import run_report
from milarun.errors import ResultFormatError
from milarun.formats.summary import normalize_summary, read_summary
from milarun.report import build_report, check_weights, load_weights, render_text

ROOT = Path(__file__).parent.parent
FIX = Path(__file__).parent / "fixtures"
RESULTS = FIX / "results"
WEIGHTS = FIX / "weights.json"
BASE2020 = FIX / "baseline2020.json"
NUM = re.compile(r"-?\d[\d,]*\.\d+")


def cli(args):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    return exc.value.code


def assert_text_close(actual, expected):
    """Same text, numbers with decimals compared with a tolerance of one last digit."""
    a_lines, e_lines = actual.splitlines(), expected.splitlines()
    assert len(a_lines) == len(e_lines)
    for a, e in zip(a_lines, e_lines):
        assert NUM.sub("#", a) == NUM.sub("#", e), (a, e)
        for x, y in zip(NUM.findall(a), NUM.findall(e)):
            digits = len(y.split(".")[1])
            assert float(x.replace(",", "")) == pytest.approx(
                float(y.replace(",", "")), abs=1.01 * 10**-digits
            ), (a, e)


def summary():
    return summarize_dir(RESULTS)[0]


def run_report_object(source, **options):
    from milarun.report import make_report

    return make_report(str(source), warn=io.StringIO(), **options)[0]


def full_report_text():
    out, err = io.StringIO(), io.StringIO()
    code = run_report(
        str(RESULTS),
        stdout=out,
        warn=err,
        weights=str(WEIGHTS),
        compare=str(BASE2020),
        price=30000.0,
        compare_gpus=True,
        title="fixture report",
    )
    return code, out.getvalue(), err.getvalue()


def test_golden_full_report():
    code, text, err = full_report_text()
    assert code == 0
    assert err.count("\n") == 4 and err.count("milarun: warning: skipped ") == 4
    assert_text_close(text, (FIX / "expected" / "report.txt").read_text())


def test_golden_plain_report():
    out = io.StringIO()
    assert run_report(str(RESULTS), stdout=out, warn=io.StringIO(), unweighted=True) == 0
    assert_text_close(out.getvalue(), (FIX / "expected" / "report-plain.txt").read_text())


def test_header_names_every_input():
    text = full_report_text()[1]
    head = text.split("\n\n")[0].splitlines()
    assert head[1:8] == [
        "results:  tests/fixtures/results (10 result files, 4 file(s) skipped)",
        "profile:  standard (the suite the records name; no session file names the profile)",
        "weights:  tests/fixtures/weights.json",
        "baseline: tests/fixtures/baseline2020.json",
        "price:    $30,000.00",
        f"milarun:  not recorded (results), {milarun.__version__} (this report)",
        "dates:    2026-11-18T11:06:40+00:00 to 2026-11-18T11:20:10+00:00 (UTC, first start "
        "to last end)",
    ]


def test_results_of_a_shipped_profile_take_its_weights_and_say_so(tmp_path):
    out = io.StringIO()
    assert run_report(str(RESULTS), stdout=out, warn=io.StringIO()) == 0
    text = out.getvalue()
    assert (
        "weights:  weights/standard.json, the shipped weights of profile standard (no "
        "--weights given; --unweighted for every test weight 1)"
    ) in text
    rep = run_report_object(RESULTS)
    assert rep.has_weights and rep.inputs["weights_default"]
    # the same score as --weights weights/standard.json
    explicit = run_report_object(RESULTS, weights=str(ROOT / "weights" / "standard.json"))
    assert explicit.score == pytest.approx(rep.score) and not explicit.inputs["weights_default"]
    # --unweighted: every test weight 1
    plain = run_report_object(RESULTS, unweighted=True)
    assert not plain.has_weights and {r["weight"] for r in plain.rows} == {1.0}
    assert cli(["report", RESULTS, "--unweighted", "--weights", WEIGHTS]) == 2


def test_suite_without_shipped_weights_is_unweighted(tmp_path):
    s = summary()
    s["tests"] = {
        g.replace("standard.", "mine."): {
            **t,
            "name": t["name"].replace("standard.", "mine."),
            "group": g.replace("standard.", "mine."),
        }
        for g, t in s["tests"].items()
    }
    s["provenance"]["suites"] = ["mine"]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(s))
    out = io.StringIO()
    assert run_report(str(path), stdout=out, warn=io.StringIO()) == 0
    assert "weights:  unweighted: every test weight 1" in out.getvalue()
    assert "results:  summary file " in out.getvalue()


def test_formulas_by_hand():
    w = load_weights(WEIGHTS)
    rep = build_report(summary(), weights=w, baseline=read_summary(BASE2020), price=30000)
    rows = {r["test"]: r for r in rep.rows}
    cv = math.sqrt(32 / 3) / 100
    conv = rows["standard.convnet"]
    assert conv["std"] == pytest.approx(cv)
    assert conv["perf_adj"] == pytest.approx(100 * (1 - cv))
    # baseline 2020: mean 80, std 4 -> 80 * 0.95 = 76
    assert conv["perf_base_adj"] == pytest.approx(76)
    assert conv["perf_ratio"] == pytest.approx(100 / 80)
    assert conv["perf_ratio_adj"] == pytest.approx(100 * (1 - cv) / 76)
    vae = rows["standard.vae"]
    assert vae["perf_adj"] == pytest.approx(200 * (1 - 1 / 2))
    assert vae["perf_ratio_adj"] == pytest.approx(100 / 250)
    # gpu-progression groups take the weight of "standard.scaling"
    assert rows["standard.scaling.1"]["weight"] == rows["standard.scaling.2"]["weight"] == 1
    adj = {"c": 100 * (1 - cv), "v": 100, "s1": 300, "s2": 560, "sh": 40}
    ws = {"c": 1, "v": 1, "s1": 1, "s2": 1, "sh": 0.5}
    score = math.exp(sum(ws[k] * math.log(adj[k]) for k in adj) / sum(ws.values()))
    assert rep.score == pytest.approx(score)
    base = {"c": 76, "v": 250, "s1": 300, "s2": 500, "sh": 40}
    score_base = math.exp(sum(ws[k] * math.log(base[k]) for k in base) / sum(ws.values()))
    assert rep.score_base == pytest.approx(score_base)
    assert rep.score_ratio == pytest.approx(score / score_base)
    assert not rep.ratio_partial
    assert rep.rpp == pytest.approx(30000 / score)
    assert rep.failure_rate == pytest.approx(2 / 10) and rep.verdict == "FAIL"
    assert rep.missing == ["standard.ssd"] and rep.zero == ["standard.wlm"]
    assert rep.incomplete


def test_no_penalize_variance():
    rep = build_report(summary(), penalize_variance=False)
    rows = {r["test"]: r for r in rep.rows}
    assert rows["standard.convnet"]["perf_adj"] == pytest.approx(100)
    assert rows["standard.vae"]["perf_adj"] == pytest.approx(100)
    assert "variance not penalized" in render_text(rep)


def test_without_weights_every_test_weighs_one():
    rep = build_report(summary())
    adj = [100 * (1 - math.sqrt(32 / 3) / 100), 100, 300, 560, 40]
    assert rep.score == pytest.approx(math.exp(sum(map(math.log, adj)) / len(adj)))
    assert rep.zero == ["standard.wlm"] and rep.missing == []


def test_pass_at_one_percent():
    s = normalize_summary(
        {
            "a.x": {
                "n": 100,
                "failures": 1,
                "train": {"n": 99, "min": 10, "max": 10, "mean": 10.0, "std": 0.0},
            }
        }
    )
    rep = build_report(s)
    assert rep.failure_rate == pytest.approx(0.01) and rep.verdict == "PASS"
    assert rep.score == pytest.approx(10 * 0.99)
    s["tests"]["a.x"]["failures"] = 2
    assert build_report(s).verdict == "FAIL"


def test_all_missing_gives_no_score_not_nan():
    rep = build_report(summary(), weights={"other.test": 1.0})
    assert rep.score is None and rep.missing == ["other.test"]
    text = render_text(rep)
    assert "score: n/a" in text and "nan" not in text.lower()


def test_strict_exit_code_for_missing_tests(capsys):
    assert cli(["report", RESULTS, "--weights", WEIGHTS, "--strict"]) == 1
    captured = capsys.readouterr()
    assert "standard.ssd" in captured.err and "score:" in captured.out
    assert cli(["report", RESULTS, "--weights", WEIGHTS]) == 0


def test_strict_passes_when_complete(tmp_path, capsys):
    w = tmp_path / "w.json"
    w.write_text(json.dumps({"standard.convnet": {"weight": 2}, "standard.wlm": {"weight": 0}}))
    assert cli(["report", RESULTS, "--weights", w, "--strict"]) == 0
    assert "(incomplete)" not in capsys.readouterr().out


def test_report_from_summary_equals_report_from_dir(tmp_path):
    out = tmp_path / "s.json"
    assert cli(["summary", RESULTS, "-o", out]) == 0
    a = build_report(read_summary(out), weights=load_weights(WEIGHTS))
    b = build_report(summary(), weights=load_weights(WEIGHTS))
    assert render_text(a) == render_text(b)


def test_compare_with_our_summary_is_ratio_one(tmp_path):
    out = tmp_path / "s.json"
    assert cli(["summary", RESULTS, "-o", out]) == 0
    rep = build_report(summary(), baseline=read_summary(out))
    assert rep.score_ratio == pytest.approx(1.0)
    assert all(r["perf_ratio_adj"] == pytest.approx(1.0) for r in rep.rows if r["counted"])


@pytest.mark.parametrize(
    "content,key",
    [
        ('{"standard.vae": {"weight": "heavy"}}', "standard.vae.weight"),
        ('{"standard.vae": {"weight": -1}}', "standard.vae.weight"),
        ('{"standard.vae": 3}', "standard.vae"),
        ('{"vae": {"weight": 1}}', "vae"),
        ("[1, 2]", None),
        ('{"standard.vae": {"wei', None),
    ],
)
def test_bad_weights_file_is_one_clear_error(tmp_path, capsys, content, key):
    w = tmp_path / "w.json"
    w.write_text(content)
    assert cli(["report", RESULTS, "--weights", w]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"milarun: error: {w}")
    assert "Traceback" not in "\n".join(err)
    if key:
        assert f": {key}:" in err[-1]


def test_bad_baseline_is_one_clear_error(tmp_path, capsys):
    b = tmp_path / "b.json"
    b.write_text('{"something": "else"}')
    assert cli(["report", RESULTS, "--compare", b]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f'milarun: error: {b}: not a milarun summary: expected {{"format": '
        f'"milarun-summary", "version": 1, "tests": {{...}}}} or the 2020 '
        f'flat format {{"suite.test": {{"n", "failures", "train", ...}}}}'
    ]


def test_report_of_a_non_summary_file(tmp_path, capsys):
    assert cli(["report", RESULTS / "config.json"]) == 2
    assert "not a milarun summary" in capsys.readouterr().err


def test_check_weights_keeps_floats():
    assert check_weights({"a.b": {"weight": 2}}) == {"a.b": 2.0}
    with pytest.raises(ResultFormatError):
        check_weights({"a.b": {"weight": float("inf")}})


@pytest.mark.parametrize("name", ["standard", "lite", "5gb", "10gb"])
def test_shipped_weights_are_valid(name):
    path = Path(__file__).parent.parent / "weights" / f"{name}.json"
    w = load_weights(path)
    tests = {k.split(".", 1)[1] for k in w}
    assert {k.split(".", 1)[0] for k in w} == {name}
    assert {"toy_reg", "toy_lstm", "convnet", "scaling", "matmul"} <= tests
    assert w[f"{name}.toy_reg"] == 0 and sum(w.values()) > 0


def test_no_steady_state_is_not_called_every_run_failed():
    from milarun.analysis.summary import summarize
    from milarun.formats.record import new_result
    from milarun.report.table import zero_reason

    rec = new_result("standard.tiny", "0.0")
    rec["success"] = True
    rec["timings"]["train"]["samples"] = [
        {"start": 1.0, "end": 1.5, "count": 5, "rate": 10.0, "warmup": True}
    ]
    s = normalize_summary(json.loads(json.dumps(summarize([("/r/t.json", rec)]))))
    rep = build_report(s, weights={"standard.tiny": 1.0})
    assert rep.zero == ["standard.tiny"]
    (reason,) = rep.zero_reasons.values()
    assert reason.startswith("no steady state in 1 result(s): none of the 1 sample(s)")
    text = render_text(rep)
    assert f"left out of the score: standard.tiny: {reason}" in text
    assert "every run failed" not in text
    # real failures say so, with their reasons
    t = {"n": 2, "failures": 2, "failure_reasons": {"timeout": 2}, "train": {"n": 0}}
    assert zero_reason(t) == "every run failed (timeout x2)"
    t = {"n": 2, "failures": 1, "failure_reasons": {"oom-killed": 1}, "train": {"n": 0}}
    assert zero_reason(t) == "1 of 2 run(s) failed (oom-killed)"
    # a test whose every launch was interrupted has no results, said so
    assert zero_reason({"n": 0, "failures": 0, "interrupted": 2, "train": {"n": 0}}) == (
        "no results (2 launch(es) interrupted)"
    )
