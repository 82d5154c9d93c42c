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
one whose stamp is missing or differs (a half-written build). Two builds of
one dataset (two shells, two nodes on a shared dataroot) take turns on a lock
file ``<dataroot>/.<name>.lock``: the second waits, then finds the first's
build complete. A failed build (read-only or full disk) is one ``SetupError``
line and leaves no stamp.
"""

import contextlib
import errno
import fcntl
import importlib
import json
import os
import shutil
import time
from pathlib import Path

from ..errors import MilarunError, SetupError
from ..formats.jsonfile import read_json

#: Largest build stamp read (bytes); a stamp is a few hundred.
MAX_STAMP_BYTES = 2**20

# name → module under milarun.datasets (imported only when built)
BUILDERS = {
    "mnist": "mnist",  # mnist/MNIST/raw/*-ubyte (torchvision MNIST)
    "fake_imagenet": "fake_imagenet",  # fake_imagenet/train/<class>/*.jpg (ImageFolder)
    "bsds500": "bsds500",  # bsds500/BSR/BSDS500/data/images/{train,val,test}/*.jpg
    "coco": "coco",  # coco/train2017/*.jpg, coco/annotations/instances_train2017.json
    "wikitext2": "wikitext2",  # wikitext2/wiki.{train,valid,test}.tokens
    "wmt16": "wmt16",  # wmt16/ parallel text + shared vocabulary
    "movielens": "movielens",  # movielens/ml-20m/ratings.csv
    # fashion_mnist/FashionMNIST/raw/*-ubyte (torchvision FashionMNIST)
    "fashion_mnist": "fashion_mnist",
    "llm_corpus": "llm_corpus",  # llm_corpus/tokenizer.json, train/shard-*.bin + .idx.npy, prompts/
    "mydataset": "mydataset",  # mydataset/samples/<shard>/<index>.npy + labels.npy (io study)
    "captions": "captions",  # captions/captions.jsonl + tokenizer.json (fake_imagenet's captions)
}

STAMP = ".complete"

#: Bounds of ``--count`` (items) and ``--image-size`` (pixels): an empty dataset is
#: no dataset, and a typo's extra zeros would fill the disk for hours.
OVERRIDE_BOUNDS = {"count": (1, 10_000_000), "image_size": (16, 4096)}
#: Seconds a build waits for another build of the same dataset (``.<name>.lock``).
LOCK_TIMEOUT_S = 3600.0

#: About how much a ``--size standard`` build takes on disk (MB), measured on the
#: development VM (docs/workloads.md, "Datasets"); ``--list-datasets`` shows it.
STANDARD_MB = {
    "fake_imagenet": 550,
    "coco": 330,
    "movielens": 100,
    "wmt16": 58,
    "mnist": 55,
    "wikitext2": 11,
    "bsds500": 20,
    "llm_corpus": 18,
    "captions": 2,
}


class DatasetError(MilarunError, ValueError):
    """A dataset on disk that cannot be used (malformed, truncated, inconsistent, or
    naming files outside its folder): one line, starting with the file's path.

    A :class:`~milarun.errors.MilarunError`, so the child records it as a FAIL and
    prints one line, no traceback (``milarun run --verbose`` shows it); a
    ``ValueError`` for the readers that document one.
    """


class DatasetMissing(MilarunError, FileNotFoundError):
    """A dataset that was never built (or no dataroot): one line with the command
    that builds it; a ``FileNotFoundError`` as :func:`require` documents."""


def dataset_dir(dataroot, name):
    """Folder that holds dataset ``name`` under ``dataroot``."""
    return Path(dataroot) / name


def require(dataroot, name):
    """Folder of dataset ``name`` for a model to read; raises when it was never built.

    Raises:
        DatasetMissing: (a ``FileNotFoundError``) with the command that builds it.
    """
    if dataroot is None:
        raise DatasetMissing("no dataroot: pass -d DATAROOT or set $MILARUN_DATAROOT")
    folder = dataset_dir(dataroot, name)
    if not (folder / STAMP).exists():
        raise DatasetMissing(
            f"dataset {name} is missing or incomplete in {folder}; "
            f"run: milarun dataset {name} -d {dataroot}"
        )
    return folder


def _builder(name):
    if name not in BUILDERS:
        raise MilarunError(f"unknown dataset {name!r}; known: {', '.join(sorted(BUILDERS))}")
    return importlib.import_module(f"{__name__}.{BUILDERS[name]}")


def resolve_params(name, size, overrides=None):
    """The builder parameters for ``size`` with ``overrides`` applied.

    Raises:
        MilarunError: unknown dataset, size, or parameter, or a value out of
            :data:`OVERRIDE_BOUNDS` (or not an integer).
    """
    mod = _builder(name)
    if size not in mod.SIZES:
        raise MilarunError(f"dataset {name}: unknown size {size!r}; known: {', '.join(mod.SIZES)}")
    params = dict(mod.SIZES[size])
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in params:
            raise MilarunError(
                f"dataset {name}: no parameter {key!r}; "
                f"known: {', '.join(sorted(params)) or 'none'}"
            )
        low, high = OVERRIDE_BOUNDS.get(key, (1, 10_000_000))
        if type(value) is not int or not low <= value <= high:
            raise MilarunError(
                f"dataset {name}: --{key.replace('_', '-')} must be an integer "
                f"from {low} to {high:,}, not {value!r}"
            )
        params[key] = value
    return mod, params


def _stamp(name, params, seed, mod):
    return {"name": name, "params": params, "seed": seed, "version": getattr(mod, "VERSION", 1)}


def is_complete(dataroot, name, size="tiny", seed=0, overrides=None):
    """True when ``dataroot/name`` holds a finished build with these parameters and seed."""
    mod, params = resolve_params(name, size, overrides)
    stamp = dataset_dir(dataroot, name) / STAMP
    try:  # strict and bounded: a deep, huge or FIFO stamp is "not built", never a hang
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


@contextlib.contextmanager
def _build_lock(dataroot, name, log, timeout):
    """Hold ``<dataroot>/.<name>.lock`` (``flock``) for one build of ``name``.

    The file is opened with ``O_NOFOLLOW`` (a planted symlink is refused, not
    followed) and never deleted (deleting it would let a third build lock a new
    file while the second holds the old one). Another build holding it: one log
    line, then a wait of at most ``timeout`` seconds.

    Raises:
        SetupError: still held after ``timeout`` s.
        OSError: the lock file cannot be opened (the caller words it).
    """
    path = Path(dataroot) / f".{name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        deadline = None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is None:
                    deadline = time.monotonic() + timeout
                    log(
                        f"milarun: dataset {name}: another build holds {path}; waiting for it "
                        f"(at most {timeout:g} s)"
                    )
                elif time.monotonic() >= deadline:
                    raise SetupError(
                        f"dataset {name}: another build still holds {path} after "
                        f"{timeout:g} s; run this again once it ends"
                    )
                time.sleep(min(0.2, timeout))
        yield
    finally:
        os.close(fd)  # releases the lock


def prepare(name, dataroot, size="tiny", seed=0, overrides=None, log=print, lock_timeout=None):
    """Build dataset ``name`` under ``dataroot`` unless a matching build exists.

    The build runs under the dataset's lock (see :func:`_build_lock`); the
    ``.complete`` stamp is written only once the builder returned, so a failed
    build is rebuilt next time, never used.

    Args:
        overrides: builder parameters that replace the size preset's values.
        lock_timeout: seconds to wait for another build of ``name`` (default
            :data:`LOCK_TIMEOUT_S`).

    Returns:
        the dataset folder (Path).

    Raises:
        MilarunError: unknown name, size or parameter, or parameters the builder
            refuses.
        SetupError: ``dataroot`` is not a folder or cannot be written (read-only,
            full, a symlinked lock file), or another build held the lock too long.
    """
    mod, params = resolve_params(name, size, overrides)
    root = Path(dataroot)
    final = dataset_dir(root, name)
    partial = final.with_name(final.name + ".partial")
    if root.exists() and not root.is_dir():
        raise SetupError("the dataroot is not a folder", path=root)
    timeout = LOCK_TIMEOUT_S if lock_timeout is None else lock_timeout
    try:
        root.mkdir(parents=True, exist_ok=True)
        with _build_lock(root, name, log, timeout):
            if is_complete(root, name, size, seed, overrides):
                log(f"milarun: dataset {name} ({size}) is complete in {final}, skipped")
                return final
            if partial.exists():
                shutil.rmtree(partial)
            if final.exists():
                log(
                    f"milarun: dataset {name} in {final} is incomplete or of another size; "
                    "rebuilding"
                )
            partial.mkdir()
            t0 = time.perf_counter()
            try:
                mod.build(partial, params, seed)
                (partial / STAMP).write_text(json.dumps(_stamp(name, params, seed, mod)))
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)  # a full disk gets its space back
                raise
            if final.exists():
                shutil.rmtree(final)
            partial.rename(final)
    except OSError as exc:
        where = exc.filename or root
        why = exc.strerror or str(exc)
        if exc.errno == errno.ELOOP:
            why = "a symlink where milarun writes (refused, not followed)"
        raise SetupError(f"dataset {name}: cannot build in {root}: {why} ({where})") from exc
    except ValueError as exc:  # parameters the builder refuses (fake_imagenet classes)
        raise MilarunError(f"dataset {name}: {exc}") from exc
    log(f"milarun: dataset {name} ({size}) built in {final} in {time.perf_counter() - t0:.1f} s")
    return final
