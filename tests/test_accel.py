"""Device backends (milarun.host.accel) against fakes: NVML with MIG, a fake amdsmi module, fake
sysfs DRM/PCI trees and /dev entries. None of this ran on AMD, Intel or MIG hardware."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from milarun.bench import setup
from milarun.bench.setup import WrongDevice, check_device
from milarun.errors import SetupError
from milarun.host import accel, devices
from milarun.host.accel import probe
from milarun.host.accel.amd import AMDBackend
from milarun.host.accel.intel import IntelBackend
from milarun.host.accel.nvidia import NvidiaBackend

ROOT = Path(__file__).resolve().parent.parent


# --- fakes ---------------------------------------------------------------------------------


class _H:
    def __init__(self, index, mig=None):
        self.index, self.mig = index, mig


def fake_nvml(mig_on=(1,), migs_per_gpu=2, fail_init=False):
    """2 GPUs (80 GiB); the GPUs in ``mig_on`` are in MIG mode with ``migs_per_gpu``
    instances of 10 GiB (slot 1 empty: NotFound, as NVML does)."""
    nv = types.ModuleType("pynvml")
    nv.NVML_DEVICE_MIG_ENABLE = 1
    nv.NVML_TEMPERATURE_GPU = 0
    gpus = [_H(0), _H(1)]

    def init():
        if fail_init:
            raise RuntimeError("Driver Not Loaded")

    def mig_handle(h, i):
        if i == 1:
            raise RuntimeError("Not Found")
        return _H(h.index, mig=i)

    def uuid(h):
        return f"MIG-{h.index}{h.mig}aa" if h.mig is not None else f"GPU-{h.index}bb"

    def memory(h):
        total = 10 * 2**30 if h.mig is not None else 80 * 2**30
        return types.SimpleNamespace(total=total, used=2**30)

    def util(h):
        if h.mig is not None:
            raise RuntimeError("Not Supported")
        return types.SimpleNamespace(gpu=77)

    nv.nvmlInit = init
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
    nv.nvmlDeviceGetMigMode = lambda h: (1, 1) if h.index in mig_on else (0, 0)
    nv.nvmlDeviceGetMaxMigDeviceCount = lambda h: migs_per_gpu + 1
    nv.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle
    nv.nvmlDeviceGetUUID = uuid
    nv.nvmlDeviceGetName = lambda h: "A100" + (" MIG 1g.10gb" if h.mig is not None else "")
    nv.nvmlDeviceGetMemoryInfo = memory
    nv.nvmlDeviceGetCpuAffinity = lambda h, words: [0b1111 << (4 * h.index)]
    nv.nvmlDeviceGetUtilizationRates = util
    nv.nvmlDeviceGetTemperature = lambda h, kind: 50 + h.index
    nv.nvmlDeviceGetPowerUsage = lambda h: 250_000
    nv.nvmlDeviceGetTotalEnergyConsumption = lambda h: 9_000_000
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(
        busId=f"00000000:{h.index + 0x3B:02X}:00.0"
    )
    nv.nvmlSystemGetDriverVersion = lambda: "550.54"
    nv.nvmlSystemGetCudaDriverVersion = lambda: 12040
    return nv


def fake_amdsmi(count=2):
    smi = types.ModuleType("amdsmi")
    smi.AmdSmiMemoryType = types.SimpleNamespace(VRAM="vram")
    smi.AmdSmiTemperatureType = types.SimpleNamespace(EDGE="edge", HOTSPOT="hotspot")
    smi.AmdSmiTemperatureMetric = types.SimpleNamespace(CURRENT="current")
    handles = [f"h{i}" for i in range(count)]
    smi.amdsmi_init = lambda *a: None
    smi.amdsmi_get_processor_handles = lambda: handles
    smi.amdsmi_get_gpu_asic_info = lambda h: {"market_name": "AMD Instinct MI300X"}
    smi.amdsmi_get_gpu_device_uuid = lambda h: f"uuid-{h}"
    smi.amdsmi_get_gpu_device_bdf = lambda h: f"0000:c{handles.index(h)}:00.0"
    smi.amdsmi_get_gpu_memory_total = lambda h, kind: 192 * 2**30
    smi.amdsmi_get_gpu_memory_usage = lambda h, kind: 3 * 2**30
    smi.amdsmi_get_gpu_activity = lambda h: {"gfx_activity": 73, "umc_activity": 10}
    smi.amdsmi_get_temp_metric = lambda h, kind, metric: 61 if kind == "edge" else 70
    smi.amdsmi_get_power_info = lambda h: {"current_socket_power": 0, "average_socket_power": 650}
    smi.amdsmi_get_energy_count = lambda h: {
        "energy_accumulator": 2_000_000,
        "counter_resolution": 15.3,
    }
    smi.amdsmi_get_gpu_driver_info = lambda h: {"driver_name": "amdgpu", "driver_version": "6.7.0"}
    smi.amdsmi_topo_get_numa_node_number = lambda h: handles.index(h)
    return smi


def write(path, text):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def pci(root, bdf, vendor, cls, driver=None, cpus=None, node=None):
    dev = Path(root) / "sys/bus/pci/devices" / bdf
    write(dev / "vendor", f"{vendor:#06x}\n")
    write(dev / "device", "0x0bd5\n")
    write(dev / "class", f"{cls:#08x}\n")
    if cpus is not None:
        write(dev / "local_cpulist", cpus + "\n")
    if node is not None:
        write(dev / "numa_node", f"{node}\n")
    if driver:
        drv = Path(root) / "sys/bus/pci/drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        os.symlink(drv, dev / "driver")
    return dev


def drm_card(root, name, dev):
    card = Path(root) / "sys/class/drm" / name
    card.mkdir(parents=True, exist_ok=True)
    os.symlink(dev, card / "device")


@pytest.fixture
def no_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(fail_init=True))
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import amdsmi: ImportError


# --- NVIDIA and MIG --------------------------------------------------------------------------


def test_mig_instances_are_devices_with_their_uuids_and_their_gpus_cpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    found = NvidiaBackend(pynvml=fake_nvml()).discover()
    # GPU 0 whole; GPU 1 in MIG mode: its instances 0 and 2 (slot 1 empty)
    assert [(a.index, a.visible_id, a.parent) for a in found] == [
        (0, "GPU-0bb", None),
        (1, "MIG-10aa", 1),
        (2, "MIG-12aa", 1),
    ]
    assert [a.memory_mib for a in found] == [80 * 1024, 10 * 1024, 10 * 1024]
    assert found[1].cpus == found[2].cpus == [4, 5, 6, 7]  # the parent GPU's affinity
    assert found[1].pci_bus_id == "0000:3c:00.0" and found[0].pci_bus_id == "0000:3b:00.0"


def test_without_mig_devices_keep_nvml_indices(monkeypatch):
    # the index is NVML's; a child is given its GPU by UUID (NVML's and CUDA's indices
    # can differ), and another node by CUDA's index (portable_id)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    found = NvidiaBackend(pynvml=fake_nvml(mig_on=())).discover()
    assert [(a.index, a.visible_id, a.portable_id) for a in found] == [
        (1, "GPU-1bb", "1"),
        (0, "GPU-0bb", "0"),
    ]


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("MIG-12aa", [(0, "MIG-12aa")]),  # a MIG UUID names that instance only
        ("MIG-12", [(0, "MIG-12aa")]),  # a unique prefix, as CUDA accepts
        ("MIG-1", []),  # ambiguous prefix: hides everything after
        ("0,MIG-zz,MIG-10aa", [(0, "GPU-0bb")]),  # an invalid entry hides the rest (no MIG)
    ],
)
def test_cuda_visible_devices_with_mig_uuids(monkeypatch, spec, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    found = NvidiaBackend(pynvml=fake_nvml()).discover()
    assert [(a.index, a.visible_id) for a in found] == expected


def test_mig_telemetry_leaves_out_what_belongs_to_the_whole_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    backend = NvidiaBackend(pynvml=fake_nvml())
    gpu, mig, _ = backend.discover()
    whole = backend.read(gpu)
    assert (whole.load, whole.memory_mib, whole.temperature, whole.power, whole.energy) == (
        77,
        1024,
        50,
        250.0,
        9000.0,
    )  # %, MiB, °C, W (mW), J (mJ)
    part = backend.read(mig)
    assert (part.memory_mib, part.temperature) == (1024, 51)
    assert part.load is None and part.power is None and part.energy is None
    assert backend.versions() == {"driver": "550.54", "runtime": "12.4", "runtime_name": "CUDA"}


def test_a_mig_child_gets_its_uuid_and_the_backend(monkeypatch):
    from milarun.plan.launches import plan_job
    from milarun.profile.job import Job

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    found = devices.discover()
    assert found.kind == "gpu" and found.backend == "nvidia" and found.indices == [0, 1, 2]
    job = Job(name="t", suite="s", experiment="milarun.models.toy_reg:main", plan_type="per-gpu")
    (wave,) = plan_job(job, found, 0, "/out")
    envs = [lch.env for lch in wave]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["GPU-0bb", "MIG-10aa", "MIG-12aa"]
    assert all(e["MILARUN_BACKEND"] == "nvidia" for e in envs)
    assert envs[0]["MILARUN_PCI_BUS_ID"] == "0000:3b:00.0"
    assert "MILARUN_PCI_BUS_ID" not in envs[1]  # a MIG instance shares its GPU's bus id


# --- AMD ---------------------------------------------------------------------------------------


def test_amd_discovery_units_affinity_and_versions(tmp_path, monkeypatch):
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    pci(tmp_path, "0000:c0:00.0", 0x1002, 0x038000, "amdgpu", cpus="0-7", node=0)
    pci(tmp_path, "0000:c1:00.0", 0x1002, 0x038000, "amdgpu", cpus="8-15", node=1)
    write(tmp_path / "opt/rocm/.info/version", "6.2.1-112\n")
    backend = AMDBackend(amdsmi=fake_amdsmi(), root=tmp_path)
    found = backend.discover()
    assert [(a.index, a.visible_id, a.name) for a in found] == [
        (0, "0", "AMD Instinct MI300X"),
        (1, "1", "AMD Instinct MI300X"),
    ]
    assert found[1].memory_mib == 192 * 1024 and found[1].cpus == list(range(8, 16))
    assert found[1].numa_node == 1 and found[1].pci_bus_id == "0000:c1:00.0"
    r = backend.read(found[0])
    assert (r.load, r.memory_mib, r.temperature, r.power) == (73, 3072, 61, 650)
    assert r.energy == pytest.approx(2_000_000 * 15.3 / 1e6)  # µJ -> J
    assert backend.versions() == {"driver": "6.7.0", "runtime": "6.2.1-112", "runtime_name": "ROCm"}
    # one filtering variable; HIP and CUDA index into what ROCr leaves
    assert backend.child_env(["1"]) == {
        "ROCR_VISIBLE_DEVICES": "1",
        "HIP_VISIBLE_DEVICES": "0",
        "CUDA_VISIBLE_DEVICES": "0",
    }
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "1")  # set by a parent launcher
    assert [a.index for a in AMDBackend(amdsmi=fake_amdsmi(), root=tmp_path).discover()] == [1]


def test_amd_without_its_library_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    backend = AMDBackend()
    ok, why = backend.available()
    assert not ok and "amdsmi" in why and "ROCm" in why
    assert backend.discover() == [] and "amdsmi" in backend.reason

    class Denied(types.ModuleType):
        def amdsmi_init(self, *a):
            raise PermissionError("/dev/kfd")

    monkeypatch.setitem(sys.modules, "amdsmi", Denied("amdsmi"))
    ok, why = AMDBackend().available()
    assert not ok and "permission denied" in why and "render group" in why


# --- Intel -------------------------------------------------------------------------------------


def intel_tree(root):
    igpu = pci(root, "0000:00:02.0", 0x8086, 0x030000, "i915")  # integrated
    dgpu = pci(root, "0000:3a:00.0", 0x8086, 0x038000, "xe", cpus="0-3", node=0)
    write(dgpu / "lmem_total_bytes", str(64 * 2**30))
    mon = dgpu / "hwmon" / "hwmon3"
    write(mon / "energy1_input", "5000000\n")  # µJ
    write(mon / "power1_average", "300000000\n")  # µW
    write(mon / "temp1_input", "45000\n")  # m°C
    drm_card(root, "card0", igpu)
    drm_card(root, "card1", dgpu)
    (Path(root) / "sys/class/drm/card1-DP-1").mkdir()  # a connector, not a card
    write(Path(root) / "proc/sys/kernel/osrelease", "6.8.0-45-generic\n")
    write(Path(root) / "usr/lib/x86_64-linux-gnu/libze_loader.so.1.17.6", "")


def test_intel_discrete_gpus_only_with_sysfs_units(tmp_path, monkeypatch):
    monkeypatch.delenv("ZE_AFFINITY_MASK", raising=False)
    intel_tree(tmp_path)
    backend = IntelBackend(root=tmp_path)
    (gpu,) = backend.discover()  # the integrated GPU is no device
    assert (gpu.index, gpu.visible_id, gpu.pci_bus_id) == (0, "0", "0000:3a:00.0")
    assert gpu.memory_mib == 64 * 1024 and gpu.cpus == [0, 1, 2, 3] and gpu.numa_node == 0
    r = backend.read(gpu)
    assert (r.energy, r.power, r.temperature, r.load) == (5.0, 300.0, 45.0, None)
    assert backend.versions() == {
        "driver": "6.8.0-45-generic",
        "runtime": "1.17.6",
        "runtime_name": "Level Zero",
    }
    assert backend.child_env(["0"]) == {
        "ZE_AFFINITY_MASK": "0",
        "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE",
    }
    assert backend.torch_device == "xpu"
    monkeypatch.setenv("ZE_AFFINITY_MASK", "1")  # a mask naming no device here
    assert IntelBackend(root=tmp_path).discover() == []


# --- the probe and the never-silent rule ----------------------------------------------------


def test_probe_counts_gpus_not_bmc_vga_or_the_integrated_intel_gpu(tmp_path):
    write(tmp_path / "dev/nvidia0", "")
    write(tmp_path / "dev/nvidiactl", "")  # not a GPU node
    pci(tmp_path, "0000:02:00.0", 0x1A03, 0x030000, "ast")  # ASPEED BMC VGA
    pci(tmp_path, "0000:00:02.0", 0x8086, 0x030000, "i915")  # integrated Intel
    pci(tmp_path, "0000:3b:00.0", 0x10DE, 0x030200)  # NVIDIA, no driver
    seen = probe.found(tmp_path)
    assert seen == {"NVIDIA": ["/dev/nvidia0", "PCI 0000:3b:00.0 (driver: none)"]}
    empty = tmp_path / "empty"
    pci(empty, "0000:00:02.0", 0x8086, 0x030000, "i915")
    pci(empty, "0000:02:00.0", 0x1A03, 0x030000, "ast")
    assert probe.found(empty) == {}  # a CPU server: runs on CPU slots


def test_gpus_no_backend_sees_stop_the_run_unless_cpu_slots(tmp_path, no_nvml):
    write(tmp_path / "dev/nvidia0", "")
    write(tmp_path / "dev/kfd", "")
    opts = {"intel": {"root": tmp_path}}
    with pytest.raises(SetupError) as exc:
        devices.discover(root=tmp_path, options=opts)
    line = str(exc.value)
    assert "\n" not in line
    assert "NVIDIA: /dev/nvidia0" in line and "AMD: /dev/kfd" in line
    assert "NVML cannot start" in line and "amdsmi" in line and "--cpu-slots" in line
    slots = devices.discover(cpu_slots=2, root=tmp_path, options=opts)  # on purpose
    assert slots.kind == "cpu" and len(slots) == 2


def test_milarun_jobs_stops_with_one_line_and_launches_nothing(
    tmp_path, no_nvml, monkeypatch, capsys
):
    from milarun.cli import main

    monkeypatch.setattr(probe, "found", lambda root="/": {"NVIDIA": ["/dev/nvidia0"]})
    profile = write(
        tmp_path / "p.json",
        json.dumps(
            {
                "t": {
                    "experiment": "milarun.models.toy_reg:main",
                    "partition_scheme": {"type": "per-gpu"},
                }
            }
        ),
    )
    with pytest.raises(SystemExit) as exc:
        main(["jobs", str(profile), "-d", str(tmp_path), "-o", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("milarun: error: this host has accelerators")
    assert not (tmp_path / "out").exists()


# --- milarun devices ---------------------------------------------------------------------------


def test_devices_command_on_a_fake_amd_host(tmp_path, no_nvml, monkeypatch):
    from milarun.host.inventory import inventory, render

    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    pci(tmp_path, "0000:c0:00.0", 0x1002, 0x038000, "amdgpu", cpus="0-7", node=0)
    write(tmp_path / "dev/kfd", "")
    write(tmp_path / "opt/rocm/.info/version", "6.2.1\n")
    inv = inventory(root=tmp_path, options={"amd": {"amdsmi": fake_amdsmi(1), "root": tmp_path}})
    assert (inv["backend"], inv["vendor"], inv["driver"], inv["runtime"]) == (
        "amd",
        "AMD",
        "6.7.0",
        "6.2.1",
    )
    (dev,) = inv["devices"]
    assert (dev["visible"], dev["memory_mib"], dev["cpus"], dev["numa_node"]) == (
        "0",
        192 * 1024,
        list(range(8)),
        0,
    )
    text = render(inv)
    assert text[0] == "backend: amd (AMD), driver 6.7.0, ROCm 6.2.1"
    assert text[1] == (
        "  0: AMD Instinct MI300X, 196608 MiB; visible as 0; PCI 0000:c0:00.0, "
        "NUMA node 0, CPUs 0-7"
    )
    assert "AMD: /dev/kfd, PCI 0000:c0:00.0 (driver: amdgpu)" in text[-1]


def test_devices_command_on_this_cpu_host():
    proc = subprocess.run(
        [sys.executable, "-m", "milarun", "devices", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    inv = json.loads(proc.stdout)
    assert inv["backend"] == "cpu" and inv["devices"] == [] and inv["probe"] == {}
    assert set(inv["tried"]) == {"nvidia", "amd", "intel"}
    count = subprocess.run(
        [sys.executable, "-m", "milarun", "devices", "--count"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert count.stdout.strip() == "0"  # cgroup_setup.sh then asks for --students


# --- the child's device check -----------------------------------------------------------------


def fake_torch(cuda=None, hip=None, available=False, bus=(0, 0x3B, 0), xpu=False):
    props = types.SimpleNamespace(pci_domain_id=bus[0], pci_bus_id=bus[1], pci_device_id=bus[2])
    return types.SimpleNamespace(
        __version__="2.x",
        version=types.SimpleNamespace(cuda=cuda, hip=hip),
        cuda=types.SimpleNamespace(
            is_available=lambda: available, get_device_properties=lambda i: props
        ),
        xpu=types.SimpleNamespace(is_available=lambda: xpu),
    )


@pytest.mark.parametrize(
    "fake,env,words",
    [
        (fake_torch(cuda="12.4", available=True), {"MILARUN_BACKEND": "amd"}, "not a ROCm build"),
        (fake_torch(hip="6.2", available=True), {"MILARUN_BACKEND": "nvidia"}, "not a CUDA build"),
        (fake_torch(cuda="12.4"), {"MILARUN_BACKEND": "nvidia"}, "torch sees none"),
        (fake_torch(), {"MILARUN_BACKEND": "intel"}, "no usable XPU"),
        (
            fake_torch(cuda="12.4", available=True),
            {"MILARUN_BACKEND": "nvidia", "MILARUN_PCI_BUS_ID": "0000:3c:00.0"},
            "not the 0000:3c:00.0",
        ),
    ],
)
def test_wrong_device(fake, env, words, monkeypatch):
    monkeypatch.setattr(setup, "torch", fake)
    with pytest.raises(WrongDevice, match=words) as exc:
        check_device(env)
    assert exc.value.fail_reason == "wrong-device"


@pytest.mark.parametrize(
    "fake,env",
    [
        (
            fake_torch(cuda="12.4", available=True),
            {"MILARUN_BACKEND": "nvidia", "MILARUN_PCI_BUS_ID": "0000:3b:00.0"},
        ),
        (fake_torch(hip="6.2", available=True), {"MILARUN_BACKEND": "amd"}),
        (fake_torch(xpu=True), {"MILARUN_BACKEND": "intel"}),
        (fake_torch(), {"MILARUN_BACKEND": "cpu"}),
        (fake_torch(), {}),
    ],
)
def test_right_device_passes(fake, env, monkeypatch):
    monkeypatch.setattr(setup, "torch", fake)
    check_device(env)


def test_a_child_given_a_gpu_it_cannot_use_writes_a_wrong_device_record(tmp_path):
    env = {**os.environ, "MILARUN_BACKEND": "nvidia", "CUDA_VISIBLE_DEVICES": "0"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "milarun",
            "run",
            "milarun.models.toy_reg:main",
            "-o",
            str(tmp_path / "r.json"),
            "--",
            "--max-count",
            "100",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    rec = json.loads((tmp_path / "r.json").read_text())
    assert rec["success"] is False and rec["error"]["reason"] == "wrong-device"
    assert "GPU" in rec["error"]["message"]


def test_every_backend_is_registered_and_named():
    for name in accel.BACKENDS:
        backend = accel.get(name)
        assert backend.name == name and backend.torch_device in ("cuda", "xpu", "cpu")
    with pytest.raises(KeyError):
        accel.get("tpu")


# --- hostile hardware and odd flags ----------------------------------------------------------


def test_a_gpu_in_mig_mode_without_instances_is_no_device(monkeypatch):
    # CUDA enumerates nothing for such a GPU: giving it whole would fail every child
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def no_instances(mig_on):
        nv = fake_nvml(mig_on=mig_on)

        def empty_slot(h, i):
            raise RuntimeError("Not Found")

        nv.nvmlDeviceGetMigDeviceHandleByIndex = empty_slot
        return nv

    backend = NvidiaBackend(pynvml=no_instances((1,)))
    assert [(a.index, a.visible_id, a.parent) for a in backend.discover()] == [(0, "GPU-0bb", None)]
    backend = NvidiaBackend(pynvml=no_instances((0, 1)))
    assert backend.discover() == []
    assert "MIG mode" in backend.reason and "no MIG instance" in backend.reason


def test_nvml_counters_a_board_does_not_support_leave_out_only_themselves(monkeypatch):
    # vGPU guests and some boards answer NotSupported for power or utilisation
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nv = fake_nvml(mig_on=())

    def unsupported(h):
        raise RuntimeError("Not Supported")

    nv.nvmlDeviceGetPowerUsage = nv.nvmlDeviceGetUtilizationRates = unsupported
    backend = NvidiaBackend(pynvml=nv)
    r = backend.read(backend.discover()[0])
    assert (r.load, r.memory_mib, r.temperature, r.power, r.energy) == (
        None,
        1024,
        50,
        None,
        9000.0,
    )


def test_amdsmi_not_available_values_never_reach_a_record(tmp_path, monkeypatch):
    # amdsmi answers "N/A" (not an exception) for counters a GPU lacks (0xFFFF, max uint)
    from milarun.bench.monitor import FIELDS
    from milarun.formats.record import new_result, validate

    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    smi = fake_amdsmi(1)
    smi.amdsmi_get_gpu_activity = lambda h: {"gfx_activity": "N/A", "umc_activity": "N/A"}
    smi.amdsmi_get_power_info = lambda h: {
        "current_socket_power": "N/A",
        "average_socket_power": 650,
        "power_limit": "N/A",
    }
    backend = AMDBackend(amdsmi=smi, root=tmp_path)
    (dev,) = backend.discover()
    r = backend.read(dev)
    assert (r.load, r.power, r.temperature) == (None, 650, 61)
    rec = new_result("s.t")
    rec["gpu_monitor"] = {
        "available": True,
        "reason": None,
        "interval": 1.0,
        "samples": [
            {
                "t": 0.0,
                "device": 0,
                **{k: getattr(r, k) for k in FIELDS if getattr(r, k) is not None},
            }
        ],
    }
    rec["host"]["gpus"] = [{"index": 0, "name": dev.name, **backend.facts(dev)}]
    validate(rec)


def test_amd_telemetry_a_partition_lacks_keeps_the_rest(tmp_path, monkeypatch):
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    smi = fake_amdsmi(1)

    def unsupported(*a):
        raise RuntimeError("AMDSMI_STATUS_NOT_SUPPORTED")

    smi.amdsmi_get_gpu_activity = unsupported
    backend = AMDBackend(amdsmi=smi, root=tmp_path)
    (dev,) = backend.discover()
    r = backend.read(dev)
    assert (r.load, r.memory_mib, r.power) == (None, 3072, 650)
    for name in dir(smi):  # a library that raises on every call
        if name.startswith("amdsmi_get"):
            setattr(smi, name, unsupported)
    with pytest.raises(RuntimeError, match="NOT_SUPPORTED"):
        backend.read(dev)  # the monitor records an error row


@pytest.mark.parametrize(
    "bdf,vendor,cls,driver,device",
    [
        ("0000:00:0b.0", 0x8086, 0x120000, "intel_vpu", 0x7D1D),  # Meteor Lake NPU
        ("0000:00:0b.0", 0x8086, 0x120000, None, 0x643E),  # Lunar Lake NPU, no driver
        ("0000:00:02.1", 0x8086, 0x030000, "i915", 0xA7A0),  # iGPU SR-IOV virtual function
        ("0000:01:03.0", 0x1002, 0x030000, None, 0x515E),  # ATI ES1000 server VGA
        ("0000:01:03.0", 0x1002, 0x030000, "radeon", 0x515E),
        ("0000:00:0e.0", 0x1002, 0x030000, None, 0x4752),  # ATI Rage XL server VGA
    ],
)
def test_probe_ignores_npus_igpu_functions_and_old_server_vga(
    tmp_path, bdf, vendor, cls, driver, device
):
    dev = pci(tmp_path, bdf, vendor, cls, driver)
    write(dev / "device", f"{device:#06x}\n")
    assert probe.found(tmp_path) == {}  # a CPU server: runs on CPU slots


def test_intel_backend_skips_the_igpu_virtual_functions(tmp_path, monkeypatch):
    monkeypatch.delenv("ZE_AFFINITY_MASK", raising=False)
    intel_tree(tmp_path)
    vf = pci(tmp_path, "0000:00:02.1", 0x8086, 0x030000, "i915")
    drm_card(tmp_path, "card2", vf)
    assert [a.pci_bus_id for a in IntelBackend(root=tmp_path).discover()] == ["0000:3a:00.0"]


def test_probe_survives_garbage_and_loops_in_sysfs(tmp_path):
    base = tmp_path / "sys/bus/pci/devices"
    bad = pci(tmp_path, "0000:3b:00.0", 0x10DE, 0x030200)
    write(bad / "class", "\x00\xff garbage\n")
    loop = base / "0000:3c:00.0"
    loop.mkdir()
    os.symlink(loop / "vendor", loop / "vendor")  # ELOOP
    (loop / "class").symlink_to(loop / "class2")
    (loop / "class2").symlink_to(loop / "class")
    write(base / "0000:3d:00.0" / "vendor", "0x10de\n")  # class missing
    assert probe.found(tmp_path) == {}


@pytest.mark.parametrize("flag", ["0", "-3", "99999"])
def test_devices_command_rejects_bad_cpu_slots_in_one_line(flag, capsys):
    from milarun.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["devices", "--cpu-slots", flag])
    assert exc.value.code == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("milarun: error: --cpu-slots must be between 1 and ")
    assert err.endswith(f"not {flag}")


def test_devices_command_help_names_its_flags():
    proc = subprocess.run(
        [sys.executable, "-m", "milarun", "devices", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "--json " in proc.stdout and "--json-" not in proc.stdout


def test_a_cpu_slot_child_never_picks_a_gpu_left_visible(monkeypatch):
    # an Intel GPU with torch's XPU build: ZE_AFFINITY_MASK="" hides nothing
    from milarun.bench.setup import init_torch
    from milarun.plan.launches import plan_job
    from milarun.profile.job import Job

    job = Job(name="t", suite="s", experiment="milarun.models.toy_reg:main", plan_type="per-gpu")
    (wave,) = plan_job(job, devices.Devices("cpu", [0, 1]), 0, "/out")
    env = wave[0].env
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["MILARUN_BACKEND"] == "cpu"
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setenv("MILARUN_BACKEND", "cpu")
    exp = types.SimpleNamespace(options={"seed": 0, "device": "auto"}, result={"host": {}})
    assert init_torch(exp).type == "cpu"


def test_intel_empty_mask_hides_nothing_and_the_newest_loader_is_named(tmp_path, monkeypatch):
    intel_tree(tmp_path)
    write(tmp_path / "usr/lib/x86_64-linux-gnu/libze_loader.so.1.9.2", "")
    monkeypatch.setenv("ZE_AFFINITY_MASK", "")  # Level Zero: all devices
    backend = IntelBackend(root=tmp_path)
    assert [a.pci_bus_id for a in backend.discover()] == ["0000:3a:00.0"]
    assert backend.versions()["runtime"] == "1.17.6"  # not 1.9.2, the text-order last


def test_intel_power_from_the_energy_counter_where_i915_has_no_power_file(tmp_path, monkeypatch):
    monkeypatch.delenv("ZE_AFFINITY_MASK", raising=False)
    intel_tree(tmp_path)
    mon = tmp_path / "sys/bus/pci/devices/0000:3a:00.0/hwmon/hwmon3"
    (mon / "power1_average").unlink()
    now = [100.0]
    backend = IntelBackend(root=tmp_path, clock=lambda: now[0])
    (gpu,) = backend.discover()
    first = backend.read(gpu)
    assert (first.energy, first.power) == (5.0, None)  # no previous reading yet
    now[0] = 102.0
    write(mon / "energy1_input", "605000000\n")  # +600 J in 2 s
    assert backend.read(gpu).power == pytest.approx(300.0)
    now[0] = 103.0
    write(mon / "energy1_input", "1000\n")  # counter reset: no power
    assert backend.read(gpu).power is None


def test_a_visibility_variable_that_hides_every_gpu_is_named_not_taken_for_a_missing_driver(
    tmp_path, monkeypatch
):
    # the never-silent line names the variable the user set, not "install the driver"
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(mig_on=()))
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    write(tmp_path / "dev/nvidia0", "")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(SetupError) as exc:
        devices.discover(root=tmp_path, options={"intel": {"root": tmp_path}})
    assert "nvidia: CUDA_VISIBLE_DEVICES='' hides every GPU (2 on the host)" in str(exc.value)
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "")
    amd = AMDBackend(amdsmi=fake_amdsmi(), root=tmp_path)
    assert (
        amd.discover() == []
        and amd.reason == "ROCR_VISIBLE_DEVICES='' hides every GPU (2 on the host)"
    )
    intel_tree(tmp_path)
    monkeypatch.setenv("ZE_AFFINITY_MASK", "5")
    intel = IntelBackend(root=tmp_path)
    assert (
        intel.discover() == []
        and intel.reason == "ZE_AFFINITY_MASK='5' hides every GPU (1 on the host)"
    )


def test_amd_versions_never_raise_on_a_garbled_rocm_version_file(tmp_path):
    # versions() feeds every child's host facts and `milarun devices`: it never raises
    write(tmp_path / "opt/rocm/.info/version", "")
    (tmp_path / "opt/rocm/.info/version").write_bytes(b"\xff\xfe6.2")
    assert AMDBackend(amdsmi=fake_amdsmi(), root=tmp_path).versions() == {
        "driver": "6.7.0",
        "runtime": None,
        "runtime_name": "ROCm",
    }


def test_amd_clocks_read_the_graphics_clock_and_the_throttle_causes():
    # the burn-in on AMD: amdsmi's GFX clock, and the throttle causes as NVML's bits --
    # the violation status's active flags (MI300+), else the older independent throttler mask
    from milarun.host.accel.amd import AMDBackend
    from milarun.measure.acceptance import reason_names

    smi = fake_amdsmi(1)
    smi.AmdSmiClkType = types.SimpleNamespace(GFX="gfx")
    smi.amdsmi_get_clock_info = lambda h, kind: {
        "clk": 2100 if kind == "gfx" else 0,
        "min_clk": 500,
        "max_clk": 2100,
    }
    backend = AMDBackend(amdsmi=smi)
    dev = backend.discover()[0]
    # no throttle source at all: the clock, no reasons (throttled stays unknown)
    assert backend.clocks(dev) == {"sm_clock_mhz": 2100, "reasons": None}
    na = 0xFF  # UINT8_MAX: "not supported"
    smi.amdsmi_get_violation_status = lambda h: {
        "active_ppt_pwr": 1,
        "active_socket_thrm": 0,
        "active_hbm_thrm": na,
        "active_prochot_thrm": 1,
        "active_vr_thrm": 0,
        "per_ppt_pwr": 37,
    }
    reading = backend.clocks(dev)
    assert reading["sm_clock_mhz"] == 2100
    assert reason_names(reading["reasons"]) == ["sw_power_cap", "hw_thermal"]
    smi.amdsmi_get_violation_status = lambda h: {
        k: 0 for k in ("active_ppt_pwr", "active_socket_thrm", "active_prochot_thrm")
    }
    assert backend.clocks(dev)["reasons"] == 0  # known, and not throttled
    # an MI200: violation status unsupported everywhere -> gpu_metrics' throttler bits
    smi.amdsmi_get_violation_status = lambda h: {"active_ppt_pwr": na, "active_socket_thrm": na}
    smi.amdsmi_get_gpu_metrics_info = lambda h: {"indep_throttle_status": (1 << 4) | (1 << 34)}
    assert reason_names(backend.clocks(dev)["reasons"]) == ["sw_power_cap", "sw_thermal"]
    smi.amdsmi_get_gpu_metrics_info = lambda h: {"indep_throttle_status": 2**64 - 1}
    assert backend.clocks(dev)["reasons"] is None  # UINT64_MAX: not supported
    del smi.amdsmi_get_violation_status
    smi.amdsmi_get_gpu_metrics_info = lambda h: {"indep_throttle_status": 1 << 57}
    assert reason_names(backend.clocks(dev)["reasons"]) == ["hw_thermal"]  # PROCHOT_GFX
    smi.amdsmi_get_clock_info = lambda h, kind: {"clk": 0xFFFFFFFF}  # "not supported"
    assert backend.clocks(dev) is None
    del smi.amdsmi_get_clock_info  # older amdsmi
    assert backend.clocks(dev) is None


@pytest.mark.parametrize("driver", ["xe", "i915", "i915-old"])
def test_intel_clocks_and_throttle_reasons_from_sysfs(tmp_path, monkeypatch, driver):
    from milarun.measure.acceptance import reason_names

    monkeypatch.delenv("ZE_AFFINITY_MASK", raising=False)
    intel_tree(tmp_path)
    backend = IntelBackend(root=tmp_path)
    dev = backend.discover()[0]
    card = dev.handle.parent
    assert backend.clocks(dev) is None  # no frequency file: no reading
    if driver == "xe":
        freq = dev.handle / "tile0/gt0/freq0"
        write(freq / "act_freq", "1550\n")
        reasons = {k: freq / f"throttle/reason_{k}" for k in ("pl1", "thermal", "prochot")}
    elif driver == "i915":
        write(card / "gt/gt0/rps_act_freq_mhz", "1550\n")
        reasons = {k: card / f"gt/gt0/throttle_reason_{k}" for k in ("pl1", "thermal", "prochot")}
    else:
        write(card / "gt_act_freq_mhz", "1550\n")
        reasons = {}
    assert backend.clocks(dev) == {"sm_clock_mhz": 1550, "reasons": None}
    if not reasons:
        return
    for name, path in reasons.items():
        write(path, "1\n" if name != "thermal" else "0\n")
    assert reason_names(backend.clocks(dev)["reasons"]) == ["sw_power_cap", "hw_thermal"]
    for path in reasons.values():
        write(path, "0\n")
    assert backend.clocks(dev)["reasons"] == 0
