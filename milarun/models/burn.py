"""burn: a burn-in that catches silent data corruption, throttling and clocks that drop.

gpu-burn's method (Ville Timonen, https://github.com/wilicc/gpu-burn): every GPU at once
(the ``per-gpu`` plan type: one process per GPU, all started together) multiplies the same
two random ``--size`` × ``--size`` matrices over and over for ``--duration`` seconds, and
compares **every iteration's result** with a reference computed once at the start. A GPU
that returns wrong numbers (a bad memory cell, a marginal SM, an overheated part) fails
with reason ``data-corruption``, the iteration and the error size in the message.

The comparison: ``error = max|C_i − C_ref|`` over the whole matrix, relative to
``max|C_ref|``; an error above ``--tolerance`` (default 0: bit-exact, which cuBLAS
guarantees for the same call on the same GPU, "Results reproducibility" in its
documentation; gpu-burn allows 1e-3 absolute) or a NaN is corruption. The errors stay on
the device and are read every ``--check-every`` iterations (one sync), so the check does
not slow the GPU down; every iteration is still checked.

During the run the device backend's clocks are read every ``--clock-interval`` seconds
(:meth:`milarun.host.accel.base.Backend.clocks`: the SM clock and NVML's clock-event
reasons, ``nvmlDeviceGetCurrentClocksEventReasons``), and
:func:`milarun.measure.acceptance.throttle_metrics` turns them into
``metrics.throttled_fraction`` (the share of the steady state, after the first 10 % of the
run, with power or thermal capping), ``throttled``, ``throttle_reasons``,
``clock_start_mhz``, ``clock_steady_mhz``, ``clock_low_fraction`` (the share below
``--clock-drop`` × the start clock) and ``clock_drop`` (that share ≥ 50 %). Power and
temperature are in the record's ``gpu_monitor`` readings, as for every test. AMD (amdsmi's
violation status or throttler mask) and Intel (the driver's sysfs throttle reasons) map
their causes to the same bits (docs/acceptance.md); a backend with no clock reading (CPU
slots) makes ``clocks`` say ``"not available"``.

Items are matmuls (one per iteration); ``metrics.tflops`` is ``2·n³ × iterations / s``
over the run, ``iterations`` the matmuls checked. ``--max-count`` does not apply: the
duration ends the run.
"""

import os
import threading
import time

import torch
from coleo import Option, default, tooled

from ..bench import device as bench_device
from ..bench import init_torch, iteration_wrapper
from ..host import accel
from ..measure import acceptance

NO_LOSS = "burn multiplies matrices and checks them; nothing is trained"
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp64")
#: ``--duration`` bounds (s): a week at most.
MAX_DURATION = 7 * 24 * 3600


class DataCorruption(RuntimeError):
    """A result differs from the reference: FAIL, reason ``data-corruption``."""

    fail_reason = "data-corruption"


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.burn:main -- ARGS``.

    Items are matmuls, each checked against the reference.
    """
    exp.cli(train, argv)


def _hook_result(iteration, c):
    """Where the tests corrupt a result (monkeypatched); returns ``c``."""
    return c


class ClockSampler:
    """Reads the backend's clocks of this process's first GPU every ``interval`` seconds."""

    def __init__(self, interval, origin):
        self.interval, self.origin = interval, origin
        self.readings = []
        self.reason = None
        self._stop = threading.Event()
        self._thread = None
        self._backend = self._device = None

    def start(self):
        name = os.environ.get("MILARUN_BACKEND") or "nvidia"
        if name == "cpu" or name not in accel.VENDOR_OF:
            self.reason = "no GPU backend (CPU slots)"
            return self
        try:
            backend = accel.get(name)
            found = backend.discover()
        except Exception as exc:
            self.reason = f"{name}: {exc}"
            return self
        if not found:
            self.reason = f"{name}: {backend.reason or 'no visible GPU'}"
            return self
        if backend.clocks(found[0]) is None:
            self.reason = f"{name}: the backend reads no clocks"
            return self
        self._backend, self._device = backend, found[0]
        self._thread = threading.Thread(target=self._run, name="milarun-burn-clocks", daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            reading = self._backend.clocks(self._device) or {}
            self.readings.append({"t": time.perf_counter() - self.origin, **reading})
            self._stop.wait(self.interval)

    def stop(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None


@tooled
def train(exp):
    # Seconds of the burn-in (1 to a week)
    duration: Option & float = default(60.0)
    # Side of the square matrices (0: 8192 on a GPU, 256 on the CPU; 16 to 65536)
    size: Option & int = default(0)
    # Element type: fp32, tf32, fp16, bf16 or fp64
    dtype: Option = default("fp32")
    # Largest error allowed, relative to the reference's largest magnitude (0: bit-exact)
    tolerance: Option & float = default(0.0)
    # Iterations between two reads of the errors (1 to 10000; each iteration is checked)
    check_every: Option & int = default(16)
    # Seconds between two clock readings
    clock_interval: Option & float = default(1.0)
    # A clock below this fraction of the start clock counts as dropped (0 to 1)
    clock_drop: Option & float = default(0.9)

    if not 1 <= duration <= MAX_DURATION:
        raise ValueError(
            f"--duration must be between 1 s and {MAX_DURATION} s (a week), not {duration}"
        )
    if size and not 16 <= size <= 65536:
        raise ValueError(f"--size must be 0 or between 16 and 65536, not {size}")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    if not 0 <= tolerance < 1:
        raise ValueError(f"--tolerance must be in [0, 1), not {tolerance}")
    if not 1 <= check_every <= 10000:
        raise ValueError(f"--check-every must be between 1 and 10000, not {check_every}")
    if not 0.01 <= clock_interval <= 3600:
        raise ValueError(f"--clock-interval must be between 0.01 and 3600 s, not {clock_interval}")
    if not 0 < clock_drop <= 1:
        raise ValueError(f"--clock-drop must be in (0, 1], not {clock_drop}")
    device = init_torch(exp)
    size = size or (256 if bench_device.kind(device) == "cpu" else 8192)
    torch_dtype = {
        "fp32": torch.float32,
        "tf32": torch.float32,
        "fp16": torch.float16,
        "bf16": torch.bfloat16,
        "fp64": torch.float64,
    }[dtype]
    tf32 = dtype == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    gen = torch.Generator(device=device)
    gen.manual_seed(exp.options["seed"])
    a = torch.rand((size, size), device=device, generator=gen).to(torch_dtype)
    b = torch.rand((size, size), device=device, generator=gen).to(torch_dtype)
    ref = torch.matmul(a, b)
    scale = float(ref.abs().max().float().item()) or 1.0
    c = torch.empty_like(ref)
    clocks = ClockSampler(clock_interval, exp.origin)
    errors, checked, first_iteration = [], 0, 0

    def check():
        nonlocal errors, checked, first_iteration
        if not errors:
            return
        values = torch.stack(errors).float().cpu().tolist()
        bad = acceptance.first_bad([v / scale for v in values], tolerance)
        if bad is not None:
            i, rel = bad
            raise DataCorruption(
                f"iteration {first_iteration + i}: the result differs from the reference by "
                f"{values[i]:.6g} at most ({rel:.3g} of the reference's largest value "
                f"{scale:.6g}; tolerance {tolerance:g}), {size}x{size} {dtype}"
            )
        checked += len(values)
        first_iteration += len(values)
        errors = []

    steps = iteration_wrapper(exp)
    exp.rate.max_count = None  # the duration ends the run
    clocks.start()
    start = time.perf_counter()
    iteration = 0
    try:
        for step in steps:
            if time.perf_counter() - start >= duration:
                break  # this step holds nothing
            torch.matmul(a, b, out=c)
            out = _hook_result(iteration, c)
            errors.append((out - ref).abs().max())
            iteration += 1
            if len(errors) >= check_every:
                check()
            step.set_count(1)
        check()
    finally:
        steps.close()
        clocks.stop()
        seconds = time.perf_counter() - start
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        m = exp.metrics
        m.update(
            {
                "size": size,
                "dtype": dtype,
                "tolerance": tolerance,
                "iterations": checked,
                "duration_s": seconds,
            }
        )
        if seconds > 0 and checked:
            m["tflops"] = 2.0 * size**3 * checked / seconds / 1e12
        if clocks.readings:
            m.update(acceptance.throttle_metrics(clocks.readings, drop_fraction=clock_drop))
            m["clock_readings"] = len(clocks.readings)
        else:
            m["clocks"] = f"not available ({clocks.reason})"
