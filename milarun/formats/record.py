"""The result record: one JSON object per run × device.

Format history: each version adds what it lists, and every addition is optional, so the
migration from the version before is a no-op that sets ``version`` (:data:`RESULT_FORMAT`).
Append a version and its step for every change; docs/results.md lists the same.

* 1: the first format.
* 2, multi-node: ``node``, ``nodes``, ``node_count``, ``gpus_per_node`` and
  ``distributed``; ``partition`` may also be ``njobs``, ``multi-node`` or
  ``node-progression``; ``error.reason`` may also be ``rendezvous-timeout``,
  ``rank-failed`` or ``node-lost``.
* 3, synchronized starts: ``timings.program.origin`` (Unix time of the samples' zero)
  and ``timings.barrier`` (the start barrier the process met); ``partition`` may also be
  ``multi-process``; ``error.reason`` may also be ``barrier-timeout``.
* 4, profile language: ``placeholders`` (the launch's placeholder values).
* 5, profile traces: ``profile_trace`` and the sample flag ``profiled``.
* 6, LLM workloads: ``serving`` and ``tags``; ``error.reason`` may also be ``oom``.
* 7, acceptance tests: ``collectives``; ``error.reason`` may also be ``wrong-result``
  or ``data-corruption``.
* 8, validation and host facts: ``no_loss`` and ``host_load``; ``host`` may hold the
  facts of :mod:`milarun.host.facts` (milarun version and commit, kernel, CPU governor,
  boost, cgroup CPU quota; per GPU power limits, clocks, persistence and ECC); samples
  may hold ``loss``; ``error.reason`` may also be ``nan-loss`` or ``no-steady-state``.
* 9, hardware identity: a device of ``devices`` may hold its ``serial``.
* 10, server-scenario serving: ``serving_load`` (``llm_server``).
* 11, convergence: ``seed`` (the run's seed, ``--seed`` + run) and
  ``timings.train.loss_curve`` (the mean loss over blocks of steps).
* 12, GPU health: ``health`` (the launch's GPU health counters before and after it, and
  the findings, :mod:`milarun.host.health`).
* 13, fabric: a ``collectives`` row may hold its ``group`` kind and each group's figures
  (``groups``), and the record ``fabric`` (the pairs' verdict, :mod:`milarun.measure.fabric`);
  ``error.reason`` may also be ``checkpoint-mismatch`` or ``no-space`` (the storage tests).

A reader older than a record's version refuses it ("newer than this milarun").

The declared schema is ``milarun/formats/schemas/result.schema.json``: every record
read or written is checked against it (:func:`validate`). Numbers are finite;
rates, counts, durations and sample times non-negative; names (``name``,
``suite``, ``job_name``, ``job_id``, ``device``) use letters, digits, ``_``,
``-`` and ``.`` between them (no path separator, no newline); strings and lists
are bounded (at most 1,000,000 samples). Unknown top-level fields are errors.

Fields of a record (all times in seconds; rates in items/s;
tests/test_bad_inputs.py checks that this list and the schema agree):

``version``        int, FORMAT_VERSION.
``name``           ``"suite.job"``, e.g. ``"cpu.toy_reg"``.
``suite``, ``job_name``  the two halves of ``name``.
``job_id``         ``"{run}.{device}"``, e.g. ``"0.1"``.
``run``            repeat index (int).
``device``         device label used in the file name: ``"0"``, ``"0-3"`` or ``"all"``.
``devices``        list of device indices the process was given (ints).
``device_count``   ``len(devices)`` (gpu-progression groups by it).
``partition``      the plan type: ``"normal"``, ``"per-gpu"``, ``"gpu-progression"``,
                   ``"njobs"``, ``"multi-node"``, ``"node-progression"`` or
                   ``"multi-process"``.
``node``           optional: the node (host) name the launch ran on, a safe name.
``nodes``          optional: the node names the launch spanned (``[node]`` on one node).
``node_count``     optional: ``len(nodes)``, >= 1.
``gpus_per_node``  optional: devices per node the launch used, >= 1.
``call``           ``{"function": "mod:fn", "argv": [...], "arguments": {opt: value}}``.
``job``            the resolved job definition from the profile (or ``{}``).
``placeholders``   optional: ``{name: value}`` the plan filled the job's argument
                   placeholders with for this launch (``{"cpu_per_gpu": 8}``).
``dataroot``       dataset root the child used.
``environ``        the subset of the environment needed to rerun.
``host``           ``hostname, cpu_model, cpu_count, cpuset (list of ints),
                   memory_limit_mib (float or None), cgroup (str), gpus
                   [{index, name, driver, memory_total_mib}], python, torch, cuda``,
                   and optionally the facts of :mod:`milarun.host.facts`.
``timings``        ``{"program": {"start", "end", "duration"},
                   "train": {"sample_duration", "warmup", "count",
                   "samples": [{"start", "end", "count", "rate", "warmup",
                   "loss" (optional: the loss at the window's end)}],
                   "loss_curve" (optional): [{"step", "items", "loss"}]}}``;
                   ``loss_curve`` holds the mean loss over the steps ``(2^(k-1),
                   2^k]`` at step 2^k (:mod:`milarun.bench.rate`);
                   ``start``/``end`` of samples are seconds since program start;
                   program start/end are Unix time. Optional:
                   ``program.origin``, the Unix time of the samples' zero
                   (the experiment's creation, shortly before ``start``);
                   ``barrier``, the start barrier of a concurrent wave:
                   ``{"address", "wave", "label", "parties", "arrived_count",
                   "arrived", "released" (Unix times, own clock),
                   "server_release" (the launcher's clock), "released_at" (s
                   since the samples' zero), "wait_s", "timeout_s"}``
                   (``released`` null when it timed out).
``seed``           optional: the seed the run ran at (``--seed`` + ``run``).
``metrics``        free-form scalars, e.g. ``{"loss": 0.12}``.
``gpu_monitor``    ``{"available": bool, "reason": str|None, "interval": s,
                   "samples": [{"t", "device", "load", "memory_mib",
                   "temperature", "power", "energy"}]}`` (load in %,
                   temperature in °C, power in W, energy in J since start).
``peak_memory_mib`` peak accelerator memory (MiB) or peak RSS on CPU.
``success``        bool.
``error``          ``None`` or ``{"reason": one of FAIL_REASONS, "type", "message",
                   "traceback", "returncode", "signal", "stderr_tail"}``; a FAIL
                   record the launcher filled from the journal may add
                   ``"journal_dropped"``: the journal lines left out (malformed
                   or out-of-range values, see ``milarun.formats.journal``).
``started``, ``finished``  optional ISO-8601 UTC times the child started and ended.
``written_by``     optional: ``"launcher"`` for a FAIL record written by the parent
                   (or ``"child"``).
``distributed``    optional, written by rank 0 of a torchrun job:
                   ``{"world_size": ranks, "backend": "nccl"|"gloo"|...,
                   "rendezvous": {"backend": "c10d"|"static", "endpoint":
                   "host:port"|None, "id": str|None}, "master": "addr:port",
                   "node_names": [one per node], "hosts": [one ``host`` dict per
                   node]}`` (nodes in node-rank order; ``world_size`` and
                   ``backend`` required).
``profile_trace``  optional, with ``--profile-trace DIR``: ``{"path": the Chrome
                   trace (relative to the record's folder, or absolute; None if
                   no step was profiled), "steps": profiled steps, "activities":
                   ["cpu", "cuda"], "start", "end": s since program start,
                   "note": why nothing or less was profiled, or None}``. The
                   samples of those steps carry ``"profiled": true`` and stay
                   out of the steady state (:func:`milarun.measure.stats.steady_state`).
``no_loss``        optional: why the test has no loss by nature (its module's
                   ``NO_LOSS``); the NaN-loss check does not apply.
``host_load``      optional: ``{"available", "reason", "interval", "cpu_count",
                   "suite_root": "launcher"|"torchrun-agent"|"self"|"given",
                   "samples": [{"t", "dt", "busy", "suite", "outside", "steal"}]}``
                   (:mod:`milarun.bench.hostload`: host CPU use per interval, in
                   cores; ``outside`` is what processes outside the suite used).
``tags``           optional: the job's tags in its profile (the report's families,
                   :mod:`milarun.report.family`).
``serving``        optional (serving tests, ``llm_serve``): one entry per concurrency
                   level, the measured one first: ``{"concurrency", "requests",
                   "ttft_p50_s", ..., "tpot_p99_s", "ttft_mean_s", "tpot_mean_s",
                   "prefill_tokens_per_s", "decode_tokens_per_s",
                   "output_tokens_per_s", "goodput_requests_per_s",
                   "goodput_fraction"}`` (:mod:`milarun.measure.latency`).
``serving_load``   optional (server-scenario tests, ``llm_server``): ``{"scenario",
                   "api", "targets": {"name", "ttft_s", "tpot_s", "percentile"}, "server",
                   "levels": [{"load", "value", "warmup", "duration_s", "stopped",
                   "truncated", "requests": {"send_s", "ttft_s", "e2e_s",
                   "prompt_tokens", "output_tokens", "itl_us", "error"}, "figures"}],
                   "capacity", "consistency"}``: every request's raw timings, from which
                   :func:`milarun.measure.latency.level_figures` recomputes the figures.
``collectives``    optional (the ``collectives`` acceptance test): one row per collective and
                   message size: ``{"op", "bytes", "ranks", "time_s", "algbw_gbps",
                   "busbw_gbps"}`` (nccl-tests' method: :mod:`milarun.measure.acceptance`);
                   with ``--groups``, per group kind (``"group"``: ``world``, ``node``,
                   ``rail``, ``pairs``), the slowest group's figures and each group's
                   (``"groups": [{"nodes", "rail" | "round", "time_s", "algbw_gbps",
                   "busbw_gbps"}]``).
``fabric``         optional (``collectives --groups pairs``): the pairs' verdict, as
                   :func:`milarun.measure.fabric.localise` returns it; readers recompute it
                   from ``collectives``.
``health``         optional, written by the launcher for a launch given NVIDIA GPUs on its
                   own node (:mod:`milarun.host.health`): ``{"available", "reason",
                   "source": "nvml", "start", "end" (Unix times of the readings before and
                   after the launch), "gpus": [{"index", "uuid", "counters": {name: count
                   or None, after the launch}, "deltas": {name: after - before},
                   "unknown": {name: why unreadable}, "xid_codes"}], "findings":
                   [{"gpu", "uuid", "counter", "severity": "error"|"warning", "before",
                   "after", "message"}]}``; ``{"available": false, "reason"}`` when the
                   GPUs were not read (AMD, Intel, other nodes, no NVML).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ResultFormatError
from .jsonfile import StrPath, accepts, check, load_schema
from .versioned import Migration, VersionedFormat

FORMAT_VERSION = 13

#: Values of ``error.reason``: the test raised (``error``), the kernel OOM
#: killer, the launcher's timeout, a signal, an interrupted suite, a
#: successful record followed by a non-zero exit or a hang; for distributed
#: launches, a node that did not join the rendezvous in time, a rank that died,
#: a node whose connection (ssh, srun step) dropped; and the failing checks of
#: :mod:`milarun.measure.plausibility` (a NaN or infinite loss, no steady state); a
#: child whose torch cannot use the device it was given (``wrong-device``); a child
#: whose device memory ran out (``oom``: torch's ``OutOfMemoryError``, samples kept); the
#: acceptance tests' checks of their results: a collective that returned a wrong
#: result (``wrong-result``), a burn-in matmul that differs from its reference
#: (``data-corruption``); the storage tests' (``checkpoint``, ``smallfiles``): a checkpoint
#: shard read back different (``checkpoint-mismatch``), a filesystem without the space the
#: test needs (``no-space``). Read from the enum of ``error.reason`` in ``result.schema.json``,
#: the one list.
FAIL_REASONS = tuple(load_schema("result")["$defs"]["error"]["properties"]["reason"]["enum"])


def new_result(
    name: str,
    job_id: str = "0.0",
    *,
    device: str | int = "0",
    devices: Sequence[int] = (0,),
    run: int = 0,
    plan_type: str = "normal",
    node: str | None = None,
    nodes: Any = None,
    gpus_per_node: int | None = None,
) -> dict[str, Any]:
    """Return an empty record (of :data:`FORMAT_VERSION`) for experiment ``name`` (``suite.job``).

    ``plan_type`` is the plan type's name, the record's ``partition``.

    ``node``, ``nodes`` (``node_count`` is their number) and ``gpus_per_node``
    are set only when given (not None).
    """
    suite, _, job_name = name.partition(".")
    rec: dict[str, Any] = {
        "version": FORMAT_VERSION,
        "name": name,
        "suite": suite,
        "job_name": job_name or suite,
        "job_id": job_id,
        "run": run,
        "device": str(device),
        "devices": list(devices),
        "device_count": len(devices),
        "partition": plan_type,
        "call": {"function": None, "argv": [], "arguments": {}},
        "job": {},
        "dataroot": None,
        "environ": {},
        "host": {},
        "timings": {
            "program": {},
            "train": {"sample_duration": None, "warmup": 0, "count": 0, "samples": []},
        },
        "metrics": {},
        "gpu_monitor": {
            "available": False,
            "reason": "not started",
            "interval": None,
            "samples": [],
        },
        "peak_memory_mib": None,
        "success": False,
        "error": None,
    }
    if node is not None:
        rec["node"] = node
    if isinstance(nodes, (list, tuple)):
        rec["nodes"] = list(nodes)
        rec["node_count"] = len(rec["nodes"])
    elif nodes is not None:
        rec["nodes"] = nodes  # not a list: validation says so
    if gpus_per_node is not None:
        rec["gpus_per_node"] = gpus_per_node
    return rec


def _next_version(version: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The no-op step to ``version``: the record as it is, marked ``version``."""

    def step(record: dict[str, Any]) -> dict[str, Any]:
        return {**record, "version": version}

    return step


#: The record's versions and migrations (:mod:`milarun.formats.versioned`).
RESULT_FORMAT = VersionedFormat(
    FORMAT_VERSION,
    {
        # 0: the unversioned layout of early prototypes, which had "train" at the top level
        0: Migration(
            lambda r: {
                **{k: v for k, v in r.items() if k != "train"},
                "version": 1,
                "timings": {**r.get("timings", {}), "train": r.get("train", {"samples": []})},
            }
        ),
        # 1 to 11: each next version only adds optional fields (the history above)
        **{v: Migration(_next_version(v + 1)) for v in range(1, FORMAT_VERSION)},
    },
)


def migrate(record: Any, path: StrPath | None = None, parsed: bool = False) -> dict[str, Any]:
    """Bring ``record`` up to FORMAT_VERSION through the migration chain, then validate it.

    The input is never modified: an old record is copied before its steps run.
    ``parsed``: ``record`` comes from :func:`milarun.formats.jsonfile.parse_json` (see
    :func:`validate`).

    Raises:
        ResultFormatError: not a record, a version newer than ours or unknown,
            or (after migration) anything :func:`validate` rejects.
    """
    if not isinstance(record, dict) or not ("version" in record or "name" in record):
        raise ResultFormatError("not a result record (no 'version' or 'name' key)", path=path)
    # Current records are returned as they are; only old ones are copied and rewritten.
    rec = RESULT_FORMAT.upgrade(record, RESULT_FORMAT.version_of(record, path, default=0), path)
    return validate(rec, path, parsed=parsed)


def accepted(record: Any) -> bool:
    """True when :func:`migrate` of parsed ``record`` (``parsed=True``) returns it
    unchanged: a record of the current version that the result schema accepts.
    Says nothing of why not (:func:`migrate` does)."""
    return (
        isinstance(record, dict)
        and type(record.get("version")) is int
        and record["version"] == FORMAT_VERSION
        and accepts(record, "result", nan_free=True)
    )


def validate(
    record: dict[str, Any], path: StrPath | None = None, parsed: bool = False
) -> dict[str, Any]:
    """Check a current-version record against ``result.schema.json``; return it.

    The writer calls this before writing, so a record that would not read
    back is never written. ``parsed``: ``record`` comes from
    :func:`milarun.formats.jsonfile.parse_json` or :func:`milarun.formats.store.finite_json`,
    so it holds no NaN and the walk that looks for one is skipped (the schema
    check is the same).

    Raises:
        ResultFormatError: one line ``<path>: <key.path>: <message>`` for the
            most relevant problem (e.g. ``timings.train.samples.3.rate: must be
            >= 0, not -5``).
    """
    return check(record, "result", path=path, error_cls=ResultFormatError, nan_free=parsed)
