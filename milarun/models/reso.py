"""reso: single-image super-resolution with a sub-pixel CNN (ESPCN-style).

The network maps a low-resolution RGB patch to a patch ``--upscale`` times
larger: three convolutions compute ``3 * upscale**2`` channels at the low
resolution and ``PixelShuffle`` rearranges them into the high-resolution
image. Training minimises the MSE to the original patch.

An item is one high-resolution patch: a BSDS500 JPEG read with PIL, randomly
cropped to ``--crop-size`` pixels, and downscaled (bicubic) by ``--upscale``
to make the input. The model is small, so this workload mostly stresses the
input pipeline (JPEG decoding, cropping, resizing on the CPU, host-to-device
copies); with few loader workers it is CPU-bound.

Data: ``<dataroot>/bsds500/BSR/BSDS500/data/images/train/*.jpg``
(``milarun dataset bsds500``).
"""

from coleo import Option, default, tooled
from PIL import Image
from torch import nn
from torchvision.transforms import RandomCrop
from torchvision.transforms.functional import to_tensor

from ..bench import data_loader, dataloop, init_torch
from ..bench.options import batch_size_option, lr_option, precision_option, workers_option
from ..bench.step import MixedPrecisionStep, make_optimizer
from ..datasets import require
from ..datasets.bsds500 import images_dir


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.reso:main -- ARGS``.

    Trains the sub-pixel network on random patches of the bsds500 training
    images until ``--max-count`` patches were processed.
    """
    exp.cli(train, argv)


class PatchDataset:
    """Random HR/LR patch pairs from a folder of JPEG images.

    ``dataset[i]`` reads image ``i`` with PIL, crops a random ``crop`` × ``crop``
    patch (padding images smaller than that), and returns
    ``(lr, hr)`` float tensors in [0, 1] of shapes ``(3, crop/upscale, crop/upscale)``
    and ``(3, crop, crop)``.
    """

    def __init__(self, files, crop, upscale, repeat=1):
        self.files = list(files)
        self.crop = crop
        self.upscale = upscale
        self.repeat = max(1, repeat)

    def __len__(self):
        return len(self.files) * self.repeat

    def __getitem__(self, index):
        path = self.files[index % len(self.files)]
        with Image.open(path) as img:
            img = img.convert("RGB")
        hr = RandomCrop(self.crop, pad_if_needed=True, padding_mode="reflect")(img)
        small = self.crop // self.upscale
        lr = hr.resize((small, small), Image.Resampling.BICUBIC)
        return to_tensor(lr), to_tensor(hr)


def espcn(upscale, features=64, channels=3):
    """The sub-pixel convolutional network (Shi et al., 2016)."""
    half = max(1, features // 2)
    return nn.Sequential(
        nn.Conv2d(channels, features, 5, padding=2),
        nn.Tanh(),
        nn.Conv2d(features, half, 3, padding=1),
        nn.Tanh(),
        nn.Conv2d(half, channels * upscale**2, 3, padding=1),
        nn.PixelShuffle(upscale),
    )


@tooled
def train(exp):
    batch_size = batch_size_option(default=64)
    # Side of the high-resolution patch, in pixels (rounded down to a multiple of --upscale)
    crop_size: Option & int = default(128)
    # Upscaling factor
    upscale: Option & int = default(2)
    # Channels of the first convolution (the second has half as many)
    features: Option & int = default(64)
    lr = lr_option(default=0.001)
    # Times each image is visited per epoch (one random patch each time)
    patches_per_image: Option & int = default(8)
    workers = workers_option(default=-1)
    precision = precision_option(default="fp32")

    device = init_torch(exp)
    mp = MixedPrecisionStep(device, precision)
    autocast = mp.autocast
    if upscale < 1 or crop_size < upscale:
        raise ValueError("--upscale must be >= 1 and --crop-size >= --upscale")
    crop = crop_size - crop_size % upscale

    folder = images_dir(require(exp.dataroot, "bsds500")) / "train"
    files = sorted(folder.glob("*.jpg"))
    if not files:
        raise FileNotFoundError(f"no JPEG image in {folder}")
    dataset = PatchDataset(files, crop, upscale, repeat=patches_per_image)
    loader = data_loader(dataset, batch_size, workers, device)

    model = espcn(upscale, features).to(device)
    optimizer = make_optimizer("Adam", model.parameters(), device, lr=lr)
    criterion = nn.MSELoss()

    for step, (lr_img, hr_img) in dataloop(exp, loader):
        lr_img = lr_img.to(device, non_blocking=True)
        hr_img = hr_img.to(device, non_blocking=True)
        with autocast:
            out = model(lr_img)
            loss = criterion(out.float(), hr_img)
        optimizer.zero_grad(set_to_none=True)
        mp(loss, optimizer)
        step.set_count(len(hr_img))
        step.log(loss=loss.detach())
