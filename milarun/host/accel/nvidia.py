"""NVIDIA GPUs and MIG instances through NVML (``nvidia-ml-py``). No torch.

GPU indices are NVML's, which follow the PCI bus order. A child is given its
GPU by UUID (``CUDA_VISIBLE_DEVICES=GPU-…``), never by index: NVML's count
includes GPUs this process may not open (``NVMLError_NoPermission`` under a
device cgroup, a container or file permissions on ``/dev/nvidiaN``), which
CUDA does not count, so NVML's index ``i`` and CUDA's index ``i`` can name
different GPUs; a UUID names the same one for both. Such GPUs are skipped,
with the reason (:attr:`NvidiaBackend.reason`, shown by ``milarun devices``).
Every child also gets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (CUDA numbers GPUs
fastest first otherwise), so that a GPU's index on another, alike node
(:attr:`~milarun.host.accel.base.Accelerator.portable_id`: its rank among the GPUs
CUDA sees) means the same GPU there.

**MIG.** A GPU in MIG mode is not a device: each of its MIG instances is, with
its ``MIG-…`` UUID as the visibility value (CUDA runs a process on one MIG
instance), its own memory, and the CPU affinity of its GPU. When any visible
device is a MIG instance, devices are numbered 0..N-1 in discovery order (the
student cgroups need consecutive numbers) and whole GPUs are named by their
``GPU-…`` UUID. NVML reports utilisation, power and energy for the whole GPU
only, so a MIG instance's readings hold its memory use and the GPU's
temperature; its power and energy are left out rather than counted once per
instance.
"""

import os

from ..facts import GPU_CONFIG_KEYS, gpu_facts
from .base import Accelerator, Backend, Reading, reading, unreadable
from .sysfs import local_cpus, normalize_bdf, numa_node


def nvml_str(value):
    """An NVML string as ``str`` (older pynvml releases return ``bytes``)."""
    return value.decode() if isinstance(value, bytes) else value


def _call(nv, name, *args):
    """``nv.<name>(*args)``, or None when this pynvml lacks it or the GPU does not
    support it (NVMLError_NotSupported and friends)."""
    fn = getattr(nv, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception:
        return None


def visible_indices(count, spec=None, uuid_of=None, openable=None):
    """The GPU indices (PCI bus order) that ``CUDA_VISIBLE_DEVICES`` leaves visible.

    Args:
        count: number of GPUs on the host.
        spec: the variable's value; by default ``os.environ``'s. Unset: all.
        uuid_of: ``f(index) -> "GPU-…"`` (None for a GPU it cannot name) to
            resolve UUID entries; without it a UUID entry counts as invalid.
        openable: the indices of the GPUs this process can open (default: all).
            An index entry counts among these, as CUDA counts only the GPUs it
            can open (a job's device cgroup, with Slurm's ``0..k-1``).

    Returns:
        list of indices in the order given. As CUDA does, an entry that is
        not a valid index or a unique UUID prefix hides itself and every
        entry after it. (MIG entries: :meth:`NvidiaBackend.discover`.)
    """
    return [i for kind, i in _resolve(count, spec, uuid_of, {}, openable) if kind == "gpu"]


def _resolve(count, spec, uuid_of, migs, openable=None):
    """``[("gpu", index) | ("mig", uuid)]`` that ``spec`` names; ``migs`` maps every MIG
    UUID of the host to its GPU index; ``openable`` as :func:`visible_indices`'."""
    order = list(range(count)) if openable is None else list(openable)
    if spec is None:
        spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return [("gpu", i) for i in order]
    uuids = None
    out = []
    for tok in (t.strip() for t in spec.split(",")):
        entry = None
        if tok.isdigit() and int(tok) < len(order):
            entry = ("gpu", order[int(tok)])
        elif tok.startswith("GPU-") and uuid_of is not None:
            if uuids is None:
                uuids = [uuid_of(i) for i in range(count)]
            found = [i for i, u in enumerate(uuids) if u and u.startswith(tok)]
            entry = ("gpu", found[0]) if len(found) == 1 else None
        elif tok.startswith("MIG-"):
            found = [u for u in migs if u.startswith(tok)]
            entry = ("mig", found[0]) if len(found) == 1 else None
        if entry is None or entry in out:
            break
        out.append(entry)
    return out


def nvml_handles(pynvml):
    """``(handles, skipped)``: the NVML handle of every GPU by index (None for one that
    cannot be opened) and ``{index: why}`` for those. NVML's count includes GPUs whose
    handle raises ``NVMLError_NoPermission`` (a device cgroup, a container, the
    permissions of ``/dev/nvidiaN``): one of them must not hide the others."""
    handles, skipped = [], {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        try:
            handles.append(pynvml.nvmlDeviceGetHandleByIndex(i))
        except Exception as exc:
            handles.append(None)
            skipped[i] = f"{exc.__class__.__name__}: {exc}"
    return handles, skipped


def nvml_visible(pynvml):
    """``(indices, handles)``: the visible GPUs' indices (``visible_indices``, without
    those that cannot be opened) and NVML handles of every GPU, by index (None for one
    that cannot be opened, :func:`nvml_handles`). ``pynvml`` must be initialised."""
    handles, skipped = nvml_handles(pynvml)
    indices = visible_indices(
        len(handles),
        uuid_of=lambda i: (
            None if handles[i] is None else nvml_str(pynvml.nvmlDeviceGetUUID(handles[i]))
        ),
        openable=[i for i, h in enumerate(handles) if h is not None],
    )
    return indices, handles


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


def _mig_handles(nv, handle):
    """The MIG instance handles of a GPU in MIG mode (``[]`` when it has none: CUDA
    then sees nothing of that GPU), None when the GPU is not in MIG mode."""
    mode = _call(nv, "nvmlDeviceGetMigMode", handle)
    current = mode[0] if isinstance(mode, (list, tuple)) else mode
    if current != getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1):
        return None
    out = []
    for i in range(_call(nv, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
        mig = _call(nv, "nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
        if mig is not None:  # an empty slot raises NotFound
            out.append(mig)
    return out


class NvidiaBackend(Backend):
    """NVIDIA GPUs and MIG instances (module docstring)."""

    name = "nvidia"
    vendor = "NVIDIA"
    torch_device = "cuda"
    visibility_var = "CUDA_VISIBLE_DEVICES"

    def __init__(self, pynvml=None, root="/"):
        self._nv = pynvml
        self.root = root
        self.reason = None

    def _init(self):
        if self._nv is None:
            import pynvml

            pynvml.nvmlInit()
            self._nv = pynvml
        return self._nv

    def available(self):
        try:
            self._init()
        except ImportError as exc:
            return False, f"the nvidia-ml-py package is not installed ({exc})"
        except Exception as exc:
            return False, (
                f"NVML cannot start ({exc.__class__.__name__}: {exc}): "
                "is the NVIDIA driver (libnvidia-ml.so) installed and loaded?"
            )
        return True, None

    def discover(self):
        ok, self.reason = self.available()
        if not ok:
            return []
        try:
            return self._discover(self._nv)
        except Exception as exc:
            self.reason = f"NVML: {exc.__class__.__name__}: {exc}"
            return []

    def _discover(self, nv):
        handles, skipped = nvml_handles(nv)
        count = len(handles)
        migs = {}  # MIG uuid -> (GPU index, handle)
        per_gpu = []
        for i, h in enumerate(handles):
            instances = None if h is None else _mig_handles(nv, h)
            per_gpu.append(instances)
            for m in instances or ():
                migs[nvml_str(nv.nvmlDeviceGetUUID(m))] = (i, m)
        uuids = [
            None if h is None else nvml_str(_call(nv, "nvmlDeviceGetUUID", h)) for h in handles
        ]
        # a GPU this process cannot open is skipped, never the others (module docstring)
        entries = _resolve(
            count,
            None,
            lambda i: uuids[i],
            migs,
            [i for i, h in enumerate(handles) if h is not None],
        )
        # CUDA's index of a whole GPU: its rank among the GPUs CUDA sees (those that open,
        # outside MIG mode), in PCI order (CUDA_DEVICE_ORDER=PCI_BUS_ID)
        cuda_index = {
            i: n
            for n, i in enumerate(
                i for i in range(count) if handles[i] is not None and per_gpu[i] is None
            )
        }
        ncpus = os.cpu_count() or 1
        found = []
        for kind, key in entries:
            if kind == "gpu" and per_gpu[key] is not None:  # in MIG mode: its instances
                found += [("mig", key, m) for m in per_gpu[key]]
            elif kind == "gpu":
                found.append(("gpu", key, handles[key]))
            else:
                found.append(("mig",) + migs[key])
        empty = [i for i, inst in enumerate(per_gpu) if inst == []]
        why = []
        if not found and empty:
            why.append(
                f"GPU {', '.join(map(str, empty))} in MIG mode with no MIG instance "
                "(create some: nvidia-smi mig -cgi … -C, or turn MIG mode off)"
            )
        elif count > len(skipped) and not entries:  # the user's choice: say so
            why.append(
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} "
                f"hides every GPU ({count} on the host)"
            )
        # said whether or not other GPUs were found (milarun devices shows it)
        why += [
            f"GPU {i} skipped, it cannot be opened ({err}): a device cgroup, a container "
            f"or the permissions of /dev/nvidia{i} keep it from this user"
            for i, err in sorted(skipped.items())
        ]
        if why:
            self.reason = "; ".join(why)
        mig_mode = any(kind == "mig" for kind, _, _ in found)
        out = []
        for n, (kind, gpu, h) in enumerate(found):
            parent = handles[gpu]
            bdf = normalize_bdf(
                nvml_str(getattr(_call(nv, "nvmlDeviceGetPciInfo", parent), "busId", None) or "")
                or None
            )
            uuid = nvml_str(_call(nv, "nvmlDeviceGetUUID", h))
            memory = _call(nv, "nvmlDeviceGetMemoryInfo", h)
            cpus = _nvml_cpus(nv, parent, ncpus) or local_cpus(bdf, self.root)
            whole = kind == "gpu"
            out.append(
                Accelerator(
                    index=n if mig_mode else gpu,
                    # by UUID: NVML's and CUDA's indices can differ (module docstring)
                    visible_id=uuid or str(gpu),
                    portable_id=str(cuda_index[gpu]) if whole else None,
                    name=nvml_str(_call(nv, "nvmlDeviceGetName", h)) or "NVIDIA GPU",
                    uuid=uuid,
                    pci_bus_id=bdf,
                    memory_mib=None if memory is None else memory.total / 2**20,
                    cpus=cpus,
                    numa_node=numa_node(bdf, self.root),
                    parent=gpu if kind == "mig" else None,
                    handle=(h, parent, kind == "mig"),
                )
            )
        return out

    def child_env(self, visible):
        # GPU-/MIG- UUIDs here; indices (portable_id) for other nodes (module docstring)
        return {"CUDA_VISIBLE_DEVICES": ",".join(visible), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

    def versions(self):
        try:
            nv = self._init()
        except Exception:
            return {"driver": None, "runtime": None, "runtime_name": "CUDA"}
        cuda = _call(nv, "nvmlSystemGetCudaDriverVersion")
        runtime = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
        return {
            "driver": nvml_str(_call(nv, "nvmlSystemGetDriverVersion")),
            "runtime": runtime,
            "runtime_name": "CUDA",
        }

    def read(self, device):
        """A :class:`Reading`: memory used in MiB (bytes / 2**20), temperature in °C,
        load in %, power in W (mW / 1000) and energy in J (mJ / 1000).

        Each reading is taken on its own: one that raises (``NotSupported`` on some
        boards and vGPU guests, ``nvmlDeviceGetTemperature``, deprecated and due to go
        in CUDA 14) or that this pynvml lacks is left out, and the others, the energy
        counter included, are kept. A MIG instance's reading holds its memory and its
        GPU's temperature only (module docstring).

        Raises:
            the first NVML error, when every reading failed (the monitor then records
            an error row).
        """
        nv = self._init()
        h, parent, mig = device.handle
        errors = []

        def get(name, *args):
            fn = getattr(nv, name, None)
            if fn is None:
                return None
            try:
                return fn(*args)
            except Exception as exc:
                errors.append(exc)
                return None

        memory = get("nvmlDeviceGetMemoryInfo", h)
        used = getattr(memory, "used", None)
        used = None if used is None else used / 2**20
        temperature = get(
            "nvmlDeviceGetTemperature", parent, getattr(nv, "NVML_TEMPERATURE_GPU", 0)
        )
        if mig:
            reading = Reading(memory_mib=used, temperature=temperature)
        else:
            energy = get("nvmlDeviceGetTotalEnergyConsumption", h)
            util = get("nvmlDeviceGetUtilizationRates", h)
            power = get("nvmlDeviceGetPowerUsage", h)
            reading = Reading(
                load=getattr(util, "gpu", None),
                memory_mib=used,
                temperature=temperature,
                power=None if power is None else power / 1000.0,
                energy=None if energy is None else energy / 1000.0,
            )
        if errors and all(v is None for v in vars(reading).values()):
            raise errors[0]
        return reading

    def clocks(self, device):
        """The SM clock (``nvmlDeviceGetClockInfo(NVML_CLOCK_SM)``, MHz) and the clock-event
        reasons (``nvmlDeviceGetCurrentClocksEventReasons``, or the older
        ``nvmlDeviceGetCurrentClocksThrottleReasons`` of drivers before R535: the same
        bits); each None when it cannot be read. None when neither can (a MIG instance
        reads its GPU's)."""
        try:
            nv = self._init()
        except Exception:
            return None
        parent = device.handle[1] if isinstance(device.handle, tuple) else device.handle
        clock = _call(nv, "nvmlDeviceGetClockInfo", parent, getattr(nv, "NVML_CLOCK_SM", 1))
        reasons = _call(nv, "nvmlDeviceGetCurrentClocksEventReasons", parent)
        if reasons is None:
            reasons = _call(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", parent)
        if clock is None and reasons is None:
            return None
        return {"sm_clock_mhz": clock, "reasons": reasons}

    def nvlink(self, device):
        """Active NVLink links (``nvmlDeviceGetNvLinkState`` over
        ``NVML_NVLINK_MAX_LINKS``) and the version of the first (``nvmlDeviceGetNvLinkVersion``);
        None when no link is up or NVML cannot tell."""
        try:
            nv = self._init()
        except Exception:
            return None
        parent = device.handle[1] if isinstance(device.handle, tuple) else device.handle
        links, version = 0, None
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            if _call(nv, "nvmlDeviceGetNvLinkState", parent, link) == 1:
                links += 1
                if version is None:
                    version = _call(nv, "nvmlDeviceGetNvLinkVersion", parent, link)
        if not links:
            return None
        return {"version": version, "links": links}

    def identity(self, device):
        """``{"name", "uuid", "serial", "pci_bus_id"}`` from NVML (``nvmlDeviceGetName``,
        ``nvmlDeviceGetUUID``, ``nvmlDeviceGetSerial``: the board's serial number, as
        printed on it; ``nvmlDeviceGetPciInfo``), each read on its own: one that raises
        (``NotSupported`` on GeForce boards, ``NoPermission``) is ``"unreadable (why)"``,
        one this pynvml lacks is None. A MIG instance gives its own UUID and name and its
        GPU's serial and bus id, with ``gpu_uuid``: its GPU's UUID. Never raises."""
        try:
            nv = self._init()
        except Exception as exc:
            why = unreadable(f"NVML: {exc.__class__.__name__}: {exc}")
            return {
                "name": device.name,
                "uuid": device.uuid,
                "serial": why,
                "pci_bus_id": device.pci_bus_id,
            }
        h, parent, mig = device.handle

        def get(name, handle, convert=nvml_str):
            fn = getattr(nv, name, None)
            return None if fn is None else reading(fn, handle, convert=convert)

        out = {
            "name": get("nvmlDeviceGetName", h),
            "uuid": get("nvmlDeviceGetUUID", h),
            "serial": get("nvmlDeviceGetSerial", parent),
            "pci_bus_id": get(
                "nvmlDeviceGetPciInfo",
                parent,
                convert=lambda info: normalize_bdf(
                    nvml_str(getattr(info, "busId", None) or "") or None
                ),
            ),
        }
        if mig:
            out["gpu_uuid"] = get("nvmlDeviceGetUUID", parent)
        return out

    def facts(self, device):
        try:
            return gpu_facts(self._init(), device.handle[1])
        except Exception:
            return {}

    def config(self, device):
        """The configuration of ``device``'s GPU that moves the numbers (a MIG instance
        gives its GPU's), for the node's identity
        (:data:`milarun.host.facts.GPU_CONFIG_KEYS`): the enforced power limit (W), the
        application clocks (MHz), ECC and persistence mode (bool, the current mode) as
        :func:`milarun.host.facts.gpu_facts` reads them for every record; MIG mode
        (``nvmlDeviceGetMigMode``, the current one), the driver version
        (``nvmlSystemGetDriverVersion``) and the VBIOS version
        (``nvmlDeviceGetVbiosVersion``). Each value is None where NVML does not answer
        (``NotSupported``, ``NoPermission``, a pynvml without the call). Never raises."""
        out = dict.fromkeys(GPU_CONFIG_KEYS)
        try:
            nv = self._init()
            parent = device.handle[1]
        except Exception:
            return out
        facts = {}
        try:
            facts = gpu_facts(nv, parent)
        except Exception:
            pass
        out.update({k: facts.get(k) for k in GPU_CONFIG_KEYS if k in facts})
        mode = _call(nv, "nvmlDeviceGetMigMode", parent)
        current = mode[0] if isinstance(mode, (list, tuple)) and mode else mode
        if isinstance(current, int):
            out["mig_mode"] = current == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)
        for key, value in (
            ("driver", _call(nv, "nvmlSystemGetDriverVersion")),
            ("vbios", _call(nv, "nvmlDeviceGetVbiosVersion", parent)),
        ):
            value = nvml_str(value)
            out[key] = (value.strip() or None) if isinstance(value, str) else None
        return out
