"""The numbers of the acceptance tests (docs/acceptance.md): bus bandwidth, expected peaks, memory
traffic, throttling. Pure functions, no I/O: the workloads (``milarun.models.collectives``,
``bandwidth``, ``burn``) call them in the child, and the tests call them on hand-made values.

Bus bandwidth (NVIDIA nccl-tests, ``doc/PERFORMANCE.md``, "Bus bandwidth"): a collective
over ``n`` ranks on a message of ``S`` bytes that takes ``t`` seconds has the *algorithm
bandwidth* ``algbw = S / t`` and the *bus bandwidth* ``busbw = algbw × factor``, where the
factor makes the figure comparable with the hardware's link speed whatever ``n``:

===============  ================  ==========================================
collective       factor            ``S`` is (as in nccl-tests)
===============  ================  ==========================================
all-reduce       ``2(n-1)/n``      the buffer each rank reduces
all-gather       ``(n-1)/n``       the gathered output (``n`` × each rank's part)
reduce-scatter   ``(n-1)/n``       the input (``n`` × each rank's result)
all-to-all       ``(n-1)/n``       each rank's whole send buffer
broadcast        ``1``             the buffer
===============  ================  ==========================================

Memory bandwidth (STREAM, McCalpin, https://www.cs.virginia.edu/stream/ref.html, "Counting
bytes and FLOPS"; BabelStream, Deakin et al. 2016, the same kernels): per element,
copy ``c = a`` and scale ``b = q·c`` move 2 words, add ``c = a + b`` and triad
``a = b + q·c`` move 3 (:data:`STREAM_WORDS`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: nccl-tests' bus-bandwidth factor of each collective, as a function of the ranks.
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}
#: The collectives, in the order a run measures them.
COLLECTIVES = tuple(BUS_FACTORS)

#: Words read or written per element by each STREAM kernel (STREAM's table of bytes/iteration).
STREAM_WORDS = {"copy": 2, "scale": 2, "add": 3, "triad": 3}

#: Smallest message (bytes) of a collective sweep, as nccl-tests' ``-b 8``.
MIN_MESSAGE = 8
#: Largest message accepted (bytes): 64 GiB.
MAX_MESSAGE = 64 * 2**30

#: Unidirectional GB/s of one NVLink link by NVML's ``nvmlNvlinkVersion_t``
#: (pynvml's ``NVML_NVLINK_VERSION_*``: 1 = 1.0, 2 = 2.0, 3 = 2.2, 4 = 3.0, 5 = 3.1, 6 = 4.0,
#: 7 = 5.0). NVLink 1.0: 20 GB/s per direction; 2.x, 3.x (A100: 12 links, 300 GB/s) and
#: 4.0 (H100: 18 links, 450 GB/s): 25; 5.0 (B200: 18 links, 900 GB/s): 50 (NVIDIA's
#: NVLink pages and the A100, H100 and B200 datasheets, per direction).
NVLINK_GBPS_PER_LINK = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 25.0, 6: 25.0, 7: 50.0}

#: NVML clock-event (throttle) reason bits that mean power or thermal capping
#: (``nvmlClocksEventReason*``: SwPowerCap 0x4, HwSlowdown 0x8, SwThermalSlowdown 0x20,
#: HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80).
CAPPING_REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
#: The other bits, named for the record (idle, application clocks, sync boost, display).
OTHER_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x10: "sync_boost",
    0x100: "display_clocks",
}


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor of collective ``op`` over ``ranks`` ranks.

    Raises:
        ValueError: an unknown collective or fewer than one rank.
    """
    if op not in BUS_FACTORS:
        raise ValueError(f"unknown collective {op!r} (known: {', '.join(COLLECTIVES)})")
    if int(ranks) < 1:
        raise ValueError(f"ranks must be >= 1, not {ranks}")
    return BUS_FACTORS[op](int(ranks))


def bandwidths(
    op: str, nbytes: float, seconds: float | None, ranks: int
) -> tuple[float, float] | tuple[None, None]:
    """``(algbw, busbw)`` in GB/s (1e9 bytes/s) of one ``op`` on ``nbytes`` bytes that took
    ``seconds`` over ``ranks`` ranks (module docstring). None, None for a time <= 0."""
    if not seconds or seconds <= 0:
        return None, None
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * bus_factor(op, ranks)


def message_sizes(max_bytes: int, min_bytes: int = MIN_MESSAGE) -> list[int]:
    """The sweep's message sizes (bytes): ``min_bytes``, doubling, up to ``max_bytes``
    (included when it is on the way, else the last size below it).

    Raises:
        ValueError: a size out of [:data:`MIN_MESSAGE`, :data:`MAX_MESSAGE`], or max < min.
    """
    for name, value in (("--min-size", min_bytes), ("--max-size", max_bytes)):
        if not isinstance(value, int) or not MIN_MESSAGE <= value <= MAX_MESSAGE:
            raise ValueError(
                f"{name} must be between {MIN_MESSAGE} B and {MAX_MESSAGE} B "
                f"(64 GiB), not {value!r}"
            )
    if max_bytes < min_bytes:
        raise ValueError(f"--max-size ({max_bytes} B) is below --min-size ({min_bytes} B)")
    sizes: list[int] = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    return sizes


def elements_for(op: str, nbytes: int, ranks: int, itemsize: int = 4) -> tuple[int, int]:
    """``(elements, bytes)`` a message of ``nbytes`` holds for ``op`` over ``ranks``: the
    elements of the buffer ``S`` counts, rounded down to a multiple of ``ranks`` for the
    collectives that split it (all-gather, reduce-scatter, all-to-all), at least one per
    rank, as nccl-tests rounds its counts; ``bytes`` is what was really moved."""
    count = max(1, nbytes // itemsize)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count = max(ranks, count - count % ranks)
    return count, count * itemsize


def stream_bytes(kernel: str, elements: int, itemsize: int) -> int:
    """Bytes one STREAM ``kernel`` moves over ``elements`` elements of ``itemsize`` bytes."""
    return STREAM_WORDS[kernel] * elements * itemsize


def nvlink_peak_gbps(version: int | None, links: int | None) -> float | None:
    """Unidirectional NVLink GB/s of a GPU: ``links`` × the per-link rate of NVML's
    ``version`` (:data:`NVLINK_GBPS_PER_LINK`); None when either is unknown or no link is up."""
    per = NVLINK_GBPS_PER_LINK.get(version) if version is not None else None
    if per is None or not links:
        return None
    return per * links


def expected_busbw_gbps(
    nvlink_gbps: float | None = None,
    ib_gbits: Iterable[float | None] = (),
    gpus_per_node: int = 1,
    nodes: int = 1,
) -> tuple[float, str] | tuple[None, None]:
    """The bus bandwidth (GB/s) a collective can reach at best, and what bounds it.

    Inside one node: the GPU's unidirectional NVLink bandwidth (nccl-tests' busbw is
    comparable with it). Across nodes: the node's active InfiniBand/RoCE ports (Gb/s,
    summed, / 8 to GB/s) shared by its GPUs, or NVLink if lower. Returns
    ``(gbps, "nvlink"|"network")``, or ``(None, None)`` when nothing is known.
    """
    network: float | None = None
    rates = [r for r in ib_gbits if r]
    if rates:
        network = sum(rates) / 8.0 / max(1, int(gpus_per_node))
    if nodes > 1 and network is not None:
        if nvlink_gbps is not None and nvlink_gbps < network:
            return nvlink_gbps, "nvlink"
        return network, "network"
    if nvlink_gbps is not None:
        return nvlink_gbps, "nvlink"
    return None, None


def reason_names(mask: int | None) -> list[str]:
    """The names of the NVML clock-event bits set in ``mask`` (an int), capping ones first."""
    if mask is None:
        return []
    mask = int(mask)
    names = [n for bit, n in CAPPING_REASONS.items() if mask & bit]
    return names + [n for bit, n in OTHER_REASONS.items() if mask & bit]


def throttle_metrics(
    readings: Iterable[Mapping[str, Any]],
    start_fraction: float = 0.1,
    drop_fraction: float = 0.9,
    sustained: float = 0.5,
) -> dict[str, Any]:
    """The burn-in's throttle figures from one GPU's clock readings.

    Args:
        readings: ``[{"t": s, "sm_clock_mhz": MHz or None, "reasons": NVML bit mask or
            None}]`` in time order (:meth:`milarun.host.accel.base.Backend.clocks`).
        start_fraction: the share of the run (by time) before the steady state; the
            start clock is the highest clock read in it.
        drop_fraction: a clock below this fraction of the start clock counts as dropped.
        sustained: ``clock_drop`` is flagged when at least this share of the steady
            state's time runs below ``drop_fraction`` × the start clock.

    Returns:
        ``{"throttled_fraction": share of the steady state's time with a power or thermal
        capping reason (:data:`CAPPING_REASONS`) or None without reasons,
        "throttled": bool or None, "throttle_reasons": names seen in the steady state,
        comma-separated ("" for none), "clock_start_mhz", "clock_steady_mhz" (mean),
        "clock_low_fraction": share of the steady state's time below the drop threshold,
        "clock_drop": bool or None}``. Each reading holds until the next one (the last
        one holds for the mean interval).
    """
    rows = sorted((r for r in readings if r.get("t") is not None), key=lambda r: r["t"])
    out: dict[str, Any] = {
        "throttled_fraction": None,
        "throttled": None,
        "throttle_reasons": "",
        "clock_start_mhz": None,
        "clock_steady_mhz": None,
        "clock_low_fraction": None,
        "clock_drop": None,
    }
    if len(rows) < 2:
        return out
    t0, t1 = rows[0]["t"], rows[-1]["t"]
    step = (t1 - t0) / (len(rows) - 1)
    spans = [
        (r, (rows[i + 1]["t"] if i + 1 < len(rows) else t1 + step) - r["t"])
        for i, r in enumerate(rows)
    ]
    cut = t0 + start_fraction * (t1 + step - t0)
    read = [r.get("sm_clock_mhz") for r, _ in spans if r["t"] < cut]
    start = [c for c in read if c is not None]
    steady = [(r, dt) for r, dt in spans if r["t"] >= cut]
    reasons = [(mask, dt) for r, dt in steady if (mask := r.get("reasons")) is not None]
    if reasons:
        total = sum(dt for _, dt in reasons)
        capped = sum(dt for mask, dt in reasons if int(mask) & sum(CAPPING_REASONS))
        seen = 0
        for mask, _ in reasons:
            seen |= int(mask)
        out["throttled_fraction"] = capped / total if total > 0 else 0.0
        out["throttled"] = capped > 0
        out["throttle_reasons"] = ",".join(reason_names(seen))
    clocks = [(r["sm_clock_mhz"], dt) for r, dt in steady if r.get("sm_clock_mhz") is not None]
    if start and clocks:
        ref = max(start)
        total = sum(dt for _, dt in clocks)
        low = sum(dt for c, dt in clocks if c < drop_fraction * ref)
        out["clock_start_mhz"] = float(ref)
        out["clock_steady_mhz"] = sum(c * dt for c, dt in clocks) / total if total else None
        out["clock_low_fraction"] = low / total if total > 0 else 0.0
        out["clock_drop"] = total > 0 and low / total >= sustained
    return out


def first_bad(errors: Iterable[float], tolerance: float) -> tuple[int, float] | None:
    """``(index, error)`` of the first error above ``tolerance`` (or not finite), else None."""
    for i, e in enumerate(errors):
        if not math.isfinite(e) or e > tolerance:
            return i, e
    return None


def numa_pages(numa_maps: str | None, address: int) -> dict[int, int]:
    """``{node: pages}`` of the mapping holding ``address`` in ``/proc/self/numa_maps``'s
    text (lines ``"7f12a0000000 default anon=512 dirty=512 N0=256 N1=256 kernelpagesize_kB=4"``:
    the start address of each mapping, in hex): the mapping with the highest start at or
    below ``address``. ``{}`` when none holds it or it has no ``N<k>=`` counts."""
    best: list[str] | None = None
    best_start = -1
    for line in (numa_maps or "").splitlines():
        parts = line.split()
        if not parts:
            continue
        try:
            start = int(parts[0], 16)
        except ValueError:
            continue
        if best_start < start <= address:
            best, best_start = parts, start
    if best is None:
        return {}
    out: dict[int, int] = {}
    for field in best[1:]:
        m = re.match(r"^N(\d+)=(\d+)$", field)
        if m:
            out[int(m.group(1))] = int(m.group(2))
    return out


__all__ = [
    "BUS_FACTORS",
    "COLLECTIVES",
    "STREAM_WORDS",
    "NVLINK_GBPS_PER_LINK",
    "CAPPING_REASONS",
    "bus_factor",
    "bandwidths",
    "message_sizes",
    "elements_for",
    "stream_bytes",
    "nvlink_peak_gbps",
    "expected_busbw_gbps",
    "reason_names",
    "throttle_metrics",
    "first_bad",
    "numa_pages",
]
