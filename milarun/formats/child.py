"""The child protocol: how the launcher starts ``milarun run`` and what it tells it.

One definition of each part, used by both sides:

* the child's command line: :data:`OPTIONS` (what ``milarun run`` accepts,
  ``milarun.cli.run`` builds its parser from it), :func:`child_argv` (the one
  builder: the plan's launches and ``milarun rerun``) and :func:`decode_extra`
  (``--extra``, a JSON object of record fields, :data:`EXTRA_FIELDS`);
* the environment variables the launcher sets for a child (``ENV_*``, the start
  barrier's included, which :mod:`milarun.formats.barrier` reads);
* :data:`COMMON_DEFAULTS`: the defaults of the options every experiment accepts
  (``milarun.bench.options`` declares them with these values; the launcher's
  progress display reads them here, without importing the child's code).

Pure data and string work: nothing here starts a process or imports torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import MilarunError

#: The environment of a child, set by the plan (:mod:`milarun.plan.launches`,
#: :mod:`milarun.plan.nodes`) and by the device backends (:mod:`milarun.host.accel`).
ENV_DEVICE = "MILARUN_DEVICE"  # the launch's device label ("0", "0-3", "all")
ENV_RUN = "MILARUN_RUN"  # the repeat index
ENV_CPUS = "MILARUN_CPUS"  # the CPU list the launch is pinned to
ENV_NODE = "MILARUN_NODE"  # the node's name, for a launch over ssh
ENV_BACKEND = "MILARUN_BACKEND"  # the device backend (cpu for a CPU slot)
ENV_PCI_BUS_ID = "MILARUN_PCI_BUS_ID"  # the PCI bus id of an AMD device
ENV_DATAROOT = "MILARUN_DATAROOT"  # the dataset root, without -d
#: The start barrier's variables, given to each process of a concurrent wave
#: (:mod:`milarun.formats.barrier`); a rerun or a lone process drops them all.
ENV_ADDRESS = "MILARUN_BARRIER"  # "host:port" of the launcher's server
ENV_WAVE = "MILARUN_BARRIER_WAVE"  # the wave's id
ENV_TIMEOUT = "MILARUN_BARRIER_TIMEOUT"  # seconds a process waits at most
ENV_SECRET = "MILARUN_BARRIER_SECRET"  # the session's secret (never written to a record)
ENV_BARRIER_PREFIX = "MILARUN_BARRIER"  # what they all start with
#: The launch's labels and pinning, which a rerun takes again from a record's environ.
ENV_LAUNCH = (ENV_DEVICE, ENV_RUN, ENV_CPUS, ENV_PCI_BUS_ID, ENV_BACKEND, ENV_NODE)

#: ``python -m milarun run``, after the interpreter (and its flags).
RUN_MODULE = ("-m", "milarun", "run")

#: ``milarun run``'s arguments: ``(name, aliases, default, help)``; aliases None: positional.
#: An option ``--some-name`` is ``some_name``.
OPTIONS = (
    ("function", None, None, "The experiment to run, as module:function"),
    (
        "out",
        ("-o",),
        None,
        "Result directory, or a file ending in .json (default: print to stdout)",
    ),
    ("dataroot", ("-d",), None, f"Dataset root (default: ${ENV_DATAROOT})"),
    ("experiment_name", (), None, "Name of the experiment, suite.job (default: run.<module>)"),
    ("job_id", (), "0.0", "Job id, run.device"),
    ("extra", (), None, "JSON object of extra fields for the result"),
)

#: The record fields the launcher passes with ``--extra``, as the record keeps them.
#: ``partition`` holds the plan type (its name on disk).
EXTRA_FIELDS = (
    "run",
    "device",
    "devices",
    "partition",
    "job",
    "tags",
    "node",
    "nodes",
    "node_count",
    "gpus_per_node",
    "placeholders",
    "rendezvous",
)
#: Those a rerun passes on from a record: all but the rendezvous (a rerun runs alone).
RERUN_FIELDS = tuple(k for k in EXTRA_FIELDS if k != "rendezvous")

#: Defaults of the options every experiment accepts (``milarun.bench.options``):
#: ``max_count`` (items), ``min_steady`` (s), ``sample_duration`` (s), ``warmup``
#: (windows), ``seed``, ``device``, ``monitor_interval`` (s), ``no_instrument``,
#: ``profile_trace`` (folder or None), ``profile_steps`` (steps).
COMMON_DEFAULTS: dict[str, Any] = {
    "max_count": 1000,
    "min_steady": 0.0,
    "sample_duration": 0.5,
    "warmup": 3,
    "seed": 1234,
    "device": "auto",
    "monitor_interval": 1.0,
    "no_instrument": False,
    "profile_trace": None,
    "profile_steps": 10,
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def child_argv(
    head: Iterable[str],
    function: str,
    out: str | os.PathLike[str] | None = None,
    dataroot: str | os.PathLike[str] | None = None,
    name: str | None = None,
    job_id: str | None = None,
    extra: Mapping[str, Any] | None = None,
    test_argv: Iterable[str] = (),
) -> list[str]:
    """The child's command line: ``head`` (``[python, "-m", "milarun", "run"]`` or a
    torchrun head ending in :data:`RUN_MODULE`), then ``function``, the options of
    :data:`OPTIONS` that are given (``extra`` as sorted JSON), ``--`` and ``test_argv``."""
    argv = list(head) + [function]
    if out is not None:
        argv += ["-o", str(out)]
    if dataroot is not None:
        argv += ["-d", str(dataroot)]
    if name is not None:
        argv += [_flag("experiment_name"), name]
    if job_id is not None:
        argv += [_flag("job_id"), job_id]
    if extra is not None:
        argv += [_flag("extra"), json.dumps(extra, sort_keys=True)]
    return argv + ["--"] + list(test_argv)


def decode_extra(extra: str | dict[str, Any] | None) -> Any:
    """``--extra`` as a dict (None stays None; a dict is taken as is).

    Raises:
        MilarunError: not valid JSON.
    """
    if extra is None or isinstance(extra, dict):
        return extra
    try:
        return json.loads(extra)
    except json.JSONDecodeError as exc:
        raise MilarunError(f"--extra is not valid JSON ({exc.msg})")
