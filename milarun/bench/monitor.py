"""GPU telemetry through the device backend (:mod:`milarun.host.accel`) in a background thread.

Every ``interval`` seconds it records, per visible GPU: load (%), memory used
(MiB), temperature (°C), power (W), energy since the monitor started (J,
from the device's energy counter where it has one), the SM clock (``sm_clock_mhz``,
MHz) and why the clocks are held down (``clock_reasons``: NVML's clock-event bit mask,
:data:`milarun.measure.acceptance.CAPPING_REASONS`; both from
:meth:`milarun.host.accel.base.Backend.clocks`); a value the backend cannot read is
left out. The backend is the one the launcher named
(``$MILARUN_BACKEND``), else NVIDIA's. Without the library or without GPUs it
records ``available: false`` with the reason and does nothing.

Under torchrun only each node's ``LOCAL_RANK`` 0 runs a monitor (the others
would sample the same GPUs); at the end of a job the nodes' records are
gathered to rank 0 and merged by :func:`merge_node_monitors`, so a multi-node
record holds the readings of every node's GPUs.
"""

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..host import accel
from .sampler import PeriodicSampler, Row

#: Reading fields, in the order a sample row has them.
FIELDS = ("load", "memory_mib", "temperature", "power")


class GPUMonitor(PeriodicSampler):
    """Samples NVML counters every ``interval`` seconds until ``stop()`` (a
    :class:`~milarun.bench.sampler.PeriodicSampler`: the first reading at once,
    one last at ``stop()``, so energy covers the whole run).

    Use as a context manager. ``record()`` returns the ``gpu_monitor`` field.
    ``on_reading`` is called with each reading (the experiment streams them to
    its journal).
    """

    thread_name = "milarun-gpu-monitor"
    sample_at_start = True

    def __init__(
        self,
        interval: float = 1.0,
        origin: float | None = None,
        on_reading: Callable[[Row], object] | None = None,
    ) -> None:
        super().__init__(interval, on_reading)
        self.origin = time.perf_counter() if origin is None else origin
        self._backend: Any = None
        self._devices: list[Any] = []
        self._energy0: dict[int, float | None] = {}

    def _init(self) -> bool:
        name = os.environ.get("MILARUN_BACKEND") or "nvidia"
        if name == "cpu" or name not in accel.VENDOR_OF:
            self.reason = "no GPU backend (CPU slots)"
            return False
        self._backend = accel.get(name)
        ok, why = self._backend.available()
        if not ok:
            self.reason = ("NVML unavailable: " if name == "nvidia" else f"{name}: ") + why
            return False
        self._devices = self._backend.discover()
        if not self._devices:
            self.reason = "no visible GPU"
            return False
        for d in self._devices:
            try:
                self._energy0[d.index] = self._backend.read(d).energy
            except Exception:
                self._energy0[d.index] = None
        return True

    def _sample(self) -> None:
        t = time.perf_counter() - self.origin
        for d in self._devices:
            row: Row = {"t": t, "device": d.index}
            try:
                r = self._backend.read(d)
                row.update({k: getattr(r, k) for k in FIELDS if getattr(r, k) is not None})
                row.update(self._clocks(d))
                e0 = self._energy0.get(d.index)
                if e0 is not None and r.energy is not None:
                    row["energy"] = r.energy - e0
            except Exception as exc:
                row["error"] = str(exc)
            self.samples.append(row)
            self._notify(row)

    def _clocks(self, device: Any) -> Row:
        """``sm_clock_mhz`` (MHz) and ``clock_reasons`` (bit mask) where the backend reads
        them; ``{}`` otherwise (a backend without ``clocks`` reads none)."""
        clocks = getattr(self._backend, "clocks", None)
        reading = clocks(device) if clocks is not None else None
        if not isinstance(reading, dict):
            return {}
        out: Row = {}
        if reading.get("sm_clock_mhz") is not None:
            out["sm_clock_mhz"] = reading["sm_clock_mhz"]
        if reading.get("reasons") is not None:
            out["clock_reasons"] = int(reading["reasons"])
        return out

    def record(self) -> dict[str, Any]:
        """The record's ``gpu_monitor``: ``available``, ``reason``, ``interval``, ``samples``."""
        return {
            "available": self.available,
            "reason": self.reason,
            "interval": self.interval,
            "samples": self.samples,
        }


def merge_node_monitors(entries: Sequence[dict[str, Any]], clock: float) -> dict[str, Any]:
    """One ``gpu_monitor`` record from every node's, for rank 0 of a torchrun job.

    Args:
        entries: one ``{"node": name, "clock": s, "monitor": record}`` per node, in
            node-rank order (rank 0's node first): ``monitor`` is that node's
            ``GPUMonitor.record()``, ``clock`` the node's own reading of its
            sample clock (s since its experiment's origin) right after a barrier
            every rank met.
        clock: rank 0's reading of its sample clock after that barrier (s).

    Returns:
        rank 0's record with the readings of every node whose monitor ran, each
        row given ``"node"`` (its node rank) and its ``t`` moved onto rank 0's
        clock (``t + clock - entry["clock"]``: the barrier is the common instant,
        good to its exit skew, milliseconds against a 1 s interval), plus
        ``"nodes"`` (nodes in the job), ``"nodes_sampled"`` (nodes whose
        readings are in) and ``"node_gaps"`` (why the others are not, or None).
        :func:`milarun.measure.energy.result_energy` sums the power over every node's
        GPUs and refuses a record whose readings miss a node.
    """
    first = dict(entries[0]["monitor"])
    samples: list[Row] = []
    gaps: list[str] = []
    sampled = 0
    for rank, entry in enumerate(entries):
        monitor = entry["monitor"]
        if not monitor.get("available"):
            gaps.append(f"{entry['node']}: {monitor.get('reason') or 'no readings'}")
            continue
        sampled += 1
        shift = clock - entry["clock"]
        for row in monitor.get("samples") or []:
            samples.append({**row, "t": row["t"] + shift, "node": rank})
    first.update(
        {
            "samples": samples,
            "nodes": len(entries),
            "nodes_sampled": sampled,
            "node_gaps": "; ".join(gaps) or None,
        }
    )
    return first
