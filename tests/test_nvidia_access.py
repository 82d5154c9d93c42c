"""A GPU this process cannot open hides no other, and children get GPUs by UUID.
Against the fake pynvml of ``test_monitor``; never ran on a GPU.

NVML's count includes GPUs whose handle raises ``NVMLError_NoPermission`` (a device
cgroup, a container, the permissions of ``/dev/nvidiaN``); CUDA does not count them, so
NVML's index and CUDA's can name different GPUs."""

import sys
import time

import pytest
from test_monitor import fake_pynvml

from milarun.bench.monitor import GPUMonitor
from milarun.host import devices
from milarun.host.accel.nvidia import NvidiaBackend, nvml_visible
from milarun.host.inventory import inventory, render
from milarun.plan import nodes
from milarun.plan.launches import plan_job
from milarun.profile.job import Job


class NVMLError_NoPermission(Exception):  # noqa: N801 (pynvml's class name)
    def __str__(self):
        return "Insufficient Permissions"


def locked_out(count=4, denied=(1,)):
    """The fake pynvml with ``count`` GPUs, those in ``denied`` refusing a handle."""
    nv = fake_pynvml(count=count)
    handle = nv.nvmlDeviceGetHandleByIndex

    def get(i):
        if i in denied:
            raise NVMLError_NoPermission()
        return handle(i)

    nv.nvmlDeviceGetHandleByIndex = get
    return nv


@pytest.fixture
def host(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("MILARUN_BACKEND", raising=False)
    nv = locked_out()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    return nv


def test_a_gpu_without_permission_is_skipped_with_the_reason(host):
    backend = NvidiaBackend(pynvml=host)
    found = backend.discover()
    assert [(a.index, a.visible_id, a.portable_id) for a in found] == [
        (0, "GPU-0aaa-0", "0"),
        (2, "GPU-2aaa-2", "1"),
        (3, "GPU-3aaa-3", "2"),
    ]
    assert backend.reason.startswith(
        "GPU 1 skipped, it cannot be opened (NVMLError_NoPermission: Insufficient Permissions)"
    )
    assert nvml_visible(host)[0] == [0, 2, 3]


def test_milarun_devices_shows_the_skipped_gpu(host):
    inv = inventory()
    assert [d["index"] for d in inv["devices"]] == [0, 2, 3]
    assert set(inv["tried"]) == {"nvidia"}
    lines = render(inv)
    assert lines[2] == "  2: Fake GPU 2, 81920 MiB; visible as GPU-2aaa-2; CPUs 4-5"
    assert lines[4].startswith(
        "  nvidia: GPU 1 skipped, it cannot be opened "
        "(NVMLError_NoPermission: Insufficient Permissions)"
    )


def test_every_gpu_denied_says_why(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    backend = NvidiaBackend(pynvml=locked_out(2, denied=(0, 1)))
    assert backend.discover() == []
    assert "GPU 0 skipped" in backend.reason and "GPU 1 skipped" in backend.reason


def test_children_get_their_gpu_by_uuid_and_its_monitor_finds_it(host, monkeypatch):
    job = Job(name="t", suite="s", experiment="milarun.models.toy_reg:main", plan_type="per-gpu")
    (wave,) = plan_job(job, devices.discover(), 0, "/out")
    assert [
        (lch.device, lch.env["CUDA_VISIBLE_DEVICES"], lch.env["CUDA_DEVICE_ORDER"]) for lch in wave
    ] == [
        ("0", "GPU-0aaa-0", "PCI_BUS_ID"),
        ("2", "GPU-2aaa-2", "PCI_BUS_ID"),
        ("3", "GPU-3aaa-3", "PCI_BUS_ID"),
    ]
    # in the child: the monitor reads that GPU, under the launcher's index
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", wave[1].env["CUDA_VISIBLE_DEVICES"])
    with GPUMonitor(interval=0.01) as mon:
        time.sleep(0.03)
    rec = mon.record()
    assert rec["available"] and {s["device"] for s in rec["samples"]} == {2}


def test_an_inherited_index_counts_the_gpus_that_open_as_cuda_does(host, monkeypatch):
    # Slurm's device cgroup with CUDA_VISIBLE_DEVICES=0,1: CUDA's 0 and 1 are the first
    # two GPUs it can open, here NVML's 0 and 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert [a.index for a in NvidiaBackend(pynvml=host).discover()] == [0, 2]


def test_other_nodes_get_cuda_indices_not_this_hosts_uuids(host, tmp_path):
    found = devices.discover()
    system = tmp_path / "system.json"
    system.write_text(
        '{"nodes": [{"name": "a", "address": "10.0.0.1"}, {"name": "b", "address": "10.0.0.2"}]}'
    )
    cluster = nodes.discover(found, system=str(system))
    assert cluster.devices.visible_ids([0, 2, 3]) == ["0", "1", "2"]
    assert nodes.discover(found, environ={}).devices.visible_ids([2]) == ["GPU-2aaa-2"]
