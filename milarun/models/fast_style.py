"""fast_style: fast neural style transfer (Johnson et al., 2016).

A feed-forward *transformer network* (9×9 convolution, two stride-2
convolutions, ``--res-blocks`` residual blocks, two upsampling convolutions,
9×9 output convolution, instance norm throughout) is trained to restyle
images. Its loss is a perceptual loss computed by a frozen VGG16: a content
loss on ``relu2_2`` features and a style loss on the Gram matrices of
``relu1_2``, ``relu2_2``, ``relu3_3`` and ``relu4_3`` against one style image.

No pretrained weights can be downloaded, so the VGG16 (its convolutional
trunk up to ``relu4_3``, laid out and initialised like torchvision's
``vgg16(weights=None).features``) is **randomly initialised**: the compute
and memory traffic are those of the real workload, the stylisation is not
meaningful.

An item is one content image: a fake_imagenet JPEG read by
``torchvision.datasets.ImageFolder`` (PIL), resized and centre-cropped to
``--image-size``. The style image is the first file of the data set. This
workload stresses convolution compute (VGG16 forward and backward at full
resolution dominates) and activation memory.

Data: ``<dataroot>/fake_imagenet/train/<class>/*.jpg``
(``milarun dataset fake_imagenet``).
"""

import torch
import torch.nn as nn
import torchvision.transforms as T
from coleo import Option, default, tooled
from PIL import Image
from torchvision.datasets import ImageFolder

from ..bench import data_loader, dataloop, init_torch
from ..bench.options import batch_size_option, lr_option, precision_option, workers_option
from ..bench.step import MixedPrecisionStep, make_optimizer
from ..datasets import require

# Indices in torchvision's vgg16().features after which relu1_2, relu2_2,
# relu3_3 and relu4_3 are computed.
VGG_TAPS = (3, 8, 15, 22)
# VGG16 ("configuration D") convolution widths up to conv4_3, "M" = 2×2 max pool.
VGG16_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.fast_style:main -- ARGS``.

    Trains the transformer network with a (random-weight) VGG16 perceptual
    loss on fake_imagenet until ``--max-count`` content images were processed.
    """
    exp.cli(train, argv)


class ConvLayer(nn.Sequential):
    """Reflection padding + convolution (+ instance norm + ReLU)."""

    def __init__(self, cin, cout, kernel, stride=1, upsample=1, norm=True, relu=True):
        layers = []
        if upsample > 1:
            layers.append(nn.Upsample(scale_factor=upsample, mode="nearest"))
        layers += [nn.ReflectionPad2d(kernel // 2), nn.Conv2d(cin, cout, kernel, stride)]
        if norm:
            layers.append(nn.InstanceNorm2d(cout, affine=True))
        if relu:
            layers.append(nn.ReLU(inplace=True))
        super().__init__(*layers)


class ResidualBlock(nn.Module):
    """``x`` plus two 3×3 :class:`ConvLayer` of it (the second without ReLU)."""

    def __init__(self, channels):
        super().__init__()
        self.body = nn.Sequential(
            ConvLayer(channels, channels, 3), ConvLayer(channels, channels, 3, relu=False)
        )

    def forward(self, x):
        return x + self.body(x)


class TransformerNet(nn.Module):
    """Image → image of the same size, values in [0, 255]."""

    def __init__(self, width=32, res_blocks=5):
        super().__init__()
        w = width
        self.net = nn.Sequential(
            ConvLayer(3, w, 9),
            ConvLayer(w, 2 * w, 3, stride=2),
            ConvLayer(2 * w, 4 * w, 3, stride=2),
            *[ResidualBlock(4 * w) for _ in range(res_blocks)],
            ConvLayer(4 * w, 2 * w, 3, upsample=2),
            ConvLayer(2 * w, w, 3, upsample=2),
            ConvLayer(w, 3, 9, norm=False, relu=False),
        )

    def forward(self, x):
        return self.net(x)


class VGGFeatures(nn.Module):
    """Frozen VGG16 trunk returning relu1_2, relu2_2, relu3_3, relu4_3."""

    def __init__(self):
        super().__init__()
        # The layers of torchvision's vgg16().features up to relu4_3 (same
        # indices, same initialisation), built without the 120M-parameter
        # classifier that vgg16() would allocate and initialise for nothing.
        layers, cin = [], 3
        for v in VGG16_CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                conv = nn.Conv2d(cin, v, 3, padding=1)
                nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(conv.bias)
                layers += [conv, nn.ReLU(inplace=True)]
                cin = v
        features = nn.Sequential(*layers[: VGG_TAPS[-1] + 1])
        for p in features.parameters():
            p.requires_grad_(False)
        self.features = features.eval()
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255)

    def forward(self, x):
        x = (x - self.mean) / self.std
        out = []
        for i, layer in enumerate(self.features):
            x = layer(x)
            if i in VGG_TAPS:
                out.append(x)
        return out


def gram(x):
    """Gram matrix of ``(N, C, H, W)`` features, normalised by ``C*H*W``."""
    n, c, h, w = x.shape
    f = x.reshape(n, c, h * w)
    return f.bmm(f.transpose(1, 2)) / (c * h * w)


@tooled
def train(exp):
    batch_size = batch_size_option(default=4)
    # Side of the (square) training images, in pixels
    image_size: Option & int = default(256)
    # Channels of the transformer network's first layer (x2, x4 after downsampling)
    width: Option & int = default(32)
    # Residual blocks of the transformer network
    res_blocks: Option & int = default(5)
    # Weight of the content loss
    content_weight: Option & float = default(1e5)
    # Weight of the style loss
    style_weight: Option & float = default(1e10)
    lr = lr_option(default=0.001)
    workers = workers_option(default=-1)
    precision = precision_option(default="fp32")

    device = init_torch(exp)
    mp = MixedPrecisionStep(device, precision)
    autocast = mp.autocast

    root = require(exp.dataroot, "fake_imagenet") / "train"
    transform = T.Compose(
        [
            T.Resize(image_size),
            T.CenterCrop(image_size),
            T.PILToTensor(),
        ]
    )
    dataset = ImageFolder(str(root), transform=transform)
    loader = data_loader(dataset, batch_size, workers, device)

    model = TransformerNet(width, res_blocks).to(device)
    vgg = VGGFeatures().to(device)
    optimizer = make_optimizer("Adam", model.parameters(), device, lr=lr)
    mse = torch.nn.MSELoss()

    # The style image: the first file of the data set, at the training size.
    with Image.open(dataset.samples[0][0]) as img:
        style = transform(img.convert("RGB")).float().unsqueeze(0).to(device)
    with torch.no_grad(), autocast:
        style_grams = [gram(f.float()) for f in vgg(style)]

    for step, (content, _) in dataloop(exp, loader):
        x = content.to(device, non_blocking=True).float()
        n = x.shape[0]
        with autocast:
            y = model(x)
            feats_y = vgg(y)
            with torch.no_grad():
                feats_x = vgg(x)
            content_loss = content_weight * mse(feats_y[1].float(), feats_x[1].float())
            style_loss = sum(
                mse(gram(fy.float()), g.expand(n, -1, -1)) for fy, g in zip(feats_y, style_grams)
            )
            loss = content_loss + style_weight * style_loss
        optimizer.zero_grad(set_to_none=True)
        mp(loss, optimizer)
        step.set_count(n)
        step.log(
            loss=loss.detach(), content_loss=content_loss.detach(), style_loss=style_loss.detach()
        )
