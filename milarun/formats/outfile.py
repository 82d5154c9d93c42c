"""Output files that never follow a symlink nor replace what is not a regular file.

Every file milarun writes (records, summaries, the session file, HTML reports,
logs, journals, the lock) goes through here. A vendor's results folder, or a
mistyped ``-o``, may put a symlink, a FIFO or a device node where milarun
writes. Written through, a symlink lets the folder's author truncate or append
to any file the buyer (often root) can write; an atomic rename over
``/dev/full`` replaces the device node with a regular file; a FIFO blocks.

* :func:`write_atomic` (temporary file, rename) ``lstat``\\ s the target before
  writing and again right before the rename: anything that exists and is not
  a regular file is refused. A symlink is refused too: it is neither followed
  nor replaced (replacing it would silently drop what the user pointed at).
  The window left between the last check and ``rename`` only lets someone
  who can already write the folder swap a name in it; rename never writes
  through a link or into a device.
* :func:`open_regular` (logs, journals, the lock) refuses a non-regular file
  after ``lstat``, without opening it, then opens with ``O_NOFOLLOW`` and
  ``O_NONBLOCK`` (a FIFO swapped in meanwhile cannot block the open) and checks
  the descriptor with ``fstat``; opened for writing, a file with other hard
  links is refused too (the lock is truncated, a log appended to).
* :func:`own_dir` creates a folder milarun writes into (``.milarun``,
  ``logs``) and refuses one that is a symlink, so nothing leaves the results
  folder through it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from pathlib import Path
from typing import IO, Any, Literal, NoReturn, TypeAlias, overload

from ..errors import SetupError

#: A file path as milarun's readers and writers take it.
StrPath: TypeAlias = "str | os.PathLike[str]"

#: Prefix of the temporary files of atomic writes.
TMP_PREFIX = ".tmp-"

_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind(mode: int) -> str:
    """``"a FIFO"``, ``"a directory"``, … for an ``st_mode`` that is not a regular file."""
    return next((word for test, word in _KINDS if test(mode)), "not a regular file")


class UnsafeFileError(SetupError, OSError):
    """An output path is a symlink, FIFO, device, socket or folder (or, to append
    to, a hard link): not written.

    Both a :class:`~milarun.errors.MilarunError` (the CLI prints one line, exit 2)
    and an ``OSError`` (the launcher's and the child's "cannot write" paths,
    which catch ``OSError``, report it like a full disk); ``strerror`` is the
    message without the path.
    """

    def __init__(self, message: str, path: StrPath | None) -> None:
        super().__init__(message, path=path)
        self.errno = errno.EPERM
        self.strerror = message
        self.filename = None

    def __str__(self) -> str:
        return self.args[0]


def _refuse(path: StrPath, mode: int) -> NoReturn:
    if stat.S_ISLNK(mode):
        raise UnsafeFileError(
            "is a symbolic link; milarun does not write through links "
            "(remove it or choose another path)",
            path,
        )
    raise UnsafeFileError(
        f"is {kind(mode)}, not a regular file; not replaced (choose another path)", path
    )


def check_target(path: StrPath) -> None:
    """Raise :class:`UnsafeFileError` when ``path`` exists and is not a regular file
    (a symlink included, whatever it points at); a missing path is fine."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        _refuse(path, mode)


def _umask() -> int:
    """The process umask, read without changing it (Linux ``/proc``; else 022)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def fsync_dir(path: StrPath) -> None:
    """fsync a folder, so a rename in it survives a crash (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(
    path: StrPath, data: str | bytes, durable: bool = True, private: bool = False
) -> Path:
    """Write ``data`` (str as UTF-8, or bytes) to ``path`` atomically: a ``.tmp-*``
    file in the same folder, renamed over ``path``; with ``durable``, fsynced
    and the folder fsynced after the rename.

    The file gets the usual mode of a new file (0666 less the umask), not the
    0600 of a temporary file, so results on a shared disk stay readable; with
    ``private``, 0600 whatever the umask (it never had another mode).

    Raises:
        UnsafeFileError: ``path`` is a symlink, FIFO, device, socket or folder
            (checked before writing and right before the rename); nothing is
            written.
        OSError: the folder cannot be written (full disk, read-only); no
            temporary file is left behind and an existing ``path`` is intact.
    """
    path = Path(path)
    check_target(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=path.suffix or ".tmp", dir=path.parent)
    try:
        if not private:
            os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        check_target(path)  # again: the writing took time
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        fsync_dir(path.parent)
    return path


def open_regular(path: StrPath, flags: int, mode: int = 0o666) -> int:
    """``os.open`` ``path`` (``flags`` such as ``O_WRONLY | O_APPEND | O_CREAT``) as
    a regular file only; returns the descriptor (blocking, close-on-exec).

    Raises:
        UnsafeFileError: ``path`` is a symlink, FIFO, device, socket or folder
            (not opened, so a device's open has no side effect and a FIFO
            cannot block), or, opened for writing, has other hard links.
        OSError: any other failure to open.
    """
    check_target(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # swapped in meanwhile
            check_target(path)
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _refuse(path, st.st_mode)
        if st.st_nlink > 1 and flags & (os.O_WRONLY | os.O_RDWR):
            # a hard link to another file: appending or truncating would change it
            raise UnsafeFileError(
                f"has {st.st_nlink - 1} other hard link(s); not written "
                "(remove it or choose another path)",
                path,
            )
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


@overload
def open_append(path: StrPath, binary: Literal[True] = True) -> IO[bytes]: ...
@overload
def open_append(path: StrPath, binary: Literal[False]) -> IO[str]: ...
def open_append(path: StrPath, binary: bool = True) -> IO[Any]:
    """:func:`open_regular` for appending (created when missing), as a Python file
    object (``"ab"``, or ``"a"`` UTF-8 text when not ``binary``)."""
    fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "ab") if binary else os.fdopen(fd, "a", encoding="utf-8")


def own_dir(path: StrPath, create: bool = True) -> Path:
    """Create folder ``path`` (and its parents) if needed; return it as a ``Path``.
    With ``create`` false (``--dry-run``), only check one that exists.

    Raises:
        UnsafeFileError: ``path`` is a symlink (milarun's own sub-folders of a
            results folder never are; writing through one would leave the
            folder) or not a folder.
        OSError: it cannot be created.
    """
    path = Path(path)
    try:
        if create:
            path.mkdir(parents=True, exist_ok=True)
        mode = os.lstat(path).st_mode
    except FileExistsError:  # a file, or a link to one: said below
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        if create:
            raise
        return path
    if not stat.S_ISDIR(mode):
        _refuse(path, mode)
    return path
