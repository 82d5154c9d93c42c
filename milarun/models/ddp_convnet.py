"""ddp_convnet: a torchvision ResNet trained data-parallel (DDP) over a whole node, or several.

The ``njobs`` plan type starts one torchrun per node over all of that node's
devices (CPU slots on a CPU host, with gloo); ``multi-node`` and
``node-progression`` start one per node of a rendezvous. Each rank reads its
share of the ``fake_imagenet`` JPEG tree (``ImageFolder`` +
``RandomResizedCrop``/flip/normalize in ``DataLoader`` workers, a
``DistributedSampler`` reshuffled every epoch), trains the network
(``--arch``, ``resnet50`` by default, random weights) with SGD + momentum
and cross-entropy at ``--precision`` fp32, tf32, fp16 or bf16, and
all-reduces the gradients every step (``DistributedDataParallel``: nccl on
CUDA, gloo on the CPU). Without torchrun it runs as a world of one.

Stresses: GPU compute (convolutions), the gradient all-reduce over NVLink /
PCIe inside a node and over the network between nodes, and the CPU's JPEG
decoding for every device at once. An **item is one image of the global
batch**: each step counts ``batch_size × world_size``, so rank 0's
throughput (the only record, written by rank 0) is the whole job's, in
images/s. ``world_size``, ``backend`` and ``global_batch`` are recorded in
``metrics``; ``distributed`` holds the world, the rendezvous and every
node's host facts.

Needs the ``fake_imagenet`` dataset (``milarun dataset fake_imagenet``).
"""

import torch
from coleo import Option, default, tooled

from ..bench import Epochs, dataloop, init_torch
from ..bench.distributed import agree_on_counts, process_group, wrap_ddp
from ..bench.options import (
    backend_option,
    batch_size_option,
    lr_option,
    precision_option,
    workers_option,
)
from ..bench.step import MixedPrecisionStep, make_optimizer
from ..bench.xpu import DDP_NOT_WIRED, refuse_xpu
from ..datasets import require
from .convnet import build_model
from .loader import image_folder, image_rank_loader


def main(exp, argv):
    """Entry point: under torchrun, ``... -m milarun run milarun.models.ddp_convnet:main
    -- ARGS``; alone, ``milarun run milarun.models.ddp_convnet:main -- ARGS``.

    Items are images of the global batch (``batch_size × world_size`` per step).
    """
    exp.cli(train, argv)


@tooled
def train(exp):
    # torchvision model name (resnet50, resnet18, resnet152, ...)
    arch: Option = default("resnet50")
    batch_size = batch_size_option(default=128)  # per rank
    # Side of the random crops fed to the network, in pixels
    image_size: Option & int = default(224)
    precision = precision_option(default="fp32")
    lr = lr_option(default=0.1)
    # Use the channels-last memory format for the model and the batches
    channels_last: Option & bool = default(False)
    workers = workers_option(default=-1)
    backend = backend_option()

    device = init_torch(exp)
    refuse_xpu(device, "ddp_convnet", DDP_NOT_WIRED)
    folder = require(exp.dataroot, "fake_imagenet")
    with process_group(exp, device, backend) as world:
        exp.metrics["global_batch"] = batch_size * world.size
        device = world.device
        mp = MixedPrecisionStep(device, precision)
        dataset = image_folder(folder, "train", image_size)
        loader = image_rank_loader(exp, dataset, batch_size, workers, world)
        memory_format = torch.channels_last if channels_last else torch.contiguous_format
        model = build_model(arch, len(dataset.classes)).to(device, memory_format=memory_format)
        ddp = wrap_ddp(model, device)
        ddp.train()
        optimizer = make_optimizer(
            "SGD", ddp.parameters(), device, lr=lr, momentum=0.9, weight_decay=1e-4
        )
        criterion = torch.nn.CrossEntropyLoss()

        # Every rank has the same number of batches per epoch (rank_loader), so all
        # ranks stop on the same step.
        steps = dataloop(exp, Epochs(loader))
        agree_on_counts(exp, world)
        for step, (x, y) in steps:
            x = x.to(device, non_blocking=True, memory_format=memory_format)
            y = y.to(device, non_blocking=True)
            with mp.autocast:
                loss = criterion(ddp(x), y)
            optimizer.zero_grad(set_to_none=True)
            mp(loss, optimizer)
            step.set_count(len(x) * world.size)
            step.log(loss=loss.detach())
