"""MFU against a peak the buyer can see: the measured sustained matmul TFLOP/s of the same
node and precision where the summary holds a matmul test, else the datasheet's; an MFU
above 100 % of the chosen peak is a measurement error, never a figure. Hand-made
summaries and records."""

import pytest
from conftest import summary_of
from test_acceptance_report import record
from test_sustained_matmul import soak_records

from milarun.analysis.acceptance import measured_peak
from milarun.analysis.llm import llm_figures, mfu_figures
from milarun.formats.store import write_result
from milarun.measure.mfu import MFU_LIMIT, checked_mfu, choose_peak
from milarun.report.llm import llm_rows, text_lines


def test_choose_peak_prefers_the_measured_one():
    assert choose_peak(610.0, 989.4) == (610.0, "measured")
    assert choose_peak(None, 989.4) == (989.4, "datasheet")
    assert choose_peak(0.0, 989.4) == (989.4, "datasheet")
    assert choose_peak(None, None) == (None, "datasheet")


def test_checked_mfu_flags_more_than_the_peak_as_an_error():
    assert MFU_LIMIT == 1.0
    assert checked_mfu(305.0, 610.0, "measured") == (pytest.approx(0.5), None)
    assert checked_mfu(610.0, 610.0, "measured") == (pytest.approx(1.0), None)
    assert checked_mfu(793.0, 610.0, "measured") == (None, "MFU error: 130% of the measured peak")
    assert checked_mfu(5570.0, 989.4, "datasheet") == (
        None,
        "MFU error: 563% of the datasheet peak",
    )
    assert checked_mfu(None, 610.0, "measured") == (None, None)
    assert checked_mfu(300.0, None, "datasheet") == (None, None)


def matmul_test(nodes):
    """A summary's matmul test: bf16 node figures ``{node: TFLOP/s}``."""
    return {
        "acceptance": {
            "test": "matmul",
            "matmul": [
                {
                    "precision": "bf16",
                    "supported": True,
                    "best_tflops": 700.0,
                    "nodes": [
                        {"node": n, "tflops": t, "slowest": "0", "devices": 8}
                        for n, t in nodes.items()
                    ],
                }
            ],
        }
    }


def llm_test(tflops, nodes=("node1",), precision="bf16", peak=989.4):
    return {
        "llm": {
            "flops_per_token": 6e9,
            "peak_tflops": peak,
            "precision": precision,
            "nodes": list(nodes),
            "tflops": {"n": 2, "mean": tflops},
            "mfu": {"n": 2, "mean": None if peak is None else tflops / peak},
            "serving": [],
        }
    }


def test_measured_peak_is_the_slowest_of_the_jobs_nodes():
    tests = {
        "other": {"llm": {}},
        "mm": matmul_test({"node1": 610.0, "node2": 500.0, "node3": 640.0}),
    }
    assert measured_peak(tests, "bf16", ["node1"]) == {
        "tflops": 610.0,
        "test": "mm",
        "nodes": ["node1"],
    }
    # a job over node1 and node2 runs at node2's pace
    assert measured_peak(tests, "bf16", ["node2", "node1"])["tflops"] == 500.0
    # a node the matmul test did not measure, or another precision: no measured peak
    assert measured_peak(tests, "bf16", ["node1", "node9"]) is None
    assert measured_peak(tests, "fp16", ["node1"]) is None
    # nodes unknown: only a matmul test of a single node fits
    assert measured_peak(tests, "bf16", []) is None
    single = {"mm": matmul_test({"node1": 610.0})}
    assert measured_peak(single, "bf16", [])["tflops"] == 610.0


def test_mfu_uses_the_measured_peak_and_says_so():
    tests = {"mm": matmul_test({"node1": 610.0}), "llm": llm_test(305.0)}
    got = mfu_figures(tests["llm"]["llm"], tests)
    assert got == {
        "peak_tflops": 610.0,
        "peak_source": "measured",
        "peak_test": "mm",
        "mfu": pytest.approx(0.5),
        "mfu_error": None,
    }


def test_mfu_falls_back_to_the_datasheet_without_a_matmul_test():
    tests = {"llm": llm_test(305.0)}
    got = mfu_figures(tests["llm"]["llm"], tests)
    assert got["peak_source"] == "datasheet" and got["peak_test"] is None
    assert got["peak_tflops"] == 989.4 and got["mfu"] == pytest.approx(305.0 / 989.4)
    # another node's matmul test does not count
    tests["mm"] = matmul_test({"node2": 610.0})
    assert mfu_figures(tests["llm"]["llm"], tests)["peak_source"] == "datasheet"
    # no peak at all (a CPU): no MFU, no error
    none = {"llm": llm_test(1.0, peak=None)}
    got = mfu_figures(none["llm"]["llm"], none)
    assert got["mfu"] is None and got["mfu_error"] is None and got["peak_tflops"] is None


def test_more_than_the_peak_is_an_error_in_the_report():
    tests = {"mm": matmul_test({"node1": 610.0}), "llm": llm_test(793.0)}
    (row,) = llm_rows(tests)
    assert row["mfu_pct"] is None
    assert row["mfu_error"] == "MFU error: 130% of the measured peak"
    assert row["peak_tflops"] == 610.0 and row["peak_source"] == "measured"
    text = "\n".join(text_lines([row]))
    assert "llm: MFU error: 130% of the measured peak: a measurement error" in text
    table = next(x for x in text.splitlines() if x.split()[:1] == ["llm"])
    assert table.split()[3:] == ["error", "610", "measured", "(mm)"]
    assert "130" not in table  # never shown as a figure


def test_report_row_with_a_datasheet_peak():
    tests = {"llm": llm_test(494.7)}
    (row,) = llm_rows(tests)
    assert row["mfu_pct"] == pytest.approx(50.0) and row["mfu_error"] is None
    table = next(x for x in text_lines([row]) if x.split()[:1] == ["llm"])
    assert table.split()[3:] == ["50.0%", "989", "datasheet"]


def llm_record(node, device, tflops, precision="bf16"):
    rec = record(
        "llm",
        "llm_pretrain",
        device=str(device),
        node=node,
        metrics={
            "flops_per_token": 6e9,
            "tflops": tflops,
            "mfu": tflops / 989.4,
            "peak_tflops": 989.4,
            "device_name": "NVIDIA H100 80GB HBM3",
        },
    )
    rec["call"]["arguments"] = {"precision": precision}
    return rec


def test_llm_figures_keep_the_precision_and_the_nodes():
    recs = [llm_record("node1", 0, 300.0), llm_record("node2", 0, 310.0)]
    figs = llm_figures(recs)
    assert figs["precision"] == "bf16" and figs["nodes"] == ["node1", "node2"]
    multi = llm_record("node1", 0, 300.0)
    multi["nodes"] = ["node1", "node3"]
    assert llm_figures([multi])["nodes"] == ["node1", "node3"]


def test_a_summary_of_a_matmul_soak_and_an_llm_test_gives_mfu_of_the_measured_peak(tmp_path):
    recs = [r for r in soak_records() if r["node"] == "node1"] + [
        llm_record("node1", 0, 300.0),
        llm_record("node1", 1, 310.0),
    ]
    for rec in recs:
        write_result(rec, tmp_path)
    summary = summary_of(tmp_path)  # the schema accepts it
    assert summary["tests"]["acc.llm"]["llm"]["precision"] == "bf16"
    assert summary["tests"]["acc.llm"]["llm"]["nodes"] == ["node1"]
    (row,) = llm_rows(summary["tests"])
    # node1's slowest GPU sustained 610 TFLOP/s in bf16 (test_sustained_matmul)
    assert row["peak_source"] == "measured" and row["peak_test"] == "acc.mm"
    assert row["peak_tflops"] == 610.0
    assert row["mfu_pct"] == pytest.approx(100 * 305.0 / 610.0)


def test_a_datasheet_mfu_above_the_peak_is_an_error_too():
    tests = {"llm": llm_test(1286.2)}  # the records' MFU: 1286.2 / 989.4 = 130 %
    got = mfu_figures(tests["llm"]["llm"], tests)
    assert got["mfu"] is None and got["mfu_error"] == "MFU error: 130% of the datasheet peak"
