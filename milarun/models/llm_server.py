"""llm_server: LLM serving in MLPerf's Server scenario: load through an OpenAI-compatible server.

A client (:mod:`milarun.bench.loadgen`) sends streamed ``completions`` (or
``chat/completions``) requests to a serving engine under a load model, and the
figures are the ones serving benchmarks report: per-request TTFT, ITL, TPOT and
end-to-end latency, their percentiles, request and token throughput, and goodput
under latency targets (:func:`milarun.measure.latency.level_figures` defines them,
with sources). ``llm_serve`` is the Offline scenario of the same models: batched
``generate`` in-process, no server.

The server is one of:

* started here (``--engine``): a Llama-architecture model of ``--shape`` is written
  to ``DATAROOT/llm_server/`` from its config with random weights and the
  ``llm_corpus`` tokenizer (:func:`milarun.models.llm.write_served_model`: nothing is
  downloaded), the engine's own serve command is run in a process group of its own
  (:mod:`milarun.bench.server`), health-checked before the load and stopped after
  it; its log is kept beside the record (``<record>.server.log``). ``transformers``
  (``transformers serve --continuous-batching``) runs on CPU and is what the tests
  use; ``vllm`` and ``sglang`` are written against their documentation and have not
  run yet.
* given (``--endpoint URL[,URL...]``): a server someone else runs, a vendor's
  appliance. The record holds what it says of itself (``/v1/models``, its
  ``server`` header, vLLM's ``/version``) and that milarun did not start it.
  Several URLs are driven by one client, round-robin.

Load (``--load``, levels separated by commas, the first one measured by the rate
logger): ``concurrency:N`` (closed loop), ``rate:R`` (Poisson arrivals at R
requests/s, seeded) or ``burst:N`` (all at once, MLPerf's Offline). Each level sends
``--warmup-requests`` first (kept in the record, left out of the figures), then at
least ``--requests`` requests for at least ``--duration`` seconds (for the first
level, at least the warm-up windows and ``--min-steady`` of the rate logger too).
``--capacity rate`` (or ``concurrency``) then searches for the highest load whose
p``--slo-percentile`` TTFT and TPOT stay within the targets
(:class:`milarun.measure.capacity.CapacitySearch`: bracket, then bisect).

Requests come from ``llm_corpus``'s prompts (decoded to text): ``--prompt-len``
tokens each (0: the dataset's long-tailed mix), ``--output-len`` tokens each, or
with ``--lengths chat`` a long-tailed output length too (log-normal, median a
quarter of ``--output-len``, clipped to ``[2, --output-len]``, seeded).
``max_tokens`` is the request's output length; the served model's generation
config has no end-of-text token, so a random-weight model never stops early
(engines that need it get ``ignore_eos`` through ``--extra-body``).

Consistency (``--consistency N``): N prompts are completed greedily by the server
and by the same model run here with ``generate``; the texts must be equal. A server
that skips layers or quantizes silently fails it.

The rate logger counts the output tokens of the first level as they stream: the
sample windows give output tokens/s. The record's ``serving_load`` keeps every
request's raw timings (:mod:`milarun.bench.loadgen`'s columns) so that the summary
and ``verify`` recompute every figure.
"""

from __future__ import annotations

import math
import os
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch
from coleo import Option, default, tooled
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from ..bench import device as bench_device
from ..bench import init_torch, rate_logger
from ..bench import server as engines
from ..bench.loadgen import Endpoint, Limits, Load, Request, complete, run_level
from ..bench.options import INFERENCE_PRECISIONS, precision_option
from ..datasets import require
from ..datasets.llm_corpus import TokenShards
from ..host.net import free_port
from ..measure.capacity import CapacitySearch
from ..measure.latency import level_figures, targets
from .llm import check_shape, write_served_model

NO_LOSS = "serving: nothing is trained"

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

#: Most requests whose raw timings a record keeps per level (a record is at most 64 MiB).
MAX_RECORDED_REQUESTS = 20_000
#: Most inter-token gaps a record keeps over all its levels.
MAX_RECORDED_GAPS = 2_000_000


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.llm_server:main -d DATAROOT -- ARGS``.
    Needs ``llm_corpus``. Items are output tokens."""
    exp.cli(server_scenario, argv)


@tooled
def server_scenario(exp):
    # Model shape the server loads: tiny, tiny-gqa, 150m, 1b, 8b or 70b
    shape: Option = default("8b")
    # Serving engine to start: transformers, vllm or sglang (ignored with --endpoint)
    engine: Option = default("transformers")
    # Extra arguments of the engine's serve command (one string, shell-quoted)
    engine_args: Option = default("")
    # With --engine command: the serve command, with {model} {host} {port} {tp} {dtype} {device}
    engine_command: Option = default("")
    # GPUs of one server (tensor parallelism; the engine's own option)
    tensor_parallel: Option & int = default(1)
    # URL(s) of a server someone else runs, comma-separated (milarun starts none)
    endpoint: Option = default("")
    # Model name sent to --endpoint (default: the first of its /v1/models)
    served_model: Option = default("")
    # OpenAI API: completions or chat
    api: Option = default("completions")
    # Extra JSON fields of every request body, e.g. {"ignore_eos": true}
    extra_body: Option = default("")
    # Load levels, comma-separated: concurrency:N, rate:R (requests/s) or burst:N
    load: Option = default("concurrency:8")
    # Capacity search after the levels: "", "rate" or "concurrency"
    capacity: Option = default("")
    # Load the capacity search starts from
    capacity_start: Option & float = default(1.0)
    # Highest load the capacity search tries
    capacity_max: Option & float = default(256.0)
    # Most levels the capacity search measures
    capacity_steps: Option & int = default(8)
    # Latency targets preset (e.g. llama3.1-8b-server); overrides --ttft-slo/--tpot-slo
    targets_preset: Option = default("")
    # Latency target on the time to first token, in ms
    ttft_slo: Option & float = default(2000.0)
    # Latency target on the time per output token, in ms
    tpot_slo: Option & float = default(100.0)
    # Percentile at which the targets must hold (capacity search, slo_met)
    slo_percentile: Option & float = default(99.0)
    # Prompt tokens per request (0: the dataset's long-tailed mix)
    prompt_len: Option & int = default(1024)
    # Output tokens per request (the largest with --lengths chat)
    output_len: Option & int = default(256)
    # Output lengths: fixed, or chat (long-tailed)
    lengths: Option = default("fixed")
    # Warm-up requests per level (left out of the figures)
    warmup_requests: Option & int = default(4)
    # Measured requests per level, at least
    requests: Option & int = default(32)
    # Seconds per level, at least (MLPerf uses 600 s)
    duration: Option & float = default(0.0)
    # Requests per level, at most (warm-up included; 0: no bound)
    max_requests: Option & int = default(0)
    # A request's deadline, in s
    request_timeout: Option & float = default(600.0)
    # A level's deadline, in s
    level_timeout: Option & float = default(3600.0)
    # Seconds the started server has to become ready
    ready_timeout: Option & float = default(600.0)
    # Prompts of the consistency check (0: none)
    consistency: Option & int = default(0)
    # Output tokens per prompt of the consistency check
    consistency_tokens: Option & int = default(16)
    precision = precision_option(default="bf16", choices=INFERENCE_PRECISIONS)

    exp.metrics["scenario"] = "server"
    settings = Settings(
        shape=shape,
        engine=engine,
        engine_args=engine_args,
        engine_command=engine_command,
        tensor_parallel=tensor_parallel,
        endpoint=endpoint,
        served_model=served_model,
        api=api,
        extra_body=extra_body,
        load=load,
        capacity=capacity,
        capacity_start=capacity_start,
        capacity_max=capacity_max,
        capacity_steps=capacity_steps,
        targets_preset=targets_preset,
        ttft_slo_ms=ttft_slo,
        tpot_slo_ms=tpot_slo,
        slo_percentile=slo_percentile,
        prompt_len=prompt_len,
        output_len=output_len,
        lengths=lengths,
        warmup_requests=warmup_requests,
        requests=requests,
        duration=duration,
        max_requests=max_requests,
        request_timeout=request_timeout,
        level_timeout=level_timeout,
        ready_timeout=ready_timeout,
        consistency=consistency,
        consistency_tokens=consistency_tokens,
        precision=precision,
    )
    run(exp, settings)


class Settings:
    """The options of :func:`server_scenario`, checked (ValueError: one line naming the
    option). Latency targets are kept in seconds."""

    def __init__(self, **opts: Any) -> None:
        self.__dict__.update(opts)
        check_shape(self.shape)
        if self.api not in ("completions", "chat"):
            raise ValueError(f"--api must be completions or chat, not {self.api!r}")
        if not self.endpoint and self.engine not in (*engines.ENGINES, "command"):
            raise ValueError(
                f"--engine must be one of {', '.join(engines.ENGINES)} or command, "
                f"not {self.engine!r}"
            )
        if (self.engine == "command") != bool(self.engine_command.strip()) and not self.endpoint:
            raise ValueError("--engine command and --engine-command go together")
        if self.lengths not in ("fixed", "chat"):
            raise ValueError(f"--lengths must be fixed or chat, not {self.lengths!r}")
        try:
            self.loads = [Load.parse(x.strip()) for x in self.load.split(",") if x.strip()]
        except ValueError as exc:
            raise ValueError(f"--load: {exc}") from None
        if not self.loads and not self.capacity:
            raise ValueError("--load names no level and --capacity is not set: nothing to run")
        if self.capacity not in ("", "rate", "concurrency"):
            raise ValueError(f"--capacity must be rate or concurrency, not {self.capacity!r}")
        if self.capacity and not 0 < self.capacity_start <= self.capacity_max:
            raise ValueError("--capacity-start must be > 0 and at most --capacity-max")
        if self.targets_preset:
            self.ttft_slo_s, self.tpot_slo_s = targets(self.targets_preset)
        else:
            self.ttft_slo_s, self.tpot_slo_s = self.ttft_slo_ms / 1e3, self.tpot_slo_ms / 1e3
        if not (self.ttft_slo_s > 0 and self.tpot_slo_s > 0 and 0 < self.slo_percentile <= 100):
            raise ValueError("--ttft-slo and --tpot-slo must be > 0, --slo-percentile in (0, 100]")
        if self.output_len < 2 or self.prompt_len < 0:
            raise ValueError("--output-len must be at least 2 and --prompt-len at least 0")
        if self.requests < 1 or self.warmup_requests < 0 or self.max_requests < 0:
            raise ValueError(
                "--requests must be at least 1, --warmup-requests and --max-requests at least 0"
            )
        if not (self.request_timeout > 0 and self.level_timeout > 0 and self.ready_timeout > 0):
            raise ValueError("--request-timeout, --level-timeout and --ready-timeout must be > 0")
        if self.consistency < 0 or self.consistency_tokens < 1 or self.tensor_parallel < 1:
            raise ValueError(
                "--consistency must be at least 0, --consistency-tokens and "
                "--tensor-parallel at least 1"
            )
        self.extra = parse_extra_body(self.extra_body)


def parse_extra_body(text: str) -> dict[str, Any]:
    """``--extra-body``'s JSON object (``{}`` when empty).

    Raises:
        ValueError: not a JSON object, or it sets a field the client owns.
    """
    if not text.strip():
        return {}
    try:
        extra = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ValueError(f"--extra-body is not JSON: {text[:80]!r}") from None
    if not isinstance(extra, dict):
        raise ValueError("--extra-body must be a JSON object")
    owned = {"model", "prompt", "messages", "max_tokens", "stream", "stream_options"}
    clash = sorted(owned & set(extra))
    if clash:
        raise ValueError(f"--extra-body sets {', '.join(clash)}, which the client sets itself")
    return extra


def build_requests(
    shards: TokenShards, tokenizer: Tokenizer, s: Settings, seed: int, count: int = 512
) -> list[Request]:
    """``count`` requests from the corpus's prompts: text decoded from ``--prompt-len``
    tokens (or each prompt's mixed length), ``max_tokens`` from ``--output-len`` (or
    the chat mix: log-normal, median ``output_len / 4``, clipped to ``[2,
    output_len]``, seeded by ``seed``)."""
    rows, mixed = shards.prompts()
    if s.prompt_len > rows.shape[1]:
        raise ValueError(
            f"--prompt-len {s.prompt_len} is longer than the dataset's prompts "
            f"({rows.shape[1]} tokens)"
        )
    rng = np.random.default_rng(seed)
    if s.lengths == "chat":
        outs = rng.lognormal(math.log(max(2.0, s.output_len / 4)), 1.0, size=count)
        outs = np.clip(np.rint(outs), 2, s.output_len).astype(int)
    else:
        outs = np.full(count, s.output_len, dtype=int)
    reqs = []
    for i in range(count):
        row = i % len(rows)
        n = int(mixed[row]) if s.prompt_len == 0 else s.prompt_len
        text = tokenizer.decode([int(t) for t in rows[row, :n]])
        reqs.append(Request(prompt=text, max_tokens=int(outs[i])))
    return reqs


def run(exp, s: Settings) -> None:
    """Start (or describe) the server, run the levels and the capacity search, check
    consistency, and fill ``exp.result["serving_load"]``. A server that dies or never
    becomes ready raises after the levels measured so far are in the record."""
    device = init_torch(exp)
    corpus = require(exp.dataroot, "llm_corpus")
    shards = TokenShards(corpus)
    tokenizer = Tokenizer.from_file(str(Path(corpus) / "tokenizer.json"))
    requests = build_requests(shards, tokenizer, s, exp.options["seed"])
    record: dict[str, Any] = {
        "scenario": "server",
        "api": s.api,
        "targets": {
            "name": s.targets_preset or None,
            "ttft_s": s.ttft_slo_s,
            "tpot_s": s.tpot_slo_s,
            "percentile": s.slo_percentile,
        },
        "levels": [],
    }
    exp.result["serving_load"] = record
    model_dir = None
    if not s.endpoint or s.consistency:  # the model served, or the reference of the check
        seq = int(shards.prompts()[0].shape[1]) + s.output_len
        model_dir = write_served_model(
            Path(exp.dataroot) / "llm_server" / f"{s.shape}-{s.precision}-seed0",
            s.shape,
            corpus,
            precision=s.precision,
            seed=0,
            max_positions=max(2048, seq),
        )
    server = None
    try:
        if s.endpoint:
            urls = [u.strip().rstrip("/") for u in s.endpoint.split(",") if u.strip()]
            infos = [engines.describe(u) for u in urls]
            name = s.served_model or (infos[0]["models"] or [""])[0]
            if not name:
                raise engines.ServerError(f"{urls[0]} lists no model and --served-model is not set")
            record["server"] = {"started_by_milarun": False, "endpoints": infos, "model": name}
        else:
            assert model_dir is not None
            server, url = start_server(exp, s, model_dir, device, record)
            urls, name = [url], str(model_dir)
        endpoints = [Endpoint(url=u, model=name, api=s.api, extra=s.extra) for u in urls]
        # The first request of an engine sets up its scheduler and caches (13 s for
        # transformers serve on a CPU): in no level.
        t0 = time.perf_counter()
        complete(endpoints[0], [requests[0].prompt], 2, limits=Limits(s.request_timeout))
        record["server"]["first_request_s"] = time.perf_counter() - t0
        measure_levels(exp, s, endpoints, requests, tokenizer, record, server)
        if s.consistency:
            record["consistency"] = consistency(
                endpoints[0], model_dir, requests, s, tokenizer, device
            )
    finally:
        if server is not None:
            record["server"]["exit_status"] = server.stop()


def start_server(exp, s: Settings, model_dir: Path, device, record) -> tuple[engines.Server, str]:
    """Start the engine on a free local port over ``model_dir`` and wait until it is
    ready; ``record["server"]`` says how. Returns the server and its base URL.

    Raises:
        ValueError: a malformed ``--engine-command``.
        engines.ServerError: the engine exited or was not ready within ``--ready-timeout``.
    """
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    fields = {
        "model": str(model_dir),
        "host": "127.0.0.1",
        "port": str(port),
        "tp": str(s.tensor_parallel),
        "dtype": engines.DTYPES[s.precision],
        "device": engine_device(device),
    }
    if s.engine == "command":
        try:
            argv = shlex.split(s.engine_command.format(**fields)) + shlex.split(s.engine_args)
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise ValueError(
                f"--engine-command: {exc!r}; its fields are {', '.join(fields)}"
            ) from None
    else:
        argv = engines.engine_command(
            s.engine,
            fields["model"],
            host=fields["host"],
            port=port,
            device=fields["device"],
            dtype=s.precision,
            tensor_parallel=s.tensor_parallel,
            extra_args=shlex.split(s.engine_args),
        )
    log = log_path(exp) or Path(tempfile.mkstemp(suffix=".server.log")[1])
    # Nothing is downloaded at run time: the engine loads the folder written here. Its hub
    # cache is an empty folder of its own: transformers 5.17's serve answers /v1/models from
    # the hub cache and fails where there is none, and a user's cached models stay out.
    cache = model_dir.parent / "hub-cache"
    cache.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_CACHE": str(cache),
    }
    server = engines.Server(argv, log, url=url, env=env)
    record["server"] = {
        "started_by_milarun": True,
        "engine": s.engine,
        "argv": argv,
        "log": log.name,
    }
    server.start()
    try:
        record["server"]["ready_s"] = server.wait_ready(s.ready_timeout)
        record["server"]["endpoints"] = [engines.describe(url)]
    except BaseException:  # never ready, or not an OpenAI server: stopped, not left behind
        record["server"]["exit_status"] = server.stop()
        raise
    return server, url


def engine_device(device: torch.device) -> str:
    """The engine's ``--device`` for the child's device: ``cpu`` or ``cuda`` (the
    launcher's visibility variable already names the GPU)."""
    return bench_device.kind(device)


def log_path(exp) -> Path | None:
    """``<record stem>.server.log`` beside the record (None when it goes to stdout)."""
    out = exp.out
    if out is None:
        return None
    out = Path(out)
    if out.suffix == ".json":
        return out.with_name(f"{out.stem}.server.log")
    return out / f"{exp.name}.{exp.job_id}.server.log"


def measure_levels(exp, s, endpoints, requests, tokenizer, record, server) -> None:
    """Each ``--load`` level, then the capacity search; the first level's output
    tokens go to the rate logger as they stream.

    Raises:
        engines.ServerError: a started server exited; a ``--load`` level where no request
            completed (a step of the search where none did only fails that step).
    """
    logger = rate_logger(exp)
    opts = exp.options
    steady = opts["warmup"] * opts["sample_duration"] + opts["min_steady"]
    count = lambda text: len(tokenizer.encode(text).ids)  # noqa: E731
    limits = Limits(request_timeout_s=s.request_timeout)
    gaps = [0]

    def level(load: Load, first: bool, searching: bool = False) -> dict[str, Any]:
        if first:
            logger.begin()  # the wave's start barrier, then the first window
        result = run_level(
            endpoints,
            requests,
            load,
            warmup=s.warmup_requests,
            min_requests=s.requests,
            min_duration_s=max(s.duration, steady) if first else s.duration,
            max_requests=s.max_requests or None,
            timeout_s=s.level_timeout,
            limits=limits,
            seed=opts["seed"],
            on_tokens=logger.count if first else None,
            count_tokens=count,
        )
        if first:
            logger.pause()
        entry = compact(result, gaps)
        entry["figures"] = level_figures(
            entry["requests"],
            entry["warmup"],
            s.ttft_slo_s,
            s.tpot_slo_s,
            s.slo_percentile,
        )
        record["levels"].append(entry)
        if server is not None and not server.alive():
            raise engines.ServerError(
                f"the server exited with status {server.returncode} during "
                f"{load.kind}:{load.value:g}: {server.log_tail(1)}"
            )
        figures = entry["figures"]
        if not figures["completed"] and not searching:  # a search's step just fails
            reasons = ", ".join(f"{k} ({v})" for k, v in figures["failures"].items())
            raise engines.ServerError(
                f"no request of {load.kind}:{load.value:g} completed: {reasons or 'none sent'}"
            )
        return entry

    for i, load in enumerate(s.loads):
        level(load, first=i == 0)
    if s.loads:
        metrics = record["levels"][0]["figures"]
        exp.metrics.update(
            {k: v for k, v in metrics.items() if isinstance(v, (int, float)) or v is None}
        )
    if s.capacity:
        search = CapacitySearch(
            s.capacity_start,
            integer=s.capacity == "concurrency",
            lowest=1.0 if s.capacity == "concurrency" else min(0.01, s.capacity_start),
            highest=s.capacity_max,
            max_steps=s.capacity_steps,
        )
        walked = []
        while (value := search.next_load()) is not None:
            entry = level(Load(s.capacity, value), first=not s.loads and not walked, searching=True)
            passed = bool(entry["figures"]["slo_met"])
            search.record(value, passed)
            walked.append(len(record["levels"]) - 1)
        record["capacity"] = {
            "kind": s.capacity,
            "capacity": search.capacity,
            "reason": search.reason,
            "steps": [[load, passed] for load, passed in search.steps],
            "levels": walked,
        }
        exp.metrics[f"capacity_{s.capacity}"] = search.capacity


def compact(result: dict[str, Any], gaps: list[int]) -> dict[str, Any]:
    """A level of :func:`milarun.bench.loadgen.run_level` as the record keeps it: the
    columns cut to :data:`MAX_RECORDED_REQUESTS` requests and the inter-token gaps to
    what is left of :data:`MAX_RECORDED_GAPS` (``gaps[0]``: gaps kept so far), with
    ``truncated`` saying so; send times rounded to µs."""
    cols = result["requests"]
    n = min(len(cols["send_s"]), MAX_RECORDED_REQUESTS)
    kept = {
        k: list(cols[k][:n])
        for k in ("send_s", "ttft_s", "e2e_s", "prompt_tokens", "output_tokens", "itl_us", "error")
    }
    truncated = n < len(cols["send_s"])
    for i, row in enumerate(kept["itl_us"]):
        room = max(0, MAX_RECORDED_GAPS - gaps[0])
        if len(row) > room:
            kept["itl_us"][i] = row[:room]
            truncated = True
        gaps[0] += len(kept["itl_us"][i])
    for key in ("send_s", "ttft_s", "e2e_s"):
        kept[key] = [None if v is None else round(v, 6) for v in kept[key]]
    return {
        "load": result["load"],
        "value": result["value"],
        "warmup": min(result["warmup"], n),
        "duration_s": result["duration_s"],
        "stopped": result["stopped"],
        "truncated": truncated,
        "requests": kept,
    }


def consistency(endpoint, model_dir, requests, s, tokenizer, device) -> dict[str, Any]:
    """The server's greedy completions of ``--consistency`` prompts against those of the
    model ``model_dir`` holds, run here with ``generate`` (greedy, in ``--precision``): a
    server given with ``--endpoint`` is expected to serve that folder too.

    Returns:
        ``{"prompts", "tokens", "matching", "passed", "mismatches": [prompt index...]}``;
        a prompt the server failed counts as a mismatch.
    """
    prompts = [r.prompt for r in requests[: s.consistency]]
    served = complete(endpoint, prompts, s.consistency_tokens, limits=Limits(s.request_timeout))
    dtype = DTYPES[s.precision]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    mismatches = []
    for i, (prompt, got) in enumerate(zip(prompts, served)):
        ids = torch.tensor([tokenizer.encode(prompt).ids], device=device)
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=s.consistency_tokens,
                min_new_tokens=s.consistency_tokens,
                do_sample=False,
            )
        want = tokenizer.decode(out[0, ids.shape[1] :].tolist())
        if got["error"] is not None or got["text"] != want:
            mismatches.append(i)
    return {
        "prompts": len(prompts),
        "tokens": s.consistency_tokens,
        "matching": len(prompts) - len(mismatches),
        "passed": not mismatches,
        "mismatches": mismatches,
    }


__all__ = ["main"]
