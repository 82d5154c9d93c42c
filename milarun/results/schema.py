"""The result record: one JSON object per run × device.

Format history (append a line and a migration step for every change):

* version 1 (2026-11): first format.

Fields of a version-1 record (all times in seconds; rates in items/s):

``version``        int, FORMAT_VERSION.
``name``           ``"suite.job"``, e.g. ``"cpu.toy_reg"``.
``suite``, ``job_name``  the two halves of ``name``.
``job_id``         ``"{run}.{device}"``, e.g. ``"0.1"``.
``run``            repeat index (int).
``device``         device label used in the file name: ``"0"``, ``"0-3"`` or ``"all"``.
``devices``        list of device indices the process was given (ints).
``device_count``   ``len(devices)`` (gpu-progression groups by it).
``partition``      ``"normal"``, ``"per-gpu"`` or ``"gpu-progression"``.
``call``           ``{"function": "mod:fn", "argv": [...], "arguments": {opt: value}}``.
``job``            the resolved job definition from the profile (or ``{}``).
``dataroot``       dataset root the child used.
``environ``        the subset of the environment needed to rerun.
``host``           ``hostname, cpu_model, cpu_count, cpuset (list of ints),
                   memory_limit_mib (float or None), cgroup (str), gpus
                   [{index, name, driver, memory_total_mib}], python, torch, cuda``.
``timings``        ``{"program": {"start", "end", "duration"},
                   "train": {"sample_duration", "warmup", "count",
                   "samples": [{"start", "end", "count", "rate", "warmup"}]}}``;
                   ``start``/``end`` of samples are seconds since program start;
                   program start/end are Unix time.
``metrics``        free-form scalars, e.g. ``{"loss": 0.12}``.
``gpu_monitor``    ``{"available": bool, "reason": str|None, "interval": s,
                   "samples": [{"t", "device", "load", "memory_mib",
                   "temperature", "power", "energy"}]}`` (load in %,
                   temperature in °C, power in W, energy in J since start).
``peak_memory_mib`` peak accelerator memory (MiB) or peak RSS on CPU.
``success``        bool.
``error``          ``None`` or ``{"reason": "error"|"oom-killed"|"timeout"|"signal",
                   "type", "message", "traceback", "returncode", "signal",
                   "stderr_tail"}``.
"""

import copy

from ..errors import ResultFormatError

FORMAT_VERSION = 1

FAIL_REASONS = ("error", "oom-killed", "timeout", "signal", "interrupted",
                "exit-after-result")

_REQUIRED = ("version", "name", "job_id", "call", "timings", "success")


def new_result(name, job_id="0.0", *, device="0", devices=(0,), run=0,
               partition="normal"):
    """Return an empty version-1 record for experiment ``name`` (``suite.job``)."""
    suite, _, job_name = name.partition(".")
    return {
        "version": FORMAT_VERSION,
        "name": name,
        "suite": suite,
        "job_name": job_name or suite,
        "job_id": job_id,
        "run": run,
        "device": str(device),
        "devices": list(devices),
        "device_count": len(devices),
        "partition": partition,
        "call": {"function": None, "argv": [], "arguments": {}},
        "job": {},
        "dataroot": None,
        "environ": {},
        "host": {},
        "timings": {"program": {}, "train": {"sample_duration": None,
                                             "warmup": 0, "count": 0,
                                             "samples": []}},
        "metrics": {},
        "gpu_monitor": {"available": False, "reason": "not started",
                        "interval": None, "samples": []},
        "peak_memory_mib": None,
        "success": False,
        "error": None,
    }


# Each step takes a record of version v and returns one of version v + 1.
_MIGRATIONS = {
    # 0: the unversioned layout of early prototypes, which had "train" at the top level
    0: lambda r: {**{k: v for k, v in r.items() if k != "train"},
                  "version": 1,
                  "timings": {**r.get("timings", {}),
                              "train": r.get("train", {"samples": []})}},
}


def migrate(record, path=None):
    """Bring ``record`` up to FORMAT_VERSION through the migration chain.

    Raises:
        ResultFormatError: not a dict, version newer than ours or unknown,
            or a required field missing after migration.
    """
    if not isinstance(record, dict):
        raise ResultFormatError("not a result record (expected a JSON object)", path=path)
    version = record.get("version", 0)
    # Current records are returned as they are; only old ones are copied and rewritten.
    rec = record if version == FORMAT_VERSION else copy.deepcopy(record)
    if not isinstance(version, int):
        raise ResultFormatError(f"bad format version {version!r}", path=path, key="version")
    if version > FORMAT_VERSION:
        raise ResultFormatError(
            f"format version {version} is newer than this milarun ({FORMAT_VERSION})",
            path=path, key="version")
    while version < FORMAT_VERSION:
        step = _MIGRATIONS.get(version)
        if step is None:
            raise ResultFormatError(f"unknown format version {version}", path=path, key="version")
        rec = step(rec)
        version = rec["version"]
    validate(rec, path)
    return rec


def validate(record, path=None):
    """Check that a current-version record has its required fields.

    Raises:
        ResultFormatError: naming the first missing or mistyped key.
    """
    for key in _REQUIRED:
        if key not in record:
            raise ResultFormatError("missing field", path=path, key=key)
    samples = record["timings"].get("train", {}).get("samples")
    if not isinstance(samples, list):
        raise ResultFormatError("must be a list", path=path, key="timings.train.samples")
    if not isinstance(record["success"], bool):
        raise ResultFormatError("must be true or false", path=path, key="success")
    return record
