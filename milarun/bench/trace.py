"""``--profile-trace DIR``: a ``torch.profiler`` Chrome trace of a few steady-state steps.

Any test can be profiled, because the rate logger drives the profiler: once
the warm-up windows are closed, the open window is cut, the profiler starts
(CPU activities, plus CUDA on a CUDA device) and the next ``--profile-steps``
steps run under it, each in a ``record_function`` range named ``milarun step
N``. Then the window is cut again, the profiler stops and writes its trace
(``export_chrome_trace``), and a new window opens. So:

* the samples closed while the profiler records carry ``"profiled": true``
  and :func:`milarun.measure.stats.steady_state` leaves them out, like warm-up;
* starting the profiler and writing the trace fall between two windows, in
  no sample, so the samples outside the profiled steps measure what they
  would without ``--profile-trace``;
* the record's ``profile_trace`` gives the trace's path (relative to the
  record's folder), the number of steps, the activities and the profiled
  span (s since program start).

The trace lands in ``DIR`` (relative: inside the folder of the record, see
:func:`milarun.formats.store.trace_path`) as ``<record stem>.trace.json``;
under torchrun each rank writes its own (``.rank<R>.trace.json`` for ranks
other than 0) and rank 0's record links its own. Open it in Perfetto
(ui.perfetto.dev) or ``chrome://tracing``.
"""

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..formats.outfile import StrPath, check_target
from ..formats.store import result_filename, trace_path
from .device import is_cuda
from .distributed import World

#: Bounds of ``--profile-steps`` (a trace of thousands of steps is gigabytes).
MAX_STEPS = 1000


def trace_file(exp: Any, folder: StrPath) -> Path:
    """Path of this process's trace for ``--profile-trace folder`` (``Path``).

    Beside the record when it is written to a file or a folder; relative to
    the working directory when the record goes to stdout.
    """
    rank = World.from_environment().rank
    out = exp.out
    if out is None:
        record = Path.cwd() / result_filename(
            exp.name, exp.result["run"], exp.result["device"], True
        )
    elif str(out).endswith(".json"):
        record = Path(out)
    else:
        record = Path(out) / result_filename(
            exp.name, exp.result["run"], exp.result["device"], True
        )
    return Path(os.path.abspath(trace_path(record, folder, rank=rank)))


class ProfileTrace:
    """Profiles ``steps`` steady-state steps of a rate logger's loop (set as ``logger.tracer``).

    Args:
        exp: the ``Experiment``; its record gets ``profile_trace``.
        folder: the ``--profile-trace`` folder.
        steps: steps to profile, 1 to :data:`MAX_STEPS`.
        profiler: ``f(activities) -> profiler`` with ``start``, ``stop`` and
            ``export_chrome_trace(path)`` (``torch.profiler.profile`` by
            default; tests may pass a fake).

    Raises:
        ValueError: ``steps`` out of bounds.
    """

    def __init__(
        self,
        exp: Any,
        folder: StrPath,
        steps: int,
        profiler: Callable[[list[str]], Any] | None = None,
    ) -> None:
        if not 1 <= steps <= MAX_STEPS:
            raise ValueError(f"--profile-steps must be between 1 and {MAX_STEPS}, not {steps}")
        self.exp = exp
        self.path = trace_file(exp, folder)
        self.steps = steps
        self.profiler = profiler
        self.state = "waiting"  # waiting -> recording -> done
        self.count = 0
        self._prof: Any = None
        self._range: Any = None
        self._start: float | None = None
        cuda = is_cuda(exp.device)
        self.activities = ["cpu", "cuda"] if cuda else ["cpu"]
        self._record(
            path=None, steps=0, note="the run ended before its warm-up did: no step was profiled"
        )

    def _record(self, **fields: Any) -> None:
        self.exp.result["profile_trace"] = {
            "activities": list(self.activities),
            "start": None,
            "end": None,
            "note": None,
            **fields,
        }

    def _make(self) -> Any:
        if self.profiler is not None:
            return self.profiler(self.activities)
        kinds = {
            "cpu": torch.profiler.ProfilerActivity.CPU,
            "cuda": torch.profiler.ProfilerActivity.CUDA,
        }
        return torch.profiler.profile(activities=[kinds[a] for a in self.activities])

    def _enter_step(self) -> None:
        if self.profiler is not None:
            return
        self._range = torch.profiler.record_function(f"milarun step {self.count}")
        self._range.__enter__()

    def _exit_step(self) -> None:
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None

    def step(self, logger: Any) -> None:
        """Called by the logger after each step: start, advance or end the profiled span."""
        if self.state == "waiting":
            if len(logger.samples) < logger.warmup or logger.done():
                return
            logger.cut()
            self._prof = self._make()
            self._prof.start()
            self._start = logger.host_clock() - logger.origin
            logger.window_flags = {"profiled": True}
            self.state = "recording"
            self._enter_step()
            logger.restart()
        elif self.state == "recording":
            self.count += 1
            self._exit_step()
            if self.count >= self.steps:
                logger.cut()
                self._stop(logger)
                logger.restart()
            else:
                self._enter_step()

    def close(self, logger: Any) -> None:
        """Called by the logger when the loop ends (also on an error): stop a running profiler
        and write what it has."""
        if self.state == "recording":
            self._exit_step()
            self._stop(logger)

    def _stop(self, logger: Any) -> None:
        end = logger.host_clock() - logger.origin
        logger.window_flags = {}
        self.state = "done"
        note = None
        if self.count < self.steps:
            note = f"the run ended after {self.count} of {self.steps} profiled steps"
        try:
            self._prof.stop()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            check_target(self.path)  # torch writes through symlinks: refuse one, or a FIFO
            self._prof.export_chrome_trace(str(self.path))
        except Exception as exc:  # a failed trace must not fail the measurement
            self._record(
                path=None,
                steps=self.count,
                start=self._start,
                end=end,
                note=f"the trace could not be written: {exc}"[:4000],
            )
            return
        finally:
            self._prof = None
        self._record(path=self._link(), steps=self.count, start=self._start, end=end, note=note)

    def _link(self) -> str:
        """The trace path as the record gives it: relative to the record's folder when inside."""
        out = self.exp.out
        if out is None:
            return str(self.path)
        base = Path(out).absolute()
        if str(out).endswith(".json"):
            base = base.parent
        try:
            return str(self.path.relative_to(base))
        except ValueError:
            return str(self.path)
