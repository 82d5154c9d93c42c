"""``milarun dataset NAME ... [-d DATAROOT] [--size tiny|standard]``."""

import os

from coleo import Option, default, tooled

from ..errors import SetupError


def dataset_table(dataroot=None):
    """``--list-datasets``: a table (dataset, about how much a standard build takes on
    disk, what ``dataroot`` holds and its size on disk), then each dataset's presets."""
    from .. import datasets

    names = sorted(datasets.BUILDERS)
    where = f"in {dataroot}" if dataroot else "in DATAROOT (-d)"
    rows = [("dataset", "standard on disk", where)]
    for name in names:
        std = datasets.STANDARD_MB.get(name)
        std = f"about {std} MB" if std else "-"
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


@tooled
def command(rest):
    """Prepare datasets in their real on-disk formats (generated, deterministic).

    Two builds of one dataset take turns (a lock file, DATAROOT/.NAME.lock); a dataset
    is stamped complete only once its build succeeded."""
    # Datasets to prepare (see --list-datasets)
    # [positional: *]
    names: Option
    # Dataset root (default: $MILARUN_DATAROOT)
    # [alias: -d]
    dataroot: Option = default(None)
    # Size preset: tiny (tests, CPU) or standard (GPU runs)
    size: Option = default("tiny")
    # Random seed of the generated data
    seed: Option & int = default(0)
    # Override the number of items (images...) where the builder has one: 1 to 10,000,000
    count: Option & int = default(None)
    # Override the image size where the builder has one: 16 to 4096 pixels
    image_size: Option & int = default(None)
    # List the known datasets, their size presets and what DATAROOT holds, with sizes on disk
    list_datasets: Option & bool = default(False)

    from .. import datasets

    dataroot = dataroot or os.environ.get("MILARUN_DATAROOT")
    if list_datasets or not names:
        print(dataset_table(dataroot), end="")
        return 0
    if not dataroot:
        raise SetupError("no dataroot: pass -d DATAROOT or set $MILARUN_DATAROOT")
    for name in names:
        datasets.resolve_params(name, size, {"count": count, "image_size": image_size})
    for name in names:
        datasets.prepare(name, dataroot, size=size, seed=seed,
                         overrides={"count": count, "image_size": image_size})
    return 0
