"""The start barrier of a concurrent wave: served by the launcher over TCP. No torch.

Every process of a concurrent wave (the per-GPU children of a test, on one
node or on every node; the torchrun launches of an ``njobs`` test; the
processes of a ``multi-process`` test) finishes its set-up, then waits here
before its timed loop, so that all timed loops start together (DLBS does the
same with a semaphore, ``DLBS_TENSORRT_SYNCH_BENCHMARKS``). A socket works
where a file or a semaphore would not: across nodes, and from inside student
cgroups (which confine CPUs and memory, not the network).

Protocol: one TCP connection per process, one JSON line each way::

    child  -> server  {"wave": "<wave id>", "label": "<device label>"}
    server -> child   {"go": <server's Unix time of the release>, "parties": n,
                       "arrived": k}                 once every process is there
                      {"error": "<why>"}             an unknown wave or label

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

import json
import math
import os
import select
import socket
import threading
import time

#: Environment variables the plan gives each process of a concurrent wave.
ENV_ADDRESS = "MILARUN_BARRIER"            # "host:port" of the launcher's server
ENV_WAVE = "MILARUN_BARRIER_WAVE"          # the wave's id
ENV_TIMEOUT = "MILARUN_BARRIER_TIMEOUT"    # seconds a process waits at most
ENV_LABEL = "MILARUN_DEVICE"               # the process's device label (set for every launch)
#: What the three barrier variables start with (a rerun or a lone process drops them).
ENV_PREFIX = "MILARUN_BARRIER"


def without_barrier(environ):
    """``environ`` (a dict) without the ``MILARUN_BARRIER*`` variables: for a process
    that runs alone (``milarun rerun``), whose session's barrier is long gone."""
    return {k: v for k, v in environ.items() if not k.startswith(ENV_PREFIX)}

#: Default of ``milarun jobs --barrier-timeout``: seconds a process that finished its
#: set-up waits for the slowest of its wave (data sets are read, models built).
BARRIER_TIMEOUT_S = 600.0

#: Longest request line accepted (bytes); seconds a connection has to send it.
_LINE_BYTES = 4096
_READ_S = 30.0
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
    def __init__(self, labels):
        self.labels = set(labels)
        self.arrived = {}       # label -> server time of arrival
        self.dropped = set()
        self.released = None    # server time of the release
        self.event = threading.Event()


class BarrierServer:
    """The launcher's side: a TCP server releasing each wave once all of it arrived.

    Args:
        host: address to listen on (``127.0.0.1`` for one host, ``0.0.0.0`` when
            processes on other nodes connect).
        port: TCP port (0: one the system picks).
        clock: Unix-time clock (s) of the releases.

    Raises:
        OSError: the socket cannot be bound.

    Attributes:
        port: the port listened on.
    """

    def __init__(self, host="127.0.0.1", port=0, clock=time.time):
        self.clock = clock
        self._lock = threading.Lock()
        self._waves = {}
        self._closing = False
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
            self._sock.listen(128)
        except OSError:
            self._sock.close()
            raise
        self.port = self._sock.getsockname()[1]
        self._thread = None

    def start(self):
        """Start accepting connections (a daemon thread); returns self."""
        self._thread = threading.Thread(target=self._accept, name="milarun-barrier",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self):
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

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def expect(self, wave, labels):
        """Declare ``wave`` and its processes' ``labels`` (before they start)."""
        with self._lock:
            self._waves[wave] = _Wave(labels)

    def drop(self, wave, label):
        """Stop waiting for ``label`` of ``wave`` (its process ended before arriving).
        A label that already arrived, or an unknown wave, is left alone."""
        with self._lock:
            w = self._waves.get(wave)
            if w is None or label in w.arrived or label not in w.labels:
                return
            w.dropped.add(label)
            self._check(w)

    def state(self, wave):
        """``{"labels", "arrived": {label: server time}, "dropped", "released"}`` of
        ``wave`` (None when unknown)."""
        with self._lock:
            w = self._waves.get(wave)
            if w is None:
                return None
            return {"labels": sorted(w.labels), "arrived": dict(w.arrived),
                    "dropped": sorted(w.dropped), "released": w.released}

    def _check(self, w):
        # under self._lock
        if w.released is None and w.arrived and w.labels <= set(w.arrived) | w.dropped:
            w.released = self.clock()
            w.event.set()

    def _accept(self):
        while not self._closing:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            with conn:
                conn.settimeout(_READ_S)
                request = _read_line(conn)
                wave_id, label = request.get("wave"), request.get("label")
                if not (isinstance(wave_id, str) and isinstance(label, str)):
                    # a stray client (a port scan, a garbled line): no thread traceback
                    _send(conn, {"error": "wave and label must be strings"})
                    return
                with self._lock:
                    w = self._waves.get(wave_id)
                    if w is None or label not in w.labels:
                        what = "wave" if w is None else "label"
                        _send(conn, {"error": f"unknown {what}: "
                                              f"{request.get(what)!r}"[:200]})
                        return
                    w.arrived[label] = self.clock()
                    w.dropped.discard(label)
                    self._check(w)
                while not w.event.wait(_POLL_S):
                    if _hung_up(conn):
                        with self._lock:  # it gave up waiting: the others go on without it
                            w.arrived.pop(label, None)
                            w.dropped.add(label)
                            self._check(w)
                        return
                if w.released is None or self._closing:
                    return
                _send(conn, {"go": w.released, "parties": len(w.labels),
                             "arrived": len(w.arrived)})
        except (OSError, ValueError):
            pass  # a broken connection: that process fails on its side


def _read_line(conn):
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(_LINE_BYTES)
        if not chunk:
            break
        data += chunk
        if len(data) > _LINE_BYTES:
            raise ValueError("request too long")
    value = json.loads(data.decode())
    if not isinstance(value, dict):
        raise ValueError("request is not an object")
    return value


def _send(conn, obj):
    conn.sendall((json.dumps(obj) + "\n").encode())


def _hung_up(conn):
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def split_address(address):
    """``"host:port"`` → ``(host, port)``.

    Raises:
        ValueError: no port, or a port that is not a number from 1 to 65535.
    """
    host, sep, port = str(address).rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"barrier address {address!r} must look like host:port")
    return host.strip("[]"), int(port)


def from_environment(environ=None):
    """``{"address", "wave", "label", "timeout"}`` from the plan's variables, or None
    when this process was launched alone (no ``MILARUN_BARRIER``).

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
    return {"address": address, "wave": environ.get(ENV_WAVE, ""),
            "label": environ.get(ENV_LABEL, "0"), "timeout": timeout}


def wait(address, wave, label, timeout, clock=time.time):
    """Wait at the barrier of ``wave`` until every process of it arrived.

    Args:
        address: the server's ``"host:port"``.
        wave, label: this process's wave id and device label.
        timeout: seconds to wait in all (connecting included).
        clock: Unix-time clock (s).

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
    last_error = None
    sock = None
    while sock is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BarrierTimeout(f"cannot reach the start barrier at {address} within "
                                 f"{timeout:g} s ({last_error})")
        try:
            sock = socket.create_connection((host, port), timeout=min(left, 10.0))
        except OSError as exc:
            last_error = exc.strerror or exc
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    with sock:
        try:
            _send(sock, {"wave": wave, "label": label})
            # a socket timeout past ~1e9 s overflows the C time_t: wait at most _SOCKET_S
            sock.settimeout(min(max(0.001, deadline - time.monotonic()), _SOCKET_S))
            reply = _read_line(sock)
        except socket.timeout:
            raise BarrierTimeout(f"the other processes of wave {wave} did not reach the "
                                 f"start barrier within {timeout:g} s") from None
        except (OSError, ValueError) as exc:
            raise BarrierTimeout(f"the start barrier at {address} closed the connection "
                                 f"before the release ({exc})") from None
    released = clock()
    if "error" in reply or "go" not in reply:
        raise BarrierTimeout(f"the start barrier at {address} refused this process: "
                             f"{reply.get('error', 'no release')}")
    return {"address": address, "wave": wave, "label": label,
            "parties": int(reply.get("parties", 0)),
            "arrived_count": int(reply.get("arrived", 0)),
            "arrived": start, "released": released, "server_release": float(reply["go"]),
            "wait_s": max(0.0, released - start), "timeout_s": float(timeout)}
