"""infer: inference throughput of one process over all of its devices (DLBS's multi-process benchmark).

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

One worker thread per device owns a replica of the network (on a GPU with its
own CUDA stream: the input's copy and the inference of one device overlap the
others'); the main thread takes batches from the loader and hands each to the
next device's queue (``--inflight`` batches per device at most). A step of the
rate logger counts the items whose inference *completed* during it (a GPU
worker synchronizes its stream before it reports a batch), so the throughput is
completed items per second of host time over all k devices. On CPU slots a
"device" is a worker thread using its share of the process's cores.

Items are images (or sequences). ``metrics.items_device<i>`` are the items each
device completed. The process's own and effective throughput and its wave's
adjusted total come from the summary (:mod:`milarun.measure.throughput`).

Needs the ``fake_imagenet`` dataset unless ``--synthetic`` or ``--model encoder``.
"""

import queue
import threading

from coleo import Option, default, tooled

from ..bench import data_loader, init_torch, rate_logger
from ..bench.rate import PerfCounterTimer
from ..datasets import require
from ..host.isolation import current_cpuset

#: ``--precision`` values and their torch dtypes (names).
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
#: Pre-decoded batches cycled by ``--synthetic`` (per process).
SYNTHETIC_BATCHES = 8

#: No loss by nature (milarun.measure.validation's NaN check does not apply): inference trains nothing.
NO_LOSS = "inference: nothing is trained"
#: Seconds between two checks of the workers while the main thread waits.
_WAIT_S = 0.5


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
    import torch
    import torchvision

    if name == "encoder":
        return _Encoder(torch, layers, d_model, heads, vocab)
    if name not in torchvision.models.list_models():
        raise ValueError(f"--model {name!r} is neither 'encoder' nor a torchvision model "
                         "(e.g. resnet50)")
    return torchvision.models.get_model(name, weights=None, num_classes=classes)


def _Encoder(torch, layers, d_model, heads, vocab):
    nn = torch.nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0,
                                               batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(d_model, 2)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)).mean(dim=1))

    return Encoder()


class _Cycle:
    """An endless iterable over a list of batches (one epoch = the list)."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def _eval_loader(folder, image_size, batch_size, workers, device):
    """Images of ``fake_imagenet``'s train split, decoded as for evaluation (resize,
    centre crop, normalize) by ``DataLoader`` workers."""
    from torchvision import datasets, transforms

    root = folder / "train"
    if not root.is_dir():
        raise FileNotFoundError(f"no train/ folder in {folder}; rebuild the dataset")
    tf = transforms.Compose([
        transforms.Resize(image_size), transforms.CenterCrop(image_size),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    return data_loader(datasets.ImageFolder(str(root), transform=tf), batch_size, workers,
                       device)


class Workers:
    """One thread per device, each running its own replica of the model.

    Args:
        model: the network (on the CPU, in eval mode); each device gets a copy.
        devices: list of ``torch.device``.
        dtype: the ``torch`` dtype of the weights and inputs.
        inflight: batches queued per device at most.
        threads: intra-op threads per worker (CPU devices).
    """

    def __init__(self, torch, model, devices, dtype, inflight=2, threads=1):
        import copy

        self.torch = torch
        self.devices = devices
        self.done = queue.Queue()
        self.inputs = [queue.Queue(maxsize=max(1, inflight)) for _ in devices]
        self.counts = [0] * len(devices)
        self.errors = []
        self.next = 0
        replicas = [copy.deepcopy(model).to(device=d, dtype=dtype).eval() for d in devices]
        self.threads = [threading.Thread(target=self._run, args=(i, replicas[i], dtype),
                                         daemon=True, name=f"infer-{d}")
                        for i, d in enumerate(devices)]
        if any(d.type == "cpu" for d in devices):
            torch.set_num_threads(max(1, threads))
        for t in self.threads:
            t.start()

    def _run(self, i, model, dtype):
        torch = self.torch
        device = self.devices[i]
        try:
            stream = None
            if device.type == "cuda":
                torch.cuda.set_device(device)
                stream = torch.cuda.Stream(device)
            with torch.inference_mode():
                while True:
                    x = self.inputs[i].get()
                    if x is None:
                        return
                    if stream is not None:
                        with torch.cuda.stream(stream):
                            model(_to(x, device, dtype))
                        stream.synchronize()
                    else:
                        model(_to(x, device, dtype))
                    self.counts[i] += len(x)
                    self.done.put(len(x))
        except BaseException as exc:  # reported to the main thread, which raises it
            self.errors.append(exc)
            self.done.put(0)

    def _check(self):
        if self.errors:
            raise RuntimeError(f"an inference worker failed: {self.errors[0]!r}") \
                from self.errors[0]

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


def own_devices(exp, torch):
    """This process's devices: every GPU it sees (the plan's ``CUDA_VISIBLE_DEVICES``),
    or on the CPU one per device the launcher gave it (CPU slots), at least one."""
    if exp.device.type == "cuda":
        return [torch.device(f"cuda:{i}") for i in range(torch.cuda.device_count())]
    return [torch.device("cpu")] * max(1, len(exp.result.get("devices") or [0]))


@tooled
def infer(exp):
    import torch

    # Network: a torchvision classifier (resnet50, resnet18, ...) or encoder
    model: Option = default("resnet50")
    # Items per batch, per device
    batch_size: Option & int = default(64)
    # Side of the images fed to the network, in pixels
    image_size: Option & int = default(224)
    # Arithmetic of the weights and inputs: fp32, fp16 or bf16
    precision: Option = default("fp32")
    # Pre-decoded random tensors instead of JPEGs decoded by a DataLoader
    synthetic: Option & bool = default(False)
    # DataLoader worker processes (-1: the process's cores minus one)
    workers: Option & int = default(-1)
    # Batches queued per device at most
    inflight: Option & int = default(2)
    # Encoder: tokens per sequence
    seq_len: Option & int = default(128)
    # Encoder: layers, model width, attention heads, vocabulary size
    layers: Option & int = default(12)
    d_model: Option & int = default(768)
    heads: Option & int = default(12)
    vocab: Option & int = default(30522)

    if precision not in DTYPES:
        raise ValueError(f"--precision must be one of {', '.join(DTYPES)}, not {precision!r}")
    device = init_torch(exp)
    dtype = getattr(torch, DTYPES[precision])
    devices = own_devices(exp, torch)
    net = build_model(model, image_size, layers, d_model, heads, vocab)
    if model == "encoder":
        batches = _Cycle([torch.randint(vocab, (batch_size, seq_len))
                          for _ in range(SYNTHETIC_BATCHES)])
    elif synthetic:
        pin = device.type == "cuda"
        made = [torch.randn(batch_size, 3, image_size, image_size) for _ in range(SYNTHETIC_BATCHES)]
        batches = _Cycle([b.pin_memory() if pin else b for b in made])
    else:
        folder = require(exp.dataroot, "fake_imagenet")
        loader = _eval_loader(folder, image_size, batch_size, workers, device)
        batches = _Images(loader)
    cores = max(1, len(current_cpuset()))
    pool = Workers(torch, net, devices, dtype, inflight=inflight,
                   threads=max(1, cores // len(devices)))
    exp.result["host"]["inference_devices"] = len(devices)
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
