"""matmul: dense matrix-multiply throughput (TFLOP/s) in fp32, tf32, fp16, bf16, fp64 and FP8.

Multiplies square ``--size`` × ``--size`` matrices (8192 on a GPU, 512 on the
CPU by default) into a preallocated output, in every training step ("round") one
block of back-to-back matmuls per precision of ``--precisions``. ``tf32`` is fp32
data with TF32 tensor-core matmuls allowed; ``fp16``/``bf16`` are half-precision
data (fp32 accumulation inside the GEMM).

A block lasts about ``--block-ms`` (default 1000 on a GPU, 0 on the CPU; 0: one
matmul per precision): its matmul count per precision is set once, before the
loop, from one synchronised, timed matmul of each (``round(block ÷ its time)``,
at least 1). Blocks, rather than one matmul of each precision in turn, because a
GPU at its power limit runs a short matmul that follows a long, lower-power one
(an fp32 GEMM between bf16 ones) at clocks it cannot sustain, and a precision that
follows a power-limited block starts at the lowered clocks. Measured on an H200
at its 700 W limit, 8192³, against back-to-back loops of one precision (bare,
2 s each; benchmarks/gpu_check.py, baselines/gpu/): one matmul of each in turn
timed bf16 at 775 TFLOP/s where the bare loop ran 655 (+18 %); blocks of 50 ms,
647 bf16 but fp32 42.3 against 51.2 (−17 %); 200 ms, bf16 +0.2 %, fp32 −6 %;
1000 ms, every precision within 1.5 % (fp32 50.5, tf32 341, bf16 655). A block of
1000 ms times what a training job gets: sustained throughput.

How throughput is reported:

* the rate logger counts **one item per matmul** (a step counts the matmuls of
  its blocks), so the run's throughput is matmuls/s over the mix; with blocks of
  equal time it is the mean of the precisions' matmuls/s, comparable between
  machines that run the same precision list;
* each precision's block is also timed on its own, inside the same loop:
  CUDA (or XPU) events around it on the GPU (read later, without a per-step sync:
  finished events are drained as they complete, the rest after the loop),
  ``perf_counter`` on the CPU where a matmul is synchronous. Only rounds
  after the warm-up sample windows count. ``metrics.tflops_<precision>`` is
  ``2·n³ × matmuls ÷ their total time`` (1e12 FLOP/s), so it is the sustained
  dense throughput of that precision, not diluted by the others;
  ``metrics.block_<precision>`` is the block's matmul count.

Sustained, all at once (``--soak S`` seconds, default 0: none). A GPU runs a matmul
faster while it is cool and under its power limit than once it is hot (its boost clock
drops), and a node is as fast as its slowest GPU when all of them run at once (Stas
Bekman, ml-engineering, "maximum achievable matmul FLOPS"). The per-gpu plan starts one
process per GPU together at the start barrier, so with ``--soak`` every GPU of the node
multiplies at once; the run goes on (the rate logger's ``--min-steady`` is raised to
the soak plus a measured window, :func:`soak_window`) until the steady state has lasted
``S`` seconds and a while more. The steady state's blocks are then split by device time
(:func:`split_blocks`): ``metrics.tflops_<p>_burst`` is the first block of each
precision after warm-up, ``metrics.tflops_<p>`` the blocks that start ``S`` seconds or
more after the first steady block (the sustained figure; without ``--soak`` it is every
steady block, as before), ``soak_s`` the soak asked for and ``soak_reached_s`` where the
sustained window began (``soak_complete`` false when the run ended before the soak did:
then the sustained figure is the precision's last block). Over the steady state (warm-up
end to loop end, on the monitor's clock) what the GPU monitor read
(:func:`soak_telemetry`): ``soak_clock_mean_mhz``, ``soak_clock_min_mhz`` (SM clock,
MHz), ``soak_power_mean_w`` (W), ``soak_throttled_fraction`` (readings with a power or
thermal capping reason), ``soak_throttle_reasons`` (their names) and ``soak_readings``;
a figure the monitor did not read (CPU slots, no clock reading) is left out and
``soak_telemetry`` says why. ``--soak`` needs the rate logger (not ``--no-instrument``).

Inputs: random data only. A matmul on zeros or on an identity matrix runs faster (and
draws less power) than on random data and would overstate the device. The operands are
seeded normal(0, 1) data (``--seed``), checked at set-up (:func:`operand_problem`:
standard deviation 0.9 to 1.1, mean within ±0.1, at most 1 % zeros; wider on small
matrices, by their sampling error) before anything is timed; ``metrics.inputs`` says
``"normal(0,1), seed N"``.

Also, for acceptance (none of it in the default ``--precisions``):

* ``fp64``: float64 matrices (the FP64 tensor cores on an A100/H100, the matrix cores on
  an MI300X);
* ``fp8_e4m3`` and ``fp8_e5m2``: ``torch._scaled_mm`` on float8 data (unit scales,
  bf16 output); ``fp8_e4m3`` multiplies e4m3 by e4m3, ``fp8_e5m2`` e5m2 by e4m3 (cuBLAS has
  no e5m2 × e5m2 GEMM). Where the device or this torch cannot (the CPU, a GPU before
  compute capability 8.9), ``metrics.tflops_<p>`` is the text ``"not supported on this
  device"`` and the others run: not a failure;
* ``--sweep``: after the timed loop, the shape sweep of Stas Bekman's MAMF finder
  ("maximum achievable matmul FLOPS", ``ml-engineering/compute/accelerator/benchmarks/
  mamf-finder.py``): every ``M×N×K`` of ``--sweep-shapes`` (``auto``: every M, N, K in
  {4096, 6144, 8192, 12288, 16384} with M = N on a GPU, 64 to 512 on the CPU) timed
  ``--sweep-iters`` times, the best mean kept; ``metrics.mamf_tflops_<p>`` and
  ``mamf_shape_<p>`` (``"MxNxK"``) next to the fixed-shape ``tflops_<p>``;
* the datasheet peak of the device (:data:`milarun.measure.mfu.PEAK_TFLOPS`, the table
  MFU uses): ``peak_tflops_<p>``, ``tflops_<p>_vs_peak`` and ``mamf_<p>_vs_peak``
  (fractions), where the device is in the table.

Stresses: raw compute (tensor cores at half precision and TF32), and at
small sizes memory bandwidth.
"""

import collections
import math
import time

import torch
from coleo import Option, default, tooled

from ..bench import device as bench_device
from ..bench import init_torch, iteration_wrapper
from ..bench.setup import PRECISIONS
from ..measure.acceptance import CAPPING_REASONS, reason_names
from ..measure.mfu import peak_tflops

#: Every ``--precisions`` name: the training precisions, fp64 and the two FP8 formats.
MATMUL_PRECISIONS = tuple(PRECISIONS) + ("fp64", "fp8_e4m3", "fp8_e5m2")
FP8 = ("fp8_e4m3", "fp8_e5m2")
#: The metric of a precision the device cannot run.
UNSUPPORTED = "not supported on this device"
#: :data:`milarun.measure.mfu.PEAK_TFLOPS`'s key of each precision.
PEAK_KEY = {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
#: ``--sweep-shapes auto``: the sizes M (= N) and K take.
SWEEP_SIZES = {"gpu": (4096, 6144, 8192, 12288, 16384), "cpu": (64, 128, 256, 512)}

#: ``--precisions auto`` per device type (TF32 is a CUDA tensor-core mode; elsewhere: fp32,bf16).
AUTO_PRECISIONS = {"cuda": "fp32,tf32,fp16,bf16", "xpu": "fp32,fp16,bf16"}

#: Longest ``--soak`` (s): a week, as burn's ``--duration``.
MAX_SOAK_S = 7 * 24 * 3600.0
#: Bounds of an operand that looks like normal(0, 1) data (:func:`operand_problem`): its
#: standard deviation within 1 ± OPERAND_STD, its mean within ±OPERAND_MEAN, at most
#: OPERAND_ZEROS of its elements zero (widened for small matrices).
OPERAND_STD = 0.1
OPERAND_MEAN = 0.1
OPERAND_ZEROS = 0.01

#: No loss by nature (milarun.measure.plausibility's NaN check does not apply): nothing is trained.
NO_LOSS = "matmul multiplies matrices; nothing is trained"


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.matmul:main -- ARGS``.

    Items are matmuls; per-precision TFLOP/s land in ``metrics.tflops_<p>``.
    """
    exp.cli(train, argv)


class _Timings:
    """Per-precision accumulated matmul time (seconds), from the GPU's events
    (``torch.cuda.Event`` or ``torch.xpu.Event``) or the host clock on the CPU.

    With ``keep_blocks`` it also keeps every counted span as ``(name, start_s, end_s,
    matmuls)`` in ``blocks``, in s from the first counted span's start (device time on a
    GPU), for :func:`split_blocks`."""

    def __init__(self, device, keep_blocks=False):
        # the GPU's event API (torch.cuda or torch.xpu): its matmuls are asynchronous
        self.events = bench_device.module(device)
        self.cuda = self.events is not None
        self.seconds = collections.defaultdict(float)
        self.count = collections.Counter()
        self.pending = collections.deque()
        self.keep_blocks = keep_blocks
        self.blocks = []
        self._ref = None  # the first counted span's start (event or perf_counter)

    def start(self):
        if self.cuda:
            ev = self.events.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, name, start, counted, n=1):
        """Close the span opened by :meth:`start`: ``n`` matmuls of ``name``."""
        if self.cuda:
            ev = self.events.Event(enable_timing=True)
            ev.record()
            if counted:
                if self._ref is None:
                    self._ref = start
                self.pending.append((name, start, ev, n))
            self.drain(block=False)
        elif counted:
            end = time.perf_counter()
            self.seconds[name] += end - start
            self.count[name] += n
            if self.keep_blocks:
                if self._ref is None:
                    self._ref = start
                self.blocks.append((name, start - self._ref, end - self._ref, n))

    def drain(self, block=True):
        while self.pending:
            name, start, end, n = self.pending[0]
            if not block and not end.query():
                return
            end.synchronize()
            self.pending.popleft()
            self.seconds[name] += start.elapsed_time(end) / 1000.0
            self.count[name] += n
            if self.keep_blocks:
                at = self._ref.elapsed_time(start) / 1000.0
                self.blocks.append((name, at, at + start.elapsed_time(end) / 1000.0, n))


def _setup(name, size, device, gen, shape=None):
    m, n, k = shape or (size, size, size)
    if name in FP8:
        a_type = torch.float8_e5m2 if name == "fp8_e5m2" else torch.float8_e4m3fn
        a = torch.randn((m, k), device=device, generator=gen).to(a_type)
        # _scaled_mm wants its second operand column-major
        b = torch.randn((n, k), device=device, generator=gen).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device, dtype=torch.float32)
        return a, b, one
    dtype = {
        "fp32": torch.float32,
        "tf32": torch.float32,
        "fp64": torch.float64,
        "fp16": torch.float16,
        "bf16": torch.bfloat16,
    }[name]
    a = torch.randn((m, k), device=device, generator=gen).to(dtype)
    b = torch.randn((k, n), device=device, generator=gen).to(dtype)
    return a, b, torch.empty((m, n), device=device, dtype=dtype)


def _multiply(name, a, b, c):
    if name in FP8:
        return torch._scaled_mm(a, b, scale_a=c, scale_b=c, out_dtype=torch.bfloat16)
    return torch.matmul(a, b, out=c)


def fp8_support(device):
    """None when ``torch._scaled_mm`` runs on ``device``, else why not (one line)."""
    if not bench_device.is_cuda(device):
        return f"{UNSUPPORTED} ({bench_device.kind(device)})"
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"{UNSUPPORTED} (this torch has no FP8 matmul)"
    try:
        gen = torch.Generator(device=device)
        for name in FP8:
            a, b, one = _setup(name, 32, device, gen)
            _multiply(name, a, b, one)
        torch.cuda.synchronize(device)
    except Exception as exc:
        return f"{UNSUPPORTED} ({exc.__class__.__name__}: {str(exc).splitlines()[0][:120]})"
    return None


def parse_shapes(text, kind):
    """The sweep's ``(M, N, K)`` shapes of ``--sweep-shapes`` (``auto`` or ``MxNxK,…``).

    Raises:
        ValueError: a malformed shape or a side out of [1, 65536].
    """
    if str(text).strip() == "auto":
        sizes = SWEEP_SIZES[kind]
        return [(mn, mn, k) for mn in sizes for k in sizes]
    shapes = []
    for item in str(text).split(","):
        parts = item.strip().lower().split("x")
        try:
            shape = tuple(int(p) for p in parts)
        except ValueError:
            shape = ()
        if len(shape) != 3 or not all(1 <= v <= 65536 for v in shape):
            raise ValueError(
                f"--sweep-shapes: {item.strip()!r} is not MxNxK with sides "
                "from 1 to 65536 (or auto)"
            )
        shapes.append(shape)
    return shapes


def _sweep(exp, names, shapes, device, gen, iters):
    """The MAMF sweep (module docstring): best TFLOP/s and its shape per precision."""
    for p in names:
        best, best_shape = 0.0, None
        for shape in shapes:
            a, b, c = _setup(p, 0, device, gen, shape)
            _set_tf32(p == "tf32")
            timer = _Timings(device)
            _multiply(p, a, b, c)  # warm-up: the library picks its kernel
            for _ in range(iters):
                t0 = timer.start()
                _multiply(p, a, b, c)
                timer.stop(p, t0, True)
            timer.drain()
            if timer.seconds[p] > 0:
                m, n, k = shape
                tflops = 2.0 * m * n * k * timer.count[p] / timer.seconds[p] / 1e12
                if tflops > best:
                    best, best_shape = tflops, shape
            del a, b, c
        _set_tf32(False)
        if best_shape is not None:
            exp.metrics[f"mamf_tflops_{p}"] = best
            exp.metrics[f"mamf_shape_{p}"] = "x".join(map(str, best_shape))


def _versus_peak(metrics, names, device_name):
    """``peak_tflops_<p>`` and the ratios to it (module docstring)."""
    for p in names:
        peak = peak_tflops(device_name, PEAK_KEY.get(p, p))
        if not peak:
            continue
        metrics[f"peak_tflops_{p}"] = peak
        for key, ratio in (
            (f"tflops_{p}", f"tflops_{p}_vs_peak"),
            (f"mamf_tflops_{p}", f"mamf_{p}_vs_peak"),
        ):
            if isinstance(metrics.get(key), float):
                metrics[ratio] = metrics[key] / peak


def operand_problem(std, mean, zero_fraction, n=None):
    """Why an operand with these statistics is not normal(0, 1) data, or None.

    A matmul on zeros, an identity or other structured data runs faster than on random
    data (module docstring). The bounds are :data:`OPERAND_STD`, :data:`OPERAND_MEAN` and
    :data:`OPERAND_ZEROS` (an identity is almost all zeros); with ``n``, the operand's
    element count, the std and mean bounds widen to 5 standard errors (``5/√(2n)`` and
    ``5/√n``) and the zeros' to 3 more elements, so that a small matrix of normal data
    passes.
    """
    err = 5.0 / math.sqrt(n) if n else 0.0
    std_tol = max(OPERAND_STD, err / math.sqrt(2))
    mean_tol = max(OPERAND_MEAN, err)
    zeros_tol = OPERAND_ZEROS + (3.0 / n if n else 0.0)
    if (n is None or n >= 2) and not abs(std - 1.0) <= std_tol:
        return f"standard deviation {std:.3g}, not within 1 ± {std_tol:.3g}"
    if not abs(mean) <= mean_tol:
        return f"mean {mean:.3g}, not within ±{mean_tol:.3g}"
    if not zero_fraction <= zeros_tol:
        return f"{100 * zero_fraction:.3g}% zeros (at most {100 * zeros_tol:.3g}%)"
    return None


def check_operands(name, a, b):
    """Refuse operands that are not normal(0, 1) data (:func:`operand_problem`).

    Raises:
        ValueError: one line naming the precision, the operand and what is wrong.
    """
    for label, x in (("A", a), ("B", b)):
        x = x.float()
        std, mean = float(x.std()), float(x.mean())
        zeros = float((x == 0).float().mean())
        why = operand_problem(std, mean, zeros, x.numel())
        if why:
            raise ValueError(
                f"matmul {name}: operand {label} is not normal(0,1) random data ({why}): "
                "a matmul on zeros or structured data overstates the device"
            )


def soak_window(soak_s, names, block_ms):
    """Seconds of steady state the run needs with ``--soak``: the soak (s) plus a
    measured window of at least 1 s, 10 % of the soak and two rounds of blocks
    (``len(names)`` blocks of ``block_ms`` ms each)."""
    return soak_s + max(1.0, 0.1 * soak_s, 2 * len(names) * block_ms / 1000.0)


def split_blocks(blocks, soak_s, burst_blocks=1):
    """The burst and sustained windows of the steady state's blocks, per precision.

    Args:
        blocks: ``(precision, start_s, end_s, matmuls)`` per timed block, in s from the
            first steady block's start (device time on a GPU), in the order they ran.
        soak_s: the soak (s); 0: every block is sustained.
        burst_blocks: the first blocks of each precision that make its burst figure.

    Returns:
        ``{precision: {"burst": (s, matmuls), "sustained": (s, matmuls), "complete":
        bool}}``: the summed block time and matmuls of each window. Sustained: the
        blocks that start at ``soak_s`` or later; where none does (the run ended
        first), the precision's last block, with ``complete`` false.
    """
    out = {}
    for name, start, end, n in blocks:
        entry = out.setdefault(
            name, {"burst": [0.0, 0], "sustained": [0.0, 0], "complete": False, "seen": 0}
        )
        if entry["seen"] < burst_blocks:
            entry["burst"][0] += end - start
            entry["burst"][1] += n
        entry["seen"] += 1
        if start >= soak_s:
            entry["sustained"][0] += end - start
            entry["sustained"][1] += n
            entry["complete"] = True
        entry["last"] = (end - start, n)
    return {
        name: {
            "burst": tuple(e["burst"]),
            "sustained": tuple(e["sustained"]) if e["complete"] else e["last"],
            "complete": e["complete"],
        }
        for name, e in out.items()
    }


def soak_telemetry(samples, t0, t1):
    """What the GPU monitor read from ``t0`` to ``t1`` (s, on its clock).

    Args:
        samples: the monitor's rows (:class:`milarun.bench.monitor.GPUMonitor`):
            ``t`` (s), ``power`` (W), ``sm_clock_mhz`` (MHz), ``clock_reasons`` (NVML
            bit mask), each where read.

    Returns:
        ``soak_readings``, ``soak_clock_mean_mhz``, ``soak_clock_min_mhz``,
        ``soak_power_mean_w``, ``soak_throttled_fraction`` (share of the readings with a
        power or thermal capping reason, :data:`~milarun.measure.acceptance.CAPPING_REASONS`)
        and ``soak_throttle_reasons`` (the names seen, comma-separated, ``""`` for none),
        each left out where no reading has it; ``soak_telemetry``: what is missing, or
        ``"complete"``.
    """
    rows = [r for r in samples if isinstance(r.get("t"), float | int) and t0 <= r["t"] <= t1]
    out = {"soak_readings": len(rows)}
    clocks = [r["sm_clock_mhz"] for r in rows if r.get("sm_clock_mhz") is not None]
    power = [r["power"] for r in rows if r.get("power") is not None]
    masks = [int(r["clock_reasons"]) for r in rows if r.get("clock_reasons") is not None]
    if clocks:
        out["soak_clock_mean_mhz"] = sum(clocks) / len(clocks)
        out["soak_clock_min_mhz"] = float(min(clocks))
    if power:
        out["soak_power_mean_w"] = sum(power) / len(power)
    if masks:
        capping = sum(CAPPING_REASONS)
        out["soak_throttled_fraction"] = sum(bool(m & capping) for m in masks) / len(masks)
        seen = 0
        for m in masks:
            seen |= m
        out["soak_throttle_reasons"] = ",".join(reason_names(seen))
    missing = [
        what
        for what, got in (("SM clock", clocks), ("power", power), ("throttle reasons", masks))
        if not got
    ]
    out["soak_telemetry"] = (
        "complete" if not missing else "not read by the GPU monitor: " + ", ".join(missing)
    )
    return out


def block_sizes(device, names, mats, block_ms):
    """Matmuls per block of each precision: ``round(block_ms ÷ one matmul's ms)``, at
    least 1, from one synchronised matmul timed after one untimed (the library picks
    its kernel on the first); ``block_ms`` ≤ 0: 1 each."""
    if block_ms <= 0:
        return dict.fromkeys(names, 1)
    sizes = {}
    for p in names:
        a, b, c = mats[p]
        _set_tf32(p == "tf32")
        _multiply(p, a, b, c)
        bench_device.synchronize(device)
        t0 = time.perf_counter()
        _multiply(p, a, b, c)
        bench_device.synchronize(device)
        ms = (time.perf_counter() - t0) * 1000.0
        sizes[p] = max(1, round(block_ms / ms)) if ms > 0 else 1
    _set_tf32(False)
    return sizes


def _soak_metrics(exp, windows, soak, flop, blocks):
    """``tflops_<p>`` (sustained), ``tflops_<p>_burst``, ``matmuls_<p>`` and the soak's
    own figures (module docstring) from :func:`split_blocks`' windows."""
    m = exp.metrics
    m["soak_s"] = soak
    sustained_starts = [start for _, start, _, _ in blocks if start >= soak]
    m["soak_reached_s"] = (
        min(sustained_starts)
        if sustained_starts
        else (max(e for _, _, e, _ in blocks) if blocks else 0.0)
    )
    m["soak_complete"] = bool(windows) and all(w["complete"] for w in windows.values())
    for p, w in windows.items():
        for key, (seconds, n) in (
            (f"tflops_{p}", w["sustained"]),
            (f"tflops_{p}_burst", w["burst"]),
        ):
            if n and seconds > 0:
                m[key] = flop * n / seconds / 1e12
        m[f"matmuls_{p}"] = w["sustained"][1]


def _check_options(sweep, sweep_shapes, sweep_iters, soak, no_instrument):
    """One error before anything runs.

    Raises:
        ValueError: a bad shape or ``--sweep-iters``, ``--soak`` out of bounds or with
            ``--no-instrument``.
    """
    if sweep:
        parse_shapes(sweep_shapes, "cpu")
        if not 1 <= sweep_iters <= 10000:
            raise ValueError(f"--sweep-iters must be between 1 and 10000, not {sweep_iters}")
    if not 0 <= soak <= MAX_SOAK_S:
        raise ValueError(f"--soak must be between 0 and {MAX_SOAK_S:.0f} s, not {soak}")
    if soak > 0 and no_instrument:
        raise ValueError("--soak needs the rate logger's windows: leave out --no-instrument")


def _set_tf32(on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")


@tooled
def train(exp):
    # Side of the square matrices (0: 8192 on a GPU, 512 on the CPU)
    size: Option & int = default(0)
    # Comma-separated precisions among fp32,tf32,fp16,bf16,fp64,fp8_e4m3,fp8_e5m2 (auto:
    # fp32,tf32,fp16,bf16 on CUDA, fp32,fp16,bf16 on XPU, fp32,bf16 on CPU)
    precisions: Option = default("auto")
    # After the timed loop, sweep shapes for the best TFLOP/s per precision (MAMF)
    sweep: Option & bool = default(False)
    # The sweep's shapes: auto, or comma-separated MxNxK
    sweep_shapes: Option = default("auto")
    # Timed matmuls per shape of the sweep (1 to 10000)
    sweep_iters: Option & int = default(10)
    # Milliseconds of back-to-back matmuls per precision in a step (-1: 1000 on a GPU, 0 on
    # the CPU; 0: one matmul per precision)
    block_ms: Option & float = default(-1.0)
    # Seconds every GPU multiplies before the sustained figure is taken (0: no soak; 0 to
    # a week); records the burst figure too (module docstring)
    soak: Option & float = default(0.0)

    _check_options(sweep, sweep_shapes, sweep_iters, soak, exp.options["no_instrument"])
    device = init_torch(exp)
    if precisions == "auto":
        precisions = AUTO_PRECISIONS.get(bench_device.kind(device), "fp32,bf16")
    names = [p.strip() for p in str(precisions).split(",") if p.strip()]
    bad = [p for p in names if p not in MATMUL_PRECISIONS]
    if not names or bad:
        raise ValueError(
            f"--precisions must list some of {', '.join(MATMUL_PRECISIONS)}; got {precisions!r}"
        )
    unsupported = {}
    if any(p in FP8 for p in names):
        why = fp8_support(device)
        if why:
            unsupported = {p: why for p in names if p in FP8}
    listed = names
    names = [p for p in names if p not in unsupported]
    if not names:
        raise ValueError(
            "none of --precisions runs on this device: "
            + "; ".join(f"{p}: {why}" for p, why in unsupported.items())
        )
    if size <= 0:
        size = 8192 if bench_device.is_accelerator(device) else 512
    gen = torch.Generator(device=device)
    gen.manual_seed(exp.options["seed"])
    mats = {p: _setup(p, size, device, gen) for p in names}
    for p in names:
        check_operands(p, *mats[p][:2])
    if block_ms < 0:
        block_ms = 1000.0 if bench_device.is_accelerator(device) else 0.0
    blocks = block_sizes(device, names, mats, block_ms)
    timings = _Timings(device, keep_blocks=soak > 0)
    warm_all = _Timings(device)  # fallback when the run ends inside warm-up
    warmup = exp.options["warmup"]

    steps = iteration_wrapper(exp)
    if soak > 0:  # the rate logger goes on until the soak and its measured window are done
        exp.rate.min_steady = max(exp.rate.min_steady, soak_window(soak, names, block_ms))
    t_steady = None  # the steady state's start on the monitor's clock (s)
    for step in steps:
        steady = len(exp.rate.samples) >= warmup
        if steady and t_steady is None:
            t_steady = time.perf_counter() - exp.origin
        for p in names:
            a, b, c = mats[p]
            _set_tf32(p == "tf32")
            t0 = timings.start()
            for _ in range(blocks[p]):
                _multiply(p, a, b, c)
            (timings if steady else warm_all).stop(p, t0, True, blocks[p])
        step.set_count(sum(blocks.values()))
    _set_tf32(False)
    timings.drain()
    warm_all.drain()
    t_end = time.perf_counter() - exp.origin
    flop = 2.0 * size**3
    exp.metrics.update(
        {
            "size": size,
            "precisions": ",".join(listed),
            "block_ms": block_ms,
            "inputs": f"normal(0,1), seed {exp.options['seed']}",
        }
    )
    for p in names:
        src = timings if timings.count[p] else warm_all
        if src.count[p] and src.seconds[p] > 0:
            exp.metrics[f"tflops_{p}"] = flop * src.count[p] / src.seconds[p] / 1e12
            exp.metrics[f"matmuls_{p}"] = src.count[p]
            exp.metrics[f"block_{p}"] = blocks[p]
    if soak > 0:
        _soak_metrics(exp, split_blocks(timings.blocks, soak), soak, flop, timings.blocks)
        if t_steady is not None:
            exp.metrics.update(soak_telemetry(exp.monitor_readings(), t_steady, t_end))
    for p, why in unsupported.items():
        exp.metrics[f"tflops_{p}"] = UNSUPPORTED
        exp.metrics[f"unsupported_{p}"] = why
    if sweep and names:
        shapes = parse_shapes(sweep_shapes, "gpu" if bench_device.is_accelerator(device) else "cpu")
        _sweep(exp, names, shapes, device, gen, sweep_iters)
    _versus_peak(exp.metrics, names, bench_device.name(device))
