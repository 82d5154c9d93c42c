"""Load and validate job profiles (JSON) into ``Job`` records.

A profile maps job names to definitions. The ``"*"`` entry holds defaults
deep-merged into every job (a job that changes ``partition_scheme.type``
keeps the ``cgroup`` template). Entries whose name starts with ``_`` are
ignored (reserved for extensions). Everything is checked before anything
runs; each problem is one ``ProfileError`` naming the file, the job and the key.

Job keys:

``experiment``        ``"module:function"`` (required).
``arguments``         ``{flag: value}``; ``true`` is a bare flag, ``false`` omits it.
``partition_scheme``  ``{"type": "normal"|"per-gpu"|"gpu-progression",
                      "cgroup": "cpuset,memory:student{device}" or null}``.
``prepare``           shell commands run once before the test; placeholders
                      ``{dataroot}``, ``{outdir}``, ``{python}``, ``{milarun}``.
``exec_prefix``       argv put in front of the test command, e.g. ``["nocache"]``.
``timeout``           seconds (default 1800).
``launcher``          ``"python"`` (default) or ``"torchrun"`` (one process per device).
``description``       free text.
"""

import ast
import copy
import importlib.util
import json
import re
import string
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ProfileError

DEFAULT_TIMEOUT = 1800.0
PARTITION_TYPES = ("normal", "per-gpu", "gpu-progression")
LAUNCHERS = ("python", "torchrun")
PREPARE_FIELDS = {"dataroot", "outdir", "python", "milarun"}
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")

_JOB_KEYS = {
    "experiment", "arguments", "partition_scheme", "prepare", "exec_prefix",
    "timeout", "launcher", "description",
}
_PARTITION_KEYS = {"type", "cgroup"}


@dataclass
class Job:
    """One fully resolved test of a profile.

    Attributes:
        suite: profile name (file stem), e.g. ``"standard"``.
        name: job name, e.g. ``"vae"``.
        experiment: ``"module:function"``.
        arguments: ``{flag: value}`` as written in the profile.
        partition: ``"normal"``, ``"per-gpu"`` or ``"gpu-progression"``.
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


def _check_strings(path, job, key, value):
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _err(path, job, key, "must be a list of strings")


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


def _template_fields(text):
    return {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}


def validate_job(path, name, d):
    """Check one merged job definition; raise ``ProfileError`` on the first problem."""
    if not isinstance(d, dict):
        raise _err(path, name, None, "definition must be a JSON object")
    for key in d:
        if key not in _JOB_KEYS:
            raise _err(path, name, key, f"unknown key (known: {', '.join(sorted(_JOB_KEYS))})")
    if "experiment" not in d:
        raise _err(path, name, "experiment", "missing; give 'module:function'")
    problem = check_experiment(d["experiment"])
    if problem:
        raise _err(path, name, "experiment", problem)
    args = d.get("arguments", {})
    if not isinstance(args, dict):
        raise _err(path, name, "arguments", "must be an object of flag → value")
    for flag, value in args.items():
        if not isinstance(value, (str, int, float, bool)):
            raise _err(path, name, f"arguments.{flag}",
                       f"must be a string, number or boolean, not {type(value).__name__}")
    part = d.get("partition_scheme", {})
    if not isinstance(part, dict):
        raise _err(path, name, "partition_scheme", "must be an object with 'type' and 'cgroup'")
    for key in part:
        if key not in _PARTITION_KEYS:
            raise _err(path, name, f"partition_scheme.{key}", "unknown key (known: cgroup, type)")
    ptype = part.get("type", "per-gpu")
    if ptype not in PARTITION_TYPES:
        raise _err(path, name, "partition_scheme.type",
                   f"{ptype!r} is not one of {', '.join(PARTITION_TYPES)}")
    cg = part.get("cgroup")
    if cg is not None:
        if not isinstance(cg, str) or ":" not in cg or cg.startswith(":") or cg.endswith(":"):
            raise _err(path, name, "partition_scheme.cgroup",
                       "must look like 'controllers:group', e.g. 'cpuset,memory:student{device}'")
        bad = _template_fields(cg) - {"device"}
        if bad:
            raise _err(path, name, "partition_scheme.cgroup",
                       f"unknown placeholder {{{sorted(bad)[0]}}} (only {{device}})")
    prepare = d.get("prepare", [])
    _check_strings(path, name, "prepare", prepare)
    for cmd in prepare:
        try:
            bad = _template_fields(cmd) - PREPARE_FIELDS
        except ValueError as exc:
            raise _err(path, name, "prepare", f"bad template {cmd!r} ({exc})")
        if bad:
            raise _err(path, name, "prepare",
                       f"unknown placeholder {{{sorted(bad)[0]}}} "
                       f"(known: {', '.join(sorted(PREPARE_FIELDS))})")
    _check_strings(path, name, "exec_prefix", d.get("exec_prefix", []))
    timeout = d.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise _err(path, name, "timeout", "must be a positive number of seconds")
    launcher = d.get("launcher", "python")
    if launcher not in LAUNCHERS:
        raise _err(path, name, "launcher", f"{launcher!r} is not one of {', '.join(LAUNCHERS)}")
    if "description" in d and not isinstance(d["description"], str):
        raise _err(path, name, "description", "must be a string")


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
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ProfileError("profile not found", path=path)
    except OSError as exc:
        raise ProfileError(f"cannot read profile ({exc.strerror})", path=path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"invalid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}",
                           path=path)
    if not isinstance(data, dict):
        raise ProfileError("a profile must be a JSON object of job name → definition", path=path)
    defaults = data.get("*", {})
    if not isinstance(defaults, dict):
        raise _err(path, "*", None, "defaults must be a JSON object")
    suite = path.stem
    jobs = []
    for name, definition in data.items():
        if name == "*" or name.startswith("_"):
            continue
        if not NAME_RE.match(name):
            raise _err(path, name, None,
                       "job names may hold only letters, digits, '_' and '-'")
        if not isinstance(definition, dict):
            raise _err(path, name, None, "definition must be a JSON object")
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
