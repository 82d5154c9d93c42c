"""Count the import statements between milarun modules, and those inside functions.

    .venv/bin/python scripts/dev/count_imports.py [ROOT] [list]

``list`` also prints each import inside a function (``source:line -> target``).
Issue 21: 107 of 281 inside functions before the layers, 41 of 270 after (the cli's lazy
imports, for start-up, and the progress display's one, each with its comment).
"""
import ast, sys, pathlib
root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else '.')
pkg = root / 'milarun'
mods = {}
for p in sorted(pkg.rglob('*.py')):
    rel = p.relative_to(root).with_suffix('')
    parts = list(rel.parts)
    if parts[-1] == '__init__':
        parts = parts[:-1]
        ispkg = True
    else:
        ispkg = False
    mods['.'.join(parts)] = (p, ispkg)
def resolve(name):
    while name and name not in mods:
        name = name.rpartition('.')[0]
    return name
edges = []
for m, (p, ispkg) in mods.items():
    tree = ast.parse(p.read_text())
    def walk(node, infunc):
        for ch in ast.iter_child_nodes(node):
            f = infunc or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(ch, ast.Import):
                for a in ch.names:
                    if a.name.split('.')[0] == 'milarun':
                        edges.append((m, resolve(a.name), ch.lineno, infunc))
            elif isinstance(ch, ast.ImportFrom):
                if ch.level:
                    base = m.split('.') if ispkg else m.split('.')[:-1]
                    base = base[:len(base) - (ch.level - 1)]
                    mod = '.'.join(base + ([ch.module] if ch.module else []))
                else:
                    mod = ch.module or ''
                if mod.split('.')[0] != 'milarun':
                    continue
                for a in ch.names:
                    full = mod + '.' + a.name
                    t = full if full in mods else mod
                    edges.append((m, resolve(t), ch.lineno, infunc))
            walk(ch, f)
    walk(tree, False)
if __name__ == '__main__':
    mode = sys.argv[2] if len(sys.argv) > 2 else 'count'
    # count import statements: dedupe by (src, lineno)
    stmts = {}
    for s, t, l, f in edges:
        if s != t:
            stmts[(s, l)] = f
    tot = len(stmts); inf = sum(stmts.values())
    print(f'import statements between milarun modules: {tot}, inside functions: {inf}')
    if mode == 'list':
        for s, t, l, f in sorted(edges):
            if f: print(f'{s}:{l} -> {t}')
