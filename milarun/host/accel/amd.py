"""AMD GPUs through the AMD SMI Python library (``amdsmi``, shipped with ROCm). No torch.

``amdsmi`` is not on PyPI in a form that matches a host's driver: it comes
with the ROCm install (``/opt/rocm/share/amd_smi``, ``pip install .`` there);
docs/vendors.md says how. Without it, a host whose ``/dev/kfd`` exists stops
``milarun jobs`` with a line that says so (:mod:`milarun.host.accel.probe`).

**Visibility.** ROCm has three variables: ``ROCR_VISIBLE_DEVICES`` filters at
the ROCr runtime, then ``HIP_VISIBLE_DEVICES`` (or ``CUDA_VISIBLE_DEVICES``,
which HIP also reads) indexes into what is left, so giving two of them the
value ``3`` hides every device. A child gets ``ROCR_VISIBLE_DEVICES`` with
the devices' indices, and the other two set to ``0..k-1``, which is exactly
what ROCr leaves visible: an inherited value can never filter again. Indices are
amdsmi's processor order, which, like ROCr's, follows the KFD topology (PCI
order); the child checks the PCI bus id of the device it got against the one
it was given (``MILARUN_PCI_BUS_ID``, reason ``wrong-device``).

Units: memory from bytes to MiB, power in W (``socket_power``, else
``current_socket_power``, else ``average_socket_power``), temperature in °C
(edge sensor, else hotspot), energy from ``energy_accumulator ×
counter_resolution`` (µJ) to J.

**Missing values.** amdsmi answers ``"N/A"`` for a counter a GPU lacks, and
recent ROCm releases fill an unsupported struct member with its type's maximum
(``0xFFFF``, ``0xFFFFFFFF`` = 4294967295): a power reading of 4294967295 W is
"not supported", not a reading. Load (%), temperature (°C) and power (W) of
0xFFFF or more are therefore left out (:func:`_sane`), like ``"N/A"``.
"""

import os
from pathlib import Path

from ..kernel import read_text
from .base import Accelerator, Backend, Reading, reading, unreadable
from .sysfs import local_cpus, normalize_bdf, numa_node


def _try(call, *args):
    try:
        return call(*args)
    except Exception:
        return None


def _num(value):
    """``value`` when it is a number, else None (amdsmi answers ``"N/A"`` for a counter
    the GPU lacks, which would make a record fail its schema)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


#: The smallest "unsupported" sentinel amdsmi fills a field with (UINT16_MAX); no load (%),
#: temperature (°C) or power (W) of a real GPU reaches it.
SENTINEL = 0xFFFF

#: ``amdsmi_get_power_info`` keys of the socket's power (W), best first: ``socket_power``
#: is the one recent amdsmi fills on every GPU; the others are older names, or kept at
#: 0 / UINT32_MAX where unsupported.
POWER_KEYS = ("socket_power", "current_socket_power", "average_socket_power")


def _sane(value):
    """``value`` when it is a number in ``[0, SENTINEL)``, else None: a load in %, a
    temperature in °C or a power in W of 0xFFFF or more is amdsmi's "not supported"
    (UINT16_MAX, UINT32_MAX, UINT64_MAX), never a reading."""
    value = _num(value)
    return value if value is not None and 0 <= value < SENTINEL else None


#: NVML clock-event reason bits (``milarun.measure.acceptance.CAPPING_REASONS``) that
#: AMD's throttle causes map to: power cap, hardware slowdown, thermal, hardware thermal.
_POWER, _SLOWDOWN, _THERMAL, _HW_THERMAL = 0x4, 0x8, 0x20, 0x40

#: ``amdsmi_get_violation_status`` active flags (MI300 and newer, gpu_metrics 1.6+) and
#: the NVML bit each maps to: package power tracking (PVIOL) is a power cap, socket and
#: HBM thermal (TVIOL) thermal slowdowns, PROCHOT and voltage-regulator thermal the
#: hardware's. Source: AMD SMI docs, "GPU violations" and ``amdsmi_violation_status_t``.
VIOLATION_BITS = {
    "active_ppt_pwr": _POWER,
    "active_socket_thrm": _THERMAL,
    "active_hbm_thrm": _THERMAL,
    "active_prochot_thrm": _HW_THERMAL,
    "active_vr_thrm": _HW_THERMAL,
}

#: ``indep_throttle_status`` of ``amdsmi_get_gpu_metrics_info`` (MI100/MI200, Radeon): the
#: kernel's independent throttler bits (amdgpu ``SMU_THROTTLER_*``): 0-15 power (PPT,
#: SPL, FPPT...), 16-31 current (TDC, EDC, APCC), 32-55 temperature (TEMP_*, VRHOT),
#: 56-63 other (PROCHOT at 56-57). As ranges: ``(first bit, last bit, NVML bit)``.
THROTTLER_RANGES = ((0, 15, _POWER), (16, 31, _SLOWDOWN), (32, 55, _THERMAL), (56, 57, _HW_THERMAL))


def amd_reasons(violation, metrics):
    """NVML's clock-event bit mask for AMD's throttle state, or None when unknown.

    Args:
        violation: ``amdsmi_get_violation_status``'s dict, or None. Its ``active_*``
            flags are 1 while a cause throttles, 0 when not; another value is
            "not supported" (UINT8_MAX).
        metrics: ``amdsmi_get_gpu_metrics_info``'s dict, or None (the older GPUs' path):
            ``indep_throttle_status`` (a 64-bit mask, UINT64_MAX when unsupported).

    Returns:
        an int of :data:`VIOLATION_BITS` / :data:`THROTTLER_RANGES` bits (0: known and
        not throttled), or None when neither source is supported.
    """
    if violation:
        flags = {k: _num(violation.get(k)) for k in VIOLATION_BITS}
        known = {k: v for k, v in flags.items() if v in (0, 1)}
        if known:
            return sum({VIOLATION_BITS[k] for k, v in known.items() if v == 1})
    status = _num((metrics or {}).get("indep_throttle_status"))
    if status is None or not isinstance(status, int) or not 0 <= status < 2**64 - 1:
        return None
    mask = 0
    for first, last, bit in THROTTLER_RANGES:
        if status & (((1 << (last - first + 1)) - 1) << first):
            mask |= bit
    return mask


def _enum(smi, enum, *names):
    kind = getattr(smi, enum, None)
    for n in names:
        if kind is not None and hasattr(kind, n):
            return getattr(kind, n)
    return None


class AMDBackend(Backend):
    """AMD Instinct and Radeon GPUs (module docstring)."""

    name = "amd"
    vendor = "AMD"
    torch_device = "cuda"  # PyTorch's ROCm build keeps the cuda device type
    visibility_var = "ROCR_VISIBLE_DEVICES"

    def __init__(self, amdsmi=None, root="/"):
        self._smi = amdsmi
        self.root = root
        self.reason = None

    def _init(self):
        if self._smi is None:
            import amdsmi

            flags = getattr(getattr(amdsmi, "AmdSmiInitFlags", None), "INIT_AMD_GPUS", None)
            amdsmi.amdsmi_init(*(() if flags is None else (flags,)))
            self._smi = amdsmi
        return self._smi

    def available(self):
        try:
            self._init()
        except ImportError as exc:
            return False, (
                f"the amdsmi Python library is not installed ({exc}); it ships "
                "with ROCm (docs/vendors.md)"
            )
        except PermissionError as exc:
            return False, f"amdsmi: permission denied ({exc}): is the user in the render group?"
        except Exception as exc:
            return False, (
                f"amdsmi cannot start ({exc.__class__.__name__}: {exc}): "
                "is the amdgpu driver loaded?"
            )
        return True, None

    def discover(self):
        ok, self.reason = self.available()
        if not ok:
            return []
        smi = self._smi
        try:
            handles = smi.amdsmi_get_processor_handles()
        except Exception as exc:
            self.reason = f"amdsmi: {exc.__class__.__name__}: {exc}"
            return []
        vram = _enum(smi, "AmdSmiMemoryType", "VRAM")
        out = []
        for i, h in enumerate(handles):
            info = _try(smi.amdsmi_get_gpu_asic_info, h) or {}
            bdf = normalize_bdf(_try(smi.amdsmi_get_gpu_device_bdf, h))
            total = _try(smi.amdsmi_get_gpu_memory_total, h, vram)
            node = _try(
                getattr(smi, "amdsmi_topo_get_numa_node_number", None) or (lambda h: None), h
            )
            if not isinstance(node, int) or node < 0:
                node = numa_node(bdf, self.root)
            out.append(
                Accelerator(
                    index=i,
                    visible_id=str(i),
                    name=info.get("market_name") or "AMD GPU",
                    uuid=_try(smi.amdsmi_get_gpu_device_uuid, h),
                    pci_bus_id=bdf,
                    memory_mib=None if not isinstance(total, int) else total / 2**20,
                    cpus=local_cpus(bdf, self.root),
                    numa_node=node,
                    handle=h,
                )
            )
        visible = _honour_visible(out)
        if out and not visible:  # the user's choice, not a missing driver: say so
            self.reason = (
                f"ROCR_VISIBLE_DEVICES={os.environ.get('ROCR_VISIBLE_DEVICES')!r} "
                f"hides every GPU ({len(out)} on the host)"
            )
        return visible

    def child_env(self, visible):
        # ROCr filters; HIP indexes into what is left, so it gets 0..k-1 (no second filter)
        after = ",".join(str(i) for i in range(len(visible)))
        return {
            "ROCR_VISIBLE_DEVICES": ",".join(visible),
            "HIP_VISIBLE_DEVICES": after,
            "CUDA_VISIBLE_DEVICES": after,
        }

    def versions(self):
        driver = None
        try:
            smi = self._init()
            handles = smi.amdsmi_get_processor_handles()
            info = _try(smi.amdsmi_get_gpu_driver_info, handles[0]) if handles else None
            driver = (info or {}).get("driver_version")
        except Exception:
            pass
        # read_text: None when missing, unreadable or not UTF-8 (this never raises)
        rocm = read_text(Path(self.root) / "opt/rocm/.info/version") or None
        return {"driver": driver, "runtime": rocm, "runtime_name": "ROCm"}

    def read(self, device):
        """A :class:`Reading`: load in % (``gfx_activity``), memory used in MiB,
        temperature in °C, power in W (:data:`POWER_KEYS`, the first in ``(0, 0xFFFF)``)
        and energy in J. A counter amdsmi does not support (an error, ``"N/A"``, or a
        value of 0xFFFF or more) is left out. Raises amdsmi's error when it answers none
        of them."""
        smi = self._init()
        h = device.handle
        try:
            activity = smi.amdsmi_get_gpu_activity(h)
            failed = None
        except Exception as exc:  # e.g. NOT_SUPPORTED on a partition: read the rest
            activity, failed = None, exc
        used = _try(smi.amdsmi_get_gpu_memory_usage, h, _enum(smi, "AmdSmiMemoryType", "VRAM"))
        power = _try(smi.amdsmi_get_power_info, h) or {}
        # W; 0 and UINT32_MAX mean "not supported" (module docstring)
        watts = next((power[k] for k in POWER_KEYS if (_sane(power.get(k)) or 0) > 0), None)
        temp = None
        metric = _enum(smi, "AmdSmiTemperatureMetric", "CURRENT")
        for sensor in ("EDGE", "HOTSPOT"):
            kind = _enum(smi, "AmdSmiTemperatureType", sensor)
            temp = _try(smi.amdsmi_get_temp_metric, h, kind, metric) if kind is not None else None
            temp = _sane(temp)
            if temp is not None:
                break
        count = _try(smi.amdsmi_get_energy_count, h) or {}
        acc = count.get("energy_accumulator", count.get("power"))
        res = count.get("counter_resolution")
        energy = (
            acc * res / 1e6
            if isinstance(acc, (int, float)) and isinstance(res, (int, float))
            else None
        )
        reading = Reading(
            load=_sane((activity or {}).get("gfx_activity")),
            memory_mib=None if not isinstance(used, int) else used / 2**20,
            temperature=temp,
            power=watts,
            energy=energy,
        )
        if failed is not None and all(v is None for v in vars(reading).values()):
            raise failed
        return reading

    def clocks(self, device):
        """The graphics clock (``amdsmi_get_clock_info(GFX)["clk"]``, MHz; the SM clock's
        counterpart) and the throttle reasons as NVML's bit mask (:func:`amd_reasons`), or
        ``"reasons": None`` where amdsmi reports none. None when the clock cannot be read
        (never raises)."""
        try:
            smi = self._init()
        except Exception:
            return None
        kind = _enum(smi, "AmdSmiClkType", "GFX", "SYS")
        info = (
            _try(smi.amdsmi_get_clock_info, device.handle, kind)
            if kind is not None and hasattr(smi, "amdsmi_get_clock_info")
            else None
        )
        clock = _sane((info or {}).get("clk")) if isinstance(info, dict) else None
        if clock is None:
            return None
        violation = (
            _try(smi.amdsmi_get_violation_status, device.handle)
            if hasattr(smi, "amdsmi_get_violation_status")
            else None
        )
        metrics = None
        if not isinstance(violation, dict) or amd_reasons(violation, None) is None:
            metrics = (
                _try(smi.amdsmi_get_gpu_metrics_info, device.handle)
                if hasattr(smi, "amdsmi_get_gpu_metrics_info")
                else None
            )
        return {
            "sm_clock_mhz": clock,
            "reasons": amd_reasons(
                violation if isinstance(violation, dict) else None,
                metrics if isinstance(metrics, dict) else None,
            ),
        }

    def identity(self, device):
        """``{"name", "uuid", "serial", "asic_serial", "pci_bus_id"}`` from amdsmi:
        ``amdsmi_get_gpu_device_uuid``, ``amdsmi_get_gpu_board_info``'s
        ``product_serial`` (the board's serial), ``amdsmi_get_gpu_asic_info``'s
        ``asic_serial`` and ``amdsmi_get_gpu_device_bdf``, each read on its own (one
        that raises is ``"unreadable (why)"``; ``"N/A"`` or a call this amdsmi lacks is
        None). Never raises."""
        try:
            smi = self._init()
        except Exception as exc:
            why = unreadable(f"amdsmi: {exc.__class__.__name__}: {exc}")
            return {
                "name": device.name,
                "uuid": device.uuid,
                "serial": why,
                "pci_bus_id": device.pci_bus_id,
            }
        h = device.handle

        def get(name, convert=None):
            fn = getattr(smi, name, None)
            return None if fn is None else reading(fn, h, convert=convert)

        def field(key):
            def pick(info):
                value = info.get(key) if isinstance(info, dict) else None
                return None if value in (None, "", "N/A") else str(value)

            return pick

        return {
            "name": device.name,
            "uuid": get("amdsmi_get_gpu_device_uuid", convert=str),
            "serial": get("amdsmi_get_gpu_board_info", convert=field("product_serial")),
            "asic_serial": get("amdsmi_get_gpu_asic_info", convert=field("asic_serial")),
            "pci_bus_id": get("amdsmi_get_gpu_device_bdf", convert=normalize_bdf),
        }

    def facts(self, device):
        smi = self._smi
        power = _try(smi.amdsmi_get_power_info, device.handle) or {} if smi else {}
        cap = _num(power.get("power_limit"))  # W, or µW on older amdsmi
        if cap is not None and cap in (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF):
            cap = None  # "not supported" (module docstring)
        return {"power_limit_w": cap / 1e6 if cap is not None and cap > 1e4 else cap}


def _honour_visible(found, environ=None):
    """The devices a ``ROCR_VISIBLE_DEVICES`` already set (by Slurm, or a parent launcher)
    leaves, in its order; indices beyond the host's end the list, as ROCr does."""
    import os

    spec = (environ or os.environ).get("ROCR_VISIBLE_DEVICES")
    if spec is None:
        return found
    out = []
    for tok in (t.strip() for t in spec.split(",")):
        match = [d for d in found if tok == str(d.index) or (d.uuid and tok == d.uuid)]
        if not match or match[0] in out:
            break
        out.append(match[0])
    return out
