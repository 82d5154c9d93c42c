"""Which accelerators a host has, whatever its drivers and libraries: the "never silent" rule.

milarun falls back to CPU slots only when a host has no accelerator, or when
``--cpu-slots`` asks for it. A host with GPUs that no backend can see (driver
not loaded, ``nvidia-ml-py`` or ``amdsmi`` missing, no permission on
``/dev/kfd``) would otherwise run every test on its CPUs and score as a CPU.

What counts as an accelerator (all paths under ``root``, for tests):

* ``/dev/nvidia0``, ``/dev/nvidia1``, … (the NVIDIA driver's device nodes);
* ``/dev/kfd`` (the AMD ROCm compute driver);
* PCI functions in sysfs of class VGA / 3D / display / processing
  accelerator from NVIDIA, AMD or Intel (:func:`milarun.host.accel.sysfs.gpu_functions`),
  which also finds GPUs whose driver is not loaded at all. Intel's
  integrated GPU (``0000:00:02.0`` and its virtual functions) never counts,
  nor does an Intel NPU (class processing accelerator, ``intel_vpu``), nor a
  BMC's VGA (ASPEED, Matrox: other vendors). An AMD VGA function without
  ``/dev/kfd`` counts only when it is bound to ``amdgpu`` or to no driver and
  is not one of the old ATI server VGA chips of :data:`SERVER_VGA` (a Radeon
  in a desktop is a GPU).
"""

import glob
import os
from pathlib import Path

from .sysfs import gpu_functions, integrated_intel

#: PCI device ids of ATI/AMD VGA chips soldered on servers for the console, often
#: bound to no driver: Rage XL (0x4752), ES1000 (0x515e, 0x5969).
SERVER_VGA = (0x4752, 0x515E, 0x5969)


def found(root="/"):
    """``{"NVIDIA": [what], "AMD": [...], "Intel": [...]}``: the accelerators seen,
    each a short text (``/dev/nvidia0``, ``PCI 0000:3b:00.0 (driver: none)``)."""
    out: dict = {}
    nodes = sorted(glob.glob(str(Path(root) / "dev/nvidia[0-9]*")))
    if nodes:
        out.setdefault("NVIDIA", []).extend("/dev/" + os.path.basename(n) for n in nodes)
    if (Path(root) / "dev/kfd").exists():
        out.setdefault("AMD", []).append("/dev/kfd")
    for f in gpu_functions(root):
        if integrated_intel(f) or (f["vendor"] == "Intel" and f["class"] == 0x1200):
            continue  # Intel's processing accelerators are NPUs, its GPUs display classes
        if (
            f["vendor"] == "AMD"
            and f["class"] == 0x0300
            and (f["driver"] not in (None, "amdgpu") or f["device"] in SERVER_VGA)
        ):
            continue
        out.setdefault(f["vendor"], []).append(f"PCI {f['bdf']} (driver: {f['driver'] or 'none'})")
    return out


def describe(seen):
    """``found()``'s result as one phrase: ``NVIDIA: /dev/nvidia0, PCI 0000:3b:00.0 …``."""
    return "; ".join(f"{vendor}: {', '.join(items)}" for vendor, items in sorted(seen.items()))
