"""The start barrier of a concurrent wave: served by the launcher over TCP. No torch.

Every process of a concurrent wave (the per-GPU children of a test, on one
node or on every node; the torchrun launches of an ``njobs`` test; the
processes of a ``multi-process`` test) finishes its set-up, then waits here
before its timed loop, so that all timed loops start together (DLBS does the
same with a semaphore, ``DLBS_TENSORRT_SYNCH_BENCHMARKS``). A socket works
where a file or a semaphore would not: across nodes, and from inside student
cgroups (which confine CPUs and memory, not the network).

Protocol: one TCP connection per process, one JSON line each way::

    child  -> server  {"secret": "<session secret>", "wave": "<wave id>",
                       "label": "<device label>"}
    server -> child   {"go": <server's Unix time of the release>, "parties": n,
                       "arrived": k}                 once every process is there
                      {"error": "<always the same>"} a wrong secret, wave or label

Anyone on the network can connect, so the server trusts only the session's
secret (``secrets.token_hex``, given to the children in
``MILARUN_BARRIER_SECRET``, compared in constant time): a connection without it
is answered one constant line, counted (:attr:`BarrierServer.strangers`, which
the launcher reports) and closed, and can never release, hold or crash a wave.
The answer is the same whatever the wave or label (a guessed wave id, derived
from the session's start second, is never confirmed). Connections still
sending their line are bounded (the oldest is closed for a new one: a child
sends its line at once, a flood does not), a wave holds at most one
connection per label, and the accept loop outlives a lack of file
descriptors (``EMFILE``) and any broken or garbled connection.

The launcher tells the server which labels a wave has before it starts them
(:meth:`BarrierServer.expect`) and drops the label of a process that ended
without arriving (:meth:`BarrierServer.drop`): a process that crashed in its
set-up never holds the others. A process whose connection closes while it
waits (it gave up: :class:`BarrierTimeout`) is dropped the same way.

The child side is :func:`wait`: it returns when the wave is released, or
raises :class:`BarrierTimeout` after ``timeout`` seconds, which the child
records as a FAIL with reason ``barrier-timeout``. :func:`from_environment`
reads what the plan put in the child's environment (nothing for a process
launched alone, which never waits).
"""

from __future__ import annotations

import collections
import errno
import hmac
import json
import math
import os
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import say

# the environment variables of the child protocol that the barrier reads
from .child import ENV_ADDRESS, ENV_SECRET, ENV_TIMEOUT, ENV_WAVE
from .child import ENV_BARRIER_PREFIX as ENV_PREFIX
from .child import ENV_DEVICE as ENV_LABEL


def without_barrier(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` (a dict) without the ``MILARUN_BARRIER*`` variables: for a process
    that runs alone (``milarun rerun``), whose session's barrier is long gone."""
    return {k: v for k, v in environ.items() if not k.startswith(ENV_PREFIX)}


def without_secret(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` (a dict) without :data:`ENV_SECRET`: what a record or a log may
    show of a launch's environment (a record is read by others; the secret is
    what keeps strangers away from the session's barrier)."""
    return {k: v for k, v in environ.items() if k != ENV_SECRET}


#: Default of ``milarun jobs --barrier-timeout``: seconds a process that finished its
#: set-up waits for the slowest of its wave (data sets are read, models built).
BARRIER_TIMEOUT_S = 600.0

#: Longest request line accepted (bytes); seconds a connection has to send it (a
#: child sends it as soon as it connects).
_LINE_BYTES = 4096
_READ_S = 10.0
#: Connections still sending their request line, at most (the oldest is closed
#: for a new one); a wave holds at most one more per label.
MAX_PENDING = 64
#: Seconds the accept loop pauses after a failed accept() (EMFILE: no descriptor left).
_BACKOFF_S = 0.1
#: The one answer to a wrong secret, an unknown wave and an unknown label alike.
REFUSED = {"error": "unknown wave, label or secret"}
#: Stranger addresses kept for the launcher's report.
_PEERS_KEPT = 3
#: Seconds between checks of a waiting connection (did the process give up?).
_POLL_S = 0.2
#: Longest socket timeout the child sets (s; ``milarun jobs`` allows 7 days).
_SOCKET_S = 1e7


class BarrierTimeout(RuntimeError):
    """No release within the timeout (or the server could not be reached).

    ``fail_reason`` is the ``error.reason`` of the child's FAIL record.
    """

    fail_reason = "barrier-timeout"


class _Wave:
    def __init__(self, labels: Iterable[str]) -> None:
        self.labels = set(labels)
        self.arrived: dict[str, float] = {}  # label -> server time of arrival
        self.dropped: set[str] = set()
        self.waiting: set[str] = set()  # labels with a connection open now (one each at most)
        self.released: float | None = None  # server time of the release
        self.event = threading.Event()


class BarrierServer:
    """The launcher's side: a TCP server releasing each wave once all of it arrived.

    Args:
        host: address to listen on (``127.0.0.1`` or ``::1`` for one host; the main
            node's address, or ``0.0.0.0`` / ``::`` for a name, when processes on
            other nodes connect). An IPv6 address listens on an IPv6 socket.
        port: TCP port (0: one the system picks).
        clock: Unix-time clock (s) of the releases.
        secret: what a connection must send (default: a fresh
            ``secrets.token_hex(16)``).
        connect: the host the children connect to (default ``host``), for
            :attr:`address`.
        max_pending: connections still sending their request line, at most; a
            new one closes the oldest.
        read_s: seconds a connection has to send its request line.
        log: called with one line (str) when the accept loop meets trouble
            (default: stderr); never for a single connection.

    Raises:
        OSError: the socket cannot be bound.

    Attributes:
        port: the port listened on.
        address: ``"host:port"`` for the children (IPv6 in brackets).
        secret: the session's secret (:data:`ENV_SECRET` of the children).
        strangers: connections refused so far (no or a wrong secret, a garbled,
            huge or unfinished line, or closed by a flood of new ones).
        stranger_peers: up to three of their addresses.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.time,
        secret: str | None = None,
        connect: str | None = None,
        max_pending: int = MAX_PENDING,
        read_s: float = _READ_S,
        log: Callable[[str], object] | None = None,
    ) -> None:
        self.clock = clock
        self.secret = secret or secrets.token_hex(16)
        self._secret = self.secret.encode()
        self.max_pending = max(1, int(max_pending))
        self.read_s = float(read_s)
        self._log = log or _stderr_line
        self._logged: set[object] = set()
        self.strangers = 0
        self.stranger_peers: list[str] = []
        self._lock = threading.Lock()
        self._waves: dict[str, _Wave] = {}
        # token -> connection, oldest first
        self._pending: collections.OrderedDict[object, socket.socket] = collections.OrderedDict()
        self._closing = False
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and host == "::":
                # the wildcard serves IPv4 nodes too, where the kernel allows it
                try:
                    self._sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                except (OSError, AttributeError):
                    pass
            self._sock.bind((host, port))
            self._sock.listen(socket.SOMAXCONN)
        except OSError:
            self._sock.close()
            raise
        self.port = self._sock.getsockname()[1]
        self.address = join_address(connect or host, self.port)
        self._thread: threading.Thread | None = None

    def start(self) -> BarrierServer:
        """Start accepting connections (a daemon thread); returns self."""
        self._thread = threading.Thread(target=self._accept, name="milarun-barrier", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving: waiting connections are closed unreleased."""
        self._closing = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            for wave in self._waves.values():
                wave.event.set()
            for conn in self._pending.values():
                _shut(conn)

    def __enter__(self) -> BarrierServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def expect(self, wave: str, labels: Iterable[str]) -> None:
        """Declare ``wave`` and its processes' ``labels`` (before they start)."""
        with self._lock:
            self._waves[wave] = _Wave(labels)

    def drop(self, wave: str, label: str) -> None:
        """Stop waiting for ``label`` of ``wave`` (its process ended before arriving).
        A label that already arrived, or an unknown wave, is left alone."""
        with self._lock:
            w = self._waves.get(wave)
            if w is None or label in w.arrived or label not in w.labels:
                return
            w.dropped.add(label)
            self._check(w)

    def state(self, wave: str) -> dict[str, Any] | None:
        """``{"labels", "arrived": {label: server time}, "dropped", "released"}`` of
        ``wave`` (None when unknown)."""
        with self._lock:
            w = self._waves.get(wave)
            if w is None:
                return None
            return {
                "labels": sorted(w.labels),
                "arrived": dict(w.arrived),
                "dropped": sorted(w.dropped),
                "released": w.released,
            }

    def _check(self, w: _Wave) -> None:
        # under self._lock
        if w.released is None and w.arrived and w.labels <= set(w.arrived) | w.dropped:
            w.released = self.clock()
            w.event.set()

    def _log_once(self, kind: object, line: str) -> None:
        # one line per kind of trouble: a flood must not flood the launcher's output
        if kind not in self._logged:
            self._logged.add(kind)
            try:
                self._log(line)
            except Exception:  # noqa: BLE001 - a broken log never stops the barrier
                pass

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, peer = self._sock.accept()
            except OSError as exc:
                if self._closing:
                    return
                if exc.errno in (errno.EBADF, errno.EINVAL, errno.ENOTSOCK):
                    self._log_once("dead", f"milarun: the start barrier stopped ({exc})")
                    return
                # EMFILE, ENFILE, ENOBUFS, ECONNABORTED...: the listening socket is
                # fine; pause (descriptors free up as connections end) and go on
                self._log_once(
                    exc.errno,
                    "milarun: warning: the start barrier could not "
                    f"accept a connection ({exc.strerror or exc}); "
                    "retrying",
                )
                time.sleep(_BACKOFF_S)
                continue
            except Exception as exc:  # noqa: BLE001 - the loop must outlive anything
                self._log_once("other", f"milarun: warning: the start barrier: {exc!r}")
                time.sleep(_BACKOFF_S)
                continue
            token = object()
            with self._lock:
                if len(self._pending) >= self.max_pending:
                    # a child sends its line at once: the oldest silent one is a stranger
                    _, oldest = self._pending.popitem(last=False)
                    _shut(oldest)  # its thread then counts it
                self._pending[token] = conn
            try:
                threading.Thread(
                    target=self._serve,
                    args=(conn, peer, token),
                    name="milarun-barrier-conn",
                    daemon=True,
                ).start()
            except Exception:  # noqa: BLE001 - no thread left: refuse this one
                with self._lock:
                    self._pending.pop(token, None)
                    self._stranger(peer)
                _close(conn)

    def _stranger(self, peer: Any) -> None:
        # under self._lock
        self.strangers += 1
        host = peer[0] if isinstance(peer, tuple) and peer else str(peer)
        if host not in self.stranger_peers and len(self.stranger_peers) < _PEERS_KEPT:
            self.stranger_peers.append(host)

    def _serve(self, conn: socket.socket, peer: Any, token: object) -> None:
        try:
            self._handle(conn, peer, token)
        except Exception:  # noqa: BLE001 - a broken connection: its process fails on its side
            pass
        finally:
            with self._lock:  # out of _pending before the descriptor is closed
                self._pending.pop(token, None)
            _close(conn)

    def _handle(self, conn: socket.socket, peer: Any, token: object) -> None:
        label: Any  # a str once the wave has it (checked below)
        try:
            request = _read_line(conn, deadline=time.monotonic() + self.read_s)
            given = request.get("secret")
            wave_id, label = request.get("wave"), request.get("label")
            trusted = isinstance(given, str) and hmac.compare_digest(
                given.encode("utf-8", "replace"), self._secret
            )
        except Exception:  # noqa: BLE001 - garbled, huge, not UTF-8, too deep, cut short
            trusted = False
        if not trusted:
            with self._lock:
                self._stranger(peer)
            _send_quiet(conn, REFUSED)
            return
        with self._lock:
            if self._pending.pop(token, None) is None:
                return  # closed for a newer one while reading: its process connects again
            # a process of the session from here on: never closed for a newer one
            w = self._waves.get(wave_id) if isinstance(wave_id, str) else None
            if (
                w is None
                or not isinstance(label, str)
                or label not in w.labels
                or label in w.waiting
            ):
                w = None
            else:
                w.waiting.add(label)
                w.arrived[label] = self.clock()
                w.dropped.discard(label)
                self._check(w)
        if w is None:
            _send_quiet(conn, REFUSED)
            return
        conn.settimeout(self.read_s)  # for the release line: not what was left of the read
        try:
            while not w.event.wait(_POLL_S):
                if _hung_up(conn):
                    with self._lock:  # it gave up waiting: the others go on without it
                        w.arrived.pop(label, None)
                        w.dropped.add(label)
                        self._check(w)
                    return
            if w.released is None or self._closing:
                return
            _send(conn, {"go": w.released, "parties": len(w.labels), "arrived": len(w.arrived)})
        finally:
            with self._lock:
                w.waiting.discard(label)


def _stderr_line(line: str) -> None:
    say(line)


def _shut(conn: socket.socket) -> None:
    # wakes the thread reading it (recv returns b""); it closes the descriptor
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _close(conn: socket.socket) -> None:
    try:
        conn.close()
    except OSError:
        pass


class _Closed(ConnectionError):
    """The peer closed the connection before sending a byte."""


def _read_line(conn: socket.socket, deadline: float | None = None) -> dict[str, Any]:
    """The JSON object of one request or reply line of ``conn``.

    ``deadline`` (``time.monotonic()`` s) bounds the whole line, not each
    ``recv`` (a peer sending a byte at a time does not hold a connection longer).

    Raises:
        _Closed: closed before any byte; OSError: a broken connection or the
            timeout; ValueError: longer than ``_LINE_BYTES``, not UTF-8, not a
            JSON object.
    """
    data = b""
    while not data.endswith(b"\n"):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("request line too slow")
            conn.settimeout(left)
        chunk = conn.recv(_LINE_BYTES)
        if not chunk:
            if not data:
                raise _Closed("closed without a reply")
            break
        data += chunk
        if len(data) > _LINE_BYTES:
            raise ValueError("line too long")
    try:
        value = json.loads(data.decode())
    except RecursionError:
        raise ValueError("line nested too deep") from None
    if not isinstance(value, dict):
        raise ValueError("line is not an object")
    return value


def _send(conn: socket.socket, obj: Any) -> None:
    conn.sendall((json.dumps(obj) + "\n").encode())


def _send_quiet(conn: socket.socket, obj: Any) -> None:
    try:
        _send(conn, obj)
    except OSError:
        pass


def _hung_up(conn: socket.socket) -> bool:
    # poll, not select: select fails on a descriptor past 1024 (a raised ulimit -n)
    try:
        poller = select.poll()
        poller.register(conn, select.POLLIN)
        return bool(poller.poll(0)) and conn.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def join_address(host: object, port: int | str) -> str:
    """``"host:port"``, an IPv6 host in brackets (``"[::1]:4000"``), for
    :func:`split_address`."""
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def split_address(address: object) -> tuple[str, int]:
    """``"host:port"`` → ``(host, port)``.

    Raises:
        ValueError: no port, or a port that is not a number from 1 to 65535.
    """
    host, sep, port = str(address).rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"barrier address {address!r} must look like host:port")
    return host.strip("[]"), int(port)


def from_environment(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """``{"address", "wave", "label", "timeout", "secret"}`` from the plan's variables,
    or None when this process was launched alone (no ``MILARUN_BARRIER``).

    Raises:
        ValueError: a malformed address or timeout.
    """
    environ = os.environ if environ is None else environ
    address = environ.get(ENV_ADDRESS)
    if not address:
        return None
    split_address(address)
    try:
        timeout = float(environ.get(ENV_TIMEOUT) or BARRIER_TIMEOUT_S)
    except ValueError:
        raise ValueError(f"${ENV_TIMEOUT} is not a number of seconds") from None
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"${ENV_TIMEOUT} must be a positive, finite number of seconds")
    return {
        "address": address,
        "wave": environ.get(ENV_WAVE, ""),
        "label": environ.get(ENV_LABEL, "0"),
        "timeout": timeout,
        "secret": environ.get(ENV_SECRET, ""),
    }


def wait(
    address: str,
    wave: str,
    label: str,
    timeout: float,
    clock: Callable[[], float] = time.time,
    secret: str = "",
) -> dict[str, Any]:
    """Wait at the barrier of ``wave`` until every process of it arrived.

    Args:
        address: the server's ``"host:port"``.
        wave, label: this process's wave id and device label.
        timeout: seconds to wait in all (connecting included; a connection the
            server closed unanswered, under a flood of strangers, is made again).
        clock: Unix-time clock (s).
        secret: the session's secret (:data:`ENV_SECRET`); never in the result.

    Returns:
        ``{"address", "wave", "label", "parties", "arrived_count", "arrived"
        (Unix time this process arrived), "released" (Unix time it was released,
        its own clock), "server_release" (the server's Unix time of the release),
        "wait_s", "timeout_s"}``.

    Raises:
        BarrierTimeout: no release within ``timeout`` s, the server could not be
            reached, or it refused the wave.
    """
    host, port = split_address(address)
    start = clock()
    deadline = time.monotonic() + timeout
    last_error: object = None
    reply: dict[str, Any] | None = None
    while reply is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BarrierTimeout(
                f"cannot reach the start barrier at {address} within {timeout:g} s ({last_error})"
            )
        try:
            sock = socket.create_connection((host, port), timeout=min(left, 10.0))
        except OSError as exc:
            last_error = exc.strerror or exc
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            continue
        with sock:
            try:
                _send(sock, {"secret": secret, "wave": wave, "label": label})
                # a socket timeout past ~1e9 s overflows the C time_t: wait at most _SOCKET_S
                sock.settimeout(min(max(0.001, deadline - time.monotonic()), _SOCKET_S))
                reply = _read_line(sock)
            except TimeoutError:
                raise BarrierTimeout(
                    f"the other processes of wave {wave} did not reach the "
                    f"start barrier within {timeout:g} s"
                ) from None
            except ConnectionError as exc:
                # closed unanswered (a flood of strangers pushed this one out): again
                last_error = f"the server closed the connection: {exc}"
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            except (OSError, ValueError) as exc:
                raise BarrierTimeout(
                    f"the start barrier at {address} closed the connection "
                    f"before the release ({exc})"
                ) from None
    released = clock()
    if "error" in reply or "go" not in reply:
        raise BarrierTimeout(
            f"the start barrier at {address} refused this process: "
            f"{reply.get('error', 'no release')}"
        )
    return {
        "address": address,
        "wave": wave,
        "label": label,
        "parties": int(reply.get("parties", 0)),
        "arrived_count": int(reply.get("arrived", 0)),
        "arrived": start,
        "released": released,
        "server_release": float(reply["go"]),
        "wait_s": max(0.0, released - start),
        "timeout_s": float(timeout),
    }
