"""GPU health counters, read before and after every launch, and what changed. No torch.

The launcher (:mod:`milarun.launcher.child`) takes a :func:`snapshot` of a launch's GPUs
before it starts the child and another once the child ended (PASS or FAIL alike), and
:func:`diff` turns the two into *findings*: a counter that went up during the launch is a
finding with a severity (``"error"``: the GPU fails; ``"warning"``: shown), a counter that
went down is a ``counter went backwards`` warning (a driver reload or reset, another GPU
behind the same name), never a crash. :func:`launch_record` is what the record's
``health`` field holds (record format 12, :mod:`milarun.formats.record`), and
:func:`milarun.measure.flags.health_flags` makes the findings flags of the summary.

Everything is read through NVML (``nvidia-ml-py``, the NVML API reference:
https://docs.nvidia.com/deploy/nvml-api/), with an injectable module (:data:`NVML`; tests
set a fake). A counter that cannot be read (``NVMLError_NotSupported`` on this board,
``NoPermission``, ECC off, a pynvml without the call) is None, with the reason in
``unknown``: unknown, never healthy. The counters, per GPU (units: counts unless said):

``ecc_{uncorrected,corrected}_{volatile,aggregate}``
    ``nvmlDeviceGetTotalEccErrors`` (volatile: since the driver loaded; aggregate: the
    board's lifetime); an increase of an uncorrected one is an error, of a corrected one
    a warning.
``retired_pages_sbe``, ``retired_pages_dbe``, ``retired_pages_pending``
    ``nvmlDeviceGetRetiredPages`` (pages retired for multiple single-bit / double-bit
    errors: the number of pages) and ``nvmlDeviceGetRetiredPagesPendingStatus`` (0/1),
    GPUs before Ampere: error.
``remapped_rows_corrected``, ``remapped_rows_uncorrected``, ``remap_pending``, ``remap_failure``
    ``nvmlDeviceGetRemappedRows`` (rows; pending and failure 0/1), Ampere and later:
    corrected is a warning, the others errors.
``xid``
    XID critical-error events during the launch: an event set per GPU
    (``nvmlEventSetCreate``, ``nvmlDeviceRegisterEvents`` with
    ``nvmlEventTypeXidCriticalError``) made before the launch and drained after it
    (``nvmlEventSetWait_v2``, 0 ms); the codes go in ``xid_codes``: error.
``pcie_replays``
    ``nvmlDeviceGetPcieReplayCounter``: warning.
``pcie_width``, ``pcie_width_max``
    ``nvmlDeviceGetCurrPcieLinkWidth``, ``nvmlDeviceGetMaxPcieLinkWidth`` (lanes): a link
    narrower than its maximum after the launch is a warning.
``pcie_gen``, ``pcie_gen_max``
    ``nvmlDeviceGetCurrPcieLinkGeneration``, ``nvmlDeviceGetMaxPcieLinkGeneration``: an
    idle GPU lowers its link generation to save power, so these are recorded only.
``nvlink<L>_{replay,recovery,crc_flit,crc_data,ecc_data}``
    ``nvmlDeviceGetNvLinkErrorCounter`` of each link ``L`` that
    ``nvmlDeviceGetNvLinkState`` says is up: warning.
``throttle_{power,thermal,board_limit,reliability}_ns``
    ``nvmlDeviceGetViolationStatus``'s violation time (ns): thermal and reliability are
    warnings; power and board limit are recorded only.

The power and board-limit throttle times are recorded (a GPU at its power limit under a
benchmark is expected), not flagged. XID events are asynchronous: an event set registered
before the launch keeps what the driver sends until it is drained after; where registering
fails (vGPU guests, an old driver) ``xid`` is unknown. The kernel log is not read.

None of this has run on a real GPU: it is written against the NVML API reference and tested
with a fake NVML only. AMD (amdsmi) and Intel GPUs are not read: their launches record
``{"available": false, "reason": ...}``. A launch on other nodes (ssh, srun) is not read
either: the launcher reads its own node's GPUs only.
"""

from __future__ import annotations

import time
from typing import Any

#: The NVML module to read through; None: ``pynvml`` (``nvidia-ml-py``), imported and
#: initialised on first use. Tests set a fake here.
NVML = None

ERROR = "error"
WARNING = "warning"

#: Counters whose increase during a launch is a finding, with its severity and words.
COUNTERS = {
    "ecc_uncorrected_volatile": (ERROR, "uncorrected ECC errors (volatile)"),
    "ecc_uncorrected_aggregate": (ERROR, "uncorrected ECC errors (aggregate)"),
    "ecc_corrected_volatile": (WARNING, "corrected ECC errors (volatile)"),
    "ecc_corrected_aggregate": (WARNING, "corrected ECC errors (aggregate)"),
    "retired_pages_sbe": (ERROR, "pages retired for multiple single-bit errors"),
    "retired_pages_dbe": (ERROR, "pages retired for double-bit errors"),
    "retired_pages_pending": (ERROR, "a page retirement pending (until a reset)"),
    "remapped_rows_corrected": (WARNING, "rows remapped for corrected errors"),
    "remapped_rows_uncorrected": (ERROR, "rows remapped for uncorrected errors"),
    "remap_pending": (ERROR, "a row remapping pending (until a reset)"),
    "remap_failure": (ERROR, "a row remapping failure"),
    "xid": (ERROR, "XID critical errors"),
    "pcie_replays": (WARNING, "PCIe replays"),
    "throttle_thermal_ns": (WARNING, "time throttled for temperature (ns)"),
    "throttle_reliability_ns": (WARNING, "time throttled for reliability (ns)"),
}
#: NVLink error counters (``NVML_NVLINK_ERROR_DL_*``): a counter key's suffix, its value.
NVLINK_COUNTERS = (
    ("replay", 0, "replays"),
    ("recovery", 1, "recoveries"),
    ("crc_flit", 2, "CRC flit errors"),
    ("crc_data", 3, "CRC data errors"),
    ("ecc_data", 4, "ECC data errors"),
)
#: Throttle policies (``NVML_PERF_POLICY_*``) whose violation time is read.
THROTTLE = (("power", 0), ("thermal", 1), ("board_limit", 3), ("reliability", 5))
#: The finding of a counter that went down.
BACKWARDS = "counter went backwards"
#: Seconds a drain of one GPU's XID events may take at most (a flood is counted, not read).
XID_DRAIN_S = 1.0


def nvml():
    """The NVML module (:data:`NVML`, else ``pynvml`` imported and ``nvmlInit()``-ed once).

    Raises:
        ImportError: nvidia-ml-py is not installed.
        Exception: ``nvmlInit`` failed (``NVMLError_LibraryNotFound``, ``DriverNotLoaded``).
    """
    global NVML
    if NVML is None:
        import pynvml  # lazy: absent on CPU-only hosts

        pynvml.nvmlInit()
        NVML = pynvml
    return NVML


def _why(exc):
    return " ".join(f"{exc.__class__.__name__}: {exc}".split())[:200]


class _Reader:
    """One GPU's counters: ``counters`` (name -> int or None) and ``unknown`` (name -> why)."""

    def __init__(self, nv, handle):
        self.nv, self.handle = nv, handle
        self.counters, self.unknown = {}, {}

    def call(self, name, *args):
        """``(value, None)`` or ``(None, why)``; never raises."""
        fn = getattr(self.nv, name, None)
        if fn is None:
            return None, f"this pynvml has no {name}"
        try:
            return fn(self.handle, *args), None
        except Exception as exc:  # NotSupported, NoPermission, GpuIsLost, ...
            return None, _why(exc)

    def put(self, key, value, why=None):
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, int):
            if why is None:
                why = f"unexpected value {value!r}"[:200]
            value = None
        self.counters[key] = value
        if value is None:
            self.unknown[key] = why or "unknown"

    def read(self, key, name, *args, convert=None):
        value, why = self.call(name, *args)
        if why is None and convert is not None:
            try:
                value = convert(value)
            except Exception as exc:
                value, why = None, _why(exc)
        self.put(key, value, why)


def read_gpu(nv, handle):
    """The counters of one GPU (module docstring): ``{"counters": {name: int or None},
    "unknown": {name: why}}``. Each counter is read on its own; never raises."""
    r = _Reader(nv, handle)
    corrected = getattr(nv, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
    uncorrected = getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    volatile = getattr(nv, "NVML_VOLATILE_ECC", 0)
    aggregate = getattr(nv, "NVML_AGGREGATE_ECC", 1)
    for kind, etype in (("uncorrected", uncorrected), ("corrected", corrected)):
        for span, ctype in (("volatile", volatile), ("aggregate", aggregate)):
            r.read(f"ecc_{kind}_{span}", "nvmlDeviceGetTotalEccErrors", etype, ctype)
    sbe = getattr(nv, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0)
    dbe = getattr(nv, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1)
    r.read("retired_pages_sbe", "nvmlDeviceGetRetiredPages", sbe, convert=len)
    r.read("retired_pages_dbe", "nvmlDeviceGetRetiredPages", dbe, convert=len)
    r.read("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", convert=int)
    rows, why = r.call("nvmlDeviceGetRemappedRows")
    names = (
        "remapped_rows_corrected",
        "remapped_rows_uncorrected",
        "remap_pending",
        "remap_failure",
    )
    if why is None and not (isinstance(rows, (list, tuple)) and len(rows) == 4):
        why = f"unexpected value {rows!r}"[:200]
    for i, key in enumerate(names):
        r.put(key, None if why else rows[i], why)
    r.read("pcie_replays", "nvmlDeviceGetPcieReplayCounter")
    r.read("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration")
    r.read("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration")
    r.read("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth")
    r.read("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth")
    for policy, value in THROTTLE:
        r.read(
            f"throttle_{policy}_ns",
            "nvmlDeviceGetViolationStatus",
            getattr(nv, f"NVML_PERF_POLICY_{policy.upper()}", value),
            convert=lambda v: int(v.violationTime),
        )
    _read_nvlink(r, nv)
    return {"counters": r.counters, "unknown": r.unknown}


def _read_nvlink(r, nv):
    """The error counters of each active NVLink link (``nvlink<L>_<counter>``); ``nvlink``
    in ``unknown`` when no link state can be read (a GPU without NVLink)."""
    active, first_why = [], None
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        state, why = r.call("nvmlDeviceGetNvLinkState", link)
        if why is not None:
            if link == 0:
                first_why = why
            break  # past the GPU's last link (InvalidArgument), or none (NotSupported)
        if state == getattr(nv, "NVML_FEATURE_ENABLED", 1):
            active.append(link)
    if first_why is not None:
        r.unknown["nvlink"] = first_why
    for link in active:
        for suffix, counter, _ in NVLINK_COUNTERS:
            r.read(f"nvlink{link}_{suffix}", "nvmlDeviceGetNvLinkErrorCounter", link, counter)


def handle_of(nv, target):
    """``(index, uuid, handle)`` of the whole GPU a visibility value names: ``"GPU-…"``
    (``nvmlDeviceGetHandleByUUID``), ``"MIG-…"`` (its GPU:
    ``nvmlDeviceGetDeviceHandleFromMigDeviceHandle``) or an index (``"3"``,
    ``nvmlDeviceGetHandleByIndex``).

    Raises:
        Exception: NVML's (``NVMLError_NotFound``, ``InvalidArgument``…).
    """
    target = str(target).strip()
    if target.isdigit():
        handle = nv.nvmlDeviceGetHandleByIndex(int(target))
    else:
        handle = nv.nvmlDeviceGetHandleByUUID(target)
        if target.startswith("MIG-"):
            handle = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    index = uuid = None
    try:
        index = int(nv.nvmlDeviceGetIndex(handle))
    except Exception:
        index = int(target) if target.isdigit() else None
    try:
        uuid = nv.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    except Exception:
        uuid = target if target.startswith("GPU-") else None
    return index, uuid, handle


def snapshot(targets, nv=None):
    """The health counters of the GPUs ``targets`` (visibility values, :func:`handle_of`).

    Returns a plain JSON-able dict: ``{"available": bool, "reason": str or None, "time":
    Unix time (s), "gpus": [{"target", "index", "uuid", "counters", "unknown"}]}``;
    ``available`` False (with the reason) when NVML cannot be loaded; a GPU that cannot
    be opened has no counters and its reason in ``unknown["gpu"]``. Never raises.
    """
    out: dict[str, Any] = {"available": False, "reason": None, "time": time.time(), "gpus": []}
    try:
        nv = nv if nv is not None else nvml()
    except Exception as exc:
        out["reason"] = f"NVML cannot be read ({_why(exc)})"
        return out
    out["available"] = True
    seen = set()
    for target in targets:
        try:
            index, uuid, handle = handle_of(nv, target)
        except Exception as exc:
            gpu = {"target": str(target), "index": None, "uuid": None}
            out["gpus"].append({**gpu, "counters": {}, "unknown": {"gpu": _why(exc)}})
            continue
        if (index, uuid) in seen:  # MIG instances of one GPU: read it once
            continue
        seen.add((index, uuid))
        gpu = {"target": str(target), "index": index, "uuid": uuid, **read_gpu(nv, handle)}
        out["gpus"].append(gpu)
    return out


# ------------------------------------------------------------------------- XID events


class XidWatch:
    """XID critical-error events of some GPUs from now until :meth:`drain`: one NVML
    event set per GPU (``nvmlEventSetCreate``, ``nvmlDeviceRegisterEvents`` with
    ``nvmlEventTypeXidCriticalError``), so each event's GPU is known. Never raises."""

    def __init__(self, nv, targets):
        self.nv = nv
        self.sets: dict = {}  # key (index, uuid) -> event set, or the reason it has none
        kind = getattr(nv, "nvmlEventTypeXidCriticalError", 0x8)
        for target in targets:
            try:
                index, uuid, handle = handle_of(nv, target)
            except Exception:
                continue  # the snapshot says why
            if (index, uuid) in self.sets:  # MIG instances of one GPU: watched once
                continue
            try:
                event_set = nv.nvmlEventSetCreate()
            except Exception as exc:
                self.sets[(index, uuid)] = _why(exc)
                continue
            try:
                nv.nvmlDeviceRegisterEvents(handle, kind, event_set)
                self.sets[(index, uuid)] = event_set
            except Exception as exc:
                self.sets[(index, uuid)] = _why(exc)
                self._free(event_set)

    def _free(self, event_set):
        try:
            self.nv.nvmlEventSetFree(event_set)
        except Exception:
            pass

    def drain(self):
        """``{(index, uuid): ([XID codes], None) or (None, why)}`` since the watch began
        (``nvmlEventSetWait_v2`` with a 0 ms timeout until ``NVMLError_Timeout``); the
        event sets are freed."""
        wait: Any = getattr(self.nv, "nvmlEventSetWait_v2", None) or getattr(
            self.nv, "nvmlEventSetWait", None
        )
        out: dict = {}
        for key, event_set in self.sets.items():
            if isinstance(event_set, str):
                out[key] = (None, event_set)
                continue
            codes, why = [], None
            if wait is None:
                why = "this pynvml has no nvmlEventSetWait"
            deadline = time.monotonic() + XID_DRAIN_S
            while why is None and time.monotonic() < deadline:
                try:
                    data = wait(event_set, 0)
                except Exception as exc:
                    if "Timeout" not in exc.__class__.__name__ and "Timeout" not in str(exc):
                        why = _why(exc)
                    break
                codes.append(int(getattr(data, "eventData", 0)))
            self._free(event_set)
            out[key] = (codes, None) if why is None else (None, why)
        self.sets = {}
        return out


# ------------------------------------------------------------------------- the diff


def _key(gpu):
    return (gpu.get("index"), gpu.get("uuid"))


def _finding(gpu, counter, severity, message, before, after):
    return {
        "gpu": gpu.get("index"),
        "uuid": gpu.get("uuid"),
        "counter": counter,
        "severity": severity,
        "before": before,
        "after": after,
        "message": message,
    }


def _words(counter):
    if counter in COUNTERS:
        return COUNTERS[counter][1]
    if counter.startswith("nvlink"):
        link, _, suffix = counter[len("nvlink") :].partition("_")
        words = {s: w for s, _, w in NVLINK_COUNTERS}.get(suffix, suffix)
        return f"NVLink {link} {words}"
    return counter


def _severity(counter):
    if counter in COUNTERS:
        return COUNTERS[counter][0]
    if counter.startswith("nvlink"):
        return WARNING
    return None  # recorded, not a finding (PCIe generation, power throttle time)


def diff(before, after):
    """The findings between two :func:`snapshot` values of the same GPUs (GPUs matched by
    NVML index and UUID), in GPU then counter order: each ``{"gpu", "uuid", "counter",
    "severity" ("error" | "warning"), "before", "after", "message"}``.

    A counter of :data:`COUNTERS` (or an NVLink one) that went up is a finding of its
    severity; any counter that went down is a :data:`BACKWARDS` warning; a PCIe link
    narrower than its maximum after the launch is a warning. A counter unknown on either
    side gives nothing (its reason stays in the snapshot). Never raises.
    """
    out: list = []
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return out
    old = {_key(g): g for g in before.get("gpus") or [] if isinstance(g, dict)}
    for gpu in after.get("gpus") or []:
        if not isinstance(gpu, dict):
            continue
        now = gpu.get("counters") or {}
        then = (old.get(_key(gpu)) or {}).get("counters") or {}
        for counter, value in now.items():
            was = then.get(counter)
            if not isinstance(value, int) or not isinstance(was, int) or value == was:
                continue
            if value < was:
                out.append(
                    _finding(
                        gpu,
                        counter,
                        WARNING,
                        f"{_words(counter)}: {BACKWARDS} during the launch ({was} -> "
                        f"{value}): the driver was reloaded or the GPU reset, or this is "
                        "another GPU",
                        was,
                        value,
                    )
                )
                continue
            severity = _severity(counter)
            if severity is not None:
                out.append(
                    _finding(
                        gpu,
                        counter,
                        severity,
                        f"{_words(counter)} went up by {value - was} during the launch "
                        f"({was} -> {value})",
                        was,
                        value,
                    )
                )
        width, widest = now.get("pcie_width"), now.get("pcie_width_max")
        if isinstance(width, int) and isinstance(widest, int) and 0 < width < widest:
            out.append(
                _finding(
                    gpu,
                    "pcie_width",
                    WARNING,
                    f"PCIe link at x{width} after the launch, below its maximum x{widest}",
                    then.get("pcie_width"),
                    width,
                )
            )
    return out


# ------------------------------------------------------------------ the launch's record


class LaunchHealth:
    """The health counters around one launch: :meth:`begin` before it starts,
    :meth:`end` once it ended (the first call reads; later ones give the same)."""

    def __init__(self, targets, reason=None):
        self.targets = list(targets)
        self.reason = reason
        self.before = None
        self.nv = None
        self.watch = None
        self.result = None
        self.done = False

    @classmethod
    def for_launch(cls, launch):
        """The watch of ``launch`` (a ``plan.Launch``): its GPUs are the
        ``CUDA_VISIBLE_DEVICES`` values of its ``env`` when ``MILARUN_BACKEND`` is
        ``nvidia``; None for CPU slots (nothing recorded); one that records why not
        for other backends and for launches on other nodes."""
        env = getattr(launch, "env", None) or {}
        backend = env.get("MILARUN_BACKEND")
        if backend in (None, "cpu"):
            return None
        if backend != "nvidia":
            return cls([], f"health counters are read through NVML only ({backend}: not wired)")
        cluster = getattr(launch, "cluster", None)
        if cluster is not None and getattr(cluster, "kind", "local") != "local":
            return cls([], "a launch on other nodes: the launcher reads its own node's GPUs only")
        targets = [t for t in (env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if t.strip()]
        if not targets:
            return cls([], "no GPU given to the launch")
        return cls(targets)

    def begin(self):
        """Read the counters before the launch and start watching XID events. Never raises."""
        if self.reason is not None:
            return
        try:
            nv = nvml()
        except Exception as exc:
            self.reason = f"NVML cannot be read ({_why(exc)})"
            return
        self.nv = nv
        self.watch = XidWatch(nv, self.targets)
        self.before = snapshot(self.targets, nv)

    def end(self):
        """The record's ``health`` field (:func:`launch_record`), read once. Never raises."""
        if not self.done:
            self.done = True
            try:
                self.result = self._end()
            except Exception as exc:  # never lose a record to a health reading
                self.result = {"available": False, "reason": f"health reading failed: {_why(exc)}"}
        return self.result

    def _end(self):
        if self.reason is not None or self.before is None:
            return {"available": False, "reason": self.reason or "not read"}
        xids = self.watch.drain() if self.watch is not None else {}
        after = snapshot(self.targets, self.nv)
        for gpu in after.get("gpus") or []:
            if "counters" not in gpu or "gpu" in gpu.get("unknown", {}):
                continue
            codes, why = xids.get(_key(gpu), (None, "no XID event set"))
            gpu["counters"]["xid"] = None if codes is None else len(codes)
            if codes is None:
                gpu["unknown"]["xid"] = why
            elif codes:
                gpu["xid_codes"] = codes[:64]
        for gpu in self.before.get("gpus") or []:
            if "counters" in gpu and "gpu" not in gpu.get("unknown", {}):
                gpu["counters"]["xid"] = 0
        return launch_record(self.before, after)


def launch_record(before, after):
    """The record's ``health`` field from the snapshots around a launch: ``{"available",
    "reason", "source": "nvml", "start", "end" (Unix times of the two readings), "gpus":
    [{"index", "uuid", "counters" (after the launch), "deltas" (after - before, the
    counters that changed), "unknown" (counter -> why), "xid_codes" (when some)}],
    "findings": :func:`diff`}``."""
    if not after.get("available"):
        return {"available": False, "reason": after.get("reason") or "not read"}
    old = {_key(g): g for g in before.get("gpus") or []}
    gpus = []
    for gpu in after.get("gpus") or []:
        then = (old.get(_key(gpu)) or {}).get("counters") or {}
        now = gpu.get("counters") or {}
        deltas = {
            k: v - then[k]
            for k, v in now.items()
            if isinstance(v, int) and isinstance(then.get(k), int) and v != then[k]
        }
        entry = {
            "index": gpu.get("index"),
            "uuid": gpu.get("uuid"),
            "counters": now,
            "deltas": deltas,
            "unknown": gpu.get("unknown") or {},
        }
        if gpu.get("xid_codes"):
            entry["xid_codes"] = gpu["xid_codes"]
        gpus.append(entry)
    return {
        "available": True,
        "reason": None,
        "source": "nvml",
        "start": before.get("time"),
        "end": after.get("time"),
        "gpus": gpus,
        "findings": diff(before, after),
    }
