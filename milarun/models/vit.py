"""vit: vision-transformer classification training (``timm``'s ViT-B/16 and ViT-L/16).

The network is ``timm.create_model(--arch, pretrained=False, img_size=--image-size,
num_classes=<the data set's classes>)``, randomly initialised (nothing is
downloaded): ``vit_base_patch16_224`` (ViT-B/16, 86M parameters, the
default), ``vit_large_patch16_224`` (ViT-L/16, 304M) or, for CPU tests,
``vit_tiny_patch16_224`` (5.7M) at a small ``--image-size``. Images come
through the same pipeline as ``convnet`` (``ImageFolder`` +
``RandomResizedCrop``/flip/normalize in ``DataLoader`` workers, pinned
non-blocking copies); training is cross-entropy with AdamW (fused on CUDA and
XPU, weight decay 0.05, DeiT's recipe without its augmentations), gradients
clipped to norm 1, at ``--precision bf16`` (autocast) by default.
``--compile`` compiles the model with ``torch.compile`` (the first steps pay
for it: they fall in the warm-up windows on a GPU profile).

Parallelism: one process per GPU (``per-gpu``), or data-parallel with DDP
under torchrun (``njobs``: every GPU of a node): each rank reads its share of
the images (``DistributedSampler``) and the gradients are all-reduced every
step. An **item is one image** of the global batch (``batch_size ×
world_size`` per step). Stresses: tensor-core matmuls (attention and MLP at
197 tokens for 224 px), attention memory bandwidth, and, for ViT-B on a fast
GPU, JPEG decoding on the student's CPUs.

Needs the ``fake_imagenet`` dataset (``milarun dataset fake_imagenet``).
"""

import os

import timm
import torch
from coleo import Option, default, tooled
from torch import nn

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
from .loader import image_folder, image_rank_loader

#: ``--arch``: the ViTs this test trains (timm names).
ARCHS = ("vit_base_patch16_224", "vit_large_patch16_224", "vit_tiny_patch16_224")


#: Its loss must fall (milarun.bench.experiment.loss_declaration).
LOSS_MUST_FALL = "fake_imagenet's stripes depend on the class, so the classifier learns them"


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.vit:main -d DATAROOT -- ARGS``, or under
    torchrun for DDP. Needs dataset ``fake_imagenet``. Items are images (of the global
    batch)."""
    exp.cli(train, argv)


def check_options(arch, image_size):
    """Raise ``ValueError`` (one line) for an unknown arch or an image size that is not a
    positive multiple of the 16-pixel patch."""
    if arch not in ARCHS:
        raise ValueError(f"--arch must be one of {', '.join(ARCHS)}, not {arch!r}")
    if image_size < 16 or image_size % 16:
        raise ValueError(
            f"--image-size must be a positive multiple of 16 (the patch), not {image_size}"
        )


def build_model(arch, image_size, num_classes):
    """The timm ViT ``arch`` with random weights, for ``image_size`` inputs."""
    return timm.create_model(arch, pretrained=False, img_size=image_size, num_classes=num_classes)


@tooled
def train(exp):
    # timm ViT: vit_base_patch16_224 (ViT-B/16), vit_large_patch16_224 (ViT-L/16),
    # vit_tiny_patch16_224 (CPU tests)
    arch: Option = default("vit_base_patch16_224")
    batch_size = batch_size_option(default=128)  # per rank
    # Side of the random crops fed to the network, in pixels (a multiple of 16)
    image_size: Option & int = default(224)
    precision = precision_option(default="bf16")
    lr = lr_option(default=5e-4)
    # Compile the model with torch.compile
    compile: Option & bool = default(False)
    workers = workers_option(default=-1)
    backend = backend_option()

    check_options(arch, image_size)
    device = init_torch(exp)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # one XPU per process only
        refuse_xpu(device, "vit under torchrun", DDP_NOT_WIRED)
    folder = require(exp.dataroot, "fake_imagenet")
    with process_group(exp, device, backend) as world:
        device = world.device
        mp = MixedPrecisionStep(device, precision)
        dataset = image_folder(folder, "train", image_size)
        loader = image_rank_loader(exp, dataset, batch_size, workers, world)
        model = build_model(arch, image_size, len(dataset.classes)).to(device)
        exp.metrics.update(
            {
                "arch": arch,
                "params": sum(p.numel() for p in model.parameters()),
                "image_size": image_size,
                "global_batch": batch_size * world.size,
                "world_size": world.size,
                "compiled": compile,
                "parallelism": "ddp" if world.size > 1 else "none",
            }
        )
        net = model
        if world.size > 1:
            net = wrap_ddp(model, device)
        if compile:
            net = torch.compile(net)
        optimizer = make_optimizer(
            "AdamW", model.parameters(), device, lr=lr, betas=(0.9, 0.999), weight_decay=0.05
        )
        _fit(exp, world, net, optimizer, mp, loader)


def _fit(exp, world, net, optimizer, mp, loader):
    """Train ``net`` (the model, or its DDP or compiled wrapper: the same parameters) on
    ``loader``'s batches until the rate logger stops. Outside the tooled :func:`train`,
    whose every assignment coleo instruments: the steps run as plain Python."""
    device = world.device
    criterion = nn.CrossEntropyLoss()
    net.train()
    steps = dataloop(exp, Epochs(loader))
    agree_on_counts(exp, world)
    for step, (x, y) in steps:
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        with mp.autocast:
            loss = criterion(net(x), y)
        mp.backward(loss)
        mp.step(optimizer, clip_norm=1.0, params=net.parameters())
        mp.update()
        optimizer.zero_grad(set_to_none=True)
        step.set_count(len(x) * world.size)
        step.log(loss=loss.detach())
