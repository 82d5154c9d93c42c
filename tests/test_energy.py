"""Power and energy per item (milarun.measure.energy) against known counters: hand-made monitor
readings, and the real GPU monitor reading a fake NVML (no GPU here); the summary's
``energy``, the report's W, J/item, items/J columns and perf/W; "not available" on CPU."""

import sys
import time
import types

import pytest

from milarun.analysis.summary import summarize
from milarun.formats.record import new_result, validate
from milarun.formats.summary import check_summary, normalize_summary
from milarun.measure import energy


def steady_samples(rate=100.0, n=20, t0=1.0):
    """1 s samples from ``t0``, two warm-up: the steady state is [t0+9, t0+19]."""
    return [
        {"start": t0 + i, "end": t0 + i + 1, "count": rate, "rate": rate, "warmup": i < 2}
        for i in range(n)
    ]


def gpu_record(device=0, run=0, watts=300.0, rate=100.0, counter=True, node="n1", readings=None):
    rec = new_result(
        "s.t",
        f"{run}.{device}",
        device=str(device),
        devices=[device],
        run=run,
        plan_type="per-gpu",
        node=node,
        nodes=[node],
    )
    rec["timings"]["train"]["samples"] = steady_samples(rate)
    rec["timings"]["program"] = {"start": 1.7e9, "end": 1.7e9 + 25, "duration": 25.0}
    rec["metrics"] = {"loss": 0.1}
    if readings is None:
        readings = []
        for k in range(45):  # every 0.5 s over [0, 22]; energy grows at `watts`
            t = 0.5 * k
            row = {"t": t, "device": device, "load": 95.0, "memory_mib": 900.0, "power": watts}
            if counter:
                row["energy"] = watts * t
            readings.append(row)
    rec["gpu_monitor"] = {"available": True, "reason": None, "interval": 0.5, "samples": readings}
    rec["host"] = {
        "hostname": node,
        "cpu_model": "cpu",
        "gpus": [{"index": device, "name": "G", "memory_total_mib": 1000.0}],
    }
    rec["success"] = True
    return validate(rec)


def test_energy_from_the_counter_over_the_steady_state():
    e = energy.result_energy(gpu_record(watts=300.0, rate=100.0))
    assert e["source"] == "counter" and e["gpus"] == 1
    assert e["power_w"] == pytest.approx(300.0)
    assert e["items"] == pytest.approx(1000.0)  # 10 s at 100 items/s
    assert e["energy_j"] == pytest.approx(3000.0)
    assert e["j_per_item"] == pytest.approx(3.0) and e["items_per_j"] == pytest.approx(1 / 3)


def test_only_the_steady_state_counts():
    rec = gpu_record(watts=300.0)
    for r in rec["gpu_monitor"]["samples"]:  # 900 W during the warm-up (t < 3)
        r["energy"] = 900.0 * r["t"] if r["t"] <= 3 else 2700.0 + 300.0 * (r["t"] - 3)
    assert energy.result_energy(rec)["power_w"] == pytest.approx(300.0)


def test_power_readings_are_integrated_where_there_is_no_counter():
    rec = gpu_record(
        counter=False,
        readings=[{"t": float(t), "device": 0, "power": 200.0 + 10.0 * t} for t in range(0, 23)],
    )
    e = energy.result_energy(rec)
    assert e["source"] == "power"
    # mean of 200 + 10 t over [10, 20] is 350 W (linear, so the trapezoids are exact)
    assert e["power_w"] == pytest.approx(350.0)
    assert e["j_per_item"] == pytest.approx(3.5)


def test_counter_interpolated_between_readings_every_3_s():
    rec = gpu_record(
        readings=[
            {"t": float(t), "device": 0, "power": 1.0, "energy": 250.0 * t} for t in range(0, 25, 3)
        ]
    )
    assert energy.result_energy(rec)["power_w"] == pytest.approx(250.0)


@pytest.mark.parametrize(
    "change,reason",
    [
        (
            lambda r: r["gpu_monitor"].update(available=False, reason="no visible GPU", samples=[]),
            "no GPU monitor readings (no visible GPU)",
        ),
        (
            lambda r: r["gpu_monitor"].update(
                samples=[s for s in r["gpu_monitor"]["samples"] if s["t"] < 12]
            ),
            "GPU 0: the readings do not cover the steady state",
        ),
        (lambda r: r["timings"]["train"].update(samples=steady_samples()[:2]), "no steady state"),
    ],
)
def test_not_available_says_why(change, reason):
    rec = gpu_record()
    change(rec)
    assert energy.result_energy(rec) == {"reason": reason}


def test_summary_sums_power_per_node_and_keeps_energy_per_item():
    recs = [
        gpu_record(device=d, run=r, watts=w, node=n)
        for r in (0, 1)
        for d, w, n in ((0, 300.0, "n1"), (1, 100.0, "n1"), (2, 200.0, "n2"))
    ]
    summary = summarize(recs)
    check_summary(summary)
    e = summary["tests"]["s.t"]["energy"]
    assert e["n"] == 6 and e["source"] == "counter"
    assert e["power_w"]["mean"] == pytest.approx(200.0)
    assert e["j_per_item"] == pytest.approx(2.0) and e["items_per_j"] == pytest.approx(0.5)
    assert e["pernode"]["n1"] == pytest.approx({"power_w": 400.0, "j_per_item": 2.0, "runs": 2})
    assert e["pernode"]["n2"]["power_w"] == pytest.approx(200.0)
    assert normalize_summary(summary)["tests"]["s.t"]["energy"] == e


def test_report_columns_perf_per_watt_and_plot():
    from milarun.report import build_report, render_html, render_text

    recs = [gpu_record(device=0, watts=300.0), gpu_record(device=1, watts=100.0)]
    other = gpu_record(device=0, watts=50.0, rate=200.0)
    for r in (other,):
        r["name"], r["job_name"] = "s.u", "u"
    report = build_report(normalize_summary(summarize(recs + [other])))
    assert report.columns[-3:] == ["W", "J/item", "items/J"]
    row = {r["test"]: r for r in report.rows}
    assert row["s.t"]["W"] == pytest.approx(200.0) and row["s.t"]["J/item"] == pytest.approx(2.0)
    assert row["s.u"]["items/J"] == pytest.approx(4.0)
    # weighted geometric mean of items/J with the score's weights (1 each): sqrt(0.5 * 4)
    assert report.perf_per_watt == pytest.approx(2**0.5)
    text = render_text(report)
    assert "perf/W: 1.414 items/J (weighted geometric mean of items/J over 2 scored test(s)" in text
    assert "  s.t n1: 400.0 W, 2 J/item" in text
    page = render_html(report, records=recs + [other])
    assert 'id="perf-per-watt">1.414<' in page and 'id="energy-tests"' in page
    assert page.count("<svg") >= 3  # two throughput plots and the energy plot


def test_not_available_on_a_cpu_host():
    from milarun.report import build_report, render_text

    rec = gpu_record()
    rec["gpu_monitor"] = {
        "available": False,
        "reason": "no visible GPU",
        "interval": 1.0,
        "samples": [],
    }
    summary = summarize([rec])
    assert "energy" not in summary["tests"]["s.t"]
    report = build_report(normalize_summary(summary))
    assert "W" not in report.columns and report.perf_per_watt is None
    assert (
        "perf/W: not available (no GPU energy or power readings over the scored tests' "
        "steady states)"
    ) in render_text(report)


# ------------------------------------------------- the monitor on a fake NVML


def linear_nvml(watts, clock):
    """A fake ``pynvml`` with one GPU whose energy counter grows at ``watts`` on ``clock``."""
    nv = types.ModuleType("pynvml")
    nv.NVML_TEMPERATURE_GPU = 0
    t0 = clock()
    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetCount = lambda: 1
    nv.nvmlDeviceGetHandleByIndex = lambda i: object()
    nv.nvmlDeviceGetTotalEnergyConsumption = lambda h: int(5e6 + watts * 1000 * (clock() - t0))
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=80)
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=2**30, total=8 * 2**30)
    nv.nvmlDeviceGetTemperature = lambda h, kind: 50
    nv.nvmlDeviceGetPowerUsage = lambda h: watts * 1000
    return nv


def test_the_monitor_on_a_fake_nvml_gives_the_counters_power(monkeypatch):
    from milarun.bench.monitor import GPUMonitor

    # a fake clock, advanced by the monitor's own readings: exact and fast
    now = [0.0]

    def clock():
        return now[0]

    monkeypatch.setitem(sys.modules, "pynvml", linear_nvml(250, clock))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("milarun.bench.monitor.time.perf_counter", clock)
    mon = GPUMonitor(interval=60, origin=0.0)
    assert mon._init()
    mon.available = True
    for k in range(25):
        now[0] = float(k)
        mon._sample()
    rec = gpu_record(readings=mon.record()["samples"])
    rec["gpu_monitor"]["available"] = True
    e = energy.result_energy(rec)
    assert e["source"] == "counter" and e["power_w"] == pytest.approx(250.0, rel=1e-6)
    assert e["j_per_item"] == pytest.approx(2.5, rel=1e-6)


def test_the_monitor_thread_on_a_fake_nvml(monkeypatch):
    """The real thread and clock: the counter's power comes back within rounding."""
    from milarun.bench.monitor import GPUMonitor

    monkeypatch.setitem(sys.modules, "pynvml", linear_nvml(400, time.perf_counter))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    origin = time.perf_counter()
    with GPUMonitor(interval=0.01, origin=origin) as mon:
        time.sleep(0.3)
    readings = mon.record()["samples"]
    t_end = readings[-1]["t"]
    rec = gpu_record(readings=readings)
    n = 20
    dt = (t_end - 0.02) / n
    rec["timings"]["train"]["samples"] = [
        {
            "start": 0.01 + i * dt,
            "end": 0.01 + (i + 1) * dt,
            "count": 10,
            "rate": 10 / dt,
            "warmup": False,
        }
        for i in range(n)
    ]
    e = energy.result_energy(rec)
    # the counter is read in whole mJ: 1 mJ over ~0.1 s is 0.01 W
    assert e["power_w"] == pytest.approx(400.0, rel=1e-3)


def _two_node_record(nodes_sampled=2, node_rows=(0, 1)):
    """A multi-node record (2 nodes x 1 GPU, both GPU 0), rank 0's monitor merged with
    node 1's: 300 W on node 0, 500 W on node 1."""
    rec = gpu_record(watts=300.0)
    rec.pop("node", None)
    rec["nodes"], rec["node_count"] = ["n1", "n2"], 2
    rows = []
    for node, watts in ((0, 300.0), (1, 500.0)):
        if node not in node_rows:
            continue
        rows += [
            {"t": 0.5 * k, "device": 0, "node": node, "power": watts, "energy": watts * 0.5 * k}
            for k in range(45)
        ]
    rec["gpu_monitor"]["samples"] = rows
    if nodes_sampled is not None:
        rec["gpu_monitor"].update(
            {
                "nodes": 2,
                "nodes_sampled": nodes_sampled,
                "node_gaps": None if nodes_sampled == 2 else "n2: no GPU",
            }
        )
    return validate(rec)


def test_a_multi_node_record_sums_every_nodes_gpus():
    # node 1's GPU 0 is not node 0's GPU 0; J/item is the job's.
    e = energy.result_energy(_two_node_record())
    assert e["power_w"] == pytest.approx(800.0) and e["gpus"] == 2
    assert e["j_per_item"] == pytest.approx(8.0)


@pytest.mark.parametrize("sampled,rows", [(None, (0,)), (1, (0,))])
def test_a_multi_node_record_missing_a_nodes_readings_has_no_energy(sampled, rows):
    # Before the gathering, only node 0's GPUs were read: J/item would be 2x too low.
    e = energy.result_energy(_two_node_record(nodes_sampled=sampled, node_rows=rows))
    assert "power_w" not in e
    assert "1 of the job's 2 nodes" in e["reason"]


def test_merge_node_monitors_moves_each_nodes_readings_onto_rank_0s_clock():
    from milarun.bench.monitor import merge_node_monitors

    def mon(t, watts):
        return {
            "available": True,
            "reason": None,
            "interval": 1.0,
            "samples": [{"t": t, "device": 0, "power": watts}],
        }

    merged = merge_node_monitors(
        [
            {"node": "a", "clock": 50.0, "monitor": mon(10.0, 300.0)},
            {"node": "b", "clock": 20.0, "monitor": mon(-20.0, 500.0)},  # its origin was later
            {
                "node": "c",
                "clock": 9.0,
                "monitor": {
                    "available": False,
                    "reason": "NVML unavailable",
                    "interval": 1.0,
                    "samples": [],
                },
            },
        ],
        clock=50.0,
    )
    assert merged["available"] is True and merged["interval"] == 1.0
    assert merged["samples"] == [
        {"t": 10.0, "device": 0, "power": 300.0, "node": 0},
        {"t": 10.0, "device": 0, "power": 500.0, "node": 1},
    ]
    assert (merged["nodes"], merged["nodes_sampled"]) == (3, 2)
    assert merged["node_gaps"] == "c: NVML unavailable"
