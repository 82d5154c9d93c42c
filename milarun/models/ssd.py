"""ssd: SSD300 object detection with a VGG16 backbone (torchvision), training.

The model is ``torchvision.models.detection.ssd300_vgg16`` built with
``weights=None, weights_backbone=None`` (nothing can be downloaded) and
``--num-classes`` classes (80 COCO categories + background by default). Each
step computes the multibox loss (box regression + classification with hard
negative mining) and takes an SGD step.

An item is one image: a COCO-layout JPEG and its annotations, read through
``torchvision.datasets.CocoDetection`` (PIL + pycocotools), converted to
``boxes`` ``[x1, y1, x2, y2]`` and contiguous ``labels``, and resized to
300×300 in the loader workers. This workload stresses convolution compute
(VGG16 at 300×300), the CPU-side target matching and many small kernels of the
detection head and loss, and the JPEG input pipeline.

Data: ``<dataroot>/coco/train2017/*.jpg`` and
``<dataroot>/coco/annotations/instances_train2017.json``
(``milarun dataset coco``).
"""

import contextlib
import io

import torch
from coleo import Option, default, tooled
from PIL import Image
from torchvision.datasets import CocoDetection
from torchvision.models.detection import ssd300_vgg16
from torchvision.transforms.functional import to_tensor

from ..bench import data_loader, dataloop, init_torch
from ..bench.options import batch_size_option, lr_option, precision_option, workers_option
from ..bench.step import MixedPrecisionStep, make_optimizer
from ..datasets import require

SIZE = 300


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.ssd:main -- ARGS``.

    Trains SSD300-VGG16 on the coco training split until ``--max-count``
    images were processed.
    """
    exp.cli(train, argv)


class CocoToSSD:
    """``transforms`` for ``CocoDetection``: ``(PIL image, [annotation])`` →
    ``(float tensor (3, size, size) in [0, 1], {"boxes", "labels"})``.

    Boxes are COCO ``[x, y, w, h]`` turned into ``[x1, y1, x2, y2]`` in the
    resized image; crowd and degenerate boxes are dropped; ``category_id`` is
    mapped through ``labels`` (category id → contiguous label ≥ 1).
    """

    def __init__(self, labels, size=SIZE):
        self.labels = labels
        self.size = size

    def __call__(self, image, anns):
        w, h = image.size
        image = image.convert("RGB").resize((self.size, self.size), Image.Resampling.BILINEAR)
        sx, sy = self.size / w, self.size / h
        boxes, labels = [], []
        for ann in anns:
            if ann.get("iscrowd", 0):
                continue
            x, y, bw, bh = ann["bbox"]
            if bw < 1 or bh < 1:
                continue
            boxes.append([x * sx, y * sy, (x + bw) * sx, (y + bh) * sy])
            labels.append(self.labels[ann["category_id"]])
        target = {
            "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
            "labels": torch.tensor(labels, dtype=torch.int64),
        }
        return to_tensor(image), target


def collate_lists(batch):
    """Keep images and targets as lists (detection models take lists)."""
    images, targets = zip(*batch)
    return list(images), list(targets)


@tooled
def train(exp):
    batch_size = batch_size_option(default=32)
    # Number of classes, background included (COCO: 80 + 1)
    num_classes: Option & int = default(81)
    lr = lr_option(default=0.002)
    # SGD momentum
    momentum: Option & float = default(0.9)
    # Weight decay
    weight_decay: Option & float = default(0.0005)
    workers = workers_option(default=-1)
    precision = precision_option(default="fp32")

    device = init_torch(exp)
    mp = MixedPrecisionStep(device, precision)
    autocast = mp.autocast

    root = require(exp.dataroot, "coco")
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        dataset = CocoDetection(
            str(root / "train2017"), str(root / "annotations" / "instances_train2017.json")
        )
    cat_ids = sorted(dataset.coco.getCatIds())
    if len(cat_ids) + 1 > num_classes:
        raise ValueError(
            f"--num-classes {num_classes} is too small for {len(cat_ids)} categories + background"
        )
    dataset.transforms = CocoToSSD({cid: i + 1 for i, cid in enumerate(cat_ids)})

    loader = data_loader(dataset, batch_size, workers, device, collate_fn=collate_lists)

    model = ssd300_vgg16(weights=None, weights_backbone=None, num_classes=num_classes).to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(
        "SGD", params, device, lr=lr, momentum=momentum, weight_decay=weight_decay
    )

    for step, (images, targets) in dataloop(exp, loader):
        images = [img.to(device, non_blocking=True) for img in images]
        targets = [{k: v.to(device, non_blocking=True) for k, v in t.items()} for t in targets]
        with autocast:
            losses = model(images, targets)
            loss = sum(v.float() for v in losses.values())
        optimizer.zero_grad(set_to_none=True)
        mp(loss, optimizer)
        step.set_count(len(images))
        step.log(loss=loss.detach(), **{k: v.detach() for k, v in losses.items()})
