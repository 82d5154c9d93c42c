"""matmul's sustained mode (--soak): the burst and sustained windows from fake block timings,
the refusal of non-random operands, what the GPU monitor saw over the soak, a short soak
on the CPU, and the node figure (the slowest GPU's sustained TFLOP/s) in the summary and
the report, from hand-made records."""

import io
import sys
import time
import types

import pytest
from conftest import run_model, summary_of
from test_acceptance_report import record
from test_monitor import fake_pynvml

from milarun.analysis.acceptance import acceptance_figures, kind_of, node_figures
from milarun.analysis.summary import node_of
from milarun.bench.monitor import GPUMonitor
from milarun.formats.store import write_result
from milarun.measure.acceptance import CAPPING_REASONS
from milarun.models import matmul
from milarun.report.acceptance import acceptance_sections, text_lines

FAST = ["--device", "cpu", "--sample-duration", "0.001", "--warmup", "1"]
#: NVML's "SW power cap" and "HW slowdown" bits (milarun.measure.acceptance).
POWER_CAP = next(bit for bit, name in CAPPING_REASONS.items() if "power" in name.lower())


def fake_blocks():
    """Rounds of one bf16 block (1 s) then one fp32 block (2 s): 3 s a round, 10 rounds.
    bf16 runs 100 matmuls a block, fp32 10; the first round is fast (a cool GPU): bf16
    0.8 s, fp32 1.6 s."""
    blocks, t = [], 0.0
    for i in range(10):
        bf16, fp32 = (0.8, 1.6) if i == 0 else (1.0, 2.0)
        blocks.append(("bf16", t, t + bf16, 100))
        t += bf16
        blocks.append(("fp32", t, t + fp32, 10))
        t += fp32
    return blocks


def test_split_blocks_takes_the_first_blocks_as_burst_and_the_blocks_after_the_soak():
    blocks = fake_blocks()
    windows = matmul.split_blocks(blocks, soak_s=10.0)
    # burst: the first block of each precision, after warm-up
    assert windows["bf16"]["burst"] == pytest.approx((0.8, 100))
    assert windows["fp32"]["burst"] == pytest.approx((1.6, 10))
    # sustained: the blocks that start at 10 s or later (round 0 ends at 2.4 s, then 3 s
    # a round: bf16 starts at 2.4 + 3k, fp32 at 3.4 + 3k): 6 of each, from 11.4 and 12.4 s
    assert [s for n, s, _, _ in blocks if n == "bf16" and s >= 10.0][0] == pytest.approx(11.4)
    assert windows["bf16"]["sustained"] == pytest.approx((6 * 1.0, 6 * 100))
    assert windows["fp32"]["sustained"] == pytest.approx((6 * 2.0, 6 * 10))
    assert windows["bf16"]["complete"] and windows["fp32"]["complete"]


def test_split_blocks_without_a_soak_counts_every_block_and_with_a_long_one_the_last():
    blocks = fake_blocks()
    every = matmul.split_blocks(blocks, soak_s=0.0)
    assert every["bf16"]["sustained"] == pytest.approx((0.8 + 9 * 1.0, 1000))
    short = matmul.split_blocks(blocks, soak_s=1000.0)
    assert short["fp32"]["complete"] is False
    assert short["fp32"]["sustained"] == pytest.approx((2.0, 10))  # its last block
    assert matmul.split_blocks([], 5.0) == {}


def test_soak_metrics_report_burst_and_sustained_tflops():
    exp = types.SimpleNamespace(metrics={})
    blocks = fake_blocks()
    flop = 2.0 * 1000**3  # 2 GFLOP a matmul
    matmul._soak_metrics(exp, matmul.split_blocks(blocks, 10.0), 10.0, flop, blocks)
    m = exp.metrics
    # bf16: burst 100 matmuls in 0.8 s, sustained 600 in 6 s
    assert m["tflops_bf16_burst"] == pytest.approx(flop * 100 / 0.8 / 1e12)
    assert m["tflops_bf16"] == pytest.approx(flop * 600 / 6.0 / 1e12)
    assert m["tflops_bf16_burst"] > m["tflops_bf16"]
    assert m["matmuls_fp32"] == 60 and m["soak_s"] == 10.0 and m["soak_complete"] is True
    assert m["soak_reached_s"] == pytest.approx(11.4)


def test_soak_window_covers_the_soak_and_a_measured_window():
    assert matmul.soak_window(60.0, ["bf16"], 1000.0) == pytest.approx(66.0)
    assert matmul.soak_window(2.0, ["fp32", "bf16"], 0.0) == pytest.approx(3.0)
    assert matmul.soak_window(5.0, ["a", "b", "c", "d"], 1000.0) == pytest.approx(13.0)


@pytest.mark.parametrize(
    "std,mean,zeros,n,why",
    [
        (1.0, 0.0, 0.0, None, None),
        (0.95, 0.02, 0.005, None, None),
        (0.0, 0.0, 1.0, None, "standard deviation"),  # zeros
        (0.125, 0.0156, 0.984, None, "standard deviation"),  # a 64x64 identity
        (1.0, 0.5, 0.0, None, "mean"),
        (1.0, 0.0, 0.3, None, "zeros"),
        # a 16x16 matrix of normal data: its mean and std vary by 1/16 and 1/23
        (0.85, -0.15, 0.0, 256, None),
        (1.0, 0.0, 0.9375, 256, "zeros"),  # a 16x16 identity with unit std
        (0.242, 0.0625, 0.9375, 256, "standard deviation"),  # a 16x16 identity
        (0.8, 0.0, 0.0, 2**26, "standard deviation"),  # 8192x8192: the tight bounds
    ],
)
def test_operand_problem_accepts_normal_data_only(std, mean, zeros, n, why):
    got = matmul.operand_problem(std, mean, zeros, n)
    assert got is None if why is None else why in got


def test_check_operands_refuses_zeros_and_an_identity():
    import torch

    gen = torch.Generator().manual_seed(0)
    a, b, _ = matmul._setup("bf16", 128, torch.device("cpu"), gen)
    matmul.check_operands("bf16", a, b)  # seeded normal data: no error
    for seed in range(50):  # small matrices of normal data pass too
        gen.manual_seed(seed)
        matmul.check_operands("fp32", *matmul._setup("fp32", 4, torch.device("cpu"), gen)[:2])
    with pytest.raises(ValueError, match=r"^matmul fp32: operand A is not normal\(0,1\)"):
        matmul.check_operands("fp32", torch.eye(128), b.float())
    with pytest.raises(ValueError, match="operand B"):
        matmul.check_operands("fp32", a.float(), torch.zeros(128, 128))


def test_soak_telemetry_reads_clocks_power_and_reasons_in_the_window():
    rows = [
        {"t": 0.5, "power": 100.0, "sm_clock_mhz": 1980, "clock_reasons": 0},  # warm-up
        {"t": 2.0, "power": 690.0, "sm_clock_mhz": 1900, "clock_reasons": 0},
        {"t": 3.0, "power": 700.0, "sm_clock_mhz": 1700, "clock_reasons": POWER_CAP},
        {"t": 4.0, "power": 698.0, "sm_clock_mhz": 1750, "clock_reasons": POWER_CAP},
        {"t": 9.0, "power": 90.0, "sm_clock_mhz": 1980, "clock_reasons": 0},  # after
    ]
    got = matmul.soak_telemetry(rows, 1.0, 5.0)
    assert got["soak_readings"] == 3
    assert got["soak_clock_mean_mhz"] == pytest.approx((1900 + 1700 + 1750) / 3)
    assert got["soak_clock_min_mhz"] == 1700
    assert got["soak_power_mean_w"] == pytest.approx((690 + 700 + 698) / 3)
    assert got["soak_throttled_fraction"] == pytest.approx(2 / 3)
    assert got["soak_throttle_reasons"] and got["soak_telemetry"] == "complete"
    # a monitor that reads power only says what it did not read
    bare = matmul.soak_telemetry([{"t": 2.0, "power": 300.0}], 1.0, 5.0)
    assert bare["soak_power_mean_w"] == 300.0 and "soak_clock_mean_mhz" not in bare
    assert bare["soak_telemetry"] == "not read by the GPU monitor: SM clock, throttle reasons"


def test_monitor_records_the_sm_clock_and_clock_event_reasons(monkeypatch):
    nv = fake_pynvml(count=1)
    nv.NVML_CLOCK_SM = 1
    nv.nvmlDeviceGetClockInfo = lambda h, kind: 1755
    nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: POWER_CAP
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with GPUMonitor(interval=0.01) as mon:
        time.sleep(0.03)
    rows = mon.record()["samples"]
    assert rows and all(r["sm_clock_mhz"] == 1755 for r in rows)
    assert all(r["clock_reasons"] == POWER_CAP for r in rows)


def test_monitor_without_clock_readings_leaves_them_out(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=1))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with GPUMonitor(interval=0.01) as mon:
        time.sleep(0.02)
    rows = mon.record()["samples"]
    assert rows and not any("sm_clock_mhz" in r or "clock_reasons" in r for r in rows)


def test_a_short_soak_on_the_cpu_records_burst_sustained_and_inputs(tmp_path):
    res = run_model(
        "milarun.models.matmul:main",
        FAST + ["--size", "32", "--precisions", "fp32,bf16", "--soak", "0.3", "--seed", "7"],
        tmp_path=tmp_path,
    )
    assert res["success"], res["error"]
    m = res["metrics"]
    assert m["inputs"] == "normal(0,1), seed 7"
    assert m["soak_s"] == 0.3 and m["soak_complete"] is True
    assert m["soak_reached_s"] >= 0.3
    for p in ("fp32", "bf16"):
        assert m[f"tflops_{p}"] > 0 and m[f"tflops_{p}_burst"] > 0
    # the run went on for the soak and its measured window (min_steady raised to 1.3 s)
    assert res["timings"]["train"]["min_steady"] == pytest.approx(1.3)
    steady = [s for s in res["timings"]["train"]["samples"] if not s.get("warmup")]
    assert steady[-1]["end"] - steady[0]["start"] >= 1.0
    # no GPU monitor on the CPU: it says what it did not read
    assert m["soak_readings"] == 0 and m["soak_telemetry"].startswith("not read")


def test_without_a_soak_the_record_is_as_before(tmp_path):
    res = run_model(
        "milarun.models.matmul:main",
        FAST + ["--size", "16", "--precisions", "fp32", "--min-steady", "0.05"],
        tmp_path=tmp_path,
    )
    assert res["success"], res["error"]
    m = res["metrics"]
    assert m["tflops_fp32"] > 0 and "tflops_fp32_burst" not in m and "soak_s" not in m
    assert m["inputs"].startswith("normal(0,1), seed ")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--soak", "-1"], "--soak must be between 0 and"),
        (["--soak", "5", "--no-instrument"], "--soak needs the rate logger"),
    ],
)
def test_soak_bad_inputs(tmp_path, argv, message):
    res = run_model("milarun.models.matmul:main", FAST + ["--size", "16"] + argv, tmp_path=tmp_path)
    assert res["success"] is False and message in res["error"]["message"]


# --- the node figure: the slowest GPU's sustained TFLOP/s -----------------------------


def soak_record(node, device, bf16, burst=None, fp32=50.0, run=0):
    metrics = {
        "size": 8192,
        "soak_s": 600.0,
        "tflops_bf16": bf16,
        "tflops_bf16_burst": burst or bf16 * 1.1,
        "tflops_fp32": fp32,
        "tflops_fp32_burst": fp32 * 1.05,
        "peak_tflops_bf16": 989.4,
        "inputs": "normal(0,1), seed 0",
    }
    return record("mm", "matmul", device=str(device), node=node, metrics=metrics, run=run)


def soak_records():
    return [
        soak_record("node1", 0, 650.0),
        soak_record("node1", 1, 640.0),
        soak_record("node1", 2, 610.0),  # node1's slowest
        soak_record("node1", 3, 655.0),
        soak_record("node2", 0, 600.0, run=0),
        soak_record("node2", 0, 640.0, run=1),  # device 0's median over its runs: 620
        soak_record("node2", 1, 500.0),  # node2's slowest, by far
    ]


def test_a_soaked_matmul_is_an_acceptance_test_without_its_sweep():
    recs = soak_records()
    assert kind_of(recs[0]) == "matmul"
    plain = record("mm", "matmul", metrics={"tflops_bf16": 600.0})
    assert kind_of(plain) is None


def test_node_figure_is_the_slowest_gpu_with_the_spread():
    acc = acceptance_figures(soak_records(), node_of)
    assert acc["test"] == "matmul"
    by = {e["precision"]: e for e in acc["matmul"]}
    assert set(by) == {"bf16", "fp32"}  # tflops_<p>_burst is no precision of its own
    bf16 = by["bf16"]
    assert bf16["soak_s"] == 600.0
    assert bf16["burst_tflops"] == pytest.approx(1.1 * 640.0)  # the median of the records
    nodes = {n["node"]: n for n in bf16["nodes"]}
    assert nodes["node1"] == {
        "node": "node1",
        "tflops": 610.0,
        "max_tflops": 655.0,
        "spread": pytest.approx(655.0 / 610.0),
        "slowest": "2",
        "devices": 4,
    }
    assert nodes["node2"]["tflops"] == 500.0 and nodes["node2"]["slowest"] == "1"
    assert nodes["node2"]["max_tflops"] == 620.0 and nodes["node2"]["devices"] == 2


def test_node_figures_break_ties_by_device_and_name_nodes_first():
    got = node_figures({("b", "1"): 10.0, ("b", "0"): 10.0, (None, "0"): 5.0, ("a", "0"): 0.0})
    assert [n["node"] for n in got] == ["a", "b", None]
    assert got[0]["spread"] is None  # a 0 TFLOP/s device: no ratio
    assert got[1]["slowest"] == "0" and got[1]["spread"] == 1.0


def test_the_summary_keeps_the_node_figure_and_the_report_shows_it(tmp_path):
    for rec in soak_records():  # a record's file name has no node: one folder per node
        (tmp_path / rec["node"]).mkdir(exist_ok=True)
        write_result(rec, tmp_path / rec["node"])
    summary = summary_of(tmp_path)  # the schema accepts it
    body = summary["tests"]["acc.mm"]["acceptance"]["matmul"]
    assert {
        n["node"]: n["tflops"] for e in body if e["precision"] == "bf16" for n in e["nodes"]
    } == {
        "node1": 610.0,
        "node2": 500.0,
    }
    text = "\n".join(text_lines(acceptance_sections(summary["tests"])))
    assert "node figure: the slowest GPU's sustained fixed-shape TFLOP/s" in text
    line = next(x for x in text.splitlines() if x.split()[:2] == ["node2", "bf16"])
    assert line.split() == ["node2", "bf16", "500", "620", "1.240", "1", "2"]
    assert "burst (first blocks after warm-up) and sustained (after the 600 s soak" in text
    lines = text.splitlines()
    at = next(i for i, x in enumerate(lines) if x.strip().startswith("burst (first blocks"))
    assert lines[at + 1].split() == ["precision", "burst", "sustained", "change"]
    # bf16: the medians 704 (burst) and 640 (sustained)
    assert lines[at + 2].split() == ["bf16", "704", "640", f"{100 * (640 / 704 - 1):+.1f}%"]


def test_the_html_report_shows_the_node_figure(tmp_path):
    from milarun.report import make_report

    for rec in soak_records():
        (tmp_path / rec["node"]).mkdir(exist_ok=True)
        write_result(rec, tmp_path / rec["node"])
    make_report(str(tmp_path), html=str(tmp_path / "r.html"), warn=io.StringIO())
    page = (tmp_path / "r.html").read_text()
    section = page.split('id="matmul-acc.mm"')[1]
    assert "node figure: the slowest GPU&#39;s sustained" in section  # escaped by jinja
    assert "burst (first blocks after warm-up)" in section
