"""The run protocol of a tender (issue 36 §3): repeats, the minimum steady-state time and
how a test's figure is taken over its runs (median, MLPerf's trimmed mean, never the best).

Figures are hand-computed: five runs whose per-run means are 10, 11, 12, 13 and 30 items/s
have median 12, trimmed mean (12 + 11 + 13) / 3 = 12 and mean 76 / 5 = 15.2.
"""

import json
import types

import pytest

from milarun.analysis.summary import summarize
from milarun.cli import main
from milarun.formats.record import new_result
from milarun.formats.rules import RulesError, read_rules
from milarun.formats.summary import normalize_summary
from milarun.report.table import (
    build_report,
    check_repeat_score,
    repeat_aggregate,
    repeat_spread,
)
from milarun.report.tender import Bidder, Tender, protocol_lines, protocol_text
from milarun.report.text import protocol_lines as report_protocol_lines
from milarun.verify.check import (
    Bundle,
    _repeats_clause,
    _scored_records,
    _steady_time_clause,
)
from milarun.verify.verdict import Verdict

#: Per run, the two devices' rates (items/s): run means 10, 11, 12, 13, 30.
RUNS = {0: (9.0, 11.0), 1: (10.0, 12.0), 2: (11.0, 13.0), 3: (12.0, 14.0), 4: (29.0, 31.0)}


def record(rate, device, run, name="s.conv", seconds=20):
    """A successful per-GPU record at ``rate`` items/s: ``seconds`` samples of 1 s, the
    first a warm-up (20 samples: a full 10 s steady-state window)."""
    rec = new_result(name, f"{run}.{device}", device=device, devices=[0], run=run)
    rec["partition"] = "per-gpu"
    rec["success"] = True
    rec["timings"]["program"] = {"start": 1.0e9, "end": 1.0e9 + seconds + 1, "duration": 21.0}
    rec["timings"]["train"]["samples"] = [
        {"start": float(i), "end": float(i + 1), "count": rate, "rate": rate, "warmup": i == 0}
        for i in range(seconds)
    ]
    rec["host"] = {"hostname": "node1", "cpu_model": "EPYC", "cpu_count": 64, "gpus": []}
    return rec


def five_runs():
    return [
        record(rate, str(d), run) for run, rates in RUNS.items() for d, rate in enumerate(rates)
    ]


# --- the aggregates ----------------------------------------------------------------------


def test_aggregates_of_five_runs_by_hand():
    figures = [10.0, 11.0, 12.0, 13.0, 30.0]
    assert repeat_aggregate(figures, "median") == (12.0, None)
    assert repeat_aggregate(figures, "trimmed-mean") == (pytest.approx(12.0), None)
    assert repeat_aggregate(figures, "mean") == (pytest.approx(15.2), None)
    # the best run (30) is never what any aggregate gives
    assert all(repeat_aggregate(figures, how)[0] < 30 for how in ("median", "trimmed-mean"))


def test_even_median_and_too_few_runs_for_a_trimmed_mean():
    assert repeat_aggregate([10.0, 14.0, 11.0, 13.0], "median") == (12.0, None)
    # trimmed mean of 4: drop 10 and 14 -> (11 + 13) / 2
    assert repeat_aggregate([10.0, 14.0, 11.0, 13.0], "trimmed-mean")[0] == pytest.approx(12.0)
    value, note = repeat_aggregate([10.0, 14.0], "trimmed-mean")
    assert value == pytest.approx(12.0)
    assert "a trimmed mean needs 3" in note
    assert repeat_aggregate([], "median") == (None, None)


def test_spread_across_runs():
    sp = repeat_spread([10.0, 11.0, 12.0, 13.0, 30.0])
    assert (sp["runs"], sp["min"], sp["max"]) == (5, 10.0, 30.0)
    # sample std of the five: sqrt(((-5.2)^2 + (-4.2)^2 + (-3.2)^2 + (-2.2)^2 + 14.8^2) / 4)
    std = ((5.2**2 + 4.2**2 + 3.2**2 + 2.2**2 + 14.8**2) / 4) ** 0.5
    assert sp["cv"] == pytest.approx(std / 15.2)
    assert repeat_spread([12.0])["cv"] is None


def test_unknown_repeat_score_is_refused():
    with pytest.raises(Exception, match="--repeat-score must be mean, median, trimmed-mean"):
        check_repeat_score("best")


# --- the summary and the report ----------------------------------------------------------------


def test_summary_keeps_each_runs_rates_and_survives_its_schema():
    summary = normalize_summary(json.loads(json.dumps(summarize(five_runs()))))
    perrun = summary["tests"]["s.conv"]["perrun"]
    assert sorted(perrun) == ["0", "1", "2", "3", "4"]
    assert [perrun[str(r)]["mean"] for r in range(5)] == [10.0, 11.0, 12.0, 13.0, 30.0]
    assert perrun["4"]["n"] == 2
    # per-GPU children of one run are a concurrent wave: their effective rates per run too
    assert sorted(summary["tests"]["s.conv"]["perrun_effective"]) == ["0", "1", "2", "3", "4"]


@pytest.mark.parametrize("how, perf", [("mean", 15.2), ("median", 12.0), ("trimmed-mean", 12.0)])
def test_report_perf_over_runs(how, perf):
    summary = summarize(five_runs())
    report = build_report(summary, throughput="own", repeat_score=how)
    row = report.rows[0]
    assert row["perf"] == pytest.approx(perf)
    assert row["run_figures"] == [10.0, 11.0, 12.0, 13.0, 30.0]
    assert (row["repeat_spread"]["min"], row["repeat_spread"]["max"]) == (10.0, 30.0)
    # the node throughput (sum of the 2 devices' means, 14.2 + 16.2) follows the same ratio
    assert row["node_perf"] == pytest.approx(30.4 * perf / 15.2)
    assert report.protocol["repeat_score"] == how
    assert report.protocol["repeats_min"] == report.protocol["repeats_max"] == 5


def test_report_says_the_protocol_and_fewer_repeats_than_asked():
    summary = summarize(five_runs())
    report = build_report(
        summary, throughput="own", repeat_score="median", protocol={"min_repeats": 6}
    )
    lines = report_protocol_lines(report)
    assert lines[0].startswith("protocol: 5 run(s) per test; perf over runs: median")
    assert "the rules ask 6 repeat(s)" in lines[0]
    assert "fewer repeats than the rules ask (6): s.conv (5 run(s))" in lines
    assert any(line.startswith("  s.conv: 5 runs, 10.00-30.00, cv ") for line in lines)


def test_trimmed_mean_of_two_runs_says_so():
    recs = [record(rate, str(d), run) for run in (0, 1) for d, rate in enumerate(RUNS[run])]
    report = build_report(summarize(recs), throughput="own", repeat_score="trimmed-mean")
    assert report.rows[0]["perf"] == pytest.approx(10.5)
    assert report.protocol["notes"] == [
        "s.conv: 2 run(s): a trimmed mean needs 3; the mean of the runs there are"
    ]


def test_report_cli_refuses_an_unknown_aggregate(tmp_path, capsys):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summarize(five_runs())))
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(path), "--repeat-score", "best"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--repeat-score must be" in err[0]


def test_report_cli_scores_the_median_run(tmp_path, capsys):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summarize(five_runs())))
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(path), "--repeat-score", "median"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    # the score table's row (test, n, fail, perf, ...): the median run's perf, 12 items/s,
    # not the mean over results (15.2)
    row = next(line for line in out.splitlines() if line.startswith("s.conv "))
    assert row.split()[:4] == ["s.conv", "10", "0", "12.00"]
    assert "perf over runs: median" in out


# --- the rules file ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "rules, key, words",
    [
        ({"repeat_score": "trimmed-mean", "min_repeats": 2}, "repeat_score", "not 2"),
        ({"repeat_score": "trimmed-mean"}, "repeat_score", "not none"),
        ({"repeat_score": "best"}, "repeat_score", "must be median or trimmed-mean"),
        ({"min_repeats": -1}, "min_repeats", "whole number"),
        ({"min_repeats": 2.5}, "min_repeats", "whole number"),
        ({"min_steady_s": -1}, "min_steady_s", "above 0"),
        ({"min_steady_s": 11}, "min_steady_s", "at most 10"),
        ({"min_steady_s": "8"}, "min_steady_s", "a time in s"),
    ],
)
def test_impossible_protocol_is_one_line_naming_file_and_key(tmp_path, rules, key, words):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(rules))
    with pytest.raises(RulesError) as err:
        read_rules(path)
    text = str(err.value)
    assert "\n" not in text
    assert str(path) in text and key in text and words in text


def test_a_possible_protocol_is_read(tmp_path):
    path = tmp_path / "rules.json"
    rules = {"repeat_score": "trimmed-mean", "min_repeats": 3, "min_steady_s": 8}
    path.write_text(json.dumps(rules))
    assert read_rules(path) == rules


def test_verify_with_an_impossible_protocol_exits_2_judging_nothing(tmp_path, capsys):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"repeat_score": "trimmed-mean", "min_repeats": 1}))
    with pytest.raises(SystemExit) as exit_:
        main(["verify", str(tmp_path), "--rules", str(path)])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and "repeat_score" in err


# --- verify: compliance.repeats and compliance.steady-time ----------------------------------


def fake_bundle(tmp_path, records, resumed_runs=()):
    """A :class:`Bundle` holding ``records`` as chained records: those of the runs in
    ``resumed_runs`` entered by a second session, a ``--resume``."""
    b = Bundle(tmp_path)
    b.records = {f"r{i}.json": rec for i, rec in enumerate(records)}
    b.entries = [
        {
            "kind": "record",
            "path": path,
            "session": "s2" if rec["run"] in resumed_runs else "s1",
        }
        for path, rec in b.records.items()
    ]
    b.plans = {"s1": {}, "s2": {"resume": True}}
    return b


def clauses(v, name):
    return [c for c in v.clauses if c.name == name]


def test_five_repeats_asked_of_a_three_repeat_bundle_fail(tmp_path):
    recs = [record(rate, str(d), run) for run in (0, 1, 2) for d, rate in enumerate(RUNS[run])]
    b = fake_bundle(tmp_path, recs)
    v = Verdict(bundle=str(tmp_path))
    _repeats_clause(b, v, {"repeat": 3}, _scored_records(b), 5)
    failed = [c for c in clauses(v, "compliance.repeats") if not c.ok]
    assert [c.detail for c in failed] == [
        "--repeat 3: the rules ask at least 5 repeat(s)",
        "s.conv: 3 run(s) with a scored record (runs 0, 1, 2), the rules ask at least 5",
    ]


def test_three_repeats_pass_and_a_resumed_run_is_named(tmp_path):
    recs = [record(rate, str(d), run) for run in (0, 1, 2) for d, rate in enumerate(RUNS[run])]
    b = fake_bundle(tmp_path, recs, resumed_runs=(2,))
    v = Verdict(bundle=str(tmp_path))
    _repeats_clause(b, v, {"repeat": 3}, _scored_records(b), 3)
    (clause,) = clauses(v, "compliance.repeats")
    assert clause.ok
    assert "from a --resume session: run 2 (s2)" in clause.detail


def test_steady_time_names_the_shortest(tmp_path):
    # 20 samples of 1 s: a full window, 10 s; 6 samples: 'short', samples 1..4 = 4 s
    recs = [record(10.0, "0", 0), record(10.0, "1", 0, seconds=6)]
    b = fake_bundle(tmp_path, recs)
    v = Verdict(bundle=str(tmp_path))
    _steady_time_clause(v, _scored_records(b), 8.0)
    (clause,) = clauses(v, "compliance.steady-time")
    assert not clause.ok
    assert clause.detail.startswith("shortest steady state 4 s (s.conv run 0, r1.json)")
    assert "1 of 2 scored record(s) below the 8 s" in clause.detail
    v = Verdict(bundle=str(tmp_path))
    _steady_time_clause(v, _scored_records(b), 4.0)
    assert clauses(v, "compliance.steady-time")[0].ok


# --- the tender ------------------------------------------------------------------------------


def test_tender_shows_the_protocol_and_each_bidders_spread():
    report = build_report(
        summarize(five_runs()),
        throughput="own",
        repeat_score="trimmed-mean",
        protocol={"min_repeats": 6, "min_steady_s": 8},
    )
    bidder = Bidder(name="acme", path="acme")
    bidder.report = report
    tender = Tender(
        bidders=[bidder],
        rules="rules.json",
        repeat_score="trimmed-mean",
        protocol={"min_repeats": 6, "min_steady_s": 8},
    )
    text = protocol_text(tender)
    assert text.startswith("perf over runs: trimmed-mean (")
    assert "the rules ask 6 repeat(s) per test, a steady state of 8 s or more" in text
    (line,) = protocol_lines(tender)
    assert line.startswith("acme: 5 run(s) per test, run-to-run cv up to ")
    assert line.endswith("(s.conv); fewer repeats than the rules ask: s.conv (5)")
    assert report.rows[0]["perf"] == pytest.approx(12.0)


def test_a_bidder_without_a_report_has_no_protocol_line():
    tender = Tender(bidders=[types.SimpleNamespace(name="x", report=None)], rules="r")
    assert protocol_lines(tender) == []
