"""Data-parallel set-up inside the child: torchrun's ranks, the process group, agreement.

A DDP model does::

    device = init_torch(exp)
    with process_group(exp, device) as world:
        ...build the model on world.device, wrap it in DDP...
        steps = iteration_wrapper(exp)      # or dataloop(exp, loader)
        agree_on_counts(exp, world)
        for step in steps:
            ...
            step.set_count(batch_size * world.size)   # rank 0 counts the global batch

Under torchrun (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/
``MASTER_PORT`` in the environment) the group joins the job's other ranks;
without torchrun it is a world of one on a free local port, so the code path
is the same. Only rank 0 writes the result (``Experiment.write``).
"""

import contextlib
import datetime
import gc
import os
import sys
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

# DDP's first construction imports torch.distributed.nn.functional, whose functions take
# ``group=group.WORLD`` as a default argument. Imported after init_process_group, those
# defaults keep the default group alive: destroy_process_group() cannot free it, and its
# threads and sockets are torn down in the interpreter's own shutdown instead, when the
# peers may be gone (a rank aborted there with "terminate called without an active
# exception"). Imported before any group exists (here), the defaults are None.
import torch.distributed.nn  # noqa: F401
from torch.nn.parallel import DistributedDataParallel

from ..errors import say
from ..formats import barrier
from ..host.net import free_port
from .device import is_cuda
from .setup import WrongDevice

#: Seconds of torch's own default process-group timeout (``torch.distributed``:
#: 10 min for NCCL, 30 min for the others); a group gets at least this much.
DEFAULT_PG_TIMEOUT_S = {"nccl": 600.0}
DEFAULT_OTHER_PG_TIMEOUT_S = 1800.0
#: Seconds of margin above the start barrier's timeout: the other ranks wait in a
#: collective (:func:`milarun.bench.sync._rank_barrier`) while rank 0 waits at the
#: launcher's barrier, and must not be timed out first.
BARRIER_MARGIN_S = 60.0


@dataclass(frozen=True)
class World:
    """This rank's place in the job: the one reading of torchrun's environment
    (:meth:`from_environment`; outside torchrun, a world of one).

    Attributes:
        size: ranks in the job (``WORLD_SIZE``).
        rank: this rank (``RANK``).
        local_rank: rank on this node (``LOCAL_RANK``).
        local_size: ranks on this node (``LOCAL_WORLD_SIZE``, else ``size``).
        backend: process-group backend (``"nccl"``, ``"gloo"``, ...), once
            :func:`process_group` made the group.
        device: this rank's ``torch.device`` (``cuda:LOCAL_RANK`` on CUDA), idem.
        node_rank: this node's rank (``GROUP_RANK``).
        master_addr, master_port: the master's address (``MASTER_ADDR``,
            ``MASTER_PORT``), or None where unset.
        run_id: torchrun's run id (``TORCHELASTIC_RUN_ID``; ``none`` for a
            static rendezvous), or None.
        torchrun: this process is a rank of a torchrun job (``WORLD_SIZE`` or
            ``LOCAL_RANK`` in the environment; torchrun sets both).
        restart_count: how many times torchrun restarted the job's workers before this
            attempt (``TORCHELASTIC_RESTART_COUNT``; 0 for the first).
        max_restarts: the restarts torchrun allows (``TORCHELASTIC_MAX_RESTARTS``, its
            ``--max-restarts``; 0 outside torchrun).
    """

    size: int = 1
    rank: int = 0
    local_rank: int = 0
    local_size: int = 1
    backend: str | None = None
    device: torch.device | None = None
    node_rank: int = 0
    master_addr: str | None = None
    master_port: str | None = None
    run_id: str | None = None
    torchrun: bool = False
    restart_count: int = 0
    max_restarts: int = 0

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> "World":
        """The world torchrun's variables describe (``os.environ`` by default); an
        unset or empty variable takes its default.

        Raises:
            ValueError: a variable that is not an integer.
        """
        environ = os.environ if environ is None else environ

        def number(name: str, default: int) -> int:
            value = environ.get(name, "")
            return int(value) if value else default

        size = number("WORLD_SIZE", 1)
        return cls(
            size=size,
            rank=number("RANK", 0),
            local_rank=number("LOCAL_RANK", 0),
            local_size=number("LOCAL_WORLD_SIZE", size),
            node_rank=number("GROUP_RANK", 0),
            master_addr=environ.get("MASTER_ADDR"),
            master_port=environ.get("MASTER_PORT"),
            run_id=environ.get("TORCHELASTIC_RUN_ID") or None,
            torchrun="WORLD_SIZE" in environ or "LOCAL_RANK" in environ,
            restart_count=number("TORCHELASTIC_RESTART_COUNT", 0),
            max_restarts=number("TORCHELASTIC_MAX_RESTARTS", 0),
        )


@contextlib.contextmanager
def process_group(exp: Any, device: torch.device, backend: str = "auto") -> Iterator[World]:
    """Join the job's process group for the ``with`` body, then leave it cleanly.

    On CUDA, the rank's device becomes ``cuda:LOCAL_RANK`` (also
    ``exp.device``), given to ``init_process_group`` as ``device_id`` (NCCL
    binds the group to it at once). On every device type the ranks of a node
    share its CPUs: :func:`rank_threads` intra-op threads each (the cpuset
    ``init_torch`` counted, divided by ``LOCAL_WORLD_SIZE``), recorded as
    ``host.threads``. Once the group exists, :meth:`Experiment.gather_hosts`
    records the job (every rank calls it here, as a collective must be), and
    ``world_size``, ``backend`` and ``rank`` go to the result's metrics.

    A job torchrun may restart (``--max-restarts`` above 0) joins through a store prefix of
    its start: the ranks count themselves in torchrun's store, which can keep a previous
    attempt's addresses (the soak mode, :mod:`milarun.models.soak`).

    The group's timeout is :func:`group_timeout_s`: never shorter than the
    start barrier's (``--barrier-timeout``), during which the other ranks wait
    in a collective for rank 0.

    On leaving without an error, every node's GPU readings go to rank 0
    (:meth:`Experiment.gather_monitors`) and every rank meets at a barrier (so no rank
    closes its connections while another still has work in flight); after an error
    there is no barrier, as the other ranks may never reach it. Then the group is
    destroyed once the workload's function has returned (``exp.at_end``, run by
    ``Experiment.execute``; at once for an ``exp`` without it): a model, optimizer or
    sharded tensor still bound to one of its locals would keep the group alive, and
    a coleo ``@tooled`` function keeps even a tuple it unpacked until it returns.
    Destroyed, every group must also be freed
    (:func:`release_groups`): a group some object still holds keeps its
    backend's threads until the interpreter's exit, where a gloo rank can abort
    (SIGABRT, ``terminate called without an active exception``) after rank 0
    wrote its result. This is the one end of every distributed workload: the
    record is written after it (``Experiment.execute``), so it is final only
    once the group is gone.

    Args:
        exp: the ``Experiment``.
        device: the ``torch.device`` from ``init_torch``.
        backend: ``"auto"`` (``nccl`` on CUDA, ``gloo`` on the CPU) or a
            ``torch.distributed`` backend name.

    Yields:
        :class:`World`.

    A process group still referenced once destroyed (see :func:`release_groups`) after a
    body without an error is counted in the result's metrics (``process_groups_left``)
    and said in one warning line.
    """
    env = World.from_environment()
    size, rank, local_rank, local_size = env.size, env.rank, env.local_rank, env.local_size
    threads = rank_threads(torch.get_num_threads(), local_size)
    torch.set_num_threads(threads)
    exp.result["host"]["threads"] = threads
    if is_cuda(device):
        check_local_device(local_rank)
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        exp.device = device
    if backend == "auto":
        backend = "nccl" if is_cuda(device) else "gloo"
    timeout = datetime.timedelta(seconds=group_timeout_s(backend))
    extra: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
    if env.master_addr is not None and env.max_restarts:
        # A job torchrun may restart: its store can outlive an attempt, with the last
        # attempt's addresses in it, and a restarted rank that reads them before its peer
        # replaces them fails to connect. Each start of the job gets a prefix of its own:
        # the ranks count themselves in the store, the first ``size`` are start 0, the next
        # start 1, the same on every node (torchrun's restart count is not: an agent whose
        # ranks did not fail restarts them without counting).
        store, _, _ = next(dist.rendezvous("env://", rank, size, timeout=timeout))
        start = (store.add("milarun/ranks-started", 1) - 1) // size
        store = dist.PrefixStore(f"milarun-start-{start}/", store)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=size, timeout=timeout, **extra
        )
    elif env.master_addr is not None:
        dist.init_process_group(backend, rank=rank, world_size=size, timeout=timeout, **extra)
    else:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{free_port('127.0.0.1')}",
            rank=0,
            world_size=1,
            timeout=timeout,
            **extra,
        )
    ended = False

    def leave() -> None:
        left = release_groups()
        # After an error the traceback's frames may still hold the model (and its
        # groups): that failure is the one to report. Without one, a group still held
        # is recorded and said, not failed: something other than a device mesh holds it
        # (a DDP model a workload kept), and the test's figures are right; if a rank
        # then dies at exit, the launch is FAIL exit-after-result.
        if ended and left:
            exp.metrics["process_groups_left"] = left
            say(f"milarun: warning: {kept_alive_message(left)}")

    try:
        exp.gather_hosts()
        exp.metrics.update({"world_size": size, "backend": backend, "rank": rank})
        yield replace(env, backend=backend, device=device)
        exp.gather_monitors()
        dist.barrier()
        ended = True
    finally:
        at_end = getattr(exp, "at_end", None)
        if at_end is None:
            leave()
        else:
            at_end.append(leave)


def kept_alive_message(count: int) -> str:
    """The one line said when ``count`` process groups outlive ``destroy_process_group``."""
    return (
        f"{count} process group(s) still referenced after destroy_process_group: their "
        "threads are torn down at the interpreter's exit, where a rank can abort (gloo) or "
        "hang (NCCL) after the result is written (something other than a device mesh "
        "holds it: a DDP model, the group itself)"
    )


def forget_meshes() -> int:
    """Empty the group registry of every device mesh still alive, so that no mesh keeps a
    destroyed process group (and its backend's threads) alive.

    A ``DeviceMesh`` holds its process groups (``DeviceMesh._pg_registry``, torch 2.11 to
    2.13), and torch keeps meshes for the life of the process once FSDP2 or a DTensor op
    ran: in its sharding-propagation and redistribution caches, and in torch 2.11 also in
    objects no Python container references (found with ``gc.get_referrers``: a
    ``(OpStrategy,)`` tuple from FSDP2's ``fully_shard``, held from C++). Rather than name
    every such cache for every torch, the meshes themselves are found among the objects
    the collector tracks and emptied; a destroyed group is of no use to them. The scan
    takes tens of milliseconds (0.02 s over 180,000 objects after ``import torch``, on
    the 2-core VM), once a workload.

    Returns:
        how many meshes were emptied.
    """
    module = sys.modules.get("torch.distributed.device_mesh")
    mesh_type = getattr(module, "DeviceMesh", None)
    if not isinstance(mesh_type, type):
        return 0
    emptied = 0
    for obj in gc.get_objects():
        # by the type's MRO, not isinstance: DeviceMesh's metaclass (torch 2.13) checks
        # attributes of every object it is asked about, and some warn when touched
        if mesh_type in type(obj).__mro__:
            registry = getattr(obj, "_pg_registry", None)
            if isinstance(registry, dict) and registry:
                registry.clear()
                emptied += 1
    return emptied


def release_groups() -> int:
    """Destroy every process group of this process and free them.

    ``destroy_process_group`` drops torch's own references, but a group lives on
    while any object holds it: its backend's threads (gloo's work and I/O threads,
    the store's client) then run until the interpreter's exit, and a gloo thread
    releasing its last work there aborts the process. So the device meshes still
    alive let go of their groups (:func:`forget_meshes`), the cycles are collected (a
    module's hooks hold their module), and the groups, weakly referenced before
    the destruction, are checked.

    Returns:
        how many groups are still referenced (0: all were freed).
    """
    state = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
    groups = list(state.pg_map) if state is not None else [dist.group.WORLD]
    refs = []
    for group in groups:
        try:
            refs.append(weakref.ref(group))
        except TypeError:  # None, or a stand-in without weak references (a test's fake)
            continue
    groups.clear()  # this frame holds none of them
    group = None
    dist.destroy_process_group()
    forget_meshes()
    gc.collect()
    return sum(ref() is not None for ref in refs)


def check_local_device(local_rank: int, environ: Mapping[str, str] | None = None) -> None:
    """Check that this rank's GPU, ``cuda:LOCAL_RANK``, exists.

    Raises:
        WrongDevice: it does not; with several MIG instances in
            ``CUDA_VISIBLE_DEVICES`` the one line says why (CUDA gives a process
            one MIG instance, the first listed, so a whole-node test cannot
            spread its ranks over MIG instances: run them as per-GPU tests).
    """
    environ = os.environ if environ is None else environ
    count = torch.cuda.device_count()
    if local_rank < count:
        return
    visible = [v for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    migs = [v for v in visible if v.strip().startswith("MIG-")]
    if len(migs) > 1:
        raise WrongDevice(
            f"a whole-node test over {len(migs)} MIG instances cannot work: CUDA "
            "gives a process one MIG instance, so LOCAL_RANK "
            f"{local_rank} has no GPU; run MIG instances as a per-gpu test"
        )
    raise WrongDevice(
        f"LOCAL_RANK {local_rank} has no GPU: torch sees {count} "
        f"(CUDA_VISIBLE_DEVICES={environ.get('CUDA_VISIBLE_DEVICES')!r})"
    )


def rank_threads(cpuset_threads: int, local_size: int) -> int:
    """Intra-op threads of one rank (threads): ``cpuset_threads // local_size``, at least 1.

    ``cpuset_threads`` is the size of the cpuset the job runs in (``init_torch``
    set that many) and ``local_size`` the ranks on this node (``LOCAL_WORLD_SIZE``).
    The same rule on CUDA as on the CPU: 8 GPU ranks on 64 cores get 8 threads
    each, so together they use the node's cores once, as 8 per-GPU students of 8
    cores would. torchrun's default ``OMP_NUM_THREADS=1`` is overridden (as
    ``init_torch`` overrides it for every test): one thread per rank would
    starve the ranks' CPU-side work (data loading in the main process, the
    optimizer of a CPU model) on a node with cores to spare.
    """
    return max(1, int(cpuset_threads) // max(1, int(local_size)))


def group_timeout_s(backend: str, environ: Mapping[str, str] | None = None) -> float:
    """Seconds of the process group's timeout: torch's default for ``backend``, or the
    start barrier's timeout (``$MILARUN_BARRIER_TIMEOUT``, set from ``milarun jobs
    --barrier-timeout``) plus :data:`BARRIER_MARGIN_S` when that is longer."""
    base = DEFAULT_PG_TIMEOUT_S.get(backend, DEFAULT_OTHER_PG_TIMEOUT_S)
    try:
        config = barrier.from_environment(environ)
    except ValueError:
        config = None  # malformed: sync.synchronize says so with one line
    if config is None:
        return base
    return max(base, config["timeout"] + BARRIER_MARGIN_S)


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> DistributedDataParallel:
    """``model`` in ``DistributedDataParallel``: bound to ``device`` (``device_ids``) on
    CUDA, where each rank owns one GPU; with no ``device_ids`` elsewhere (the CPU, whose
    module and inputs stay where they are). Needs the process group."""
    if is_cuda(device):
        return DistributedDataParallel(model, device_ids=[device.index])
    return DistributedDataParallel(model)


def max_over_ranks(n: int, device: torch.device | None) -> int:
    """The largest int ``n`` over all ranks (an all-reduce with MAX on ``device``)."""
    t = torch.tensor([int(n)], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def agree_on_counts(exp: Any, world: World) -> None:
    """Make the ranks take every stop decision together (``--min-steady``).

    The rate logger (``exp.rate``, created by ``dataloop``/``iteration_wrapper``)
    decides at its count target whether to go on; every rank must decide the
    same, on the same step, or one would wait forever in the gradient
    all-reduce while another stops. So at that step every rank all-reduces
    its shortfall (items) with MAX, and all extend iff the result is > 0, by
    that many items (:meth:`RateLogger._extend`).

    Only rank 0 times: its samples are the record's. The other ranks'
    loggers :meth:`~milarun.bench.rate.RateLogger.follow` (no device sync at
    window boundaries, a shortfall vote of 0), unless ``--profile-trace``
    needs their windows. A no-op in a world of one.
    """
    if world.size > 1:
        exp.rate.agree = lambda extra: max_over_ranks(extra, world.device)
        if world.rank != 0 and exp.rate.tracer is None:
            exp.rate.follow()


__all__ = [
    "World",
    "process_group",
    "release_groups",
    "forget_meshes",
    "max_over_ranks",
    "wrap_ddp",
    "agree_on_counts",
    "rank_threads",
    "group_timeout_s",
]
