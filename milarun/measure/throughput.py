"""Own, effective and adjusted throughput of a concurrent wave. Numbers only, no I/O.

The processes of a concurrent wave (the per-GPU children of a test, the
processes of a multi-process test) share the machine: power, PCIe, memory
bandwidth, disk, CPU. A process's **own** throughput is its steady-state rate
(:func:`milarun.measure.stats.steady_state`: its last 10 s, from its own samples), and
part of that window may fall after its peers finished, when it had the machine
to itself. Following DLBS (HPE's Deep Learning Benchmarking Suite, its
multi-process inference benchmarks: ``src/tensorrt/docs/mprocess_benchmarks.md``,
``src/tensorrt/tools/tensorrt.cpp`` and
``src/tensorrt/python/compute_mprocess_throughput.py`` in
github.com/HewlettPackard/dlcookbook-dlbs), the wave is also measured over the
time when every process was running:

* the **common interval** ``[lo, hi]`` is the intersection of the processes'
  steady spans (:func:`steady_span`), on one clock (:func:`anchor`);
* a process's **effective** throughput is the items it processed inside the
  common interval divided by the interval's length (items/s); steps run
  under ``--profile-trace`` and their time are left out (:func:`profiled_spans`);
* the wave's **adjusted** throughput is the total work done in the common
  interval divided by its length (items/s), i.e. the sum of the effective
  throughputs.

DLBS's own code differs in how it finds that interval, not in what it
measures: its processes meet at a barrier before and after their timed loop,
``mgpu_effective_throughput`` is a process's items over the time between the
two barriers, and ``compute_mprocess_throughput.py`` gives the adjusted
throughput as ``n_gpus * batch / mean(trimmed mean batch time)`` after cutting
N batches off each end of every process (the batches that may not overlap the
others). Here the sample windows carry their start and end times, so the
common interval is computed exactly rather than approximated by trimming.

The **overlap** of a wave is ``length(common interval) / longest steady span``:
1.0 when every process was in its steady state for the same time, 0.0 when
two of them never were at once (then there is no effective or adjusted
throughput). A wave whose overlap is below :data:`MIN_OVERLAP` is flagged: its
processes did not load the machine together for most of their measurement.

Units: times in s (Unix time for absolute ones), rates in items/s.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from . import stats
from .stats import Sample, Steady

_START, _END = operator.itemgetter("start"), operator.itemgetter("end")
_COUNT = operator.itemgetter("count")
_PROFILED = operator.methodcaller("get", "profiled")

#: Fraction of the longest steady span the common interval must cover; below it,
#: the report flags the test.
MIN_OVERLAP = 0.8


def anchor(record: Mapping[str, Any]) -> float | None:
    """The Unix time of the zero of a result's sample times, on the wave's common clock.

    With a start barrier (``timings.barrier``), the launcher's clock: the
    server's release time minus the release's offset from the samples' zero,
    so processes on nodes whose clocks differ still line up (to the network
    latency). Else the record's own clock: ``timings.program.origin``, or
    ``program.start`` for records without it. None when the record has neither.
    """
    timings = record.get("timings") or {}
    bar = timings.get("barrier") or {}
    if _num(bar.get("server_release")) and _num(bar.get("released_at")):
        return float(bar["server_release"]) - float(bar["released_at"])
    program = timings.get("program") or {}
    for key in ("origin", "start"):
        if _num(program.get(key)):
            return float(program[key])
    return None


def _num(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def steady_span(
    samples: Sequence[Sample], tail: float = stats.STEADY_TAIL_S, note: str | None = None
) -> tuple[float, float] | None:
    """``(lo, hi)``: the time (s, the samples' clock) a result was in its steady state.

    From the start of its first non-warm-up sample to the end of its last
    non-warm-up sample that ends by ``T - tail`` (``T``: the end of its last
    sample; the final second is left out as in :func:`milarun.measure.stats.steady_state`);
    when that leaves nothing, to ``T``. None without a non-warm-up sample.

    ``note``: the note of :func:`milarun.measure.stats.steady_state` of ``samples`` when
    the caller has computed it (and so checked the samples); else it is computed.

    Raises:
        ValueError: a malformed sample (as :func:`milarun.measure.stats.steady_state`).
    """
    if note is None:
        _, _, note = stats.steady_state(samples)  # validates the samples
    if note == stats.NONE:
        return None
    steady = [s for s in samples if not s.get("warmup", False)]
    last = max(map(_END, steady))
    kept = [s for s in steady if s["end"] <= last - tail] or steady
    return min(map(_START, kept)), max(map(_END, kept))


def work_in(samples: Sequence[Sample], lo: float, hi: float) -> float:
    """Items processed between ``lo`` and ``hi`` (s, the samples' clock).

    A sample window that straddles a bound counts pro rata of its overlap
    (the rate is taken as even inside one window).
    """
    try:
        counts = list(map(_COUNT, samples))
    except KeyError:  # a sample without a count, which the loop may never read
        return _work_in_loop(samples, lo, hi)
    starts, ends = list(map(_START, samples)), list(map(_END, samples))
    # each sample's length and overlap computed by C loops with the loop's own
    # min() and max(), then its share; the shares added in sample order from 0.0
    # (sum() adds floats one by one, as the loop does): the same float
    lengths = list(map(operator.sub, ends, starts))
    insides = map(
        operator.sub, map(min, itertools.repeat(hi), ends), map(max, itertools.repeat(lo), starts)
    )
    return sum(
        [
            count * inside / length
            for count, inside, length in zip(counts, insides, lengths)
            if length > 0 and inside > 0
        ],
        0.0,
    )


def _work_in_loop(samples: Sequence[Sample], lo: float, hi: float) -> float:
    """:func:`work_in`, one sample at a time."""
    items = 0.0
    for s in samples:
        length = s["end"] - s["start"]
        if length <= 0:
            continue
        inside = min(hi, s["end"]) - max(lo, s["start"])
        if inside > 0:
            items += s["count"] * inside / length
    return items


def profiled_spans(samples: Sequence[Sample]) -> list[tuple[float, float]]:
    """The spans (s, the samples' clock) that ``--profile-trace`` took: each run of
    samples flagged ``profiled``, widened to the samples around it (starting the
    profiler and writing its trace fall between windows). Their items and their
    time stay out of the effective throughput, as they stay out of the steady state.
    """
    spans: list[tuple[float, float]] = []
    i = 0
    if not any(map(_PROFILED, samples)):  # the usual case, in C
        return spans
    while i < len(samples):
        if not samples[i].get("profiled"):
            i += 1
            continue
        j = i
        while j + 1 < len(samples) and samples[j + 1].get("profiled"):
            j += 1
        lo = samples[i - 1]["end"] if i > 0 else samples[i]["start"]
        hi = samples[j + 1]["start"] if j + 1 < len(samples) else samples[j]["end"]
        spans.append((lo, hi))
        i = j + 1
    return spans


def _effective(samples: Sequence[Sample], lo: float, hi: float) -> float | None:
    """Items/s of one process over ``[lo, hi]`` (its clock), less its profiled spans.

    Raises:
        ValueError: the rate is out of :func:`milarun.measure.stats.check_rate`'s range (a
            common interval of 1e-300 s makes any count overflow); the wave is then
            left without effective throughputs, as for a malformed sample.
    """
    spans = profiled_spans(samples)
    held = sum(max(0.0, min(hi, b) - max(lo, a)) for a, b in spans)
    kept = [s for s in samples if not s.get("profiled")] if spans else samples
    if not hi - lo - held > 0:
        return None
    return stats.check_rate(work_in(kept, lo, hi) / (hi - lo - held), "effective rate")


def wave(members: Sequence[Mapping[str, Any]], min_overlap: float = MIN_OVERLAP) -> dict[str, Any]:
    """Own, effective and adjusted throughput of one concurrent wave.

    Args:
        members: list of ``{"label": str, "anchor": Unix time of the samples' zero
            (:func:`anchor`), "samples": the result's ``timings.train.samples``}``,
            one per successful process of the wave (two or more); an optional
            ``"steady"``: :func:`milarun.measure.stats.steady_state` of the samples,
            when the caller has it.
        min_overlap: the overlap (fraction) under which the wave is flagged.

    Returns:
        ``{"interval": [lo, hi] (Unix times) or None, "length": s,
        "overlap": fraction (0 to 1), "flagged": overlap < min_overlap,
        "own": {label: items/s or None}, "effective": {label: items/s or None},
        "adjusted": items/s or None}``. Without a common interval (the steady
        states never overlapped, or a process has none) ``effective`` values and
        ``adjusted`` are None and ``overlap`` is 0.

    Raises:
        ValueError: a malformed sample, or a member without an anchor.
    """
    own: dict[str, float | None] = {}
    spans: dict[str, tuple[float, float] | None] = {}
    for m in members:
        steady = m.get("steady")
        rate, _, note = stats.steady_state(m["samples"]) if steady is None else steady
        own[m["label"]] = rate
        span = steady_span(m["samples"], note=note)
        if m["anchor"] is None:
            raise ValueError(f"process {m['label']!r} has no start time")
        spans[m["label"]] = None if span is None else (m["anchor"] + span[0], m["anchor"] + span[1])
    out: dict[str, Any] = {
        "interval": None,
        "length": 0.0,
        "overlap": 0.0,
        "flagged": True,
        "own": own,
        "effective": {m["label"]: None for m in members},
        "adjusted": None,
    }
    known = [s for s in spans.values() if s is not None]
    if not spans or len(known) < len(spans):
        return out
    lo = max(s[0] for s in known)
    hi = min(s[1] for s in known)
    longest = max(s[1] - s[0] for s in known)
    if hi <= lo or longest <= 0:
        return out
    length = hi - lo
    effective = {
        m["label"]: _effective(m["samples"], lo - m["anchor"], hi - m["anchor"]) for m in members
    }
    overlap = min(1.0, length / longest)
    rates = [r for r in effective.values() if r is not None]
    out.update(
        interval=[lo, hi],
        length=length,
        overlap=overlap,
        flagged=overlap < min_overlap,
        effective=effective,
        adjusted=(None if len(rates) < len(effective) else math.fsum(rates)),
    )  # <= 4096 x MAX_RATE
    return out


def release_skew(barriers: Iterable[object]) -> float | None:
    """The start skew of a wave (s): the spread of its processes' release times.

    ``barriers`` are the ``timings.barrier`` dicts of its results. Each release
    time is the process's own clock, so across nodes the skew includes the
    nodes' clock offsets (NTP keeps them in the milliseconds). None with fewer
    than two released processes.
    """
    times: list[float] = [
        b["released"] for b in barriers if isinstance(b, dict) and _num(b.get("released"))
    ]
    if len(times) < 2:
        return None
    return max(times) - min(times)


def wave_key(rec: Mapping[str, Any]) -> tuple[str, Any]:
    """What puts a result in a wave: the id of the start barrier it met
    (``timings.barrier.wave``, unique to one session's launch of one wave), else its
    run index. A ``--resume`` that relaunches part of a wave, or two sessions writing
    to one results folder, then never mixes processes that did not run together."""
    barrier = (rec.get("timings") or {}).get("barrier")
    if isinstance(barrier, dict) and isinstance(barrier.get("wave"), str):
        return ("wave", barrier["wave"])
    run = rec.get("run")
    return ("run", run if isinstance(run, int) else 0)


def summarize_waves(
    records: Sequence[Mapping[str, Any]],
    min_overlap: float = MIN_OVERLAP,
    steady: Sequence[Steady | None] | None = None,
) -> dict[str, Any]:
    """The summary fields of a test's concurrent waves, or ``{}`` when it has none.

    ``records`` are the test's successful results that have a steady-state
    rate. A wave is the results that share a :func:`wave_key` when there are two or
    more of them (a per-GPU test's children, a multi-process test's
    processes); tests of one process per run have none.

    Returns ``{"effective": stats of the per-result effective throughputs,
    "pergpu_effective": {device: stats}, "adjusted": stats of the per-wave
    adjusted throughputs (:func:`milarun.measure.stats.describe`, items/s),
    "overlap": the smallest overlap of a wave (fraction), "sync": {"waves": k,
    "synchronized": results that met a start barrier, "skew_s": the largest
    start skew of a wave (s) or None}}``. A wave without a common interval adds
    nothing to ``effective`` and ``adjusted`` (its overlap is 0). ``steady``: the
    records' :func:`milarun.measure.stats.steady_state`, in their order, when the
    caller has them; else they are computed.
    """
    grouped: dict[tuple[str, Any], list[tuple[Mapping[str, Any], Steady | None]]] = {}
    steadies: Sequence[Steady | None] = [None] * len(records) if steady is None else steady
    for rec, known in zip(records, steadies):
        grouped.setdefault(wave_key(rec), []).append((rec, known))
    waves = {key: recs for key, recs in grouped.items() if len(recs) > 1}
    if not waves:
        return {}
    effective: list[float] = []
    pergpu: dict[str, list[float]] = {}
    adjusted: list[float] = []
    overlaps: list[float] = []
    skews: list[float] = []
    synced = 0
    for key in sorted(waves, key=repr):
        recs = [rec for rec, _ in waves[key]]
        members: list[dict[str, Any]] = []
        seen: set[str] = set()
        for rec, known in waves[key]:
            label = str(rec.get("device", ""))
            while label in seen:  # the same device twice in a run: keep both apart
                label += "'"
            seen.add(label)
            members.append(
                {
                    "label": label,
                    "device": str(rec.get("device", "")),
                    "anchor": anchor(rec),
                    "samples": rec["timings"]["train"]["samples"],
                    "steady": known,
                }
            )
        w: dict[str, Any]
        try:
            w = wave(members, min_overlap)
        except ValueError:
            w = {"overlap": 0.0, "effective": {}, "adjusted": None}
        overlaps.append(w["overlap"])
        for m in members:
            value = w["effective"].get(m["label"])
            if value is not None:
                effective.append(value)
                pergpu.setdefault(m["device"], []).append(value)
        if w["adjusted"] is not None:
            adjusted.append(w["adjusted"])
        barriers = [(rec.get("timings") or {}).get("barrier") for rec in recs]
        synced += sum(1 for b in barriers if isinstance(b, dict) and _num(b.get("released")))
        skew = release_skew(barriers)
        if skew is not None:
            skews.append(skew)
    return {
        "effective": stats.describe(effective),
        "pergpu_effective": {d: stats.describe(v) for d, v in pergpu.items()},
        "adjusted": stats.describe(adjusted),
        "overlap": min(overlaps),
        "sync": {
            "waves": len(waves),
            "synchronized": synced,
            "skew_s": max(skews) if skews else None,
        },
    }
