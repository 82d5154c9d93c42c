"""The import direction of milarun (docs/architecture.md, the layers of ``.importlinter``).

``lint-imports`` checks the contracts of ``.importlinter``. This file runs it, and walks the
AST of every module itself, imports inside functions included, to fail on an import cycle
between milarun modules, an import up the layer order (or between independent siblings), an
import of ``milarun.cli`` from outside ``cli/``, and an import of a milarun module inside a
function without a comment saying why (on its line, or above its block of imports).
"""

import ast
import configparser
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "milarun"
CONFIG = ROOT / ".importlinter"


def read_contract():
    """(layers, ignored edges) of the ``layers`` contract: layers top to bottom, each a
    list of sibling names (``milarun.<name>``); ignored edges as (importer, imported)."""
    parser = configparser.ConfigParser(inline_comment_prefixes=None)
    parser.read(CONFIG)
    contract = parser["importlinter:contract:layers"]
    (container,) = contract["containers"].split()
    layers = []
    for line in contract["layers"].strip().splitlines():
        names = [n.strip().strip("()") for n in line.replace(":", "|").split("|")]
        layers.append([f"{container}.{n}" for n in names if n])
    ignored = set()
    for line in contract.get("ignore_imports", "").strip().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            a, _, b = line.partition("->")
            ignored.add((a.strip(), b.strip()))
    return layers, ignored


def modules():
    """{dotted name: (path, is_package)} of every module of milarun."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


class Import:
    def __init__(self, source, target, path, lineno, in_function):
        self.source, self.target, self.path = source, target, path
        self.lineno, self.in_function = lineno, in_function

    def __repr__(self):
        where = " (in a function)" if self.in_function else ""
        return f"{self.path.relative_to(ROOT)}:{self.lineno}: {self.source} -> {self.target}{where}"


def imports(mods=None):
    """Every import of a milarun module by a milarun module, at any depth of the AST."""
    mods = mods or modules()

    def resolve(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    found = []
    for name, (path, is_pkg) in mods.items():
        tree = ast.parse(path.read_text(), str(path))

        def walk(node, in_function):
            for child in ast.iter_child_nodes(node):
                inside = in_function or isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
                )
                targets = []
                if isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = name.split(".") if is_pkg else name.split(".")[:-1]
                        base = base[: len(base) - (child.level - 1)]
                        module = ".".join(base + ([child.module] if child.module else []))
                    else:
                        module = child.module or ""
                    targets = [
                        f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module
                        for a in child.names
                    ]
                for target in targets:
                    if target.split(".")[0] == "milarun":
                        resolved = resolve(target)
                        if resolved != name:
                            found.append(Import(name, resolved, path, child.lineno, in_function))
                walk(child, inside)

        walk(tree, False)
    return found


def layer_of(module, layers):
    """(index from the top, sibling name) of ``module``, or None outside every layer."""
    for i, siblings in enumerate(layers):
        for s in siblings:
            if module == s or module.startswith(s + "."):
                return i, s
    return None


def upward(edges, layers, ignored):
    """The imports that point up the layer order, or across independent siblings."""
    bad = []
    for e in edges:
        if (e.source, e.target) in ignored:
            continue
        src, dst = layer_of(e.source, layers), layer_of(e.target, layers)
        if src is None or dst is None:
            continue
        if dst[0] < src[0] or (dst[0] == src[0] and dst[1] != src[1]):
            bad.append(e)
    return bad


def cycles(edges):
    """The strongly connected components of more than one module (Tarjan)."""
    graph = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def cli_from_outside(edges):
    """Imports of ``milarun.cli`` by a module outside ``cli/`` (``__main__`` runs it)."""
    return [
        e
        for e in edges
        if (e.target == "milarun.cli" or e.target.startswith("milarun.cli."))
        and not (e.source == "milarun.cli" or e.source.startswith("milarun.cli."))
        and e.source != "milarun.__main__"
    ]


def uncommented(edges):
    """In-function imports of milarun modules with no comment on their own lines, nor a
    comment line right above their block of consecutive import statements."""
    bad, files = [], {}
    for e in edges:
        if not e.in_function:
            continue
        if e.path not in files:
            tree = ast.parse(e.path.read_text())
            spans = {
                n.lineno: n.end_lineno
                for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom))
            }
            in_import = {
                line: start for start, end in spans.items() for line in range(start, end + 1)
            }
            files[e.path] = (e.path.read_text().splitlines(), spans, in_import)
        lines, spans, in_import = files[e.path]
        if any("#" in lines[n - 1] for n in range(e.lineno, spans[e.lineno] + 1)):
            continue
        above = e.lineno - 1
        while above in in_import:
            above = in_import[above] - 1
        if above < 1 or not lines[above - 1].strip().startswith("#"):
            bad.append(e)
    return bad


def test_lint_imports_keeps_every_contract():
    lint = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run(
        [str(lint), "--no-cache", "--config", str(CONFIG)], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_every_package_of_milarun_is_in_a_layer():
    layers, _ = read_contract()
    listed = {s for siblings in layers for s in siblings}
    top = {".".join(name.split(".")[:2]) for name in modules() if name.count(".") >= 1}
    assert top - {"milarun.__main__"} <= listed, sorted(top - listed)
    assert listed <= top, sorted(listed - top)


def test_no_import_cycle_between_milarun_modules():
    assert cycles(imports()) == []


def test_no_import_points_up_the_layers():
    layers, ignored = read_contract()
    assert upward(imports(), layers, ignored) == []


def test_only_cli_imports_cli():
    assert cli_from_outside(imports()) == []


def test_each_import_inside_a_function_says_why():
    assert uncommented(imports()) == []


def test_the_checks_see_what_they_must(tmp_path):
    """The walker finds imports inside functions and each rule fires on a made-up edge."""
    edges = imports()
    assert any(e.in_function for e in edges)
    assert any(
        e.source == "milarun.cli.jobs" and e.target == "milarun.launcher.suite" for e in edges
    )
    layers, ignored = read_contract()
    fake = Path(__file__)

    def edge(a, b, infunc=False):
        return Import(a, b, fake, 1, infunc)

    assert upward([edge("milarun.measure.stats", "milarun.report.table")], layers, ignored)
    assert upward([edge("milarun.launcher.launch", "milarun.bench.rate")], layers, ignored)
    assert not upward([edge("milarun.report.table", "milarun.measure.stats")], layers, ignored)
    assert cycles([edge("milarun.a", "milarun.b"), edge("milarun.b", "milarun.a")])
    assert cli_from_outside([edge("milarun.report.table", "milarun.cli.jobs")])


ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _doc_block(title):
    """The first fenced block after the heading ``## title`` of docs/architecture.md."""
    text = ARCHITECTURE.read_text()
    _, _, after = text.partition(f"## {title}\n")
    assert after, f"docs/architecture.md has no section {title!r}"
    return after.split("```")[1].strip("\n")


def _tree_paragraphs():
    """``{package: text}`` of the tree in docs/architecture.md: each ``  name/`` line and
    the lines indented under it."""
    out, current = {}, None
    for line in _doc_block("The tree").splitlines():
        head = line[:13].strip()
        if head == "milarun/" or (
            line.startswith("  ") and not line.startswith("   ") and head.endswith("/")
        ):
            current = head.rstrip("/")
            out[current] = line[13:]
        elif current is not None:
            out[current] += " " + line.strip()
    return out


def test_the_documented_layers_are_the_contract():
    """docs/architecture.md's layer list is .importlinter's, line for line."""
    documented = [
        sorted(n.strip() for n in line.split("|"))
        for line in _doc_block("The layers").splitlines()
        if line.strip()
    ]
    layers, _ = read_contract()
    assert documented == [sorted(n.rpartition(".")[2] for n in layer) for layer in layers]


def test_every_module_is_named_in_the_documented_tree():
    """Each package of milarun has its paragraph in the tree of docs/architecture.md, and
    every module of it (a sub-package by its folder name) is named in that paragraph."""
    import re

    tree = _tree_paragraphs()
    missing = []
    for name, (_path, is_pkg) in modules().items():
        parts = name.split(".")
        if len(parts) < 2:
            continue
        if len(parts) == 2 and not is_pkg:  # a top-level module: named on milarun/'s line
            parts, is_pkg = ["milarun", "milarun", parts[1]], False
        package = parts[1]
        if package not in tree:
            missing.append(f"{package}/ (no paragraph)")
            continue
        if len(parts) == 2:
            continue
        named = parts[2] + ("/" if len(parts) > 3 or is_pkg else "")
        if not re.search(rf"(?<![\w/.]){re.escape(named)}(?![\w])", tree[package]):
            missing.append(f"{package}/{named}")
    assert not sorted(set(missing)), "not in docs/architecture.md's tree: " + ", ".join(
        sorted(set(missing))
    )
