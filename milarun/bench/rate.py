"""Throughput measurement over sample windows.

A *step* processes ``count`` items (``it.set_count(batch_size)``). Steps are
grouped into sample windows of about ``sample_duration`` seconds of host time.
Each window becomes one sample ``{start, end, count, rate, warmup}`` (plus
``loss``, the last loss logged in it, when the test logs one); the first
``warmup`` samples are flagged, never dropped.

Stopping: training stops once ``max_count`` items were processed. With
``min_steady`` > 0 it goes on past that count until the steady state (the
windows after warm-up) covers at least ``min_steady`` seconds, so a fast
machine still gives a long enough steady state. The decision is taken only
when the count target is reached, which is the same step on every rank of a
data-parallel run, and there it is collective (``agree``): every rank gives
its shortfall, and all extend iff the largest is > 0, by that many items.

Counting by hand, time left out: a workload whose items do not come one step at a
time counts them with :meth:`RateLogger.count` as they are done (serving: the tokens
of a batch as they stream), and leaves time out of every window with
:meth:`RateLogger.pause` / :meth:`RateLogger.resume` or ``with logger.paused():``
(serving: a batch's prefill, up to its first token, is in no sample).

Loss against the step: besides the loss at each window's end (a curve against time,
which differs with the machine's speed), the logger keeps ``loss_curve``, the mean of
the losses logged over the steps ``(2^(k-1), 2^k]`` for k = 0, 1, 2, … (steps 1, 2,
3–4, 5–8, …), each point ``{"step": 2^k, "items": items processed by then, "loss"}``.
Its points fall on the same steps whatever the speed, so two runs of one test at one
seed compare step for step (:mod:`milarun.measure.convergence`); the blocks double so
that a run of a million steps has 21 points, each later one averaged over more steps.
The sum is kept as a device tensor and read at the next window boundary, after the
window's sync: no extra host sync.

GPU timing: a timer mark (a CUDA event) is recorded when a window closes,
right after its last step was queued, and the same mark opens the next
window. Because CUDA events complete in stream order, the interval between
two marks is the device time of exactly the steps in between, so the
window's duration comes from the GPU without a host sync on every step; the
only sync is on the closing event, once per window. Recording an event on
every step would measure the same interval at a few µs of host time per step.
"""

import contextlib
import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import torch

# Metric values logged with it.log() may be device tensors; converting them
# calls .item(), so it is done only at a window boundary, after the sync.


class Timer(Protocol):
    """What the rate logger times windows with: ``mark()`` a point, ``elapsed`` seconds."""

    def mark(self) -> Any: ...

    def elapsed(self, start: Any, end: Any) -> float: ...


class PerfCounterTimer:
    """Host wall clock (``time.perf_counter``), for CPU runs and tests."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock

    def mark(self) -> Any:
        """Record a point in time; returns an opaque token."""
        return self.clock()

    def elapsed(self, start: Any, end: Any) -> float:
        """Seconds between two tokens (synchronizes if the timer needs to)."""
        return end - start


class CudaEventTimer:
    """GPU time from CUDA events: one event per window boundary, one sync per window.

    ``elapsed`` synchronizes on the *end* event only, so the host waits once
    per window for the device to reach that window's last step.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = device

    def mark(self) -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def elapsed(self, start: Any, end: Any) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1000.0


class Step:
    """Handle for one training step, yielded by the rate logger's loops.

    Call ``set_count(n)`` with the number of items the step processed and,
    optionally, ``log(loss=tensor_or_float)``.
    """

    __slots__ = ("count", "values")

    def __init__(self) -> None:
        self.count = 0
        self.values: dict[str, Any] | None = None

    def set_count(self, n: int) -> None:
        self.count = int(n)

    def log(self, **values: Any) -> None:
        self.values = values


class RateLogger:
    """Counts items over sample windows and decides when training stops.

    Args:
        sample_duration: target window length in seconds (host time).
        max_count: stop once this many items were processed (items).
        warmup: number of leading samples flagged ``warmup: true``.
        timer: ``PerfCounterTimer`` or ``CudaEventTimer``.
        host_clock: clock that decides when a window closes (seconds).
        origin: host-clock time that sample ``start``/``end`` are relative to.
        min_steady: seconds of steady state to reach before stopping, even
            past ``max_count`` (0: stop at ``max_count``).
        agree: optional ``f(shortfall_items) -> items`` called on every rank
            each time the count target is reached (with ``min_steady`` > 0),
            with this rank's shortfall (items, 0 when its steady state is long
            enough); data-parallel runs reduce it with MAX, and all ranks
            extend iff the result is > 0, so every rank stops on the same step.
        on_sample: optional ``f(sample)`` called with each closed sample
            (the experiment streams it to the launch's journal).
        before_start: optional ``f()`` called once by :meth:`loop` and
            :meth:`steps` when the set-up is over, right before the first window
            opens (the experiment's start barrier, :mod:`milarun.bench.sync`).

    Items come from the steps of :meth:`loop` and :meth:`steps`
    (``step.set_count``) or by hand (:meth:`count`); :meth:`pause` and
    :meth:`resume` (or :meth:`paused`) leave time out of every sample window.

    The ``tracer`` attribute (None, or a :class:`milarun.bench.trace.ProfileTrace`)
    is told of every step (``tracer.step(logger)``) and of the end
    (``tracer.close(logger)``); it cuts windows with :meth:`cut` and
    :meth:`restart` and flags them through ``window_flags``.

    Attributes:
        samples: list of ``{"start", "end", "count", "rate", "warmup"}``
            (seconds since ``origin``, items, items/s).
        total: items counted so far.
        metrics: last values given to ``Step.log``, as floats.
        loss_curve: ``[{"step", "items", "loss"}]``, the mean loss of each closed block
            of steps ``(2^(k-1), 2^k]`` (module docstring), read at window boundaries.
        window_flags: extra fields (e.g. ``{"profiled": True}``) put into every
            sample closed while set.
    """

    def __init__(
        self,
        sample_duration: float = 0.5,
        max_count: int | None = 1000,
        warmup: int = 3,
        timer: Timer | None = None,
        host_clock: Callable[[], float] = time.perf_counter,
        origin: float | None = None,
        min_steady: float = 0.0,
        agree: Callable[[int], int] | None = None,
        on_sample: Callable[[dict[str, Any]], None] | None = None,
        before_start: Callable[[], object] | None = None,
    ) -> None:
        if sample_duration <= 0:
            raise ValueError("sample_duration must be > 0 seconds")
        if min_steady < 0:
            raise ValueError("min_steady must be >= 0 seconds")
        self.sample_duration = sample_duration
        self.max_count = max_count
        self.requested_count = max_count
        self.min_steady = min_steady
        self.agree = agree
        self.on_sample = on_sample
        self.before_start = before_start
        self.warmup = warmup
        self.timer = timer or PerfCounterTimer(host_clock)
        self.host_clock = host_clock
        self.origin = host_clock() if origin is None else origin
        self.samples: list[dict[str, Any]] = []
        self.total = 0
        self.metrics: dict[str, Any] = {}
        self._window_mark: Any = None
        self._window_host = 0.0
        self._window_count = 0
        self._last_values: dict[str, Any] | None = None
        self.window_flags: dict[str, Any] = {}
        self.tracer: Any = None
        self.votes = True
        self._paused = False
        self.loss_curve: list[dict[str, Any]] = []
        self._steps = 0
        self._block_end = 1
        self._loss_sum: Any = None
        self._loss_n = 0
        self._pending: list[tuple[int, int, Any, int]] = []

    def done(self) -> bool:
        """True once ``max_count`` items were processed (``max_count`` may
        have been raised by ``min_steady``)."""
        return self.max_count is not None and self.total >= self.max_count

    def start(self) -> None:
        """Open the first window (called by the loops before the first step)."""
        self._window_mark = self.timer.mark()
        self._window_host = self.host_clock()

    def end_step(self, step: Step) -> None:
        """Account for a finished step; close the window if it is long enough."""
        # Runs once per training step: kept to a few attribute reads (steps of tiny
        # models last ~100 µs; benchmarks/overhead.py measures the cost).
        count = step.count
        self._window_count += count
        self.total += count
        self._steps += 1
        if step.values is not None:
            self._last_values = step.values
            loss = step.values.get("loss")
            if loss is not None:
                self._add_loss(loss)
        if self._steps == self._block_end:
            self._end_block()
        now = self.host_clock()
        finished = (
            self.max_count is not None and self.total >= self.max_count and not self._extend(now)
        )
        if finished or now - self._window_host >= self.sample_duration:
            self._close_window(now)
        if self.tracer is not None:
            self.tracer.step(self)

    def _add_loss(self, loss: Any) -> None:
        """Add one step's loss to the open block's sum (a float32 device tensor, or a
        float): no host sync."""
        if isinstance(loss, torch.Tensor):
            loss = loss.detach().float().reshape(())
        self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
        self._loss_n += 1

    def _end_block(self) -> None:
        """Close the block of steps ending at ``self._steps`` (a power of two): its sum
        waits in ``_pending`` for the next window boundary."""
        if self._loss_n:
            self._pending.append((self._steps, self.total, self._loss_sum, self._loss_n))
        self._loss_sum, self._loss_n = None, 0
        self._block_end *= 2

    def _read_curve(self) -> None:
        """Turn the closed blocks' sums into ``loss_curve`` points (after a sync: the
        window's end, or the run's). A non-finite mean is left out (the NaN-loss check
        of :mod:`milarun.measure.plausibility` fails the record on the window losses)."""
        for step, items, total, n in self._pending:
            mean = _to_float(total) / n
            if isinstance(mean, float) and math.isfinite(mean):
                self.loss_curve.append({"step": step, "items": items, "loss": mean})
        self._pending.clear()

    def count(self, n: int) -> None:
        """Count ``n`` items (items) done now, outside the steps: for a workload whose
        items come one at a time within a step (serving: each token as it streams), so
        that a window closes on time, not at the end of the step. The same as a step
        of ``n`` items ending now: the window closes if it is long enough, the count
        target is checked, the tracer is told.

        Raises:
            RuntimeError: the logger is paused (:meth:`pause`): items done while no
                window is open would have no time to be counted against.
        """
        if self._paused:
            raise RuntimeError("items counted while the rate logger is paused")
        step = Step()
        step.set_count(n)
        self.end_step(step)

    def pause(self) -> None:
        """Leave the time from now until :meth:`resume` out of every sample window
        (seconds that no sample holds: serving's prefill, an evaluation). The open
        window closes now, a sample if it holds items (:meth:`cut`; one that cannot
        close, on a clock that did not move, goes on through the pause instead).

        Raises:
            RuntimeError: already paused.
        """
        if self._paused:
            raise RuntimeError("the rate logger is paused already")
        self.cut()
        self._paused = True

    def resume(self) -> None:
        """Open a new window now, ending the :meth:`pause`.

        Raises:
            RuntimeError: the logger is not paused.
        """
        if not self._paused:
            raise RuntimeError("resume() without pause()")
        self._paused = False
        self.restart()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """``with logger.paused():`` :meth:`pause` on entry, :meth:`resume` on exit: the
        block's time is in no sample window. Raises as :meth:`pause` does."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def cut(self) -> None:
        """Close the open window now, whatever its length (a sample if it holds items)."""
        self._close_window(self.host_clock())

    def restart(self) -> None:
        """Open a new window now: the time since the last :meth:`cut` is in no sample
        (e.g. starting a profiler, writing its trace). A window that could not be
        closed (a clock that did not move) goes on instead, so no item is lost."""
        if self._window_count == 0:
            self._window_mark = self.timer.mark()
            self._window_host = self.host_clock()

    def _extend(self, now: float) -> bool:
        """Raise ``max_count`` if the steady state is shorter than ``min_steady``.

        Called when the count target is reached, which is the same step on
        every rank of a data-parallel run. The missing seconds (plus any
        warm-up windows still to come) are turned into items at the latest
        measured rate, with a 2% margin (the *shortfall*, in items; 0 when the
        steady state is long enough). With ``agree``, the decision itself is
        collective: every rank passes its shortfall, even 0, to ``agree``
        (an all-reduce with MAX), and every rank extends iff the agreed value
        is > 0, by that many items. So no rank can enter the all-reduce while
        another stops (mismatched collectives hang DDP), whatever each
        rank's own clock says. This runs again whenever the new target is
        reached, so a slower rate later only means another extension.
        Returns True if the target was raised.
        """
        if not self.min_steady or self.max_count is None:
            return False
        extra = self._shortfall(now) if self.votes else 0
        if self.agree is not None:
            extra = int(self.agree(extra))
        if extra <= 0:
            return False
        self.max_count = self.total + extra
        return True

    def follow(self) -> None:
        """Make this a follower rank's logger: it only counts items and takes part
        in the stop decision.

        In a data-parallel run only rank 0's samples go into the record, and
        the ranks step in lockstep (the gradient all-reduce), so the other
        ranks need not time: a follower times on the host clock (no device
        sync), closes no window of its own (``sample_duration`` infinite: one
        window over the whole run, its loss read once), and votes a shortfall
        of 0 in ``agree``, so the stop decision is rank 0's, taken from its
        device-timed windows. Call it before the first step.
        """
        self.timer = PerfCounterTimer(self.host_clock)
        self.sample_duration = math.inf
        self.votes = False

    def _shortfall(self, now: float) -> int:
        """Items still needed for ``min_steady`` seconds of steady state (0: none)."""
        if not self.samples:
            # No window measured yet; on a GPU the host clock has only seen
            # the launches, so close one (one sync) to get a real rate.
            self._close_window(now)
        open_s = now - self._window_host
        steady_s = sum(
            s["end"] - s["start"] for s in self.samples if not s["warmup"] and not s.get("profiled")
        )
        if len(self.samples) >= self.warmup and not self.window_flags.get("profiled"):
            steady_s += open_s  # the open window is a steady one
        if steady_s >= self.min_steady:
            return 0
        # The rate of a window shorter than half a sample window is no estimate: the
        # window closed early above may hold one step whose batch was fetched before it
        # opened (the data loop's first batch), which gives millions of items/s and an
        # extension of hours. Without a full window the count doubles instead.
        full = [s for s in self.samples if s["end"] - s["start"] >= self.sample_duration / 2]
        rate = full[-1]["rate"] if full else 0.0
        missing = max(0, self.warmup - len(self.samples)) * self.sample_duration
        seconds = self.min_steady - steady_s + missing
        if math.isfinite(rate) and rate > 0:
            extra = math.ceil(rate * seconds * 1.02)
        else:
            extra = self.total  # no usable rate yet: double the count
        return max(1, extra)

    def _close_window(self, now: float) -> None:
        if self._window_count == 0:
            return
        mark = self.timer.mark()
        elapsed = self.timer.elapsed(self._window_mark, mark)
        if not elapsed > 0:
            return  # a clock that did not move: the window goes on (no infinite rate)
        start = self._window_host - self.origin
        end = start + elapsed
        sample = {
            "start": start,
            "end": end,
            "count": self._window_count,
            "rate": self._window_count / elapsed,
            "warmup": len(self.samples) < self.warmup,
            **self.window_flags,
        }
        if self._pending:
            self._read_curve()
        if self._last_values:
            self.metrics = {k: _to_float(v) for k, v in self._last_values.items()}
            # the loss at the window's end: a loss curve, and milarun.measure.plausibility's NaN
            # check
            if isinstance(self.metrics.get("loss"), float):
                sample["loss"] = self.metrics["loss"]
        self.samples.append(sample)
        if self.on_sample is not None:
            self.on_sample(sample)
        self._window_mark = mark
        self._window_host = now
        self._window_count = 0

    def finish(self) -> None:
        """Close a partial last window, if it holds items."""
        if self._window_mark is not None and self._window_count:
            self._close_window(self.host_clock())
        self._read_curve()
        if self.tracer is not None:
            self.tracer.close(self)

    def begin(self) -> None:
        """The set-up is over: synchronize (``before_start``), then open the first window.
        :meth:`loop` and :meth:`steps` call it; a workload that counts its items by hand
        (:meth:`count`, serving) calls it once before its first item."""
        if self.before_start is not None:
            self.before_start()
        self.start()

    def steps(self) -> Iterator[Step]:
        """Yield ``Step`` objects until ``max_count`` items were processed."""
        self.begin()
        try:
            while not self.done():
                step = Step()
                yield step
                self.end_step(step)
        finally:
            self.finish()

    def loop(self, iterable: Iterable[Any]) -> Iterator[tuple[Step, Any]]:
        """Yield ``(step, batch)`` over ``iterable``, restarting it each epoch,
        until ``max_count`` items were processed.

        The first batch is fetched before the first window opens (loader
        workers started, first batch decoded): that is set-up, done before the
        start barrier, not time measured.

        Raises:
            RuntimeError: if ``iterable`` yields nothing.
        """
        it = iter(iterable)
        head = next(it, _NOTHING)
        self.begin()
        try:
            while not self.done():
                if head is _NOTHING:
                    raise RuntimeError("the data loader yielded no batch")
                for batch in itertools.chain((head,), it):
                    step = Step()
                    yield step, batch
                    self.end_step(step)
                    if self.done():
                        break
                if not self.done():  # a new epoch
                    it = iter(iterable)
                    head = next(it, _NOTHING)
        finally:
            self.finish()

    def summary(self) -> dict[str, Any]:
        """The ``timings.train`` record."""
        return {
            "sample_duration": self.sample_duration,
            "warmup": min(self.warmup, len(self.samples)),
            "count": self.total,
            "max_count": self.requested_count,
            "min_steady": self.min_steady,
            "samples": list(self.samples),
            **({"loss_curve": list(self.loss_curve)} if self.loss_curve else {}),
        }


_NOTHING = object()


def _to_float(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.detach().float().item() if hasattr(v, "detach") else v.item()
    try:
        return float(v)
    except (TypeError, ValueError):
        return v
