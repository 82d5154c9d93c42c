"""The host-load sampler (milarun.bench.hostload): outside = host busy - suite, from fake
counters (exact) and from real processes inside and outside the suite's tree."""

import os
import subprocess
import sys
import time

import psutil
import pytest

from milarun.bench.hostload import HostLoadMonitor, suite_root, tree_cpu_times


class Fake:
    """Host and tree counters the test moves by hand."""

    def __init__(self):
        self.now = 0.0
        self.busy = 100.0
        self.steal = 5.0
        self.tree = {(10, 1.0): 50.0}

    def monitor(self, **kw):
        return HostLoadMonitor(
            interval=1.0,
            origin=0.0,
            root=10,
            clock=lambda: self.now,
            host_times=lambda: (self.busy, self.steal),
            tree_times=lambda root: dict(self.tree),
            cpu_count=4,
            **kw,
        )


def test_outside_is_host_busy_minus_the_suite():
    f = Fake()
    mon = f.monitor()
    assert mon.sample() is None  # the first reading only sets the baseline
    f.now, f.busy, f.steal = 2.0, 106.0, 5.4
    f.tree = {(10, 1.0): 52.0, (11, 1.5): 1.0}  # pid 11 was born in the interval
    row = mon.sample()
    assert row == pytest.approx(
        {"t": 2.0, "dt": 2.0, "busy": 3.0, "suite": 1.5, "outside": 1.5, "steal": 0.2}
    )
    # pid 10 exits; a new process reuses no key: only pid 11's time counts
    f.now, f.busy = 3.0, 107.0
    f.tree = {(11, 1.5): 1.5}
    row = mon.sample()
    assert row["suite"] == pytest.approx(0.5) and row["outside"] == pytest.approx(0.5)
    rec = mon.record()
    assert rec["cpu_count"] == 4 and rec["suite_root"] == "given" and len(rec["samples"]) == 2


def test_each_reading_reaches_on_reading_and_a_failing_callback_changes_nothing():
    f = Fake()
    seen = []
    mon = f.monitor(on_reading=seen.append)
    mon.sample()
    f.now, f.busy = 1.0, 101.0
    row = mon.sample()
    assert seen == [row]  # the baseline reading is not an interval

    def broken(row):
        raise OSError(28, "No space left on device")

    mon = f.monitor(on_reading=broken)
    mon.sample()
    f.now, f.busy = 2.0, 102.0
    assert mon.sample() is not None and len(mon.record()["samples"]) == 1


def test_no_steal_field_where_the_kernel_has_none():
    f = Fake()
    f.steal = None
    mon = f.monitor()
    mon.sample()
    f.now, f.busy = 1.0, 101.0
    assert "steal" not in mon.sample()


def test_outside_is_never_negative():
    f = Fake()
    mon = f.monitor()
    mon.sample()
    f.now, f.busy = 1.0, 100.5
    f.tree = {(10, 1.0): 51.0}  # the tree read a little later than /proc/stat
    assert mon.sample()["outside"] == 0.0


def test_the_suite_root_rules():
    me, parent = os.getpid(), os.getppid()
    assert suite_root({"MILARUN_PDEATHSIG": str(parent)}) == (parent, "launcher")
    # not an ancestor (a stale value), or 1 (remote ranks): not the launcher
    assert suite_root({"MILARUN_PDEATHSIG": "999999999"}) == (me, "self")
    assert suite_root({"MILARUN_PDEATHSIG": "1"}) == (me, "self")
    assert suite_root({"LOCAL_RANK": "0"}) == (parent, "torchrun-agent")
    assert suite_root({}) == (me, "self")


def test_the_suite_counts_its_own_cpu_and_the_outside_a_stranger(tmp_path):
    """A busy loop in this process is the suite's; one re-parented away from it is not."""
    pidfile = tmp_path / "pid"
    spin = (
        "import os,time; open(%r,'w').write(str(os.getpid())); t=time.time()\n"
        "while time.time()-t < 20: pass" % str(pidfile)
    )
    # the shell exits at once: the spinner is no descendant of ours
    subprocess.run(["sh", "-c", f'{sys.executable} -c "{spin}" >/dev/null 2>&1 &'], check=True)
    deadline = time.time() + 10
    while not pidfile.exists() or not pidfile.read_text():
        assert time.time() < deadline
        time.sleep(0.02)
    stranger = psutil.Process(int(pidfile.read_text()))
    try:
        mon = HostLoadMonitor(interval=10, root=os.getpid())
        assert stranger.pid not in {pid for pid, _ in tree_cpu_times(os.getpid())}
        mon.sample()
        own0, theirs0 = time.process_time(), sum(stranger.cpu_times()[:2])
        t = time.perf_counter()
        while time.perf_counter() - t < 0.6:
            pass
        row = mon.sample()
        own = time.process_time() - own0
        theirs = sum(stranger.cpu_times()[:2]) - theirs0
    finally:
        stranger.kill()
    dt = row["dt"]
    # clock ticks are 10 ms and the readings are not simultaneous: 0.05 s of slack
    assert row["suite"] * dt >= own - 0.05
    assert row["outside"] * dt >= theirs - 0.05
    assert theirs > 0.1  # the stranger did run (else the last check proves nothing)


def test_descendants_read_only_the_suites_processes(tmp_path):
    # /proc/<pid>/task/<tid>/children, walked from the root: a grandchild of another thread
    # is found; a process outside the tree is never opened
    from milarun.bench.hostload import descendants

    def task(pid, tid, kids):
        d = tmp_path / str(pid) / "task" / str(tid)
        d.mkdir(parents=True)
        (d / "children").write_text(" ".join(map(str, kids)) + (" " if kids else ""))

    task(10, 10, [11, 12])
    task(10, 13, [14])  # a child forked by another thread of the root
    task(11, 11, [15])
    task(12, 12, [])
    task(14, 14, [])
    task(15, 15, [])
    task(99, 99, [100])  # not in the tree
    assert sorted(descendants(10, proc=str(tmp_path))) == [11, 12, 14, 15]
    # a kernel without CONFIG_PROC_CHILDREN: None, and psutil's walk is used instead
    (tmp_path / "20" / "task" / "20").mkdir(parents=True)
    assert descendants(20, proc=str(tmp_path)) is None


def test_tree_cpu_times_count_real_children():
    import subprocess

    from milarun.bench.hostload import descendants, tree_cpu_times

    kids = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)
    ]
    try:
        me = os.getpid()
        found = descendants(me)
        assert found is None or {k.pid for k in kids} <= set(found)
        pids = {pid for pid, _ in tree_cpu_times(me)}
        assert {me, *(k.pid for k in kids)} <= pids
    finally:
        for k in kids:
            k.kill()
            k.wait()
