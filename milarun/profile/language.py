"""Load a job profile (JSON) into its validated ``Job`` records, and keep the ones selected.

A profile maps job names to definitions. The ``"*"`` entry holds defaults
deep-merged into every job (a job that changes ``partition_scheme.type``
keeps the ``cgroup`` template). Everything is checked before anything runs;
each problem is one ``ProfileError`` naming the file, the entry and the key.
Each file is read strictly (:func:`milarun.formats.jsonfile.read_json`) and checked
against ``milarun/formats/schemas/profile.schema.json``; job names and the file's stem
(the suite) use letters, digits, ``_`` and ``-`` only.

The profile language (a plain 2020-style profile uses none of it):

``"include": [files]``  top-level: other profiles (paths relative to this file)
                      merged first, in order; then this file's entries are
                      deep-merged over theirs, entry by entry (``"*"`` too). A
                      cycle is an error, and so are more than 32 nested or 256
                      files read. The suite stays this file's stem.
``"_name"`` entries     templates: never run, may be inherited. Until inherited
                      they are not checked (``"_comment": "text"`` is fine).
``inherits``          an entry's parent (a job or a template): the parent's
                      resolved definition, deep-merged with the entry's own
                      (chains of at most 64 entries; an unknown or cyclic parent is
                      an error naming the chain). ``"*"`` comes under every chain.
``matrix``            ``{axis: [values]}``: the job expands into one job per
                      combination (last axis fastest), named by its ``name``
                      template (``"resnet50-bs{batch_size}"``). In string
                      ``arguments`` values, ``{axis}`` is replaced by the value;
                      a value that is exactly ``"{axis}"`` takes the value's
                      type; a value may itself be a launch placeholder
                      (``"{cpu_per_gpu}"``, shown in the name without braces).
                      ``matrix`` and ``name`` are inherited like other keys.
                      Duplicate job names are an error, and so are more than 1,024
                      jobs from one matrix or 10,000 from the whole profile.
                      milabench's form is read too: ``{"matrix": ..., "job":
                      {"name", "inherits", "argv", ...}}``, axes such as
                      ``batch-size`` included (:func:`milarun.profile.includes.from_milabench`).
``tags``              ``[tag, ...]``: what ``--select``/``--exclude`` match.
``group``             a name ``--select`` matches (default: the matrix entry a
                      job was expanded from, else the job's own name).
``enabled``           ``false`` turns a job into a template: it does not run and
                      is not checked, but may still be inherited (a profile that
                      includes another drops a test with ``{"enabled": false}``).
                      Not inherited: it belongs to the entry that says it.

Job keys:

``experiment``        ``"module:function"`` (required).
``arguments``         ``{flag: value}``; ``true`` is a bare flag, ``false`` omits it.
                      A string value may hold launch placeholders
                      (:data:`milarun.profile.templates.LAUNCH_FIELDS`:
                      ``{cpu_per_gpu}``, ``{n_gpu}``, ``{gpu_memory_gb}``,
                      ``{dataroot}``, ``{outdir}``, ``{arch}``; ``{{`` is a
                      literal brace), filled per launch by the plan
                      (:func:`milarun.plan.launches.placeholder_values`) and recorded in
                      the result's ``placeholders``.
``partition_scheme``  ``{"type": a plan type of milarun.plan.types.TYPES
                      ("per-gpu", "gpu-progression", "normal", "njobs",
                      "multi-node", "node-progression", "multi-process"),
                      "cgroup": "cpuset,memory:student{device}" or null (per-gpu;
                      ``{CUDA_VISIBLE_DEVICES}``, the 2020 name, means ``{device}``),
                      "nodes": [n, ...], "gpus_per_node": [g, ...] (node-progression),
                      "processes": P, "devices_per_process": k (multi-process)}``.
``prepare``           shell commands run once before the test; placeholders
                      ``{dataroot}``, ``{outdir}``, ``{python}``, ``{milarun}``.
``exec_prefix``       argv put in front of the test command, e.g. ``["nocache"]``; its
                      arguments (not the program) may hold the launch placeholders,
                      filled like ``arguments``; an unknown one is an error.
``timeout``           seconds, > 0 and at most 7 days (default 1800).
``launcher``          ``"python"`` (default) or ``"torchrun"`` (one process per device).
``restarts``          torchrun's ``--max-restarts`` (0 to 100, default 0): how many times
                      torchrun starts the job's ranks again after one fails; only for a
                      job launched through torchrun.
``description``       free text.
``validation``        thresholds of the flagging checks (:mod:`milarun.measure.plausibility`):
                      ``{"usage": {"gpu_load_threshold", "gpu_mem_threshold"},
                      "host": {"outside_cpu_threshold", "steal_threshold"}}``,
                      fractions from 0 to 1, null for off; recorded in each
                      result's ``job``, where the summary reads them.

The job's recorded ``definition`` is what a hand-written plain profile would
hold: the merged keys without the language keys
(:data:`milarun.profile.resolve.LANGUAGE_KEYS`).

The parts of the language, one module each: the ``Job`` record (:mod:`~milarun.profile.job`),
files and their includes (:mod:`~milarun.profile.includes`), ``"*"``, ``inherits`` and
``enabled`` (:mod:`~milarun.profile.resolve`), matrices (:mod:`~milarun.profile.matrix`),
placeholders (:mod:`~milarun.profile.templates`), the checks of a job
(:mod:`~milarun.profile.validate`, :mod:`~milarun.profile.experiment`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..errors import ProfileError
from ..formats.jsonfile import first_error
from ..formats.outfile import StrPath
from .includes import read_entries, real_path
from .job import Job
from .resolve import Resolver


def select_jobs(
    jobs: list[Job],
    path: StrPath,
    names: Sequence[str] | None = None,
    select: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
) -> list[Job]:
    """The jobs ``--name``, ``--select`` and ``--exclude`` keep, in profile order.

    ``names``: exact job names. ``select``: keep the jobs a token matches (its
    name, group or one of its tags; see :meth:`milarun.profile.job.Job.matches`). ``exclude``:
    then drop the jobs a token matches.

    Raises:
        ProfileError: a name or token that matches no job of the profile, or
            nothing left.
    """
    everything = jobs
    if names:
        known = [j.name for j in jobs]
        for n in names:
            if n not in known:
                raise ProfileError(
                    f"unknown job name {n!r} (--name); known: {', '.join(known)}", path=path
                )
        jobs = [j for j in jobs if j.name in names]
    for flag, tokens in (("--select", select), ("--exclude", exclude)):
        for token in tokens or ():
            if not any(j.matches(token) for j in everything):
                tags = sorted({t for j in everything for t in j.tags})
                raise ProfileError(
                    f"{token!r} ({flag}) is no job name, group or tag of this "
                    f"profile; tags: {', '.join(tags) or 'none'}",
                    path=path,
                )
    if select:
        jobs = [j for j in jobs if any(j.matches(t) for t in select)]
    if exclude:
        jobs = [j for j in jobs if not any(j.matches(t) for t in exclude)]
    if not jobs:
        raise ProfileError("no job left after --name/--select/--exclude", path=path)
    return jobs


def load_profile(
    path: StrPath,
    names: Sequence[str] | None = None,
    select: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
) -> list[Job]:
    """Read, merge and validate a profile; return its jobs in file order.

    Args:
        path: the JSON file.
        names: optional list of job names to keep (``--name``).
        select, exclude: optional lists of job names, groups or tags (see
            :func:`select_jobs`).

    Returns:
        list of ``Job``.

    Raises:
        ProfileError: unreadable file or include, bad JSON, bad definitions,
            unknown name; one line naming the file, the entry and the key.
    """
    path = Path(path)
    entries = read_entries(path, [real_path(path)], [])
    suite = path.stem
    found = first_error(suite, "common#/$defs/job_name")
    if found:
        raise ProfileError(
            f"the file name {suite!r} is not a valid suite name: it becomes the "
            "suite of every result (letters, digits, '_' and '-')",
            path=path,
        )
    jobs = Resolver(path, entries).jobs(suite)
    if not jobs:
        raise ProfileError("the profile defines no job", path=path)
    return select_jobs(jobs, path, names, select, exclude)
