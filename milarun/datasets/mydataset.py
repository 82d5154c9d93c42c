"""mydataset: a large generated dataset stored one ``.npy`` file per sample.

This is the second dataset of the input-pipeline study (the ``io`` workload),
after torch_io_benchmark's ``MyDataSet``: random float32 images of
``image_size`` x ``image_size`` pixels (one channel) with a label in 0..9,
600,000 of them in the seed's runs. The pixels are uniform noise in [0, 0.8)
plus ``0.02 × label``, so a network can learn the label from the mean
brightness and the training loss falls.

Layout (``numpy.load`` reads every file; :class:`MyDataset` is the reader)::

    <folder>/index.json               {"format": "milarun-mydataset", "version": 1,
                                       "count", "shape": [1, H, W], "dtype": "float32",
                                       "classes": 10, "shard_size": 1000}
    <folder>/labels.npy               int64 [count]
    <folder>/samples/00000/0000000.npy    float32 [1, H, W]  (sample i in shard i // 1000)
    ...

Why one file per sample rather than one packed array (the seed's ``.npz`` and
memory map): a packed array turns loading into a memory copy, so the number
of DataLoader workers barely matters and the study measures nothing. Per-sample
files are how most training sets sit on disk before anyone packs them (an
``ImageFolder`` tree, unpacked shards): every item costs an ``open``, a
``read`` and a header parse, which is the work that DataLoader workers spread
over cores and that a slow file system or a small cpuset shows. Shard folders
of 1,000 files keep directories small. ``.npy`` is a real format every numpy
reads, with the shape and dtype in its header.

Sizes: ``tiny`` 512 samples of 28 px (1.9 MB, about 0.1 s); ``standard``
600,000 samples of 28 px like the seed (3.2 KB each: 1.9 GB of data and
600,000 files, 2.4 GB on a 4 KB-block file system; 20,000 files took 3.5 s
on the 2-core development machine, so about 2 minutes).
"""

import json
from pathlib import Path

import numpy as np

from ..errors import MilarunError
from ..formats.jsonfile import read_json

VERSION = 1
FORMAT = "milarun-mydataset"
CLASSES = 10
SHARD = 1000

SIZES = {
    "tiny": {"count": 512, "image_size": 28},
    "standard": {"count": 600000, "image_size": 28},
}


def sample_path(folder, index):
    """Path of sample ``index`` under dataset ``folder``."""
    return Path(folder) / "samples" / f"{index // SHARD:05d}" / f"{index:07d}.npy"


def build(root, params, seed):
    """Write ``params["count"]`` samples of ``params["image_size"]`` pixels, their
    labels and ``index.json`` into ``root``. Shard ``k`` is drawn from
    ``numpy.random.default_rng([seed, k])``."""
    root = Path(root)
    count, side = params["count"], params["image_size"]
    if count < 1 or side < 1:
        raise ValueError(f"mydataset needs count >= 1 and image_size >= 1, not {count} and {side}")
    labels = np.empty(count, dtype=np.int64)
    for shard, lo in enumerate(range(0, count, SHARD)):
        hi = min(count, lo + SHARD)
        rng = np.random.default_rng([seed, shard])
        y = rng.integers(0, CLASSES, size=hi - lo)
        x = rng.random((hi - lo, 1, side, side), dtype=np.float32) * 0.8
        x += (0.02 * y).astype(np.float32)[:, None, None, None]
        labels[lo:hi] = y
        folder = sample_path(root, lo).parent
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(hi - lo):
            np.save(folder / f"{lo + i:07d}.npy", x[i])
    np.save(root / "labels.npy", labels)
    (root / "index.json").write_text(
        json.dumps(
            {
                "format": FORMAT,
                "version": VERSION,
                "count": count,
                "shape": [1, side, side],
                "dtype": "float32",
                "classes": CLASSES,
                "shard_size": SHARD,
            },
            indent=1,
        )
    )


class MyDataset:
    """Map-style dataset over a ``mydataset`` folder (usable by ``torch.utils.data.DataLoader``).

    ``dataset[i]`` reads sample ``i``'s file and returns ``(image float32
    ndarray [1, H, W], label int)``; the DataLoader's default collate turns a
    batch into tensors ``[B, 1, H, W]`` and ``[B]``. The labels are read once,
    at construction; the images on every access (that is the point).

    Attributes:
        folder: the dataset folder (Path).
        shape: ``(1, H, W)``.
        classes: number of labels (10).

    Raises:
        FileNotFoundError: no ``index.json`` or ``labels.npy`` in ``folder``.
        ValueError: ``index.json`` is not a mydataset index, or disagrees with
            ``labels.npy``.
    """

    def __init__(self, folder):
        self.folder = Path(folder)
        index_file = self.folder / "index.json"
        if not index_file.exists():
            raise FileNotFoundError(
                f"no index.json in {self.folder}; rebuild the dataset (milarun dataset mydataset)"
            )
        try:  # strict and bounded: never a FIFO's hang nor a RecursionError
            index = read_json(index_file)
        except MilarunError as exc:
            raise ValueError(str(exc)) from None
        if not isinstance(index, dict) or index.get("format") != FORMAT:
            raise ValueError(f"{index_file}: format: not a {FORMAT} index")
        self.labels = np.load(self.folder / "labels.npy")
        if len(self.labels) != index.get("count"):
            raise ValueError(
                f"{index_file}: count: {index.get('count')} but labels.npy "
                f"holds {len(self.labels)} labels"
            )
        self.shape = tuple(index["shape"])
        self.classes = int(index["classes"])

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        if not 0 <= index < len(self.labels):
            raise IndexError(index)
        return np.load(sample_path(self.folder, index)), int(self.labels[index])
