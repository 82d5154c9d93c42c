"""Request-level serving figures (milarun/measure/latency.py: level_figures, TARGETS),
each checked against arithmetic done by hand on small hand-built columns."""

import copy

import pytest

from milarun.measure.latency import TARGETS, level_figures, targets

# One warm-up request, then six measured ones: four succeed (one with a single output
# token, one with an unknown prompt length), one times out after 4 tokens without an
# end, one gets an HTTP 500 that ends 1.5 s after its send. Times are dyadic fractions,
# so every sum below is exact in floating point.
COLUMNS = {
    #                 warm-up  r1     r2    r3     r4         r5    r6
    "send_s": [0.0, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5],
    "ttft_s": [0.0625, 0.25, 0.5, 0.125, 0.5, 0.25, None],
    "e2e_s": [1.0, 1.25, 2.5, 0.125, None, 0.75, 1.5],
    "prompt_tokens": [10, 100, 200, 50, 80, None, 60],
    "output_tokens": [3, 5, 3, 1, 4, 2, 0],
    "itl_us": [
        [400_000, 100_000],
        [250_000] * 4,
        [500_000, 1_500_000],
        [],
        [100_000] * 3,
        [500_000],
        [],
    ],
    "error": [None, None, None, None, "timeout", None, "http 500"],
}


def figures(columns=None, warmup=1, ttft_slo_s=0.5, tpot_slo_s=0.5, **kw):
    return level_figures(
        copy.deepcopy(COLUMNS if columns is None else columns), warmup, ttft_slo_s, tpot_slo_s, **kw
    )


def test_counts_window_and_failures():
    f = figures()
    assert (f["requests"], f["completed"], f["failed"]) == (6, 4, 2)
    assert f["failures"] == {"timeout": 1, "http 500": 1}
    # Window: send of r1 (1.0) to the latest end, r6's 3.5 + 1.5 = 5.0 (a failure's end
    # counts; r4 never ended; the warm-up's end 1.0 is not measured).
    assert (f["window_start_s"], f["window_end_s"], f["duration_s"]) == (1.0, 5.0, 4.0)
    assert f["warmup"] == 1 and f["ttft_slo_s"] == 0.5 and f["tpot_slo_s"] == 0.5


def test_latency_percentiles_and_means():
    f = figures()
    # TTFT of r1, r2, r3, r5 sorted: .125 .25 .25 .5; nearest rank: p50 -> 2nd, p90 and
    # p99 -> 4th.
    assert (f["ttft_p50_s"], f["ttft_p90_s"], f["ttft_p99_s"]) == (0.25, 0.5, 0.5)
    assert f["ttft_mean_s"] == 1.125 / 4
    # E2E sorted: .125 .75 1.25 2.5.
    assert (f["e2e_p50_s"], f["e2e_p90_s"], f["e2e_p99_s"]) == (0.75, 2.5, 2.5)
    assert f["e2e_mean_s"] == 4.625 / 4
    # TPOT: r1 (1.25 - .25) / 4 = .25, r2 (2.5 - .5) / 2 = 1, r5 (.75 - .25) / 1 = .5;
    # r3 has one token. Sorted .25 .5 1: p50 -> 2nd (ceil 1.5), p90 -> 3rd.
    assert (f["tpot_p50_s"], f["tpot_p90_s"], f["tpot_p99_s"]) == (0.5, 1.0, 1.0)
    assert f["tpot_mean_s"] == pytest.approx(1.75 / 3)
    # ITL pooled over r1, r2, r5 (not the warm-up, not the failed r4), in s:
    # .25 .25 .25 .25 .5 .5 1.5: p50 -> 4th, p90 -> 7th (ceil 6.3).
    assert (f["itl_p50_s"], f["itl_p90_s"], f["itl_p99_s"]) == (0.25, 1.5, 1.5)
    assert f["itl_mean_s"] == 3.5 / 7
    assert f["ttft_at_slo_percentile_s"] == 0.5 and f["tpot_at_slo_percentile_s"] == 1.0


def test_throughputs():
    f = figures()
    assert f["request_throughput"] == 4 / 4.0
    # Prompt tokens of completed requests: 100 + 200 + 50 + (r5 unknown: 0).
    assert f["input_tokens_per_s"] == 350 / 4.0 and f["input_tokens_known"] is False
    # Output tokens of every measured request, failed r4's 4 included: 5+3+1+4+2+0.
    assert f["output_tokens_per_s"] == 15 / 4.0
    # Per user: median of 1/TPOT = median(4, 1, 2).
    assert f["output_tokens_per_s_per_user"] == 2.0


def test_goodput_and_slo():
    f = figures()
    # SLO 0.5 s / 0.5 s: r1 good (5 tokens), r2 not (TPOT 1), r3 good (one token),
    # r5 good (TTFT .25, TPOT exactly .5; 2 tokens); r4 and r6 failed.
    assert f["goodput_requests_per_s"] == 3 / 4.0
    assert f["goodput_tokens_per_s"] == 8 / 4.0
    assert f["goodput_fraction"] == 3 / 6
    # Failures alone fail the level, and p99 TPOT 1.0 > 0.5 too.
    assert f["slo_met"] is False and f["slo_percentile"] == 99.0
    loose = figures(tpot_slo_s=1.0)
    assert loose["goodput_fraction"] == 4 / 6 and loose["slo_met"] is False


def test_prompt_tokens_known_when_every_completed_request_has_them():
    cols = copy.deepcopy(COLUMNS)
    cols["prompt_tokens"][5] = 70
    cols["prompt_tokens"][6] = None  # a failed request's unknown count does not matter
    f = figures(cols)
    assert f["input_tokens_known"] is True and f["input_tokens_per_s"] == 420 / 4.0


def test_goodput_boundaries():
    eps = 2.0**-20
    cols = {
        "send_s": [0.0, 0.0, 0.0, 0.0],
        # a: exactly at both bounds; b: TTFT just over; c: TPOT just over;
        # d: one token, its late end is no TPOT.
        "ttft_s": [0.5, 0.5 + eps, 0.5, 0.5],
        "e2e_s": [1.0, 1.0, 1.0 + 2 * eps, 5.0],
        "prompt_tokens": [1, 1, 1, 1],
        "output_tokens": [3, 3, 3, 1],
        "itl_us": [[], [], [], []],
        "error": [None] * 4,
    }
    f = figures(cols, warmup=0, ttft_slo_s=0.5, tpot_slo_s=0.25)
    assert f["duration_s"] == 5.0
    assert f["goodput_fraction"] == 2 / 4
    assert f["goodput_requests_per_s"] == 2 / 5.0 and f["goodput_tokens_per_s"] == 4 / 5.0
    # p99 TTFT is b's 0.5 + eps: over the bound.
    assert f["slo_met"] is False


def test_slo_met_at_a_chosen_percentile():
    cols = {
        "send_s": [0.0, 1.0, 2.0, 3.0],
        "ttft_s": [0.25, 0.25, 0.25, 3.0],
        "e2e_s": [0.75, 0.75, 0.75, 3.5],
        "prompt_tokens": [8, 8, 8, 8],
        "output_tokens": [3, 3, 3, 3],  # every TPOT (0.5 s / 2) = 0.25
        "itl_us": [[250_000, 250_000]] * 4,
        "error": [None] * 4,
    }
    # p99 TTFT -> 4th of 4 = 3.0 > 2.0; p50 -> 2nd = 0.25.
    assert figures(cols, 0, ttft_slo_s=2.0, tpot_slo_s=0.25)["slo_met"] is False
    met = figures(cols, 0, ttft_slo_s=2.0, tpot_slo_s=0.25, slo_percentile=50.0)
    assert met["slo_met"] is True and met["ttft_at_slo_percentile_s"] == 0.25
    assert met["tpot_at_slo_percentile_s"] == 0.25
    # TPOT just over its bound fails the level whatever the TTFT.
    assert figures(cols, 0, 2.0, 0.2, slo_percentile=50.0)["slo_met"] is False


def test_slo_met_without_any_tpot():
    cols = {
        "send_s": [0.0, 1.0],
        "ttft_s": [0.25, 0.5],
        "e2e_s": [0.25, 0.5],
        "prompt_tokens": [8, 8],
        "output_tokens": [1, 1],
        "itl_us": [[], []],
        "error": [None, None],
    }
    f = figures(cols, 0, ttft_slo_s=0.5, tpot_slo_s=0.01)
    assert f["tpot_p99_s"] is None and f["output_tokens_per_s_per_user"] is None
    assert f["slo_met"] is True
    assert figures(cols, 0, ttft_slo_s=0.25, tpot_slo_s=0.01)["slo_met"] is False


def test_no_measured_request_gives_no_rates():
    f = figures(warmup=len(COLUMNS["send_s"]))
    assert (f["requests"], f["completed"], f["failed"], f["failures"]) == (0, 0, 0, {})
    assert f["duration_s"] is None and f["window_start_s"] is None
    for key in (
        "request_throughput",
        "input_tokens_per_s",
        "output_tokens_per_s",
        "goodput_requests_per_s",
        "goodput_tokens_per_s",
        "goodput_fraction",
        "ttft_p50_s",
        "ttft_mean_s",
        "itl_p99_s",
        "output_tokens_per_s_per_user",
    ):
        assert f[key] is None, key
    assert f["slo_met"] is False


def test_zero_duration_and_no_end_give_no_rates():
    instant = {
        "send_s": [1.0],
        "ttft_s": [0.0],
        "e2e_s": [0.0],
        "prompt_tokens": [4],
        "output_tokens": [1],
        "itl_us": [[]],
        "error": [None],
    }
    f = figures(instant, 0)
    assert f["duration_s"] == 0.0 and f["completed"] == 1
    assert f["request_throughput"] is None and f["output_tokens_per_s"] is None
    assert f["goodput_requests_per_s"] is None and f["goodput_fraction"] == 1.0
    never = dict(instant, ttft_s=[None], e2e_s=[None], output_tokens=[0], error=["timeout"])
    g = figures(never, 0)
    assert g["duration_s"] is None and g["window_end_s"] is None and g["window_start_s"] == 1.0
    assert g["output_tokens_per_s"] is None and g["failures"] == {"timeout": 1}


def test_failure_reasons_without_an_error_string():
    cols = {
        "send_s": [0.0, 0.0, 0.0],
        "ttft_s": [None, 0.5, 0.5],
        "e2e_s": [1.0, None, 1.0],
        "prompt_tokens": [1, 1, 1],
        "output_tokens": [0, 2, 0],
        "itl_us": [[], [], []],
        "error": [None, None, None],
    }
    f = figures(cols, 0)
    assert f["completed"] == 0 and f["failures"] == {"no token": 2, "no end": 1}


def test_zero_tpot_has_no_per_user_rate():
    cols = {
        "send_s": [0.0, 0.0],
        "ttft_s": [0.5, 0.5],
        "e2e_s": [0.5, 1.0],  # the first request's two tokens came at once: TPOT 0
        "prompt_tokens": [1, 1],
        "output_tokens": [2, 2],
        "itl_us": [[0], [500_000]],
        "error": [None, None],
    }
    f = figures(cols, 0)
    assert f["tpot_p50_s"] == 0.0 and f["output_tokens_per_s_per_user"] == 1 / 0.5


def test_failure_reasons_are_cut_and_bounded():
    # 18 distinct reasons, e17 three times, then one 100 characters long twice.
    errors = [f"e{i:02d}" for i in range(18)] + ["e17", "e17"] + ["x" * 100] * 2
    n = len(errors)
    cols = {
        "send_s": [0.0] * n,
        "ttft_s": [None] * n,
        "e2e_s": [1.0] * n,
        "prompt_tokens": [None] * n,
        "output_tokens": [0] * n,
        "itl_us": [[] for _ in range(n)],
        "error": errors,
    }
    f = figures(cols, 0)
    # Kept: e17 (3), "x" * 64 (2), then the first 14 single reasons e00..e13; e14, e15
    # and e16 (one each) go to "other".
    expected = {"e17": 3, "x" * 64: 2, **{f"e{i:02d}": 1 for i in range(14)}, "other": 3}
    assert f["failures"] == expected and f["failed"] == n


def _set(column, index, value):
    def edit(cols):
        cols[column][index] = value

    return edit


HOSTILE = [
    ("send_s", lambda c: c.pop("send_s")),
    ("itl_us", lambda c: c.pop("itl_us")),
    ("e2e_s", lambda c: c["e2e_s"].pop()),
    ("error", lambda c: c["error"].append(None)),
    ("prompt_tokens", lambda c: c.update(prompt_tokens="1234567")),
    ("send_s", _set("send_s", 2, True)),
    ("send_s", _set("send_s", 2, None)),
    ("send_s", _set("send_s", 2, "1.5")),
    ("send_s", _set("send_s", 2, -1.0)),
    ("ttft_s", _set("ttft_s", 2, float("nan"))),
    ("ttft_s", _set("ttft_s", 2, 3.0)),  # after the response's end (2.5)
    ("ttft_s", _set("ttft_s", 2, False)),
    ("e2e_s", _set("e2e_s", 2, float("inf"))),
    ("e2e_s", _set("e2e_s", 2, -0.5)),
    ("prompt_tokens", _set("prompt_tokens", 2, -3)),
    ("prompt_tokens", _set("prompt_tokens", 2, 3.0)),
    ("output_tokens", _set("output_tokens", 2, True)),
    ("output_tokens", _set("output_tokens", 2, None)),
    ("output_tokens", _set("output_tokens", 2, 2.5)),
    ("itl_us", _set("itl_us", 2, "500")),
    ("itl_us", _set("itl_us", 2, [500_000, -1])),
    ("itl_us", _set("itl_us", 2, [0.5])),
    ("itl_us", _set("itl_us", 2, [True])),
    ("error", _set("error", 2, 500)),
]


@pytest.mark.parametrize("column, edit", HOSTILE)
def test_hostile_columns_raise_naming_the_column(column, edit):
    cols = copy.deepcopy(COLUMNS)
    edit(cols)
    with pytest.raises(ValueError, match=rf"^{column}\b") as err:
        level_figures(cols, 1, 0.5, 0.5)
    assert "\n" not in str(err.value)


def test_columns_not_a_dict():
    with pytest.raises(ValueError, match="^columns"):
        level_figures([["send_s", []]], 0, 0.5, 0.5)


@pytest.mark.parametrize("warmup", [-1, 8, True, 1.0, None])
def test_bad_warmup(warmup):
    with pytest.raises(ValueError, match="^warmup"):
        level_figures(copy.deepcopy(COLUMNS), warmup, 0.5, 0.5)


@pytest.mark.parametrize(
    "args, name",
    [
        ((0.0, 0.5, 99.0), "ttft_slo_s"),
        ((float("nan"), 0.5, 99.0), "ttft_slo_s"),
        ((0.5, -1.0, 99.0), "tpot_slo_s"),
        ((0.5, True, 99.0), "tpot_slo_s"),
        ((0.5, 0.5, 0.0), "slo_percentile"),
        ((0.5, 0.5, 101.0), "slo_percentile"),
    ],
)
def test_bad_bounds(args, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        level_figures(copy.deepcopy(COLUMNS), 1, *args)


def test_the_whole_warmup_may_be_every_request_and_zero():
    assert figures(warmup=0)["requests"] == 7
    assert figures(warmup=7)["requests"] == 0


def test_targets():
    assert targets("llama2-70b-server") == (2.0, 0.200)
    assert targets("llama2-70b-interactive") == (0.45, 0.040)
    assert targets("llama3.1-8b-server") == (2.0, 0.100)
    assert targets("llama3.1-8b-interactive") == (0.5, 0.030)
    assert targets("llama3.1-405b-server") == (6.0, 0.175)
    assert targets("llama3.1-405b-interactive") == (4.5, 0.080)
    assert len(TARGETS) == 6
    with pytest.raises(ValueError, match="llama2-70b-server") as err:
        targets("llama2-70b")
    assert "llama3.1-405b-interactive" in str(err.value)
