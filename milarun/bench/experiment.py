"""The experiment context a model runs in, inside the child process."""

import datetime
import json
import os
import platform
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from coleo import tooled

from ..errors import MilarunError, ResultFormatError
from ..formats.barrier import ENV_PREFIX
from ..formats.journal import Journal
from ..formats.jsonfile import check
from ..formats.outfile import StrPath
from ..formats.record import new_result
from ..formats.store import journal_path, result_filename, write_result
from ..formats.terminal import one_line, terminal_safe
from ..host import accel, isolation
from ..host import facts as hostfacts
from ..measure import plausibility
from .distributed import World
from .hostload import HostLoadMonitor
from .literal_options import make_cli
from .monitor import GPUMonitor, merge_node_monitors
from .options import common_options
from .rate import RateLogger
from .setup import peak_memory_mib
from .sync import synchronize

# Variables that change what a rerun does; everything else is left out of results.
RERUN_ENV_PREFIXES = (
    "MILARUN_",
    "CUDA_",
    "OMP_",
    "MKL_",
    "NCCL_",
    "TORCH_",
    "PYTORCH_",
    "MASTER_",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "PYTHONHASHSEED",
)


# ...except the start barrier of the session's wave: a rerun runs alone (the
# barrier it met is in ``timings.barrier``); nor where this user's registry of
# written records lies (milarun.formats.trust).
NOT_RERUN_PREFIXES = (ENV_PREFIX, "MILARUN_WRITTEN")


def rerun_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The subset of ``environ`` (``os.environ`` by default) needed to rerun a test."""
    environ = os.environ if environ is None else environ
    return {
        k: v
        for k, v in environ.items()
        if k.startswith(RERUN_ENV_PREFIXES) and not k.startswith(NOT_RERUN_PREFIXES)
    }


def host_facts() -> dict[str, Any]:
    """Host and isolation facts as seen from inside this process.

    Returns a dict: hostname, cpu_model, cpu_count (host cores), cpuset (list
    of core ids this process may run on), memory_limit_mib (cgroup limit,
    None when unlimited), cgroup (path), total_memory_mib, python, torch,
    cuda, gpus [{index, name, driver, memory_total_mib, uuid, pci_bus_id, parent
    (MIG: its GPU), serial (the board's serial number, None where the backend has
    none, ``"unreadable (why)"``: :meth:`milarun.host.accel.base.Backend.identity`),
    and the backend's facts, for NVIDIA those of
    :func:`milarun.host.facts.gpu_facts`}], accelerator (backend, vendor, driver,
    runtime, runtime_name: :meth:`milarun.host.accel.base.Backend.accelerator_record`;
    absent on CPU slots), and the facts of
    :func:`milarun.host.facts.host_extras` (milarun version and commit,
    kernel, CPU governor and boost, cgroup CPU quota).
    """
    import psutil

    facts: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "cpu_model": hostfacts.cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpuset": isolation.current_cpuset(),
        "memory_limit_mib": isolation.current_memory_limit_mib(),
        "cgroup": isolation.current_cgroup(),
        "total_memory_mib": psutil.virtual_memory().total / 2**20,
        "python": platform.python_version(),
        "gpus": [],
    }
    facts["torch"] = torch.__version__
    facts["cuda"] = torch.version.cuda
    facts["cuda_available"] = torch.cuda.is_available()
    facts["gpus"], accelerator = _gpus()
    if accelerator is not None:
        facts["accelerator"] = accelerator
    facts.update(hostfacts.host_extras(facts["cpuset"]))
    return facts


def _gpus() -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """``(host.gpus, host.accelerator)`` from the launcher's backend (``$MILARUN_BACKEND``,
    else the first backend that sees a device); ``([], None)`` on CPU slots."""
    name = os.environ.get("MILARUN_BACKEND")
    names = [name] if name else accel.GPU_BACKENDS
    for n in names:
        if n not in accel.VENDOR_OF:
            return [], None
        try:
            backend = accel.get(n)
            found = backend.discover()
        except Exception:
            continue
        if not found:
            continue
        record = backend.accelerator_record()
        out = []
        for d in found:
            out.append(
                {
                    "index": d.index,
                    "name": d.name,
                    "driver": record["driver"],
                    "memory_total_mib": d.memory_mib,
                    "uuid": d.uuid,
                    "pci_bus_id": d.pci_bus_id,
                    "parent": d.parent,
                    # the board's serial number (hardware identity, docs/tender.md)
                    "serial": backend.identity(d).get("serial"),
                    **backend.facts(d),
                }
            )
        return out, record
    return [], None


def node_name(given: str | None) -> str:
    """This node's name: Slurm's (srun sets it per node), else the one the launcher gave
    this node's agent (``$MILARUN_NODE``, over ssh), else ``given``, else the hostname."""
    return (
        os.environ.get("SLURMD_NODENAME")
        or os.environ.get("MILARUN_NODE")
        or given
        or socket.gethostname()
    )


def _torchrun_rendezvous(environ: Mapping[str, str]) -> dict[str, str | None]:
    """The rendezvous as torchrun's worker environment tells it.

    torchrun passes the run id (``none`` for a static rendezvous, which is
    the master address itself) but not a c10d endpoint.
    """
    world = World.from_environment(environ)
    if world.run_id and world.run_id != "none":
        return {"backend": "c10d", "endpoint": None, "id": world.run_id}
    endpoint = None
    if world.master_addr:
        endpoint = f"{world.master_addr}:{world.master_port or ''}"
    return {"backend": "static", "endpoint": endpoint, "id": None}


@tooled
def _entry(exp: "Experiment", fn: Callable[["Experiment"], Any]) -> Any:
    exp.options = common_options()
    # Run r of a test runs at seed --seed + r: every run is reproducible on its own, and
    # the repeats of a test are independent draws (MLPerf Training asks a different seed
    # per run), which the convergence check's spread needs (milarun.measure.convergence).
    run = exp.result.get("run")
    exp.options["seed"] += run if isinstance(run, int) else 0
    exp.result["seed"] = exp.options["seed"]
    return fn(exp)


#: Module attribute of a workload with no loss by nature: ``NO_LOSS = "why"``.
NO_LOSS = "NO_LOSS"
#: Module attribute of a workload whose loss must fall: ``LOSS_MUST_FALL = "why"``.
LOSS_MUST_FALL = "LOSS_MUST_FALL"


def loss_declaration(module: ModuleType | None) -> tuple[str | None, str | None]:
    """What a workload's module declares about its loss: the one place a workload says it.

    * ``NO_LOSS = "why"``: no loss by nature (no model, nothing trained). The record's
      ``no_loss`` holds the reason and the NaN-loss check does not apply
      (:mod:`milarun.measure.plausibility`).
    * ``LOSS_MUST_FALL = "why"``: its data has learnable structure, so a loss that does
      not fall says it did not train for real. The record's
      ``metrics.learning_check`` is true and the ``loss-not-decreasing`` flag applies.
    * neither: the loss it logs is NaN-checked, nothing more.

    Args:
        module: the module of the workload's ``main`` (None: nothing declared).

    Returns:
        ``(NO_LOSS, why)``, ``(LOSS_MUST_FALL, why)`` or ``(None, None)``.

    Raises:
        TypeError: a module that declares both, or a reason that is not a non-empty string.
    """
    if module is None:
        return None, None
    found = [
        (name, getattr(module, name))
        for name in (NO_LOSS, LOSS_MUST_FALL)
        if getattr(module, name, None) is not None
    ]
    if len(found) > 1:
        raise TypeError(f"{module.__name__} declares both {NO_LOSS} and {LOSS_MUST_FALL}")
    if not found:
        return None, None
    name, why = found[0]
    if not isinstance(why, str) or not why:
        raise TypeError(f"{module.__name__}.{name} must be a non-empty string (the reason)")
    return name, why


class Experiment:
    """One training run and the result record it builds.

    Args:
        name: ``suite.job`` (e.g. ``"cpu.toy_reg"``).
        job_id: ``"{run}.{device}"``.
        dataroot: dataset root folder (str or None).
        out: result directory, a ``*.json`` path, or None for stdout.
        extra: what the launcher tells the child, as passed by ``milarun
            jobs`` with ``--extra``: run, device, devices, partition, job,
            node, nodes, node_count, gpus_per_node, placeholders go into the
            result (only those given); rendezvous (``{"backend", "endpoint", "id"}``) goes
            into ``distributed`` (see :meth:`gather_hosts`).

    Raises:
        MilarunError: ``extra["rendezvous"]`` is malformed. (A bad value of
            another key is caught when the record is validated.)

    Attributes:
        options: the common options (see ``common_options``) once parsed.
        device: ``torch.device`` once ``init_torch`` ran.
        result: the record under construction.
        rate: the ``RateLogger`` of the training loop, once created.
        metrics: dict of final metrics (e.g. ``loss``) added to the result.
    """

    def __init__(
        self,
        name: str,
        job_id: str = "0.0",
        dataroot: str | None = None,
        out: "StrPath | None" = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.job_id = job_id
        self.dataroot = dataroot
        self.out = out
        extra = dict(extra or {})
        run = extra.get("run", int(job_id.split(".")[0]) if job_id.split(".")[0].isdigit() else 0)
        device = extra.get("device", job_id.split(".", 1)[1] if "." in job_id else "0")
        self.result = new_result(
            name,
            job_id,
            device=device,
            devices=extra.get("devices", [0]),
            run=run,
            plan_type=extra.get("partition", "normal"),
            node=extra.get("node"),
            nodes=extra.get("nodes"),
            gpus_per_node=extra.get("gpus_per_node"),
        )
        for key in ("job", "tags", "partition", "node_count", "placeholders"):
            if key in extra:
                self.result[key] = extra[key]
        self.rendezvous = extra.get("rendezvous")
        if self.rendezvous is not None:
            try:
                check(self.rendezvous, "result#/$defs/rendezvous", key_prefix="rendezvous")
            except ResultFormatError as exc:
                raise MilarunError(f"--extra: {exc}") from None
        self.result["dataroot"] = dataroot
        self.options: dict[str, Any] | None = None
        self.device: torch.device | None = None
        self.rate: RateLogger | None = None
        self.metrics: dict[str, Any] = {}
        self.origin = time.perf_counter()
        self.arguments: dict[str, Any] = {}
        self._monitor_holder: list[GPUMonitor] = []
        self._gathered_monitor: dict[str, Any] | None = None
        self._host_load: HostLoadMonitor | None = None
        self.journal: Journal | None = None
        # What runs once the workload's function has returned, its locals gone, before
        # the record is final: the end of its process group (bench.distributed).
        self.at_end: list[Callable[[], None]] = []

    def _open_journal(self, start: float) -> None:
        """Stream samples to ``<result stem>.journal.jsonl`` (only the process
        that writes the record, and only when writing to a file)."""
        if self.out is None or World.from_environment().rank != 0:
            return
        out = str(self.out)
        if out.endswith(".json"):
            path = journal_path(out)
        else:
            res = self.result
            path = journal_path(
                os.path.join(out, result_filename(self.name, res["run"], res["device"], True))
            )
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        except OSError:
            pass
        self.journal = Journal(path)
        self.journal.write("start", pid=os.getpid(), start=start)

    def gather_hosts(self) -> dict[str, Any] | None:
        """Record the torchrun job this process belongs to: a collective.

        Every rank must call it, once, after ``init_process_group`` (on CUDA,
        after ``torch.cuda.set_device``: NCCL gathers through the current
        device); :func:`milarun.bench.distributed.process_group` does. Each
        node's ``LOCAL_RANK`` 0 contributes its node name (``$SLURMD_NODENAME``
        under srun, ``$MILARUN_NODE`` over ssh, else ``extra["node"]``, else the
        hostname) and its ``host`` facts, gathered with ``all_gather_object``.
        Rank 0 stores them in the result as ``distributed``::

            {"world_size": ranks, "backend": "gloo"|"nccl"|...,
             "rendezvous": {"backend": "c10d"|"static", "endpoint": "host:port"|None,
                            "id": str|None},
             "master": "MASTER_ADDR:MASTER_PORT",
             "node_names": [...], "hosts": [host facts, ...]}   # in node-rank order

        The rendezvous is ``extra["rendezvous"]`` when the launcher gave it,
        else what torchrun's environment tells (``TORCHELASTIC_RUN_ID``: a run
        id other than ``none`` means c10d; a static rendezvous's endpoint is
        the master's address). It is also written to the journal, so a FAIL
        record of a job that dies later still says where it ran.

        Returns:
            the ``distributed`` dict (on every rank), or None outside torchrun
            (not a rank of a torchrun job: ``World.torchrun``) or without a process group,
            where nothing is gathered.
        """
        world = World.from_environment()
        if not world.torchrun:
            return None
        if not (dist.is_available() and dist.is_initialized()):
            return None
        mine = None
        if world.local_rank == 0:
            mine = {
                "node": node_name(self.result.get("node")),
                "host": dict(self.result.get("host") or {}),
            }
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        nodes = [entry for entry in gathered if entry is not None]
        info: dict[str, Any] = {
            "world_size": dist.get_world_size(),
            "backend": str(dist.get_backend()),
            "rendezvous": self.rendezvous or _torchrun_rendezvous(os.environ),
        }
        if world.master_addr:
            info["master"] = f"{world.master_addr}:{world.master_port or ''}"
        info["node_names"] = [entry["node"] for entry in nodes]
        info["hosts"] = [entry["host"] for entry in nodes]
        if dist.get_rank() == 0:
            self.result["distributed"] = info
            if self.journal is not None:
                self.journal.write("distributed", **info)
        return info

    def gather_monitors(self) -> dict[str, Any] | None:
        """Bring every node's GPU readings to rank 0: a collective.

        Every rank calls it once, at the end of a torchrun job, while the group
        is up (:func:`milarun.bench.distributed.process_group` does, after the
        training body). Each node's ``LOCAL_RANK`` 0 stops its monitor (a last
        reading, so the energy covers the run); every rank meets at a barrier
        and reads its sample clock; the nodes' records and clocks are gathered
        with ``all_gather_object`` and rank 0 merges them
        (:func:`milarun.bench.monitor.merge_node_monitors`) into the record's
        ``gpu_monitor``.

        Returns:
            the merged record on rank 0, else None (other ranks; outside
            torchrun or without a process group, where nothing is gathered).
        """
        world = World.from_environment()
        if not world.torchrun:
            return None
        if not (dist.is_available() and dist.is_initialized()):
            return None
        lead = world.local_rank == 0
        if lead:
            for monitor in self._monitor_holder:
                monitor.stop()
        dist.barrier()
        clock = time.perf_counter() - self.origin
        mine = None
        if lead:
            record = (
                self._monitor_holder[0].record()
                if self._monitor_holder
                else {"available": False, "reason": "not started", "interval": None, "samples": []}
            )
            mine = {"node": node_name(self.result.get("node")), "clock": clock, "monitor": record}
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        if dist.get_rank() != 0:
            return None
        entries = [entry for entry in gathered if entry is not None]
        if not entries or gathered[0] is None:
            return None
        self._gathered_monitor = merge_node_monitors(entries, clock)
        return self._gathered_monitor

    def attach_rate(self, logger: RateLogger) -> None:
        """Make ``logger`` the run's rate logger and stream its samples to the journal.

        The logger's loops wait at the wave's start barrier before their first
        window (:func:`milarun.bench.sync.synchronize`; no wait when launched alone).
        """
        self.rate = logger
        logger.before_start = lambda: synchronize(self)
        journal = self.journal
        if journal is not None:
            journal.write(
                "train",
                sample_duration=logger.sample_duration,
                warmup=logger.warmup,
                max_count=logger.max_count,
                min_steady=logger.min_steady,
            )
            logger.on_sample = lambda sample: journal.write("sample", **sample)

    def cli(self, fn: Callable[["Experiment"], Any], argv: Sequence[str]) -> Any:
        """Parse ``argv`` with coleo for the tooled ``fn`` (plus common
        options) and call ``fn(self)``. Returns what ``fn`` returns.

        ``--help`` prints the options and exits; bad options exit with 2.
        """
        opts, thunk = make_cli(_entry, argv=list(argv), extras=[common_options, fn])
        self.arguments = {k: v for k, v in vars(opts).items() if not k.startswith("#")}
        self.result["call"]["arguments"] = self.arguments
        return thunk(opts=opts, args=(self, fn))

    def execute(
        self,
        function: str,
        fn: Callable[["Experiment", list[str]], object],
        argv: Sequence[str],
        verbose: bool = False,
    ) -> int:
        """Run ``fn(self, argv)`` and write the result.

        A failure is recorded with its traceback. On the console, a
        :class:`~milarun.errors.MilarunError` (a bad dataset, a bad option: what
        the user can fix) is one line ``milarun: error: …``, as in the CLI; any
        other failure, or any with ``verbose``, prints the traceback.

        Args:
            function: ``"module:function"`` recorded for reruns.
            fn: the model's ``main(experiment, argv)``.
            argv: list of test arguments.
            verbose: print the traceback of a MilarunError too.

        Returns:
            0 on success, 1 when the test raised (the result says why).
        """
        res = self.result
        res["call"].update({"function": function, "argv": list(argv)})
        # what the workload's module declares about its loss (loss_declaration)
        declared, why = loss_declaration(sys.modules.get(getattr(fn, "__module__", None) or ""))
        if declared == NO_LOSS:
            res["no_loss"] = why
        elif declared == LOSS_MUST_FALL:
            self.metrics[plausibility.LEARNING_CHECK] = True
        res["environ"] = rerun_environ()
        res["host"] = host_facts()
        start = time.time()
        # origin: the Unix time of the samples' zero (self.origin), for lining up
        # the samples of concurrent processes (milarun.measure.throughput)
        origin = start - (time.perf_counter() - self.origin)
        res["timings"]["program"] = {"start": start, "origin": max(0.0, origin)}
        res["started"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
        self._open_journal(start)
        one_line_error = False
        try:
            fn(self, list(argv))
            res["success"] = True
        except SystemExit as exc:
            if exc.code in (0, None):
                if self.journal is not None:
                    self.journal.close(remove=True)
                return 0  # --help: nothing to record
            res["error"] = {
                "reason": "error",
                "type": "SystemExit",
                "message": f"bad test arguments (exit {exc.code})",
                "traceback": None,
            }
        except BaseException as exc:  # every failure is recorded, Ctrl-C included
            # an exception may name its own reason (barrier.BarrierTimeout: barrier-timeout)
            res["error"] = {
                "reason": getattr(exc, "fail_reason", None) or "error",
                "type": exc.__class__.__name__,
                "message": str(exc),
                "traceback": traceback.format_exc(),
            }
            one_line_error = isinstance(exc, MilarunError) and not verbose
            if isinstance(exc, KeyboardInterrupt):
                res["error"]["reason"] = "interrupted"
            elif exc.__class__.__name__ == "OutOfMemoryError":  # torch's, on any device
                res["error"]["reason"] = "oom"
        finally:
            while self.at_end:
                self.at_end.pop(0)()
            for monitor in self._monitor_holder:
                monitor.stop()
                res["gpu_monitor"] = monitor.record()
            if self._gathered_monitor is not None:  # every node's, on rank 0
                res["gpu_monitor"] = self._gathered_monitor
            if self._host_load is not None:
                self._host_load.stop()
                res["host_load"] = self._host_load.record()
        end = time.time()
        res["timings"]["program"].update({"end": end, "duration": end - start})
        res["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
        if self.rate is not None:
            res["timings"]["train"] = self.rate.summary()
            res["metrics"].update(self.rate.metrics)
        res["metrics"].update(self.metrics)
        if self.device is not None:
            res["peak_memory_mib"] = peak_memory_mib(self.device)
        if one_line_error:
            # the record keeps the traceback; the message names the file or option
            print(
                f"milarun: {res['error']['reason']}: "
                f"{terminal_safe(one_line(res['error']['message']))}",
                file=sys.stderr,
            )
        elif res["error"] and res["error"].get("traceback"):
            print(res["error"]["traceback"], file=sys.stderr)
        # nan-loss, no-steady-state: a FAIL record. Only the record's writer checks: the
        # other ranks of a torchrun job time no windows (RateLogger.follow), and their
        # samples are in no record.
        reason = plausibility.apply(res) if World.from_environment().rank == 0 else None
        if reason:
            print(f"milarun: {reason}: {res['error']['message']}", file=sys.stderr)
        self.write()
        return 0 if res["success"] else 1

    def monitor_readings(self) -> list[dict[str, Any]]:
        """A copy of this process's GPU monitor readings so far (``[]`` without a
        monitor: under ``--no-instrument``, or on a rank that samples no node)."""
        return [dict(r) for mon in self._monitor_holder for r in list(mon.samples)]

    def start_monitor(self) -> None:
        """Start the NVML monitor and the host-load sampler (called by the loops
        when training starts).

        Under torchrun only each node's ``LOCAL_RANK`` 0 starts them: both sample
        the whole node, and the other ranks' readings would be the same GPUs
        and CPUs again (:meth:`gather_monitors` brings each node's to rank 0).
        """
        options = self.options
        assert options is not None, "start_monitor runs in the loops, after the options"
        if self._monitor_holder or options["no_instrument"]:
            return
        if World.from_environment().local_rank != 0:
            return
        on_reading = on_load = None
        if self.journal is not None:
            on_reading = lambda row: self.journal.write("monitor", **row)  # noqa: E731
            on_load = lambda row: self.journal.write("host_load", **row)  # noqa: E731
        mon = GPUMonitor(
            interval=options["monitor_interval"], origin=self.origin, on_reading=on_reading
        )
        self._monitor_holder.append(mon.start())
        # who else uses the host's CPUs (milarun.measure.plausibility flags it)
        self._host_load = HostLoadMonitor(
            interval=options["monitor_interval"], origin=self.origin, on_reading=on_load
        ).start()

    def write(self) -> Path | None:
        """Write the result to ``out`` (directory or file) or print it to stdout.

        Under torchrun only rank 0 writes: the other ranks return None. Once
        the record is written, the journal is removed (its samples are in it).
        """
        if World.from_environment().rank != 0:
            return None
        if self.out is None:
            json.dump(self.result, sys.stdout, indent=1, default=str)
            sys.stdout.write("\n")
            return None
        path = write_result(self.result, self.out)
        if self.journal is not None:
            self.journal.close(remove=True)
        print(f"milarun: result written to {path}", file=sys.stderr)
        return path
