"""The bsds500 and coco builders, read back through the field's real readers."""

import hashlib
import json

import pytest
from conftest import build_tiny

from milarun.datasets import prepare, resolve_params


def _digest(folder):
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(folder)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def test_bsds500_tiny_reads_back_with_pil(tiny_dataroot):
    import numpy as np
    from PIL import Image

    build_tiny(tiny_dataroot, "bsds500")
    _, params = resolve_params("bsds500", "tiny")
    base = tiny_dataroot / "bsds500" / "BSR" / "BSDS500" / "data" / "images"
    names = set()
    for split, key in (("train", "count"), ("val", "val_count"), ("test", "test_count")):
        files = sorted((base / split).glob("*.jpg"))
        assert len(files) == params[key]
        for path in files:
            names.add(path.name)
            with Image.open(path) as img:
                assert img.format == "JPEG"
                assert img.mode == "RGB"
                assert sorted(img.size) == [params["image_size"], params["image_size"] * 3 // 2]
                arr = np.asarray(img)
            assert arr.std() > 10  # structure, not a flat image
    assert len(names) == params["count"] + params["val_count"] + params["test_count"]


def test_coco_tiny_reads_back_with_pycocotools_and_torchvision(tiny_dataroot):
    from pycocotools.coco import COCO
    from torchvision.datasets import CocoDetection

    build_tiny(tiny_dataroot, "coco")
    _, params = resolve_params("coco", "tiny")
    root = tiny_dataroot / "coco"
    ann_file = root / "annotations" / "instances_train2017.json"
    doc = json.loads(ann_file.read_text())
    assert set(doc) >= {"images", "annotations", "categories", "info", "licenses"}
    assert len(doc["categories"]) == 80

    coco = COCO(str(ann_file))
    assert len(coco.getImgIds()) == params["count"]
    assert len(coco.getCatIds()) == 80
    ann_ids = [a["id"] for a in doc["annotations"]]
    assert len(set(ann_ids)) == len(ann_ids)
    for img_id in coco.getImgIds():
        info = coco.loadImgs(img_id)[0]
        anns = coco.loadAnns(coco.getAnnIds(imgIds=img_id))
        assert params["min_boxes"] <= len(anns) <= params["max_boxes"]
        for ann in anns:
            x, y, w, h = ann["bbox"]
            assert w > 0 and h > 0 and x >= 0 and y >= 0
            assert x + w <= info["width"] + 0.01 and y + h <= info["height"] + 0.01
            assert ann["category_id"] in coco.getCatIds()
            assert ann["iscrowd"] == 0 and ann["area"] > 0
        assert (root / "train2017" / info["file_name"]).is_file()

    ds = CocoDetection(str(root / "train2017"), str(ann_file))
    assert len(ds) == params["count"]
    img, target = ds[0]
    assert img.size == (coco.loadImgs(ds.ids[0])[0]["width"], coco.loadImgs(ds.ids[0])[0]["height"])
    assert len(target) >= params["min_boxes"]

    val = COCO(str(root / "annotations" / "instances_val2017.json"))
    assert len(val.getImgIds()) == params["val_count"]
    assert not set(val.getImgIds()) & set(coco.getImgIds())


@pytest.mark.parametrize("name", ["bsds500", "coco"])
def test_builders_are_deterministic(tmp_path, name):
    a = prepare(name, tmp_path / "a", size="tiny", seed=3, log=lambda *x: None)
    b = prepare(name, tmp_path / "b", size="tiny", seed=3, log=lambda *x: None)
    c = prepare(name, tmp_path / "c", size="tiny", seed=4, log=lambda *x: None)
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)


def test_count_and_image_size_overrides(tmp_path):
    from PIL import Image
    from pycocotools.coco import COCO

    over = {"count": 3, "image_size": 32}
    bsds = prepare("bsds500", tmp_path, size="tiny", overrides=over, log=lambda *x: None)
    files = sorted((bsds / "BSR" / "BSDS500" / "data" / "images" / "train").glob("*.jpg"))
    assert len(files) == 3
    for path in files:
        with Image.open(path) as img:
            assert sorted(img.size) == [32, 48]
    coco = prepare("coco", tmp_path, size="tiny", overrides=over, log=lambda *x: None)
    index = COCO(str(coco / "annotations" / "instances_train2017.json"))
    assert len(index.getImgIds()) == 3
    assert all(max(i["width"], i["height"]) == 32 for i in index.loadImgs(index.getImgIds()))
