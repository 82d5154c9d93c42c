"""io: the input-pipeline study — one training step fed by a DataLoader over an on-disk dataset.

After torch_io_benchmark: how much of training time the input pipeline
explains, and how it changes with the number of DataLoader workers. The same
loop runs in two modes:

* ``--mode traverse``: iterate the DataLoader and copy each batch to the
  device, no model. This is the pure input cost (read, decode, collate, copy).
* ``--mode train``: a small convnet (two convolutions, adaptive pooling, two
  linear layers; any image size) trains on the batches with SGD and
  cross-entropy; the loss is logged.

The ratio of the two throughputs (train / traverse, items/s) says how much of
training the input pipeline could explain: near 1, training runs as fast as
the data comes, so the loader is the bottleneck; well below 1, the model is.
``milarun report`` shows it for a results folder of the ``io`` profile.

Datasets (``--dataset``):

* ``fashion_mnist``: 28x28 greyscale images in FashionMNIST's idx-ubyte files,
  read by ``torchvision.datasets.FashionMNIST`` (the whole file in memory;
  each item becomes a PIL image, then a tensor through ``ToTensor``);
  ``milarun dataset fashion_mnist``.
* ``mydataset``: one ``.npy`` file per sample (float32 [1, H, W]), read by
  :class:`milarun.datasets.mydataset.MyDataset` (an ``open`` and a read per
  item); ``milarun dataset mydataset [--count N]``.

DataLoader settings: ``--workers`` (0: the main process loads; -1: the
student's cpuset size minus one) or ``--workers-pct P`` (P % of ``--cores``,
which defaults to the student's cpuset size; the ``io`` profile passes
``{cpu_per_gpu}``), ``--pin-memory`` (page-locked batches and non-blocking
copies; CUDA only), ``--prefetch-factor`` (batches loaded ahead by each
worker) and ``--persistent-workers`` (keep the workers between epochs). The
values used go into the record's ``metrics`` (``workers``, ``cores``,
``pin_memory``, ``prefetch_factor``, ``persistent_workers``). Batches are
shuffled and the last partial batch is dropped. Items are samples (images).
"""

import torch
from coleo import Option, default, tooled
from torch import nn
from torchvision import datasets, transforms

from ..bench import dataloop, init_torch
from ..bench import device as bench_device
from ..bench.options import batch_size_option, lr_option, workers_option
from ..bench.setup import dataloader_workers
from ..bench.step import make_optimizer
from ..datasets import require
from ..datasets.mydataset import MyDataset
from ..host.isolation import current_cpuset

MODES = ("traverse", "train")
DATASETS = ("fashion_mnist", "mydataset")


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.io:main -- ARGS``."""
    exp.cli(train, argv)


def build_model(channels=1, classes=10):
    """The small convnet of ``--mode train``: images ``[B, channels, H, W]`` → logits
    ``[B, classes]``; any image size (adaptive pooling)."""
    return nn.Sequential(
        nn.Conv2d(channels, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(64 * 16, 128),
        nn.ReLU(),
        nn.Linear(128, classes),
    )


def open_dataset(dataroot, name):
    """The map-style dataset ``name`` (see the module docstring); items are
    ``(float32 [1, H, W], label)``.

    Raises:
        ValueError: an unknown name.
        FileNotFoundError: the dataset was not built (with the command that builds it).
    """
    if name == "fashion_mnist":
        folder = require(dataroot, "fashion_mnist")
        return datasets.FashionMNIST(
            str(folder), train=True, download=False, transform=transforms.ToTensor()
        )
    if name == "mydataset":
        return MyDataset(require(dataroot, "mydataset"))
    raise ValueError(f"--dataset must be one of {', '.join(DATASETS)}, not {name!r}")


def resolve_workers(workers, workers_pct, cores):
    """DataLoader workers from ``--workers``, or ``--workers-pct`` of ``cores``.

    ``workers_pct`` (percent, None when not given) wins: 0 gives 0 workers,
    anything else at least 1 (``round(pct / 100 × cores)``). ``workers`` < 0
    means the student's cpuset size minus one.

    Raises:
        ValueError: ``workers_pct`` < 0 or ``cores`` < 1.
    """
    if workers_pct is None:
        return dataloader_workers(workers)
    if workers_pct < 0:
        raise ValueError(f"--workers-pct must be >= 0, not {workers_pct}")
    if cores < 1:
        raise ValueError(f"--cores must be >= 1, not {cores}")
    if workers_pct == 0:
        return 0
    return max(1, round(workers_pct / 100.0 * cores))


@tooled
def train(exp):
    # traverse (iterate and copy batches to the device, no model) or train (a small convnet learns)
    mode: Option = default("train")
    # fashion_mnist (idx files, torchvision) or mydataset (one .npy file per sample)
    dataset: Option = default("fashion_mnist")
    batch_size = batch_size_option(default=64)
    workers = workers_option(default=0)
    # Workers as a percentage of --cores (overrides --workers; 0 means no worker)
    workers_pct: Option & float = default(None)
    # Cores the --workers-pct values scale with (default: the student's cpuset size)
    cores: Option & int = default(None)
    # Collate batches into page-locked memory and copy them without blocking (CUDA only)
    pin_memory: Option & bool = default(False)
    # Batches each worker loads ahead (workers > 0 only)
    prefetch_factor: Option & int = default(2)
    # Keep the worker processes alive from one epoch to the next (workers > 0 only)
    persistent_workers: Option & bool = default(False)
    lr = lr_option(default=0.01)

    if mode not in MODES:
        raise ValueError(f"--mode must be one of {', '.join(MODES)}, not {mode!r}")
    if prefetch_factor < 1:
        raise ValueError(f"--prefetch-factor must be >= 1, not {prefetch_factor}")
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, not {batch_size}")
    cores = len(current_cpuset()) if cores is None else cores
    nworkers = resolve_workers(workers, workers_pct, cores)
    device = init_torch(exp)
    data = open_dataset(exp.dataroot, dataset)
    if len(data) < batch_size:
        raise ValueError(
            f"the {dataset} dataset holds {len(data)} samples, fewer than one "
            f"batch of {batch_size}; build a larger one or lower --batch-size"
        )
    pin = pin_memory and bench_device.is_cuda(device)
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=nworkers,
        pin_memory=pin,
        prefetch_factor=prefetch_factor if nworkers > 0 else None,
        persistent_workers=persistent_workers and nworkers > 0,
    )
    exp.metrics.update(
        {
            "workers": nworkers,
            "cores": cores,
            "pin_memory": pin,
            "prefetch_factor": prefetch_factor if nworkers > 0 else None,
            "persistent_workers": persistent_workers and nworkers > 0,
        }
    )

    if mode == "traverse":
        for step, (x, y) in dataloop(exp, loader):
            x = x.to(device, non_blocking=pin)
            y = y.to(device, non_blocking=pin)
            step.set_count(len(x))
        return

    sample, _ = data[0]
    model = build_model(channels=sample.shape[0]).to(device)
    model.train()
    optimizer = make_optimizer("SGD", model.parameters(), device, lr=lr, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    for step, (x, y) in dataloop(exp, loader):
        x = x.to(device, non_blocking=pin)
        y = y.to(device, non_blocking=pin)
        loss = criterion(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step.set_count(len(x))
        step.log(loss=loss.detach())
