"""Job × devices × run → launches. Pure: nothing is started here.

Plan types (``per-gpu``, ``gpu-progression``, ``normal``, ``njobs``,
``multi-node``, ``node-progression``, ``multi-process``) live in :mod:`milarun.plan.types`: each
expands a job into waves of slots over a :class:`milarun.plan.nodes.Cluster`; this
module turns slots into launches (paths, command line, environment) and the
cluster wraps each command for the nodes it runs on (``srun``, ``ssh``).

A plan is a list of *waves*: launches in a wave run concurrently, waves run
in sequence. Given the launcher's start barrier, every launch of a concurrent
wave of two or more meets the others there before its timed loop
(:mod:`milarun.formats.barrier`).

The plan owns every path: each launch gets its result path (and the FAIL
path the launcher uses if the run fails) and its journal path before
anything starts, all stamped with the session id (the UTC start time of
``milarun jobs``), so two sessions never name the same record and nothing
is found by globbing. Its log, ``logs/<suite>.<job>.J<run>.<device>.log``,
is not stamped: a resumed session appends to it.

A job's arguments and exec_prefix may hold launch placeholders (``{cpu_per_gpu}``, ``{n_gpu}``,
``{gpu_memory_gb}``, ``{dataroot}``, ``{outdir}``, ``{arch}``): the plan fills
them for each launch (:func:`placeholder_values`) and tells the child their
values (``--extra``'s ``placeholders``, recorded in the result).
"""

from __future__ import annotations

import datetime
import math
import os
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SetupError
from ..formats import child
from ..formats.barrier import ENV_ADDRESS, ENV_SECRET, ENV_TIMEOUT, ENV_WAVE
from ..formats.store import journal_path, result_filename
from ..host import accel
from ..host.isolation import format_cpus, parse_cpus, wrap
from ..host.kernel import read_text
from .nodes import Cluster, local_cluster
from .types import JOIN_TIMEOUT_S, Job, Slot

if TYPE_CHECKING:
    from ..host.devices import Devices

#: TCP port of the c10d rendezvous on the main node (torchrun's usual one).
RDZV_PORT = 29400


@dataclass
class Launch:
    """One child process to start.

    Attributes:
        name: ``suite.job``.
        job: the ``Job``.
        run: repeat index.
        device: device label used in file names (``"0"``, ``"0-3"``, ``"all"``).
        devices: device indices given to the child.
        argv: full command (with cgexec/exec prefix).
        env: variables set on top of the parent's environment.
        cgroup: ``"controllers:group"`` or None.
        concurrent: True when started alongside the rest of its wave.
        group: summary group (``suite.job`` or ``suite.job.k``).
        log: log file name relative to ``OUTDIR/logs``.
        test_argv: the test's own arguments (recorded for reruns).
        timeout: seconds.
        result_path: where the child writes its record (``Path``).
        fail_path: where a failed run's record goes (``FAIL`` in the name).
        nodes: names of the nodes the launch runs on.
        cluster: the ``nodes.Cluster`` it runs on (how its failures read).
        launcher: ``"python"``, ``"torchrun"`` or ``"rendezvous"`` (see ``plantypes.Slot``).
        test_env: the variables the test itself gets (``env`` before a remote
            launch moved them into its command line); recorded in FAIL records.
        barrier_wave: the id of the concurrent wave whose start barrier the
            child meets (:mod:`milarun.formats.barrier`), or None (it does not wait).
        cpus: CPU ids the launch is pinned to with numactl, or None.
        placeholders: ``{name: value}`` of the launch placeholders its arguments
            use (see :func:`placeholder_values`); None when they use none.
    """

    name: str
    job: Job
    run: int
    device: str
    devices: list[int]
    argv: list[str]
    env: dict[str, str]
    cgroup: str | None = None
    concurrent: bool = False
    group: str = ""
    log: str = ""
    test_argv: list[str] = field(default_factory=list)
    timeout: float = 1800.0
    result_path: Path | None = None
    fail_path: Path | None = None
    nodes: list[str] = field(default_factory=list)
    cluster: Cluster | None = None
    launcher: str = "python"
    test_env: dict[str, str] | None = None
    barrier_wave: str | None = None
    cpus: list[int] | None = None
    placeholders: dict[str, Any] | None = None

    @property
    def job_id(self) -> str:
        return f"{self.run}.{self.device}"

    @property
    def journal_path(self) -> Path:
        """The child's sample journal (JSON Lines) next to ``result_path``."""
        if self.result_path is None:
            raise TypeError(f"launch {self.name} J{self.job_id} has no result path")
        return journal_path(self.result_path)

    @property
    def stdin(self) -> str | None:
        """Text the launcher writes to the process's stdin before closing it, or None
        (/dev/null): the barrier secret of an ssh launch, which must stay out of every
        argv (``nodes.Cluster.stdin``)."""
        return None if self.cluster is None else self.cluster.stdin(self.argv, self.env)

    @property
    def key(self) -> tuple[str, int, str]:
        """``(name, run, device)``: what identifies a launch across sessions (``--resume``)."""
        return (self.name, self.run, self.device)

    def describe(self, width: int | None = None) -> str:
        """Lines for ``--dry-run``: ``# group Jrun.device (mode, cgroup, timeout)``, then
        the env and the command as :func:`shown_command` writes them."""
        mode = "concurrent" if self.concurrent else "sequential"
        if self.barrier_wave:
            mode += ", synchronized start"
        return (
            f"# {self.group} J{self.job_id} ({mode}, cgroup: {self.cgroup or 'none'}, "
            f"timeout: {self.timeout:g} s)\n{shown_command(self.env, self.argv, width)}"
        )


#: Width of a ``--dry-run`` command line; longer commands go on on backslash-continued lines.
SHOWN_WIDTH = 100
#: How ``--dry-run`` shows the job definition inside ``--extra`` (the real command has it whole).
SHOWN_JOB = '"job": {…}'


def _shorten_job(word: str) -> str:
    """``word`` with the JSON object after ``"job": `` replaced by ``{…}`` (strings in
    it, such as ``"{dataroot}"``, are skipped when matching braces); unchanged when
    there is none or it does not close."""
    start = word.find('"job": {')
    if start < 0:
        return word
    depth, in_string, escaped = 0, False, False
    for i in range(start + len('"job": '), len(word)):
        c = word[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
            continue
        if c == '"':
            in_string = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return word[:start] + SHOWN_JOB + _shorten_job(word[i + 1 :])
    return word


def shown_command(env: Mapping[str, str], argv: Sequence[str], width: int | None = None) -> str:
    """The ``--dry-run`` text of one command: ``VAR=value ... argv``, shell-quoted, with
    the job definition inside ``--extra`` shown as ``{…}`` and the words wrapped at
    ``width`` columns (:data:`SHOWN_WIDTH`) with backslash continuations. The program and
    its subcommand (``... -m milarun run module:function``) stay on one line, and so
    does each option with its value."""
    width = width or SHOWN_WIDTH
    words = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    quoted = [shlex.quote(a) for a in argv]
    head = 1
    for i in range(len(argv) - 2):
        if argv[i] == "milarun" and argv[i + 1] == "run":
            head = i + 3
            break
    words.append(" ".join(quoted[:head]))
    i = head
    while i < len(quoted):
        word = quoted[i]
        if (
            argv[i].startswith("-")
            and argv[i] != "--"
            and i + 1 < len(argv)
            and not argv[i + 1].startswith("-")
        ):
            word = f"{word} {quoted[i + 1]}"
            i += 1
        words.append(_shorten_job(word))
        i += 1
    lines: list[str] = []
    line = ""
    for word in words:
        if line and len(line) + 1 + len(word) + 2 > width:  # 2: the " \\" it may end with
            lines.append(line + " \\")
            line = "    " + word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return "\n".join(lines)


def child_argv(
    job: Job,
    run: int,
    label: str,
    devices: Sequence[int],
    out: str | os.PathLike[str] | None,
    dataroot: str | os.PathLike[str] | None,
    test_argv: Sequence[str],
    python: str | None = None,
    nproc: int = 1,
    launcher: str = "python",
    extra: Mapping[str, Any] | None = None,
    rendezvous: Mapping[str, Any] | None = None,
) -> list[str]:
    """The ``milarun run`` command for one launch (before cgexec/exec prefix).

    Args:
        launcher: ``"python"``; ``"torchrun"`` (``--standalone``, ``nproc``
            processes; ``--max-restarts`` the job's ``restarts``); ``"rendezvous"``
            (torchrun agent of a multi-node job:
            ``rendezvous`` holds ``nnodes``, ``endpoint`` ``host:port``, ``id`` and
            ``join_timeout`` in s).
        extra: more fields for the record (``--extra``), e.g. the nodes.
    """
    python = python or sys.executable
    fields: dict[str, Any] = {
        "run": run,
        "device": label,
        "devices": devices,
        "partition": job.plan_type,
        "job": job.definition,
    }
    if job.tags:  # the report's families (milarun.report.family)
        fields["tags"] = list(job.tags)
    fields.update(extra or {})
    if launcher == "torchrun":
        head = [
            python,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
        ]
        if job.restarts:
            head += ["--max-restarts", str(job.restarts)]
    elif launcher == "rendezvous":
        assert rendezvous is not None, "a rendezvous launch needs its rendezvous"
        head = [
            python,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(rendezvous["nnodes"]),
            "--nproc-per-node",
            str(nproc),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            rendezvous["endpoint"],
            "--rdzv-id",
            rendezvous["id"],
            # torchrun reads join_timeout as an integer: round up, never to 0
            "--rdzv-conf",
            f"join_timeout={max(1, math.ceil(rendezvous['join_timeout']))}",
            "--max-restarts",
            str(job.restarts),
        ]
    else:
        head = [python]
    return child.child_argv(
        head + list(child.RUN_MODULE),
        job.experiment,
        out=out,
        dataroot=dataroot,
        name=job.full_name,
        job_id=f"{run}.{label}",
        extra=fields,
        test_argv=test_argv,
    )


def placeholder_values(
    job: Job,
    devices: Devices,
    devs: Sequence[int],
    nodes: Sequence[str],
    outdir: str | os.PathLike[str],
    dataroot: str | os.PathLike[str] | None,
) -> dict[str, Any]:
    """The values of the launch placeholders ``job``'s arguments use, for one launch.

    Args:
        devices: the ``devices.Devices`` of each node (its kind, cores and memory).
        devs: device indices the launch gets on each of its nodes.
        nodes: names of the nodes it spans.
        outdir, dataroot: the results folder and the dataset root.

    Returns:
        ``{name: value}`` for the names in ``job.placeholders`` only:

        * ``cpu_per_gpu``: cores of one student: the node's cores // its devices, as
          ``isolation.split_students`` cuts them (at least 1), whatever the plan type;
        * ``n_gpu``: devices the launch trains on, its nodes together (world size);
        * ``gpu_memory_gb``: memory of its smallest device in GiB, rounded (80 for an
          80 GB card; a CPU slot's is its student's share of the RAM);
        * ``dataroot``, ``outdir``: the folders, as given;
        * ``arch``: ``"cuda"`` on GPUs, ``"cpu"`` on CPU slots;
        * ``numa_node``: the NUMA node of the launch's first device (its backend's
          ``numa_node``; CPU slots and unknown devices: node 0 on a one-node host);
        * ``numa_remote``: another NUMA node of the host (the lowest other online node;
          the same node on a one-node host): ``numactl --membind={numa_remote}`` puts a
          test's host memory away from its device (the acceptance ``bandwidth`` test).

    Raises:
        SetupError: a value it needs is unknown (no dataroot, the node's cores or
            a device's memory).
    """

    def unknown(name: str, what: str) -> SetupError:
        return SetupError(f"{job.full_name}: cannot fill {{{name}}} in its arguments: {what}")

    values: dict[str, Any] = {}
    for name in job.placeholders:
        if name == "cpu_per_gpu":
            if not devices.cores:
                raise unknown(name, "the node's CPU cores are unknown")
            values[name] = max(1, devices.cores // max(1, len(devices.indices)))
        elif name == "n_gpu":
            values[name] = len(devs) * max(1, len(nodes))
        elif name == "gpu_memory_gb":
            known = dict(zip(devices.indices, devices.memory_mib))
            sizes = [known[d] for d in devs if d in known]
            if not devs or len(sizes) < len(devs):
                raise unknown(name, "the memory of its devices is unknown")
            values[name] = round(min(sizes) / 1024)
        elif name == "dataroot":
            if dataroot is None:
                raise unknown(name, "no dataroot (-d)")
            values[name] = str(dataroot)
        elif name == "outdir":
            values[name] = str(outdir)
        elif name == "arch":
            values[name] = accel.get(devices.backend).torch_device
        elif name in ("numa_node", "numa_remote"):
            local = device_numa_node(devices, devs)
            if local is None:
                raise unknown(name, "the NUMA node of its device is unknown")
            if name == "numa_node":
                values[name] = local
            else:
                others = [n for n in online_numa_nodes() if n != local]
                values[name] = others[0] if others else local
    return values


#: The kernel's list of online NUMA nodes (a cpu-list: "0-1").
NUMA_ONLINE = "/sys/devices/system/node/online"


def online_numa_nodes(path: str | None = None) -> list[int]:
    """The host's online NUMA nodes (sorted ints; ``[0]`` when the kernel does not say),
    from ``path`` (default :data:`NUMA_ONLINE`)."""
    text = read_text(path or NUMA_ONLINE)
    try:
        nodes = sorted(parse_cpus(text)) if text else []
    except ValueError:
        nodes = []
    return nodes or [0]


def device_numa_node(devices: Devices, devs: Sequence[int]) -> int | None:
    """NUMA node of the first of ``devs`` (its backend's ``numa_node``), node 0 on a
    one-node host when the device does not say (CPU slots), else None."""
    if devs:
        for index, acc in zip(devices.indices, devices.accelerators):
            if index == devs[0] and getattr(acc, "numa_node", None) is not None:
                return acc.numa_node
    return 0 if online_numa_nodes() == [0] else None


def as_cluster(where: Cluster | Devices) -> Cluster:
    """A ``nodes.Cluster`` from a Cluster, or from ``devices.Devices`` (this host alone)."""
    return where if isinstance(where, Cluster) else local_cluster(where)


def plan_job(
    job: Job,
    where: Cluster | Devices,
    run: int,
    outdir: str | os.PathLike[str],
    dataroot: str | os.PathLike[str] | None = None,
    extra_args: Iterable[str] = (),
    use_cgexec: bool = True,
    timeout: float | None = None,
    python: str | None = None,
    session: datetime.datetime | None = None,
    rdzv_port: int = RDZV_PORT,
    join_timeout: float = JOIN_TIMEOUT_S,
    barrier: Mapping[str, Any] | None = None,
) -> list[list[Launch]]:
    """Return the waves (list of lists of ``Launch``) for one run of ``job``.

    Args:
        where: a ``nodes.Cluster``, or a ``devices.Devices`` for this host alone.
        session: UTC ``datetime`` stamped into every file name (default: the
            Unix epoch, for tests that only look at command lines).
        extra_args: arguments appended to every test (after ``--``).
        use_cgexec: False for ``--no-cgexec`` (no cgroup wrapping).
        timeout: overrides the job's timeout (seconds) when given.
        rdzv_port: TCP port of the c10d rendezvous on the main node.
        join_timeout: seconds every node has to join the rendezvous (then the
            launch fails with ``rendezvous-timeout``).
        barrier: ``{"address": "host:port", "timeout": s, "secret": str}`` of the
            launcher's start barrier (:mod:`milarun.formats.barrier`), or None. Every
            launch of a concurrent wave of two or more then waits there before
            its timed loop (``MILARUN_BARRIER*`` variables); a wave of one never
            waits.
    """
    cluster = as_cluster(where)
    timeout = float(timeout or job.timeout)
    when = session or datetime.datetime.fromtimestamp(0, datetime.timezone.utc)

    def make(slot: Slot, wave_id: str | None = None) -> Launch:
        label = slot.label
        devs = list(slot.devices)
        # the backend's visibility variables (milarun.host.accel); CPU slots hide every GPU
        # and say MILARUN_BACKEND=cpu, so --device auto never picks a GPU left visible
        vis = cluster.devices.child_env(devs)
        first = next(iter(vis))
        env = {first: vis.pop(first), child.ENV_DEVICE: label, child.ENV_RUN: str(run), **vis}
        if wave_id is not None:
            assert barrier is not None  # a wave id is given only with a barrier
            env.update(
                {
                    ENV_ADDRESS: barrier["address"],
                    ENV_WAVE: wave_id,
                    ENV_TIMEOUT: f"{float(barrier['timeout']):g}",
                    ENV_SECRET: barrier.get("secret", ""),
                }
            )
        cpus = list(slot.cpus) if slot.cpus and use_cgexec else None  # --no-cgexec: no pinning
        if cpus:
            env[child.ENV_CPUS] = format_cpus(cpus)  # the pinning, recorded in environ
        cg = slot.cgroup if use_cgexec else None
        result = Path(outdir) / result_filename(job.full_name, run, label, True, when)
        fail = Path(outdir) / result_filename(job.full_name, run, label, False, when)
        extra: dict[str, Any] = {}
        if cluster.kind != "local":  # one host: its records name it in host.hostname
            extra = {
                "nodes": list(slot.nodes),
                "node_count": len(slot.nodes),
                "gpus_per_node": len(devs),
            }
            if len(slot.nodes) == 1:  # a record over several nodes has them in ``nodes``
                extra["node"] = slot.nodes[0]
        values = placeholder_values(job, cluster.devices, devs, slot.nodes, outdir, dataroot)
        if values:  # only then: a job without placeholders keeps its command line
            extra["placeholders"] = values
        test_argv = job.argv(values) + list(extra_args)
        rendezvous = None
        if slot.launcher == "rendezvous":
            rendezvous = {
                "nnodes": len(slot.nodes),
                "backend": "c10d",
                "join_timeout": float(join_timeout),
                "endpoint": f"{cluster.main.address or cluster.main.name}:{rdzv_port}",
                "id": f"{job.full_name}.J{run}.{label}.{when:%Y%m%d-%H%M%S}",
            }
            extra["rendezvous"] = {k: rendezvous[k] for k in ("backend", "endpoint", "id")}
        argv = child_argv(
            job,
            run,
            label,
            devs,
            result,
            dataroot,
            test_argv,
            python=python,
            nproc=slot.nproc,
            launcher=slot.launcher,
            extra=extra,
            rendezvous=rendezvous,
        )
        argv = wrap(argv, cg, job.prefix(values), use_cgexec, cpus=cpus)
        test_env = dict(env)
        argv, env = cluster.on_nodes(argv, env, list(slot.nodes), tag=f"{job.full_name}.{label}")
        return Launch(
            name=job.full_name,
            job=job,
            run=run,
            device=label,
            devices=devs,
            argv=argv,
            env=env,
            cgroup=cg,
            concurrent=slot.concurrent,
            group=slot.group,
            log=f"{job.full_name}.J{run}.{label}.log",
            test_argv=test_argv,
            timeout=timeout,
            result_path=result,
            fail_path=fail,
            nodes=list(slot.nodes),
            cluster=cluster,
            launcher=slot.launcher,
            test_env=test_env,
            barrier_wave=wave_id,
            cpus=cpus,
            placeholders=values or None,
        )

    waves: list[list[Launch]] = []
    for i, wave in enumerate(job.kind.expand(job, cluster)):
        wave_id = None
        if barrier is not None and len(wave) > 1 and all(s.concurrent for s in wave):
            wave_id = f"{job.full_name}.J{run}.w{i}.{when:%Y%m%d-%H%M%S}"
        waves.append([make(slot, wave_id) for slot in wave])
    return waves


def plan_suite(
    jobs: Iterable[Job],
    where: Cluster | Devices,
    repeat: int,
    outdir: str | os.PathLike[str],
    **kwargs: Any,
) -> list[list[Launch]]:
    """Waves for every run and job: run 0 of every job, then run 1, and so on."""
    waves: list[list[Launch]] = []
    for run in range(repeat):
        for job in jobs:
            waves += plan_job(job, where, run, outdir, **kwargs)
    return waves
