"""``milarun jobs PROFILE [-d DATAROOT] [-o OUTDIR] [--name N ...] ... -- ARGS``."""

import datetime
import os
import sys
from pathlib import Path

from coleo import Option, default, tooled

from ..errors import SetupError


def default_outdir():
    """``$MILARUN_OUTROOT/results-YYYY-mm-dd.HH:MM:SS``, or None when unset."""
    root = os.environ.get("MILARUN_OUTROOT")
    if not root:
        return None
    stamp = datetime.datetime.now().strftime("%Y-%m-%d.%H:%M:%S")
    return str(Path(root) / f"results-{stamp}")


def resolve_dataroot(dataroot):
    """``-d`` or ``$MILARUN_DATAROOT``; raises SetupError when neither names a folder."""
    dataroot = dataroot or os.environ.get("MILARUN_DATAROOT")
    if not dataroot:
        raise SetupError("no dataroot: pass -d DATAROOT or set $MILARUN_DATAROOT")
    if not Path(dataroot).is_dir():
        raise SetupError(f"dataroot {dataroot} does not exist: create it (mkdir -p) and "
                         f"prepare the data with scripts/download.sh -d {dataroot}")
    return str(Path(dataroot).resolve())


@tooled
def command(rest):
    """Run every test of a job profile: one process per device, each in its student cgroup."""
    # The job profile (JSON)
    # [positional]
    profile: Option
    # Dataset root (default: $MILARUN_DATAROOT)
    # [alias: -d]
    dataroot: Option = default(None)
    # Results directory (default: $MILARUN_OUTROOT/results-<date>)
    # [alias: -o]
    out: Option = default(None)
    # Run only these tests
    # [nargs: +]
    name: Option = default(None)
    # Number of times to run the suite
    repeat: Option & int = default(1)
    # Do not wrap tests in their student cgroups
    no_cgexec: Option & bool = default(False)
    # On a host without GPUs: number of CPU slots (students) to split the host into
    cpu_slots: Option & int = default(None)
    # Timeout of each test in seconds (overrides the profile)
    timeout: Option & float = default(None)
    # Print every command that would run, with its env and cgroup, and run nothing
    dry_run: Option & bool = default(False)

    return jobs(profile, rest, dataroot=dataroot, out=out, names=name, repeat=repeat,
                no_cgexec=no_cgexec, cpu_slots=cpu_slots, timeout=timeout, dry_run=dry_run)


def jobs(profile, extra_args, dataroot=None, out=None, names=None, repeat=1,
         no_cgexec=False, cpu_slots=None, timeout=None, dry_run=False):
    """Validate everything, then plan and run the suite; returns the exit code."""
    from .. import devices as devices_mod
    from ..launch import check_ready, run_suite, tally
    from ..plan import plan_suite
    from ..profile import load_profile

    jobs_ = load_profile(profile, names)
    if repeat < 1:
        raise SetupError("--repeat must be at least 1")
    if timeout is not None and timeout <= 0:
        raise SetupError("--timeout must be a positive number of seconds")
    try:
        devs = devices_mod.discover(cpu_slots)
    except ValueError as exc:
        raise SetupError(str(exc))
    outdir = out or default_outdir()
    if dry_run:
        dataroot = dataroot or os.environ.get("MILARUN_DATAROOT") or "$MILARUN_DATAROOT"
        outdir = outdir or "$MILARUN_OUTROOT/results-<date>"
    else:
        dataroot = resolve_dataroot(dataroot)
        if outdir is None:
            raise SetupError("no results directory: pass -o OUTDIR or set $MILARUN_OUTROOT")
        outdir = str(Path(outdir).resolve())
    waves = plan_suite(jobs_, devs, repeat, outdir, dataroot=dataroot,
                       extra_args=extra_args, use_cgexec=not no_cgexec, timeout=timeout)
    if dry_run:
        print(f"# {len(jobs_)} tests × {repeat} run(s) on {len(devs)} {devs.kind} device(s)")
        for wave in waves:
            for lch in wave:
                if lch.job.prepare and lch is wave[0]:
                    print(f"# prepare: {' && '.join(lch.job.prepare)}")
                print(lch.describe())
        return 0
    check_ready(waves, use_cgexec=not no_cgexec)
    Path(outdir).mkdir(parents=True, exist_ok=True)
    print(f"milarun: {len(jobs_)} tests on {len(devs)} {devs.kind} device(s); "
          f"results in {outdir}", file=sys.stderr)
    try:
        outcomes = run_suite(waves, outdir, dataroot)
    except KeyboardInterrupt as exc:
        done = getattr(exc, "outcomes", [])
        print(f"milarun: interrupted; {tally(done)}; results in {outdir}", file=sys.stderr)
        return 130
    print(tally(outcomes))
    print(f"milarun: results in {outdir}", file=sys.stderr)
    return 0 if all(o.success for o in outcomes) else 1
