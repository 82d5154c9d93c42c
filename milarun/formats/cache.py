"""A private cache of what milarun derives from a results folder, addressed by content.

Reading and checking 10,000 result files, computing their steady states and
drawing their plots takes seconds (``benchmarks/report_scale.py``); the report of
a folder that has not changed, asked again with other options (weights, a
baseline, a price, HTML), need not do it again. The caller names an entry by
:func:`entry_key`: a SHA-256 over milarun's own files (:func:`code_digest`) and
every input byte that went into the entry, so a result file changed by one byte,
added, removed or renamed, or another milarun, gives another key and the entry
is computed again. An entry holds derived values (JSON, read back with the strict
reader), never code.

Where: ``$MILARUN_CACHE_DIR`` when set (``off``, or an empty value, turns the cache
off), else ``$XDG_CACHE_HOME/milarun``, else ``~/.cache/milarun``: never a results
folder (a vendor cannot ship an entry). The folder is made 0700, each entry 0600;
one that is a symlink, that another user owns or that others may write is not used.
At most :data:`MAX_ENTRIES` entries are kept, the least recently used removed first
(no other file of the folder is ever removed). Best effort: a cache that cannot be
read, holds a malformed entry or cannot be written (full disk, read-only home) is a
miss, never an error.
"""

import hashlib
import json
import os
import re
import stat
import sys
from pathlib import Path

from ..errors import MilarunError
from .jsonfile import parse_json, read_bytes
from .outfile import write_atomic

#: Environment variable naming the cache folder (``off`` or empty: no cache).
ENV = "MILARUN_CACHE_DIR"
#: Entries kept (each one results folder's report inputs).
MAX_ENTRIES = 16
#: Largest entry read back, in bytes (a bigger one is a miss).
MAX_ENTRY_BYTES = 512 * 2**20
_FORMAT = "milarun-cache"
_VERSION = 1
# an entry's file name (see Cache._path): pruning removes these only, never another file
# of a folder that $MILARUN_CACHE_DIR names
_ENTRY_NAME = re.compile(r"[a-z]+-[0-9a-f]{64}\.json")
_code_digest = None


def cache_dir(environ=None):
    """The cache folder (a ``Path``) for ``environ`` (``os.environ`` by default), or
    None when the cache is off or no absolute path can be made (no home)."""
    environ = os.environ if environ is None else environ
    if ENV in environ:
        value = environ[ENV]
        if value in ("", "off"):
            return None
        path = Path(value)
    else:
        base = environ.get("XDG_CACHE_HOME") or ""
        if not os.path.isabs(base):  # the XDG rule: a relative value is ignored
            base = os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
        path = Path(base) / "milarun"
    return path if path.is_absolute() else None


#: The libraries whose versions are in :func:`code_digest`: what parses and checks the
#: records (orjson, the schema engines) and draws the cached plots.
LIBRARIES = ("fastjsonschema", "jsonschema", "matplotlib", "numpy", "orjson")


def code_digest():
    """SHA-256 (hex) of milarun's own files (its modules, schemas and templates), the
    Python version and the versions of :data:`LIBRARIES`: any change to the code that
    computed an entry makes its key another one."""
    global _code_digest
    if _code_digest is None:
        from importlib import metadata

        root = Path(__file__).resolve().parent.parent
        h = hashlib.sha256(sys.version.encode() + b"\0")
        for name in LIBRARIES:
            try:
                version = metadata.version(name)
            except metadata.PackageNotFoundError:
                version = "absent"
            h.update(f"{name} {version}\0".encode())
        for path in sorted(root.rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            try:
                h.update(hashlib.sha256(path.read_bytes()).digest())
            except OSError:  # not this user's to read (no module is): named, not hashed
                h.update(b"unreadable")
        _code_digest = h.hexdigest()
    return _code_digest


def entry_key(kind, parts):
    """The key (64 hex digits) of an entry of ``kind`` (a short word) made from
    ``parts`` (an iterable of str or bytes, each an input of the entry, in a fixed
    order), with :func:`code_digest`."""
    h = hashlib.sha256(f"{_FORMAT} {_VERSION} {kind} {code_digest()}\0".encode())
    for part in parts:
        data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


class Cache:
    """The entries in folder ``root`` (see the module docstring): :meth:`get` and
    :meth:`put` by kind and key. :meth:`from_env` gives this user's cache."""

    def __init__(self, root):
        self.root = Path(root)

    @classmethod
    def from_env(cls, environ=None):
        """This user's cache (:func:`cache_dir`), or None when it is off."""
        root = cache_dir(environ)
        return cls(root) if root is not None else None

    def _usable(self, create):
        """True when the folder (made 0700 first when ``create``) is a real folder of
        this user's that no one else may write: the only kind an entry is read from or
        written to."""
        try:
            if create:
                self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.lstat(self.root)
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022

    def _path(self, kind, key):
        """The file of entry ``kind``/``key`` (its name matches :data:`_ENTRY_NAME`)."""
        return self.root / f"{kind}-{key}.json"

    def get(self, kind, key):
        """The value stored under ``kind`` and ``key``, or None (a miss: no entry, an
        unusable folder, an unreadable or malformed entry)."""
        if not self._usable(create=False):
            return None
        path = self._path(kind, key)
        try:
            data = parse_json(read_bytes(path, max_bytes=MAX_ENTRY_BYTES), path=path)
        except (MilarunError, OSError):
            return None
        if not (
            isinstance(data, dict)
            and data.get("format") == _FORMAT
            and data.get("version") == _VERSION
            and data.get("key") == key
            and "value" in data
        ):
            return None
        try:
            os.utime(path)  # recently used: pruned last
        except OSError:
            pass
        return data["value"]

    def put(self, kind, key, value):
        """Store ``value`` (JSON-serializable, finite numbers) under ``kind`` and
        ``key``; returns False when it could not be written (nothing is raised)."""
        if not self._usable(create=True):
            return False
        try:
            text = json.dumps(
                {"format": _FORMAT, "version": _VERSION, "key": key, "value": value},
                allow_nan=False,
                separators=(",", ":"),
            )
            # 0600: under umask 0 a 0666 entry in a folder others may enter is theirs to edit
            write_atomic(self._path(kind, key), text, durable=False, private=True)
        except (MilarunError, OSError, ValueError, TypeError):
            return False
        self._prune()
        return True

    def _prune(self):
        """Remove the least recently used entries beyond :data:`MAX_ENTRIES` (regular
        files named like an entry only; nothing else of the folder is touched)."""
        entries = []
        try:
            names = os.listdir(self.root)
        except OSError:
            return
        for name in names:
            if not _ENTRY_NAME.fullmatch(name):
                continue
            path = self.root / name
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                entries.append((st.st_mtime, path))
        for _, path in sorted(entries)[:-MAX_ENTRIES]:
            try:
                path.unlink()
            except OSError:
                pass
