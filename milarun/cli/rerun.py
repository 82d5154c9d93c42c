"""``milarun rerun RESULT.json [-o OUT] -- ARGS``."""

import json
import os
import shlex
import subprocess
import sys

from coleo import Option, default, tooled


@tooled
def command(rest):
    """Replay the exact command of a result file, with ARGS appended, in the
    original's student cgroup when it exists here (or say why not)."""
    # The result file to replay
    # [positional]
    result: Option
    # Result directory or .json file (default: print to stdout)
    # [alias: -o]
    out: Option = default(None)
    # Print the command and do not run it
    dry_run: Option & bool = default(False)
    # Do not run in the original's student cgroup
    no_cgexec: Option & bool = default(False)

    return rerun(result, rest, out=out, dry_run=dry_run, use_cgexec=not no_cgexec)


def student_cgroup(record):
    """The student cgroup to rerun ``record`` in: ``(spec, None)``, or ``(None, why not)``.

    ``spec`` is ``"controllers:group"``, from the job's ``partition_scheme.cgroup``
    template and the record's device. It is kept only when the original ran in
    it (``host.cgroup`` names the group), ``cgexec`` is installed and the group
    exists here. ``(None, None)``: the job had no student cgroup.
    """
    import shutil

    from .. import isolation

    template = ((record.get("job") or {}).get("partition_scheme") or {}).get("cgroup")
    if not template:
        return None, None
    try:
        spec = template.format(device=record.get("device"))
        group = spec.split(":", 1)[1].strip("/")
    except (KeyError, IndexError, ValueError):
        return None, f"its cgroup template {template!r} does not expand"
    ran_in = (record.get("host") or {}).get("cgroup") or ""
    if not any(part.rsplit(":", 1)[-1].strip("/") == group for part in ran_in.split(",")):
        return None, (f"the original ran outside its student cgroup {spec} (in "
                      f"{ran_in or 'an unknown cgroup'}; --no-cgexec?)")
    if shutil.which("cgexec") is None:
        return None, f"cgexec is not installed (package cgroup-tools) to enter {spec}"
    if isolation.missing_groups([spec]):
        return None, (f"its student cgroup {spec} does not exist here: "
                      "sudo scripts/cgroup_setup.sh creates it")
    return spec, None


def rerun_command(record, extra_args=(), out=None, python=None):
    """Rebuild ``(argv, env)`` from a result record: function, argv, environ,
    dataroot and name, with ``extra_args`` appended."""
    python = python or sys.executable
    call = record.get("call") or {}
    argv = [python, "-m", "milarun", "run", call["function"]]
    if out:
        argv += ["-o", str(out)]
    if record.get("dataroot"):
        argv += ["-d", record["dataroot"]]
    extra = {k: record[k] for k in ("run", "device", "devices", "partition", "job", "node",
                                    "nodes", "node_count", "gpus_per_node", "placeholders")
             if k in record}
    argv += ["--experiment-name", record["name"], "--job-id", record.get("job_id", "0.0"),
             "--extra", json.dumps(extra, sort_keys=True), "--"]
    argv += list(call.get("argv", [])) + list(extra_args)
    from ..barrier import without_barrier

    # a rerun runs alone: the start barrier a launcher's FAIL record names is gone
    env = without_barrier({**os.environ, **(record.get("environ") or {})})
    return argv, env


def rerun(path, extra_args, out=None, dry_run=False, use_cgexec=True):
    """Print and run the rebuilt command; returns its exit code.

    The command runs in the original's student cgroup (:func:`student_cgroup`)
    unless ``use_cgexec`` is False; a line on stderr says which cgroup, or why
    not.
    """
    from ..errors import ResultFormatError
    from ..isolation import wrap
    from ..results.store import load_result

    record = load_result(path)
    if not (record.get("call") or {}).get("function"):
        raise ResultFormatError("has no call.function to rerun", path=path, key="call.function")
    argv, env = rerun_command(record, extra_args, out)
    from ..barrier import without_barrier

    if use_cgexec:
        spec, why = student_cgroup(record)
        if spec is not None:
            argv = wrap(argv, spec)
            print(f"milarun: rerun: in student cgroup {spec}, as the original", file=sys.stderr)
        elif why is not None:
            print(f"milarun: rerun: not in a student cgroup: {why}", file=sys.stderr)
    shown = without_barrier(record.get("environ") or {})
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(shown.items()))
    print(f"milarun: rerun: {prefix} {shlex.join(argv)}".replace("  ", " "), file=sys.stderr)
    if dry_run:
        return 0
    return subprocess.call(argv, env=env)
