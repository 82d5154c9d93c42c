"""Student cgroups (v1 and v2) and CPU/NUMA placement. No torch here.

Read side (used inside the child): ``current_cpuset``, ``current_cgroup``,
``current_memory_limit_mib``, ``current_cpu_quota``.

Parent side: ``cgroup_version``, ``split_students`` (the cpuset/memory plan
that ``scripts/cgroup_setup.sh`` applies), ``missing_groups``,
``oom_kill_count``, ``process_cpus`` (the cores of each process of a
multi-process test) and ``wrap`` (the cgexec/numactl/exec-prefix argv).
"""

import os
import shutil
from pathlib import Path

CGROOT = Path(os.environ.get("MILARUN_CGROUP_ROOT", "/sys/fs/cgroup"))


# ---------------------------------------------------------------- read side

def current_cpuset():
    """Sorted list of CPU ids this process may run on (its affinity)."""
    return sorted(os.sched_getaffinity(0))


def _proc_cgroups(pid="self"):
    """Map controller → cgroup path from ``/proc/<pid>/cgroup``.

    cgroup v2 appears under the key ``""``.
    """
    out = {}
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                for c in ctrls.split(",") if ctrls else [""]:
                    out[c] = path
    except OSError:
        pass
    return out


def current_cgroup(pid="self"):
    """A readable summary of the cgroups of ``pid``: ``"cpuset:/student0,memory:/student0"``
    on v1, the unified path on v2."""
    groups = _proc_cgroups(pid)
    parts = [f"{c}:{groups[c]}" for c in ("cpuset", "memory") if c in groups]
    if parts:
        return ",".join(parts)
    return groups.get("", None)


def _read(path):
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def current_memory_limit_mib(pid="self"):
    """The memory limit of the cgroup ``pid`` runs in (MiB), None if unlimited or unknown."""
    groups = _proc_cgroups(pid)
    if "memory" in groups:
        raw = _read(CGROOT / "memory" / groups["memory"].lstrip("/") / "memory.limit_in_bytes")
    elif "" in groups:
        raw = _read(CGROOT / groups[""].lstrip("/") / "memory.max")
    else:
        raw = None
    if raw is None or raw == "max":
        return None
    value = int(raw)
    if value >= 2**62:  # v1 reports "unlimited" as a huge page-rounded number
        return None
    return value / 2**20


def current_cpu_quota(pid="self"):
    """The CPU quota of the cgroup ``pid`` runs in, in cores (``quota / period``),
    None if unlimited or unknown (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``)."""
    groups = _proc_cgroups(pid)
    try:
        if "cpu" in groups:
            base = CGROOT / "cpu" / groups["cpu"].lstrip("/")
            quota, period = _read(base / "cpu.cfs_quota_us"), _read(base / "cpu.cfs_period_us")
        elif "" in groups:
            raw = _read(CGROOT / groups[""].lstrip("/") / "cpu.max")
            quota, period = raw.split() if raw else (None, None)
        else:
            return None
        if quota in (None, "max") or int(quota) < 0 or not period or int(period) <= 0:
            return None
        return int(quota) / int(period)
    except ValueError:
        return None


# -------------------------------------------------------------- parent side

def cgroup_version():
    """1 when a v1 cpuset hierarchy is mounted, 2 for a unified hierarchy with
    controllers, None when neither is usable."""
    if (CGROOT / "cpuset" / "cpuset.cpus").exists() or (CGROOT / "cpuset").is_dir():
        return 1
    if (CGROOT / "cgroup.controllers").exists():
        return 2
    return None


def parse_template(template, device):
    """Split ``"cpuset,memory:student{device}"`` into (controllers, group name)."""
    text = template.format(device=device)
    if ":" not in text:
        raise ValueError(f"cgroup template {template!r} must look like 'controllers:group'")
    ctrls, group = text.split(":", 1)
    return [c for c in ctrls.split(",") if c], group


def group_exists(controllers, group, version=None):
    """Whether ``group`` exists under every controller (v1) or in the unified tree (v2)."""
    version = version or cgroup_version()
    if version == 1:
        return all((CGROOT / c / group).is_dir() for c in controllers)
    if version == 2:
        return (CGROOT / group).is_dir()
    return False


def missing_groups(cgroups):
    """Return the cgroup specs (``"ctrls:group"``) from ``cgroups`` that do not exist."""
    version = cgroup_version()
    missing = []
    for spec in cgroups:
        ctrls, group = spec.split(":", 1)
        if not group_exists([c for c in ctrls.split(",") if c], group, version):
            missing.append(spec)
    return missing


def oom_kill_count(spec):
    """Number of OOM kills recorded for the memory cgroup of ``spec`` (``"ctrls:group"``).

    Reads ``memory.oom_control`` (v1, ``oom_kill`` line) or ``memory.events``
    (v2). Returns None when not readable.
    """
    if spec is None:
        return None
    _, group = spec.split(":", 1)
    for path in (CGROOT / "memory" / group / "memory.oom_control",
                 CGROOT / group / "memory.events"):
        text = _read(path)
        if text is None:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return None


def split_students(n, cpus, total_memory_bytes, gpu_cpus=None, numa_nodes=None):
    """Plan ``n`` student slices: equal, mutually exclusive cpusets and equal memory.

    Args:
        n: number of students (one per GPU or CPU slot).
        cpus: sorted list of usable CPU ids.
        total_memory_bytes: RAM to share (bytes).
        gpu_cpus: optional list, per student, of the CPU ids local to that
            GPU (NVML's CPU affinity). Students then take cores from their own
            NUMA node first.
        numa_nodes: optional dict cpu id → NUMA node id.

    Returns:
        list of dicts ``{"student": i, "cpus": [...], "mems": [...], "memory_bytes": int}``.
        Each student gets ``len(cpus) // n`` cores (at least 1).

    Raises:
        ValueError: fewer CPUs than students.
    """
    if n < 1:
        raise ValueError("need at least one student")
    if len(cpus) < n:
        raise ValueError(f"{len(cpus)} CPUs cannot be split into {n} exclusive students")
    per = len(cpus) // n
    free = list(cpus)
    plan = []
    for i in range(n):
        local = [c for c in (gpu_cpus[i] if gpu_cpus else []) if c in free]
        chosen = (local + [c for c in free if c not in local])[:per]
        for c in chosen:
            free.remove(c)
        chosen.sort()
        mems = sorted({numa_nodes.get(c, 0) for c in chosen}) if numa_nodes else [0]
        plan.append({"student": i, "cpus": chosen, "mems": mems,
                     "memory_bytes": total_memory_bytes // n})
    return plan


def format_cpus(cpus):
    """``[0, 1, 2, 5]`` → ``"0-2,5"`` (the kernel's cpuset list syntax)."""
    out = []
    cpus = sorted(cpus)
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def numa_nodes_of_cpus():
    """Map cpu id → NUMA node from ``/sys/devices/system/node``; ``{}`` when absent."""
    out = {}
    base = Path("/sys/devices/system/node")
    for node in sorted(base.glob("node[0-9]*")):
        text = _read(node / "cpulist")
        if not text:
            continue
        nid = int(node.name[4:])
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            for c in range(int(lo), int(hi or lo) + 1):
                out[c] = nid
    return out


def numactl_argv(cpus):
    """``numactl --localalloc --physcpubind=CPUS``: run on ``cpus`` (list of CPU ids),
    allocating memory on the NUMA node of the CPU that asks (DLBS's pinning of
    multi-process inference benchmarks)."""
    return [shutil.which("numactl") or "numactl", "--localalloc",
            f"--physcpubind={format_cpus(cpus)}"]


def slot_cpus(n, cpus=None):
    """The cores of each of ``n`` CPU slots: ``cpus`` (default: this process's
    affinity) split as the student cgroups split them (:func:`split_students`)."""
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else sorted(cpus)
    return [s["cpus"] for s in split_students(n, cpus, 0)]


def process_cpus(groups, affinity, cpus):
    """Exclusive cores for each process of a multi-process test.

    Args:
        groups: per process, the positions (in ``affinity``) of its devices.
        affinity: per device, the CPU ids local to it (NVML's CPU affinity of a
            GPU: the cores of the NUMA node it is attached to; a CPU slot's
            cores); an empty list when unknown.
        cpus: the CPU ids processes may use (sorted list).

    Returns:
        per process, a sorted list of CPU ids. A process takes the cores local
        to its devices; processes whose devices are local to the same cores
        (two processes on one NUMA node) split them evenly, so none is
        over-subscribed. When a device's affinity is unknown, or leaves a
        process no core, ``cpus`` is split evenly across all processes instead.

    Raises:
        ValueError: fewer ``cpus`` than processes.
    """
    n = len(groups)
    if len(cpus) < n:
        raise ValueError(f"{len(cpus)} CPUs cannot be split into {n} exclusive processes")
    allowed = set(cpus)
    local = []
    for group in groups:
        mine = set()
        for d in group:
            mine |= set(affinity[d] if d < len(affinity) else ())
        local.append(tuple(sorted(mine & allowed)))
    if not all(local):
        return [s["cpus"] for s in split_students(n, sorted(cpus), 0)]
    sharing = {}
    for p, cores in enumerate(local):
        sharing.setdefault(cores, []).append(p)
    out = [None] * n
    for cores, procs in sharing.items():
        per = max(1, len(cores) // len(procs))
        for i, p in enumerate(procs):
            chunk = list(cores[i * per:(i + 1) * per]) or list(cores[-per:])
            out[p] = sorted(chunk)
    return out


def wrap(argv, cgroup=None, exec_prefix=(), use_cgexec=True, cpus=None):
    """Return the full argv: ``[cgexec -g SPEC] [numactl ...] [exec_prefix...] argv``.

    ``cgexec`` puts the process (and its children) in the student cgroup
    before exec, so the child's first instruction already runs confined.
    ``cpus`` (a list of CPU ids) pins it with :func:`numactl_argv`; like the
    cgroup, only with ``use_cgexec`` (``--no-cgexec`` turns isolation off).
    """
    out = []
    if cgroup and use_cgexec:
        out += [shutil.which("cgexec") or "cgexec", "-g", cgroup]
    if cpus and use_cgexec:
        out += numactl_argv(cpus)
    out += list(exec_prefix)
    out += list(argv)
    return out


def student_plan(n, memory_bytes=None):
    """The split ``scripts/cgroup_setup.sh`` applies on this host, for ``n`` students.

    Uses the CPUs in the root cpuset, the host RAM (or ``memory_bytes``),
    each device's local CPUs from its backend (:mod:`milarun.accel`: students
    take cores local to their GPU's NUMA node) and the NUMA layout from sysfs.
    """
    import psutil

    from .devices import find_gpus

    cpus = host_cpus()
    total = memory_bytes or psutil.virtual_memory().total
    gpus, _ = find_gpus()
    affinity = gpus.affinity[:n] if gpus is not None and len(gpus) >= n else None
    return split_students(n, cpus, total, gpu_cpus=affinity, numa_nodes=numa_nodes_of_cpus())


def host_cpus():
    """The CPU ids the students split: the root cpuset's, else this process's affinity."""
    root_cpus = _read(CGROOT / "cpuset" / "cpuset.cpus") or _read(CGROOT / "cpuset.cpus.effective")
    return parse_cpus(root_cpus) if root_cpus else sorted(os.sched_getaffinity(0))


def parse_cpus(text):
    """``"0-2,5"`` → ``[0, 1, 2, 5]``."""
    out = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def _print_plan(argv=None):
    """``python -m milarun.isolation N [MEMORY_BYTES]``: one line per student:
    ``student<i> <cpus> <mems> <memory bytes>``."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    n = int(args[0])
    mem = int(args[1]) if len(args) > 1 else None
    for s in student_plan(n, mem):
        print(f"student{s['student']} {format_cpus(s['cpus'])} "
              f"{','.join(map(str, s['mems']))} {s['memory_bytes']}")


if __name__ == "__main__":
    _print_plan()
