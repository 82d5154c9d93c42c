"""Is a measured rate real? The checks that fail a result and the checks that flag it.

Pure code: no torch, no I/O. The child applies :func:`judge` to its record
before writing it (so a file gets ``.FAIL`` in its name and the reason), and
the summary applies the same :func:`judge` to every record it reads, so
results written before these checks existed are judged the same way.

**Failing checks** (``error.reason``):

* ``nan-loss`` -- a loss the test logged is NaN or infinite: in any sample
  window (``timings.train.samples[].loss``, warm-up included) or in the final
  ``metrics`` (keys ``loss``, ``loss_*`` and ``*_loss``). The writer stores
  non-finite numbers as ``null``, so a ``null`` loss is a non-finite one.
  A test with no loss by nature declares it (``NO_LOSS = "why"`` in its
  module, recorded as the record's ``no_loss``); a record that has neither
  a loss nor that declaration is not checked (:func:`loss_status` says so).
* ``no-steady-state`` -- the window rule (:func:`milarun.measure.stats.steady_state`)
  finds no steady state (no non-warm-up sample of positive duration), or
  the steady-state throughput is 0 items/s.

**Flagging checks** (shown in the summary and the report; the result still
counts). Their thresholds come from the job's ``validation`` block in the
profile (recorded in each result's ``job``), merged over :data:`DEFAULTS`;
``null`` turns a check off::

    "validation": {
      "usage": {"gpu_load_threshold": 0.5,     # mean GPU load, fraction of 100 %
                "gpu_mem_threshold": 0.1},     # mean GPU memory used / GPU memory
      "host":  {"outside_cpu_threshold": 0.1,  # host CPUs busy outside the suite
                "steal_threshold": 0.05}       # host CPUs stolen by the hypervisor
    }

All are means over the result's steady state (the interval from the first
to the last sample :func:`milarun.measure.stats.steady_state` chose):

* ``gpu-load`` / ``gpu-memory`` (GPU results only; :mod:`milarun.bench.monitor`
  readings): a device whose mean load, or mean memory used over its total,
  is below the threshold.
* ``host-busy``: CPU time used on the host by processes outside the suite
  (``host_load`` samples of :mod:`milarun.bench.hostload`), as a fraction
  of the host's CPUs, above the threshold.
* ``cpu-steal``: steal time (where the kernel reports it), as a fraction of
  the host's CPUs, above the threshold.
* ``loss-not-decreasing`` (workloads that set ``metrics.learning_check``: the
  LLM, diffusion and ViT tests): the training loss at the end is not below the first windows'
  (:func:`learning`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from . import stats
from .flags import Flag, flag
from .stats import Sample, Steady, finite

#: A result record (parsed JSON).
Record = Mapping[str, Any]

#: ``error.reason`` of the failing checks.
NAN_LOSS = "nan-loss"
NO_STEADY_STATE = "no-steady-state"
FAIL_CHECKS = (NAN_LOSS, NO_STEADY_STATE)

#: The flagging checks (each has its :class:`milarun.measure.flags.Rule`).
FLAG_CHECKS = ("gpu-load", "gpu-memory", "host-busy", "cpu-steal", "loss-not-decreasing")
#: ``metrics`` key by which a workload says its loss must fall (its data has learnable
#: structure: the LLM, diffusion and ViT tests); only such records get the learning flag.
LEARNING_CHECK = "learning_check"
#: Sample windows averaged at each end for the learning flag.
LEARNING_WINDOWS = 2

#: The thresholds used when the profile gives none (fractions; None: check off).
#: GPU load: milabench's 0.5. GPU memory is lower than milabench's 0.5: how much
#: memory a test needs depends on its batch size, not on the machine, while a
#: test on the wrong device uses next to none.
DEFAULTS: dict[str, dict[str, float | None]] = {
    "usage": {"gpu_load_threshold": 0.5, "gpu_mem_threshold": 0.1},
    "host": {"outside_cpu_threshold": 0.1, "steal_threshold": 0.05},
}


def _bad_loss(value: object) -> bool:
    """A logged loss that is not a finite number: null (how the writer stores NaN
    and infinities) or a non-finite float. Other values (text) are not losses."""
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def is_loss_key(key: str) -> bool:
    """True for a metric that is a loss: ``loss``, ``loss_*`` or ``*_loss``."""
    return key == "loss" or key.startswith("loss_") or key.endswith("_loss")


def _samples(record: Record) -> list[Sample]:
    train = (record.get("timings") or {}).get("train") or {}
    return train.get("samples") or []


def loss_status(record: Record) -> str:
    """``"logged"``, ``"none"`` (the test declares it has no loss) or ``"missing"``
    (no loss recorded and no declaration: the loss cannot be checked)."""
    if any(is_loss_key(k) for k in record.get("metrics") or {}) or any(
        isinstance(s, dict) and "loss" in s for s in _samples(record)
    ):
        return "logged"
    return "none" if record.get("no_loss") else "missing"


def nonfinite_loss(record: Record) -> str | None:
    """Where a logged loss is NaN, infinite or null: a message, or None when every
    logged loss is finite (or nothing was logged)."""
    for i, s in enumerate(_samples(record)):
        if isinstance(s, dict) and "loss" in s and _bad_loss(s["loss"]):
            when = f" (t = {s['end']:.1f} s)" if finite(s.get("end")) else ""
            kind = "warm-up " if s.get("warmup") else ""
            return f"loss is {_show(s['loss'])} in {kind}sample {i}{when}"
    for key, value in sorted((record.get("metrics") or {}).items()):
        if is_loss_key(key) and _bad_loss(value):
            return f"final {key} is {_show(value)}"
    return None


def _show(value: object) -> str:
    return "NaN or infinite (null)" if value is None else repr(value)


def steady_window(
    record: Record, steady: Steady | None = None
) -> tuple[float | None, float | None, float | None, float, float, str]:
    """The result's steady state: ``(rate, start, end, items, duration, note)``.

    ``rate`` in items/s (None without a steady state), ``start``/``end`` (s
    since program start) bound the chosen samples, ``items`` their count and
    ``duration`` their summed length (s). ``steady``: ``(rate, chosen, note)`` of
    :func:`milarun.measure.stats.steady_state` of its samples when the caller has it;
    else it is computed.

    Raises:
        ValueError: malformed samples (see :func:`milarun.measure.stats.steady_state`).
    """
    rate, chosen, note = stats.steady_state(_samples(record)) if steady is None else steady
    if not chosen:
        return rate, None, None, 0, 0.0, note
    return (
        rate,
        min(s["start"] for s in chosen),
        max(s["end"] for s in chosen),
        sum(s["count"] for s in chosen),
        sum(s["end"] - s["start"] for s in chosen),
        note,
    )


def fail_check(record: Record, steady: Steady | None = None) -> tuple[str, str] | None:
    """The failing check a successful record breaks: ``(reason, message)``, or None.

    Failed records are not looked at (they already failed). Malformed samples
    are not judged here (the summary skips such a record). ``steady``: as for
    :func:`steady_window`.
    """
    if record.get("success") is not True:
        return None
    problem = nonfinite_loss(record)
    if problem:
        return NAN_LOSS, f"{problem}: the training diverged; its rate is not a result"
    try:
        rate, *_ = steady_window(record, steady)
    except ValueError:
        return None
    n = len(_samples(record))
    if rate is None:
        return NO_STEADY_STATE, (
            f"no steady state: none of the {n} sample(s) is a "
            "non-warm-up sample with a duration (run longer, or "
            "lower --warmup)"
        )
    if rate <= 0:
        return NO_STEADY_STATE, "no steady state: the throughput is 0 items/s"
    return None


def judge(record: Record, steady: Steady | None = None) -> Record:
    """Apply :func:`fail_check`: the record itself when it passes (or already
    failed), else a shallow copy with ``success`` false and ``error`` set
    (``type`` ``"ValidationError"``). The input is never modified. ``steady``: as
    for :func:`steady_window`."""
    verdict = fail_check(record, steady)
    if verdict is None:
        return record
    reason, message = verdict
    return {
        **record,
        "success": False,
        "error": {
            "reason": reason,
            "type": "ValidationError",
            "message": message,
            "traceback": None,
        },
    }


def apply(record: dict[str, Any]) -> str | None:
    """:func:`judge` in place (the child's writer): returns the failing reason or None."""
    verdict = fail_check(record)
    if verdict is None:
        return None
    record["success"] = False
    record["error"] = {
        "reason": verdict[0],
        "type": "ValidationError",
        "message": verdict[1],
        "traceback": None,
    }
    return verdict[0]


# ------------------------------------------------------------------ flags


def thresholds(record: Record) -> dict[str, dict[str, Any]]:
    """The flag thresholds of a record: its job's ``validation`` block over
    :data:`DEFAULTS` (unknown keys ignored; the profile schema checks them)."""
    given = (record.get("job") or {}).get("validation") or {}
    out: dict[str, dict[str, Any]] = {}
    for section, defaults in DEFAULTS.items():
        block = given.get(section)
        mine = block if isinstance(block, dict) else {}
        out[section] = {k: mine.get(k, v) for k, v in defaults.items()}
    return out


def _mean_over(
    readings: Iterable[Mapping[str, Any]], start: float, end: float, key: str
) -> float | None:
    """Mean of ``key`` over monitor readings whose time lies in [start, end]."""
    values = [
        r[key]
        for r in readings
        if finite(r.get("t")) and start <= r["t"] <= end and finite(r.get(key))
    ]
    return sum(values) / len(values) if values else None


def gpu_usage(record: Record, start: float, end: float) -> dict[int, dict[str, Any]]:
    """``{device: {"load": fraction, "memory": fraction or None}}``: mean GPU load
    (fraction of 100 %) and mean memory used over the device's total, from the
    monitor readings taken in [start, end] (s since program start). Devices
    without a reading in the interval are left out."""
    monitor = record.get("gpu_monitor") or {}
    if not monitor.get("available"):
        return {}
    readings = [r for r in monitor.get("samples") or [] if isinstance(r, dict)]
    totals: dict[Any, Any] = {
        g.get("index"): g.get("memory_total_mib")
        for g in (record.get("host") or {}).get("gpus") or []
        if isinstance(g, dict)
    }
    out: dict[int, dict[str, Any]] = {}
    for dev in sorted({d for r in readings if isinstance(d := r.get("device"), int)}):
        mine = [r for r in readings if r.get("device") == dev]
        load = _mean_over(mine, start, end, "load")
        if load is None:
            continue
        mem = _mean_over(mine, start, end, "memory_mib")
        total = totals.get(dev)
        out[dev] = {
            "load": load / 100.0,
            "memory": mem / total if mem is not None and finite(total) and total > 0 else None,
        }
    return out


def host_load(record: Record, start: float, end: float) -> dict[str, Any] | None:
    """Mean host CPU use over [start, end] (s since program start) from the
    record's ``host_load`` samples, weighted by each interval's overlap:
    ``{"outside": cores, "steal": cores or None, "cpu_count": n, "covered": s}``,
    or None when no sample overlaps the interval."""
    load = record.get("host_load") or {}
    if not load.get("available"):
        return None
    total = {"outside": 0.0, "steal": 0.0}
    steal_seen = False
    covered = 0.0
    for s in load.get("samples") or []:
        if not (isinstance(s, dict) and finite(s.get("t")) and finite(s.get("dt"))):
            continue
        lo, hi = s["t"] - s["dt"], s["t"]
        overlap = min(hi, end) - max(lo, start)
        if overlap <= 0 or not finite(s.get("outside")):
            continue
        covered += overlap
        total["outside"] += s["outside"] * overlap
        if finite(s.get("steal")):
            steal_seen = True
            total["steal"] += s["steal"] * overlap
    if covered <= 0:
        return None
    return {
        "outside": total["outside"] / covered,
        "steal": total["steal"] / covered if steal_seen else None,
        "cpu_count": load.get("cpu_count"),
        "covered": covered,
    }


def learning(record: Record) -> Flag | None:
    """The ``loss-not-decreasing`` flag of a record whose workload says its loss must
    fall (``metrics.learning_check``), or None.

    Compares the mean training loss of the first :data:`LEARNING_WINDOWS`
    sample windows that logged one (warm-up included: where training starts)
    with that of the last ones (the end of the steady state). A random-initialised
    model on data with structure learns within a few hundred steps, so a final
    loss not below the first says the benchmark did not train for real (a
    frozen optimizer, a wrong learning rate, gradients lost between ranks), as
    MLPerf's quality targets say at full scale. Its figure ``value`` is last / first.
    Needs twice :data:`LEARNING_WINDOWS` windows with a finite loss.
    """
    if (record.get("metrics") or {}).get(LEARNING_CHECK) is not True:
        return None
    losses = [
        float(s["loss"])
        for s in _samples(record)
        if isinstance(s, dict) and finite(s.get("loss")) and not isinstance(s["loss"], bool)
    ]
    k = LEARNING_WINDOWS
    if len(losses) < 2 * k:
        return None
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    if last < first or first <= 0:
        return None
    return flag(
        "loss-not-decreasing",
        f"training loss {last:.4g} at the end of the steady state is not below "
        f"{first:.4g} of the first windows: the model did not learn",
        value=last / first,
        threshold=1.0,
    )


def flags(record: Record, steady: Steady | None = None) -> list[Flag]:
    """The flags of one successful record: a list of
    :class:`milarun.measure.flags.Flag` with figures ``value`` and ``threshold``
    (fractions; GPU flags are at their ``gpu``, the device index). Empty when
    nothing is flagged or there is no steady state to look at. ``steady``: as for
    :func:`steady_window`."""
    if record.get("success") is not True:
        return []
    learned = learning(record)
    return ([learned] if learned else []) + _usage_flags(record, steady)


def _usage_flags(record: Record, steady: Steady | None = None) -> list[Flag]:
    """The GPU-usage and host-load flags of :func:`flags`."""
    if not (
        (record.get("gpu_monitor") or {}).get("available")
        or (record.get("host_load") or {}).get("available")
    ):
        return []  # nothing to look at (and no steady state to compute)
    try:
        rate, start, end, *_ = steady_window(record, steady)
    except ValueError:
        return []
    if rate is None or start is None or end is None:  # both None, or neither
        return []
    limits = thresholds(record)
    out: list[Flag] = []
    usage = limits["usage"]
    for dev, use in gpu_usage(record, start, end).items():
        for check, key, what in (
            ("gpu-load", "gpu_load_threshold", "GPU load"),
            ("gpu-memory", "gpu_mem_threshold", "GPU memory used"),
        ):
            value, limit = use["load" if check == "gpu-load" else "memory"], usage.get(key)
            if finite(limit) and value is not None and value < limit:
                out.append(
                    flag(
                        check,
                        f"GPU {dev}: mean {what} {value:.0%} < {limit:.0%} during the steady state",
                        where={"gpu": dev},
                        value=value,
                        threshold=limit,
                    )
                )
    host = host_load(record, start, end)
    if host is not None and finite(host["cpu_count"]) and host["cpu_count"] > 0:
        ncpu = host["cpu_count"]
        for check, key, cores, what in (
            (
                "host-busy",
                "outside_cpu_threshold",
                host["outside"],
                "used by processes outside the suite",
            ),
            ("cpu-steal", "steal_threshold", host["steal"], "stolen (steal time)"),
        ):
            limit = limits["host"].get(key)
            if cores is None or not finite(limit):
                continue
            value = cores / ncpu
            if value > limit:
                out.append(
                    flag(
                        check,
                        f"{cores:.2f} of the host's {ncpu} CPUs ({value:.0%} > "
                        f"{limit:.0%}) {what} during the steady state",
                        value=value,
                        threshold=limit,
                    )
                )
    return out


def summary_flags(
    items: Iterable[Sequence[Any]], node_of: Callable[[Record], str | None]
) -> list[Flag]:
    """The validation flags of one group: the :func:`flags` of its successful
    records, each at its ``device``, ``node`` (``node_of(record)``), ``run`` and
    ``file``. ``items`` are ``(path, record)`` or ``(path, record, steady)`` tuples
    (``steady``: as for :func:`steady_window`)."""
    out: list[Flag] = []
    for item in items:
        path, rec = item[0], item[1]
        for f in flags(rec, item[2] if len(item) > 2 else None):
            out.append(
                f.at(
                    device=str(rec.get("device", "")),
                    node=node_of(rec),
                    run=rec.get("run"),
                    file=_name(path),
                )
            )
    return out


def _name(path: object) -> str | None:
    if path is None:
        return None
    return str(path).replace("\\", "/").rsplit("/", 1)[-1]
