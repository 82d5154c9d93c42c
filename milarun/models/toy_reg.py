"""toy_reg: polynomial regression on synthetic batches (a set-up check).

Fits ``y = Σ w_k x^k`` (degree ``--poly-degree``) with a linear layer on
polynomial features of random inputs generated on the device. Stresses
kernel-launch overhead and small matmuls; items are examples.
"""

import torch
from coleo import Option, default, tooled

from ..bench import init_torch, iteration_wrapper
from ..bench.options import batch_size_option, lr_option
from ..bench.step import make_optimizer


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.toy_reg:main -- ARGS``."""
    exp.cli(train, argv)


@tooled
def train(exp):
    # Degree of the polynomial to fit
    poly_degree: Option & int = default(4)
    batch_size = batch_size_option(default=64)
    lr = lr_option(default=0.1)

    device = init_torch(exp)
    w_target = torch.randn(poly_degree, 1, device=device) * 5
    b_target = torch.randn(1, device=device) * 5
    model = torch.nn.Linear(poly_degree, 1).to(device)
    optimizer = make_optimizer("SGD", model.parameters(), device, lr=lr)
    powers = torch.arange(1, poly_degree + 1, device=device)

    for step in iteration_wrapper(exp):
        x = torch.randn(batch_size, 1, device=device)
        feats = x**powers
        y = feats @ w_target + b_target
        loss = torch.nn.functional.smooth_l1_loss(model(feats), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step.set_count(batch_size)
        step.log(loss=loss)
