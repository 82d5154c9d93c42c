"""``milarun jobs --dry-run``: print the plan, then make every check of a real run that
changes nothing, and fail on the same errors.

A real run stops at its first problem (``milarun jobs``): no dataroot, no
results folder (or one holding an earlier session), missing student cgroups or
``cgexec``, a missing exec prefix program. A dry run prints the whole plan with the
values a real run would use (the dataroot and results folder resolved, the ``prepare``
placeholders expanded), then one ``milarun: error: …`` line per failed check, and
exits 2 when there is one. It creates nothing: the results folder is checked without
being made. What needs the other nodes (that each sees the results folder) is not
checked, and the output says so. The host prescreen (:mod:`milarun.host.prescreen`) is
read on this host only and every finding printed (``# prescreen: …``); a
``--prescreen-fatal`` finding that is not ok is an error.
"""

import os
import shutil
import socket
import sys
from pathlib import Path

from ..errors import SetupError
from ..formats.terminal import one_line, terminal_safe
from ..host.prescreen import fatal_problems, finding_line, prescreen
from .preflight import check_ready
from .prepare import prepare_fields
from .session import MIN_FREE_MIB, check_meta, read_session


def resolve_dataroot(dataroot):
    """``-d`` or ``$MILARUN_DATAROOT``; raises SetupError when neither names a folder."""
    dataroot = dataroot or os.environ.get("MILARUN_DATAROOT")
    if not dataroot:
        raise SetupError("no dataroot: pass -d DATAROOT or set $MILARUN_DATAROOT")
    if not Path(dataroot).is_dir():
        raise SetupError(
            f"dataroot {dataroot} does not exist: create it (mkdir -p) and "
            f"prepare the data with scripts/download.sh -d {dataroot}"
        )
    return str(Path(dataroot).resolve())


def _writable_ancestor(path):
    """The nearest existing folder at or above ``path``."""
    path = Path(path).absolute()
    for parent in (path, *path.parents):
        if parent.exists():
            return parent
    return Path("/")


def check_outdir(outdir, resume):
    """The checks of :func:`milarun.launcher.session.check_outdir` and
    :func:`milarun.launcher.session.open_session` that do not write. Returns a list of
    :class:`SetupError` (empty when the folder would do)."""
    errors = []
    path = Path(outdir)
    if resume and not path.is_dir():
        return [SetupError("--resume: no such results directory", path=outdir)]
    if path.exists() and not path.is_dir():
        return [SetupError("results directory is a file, not a folder", path=path)]
    try:
        if path.is_dir():
            check_meta(path)
        saved = read_session(path) if path.is_dir() else None
    except SetupError as exc:
        return [exc]
    if resume and saved is None:
        errors.append(
            SetupError("--resume: no milarun session here (no .milarun/session.json)", path=outdir)
        )
    if not resume and saved is not None:
        errors.append(
            SetupError(
                "holds the results of an earlier session: resume it with "
                "--resume, or choose another -o",
                path=outdir,
            )
        )
    base = _writable_ancestor(path)
    if not os.access(base, os.W_OK | os.X_OK):
        errors.append(
            SetupError(f"results directory is not writable ({base} is not writable)", path=path)
        )
    else:
        free = shutil.disk_usage(base).free / 2**20
        if free < MIN_FREE_MIB:
            errors.append(
                SetupError(
                    f"results directory has {free:.1f} MiB free; milarun "
                    f"needs at least {MIN_FREE_MIB} MiB for records and "
                    "logs",
                    path=path,
                )
            )
    return errors


def checks(waves, dataroot, outdir, resume=False, use_cgexec=True):
    """Every check of a real run that changes nothing, in the real run's order.

    ``dataroot`` and ``outdir`` are as given (``-d``/``$MILARUN_DATAROOT``,
    ``-o``/``--resume``/``$MILARUN_OUTROOT``, or None). Returns
    ``(errors, dataroot, outdir)``: the :class:`SetupError` list, and the
    values the plan should show (resolved when they are valid, as given
    otherwise, or a ``$VARIABLE`` placeholder when missing).
    """
    errors = []
    try:
        shown_root = resolve_dataroot(dataroot)
    except SetupError as exc:
        errors.append(exc)
        shown_root = dataroot or "$MILARUN_DATAROOT"
    if outdir is None:
        errors.append(SetupError("no results directory: pass -o OUTDIR or set $MILARUN_OUTROOT"))
        shown_out = "$MILARUN_OUTROOT/results-<date>"
    else:
        shown_out = str(Path(outdir).resolve())
        errors += check_outdir(shown_out, resume)
    seen = {str(e) for e in errors}
    # programs first, then cgroups: a real run reports whichever comes first in check_ready
    for use in (False, True) if use_cgexec else (False,):
        try:
            check_ready(waves, use_cgexec=use)
        except SetupError as exc:
            if str(exc) not in seen:
                seen.add(str(exc))
                errors.append(exc)
    return errors, shown_root, shown_out


def show(jobs_, waves, devs, cluster, repeat, sid, dataroot, outdir, stream=None):
    """Print the plan: a header, each test's ``prepare`` lines with their placeholders
    expanded, and every launch (:meth:`milarun.plan.launches.Launch.describe`)."""
    out = stream or sys.stdout
    fields = prepare_fields(dataroot, outdir)
    print(f"# session {sid}: the stamp a real run would put in every file name", file=out)
    print(
        f"# {len(jobs_)} tests × {repeat} run(s) on {len(devs)} {devs.kind} device(s)"
        + (
            f" × {len(cluster.nodes)} nodes ({cluster.kind}: "
            f"{', '.join(n.name for n in cluster.nodes)})"
            if cluster.multi
            else ""
        ),
        file=out,
    )
    print("# --extra's \"job\" (the test's whole profile definition) is shown as {…}", file=out)
    for wave in waves:
        for lch in wave:
            if lch.job.prepare and lch is wave[0]:
                for template in lch.job.prepare:
                    try:
                        line = template.format(**fields)
                    except (KeyError, IndexError, ValueError) as exc:
                        line = f"{template}  (bad placeholder: {exc})"
                    print(terminal_safe(one_line(f"# prepare: {line}")), file=out)
            # a profile's strings may hold escape sequences: shown, never acted on
            print(terminal_safe(lch.describe()), file=out)


def show_prescreen(cluster, fatal=(), stream=None, read=None):
    """Print every finding of this host's prescreen (``read()``, default :func:`prescreen`) as
    ``# prescreen: HOST: NAME ok|FAILED|unknown: …``; returns a :class:`SetupError` per
    finding named in ``fatal`` that is not ok (the errors of the real run)."""
    out = stream or sys.stdout
    try:
        host = socket.gethostname()
    except OSError:
        host = "this host"
    findings = (read or prescreen)()
    if cluster.multi:
        print(
            "# prescreen: this host only in a dry run (a real run reads every node's)",
            file=out,
        )
    for f in findings:
        print(terminal_safe(one_line(f"# prescreen: {finding_line(host, f)}")), file=out)
    return [
        SetupError(f"--prescreen-fatal: {line}")
        for line in fatal_problems({host: findings}, list(fatal))
    ]


def report(errors, cluster, stream=None):
    """Print the verdict of the checks; returns the exit code (0, or 2 on errors)."""
    err = stream or sys.stderr
    if cluster.multi:
        print(
            "# not checked in a dry run: that every node sees the results folder "
            "(a real run probes it first)",
            file=sys.stdout,
        )
    for exc in errors:
        print(f"milarun: error: {exc}", file=err)
    if errors:
        print(
            f"milarun: --dry-run: {len(errors)} problem(s); a real run would stop at the first one",
            file=err,
        )
        return 2
    print("# checks passed: dataroot, results folder, cgroups, exec prefixes", file=sys.stdout)
    return 0
