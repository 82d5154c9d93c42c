"""Torch set-up inside the child: seed, device, threads, precision."""

import contextlib
import os
import random

from ..isolation import current_cpuset

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


def init_torch(exp):
    """Seed every RNG, pick the device and set the thread count.

    On CUDA it also turns on ``torch.backends.cudnn.benchmark``.

    The thread count is the size of the cpuset the child runs in (its student
    slice), so a 4-core student uses 4 threads rather than every core.

    Returns:
        ``torch.device``. Also stored as ``exp.device``.

    Raises:
        RuntimeError: ``--device cuda`` on a host without CUDA.
    """
    import numpy as np
    import torch

    opts = exp.options
    seed = opts["seed"]
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    threads = max(1, len(current_cpuset()))
    torch.set_num_threads(threads)
    want = opts["device"]
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
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
    exp.result["host"]["device_type"] = device.type
    return device


def set_precision(device, precision):
    """Configure matmul precision and return an autocast context for ``precision``.

    ``fp32``: strict fp32 (TF32 off). ``tf32``: TF32 matmuls and convolutions.
    ``fp16`` / ``bf16``: ``torch.autocast`` to that dtype (CPU autocast
    supports bf16 and fp16 on recent torch).

    Raises:
        ValueError: an unknown precision name.
    """
    import torch

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


def grad_scaler(device, precision):
    """A ``torch.amp.GradScaler``, enabled only for fp16 on CUDA."""
    import torch

    return torch.amp.GradScaler(device.type, enabled=(precision == "fp16" and device.type == "cuda"))


def synchronize(device):
    """Wait for queued work on ``device`` (no-op on CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_mib(device):
    """Peak accelerator memory (MiB) on CUDA, else the process's peak RSS (MiB)."""
    import torch

    if device is not None and device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def dataloader_workers(requested):
    """Loader workers: ``requested``, or the cpuset size minus one when negative."""
    if requested >= 0:
        return requested
    return max(0, len(current_cpuset()) - 1)


def data_loader(dataset, batch_size, workers, device, **kwargs):
    """A ``torch.utils.data.DataLoader`` with the settings every test shares.

    Shuffled batches of ``batch_size`` items, the last partial batch dropped
    (so every step counts the same number of items), ``workers`` worker
    processes (negative: the student's cpuset size minus one) kept alive across
    epochs, and pinned host memory on CUDA for non-blocking copies. With a
    ``batch_sampler`` in ``kwargs``, the sampler decides the batches instead.
    """
    import torch

    nworkers = dataloader_workers(workers)
    if "batch_sampler" not in kwargs:
        kwargs = {"batch_size": batch_size, "shuffle": True, "drop_last": True, **kwargs}
    return torch.utils.data.DataLoader(
        dataset, num_workers=nworkers, persistent_workers=nworkers > 0,
        pin_memory=device.type == "cuda", **kwargs)


__all__ = ["init_torch", "set_precision", "grad_scaler", "synchronize",
           "peak_memory_mib", "dataloader_workers", "data_loader", "PRECISIONS"]
