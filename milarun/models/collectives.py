"""collectives: bus bandwidth of all-reduce, all-gather, reduce-scatter, all-to-all and broadcast.

NVIDIA nccl-tests' method (https://github.com/NVIDIA/nccl-tests, ``doc/PERFORMANCE.md``)
in PyTorch, so that it runs on NCCL (NVIDIA), RCCL (AMD) and gloo (the CPU, for the tests):
for each collective of ``--ops`` and each message size from ``--min-size`` (8 B) doubling
to ``--max-size`` (8 GiB on a GPU, 1 MiB on the CPU by default), ``--warmup-iters``
untimed operations, then ``--iters`` timed ones (CUDA events around the whole batch on a
GPU, the host clock on the CPU, after a barrier); the time of one operation is the
batch's time / ``--iters``, averaged over the ranks (nccl-tests' default ``-a 1``).
``algbw = S / t`` and ``busbw = algbw × factor`` in GB/s (1e9 B/s), with the factors of
:mod:`milarun.measure.acceptance` (``2(n-1)/n`` all-reduce; ``(n-1)/n`` all-gather,
reduce-scatter, all-to-all; ``1`` broadcast). ``S`` is counted as nccl-tests counts it
(the gathered output of an all-gather, the input of a reduce-scatter); the element count
is float32, rounded down to a multiple of the ranks where the collective splits it, and
the record holds the bytes really moved.

**Correctness.** Before the timed batch of every (collective, size), each rank fills its
input with a known pattern (``(rank + 1) × (i mod 13 + 1)``: its sums stay below 2**24,
exact in float32, up to about 1,600 ranks), runs the
collective once, and checks every element of its result against the expected values on
every rank (in chunks, no full-size copy). The ranks then agree (an all-reduce of the
bad ranks): a wrong result anywhere raises :class:`WrongResult` on every rank, a FAIL
record with reason ``wrong-result`` naming the collective, size, rank and error, not a
crash or a hang.

**The record.** ``collectives``: one row per (collective, size) with ``op``, ``bytes``,
``time_s``, ``algbw_gbps``, ``busbw_gbps`` (and ``ranks``). The rate logger counts
**one item per bus byte** (``S × factor`` per operation, timed operations only), so the
run's throughput is bus bytes/s over the whole sweep, a mix of sizes: the per-size
table is the measure. ``metrics``: ``busbw_<op>_max_gbps`` (the best of the sweep),
``busbw_<op>_at_max_size_gbps``, and the expected peak where known:
``nvlink_version``, ``nvlink_links``, ``nvlink_peak_gbps`` (NVML), ``ib_ports``,
``ib_rate_gbits`` (the active ports' Gb/s summed, from
``/sys/class/infiniband/*/ports/*/rate``), ``expected_busbw_gbps`` and
``expected_bound`` (nvlink or network), and ``busbw_all_reduce_vs_expected``.

**Groups** (``--groups``, :mod:`milarun.measure.fabric`): besides the whole ``world``, each
node's ranks (``node``), local rank ``i`` of every node (``rail``) and nodes paired in
``--pair-rounds`` rounds (``pairs``), every group of a kind at once after one world
barrier, as nccl-tests' ``NCCL_TESTS_SPLIT``. Such a row holds the slowest group's figures
and each group's (``groups``); with ``pairs`` the record's ``fabric`` is the verdict that
names a bad node or a bad link (:func:`milarun.measure.fabric.localise`).

The sweep ends the run: ``--max-count`` and ``--min-steady`` do not apply. Runs as
``njobs`` (a node's GPUs), ``multi-node`` and ``node-progression`` under torchrun;
alone, a world of one (busbw factors of 0 for all but broadcast).

Stresses: NVLink / PCIe inside a node, the network (InfiniBand, RoCE) between nodes.
"""

import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from coleo import Option, default, tooled

from ..bench import device as bench_device
from ..bench import init_torch, iteration_wrapper
from ..bench.distributed import process_group
from ..bench.experiment import node_name
from ..bench.options import backend_option
from ..host import accel
from ..host.interconnect import active_rates, infiniband_ports
from ..measure import acceptance, fabric

#: Nothing is trained.
NO_LOSS = "collectives moves messages between ranks; nothing is trained"
#: ``--max-size`` default: 8 GiB on a GPU (nccl-tests' ``-e 8G``), 1 MiB on the CPU.
DEFAULT_MAX_SIZE = {"gpu": 8 * 2**30, "cpu": 2**20}
#: Elements checked at a time (a chunk's expected values are built, then compared).
CHECK_CHUNK = 1 << 24


class WrongResult(RuntimeError):
    """A collective returned a wrong result on some rank: FAIL, reason ``wrong-result``."""

    fail_reason = "wrong-result"


def main(exp, argv):
    """Entry point: under torchrun, ``... -m milarun run milarun.models.collectives:main
    -- ARGS``; alone, a world of one.

    Items are bus bytes; the per-size table is the record's ``collectives``.
    """
    exp.cli(train, argv)


def parse_ops(text):
    """The collectives of ``--ops`` (comma-separated; ``all``: every one).

    Raises:
        ValueError: an unknown or empty list.
    """
    if str(text).strip() == "all":
        return list(acceptance.COLLECTIVES)
    ops = [o.strip().replace("-", "_") for o in str(text).split(",") if o.strip()]
    bad = [o for o in ops if o not in acceptance.COLLECTIVES]
    if not ops or bad:
        raise ValueError(
            f"--ops must list some of {', '.join(acceptance.COLLECTIVES)} "
            f"(or all); unknown: {', '.join(bad) or '(none given)'}"
        )
    return ops


def _hook_result(op, nbytes, rank, out):
    """Where the tests corrupt a result (monkeypatched); returns ``out``."""
    return out


def _hook_run(buf):
    """Called before every operation: where the tests slow a node or a link (patched)."""


@dataclass(frozen=True)
class _View:
    """This rank's place in the group one operation runs over: ``size`` ranks, this rank's
    ``rank`` among them, the ``torch.distributed`` ``group`` (None: the world) and the
    names of the group's ``nodes``."""

    size: int
    rank: int
    device: torch.device
    group: object = None
    nodes: tuple = ()


def _pattern(start, end, device):
    return (torch.arange(start, end, device=device, dtype=torch.int64) % 13 + 1).float()


class _Buffers:
    """The input and output of one collective at one size, and its expected result."""

    def __init__(self, op, count, view):
        self.op = op
        self.n, self.rank, self.device = view.size, view.rank, view.device
        self.group, self.nodes = view.group, view.nodes
        n = self.n
        self.count = count
        self.chunk = count // n if op in ("all_gather", "reduce_scatter", "all_to_all") else count
        in_count = self.chunk if op == "all_gather" else count
        out_count = self.chunk if op == "reduce_scatter" else count
        self.inp = torch.empty(in_count, dtype=torch.float32, device=self.device)
        self.out = (
            self.inp
            if op in ("all_reduce", "broadcast")
            else torch.empty(out_count, dtype=torch.float32, device=self.device)
        )

    def fill(self):
        """The input pattern (module docstring)."""
        r, c = self.rank, self.chunk
        for s in range(0, self.inp.numel(), CHECK_CHUNK):
            e = min(self.inp.numel(), s + CHECK_CHUNK)
            offset = r * c if self.op == "all_gather" else 0
            value = _pattern(s + offset, e + offset, self.device) * (r + 1)
            if self.op == "broadcast" and r != 0:
                value.zero_()
            self.inp[s:e].copy_(value)

    def run(self):
        op, group = self.op, self.group
        _hook_run(self)
        if op == "all_reduce":
            dist.all_reduce(self.inp, group=group)
        elif op == "broadcast":
            # the group's first rank is the root (a global rank, as torch takes it)
            root = 0 if group is None else dist.get_global_rank(group, 0)
            dist.broadcast(self.inp, root, group=group)
        elif op == "all_gather":
            if hasattr(dist, "all_gather_single"):
                dist.all_gather_single(self.out, self.inp, group=group)
            else:
                dist.all_gather_into_tensor(self.out, self.inp, group=group)
        elif op == "reduce_scatter":
            if hasattr(dist, "reduce_scatter_single"):
                dist.reduce_scatter_single(self.out, self.inp, group=group)
            else:
                dist.reduce_scatter_tensor(self.out, self.inp, group=group)
        else:
            dist.all_to_all_single(self.out, self.inp, group=group)

    def expected(self, s, e):
        """The expected output elements ``[s, e)`` on this rank."""
        n, r, c, dev = self.n, self.rank, self.chunk, self.device
        total = n * (n + 1) / 2
        if self.op == "all_reduce":
            return _pattern(s, e, dev) * total
        if self.op == "broadcast":
            return _pattern(s, e, dev)
        if self.op == "reduce_scatter":
            return _pattern(r * c + s, r * c + e, dev) * total
        idx = torch.arange(s, e, device=dev, dtype=torch.int64)
        src = idx // c  # the rank this element came from
        if self.op == "all_gather":
            return (idx % 13 + 1).float() * (src + 1).float()
        # all_to_all: out[src*c + k] = input_src[r*c + k]
        return ((r * c + idx % c) % 13 + 1).float() * (src + 1).float()

    def max_error(self):
        """The largest |result - expected| over this rank's output."""
        worst = 0.0
        out = self.out
        for s in range(0, out.numel(), CHECK_CHUNK):
            e = min(out.numel(), s + CHECK_CHUNK)
            err = (out[s:e] - self.expected(s, e)).abs().max().item()
            if not err == err:  # NaN
                return float("inf")
            worst = max(worst, err)
        return worst


def _check(buf, op, world, nbytes, where):
    """Fill, run once, check on every rank of every group, agree over the world: raises
    :class:`WrongResult`. ``buf`` is None on a rank that sits this operation out."""
    err = 0.0
    if buf is not None:
        buf.fill()
        buf.run()
        buf.out = _hook_result(op, nbytes, world.rank, buf.out)
        err = buf.max_error()
    wrong = err != 0.0
    bad = torch.tensor([1 if wrong else 0], dtype=torch.int64, device=world.device)
    first = torch.tensor(
        [world.rank if wrong else world.size], dtype=torch.int64, device=world.device
    )
    worst = torch.tensor([min(err, 3e38)], dtype=torch.float32, device=world.device)
    dist.all_reduce(bad)
    dist.all_reduce(first, op=dist.ReduceOp.MIN)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if int(bad.item()):
        raise WrongResult(
            f"{op} of {nbytes} B {where} returned a wrong "
            f"result on {int(bad.item())} rank(s) (first: rank "
            f"{int(first.item())}); largest error {float(worst.item()):.6g}"
        )


def _timed(buf, world, warmup, iters, slot, slots):
    """Seconds of one operation of each group, averaged over the group's ranks: a list of
    ``slots`` figures, this rank's group's at ``slot`` (``buf`` None: this rank sits out).
    Every group starts at the same world barrier, so the groups run at once."""
    if buf is not None:
        for _ in range(warmup):
            buf.run()
    cuda = bench_device.is_cuda(world.device)
    if cuda:
        torch.cuda.synchronize(world.device)
    dist.barrier()
    seconds = 0.0
    if buf is not None and cuda:
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        for _ in range(iters):
            buf.run()
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000.0
    elif buf is not None:
        t0 = time.perf_counter()
        for _ in range(iters):
            buf.run()
        seconds = time.perf_counter() - t0
    # each group's mean time, summed into its slot over the world
    t = torch.zeros(slots, dtype=torch.float64, device=world.device)
    if buf is not None:
        t[slot] = seconds / iters / buf.n
    dist.all_reduce(t)
    return [float(x) for x in t.tolist()]


def expected_peak(world_size, nodes, gpus_per_node, root="/"):
    """The metrics of the expected peak: NVLink from the device backend (this node's
    first GPU), the node's InfiniBand / RoCE ports from sysfs (module docstring)."""
    out = {}
    nvlink_gbps = None
    name = os.environ.get("MILARUN_BACKEND") or "nvidia"
    if name in accel.VENDOR_OF and name != "cpu":
        try:
            backend = accel.get(name)
            found = backend.discover()
            link = backend.nvlink(found[0]) if found else None
        except Exception:
            link = None
        if link:
            nvlink_gbps = acceptance.nvlink_peak_gbps(link.get("version"), link.get("links"))
            out.update(
                {
                    "nvlink_version": link.get("version"),
                    "nvlink_links": link.get("links"),
                    "nvlink_peak_gbps": nvlink_gbps,
                }
            )
    ports = infiniband_ports(root)
    rates = active_rates(ports)
    out["ib_ports"] = len(rates)
    if rates:
        out["ib_rate_gbits"] = sum(rates)
    peak, bound = acceptance.expected_busbw_gbps(nvlink_gbps, rates, gpus_per_node, nodes)
    if peak is not None:
        out.update({"expected_busbw_gbps": peak, "expected_bound": bound})
    return out


@tooled
def train(exp):
    # Collectives to measure, comma-separated among all_reduce, all_gather, reduce_scatter,
    # all_to_all, broadcast (all: every one)
    ops: Option = default("all")
    # Smallest message, in bytes (8 to 64 GiB)
    min_size: Option & int = default(8)
    # Largest message, in bytes, doubling from --min-size (0: 8 GiB on a GPU, 1 MiB on the CPU)
    max_size: Option & int = default(0)
    # Untimed operations before the timed ones, per collective and size (0 to 10000)
    warmup_iters: Option & int = default(5)
    # Timed operations per collective and size (1 to 100000)
    iters: Option & int = default(20)
    # Groups each collective runs over, comma-separated among world, node (each node's
    # ranks), rail (local rank i of every node), pairs (nodes paired in rounds); all: every one
    groups: Option = default("world")
    # Rounds of node pairs for --groups pairs: each node meets this many partners (1 to 64)
    pair_rounds: Option & int = default(3)
    # Fraction below the reference node's figure at which a pair is slow (0 to 0.9)
    pair_tolerance: Option & float = default(fabric.TOLERANCE)
    backend = backend_option()

    # every bad input is one error before anything runs
    names = parse_ops(ops)
    kinds = fabric.parse_groups(groups)
    if not 0 <= warmup_iters <= 10000:
        raise ValueError(f"--warmup-iters must be between 0 and 10000, not {warmup_iters}")
    if not 1 <= iters <= 100000:
        raise ValueError(f"--iters must be between 1 and 100000, not {iters}")
    if not 1 <= pair_rounds <= 64:
        raise ValueError(f"--pair-rounds must be between 1 and 64, not {pair_rounds}")
    if not 0 <= pair_tolerance <= 0.9:
        raise ValueError(f"--pair-tolerance must be between 0 and 0.9, not {pair_tolerance}")
    if max_size:
        acceptance.message_sizes(max_size, min_size)
    device = init_torch(exp)
    if not max_size:
        max_size = DEFAULT_MAX_SIZE["cpu" if bench_device.kind(device) == "cpu" else "gpu"]
    sizes = acceptance.message_sizes(max_size, min_size)
    with process_group(exp, device, backend) as world:
        layouts = _layouts(exp, world, kinds, pair_rounds)
        _sweep(exp, world, names, sizes, warmup_iters, iters, layouts)
        pairs = fabric.pair_figures(exp.result.get("collectives", []))
        if pairs or "pairs" in kinds:
            exp.result["fabric"] = fabric.localise(pairs, pair_tolerance)


class _Layout:
    """One group kind's rounds: per round, the rank lists of its groups, this rank's
    :class:`_View` (None where it sits the round out) and each group's node names."""

    def __init__(self, kind, rounds, world, names):
        self.kind = kind
        self.rounds = []
        for ranks_list in rounds:
            if kind == "world":
                handles = [None]
            else:  # every rank creates every group, in the same order
                handles = [dist.new_group(ranks) for ranks in ranks_list]
            view = None
            labels = []
            for ranks, handle in zip(ranks_list, handles):
                nodes = tuple(dict.fromkeys(names[r] for r in ranks))
                labels.append(nodes)
                if world.rank in ranks:
                    view = _View(len(ranks), ranks.index(world.rank), world.device, handle, nodes)
            self.rounds.append((ranks_list, view, labels))


def _layouts(exp, world, kinds, rounds):
    """The :class:`_Layout` of each kind of ``--groups``; a kind that is the world again or
    has no group of two ranks (``node`` on one node, ``rail`` with one rank per node or one
    node, ``pairs`` on one node) is left out and named in ``groups_skipped``."""
    mine = node_name(exp.result.get("node"))
    gathered = [None] * world.size
    dist.all_gather_object(gathered, mine)
    n, per_node = world.size, max(1, world.local_size)
    nodes = n // per_node if n % per_node == 0 else 0
    names = [str(x) for x in gathered]
    # one name per node: a name two nodes share (one host in the tests) gets its node index
    by_node = [names[i * per_node] for i in range(nodes)]
    if len(set(by_node)) < len(by_node):
        names = [f"{names[r]}#{r // per_node}" for r in range(n)]
    skipped, out = [], []
    for kind in kinds:
        if kind == "world":
            out.append(_Layout(kind, [[list(range(n))]], world, names))
        elif nodes < 2 or (kind == "rail" and per_node < 2):
            skipped.append(kind)
        elif kind == "node":
            out.append(_Layout(kind, [fabric.node_groups(n, per_node)], world, names))
        elif kind == "rail":
            out.append(_Layout(kind, [fabric.rail_groups(n, per_node)], world, names))
        else:
            out.append(_Layout(kind, fabric.pair_groups(n, per_node, rounds), world, names))
    exp.metrics["groups"] = ",".join(layout.kind for layout in out)
    if skipped:
        exp.metrics["groups_skipped"] = ",".join(skipped)
    return out


def _sweep(exp, world, names, sizes, warmup, iters, layouts):
    nodes = max(1, world.size // max(1, world.local_size))
    exp.metrics.update(expected_peak(world.size, nodes, world.local_size))
    exp.metrics.update(
        {
            "ops": ",".join(names),
            "min_size": sizes[0],
            "max_size": sizes[-1],
            "iters": iters,
            "warmup_iters": warmup,
        }
    )
    tasks = [(layout, op, size) for layout in layouts for op in names for size in sizes]
    rows = []
    steps = iteration_wrapper(exp)
    exp.rate.max_count = None  # the sweep ends the run
    if world.rank != 0 and exp.rate.tracer is None:
        exp.rate.follow()
    for step, (layout, op, size) in zip(steps, tasks):
        exp.rate.cut()  # each (groups, collective, size) its own sample
        row, moved = _measure(layout, op, size, world, warmup, iters)
        rows.append(row)
        step.set_count(int(round(moved)) or 1)
    steps.close()
    exp.result["collectives"] = rows
    for layout in layouts:
        tag = "" if layout.kind == "world" else f"_{layout.kind}"
        for op in names:
            mine = [
                r
                for r in rows
                if r["op"] == op and r["group"] == layout.kind and r["busbw_gbps"] is not None
            ]
            if mine:
                exp.metrics[f"busbw_{op}{tag}_max_gbps"] = max(r["busbw_gbps"] for r in mine)
                exp.metrics[f"busbw_{op}{tag}_at_max_size_gbps"] = mine[-1]["busbw_gbps"]
    peak = exp.metrics.get("expected_busbw_gbps")
    best = exp.metrics.get("busbw_all_reduce_max_gbps")
    if peak and best is not None:
        exp.metrics["busbw_all_reduce_vs_expected"] = best / peak


def _measure(layout, op, size, world, warmup, iters):
    """One (group kind, collective, size): every round of the layout in turn, each group of
    a round at once. Returns the row (the slowest group's figures, and each group's under
    ``groups`` where the kind splits the world) and the bus bytes moved (the items)."""
    entries, moved, row = [], 0.0, None
    for index, (ranks_list, view, labels) in enumerate(layout.rounds):
        ranks = len(ranks_list[0])
        count, nbytes = acceptance.elements_for(op, size, ranks)
        buf = _Buffers(op, count, view) if view is not None else None
        where = f"over {ranks} ranks" + ("" if layout.kind == "world" else f" ({layout.kind})")
        _check(buf, op, world, nbytes, where)
        slot = next((i for i, r in enumerate(ranks_list) if world.rank in r), 0)
        times = _timed(buf, world, warmup, iters, slot, len(ranks_list))
        del buf
        factor = acceptance.bus_factor(op, ranks)
        moved += nbytes * factor * iters * len(ranks_list)
        for seconds, nodes in zip(times, labels):
            algbw, busbw = acceptance.bandwidths(op, nbytes, seconds, ranks)
            entry = {
                "nodes": list(nodes),
                "time_s": seconds,
                "algbw_gbps": algbw,
                "busbw_gbps": busbw,
            }
            if layout.kind == "rail":
                entry["rail"] = len(entries)
            if layout.kind == "pairs":
                entry["round"] = index
            entries.append(entry)
        row = {"op": op, "bytes": nbytes, "ranks": ranks, "group": layout.kind}
    slowest = max(entries, key=lambda e: e["time_s"])
    row.update({k: slowest[k] for k in ("time_s", "algbw_gbps", "busbw_gbps")})
    if layout.kind != "world":
        row["groups"] = entries
    return row, moved
