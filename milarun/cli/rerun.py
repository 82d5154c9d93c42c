"""``milarun rerun RESULT.json [-o OUT] -- ARGS``."""

import json
import os
import shlex
import subprocess
import sys

from coleo import Option, default, tooled


@tooled
def command(rest):
    """Replay the exact command of a result file, with ARGS appended."""
    # The result file to replay
    # [positional]
    result: Option
    # Result directory or .json file (default: print to stdout)
    # [alias: -o]
    out: Option = default(None)
    # Print the command and do not run it
    dry_run: Option & bool = default(False)

    return rerun(result, rest, out=out, dry_run=dry_run)


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


def rerun(path, extra_args, out=None, dry_run=False):
    """Print and run the rebuilt command; returns its exit code."""
    from ..errors import ResultFormatError
    from ..results.store import load_result

    record = load_result(path)
    if not (record.get("call") or {}).get("function"):
        raise ResultFormatError("has no call.function to rerun", path=path, key="call.function")
    argv, env = rerun_command(record, extra_args, out)
    from ..barrier import without_barrier

    shown = without_barrier(record.get("environ") or {})
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(shown.items()))
    print(f"milarun: rerun: {prefix} {shlex.join(argv)}".replace("  ", " "), file=sys.stderr)
    if dry_run:
        return 0
    return subprocess.call(argv, env=env)
