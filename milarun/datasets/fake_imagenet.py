"""fake_imagenet: an ImageNet-like class-per-folder tree of real JPEG files.

Nothing can be downloaded, so the images are generated: a smooth random
colour field (a few random colours upsampled bicubically), plus stripes whose
orientation and frequency depend on the class (so a network can learn
something), plus Gaussian pixel noise (so the JPEGs have realistic
high-frequency content and decode cost). Like ImageNet photos, the images are
not square: the short side is ``image_size`` and the long side is up to a
third longer, landscape or portrait. Each image is drawn from
``numpy.random.default_rng([seed, split, index])``, so a build is the same
bytes for the same seed whatever the number of build processes.

Layout (what ``torchvision.datasets.ImageFolder`` reads)::

    <folder>/train/n00000000/0000000.jpg ... (image i is in class i % classes)
    <folder>/val/n00000000/0000000.jpg ...   (when val_count > 0)

Parameters: ``count`` (train images), ``val_count``, ``classes``,
``image_size`` (short side, pixels), ``quality`` (JPEG quality).

Sizes:

* ``tiny``: 256 + 32 images of 64 px in 4 classes, under 1 MB, under a second.
* ``standard``: 16,000 + 1,000 images of 256 px in 1,000 classes, about
  31 KB each, 0.55 GB on disk; building takes about 8 ms an image on one
  core (2+ minutes) and uses every core of the caller's cpuset (about 10 s
  on 16 cores). Real ImageNet JPEGs are larger (about 110 KB, 400x350 px),
  so decoding these is cheaper per image.
"""

import os
from pathlib import Path

import numpy as np

VERSION = 1

SIZES = {
    "tiny": {"count": 256, "val_count": 32, "classes": 4, "image_size": 64, "quality": 90},
    "standard": {
        "count": 16000,
        "val_count": 1000,
        "classes": 1000,
        "image_size": 256,
        "quality": 90,
    },
}

SPLITS = (("train", 0, "count"), ("val", 1, "val_count"))

# Below this many images a build runs in the calling process.
PARALLEL_THRESHOLD = 2000


def class_name(c):
    """Folder name of class ``c`` (ImageNet-like, sorts in class order)."""
    return f"n{c:08d}"


def make_image(seed, split, index, classes, image_size):
    """The RGB uint8 array [H, W, 3] of image ``index`` of ``split`` (0 train, 1 val)."""
    from PIL import Image

    rng = np.random.default_rng([seed, split, index])
    label = index % classes
    short = image_size
    long = int(round(image_size * rng.uniform(1.0, 4.0 / 3.0)))
    h, w = (short, long) if rng.random() < 0.7 else (long, short)

    cells = int(rng.integers(2, 7))
    coarse = rng.integers(0, 256, size=(cells, cells, 3), dtype=np.uint8)
    base = np.asarray(
        Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC), dtype=np.float32
    )

    # Class pattern: stripes whose angle and frequency are fixed per class.
    angle = np.pi * ((label * 0.618034) % 1.0)
    period = 6.0 + (label * 7) % 23  # pixels, at image_size 256
    period *= image_size / 256.0
    ys = np.arange(h, dtype=np.float32)[:, None]
    xs = np.arange(w, dtype=np.float32)[None, :]
    phase = rng.uniform(0, 2 * np.pi)
    stripes = np.cos((xs * np.cos(angle) + ys * np.sin(angle)) * (2 * np.pi / period) + phase)
    tint = (
        np.array([(label * 37) % 256, (label * 91) % 256, (label * 151) % 256], dtype=np.float32)
        / 255.0
        - 0.5
    )
    img = base + stripes[:, :, None] * (40.0 + 30.0 * tint)
    img += rng.standard_normal((h, w, 3), dtype=np.float32) * 10.0
    return np.clip(img, 0, 255).astype(np.uint8)


def _write_range(root, split_name, split, lo, hi, params, seed):
    """Write images ``lo..hi-1`` of one split (runs in a worker process too)."""
    from PIL import Image

    root = Path(root)
    for i in range(lo, hi):
        arr = make_image(seed, split, i, params["classes"], params["image_size"])
        path = root / split_name / class_name(i % params["classes"]) / f"{i:07d}.jpg"
        Image.fromarray(arr).save(path, format="JPEG", quality=params["quality"])
    return hi - lo


def _jobs(root, params, seed, chunk):
    for split_name, split, key in SPLITS:
        count = params[key]
        for lo in range(0, count, chunk):
            yield (str(root), split_name, split, lo, min(count, lo + chunk), params, seed)


def build(root, params, seed, processes=None):
    """Write the JPEG tree under ``root``.

    Args:
        processes: build processes; default: the caller's cpuset size when the
            dataset has at least ``PARALLEL_THRESHOLD`` images, else 1.
    """
    root = Path(root)
    if params["classes"] < 1 or params["count"] < params["classes"]:
        raise ValueError(
            "fake_imagenet needs classes >= 1 and count >= classes "
            "(every class folder must hold an image)"
        )
    for split_name, _, key in SPLITS:
        if params[key] > 0:
            for c in range(params["classes"]):
                (root / split_name / class_name(c)).mkdir(parents=True, exist_ok=True)
    total = params["count"] + params["val_count"]
    if processes is None:
        processes = len(os.sched_getaffinity(0)) if total >= PARALLEL_THRESHOLD else 1
    if processes <= 1:
        for job in _jobs(root, params, seed, chunk=max(1, total)):
            _write_range(*job)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn: the caller may have imported torch or started threads.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=processes, mp_context=ctx) as pool:
        futures = [pool.submit(_write_range, *job) for job in _jobs(root, params, seed, 250)]
        for fut in futures:
            fut.result()
