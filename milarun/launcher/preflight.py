"""Check, before anything runs, that the cgroups and programs a suite's waves need exist."""

import shutil

from ..errors import SetupError
from ..host import isolation


def check_ready(waves, use_cgexec=True):
    """Check, before anything runs, that the cgroups and programs the waves need exist
    (cgexec, numactl for pinned launches, exec prefixes).

    Raises:
        SetupError: naming the missing cgroups (with the command that creates
            them) or the missing program.
    """
    launches = [lch for wave in waves for lch in wave]
    groups = sorted({lch.cgroup for lch in launches if lch.cgroup})
    if groups and use_cgexec:
        if shutil.which("cgexec") is None:
            raise SetupError(
                "cgexec is not installed: run scripts/install-apt-packages.sh "
                "(package cgroup-tools) or pass --no-cgexec"
            )
        missing = isolation.missing_groups(groups)
        if missing:
            raise SetupError(
                f"student cgroup(s) {', '.join(missing)} do not exist: run "
                f"'sudo scripts/cgroup_setup.sh --students {len(groups)}' or pass --no-cgexec"
            )
    if any(getattr(lch, "cpus", None) for lch in launches) and shutil.which("numactl") is None:
        raise SetupError(
            "numactl is not installed (multi-process tests pin their processes "
            "with it): run scripts/install-apt-packages.sh or pass --no-cgexec"
        )
    for prefix in sorted({lch.job.exec_prefix[0] for lch in launches if lch.job.exec_prefix}):
        if shutil.which(prefix) is None:
            raise SetupError(
                f"exec_prefix program {prefix!r} is not installed "
                "(scripts/install-apt-packages.sh installs nocache)"
            )
