"""Count the import statements between milarun modules, and those inside functions.

    .venv/bin/python scripts/dev/count_imports.py [list]

``list`` also prints each import inside a function (``path:line: source -> target``).
The walker is tests/test_architecture.py's, so the count and the test see the same imports.
The imports inside functions are the cli's lazy ones (for start-up) and a few others, each
with its comment (docs/architecture.md).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_architecture import imports  # noqa: E402  (a test module, not a package)


def main(argv):
    found = imports()
    statements = {(e.path, e.lineno): e.in_function for e in found}
    inside = sum(statements.values())
    print(
        f"import statements between milarun modules: {len(statements)}, inside functions: {inside}"
    )
    if argv[1:] == ["list"]:
        seen = set()
        for e in sorted(found, key=lambda e: (str(e.path), e.lineno)):
            if e.in_function and (e.path, e.lineno) not in seen:
                seen.add((e.path, e.lineno))
                print(e)


if __name__ == "__main__":
    main(sys.argv)
