"""An OpenAI-compatible serving engine: started here (:class:`Server`, its command line from
:func:`engine_command`), or run by someone else and described (:func:`describe`). No torch here.

Three engines are known (:data:`ENGINES`):

- ``transformers``: ``transformers serve`` (Hugging Face transformers >= 5, the
  ``transformers[serving]`` extra: FastAPI and uvicorn), CPU or GPU, one device.
- ``vllm``: ``vllm serve`` (https://docs.vllm.ai/en/latest/cli/serve.html).
- ``sglang``: ``python -m sglang.launch_server``
  (https://docs.sglang.io/advanced_features/server_arguments.html).

Every one of them answers ``GET /v1/models`` with the OpenAI models list once its model is
loaded (https://platform.openai.com/docs/api-reference/models/list): that is how
:meth:`Server.wait_ready` knows it can take requests.

Reading an endpoint is bounded (:func:`_get`): one deadline for the whole exchange, enforced
by a watchdog that shuts the socket down, so a server that trickles its headers or its body a
byte at a time cannot hold us past it; at most ``max_bytes`` of a body are read; redirects are
not followed.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
import time
import types
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import MilarunError
from ..formats.jsonfile import parse_json
from ..formats.terminal import one_line
from ..host.supervise import ProcessGroup, supervised_argv, terminate_group

#: The engines :func:`engine_command` knows.
ENGINES: tuple[str, ...] = ("transformers", "vllm", "sglang")

#: milarun precision → the ``--dtype`` the engines take (all three spell them as torch does).
DTYPES: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}

#: Python code that runs the ``transformers`` console script's Typer app with the arguments
#: after it. Not ``-m transformers.cli.transformers``: its ``main()`` first asks PyPI for a
#: newer release (``check_cli_update``), a network call a benchmark must not make.
_TRANSFORMERS_CLI = "from transformers.cli.transformers import app; app()"

#: Largest body of ``GET /version`` taken as the engine's version (bytes).
_VERSION_MAX_BYTES = 4096

#: Longest single poll of ``/v1/models`` in :meth:`Server.wait_ready` (seconds).
_POLL_TIMEOUT_S = 5.0


class ServerError(MilarunError):
    """A serving engine did not start, answer or stop as it should. ``str(err)`` is one
    line; with ``log``, it ends with the last non-empty line of the server's log, and the
    log's last lines are kept in :attr:`log_tail`."""

    def __init__(
        self, message: str, *, log: str = "", path: str | None = None, key: str | None = None
    ) -> None:
        lines = [line for line in log.splitlines() if line.strip()]
        if lines:
            message = f"{message}: {lines[-1].strip()}"
        # path and key: the prefix MilarunError puts first (parse_json names the URL there).
        super().__init__(
            one_line(message),
            path=None if path is None else one_line(path),
            key=None if key is None else one_line(key),
        )
        self.log_tail = log


def _dtype(precision: str) -> str:
    """The engines' ``--dtype`` for a milarun precision; ValueError (one line) if unknown."""
    if precision not in DTYPES:
        raise ValueError(f"precision must be one of {', '.join(DTYPES)}, not {precision!r}")
    return DTYPES[precision]


def engine_command(
    engine: str,
    model_dir: str,
    *,
    host: str,
    port: int,
    device: str,
    dtype: str,
    tensor_parallel: int = 1,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line that serves ``model_dir`` with ``engine`` on ``host:port``.

    Args:
        engine: one of :data:`ENGINES`.
        model_dir: a Hugging Face model folder (config, safetensors weights, tokenizer).
        host, port: where the engine listens.
        device: ``transformers`` only (``"cpu"``, ``"cuda:0"``, ``"auto"``); vLLM and SGLang
            take the GPUs ``CUDA_VISIBLE_DEVICES`` shows them.
        dtype: a milarun precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        tensor_parallel: GPUs the model is split over (vLLM, SGLang).
        extra_args: appended as they are.

    The ``transformers`` command runs the ``transformers serve`` CLI of this interpreter's
    environment with continuous batching (its paged-attention scheduler) and seed 0; it was
    run here on CPU. The ``vllm`` command (the ``vllm`` console script beside this
    interpreter, else the one on ``PATH``) and the ``sglang`` one (``python -m
    sglang.launch_server``) are written against the engines' documentation (URLs in the
    module's docstring) and have not been run yet: no GPU to run them on.

    Raises:
        ValueError: an unknown engine or precision, a tensor-parallel size below 1, or above
            1 for ``transformers`` (one line).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    torch_dtype = _dtype(dtype)
    if isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int):
        raise ValueError(f"tensor_parallel must be an integer, not {tensor_parallel!r}")
    if tensor_parallel < 1:
        raise ValueError(f"tensor_parallel must be 1 or more, not {tensor_parallel}")
    model_dir = os.fspath(model_dir)
    if engine == "transformers":
        if tensor_parallel != 1:
            raise ValueError(
                f"the transformers engine serves on one device: tensor_parallel must be 1, "
                f"not {tensor_parallel}"
            )
        argv = [sys.executable, "-c", _TRANSFORMERS_CLI, "serve", model_dir]
        argv += ["--continuous-batching", "--device", device, "--dtype", torch_dtype]
        argv += ["--host", host, "--port", str(port), "--log-level", "info"]
        argv += ["--default-seed", "0"]
    elif engine == "vllm":
        # The console script installed with this interpreter's vllm, so the engine is the
        # one of this environment even when its bin/ is not on PATH.
        beside = Path(sys.executable).parent / "vllm"
        argv = [str(beside) if beside.is_file() else "vllm", "serve", model_dir]
        argv += ["--host", host, "--port", str(port), "--dtype", torch_dtype]
        argv += ["--tensor-parallel-size", str(tensor_parallel), "--seed", "0"]
    else:
        argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_dir]
        argv += ["--host", host, "--port", str(port), "--dtype", torch_dtype]
        argv += ["--tp", str(tensor_parallel), "--random-seed", "0"]
    return argv + [str(a) for a in extra_args]


def _split_url(url: str) -> tuple[str, str, int, str]:
    """``(scheme, host, port, path prefix)`` of an ``http://`` or ``https://`` base URL.

    Raises:
        ServerError: another scheme, no host, or a bad port (one line).
    """
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ServerError(f"not a server URL: {url!r} ({exc})")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServerError(f"not an http:// or https:// server URL: {url!r}")
    default = 443 if parts.scheme == "https" else 80
    return parts.scheme, parts.hostname, port or default, parts.path.rstrip("/")


def _get(
    url: str, path: str, deadline: float, max_bytes: int
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """``GET {url}{path}``: ``(status, headers, body)``, all of it by ``deadline``
    (``time.monotonic()``), the body at most ``max_bytes`` bytes; redirects are returned,
    not followed.

    The socket's timeout bounds each connect and read; a watchdog thread shuts the socket
    down at ``deadline`` so that a server sending a byte at a time cannot stretch the total
    (http.client bounds the headers themselves: 100 lines of at most 64 KiB).

    Raises:
        ServerError: unreachable, no full answer by the deadline, or a body over
            ``max_bytes`` (one line).
    """
    scheme, host, port, prefix = _split_url(url)
    where = f"{url.rstrip('/')}{path}"
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise ServerError(f"{where}: no time left to ask")
    cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    conn = cls(host, port, timeout=remaining)
    cut = threading.Event()

    def watchdog() -> None:
        # At the deadline: wake a read blocked in the socket (close() would not).
        cut.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    timer = threading.Timer(remaining, watchdog)
    timer.daemon = True
    timer.start()
    try:
        conn.request("GET", prefix + path, headers={"Accept": "application/json"})
        resp = conn.getresponse()
        if resp.length is not None and resp.length > max_bytes:
            raise ServerError(f"{where}: a body of {resp.length} bytes, over {max_bytes}")
        body = resp.read(max_bytes + 1)
        if cut.is_set():
            # Cut at the deadline: what was read may look whole (headers ended by the
            # shutdown's end of file, an empty body) but is not.
            raise ServerError(f"{where}: no full answer within the time allowed")
        if len(body) > max_bytes:
            raise ServerError(f"{where}: a body over {max_bytes} bytes")
        return resp.status, resp.msg, body
    except (OSError, http.client.HTTPException) as exc:
        if cut.is_set() or isinstance(exc, TimeoutError):
            raise ServerError(f"{where}: no full answer within the time allowed")
        raise ServerError(f"{where}: {type(exc).__name__}: {exc}")
    finally:
        timer.cancel()
        conn.close()


def _model_ids(url: str, body: bytes) -> list[str]:
    """The model IDs of an OpenAI models list (``{"object": "list", "data": [{"id": …}]}``).

    Raises:
        ServerError: not JSON, or not that shape (one line).
    """
    where = f"{url.rstrip('/')}/v1/models"
    doc = parse_json(body, path=where, error_cls=ServerError)
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list) or not all(
        isinstance(m, dict) and isinstance(m.get("id"), str) for m in data
    ):
        raise ServerError(f"{where}: not an OpenAI models list ({{'data': [{{'id': ...}}]}})")
    return [m["id"] for m in data]


class Server:
    """One engine process in a process group of its own (``start_new_session``), its stdout
    and stderr in ``log_path``, stopped with :func:`~milarun.host.supervise.terminate_group`.

    It is started under a parent-death signal (``supervised_argv``): if we die, it dies. The
    kernel ties that signal to the thread that started it, so call :meth:`start` from a
    thread that outlives the server (the main one). Its processes must stay in its group
    to be stopped: one that starts a session of its own escapes :meth:`stop`.
    ``with Server(...) as server:`` does not start it; leaving the block stops it.

    Args:
        argv: the command line (:func:`engine_command`).
        log_path: the log file, truncated at :meth:`start`.
        url: the base URL it will answer at (``http://127.0.0.1:PORT``).
        env: its whole environment (None: ours).

    Raises:
        ValueError: an empty ``argv``.
        ServerError: ``url`` is not an ``http://`` or ``https://`` URL (one line).
    """

    def __init__(
        self,
        argv: Sequence[str],
        log_path: str | os.PathLike[str],
        *,
        url: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not argv:
            raise ValueError("argv is empty")
        _split_url(url)  # a bad URL fails here, not after the engine has started
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.url = url.rstrip("/")
        self.env = dict(env) if env is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopped = False

    def start(self) -> None:
        """Start the engine.

        Raises:
            ServerError: already started, or the command cannot be run (one line).
        """
        if self._proc is not None:
            raise ServerError(f"the server for {self.url} was already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            try:
                self._proc = subprocess.Popen(
                    supervised_argv(self.argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ServerError(f"cannot run {self.argv[0]}: {exc.strerror or exc}")

    def _running(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise ServerError(f"the server for {self.url} was not started")
        return self._proc

    def wait_ready(self, timeout_s: float, poll_s: float = 0.25) -> float:
        """Wait until ``GET {url}/v1/models`` answers 200 with an OpenAI models list.

        Returns:
            the seconds waited in this call.

        Raises:
            ServerError: not started; the process exited first ("the server exited with
                status N before it was ready: <its log's last line>"); or not ready after
                ``timeout_s`` seconds. The server is left running: :meth:`stop` it (leaving
                a ``with`` block does).
        """
        proc = self._running()
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            status = proc.poll()
            if status is not None:
                raise ServerError(
                    f"the server exited with status {status} before it was ready",
                    log=self.log_tail(),
                )
            now = time.monotonic()
            if now >= deadline:
                break
            try:
                code, _headers, body = _get(
                    self.url, "/v1/models", min(deadline, now + _POLL_TIMEOUT_S), 2**20
                )
                if code == 200:
                    _model_ids(self.url, body)
                    return time.monotonic() - started
            except ServerError:
                pass  # not listening yet, or still loading: ask again
            time.sleep(max(0.0, min(poll_s, deadline - time.monotonic())))
        raise ServerError(
            f"the server at {self.url} was not ready after {timeout_s:g} s", log=self.log_tail()
        )

    def alive(self) -> bool:
        """True while the engine process runs."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The engine's exit status (negative: the signal that ended it), None while it runs
        or before it started."""
        return None if self._proc is None else self._proc.poll()

    def stop(self, grace_s: float = 10.0) -> int | None:
        """Stop the engine and every process of its group: SIGTERM, ``grace_s`` seconds,
        then SIGKILL (:func:`~milarun.host.supervise.terminate_group`); returns once no
        process of the group is left (so its GPU memory is free). Idempotent.

        Returns:
            the exit status, None if it was never started.

        Raises:
            ServerError: a process of the group still runs a minute after SIGKILL (stuck in
                the kernel, e.g. in a driver call).
        """
        if self._proc is None:
            return None
        if not self._stopped:
            abandoned = terminate_group(ProcessGroup(self._proc, until="members"), grace_s)
            self._stopped = True
            if abandoned:
                raise ServerError(f"the server's process group {self._proc.pid} survived SIGKILL")
        return self._proc.poll()

    def log_tail(self, lines: int = 20, max_bytes: int = 8192) -> str:
        """The last ``lines`` lines of the log, from its last ``max_bytes`` bytes (undecodable
        bytes replaced); "" when there is no log."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                raw = f.read(max_bytes)
        except OSError:
            return ""
        text = raw.decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:]) if lines > 0 else ""

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.stop()


def describe(url: str, *, timeout_s: float = 10.0, max_bytes: int = 2**20) -> dict[str, Any]:
    """What an OpenAI-compatible server at ``url`` reports of itself, all within ``timeout_s``
    seconds and reading at most ``max_bytes`` of each body.

    Returns:
        ``{"url": url, "models": [the IDs of GET /v1/models], "server": its "Server" response
        header or None, "version": the JSON of GET /version (vLLM has it) when that answers 200
        with at most 4 KiB of JSON in the time left, else None}``.

    Raises:
        ServerError: ``/v1/models`` is unreachable, answers something else than 200 (a
            redirect included: not followed), a body over ``max_bytes``, or not the OpenAI
            models list (one line).
    """
    deadline = time.monotonic() + timeout_s
    status, headers, body = _get(url, "/v1/models", deadline, max_bytes)
    where = f"{url.rstrip('/')}/v1/models"
    if status != 200:
        raise ServerError(f"{where}: HTTP {status}, not 200")
    models = _model_ids(url, body)
    version: Any = None
    try:
        code, _headers, raw = _get(url, "/version", deadline, min(max_bytes, _VERSION_MAX_BYTES))
        if code == 200:
            version = parse_json(raw, path=f"{url}/version", error_cls=ServerError)
    except ServerError:
        pass  # no version endpoint (transformers, SGLang), or no time left: None
    return {"url": url, "models": models, "server": headers.get("server"), "version": version}


__all__ = ["ENGINES", "DTYPES", "ServerError", "Server", "engine_command", "describe"]
