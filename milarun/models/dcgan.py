"""dcgan: a deep convolutional GAN (Radford et al., 2015) on 64×64 images.

The generator maps a ``--nz``-dimensional noise vector to a 64×64 RGB image
with four strided transposed convolutions (batch norm, ReLU, tanh output);
the discriminator mirrors it with strided convolutions (batch norm, leaky
ReLU). Each step trains the discriminator on a real and a generated batch,
then the generator, with Adam.

An item is one real image: a fake_imagenet JPEG read by
``torchvision.datasets.ImageFolder`` (PIL), resized and centre-cropped to
64×64. The convolutions are small, so at large batch sizes this stresses
cuDNN convolution / batch-norm kernels and memory bandwidth, and with few
loader workers the JPEG decoding on the CPU.

Data: ``<dataroot>/fake_imagenet/train/<class>/*.jpg``
(``milarun dataset fake_imagenet``).
"""

import torch
import torch.nn as nn
import torchvision.transforms as T
from coleo import Option, default, tooled
from torchvision.datasets import ImageFolder

from ..bench import data_loader, dataloop, init_torch
from ..bench.options import batch_size_option, lr_option, precision_option, workers_option
from ..bench.step import MixedPrecisionStep, make_optimizer
from ..datasets import require

IMAGE_SIZE = 64


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.dcgan:main -- ARGS``.

    Trains the generator and discriminator on fake_imagenet until
    ``--max-count`` real images were processed.
    """
    exp.cli(train, argv)


def generator(nz, ngf, nc=3):
    """The DCGAN generator: ``(N, nz, 1, 1)`` noise → ``(N, nc, 64, 64)`` in [-1, 1]."""

    def up(cin, cout):
        return [
            nn.ConvTranspose2d(cin, cout, 4, 2, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(True),
        ]

    return nn.Sequential(
        nn.ConvTranspose2d(nz, ngf * 8, 4, 1, 0, bias=False),
        nn.BatchNorm2d(ngf * 8),
        nn.ReLU(True),  # 4×4
        *up(ngf * 8, ngf * 4),  # 8×8
        *up(ngf * 4, ngf * 2),  # 16×16
        *up(ngf * 2, ngf),  # 32×32
        nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),  # 64×64
        nn.Tanh(),
    )


def discriminator(ndf, nc=3):
    """The DCGAN discriminator: ``(N, nc, 64, 64)`` → ``(N,)`` logits."""

    def down(cin, cout):
        return [
            nn.Conv2d(cin, cout, 4, 2, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.LeakyReLU(0.2, inplace=True),
        ]

    return nn.Sequential(
        nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
        nn.LeakyReLU(0.2, inplace=True),  # 32
        *down(ndf, ndf * 2),  # 16
        *down(ndf * 2, ndf * 4),  # 8
        *down(ndf * 4, ndf * 8),  # 4
        nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False),  # 1×1
        nn.Flatten(0),
    )


def _init_weights(module):
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
        nn.init.normal_(module.weight, 0.0, 0.02)
    elif isinstance(module, nn.BatchNorm2d):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


@tooled
def train(exp):
    batch_size = batch_size_option(default=64)
    # Size of the latent noise vector
    nz: Option & int = default(100)
    # Feature maps of the generator's last layer
    ngf: Option & int = default(64)
    # Feature maps of the discriminator's first layer
    ndf: Option & int = default(64)
    lr = lr_option(default=0.0002)
    # Adam beta1
    beta1: Option & float = default(0.5)
    workers = workers_option(default=-1)
    precision = precision_option(default="fp32")

    device = init_torch(exp)
    mp = MixedPrecisionStep(device, precision)
    autocast = mp.autocast

    root = require(exp.dataroot, "fake_imagenet") / "train"
    transform = T.Compose(
        [
            T.Resize(IMAGE_SIZE),
            T.CenterCrop(IMAGE_SIZE),
            T.ToTensor(),
            T.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
        ]
    )
    dataset = ImageFolder(str(root), transform=transform)
    loader = data_loader(dataset, batch_size, workers, device)

    net_g = generator(nz, ngf).to(device)
    net_d = discriminator(ndf).to(device)
    net_g.apply(_init_weights)
    net_d.apply(_init_weights)
    opt_g = make_optimizer("Adam", net_g.parameters(), device, lr=lr, betas=(beta1, 0.999))
    opt_d = make_optimizer("Adam", net_d.parameters(), device, lr=lr, betas=(beta1, 0.999))
    criterion = torch.nn.BCEWithLogitsLoss()
    ones = torch.ones(batch_size, device=device)
    zeros = torch.zeros(batch_size, device=device)

    for step, (real, _) in dataloop(exp, loader):
        real = real.to(device, non_blocking=True)
        n = real.shape[0]
        noise = torch.randn(n, nz, 1, 1, device=device)

        # Discriminator: real batch → 1, generated batch → 0.
        with autocast:
            fake = net_g(noise)
            loss_d = criterion(net_d(real).float(), ones[:n]) + criterion(
                net_d(fake.detach()).float(), zeros[:n]
            )
        opt_d.zero_grad(set_to_none=True)
        mp.backward(loss_d)
        mp.step(opt_d)

        # Generator: make the discriminator answer 1 on generated images.
        with autocast:
            loss_g = criterion(net_d(fake).float(), ones[:n])
        opt_g.zero_grad(set_to_none=True)
        mp(loss_g, opt_g)

        step.set_count(n)
        step.log(loss=loss_g.detach(), loss_d=loss_d.detach())
