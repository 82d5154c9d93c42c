"""Load and validate job profiles (JSON) into ``Job`` records.

A profile maps job names to definitions. The ``"*"`` entry holds defaults
deep-merged into every job (a job that changes ``partition_scheme.type``
keeps the ``cgroup`` template). Entries whose name starts with ``_`` are
ignored (reserved for extensions). Everything is checked before anything
runs; each problem is one ``ProfileError`` naming the file, the job and the key.
The file is read strictly (:func:`milarun.jsonfile.read_json`) and checked
against ``milarun/schemas/profile.schema.json``; job names and the file's stem
(the suite) use letters, digits, ``_`` and ``-`` only.

Job keys:

``experiment``        ``"module:function"`` (required).
``arguments``         ``{flag: value}``; ``true`` is a bare flag, ``false`` omits it.
``partition_scheme``  ``{"type": a plan type of milarun.plantypes.TYPES
                      ("per-gpu", "gpu-progression", "normal", "njobs",
                      "multi-node", "node-progression", "multi-process"),
                      "cgroup": "cpuset,memory:student{device}" or null (per-gpu),
                      "nodes": [n, ...], "gpus_per_node": [g, ...] (node-progression),
                      "processes": P, "devices_per_process": k (multi-process)}``.
``prepare``           shell commands run once before the test; placeholders
                      ``{dataroot}``, ``{outdir}``, ``{python}``, ``{milarun}``.
``exec_prefix``       argv put in front of the test command, e.g. ``["nocache"]``.
``timeout``           seconds, > 0 and at most 7 days (default 1800).
``launcher``          ``"python"`` (default) or ``"torchrun"`` (one process per device).
``description``       free text.
"""

import ast
import copy
import importlib.util
import string
from dataclasses import dataclass, field
from pathlib import Path

from . import plantypes
from .errors import ProfileError
from .jsonfile import first_error, key_path, read_json

DEFAULT_TIMEOUT = 1800.0
PREPARE_FIELDS = {"dataroot", "outdir", "python", "milarun"}


@dataclass
class Job:
    """One fully resolved test of a profile.

    Attributes:
        suite: profile name (file stem), e.g. ``"standard"``.
        name: job name, e.g. ``"vae"``.
        experiment: ``"module:function"``.
        arguments: ``{flag: value}`` as written in the profile.
        partition: the plan type's name (see :mod:`milarun.plantypes`).
        cgroup: cgroup template with ``{device}``, or None.
        prepare: shell commands (templates) run before the test.
        exec_prefix: argv prefix.
        timeout: seconds.
        launcher: ``"python"`` or ``"torchrun"``.
        definition: the merged JSON definition (recorded in results).
    """

    suite: str
    name: str
    experiment: str
    arguments: dict = field(default_factory=dict)
    partition: str = "per-gpu"
    cgroup: str = None
    prepare: list = field(default_factory=list)
    exec_prefix: list = field(default_factory=list)
    timeout: float = DEFAULT_TIMEOUT
    launcher: str = "python"
    definition: dict = field(default_factory=dict)

    @property
    def plan_type(self):
        """The :class:`milarun.plantypes.PlanType` of ``partition``."""
        return plantypes.plan_type(self.partition)

    @property
    def full_name(self):
        """``suite.name``."""
        return f"{self.suite}.{self.name}"

    def argv(self):
        """The test's arguments as argv: ``--flag value``; ``true`` → bare flag."""
        out = []
        for key, value in self.arguments.items():
            flag = key if key.startswith("-") else f"--{key}"
            if value is True:
                out.append(flag)
            elif value is False:
                continue
            else:
                out += [flag, str(value)]
        return out


def deep_merge(base, over):
    """Return ``base`` updated with ``over``, merging nested dicts recursively."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _err(path, job, key, message):
    where = f"job {job!r}" + (f", key {key!r}" if key else "")
    return ProfileError(f"{where}: {message}", path=path)


def check_experiment(spec):
    """Check that ``"module:function"`` exists *without importing the module*.

    The module is found with ``importlib.util.find_spec`` and its source is
    parsed for a top-level ``def function``, so the launcher never imports
    torch. Returns None when fine, else a message.
    """
    if not isinstance(spec, str):
        return "must be a string 'module:function'"
    mod_name, sep, fn_name = spec.partition(":")
    if not sep or not mod_name or not fn_name.isidentifier():
        return f"{spec!r} must look like 'module:function'"
    try:
        found = importlib.util.find_spec(mod_name)
    except (ImportError, ValueError) as exc:
        return f"cannot import module {mod_name!r} ({exc})"
    if found is None:
        return f"cannot import module {mod_name!r} (no such module)"
    origin = found.origin
    if origin and origin.endswith(".py"):
        try:
            tree = ast.parse(Path(origin).read_text())
        except (OSError, SyntaxError) as exc:
            return f"cannot read module {mod_name!r} ({exc})"
        names = {n.name for n in tree.body
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        names |= {t.id for n in tree.body if isinstance(n, ast.Assign)
                  for t in n.targets if isinstance(t, ast.Name)}
        names |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom)
                  for a in n.names}
        if fn_name not in names:
            return f"module {mod_name!r} has no function {fn_name!r}"
    return None


def check_template(text, fields):
    """Check a ``str.format`` template against the placeholders it may use.

    The template is parsed and filled once with dummy values, so a template
    that passes never fails when the launcher fills it (``student{`` or
    ``{device!x}`` are caught here). Returns None when fine, else a message.
    """
    try:
        parsed = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(text)
                  if f is not None]
    except ValueError as exc:
        return f"bad template {text!r} ({exc})"
    for f, spec, conv in parsed:
        if spec or conv:  # '{outdir:>99999999999}' would fill memory when used
            return f"placeholder {{{f}}} takes no format spec or conversion"
    used = {f for f, _, _ in parsed}
    unknown = used - set(fields)
    if unknown:
        return f"unknown placeholder {{{sorted(unknown)[0]}}}"
    try:
        text.format(**fields)
    except (ValueError, KeyError, IndexError, AttributeError, TypeError) as exc:
        return f"bad template {text!r} ({exc})"
    return None


def _schema_error(path, data, ref, job=None):
    """Raise the profile schema's first error for ``data`` as a ``ProfileError``."""
    found = first_error(data, ref)
    if found is None:
        return
    keys, message = found
    if job is None:
        if not keys:
            raise ProfileError(message, path=path)
        job, keys = keys[0], keys[1:]
    raise _err(path, job, key_path(keys), message)


def validate_job(path, name, d):
    """Check one merged job definition; raise ``ProfileError`` on the first problem.

    The schema (``milarun/schemas/profile.schema.json#/$defs/job``) checks
    keys, types and ranges; this adds what a schema cannot: the experiment's
    module and function exist, and the cgroup and prepare templates fill.
    """
    _schema_error(path, d, "profile#/$defs/job", job=name)
    problem = check_experiment(d["experiment"])
    if problem:
        raise _err(path, name, "experiment", problem)
    scheme = d.get("partition_scheme", {})
    launcher = d.get("launcher", "python")
    problem = plantypes.plan_type(scheme.get("type", "per-gpu")).check(scheme, launcher)
    if problem:
        raise _err(path, name, f"partition_scheme.{problem[0]}", problem[1])
    cg = scheme.get("cgroup")
    if cg is not None:
        # the plan fills it with an int device index
        problem = check_template(cg, {"device": 0})
        if problem:
            if problem.startswith("unknown placeholder"):
                problem += " (only {device})"
            raise _err(path, name, "partition_scheme.cgroup", problem)
    for cmd in d.get("prepare", []):
        # the launcher fills it with shell-quoted strings
        problem = check_template(cmd, {f: "x" for f in PREPARE_FIELDS})
        if problem:
            if problem.startswith("unknown placeholder"):
                problem += f" (known: {', '.join(sorted(PREPARE_FIELDS))})"
            raise _err(path, name, "prepare", problem)


def load_profile(path, names=None):
    """Read, merge and validate a profile; return its jobs in file order.

    Args:
        path: the JSON file.
        names: optional list of job names to keep (``--name``).

    Returns:
        list of ``Job``.

    Raises:
        ProfileError: unreadable file, bad JSON, bad definitions, unknown name.
    """
    path = Path(path)
    data = read_json(path, error_cls=ProfileError, what="profile")
    _schema_error(path, data, "profile")
    defaults = data.get("*", {})
    suite = path.stem
    found = first_error(suite, "common#/$defs/job_name")
    if found:
        raise ProfileError(f"the file name {suite!r} is not a valid suite name: it becomes the "
                           "suite of every result (letters, digits, '_' and '-')", path=path)
    jobs = []
    for name, definition in data.items():
        if name == "*" or name.startswith("_"):
            continue
        merged = deep_merge(defaults, definition)
        validate_job(path, name, merged)
        part = merged.get("partition_scheme", {})
        jobs.append(Job(
            suite=suite, name=name, experiment=merged["experiment"],
            arguments=dict(merged.get("arguments", {})),
            partition=part.get("type", "per-gpu"), cgroup=part.get("cgroup"),
            prepare=list(merged.get("prepare", [])),
            exec_prefix=list(merged.get("exec_prefix", [])),
            timeout=float(merged.get("timeout", DEFAULT_TIMEOUT)),
            launcher=merged.get("launcher", "python"), definition=merged))
    if not jobs:
        raise ProfileError("the profile defines no job", path=path)
    if names:
        known = [j.name for j in jobs]
        for n in names:
            if n not in known:
                raise ProfileError(f"unknown job name {n!r} (--name); known: {', '.join(known)}",
                                   path=path)
        jobs = [j for j in jobs if j.name in names]
    return jobs
