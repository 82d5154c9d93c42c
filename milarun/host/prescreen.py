"""The host prescreen: every setting of a node that moves the numbers, read before the first
launch of ``milarun jobs`` (docs/acceptance.md, "Host prescreen"). No torch.

``python -m milarun.host.prescreen`` prints this node's as one JSON object:
``{"format": "milarun-prescreen", "version": 1, "hostname": "n1", "findings": [...]}``.
``milarun jobs`` does not run it on its own: the findings travel in each node's hardware
identity (:func:`milarun.host.identity.node_config`, key ``prescreen``), which the launcher
already reads from every node (:mod:`milarun.launcher.identities`) and the session file keeps,
so ``milarun seal`` binds them and ``milarun verify`` judges them (``compliance.prescreen``).

A finding is ``{"name", "found", "expected", "ok", "why"}``: ``found`` and ``expected`` are
text (``found`` None when nothing could be read), ``ok`` is True (as expected), False (not as
expected) or None (unknown: a file that cannot be read, NVML absent, a call the GPU does not
support). Unknown is never ok. :func:`prescreen` gives one finding per name of :data:`NAMES`,
in that order; a finding over several GPUs or ports is False when one of them is, else None
when one of them is unknown. Names and their sources:

* ``cpu_cstates``: the cpuidle states of every CPU
  (``/sys/devices/system/cpu/cpuN/cpuidle/stateM/{name,disable}``, kernel docs
  admin-guide/pm/cpuidle): no state deeper than C1E enabled (:data:`SHALLOW_CSTATES`);
  waking from a deep state costs tens to hundreds of microseconds per wake-up (NVIDIA's
  DGX and Mellanox performance tuning guides: C-states off in the BIOS).
* ``cpu_governor``: the cpufreq governor of every CPU (``cpuN/cpufreq/scaling_governor``):
  ``performance`` (kernel docs admin-guide/pm/cpufreq).
* ``numa_balancing``: ``/proc/sys/kernel/numa_balancing``: ``0`` (automatic NUMA balancing
  unmaps pages to sample their accesses, then migrates them: page faults in the input
  pipeline; kernel docs admin-guide/sysctl/kernel, "numa_balancing").
* ``transparent_hugepages``: the bracketed value of
  ``/sys/kernel/mm/transparent_hugepage/enabled``: ``madvise`` (kernel docs
  admin-guide/mm/transhuge: huge pages for the regions that ask for them; ``always`` adds
  compaction and khugepaged stalls to every process, ``never`` gives none to those that ask).
* ``kernel``: ``/proc/sys/kernel/osrelease`` (``uname -r``): recorded, no expectation (ok
  unless it cannot be read).
* ``gpu_persistence``: NVML ``nvmlDeviceGetPersistenceMode`` of every visible GPU: enabled
  (NVIDIA driver persistence docs: without it the driver tears the GPU down between
  processes and each launch pays its initialisation).
* ``gpu_ecc``: ``nvmlDeviceGetEccMode`` (current, pending): both enabled (a pending change
  applies at the next reset: the numbers would come from another mode than the one
  delivered).
* ``gpu_power_limit``: ``nvmlDeviceGetPowerManagementLimit`` against
  ``nvmlDeviceGetPowerManagementDefaultLimit`` (mW, shown in W): equal.
* ``gpu_app_clocks``: ``nvmlDeviceGetApplicationsClock`` against
  ``nvmlDeviceGetDefaultApplicationsClock``, SM and memory (MHz): equal.
* ``gpu_idle``: ``nvmlDeviceGetComputeRunningProcesses`` and
  ``nvmlDeviceGetGraphicsRunningProcesses``: no process holds a context on the GPU before
  the first launch (the launcher itself never opens one; the process that started the session
  and its ancestors, such as the GPU check, are named but not judged); a PID in another PID
  namespace (a container) is NVML's, not necessarily one this host's ``ps`` shows.
* ``iommu``: the IOMMU groups' type (``/sys/kernel/iommu_groups/N/type``, kernel docs
  ABI sysfs-kernel-iommu_groups), the IOMMUs in ``/sys/class/iommu`` and ``iommu=``,
  ``iommu.passthrough=``, ``intel_iommu=``, ``amd_iommu=`` of ``/proc/cmdline``: off or in
  passthrough (CUDA C++ Programming Guide, "IOMMU on Linux": peer-to-peer copies are not
  supported with the IOMMU translating on bare metal; NVIDIA's GPUDirect RDMA guide and
  NCCL's troubleshooting guide, "GPU Direct": IOMMU and PCI ACS redirect peer traffic
  through the root complex).
* ``pci_acs``: the ACS Control register of every PCI bridge (class ``0x0604``) that has the
  ACS extended capability (ID ``0x000D``, found by walking the extended capabilities from
  offset ``0x100`` of ``/sys/bus/pci/devices/D/config``; PCI Express Base Specification,
  "ACS Extended Capability"): none with P2P Request Redirect (bit 2), P2P Completion
  Redirect (bit 3) or P2P Egress Control (bit 5) on (NCCL's troubleshooting guide, "PCI
  Access Control Services": ACS sends GPU peer and GPUDirect RDMA traffic up to the root
  complex; disable it on bare metal). Reading past the first 64 bytes of a config file
  needs root: otherwise unknown. No bridge: unknown ("nothing to judge").
* ``ib_port_state``, ``ib_port_rate``, ``ib_port_phys_state``: every port of
  ``/sys/class/infiniband/DEV/ports/N/{state,rate,phys_state}`` (InfiniBand and RoCE):
  ``4: ACTIVE``, at least :data:`MIN_IB_RATE_GBPS` Gb/s (``400 Gb/sec (4X NDR)``),
  ``5: LinkUp``. A node without such a device gives None ("nothing to judge"): a
  multi-node acceptance needs one.

GPU findings cover the GPUs NVML sees and this process may open, as the suite's devices
(``CUDA_VISIBLE_DEVICES`` honoured, :func:`milarun.host.accel.nvidia.nvml_visible`).
Sysfs and procfs are read under ``root`` (tests: a fake tree) through
:func:`milarun.host.kernel.read_text`; NVML through ``nvml`` (tests: a fake module).
Nothing here raises: a reading that fails is an unknown finding saying why.
"""

import glob
import json
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any

from ..formats.jsonfile import load_schema
from .accel.nvidia import nvml_visible
from .kernel import read_text

#: ``format`` and ``version`` of ``python -m milarun.host.prescreen``'s object.
PRESCREEN_FORMAT = "milarun-prescreen"
PRESCREEN_VERSION = 1
#: Every finding's name, in :func:`prescreen`'s order: the enum of the rules'
#: ``prescreen.fatal`` (``formats/schemas/rules.schema.json``), read from there.
NAMES = tuple(
    load_schema("rules")["properties"]["prescreen"]["properties"]["fatal"]["items"]["enum"]
)
#: cpuidle state names that are not "deep": polling, halt and enhanced halt.
SHALLOW_CSTATES = frozenset({"POLL", "C0", "C1", "C1E", "C1_ACPI", "C1E_ACPI"})
#: The slowest InfiniBand/RoCE port rate expected (Gb/s): NDR, as NVIDIA's DGX H100/B200.
MIN_IB_RATE_GBPS = 400.0
#: The expected ``transparent_hugepage/enabled`` value (module docstring).
THP_EXPECTED = "madvise"
#: PCI Express extended capability ID of Access Control Services.
ACS_CAP_ID = 0x000D
#: ACS Control bits that redirect peer-to-peer traffic, by their specification names.
ACS_REDIRECT_BITS = {0x4: "RR", 0x8: "CR", 0x20: "EC"}

__all__ = [
    "MIN_IB_RATE_GBPS",
    "NAMES",
    "PRESCREEN_FORMAT",
    "PRESCREEN_VERSION",
    "SHALLOW_CSTATES",
    "THP_EXPECTED",
    "fatal_problems",
    "finding",
    "finding_line",
    "findings_of",
    "gpu_findings",
    "not_ok",
    "prescreen",
]


def finding(name, found, expected, ok, why):
    """One finding (module docstring); ``found`` and ``expected`` as text or None."""
    return {
        "name": name,
        "found": None if found is None else str(found),
        "expected": None if expected is None else str(expected),
        "ok": ok,
        "why": why,
    }


def _read(root, rel):
    """``(text, None)`` of ``ROOT/rel``, or ``(None, why)`` when it is missing or unreadable."""
    path = Path(root) / rel
    text = read_text(path)
    if text is not None:
        return text, None
    if not os.path.lexists(path):
        return None, f"{path} does not exist"
    return None, f"{path} cannot be read"


def _combine(parts):
    """The ``ok`` of several: False when one is False, else None when one is None, else True."""
    if any(p is False for p in parts):
        return False
    if any(p is None for p in parts):
        return None
    return True


def _cpus(root):
    """``[(n, folder)]`` of ``ROOT/sys/devices/system/cpu/cpuN``, by CPU number."""
    found = []
    for folder in glob.glob(str(Path(root) / "sys/devices/system/cpu/cpu[0-9]*")):
        tail = os.path.basename(folder)[3:]
        if tail.isdigit():
            found.append((int(tail), folder))
    return sorted(found)


def cpu_cstates(root="/"):
    """``cpu_cstates``: the deep cpuidle states enabled on some CPU (module docstring)."""
    name = "cpu_cstates"
    expected = "no C-state deeper than C1E enabled (POLL, C1, C1E only)"
    why = (
        "a deep C-state adds its exit latency to every wake-up of an idle core (data loaders, "
        "the launch path); NVIDIA and Mellanox tuning guides turn them off"
    )
    driver = read_text(Path(root) / "sys/devices/system/cpu/cpuidle/current_driver")
    cpus = _cpus(root)
    if not cpus:
        return finding(
            name, None, expected, None, f"no CPU under {Path(root) / 'sys/devices/system/cpu'}"
        )
    enabled: dict = {}
    unread: list = []
    states = 0
    for n, folder in cpus:
        for state in sorted(glob.glob(os.path.join(folder, "cpuidle/state[0-9]*"))):
            states += 1
            label = read_text(os.path.join(state, "name"))
            disable = read_text(os.path.join(state, "disable"))
            if label is None or disable not in ("0", "1"):
                unread.append(f"cpu{n}/{os.path.basename(state)}")
            elif disable == "0" and label.upper() not in SHALLOW_CSTATES:
                enabled.setdefault(label, set()).add(n)
    if not states:
        if driver == "none":
            return finding(name, "no cpuidle driver (idle by halt only)", expected, True, why)
        return finding(
            name,
            None,
            expected,
            None,
            f"no cpuidle state under {Path(root) / 'sys/devices/system/cpu'}/cpuN/cpuidle "
            f"(a VM, or cpuidle not built; driver {driver or 'unreadable'})",
        )
    if enabled:
        found = "enabled: " + ", ".join(
            f"{label} on {len(cpus_)} of {len(cpus)} CPUs"
            for label, cpus_ in sorted(enabled.items())
        )
        return finding(name, found, expected, False, why)
    if unread:
        more = f" and {len(unread) - 3} more" if len(unread) > 3 else ""
        return finding(
            name,
            None,
            expected,
            None,
            f"cannot read the name or disable file of {', '.join(unread[:3])}{more}",
        )
    return finding(name, f"no deep C-state enabled on {len(cpus)} CPUs", expected, True, why)


def cpu_governor(root="/"):
    """``cpu_governor``: the cpufreq governors of every CPU: ``performance`` expected."""
    name, expected = "cpu_governor", "performance"
    why = "another governor lowers the clock of idle and lightly loaded cores (kernel cpufreq docs)"
    cpus = _cpus(root)
    found: dict = {}
    unread: list = []
    for n, folder in cpus:
        value = read_text(os.path.join(folder, "cpufreq/scaling_governor"))
        if value:
            found.setdefault(value, []).append(n)
        else:
            unread.append(n)
    if not found:
        return finding(
            name,
            None,
            expected,
            None,
            f"no cpufreq/scaling_governor readable under {Path(root) / 'sys/devices/system/cpu'} "
            "(no cpufreq driver: most VMs)",
        )
    text = ", ".join(f"{g} ({len(c)} CPUs)" for g, c in sorted(found.items()))
    if set(found) != {expected}:
        return finding(name, text, expected, False, why)
    if unread:
        return finding(
            name, text, expected, None, f"{len(unread)} CPU(s) without a readable governor"
        )
    return finding(name, text, expected, True, why)


def numa_balancing(root="/"):
    """``numa_balancing``: ``/proc/sys/kernel/numa_balancing``: ``0`` expected."""
    name, expected = "numa_balancing", "0"
    value, failed = _read(root, "proc/sys/kernel/numa_balancing")
    if value is None:
        return finding(
            name,
            None,
            expected,
            None,
            f"{failed} (a kernel without CONFIG_NUMA_BALANCING has none)",
        )
    return finding(
        name,
        value,
        expected,
        value == expected,
        "automatic NUMA balancing unmaps pages to sample their use and migrates them: page "
        "faults and copies during the run (kernel docs, sysctl/kernel numa_balancing)",
    )


def transparent_hugepages(root="/"):
    """``transparent_hugepages``: the bracketed value of ``transparent_hugepage/enabled``."""
    name, expected = "transparent_hugepages", THP_EXPECTED
    raw, failed = _read(root, "sys/kernel/mm/transparent_hugepage/enabled")
    if raw is None:
        return finding(name, None, expected, None, failed)
    match = re.search(r"\[([^\]]+)\]", raw)
    if match is None:
        return finding(name, raw[:80], expected, None, f"no bracketed value in {raw[:80]!r}")
    value = match.group(1)
    return finding(
        name,
        value,
        expected,
        value == expected,
        "madvise gives huge pages to the regions that ask for them; always adds compaction "
        "and khugepaged stalls to every process, never denies them to those that ask "
        "(kernel docs, admin-guide/mm/transhuge)",
    )


def kernel(root="/"):
    """``kernel``: ``/proc/sys/kernel/osrelease`` (``uname -r``), recorded only."""
    value, failed = _read(root, "proc/sys/kernel/osrelease")
    if value is None:
        return finding("kernel", None, None, None, failed)
    return finding("kernel", value, None, True, "recorded only: no expectation")


def _cmdline_iommu(cmdline):
    """``(mode, words)`` that ``/proc/cmdline`` sets: mode ``"passthrough"``, ``"off"``,
    ``"on"`` or None, and the IOMMU words found."""
    words = [
        w
        for w in cmdline.split()
        if w.split("=", 1)[0] in ("iommu", "iommu.passthrough", "intel_iommu", "amd_iommu")
    ]
    mode = None
    for w in words:
        key, _, value = w.partition("=")
        values = value.split(",")
        if (key == "iommu" and "pt" in values) or (
            key == "iommu.passthrough" and value in ("1", "y")
        ):
            mode = "passthrough"
        elif key in ("iommu", "intel_iommu", "amd_iommu") and "off" in values:
            mode = mode or "off"
        elif key in ("intel_iommu", "amd_iommu") and "on" in values:
            mode = mode or "on"
    return mode, words


def iommu(root="/"):
    """``iommu``: off or in passthrough expected (module docstring)."""
    name = "iommu"
    expected = "off or passthrough (iommu=pt)"
    why = (
        "with the IOMMU translating, GPU peer-to-peer and GPUDirect RDMA traffic is refused or "
        "goes through the root complex (CUDA C++ Programming Guide, IOMMU on Linux; NVIDIA "
        "GPUDirect RDMA; NCCL troubleshooting, GPU Direct)"
    )
    cmdline, _ = _read(root, "proc/cmdline")
    mode, words = _cmdline_iommu(cmdline or "")
    sources = (
        [f"/proc/cmdline: {' '.join(words) or 'no iommu word'}"] if cmdline is not None else []
    )
    types: dict = {}
    for path in glob.glob(str(Path(root) / "sys/kernel/iommu_groups/*/type")):
        value = read_text(path)
        if value:
            types[value] = types.get(value, 0) + 1
    units_dir = Path(root) / "sys/class/iommu"
    units = sorted(os.listdir(units_dir)) if units_dir.is_dir() else None
    if units is not None:
        sources.append(f"{len(units)} IOMMU(s) in /sys/class/iommu")
    if types:
        sources.insert(
            0, "group types " + ", ".join(f"{t} ({n})" for t, n in sorted(types.items()))
        )
        # DMA and DMA-FQ translate; identity is passthrough; blocked and unmanaged (a device
        # given to VFIO) say nothing of the host's DMA (ABI sysfs-kernel-iommu_groups)
        translated = sorted(t for t in types if t in ("DMA", "DMA-FQ"))
        found = "translating" if translated else "passthrough"
        return finding(name, f"{found}: " + "; ".join(sources), expected, not translated, why)
    if units == [] and mode != "on":
        return finding(name, "off: " + "; ".join(sources), expected, True, why)
    if mode in ("passthrough", "off"):
        return finding(
            name,
            f"{mode} (from the command line only): " + "; ".join(sources),
            expected,
            True,
            why,
        )
    return finding(
        name,
        "; ".join(sources) or None,
        expected,
        None,
        f"no IOMMU group type readable under {Path(root) / 'sys/kernel/iommu_groups'} and no "
        "iommu=pt or =off on the command line: cannot tell",
    )


def acs_control(config):
    """The ACS Control register (16 bits) in ``config`` (a PCI device's configuration space,
    bytes), or None: no ACS capability, or the extended space (from 0x100) not in ``config``.
    Each extended capability header is 32 bits: ID (15:0), version (19:16), next offset
    (31:20) (PCI Express Base Specification, "PCI Express Extended Capabilities"); ACS
    Control is the 16 bits at the capability's offset + 6."""
    offset, seen = 0x100, set()
    while 0x100 <= offset <= len(config) - 8 and offset not in seen:
        seen.add(offset)
        header = int.from_bytes(config[offset : offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == ACS_CAP_ID:
            return int.from_bytes(config[offset + 6 : offset + 8], "little")
        offset = (header >> 20) & 0xFFC
    return None


def pci_acs(root="/"):
    """``pci_acs``: no PCI bridge redirecting peer-to-peer traffic (module docstring)."""
    name = "pci_acs"
    expected = "no PCI bridge with ACS P2P redirect (RR, CR) or egress control (EC) on"
    why = (
        "ACS redirect sends GPU peer-to-peer and GPUDirect RDMA traffic up to the root complex "
        "(NCCL troubleshooting, PCI Access Control Services: disable it on bare metal)"
    )
    redirecting, unreadable, bridges = [], [], 0
    for dev in sorted(glob.glob(str(Path(root) / "sys/bus/pci/devices/*"))):
        klass = read_text(Path(dev) / "class")
        if not klass or not klass.strip().lower().startswith("0x0604"):
            continue
        bridges += 1
        try:
            with open(Path(dev) / "config", "rb") as f:
                config = f.read(4096)
        except OSError:
            config = b""
        if len(config) <= 0x100:
            unreadable.append(os.path.basename(dev))
            continue
        control = acs_control(config)
        bits = [n for b, n in ACS_REDIRECT_BITS.items() if control is not None and control & b]
        if bits:
            redirecting.append(f"{os.path.basename(dev)} ({'+'.join(bits)})")
    if redirecting:
        found = (
            f"{len(redirecting)} of {bridges} bridge(s) redirect: "
            + ", ".join(redirecting[:8])
            + (" ..." if len(redirecting) > 8 else "")
        )
        return finding(name, found, expected, False, why)
    if not bridges:
        return finding(
            name, None, expected, None, "no PCI bridge under /sys/bus/pci/devices: nothing to judge"
        )
    if unreadable:
        return finding(
            name,
            f"{len(unreadable)} of {bridges} bridge(s) unreadable past 64 bytes",
            expected,
            None,
            "the PCI extended configuration space needs root: cannot tell",
        )
    return finding(name, f"none of {bridges} bridge(s) redirects", expected, True, why)


def ib_ports(root="/", min_rate_gbps=MIN_IB_RATE_GBPS):
    """``ib_port_state``, ``ib_port_rate`` and ``ib_port_phys_state`` (module docstring):
    three findings over every port of ``ROOT/sys/class/infiniband``. ``min_rate_gbps``:
    the slowest rate expected (Gb/s)."""
    ports = sorted(glob.glob(str(Path(root) / "sys/class/infiniband/*/ports/*")))
    checks = (
        ("ib_port_state", "state", "4: ACTIVE", lambda v: v == "4: ACTIVE"),
        (
            "ib_port_rate",
            "rate",
            f"{min_rate_gbps:g} Gb/sec or more (400 Gb/sec (4X NDR))",
            lambda v: _gbps(v) is not None and _gbps(v) >= min_rate_gbps,
        ),
        ("ib_port_phys_state", "phys_state", "5: LinkUp", lambda v: v.endswith("LinkUp")),
    )
    whys = {
        "ib_port_state": "a port not ACTIVE carries no traffic: NCCL uses the others or TCP",
        "ib_port_rate": "a port that trained at a lower rate caps every collective through it",
        "ib_port_phys_state": "the physical link is not up (cable, transceiver, switch port)",
    }
    out = []
    for name, leaf, expected, good in checks:
        if not ports:
            out.append(
                finding(
                    name,
                    None,
                    expected,
                    None,
                    f"no InfiniBand/RoCE port under {Path(root) / 'sys/class/infiniband'}: "
                    "nothing to judge",
                )
            )
            continue
        texts: list = []
        oks: list = []
        unread: list = []
        for port in ports:
            label = f"{Path(port).parent.parent.name}/{Path(port).name}"
            value = read_text(os.path.join(port, leaf))
            if value is None:
                unread.append(label)
                oks.append(None)
                texts.append(f"{label}: unreadable")
            else:
                oks.append(bool(good(value)))
                texts.append(f"{label}: {value}")
        why = whys[name]
        if unread:
            why += f"; cannot read {leaf} of {', '.join(unread)}"
        out.append(finding(name, "; ".join(texts), expected, _combine(oks), why))
    return out


def _gbps(rate):
    """The leading number of a sysfs ``rate`` (``"400 Gb/sec (4X NDR)"`` -> 400.0), or None."""
    match = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec", rate or "")
    return float(match.group(1)) if match else None


def _nv(nv, fn_name, *args):
    """``(value, None)`` of ``nv.<fn_name>(*args)``, or ``(None, why)``."""
    fn = getattr(nv, fn_name, None)
    if fn is None:
        return None, f"this pynvml has no {fn_name}"
    try:
        return fn(*args), None
    except Exception as exc:  # NVMLError_NotSupported, NoPermission, …
        return None, f"{fn_name}: {exc.__class__.__name__}: {exc}"


GPU_NAMES = ("gpu_persistence", "gpu_ecc", "gpu_power_limit", "gpu_app_clocks", "gpu_idle")
_GPU_EXPECTED = {
    "gpu_persistence": "enabled",
    "gpu_ecc": "enabled, current = pending",
    "gpu_power_limit": "the default power limit",
    "gpu_app_clocks": "the default application clocks (SM, memory)",
    "gpu_idle": "no process on the GPU",
}
#: NVML's lists of the processes holding a context on a GPU (compute, graphics).
_GPU_PROCESS_CALLS = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
)
_GPU_WHY = {
    "gpu_persistence": "without persistence mode the driver tears the GPU down between "
    "processes: each launch pays its initialisation (NVIDIA driver persistence docs)",
    "gpu_ecc": "ECC off, or a change pending until the next reset, measures another "
    "configuration than the one delivered (nvidia-smi -e)",
    "gpu_power_limit": "a lowered or raised power limit moves every throughput and power figure "
    "(nvidia-smi -pl)",
    "gpu_app_clocks": "application clocks other than the default move the clock the GPU "
    "runs at (nvidia-smi -ac)",
    "gpu_idle": "a process already on the GPU before the first launch shares its compute, "
    "memory and power with the tests: every figure of that GPU is lowered (nvidia-smi lists "
    "them)",
}


def _onoff(value):
    return "on" if value else "off"


def _one_gpu(nv, handle, own=frozenset()):
    """``{name: (found text or None, ok, why or None)}`` of one GPU (:data:`GPU_NAMES`);
    ``own``: the PIDs :func:`_gpu_processes` names without judging."""
    enabled = getattr(nv, "NVML_FEATURE_ENABLED", 1)
    out: dict[str, Any] = {}
    mode, why = _nv(nv, "nvmlDeviceGetPersistenceMode", handle)
    out["gpu_persistence"] = (
        (None, None, why)
        if mode is None
        else ("on" if mode == enabled else "off", mode == enabled, None)
    )
    ecc, why = _nv(nv, "nvmlDeviceGetEccMode", handle)
    if isinstance(ecc, (list, tuple)) and len(ecc) == 2:
        cur, pend = ecc
        text = f"current {_onoff(cur == enabled)}, pending {_onoff(pend == enabled)}"
        out["gpu_ecc"] = (text, cur == enabled and pend == enabled, None)
    else:
        out["gpu_ecc"] = (None, None, why or f"nvmlDeviceGetEccMode gave {ecc!r}")
    limit, why1 = _nv(nv, "nvmlDeviceGetPowerManagementLimit", handle)
    default, why2 = _nv(nv, "nvmlDeviceGetPowerManagementDefaultLimit", handle)
    if isinstance(limit, (int, float)) and isinstance(default, (int, float)):
        out["gpu_power_limit"] = (
            f"{limit / 1000:g} W (default {default / 1000:g} W)",
            limit == default,
            None,
        )
    else:
        out["gpu_power_limit"] = (None, None, why1 or why2 or "no power limit in mW")
    parts: list[str] = []
    oks: list[bool | None] = []
    whys: list[str] = []
    for label, clock in (
        ("SM", getattr(nv, "NVML_CLOCK_SM", 1)),
        ("memory", getattr(nv, "NVML_CLOCK_MEM", 2)),
    ):
        app, why1 = _nv(nv, "nvmlDeviceGetApplicationsClock", handle, clock)
        base, why2 = _nv(nv, "nvmlDeviceGetDefaultApplicationsClock", handle, clock)
        if isinstance(app, int) and isinstance(base, int):
            parts.append(f"{label} {app} MHz (default {base})")
            oks.append(app == base)
        else:
            parts.append(f"{label} unknown")
            oks.append(None)
            whys.append(why1 or why2 or f"no {label} clock in MHz")
    out["gpu_app_clocks"] = (", ".join(parts), _combine(oks), "; ".join(whys) or None)
    out["gpu_idle"] = _gpu_processes(nv, handle, own)
    return out


def _own_pids():
    """This process and its ancestors: the session's own caller (a script that runs
    ``milarun jobs``, such as ``benchmarks/gpu_check.py``) is not another user of a GPU."""
    import psutil

    try:
        me = psutil.Process()
        return {me.pid} | {p.pid for p in me.parents()}
    except psutil.Error:
        return {os.getpid(), os.getppid()}


def _gpu_processes(nv, handle, own=frozenset()):
    """``(found text, ok, why)`` of the processes on one GPU (:data:`_GPU_PROCESS_CALLS`):
    ``"none"`` and ok, or each PID with the memory it holds (MiB, where NVML gives it) and not
    ok. Without the compute list (a GPU without graphics may lack the other), no process found
    is unknown. The PIDs in ``own`` (:func:`_own_pids`) are named but not judged."""
    found: dict[int, float | None] = {}
    whys = []
    compute_read = False
    for call in _GPU_PROCESS_CALLS:
        procs, why = _nv(nv, call, handle)
        if why is not None or not isinstance(procs, (list, tuple)):
            whys.append(why or f"{call} gave {procs!r}"[:200])
            continue
        compute_read = compute_read or call == _GPU_PROCESS_CALLS[0]
        for p in procs:
            pid, used = getattr(p, "pid", None), getattr(p, "usedGpuMemory", None)
            if isinstance(pid, int) and not isinstance(pid, bool):
                held = used / 2**20 if isinstance(used, int) and used >= 0 else None
                found[pid] = held if found.get(pid) is None else found[pid]

    def listed(pids):
        shown = [
            f"pid {pid}" + ("" if found[pid] is None else f" ({found[pid]:.0f} MiB)")
            for pid in sorted(pids)[:8]
        ]
        return ", ".join(shown) + (f" and {len(pids) - 8} more" if len(pids) > 8 else "")

    mine = [pid for pid in found if pid in own]
    others = [pid for pid in found if pid not in own]
    caller = f" (besides this session's caller: {listed(mine)})" if mine else ""
    if others:
        return f"{len(others)} process(es): {listed(others)}{caller}", False, None
    if not compute_read:
        return None, None, "; ".join(whys)
    return "none" + caller, True, None


def gpu_findings(nvml=None):
    """The GPU findings (:data:`GPU_NAMES`) over the visible GPUs. ``nvml``: an
    initialised pynvml-like module (tests: a fake); None imports pynvml and initialises it
    (shut down afterwards). NVML absent or failing: every finding unknown, saying why."""
    owned = False
    nv = nvml
    if nv is None:
        try:
            import pynvml  # lazy: absent on hosts without NVIDIA GPUs

            pynvml.nvmlInit()
            nv, owned = pynvml, True
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, …
            why = f"NVML not available ({exc.__class__.__name__}: {exc})"
            return [finding(n, None, _GPU_EXPECTED[n], None, why) for n in GPU_NAMES]
    try:
        try:
            indices, handles = nvml_visible(nv)
        except Exception as exc:
            why = f"NVML cannot list the GPUs ({exc.__class__.__name__}: {exc})"
            return [finding(n, None, _GPU_EXPECTED[n], None, why) for n in GPU_NAMES]
        if not indices:
            why = "NVML sees no GPU this process may open"
            return [finding(n, None, _GPU_EXPECTED[n], None, why) for n in GPU_NAMES]
        per_gpu = []
        own = _own_pids()  # read once for every GPU
        for i in indices:
            try:
                per_gpu.append((i, _one_gpu(nv, handles[i], own)))
            except Exception as exc:  # a fake's or pynvml's bug: unknown, never a crash
                why = f"{exc.__class__.__name__}: {exc}"
                per_gpu.append((i, {n: (None, None, why) for n in GPU_NAMES}))
        out = []
        for name in GPU_NAMES:
            texts, oks, whys = [], [], []
            for i, got in per_gpu:
                text, ok, why = got[name]
                texts.append(f"GPU {i}: {text if text is not None else 'unknown'}")
                oks.append(ok)
                if why:
                    whys.append(f"GPU {i}: {why}")
            why = _GPU_WHY[name] + ("; unknown: " + "; ".join(whys) if whys else "")
            out.append(finding(name, "; ".join(texts), _GPU_EXPECTED[name], _combine(oks), why))
        return out
    finally:
        if owned:
            try:
                nv.nvmlShutdown()
            except Exception:
                pass


def prescreen(root="/", nvml=None):
    """Every finding of this node, one per name of :data:`NAMES`, in that order.

    Args:
        root: where ``sys/`` and ``proc/`` are read from (tests: a fake tree).
        nvml: an initialised pynvml-like module, or None (:func:`gpu_findings`).

    Never raises: a check that fails is an unknown finding naming the exception.
    """
    found = {}
    checks = [
        (("cpu_cstates",), lambda: [cpu_cstates(root)]),
        (("cpu_governor",), lambda: [cpu_governor(root)]),
        (("numa_balancing",), lambda: [numa_balancing(root)]),
        (("transparent_hugepages",), lambda: [transparent_hugepages(root)]),
        (("kernel",), lambda: [kernel(root)]),
        (GPU_NAMES, lambda: gpu_findings(nvml)),
        (("iommu",), lambda: [iommu(root)]),
        (("pci_acs",), lambda: [pci_acs(root)]),
        (("ib_port_state", "ib_port_rate", "ib_port_phys_state"), lambda: ib_ports(root)),
    ]
    for names, check in checks:
        try:
            for f in check():
                found[f["name"]] = f
        except Exception as exc:  # a bug, or a file system that raises: unknown, said
            for n in names:
                found[n] = finding(n, None, None, None, f"{exc.__class__.__name__}: {exc}")
    return [found.get(n) or finding(n, None, None, None, "not checked") for n in NAMES]


def not_ok(findings):
    """The findings that failed or are unknown (``ok`` not True), in order."""
    return [f for f in findings or [] if isinstance(f, dict) and f.get("ok") is not True]


def findings_of(ident):
    """The prescreen findings a node's identity holds (``config.node.prescreen``: a list of
    finding objects), or None when it holds none (an older identity, a node that did not
    answer)."""
    config = ident.get("config") if isinstance(ident, dict) else None
    node = config.get("node") if isinstance(config, dict) else None
    found = node.get("prescreen") if isinstance(node, dict) else None
    if not isinstance(found, list):
        return None
    return [f for f in found if isinstance(f, dict) and isinstance(f.get("name"), str)]


def fatal_problems(by_node, fatal):
    """What fails the findings named in ``fatal`` (a list of :data:`NAMES`) over the nodes
    ``by_node`` (``{node: findings list, or None when the node recorded none}``): one line
    per node and name whose finding is missing or not ok (unknown included), [] when
    every one is ok."""
    out = []
    for node, findings in sorted(by_node.items(), key=lambda kv: str(kv[0])):
        named = {f["name"]: f for f in findings or [] if isinstance(f, dict) and "name" in f}
        for name in fatal:
            f = named.get(name)
            if findings is None:
                out.append(f"{node}: {name} not recorded (no prescreen from this node)")
            elif f is None:
                out.append(f"{node}: {name} not recorded")
            elif f.get("ok") is not True:
                out.append(finding_line(node, f))
    return out


def finding_line(node, f):
    """One line of text: ``NODE: NAME ok|FAILED|unknown: found …, expected …; why``."""
    state = {True: "ok", False: "FAILED"}.get(f.get("ok"), "unknown")
    found = f.get("found")
    expected = f.get("expected")
    text = f"{node}: {f.get('name')} {state}: found {found if found is not None else 'nothing'}"
    if expected is not None:
        text += f", expected {expected}"
    if f.get("why"):
        text += f" ({f['why']})"
    return text


def main():
    """Print this node's prescreen as one JSON object on stdout; exit status 0."""
    try:
        host = socket.gethostname()
    except OSError:
        host = None
    out = {
        "format": PRESCREEN_FORMAT,
        "version": PRESCREEN_VERSION,
        "hostname": host,
        "findings": prescreen(),
    }
    json.dump(out, sys.stdout, sort_keys=True, allow_nan=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
