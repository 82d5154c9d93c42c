"""Torch set-up in the child: device choice, threads, cuDNN autotuning, precision."""

import types

import pytest

from milarun.bench.setup import init_torch, set_precision
from milarun.host.isolation import current_cpuset


def _exp(device):
    return types.SimpleNamespace(
        options={"seed": 1, "device": device}, result={"host": {}}, device=None
    )


def test_cpu_uses_the_students_cores():
    exp = _exp("cpu")
    device = init_torch(exp)
    assert device.type == "cpu" and exp.device is device
    assert exp.result["host"]["threads"] == len(current_cpuset())
    assert "cudnn_benchmark" not in exp.result["host"]


def test_cuda_turns_on_cudnn_autotuning(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: None)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    exp = _exp("auto")
    assert init_torch(exp).type == "cuda"
    assert torch.backends.cudnn.benchmark is True
    assert exp.result["host"]["cudnn_benchmark"] is True


def test_cuda_asked_for_without_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        init_torch(_exp("cuda"))


def test_precisions(monkeypatch):
    import torch

    cpu = torch.device("cpu")
    assert set_precision(cpu, "bf16").fast_dtype == torch.bfloat16
    set_precision(cpu, "tf32")
    assert torch.backends.cuda.matmul.allow_tf32 is True
    set_precision(cpu, "fp32")
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.get_float32_matmul_precision() == "highest"
    with pytest.raises(ValueError, match="--precision must be one of"):
        set_precision(cpu, "fp8")


def test_rank_loader_gives_each_rank_its_own_equal_share():
    import torch

    from milarun.bench.distributed import World
    from milarun.bench.setup import rank_loader

    data = torch.utils.data.TensorDataset(torch.arange(10))
    seen = []
    for rank in (0, 1):
        loader = rank_loader(data, 2, 0, torch.device("cpu"), World(size=2, rank=rank), 3, "items")
        assert len(loader) == 2  # 5 items each, batches of 2, the partial one dropped
        seen.append({int(v) for (batch,) in loader for v in batch})
    assert not seen[0] & seen[1] and len(seen[0]) == len(seen[1]) == 4


def test_rank_loader_refuses_a_share_without_a_batch():
    import torch

    from milarun.bench.distributed import World
    from milarun.bench.setup import rank_loader

    data = torch.utils.data.TensorDataset(torch.arange(10))
    with pytest.raises(ValueError) as info:
        rank_loader(
            data,
            8,
            0,
            torch.device("cpu"),
            World(size=2, rank=1),
            3,
            "sequences of 4 tokens",
            hint="lower --batch-size",
            source="/d/corpus",
        )
    assert str(info.value) == (
        "/d/corpus: 10 sequences of 4 tokens give no batch of 8 per "
        "rank over 2 ranks; lower --batch-size"
    )
