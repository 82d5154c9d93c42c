"""The sealed bundle file, ``OUTDIR/bundle.json`` (``milarun seal``), and its signature
``OUTDIR/bundle.json.sig``.

The bundle file closes a results folder: it names the manifest's chain head and
entry count (:mod:`milarun.formats.manifest`), the sessions, the hardware identity
of every node, the SHA-256 of the profile (as ``milarun jobs`` recorded it: of the
file, or of its files' hashes when it has includes; see
:func:`milarun.launcher.session.profile_digest`) and of the weights, and the
milarun version. The signature (:mod:`milarun.verify.keys`) covers its exact
bytes. Format: ``milarun/formats/schemas/bundle.schema.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ResultFormatError
from .jsonfile import StrPath, check, read_json

#: Names inside the results folder.
BUNDLE_NAME = "bundle.json"
SIGNATURE_NAME = "bundle.json.sig"
BUNDLE_FORMAT = "milarun-bundle"
BUNDLE_VERSION = 1
#: Largest bundle file read (bytes).
MAX_BUNDLE_BYTES = 16 * 2**20


class BundleError(ResultFormatError):
    """A bundle file that cannot be read: one line naming the file and the key."""


def bundle_path(outdir: StrPath) -> Path:
    """``OUTDIR/bundle.json``."""
    return Path(outdir) / BUNDLE_NAME


def signature_path(outdir: StrPath) -> Path:
    """``OUTDIR/bundle.json.sig``."""
    return Path(outdir) / SIGNATURE_NAME


def read_bundle(path: StrPath) -> dict[str, Any]:
    """The bundle file at ``path`` (a dict, as in the file), read strictly and checked
    against its schema.

    Raises:
        BundleError: unreadable, not JSON, or a missing or bad key (one line naming
            the file and the key).
    """
    return check(
        read_json(path, error_cls=BundleError, max_bytes=MAX_BUNDLE_BYTES, what="bundle file"),
        "bundle",
        path=path,
        error_cls=BundleError,
    )


__all__ = [
    "BUNDLE_NAME",
    "SIGNATURE_NAME",
    "BundleError",
    "bundle_path",
    "read_bundle",
    "signature_path",
]
