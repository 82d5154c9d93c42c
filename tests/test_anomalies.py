"""Anomaly rules (milarun.measure.anomalies) on recorded samples with planted stalls and slow
phases, and the flags in the summary."""

import copy
import json
import statistics
from pathlib import Path

import pytest

from milarun.analysis.summary import summarize
from milarun.measure import anomalies, stats

RECORDED = Path(__file__).parent / "fixtures" / "recorded" / "cpu.scaling.timings.json"


@pytest.fixture
def rec():
    """A real result's timings (43 windows of about 0.25 s, 4 warm-up), declared rule 3 s."""
    data = json.loads(RECORDED.read_text())
    data["timings"]["train"]["min_steady"] = 3.0
    return data


def samples(rec):
    return rec["timings"]["train"]["samples"]


def kinds(rec):
    return [f.id for f in anomalies.result_flags(rec)]


def shift(rec, after, seconds):
    """Move every window that starts at or after ``after`` later by ``seconds``."""
    for s in samples(rec):
        if s["start"] >= after:
            s["start"] += seconds
            s["end"] += seconds


def test_recorded_run_has_no_flag(rec):
    assert kinds(rec) == []


def test_recorded_run_without_a_declared_rule_is_short_against_11s(rec):
    rec["timings"]["train"]["min_steady"] = 0.0
    (flag,) = anomalies.result_flags(rec)
    steady = sum(s["end"] - s["start"] for s in samples(rec) if not s["warmup"])
    assert flag.as_dict() == {
        "kind": "short-steady",
        "device": "0",
        "run": 0,
        "steady_s": pytest.approx(steady),
        "required_s": 11.0,
        "rule": "window",
    }
    assert 10 < steady < 11
    assert "less than the 11 s of the steady-state rule" in anomalies.describe(flag)
    rec["timings"]["train"]["min_steady"] = 12.0
    assert anomalies.result_flags(rec)[0].figures["rule"] == "min-steady"


def test_planted_stall_inside_one_window(rec):
    # window 10 (steady) hangs for 20 s: its count stays, its duration grows
    win = samples(rec)[10]
    start = win["end"]
    shift(rec, start, 20.0)
    win["end"] += 20.0
    win["rate"] = win["count"] / (win["end"] - win["start"])
    flags = {f.id: f for f in anomalies.result_flags(rec)}
    assert set(flags) == {"stall", "slow-windows"}
    stall = flags["stall"]
    assert stall.figures["start"] == pytest.approx(win["start"])
    assert stall.figures["seconds"] == pytest.approx(win["end"] - win["start"])
    assert stall.figures["count"] == 1 and not stall.figures["at_end"]
    # a stall is 10 median windows (about 2.7 s here) or 2 s, whichever is longer
    steady = [s["end"] - s["start"] for s in samples(rec) if not s["warmup"]]
    assert stall.figures["threshold"] == pytest.approx(10 * statistics.median(steady))
    assert 2.0 < stall.figures["threshold"] < 3.0
    slow = flags["slow-windows"]
    assert slow.figures["windows"] == 1 and slow.figures["in_steady"] == 0  # before the 10 s window
    assert slow.figures["lowest"] == pytest.approx(win["rate"])


def test_planted_gap_between_windows_is_a_stall_only(rec):
    # no window at all for 6 s (the samples around it are normal)
    gap_at = samples(rec)[20]["start"]
    shift(rec, gap_at, 6.0)
    flags = anomalies.result_flags(rec)
    assert [f.id for f in flags] == ["stall"]
    assert flags[0].figures["seconds"] == pytest.approx(6.0 + (gap_at - samples(rec)[19]["end"]))
    # a 1 s gap is not a stall
    rec2 = json.loads(RECORDED.read_text())
    rec2["timings"]["train"]["min_steady"] = 3.0
    shift(rec2, samples(rec2)[20]["start"], 1.0)
    assert kinds(rec2) == []


def test_failed_result_that_hung_until_it_was_killed(rec):
    rec["success"] = False
    rec["error"] = {"reason": "timeout"}
    last = samples(rec)[-1]["end"]
    rec["timings"]["program"]["duration"] = last + 60.0
    (flag,) = anomalies.result_flags(rec)
    assert flag.id == "stall" and flag.figures["at_end"]
    assert flag.figures["seconds"] == pytest.approx(60.0)
    assert "until it ended" in anomalies.describe(flag)


def test_the_issue_case_a_long_slow_phase_then_fast(rec):
    """A recorded cpu.scaling.1: about 19 items/s for 70 s, then about 1300 items/s."""
    warm = [s for s in samples(rec) if s["warmup"]]
    fast = [s for s in samples(rec) if not s["warmup"]][-28:]  # about 7.5 s
    fast_rate, _, _ = stats.steady_state(warm + fast)
    t = warm[-1]["end"]
    slow = []
    for _ in range(41):  # one 32-item step every 1.7 s
        slow.append({"start": t, "end": t + 1.7, "count": 32, "rate": 32 / 1.7, "warmup": False})
        t += 1.7
    offset = t - fast[0]["start"]
    for s in fast:
        s["start"] += offset
        s["end"] += offset
    rec["timings"]["train"]["samples"] = warm + slow + fast
    flags = {f.id: f for f in anomalies.result_flags(rec)}
    assert set(flags) == {"slow-windows"}
    flag = flags["slow-windows"]
    # the reference is the fast phase's; every slow window is flagged and the ones
    # inside the 10 s steady-state window are counted as lowering the rate
    assert max(flag.figures["median"], flag.figures["best"]) > 500 and flag.figures["windows"] == 41
    assert flag.figures["seconds"] == pytest.approx(41 * 1.7)
    rate, chosen, _ = stats.steady_state(samples(rec))
    assert flag.figures["in_steady"] == sum(1 for s in chosen if s["rate"] < 20) >= 1
    assert "lowering the rate" in anomalies.describe(flag)
    assert rate < 0.75 * fast_rate  # what the flag explains: a much lower throughput


def test_recorded_issue_case_and_why_not_median_minus_k_mad():
    """A real cpu.scaling.1 of this machine: about 90 items/s for 60 s, then about 1000."""
    rec = json.loads((RECORDED.parent / "cpu.scaling.1-slow-phase.timings.json").read_text())
    rate, chosen, _ = stats.steady_state(samples(rec))
    flags = {f.id: f for f in anomalies.result_flags(rec)}
    flag = flags["slow-windows"]
    assert (
        flag.figures["best"] > 900
        and flag.figures["windows"] > 100
        and flag.figures["seconds"] > 55
    )
    assert flag.figures["in_steady"] > 5 and rate < 0.6 * flag.figures["best"]  # the rate it halved
    # median - 3.5 * 1.4826 * MAD of the steady-state windows: the window holds both
    # regimes, the MAD is so large that the cut is below zero and flags nothing
    rates = [s["rate"] for s in chosen]
    med = statistics.median(rates)
    mad = statistics.median(abs(r - med) for r in rates)
    assert med - 3.5 * 1.4826 * mad < 0


def test_noise_dips_are_not_flagged(rec):
    # one window at 40 % of the median (0.25 s): under the 1 s minimum
    samples(rec)[15]["rate"] *= 0.4
    assert kinds(rec) == []
    # windows at 70 % of the median: not "far below" (the floor is half the median)
    for s in samples(rec)[10:20]:
        s["rate"] *= 0.7
    assert kinds(rec) == []


def test_no_steady_state_is_a_failure_not_an_anomaly(rec):
    # milarun.measure.plausibility owns it: the summary judges the record failed (no-steady-state)
    for s in samples(rec):
        s["warmup"] = True
    assert kinds(rec) == []
    rec.update(version=1, name="cpu.x", suite="cpu", job_name="x", partition="normal", error=None)
    test = summarize([("/r/x.json", rec)])["tests"]["cpu.x"]
    assert test["failure_reasons"] == {"no-steady-state": 1} and test["anomalies"] == []


@pytest.mark.parametrize(
    "rates,expected",
    [
        ([100.0, 98.0, 102.0, 60.0], [(3, "low")]),  # one slow device of four
        ([100.0, 70.0], [(1, "low")]),  # two: the slower, 30 % below
        ([100.0, 85.0], []),  # 15 %: within the 20 % floor
        ([100.0, 100.0, 101.0, 150.0], [(3, "high")]),  # one far above, with 3 others
        ([100.0], []),
        ([100.0, 99.0, 101.0, 100.0, 100.5, 98.5, 99.5, 90.0], []),  # 10 % off: not an outlier
    ],
)
def test_outlier_rule_is_leave_one_out(rates, expected):
    results = [(str(i), 0, r) for i, r in enumerate(rates)]
    flags = anomalies.group_flags(results)
    assert [(i, f.figures["direction"]) for i, f in flags] == expected
    for i, f in flags:
        others = [r for j, r in enumerate(rates) if j != i]
        assert f.figures["ref"] == pytest.approx(
            sorted(others)[len(others) // 2]
            if len(others) % 2
            else sum(sorted(others)[len(others) // 2 - 1 : len(others) // 2 + 1]) / 2
        )


def test_outlier_rule_uses_the_mad_when_the_others_spread():
    # others spread widely (MAD-based margin > 20 %): 55 is within it
    flags = anomalies.group_flags(
        [("0", 0, 100.0), ("1", 0, 60.0), ("2", 0, 120.0), ("3", 0, 80.0), ("4", 0, 55.0)]
    )
    assert flags == []


def test_summary_holds_the_flags_with_their_files(rec):
    base = {
        "version": 1,
        "name": "cpu.scaling",
        "suite": "cpu",
        "job_name": "scaling",
        "partition": "per-gpu",
        "device_count": 1,
        "error": None,
        "host": {"hostname": "h", "cpu_model": "c", "milarun_version": "0.1.0"},
    }
    recs = []
    for dev, factor in (("0", 1.0), ("1", 1.0), ("2", 0.5)):
        r = copy.deepcopy(rec)
        r.update(base, device=dev, run=0, devices=[int(dev)], success=True)
        for s in samples(r):
            s["rate"] *= factor
            s["count"] *= factor
        recs.append((f"/r/cpu.scaling.J0.{dev}.json", r))
    # a stall in device 1
    win = samples(recs[1][1])[10]
    shift(recs[1][1], win["end"], 20.0)
    win["end"] += 20.0
    win["rate"] = win["count"] / (win["end"] - win["start"])
    summary = summarize(recs)
    flags = summary["tests"]["cpu.scaling"]["anomalies"]
    assert [(f["kind"], f["device"], f["file"]) for f in flags] == [
        ("slow-windows", "1", "cpu.scaling.J0.1.json"),
        ("stall", "1", "cpu.scaling.J0.1.json"),
        ("outlier", "2", "cpu.scaling.J0.2.json"),
    ]
    assert all("spans" not in f and "index" not in f for f in flags)
    assert summary["provenance"]["milarun"] == ["0.1.0"]
    assert summary["provenance"]["suites"] == ["cpu"]
    from milarun.formats.summary import check_summary, normalize_summary

    check_summary(summary)
    assert (
        normalize_summary(json.loads(json.dumps(summary)))["tests"]["cpu.scaling"]["anomalies"]
        == flags
    )


def test_interrupted_launches_get_no_flag(rec):
    rec.update(
        success=False,
        error={"reason": "interrupted"},
        device="0",
        run=0,
        version=1,
        name="cpu.x",
        suite="cpu",
        job_name="x",
        partition="normal",
    )
    rec["timings"]["program"]["duration"] = 1000.0
    summary = summarize([("/r/x.json", rec)])
    assert summary["tests"]["cpu.x"]["anomalies"] == []


def test_the_cpu_profile_declares_the_steady_state_it_meets():
    """profiles/cpu.json declares --min-steady of at least 3 s for every test (the last
    value on the command line wins; the time-bounded bf16 tests ask for more): the logger
    trains until each has that much steady state, so the short-steady rule holds it to
    that, not 11 s."""
    from milarun.profile.language import load_profile

    root = Path(__file__).parent.parent
    for job in load_profile(root / "profiles" / "cpu.json"):
        argv = job.argv()
        last = len(argv) - 1 - argv[::-1].index("--min-steady")
        assert float(argv[last + 1]) >= 3, job.full_name
    rec = json.loads(RECORDED.read_text())
    rec["timings"]["train"]["min_steady"] = 3.0
    assert anomalies.required_steady(rec["timings"]["train"]) == (3.0, "min-steady")
    assert anomalies.required_steady({"min_steady": 0.0}) == (11.0, "window")
