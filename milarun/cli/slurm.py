"""``milarun slurm PROFILE [--nodes K] [--gpus-per-node G] [--partition P] [--time T]
[--account A] [--dry-run] -- ARGS`` (options only; the script and its submission:
:mod:`milarun.launcher.slurm`)."""

from ..errors import SetupError
from .options import as_argv, flag, option, positional

OPTIONS = (
    positional("profile", "The job profile (JSON)"),
    option(
        "dataroot",
        "Dataset root on a filesystem every node sees (default: $MILARUN_DATAROOT)",
        aliases=("-d",),
    ),
    option(
        "out",
        "Results directory on a filesystem every node sees (default: "
        "$MILARUN_OUTROOT/results-<date>)",
        aliases=("-o",),
    ),
    option("nodes", "Number of nodes to allocate (1 to 4096)", type=int, default=1),
    option("gpus_per_node", "GPUs to allocate on each node (sbatch --gpus-per-node)", type=int),
    option("partition", "Slurm partition"),
    option("time", "Time limit (Slurm format, e.g. 2:00:00)"),
    option("account", "Slurm account"),
    option(
        "cpu_slots",
        "On CPU nodes: CPU slots (students) per node (passed to milarun jobs)",
        type=int,
    ),
    option("name", "Run only these tests (passed to milarun jobs)", nargs="+"),
    option(
        "select",
        "Run only the tests with one of these names, groups or tags (passed to milarun jobs)",
        nargs="+",
    ),
    option(
        "exclude",
        "Leave out the tests with one of these names, groups or tags (passed to milarun jobs)",
        nargs="+",
    ),
    flag("no_cgexec", "Do not wrap tests in their student cgroups (passed to milarun jobs)"),
    option("repeat", "Number of times to run the suite (passed to milarun jobs)", type=int),
    option("timeout", "Timeout of each test in seconds (passed to milarun jobs)", type=float),
    option(
        "join_timeout",
        "Seconds every node has to join a multi-node rendezvous (passed to milarun jobs)",
        type=float,
    ),
    option(
        "barrier_timeout",
        "Seconds a process of a concurrent test waits at the start "
        "barrier (passed to milarun jobs)",
        type=float,
    ),
    flag("dry_run", "Print the sbatch script and submit nothing"),
)


def command(opts, rest):
    """Write an sbatch script that runs ``milarun jobs PROFILE`` on Slurm nodes, and submit it.

    Inside the allocation every test starts with ``srun`` on the allocation's
    nodes: per-GPU tests on every GPU of every node, multi-node tests across
    them. Arguments after ``--`` are appended to every test's own arguments.
    Prints the Slurm job id and the results folder.
    """
    return slurm(
        opts.profile,
        rest,
        dataroot=opts.dataroot,
        out=opts.out,
        nodes=opts.nodes,
        gpus_per_node=opts.gpus_per_node,
        partition=opts.partition,
        time=opts.time,
        account=opts.account,
        cpu_slots=opts.cpu_slots,
        names=opts.name,
        no_cgexec=opts.no_cgexec,
        repeat=opts.repeat,
        timeout=opts.timeout,
        join_timeout=opts.join_timeout,
        dry_run=opts.dry_run,
        barrier_timeout=opts.barrier_timeout,
        select=opts.select,
        exclude=opts.exclude,
    )


def slurm(
    profile,
    extra_args,
    dataroot=None,
    out=None,
    nodes=1,
    gpus_per_node=None,
    partition=None,
    time=None,
    account=None,
    cpu_slots=None,
    names=None,
    no_cgexec=False,
    repeat=None,
    timeout=None,
    join_timeout=None,
    dry_run=False,
    sbatch="sbatch",
    barrier_timeout=None,
    select=None,
    exclude=None,
):
    """Validate, write the script into the results folder and submit it; returns 0.

    Raises:
        MilarunError: bad profile or options, no dataroot, sbatch missing or refusing.
    """
    # lazy, for start-up: tempfile and the profile language cost milarun --help ~5 ms
    from ..launcher.bounds import check_bounds
    from ..launcher.slurm import check_options, submit
    from ..profile.language import load_profile
    from .jobs import OPTIONS as JOBS_OPTIONS

    load_profile(profile, names, select, exclude)
    check_options(nodes, gpus_per_node, partition, time, account)
    check_bounds(1 if repeat is None else repeat, None, timeout, join_timeout, barrier_timeout)
    if cpu_slots is not None and cpu_slots < 1:
        raise SetupError(f"--cpu-slots must be at least 1, not {cpu_slots}")
    # the options passed on, spelled as milarun jobs parses them (one builder: cli.options)
    jobs_args = as_argv(
        JOBS_OPTIONS,
        {
            "repeat": repeat,
            "timeout": timeout,
            "join_timeout": join_timeout,
            "barrier_timeout": barrier_timeout,
            "cpu_slots": cpu_slots,
            "name": names,
            "select": select,
            "exclude": exclude,
            "no_cgexec": no_cgexec,
        },
    )
    return submit(
        profile,
        extra_args,
        jobs_args,
        dataroot=dataroot,
        out=out,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        partition=partition,
        time=time,
        account=account,
        dry_run=dry_run,
        sbatch=sbatch,
    )
