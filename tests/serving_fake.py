"""A fake OpenAI-compatible server for tests (stdlib only), good and hostile.

In-process::

    with FakeServer(ttft_ms=40, tpot_ms=10) as url:   # http://127.0.0.1:<free port>
        ...

As a script, serving until killed (a fake engine for tests that start processes)::

    python tests/serving_fake.py --port 8000 --ttft-ms 40 --tpot-ms 10

It prints ``listening on <url>`` on stdout once it accepts connections.

Endpoints: ``GET /v1/models`` (``{"object": "list", "data": [{"id": model, ...}]}``, 503
until ``ready_after_s`` passed); ``POST /v1/completions`` and ``/v1/chat/completions``.
A streamed request (``"stream": true``) waits ``ttft_ms``, then sends ``max_tokens`` content
chunks ``tpot_ms`` apart (chunked transfer encoding, as vLLM), a chunk with
``finish_reason``, one with ``usage`` and ``data: [DONE]``. Token ``i`` of a prompt is
:func:`token_text` (the same prompt always gives the same text), or ``tokens[i %
len(tokens)]`` when ``tokens`` is given (a server that answers wrongly). Every response
has the header ``Server: fake/1``.

Behaviours (constructor keywords; the same as ``--flags``): ``status`` (every POST answers
that HTTP status), ``fail_every`` k (every k-th POST answers 500), ``malformed`` (a ``data:
not json`` line after the first token), ``endless`` (tokens until the client leaves),
``huge`` (one ``data:`` line of ``huge_bytes`` without newline), ``hang`` (reads the
request, never answers), ``die_after`` k (the (k+1)-th POST crashes the server: it stops
accepting and cuts every connection; a script exits with status 1), ``ready_after_s``,
``no_usage`` (no usage object), ``slots`` k (at most k requests served at once, the
others wait their turn: a server whose latency grows with its load, for the capacity
search). Client disconnects are quiet.
"""

import argparse
import hashlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_WORDS = ("alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa")
_MAX_BODY = 16 * 2**20  # request body bytes the fake accepts


def token_text(prompt: str, index: int) -> str:
    """Token ``index`` of the fake's answer to ``prompt``: a word chosen by a hash."""
    digest = hashlib.sha256(f"{prompt}\0{index}".encode()).digest()
    return " " + _WORDS[int.from_bytes(digest[:4], "big") % len(_WORDS)]


def expected_text(prompt: str, max_tokens: int, tokens: Sequence[str] | None = None) -> str:
    """The whole answer of a fake (with the same ``tokens`` option) to ``prompt``."""
    if tokens:
        return "".join(tokens[i % len(tokens)] for i in range(max_tokens))
    return "".join(token_text(prompt, i) for i in range(max_tokens))


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: "FakeServer"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: a client that went away is part of the tests."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, as real servers
    disable_nagle_algorithm = True  # each token leaves at once: the timings under test
    server: _HTTPServer

    def version_string(self) -> str:
        return "fake/1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.fake._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.fake._track(self.connection, False)

    def handle(self) -> None:
        try:
            super().handle()
        except (OSError, ValueError):  # the client left, or the server died under us
            self.close_connection = True

    # -- helpers

    def _json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _event(self, obj: Any) -> None:
        self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

    # -- endpoints

    def do_GET(self) -> None:
        fake = self.server.fake
        if self.path.rstrip("/") != "/v1/models":
            self._json(404, {"error": "not found"})
        elif time.monotonic() - fake.started < fake.ready_after_s:
            self._json(503, {"error": "loading"})
        else:
            self._json(200, {"object": "list", "data": [{"id": fake.model, "object": "model"}]})

    def do_POST(self) -> None:
        fake = self.server.fake
        n = fake._next_request()
        if fake.die_after is not None and n > fake.die_after:
            self.close_connection = True
            fake.die()
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            self.close_connection = True
            self._json(413, {"error": "too large"})
            return
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError:
            body = None
        path = self.path.rstrip("/")
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._json(404, {"error": "not found"})
            return
        if not isinstance(body, dict):
            self._json(400, {"error": "body is not a JSON object"})
            return
        if fake.hang:
            self.close_connection = True
            fake.stopping.wait()
            return
        status = fake.status or (500 if fake.fail_every and n % fake.fail_every == 0 else None)
        if status:
            self._json(status, {"error": {"message": "fake failure", "code": status}})
            return
        if fake.slots is not None:  # a queue: at most `slots` requests are served at once
            with fake.slots:
                self._serve(path, body, n)
        else:
            self._serve(path, body, n)

    def _serve(self, path: str, body: dict[str, Any], n: int) -> None:
        chat = path == "/v1/chat/completions"
        if chat:
            messages = body.get("messages") or []
            prompt = "\n".join(str(m.get("content", "")) for m in messages)
        else:
            prompt = str(body.get("prompt", ""))
        max_tokens = int(body.get("max_tokens") or 16)
        if body.get("stream"):
            self._stream(chat, prompt, max_tokens, n)
        else:
            self._whole(chat, prompt, max_tokens, n)

    def _usage(self, prompt: str, n_tokens: int) -> dict[str, int]:
        p = len(prompt.split())
        return {"prompt_tokens": p, "completion_tokens": n_tokens, "total_tokens": p + n_tokens}

    def _token(self, prompt: str, i: int) -> str:
        tokens = self.server.fake.tokens
        return tokens[i % len(tokens)] if tokens else token_text(prompt, i)

    def _whole(self, chat: bool, prompt: str, max_tokens: int, n: int) -> None:
        fake = self.server.fake
        if fake.stopping.wait(fake.ttft_ms / 1000):
            return
        text = "".join(self._token(prompt, i) for i in range(max_tokens))
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        out: dict[str, Any] = {
            "id": f"cmpl-{n}",
            "object": "chat.completion" if chat else "text_completion",
            "model": fake.model,
            "choices": [choice],
        }
        if not fake.no_usage:
            out["usage"] = self._usage(prompt, max_tokens)
        self._json(200, out)

    def _stream(self, chat: bool, prompt: str, max_tokens: int, n: int) -> None:
        fake = self.server.fake
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = {
            "id": f"cmpl-{n}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "model": fake.model,
        }

        def choice(text: str, finish: str | None = None) -> dict[str, Any]:
            c: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if chat:
                c["delta"] = {"content": text}
            else:
                c["text"] = text
            return {**base, "choices": [c]}

        if chat:  # as OpenAI and vLLM: a first delta with the role and no content
            self._event({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        if fake.stopping.wait(fake.ttft_ms / 1000):
            return
        if fake.huge:
            self._huge()
            return
        i = 0
        while fake.endless or i < max_tokens:
            if i and fake.stopping.wait(fake.tpot_ms / 1000):
                return
            self._event(choice(self._token(prompt, i)))
            if i == 0 and fake.malformed:
                self._chunk(b"data: not json\n\n")
            i += 1
        self._event(choice("", "length"))
        if not fake.no_usage:
            self._event({**base, "choices": [], "usage": self._usage(prompt, max_tokens)})
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _huge(self) -> None:
        fake = self.server.fake
        block = b"x" * 65536
        self._chunk(b"data: ")
        sent = 0
        while sent < fake.huge_bytes and not fake.stopping.is_set():
            self._chunk(block)
            sent += len(block)
        self._chunk(b"\n\n")
        self._chunk(b"")


class FakeServer:
    """The fake server on ``host``:``port`` (0: a free port), served from a daemon thread.

    ``with FakeServer(...) as url`` starts it and gives its base URL; leaving stops it.
    ``requests`` counts the POST requests received.
    """

    def __init__(
        self,
        *,
        model: str = "fake-model",
        ttft_ms: float = 0.0,
        tpot_ms: float = 0.0,
        status: int | None = None,
        fail_every: int = 0,
        malformed: bool = False,
        endless: bool = False,
        huge: bool = False,
        huge_bytes: int = 64 * 2**20,
        hang: bool = False,
        die_after: int | None = None,
        ready_after_s: float = 0.0,
        tokens: Sequence[str] | None = None,
        no_usage: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
        exit_on_die: bool = False,
        slots: int = 0,
    ) -> None:
        self.model = model
        self.ttft_ms = ttft_ms
        self.tpot_ms = tpot_ms
        self.status = status
        self.fail_every = fail_every
        self.malformed = malformed
        self.endless = endless
        self.huge = huge
        self.huge_bytes = huge_bytes
        self.hang = hang
        self.die_after = die_after
        self.ready_after_s = ready_after_s
        self.tokens = list(tokens) if tokens else None
        self.no_usage = no_usage
        self.exit_on_die = exit_on_die
        self.slots = threading.Semaphore(slots) if slots else None
        self.requests = 0
        self.stopping = threading.Event()
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._dead = False
        self._httpd = _HTTPServer((host, port), _Handler)
        self._httpd.fake = self
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> str:
        """Serve from a daemon thread; returns the base URL."""
        self.started = time.monotonic()
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving, release hung handlers and cut open connections."""
        self.stopping.set()
        self._close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def die(self) -> None:
        """A crash: stop accepting and cut every connection (a script exits, status 1)."""
        self._close()
        if self.exit_on_die:
            os._exit(1)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _next_request(self) -> int:
        with self._lock:
            self.requests += 1
            return self.requests

    def _track(self, conn: socket.socket, open_: bool) -> None:
        with self._lock:
            if open_:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def _close(self) -> None:
        with self._lock:
            if self._dead:
                return
            self._dead = True
            conns = list(self._conns)
        if self._thread is not None:
            self._httpd.shutdown()  # waits for serve_forever to return (a poll interval)
        self._httpd.server_close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--ttft-ms", type=float, default=0.0)
    parser.add_argument("--tpot-ms", type=float, default=0.0)
    parser.add_argument("--status", type=int, default=None)
    parser.add_argument("--fail-every", type=int, default=0)
    parser.add_argument("--malformed", action="store_true")
    parser.add_argument("--endless", action="store_true")
    parser.add_argument("--huge", action="store_true")
    parser.add_argument("--huge-bytes", type=int, default=64 * 2**20)
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--die-after", type=int, default=None)
    parser.add_argument("--ready-after-s", type=float, default=0.0)
    parser.add_argument("--tokens", default=None, help="comma-separated token texts")
    parser.add_argument("--no-usage", action="store_true")
    parser.add_argument("--slots", type=int, default=0, help="requests served at once (0: all)")
    args = vars(parser.parse_args(argv))
    tokens = args.pop("tokens")
    fake = FakeServer(tokens=tokens.split(",") if tokens else None, exit_on_die=True, **args)
    print(f"listening on {fake.start()}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        fake.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
