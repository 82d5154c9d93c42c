"""The results folder of a ``milarun jobs`` session: checks, lock, session file, resume.

``OUTDIR/.milarun/`` holds:

* ``lock``: held with ``flock`` for the whole session, so two ``milarun jobs``
  never write into one folder at once (the second stops with one clear line
  naming the first one's PID). The kernel drops the lock when its holder
  dies, so a killed session leaves no stale lock.
* ``session.json``: what the folder was started with (profile digest,
  options, devices) and the id of every session that wrote into it, with
  the hardware identity of its nodes (``sessions[i]["identity"]``).
  ``--resume OUTDIR`` checks that the new invocation matches it key by key.

Session ids are the UTC start time ``%Y%m%d-%H%M%S-%f``, which is also the
time stamp in every file name the session's plan gives out.
"""

import datetime
import errno
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import ProfileError, SetupError
from ..formats.jsonfile import read_bytes, read_json
from ..formats.outfile import UnsafeFileError, check_target, open_regular, own_dir
from ..formats.store import iter_results, remove_stale_tmp, result_filename, write_json_atomic
from ..formats.versioned import VersionedFormat
from ..profile.includes import profile_files

SESSION_FORMAT = "milarun-session"
SESSION_VERSION = 1
_UNSUPPORTED = "session format version {version!r} is not supported"
#: The session file's versions (:mod:`milarun.formats.versioned`; no migration yet).
SESSION = VersionedFormat(
    SESSION_VERSION,
    error_cls=SetupError,
    bad=_UNSUPPORTED,
    too_new=_UNSUPPORTED,
    unknown=_UNSUPPORTED,
)
#: How :func:`new_session_id` writes a session id (the stamp in the session's file names).
SESSION_ID_FORMAT = "%Y%m%d-%H%M%S-%f"
#: Free space (MiB) a results folder needs before anything is launched.
MIN_FREE_MIB = 32
#: Largest session file read (bytes): one invocation and a line per session.
MAX_SESSION_BYTES = 16 * 2**20
#: The invocation keys ``--resume`` compares with the session file.
RESUME_KEYS = (
    "profile_sha256",
    "suite",
    "names",
    "repeat",
    "cpu_slots",
    "no_cgexec",
    "timeout",
    "extra_args",
    "dataroot",
    "devices",
    "nodes",
)


def default_outdir():
    """``$MILARUN_OUTROOT/results-YYYY-mm-dd_HH-MM-SS``, or None when unset."""
    root = os.environ.get("MILARUN_OUTROOT")
    if not root:
        return None
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    return str(Path(root) / f"results-{stamp}")


def meta_dir(outdir):
    """``OUTDIR/.milarun``."""
    return Path(outdir) / ".milarun"


def check_outdir(outdir, min_free_mib=MIN_FREE_MIB):
    """Create ``outdir`` if needed and prove it is writable with room to spare.

    Writes and removes a probe file under ``.milarun/``.

    Raises:
        SetupError: not a folder, cannot be created or written (read-only,
            permissions, full), less than ``min_free_mib`` MiB free, or its
            ``.milarun`` is a symlink (``UnsafeFileError``).
    """
    path = Path(outdir)
    if path.exists() and not path.is_dir():
        raise SetupError("results directory is a file, not a folder", path=path)
    probe = meta_dir(path) / f"probe-{os.getpid()}"
    try:
        own_dir(meta_dir(path))
        probe.unlink(missing_ok=True)  # whatever a vendor left there: created anew below
        fd = open_regular(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with os.fdopen(fd, "wb") as f:
            f.write(b"\0" * 65536)
            f.flush()
            os.fsync(f.fileno())
    except UnsafeFileError:
        raise
    except OSError as exc:
        raise SetupError(f"results directory is not writable ({exc.strerror})", path=path)
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    free = shutil.disk_usage(path).free / 2**20
    if free < min_free_mib:
        raise SetupError(
            f"results directory has {free:.1f} MiB free; milarun needs at least "
            f"{min_free_mib} MiB for records and logs",
            path=path,
        )


def check_meta(outdir):
    """The checks of :func:`check_outdir` and :class:`OutdirLock` on ``.milarun`` and
    its lock that write nothing (for ``--dry-run``).

    Raises:
        UnsafeFileError: ``.milarun`` or its lock is a symlink or not a folder
            or regular file.
    """
    own_dir(meta_dir(outdir), create=False)
    check_target(meta_dir(outdir) / "lock")


class OutdirLock:
    """Exclusive ``flock`` on ``OUTDIR/.milarun/lock`` (a context manager).

    The lock file is opened with :func:`milarun.formats.outfile.open_regular`: a lock
    that is a symlink (to a file of the buyer's, which would be truncated) or a
    FIFO or device is refused, not opened.

    Raises:
        SetupError: on enter, when another process holds it (naming its PID),
            or the lock (``UnsafeFileError``) or ``.milarun`` is not a regular
            file or folder.
    """

    def __init__(self, outdir):
        self.path = meta_dir(outdir) / "lock"
        self.fd = None

    def __enter__(self):
        try:
            own_dir(self.path.parent)
            self.fd = open_regular(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except UnsafeFileError:
            raise
        except OSError as exc:
            raise SetupError(f"cannot create the lock ({exc.strerror})", path=self.path)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(self.fd, 200, 0).decode(errors="replace").strip() or "?"
            os.close(self.fd)
            self.fd = None
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise SetupError(
                    f"in use by another 'milarun jobs' ({holder}); wait for it "
                    "or choose another -o",
                    path=self.path.parent.parent,
                )
            raise SetupError(f"cannot lock ({exc.strerror})", path=self.path)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"pid {os.getpid()}\n".encode(), 0)
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def new_session_id(now=None):
    """``(id, datetime)``: the UTC start time as ``%Y%m%d-%H%M%S-%f`` and as a datetime."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return now.strftime(SESSION_ID_FORMAT), now


def profile_digest(path):
    """SHA-256 (hex) of the profile file's bytes; for a profile that includes others,
    of the digests of all its files in turn (an edited included file shows)."""

    def read(f):  # bounded, and never a FIFO (see read_bytes)
        return read_bytes(f, error_cls=ProfileError, what="profile")

    return digest_of_contents([read(f) for f in profile_files(path)])


def digest_of_contents(contents):
    """The profile digest of :func:`profile_digest` from its files' bytes, in
    :func:`milarun.profile.includes.profile_files` order (``contents``: list of bytes):
    SHA-256 (hex) of the one file, or of the concatenated SHA-256 digests of several.
    ``milarun verify`` applies it to a session's profile copies."""
    if len(contents) == 1:
        return hashlib.sha256(contents[0]).hexdigest()
    digest = hashlib.sha256()
    for raw in contents:
        digest.update(hashlib.sha256(raw).digest())
    return digest.hexdigest()


def invocation(
    profile,
    suite,
    names,
    repeat,
    cpu_slots,
    no_cgexec,
    timeout,
    extra_args,
    dataroot,
    devices,
    nodes=None,
):
    """The dict of :data:`RESUME_KEYS` describing one ``milarun jobs`` call."""
    return {
        "profile": str(Path(profile).resolve()),
        "profile_sha256": profile_digest(profile),
        "suite": suite,
        "names": sorted(names) if names else None,
        "repeat": repeat,
        "cpu_slots": cpu_slots,
        "no_cgexec": bool(no_cgexec),
        "timeout": timeout,
        "extra_args": list(extra_args),
        "dataroot": dataroot,
        "devices": {"kind": devices.kind, "indices": list(devices.indices)},
        # node names when several nodes run the suite (None: this host alone)
        "nodes": list(nodes) if nodes else None,
    }


def session_path(outdir):
    return meta_dir(outdir) / "session.json"


def read_session(outdir):
    """The session file of ``outdir``, or None when there is none.

    Raises:
        SetupError: it exists but cannot be read (strictly, with
            :func:`milarun.formats.jsonfile.read_json`: at most :data:`MAX_SESSION_BYTES`,
            a regular file, bounded nesting) or is not a session file.
    """
    path = session_path(outdir)
    if not os.path.lexists(path):
        return None
    data = read_json(path, error_cls=SetupError, max_bytes=MAX_SESSION_BYTES, what="session file")
    if not isinstance(data, dict) or data.get("format") != SESSION_FORMAT:
        raise SetupError("not a milarun session file", path=path)
    data = SESSION.upgrade(data, SESSION.version_of(data, path), path)
    if not isinstance(data.get("invocation"), dict) or not isinstance(data.get("sessions"), list):
        raise SetupError("missing 'invocation' or 'sessions'", path=path)
    return data


def check_resume(saved, current, outdir):
    """Raise ``SetupError`` naming the first key where ``current`` differs from ``saved``."""
    for key in RESUME_KEYS:
        if saved["invocation"].get(key) != current.get(key):
            what = "the profile's content" if key == "profile_sha256" else key
            raise SetupError(
                f"--resume: {what} differs from the run that started this folder "
                f"(was {json.dumps(saved['invocation'].get(key))}, now "
                f"{json.dumps(current.get(key))}); resume with the same profile and options "
                "or use a new -o",
                path=session_path(outdir),
                key=f"invocation.{key}",
            )


def record_session(outdir, current, session_id, resume, saved=None, identity=None):
    """Write the session file with this session appended (atomic).

    ``identity``: ``{node name: hardware identity}`` of the session's nodes
    (:mod:`milarun.launcher.identities`), kept in the session's entry as ``identity``
    (the session file is the first file a session enters in the manifest, so the
    identity is in the chain)."""
    data = saved or {
        "format": SESSION_FORMAT,
        "version": SESSION_VERSION,
        "invocation": current,
        "sessions": [],
    }
    entry = {
        "id": session_id,
        "pid": os.getpid(),
        "resume": bool(resume),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if identity is not None:
        entry["identity"] = identity
    data["sessions"].append(entry)
    write_json_atomic(session_path(outdir), data)


def session_times(saved):
    """The UTC datetimes of the session ids a session file lists (malformed entries left out)."""
    times = []
    for entry in saved.get("sessions", []) if isinstance(saved, dict) else []:
        sid = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(sid, str):
            continue
        try:
            times.append(
                datetime.datetime.strptime(sid, SESSION_ID_FORMAT).replace(
                    tzinfo=datetime.timezone.utc
                )
            )
        except (TypeError, ValueError):
            pass
    return times


def successful_keys(outdir, sessions):
    """The successful records in ``outdir`` that one of this folder's sessions wrote.

    A session names every record it writes (the plan's ``result_filename``:
    the record's name, run and device, stamped with the session id) directly
    in ``outdir``; a successful record under any other name or folder (copied
    from another folder, another session's stamp) is foreign: listed, never
    counted.

    Args:
        sessions: the UTC datetimes of the folder's sessions (:func:`session_times`).

    Returns:
        ``(done, foreign)``: ``done`` maps ``(name, run, device)`` (read from the
        records' contents) to the list of ``(path, job definition)`` of its
        records; ``foreign`` is a list of ``(path, why)``.
    """
    outdir = Path(outdir)
    done: dict = {}
    foreign: list = []
    for path, rec in iter_results(outdir):
        if not isinstance(rec, dict) or rec.get("success") is not True:
            continue
        key: tuple[Any, Any, str] = (rec.get("name"), rec.get("run"), str(rec.get("device")))
        own = {result_filename(key[0], key[1], key[2], True, when) for when in sessions}
        if path.parent != outdir or path.name not in own:
            foreign.append((path, "not written by a session of this folder"))
            continue
        done.setdefault(key, []).append((path, rec.get("job")))
    return done, foreign


def open_session(outdir, current, resume, identity=None):
    """Check and claim ``outdir`` for a session; call inside :class:`OutdirLock`.
    ``identity``: the nodes' hardware identity, for the session file (:func:`record_session`).

    Returns:
        ``(session_id, session_datetime, done, foreign, removed)``: ``done`` and
        ``foreign`` as :func:`successful_keys` gives them for the folder's earlier
        sessions (empty unless ``resume``; the caller checks each record's job
        against the plan, see :func:`milarun.launcher.suite.skip_done`), ``removed`` the
        stale temporary files deleted.

    Raises:
        SetupError: resuming a folder without a session file or with other
            options; or starting afresh in a folder that already has one.
    """
    saved = read_session(outdir)
    if resume and saved is None:
        raise SetupError(
            "--resume: no milarun session here (no .milarun/session.json)", path=outdir
        )
    if not resume and saved is not None:
        raise SetupError(
            "holds the results of an earlier session: resume it with "
            "--resume, or choose another -o",
            path=outdir,
        )
    if resume:
        check_resume(saved, current, outdir)
    removed = remove_stale_tmp(outdir)
    earlier = session_times(saved) if resume else []
    sid, when = new_session_id()
    record_session(outdir, current, sid, resume, saved, identity=identity)
    done, foreign = successful_keys(outdir, earlier) if resume else ({}, [])
    return sid, when, done, foreign, removed
