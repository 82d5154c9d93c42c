"""GPU check: the first thing to run on a GPU machine. Prints a verdict per check.

**Status:** run on one H100 80GB HBM3 and one H200 with torch 2.11 (``baselines/gpu/``),
every check but ``ddp`` (2 GPUs; run over gloo on the CPU only); its CPU mode
(``--device cpu``) runs in ``tests/test_gpu_check.py``, its CUDA branches also against
fakes (fake CUDA events, a fake NVML, fake torch device properties and device names).

**Five minutes on one GPU.** The run is planned against ``--budget`` seconds
(default 300, dataset preparation included): each check has an estimate (s, from
its options: see :func:`estimate` and the constants beside :data:`START_S`, each
with its basis), the plan is printed first (check, estimate, cumulative, basis),
the ``lite`` pass shrinks to fit (its last tests left out) and a check that still
does not fit is left out, the plan says which. While it runs, a check that would
end past the budget (time spent + its estimate) says SKIP "budget". Each check's
wall time is printed as it ends, beside its estimate, and both are in ``--out``.
``--dry-run`` prints the plan and exits 0, running nothing on the device
(``--device cuda --dry-run`` plans for one GPU on a machine without one).

Each check ends in PASS, WARN, FAIL or SKIP, with its figure, its target and, for
anything but a PASS, the reason. WARN: a figure far from the reference a buyer
compares it with (:data:`REFERENCES`, by GPU name: the published maximum achievable
bf16 matmul, the datasheet's memory bandwidth, PCIe Gen5 x16 practice), with the
ratio; it does not fail the run, and the last lines list every WARN. A GPU without
a known reference shows its figure and "none known" (SKIP), never a WARN.
``--out FILE`` writes every figure as one JSON file, the format of a GPU baseline
(``baselines/gpu/README.md``); the exit status is 1 when any check FAILs, 2 on
bad arguments, else 0.

Checks (``--only`` / ``--skip`` take their names, comma-separated):

``prescreen``
    The host prescreen of ``milarun jobs`` (:mod:`milarun.host.prescreen`; docs/acceptance.md,
    "Host prescreen"), one part per finding: C-states, governor, NUMA balancing, huge pages,
    persistence mode, ECC, power limit, application clocks, processes already on the GPUs,
    IOMMU, PCI ACS, InfiniBand ports. PASS when as expected, WARN when not (a setting of
    the node that moves every figure after it), SKIP when unknown; on the CPU a finding not
    as expected is a SKIP (the expectations are a GPU node's).
``rate``
    The rate milarun reports for a fixed training loop (a 4-layer MLP,
    forward + backward + SGD, no host sync in the loop) against the same loop
    timed bare: ``torch.cuda.synchronize()`` and ``time.perf_counter()`` around
    N steps, rate = N × batch ÷ seconds (items/s). The instrumented run uses
    milarun's ``RateLogger`` with the ``CudaEventTimer`` (``milarun.bench``),
    and its rate is Σ count ÷ Σ (end − start) over all its windows (items/s;
    the windows are contiguous, so this is the items over the event timer's
    span of the whole loop, the bare loop's quantity; the loop is warmed up
    before either runs, and the non-warm-up rate is kept as a figure,
    ``instrumented_steady_items_s``). ``--rate-pairs`` pairs, the
    order flipping each pair; figure = median over pairs of instrumented ÷ bare.
    Target: within 1 % (0.99 ≤ ratio ≤ 1.01), the issue-22 target. Both time
    the same GPU work: a ratio outside it means the event timer measures
    something else than the work (a missed window, a sync in the loop, an
    event on the wrong stream).
``matmul``
    ``milarun run milarun.models.matmul:main`` (its ``metrics.tflops_<p>``:
    2·n³ × matmuls ÷ their CUDA-event time, 1e12 FLOP/s) against a bare
    ``torch.matmul(a, b, out=c)`` loop per precision (fp32, tf32, fp16, bf16)
    timed with synchronize + perf_counter: TFLOP/s = 2·n³ × N ÷ seconds ÷ 1e12
    (2·n³: n³ multiply-adds of an n × n × n GEMM). The bare loop runs before and
    after milarun's run and the reference is the mean of the two (a GPU that
    heats or clocks down between them moves both halves alike). Target:
    milarun ÷ bare ≥ 0.97 per precision (the issue-22 target). And the bare bf16
    figure against the GPU's published maximum achievable bf16 matmul (TFLOP/s,
    random inputs: H100 SXM 795, A100 SXM 271, B200 1745, MI300X 668): WARN below
    0.8 × (:data:`MATMUL_REF_MIN`).
``bandwidth``
    On ``cuda:0``, in GB/s (1e9 bytes/s), each timed with synchronize + perf_counter over
    ``--bandwidth-seconds`` (1 s) of back-to-back ``copy_`` of
    ``--bandwidth-mib`` (1024 MiB): a device-to-device copy, counted 2 × its size
    (read and write, as STREAM's copy), against the datasheet's memory bandwidth
    (H100 SXM 3.35 TB/s, H100 PCIe 2.0, H200 4.8, A100 80GB SXM 2.039, B200 8,
    MI300X 5.3), WARN below 0.7 × (:data:`MEMORY_REF_MIN`); host-to-device and
    device-to-host copies from and to pinned memory against PCIe Gen5 x16 practice
    (55 GB/s), WARN below 0.7 × (:data:`PCIE_REF_MIN`: a Gen4 or x8 link WARNs).
``nvml``
    Through nvidia-ml-py, directly, while a fp16 matmul load runs on every
    visible GPU: power (``nvmlDeviceGetPowerUsage``, mW → W) within
    [0, 1.05 × enforced limit] (``nvmlDeviceGetEnforcedPowerLimit``; the 5 %
    allows the power-capping controller's short excursions, NVML's power
    being an average over about 1 s on Ampere and later); the energy counter
    (``nvmlDeviceGetTotalEnergyConsumption``, mJ → J) never decreasing; its
    increase ΔE (J) over the sampled span against ∫P dt (J, trapezoids over
    the power samples, every ``--nvml-interval`` s) within 10 %
    (``ENERGY_TOLERANCE``: the power reading is a ~1 s average that lags the
    counter by up to about 1 s at each end of the span, the span is at least
    ``--nvml-seconds`` = 8 s under a steady load, so the two ends bound the
    error to roughly 2 × 0.5 s × (power swing) ÷ span, a few %; NVIDIA does
    not document either quantity's accuracy, so 10 % is a bound that a working
    counter meets, not a calibration); SM and memory clocks
    (``nvmlDeviceGetClockInfo``, MHz) read and in (0, max]; and for every
    device of ``milarun devices --json`` the torch device of the same index
    (with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, as milarun's children run) has the
    same UUID and PCI domain:bus:device as NVML. The record of the ``matmul``
    check's run is checked too: its ``gpu_monitor`` power within the same
    bounds and its energy never decreasing.
``lite``
    One test per workload family (the report's families,
    ``milarun.report.family``: the first test of each family in profile order that
    runs on one GPU) of ``profiles/lite.json`` on a GPU (``--lite-profile``;
    ``--lite-name`` names the tests instead; on the CPU: ``toy_reg`` of
    ``profiles/cpu.json``), their datasets prepared in tiny presets (the tests'
    own prepare commands with ``--size tiny``: a functional check needs no more) in
    the work folder, or kept in ``-d DATAROOT``'s ``gpu_check-tiny/`` folder,
    briefly: ``milarun jobs PROFILE --no-cgexec --timeout T --name … -- --max-count 1
    --min-steady 1 --warmup 1 --sample-duration 0.25`` (the last value of a
    repeated option wins, so this overrides the profile's counts: each test trains
    for one warm-up window and 1 s of steady state). PASS per test when every
    record it wrote says ``success``; FAIL with the record's error reason, or when
    it wrote none.
``ddp``
    A DDP step and an FSDP (``fully_shard``) step over NCCL on 2 GPUs
    (``torchrun --standalone --nproc-per-node 2`` running this script as a
    worker): after one SGD step on per-rank halves of a batch, every rank's
    parameters must equal those of one model stepped on the whole batch,
    max |difference| ≤ 1e-4 (fp32, TF32 off; an error in the averaging moves
    them by ~lr × gradient, orders of magnitude more). Figures: the step
    times (s) of a few more steps. SKIP with the reason on fewer than 2
    GPUs; on the CPU it runs the same steps over gloo (figures only) and
    says SKIP.
``cgroups``
    One per-GPU wave of a short toy_reg in the student cgroups
    (``cpuset,memory:student{device}``, as the shipped profiles):
    ``milarun jobs --dry-run`` first; when it refuses (no student cgroups, no
    cgexec) the check is SKIP with its line. Else PASS when every device's
    record is a success and names its own ``student<device>`` cgroup
    (``--cgroup-experiment`` swaps the workload; the tests use a torch-free one).

Usage::

    python benchmarks/gpu_check.py [--budget 300] [--dry-run] [--out gpu_check.json]
        [-d DATAROOT] [--only rate,matmul] [--skip lite] [--device cuda|cpu]

On the CPU (``--device cpu``, the default when torch sees no CUDA device) the
timing checks run with tiny sizes and say SKIP (their targets are about the GPU
timers) with their figures; ``bandwidth`` shows its figures (no reference for a
CPU); ``nvml`` and ``ddp`` say SKIP; ``lite`` runs one test and ``cgroups`` runs
as on a GPU. It takes under a minute on a 2-core host.
"""

import argparse
import datetime
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The only milarun imports: the bench layer's public API (the rate logger and its timers),
# the report's workload families (the lite pass's one test per family) and the host
# prescreen (the node's settings).
from milarun.bench.rate import CudaEventTimer, PerfCounterTimer, RateLogger  # noqa: E402
from milarun.host.prescreen import prescreen  # noqa: E402
from milarun.report.family import FAMILIES, OTHER, family_of  # noqa: E402

CHECKS = ("prescreen", "rate", "matmul", "bandwidth", "nvml", "lite", "ddp", "cgroups")
PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
#: Format version of the --out file (2: WARN, the plan, the references, bandwidth).
VERSION = 2

#: rate: instrumented ÷ bare within this relative distance of 1 (1 %: milarun's timing
#: must not move the rate it reports).
RATE_TOLERANCE = 0.01
#: matmul: milarun ÷ bare TFLOP/s at least this (its instrumentation costs at most 3 %).
MATMUL_MIN_RATIO = 0.97
#: nvml: ΔE from the counter against ∫P dt, relative (see the module docstring).
ENERGY_TOLERANCE = 0.10
#: nvml: power up to this multiple of the enforced limit (capping excursions).
POWER_LIMIT_MARGIN = 1.05
#: ddp: max |parameter difference| against the single-model step (fp32, TF32 off).
DIST_TOLERANCE = 1e-4
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")

#: The figures a buyer compares with, per GPU: ``(pattern, label, references)``; the
#: first pattern found in the device's name (case-insensitive) wins, so the more
#: specific names come first ("GH200" before "H200", "H100 PCIe" before "H100"). A
#: reference not given is "none known" for that GPU: its figure is shown, never a WARN.
#:
#: ``matmul_bf16_tflops`` (1e12 FLOP/s): the published maximum achievable bf16 dense
#: matmul throughput, measured with random inputs, as published (H100 SXM 795,
#: A100 SXM 271, B200 1745, MI300X 668); none for the other parts.
#: ``memory_tb_s`` (1e12 bytes/s): the vendors' datasheets: NVIDIA H100 Tensor Core GPU
#: (SXM 3.35, PCIe 2.0), NVIDIA H200 (4.8, SXM and NVL), NVIDIA A100 (80GB SXM 2.039,
#: 80GB PCIe 1.935, 40GB 1.555), NVIDIA HGX/DGX B200 (8 per GPU), AMD Instinct MI300X
#: (5.3).
#: ``pcie_gb_s`` (1e9 bytes/s, each direction): pinned host-device copies over PCIe
#: Gen5 x16 in practice, about 55 (the link carries 32 GT/s x 16 lanes x
#: 128/130 = 63 GB/s before packet overheads), for the GPUs whose host link is Gen5 x16
#: (H100, H200, B200, MI300X); none for the A100 (Gen4) and the GH200 (NVLink-C2C).
REFERENCES = (
    ("GH200", "GH200", {}),
    ("H100 PCIe", "H100 PCIe", {"memory_tb_s": 2.0, "pcie_gb_s": 55.0}),
    ("H100 NVL", "H100 NVL", {"pcie_gb_s": 55.0}),
    ("H100", "H100 SXM", {"matmul_bf16_tflops": 795.0, "memory_tb_s": 3.35, "pcie_gb_s": 55.0}),
    ("H200", "H200", {"memory_tb_s": 4.8, "pcie_gb_s": 55.0}),
    ("A100-SXM4-80GB", "A100 80GB SXM", {"matmul_bf16_tflops": 271.0, "memory_tb_s": 2.039}),
    ("A100-SXM4-40GB", "A100 40GB SXM", {"matmul_bf16_tflops": 271.0, "memory_tb_s": 1.555}),
    ("A100 80GB PCIe", "A100 80GB PCIe", {"memory_tb_s": 1.935}),
    ("A100-PCIE-40GB", "A100 40GB PCIe", {"memory_tb_s": 1.555}),
    ("B200", "B200", {"matmul_bf16_tflops": 1745.0, "memory_tb_s": 8.0, "pcie_gb_s": 55.0}),
    ("MI300X", "MI300X", {"matmul_bf16_tflops": 668.0, "memory_tb_s": 5.3, "pcie_gb_s": 55.0}),
)
#: WARN below these fractions of the reference (figure / reference):
#: matmul: the reference is itself an achievable figure (the best shape of a sweep), so a
#: healthy GPU is within about 10 % of it at the check's one shape (8192³); 0.8 leaves
#: room for that shape and for clocks, and catches a GPU a fifth slower than its peers.
MATMUL_REF_MIN = 0.8
#: memory: the reference is the datasheet's interface peak, which a copy kernel does not
#: reach (refresh, page and read/write turn-around overheads: copies typically reach
#: 80-90 % of it on HBM); 0.7 marks a GPU well below that, not one at the usual efficiency.
MEMORY_REF_MIN = 0.7
#: PCIe: 0.7 x 55 = 38.5 GB/s is above what a Gen4 x16 link carries (about 25 GB/s in
#: practice, half of Gen5), so a link trained at Gen4 or at x8 WARNs, as it should.
PCIE_REF_MIN = 0.7

# --------------------------------------------------------------------------- the plan
#
# Estimated seconds of each part of a run on one GPU, written before the check ever ran
# on one: guesses from the work each does, to be corrected from the "seconds" the --out
# file records (each check's estimate sits beside its actual time there).
#: Interpreter start, import torch and the CUDA context (s), by "is it cuda" (the CPU
#: figure: 6.7 s measured on a loaded 2-core host, 3 s on a quiet one).
START_S = {True: 10.0, False: 5.0}
#: A ``python -m milarun`` child that runs a workload (s): interpreter, torch import, CUDA
#: context, model build and first steps, record written. A guess for a GPU node's CPUs;
#: the CPU figure is what a lite test took on a loaded 2-core host (9 to 24 s).
CHILD_S = {True: 12.0, False: 15.0}
#: The lite pass's tests on the CPU without ``--lite-name`` or ``--lite-profile``: one,
#: the launcher's path; a test per family there is ``milarun jobs profiles/cpu.json``'s
#: run, and takes minutes on a small host.
CPU_LITE = ("toy_reg",)
#: The lite pass's dataroot inside ``-d``: its tiny datasets beside the full runs'
#: datasets, never over them (a build of another size replaces one of the same name).
TINY_FOLDER = "gpu_check-tiny"
#: A tiny dataset build (s): each takes about 1 s on a 2-core host (measured).
TINY_DATASET_S = 2.0
#: ``milarun jobs`` itself (s): its start, the session, the nodes' identities, the summary.
JOBS_S = 5.0
#: torchrun with 2 ranks: start, NCCL initialisation, a few steps (s).
TORCHRUN_S = 20.0

# Arguments every lite / cgroups test gets after the profile's own (the last value wins).
SHORT_ARGS = ["--max-count", "1", "--min-steady", "1", "--warmup", "1", "--sample-duration", "0.25"]


# --------------------------------------------------------------------------- verdicts


def verdict_within(measured, reference, tolerance, what="ratio"):
    """PASS when ``measured / reference`` is within ``tolerance`` of 1 (both in the same
    unit, e.g. items/s); FAIL otherwise, or when either is missing or not > 0."""
    target = f"{what} within {100 * tolerance:g}% of 1 ({1 - tolerance:g}..{1 + tolerance:g})"
    if not _positive(measured) or not _positive(reference):
        return {
            "verdict": FAIL,
            "figure": None,
            "target": target,
            "reason": f"no figure (measured {measured}, reference {reference})",
        }
    ratio = measured / reference
    ok = abs(ratio - 1) <= tolerance
    return {
        "verdict": PASS if ok else FAIL,
        "figure": ratio,
        "target": target,
        "reason": None if ok else f"{what} {ratio:.4f} is outside the target",
    }


def verdict_at_least(measured, reference, minimum, what="ratio"):
    """PASS when ``measured / reference >= minimum``; FAIL otherwise or without figures."""
    target = f"{what} >= {minimum:g}"
    if not _positive(measured) or not _positive(reference):
        return {
            "verdict": FAIL,
            "figure": None,
            "target": target,
            "reason": f"no figure (measured {measured}, reference {reference})",
        }
    ratio = measured / reference
    ok = ratio >= minimum
    return {
        "verdict": PASS if ok else FAIL,
        "figure": ratio,
        "target": target,
        "reason": None if ok else f"{what} {ratio:.4f} is below {minimum:g}",
    }


def first_error(text):
    """The first ``milarun: error:`` line of ``text``, else its last line."""
    errors = [ln.strip() for ln in text.splitlines() if ln.startswith("milarun: error:")]
    return errors[0] if errors else last_line(text)


def verdict_bool(ok, figure, target, reason):
    """PASS when ``ok``; else FAIL with ``reason``."""
    return {
        "verdict": PASS if ok else FAIL,
        "figure": figure,
        "target": target,
        "reason": None if ok else reason,
    }


def skip(reason, target=None, figure=None):
    """A SKIP verdict; ``reason`` says why (required)."""
    assert reason
    return {"verdict": SKIP, "figure": figure, "target": target, "reason": reason}


def references_for(gpu_name):
    """``(label, references)`` of :data:`REFERENCES` for a device name (e.g. "NVIDIA H100
    80GB HBM3" is ``("H100 SXM", {...})``); ``(None, {})`` for a device without one."""
    name = str(gpu_name or "").lower()
    for pattern, label, refs in REFERENCES:
        if pattern.lower() in name:
            return label, refs
    return None, {}


def verdict_reference(measured, reference, minimum, unit, what):
    """A figure against the reference a buyer compares with (both in ``unit``):
    PASS when ``measured / reference >= minimum``, WARN below it with the ratio, SKIP
    (the figure kept) when no reference is known (``reference`` None), FAIL without a
    figure (the measurement failed). ``what`` names the reference, e.g. "H100 SXM
    datasheet memory bandwidth"."""
    if not _positive(measured):
        return {
            "verdict": FAIL,
            "figure": None,
            "target": "a measured figure",
            "reason": f"no figure (measured {measured})",
        }
    if reference is None:
        return skip(f"reference: none known ({what})", "none known", measured)
    ratio = measured / reference
    target = f"reference {reference:g} {unit} ({what}); WARN below {minimum:g} x"
    ok = ratio >= minimum
    return {
        "verdict": PASS if ok else WARN,
        "figure": measured,
        "target": target,
        "reason": None if ok else f"{ratio:.2f} x the reference {reference:g} {unit}",
    }


def reference_part(name, measured, gpu_name, key, scale, minimum, unit, what, **figures):
    """The part of ``measured`` against ``REFERENCES[gpu][key] × scale`` (in ``unit``)."""
    label, refs = references_for(gpu_name)
    ref = refs.get(key)
    ref = None if ref is None else ref * scale
    v = verdict_reference(
        measured, ref, minimum, unit, f"{label} {what}" if label else f"{what} of {gpu_name!r}"
    )
    return _part(
        name,
        v,
        unit=unit,
        reference=ref,
        reference_of=label,
        ratio=measured / ref if ref and _positive(measured) else None,
        **figures,
    )


def combine(parts):
    """The verdict of several parts: FAIL if any FAILs, else WARN if any WARNs, else PASS
    if any PASSes, else SKIP."""
    verdicts = [p["verdict"] for p in parts]
    for v in (FAIL, WARN, PASS):
        if v in verdicts:
            return v
    return SKIP


def _positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _part(name, v, **figures):
    return {"name": name, **v, **({"figures": figures} if figures else {})}


def on_cpu(v, device):
    """On the CPU a GPU-timer target does not apply: keep the figures, say SKIP."""
    if device == "cuda":
        return v
    return skip(
        f"--device {device}: the target is about the CUDA timers; this run only "
        f"exercised the code path (figure {_fmt(v['figure'])}, would be "
        f"{v['verdict']})",
        v["target"],
        v["figure"],
    )


def _fmt(x):
    return "-" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))


# --------------------------------------------------------------------------- helpers


def milarun_cli(args, timeout, env=None):
    """Run ``python -m milarun ARGS`` (this interpreter, the repository root as cwd);
    returns the CompletedProcess (text output)."""
    return subprocess.run(
        [sys.executable, "-m", "milarun", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def last_line(text):
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def read_records(folder):
    """The result records (``name``, ``job_id``, ``success``) of a results folder."""
    out = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and {"name", "job_id", "success"} <= rec.keys():
            rec["_file"] = path.name
            out.append(rec)
    return out


def steady_rate(samples):
    """Items/s over the non-warm-up samples: Σ count ÷ Σ (end − start); None without any."""
    steady = [s for s in samples if not s.get("warmup")]
    seconds = sum(s["end"] - s["start"] for s in steady)
    return sum(s["count"] for s in steady) / seconds if seconds > 0 else None


class Torch:
    """torch, the device, its name (the key of :data:`REFERENCES`) and its synchronize,
    imported once."""

    def __init__(self, device):
        import torch

        if device == "cpu":
            torch.set_num_threads(1)  # the CPU mode is for tests on small shared hosts

        self.torch = torch
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.name = torch.cuda.get_device_name(self.device) if self.cuda else "cpu"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.device)


# --------------------------------------------------------------------------- prescreen


def check_prescreen(T):
    """One part per finding of the host prescreen (:func:`milarun.host.prescreen.prescreen`):
    PASS when as expected, WARN when not (a setting of the node that moves the figures,
    not a fault of milarun's), SKIP when unknown; on the CPU a WARN is a SKIP with the
    figure (the expectations are a GPU node's)."""
    parts = []
    for f in prescreen():
        found, expected, why = f["found"], f["expected"], f["why"]
        if f["ok"] is True:
            v = {"verdict": PASS, "figure": found, "target": expected, "reason": None}
        elif f["ok"] is False and T.cuda:
            v = {
                "verdict": WARN,
                "figure": found,
                "target": expected,
                "reason": f"found {found}, expected {expected}: {why}",
            }
        elif f["ok"] is False:
            v = skip(f"--device cpu: a GPU node's setting, found {found}", expected, found)
        else:
            v = skip(f"unknown: {why}", expected, found)
        parts.append(_part(f["name"], v))
    return parts


# --------------------------------------------------------------------------- rate


def mlp_step(T, width, batch, depth=4):
    """A training step of a ``depth``-layer MLP on a fixed batch: forward, MSE loss,
    backward, SGD. Returns ``step()`` (no host sync inside)."""
    torch = T.torch
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(T.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=T.device)
    y = torch.randn(batch, width, device=T.device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def repeats_for(T, work, seconds, least=3):
    """How many calls of ``work()`` last about ``seconds``: timed (synchronize +
    perf_counter) over 1, 2, 4, … calls until a tenth of ``seconds`` has passed, so one
    call that happened to be fast (or slow) does not set the count."""
    k = 1
    while True:
        T.sync()
        t0 = time.perf_counter()
        for _ in range(k):
            work()
        T.sync()
        dt = time.perf_counter() - t0
        if dt >= seconds / 10 or k >= 1 << 20:
            return max(least, math.ceil(k * seconds / max(dt, 1e-9))), dt / k
        k *= 2


def bare_rate(T, step, steps, batch):
    """Items/s of ``steps`` steps timed with synchronize + perf_counter."""
    T.sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    T.sync()
    return steps * batch / (time.perf_counter() - t0)


def instrumented_rate(T, step, steps, batch, sample_duration):
    """``(whole, steady, windows)``: items/s that milarun's RateLogger measures over the
    same loop, Σ count ÷ Σ (end − start) over every window (the windows are contiguous,
    so this is the items over the timer's span of the whole loop: the bare loop's
    quantity), the same over the non-warm-up windows only (what a record's steady state
    holds) and the number of windows."""
    timer = CudaEventTimer(T.device) if T.cuda else PerfCounterTimer()
    logger = RateLogger(
        sample_duration=sample_duration, max_count=steps * batch, warmup=1, timer=timer
    )
    for s in logger.steps():
        step()
        s.set_count(batch)
    T.sync()
    whole = sum(s["count"] for s in logger.samples) / sum(
        s["end"] - s["start"] for s in logger.samples
    )
    return whole, steady_rate(logger.samples), len(logger.samples)


def check_rate(args, T):
    cuda = T.cuda
    width, batch = (4096, 2048) if cuda else (64, 64)
    if args.rate_width:
        width = args.rate_width
    step = mlp_step(T, width, batch)
    for _ in range(5):  # warm-up: kernels, allocator
        step()
    steps, step_s = repeats_for(T, step, args.rate_seconds, least=20)
    window = min(0.5, args.rate_seconds / 8)
    pairs = []
    for i in range(args.rate_pairs):
        order = ("inst", "bare") if i % 2 == 0 else ("bare", "inst")
        got = {}
        for mode in order:
            if mode == "bare":
                got["bare"] = bare_rate(T, step, steps, batch)
            else:
                got["inst"], got["steady"], got["windows"] = instrumented_rate(
                    T, step, steps, batch, window
                )
        pairs.append(got)
    ratios = [p["inst"] / p["bare"] for p in pairs if _positive(p["inst"]) and _positive(p["bare"])]
    ratio = statistics.median(ratios) if ratios else None
    v = verdict_within(ratio, 1.0, RATE_TOLERANCE, "instrumented/bare")
    figures = {
        "width": width,
        "batch": batch,
        "depth": 4,
        "steps": steps,
        "step_s": step_s,
        "sample_duration_s": window,
        "pairs": [
            {
                "instrumented_items_s": p["inst"],
                "bare_items_s": p["bare"],
                "instrumented_steady_items_s": p["steady"],
                "windows": p["windows"],
            }
            for p in pairs
        ],
        "ratios": ratios,
    }
    return [_part("instrumented/bare", on_cpu(v, "cuda" if cuda else T.device.type), **figures)]


# --------------------------------------------------------------------------- matmul


def set_tf32(torch, on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")


def bare_tflops(T, precision, size, seconds):
    """TFLOP/s of back-to-back ``torch.matmul(a, b, out=c)``: 2·n³ × N ÷ seconds ÷ 1e12."""
    torch = T.torch
    dtype = {
        "fp32": torch.float32,
        "tf32": torch.float32,
        "fp16": torch.float16,
        "bf16": torch.bfloat16,
    }[precision]
    a = torch.randn(size, size, device=T.device).to(dtype)
    b = torch.randn(size, size, device=T.device).to(dtype)
    c = torch.empty(size, size, device=T.device, dtype=dtype)
    set_tf32(torch, precision == "tf32")
    try:
        for _ in range(3):
            torch.matmul(a, b, out=c)
        n, _ = repeats_for(T, lambda: torch.matmul(a, b, out=c), seconds)
        T.sync()
        t0 = time.perf_counter()
        for _ in range(n):
            torch.matmul(a, b, out=c)
        T.sync()
        return 2.0 * size**3 * n / (time.perf_counter() - t0) / 1e12
    finally:
        set_tf32(torch, False)


def matmul_precisions(args, cuda):
    """``--matmul-precisions``, else the four of :data:`PRECISIONS` on a GPU, fp32 on the CPU."""
    if args.matmul_precisions:
        return args.matmul_precisions.split(",")
    return list(PRECISIONS) if cuda else ["fp32"]


def check_matmul(args, T, work, state):
    cuda = T.cuda
    size = args.matmul_size or (8192 if cuda else 128)
    precisions = matmul_precisions(args, cuda)
    seconds = args.matmul_seconds
    before = {p: bare_tflops(T, p, size, seconds) for p in precisions}
    if cuda:
        T.torch.cuda.empty_cache()  # leave the child the memory this process cached
    out = Path(work) / "matmul.json"
    argv = [
        "run",
        "milarun.models.matmul:main",
        "-o",
        str(out),
        "--",
        "--device",
        "cuda" if cuda else T.device.type,
        "--size",
        str(size),
        "--precisions",
        ",".join(precisions),
        "--max-count",
        "1",
        "--min-steady",
        str(args.matmul_steady),
        "--warmup",
        "2",
        "--sample-duration",
        "0.5",
    ]
    env = {}
    if cuda:  # the GPU of the bare loop (cuda:0 here), numbered as NVML numbers it
        spec = os.environ.get("CUDA_VISIBLE_DEVICES")
        env = {
            "CUDA_VISIBLE_DEVICES": spec.split(",")[0].strip() if spec else "0",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        }
    proc = milarun_cli(argv, timeout=300, env=env)
    after = {p: bare_tflops(T, p, size, seconds) for p in precisions}
    # the bare bf16 loop against the GPU's published maximum achievable bf16 matmul
    parts = (
        [
            reference_part(
                "bf16 vs reference",
                (before["bf16"] + after["bf16"]) / 2,
                T.name,
                "matmul_bf16_tflops",
                1.0,
                MATMUL_REF_MIN,
                "TFLOP/s",
                "max achievable bf16 matmul",
                size=size,
            )
        ]
        if "bf16" in precisions
        else []
    )
    rec = None
    if out.exists():
        try:
            rec = json.loads(out.read_text())
        except ValueError:
            rec = None
    if proc.returncode != 0 or not rec or not rec.get("success"):
        why = (rec or {}).get("error") or last_line(proc.stderr)
        return [
            _part(
                "milarun run",
                verdict_bool(False, None, "the run succeeds", f"milarun run matmul failed: {why}"),
                returncode=proc.returncode,
            ),
            *parts,
        ]
    state["matmul_record"] = rec
    ours = []
    for p in precisions:
        ref = (before[p] + after[p]) / 2
        got = rec.get("metrics", {}).get(f"tflops_{p}")
        v = verdict_at_least(got, ref, MATMUL_MIN_RATIO, f"{p} milarun/bare")
        ours.append(
            _part(
                p,
                on_cpu(v, "cuda" if cuda else T.device.type),
                size=size,
                milarun_tflops=got,
                bare_tflops_before=before[p],
                bare_tflops_after=after[p],
                bare_tflops=ref,
            )
        )
    return ours + parts


# --------------------------------------------------------------------------- bandwidth


def copy_gb_s(T, dst, src, nbytes, seconds):
    """GB/s (1e9 bytes/s) of back-to-back ``dst.copy_(src, non_blocking=True)``, counting
    ``nbytes`` per copy, timed with synchronize + perf_counter over about ``seconds``."""

    def work():
        dst.copy_(src, non_blocking=True)

    for _ in range(2):
        work()
    n, _ = repeats_for(T, work, seconds)
    T.sync()
    t0 = time.perf_counter()
    for _ in range(n):
        work()
    T.sync()
    return nbytes * n / (time.perf_counter() - t0) / 1e9


def check_bandwidth(args, T):
    """Device-memory bandwidth (a device-to-device copy of ``--bandwidth-mib`` MiB: it
    reads and writes that many bytes, 2 x counted, as STREAM's and BabelStream's copy
    count) against the datasheet's, and pinned host-to-device and device-to-host copies
    of the same size against PCIe Gen5 x16 practice; all in GB/s (1e9 bytes/s)."""
    torch = T.torch
    mib = args.bandwidth_mib or (1024 if T.cuda else 8)
    nbytes = mib << 20
    seconds = args.bandwidth_seconds
    a = torch.empty(nbytes // 4, dtype=torch.float32, device=T.device)
    b = torch.empty_like(a)
    device_copy = copy_gb_s(T, b, a, 2 * nbytes, seconds)
    del b
    host = torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=T.cuda)
    h2d = copy_gb_s(T, a, host, nbytes, seconds)
    d2h = copy_gb_s(T, host, a, nbytes, seconds)
    del a, host
    common = {"mib": mib}
    return [
        reference_part(
            "device copy",
            device_copy,
            T.name,
            "memory_tb_s",
            1000.0,
            MEMORY_REF_MIN,
            "GB/s",
            "datasheet memory bandwidth",
            **common,
        ),
        reference_part(
            "host to device",
            h2d,
            T.name,
            "pcie_gb_s",
            1.0,
            PCIE_REF_MIN,
            "GB/s",
            "PCIe Gen5 x16 pinned copies in practice",
            pinned=T.cuda,
            **common,
        ),
        reference_part(
            "device to host",
            d2h,
            T.name,
            "pcie_gb_s",
            1.0,
            PCIE_REF_MIN,
            "GB/s",
            "PCIe Gen5 x16 pinned copies in practice",
            pinned=T.cuda,
            **common,
        ),
    ]


# --------------------------------------------------------------------------- nvml


def _nvml():
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def _uuid(u):
    u = str(_s(u)).lower()
    return u[4:] if u.startswith("gpu-") else u


def _bdf(bus_id):
    """``(domain, bus, device)`` of a PCI bus id ``"00000000:3B:00.0"`` (NVML) or
    ``"0000:3b:00.0"``."""
    dom, bus, rest = str(_s(bus_id)).split(":")
    return int(dom, 16), int(bus, 16), int(rest.split(".")[0], 16)


def energy_parts(times, powers, energies, limit_w):
    """Verdicts of one GPU's NVML series: times (s), powers (W), energies (J, counter)."""
    parts = []
    bad = (
        [p for p in powers if not (0 <= p <= POWER_LIMIT_MARGIN * limit_w)]
        if limit_w
        else [p for p in powers if p < 0]
    )
    parts.append(
        verdict_bool(
            bool(powers) and not bad,
            max(powers) if powers else None,
            f"0 <= power <= {POWER_LIMIT_MARGIN:g} x enforced limit ({_fmt(limit_w)} W)",
            f"{len(bad)} power reading(s) out of bounds, e.g. {bad[:3]} W"
            if powers
            else "no power reading",
        )
    )
    drops = [(a, b) for a, b in zip(energies, energies[1:]) if b < a]
    parts.append(
        verdict_bool(
            len(energies) >= 2 and not drops,
            len(energies),
            "energy counter never decreases",
            f"counter decreased {len(drops)} time(s), e.g. {drops[:2]}"
            if drops
            else "fewer than 2 energy readings",
        )
    )
    integral = sum(
        (t1 - t0) * (p0 + p1) / 2 for t0, t1, p0, p1 in zip(times, times[1:], powers, powers[1:])
    )
    delta = energies[-1] - energies[0] if len(energies) >= 2 else None
    parts.append(verdict_within(delta, integral, ENERGY_TOLERANCE, "counter dE / integral P dt"))
    return parts, {
        "mean_power_w": statistics.fmean(powers) if powers else None,
        "energy_delta_j": delta,
        "power_integral_j": integral,
        "span_s": times[-1] - times[0] if times else None,
    }


def check_nvml(args, T, state):
    if not T.cuda:
        return [
            _part(
                "nvml",
                skip(f"--device {T.device.type}: NVML readings are checked on NVIDIA GPUs only"),
            )
        ]
    try:
        nv = _nvml()
    except Exception as exc:
        return [
            _part(
                "nvml", verdict_bool(False, None, "NVML starts", f"{exc.__class__.__name__}: {exc}")
            )
        ]
    torch = T.torch
    parts = []
    # milarun's view of the devices, through its CLI
    proc = milarun_cli(["devices", "--json"], timeout=60)
    try:
        inv = json.loads(proc.stdout)
    except ValueError:
        return [
            _part(
                "milarun devices",
                verdict_bool(False, None, "milarun devices --json", last_line(proc.stderr)),
            )
        ]
    devices = [d for d in inv.get("devices", []) if d.get("parent") is None]
    if inv.get("backend") != "nvidia" or not devices:
        parts.append(
            _part(
                "milarun devices",
                verdict_bool(
                    False,
                    inv.get("backend"),
                    "backend nvidia with devices",
                    f"milarun sees backend {inv.get('backend')!r}: {inv.get('tried')}",
                ),
            )
        )
    identity, nvml_of = _nvml_identity_parts(nv, torch, devices)
    parts += identity
    handles = {
        nvml_of.get(k, k): nv.nvmlDeviceGetHandleByIndex(nvml_of.get(k, k))
        for k in range(torch.cuda.device_count())
    }
    series, errors, t0 = _nvml_under_load(args, nv, torch, handles)
    parts += _nvml_reading_parts(nv, handles, series, errors, t0)
    parts += _monitor_parts(nv, state)
    return parts


def _nvml_identity_parts(nv, torch, devices):
    """One part per GPU milarun lists: NVML, milarun and torch agree on its UUID and PCI
    bus id. Returns ``(parts, {torch index: NVML index})``."""
    parts = []
    ntorch = torch.cuda.device_count()
    # milarun lists the visible GPUs in CUDA_VISIBLE_DEVICES order, which is torch's
    # (CUDA_DEVICE_ORDER=PCI_BUS_ID): its k-th device is cuda:k, whatever its NVML index
    nvml_of = {}  # torch index -> NVML index
    for k, d in enumerate(devices):
        idx = d["index"]
        h = nv.nvmlDeviceGetHandleByIndex(idx)
        nv_uuid = _uuid(nv.nvmlDeviceGetUUID(h))
        nv_bdf = _bdf(nv.nvmlDeviceGetPciInfo(h).busId)
        if k >= ntorch:
            parts.append(
                _part(
                    f"gpu{idx} identity",
                    verdict_bool(False, None, "torch sees it", f"torch sees {ntorch} device(s)"),
                )
            )
            continue
        nvml_of[k] = idx
        props = torch.cuda.get_device_properties(k)
        t_uuid = _uuid(props.uuid)
        t_bdf = (props.pci_domain_id, props.pci_bus_id, props.pci_device_id)
        same = (
            nv_uuid == _uuid(d.get("uuid") or "") == t_uuid
            and nv_bdf == _bdf(d.get("pci_bus_id") or "0:0:0.0") == t_bdf
        )
        parts.append(
            _part(
                f"gpu{idx} identity",
                verdict_bool(
                    same,
                    d.get("pci_bus_id"),
                    "UUID and PCI bus id agree: NVML, milarun, torch",
                    f"NVML {nv_uuid} {nv_bdf}, milarun {d.get('uuid')} {d.get('pci_bus_id')}, "
                    f"torch cuda:{k} {t_uuid} {t_bdf}",
                ),
                nvml_uuid=nv_uuid,
                torch_uuid=t_uuid,
                milarun_uuid=d.get("uuid"),
                torch_index=k,
            )
        )
    return parts, nvml_of


def _nvml_under_load(args, nv, torch, handles):
    """Keep a fp16 matmul queued on every torch device for 2 s of warm-up plus
    ``--nvml-seconds`` while a thread samples NVML every ``--nvml-interval`` s. Returns
    ``(series, errors, t0)``: per NVML index ``{"t", "p" (W), "e" (J), "sm", "mem" (MHz)}``,
    the first NVML errors, and the start on ``time.perf_counter``'s clock."""
    # pynvml's ctypes calls release the GIL, so the load keeps being queued meanwhile
    count = torch.cuda.device_count()
    size = args.nvml_size
    mats = []
    for k in range(count):
        dev = torch.device("cuda", k)
        a = torch.randn(size, size, device=dev, dtype=torch.float16)
        mats.append((dev, a, torch.empty_like(a)))
    series = {i: {"t": [], "p": [], "e": [], "sm": [], "mem": []} for i in handles}
    errors = []
    stop = threading.Event()

    def sampler():
        while not stop.wait(args.nvml_interval):
            try:
                for i, h in handles.items():
                    s = series[i]
                    t = time.perf_counter()
                    p = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
                    e = nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0
                    sm = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
                    mem = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)
                    for key, v in zip(("t", "p", "e", "sm", "mem"), (t, p, e, sm, mem)):
                        s[key].append(v)
            except Exception as exc:  # an NVML error is a finding, not a crash
                errors.append(f"{exc.__class__.__name__}: {exc}")
                return

    warm = 2.0  # load first, then sample
    t0 = time.perf_counter()
    thread = None
    try:
        while time.perf_counter() - t0 < warm + args.nvml_seconds and not errors:
            if thread is None and time.perf_counter() - t0 >= warm:
                thread = threading.Thread(target=sampler, daemon=True)
                thread.start()
            for _dev, a, c in mats:
                for _ in range(4):
                    torch.matmul(a, a, out=c)
            for dev, _, _ in mats:  # at most 4 matmuls queued per GPU
                torch.cuda.synchronize(dev)
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        del mats
    return series, errors, t0


def _nvml_reading_parts(nv, handles, series, errors, t0):
    """Per GPU: power, energy counter monotonic and consistent with power, clocks within
    their maxima (from the samples of :func:`_nvml_under_load`)."""
    parts = []
    if errors:
        parts.append(_part("readings", verdict_bool(False, None, "NVML readings", errors[0])))
    for i, h in handles.items():
        s = series[i]
        n = min(len(s[k]) for k in s)  # an error may cut a row short
        s = {k: v[:n] for k, v in s.items()}
        try:
            limit = nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
        except Exception:
            limit = None
        sub, figs = (
            energy_parts([t - t0 for t in s["t"]], s["p"], s["e"], limit)
            if n
            else ([verdict_bool(False, None, "readings", "no reading")] * 3, {})
        )
        for name, v in zip(("power", "energy monotonic", "energy vs power"), sub):
            parts.append(_part(f"gpu{i} {name}", v, **(figs if name == "energy vs power" else {})))
        try:
            max_sm = nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)
            max_mem = nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)
        except Exception:
            max_sm = max_mem = None
        ok = (
            bool(s["sm"])
            and all(0 < c <= (max_sm or c) for c in s["sm"])
            and all(0 < c <= (max_mem or c) for c in s["mem"])
        )
        parts.append(
            _part(
                f"gpu{i} clocks",
                verdict_bool(
                    ok,
                    statistics.median(s["sm"]) if s["sm"] else None,
                    f"0 < SM clock <= max ({max_sm} MHz), 0 < memory clock <= max ({max_mem} MHz)",
                    f"SM {s['sm'][:5]} MHz, memory {s['mem'][:5]} MHz",
                ),
                sm_mhz_median=statistics.median(s["sm"]) if s["sm"] else None,
                mem_mhz_median=statistics.median(s["mem"]) if s["mem"] else None,
                sm_max_mhz=max_sm,
                mem_max_mhz=max_mem,
                power_limit_w=limit,
            )
        )
    return parts


def _monitor_parts(nv, state):
    """milarun's own GPU monitor in the matmul check's record: power readings and a
    monotonic energy counter."""
    parts = []
    # milarun's own monitor, in the matmul record
    rec = state.get("matmul_record")
    if rec is None:
        parts.append(
            _part(
                "milarun monitor", skip("no matmul record (the matmul check did not run or failed)")
            )
        )
    else:
        mon = rec.get("gpu_monitor") or {}
        rows = [r for r in mon.get("samples", []) if r.get("power") is not None]
        if not mon.get("available") or not rows:
            parts.append(
                _part(
                    "milarun monitor",
                    verdict_bool(
                        False,
                        None,
                        "the record's gpu_monitor has power readings",
                        f"available={mon.get('available')}, reason={mon.get('reason')}",
                    ),
                )
            )
        else:
            dev = rows[0].get("device", 0)
            rows = [r for r in rows if r.get("device", 0) == dev]
            try:
                limit = (
                    nv.nvmlDeviceGetEnforcedPowerLimit(nv.nvmlDeviceGetHandleByIndex(int(dev)))
                    / 1000.0
                )
            except Exception:
                limit = None
            sub, figs = energy_parts(
                [r["t"] for r in rows],
                [r["power"] for r in rows],
                [r["energy"] for r in rows if r.get("energy") is not None],
                limit,
            )
            parts.append(_part("milarun monitor power", sub[0]))
            parts.append(_part("milarun monitor energy monotonic", sub[1], **figs))
    return parts


# --------------------------------------------------------------------------- lite


def lite_profile(args, cuda):
    """The lite pass's profile: ``--lite-profile``, else profiles/lite.json on a GPU and
    profiles/cpu.json (the same families, CPU-sized) on the CPU."""
    return args.lite_profile or str(ROOT / "profiles" / ("lite.json" if cuda else "cpu.json"))


def pick_per_family(jobs):
    """One test per workload family of a loaded profile ``{name: job}``: per family
    (:func:`milarun.report.family.family_of` of its tags), the first test in profile
    order that runs on one GPU (plan type ``per-gpu``, no ``multi-gpu`` tag); in the
    order of :data:`~milarun.report.family.FAMILIES`, then ``other``."""
    first = {}
    for name, job in jobs.items():
        if name == "*" or name.startswith("_"):
            continue
        tags = job.get("tags") or []
        if (job.get("partition_scheme") or {}).get(
            "type", "per-gpu"
        ) != "per-gpu" or "multi-gpu" in tags:
            continue
        first.setdefault(family_of(tags), name)
    return [first[f] for f in FAMILIES + (OTHER,) if f in first]


def tiny(command):
    """A prepare command with its dataset size preset made ``tiny``."""
    return re.sub(r"--size(\s+|=)\S+", "--size tiny", command)


def lite_tests(args, cuda):
    """The lite pass's tests, ``[{"name", "family", "prepare", "exec_prefix"}]``
    (``prepare``: the commands, tiny): ``--lite-name``, else :func:`pick_per_family` of
    the profile (:data:`CPU_LITE` on the CPU with the default profile).

    Raises:
        RuntimeError: the profile does not load (``milarun profile``'s last line).
    """
    wanted = args.lite_name or (None if cuda or args.lite_profile else list(CPU_LITE))
    names = ["--name", *wanted] if wanted else []
    proc = milarun_cli(["profile", lite_profile(args, cuda), *names], timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"the profile does not load: {last_line(proc.stderr)}")
    jobs = json.loads(proc.stdout)
    picked = wanted or pick_per_family(jobs)
    return [
        {
            "name": n,
            "family": family_of(jobs[n].get("tags") or []),
            "prepare": [tiny(c) for c in jobs[n].get("prepare") or []],
            "exec_prefix": jobs[n].get("exec_prefix") or [],
        }
        for n in picked
        if n in jobs
    ]


def check_lite(args, T, work, tests):
    """``tests`` (:func:`lite_tests`) through ``milarun jobs``, their datasets prepared
    in tiny presets in ``-d``'s :data:`TINY_FOLDER` (default: a folder of the work
    folder)."""
    if not tests:
        return [
            _part(
                "lite", verdict_bool(False, None, "tests to run", "no test picked from the profile")
            )
        ]
    profile = lite_profile(args, T.cuda)
    dataroot = str(Path(args.dataroot) / TINY_FOLDER if args.dataroot else Path(work) / "data")
    Path(dataroot).mkdir(parents=True, exist_ok=True)
    derived = Path(work) / "lite-tiny.json"
    overrides = {t["name"]: {"prepare": t["prepare"]} for t in tests if t["prepare"]}
    # A test's exec_prefix program (nocache) missing on this node: the test runs without
    # it and the check says so, rather than milarun jobs refusing the whole pass.
    dropped = {
        t["name"]: t["exec_prefix"][0]
        for t in tests
        if t["exec_prefix"] and shutil.which(t["exec_prefix"][0]) is None
    }
    for name in dropped:
        overrides.setdefault(name, {})["exec_prefix"] = []
    derived.write_text(json.dumps({"include": [str(Path(profile).resolve())], **overrides}))
    names = [t["name"] for t in tests]
    out = Path(work) / "lite"
    extra = ["--device", "cpu"] if T.device.type == "cpu" else []
    slots = ["--cpu-slots", "1"] if T.device.type == "cpu" else []
    cmd = [
        "jobs",
        str(derived),
        "-d",
        dataroot,
        "-o",
        str(out),
        "--no-cgexec",
        "--timeout",
        str(args.lite_timeout),
        *slots,
        "--name",
        *names,
        "--",
        *SHORT_ARGS,
        *extra,
    ]
    t0 = time.perf_counter()
    proc = milarun_cli(cmd, timeout=args.lite_timeout * (len(names) + 1) + 120)
    seconds = time.perf_counter() - t0
    if proc.returncode == 2:
        return [
            _part("lite", verdict_bool(False, None, "milarun jobs starts", last_line(proc.stderr)))
        ]
    records = read_records(out)
    parts = []
    for t in tests:
        job = t["name"]
        mine = [r for r in records if r.get("job_name") == job]
        failed = [r for r in mine if not r["success"]]
        rates = [
            steady_rate(((r.get("timings") or {}).get("train") or {}).get("samples") or [])
            for r in mine
        ]
        if not mine:
            said = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if job in ln]
            v = verdict_bool(
                False,
                0,
                "every record says success",
                "no record written" + (f"; milarun jobs said: {said[-1]}" if said else ""),
            )
        else:
            why = "; ".join(
                f"{r['job_id']}: {(r.get('error') or {}).get('reason')}: "
                f"{str((r.get('error') or {}).get('message'))[:200]}"
                for r in failed
            )
            v = verdict_bool(not failed, len(mine), "every record says success", why)
        if job in dropped and v["verdict"] == PASS:
            v = {
                **v,
                "verdict": WARN,
                "reason": f"ran without exec_prefix {dropped[job]!r}, "
                "which is not installed here (scripts/install-apt-packages.sh)",
            }
        parts.append(_part(job, v, family=t["family"], records=len(mine), items_s=rates))
    parts.append(
        _part(
            "milarun jobs",
            verdict_bool(
                proc.returncode == 0,
                proc.returncode,
                "exit status 0",
                f"exit status {proc.returncode}: {last_line(proc.stdout)}",
            ),
            seconds=seconds,
            profile=profile,
            dataroot=dataroot,
        )
    )
    return parts


# --------------------------------------------------------------------------- ddp


def dist_worker(args):
    """One torchrun rank: a DDP step and an FSDP step against a single-model step."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    cuda = args.device == "cuda"
    if cuda:
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=120))
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    width, batch = (1024, 256) if cuda else (32, 16)
    lr = 0.1

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, 1),
        ).to(device)

    def data(r):
        g = torch.Generator().manual_seed(100 + r)
        return (
            torch.randn(batch, width, generator=g).to(device),
            torch.randn(batch, 1, generator=g).to(device),
        )

    def one_step(model, x, y):
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        return opt

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def more_steps(model, opt, x, y, n=5):
        times = []
        for _ in range(n):
            sync()
            t0 = time.perf_counter()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            sync()
            times.append(time.perf_counter() - t0)
        return times

    ref = make()
    xs, ys = zip(*(data(r) for r in range(world)))
    one_step(ref, torch.cat(xs), torch.cat(ys))  # mean loss over the whole batch
    ref_params = [p.detach().clone() for p in ref.parameters()]
    x, y = data(rank)
    figures = {
        "world_size": world,
        "backend": dist.get_backend(),
        "width": width,
        "batch_per_rank": batch,
    }

    def max_diff(params):
        d = max(float((p - q).abs().max()) for p, q in zip(params, ref_params))
        t = torch.tensor([d], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    ddp = DDP(make(), device_ids=[local] if cuda else None)
    opt = one_step(ddp, x, y)
    figures["ddp_max_diff"] = max_diff([p.detach() for p in ddp.module.parameters()])
    figures["ddp_step_s"] = more_steps(ddp, opt, x, y)
    del ddp, opt
    fsdp = make()
    for layer in fsdp:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(fsdp)
    opt = one_step(fsdp, x, y)
    figures["fsdp_max_diff"] = max_diff([p.detach().full_tensor() for p in fsdp.parameters()])
    figures["fsdp_step_s"] = more_steps(fsdp, opt, x, y)
    dist.barrier()
    if rank == 0:
        Path(args.worker_out).write_text(json.dumps(figures))
    dist.destroy_process_group()
    return 0


def check_ddp(args, T, work):
    cuda = T.cuda
    if cuda and T.torch.cuda.device_count() < 2:
        return [
            _part("ddp", skip(f"needs 2 GPUs; torch sees {T.torch.cuda.device_count()}")),
            _part("fsdp", skip(f"needs 2 GPUs; torch sees {T.torch.cuda.device_count()}")),
        ]
    if not cuda and not args.cpu_dist:
        return [
            _part(
                n,
                skip(
                    f"--device {T.device.type}: NCCL needs 2 GPUs (--cpu-dist runs "
                    "the same steps over gloo)"
                ),
            )
            for n in ("ddp", "fsdp")
        ]
    out = Path(work) / "dist.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if cuda:
        env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0,1")
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(Path(__file__).resolve()),
        "--worker",
        "dist",
        "--device",
        T.device.type,
        "--worker-out",
        str(out),
    ]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        rc, err = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, err = "timeout", str(exc.stderr or "")
    seconds = time.perf_counter() - t0
    if rc != 0 or not out.exists():
        line = next((ln for ln in reversed(err.splitlines()) if "Error" in ln), last_line(err))
        return [
            _part(
                n,
                verdict_bool(
                    False,
                    None,
                    "the torchrun job ends with status 0",
                    f"torchrun exit {rc}: {line}",
                ),
                seconds=seconds,
            )
            for n in ("ddp", "fsdp")
        ]
    fig = json.loads(out.read_text())
    parts = []
    for n in ("ddp", "fsdp"):
        diff = fig[f"{n}_max_diff"]
        v = verdict_bool(
            diff <= DIST_TOLERANCE,
            diff,
            f"max |param - single-model param| <= {DIST_TOLERANCE:g}",
            f"parameters differ by {diff:.3g} after one step",
        )
        if not cuda:
            v = skip(
                f"--device {T.device.type}: the check is over NCCL on 2 GPUs; these "
                f"steps ran over gloo on the CPU (max diff {diff:.3g}, would be "
                f"{v['verdict']})",
                v["target"],
                diff,
            )
        parts.append(
            _part(
                n,
                v,
                backend=fig["backend"],
                world_size=fig["world_size"],
                step_s=fig[f"{n}_step_s"],
                seconds=seconds,
            )
        )
    return parts


# --------------------------------------------------------------------------- cgroups


def cgroup_profile(device, experiment="milarun.models.toy_reg:main"):
    """A one-test profile: ``experiment`` per GPU in ``student{device}``, briefly."""
    args = {"--max-count": 1, "--min-steady": 1, "--warmup": 1, "--sample-duration": 0.25}
    if device == "cpu":
        args["--device"] = "cpu"
    return {
        "wave": {
            "experiment": experiment,
            "partition_scheme": {"type": "per-gpu", "cgroup": "cpuset,memory:student{device}"},
            "arguments": args,
            "timeout": 300,
        }
    }


def check_cgroups(args, T, work):
    work = Path(work) / "cgroups"
    (work / "data").mkdir(parents=True, exist_ok=True)
    profile = work / "gpucheck.json"
    profile.write_text(json.dumps(cgroup_profile(T.device.type, args.cgroup_experiment)))
    slots = ["--cpu-slots", "1"] if T.device.type == "cpu" else []
    base = ["jobs", str(profile), "-d", str(work / "data"), "-o", str(work / "out"), *slots]
    proc = milarun_cli([*base, "--dry-run"], timeout=120)
    if proc.returncode != 0:
        return [
            _part(
                "wave",
                skip(
                    f"milarun jobs --dry-run refuses: "
                    f"{first_error(proc.stderr) or last_line(proc.stdout)}"
                ),
            )
        ]
    proc = milarun_cli(base, timeout=600)
    records = read_records(work / "out")
    bad = []
    for r in records:
        label = str(r.get("device"))
        group = str((r.get("host") or {}).get("cgroup"))
        if not r["success"]:
            bad.append(f"{r['job_id']}: {(r.get('error') or {}).get('reason')}")
        elif f"student{label}" not in group:
            bad.append(f"{r['job_id']}: ran in cgroup {group!r}, not student{label}")
    ok = proc.returncode == 0 and records and not bad
    why = "; ".join(bad) or f"exit status {proc.returncode}: {last_line(proc.stderr)}"
    return [
        _part(
            "wave",
            verdict_bool(
                bool(ok), len(records), "every device's record: success, in its student cgroup", why
            ),
            cgroups=[(r.get("host") or {}).get("cgroup") for r in records],
            cpus=[len((r.get("host") or {}).get("cpuset") or []) for r in records],
        )
    ]


# --------------------------------------------------------------------------- plan


def estimate(name, args, cuda, gpus, tests):
    """``(seconds, basis)``: the estimated wall time of check ``name`` on ``gpus`` GPUs
    (``cuda``) or the CPU, from its options, and how it is reckoned (see :data:`START_S`
    and the constants beside it)."""
    child = CHILD_S[cuda]
    if name == "prescreen":
        return 1.0, "sysfs, procfs and NVML reads"
    if name == "rate":
        return (
            args.rate_pairs * 2 * args.rate_seconds + 0.2 * args.rate_seconds + 2.0,
            f"{args.rate_pairs} pairs x 2 loops x {args.rate_seconds:g} s, calibration "
            f"0.2 x {args.rate_seconds:g} s, model and warm-up 2 s",
        )
    if name == "matmul":
        n = len(matmul_precisions(args, cuda))
        # milarun's matmul on a GPU: a step is one 1 s block per precision, 2 warm-up steps
        step = float(n) if cuda else 0.5
        steady = math.ceil(args.matmul_steady / step) * step
        return (
            2 * n * (1.2 * args.matmul_seconds + 0.5) + child + 2 * step + steady,
            f"bare loops 2 x {n} precision(s) x ({args.matmul_seconds:g} s + calibration, "
            f"set-up); milarun run: child {child:g} s, warm-up 2 steps of {step:g} s, steady "
            f"{steady:g} s",
        )
    if name == "bandwidth":
        return (
            3 * 1.2 * args.bandwidth_seconds + 1.0,
            f"3 copies x ({args.bandwidth_seconds:g} s + calibration), allocations 1 s",
        )
    if name == "nvml":
        if not cuda:
            return 0.0, "SKIP on the CPU"
        return (
            5.0 + args.nvml_seconds,
            f"milarun devices 3 s, load warm-up 2 s, sampling {args.nvml_seconds:g} s",
        )
    if name == "lite":
        datasets = {c for t in tests for c in t["prepare"]}
        return (
            JOBS_S + TINY_DATASET_S * len(datasets) + len(tests) * (child + 2.0),
            f"{len(tests)} test(s) x (child {child:g} s + 1 warm-up window + 1 s steady), "
            f"{len(datasets)} tiny dataset(s) x {TINY_DATASET_S:g} s, milarun jobs "
            f"{JOBS_S:g} s",
        )
    if name == "ddp":
        if (gpus >= 2) if cuda else args.cpu_dist:
            return TORCHRUN_S, "torchrun, 2 ranks: start, process group, a few steps"
        return 0.0, "SKIP: " + ("needs 2 GPUs" if cuda else "NCCL on the CPU (see --cpu-dist)")
    if name == "cgroups":
        return 3.0 + child + 2.0, (
            f"dry run 3 s; one toy_reg per GPU: child {child:g} s, warm-up and 1 s steady"
        )
    raise ValueError(name)


def make_plan(args, selected, cuda, gpus, tests):
    """The run's plan: ``[{"check", "estimate_s", "basis", "run", "note"}]``, ``start``
    (the interpreter, torch, the CUDA context) first, then the ``selected`` checks in
    :data:`CHECKS` order. Each is kept while its estimate fits what is left of
    ``--budget`` (s); the lite pass first shrinks to fit, leaving out its last tests (the
    families last in :data:`~milarun.report.family.FAMILIES` order; ``tests`` is
    shortened in place; it keeps one); a check that still does not fit has ``run``
    False and says so in ``note``."""
    rows = [
        {
            "check": "start",
            "estimate_s": START_S[cuda],
            "basis": "interpreter, import torch" + (", CUDA context" if cuda else ""),
            "run": True,
            "note": None,
        }
    ]
    left = args.budget - START_S[cuda]
    for name in CHECKS:
        if name not in selected:
            continue
        est, basis = estimate(name, args, cuda, gpus, tests)
        note = None
        if name == "lite":
            dropped = []
            while est > left and len(tests) > 1:
                dropped.insert(0, tests.pop()["name"])
                est, basis = estimate(name, args, cuda, gpus, tests)
            if dropped:
                note = f"shrunk to fit the budget: left out {', '.join(dropped)}"
        run = est <= left
        if run:
            left -= est
        else:
            note = f"does not fit the budget: about {est:.0f} s, {max(left, 0):.0f} s left"
        rows.append({"check": name, "estimate_s": est, "basis": basis, "run": run, "note": note})
    return rows


def show_plan(rows, budget, where, tests):
    print(f"gpu_check plan: {where}, budget {budget:g} s", flush=True)
    print(f"  {'check':10} {'estimate':>8} {'cumul.':>7}  basis")
    total = 0.0
    for r in rows:
        total += r["estimate_s"] if r["run"] else 0.0
        cum = f"{total:6.0f}s" if r["run"] else "      -"
        note = f" [{r['note']}]" if r["note"] else ""
        print(f"  {r['check']:10} {r['estimate_s']:7.0f}s {cum}  {r['basis']}{note}")
    if tests and any(r["check"] == "lite" and r["run"] for r in rows):
        print("  lite tests: " + ", ".join(f"{t['name']} ({t['family']})" for t in tests))
    print(f"  planned: {total:.0f} s of {budget:g} s", flush=True)


# --------------------------------------------------------------------------- main


def parse(argv):
    p = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="auto: cuda when torch sees a GPU, else cpu",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=300.0,
        help="seconds the whole run may take (default 300): the plan leaves out "
        "what does not fit, and a check that would end past it says SKIP",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan and exit (runs nothing on the device)",
    )
    p.add_argument("--only", default=None, help=f"comma-separated among {','.join(CHECKS)}")
    p.add_argument("--skip", default=None, help="comma-separated checks to leave out")
    p.add_argument("--out", default=None, help="write the figures to this JSON file")
    p.add_argument(
        "-d",
        "--dataroot",
        default=None,
        help="keep the lite pass's tiny datasets in DATAROOT/gpu_check-tiny "
        "between runs (default: in the work folder, built each run)",
    )
    p.add_argument(
        "--workdir",
        default=None,
        help="keep the runs' files here (default: a temporary folder, removed)",
    )
    p.add_argument(
        "--rate-seconds",
        type=float,
        default=None,
        help="length of one timed loop (s; 3 on cuda, 0.3 on cpu)",
    )
    p.add_argument("--rate-pairs", type=int, default=3)
    p.add_argument("--rate-width", type=int, default=None)
    p.add_argument("--matmul-size", type=int, default=None, help="8192 on cuda, 128 on cpu")
    p.add_argument("--matmul-precisions", default=None)
    p.add_argument(
        "--matmul-seconds",
        type=float,
        default=None,
        help="bare loop length per precision (s; 2 on cuda, 0.2 on cpu)",
    )
    p.add_argument(
        "--matmul-steady",
        type=float,
        default=None,
        help="milarun's --min-steady for matmul (s; 5 on cuda, 1 on cpu)",
    )
    p.add_argument(
        "--bandwidth-mib",
        type=int,
        default=None,
        help="size of each copy (MiB; 1024 on cuda, 8 on cpu)",
    )
    p.add_argument(
        "--bandwidth-seconds",
        type=float,
        default=None,
        help="length of each timed copy loop (s; 1 on cuda, 0.1 on cpu)",
    )
    p.add_argument("--nvml-seconds", type=float, default=8.0)
    p.add_argument("--nvml-interval", type=float, default=0.1)
    p.add_argument("--nvml-size", type=int, default=8192, help="side of the fp16 load's matrices")
    p.add_argument(
        "--lite-profile",
        default=None,
        help="default: profiles/lite.json on cuda, profiles/cpu.json on cpu",
    )
    p.add_argument(
        "--lite-name",
        nargs="+",
        default=None,
        help="run these tests of it (default: one per workload family)",
    )
    p.add_argument("--lite-timeout", type=int, default=120, help="per test (s)")
    p.add_argument(
        "--cgroup-experiment",
        default="milarun.models.toy_reg:main",
        help="the workload of the cgroups wave",
    )
    p.add_argument(
        "--cpu-dist",
        action="store_true",
        help="on the CPU, run the ddp check's steps over gloo (figures only)",
    )
    p.add_argument("--worker", choices=("dist",), help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for opt in ("only", "skip"):
        val = getattr(args, opt)
        names = [n.strip() for n in val.split(",") if n.strip()] if val else None
        bad = [n for n in names or () if n not in CHECKS]
        if bad:
            p.error(f"--{opt}: unknown check(s) {', '.join(bad)}; choose among {', '.join(CHECKS)}")
        setattr(args, opt, names)
    if not (math.isfinite(args.budget) and args.budget > 0):
        p.error(f"--budget: {args.budget:g} is not a positive number of seconds")
    return args


def main(argv=None):
    t_all = time.perf_counter()
    args = parse(argv)
    # CUDA numbers GPUs as NVML does (milarun's children get the same: accel/nvidia.py)
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if args.worker == "dist":
        return dist_worker(args)
    torch = None
    if args.device != "cpu" or not args.dry_run:
        import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: error: --device cuda: torch sees no CUDA device", file=sys.stderr)
        return 2
    cuda = args.device == "cuda"
    gpus = torch.cuda.device_count() if cuda else 0
    args.rate_seconds = args.rate_seconds or (3.0 if cuda else 0.3)
    args.matmul_seconds = args.matmul_seconds or (2.0 if cuda else 0.2)
    args.matmul_steady = args.matmul_steady or (5.0 if cuda else 1.0)
    args.bandwidth_seconds = args.bandwidth_seconds or (1.0 if cuda else 0.1)
    selected = [c for c in (args.only or CHECKS) if c not in (args.skip or ())]
    tests, lite_error = [], None
    if "lite" in selected:
        try:
            tests = lite_tests(args, cuda)
        except (RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
            lite_error = f"{exc.__class__.__name__}: {exc}"
    where = (
        (f"cuda, {gpus} GPU(s)" if gpus else "cuda, planned for 1 GPU (torch sees none here)")
        if cuda
        else "cpu"
    )
    plan = make_plan(args, selected, cuda, max(gpus, 1) if cuda else 0, tests)
    show_plan(plan, args.budget, where, tests)
    if lite_error:
        print(f"  lite: {lite_error}", flush=True)
    if args.dry_run:
        return 0
    T = Torch("cuda:0" if cuda else "cpu")
    label, refs = references_for(T.name)
    report = {
        "version": VERSION,
        "script": "benchmarks/gpu_check.py",
        "device": args.device,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "torch": torch.__version__,
        "gpu": T.name if cuda else None,
        "gpus": [torch.cuda.get_device_name(i) for i in range(gpus)],
        "references": {"of": label, **refs},
        "targets": {
            "rate": RATE_TOLERANCE,
            "matmul": MATMUL_MIN_RATIO,
            "energy": ENERGY_TOLERANCE,
            "power_limit_margin": POWER_LIMIT_MARGIN,
            "dist": DIST_TOLERANCE,
            "matmul_reference": MATMUL_REF_MIN,
            "memory_reference": MEMORY_REF_MIN,
            "pcie_reference": PCIE_REF_MIN,
        },
        "budget_s": args.budget,
        "plan": plan,
        "checks": {},
    }
    state = {}
    work = Path(args.workdir or tempfile.mkdtemp(prefix="gpu_check-"))
    work.mkdir(parents=True, exist_ok=True)
    runners = {
        "prescreen": lambda: check_prescreen(T),
        "rate": lambda: check_rate(args, T),
        "matmul": lambda: check_matmul(args, T, work, state),
        "bandwidth": lambda: check_bandwidth(args, T),
        "nvml": lambda: check_nvml(args, T, state),
        "lite": lambda: check_lite(args, T, work, tests),
        "ddp": lambda: check_ddp(args, T, work),
        "cgroups": lambda: check_cgroups(args, T, work),
    }
    report["start_s"] = time.perf_counter() - t_all
    try:
        for row in plan[1:]:
            name, est = row["check"], row["estimate_s"]
            spent = time.perf_counter() - t_all
            t0 = time.perf_counter()
            if not row["run"]:
                parts = [_part(name, skip(f"budget: {row['note']}"))]
            elif spent + est > args.budget:
                parts = [
                    _part(
                        name,
                        skip(
                            f"budget: {spent:.0f} s spent, about {est:.0f} s "
                            f"more would pass the {args.budget:g} s budget"
                        ),
                    )
                ]
            elif name == "lite" and lite_error:
                parts = [_part(name, verdict_bool(False, None, "the profile loads", lite_error))]
            else:
                try:
                    parts = runners[name]()
                except Exception as exc:  # a crash is a FAIL with its reason
                    parts = [
                        _part(
                            name,
                            verdict_bool(
                                False, None, "the check runs", f"{exc.__class__.__name__}: {exc}"
                            ),
                        )
                    ]
            entry = {
                "verdict": combine(parts),
                "seconds": time.perf_counter() - t0,
                "estimate_s": est,
                "parts": parts,
            }
            report["checks"][name] = entry
            show(name, entry)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    report["seconds"] = time.perf_counter() - t_all
    report["verdict"] = combine(list(report["checks"].values()))
    report["warnings"] = [
        f"{name}/{p['name']}: {p['reason']}"
        for name, c in report["checks"].items()
        for p in c["parts"]
        if p["verdict"] == WARN
    ]
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(
        f"gpu_check: {report['verdict']} ({report['seconds']:.0f} s of a {args.budget:g} s "
        "budget)" + (f"; figures in {args.out}" if args.out else "")
    )
    if report["warnings"]:
        print(f"gpu_check: {len(report['warnings'])} WARN: " + "; ".join(report["warnings"]))
    return 1 if report["verdict"] == FAIL else 0


def show(name, entry):
    print(
        f"{entry['verdict']:4}  {name} ({entry['seconds']:.1f} s; estimate "
        f"{entry['estimate_s']:.0f} s)",
        flush=True,
    )
    for p in entry["parts"]:
        unit = (p.get("figures") or {}).get("unit")
        line = f"  {p['verdict']:4}  {p['name']}: {_fmt(p['figure'])}" + (
            f" {unit}" if unit else ""
        )
        if p.get("target"):
            line += f" (target: {p['target']})"
        if p.get("reason"):
            line += f"; {p['reason']}"
        print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
