"""Node score, price per node-score point, confidence intervals and --compare significance."""

import io
import json
import math
from pathlib import Path

import pytest

from milarun.analysis.summary import summarize
from milarun.cli.report import run_report
from milarun.formats.record import new_result
from milarun.formats.summary import normalize_summary, read_summary
from milarun.measure import confidence, stats
from milarun.report import build_report, render_html, render_text

FIX = Path(__file__).parent / "fixtures"
BASE2020 = FIX / "baseline2020.json"
WEIGHTS = FIX / "weights.json"


# --- Student t, by tables -------------------------------------------------------------

#: Two-tailed 95% critical values for df = 1..30 (pyperf's _T_DIST_95_CONF_LEVELS, the
#: usual printed t table, 3 decimals).
T_TABLE = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


def test_t_quantile_matches_the_printed_table():
    for df, value in enumerate(T_TABLE, start=1):
        assert confidence.t_quantile(0.975, df) == pytest.approx(value, abs=6e-4), df


def test_t_quantile_to_many_digits():
    # exact values (closed forms: df=1 tan(0.475 pi), df=2 sqrt(2) q / sqrt(1 - q^2)...)
    assert confidence.t_quantile(0.975, 1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-10)
    q = 2 * 0.975 - 1
    assert confidence.t_quantile(0.975, 2) == pytest.approx(
        q * math.sqrt(2 / (1 - q * q)), rel=1e-10
    )
    assert confidence.t_quantile(0.995, 1) == pytest.approx(63.65674116287399, rel=1e-9)
    assert confidence.t_quantile(0.975, 10) == pytest.approx(2.2281388519649385, rel=1e-9)
    assert confidence.t_quantile(0.975, math.inf) == pytest.approx(1.959963984540054)
    assert confidence.t_quantile(0.025, 4) == pytest.approx(-2.7764451051977987)
    # real degrees of freedom (Welch): between its integer neighbours, and inverts the cdf
    t = confidence.t_quantile(0.975, 4.5)
    assert 2.571 < t < 2.776
    assert confidence.t_cdf(t, 4.5) == pytest.approx(0.975, abs=1e-12)
    with pytest.raises(ValueError):
        confidence.t_quantile(1.0, 3)
    with pytest.raises(ValueError):
        confidence.t_quantile(0.9, 0)


def test_mean_interval_by_hand():
    d = stats.describe([98.0, 100.0, 102.0, 100.0])  # mean 100, std sqrt(8/3)
    ci = confidence.mean_interval(d["n"], d["mean"], d["std"])
    half = 3.182446305284263 * math.sqrt(8 / 3) / 2
    assert (ci.lo, ci.hi, ci.df) == (pytest.approx(100 - half), pytest.approx(100 + half), 3)


def test_one_result_has_no_interval_never_zero():
    assert confidence.mean_interval(1, 5.0, 0.0) is None
    assert confidence.mean_interval(0, None, None) is None
    assert confidence.welch_test((1, 5.0, 0.0), (4, 5.0, 1.0)) is None
    # two results that agree exactly: measured, an interval of width 0
    assert confidence.mean_interval(2, 5.0, 0.0) == (5.0, 5.0, 1.0)


def test_welch_by_hand_clearly_different_is_significant():
    # [10, 12, 14] against [20, 22, 24]: t = -8 / sqrt(4/3 + 4/3), df = 4
    test = confidence.welch_test((3, 12.0, 2.0), (3, 20.0, 2.0))
    assert test.t == pytest.approx(-8 / math.sqrt(8 / 3))
    assert test.df == pytest.approx(4.0)
    assert test.significant  # |t| = 4.90 > 2.776


def test_welch_same_distribution_is_within_noise():
    a = stats.describe([100.0, 104.0, 96.0, 101.0])
    b = stats.describe([102.0, 97.0, 99.0, 103.0])
    test = confidence.welch_test((a["n"], a["mean"], a["std"]), (b["n"], b["mean"], b["std"]))
    assert not test.significant and abs(test.t) < 0.5
    assert not confidence.welch_test((4, 10.0, 1.0), (4, 10.0, 1.0)).significant
    # with equal sizes Welch's t is Student's pooled t (pyperf's tscore); only df differ
    pooled = math.sqrt((a["std"] ** 2 + b["std"] ** 2) / 2)
    assert test.t == pytest.approx((a["mean"] - b["mean"]) / (pooled * math.sqrt(2 / 4)))


def test_welch_without_spread():
    assert confidence.welch_test((2, 5.0, 0.0), (3, 6.0, 0.0)).significant
    assert not confidence.welch_test((2, 5.0, 0.0), (3, 5.0, 0.0)).significant


def test_geomean_interval_by_hand():
    # weights 1 and 3: a = 1/4, 3/4; Var(log mean) = std^2 / (n mean^2)
    parts = [(1.0, [(4, 100.0, 2.0)]), (3.0, [(9, 50.0, 3.0)])]
    v1 = (1 / 4) ** 2 * 4 / (4 * 100.0**2)
    v2 = (3 / 4) ** 2 * 9 / (9 * 50.0**2)
    df = (v1 + v2) ** 2 / (v1**2 / 3 + v2**2 / 8)
    half = confidence.t_quantile(0.975, df) * math.sqrt(v1 + v2)
    ci = confidence.geomean_interval(70.0, parts)
    assert ci.df == pytest.approx(df)
    assert ci.lo == pytest.approx(70 * math.exp(-half))
    assert ci.hi == pytest.approx(70 * math.exp(half))
    # a ratio's term carries two independent samples: their variances add
    ratio = confidence.geomean_interval(1.0, [(1.0, [(4, 100.0, 2.0), (4, 100.0, 2.0)])])
    single = confidence.geomean_interval(1.0, [(1.0, [(4, 100.0, 2.0)])])
    assert math.log(ratio.hi) > math.log(single.hi)
    assert ratio.lo < 1 < ratio.hi
    # one term with a single result: unknown, never zero-width
    assert confidence.geomean_interval(70.0, parts + [(1.0, [(1, 10.0, 0.0)])]) is None


# --- hand-made summaries ---------------------------------------------------------------


def entry(name, rates, partition="per-gpu", failed_devices=(), **extra):
    """A summary group: ``rates`` is ``{device: [rate per run]}`` (items/s)."""
    every = [r for rs in rates.values() for r in rs]
    failed = [
        {
            "device": d,
            "node": None,
            "run": 0,
            "reason": "error",
            "message": None,
            "returncode": 1,
            "stderr_tail": None,
            "file": None,
        }
        for d in failed_devices
    ]
    return {
        "name": name,
        "group": name,
        "partition": partition,
        "device_count": 1,
        "n": len(every) + len(failed),
        "failures": len(failed),
        "failure_reasons": {"error": len(failed)} if failed else {},
        "failed": failed,
        "train": stats.describe(every),
        "total": stats.describe([]),
        "pergpu": {d: stats.describe(rs) for d, rs in rates.items()},
        **extra,
    }


def make_summary(*entries):
    return normalize_summary(
        {"format": "milarun-summary", "version": 1, "tests": {e["group"]: e for e in entries}}
    )


def node_of(gpus, rate=100.0):
    """A node of ``gpus`` identical devices running two per-gpu tests (2 runs each; every
    device alike, so that std% is the same for 4 and 8 of them)."""
    return make_summary(
        entry("s.conv", {str(d): [rate - 1, rate + 1] for d in range(gpus)}),
        entry("s.vae", {str(d): [rate / 2, rate / 2] for d in range(gpus)}),
    )


def test_node_score_doubles_with_twice_the_same_gpus():
    # std% of s.conv moves a little with n (divisor n - 1): compared without that factor
    four, eight = (
        build_report(node_of(g), price=10000.0 * g, penalize_variance=False) for g in (4, 8)
    )
    assert four.score == pytest.approx(eight.score)
    assert eight.node_score == pytest.approx(2 * four.node_score)
    # price / score doubles for the larger node; price per node-score point does not
    assert eight.rpp == pytest.approx(2 * four.rpp)
    assert four.node_rpp == pytest.approx(40000 / four.node_score)
    assert eight.node_rpp == pytest.approx(four.node_rpp)
    # per node: the sum over the node's devices of their mean rates; perf_adj's factors
    rep = build_report(node_of(4), price=40000.0)
    rows = {r["test"]: r for r in rep.rows}
    assert rows["s.conv"]["node_perf"] == pytest.approx(4 * 100.0)
    assert rows["s.vae"]["node_perf"] == pytest.approx(4 * 50.0)
    std = rows["s.conv"]["std"]
    assert std > 0
    assert rows["s.conv"]["node_perf_adj"] == pytest.approx(400 * (1 - std))
    assert rep.node_score == pytest.approx(math.sqrt(400 * (1 - std) * 200))
    text = render_text(rep)
    assert f"node score: {rep.node_score:.2f}" in text
    assert f"price per node-score point (price / node score): {rep.node_rpp:.2f}" in text


def test_whole_node_and_job_tests_keep_their_rate():
    s = make_summary(
        entry("s.normal", {"all": [800.0, 820.0]}, partition="normal"),
        entry("s.step.2", {"0-1": [300.0, 310.0]}, partition="gpu-progression"),
        entry(
            "s.ddp",
            {"2x4": [1500.0, 1540.0]},
            partition="multi-node",
            node_count=2,
            gpus_per_node=4,
        ),
        entry(
            "s.ddp.4x2",
            {"4x2": [2000.0]},
            partition="node-progression",
            node_count=4,
            gpus_per_node=2,
        ),
    )
    rows = {r["test"]: r for r in build_report(s).rows}
    assert rows["s.normal"]["node_perf"] == pytest.approx(810.0)
    assert rows["s.step.2"]["node_perf"] == pytest.approx(305.0)
    assert rows["s.ddp"]["node_perf"] == pytest.approx(1520.0 / 2)
    assert rows["s.ddp.4x2"]["node_perf"] == pytest.approx(2000.0 / 4)


def test_a_dead_gpu_costs_the_node_once():
    # 8 devices, device 7 failed its only run: it counts at the others' mean, and the
    # test's (1 - fail/n) factor charges its failure -> 7 GPUs' worth, as 7/8 of the node
    rates = {str(d): [100.0, 100.0] for d in range(7)}
    s = make_summary(entry("s.conv", rates, failed_devices=["7"]))
    row = build_report(s).rows[0]
    assert row["node_perf"] == pytest.approx(800.0)
    assert row["node_perf_adj"] == pytest.approx(800.0 * (1 - 1 / 15))
    assert row["perf_adj"] == pytest.approx(100.0 * (1 - 1 / 15))


def record(name, rate, device, host, partition="per-gpu", **fields):
    """A successful record whose steady-state rate is ``rate`` items/s."""
    rec = new_result(name, f"0.{device}", device=device, devices=[0], run=0, plan_type=partition)
    rec["success"] = True
    rec["timings"]["program"] = {"start": 1.0e9, "end": 1.0e9 + 21, "duration": 21.0}
    rec["timings"]["train"]["samples"] = [
        {"start": float(i), "end": float(i + 1), "count": rate, "rate": rate, "warmup": i == 0}
        for i in range(20)
    ]
    rec["host"] = {"hostname": host, "cpu_model": "EPYC", "cpu_count": 64, "gpus": []}
    rec.update(fields)
    return rec


def test_node_throughput_of_a_cluster_from_records():
    recs = [
        record(
            "c.conv",
            100.0 + d + 10 * i,
            f"node{i}.{d}",
            f"node{i}",
            node=f"node{i}",
            nodes=[f"node{i}"],
            node_count=1,
            gpus_per_node=1,
        )
        for i in (1, 2)
        for d in (0, 1)
    ]
    recs.append(
        record(
            "c.ddp",
            900.0,
            "2x2",
            "node1",
            partition="multi-node",
            nodes=["node1", "node2"],
            node_count=2,
            gpus_per_node=2,
        )
    )
    summary = summarize(recs)
    assert summary["tests"]["c.ddp"]["node_count"] == 2
    rows = {r["test"]: r for r in build_report(summary).rows}
    # per-gpu on 2 nodes: the average node's sum over its 2 devices
    assert rows["c.conv"]["node_perf"] == pytest.approx((110 + 111 + 120 + 121) / 2)
    assert rows["c.ddp"]["node_perf"] == pytest.approx(450.0)


# --- the 2020 baseline ------------------------------------------------------------------


def test_2020_scores_unchanged_and_its_noise_unknown():
    from milarun.report import load_weights

    base = read_summary(BASE2020)
    w = load_weights(WEIGHTS)
    adj = {"convnet": 80 * 0.95, "vae": 250, "s1": 300, "s2": 500, "short": 40}
    ws = {"convnet": 1, "vae": 1, "s1": 1, "s2": 1, "short": 0.5}
    exact = math.exp(sum(ws[k] * math.log(adj[k]) for k in adj) / sum(ws.values()))
    rep = build_report(base, weights=w)
    assert rep.score == pytest.approx(exact, rel=1e-12)
    # its plan types are unknown: no node score rather than a wrong one
    assert rep.node_score is None and len(rep.node_missing) == 5
    assert "node score: n/a" in render_text(rep)
    # compared with: the score ratio is the same, its noise unknown
    ours = node_of(2)
    cmp = build_report(
        make_summary(
            *[
                {**e, "name": n, "group": n}
                for n, e in (("standard.convnet", ours["tests"]["s.conv"]),)
            ]
        ),
        weights=w,
        baseline=base,
    )
    assert cmp.score_base == pytest.approx(76.0)
    assert cmp.score_ratio_ci is None and "2020" in cmp.score_ratio_ci_note
    assert cmp.rows[0]["sig"] == "noise unknown"
    assert "noise unknown" in render_text(cmp)


# --- --compare significance ------------------------------------------------------------


def test_compare_marks_significant_and_within_noise():
    ours = make_summary(
        entry("s.conv", {"0": [100.0, 101.0], "1": [99.0, 100.0]}),
        entry("s.vae", {"0": [100.0, 104.0], "1": [96.0]}),
        entry("s.one", {"0": [10.0]}),
    )
    base = make_summary(
        entry("s.conv", {"0": [80.0, 81.0], "1": [79.0, 80.0]}),
        entry("s.vae", {"0": [101.0, 99.0], "1": [100.0]}),
        entry("s.one", {"0": [10.0, 10.5]}),
    )
    rep = build_report(ours, baseline=base)
    rows = {r["test"]: r for r in rep.rows}
    assert rows["s.conv"]["sig"] == "significant"
    assert rows["s.vae"]["sig"] == "within noise"
    assert rows["s.one"]["sig"] == "noise unknown" and rows["s.one"]["ci"] is None
    # one test with one result: it is held fixed (no variance) and the report names it
    counted = [r for r in rep.rows if r["counted"]]
    by_hand = confidence.geomean_interval(
        rep.score, [(r["weight"], [r["sample"]] if r["test"] != "s.one" else []) for r in counted]
    )
    assert rep.score_ci == by_hand and rep.score_ci_held == ["s.one"]
    assert rep.score_ci.lo < rep.score < rep.score_ci.hi
    assert rep.score_ratio_ci_held == ["s.one"] and rep.score_ratio_ci is not None
    text = render_text(rep)
    assert "significant" in text and "within noise" in text and "n/a (n=1)" in text
    assert "±0.00%" not in text
    assert "score 95% CI: " in text and "(held fixed, one result: s.one)" in text
    # without hold_unknown (and when every test has one result) there is no interval
    assert (
        confidence.geomean_interval(rep.score, [(r["weight"], [r["sample"]]) for r in counted])
        is None
    )
    alone = build_report(make_summary(entry("s.one", {"0": [10.0]})))
    assert alone.score_ci is None and "s.one" in alone.score_ci_note


def test_score_ratio_interval():
    ours = make_summary(
        entry("s.conv", {"0": [100.0, 102.0, 98.0]}), entry("s.vae", {"0": [50.0, 51.0, 49.0]})
    )
    base = make_summary(
        entry("s.conv", {"0": [90.0, 91.0, 89.0]}), entry("s.vae", {"0": [50.0, 52.0, 48.0]})
    )
    rep = build_report(ours, baseline=base, penalize_variance=False)
    ci = rep.score_ratio_ci
    assert ci.lo < rep.score_ratio < ci.hi
    # by hand: terms 1/2 each, ours and the baseline's variances add
    lv = [4 / (3 * 100**2), 1 / (3 * 50**2), 1 / (3 * 90**2), 4 / (3 * 50**2)]
    parts = [v / 4 for v in lv]
    var = sum(parts)
    df = var**2 / sum(p * p / 2 for p in parts)
    half = confidence.t_quantile(0.975, df) * math.sqrt(var)
    assert ci.lo == pytest.approx(rep.score_ratio * math.exp(-half))
    assert ci.hi == pytest.approx(rep.score_ratio * math.exp(half))
    # the score's own interval holds the score
    assert rep.score_ci.lo < rep.score < rep.score_ci.hi
    text = render_text(rep)
    assert "score / baseline 95% CI: " in text and "(significant)" in text
    # against itself: ratio 1, within noise
    same = build_report(ours, baseline=ours)
    assert same.score_ratio == pytest.approx(1.0)
    assert same.score_ratio_ci.lo < 1 < same.score_ratio_ci.hi
    assert all(r["sig"] == "within noise" for r in same.rows)


def test_cli_and_html_show_node_score_and_intervals(tmp_path):
    from milarun.formats.summary import write_summary

    path = tmp_path / "s.json"
    write_summary(node_of(4), path)
    out = io.StringIO()
    html = tmp_path / "r.html"
    assert (
        run_report(
            str(path),
            stdout=out,
            warn=io.StringIO(),
            price=1000.0,
            compare=str(path),
            html=str(html),
        )
        == 0
    )
    text = out.getvalue()
    assert "node score: " in text and "score 95% CI: " in text and "within noise" in text
    page = html.read_text()
    for key in (
        'id="node-score"',
        'id="node-rpp"',
        'id="score-ci"',
        'id="noise-table"',
        'id="score-ratio-ci"',
    ):
        assert key in page
    rep = build_report(node_of(4), price=1000.0)
    assert f">{rep.node_score:.2f}<" in render_html(rep)


def test_extreme_but_valid_numbers_give_n_a_or_a_scaled_answer_never_a_traceback():
    # tiny stds: squares of the variances underflowed to 0 (ZeroDivisionError)
    same = confidence.welch_test((4, 100.0, 1e-160), (4, 100.0, 1e-160))
    assert same.df == pytest.approx(6.0) and not same.significant
    assert confidence.welch_test((4, 100.0, 1e-160), (4, 101.0, 1e-160)).significant
    tiny = confidence.geomean_interval(100.0, [(1.0, [(4, 100.0, 1e-150)])])
    assert tiny.df == pytest.approx(3.0) and tiny.lo == pytest.approx(100.0)
    assert confidence.log_variance(4, 1e-200, 1e-100) == pytest.approx(2.5e199)  # mean^2 == 0
    # huge ones: squares overflowed to inf (df nan: ValueError), bounds to -inf..inf
    assert confidence.welch_test((2, 1e308, 1e308), (4, 100.0, 3.0)).df == pytest.approx(1.0)
    assert confidence.mean_interval(2, 1e308, 1e308) is None
    assert confidence.geomean_interval(1.0, [(1.0, [(2, 1e-200, 1e-100)])]) is None
    ratio = confidence.geomean_interval(1e300, [(1.0, [(4, 1e300, 1e300)])])
    assert ratio.df == pytest.approx(3.0) and 0 < ratio.lo < 1e300 < ratio.hi
    # the scaled formulas agree with the textbook ones on ordinary numbers
    test = confidence.welch_test((4, 100.0, 3.0), (4, 110.0, 2.0))
    va, vb = 9 / 4, 4 / 4
    assert test.t == pytest.approx(-10 / math.sqrt(va + vb))
    assert test.df == pytest.approx((va + vb) ** 2 / (va**2 / 3 + vb**2 / 3))


def test_a_baseline_with_huge_numbers_reports_n_a(tmp_path):
    from milarun.errors import ResultFormatError
    from milarun.formats.summary import write_summary

    conv = entry("s.conv", {"0": [1.0, 2.0]})
    conv["train"].update(mean=1e308, std=1e308, max=1e308)
    # the schema bounds rates at 1e12 items/s (milarun.measure.stats.MAX_RATE): refused on read
    with pytest.raises(ResultFormatError, match="tests.s.conv.train.max: must be <= 1e"):
        make_summary(conv)
    # the extremes it allows (1e12 and 1e-9 items/s) still give no inf
    conv["train"].update(mean=1e12, std=1e12, max=1e12)
    tiny = entry("s.conv", {"0": [1.0, 2.0]})
    tiny["train"].update(mean=1e-9, std=1e-9, min=1e-9, max=1e-9)
    huge = make_summary(conv, entry("s.vae", {"0": [50.0, 52.0]}))
    path, low = tmp_path / "huge.json", tmp_path / "tiny.json"
    write_summary(huge, path)
    write_summary(make_summary(tiny, entry("s.vae", {"0": [50.0, 52.0]})), low)
    ours = tmp_path / "ours.json"
    write_summary(node_of(2), ours)
    for args in (
        (str(path), {}),
        (str(ours), {"compare": str(path)}),
        (str(path), {"compare": str(path)}),
        (str(path), {"compare": str(low)}),
    ):
        out = io.StringIO()
        assert run_report(args[0], stdout=out, warn=io.StringIO(), **args[1]) in (0, 1)
        assert "inf" not in out.getvalue().replace("info", "")
    wild = entry("s.conv", {"0": [1.0, 2.0]})
    wild["train"].update(mean=1e-9, std=1e12, min=0.0, max=1e12)  # the schema's extremes
    rep = build_report(make_summary(wild), penalize_variance=False)
    assert rep.score is not None
    assert rep.score_ci is None and "too wide" in rep.score_ci_note
    assert "too wide" in render_text(rep)


def test_one_run_intervals_say_they_leave_out_the_drift_between_runs(tmp_path):
    # two runs of one test: the summary counts them; one run: the report says what its
    # interval holds (the spread between that run's devices, not the run-to-run drift)
    recs = [
        record("s.conv", 100.0 + d + run, str(d), "h", run=run) for d in (0, 1) for run in (0, 1)
    ]
    repeated = summarize(recs)
    assert repeated["tests"]["s.conv"]["runs"] == 2
    single = summarize([r for r in recs if r["run"] == 0])
    assert single["tests"]["s.conv"]["runs"] == 1
    assert build_report(repeated, baseline=repeated).one_run == []
    rep = build_report(single, baseline=repeated)
    assert rep.one_run == ["these results"] and rep.score_ci is not None
    text = render_text(rep)
    assert "one run per test in these results:" in text and "--repeat 3" in text
    assert 'id="one-run"' in render_html(rep)
    assert build_report(repeated, baseline=single).one_run == ["the baseline"]
    assert "one run per test" not in render_text(build_report(repeated, baseline=repeated))
    # a summary written before runs were counted is taken as one run
    old = make_summary(entry("s.conv", {"0": [100.0], "1": [101.0]}))
    assert old["tests"]["s.conv"]["runs"] is None
    assert build_report(old).one_run == ["these results"]
    # no interval shown, nothing to qualify
    alone = build_report(make_summary(entry("s.one", {"0": [10.0]})))
    assert alone.score_ci is None and "one run per test" not in render_text(alone)


def test_a_baseline_runs_written_as_a_whole_float_is_that_many_runs(tmp_path):
    # JSON's 2.0 is an integer to the schema: read as 2 runs, not as "unknown, one run"
    recs = [
        record("s.conv", 100.0 + d + run, str(d), "h", run=run) for d in (0, 1) for run in (0, 1)
    ]
    repeated = summarize(recs)
    base = json.loads(json.dumps(repeated))
    base["tests"]["s.conv"]["runs"] = 2.0
    base = normalize_summary(base)
    assert base["tests"]["s.conv"]["runs"] == 2 and type(base["tests"]["s.conv"]["runs"]) is int
    assert build_report(repeated, baseline=base).one_run == []


def test_median_interval_is_the_sign_test_interval():
    from milarun.measure.confidence import median_interval

    # Conover's table: n = 6 -> (x1, x6), n = 12 -> (x3, x10), n = 16 -> (x4, x13) at 95 %
    assert median_interval([5, 1, 4, 2, 6, 3]) == (1, 6)
    assert median_interval(range(1, 13)) == (3, 10)
    assert median_interval(range(16, 0, -1)) == (4, 13)
    assert median_interval(range(5)) is None  # too few for 95 %
    # its coverage by simulation: at least 95 % of intervals hold the true median 0
    import random

    rng = random.Random(7)
    held = sum(
        lo <= 0 <= hi
        for lo, hi in (median_interval([rng.gauss(0, 1) for _ in range(12)]) for _ in range(2000))
    )
    assert held / 2000 >= 0.95
