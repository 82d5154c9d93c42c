"""Model FLOPs of a transformer language model and the device's datasheet peak: TFLOP/s and MFU.

Pure functions, no I/O: the LLM workloads call them in the child, and the
report may call them again on a record's metrics.

Model FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B "Model FLOPs
utilization"; the same estimate as torchtitan's and Megatron-LM's)::

    training:  6·N + 12·L·d·T        (forward 2N + 4LdT, backward twice that)
    LoRA:      4·N + 6·N_a + 12·L·d·T (frozen base: no weight gradients, 2N fewer)
    inference: 2·N + 4·L·d·T

``N`` counts the parameters of the matrix multiplications (every linear layer
with the output projection; the input embedding is a lookup and does not
count), ``N_a`` the trainable adapter parameters, ``L`` the layers, ``d`` the
model width (heads × head size) and ``T`` the context length (the sequence
length in training, the tokens attended to in decoding); in a mixture-of-experts
model, ``N`` counts the parameters a token goes through: its ``k`` routed experts, not
all ``E`` (:func:`active_matmul_params`). As in PaLM, the
attention term counts the whole ``T × T`` score matrix, not the causal half:
MFU figures then compare with the field's.

MFU = achieved model FLOP/s ÷ the device's dense peak for the precision;
activation recomputation does not count as model FLOPs, so checkpointing lowers
MFU as it should.

Which peak: a datasheet table goes wrong on new parts (torchtitan's MFU once used a
wrong B200 peak; a "563 % MFU" was published elsewhere) and the datasheet's peak is
a burst no GPU sustains at its power limit. So the report divides by the measured
peak where it has one (:func:`choose_peak`): the sustained matmul TFLOP/s of the
same node and precision (``milarun.models.matmul --soak``: the node's slowest GPU;
Stas Bekman's "maximum achievable matmul FLOPS", ml-engineering), else the datasheet
(:data:`PEAK_TFLOPS`), and says which. An MFU above :data:`MFU_LIMIT` of the chosen
peak cannot be: it is a measurement error (wrong FLOP count, wrong peak, a timer),
reported as such and never as a figure (:func:`checked_mfu`).
"""

from __future__ import annotations

#: Dense (no structured sparsity) peak TFLOP/s per device, by precision, from the vendors'
#: datasheets: NVIDIA H100 and H200 Tensor Core GPU datasheets (SXM; PCIe and NVL
#: columns), NVIDIA A100 datasheet, NVIDIA L40S datasheet, NVIDIA HGX B200 figures (per
#: GPU, half the sparse figure), AMD Instinct MI300X and MI250X data sheets (matrix
#: cores). The first pattern found in the device's name (case-insensitive) wins, so the
#: more specific names come first. "fp32" is the non-tensor-core figure; "fp64" is the
#: FP64 Tensor Core (NVIDIA) or FP64 matrix (AMD) figure, which a float64 GEMM runs at
#: (the acceptance matmul's; the B200 and L40S have none here: the HGX B200 page gives FP64 for
#: the 8-GPU board only, the L40S datasheet none). "fp8" is E4M3/E5M2 dense.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (
        "H100 PCIe",
        {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0, "fp8": 1513.0, "fp64": 51.0},
    ),
    (
        "H100 NVL",
        {"bf16": 835.0, "fp16": 835.0, "tf32": 417.5, "fp32": 60.0, "fp8": 1670.0, "fp64": 60.0},
    ),
    (
        "H100",
        {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9, "fp8": 1978.9, "fp64": 66.9},
    ),
    (
        "H200",
        {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9, "fp8": 1978.9, "fp64": 66.9},
    ),
    ("B200", {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1125.0, "fp32": 75.0, "fp8": 4500.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5, "fp64": 19.5}),
    ("L40S", {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6, "fp8": 733.0}),
    (
        "MI300X",
        {
            "bf16": 1307.4,
            "fp16": 1307.4,
            "tf32": 653.7,
            "fp32": 163.4,
            "fp8": 2614.9,
            "fp64": 163.4,
        },
    ),
    ("MI250X", {"bf16": 383.0, "fp16": 383.0, "fp32": 95.7, "fp64": 95.7}),
)


def peak_tflops(device_name: object, precision: str) -> float | None:
    """Datasheet dense peak (TFLOP/s) of ``device_name`` at ``precision``, or None.

    ``precision`` is a milarun ``--precision`` name; ``fp16``/``bf16`` mean
    autocast, whose matrix multiplications run at that type's rate. None when
    the device is not in :data:`PEAK_TFLOPS` (CPUs among them) or has no
    figure for the precision: the record then says MFU is unknown.
    """
    if not isinstance(device_name, str):
        return None
    name = device_name.lower()
    for pattern, peaks in PEAK_TFLOPS:
        if pattern.lower() in name:
            return peaks.get(precision)
    return None


def flops_per_token(
    matmul_params: int,
    layers: int,
    width: int,
    context: int,
    mode: str = "train",
    adapter_params: int = 0,
) -> int:
    """Model FLOPs per token (see the module's docstring for the formula and its source).

    Args:
        matmul_params: parameters of the linear layers, output projection included (N).
        layers: transformer blocks (L).
        width: model width, heads × head size (d).
        context: tokens attended to (T): the sequence length in training.
        mode: ``"train"``, ``"lora"`` or ``"inference"``.
        adapter_params: trainable adapter parameters (``"lora"`` only).

    Raises:
        ValueError: an unknown mode.
    """
    attention = 4 * layers * width * context
    if mode == "train":
        return 6 * matmul_params + 3 * attention
    if mode == "lora":
        return 4 * matmul_params + 6 * adapter_params + 3 * attention
    if mode == "inference":
        return 2 * matmul_params + attention
    raise ValueError(f"mode must be train, lora or inference, not {mode!r}")


def active_matmul_params(matmul_params: int, expert_params: int, experts: int, top_k: int) -> int:
    """Matmul parameters a token goes through in a mixture-of-experts model (its ``N``
    in :func:`flops_per_token`): all of them less the experts it is not routed to,
    ``N − N_e·(1 − k/E)``. The active-parameter convention of DeepSeek-V3's report
    ("37B activated for each token") and of torchtitan's MoE FLOPs count.

    Args:
        matmul_params: every linear layer's parameters, all experts included (N).
        expert_params: the routed experts' parameters over all layers (N_e).
        experts: routed experts per layer (E); top_k: experts a token is routed to (k).

    Raises:
        ValueError: ``top_k`` not in 1..``experts``.
    """
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k must be from 1 to {experts}, not {top_k}")
    return matmul_params - expert_params + expert_params * top_k // experts


def mfu(
    tokens_per_s: float, flops_per_tok: float, peak: float | None
) -> tuple[float, float | None]:
    """``(achieved TFLOP/s, MFU)``: model FLOP/s in TFLOP/s and its fraction of ``peak``
    (TFLOP/s, per device: pass the per-device throughput). MFU is None without a peak."""
    achieved = tokens_per_s * flops_per_tok / 1e12
    return achieved, (achieved / peak if peak else None)


#: The largest MFU (fraction of the chosen peak) shown as a figure; above it, an error.
MFU_LIMIT = 1.0


def choose_peak(measured: float | None, datasheet: float | None) -> tuple[float | None, str]:
    """``(peak TFLOP/s, source)``: the measured peak (``"measured"``) where there is a
    positive one, else the datasheet's (``"datasheet"``; None without one)."""
    if measured is not None and measured > 0:
        return measured, "measured"
    return (datasheet if datasheet is not None and datasheet > 0 else None), "datasheet"


def checked_mfu(
    achieved: float | None, peak: float | None, source: str
) -> tuple[float | None, str | None]:
    """``(MFU, error)`` of ``achieved`` model TFLOP/s against ``peak`` (TFLOP/s).

    MFU is a fraction, None without both figures or when it exceeds :data:`MFU_LIMIT`:
    then ``error`` says so in one line, e.g. ``"MFU error: 130% of the measured peak"``
    (``source``: ``"measured"`` or ``"datasheet"``); else ``error`` is None.
    """
    if achieved is None or not peak:
        return None, None
    return limit_mfu(achieved / peak, source)


def limit_mfu(fraction: float | None, source: str) -> tuple[float | None, str | None]:
    """``(MFU, error)`` of an MFU ``fraction`` of the ``source`` peak: as
    :func:`checked_mfu`, for an MFU already divided (None stays None)."""
    if fraction is not None and fraction > MFU_LIMIT:
        return None, f"MFU error: {100 * fraction:.0f}% of the {source} peak"
    return fraction, None


__all__ = [
    "MFU_LIMIT",
    "active_matmul_params",
    "PEAK_TFLOPS",
    "checked_mfu",
    "choose_peak",
    "limit_mfu",
    "peak_tflops",
    "flops_per_token",
    "mfu",
]
