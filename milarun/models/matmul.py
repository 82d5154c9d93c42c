"""matmul: dense matrix-multiply throughput (TFLOP/s) in fp32, tf32, fp16 and bf16.

Multiplies square ``--size`` × ``--size`` matrices (8192 on a GPU, 512 on the
CPU by default) into a preallocated output, once per precision of
``--precisions`` in every training step ("round"). ``tf32`` is fp32 data
with TF32 tensor-core matmuls allowed; ``fp16``/``bf16`` are half-precision
data (fp32 accumulation inside the GEMM).

How throughput is reported:

* the rate logger counts **one item per matmul** (a step counts
  ``len(precisions)`` items), so the run's throughput is matmuls/s over the
  mix, comparable between machines that run the same precision list;
* each precision's matmul is also timed on its own, inside the same loop:
  CUDA (or XPU) events around it on the GPU (read later, without a per-step sync:
  finished events are drained as they complete, the rest after the loop),
  ``perf_counter`` on the CPU where a matmul is synchronous. Only rounds
  after the warm-up sample windows count. ``metrics.tflops_<precision>`` is
  ``2·n³ × matmuls ÷ their total time`` (1e12 FLOP/s), so it is the peak
  dense throughput of that precision, not diluted by the others.

Stresses: raw compute (tensor cores at half precision and TF32), and at
small sizes memory bandwidth.
"""

import collections
import time

from coleo import Option, default, tooled

from ..bench import init_torch, iteration_wrapper
from ..bench.setup import PRECISIONS

#: ``--precisions auto`` per device type (TF32 is a CUDA tensor-core mode; elsewhere: fp32,bf16).
AUTO_PRECISIONS = {"cuda": "fp32,tf32,fp16,bf16", "xpu": "fp32,fp16,bf16"}

#: No loss by nature (milarun.measure.plausibility's NaN check does not apply): nothing is trained.
NO_LOSS = "matmul multiplies matrices; nothing is trained"


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.matmul:main -- ARGS``.

    Items are matmuls; per-precision TFLOP/s land in ``metrics.tflops_<p>``.
    """
    exp.cli(train, argv)


class _Timings:
    """Per-precision accumulated matmul time (seconds), from the GPU's events
    (``torch.cuda.Event`` or ``torch.xpu.Event``) or the host clock on the CPU."""

    def __init__(self, torch, device):
        self.torch = torch
        # the GPU's event API (torch.cuda or torch.xpu): its matmuls are asynchronous
        self.events = {"cuda": getattr(torch, "cuda", None),
                       "xpu": getattr(torch, "xpu", None)}.get(device.type)
        self.cuda = self.events is not None
        self.seconds = collections.defaultdict(float)
        self.count = collections.Counter()
        self.pending = collections.deque()

    def start(self):
        if self.cuda:
            ev = self.events.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, name, start, counted):
        if self.cuda:
            ev = self.events.Event(enable_timing=True)
            ev.record()
            if counted:
                self.pending.append((name, start, ev))
            self.drain(block=False)
        elif counted:
            self.seconds[name] += time.perf_counter() - start
            self.count[name] += 1

    def drain(self, block=True):
        while self.pending:
            name, start, end = self.pending[0]
            if not block and not end.query():
                return
            end.synchronize()
            self.pending.popleft()
            self.seconds[name] += start.elapsed_time(end) / 1000.0
            self.count[name] += 1


def _setup(torch, name, size, device, gen):
    dtype = {"fp32": torch.float32, "tf32": torch.float32,
             "fp16": torch.float16, "bf16": torch.bfloat16}[name]
    a = torch.randn((size, size), device=device, generator=gen).to(dtype)
    b = torch.randn((size, size), device=device, generator=gen).to(dtype)
    return a, b, torch.empty((size, size), device=device, dtype=dtype)


def _set_tf32(torch, on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")


@tooled
def train(exp):
    import torch

    # Side of the square matrices (0: 8192 on a GPU, 512 on the CPU)
    size: Option & int = default(0)
    # Comma-separated precisions among fp32,tf32,fp16,bf16 (auto: all four on CUDA, fp32,fp16,bf16 on XPU, fp32,bf16 on CPU)
    precisions: Option = default("auto")

    device = init_torch(exp)
    if precisions == "auto":
        precisions = AUTO_PRECISIONS.get(device.type, "fp32,bf16")
    names = [p.strip() for p in str(precisions).split(",") if p.strip()]
    bad = [p for p in names if p not in PRECISIONS]
    if not names or bad:
        raise ValueError(f"--precisions must list some of {', '.join(PRECISIONS)}; got {precisions!r}")
    if size <= 0:
        size = 512 if device.type == "cpu" else 8192
    gen = torch.Generator(device=device)
    gen.manual_seed(exp.options["seed"])
    mats = {p: _setup(torch, p, size, device, gen) for p in names}
    timings = _Timings(torch, device)
    warm_all = _Timings(torch, device)  # fallback when the run ends inside warm-up
    warmup = exp.options["warmup"]

    steps = iteration_wrapper(exp)
    for step in steps:
        steady = len(exp.rate.samples) >= warmup
        for p in names:
            a, b, c = mats[p]
            _set_tf32(torch, p == "tf32")
            t0 = timings.start()
            torch.matmul(a, b, out=c)
            (timings if steady else warm_all).stop(p, t0, True)
        step.set_count(len(names))
    _set_tf32(torch, False)
    timings.drain()
    warm_all.drain()
    flop = 2.0 * size ** 3
    exp.metrics.update({"size": size, "precisions": ",".join(names)})
    for p in names:
        src = timings if timings.count[p] else warm_all
        if src.count[p] and src.seconds[p] > 0:
            exp.metrics[f"tflops_{p}"] = flop * src.count[p] / src.seconds[p] / 1e12
            exp.metrics[f"matmuls_{p}"] = src.count[p]
