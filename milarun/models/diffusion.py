"""diffusion: latent-diffusion training of a text-to-image UNet, as Stable Diffusion trains.

The model is built with ``diffusers`` and ``transformers`` from configs, with
random weights (nothing is downloaded):

* the denoiser, a ``UNet2DConditionModel`` (trained): ``--shape sd2`` is
  Stable Diffusion 2's UNet (the values of ``stabilityai/stable-diffusion-2-base``'s
  ``unet/config.json`` written out in :data:`SHAPES`: 865M parameters, blocks of
  320/640/1280/1280 channels, linear-projection cross-attention to 1,024-wide
  text states, 64-wide heads); ``tiny`` is a 2-block one for CPU tests;
* a frozen ``AutoencoderKL`` (SD 2's VAE: 4 latent channels, 8× down-sampling,
  scaling factor 0.18215): its encoder turns each image into latents;
* a frozen text encoder, ``transformers``' ``CLIPTextModel`` from a
  ``CLIPTextConfig`` with SD 2's OpenCLIP ViT-H/14 text tower (1,024 wide, 23
  layers: SD 2 takes the penultimate of 24, 16 heads, 77 positions), over the
  ``captions`` dataset's word-level vocabulary (not CLIP's 49,408 BPE entries:
  see :mod:`milarun.datasets.captions`);
* ``DDPMScheduler`` with SD's scaled-linear schedule of 1,000 steps: every
  image gets Gaussian noise at a uniformly drawn timestep, and the UNet learns
  to predict the noise (``--prediction epsilon``, SD 2-base) or the velocity
  (``v_prediction``, SD 2's 768-px model).

Each step: encode the images (VAE, no gradient) and the captions (text
encoder, no gradient), noise the latents, predict, mean-squared error against
the target in fp32, AdamW (fused on CUDA/XPU, weight decay 0.01, gradients
clipped to norm 1, as diffusers' ``train_text_to_image.py``). ``--precision
bf16|fp16`` runs the UNet under ``torch.autocast`` (fp32 master weights; a
gradient scaler for fp16 on GPUs) and holds the two frozen models in that
dtype, as diffusers' script does. ``--activation-checkpointing`` recomputes
the UNet's blocks in the backward pass.

``--precomputed``: the common practice of encoding the data set once, so
that only the UNet is measured. Before the measured loop, the first
``--precompute-count`` images of this rank's share are read, encoded by the
VAE and the text encoder, and **kept in device memory** (fp32 latents and
text states: ~0.4 MB an image at 512 px with SD 2's shapes, 0.4 GB for the
default 1,024; nothing is written to disk). The loop then draws shuffled
batches of them, with fresh noise and timesteps every step; the frozen
models are freed.

Data: ``fake_imagenet``'s JPEGs (``milarun dataset fake_imagenet``),
resized to ``--image-size`` (shorter side), randomly cropped to a square and
flipped, in ``DataLoader`` workers, each with its caption from the
``captions`` dataset (``milarun dataset captions``, same ``--size``),
tokenized in the workers to 77 ids. Only the captioned images are used.

Parallelism: one process per GPU (``per-gpu``), or under torchrun
(``njobs``, ``multi-node``) data-parallel with DDP: each rank reads its
share (``DistributedSampler``) and the gradients are all-reduced every step.
An **item is one image** of the global batch: each step counts
``batch_size × world_size``. Metrics: ``shape``, ``unet_params``,
``image_size``, ``latent_size``, ``prediction``, ``precomputed``,
``global_batch``, ``world_size``. Stresses: convolutions and attention at
high resolution (tensor cores, HBM bandwidth, activation memory), plus the
frozen encoders' inference, plus JPEG decoding at 512 px.
"""

import os

import torch
from coleo import Option, default, tooled
from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
from PIL import Image
from tokenizers import Tokenizer
from torchvision import transforms
from transformers import CLIPTextConfig, CLIPTextModel

from ..bench import Epochs, dataloop, init_torch, rank_loader
from ..bench.distributed import agree_on_counts, process_group, wrap_ddp
from ..bench.options import (
    backend_option,
    batch_size_option,
    lr_option,
    precision_option,
    workers_option,
)
from ..bench.step import MixedPrecisionStep, make_optimizer
from ..bench.xpu import DDP_NOT_WIRED, refuse_xpu
from ..datasets import require
from ..datasets.captions import MAX_LENGTH, read_captions

#: ``--shape``: the UNet, VAE and text-encoder configurations.
SHAPES = {
    # Stable Diffusion 2 (stabilityai/stable-diffusion-2-base): unet/, vae/, text_encoder/
    "sd2": {
        "unet": {
            "sample_size": 64,
            "in_channels": 4,
            "out_channels": 4,
            "center_input_sample": False,
            "flip_sin_to_cos": True,
            "freq_shift": 0,
            "down_block_types": (
                "CrossAttnDownBlock2D",
                "CrossAttnDownBlock2D",
                "CrossAttnDownBlock2D",
                "DownBlock2D",
            ),
            "up_block_types": (
                "UpBlock2D",
                "CrossAttnUpBlock2D",
                "CrossAttnUpBlock2D",
                "CrossAttnUpBlock2D",
            ),
            "block_out_channels": (320, 640, 1280, 1280),
            "layers_per_block": 2,
            "downsample_padding": 1,
            "mid_block_scale_factor": 1,
            "act_fn": "silu",
            "norm_num_groups": 32,
            "norm_eps": 1e-5,
            "cross_attention_dim": 1024,
            # diffusers' name; SD 2's config gives the heads per block (64-wide heads)
            "attention_head_dim": (5, 10, 20, 20),
            "use_linear_projection": True,
            "upcast_attention": False,
            "dual_cross_attention": False,
            "only_cross_attention": False,
        },
        "vae": {
            "in_channels": 3,
            "out_channels": 3,
            "latent_channels": 4,
            "down_block_types": ("DownEncoderBlock2D",) * 4,
            "up_block_types": ("UpDecoderBlock2D",) * 4,
            "block_out_channels": (128, 256, 512, 512),
            "layers_per_block": 2,
            "act_fn": "silu",
            "norm_num_groups": 32,
            "sample_size": 512,
            "scaling_factor": 0.18215,
        },
        "text": {
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_hidden_layers": 23,
            "num_attention_heads": 16,
            "hidden_act": "gelu",
            "layer_norm_eps": 1e-5,
            "projection_dim": 512,
        },
    },
    # CPU tests: the same architecture, two levels, narrow
    "tiny": {
        "unet": {
            "sample_size": 16,
            "in_channels": 4,
            "out_channels": 4,
            "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"),
            "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"),
            "block_out_channels": (32, 64),
            "layers_per_block": 1,
            "norm_num_groups": 8,
            "cross_attention_dim": 32,
            "attention_head_dim": (2, 4),
            "use_linear_projection": True,
        },
        "vae": {
            "in_channels": 3,
            "out_channels": 3,
            "latent_channels": 4,
            "down_block_types": ("DownEncoderBlock2D",) * 2,
            "up_block_types": ("UpDecoderBlock2D",) * 2,
            "block_out_channels": (16, 32),
            "layers_per_block": 1,
            "norm_num_groups": 8,
            "sample_size": 32,
            "scaling_factor": 0.18215,
        },
        "text": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "hidden_act": "gelu",
            "layer_norm_eps": 1e-5,
            "projection_dim": 32,
        },
    },
}
PREDICTIONS = ("epsilon", "v_prediction")
#: SD's noise schedule (scheduler/scheduler_config.json).
SCHEDULE = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "clip_sample": False,
}


#: Its loss must fall (milarun.bench.experiment.loss_declaration).
LOSS_MUST_FALL = "the captioned fake_imagenet images have structure, so the denoising loss falls"


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.diffusion:main -d DATAROOT -- ARGS``, or
    under torchrun for DDP. Needs datasets ``fake_imagenet`` and ``captions``. Items are
    images (of the global batch)."""
    exp.cli(train, argv)


def check_options(shape, prediction, image_size):
    """Raise ``ValueError`` (one line) for an unknown shape or prediction, or an image
    size the VAE and UNet cannot divide; return the latent size."""
    if shape not in SHAPES:
        raise ValueError(f"--shape must be one of {', '.join(SHAPES)}, not {shape!r}")
    if prediction not in PREDICTIONS:
        raise ValueError(
            f"--prediction must be one of {', '.join(PREDICTIONS)}, not {prediction!r}"
        )
    cfg = SHAPES[shape]
    vae_factor = 2 ** (len(cfg["vae"]["block_out_channels"]) - 1)
    unet_factor = 2 ** (len(cfg["unet"]["block_out_channels"]) - 1)
    if image_size < 1 or image_size % (vae_factor * unet_factor):
        raise ValueError(
            f"--image-size must be a positive multiple of "
            f"{vae_factor * unet_factor} for --shape {shape}, not {image_size}"
        )
    return image_size // vae_factor


class CaptionedImages:
    """The captioned images: ``(image [3, S, S] in [-1, 1], token ids [77])`` per item.

    Images are read with PIL, resized (shorter side) to ``image_size``, randomly
    cropped to a square and flipped; captions are tokenized by the dataset's
    ``tokenizer.json`` (loaded in each worker on first use).

    Raises:
        ValueError: a captioned image is not in ``image_root``.
    """

    def __init__(self, image_root, items, tokenizer_path, image_size):
        self.root, self.items, self.tokenizer_path = image_root, items, str(tokenizer_path)
        for rel, _ in (items[0], items[-1]):
            if not (image_root / rel).is_file():
                raise ValueError(
                    f"{image_root / rel}: a captioned image is missing; build "
                    f"fake_imagenet and captions with the same --size/--count"
                )
        self.transform = transforms.Compose(
            [
                transforms.Resize(image_size),
                transforms.RandomCrop(image_size),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                transforms.Normalize([0.5], [0.5]),
            ]
        )
        self._tok = None

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        if self._tok is None:
            self._tok = Tokenizer.from_file(self.tokenizer_path)
        rel, text = self.items[i]
        with Image.open(self.root / rel) as im:
            x = self.transform(im.convert("RGB"))
        ids = torch.tensor(self._tok.encode(text).ids, dtype=torch.long)
        return x, ids


def build_models(shape, meta, device):
    """``(unet, vae, text_encoder)`` of ``shape``, random weights, on ``device``; the
    VAE and the text encoder frozen (``eval``, no gradients). ``meta``: the captions'
    ``meta.json`` (vocabulary size, start and end ids)."""
    cfg = SHAPES[shape]
    unet = UNet2DConditionModel(**cfg["unet"]).to(device)
    vae = AutoencoderKL(**cfg["vae"]).to(device)
    text = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=meta["vocab_size"],
            max_position_embeddings=MAX_LENGTH,
            bos_token_id=meta["bos_id"],
            eos_token_id=meta["eos_id"],
            pad_token_id=meta["eos_id"],
            **cfg["text"],
        )
    ).to(device)
    for frozen in (vae, text):
        frozen.requires_grad_(False)
        frozen.eval()
    return unet, vae, text


@tooled
def train(exp):
    # Model shape: sd2 (Stable Diffusion 2's UNet, VAE and text encoder) or tiny (CPU tests)
    shape: Option = default("sd2")
    # Side of the square training images, in pixels (latents are 8x smaller with sd2)
    image_size: Option & int = default(512)
    batch_size = batch_size_option(default=8)  # images per rank
    precision = precision_option(default="bf16")
    lr = lr_option(default=1e-4)
    # What the UNet predicts: epsilon (the noise) or v_prediction (the velocity)
    prediction: Option = default("epsilon")
    # Encode images and captions once at start (kept in device memory) and train the UNet alone
    precomputed: Option & bool = default(False)
    # Images encoded by --precomputed, per rank
    precompute_count: Option & int = default(1024)
    # Recompute the UNet's activations in the backward pass
    activation_checkpointing: Option & bool = default(False)
    workers = workers_option(default=-1)
    backend = backend_option()

    latent_size = check_options(shape, prediction, image_size)
    if batch_size < 1 or precompute_count < 1:
        raise ValueError("--batch-size and --precompute-count must be at least 1")
    device = init_torch(exp)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # one XPU per process only
        refuse_xpu(device, "diffusion under torchrun", DDP_NOT_WIRED)
    images = require(exp.dataroot, "fake_imagenet")
    captions = require(exp.dataroot, "captions")
    with process_group(exp, device, backend) as world:
        device = world.device
        meta, items = read_captions(captions)
        dataset = CaptionedImages(images, items, captions / "tokenizer.json", image_size)
        loader = rank_loader(
            dataset,
            batch_size,
            workers,
            device,
            world,
            exp.options["seed"],
            "captioned images",
            hint="lower --batch-size or build larger fake_imagenet and captions",
        )

        unet, vae, text = build_models(shape, meta, device)
        exp.metrics.update(
            {
                "shape": shape,
                "unet_params": sum(p.numel() for p in unet.parameters()),
                "image_size": image_size,
                "latent_size": latent_size,
                "prediction": prediction,
                "precomputed": precomputed,
                "global_batch": batch_size * world.size,
                "world_size": world.size,
                "parallelism": "ddp" if world.size > 1 else "none",
            }
        )
        mp = MixedPrecisionStep(device, precision)
        encode = FrozenEncoders(vae, text, precision, device)
        if precomputed:
            batches = _precompute(exp, loader, encode, precompute_count, batch_size)
            del encode, vae, text  # the frozen models are freed
        else:
            batches = Epochs(loader)

        if activation_checkpointing:
            unet.enable_gradient_checkpointing()
        unet.train()
        net = wrap_ddp(unet, device) if world.size > 1 else unet
        optimizer = make_optimizer(
            "AdamW",
            unet.parameters(),
            device,
            lr=lr,
            betas=(0.9, 0.999),
            weight_decay=1e-2,
            eps=1e-8,
        )
        scheduler = DDPMScheduler(prediction_type=prediction, **SCHEDULE)
        steps_total = scheduler.config.num_train_timesteps

        steps = dataloop(exp, batches)
        agree_on_counts(exp, world)
        for step, batch in steps:
            latents, states = batch if precomputed else encode(*batch)
            noise = torch.randn_like(latents)
            t = torch.randint(0, steps_total, (latents.shape[0],), device=device)
            noisy = scheduler.add_noise(latents, noise, t)
            target = noise if prediction == "epsilon" else scheduler.get_velocity(latents, noise, t)
            with mp.autocast:
                pred = net(noisy, t, encoder_hidden_states=states).sample
            loss = torch.nn.functional.mse_loss(pred.float(), target.float())
            mp.backward(loss)
            mp.step(optimizer, clip_norm=1.0, params=unet.parameters())
            mp.update()
            optimizer.zero_grad(set_to_none=True)
            step.set_count(latents.shape[0] * world.size)
            step.log(loss=loss.detach())


class FrozenEncoders:
    """The frozen VAE and text encoder: ``encode(images, ids)`` is ``(latents, text
    states)`` in fp32 on ``device``, without gradients. With ``precision`` bf16 or fp16
    both models are held in that dtype (they only run inference)."""

    def __init__(self, vae, text, precision, device):
        half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        if half is not None:
            vae.to(half)
            text.to(half)
        self.vae, self.text, self.device = vae, text, device
        self.dtype = half or torch.float32
        self.scaling = vae.config.scaling_factor

    @torch.no_grad()
    def __call__(self, x, ids):
        x = x.to(self.device, non_blocking=True).to(self.dtype)
        ids = ids.to(self.device, non_blocking=True)
        latents = self.vae.encode(x).latent_dist.sample() * self.scaling
        states = self.text(input_ids=ids).last_hidden_state
        return latents.float(), states.float()


def _precompute(exp, loader, encode, count, batch_size):
    """Encode the first ``count`` images of this rank's share (at least one batch);
    return an iterable of shuffled ``(latents, states)`` batches over them, on the
    device."""
    loader.sampler.set_epoch(0)
    latents, states, n = [], [], 0
    for x, ids in loader:
        lat, st = encode(x, ids)
        latents.append(lat)
        states.append(st)
        n += len(lat)
        if n >= count:
            break
    latents, states = (
        torch.cat(latents)[: max(count, batch_size)],
        torch.cat(states)[: max(count, batch_size)],
    )
    exp.metrics["precomputed_images"] = len(latents)
    return _Precomputed(latents, states, batch_size, exp.options["seed"])


class _Precomputed:
    """Shuffled batches of precomputed ``(latents, states)``, a new order every pass."""

    def __init__(self, latents, states, batch_size, seed):
        self.latents, self.states, self.batch_size = latents, states, batch_size
        self.gen = torch.Generator().manual_seed(seed)

    def __iter__(self):
        order = torch.randperm(len(self.latents), generator=self.gen).to(self.latents.device)
        for i in range(len(order) // self.batch_size):
            idx = order[i * self.batch_size : (i + 1) * self.batch_size]
            yield self.latents[idx], self.states[idx]
