"""PCI facts from sysfs, for any vendor's device. No torch.

Every function takes ``root`` (default ``/``), so tests point it at a fake tree
under a temporary folder.
"""

import os
from pathlib import Path

from ..isolation import parse_cpus
from ..kernel import read_text

#: PCI class codes (the top 16 bits of ``class``) of GPUs and accelerators:
#: VGA-compatible, 3D controller, other display controller, processing accelerator.
GPU_CLASSES = (0x0300, 0x0302, 0x0380, 0x1200)
#: PCI vendor ids of the GPU vendors milarun has a backend for.
VENDORS = {0x10DE: "NVIDIA", 0x1002: "AMD", 0x8086: "Intel"}


def _hex(text):
    try:
        return int(text, 16)
    except (TypeError, ValueError):
        return None


def normalize_bdf(bdf):
    """``"00000000:3B:00.0"`` (NVML) or ``"3b:00.0"`` → ``"0000:3b:00.0"``; None stays None."""
    if not bdf:
        return None
    bdf = bdf.strip().lower()
    if bdf.count(":") == 1:
        return f"0000:{bdf}"
    domain, _, rest = bdf.partition(":")
    return f"{int(domain, 16):04x}:{rest}" if _hex(domain) is not None else bdf


def pci_device(bdf, root="/"):
    """``Path`` of a PCI device's sysfs folder (may not exist)."""
    return Path(root) / "sys/bus/pci/devices" / normalize_bdf(bdf)


def local_cpus(bdf, root="/"):
    """CPU ids local to the PCI device (``local_cpulist``), ``[]`` when unknown."""
    text = read_text(pci_device(bdf, root) / "local_cpulist") if bdf else None
    try:
        return parse_cpus(text) if text else []
    except ValueError:
        return []


def numa_node(bdf, root="/"):
    """NUMA node of the PCI device, None when unknown (sysfs says -1 without NUMA)."""
    text = read_text(pci_device(bdf, root) / "numa_node") if bdf else None
    try:
        node = int(text or "")
    except (TypeError, ValueError):
        return None
    return node if node >= 0 else None


def pci_ids(path):
    """``(vendor, device, class >> 8)`` ints of a sysfs PCI device folder; None where unreadable."""
    path = Path(path)
    cls = _hex(read_text(path / "class"))
    return (
        _hex(read_text(path / "vendor")),
        _hex(read_text(path / "device")),
        None if cls is None else cls >> 8,
    )


def driver_of(path):
    """Name of the kernel driver bound to a sysfs device folder, None if none."""
    try:
        return os.path.basename(os.readlink(Path(path) / "driver"))
    except OSError:
        return None


def gpu_functions(root="/"):
    """Every PCI function of :data:`GPU_CLASSES` from a vendor of :data:`VENDORS`, as
    ``[{"bdf", "vendor", "device", "class", "driver"}]`` sorted by bus id."""
    base = Path(root) / "sys/bus/pci/devices"
    out: list = []
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return out
    for path in entries:
        vendor, device, cls = pci_ids(path)
        if vendor in VENDORS and cls in GPU_CLASSES:
            out.append(
                {
                    "bdf": path.name,
                    "vendor": VENDORS[vendor],
                    "device": device,
                    "class": cls,
                    "driver": driver_of(path),
                }
            )
    return out


def integrated_intel(function):
    """An Intel GPU on the CPU die: its fixed address ``0000:00:02.0`` (every Intel
    integrated GPU since 2010 sits there), or one of its SR-IOV virtual functions
    (``00:02.1``–``00:02.7``); never a test device."""
    return function["vendor"] == "Intel" and function["bdf"].startswith("0000:00:02.")
