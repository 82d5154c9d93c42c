"""Resolve a profile's entries into jobs: the ``"*"`` defaults, ``inherits`` chains,
``enabled``, matrices expanded in place (:mod:`milarun.profile.matrix`), each job validated
(:mod:`milarun.profile.validate`), and the bound on the jobs of a whole profile."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ProfileError
from ..formats.jsonfile import key_path
from .includes import Layer
from .job import DEFAULT_TIMEOUT, Job
from .matrix import MAX_MATRIX_JOBS, fill_matrix, matrix_points
from .templates import substitute
from .validate import Origin, entry_error, entry_label, validate_job

#: Entry keys of the profile language: never part of a job's recorded definition.
LANGUAGE_KEYS = ("inherits", "matrix", "name", "tags", "group", "enabled")
#: Most jobs a whole profile may make, its includes' counted (each is validated, and a
#: 5 KB profile of matrices would otherwise make 100,000 of them: minutes and 200 MB).
MAX_JOBS = 10_000
#: Longest ``inherits`` chain (entries, the job itself counted).
MAX_INHERITS_DEPTH = 64


def deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``base`` updated with ``over``, merging nested dicts recursively."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _has(data: Any, keys: Sequence[str | int]) -> bool:
    """True when ``data`` holds the nested key path ``keys`` (dict keys, list indexes)."""
    for k in keys:
        if isinstance(data, dict) and k in data:
            data = data[k]
        elif isinstance(data, list) and isinstance(k, int) and 0 <= k < len(data):
            data = data[k]
        else:
            return False
    return True


class Resolver:
    """The entries of a profile and its includes, and how they resolve into jobs.

    Each entry is merged, chained and resolved once (memoised), so resolving is
    linear in the profile's size: a chain of n entries costs n merges, not n².
    Results are shared: callers must not change them.

    Args:
        path: the profile file given (named by errors about the profile as a whole).
        entries: ``{entry: [Layer, ...]}`` (:func:`milarun.profile.includes.read_entries`).
    """

    def __init__(self, path: Path, entries: dict[str, list[Layer]]) -> None:
        self.path = path
        self.entries = entries
        self._merged: dict[str, Any] = {}
        self._chains: dict[str, list[str]] = {}
        self._resolved: dict[str, dict[str, Any]] = {}
        self._experiments: dict[str, str | None] = {}
        self._matrices: dict[str, object] = {}

    def merged(self, name: str) -> Any:
        """Entry ``name``'s layers deep-merged (a template may be a non-object)."""
        if name not in self._merged:
            out: Any = {}
            for layer in self.entries[name]:
                if isinstance(layer.data, dict) and isinstance(out, dict):
                    out = deep_merge(out, layer.data)
                else:
                    out = layer.data
            self._merged[name] = out
        return self._merged[name]

    def where_set(self, name: str, key: str) -> Path:
        """The file of the last layer of entry ``name`` that sets ``key``."""
        for layer in reversed(self.entries[name]):
            if isinstance(layer.data, dict) and key in layer.data:
                return layer.path
        return self.entries[name][-1].path

    def chain(self, name: str) -> list[str]:
        """Entry names from ``name``'s root ancestor down to ``name`` (``inherits``).

        Raises:
            ProfileError: an unknown parent, a cycle, ``"*"`` or a non-object as a
                parent, or a chain of more than :data:`MAX_INHERITS_DEPTH` entries.
        """
        seen = [name]
        while True:
            cur = seen[-1]
            parent = self.merged(cur).get("inherits")
            if cur in self._chains or parent is None:
                # a known chain (memoised) or the root: every entry walked gets its chain
                full = self._chains.get(cur, [cur]) + seen[-2::-1]
                if len(full) > MAX_INHERITS_DEPTH:
                    shown = " → ".join(full[::-1][:3] + ["…", full[0]])
                    raise entry_error(
                        self.where_set(name, "inherits"),
                        entry_label(name),
                        "inherits",
                        f"a chain of {len(full)} entries ({shown}); at most {MAX_INHERITS_DEPTH}",
                    )
                for i in range(len(full)):
                    self._chains.setdefault(full[i], full[: i + 1])
                return full
            if len(seen) > MAX_INHERITS_DEPTH:
                shown = " → ".join(seen[:3] + ["…", seen[-1]])
                raise entry_error(
                    self.where_set(name, "inherits"),
                    entry_label(name),
                    "inherits",
                    f"a chain of more than {MAX_INHERITS_DEPTH} entries ({shown})",
                )
            shown = " → ".join(seen + [parent])
            path = self.where_set(cur, "inherits")
            if parent in seen:
                raise entry_error(path, entry_label(cur), "inherits", f"inherits cycle {shown}")
            if parent == "*":
                raise entry_error(
                    path,
                    entry_label(cur),
                    "inherits",
                    "'*' is merged into every job already; it cannot be inherited",
                )
            if parent not in self.entries:
                raise entry_error(
                    path, entry_label(cur), "inherits", f"unknown entry {parent!r} (chain {shown})"
                )
            if not isinstance(self.merged(parent), dict):
                raise entry_error(
                    path,
                    entry_label(cur),
                    "inherits",
                    f"entry {parent!r} is not an object (chain {shown})",
                )
            seen.append(parent)

    def layers(self, name: str) -> list[Layer]:
        """The layers entry ``name`` resolves from: ``"*"``'s, then its chain's objects."""
        return self.entries.get("*", []) + [
            layer
            for e in self.chain(name)
            for layer in self.entries[e]
            if isinstance(layer.data, dict)
        ]

    def resolved(self, name: str) -> dict[str, Any]:
        """``"*"`` and the layers of ``name``'s chain, deep-merged in order (memoised:
        an entry's own layers are merged onto its parent's resolved definition)."""
        if name not in self._resolved:
            chain = self.chain(name)
            if len(chain) > 1:
                out = self.resolved(chain[-2])  # depth <= MAX_INHERITS_DEPTH
            else:
                out = {}
                for layer in self.entries.get("*", []):
                    out = deep_merge(out, layer.data)
            for layer in self.entries[name]:
                if isinstance(layer.data, dict):
                    out = deep_merge(out, layer.data)  # a copy: the parent's is untouched
            self._resolved[name] = out
        return self._resolved[name]

    def matrix(self, name: str) -> object:
        """The ``matrix`` :meth:`resolved` gives entry ``name`` (or None), merged from its
        chain's ``matrix`` keys alone (memoised): counting jobs copies nothing else."""
        if name not in self._matrices:
            chain = self.chain(name)
            out = self.matrix(chain[-2]) if len(chain) > 1 else None
            for layer in self.entries[name]:
                if isinstance(layer.data, dict) and "matrix" in layer.data:
                    new = layer.data["matrix"]
                    out = (
                        deep_merge(out, new)
                        if isinstance(out, dict) and isinstance(new, dict)
                        else copy.deepcopy(new)
                    )
            self._matrices[name] = out
        return self._matrices[name]

    def count(self, name: str) -> int:
        """How many jobs entry ``name`` makes: its matrix's points, else 1 (before any
        is made; a matrix over :data:`MAX_MATRIX_JOBS` counts 0:
        :func:`milarun.profile.matrix.matrix_points` refuses it)."""
        matrix = self.matrix(name)
        if not isinstance(matrix, dict):
            return 1
        count = math.prod(len(v) if isinstance(v, list) else 1 for v in matrix.values())
        return count if count <= MAX_MATRIX_JOBS else 0

    def jobs(self, suite: str) -> list[Job]:
        """Every job, in file order (includes first; a matrix expands in place).

        Raises:
            ProfileError: a bad entry, or more than :data:`MAX_JOBS` jobs in all
                (counted before any is made).
        """
        star = self.entries.get("*", [])
        if star:
            for key in ("inherits", "matrix", "name", "enabled"):
                if key in self.merged("*"):
                    raise entry_error(
                        self.where_set("*", key), "job '*'", key, "not allowed in the defaults"
                    )
        names: list[str] = []
        for name in self.entries:
            if name == "*" or name.startswith("_"):
                continue
            self.chain(name)  # a disabled entry's chain is checked too
            # "enabled" is the entry's own key: a job inheriting a disabled entry runs
            if self.merged(name).get("enabled", True) is not False:
                names.append(name)
        total = 0
        for name in names:
            total += self.count(name)
            if total > MAX_JOBS:
                has_matrix = self.matrix(name) is not None
                path = (
                    self.origin(self.layers(name), name, name)(["matrix"])[0]
                    if has_matrix
                    else self.entries[name][-1].path
                )
                raise entry_error(
                    path,
                    f"job {name!r}",
                    "matrix" if has_matrix else None,
                    f"the profile makes more than {MAX_JOBS} jobs ({total} with this entry's)",
                )
        jobs: list[Job] = []
        made_by: dict[str, str] = {}
        for name in names:
            layers = self.layers(name)
            for job in self.expand(name, self.resolved(name), layers, suite):
                if job.name in made_by:
                    raise entry_error(
                        self.where_set(name, "name"),
                        f"job {name!r}",
                        "name",
                        f"makes job {job.name!r} again (already made by entry "
                        f"{made_by[job.name]!r})",
                    )
                made_by[job.name] = name
                jobs.append(job)
        for name in self.entries:
            if name.startswith("_") and isinstance(self.merged(name), dict):
                self.chain(name)  # a typo in an unused template is an error too
        return jobs

    def origin(self, layers: list[Layer], entry: str, job: str) -> Origin:
        """``f(keys) -> (path, where)``: the layer that wrote ``keys`` of ``job``."""

        def label(source: str) -> str:
            return f"job {job!r}" if source in ("*", job) else f"job {job!r} (from {source!r})"

        def find(keys: Sequence[str | int]) -> tuple[Path, str]:
            for layer in reversed(layers):
                if _has(layer.data, keys):
                    return layer.path, label(layer.entry)
            return self.entries[entry][-1].path, label(entry)

        return find

    def expand(
        self, name: str, resolved: dict[str, Any], layers: list[Layer], suite: str
    ) -> list[Job]:
        """The jobs of entry ``name`` (one, or one per point of its matrix)."""

        def fail(keys: Sequence[str | int], message: str, job: str = name) -> ProfileError:
            path, where = self.origin(layers, name, job)(keys)
            return entry_error(path, where, key_path(keys), message)

        matrix = resolved.get("matrix")
        if matrix is None:
            if "name" in resolved:
                raise fail(["name"], "a name template needs a 'matrix' to expand")
            points: list[tuple[dict[str, Any], str]] = [({}, name)]
        else:
            points = matrix_points(resolved, fail)
        out: list[Job] = []
        for values, job_name in points:
            d = {k: v for k, v in resolved.items() if k not in LANGUAGE_KEYS}
            if values and isinstance(d.get("arguments"), dict):
                d["arguments"] = {k: fill_matrix(v, values) for k, v in d["arguments"].items()}
            origin = self.origin(layers, name, job_name)
            validate_job(self.path, job_name, d, origin, self._experiments)
            part = d.get("partition_scheme", {})
            cg = part.get("cgroup")
            out.append(
                Job(
                    suite=suite,
                    name=job_name,
                    experiment=d["experiment"],
                    arguments=dict(d.get("arguments", {})),
                    plan_type=part.get("type", "per-gpu"),
                    cgroup=None
                    if cg is None
                    else substitute(cg, {"CUDA_VISIBLE_DEVICES": "{device}"}),
                    prepare=list(d.get("prepare", [])),
                    exec_prefix=list(d.get("exec_prefix", [])),
                    timeout=float(d.get("timeout", DEFAULT_TIMEOUT)),
                    launcher=d.get("launcher", "python"),
                    restarts=int(d.get("restarts", 0)),
                    definition=d,
                    tags=list(resolved.get("tags", [])),
                    group=resolved.get("group") or name,
                    matrix=values,
                )
            )
        return out
