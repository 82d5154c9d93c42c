"""The students' split of this host: ``scripts/cgroup_setup.sh`` runs
``python -m milarun.host.students N [MEMORY_BYTES]``.

It needs both the devices (each GPU's local CPUs) and the cgroup arithmetic of
:mod:`milarun.host.isolation`; it lives apart from both so that neither imports the
other (``devices`` → ``accel`` → ``accel.sysfs`` → ``isolation`` would close a cycle).
"""

import sys

import psutil

from .devices import find_gpus
from .isolation import cpu_cores, format_cpus, numa_nodes_of_cpus, split_students, student_pool_cpus


def student_plan(n, memory_bytes=None):
    """The split ``scripts/cgroup_setup.sh`` applies on this host, for ``n`` students.

    Uses the CPUs in the root cpuset, the host RAM (or ``memory_bytes``),
    each device's local CPUs from its backend (:mod:`milarun.host.accel`: students
    take cores local to their GPU's NUMA node), and the NUMA layout and the
    physical cores (SMT siblings, :func:`milarun.host.isolation.cpu_cores`) from sysfs.
    """
    cpus = student_pool_cpus()
    total = memory_bytes or psutil.virtual_memory().total
    gpus, _ = find_gpus()
    affinity = gpus.affinity[:n] if gpus is not None and len(gpus) >= n else None
    return split_students(
        n, cpus, total, gpu_cpus=affinity, numa_nodes=numa_nodes_of_cpus(), cores=cpu_cores(cpus)
    )


def _print_plan(argv=None):
    """``python -m milarun.host.students N [MEMORY_BYTES]``: one line per student:
    ``student<i> <cpus> <mems> <memory bytes>``."""
    args = sys.argv[1:] if argv is None else argv
    n = int(args[0])
    mem = int(args[1]) if len(args) > 1 else None
    for s in student_plan(n, mem):
        print(
            f"student{s['student']} {format_cpus(s['cpus'])} "
            f"{','.join(map(str, s['mems']))} {s['memory_bytes']}"
        )


if __name__ == "__main__":
    _print_plan()
