"""The device helper: what kind a ``torch.device`` is, its torch backend module, waiting
for it, and timing it with its events. Every device-kind test of ``bench/`` and
``models/`` goes through here.

Kinds: ``"cuda"`` (NVIDIA, and AMD through ROCm's CUDA API), ``"xpu"`` (Intel GPUs,
``torch.xpu``), ``"cpu"``. ``torch.cuda`` and ``torch.xpu`` have the same ``Event``,
``Stream``, ``synchronize``, ``get_device_name`` and ``max_memory_allocated``, so a
GPU path is written once against :func:`module`'s result.

The backend module is looked up on ``torch`` at each call (``getattr(torch, kind)``),
so a test can stand a fake in for ``torch.xpu``.
"""

import resource
from collections.abc import Callable
from typing import Any

import torch

from .rate import CudaEventTimer, PerfCounterTimer

#: Device kinds with a torch backend module, asynchronous kernels and timing events.
ACCELERATORS = ("cuda", "xpu")


#: What the helpers take for a device: a ``torch.device``, a kind string, or None.
Device = torch.device | str | None


def kind(device: Device) -> str | None:
    """The device's kind: ``device.type`` (``"cuda"``, ``"xpu"``, ``"cpu"``, ...).

    Args:
        device: a ``torch.device``, a kind string (returned as is) or None.

    Returns:
        the kind string, or None for ``device`` None.
    """
    if device is None or isinstance(device, str):
        return device
    return str(device.type)


def is_cuda(device: Device) -> bool:
    """True on a CUDA device (NVIDIA, or AMD through ROCm)."""
    return kind(device) == "cuda"


def is_xpu(device: Device) -> bool:
    """True on an Intel XPU."""
    return kind(device) == "xpu"


def is_accelerator(device: Device) -> bool:
    """True on a device of :data:`ACCELERATORS` (queued kernels, events, a backend module)."""
    return kind(device) in ACCELERATORS


def module(device: Device) -> Any:
    """``torch.cuda`` or ``torch.xpu`` for an accelerator ``device``, None on the CPU (or
    where this torch has no such module).

    Args:
        device: a ``torch.device`` (or a kind string, or None).
    """
    k = kind(device)
    return getattr(torch, k, None) if k in ACCELERATORS else None


def synchronize(device: Device) -> None:
    """Wait for the work queued on ``device``; nothing to wait for on the CPU."""
    api = module(device)
    if api is not None:
        api.synchronize(device)


def sync_function(device: Device) -> Callable[[], None] | None:
    """``f()`` that waits for ``device``'s queued work (:func:`synchronize`), or None on
    the CPU (nothing is queued there)."""
    if module(device) is None:
        return None
    return lambda: synchronize(device)


class XpuEventTimer(CudaEventTimer):
    """Intel GPU time from ``torch.xpu.Event``: one event per window boundary, one sync
    per window (``elapsed`` waits for the window's end event), as
    :class:`~milarun.bench.rate.CudaEventTimer` does on CUDA. Seconds."""

    def mark(self) -> Any:
        ev = torch.xpu.Event(enable_timing=True)
        ev.record()
        return ev


def event_timer(device: Device) -> CudaEventTimer | PerfCounterTimer:
    """The rate logger's window timer for ``device``: CUDA or XPU events on those GPUs
    (they time the device's work, not its queueing), the host clock elsewhere."""
    if is_cuda(device):
        return CudaEventTimer(device)
    if is_xpu(device):
        return XpuEventTimer(device)
    return PerfCounterTimer()


def name(device: Device) -> str | None:
    """The accelerator's marketing name (``get_device_name``), or None on the CPU."""
    api = module(device)
    return api.get_device_name(device) if api is not None else None


def peak_memory_mib(device: Device) -> float:
    """Peak memory (MiB): the accelerator's ``max_memory_allocated`` on CUDA or XPU, else
    the process's peak resident set (``ru_maxrss``, KiB on Linux)."""
    api = module(device)
    if api is not None:
        return api.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


__all__ = [
    "ACCELERATORS",
    "Device",
    "kind",
    "is_cuda",
    "is_xpu",
    "is_accelerator",
    "module",
    "synchronize",
    "sync_function",
    "XpuEventTimer",
    "event_timer",
    "name",
    "peak_memory_mib",
]
