"""coco: a synthetic object-detection data set in the COCO 2017 layout.

Layout (as the real archives unpack)::

    coco/train2017/<012d id>.jpg
    coco/val2017/<012d id>.jpg
    coco/annotations/instances_train2017.json
    coco/annotations/instances_val2017.json

The annotation files are valid COCO "instances" JSON (``info``, ``licenses``,
``images``, ``annotations``, ``categories``), readable with
``pycocotools.coco.COCO`` and ``torchvision.datasets.CocoDetection``. Each
image holds ``min_boxes``–``max_boxes`` objects over the 80 COCO category ids
(1–90 with the real gaps); each object is drawn in the image as a filled shape
whose bounding box is its annotation ``bbox`` ``[x, y, w, h]``, on a noisy
textured background. Everything is deterministic from the seed. The real COCO
cannot be downloaded, so this builder reproduces its format and image sizes.

Parameters: ``count`` (train images), ``val_count``, ``image_size`` (width of
a landscape image; heights are 9/16 to 3/4 of it, and a fifth of the images
are portrait), ``min_boxes``, ``max_boxes`` (objects per image).
"""

import json

import numpy as np

from .bsds500 import synthetic_image

VERSION = 1

SIZES = {
    # for tests on CPU: a few tens of small images
    "tiny": {"count": 16, "val_count": 4, "image_size": 160, "min_boxes": 1, "max_boxes": 4},
    # a few thousand images at COCO's usual resolution
    "standard": {
        "count": 4000,
        "val_count": 500,
        "image_size": 640,
        "min_boxes": 1,
        "max_boxes": 10,
    },
}

# The 80 category ids of COCO 2017 (1..90 without the 10 unused ids).
CATEGORY_IDS = [i for i in range(1, 91) if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83)]


def categories():
    """The ``categories`` list of the annotation files."""
    return [
        {"id": cid, "name": f"category_{cid}", "supercategory": f"group_{(cid - 1) // 10}"}
        for cid in CATEGORY_IDS
    ]


def _category_color(cid):
    rng = np.random.default_rng([7919, cid])
    return tuple(int(c) for c in rng.integers(0, 256, size=3))


def _image_record(rng, image_id, params):
    # COCO images are mostly 640 wide with heights around 360..480; some portrait.
    w = int(params["image_size"])
    h = int(rng.integers(max(8, (9 * w) // 16), max(8, (3 * w) // 4) + 1))
    if rng.random() < 0.2:
        w, h = h, w
    return {
        "id": image_id,
        "file_name": f"{image_id:012d}.jpg",
        "width": w,
        "height": h,
        "license": 1,
        "date_captured": "2017-01-01 00:00:00",
    }


def _objects(rng, w, h, params, first_ann_id, image_id):
    anns, shapes = [], []
    count = int(rng.integers(int(params["min_boxes"]), int(params["max_boxes"]) + 1))
    for k in range(count):
        bw = float(rng.uniform(0.05, 0.6) * w)
        bh = float(rng.uniform(0.05, 0.6) * h)
        x = float(rng.uniform(0, w - bw))
        y = float(rng.uniform(0, h - bh))
        bw, bh, x, y = (round(v, 2) for v in (bw, bh, x, y))
        bw, bh = max(bw, 1.0), max(bh, 1.0)
        cid = int(rng.choice(CATEGORY_IDS))
        kind = "ellipse" if rng.random() < 0.5 else "rectangle"
        shapes.append((kind, (x, y, x + bw, y + bh), _category_color(cid)))
        x1, y1 = round(x + bw, 2), round(y + bh, 2)
        anns.append(
            {
                "id": first_ann_id + k,
                "image_id": image_id,
                "category_id": cid,
                "bbox": [x, y, bw, bh],
                "area": round(bw * bh, 2),
                "iscrowd": 0,
                "segmentation": [[x, y, x1, y, x1, y1, x, y1]],
            }
        )
    return anns, shapes


def _build_split(root, split, split_index, count, first_image_id, params, seed):
    folder = root / f"{split}2017"
    folder.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    ann_id = first_image_id * 100 + 1
    for i in range(count):
        rng = np.random.default_rng([seed, split_index, i])
        image_id = first_image_id + i
        rec = _image_record(rng, image_id, params)
        anns, shapes = _objects(rng, rec["width"], rec["height"], params, ann_id, image_id)
        ann_id += len(anns)
        img = synthetic_image(rng, rec["width"], rec["height"], shapes=shapes)
        img.save(folder / rec["file_name"], format="JPEG", quality=90)
        images.append(rec)
        annotations.extend(anns)
    doc = {
        "info": {
            "description": "milarun synthetic COCO-format data set",
            "version": "1.0",
            "year": 2017,
            "contributor": "milarun",
            "date_created": "2017-01-01",
            "url": "",
        },
        "licenses": [{"id": 1, "name": "synthetic", "url": ""}],
        "images": images,
        "annotations": annotations,
        "categories": categories(),
    }
    ann_dir = root / "annotations"
    ann_dir.mkdir(parents=True, exist_ok=True)
    (ann_dir / f"instances_{split}2017.json").write_text(json.dumps(doc))


def build(root, params, seed):
    """Write ``train2017``, ``val2017`` and their annotation files under ``root``."""
    _build_split(root, "train", 0, int(params["count"]), 1, params, seed)
    _build_split(root, "val", 1, int(params["val_count"]), 1_000_000, params, seed)
