"""Device discovery for the launcher: GPUs from NVML, else CPU slots. No torch."""

from dataclasses import dataclass, field


@dataclass
class Devices:
    """What the plan spreads tests over.

    Attributes:
        kind: ``"gpu"`` or ``"cpu"``.
        indices: device indices (GPU index, or CPU slot number).
        names: GPU names (empty for CPU slots).
        affinity: per device, the CPU ids NVML reports as local to the GPU
            (empty when unknown or for CPU slots).
    """

    kind: str
    indices: list
    names: list = field(default_factory=list)
    affinity: list = field(default_factory=list)

    def __len__(self):
        return len(self.indices)


def _nvml_cpus(pynvml, handle, ncpus):
    words = (ncpus + 63) // 64
    try:
        mask = pynvml.nvmlDeviceGetCpuAffinity(handle, words)
    except Exception:
        return []
    cpus = []
    for w, bits in enumerate(mask):
        for b in range(64):
            if bits >> b & 1:
                cpus.append(w * 64 + b)
    return cpus


def nvml_gpus():
    """List the GPUs NVML sees as ``Devices(kind="gpu")``, or None without NVML/GPUs."""
    import os

    try:
        import pynvml
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:
        return None
    if count == 0:
        return None
    names, affinity = [], []
    for i in range(count):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        name = pynvml.nvmlDeviceGetName(h)
        names.append(name.decode() if isinstance(name, bytes) else name)
        affinity.append(_nvml_cpus(pynvml, h, os.cpu_count() or 1))
    return Devices("gpu", list(range(count)), names, affinity)


def discover(cpu_slots=None):
    """GPUs when NVML finds any; otherwise ``cpu_slots`` CPU slots (1 by default).

    Raises:
        ValueError: ``cpu_slots`` < 1.
    """
    gpus = nvml_gpus()
    if gpus is not None:
        return gpus
    n = 1 if cpu_slots is None else int(cpu_slots)
    if n < 1:
        raise ValueError("--cpu-slots must be at least 1")
    return Devices("cpu", list(range(n)))
