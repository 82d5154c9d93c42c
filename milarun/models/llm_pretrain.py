"""llm_pretrain: causal-LM pre-training of a Llama-architecture model from token shards.

One process per GPU (plan type ``per-gpu``: the ``1b`` shape on every GPU at
once), or one job over the GPUs of a node (``njobs``) or of several nodes
(``multi-node``, ``node-progression``) under torchrun, where the model is
sharded with PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``, one
unit per transformer block plus the root): parameters, gradients and AdamW
states are split over the ranks, each block's parameters are all-gathered
before its forward and backward and its gradients reduce-scattered after.
With ``--hsdp-replicas R`` (R > 1; 0 for one per node) the ranks form an ``R × (world / R)``
device mesh: sharded within a group, replicated across groups (hybrid
sharding, HSDP: all-gathers stay inside a node, only the gradient all-reduce
crosses the network).

The learning rate (``--lr``, the peak) warms up linearly over the first 10 % of the run's
optimizer steps (``--max-count`` tokens), then decays along a cosine to 10 % of the peak at
the end of the count (:func:`milarun.bench.step.warmup_cosine`; AdamW, betas 0.9/0.95,
weight decay 0.1). With ``--grad-accum N`` the gradients are reduced once per optimizer
step, on the last of its N micro-batches: DDP runs the others under ``no_sync()``, FSDP2
under ``set_requires_gradient_sync(False)`` (no reduce-scatter; each rank accumulates
unsharded gradients until the last).

Mixed precision as the field runs it: bf16 parameters and compute with fp32
gradient reduction and fp32 master weights (FSDP2's ``MixedPrecisionPolicy``;
``torch.autocast`` without FSDP). AdamW is fused on CUDA and XPU
(:func:`milarun.bench.step.make_optimizer`). ``--activation-checkpointing``
recomputes each block's activations in the backward pass (transformers'
gradient checkpointing); ``--compile`` compiles each block with
``torch.compile`` before sharding (torchtitan's way).

With ``--soak-every N`` (under torchrun with restarts: the profile's ``"restarts"``) the run
is a soak (:mod:`milarun.models.soak`): a checkpoint every ``N`` optimizer steps, one rank
killed at a seeded step, torchrun's restart from the latest checkpoint (the model, the
optimizer, the schedule's step and the data position), and the time the fault cost in the
record's ``soak_*`` metrics.

Data: ``llm_corpus`` (``milarun dataset llm_corpus``): pre-tokenized shards
read through ``numpy.memmap`` by a ``DataLoader``, packed into sequences of
``--seq-len`` tokens; each rank reads its own share (``DistributedSampler``).

An **item is one token** of the global batch: each micro-batch counts
``batch_size × seq_len × world_size``. Metrics: ``flops_per_token`` (6N plus
the attention term, :mod:`milarun.measure.mfu`), ``tflops`` (achieved model
TFLOP/s per device over the steady state), ``mfu`` (fraction of the device's
datasheet peak, None for devices without one), the shape's parameter count,
and ``peak_memory_mib`` in the record. Stresses: tensor-core FLOPs
(matmuls), HBM bandwidth (norms, activations), and under FSDP the
all-gather / reduce-scatter bandwidth of NVLink and the network.
"""

import contextlib

import torch
from coleo import Option, default, tooled
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

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
from ..bench.step import MixedPrecisionStep, gradient_sync, make_optimizer, warmup_cosine
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
from .soak import Soak

FSDP_FP16_REFUSED = (
    "--precision fp16 with FSDP needs a sharded gradient scaler; "
    "use bf16 (what the field pre-trains in) or fp32"
)


#: Its loss must fall (milarun.bench.experiment.loss_declaration).
LOSS_MUST_FALL = "the llm_corpus text has structure, so a random-initialised model learns it"


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.llm_pretrain:main -d DATAROOT -- ARGS``,
    or under torchrun for FSDP. Needs dataset ``llm_corpus``. Items are tokens."""
    exp.cli(train, argv)


def optimizer_steps(max_count, tokens_per_step):
    """Optimizer steps of a run of ``max_count`` tokens (``--max-count``), at
    ``tokens_per_step`` global tokens per optimizer step: ``ceil(max_count /
    tokens_per_step)``, at least 1 (1 without a count)."""
    if not max_count:
        return 1
    return max(1, -(-int(max_count) // int(tokens_per_step)))


def shard_model(model, world, precision, replicas=1):
    """Apply FSDP2 to ``model`` over ``world``: one unit per block, then the root. Its
    ``MixedPrecisionPolicy`` casts (bf16 parameters, fp32 reduction), so no autocast.

    Args:
        replicas: R > 1: hybrid sharding over an ``R × (size / R)`` mesh.

    Raises:
        ValueError: ``replicas`` does not divide the world size, or fp16.
    """
    if precision == "fp16":
        raise ValueError(FSDP_FP16_REFUSED)
    if replicas < 1 or world.size % replicas:
        raise ValueError(f"--hsdp-replicas {replicas} does not divide the world size {world.size}")
    kind = bench_device.kind(world.device)
    if replicas > 1:
        mesh = init_device_mesh(
            kind, (replicas, world.size // replicas), mesh_dim_names=("replicate", "shard")
        )
    else:
        mesh = init_device_mesh(kind, (world.size,))
    policy = MixedPrecisionPolicy()
    if precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.model.layers:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def parallelize(exp, model, world, precision, replicas, ddp):
    """``model`` as the training loop runs it over ``world``; how, in
    ``exp.metrics["parallelism"]``.

    One rank: the model itself (``"none"``). Otherwise DDP with ``ddp`` (``"ddp"``),
    else FSDP2 in place (:func:`shard_model`; ``"fsdp"``, or ``"hsdp"`` with
    ``replicas`` > 1; ``replicas`` 0 is one replica per node).

    Raises:
        ValueError: as :func:`shard_model`.
    """
    if world.size == 1:
        how, net = "none", model
    elif ddp:
        how, net = "ddp", wrap_ddp(model, world.device)
    else:
        if replicas == 0:  # one replica per node: shard inside nodes only
            replicas = world.size // world.local_size
        shard_model(model, world, precision, replicas)
        how, net = ("hsdp" if replicas > 1 else "fsdp"), model
    exp.metrics["parallelism"] = how
    return net


def accumulate(net, micro, accum):
    """The context to run micro-batch ``micro`` (0-based, over the run) of a gradient
    accumulation over ``accum`` in: the gradients are reduced on the group's last
    micro-batch only. DDP: ``no_sync()`` on the others (:func:`gradient_sync`). FSDP2
    (a model with ``set_requires_gradient_sync``): that flag set to whether this is the
    last, so the others skip the reduce-scatter (left alone with ``accum`` 1)."""
    set_sync = getattr(net, "set_requires_gradient_sync", None)
    if set_sync is not None and accum > 1:
        set_sync((micro + 1) % accum == 0)
    return gradient_sync(net, micro, accum)


def fit(steps, net, model, optimizer, schedule, mp, autocast, grad_accum, world, after=None):
    """The training loop over ``steps`` (:func:`milarun.bench.dataloop`'s ``(step, (x, y))``):
    forward and loss under ``autocast``, backward, and an optimizer step with the schedule's
    every ``grad_accum`` micro-batches; each step counts its tokens over the world.
    ``after(k)``, where given, runs after the loop's ``k``-th optimizer step (the soak's
    checkpoints and fault, :class:`milarun.models.soak.Soak`)."""
    for micro, (step, (x, y)) in enumerate(steps):
        x = x.to(world.device, non_blocking=True)
        y = y.to(world.device, non_blocking=True)
        with accumulate(net, micro, grad_accum):
            with autocast:
                loss = causal_lm_loss(net, x, y)
            mp.backward(loss / grad_accum)
        if (micro + 1) % grad_accum == 0:
            mp.step(optimizer, clip_norm=1.0, params=model.parameters())
            mp.update()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()
            if after is not None:
                after((micro + 1) // grad_accum)
        step.set_count(x.numel() * world.size)
        step.log(loss=loss.detach())


@tooled
def train(exp):
    # Model shape: tiny, tiny-gqa, 1b, 8b or 70b (milarun.models.llm.SHAPES)
    shape: Option = default("1b")
    # Tokens per sequence
    seq_len: Option & int = default(2048)
    batch_size = batch_size_option(default=4)  # sequences per micro-batch, per rank
    # Micro-batches per optimizer step (gradient accumulation)
    grad_accum: Option & int = default(1)
    precision = precision_option(default="bf16")  # fp16 only without FSDP
    lr = lr_option(default=3e-4)  # peak of the warm-up + cosine schedule; AdamW
    # Recompute each block's activations in the backward pass
    activation_checkpointing: Option & bool = default(False)
    # Compile each transformer block with torch.compile
    compile: Option & bool = default(False)
    # Hybrid sharding: replicate over this many groups of ranks (1: plain FSDP; 0: one per node)
    hsdp_replicas: Option & int = default(1)
    # Replicate the model with DDP instead of sharding it with FSDP2 (worlds of 2+ ranks)
    ddp: Option & bool = default(False)
    # Soak mode: checkpoint every this many optimizer steps, kill one rank once, restart
    # (0: off; needs torchrun's restarts, milarun.models.soak)
    soak_every: Option & int = default(0)
    # Folder every rank sees for the soak's checkpoints (default: the dataroot)
    soak_folder: Option = default("")
    workers = workers_option(default=1)
    backend = backend_option()

    check_shape(shape, seq_len)
    if soak_every < 0:
        raise ValueError("--soak-every must be 0 (off) or a number of optimizer steps")
    if batch_size < 1 or grad_accum < 1:
        raise ValueError("--batch-size and --grad-accum must be at least 1")
    device = init_torch(exp)
    shards = TokenShards(require(exp.dataroot, "llm_corpus"))
    with process_group(exp, device, backend) as world:
        device = world.device
        config = llama_config(shape, shards.vocab_size, seq_len)
        model = build_model(config, device)
        n_matmul = matmul_params(model)
        tokens_per_step = batch_size * seq_len * grad_accum * world.size
        exp.metrics.update(
            {
                "shape": shape,
                "params": sum(p.numel() for p in model.parameters()),
                "seq_len": seq_len,
                "world_size": world.size,
                "global_batch_tokens": tokens_per_step,
            }
        )
        if activation_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        if compile:
            for block in model.model.layers:
                block.compile()
        net = parallelize(exp, model, world, precision, hsdp_replicas, ddp)
        # What this rank holds: under FSDP its shard of every parameter (a test checks it).
        exp.metrics["params_local"] = sum(
            (p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters()
        )
        mp = MixedPrecisionStep(device, precision)
        # Under FSDP2 the mixed-precision policy casts; elsewhere autocast does.
        sharded = exp.metrics["parallelism"] in ("fsdp", "hsdp")
        autocast = contextlib.nullcontext() if sharded else mp.autocast
        net.train()
        optimizer = make_optimizer(
            "AdamW", model.parameters(), device, lr=lr, betas=(0.9, 0.95), weight_decay=0.1
        )
        # The schedule spans the optimizer steps that --max-count tokens take.
        total_steps = optimizer_steps(exp.options["max_count"], tokens_per_step)
        schedule = warmup_cosine(optimizer, total_steps)
        loader = token_loader(exp, shards, seq_len, batch_size, workers, world)
        flops_tok = flops_per_token(
            n_matmul, config.num_hidden_layers, config.hidden_size, seq_len, "train"
        )
        soak, done, after = None, 0, None
        if soak_every:
            folder = soak_folder or str(exp.dataroot)
            seed = exp.options["seed"]
            soak = Soak(exp, world, folder, soak_every, total_steps, exp.metrics["params"], seed)
        ok = False
        try:
            if soak is not None:
                done = soak.resume(model, optimizer)
                for _ in range(done):  # the schedule where the checkpoint left it
                    schedule.step()
                # what is left of the run's count after the steps the checkpoint kept
                exp.options["max_count"] = max(1, exp.options["max_count"] - done * tokens_per_step)
                pause = lambda: exp.rate.paused()  # noqa: E731
                after = lambda k: soak.after_step(done + k, model, optimizer, pause)  # noqa: E731
            steps = dataloop(exp, Epochs(loader, skip=done * grad_accum))
            if soak is not None:
                steps = soak.wrap(steps)
            agree_on_counts(exp, world)
            fit(steps, net, model, optimizer, schedule, mp, autocast, grad_accum, world, after)
            ok = True
        finally:
            record_flops(exp, flops_tok, bench_device.name(device), precision, world.size)
            if soak is not None:
                soak.finish(ok)
