"""diffusion (latent diffusion, diffusers), txt2img (its inference) and vit (timm ViTs) on CPU
at tiny sizes:
the captions dataset and its tokenizer, each workload training for real with a loss that
falls, --precomputed latents with v-prediction, ViT under DDP over 2 gloo ranks, and one
clear error for a bad option."""

import json
import math

import pytest
from conftest import SMOKE_ARGS, build_tiny, run_model
from test_llm import _torchrun

from milarun.datasets.captions import MAX_LENGTH, caption, read_captions

DIFFUSION = "milarun.models.diffusion:main"
VIT = "milarun.models.vit:main"
# A fixed seed and a learning rate at which the tiny models' loss falls within 40 steps (the
# UNet's from ~1 to ~0.3; the ViT's from its random start to chance, ln 4, on 4 classes).
TINY_DIFFUSION = [
    *SMOKE_ARGS,
    "--device",
    "cpu",
    "--seed",
    "7",
    "--shape",
    "tiny",
    "--image-size",
    "16",
    "--batch-size",
    "4",
    "--precision",
    "fp32",
    "--workers",
    "0",
    "--lr",
    "1e-3",
]
TINY_VIT = [
    *SMOKE_ARGS,
    "--device",
    "cpu",
    "--seed",
    "7",
    "--arch",
    "vit_tiny_patch16_224",
    "--image-size",
    "32",
    "--batch-size",
    "8",
    "--precision",
    "fp32",
    "--workers",
    "0",
    "--lr",
    "1e-4",
]


@pytest.fixture(autouse=True)
def one_core(monkeypatch):
    """Run as a one-core CPU student does (the cpu profile's slots): one torch thread, so a
    busy neighbour on the test host slows a step down instead of stalling two spinning
    threads."""
    from milarun.bench import setup

    monkeypatch.setattr(setup, "current_cpuset", lambda: {0})


@pytest.fixture(scope="module")
def root(tiny_dataroot):
    return build_tiny(tiny_dataroot, "fake_imagenet", "captions")


def _losses(res):
    losses = [s["loss"] for s in res["timings"]["train"]["samples"] if "loss" in s]
    assert losses and all(math.isfinite(x) for x in losses)
    return losses


def _falls(losses, k=8):
    """The mean of the last ``k`` windows' losses is below the mean of the first ``k``."""
    assert len(losses) >= 2 * k, losses
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    assert last < first, (first, last, losses)


# --- the captions dataset ----------------------------------------------------------------


def test_captions_cover_fake_imagenet_and_tokenize_to_77_ids(root):
    from tokenizers import Tokenizer

    meta, items = read_captions(root / "captions")
    assert meta["count"] == len(items) == 256 and meta["classes"] == 4
    for rel, _ in items:  # every caption names an existing image
        assert (root / "fake_imagenet" / rel).is_file(), rel
    tok = Tokenizer.from_file(str(root / "captions" / "tokenizer.json"))
    assert tok.get_vocab_size() == meta["vocab_size"]
    ids = tok.encode(items[5][1]).ids
    assert len(ids) == MAX_LENGTH and ids[0] == meta["bos_id"]
    n_words = len(items[5][1].split())
    assert ids[n_words + 1] == meta["eos_id"] and meta["eos_id"] not in ids[1 : n_words + 1]
    assert tok.token_to_id("<|unk|>") not in ids  # a closed vocabulary
    # the class decides the noun and the colour, the index the rest; same seed, same text
    line = json.loads((root / "captions" / "captions.jsonl").read_text().splitlines()[5])
    assert line["label"] == 5 % 4 and line["image"] == "train/n00000001/0000005.jpg"
    assert "green stripes" in items[1][1] and "green stripes" in items[5][1]
    assert len({text for _, text in items}) > 200
    nouns = ["w"] * 4
    assert caption(0, 5, 1, nouns) == caption(0, 5, 1, nouns) != caption(1, 5, 1, nouns)


def test_captions_reader_names_the_bad_file(root, tmp_path):
    import shutil

    folder = tmp_path / "captions"
    shutil.copytree(root / "captions", folder)
    path = folder / "captions.jsonl"
    path.write_text("\n".join(path.read_text().splitlines()[:-1]) + "\n")
    with pytest.raises(ValueError, match=f"^{path}: 255 captions, but meta.json says 256"):
        read_captions(folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="tokenizer.json: the tokenizer is missing"):
        read_captions(folder)


# --- diffusion ----------------------------------------------------------------------------


def test_diffusion_trains_the_unet_and_its_loss_falls(root, tmp_path):
    res = run_model(DIFFUSION, [*TINY_DIFFUSION, "--max-count", "160"], root, tmp_path)
    assert res["success"], res["error"]
    m = res["metrics"]
    assert m["shape"] == "tiny" and m["latent_size"] == 8 and m["prediction"] == "epsilon"
    assert m["parallelism"] == "none" and m["global_batch"] == 4 and not m["precomputed"]
    assert res["timings"]["train"]["count"] == 160  # items are images
    _falls(_losses(res))


def test_diffusion_precomputed_latents_with_v_prediction(root, tmp_path):
    res = run_model(
        DIFFUSION,
        [
            *TINY_DIFFUSION,
            "--max-count",
            "160",
            "--precomputed",
            "--precompute-count",
            "16",
            "--prediction",
            "v_prediction",
        ],
        root,
        tmp_path,
    )
    assert res["success"], res["error"]
    m = res["metrics"]
    assert m["precomputed"] and m["precomputed_images"] == 16
    assert m["prediction"] == "v_prediction"
    _falls(_losses(res))


def test_diffusion_refuses_bad_options(root, tmp_path):
    for argv, message in (
        (["--shape", "sd3"], "--shape must be one of sd2, tiny, not 'sd3'"),
        (["--prediction", "sample"], "--prediction must be one of epsilon"),
        (["--image-size", "18"], "--image-size must be a positive multiple of 4 for --shape tiny"),
    ):
        res = run_model(DIFFUSION, [*TINY_DIFFUSION, *argv], root, tmp_path)
        assert not res["success"] and res["error"]["message"].startswith(message), res["error"]


def test_sd2_shape_is_stable_diffusion_2s_and_its_parts_fit_together():
    # 865,910,724 parameters: Stable Diffusion 2's UNet; the VAE's 83.7M; the text tower's
    # 23 layers of 1,024. Built and run at 512 px on the meta device: no memory, no compute.
    import torch

    from milarun.models.diffusion import build_models

    meta = {"vocab_size": 1053, "bos_id": 0, "eos_id": 1}
    with torch.device("meta"):
        unet, vae, text = build_models("sd2", meta, torch.device("meta"))
        assert sum(p.numel() for p in unet.parameters()) == 865_910_724
        assert sum(p.numel() for p in vae.parameters()) == 83_653_863
        assert sum(p.numel() for p in text.parameters()) == 290_872_320
        latents = vae.encode(torch.randn(2, 3, 512, 512)).latent_dist.sample()
        states = text(input_ids=torch.randint(0, 1053, (2, 77))).last_hidden_state
        assert latents.shape == (2, 4, 64, 64) and states.shape == (2, 77, 1024)
        out = unet(latents, torch.tensor([1, 999]), encoder_hidden_states=states).sample
    assert out.shape == latents.shape


def test_txt2img_generates_images_with_guidance(root, tmp_path):
    argv = [
        *SMOKE_ARGS,
        "--device",
        "cpu",
        "--shape",
        "tiny",
        "--image-size",
        "16",
        "--batch-size",
        "2",
        "--precision",
        "fp32",
        "--steps",
        "4",
        "--max-count",
        "8",
    ]
    res = run_model("milarun.models.txt2img:main", argv, root, tmp_path)
    assert res["success"], res["error"]
    m = res["metrics"]
    assert m["unet_batch"] == 4 and m["denoising_steps"] == 4  # guided: 2 × the batch
    assert m["image_shape"] == "3x16x16" and m["images_finite"]
    assert res["timings"]["train"]["count"] == 8 and m["seconds_per_image"] > 0
    res = run_model("milarun.models.txt2img:main", [*argv, "--steps", "0"], root, tmp_path)
    assert not res["success"] and "--steps from 1 to 1000" in res["error"]["message"]


# --- vit ------------------------------------------------------------------------------


def test_vit_trains_and_its_loss_falls(root, tmp_path):
    res = run_model(VIT, [*TINY_VIT, "--max-count", "320"], root, tmp_path)
    assert res["success"], res["error"]
    m = res["metrics"]
    assert m["arch"] == "vit_tiny_patch16_224" and m["image_size"] == 32
    assert 5_000_000 < m["params"] < 6_000_000 and m["parallelism"] == "none"
    assert res["timings"]["train"]["count"] == 320
    _falls(_losses(res))


def test_vit_refuses_bad_options(root, tmp_path):
    res = run_model(VIT, [*TINY_VIT, "--arch", "vit_huge_patch14_224"], root, tmp_path)
    assert not res["success"]
    assert res["error"]["message"].startswith(
        "--arch must be one of vit_base_patch16_224, vit_large_patch16_224, vit_tiny_patch16_224"
    )
    res = run_model(VIT, [*TINY_VIT, "--image-size", "40"], root, tmp_path)
    assert not res["success"]
    assert "--image-size must be a positive multiple of 16" in res["error"]["message"]


def test_vit_ddp_over_two_ranks(root, tmp_path):
    res = _torchrun(
        VIT, tmp_path / "r.json", [*TINY_VIT, "--batch-size", "4", "--max-count", "96"], root
    )
    m = res["metrics"]
    assert m["parallelism"] == "ddp" and m["world_size"] == 2 and m["global_batch"] == 8
    assert res["timings"]["train"]["count"] == 96  # 12 steps of 2 × 4 images
    _losses(res)


def test_diffusion_ddp_over_two_ranks(root, tmp_path):
    res = _torchrun(
        DIFFUSION,
        tmp_path / "r.json",
        [*TINY_DIFFUSION, "--batch-size", "2", "--max-count", "32"],
        root,
    )
    m = res["metrics"]
    assert m["parallelism"] == "ddp" and m["world_size"] == 2 and m["global_batch"] == 4
    assert res["timings"]["train"]["count"] == 32  # 8 steps of 2 × 2 images
    _losses(res)


@pytest.mark.parametrize("module", ["diffusion", "vit"])
def test_data_parallel_on_xpu_is_refused_in_one_line(module, root, monkeypatch, tmp_path):
    """process_group knows CUDA and the CPU only: every rank would share xpu:0."""
    import importlib

    import torch

    mod = importlib.import_module(f"milarun.models.{module}")

    def fake_init(exp):
        exp.device = torch.device("xpu")
        exp.result["host"]["device_type"] = "xpu"
        return exp.device

    monkeypatch.setattr(mod, "init_torch", fake_init)
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = TINY_DIFFUSION if module == "diffusion" else TINY_VIT
    res = run_model(f"milarun.models.{module}:main", argv, root, tmp_path)
    assert not res["success"] and res["error"]["reason"] == "wrong-device"
    assert res["error"]["message"].startswith(
        f"{module} under torchrun does not run on an Intel XPU: "
    )
