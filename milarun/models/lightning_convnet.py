"""lightning_convnet: ddp_convnet's training written with PyTorch Lightning (Trainer, DDP strategy).

The same work as :mod:`.ddp_convnet` (a torchvision ResNet, ``resnet50`` by
default with random weights, trained data-parallel on the ``fake_imagenet``
JPEG tree with SGD + momentum and cross-entropy), but the loop is
Lightning's: a ``LightningModule`` holds the model and the optimizer, and
``lightning.Trainer`` with the ``DDPStrategy`` runs it (nccl on CUDA, gloo on
the CPU; Lightning puts a ``DistributedSampler`` under the loader). This
measures what a Lightning user gets on the machine, next to the plain DDP
loop. torch_io_benchmark ran its single- and multi-node experiments this way.

Launching: like ddp_convnet, under torchrun (the ``njobs`` plan type: one
torchrun per node; ``multi-node``/``node-progression``: a rendezvous over
nodes, under Slurm or ssh). Lightning is told it runs under torchrun
(``TorchElasticEnvironment``), so it neither spawns processes nor reads
Slurm's variables (under ``srun``, those describe the torchrun agents, not
the ranks). Without torchrun it is a world of one. The process group is the
harness's (:func:`milarun.bench.distributed.process_group`; Lightning uses the
group it finds), so the test ends as every distributed test does.

Measurement: a Lightning callback feeds milarun's rate logger, one step per
``on_train_batch_end`` (so windows, warm-up, ``--min-steady``,
``--profile-trace`` and the journal work as for every test) and stops the
Trainer (``trainer.should_stop``) at ``--max-count``. An **item is one image
of the global batch** (``batch_size × world_size`` per step); rank 0 writes
the record. Lightning's version is in ``host.lightning``; ``world_size``,
``backend``, ``rank`` and ``global_batch`` are in ``metrics``.

Needs the ``lightning`` package (in requirements.lock) and the
``fake_imagenet`` dataset (``milarun dataset fake_imagenet``).
"""

import os

import lightning
import torch
from coleo import Option, default, tooled
from lightning.pytorch.plugins.environments import LightningEnvironment, TorchElasticEnvironment
from lightning.pytorch.strategies import DDPStrategy

from ..bench import dataloader_workers, init_torch, need_a_batch, rate_logger, set_precision
from ..bench import device as bench_device
from ..bench.distributed import World, agree_on_counts, process_group
from ..bench.options import (
    backend_option,
    batch_size_option,
    lr_option,
    precision_option,
    workers_option,
)
from ..bench.rate import Step
from ..bench.step import make_optimizer
from ..bench.xpu import LIGHTNING_NOT_WIRED, refuse_xpu
from ..datasets import require
from .convnet import build_model
from .loader import image_loader

#: ``--precision`` → Lightning's ``precision`` argument (tf32 is fp32 with TF32 matmuls).
PRECISION = {"fp32": "32-true", "tf32": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}


def main(exp, argv):
    """Entry point: under torchrun, ``... -m milarun run milarun.models.lightning_convnet:main
    -- ARGS``; alone, ``milarun run milarun.models.lightning_convnet:main -- ARGS``."""
    exp.cli(train, argv)


def cluster_environment(environ=None):
    """``TorchElasticEnvironment`` under torchrun (``TORCHELASTIC_RUN_ID`` or
    ``LOCAL_WORLD_SIZE`` set), else ``LightningEnvironment`` (a world of one)."""
    environ = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in environ or "LOCAL_WORLD_SIZE" in environ:
        return TorchElasticEnvironment()
    return LightningEnvironment()


@tooled
def train(exp):
    # torchvision model name (resnet50, resnet18, resnet152, ...)
    arch: Option = default("resnet50")
    batch_size = batch_size_option(default=128)  # per rank
    # Side of the random crops fed to the network, in pixels
    image_size: Option & int = default(224)
    precision = precision_option(default="fp32")  # Lightning's name: PRECISION[precision]
    lr = lr_option(default=0.1)
    workers = workers_option(default=-1)
    backend = backend_option()

    device = init_torch(exp)
    refuse_xpu(device, "lightning_convnet", LIGHTNING_NOT_WIRED)
    exp.result["host"]["lightning"] = lightning.__version__
    set_precision(device, "tf32" if precision == "tf32" else "fp32")
    folder = require(exp.dataroot, "fake_imagenet")
    torchrun_world = World.from_environment()
    size, local_size = torchrun_world.size, torchrun_world.local_size
    workers = dataloader_workers(workers, local_size)
    loader, dataset = image_loader(folder, "train", image_size, batch_size, workers, device)
    need_a_batch(
        len(dataset) >= batch_size * size,
        len(dataset),
        "images",
        batch_size,
        size,
        "lower --batch-size or use a larger fake_imagenet",
    )
    exp.metrics["global_batch"] = batch_size * size
    # The group is the harness's (Lightning uses one that exists): it ends as every
    # distributed test's does, and the node's ranks share its cores as theirs do.
    with process_group(exp, device, backend) as world:
        module = Classifier(build_model(arch, len(dataset.classes)), lr)
        trainer = lightning.Trainer(
            accelerator="cuda" if bench_device.is_cuda(world.device) else "cpu",
            devices=world.local_size,
            num_nodes=max(1, world.size // world.local_size),
            strategy=DDPStrategy(
                process_group_backend=world.backend, cluster_environment=cluster_environment()
            ),
            precision=PRECISION[precision],
            max_epochs=-1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=[RateCallback(exp, world)],
        )
        trainer.fit(module, train_dataloaders=loader)


class Classifier(lightning.LightningModule):
    """``model`` trained with cross-entropy and SGD + momentum at learning rate ``lr``."""

    def __init__(self, model, lr):
        super().__init__()
        self.model = model
        self.lr = lr
        self.criterion = torch.nn.CrossEntropyLoss()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.criterion(self.model(x), y)

    def configure_optimizers(self):
        # fused on CUDA (bench/step.py): Lightning's 16-mixed scaler then skips its
        # per-step found_inf.item()
        return make_optimizer(
            "SGD", self.parameters(), self.device, lr=self.lr, momentum=0.9, weight_decay=1e-4
        )


class RateCallback(lightning.Callback):
    """A ``lightning.Callback`` that feeds milarun's rate logger and stops the Trainer.

    ``world`` is the :class:`~milarun.bench.distributed.World` of the harness's
    process group (which recorded the job). ``on_train_start`` creates the rate
    logger (``rate_logger``; ranks agree on ``--min-steady`` raises), meets the
    wave's start barrier and opens its first window; each
    ``on_train_batch_end`` is one step of ``len(batch) × world_size`` items
    with the loss logged, and sets ``trainer.should_stop`` once the logger is
    done (the same step on every rank: they count the same items);
    ``on_train_end`` closes the last window. Every rank runs the same code,
    as the collectives need.
    """

    def __init__(self, exp, world):
        self.exp, self.world = exp, world
        self.logger = None

    def on_train_start(self, trainer, module):
        self.logger = rate_logger(self.exp)
        agree_on_counts(self.exp, self.world)
        if self.logger.before_start is not None:
            self.logger.before_start()  # the wave's start barrier (bench/sync.py)
        self.logger.start()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        step = Step()
        step.set_count(len(batch[0]) * self.world.size)
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        step.log(loss=loss.detach())
        self.logger.end_step(step)
        if self.logger.done():
            trainer.should_stop = True

    def on_train_end(self, trainer, module):
        self.logger.finish()

    def on_exception(self, trainer, module, exception):
        if self.logger is not None:  # close the last window (and a running trace)
            self.logger.finish()
