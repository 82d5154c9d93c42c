"""Distributed faults on one host, through the real launcher and torchrun: a rank that dies and
a node that never joins the rendezvous each end as a FAIL record with their reason."""

import json
import socket

from milarun.host.devices import Devices
from milarun.launcher.waves import run_wave
from milarun.plan import nodes
from milarun.plan.launches import plan_job
from milarun.profile.job import Job


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fault_job(partition, function, arguments):
    return Job(
        "faults",
        function,
        f"milarun.models.faults:{function}",
        arguments=arguments,
        plan_type=partition,
        launcher="torchrun",
        timeout=120,
        definition={"partition_scheme": {"type": partition}},
    )


def test_a_rank_that_dies_fails_the_whole_node_job_as_rank_failed(tmp_path):
    job = fault_job(
        "njobs",
        "die",
        {"--rank": 1, "--signal-name": "SIGKILL", "--sample-duration": 0.1, "--warmup": 0},
    )
    (wave,) = plan_job(job, Devices("cpu", [0, 1]), 0, tmp_path, tmp_path)
    (outcome,) = run_wave(wave, tmp_path)
    assert not outcome.success and outcome.reason == "rank-failed"
    (path,) = tmp_path.glob("*.FAIL.*.json")
    rec = json.loads(path.read_text())
    assert rec["error"]["reason"] == "rank-failed"
    # rank 0 had counted before it was stopped: its samples are kept
    assert rec["timings"]["train"]["samples"]


def test_a_node_that_never_joins_is_a_rendezvous_timeout(tmp_path):
    # A two-node plan whose second agent is never started: the first waits for it in vain.
    two = nodes.Cluster(
        "local",
        [nodes.Node("a", "127.0.0.1", main=True), nodes.Node("b", "127.0.0.1")],
        Devices("cpu", [0]),
    )
    job = fault_job("multi-node", "crawl", {"--max-count": 1000})
    (wave,) = plan_job(job, two, 0, tmp_path, tmp_path, rdzv_port=free_port(), join_timeout=3)
    (lch,) = wave
    assert "--nnodes" in lch.argv and "join_timeout=3" in lch.argv
    (outcome,) = run_wave(wave, tmp_path)
    assert outcome.reason == "rendezvous-timeout", list(tmp_path.glob("logs/*"))[0].read_text()
    (path,) = tmp_path.glob("*.FAIL.*.json")
    assert json.loads(path.read_text())["error"]["reason"] == "rendezvous-timeout"


def _rank_pids(marker, rank):
    """PIDs of the processes whose command line holds ``marker`` and whose RANK is ``rank``."""
    import os

    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if marker.encode() in cmd and b"milarun" in cmd and f"RANK={rank}".encode() in env:
            pids.append(int(entry))
    return pids


def test_a_rank_killed_mid_ddp_is_rank_failed_even_when_rank_0_writes_its_error(tmp_path):
    # Real DDP (scaling): rank 0 sees its peer vanish in an all-reduce and writes its own
    # record with its error; the launch is still a failed rank, not a test bug.
    import os
    import signal
    import threading
    import time

    job = Job(
        "faults",
        "ddp",
        "milarun.models.scaling:main",
        arguments={
            "--width": 8,
            "--blocks": 1,
            "--image-size": 16,
            "--batch-size": 8,
            "--max-count": 100000000,
            "--sample-duration": 0.2,
            "--warmup": 0,
        },
        plan_type="njobs",
        launcher="torchrun",
        timeout=120,
        definition={"partition_scheme": {"type": "njobs"}},
    )
    (wave,) = plan_job(job, Devices("cpu", [0, 1]), 0, tmp_path, tmp_path)
    outcomes = []
    runner = threading.Thread(target=lambda: outcomes.extend(run_wave(wave, tmp_path)))
    runner.start()
    journal = wave[0].journal_path
    deadline = time.time() + 90
    while time.time() < deadline:
        if journal.exists() and journal.read_text().count('"sample"') >= 3:
            break
        time.sleep(0.2)
    victims = _rank_pids(str(tmp_path), 1)
    assert victims, "rank 1 never started"
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    runner.join(timeout=150)
    (outcome,) = outcomes
    assert outcome.reason == "rank-failed"
    (path,) = tmp_path.glob("*.FAIL.*.json")
    rec = json.loads(path.read_text())
    assert rec["error"]["reason"] == "rank-failed"
    assert rec["timings"]["train"]["samples"]


def test_a_process_whose_parent_died_while_it_started_exits_at_once():
    # A torchrun rank whose agent died before it asked for a parent-death signal would be
    # an orphan that nobody supervises: it notices its parent changed and leaves.
    import subprocess
    import sys

    code = (
        "from milarun.host import supervise; "
        "supervise.set_parent_death_signal(launcher_pid=1, parent_at_start=-5); "
        "print('still here')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "still here" not in done.stdout
    code = code.replace("parent_at_start=-5", "parent_at_start=__import__('os').getppid()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "still here" in done.stdout
