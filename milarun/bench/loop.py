"""Training-loop helpers that tie a model to the rate logger and monitor."""

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch.utils.data import DataLoader

from . import device as bench_device
from .rate import RateLogger, Step, _to_float
from .trace import ProfileTrace


class _BareLogger(RateLogger):
    """Counts items with no sample windows: used by ``--no-instrument`` to
    measure the instrumentation's own cost. Records one sample for the run, paused
    time included (``pause`` leaves nothing out of a window it does not have)."""

    def __init__(self, sync: Callable[[], None] | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._sync = sync
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def end_step(self, step: Step) -> None:
        self.total += step.count
        if step.values is not None:
            self._last_values = step.values

    def finish(self) -> None:
        if self._sync is not None:
            self._sync()
        t1 = time.perf_counter()
        if self.total:
            self.samples.append(
                {
                    "start": self._t0 - self.origin,
                    "end": t1 - self.origin,
                    "count": self.total,
                    "rate": self.total / (t1 - self._t0),
                    "warmup": False,
                }
            )
        if self._last_values:
            self.metrics = {k: _to_float(v) for k, v in self._last_values.items()}


def rate_logger(exp: Any) -> RateLogger:
    """Create ``exp.rate`` from the common options and the experiment's device.

    On CUDA the timer is ``CudaEventTimer``, on an Intel XPU ``XpuEventTimer``
    (one sync per window each), else ``PerfCounterTimer``
    (:func:`milarun.bench.device.event_timer`).
    Starts the GPU monitor. With ``--profile-trace`` the logger gets a
    :class:`milarun.bench.trace.ProfileTrace`.

    Raises:
        ValueError: ``--profile-trace`` with ``--no-instrument`` (the trace
            needs the windows), or ``--profile-steps`` out of bounds.
    """
    opts = exp.options
    device = exp.device
    logger: RateLogger
    tracing = opts.get("profile_trace")
    if tracing and opts["no_instrument"]:
        raise ValueError(
            "--profile-trace needs the rate logger's windows: leave out --no-instrument"
        )
    if opts["no_instrument"]:
        logger = _BareLogger(
            bench_device.sync_function(device),
            max_count=opts["max_count"],
            warmup=0,
            origin=exp.origin,
        )
    else:
        timer = bench_device.event_timer(device)
        logger = RateLogger(
            sample_duration=opts["sample_duration"],
            max_count=opts["max_count"],
            warmup=opts["warmup"],
            timer=timer,
            origin=exp.origin,
            min_steady=opts["min_steady"],
        )
    if tracing:
        logger.tracer = ProfileTrace(exp, tracing, opts["profile_steps"])
    exp.attach_rate(logger)
    exp.start_monitor()
    return logger


class Epochs:
    """A ``DataLoader`` with a ``DistributedSampler`` as an endless iterable for
    :func:`dataloop`: every pass calls ``sampler.set_epoch`` first, so each epoch is a
    new shuffle of each rank's share (the sampler repeats its order otherwise).

    Args:
        skip: batches already trained on (a run resumed from a checkpoint): the passes
            start at epoch ``skip // len(loader)`` and its first ``skip % len(loader)``
            batches are read and passed over, so the run goes on with the batches an
            uninterrupted one would have had.
    """

    def __init__(self, loader: DataLoader[Any], skip: int = 0) -> None:
        self.loader = loader
        self.epoch, self._skip = divmod(skip, len(loader)) if skip else (0, 0)

    def __iter__(self) -> Iterator[Any]:
        self.loader.sampler.set_epoch(self.epoch)  # type: ignore[attr-defined]
        self.epoch += 1
        batches = iter(self.loader)
        skip, self._skip = self._skip, 0
        return itertools.islice(batches, skip, None) if skip else batches


def dataloop(exp: Any, iterable: Iterable[Any]) -> Iterator[tuple[Step, Any]]:
    """Yield ``(step, batch)`` over ``iterable`` (epoch after epoch) until
    ``--max-count`` items. Call ``step.set_count(n)`` in the body, or count items as
    they are done with ``exp.rate.count(n)``; ``with exp.rate.paused():`` leaves time
    out of the sample windows (:class:`milarun.bench.rate.RateLogger`).
    """
    return rate_logger(exp).loop(iterable)


def iteration_wrapper(exp: Any) -> Iterator[Step]:
    """Yield ``step`` objects until ``--max-count`` items, for synthetic data."""
    return rate_logger(exp).steps()


__all__ = [
    "Epochs",
    "dataloop",
    "iteration_wrapper",
    "rate_logger",
    "Step",
]
