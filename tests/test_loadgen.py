"""The serving load generator (milarun/bench/loadgen.py) against tests/serving_fake.py."""

import random
import socket
import statistics
import time
import tracemalloc

import pytest
from serving_fake import FakeServer, expected_text

from milarun.bench.loadgen import Endpoint, Limits, Load, Request, complete, run_level


def _free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _max_in_flight(cols):
    """The most requests in flight at once, from the send_s / e2e_s intervals."""
    events = []
    for s, e in zip(cols["send_s"], cols["e2e_s"]):
        events += [(s, 1), (s + e, -1)]
    most = now = 0
    for _, step in sorted(events, key=lambda x: (x[0], x[1])):  # an end before a send
        now += step
        most = max(most, now)
    return most


def _level(url, load, n_tokens=2, **kw):
    return run_level([Endpoint(url, "m")], [Request("hello", n_tokens)], Load.parse(load), **kw)


# -- timings


def test_concurrency_timings_and_round_robin():
    with FakeServer(ttft_ms=40, tpot_ms=10) as a, FakeServer(ttft_ms=40, tpot_ms=10) as b:
        ends = [Endpoint(a, "m"), Endpoint(b, "m", api="chat")]
        reqs = [Request("hello", 8), Request("other prompt", 8)]
        out = run_level(ends, reqs, Load("concurrency", 2), warmup=2, min_requests=6)
    cols = out["requests"]
    assert out["load"] == "concurrency" and out["value"] == 2 and out["stopped"] is None
    assert len(cols["send_s"]) == 8
    assert cols["error"] == [None] * 8
    assert cols["endpoint"] == [0, 1] * 4
    assert cols["output_tokens"] == [8] * 8
    assert cols["prompt_tokens"] == [1, 2] * 4  # the fake's usage: words of the prompt
    measured = range(2, 8)  # the first requests carry the client's one-time start costs
    for i in measured:
        assert 0.04 <= cols["ttft_s"][i] <= 0.09, cols["ttft_s"]
        assert 0.11 <= cols["e2e_s"][i] <= 0.11 + 0.08, cols["e2e_s"]
        assert len(cols["itl_us"][i]) == 7
    gaps = [g for i in measured for g in cols["itl_us"][i]]
    assert 9_000 <= statistics.median(gaps) <= 30_000
    assert all(isinstance(g, int) for g in gaps)
    assert cols["send_s"] == sorted(cols["send_s"])
    assert _max_in_flight(cols) == 2  # closed loop: exactly the 2 workers
    last_end = max(s + e for s, e in zip(cols["send_s"], cols["e2e_s"]))
    assert out["duration_s"] == pytest.approx(last_end, abs=1e-9)


def test_rate_is_a_seeded_open_loop_poisson_process():
    rate = 50.0

    def schedule(seed):
        rng = random.Random(seed)
        t, out = 0.0, []
        for _ in range(40):
            out.append(t)
            t += rng.expovariate(rate)
        return out

    with FakeServer(ttft_ms=100) as url:
        runs = [_level(url, f"rate:{rate}", min_requests=40, seed=s) for s in (1, 1, 2)]
    sends = [r["requests"]["send_s"] for r in runs]
    for run, seed in zip(runs, (1, 1, 2)):
        cols = run["requests"]
        assert cols["error"] == [None] * 40
        late = [s - e for s, e in zip(cols["send_s"], schedule(seed))]
        assert min(late) >= 0 and statistics.median(late) < 0.01 and max(late) < 0.1, late
        # open loop: requests sent while earlier ones (100 ms each) were still running
        assert _max_in_flight(cols) >= 3
    same = [abs(x - y) for x, y in zip(sends[0], sends[1])]
    assert statistics.median(same) < 0.01 and max(same) < 0.1
    assert max(abs(x - y) for x, y in zip(sends[0], sends[2])) > 0.05  # another seed
    mean_gap = (sends[0][-1] - sends[0][0]) / 39
    assert 0.6 / rate <= mean_gap <= 1.5 / rate


def test_burst_sends_warmup_one_by_one_then_all_at_once():
    with FakeServer(ttft_ms=30, tpot_ms=5) as url:
        out = _level(url, "burst:8", warmup=2, min_requests=50, min_duration_s=5.0)
    cols = out["requests"]
    assert len(cols["send_s"]) == 10 and cols["error"] == [None] * 10
    s, e = cols["send_s"], cols["e2e_s"]
    assert s[1] >= s[0] + e[0] and s[2] >= s[1] + e[1]  # warm-up: one after another
    assert max(s[2:]) - min(s[2:]) < 0.05
    assert _max_in_flight(cols) == 8


# -- how many requests


def test_warmup_and_min_requests_count():
    with FakeServer() as url:
        out = _level(url, "concurrency:1", warmup=2, min_requests=3)
    assert out["warmup"] == 2 and len(out["requests"]["send_s"]) == 5


def test_min_duration_keeps_sending():
    with FakeServer(ttft_ms=20) as url:
        out = _level(url, "concurrency:1", warmup=1, min_requests=1, min_duration_s=0.3)
    s, e = out["requests"]["send_s"], out["requests"]["e2e_s"]
    assert len(s) >= 5
    assert s[-1] - s[1] < 0.3  # a send only while the duration is not over
    assert s[-1] + e[-1] - s[1] >= 0.3  # and the last one ended past it


def test_max_requests_caps_every_load():
    with FakeServer() as url:
        assert (
            len(
                _level(url, "concurrency:2", min_duration_s=10, max_requests=6)["requests"]["error"]
            )
            == 6
        )
        capped = _level(url, "concurrency:3", warmup=2, min_requests=10, max_requests=4)
        assert len(capped["requests"]["error"]) == 4
        assert len(_level(url, "burst:8", warmup=1, max_requests=5)["requests"]["error"]) == 5
        rate = _level(url, "rate:500", min_duration_s=10, max_requests=7)
        assert len(rate["requests"]["error"]) == 7


# -- token counts


def test_on_tokens_and_count_tokens():
    seen = []
    with FakeServer() as url:
        out = _level(url, "concurrency:2", n_tokens=5, min_requests=4, on_tokens=seen.append)
        # usage wins over count_tokens
        used = _level(url, "concurrency:1", n_tokens=5, count_tokens=lambda t: 99)
    assert seen == [1] * 20 and sum(out["requests"]["output_tokens"]) == 20
    assert used["requests"]["output_tokens"] == [5]
    with FakeServer(no_usage=True) as url:
        chunks = _level(url, "concurrency:1", n_tokens=5, keep_text=True)
        counted = _level(url, "concurrency:1", n_tokens=5, count_tokens=lambda t: 10 * len(t))
    assert chunks["requests"]["output_tokens"] == [5]
    assert chunks["requests"]["prompt_tokens"] == [None]
    text = expected_text("hello", 5)
    assert chunks["requests"]["text"] == [text]
    assert counted["requests"]["output_tokens"] == [10 * len(text)]
    assert "text" not in counted["requests"]


# -- hostile endpoints


def test_unreachable_endpoint_fails_connect():
    out = _level(f"http://127.0.0.1:{_free_port()}", "concurrency:1", min_requests=2)
    cols = out["requests"]
    assert cols["error"] == ["connect", "connect"]
    assert cols["ttft_s"] == [None, None] and cols["output_tokens"] == [0, 0]
    assert all(e is not None and e < 5 for e in cols["e2e_s"])


def test_http_errors():
    with FakeServer(status=500) as url:
        assert _level(url, "concurrency:1", min_requests=2)["requests"]["error"] == ["http 500"] * 2
    with FakeServer(fail_every=3) as url:
        errors = _level(url, "concurrency:1", min_requests=6)["requests"]["error"]
    assert errors == [None, None, "http 500", None, None, "http 500"]


def test_malformed_line_fails_the_request():
    with FakeServer(malformed=True) as url:
        cols = _level(url, "concurrency:1", n_tokens=4)["requests"]
    assert cols["error"] == ["malformed stream"]
    assert cols["ttft_s"][0] is not None and cols["output_tokens"] == [1]


def test_endless_stream_meets_the_deadline_or_the_size_cap():
    with FakeServer(endless=True, tpot_ms=1) as url:
        t = time.monotonic()
        out = _level(url, "concurrency:2", min_requests=2, limits=Limits(request_timeout_s=0.5))
        assert time.monotonic() - t < 3
        assert out["requests"]["error"] == ["timeout", "timeout"]
        assert all(0.5 <= e < 1.5 for e in out["requests"]["e2e_s"])
        assert all(n > 10 for n in out["requests"]["output_tokens"])
        small = Limits(request_timeout_s=30, max_response_bytes=20_000)
        t = time.monotonic()
        assert _level(url, "concurrency:1", limits=small)["requests"]["error"] == ["too large"]
        assert time.monotonic() - t < 10


def test_huge_line_fails_with_bounded_memory():
    with FakeServer(huge=True, huge_bytes=256 * 2**20) as url:
        tracemalloc.start()
        try:
            t = time.monotonic()
            out = _level(url, "concurrency:1")
            elapsed = time.monotonic() - t
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert out["requests"]["error"] == ["too large"]
    assert peak < 8 * 2**20, peak  # the line is cut at max_line_bytes (1 MiB)
    assert elapsed < 10


def test_hang_times_out():
    with FakeServer(hang=True) as url:
        cols = _level(url, "concurrency:1", limits=Limits(request_timeout_s=0.3))["requests"]
    assert cols["error"] == ["timeout"] and cols["ttft_s"] == [None]
    assert 0.3 <= cols["e2e_s"][0] < 1.5


def test_server_dying_mid_run():
    with FakeServer(die_after=3) as url:
        cols = _level(url, "concurrency:1", min_requests=6)["requests"]
    assert cols["error"][:3] == [None] * 3 and cols["output_tokens"][:3] == [2] * 3
    assert cols["error"][3] in ("server closed", "connect")
    assert set(cols["error"][4:]) <= {"server closed", "connect"}
    assert cols["error"][-1] == "connect"  # nothing listens any more


def test_level_timeout_cancels_requests_in_flight():
    with FakeServer(tpot_ms=50, no_usage=True) as url:
        t = time.monotonic()
        out = _level(url, "concurrency:2", n_tokens=100, min_requests=2, timeout_s=0.5)
        assert time.monotonic() - t < 3.5
    cols = out["requests"]
    assert out["stopped"] == "timeout"
    assert cols["error"] == ["cancelled", "cancelled"]
    assert all(tt is not None for tt in cols["ttft_s"])
    assert all(0.45 <= e < 1.5 for e in cols["e2e_s"])  # what they measured so far
    assert all(3 <= n < 100 for n in cols["output_tokens"])
    with FakeServer(hang=True) as url:
        out = _level(url, "rate:20", min_requests=1000, timeout_s=0.8)
    cols = out["requests"]
    assert out["stopped"] == "timeout" and len(cols["error"]) >= 2
    assert set(cols["error"]) == {"cancelled"}
    assert set(cols["e2e_s"]) == {None}  # nothing came back: no end


# -- complete


def test_complete_returns_the_deterministic_text():
    prompts = ["one", "two words", "three"]
    with FakeServer() as url, FakeServer(tokens=[" x", " y"]) as wrong:
        right = complete(Endpoint(url, "m"), prompts, 6)
        chat = complete(Endpoint(url, "m", api="chat"), prompts, 6)
        other = complete(Endpoint(wrong, "m"), prompts, 6)
    want = [expected_text(p, 6) for p in prompts]
    assert [r["text"] for r in right] == want and [r["text"] for r in chat] == want
    assert len(set(want)) == 3  # the text depends on the prompt
    assert all(r["error"] is None and r["output_tokens"] == 6 for r in right + chat)
    assert [r["text"] for r in other] == [" x y x y x y"] * 3


def test_complete_reports_failures():
    with FakeServer(status=503) as url:
        out = complete(Endpoint(url, "m"), ["a"], 4)
    assert out == [{"text": "", "output_tokens": 0, "error": "http 503"}]


# -- arguments


@pytest.mark.parametrize(
    "text, kind, value",
    [("concurrency:4", "concurrency", 4), (" rate:2.5 ", "rate", 2.5), ("burst:16", "burst", 16)],
)
def test_load_parse(text, kind, value):
    assert Load.parse(text) == Load(kind, value)


@pytest.mark.parametrize(
    "text",
    ["", "concurrency", "concurrency:0", "concurrency:2.5", "rate:0", "rate:-1", "rate:nan",
     "rate:inf", "foo:3", "burst:x", "burst:-2"],
)  # fmt: skip
def test_load_parse_rejects(text):
    with pytest.raises(ValueError) as err:
        Load.parse(text)
    message = str(err.value)
    assert repr(text) in message and "concurrency:N" in message and "rate:R" in message
    assert "\n" not in message


def test_bad_arguments():
    with pytest.raises(ValueError, match="not http"):
        run_level([Endpoint("localhost:1", "m")], [Request("a", 1)], Load("burst", 1))
    with pytest.raises(ValueError, match="api"):
        complete(Endpoint("http://127.0.0.1:1", "m", api="embeddings"), ["a"], 1)
    with pytest.raises(ValueError, match="no request"):
        run_level([Endpoint("http://127.0.0.1:1", "m")], [], Load("burst", 1))
    with pytest.raises(ValueError, match="integer"):
        Load("concurrency", 1.5)
