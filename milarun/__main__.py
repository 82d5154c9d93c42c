"""``python -m milarun`` runs the CLI (the launcher starts children this way).

``-m`` puts the current folder first on ``sys.path`` (unless ``-P``): it is taken
off before anything else is imported, so ``milarun run mod:fn`` never imports a
``mod.py`` that lies in the folder it was started from (a results folder, say).
A user's own workload module is found through ``PYTHONPATH`` or an install.
"""

import os
import sys


def _cwd():
    try:
        return os.getcwd()
    except OSError:  # the folder was removed: "" still names it
        return ""


if not getattr(sys.flags, "safe_path", False) and sys.path and sys.path[0] in ("", _cwd()):
    del sys.path[0]

from .cli import main  # noqa: E402

main(process_entry=True)
