"""The placeholders of a profile's templates: which ones each kind of template may hold, the
fields a template uses, filling some of them, and checking that a template fills.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

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


def fill(text: str, values: Mapping[str, Any] | None) -> str:
    """Template ``text`` filled with a launch's placeholder ``values`` (``{{`` becomes
    ``{``); as written when ``values`` is None.
    :func:`milarun.profile.validate.validate_job` checked that it fills."""
    return text if values is None else text.format(**values)


def template_fields(text: str) -> set[str]:
    """The field names of ``str.format`` template ``text`` (a set; empty when malformed)."""
    try:
        return {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
    except ValueError:
        return set()


def substitute(text: str, values: Mapping[str, Any]) -> str:
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
            out.append(show_value(values[name]))
        else:
            out.append(
                "{" + name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
            )
    return "".join(out)


def show_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def check_template(text: str, fields: Mapping[str, Any]) -> str | None:
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
