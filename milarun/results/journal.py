"""The per-launch journal: what a child measured, streamed as it goes.

A child appends one JSON line per event to ``<result stem>.journal.jsonl``
next to its result path (see :func:`milarun.results.store.journal_path`),
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

import json
import math
import os
import threading
from pathlib import Path

from ..outfile import open_append, open_regular

#: Bytes of journal read back at most (a week of 1 s windows is ~10 MB).
MAX_JOURNAL_BYTES = 64 * 2**20


class Journal:
    """Append-only JSON Lines writer; thread-safe (the monitor thread writes too).

    Args:
        path: the journal file (created, or appended to).

    Attributes:
        error: None, or the ``OSError`` that turned the journal off.
    """

    def __init__(self, path):
        self.path = Path(path)
        self.error = None
        self._lock = threading.Lock()
        try:
            # never through a symlink, nor into a FIFO or device (milarun.outfile)
            self._file = open_append(self.path, binary=False)
        except OSError as exc:
            self._file = None
            self.error = exc

    def write(self, kind, **fields):
        """Append one event ``{"kind": kind, **fields}``; non-finite numbers become null."""
        if self._file is None:
            return
        with self._lock:
            try:
                line = json.dumps({"kind": kind,
                                   **{k: _finite_or_none(v) for k, v in fields.items()}},
                                  allow_nan=False, default=str)
                self._file.write(line + "\n")
                self._file.flush()
            except (OSError, ValueError) as exc:
                self.error = exc if isinstance(exc, OSError) else OSError(str(exc))
                self._close()

    def _close(self):
        try:
            self._file.close()
        except OSError:
            pass
        self._file = None

    def close(self, remove=False):
        """Close the file; with ``remove``, delete it (its events are in the record)."""
        with self._lock:
            if self._file is not None:
                self._close()
        if remove:
            try:
                os.unlink(self.path)
            except OSError:
                pass


def _finite_or_none(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_journal(path):
    """Read a journal back.

    Returns:
        ``{"start": Unix time or None, "train": {...} or {}, "samples": [...],
        "monitor": [...], "host_load": [...], "distributed": {...} or None, "lines": n,
        "bad_lines": n}``; an absent or
        unreadable journal gives the empty result. A truncated last line (the
        child was killed mid-write) and malformed lines are counted, not raised.
    """
    out = {"start": None, "train": {}, "samples": [], "monitor": [], "host_load": [],
           "distributed": None,
           "lines": 0, "bad_lines": 0}
    try:
        with os.fdopen(open_regular(path, os.O_RDONLY), "rb") as f:  # never a FIFO
            data = f.read(MAX_JOURNAL_BYTES)
    except OSError:
        return out
    for raw in data.splitlines():
        out["lines"] += 1
        try:
            event = json.loads(raw.decode("utf-8"))
            kind = event.pop("kind")
        except (ValueError, UnicodeDecodeError, AttributeError, KeyError, TypeError):
            out["bad_lines"] += 1
            continue
        if kind == "sample" and _valid_sample(event):
            out["samples"].append(event)
        elif kind == "monitor":
            out["monitor"].append(event)
        elif kind == "host_load" and _valid_load(event):
            out["host_load"].append(event)
        elif kind == "train":
            out["train"] = event
        elif kind == "start" and isinstance(event.get("start"), (int, float)):
            out["start"] = event["start"]
        elif kind == "distributed" and isinstance(event.get("world_size"), int):
            out["distributed"] = event  # checked with the record it goes into
        else:
            out["bad_lines"] += 1
    return out


def _valid_load(row):
    """A host-load reading as the result schema declares it (finite; all but ``t`` >= 0)."""
    try:
        keys = set(row) <= {"t", "dt", "busy", "suite", "outside", "steal"}
        return keys and all(
            type(row[k]) in (int, float) and math.isfinite(row[k]) and (k == "t" or row[k] >= 0)
            for k in row) and all(k in row for k in ("t", "dt", "busy", "suite", "outside"))
    except TypeError:
        return False


def _valid_sample(s):
    try:
        return (all(type(s[k]) in (int, float) and math.isfinite(s[k]) and s[k] >= 0
                    for k in ("start", "end", "count", "rate"))
                and isinstance(s.get("warmup"), bool))
    except (KeyError, TypeError):
        return False
