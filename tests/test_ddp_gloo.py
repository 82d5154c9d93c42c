"""Collectives of a DDP job over real gloo ranks on the CPU: the
``--min-steady`` stop decision (item 3) and the gathering of every node's GPU readings
to rank 0 (item 1).

Each rank is a process with its own fake clock, skewed so that at the count target one
rank's steady state is long enough while another's is short. Before the decision was
collective, the short rank entered ``all_reduce(MAX)`` while the other stopped: a
hang (here a gloo timeout of a few seconds). Now every rank all-reduces its
shortfall and all extend together, so every rank stops on the same step.
"""

import datetime
import multiprocessing
import os
import socket

from milarun.bench.rate import RateLogger

RANKS = 3
#: Seconds each rank's fake clock advances per step: rank 0 is slow enough that its
#: steady state covers ``min_steady`` at the count target, the others are not.
STEP_S = (0.1, 0.04, 0.05)


class FakeClock:
    def __init__(self, offset):
        self.t = 100.0 + offset

    def __call__(self):
        return self.t


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, port, queue):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=RANKS,
            timeout=datetime.timedelta(seconds=4),
        )

        def agree(extra):
            t = torch.tensor([int(extra)], dtype=torch.int64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return int(t.item())

        clock = FakeClock(offset=0.2 * rank)  # skewed origins as well as rates
        logger = RateLogger(
            sample_duration=0.5,
            max_count=40,
            warmup=1,
            host_clock=clock,
            min_steady=2.0,
            agree=agree,
        )
        steps = 0
        for step in logger.steps():
            clock.t += STEP_S[rank]
            step.set_count(1)
            steps += 1
            # the gradient all-reduce of a real DDP step: ranks in lockstep
            dist.all_reduce(torch.ones(1))
        dist.barrier()
        queue.put((rank, steps, logger.total))
    except Exception as exc:  # a timeout: the ranks took different collectives
        queue.put((rank, "error", f"{type(exc).__name__}: {exc}"[:200]))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run_ranks(target, ranks):
    """``target(rank, port, queue)`` in ``ranks`` forked processes; what each put, by rank."""
    import torch  # noqa: F401  (imported once, before the fork: the ranks start fast)

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=target, args=(r, port, queue)) for r in range(ranks)]
    for p in procs:
        p.start()
    try:
        return sorted(queue.get(timeout=60) for _ in range(ranks))
    finally:
        for p in procs:
            p.join(timeout=15)
            if p.is_alive():
                p.kill()


def test_min_steady_decision_is_collective_over_gloo_ranks():
    got = _run_ranks(_rank, RANKS)
    errors = [g for g in got if g[1] == "error"]
    assert not errors, errors
    steps = {g[1] for g in got}
    totals = {g[2] for g in got}
    assert len(steps) == 1 and len(totals) == 1, got
    assert totals.pop() > 40  # the short ranks' shortfall extended every rank


class FakeMonitor:
    """A node's GPU monitor: one GPU at ``watts``, a reading every second of its clock."""

    def __init__(self, watts, t0):
        self.watts, self.t0, self.stopped = watts, t0, False

    def stop(self):
        self.stopped = True

    def record(self):
        assert self.stopped  # stopped (its last reading taken) before it is gathered
        return {
            "available": True,
            "reason": None,
            "interval": 1.0,
            "samples": [{"t": self.t0 + k, "device": 0, "power": self.watts} for k in range(3)],
        }


def _node(rank, port, queue):
    """Rank ``rank`` is LOCAL_RANK 0 of node ``rank`` (two single-rank nodes)."""
    import torch.distributed as dist

    from milarun.bench.experiment import Experiment

    os.environ.update(
        {"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": "0", "MILARUN_NODE": f"node{rank}"}
    )
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=2,
            timeout=datetime.timedelta(seconds=10),
        )
        exp = Experiment("s.t")
        # node 1's experiment started 100 s later on its own clock: its readings' t
        # are 100 s lower than rank 0's for the same instant
        exp.origin += 100.0 * rank
        exp._monitor_holder.append(FakeMonitor(300.0 + 200.0 * rank, t0=5.0 - 100.0 * rank))
        merged = exp.gather_monitors()
        queue.put((rank, merged))
    except Exception as exc:
        queue.put((rank, f"{type(exc).__name__}: {exc}"[:300]))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_every_nodes_gpu_readings_reach_rank_0():
    (_, merged), (_, other) = _run_ranks(_node, 2)
    assert isinstance(merged, dict), merged
    assert other is None  # only rank 0 holds the record
    assert (merged["nodes"], merged["nodes_sampled"]) == (2, 2)
    by_node = {}
    for row in merged["samples"]:
        by_node.setdefault(row["node"], []).append(row)
    assert [r["power"] for r in by_node[1]] == [500.0] * 3
    # node 1's readings moved onto rank 0's clock (within the barrier's exit skew)
    for a, b in zip(by_node[0], by_node[1]):
        assert abs(a["t"] - b["t"]) < 0.5
