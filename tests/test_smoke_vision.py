"""Smoke tests of the reso, fast_style, dcgan and ssd workloads on CPU.

Each runs the real program on a tiny data set with tiny sizes and checks that
it succeeds with at least two steady-state samples and a finite loss.
"""

import math

import pytest
from conftest import SMOKE_ARGS, build_tiny, run_model, steady_samples


@pytest.fixture(scope="session")
def vision_dataroot(tiny_dataroot):
    return build_tiny(tiny_dataroot, "bsds500", "coco", "fake_imagenet")


# Counts are chosen so that a run lasts about 0.5-1 s on an idle 2-core machine: a
# dozen 0.05 s windows, so even a much faster machine gets two steady-state samples.


def _check(res, min_count):
    assert res["_exit_code"] == 0, res["error"]
    assert res["success"] is True
    assert len(steady_samples(res)) >= 2
    assert res["timings"]["train"]["count"] >= min_count
    assert math.isfinite(res["metrics"]["loss"])
    return res


def test_reso(vision_dataroot, tmp_path):
    res = run_model(
        "milarun.models.reso:main",
        SMOKE_ARGS
        + [
            "--max-count",
            "1280",
            "--batch-size",
            "8",
            "--crop-size",
            "32",
            "--features",
            "16",
            "--workers",
            "0",
        ],
        dataroot=vision_dataroot,
        tmp_path=tmp_path,
    )
    _check(res, 1280)


def test_reso_rejects_missing_dataset(tmp_path):
    res = run_model(
        "milarun.models.reso:main",
        SMOKE_ARGS + ["--max-count", "8"],
        dataroot=tmp_path,
        tmp_path=tmp_path,
    )
    assert res["success"] is False
    assert "milarun dataset bsds500" in res["error"]["message"]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_dcgan(precision, vision_dataroot, tmp_path):
    res = run_model(
        "milarun.models.dcgan:main",
        SMOKE_ARGS
        + [
            "--max-count",
            "800",
            "--batch-size",
            "8",
            "--ngf",
            "8",
            "--ndf",
            "8",
            "--nz",
            "16",
            "--workers",
            "0",
            "--precision",
            precision,
        ],
        dataroot=vision_dataroot,
        tmp_path=tmp_path,
    )
    _check(res, 800)
    assert math.isfinite(res["metrics"]["loss_d"])


def test_fast_style(vision_dataroot, tmp_path):
    res = run_model(
        "milarun.models.fast_style:main",
        SMOKE_ARGS
        + [
            "--max-count",
            "60",
            "--batch-size",
            "2",
            "--image-size",
            "32",
            "--width",
            "8",
            "--res-blocks",
            "1",
            "--workers",
            "0",
        ],
        dataroot=vision_dataroot,
        tmp_path=tmp_path,
    )
    _check(res, 60)
    assert math.isfinite(res["metrics"]["style_loss"])


def test_ssd(vision_dataroot, tmp_path):
    # SSD300 has a fixed 300x300 input: one image per step, three steps.
    res = run_model(
        "milarun.models.ssd:main",
        SMOKE_ARGS + ["--max-count", "3", "--batch-size", "1", "--workers", "0"],
        dataroot=vision_dataroot,
        tmp_path=tmp_path,
    )
    _check(res, 3)
    assert math.isfinite(res["metrics"]["bbox_regression"])
