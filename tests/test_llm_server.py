"""llm_server, the Server scenario, on CPU: a tiny model behind `transformers serve` with
continuous batching driven at fixed concurrency, at a Poisson rate and in a burst (every
figure recomputed here from the raw request timings, by code of this file), the
consistency check passing against it; the fake server of tests/serving_fake.py with known
delays (known TTFT, TPOT and goodput), with a queue (the capacity search converges on a
known capacity) and with wrong tokens (the consistency check fails); servers that die, never
become ready or cannot be reached; bad options."""

import json
import math
import statistics
import sys
from pathlib import Path

import pytest
from conftest import ROOT, build_tiny, recorded_level, run_model
from serving_fake import FakeServer

from milarun.analysis.llm import server_figures
from milarun.formats.record import validate

FN = "milarun.models.llm_server:main"
FAKE = str(ROOT / "tests" / "serving_fake.py")
BASE = [
    "--sample-duration",
    "0.05",
    "--warmup",
    "1",
    "--max-count",
    "1",
    "--device",
    "cpu",
    "--shape",
    "tiny",
    "--precision",
    "fp32",
    "--prompt-len",
    "16",
    "--warmup-requests",
    "1",
    "--ready-timeout",
    "120",
    "--request-timeout",
    "30",
    "--level-timeout",
    "120",
]
#: transformers serve's KV cache, kept small (it sizes it from the host's memory otherwise)
CB = ["--engine-args", "--cb-num-blocks 128 --cb-block-size 16 --cb-max-batch-tokens 256"]


@pytest.fixture(scope="module")
def root(tiny_dataroot):
    return build_tiny(tiny_dataroot, "llm_corpus")


def nearest_rank(values, p):
    """The p-th percentile by nearest rank, written here again (not milarun's)."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


def recompute(level):
    """TTFT, TPOT and output tokens/s of a recorded level from its raw timings."""
    cols, w = level["requests"], level["warmup"]
    rows = list(zip(*(cols[k] for k in ("send_s", "ttft_s", "e2e_s", "output_tokens", "error"))))
    measured = rows[w:]
    ok = [r for r in measured if r[4] is None]
    start = min(r[0] for r in measured)
    end = max(r[0] + r[2] for r in measured if r[2] is not None)
    tpot = [(r[2] - r[1]) / (r[3] - 1) for r in ok if r[3] > 1]
    return {
        "completed": len(ok),
        "ttft_p50_s": nearest_rank([r[1] for r in ok], 50),
        "ttft_p99_s": nearest_rank([r[1] for r in ok], 99),
        "tpot_p50_s": nearest_rank(tpot, 50),
        "tpot_mean_s": statistics.fmean(tpot),
        "output_tokens_per_s": sum(r[3] for r in measured) / (end - start),
        "itl_p50_s": nearest_rank(
            [g / 1e6 for r, gaps in zip(rows, cols["itl_us"]) if r in ok for g in gaps], 50
        ),
    }


def _record(res):
    assert res["_exit_code"] in (0, 1)
    rec = {k: v for k, v in res.items() if k != "_exit_code"}
    validate(rec)
    return rec


@pytest.mark.slow
def test_transformers_serve_three_load_models_and_consistency(root, tmp_path):
    argv = [*BASE, *CB, "--output-len", "6", "--requests", "6", "--consistency", "2"]
    res = run_model(FN, [*argv, "--load", "concurrency:2,rate:20,burst:4"], root, tmp_path)
    rec = _record(res)
    assert res["success"], res["error"]
    load = rec["serving_load"]
    server = load["server"]
    assert server["started_by_milarun"] and server["engine"] == "transformers"
    assert "--continuous-batching" in server["argv"] and server["exit_status"] is not None
    log = tmp_path / server["log"]
    assert log.exists() and "Uvicorn running" in log.read_text()
    assert [(lv["load"], lv["value"]) for lv in load["levels"]] == [
        ("concurrency", 2),
        ("rate", 20),
        ("burst", 4),
    ]
    for lv in load["levels"]:
        cols = lv["requests"]
        assert lv["warmup"] == 1 and all(e is None for e in cols["error"])
        assert set(cols["output_tokens"]) == {6}  # max_tokens honoured: no early stop
        mine = recompute(lv)
        figures = lv["figures"]
        for key, value in mine.items():
            assert figures[key] == pytest.approx(value, rel=1e-9), key
    # burst: every measured request sent at once; concurrency: 2 in flight at most
    burst = load["levels"][2]["requests"]["send_s"][1:]
    assert max(burst) - min(burst) < 0.05 and len(burst) == 4
    conc = load["levels"][0]["requests"]
    spans = [(s, s + e) for s, e in zip(conc["send_s"], conc["e2e_s"])]
    assert max(sum(a <= t < b for a, b in spans) for t, _ in spans) <= 2
    # the rate logger counted the first level's output tokens (warm-up request included)
    assert rec["timings"]["train"]["count"] == sum(conc["output_tokens"])
    assert load["consistency"] == {
        "prompts": 2,
        "tokens": 16,
        "matching": 2,
        "passed": True,
        "mismatches": [],
    }
    # the summary recomputes the same figures from the timings
    summary = server_figures([rec])
    assert summary["measured"] == {"load": "concurrency", "value": 2.0}
    first = next(lv for lv in summary["levels"] if lv["load"] == "concurrency")
    assert first["ttft_p99_s"] == pytest.approx(recompute(load["levels"][0])["ttft_p99_s"])
    assert summary["consistency"] == {"records": 1, "passed": True, "failed": 0}


def test_known_delays_give_known_latency_and_goodput(root, tmp_path):
    # 60 ms to the first token, 15 ms between tokens, 5 tokens: TTFT 60 ms, TPOT 15 ms
    argv = [*BASE, "--output-len", "5", "--requests", "8", "--load", "concurrency:2"]
    with FakeServer(ttft_ms=60, tpot_ms=15) as url:
        good = run_model(
            FN,
            [*argv, "--endpoint", url, "--ttft-slo", "500", "--tpot-slo", "100"],
            root,
            tmp_path / "good",
        )
        bad = run_model(
            FN,
            [*argv, "--endpoint", url, "--ttft-slo", "30", "--tpot-slo", "100"],
            root,
            tmp_path / "bad",
        )
    for res in (good, bad):
        assert res["success"], res["error"]
        assert not res["serving_load"]["server"]["started_by_milarun"]
        assert res["serving_load"]["server"]["endpoints"][0]["server"] == "fake/1"
    fig = _record(good)["serving_load"]["levels"][0]["figures"]
    assert 0.060 <= fig["ttft_p50_s"] < 0.060 + 0.05
    assert 0.015 <= fig["tpot_p50_s"] < 0.015 + 0.015
    assert 0.015 * 0.9 <= fig["itl_p50_s"] < 0.015 + 0.015
    assert fig["goodput_fraction"] == 1.0 and fig["slo_met"] is True
    assert fig["goodput_tokens_per_s"] == pytest.approx(fig["output_tokens_per_s"])
    fig = _record(bad)["serving_load"]["levels"][0]["figures"]
    assert fig["goodput_fraction"] == 0.0 and fig["goodput_requests_per_s"] == 0.0
    assert fig["slo_met"] is False and fig["completed"] == fig["requests"]


def test_capacity_search_finds_the_queue_of_a_two_slot_server(root, tmp_path):
    # Two requests served at once, 100 ms to the first token, 4 tokens 20 ms apart: a
    # request is served in 160 ms. At concurrency c, the last of c requests sent together
    # waits ceil(c / 2) - 1 services: TTFT 100 ms (c ≤ 2), 260 ms (c ≤ 4), 420 ms (c ≤ 6).
    # A 340 ms TTFT target holds up to 4 concurrent requests: the capacity is 4, found by
    # 1, 2, 4 (pass), 8 (fail), then 6 and 5 (fail).
    argv = [*BASE, "--output-len", "4", "--requests", "6", "--warmup-requests", "0"]
    targets = ["--ttft-slo", "340", "--tpot-slo", "1000"]
    search = ["--load", "", "--capacity", "concurrency", "--capacity-max", "16"]
    with FakeServer(ttft_ms=100, tpot_ms=20, slots=2) as url:
        res = run_model(FN, [*argv, *targets, *search, "--endpoint", url], root, tmp_path)
    assert res["success"], res["error"]
    cap = _record(res)["serving_load"]["capacity"]
    assert cap["steps"] == [[1, True], [2, True], [4, True], [8, False], [6, False], [5, False]]
    assert cap["capacity"] == 4 and cap["reason"] == "converged"
    assert res["metrics"]["capacity_concurrency"] == 4
    summary = server_figures([_record(res)])
    assert summary["capacity"] == {"load": "concurrency", "value": 4, "records": 1}
    assert summary["measured"] is None  # only the search ran


def test_consistency_fails_against_a_server_with_other_tokens(root, tmp_path):
    argv = [*BASE, "--output-len", "4", "--requests", "2", "--load", "concurrency:1"]
    with FakeServer(tokens=["zz"]) as url:
        res = run_model(FN, [*argv, "--endpoint", url, "--consistency", "2"], root, tmp_path)
    assert res["success"], res["error"]
    check = _record(res)["serving_load"]["consistency"]
    assert check["passed"] is False and check["mismatches"] == [0, 1]
    assert server_figures([_record(res)])["consistency"] == {
        "records": 1,
        "passed": False,
        "failed": 1,
    }


def test_a_server_that_dies_mid_run_is_a_fail_record_with_its_requests(root, tmp_path):
    # The engine is the fake as a script; it crashes at its 6th request (the 1st primes it).
    cmd = f"{sys.executable} {FAKE} --port {{port}} --tpot-ms 5 --die-after 5"
    argv = [*BASE, "--output-len", "3", "--requests", "50", "--load", "concurrency:1"]
    res = run_model(FN, [*argv, "--engine", "command", "--engine-command", cmd], root, tmp_path)
    rec = _record(res)
    assert not res["success"] and rec["error"]["reason"] == "error"
    assert "the server exited with status 1 during concurrency:1" in rec["error"]["message"]
    (level,) = rec["serving_load"]["levels"]
    errors = level["requests"]["error"]
    assert errors[:4] == [None] * 4 and errors[4] is not None  # measured before the crash
    assert rec["serving_load"]["server"]["exit_status"] == 1


def test_a_server_never_ready_and_an_unreachable_endpoint_fail_in_one_line(root, tmp_path):
    cmd = f"{sys.executable} {FAKE} --port {{port}} --ready-after-s 100"
    argv = [*BASE, "--output-len", "3", "--requests", "2", "--ready-timeout", "2"]
    res = run_model(FN, [*argv, "--engine", "command", "--engine-command", cmd], root, tmp_path)
    assert not res["success"] and "not ready after 2" in res["error"]["message"]
    assert res["serving_load"]["levels"] == []
    # the engine that never became ready was stopped (SIGTERM), not left running
    assert res["serving_load"]["server"]["exit_status"] == -15
    res = run_model(FN, [*argv, "--endpoint", "http://127.0.0.1:9"], root, tmp_path / "u")
    assert not res["success"] and "127.0.0.1:9" in res["error"]["message"]
    assert "\n" not in res["error"]["message"]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--load", "steady:3"], "--load"),
        (["--load", "rate:0"], "--load"),
        (["--load", ""], "nothing to run"),
        (["--targets-preset", "llama9"], "llama3.1-8b-server"),
        (["--extra-body", "[1]"], "--extra-body must be a JSON object"),
        (["--extra-body", '{"stream": false}'], "sets stream"),
        (["--engine", "ollama"], "--engine must be one of"),
        (["--engine", "command"], "--engine-command go together"),
        (["--capacity", "tokens"], "--capacity must be"),
        (["--lengths", "zipf"], "--lengths"),
    ],
)
def test_bad_options_are_one_line(root, tmp_path, extra, message):
    res = run_model(FN, [*BASE, *extra], root, tmp_path)
    assert not res["success"]
    assert message in res["error"]["message"] and "\n" not in res["error"]["message"]
    assert "serving_load" not in res  # refused before anything ran


def test_chat_lengths_are_long_tailed_and_seeded(root):
    from tokenizers import Tokenizer

    from milarun.datasets.llm_corpus import TokenShards
    from milarun.models.llm_server import Settings, build_requests

    shards = TokenShards(Path(root) / "llm_corpus")
    tok = Tokenizer.from_file(str(Path(root) / "llm_corpus" / "tokenizer.json"))
    opts = json.loads(
        json.dumps(
            {
                "shape": "tiny",
                "engine": "transformers",
                "engine_args": "",
                "engine_command": "",
                "tensor_parallel": 1,
                "endpoint": "",
                "served_model": "",
                "api": "completions",
                "extra_body": "",
                "load": "concurrency:1",
                "capacity": "",
                "capacity_start": 1.0,
                "capacity_max": 8.0,
                "capacity_steps": 4,
                "targets_preset": "",
                "ttft_slo_ms": 2000.0,
                "tpot_slo_ms": 100.0,
                "slo_percentile": 99.0,
                "prompt_len": 0,
                "output_len": 64,
                "lengths": "chat",
                "warmup_requests": 0,
                "requests": 1,
                "duration": 0.0,
                "max_requests": 0,
                "request_timeout": 1.0,
                "level_timeout": 1.0,
                "ready_timeout": 1.0,
                "consistency": 0,
                "consistency_tokens": 1,
                "precision": "fp32",
            }
        )
    )
    a = build_requests(shards, tok, Settings(**opts), seed=3)
    b = build_requests(shards, tok, Settings(**opts), seed=3)
    outs = [r.max_tokens for r in a]
    assert outs == [r.max_tokens for r in b]
    assert min(outs) >= 2 and max(outs) <= 64
    assert statistics.median(outs) < statistics.mean(outs)  # a long right tail
    assert len({len(r.prompt) for r in a}) > 5  # the dataset's mixed prompt lengths


def _level(load, value, ttfts, tpot_s, tokens=5, figures=None):
    """A recorded level of requests sent 0.1 s apart with these TTFTs and one TPOT."""
    rows = [(0.1 * i, t, tpot_s, tokens) for i, t in enumerate(ttfts)]
    return {**recorded_level(load, value, rows), "figures": figures or {}}


def test_the_summary_recomputes_levels_and_rejudges_the_capacity_search():
    targets = {"name": None, "ttft_s": 0.5, "tpot_s": 0.05, "percentile": 99.0}
    honest = {
        "targets": targets,
        "levels": [
            _level("rate", 2.0, [0.1, 0.2, 0.3], 0.02),
            _level("rate", 4.0, [0.2, 0.3, 0.4], 0.03),
            _level("rate", 8.0, [0.2, 0.3, 0.9], 0.03),  # p99 TTFT 0.9 s: over
        ],
        # the bidder claims 8 passed: the summary re-judges it from the timings
        "capacity": {"kind": "rate", "capacity": 8.0, "reason": "x", "steps": [], "levels": [1, 2]},
        "consistency": {"prompts": 1, "tokens": 4, "matching": 1, "passed": True, "mismatches": []},
    }
    # a second server: its own figures claim a TTFT of 0 s, which is never read
    claimed = {"ttft_p50_s": 0.0, "goodput_fraction": 1.0}
    other = {
        "targets": targets,
        "levels": [_level("rate", 2.0, [0.3, 0.4, 0.6], 0.02, figures=claimed)],
    }
    bad = {
        "targets": targets,
        "levels": [{"load": "rate", "value": 2.0, "warmup": 0, "requests": {"send_s": [0.0]}}],
    }
    out = server_figures([{"serving_load": honest}, {"serving_load": other}, {"serving_load": bad}])
    assert out["targets"] == targets and out["malformed"] == 1
    assert out["measured"] == {"load": "rate", "value": 2.0}
    two, four, eight = out["levels"]
    assert (two["value"], two["records"], two["requests"]) == (2.0, 2, 6)
    # medians over the two servers of TTFT p50: 0.2 s and 0.4 s
    assert two["ttft_p50_s"] == pytest.approx(0.3)
    # the second server's 0.6 s TTFT request is not good: 5 of 6 over both, per-server medians
    assert two["goodput_fraction"] == pytest.approx((1.0 + 2 / 3) / 2)
    assert two["slo_met"] is False and four["slo_met"] is True and eight["slo_met"] is False
    assert out["capacity"] == {"load": "rate", "value": 4.0, "records": 1}
    assert out["consistency"] == {"records": 1, "passed": True, "failed": 0}
    assert server_figures([{"metrics": {}}]) is None


def test_a_started_engine_runs_offline_with_an_empty_hub_cache_of_its_own(tmp_path, monkeypatch):
    """transformers 5.17's serve answers /v1/models from the hub cache and fails without one:
    the engine milarun starts gets its own, an existing empty folder beside the model."""
    import types

    from milarun.models import llm_server

    seen = {}

    class Recorder:
        def __init__(self, argv, log, url, env):
            seen.update(argv=argv, env=env)

        def start(self):
            pass

        def wait_ready(self, timeout):
            return 0.0

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "a-user-cache-that-does-not-exist"))
    monkeypatch.setattr(llm_server.engines, "Server", Recorder)
    monkeypatch.setattr(llm_server.engines, "describe", lambda url: {"url": url})
    model = tmp_path / "llm_server" / "tiny-fp32-seed0"
    model.mkdir(parents=True)
    s = types.SimpleNamespace(
        tensor_parallel=1,
        precision="fp32",
        engine="transformers",
        engine_command="",
        engine_args="",
        ready_timeout=1.0,
    )
    exp = types.SimpleNamespace(out=str(tmp_path / "r.json"))
    record = {}
    llm_server.start_server(exp, s, model, llm_server.torch.device("cpu"), record)
    cache = Path(seen["env"]["HF_HUB_CACHE"])
    assert cache == model.parent / "hub-cache" and cache.is_dir() and not any(cache.iterdir())
    assert seen["env"]["HF_HUB_OFFLINE"] == "1" and str(model) in seen["argv"]
    assert record["server"]["started_by_milarun"] is True
