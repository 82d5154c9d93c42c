"""Result files on disk: naming, atomic writes, iteration.

File name: ``{suite}.{job}.J{run}.{device}[.FAIL].{UTC %Y%m%d-%H%M%S-%f}.json``.
Under ``milarun jobs`` the time is the session's start (the plan names every
path before anything runs); the journal of a launch is
``{same stem}.journal.jsonl`` beside it.

Writes are atomic and durable (:func:`milarun.formats.outfile.write_atomic`: a
temporary ``.tmp-*`` file in the same folder, fsynced, renamed over the
target, then the folder is fsynced; never through a symlink nor over a FIFO,
device or folder). JSON is
written without NaN or Infinity (non-finite numbers become ``null``).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..errors import ResultFormatError
from . import trust
from .jsonfile import parse_json, read_bytes, read_json
from .outfile import TMP_PREFIX, StrPath, write_atomic
from .record import migrate, validate


def result_filename(
    name: str,
    run: int | str,
    device: str | int,
    success: bool,
    when: datetime.datetime | None = None,
) -> str:
    """Return the file name for a result of test ``name`` (``suite.job``).

    ``when`` is a UTC ``datetime`` (now by default).
    """
    when = when or datetime.datetime.now(datetime.timezone.utc)
    stamp = when.strftime("%Y%m%d-%H%M%S-%f")
    fail = "" if success else ".FAIL"
    return f"{name}.J{run}.{device}{fail}.{stamp}.json"


def journal_path(result_path: StrPath) -> Path:
    """The journal (JSON Lines) beside a result path: ``x.json`` → ``x.journal.jsonl``."""
    path = Path(result_path)
    stem = path.name[:-5] if path.name.endswith(".json") else path.name
    return path.with_name(stem + ".journal.jsonl")


#: Suffix of the Chrome traces of ``--profile-trace``: JSON, but not records
#: (:func:`iter_results` passes them by).
TRACE_SUFFIX = ".trace.json"


def trace_path(result_path: StrPath, folder: StrPath, rank: int | None = None) -> Path:
    """Where ``--profile-trace folder`` puts the trace of the record at ``result_path``:
    ``folder/<record stem>.trace.json`` (``.rank<R>.trace.json`` for a rank other than 0).

    A relative ``folder`` is inside the record's folder, so a results folder
    carries its traces along.
    """
    path = Path(result_path)
    stem = path.name[:-5] if path.name.endswith(".json") else path.name
    if rank:
        stem += f".rank{rank}"
    return path.parent / Path(folder) / (stem + TRACE_SUFFIX)


def finite_json(data: Any) -> Any:
    """A copy of ``data`` (dicts, lists, scalars) with NaN and ±Infinity replaced by None."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite_json(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite_json(v) for v in data]
    return data


def json_text(data: Any) -> str:
    """``data`` as the JSON text the writers put on disk (indented, no NaN)."""
    return json.dumps(finite_json(data), indent=1, default=str, allow_nan=False)


def write_json_atomic(path: StrPath, data: Any, text: str | None = None) -> Path:
    """Write ``data`` as JSON to ``path`` with :func:`milarun.formats.outfile.write_atomic`
    (temporary file, fsync, rename, fsync of the folder; never through a symlink
    nor over a FIFO, device or folder). Non-finite numbers are written as ``null``.
    ``text``: the exact text to write, when the caller made it already
    (:func:`json_text` of ``data``).

    Raises:
        UnsafeFileError: ``path`` is not a regular file (a ``SetupError`` and an
            ``OSError``); nothing is written.
        OSError: the folder cannot be written (full disk, read-only); no
            temporary file is left behind and an existing ``path`` is intact.
    """
    text = json_text(data) if text is None else text
    return write_atomic(path, text)


def remove_stale_tmp(directory: StrPath, older_than: float = 60.0) -> list[str]:
    """Delete ``.tmp-*`` files of interrupted writes in ``directory`` (not recursive)
    that are older than ``older_than`` seconds; returns the names removed."""
    removed: list[str] = []
    now = time.time()
    for path in Path(directory).glob(TMP_PREFIX + "*"):
        try:
            if now - path.stat().st_mtime > older_than:
                path.unlink()
                removed.append(path.name)
        except OSError:
            pass
    return removed


def write_result(record: dict[str, Any], out: StrPath) -> Path:
    """Validate ``record`` and write it to ``out``; return the path written.

    The one writer of result records, for the child and for the launcher's
    FAIL path. ``out`` is a directory (the standard file name is used) or
    a path ending in ``.json`` (written exactly there). The digest of the bytes
    written goes to this host's registry (:mod:`milarun.formats.trust`), so
    ``milarun rerun`` knows the record as its own.

    Raises:
        ResultFormatError: the record does not follow the schema.
        OSError: the file cannot be written (see :func:`write_json_atomic`).
    """
    validate(finite_json(record), parsed=True)
    out = Path(out)
    if out.suffix == ".json":
        path = out
    else:
        path = out / result_filename(
            record["name"], record.get("run", 0), record.get("device", "0"), record["success"]
        )
    text = json_text(record)
    write_json_atomic(path, record, text=text)
    # the bytes written, not read back: a folder others can write cannot swap them in
    trust.remember(text.encode("utf-8"))
    return path


def load_result(path: StrPath) -> dict[str, Any]:
    """Read (strictly, see :func:`milarun.formats.jsonfile.read_json`), migrate and validate one
    result file; return the record.

    Raises:
        ResultFormatError: unreadable, not UTF-8, not JSON, too large or too
            deep, or not a valid result record; the message names the file and
            the key.
    """
    return migrate(read_json(path, error_cls=ResultFormatError), path=path, parsed=True)


def parse_result(raw: bytes | str, path: StrPath | None = None) -> dict[str, Any]:
    """:func:`load_result` of bytes ``raw`` already read from ``path`` (as
    :func:`result_files` gives them). Raises as :func:`load_result`."""
    return migrate(parse_json(raw, path=path, error_cls=ResultFormatError), path=path, parsed=True)


def inside(root: StrPath, path: StrPath) -> Path | None:
    """``path`` resolved (symlinks followed) if it is a file inside folder ``root``
    (resolved too), else None: nothing outside a results folder is read through
    a link in it (records, logs, traces)."""
    try:
        root = Path(root).resolve(strict=True)
        path = Path(path).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a symlink loop
        return None
    return path if path.is_relative_to(root) and path.is_file() else None


def iter_results(
    directory: StrPath,
) -> Iterator[tuple[Path, dict[str, Any] | ResultFormatError]]:
    """Yield ``(path, record_or_error)`` for every result file under ``directory``.

    Files are ``*.json`` under ``directory`` and its sub-folders, sorted by
    path; hidden folders (``.name``) and hidden files are not looked at, nor
    are ``*.jsonl`` journals nor ``*.trace.json`` profiler traces. A file that
    cannot be read as a result yields its ``ResultFormatError`` instead of a
    record, so callers can skip it with a warning; so does a stale temporary
    file (``.tmp-*``, left by a writer that died), and a symlink to a file
    outside ``directory`` (see :func:`inside`), which is not read: a vendor's
    folder cannot have a file of the buyer's scored; and a FIFO, socket or device
    named like a result, which is never opened (it cannot block the reader).
    """
    return parse_results(result_files(directory))


def parse_results(
    files: Iterable[tuple[Path, bytes | ResultFormatError]],
) -> Iterator[tuple[Path, dict[str, Any] | ResultFormatError]]:
    """Yield ``(path, record_or_error)`` for ``files`` (what :func:`result_files` yields),
    as :func:`iter_results` does."""
    for path, raw in files:
        if isinstance(raw, ResultFormatError):
            yield path, raw
            continue
        try:
            yield path, parse_result(raw, path)
        except ResultFormatError as exc:
            yield path, exc


def result_files(directory: StrPath) -> Iterator[tuple[Path, bytes | ResultFormatError]]:
    """Yield ``(path, bytes_or_error)`` for the files :func:`iter_results` reads, in
    its order: each file's bytes (read as :func:`milarun.formats.jsonfile.read_bytes`
    reads them), or the ``ResultFormatError`` of a file that is not read (see
    :func:`iter_results`) or cannot be; a sub-folder that cannot be listed is passed over.

    Folders are walked with ``os.scandir`` (its entries know their type, where
    ``Path.rglob`` and ``is_file`` ask the kernel again for every file), without
    following symlinks to folders, as ``Path.rglob("*.json*")`` walks them.
    """
    directory = Path(directory)
    found: list[tuple[tuple[str, ...], os.DirEntry[str]]] = []  # (relative parts, entry)
    todo: list[tuple[str, ...]] = [()]
    while todo:
        rel = todo.pop()
        try:
            with os.scandir(directory.joinpath(*rel)) as it:
                entries = list(it)
        except OSError:  # passed over, as rglob does (a lost+found); the top: callers check
            continue
        for entry in entries:
            name = entry.name
            if entry.is_dir(follow_symlinks=False):
                if not name.startswith("."):
                    todo.append(rel + (name,))
                if ".json" not in name:
                    continue
            elif ".json" not in name:
                continue
            found.append((rel + (name,), entry))
    for parts, entry in sorted(found, key=lambda item: item[0]):
        path = directory.joinpath(*parts)
        name = entry.name
        link = entry.is_symlink()
        stale = name.startswith(TMP_PREFIX)
        if not stale and (
            name.startswith(".") or not name.endswith(".json") or name.endswith(TRACE_SUFFIX)
        ):
            continue
        if not (link or entry.is_file(follow_symlinks=False)):
            if not entry.is_dir(follow_symlinks=False):  # a FIFO, socket or device: said
                yield (
                    path,
                    ResultFormatError(
                        "not a regular file (a FIFO, socket or device); not read", path=path
                    ),
                )
            continue
        if link and inside(directory, path) is None:
            yield (
                path,
                ResultFormatError(
                    "a symbolic link to outside the results folder (or a broken one); not read",
                    path=path,
                ),
            )
            continue
        if stale:
            yield (
                path,
                ResultFormatError(
                    "stale temporary file (a writer died before its rename); not a result",
                    path=path,
                ),
            )
            continue
        try:
            yield path, read_bytes(path, error_cls=ResultFormatError)
        except ResultFormatError as exc:
            yield path, exc
