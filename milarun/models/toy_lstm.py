"""toy_lstm: an LSTM that predicts the next value of noisy sine waves.

Every step draws a batch of sine waves (random frequency, phase and
amplitude, plus a little noise) directly on the device, so there is no input
pipeline. A stacked ``torch.nn.LSTM`` (cuDNN on GPU) reads each sequence and a
linear head predicts the next value at every time step (MSE loss, Adam).
Stresses the sequential recurrent kernels: many small dependent matmuls, so
kernel-launch latency and the CPU that feeds the GPU matter more than peak
FLOPs. Items are sequences.
"""

import math

import torch
from coleo import Option, default, tooled

from ..bench import init_torch, iteration_wrapper
from ..bench.options import batch_size_option, lr_option
from ..bench.step import make_optimizer


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.toy_lstm:main -- ARGS``."""
    exp.cli(train, argv)


def sine_batch(batch_size, seq_len, device, generator=None):
    """A [batch_size, seq_len + 1, 1] float tensor of noisy sine waves on ``device``."""
    shape = (batch_size, 1)
    freq = torch.rand(shape, device=device, generator=generator) * 0.25 + 0.05  # rad/step
    phase = torch.rand(shape, device=device, generator=generator) * (2 * math.pi)
    amp = torch.rand(shape, device=device, generator=generator) * 0.5 + 0.5
    t = torch.arange(seq_len + 1, device=device, dtype=torch.float32)[None, :]
    waves = amp * torch.sin(freq * t + phase)
    waves = waves + 0.01 * torch.randn(waves.shape, device=device, generator=generator)
    return waves.unsqueeze(-1)


class SineLSTM(torch.nn.Module):
    """LSTM over a 1-d signal with a linear head at every step."""

    def __init__(self, hidden_size, layers):
        super().__init__()
        self.lstm = torch.nn.LSTM(1, hidden_size, num_layers=layers, batch_first=True)
        self.head = torch.nn.Linear(hidden_size, 1)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out)


@tooled
def train(exp):
    batch_size = batch_size_option(default=256)
    # Time steps per sequence
    seq_len: Option & int = default(128)
    # LSTM hidden units per layer
    hidden_size: Option & int = default(256)
    # Stacked LSTM layers
    layers: Option & int = default(2)
    lr = lr_option(default=1e-3)

    device = init_torch(exp)

    model = SineLSTM(hidden_size, layers).to(device)
    optimizer = make_optimizer("Adam", model.parameters(), device, lr=lr)
    loss_fn = torch.nn.MSELoss()

    for step in iteration_wrapper(exp):
        waves = sine_batch(batch_size, seq_len, device)
        inputs, targets = waves[:, :-1], waves[:, 1:]
        loss = loss_fn(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step.set_count(batch_size)
        step.log(loss=loss)
