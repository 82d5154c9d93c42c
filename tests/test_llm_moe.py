"""llm_moe on CPU: expert parallelism over 2 gloo ranks checked against transformers' own
MoE block in one process (``--check-exchange``: the same weights give the same loss and
expert gradients), the
parameter counts against the built model, the workload alone and under torchrun (the
exchange's time, tokens per expert, imbalance, FLOPs from the active parameters), and an
expert count that does not divide across the ranks refused in one line."""

import math
import sys

import pytest
import torch
from conftest import SMOKE_ARGS, build_tiny, run_model
from test_llm import _torchrun

from milarun.measure.mfu import active_matmul_params
from milarun.models import llm_moe

TINY = ["--device", "cpu", "--shape", "tiny", "--precision", "fp32"]
TRAIN = [*SMOKE_ARGS, *TINY, "--seq-len", "32", "--batch-size", "2", "--workers", "0"]


@pytest.fixture(scope="module")
def root(tiny_dataroot):
    return build_tiny(tiny_dataroot, "llm_corpus")


def _tiny_model(seed=0):
    config = llm_moe.moe_config("tiny", 128, 64)
    torch.manual_seed(seed)
    return config, llm_moe.Qwen3MoeForCausalLM(config)


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 128, (4, 16), generator=g), torch.randint(0, 128, (4, 16), generator=g)


def _loss(model, x, y):
    logits = model(input_ids=x).logits
    return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))


def test_one_process_matches_transformers_block():
    _, model = _tiny_model()
    x, y = _batch()
    ref = _loss(model, x, y).item()
    llm_moe.shard_experts(model)
    assert _loss(model, x, y).item() == pytest.approx(ref, rel=1e-5)


def test_parameter_counts_and_active_flops():
    config, model = _tiny_model()
    total, active, matmul_active = llm_moe.count_params(config)
    assert total == sum(p.numel() for p in model.parameters())
    expert = 3 * config.hidden_size * config.moe_intermediate_size
    assert total - active == 2 * (8 - 2) * expert  # 2 layers, 6 experts a token skips
    assert active_matmul_params(100, 80, 8, 2) == 40
    # the shapes' classes: total and active parameters (32k vocabulary)
    counts = {s: llm_moe.count_params(llm_moe.moe_config(s, 32768, 4096)) for s in llm_moe.SHAPES}
    assert 19e9 < counts["gpt-oss-20b"][0] < 22e9 and 3e9 < counts["gpt-oss-20b"][1] < 4.5e9
    assert 29e9 < counts["qwen3-30b-a3b"][0] < 31e9 and 2.5e9 < counts["qwen3-30b-a3b"][1] < 3.5e9
    assert 600e9 < counts["deepseek-v3"][0] < 720e9 and 30e9 < counts["deepseek-v3"][1] < 45e9


def test_llm_moe_one_rank_trains(root, tmp_path):
    argv = [*TRAIN, "--max-count", "640", "--check-exchange"]
    res = run_model("milarun.models.llm_moe:main", argv, root, tmp_path)
    assert res["success"], res["error"]
    m = res["metrics"]
    assert m["parallelism"] == "none" and m["ep_size"] == 1 and m["all_to_all_calls"] == 0
    assert m["params_local"] == m["params"] and m["active_params"] < m["params"]
    assert m["exchange_check_loss_error"] < 1e-5 and m["exchange_check_grad_error"] < 1e-5
    _, _, n_active = llm_moe.count_params(llm_moe.moe_config("tiny", 1024, 32))
    assert m["flops_per_token"] == 6 * n_active + 12 * 2 * 64 * 32
    assert m["mfu"] is None and m["tflops"] > 0  # no peak for a CPU
    # every step routes T·k assignments a layer: 2 × 32 tokens × 2 experts over 8 experts
    assert m["tokens_per_expert_mean"] == pytest.approx(2 * 32 * 2 / 8)
    assert m["expert_imbalance"] >= 1
    losses = [s["loss"] for s in res["timings"]["train"]["samples"] if "loss" in s]
    assert losses and all(math.isfinite(x) for x in losses)


def test_llm_moe_refuses_experts_that_do_not_divide(root, tmp_path):
    res = run_model("milarun.models.llm_moe:main", [*TRAIN, "--ep-size", "3"], root, tmp_path)
    assert not res["success"]
    msg = res["error"]["message"]
    assert "the 8 experts of shape tiny do not divide across 3 ranks" in msg and "\n" not in msg
    res = run_model("milarun.models.llm_moe:main", [*TRAIN, "--shape", "big"], root, tmp_path)
    assert not res["success"] and "--shape must be one of" in res["error"]["message"]


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun over gloo")
def test_llm_moe_expert_parallel_over_two_ranks(root, tmp_path):
    res = _torchrun(
        "milarun.models.llm_moe:main",
        tmp_path / "r.json",
        [*TRAIN, "--max-count", "1280", "--check-exchange"],
        root,
    )
    m = res["metrics"]
    assert m["parallelism"] == "ep+fsdp" and m["ep_size"] == 2 and m["world_size"] == 2
    assert m["params_local"] < 0.6 * m["params"]  # half the experts, a shard of the rest
    assert m["all_to_all_calls"] > 0 and m["all_to_all_s"] > 0
    assert 0 < m["all_to_all_share"] < 1
    # the exchange's step equals one process's with the same weights (fp32)
    assert m["exchange_check_loss_error"] < 1e-5 and m["exchange_check_grad_error"] < 1e-5
    # every step routes T·k assignments a layer over the global batch (2 ranks)
    assert m["tokens_per_expert_mean"] == pytest.approx(2 * 2 * 32 * 2 / 8)
    assert m["tokens_per_expert_max"] >= m["tokens_per_expert_mean"] >= m["tokens_per_expert_min"]
    assert m["expert_imbalance_max"] >= m["expert_imbalance"] >= 1 and m["tflops"] > 0
