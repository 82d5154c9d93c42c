"""Smoke tests of the wlm, translator, recom, cart, ppo, matmul and scaling workloads on CPU."""

import math

import pytest
from conftest import SMOKE_ARGS, build_tiny, run_model, steady_samples

from milarun.models.wlm import BF16_LSTM_REFUSED, cpu_bf16_lstm_supported


def wlm_bf16_lstm_supported():
    return cpu_bf16_lstm_supported()


@pytest.fixture(scope="session")
def text_dataroot(tiny_dataroot):
    return build_tiny(tiny_dataroot, "wikitext2", "wmt16", "movielens")


def _check(res, metric="loss"):
    assert res["_exit_code"] == 0, res["error"]
    assert res["success"] is True
    assert len(steady_samples(res)) >= 2
    assert math.isfinite(res["metrics"][metric])
    return res


WLM_TINY = [
    "--emsize",
    "32",
    "--nhid",
    "32",
    "--nlayers",
    "1",
    "--bptt",
    "10",
    "--batch-size",
    "8",
    "--dropout",
    "0",
]


@pytest.mark.parametrize("cell,precision", [("GRU", "fp32"), ("LSTM", "fp32"), ("LSTM", "bf16")])
def test_wlm(cell, precision, text_dataroot, tmp_path):
    res = run_model(
        "milarun.models.wlm:main",
        SMOKE_ARGS + WLM_TINY + ["--model", cell, "--precision", precision, "--max-count", "5000"],
        dataroot=text_dataroot,
        tmp_path=tmp_path,
    )
    if cell == "LSTM" and precision == "bf16" and not wlm_bf16_lstm_supported():
        # AVX2-only CPU: the workload refuses before training, with its reason.
        assert res["_exit_code"] == 1 and res["success"] is False
        assert res["error"]["message"] == BF16_LSTM_REFUSED, res["error"]
        assert not steady_samples(res)
        return
    _check(res)
    assert res["metrics"]["vocab"] > 100


def test_translator(text_dataroot, tmp_path):
    res = run_model(
        "milarun.models.translator:main",
        SMOKE_ARGS
        + [
            "--d-model",
            "32",
            "--nhead",
            "2",
            "--layers",
            "1",
            "--ff",
            "64",
            "--batch-size",
            "16",
            "--workers",
            "0",
            "--max-count",
            "4000",
        ],
        dataroot=text_dataroot,
        tmp_path=tmp_path,
    )
    _check(res)


def test_recom(text_dataroot, tmp_path):
    res = run_model(
        "milarun.models.recom:main",
        SMOKE_ARGS
        + ["--batch-size", "256", "--factors", "8", "--layers", "32,16,8", "--max-count", "20000"],
        dataroot=text_dataroot,
        tmp_path=tmp_path,
    )
    _check(res)
    assert res["metrics"]["users"] == 200


def test_cart(tmp_path):
    res = run_model(
        "milarun.models.cart:main",
        SMOKE_ARGS + ["--hidden", "32", "--max-count", "2000"],
        tmp_path=tmp_path,
    )
    _check(res)
    assert res["host"]["device_type"] == "cpu"


def test_ppo(tmp_path):
    res = run_model(
        "milarun.models.ppo:main",
        SMOKE_ARGS
        + [
            "--num-envs",
            "2",
            "--num-steps",
            "16",
            "--hidden",
            "16",
            "--update-epochs",
            "1",
            "--device",
            "cpu",
            "--max-count",
            "480",
        ],
        tmp_path=tmp_path,
    )
    _check(res)


def test_matmul(tmp_path):
    res = run_model(
        "milarun.models.matmul:main",
        SMOKE_ARGS
        + ["--size", "64", "--precisions", "fp32,bf16", "--device", "cpu", "--max-count", "6000"],
        tmp_path=tmp_path,
    )
    assert res["_exit_code"] == 0, res["error"]
    assert len(steady_samples(res)) >= 2
    for p in ("fp32", "bf16"):
        t = res["metrics"][f"tflops_{p}"]
        assert math.isfinite(t) and t > 0


def test_matmul_rejects_unknown_precision(tmp_path):
    res = run_model(
        "milarun.models.matmul:main",
        ["--size", "8", "--precisions", "fp8", "--device", "cpu"],
        tmp_path=tmp_path,
    )
    assert res["success"] is False
    assert "fp8" in res["error"]["message"]


def test_scaling_world_of_one(tmp_path):
    res = run_model(
        "milarun.models.scaling:main",
        SMOKE_ARGS
        + [
            "--batch-size",
            "8",
            "--width",
            "4",
            "--blocks",
            "1",
            "--image-size",
            "16",
            "--classes",
            "10",
            "--device",
            "cpu",
            "--max-count",
            "160",
        ],
        tmp_path=tmp_path,
    )
    _check(res)
    assert res["metrics"]["world_size"] == 1
    assert res["metrics"]["backend"] == "gloo"
