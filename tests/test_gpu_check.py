"""benchmarks/gpu_check.py: its verdict logic with fake figures, its NVML check against a
fake pynvml and a fake torch.cuda, and the script itself on the CPU (the CPU-runnable
parts, tiny sizes), through the JSON file it writes."""

import importlib.util
import json
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from milarun.host import prescreen

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- verdict logic


def test_rate_target_is_within_one_percent(gc):
    tol = gc.RATE_TOLERANCE
    assert tol == 0.01
    assert gc.verdict_within(98.0, 100.0, tol)["verdict"] == "FAIL"
    assert gc.verdict_within(99.5, 100.0, tol)["verdict"] == "PASS"
    assert gc.verdict_within(100.9, 100.0, tol)["verdict"] == "PASS"
    assert gc.verdict_within(101.5, 100.0, tol)["verdict"] == "FAIL"
    v = gc.verdict_within(98.0, 100.0, tol, "instrumented/bare")
    assert v["figure"] == pytest.approx(0.98) and "0.99..1.01" in v["target"]
    assert "0.9800" in v["reason"]
    # no figure is a FAIL with a reason, never a PASS
    for bad in (None, 0.0, float("nan"), -1.0):
        v = gc.verdict_within(bad, 100.0, tol)
        assert v["verdict"] == "FAIL" and v["reason"].startswith("no figure")


def test_matmul_target_is_at_least_97_percent(gc):
    m = gc.MATMUL_MIN_RATIO
    assert m == 0.97
    assert gc.verdict_at_least(96.0, 100.0, m)["verdict"] == "FAIL"
    assert gc.verdict_at_least(97.5, 100.0, m)["verdict"] == "PASS"
    assert gc.verdict_at_least(103.0, 100.0, m)["verdict"] == "PASS"  # faster is fine
    assert gc.verdict_at_least(None, 100.0, m)["verdict"] == "FAIL"


def test_combine_and_cpu_skip(gc):
    P, F, S, W = ({"verdict": v} for v in ("PASS", "FAIL", "SKIP", "WARN"))
    assert gc.combine([P, S]) == "PASS"
    assert gc.combine([P, F, S]) == "FAIL"
    assert gc.combine([S, S]) == "SKIP"
    assert gc.combine([P, W, S]) == "WARN" and gc.combine([W, F]) == "FAIL"
    # on the CPU a GPU-timer target never PASSes: SKIP, keeping the figure and the reason
    v = gc.on_cpu(gc.verdict_within(99.5, 100.0, 0.01), "cpu")
    assert v["verdict"] == "SKIP" and v["figure"] == pytest.approx(0.995)
    assert "CUDA" in v["reason"] and "would be PASS" in v["reason"]
    assert gc.on_cpu(gc.verdict_within(99.5, 100.0, 0.01), "cuda")["verdict"] == "PASS"


@pytest.mark.parametrize(
    "name, label, matmul, memory, pcie",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 795.0, 3.35, 55.0),
        ("NVIDIA H100 PCIe", "H100 PCIe", None, 2.0, 55.0),
        ("NVIDIA H200", "H200", None, 4.8, 55.0),
        ("NVIDIA GH200 480GB", "GH200", None, None, None),  # not the H200's figures
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 271.0, 2.039, None),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB SXM", 271.0, 1.555, None),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", None, 1.935, None),
        ("NVIDIA B200", "B200", 1745.0, 8.0, 55.0),
        ("AMD Instinct MI300X", "MI300X", 668.0, 5.3, 55.0),
        ("NVIDIA L4", None, None, None, None),
        ("cpu", None, None, None, None),
    ],
)
def test_references_by_gpu_name(gc, name, label, matmul, memory, pcie):
    got, refs = gc.references_for(name)
    assert got == label
    assert (refs.get("matmul_bf16_tflops"), refs.get("memory_tb_s"), refs.get("pcie_gb_s")) == (
        matmul,
        memory,
        pcie,
    )


def test_a_figure_far_from_its_reference_warns_with_the_ratio(gc):
    v = gc.verdict_reference(700.0, 795.0, 0.8, "TFLOP/s", "H100 SXM max achievable")
    assert v["verdict"] == "PASS" and v["figure"] == 700.0 and "795" in v["target"]
    v = gc.verdict_reference(500.0, 795.0, 0.8, "TFLOP/s", "H100 SXM max achievable")
    assert v["verdict"] == "WARN" and v["reason"].startswith("0.63 x the reference 795")
    # no reference known: the figure, never a WARN; no figure: a FAIL
    v = gc.verdict_reference(500.0, None, 0.8, "TFLOP/s", "max achievable of 'NVIDIA L4'")
    assert v["verdict"] == "SKIP" and v["figure"] == 500.0 and "none known" in v["reason"]
    assert gc.verdict_reference(None, 795.0, 0.8, "TFLOP/s", "x")["verdict"] == "FAIL"
    p = gc.reference_part(
        "device copy",
        2000.0,
        "NVIDIA H100 80GB HBM3",
        "memory_tb_s",
        1000.0,
        gc.MEMORY_REF_MIN,
        "GB/s",
        "datasheet memory bandwidth",
    )
    assert p["verdict"] == "WARN" and p["figures"]["reference"] == pytest.approx(3350.0)
    assert p["figures"]["ratio"] == pytest.approx(2000 / 3350)
    assert p["figures"]["reference_of"] == "H100 SXM" and p["figures"]["unit"] == "GB/s"


def test_tiny_presets_in_prepare_commands(gc):
    assert (
        gc.tiny("{milarun} dataset mnist --size standard -d {dataroot}")
        == "{milarun} dataset mnist --size tiny -d {dataroot}"
    )
    assert gc.tiny("x --size=standard") == "x --size tiny"
    assert gc.tiny("sh fetch.sh {dataroot}") == "sh fetch.sh {dataroot}"


def test_one_test_per_family_first_in_profile_order(gc):
    jobs = {
        "*": {},
        "_base": {"tags": ["llm"]},
        "a_fsdp": {"tags": ["llm", "multi-gpu"]},  # not on one GPU
        "b_ddp": {"tags": ["vision"], "partition_scheme": {"type": "njobs"}},
        "c_llm": {"tags": ["llm", "nlp"]},
        "d_conv": {"tags": ["vision"]},
        "e_conv": {"tags": ["vision"]},
        "f_toy": {"tags": ["toy"]},
        "g_wlm": {"tags": ["nlp"]},
    }
    # FAMILIES order (llm ... nlp, vision), then other
    assert gc.pick_per_family(jobs) == ["c_llm", "g_wlm", "d_conv", "f_toy"]


def test_lite_pass_of_the_gpu_profile_is_one_test_per_family_on_tiny_data(gc):
    """On a GPU: profiles/lite.json, one single-GPU test per family of the report's
    families, every dataset prepared in its tiny preset."""
    from milarun.report.family import FAMILIES, OTHER

    args = gc.parse([])
    tests = gc.lite_tests(args, cuda=True)
    families = [t["family"] for t in tests]
    assert len(set(families)) == len(families) == len(tests) >= 8
    assert families == [f for f in FAMILIES + (OTHER,) if f in families]
    assert {"llm_pretrain", "convnet", "toy_reg"} <= {t["name"] for t in tests}
    commands = [c for t in tests for c in t["prepare"]]
    assert commands and all("--size tiny" in c and "standard" not in c for c in commands)
    # on the CPU: the launcher's path, one test
    assert [t["name"] for t in gc.lite_tests(args, cuda=False)] == list(gc.CPU_LITE)


def _tests(n, datasets=1):
    return [{"name": f"t{i}", "family": f"f{i}", "prepare": [f"d{i % datasets}"]} for i in range(n)]


def test_plan_fits_the_budget_shrinking_lite_then_leaving_checks_out(gc):
    args = gc.parse(
        [
            "--rate-seconds",
            "3",
            "--matmul-seconds",
            "2",
            "--matmul-steady",
            "5",
            "--bandwidth-seconds",
            "1",
        ]
    )
    tests = _tests(9, datasets=5)
    plan = gc.make_plan(args, list(gc.CHECKS), cuda=True, gpus=1, tests=tests)
    assert [r["check"] for r in plan] == ["start", *gc.CHECKS]
    assert all(r["run"] and not r["note"] for r in plan) and len(tests) == 9
    total = sum(r["estimate_s"] for r in plan)
    assert 200 < total <= 300, total  # one GPU: planned at 5 minutes
    assert {r["check"]: r["estimate_s"] for r in plan}["ddp"] == 0  # 1 GPU: a SKIP
    # 140 s: lite keeps the tests that fit (the last ones left out), cgroups no longer fits
    args.budget = 140
    tests = _tests(9, datasets=5)
    plan = {r["check"]: r for r in gc.make_plan(args, list(gc.CHECKS), True, 1, tests)}
    assert plan["lite"]["run"] and 1 <= len(tests) < 9
    assert plan["lite"]["note"].startswith("shrunk to fit the budget: left out t")
    assert "t8" in plan["lite"]["note"] and "t0" not in plan["lite"]["note"]
    assert not plan["cgroups"]["run"] and "does not fit" in plan["cgroups"]["note"]
    assert sum(r["estimate_s"] for r in plan.values() if r["run"]) <= 140
    # 2 GPUs: the ddp check runs
    args.budget = 300
    plan = {r["check"]: r for r in gc.make_plan(args, ["ddp"], True, 2, [])}
    assert plan["ddp"]["estimate_s"] == gc.TORCHRUN_S


def test_dry_run_prints_the_gpu_plan_without_a_gpu():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cuda", "--budget", "300", "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("gpu_check plan: cuda") and "budget 300 s" in out
    planned = int(out.split("planned: ")[1].split(" s")[0])
    assert planned <= 300
    for name in ("start", "rate", "matmul", "bandwidth", "nvml", "lite", "ddp", "cgroups"):
        assert f"\n  {name} " in out
    assert "lite tests: llm_pretrain (llm)" in out and "PASS" not in out


def test_a_check_that_would_end_past_the_budget_is_skipped(gc, monkeypatch, tmp_path, one_thread):
    """At run time: the rate check overruns its estimate, the next no longer fits."""
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # main sets it: restored after

    def slow_rate(args, T):
        time.sleep(1.2)
        return [gc._part("instrumented/bare", gc.skip("faked"))]

    monkeypatch.setattr(gc, "START_S", {True: 0.0, False: 0.0})
    monkeypatch.setattr(gc, "estimate", lambda *a: (0.2, "faked"))
    monkeypatch.setattr(gc, "check_rate", slow_rate)
    out = tmp_path / "gc.json"
    rc = gc.main(
        ["--device", "cpu", "--only", "rate,bandwidth", "--budget", "1", "--out", str(out)]
    )
    report = json.loads(out.read_text())
    assert rc == 0 and report["version"] == 2 and report["budget_s"] == 1
    rate, bw = report["checks"]["rate"], report["checks"]["bandwidth"]
    assert rate["seconds"] >= 1.2 and rate["estimate_s"] == 0.2
    assert bw["verdict"] == "SKIP" and bw["parts"][0]["reason"].startswith("budget: ")
    assert "more would pass the 1 s budget" in bw["parts"][0]["reason"]
    # left out by the plan
    rc = gc.main(["--device", "cpu", "--only", "bandwidth", "--budget", "0.1", "--out", str(out)])
    (part,) = json.loads(out.read_text())["checks"]["bandwidth"]["parts"]
    assert part["reason"].startswith("budget: does not fit the budget")


def _series(power_w, seconds=8.0, dt=0.1, counter_scale=1.0):
    times = [i * dt for i in range(int(seconds / dt) + 1)]
    powers = [power_w] * len(times)
    energies = [1000.0 + counter_scale * power_w * t for t in times]
    return times, powers, energies


def test_energy_and_power_verdicts(gc):
    names = ("power", "monotonic", "consistent")
    parts, figs = gc.energy_parts(*_series(300.0), limit_w=700.0)
    assert [p["verdict"] for p in parts] == ["PASS"] * 3, parts
    assert figs["energy_delta_j"] == pytest.approx(2400.0)
    assert figs["power_integral_j"] == pytest.approx(2400.0)
    assert figs["mean_power_w"] == pytest.approx(300.0)
    # a counter 20% slow, or 5% (inside the 10% tolerance)
    parts, _ = gc.energy_parts(*_series(300.0, counter_scale=0.8), limit_w=700.0)
    assert dict(zip(names, (p["verdict"] for p in parts)))["consistent"] == "FAIL"
    parts, _ = gc.energy_parts(*_series(300.0, counter_scale=0.95), limit_w=700.0)
    assert parts[2]["verdict"] == "PASS"
    # a counter that steps back
    t, p, e = _series(300.0)
    e[10] = e[9] - 1
    assert gc.energy_parts(t, p, e, 700.0)[0][1]["verdict"] == "FAIL"
    # power above 1.05 x the limit, or negative
    t, p, e = _series(300.0)
    p[5] = 740.0
    assert gc.energy_parts(t, p, e, 700.0)[0][0]["verdict"] == "FAIL"
    p[5] = 730.0  # within the 5% margin
    assert gc.energy_parts(t, p, e, 700.0)[0][0]["verdict"] == "PASS"
    p[5] = -1.0
    assert gc.energy_parts(t, p, e, 700.0)[0][0]["verdict"] == "FAIL"


def test_prescreen_findings_on_a_gpu_warn_when_not_as_expected(gc, monkeypatch):
    findings = [
        prescreen.finding("gpu_persistence", "GPU 0: on", "enabled", True, "w"),
        prescreen.finding("gpu_idle", "1 process(es): pid 9", "no process", False, "shared"),
        prescreen.finding("pci_acs", None, "none", None, "needs root"),
    ]
    monkeypatch.setattr(gc, "prescreen", lambda: findings)
    cuda = types.SimpleNamespace(cuda=True)
    got = {p["name"]: p for p in gc.check_prescreen(cuda)}
    assert got["gpu_persistence"]["verdict"] == "PASS"
    assert got["gpu_idle"]["verdict"] == "WARN"
    assert got["gpu_idle"]["reason"] == "found 1 process(es): pid 9, expected no process: shared"
    assert got["pci_acs"]["verdict"] == "SKIP" and got["pci_acs"]["reason"] == "unknown: needs root"
    assert gc.combine(list(got.values())) == "WARN"
    # on the CPU the same finding is kept as a SKIP
    cpu = {p["name"]: p for p in gc.check_prescreen(types.SimpleNamespace(cuda=False))}
    assert cpu["gpu_idle"]["verdict"] == "SKIP" and cpu["gpu_idle"]["figure"].startswith("1 proc")


def test_pci_and_uuid_normalisation(gc):
    assert gc._bdf("00000000:3B:00.0") == gc._bdf("0000:3b:00.0") == (0, 0x3B, 0)
    assert gc._uuid(b"GPU-AbC-1") == gc._uuid("abc-1") == "abc-1"


def test_bad_check_name_is_one_line(gc, capsys):
    with pytest.raises(SystemExit) as exc:
        gc.parse(["--only", "rate,bogus"])
    assert exc.value.code == 2
    assert "unknown check(s) bogus" in capsys.readouterr().err


# --------------------------------------------------------------------------- NVML with fakes


class FakeNVML:
    """nvidia-ml-py's calls the check makes, for ``n`` GPUs drawing ``power_w`` (mW in,
    as NVML); the energy counter integrates it at ``counter_scale``."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def __init__(self, n=2, power_w=300.0, counter_scale=1.0, uuids=None):
        self.n, self.power_w, self.scale = n, power_w, counter_scale
        self.t0 = time.perf_counter()
        self.uuids = uuids or [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(n)]

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return self.uuids[h]

    def nvmlDeviceGetPciInfo(self, h):
        return types.SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0".encode())

    def nvmlDeviceGetPowerUsage(self, h):
        return int(self.power_w * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return int(1e6 + self.scale * self.power_w * (time.perf_counter() - self.t0) * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980 if kind == 1 else 2619

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980 if kind == 1 else 2619


def fake_torch_cuda(n, uuids):
    """A torch whose cuda namespace says ``n`` devices with these UUIDs; tensors are the
    CPU's (the device argument dropped)."""
    import torch

    def props(i):
        return types.SimpleNamespace(
            uuid=uuids[i][4:], pci_domain_id=0, pci_bus_id=0x18 + i, pci_device_id=0
        )

    cuda = types.SimpleNamespace(
        device_count=lambda: n, get_device_properties=props, synchronize=lambda dev=None: None
    )
    return types.SimpleNamespace(
        cuda=cuda,
        float16=torch.float32,
        device=lambda *a: a,
        randn=lambda *shape, device=None, dtype=None: torch.randn(*shape),
        empty_like=torch.empty_like,
        matmul=torch.matmul,
    )


def run_fake_nvml(gc, monkeypatch, nv, torch_uuids=None, record=None):
    devices = [
        {
            "index": i,
            "visible": str(i),
            "uuid": nv.uuids[i],
            "parent": None,
            "pci_bus_id": f"0000:{0x18 + i:02x}:00.0",
        }
        for i in range(nv.n)
    ]
    inv = {"backend": "nvidia", "devices": devices, "tried": {}}
    monkeypatch.setattr(gc, "_nvml", lambda: nv)
    monkeypatch.setattr(
        gc,
        "milarun_cli",
        lambda args, timeout, env=None: types.SimpleNamespace(
            returncode=0, stdout=json.dumps(inv), stderr=""
        ),
    )
    T = types.SimpleNamespace(
        cuda=True,
        device=types.SimpleNamespace(type="cuda"),
        torch=fake_torch_cuda(nv.n, torch_uuids or nv.uuids),
    )
    args = gc.parse(["--nvml-seconds", "1.0", "--nvml-interval", "0.05", "--nvml-size", "16"])
    state = {"matmul_record": record} if record else {}
    return {p["name"]: p for p in gc.check_nvml(args, T, state)}


def test_nvml_check_with_fakes_passes_a_consistent_gpu(gc, monkeypatch):
    nv = FakeNVML(n=2)
    rows = [{"t": t, "device": 0, "power": 300.0, "energy": 300.0 * t} for t in range(6)]
    record = {"gpu_monitor": {"available": True, "samples": rows}}
    parts = run_fake_nvml(gc, monkeypatch, nv, record=record)
    assert {n: p["verdict"] for n, p in parts.items()} == {
        "gpu0 identity": "PASS",
        "gpu1 identity": "PASS",
        "gpu0 power": "PASS",
        "gpu0 energy monotonic": "PASS",
        "gpu0 energy vs power": "PASS",
        "gpu0 clocks": "PASS",
        "gpu1 power": "PASS",
        "gpu1 energy monotonic": "PASS",
        "gpu1 energy vs power": "PASS",
        "gpu1 clocks": "PASS",
        "milarun monitor power": "PASS",
        "milarun monitor energy monotonic": "PASS",
    }
    f = parts["gpu0 energy vs power"]["figures"]
    assert f["span_s"] > 0.8 and f["mean_power_w"] == pytest.approx(300.0)
    assert parts["gpu0 clocks"]["figures"]["power_limit_w"] == 700.0


def test_nvml_check_with_fakes_fails_a_slow_counter_and_swapped_gpus(gc, monkeypatch):
    nv = FakeNVML(n=2, counter_scale=0.5)
    swapped = [nv.uuids[1], nv.uuids[0]]  # torch's cuda:0 is NVML's GPU 1
    parts = run_fake_nvml(gc, monkeypatch, nv, torch_uuids=swapped)
    assert parts["gpu0 identity"]["verdict"] == "FAIL"
    assert "torch cuda:0" in parts["gpu0 identity"]["reason"]
    assert parts["gpu0 energy vs power"]["verdict"] == "FAIL"
    assert parts["gpu0 energy vs power"]["figure"] == pytest.approx(0.5, abs=0.05)
    assert parts["milarun monitor"]["verdict"] == "SKIP" and parts["milarun monitor"]["reason"]
    assert gc.combine(list(parts.values())) == "FAIL"


# --------------------------------------------------------------------------- CUDA paths, faked


class FakeEvent:
    """torch.cuda.Event on the host clock: record() reads perf_counter, elapsed_time in ms."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, end):
        return (end.t - self.t) * 1000.0


class CudaOnCpuTorch:
    """Real torch (CPU tensors) whose ``cuda`` namespace is a fake with events."""

    def __init__(self):
        import torch

        self._torch = torch
        self.cuda = types.SimpleNamespace(
            Event=FakeEvent, synchronize=lambda dev=None: None, empty_cache=lambda: None
        )
        self.pinned = []

    def empty(self, *shape, pin_memory=False, **kw):
        """Pinned host memory needs CUDA: noted, and plain memory given instead."""
        self.pinned.append(pin_memory)
        return self._torch.empty(*shape, **kw)

    def __getattr__(self, name):
        return getattr(self._torch, name)


@pytest.fixture
def one_thread():
    """One intra-op thread, as the script's CPU mode: two threads of tiny matmuls on a
    loaded 2-core host spin for milliseconds each."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def fake_cuda_T(name="NVIDIA H100 80GB HBM3"):
    import torch

    return types.SimpleNamespace(
        cuda=True, device=torch.device("cpu"), torch=CudaOnCpuTorch(), sync=lambda: None, name=name
    )


def test_rate_check_on_the_cuda_path_gives_a_verdict(gc, monkeypatch, one_thread):
    """The CUDA branch (CudaEventTimer, events turned into seconds) with fake events: a
    PASS or a FAIL (the noise of a shared CPU decides which), never a SKIP."""
    import torch

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    args = gc.parse(["--rate-seconds", "0.2", "--rate-pairs", "2", "--rate-width", "16"])
    (part,) = gc.check_rate(args, fake_cuda_T())
    assert part["verdict"] in ("PASS", "FAIL") and part["figure"] > 0
    assert part["figures"]["batch"] == 2048 and part["figures"]["width"] == 16
    for pair in part["figures"]["pairs"]:
        assert pair["windows"] >= 2 and pair["instrumented_items_s"] > 0


def test_matmul_check_on_the_cuda_path_reads_the_record(gc, monkeypatch, tmp_path, one_thread):
    """Four precisions on the CUDA path, milarun's record faked at 3x the bare loop for fp16
    (PASS: faster is fine) and 1/1000 of it for bf16 (FAIL; far from the CPU's noise); the
    child runs on the bare loop's GPU."""
    seen = {}

    def fake_cli(argv, timeout, env=None):
        seen["argv"], seen["env"] = argv, env
        out = Path(argv[argv.index("-o") + 1])
        bare = {p: gc.bare_tflops(T, p, 32, 0.05) for p in gc.PRECISIONS}
        scale = {"fp32": 1.0, "tf32": 1.0, "fp16": 3.0, "bf16": 0.001}
        out.write_text(
            json.dumps(
                {
                    "success": True,
                    "metrics": {f"tflops_{p}": bare[p] * scale[p] for p in gc.PRECISIONS},
                }
            )
        )
        return types.SimpleNamespace(returncode=0, stdout="", stderr="")

    T = fake_cuda_T()
    monkeypatch.setattr(gc, "milarun_cli", fake_cli)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    args = gc.parse(["--matmul-size", "32", "--matmul-seconds", "0.05", "--matmul-steady", "1"])
    state = {}
    parts = {p["name"]: p for p in gc.check_matmul(args, T, tmp_path, state)}
    assert list(parts) == [*gc.PRECISIONS, "bf16 vs reference"]
    # the bare bf16 loop (a CPU's, here) against the H100 SXM's max achievable 795 TFLOP/s
    ref = parts["bf16 vs reference"]
    assert ref["verdict"] == "WARN" and ref["figures"]["reference"] == 795.0
    assert ref["figure"] == pytest.approx(parts["bf16"]["figures"]["bare_tflops"])
    assert ref["figures"]["ratio"] < 0.01 and "x the reference 795 TFLOP/s" in ref["reason"]
    assert parts["fp16"]["verdict"] == "PASS"  # faster than bare: fine
    assert parts["bf16"]["verdict"] == "FAIL" and "below 0.97" in parts["bf16"]["reason"]
    assert seen["env"] == {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert seen["argv"][seen["argv"].index("--device") + 1] == "cuda"
    assert state["matmul_record"]["success"]


def test_bandwidth_check_on_the_cuda_path_against_the_references(gc, monkeypatch, one_thread):
    """Device copy (2 x the bytes: read and write) against the datasheet's 3.35 TB/s, host
    copies from pinned memory against 55 GB/s; the copy rates faked (3000, 20, 54 GB/s)."""
    rates = iter([3000.0, 20.0, 54.0])
    seen = []

    def fake_copy(T, dst, src, nbytes, seconds):
        seen.append(nbytes)
        return next(rates)

    monkeypatch.setattr(gc, "copy_gb_s", fake_copy)
    T = fake_cuda_T()
    args = gc.parse(["--bandwidth-mib", "4", "--bandwidth-seconds", "0.05"])
    parts = {p["name"]: p for p in gc.check_bandwidth(args, T)}
    assert seen == [2 * 4 << 20, 4 << 20, 4 << 20] and T.torch.pinned == [False, True]
    assert parts["device copy"]["verdict"] == "PASS"  # 0.90 x 3350
    assert parts["device copy"]["figures"]["reference"] == pytest.approx(3350.0)
    assert parts["host to device"]["verdict"] == "WARN"  # 0.36 x 55
    assert parts["host to device"]["reason"].startswith("0.36 x the reference 55 GB/s")
    assert parts["device to host"]["verdict"] == "PASS"
    # an unknown GPU: figures, no WARN
    rates = iter([1.0, 1.0, 1.0])
    parts = gc.check_bandwidth(args, fake_cuda_T("NVIDIA L4"))
    assert [p["verdict"] for p in parts] == ["SKIP"] * 3
    assert all("none known" in p["reason"] and p["figure"] == 1.0 for p in parts)


def test_copy_rate_times_real_copies(gc, one_thread):
    import torch

    T = types.SimpleNamespace(sync=lambda: None)
    a, b = torch.zeros(1 << 18), torch.ones(1 << 18)
    assert gc.copy_gb_s(T, a, b, 1 << 20, 0.05) > 0 and float(a[0]) == 1.0


# --------------------------------------------------------------------------- the script on CPU


def run_script(tmp_path, *args, timeout=240):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    report = json.loads(out.read_text()) if out.exists() else None
    return proc, report


@pytest.mark.slow
def test_cpu_run_writes_its_figures_and_skips_the_cuda_only_checks(tmp_path):
    """One CPU run of every check. Its lite pass runs toy_reg of profiles/lite.json (its
    counts overridden by the short arguments, its exec_prefix a program no host has: run
    without it, a WARN) and a fault workload beside it that crashes: that FAIL must fail
    the lite check, the overall verdict and the exit status."""
    profile = tmp_path / "lite-plus.json"
    profile.write_text(
        json.dumps(
            {
                "include": [str(ROOT / "profiles" / "lite.json")],
                "boom": {"experiment": "milarun.models.faults:crash"},
                "toy_reg": {"exec_prefix": ["milarun-no-such-program"]},
            }
        )
    )
    (tmp_path / "data").mkdir()
    proc, report = run_script(
        tmp_path,
        "-d",
        str(tmp_path / "data"),
        "--lite-profile",
        str(profile),
        "--lite-name",
        "toy_reg",
        "boom",
        "--cgroup-experiment",
        "milarun.models.faults:crawl",
        "--rate-pairs",
        "2",
    )
    assert report is not None, proc.stderr
    assert report["version"] == 2 and report["device"] == "cpu"
    assert set(report["checks"]) == {
        "prescreen",
        "rate",
        "matmul",
        "bandwidth",
        "nvml",
        "lite",
        "ddp",
        "cgroups",
    }
    assert report["budget_s"] == 300 and report["seconds"] < 300
    assert [r["check"] for r in report["plan"]] == ["start", *report["checks"]]
    for name, check in report["checks"].items():
        assert check["verdict"] in ("PASS", "WARN", "FAIL", "SKIP")
        assert check["seconds"] >= 0 and check["estimate_s"] >= 0 and check["parts"]
        for p in check["parts"]:
            assert {"name", "verdict", "figure", "target", "reason"} <= p.keys()
            if p["verdict"] != "PASS":
                assert p["reason"], (name, p)  # every SKIP and FAIL says why
    checks = report["checks"]
    # the host prescreen: one part per finding; on the CPU none WARNs (a GPU node's settings)
    pre = checks["prescreen"]["parts"]
    assert [p["name"] for p in pre] == list(prescreen.NAMES)
    assert all(p["verdict"] in ("PASS", "SKIP") for p in pre), pre
    assert {p["name"]: p for p in pre}["kernel"]["verdict"] == "PASS"
    # CUDA-only targets: SKIP with a reason on the CPU, never PASS; their figures are kept
    rate = checks["rate"]["parts"][0]
    assert rate["verdict"] == "SKIP" and "CUDA" in rate["reason"] and rate["figure"] > 0
    assert len(rate["figures"]["pairs"]) == 2
    for pair in rate["figures"]["pairs"]:
        assert pair["instrumented_items_s"] > 0 and pair["bare_items_s"] > 0
        assert pair["windows"] >= 2
    mm = checks["matmul"]["parts"]
    assert [p["name"] for p in mm] == ["fp32"] and mm[0]["verdict"] == "SKIP"
    assert mm[0]["figures"]["milarun_tflops"] > 0 and mm[0]["figures"]["bare_tflops"] > 0
    assert checks["nvml"]["verdict"] == "SKIP" and "NVIDIA" in checks["nvml"]["parts"][0]["reason"]
    # bandwidth: the figures, no reference known for a CPU
    bw = {p["name"]: p for p in checks["bandwidth"]["parts"]}
    assert set(bw) == {"device copy", "host to device", "device to host"}
    assert all(p["verdict"] == "SKIP" and p["figure"] > 0 for p in bw.values())
    assert checks["ddp"]["verdict"] == "SKIP"
    assert all("NCCL" in p["reason"] for p in checks["ddp"]["parts"])
    # lite: one verdict per test, from its record
    lite = {p["name"]: p for p in checks["lite"]["parts"]}
    assert set(lite) == {"toy_reg", "boom", "milarun jobs"}
    assert lite["toy_reg"]["verdict"] == "WARN", lite
    assert "exec_prefix 'milarun-no-such-program'" in lite["toy_reg"]["reason"]
    assert lite["toy_reg"]["figures"]["records"] == 1
    assert lite["toy_reg"]["figures"]["items_s"][0] > 0
    assert lite["boom"]["verdict"] == "FAIL" and "deliberate crash" in lite["boom"]["reason"]
    assert lite["milarun jobs"]["verdict"] == "FAIL" and lite["milarun jobs"]["figure"] == 1
    assert checks["lite"]["verdict"] == "FAIL"
    # cgroups: PASS in student0 where this host has it, else SKIP with the dry run's line
    wave = checks["cgroups"]["parts"][0]
    assert wave["verdict"] in ("PASS", "SKIP"), wave
    if wave["verdict"] == "PASS":
        assert "student0" in wave["figures"]["cgroups"][0]
    else:
        assert wave["reason"].startswith("milarun jobs --dry-run refuses")
    # one FAIL anywhere: the overall verdict and the exit status
    assert report["verdict"] == "FAIL"
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-2].startswith("gpu_check: FAIL")
    assert lines[-1].startswith("gpu_check: 1 WARN: lite/toy_reg: ran without exec_prefix")
    assert "SKIP  nvml" in proc.stdout and "FAIL  lite" in proc.stdout
    assert any(line.strip().startswith("FAIL  boom") for line in lines)


def test_only_and_skip_pick_the_checks(tmp_path):
    proc, report = run_script(tmp_path, "--only", "nvml,ddp,rate", "--skip", "rate")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(report["checks"]) == ["nvml", "ddp"] and report["verdict"] == "SKIP"


@pytest.mark.slow
def test_ddp_and_fsdp_steps_over_gloo(tmp_path):
    """The ddp check's torchrun worker (the NCCL path's code, over gloo on 2 CPU ranks)."""
    proc, report = run_script(tmp_path, "--only", "ddp", "--cpu-dist")
    assert report is not None, proc.stderr
    parts = {p["name"]: p for p in report["checks"]["ddp"]["parts"]}
    for name in ("ddp", "fsdp"):
        p = parts[name]
        assert p["verdict"] == "SKIP" and "would be PASS" in p["reason"], p
        assert p["figure"] <= 1e-5
        assert p["figures"]["backend"] == "gloo" and p["figures"]["world_size"] == 2
        assert len(p["figures"]["step_s"]) == 5
