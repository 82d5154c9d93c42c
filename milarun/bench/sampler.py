"""The periodic sampler both monitors are: the GPU monitor (:mod:`.monitor`) and the
host-load sampler (:mod:`.hostload`). No torch here.

A sampler takes a reading every ``interval`` seconds in a daemon thread from
``start()`` to ``stop()``, and one last reading at ``stop()``. Its readings go to
``samples`` and, one by one, to ``on_reading`` (the experiment streams them to
its journal; that is best-effort, so its errors are ignored). A reading that
raises ends the thread and says why in ``reason``: telemetry never stops a test.
"""

import threading
from collections.abc import Callable
from typing import Any, TypeVar

#: One reading (a row of ``samples``).
Row = dict[str, Any]

_Sampler = TypeVar("_Sampler", bound="PeriodicSampler")


class PeriodicSampler:
    """Base class: subclasses define :meth:`_sample` (one reading) and may define
    :meth:`_init` (set-up: False when there is nothing to sample, with ``reason``
    set) and :meth:`_last` (the reading at ``stop()``).

    Attributes:
        interval: seconds between readings.
        on_reading: ``f(row)`` called with each row (see :meth:`_notify`), or None.
        samples: the rows.
        available: ``start()`` found something to sample.
        reason: why not, or why sampling stopped; None while all is well.
    """

    #: the thread's name (``ps -L``, ``py-spy``)
    thread_name = "milarun-sampler"
    #: the thread reads at once, then every ``interval`` (else it waits first:
    #: ``_init`` took the first reading)
    sample_at_start = False

    def __init__(
        self,
        interval: float = 1.0,
        on_reading: Callable[[Row], object] | None = None,
        reason: str | None = None,
    ) -> None:
        self.interval = interval
        self.on_reading = on_reading
        self.samples: list[Row] = []
        self.available = False
        self.reason = reason
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _init(self) -> bool:
        return True

    def _sample(self) -> None:
        raise NotImplementedError

    def _last(self) -> None:
        self._sample()

    def _notify(self, row: Row) -> None:
        """Give ``row`` to ``on_reading``, ignoring its errors."""
        if self.on_reading is not None:
            try:
                self.on_reading(row)
            except Exception:  # the journal is best-effort; sampling goes on
                pass

    def _run(self) -> None:
        try:
            if self.sample_at_start:
                self._sample()
            while not self._stop.wait(self.interval):
                self._sample()
        except Exception as exc:  # telemetry is optional; never stop the test
            self.reason = f"sampling stopped: {exc.__class__.__name__}: {exc}"

    def start(self: _Sampler) -> _Sampler:
        self.available = bool(self._init())
        if self.available:
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """End the thread, then take the last reading."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
            self._last()

    def __enter__(self: _Sampler) -> _Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
