"""The mnist and fake_imagenet builders: real readers, idempotence, determinism."""

import hashlib

import pytest

from milarun.datasets import STAMP, fake_imagenet, prepare, resolve_params


def _quiet(*args):
    pass


def _digest(folder):
    """sha256 over every file's relative path and bytes, stamp excluded."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != STAMP):
        h.update(str(path.relative_to(folder)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    prepare("mnist", root, size="tiny", log=_quiet)
    prepare("fake_imagenet", root, size="tiny", log=_quiet)
    return root


def test_mnist_reads_back_through_torchvision(built):
    from torchvision.datasets import MNIST

    params = resolve_params("mnist", "tiny")[1]
    folder = built / "mnist"
    assert sorted(p.name for p in (folder / "MNIST" / "raw").iterdir()) == [
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
    ]
    train = MNIST(root=str(folder), train=True, download=False)
    test = MNIST(root=str(folder), train=False, download=False)
    assert len(train) == params["count"] and len(test) == params["test_count"]
    assert tuple(train.data.shape) == (params["count"], 28, 28)
    assert str(train.data.dtype) == "torch.uint8"
    assert set(train.targets.tolist()) == set(range(10))
    img, label = train[0]
    assert img.size == (28, 28) and img.mode == "L" and 0 <= label <= 9
    # Digits, not blank or saturated images: some ink, mostly background.
    ink = (train.data > 64).float().mean().item()
    assert 0.05 < ink < 0.5


def test_fake_imagenet_reads_back_through_imagefolder(built):
    from torchvision.datasets import ImageFolder

    params = resolve_params("fake_imagenet", "tiny")[1]
    train = ImageFolder(str(built / "fake_imagenet" / "train"))
    val = ImageFolder(str(built / "fake_imagenet" / "val"))
    assert len(train) == params["count"] and len(val) == params["val_count"]
    assert train.classes == [fake_imagenet.class_name(c) for c in range(params["classes"])]
    per_class = [0] * params["classes"]
    for _, label in train.samples:
        per_class[label] += 1
    assert per_class == [params["count"] // params["classes"]] * params["classes"]
    img, _ = train[5]
    assert img.mode == "RGB" and min(img.size) == params["image_size"]
    import os

    for path, label in train.samples:
        assert path.endswith(".jpg")
        assert int(os.path.basename(path)[:-4]) % params["classes"] == label


@pytest.mark.parametrize("name", ["mnist", "fake_imagenet"])
def test_second_prepare_skips(tmp_path, name):
    messages = []
    folder = prepare(name, tmp_path, size="tiny", log=messages.append)
    first = {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}
    folder2 = prepare(name, tmp_path, size="tiny", log=messages.append)
    assert folder2 == folder
    assert "skipped" in messages[-1]
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()} == first


@pytest.mark.parametrize("name", ["mnist", "fake_imagenet"])
def test_half_written_build_is_rebuilt(tmp_path, name):
    folder = prepare(name, tmp_path, size="tiny", log=_quiet)
    digest = _digest(folder)
    # An interrupted build: the stamp is missing and a file is truncated.
    (folder / STAMP).unlink()
    victim = next(p for p in sorted(folder.rglob("*")) if p.is_file())
    victim.write_bytes(b"")
    messages = []
    prepare(name, tmp_path, size="tiny", log=messages.append)
    assert any("rebuilding" in m for m in messages)
    assert (folder / STAMP).exists() and _digest(folder) == digest
    # A leftover .partial folder from a killed build is thrown away.
    shutil_partial = tmp_path / f"{name}.partial"
    shutil_partial.mkdir()
    (shutil_partial / "junk").write_text("x")
    (folder / STAMP).unlink()
    prepare(name, tmp_path, size="tiny", log=_quiet)
    assert not shutil_partial.exists() and _digest(folder) == digest


@pytest.mark.parametrize("name", ["mnist", "fake_imagenet"])
def test_same_seed_same_bytes(tmp_path, name):
    a = prepare(name, tmp_path / "a", size="tiny", seed=3, log=_quiet)
    b = prepare(name, tmp_path / "b", size="tiny", seed=3, log=_quiet)
    c = prepare(name, tmp_path / "c", size="tiny", seed=4, log=_quiet)
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)


def test_fake_imagenet_parallel_build_matches_serial(tmp_path):
    params = {"count": 12, "val_count": 4, "classes": 3, "image_size": 32, "quality": 80}
    fake_imagenet.build(tmp_path / "serial", params, seed=7, processes=1)
    fake_imagenet.build(tmp_path / "parallel", params, seed=7, processes=2)
    assert _digest(tmp_path / "serial") == _digest(tmp_path / "parallel")
