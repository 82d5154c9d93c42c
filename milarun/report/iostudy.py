"""The input-pipeline study view: the ``io`` workload's tests against DataLoader workers.

For each dataset, one table: the number of DataLoader workers, the mean
steady-state throughput (items/s) of ``--mode traverse`` (the input pipeline
alone) and of ``--mode train`` (the same batches feeding a small convnet),
and their ratio ``train / traverse``. The ratio says how much of training the
input pipeline could explain: near 1 (or above, when timing noise wins),
training goes as fast as the data arrives and the loader is the bottleneck;
far below 1, the model is, and more workers will not help. A plot draws
both throughputs and the ratio against the workers.

A test belongs to the study when its records ran ``milarun.models.io:main``:
its mode and dataset come from the record's ``call.arguments`` and its
workers from ``metrics.workers`` (the value used, after ``--workers-pct``
scaling). From a summary file alone (no records) the test names tell, when
they follow the ``io`` profile's ``io-<mode>-<dataset>-w<workers>`` pattern.
Tests of the same dataset, mode and workers (two percentages that round to
the same count) are pooled: their means are averaged.
"""

import re
from collections import defaultdict

from ..analysis.summary import group_name
from .plots import _short_number, svg_text

EXPERIMENT = "milarun.models.io:main"
_NAME = re.compile(r"^io-(traverse|train)-([A-Za-z0-9_]+)-w(\d+)$")


def _point(rec):
    """``(dataset, mode, workers)`` of an io record, or None."""
    call = rec.get("call") or {}
    if call.get("function") != EXPERIMENT:
        return None
    args = call.get("arguments") or {}
    workers = (rec.get("metrics") or {}).get("workers", args.get("workers"))
    mode, dataset = args.get("mode", "train"), args.get("dataset", "fashion_mnist")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
        return None
    if not isinstance(mode, str) or not isinstance(dataset, str):
        return None
    return dataset, mode, workers


def io_points(records):
    """``{group: (dataset, mode, workers)}`` of the io tests of ``records`` (result
    dicts or ``(path, record)`` pairs): each test's first io record."""
    points: dict = {}
    for item in records or ():
        rec = item[1] if isinstance(item, tuple) else item
        point = _point(rec)
        if point is not None:
            points.setdefault(group_name(rec), point)
    return points


def io_tables(summary, records=None, points=None):
    """The study's tables, one per dataset (sorted by name).

    Args:
        summary: a summary (:func:`milarun.analysis.summary.summarize`).
        records: the result records (or ``(path, record)`` pairs), or None.
        points: :func:`io_points` of the records, when they were taken before
            (the report's cache keeps them); instead of ``records``.

    Returns:
        ``[{"dataset": name, "rows": [{"workers": n, "traverse": items/s or None,
        "train": items/s or None, "ratio": train / traverse or None,
        "tests": [group, ...]}]}]``, rows by workers; ``[]`` when no test is
        an io test.
    """
    have = bool(records) or points is not None
    points = dict(points) if points is not None else io_points(records)
    if not have:
        for gname, entry in summary["tests"].items():
            match = _NAME.match(entry["name"].split(".", 1)[-1])
            if match:
                points[gname] = (match.group(2), match.group(1), int(match.group(3)))
    cells = defaultdict(list)
    tests = defaultdict(list)
    for gname, (dataset, mode, workers) in points.items():
        entry = summary["tests"].get(gname)
        if entry is None or mode not in ("traverse", "train"):
            continue
        tests[(dataset, workers)].append(gname)
        mean = entry["train"]["mean"]
        if mean is not None:
            cells[(dataset, workers, mode)].append(mean)
    tables = []
    for dataset in sorted({d for d, _ in tests}):
        rows = []
        for workers in sorted(w for d, w in tests if d == dataset):
            rates = {
                mode: (
                    sum(cells[(dataset, workers, mode)]) / len(cells[(dataset, workers, mode)])
                    if cells[(dataset, workers, mode)]
                    else None
                )
                for mode in ("traverse", "train")
            }
            ratio = (
                rates["train"] / rates["traverse"]
                if rates["train"] is not None and rates["traverse"]
                else None
            )
            rows.append(
                {
                    "workers": workers,
                    **rates,
                    "ratio": ratio,
                    "tests": sorted(tests[(dataset, workers)]),
                }
            )
        tables.append({"dataset": dataset, "rows": rows})
    return tables


def _num(value, spec=".1f"):
    return "-" if value is None else format(value, spec)


def text_lines(table):
    """The table of one dataset as text lines (throughputs in items/s)."""
    lines = [
        f"input-pipeline study (io), dataset {table['dataset']}: mean steady-state "
        f"throughput (items/s)",
        "against DataLoader workers (train/traverse near 1: the input pipeline limits training)",
        f"{'workers':>8} {'traverse':>12} {'train':>12} {'train/traverse':>15}",
    ]
    for row in table["rows"]:
        lines.append(
            f"{row['workers']:>8} {_num(row['traverse']):>12} "
            f"{_num(row['train']):>12} {_num(row['ratio'], '.3f'):>15}"
        )
    return lines


def plot_svg(table):
    """SVG of one dataset's table: throughput against workers (traverse and train,
    left) and the ratio train/traverse (right). Workers are evenly spaced
    categories (0, 1, 2, 4 ... or the seed's 0, 32 ... 256). Only numbers
    reach matplotlib. None when nothing has a rate."""
    rows = table["rows"]
    if not any(r["traverse"] is not None or r["train"] is not None for r in rows):
        return None
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    xs = list(range(len(rows)))
    labels = [str(r["workers"]) for r in rows]
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "milarun", "font.size": 8}):
        fig = Figure(figsize=(7.0, 2.6))
        left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
        for mode, style in (("traverse", "o--"), ("train", "s-")):
            pts = [(x, r[mode]) for x, r in zip(xs, rows) if r[mode] is not None]
            if pts:
                left.plot(*zip(*pts), style, linewidth=1, markersize=3, label=mode)
        left.set_ylabel("throughput (items/s)")
        left.yaxis.set_major_formatter(FuncFormatter(_short_number))
        left.set_ylim(bottom=0)
        left.legend(loc="best", fontsize=7)
        pts = [(x, r["ratio"]) for x, r in zip(xs, rows) if r["ratio"] is not None]
        if pts:
            right.bar(*zip(*pts), color="#7a9cc6")
        right.axhline(1.0, color="#888", linewidth=0.8, linestyle="--")
        right.set_ylabel("train / traverse")
        right.set_ylim(bottom=0)
        for ax in (left, right):
            ax.set_xticks(xs, labels)
            ax.set_xlabel("DataLoader workers")
            ax.grid(True, linewidth=0.3)
        fig.tight_layout()
        return svg_text(fig)
