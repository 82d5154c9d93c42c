"""Which result files this host's milarun wrote: ``milarun rerun`` runs only those
without ``--yes``.

:func:`milarun.formats.store.write_result` appends the SHA-256 of the exact bytes
of every record it writes to a registry that only this user can write:
``$MILARUN_WRITTEN`` when set (tests point it elsewhere), else
``$XDG_CONFIG_HOME/milarun/written.sha256``, else
``~/.config/milarun/written.sha256`` (folder 0700, file 0600, one 64-hex digest
a line). A vendor can copy any file into a results folder but cannot add a line
to the buyer's registry, nor make other bytes with a listed digest: a record
changed by one byte is foreign again. The registry is read from this process's
environment only, never from a record (a rerun takes no ``MILARUN_WRITTEN``
from a record's ``environ``).

Why a registry and not a signature stored with the record: the record's schema
rejects unknown fields and a sidecar file would change what every results
folder holds; the registry is as unforgeable (the secret is the file's write
permission instead of a key) and leaves result folders as they are.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path

#: Environment variable naming the registry file (this process's, never a record's).
ENV = "MILARUN_WRITTEN"


def registry_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """The registry file (a ``Path``) for ``environ`` (``os.environ`` by default), or
    None when no absolute path can be made (no home): nothing is then vouched for."""
    environ = os.environ if environ is None else environ
    if environ.get(ENV):
        path = Path(environ[ENV])
    else:
        base = environ.get("XDG_CONFIG_HOME") or ""
        if not os.path.isabs(base):  # the XDG rule: a relative value is ignored
            base = os.path.join(os.path.expanduser("~"), ".config")
        path = Path(base) / "milarun" / "written.sha256"
    # "~" unexpanded (no HOME) would be a folder in the current one: a vendor's
    return path if path.is_absolute() else None


def digest(data: bytes) -> str:
    """The registry's line for ``data`` (bytes): its SHA-256, 64 hex digits."""
    return hashlib.sha256(data).hexdigest()


def remember(data: bytes, registry: str | os.PathLike[str] | None = None) -> bool:
    """Add the digest of ``data`` (the bytes of a record just written) to the registry.

    Best effort: returns False when the registry cannot be written (read-only
    home, full disk); the record is then foreign to a rerun (``--yes``), never
    lost. One ``write`` of one line in append mode, so concurrent writers on
    one host do not interleave.
    """
    path = Path(registry) if registry else registry_path()
    if path is None:
        return False
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, (digest(data) + "\n").encode("ascii"))
        finally:
            os.close(fd)
    except OSError:
        return False
    return True


def written_here(
    data: bytes, registry: str | os.PathLike[str] | None = None
) -> tuple[bool, str | None]:
    """``(True, None)`` when this host's milarun wrote exactly ``data`` (bytes), else
    ``(False, why)`` with ``why`` a few words for the refusal line.

    A registry that another user owns, or that group or others may write, is
    not believed (anyone who can write it could vouch for a file).
    """
    path = Path(registry) if registry else registry_path()
    if path is None:
        return False, f"no registry of records written here (${ENV} or a home folder)"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False, f"no record was ever written by milarun here ({path} does not exist)"
    except OSError as exc:
        return False, f"cannot read {path} ({exc.strerror})"
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.geteuid()
            or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        ):
            return False, f"{path} is not a private file of this user"
        want = digest(data).encode("ascii")
        for line in f:
            if line.rstrip(b"\n") == want:
                return True, None
    return False, "it was not written by this host's milarun (or was changed since)"
