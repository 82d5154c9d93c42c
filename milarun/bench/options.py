"""Options every experiment accepts, and the options many workloads share (declared with coleo).

:func:`common_options` holds the options every experiment accepts (``milarun.bench``
adds them to each workload's command line; their defaults are those of the child
protocol, :data:`milarun.formats.child.COMMON_DEFAULTS`). The other functions declare one option
each that several workloads take, with one help text and one rule, and the workload's
own default::

    from coleo import Option, default, tooled
    from milarun.bench.options import (batch_size_option, lr_option, precision_option,
                                       workers_option)

    @tooled
    def train(exp):
        # Width of the hidden layers (the workload's own options, as before)
        hidden: Option & int = default(512)
        batch_size = batch_size_option(default=64)   # --batch-size
        lr = lr_option(default=1e-3)                 # --lr
        precision = precision_option(default="fp32") # --precision, checked here
        workers = workers_option(default=-1)         # --workers (-1: see below)

Each helper is a coleo-tooled function: coleo finds its option because the workload's
tooled function names it (import it by name, as above, not as ``options.lr_option``),
and ``--lr 0.5`` on the command line replaces the default wherever the helper is
called. Called outside a coleo CLI, a helper returns its default (and
:func:`precision_option` still checks it).
"""

from collections.abc import Sequence
from typing import Any

from coleo import Option, default, tooled

from ..formats.child import COMMON_DEFAULTS as _DEFAULTS

#: ``--precision`` of a training workload (``milarun.bench.setup.set_precision``,
#: ``milarun.bench.step.MixedPrecisionStep``).
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
#: ``--precision`` of an inference workload: weights and inputs cast to that dtype
#: (no TF32 mode: an fp32 inference is strict fp32).
INFERENCE_PRECISIONS = ("fp32", "fp16", "bf16")


@tooled
def common_options() -> dict[str, Any]:
    """Return the options shared by all models as a dict.

    ``max_count`` (items), ``min_steady`` (s), ``sample_duration`` (s), ``warmup`` (windows),
    ``seed``, ``device`` (``auto``, ``cpu``, ``cuda`` or ``xpu``), ``monitor_interval`` (s),
    ``no_instrument``, ``profile_trace`` (folder or None), ``profile_steps`` (steps).
    """
    # Stop after this many items (examples) have been processed
    max_count: Option & int = default(_DEFAULTS["max_count"])
    # Keep training past max-count until the steady state lasts this many seconds (0: off; not with
    # --no-instrument)
    min_steady: Option & float = default(_DEFAULTS["min_steady"])
    # Length of one sample window, in seconds
    sample_duration: Option & float = default(_DEFAULTS["sample_duration"])
    # Number of leading sample windows flagged as warm-up
    warmup: Option & int = default(_DEFAULTS["warmup"])
    # Random seed of run 0; run r of a test runs at seed + r
    seed: Option & int = default(_DEFAULTS["seed"])
    # Device: auto (cuda, else xpu, when available), cpu, cuda or xpu
    device: Option = default(_DEFAULTS["device"])
    # Seconds between two GPU telemetry readings
    monitor_interval: Option & float = default(_DEFAULTS["monitor_interval"])
    # Disable the rate logger's windows and the GPU monitor (for overhead checks)
    no_instrument: Option & bool = default(_DEFAULTS["no_instrument"])
    # Write a torch.profiler Chrome trace of a few steady-state steps into this folder (relative:
    # inside the results folder); those samples leave the steady state
    profile_trace: Option = default(_DEFAULTS["profile_trace"])
    # Steps that --profile-trace records (1 to 1000)
    profile_steps: Option & int = default(_DEFAULTS["profile_steps"])
    return {
        "max_count": max_count,
        "min_steady": min_steady,
        "sample_duration": sample_duration,
        "warmup": warmup,
        "seed": seed,
        "device": device,
        "monitor_interval": monitor_interval,
        "no_instrument": no_instrument,
        "profile_trace": profile_trace,
        "profile_steps": profile_steps,
    }


# The helpers below take their default as an argument named ``default``, which hides
# coleo's ``default()`` inside them: an Option's value is its plain default there
# (coleo's ``default(x)`` is ``x``).


@tooled
def lr_option(default: float) -> float:
    """``--lr``: the learning rate (float), ``default`` unless given."""
    # Learning rate of the optimizer (with a schedule: its peak or initial value)
    lr: Option & float = default
    return lr


@tooled
def batch_size_option(default: int) -> int:
    """``--batch-size``: the examples per batch (int), ``default`` unless given."""
    # Examples per batch: images, patches, sequences, sentence pairs... (per rank under DDP, per
    # device for inference)
    batch_size: Option & int = default
    return batch_size


@tooled
def workers_option(default: int = -1) -> int:
    """``--workers``: the ``DataLoader`` worker processes (int), ``default`` unless given.

    Returned as given: a negative value means "this process's share of the student's
    cpuset, minus one" (one process: the cpuset minus one; a torchrun rank: the node's
    cpuset divided by its ``LOCAL_WORLD_SIZE`` ranks, minus one), which
    :func:`milarun.bench.setup.dataloader_workers` resolves for every loader the harness
    builds (``data_loader``, ``rank_loader``).
    """
    # DataLoader worker processes (-1: this process's share of the student's cpuset, minus one; 0:
    # load in the main process)
    workers: Option & int = default
    return workers


@tooled
def backend_option(default: str = "auto") -> str:
    """``--backend``: the process-group backend of a distributed workload (str),
    ``default`` unless given; ``auto`` is nccl on CUDA, gloo on the CPU
    (:func:`milarun.bench.distributed.process_group`)."""
    # Process-group backend: auto (nccl on CUDA, gloo on CPU), nccl or gloo
    backend: Option = default
    return backend


@tooled
def precision_option(default: str = "fp32", choices: Sequence[str] = PRECISIONS) -> str:
    """``--precision``, checked against ``choices``.

    Args:
        default: the workload's default precision.
        choices: :data:`PRECISIONS` for training (the default),
            :data:`INFERENCE_PRECISIONS` for inference.

    Returns:
        the precision name, one of ``choices``.

    Raises:
        ValueError: the precision is not one of ``choices`` (the run's failure
            record says so).
    """
    # Arithmetic: fp32, tf32 (TF32 matmuls and convolutions), fp16 (autocast, plus a gradient scaler
    # on CUDA and XPU) or bf16 (autocast); inference takes fp32, fp16 or bf16 (weights and inputs
    # cast)
    precision: Option = default
    if precision not in choices:
        raise ValueError(f"--precision must be one of {', '.join(choices)}, not {precision!r}")
    return precision


__all__ = [
    "common_options",
    "lr_option",
    "batch_size_option",
    "workers_option",
    "precision_option",
    "backend_option",
    "PRECISIONS",
    "INFERENCE_PRECISIONS",
]
