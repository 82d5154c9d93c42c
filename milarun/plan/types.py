"""Plan types: how a job's ``partition_scheme.type`` becomes launches. One registry.

Each plan type owns everything about itself: the ``partition_scheme`` keys it
takes and their checks (:meth:`PlanType.check`), its expansion into waves of
:class:`Slot` over a cluster's nodes and devices (:meth:`PlanType.expand`),
its children's launcher (python, ``torchrun --standalone``, or torchrun with a
c10d rendezvous across nodes), its summary group names (:meth:`PlanType.group`)
and the weight its groups take (:meth:`PlanType.weight_key`). The profile,
the plan, the summary and the report ask :data:`TYPES`; adding a plan type is
one class here plus its tests, and its name in ``profile.schema.json``'s
enum (:data:`NAMES`, from which :data:`TYPES` is built).

``per-gpu``          one launch per device of every node, all at once, each in its
                     student cgroup; group ``suite.job``.
``gpu-progression``  devices ``0..k-1`` of the main node for k = 1..N, one after
                     the other, no cgroup; group ``suite.job.<k>``.
``normal``           one launch over every device of the main node; group ``suite.job``.
``njobs``            one ``torchrun --standalone`` per node over all its devices, every
                     node at once; group ``suite.job``.
``multi-node``       one torchrun agent per node (``--nnodes K``), joined by a c10d
                     rendezvous on the main node; rank 0 writes the one record.
``node-progression`` the multi-node test on n = 1..K nodes × g GPUs per node
                     (``partition_scheme.nodes`` and ``gpus_per_node`` lists), one
                     after the other; group ``suite.job.<n>x<g>``.
``multi-process``    DLBS's multi-process inference: P processes per node
                     (``partition_scheme.processes``, default 2), each owning k devices
                     (``devices_per_process``, default devices // P), all at once, each
                     pinned with ``numactl --localalloc --physcpubind`` to the cores of
                     the NUMA node its devices are attached to; group ``suite.job``.

No torch here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import SetupError
from ..formats.jsonfile import load_schema
from ..host.isolation import process_cpus, slot_cpus

if TYPE_CHECKING:
    from .nodes import Cluster

#: A job of the profile (:class:`milarun.profile.job.Job`): a layer above the plan, so
#: named here only; the plan reads its ``full_name``, ``launcher``, ``cgroup``, ``definition``.
Job = Any

#: A result record or summary entry (parsed JSON).
Record = Mapping[str, Any]

#: ``torchrun --rdzv-conf join_timeout``: seconds a node waits for the others
#: to join before the job fails with ``rendezvous-timeout``.
JOIN_TIMEOUT_S = 120


@dataclass(frozen=True)
class Slot:
    """One launch before paths and command lines: where it runs and how it is grouped.

    Attributes:
        nodes: node names (tuple of str); one unless the launch spans nodes.
        devices: device indices on each node (tuple of int).
        label: device label in file names and job ids (``"0"``, ``"0-3"``, ``"all"``,
            ``"node1.0"``, ``"2x4"``).
        group: summary group.
        concurrent: True when started alongside the rest of its wave.
        cgroup: student cgroup (``"controllers:group"``) or None.
        launcher: ``"python"``, ``"torchrun"`` (``--standalone``, one node) or
            ``"rendezvous"`` (torchrun agents on every node of ``nodes``).
        cpus: CPU ids to pin the launch to with numactl (tuple of int), or None.
    """

    nodes: tuple[str, ...]
    devices: tuple[int, ...]
    label: str
    group: str
    concurrent: bool
    cgroup: str | None = None
    launcher: str = "python"
    cpus: tuple[int, ...] | None = None

    @property
    def nproc(self) -> int:
        """Processes per node (torchrun's ``--nproc-per-node``)."""
        return len(self.devices)


def _range_label(devices: list[int]) -> str:
    return str(devices[0]) if len(devices) == 1 else f"{devices[0]}-{devices[-1]}"


def _on(cluster: Cluster, node: str, label: str) -> str:
    """A label that carries the node when the cluster has several."""
    return f"{node}.{label}" if cluster.multi else label


class PlanType:
    """The protocol of a plan type (see the module doc). Subclasses set ``name``."""

    name = ""
    #: ``partition_scheme`` keys this type takes besides ``type`` (the schema types them).
    keys: tuple[str, ...] = ()
    #: True when its launches span nodes through a rendezvous (torchrun across nodes).
    distributed = False
    #: True when its launches go through torchrun whatever the job's ``launcher``.
    torchrun = False
    #: What one record's rate measures, for the node score (:mod:`milarun.report.table`):
    #: ``"device"`` (one device: a node's rate is the sum over its devices), ``"node"``
    #: (the devices it used on one node) or ``"job"`` (a job over ``node_count`` nodes).
    rate_of = "node"

    def check(self, scheme: Mapping[str, Any], launcher: str | None) -> tuple[str, str] | None:
        """Problems of a job's ``partition_scheme`` for this type: ``(key, message)`` or None."""
        for key in scheme:
            # "cgroup" comes with the "*" defaults into every job; only per-gpu uses it
            if key not in ("type", "cgroup") and key not in self.keys:
                known = ", ".join(("type",) + tuple(self.keys))
                return key, f"not used by plan type {self.name!r} (its keys: {known})"
        return None

    def expand(self, job: Job, cluster: Cluster) -> list[list[Slot]]:
        """Waves (list of lists) of :class:`Slot` for one run of ``job`` on ``cluster``."""
        raise NotImplementedError

    def notes(self, job: Job, cluster: Cluster) -> list[str]:
        """Lines to tell the operator before anything runs (what the plan leaves out).

        Raises:
            SetupError: nothing of the job fits ``cluster``.
        """
        return []

    def group(self, record: Record) -> str:
        """The summary group of a result record."""
        return record["name"]

    def weight_key(self, group: str, weights: Mapping[str, Any]) -> str | None:
        """The key of ``weights`` that applies to ``group``, or None."""
        return group if group in weights else None


class PerGPU(PlanType):
    name = "per-gpu"
    keys = ("cgroup",)
    rate_of = "device"

    def expand(self, job: Job, cluster: Cluster) -> list[list[Slot]]:
        idx = list(cluster.devices.indices)
        launcher = "torchrun" if job.launcher == "torchrun" else "python"
        return [
            [
                Slot(
                    (node.name,),
                    (i,),
                    _on(cluster, node.name, str(i)),
                    job.full_name,
                    True,
                    job.cgroup.format(device=i) if job.cgroup else None,
                    launcher,
                )
                for node in cluster.nodes
                for i in idx
            ]
        ]


class _Steps(PlanType):
    """A study of several steps, each its own group ``suite.job.<step>``; a weight for
    ``suite.job`` applies to each step (``_GROUP`` matches the step's group)."""

    _GROUP: re.Pattern[str]

    def weight_key(self, group: str, weights: Mapping[str, Any]) -> str | None:
        if group in weights:
            return group
        m = self._GROUP.match(group)
        return m.group(1) if m and m.group(1) in weights else None


class GPUProgression(_Steps):
    name = "gpu-progression"
    _GROUP = re.compile(r"^(.+)\.(\d+)$")

    def expand(self, job: Job, cluster: Cluster) -> list[list[Slot]]:
        idx = list(cluster.devices.indices)
        main = cluster.main.name
        launcher = "torchrun" if job.launcher == "torchrun" else "python"
        return [
            [
                Slot(
                    (main,),
                    tuple(idx[:k]),
                    _on(cluster, main, _range_label(idx[:k])),
                    f"{job.full_name}.{k}",
                    False,
                    None,
                    launcher,
                )
            ]
            for k in range(1, len(idx) + 1)
        ]

    def group(self, record: Record) -> str:
        count = record.get("device_count")
        if count is None:
            count = len(record.get("devices") or [])
        return f"{record['name']}.{count}"


class Normal(PlanType):
    name = "normal"

    def expand(self, job: Job, cluster: Cluster) -> list[list[Slot]]:
        idx = tuple(cluster.devices.indices)
        main = cluster.main.name
        launcher = "torchrun" if job.launcher == "torchrun" else "python"
        return [
            [Slot((main,), idx, _on(cluster, main, "all"), job.full_name, False, None, launcher)]
        ]


class NJobs(PlanType):
    name = "njobs"
    torchrun = True

    def expand(self, job: Job, cluster: Cluster) -> list[list[Slot]]:
        idx = tuple(cluster.devices.indices)
        return [
            [
                Slot(
                    (node.name,),
                    idx,
                    _on(cluster, node.name, "all"),
                    job.full_name,
                    True,
                    None,
                    "torchrun",
                )
                for node in cluster.nodes
            ]
        ]


class MultiNode(PlanType):
    name = "multi-node"
    distributed = True
    torchrun = True
    rate_of = "job"

    def expand(self, job: Job, cluster: Cluster) -> list[list[Slot]]:
        idx = tuple(cluster.devices.indices)
        nodes = tuple(n.name for n in cluster.nodes)
        return [
            [Slot(nodes, idx, f"{len(nodes)}x{len(idx)}", job.full_name, False, None, "rendezvous")]
        ]


class NodeProgression(_Steps):
    name = "node-progression"
    keys = ("nodes", "gpus_per_node")
    distributed = True
    torchrun = True
    rate_of = "job"
    _GROUP = re.compile(r"^(.+)\.(\d+)x(\d+)$")

    def shapes(
        self, job: Job, cluster: Cluster
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """``(kept, skipped)``: lists of (nodes, devices per node) of the study; the
        skipped ones ask for more nodes or devices than ``cluster`` has."""
        scheme = job.definition.get("partition_scheme", {})
        k, g_max = len(cluster.nodes), len(cluster.devices.indices)
        counts = sorted(set(scheme.get("nodes") or range(1, k + 1)))
        gpus = sorted(set(scheme.get("gpus_per_node") or range(1, g_max + 1)))
        every = [(n, g) for n in counts for g in gpus]
        kept = [(n, g) for n, g in every if n <= k and g <= g_max]
        return kept, [s for s in every if s not in kept]

    def notes(self, job: Job, cluster: Cluster) -> list[str]:
        kept, skipped = self.shapes(job, cluster)
        have = f"{len(cluster.nodes)} node(s) × {len(cluster.devices.indices)} device(s)"
        if not kept:
            raise SetupError(
                f"{job.full_name}: no step of its node-progression fits this "
                f"cluster ({have}); partition_scheme asks for "
                f"{', '.join(f'{n}x{g}' for n, g in skipped)}"
            )
        if skipped:
            return [
                f"node-progression steps {', '.join(f'{n}x{g}' for n, g in skipped)} "
                f"left out: more than this cluster's {have}"
            ]
        return []

    def expand(self, job: Job, cluster: Cluster) -> list[list[Slot]]:
        idx = list(cluster.devices.indices)
        names = [n.name for n in cluster.nodes]
        kept, _ = self.shapes(job, cluster)
        return [
            [
                Slot(
                    tuple(names[:n]),
                    tuple(idx[:g]),
                    f"{n}x{g}",
                    f"{job.full_name}.{n}x{g}",
                    False,
                    None,
                    "rendezvous",
                )
            ]
            for n, g in kept
        ]

    def shape(self, record: Record) -> tuple[int, int]:
        """``(nodes, devices per node)`` of a result record (1 node without node fields)."""
        n = record.get("node_count") or len(record.get("nodes") or []) or 1
        g = record.get("gpus_per_node") or record.get("device_count") or 1
        return n, g

    def group(self, record: Record) -> str:
        n, g = self.shape(record)
        return f"{record['name']}.{n}x{g}"


def launcher_cpus() -> list[int]:
    """The CPU ids this process (the launcher) may use: the nodes' cores to share out."""
    return sorted(os.sched_getaffinity(0))


class MultiProcess(PlanType):
    """P processes per node, each owning k devices, pinned to their NUMA node's cores.

    DLBS's multi-process multi-GPU inference benchmark (its
    ``docs/mprocess_benchmarks.md``: "2 processes each using 4 GPUs", each
    process pinned with ``numactl --localalloc --physcpubind`` to the CPU its
    GPUs are attached to). Process p of a node owns devices ``p*k .. p*k+k-1``;
    its cores come from :func:`milarun.host.isolation.process_cpus` over the devices'
    affinity (NVML's CPU affinity of a GPU; a CPU slot's cores). Every process
    of every node starts at once and meets the others at the start barrier.
    """

    name = "multi-process"
    keys = ("processes", "devices_per_process")

    def shape(self, job: Job, cluster: Cluster) -> tuple[int, int]:
        """``(P, k)``: processes per node and devices per process on ``cluster``
        (P is lowered to the devices there are, k defaults to devices // P)."""
        scheme = job.definition.get("partition_scheme", {})
        n = len(cluster.devices.indices)
        procs = min(int(scheme.get("processes") or 2), n)
        k = int(scheme.get("devices_per_process") or max(1, n // procs))
        procs = min(procs, max(1, n // k))
        return procs, min(k, n)

    def notes(self, job: Job, cluster: Cluster) -> list[str]:
        scheme = job.definition.get("partition_scheme", {})
        want_p = int(scheme.get("processes") or 2)
        want_k = scheme.get("devices_per_process")
        procs, k = self.shape(job, cluster)
        n = len(cluster.devices.indices)
        if procs != want_p or (want_k is not None and k != int(want_k)):
            asked = f"{want_p} x {want_k}" if want_k is not None else f"{want_p} processes"
            return [
                f"multi-process: {asked} asked; this node's {n} device(s) give "
                f"{procs} process(es) x {k} device(s)"
            ]
        return []

    def expand(self, job: Job, cluster: Cluster) -> list[list[Slot]]:
        devs = cluster.devices
        idx = list(devs.indices)
        procs, k = self.shape(job, cluster)
        groups = [list(range(p * k, (p + 1) * k)) for p in range(procs)]
        host = launcher_cpus()
        affinity = list(devs.affinity or [])
        if not any(affinity) and devs.kind == "cpu":
            affinity = slot_cpus(len(idx), host)
        try:
            cores = process_cpus(groups, affinity, host)
        except ValueError as exc:
            raise SetupError(f"{job.full_name}: {exc}") from None
        return [
            [
                Slot(
                    (node.name,),
                    tuple(idx[i] for i in group),
                    _on(cluster, node.name, _range_label([idx[i] for i in group])),
                    job.full_name,
                    True,
                    None,
                    "python",
                    tuple(cpus),
                )
                for node in cluster.nodes
                for group, cpus in zip(groups, cores)
            ]
        ]


#: The plan types' names, in the order the docs list them: the enum of
#: ``partition_scheme.type`` in ``profile.schema.json``, the one list.
NAMES = tuple(
    load_schema("profile")["$defs"]["job"]["properties"]["partition_scheme"]["properties"]["type"][
        "enum"
    ]
)


def _registry(*types: PlanType) -> dict[str, PlanType]:
    """``{name: plan type}`` in the order of :data:`NAMES`; every name has its class and
    every class its name (else the import fails, naming them)."""
    by_name = {t.name: t for t in types}
    if set(by_name) != set(NAMES):
        raise ImportError(
            "the plan types of milarun/plan/types.py and the enum of "
            "profile.schema.json differ: " + ", ".join(sorted(set(by_name) ^ set(NAMES)))
        )
    return {name: by_name[name] for name in NAMES}


#: name → plan type, in the order of :data:`NAMES`.
TYPES = _registry(
    PerGPU(), GPUProgression(), Normal(), NJobs(), MultiNode(), NodeProgression(), MultiProcess()
)


def plan_type(name: str) -> PlanType:
    """The plan type called ``name``; KeyError for an unknown one."""
    return TYPES[name]


def group_name(record: Record) -> str:
    """The summary group of a result record (``suite.job`` when its plan type, the record's
    ``partition``, is unknown)."""
    kind = TYPES.get(record.get("partition") or "")
    return kind.group(record) if kind else record["name"]


def weight_for(
    group: str, weights: Mapping[str, Any], plan_type: str | None = None
) -> tuple[Any, str | None]:
    """``(weight, key)`` of summary group ``group``, or ``(None, None)``.

    ``plan_type`` (the name; a summary's ``partition``) None (a 2020 summary does not
    say) tries every type's rule.
    """
    if plan_type is None:
        kinds = list(TYPES.values())
    else:
        kinds = [TYPES.get(plan_type, TYPES["per-gpu"])]
    for kind in kinds:
        key = kind.weight_key(group, weights)
        if key is not None:
            return weights[key], key
    return None, None
