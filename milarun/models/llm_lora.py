"""llm_lora: LoRA fine-tuning of a Llama-architecture model (``peft``), on one GPU or DDP.

The base model (``--shape``, ``8b`` by default, random weights) is frozen in
``--precision`` (bf16: 2 bytes a parameter, 16 GB for the 8B shape); ``peft``
adds low-rank adapters of rank ``--rank`` (alpha = 2 × rank, no dropout) on
the attention projections (query, key, value, output) and the MLP
projections (gate, up, down), kept in fp32, and only they are trained
(AdamW, fused on CUDA/XPU). The forward pass runs under bf16 autocast. Under
torchrun (``njobs``) the adapters' gradients are all-reduced with
``DistributedDataParallel`` (the frozen base needs none): milabench's "LoRA
DDP over a node".

Data: ``llm_corpus`` token shards, packed into ``--seq-len`` sequences
(fine-tuning on instruction data reads the same way once tokenized).

An **item is one token** of the global batch (``batch_size × seq_len ×
world_size`` per step). Metrics: ``trainable_params`` (the adapters),
``params``, ``grad_params_non_adapter`` (parameters outside the adapters that
got a gradient: must be 0, checked after the first step), ``flops_per_token``
(4N + 6N_adapters + attention: no weight gradients for the frozen base,
:mod:`milarun.measure.mfu`), ``tflops`` and ``mfu``. Stresses: tensor-core
FLOPs of the frozen base's forward and backward, HBM capacity (activations
of long sequences over a 16 GB model).
"""

import contextlib

import torch
from coleo import Option, default, tooled
from peft import LoraConfig, get_peft_model

from ..bench import Epochs, dataloop, init_torch
from ..bench import device as bench_device
from ..bench.distributed import agree_on_counts, process_group, wrap_ddp
from ..bench.options import (
    backend_option,
    batch_size_option,
    lr_option,
    precision_option,
    workers_option,
)
from ..bench.step import MixedPrecisionStep, make_optimizer
from ..datasets import require
from ..datasets.llm_corpus import TokenShards
from .llm import (
    build_model,
    causal_lm_loss,
    check_shape,
    flops_per_token,
    llama_config,
    matmul_params,
    record_flops,
    token_loader,
)

#: The projections that get adapters (Llama's module names).
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_BASE_DTYPES = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "tf32": torch.float32,
}


#: Its loss must fall (milarun.bench.experiment.loss_declaration).
LOSS_MUST_FALL = "the llm_corpus text has structure, so the adapters lower the loss"


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.llm_lora:main -d DATAROOT -- ARGS``,
    or under torchrun for DDP. Needs ``llm_corpus``. Items are tokens."""
    exp.cli(train, argv)


def add_adapters(model, rank):
    """``peft``'s LoRA model of ``model``: adapters of ``rank`` on :data:`TARGETS`,
    everything else frozen."""
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        lora_dropout=0.0,
        target_modules=list(TARGETS),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def non_adapter_grads(model):
    """Names of parameters outside the adapters that hold a gradient (should be none)."""
    return [n for n, p in model.named_parameters() if p.grad is not None and "lora_" not in n]


def check_frozen(exp, model):
    """Record ``grad_params_non_adapter`` after the first backward pass: the frozen base
    must get no gradient.

    Raises:
        RuntimeError: a parameter outside the adapters got a gradient.
    """
    wrong = non_adapter_grads(model)
    exp.metrics["grad_params_non_adapter"] = len(wrong)
    if wrong:
        raise RuntimeError(f"frozen parameters got gradients: {wrong[:3]}")


@tooled
def train(exp):
    # Model shape: tiny, tiny-gqa, 1b, 8b or 70b (milarun.models.llm.SHAPES)
    shape: Option = default("8b")
    # LoRA rank of every adapter
    rank: Option & int = default(16)
    # Tokens per sequence
    seq_len: Option & int = default(2048)
    batch_size = batch_size_option(default=2)  # sequences per batch, per rank
    precision = precision_option(default="bf16")  # base weights and autocast
    lr = lr_option(default=2e-4)  # the adapters' (AdamW)
    # Recompute each block's activations in the backward pass
    activation_checkpointing: Option & bool = default(False)
    workers = workers_option(default=1)
    backend = backend_option()

    check_shape(shape, seq_len)
    if rank < 1 or batch_size < 1:
        raise ValueError("--rank and --batch-size must be at least 1")
    device = init_torch(exp)
    shards = TokenShards(require(exp.dataroot, "llm_corpus"))
    with process_group(exp, device, backend) as world:
        device = world.device
        config = llama_config(shape, shards.vocab_size, seq_len)
        base = build_model(config, device, dtype=_BASE_DTYPES[precision])
        n_matmul = matmul_params(base)
        if activation_checkpointing:
            base.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        model = add_adapters(base, rank)
        trainable = [p for p in model.parameters() if p.requires_grad]
        n_adapter = sum(p.numel() for p in trainable)
        exp.metrics.update(
            {
                "shape": shape,
                "rank_lora": rank,
                "seq_len": seq_len,
                "world_size": world.size,
                "trainable_params": n_adapter,
                "params": sum(p.numel() for p in model.parameters()),
            }
        )
        net = wrap_ddp(model, device) if world.size > 1 else model
        net.train()
        mp = MixedPrecisionStep(device, precision)
        autocast = mp.autocast if precision in ("bf16", "fp16") else contextlib.nullcontext()
        optimizer = make_optimizer("AdamW", trainable, device, lr=lr, weight_decay=0.0)
        loader = token_loader(exp, shards, seq_len, batch_size, workers, world)
        flops_tok = flops_per_token(
            n_matmul,
            config.num_hidden_layers,
            config.hidden_size,
            seq_len,
            "lora",
            adapter_params=n_adapter,
        )
        steps = dataloop(exp, Epochs(loader))
        agree_on_counts(exp, world)
        try:
            for i, (step, (x, y)) in enumerate(steps):
                x = x.to(device, non_blocking=True)
                y = y.to(device, non_blocking=True)
                with autocast:
                    loss = causal_lm_loss(net, x, y)
                mp.backward(loss)
                if i == 0:
                    check_frozen(exp, model)
                mp.step(optimizer)
                mp.update()
                optimizer.zero_grad(set_to_none=True)
                step.set_count(x.numel() * world.size)
                step.log(loss=loss.detach())
        finally:
            record_flops(exp, flops_tok, bench_device.name(device), precision, world.size)
