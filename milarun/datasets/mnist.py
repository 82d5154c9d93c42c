"""mnist: synthetic handwritten-like digits in the real MNIST idx-ubyte format.

Nothing can be downloaded, so the digits are generated: each of the ten
digits is rendered with Pillow's built-in font at a few stroke widths (the
*templates*, at twice the final resolution), then every image samples one
template through a random affine map (rotation, scale, shear, translation)
with bilinear interpolation, and gets a random contrast and a little noise.
Everything is drawn from ``numpy.random.default_rng(seed)``, so the same seed
gives the same bytes.

Layout (what ``torchvision.datasets.MNIST(root=<folder>, download=False)``
reads; it needs the four raw files only, no ``processed/`` folder)::

    <folder>/MNIST/raw/train-images-idx3-ubyte   uint8 [count, 28, 28]
    <folder>/MNIST/raw/train-labels-idx1-ubyte   uint8 [count]
    <folder>/MNIST/raw/t10k-images-idx3-ubyte    uint8 [test_count, 28, 28]
    <folder>/MNIST/raw/t10k-labels-idx1-ubyte    uint8 [test_count]

Sizes: ``tiny`` 1,000 + 200 images (about 1 MB, well under a second);
``standard`` 60,000 + 10,000 like the real MNIST (about 55 MB, 10-15 s on one core).
"""

import struct
from pathlib import Path

import numpy as np

VERSION = 1

SIZES = {
    "tiny": {"count": 1000, "test_count": 200},
    "standard": {"count": 60000, "test_count": 10000},
}

SIDE = 28  # final image side (pixels)
UPSAMPLE = 2  # templates are rendered at SIDE * UPSAMPLE
STROKES = (0, 1, 2, 3)  # stroke widths of the template variants (template pixels)
CHUNK = 4096  # images generated per vectorized batch


def _templates():
    """Float32 array [10, len(STROKES), S+2, S+2] of centred glyphs in [0, 1]
    (S = SIDE * UPSAMPLE), with a one-pixel zero border for sampling."""
    from PIL import Image, ImageDraw, ImageFont

    size = SIDE * UPSAMPLE
    font = ImageFont.load_default(size=int(size * 0.72))
    out = np.zeros((10, len(STROKES), size + 2, size + 2), dtype=np.float32)
    for digit in range(10):
        for j, stroke in enumerate(STROKES):
            canvas = Image.new("L", (size * 2, size * 2), 0)
            draw = ImageDraw.Draw(canvas)
            draw.text(
                (size // 2, size // 2),
                str(digit),
                fill=255,
                font=font,
                stroke_width=stroke,
                stroke_fill=255,
            )
            box = canvas.getbbox()
            glyph = canvas.crop(box)
            # MNIST digits fit in a 20x20 box inside 28x28: scale the glyph's
            # height to 20/28 of the side, keeping its aspect ratio.
            target_h = size * 20 // 28
            scale = target_h / glyph.height
            w = max(1, min(target_h, round(glyph.width * scale)))
            glyph = glyph.resize((w, target_h), Image.Resampling.BILINEAR)
            tile = Image.new("L", (size, size), 0)
            tile.paste(glyph, ((size - w) // 2, (size - target_h) // 2))
            out[digit, j, 1:-1, 1:-1] = np.asarray(tile, dtype=np.float32) / 255.0
    return out


def _render(templates, labels, rng):
    """Images uint8 [len(labels), SIDE, SIDE] for ``labels``, drawn from ``rng``."""
    n = len(labels)
    variant = rng.integers(0, templates.shape[1], size=n)
    angle = rng.normal(0.0, 0.14, size=n)  # radians (~8 degrees)
    scale = rng.uniform(0.85, 1.15, size=n)
    aspect = rng.uniform(0.8, 1.15, size=n)  # narrower or wider strokes
    shear = rng.normal(0.0, 0.15, size=n)
    shift = rng.normal(0.0, 1.0, size=(n, 2))  # output pixels
    contrast = rng.uniform(0.75, 1.0, size=n)

    # Output pixel centres, relative to the image centre: [P, 2] as (x, y).
    ys, xs = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32)
    grid = np.stack([xs.ravel(), ys.ravel()], axis=1) - (SIDE - 1) / 2.0

    # Forward map template -> output: rotation @ shear @ scale; sample with its inverse.
    cos, sin = np.cos(angle), np.sin(angle)
    fwd = np.zeros((n, 2, 2), dtype=np.float64)
    fwd[:, 0, 0] = scale * aspect * cos
    fwd[:, 0, 1] = scale * (shear * cos - sin)
    fwd[:, 1, 0] = scale * aspect * sin
    fwd[:, 1, 1] = scale * (shear * sin + cos)
    inv = np.linalg.inv(fwd).astype(np.float32)
    rel = grid[None, :, :] - shift[:, None, :].astype(np.float32)  # [n, P, 2]
    src = np.einsum("nij,npj->npi", inv, rel)  # [n, P, 2]
    t_side = SIDE * UPSAMPLE
    src = src * UPSAMPLE + (t_side - 1) / 2.0 + 1.0  # +1: the zero border
    limit = t_side + 1 - 1e-3
    x = np.clip(src[..., 0], 0.0, limit)
    y = np.clip(src[..., 1], 0.0, limit)
    x0 = np.floor(x).astype(np.int64)
    y0 = np.floor(y).astype(np.int64)
    fx = x - x0
    fy = y - y0
    flat = templates.reshape(-1, (t_side + 2) * (t_side + 2))
    which = (labels.astype(np.int64) * templates.shape[1] + variant)[:, None]
    row = t_side + 2

    def at(yy, xx):
        return flat[which, yy * row + xx]

    val = (
        at(y0, x0) * (1 - fx) * (1 - fy)
        + at(y0, x0 + 1) * fx * (1 - fy)
        + at(y0 + 1, x0) * (1 - fx) * fy
        + at(y0 + 1, x0 + 1) * fx * fy
    )
    val = val * contrast[:, None]
    noise = rng.normal(0.0, 0.04, size=val.shape).astype(np.float32)
    val = np.where(val > 0.05, val + noise, 0.0)  # clean background, like MNIST
    img = np.clip(np.rint(val * 255.0), 0, 255).astype(np.uint8)
    return img.reshape(n, SIDE, SIDE)


def _write_idx(path, array):
    """Write a uint8 array in the idx format (big-endian header)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">I", 0x0800 | array.ndim)
    header += b"".join(struct.pack(">I", d) for d in array.shape)
    with open(path, "wb") as f:
        f.write(header)
        f.write(array.tobytes())


def generate(count, seed, templates=None):
    """``(images uint8 [count, 28, 28], labels uint8 [count])`` for ``seed``."""
    templates = _templates() if templates is None else templates
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=count).astype(np.uint8)
    images = np.empty((count, SIDE, SIDE), dtype=np.uint8)
    for lo in range(0, count, CHUNK):
        hi = min(count, lo + CHUNK)
        images[lo:hi] = _render(templates, labels[lo:hi], rng)
    return images, labels


def write_raw(raw, params, seed, templates):
    """Write the four idx-ubyte files (``params["count"]`` training and
    ``params["test_count"]`` test images drawn from ``templates``) into folder
    ``raw``. Shared with :mod:`.fashion_mnist`, which has the same layout."""
    raw = Path(raw)
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, count, sub in (("train", params["count"], 0), ("t10k", params["test_count"], 1)):
        images, labels = generate(count, [seed, sub], templates)
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)


def build(root, params, seed):
    """Write the four idx-ubyte files under ``root/MNIST/raw``."""
    write_raw(Path(root) / "MNIST" / "raw", params, seed, _templates())
