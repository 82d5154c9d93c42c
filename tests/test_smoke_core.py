"""Smoke tests of the core workloads: tiny data, CPU, tiny batches."""

import math

import pytest
from conftest import SMOKE_ARGS, build_tiny, run_model, steady_samples

CPU = SMOKE_ARGS + ["--device", "cpu"]


@pytest.fixture(scope="session")
def core_dataroot(tiny_dataroot):
    """The session's tiny dataroot with mnist and fake_imagenet built (once)."""
    return build_tiny(tiny_dataroot, "mnist", "fake_imagenet")


def _check(res, max_count, loss=True):
    assert res["_exit_code"] == 0, res["error"]
    assert res["success"] is True
    assert len(steady_samples(res)) >= 2
    assert res["timings"]["train"]["count"] >= max_count
    if loss:
        assert math.isfinite(res["metrics"]["loss"])


def test_toy_lstm(tmp_path):
    res = run_model(
        "milarun.models.toy_lstm:main",
        CPU + ["--max-count", "800", "--batch-size", "8", "--seq-len", "32", "--hidden-size", "32"],
        tmp_path=tmp_path,
    )
    _check(res, 800)


def test_vae(tmp_path, core_dataroot):
    res = run_model(
        "milarun.models.vae:main",
        CPU + ["--max-count", "1000", "--batch-size", "32", "--workers", "0"],
        dataroot=core_dataroot,
        tmp_path=tmp_path,
    )
    _check(res, 1000)


def test_loader_with_a_worker_over_two_epochs(tmp_path, core_dataroot):
    # 512 images = two epochs of the tiny set: the persistent worker restarts.
    res = run_model(
        "milarun.models.loader:main",
        CPU + ["--max-count", "512", "--batch-size", "16", "--image-size", "32", "--workers", "1"],
        dataroot=core_dataroot,
        tmp_path=tmp_path,
    )
    _check(res, 512, loss=False)
    assert sum(s["count"] for s in res["timings"]["train"]["samples"]) == 512
    assert all(s["count"] % 16 == 0 for s in res["timings"]["train"]["samples"])


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_convnet(tmp_path, core_dataroot, precision):
    res = run_model(
        "milarun.models.convnet:main",
        CPU
        + [
            "--max-count",
            "16",
            "--batch-size",
            "4",
            "--image-size",
            "32",
            "--workers",
            "0",
            "--precision",
            precision,
        ],
        dataroot=core_dataroot,
        tmp_path=tmp_path,
    )
    _check(res, 16)
    assert res["call"]["arguments"]["precision"] == precision


def test_missing_dataset_is_a_clear_error(tmp_path):
    res = run_model(
        "milarun.models.vae:main",
        CPU + ["--max-count", "10"],
        dataroot=tmp_path / "empty",
        tmp_path=tmp_path,
    )
    assert res["_exit_code"] == 1 and res["success"] is False
    # DatasetMissing: a FileNotFoundError (readers that catch it still do) and a
    # MilarunError (one console line, the traceback kept in the record)
    assert res["error"]["type"] == "DatasetMissing"
    assert "milarun dataset mnist" in res["error"]["message"]
    assert "Traceback" in res["error"]["traceback"]


def test_convnet_rejects_unknown_arch(tmp_path, core_dataroot):
    res = run_model(
        "milarun.models.convnet:main",
        CPU + ["--max-count", "4", "--arch", "not_a_net", "--workers", "0"],
        dataroot=core_dataroot,
        tmp_path=tmp_path,
    )
    assert res["success"] is False and "not_a_net" in res["error"]["message"]
