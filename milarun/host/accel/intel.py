"""Intel data-centre and discrete GPUs (torch's ``xpu`` device), from sysfs. No torch.

Source, and why: Level Zero's own tools (``xpu-smi``, ``sysman``) are separate
installs with versions tied to the driver, while the kernel drivers (``i915``
and ``xe``) expose everything milarun needs in sysfs: the DRM cards and their
PCI ids, device memory, and a hwmon node with power and an energy counter.
So discovery and telemetry read sysfs only (no library, no subprocess), with
the root folder injectable for tests.

* **Devices**: ``/sys/class/drm/card*/device``, PCI vendor 0x8086, a GPU class,
  bound to ``i915`` or ``xe``, numbered in PCI bus order, which is Level
  Zero's default order. The integrated GPU (``0000:00:02.0``) is never a
  device.
* **Visibility**: ``ZE_AFFINITY_MASK`` (``"0"``, ``"0,1"``; a tile would be
  ``"0.1"``) with ``ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE``. The devices found
  here are cards (PCI functions), and under the ``FLAT`` default of recent
  drivers the mask's indices would count tiles, so on a two-tile card ``"1"``
  would be the first card's second tile. ``COMPOSITE`` makes the indices
  cards' and gives a student a whole card (docs/vendors.md).
* **Memory**: ``lmem_total_bytes`` (i915), else the sum of
  ``tile*/vram*/size`` (xe), else unknown.
* **Telemetry**: hwmon ``energy1_input`` (µJ → J), ``power1_average`` or
  ``power1_input`` (µW → W), ``temp1_input`` (m°C → °C). No utilisation.
  Where i915 exposes the energy counter but no power file, the power is the
  counter's difference over the time since the previous reading (W = ΔJ/Δs).
* **Clocks** (the burn-in's): the GT's actual frequency and its throttle reasons
  (:data:`THROTTLE_BITS`), xe's ``tile*/gt*/freq0`` or i915's ``gt/gt0``.
* **Versions**: the kernel driver's (``/sys/module/<driver>/version``, else
  the kernel release) and the Level Zero loader's, from its library's file
  name (``libze_loader.so.1.x.y``).
"""

import glob
import os
import time
from pathlib import Path

from ..kernel import read_text as _read
from .base import Accelerator, Backend, Reading
from .sysfs import GPU_CLASSES, driver_of, integrated_intel, local_cpus, numa_node, pci_ids

DRIVERS = ("i915", "xe")
LIB_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "usr/local/lib",
    "opt/intel/oneapi/lib",
)


def _int(path):
    try:
        return int(_read(path))
    except (TypeError, ValueError):
        return None


def _memory_bytes(dev):
    total = _int(dev / "lmem_total_bytes") or _int(dev.parent / "lmem_total_bytes")
    if total:
        return total
    sizes = [_int(p) for p in glob.glob(str(dev / "tile*" / "vram*" / "size"))]
    return sum(s for s in sizes if s) or None


def _version_key(path):
    """Sort key of ``libze_loader.so.1.17.6``: its numbers, as ints (text parts last)."""
    parts = os.path.basename(path).split(".so.", 1)[-1].split(".")
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts]


#: Throttle reasons of the GT frequency (i915 ``gt/gt0/throttle_reason_<name>``, xe
#: ``tile*/gt*/freq0/throttle/reason_<name>``, each 0 or 1) and the NVML clock-event
#: bit each maps to (``milarun.measure.acceptance.CAPPING_REASONS``): PL1/PL2/PL4 power
#: limits are a power cap (0x4), thermal and RATL (running-average thermal limit) a
#: thermal slowdown (0x20), PROCHOT and the voltage regulator's thermal alert the
#: hardware's (0x40), the voltage regulator's current limit (TDC) a slowdown (0x8).
#: Source: the kernel's ``xe_gt_throttle.c`` and i915's ``intel_gt_sysfs_pm.c``.
THROTTLE_BITS = {
    "pl1": 0x4,
    "pl2": 0x4,
    "pl4": 0x4,
    "thermal": 0x20,
    "ratl": 0x20,
    "prochot": 0x40,
    "vr_thermalert": 0x40,
    "vr_tdc": 0x8,
}


def _gt_dirs(dev):
    """``[(actual-frequency file, {reason: file})]`` of the card's first GT: xe's
    ``device/tile*/gt*/freq0``, else i915's ``card/gt/gt0``, else i915's older
    ``card/gt_act_freq_mhz`` (no reasons)."""
    for found in (
        sorted(glob.glob(str(dev / "tile*" / "gt*" / "freq0")))[:1]
        + sorted(glob.glob(str(dev / "gt*" / "freq0")))[:1]
    ):
        freq = Path(found)
        return freq / "act_freq", {k: freq / "throttle" / f"reason_{k}" for k in THROTTLE_BITS}
    gt = dev.parent / "gt" / "gt0"
    if gt.is_dir():
        return gt / "rps_act_freq_mhz", {k: gt / f"throttle_reason_{k}" for k in THROTTLE_BITS}
    return dev.parent / "gt_act_freq_mhz", {}


def _hwmon(dev):
    found = sorted(glob.glob(str(dev / "hwmon" / "hwmon*")))
    return Path(found[0]) if found else None


class IntelBackend(Backend):
    """Intel GPUs for torch's ``xpu`` device (module docstring)."""

    name = "intel"
    vendor = "Intel"
    torch_device = "xpu"
    visibility_var = "ZE_AFFINITY_MASK"

    def __init__(self, root="/", clock=time.monotonic):
        self.root = root
        self.reason = None
        self._clock = clock
        self._last_energy = {}  # hwmon path -> (t in s, energy in J) of the previous read

    def _cards(self):
        out: dict = {}
        for card in glob.glob(str(Path(self.root) / "sys/class/drm/card[0-9]*")):
            if "-" in os.path.basename(card):  # connectors: card0-DP-1
                continue
            dev = Path(card) / "device"
            bdf = os.path.basename(os.path.realpath(dev))
            vendor, _, cls = pci_ids(dev)
            if vendor != 0x8086 or cls not in GPU_CLASSES or driver_of(dev) not in DRIVERS:
                continue
            if integrated_intel({"vendor": "Intel", "bdf": bdf}):
                continue
            out.setdefault(bdf, dev)
        return [out[b] for b in sorted(out)]

    def available(self):
        if not (Path(self.root) / "sys/class/drm").is_dir():
            return False, "no /sys/class/drm: no GPU driver is loaded"
        return True, None

    def discover(self):
        ok, self.reason = self.available()
        if not ok:
            return []
        out = []
        for i, dev in enumerate(self._cards()):
            bdf = os.path.basename(os.path.realpath(dev))
            _, device_id, _ = pci_ids(dev)
            memory = _memory_bytes(dev)
            out.append(
                Accelerator(
                    index=i,
                    visible_id=str(i),
                    name=f"Intel GPU {device_id:#06x}" if device_id is not None else "Intel GPU",
                    pci_bus_id=bdf,
                    memory_mib=None if memory is None else memory / 2**20,
                    cpus=local_cpus(bdf, self.root),
                    numa_node=numa_node(bdf, self.root),
                    handle=dev,
                )
            )
        if not out:
            self.reason = "no discrete Intel GPU bound to i915 or xe"
        spec = os.environ.get("ZE_AFFINITY_MASK", "").strip()
        if spec:  # a parent launcher's mask: its devices, in its order (empty: all)
            keep = []
            for tok in (t.strip() for t in spec.split(",")):
                match = [d for d in out if tok.split(".")[0] == str(d.index)]
                if not match or match[0] in keep:
                    break
                keep.append(match[0])
            if out and not keep:  # the user's choice, not a missing driver: say so
                self.reason = f"ZE_AFFINITY_MASK={spec!r} hides every GPU ({len(out)} on the host)"
            out = keep
        return out

    def child_env(self, visible):
        # the mask's indices are cards only under COMPOSITE (module docstring)
        return {"ZE_AFFINITY_MASK": ",".join(visible), "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}

    def versions(self):
        cards = self._cards()
        drv = driver_of(cards[0]) if cards else None
        driver = (_read(Path(self.root) / "sys/module" / drv / "version") if drv else None) or (
            _read(Path(self.root) / "proc/sys/kernel/osrelease") if drv else None
        )
        runtime = None
        for d in LIB_DIRS:
            libs = sorted(
                glob.glob(str(Path(self.root) / d / "libze_loader.so.*.*")), key=_version_key
            )  # 1.10.0 after 1.9.0
            if libs:
                runtime = os.path.basename(libs[-1]).split(".so.", 1)[1]
                break
        return {"driver": driver, "runtime": runtime, "runtime_name": "Level Zero"}

    def clocks(self, device):
        """The GT's actual frequency (MHz) and its throttle reasons as NVML's bit mask
        (:data:`THROTTLE_BITS`; None where the driver exposes no reason file), from
        sysfs; None when the frequency cannot be read (never raises)."""
        try:
            freq, reasons = _gt_dirs(device.handle)
            clock = _int(freq)
            if clock is None or clock <= 0:
                return None
            flags = {k: _int(path) for k, path in reasons.items()}
            known = {k: v for k, v in flags.items() if v in (0, 1)}
            mask = sum({THROTTLE_BITS[k] for k, v in known.items() if v}) if known else None
        except OSError:
            return None
        return {"sm_clock_mhz": clock, "reasons": mask}

    def identity(self, device):
        """``{"name", "uuid", "serial", "pci_bus_id"}``: the name (with the PCI device id)
        and bus id from sysfs; i915 and xe expose no serial number nor UUID in sysfs,
        so both are None (the card is known by its bus id). Never raises."""
        return {"name": device.name, "uuid": None, "serial": None, "pci_bus_id": device.pci_bus_id}

    def read(self, device):
        mon = _hwmon(device.handle)
        if mon is None:
            raise RuntimeError("no hwmon node for this GPU")
        energy = _int(mon / "energy1_input")
        power = _int(mon / "power1_average") or _int(mon / "power1_input")
        temp = _int(mon / "temp1_input")
        joules = None if energy is None else energy / 1e6
        watts = None if power is None else power / 1e6
        if joules is not None:
            now = self._clock()
            before = self._last_energy.get(str(mon))
            self._last_energy[str(mon)] = (now, joules)
            if (
                watts is None and before is not None and now > before[0] and joules >= before[1]
            ):  # a counter that wrapped or reset gives nothing
                watts = (joules - before[1]) / (now - before[0])
        return Reading(
            energy=joules, power=watts, temperature=None if temp is None else temp / 1000.0
        )
