"""Read a profile file and its includes (``"include"``) into the layers of each entry, with
milabench's matrix form rewritten in ours; the bounds on includes."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ProfileError
from ..formats.jsonfile import read_json
from ..formats.outfile import StrPath
from .validate import schema_error

#: Most files one profile may read, its includes' includes counted each time they are
#: included (a diamond twice), and the deepest chain of includes.
MAX_INCLUDE_FILES = 256
MAX_INCLUDE_DEPTH = 32


@dataclass
class Layer:
    """One file's text of one entry."""

    path: Path
    entry: str
    #: the entry's parsed JSON (an object, or any value for a template)
    data: Any


def real_path(path: Path, referrer: Path | None = None, inc: str | None = None) -> Path:
    """``path`` with its symlinks resolved (the include cycle check compares these).

    Raises:
        ProfileError: a symlink loop (or an unreadable link) on the way; names
            ``path``, or ``referrer`` and its ``include`` entry ``inc``.
    """
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:  # Python < 3.13 raises RuntimeError on a loop
        why = getattr(exc, "strerror", None) or "symlink loop"
        if referrer is None:
            raise ProfileError(f"cannot read profile ({why})", path=path)
        raise ProfileError(f"key 'include': cannot read {inc!r} ({why}: {path})", path=referrer)


_AXIS_CHARS = re.compile(r"[^A-Za-z0-9_]")


def _rename_fields(value: Any, renames: Mapping[str, str]) -> Any:
    """``value`` (str, or a dict/list of them) with every ``{old}`` field written ``{new}``."""
    if isinstance(value, str):
        for old, new in renames.items():
            value = value.replace("{" + old + "}", "{" + new + "}")
        return value
    if isinstance(value, dict):
        return {k: _rename_fields(v, renames) for k, v in value.items()}
    if isinstance(value, list):
        return [_rename_fields(v, renames) for v in value]
    return value


def from_milabench(data: Any) -> Any:
    """A profile's entries with milabench's matrix form rewritten in ours.

    milabench writes a matrix entry as ``{"matrix": {axis: [values]}, "job": {"name":
    template, "inherits": entry, "argv": {flag: value}, ...}}`` and its axes may hold
    ``-`` (``batch-size``, used as ``{batch-size}``). Ours puts ``name``, ``inherits``
    and ``arguments`` beside ``matrix``, with axes that are identifiers. An entry with
    both ``matrix`` and a ``job`` object becomes ``{"matrix": ..., "name": ...,
    "inherits": ..., "arguments": <argv>, <the job's other keys>}``, each axis name's
    characters outside ``[A-Za-z0-9_]`` become ``_`` (and its ``{fields}`` with it).
    Anything else is returned as it is (the schema then judges it), so a malformed
    milabench entry gets the same one-line error as any entry.
    """
    if not isinstance(data, dict):
        return data
    out: dict[str, Any] = {}
    for name, entry in data.items():
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("job"), dict)
            and isinstance(entry.get("matrix"), dict)
        ):
            out[name] = entry
            continue
        renames = {
            axis: _AXIS_CHARS.sub("_", axis)
            for axis in entry["matrix"]
            if isinstance(axis, str) and _AXIS_CHARS.search(axis)
        }
        job = dict(entry["job"])
        new = {k: v for k, v in entry.items() if k != "job"}
        new["matrix"] = {renames.get(a, a): v for a, v in entry["matrix"].items()}
        if "argv" in job:
            job["arguments"] = job.pop("argv")
        for key, value in job.items():
            new[key] = _rename_fields(value, renames) if key in ("name", "arguments") else value
        out[name] = new
    return out


def read_entries(path: Path, stack: list[Path], files: list[Path]) -> dict[str, list[Layer]]:
    """``{entry: [Layer, ...]}`` of profile ``path``, the layers of its includes first.

    ``stack``: resolved paths of the files including this one (a cycle check);
    ``files`` collects every file read, in order.
    """
    data = from_milabench(read_json(path, error_cls=ProfileError, what="profile"))
    schema_error(path, data, "profile")
    files.append(path)
    entries: dict[str, list[Layer]] = {}
    for inc in data.get("include", []):
        target = Path(os.path.normpath(path.parent / inc))
        real = real_path(target, path, inc)
        if real in stack:
            chain = " → ".join(p.name for p in stack[stack.index(real) :] + [real])
            raise ProfileError(f"key 'include': include cycle {chain}", path=path)
        # bounds: includes that fan out (each file including the next twice) would
        # read 2^depth files, and a long chain would exhaust Python's stack
        if len(stack) >= MAX_INCLUDE_DEPTH:
            raise ProfileError(
                f"key 'include': includes nested deeper than {MAX_INCLUDE_DEPTH} files", path=path
            )
        if len(files) >= MAX_INCLUDE_FILES:
            raise ProfileError(
                f"key 'include': more than {MAX_INCLUDE_FILES} profile files "
                "read (a file included many times over)",
                path=path,
            )
        if not target.is_file():
            raise ProfileError(f"key 'include': {inc!r} is not a file ({target})", path=path)
        for name, layers in read_entries(target, stack + [real], files).items():
            entries.setdefault(name, []).extend(layers)
    for name, value in data.items():
        if name != "include":
            entries.setdefault(name, []).append(Layer(path, name, value))
    return entries


def profile_files(path: StrPath) -> list[Path]:
    """Every file profile ``path`` reads: itself, then its includes (depth first).

    Raises:
        ProfileError: as :func:`milarun.profile.language.load_profile` for an unreadable
            file or include.
    """
    path = Path(path)
    files: list[Path] = []
    read_entries(path, [real_path(path)], files)
    return files
