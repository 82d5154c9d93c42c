"""The bounds of the numeric options of ``milarun jobs``, ``slurm`` and ``devices``, checked
before any work. A module of its own, light on purpose: ``milarun devices`` and
``milarun slurm`` check their options with it without loading the suite
(:mod:`milarun.launcher.suite`).
"""

import math
import os

from ..errors import SetupError
from ..profile.job import MAX_TIMEOUT_S

#: The most ``--repeat`` (a typo must not mean a week-long or endless run); the timeouts'
#: bound is the profile schema's (``profile.job.MAX_TIMEOUT_S``).
MAX_REPEAT = 1000


def check_bounds(repeat, cpu_slots, timeout, join_timeout=None, barrier_timeout=None):
    """Reject out-of-range ``--repeat``, ``--cpu-slots``, ``--timeout``,
    ``--join-timeout`` and ``--barrier-timeout`` with one line.

    Raises:
        SetupError: repeat not in 1..MAX_REPEAT; cpu_slots not in 1..cores;
            timeout, join_timeout or barrier_timeout not finite or not in
            (0, MAX_TIMEOUT_S] (the profile schema's bound, 7 days).
    """
    if not 1 <= repeat <= MAX_REPEAT:
        raise SetupError(f"--repeat must be between 1 and {MAX_REPEAT}, not {repeat}")
    cores = os.cpu_count() or 1
    if cpu_slots is not None and not 1 <= cpu_slots <= cores:
        raise SetupError(
            f"--cpu-slots must be between 1 and the {cores} core(s) of this host, not {cpu_slots}"
        )
    for flag, value in (
        ("--timeout", timeout),
        ("--join-timeout", join_timeout),
        ("--barrier-timeout", barrier_timeout),
    ):
        if value is not None and not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
            raise SetupError(
                f"{flag} must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], not {value}"
            )
