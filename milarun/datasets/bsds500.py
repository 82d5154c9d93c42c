"""bsds500: a synthetic stand-in for the Berkeley Segmentation Data Set 500.

Layout (the one of the real archive, images only)::

    bsds500/BSR/BSDS500/data/images/train/<id>.jpg
    bsds500/BSR/BSDS500/data/images/val/<id>.jpg
    bsds500/BSR/BSDS500/data/images/test/<id>.jpg

Images are RGB JPEG files, landscape or portrait, with a short side of
``image_size`` and a long side 1.5 times longer (like the real 481×321 /
321×481 photographs), made of a smooth
colour field, random shapes and pixel noise, so that they have edges and
texture for a super-resolution model to learn. The real data set cannot be
downloaded, so this builder writes one that has the same layout, file format
and image sizes, deterministically from the seed.

Parameters: ``count`` (train images), ``val_count``, ``test_count``,
``image_size`` (short side, pixels).
"""

import numpy as np

VERSION = 1

SIZES = {
    # for tests on CPU: a few tens of small images
    "tiny": {"count": 12, "val_count": 4, "test_count": 4, "image_size": 64},
    # as many images as the real BSDS500, at its resolution (481×321)
    "standard": {"count": 200, "val_count": 100, "test_count": 200, "image_size": 321},
}

# split name → parameter holding its number of images
SPLITS = (("train", "count"), ("val", "val_count"), ("test", "test_count"))


def image_shape(params):
    """``(width, height)`` of a landscape image: the short side is ``image_size``,
    the long side 1.5 times longer (481×321 for the real size)."""
    short = int(params["image_size"])
    return int(short * 1.5), short


def images_dir(root):
    """``<root>/BSR/BSDS500/data/images`` (root: the ``bsds500`` folder)."""
    return root / "BSR" / "BSDS500" / "data" / "images"


def synthetic_image(rng, width, height, shapes=None):
    """A structured RGB ``PIL.Image``: smooth colour field + shapes + noise.

    Args:
        rng: ``numpy.random.Generator`` (the only source of randomness).
        width, height: image size in pixels.
        shapes: list of ``(kind, (x0, y0, x1, y1), (r, g, b))`` to draw, with
            ``kind`` in ``"rectangle"``, ``"ellipse"``; None draws 3–12 random
            shapes.
    """
    from PIL import Image, ImageDraw

    # Smooth background: a coarse random grid upsampled bilinearly.
    gw, gh = int(rng.integers(2, 6)), int(rng.integers(2, 6))
    coarse = rng.integers(0, 256, size=(gh, gw, 3), dtype=np.uint8)
    img = Image.fromarray(coarse, "RGB").resize((width, height), Image.Resampling.BILINEAR)
    draw = ImageDraw.Draw(img)
    if shapes is None:
        shapes = []
        for _ in range(int(rng.integers(3, 13))):
            x0, x1 = sorted(rng.integers(0, width, size=2).tolist())
            y0, y1 = sorted(rng.integers(0, height, size=2).tolist())
            kind = "ellipse" if rng.random() < 0.5 else "rectangle"
            color = tuple(int(c) for c in rng.integers(0, 256, size=3))
            shapes.append((kind, (x0, y0, max(x1, x0 + 1), max(y1, y0 + 1)), color))
    for kind, box, color in shapes:
        if kind == "ellipse":
            draw.ellipse(box, fill=color)
        else:
            draw.rectangle(box, fill=color)
    arr = np.asarray(img, dtype=np.int16)
    noise = rng.integers(-12, 13, size=arr.shape, dtype=np.int16)
    arr = np.clip(arr + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(arr, "RGB")


def build(root, params, seed):
    """Write the three splits under ``root`` (the ``bsds500`` folder being built)."""
    base = images_dir(root)
    ident = 0
    for split_index, (split, key) in enumerate(SPLITS):
        folder = base / split
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(int(params[key])):
            rng = np.random.default_rng([seed, split_index, i])
            w, h = image_shape(params)
            if rng.random() < 0.3:  # about a third of BSDS500 is portrait
                w, h = h, w
            ident += 1
            img = synthetic_image(rng, w, h)
            img.save(folder / f"{100000 + ident}.jpg", format="JPEG", quality=90)
