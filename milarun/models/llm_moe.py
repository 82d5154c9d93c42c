"""llm_moe: mixture-of-experts pre-training with expert parallelism, from ``llm_corpus`` tokens.

The model is ``transformers``' ``Qwen3MoeForCausalLM`` built from a config with random
weights (nothing is downloaded): grouped-query attention through ``sdpa``, RMSNorm, rotary
embeddings, and in every layer a top-k softmax router over SwiGLU experts stored as 3-D
tensors. Its MoE blocks are replaced by :class:`ExpertParallelMoe`, which keeps the block's
router and holds only this rank's experts: the ``ep`` ranks of an expert-parallel group
(``--ep-size``; 0: the ranks of one node) hold ``experts / ep`` experts each.

One MoE layer's step over a group of ``ep`` ranks (each with its own ``T`` tokens):

1. the router picks ``k`` experts per token (``T × k`` assignments), sorted by expert;
2. the assignment counts per expert are exchanged (``all_to_all_single`` of ``E`` integers);
3. **dispatch**: each rank sends each token copy to the rank holding its expert
   (``torch.distributed.all_to_all_single`` with split sizes, ``[T·k, H]`` in total);
4. each rank runs its experts on what it received, one grouped matmul per projection
   (``torch.nn.functional.grouped_mm``: experts as batched matmuls of ragged groups);
5. **combine**: the reverse exchange sends the outputs back, and each token sums its ``k``
   outputs weighted by the router's probabilities.

The backward pass runs the two exchanges in reverse (:class:`_AllToAll`). Every exchange
(counts, dispatch, combine, forward and backward) is timed as its own figure: device events
on CUDA, the host clock elsewhere (gloo's all-to-all is synchronous).

The other parameters (attention, norms, routers, embeddings) are data-parallel with FSDP2
(``fully_shard`` per block and the root, over every rank). Over several expert-parallel
groups (several nodes with the default ``--ep-size``), each expert has one copy per group:
those copies are sharded with FSDP2 too, over the ranks that hold the same experts
(torchtitan's way), so every parameter is split over the whole world. A rank's expert
gradient sums the losses of its whole group; FSDP averages it over the groups and
:func:`scale_expert_grads` divides it by the group's size, so that it is the global batch's
mean gradient as the others are. The gradients' global 2-norm is clipped to 1 across both
kinds (:func:`clip_gradients`).

An **item is one token** of the global batch (``batch_size × seq_len × world_size`` a
step). Metrics: ``flops_per_token`` from the **active** parameters (PaLM's ``6N + 12LdT``
with ``N`` the matmul parameters a token goes through: attention, router, its ``k``
experts and the output projection; :func:`milarun.measure.mfu.active_matmul_params`),
``tflops``, ``mfu``, ``params`` / ``active_params`` / ``params_local``, ``all_to_all_s``
(seconds of exchange over the run), ``all_to_all_share`` (its share of the training
loop's wall time), ``all_to_all_calls``; the router's load over the global batch
(:class:`LoadMeter`): ``tokens_per_expert_mean`` / ``_min`` / ``_max`` (of the tokens per
expert and layer per step, averaged over the steps), ``expert_imbalance`` (max ÷ mean
tokens per expert, averaged over layers and steps; 1 is perfect balance) and
``expert_imbalance_max``; ``memory_per_gpu_gb``; with ``--check-exchange``,
``exchange_check_loss_error`` and ``exchange_check_grad_error``
(:func:`check_exchange_step`).

No auxiliary load-balancing loss is added: the imbalance figures show what the router
does, which is part of what a buyer's MoE training pays for.
"""

import contextlib
import copy
import time

import torch
import torch.distributed as dist
from coleo import Option, default, tooled
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.activations import ACT2FN
from transformers.models.qwen3_moe.modeling_qwen3_moe import (
    Qwen3MoeSparseMoeBlock,
    Qwen3MoeTopKRouter,
)

from ..bench import Epochs, dataloop, init_torch
from ..bench import device as bench_device
from ..bench.distributed import World, agree_on_counts, process_group
from ..bench.options import (
    backend_option,
    batch_size_option,
    lr_option,
    precision_option,
    workers_option,
)
from ..bench.step import MixedPrecisionStep, make_optimizer, warmup_cosine
from ..datasets import require
from ..datasets.llm_corpus import TokenShards
from ..measure.mfu import active_matmul_params
from .llm import causal_lm_loss, flops_per_token, record_flops, token_loader
from .llm_pretrain import FSDP_FP16_REFUSED, optimizer_steps

#: name → (hidden, expert MLP size, layers, heads, KV heads, head size, experts, top-k).
#: The classes' published widths, depths and expert counts (GPT-OSS-20B's model card,
#: Qwen3-30B-A3B's config.json, DeepSeek-V3's report) on Qwen3-MoE's blocks: no shared
#: expert, no MLA, no attention sinks, so the counts are close to, not equal to, theirs.
SHAPES = {
    "tiny": (64, 64, 2, 4, 2, 16, 8, 2),
    "gpt-oss-20b": (2880, 2880, 24, 64, 8, 64, 32, 4),
    "qwen3-30b-a3b": (2048, 768, 48, 32, 4, 128, 128, 8),
    "deepseek-v3": (7168, 2048, 61, 128, 8, 128, 256, 8),
}

FP16_REFUSED = (
    "--precision fp16 is not offered for llm_moe: use bf16 (what the field trains in) or fp32"
)

#: Its loss must fall (milarun.bench.experiment.loss_declaration).
LOSS_MUST_FALL = "the llm_corpus text has structure, so a random-initialised model learns it"


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.llm_moe:main -d DATAROOT -- ARGS``, under
    torchrun for expert parallelism. Needs dataset ``llm_corpus``. Items are tokens."""
    exp.cli(train, argv)


def check_options(shape, seq_len, world_size, ep_size, local_size):
    """The expert-parallel group size for these options (``ep_size``, or ``local_size``
    when it is 0: one group per node).

    Raises:
        ValueError: an unknown shape, a sequence length outside 1..131,072, or an
            expert-parallel size that does not divide the experts or the world (one line).
    """
    if shape not in SHAPES:
        raise ValueError(f"--shape must be one of {', '.join(SHAPES)}, not {shape!r}")
    if not 1 <= seq_len <= 131_072:
        raise ValueError(f"--seq-len must be from 1 to 131072, not {seq_len}")
    ep = ep_size or local_size
    experts = SHAPES[shape][6]
    if ep < 1 or experts % ep:
        raise ValueError(
            f"--ep-size {ep}: the {experts} experts of shape {shape} do not divide across {ep} "
            f"ranks"
        )
    if world_size % ep:
        raise ValueError(f"--ep-size {ep} does not divide the world size {world_size}")
    return ep


def moe_config(shape, vocab_size, max_positions):
    """The ``Qwen3MoeConfig`` of ``shape`` (:data:`SHAPES`) with this vocabulary and context
    (tokens); every layer is an MoE layer, top-k probabilities renormalised."""
    hidden, expert_mlp, layers, heads, kv_heads, head_dim, experts, top_k = SHAPES[shape]
    return Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=4 * hidden,  # dense MLP size: unused, every layer is MoE
        moe_intermediate_size=expert_mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        num_experts=experts,
        num_experts_per_tok=top_k,
        norm_topk_prob=True,
        max_position_embeddings=max_positions,
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
        use_cache=False,
    )


class ExchangeClock:
    """Seconds spent in the all-to-all exchanges (:attr:`seconds`, :attr:`calls`).

    Used as a context around each collective: CUDA events on CUDA devices (resolved in
    batches, so no step waits for the device), the host clock elsewhere.
    """

    def __init__(self, device=None):
        self.cuda = bench_device.is_cuda(device)
        self.seconds, self.calls, self._pending, self._t0 = 0.0, 0, [], 0.0

    @contextlib.contextmanager
    def __call__(self):
        self.calls += 1
        if self.cuda:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            yield
            end.record()
            self._pending.append((start, end))
            if len(self._pending) >= 4096:
                self.resolve()
        else:
            t0 = time.perf_counter()
            yield
            self.seconds += time.perf_counter() - t0

    def resolve(self):
        """Add the recorded events' times to :attr:`seconds` (waits for the last)."""
        if self._pending:
            self._pending[-1][1].synchronize()
            self.seconds += sum(s.elapsed_time(e) for s, e in self._pending) / 1000
            self._pending = []


def _exchange(x, out_splits, in_splits, group, clock):
    """``all_to_all_single`` of the rows of ``x`` ([sum(in_splits), ...]): ``in_splits[r]``
    rows go to rank ``r`` of ``group``, ``out_splits[r]`` come from it; timed by ``clock``."""
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    with clock():
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """:func:`_exchange` with its backward: the gradients go back by the reverse exchange."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group, clock):
        ctx.meta = (out_splits, in_splits, group, clock)
        return _exchange(x, out_splits, in_splits, group, clock)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits, group, clock = ctx.meta
        return _exchange(grad, in_splits, out_splits, group, clock), None, None, None, None


class LoadMeter:
    """Tokens routed to each expert, per layer and step, over the global batch.

    Each MoE layer adds its step's assignment counts to :attr:`current` (``[L, E]``);
    :meth:`step` sums them over the ranks (one small all-reduce) and accumulates, on the
    device, the counts and the imbalance (max ÷ mean over the experts of a layer).
    """

    def __init__(self, layers, experts, device, group=None):
        self.group = group
        self.current = torch.zeros(layers, experts, dtype=torch.float64, device=device)
        self.total = torch.zeros_like(self.current)
        self.imbalance_sum = torch.zeros(layers, dtype=torch.float64, device=device)
        self.imbalance_max = torch.zeros_like(self.imbalance_sum)
        self.steps = 0

    def step(self):
        """Close a step: reduce its counts over the ranks and accumulate them."""
        if self.group is not None:
            dist.all_reduce(self.current, group=self.group)
        mean = self.current.mean(dim=1).clamp(min=1e-12)
        ratio = self.current.max(dim=1).values / mean
        self.total += self.current
        self.imbalance_sum += ratio
        torch.maximum(self.imbalance_max, ratio, out=self.imbalance_max)
        self.current.zero_()
        self.steps += 1

    def metrics(self):
        """Scalars for the record (its metrics are numbers): of the table of tokens per
        expert per step (``[L, E]``, the mean over the steps), its ``tokens_per_expert_mean``,
        ``_min`` and ``_max``; ``expert_imbalance`` (the mean over layers and steps of max ÷
        mean) and ``expert_imbalance_max`` (the worst layer's worst step); {} before a step."""
        if not self.steps:
            return {}
        table = self.total / self.steps
        return {
            "moe_steps": self.steps,
            "tokens_per_expert_mean": float(table.mean()),
            "tokens_per_expert_min": float(table.min()),
            "tokens_per_expert_max": float(table.max()),
            "expert_imbalance": float(self.imbalance_sum.mean() / self.steps),
            "expert_imbalance_max": float(self.imbalance_max.max()),
        }


class GroupedExperts(torch.nn.Module):
    """This rank's experts: SwiGLU MLPs stored as 3-D tensors (transformers' layout),
    run as grouped matmuls over ragged groups of rows.

    Args:
        gate_up_proj: ``[E_local, 2I, H]`` fused gate and up projections.
        down_proj: ``[E_local, H, I]`` down projections.
        act: the activation's name (``"silu"``).
    """

    def __init__(self, gate_up_proj, down_proj, act):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(gate_up_proj)
        self.down_proj = torch.nn.Parameter(down_proj)
        self.act_fn = ACT2FN[act]

    def forward(self, x, counts):
        """``x``: ``[R, H]`` rows grouped by local expert, ``counts[e]`` rows for expert
        ``e`` (``[E_local]`` integers summing to ``R``) → ``[R, H]``."""
        if x.shape[0] == 0:  # no row: zero gradients all the same (FSDP reduces them)
            return x * 0 + 0 * (self.gate_up_proj.sum() + self.down_proj.sum()).to(x.dtype)
        offs = torch.cumsum(counts, 0).to(torch.int32)  # each group's end row
        w_gu = self.gate_up_proj.to(x.dtype).transpose(1, 2)  # [E_local, H, 2I]
        gate, up = torch.nn.functional.grouped_mm(x, w_gu, offs=offs).chunk(2, dim=-1)
        w_down = self.down_proj.to(x.dtype).transpose(1, 2)  # [E_local, I, H]
        return torch.nn.functional.grouped_mm(self.act_fn(gate) * up, w_down, offs=offs)


class ExpertParallelMoe(torch.nn.Module):
    """One MoE layer over an expert-parallel group: the block's router (all ``E`` experts)
    and this rank's ``E / ep`` experts, tokens dispatched and combined by all-to-all.

    Args:
        gate: the block's ``Qwen3MoeTopKRouter`` (``weight`` ``[E, H]``).
        gate_up_proj: this rank's experts' ``[E/ep, 2I, H]`` fused gate and up projections.
        down_proj: their ``[E/ep, H, I]`` down projections.
        act: the activation's name (``"silu"``).
        ep_rank, ep_size: this rank's place in the group, the group's size.
        group: the group's process group (None when ``ep_size`` is 1: no exchange).
        clock: the :class:`ExchangeClock`; meter, layer: the :class:`LoadMeter` and row.
    """

    def __init__(
        self,
        gate,
        gate_up_proj,
        down_proj,
        act,
        ep_rank=0,
        ep_size=1,
        group=None,
        clock=None,
        meter=None,
        layer=0,
    ):
        super().__init__()
        self.gate = gate
        self.experts = GroupedExperts(gate_up_proj, down_proj, act)
        self.num_experts = gate.weight.shape[0]
        self.local = gate_up_proj.shape[0]
        self.ep_rank, self.ep_size, self.group = ep_rank, ep_size, group
        self.clock = clock or ExchangeClock()
        self.meter, self.layer = meter, layer

    def forward(self, hidden):
        """``hidden``: ``[B, S, H]`` → the weighted sum of each token's ``k`` experts'
        outputs, ``[B, S, H]``."""
        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1])
        _, weights, chosen = self.gate(x)  # [T, k] each
        k = chosen.shape[1]
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)  # assignments grouped by expert
        token_of = order // k
        counts = torch.bincount(flat, minlength=self.num_experts)
        if self.meter is not None:
            self.meter.current[self.layer] += counts
        sent = x[token_of]  # [T·k, H]; experts are contiguous per rank, so by destination
        if self.ep_size == 1:
            out = self.experts(sent, counts)
        else:
            ep, local = self.ep_size, self.local
            received_counts = torch.empty_like(counts)
            with self.clock():
                dist.all_to_all_single(received_counts, counts, group=self.group)
            by_source = received_counts.view(ep, local)  # [source rank, local expert]
            in_splits = counts.view(ep, local).sum(1).tolist()
            out_splits = by_source.sum(1).tolist()
            received = _AllToAll.apply(sent, out_splits, in_splits, self.group, self.clock)
            # Received rows come by source, then by expert: regroup them by local expert.
            expert_of = torch.repeat_interleave(
                torch.arange(local, device=x.device).repeat(ep), by_source.reshape(-1)
            )
            regroup = torch.argsort(expert_of, stable=True)
            done = self.experts(received[regroup], by_source.sum(0))
            done = done[torch.argsort(regroup)]
            out = _AllToAll.apply(done, in_splits, out_splits, self.group, self.clock)
        scale = weights.reshape(-1)[order].to(out.dtype)
        combined = torch.zeros_like(x).index_add_(0, token_of, (out * scale[:, None]).to(x.dtype))
        return combined.view(shape)


def expert_params(model):
    """The expert parameters of ``model`` (those :class:`ExpertParallelMoe` holds)."""
    return [
        p
        for m in model.modules()
        if isinstance(m, ExpertParallelMoe)
        for p in (m.experts.gate_up_proj, m.experts.down_proj)
    ]


def shard_experts(model, ep_rank=0, ep_size=1, group=None, clock=None, meter=None):
    """Replace every ``Qwen3MoeSparseMoeBlock`` of ``model`` by an
    :class:`ExpertParallelMoe` holding experts ``[ep_rank·E/ep, (ep_rank+1)·E/ep)`` with
    the same weights (copies; the block is dropped). ``E`` is its router's output count; a
    block holding all ``E`` experts gives up the others, one holding ``E / ep`` (built so by
    :func:`build_moe_model`) keeps them all. Returns ``model``.

    Raises:
        ValueError: ``ep_size`` does not divide the experts, or a block holds neither
            ``E`` nor ``E / ep`` experts.
    """
    for i, layer in enumerate(model.model.layers):
        block = layer.mlp
        if not isinstance(block, Qwen3MoeSparseMoeBlock):
            continue
        experts, held = block.gate.weight.shape[0], block.experts.gate_up_proj.shape[0]
        if experts % ep_size:
            raise ValueError(f"{experts} experts do not divide across {ep_size} ranks")
        n = experts // ep_size
        if held not in (experts, n):
            raise ValueError(f"a block holds {held} experts, neither {experts} nor {n}")
        lo = ep_rank * n if held == experts else 0
        layer.mlp = ExpertParallelMoe(
            block.gate,
            block.experts.gate_up_proj.data[lo : lo + n].clone(),
            block.experts.down_proj.data[lo : lo + n].clone(),
            model.config.hidden_act,
            ep_rank,
            ep_size,
            group,
            clock,
            meter,
            i,
        )
    return model


def build_moe_model(
    config, ep_rank=0, ep_size=1, group=None, clock=None, meter=None, device=None, seed=0
):
    """A random-initialised MoE model of ``config`` whose MoE layers hold only this rank's
    ``E / ep_size`` experts (built that size: the other experts never exist here).

    The model is built with a config of ``E / ep_size`` experts, then each layer's router is
    replaced by one over all ``E`` (normal, std ``initializer_range``, as transformers
    initialises it) and its experts re-drawn from a generator seeded by ``seed`` and the
    rank, so that the ranks' experts differ. Built on ``device`` directly when it is not
    the CPU.
    """
    local = copy.deepcopy(config)
    local.num_experts = config.num_experts // ep_size
    ctx = torch.device(device) if bench_device.kind(device) not in (None, "cpu") else None
    with ctx or contextlib.nullcontext():
        model = Qwen3MoeForCausalLM(local)
        generator = torch.Generator(device=model.device).manual_seed(seed * 7919 + ep_rank)
        for layer in model.model.layers:
            block = layer.mlp
            router = Qwen3MoeTopKRouter(config)
            torch.nn.init.normal_(router.weight, std=config.initializer_range)
            block.gate = router
            for p in (block.experts.gate_up_proj, block.experts.down_proj):
                with torch.no_grad():
                    p.normal_(0.0, config.initializer_range, generator=generator)
    model.config = config
    return shard_experts(model, ep_rank, ep_size, group, clock, meter)


def count_params(config):
    """``(total, active, matmul_active)`` parameters of the full model of ``config``
    (every expert), from its shapes: ``active`` counts a token's ``k`` experts only, and
    ``matmul_active`` the linear layers among them with the output projection (``N`` of
    :func:`milarun.measure.mfu.flops_per_token`; the embedding is a lookup)."""
    h, v, layers = config.hidden_size, config.vocab_size, config.num_hidden_layers
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    attention = h * q * 2 + h * kv * 2 + 2 * config.head_dim  # q, o, k, v; q/k norms
    router = config.num_experts * h
    expert = 3 * h * config.moe_intermediate_size
    norms = 2 * h
    per_layer_matmul = attention - 2 * config.head_dim + router
    matmul_total = layers * (per_layer_matmul + config.num_experts * expert) + h * v
    total = matmul_total + layers * (norms + 2 * config.head_dim) + h + h * v
    matmul_active = active_matmul_params(
        matmul_total,
        layers * config.num_experts * expert,
        config.num_experts,
        config.num_experts_per_tok,
    )
    active = total - (matmul_total - matmul_active)
    return total, active, matmul_active


def shard_model(model, world, precision, dp_mesh):
    """FSDP2 over ``world``: each layer's experts (:class:`GroupedExperts`) over
    ``dp_mesh`` (the ranks holding the same experts, one per expert-parallel group: their
    copies sharded, not replicated), then each block's other parameters and the root's over
    every rank; bf16 parameters and fp32 reduction with ``precision`` bf16.

    FSDP averages the expert gradients over ``dp_mesh``; each rank's expert gradient sums
    the losses of its whole group, so :func:`scale_expert_grads` divides them by the group's
    size after the backward pass.

    Raises:
        ValueError: fp16 (FSDP needs a sharded gradient scaler).
    """
    if precision == "fp16":
        raise ValueError(FSDP_FP16_REFUSED)
    mesh = init_device_mesh(bench_device.kind(world.device), (world.size,))
    policy = MixedPrecisionPolicy()
    if precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        if isinstance(layer.mlp, ExpertParallelMoe):
            fully_shard(layer.mlp.experts, mesh=dp_mesh, mp_policy=policy)
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def scale_expert_grads(experts, ep):
    """Divide the expert gradients by the expert-parallel group's size ``ep``: after
    FSDP's mean over the groups they are then the global batch's mean gradient (the sum
    over every rank's loss ÷ the world size), as the other parameters' are."""
    if ep > 1:
        for p in experts:
            if p.grad is not None:
                p.grad.div_(ep)


def clip_gradients(dense, experts, max_norm, group=None):
    """Clip every gradient by the global 2-norm of them all to ``max_norm``; returns the
    norm before clipping (a 0-d tensor).

    ``dense``: FSDP-sharded (DTensor) or plain parameters, whose norms are taken whole;
    ``experts``: this rank's experts (or its FSDP shards of them), whose local squared norms
    are summed over ``group`` (every rank: each holds a part of the experts no other
    holds). The same clip on every rank.
    """
    grads = [p.grad for p in dense if p.grad is not None]
    device = experts[0].device if experts else grads[0].device
    sq = torch.zeros((), dtype=torch.float32, device=device)
    for g in grads:
        n = torch.linalg.vector_norm(g, dtype=torch.float32)
        sq = sq + (n.full_tensor() if hasattr(n, "full_tensor") else n) ** 2
    local = torch.zeros((), dtype=torch.float32, device=device)
    for p in experts:
        if p.grad is not None:
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            local = local + torch.linalg.vector_norm(g, dtype=torch.float32) ** 2
    if group is not None:
        dist.all_reduce(local, group=group)
    norm = torch.sqrt(sq + local)
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in [*grads, *(p.grad for p in experts if p.grad is not None)]:
        g.mul_(coef.to(g.dtype))
    return norm


#: The largest error :func:`check_exchange_step` accepts (fp32: relative loss, gradients
#: relative to the largest reference gradient).
CHECK_TOLERANCE = 1e-4


def check_exchange_step(config, world, ep_rank, ep, ep_group, dp_mesh, x, y, seed):
    """Check one training step's forward and backward against one process's: ``(loss
    error, gradient error)``, both relative, in fp32.

    Every rank builds the whole model (every expert, seeded by ``seed``: the same weights
    everywhere) on its device. The reference is transformers' own MoE blocks on the global
    batch (every rank's ``x`` and ``y``, ``[B, S]`` token ids, all-gathered); the checked
    step is the training's: this rank's experts (:func:`shard_experts`), FSDP2 as
    :func:`shard_model` applies it (over ``dp_mesh``; None on one rank), the exchanges, on
    this rank's batch, then :func:`scale_expert_grads`. Compared: the mean of the ranks'
    losses with the reference loss, and every gradient (gathered whole; an expert's with
    its slice of the reference's) with the reference's, relative to its largest value.
    Memory: two whole models per rank, so for small shapes.

    Raises:
        ValueError: an error above :data:`CHECK_TOLERANCE` (one line).
    """
    device = world.device
    with torch.random.fork_rng(devices=[device] if bench_device.is_cuda(device) else []):
        torch.manual_seed(seed)
        with torch.device(device):
            model = Qwen3MoeForCausalLM(config)
    ref = copy.deepcopy(model)
    x_all, y_all = x, y
    if world.size > 1:
        xs = [torch.empty_like(x) for _ in range(world.size)]
        ys = [torch.empty_like(y) for _ in range(world.size)]
        dist.all_gather(xs, x)
        dist.all_gather(ys, y)
        x_all, y_all = torch.cat(xs), torch.cat(ys)
    ref_loss = causal_lm_loss(ref, x_all, y_all)
    ref_loss.backward()
    shard_experts(model, ep_rank, ep, ep_group, ExchangeClock(device))
    if dp_mesh is not None:
        shard_model(model, world, "fp32", dp_mesh)
    loss = causal_lm_loss(model, x, y)
    loss.backward()
    experts = expert_params(model)
    scale_expert_grads(experts, ep)
    mean = loss.detach().clone()
    if world.size > 1:
        dist.all_reduce(mean)
        mean /= world.size
    loss_error = float(abs(mean - ref_loss.detach()) / abs(ref_loss.detach()))
    wanted = dict(ref.named_parameters())
    n = config.num_experts // ep
    grad_error = 0.0
    for name, p in model.named_parameters():
        got = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        want = wanted[name].grad
        if any(p is e for e in experts):
            want = want[ep_rank * n : (ep_rank + 1) * n]
        scale = float(wanted[name].grad.abs().max()) or 1.0
        grad_error = max(grad_error, float((got - want).abs().max()) / scale)
    if max(loss_error, grad_error) > CHECK_TOLERANCE:
        raise ValueError(
            f"the expert-parallel step differs from one process's: loss {loss_error:.2e}, "
            f"gradients {grad_error:.2e} (relative; tolerance {CHECK_TOLERANCE})"
        )
    return loss_error, grad_error


def memory_per_gpu_gb(config, world):
    """Training memory per GPU (GB, 1e9 bytes) before activations: AdamW with fp32 master
    weights and two moments, 16 bytes a parameter, every parameter split over the
    ``world`` (the experts by expert parallelism and FSDP, the rest by FSDP)."""
    return 16 * count_params(config)[0] / world / 1e9


@tooled
def train(exp):
    # Model shape: tiny, gpt-oss-20b, qwen3-30b-a3b or deepseek-v3 (SHAPES)
    shape: Option = default("qwen3-30b-a3b")
    # Tokens per sequence
    seq_len: Option & int = default(2048)
    batch_size = batch_size_option(default=2)  # sequences per step, per rank
    precision = precision_option(default="bf16")  # bf16, fp32 or tf32
    lr = lr_option(default=3e-4)  # peak of the warm-up + cosine schedule; AdamW
    # Ranks of an expert-parallel group, each holding experts/ep experts (0: one node's)
    ep_size: Option & int = default(0)
    # First check one step against one process's (every rank builds the whole model)
    check_exchange: Option & bool = default(False)
    workers = workers_option(default=1)
    backend = backend_option()

    env = World.from_environment()
    # Checked before anything runs: one error line.
    ep = check_options(shape, seq_len, env.size, ep_size, env.local_size)
    if batch_size < 1:
        raise ValueError("--batch-size must be at least 1")
    if precision == "fp16":
        raise ValueError(FP16_REFUSED)
    device = init_torch(exp)
    shards = TokenShards(require(exp.dataroot, "llm_corpus"))
    with process_group(exp, device, backend) as world:
        device = world.device
        config = moe_config(shape, shards.vocab_size, seq_len)
        ep_group = dp_mesh = None
        ep_rank = world.rank % ep  # expert-parallel groups are runs of ep consecutive ranks
        if world.size > 1:
            mesh = init_device_mesh(
                bench_device.kind(device), (world.size // ep, ep), mesh_dim_names=("dp", "ep")
            )
            ep_group = mesh.get_group("ep") if ep > 1 else None
            dp_mesh = mesh["dp"]
        clock = ExchangeClock(device)
        # Tokens per expert over the global batch: the step's counts summed over every rank.
        meter = LoadMeter(config.num_hidden_layers, config.num_experts, device)
        meter.group = dist.group.WORLD if world.size > 1 else None
        model = build_moe_model(
            config, ep_rank, ep, ep_group, clock, meter, device, exp.options["seed"] or 0
        )
        total, active, matmul_active = count_params(config)
        tokens_per_step = batch_size * seq_len * world.size
        exp.metrics.update(
            {
                "shape": shape,
                "params": total,
                "active_params": active,
                "experts": config.num_experts,
                "experts_per_token": config.num_experts_per_tok,
                "ep_size": ep,
                "seq_len": seq_len,
                "world_size": world.size,
                "global_batch_tokens": tokens_per_step,
                "memory_per_gpu_gb": memory_per_gpu_gb(config, world.size),
            }
        )
        if world.size > 1:
            shard_model(model, world, precision, dp_mesh)
            exp.metrics["parallelism"] = "ep+fsdp" if ep > 1 else "fsdp"
        else:
            exp.metrics["parallelism"] = "none"
        # After sharding: FSDP2 replaces the parameters with its sharded ones.
        experts = expert_params(model)
        dense = [p for p in model.parameters() if all(p is not e for e in experts)]
        exp.metrics["params_local"] = sum(
            (p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters()
        )
        mp = MixedPrecisionStep(device, precision)
        autocast = contextlib.nullcontext() if world.size > 1 else mp.autocast
        model.train()
        optimizer = make_optimizer(
            "AdamW", model.parameters(), device, lr=lr, betas=(0.9, 0.95), weight_decay=0.1
        )
        schedule = warmup_cosine(
            optimizer, optimizer_steps(exp.options["max_count"], tokens_per_step)
        )
        loader = token_loader(exp, shards, seq_len, batch_size, workers, world)
        flops_tok = flops_per_token(
            matmul_active,
            config.num_hidden_layers,
            config.num_attention_heads * config.head_dim,
            seq_len,
            "train",
        )
        if check_exchange:
            x, y = next(iter(loader))
            errors = check_exchange_step(
                config,
                world,
                ep_rank,
                ep,
                ep_group,
                dp_mesh,
                x.to(device),
                y.to(device),
                exp.options["seed"] or 0,
            )
            exp.metrics["exchange_check_loss_error"] = errors[0]
            exp.metrics["exchange_check_grad_error"] = errors[1]
        steps = dataloop(exp, Epochs(loader))
        agree_on_counts(exp, world)
        t0 = time.perf_counter()
        try:
            for step, (x, y) in steps:
                x = x.to(device, non_blocking=True)
                y = y.to(device, non_blocking=True)
                with autocast:
                    loss = causal_lm_loss(model, x, y)
                mp.backward(loss)
                scale_expert_grads(experts, ep)
                clip_gradients(dense, experts, 1.0, meter.group)
                mp.step(optimizer)
                mp.update()
                optimizer.zero_grad(set_to_none=True)
                schedule.step()
                meter.step()
                step.set_count(x.numel() * world.size)
                step.log(loss=loss.detach())
        finally:
            wall = time.perf_counter() - t0
            clock.resolve()
            exp.metrics.update(meter.metrics())
            exp.metrics["all_to_all_s"] = clock.seconds
            exp.metrics["all_to_all_calls"] = clock.calls
            exp.metrics["all_to_all_share"] = clock.seconds / wall if wall > 0 else None
            record_flops(exp, flops_tok, bench_device.name(device), precision, world.size)
