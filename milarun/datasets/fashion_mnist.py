"""fashion_mnist: synthetic clothing silhouettes in the real FashionMNIST idx-ubyte format.

FashionMNIST (Zalando's 28x28 greyscale images of ten kinds of clothing) has
MNIST's exact file layout; only the folder name and the pictures differ.
Nothing can be downloaded, so the pictures are generated: each class is a
filled silhouette drawn with Pillow polygons (T-shirt, trouser, pullover,
dress, coat, sandal, shirt, sneaker, bag, ankle boot, in FashionMNIST's label
order), in three fabrics (plain, striped, shaded); every image then goes
through :mod:`.mnist`'s random affine map, contrast and noise, so the same
seed gives the same bytes.

Layout (what ``torchvision.datasets.FashionMNIST(root=<folder>, download=False)``
reads)::

    <folder>/FashionMNIST/raw/train-images-idx3-ubyte   uint8 [count, 28, 28]
    <folder>/FashionMNIST/raw/train-labels-idx1-ubyte   uint8 [count]
    <folder>/FashionMNIST/raw/t10k-images-idx3-ubyte    uint8 [test_count, 28, 28]
    <folder>/FashionMNIST/raw/t10k-labels-idx1-ubyte    uint8 [test_count]

Sizes: ``tiny`` 1,000 + 200 images (about 1 MB, well under a second);
``standard`` 60,000 + 10,000 like the real FashionMNIST (about 55 MB, 10-15 s
on one core).
"""

from pathlib import Path

import numpy as np

from .mnist import SIDE, UPSAMPLE, write_raw

VERSION = 1

SIZES = {
    "tiny": {"count": 1000, "test_count": 200},
    "standard": {"count": 60000, "test_count": 10000},
}

#: FashionMNIST's class names, in label order.
CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

# Silhouettes on a 0..1 square (x right, y down): lists of polygons.
_SHAPES = {
    0: [
        [
            (0.30, 0.15),
            (0.42, 0.12),
            (0.58, 0.12),
            (0.70, 0.15),
            (0.92, 0.32),
            (0.82, 0.42),
            (0.72, 0.36),
            (0.72, 0.88),
            (0.28, 0.88),
            (0.28, 0.36),
            (0.18, 0.42),
            (0.08, 0.32),
        ]
    ],
    1: [
        [
            (0.30, 0.08),
            (0.70, 0.08),
            (0.74, 0.92),
            (0.56, 0.92),
            (0.50, 0.35),
            (0.44, 0.92),
            (0.26, 0.92),
        ]
    ],
    2: [
        [
            (0.30, 0.12),
            (0.70, 0.12),
            (0.86, 0.30),
            (0.94, 0.86),
            (0.80, 0.88),
            (0.72, 0.40),
            (0.72, 0.90),
            (0.28, 0.90),
            (0.28, 0.40),
            (0.20, 0.88),
            (0.06, 0.86),
            (0.14, 0.30),
        ]
    ],
    3: [[(0.40, 0.08), (0.60, 0.08), (0.62, 0.30), (0.82, 0.92), (0.18, 0.92), (0.38, 0.30)]],
    4: [
        [
            (0.30, 0.10),
            (0.70, 0.10),
            (0.86, 0.28),
            (0.94, 0.90),
            (0.80, 0.92),
            (0.74, 0.42),
            (0.74, 0.95),
            (0.26, 0.95),
            (0.26, 0.42),
            (0.20, 0.92),
            (0.06, 0.90),
            (0.14, 0.28),
        ]
    ],
    5: [
        [(0.06, 0.70), (0.94, 0.70), (0.94, 0.80), (0.06, 0.80)],
        [(0.15, 0.70), (0.25, 0.40), (0.32, 0.40), (0.24, 0.70)],
        [(0.45, 0.70), (0.52, 0.45), (0.60, 0.45), (0.54, 0.70)],
        [(0.75, 0.70), (0.70, 0.50), (0.78, 0.50), (0.84, 0.70)],
    ],
    6: [
        [
            (0.32, 0.10),
            (0.50, 0.20),
            (0.68, 0.10),
            (0.86, 0.28),
            (0.94, 0.88),
            (0.80, 0.90),
            (0.72, 0.42),
            (0.72, 0.92),
            (0.28, 0.92),
            (0.28, 0.42),
            (0.20, 0.90),
            (0.06, 0.88),
            (0.14, 0.28),
        ]
    ],
    7: [
        [
            (0.06, 0.55),
            (0.40, 0.45),
            (0.58, 0.52),
            (0.80, 0.58),
            (0.94, 0.66),
            (0.94, 0.78),
            (0.06, 0.78),
        ]
    ],
    8: [
        [(0.14, 0.38), (0.86, 0.38), (0.90, 0.90), (0.10, 0.90)],
        [
            (0.32, 0.38),
            (0.36, 0.14),
            (0.64, 0.14),
            (0.68, 0.38),
            (0.60, 0.38),
            (0.57, 0.22),
            (0.43, 0.22),
            (0.40, 0.38),
        ],
    ],
    9: [
        [
            (0.30, 0.08),
            (0.62, 0.08),
            (0.64, 0.52),
            (0.92, 0.62),
            (0.94, 0.86),
            (0.10, 0.86),
            (0.12, 0.60),
            (0.28, 0.50),
        ]
    ],
}
# Dark lines drawn over a fabric: a coat's opening, a shirt's buttons and collar.
_LINES = {
    4: [((0.50, 0.12), (0.50, 0.95))],
    6: [((0.50, 0.20), (0.50, 0.92)), ((0.32, 0.10), (0.50, 0.30)), ((0.68, 0.10), (0.50, 0.30))],
}
FABRICS = ("plain", "striped", "shaded")


def _templates():
    """Float32 array [10, len(FABRICS), S+2, S+2] of silhouettes in [0, 1]
    (S = SIDE * UPSAMPLE), with a one-pixel zero border: the shape
    :func:`.mnist.generate` samples from."""
    from PIL import Image, ImageDraw

    size = SIDE * UPSAMPLE
    # FashionMNIST pictures fill most of the 28x28 frame: scale the unit square to 24/28.
    margin = size * 2 / 28
    span = size - 2 * margin
    rows = np.arange(size, dtype=np.float32)[:, None] / size
    cols = np.arange(size, dtype=np.float32)[None, :] / size
    fabric = {
        "plain": np.full((size, size), 0.85, np.float32),
        "striped": np.where((rows * 14).astype(int) % 2 == 0, 0.95, 0.55),
        "shaded": 0.45 + 0.5 * (1 - rows) * (0.6 + 0.4 * cols),
    }
    out = np.zeros((10, len(FABRICS), size + 2, size + 2), dtype=np.float32)
    for label, polygons in _SHAPES.items():
        mask = Image.new("L", (size, size), 0)
        draw = ImageDraw.Draw(mask)
        for poly in polygons:
            draw.polygon([(margin + x * span, margin + y * span) for x, y in poly], fill=255)
        lines = Image.new("L", (size, size), 0)
        ldraw = ImageDraw.Draw(lines)
        for (x0, y0), (x1, y1) in _LINES.get(label, []):
            ldraw.line(
                [
                    (margin + x0 * span, margin + y0 * span),
                    (margin + x1 * span, margin + y1 * span),
                ],
                fill=255,
                width=2,
            )
        inside = np.asarray(mask, dtype=np.float32) / 255.0
        dark = np.asarray(lines, dtype=np.float32) / 255.0
        for j, name in enumerate(FABRICS):
            out[label, j, 1:-1, 1:-1] = inside * fabric[name] * (1 - 0.7 * dark)
    return out


def build(root, params, seed):
    """Write the four idx-ubyte files under ``root/FashionMNIST/raw``."""
    write_raw(Path(root) / "FashionMNIST" / "raw", params, seed, _templates())
