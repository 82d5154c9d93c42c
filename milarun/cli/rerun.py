"""``milarun rerun RESULT.json [-o OUT] [--yes] [--function MOD:FN] -- ARGS``: options only;
the rerun, and why a record is data, never code: :mod:`milarun.launcher.rerun`."""

from .options import flag, option, positional

OPTIONS = (
    positional("result", "The result file to replay"),
    option("out", "Result directory or .json file (default: print to stdout)", aliases=("-o",)),
    flag("dry_run", "Print the command and do not run it"),
    flag("no_cgexec", "Do not run in the original's student cgroup"),
    flag("yes", "Run a record this host's milarun did not write (read the printed command first)"),
    option("function", "Run this module:function instead of the record's call.function"),
)


def command(opts, rest):
    """Replay the exact command of a result file, with ARGS appended, in the
    original's student cgroup when it exists here (or say why not).

    The command and the environment taken from the record are printed first.
    A record that this host's milarun did not write (a vendor's, an older
    milarun's, or one changed since) is run only with --yes; without it the
    command is printed and the exit status is 2."""
    from ..launcher.rerun import rerun  # lazy, for start-up

    return rerun(
        opts.result,
        rest,
        out=opts.out,
        dry_run=opts.dry_run,
        use_cgexec=not opts.no_cgexec,
        yes=opts.yes,
        function=opts.function,
    )
