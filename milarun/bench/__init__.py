"""In-child instrumentation: the only package (with models/) that imports torch.

Typical model::

    from coleo import Option, default, tooled
    from milarun.bench import dataloop, init_torch
    from milarun.bench.options import lr_option

    def main(exp, argv):
        exp.cli(train, argv)

    @tooled
    def train(exp):
        # Width of the hidden layer
        hidden: Option & int = default(64)
        lr = lr_option(default=0.01)   # --lr, shared (bench/options.py)
        device = init_torch(exp)
        ...
        for step, (x, y) in dataloop(exp, loader):
            ...
            step.set_count(len(x))
            step.log(loss=loss)   # a tensor is fine: read once per window

The device helper (kind, ``torch.cuda``/``torch.xpu``, synchronize, timing events) is
:mod:`milarun.bench.device`; a workload's module declares what its loss must do with
``NO_LOSS = "why"`` or ``LOSS_MUST_FALL = "why"``
(:func:`milarun.bench.experiment.loss_declaration`).
"""

import warnings

# coleo's code registry (codefind, at the first @tooled) walks every live object once; with
# torch imported, it touches the deprecated torch.distributed.reduce_op, whose FutureWarning
# would be printed on every run. Our code never uses it.
warnings.filterwarnings(
    "ignore", message=r"`torch\.distributed\.reduce_op` is deprecated", category=FutureWarning
)

from .experiment import Experiment  # noqa: E402 (after the filter)
from .loop import Epochs, dataloop, iteration_wrapper, rate_logger  # noqa: E402 (after the filter)
from .rate import RateLogger  # noqa: E402 (after the filter)
from .setup import (  # noqa: E402 (after the filter)
    data_loader,
    dataloader_workers,
    init_torch,
    need_a_batch,
    peak_memory_mib,
    rank_loader,
    set_precision,
)

__all__ = [
    "Experiment",
    "Epochs",
    "dataloop",
    "iteration_wrapper",
    "rate_logger",
    "RateLogger",
    "init_torch",
    "set_precision",
    "peak_memory_mib",
    "dataloader_workers",
    "data_loader",
    "rank_loader",
    "need_a_batch",
]
