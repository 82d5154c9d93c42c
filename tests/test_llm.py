"""LLM workloads on CPU: the llm_corpus dataset and its checks, the FLOPs and
latency formulas, llm_pretrain alone and FSDP2 over 2 gloo ranks (each rank holds its
shard), llm_lora (only adapters get gradients), llm_serve alone and tensor-parallel over
2 ranks (TTFT/TPOT consistent with the record's own counts and times)."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, SMOKE_ARGS, build_tiny, run_model, steady_samples

from milarun.datasets.llm_corpus import TokenShards
from milarun.formats.record import validate
from milarun.measure.latency import batch_latency, percentile, serving_level
from milarun.measure.mfu import flops_per_token, mfu, peak_tflops

TINY = ["--device", "cpu", "--shape", "tiny", "--precision", "fp32"]
TRAIN = [*SMOKE_ARGS, *TINY, "--seq-len", "32", "--batch-size", "4", "--workers", "0"]
SERVE = [*SMOKE_ARGS, *TINY, "--batch-size", "2", "--prompt-len", "16", "--output-len", "6"]


@pytest.fixture(scope="module")
def root(tiny_dataroot):
    return build_tiny(tiny_dataroot, "llm_corpus")


# --- dataset -------------------------------------------------------------------------


def test_llm_corpus_shards_read_back_and_decode(root):
    from tokenizers import Tokenizer

    shards = TokenShards(root / "llm_corpus")
    meta = json.loads((root / "llm_corpus" / "meta.json").read_text())
    assert shards.vocab_size == meta["vocab_size"] == 1024
    assert shards.dtype == np.uint16 and shards.tokens == meta["tokens"] > 50_000
    tok = Tokenizer.from_file(str(root / "llm_corpus" / "tokenizer.json"))
    assert tok.token_to_id("<|endoftext|>") == shards.eos_id
    for i, s in enumerate(meta["shards"]):
        offsets = np.load(root / "llm_corpus" / s["idx"])
        data = shards.shards[i]
        # every document ends with the end-of-text id, and nothing else is one
        assert np.all(data[offsets[1:] - 1] == shards.eos_id)
        assert int((data == shards.eos_id).sum()) == len(offsets) - 1
        text = tok.decode(data[offsets[0] : offsets[1] - 1].tolist())
        assert text.endswith(".") and len(text.split()) >= 50
    rows, lengths = shards.prompts()
    assert rows.shape == (32, 64) and lengths.min() >= 8 and lengths.max() <= 64
    assert len(set(lengths.tolist())) > 5  # a distribution, not one length
    windows = shards.sequences(32)
    x = shards.window(*windows[-1], 32)
    assert x.shape == (33,) and x.max() < shards.vocab_size


def _copy(root, tmp_path):
    import shutil

    dst = tmp_path / "llm_corpus"
    shutil.copytree(root / "llm_corpus", dst)
    return dst


def test_llm_corpus_refuses_a_shard_that_does_not_match_its_index(root, tmp_path):
    folder = _copy(root, tmp_path)
    shard = folder / "train" / "shard-00001.bin"
    shard.write_bytes(shard.read_bytes()[:-2])  # one token short
    with pytest.raises(ValueError, match=f"^{shard}: .* bytes, but meta.json says"):
        TokenShards(folder)
    folder = _copy(root, tmp_path / "b")
    idx = folder / "train" / "shard-00000.idx.npy"
    offsets = np.load(idx)
    offsets[-1] += 7
    np.save(idx, offsets)
    with pytest.raises(ValueError, match=f"^{idx}: the document offsets do not match"):
        TokenShards(folder)
    folder = _copy(root, tmp_path / "d")
    shard = folder / "train" / "shard-00000.bin"
    data = np.fromfile(shard, dtype=np.uint16)
    data[5] = 1024  # one id past the vocabulary
    data.tofile(shard)
    with pytest.raises(ValueError, match=f"^{shard}: holds token ids >= the vocabulary"):
        TokenShards(folder)
    folder = _copy(root, tmp_path / "e")
    lengths = folder / "prompts" / "lengths.npy"
    np.save(lengths, np.full(32, 65))  # longer than the prompts
    with pytest.raises(ValueError, match=f"^{lengths}: prompt lengths must be from 1 to 64"):
        TokenShards(folder).prompts()
    folder = _copy(root, tmp_path / "c")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="tokenizer.json: the tokenizer is missing"):
        TokenShards(folder)


# --- formulas --------------------------------------------------------------------------


def test_flops_per_token_and_peaks():
    # Llama 3.1 8B at 4k context: 6N + 12·L·d·T (PaLM appendix B)
    n, layers, d, t = 7_000_000_000, 32, 4096, 4096
    assert flops_per_token(n, layers, d, t) == 6 * n + 12 * layers * d * t
    assert flops_per_token(n, layers, d, t, "inference") == 2 * n + 4 * layers * d * t
    assert (
        flops_per_token(n, layers, d, t, "lora", adapter_params=10)
        == 4 * n + 60 + 12 * layers * d * t
    )
    with pytest.raises(ValueError):
        flops_per_token(n, layers, d, t, "pretend")
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0  # not the SXM figure
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "tf32") == 156.0
    assert peak_tflops("AMD EPYC 7601", "bf16") is None and peak_tflops(None, "bf16") is None
    achieved, frac = mfu(10_000, 6e9, 100.0)
    assert achieved == pytest.approx(60.0) and frac == pytest.approx(0.6)
    assert mfu(10_000, 6e9, None)[1] is None


def test_latency_definitions():
    b = batch_latency(10.0, 10.5, 12.5, prompt_tokens=400, requests=4, output_tokens=5)
    assert b["ttft_s"] == 0.5 and b["tpot_s"] == 0.5  # 2 s over 4 tokens after the first
    assert b["prefill_tokens_per_s"] == 800 and b["decode_tokens_per_s"] == 8
    assert b["output_tokens_per_s"] == 20 / 2.5
    with pytest.raises(ValueError):
        batch_latency(1.0, 0.5, 2.0, 1, 1, 1)
    assert percentile([3, 1, 2, 4], 50) == 2 and percentile([3, 1, 2, 4], 99) == 4
    assert percentile([], 50) is None
    fast = dict(b, requests=4, prompt_tokens=400, output_tokens=5)
    slow = dict(
        batch_latency(0.0, 3.0, 5.0, 400, 4, 5), requests=4, prompt_tokens=400, output_tokens=5
    )
    level = serving_level(4, [fast, slow], ttft_slo_s=2.0, tpot_slo_s=1.0)
    assert level["requests"] == 8 and level["goodput_fraction"] == 0.5
    assert level["goodput_requests_per_s"] == pytest.approx(4 / 7.5)
    assert level["ttft_p50_s"] == 0.5 and level["ttft_p99_s"] == 3.0


# --- workloads -------------------------------------------------------------------------


def test_llm_pretrain_trains_on_the_shards(root, tmp_path):
    res = run_model(
        "milarun.models.llm_pretrain:main", [*TRAIN, "--max-count", "1200"], root, tmp_path
    )
    assert res["success"], res["error"]
    m = res["metrics"]
    assert m["parallelism"] == "none" and m["params_local"] == m["params"]
    assert m["flops_per_token"] > 6 * 100_000 and m["mfu"] is None  # no peak for a CPU
    rate = sum(s["count"] for s in steady_samples(res)) / sum(
        s["end"] - s["start"] for s in steady_samples(res)
    )
    assert m["tflops"] == pytest.approx(rate * m["flops_per_token"] / 1e12, rel=0.5)
    losses = [s["loss"] for s in res["timings"]["train"]["samples"] if "loss" in s]
    assert losses and all(math.isfinite(x) for x in losses)


class _RecordsGradientSync:
    """A stand-in for an FSDP2 module: records ``set_requires_gradient_sync``."""

    def __init__(self):
        self.calls = []

    def set_requires_gradient_sync(self, flag):
        self.calls.append(flag)


def test_fsdp2_reduces_gradients_on_the_last_micro_batch_only():
    from milarun.models.llm_pretrain import accumulate

    net = _RecordsGradientSync()
    for micro in range(6):
        with accumulate(net, micro, 3):
            pass
    assert net.calls == [False, False, True, False, False, True]
    net = _RecordsGradientSync()
    with accumulate(net, 0, 1):  # no accumulation: the flag is left alone
        pass
    assert net.calls == []


def test_llm_pretrain_refuses_bad_options(root, tmp_path):
    res = run_model("milarun.models.llm_pretrain:main", [*TRAIN, "--shape", "3b"], root, tmp_path)
    assert not res["success"] and "--shape must be one of tiny" in res["error"]["message"]
    res = run_model(
        "milarun.models.llm_pretrain:main", [*TRAIN, "--seq-len", "200000"], root, tmp_path
    )
    assert not res["success"] and "--seq-len must be from 1" in res["error"]["message"]


def test_llm_lora_trains_only_the_adapters(root, tmp_path):
    res = run_model(
        "milarun.models.llm_lora:main",
        [*TRAIN, "--rank", "4", "--max-count", "600"],
        root,
        tmp_path,
    )
    assert res["success"], res["error"]
    m = res["metrics"]
    assert m["grad_params_non_adapter"] == 0
    assert 0 < m["trainable_params"] < m["params"] / 10


def _check_level(level, output_len):
    c = level["concurrency"]
    # decode tokens/s is the batch's tokens after the first over its decoding time, and
    # TPOT that time per token: their product is the concurrency
    assert level["decode_tokens_per_s"] * level["tpot_mean_s"] == pytest.approx(c, rel=1e-6)
    assert level["ttft_p50_s"] <= level["ttft_p90_s"] <= level["ttft_p99_s"]
    assert level["tpot_p50_s"] <= level["tpot_p90_s"] <= level["tpot_p99_s"]
    # output tokens/s includes the prefill: below the decode-only rate × (out / (out - 1))
    assert level["output_tokens_per_s"] <= level["decode_tokens_per_s"] * output_len / (
        output_len - 1
    )
    assert 0 <= level["goodput_fraction"] <= 1


def test_llm_serve_records_ttft_and_tpot(root, tmp_path):
    res = run_model(
        "milarun.models.llm_serve:main",
        [*SERVE, "--max-count", "60", "--sweep", "1,3", "--sweep-batches", "2"],
        root,
        tmp_path,
    )
    assert res["success"], res["error"]
    validate({k: v for k, v in res.items() if k != "_exit_code"})
    serving = res["serving"]
    assert [lv["concurrency"] for lv in serving] == [2, 1, 3]
    assert [lv["requests"] for lv in serving[1:]] == [2, 6]
    for level in serving:
        _check_level(level, 6)
    # the rate logger counts decode tokens (after each request's first) and leaves each
    # batch's prefill out of its windows: 2 requests × 5 tokens a batch
    train = res["timings"]["train"]
    assert train["count"] == 10 * res["metrics"]["batches"] and res["metrics"]["batches"] >= 2
    assert res["metrics"]["tpot_p50_s"] == serving[0]["tpot_p50_s"]
    # the summary keeps the levels, and the report shows them (text and HTML)
    from milarun.report import make_report

    report, text = make_report(str(tmp_path), html=str(tmp_path / "r.html"), warn=sys.stderr)
    (row,) = report.llm
    assert row["concurrency"] == 2 and [lv["concurrency"] for lv in row["serving"]] == [1, 2, 3]
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("serving test.model: "))
    assert [line.split()[0] for line in lines[head + 2 : head + 5]] == ["1", "2*", "3"]
    page = (tmp_path / "r.html").read_text()
    assert 'id="llm-table"' in page and "<svg" in page.split('id="llm"')[1]


def test_llm_serve_mixed_prompt_lengths(root, tmp_path):
    res = run_model(
        "milarun.models.llm_serve:main",
        [*SERVE, "--prompt-len", "0", "--max-count", "24"],
        root,
        tmp_path,
    )
    assert res["success"], res["error"]
    res = run_model("milarun.models.llm_serve:main", [*SERVE, "--prompt-len", "65"], root, tmp_path)
    assert not res["success"] and "longer than the dataset's prompts" in res["error"]["message"]


# --- two gloo ranks under torchrun ----------------------------------------------------


def _torchrun(function, out, argv, dataroot):
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    extra = {"run": 0, "device": "all", "devices": [0, 1], "partition": "njobs"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "milarun",
        "run",
        function,
        "-o",
        str(out),
        "--experiment-name",
        "t.llm",
        "--job-id",
        "0.all",
        "--extra",
        json.dumps(extra),
        "-d",
        str(dataroot),
        "--",
        *argv,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    validate(res)
    assert res["success"], res["error"]
    return res


def test_llm_pretrain_fsdp_over_two_ranks_shards_the_parameters(root, tmp_path):
    # with gradient accumulation: FSDP2 reduce-scatters on every second micro-batch only
    res = _torchrun(
        "milarun.models.llm_pretrain:main",
        tmp_path / "r.json",
        [*TRAIN, "--max-count", "600", "--grad-accum", "2"],
        root,
    )
    m = res["metrics"]
    assert m["parallelism"] == "fsdp" and m["world_size"] == 2
    assert m["global_batch_tokens"] == 4 * 32 * 2 * 2
    # FSDP2 splits every parameter's first dimension over the ranks: rank 0 holds half
    # (the larger half when a dimension is odd), not the whole model
    assert m["params"] / 2 <= m["params_local"] < 0.55 * m["params"]
    assert res["timings"]["train"]["count"] % (4 * 32 * 2) == 0  # global tokens per step


def test_llm_serve_tensor_parallel_over_two_ranks(root, tmp_path):
    res = _torchrun(
        "milarun.models.llm_serve:main", tmp_path / "r.json", [*SERVE, "--max-count", "36"], root
    )
    assert res["metrics"]["parallelism"] == "tensor" and res["metrics"]["world_size"] == 2
    _check_level(res["serving"][0], 6)


def test_llm_pretrain_hybrid_sharding_replicates_across_groups(root, tmp_path):
    # --hsdp-replicas 2 over 2 ranks: a 2 × 1 mesh, each replica one whole-model shard group
    res = _torchrun(
        "milarun.models.llm_pretrain:main",
        tmp_path / "r.json",
        [*TRAIN, "--max-count", "2048", "--hsdp-replicas", "2"],
        root,
    )
    m = res["metrics"]
    assert m["parallelism"] == "hsdp" and m["params_local"] == m["params"]


# --- summary and report ----------------------------------------------------------------


def _rec(tflops, mfu, serving=None):
    rec = {"metrics": {"flops_per_token": 6e9, "tflops": tflops, "mfu": mfu, "peak_tflops": 989.4}}
    if serving is not None:
        rec["serving"] = serving
    return rec


def test_llm_figures_aggregate_runs_and_levels():
    from milarun.analysis.llm import llm_figures
    from milarun.report.llm import llm_rows, text_lines

    assert llm_figures([{"metrics": {"loss": 1.0}}]) is None  # not an LLM test
    level = {
        "concurrency": 8,
        "requests": 8,
        "tpot_p50_s": 0.02,
        "ttft_p50_s": 0.3,
        "output_tokens_per_s": 400.0,
        "goodput_fraction": 1.0,
    }
    figs = llm_figures(
        [
            _rec(400.0, 0.4, [level, dict(level, concurrency=1, requests=3)]),
            _rec(500.0, 0.5, [dict(level, tpot_p50_s=0.04)]),
            _rec(float("nan"), True),
        ]
    )  # hostile values: ignored
    assert figs["tflops"]["n"] == 2 and figs["tflops"]["mean"] == 450.0
    assert figs["mfu"]["mean"] == pytest.approx(0.45)
    assert [lv["concurrency"] for lv in figs["serving"]] == [1, 8]
    eight = figs["serving"][1]
    assert eight["requests"] == 16 and eight["tpot_p50_s"] == pytest.approx(0.03)  # median
    rows = llm_rows(
        {
            "standard.llm_serve": {"train": {"mean": 1234.0}, "llm": figs},
            "standard.convnet": {"train": {"mean": 5.0}},
        }
    )
    assert [r["test"] for r in rows] == ["standard.llm_serve"]
    assert rows[0]["mfu_pct"] == pytest.approx(45.0)
    text = "\n".join(text_lines(rows))
    assert "45.0%" in text and "serving standard.llm_serve" in text
    assert "TPOT p50 (ms)" in text and "30.0" in text


def test_loss_not_decreasing_flag():
    from milarun.measure.plausibility import flags

    def rec(losses, learning=True):
        samples = [
            {"start": i, "end": i + 1.0, "count": 10, "rate": 10.0, "warmup": i < 1, "loss": x}
            for i, x in enumerate(losses)
        ]
        return {
            "success": True,
            "metrics": {"learning_check": learning} if learning else {},
            "timings": {"train": {"samples": samples}},
        }

    assert flags(rec([7.0, 6.9, 6.0, 5.0, 4.0])) == []
    (flag,) = flags(rec([7.0, 6.9, 6.95, 7.1, 7.0]))
    assert flag.id == "loss-not-decreasing" and flag.figures["value"] == pytest.approx(7.05 / 6.95)
    assert flags(rec([7.0, 6.9, 6.95, 7.1, 7.0], learning=False)) == []  # not opted in
    assert flags(rec([7.0, 7.1, 7.2])) == []  # too few windows


def test_llm_pretrain_loss_falls_on_the_shards(root, tmp_path):
    # the tiny model learns the corpus's unigram statistics within a few hundred steps
    res = run_model(
        "milarun.models.llm_pretrain:main",
        [*TRAIN, "--lr", "3e-3", "--max-count", "40000", "--sample-duration", "0.05"],
        root,
        tmp_path,
    )
    assert res["success"], res["error"]
    from milarun.measure.plausibility import learning

    losses = [s["loss"] for s in res["timings"]["train"]["samples"] if "loss" in s]
    assert res["metrics"]["learning_check"] is True and len(losses) >= 4
    assert learning(res) is None, losses


def test_llm_lora_ddp_over_two_ranks(root, tmp_path):
    # only the adapters are trainable: DDP all-reduces their gradients alone
    res = _torchrun(
        "milarun.models.llm_lora:main",
        tmp_path / "r.json",
        [*TRAIN, "--rank", "4", "--max-count", "2048"],
        root,
    )
    m = res["metrics"]
    assert m["world_size"] == 2 and m["grad_params_non_adapter"] == 0
    assert res["timings"]["train"]["count"] % (4 * 32 * 2) == 0
