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
from torchvision import datasets, transforms

from ..bench import data_loader, dataloop, init_torch, rank_loader
from ..bench.options import batch_size_option, workers_option
from ..datasets import require

#: No loss by nature (milarun.measure.plausibility's NaN check does not apply): no model.
NO_LOSS = "loader measures the input pipeline alone; there is no model"


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.loader:main -- ARGS``."""
    exp.cli(train, argv)


def imagenet_transform(image_size):
    """The usual ImageNet training transform, cropping to ``image_size`` pixels."""
    return transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )


def image_folder(folder, split, image_size):
    """The ``ImageFolder`` over ``folder/split`` with :func:`imagenet_transform`.

    Raises:
        FileNotFoundError: no ``split`` folder in ``folder``.
    """
    root = folder / split
    if not root.is_dir():
        raise FileNotFoundError(f"no {split}/ folder in {folder}; rebuild the dataset")
    return datasets.ImageFolder(str(root), transform=imagenet_transform(image_size))


def image_loader(folder, split, image_size, batch_size, workers, device):
    """A shuffling ``DataLoader`` over ``folder/split`` (:func:`image_folder`), for one
    process; a data-parallel rank builds its share with
    :func:`milarun.bench.setup.rank_loader` over :func:`image_folder` instead.

    ``workers`` < 0 means this process's share of the student's cpuset, minus one
    (:func:`milarun.bench.setup.dataloader_workers`). Workers are persistent, so
    restarting an epoch does not fork them again.

    Returns:
        ``(loader, dataset)``.

    Raises:
        FileNotFoundError: no ``split`` folder in ``folder``.
    """
    dataset = image_folder(folder, split, image_size)
    return data_loader(dataset, batch_size, workers, device), dataset


def image_rank_loader(exp, dataset, batch_size, workers, world):
    """This rank's shuffling ``DataLoader`` over its share of ``dataset`` (an
    :func:`image_folder`), ``batch_size`` images a batch, shuffled with ``--seed``
    (:func:`milarun.bench.setup.rank_loader`, which resolves ``workers`` < 0).

    Raises:
        ValueError: the images give no batch for every rank (one line with a hint).
    """
    return rank_loader(
        dataset,
        batch_size,
        workers,
        world.device,
        world,
        exp.options["seed"],
        "images",
        hint="lower --batch-size or use a larger fake_imagenet",
    )


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
