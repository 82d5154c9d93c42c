"""Serving engines (milarun/bench/server.py): their command lines, a fake engine started,
waited for and stopped with its whole process group, the bounded description of a server
(hostile ones included), the model folder an engine loads (milarun/models/llm.py:
write_served_model), and one real ``transformers serve`` end to end (slow)."""

import http.server
import json
import os
import shutil
import sys
import textwrap
import threading
import time

import pytest
from conftest import build_tiny

from milarun.bench.server import (
    ENGINES,
    Server,
    ServerError,
    describe,
    engine_command,
)
from milarun.host.net import free_port
from milarun.host.supervise import group_members

# ---------------------------------------------------------------- engine_command


def test_engine_command_transformers():
    argv = engine_command(
        "transformers", "/m", host="127.0.0.1", port=8123, device="cpu", dtype="bf16"
    )
    # Run by this interpreter, through the CLI's Typer app (not its main(): no PyPI check).
    assert argv[0] == sys.executable
    assert argv[1] == "-c" and "transformers.cli.transformers import app" in argv[2]
    assert argv[3:5] == ["serve", "/m"]
    assert "--continuous-batching" in argv
    for flag, value in [
        ("--device", "cpu"),
        ("--dtype", "bfloat16"),
        ("--host", "127.0.0.1"),
        ("--port", "8123"),
        ("--log-level", "info"),
    ]:
        assert argv[argv.index(flag) + 1] == value


def test_engine_command_vllm():
    argv = engine_command(
        "vllm",
        "/models/8b",
        host="0.0.0.0",
        port=9000,
        device="cuda",
        dtype="fp16",
        tensor_parallel=4,
        extra_args=["--max-model-len", 4096],
    )
    assert os.path.basename(argv[0]) == "vllm"
    assert argv[1:3] == ["serve", "/models/8b"]
    for flag, value in [
        ("--host", "0.0.0.0"),
        ("--port", "9000"),
        ("--dtype", "float16"),
        ("--tensor-parallel-size", "4"),
        ("--seed", "0"),
    ]:
        assert argv[argv.index(flag) + 1] == value
    assert argv[-2:] == ["--max-model-len", "4096"]  # extra arguments last, as strings


def test_engine_command_sglang():
    argv = engine_command(
        "sglang", "/models/8b", host="h", port=30000, device="cuda", dtype="fp32", tensor_parallel=8
    )
    assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
    for flag, value in [
        ("--model-path", "/models/8b"),
        ("--host", "h"),
        ("--port", "30000"),
        ("--dtype", "float32"),
        ("--tp", "8"),
        ("--random-seed", "0"),
    ]:
        assert argv[argv.index(flag) + 1] == value


def test_engine_command_errors():
    common = {"host": "h", "port": 1, "device": "cpu"}
    with pytest.raises(ValueError, match="engine must be one of transformers, vllm, sglang"):
        engine_command("tgi", "/m", dtype="fp32", **common)
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, fp16, not 'tf32'"):
        engine_command("vllm", "/m", dtype="tf32", **common)
    with pytest.raises(ValueError, match="tensor_parallel must be 1, not 2"):
        engine_command("transformers", "/m", dtype="fp32", tensor_parallel=2, **common)
    with pytest.raises(ValueError, match="1 or more, not 0"):
        engine_command("vllm", "/m", dtype="fp32", tensor_parallel=0, **common)
    for engine in ENGINES:  # every message is one line
        with pytest.raises(ValueError) as exc:
            engine_command(engine, "/m", dtype="int8", **common)
        assert "\n" not in str(exc.value)


# ---------------------------------------------------------------- a fake engine

FAKE = textwrap.dedent(
    """
    import http.server, json, subprocess, sys, time

    mode, port, delay, pidfile = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    print("fake engine starting", flush=True)
    print("loading weights (stderr)", file=sys.stderr, flush=True)
    child = subprocess.Popen(["sleep", "1000"])  # in our process group, like a worker
    with open(pidfile, "w") as f:
        f.write(str(child.pid))
    if mode == "exit":
        print("fatal: no GPU found", flush=True)
        sys.exit(3)
    if mode == "never":
        time.sleep(1000)
    time.sleep(delay)

    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "fake-engine/1.0"

        def do_GET(self):
            if self.path == "/v1/models":
                doc = {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
            elif self.path == "/version":
                doc = {"version": "9.9"}
            else:
                self.send_error(404)
                return
            body = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.HTTPServer(("127.0.0.1", port), Handler)
    print(f"listening on {port}", flush=True)
    server.serve_forever()
    """
)


def fake_server(tmp_path, mode, delay=0.0):
    """A :class:`Server` running the fake engine in ``mode``, and its ``sleep`` child's
    PID file."""
    script = tmp_path / "fake_engine.py"
    script.write_text(FAKE)
    port = free_port("127.0.0.1")
    pidfile = tmp_path / "child.pid"
    argv = [sys.executable, str(script), mode, str(port), str(delay), str(pidfile)]
    return Server(argv, tmp_path / "logs" / "server.log", url=f"http://127.0.0.1:{port}/"), pidfile


def child_pid(pidfile, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pidfile.exists() and pidfile.read_text():
            return int(pidfile.read_text())
        time.sleep(0.02)
    raise AssertionError("the fake engine wrote no child PID")


def running(pid):
    """True while ``pid`` is a live process (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] != b"Z"


def test_fake_engine_ready_after_its_delay_then_stopped_with_its_children(tmp_path):
    server, pidfile = fake_server(tmp_path, "serve", delay=1.5)
    assert server.url == server.url.rstrip("/")
    assert server.returncode is None and not server.alive()
    assert server.stop() is None  # never started: nothing to stop
    with server:
        server.start()
        with pytest.raises(ServerError, match="already started"):
            server.start()
        waited = server.wait_ready(timeout_s=30, poll_s=0.05)
        assert 1.5 <= waited < 1.5 + 5  # its sleep, plus the interpreter's start
        assert server.alive() and server.returncode is None
        sleeper = child_pid(pidfile)
        assert running(sleeper)
        pgid = server._proc.pid
        assert sleeper in group_members(pgid)
        info = describe(server.url)
        assert info == {
            "url": server.url,
            "models": ["fake-model"],
            "server": info["server"],
            "version": {"version": "9.9"},
        }
        assert info["server"].startswith("fake-engine/1.0")
        start = time.monotonic()
        status = server.stop(grace_s=5)
        assert time.monotonic() - start < 5  # SIGTERM ended it: no wait for the grace
    assert status == -15  # SIGTERM
    assert server.stop() == -15 and server.returncode == -15  # idempotent
    assert not server.alive()
    assert not running(sleeper)  # the child in its group went with it
    assert group_members(pgid) == []
    log = (tmp_path / "logs" / "server.log").read_text()
    assert "fake engine starting" in log
    assert "loading weights (stderr)" in log  # stderr too
    assert "listening on" in log
    assert "fake engine starting" in server.log_tail()
    assert server.log_tail(lines=1) == server.log_tail().splitlines()[-1]
    assert len(server.log_tail(max_bytes=10)) <= 10


def test_fake_engine_exiting_at_once(tmp_path):
    server, pidfile = fake_server(tmp_path, "exit")
    with server:
        server.start()
        start = time.monotonic()
        with pytest.raises(ServerError) as exc:
            server.wait_ready(timeout_s=60)
        assert time.monotonic() - start < 30  # seen as soon as it exits, not at the timeout
        message = str(exc.value)
        assert message == (
            "the server exited with status 3 before it was ready: fatal: no GPU found"
        )
        assert "fake engine starting" in exc.value.log_tail
        assert server.returncode == 3
    assert server.stop() == 3
    assert not running(child_pid(pidfile))  # the orphaned sleep was swept from the group


def test_fake_engine_never_ready(tmp_path):
    server, pidfile = fake_server(tmp_path, "never")
    with server:
        server.start()
        start = time.monotonic()
        with pytest.raises(ServerError, match=r"was not ready after 2 s: loading weights") as exc:
            server.wait_ready(timeout_s=2.0, poll_s=0.1)
        elapsed = time.monotonic() - start
        assert 2.0 <= elapsed < 4.0
        assert "\n" not in str(exc.value)
        assert server.alive()  # left running: the with block stops it
        sleeper = child_pid(pidfile)
    assert not server.alive() and not running(sleeper)


def test_server_that_cannot_run(tmp_path):
    server = Server([str(tmp_path / "no-such-engine")], tmp_path / "x.log", url="http://h:1")
    with pytest.raises(ServerError, match="cannot run|exited with status"):
        server.start()
        server.wait_ready(5)  # where setpriv runs it, setpriv is what fails
    server.stop()
    with pytest.raises(ServerError, match="not an http"):
        Server(["true"], tmp_path / "x.log", url="ftp://h:1")
    with pytest.raises(ServerError, match="was not started"):
        Server(["true"], tmp_path / "x.log", url="http://h:1").wait_ready(1)


# ---------------------------------------------------------------- describe, hostile servers


class Hostile(http.server.BaseHTTPRequestHandler):
    """Answers ``/<kind>/v1/models`` the way ``kind`` says."""

    def log_message(self, *args):
        pass

    def _send(self, status, body, length=None, headers=()):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        for key, value in headers:
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        kind = self.path.split("/")[1]
        try:
            if kind == "huge":  # no length: 64 MiB until the client hangs up
                self.send_response(200)
                self.end_headers()
                for _ in range(64):
                    self.wfile.write(b"[" * 2**20)
            elif kind == "declared":
                self._send(200, b"{}", length=10**12)
            elif kind == "trickle":  # a header byte every 0.2 s, for up to 30 s
                self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                for _ in range(150):
                    self.wfile.write(b"a")
                    self.wfile.flush()
                    time.sleep(0.2)
            elif kind == "redirect":
                self._send(302, b"", headers=[("Location", "http://example.invalid/")])
            elif kind == "notlist":
                self._send(200, b'{"object": "list", "data": "fake-model"}')
            elif kind == "notjson":
                self._send(200, b"<html>hello</html>")
            else:
                self._send(404, b"")
        except OSError:
            pass  # the client hung up: what a bounded reader does


@pytest.fixture
def hostile():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_describe_a_closed_port():
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    start = time.monotonic()
    with pytest.raises(ServerError, match=r"/v1/models: ConnectionRefusedError"):
        describe(url)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(
    "kind, match",
    [
        ("huge", "a body over 1048576 bytes"),
        ("declared", "a body of 1000000000000 bytes, over 1048576"),
        ("redirect", "HTTP 302, not 200"),
        ("notlist", "not an OpenAI models list"),
        ("notjson", "Expecting value"),
        ("missing", "HTTP 404, not 200"),
    ],
)
def test_describe_hostile_servers(hostile, kind, match):
    start = time.monotonic()
    with pytest.raises(ServerError, match=match) as exc:
        describe(f"{hostile}/{kind}", max_bytes=2**20)
    assert time.monotonic() - start < 5
    assert "\n" not in str(exc.value)


def test_describe_cannot_be_held_past_its_timeout(hostile):
    start = time.monotonic()
    with pytest.raises(ServerError, match="no full answer within the time allowed"):
        describe(f"{hostile}/trickle", timeout_s=1.0)
    elapsed = time.monotonic() - start
    assert 1.0 <= elapsed < 2.0  # the watchdog cut it at the deadline, bytes still coming


# ---------------------------------------------------------------- write_served_model


@pytest.fixture(scope="module")
def corpus(tiny_dataroot):
    return build_tiny(tiny_dataroot, "llm_corpus") / "llm_corpus"


@pytest.fixture(scope="module")
def served(corpus, tmp_path_factory):
    from milarun.models.llm import write_served_model

    path = tmp_path_factory.mktemp("served") / "tiny"
    assert write_served_model(path, "tiny", corpus, seed=0, max_positions=256) == path
    return path


def test_write_served_model_loads_with_transformers(served, corpus):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from milarun.datasets.llm_corpus import TokenShards
    from milarun.models.llm import SHAPES

    shards = TokenShards(corpus)
    stamp = json.loads((served / "milarun-model.json").read_text())
    assert stamp["shape"] == "tiny" and stamp["precision"] == "fp32" and stamp["seed"] == 0
    assert stamp["max_positions"] == 256 and len(stamp["tokenizer_sha256"]) == 64
    model = AutoModelForCausalLM.from_pretrained(served)
    assert model.config.vocab_size == shards.vocab_size
    assert model.config.hidden_size == SHAPES["tiny"][0]
    assert model.config.max_position_embeddings == 256
    assert model.dtype == torch.float32
    assert model.generation_config.eos_token_id is None
    assert model.generation_config.do_sample is False
    assert json.loads((served / "generation_config.json").read_text()).get("eos_token_id") is None
    tok = AutoTokenizer.from_pretrained(served)
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == shards.eos_id
    ids = tok("the cat")["input_ids"]
    assert ids and all(0 <= i < shards.vocab_size for i in ids)
    config = json.loads((served / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"  # transformers 4 knows it
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), shards.vocab_size)


def test_write_served_model_reuses_refuses_and_is_seeded(served, corpus, tmp_path):
    import torch
    from safetensors.torch import load_file

    from milarun.models.llm import write_served_model

    weights = served / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert write_served_model(served, "tiny", corpus, seed=0, max_positions=256) == served
    assert weights.stat().st_mtime_ns == before  # reused, not rewritten
    with pytest.raises(ValueError, match=f"{served}: holds a model of .*'seed': 0"):
        write_served_model(served, "tiny", corpus, seed=1, max_positions=256)
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, fp16"):
        write_served_model(tmp_path / "x", "tiny", corpus, precision="tf32")
    other = tmp_path / "not-a-model"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=f"{other}: holds no milarun-model.json"):
        write_served_model(other, "tiny", corpus)
    assert (other / "notes.txt").read_text() == "mine"

    # An empty folder is taken; the same seed gives the same weights, bf16 halves them.
    empty = tmp_path / "same"
    empty.mkdir()
    write_served_model(empty, "tiny", corpus, seed=0, max_positions=256)
    a, b = load_file(weights), load_file(empty / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    half = write_served_model(tmp_path / "bf16", "tiny", corpus, seed=1, precision="bf16")
    c = load_file(half / "model.safetensors")
    assert {t.dtype for t in c.values()} == {torch.bfloat16}
    key = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(a[key].to(torch.bfloat16), c[key])  # another seed
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temps


def test_write_served_model_loses_the_rename_race(corpus, tmp_path, monkeypatch):
    from milarun.models import llm

    real_rename = os.rename
    path = tmp_path / "model"

    def rename_after_the_winner(src, dst):
        shutil.copytree(src, dst)  # another process renamed its (same) model first
        real_rename(src, dst)  # ENOTEMPTY

    monkeypatch.setattr(llm.os, "rename", rename_after_the_winner)
    assert llm.write_served_model(path, "tiny", corpus) == path
    assert (path / "milarun-model.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # its temp folder removed


# ---------------------------------------------------------------- end to end


@pytest.mark.slow
def test_transformers_serve_end_to_end(corpus, tmp_path):
    """A tiny model served by ``transformers serve`` on CPU: ready, one streamed completion
    of exactly 8 tokens, described, stopped."""
    import httpx

    from milarun.models.llm import write_served_model

    model = write_served_model(tmp_path / "model", "tiny", corpus)
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    argv = engine_command(
        "transformers", str(model), host="127.0.0.1", port=port, device="cpu", dtype="fp32"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    with Server(argv, tmp_path / "serve.log", url=url, env=env) as server:
        server.start()
        server.wait_ready(timeout_s=120)
        body = {
            "model": str(model),
            "prompt": "the cat",
            "max_tokens": 8,
            "temperature": 0,
            "stream": True,
        }
        texts, usage = [], None
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                texts += [c["text"] for c in chunk["choices"] if c.get("text")]
                usage = chunk.get("usage") or usage
        assert usage is not None and usage["completion_tokens"] == 8
        assert len(texts) == 8  # one streamed chunk a token
        info = describe(url)
        assert info["models"] == [str(model)] and info["server"] == "uvicorn"
        assert server.stop() is not None
    assert not server.alive()
    assert "Uvicorn running on" in (tmp_path / "serve.log").read_text()
