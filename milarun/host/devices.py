"""Device discovery for the launcher: GPUs through the vendor backends, else CPU slots. No torch.

The backends (:mod:`milarun.host.accel`: NVIDIA with MIG, AMD, Intel) are tried in
order; the first that sees devices gives them. A host that has accelerators
(:mod:`milarun.host.accel.probe`) that no backend sees is an error, never a silent
run on the CPU, unless ``--cpu-slots`` asks for CPU slots on purpose.
"""

from dataclasses import dataclass, field

from ..errors import SetupError
from . import accel, isolation
from .accel import probe

# NVML helpers live with the NVIDIA backend; named here for older importers
from .accel.nvidia import nvml_str, nvml_visible, visible_indices  # noqa: F401
from .accel.probe import describe


@dataclass
class Devices:
    """What the plan spreads tests over.

    Attributes:
        kind: ``"gpu"`` or ``"cpu"``.
        indices: device indices (the backend's index, or CPU slot number).
        names: GPU names (empty for CPU slots).
        affinity: per device, the CPU ids local to it (empty when unknown or
            for CPU slots).
        cores: CPU cores the node's students share (``isolation.student_pool_cpus``),
            None when unknown.
        memory_mib: per device, its memory in MiB (a GPU's total; a CPU slot's
            share of the host RAM); empty when unknown.
        backend: the :mod:`milarun.host.accel` backend's name (``"nvidia"`` by
            default for GPUs, ``"cpu"`` for slots).
        visible: per device, its visibility value (``"3"``, ``"MIG-…"``);
            empty means the index.
        accelerators: the backend's :class:`milarun.host.accel.base.Accelerator`
            objects (empty for CPU slots and hand-made lists).
    """

    kind: str
    indices: list
    names: list = field(default_factory=list)
    affinity: list = field(default_factory=list)
    cores: int | None = None
    memory_mib: list = field(default_factory=list)
    backend: str | None = None
    visible: list = field(default_factory=list)
    accelerators: list = field(default_factory=list)

    def __post_init__(self):
        if self.backend is None:
            self.backend = "nvidia" if self.kind == "gpu" else "cpu"

    def __len__(self):
        return len(self.indices)

    def first(self, n):
        """These devices cut to the first ``n`` (the node facts kept)."""
        return Devices(
            self.kind,
            self.indices[:n],
            self.names[:n],
            self.affinity[:n],
            self.cores,
            self.memory_mib[:n],
            self.backend,
            self.visible[:n],
            self.accelerators[:n],
        )

    def visible_ids(self, indices):
        """The visibility values of the devices with these ``indices``, in that order."""
        by_index = dict(zip(self.indices, self.visible or [str(i) for i in self.indices]))
        return [by_index.get(i, str(i)) for i in indices]

    def child_env(self, indices):
        """The environment that makes the devices ``indices`` a child's only ones
        (:meth:`milarun.host.accel.base.Backend.child_env`), and ``MILARUN_BACKEND``."""
        env = accel.get(self.backend).child_env(self.visible_ids(indices))
        env["MILARUN_BACKEND"] = self.backend
        found = {a.index: a for a in self.accelerators}
        if (
            len(indices) == 1
            and indices[0] in found
            and found[indices[0]].parent is None
            and found[indices[0]].pci_bus_id
        ):
            # what the child checks its device against (reason wrong-device)
            env["MILARUN_PCI_BUS_ID"] = found[indices[0]].pci_bus_id
        return env


def from_accelerators(backend, found, cores=None):
    """``Devices(kind="gpu")`` of a backend's :class:`~milarun.host.accel.base.Accelerator` list."""
    memory = [a.memory_mib for a in found]
    return Devices(
        "gpu",
        [a.index for a in found],
        [a.name for a in found],
        [list(a.cpus) for a in found],
        cores,
        memory if all(m is not None for m in memory) else [],
        backend,
        [a.visible_id for a in found],
        list(found),
    )


def find_gpus(backends=accel.GPU_BACKENDS, options=None):
    """``(Devices or None, {backend: why it saw nothing})``: the first backend with
    visible devices; its own entry, when it has one, says which devices it skipped
    and why (an NVIDIA GPU that cannot be opened). ``options``: per backend name,
    keyword arguments (tests)."""
    reasons = {}
    for name in backends:
        try:
            backend = accel.get(name, **(options or {}).get(name, {}))
            found = backend.discover()
        except Exception as exc:  # a broken vendor library disables its backend only
            reasons[name] = f"{exc.__class__.__name__}: {exc}"
            continue
        if found:
            if getattr(backend, "reason", None):  # devices it skipped
                reasons[name] = backend.reason
            return from_accelerators(name, found), reasons
        reasons[name] = getattr(backend, "reason", None) or "no visible device"
    return None, reasons


def nvml_gpus():
    """The GPUs NVML sees and ``CUDA_VISIBLE_DEVICES`` allows, as
    ``Devices(kind="gpu")``; None without NVML or without a visible GPU."""
    gpus, _ = find_gpus(("nvidia",))
    return gpus


def silent_fallback_error(seen, reasons):
    """The one line that stops a run on a host whose accelerators no backend sees."""
    why = "; ".join(
        f"{name}: {reasons[name]}"
        for name in accel.GPU_BACKENDS
        if name in reasons and accel.VENDOR_OF[name] in seen
    )
    return (
        f"this host has accelerators ({describe(seen)}) but milarun sees none of them"
        f" ({why or 'no backend for them'}); install the driver and library "
        f"(docs/vendors.md), or pass --cpu-slots N to run on CPU slots on purpose"
    )


def discover(cpu_slots=None, root="/", options=None):
    """GPUs when a backend finds visible ones; otherwise ``cpu_slots`` CPU slots (1 by
    default), with the node's cores and each device's memory (what placeholders are
    filled from).

    Raises:
        ValueError: ``cpu_slots`` < 1.
        SetupError: no backend sees a device, the host has accelerators
            (:func:`milarun.host.accel.probe.found` under ``root``) and ``cpu_slots``
            was not given.
    """
    import psutil

    cores = len(isolation.student_pool_cpus())
    gpus, reasons = find_gpus(options=options)
    if gpus is not None:
        gpus.cores = cores
        return gpus
    if cpu_slots is None:
        seen = probe.found(root)
        if seen:
            raise SetupError(silent_fallback_error(seen, reasons))
    n = 1 if cpu_slots is None else int(cpu_slots)
    if n < 1:
        raise ValueError("--cpu-slots must be at least 1")
    share = psutil.virtual_memory().total // n / 2**20  # a student's RAM (split_students)
    return Devices("cpu", list(range(n)), cores=cores, memory_mib=[share] * n)
