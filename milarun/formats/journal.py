"""The per-launch journal: what a child measured, streamed as it goes.

A child appends one JSON line per event to ``<result stem>.journal.jsonl``
next to its result path (see :func:`milarun.formats.store.journal_path`),
flushed as written, so the samples survive a child that is killed, times
out or is OOM-killed. The parent folds them into the FAIL or ``interrupted``
record it writes; a child that writes its own record removes the journal.

Lines (``kind`` first; times as in the result record)::

    {"kind": "start", "pid": int, "start": Unix time}
    {"kind": "train", "sample_duration": s, "warmup": windows, "max_count": items,
                      "min_steady": s}
    {"kind": "sample", "start": s, "end": s, "count": items, "rate": items/s, "warmup": bool}
    {"kind": "monitor", "t": s, "device": int, ...}   (one GPU telemetry reading)
    {"kind": "host_load", "t": s, "dt": s, "busy": cores, "suite": cores,
                          "outside": cores, "steal": cores}   (milarun.bench.hostload)
    {"kind": "distributed", "world_size": int, "backend": str, ...}
                      (rank 0 of a torchrun job: the record's ``distributed``)

The journal is best-effort: a write that fails (full disk) turns it off and
never stops the measurement; the child's own record is the one that counts.
"""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path
from typing import IO, Any

from ..errors import MilarunError
from .jsonfile import StrPath, accepts, parse_json
from .outfile import open_append, open_regular

#: Bytes of journal read back at most (a week of 1 s windows is ~10 MB).
MAX_JOURNAL_BYTES = 64 * 2**20


class Journal:
    """Append-only JSON Lines writer; thread-safe (the monitor thread writes too).

    Args:
        path: the journal file (created, or appended to).

    Attributes:
        error: None, or the ``OSError`` that turned the journal off.
    """

    def __init__(self, path: StrPath) -> None:
        self.path = Path(path)
        self.error: OSError | None = None
        self._file: IO[str] | None
        self._lock = threading.Lock()
        try:
            # never through a symlink, nor into a FIFO or device (milarun.formats.outfile)
            self._file = open_append(self.path, binary=False)
        except OSError as exc:
            self._file = None
            self.error = exc

    def write(self, kind: str, **fields: Any) -> None:
        """Append one event ``{"kind": kind, **fields}``; non-finite numbers become null."""
        if self._file is None:
            return
        with self._lock:
            try:
                line = json.dumps(
                    {"kind": kind, **{k: _finite_or_none(v) for k, v in fields.items()}},
                    allow_nan=False,
                    default=str,
                )
                self._file.write(line + "\n")
                self._file.flush()
            except (OSError, ValueError) as exc:
                self.error = exc if isinstance(exc, OSError) else OSError(str(exc))
                self._close()

    def _close(self) -> None:
        try:
            if self._file is not None:
                self._file.close()
        except OSError:
            pass
        self._file = None

    def close(self, remove: bool = False) -> None:
        """Close the file; with ``remove``, delete it (its events are in the record)."""
        with self._lock:
            if self._file is not None:
                self._close()
        if remove:
            try:
                os.unlink(self.path)
            except OSError:
                pass


def _finite_or_none(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


#: The result schema's definition of each event that goes into a FAIL record, so a
#: journal line is kept only when the record holding it will pass the schema.
EVENT_SCHEMAS = {
    "sample": "result#/$defs/sample",
    "monitor": "result#/$defs/gpu_sample",
    "host_load": "result#/$defs/host_load/properties/samples/items",
    "distributed": "result#/$defs/distributed",
    "train": "result#/properties/timings/properties/train",
}
#: The ``train`` event's fields a FAIL record takes.
TRAIN_KEYS = ("sample_duration", "warmup", "max_count", "min_steady")
#: Most events of one kind kept (the result schema's ``maxItems`` of those lists).
MAX_EVENTS = 1000000
#: Largest ``count`` (items) of one sample believed: the sum of ``MAX_EVENTS`` of
#: them stays a finite integer (the record's ``timings.train.count``).
MAX_SAMPLE_COUNT = 2**53
_LISTS = {"sample": "samples", "monitor": "monitor", "host_load": "host_load"}


def read_journal(path: StrPath) -> dict[str, Any]:
    """Read a journal back, keeping only the events a FAIL record can hold.

    Each line is parsed strictly (:func:`milarun.formats.jsonfile.parse_json`: no NaN
    or Infinity, no out-of-range number) and its fields checked against the
    result schema's definition of that event (:data:`EVENT_SCHEMAS`: finite
    numbers, non-negative where the record wants them, the right types), so a
    bad sensor reading or a half-written line costs that line only, never the
    record.

    Returns:
        ``{"start": Unix time or None, "train": {...} or {}, "samples": [...],
        "monitor": [...], "host_load": [...], "distributed": {...} or None, "lines": n,
        "bad_lines": n}``; ``bad_lines`` counts the lines dropped (malformed, a
        truncated last line, invalid fields, unknown kinds, beyond
        :data:`MAX_EVENTS`). An absent or unreadable journal gives the empty
        result. Never raises.
    """
    out: dict[str, Any] = {
        "start": None,
        "train": {},
        "samples": [],
        "monitor": [],
        "host_load": [],
        "distributed": None,
        "lines": 0,
        "bad_lines": 0,
    }
    try:
        with os.fdopen(open_regular(path, os.O_RDONLY), "rb") as f:  # never a FIFO
            data = f.read(MAX_JOURNAL_BYTES)
    except OSError:
        return out
    for raw in data.splitlines():
        out["lines"] += 1
        try:
            event = parse_json(raw)
            kind = event.pop("kind")
        except (MilarunError, AttributeError, KeyError, TypeError):
            out["bad_lines"] += 1
            continue
        if kind == "train":
            event = {k: event[k] for k in TRAIN_KEYS if k in event}
        if kind == "start":
            ok = accepts(event.get("start"), "common#/$defs/nonneg")
        else:
            ok = kind in EVENT_SCHEMAS and accepts(event, EVENT_SCHEMAS[kind])
        if kind == "sample" and ok:
            ok = event["count"] <= MAX_SAMPLE_COUNT
        if kind in _LISTS and ok:
            ok = len(out[_LISTS[kind]]) < MAX_EVENTS
        if not ok:
            out["bad_lines"] += 1
        elif kind in _LISTS:
            out[_LISTS[kind]].append(event)
        elif kind == "start":
            out["start"] = event["start"]
        else:  # train, distributed: the last one counts
            out[kind] = event
    return out
