"""Command-line entry point. Parsing only: the work lives in other modules.

Everything after the first ``--`` is handed to the test untouched. A
``MilarunError`` becomes one line ``milarun: error: …`` and its exit code;
``--verbose`` (anywhere before ``--``) shows the traceback too.
"""

import sys

from coleo import make_cli

from ..errors import MilarunError
from . import dataset, jobs, profile, report, rerun, run, slurm, summary

#: True when ``--verbose`` was given (commands read it when they run).
VERBOSE = False

COMMANDS = {
    "__doc__": "milarun: deep-learning server benchmark",
    "run": run.command,
    "jobs": jobs.command,
    "profile": profile.command,
    "slurm": slurm.command,
    "rerun": rerun.command,
    "dataset": dataset.command,
    "summary": summary.command,
    "report": report.command,
}


def split_argv(argv):
    """Split at the first ``--``: (milarun's own args, the test's args)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def main(argv=None):
    """Console-script entry point; returns (and exits with) the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    own, rest = split_argv(argv)
    global VERBOSE
    verbose = VERBOSE = "--verbose" in own or "-v" in own
    own = [a for a in own if a not in ("--verbose", "-v")]
    try:
        opts, thunk = make_cli(COMMANDS, argv=own)
        code = thunk(opts=opts, args=(rest,))
    except MilarunError as exc:
        if verbose:
            import traceback
            traceback.print_exc()
        print(f"milarun: error: {exc}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        print("milarun: interrupted", file=sys.stderr)
        code = 130
    except BrokenPipeError:
        # the reader went away (milarun summary … | head): not an error of ours
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    code = code or 0
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        # the terminal went away (closed SSH session): the exit status still counts
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if __name__ != "__main__":
        sys.exit(code)
    return code
