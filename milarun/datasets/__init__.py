"""Dataset builders that write real on-disk formats.

Each builder module defines:

* ``SIZES``: ``{"tiny": {param: value}, "standard": {...}}``, parameter
  presets (e.g. ``count``, ``image_size``); ``tiny`` is for tests on CPU,
  ``standard`` for GPU runs.
* ``build(root: Path, params: dict, seed: int)``: writes the dataset in its
  real on-disk layout into ``root``, deterministically from ``seed``.
* ``VERSION`` (optional int): bump it when the layout changes.

``prepare(name, dataroot, size, seed)`` makes builds idempotent and safe to
interrupt: it writes into ``<name>.partial/``, then writes a ``.complete``
stamp (name, size, seed, builder version) and renames the folder to
``<name>/``. A later call skips a dataset whose stamp matches, and rebuilds
one whose stamp is missing or differs (a half-written build).
"""

import importlib
import json
import shutil
import time
from pathlib import Path

from ..errors import MilarunError
from ..jsonfile import read_json

#: Largest build stamp read (bytes); a stamp is a few hundred.
MAX_STAMP_BYTES = 2**20

# name → module under milarun.datasets (imported only when built)
BUILDERS = {
    "mnist": "mnist",                  # mnist/MNIST/raw/*-ubyte (torchvision MNIST)
    "fake_imagenet": "fake_imagenet",  # fake_imagenet/train/<class>/*.jpg (ImageFolder)
    "bsds500": "bsds500",              # bsds500/BSR/BSDS500/data/images/{train,val,test}/*.jpg
    "coco": "coco",                    # coco/train2017/*.jpg, coco/annotations/instances_train2017.json
    "wikitext2": "wikitext2",          # wikitext2/wiki.{train,valid,test}.tokens
    "wmt16": "wmt16",                  # wmt16/ parallel text + shared vocabulary
    "movielens": "movielens",          # movielens/ml-20m/ratings.csv
    "fashion_mnist": "fashion_mnist",  # fashion_mnist/FashionMNIST/raw/*-ubyte (torchvision FashionMNIST)
    "mydataset": "mydataset",          # mydataset/samples/<shard>/<index>.npy + labels.npy (io study)
}

STAMP = ".complete"

#: About how much a ``--size standard`` build takes on disk (MB), measured on the
#: development VM (README, "Datasets"); ``--list-datasets`` shows it.
STANDARD_MB = {"fake_imagenet": 550, "coco": 330, "movielens": 100, "wmt16": 58, "mnist": 55,
               "wikitext2": 11, "bsds500": 20}


def dataset_dir(dataroot, name):
    """Folder that holds dataset ``name`` under ``dataroot``."""
    return Path(dataroot) / name


def require(dataroot, name):
    """Folder of dataset ``name`` for a model to read; raises when it was never built.

    Raises:
        FileNotFoundError: with the command that builds it.
    """
    if dataroot is None:
        raise FileNotFoundError("no dataroot: pass -d DATAROOT or set $MILARUN_DATAROOT")
    folder = dataset_dir(dataroot, name)
    if not (folder / STAMP).exists():
        raise FileNotFoundError(f"dataset {name} is missing or incomplete in {folder}; "
                                f"run: milarun dataset {name} -d {dataroot}")
    return folder


def _builder(name):
    if name not in BUILDERS:
        raise MilarunError(f"unknown dataset {name!r}; known: {', '.join(sorted(BUILDERS))}")
    return importlib.import_module(f"{__name__}.{BUILDERS[name]}")


def resolve_params(name, size, overrides=None):
    """The builder parameters for ``size`` with ``overrides`` applied.

    Raises:
        MilarunError: unknown dataset, size, or parameter.
    """
    mod = _builder(name)
    if size not in mod.SIZES:
        raise MilarunError(f"dataset {name}: unknown size {size!r}; known: {', '.join(mod.SIZES)}")
    params = dict(mod.SIZES[size])
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in params:
            raise MilarunError(f"dataset {name}: no parameter {key!r}; "
                               f"known: {', '.join(sorted(params)) or 'none'}")
        params[key] = value
    return mod, params


def _stamp(name, params, seed, mod):
    return {"name": name, "params": params, "seed": seed,
            "version": getattr(mod, "VERSION", 1)}


def is_complete(dataroot, name, size="tiny", seed=0, overrides=None):
    """True when ``dataroot/name`` holds a finished build with these parameters and seed."""
    mod, params = resolve_params(name, size, overrides)
    stamp = dataset_dir(dataroot, name) / STAMP
    try:    # strict and bounded: a deep, huge or FIFO stamp is "not built", never a hang
        data = read_json(stamp, max_bytes=MAX_STAMP_BYTES)
    except MilarunError:
        return False
    return data == _stamp(name, params, seed, mod)


def disk_mib(folder):
    """Space the files under ``folder`` take on disk (allocated blocks), in MiB."""
    import os

    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total / 2**20


def built(dataroot, name):
    """What ``dataroot`` holds of dataset ``name``: ``(state, MiB on disk or None)``;
    state is the preset it was built with (``"tiny"``, ``"standard"``, ``"custom"``),
    ``"incomplete"`` (a folder without its stamp, or a ``.partial`` build) or
    ``"not built"``."""
    folder = dataset_dir(dataroot, name)
    partial = folder.with_name(folder.name + ".partial")
    if not folder.is_dir():
        return ("incomplete", disk_mib(partial)) if partial.is_dir() else ("not built", None)
    try:
        params = read_json(folder / STAMP, max_bytes=MAX_STAMP_BYTES)["params"]
    except (MilarunError, KeyError, TypeError):
        return "incomplete", disk_mib(folder)
    sizes = _builder(name).SIZES
    preset = next((k for k, v in sizes.items() if v == params), "custom")
    return preset, disk_mib(folder)


def prepare(name, dataroot, size="tiny", seed=0, overrides=None, log=print):
    """Build dataset ``name`` under ``dataroot`` unless a matching build exists.

    Args:
        overrides: builder parameters that replace the size preset's values.

    Returns:
        the dataset folder (Path).

    Raises:
        MilarunError: unknown name, size or parameter.
    """
    mod, params = resolve_params(name, size, overrides)
    final = dataset_dir(dataroot, name)
    if is_complete(dataroot, name, size, seed, overrides):
        log(f"milarun: dataset {name} ({size}) is complete in {final}, skipped")
        return final
    partial = final.with_name(final.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    if final.exists():
        log(f"milarun: dataset {name} in {final} is incomplete or of another size; rebuilding")
    partial.mkdir(parents=True)
    t0 = time.perf_counter()
    mod.build(partial, params, seed)
    (partial / STAMP).write_text(json.dumps(_stamp(name, params, seed, mod)))
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    log(f"milarun: dataset {name} ({size}) built in {final} in {time.perf_counter() - t0:.1f} s")
    return final
