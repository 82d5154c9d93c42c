import math

from conftest import SMOKE_ARGS, run_model, steady_samples


def test_toy_reg_trains_and_reports_steady_samples(tmp_path):
    res = run_model(
        "milarun.models.toy_reg:main",
        SMOKE_ARGS + ["--max-count", "300000", "--batch-size", "32"],
        tmp_path=tmp_path,
    )
    assert res["_exit_code"] == 0, res["error"]
    assert res["success"] is True
    assert len(steady_samples(res)) >= 2
    assert math.isfinite(res["metrics"]["loss"])
    assert res["timings"]["train"]["count"] >= 300000
