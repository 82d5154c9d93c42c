"""The device-backend interface: one small contract per GPU vendor. No torch.

A backend finds the accelerators a vendor's management library (or sysfs)
sees, tells the launcher which environment variable makes one of them the
child's only device, where its local CPUs are, and reads its telemetry. The
launcher (``milarun.host.devices``), the student cgroups (``milarun.host.isolation``),
the monitor (``milarun.bench.monitor``) and the host facts of a result all go
through it, so a vendor lives in one module (``milarun.host.accel.<name>``).

Backends: ``nvidia`` (NVML, MIG instances included), ``amd`` (``amdsmi``),
``intel`` (sysfs / Level Zero's ``ZE_AFFINITY_MASK``) and ``cpu`` (slots).
"""

from dataclasses import dataclass, field


@dataclass
class Accelerator:
    """One device a test can be given.

    Attributes:
        index: the backend's index for it (NVML / amdsmi / DRM order); the
            launcher's device label and the student number follow it.
        visible_id: what the visibility variable is set to so that this is the
            child's only device: an index ``"3"``, or a UUID (``"GPU-…"`` for a
            whole NVIDIA GPU, ``"MIG-…"`` for a MIG instance).
        name: marketing name, e.g. ``"NVIDIA H100 80GB HBM3"``.
        uuid: the vendor's UUID, None when not exposed.
        pci_bus_id: ``"0000:3b:00.0"`` (lower case, domain included), None if unknown.
        memory_mib: total device memory (MiB), None if unknown.
        cpus: CPU ids local to the device (its NUMA node), empty if unknown.
        numa_node: NUMA node of the device, None if unknown.
        parent: for a MIG instance, the ``index`` of its GPU; else None.
        handle: the backend's own handle (NVML handle, amdsmi processor handle,
            sysfs path); opaque to everyone else and never serialised.
        portable_id: the visibility value that names the same device on another,
            alike node (a UUID names one host's device only): the runtime's index
            of a whole NVIDIA GPU; None when it is ``visible_id`` or there is none
            (a MIG instance).
    """

    index: int
    visible_id: str
    name: str
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_mib: float | None = None
    cpus: list = field(default_factory=list)
    numa_node: int | None = None
    parent: int | None = None
    handle: object = field(default=None, repr=False, compare=False)
    portable_id: str | None = None


@dataclass
class Reading:
    """One telemetry reading of one device; None where the backend cannot tell.

    Units: load in %, memory_mib in MiB (used), temperature in °C, power in W,
    energy in J (the device's cumulative counter, absolute: the monitor takes
    differences).
    """

    load: float | None = None
    memory_mib: float | None = None
    temperature: float | None = None
    power: float | None = None
    energy: float | None = None


class Backend:
    """A vendor's devices. Subclasses set the class attributes and implement the methods.

    Attributes:
        name: ``"nvidia"``, ``"amd"``, ``"intel"`` or ``"cpu"``.
        vendor: ``"NVIDIA"``, ``"AMD"``, ``"Intel"``, or None for CPU slots.
        torch_device: the ``torch.device`` type a child uses: ``"cuda"`` for
            NVIDIA and ROCm builds alike, ``"xpu"`` for Intel, ``"cpu"``.
        visibility_var: the variable :meth:`child_env` sets, e.g.
            ``"CUDA_VISIBLE_DEVICES"``.
    """

    name: str | None = None
    vendor: str | None = None
    torch_device: str | None = None
    visibility_var: str | None = None

    def available(self):
        """``(ok, reason)``: whether the library/driver answers; ``reason`` (one
        line: what is missing — driver, library, permissions) when not. Never raises."""
        raise NotImplementedError

    def discover(self):
        """The devices this process may use, honouring the visibility variable
        already set in ``os.environ`` (a child of another launcher), as a list
        of :class:`Accelerator`. Empty when none. Never raises."""
        raise NotImplementedError

    def child_env(self, visible):
        """The environment a child needs so that the devices whose
        :attr:`Accelerator.visible_id` are listed in ``visible`` (strings) are its
        only ones, in that order: a dict of variable → value (strings), where
        ``""`` hides every device of that variable."""
        return {self.visibility_var: ",".join(visible)}

    def versions(self):
        """``{"driver": str|None, "runtime": str|None, "runtime_name": str|None}``,
        e.g. ``{"driver": "550.54.15", "runtime": "12.4", "runtime_name": "CUDA"}``.
        Never raises."""
        raise NotImplementedError

    def read(self, device):
        """A :class:`Reading` of ``device`` now. May raise; the monitor records the error."""
        raise NotImplementedError

    def clocks(self, device):
        """``{"sm_clock_mhz": MHz or None, "reasons": bit mask or None}``: the device's
        current SM clock and why its clocks are held down, as NVML's clock-event
        (throttle) reason bits (``milarun.measure.acceptance.CAPPING_REASONS``); None
        where the backend cannot tell (the default). Never raises."""
        return None

    def nvlink(self, device):
        """``{"version": NVML's nvmlNvlinkVersion_t, "links": active links}`` of a GPU, or
        None where the backend cannot tell (the default; no NVLink). Never raises."""
        return None

    def facts(self, device):
        """Per-device facts that change results (clocks in MHz, power limits in W,
        persistence/ECC), a flat dict of JSON values; ``{}`` when none. Never raises."""
        return {}

    def identity(self, device):
        """The hardware identity of ``device``: ``{"name", "uuid", "serial", "pci_bus_id"}``,
        each a string, None where the backend does not expose it, or
        ``"unreadable (why)"`` where reading it raised (:func:`unreadable`). The default
        gives what discovery found and no serial. Never raises."""
        return {
            "name": device.name,
            "uuid": device.uuid,
            "serial": None,
            "pci_bus_id": device.pci_bus_id,
        }

    def describe(self):
        """One line for ``milarun devices``: what this backend is and reads."""
        return f"{self.name}: {self.vendor or 'CPU slots'}"

    def accelerator_record(self):
        """The ``host.accelerator`` field of a result: ``{"backend", "vendor",
        "driver", "runtime", "runtime_name"}``."""
        v = self.versions()
        return {
            "backend": self.name,
            "vendor": self.vendor,
            "driver": v.get("driver"),
            "runtime": v.get("runtime"),
            "runtime_name": v.get("runtime_name"),
        }


#: How an identity reading that raised is written: ``"unreadable (why)"``.
UNREADABLE = "unreadable ({})"


def unreadable(why):
    """``"unreadable (why)"``: an identity reading that could not be taken (the reason
    on one line, at most 200 characters)."""
    text = " ".join(str(why).split())[:200]
    return UNREADABLE.format(text)


def is_unreadable(value):
    """True when an identity value is :func:`unreadable`'s (never a serial to compare)."""
    return isinstance(value, str) and value.startswith("unreadable (") and value.endswith(")")


def reading(call, *args, convert=None):
    """One identity reading: ``call(*args)`` (through ``convert`` when given), None when
    it answers nothing, ``"unreadable (ExcName: message)"`` when it raises. Never raises."""
    try:
        value = call(*args)
        return convert(value) if convert is not None and value is not None else value
    except Exception as exc:  # NotSupported, NoPermission, a library's own errors
        return unreadable(f"{exc.__class__.__name__}: {exc}")
