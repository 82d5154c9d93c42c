"""``milarun seal OUTDIR``: close a results folder into a bundle (the vendor's side).

The folder's manifest (:mod:`milarun.formats.manifest`) already chains every file its
sessions wrote; sealing adds, in this order:

1. with ``weights``: a copy of the weights file at ``.milarun/weights.json``, entered
   in the chain (kind ``weights``) under the folder's last session id;
2. ``OUTDIR/bundle.json`` (:mod:`milarun.formats.bundle`): the chain head and entry
   count after that, the session ids, the hardware identity of every node (merged over
   the sessions of the session file), the profile's SHA-256 as the session recorded
   it, the weights' SHA-256, the milarun version and the sealing time; written
   atomically and checked against its schema first;
3. with ``sign``: ``OUTDIR/bundle.json.sig``, the Ed25519 signature of
   ``bundle.json``'s exact bytes (:func:`milarun.verify.keys.sign`).

It refuses (one line, exit 2; nothing written): a folder without a manifest, a broken
chain (:func:`milarun.formats.manifest.check_chain`), a session still writing into
the folder (its lock held: :class:`milarun.launcher.session.OutdirLock`), a session
file that is not the one its last manifest entry hashed, a chain whose ``weights``
entries are not one entry at :data:`WEIGHTS_COPY`, or a folder already sealed
(``bundle.json`` or its signature exists: never overwritten; remove them to seal
again). The lock is held while sealing, so no session starts meanwhile.
"""

import datetime
import hashlib
import json
import os
from pathlib import Path

from .. import __version__
from ..errors import MilarunError, SetupError
from ..errors import say as warn_line
from ..formats.bundle import BUNDLE_FORMAT, BUNDLE_VERSION, bundle_path, signature_path
from ..formats.jsonfile import check, parse_json, read_bytes
from ..formats.manifest import Manifest, check_chain, file_digest, manifest_path, read_manifest
from ..formats.outfile import write_atomic
from ..launcher.session import OutdirLock, read_session, session_path
from . import keys

#: Where the weights copy goes, relative to the results folder.
WEIGHTS_COPY = ".milarun/weights.json"
#: Largest weights file read (bytes).
MAX_WEIGHTS_BYTES = 4 * 2**20


class SealError(MilarunError):
    """A folder that cannot be sealed: one line naming it and why."""


def _refuse(message, path):
    raise SealError(message, path=path)


def read_weights(path):
    """The bytes of weights file ``path``, checked: strict JSON, at most
    :data:`MAX_WEIGHTS_BYTES`, valid against ``weights.schema.json``.

    Raises:
        SealError: unreadable, not JSON, or a bad key (one line naming file and key).
    """
    raw = read_bytes(path, error_cls=SealError, max_bytes=MAX_WEIGHTS_BYTES, what="weights file")
    check(
        parse_json(raw, path=path, error_cls=SealError), "weights", path=path, error_cls=SealError
    )
    return raw


def merged_identity(saved):
    """``({node: identity}, notes)`` over the sessions of session file ``saved``, in
    order: a node keeps the identity of its first session; a later session that
    recorded another one for it gives a note (one line) rather than a silent
    replacement (verify judges it)."""
    merged, first, notes = {}, {}, []
    for entry in saved.get("sessions") or []:
        ident = entry.get("identity") if isinstance(entry, dict) else None
        if not isinstance(ident, dict):
            continue
        for node, value in ident.items():
            if not isinstance(value, dict):
                continue
            if node not in merged:
                merged[node], first[node] = value, entry.get("id")
            elif value != merged[node]:
                notes.append(
                    f"node {node}: the hardware identity of session {entry.get('id')} "
                    f"differs from session {first[node]}'s (kept: the first)"
                )
    return merged, notes


def _check_lock_free(outdir):
    """Enter :class:`OutdirLock`, turning "in use" into seal's own line."""
    lock = OutdirLock(outdir)
    try:
        lock.__enter__()
    except SetupError as exc:
        if "in use by another" in str(exc):
            _refuse(
                "a milarun jobs session is still writing here (its lock "
                f"{lock.path} is held); seal once it has ended",
                outdir,
            )
        raise
    return lock


def seal(outdir, sign=None, weights=None, say=print, warn=warn_line):
    """Seal results folder ``outdir`` (module docstring); returns the bundle as a dict.

    Args:
        sign: a private key file (PEM, :func:`milarun.verify.keys.keygen`), or None.
        weights: a weights file to copy into the bundle, or None.
        say: ``f(line)`` for what is printed (the head and where the files are).
        warn: ``f(line)`` for warnings (default: stderr).

    Raises:
        SealError: a refusal of the module docstring, a bad weights file, a file that
            cannot be written (full disk, read-only folder).
        ManifestError: an unreadable manifest. KeyFileError: a bad key.
        SetupError: an unreadable session file.
    """
    outdir = Path(outdir)
    if not outdir.is_dir():
        _refuse("not a results folder (no such directory)", outdir)
    mpath = manifest_path(outdir)
    if not os.path.lexists(mpath):
        _refuse(
            "no manifest (.milarun/manifest.jsonl): not a folder written by milarun jobs "
            "with a hash chain; nothing to seal",
            outdir,
        )
    for done in (bundle_path(outdir), signature_path(outdir)):
        if os.path.lexists(done):
            _refuse(
                "already sealed; seal never overwrites a bundle: remove bundle.json "
                "(and bundle.json.sig) to seal again",
                done,
            )
    if sign is not None:
        keys.load_private(sign)  # a bad key stops here, before anything is written
    copy = read_weights(weights) if weights is not None else None
    lock = _check_lock_free(outdir)
    try:
        return _seal(outdir, mpath, sign, copy, say, warn)
    except OSError as exc:  # a full disk, a read-only folder: one line, not a traceback
        raise SealError(
            f"cannot write the bundle: {exc.strerror or exc}; nothing was "
            "sealed (free space or make it writable, then seal again)",
            path=exc.filename or outdir,
        ) from None
    finally:
        lock.__exit__(None, None, None)


def _seal(outdir, mpath, sign, weights, say, warn):
    entries = read_manifest(mpath)
    if not entries:
        _refuse("the manifest is empty: nothing to seal", mpath)
    problems = check_chain(entries)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        _refuse(f"the chain is broken: {problems[0]}{more}; a broken chain cannot be sealed", mpath)
    saved = read_session(outdir)
    if saved is None:
        _refuse("no session file (.milarun/session.json)", outdir)
    spath = session_path(outdir)
    chained = [e for e in entries if e.get("kind") == "session"]
    if (
        not chained
        or chained[-1]["path"] != spath.relative_to(outdir).as_posix()
        or file_digest(spath)[0] != chained[-1]["sha256"]
    ):
        _refuse(
            "the session file is not the one the manifest last entered (changed after "
            "its session, or never entered); it cannot be sealed",
            spath,
        )
    sessions = [e.get("id") for e in saved["sessions"] if isinstance(e, dict)]
    if not all(isinstance(s, str) for s in sessions) or not sessions:
        _refuse("the session file lists no session", spath)
    last_kinds = {e["kind"] for e in entries if e["session"] == sessions[-1]}
    if "end" not in last_kinds:
        warn(
            f"milarun: warning: session {sessions[-1]} has no end in the manifest "
            "(killed?); sealed as it is, verify will say so"
        )
    head = entries[-1]["hash"]
    count = len(entries)
    copy_path = outdir / WEIGHTS_COPY
    entered = [e for e in entries if e["kind"] == "weights"]
    if any(e["path"] != WEIGHTS_COPY for e in entered) or len(entered) > 1:
        # verify accepts one weights entry, at its path (integrity.after-head)
        _refuse(
            f"the chain holds a weights entry that is not the seal's one copy "
            f"({WEIGHTS_COPY}); it cannot be sealed",
            mpath,
        )
    if weights is not None:
        want = hashlib.sha256(weights).hexdigest()
        if entered and entered[-1]["sha256"] != want:
            _refuse(
                "another weights file was entered in the chain already; seal with that "
                "one, or start from an unsealed copy",
                copy_path,
            )
        if not entered:
            write_atomic(copy_path, weights)
            manifest = Manifest(outdir, sessions[-1])
            if manifest.head != head:
                _refuse("the manifest changed while sealing", mpath)
            entry = manifest.add("weights", copy_path)
            entered = [entry]
            head, count = manifest.head, count + 1
    weights_sha = entered[-1]["sha256"] if entered else None
    identity, notes = merged_identity(saved)
    for note in notes:
        warn(f"milarun: warning: {note}")
    invocation = saved.get("invocation") or {}
    bundle = {
        "format": BUNDLE_FORMAT,
        "version": BUNDLE_VERSION,
        "head": head,
        "entries": count,
        "sealed": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sessions": sessions,
        "identity": identity,
        "profile_sha256": invocation.get("profile_sha256"),
        "weights_sha256": weights_sha,
        "milarun_version": __version__,
    }
    if weights_sha is not None:
        bundle["weights"] = entered[-1]["path"]
    if notes:
        bundle["note"] = "; ".join(notes)[:4000]
    bpath = bundle_path(outdir)
    check(bundle, "bundle", path=bpath, error_cls=SealError)
    data = (
        json.dumps(bundle, indent=1, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"
    ).encode("utf-8")
    signature = keys.sign(data, sign) if sign is not None else None
    write_atomic(bpath, data)
    say(f"milarun: sealed {outdir}: manifest head {head} ({count} entries)")
    say(f"milarun: bundle {bpath}")
    if signature is not None:
        spath_sig = signature_path(outdir)
        write_atomic(spath_sig, signature)
        say(f"milarun: signature {spath_sig}")
    if weights_sha is not None:
        say(f"milarun: weights {outdir / bundle['weights']} (sha256 {weights_sha})")
    return bundle


__all__ = [
    "MAX_WEIGHTS_BYTES",
    "SealError",
    "WEIGHTS_COPY",
    "merged_identity",
    "read_weights",
    "seal",
]
