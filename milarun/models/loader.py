"""loader: the ImageNet-style input pipeline alone, with no model.

Reads the ``fake_imagenet`` JPEG tree through ``torchvision.datasets.ImageFolder``
(PIL decode), applies ``RandomResizedCrop``, a horizontal flip, ``ToTensor``
and ``Normalize`` in ``DataLoader`` worker processes, collates batches (pinned
memory on CUDA) and copies each batch to the device (non-blocking). Stresses
the CPU cores of the student (JPEG decoding, resizing), the page cache / disk
and host-to-device transfers: it tells whether a server's CPUs can feed its
GPUs. Items are images.

Needs the ``fake_imagenet`` dataset (``milarun dataset fake_imagenet``).
"""

from coleo import Option, default, tooled

from ..bench import data_loader, dataloop, init_torch
from ..bench.options import batch_size_option, workers_option
from ..datasets import require

#: No loss by nature (milarun.measure.plausibility's NaN check does not apply): no model.
NO_LOSS = "loader measures the input pipeline alone; there is no model"


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.loader:main -- ARGS``."""
    exp.cli(train, argv)


def imagenet_transform(image_size):
    """The usual ImageNet training transform, cropping to ``image_size`` pixels."""
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )


def image_loader(folder, split, image_size, batch_size, workers, device, shard=None, seed=0):
    """A shuffling ``DataLoader`` over ``folder/split`` (ImageFolder).

    ``workers`` < 0 means the student's cpuset size minus one. Workers are
    persistent, so restarting an epoch does not fork them again.

    With ``shard=(rank, world_size)``, a ``DistributedSampler`` (shuffled
    with ``seed``) gives this rank its share of the images: every rank gets
    the same number of batches per epoch, so data-parallel ranks step
    together. Call ``loader.sampler.set_epoch(e)`` before each epoch.

    Returns:
        ``(loader, dataset)``.

    Raises:
        FileNotFoundError: no ``split`` folder in ``folder``.
    """
    from torchvision import datasets

    root = folder / split
    if not root.is_dir():
        raise FileNotFoundError(f"no {split}/ folder in {folder}; rebuild the dataset")
    dataset = datasets.ImageFolder(str(root), transform=imagenet_transform(image_size))
    kwargs = {}
    if shard is not None:
        from torch.utils.data.distributed import DistributedSampler

        rank, world_size = shard
        kwargs = {
            "sampler": DistributedSampler(
                dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed
            ),
            "shuffle": False,
        }
    loader = data_loader(dataset, batch_size, workers, device, **kwargs)
    return loader, dataset


@tooled
def train(exp):
    batch_size = batch_size_option(default=256)
    # Side of the random crops, in pixels
    image_size: Option & int = default(224)
    workers = workers_option(default=-1)

    device = init_torch(exp)
    folder = require(exp.dataroot, "fake_imagenet")
    loader, _ = image_loader(folder, "train", image_size, batch_size, workers, device)

    for step, (x, y) in dataloop(exp, loader):
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        step.set_count(len(x))
