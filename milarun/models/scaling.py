"""scaling: data-parallel training (DDP) across 1..N devices (a gpu-progression).

A ResNet-style convolutional network (``--width``, ``--blocks`` per stage,
four stages; ``--width 64 --blocks 2`` is ResNet-18's shape, 11.7M
parameters) trains on random images and labels generated on each device,
wrapped in ``DistributedDataParallel``: every step all-reduces the gradients
across ranks, so the throughput as the device count grows measures the
interconnect and the collective library as much as the devices.

Launched by ``milarun jobs`` through ``python -m torch.distributed.run
--standalone --nproc-per-node K -m milarun run milarun.models.scaling:main``:
each rank is one ``milarun run`` process with ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` from torchrun. Backend
``nccl`` on CUDA (device ``cuda:LOCAL_RANK``) and ``gloo`` on the CPU, unless
``--backend`` says otherwise. Without torchrun it runs as a world of one
(a local process group on a free port), so the code path is the same.

Only rank 0 writes the result (``Experiment.write`` skips other ranks).
``world_size``, ``backend`` and ``global_batch`` are recorded in the
result's ``metrics``; under torchrun, ``distributed`` holds the world, the
rendezvous and every node's host facts (see ``milarun.bench.distributed``).

Stresses: compute (convolutions), gradient all-reduce bandwidth and latency
between devices. An **item is one example of the global batch**: each step
counts ``batch_size × world_size``, so rank 0's throughput is the whole job's.
"""

import torch
from coleo import Option, default, tooled
from torch import nn

from ..bench import init_torch, iteration_wrapper
from ..bench.device import is_cuda
from ..bench.distributed import agree_on_counts, process_group, wrap_ddp
from ..bench.options import backend_option, batch_size_option, lr_option, precision_option
from ..bench.step import MixedPrecisionStep, make_optimizer
from ..bench.xpu import DDP_NOT_WIRED, refuse_xpu

#: Random batches made on each rank, used in turn.
POOL = 4


def main(exp, argv):
    """Entry point: under torchrun, ``... -m milarun run milarun.models.scaling:main -- ARGS``;
    alone, ``milarun run milarun.models.scaling:main -- ARGS``.

    Items are examples of the global batch (``batch_size × world_size`` per step).
    """
    exp.cli(train, argv)


class Block(nn.Module):
    """ResNet's basic block: two 3×3 convolutions and the skip connection (a 1×1
    convolution where the stride or the width changes)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = None
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return torch.relu(y + (x if self.skip is None else self.skip(x)))


def build_model(width, blocks, classes):
    """The ResNet-style network: a stem, four stages of ``blocks`` blocks (``width``
    channels doubled at each stage, halved resolution from the second), pooling and a
    linear classifier."""
    layers = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
    cin = width
    for stage in range(4):
        cout = width * 2**stage
        for b in range(blocks):
            layers.append(Block(cin, cout, 2 if (b == 0 and stage > 0) else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


@tooled
def train(exp):
    batch_size = batch_size_option(default=128)  # per rank
    # Channels of the first stage (doubled at each of the four stages)
    width: Option & int = default(64)
    # Residual blocks per stage
    blocks: Option & int = default(2)
    # Side of the square random images
    image_size: Option & int = default(64)
    # Number of classes
    classes: Option & int = default(1000)
    lr = lr_option(default=0.05)
    backend = backend_option()
    precision = precision_option(default="fp32")

    device = init_torch(exp)
    refuse_xpu(device, "scaling", DDP_NOT_WIRED)
    with process_group(exp, device, backend) as world:
        exp.metrics["global_batch"] = batch_size * world.size
        device = world.device
        mp = MixedPrecisionStep(device, precision)
        net = build_model(width, blocks, classes).to(device)
        if is_cuda(device):
            net = net.to(memory_format=torch.channels_last)
        ddp = wrap_ddp(net, device)
        optimizer = make_optimizer("SGD", ddp.parameters(), device, lr=lr, momentum=0.9)
        # A pool of random batches made on the device, different on each rank.
        gen = torch.Generator(device=device)
        gen.manual_seed(exp.options["seed"] * 1000 + world.rank)
        fmt = torch.channels_last if is_cuda(device) else torch.contiguous_format
        images = [
            torch.randn(
                (batch_size, 3, image_size, image_size), device=device, generator=gen
            ).contiguous(memory_format=fmt)
            for _ in range(POOL)
        ]
        labels = torch.randint(0, classes, (POOL, batch_size), device=device, generator=gen)
        _fit(exp, world, ddp, optimizer, mp, list(zip(images, labels)))


def _fit(exp, world, model, optimizer, mp, batches):
    """Train ``model`` on ``batches`` ((images, labels) pairs, in turn) until the rate
    logger stops. Outside the tooled :func:`train`, whose every assignment coleo
    instruments: the steps run as plain Python."""
    criterion = nn.CrossEntropyLoss()
    model.train()
    steps = iteration_wrapper(exp)
    agree_on_counts(exp, world)
    for k, step in enumerate(steps):
        x, y = batches[k % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        with mp.autocast:
            loss = criterion(model(x), y)
        mp(loss, optimizer)
        step.set_count(len(x) * world.size)
        step.log(loss=loss.detach())
