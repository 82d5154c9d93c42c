"""``"module:function"``: how profiles, records and ``milarun run`` name a workload's
entry point (``milarun.models.X:main``), and how the device backends' table names
their classes. Parsed here, once. No torch here."""

from __future__ import annotations

import importlib
import os
import re
from typing import Any

#: A workload shipped with milarun: ``milarun.models.<module>:<function>``.
SHIPPED = re.compile(r"milarun\.models\.([A-Za-z_][A-Za-z0-9_]*):([A-Za-z_][A-Za-z0-9_]*)")


def parse(spec: object, what: str = "function") -> tuple[str, str]:
    """``(module, name)`` of ``"module:name"``.

    Raises:
        ValueError: ``spec`` is not a string, has no ``:``, an empty module or a
            name that is not an identifier; the message says what it must look
            like (``what`` names the attribute: ``"function"``, ``"class"``).
    """
    if not isinstance(spec, str):
        raise ValueError(f"must be a string 'module:{what}'")
    module, sep, name = spec.partition(":")
    if not sep or not module or not name.isidentifier():
        raise ValueError(f"{spec!r} must look like 'module:{what}'")
    return module, name


def load(spec: object, what: str = "function") -> Any:
    """Import the module of ``"module:name"`` and return its attribute ``name``
    (None when it has none).

    Raises:
        ValueError: a malformed ``spec`` (:func:`parse`).
        ImportError: the module cannot be imported.
    """
    module, name = parse(spec, what)
    return getattr(importlib.import_module(module), name, None)


def is_shipped(spec: object) -> bool:
    """True when ``spec`` is ``milarun.models.<module>:<function>`` and that module
    exists in this installed package (its file, found on disk; nothing is imported
    and ``sys.path`` is never looked at, so a results folder's copy does not count).

    What a rerun or an audit rerun of a vendor's record may run without the user
    naming a module (docs/security.md)."""
    match = SHIPPED.fullmatch(spec) if isinstance(spec, str) else None
    if match is None:
        return False
    models = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
    name = match.group(1)
    return os.path.isfile(os.path.join(models, name + ".py")) or os.path.isfile(
        os.path.join(models, name, "__init__.py")
    )
