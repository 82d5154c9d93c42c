"""Command-line entry point. Parsing only: the work lives in other modules.

Each command is a module of this package: ``OPTIONS`` (:mod:`.options`) and
``command(opts, rest)``, whose docstring is its help. Only the module of the
command given is imported (all of them for ``milarun --help``), and each
imports its heavy modules when it runs: start-up stays a few tens of ms.

Everything after the first ``--`` is handed to the test untouched. A
``MilarunError`` becomes one line ``milarun: error: …`` and its exit code;
``--verbose`` (anywhere before ``--``) shows the traceback too.
"""

import argparse
import importlib
import sys

from .. import __version__
from ..errors import MilarunError
from .options import add_options

#: One-line description of ``milarun``.
DESCRIPTION = "milarun: deep-learning server benchmark"

#: The commands, in the order ``milarun --help`` lists them; each is ``milarun.cli.<name>``.
COMMANDS = (
    "run",
    "jobs",
    "profile",
    "slurm",
    "rerun",
    "dataset",
    "devices",
    "summary",
    "report",
    "seal",
    "keygen",
    "verify",
    "tender",
    "audit",
)


#: Commands whose arguments after ``--`` go to the test(s).
PASS_THROUGH = {
    "run": "the experiment",
    "jobs": "every test",
    "slurm": "every test",
    "rerun": "the test, after its recorded ones",
}

#: Under every command's ``--help``: the options ``main`` handles itself.
COMMON_HELP = (
    "common options:\n"
    "  --verbose, -v         show the traceback of an error (and, for jobs, every\n"
    '                        line the tests print); anywhere before "--"'
)


class _Commands(argparse._SubParsersAction):
    """Each command's ``--help`` gets its whole docstring as description, the common
    options and, where it takes them, the ``-- ARGS`` pass-through."""

    def add_parser(self, name, **kwargs):
        doc = kwargs.get("help")
        if doc:
            kwargs.setdefault("description", _cleandoc(doc))
            kwargs["help"] = _cleandoc(doc).split("\n\n")[0]
        epilog = COMMON_HELP
        if name in PASS_THROUGH:
            epilog = (
                "pass-through:\n  -- ARGS               everything after the first "
                f'"--" goes, untouched,\n                        to '
                f"{PASS_THROUGH[name]}: milarun {name} ... -- --max-count 100\n\n" + epilog
            )
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


def _cleandoc(doc):
    """``inspect.cleandoc`` (a docstring's indentation removed) without importing
    :mod:`inspect`, which costs about 10 ms at start-up."""
    lines = doc.expandtabs().split("\n")
    indents = [len(line) - len(line.lstrip()) for line in lines[1:] if line.strip()]
    margin = min(indents, default=0)
    lines = [lines[0].lstrip()] + [line[margin:] for line in lines[1:]]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return "\n".join(lines)


def parser(chosen=None):
    """The ``milarun`` parser.

    ``chosen``: the command on the command line. Only its module is imported and
    its parser filled; the other commands are there by name (all argparse needs
    to parse ``chosen``'s command line). None: every command, in full (for
    ``milarun --help``).
    """
    top = _Parser(
        prog="milarun",
        description=DESCRIPTION,
        epilog=COMMON_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,
    )
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = top.add_subparsers()
    for name in COMMANDS:
        if chosen not in (None, name):
            commands.add_parser(name)
            continue
        module = importlib.import_module(f"{__name__}.{name}")
        sub = commands.add_parser(name, help=module.command.__doc__)
        add_options(sub, module.OPTIONS)
        sub.set_defaults(**{"#command": module.command})
    return top


def _chosen(own):
    """What :func:`parser` needs to build for milarun's own arguments ``own``: the
    command they name; else ``""`` (every command by name only) when they cannot
    show the help (``--version``, a wrong command: argparse's answer names the
    commands and nothing else), so that ``milarun --version`` imports no command;
    else None (``milarun``, ``milarun --help``: every command in full)."""
    if own and own[0] in COMMANDS:
        return own[0]
    if own and all(
        not a.startswith("-") or (len(a) > 2 and "--version".startswith(a)) for a in own
    ):
        return ""
    return None


def split_argv(argv):
    """Split at the first ``--``: (milarun's own args, the test's args)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def _exit_now(code):
    """End a ``milarun run`` process without the interpreter's teardown.

    With torch loaded, finalizing the interpreter (freeing every module and
    object) takes about a second (1.2 s on the 2-core development VM) after the
    result is written: a second of idle machine between every two waves of a
    suite. The record is on disk by then (written atomically and fsynced), so
    atexit handlers run, stdout and stderr (Python's and C's) are flushed, and the process ends
    with ``os._exit``. Data-loader workers left in its process group are killed
    by the launcher when it reaps the child (``milarun.launcher.child.Child.poll``).
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
    verbose = "--verbose" in own or "-v" in own
    own = [a for a in own if a not in ("--verbose", "-v")]
    try:
        top = parser(_chosen(own))
        opts = top.parse_args(own)
        command = getattr(opts, "#command", None)
        if command is None:  # no command: the help, and a failure
            top.print_help()
            sys.exit(1)
        opts.verbose = verbose  # commands read it when they run (jobs: every line)
        code = command(opts, rest)
    except MilarunError as exc:
        if verbose:
            import traceback

            traceback.print_exc()
        # why lazy: only on an error; one line, whatever a file name in the message holds
        from ..formats.terminal import one_line

        print(f"milarun: error: {one_line(exc)}", file=sys.stderr)
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
