"""Time lost to faults: the ETTR projection (milarun.measure.soak), the summary's
``tests[g].soak`` (milarun.analysis.soak) and the report's section (milarun.report.soak).
CPU only, synthetic records."""

import io
import json
import math

import pytest
from conftest import cli, summary_of

from milarun.analysis.soak import soak_figures
from milarun.formats.record import new_result
from milarun.formats.store import write_result
from milarun.formats.summary import normalize_summary, write_summary
from milarun.measure.soak import (
    PUBLISHED_MTBF_1024_H,
    expected_ettr,
    projection,
    scaled_mtbf_s,
    young_interval,
)
from milarun.report import make_report
from milarun.report.soak import soak_rows, text_lines

SUITE = "s"


# --- the projection ---------------------------------------------------------------------------


def test_projection_by_hand():
    # C = 60 s, R = 600 s, M_1024 = 7.9 h = 28,440 s
    rows = projection(60.0, 600.0, 7.9)
    assert [r["gpus"] for r in rows] == [512, 1024, 8192]
    assert [r["mtbf_h"] for r in rows] == pytest.approx([15.8, 7.9, 0.9875])
    # at 1,024 GPUs: T* = sqrt(2 · 60 · 28,440) = sqrt(3,412,800) = 1,847.38 s
    r1024 = rows[1]
    assert r1024["interval_s"] == pytest.approx(1847.3765, rel=1e-6)
    # ETTR = 1847.38 / 1907.38 × (1 − (600 + 953.69) / 28,440) = 0.96854 × 0.94537
    assert r1024["ettr"] == pytest.approx(0.915631, abs=1e-6)
    # at 512 GPUs: M = 56,880 s, T* = 2,612.58 s
    assert rows[0]["interval_s"] == pytest.approx(2612.5849, rel=1e-6)
    assert rows[0]["ettr"] == pytest.approx(0.944272, abs=1e-6)
    # at 8,192 GPUs: M = 3,555 s, T* = 653.15 s
    assert rows[2]["interval_s"] == pytest.approx(653.1462, rel=1e-6)
    assert rows[2]["ettr"] == pytest.approx(0.669426, abs=1e-6)
    # the default M_1024 is the published one
    assert PUBLISHED_MTBF_1024_H == 7.9 and projection(60.0, 600.0) == rows


def test_projection_falls_with_scale_and_with_costs():
    scales = (64, 256, 512, 1024, 4096, 8192, 16384)
    ettr = [r["ettr"] for r in projection(30.0, 300.0, scales=scales)]
    assert all(a > b for a, b in zip(ettr, ettr[1:]))
    assert all(0 <= e <= 1 for e in ettr)
    # a slower save or restart, or a less reliable machine, costs more
    base = projection(30.0, 300.0)[1]["ettr"]
    assert projection(60.0, 300.0)[1]["ettr"] < base
    assert projection(30.0, 600.0)[1]["ettr"] < base
    assert projection(30.0, 300.0, 3.0)[1]["ettr"] < base


def test_young_and_the_first_order_ettr():
    assert young_interval(50.0, 10_000.0) == pytest.approx(1000.0)
    assert young_interval(0.0, 10_000.0) == 0.0
    assert scaled_mtbf_s(1.0, 1024) == 3600.0 and scaled_mtbf_s(1.0, 2048) == 1800.0
    # T = 1000, C = 50, R = 100, M = 10,000: 1000/1050 × (1 − (100 + 525) / 10,000)
    assert expected_ettr(50.0, 100.0, 10_000.0, 1000.0) == pytest.approx(
        1000 / 1050 * (1 - 625 / 10_000)
    )
    # free checkpoints: only the restarts cost
    assert expected_ettr(0.0, 100.0, 10_000.0, 0.0) == pytest.approx(0.99)
    # a restart longer than the time between failures: nothing is left
    assert expected_ettr(1.0, 20_000.0, 10_000.0, 100.0) == 0.0
    # Young's interval is the first-order optimum
    t = young_interval(50.0, 10_000.0)
    best = expected_ettr(50.0, 100.0, 10_000.0, t)
    for other in (0.5 * t, 0.8 * t, 1.25 * t, 2 * t):
        assert expected_ettr(50.0, 100.0, 10_000.0, other) < best


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, -math.inf, True, "1", None])
def test_bad_inputs_raise_value_error(bad):
    with pytest.raises(ValueError):
        young_interval(bad, 1000.0)
    with pytest.raises(ValueError):
        young_interval(1.0, bad)
    with pytest.raises(ValueError):
        expected_ettr(1.0, bad, 1000.0, 10.0)
    with pytest.raises(ValueError):
        expected_ettr(1.0, 1.0, 1000.0, bad)
    with pytest.raises(ValueError):
        projection(bad, 1.0)
    with pytest.raises(ValueError):
        projection(1.0, bad)
    with pytest.raises(ValueError):
        projection(1.0, 1.0, bad)


def test_zero_mtbf_and_bad_scales_raise():
    with pytest.raises(ValueError):
        young_interval(1.0, 0.0)
    with pytest.raises(ValueError):
        projection(1.0, 1.0, 0.0)
    for scales in ((0,), (-8,), (1.5,), (True,)):
        with pytest.raises(ValueError):
            projection(1.0, 1.0, scales=scales)


# --- the summary --------------------------------------------------------------------------------


def soak_metrics(save=10.0, load=4.0, restart=90.0, lost_steps=6, lost=12.0, ettr=0.8, wall=900.0):
    return {
        "soak_every_steps": 20,
        "soak_checkpoints": 5,
        "soak_save_s": save,
        "soak_load_s": load,
        "soak_restarts": 1,
        "soak_fault_step": 46,
        "soak_fault_rank": 1,
        "soak_restart_s": restart,
        "soak_lost_steps": lost_steps,
        "soak_lost_s": lost,
        "soak_productive_s": ettr * wall,
        "soak_checkpoint_s": 5 * save,
        "soak_wall_s": wall,
        "soak_ettr": ettr,
    }


def record(test, *, device="0", run=0, metrics=None, success=True, rate=100.0):
    """A successful (or failed) record of ``SUITE.test`` whose steady-state rate is ``rate``."""
    rec = new_result(f"{SUITE}.{test}", f"{run}.{device}", device=device, devices=[int(device)])
    rec["run"] = run
    rec["job"] = {"experiment": "milarun.models.llm_pretrain:main"}
    rec["success"] = success
    if not success:
        rec["error"] = {"reason": "error", "message": "boom"}
    rec["timings"]["program"] = {"start": 1.0e9, "end": 1.0e9 + 21, "duration": 21.0}
    rec["timings"]["train"]["samples"] = [
        {"start": float(i), "end": float(i + 1), "count": rate, "rate": rate, "warmup": i == 0}
        for i in range(20)
    ]
    rec["metrics"] = dict(metrics or {})
    return rec


def test_soak_figures_are_medians_of_the_soak_records():
    assert soak_figures([{"metrics": {"loss": 1.0}}, {}]) is None  # no soak record
    figs = soak_figures(
        [
            {"metrics": soak_metrics(save=10.0, restart=80.0, lost_steps=4, ettr=0.7)},
            {"metrics": soak_metrics(save=12.0, restart=100.0, lost_steps=7, ettr=0.9)},
            {"metrics": soak_metrics(save=30.0, restart=90.0, lost_steps=6, ettr=0.8)},
            {"metrics": {"loss": 1.0}},  # not a soak record
        ]
    )
    assert figs == {
        "n": 3,
        "save_s": 12.0,
        "load_s": 4.0,
        "restart_s": 90.0,
        "lost_s": 12.0,
        "lost_steps": 6.0,
        "ettr": 0.8,
        "wall_s": 900.0,
    }


def test_soak_figures_check_every_number():
    bad = soak_metrics()
    bad.update(soak_save_s=-1.0, soak_load_s=math.nan, soak_restart_s=True, soak_lost_s=1e13)
    bad.update(soak_lost_steps=10**400, soak_wall_s="900")
    figs = soak_figures([{"metrics": bad}])
    assert figs["n"] == 1 and figs["ettr"] == 0.8
    assert all(figs[k] is None for k in ("save_s", "load_s", "restart_s", "lost_s", "lost_steps"))
    assert figs["wall_s"] is None
    # an ETTR out of 0..1 (or not a number) makes no soak record
    for ettr in (1.5, -0.1, math.inf, None, "0.8", False):
        assert soak_figures([{"metrics": {**soak_metrics(), "soak_ettr": ettr}}]) is None


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("soak")
    recs = [
        record("soak", device="0", metrics=soak_metrics(save=10.0, restart=80.0, ettr=0.82)),
        record("soak", device="1", metrics=soak_metrics(save=14.0, restart=100.0, ettr=0.78)),
        # a failed record is left out, even with figures
        record("soak", device="2", metrics=soak_metrics(save=99.0, ettr=0.1), success=False),
        record("plain", device="0"),
    ]
    for rec in recs:
        write_result(rec, out)
    return out


@pytest.fixture(scope="module")
def summary(results):
    return summary_of(results)


def test_summary_soak_of_successful_records(summary, tmp_path):
    soak = summary["tests"][f"{SUITE}.soak"]["soak"]
    assert soak == {
        "n": 2,
        "save_s": 12.0,
        "load_s": 4.0,
        "restart_s": 90.0,
        "lost_s": 12.0,
        "lost_steps": 6.0,
        "ettr": pytest.approx(0.80),
        "wall_s": 900.0,
    }
    assert summary["tests"][f"{SUITE}.soak"]["failures"] == 1
    assert "soak" not in summary["tests"][f"{SUITE}.plain"]
    # written and read back through the schema
    path = tmp_path / "summary.json"
    write_summary(summary, path)
    again = normalize_summary(json.loads(path.read_text()))
    assert again["tests"][f"{SUITE}.soak"]["soak"] == summary["tests"][f"{SUITE}.soak"]["soak"]


def test_summary_schema_refuses_a_bad_soak(summary):
    from milarun.errors import ResultFormatError

    for key, value in (("ettr", 1.5), ("save_s", -1.0), ("n", 0), ("extra", 1.0)):
        data = json.loads(json.dumps(summary))
        data["tests"][f"{SUITE}.soak"]["soak"][key] = value
        with pytest.raises(ResultFormatError):
            normalize_summary(data)


# --- the report ---------------------------------------------------------------------------------


def test_text_section_and_projection(results):
    report, text = make_report(str(results), warn=io.StringIO(), cache=False)
    assert [r["test"] for r in report.soak] == [f"{SUITE}.soak"]
    assert "Time lost to faults" in text
    section = text[text.index("Time lost to faults") :]
    assert "restart s" in section and "ETTR" in section and "0.800" in section
    assert "Kokolis et al. 2024" in section and "Young 1974" in section
    # the projection at C = 12 s, R = 90 s, M_1024 = 7.9 h
    for row in projection(12.0, 90.0):
        assert f"{row['gpus']:,}" in section
        assert f"{row['ettr']:.3f}" in section
        assert f"{row['interval_s'] / 60:.1f}" in section


def test_fault_mtbf_moves_the_projection(results, capsys):
    code, out, _ = cli(["report", results, "--fault-mtbf", "2", "--no-cache"], capsys)
    assert code == 0
    section = out[out.index("Time lost to faults") :]
    assert "(--fault-mtbf 2;" in section and "Kokolis" not in section
    for row in projection(12.0, 90.0, 2.0):
        assert f"{row['ettr']:.3f}" in section
        assert f"{row['mtbf_h']:.3g}" in section


def test_no_section_without_soak_runs(summary):
    tests = {k: v for k, v in summary["tests"].items() if "soak" not in v}
    assert soak_rows(tests) == [] and text_lines([]) == []


def test_html_section(results, tmp_path):
    page_path = tmp_path / "r.html"
    make_report(str(results), html=str(page_path), warn=io.StringIO(), cache=False)
    page = page_path.read_text()
    assert '<section id="soak">' in page and "Time lost to faults" in page
    assert 'id="soak-table"' in page and f'id="soak-projection-{SUITE}.soak"' in page
    for row in projection(12.0, 90.0):
        assert f"<td>{row['ettr']:.3f}</td>" in page


def test_html_without_soak_has_no_section(tmp_path):
    out = tmp_path / "plain"
    write_result(record("plain"), out)
    page_path = tmp_path / "r.html"
    make_report(str(out), html=str(page_path), warn=io.StringIO(), cache=False)
    assert 'id="soak"' not in page_path.read_text()


@pytest.mark.parametrize(
    "value,shown", [("0", "0.0"), ("-1", "-1.0"), ("nan", "nan"), ("inf", "inf")]
)
def test_bad_fault_mtbf_is_one_line(results, capsys, value, shown):
    code, out, err = cli(["report", results, f"--fault-mtbf={value}"], capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert err.startswith("milarun: error: --fault-mtbf must be a number of hours > 0")
    assert err.endswith(f"not {shown}\n")
