"""What the LLM workloads share: Llama shapes, the model from a config, token batches, MFU.

Models come from ``transformers``' ``LlamaConfig`` / ``LlamaForCausalLM``
with random initialisation (nothing is downloaded): RMSNorm, rotary position
embeddings, SwiGLU MLPs, grouped-query attention, attention through PyTorch's
``scaled_dot_product_attention`` (``attn_implementation="sdpa"``: flash or
memory-efficient kernels on GPUs). The vocabulary is the ``llm_corpus``
tokenizer's (32,768 in the standard build, 1,024 in the tiny one), not Llama
3's 128,256, so the 8B shape has 7.2B parameters with it. ``150m`` (GPT-2
small's width and depth with Llama's blocks, 126M parameters) is for GPUs
of 5-10 GB (profiles ``5gb``, ``10gb``).

Shapes (:data:`SHAPES`) are Llama 3's published ones: ``1b`` is Llama 3.2 1B,
``8b`` Llama 3.1 8B, ``70b`` Llama 3.1 70B; ``tiny`` and ``tiny-gqa`` are for
CPU tests. Memory per GPU for training with AdamW (fp32 master weights and
two moments: 16 bytes a parameter, before activations): 1B ~20 GB, 8B
~120 GB (so FSDP over a node: ~15 GB a GPU on 8), 70B ~1.1 TB (FSDP over
nodes: ~35 GB a GPU on 32). Serving in bf16 needs 2 bytes a parameter plus
the KV cache (8B: 16 GB; 70B: 140 GB, hence tensor parallelism over a node).
"""

import hashlib
import json
import os
import pathlib
import shutil
import uuid

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ..bench import device as bench_device
from ..bench import rank_loader
from ..datasets.llm_corpus import EOS, TokenShards
from ..measure.mfu import flops_per_token, mfu, peak_tflops
from ..measure.stats import steady_state

#: name → (hidden size, MLP size, layers, attention heads, key-value heads, tied embeddings)
SHAPES = {
    "tiny": (64, 176, 2, 4, 2, False),
    "tiny-gqa": (128, 352, 2, 8, 2, False),
    "150m": (768, 2048, 12, 12, 4, False),
    "1b": (2048, 8192, 16, 32, 8, True),
    "8b": (4096, 14336, 32, 32, 8, False),
    "70b": (8192, 28672, 80, 64, 8, False),
}


def check_shape(shape, seq_len=None):
    """Refuse an unknown shape or a sequence length it cannot take (ValueError, one line)."""
    if shape not in SHAPES:
        raise ValueError(f"--shape must be one of {', '.join(SHAPES)}, not {shape!r}")
    if seq_len is not None and not 1 <= seq_len <= 131_072:
        raise ValueError(f"--seq-len must be from 1 to 131072 (Llama 3.1's context), not {seq_len}")


def llama_config(shape, vocab_size, max_positions):
    """The ``LlamaConfig`` of ``shape`` with this vocabulary and context (tokens)."""
    check_shape(shape)
    hidden, mlp, layers, heads, kv_heads, tied = SHAPES[shape]
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        rope_theta=500_000.0,
        tie_word_embeddings=tied,
        attn_implementation="sdpa",
        use_cache=False,
    )


def build_model(config, device=None, dtype=None):
    """A random-initialised ``LlamaForCausalLM`` of ``config`` (seeded by ``init_torch``).

    Built on ``device`` directly when it is not the CPU (a GPU, or ``meta``): an 8B model
    is not built in host memory first.
    """
    if bench_device.kind(device) not in (None, "cpu"):
        with torch.device(device):
            model = LlamaForCausalLM(config)
    else:
        model = LlamaForCausalLM(config)
    if dtype is not None:
        model = model.to(dtype)
    return model


def matmul_params(model):
    """Parameters of the model's linear layers, output projection included (``N`` of
    :func:`milarun.measure.mfu.flops_per_token`); under FSDP, the full (unsharded) count."""
    total = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            w = module.weight
            total += w.numel() if not hasattr(w, "full_tensor") else w.shape.numel()
    return total


class TokenWindows(torch.utils.data.Dataset):
    """A map-style ``Dataset`` of ``(input_ids, labels)`` pairs of ``seq_len`` tokens
    (int64), packed from the memory-mapped shards (:class:`TokenShards`)."""

    def __init__(self, shards, seq_len):
        self.shards, self.seq_len = shards, seq_len
        self.windows = shards.sequences(seq_len)

    def __len__(self):
        return len(self.windows)

    def __getitem__(self, i):
        ids = torch.from_numpy(self.shards.window(*self.windows[i], self.seq_len))
        return ids[:-1], ids[1:]


def token_loader(exp, shards, seq_len, batch_size, workers, world):
    """This rank's ``DataLoader`` of :class:`TokenWindows` (``batch_size`` sequences of
    ``seq_len`` tokens a batch), shuffled with ``--seed`` (:func:`milarun.bench.rank_loader`).

    Raises:
        ValueError: the shards hold no full batch for every rank.
    """
    return rank_loader(
        TokenWindows(shards, seq_len),
        batch_size,
        workers,
        world.device,
        world,
        exp.options["seed"],
        f"sequences of {seq_len} tokens",
        source=shards.folder,
        hint="lower --batch-size or --seq-len, or build a larger llm_corpus",
    )


def causal_lm_loss(net, x, y):
    """Mean next-token cross-entropy of ``net`` on inputs ``x`` and labels ``y``,
    computed in fp32."""
    logits = net(input_ids=x).logits
    return torch.nn.functional.cross_entropy(
        logits.float().view(-1, logits.size(-1)), y.reshape(-1)
    )


def record_flops(exp, flops_tok, name, precision, world_size=1):
    """Record ``flops_per_token``, the device's peak and, from the steady state of the
    samples measured so far, ``tflops`` (achieved TFLOP/s per device) and ``mfu``.

    Throughput counts the tokens of every rank (global), so the per-device rate
    is ``rate / world_size``. Without a steady state (a failed run), only the
    constants are recorded.
    """
    peak = peak_tflops(name, precision)
    exp.metrics.update(
        {"flops_per_token": float(flops_tok), "device_name": name, "peak_tflops": peak}
    )
    if exp.rate is None:
        return
    try:
        rate, _, _ = steady_state(exp.rate.samples)
    except ValueError:
        rate = None
    if rate:
        achieved, frac = mfu(rate / world_size, flops_tok, peak)
        exp.metrics["tflops"] = achieved
        exp.metrics["mfu"] = frac


#: milarun precision → the dtype :func:`write_served_model` saves the weights in.
SERVED_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: The file in a served model's folder that says what it was written from.
SERVED_STAMP = "milarun-model.json"


def _served_stamp(path):
    """The stamp of the served model at ``path`` (a dict), or None when it has none or it is
    not a JSON object."""
    try:
        with open(os.path.join(path, SERVED_STAMP), "rb") as f:
            stamp = json.loads(f.read(65536))
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def _reuse_served(path, stamp):
    """True when ``path`` holds the model of ``stamp``; False when there is nothing there
    (or an empty folder).

    Raises:
        ValueError: ``path`` holds something else (another stamp, or no stamp at all).
    """
    if not os.path.lexists(path):
        return False
    if os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
        return False  # an empty folder: the rename replaces it
    found = _served_stamp(path)
    if found != stamp:
        what = "no " + SERVED_STAMP if found is None else f"a model of {found}"
        raise ValueError(
            f"{path}: holds {what}, not the model asked for ({stamp}); remove it or choose "
            f"another path"
        )
    return True


def write_served_model(path, shape, corpus_dir, *, precision="fp32", seed=0, max_positions=2048):
    """Write a model folder a serving engine loads (``transformers serve``, vLLM, SGLang):
    the Llama model of ``shape`` (:func:`llama_config`, :func:`build_model`) with random
    weights seeded by ``seed``, the ``llm_corpus`` tokenizer, and a stamp.

    The folder holds ``config.json``, ``generation_config.json`` and
    ``model.safetensors`` (``save_pretrained``, weights in ``precision``'s dtype), the
    tokenizer of ``corpus_dir/tokenizer.json`` as a ``PreTrainedTokenizerFast`` whose end
    of text is ``<|endoftext|>`` (``tokenizer.json``, ``tokenizer_config.json``), and
    ``milarun-model.json``: shape, precision, seed, context and the tokenizer's SHA-256.
    The generation config has no end-of-text ID and ``do_sample=False``: random weights
    emit end-of-text by chance, and an engine must produce ``max_tokens`` every time
    (vLLM and SGLang also stop at the tokenizer's end of text unless a request says
    ``ignore_eos``). The model's context is ``max_positions`` tokens.

    Writing is atomic and may be shared by several processes: each writes a temporary
    sibling folder and renames it to ``path``; the loser of that race removes its own and
    uses the winner's. A ``path`` whose stamp is the same is reused as it is. Host memory
    while writing: 4 bytes a parameter (the model is built in fp32, then cast).

    Args:
        path: the model folder to write.
        shape: a key of :data:`SHAPES`.
        corpus_dir: a built ``llm_corpus`` (``milarun dataset llm_corpus``).
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        seed: the ``torch.manual_seed`` of the weights (the caller's RNG state is kept).
        max_positions: the context length (tokens).

    Returns:
        ``path`` as a ``pathlib.Path``.

    Raises:
        ValueError: an unknown shape or precision, a bad context length, or ``path``
            holding another model (its stamp differs, or it has none): one line naming it.
        DatasetError: ``corpus_dir`` is not a valid ``llm_corpus`` (a ``ValueError``).
    """
    from transformers import PreTrainedTokenizerFast  # heavy: only when a model is written

    check_shape(shape, max_positions)
    if precision not in SERVED_DTYPES:
        raise ValueError(f"precision must be one of {', '.join(SERVED_DTYPES)}, not {precision!r}")
    path = pathlib.Path(path)
    corpus = TokenShards(corpus_dir)  # checks the corpus; its vocabulary and end of text
    tokenizer_file = pathlib.Path(corpus_dir) / "tokenizer.json"
    with open(tokenizer_file, "rb") as f:
        tokenizer_sha = hashlib.sha256(f.read()).hexdigest()
    stamp = {
        "shape": shape,
        "precision": precision,
        "seed": seed,
        "max_positions": max_positions,
        "tokenizer_sha256": tokenizer_sha,
    }
    if _reuse_served(path, stamp):
        return path

    path.parent.mkdir(parents=True, exist_ok=True)
    # A sibling, so the rename stays on one file system; hidden, and unique per writer.
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        config = llama_config(shape, corpus.vocab_size, max_positions)
        # The corpus tokenizer has no beginning-of-text or padding token, and no end of
        # text may stop generation: no special IDs in the config (Llama's defaults 1 and 2
        # are ordinary tokens of this vocabulary).
        config.bos_token_id = config.eos_token_id = config.pad_token_id = None
        config.use_cache = True  # served: generation keeps its KV cache (training turns it off)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build_model(config, dtype=SERVED_DTYPES[precision])
        model.generation_config.eos_token_id = None
        model.generation_config.bos_token_id = None
        model.generation_config.pad_token_id = None
        model.generation_config.do_sample = False
        model.save_pretrained(tmp, safe_serialization=True)
        del model
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_file=str(tokenizer_file), eos_token=EOS, model_max_length=max_positions
        )
        if tokenizer.eos_token_id != corpus.eos_id:
            raise ValueError(
                f"{tokenizer_file}: {EOS} is id {tokenizer.eos_token_id}, not the corpus's "
                f"eos_id {corpus.eos_id}"
            )
        tokenizer.save_pretrained(tmp)
        # transformers 5 names the class "TokenizersBackend", which the transformers 4 of
        # an engine's own environment (vLLM, SGLang) does not know; both load this name.
        tok_config_file = tmp / "tokenizer_config.json"
        tok_config = json.loads(tok_config_file.read_text())
        tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
        tok_config_file.write_text(json.dumps(tok_config, indent=2) + "\n")
        with open(tmp / SERVED_STAMP, "w") as f:
            json.dump(stamp, f, indent=1)
            f.write("\n")
        try:
            os.rename(tmp, path)
        except OSError:
            # Another writer renamed its folder first (ENOTEMPTY/EEXIST): use its model.
            if not os.path.isdir(path):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _reuse_served(path, stamp)  # the winner's model must be the one asked for
    return path


__all__ = [
    "SHAPES",
    "check_shape",
    "llama_config",
    "build_model",
    "matmul_params",
    "TokenWindows",
    "token_loader",
    "causal_lm_loss",
    "record_flops",
    "flops_per_token",
    "write_served_model",
]
