"""Device discovery for the launcher: GPUs from NVML, else CPU slots. No torch.

GPU indices are NVML's, which follow the PCI bus order. CUDA numbers GPUs
fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so the plan sets that
in every child: ``CUDA_VISIBLE_DEVICES=i`` then names the GPU that NVML, the
monitor and the student cgroup's CPU affinity call ``i``.
"""

import os
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
        cores: CPU cores the node's students share (``isolation.host_cpus``),
            None when unknown.
        memory_mib: per device, its memory in MiB (a GPU's total; a CPU slot's
            share of the host RAM); empty when unknown.
    """

    kind: str
    indices: list
    names: list = field(default_factory=list)
    affinity: list = field(default_factory=list)
    cores: int = None
    memory_mib: list = field(default_factory=list)

    def __len__(self):
        return len(self.indices)

    def first(self, n):
        """These devices cut to the first ``n`` (the node facts kept)."""
        return Devices(self.kind, self.indices[:n], self.names[:n], self.affinity[:n],
                       self.cores, self.memory_mib[:n])


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


def visible_indices(count, spec=None, uuid_of=None):
    """The GPU indices (PCI bus order) that ``CUDA_VISIBLE_DEVICES`` leaves visible.

    Args:
        count: number of GPUs on the host.
        spec: the variable's value; by default ``os.environ``'s. Unset: all.
        uuid_of: ``f(index) -> "GPU-…"`` to resolve UUID entries; without it
            a UUID entry counts as invalid.

    Returns:
        list of indices in the order given. As CUDA does, an entry that is
        not a valid index or a unique UUID prefix hides itself and every
        entry after it (MIG instances are not supported as devices).
    """
    if spec is None:
        spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(range(count))
    uuids = None
    out = []
    for tok in (t.strip() for t in spec.split(",")):
        index = None
        if tok.isdigit() and int(tok) < count:
            index = int(tok)
        elif tok.startswith("GPU-") and uuid_of is not None:
            if uuids is None:
                uuids = [uuid_of(i) for i in range(count)]
            found = [i for i, u in enumerate(uuids) if u.startswith(tok)]
            index = found[0] if len(found) == 1 else None
        if index is None or index in out:
            break
        out.append(index)
    return out


def nvml_str(value):
    """An NVML string as ``str`` (older pynvml releases return ``bytes``)."""
    return value.decode() if isinstance(value, bytes) else value


def nvml_visible(pynvml):
    """``(indices, handles)``: the visible GPUs' indices (``visible_indices``)
    and NVML handles of every GPU, by index. ``pynvml`` must be initialised."""
    count = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    indices = visible_indices(count,
                              uuid_of=lambda i: nvml_str(pynvml.nvmlDeviceGetUUID(handles[i])))
    return indices, handles


def nvml_gpus():
    """The GPUs NVML sees and ``CUDA_VISIBLE_DEVICES`` allows, as
    ``Devices(kind="gpu")``; None without NVML or without a visible GPU."""
    try:
        import pynvml
        pynvml.nvmlInit()
        indices, handles = nvml_visible(pynvml)
    except Exception:
        return None
    if not indices:
        return None
    names, affinity, memory = [], [], []
    for i in indices:
        names.append(nvml_str(pynvml.nvmlDeviceGetName(handles[i])))
        affinity.append(_nvml_cpus(pynvml, handles[i], os.cpu_count() or 1))
        try:
            memory.append(pynvml.nvmlDeviceGetMemoryInfo(handles[i]).total / 2**20)
        except Exception:
            memory = None  # one unknown: {gpu_memory_gb} cannot be filled
    return Devices("gpu", indices, names, affinity, memory_mib=memory or [])


def discover(cpu_slots=None):
    """GPUs when NVML finds visible ones; otherwise ``cpu_slots`` CPU slots (1 by default),
    with the node's cores and each device's memory (what placeholders are filled from).

    Raises:
        ValueError: ``cpu_slots`` < 1.
    """
    import psutil

    from .isolation import host_cpus

    cores = len(host_cpus())
    gpus = nvml_gpus()
    if gpus is not None:
        gpus.cores = cores
        return gpus
    n = 1 if cpu_slots is None else int(cpu_slots)
    if n < 1:
        raise ValueError("--cpu-slots must be at least 1")
    share = psutil.virtual_memory().total // n / 2**20  # a student's RAM (split_students)
    return Devices("cpu", list(range(n)), cores=cores, memory_mib=[share] * n)
