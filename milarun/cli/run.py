"""``milarun run MODULE:FUNCTION [-o OUT] [-d DATAROOT] -- ARGS``."""

import os
from pathlib import Path

from ..errors import MilarunError, ResultFormatError
from ..formats import child, entrypoint
from .options import option, positional


def resolve_function(spec):
    """Import ``"module:function"`` and return the function.

    The module is looked up on ``sys.path`` as this process has it: started as
    ``python -m milarun``, the current folder is not on it (``milarun/__main__.py``),
    so a workload of the user's own comes from ``PYTHONPATH`` or an install, never
    from the folder milarun was started in. ``milarun rerun`` passes only
    ``milarun.models`` workloads or one the user named.

    Raises:
        MilarunError: malformed spec, module not importable, or no such function.
    """
    try:
        mod_name, fn_name = entrypoint.parse(spec)
    except ValueError:
        raise MilarunError(f"experiment {spec!r} must look like 'module:function'")
    try:
        fn = entrypoint.load(spec)
    except ImportError as exc:
        raise MilarunError(f"cannot import module {mod_name!r} ({exc})")
    if not callable(fn):
        raise MilarunError(f"module {mod_name!r} has no function {fn_name!r}")
    return fn


OPTIONS = tuple(
    positional(name, help)
    if aliases is None
    else option(name, help, default=default, aliases=aliases)
    for name, aliases, default, help in child.OPTIONS
)


def command(opts, rest):
    """Run one experiment in this process and write its result."""
    return run_experiment(
        opts.function,
        rest,
        out=opts.out,
        dataroot=opts.dataroot,
        name=opts.experiment_name,
        job_id=opts.job_id,
        extra=opts.extra,
        verbose=getattr(opts, "verbose", False),
    )


def check_out(out):
    """Refuse, before any training, an ``-o`` that cannot take the record, so a run
    is not measured for nothing: a ``.json`` target that is not a regular file
    (a device, FIFO, symlink, folder), or a folder path whose nearest existing
    part is not a folder (``-o /dev/full``, ``-o afile/x``).

    Raises:
        MilarunError: (``UnsafeFileError`` for the target) one line naming ``out``.
    """
    from ..formats.outfile import check_target  # lazy, for start-up (tempfile)

    if out is None:
        return
    out = Path(out)
    if out.suffix == ".json":
        check_target(out)
    part = out.parent if out.suffix == ".json" else out
    while not os.path.lexists(part) and part != part.parent:
        part = part.parent
    if not os.path.isdir(part):
        raise MilarunError(f"-o {out}: {part} is not a folder; the result could not be written")


def run_experiment(
    function, argv, out=None, dataroot=None, name=None, job_id="0.0", extra=None, verbose=False
):
    """Resolve ``function``, build an Experiment and run it; returns the exit code.
    With ``verbose``, a failure that is a MilarunError prints its traceback too."""
    # coleo's code registry (codefind) walks every object alive at its import, then takes
    # each module as it loads: imported before torch, the walk is over a few thousand
    # objects instead of torch's millions (2.4 s of every run's start on a 2-core VM).
    try:
        import codefind  # noqa: F401
    except ImportError:  # a coleo that no longer uses it
        pass
    # lazy, for start-up: `milarun --help` imports every cli module (bench: the child side)
    from ..bench.experiment import Experiment
    from ..formats.record import validate
    from ..host.stack import check_stack
    from ..host.supervise import from_environment

    from_environment()  # die with the launcher, even as a torchrun rank
    check_stack()  # an unsupported torch is one line, before any import of it
    fn = resolve_function(function)
    check_out(out)
    extra = child.decode_extra(extra)
    dataroot = dataroot or os.environ.get(child.ENV_DATAROOT)
    # A record's name is suite.test: a run outside a profile is in the suite "run".
    name = name or "run." + entrypoint.parse(function)[0].rsplit(".", 1)[-1]
    exp = Experiment(name, job_id=job_id, dataroot=dataroot, out=out, extra=extra)
    try:
        validate(exp.result)  # a bad --experiment-name or --job-id fails now, not after training
    except ResultFormatError as exc:
        raise MilarunError(f"--experiment-name/--job-id/--extra: {exc}")
    return exp.execute(function, fn, argv, verbose=verbose)
