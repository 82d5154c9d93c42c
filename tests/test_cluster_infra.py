"""The local test cluster itself works: a real two-node Slurm cluster (scripts/slurm-local.sh)
and a local sshd with two node names (scripts/sshd-local.sh).

These run against the daemons that .ci/run starts; elsewhere they skip with the reason, unless
$MILARUN_REQUIRE_CLUSTER=1, which turns the skip into a failure.
"""

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import venv_python

pytestmark = pytest.mark.cluster


def run(argv, env=None, timeout=30):
    out = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    assert out.returncode == 0, f"{argv} exited {out.returncode}: {out.stderr}"
    return out.stdout


def sbatch(cluster, script, tmp_path, *options):
    """Submit ``script`` (a bash body) and return the job id; output goes to tmp_path/job.out."""
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\n" + script)
    out = run(
        [
            "sbatch",
            "--parsable",
            "-o",
            str(tmp_path / "job.out"),
            "-D",
            str(tmp_path),
            *options,
            str(path),
        ],
        env=cluster.env,
    )
    return out.strip().split(";")[0]


def job_state(cluster, job):
    out = run(["scontrol", "show", "job", "-o", job], env=cluster.env)
    return re.search(r"JobState=(\S+)", out).group(1)


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def wait_job(cluster, job, states, timeout=30):
    final = {}

    def done():
        final["state"] = job_state(cluster, job)
        return final["state"] in states

    wait_for(done, timeout, f"job {job} to reach {states}")
    return final["state"]


def test_srun_two_nodes_one_rank_each(slurm_cluster):
    out = run(
        ["srun", "-N2", "-n2", "bash", "-c", "echo $SLURMD_NODENAME $SLURM_PROCID"],
        env=slurm_cluster.env,
    )
    assert sorted(out.split("\n")[:-1]) == ["node1 0", "node2 1"]


def test_sbatch_job_runs_steps_on_both_nodes(slurm_cluster, tmp_path):
    job = sbatch(
        slurm_cluster,
        "srun -N2 -n2 bash -c 'echo step on $SLURMD_NODENAME'\necho nodes $SLURM_JOB_NODELIST\n",
        tmp_path,
        "-N2",
    )
    assert wait_job(slurm_cluster, job, {"COMPLETED", "FAILED", "CANCELLED"}) == "COMPLETED"
    lines = (tmp_path / "job.out").read_text().splitlines()
    assert sorted(lines) == ["nodes node[1-2]", "step on node1", "step on node2"]


def test_overlapping_steps_run_concurrently(slurm_cluster, tmp_path):
    # A barrier: every task of both steps waits for the other step's tasks, so the job only
    # succeeds when the two steps run at the same time.
    barrier = (
        "touch $STEP.$SLURM_PROCID; for i in $(seq 200); do "
        "[ -e A.0 ] && [ -e A.1 ] && [ -e B.0 ] && [ -e B.1 ] && exit 0; sleep 0.1; done; exit 1"
    )
    job = sbatch(
        slurm_cluster,
        f"STEP=A srun --overlap -N2 -n2 bash -c '{barrier}' & a=$!\n"
        f"STEP=B srun --overlap -N2 -n2 bash -c '{barrier}' & b=$!\n"
        "wait $a && wait $b\n",
        tmp_path,
        "-N2",
    )
    state = wait_job(slurm_cluster, job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=40)
    assert state == "COMPLETED", (tmp_path / "job.out").read_text()
    assert sorted(p.name for p in tmp_path.glob("[AB].*")) == ["A.0", "A.1", "B.0", "B.1"]


def test_scancel_ends_job_and_leaves_no_process(slurm_cluster, tmp_path):
    # The tasks ignore SIGTERM, so only the SIGKILL after KillWait ends them.
    job = sbatch(
        slurm_cluster,
        "echo $$ > batch.pid\n"
        "srun -N2 -n2 bash -c 'trap \"\" TERM; echo $$ > task.$SLURM_PROCID.pid; exec sleep 600'\n",
        tmp_path,
        "-N2",
    )
    pid_files = [tmp_path / n for n in ("batch.pid", "task.0.pid", "task.1.pid")]
    wait_for(
        lambda: all(p.exists() and p.read_text().strip() for p in pid_files),
        30,
        "the job's tasks to start",
    )
    pids = [int(p.read_text()) for p in pid_files]
    assert all(Path(f"/proc/{pid}").exists() for pid in pids)
    run(["scancel", job], env=slurm_cluster.env)
    wait_for(
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids),
        20,
        f"processes {pids} of cancelled job {job} to end",
    )
    assert wait_job(slurm_cluster, job, {"CANCELLED"}, timeout=20) == "CANCELLED"
    # Nor any slurmstepd of the job (pgrep exits 1 when nothing matches).
    wait_for(
        lambda: (
            subprocess.run(
                ["pgrep", "-f", rf"^slurmstepd: \[{job}\."], stdout=subprocess.DEVNULL
            ).returncode
            == 1
        ),
        20,
        f"the slurmstepd processes of job {job} to exit",
    )


def test_ssh_batchmode_to_both_names(ssh_nodes):
    assert len(set(ssh_nodes.nodes)) == 2
    for node in ssh_nodes.nodes:
        assert run(ssh_nodes.ssh_argv(node, "hostname")).strip() == socket.gethostname()
        # The generated client config says the same thing.
        assert run(["ssh", "-F", str(ssh_nodes.config), node, "echo ok"]).strip() == "ok"


DDP_SCRIPT = """\
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"rank={dist.get_rank()} world={dist.get_world_size()} sum={int(t.item())}", flush=True)
dist.destroy_process_group()
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_c10d_rendezvous_over_ssh(ssh_nodes, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    endpoint = f"127.0.0.1:{free_port()}"
    # `timeout` on the remote side: killing the local ssh client would not end the agent.
    # 150 s, not 60: when the agent hosting the store leaves first, the other one waits
    # out torch's 60 s store timeout before it exits 0 (pytorch/pytorch#69520).
    command = (
        f"timeout 150 {venv_python()} -m torch.distributed.run --nnodes 2 --nproc-per-node 1 "
        f"--rdzv-backend c10d --rdzv-endpoint {endpoint} --rdzv-id infra-{os.getpid()} "
        f"--max-restarts 0 {script}"
    )
    agents = [
        subprocess.Popen(
            ssh_nodes.ssh_argv(node, command),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        for node in ssh_nodes.nodes
    ]
    try:
        outputs = [agent.communicate(timeout=180) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    # Both agents' logs, without the C++ frames that filled the last failure's tail.
    logs = "\n".join(
        f"--- agent on {node}, exit {agent.returncode}:\n"
        + "\n".join(line for line in err.splitlines() if not line.startswith("frame #"))[-3000:]
        for node, agent, (_, err) in zip(ssh_nodes.nodes, agents, outputs)
    )
    assert [agent.returncode for agent in agents] == [0, 0], logs
    lines = sorted(
        line for out, _ in outputs for line in out.splitlines() if line.startswith("rank=")
    )
    assert lines == ["rank=0 world=2 sum=3", "rank=1 world=2 sum=3"]
