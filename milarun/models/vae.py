"""vae: a variational autoencoder on MNIST (the PyTorch example's model).

Images are read from the idx-ubyte files by ``torchvision.datasets.MNIST``,
turned into tensors by ``ToTensor`` in ``DataLoader`` workers, and fed to a
small fully connected VAE (784-400-latent-400-784, Adam, BCE + KL loss).
The model is tiny, so on a GPU this stresses the input pipeline and the CPU
(per-item PIL conversion, collation, host-to-device copies) and kernel-launch
latency rather than compute. Items are images.

Needs the ``mnist`` dataset (``milarun dataset mnist``).
"""

import torch
from coleo import Option, default, tooled
from torch import nn
from torchvision import datasets, transforms

from ..bench import data_loader, dataloop, init_torch
from ..bench.options import batch_size_option, lr_option, workers_option
from ..bench.step import make_optimizer
from ..datasets import require


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.vae:main -- ARGS``."""
    exp.cli(train, argv)


class VAE(nn.Module):
    """The VAE: ``forward(x) -> (reconstruction logits, mu, logvar)``."""

    def __init__(self, latent):
        super().__init__()
        self.enc = nn.Linear(784, 400)
        self.mu = nn.Linear(400, latent)
        self.logvar = nn.Linear(400, latent)
        self.dec1 = nn.Linear(latent, 400)
        self.dec2 = nn.Linear(400, 784)

    def forward(self, x):
        h = torch.relu(self.enc(x.view(-1, 784)))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.dec2(torch.relu(self.dec1(z))), mu, logvar


def vae_loss(logits, x, mu, logvar):
    """Reconstruction (BCE, summed) + KL divergence, averaged over the batch."""
    bce = torch.nn.functional.binary_cross_entropy_with_logits(
        logits, x.view(-1, 784), reduction="sum"
    )
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return (bce + kld) / x.shape[0]


@tooled
def train(exp):
    batch_size = batch_size_option(default=128)
    # Size of the latent code
    latent: Option & int = default(20)
    lr = lr_option(default=1e-3)
    workers = workers_option(default=-1)

    device = init_torch(exp)
    folder = require(exp.dataroot, "mnist")
    dataset = datasets.MNIST(
        root=str(folder), train=True, download=False, transform=transforms.ToTensor()
    )
    loader = data_loader(dataset, batch_size, workers, device)
    model = VAE(latent).to(device)
    optimizer = make_optimizer("Adam", model.parameters(), device, lr=lr)

    for step, (x, _) in dataloop(exp, loader):
        x = x.to(device, non_blocking=True)
        logits, mu, logvar = model(x)
        loss = vae_loss(logits, x, mu, logvar)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step.set_count(len(x))
        step.log(loss=loss)
