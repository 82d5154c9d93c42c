"""``milarun jobs PROFILE [-d DATAROOT] [-o OUTDIR | --resume OUTDIR] [--name N ...] ... -- ARGS``.

Its options only: the suite runs in :func:`milarun.launcher.suite.run_jobs`.
"""

from .options import flag, option, positional

OPTIONS = (
    positional("profile", "The job profile (JSON)"),
    option("dataroot", "Dataset root (default: $MILARUN_DATAROOT)", aliases=("-d",)),
    option(
        "out",
        "Results directory (default: $MILARUN_OUTROOT/results-<date>); must not hold "
        "an earlier session",
        aliases=("-o",),
    ),
    option(
        "resume",
        "Resume the session in this results directory: run only the launches "
        "with no successful record",
    ),
    option("name", "Run only these tests", nargs="+"),
    option("select", "Run only the tests with one of these names, groups or tags", nargs="+"),
    option("exclude", "Leave out the tests with one of these names, groups or tags", nargs="+"),
    option("repeat", "Number of times to run the suite (1 to 1000)", type=int, default=1),
    flag("no_cgexec", "Do not wrap tests in their student cgroups"),
    option(
        "cpu_slots",
        "On a host without GPUs: number of CPU slots (students) to split the host into",
        type=int,
    ),
    option(
        "timeout",
        "Timeout of each test in seconds (overrides the profile; at most 7 days)",
        type=float,
    ),
    flag("dry_run", "Print every command that would run, with its env and cgroup, and run nothing"),
    option(
        "system", 'System file (JSON) of the nodes to run on over ssh (see README, "Several nodes")'
    ),
    flag(
        "single_node", "Inside a Slurm allocation, run on this host only instead of on every node"
    ),
    option(
        "rdzv_port",
        "TCP port of the c10d rendezvous on the main node (multi-node tests; default: a free one)",
        type=int,
    ),
    option(
        "join_timeout",
        "Seconds every node has to join a multi-node test's rendezvous (default 120)",
        type=float,
    ),
    option(
        "barrier_timeout",
        "Seconds a process of a concurrent test waits at the start "
        "barrier for the others to finish their set-up (default 600; then it fails with "
        "barrier-timeout)",
        type=float,
    ),
    option(
        "prescreen_fatal",
        "Stop before the first launch when one of these host prescreen findings "
        "(comma-separated, e.g. numa_balancing,gpu_persistence) is not ok on some node",
    ),
)


def command(opts, rest):
    """Run every test of a job profile: one process per device, each in its student cgroup.

    Arguments after ``--`` are appended to every test's own arguments (for
    example ``-- --max-count 100``). ``--verbose`` shows tracebacks and every
    line the tests print.
    """
    # lazy, for start-up: `milarun --help` imports every cli module, a run needs the launcher
    from ..host.stack import check_stack
    from ..launcher.suite import run_jobs

    check_stack()
    return run_jobs(
        opts.profile,
        rest,
        dataroot=opts.dataroot,
        out=opts.out,
        resume=opts.resume,
        names=opts.name,
        repeat=opts.repeat,
        no_cgexec=opts.no_cgexec,
        cpu_slots=opts.cpu_slots,
        timeout=opts.timeout,
        dry_run=opts.dry_run,
        verbose=opts.verbose,
        system=opts.system,
        single_node=opts.single_node,
        rdzv_port=opts.rdzv_port,
        join_timeout=opts.join_timeout,
        barrier_timeout=opts.barrier_timeout,
        select=opts.select,
        exclude=opts.exclude,
        prescreen_fatal=opts.prescreen_fatal,
    )
