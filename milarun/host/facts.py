"""Host facts that change results: what the child records, what the summary keeps,
and what ``--compare`` checks against the baseline. No torch.

Recorded in each result's ``host`` (flat scalars; None where the host does
not expose the fact), next to the facts :func:`milarun.bench.experiment.host_facts`
already gathers (CPU model, cpuset, memory limit, GPUs and driver):

``milarun_version``, ``milarun_commit``, ``milarun_dirty``
    the package version; the git commit and whether tracked files differ
    from it, when milarun runs from a clone (else None).
``kernel``
    ``uname -r``.
``cpu_governor``, ``cpu_freq_driver``, ``cpu_boost``, ``cpu_max_mhz``
    the cpufreq governor of this process's CPUs (``"mixed: a, b"`` when they
    differ), the scaling driver, turbo/boost (``cpufreq/boost`` or
    ``intel_pstate/no_turbo``) and the highest maximum frequency (sysfs).
``cgroup_cpu_quota``
    the CPU quota of this process's cgroup in cores (``cpu.max`` or
    ``cpu.cfs_quota_us``), None when unlimited; the cpuset and memory limit
    applied are ``cpuset`` and ``memory_limit_mib``.

And per GPU (``host.gpus[]``, from NVML): ``power_limit_w`` (enforced),
``power_limit_default_w``, ``sm_clock_max_mhz``, ``mem_clock_max_mhz``,
``sm_clock_app_mhz``, ``mem_clock_app_mhz`` (application clocks),
``sm_clock_mhz`` (at start), ``persistence_mode`` and ``ecc_mode`` (bool).
"""

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from .. import __version__
from . import isolation
from .kernel import read_text

SYSFS_CPU = Path("/sys/devices/system/cpu")

#: The machine-level facts the summary keeps per host (same for every result of a host).
MACHINE_KEYS = (
    "milarun_version",
    "milarun_commit",
    "milarun_dirty",
    "kernel",
    "cpu_governor",
    "cpu_freq_driver",
    "cpu_boost",
    "cpu_max_mhz",
)
#: Per-GPU facts, collapsed per host to one value (or ``"a/b"`` when GPUs differ).
GPU_KEYS = (
    "power_limit_w",
    "power_limit_default_w",
    "sm_clock_max_mhz",
    "mem_clock_max_mhz",
    "sm_clock_app_mhz",
    "mem_clock_app_mhz",
    "persistence_mode",
    "ecc_mode",
)
#: The per-GPU configuration a node's hardware identity holds (``config.gpus[]``:
#: :func:`milarun.host.identity.config`), by the names of ``host.gpus[]`` where a record
#: has the same fact (``mig_mode`` and ``vbios`` are the identity's only).
GPU_CONFIG_KEYS = (
    "power_limit_w",
    "sm_clock_app_mhz",
    "mem_clock_app_mhz",
    "ecc_mode",
    "mig_mode",
    "persistence_mode",
    "driver",
    "vbios",
)
#: Per-student limits, kept per host as the tightest value seen.
STUDENT_KEYS = ("student_cpus", "memory_limit_mib", "cgroup_cpu_quota")
#: What ``--compare`` checks, with the words it uses.
COMPARED = (
    ("cpu_model", "CPU model"),
    ("gpus", "GPUs"),
    ("gpu_vendor", "GPU vendor"),
    ("gpu_backend", "device backend"),
    ("gpu_runtime", "GPU runtime"),
    ("driver", "GPU driver"),
    ("torch", "torch"),
    ("cuda", "CUDA"),
    ("milarun_version", "milarun version"),
    ("milarun_commit", "milarun commit"),
    ("kernel", "kernel"),
    ("cpu_governor", "CPU governor"),
    ("cpu_boost", "CPU boost"),
    ("cpu_max_mhz", "CPU max MHz"),
    ("power_limit_w", "GPU power limit (W)"),
    ("sm_clock_max_mhz", "GPU SM clock max (MHz)"),
    ("mem_clock_max_mhz", "GPU memory clock max (MHz)"),
    ("sm_clock_app_mhz", "GPU SM application clock (MHz)"),
    ("mem_clock_app_mhz", "GPU memory application clock (MHz)"),
    ("persistence_mode", "GPU persistence mode"),
    ("ecc_mode", "GPU ECC"),
    ("student_cpus", "CPUs per student"),
    ("memory_limit_mib", "memory per student (MiB)"),
    ("cgroup_cpu_quota", "CPU quota per student (cores)"),
)


# ------------------------------------------------------------ collecting (child)

#: Environment of the git that reads milarun's commit: none of this process's
#: ``GIT_*`` (``GIT_CONFIG_COUNT``/``KEY``/``VALUE`` would set ``core.fsmonitor``,
#: a command git runs), no system or user config, no home, no prompt.
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_SYSTEM": os.devnull,
    "GIT_CONFIG_GLOBAL": os.devnull,
    "HOME": "/nonexistent",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_OPTIONAL_LOCKS": "0",
    "LC_ALL": "C",
}
#: Options on every such git: no file-system monitor (a command), no hooks.
GIT_OPTS = (
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.untrackedCache=false",
)


def _git(root, *args):
    """Run ``git ARGS`` in the clone ``root`` with :data:`GIT_ENV` and :data:`GIT_OPTS`;
    the ``CompletedProcess`` (10 s at most)."""
    env = dict(
        GIT_ENV, PATH=os.environ.get("PATH") or os.defpath, GIT_CEILING_DIRECTORIES=str(root.parent)
    )
    return subprocess.run(
        ["git", *GIT_OPTS, "-C", str(root), *args],
        timeout=10,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def milarun_source(package_dir=None):
    """``{"milarun_version", "milarun_commit", "milarun_dirty"}``: the package
    version, and the git commit (with whether tracked files changed) when the
    package lies in a git clone; commit and dirty are None otherwise.

    git runs in the package's own clone (never the current folder, whose
    ``.git/config`` could name commands), only when this user owns the clone
    (git's safe.directory rule, also for a git older than 2.35.2), with a clean
    environment (:func:`_git`)."""
    root = Path(package_dir or Path(__file__).resolve().parents[1]).parent
    out: dict[str, Any] = {
        "milarun_version": __version__,
        "milarun_commit": None,
        "milarun_dirty": None,
    }
    try:
        if any(p.stat().st_uid != os.geteuid() for p in (root, root / ".git")):
            return out
    except OSError:  # no .git: not a clone
        return out
    try:
        head = _git(root, "rev-parse", "HEAD")
        if head.returncode != 0:
            return out
        out["milarun_commit"] = head.stdout.strip() or None
        status = _git(
            root, "status", "--porcelain", "--untracked-files=no", "--ignore-submodules=all"
        )
        if status.returncode == 0:
            out["milarun_dirty"] = bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def cpu_facts(cpus=None, sysfs=SYSFS_CPU):
    """``{"kernel", "cpu_governor", "cpu_freq_driver", "cpu_boost", "cpu_max_mhz"}``
    for the CPUs ``cpus`` (default: this process's cpuset), from sysfs;
    None for what the host does not expose (a VM without cpufreq)."""
    sysfs = Path(sysfs)
    if cpus is None:
        cpus = isolation.current_cpuset()
    governors = sorted(
        {g for c in cpus if (g := read_text(sysfs / f"cpu{c}" / "cpufreq" / "scaling_governor"))}
    )
    max_khz = [
        int(v)
        for c in cpus
        if (v := read_text(sysfs / f"cpu{c}" / "cpufreq" / "cpuinfo_max_freq")) and v.isdigit()
    ]
    drivers = sorted(
        {d for c in cpus if (d := read_text(sysfs / f"cpu{c}" / "cpufreq" / "scaling_driver"))}
    )
    boost = None
    raw = read_text(sysfs / "cpufreq" / "boost")
    if raw in ("0", "1"):
        boost = raw == "1"
    else:
        raw = read_text(sysfs / "intel_pstate" / "no_turbo")
        if raw in ("0", "1"):
            boost = raw == "0"
    return {
        "kernel": platform.release() or None,
        "cpu_governor": (
            governors[0]
            if len(governors) == 1
            else "mixed: " + ", ".join(governors)
            if governors
            else None
        ),
        "cpu_freq_driver": ", ".join(drivers) or None,
        "cpu_boost": boost,
        "cpu_max_mhz": max(max_khz) / 1000.0 if max_khz else None,
    }


def cpu_model(root="/"):
    """The CPU's model name: the first ``model name`` of ``ROOT/proc/cpuinfo``, else
    :func:`platform.processor`, else None."""
    for line in (read_text(Path(root) / "proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip() or None
    return platform.processor() or None


def memory_mib(root="/"):
    """The host's memory in MiB: ``MemTotal`` of ``ROOT/proc/meminfo`` (kB / 1024);
    None when it cannot be read."""
    for line in (read_text(Path(root) / "proc/meminfo") or "").splitlines():
        parts = line.split()
        if parts[:1] == ["MemTotal:"] and len(parts) >= 2 and parts[1].isdigit():
            return int(parts[1]) / 1024
    return None


def _nv(call, *args):
    try:
        return call(*args)
    except Exception:  # NVMLError_NotSupported and friends: the fact is unknown
        return None


def gpu_facts(pynvml, handle):
    """NVML facts of one GPU (keys in the module docstring); None for each one
    the GPU or driver does not report."""
    nv = pynvml
    sm, mem = getattr(nv, "NVML_CLOCK_SM", 1), getattr(nv, "NVML_CLOCK_MEM", 2)

    def get(name, *args):
        fn = getattr(nv, name, None)
        return None if fn is None else _nv(fn, handle, *args)

    def watts(mw):
        return mw / 1000.0 if isinstance(mw, (int, float)) else None

    enabled = getattr(nv, "NVML_FEATURE_ENABLED", 1)
    persistence = get("nvmlDeviceGetPersistenceMode")
    ecc = get("nvmlDeviceGetEccMode")
    if isinstance(ecc, (list, tuple)):
        ecc = ecc[0]  # (current, pending)
    return {
        "power_limit_w": watts(
            get("nvmlDeviceGetEnforcedPowerLimit") or get("nvmlDeviceGetPowerManagementLimit")
        ),
        "power_limit_default_w": watts(get("nvmlDeviceGetPowerManagementDefaultLimit")),
        "sm_clock_max_mhz": get("nvmlDeviceGetMaxClockInfo", sm),
        "mem_clock_max_mhz": get("nvmlDeviceGetMaxClockInfo", mem),
        "sm_clock_app_mhz": get("nvmlDeviceGetApplicationsClock", sm),
        "mem_clock_app_mhz": get("nvmlDeviceGetApplicationsClock", mem),
        "sm_clock_mhz": get("nvmlDeviceGetClockInfo", sm),
        "persistence_mode": None if persistence is None else persistence == enabled,
        "ecc_mode": None if ecc is None else ecc == enabled,
    }


def host_extras(cpus=None):
    """Every host-level fact of the module docstring, for the result's ``host``."""
    facts = {}
    facts.update(milarun_source())
    facts.update(cpu_facts(cpus))
    facts["cgroup_cpu_quota"] = isolation.current_cpu_quota()
    return facts


# ------------------------------------------------------- the summary's hosts


def machine_facts(host):
    """The machine-level facts of a result's ``host`` that it has (no None values),
    with its ``accelerator`` record (:mod:`milarun.host.accel`) flattened to ``gpu_vendor``,
    ``gpu_backend`` and ``gpu_runtime`` (``"ROCm 6.2.1"``)."""
    out = {k: host[k] for k in MACHINE_KEYS if host.get(k) is not None}
    acc = host.get("accelerator")
    if isinstance(acc, dict):
        if acc.get("vendor"):
            out["gpu_vendor"] = acc["vendor"]
        if acc.get("backend"):
            out["gpu_backend"] = acc["backend"]
        if acc.get("runtime_name"):
            out["gpu_runtime"] = f"{acc['runtime_name']} {acc.get('runtime') or 'unknown'}"
    return out


def accumulate(entry, host):
    """Fold one result's per-GPU and per-student facts into a summary host
    ``entry`` (kept under ``_gpu_facts`` and ``_student``)."""
    facts = entry.setdefault("_gpu_facts", {})
    for i, g in enumerate(host.get("gpus") or []):
        if isinstance(g, dict):
            mine = {k: g[k] for k in GPU_KEYS if g.get(k) is not None}
            if mine:
                facts.setdefault(g.get("index", i), {}).update(mine)
    student = entry.setdefault("_student", {})
    cpuset = host.get("cpuset")
    values = {
        "student_cpus": len(cpuset) if isinstance(cpuset, list) and cpuset else None,
        "memory_limit_mib": host.get("memory_limit_mib"),
        "cgroup_cpu_quota": host.get("cgroup_cpu_quota"),
    }
    for key, value in values.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            student[key] = min(student.get(key, value), value)


def collapse(entry):
    """The summary host's scalar facts from what :func:`accumulate` gathered:
    each GPU fact as one value when every GPU agrees, else ``"a/b"``; each
    student limit as the tightest seen."""
    out = {}
    per_gpu = entry.get("_gpu_facts") or {}
    for key in GPU_KEYS:
        values = [f[key] for f in per_gpu.values() if key in f]
        if not values:
            continue
        distinct = sorted(set(values), key=str)
        out[key] = distinct[0] if len(distinct) == 1 else "/".join(_show(v) for v in distinct)
    out.update(entry.get("_student") or {})
    return out


def differences(ours, base):
    """The facts that differ between the summary ``ours`` and the baseline ``base``
    (their ``hosts``): ``[(words, our value, baseline value)]``, values as text.

    A fact counts when both sides record it (a 2020 baseline records none);
    several hosts give ``"a, b"``.
    """
    out = []
    for key, words in COMPARED:
        mine, theirs = _values(ours, key), _values(base, key)
        if mine and theirs and mine != theirs:
            out.append((words, ", ".join(mine), ", ".join(theirs)))
    return out


def _values(summary, key):
    values = set()
    for h in (summary or {}).get("hosts") or []:
        value = h.get(key)
        if value is None or value == []:
            continue
        if isinstance(value, list):
            value = ", ".join(f"{value.count(n)} x {n}" for n in sorted(set(value), key=str))
        values.add(_show(value))
    return sorted(values)


def _show(value):
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def fact_lines(host):
    """The report header's facts of one summary host, as ``label value`` strings
    (only those recorded)."""
    parts = []

    def add(label, key, unit=""):
        if host.get(key) is not None:
            parts.append(f"{label} {_show(host[key])}{unit}")

    version = host.get("milarun_version")
    if version:
        commit = host.get("milarun_commit")
        extra = (
            f" ({commit[:12]}{', modified' if host.get('milarun_dirty') else ''})" if commit else ""
        )
        parts.append(f"milarun {version}{extra}")
    add("GPU vendor", "gpu_vendor")
    add("backend", "gpu_backend")
    add("runtime", "gpu_runtime")
    add("kernel", "kernel")
    add("CPU governor", "cpu_governor")
    add("boost", "cpu_boost")
    add("CPU max", "cpu_max_mhz", " MHz")
    add("GPU power limit", "power_limit_w", " W")
    add("SM clock max", "sm_clock_max_mhz", " MHz")
    add("SM app clock", "sm_clock_app_mhz", " MHz")
    add("memory clock max", "mem_clock_max_mhz", " MHz")
    add("persistence", "persistence_mode")
    add("ECC", "ecc_mode")
    add("CPUs per student", "student_cpus")
    add("memory per student", "memory_limit_mib", " MiB")
    add("CPU quota per student", "cgroup_cpu_quota", " cores")
    return parts
