"""Result files on disk: naming, atomic writes, iteration.

File name: ``{suite}.{job}.J{run}.{device}[.FAIL].{UTC %Y%m%d-%H%M%S-%f}.json``.
"""

import datetime
import json
import os
import tempfile
from pathlib import Path

from ..errors import ResultFormatError
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


def read_json(path):
    """Parse one JSON file (result, summary, baseline or weights).

    Raises:
        ResultFormatError: unreadable, truncated or not JSON, naming the file.
    """
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ResultFormatError(f"corrupt JSON ({exc.msg} at line {exc.lineno})", path=path)
    except OSError as exc:
        raise ResultFormatError(f"cannot read ({exc.strerror})", path=path)
    return data


def load_result(path):
    """Read and migrate one result file.

    Raises:
        ResultFormatError: unreadable, truncated or not JSON, or not a result.
    """
    return migrate(read_json(path), path=path)


def iter_results(directory):
    """Yield ``(path, record_or_error)`` for every ``*.json`` file under ``directory``.

    Unreadable files yield their ``ResultFormatError`` instead of a record, so
    callers can skip them and list them in one warning.
    """
    for path in sorted(Path(directory).rglob("*.json")):
        if path.name.startswith(".tmp-"):
            continue
        try:
            yield path, load_result(path)
        except ResultFormatError as exc:
            yield path, exc
