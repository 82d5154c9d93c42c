"""Command-line entry point. Parsing only: the work lives in other modules.

Everything after the first ``--`` is handed to the test untouched. A
``MilarunError`` becomes one line ``milarun: error: …`` and its exit code;
``--verbose`` (anywhere before ``--``) shows the traceback too.
"""

import argparse
import inspect
import sys

from ..options import make_cli

from ..errors import MilarunError
from . import dataset, devices, jobs, profile, report, rerun, run, slurm, summary

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
    "devices": devices.command,
    "summary": summary.command,
    "report": report.command,
}


#: Commands whose arguments after ``--`` go to the test(s).
PASS_THROUGH = {"run": "the experiment", "jobs": "every test", "slurm": "every test",
                "rerun": "the test, after its recorded ones"}

#: Under every command's ``--help``: the options ``main`` handles itself.
COMMON_HELP = ("common options:\n"
               "  --verbose, -v         show the traceback of an error (and, for jobs, every\n"
               "                        line the tests print); anywhere before \"--\"")


class _Commands(argparse._SubParsersAction):
    """Each command's ``--help`` gets its whole docstring as description, the common
    options and, where it takes them, the ``-- ARGS`` pass-through."""

    def add_parser(self, name, **kwargs):
        doc = kwargs.get("help")
        if doc:
            kwargs.setdefault("description", inspect.cleandoc(doc))
            kwargs["help"] = inspect.cleandoc(doc).split("\n\n")[0]
        epilog = COMMON_HELP
        if name in PASS_THROUGH:
            epilog = ("pass-through:\n  -- ARGS               everything after the first "
                      f"\"--\" goes, untouched,\n                        to "
                      f"{PASS_THROUGH[name]}: milarun {name} ... -- --max-count 100\n\n"
                      + epilog)
        kwargs.setdefault("epilog", epilog)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        parser = super().add_parser(name, **kwargs)
        if name in PASS_THROUGH:
            parser.usage_suffix = " [-- ARGS ...]"
        return parser


class _Parser(argparse.ArgumentParser):
    """argparse with :class:`_Commands` and ``[-- ARGS ...]`` at the end of the usage line."""

    usage_suffix = ""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Commands)

    def format_usage(self):
        return self._with_suffix(super().format_usage())

    def format_help(self):
        return self._with_suffix(super().format_help())

    def _with_suffix(self, text):
        if not self.usage_suffix:
            return text
        head, sep, rest = text.partition("\n\n")
        return head.rstrip("\n") + self.usage_suffix + ("\n" if not sep else sep + rest)


def parser():
    """The top-level parser (``milarun``), commands added by coleo."""
    return _Parser(prog="milarun", description=COMMANDS["__doc__"],
                   epilog=COMMON_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                   argument_default=argparse.SUPPRESS)


def split_argv(argv):
    """Split at the first ``--``: (milarun's own args, the test's args)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def _exit_now(code):
    """End a ``milarun run`` process without the interpreter's teardown.

    With torch loaded, finalizing the interpreter (freeing every module and
    object) takes about a second (1.2 s on the 2-core development VM) after the
    result is written: a second of idle machine between every two waves of a
    suite. The record is on disk by then (written atomically and fsynced), so
    atexit handlers run, stdout and stderr (Python's and C's) are flushed, and the process ends
    with ``os._exit``. Data-loader workers left in its process group are killed
    by the launcher when it reaps the child (``launch._Child.poll``).
    """
    import atexit
    import os

    try:
        atexit._run_exitfuncs()  # what sys.exit would run first (torch, logging, ...)
    except Exception:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:  # and C stdio (extensions' printf), which only libc's exit() would flush
        import ctypes
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass
    os._exit(code)


def _distributed(environ):
    """A rank of a multi-process job (torchrun): it ends through the normal teardown,
    which closes its process group's connections for the other ranks."""
    try:
        return int(environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in environ
    except ValueError:
        return True


def main(argv=None, process_entry=False):
    """Console-script entry point; returns (and exits with) the exit code.

    ``process_entry``: this call is the whole process (``python -m milarun``, as the
    launcher starts its children); a ``run`` that is not a rank of a distributed job
    then ends with :func:`_exit_now` instead of the interpreter's slow teardown.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    own, rest = split_argv(argv)
    global VERBOSE
    verbose = VERBOSE = "--verbose" in own or "-v" in own
    own = [a for a in own if a not in ("--verbose", "-v")]
    try:
        opts, thunk = make_cli(COMMANDS, argv=own, parser=parser())
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
    if process_entry and own[:1] == ["run"]:
        import os

        if not _distributed(os.environ):
            _exit_now(code)
    if __name__ != "__main__":
        sys.exit(code)
    return code
