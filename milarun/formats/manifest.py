"""The manifest: an append-only, hash-chained log of every file a session wrote.

``OUTDIR/.milarun/manifest.jsonl`` holds one JSON object per line, in the order
the files were written. Each **entry** names a file (``path``, relative to the
results folder, POSIX separators) with its SHA-256 and size, or an event without
a file (a session's start and end), and links to the entry before it:

``{"seq": 0, "session": "20261126-103851-970453", "kind": "session",
"time": 1795689531.9, "path": ".milarun/session.json", "sha256": "…",
"bytes": 512, "prev": "000…0", "hash": "…"}``

``hash`` is the SHA-256 of the entry's canonical JSON without ``hash``
(:func:`entry_hash`: keys sorted, no spaces, UTF-8); ``prev`` is the previous
entry's ``hash`` (:data:`GENESIS` for the first). The last entry's hash is the
**chain head**: printed when a session ends, so a vendor can send it to the
buyer at once; any later edit, deletion, insertion or reordering of an entry
changes the head (the construction is a plain hash chain, as in Certificate
Transparency's append-only logs without the Merkle tree: we only need to
check the whole log, never prove one entry's inclusion).

A file written twice (the session file on ``--resume``) has several entries;
its last one must match the file on disk. ``--resume`` continues the chain.

Kinds (:data:`KINDS`): ``session`` (the session file), ``profile`` (a copy of
a profile file the session ran), ``plan`` (the session's plan of launches),
``record`` (a result, PASS or FAIL), ``log`` (a child's or a prepare
command's output), ``journal`` (a child's sample journal left behind),
``weights`` (the weights file ``milarun seal --weights`` copied to
``.milarun/weights.json``, entered under the folder's last session id),
``unwritten`` (a launch whose FAIL record could not be written), ``end``
(the session's tally; no file).

This module reads and writes the file; what the chain means for a bundle is
:mod:`milarun.verify`'s. It never executes anything an entry names.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import ResultFormatError
from .jsonfile import parse_json, read_bytes
from .outfile import StrPath, open_append, open_regular

#: File name of the manifest inside ``OUTDIR/.milarun``.
MANIFEST_NAME = "manifest.jsonl"
#: ``prev`` of the first entry.
GENESIS = "0" * 64
#: The kinds of entries (see the module's docstring).
KINDS = ("session", "profile", "plan", "record", "log", "journal", "weights", "unwritten", "end")
#: Kinds without a file.
EVENTS = ("unwritten", "end")
#: Largest manifest read (bytes): 256 MiB (about a million entries).
MAX_MANIFEST_BYTES = 256 * 2**20
#: Longest line read (bytes).
MAX_LINE_BYTES = 64 * 2**10
#: Largest file hashed (bytes); a larger one is refused, not truncated.
MAX_HASHED_BYTES = 16 * 2**30


class ManifestError(ResultFormatError):
    """A manifest that cannot be read: one line naming the file, the line and the key."""


def manifest_path(outdir: StrPath) -> Path:
    """``OUTDIR/.milarun/manifest.jsonl`` (a ``Path``)."""
    return Path(outdir) / ".milarun" / MANIFEST_NAME


def canonical(entry: dict[str, Any]) -> bytes:
    """The bytes that are hashed: ``entry`` without ``hash``, keys sorted, compact, UTF-8."""
    body = {k: v for k, v in entry.items() if k != "hash"}
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def entry_hash(entry: dict[str, Any]) -> str:
    """SHA-256 (hex) of :func:`canonical` ``(entry)``."""
    return hashlib.sha256(canonical(entry)).hexdigest()


def file_digest(path: StrPath, max_bytes: int = MAX_HASHED_BYTES) -> tuple[str, int]:
    """``(sha256 hex, size in bytes)`` of a regular file, read in 1 MiB blocks.

    Never follows a symlink nor opens a FIFO or device (:func:`open_regular`).

    Raises:
        UnsafeFileError: ``path`` is not a regular file.
        OSError: it cannot be read, or is larger than ``max_bytes``.
    """
    fd = open_regular(path, os.O_RDONLY)
    digest, size = hashlib.sha256(), 0
    with os.fdopen(fd, "rb") as f:
        while True:
            block = f.read(2**20)
            if not block:
                break
            size += len(block)
            if size > max_bytes:
                raise OSError(f"{path}: larger than {max_bytes} bytes; not hashed")
            digest.update(block)
    return digest.hexdigest(), size


def relative(outdir: StrPath, path: StrPath) -> str:
    """``path`` relative to ``outdir`` as a POSIX string.

    Raises:
        ValueError: ``path`` is not inside ``outdir``.
    """
    path = Path(path)
    # the folder is resolved, never the file itself: a symlink is named, not followed
    return (path.parent.resolve() / path.name).relative_to(Path(outdir).resolve()).as_posix()


def is_safe_relative(text: object) -> bool:
    """True when ``text`` is a relative POSIX path that stays inside its folder
    (no ``..``, not absolute, no empty or NUL part): what a manifest may name."""
    if not isinstance(text, str) or not text or "\0" in text or "\\" in text:
        return False
    # the text's own parts: PurePosixPath would drop "." and empty parts ("./x", "a//b"),
    # and one file could then be named two ways in one chain
    return not PurePosixPath(text).is_absolute() and all(
        part not in ("", ".", "..") for part in text.split("/")
    )


class Manifest:
    """The writer of one results folder's manifest (open for a session).

    ``Manifest(outdir, session_id)`` reads the chain already there (``--resume``)
    to continue it (``session_id`` may be set later, before the first append);
    :meth:`add` hashes a file and appends its entry, :meth:`event` appends an entry
    without a file. Every append is one ``write`` of one line on a file opened
    ``O_APPEND``, then ``fsync``: a crash leaves at most a torn last line
    (:func:`read_manifest` reports it); a write that fails (a full disk) cuts its
    part-line off again before raising.

    Raises (constructor):
        ManifestError: the existing manifest is unreadable or its chain broken
            (a session never extends a chain it cannot check).
    """

    def __init__(self, outdir: StrPath, session_id: str | None = None) -> None:
        self.outdir = Path(outdir)
        self.session = session_id
        self.path = manifest_path(outdir)
        self.head, self.seq = GENESIS, 0
        if os.path.lexists(self.path):
            entries = read_manifest(self.path)
            problems = check_chain(entries)
            if problems:
                raise ManifestError(
                    f"{problems[0]}; this session does not extend a broken chain (start a new -o)",
                    path=self.path,
                )
            if entries:
                self.head, self.seq = entries[-1]["hash"], entries[-1]["seq"] + 1

    def _append(self, entry: dict[str, Any]) -> dict[str, Any]:
        entry = {
            "seq": self.seq,
            "session": self.session,
            "time": round(time.time(), 6),
            **entry,
            "prev": self.head,
        }
        entry["hash"] = entry_hash(entry)
        line = (
            json.dumps(
                entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
            ).encode("utf-8")
            + b"\n"
        )
        with open_append(self.path) as f:
            fd = f.fileno()  # written through the descriptor: nothing left buffered
            size = os.fstat(fd).st_size
            try:
                rest = memoryview(line)
                while rest:
                    rest = rest[os.write(fd, rest) :]
                os.fsync(fd)
            except OSError:
                # a full disk may have written part of the line: cut it off, so that the
                # chain stays readable and the next append (or a seal) continues it
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise
        self.head, self.seq = entry["hash"], self.seq + 1
        return entry

    def add(self, kind: str, path: StrPath, **fields: Any) -> dict[str, Any]:
        """Hash file ``path`` (inside the results folder) and append its entry;
        ``fields`` (JSON values) are stored with it. Returns the entry.

        Raises:
            ValueError: unknown ``kind``, or ``path`` outside the folder.
            OSError: the file cannot be hashed or the manifest written.
        """
        if kind not in KINDS or kind in EVENTS:
            raise ValueError(f"not a file kind of the manifest: {kind!r}")
        rel = relative(self.outdir, path)
        sha, size = file_digest(self.outdir / rel)
        return self._append({"kind": kind, "path": rel, "sha256": sha, "bytes": size, **fields})

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append an entry without a file (``unwritten``, ``end``). Returns it."""
        if kind not in EVENTS:
            raise ValueError(f"not an event kind of the manifest: {kind!r}")
        return self._append({"kind": kind, **fields})


#: The fields every entry has, with their types.
_FIELDS: tuple[tuple[str, type | tuple[type, ...]], ...] = (
    ("seq", int),
    ("session", str),
    ("kind", str),
    ("time", (int, float)),
    ("prev", str),
    ("hash", str),
)
_HEX64 = re.compile(r"[0-9a-f]{64}")


def _is_hex64(text: object) -> bool:
    return isinstance(text, str) and _HEX64.fullmatch(text) is not None


def _need(cond: bool, path: StrPath, lineno: int, key: str | None, message: str) -> None:
    if not cond:
        raise ManifestError(f"line {lineno}: {message}", path=path, key=key)


def read_manifest(path: StrPath, max_bytes: int = MAX_MANIFEST_BYTES) -> list[dict[str, Any]]:
    """The entries of a manifest, in file order, each checked for its shape.

    Reads with the strict bounded reader (a regular file, at most ``max_bytes``;
    each line strict JSON: finite numbers, no duplicate keys).

    Returns:
        list of dict entries.

    Raises:
        ManifestError: one line naming the file, the line number and the key: a
            line that is not a JSON object, a torn last line, a missing or
            mistyped field, a path that leaves the folder, an unknown kind.
    """
    raw = read_bytes(path, error_cls=ManifestError, max_bytes=max_bytes, what="manifest")
    if raw and not raw.endswith(b"\n"):
        raise ManifestError(
            "the last line is incomplete (a write was cut off: truncated manifest)", path=path
        )
    entries: list[dict[str, Any]] = []
    where = str(path)
    for lineno, line in enumerate(raw.split(b"\n")[:-1] if raw else [], 1):
        # a message is formatted only for a line that fails (a manifest of a million
        # lines is read once per verify, audit and seal)
        if len(line) > MAX_LINE_BYTES:
            _need(False, path, lineno, None, f"longer than {MAX_LINE_BYTES} bytes")
        entry = parse_json(line, path=f"{where}:{lineno}", error_cls=ManifestError)
        if not isinstance(entry, dict):
            _need(False, path, lineno, None, "not a JSON object")
        for key, kind in _FIELDS:
            if key not in entry:
                _need(False, path, lineno, key, "missing")
            value = entry[key]
            if not isinstance(value, kind) or isinstance(value, bool):
                _need(False, path, lineno, key, f"must be {getattr(kind, '__name__', 'a number')}")
        if entry["kind"] not in KINDS:
            _need(False, path, lineno, "kind", f"unknown kind {entry['kind'][:40]!r}")
        for key in ("prev", "hash"):
            if not _is_hex64(entry[key]):
                _need(False, path, lineno, key, "must be 64 lowercase hex digits")
        if entry["kind"] not in EVENTS:
            _need(
                is_safe_relative(entry.get("path")),
                path,
                lineno,
                "path",
                "must be a relative path inside the results folder",
            )
            _need(
                _is_hex64(entry.get("sha256")),
                path,
                lineno,
                "sha256",
                "must be 64 lowercase hex digits",
            )
            _need(
                isinstance(entry.get("bytes"), int)
                and not isinstance(entry["bytes"], bool)
                and entry["bytes"] >= 0,
                path,
                lineno,
                "bytes",
                "must be an integer >= 0",
            )
        entries.append(entry)
    return entries


def check_chain(entries: Sequence[dict[str, Any]]) -> list[str]:
    """The chain's problems, in order (empty: unbroken): ``seq`` not 0, 1, 2, …,
    a ``prev`` that is not the previous entry's ``hash``, a ``hash`` that is not
    the entry's (:func:`entry_hash`). Each problem is one line naming the entry.
    Pure: reads no file."""
    problems: list[str] = []
    head: object = GENESIS
    for i, entry in enumerate(entries):
        where = f"manifest entry {i} ({entry.get('kind')} {entry.get('path') or ''})".rstrip()
        if entry.get("seq") != i:
            problems.append(
                f"{where}: seq is {entry.get('seq')}, expected {i} "
                "(an entry was removed, inserted or moved)"
            )
        if entry.get("prev") != head:
            problems.append(
                f"{where}: prev does not match the entry before it (the chain is broken here)"
            )
        if entry.get("hash") != entry_hash(entry):
            problems.append(f"{where}: hash does not match its content (the entry was edited)")
        head = entry.get("hash")
    return problems


def head_of(entries: Sequence[dict[str, Any]]) -> str:
    """The chain head: the last entry's ``hash`` (:data:`GENESIS` for no entry)."""
    return entries[-1]["hash"] if entries else GENESIS


def chained_records(outdir: StrPath) -> set[str]:
    """The paths (POSIX, relative to ``outdir``) of the records its manifest chains: what
    a bundle's score may count.

    Raises:
        ManifestError: the manifest is missing, unreadable or its chain broken.
    """
    path = manifest_path(outdir)
    entries = read_manifest(path)
    problems = check_chain(entries)
    if problems:
        raise ManifestError(problems[0], path=path)
    return {e["path"] for e in entries if e["kind"] == "record"}
