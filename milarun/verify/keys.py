"""Ed25519 keys and signatures for sealed bundles (through ``cryptography``).

A vendor makes a key pair once (``milarun keygen``) and puts the public key in
the tender reply; ``milarun seal --sign KEY`` signs the bundle file's bytes;
``milarun verify --public-key PUB`` checks the signature. Ed25519 (RFC 8032):
deterministic signatures, 32-byte keys, no parameters to get wrong.

Files: the private key is PKCS#8 PEM (unencrypted, written mode 0600), the
public key SubjectPublicKeyInfo PEM (mode 0644), a signature the 64 raw bytes in base64 on
one line.
"""

import base64
import binascii
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..errors import MilarunError
from ..formats.jsonfile import read_bytes
from ..formats.outfile import fsync_dir

#: Largest key or signature file read (bytes).
MAX_KEY_BYTES = 16 * 2**10


class KeyFileError(MilarunError):
    """A key or signature file that cannot be used: one line naming the file."""


def keygen(private_path, public_path):
    """Write a new Ed25519 key pair: ``private_path`` (mode 0600) and ``public_path``
    (mode 0644), both new files.

    Each file is created with ``O_EXCL`` and its mode (never wider, whatever the
    umask, and set exactly by ``fchmod`` before a byte is written), so the private
    key is never readable by others, not even for a moment, and a file that
    appeared meanwhile is never overwritten. Nothing is left behind on an error.

    Raises:
        KeyFileError: the two paths are one file, either exists already, its folder
            is missing or not a folder, or a file cannot be written (nothing written).
    """
    if _where(private_path) == _where(public_path):
        raise KeyFileError(
            "is given as both the private and the public key; name two files", path=public_path
        )
    private_path, public_path = Path(private_path), Path(public_path)
    for path in (private_path, public_path):
        if os.path.lexists(path):
            raise KeyFileError("exists already; milarun keygen never overwrites a key", path=path)
        folder = path.parent
        if not folder.is_dir():
            what = "does not exist" if not os.path.lexists(folder) else "is not a folder"
            raise KeyFileError(f"cannot write the key: its folder {folder} {what}", path=path)
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    written = []
    try:
        for path, data, mode in ((private_path, private, 0o600), (public_path, public, 0o644)):
            _write_new(path, data, mode)
            written.append(path)
    except BaseException:
        # a pair or nothing: a lone private key would only be deleted or reused by mistake
        for path in written:
            try:
                os.unlink(path)
            except OSError:
                pass
        raise


def _where(path):
    """``path`` with its folder resolved: two names of one file compare equal (the
    file itself need not exist)."""
    folder, name = os.path.split(os.fspath(path))
    return os.path.join(os.path.realpath(folder or "."), name)


def _write_new(path, data, mode):
    """Create ``path`` (``O_EXCL``, no link followed) with exactly ``mode`` and write
    ``data``, fsynced; a file that fails part-way is removed.

    Raises:
        KeyFileError: the file exists or cannot be created or written.
    """
    try:
        # created with ``mode`` (less the umask: never wider), then exactly ``mode``
        # before any byte is written, whatever the umask
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode
        )
    except FileExistsError:
        raise KeyFileError("exists already; milarun keygen never overwrites a key", path=path)
    except OSError as exc:
        raise KeyFileError(f"cannot write the key: {exc.strerror}", path=path)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        os.unlink(path)
        raise KeyFileError(f"cannot write the key: {exc.strerror}", path=path)
    except BaseException:
        os.unlink(path)
        raise
    fsync_dir(path.parent)


def load_private(path):
    """The Ed25519 private key in PEM file ``path``.

    Raises:
        MilarunError: unreadable, not PEM, encrypted, or not an Ed25519 key.
    """
    raw = read_bytes(path, error_cls=KeyFileError, max_bytes=MAX_KEY_BYTES, what="private key")
    try:
        key = serialization.load_pem_private_key(raw, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"not an unencrypted PEM private key ({exc})", path=path)
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError("not an Ed25519 key", path=path)
    return key


def load_public(path):
    """The Ed25519 public key in PEM file ``path``.

    Raises:
        MilarunError: unreadable, not PEM, or not an Ed25519 key.
    """
    raw = read_bytes(path, error_cls=KeyFileError, max_bytes=MAX_KEY_BYTES, what="public key")
    try:
        key = serialization.load_pem_public_key(raw)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"not a PEM public key ({exc})", path=path)
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError("not an Ed25519 key", path=path)
    return key


def sign(data, private_path):
    """The signature of ``data`` (bytes) as one line of base64 text (with newline)."""
    return base64.b64encode(load_private(private_path).sign(data)).decode("ascii") + "\n"


def check_signature(data, signature_path, public_path):
    """Whether the signature in ``signature_path`` is ``data``'s under the public key.

    Returns:
        ``(ok, detail)``: ``ok`` False with a one-line reason for a signature that
        does not match (a forged or re-signed bundle, another vendor's key).

    Raises:
        MilarunError: the key or signature file is unreadable or malformed.
    """
    key = load_public(public_path)
    raw = read_bytes(
        signature_path, error_cls=KeyFileError, max_bytes=MAX_KEY_BYTES, what="signature"
    )
    try:
        sig = base64.b64decode(raw.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise KeyFileError("not a base64 signature", path=signature_path)
    if len(sig) != 64:
        raise KeyFileError(f"an Ed25519 signature is 64 bytes, not {len(sig)}", path=signature_path)
    try:
        key.verify(sig, data)
    except InvalidSignature:
        return False, "the signature does not match the bundle under this public key"
    return True, "signature valid under the given public key"
