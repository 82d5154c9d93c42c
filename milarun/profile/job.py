"""A job: one fully resolved test of a profile, and its command line filled for a launch."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..formats.jsonfile import load_schema
from ..plan import types as plantypes
from .templates import fill, template_fields

DEFAULT_TIMEOUT = 1800.0
#: The longest timeout (s) of a test: the ``maximum`` of a job's ``timeout`` in
#: ``profile.schema.json`` (7 days), which ``milarun jobs --timeout`` also obeys.
MAX_TIMEOUT_S = float(load_schema("profile")["$defs"]["job"]["properties"]["timeout"]["maximum"])
#: Order of the keys in :meth:`Job.as_entry` (for the eye; only the arguments' order matters).
_ENTRY_ORDER = (
    "experiment",
    "description",
    "arguments",
    "partition_scheme",
    "launcher",
    "restarts",
    "prepare",
    "exec_prefix",
    "timeout",
)


@dataclass
class Job:
    """One fully resolved test of a profile.

    Attributes:
        suite: profile name (the stem of the file given, not of an included one), e.g.
            ``"standard"``.
        name: job name, e.g. ``"vae"`` (a matrix job's expanded name).
        experiment: ``"module:function"``.
        arguments: ``{flag: value}`` as resolved (matrix values in, launch placeholders not).
        plan_type: the plan type's name (see :mod:`milarun.plan.types`); records and
            summaries keep it as ``partition``, the profile as ``partition_scheme.type``.
        cgroup: cgroup template with ``{device}``, or None.
        prepare: shell commands (templates) run before the test.
        exec_prefix: argv prefix.
        timeout: seconds.
        launcher: ``"python"`` or ``"torchrun"``.
        restarts: torchrun's ``--max-restarts`` for the job's launches (0: a failed rank
            fails the launch; the soak mode of :mod:`milarun.models.soak` needs 1).
        definition: the merged JSON definition without the language keys (recorded in results).
        tags: the job's tags.
        group: what ``--select`` matches besides name and tags (default: the name).
        matrix: ``{axis: value}`` of a job expanded from a matrix, else ``{}``.
    """

    suite: str
    name: str
    experiment: str
    arguments: dict[str, Any] = field(default_factory=dict)
    plan_type: str = "per-gpu"
    cgroup: str | None = None
    prepare: list[str] = field(default_factory=list)
    exec_prefix: list[str] = field(default_factory=list)
    timeout: float = DEFAULT_TIMEOUT
    launcher: str = "python"
    restarts: int = 0
    definition: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    group: str = ""
    matrix: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.group = self.group or self.name

    @property
    def kind(self) -> plantypes.PlanType:
        """The :class:`milarun.plan.types.PlanType` called ``plan_type``."""
        return plantypes.plan_type(self.plan_type)

    @property
    def full_name(self) -> str:
        """``suite.name``."""
        return f"{self.suite}.{self.name}"

    @property
    def placeholders(self) -> list[str]:
        """Sorted names of the launch placeholders its arguments and ``exec_prefix`` use,
        e.g. ``["n_gpu"]``."""
        used: set[str] = set()
        for value in [*self.arguments.values(), *self.exec_prefix]:
            if isinstance(value, str):
                used |= template_fields(value)
        return sorted(used)

    def argv(self, values: Mapping[str, Any] | None = None) -> list[str]:
        """The test's arguments as argv: ``--flag value``; ``true`` → bare flag.

        Args:
            values: the launch's placeholder values (``{name: value}``, see
                :func:`milarun.plan.launches.placeholder_values`): string values are then
                filled (``{{`` becomes ``{``). None: strings stay as written.
        """
        out: list[str] = []
        for key, value in self.arguments.items():
            flag = key if key.startswith("-") else f"--{key}"
            if value is True:
                out.append(flag)
            elif value is False:
                continue
            elif isinstance(value, str):
                out += [flag, fill(value, values)]
            else:
                out += [flag, str(value)]
        return out

    def prefix(self, values: Mapping[str, Any] | None = None) -> list[str]:
        """``exec_prefix`` as argv, its strings filled as :meth:`argv` fills arguments."""
        return [fill(item, values) for item in self.exec_prefix]

    def matches(self, token: str) -> bool:
        """True when ``token`` is the job's name, its group or one of its tags."""
        return token in (self.name, self.group) or token in self.tags

    def as_entry(self) -> dict[str, Any]:
        """The job as an entry of a plain profile (what ``milarun profile`` prints): its
        definition, then ``tags`` and ``group`` when set; loading it gives this job back."""
        d = self.definition
        out = {k: copy.deepcopy(d[k]) for k in _ENTRY_ORDER if k in d}
        out.update({k: copy.deepcopy(v) for k, v in d.items() if k not in out})
        if self.tags:
            out["tags"] = list(self.tags)
        if self.group != self.name:
            out["group"] = self.group
        return out
