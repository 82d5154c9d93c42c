"""``milarun slurm PROFILE [--nodes K] [--gpus-per-node G] [--partition P] [--time T] [--account A] [--dry-run] -- ARGS``."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

from ..errors import SetupError
from .options import as_argv, flag, option, positional

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
    for what, value in (("the results folder", str(outdir)),
                        ("the profile's name", Path(profile).stem)):
        if _UNSAFE_IN_DIRECTIVE.search(value):
            raise SetupError(f"{what} {value!r} holds a space, quote, backslash or '%', which "
                             "an #SBATCH line cannot carry (Slurm expands '%'): choose another")


def sbatch_script(profile, dataroot, outdir, nodes=1, gpus_per_node=None, partition=None,
                  time=None, account=None, jobs_args=(), extra_args=(), python=None):
    """The sbatch script that runs ``milarun jobs`` on ``nodes`` nodes (a str).

    The batch step runs the launcher on the first node of the allocation;
    ``milarun jobs`` sees ``$SLURM_JOB_ID`` and starts every test with
    ``srun`` on the allocation's nodes. ``exec`` makes ``milarun jobs`` the
    step's process, so ``scancel`` (SIGTERM) reaches it and it records the
    running tests as ``interrupted``. Slurm's own log goes to
    ``OUTDIR/logs/slurm-<job id>.out``.
    """
    python = python or sys.executable
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name=milarun-{Path(profile).stem}",
             f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1",
             "#SBATCH --exclusive",
             f"#SBATCH --output={outdir}/logs/slurm-%j.out"]
    for flag, value in (("--gpus-per-node", gpus_per_node), ("--partition", partition),
                        ("--time", time), ("--account", account)):
        if value is not None:
            lines.append(f"#SBATCH {flag}={value}")
    argv = [python, "-m", "milarun", "jobs", str(Path(profile).resolve()), "-d", str(dataroot),
            "-o", str(outdir)] + list(jobs_args)
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
        raise SetupError(f"--time {time!r} is not a Slurm time (minutes, MM:SS, HH:MM:SS or "
                         "D-HH:MM:SS)")
    for flag, value in (("--partition", partition), ("--account", account)):
        if value is not None and not _SLURM_NAME.fullmatch(value):
            raise SetupError(f"{flag} {value!r} is not a Slurm name (letters, digits, "
                             "'_', '.', '-')")


OPTIONS = (
    positional("profile", "The job profile (JSON)"),
    option("dataroot", "Dataset root on a filesystem every node sees (default: "
           "$MILARUN_DATAROOT)", aliases=("-d",)),
    option("out", "Results directory on a filesystem every node sees (default: "
           "$MILARUN_OUTROOT/results-<date>)", aliases=("-o",)),
    option("nodes", "Number of nodes to allocate (1 to 4096)", type=int, default=1),
    option("gpus_per_node", "GPUs to allocate on each node (sbatch --gpus-per-node)", type=int),
    option("partition", "Slurm partition"),
    option("time", "Time limit (Slurm format, e.g. 2:00:00)"),
    option("account", "Slurm account"),
    option("cpu_slots", "On CPU nodes: CPU slots (students) per node (passed to milarun jobs)",
           type=int),
    option("name", "Run only these tests (passed to milarun jobs)", nargs="+"),
    option("select", "Run only the tests with one of these names, groups or tags (passed to "
           "milarun jobs)", nargs="+"),
    option("exclude", "Leave out the tests with one of these names, groups or tags (passed to "
           "milarun jobs)", nargs="+"),
    flag("no_cgexec", "Do not wrap tests in their student cgroups (passed to milarun jobs)"),
    option("repeat", "Number of times to run the suite (passed to milarun jobs)", type=int),
    option("timeout", "Timeout of each test in seconds (passed to milarun jobs)", type=float),
    option("join_timeout", "Seconds every node has to join a multi-node rendezvous (passed to "
           "milarun jobs)", type=float),
    option("barrier_timeout", "Seconds a process of a concurrent test waits at the start "
           "barrier (passed to milarun jobs)", type=float),
    flag("dry_run", "Print the sbatch script and submit nothing"),
)


def command(opts, rest):
    """Write an sbatch script that runs ``milarun jobs PROFILE`` on Slurm nodes, and submit it.

    Inside the allocation every test starts with ``srun`` on the allocation's
    nodes: per-GPU tests on every GPU of every node, multi-node tests across
    them. Arguments after ``--`` are appended to every test's own arguments.
    Prints the Slurm job id and the results folder.
    """
    return slurm(opts.profile, rest, dataroot=opts.dataroot, out=opts.out, nodes=opts.nodes,
                 gpus_per_node=opts.gpus_per_node, partition=opts.partition, time=opts.time,
                 account=opts.account, cpu_slots=opts.cpu_slots, names=opts.name,
                 no_cgexec=opts.no_cgexec, repeat=opts.repeat, timeout=opts.timeout,
                 join_timeout=opts.join_timeout, dry_run=opts.dry_run,
                 barrier_timeout=opts.barrier_timeout, select=opts.select,
                 exclude=opts.exclude)


def slurm(profile, extra_args, dataroot=None, out=None, nodes=1, gpus_per_node=None,
          partition=None, time=None, account=None, cpu_slots=None, names=None, no_cgexec=False,
          repeat=None, timeout=None, join_timeout=None, dry_run=False, sbatch="sbatch",
          barrier_timeout=None, select=None, exclude=None):
    """Validate, write the script into the results folder and submit it; returns 0.

    Raises:
        MilarunError: bad profile or options, no dataroot, sbatch missing or refusing.
    """
    # lazy, for start-up: tempfile costs milarun --help ~5 ms
    from ..formats.outfile import UnsafeFileError, own_dir, write_atomic
    from ..profile.language import load_profile
    from ..launcher.dryrun import resolve_dataroot
    from ..launcher.bounds import check_bounds
    from ..launcher.session import default_outdir
    from .jobs import OPTIONS as JOBS_OPTIONS

    load_profile(profile, names, select, exclude)
    check_options(nodes, gpus_per_node, partition, time, account)
    check_bounds(1 if repeat is None else repeat, None, timeout, join_timeout, barrier_timeout)
    if cpu_slots is not None and cpu_slots < 1:
        raise SetupError(f"--cpu-slots must be at least 1, not {cpu_slots}")
    # the options passed on, spelled as milarun jobs parses them (one builder: cli.options)
    jobs_args = as_argv(JOBS_OPTIONS, {
        "repeat": repeat, "timeout": timeout, "join_timeout": join_timeout,
        "barrier_timeout": barrier_timeout, "cpu_slots": cpu_slots, "name": names,
        "select": select, "exclude": exclude, "no_cgexec": no_cgexec})
    outdir = out or default_outdir()
    if outdir is not None:
        outdir = Path(outdir).resolve()
        check_paths(profile, outdir)
    if dry_run:
        dataroot = dataroot or "$MILARUN_DATAROOT"
        outdir = outdir or "$MILARUN_OUTROOT/results-<date>"
        print(sbatch_script(profile, dataroot, outdir, nodes, gpus_per_node, partition, time,
                            account, jobs_args, extra_args), end="")
        return 0
    dataroot = resolve_dataroot(dataroot)
    if outdir is None:
        raise SetupError("no results directory: pass -o OUTDIR or set $MILARUN_OUTROOT")
    if (outdir / ".milarun" / "session.json").exists():
        raise SetupError("holds an earlier session: choose a new -o (or run "
                         "'milarun jobs --resume' inside an allocation)", path=outdir)
    script = sbatch_script(profile, dataroot, outdir, nodes, gpus_per_node, partition, time,
                           account, jobs_args, extra_args)
    try:
        own_dir(outdir / "logs")    # Slurm writes its output there: never through a link
        path = outdir / "milarun.sbatch"
        write_atomic(path, script, durable=False)   # never through a symlink
    except UnsafeFileError:
        raise
    except OSError as exc:
        raise SetupError(f"cannot write the sbatch script: {exc.strerror}", path=outdir)
    try:
        done = subprocess.run([sbatch, "--parsable", str(path)], capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SetupError("sbatch is not installed: run milarun slurm on a Slurm login node, "
                         "or use --dry-run to see the script")
    except (OSError, subprocess.SubprocessError) as exc:
        raise SetupError(f"sbatch failed: {exc}")
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or [f"status {done.returncode}"])[-1]
        raise SetupError(f"sbatch refused the job: {detail}", path=path)
    job_id = done.stdout.strip().split(";")[0]
    print(f"milarun: submitted Slurm job {job_id} ({nodes} node(s)); results in {outdir}")
    print(f"milarun: follow it with: tail -f {outdir}/logs/slurm-{job_id}.out")
    return 0
