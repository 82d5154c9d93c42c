"""Check one merged job definition, and name where a problem was written: each problem is one
``ProfileError`` naming the file, the entry and the key."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import ProfileError
from ..formats.jsonfile import first_error, key_path
from ..host import isolation
from ..plan import types as plantypes
from .experiment import check_experiment
from .templates import CGROUP_FIELDS, EXAMPLE_VALUES, LAUNCH_FIELDS, PREPARE_FIELDS, check_template

#: ``f(keys) -> (path, where)``: the file and the words (``"job 'a'"``) that name where the
#: key at ``keys`` was written.
Origin = Callable[[Sequence[str | int]], tuple[Path, str]]


def entry_label(name: str) -> str:
    return f"template {name!r}" if name.startswith("_") else f"job {name!r}"


def entry_error(path: Path, where: str, key: str | None, message: str) -> ProfileError:
    """``ProfileError`` ``<path>: <where>[, key '<key>']: <message>``."""
    return ProfileError(f"{where}" + (f", key {key!r}" if key else "") + f": {message}", path=path)


def schema_error(
    path: Path, data: Any, ref: str, job: str | None = None, origin: Origin | None = None
) -> None:
    """Raise the profile schema's first error for ``data`` as a ``ProfileError``.

    ``origin(keys) -> (path, where)`` names the file and entry that wrote the
    offending key (default: ``path`` and ``job``)."""
    found = first_error(data, ref)
    if found is None:
        return
    keys, message = found
    if job is None:
        if not keys:
            raise ProfileError(message, path=path)
        if keys[0] == "include":
            raise ProfileError(f"key {key_path(keys)!r}: {message}", path=path)
        # the first key of an error below the top is an entry's name: a string
        entry, keys = str(keys[0]), keys[1:]
        where = "job '*'" if entry == "*" else entry_label(entry)
        raise entry_error(path, where, key_path(keys), message)
    path, where = origin(keys) if origin else (path, f"job {job!r}")
    raise entry_error(path, where, key_path(keys), message)


def validate_job(
    path: Path,
    name: str,
    d: dict[str, Any],
    origin: Origin | None = None,
    experiments: dict[str, str | None] | None = None,
) -> None:
    """Check one merged job definition; raise ``ProfileError`` on the first problem.

    The schema (``milarun/formats/schemas/profile.schema.json#/$defs/job``) checks
    keys, types and ranges; this adds what a schema cannot: the experiment's
    module and function exist, the cgroup, prepare and argument templates
    fill, and the cgroup names a plain group under the cgroup root.

    Args:
        origin: ``f(keys) -> (path, where)``: the file and the words (``"job 'a'"``)
            that name where the key at ``keys`` (a list) was written; default
            ``path`` and ``job '<name>'``.
        experiments: ``{spec: problem}`` of the experiments already checked (one
            profile's jobs share a few; each check parses the module's source).
    """
    origin = origin or (lambda keys: (path, f"job {name!r}"))

    def fail(keys: Sequence[str | int], message: str) -> ProfileError:
        where_path, where = origin(keys)
        return entry_error(where_path, where, key_path(keys), message)

    schema_error(path, d, "profile#/$defs/job", job=name, origin=origin)
    experiments = {} if experiments is None else experiments
    spec = d["experiment"]
    if spec not in experiments:
        experiments[spec] = check_experiment(spec)
    experiment_problem = experiments[spec]
    if experiment_problem:
        raise fail(["experiment"], experiment_problem)
    launch_strings: list[tuple[list[str | int], str]] = [
        (["arguments", flag], value)
        for flag, value in d.get("arguments", {}).items()
        if isinstance(value, str)
    ]
    launch_strings += [
        (["exec_prefix", i], value) for i, value in enumerate(d.get("exec_prefix", []))
    ]
    for keys, value in launch_strings:
        if keys == ["exec_prefix", 0] and ("{" in value or "}" in value):
            # the launcher checks the program is installed before any launch fills it
            raise fail(keys, f"the program {value!r} cannot hold a placeholder or brace")
        problem = check_template(value, EXAMPLE_VALUES)
        if problem:
            if problem.startswith("unknown placeholder"):
                problem += f" (known: {', '.join(LAUNCH_FIELDS)})"
            raise fail(keys, problem)
    scheme = d.get("partition_scheme", {})
    launcher = d.get("launcher", "python")
    kind = plantypes.plan_type(scheme.get("type", "per-gpu"))
    scheme_problem = kind.check(scheme, launcher)
    if scheme_problem:
        raise fail(["partition_scheme", scheme_problem[0]], scheme_problem[1])
    if d.get("restarts") and not (kind.torchrun or launcher == "torchrun"):
        raise fail(
            ["restarts"],
            'restarts are torchrun\'s: give "launcher": "torchrun", or a plan type that '
            "launches through it (njobs, multi-node, node-progression)",
        )
    cg = scheme.get("cgroup")
    if cg is not None:
        # the plan fills it with an int device index
        problem = check_template(cg, {f: 0 for f in CGROUP_FIELDS})
        if problem:
            if problem.startswith("unknown placeholder"):
                problem += " (only {device})"
            raise fail(["partition_scheme", "cgroup"], problem)
        # checked here, not when cgroups are used: --no-cgexec must not let it through
        problem = isolation.check_group_spec(cg.format(**{f: 0 for f in CGROUP_FIELDS}))
        if problem:
            raise fail(["partition_scheme", "cgroup"], f"{cg!r}: {problem}")
    for cmd in d.get("prepare", []):
        # the launcher fills it with shell-quoted strings
        problem = check_template(cmd, {f: "x" for f in PREPARE_FIELDS})
        if problem:
            if problem.startswith("unknown placeholder"):
                problem += f" (known: {', '.join(sorted(PREPARE_FIELDS))})"
            raise fail(["prepare"], problem)
