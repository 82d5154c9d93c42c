"""Telemetry readings that one bad counter must not spoil.

Against the fakes of ``test_accel`` (amdsmi) and ``test_monitor`` (pynvml); none of this
ran on a real GPU."""

import sys
import time

import pytest
from test_accel import fake_amdsmi
from test_monitor import fake_pynvml

from milarun.bench.monitor import GPUMonitor
from milarun.host.accel.amd import AMDBackend
from milarun.host.accel.nvidia import NvidiaBackend

UINT32_MAX = 0xFFFFFFFF


# --- item 6: AMD's "not supported" is UINT32_MAX, not 4294967295 W -------------------------


@pytest.mark.parametrize(
    "info,watts",
    [
        # recent ROCm: socket_power filled, the old names unsupported (UINT32_MAX)
        (
            {
                "socket_power": 612,
                "current_socket_power": UINT32_MAX,
                "average_socket_power": UINT32_MAX,
            },
            612,
        ),
        # socket_power preferred over the others when all are there
        ({"socket_power": 612, "current_socket_power": 600, "average_socket_power": 590}, 612),
        # older amdsmi: no socket_power; a sentinel current value falls through to average
        ({"current_socket_power": 0xFFFF, "average_socket_power": 650}, 650),
        ({"socket_power": UINT32_MAX, "current_socket_power": 0, "average_socket_power": 0}, None),
    ],
)
def test_amd_power_sentinels_are_missing_and_socket_power_comes_first(
    tmp_path, monkeypatch, info, watts
):
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    smi = fake_amdsmi(1)
    smi.amdsmi_get_power_info = lambda h: dict(info)
    backend = AMDBackend(amdsmi=smi, root=tmp_path)
    (dev,) = backend.discover()
    assert backend.read(dev).power == watts


def test_amd_load_temperature_and_power_limit_sentinels_are_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    smi = fake_amdsmi(1)
    smi.amdsmi_get_gpu_activity = lambda h: {"gfx_activity": UINT32_MAX}
    # edge sensor unsupported (UINT32_MAX): the hotspot sensor is read instead
    smi.amdsmi_get_temp_metric = lambda h, kind, metric: UINT32_MAX if kind == "edge" else 70
    smi.amdsmi_get_power_info = lambda h: {"socket_power": 700, "power_limit": UINT32_MAX}
    backend = AMDBackend(amdsmi=smi, root=tmp_path)
    (dev,) = backend.discover()
    r = backend.read(dev)
    assert (r.load, r.temperature, r.power) == (None, 70, 700)
    assert backend.facts(dev) == {"power_limit_w": None}


# --- item 7: one raising NVML reading leaves the others, energy included --------------------


def test_nvml_temperature_that_raises_keeps_energy_and_the_rest(monkeypatch):
    nv = fake_pynvml(count=1)

    def deprecated(h, kind):
        raise RuntimeError("NVMLError_FunctionNotFound")

    nv.nvmlDeviceGetTemperature = deprecated
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("MILARUN_BACKEND", raising=False)
    with GPUMonitor(interval=0.01) as mon:
        time.sleep(0.05)
    samples = mon.record()["samples"]
    assert samples and all("error" not in s for s in samples)
    assert all("temperature" not in s for s in samples)
    first = samples[0]
    assert first["memory_mib"] == 512 and first["load"] == 90
    assert first["power"] == pytest.approx(300.5)
    assert first["energy"] == pytest.approx(250.0)  # J since the start: kept


def test_nvml_memory_that_raises_keeps_the_rest_and_all_failing_raises(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nv = fake_pynvml(count=1)

    def fails(*a):
        raise RuntimeError("NVMLError_Unknown")

    nv.nvmlDeviceGetMemoryInfo = fails
    backend = NvidiaBackend(pynvml=nv)
    (dev,) = backend.discover()
    r = backend.read(dev)
    assert (r.memory_mib, r.temperature, r.power) == (None, 60, pytest.approx(300.5))
    for name in (
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetPowerUsage",
    ):
        setattr(nv, name, fails)
    with pytest.raises(RuntimeError, match="NVMLError_Unknown"):
        backend.read(dev)  # the monitor's error row
