"""The hardware identity of this node: what ties a results folder to the machines a buyer
receives (docs/tender.md, "Sealing a bundle"). No torch.

``python -m milarun.host.identity`` prints it as JSON on stdout (how ``milarun jobs``
reads another node's, :mod:`milarun.launcher.identities`). The object:

``{"format": "milarun-identity", "version": 1, "hostname": "n1",``
``"gpus": [{"backend": "nvidia", "index": 0, "name": …, "uuid": "GPU-…",
"serial": "1654…", "pci_bus_id": "0000:3b:00.0"}, …],``
``"dmi": {"product_serial": …, "board_serial": …, "product_uuid": …},``
``"nics": {"eth0": "0c:42:a1:…"}, "cpu_model": "…", "memory_mib": 515890.2,``
``"config": {"node": {"kernel": "6.8.0-45-generic", "cpu_governors": ["performance"],
"container_image_id": None, "prescreen": [{"name": "cpu_cstates", …}, …]},
"gpus": [{"index": 0, "uuid": "GPU-…", "power_limit_w": 700.0, "sm_clock_app_mhz": 1755,
"mem_clock_app_mhz": 2619, "ecc_mode": True, "mig_mode": False, "persistence_mode": True,
"driver": "550.54.15", "vbios": "96.00.74.00.01"}, …]}}``

* ``gpus``: every device the GPU backend sees (:func:`milarun.host.devices.find_gpus`:
  the first backend with visible devices, honouring a visibility variable such as
  Slurm's ``CUDA_VISIBLE_DEVICES``, so: the GPUs a suite run here would test), through
  :meth:`milarun.host.accel.base.Backend.identity`; empty on a host without GPUs.
* ``dmi``: ``/sys/class/dmi/id/{product_serial,board_serial,product_uuid}``, readable
  by root only: ``"unreadable (not root)"`` otherwise; None where the file does not
  exist (no DMI: most ARM servers, some VMs).
* ``nics``: interface name → MAC address (``/sys/class/net/*/address``) of the
  interfaces backed by a device (``/sys/class/net/X/device`` exists); ``lo``,
  all-zero addresses and virtual interfaces (bridges, veth, tunnels, bonds: their MAC
  is made up at boot or copied from a port) are left out.
* ``cpu_model`` and ``memory_mib``: :func:`milarun.host.facts.cpu_model` and
  :func:`milarun.host.facts.memory_mib`.
* ``config`` (version 2): the configuration that moves the numbers (:func:`config`):
  per node the kernel release, the set of CPU frequency governors, the container
  image's id where a documented file gives it and the host prescreen's findings
  (:func:`milarun.host.prescreen.prescreen`: C-states, governor, NUMA balancing,
  transparent huge pages, GPU persistence, ECC, power limit and application clocks
  against their defaults, IOMMU, InfiniBand ports; each ``ok`` True, False or None for
  unknown); per GPU (in the order of ``gpus``) the
  backend's :data:`milarun.host.facts.GPU_CONFIG_KEYS` (NVIDIA:
  :meth:`milarun.host.accel.nvidia.NvidiaBackend.config`). Here a value that cannot be
  read is None, never ``"unreadable (why)"``: verify and audit compare values, and
  skip (verify) or show (audit) the ones missing. Version 1 identities have no
  ``config``: readers take its absence as "not recorded".

Every value is a string (or a number), None where the host does not expose it, or
``"unreadable (why)"`` (:func:`milarun.host.accel.base.unreadable`) where reading it
failed; one reading that fails never stops the others, and :func:`identity` never
raises. ``root`` (default ``/``) is where sysfs and procfs are read from, for tests.
"""

import errno
import glob
import json
import os
import socket
import sys
from pathlib import Path

from . import accel
from . import devices as devices_mod
from .accel.base import is_unreadable, unreadable
from .facts import GPU_CONFIG_KEYS, cpu_model, memory_mib
from .kernel import read_text
from .prescreen import prescreen

#: ``format`` and ``version`` of the identity object. Version 2 added ``config``.
IDENTITY_FORMAT = "milarun-identity"
IDENTITY_VERSION = 2
#: The DMI files read (``ROOT/sys/class/dmi/id/<name>``).
DMI_KEYS = ("product_serial", "board_serial", "product_uuid")
#: Largest identity text accepted from another node (bytes).
MAX_IDENTITY_BYTES = 1 * 2**20

#: Podman's container file (podman-run(1): "a container environment file is created in
#: each container … /run/.containerenv"; with ``--privileged`` it holds ``imageid``).
CONTAINERENV = "run/.containerenv"

__all__ = [
    "CONTAINERENV",
    "DMI_KEYS",
    "IDENTITY_FORMAT",
    "IDENTITY_VERSION",
    "MAX_IDENTITY_BYTES",
    "config",
    "container_image_id",
    "cpu_governors",
    "dmi",
    "gpus",
    "identity",
    "is_unreadable",
    "nics",
    "node_config",
    "serials",
]


def dmi(root="/"):
    """``{"product_serial", "board_serial", "product_uuid"}`` from
    ``ROOT/sys/class/dmi/id``: the text, ``"unreadable (not root)"`` when the kernel
    refuses it (EACCES, EPERM: root only), None when the file does not exist."""
    out = {}
    for key in DMI_KEYS:
        path = Path(root) / "sys/class/dmi/id" / key
        try:
            out[key] = path.read_bytes().decode("utf-8", errors="replace").strip() or None
        except FileNotFoundError:
            out[key] = None
        except OSError as exc:
            out[key] = unreadable(
                "not root"
                if exc.errno in (errno.EACCES, errno.EPERM)
                else exc.strerror or exc.__class__.__name__
            )
    return out


def nics(root="/"):
    """``{interface: MAC}`` of the device-backed network interfaces under
    ``ROOT/sys/class/net`` (lower-case MAC; ``lo``, all-zero and virtual ones left out)."""
    out = {}
    for folder in sorted(glob.glob(str(Path(root) / "sys/class/net/*"))):
        name = os.path.basename(folder)
        if name == "lo" or not os.path.exists(os.path.join(folder, "device")):
            continue
        mac = (read_text(os.path.join(folder, "address")) or "").lower()
        if not mac or set(mac) <= {"0", ":"}:
            continue
        out[name] = mac
    return out


#: ``found`` not given: the devices are read.
_UNREAD = object()


def _found(options):
    """``(backend name, backend, devices)`` of the first GPU backend with visible
    devices, or None on a host without one."""
    found, _ = devices_mod.find_gpus(options=options)
    if found is None:
        return None
    backend = accel.get(found.backend, **(options or {}).get(found.backend, {}))
    return found.backend, backend, found.accelerators


def gpus(options=None, found=_UNREAD):
    """The identity of every device the first GPU backend with visible devices sees
    (:meth:`milarun.host.accel.base.Backend.identity`, with ``backend`` and ``index``);
    [] on a host without one. ``options``: per backend name, its keyword arguments
    (tests: a fake pynvml, a sysfs root); ``found``: :func:`_found`'s answer, when
    already read (None: no GPU)."""
    found = _found(options) if found is _UNREAD else found
    if not found:
        return []
    name, backend, devices = found
    out = []
    for device in devices:
        try:
            ident = backend.identity(device)
        except Exception as exc:  # a backend's bug: said, never a crash
            ident = {
                "name": device.name,
                "uuid": device.uuid,
                "pci_bus_id": device.pci_bus_id,
                "serial": unreadable(f"{exc.__class__.__name__}: {exc}"),
            }
        out.append({"backend": name, "index": device.index, **ident})
    return out


def cpu_governors(root="/"):
    """The set of cpufreq governors of this node's CPUs
    (``ROOT/sys/devices/system/cpu/cpuN/cpufreq/scaling_governor``), as a sorted list;
    None where none can be read (no cpufreq: most VMs)."""
    found = set()
    for path in glob.glob(
        str(Path(root) / "sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor")
    ):
        value = read_text(path)
        if value:
            found.add(value)
    return sorted(found) or None


def container_image_id(root="/"):
    """The id of the container image this process runs in (``sha256:`` and 64 hex
    digits), where a documented file gives it: Podman's :data:`CONTAINERENV`
    (``imageid="…"``, written with ``--privileged``). None elsewhere (not in a
    container; Docker, Apptainer and enroot write no such file)."""
    for line in (read_text(Path(root) / CONTAINERENV) or "").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "imageid":
            value = value.strip().strip('"').lower().removeprefix("sha256:")
            if len(value) == 64 and all(c in "0123456789abcdef" for c in value):
                return "sha256:" + value
    return None


def node_config(root="/", nvml=None):
    """``{"kernel", "cpu_governors", "container_image_id", "prescreen"}`` of this node
    (module docstring); each None when it cannot be read. ``nvml``: the pynvml-like
    module the prescreen reads the GPUs with (None: pynvml itself, when installed)."""

    def safe(fn, *args):
        try:
            return fn(*args)
        except Exception:
            return None

    return {
        "kernel": safe(lambda: os.uname().release or None),
        "cpu_governors": safe(cpu_governors, root),
        "container_image_id": safe(container_image_id, root),
        "prescreen": safe(prescreen, root, nvml),
    }


def gpu_config(options=None, found=_UNREAD):
    """Per device of :func:`gpus` (same order), ``{"index", "uuid"}`` and the backend's
    configuration (:data:`milarun.host.facts.GPU_CONFIG_KEYS`, each None where it cannot
    be read; a backend without a ``config`` reader gives its driver version only)."""
    found = _found(options) if found is _UNREAD else found
    if not found:
        return []
    _, backend, devices = found
    out = []
    for device in devices:
        values = dict.fromkeys(GPU_CONFIG_KEYS)
        try:
            read = getattr(backend, "config", None)
            if read is not None:
                values.update({k: v for k, v in read(device).items() if k in values})
            else:
                values["driver"] = backend.versions().get("driver")
        except Exception:  # a backend's bug: nothing read, never a crash
            pass
        out.append({"index": device.index, "uuid": device.uuid, **values})
    return out


def config(root="/", options=None, found=_UNREAD):
    """``{"node": node_config(root), "gpus": gpu_config(options)}``: the configuration
    that moves the numbers (module docstring). Never raises. The prescreen reads NVML
    through ``options["nvidia"]["pynvml"]`` when given (tests: a fake)."""
    try:
        per_gpu = gpu_config(options, found)
    except Exception:
        per_gpu = []
    nvml = ((options or {}).get("nvidia") or {}).get("pynvml")
    return {"node": node_config(root, nvml), "gpus": per_gpu}


def identity(root="/", options=None):
    """This node's hardware identity (the module docstring's object, JSON values only).
    Never raises: a part that fails is ``"unreadable (why)"``.

    Args:
        root: where ``sys/`` and ``proc/`` are read from.
        options: per GPU backend, keyword arguments (:func:`gpus`).
    """

    def part(fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            return unreadable(f"{exc.__class__.__name__}: {exc}")

    try:
        found = _found(options)
    except Exception as exc:
        found = None
        failed = unreadable(f"{exc.__class__.__name__}: {exc}")
    else:
        failed = None
    return {
        "format": IDENTITY_FORMAT,
        "version": IDENTITY_VERSION,
        "hostname": part(socket.gethostname),
        "gpus": failed or part(gpus, options, found),
        "dmi": part(dmi, root),
        "nics": part(nics, root),
        "cpu_model": part(cpu_model, root),
        "memory_mib": part(memory_mib, root),
        "config": config(root, options, found),
    }


def serials(ident):
    """The readable GPU serial numbers of an identity object (a list, in device order):
    what an audit compares; unreadable and missing ones are left out."""
    out = []
    for gpu in (ident or {}).get("gpus") or [] if isinstance(ident, dict) else []:
        serial = gpu.get("serial") if isinstance(gpu, dict) else None
        if isinstance(serial, str) and serial and not is_unreadable(serial):
            out.append(serial)
    return out


def main():
    """Print this node's identity as one JSON object on stdout; exit status 0."""
    json.dump(identity(), sys.stdout, sort_keys=True, allow_nan=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
