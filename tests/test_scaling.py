"""scaling under torchrun: two CPU ranks (gloo), one result from rank 0."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, SMOKE_ARGS, steady_samples


def _torchrun(tmp_path, *args):
    out = tmp_path / "r.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    for key in ("MASTER_ADDR", "MASTER_PORT", "SLURMD_NODENAME"):
        env.pop(key, None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "milarun",
        "run",
        "milarun.models.scaling:main",
        "-o",
        str(out),
        "--experiment-name",
        "t.scaling",
        "--job-id",
        "0.0-1",
        "--",
        *SMOKE_ARGS,
        "--batch-size",
        "4",
        "--width",
        "4",
        "--blocks",
        "1",
        "--image-size",
        "8",
        "--classes",
        "10",
        "--device",
        "cpu",
        *args,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr, proc.stderr[-3000:]  # a rank's teardown
    results = [p for p in tmp_path.iterdir() if p.suffix == ".json"]
    assert results == [out]  # only rank 0 wrote
    res = json.loads(out.read_text())
    assert res["success"] is True, res["error"]
    return res


def test_scaling_two_ranks_with_torchrun(tmp_path):
    res = _torchrun(tmp_path, "--max-count", "240")
    assert len(steady_samples(res)) >= 2
    assert res["metrics"]["world_size"] == 2
    assert res["metrics"]["backend"] == "gloo"
    assert res["metrics"]["global_batch"] == 8
    assert res["timings"]["train"]["count"] >= 240
    # rank 0 recorded the job: one node (this host) of two ranks, torchrun's c10d rendezvous
    dist = res["distributed"]
    assert dist["world_size"] == 2 and dist["backend"] == "gloo"
    assert len(dist["hosts"]) == 1 and dist["hosts"][0]["hostname"] == res["host"]["hostname"]
    assert dist["node_names"] == [res["host"]["hostname"]]
    assert dist["rendezvous"]["backend"] == "c10d" and dist["rendezvous"]["id"]


def test_min_steady_extension_is_agreed_between_ranks(tmp_path):
    # --max-count 8 is a single step; the 1.5 s floor extends it. If the ranks
    # took different targets, one would block in the all-reduce and torchrun
    # would not return.
    res = _torchrun(tmp_path, "--max-count", "8", "--min-steady", "1.5")
    train = res["timings"]["train"]
    steady = [s for s in train["samples"] if not s["warmup"]]
    assert sum(s["end"] - s["start"] for s in steady) >= 1.5
    assert train["count"] > 8 and train["count"] % 8 == 0
    assert train["max_count"] == 8 and train["min_steady"] == 1.5


# Runs one world-of-one scaling test in a fresh interpreter (so that
# torch.distributed.nn is not imported yet) and prints the threads left after it.
_THREADS_AFTER_RUN = """
import os, sys
from milarun.cli.run import run_experiment
code = run_experiment("milarun.models.scaling:main", sys.argv[2:], out=sys.argv[1])
tasks = os.listdir("/proc/self/task")
print(code, *sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in tasks))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_process_group_is_gone_when_the_test_returns(tmp_path):
    # destroy_process_group() must really free the group: were it kept alive
    # (DDP's lazy import of torch.distributed.nn binding it as a default
    # argument), its gloo threads and sockets would be torn down during the
    # interpreter's exit, after the other ranks left, where a rank aborted.
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    argv = [
        *SMOKE_ARGS,
        "--batch-size",
        "4",
        "--width",
        "4",
        "--blocks",
        "1",
        "--image-size",
        "8",
        "--classes",
        "10",
        "--device",
        "cpu",
        "--max-count",
        "16",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", _THREADS_AFTER_RUN, str(tmp_path / "r.json"), *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    code, *threads = proc.stdout.split()
    assert code == "0", proc.stderr[-3000:]
    # gloo's worker and I/O threads, the TCPStore server of the world of one
    assert not [t for t in threads if "gloo" in t or "tcpstore" in t], threads
