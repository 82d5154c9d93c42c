"""Torch set-up inside the child: seed, device, threads, precision."""

import contextlib
import os
import random
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import torch

from ..host.isolation import current_cpuset
from .device import is_cuda, is_xpu, kind, peak_memory_mib
from .options import PRECISIONS  # the choices of --precision live with the option


def init_torch(exp: Any) -> torch.device:
    """Seed every RNG, pick the device and set the thread count.

    On CUDA it also turns on ``torch.backends.cudnn.benchmark``. ``--device auto``
    is the CPU in a CPU slot (``$MILARUN_BACKEND`` ``cpu``), else CUDA, XPU, CPU.

    The thread count is the size of the cpuset the child runs in (its student
    slice), so a 4-core student uses 4 threads rather than every core.

    Returns:
        ``torch.device``. Also stored as ``exp.device``.

    Raises:
        RuntimeError: ``--device cuda`` on a host without CUDA.
    """
    opts = exp.options
    seed = opts["seed"]
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    threads = max(1, len(current_cpuset()))
    torch.set_num_threads(threads)
    check_device()
    want = opts["device"]
    if want == "auto" and os.environ.get("MILARUN_BACKEND") == "cpu":
        want = "cpu"  # a CPU slot: an XPU (ZE_AFFINITY_MASK="" hides nothing) stays unused
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "xpu" if _xpu() else "cpu"
    if is_xpu(want) and not _xpu():
        raise WrongDevice("--device xpu was asked for but torch has no usable XPU")
    if is_cuda(want):
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda was asked for but CUDA is not available")
        torch.cuda.manual_seed_all(seed)
        # Input shapes are fixed (drop_last), so cuDNN's autotuning runs once,
        # inside the warm-up windows, and the steady state uses the best kernels.
        torch.backends.cudnn.benchmark = True
        exp.result["host"]["cudnn_benchmark"] = True
    device = torch.device(want)
    exp.device = device
    exp.result["host"]["threads"] = threads
    exp.result["host"]["device_type"] = kind(device)
    return device


class WrongDevice(RuntimeError):
    """torch cannot use the device the launcher gave this child: a FAIL record with reason
    ``wrong-device`` (the launcher's backend and torch's build disagree, or the device
    torch sees is not the one named)."""

    fail_reason = "wrong-device"


def _xpu() -> bool:
    """torch has a usable XPU (``torch.xpu.is_available()``; False where it raises or this
    torch has no ``torch.xpu``)."""
    xpu = getattr(torch, "xpu", None)
    try:
        return bool(xpu is not None and xpu.is_available())
    except Exception:
        return False


def check_device(environ: Mapping[str, str] | None = None) -> None:
    """Check that torch can use the device the launcher gave (``$MILARUN_BACKEND``,
    ``$MILARUN_PCI_BUS_ID``; no check without them, as for CPU slots).

    * ``nvidia``: a CUDA build (``torch.version.cuda``) that sees a GPU;
    * ``amd``: a ROCm build (``torch.version.hip``) that sees a GPU;
    * ``intel``: ``torch.xpu`` available;
    * with a PCI bus id ``dddd:bb:dd.f``, device 0's domain, bus and device
      numbers (``get_device_properties(0)``'s ``pci_domain_id``, ``pci_bus_id``,
      ``pci_device_id``, where torch exposes them) must be that one's.

    Raises:
        WrongDevice: any of these fails.
    """
    environ = os.environ if environ is None else environ
    backend = environ.get("MILARUN_BACKEND")
    if backend in (None, "", "cpu"):
        return
    version = getattr(torch, "version", None)
    if backend == "intel":
        if not _xpu():
            raise WrongDevice(
                "the launcher gave an Intel GPU (ZE_AFFINITY_MASK="
                f"{environ.get('ZE_AFFINITY_MASK')!r}) but torch has no usable "
                "XPU: install torch's XPU build (docs/vendors.md)"
            )
        return
    build = {"nvidia": ("cuda", "CUDA"), "amd": ("hip", "ROCm")}.get(backend)
    if build is None:
        raise WrongDevice(f"unknown device backend {backend!r} ($MILARUN_BACKEND)")
    attr, label = build
    if not getattr(version, attr, None):
        raise WrongDevice(
            f"the launcher gave an {backend.upper()} GPU but this torch "
            f"({getattr(torch, '__version__', '?')}) is not a {label} build "
            "(docs/vendors.md)"
        )
    if not torch.cuda.is_available():
        raise WrongDevice(
            f"the launcher gave a {backend.upper()} GPU but torch sees none "
            "(driver, visibility variables or permissions)"
        )
    want = environ.get("MILARUN_PCI_BUS_ID")
    if want:
        props = torch.cuda.get_device_properties(0)
        got = tuple(getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device"))
        try:
            domain, bus, dev = want.split(":")
            expected = (int(domain, 16), int(bus, 16), int(dev.split(".")[0], 16))
        except ValueError:
            expected = None
        if expected and all(isinstance(g, int) for g in got) and got != expected:
            raise WrongDevice(
                f"torch's device 0 is PCI {got[0]:04x}:{got[1]:02x}:{got[2]:02x}, "
                f"not the {want} the launcher gave: the backend's and the "
                "runtime's device orders differ"
            )


def set_precision(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    """Configure matmul precision and return an autocast context for ``precision``.

    ``fp32``: strict fp32: TF32 off for matmuls and for cuDNN convolutions (PyTorch's
    default leaves cuDNN's on; docs/measurement.md says why). ``tf32``: TF32 matmuls and
    convolutions.
    ``fp16`` / ``bf16``: ``torch.autocast`` to that dtype (CPU autocast
    supports bf16 and fp16 on recent torch).

    Raises:
        ValueError: an unknown precision name.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    if precision in ("fp16", "bf16"):
        dtype = torch.float16 if precision == "fp16" else torch.bfloat16
        return torch.autocast(device_type=device.type, dtype=dtype)
    return contextlib.nullcontext()


def dataloader_workers(
    requested: int, local_size: int | None = None, environ: Mapping[str, str] | None = None
) -> int:
    """DataLoader worker processes for this process: ``requested`` when >= 0, else this
    process's share of the student's cpuset minus one (one core of the share runs the
    process itself): ``len(cpuset) // local_size - 1``, at least 0.

    Args:
        requested: ``--workers`` (negative: the share, as ``bench/options.py`` documents).
        local_size: processes on this node that split the cpuset; None: torchrun's
            ``LOCAL_WORLD_SIZE`` (else ``WORLD_SIZE``, else 1), so every rank of a
            node gets its own share and not the whole cpuset.
        environ: the environment to read ``local_size`` from (``os.environ``).

    Returns:
        the worker count (int >= 0).
    """
    if requested >= 0:
        return requested
    if local_size is None:
        local_size = local_world_size(environ)
    return max(0, len(current_cpuset()) // max(1, int(local_size)) - 1)


def local_world_size(environ: Mapping[str, str] | None = None) -> int:
    """Processes on this node: torchrun's ``LOCAL_WORLD_SIZE``, else ``WORLD_SIZE``, else 1
    (:meth:`milarun.bench.distributed.World.from_environment` reads them the same way)."""
    environ = os.environ if environ is None else environ
    for var in ("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        value = environ.get(var, "")
        if value:
            return max(1, int(value))
    return 1


def data_loader(
    dataset: Any, batch_size: int, workers: int, device: torch.device | None, **kwargs: Any
) -> torch.utils.data.DataLoader[Any]:
    """A ``torch.utils.data.DataLoader`` with the settings every test shares.

    Shuffled batches of ``batch_size`` items, the last partial batch dropped
    (so every step counts the same number of items), ``workers`` worker
    processes (negative: this process's share of the cpuset,
    :func:`dataloader_workers`) kept alive across epochs, and pinned host memory
    on CUDA for non-blocking copies. With a
    ``batch_sampler`` in ``kwargs``, the sampler decides the batches instead.
    """
    nworkers = dataloader_workers(workers)
    if "batch_sampler" not in kwargs:
        kwargs = {"batch_size": batch_size, "shuffle": True, "drop_last": True, **kwargs}
    return torch.utils.data.DataLoader(
        dataset,
        num_workers=nworkers,
        persistent_workers=nworkers > 0,
        pin_memory=is_cuda(device),
        **kwargs,
    )


class Ranks(Protocol):
    """What :func:`rank_loader` reads of a :class:`milarun.bench.distributed.World` (named
    by its attributes: distributed.py imports this module)."""

    @property
    def size(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def local_size(self) -> int: ...


def rank_loader(
    dataset: Any,
    batch_size: int,
    workers: int,
    device: torch.device | None,
    world: Ranks,
    seed: int,
    what: str,
    hint: str = "",
    source: object = None,
) -> torch.utils.data.DataLoader[Any]:
    """:func:`data_loader` over this rank's share of ``dataset``.

    A ``DistributedSampler`` (shuffled with ``seed``, the uneven tail dropped) gives
    each of ``world.size`` ranks (``world``: :class:`milarun.bench.distributed.World`)
    the same number of batches, so data-parallel ranks step together. The tail is
    dropped rather than padded with repeated items: every item a step counts is a
    distinct one, and at most ``world.size - 1`` items an epoch are left out.
    ``workers`` < 0 is this rank's share of the node's cpuset
    (:func:`dataloader_workers` over ``world.local_size`` ranks).

    Raises:
        ValueError: the share holds no full batch (:func:`need_a_batch`, with ``what``,
            ``hint`` and ``source``).
    """
    sampler: torch.utils.data.DistributedSampler[Any] = torch.utils.data.DistributedSampler(
        dataset, num_replicas=world.size, rank=world.rank, shuffle=True, seed=seed, drop_last=True
    )
    workers = dataloader_workers(workers, world.local_size)
    loader = data_loader(dataset, batch_size, workers, device, sampler=sampler, shuffle=False)
    need_a_batch(len(loader) > 0, len(dataset), what, batch_size, world.size, hint, source)
    return loader


def need_a_batch(
    enough: bool,
    items: int,
    what: str,
    batch_size: int,
    ranks: int,
    hint: str = "",
    source: object = None,
) -> None:
    """Refuse a data set too small for one batch on every rank.

    Raises:
        ValueError: when ``enough`` is false, as ``"[source: ]<items> <what> give no
            batch of <batch_size> per rank over <ranks> ranks[; hint]"``.
    """
    if not enough:
        where = f"{source}: " if source is not None else ""
        tail = f"; {hint}" if hint else ""
        raise ValueError(
            f"{where}{items} {what} give no batch of {batch_size} per rank over {ranks} ranks{tail}"
        )


__all__ = [
    "init_torch",
    "set_precision",
    "peak_memory_mib",
    "dataloader_workers",
    "local_world_size",
    "data_loader",
    "rank_loader",
    "need_a_batch",
    "PRECISIONS",
]
