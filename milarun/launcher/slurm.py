"""Submitting ``milarun jobs`` to Slurm (``milarun slurm``; :mod:`milarun.cli.slurm`
parses its options): the checks of Slurm's own options, the sbatch script, its
writing into the results folder and ``sbatch``."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

from ..errors import SetupError
from ..formats.outfile import UnsafeFileError, own_dir, write_atomic
from .dryrun import resolve_dataroot
from .session import default_outdir

#: What ``--time``, ``--partition`` and ``--account`` may hold (Slurm's own forms).
_TIME = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}")  # fullmatch: "$" would let a final newline in
_SLURM_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


#: Characters an sbatch directive cannot carry unquoted (and ``%``, which Slurm expands).
_UNSAFE_IN_DIRECTIVE = re.compile(r"[\s%\"'\\]")


def check_paths(profile, outdir):
    """Reject a results folder or profile name that an ``#SBATCH`` line would break.

    Raises:
        SetupError: one line naming the path.
    """
    for what, value in (
        ("the results folder", str(outdir)),
        ("the profile's name", Path(profile).stem),
    ):
        if _UNSAFE_IN_DIRECTIVE.search(value):
            raise SetupError(
                f"{what} {value!r} holds a space, quote, backslash or '%', which "
                "an #SBATCH line cannot carry (Slurm expands '%'): choose another"
            )


def sbatch_script(
    profile,
    dataroot,
    outdir,
    nodes=1,
    gpus_per_node=None,
    partition=None,
    time=None,
    account=None,
    jobs_args=(),
    extra_args=(),
    python=None,
):
    """The sbatch script that runs ``milarun jobs`` on ``nodes`` nodes (a str).

    The batch step runs the launcher on the first node of the allocation;
    ``milarun jobs`` sees ``$SLURM_JOB_ID`` and starts every test with
    ``srun`` on the allocation's nodes. ``exec`` makes ``milarun jobs`` the
    step's process, so ``scancel`` (SIGTERM) reaches it and it records the
    running tests as ``interrupted``. Slurm's own log goes to
    ``OUTDIR/logs/slurm-<job id>.out``.
    """
    python = python or sys.executable
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=milarun-{Path(profile).stem}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --exclusive",
        f"#SBATCH --output={outdir}/logs/slurm-%j.out",
    ]
    for flag, value in (
        ("--gpus-per-node", gpus_per_node),
        ("--partition", partition),
        ("--time", time),
        ("--account", account),
    ):
        if value is not None:
            lines.append(f"#SBATCH {flag}={value}")
    argv = [
        python,
        "-m",
        "milarun",
        "jobs",
        str(Path(profile).resolve()),
        "-d",
        str(dataroot),
        "-o",
        str(outdir),
    ] + list(jobs_args)
    if extra_args:
        argv += ["--"] + list(extra_args)
    lines += ["set -u", f"exec {shlex.join(argv)}", ""]
    return "\n".join(lines)


def check_options(nodes, gpus_per_node, partition, time, account):
    """Reject bad ``milarun slurm`` options with one line (SetupError)."""
    if not 1 <= nodes <= 4096:
        raise SetupError(f"--nodes must be between 1 and 4096, not {nodes}")
    if gpus_per_node is not None and not 1 <= gpus_per_node <= 1024:
        raise SetupError(f"--gpus-per-node must be between 1 and 1024, not {gpus_per_node}")
    if time is not None and not _TIME.fullmatch(time):
        raise SetupError(
            f"--time {time!r} is not a Slurm time (minutes, MM:SS, HH:MM:SS or D-HH:MM:SS)"
        )
    for flag, value in (("--partition", partition), ("--account", account)):
        if value is not None and not _SLURM_NAME.fullmatch(value):
            raise SetupError(
                f"{flag} {value!r} is not a Slurm name (letters, digits, '_', '.', '-')"
            )


def submit(
    profile,
    extra_args,
    jobs_args,
    dataroot=None,
    out=None,
    nodes=1,
    gpus_per_node=None,
    partition=None,
    time=None,
    account=None,
    dry_run=False,
    sbatch="sbatch",
):
    """Write the sbatch script that runs ``milarun jobs PROFILE jobs_args -- extra_args``
    into the results folder and submit it (print it with ``dry_run``); returns 0.

    ``jobs_args``: ``milarun jobs``'s own options, as its parser spells them.

    Raises:
        MilarunError: no dataroot or results folder, a folder holding a session, an
            unsafe path, sbatch missing or refusing.
    """
    outdir = out or default_outdir()
    if outdir is not None:
        outdir = Path(outdir).resolve()
        check_paths(profile, outdir)
    if dry_run:
        dataroot = dataroot or "$MILARUN_DATAROOT"
        outdir = outdir or "$MILARUN_OUTROOT/results-<date>"
        print(
            sbatch_script(
                profile,
                dataroot,
                outdir,
                nodes,
                gpus_per_node,
                partition,
                time,
                account,
                jobs_args,
                extra_args,
            ),
            end="",
        )
        return 0
    dataroot = resolve_dataroot(dataroot)
    if outdir is None:
        raise SetupError("no results directory: pass -o OUTDIR or set $MILARUN_OUTROOT")
    if (outdir / ".milarun" / "session.json").exists():
        raise SetupError(
            "holds an earlier session: choose a new -o (or run "
            "'milarun jobs --resume' inside an allocation)",
            path=outdir,
        )
    script = sbatch_script(
        profile,
        dataroot,
        outdir,
        nodes,
        gpus_per_node,
        partition,
        time,
        account,
        jobs_args,
        extra_args,
    )
    try:
        own_dir(outdir / "logs")  # Slurm writes its output there: never through a link
        path = outdir / "milarun.sbatch"
        write_atomic(path, script, durable=False)  # never through a symlink
    except UnsafeFileError:
        raise
    except OSError as exc:
        raise SetupError(f"cannot write the sbatch script: {exc.strerror}", path=outdir)
    try:
        done = subprocess.run(
            [sbatch, "--parsable", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise SetupError(
            "sbatch is not installed: run milarun slurm on a Slurm login node, "
            "or use --dry-run to see the script"
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SetupError(f"sbatch failed: {exc}")
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or [f"status {done.returncode}"])[-1]
        raise SetupError(f"sbatch refused the job: {detail}", path=path)
    job_id = done.stdout.strip().split(";")[0]
    print(f"milarun: submitted Slurm job {job_id} ({nodes} node(s)); results in {outdir}")
    print(f"milarun: follow it with: tail -f {outdir}/logs/slurm-{job_id}.out")
    return 0
