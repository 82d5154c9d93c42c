"""Formula tests for milarun.measure.stats, against values computed by hand."""

import math

import pytest

from milarun.measure import stats


def sample(start, end, count, warmup=False):
    return {
        "start": start,
        "end": end,
        "count": count,
        "rate": count / (end - start),
        "warmup": warmup,
    }


def test_steady_state_uses_last_10s_before_final_second():
    # 2 warm-up samples, then 1 s steps from t=2 to t=22 (20 samples).
    samples = [sample(0, 1, 1, True), sample(1, 2, 2, True)]
    for i in range(20):
        t = 2 + i
        # rate 50 before the window, 100 inside [11, 21], 7 in the final second
        rate = 7 if t >= 21 else (100 if t >= 11 else 50)
        samples.append(sample(t, t + 1, rate))
    rate, chosen, note = stats.steady_state(samples)
    assert note == stats.FULL
    assert rate == pytest.approx(100.0)
    assert [s["start"] for s in chosen] == list(range(11, 21))


def test_steady_state_is_time_weighted():
    # window holds a 9 s sample of 900 items and a 1 s sample of 500 items:
    # sum(count)/sum(duration) = 1400/10 = 140, not mean(100, 500) = 300.
    samples = [sample(0, 2, 20, False), sample(2, 11, 900), sample(11, 12, 500), sample(12, 13, 1)]
    rate, chosen, note = stats.steady_state(samples)
    assert note == stats.FULL
    assert rate == pytest.approx(1400 / 10)
    assert len(chosen) == 2


def test_steady_state_short_run_uses_all_non_warmup_but_last_second():
    samples = [sample(0, 1, 1, True), sample(1, 2, 30), sample(2, 3, 50), sample(3, 4, 1)]
    rate, chosen, note = stats.steady_state(samples)
    assert note == stats.SHORT
    assert rate == pytest.approx((30 + 50) / 2)


def test_steady_state_without_steady_samples():
    assert stats.steady_state([]) == (None, [], stats.NONE)
    assert stats.steady_state([sample(0, 1, 5, True)])[2] == stats.NONE


def test_steady_state_rejects_bad_samples():
    with pytest.raises(ValueError):
        stats.steady_state([{"start": 0, "end": "x", "count": 1, "warmup": False}])


def test_describe_sample_std():
    d = stats.describe([100, 104, 96, 100])
    assert d["n"] == 4 and d["min"] == 96 and d["max"] == 104
    assert d["mean"] == pytest.approx(100)
    assert d["std"] == pytest.approx(math.sqrt(32 / 3))
    assert stats.describe([5])["std"] == 0.0
    assert stats.describe([])["mean"] is None


def test_cv():
    assert stats.cv(200, 10) == pytest.approx(0.05)
    assert stats.cv(None, None) == 0.0
    assert stats.cv(100, 0.0) == 0.0


def test_perf_adj_by_hand():
    # 100 * (1 - 0.05) * (1 - 1/4) = 71.25
    assert stats.perf_adj(100, 0.05, 1, 4) == pytest.approx(71.25)
    # without variance penalty: 100 * 0.75
    assert stats.perf_adj(100, 0.05, 1, 4, penalize_variance=False) == pytest.approx(75)
    assert stats.perf_adj(None, 0, 3, 3) == 0.0
    # std% over 100 % clamps to 0 instead of going negative
    assert stats.perf_adj(100, 1.5, 0, 2) == 0.0


def test_weighted_geomean_by_hand():
    # exp((1*ln 10 + 3*ln 1000) / 4) = 10 ** 2.5
    assert stats.weighted_geomean([10, 1000], [1, 3]) == pytest.approx(10**2.5)
    # weight 0 is ignored, even for a 0 value
    assert stats.weighted_geomean([0, 4], [0, 2]) == pytest.approx(4)
    assert stats.weighted_geomean([1], [0]) is None
    with pytest.raises(ValueError):
        stats.weighted_geomean([0, 4], [1, 1])
    with pytest.raises(ValueError):
        stats.weighted_geomean([float("nan")], [1])


@pytest.mark.parametrize("start,end", [(2.0, 1.0), (2, 1), (2, 1.5)])
def test_backwards_sample_is_refused(start, end):
    samples = [
        sample(0, 1, 1),
        {"start": start, "end": end, "count": 1, "rate": 1.0, "warmup": True},
    ]
    with pytest.raises(ValueError, match=f"samples.1: end {end!r} is before start {start!r}"):
        stats.steady_state(samples)


@pytest.mark.parametrize("start,end", [(float("inf"), 1.0), (0.0, float("-inf"))])
def test_an_infinite_bound_is_not_a_backwards_sample(start, end):
    # only finite numbers are compared (the schema refuses infinities in files)
    samples = [
        sample(0, 1, 1),
        {"start": start, "end": end, "count": 1, "rate": 1.0, "warmup": False},
    ]
    assert stats.steady_state(samples) == (None, [], stats.NONE)
