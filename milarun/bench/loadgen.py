"""Load generator for an OpenAI-compatible serving endpoint (vLLM, SGLang, TGI, ...).

:func:`run_level` sends streamed completions at one load level and records each request's
raw timings as columns (one entry per request, in send order), the input of
:func:`milarun.measure.latency.level_figures`. :func:`complete` sends greedy requests one
at a time and returns their text (the consistency check between engines).

Loads (``Load.kind``):

* ``concurrency`` n: closed loop, n workers each sending its next request when its
  previous one ended (vLLM's ``--max-concurrency``, GenAI-Perf's ``--concurrency``).
* ``rate`` r (requests/s): open loop, Poisson arrivals: inter-arrival times drawn from an
  exponential distribution of mean 1/r with ``random.Random(seed)`` (vLLM's
  ``--request-rate r --burstiness 1``); requests go out on schedule whether earlier ones
  ended or not.
* ``burst`` n: n requests sent at once (MLPerf Inference's Offline scenario).

Timing (``time.perf_counter``, s): a request's send is taken just before its HTTP request
is written; its first token is the first content chunk that arrives (TTFT); the gaps
between successive content chunks are its inter-token latencies (ITL, µs); its end is the
``data: [DONE]`` line, or the connection's close after a finished choice. Chunks that
arrive in one network read share that read's time (a gap of 0 µs): the client sees them
together. Definitions as in :mod:`milarun.measure.latency`. The first requests of a
process also carry the client's one-time start (imports, first connections): what
warm-up requests are for.

A failed request keeps what it measured and gets a short fixed reason (never the server's
text): ``"connect"`` (refused, unreachable, DNS), ``"http <status>"``, ``"timeout"`` (the
request's deadline, :attr:`Limits.request_timeout_s`), ``"too large"`` (more than
:attr:`Limits.max_response_bytes` bytes or one line over :attr:`Limits.max_line_bytes`),
``"malformed stream"`` (a data line that is not a JSON object with ``choices``), ``"server
closed"`` (the connection dropped before ``[DONE]`` or a finished choice), ``"no tokens"``
(the stream ended without content), ``"cancelled"`` (the level's deadline passed).

A hostile endpoint cannot make the client use unbounded memory: the body is read raw
(``Accept-Encoding: identity``: no decompression bomb) in network chunks whose bytes are
counted, one line is buffered at most, and the text kept per request is capped.
"""

import asyncio
import json
import math
import random
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

LOAD_KINDS = ("concurrency", "rate", "burst")
API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

# Text kept per request (characters), for `keep_text`, `complete` and `count_tokens`: an
# endless answer must not fill memory; generated text beyond this is counted, not kept.
MAX_TEXT_CHARS = 2**20

# After the level's deadline, how long cancelled requests get to unwind (s): the closing
# of their connections. Bounds run_level at timeout_s + this.
_CANCEL_GRACE_S = 5.0

_LOAD_FORMS = "concurrency:N (integer N >= 1), rate:R (requests/s, R > 0) or burst:N (N >= 1)"


@dataclass(frozen=True)
class Endpoint:
    """One OpenAI-compatible server.

    Attributes:
        url: base URL (``http://127.0.0.1:8000``); requests go to ``{url}/v1/completions``
            or ``{url}/v1/chat/completions``.
        model: the ``model`` field sent.
        api: ``"completions"`` or ``"chat"``.
        extra: more JSON body fields, sent as given (vLLM's ``ignore_eos``, ``min_tokens``).
    """

    url: str
    model: str
    api: str = "completions"
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Request:
    """One prompt and its generation length (tokens)."""

    prompt: str
    max_tokens: int


@dataclass(frozen=True)
class Load:
    """A load level: ``kind`` in :data:`LOAD_KINDS` and its value (module docstring).

    ``concurrency`` and ``burst`` take an integer >= 1; ``rate`` a finite requests/s > 0.

    Raises:
        ValueError: an unknown kind or a value out of its range (one line).
    """

    kind: str
    value: float

    def __post_init__(self) -> None:
        if self.kind not in LOAD_KINDS:
            raise ValueError(f"load kind {self.kind!r} is not one of {', '.join(LOAD_KINDS)}")
        v = self.value
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"load {self.kind}: value {v!r} is not a finite number")
        if self.kind == "rate" and v <= 0:
            raise ValueError(f"load rate: {v!r} requests/s is not > 0")
        if self.kind != "rate" and (v < 1 or v != int(v)):
            raise ValueError(f"load {self.kind}: {v!r} is not an integer >= 1")

    @classmethod
    def parse(cls, text: str) -> "Load":
        """Read ``"concurrency:4"``, ``"rate:2.5"`` or ``"burst:16"``.

        Raises:
            ValueError: one line naming ``text`` and the valid forms.
        """
        kind, sep, number = text.strip().partition(":")
        kind, number = kind.strip(), number.strip()
        try:
            if not sep or kind not in LOAD_KINDS:
                raise ValueError
            value = float(number) if kind == "rate" else float(int(number))
            return cls(kind, value)
        except ValueError:
            raise ValueError(f"bad load {text!r}: expected {_LOAD_FORMS}") from None


@dataclass(frozen=True)
class Limits:
    """What one request may take.

    Attributes:
        request_timeout_s: a request's deadline from its send: connect and whole stream (s).
        max_response_bytes: body bytes read per request before it fails ``"too large"``.
        max_line_bytes: bytes of one SSE line before the request fails ``"too large"``.
        connect_timeout_s: to open a connection (s); past it the request fails ``"connect"``.
    """

    request_timeout_s: float = 600.0
    max_response_bytes: int = 16 * 2**20
    max_line_bytes: int = 2**20
    connect_timeout_s: float = 10.0


class _Failure(Exception):
    """A request failed; ``reason`` is one of the short fixed strings of the module doc."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class _Record:
    """What one request measured; times are ``perf_counter`` values (s)."""

    endpoint: int
    send: float
    max_tokens: int = 2**31  # the request's: a usage count above it is not believed
    responded: bool = False  # the response's headers arrived
    first: float | None = None  # first content chunk
    last: float | None = None  # latest content chunk
    end: float | None = None  # end of the response or of the failure
    chunks: int = 0  # non-empty content chunks
    itl_us: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    kept_chars: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    done: bool = False  # the request's coroutine returned (whatever the outcome)

    def fail(self, reason: str, now: float) -> None:
        """Record the first failure and its time (a later one does not replace it)."""
        if self.error is None:
            self.error = reason
            self.end = now

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@dataclass
class _Context:
    """The shared state of one level (or of one :func:`complete` call)."""

    client: httpx.AsyncClient
    limits: Limits
    on_tokens: Callable[[int], None] | None


def _check_endpoints(endpoints: Sequence[Endpoint]) -> None:
    """Raises ValueError (one line) on no endpoint, a non-HTTP URL or an unknown api."""
    if not endpoints:
        raise ValueError("no endpoint to send requests to")
    for e in endpoints:
        if not e.url.startswith(("http://", "https://")):
            raise ValueError(f"endpoint URL {e.url!r} is not http:// or https://")
        if e.api not in API_PATHS:
            raise ValueError(f"endpoint api {e.api!r} is not one of {', '.join(API_PATHS)}")


def _body(endpoint: Endpoint, request: Request) -> dict[str, Any]:
    """The JSON body of a streamed, greedy request (``extra`` fields last: they win)."""
    body: dict[str, Any] = {"model": endpoint.model}
    if endpoint.api == "chat":
        body["messages"] = [{"role": "user", "content": request.prompt}]
    else:
        body["prompt"] = request.prompt
    body.update(
        max_tokens=request.max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    body.update(endpoint.extra)
    return body


def _count(value: Any) -> int | None:
    """A token count from a usage object: a non-negative int, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


class _Stream:
    """Parses one SSE response body into ``rec`` (the timings, text and usage)."""

    def __init__(self, ctx: _Context, rec: _Record, chat: bool) -> None:
        self.ctx = ctx
        self.rec = rec
        self.chat = chat
        self.line = bytearray()  # the unfinished line
        self.read = 0  # body bytes read
        self.finished = False  # a choice had a finish_reason
        self.done = False  # `data: [DONE]` arrived

    def feed(self, data: bytes, now: float) -> None:
        """Take one network read (arrived at ``now``). Raises _Failure."""
        limits = self.ctx.limits
        self.read += len(data)
        if self.read > limits.max_response_bytes:
            raise _Failure("too large")
        start = 0
        while not self.done:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            if len(self.line) + nl - start > limits.max_line_bytes:
                raise _Failure("too large")
            self.line += data[start:nl]
            line = bytes(self.line)
            self.line.clear()
            start = nl + 1
            self._line(line, now)
        if not self.done:
            # Only the unfinished line is buffered: a line without end fails at the limit.
            if len(self.line) + len(data) - start > limits.max_line_bytes:
                raise _Failure("too large")
            self.line += data[start:]

    def _line(self, line: bytes, now: float) -> None:
        """One SSE line: ``data:`` lines are events; blank, comment and other fields are
        skipped (every server of interest sends one ``data:`` line per event)."""
        line = line.rstrip(b"\r")
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            event = json.loads(payload)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deep
            raise _Failure("malformed stream")
        if not isinstance(event, dict) or not isinstance(event.get("choices"), list):
            raise _Failure("malformed stream")
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.rec.prompt_tokens = _count(usage.get("prompt_tokens"))
            self.rec.completion_tokens = _count(usage.get("completion_tokens"))
        choices = event["choices"]
        if not choices:  # the usage chunk has no choice
            return
        choice = choices[0]
        if not isinstance(choice, dict):
            raise _Failure("malformed stream")
        if self.chat:
            delta = choice.get("delta")
            content = delta.get("content") if isinstance(delta, dict) else None
        else:
            content = choice.get("text")
        if content is not None and not isinstance(content, str):
            raise _Failure("malformed stream")
        if content:
            self._content(content, now)
        if choice.get("finish_reason") is not None:
            self.finished = True

    def _content(self, content: str, now: float) -> None:
        """A content chunk: its time, its text (up to the cap) and one token for on_tokens."""
        rec = self.rec
        if rec.first is None:
            rec.first = now
        elif rec.last is not None:
            rec.itl_us.append(round((now - rec.last) * 1e6))
        rec.last = now
        rec.chunks += 1
        room = MAX_TEXT_CHARS - rec.kept_chars
        if room > 0:
            rec.pieces.append(content[:room])
            rec.kept_chars += min(room, len(content))
        if self.ctx.on_tokens is not None:
            self.ctx.on_tokens(1)


async def _exchange(ctx: _Context, rec: _Record, endpoint: Endpoint, request: Request) -> None:
    """Send one request and read its stream into ``rec``. Raises _Failure or httpx errors."""
    url = endpoint.url.rstrip("/") + API_PATHS[endpoint.api]
    headers = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}
    body = _body(endpoint, request)
    async with ctx.client.stream("POST", url, json=body, headers=headers) as response:
        rec.responded = True
        if not 200 <= response.status_code < 300:
            # The body is not read: the reason is the status alone, and an error body
            # could be as large as the server likes.
            raise _Failure(f"http {response.status_code}")
        stream = _Stream(ctx, rec, chat=endpoint.api == "chat")
        async for data in response.aiter_raw():
            stream.feed(data, time.perf_counter())
            if stream.done:
                # The answer is complete: what follows [DONE] is not read (a server that
                # holds the body open cannot stall the request; the connection may then be
                # closed rather than reused).
                break
        now = time.perf_counter()
        if not (stream.done or stream.finished):
            raise _Failure("server closed")
        if rec.chunks == 0:
            raise _Failure("no tokens")
        rec.end = now
        more = _output_tokens(rec, None) - rec.chunks
        if more > 0 and ctx.on_tokens is not None:  # chunks that held several tokens
            ctx.on_tokens(more)


async def _send(ctx: _Context, rec: _Record, endpoint: Endpoint, request: Request) -> None:
    """Run one request under its deadline; every outcome of the request ends in ``rec``.

    Raises:
        CancelledError: passed on, after marking ``rec`` ``"cancelled"``.
        Exception: what a caller's ``on_tokens`` raised (a bug, not a request's failure).
    """
    rec.send = time.perf_counter()
    try:
        await asyncio.wait_for(_exchange(ctx, rec, endpoint, request), ctx.limits.request_timeout_s)
    except asyncio.CancelledError:
        # e2e stays unknown when nothing came back (spec: None if cancelled before any
        # response); otherwise it runs to the cancellation, like any failure.
        if rec.responded:
            rec.fail("cancelled", time.perf_counter())
        elif rec.error is None:
            rec.error = "cancelled"
        raise
    except asyncio.TimeoutError:
        rec.fail("timeout", time.perf_counter())
    except _Failure as failure:
        rec.fail(failure.reason, time.perf_counter())
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol):
        rec.fail("connect", time.perf_counter())
    except httpx.TimeoutException:  # read, write or pool timeout of httpx itself
        rec.fail("timeout", time.perf_counter())
    except httpx.DecodingError:
        rec.fail("malformed stream", time.perf_counter())
    except httpx.TransportError:  # read/write error, protocol error: the peer went away
        rec.fail("server closed", time.perf_counter())
    finally:
        rec.done = True


def _client(limits: Limits, connections: int | None) -> httpx.AsyncClient:
    """One client for the level: ``connections`` at most (None: no cap), no proxy from the
    environment (it would be in every timing), no pool wait (the pool is large enough)."""
    timeout = httpx.Timeout(limits.request_timeout_s, connect=limits.connect_timeout_s, pool=None)
    pool = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(timeout=timeout, limits=pool, trust_env=False)


class _Level:
    """One load level: the send schedule, the records and the stop rule."""

    def __init__(
        self,
        ctx: _Context,
        endpoints: Sequence[Endpoint],
        requests: Sequence[Request],
        warmup: int,
        min_requests: int,
        min_duration_s: float,
        max_requests: int | None,
    ) -> None:
        self.ctx = ctx
        self.endpoints = endpoints
        self.requests = requests
        self.warmup = warmup
        self.min_requests = min_requests
        self.min_duration_s = min_duration_s
        self.max_requests = max_requests
        self.records: list[_Record] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.t0 = time.perf_counter()

    def may_send(self) -> bool:
        """Whether the next request goes out: under ``max_requests``, and either fewer than
        ``warmup + min_requests`` sent or ``min_duration_s`` not yet over since the first
        measured send."""
        sent = len(self.records)
        if self.max_requests is not None and sent >= self.max_requests:
            return False
        if sent < self.warmup + self.min_requests:
            return True
        if self.min_duration_s <= 0:
            return False
        if sent <= self.warmup:  # no measured send yet (min_requests == 0)
            return True
        first = self.records[self.warmup].send
        return time.perf_counter() - first < self.min_duration_s

    def start(self) -> tuple[_Record, Coroutine[Any, Any, None]]:
        """The next request's record (appended: send order) and its coroutine."""
        i = len(self.records)
        request = self.requests[i % len(self.requests)]
        rec = _Record(
            endpoint=i % len(self.endpoints),
            send=time.perf_counter(),
            max_tokens=request.max_tokens,
        )
        self.records.append(rec)
        endpoint = self.endpoints[rec.endpoint]
        return rec, _send(self.ctx, rec, endpoint, request)

    def spawn(self) -> asyncio.Task[None]:
        """Start the next request as a task of its own."""
        _, coro = self.start()
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self.tasks.add(task)
        return task

    async def worker(self) -> None:
        """A closed-loop user: its next request when its previous one ended."""
        while self.may_send():
            await self.spawn()

    async def concurrency(self, n: int) -> None:
        workers = [asyncio.ensure_future(self.worker()) for _ in range(n)]
        self.tasks.update(workers)
        await asyncio.gather(*workers)

    async def rate(self, r: float, seed: int) -> None:
        """Poisson arrivals: the first at t = 0, then exponential gaps of mean 1/r (s),
        drawn in order from ``random.Random(seed)``: the schedule depends on the seed only."""
        rng = random.Random(seed)
        due = time.perf_counter()
        while self.may_send():
            self.spawn()
            due += rng.expovariate(r)
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
        await asyncio.gather(*list(self.tasks))

    async def burst(self, n: int) -> None:
        """Warm-up requests one after another, then ``n`` at once (within ``max_requests``)."""
        cap = self.max_requests if self.max_requests is not None else self.warmup + n
        total = min(self.warmup + n, cap)
        while len(self.records) < min(self.warmup, total):
            await self.spawn()
        burst = [self.spawn() for _ in range(total - len(self.records))]
        await asyncio.gather(*burst)


async def _run_level(
    level: _Level, load: Load, seed: int, timeout_s: float
) -> tuple[str | None, float]:
    """Drive ``level`` under the level's deadline; returns (stopped, end time)."""
    n = int(load.value)
    if load.kind == "concurrency":
        driver = asyncio.ensure_future(level.concurrency(n))
    elif load.kind == "rate":
        driver = asyncio.ensure_future(level.rate(load.value, seed))
    else:
        driver = asyncio.ensure_future(level.burst(n))
    done, _ = await asyncio.wait({driver}, timeout=timeout_s)
    stopped = None
    if not done:
        # The level's deadline: the sender stops and the requests in flight are cancelled
        # (each records "cancelled" with what it measured); they get a bounded time to close.
        stopped = "timeout"
        driver.cancel()
    # Requests still running: after the deadline, or when the driver failed (a caller's
    # callback that raised), which leaves its other requests behind.
    pending = [t for t in level.tasks if not t.done()]
    for task in pending:
        task.cancel()
    if pending or stopped:
        await asyncio.wait({driver, *pending}, timeout=_CANCEL_GRACE_S)
    end = time.perf_counter()
    error = driver.exception() if done else None
    if error is not None:
        raise error
    return stopped, end


def _columns(
    records: Sequence[_Record], t0: float, count_tokens: Callable[[str], int] | None, text: bool
) -> dict[str, list[Any]]:
    """The records as columns (module docstring of :mod:`milarun.measure.latency`)."""
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "send_s",
            "ttft_s",
            "e2e_s",
            "prompt_tokens",
            "output_tokens",
            "itl_us",
            "error",
            "endpoint",
        )
    }
    if text:
        cols["text"] = []
    for rec in records:
        if rec.error is None and not rec.done:  # a task cancelled before it ran
            rec.error = "cancelled"
        cols["send_s"].append(rec.send - t0)
        cols["ttft_s"].append(None if rec.first is None else rec.first - rec.send)
        cols["e2e_s"].append(None if rec.end is None else rec.end - rec.send)
        cols["prompt_tokens"].append(rec.prompt_tokens)
        cols["output_tokens"].append(_output_tokens(rec, count_tokens))
        cols["itl_us"].append(rec.itl_us)
        cols["error"].append(rec.error)
        cols["endpoint"].append(rec.endpoint)
        if text:
            cols["text"].append(rec.text)
    return cols


def _output_tokens(rec: _Record, count_tokens: Callable[[str], int] | None) -> int:
    """The server's usage count (at most the request's ``max_tokens``: a server cannot
    claim more than it was asked for), else ``count_tokens`` of the text, else the
    content chunks."""
    if rec.completion_tokens is not None:
        return min(rec.completion_tokens, rec.max_tokens)
    if count_tokens is not None and rec.chunks:
        return count_tokens(rec.text)
    return rec.chunks


def run_level(
    endpoints: Sequence[Endpoint],
    requests: Sequence[Request],
    load: Load,
    *,
    warmup: int = 0,
    min_requests: int = 1,
    min_duration_s: float = 0.0,
    max_requests: int | None = None,
    timeout_s: float = 3600.0,
    limits: Limits = Limits(),
    seed: int = 0,
    on_tokens: Callable[[int], None] | None = None,
    count_tokens: Callable[[str], int] | None = None,
    keep_text: bool = False,
) -> dict[str, Any]:
    """Send requests at one load level and return their raw timings (blocking).

    Requests are taken from ``requests`` cyclically, endpoints round-robin by request
    index. The first ``warmup`` requests are warm-up (kept first in the columns, for the
    caller to skip). ``concurrency`` and ``rate`` send until at least ``warmup +
    min_requests`` requests went out and ``min_duration_s`` (s) passed since the first
    measured send; ``burst`` sends ``warmup`` requests one by one, then its n at once
    (``min_requests`` and ``min_duration_s`` do not apply). Never more than
    ``max_requests`` in all (None: no cap). Then the requests in flight are awaited.

    Args:
        timeout_s: the whole level (s); past it, requests in flight are cancelled
            (``"cancelled"``) and ``stopped`` is ``"timeout"``. Returns within about
            ``timeout_s`` + 5 s.
        limits: per-request bounds (:class:`Limits`).
        seed: of the Poisson arrivals (``rate``).
        on_tokens: called in the event loop with 1 for each non-empty content chunk, and
            at a request's successful end with the tokens its usage counts beyond its
            chunks (an engine may send several tokens in one chunk): the sum is the
            output tokens of the successful requests.
        count_tokens: output tokens of a text, used when the server sends no usage.
        keep_text: add the ``text`` column (at most :data:`MAX_TEXT_CHARS` per request).

    Returns:
        ``{"load", "value", "warmup", "duration_s" (s, the level's start to its last
        request's end), "stopped" (None or "timeout"), "requests": columns}``; columns
        (one entry per request in send order): ``send_s`` (s from the level's start),
        ``ttft_s``, ``e2e_s`` (s from the send; e2e to the failure for a failed request,
        None for one cancelled before any response), ``prompt_tokens`` (usage, or None),
        ``output_tokens`` (usage, else ``count_tokens``, else content chunks), ``itl_us``
        (list of int µs), ``error`` (None or a reason of the module docstring),
        ``endpoint`` (index), and ``text`` with ``keep_text``.

    Raises:
        ValueError: no endpoint or request, a bad endpoint, or an argument out of range.
    """
    _check_endpoints(endpoints)
    if not requests:
        raise ValueError("no request to send")
    if warmup < 0 or min_requests < 0:
        raise ValueError(f"warmup {warmup} and min_requests {min_requests} must be >= 0")
    if max_requests is not None and max_requests < 1:
        raise ValueError(f"max_requests {max_requests} must be >= 1 or None")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s {timeout_s} must be > 0")

    async def main() -> dict[str, Any]:
        # Enough connections for every request in flight: n for a closed loop or a burst;
        # an open loop has no bound (a slow server piles requests up: that is the test).
        connections = None if load.kind == "rate" else max(int(load.value), 1)
        async with _client(limits, connections) as client:
            ctx = _Context(client, limits, on_tokens)
            level = _Level(
                ctx, endpoints, requests, warmup, min_requests, min_duration_s, max_requests
            )
            stopped, end = await _run_level(level, load, seed, timeout_s)
        ends = [r.end for r in level.records if r.end is not None]
        return {
            "load": load.kind,
            "value": load.value,
            "warmup": warmup,
            "duration_s": (max(ends) if ends else end) - level.t0,
            "stopped": stopped,
            "requests": _columns(level.records, level.t0, count_tokens, keep_text),
        }

    return asyncio.run(main())


def complete(
    endpoint: Endpoint, prompts: Sequence[str], max_tokens: int, *, limits: Limits = Limits()
) -> list[dict[str, Any]]:
    """Greedy completions (temperature 0), one request at a time, streamed as in
    :func:`run_level` (the consistency check: the same prompts on two engines).

    Returns:
        one ``{"text": str, "output_tokens": int, "error": str | None}`` per prompt, in
        order; ``text`` is at most :data:`MAX_TEXT_CHARS` characters.

    Raises:
        ValueError: a bad endpoint.
    """
    _check_endpoints([endpoint])

    async def main() -> list[dict[str, Any]]:
        out = []
        async with _client(limits, 1) as client:
            ctx = _Context(client, limits, None)
            for prompt in prompts:
                rec = _Record(endpoint=0, send=time.perf_counter(), max_tokens=max_tokens)
                await _send(ctx, rec, endpoint, Request(prompt, max_tokens))
                tokens = _output_tokens(rec, None)
                out.append({"text": rec.text, "output_tokens": tokens, "error": rec.error})
        return out

    return asyncio.run(main())
