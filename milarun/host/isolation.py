"""Student cgroups (v1 and v2) and CPU/NUMA placement. No torch here.

Read side (used inside the child): ``current_cpuset``, ``current_cgroup``,
``current_memory_limit_mib``, ``current_cpu_quota``.

Parent side: ``cgroup_version``, ``split_students`` (the cpuset/memory plan
that ``scripts/cgroup_setup.sh`` applies, through :mod:`milarun.host.students`),
``check_group_spec`` (a plain group under the root), ``missing_groups``,
``oom_kill_count``, ``process_cpus`` (the cores of each process of a
multi-process test) and ``wrap`` (the cgexec/numactl/exec-prefix argv).
"""

import os
import re
import shutil
from pathlib import Path

from .kernel import read_text

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


def current_memory_limit_mib(pid="self"):
    """The memory limit of the cgroup ``pid`` runs in (MiB), None if unlimited or unknown."""
    groups = _proc_cgroups(pid)
    if "memory" in groups:
        raw = read_text(CGROOT / "memory" / groups["memory"].lstrip("/") / "memory.limit_in_bytes")
    elif "" in groups:
        raw = read_text(CGROOT / groups[""].lstrip("/") / "memory.max")
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
            quota = read_text(base / "cpu.cfs_quota_us")
            period = read_text(base / "cpu.cfs_period_us")
        elif "" in groups:
            raw = read_text(CGROOT / groups[""].lstrip("/") / "cpu.max")
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


#: Controllers of a cgroup spec: lower-case names separated by commas.
_CONTROLLERS = re.compile(r"[a-z0-9_]+(,[a-z0-9_]+)*")
#: One part of a group's path: a plain name (``.`` and ``..`` are refused apart).
_GROUP_PART = re.compile(r"[A-Za-z0-9_.-]+")


def check_group_spec(spec):
    """Why ``spec`` (``"controllers:group"``) is not a plain cgroup under the cgroup
    root, or None when it is.

    The group is a relative path of plain names (letters, digits, ``_.-``), none
    of them ``.`` or ``..``, no ``/`` at the start or end: ``cgexec -g`` and the
    existence check join it to the root, so ``../../tmp/x`` would put the pid into
    any file named ``tasks`` and ``/x`` names a group the student split never made.
    """
    ctrls, sep, group = spec.partition(":")
    if not sep or not _CONTROLLERS.fullmatch(ctrls):
        return "the controllers must be lower-case names separated by commas"
    if group.startswith("/"):
        return "the group must be relative to the cgroup root (no '/' at the start)"
    parts = group.split("/")
    if any(not _GROUP_PART.fullmatch(part) for part in parts):
        return (
            "the group must be a path of names of letters, digits, '_', '.' and '-' (no empty part)"
        )
    if any(part in (".", "..") for part in parts):
        return "the group must stay under the cgroup root (no '.' or '..' part)"
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
    for path in (
        CGROOT / "memory" / group / "memory.oom_control",
        CGROOT / group / "memory.events",
    ):
        text = read_text(path)
        if text is None:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return None


def split_students(n, cpus, total_memory_bytes, gpu_cpus=None, numa_nodes=None, cores=None):
    """Plan ``n`` student slices: equal, mutually exclusive cpusets and equal memory.

    Args:
        n: number of students (one per GPU or CPU slot).
        cpus: sorted list of usable CPU ids.
        total_memory_bytes: RAM to share (bytes).
        gpu_cpus: optional list, per student, of the CPU ids local to that
            GPU (NVML's CPU affinity: its NUMA node's CPUs, SMT siblings
            included). Students then take cores from their own NUMA node first.
        numa_nodes: optional dict cpu id → NUMA node id.
        cores: optional list of physical cores, each a list of the CPU ids
            that are its SMT siblings (:func:`cpu_cores`); None: every CPU is
            a core of its own.

    Returns:
        list of dicts ``{"student": i, "cpus": [...], "mems": [...], "memory_bytes": int}``.
        Each student gets whole physical cores, never a sibling of another
        student's core, and the same number of them: ``k // n`` of the ``k``
        cores with a given number of usable CPUs, for each such number (all
        of them on a host whose cores are alike; the rest stay unused).
        Without SMT that is ``len(cpus) // n`` CPUs each (at least 1). When
        there are fewer whole cores than students, CPUs are shared out one
        by one instead (siblings then go to different students).

    Raises:
        ValueError: fewer CPUs than students.
    """
    if n < 1:
        raise ValueError("need at least one student")
    if len(cpus) < n:
        raise ValueError(f"{len(cpus)} CPUs cannot be split into {n} exclusive students")
    units = _physical_cores(cpus, cores)
    quota = _core_quota(units, n)
    if not quota:  # fewer whole cores than students: share out CPUs, not cores
        units = [(c,) for c in sorted(cpus)]
        quota = _core_quota(units, n)
    free = list(units)
    plan = []
    for i in range(n):
        local = set(gpu_cpus[i]) if gpu_cpus else set()
        # cores local to this student's GPU first, then the others, each in CPU order
        order = [u for u in free if local & set(u)] + [u for u in free if not local & set(u)]
        chosen = _take(order, quota)
        for u in chosen:
            free.remove(u)
        chosen = sorted(c for u in chosen for c in u)
        mems = sorted({numa_nodes.get(c, 0) for c in chosen}) if numa_nodes else [0]
        plan.append(
            {"student": i, "cpus": chosen, "mems": mems, "memory_bytes": total_memory_bytes // n}
        )
    return plan


def _physical_cores(cpus, cores=None):
    """``cpus`` grouped by physical core: a list of tuples of CPU ids (each tuple one
    core's SMT siblings among ``cpus``), sorted by their lowest CPU id. ``cores``: lists
    of sibling CPU ids (:func:`cpu_cores`); a CPU of ``cpus`` in none is a core of its own."""
    allowed = set(cpus)
    out: list = []
    seen: set = set()
    for core in cores or ():
        unit = tuple(sorted(set(core) & allowed - seen))
        if unit:
            out.append(unit)
            seen.update(unit)
    out += [(c,) for c in sorted(allowed - seen)]
    return sorted(out)


def _core_quota(units, n):
    """``{size: count}``: how many cores of each size (usable CPUs per core) each of ``n``
    equal shares of ``units`` gets; ``{}`` when a share would get none."""
    sizes: dict = {}
    for u in units:
        sizes[len(u)] = sizes.get(len(u), 0) + 1
    return {size: count // n for size, count in sizes.items() if count // n}


def _take(order, quota):
    """The first cores of ``order`` that fill ``quota`` (``{size: count}``)."""
    left = dict(quota)
    out = []
    for u in order:
        if left.get(len(u), 0) > 0:
            out.append(u)
            left[len(u)] -= 1
    return out


def cpu_cores(cpus=None, root="/"):
    """The physical cores of this host: a list of lists of CPU ids, each one core's SMT
    siblings (``/sys/devices/system/cpu/cpuN/topology/thread_siblings_list``, else
    ``core_cpus_list``), sorted by lowest CPU id. ``cpus``: the CPU ids to look up
    (default: every CPU sysfs lists); one whose topology is unreadable is a core of its
    own. ``root``: where sysfs is (tests give a fake tree)."""
    base = Path(root) / "sys/devices/system/cpu"
    if cpus is None:
        cpus = sorted(int(p.name[3:]) for p in base.glob("cpu[0-9]*") if p.name[3:].isdigit())
    out, seen = [], set()
    for c in sorted(cpus):
        if c in seen:
            continue
        text = None
        for name in ("thread_siblings_list", "core_cpus_list"):
            text = read_text(base / f"cpu{c}" / "topology" / name)
            if text:
                break
        try:
            core = sorted(set(parse_cpus(text)) | {c}) if text else [c]
        except ValueError:
            core = [c]
        out.append(core)
        seen.update(core)
    return sorted(out)


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


def numa_nodes_of_cpus(root="/"):
    """Map cpu id → NUMA node from ``/sys/devices/system/node`` (under ``root``: tests give
    a fake tree); ``{}`` when absent."""
    out = {}
    base = Path(root) / "sys/devices/system/node"
    for node in sorted(base.glob("node[0-9]*")):
        text = read_text(node / "cpulist")
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
    return [
        shutil.which("numactl") or "numactl",
        "--localalloc",
        f"--physcpubind={format_cpus(cpus)}",
    ]


def slot_cpus(n, cpus=None, cores=None):
    """The CPU ids of each of ``n`` CPU slots: ``cpus`` (default: this process's
    affinity) split as the student cgroups split them (:func:`split_students`: whole
    physical cores, ``cores`` as there; default: this host's, :func:`cpu_cores`)."""
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else sorted(cpus)
    cores = cpu_cores(cpus) if cores is None else cores
    return [s["cpus"] for s in split_students(n, cpus, 0, cores=cores)]


def process_cpus(groups, affinity, cpus, cores=None):
    """Exclusive cores for each process of a multi-process test.

    Args:
        groups: per process, the positions (in ``affinity``) of its devices.
        affinity: per device, the CPU ids local to it (NVML's CPU affinity of a
            GPU: the CPUs of the NUMA node it is attached to, SMT siblings
            included; a CPU slot's CPUs); an empty list when unknown.
        cpus: the CPU ids processes may use (sorted list).
        cores: the physical cores, each a list of SMT sibling CPU ids
            (:func:`cpu_cores`); default: this host's.

    Returns:
        per process, a sorted list of CPU ids. A process takes the CPUs local
        to its devices; processes whose devices are local to the same CPUs
        (two processes on one NUMA node) split them evenly by whole physical
        cores (:func:`split_students`), so none is over-subscribed and no two
        share a core's SMT siblings. When a device's affinity is unknown, or
        leaves a process no CPU, ``cpus`` is split evenly across all processes
        instead.

    Raises:
        ValueError: fewer ``cpus`` than processes.
    """
    n = len(groups)
    if len(cpus) < n:
        raise ValueError(f"{len(cpus)} CPUs cannot be split into {n} exclusive processes")
    cores = cpu_cores(cpus) if cores is None else cores
    allowed = set(cpus)
    local = []
    for group in groups:
        mine = set()
        for d in group:
            mine |= set(affinity[d] if d < len(affinity) else ())
        local.append(tuple(sorted(mine & allowed)))
    sharing: dict = {}
    for p, near in enumerate(local):
        sharing.setdefault(near, []).append(p)
    if not all(local) or any(len(near) < len(procs) for near, procs in sharing.items()):
        return [s["cpus"] for s in split_students(n, sorted(cpus), 0, cores=cores)]
    out = [None] * n
    for mine, procs in sharing.items():
        for p, share in zip(procs, split_students(len(procs), list(mine), 0, cores=cores)):
            out[p] = share["cpus"]
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


def student_pool_cpus():
    """The CPU ids the students split: the root cpuset's, else this process's affinity."""
    root_cpus = read_text(CGROOT / "cpuset" / "cpuset.cpus") or read_text(
        CGROOT / "cpuset.cpus.effective"
    )
    return parse_cpus(root_cpus) if root_cpus else sorted(os.sched_getaffinity(0))


def parse_cpus(text):
    """``"0-2,5"`` → ``[0, 1, 2, 5]``."""
    out: list = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out
