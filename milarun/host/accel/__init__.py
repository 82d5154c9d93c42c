"""Device backends per GPU vendor (see :mod:`milarun.host.accel.base`). No torch.

:data:`BACKENDS` lists them in the order discovery tries them; each module is
imported only when asked for, so a vendor library that is missing or broken
only disables its backend.
"""

from ...formats import entrypoint

#: name -> "module:class", in discovery order.
BACKENDS = {
    "nvidia": "milarun.host.accel.nvidia:NvidiaBackend",
    "amd": "milarun.host.accel.amd:AMDBackend",
    "intel": "milarun.host.accel.intel:IntelBackend",
    "cpu": "milarun.host.accel.cpu:CPUBackend",
}

#: the vendor each GPU backend serves (what the probe reports)
VENDOR_OF = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel"}

#: the GPU backends, in discovery order (the one place that order is written is
#: :data:`BACKENDS`)
GPU_BACKENDS = tuple(name for name in BACKENDS if name in VENDOR_OF)


def get(name, **kwargs):
    """A new backend object by name.

    Raises:
        KeyError: an unknown backend name.
    """
    return entrypoint.load(BACKENDS[name], "class")(**kwargs)
