"""The reference floors per GPU model: what a healthy node of each model should reach.

The table ships inside the package (``milarun/formats/data/gpu_floors.json``) and is read
strictly (:func:`milarun.formats.jsonfile.read_json`), checked against
``$defs/gpu_floors`` of ``milarun/formats/schemas/thresholds.schema.json``, then for what a
schema cannot say: every figure's ``source`` names an entry of ``sources``, every name
pattern is a regular expression. A bad table is one line naming the file and the key.

Each figure is ``{"reference", "fraction", "source", "measured"}``: the floor is
``reference x fraction`` (:func:`floor_of`), in the unit of its section: ``matmul`` TFLOP/s
per GPU (the best of the shape sweep, as Stas Bekman's MAMF table measures it),
``bandwidth`` GB/s (1e9 bytes/s: host-device pinned copies per GPU, STREAM triad on the
device's memory), ``collectives`` nccl-tests' bus bandwidth in GB/s at ``at_bytes``,
``network`` Gb/s per NIC (GPUDirect RDMA; no milarun test measures it, so it is shown,
never judged). The sources of each number are in the file itself; docs/acceptance.md,
"Reference floors per GPU model", lists them and how a verdict uses them
(:func:`milarun.analysis.acceptance.verdict`).

A model is chosen by the records' GPU name (``host.gpus[].name``, e.g.
``"NVIDIA H100 80GB HBM3"``): :func:`model_for`.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

from ..errors import ResultFormatError
from .jsonfile import StrPath, check, read_json

#: The schema part a floors table follows (beside the thresholds clauses it fills).
SCHEMA_REF = "thresholds#/$defs/gpu_floors"
#: The sections of a model entry that hold figures, and their units.
UNITS = {"matmul": "TFLOP/s", "bandwidth": "GB/s", "collectives": "GB/s", "network": "Gb/s"}
#: The sections a verdict judges (the thresholds file's sections of the same name);
#: ``network`` is shown only: no milarun test measures GPUDirect bandwidth per NIC.
JUDGED = ("matmul", "bandwidth", "collectives")


def default_path() -> str:
    """The path of the table shipped in the package (``milarun/formats/data/``)."""
    return str(resources.files("milarun.formats") / "data" / "gpu_floors.json")


def read_floors(path: StrPath | None = None) -> dict[str, Any]:
    """The floors table of ``path`` (default: the shipped one), as in the file.

    Raises:
        ResultFormatError: unreadable, not UTF-8, not JSON, a figure that is negative,
            out of range or without its source, an unknown key, a ``source`` that names
            no entry of ``sources``, a name pattern that is no regular expression: one
            line naming the file and the key.
    """
    path = default_path() if path is None else path
    table = check(
        read_json(path, error_cls=ResultFormatError, max_bytes=1 << 20), SCHEMA_REF, path=path
    )
    for model, entry in table["models"].items():
        for i, pattern in enumerate(entry["patterns"]):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ResultFormatError(
                    f"not a regular expression ({exc})",
                    path=path,
                    key=f"models.{model}.patterns.{i}",
                ) from None
        for section in UNITS:
            for name, figure in entry[section].items():
                if figure["source"] not in table["sources"]:
                    raise ResultFormatError(
                        f"unknown source {figure['source']!r} (known: "
                        f"{', '.join(sorted(table['sources']))})",
                        path=path,
                        key=f"models.{model}.{section}.{name}.source",
                    )
    return table


@functools.cache
def shipped_floors() -> dict[str, Any]:
    """The shipped table (:func:`read_floors` of :func:`default_path`), read once.

    Raises:
        ResultFormatError: as :func:`read_floors` (a broken install).
    """
    return read_floors()


def _normal(name: str) -> str:
    """A GPU name with its runs of white space made one space, stripped."""
    return " ".join(name.split())


def model_for(gpu_name: str, table: dict[str, Any]) -> str | None:
    """The id of the model of ``table`` whose pattern matches the whole of ``gpu_name``
    (case and runs of white space ignored), or None (no floors for that GPU). The first
    model in the file's order wins; the shipped table has no name two models match
    (``tests/test_floors.py``)."""
    name = _normal(gpu_name)
    for model, entry in table["models"].items():
        if any(re.fullmatch(p, name, re.IGNORECASE) for p in entry["patterns"]):
            return str(model)
    return None


def floor_of(figure: dict[str, Any]) -> float:
    """The floor of one figure: ``reference x fraction`` to 0.1 of its unit (what the
    table's description states; rounded so that a verdict line shows the number used)."""
    return round(float(figure["reference"]) * float(figure["fraction"]), 1)


def detect(hosts: Any, table: dict[str, Any]) -> dict[str, Any]:
    """The GPU models the summary's ``hosts`` name (``hosts[].gpus``: GPU names, as
    :func:`milarun.analysis.summary.summarize` keeps them).

    Returns:
        ``{"names": {gpu name: model id or None}, "hosts": {gpu name: [hostnames]}}``,
        each GPU name once (as recorded), in sorted order; empty when no host names a
        GPU (CPU runs).
    """
    names: dict[str, str | None] = {}
    where: dict[str, list[str]] = {}
    for host in hosts if isinstance(hosts, list) else []:
        if not isinstance(host, dict):
            continue
        for gpu in host.get("gpus") or []:
            name = gpu.get("name") if isinstance(gpu, dict) else gpu
            if not isinstance(name, str) or not name.strip():
                continue
            names.setdefault(name, model_for(name, table))
            hostname = host.get("hostname")
            if isinstance(hostname, str) and hostname not in where.setdefault(name, []):
                where[name].append(hostname)
    return {"names": dict(sorted(names.items())), "hosts": where}


__all__ = [
    "JUDGED",
    "SCHEMA_REF",
    "UNITS",
    "default_path",
    "detect",
    "floor_of",
    "model_for",
    "read_floors",
    "shipped_floors",
]
