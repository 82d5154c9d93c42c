"""``"module:function"``: how profiles, records and ``milarun run`` name a workload's
entry point (``milarun.models.X:main``), and how the device backends' table names
their classes. Parsed here, once. No torch here."""

import importlib


def parse(spec, what="function"):
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


def load(spec, what="function"):
    """Import the module of ``"module:name"`` and return its attribute ``name``
    (None when it has none).

    Raises:
        ValueError: a malformed ``spec`` (:func:`parse`).
        ImportError: the module cannot be imported.
    """
    module, name = parse(spec, what)
    return getattr(importlib.import_module(module), name, None)
