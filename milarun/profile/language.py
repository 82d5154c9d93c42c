"""Load and validate job profiles (JSON) into ``Job`` records.

A profile maps job names to definitions. The ``"*"`` entry holds defaults
deep-merged into every job (a job that changes ``partition_scheme.type``
keeps the ``cgroup`` template). Everything is checked before anything runs;
each problem is one ``ProfileError`` naming the file, the entry and the key.
Each file is read strictly (:func:`milarun.formats.jsonfile.read_json`) and checked
against ``milarun/formats/schemas/profile.schema.json``; job names and the file's stem
(the suite) use letters, digits, ``_`` and ``-`` only.

The profile language (a plain 2020-style profile uses none of it):

``"include": [files]``  top-level: other profiles (paths relative to this file)
                      merged first, in order; then this file's entries are
                      deep-merged over theirs, entry by entry (``"*"`` too). A
                      cycle is an error, and so are more than 32 nested or 256
                      files read. The suite stays this file's stem.
``"_name"`` entries     templates: never run, may be inherited. Until inherited
                      they are not checked (``"_comment": "text"`` is fine).
``inherits``          an entry's parent (a job or a template): the parent's
                      resolved definition, deep-merged with the entry's own
                      (chains of at most 64 entries; an unknown or cyclic parent is
                      an error naming the chain). ``"*"`` comes under every chain.
``matrix``            ``{axis: [values]}``: the job expands into one job per
                      combination (last axis fastest), named by its ``name``
                      template (``"resnet50-bs{batch_size}"``). In string
                      ``arguments`` values, ``{axis}`` is replaced by the value;
                      a value that is exactly ``"{axis}"`` takes the value's
                      type; a value may itself be a launch placeholder
                      (``"{cpu_per_gpu}"``, shown in the name without braces).
                      ``matrix`` and ``name`` are inherited like other keys.
                      Duplicate job names are an error, and so are more than 1,024
                      jobs from one matrix or 10,000 from the whole profile.
                      milabench's form is read too: ``{"matrix": ..., "job":
                      {"name", "inherits", "argv", ...}}``, axes such as
                      ``batch-size`` included (:func:`from_milabench`).
``tags``              ``[tag, ...]``: what ``--select``/``--exclude`` match.
``group``             a name ``--select`` matches (default: the matrix entry a
                      job was expanded from, else the job's own name).
``enabled``           ``false`` turns a job into a template: it does not run and
                      is not checked, but may still be inherited (a profile that
                      includes another drops a test with ``{"enabled": false}``).
                      Not inherited: it belongs to the entry that says it.

Job keys:

``experiment``        ``"module:function"`` (required).
``arguments``         ``{flag: value}``; ``true`` is a bare flag, ``false`` omits it.
                      A string value may hold launch placeholders (:data:`LAUNCH_FIELDS`:
                      ``{cpu_per_gpu}``, ``{n_gpu}``, ``{gpu_memory_gb}``,
                      ``{dataroot}``, ``{outdir}``, ``{arch}``; ``{{`` is a
                      literal brace), filled per launch by the plan
                      (:func:`milarun.plan.launches.placeholder_values`) and recorded in
                      the result's ``placeholders``.
``partition_scheme``  ``{"type": a plan type of milarun.plan.types.TYPES
                      ("per-gpu", "gpu-progression", "normal", "njobs",
                      "multi-node", "node-progression", "multi-process"),
                      "cgroup": "cpuset,memory:student{device}" or null (per-gpu;
                      ``{CUDA_VISIBLE_DEVICES}``, the 2020 name, means ``{device}``),
                      "nodes": [n, ...], "gpus_per_node": [g, ...] (node-progression),
                      "processes": P, "devices_per_process": k (multi-process)}``.
``prepare``           shell commands run once before the test; placeholders
                      ``{dataroot}``, ``{outdir}``, ``{python}``, ``{milarun}``.
``exec_prefix``       argv put in front of the test command, e.g. ``["nocache"]``; its
                      arguments (not the program) may hold the launch placeholders,
                      filled like ``arguments``; an unknown one is an error.
``timeout``           seconds, > 0 and at most 7 days (default 1800).
``launcher``          ``"python"`` (default) or ``"torchrun"`` (one process per device).
``description``       free text.
``validation``        thresholds of the flagging checks (:mod:`milarun.measure.plausibility`):
                      ``{"usage": {"gpu_load_threshold", "gpu_mem_threshold"},
                      "host": {"outside_cpu_threshold", "steal_threshold"}}``,
                      fractions from 0 to 1, null for off; recorded in each
                      result's ``job``, where the summary reads them.

The job's recorded ``definition`` is what a hand-written plain profile would
hold: the merged keys without the language keys (:data:`LANGUAGE_KEYS`).
"""

import ast
import copy
import importlib.machinery
import importlib.util
import itertools
import math
import os
import re
import string
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ProfileError
from ..formats import entrypoint
from ..formats.jsonfile import first_error, key_path, load_schema, read_json
from ..host import isolation
from ..plan import types as plantypes

DEFAULT_TIMEOUT = 1800.0
#: The longest timeout (s) of a test: the ``maximum`` of a job's ``timeout`` in
#: ``profile.schema.json`` (7 days), which ``milarun jobs --timeout`` also obeys.
MAX_TIMEOUT_S = float(load_schema("profile")["$defs"]["job"]["properties"]["timeout"]["maximum"])
PREPARE_FIELDS = {"dataroot", "outdir", "python", "milarun"}
#: Placeholders an argument value may hold; the plan fills them for each launch.
LAUNCH_FIELDS = (
    "arch",
    "cpu_per_gpu",
    "dataroot",
    "gpu_memory_gb",
    "n_gpu",
    "numa_node",
    "numa_remote",
    "outdir",
)
#: What a template is filled with when it is checked: an 8-core student of one 80 GB GPU.
EXAMPLE_VALUES = {
    "arch": "cuda",
    "cpu_per_gpu": 8,
    "dataroot": "/data",
    "gpu_memory_gb": 80,
    "n_gpu": 1,
    "numa_node": 0,
    "numa_remote": 1,
    "outdir": "/out",
}
#: The cgroup template's field, ``device``, and its name in milarun 2020 profiles.
CGROUP_FIELDS = ("device", "CUDA_VISIBLE_DEVICES")
#: Entry keys of the profile language: never part of a job's recorded definition.
LANGUAGE_KEYS = ("inherits", "matrix", "name", "tags", "group", "enabled")
#: Most jobs one matrix may expand into.
MAX_MATRIX_JOBS = 1024
#: Most jobs a whole profile may make, its includes' counted (each is validated, and a
#: 5 KB profile of matrices would otherwise make 100,000 of them: minutes and 200 MB).
MAX_JOBS = 10_000
#: Longest ``inherits`` chain (entries, the job itself counted).
MAX_INHERITS_DEPTH = 64
#: Most files one profile may read, its includes' includes counted each time they are
#: included (a diamond twice), and the deepest chain of includes.
MAX_INCLUDE_FILES = 256
MAX_INCLUDE_DEPTH = 32
#: Order of the keys in :meth:`Job.as_entry` (for the eye; only the arguments' order matters).
_ENTRY_ORDER = (
    "experiment",
    "description",
    "arguments",
    "partition_scheme",
    "launcher",
    "prepare",
    "exec_prefix",
    "timeout",
)


@dataclass
class Job:
    """One fully resolved test of a profile.

    Attributes:
        suite: profile name (the stem of the file given, not of an included one), e.g. ``"standard"``.
        name: job name, e.g. ``"vae"`` (a matrix job's expanded name).
        experiment: ``"module:function"``.
        arguments: ``{flag: value}`` as resolved (matrix values in, launch placeholders not).
        plan_type: the plan type's name (see :mod:`milarun.plan.types`); records and
            summaries keep it as ``partition``, the profile as ``partition_scheme.type``.
        cgroup: cgroup template with ``{device}``, or None.
        prepare: shell commands (templates) run before the test.
        exec_prefix: argv prefix.
        timeout: seconds.
        launcher: ``"python"`` or ``"torchrun"``.
        definition: the merged JSON definition without the language keys (recorded in results).
        tags: the job's tags.
        group: what ``--select`` matches besides name and tags (default: the name).
        matrix: ``{axis: value}`` of a job expanded from a matrix, else ``{}``.
    """

    suite: str
    name: str
    experiment: str
    arguments: dict = field(default_factory=dict)
    plan_type: str = "per-gpu"
    cgroup: str = None
    prepare: list = field(default_factory=list)
    exec_prefix: list = field(default_factory=list)
    timeout: float = DEFAULT_TIMEOUT
    launcher: str = "python"
    definition: dict = field(default_factory=dict)
    tags: list = field(default_factory=list)
    group: str = ""
    matrix: dict = field(default_factory=dict)

    def __post_init__(self):
        self.group = self.group or self.name

    @property
    def kind(self):
        """The :class:`milarun.plan.types.PlanType` called ``plan_type``."""
        return plantypes.plan_type(self.plan_type)

    @property
    def full_name(self):
        """``suite.name``."""
        return f"{self.suite}.{self.name}"

    @property
    def placeholders(self):
        """Sorted names of the launch placeholders its arguments and ``exec_prefix`` use,
        e.g. ``["n_gpu"]``."""
        used = set()
        for value in [*self.arguments.values(), *self.exec_prefix]:
            if isinstance(value, str):
                used |= template_fields(value)
        return sorted(used)

    def argv(self, values=None):
        """The test's arguments as argv: ``--flag value``; ``true`` → bare flag.

        Args:
            values: the launch's placeholder values (``{name: value}``, see
                :func:`milarun.plan.launches.placeholder_values`): string values are then
                filled (``{{`` becomes ``{``). None: strings stay as written.
        """
        out = []
        for key, value in self.arguments.items():
            flag = key if key.startswith("-") else f"--{key}"
            if value is True:
                out.append(flag)
            elif value is False:
                continue
            elif isinstance(value, str):
                out += [flag, _fill(value, values)]
            else:
                out += [flag, str(value)]
        return out

    def prefix(self, values=None):
        """``exec_prefix`` as argv, its strings filled as :meth:`argv` fills arguments."""
        return [_fill(item, values) for item in self.exec_prefix]

    def matches(self, token):
        """True when ``token`` is the job's name, its group or one of its tags."""
        return token in (self.name, self.group) or token in self.tags

    def as_entry(self):
        """The job as an entry of a plain profile (what ``milarun profile`` prints): its
        definition, then ``tags`` and ``group`` when set; loading it gives this job back."""
        d = self.definition
        out = {k: copy.deepcopy(d[k]) for k in _ENTRY_ORDER if k in d}
        out.update({k: copy.deepcopy(v) for k, v in d.items() if k not in out})
        if self.tags:
            out["tags"] = list(self.tags)
        if self.group != self.name:
            out["group"] = self.group
        return out


def _fill(text, values):
    """Template ``text`` filled with a launch's placeholder ``values`` (``{{`` becomes
    ``{``); as written when ``values`` is None. :func:`validate_job` checked it fills."""
    return text if values is None else text.format(**values)


def deep_merge(base, over):
    """Return ``base`` updated with ``over``, merging nested dicts recursively."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def template_fields(text):
    """The field names of ``str.format`` template ``text`` (a set; empty when malformed)."""
    try:
        return {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
    except ValueError:
        return set()


def substitute(text, values):
    """Fill the fields of ``text`` named in ``values``; keep every other field and
    escaped brace as written. Values go in as written (a value may itself be a
    placeholder, such as ``"{cpu_per_gpu}"``); ``true``/``false`` read as in JSON.

    Raises:
        ValueError: ``text`` is not a valid template.
    """
    out = []
    for literal, name, spec, conv in string.Formatter().parse(text):
        out.append(literal.replace("{", "{{").replace("}", "}}"))
        if name is None:
            continue
        if name in values and not spec and not conv:
            out.append(_show_value(values[name]))
        else:
            out.append(
                "{" + name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
            )
    return "".join(out)


def _show_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _fill_matrix(value, values):
    """An argument value with a matrix point's ``{axis}`` fields filled; a value that is
    exactly one axis field takes that value, with its type."""
    if not isinstance(value, str):
        return value
    try:
        parsed = list(string.Formatter().parse(value))
        if (
            len(parsed) == 1
            and parsed[0][0] == ""
            and parsed[0][1] in values
            and not parsed[0][2]
            and not parsed[0][3]
        ):
            return values[parsed[0][1]]
        return substitute(value, values)
    except ValueError:
        return value  # a malformed template: validate_job says so


def _label(name):
    return f"template {name!r}" if name.startswith("_") else f"job {name!r}"


def _err(path, where, key, message):
    """``ProfileError`` ``<path>: <where>[, key '<key>']: <message>``."""
    return ProfileError(f"{where}" + (f", key {key!r}" if key else "") + f": {message}", path=path)


def check_experiment(spec):
    """Check that ``"module:function"`` exists *without importing the module*.

    The module is found without importing it or its packages (:func:`_find_spec`),
    and its source is parsed for a top-level ``def``, assignment or import of the
    function's name, so the launcher never imports torch or a workload. A module
    this process has already loaded (``sys``, ``os``, a built-in) is looked up on
    the loaded module; one found without Python source (an extension module, a
    ``.pyc`` only) is accepted, its function is checked when the child imports it.
    Returns None when fine, else a message.
    """
    try:
        mod_name, fn_name = entrypoint.parse(spec)
    except ValueError as exc:
        return str(exc)
    loaded = sys.modules.get(mod_name)
    if loaded is not None:
        if not callable(getattr(loaded, fn_name, None)):
            return f"module {mod_name!r} has no function {fn_name!r}"
        return None
    try:
        found = _find_spec(mod_name)
    except (ImportError, ValueError) as exc:
        return f"cannot import module {mod_name!r} ({exc})"
    if found is None:
        return f"cannot import module {mod_name!r} (no such module)"
    origin = found.origin
    if origin and origin.endswith(".py"):
        try:
            tree = ast.parse(Path(origin).read_bytes())
        except (OSError, SyntaxError, ValueError) as exc:
            return f"cannot read module {mod_name!r} ({exc})"
        names = _top_level_names(tree)
        if fn_name not in names and "*" not in names and "__getattr__" not in names:
            return f"module {mod_name!r} has no function {fn_name!r}"
    return None


#: ``try`` statements: ``ast.TryStar`` (``except*``) from Python 3.11.
_TRY = (ast.Try, getattr(ast, "TryStar", ast.Try))


def _top_level_names(tree):
    """The names a module's source binds at its top level, in ``if``/``try``/``with``
    blocks too (``try: from fast import f`` / ``except ImportError: def f``); ``*``
    for a star import, whose names only an import would tell."""
    names = set()
    todo = list(tree.body)
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            names |= {
                t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)
            }
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in n.names}
        elif isinstance(n, (ast.If, *_TRY, ast.With, ast.For, ast.While)):
            todo.extend(n.body + n.orelse if not isinstance(n, ast.With) else n.body)
            if isinstance(n, _TRY):
                todo.extend(n.finalbody)
                todo.extend(s for h in n.handlers for s in h.body)
    return names


def _find_spec(mod_name):
    """The module spec of ``mod_name``, or None, without importing it or its parent
    packages (``importlib.util.find_spec("torch.nn")`` would import torch): each
    part is searched for in the folders of the part before it.

    Raises:
        ImportError: a parent is not a package.
        ValueError: a malformed name.
    """
    parts = mod_name.split(".")
    found = importlib.util.find_spec(parts[0])
    for i in range(1, len(parts)):
        if found is None:
            return None
        name = ".".join(parts[: i + 1])
        parent = sys.modules.get(".".join(parts[:i]))
        if parent is not None:
            # loaded already (milarun.models, say): its own finders know best
            found = importlib.util.find_spec(name)
            continue
        if found.submodule_search_locations is None:
            raise ImportError(f"{'.'.join(parts[:i])!r} is not a package")
        found = importlib.machinery.PathFinder.find_spec(
            name, list(found.submodule_search_locations)
        )
    return found


def check_template(text, fields):
    """Check a ``str.format`` template against the placeholders it may use.

    The template is parsed and filled once with dummy values, so a template
    that passes never fails when the launcher fills it (``student{`` or
    ``{device!x}`` are caught here). Returns None when fine, else a message.
    """
    try:
        parsed = [
            (f, spec, conv) for _, f, spec, conv in string.Formatter().parse(text) if f is not None
        ]
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


def _schema_error(path, data, ref, job=None, origin=None):
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
        job, keys = keys[0], keys[1:]
        where = "job '*'" if job == "*" else _label(job)
        raise _err(path, where, key_path(keys), message)
    path, where = origin(keys) if origin else (path, f"job {job!r}")
    raise _err(path, where, key_path(keys), message)


def validate_job(path, name, d, origin=None, experiments=None):
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

    def fail(keys, message):
        where_path, where = origin(keys)
        return _err(where_path, where, key_path(keys), message)

    _schema_error(path, d, "profile#/$defs/job", job=name, origin=origin)
    experiments = {} if experiments is None else experiments
    spec = d["experiment"]
    if spec not in experiments:
        experiments[spec] = check_experiment(spec)
    if experiments[spec]:
        raise fail(["experiment"], experiments[spec])
    launch_strings = [
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
    problem = plantypes.plan_type(scheme.get("type", "per-gpu")).check(scheme, launcher)
    if problem:
        raise fail(["partition_scheme", problem[0]], problem[1])
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


# --- reading: include, inherits, matrix ------------------------------------------------


@dataclass
class _Layer:
    """One file's text of one entry."""

    path: Path
    entry: str
    data: object


def _has(data, keys):
    for k in keys:
        if isinstance(data, dict) and k in data:
            data = data[k]
        elif isinstance(data, list) and isinstance(k, int) and 0 <= k < len(data):
            data = data[k]
        else:
            return False
    return True


def _real(path, referrer=None, inc=None):
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


def _rename_fields(value, renames):
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


def from_milabench(data):
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
    out = {}
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


def _read(path, stack, files):
    """``{entry: [_Layer, ...]}`` of profile ``path``, the layers of its includes first.

    ``stack``: resolved paths of the files including this one (a cycle check);
    ``files`` collects every file read, in order.
    """
    data = from_milabench(read_json(path, error_cls=ProfileError, what="profile"))
    _schema_error(path, data, "profile")
    files.append(path)
    entries = {}
    for inc in data.get("include", []):
        target = Path(os.path.normpath(path.parent / inc))
        real = _real(target, path, inc)
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
        for name, layers in _read(target, stack + [real], files).items():
            entries.setdefault(name, []).extend(layers)
    for name, value in data.items():
        if name != "include":
            entries.setdefault(name, []).append(_Layer(path, name, value))
    return entries


class _Profile:
    """The entries of a profile and its includes, and how they resolve into jobs.

    Each entry is merged, chained and resolved once (memoised), so resolving is
    linear in the profile's size: a chain of n entries costs n merges, not n².
    Results are shared: callers must not change them.
    """

    def __init__(self, path, entries):
        self.path = path
        self.entries = entries
        self._merged, self._chains, self._resolved, self._experiments = {}, {}, {}, {}
        self._matrices = {}

    def merged(self, name):
        """Entry ``name``'s layers deep-merged (a template may be a non-object)."""
        if name not in self._merged:
            out = {}
            for layer in self.entries[name]:
                if isinstance(layer.data, dict) and isinstance(out, dict):
                    out = deep_merge(out, layer.data)
                else:
                    out = layer.data
            self._merged[name] = out
        return self._merged[name]

    def where_set(self, name, key):
        """The file of the last layer of entry ``name`` that sets ``key``."""
        for layer in reversed(self.entries[name]):
            if isinstance(layer.data, dict) and key in layer.data:
                return layer.path
        return self.entries[name][-1].path

    def chain(self, name):
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
                    raise _err(
                        self.where_set(name, "inherits"),
                        _label(name),
                        "inherits",
                        f"a chain of {len(full)} entries ({shown}); at most {MAX_INHERITS_DEPTH}",
                    )
                for i in range(len(full)):
                    self._chains.setdefault(full[i], full[: i + 1])
                return full
            if len(seen) > MAX_INHERITS_DEPTH:
                shown = " → ".join(seen[:3] + ["…", seen[-1]])
                raise _err(
                    self.where_set(name, "inherits"),
                    _label(name),
                    "inherits",
                    f"a chain of more than {MAX_INHERITS_DEPTH} entries ({shown})",
                )
            shown = " → ".join(seen + [parent])
            path = self.where_set(cur, "inherits")
            if parent in seen:
                raise _err(path, _label(cur), "inherits", f"inherits cycle {shown}")
            if parent == "*":
                raise _err(
                    path,
                    _label(cur),
                    "inherits",
                    "'*' is merged into every job already; it cannot be inherited",
                )
            if parent not in self.entries:
                raise _err(
                    path, _label(cur), "inherits", f"unknown entry {parent!r} (chain {shown})"
                )
            if not isinstance(self.merged(parent), dict):
                raise _err(
                    path,
                    _label(cur),
                    "inherits",
                    f"entry {parent!r} is not an object (chain {shown})",
                )
            seen.append(parent)

    def layers(self, name):
        """The layers entry ``name`` resolves from: ``"*"``'s, then its chain's objects."""
        return self.entries.get("*", []) + [
            layer
            for e in self.chain(name)
            for layer in self.entries[e]
            if isinstance(layer.data, dict)
        ]

    def resolved(self, name):
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

    def matrix(self, name):
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

    def count(self, name):
        """How many jobs entry ``name`` makes: its matrix's points, else 1 (before any
        is made; a matrix over :data:`MAX_MATRIX_JOBS` counts 0: :meth:`points` refuses it)."""
        matrix = self.matrix(name)
        if not isinstance(matrix, dict):
            return 1
        count = math.prod(len(v) if isinstance(v, list) else 1 for v in matrix.values())
        return count if count <= MAX_MATRIX_JOBS else 0

    def jobs(self, suite):
        """Every job, in file order (includes first; a matrix expands in place).

        Raises:
            ProfileError: a bad entry, or more than :data:`MAX_JOBS` jobs in all
                (counted before any is made).
        """
        star = self.entries.get("*", [])
        if star:
            for key in ("inherits", "matrix", "name", "enabled"):
                if key in self.merged("*"):
                    raise _err(
                        self.where_set("*", key), "job '*'", key, "not allowed in the defaults"
                    )
        names = []
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
                raise _err(
                    path,
                    f"job {name!r}",
                    "matrix" if has_matrix else None,
                    f"the profile makes more than {MAX_JOBS} jobs ({total} with this entry's)",
                )
        jobs, made_by = [], {}
        for name in names:
            layers = self.layers(name)
            for job in self.expand(name, self.resolved(name), layers, suite):
                if job.name in made_by:
                    raise _err(
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

    def origin(self, layers, entry, job):
        """``f(keys) -> (path, where)``: the layer that wrote ``keys`` of ``job``."""

        def label(source):
            return f"job {job!r}" if source in ("*", job) else f"job {job!r} (from {source!r})"

        def find(keys):
            for layer in reversed(layers):
                if _has(layer.data, keys):
                    return layer.path, label(layer.entry)
            return self.entries[entry][-1].path, label(entry)

        return find

    def expand(self, name, resolved, layers, suite):
        """The jobs of entry ``name`` (one, or one per point of its matrix)."""

        def fail(keys, message, job=name):
            path, where = self.origin(layers, name, job)(keys)
            return _err(path, where, key_path(keys), message)

        matrix = resolved.get("matrix")
        if matrix is None:
            if "name" in resolved:
                raise fail(["name"], "a name template needs a 'matrix' to expand")
            points = [({}, name)]
        else:
            points = self.points(name, resolved, fail)
        out = []
        for values, job_name in points:
            d = {k: v for k, v in resolved.items() if k not in LANGUAGE_KEYS}
            if values and isinstance(d.get("arguments"), dict):
                d["arguments"] = {k: _fill_matrix(v, values) for k, v in d["arguments"].items()}
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
                    definition=d,
                    tags=list(resolved.get("tags", [])),
                    group=resolved.get("group") or name,
                    matrix=values,
                )
            )
        return out

    def points(self, name, resolved, fail):
        """``[(values, job name)]`` of a matrix entry, last axis fastest."""
        matrix, template = resolved["matrix"], resolved.get("name")
        if template is None:
            raise fail(["matrix"], "a matrix needs a 'name' template, e.g. \"name-{axis}\"")
        axes = list(matrix)
        for axis in axes:
            if axis in LAUNCH_FIELDS:
                raise fail(
                    ["matrix", axis],
                    f"axis {axis!r} is a launch placeholder; give the axis another name",
                )
        problem = check_template(template, {a: "x" for a in axes})
        if problem:
            if problem.startswith("unknown placeholder"):
                problem += f" (the axes: {', '.join(axes)})"
            raise fail(["name"], problem)
        count = math.prod(len(v) for v in matrix.values())
        if count > MAX_MATRIX_JOBS:
            raise fail(["matrix"], f"{count} combinations; at most {MAX_MATRIX_JOBS}")
        used = template_fields(template)
        arguments = resolved.get("arguments")
        for value in arguments.values() if isinstance(arguments, dict) else ():
            if isinstance(value, str):
                used |= template_fields(value)
        for axis in axes:
            if axis not in used:
                raise fail(["matrix", axis], "axis used in neither 'name' nor 'arguments'")
        points = []
        for combo in itertools.product(*matrix.values()):
            values = dict(zip(axes, combo))
            # a placeholder value ("{cpu_per_gpu}") shows in the name without its braces
            job_name = substitute(
                template,
                {a: _show_value(v).replace("{", "").replace("}", "") for a, v in values.items()},
            )
            found = first_error(job_name, "common#/$defs/job_name")
            if found:
                raise fail(["name"], f"makes {job_name!r}: {found[1]}")
            points.append((values, job_name))
        return points


def profile_files(path):
    """Every file profile ``path`` reads: itself, then its includes (depth first).

    Raises:
        ProfileError: as :func:`load_profile` for an unreadable file or include.
    """
    path = Path(path)
    files = []
    _read(path, [_real(path)], files)
    return files


def select_jobs(jobs, path, names=None, select=None, exclude=None):
    """The jobs ``--name``, ``--select`` and ``--exclude`` keep, in profile order.

    ``names``: exact job names. ``select``: keep the jobs a token matches (its
    name, group or one of its tags; see :meth:`Job.matches`). ``exclude``:
    then drop the jobs a token matches.

    Raises:
        ProfileError: a name or token that matches no job of the profile, or
            nothing left.
    """
    everything = jobs
    if names:
        known = [j.name for j in jobs]
        for n in names:
            if n not in known:
                raise ProfileError(
                    f"unknown job name {n!r} (--name); known: {', '.join(known)}", path=path
                )
        jobs = [j for j in jobs if j.name in names]
    for flag, tokens in (("--select", select), ("--exclude", exclude)):
        for token in tokens or ():
            if not any(j.matches(token) for j in everything):
                tags = sorted({t for j in everything for t in j.tags})
                raise ProfileError(
                    f"{token!r} ({flag}) is no job name, group or tag of this "
                    f"profile; tags: {', '.join(tags) or 'none'}",
                    path=path,
                )
    if select:
        jobs = [j for j in jobs if any(j.matches(t) for t in select)]
    if exclude:
        jobs = [j for j in jobs if not any(j.matches(t) for t in exclude)]
    if not jobs:
        raise ProfileError("no job left after --name/--select/--exclude", path=path)
    return jobs


def load_profile(path, names=None, select=None, exclude=None):
    """Read, merge and validate a profile; return its jobs in file order.

    Args:
        path: the JSON file.
        names: optional list of job names to keep (``--name``).
        select, exclude: optional lists of job names, groups or tags (see
            :func:`select_jobs`).

    Returns:
        list of ``Job``.

    Raises:
        ProfileError: unreadable file or include, bad JSON, bad definitions,
            unknown name; one line naming the file, the entry and the key.
    """
    path = Path(path)
    entries = _read(path, [_real(path)], [])
    suite = path.stem
    found = first_error(suite, "common#/$defs/job_name")
    if found:
        raise ProfileError(
            f"the file name {suite!r} is not a valid suite name: it becomes the "
            "suite of every result (letters, digits, '_' and '-')",
            path=path,
        )
    jobs = _Profile(path, entries).jobs(suite)
    if not jobs:
        raise ProfileError("the profile defines no job", path=path)
    return select_jobs(jobs, path, names, select, exclude)
