"""The acceptance tests of delivered hardware (docs/acceptance.md), on the CPU.

``collectives`` over 2 and 4 gloo ranks under torchrun (bus bandwidth checked against a
hand computation from the recorded time), a wrong collective result and a corrupted
burn-in matmul as FAIL records with their reasons, ``bandwidth`` on the CPU (STREAM on
host memory, the copies "not applicable"), ``matmul`` in fp64 with the shape sweep and FP8
reported unsupported, the throttle figures against fake clock readings and a fake NVML,
the expected peaks against a fake sysfs tree, and bad inputs as one error before anything
runs. None of it ran on a GPU: docs/acceptance.md lists what is untested there.
"""

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT, run_model, steady_samples
from test_monitor import fake_pynvml

from milarun.formats.record import validate
from milarun.host.accel.nvidia import NvidiaBackend
from milarun.host.interconnect import active_rates, infiniband_ports, parse_ib_rate
from milarun.measure import acceptance
from milarun.models import burn, collectives

FAST = ["--device", "cpu", "--sample-duration", "0.001", "--warmup", "1"]


# --- pure figures ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "op,ranks,factor",
    [
        ("all_reduce", 2, 1.0),
        ("all_reduce", 4, 1.5),
        ("all_reduce", 8, 1.75),
        ("all_gather", 4, 0.75),
        ("reduce_scatter", 8, 0.875),
        ("all_to_all", 2, 0.5),
        ("broadcast", 8, 1.0),
        ("all_reduce", 1, 0.0),
    ],
)
def test_bus_factor_is_nccl_tests(op, ranks, factor):
    assert acceptance.bus_factor(op, ranks) == pytest.approx(factor)


def test_bandwidths_by_hand():
    # 1 GiB all-reduced over 8 ranks in 10 ms: algbw 107.37 GB/s, busbw × 2·7/8
    algbw, busbw = acceptance.bandwidths("all_reduce", 2**30, 0.010, 8)
    assert algbw == pytest.approx(2**30 / 0.010 / 1e9)
    assert busbw == pytest.approx(algbw * 1.75)
    assert acceptance.bandwidths("broadcast", 8, 0.0, 2) == (None, None)


def test_message_sizes_double_from_8_bytes():
    assert acceptance.message_sizes(64) == [8, 16, 32, 64]
    assert acceptance.message_sizes(100) == [8, 16, 32, 64]
    assert acceptance.message_sizes(2**33)[-1] == 2**33
    assert acceptance.elements_for("all_gather", 8, 4) == (4, 16)  # one float per rank
    assert acceptance.elements_for("all_to_all", 40, 4) == (8, 32)  # rounded down to 4·k
    assert acceptance.elements_for("all_reduce", 40, 4) == (10, 40)


@pytest.mark.parametrize(
    "max_size,min_size,message",
    [
        (4, 8, "--max-size must be between 8 B"),
        (2**37, 8, "--max-size must be between"),
        (64, 128, "is below --min-size"),
        (64, 0, "--min-size must be between"),
    ],
)
def test_message_sizes_out_of_range(max_size, min_size, message):
    with pytest.raises(ValueError, match=message):
        acceptance.message_sizes(max_size, min_size)


def test_infiniband_rates_from_a_fake_sysfs(tmp_path):
    def port(dev, n, rate, state="4: ACTIVE", layer="InfiniBand"):
        d = tmp_path / "sys" / "class" / "infiniband" / dev / "ports" / str(n)
        d.mkdir(parents=True)
        (d / "rate").write_text(rate + "\n")
        (d / "state").write_text(state + "\n")
        (d / "link_layer").write_text(layer + "\n")

    port("mlx5_0", 1, "400 Gb/sec (4X NDR)")
    port("mlx5_1", 1, "400 Gb/sec (4X NDR)", state="1: DOWN")
    port("mlx5_2", 1, "200 Gb/sec (2X NDR)", layer="Ethernet")  # RoCE
    port("mlx5_3", 1, "Unknown")
    ports = infiniband_ports(tmp_path)
    assert [(p["device"], p["rate_gbits"], p["active"]) for p in ports] == [
        ("mlx5_0", 400.0, True),
        ("mlx5_1", 400.0, False),
        ("mlx5_2", 200.0, True),
        ("mlx5_3", None, True),
    ]
    assert active_rates(ports) == [400.0, 200.0]
    assert infiniband_ports(tmp_path / "nothing") == []
    assert parse_ib_rate("25 Gb/sec (1X EDR)") == 25.0 and parse_ib_rate("") is None
    # 600 Gb/s over 8 GPUs: 9.375 GB/s each across nodes; NVLink 4.0 x 18 inside one
    assert acceptance.expected_busbw_gbps(None, [400.0, 200.0], 8, 2) == (9.375, "network")
    assert acceptance.nvlink_peak_gbps(6, 18) == 450.0
    assert acceptance.expected_busbw_gbps(450.0, [400.0], 8, 1) == (450.0, "nvlink")
    assert acceptance.expected_busbw_gbps(None, [], 1, 1) == (None, None)


def test_numa_pages_of_a_buffer():
    maps = (
        "7f0000000000 default anon=10 N0=10 kernelpagesize_kB=4\n"
        "7f1000000000 bind:1 anon=512 dirty=512 N1=500 N0=12 kernelpagesize_kB=4\n"
        "garbage line\n"
    )
    assert acceptance.numa_pages(maps, 0x7F1000000100) == {1: 500, 0: 12}
    assert acceptance.numa_pages(maps, 0x7F0000000010) == {0: 10}
    assert acceptance.numa_pages(maps, 0x10) == {}


# --- throttling: fake readings, fake NVML ----------------------------------------------

POWER_CAP, THERMAL, IDLE = 0x4, 0x40, 0x1


def _readings(clocks, reasons):
    return [
        {"t": float(i), "sm_clock_mhz": c, "reasons": r}
        for i, (c, r) in enumerate(zip(clocks, reasons))
    ]


def test_throttle_metrics_against_fake_readings():
    # 10 readings, 1 s apart: the first (10 % of the run) is the start
    steady = acceptance.throttle_metrics(_readings([1980] * 10, [0] * 10))
    assert steady["throttled_fraction"] == 0.0 and steady["throttled"] is False
    assert steady["clock_drop"] is False and steady["clock_start_mhz"] == 1980.0
    # power capping for 3 of the 9 steady readings, thermal for 1: 4/9 of the time
    capped = acceptance.throttle_metrics(
        _readings([1980] * 10, [0, 0, POWER_CAP, POWER_CAP, POWER_CAP, THERMAL, 0, IDLE, 0, 0])
    )
    assert capped["throttled_fraction"] == pytest.approx(4 / 9) and capped["throttled"]
    assert capped["throttle_reasons"] == "sw_power_cap,hw_thermal,gpu_idle"
    # clocks at 1500 (< 0.9 x 1980) for 6 of 9 steady readings: a sustained drop
    drop = acceptance.throttle_metrics(_readings([1980, 1980, 1980, 1980] + [1500] * 6, [0] * 10))
    assert drop["clock_low_fraction"] == pytest.approx(6 / 9) and drop["clock_drop"] is True
    assert drop["clock_steady_mhz"] == pytest.approx((3 * 1980 + 6 * 1500) / 9)
    # a short dip (2 of 9) is not sustained
    dip = acceptance.throttle_metrics(_readings([1980] * 5 + [1500] * 2 + [1980] * 3, [0] * 10))
    assert dip["clock_drop"] is False and dip["clock_low_fraction"] == pytest.approx(2 / 9)
    # nothing to tell: None, not a verdict
    assert acceptance.throttle_metrics([])["throttled"] is None
    none = acceptance.throttle_metrics(_readings([None] * 3, [None] * 3))
    assert none["throttled_fraction"] is None and none["clock_drop"] is None


def _nvml_with_clocks(events=True, links=4):
    nv = fake_pynvml(count=1)
    nv.NVML_CLOCK_SM = 1
    nv.NVML_NVLINK_MAX_LINKS = 18
    state = {"clock": 1980, "reasons": 0}
    nv.nvmlDeviceGetClockInfo = lambda h, kind: state["clock"]
    if events:
        nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: state["reasons"]
    else:  # drivers before R535: the older name, the same bits
        nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: state["reasons"]
    nv.nvmlDeviceGetNvLinkState = lambda h, link: 1 if link < links else 0
    nv.nvmlDeviceGetNvLinkVersion = lambda h, link: 6
    return nv, state


@pytest.mark.parametrize("events", [True, False])
def test_nvidia_backend_reads_clocks_reasons_and_nvlink(monkeypatch, events):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nv, state = _nvml_with_clocks(events)
    backend = NvidiaBackend(pynvml=nv)
    (dev,) = backend.discover()
    state["reasons"] = POWER_CAP | THERMAL
    assert backend.clocks(dev) == {"sm_clock_mhz": 1980, "reasons": 0x44}
    assert backend.nvlink(dev) == {"version": 6, "links": 4}
    assert acceptance.reason_names(0x44) == ["sw_power_cap", "hw_thermal"]
    bare = fake_pynvml(count=1)  # a pynvml without any of it
    backend = NvidiaBackend(pynvml=bare)
    (dev,) = backend.discover()
    assert backend.clocks(dev) is None and backend.nvlink(dev) is None


def test_collectives_expected_peak_from_a_fake_nvml_and_sysfs(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("MILARUN_BACKEND", "nvidia")
    nv, _ = _nvml_with_clocks(links=18)  # NVLink 4.0 (NVML's 6) x 18: an H100
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    for dev in ("mlx5_0", "mlx5_1"):
        d = tmp_path / "sys" / "class" / "infiniband" / dev / "ports" / "1"
        d.mkdir(parents=True)
        (d / "rate").write_text("400 Gb/sec (4X NDR)\n")
        (d / "state").write_text("4: ACTIVE\n")
    inside = collectives.expected_peak(8, 1, 8, root=tmp_path)
    assert inside["nvlink_links"] == 18 and inside["nvlink_peak_gbps"] == 450.0
    assert (inside["expected_busbw_gbps"], inside["expected_bound"]) == (450.0, "nvlink")
    across = collectives.expected_peak(16, 2, 8, root=tmp_path)
    assert across["ib_ports"] == 2 and across["ib_rate_gbits"] == 800.0
    assert (across["expected_busbw_gbps"], across["expected_bound"]) == (12.5, "network")


def test_burn_clock_sampler_flags_power_capping_through_a_fake_nvml(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("MILARUN_BACKEND", "nvidia")
    nv, state = _nvml_with_clocks()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = burn.ClockSampler(0.01, time.perf_counter()).start()
    time.sleep(0.15)
    state.update(clock=1400, reasons=POWER_CAP)
    time.sleep(0.3)
    sampler.stop()
    assert sampler.reason is None and len(sampler.readings) >= 10
    m = acceptance.throttle_metrics(sampler.readings)
    assert m["throttled"] is True and 0.4 < m["throttled_fraction"] < 0.95
    assert m["clock_start_mhz"] == 1980.0 and m["clock_drop"] is True


# --- the workloads on the CPU ----------------------------------------------------------


def _torchrun(function, out, argv, ranks):
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    extra = {"run": 0, "device": "all", "devices": list(range(ranks)), "partition": "njobs"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(ranks),
        "-m",
        "milarun",
        "run",
        function,
        "-o",
        str(out),
        "--experiment-name",
        "t.collectives",
        "--job-id",
        "0.all",
        "--extra",
        json.dumps(extra),
        "--",
        *argv,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    validate(res)
    assert res["success"], res["error"]
    return res


def _check_collectives(res, ranks, max_size):
    rows = res["collectives"]
    assert {r["op"] for r in rows} == set(acceptance.COLLECTIVES)
    assert res["metrics"]["world_size"] == ranks and res["metrics"]["backend"] == "gloo"
    per_op = {op: [r for r in rows if r["op"] == op] for op in acceptance.COLLECTIVES}
    assert [r["bytes"] for r in per_op["all_reduce"]] == acceptance.message_sizes(max_size)
    factor = {
        "all_reduce": 2 * (ranks - 1) / ranks,
        "all_gather": (ranks - 1) / ranks,
        "reduce_scatter": (ranks - 1) / ranks,
        "all_to_all": (ranks - 1) / ranks,
        "broadcast": 1.0,
    }
    for row in rows:
        assert row["ranks"] == ranks and row["time_s"] > 0
        # the split collectives hold a whole number of floats per rank
        if row["op"] in ("all_gather", "reduce_scatter", "all_to_all"):
            assert row["bytes"] % (4 * ranks) == 0
        algbw = row["bytes"] / row["time_s"] / 1e9  # by hand
        assert row["algbw_gbps"] == pytest.approx(algbw)
        assert row["busbw_gbps"] == pytest.approx(algbw * factor[row["op"]])
    assert res["metrics"]["busbw_all_reduce_max_gbps"] == pytest.approx(
        max(r["busbw_gbps"] for r in per_op["all_reduce"])
    )
    assert steady_samples(res)
    assert (
        res["metrics"]["ib_ports"] >= 0
        and "expected_busbw_gbps" not in res["metrics"]
        or res["metrics"]["expected_bound"] in ("nvlink", "network")
    )


def test_collectives_over_four_gloo_ranks(tmp_path):
    res = _torchrun(
        "milarun.models.collectives:main",
        tmp_path / "r.json",
        FAST + ["--max-size", "1024", "--iters", "2", "--warmup-iters", "1"],
        4,
    )
    _check_collectives(res, 4, 1024)


def test_the_cpu_profile_runs_every_test_over_two_slots(tmp_path):
    # milarun jobs as a user runs it: collectives over both slots (njobs: 2 gloo ranks under
    # torchrun), bandwidth, matmul and the burn-in on each slot, both at once (per-gpu)
    (tmp_path / "data").mkdir()
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "milarun",
            "jobs",
            "profiles/acceptance-cpu.json",
            "--cpu-slots",
            "2",
            "--no-cgexec",
            "-d",
            str(tmp_path / "data"),
            "-o",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = {}
    for path in out.glob("*.json"):
        res = json.loads(path.read_text())
        validate(res)
        assert res["success"], (path.name, res["error"])
        records.setdefault(res["name"].split(".")[1], []).append(res)
    assert sorted((k, len(v)) for k, v in records.items()) == [
        ("bandwidth", 2),
        ("burn", 2),
        ("checkpoint", 1),
        ("collectives", 1),
        ("matmul", 2),
        ("smallfiles", 1),
        ("soak", 1),
    ]
    # the storage tests and the soak leave nothing in the dataroot they wrote into
    assert not list((tmp_path / "data").glob("milarun-*"))
    _check_soak(records["soak"][0])
    _check_collectives(records["collectives"][0], 2, 65536)
    for res in records["matmul"]:
        assert res["metrics"]["tflops_fp8_e4m3"] == "not supported on this device"
        assert res["metrics"]["mamf_tflops_fp64"] > 0
    for res in records["burn"]:
        assert res["metrics"]["iterations"] > 0 and res["metrics"]["duration_s"] >= 5
    for res in records["bandwidth"]:
        assert res["metrics"]["h2d"] == "not applicable"


def _check_soak(res):
    """A soak record of the cpu profile: one rank killed at its seeded step, torchrun's
    restart from the checkpoint before it, and the wall time split into its parts."""
    from milarun.models.llm_pretrain import optimizer_steps
    from milarun.models.soak import fault_plan

    m = res["metrics"]
    total = optimizer_steps(5120, 4 * 32 * 2)
    assert (m["soak_fault_step"], m["soak_fault_rank"]) == fault_plan(res["seed"], total, 4, 2)
    assert m["soak_restarts"] == 1 and m["soak_every_steps"] == 4
    # saved at every 4th step before the fault, then at each 4th after the step resumed from
    resumed = m["soak_fault_step"] // 4 * 4
    assert m["soak_lost_steps"] == m["soak_fault_step"] - resumed
    assert m["soak_checkpoints"] == resumed // 4 + len(range(resumed + 4, total, 4))
    assert m["soak_restart_s"] > 0 and m["soak_load_s"] > 0 and m["soak_save_s"] > 0
    parts = m["soak_productive_s"] + m["soak_checkpoint_s"] + m["soak_lost_s"]
    assert parts + m["soak_restart_s"] == pytest.approx(m["soak_wall_s"], rel=0.02)
    assert m["soak_ettr"] == pytest.approx(m["soak_productive_s"] / m["soak_wall_s"])
    assert 0 < m["soak_ettr"] < 1
    # the restarted attempt trained on from the checkpoint: it counted only the steps left
    assert res["timings"]["train"]["count"] == (total - resumed) * 4 * 32 * 2


def test_collectives_wrong_result_is_a_fail_record(tmp_path, monkeypatch):
    def corrupt(op, nbytes, rank, out):
        if op == "all_gather" and nbytes == 64:
            out = out.clone()
            out[3] += 1.0
        return out

    monkeypatch.setattr(collectives, "_hook_result", corrupt)
    res = run_model(
        "milarun.models.collectives:main", FAST + ["--max-size", "256"], tmp_path=tmp_path
    )
    assert res["success"] is False
    assert res["error"]["reason"] == "wrong-result"
    assert "all_gather of 64 B over 1 ranks" in res["error"]["message"]
    assert "largest error 1" in res["error"]["message"]
    validate({k: v for k, v in res.items() if k != "_exit_code"})


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--ops", "all_reduce,allreduce_v"], "unknown: allreduce_v"),
        (["--ops", ""], "--ops must list some of"),
        (["--max-size", "4"], "--max-size must be between 8 B"),
        (["--max-size", str(2**40)], "--max-size must be between 8 B"),
        (["--iters", "0"], "--iters must be between 1"),
    ],
)
def test_collectives_bad_inputs_are_one_error_before_anything_runs(tmp_path, argv, message):
    res = run_model("milarun.models.collectives:main", FAST + argv, tmp_path=tmp_path)
    assert res["success"] is False and res["error"]["reason"] == "error"
    assert message in res["error"]["message"]
    assert "collectives" not in res and not (res["timings"].get("train") or {}).get("samples")
    assert "world_size" not in res["metrics"]  # no process group was made


def test_bandwidth_on_the_cpu(tmp_path):
    res = run_model(
        "milarun.models.bandwidth:main",
        FAST + ["--array-size", "1048576", "--iters", "2"],
        tmp_path=tmp_path,
    )
    assert res["success"], res["error"]
    m = res["metrics"]
    for key in ("h2d", "d2h", "bidir", "d2d"):
        assert m[key] == "not applicable"
    assert not any(k.startswith(("h2d_", "d2h_", "d2d_gbps")) for k in m)  # no fake figure
    for kernel in ("copy", "scale", "add", "triad"):
        assert m[f"stream_{kernel}_gbps"] > 0
    assert m["dtype"] == "fp64" and m["array_size"] == 1048576
    assert len(res["timings"]["train"]["samples"]) == 4  # one per kernel
    assert acceptance.stream_bytes("triad", 131072, 8) == 3 * 1048576


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--array-size", "4"], "--array-size must be 0"),
        (["--dtype", "fp16"], "--dtype must"),
        (["--copy-size", str(2**37)], "--copy-size must be 0"),
    ],
)
def test_bandwidth_bad_inputs(tmp_path, argv, message):
    res = run_model("milarun.models.bandwidth:main", FAST + argv, tmp_path=tmp_path)
    assert res["success"] is False and message in res["error"]["message"]


def test_matmul_fp64_sweep_and_fp8_unsupported_on_the_cpu(tmp_path):
    res = run_model(
        "milarun.models.matmul:main",
        FAST
        + [
            "--size",
            "32",
            "--precisions",
            "fp32,fp64,fp8_e4m3,fp8_e5m2",
            "--max-count",
            "60",
            "--sweep",
            "--sweep-iters",
            "2",
            "--sweep-shapes",
            "16x16x16,32x16x64",
        ],
        tmp_path=tmp_path,
    )
    assert res["success"], res["error"]
    m = res["metrics"]
    assert m["tflops_fp64"] > 0 and m["tflops_fp32"] > 0
    assert m["tflops_fp8_e4m3"] == m["tflops_fp8_e5m2"] == "not supported on this device"
    for p in ("fp32", "fp64"):
        assert m[f"mamf_tflops_{p}"] > 0
        assert m[f"mamf_shape_{p}"] in ("16x16x16", "32x16x64")
    assert "peak_tflops_fp64" not in m  # a CPU has no datasheet peak
    assert m["precisions"] == "fp32,fp64,fp8_e4m3,fp8_e5m2"


def test_matmul_runs_each_precision_in_blocks_of_about_block_ms(tmp_path):
    res = run_model(
        "milarun.models.matmul:main",
        FAST
        + [
            "--size",
            "32",
            "--precisions",
            "fp32,bf16",
            "--block-ms",
            "5",
            "--max-count",
            "2",
            "--min-steady",
            "0.05",
        ],
        tmp_path=tmp_path,
    )
    assert res["success"], res["error"]
    m = res["metrics"]
    assert m["block_ms"] == 5.0
    # a 32³ matmul takes microseconds: a 5 ms block holds many, every one counted
    assert m["block_fp32"] > 1 and m["block_bf16"] > 1
    for p in ("fp32", "bf16"):
        assert m[f"matmuls_{p}"] % m[f"block_{p}"] == 0
    step = m["block_fp32"] + m["block_bf16"]
    counts = [s["count"] for s in res["timings"]["train"]["samples"]]
    assert counts and all(c % step == 0 for c in counts)


def test_matmul_block_sizes_follow_the_timed_matmul(monkeypatch):
    import torch

    from milarun.models import matmul

    clock = iter([0.0, 0.004, 1.0, 1.0005])  # fp32 matmul: 4 ms, bf16: 0.5 ms
    monkeypatch.setattr(matmul.time, "perf_counter", lambda: next(clock))
    mats = {p: matmul._setup(p, 4, torch.device("cpu"), None) for p in ("fp32", "bf16")}
    sizes = matmul.block_sizes(torch.device("cpu"), ["fp32", "bf16"], mats, 100.0)
    assert sizes == {"fp32": 25, "bf16": 200}
    assert matmul.block_sizes(torch.device("cpu"), ["fp32"], mats, 0) == {"fp32": 1}


def test_matmul_peaks_are_one_table():
    from milarun.measure.mfu import peak_tflops
    from milarun.models.matmul import _versus_peak

    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp64") == 66.9
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "fp64") == 19.5
    metrics = {"tflops_fp8_e4m3": 989.45, "mamf_tflops_fp8_e4m3": 1500.0}
    _versus_peak(metrics, ["fp8_e4m3"], "NVIDIA H100 80GB HBM3")
    assert metrics["peak_tflops_fp8_e4m3"] == 1978.9
    assert metrics["tflops_fp8_e4m3_vs_peak"] == pytest.approx(0.5)
    assert metrics["mamf_fp8_e4m3_vs_peak"] == pytest.approx(1500.0 / 1978.9)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--precisions", "fp8_e4m3"], "none of --precisions runs on this device"),
        (["--sweep", "--sweep-shapes", "8x8"], "is not MxNxK"),
    ],
)
def test_matmul_bad_inputs(tmp_path, argv, message):
    res = run_model("milarun.models.matmul:main", FAST + ["--size", "16"] + argv, tmp_path=tmp_path)
    assert res["success"] is False and message in res["error"]["message"]


def test_burn_runs_its_duration_and_says_clocks_are_not_read_on_cpu(tmp_path):
    res = run_model(
        "milarun.models.burn:main",
        FAST + ["--duration", "1", "--size", "32", "--check-every", "4"],
        tmp_path=tmp_path,
    )
    assert res["success"], res["error"]
    m = res["metrics"]
    assert m["iterations"] == res["timings"]["train"]["count"] and m["iterations"] > 0
    assert 1.0 <= m["duration_s"] < 10 and m["tflops"] > 0
    assert m["clocks"].startswith("not available")


def test_burn_catches_one_flipped_element(tmp_path, monkeypatch):
    def flip(iteration, c):
        if iteration == 5:
            c = c.clone()
            c[7, 3] = -c[7, 3]
        return c

    monkeypatch.setattr(burn, "_hook_result", flip)
    res = run_model(
        "milarun.models.burn:main",
        FAST + ["--duration", "30", "--size", "32", "--check-every", "4"],
        tmp_path=tmp_path,
    )
    assert res["success"] is False
    assert res["error"]["reason"] == "data-corruption"
    assert res["error"]["message"].startswith("iteration 5: the result differs")
    assert res["metrics"]["iterations"] == 4  # the first check passed, the second failed
    assert res["metrics"]["duration_s"] < 30
    validate({k: v for k, v in res.items() if k != "_exit_code"})


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--duration", "0"], "--duration must be between 1 s"),
        (["--duration", "1e9"], "--duration must be between 1 s"),
        (["--size", "8"], "--size must be 0 or between 16"),
        (["--dtype", "int8"], "--dtype must be one of"),
        (["--tolerance", "-1"], "--tolerance must be in"),
    ],
)
def test_burn_bad_inputs(tmp_path, argv, message):
    started = time.perf_counter()
    res = run_model("milarun.models.burn:main", FAST + argv, tmp_path=tmp_path)
    assert res["success"] is False and message in res["error"]["message"]
    assert time.perf_counter() - started < 30 and not (res["timings"].get("train") or {}).get(
        "samples"
    )


def test_acceptance_profiles_parse_with_their_tests():
    from milarun.profile.language import load_profile

    for name in ("acceptance", "acceptance-cpu"):
        jobs = load_profile(ROOT / "profiles" / f"{name}.json")
        assert {j.name for j in jobs} >= {"collectives", "bandwidth", "matmul", "burn"}
    gpu = {j.name: j for j in load_profile(ROOT / "profiles" / "acceptance.json")}
    assert gpu["burn"].plan_type == "per-gpu" and gpu["collectives"].plan_type == "njobs"
    assert gpu["collectives_nodes"].plan_type == "node-progression"
    assert gpu["collectives_all_nodes"].plan_type == "multi-node"
    assert gpu["bandwidth"].plan_type == "normal"


def test_numa_placeholders_put_host_memory_on_another_node(tmp_path, monkeypatch):
    # acceptance.bandwidth_remote_numa: numactl --cpunodebind={numa_node} --membind={numa_remote}
    from types import SimpleNamespace

    from milarun.errors import SetupError
    from milarun.host.devices import Devices
    from milarun.plan import launches
    from milarun.profile.language import load_profile

    online = tmp_path / "online"
    online.write_text("0-1\n")
    monkeypatch.setattr(launches, "NUMA_ONLINE", str(online))
    job = next(j for j in load_profile(launches_profile()) if j.name == "bandwidth_remote_numa")
    gpus = Devices(
        kind="gpu",
        indices=[0, 1],
        accelerators=[SimpleNamespace(numa_node=0), SimpleNamespace(numa_node=1)],
    )
    for dev, local, remote in ((0, 0, 1), (1, 1, 0)):
        values = launches.placeholder_values(job, gpus, [dev], [], "/out", "/data")
        assert values == {"numa_node": local, "numa_remote": remote}
    online.write_text("0\n")  # one node: the "remote" node is the local one
    cpu = Devices(kind="cpu", indices=[0])
    assert launches.placeholder_values(job, cpu, [0], [], "/out", "/data") == {
        "numa_node": 0,
        "numa_remote": 0,
    }
    online.write_text("0-1\n")  # several nodes and a device that does not say: an error
    with pytest.raises(SetupError, match="the NUMA node of its device is unknown"):
        launches.placeholder_values(job, cpu, [0], [], "/out", "/data")


def launches_profile():
    return ROOT / "profiles" / "acceptance.json"
