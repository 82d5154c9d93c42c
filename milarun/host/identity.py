"""The hardware identity of this node: what ties a results folder to the machines a buyer
receives (docs/tender.md, "Sealing a bundle"). No torch.

``python -m milarun.host.identity`` prints it as JSON on stdout (how ``milarun jobs``
reads another node's, :mod:`milarun.launcher.identities`). The object:

``{"format": "milarun-identity", "version": 1, "hostname": "n1",``
``"gpus": [{"backend": "nvidia", "index": 0, "name": …, "uuid": "GPU-…",
"serial": "1654…", "pci_bus_id": "0000:3b:00.0"}, …],``
``"dmi": {"product_serial": …, "board_serial": …, "product_uuid": …},``
``"nics": {"eth0": "0c:42:a1:…"}, "cpu_model": "…", "memory_mib": 515890.2}``

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

from . import devices as devices_mod
from . import accel
from .accel.base import is_unreadable, unreadable
from .facts import cpu_model, memory_mib
from .kernel import read_text

#: ``format`` and ``version`` of the identity object.
IDENTITY_FORMAT = "milarun-identity"
IDENTITY_VERSION = 1
#: The DMI files read (``ROOT/sys/class/dmi/id/<name>``).
DMI_KEYS = ("product_serial", "board_serial", "product_uuid")
#: Largest identity text accepted from another node (bytes).
MAX_IDENTITY_BYTES = 1 * 2**20

__all__ = ["DMI_KEYS", "IDENTITY_FORMAT", "IDENTITY_VERSION", "MAX_IDENTITY_BYTES", "dmi",
           "gpus", "identity", "is_unreadable", "nics", "serials"]


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
            out[key] = unreadable("not root" if exc.errno in (errno.EACCES, errno.EPERM)
                                  else exc.strerror or exc.__class__.__name__)
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


def gpus(options=None):
    """The identity of every device the first GPU backend with visible devices sees
    (:meth:`milarun.host.accel.base.Backend.identity`, with ``backend`` and ``index``);
    [] on a host without one. ``options``: per backend name, its keyword arguments
    (tests: a fake pynvml, a sysfs root)."""
    found, _ = devices_mod.find_gpus(options=options)
    if found is None:
        return []
    backend = accel.get(found.backend, **(options or {}).get(found.backend, {}))
    out = []
    for device in found.accelerators:
        try:
            ident = backend.identity(device)
        except Exception as exc:   # a backend's bug: said, never a crash
            ident = {"name": device.name, "uuid": device.uuid, "pci_bus_id": device.pci_bus_id,
                     "serial": unreadable(f"{exc.__class__.__name__}: {exc}")}
        out.append({"backend": found.backend, "index": device.index, **ident})
    return out


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

    return {"format": IDENTITY_FORMAT, "version": IDENTITY_VERSION,
            "hostname": part(socket.gethostname),
            "gpus": part(gpus, options),
            "dmi": part(dmi, root),
            "nics": part(nics, root),
            "cpu_model": part(cpu_model, root),
            "memory_mib": part(memory_mib, root)}


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
