"""Result files on disk: naming, atomic writes, iteration.

File name: ``{suite}.{job}.J{run}.{device}[.FAIL].{UTC %Y%m%d-%H%M%S-%f}.json``.
"""

import datetime
import json
import os
import tempfile
from pathlib import Path

from ..errors import ResultFormatError
from ..jsonfile import read_json
from .schema import migrate


def result_filename(name, run, device, success, when=None):
    """Return the file name for a result of test ``name`` (``suite.job``).

    ``when`` is a UTC ``datetime`` (now by default).
    """
    when = when or datetime.datetime.now(datetime.timezone.utc)
    stamp = when.strftime("%Y%m%d-%H%M%S-%f")
    fail = "" if success else ".FAIL"
    return f"{name}.J{run}.{device}{fail}.{stamp}.json"


def _umask():
    """The process umask, read without changing it (Linux ``/proc``; else 022)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def write_json_atomic(path, data):
    """Write ``data`` as JSON to ``path``: temporary file in the same folder, then rename.

    The file gets the usual mode of a new file (0666 less the umask), not the
    0600 of a temporary file, so results on a shared disk stay readable.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def write_result(record, out):
    """Write ``record`` to ``out`` and return the path written.

    ``out`` is a directory (the standard file name is used) or a path ending
    in ``.json``.
    """
    out = Path(out)
    if out.suffix == ".json":
        path = out
    else:
        path = out / result_filename(record["name"], record.get("run", 0),
                                     record.get("device", "0"), record["success"])
    return write_json_atomic(path, record)


def load_result(path):
    """Read (strictly, see :func:`milarun.jsonfile.read_json`), migrate and validate one
    result file; return the record.

    Raises:
        ResultFormatError: unreadable, not UTF-8, not JSON, too large or too
            deep, or not a valid result record; the message names the file and
            the key.
    """
    return migrate(read_json(path, error_cls=ResultFormatError), path=path)


def iter_results(directory):
    """Yield ``(path, record_or_error)`` for every result file under ``directory``.

    Files are ``*.json`` under ``directory`` and its sub-folders, sorted by
    path; hidden folders (``.name``) and hidden files are not looked at, nor
    are ``*.jsonl`` journals. A file that cannot be read as a result yields its
    ``ResultFormatError`` instead of a record, so callers can skip it with a
    warning; a stale temporary file (``.tmp-*``, left by a writer that died)
    yields a "stale temporary file" error.
    """
    directory = Path(directory)
    for path in sorted(directory.rglob("*.json*")):
        parts = path.relative_to(directory).parts
        if any(p.startswith(".") for p in parts[:-1]) or not path.is_file():
            continue
        if path.name.startswith(".tmp-"):
            yield path, ResultFormatError("stale temporary file (a writer died before its "
                                          "rename); not a result", path=path)
            continue
        if path.name.startswith(".") or path.suffix != ".json":
            continue
        try:
            yield path, load_result(path)
        except ResultFormatError as exc:
            yield path, exc
