"""One training step for every workload: autocast, the gradient scaler and fused optimizers.

A workload builds its optimizer with :func:`make_optimizer` and one
:class:`MixedPrecisionStep`, and writes its step as::

    mp = MixedPrecisionStep(device, precision)      # also sets TF32 (set_precision)
    optimizer = make_optimizer("SGD", net.parameters(), device, lr=lr, momentum=0.9)
    for step, batch in dataloop(exp, loader):
        optimizer.zero_grad(set_to_none=True)
        with mp.autocast:
            loss = ...
        mp(loss, optimizer)                          # backward, (unscale, clip,) step, update

Why fused optimizers: with fp16 the gradient scaler must skip the step when
a gradient overflowed. For an ordinary optimizer it learns that with
``found_inf.item()`` (``torch/amp/grad_scaler.py``, ``_maybe_opt_step``): the
host waits for the device every step, so the next step's kernels are not
queued while this one runs. A fused optimizer (``fused=True``) takes the scale
and the overflow flag as tensors and skips the update on the device
(``_step_supports_amp_scaling``): no host sync. Fused kernels also apply the
whole update in one launch per parameter group, the fastest form torch has.

Where: on CUDA and XPU (:data:`FUSED_DEVICE_TYPES`). torch 2.13 also has
fused SGD/Adam/AdamW on the CPU, but milarun keeps torch's default there: the
scaler is off on the CPU (nothing to save), and the CPU profile's numbers stay
comparable with records made before.
"""

import contextlib
import math
from collections.abc import Iterable
from typing import Any

import torch

from .device import ACCELERATORS, Device, kind
from .setup import set_precision

#: Device types whose optimizers are built with ``fused=True``.
FUSED_DEVICE_TYPES = ACCELERATORS
#: Device types on which ``--precision fp16`` turns the gradient scaler on.
SCALER_DEVICE_TYPES = ACCELERATORS


def make_optimizer(
    name: str, params: Iterable[Any], device: Device, **kwargs: Any
) -> torch.optim.Optimizer:
    """``torch.optim.<name>(params, **kwargs)``, fused on the devices that have fused kernels.

    Args:
        name: ``"SGD"``, ``"Adam"`` or ``"AdamW"`` (any ``torch.optim`` class
            that takes ``fused``).
        params: parameters or parameter groups.
        device: the ``torch.device`` the parameters live on; ``fused=True`` is
            added when its type is in :data:`FUSED_DEVICE_TYPES`.
        kwargs: the optimizer's own arguments (learning rate, momentum, ...).

    Returns:
        the optimizer.
    """
    cls = getattr(torch.optim, name)
    if kind(device) in FUSED_DEVICE_TYPES:
        kwargs = {**kwargs, "fused": True}
    return cls(params, **kwargs)


class MixedPrecisionStep:
    """Autocast, gradient scaling and the optimizer step of ``--precision``.

    Args:
        device: the ``torch.device`` of the model.
        precision: ``fp32``, ``tf32``, ``fp16`` or ``bf16``
            (:func:`milarun.bench.setup.set_precision` sets the matmul
            precision and gives the autocast context).
        enabled_scaler: force the gradient scaler on or off (tests); None: on
            for fp16 on :data:`SCALER_DEVICE_TYPES`.

    Attributes:
        autocast: the context manager to run the forward pass and the loss in.
        scaler: the ``torch.amp.GradScaler`` (disabled: a pass-through).
    """

    def __init__(
        self, device: torch.device, precision: str, enabled_scaler: bool | None = None
    ) -> None:
        self.autocast = set_precision(device, precision)
        if enabled_scaler is None:
            enabled_scaler = precision == "fp16" and kind(device) in SCALER_DEVICE_TYPES
        self.scaler = torch.amp.GradScaler(device.type, enabled=enabled_scaler)

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss`` (scaled when the scaler is on)."""
        self.scaler.scale(loss).backward()

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        clip_norm: float | None = None,
        params: Iterable[torch.Tensor] | None = None,
    ) -> None:
        """Step ``optimizer`` on the gradients of :meth:`backward`; call :meth:`update` after.

        Args:
            optimizer: the optimizer.
            clip_norm: clip the gradients' total 2-norm to this value first
                (``clip_grad_norm_``, on unscaled gradients); None: no clipping.
            params: the parameters to clip (required with ``clip_norm``).
        """
        if clip_norm is not None:
            if params is None:
                raise ValueError("clip_norm needs the parameters to clip (params)")
            self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, clip_norm)
        self.scaler.step(optimizer)

    def update(self) -> None:
        """Update the scale, once per iteration after every optimizer's :meth:`step`."""
        self.scaler.update()

    def __call__(
        self,
        loss: torch.Tensor,
        optimizer: torch.optim.Optimizer,
        clip_norm: float | None = None,
        params: Iterable[torch.Tensor] | None = None,
    ) -> None:
        """:meth:`backward`, :meth:`step` and :meth:`update` for one loss and one optimizer."""
        self.backward(loss)
        self.step(optimizer, clip_norm=clip_norm, params=params)
        self.update()


def gradient_sync(net: object, micro: int, accum: int) -> contextlib.AbstractContextManager[Any]:
    """The context to run micro-batch ``micro`` (0-based, counted over the run) of a
    gradient accumulation over ``accum`` micro-batches in, forward and backward.

    On all but the last micro-batch of each group, ``net.no_sync()`` where ``net`` has
    one (``DistributedDataParallel``): the gradients accumulate locally and are
    all-reduced once, in the last micro-batch's backward, as
    ``torch.nn.parallel.DistributedDataParallel.no_sync`` documents. Elsewhere (the last
    micro-batch, ``accum`` 1, a model not wrapped in DDP) a context that does nothing.
    """
    last = (micro + 1) % accum == 0
    no_sync = getattr(net, "no_sync", None)
    if last or no_sync is None:
        return contextlib.nullcontext()
    return no_sync()


#: Warm-up length of :func:`warmup_cosine`, as a fraction of the run's optimizer steps.
WARMUP_FRACTION = 0.1
#: Learning rate at the end of the cosine decay, as a fraction of the peak (Llama 2's
#: 10 %: Touvron et al. 2023, "Llama 2", section 2.2).
FINAL_LR_FRACTION = 0.1


def warmup_cosine_factor(
    step: int, warmup: int, total: int, final: float = FINAL_LR_FRACTION
) -> float:
    """The learning rate of optimizer step ``step`` (0-based) as a fraction of the peak.

    Linear warm-up over the first ``warmup`` steps, ``(step + 1) / warmup`` (so the first
    step does not have a zero rate), then a cosine decay from 1 to ``final`` over the
    steps up to ``total`` (Loshchilov and Hutter 2017, "SGDR", eq. 5, without restarts):
    ``final + (1 - final) * (1 + cos(pi * p)) / 2`` with ``p = (step - warmup) /
    (total - warmup)``; ``final`` after ``total`` (a run that goes on past its count
    for ``--min-steady``).

    Args:
        step: the optimizer step, >= 0.
        warmup: warm-up steps, >= 0.
        total: the run's optimizer steps, warm-up included.
        final: the fraction reached at ``total``.

    Returns:
        a float in ``(0, 1]``.
    """
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_cosine(
    optimizer: torch.optim.Optimizer, total: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``torch.optim.lr_scheduler.LambdaLR`` over ``optimizer`` that follows
    :func:`warmup_cosine_factor` times each group's learning rate (the peak), with a
    warm-up of :data:`WARMUP_FRACTION` of ``total`` steps (at least 1). Call its
    ``step()`` after each optimizer step.

    Args:
        optimizer: the optimizer, built with the peak learning rate.
        total: the run's optimizer steps (>= 1).

    Returns:
        the scheduler.
    """
    total = max(1, int(total))
    warmup = max(1, int(total * WARMUP_FRACTION))
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine_factor(step, warmup, total)
    )


__all__ = [
    "FUSED_DEVICE_TYPES",
    "SCALER_DEVICE_TYPES",
    "make_optimizer",
    "MixedPrecisionStep",
    "gradient_sync",
    "warmup_cosine",
    "warmup_cosine_factor",
]
