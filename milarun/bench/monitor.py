"""GPU telemetry from NVML in a background thread.

Every ``interval`` seconds it records, per visible GPU: load (%), memory used
(MiB), temperature (°C), power (W) and energy since the monitor started (J,
from the NVML total-energy counter where the GPU has one). Without NVML or
without GPUs it records ``available: false`` with the reason and does nothing.
"""

import threading
import time

from ..devices import nvml_visible


class GPUMonitor:
    """Samples NVML counters every ``interval`` seconds until ``stop()``.

    Use as a context manager. ``record()`` returns the ``gpu_monitor`` field.
    """

    def __init__(self, interval=1.0, origin=None, on_reading=None):
        self.interval = interval
        # called with each reading (the experiment streams them to its journal)
        self.on_reading = on_reading
        self.origin = time.perf_counter() if origin is None else origin
        self.samples = []
        self.available = False
        self.reason = None
        self._handles = []
        self._energy0 = {}
        self._stop = threading.Event()
        self._thread = None
        self._nvml = None

    def _init(self):
        try:
            import pynvml
            pynvml.nvmlInit()
        except Exception as exc:  # no library, no driver: telemetry is optional
            self.reason = f"NVML unavailable: {exc.__class__.__name__}: {exc}"
            return False
        self._nvml = pynvml
        indices, handles = nvml_visible(pynvml)
        if not indices:
            self.reason = "no visible GPU"
            return False
        self._handles = [(i, handles[i]) for i in indices]
        for i, h in self._handles:
            try:
                self._energy0[i] = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
            except Exception:
                self._energy0[i] = None
        return True

    def _sample(self):
        nv = self._nvml
        t = time.perf_counter() - self.origin
        for i, h in self._handles:
            row = {"t": t, "device": i}
            try:
                row["load"] = nv.nvmlDeviceGetUtilizationRates(h).gpu
                row["memory_mib"] = nv.nvmlDeviceGetMemoryInfo(h).used / 2**20
                row["temperature"] = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
                row["power"] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
                e0 = self._energy0.get(i)
                if e0 is not None:
                    row["energy"] = (nv.nvmlDeviceGetTotalEnergyConsumption(h) - e0) / 1000.0
            except Exception as exc:
                row["error"] = str(exc)
            self.samples.append(row)
            if self.on_reading is not None:
                try:
                    self.on_reading(row)
                except Exception:  # the journal is best-effort; telemetry goes on
                    pass

    def _run(self):
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def start(self):
        self.available = self._init()
        if self.available:
            self._thread = threading.Thread(target=self._run, name="milarun-gpu-monitor",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._sample()  # one last reading, so energy covers the whole run
            self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def record(self):
        return {"available": self.available, "reason": self.reason,
                "interval": self.interval, "samples": self.samples}
