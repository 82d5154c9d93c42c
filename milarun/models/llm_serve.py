"""llm_serve: LLM serving-style generation: prefill and decode tokens/s, TTFT, TPOT, goodput.

A Llama-architecture model (``--shape``, random weights in ``--precision``,
bf16 by default) generates ``--output-len`` tokens for static batches of
requests with ``transformers``' ``generate`` and its static KV cache
(``cache_implementation="static"``: fixed-shape tensors, so ``--compile``'s
``torch.compile(mode="reduce-overhead")`` can capture the decoding step in
CUDA graphs, transformers' documented way to serve fast). Greedy decoding,
exactly ``--output-len`` tokens per request (end-of-text suppressed), so
every batch does the same work.

Prompts come from ``llm_corpus`` (``prompts/``, tokenized offline): a fixed
``--prompt-len``, or ``--prompt-len 0`` for the dataset's mixed, heavy-tailed
lengths (left-padded within a batch, with an attention mask).

Measured: the rate logger counts **decode tokens**: every token after a
request's first is one item, counted as it streams (``exp.rate.count``), and the
prefill (up to the first token) is in no sample window (the logger is paused
before each batch and resumed at its first token), so the score is the decode
tokens/s at the profile's concurrency (``--batch-size`` requests per batch). Each
batch is also timed token by token (a streamer that waits for the device at every
token, as a server streaming tokens must): TTFT, TPOT, prefill and decode tokens/s and goodput under
``--ttft-slo`` / ``--tpot-slo`` (:mod:`milarun.measure.latency`). After the
measured level, ``--sweep`` runs other concurrency levels (one unrecorded
batch, then ``--sweep-batches`` timed ones each). The record's
``serving`` list holds one entry per level; ``metrics`` repeats the measured
level's figures.

Under torchrun (an ``njobs`` test) the model is split with tensor
parallelism over the node's ranks (``torch.distributed.tensor.parallel``:
query/key/value and gate/up projections column-wise, output and down
projections row-wise, Megatron-LM's layout): the 70B shape over 8 GPUs.
Every rank runs the same batches; rank 0 writes the record.

Stresses: HBM bandwidth (decode reads every weight and the KV cache per
token), tensor-core FLOPs at prefill, host overhead at small batch (what
CUDA graphs remove), and NVLink all-reduces under tensor parallelism.
"""

import itertools
import time

import numpy as np
import torch
from coleo import Option, default, tooled
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from transformers.generation.streamers import BaseStreamer

from ..bench import device as bench_device
from ..bench import init_torch, rate_logger
from ..bench.distributed import agree_on_counts, process_group
from ..bench.options import (
    INFERENCE_PRECISIONS,
    backend_option,
    batch_size_option,
    precision_option,
)
from ..datasets import require
from ..datasets.llm_corpus import TokenShards
from ..measure.latency import batch_latency, serving_level
from .llm import (
    build_model,
    check_shape,
    flops_per_token,
    llama_config,
    matmul_params,
    record_flops,
)

NO_LOSS = "serving: nothing is trained"

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.llm_serve:main -d DATAROOT -- ARGS``,
    or under torchrun for tensor parallelism. Needs ``llm_corpus``. Items are decode tokens."""
    exp.cli(serve, argv)


def tensor_parallel(model, world):
    """Split ``model``'s blocks over ``world``'s ranks (Megatron-LM's column/row layout).

    Raises:
        ValueError: the heads or key-value heads do not divide among the ranks.
    """
    cfg = model.config
    if cfg.num_attention_heads % world.size or cfg.num_key_value_heads % world.size:
        raise ValueError(
            f"tensor parallelism over {world.size} ranks needs heads "
            f"({cfg.num_attention_heads}) and key-value heads "
            f"({cfg.num_key_value_heads}) divisible by {world.size}"
        )
    mesh = init_device_mesh(bench_device.kind(world.device), (world.size,))
    plan = {}
    for i in range(len(model.model.layers)):
        for name in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
        ):
            plan[f"model.layers.{i}.{name}"] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"model.layers.{i}.{name}"] = RowwiseParallel()
    parallelize_module(model, mesh, plan)


class TokenClock(BaseStreamer):
    """A ``generate`` streamer that times each generated token (after the prompt, which
    ``generate`` puts first), waiting for the device at each (``sync``, None on the CPU).

    With a rate logger (the measured level, which pauses it before ``generate``: the
    prefill is in no sample), the first token resumes the logger and every later token
    counts ``requests`` items (decode tokens) as it streams.

    Attributes:
        times: ``time.perf_counter()`` at each generated token (seconds).
    """

    def __init__(self, sync, logger=None, requests=0):
        self.sync = sync
        self.times = []
        self.prompt_seen = False
        self.logger, self.requests = logger, requests

    def put(self, value):
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        if self.sync is not None:
            self.sync()
        self.times.append(time.perf_counter())
        if self.logger is None:
            return
        if len(self.times) == 1:
            self.logger.resume()  # the prefill is over
        else:
            self.logger.count(self.requests)

    def end(self):
        pass


def prompt_batch(rows, lengths, start, n, pad_id):
    """``(input_ids, attention_mask, prompt tokens)``: requests ``start .. start+n`` (cycling
    over the prompts), each cut to its length and left-padded to the longest."""
    idx = [(start + k) % len(rows) for k in range(n)]
    lens = [int(lengths[i]) for i in idx]
    width = max(lens)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for k, (i, m) in enumerate(zip(idx, lens)):
        ids[k, width - m :] = torch.from_numpy(rows[i, :m])
        mask[k, width - m :] = 1
    return ids, mask, sum(lens)


class Batches:
    """Endless prompt batches of ``n`` requests, requests 0 .. n-1 first (an iterable
    for the rate logger's loop)."""

    def __init__(self, rows, lengths, n, pad_id):
        self.args = (rows, lengths)
        self.n, self.pad_id = n, pad_id

    def __iter__(self):
        start = 0
        while True:
            yield prompt_batch(*self.args, start, self.n, self.pad_id)
            start += self.n


@tooled
def serve(exp):
    # Model shape: tiny, tiny-gqa, 1b, 8b or 70b (milarun.models.llm.SHAPES)
    shape: Option = default("8b")
    batch_size = batch_size_option(default=32)  # requests per batch at the measured level
    # Prompt tokens per request (0: the dataset's mixed length distribution)
    prompt_len: Option & int = default(1024)
    # Tokens generated per request
    output_len: Option & int = default(256)
    # Other concurrency levels to time after the measured one, e.g. 1,8,64 (empty: none)
    sweep: Option = default("")
    # Timed batches per sweep level
    sweep_batches: Option & int = default(3)
    # Latency bound on the time to first token, in ms (goodput)
    ttft_slo: Option & float = default(2000.0)
    # Latency bound on the time per output token, in ms (goodput)
    tpot_slo: Option & float = default(100.0)
    precision = precision_option(default="bf16", choices=INFERENCE_PRECISIONS)
    # Compile the model's forward (torch.compile, mode reduce-overhead: CUDA graphs)
    compile: Option & bool = default(False)
    backend = backend_option()

    check_shape(shape)
    if batch_size < 1 or output_len < 2 or prompt_len < 0 or sweep_batches < 1:
        raise ValueError(
            "--batch-size and --sweep-batches must be at least 1, --output-len at "
            "least 2 (the throughput counts the tokens after the first), "
            "--prompt-len at least 0"
        )
    try:
        levels = [int(x) for x in sweep.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--sweep must be comma-separated integers, not {sweep!r}") from None
    if any(n < 1 for n in levels):
        raise ValueError("--sweep levels must be at least 1")
    device = init_torch(exp)
    shards = TokenShards(require(exp.dataroot, "llm_corpus"))
    rows, mixed = shards.prompts()
    if prompt_len > rows.shape[1]:
        raise ValueError(
            f"--prompt-len {prompt_len} is longer than the dataset's prompts "
            f"({rows.shape[1]} tokens)"
        )
    lengths = mixed if prompt_len == 0 else np.full(len(rows), prompt_len, dtype=np.int64)
    pad = shards.eos_id
    with process_group(exp, device, backend) as world:
        device = world.device
        config = llama_config(shape, shards.vocab_size, int(lengths.max()) + output_len)
        config.use_cache = True
        model = build_model(config, device, dtype=DTYPES[precision]).eval()
        n_matmul = matmul_params(model)
        if world.size > 1:
            tensor_parallel(model, world)
        if compile:
            model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        exp.metrics.update(
            {
                "shape": shape,
                "world_size": world.size,
                "concurrency": batch_size,
                "output_len": output_len,
                "prompt_len": prompt_len,
                "parallelism": "tensor" if world.size > 1 else "none",
            }
        )
        logger = rate_logger(exp)
        agree_on_counts(exp, world)
        measured = []
        # The logger's items are the decode tokens, counted by the streamer as they come:
        # the loop's steps count none.
        for _step, batch in logger.loop(Batches(rows, lengths, batch_size, pad)):
            measured.append(generate(model, device, batch, output_len, pad, logger))
        exp.metrics["batches"] = len(measured)  # of the measured level
        # The first batches compile, capture graphs and fill caches: not serving latency.
        kept = measured[2:] or measured[-1:]
        ttft_s, tpot_s = ttft_slo / 1e3, tpot_slo / 1e3
        serving = [serving_level(batch_size, kept, ttft_s, tpot_s)]
        for n in levels:  # one unrecorded batch, then the timed ones
            batches = itertools.islice(Batches(rows, lengths, n, pad), 1 + sweep_batches)
            runs = [generate(model, device, b, output_len, pad) for b in batches]
            serving.append(serving_level(n, runs[1:], ttft_s, tpot_s))
        record_serving(exp, serving, ttft_s, tpot_s)
        record_flops(
            exp,
            flops_per_token(
                n_matmul,
                config.num_hidden_layers,
                config.hidden_size,
                int(lengths.mean()) + output_len // 2,
                "inference",
            ),
            bench_device.name(device),
            precision,
            world.size,
        )


def generate(model, device, batch, output_len, pad_id, logger=None):
    """Generate ``output_len`` tokens for every request of ``batch`` (``(input_ids,
    attention_mask, prompt tokens)``, :func:`prompt_batch`), timed token by token.

    With ``logger`` (the measured level's rate logger), the prefill is in no sample
    window (paused here, resumed at the first token) and each later token counts one
    decode token per request (:class:`TokenClock`).

    Returns:
        the batch's latency figures (:func:`milarun.measure.latency.batch_latency`, in
        seconds) plus ``requests``, ``prompt_tokens`` and ``output_tokens``.

    Raises:
        RuntimeError: ``generate`` did not produce exactly ``output_len`` tokens.
    """
    ids, mask, n_prompt = batch
    ids, mask = ids.to(device), mask.to(device)
    sync = bench_device.sync_function(device)
    clock = TokenClock(sync, logger, len(ids))
    if logger is not None:
        logger.pause()
    if sync is not None:
        sync()
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=output_len,
            min_new_tokens=output_len,
            do_sample=False,
            streamer=clock,
            cache_implementation="static",
            pad_token_id=pad_id,
        )
    if len(clock.times) != output_len:
        raise RuntimeError(f"generate produced {len(clock.times)} tokens, not {output_len}")
    b = batch_latency(t0, clock.times[0], clock.times[-1], n_prompt, len(ids), output_len)
    b.update(requests=len(ids), prompt_tokens=n_prompt, output_tokens=output_len)
    return b


def record_serving(exp, serving, ttft_slo_s, tpot_slo_s):
    """The record's ``serving`` list (one entry per concurrency level, the measured one
    first) and, in ``metrics``, the measured level's figures and the SLOs (seconds)."""
    exp.result["serving"] = serving
    for key, value in serving[0].items():
        if key not in ("concurrency", "requests"):
            exp.metrics[key] = value
    exp.metrics["ttft_slo_s"], exp.metrics["tpot_slo_s"] = ttft_slo_s, tpot_slo_s
