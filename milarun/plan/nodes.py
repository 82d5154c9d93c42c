"""Where launches run: this host, the nodes of a Slurm allocation, or a system file's nodes.

A :class:`Cluster` is a list of :class:`Node` (the first, or the one marked
``main``, is the main node: it hosts the rendezvous) plus the devices of
each node (nodes are assumed alike: the plan gives every node the devices
discovered on this one, or Slurm's GPUs per node). It also knows how to run
an argv on some of its nodes:

* ``local``: the argv as it is (one node, this host).
* ``slurm``: ``srun --nodes=K --ntasks=K --ntasks-per-node=1 --nodelist=…
  --overlap --kill-on-bad-exit=1 …``: one Slurm job step per launch, so Slurm
  places, signals and accounts for it (``--overlap``: steps share the
  allocation's CPUs; milarun's student cgroups split them).
* ``ssh``: OpenSSH's ``ssh -o BatchMode=yes …`` per node (never a password
  prompt); several nodes go through :mod:`milarun.launcher.fanout`, which ends every
  agent when one fails, as ``srun --kill-on-bad-exit`` does.

Environment variables reach the remote side as ``env K=V`` in front of the
command (ssh passes none, and Slurm would overwrite ``CUDA_VISIBLE_DEVICES``
with its own), except the start barrier's secret: a command line is readable by
every user of a host (``ps``), so it stays in the local process's environment
(srun ``--export=ALL`` passes it on) and, over ssh, travels as one line on the
agent's standard input that a small remote ``sh`` reads and exports
(:data:`READ_SECRET`; :meth:`Cluster.stdin` says what the launcher writes there,
and :mod:`milarun.launcher.fanout` writes it to each of its agents). Remote nodes must
have milarun installed at the same path and see the results folder (checked by
:func:`probe_argv` before anything runs).

No torch here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SetupError
from ..formats.barrier import ENV_SECRET
from ..formats.child import ENV_NODE
from ..formats.jsonfile import first_error, key_path, read_json

if TYPE_CHECKING:
    from ..host.devices import Devices

#: Exit status of ``ssh`` when the connection failed or dropped.
SSH_LOST = 255

#: ssh options: no prompt ever; a dead peer is noticed within about 30 s.
SSH_OPTIONS = (
    "-o",
    "BatchMode=yes",
    "-o",
    "ConnectTimeout=15",
    "-o",
    "ServerAliveInterval=10",
    "-o",
    "ServerAliveCountMax=3",
)

#: The remote ``sh -c`` script in front of an ssh launch that has a barrier secret: it reads
#: the secret as one line on stdin (never an argv: ``ps`` shows those to everyone), exports
#: it and execs the command (stdin then /dev/null: nothing else arrives there). No line (the
#: local side wrote none): exit 2, saying why, rather than meet the barrier without it.
READ_SECRET = (
    f'IFS= read -r {ENV_SECRET} || {{ echo "milarun: no barrier secret on stdin" >&2; '
    f'exit 2; }}; export {ENV_SECRET}; exec "$@" </dev/null'
)

# Patterns of srun's messages when a node of the step is lost.
_SLURM_LOST = re.compile(
    r"Node failure|node .* not responding|launch failed on node|NODE_FAIL", re.IGNORECASE
)


@dataclass
class Node:
    """One host of a cluster.

    Attributes:
        name: the node's name in file names and reports (Slurm's node name,
            or the system file's ``name``).
        address: host name or IP address other nodes reach it at (the
            rendezvous endpoint when it is the main node).
        user, port, key: ssh login, port and identity file (system file only).
        main: True for the node that hosts the rendezvous.
        config: an ssh client configuration file (``ssh -F``; system file only).
    """

    name: str
    address: str | None = None
    user: str | None = None
    port: int | None = None
    key: str | None = None
    main: bool = False
    config: str | None = None


@dataclass
class Cluster:
    """Nodes, their devices, and how to run a command on them.

    Attributes:
        kind: ``"local"``, ``"slurm"`` or ``"ssh"``.
        nodes: list of :class:`Node`; the main node first.
        devices: a :class:`milarun.host.devices.Devices`, the devices of each node.
        job_id: the Slurm job id (``slurm`` only).
        source: what the nodes came from, for messages (a path, ``$SLURM_JOB_NODELIST``).
    """

    kind: str
    nodes: list[Node]
    devices: Devices
    job_id: str | None = None
    source: str | None = None
    python: str = field(default_factory=lambda: sys.executable)

    @property
    def main(self) -> Node:
        """The main node (rendezvous host)."""
        return self.nodes[0]

    @property
    def multi(self) -> bool:
        """True when there is more than one node (result names then carry the node)."""
        return len(self.nodes) > 1

    def node(self, name: str) -> Node:
        """The node called ``name``; KeyError when there is none."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def on_nodes(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        names: Sequence[str],
        tag: str = "",
    ) -> tuple[list[str], dict[str, str]]:
        """``(argv, env)`` that run ``argv`` with ``env`` once on each node of ``names``.

        ``env`` stays the local process's environment for ``local``; for
        ``slurm`` and ``ssh`` it moves into the command line (``env K=V``), all
        but the barrier secret, which stays in the returned env: srun passes it
        on; over ssh the remote side reads it on stdin (:data:`READ_SECRET`),
        where :meth:`stdin` or :mod:`milarun.launcher.fanout` writes it.
        ``tag`` names the Slurm step (``--job-name``).
        """
        if self.kind == "local":
            return list(argv), dict(env)
        # remote ranks die with their torchrun agent (see milarun.host.supervise)
        env = dict(env, MILARUN_PDEATHSIG="1")
        # the start barrier's secret stays out of every command line (``ps`` shows them to
        # every user); srun --export=ALL hands srun's own environment on, ssh its stdin
        secret: dict[str, str] = {}
        if ENV_SECRET in env:
            secret[ENV_SECRET] = env.pop(ENV_SECRET)
        inner = ["env"] + [f"{k}={v}" for k, v in sorted(env.items())] + list(argv)
        if self.kind == "slurm":
            k = len(names)
            head = [
                "srun",
                f"--nodes={k}",
                f"--ntasks={k}",
                "--ntasks-per-node=1",
                f"--nodelist={','.join(names)}",
                "--overlap",
                "--kill-on-bad-exit=1",
                "--cpu-bind=none",
                "--export=ALL",
            ]
            if tag:
                head.append(f"--job-name={tag}")
            return head + inner, secret
        # each agent learns which node it is (its record's per-node facts name it)
        read = ["sh", "-c", READ_SECRET, "milarun-secret"] if secret else []
        agents = [ssh_argv(self.node(n), read + ["env", f"{ENV_NODE}={n}"] + inner) for n in names]
        if len(agents) == 1:
            return agents[0], secret
        return [self.python, "-m", "milarun.launcher.fanout", json.dumps(agents)], secret

    def stdin(self, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
        """What the launcher writes to the standard input of ``argv`` run with ``env`` (an
        :meth:`on_nodes` result) before closing it: the barrier secret and a newline for a
        single ssh agent, which hands it to the remote :data:`READ_SECRET`; None otherwise
        (stdin is then /dev/null; :mod:`milarun.launcher.fanout` feeds its own agents from ``env``).
        """
        if self.kind == "ssh" and argv[:1] == ["ssh"] and ENV_SECRET in env:
            return env[ENV_SECRET] + "\n"
        return None

    def failure_reason(self, returncode: int | None, tail: Sequence[str] | None) -> str | None:
        """``node-lost`` when the transport says a node went away, else None.

        ``tail`` is the last lines of the launch's output (list of str).
        """
        text = "\n".join(tail or [])
        if self.kind == "ssh" and returncode == SSH_LOST:
            return "node-lost"
        if self.kind == "ssh" and "milarun.launcher.fanout: node-lost" in text:
            return "node-lost"
        if self.kind == "slurm" and _SLURM_LOST.search(text):
            return "node-lost"
        return None


def ssh_argv(node: Node, argv: Sequence[str]) -> list[str]:
    """The ``ssh`` command that runs ``argv`` on ``node`` (a :class:`Node`).

    The remote command sits behind ``setpriv --pdeathsig KILL`` where the
    remote host has one, so it dies with its ssh session when the connection
    drops (sshd sends no signal to a session without a terminal).
    """
    head = ["ssh"]
    if node.config:
        head += ["-F", str(node.config)]
    head += list(SSH_OPTIONS)
    if node.port:
        head += ["-p", str(int(node.port))]
    if node.key:
        head += ["-i", str(node.key), "-o", "IdentitiesOnly=yes"]
    if node.user:
        head += ["-l", node.user]
    remote = shlex.join(argv)
    guarded = (
        "if setpriv --pdeathsig KILL -- true 2>/dev/null; then exec setpriv "
        f"--pdeathsig KILL -- {remote}; else exec {remote}; fi"
    )
    # "--" before the destination: an address can never be read as an option
    return head + ["--", node.address or node.name, guarded]


def local_cluster(devices: Devices, name: str | None = None) -> Cluster:
    """One node, this host (named after its host name)."""
    return Cluster("local", [Node(name or socket.gethostname(), "127.0.0.1", main=True)], devices)


def _run(argv: list[str], env: Mapping[str, str] | None = None) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SetupError(f"cannot run {argv[0]}: {exc}")
    if out.returncode != 0:
        raise SetupError(f"{shlex.join(argv)} failed: {out.stderr.strip() or out.returncode}")
    return out.stdout


def slurm_cluster(
    devices: Devices,
    environ: Mapping[str, str] | None = None,
    run: Callable[[list[str]], str] = _run,
) -> Cluster:
    """The nodes of the Slurm allocation this process runs in.

    Node names come from ``scontrol show hostnames $SLURM_JOB_NODELIST``, their
    addresses from ``scontrol show node`` (``NodeAddr``). GPUs per node:
    ``SLURM_GPUS_ON_NODE`` when set; otherwise ``devices`` (this node's).

    Raises:
        SetupError: not inside an allocation, or scontrol fails.
    """
    environ = os.environ if environ is None else environ
    job = environ.get("SLURM_JOB_ID")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not job or not nodelist:
        raise SetupError(
            "not inside a Slurm allocation ($SLURM_JOB_ID and $SLURM_JOB_NODELIST are unset)"
        )
    names = run(["scontrol", "show", "hostnames", nodelist]).split()
    if not names:
        raise SetupError(f"$SLURM_JOB_NODELIST {nodelist!r} names no node")
    addresses: dict[str, str] = {}
    for line in run(["scontrol", "show", "node", ",".join(names), "--oneliner"]).splitlines():
        m = re.search(r"NodeName=(\S+).*?NodeAddr=(\S+)", line)
        if m:
            addresses[m.group(1)] = m.group(2)
    nodes = [Node(n, addresses.get(n, n), main=(i == 0)) for i, n in enumerate(names)]
    gpus = environ.get("SLURM_GPUS_ON_NODE", "")
    if gpus.isdigit() and devices.kind == "gpu" and int(gpus) < len(devices):
        devices = devices.first(int(gpus))
    return Cluster("slurm", nodes, devices, job_id=job, source="$SLURM_JOB_NODELIST")


def load_system(path: str | os.PathLike[str], devices: Devices) -> Cluster:
    """Read a system file (``--system``) into an ``ssh`` :class:`Cluster`.

    The file (``milarun/formats/schemas/system.schema.json``)::

        {"ssh_config": "optional ssh -F file",
         "nodes": [{"name": "n1", "address": "10.0.0.1", "user": "bench",
                    "main": true, "port": 22, "key": "~/.ssh/id_ed25519"}, ...]}

    At most one node may be ``main`` (default: the first); its ``address`` is the
    rendezvous endpoint, so the other nodes must reach it there. Names must be
    unique. Relative ``key`` and ``ssh_config`` paths are relative to the file.

    Raises:
        SetupError: unreadable file, bad JSON, or a bad key (one line naming it).
    """
    data = read_json(path, error_cls=SetupError, what="system file")
    found = first_error(data, "system")
    if found:
        keys, message = found
        where = key_path(keys)
        raise SetupError(f"{where}: {message}" if where else message, path=path)
    nodes = []
    here = Path(path).resolve().parent  # relative paths are the file's, not the shell's

    def beside(value: str | None) -> str | None:
        return str(here / os.path.expanduser(value)) if value else None

    config = beside(data.get("ssh_config"))
    for entry in data["nodes"]:
        port = entry.get("port")
        nodes.append(
            Node(
                entry["name"],
                entry["address"],
                entry.get("user"),
                int(port) if port is not None else None,
                beside(entry.get("key")),
                bool(entry.get("main")),
                config,
            )
        )
    names = [n.name for n in nodes]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise SetupError(f"nodes.{i}.name: {n!r} is given twice", path=path)
    mains = [i for i, n in enumerate(nodes) if n.main]
    if len(mains) > 1:
        raise SetupError(f"nodes.{mains[1]}.main: only one node can be the main node", path=path)
    first = mains[0] if mains else 0
    nodes.insert(0, nodes.pop(first))
    nodes[0].main = True
    return Cluster("ssh", nodes, devices, source=str(path))


def discover(
    devices: Devices,
    system: str | os.PathLike[str] | None = None,
    single_node: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Cluster:
    """The cluster ``milarun jobs`` runs on: the ``--system`` file's nodes; else, inside
    a Slurm allocation (``$SLURM_JOB_ID`` set, one node or more; not with
    ``single_node``), its nodes, every launch a job step; else this host alone.

    Raises:
        SetupError: a bad system file, or ``scontrol`` failing inside an allocation.
    """
    environ = os.environ if environ is None else environ
    if system is not None:
        if single_node:
            raise SetupError("--system and --single-node contradict each other; give one")
        return load_system(system, portable(devices))
    if environ.get("SLURM_JOB_ID") and not single_node:
        return slurm_cluster(portable(devices), environ)
    return local_cluster(devices)


def portable(devices: Devices) -> Devices:
    """``devices`` as every node of a cluster can be given them: this host's GPU UUIDs
    (``GPU-…``) name no GPU on another node, so each device whose accelerator has a
    :attr:`~milarun.host.accel.base.Accelerator.portable_id` (a whole NVIDIA GPU: CUDA's
    index, in PCI order) is given by it instead. Nodes are assumed alike."""
    found = {a.index: a for a in getattr(devices, "accelerators", None) or ()}
    if not any(a.portable_id for a in found.values()):
        return devices
    visible = devices.visible_ids(devices.indices)
    visible = [
        found[i].portable_id if i in found and found[i].portable_id else v
        for i, v in zip(devices.indices, visible)
    ]
    return replace(devices, visible=visible)


def probe_argv(
    cluster: Cluster, name: str, path: str | os.PathLike[str]
) -> tuple[list[str], dict[str, str]]:
    """``(argv, env)`` that write ``path`` (a probe file) on node ``name``."""
    return cluster.on_nodes(
        ["sh", "-c", 'echo "$1" > "$2"', "probe", name, str(path)], {}, [name], tag="milarun-probe"
    )


def check_shared_outdir(
    cluster: Cluster, outdir: str | os.PathLike[str], timeout: float = 60.0
) -> None:
    """Check that every node sees ``outdir``: each writes a probe file, this host reads it back.

    Raises:
        SetupError: a node could not be reached or its probe did not appear here.
    """
    if not cluster.multi and cluster.kind == "local":
        return
    import secrets
    from pathlib import Path

    probes = Path(outdir) / ".milarun" / f"probe-{secrets.token_hex(4)}"
    probes.mkdir(parents=True, exist_ok=True)
    try:
        running = []
        for node in cluster.nodes:  # every node at once: one timeout in all, not one per node
            argv, env = probe_argv(cluster, node.name, probes / node.name)
            try:
                running.append(
                    (
                        node,
                        subprocess.Popen(
                            argv,
                            env={**os.environ, **env},
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE,
                            text=True,
                        ),
                    )
                )
            except OSError as exc:
                raise SetupError(f"cannot run {argv[0]}: {exc.strerror}")
        deadline = time.monotonic() + timeout
        for node, proc in running:
            try:
                _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for _, other in running:
                    other.kill()
                raise SetupError(
                    f"node {node.name}: no answer within {timeout:g} s ({cluster.kind})"
                )
            if proc.returncode != 0:
                for _, other in running:
                    other.kill()
                detail = (err.strip().splitlines() or [f"status {proc.returncode}"])[-1]
                raise SetupError(
                    f"node {node.name}: cannot write to the results folder {outdir}: {detail}"
                )
        for node, _ in running:
            try:
                seen = (probes / node.name).read_text().strip()
            except OSError:
                seen = None
            if seen != node.name:
                raise SetupError(
                    f"node {node.name} wrote its probe but this host does not see "
                    f"it: the results folder {outdir} must be on a filesystem "
                    "every node shares"
                )
    finally:
        for p in probes.glob("*"):
            p.unlink(missing_ok=True)
        try:
            probes.rmdir()
        except OSError:
            pass
