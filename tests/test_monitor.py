"""NVML paths against a fake pynvml, and the CUDA-event timer against fake events (no GPU
on the test machines): the monitor, GPU discovery and visibility, children's environment,
host facts."""

import sys
import time
import types

import pytest

from milarun.bench.monitor import GPUMonitor
from milarun.bench.rate import CudaEventTimer, RateLogger


class _Handle:
    def __init__(self, index):
        self.index = index
        self.energy_mj = 1_000_000 * (index + 1)  # the counter does not start at 0
        self.reads = 0


def fake_pynvml(count=2, energy=True, fail_init=False):
    """A stand-in for ``pynvml`` with ``count`` GPUs; each energy read adds 250 J."""
    nv = types.ModuleType("pynvml")
    nv.NVML_TEMPERATURE_GPU = 0
    handles = [_Handle(i) for i in range(count)]

    def init():
        if fail_init:
            raise RuntimeError("Driver Not Loaded")

    def total_energy(h):
        if not energy:
            raise RuntimeError("Not Supported")
        h.reads += 1
        return h.energy_mj + 250_000 * (h.reads - 1)

    nv.nvmlInit = init
    nv.nvmlDeviceGetCount = lambda: count
    nv.nvmlDeviceGetHandleByIndex = lambda i: handles[i]
    nv.nvmlDeviceGetTotalEnergyConsumption = total_energy
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=90 + h.index)
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=512 * 2**20, total=80 * 2**30)
    nv.nvmlDeviceGetTemperature = lambda h, kind: 60
    nv.nvmlDeviceGetPowerUsage = lambda h: 300_500  # mW
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h.index}aaa-{h.index}"
    nv.nvmlDeviceGetName = lambda h: f"Fake GPU {h.index}".encode()
    nv.nvmlDeviceGetCpuAffinity = lambda h, words: [0b11 << (2 * h.index)]
    nv.nvmlSystemGetDriverVersion = lambda: "999.1"
    return nv


def test_monitor_reads_the_visible_gpus_with_units(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with GPUMonitor(interval=0.01) as mon:
        time.sleep(0.05)
    rec = mon.record()
    assert rec["available"] is True and rec["reason"] is None
    assert rec["samples"] and {s["device"] for s in rec["samples"]} == {1}
    first, last = rec["samples"][0], rec["samples"][-1]
    assert first["load"] == 91 and first["memory_mib"] == 512 and first["temperature"] == 60
    assert first["power"] == pytest.approx(300.5)  # W from mW
    # energy in J since the start: the first reading is 250 J after the baseline
    assert first["energy"] == pytest.approx(250.0)
    assert last["energy"] == pytest.approx(250.0 * len(rec["samples"]))
    assert [s["t"] for s in rec["samples"]] == sorted(s["t"] for s in rec["samples"])


def test_monitor_without_an_energy_counter_keeps_the_other_readings(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=1, energy=False))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with GPUMonitor(interval=0.01) as mon:
        time.sleep(0.03)
    samples = mon.record()["samples"]
    assert samples and all("energy" not in s and s["power"] > 0 for s in samples)
    assert all("error" not in s for s in samples)


@pytest.mark.parametrize(
    "kwargs,env,reason",
    [
        (
            {"fail_init": True},
            None,
            "NVML unavailable: NVML cannot start (RuntimeError: Driver "
            "Not Loaded): is the NVIDIA driver (libnvidia-ml.so) installed "
            "and loaded?",
        ),
        ({}, "", "no visible GPU"),
    ],
)
def test_monitor_records_why_it_is_off(monkeypatch, kwargs, env, reason):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(**kwargs))
    if env is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    with GPUMonitor(interval=0.01) as mon:
        pass
    rec = mon.record()
    assert rec["available"] is False and rec["reason"] == reason and rec["samples"] == []


class _FakeEvent:
    """A CUDA event on a fake device clock: ``record()`` stamps it, ``synchronize()`` counts."""

    clock = 0.0
    syncs = 0

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.t = None

    def record(self):
        self.t = _FakeEvent.clock

    def synchronize(self):
        _FakeEvent.syncs += 1

    def elapsed_time(self, end):
        return (end.t - self.t) * 1000.0  # milliseconds, like torch


def test_cuda_event_timer_measures_device_time_with_one_sync_per_window(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    _FakeEvent.clock, _FakeEvent.syncs = 0.0, 0
    host = [0.0]
    logger = RateLogger(
        sample_duration=0.5,
        max_count=32,
        warmup=0,
        timer=CudaEventTimer(),
        host_clock=lambda: host[0],
        origin=0.0,
    )
    for step in logger.steps():
        host[0] += 0.125  # the host queues a step in 0.125 s ...
        _FakeEvent.clock += 0.25  # ... the device runs it in 0.25 s (exact in binary)
        step.set_count(2)
    # windows close on host time (4 steps), rates come from device time: 8 items / 1 s
    assert [s["count"] for s in logger.samples] == [8, 8, 8, 8]
    assert all(s["rate"] == pytest.approx(8.0) for s in logger.samples)
    assert all(s["end"] - s["start"] == pytest.approx(1.0) for s in logger.samples)
    assert _FakeEvent.syncs == len(logger.samples)


@pytest.mark.parametrize(
    "spec,expect",
    [
        ("2,0", [2, 0]),
        ("", []),
        ("1,7,0", [1]),  # like CUDA: an invalid entry hides the rest
        ("GPU-3", [3]),  # unique UUID prefix
        ("GPU-", []),  # ambiguous prefix
        ("0,0", [0]),
    ],
)
def test_visible_indices_follow_cuda_rules(spec, expect):
    from milarun.host.devices import visible_indices

    assert visible_indices(4, spec=spec, uuid_of=lambda i: f"GPU-{i}aaa-{i}") == expect


def test_every_gpu_is_visible_when_the_variable_is_unset(monkeypatch):
    from milarun.host.devices import visible_indices

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_indices(3) == [0, 1, 2]


def test_discovery_honours_cuda_visible_devices(monkeypatch):
    from milarun.host import devices

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=4))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-2aaa,1")
    found = devices.discover()
    assert found.kind == "gpu" and found.indices == [2, 1]
    assert found.names == ["Fake GPU 2", "Fake GPU 1"]
    assert found.affinity == [[4, 5], [2, 3]]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert devices.discover(cpu_slots=2).kind == "cpu"


def test_children_use_the_pci_bus_order_of_nvml(monkeypatch):
    from milarun.host import devices
    from milarun.plan.launches import plan_job
    from milarun.profile.job import Job

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=2))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    job = Job(name="t", suite="s", experiment="milarun.models.toy_reg:main", plan_type="per-gpu")
    (wave,) = plan_job(job, devices.discover(), 0, "/out")
    assert [(lch.env["CUDA_VISIBLE_DEVICES"], lch.env["CUDA_DEVICE_ORDER"]) for lch in wave] == [
        ("GPU-0aaa-0", "PCI_BUS_ID"),
        ("GPU-1aaa-1", "PCI_BUS_ID"),
    ]


def test_host_facts_list_only_the_visible_gpus(monkeypatch):
    from milarun.bench.experiment import host_facts

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=3))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    gpus = host_facts()["gpus"]
    assert [{k: g[k] for k in ("index", "name", "driver", "memory_total_mib")} for g in gpus] == [
        {"index": 2, "name": "Fake GPU 2", "driver": "999.1", "memory_total_mib": 80 * 1024}
    ]
    assert gpus[0]["power_limit_w"] is None  # this fake reports no power limit
