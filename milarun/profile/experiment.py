"""Check that a job's ``"module:function"`` exists without importing the module, so the
launcher never imports torch or a workload."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

from ..formats import entrypoint


def check_experiment(spec: object) -> str | None:
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


def _top_level_names(tree: ast.Module) -> set[str]:
    """The names a module's source binds at its top level, in ``if``/``try``/``with``
    blocks too (``try: from fast import f`` / ``except ImportError: def f``); ``*``
    for a star import, whose names only an import would tell."""
    names: set[str] = set()
    todo: list[ast.stmt] = list(tree.body)
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


def _find_spec(mod_name: str) -> importlib.machinery.ModuleSpec | None:
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
