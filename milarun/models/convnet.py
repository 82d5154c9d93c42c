"""convnet: a torchvision ResNet (or any torchvision classifier) trained on fake_imagenet.

Images come through the same pipeline as the ``loader`` workload
(``ImageFolder`` + ``RandomResizedCrop``/flip/normalize in ``DataLoader``
workers); the network (``--arch``, ``resnet18`` by default, random weights)
is trained with SGD + momentum and cross-entropy, at ``--precision`` fp32,
tf32, fp16 (autocast + grad scaler) or bf16 (autocast). Stresses GPU compute
(convolutions) and, with small networks or fast GPUs, the CPU's ability to
decode and augment enough images. ``convnet_fp16`` in the profiles is this
module with ``--precision fp16``. Items are images.

Needs the ``fake_imagenet`` dataset (``milarun dataset fake_imagenet``).
"""

import torch
import torchvision
from coleo import Option, default, tooled

from ..bench import dataloop, init_torch
from ..bench.options import batch_size_option, lr_option, precision_option, workers_option
from ..bench.step import MixedPrecisionStep, make_optimizer
from ..datasets import require
from .loader import image_loader


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.convnet:main -- ARGS``."""
    exp.cli(train, argv)


def build_model(arch, num_classes):
    """``torchvision.models.get_model(arch)`` with random weights.

    Raises:
        ValueError: ``arch`` is not a torchvision model name.
    """
    names = torchvision.models.list_models()
    if arch not in names:
        raise ValueError(
            f"--arch {arch!r} is not a torchvision model; "
            f"e.g. resnet18, resnet50, resnet152, vgg16, efficientnet_b0"
        )
    return torchvision.models.get_model(arch, weights=None, num_classes=num_classes)


@tooled
def train(exp):
    # torchvision model name (resnet18, resnet50, resnet152, vgg16, ...)
    arch: Option = default("resnet18")
    batch_size = batch_size_option(default=256)
    # Side of the random crops fed to the network, in pixels
    image_size: Option & int = default(224)
    precision = precision_option(default="fp32")
    lr = lr_option(default=0.1)
    # Use the channels-last memory format for the model and the batches
    channels_last: Option & bool = default(False)
    workers = workers_option(default=-1)

    device = init_torch(exp)
    mp = MixedPrecisionStep(device, precision)
    autocast = mp.autocast
    folder = require(exp.dataroot, "fake_imagenet")
    loader, dataset = image_loader(folder, "train", image_size, batch_size, workers, device)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    model = build_model(arch, len(dataset.classes)).to(device, memory_format=memory_format)
    model.train()
    optimizer = make_optimizer(
        "SGD", model.parameters(), device, lr=lr, momentum=0.9, weight_decay=1e-4
    )
    criterion = torch.nn.CrossEntropyLoss()

    for step, (x, y) in dataloop(exp, loader):
        x = x.to(device, non_blocking=True, memory_format=memory_format)
        y = y.to(device, non_blocking=True)
        with autocast:
            loss = criterion(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        mp(loss, optimizer)
        step.set_count(len(x))
        step.log(loss=loss)
