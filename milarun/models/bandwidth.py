"""bandwidth: host-device copies, device-to-device copies between every GPU pair, memory bandwidth.

As NVIDIA's ``nvbandwidth`` and the STREAM / BabelStream benchmarks measure them, in
PyTorch. One process sees every GPU of the node (the ``normal`` plan type); on each:

* **host to device / device to host** (``h2d``, ``d2h``) of ``--copy-size`` bytes, from a
  pinned (page-locked) host buffer and from a pageable one, one direction at a time and
  both at once (``bidir``: an H2D and a D2H on two streams, the bytes of both over the
  time of both): ``metrics.<dir>_<pinned|pageable>_gbps_gpu<i>``;
* **device to device** for every ordered pair (``d2d``: a copy from GPU ``i`` to GPU
  ``j``, peer to peer where the devices allow it): the matrix ``d2d_gbps_<i>_<j>``, as
  nvbandwidth prints its ``device_to_device_memcpy_read_ce`` matrix, and
  ``d2d_peer_<i>_<j>`` (whether CUDA reports peer access);
* **memory bandwidth** of the device's own memory: STREAM's kernels over three arrays of
  ``--array-size`` bytes each (``--dtype``, fp64 as in STREAM): copy ``c = a``, scale
  ``b = q·c``, add ``c = a + b``, triad ``a = b + q·c``, counting 2, 2, 3 and 3 words
  per element (STREAM's table, :data:`milarun.measure.acceptance.STREAM_WORDS`):
  ``stream_<kernel>_gbps[_gpu<i>]``, the best of ``--iters`` runs (STREAM reports the best).

GB/s are 1e9 B/s. A copy is timed with CUDA events around ``--iters`` copies, after
``--warmup-iters`` untimed ones; on the CPU with the host clock.

**On the CPU** there is no device: H2D, D2H and D2D are recorded as ``"not applicable"``
(a metric holding that text, never a figure), and the STREAM kernels run on host memory.

**NUMA.** Where the host buffers live is the launcher's business (a profile's
``exec_prefix`` with ``numactl --membind=N``); the test records where they landed:
``host_buffer_numa_nodes`` (the nodes of ``/proc/self/numa_maps`` holding the pinned
buffer's, else the STREAM array's, pages) and ``numa_node_gpu<i>`` (the GPU's node, from
the device backend), so a run with the buffer on the far node shows it.

The rate logger counts **one item per byte copied** (every timed copy and kernel, STREAM
by its word count), so throughput is bytes/s over the mix; the per-measure metrics are
the figures. The list of measures ends the run: ``--max-count`` does not apply.
"""

import contextlib
import os
import time

import torch
from coleo import Option, default, tooled

from ..bench import device as bench_device
from ..bench import init_torch, iteration_wrapper
from ..host import accel
from ..measure import acceptance

NO_LOSS = "bandwidth copies buffers; nothing is trained"
NOT_APPLICABLE = "not applicable"
#: Defaults by device kind: (copy size, STREAM array size), bytes.
DEFAULT_SIZES = {"gpu": (256 * 2**20, 1 * 2**30), "cpu": (0, 16 * 2**20)}
MAX_BYTES = 64 * 2**30
DTYPES = {"fp64": "float64", "fp32": "float32"}


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.bandwidth:main -- ARGS``.

    Items are bytes moved; the figures are ``metrics``.
    """
    exp.cli(train, argv)


def _check_size(name, value, minimum=8):
    if not isinstance(value, int) or value != 0 and not minimum <= value <= MAX_BYTES:
        raise ValueError(
            f"{name} must be 0 (the default) or between {minimum} B and "
            f"{MAX_BYTES} B (64 GiB), not {value!r}"
        )


class _Clock:
    """Times ``iters`` calls of ``fn`` on ``device`` (CUDA events on a GPU, else the host clock)."""

    def __init__(self, device):
        self.device = device
        self.cuda = bench_device.is_cuda(device)

    def best(self, fn, iters, warmup, each=False):
        """Seconds of one call: the batch's mean, or with ``each`` the best single call."""
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(iters if each else 1):
            if self.cuda:
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                for _ in range(1 if each else iters):
                    fn()
                end.record()
                end.synchronize()
                seconds = start.elapsed_time(end) / 1000.0
            else:
                t0 = time.perf_counter()
                for _ in range(1 if each else iters):
                    fn()
                seconds = time.perf_counter() - t0
            times.append(seconds if each else seconds / iters)
        return min(times)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)


class Stream:
    """STREAM's arrays on one device and its four kernels (module docstring)."""

    KERNELS = ("copy", "scale", "add", "triad")

    def __init__(self, device, nbytes, dtype):
        dt = getattr(torch, DTYPES[dtype])
        self.device = device
        self.itemsize = torch.empty(0, dtype=dt).element_size()
        self.n = n = max(1, nbytes // self.itemsize)
        self.a = torch.full((n,), 1.0, dtype=dt, device=device)
        self.b = torch.full((n,), 2.0, dtype=dt, device=device)
        self.c = torch.zeros(n, dtype=dt, device=device)

    def kernel(self, name, q=3.0):
        a, b, c = self.a, self.b, self.c
        return {
            "copy": lambda: c.copy_(a),
            "scale": lambda: torch.mul(c, q, out=b),
            "add": lambda: torch.add(a, b, out=c),
            "triad": lambda: torch.add(b, c, alpha=q, out=a),
        }[name]

    def measure(self, name, iters, warmup):
        """``(GB/s, bytes moved in all runs)`` of kernel ``name``: the best of ``iters`` runs."""
        seconds = _Clock(self.device).best(self.kernel(name), iters, warmup, each=True)
        moved = acceptance.stream_bytes(name, self.n, self.itemsize)
        return moved / seconds / 1e9, moved * (iters + warmup)


def _copies(gpu, nbytes, iters, warmup):
    """``({"h2d_pinned": GB/s, ...}, {"pinned": host buffer, ...})`` of one GPU (module
    docstring); call it with ``gpu`` the current device (the events time its stream)."""
    clock = _Clock(gpu)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=gpu)
    dev2 = torch.empty(nbytes, dtype=torch.uint8, device=gpu)
    out, buffers = {}, {}
    for kind in ("pinned", "pageable"):
        pinned = kind == "pinned"
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        host2 = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        host.fill_(1)
        buffers[kind] = host
        # non_blocking only from/to pinned memory: a pageable copy is staged by the driver
        t = clock.best(lambda: dev.copy_(host, non_blocking=pinned), iters, warmup)
        out[f"h2d_{kind}"] = nbytes / t / 1e9
        t = clock.best(lambda: host2.copy_(dev, non_blocking=pinned), iters, warmup)
        out[f"d2h_{kind}"] = nbytes / t / 1e9
        main = torch.cuda.current_stream(gpu)
        up, down = torch.cuda.Stream(gpu), torch.cuda.Stream(gpu)

        def both():
            # both side streams start after what the timed stream queued (its start event)
            up.wait_stream(main)
            down.wait_stream(main)
            with torch.cuda.stream(up):
                dev.copy_(host, non_blocking=pinned)
            with torch.cuda.stream(down):
                host2.copy_(dev2, non_blocking=pinned)
            main.wait_stream(up)
            main.wait_stream(down)

        t = clock.best(both, iters, warmup)
        out[f"bidir_{kind}"] = 2 * nbytes / t / 1e9
    return out, buffers


def _d2d(src, dst, nbytes, iters, warmup):
    """GB/s of a copy from GPU ``src`` to GPU ``dst``, on the host clock between
    synchronisations of both devices (events of one device cannot time both)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=src)
    b = torch.empty(nbytes, dtype=torch.uint8, device=dst)

    def sync():
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)

    for _ in range(warmup):
        b.copy_(a, non_blocking=True)
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        b.copy_(a, non_blocking=True)
    sync()
    return nbytes * iters / (time.perf_counter() - t0) / 1e9


def buffer_numa_nodes(tensor):
    """The NUMA nodes holding ``tensor``'s pages (``/proc/self/numa_maps``), as "0" or
    "0,1"; None when unknown."""
    try:
        with open("/proc/self/numa_maps") as f:
            pages = acceptance.numa_pages(f.read(), tensor.data_ptr())
    except OSError:
        return None
    return ",".join(str(n) for n in sorted(pages) if pages[n]) or None


def _gpu_numa_nodes():
    name = os.environ.get("MILARUN_BACKEND") or "nvidia"
    if name not in accel.VENDOR_OF or name == "cpu":
        return []
    try:
        return [d.numa_node for d in accel.get(name).discover()]
    except Exception:
        return []


@tooled
def train(exp):
    # Bytes of each host-device and device-device copy (0: 256 MiB; 8 B to 64 GiB)
    copy_size: Option & int = default(0)
    # Bytes of each of STREAM's three arrays (0: 1 GiB on a GPU, 16 MiB on the CPU; 8 B to 64 GiB)
    array_size: Option & int = default(0)
    # STREAM's element type: fp64 (as STREAM) or fp32
    dtype: Option = default("fp64")
    # Timed copies or kernel runs per measure (1 to 10000)
    iters: Option & int = default(10)
    # Untimed copies or kernel runs before them (0 to 10000)
    warmup_iters: Option & int = default(2)

    _check_size("--copy-size", copy_size)
    _check_size("--array-size", array_size)
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    if not 1 <= iters <= 10000:
        raise ValueError(f"--iters must be between 1 and 10000, not {iters}")
    if not 0 <= warmup_iters <= 10000:
        raise ValueError(f"--warmup-iters must be between 0 and 10000, not {warmup_iters}")
    device = init_torch(exp)
    gpu = bench_device.is_cuda(device)
    copy_default, array_default = DEFAULT_SIZES["gpu" if gpu else "cpu"]
    copy_size = copy_size or copy_default
    array_size = array_size or array_default
    m = exp.metrics
    m.update(
        {
            "copy_size": copy_size if gpu else None,
            "array_size": array_size,
            "dtype": dtype,
            "iters": iters,
        }
    )
    steps = iteration_wrapper(exp)
    exp.rate.max_count = None  # the list of measures ends the run
    tasks = []
    if gpu:
        gpus = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
        m["gpus"] = len(gpus)
        for i, numa in enumerate(_gpu_numa_nodes()):
            if numa is not None and i < len(gpus):
                m[f"numa_node_gpu{i}"] = numa
        tasks += [("copies", g) for g in gpus]
        tasks += [("d2d", (s, d)) for s in gpus for d in gpus if s != d]
        tasks += [("stream", (g, k)) for g in gpus for k in Stream.KERNELS]
    else:
        for key in ("h2d", "d2h", "bidir", "d2d"):
            m[key] = NOT_APPLICABLE
        tasks += [("stream", (device, k)) for k in Stream.KERNELS]
    arrays = {}
    for step, (kind, arg) in zip(steps, tasks):
        exp.rate.cut()  # each measure its own sample
        with _current(arg[0] if isinstance(arg, tuple) else arg):
            if kind == "copies":
                moved = _measure_copies(m, arg, copy_size, iters, warmup_iters)
            elif kind == "d2d":
                src, dst = arg
                moved = _measure_d2d(m, src, dst, copy_size, iters, warmup_iters)
            else:
                dev, name = arg
                if dev not in arrays:
                    arrays.clear()  # one device's arrays at a time
                    arrays[dev] = Stream(dev, array_size, dtype)
                    if not gpu:
                        m["host_buffer_numa_nodes"] = buffer_numa_nodes(arrays[dev].a)
                gbps, moved = arrays[dev].measure(name, iters, warmup_iters)
                m[f"stream_{name}_gbps" + (f"_gpu{dev.index}" if gpu else "")] = gbps
            step.set_count(moved)
    steps.close()


def _current(device):
    """``device`` as the current CUDA device for the ``with`` body (events, streams)."""
    if bench_device.is_cuda(device):
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def _measure_copies(m, gpu, nbytes, iters, warmup):
    """The host-device copies of ``gpu`` into the metrics ``m``; returns the items counted."""
    figures, buffers = _copies(gpu, nbytes, iters, warmup)
    for key, gbps in figures.items():
        m[f"{key}_gbps_gpu{gpu.index}"] = gbps
    if "host_buffer_numa_nodes" not in m:
        m["host_buffer_numa_nodes"] = buffer_numa_nodes(buffers["pinned"])
    return nbytes * 8 * (iters + warmup)


def _measure_d2d(m, src, dst, nbytes, iters, warmup):
    """The copy from GPU ``src`` to GPU ``dst`` into the metrics ``m``; returns the items
    counted."""
    m[f"d2d_peer_{src.index}_{dst.index}"] = bool(
        torch.cuda.can_device_access_peer(src.index, dst.index)
    )
    m[f"d2d_gbps_{src.index}_{dst.index}"] = _d2d(src, dst, nbytes, iters, warmup)
    return nbytes * (iters + warmup)
