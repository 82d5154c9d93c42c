"""How busy the host is outside the suite, sampled in a background thread of the child.

Every ``interval`` seconds it reads the host's CPU time (``/proc/stat``
through ``psutil.cpu_times``: user + nice + system, all CPUs; steal where
the kernel reports it) and the CPU time of every process of the **suite**,
and records, over the interval just ended, in cores (CPU-seconds per
second)::

    {"t": s since program start (end of the interval), "dt": s,
     "busy": host CPUs busy, "suite": used by the suite,
     "outside": busy - suite (>= 0), "steal": stolen by the hypervisor}

**The suite** is the process tree of the launcher: the ``milarun jobs``
process named by ``$MILARUN_PDEATHSIG`` (which the launcher sets for its
children) when it is an ancestor of this process, with every descendant
(the other students, their data-loader workers, torchrun agents and ranks,
prepare commands). Without a launcher (``milarun run`` by hand, or a rank
on a remote node, where the variable is 1) it is the torchrun agent of
this rank (``$LOCAL_RANK`` set), else this process. The tree is read from
``/proc`` at every sample, so processes that start later are counted; the
process tree rather than the student cgroups is used because it also works
without cgroups and covers the launcher itself.

**Outside** is everything else the host's CPUs did: other users' processes,
other benchmarks, and kernel threads (``kworker``, ``kswapd``: including
kernel work done for the suite's own I/O). Interrupt time is not counted
on either side. A process of the suite that exits between two samples loses
its last partial interval, which shows as outside time (at most one
interval of that process).

The thread reads ``/proc`` for each process of the tree once per sample
(psutil), a few milliseconds per second in the child; ``--no-instrument``
turns it off with the GPU monitor.
"""

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .distributed import World
from .sampler import PeriodicSampler, Row

#: Fields of ``psutil.cpu_times()`` that count as busy (guest time is part of user).
BUSY_FIELDS = ("user", "nice", "system")


def _ancestors(pid: int) -> list[int]:
    try:
        import psutil
    except ImportError:
        return []
    out = []
    try:
        proc = psutil.Process(pid).parent()
        while proc is not None:
            out.append(proc.pid)
            proc = proc.parent()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
    return out


def suite_root(environ: Mapping[str, str] | None = None, pid: int | None = None) -> tuple[int, str]:
    """The PID whose process tree is the suite, and why: ``(pid, "launcher" |
    "torchrun-agent" | "self")`` (rules in the module docstring)."""
    environ = os.environ if environ is None else environ
    pid = os.getpid() if pid is None else pid
    ancestors = _ancestors(pid)
    launcher = environ.get("MILARUN_PDEATHSIG", "")
    if launcher.isdigit() and int(launcher) > 1 and int(launcher) in ancestors:
        return int(launcher), "launcher"
    if World.from_environment(environ).torchrun and ancestors and ancestors[0] > 1:
        return ancestors[0], "torchrun-agent"
    return pid, "self"


def host_cpu_times() -> tuple[float, float | None]:
    """``(busy seconds, steal seconds or None)`` of the whole host since boot."""
    import psutil

    t = psutil.cpu_times()
    busy = sum(getattr(t, f, 0.0) for f in BUSY_FIELDS)
    return busy, getattr(t, "steal", None)


def descendants(root: int, proc: str = "/proc") -> list[int] | None:
    """The PIDs of ``root``'s descendants, read from ``/proc/<pid>/task/<tid>/children``
    (Linux 3.5+, ``CONFIG_PROC_CHILDREN``): only the suite's own processes are opened,
    where ``psutil``'s ``children(recursive=True)`` reads every process of the host
    (about 3 ms each second on a host with a hundred processes, GIL held, beside the
    training loop). None when the files are missing (psutil's walk is used then).
    """
    try:
        tasks = os.listdir(f"{proc}/{root}/task")
    except OSError:
        return None
    if not os.path.exists(f"{proc}/{root}/task/{tasks[0]}/children" if tasks else "-"):
        return None
    out, todo, seen = [], [root], {root}
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"{proc}/{pid}/task")
        except OSError:  # it ended meanwhile
            continue
        for tid in tids:
            try:
                with open(f"{proc}/{pid}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                continue
            for kid in kids:
                if kid not in seen:
                    seen.add(kid)
                    out.append(kid)
                    todo.append(kid)
    return out


#: A process of the suite: ``(pid, create_time)`` (a reused pid is another process).
ProcessKey = tuple[int, float]


def tree_cpu_times(root: int) -> dict[ProcessKey, float]:
    """``{(pid, create_time): user + system CPU seconds}`` of ``root`` and its
    descendants (processes that vanish while being read are left out)."""
    import psutil

    out: dict[ProcessKey, float] = {}
    try:
        top = psutil.Process(root)
        kids = descendants(root)
        if kids is None:
            procs = [top] + top.children(recursive=True)
        else:
            procs = [top]
            for pid in kids:
                try:
                    procs.append(psutil.Process(pid))
                except psutil.NoSuchProcess:
                    continue
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return out
    for p in procs:
        try:
            with p.oneshot():
                t = p.cpu_times()
                out[(p.pid, p.create_time())] = t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


class HostLoadMonitor(PeriodicSampler):
    """Samples host and suite CPU time every ``interval`` seconds until ``stop()`` (a
    :class:`~milarun.bench.sampler.PeriodicSampler`: ``start()`` takes the first
    reading, ``stop()`` the last partial interval).

    Args:
        interval: seconds between samples.
        origin: ``clock()`` value that sample times are relative to (the
            experiment's program start, as for the rate samples).
        root: the suite's root PID (default: :func:`suite_root`).
        clock, host_times, tree_times, cpu_count: what the readings come
            from (replaced in tests).
        on_reading: optional ``f(row)`` called with each recorded interval (the
            experiment streams them to its journal, so a killed child's FAIL
            record keeps them); its errors are ignored.

    ``record()`` returns the result's ``host_load`` field: ``{"available",
    "reason", "interval", "cpu_count", "suite_root", "samples"}``.
    """

    thread_name = "milarun-host-load"

    def __init__(
        self,
        interval: float = 1.0,
        origin: float | None = None,
        root: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        host_times: Callable[[], tuple[float, float | None]] = host_cpu_times,
        tree_times: Callable[[int], dict[ProcessKey, float]] = tree_cpu_times,
        cpu_count: int | None = None,
        on_reading: Callable[[Row], object] | None = None,
    ) -> None:
        super().__init__(interval, on_reading, reason="not started")
        self.clock = clock
        self.origin = clock() if origin is None else origin
        if root is None:
            root, how = suite_root()
        else:
            how = "given"
        self.root, self.how = root, how
        self.host_times = host_times
        self.tree_times = tree_times
        if cpu_count is None:
            cpu_count = os.cpu_count()
        self.cpu_count = cpu_count
        self._prev: tuple[float, float, float | None, dict[ProcessKey, float]] | None = None
        self._lock = threading.Lock()

    def _read(self) -> tuple[float, tuple[float, float | None], dict[ProcessKey, float]]:
        return self.clock(), self.host_times(), self.tree_times(self.root)

    def sample(self) -> Row | None:
        """Take one reading and record the interval since the previous one."""
        with self._lock:
            now, (busy, steal), tree = self._read()
            if self._prev is None:
                self._prev = (now, busy, steal, tree)
                return None
            t0, busy0, steal0, tree0 = self._prev
            self._prev = (now, busy, steal, tree)
            dt = now - t0
            if dt <= 0:
                return None
            # a process born since the last reading counts from zero
            suite = sum(cpu - tree0.get(key, 0.0) for key, cpu in tree.items())
            used = max(0.0, busy - busy0)
            row: Row = {
                "t": now - self.origin,
                "dt": dt,
                "busy": used / dt,
                "suite": max(0.0, suite) / dt,
                "outside": max(0.0, used - suite) / dt,
            }
            if steal is not None and steal0 is not None:
                row["steal"] = max(0.0, steal - steal0) / dt
            self.samples.append(row)
        self._notify(row)
        return row

    def _init(self) -> bool:
        try:
            self.sample()
        except Exception as exc:  # no psutil, no /proc
            self.reason = f"unavailable: {exc.__class__.__name__}: {exc}"
            return False
        self.reason = None
        return True

    def _sample(self) -> None:
        self.sample()

    def _last(self) -> None:
        try:
            if self._prev is None or self.clock() - self._prev[0] >= 0.1 * self.interval:
                self.sample()  # the last partial interval, unless it is a sliver
        except Exception:
            pass

    def record(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "reason": self.reason,
            "interval": self.interval,
            "cpu_count": self.cpu_count,
            "suite_root": self.how,
            "samples": list(self.samples),
        }
