"""Torch set-up in the child: device choice, threads, cuDNN autotuning, precision."""

import types

import pytest

from milarun.bench.setup import init_torch, set_precision
from milarun.host.isolation import current_cpuset


def _exp(device):
    return types.SimpleNamespace(options={"seed": 1, "device": device},
                                 result={"host": {}}, device=None)


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
