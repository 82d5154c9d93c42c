"""``milarun profile PROFILE [--name N ...] [--select T ...] [--exclude T ...]``."""

import json
import sys

from .options import option, positional

OPTIONS = (
    positional("profile", "The job profile (JSON)"),
    option("name", "Only these tests", nargs="+"),
    option("select", "Only the tests with one of these names, groups or tags", nargs="+"),
    option("exclude", "Leave out the tests with one of these names, groups or tags", nargs="+"),
)


def command(opts, rest):
    """Print a profile's jobs fully resolved (includes, "*" defaults, inherits and matrix
    applied) as JSON: a plain profile that loads to the same jobs. Launch placeholders
    such as {cpu_per_gpu} stay as written: the plan fills them per launch (see
    ``milarun jobs --dry-run``)."""
    return print_profile(opts.profile, names=opts.name, select=opts.select, exclude=opts.exclude)


def resolved_profile(profile, names=None, select=None, exclude=None):
    """The plain profile of ``profile``'s (selected) jobs, as a dict.

    Its first entry, ``"_resolved_from"`` (a template, so loading ignores it),
    gives the suite and the files read; then one entry per job
    (:meth:`milarun.profile.job.Job.as_entry`), in profile order.

    Raises:
        ProfileError: as :func:`milarun.profile.language.load_profile`.
    """
    # lazy, for start-up: `milarun --help` imports every cli module
    from ..profile.includes import profile_files
    from ..profile.language import load_profile

    jobs = load_profile(profile, names, select, exclude)
    out = {
        "_resolved_from": {
            "suite": jobs[0].suite,
            "files": [str(p) for p in profile_files(profile)],
        }
    }
    out.update({job.name: job.as_entry() for job in jobs})
    return out


def print_profile(profile, names=None, select=None, exclude=None, stream=None):
    """Write :func:`resolved_profile` as indented JSON; returns 0."""
    stream = stream or sys.stdout
    json.dump(
        resolved_profile(profile, names, select, exclude), stream, indent=2, ensure_ascii=False
    )
    stream.write("\n")
    return 0
