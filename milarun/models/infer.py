"""infer: one process's inference throughput over all its devices (DLBS's multi-process run).

The workload of the ``multi-process`` plan type (:mod:`milarun.plan.types`):
P processes per node, each owning k devices and pinned to the cores of their
NUMA node, all started together. This module is one of those processes. It
runs a network in ``torch.inference_mode`` on each of its k devices at once,
as DLBS's TensorRT benchmark does (one inference engine per GPU, fed from one
request queue):

* ``--model``: a torchvision classifier (``resnet50`` by default, random
  weights) fed images, or ``encoder``, a transformer encoder (BERT-base shape by
  default: ``--layers 12 --d-model 768 --heads 12``) fed ``--seq-len`` token ids;
* ``--precision`` fp32, fp16 or bf16: the network's weights and inputs are cast
  to that type (inference runs in it, no autocast);
* ``--batch-size``: items per batch, per device;
* images are decoded from ``fake_imagenet`` by a ``DataLoader`` (its workers
  decode, resize and normalize JPEGs: the input pipeline counts), or, with
  ``--synthetic``, come from a few pre-decoded tensors made once (the network
  alone counts). The encoder's token ids are always synthetic.

One worker thread per device owns a replica of the network; the main thread
takes batches from the loader and hands each to the next device's queue
(``--inflight`` batches per device at most). On a GPU (CUDA or XPU) the worker
double-buffers (:class:`Pipeline`): each batch's host→device copy goes on a copy
stream, the inference waits for it with an event on a compute stream, and the
worker takes the next batch without waiting, so the copy of batch i+1 overlaps
the inference of batch i; it waits only for the oldest batch once
:data:`PIPELINE_DEPTH` are in flight (or when it has nothing else to do). A
step of the rate logger counts the items whose inference *completed* during it
(a batch completes when its compute event has), so the throughput is completed
items per second of host time over all k devices. On CPU slots a "device" is a
worker thread using its share of the process's cores.

Inputs travel small: images are cast to the inference dtype before they are
pinned (in the loader's workers, or once for ``--synthetic``), so fp16/bf16
batches cross the bus at half the bytes of fp32. At fp16/bf16 on a GPU the
image classifiers run ``channels_last`` (weights and inputs, the layout of the
tensor-core convolutions); ``metrics.channels_last`` says whether they did.

Items are images (or sequences). ``metrics.items_device<i>`` are the items each
device completed. The process's own and effective throughput and its wave's
adjusted total come from the summary (:mod:`milarun.measure.throughput`).

Needs the ``fake_imagenet`` dataset unless ``--synthetic`` or ``--model encoder``.
"""

import collections
import copy
import queue
import threading

import torch
import torchvision
from coleo import Option, default, tooled
from torch import nn
from torchvision import datasets, transforms

from ..bench import data_loader, init_torch, rate_logger
from ..bench import device as bench_device
from ..bench.options import (
    INFERENCE_PRECISIONS,
    batch_size_option,
    precision_option,
    workers_option,
)
from ..bench.rate import PerfCounterTimer
from ..datasets import require
from ..host.isolation import current_cpuset

#: ``--precision`` values and their torch dtypes.
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: Pre-decoded batches cycled by ``--synthetic`` (per process).
SYNTHETIC_BATCHES = 8

#: No loss by nature (milarun.measure.plausibility's NaN check does not apply):
#: inference trains nothing.
NO_LOSS = "inference: nothing is trained"
#: Seconds between two checks of the workers while the main thread waits.
_WAIT_S = 0.5
#: Batches a GPU worker keeps in flight (copying or computing) before it waits for the oldest.
PIPELINE_DEPTH = 2


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.infer:main -- ARGS``."""
    exp.cli(infer, argv)


def build_model(name, image_size, layers, d_model, heads, vocab, classes=1000):
    """The network: a torchvision model ``name`` (random weights, ``classes`` outputs)
    or, for ``"encoder"``, a token embedding + ``nn.TransformerEncoder`` + a pooled
    classifier.

    Raises:
        ValueError: ``name`` is neither ``encoder`` nor a torchvision model.
    """
    if name == "encoder":
        return Encoder(layers, d_model, heads, vocab)
    if name not in torchvision.models.list_models():
        raise ValueError(
            f"--model {name!r} is neither 'encoder' nor a torchvision model (e.g. resnet50)"
        )
    return torchvision.models.get_model(name, weights=None, num_classes=classes)


class Encoder(nn.Module):
    """A token embedding, ``layers`` transformer encoder layers (``d_model`` wide,
    ``heads`` heads, MLP 4 × ``d_model``, no dropout) and a two-way classifier on the
    mean over the sequence. Input: token ids ``(batch, seq_len)``."""

    def __init__(self, layers, d_model, heads, vocab):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, heads, 4 * d_model, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 2)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


class _Cycle:
    """An endless iterable over a list of batches (one epoch = the list)."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


class Cast:
    """A picklable transform: ``tensor.to(dtype)`` (``DataLoader`` workers run it)."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __call__(self, x):
        return x.to(self.dtype)


def _eval_loader(folder, image_size, batch_size, workers, device, dtype=None):
    """Images of ``fake_imagenet``'s train split, decoded as for evaluation (resize,
    centre crop, normalize) by ``DataLoader`` workers, then cast to ``dtype`` (None:
    float32) by the same workers, before the loader pins them."""
    root = folder / "train"
    if not root.is_dir():
        raise FileNotFoundError(f"no train/ folder in {folder}; rebuild the dataset")
    steps = [
        transforms.Resize(image_size),
        transforms.CenterCrop(image_size),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ]
    if dtype is not None:
        steps.append(Cast(dtype))
    return data_loader(
        datasets.ImageFolder(str(root), transform=transforms.Compose(steps)),
        batch_size,
        workers,
        device,
    )


class Pipeline:
    """Double-buffered inference on one GPU: the copy of the next batch overlaps
    the inference of this one, and nothing waits for the device per batch.

    :meth:`submit` queues a batch's host→device copy on the copy stream, records
    an event there, makes the compute stream wait for that event (on the device,
    not the host) and queues the inference on the compute stream, followed by a
    *done* event. :meth:`finished` collects the batches whose done event has
    completed, oldest first; with ``block`` it waits for the oldest one (its
    event, not a whole stream). A batch's host and device tensors are kept until
    it is done, so neither is freed or reused while the device still reads it.

    Args:
        api: ``torch.cuda`` or ``torch.xpu`` (``Stream``, ``Event``, ``stream``).
        device: the ``torch.device``.
        model: the replica on ``device``.
        prepare: ``f(device tensor) -> model input``, run on the compute stream
            (dtype cast, ``channels_last``).
    """

    def __init__(self, api, device, model, prepare):
        self.api = api
        self.device = device
        self.model = model
        self.prepare = prepare
        self.copy_stream = api.Stream(device)
        self.compute_stream = api.Stream(device)
        self.inflight = collections.deque()  # (done event, items, host tensor, device tensor)

    def __len__(self):
        """Batches queued and not yet collected by :meth:`finished`."""
        return len(self.inflight)

    def submit(self, x):
        """Queue the copy and the inference of host batch ``x``; returns at once."""
        api = self.api
        with api.stream(self.copy_stream):
            xd = x.to(self.device, non_blocking=True)
            copied = api.Event()
            copied.record(self.copy_stream)
        self.compute_stream.wait_event(copied)
        with api.stream(self.compute_stream):
            self.model(self.prepare(xd))
            done = api.Event()
            done.record(self.compute_stream)
        self.inflight.append((done, len(x), x, xd))

    def finished(self, block=False):
        """Items of the batches completed since the last call (oldest first).

        Args:
            block: wait for the oldest batch in flight (``Event.synchronize``) if it
                is not done yet; then collect every batch done after it.
        """
        items = 0
        while self.inflight:
            done = self.inflight[0][0]
            if not done.query():
                if not block:
                    break
                done.synchronize()
                block = False
            items += self.inflight.popleft()[1]
        return items


def run_pipeline(pipeline, inputs, report, depth=PIPELINE_DEPTH):
    """A GPU worker's loop: feed ``pipeline`` from queue ``inputs`` until a None.

    Takes the next batch without waiting while batches are in flight; waits for
    the oldest batch only when ``depth`` are in flight or no batch is queued, and
    reports completed items (``report(n)``, n > 0) as soon as it sees them.
    """

    def collect(block):
        n = pipeline.finished(block=block)
        if n:
            report(n)

    while True:
        if len(pipeline) >= depth:
            collect(block=True)
            continue
        try:
            x = inputs.get_nowait() if len(pipeline) else inputs.get()
        except queue.Empty:
            collect(block=True)
            continue
        if x is None:
            while len(pipeline):
                collect(block=True)
            return
        pipeline.submit(x)
        collect(block=False)


class Workers:
    """One thread per device, each running its own replica of the model.

    Args:
        model: the network (on the CPU, in eval mode); each device gets a copy.
        devices: list of ``torch.device``.
        dtype: the ``torch`` dtype of the weights and inputs.
        inflight: batches queued per device at most.
        threads: intra-op threads per worker (CPU devices).
        channels_last: replicas and image inputs in ``torch.channels_last``.
    """

    def __init__(self, model, devices, dtype, inflight=2, threads=1, channels_last=False):
        self.devices = devices
        self.done = queue.Queue()
        self.inputs = [queue.Queue(maxsize=max(1, inflight)) for _ in devices]
        self.counts = [0] * len(devices)
        self.errors = []
        self.next = 0
        self.memory_format = torch.channels_last if channels_last else None
        replicas = [copy.deepcopy(model).to(device=d, dtype=dtype).eval() for d in devices]
        if self.memory_format is not None:
            replicas = [r.to(memory_format=self.memory_format) for r in replicas]
        self.threads = [
            threading.Thread(
                target=self._run, args=(i, replicas[i], dtype), daemon=True, name=f"infer-{d}"
            )
            for i, d in enumerate(devices)
        ]
        if not all(bench_device.is_accelerator(d) for d in devices):
            torch.set_num_threads(max(1, threads))
        for t in self.threads:
            t.start()

    def _report(self, i, n):
        self.counts[i] += n
        self.done.put(n)

    def _run(self, i, model, dtype):
        device = self.devices[i]
        fmt = self.memory_format
        try:
            api = bench_device.module(device)
            with torch.inference_mode():
                if api is not None:
                    api.set_device(device)
                    pipe = Pipeline(api, device, model, lambda xd: _prepare(xd, dtype, fmt))
                    run_pipeline(pipe, self.inputs[i], lambda n: self._report(i, n))
                    return
                while True:
                    x = self.inputs[i].get()
                    if x is None:
                        return
                    model(_prepare(_to(x, device, dtype), dtype, fmt))
                    self._report(i, len(x))
        except BaseException as exc:  # reported to the main thread, which raises it
            self.errors.append(exc)
            self.done.put(0)

    def _check(self):
        if self.errors:
            raise RuntimeError(f"an inference worker failed: {self.errors[0]!r}") from self.errors[
                0
            ]

    def submit(self, x):
        """Queue batch ``x`` for the next device (round robin); waits while it is busy."""
        q = self.inputs[self.next]
        self.next = (self.next + 1) % len(self.inputs)
        while True:
            self._check()
            try:
                q.put(x, timeout=_WAIT_S)
                return
            except queue.Full:
                continue

    def completed(self):
        """Items whose inference completed since the last call."""
        items = 0
        while True:
            try:
                items += self.done.get_nowait()
            except queue.Empty:
                break
        self._check()
        return items

    def close(self):
        """Stop the workers (after their queued batches) and wait for them."""
        for q in self.inputs:
            while True:
                try:
                    q.put(None, timeout=_WAIT_S)
                    break
                except queue.Full:
                    if self.errors:
                        break
        for t in self.threads:
            t.join(timeout=60)


def _to(x, device, dtype):
    # token ids stay integers; images take the inference dtype
    if x.is_floating_point():
        return x.to(device=device, dtype=dtype, non_blocking=True)
    return x.to(device=device, non_blocking=True)


def _prepare(x, dtype, memory_format):
    """The model's input from a batch on its device: images in ``dtype`` (a no-op when
    they were cast before pinning) and ``memory_format`` (None: as they are); token
    ids as they are."""
    if not x.is_floating_point():
        return x
    if x.dtype != dtype:
        x = x.to(dtype)
    if memory_format is not None and x.dim() == 4:
        x = x.contiguous(memory_format=memory_format)
    return x


def own_devices(exp):
    """This process's devices: every GPU it sees (CUDA: the plan's
    ``CUDA_VISIBLE_DEVICES``; XPU: ``ZE_AFFINITY_MASK``), or on the CPU one per device
    the launcher gave it (CPU slots), at least one."""
    api = bench_device.module(exp.device)
    if api is not None:
        kind = bench_device.kind(exp.device)
        return [torch.device(f"{kind}:{i}") for i in range(api.device_count())]
    return [torch.device("cpu")] * max(1, len(exp.result.get("devices") or [0]))


def use_channels_last(model, precision, device):
    """Whether the replicas run ``channels_last``: image classifiers at fp16/bf16 on a
    GPU (CUDA, XPU), where tensor-core convolutions want NHWC."""
    return (
        model != "encoder" and precision in ("fp16", "bf16") and bench_device.is_accelerator(device)
    )


@tooled
def infer(exp):
    # Network: a torchvision classifier (resnet50, resnet18, ...) or encoder
    model: Option = default("resnet50")
    batch_size = batch_size_option(default=64)  # per device
    # Side of the images fed to the network, in pixels
    image_size: Option & int = default(224)
    precision = precision_option(default="fp32", choices=INFERENCE_PRECISIONS)
    # Pre-decoded random tensors instead of JPEGs decoded by a DataLoader
    synthetic: Option & bool = default(False)
    workers = workers_option(default=-1)
    # Batches queued per device at most
    inflight: Option & int = default(2)
    # Encoder: tokens per sequence
    seq_len: Option & int = default(128)
    # Encoder: layers, model width, attention heads, vocabulary size
    layers: Option & int = default(12)
    d_model: Option & int = default(768)
    heads: Option & int = default(12)
    vocab: Option & int = default(30522)

    device = init_torch(exp)
    dtype = DTYPES[precision]
    devices = own_devices(exp)
    net = build_model(model, image_size, layers, d_model, heads, vocab)
    if model == "encoder":
        batches = _Cycle(
            [torch.randint(vocab, (batch_size, seq_len)) for _ in range(SYNTHETIC_BATCHES)]
        )
    elif synthetic:
        # cast, then pin: the bus carries the inference dtype, not float32
        pin = bench_device.is_accelerator(device)
        made = [
            torch.randn(batch_size, 3, image_size, image_size).to(dtype)
            for _ in range(SYNTHETIC_BATCHES)
        ]
        batches = _Cycle([b.pin_memory() if pin else b for b in made])
    else:
        folder = require(exp.dataroot, "fake_imagenet")
        loader = _eval_loader(folder, image_size, batch_size, workers, device, dtype=dtype)
        batches = _Images(loader)
    cores = max(1, len(current_cpuset()))
    channels_last = use_channels_last(model, precision, device)
    pool = Workers(
        net,
        devices,
        dtype,
        inflight=inflight,
        threads=max(1, cores // len(devices)),
        channels_last=channels_last,
    )
    exp.result["host"]["inference_devices"] = len(devices)
    exp.metrics["channels_last"] = channels_last
    logger = rate_logger(exp)
    # the workers' streams are not the main thread's: time completions on the host clock
    logger.timer = PerfCounterTimer()
    try:
        for step, x in logger.loop(batches):
            pool.submit(x)
            step.set_count(pool.completed())
    finally:
        pool.close()
    for i, n in enumerate(pool.counts):
        exp.metrics[f"items_device{i}"] = n


class _Images:
    """The loader's images without their labels."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        return (x for x, _ in self.loader)
