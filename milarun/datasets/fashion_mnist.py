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
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
           "Sneaker", "Bag", "Ankle boot")

# Silhouettes on a 0..1 square (x right, y down): lists of polygons.
_SHAPES = {
    0: [[(.30, .15), (.42, .12), (.58, .12), (.70, .15), (.92, .32), (.82, .42), (.72, .36),
         (.72, .88), (.28, .88), (.28, .36), (.18, .42), (.08, .32)]],
    1: [[(.30, .08), (.70, .08), (.74, .92), (.56, .92), (.50, .35), (.44, .92), (.26, .92)]],
    2: [[(.30, .12), (.70, .12), (.86, .30), (.94, .86), (.80, .88), (.72, .40), (.72, .90),
         (.28, .90), (.28, .40), (.20, .88), (.06, .86), (.14, .30)]],
    3: [[(.40, .08), (.60, .08), (.62, .30), (.82, .92), (.18, .92), (.38, .30)]],
    4: [[(.30, .10), (.70, .10), (.86, .28), (.94, .90), (.80, .92), (.74, .42), (.74, .95),
         (.26, .95), (.26, .42), (.20, .92), (.06, .90), (.14, .28)]],
    5: [[(.06, .70), (.94, .70), (.94, .80), (.06, .80)],
        [(.15, .70), (.25, .40), (.32, .40), (.24, .70)],
        [(.45, .70), (.52, .45), (.60, .45), (.54, .70)],
        [(.75, .70), (.70, .50), (.78, .50), (.84, .70)]],
    6: [[(.32, .10), (.50, .20), (.68, .10), (.86, .28), (.94, .88), (.80, .90), (.72, .42),
         (.72, .92), (.28, .92), (.28, .42), (.20, .90), (.06, .88), (.14, .28)]],
    7: [[(.06, .55), (.40, .45), (.58, .52), (.80, .58), (.94, .66), (.94, .78), (.06, .78)]],
    8: [[(.14, .38), (.86, .38), (.90, .90), (.10, .90)],
        [(.32, .38), (.36, .14), (.64, .14), (.68, .38), (.60, .38), (.57, .22), (.43, .22),
         (.40, .38)]],
    9: [[(.30, .08), (.62, .08), (.64, .52), (.92, .62), (.94, .86), (.10, .86), (.12, .60),
         (.28, .50)]],
}
# Dark lines drawn over a fabric: a coat's opening, a shirt's buttons and collar.
_LINES = {
    4: [((.50, .12), (.50, .95))],
    6: [((.50, .20), (.50, .92)), ((.32, .10), (.50, .30)), ((.68, .10), (.50, .30))],
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
    fabric = {"plain": np.full((size, size), 0.85, np.float32),
              "striped": np.where((rows * 14).astype(int) % 2 == 0, 0.95, 0.55),
              "shaded": 0.45 + 0.5 * (1 - rows) * (0.6 + 0.4 * cols)}
    out = np.zeros((10, len(FABRICS), size + 2, size + 2), dtype=np.float32)
    for label, polygons in _SHAPES.items():
        mask = Image.new("L", (size, size), 0)
        draw = ImageDraw.Draw(mask)
        for poly in polygons:
            draw.polygon([(margin + x * span, margin + y * span) for x, y in poly], fill=255)
        lines = Image.new("L", (size, size), 0)
        ldraw = ImageDraw.Draw(lines)
        for (x0, y0), (x1, y1) in _LINES.get(label, []):
            ldraw.line([(margin + x0 * span, margin + y0 * span),
                        (margin + x1 * span, margin + y1 * span)], fill=255, width=2)
        inside = np.asarray(mask, dtype=np.float32) / 255.0
        dark = np.asarray(lines, dtype=np.float32) / 255.0
        for j, name in enumerate(FABRICS):
            out[label, j, 1:-1, 1:-1] = inside * fabric[name] * (1 - 0.7 * dark)
    return out


def build(root, params, seed):
    """Write the four idx-ubyte files under ``root/FashionMNIST/raw``."""
    write_raw(Path(root) / "FashionMNIST" / "raw", params, seed, _templates())
