"""``milarun dataset NAME ... [-d DATAROOT] [--size tiny|standard]``."""

import os

from coleo import Option, default, tooled

from ..errors import SetupError


@tooled
def command(rest):
    """Prepare datasets in their real on-disk formats (generated, deterministic)."""
    # Datasets to prepare (see --list)
    # [positional: *]
    names: Option
    # Dataset root (default: $MILARUN_DATAROOT)
    # [alias: -d]
    dataroot: Option = default(None)
    # Size preset: tiny (tests, CPU) or standard (GPU runs)
    size: Option = default("tiny")
    # Random seed of the generated data
    seed: Option & int = default(0)
    # Override the number of items (images, ratings...) where the builder has one
    count: Option & int = default(None)
    # Override the image size (pixels) where the builder has one
    image_size: Option & int = default(None)
    # List the known datasets and their sizes
    list_datasets: Option & bool = default(False)

    from .. import datasets

    if list_datasets or not names:
        for name in sorted(datasets.BUILDERS):
            mod, params = datasets.resolve_params(name, "tiny")
            sizes = ", ".join(f"{s}: {p}" for s, p in mod.SIZES.items())
            print(f"{name:14s} {sizes}")
        return 0
    dataroot = dataroot or os.environ.get("MILARUN_DATAROOT")
    if not dataroot:
        raise SetupError("no dataroot: pass -d DATAROOT or set $MILARUN_DATAROOT")
    for name in names:
        datasets.resolve_params(name, size, {"count": count, "image_size": image_size})
    for name in names:
        datasets.prepare(name, dataroot, size=size, seed=seed,
                         overrides={"count": count, "image_size": image_size})
    return 0
