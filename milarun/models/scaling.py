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

from coleo import Option, default, tooled

from ..bench import init_torch, iteration_wrapper
from ..bench.device import is_cuda
from ..bench.distributed import agree_on_counts, process_group, wrap_ddp
from ..bench.options import batch_size_option, lr_option, precision_option
from ..bench.step import MixedPrecisionStep, make_optimizer
from ..bench.xpu import DDP_NOT_WIRED, refuse_xpu


def main(exp, argv):
    """Entry point: under torchrun, ``... -m milarun run milarun.models.scaling:main -- ARGS``;
    alone, ``milarun run milarun.models.scaling:main -- ARGS``.

    Items are examples of the global batch (``batch_size × world_size`` per step).
    """
    exp.cli(train, argv)


def _model(torch, width, blocks, classes):
    nn = torch.nn

    class Block(nn.Module):
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
    import torch

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
    # Process-group backend: auto (nccl on CUDA, gloo on CPU), nccl or gloo
    backend: Option = default("auto")
    precision = precision_option(default="fp32")

    device = init_torch(exp)
    refuse_xpu(device, "scaling", DDP_NOT_WIRED)
    with process_group(exp, device, backend) as world:
        exp.metrics["global_batch"] = batch_size * world.size
        _train(exp, torch, world, batch_size, width, blocks, image_size, classes, lr, precision)


def _train(exp, torch, world, batch_size, width, blocks, image_size, classes, lr, precision):

    device = world.device
    mp = MixedPrecisionStep(device, precision)
    autocast = mp.autocast
    net = _model(torch, width, blocks, classes).to(device)
    if is_cuda(device):
        net = net.to(memory_format=torch.channels_last)
    ddp = wrap_ddp(net, device)
    optimizer = make_optimizer("SGD", ddp.parameters(), device, lr=lr, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    # A pool of random batches made on the device, different on each rank.
    gen = torch.Generator(device=device)
    gen.manual_seed(exp.options["seed"] * 1000 + world.rank)
    pool = 4
    fmt = torch.channels_last if is_cuda(device) else torch.contiguous_format
    images = [
        torch.randn(
            (batch_size, 3, image_size, image_size), device=device, generator=gen
        ).contiguous(memory_format=fmt)
        for _ in range(pool)
    ]
    labels = torch.randint(0, classes, (pool, batch_size), device=device, generator=gen)
    ddp.train()
    k = 0
    steps = iteration_wrapper(exp)
    agree_on_counts(exp, world)
    for step in steps:
        x, y = images[k % pool], labels[k % pool]
        k += 1
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = criterion(ddp(x), y)
        mp(loss, optimizer)
        step.set_count(batch_size * world.size)
        step.log(loss=loss.detach())
