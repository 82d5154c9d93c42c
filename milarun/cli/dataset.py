"""``milarun dataset NAME ... [-d DATAROOT] [--size tiny|standard]``."""

import os

from ..errors import SetupError
from .options import flag, option, positional


def dataset_table(dataroot=None):
    """``--list-datasets``: a table (dataset, about how much a standard build takes on
    disk, what ``dataroot`` holds and its size on disk), then each dataset's presets."""
    from .. import datasets  # lazy, for start-up (numpy, the builders)

    names = sorted(datasets.BUILDERS)
    where = f"in {dataroot}" if dataroot else "in DATAROOT (-d)"
    rows = [("dataset", "standard on disk", where)]
    for name in names:
        mb = datasets.STANDARD_MB.get(name)
        std = f"about {mb} MB" if mb else "-"
        if dataroot and os.path.isdir(dataroot):
            state, mib = datasets.built(dataroot, name)
            held = state if mib is None else f"{state}, {mib:.1f} MiB"
        else:
            held = "-"
        rows.append((name, std, held))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.append("")
    lines.append("presets (--size tiny | standard; --count and --image-size override them):")
    for name in names:
        mod, _ = datasets.resolve_params(name, "tiny")
        for size, params in mod.SIZES.items():
            text = " ".join(f"{k}={v}" for k, v in params.items())
            lines.append(f"  {name:14s} {size:9s} {text}")
    return "\n".join(lines) + "\n"


OPTIONS = (
    positional("names", "Datasets to prepare (see --list-datasets)", nargs="*"),
    option("dataroot", "Dataset root (default: $MILARUN_DATAROOT)", aliases=("-d",)),
    option("size", "Size preset: tiny (tests, CPU) or standard (GPU runs)", default="tiny"),
    option("seed", "Random seed of the generated data", type=int, default=0),
    option(
        "count",
        "Override the number of items (images...) where the builder has one: 1 to 10,000,000",
        type=int,
    ),
    option(
        "image_size",
        "Override the image size where the builder has one: 16 to 4096 pixels",
        type=int,
    ),
    flag(
        "list_datasets",
        "List the known datasets, their size presets and what DATAROOT holds, with sizes on disk",
    ),
)


def command(opts, rest):
    """Prepare datasets in their real on-disk formats (generated, deterministic).

    Two builds of one dataset take turns (a lock file, DATAROOT/.NAME.lock); a dataset
    is stamped complete only once its build succeeded."""
    names, size, seed = opts.names, opts.size, opts.seed
    count, image_size = opts.count, opts.image_size

    from .. import datasets  # lazy, for start-up (numpy, the builders)

    dataroot = opts.dataroot or os.environ.get("MILARUN_DATAROOT")
    if opts.list_datasets or not names:
        print(dataset_table(dataroot), end="")
        return 0
    if not dataroot:
        raise SetupError("no dataroot: pass -d DATAROOT or set $MILARUN_DATAROOT")
    for name in names:
        datasets.resolve_params(name, size, {"count": count, "image_size": image_size})
    for name in names:
        datasets.prepare(
            name,
            dataroot,
            size=size,
            seed=seed,
            overrides={"count": count, "image_size": image_size},
        )
    return 0
