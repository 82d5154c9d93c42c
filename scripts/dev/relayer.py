"""Regroup ``milarun/`` into layers (issue 21, section 1): move the modules, rewrite the imports.

Run inside the repository, on a clean tree that still has the old layout (from this branch,
or from anywhere: ``git show layers:scripts/dev/relayer.py > /tmp/relayer.py``)::

    python3 scripts/dev/relayer.py        # git mv + rewrite, nothing committed
    git add -A && git commit -m "Move the modules into layers (scripts/dev/relayer.py)"

It is mechanical and deterministic, so it can be run again on a newer ``main``:

1. ``git mv`` every module of :data:`MOVES` to its layer (folders move whole);
2. in every tracked ``.py`` file of milarun/, tests/, benchmarks/ and scripts/, rewrites each
   import statement (absolute ``milarun.x`` and relative ``from .x``/``from ..x``) from the
   resolved old module to the new one (relative stays relative, from the file's new place;
   ``from milarun import launch`` becomes ``from milarun.launcher import launch``, and a
   module that was renamed keeps its old name as an alias: ``from milarun.host import facts
   as hostfacts``), and every other dotted ``milarun.x.y`` name (strings, docstrings);
3. in docs/, README.md, pyproject.toml, the shell scripts and the JSON Schemas' comments,
   rewrites the dotted names and the ``milarun/x/y.py`` paths;
4. writes each new package's ``__init__.py`` (a docstring) and removes
   ``milarun/results/__init__.py`` (its re-exports had one user, a test's code string);
5. applies :data:`FIXUPS`, literal edits that a rename cannot find (the schema folder's
   resource path, the package folder of host/facts.py, ``from milarun import x`` inside a
   test's code string); each must match, else the script stops.

Manual steps, each its own commit on branch ``layers`` after the script's one; to re-apply on
a newer main, run the script there, commit, then ``git cherry-pick`` those commits (they
applied cleanly on the main of 26 Nov 2026, 05:20 UTC; resolve by hand where a newer main
changed the same lines):

1. break the three cycles: ``student_plan`` (and the ``python -m`` entry) from
   host/isolation.py into host/students.py (``scripts/cgroup_setup.sh`` calls
   ``-m milarun.host.students``); ``resolve_dataroot`` from cli/jobs.py into
   launcher/dryrun.py (cli/jobs.py and cli/slurm.py import it from there); ``say`` from
   launcher/launch.py into errors.py; ``fmt_num``, ``fmt_pct``, ``finite_or_warn`` and
   ``geomean_or_warn`` into report/formatting.py;
2. ``.importlinter``, ``tests/test_architecture.py``, import-linter in pyproject.toml's dev
   extra and in requirements.lock (``uv pip compile`` as in docs/setup.md, with the old lock
   in place so that the other pins stay);
3. hoist the imports between milarun modules out of functions, and comment each one that
   stays (``scripts/dev/count_imports.py list`` lists them; a module of the newer main
   may add some: ``tests/test_architecture.py`` names each one to hoist or comment);
4. the documents that name modules without the ``milarun.`` / ``milarun/`` prefix
   (docs/development.md's layout line), docs/architecture.md and its line in docs/README.md.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

#: (old path, new path) under milarun/; a folder moves whole.
MOVES = (
    # formats: files on disk and on the wire
    ("jsonfile.py", "formats/jsonfile.py"),
    ("outfile.py", "formats/outfile.py"),
    ("terminal.py", "formats/terminal.py"),
    ("schemas", "formats/schemas"),
    ("results/schema.py", "formats/record.py"),
    ("results/store.py", "formats/store.py"),
    ("results/journal.py", "formats/journal.py"),
    ("results/trust.py", "formats/trust.py"),
    ("barrier.py", "formats/barrier.py"),
    # host: the machine
    ("accel", "host/accel"),
    ("devices.py", "host/devices.py"),
    ("isolation.py", "host/isolation.py"),
    ("hostfacts.py", "host/facts.py"),
    ("supervise.py", "host/supervise.py"),
    # measure: pure numbers
    ("stats.py", "measure/stats.py"),
    ("confidence.py", "measure/confidence.py"),
    ("throughput.py", "measure/throughput.py"),
    ("energy.py", "measure/energy.py"),
    ("validation.py", "measure/validation.py"),
    ("anomalies.py", "measure/anomalies.py"),
    # plan
    ("plantypes.py", "plan/types.py"),
    ("plan.py", "plan/launches.py"),
    ("nodes.py", "plan/nodes.py"),
    # profile
    ("profile.py", "profile/language.py"),
    # launcher
    ("launch.py", "launcher/launch.py"),
    ("fanout.py", "launcher/fanout.py"),
    ("session.py", "launcher/session.py"),
    ("progress.py", "launcher/progress.py"),
    ("dryrun.py", "launcher/dryrun.py"),
    # analysis
    ("summary.py", "analysis/summary.py"),
)

#: The new packages and their docstrings.
PACKAGES = {
    "formats": "File formats: the strict JSON reader, the schemas, the result record, store and\n"
    "journal, the barrier's wire format. The lowest layer above ``errors``.",
    "host": "The machine: device backends (``accel``), devices, cgroups and CPU lists, host\n"
    "facts, parent-death supervision.",
    "measure": "Pure numbers, no I/O: steady state, intervals, effective throughput, energy,\n"
    "validation flags, anomalies.",
    "plan": "From jobs to launches: plan types (one registry), launches, nodes.",
    "profile": "The job record and the profile language (include, inherits, matrix, placeholders).",
    "launcher": "The parent's side of a run: launches, process groups, outcomes, prepare, preflight\n"
    "and dry run, fan-out over ssh/srun, progress, the session file.",
    "analysis": "Results -> summary.",
}

#: Files that disappear (their content is not moved).
REMOVED = ("results/__init__.py",)

#: Literal edits a rename cannot find: (new path, old text, new text).
FIXUPS = (
    (
        "milarun/formats/jsonfile.py",
        'resources.files("milarun") / "schemas"',
        'resources.files("milarun.formats") / "schemas"',
    ),
    (
        "tests/test_bad_inputs.py",
        'resources.files("milarun") / "schemas"',
        'resources.files("milarun.formats") / "schemas"',
    ),
    (
        "tests/test_security_profiles.py",
        'Path(profile.__file__).parent / "schemas"',
        'Path(profile.__file__).parent.parent / "formats" / "schemas"',
    ),
    (
        "tests/test_launch.py",
        "from milarun.formats import new_result, write_result;",
        "from milarun.formats.record import new_result; "
        "from milarun.formats.store import write_result;",
    ),
    (
        "tests/test_multinode_faults.py",
        '"from milarun import supervise; "',
        '"from milarun.host import supervise; "',
    ),
    # the package folder, one level up from the module now
    (
        "milarun/host/facts.py",
        "root = Path(package_dir or Path(__file__).resolve().parent).parent",
        "root = Path(package_dir or Path(__file__).resolve().parents[1]).parent",
    ),
)

#: Where to rewrite: (folder or file, suffixes).
TARGETS = (
    ("milarun", (".py", ".json")),
    ("tests", (".py",)),
    ("benchmarks", (".py",)),
    ("scripts", (".py", ".sh")),
    ("docs", (".md",)),
    ("README.md", ("",)),
    ("pyproject.toml", ("",)),
    (".ci", ("",)),
)

#: The repository the script runs in (the current folder's), wherever the script file lies.
ROOT = Path(
    subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], check=True, capture_output=True, text=True
    ).stdout.strip()
)
SELF = Path(__file__).resolve()


def git(*args):
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def module_of(path):
    """``milarun/a/b.py`` -> (``milarun.a.b``, is_package)."""
    parts = list(Path(path).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def build_map():
    """Old dotted name -> new dotted name, for every moved module, package and data folder."""
    mapping = {}
    for old, new in MOVES:
        o = "milarun." + old.removesuffix(".py").replace("/", ".")
        n = "milarun." + new.removesuffix(".py").replace("/", ".")
        mapping[o] = n
    return mapping


MAP = build_map()
#: Old modules (dotted) that exist, for resolving ``from pkg import name``.
OLD_MODULES = set()


def new_name(dotted):
    """The new name of an old dotted name (a module, or a name inside one): longest prefix."""
    parts = dotted.split(".")
    for i in range(len(parts), 1, -1):
        head = ".".join(parts[:i])
        if head in MAP:
            return ".".join([MAP[head]] + parts[i:])
    if dotted == "milarun.results" or dotted.startswith("milarun.results."):
        return "milarun.formats" + dotted[len("milarun.results") :]
    return dotted


DOTTED = re.compile(r"(?<![\w.])milarun(?:\.\w+)+")
PATH = re.compile(r"(?<![\w/.])milarun(?:/[\w-]+(?:\.[\w-]+)*)+")


def sub_dotted(text):
    return DOTTED.sub(lambda m: new_name(m.group(0)), text)


def sub_path(text):
    def one(m):
        parts = m.group(0).split("/")
        for i in range(len(parts), 1, -1):
            head = ".".join(parts[: i - 1] + [parts[i - 1].removesuffix(".py")])
            if head in MAP:
                py = ".py" if parts[i - 1].endswith(".py") else ""
                return "/".join(MAP[head].split(".") + parts[i:]) + py
        if parts[1] == "results":
            return "/".join(["milarun", "formats"] + parts[2:])
        return m.group(0)

    return PATH.sub(one, text)


def relative(src_module, src_is_pkg, target):
    """``target`` (absolute, dotted) written relative to ``src_module``."""
    base = src_module.split(".") if src_is_pkg else src_module.split(".")[:-1]
    tparts = target.split(".")
    common = 0
    while common < min(len(base), len(tparts)) and base[common] == tparts[common]:
        common += 1
    dots = "." * (len(base) - common + 1)
    return dots + ".".join(tparts[common:])


def render_from(indent, module, names, comment):
    """``from module import a, b as c`` (wrapped in parentheses past 99 columns)."""
    items = [n if a is None else f"{n} as {a}" for n, a in names]
    line = f"{indent}from {module} import {', '.join(items)}{comment}"
    if len(line) <= 99:
        return [line]
    out, cur = [f"{indent}from {module} import ("], indent + "    "
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else ")")
        if len(cur) + len(piece) + 1 > 99 and cur.strip():
            out.append(cur.rstrip())
            cur = indent + "    "
        cur += piece + " "
    out.append(cur.rstrip() + comment)
    return out


def rewrite_import(node, lines, src_old, src_new, src_pkg, in_package):
    """New lines for one import statement, or None when it stays as it is."""
    first = lines[node.lineno - 1]
    indent = first[: len(first) - len(first.lstrip())]
    last = lines[node.end_lineno - 1]
    comment = ""
    if "#" in last:
        # a trailing comment (imports hold no '#' in strings)
        comment = "  " + last[last.index("#") :].rstrip()
    if isinstance(node, ast.Import):
        if not any(a.name.split(".")[0] == "milarun" for a in node.names):
            return None
        items = [a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names]
        new = [new_name(a.name) + (f" as {a.asname}" if a.asname else "") for a in node.names]
        if new == items:
            return None
        return [f"{indent}import {', '.join(new)}{comment}"]
    # ImportFrom
    if node.level:
        if not in_package:
            return None
        base = src_old.split(".") if src_pkg else src_old.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
        if mod.split(".")[0] != "milarun":
            return None
    groups = {}  # new from-module -> [(name, alias)]
    for a in node.names:
        full = f"{mod}.{a.name}"
        if full in OLD_MODULES or full in MAP:
            target = new_name(full)
            parent, _, leaf = target.rpartition(".")
            alias = a.asname or (a.name if leaf != a.name else None)
            groups.setdefault(parent, []).append((leaf, alias))
        else:
            groups.setdefault(new_name(mod), []).append((a.name, a.asname))
    original = "." * node.level + (node.module or "")
    if len(groups) == 1:
        ((target, names),) = groups.items()
        module = relative(src_new, src_pkg, target) if node.level else target
        if names == [(a.name, a.asname) for a in node.names]:
            if module == original:
                return None
            # only the module changes: keep the statement's own layout
            new = [lines[n - 1] for n in range(node.lineno, node.end_lineno + 1)]
            new[0] = re.sub(
                r"\bfrom\s+" + re.escape(original) + r"(?=\s)", "from " + module, new[0], count=1
            )
            return new
    out = []
    for target, names in groups.items():
        module = relative(src_new, src_pkg, target) if node.level else target
        out += render_from(indent, module, names, "")
    if comment:
        out[-1] += comment
    old = lines[node.lineno - 1 : node.end_lineno]
    if [line.rstrip() for line in old] == out:
        return None
    return out


def rewrite_python(path, text, src_old, src_new, src_pkg, in_package):
    lines = text.split("\n")
    tree = ast.parse(text)
    edits = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            new = rewrite_import(node, lines, src_old, src_new, src_pkg, in_package)
            if new is not None:
                first = lines[node.lineno - 1]
                if first[: len(first) - len(first.lstrip())] != first[: node.col_offset]:
                    raise SystemExit(
                        f"{path}:{node.lineno}: an import that is not alone on "
                        "its line: edit by hand"
                    )
                edits[node.lineno] = (node.end_lineno, new)
    out, n = [], 1
    while n <= len(lines):
        edit = edits.get(n)
        if edit:
            end, new = edit
            out += new
            n = end + 1
            continue
        out.append(sub_path(sub_dotted(lines[n - 1])))
        n += 1
    return "\n".join(out)


def main():
    if not (ROOT / "milarun/launch.py").exists():
        raise SystemExit("relayer: milarun/launch.py is gone: the tree is already relayered")
    if git("status", "--porcelain", "--untracked-files=no").strip():
        raise SystemExit("relayer: the tree has uncommitted changes: commit or stash them")
    tracked = git("ls-files").split("\n")
    for f in tracked:
        if f.startswith("milarun/") and f.endswith(".py"):
            OLD_MODULES.add(module_of(f)[0])
    OLD_MODULES.update(MAP)

    def new_path(f):
        rel = f.removeprefix("milarun/")
        for old, new in MOVES:
            if rel == old or rel.startswith(old + "/"):
                return "milarun/" + new + rel[len(old) :]
        return f

    files = []
    for f in tracked:
        if not f or not (ROOT / f).is_file() or (ROOT / f).resolve() == SELF:
            continue
        for where, suffixes in TARGETS:
            if (f == where or f.startswith(where + "/")) and any(f.endswith(s) for s in suffixes):
                files.append(f)
                break
    changed = 0
    for f in files:
        if f.removeprefix("milarun/") in REMOVED:
            continue
        text = (ROOT / f).read_text()
        if f.endswith(".py"):
            in_package = f.startswith("milarun/")
            src_old, src_pkg = module_of(f) if in_package else ("", False)
            src_new = module_of(new_path(f))[0] if in_package else ""
            new = rewrite_python(f, text, src_old, src_new, src_pkg, in_package)
        else:
            new = sub_path(sub_dotted(text))
        if new != text:
            (ROOT / f).write_text(new)
            changed += 1
    for rel in REMOVED:
        git("rm", "-q", "milarun/" + rel)
    for name, doc in PACKAGES.items():
        init = ROOT / "milarun" / name / "__init__.py"
        init.parent.mkdir(parents=True, exist_ok=True)
        init.write_text(f'"""{doc}"""\n')
    for old, new in MOVES:
        (ROOT / "milarun" / new).parent.mkdir(parents=True, exist_ok=True)
        git("mv", "milarun/" + old, "milarun/" + new)
    for name in PACKAGES:
        git("add", f"milarun/{name}/__init__.py")
    for f, old, new in FIXUPS:
        text = (ROOT / f).read_text()
        if old not in text:
            raise SystemExit(f"relayer: fix-up not found in {f}: {old!r}")
        (ROOT / f).write_text(text.replace(old, new))
    git(
        "add",
        "-A",
        "milarun",
        "tests",
        "benchmarks",
        "scripts",
        "docs",
        "README.md",
        "pyproject.toml",
    )
    print(f"relayer: {len(MOVES)} moves, {changed} files rewritten, {len(FIXUPS)} fix-ups")


if __name__ == "__main__":
    sys.exit(main())
