"""txt2img: text-to-image generation with the diffusion workload's models (inference).

The same models as :mod:`milarun.models.diffusion` (``--shape sd2``: Stable
Diffusion 2's UNet, VAE and CLIP-shaped text encoder, built from configs with
random weights), generating images as a Stable Diffusion pipeline does:

1. the batch's prompts (captions of the ``captions`` dataset, tokenized to 77
   ids) and as many empty prompts go through the text encoder;
2. latents start as Gaussian noise and are denoised in ``--steps`` steps of
   SD's DDIM scheduler (``DDIMScheduler``, scaled-linear betas); each step runs
   the UNet once on the conditional and unconditional halves together
   (classifier-free guidance, ``--guidance`` 7.5: a batch of B images is a
   UNet batch of 2B), unless ``--guidance`` is 1 or less;
3. the VAE decoder turns the latents into ``--image-size`` images.

Everything runs in ``torch.inference_mode`` with the weights in
``--precision`` (fp16 by default; bf16, fp32). An **item is one generated
image**: a step of the rate logger is one whole batch (all its denoising
steps and the decode), counted as ``batch_size`` images. ``metrics``:
``seconds_per_image`` (steady-state seconds per image at this batch size),
``denoising_steps``, ``guidance``, ``unet_batch``, ``image_shape``
(``CxHxW``), ``images_finite``. The weights are random, so the images are
noise: the cost is the real one. Stresses: the UNet's
convolutions and attention at small batch (tensor cores, HBM bandwidth), the
VAE decoder at full resolution, kernel-launch overhead between the steps.

Needs the ``captions`` dataset (``milarun dataset captions``) for its prompts
and tokenizer.
"""

import torch
from coleo import Option, default, tooled
from diffusers import DDIMScheduler
from tokenizers import Tokenizer

from ..bench import init_torch, iteration_wrapper
from ..bench.options import INFERENCE_PRECISIONS, batch_size_option, precision_option
from ..datasets import require
from ..datasets.captions import read_captions
from ..measure.stats import steady_state
from .diffusion import SCHEDULE, build_models, check_options

NO_LOSS = "txt2img generates images; nothing is trained"

#: The weights' dtype of each ``--precision``.
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.txt2img:main -d DATAROOT -- ARGS``.
    Needs dataset ``captions``. Items are generated images."""
    exp.cli(generate, argv)


class Pipeline:
    """Stable Diffusion's sampling (module docstring): ``batch_size`` prompts through the
    text encoder, latents denoised by the UNet under the DDIM ``scheduler``, decoded by
    the VAE into images in [0, 1].

    The unconditional prompts of classifier-free guidance (empty ones) are tokenized
    and copied to the device once, here.
    """

    def __init__(self, tok, text, unet, vae, scheduler, batch_size):
        self.tok, self.text, self.unet, self.vae = tok, text, unet, vae
        self.scheduler = scheduler
        weight = next(unet.parameters())
        self.device, self.dtype = weight.device, weight.dtype
        self.empty = torch.tensor([tok.encode("").ids] * batch_size, device=self.device)

    @torch.inference_mode()
    def __call__(self, prompts, steps, guidance, latent_size):
        """Images ``(batch_size, 3, H, W)`` for ``prompts`` (``batch_size`` texts) after
        ``steps`` denoising steps, guided when ``guidance`` is above 1."""
        unet, scheduler, device = self.unet, self.scheduler, self.device
        guided = guidance > 1.0
        ids = torch.tensor([e.ids for e in self.tok.encode_batch(prompts)], device=device)
        states = self.text(input_ids=torch.cat([ids, self.empty]) if guided else ids)
        states = states.last_hidden_state
        latents = torch.randn(
            len(prompts),
            unet.config.in_channels,
            latent_size,
            latent_size,
            device=device,
            dtype=self.dtype,
        )
        scheduler.set_timesteps(steps, device=device)
        for t in scheduler.timesteps:
            x = torch.cat([latents, latents]) if guided else latents
            noise = unet(x, t, encoder_hidden_states=states).sample
            if guided:
                cond, uncond = noise.chunk(2)
                noise = uncond + guidance * (cond - uncond)
            latents = scheduler.step(noise, t, latents).prev_sample
        images = self.vae.decode(latents / self.vae.config.scaling_factor).sample
        return (images / 2 + 0.5).clamp(0, 1)


@tooled
def generate(exp):
    # Model shape: sd2 (Stable Diffusion 2's UNet, VAE and text encoder) or tiny (CPU tests)
    shape: Option = default("sd2")
    # Side of the square generated images, in pixels
    image_size: Option & int = default(512)
    batch_size = batch_size_option(default=4)  # images generated together
    precision = precision_option(default="fp16", choices=INFERENCE_PRECISIONS)
    # Denoising steps per image (DDIM)
    steps: Option & int = default(50)
    # Classifier-free guidance scale (1 or less: no unconditional pass)
    guidance: Option & float = default(7.5)
    # What the UNet predicts: epsilon or v_prediction
    prediction: Option = default("epsilon")

    latent_size = check_options(shape, prediction, image_size)
    if batch_size < 1 or not 1 <= steps <= 1000:
        raise ValueError("--batch-size must be at least 1 and --steps from 1 to 1000")
    device = init_torch(exp)
    captions = require(exp.dataroot, "captions")
    meta, items = read_captions(captions)
    tok = Tokenizer.from_file(str(captions / "tokenizer.json"))
    unet, vae, text = build_models(shape, meta, device)
    for model in (unet, vae, text):
        model.to(DTYPES[precision]).eval()
    scheduler = DDIMScheduler(
        prediction_type=prediction, steps_offset=1, set_alpha_to_one=False, **SCHEDULE
    )
    exp.metrics.update(
        {
            "shape": shape,
            "image_size": image_size,
            "latent_size": latent_size,
            "denoising_steps": steps,
            "guidance": guidance,
            "unet_batch": batch_size * (2 if guidance > 1.0 else 1),
            "unet_params": sum(p.numel() for p in unet.parameters()),
        }
    )
    pipe = Pipeline(tok, text, unet, vae, scheduler, batch_size)
    prompt = 0
    for step in iteration_wrapper(exp):
        texts = [items[(prompt + i) % len(items)][1] for i in range(batch_size)]
        prompt += batch_size
        images = pipe(texts, steps, guidance, latent_size)
        step.set_count(batch_size)
    exp.metrics["image_shape"] = "x".join(str(n) for n in images.shape[1:])
    exp.metrics["images_finite"] = bool(torch.isfinite(images).all())
    try:
        rate, _, _ = steady_state(exp.rate.samples)
    except ValueError:  # no steady state: the record says so
        rate = None
    if rate:
        exp.metrics["seconds_per_image"] = 1.0 / rate
