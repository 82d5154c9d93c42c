"""Expand a matrix entry into its points: the axes' combinations, each point's job name and
its argument values filled."""

from __future__ import annotations

import itertools
import math
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import ProfileError
from ..formats.jsonfile import first_error
from .templates import LAUNCH_FIELDS, check_template, show_value, substitute, template_fields

#: Most jobs one matrix may expand into.
MAX_MATRIX_JOBS = 1024

#: ``f(keys, message) -> ProfileError`` naming where ``keys`` was written.
Fail = Callable[[Sequence[str | int], str], ProfileError]


def fill_matrix(value: Any, values: Mapping[str, Any]) -> Any:
    """An argument value with a matrix point's ``{axis}`` fields filled; a value that is
    exactly one axis field takes that value, with its type."""
    if not isinstance(value, str):
        return value
    try:
        parsed = list(string.Formatter().parse(value))
        if (
            len(parsed) == 1
            and parsed[0][0] == ""
            and parsed[0][1] is not None
            and parsed[0][1] in values
            and not parsed[0][2]
            and not parsed[0][3]
        ):
            return values[parsed[0][1]]
        return substitute(value, values)
    except ValueError:
        return value  # a malformed template: validate_job says so


def matrix_points(resolved: Mapping[str, Any], fail: Fail) -> list[tuple[dict[str, Any], str]]:
    """``[(values, job name)]`` of a matrix entry, last axis fastest.

    Args:
        resolved: the entry's resolved definition (its ``matrix``, ``name`` and
            ``arguments`` are read).
        fail: ``f(keys, message) -> ProfileError`` naming where ``keys`` was written.

    Raises:
        ProfileError: no ``name`` template, an axis named as a launch placeholder or
            used nowhere, more than :data:`MAX_MATRIX_JOBS` points, or a bad job name.
    """
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
    points: list[tuple[dict[str, Any], str]] = []
    for combo in itertools.product(*matrix.values()):
        values = dict(zip(axes, combo))
        # a placeholder value ("{cpu_per_gpu}") shows in the name without its braces
        job_name = substitute(
            template,
            {a: show_value(v).replace("{", "").replace("}", "") for a, v in values.items()},
        )
        found = first_error(job_name, "common#/$defs/job_name")
        if found:
            raise fail(["name"], f"makes {job_name!r}: {found[1]}")
        points.append((values, job_name))
    return points
