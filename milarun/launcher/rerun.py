"""The rerun of one result file (``milarun rerun``; :mod:`milarun.cli.rerun` parses its options).

A result file may come from anyone (a vendor's results folder): it is data, and
a rerun runs only what milarun itself would. It imports only a registered
workload (``milarun.models.<name>:<function>``) or the one the user names with
``--function``; takes from the record's ``environ`` only the variables milarun
sets (:data:`RERUN_ENV`), with plain values; starts the child with ``-P`` so
neither the current folder nor the results folder is on its ``sys.path``; shows
the exact command and environment, and runs a record this host's milarun did
not write (:mod:`milarun.formats.trust`) only with ``--yes``.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys

from ..errors import MilarunError, ResultFormatError
from ..formats import child, entrypoint, trust
from ..formats.barrier import without_barrier
from ..formats.jsonfile import parse_json, read_bytes
from ..formats.record import migrate
from ..host import isolation
from ..host.isolation import wrap

#: The variables a rerun takes from a record's ``environ``: those milarun sets for
#: a launch (device visibility of :mod:`milarun.host.accel`, the plan's ``MILARUN_*``
#: labels and pinning, the backend) and plain threading knobs. Everything else
#: (``LD_PRELOAD``, ``PYTHONPATH``, ``GIT_*``, ``NCCL_*`` plug-ins, ``TORCH_*``,
#: the start barrier, ``MILARUN_WRITTEN``, ``MILARUN_PDEATHSIG`` ...) is dropped
#: and named.
RERUN_ENV = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ZE_AFFINITY_MASK",
        "ZE_FLAT_DEVICE_HIERARCHY",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "PYTHONHASHSEED",
        *child.ENV_LAUNCH,
    }
)
#: A value kept: device lists, UUIDs (``MIG-GPU-…/1/0``), PCI ids, CPU lists,
#: numbers, names; at most 1024 characters, no space, quote or control character.
_ENV_VALUE = re.compile(r"[A-Za-z0-9_.,:/+=@-]{0,1024}")
_FUNCTION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
#: Starts the child without the current folder on ``sys.path`` (``-P``, Python 3.11;
#: 3.10 has only ``-I``, which also ignores ``PYTHONPATH`` and ``PYTHON*`` variables).
SAFE_PATH = "-P" if sys.version_info >= (3, 11) else "-I"


def _word(text):
    """``text`` as one shell word that shows every character: ``shlex.quote`` when it
    is printable, else bash's ``$'…'`` with ``\\xHH``/``\\uHHHH`` escapes (a record's
    newline or terminal escape cannot hide part of the printed command)."""
    text = str(text)
    if text.isprintable():
        return shlex.quote(text)
    return (
        "$'"
        + "".join(
            c
            if c.isprintable() and c not in "\\'"
            else f"\\x{ord(c):02x}"
            if ord(c) < 0x100
            else f"\\u{ord(c):04x}"
            if ord(c) < 0x10000
            else f"\\U{ord(c):08x}"
            for c in text
        )
        + "'"
    )


def record_environ(record):
    """``(kept, dropped)``: the record's ``environ`` variables a rerun sets
    (:data:`RERUN_ENV`, with a value of :data:`_ENV_VALUE`), and the sorted names
    of the others (shown, never set)."""
    environ = record.get("environ") or {}
    kept, dropped = {}, []
    for name, value in environ.items():
        if name in RERUN_ENV and isinstance(value, str) and _ENV_VALUE.fullmatch(value):
            kept[name] = value
        else:
            dropped.append(str(name))
    return kept, sorted(dropped)


def check_function(record, function=None, path=None):
    """The ``module:function`` a rerun of ``record`` imports: ``function`` (named
    by the user) when given, else the record's ``call.function``, which must be
    a module of ``milarun.models`` that exists in the installed package (found
    on disk; nothing is imported).

    Raises:
        MilarunError: ``function`` does not look like ``module:function``.
        ResultFormatError: ``call.function`` is missing or not a registered
            workload (the message says to pass ``--function`` to run another).
    """
    if function is not None:
        if not isinstance(function, str) or not _FUNCTION.fullmatch(function):
            raise MilarunError(f"--function {function!r} must look like 'module:function'")
        return function
    spec = (record.get("call") or {}).get("function")
    if not spec:
        raise ResultFormatError("has no call.function to rerun", path=path, key="call.function")
    if entrypoint.is_shipped(spec):
        return spec
    raise ResultFormatError(
        f"{_word(spec)} is not a workload of milarun.models: a rerun imports nothing "
        "else (pass --function MODULE:FUNCTION to run a module you trust)",
        path=path,
        key="call.function",
    )


def student_cgroup(record):
    """The student cgroup to rerun ``record`` in: ``(spec, None)``, or ``(None, why not)``.

    ``spec`` is ``"controllers:group"``, from the job's ``partition_scheme.cgroup``
    template and the record's device. It is kept only when the original ran in
    it (``host.cgroup`` names the group), ``cgexec`` is installed and the group
    exists here. ``(None, None)``: the job had no student cgroup.
    """

    template = ((record.get("job") or {}).get("partition_scheme") or {}).get("cgroup")
    if not template:
        return None, None
    # only {device}: a record's "{device:>999999999}" would take the memory
    if (
        not isinstance(template, str)
        or len(template) > 256
        or re.search(r"[{}]", template.replace("{device}", ""))
    ):
        return None, f"its cgroup template {_word(template)} does not expand"
    try:
        spec = template.format(device=record.get("device"))
        group = spec.split(":", 1)[1].strip("/")
    except (KeyError, IndexError, ValueError):
        return None, f"its cgroup template {_word(template)} does not expand"
    # a plain group path: "../../tmp/x" would make cgexec write a pid into any "tasks" file;
    # the launcher's own rule (no leading '/', no '.' or '..' part)
    if isolation.check_group_spec(spec) is not None:
        return None, f"its cgroup {_word(spec)} is not a plain controllers:group name"
    ran_in = (record.get("host") or {}).get("cgroup") or ""
    if not isinstance(ran_in, str):
        ran_in = ""
    if not any(part.rsplit(":", 1)[-1].strip("/") == group for part in ran_in.split(",")):
        return None, (
            f"the original ran outside its student cgroup {spec} (in "
            f"{_word(ran_in) if ran_in else 'an unknown cgroup'}; --no-cgexec?)"
        )
    if shutil.which("cgexec") is None:
        return None, f"cgexec is not installed (package cgroup-tools) to enter {spec}"
    if isolation.missing_groups([spec]):
        return None, (
            f"its student cgroup {spec} does not exist here: "
            "sudo scripts/cgroup_setup.sh creates it"
        )
    return spec, None


def rerun_command(record, extra_args=(), out=None, python=None, function=None, path=None):
    """Rebuild ``(argv, env)`` from a result record: function, argv, environ,
    dataroot and name, with ``extra_args`` appended.

    ``function`` replaces the record's ``call.function`` (checked by
    :func:`check_function`). ``env`` is this process's environment with the
    record's allowed variables (:func:`record_environ`) on top, less the start
    barrier; the child runs ``python -P`` (:data:`SAFE_PATH`).
    """
    python = python or sys.executable
    call = record.get("call") or {}
    extra = {k: record[k] for k in child.RERUN_FIELDS if k in record}
    argv = child.child_argv(
        [python, SAFE_PATH, *child.RUN_MODULE],
        check_function(record, function),
        out=str(out) if out else None,
        dataroot=record.get("dataroot") or None,
        name=record["name"],
        job_id=record.get("job_id", "0.0"),
        extra=extra,
        test_argv=list(call.get("argv", [])) + list(extra_args),
    )
    for arg in argv:  # the OS cannot pass a NUL (ValueError deep in subprocess)
        if not isinstance(arg, str) or "\0" in arg:
            raise ResultFormatError(
                "its command (call.argv, dataroot or name) holds an "
                f"argument with a NUL character: {_word(str(arg)[:80])}",
                path=path,
            )

    # a rerun runs alone: the start barrier a launcher's FAIL record names is gone
    env = without_barrier({**os.environ, **record_environ(record)[0]})
    return argv, env


def _read_record(path):
    """``(record, raw)``: the record at ``path`` and the very bytes it was parsed,
    migrated and validated from (the ones :func:`milarun.formats.trust.written_here`
    checks): the file is read once, so a swap between a check and a use cannot
    slip an unchecked record in.

    Raises:
        ResultFormatError: as :func:`milarun.formats.store.load_result`.
    """

    raw = read_bytes(path, error_cls=ResultFormatError)
    return migrate(parse_json(raw, path=path), path=path), raw


def rerun(path, extra_args, out=None, dry_run=False, use_cgexec=True, yes=False, function=None):
    """Print and run the rebuilt command; returns its exit code.

    The command runs in the original's student cgroup (:func:`student_cgroup`)
    unless ``use_cgexec`` is False; a line on stderr says which cgroup, or why
    not. Lines on stderr name the record's ``environ`` variables left out, and
    show the command with the variables set on it.

    Raises:
        ResultFormatError: unreadable record, or a ``call.function`` outside
            milarun.models without ``function``.
        MilarunError: (exit 2, nothing run) the record was not written by this
            host's milarun and ``yes`` is False.
    """

    record, raw = _read_record(path)
    argv, env = rerun_command(
        record, extra_args, out, function=check_function(record, function, path=path), path=path
    )
    if use_cgexec:
        spec, why = student_cgroup(record)
        if spec is not None:
            argv = wrap(argv, spec)
            print(f"milarun: rerun: in student cgroup {spec}, as the original", file=sys.stderr)
        elif why is not None:
            print(f"milarun: rerun: not in a student cgroup: {why}", file=sys.stderr)
    kept, dropped = record_environ(record)
    if dropped:
        print(
            "milarun: rerun: not taken from the record's environ: "
            + ", ".join(_word(name) for name in dropped),
            file=sys.stderr,
        )
    shown = " ".join(f"{k}={_word(v)}" for k, v in sorted(kept.items()))
    line = " ".join(_word(a) for a in argv)
    print(f"milarun: rerun: {shown + ' ' if shown else ''}{line}", file=sys.stderr)
    ours, why = trust.written_here(raw)
    if dry_run:
        if not ours:
            print(f"milarun: rerun: (dry run) it would need --yes: {why}", file=sys.stderr)
        return 0
    if not ours and not yes:
        raise MilarunError(
            f"not run: {why}; read the command above and pass --yes to run it", path=path
        )
    try:
        return subprocess.call(argv, env=env)
    except (OSError, ValueError) as exc:  # E2BIG: the record's argv is too long
        raise MilarunError(f"cannot start the command: {exc}", path=path) from None
