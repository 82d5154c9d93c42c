"""lightning_convnet: ddp_convnet's training under PyTorch Lightning's Trainer (DDP strategy),
fed to milarun's rate logger by a callback; one node of two ranks, and two nodes of a
c10d rendezvous with Slurm's variables in the environment (which Lightning must ignore)."""

import json
import math
import os
import socket
import subprocess
import sys

import pytest
from conftest import ROOT, SMOKE_ARGS, build_tiny, steady_samples

from milarun.formats.record import validate

pytest.importorskip("lightning")

LIGHTNING = "milarun.models.lightning_convnet:main"
ARGS = [
    *SMOKE_ARGS,
    "--arch",
    "resnet18",
    "--batch-size",
    "4",
    "--image-size",
    "32",
    "--workers",
    "0",
    "--device",
    "cpu",
    "--lr",
    "0.01",
    "--max-count",
    "48",
]


@pytest.fixture(scope="module")
def imagenet_root(tiny_dataroot):
    return build_tiny(tiny_dataroot, "fake_imagenet")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", **extra)
    for key in (
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "TORCHELASTIC_RUN_ID",
        "SLURMD_NODENAME",
    ):
        if key not in extra:
            env.pop(key, None)
    return env


def _run_cmd(out, extra, dataroot):
    return [
        "-m",
        "milarun",
        "run",
        LIGHTNING,
        "-o",
        str(out),
        "-d",
        str(dataroot),
        "--experiment-name",
        "t.lightning",
        "--job-id",
        "0.all",
        "--extra",
        json.dumps(extra),
        "--",
        *ARGS,
    ]


def _check(res, world_size):
    validate(res)
    assert res["success"] is True, res["error"]
    assert res["host"]["lightning"]  # Lightning's version is recorded
    assert res["metrics"]["world_size"] == world_size
    assert res["metrics"]["backend"] == "gloo"
    assert res["metrics"]["global_batch"] == 4 * world_size
    train = res["timings"]["train"]
    # the callback stopped the Trainer at --max-count, counting the global batch
    assert 48 <= train["count"] < 48 + 4 * world_size and train["count"] % (4 * world_size) == 0
    assert len(steady_samples(res)) >= 2
    assert math.isfinite(res["metrics"]["loss"])
    assert res["distributed"]["world_size"] == world_size


@pytest.mark.slow
def test_lightning_whole_node_under_torchrun(imagenet_root, tmp_path):
    out = tmp_path / "r" / "r.json"
    extra = {"run": 0, "device": "all", "devices": [0, 1], "partition": "njobs"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        *_run_cmd(out, extra, imagenet_root),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr
    assert [p for p in out.parent.iterdir() if p.suffix == ".json"] == [out]  # rank 0 only
    _check(json.loads(out.read_text()), 2)


@pytest.mark.slow
def test_lightning_two_nodes_of_a_rendezvous_ignore_slurm_variables(imagenet_root, tmp_path):
    # As under `srun`: Slurm's variables describe the agents (one task per node), not
    # the ranks; Lightning must take the ranks from torchrun.
    out = tmp_path / "r" / "r.json"
    rdzv = {"backend": "c10d", "endpoint": f"127.0.0.1:{_free_port()}", "id": "t-lightning"}
    procs = []
    for i, node in enumerate(("nodeA", "nodeB")):
        extra = {
            "partition": "multi-node",
            "node": node,
            "nodes": ["nodeA", "nodeB"],
            "node_count": 2,
            "gpus_per_node": 1,
            "rendezvous": rdzv,
        }
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            rdzv["endpoint"],
            "--rdzv-id",
            rdzv["id"],
            *_run_cmd(out, extra, imagenet_root),
        ]
        env = _env(
            SLURM_NTASKS="2",
            SLURM_PROCID=str(i),
            SLURM_LOCALID="0",
            SLURM_NODEID=str(i),
            SLURM_JOB_NAME="milarun",
            SLURM_JOB_ID="77",
        )
        procs.append(
            subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    try:
        outputs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    res = json.loads(out.read_text())
    _check(res, 2)
    assert sorted(res["distributed"]["node_names"]) == ["nodeA", "nodeB"]


def test_lightning_is_told_it_runs_under_torchrun():
    from lightning.pytorch.plugins.environments import LightningEnvironment, TorchElasticEnvironment

    from milarun.models.lightning_convnet import cluster_environment

    assert isinstance(
        cluster_environment({"TORCHELASTIC_RUN_ID": "x", "SLURM_NTASKS": "2"}),
        TorchElasticEnvironment,
    )
    assert isinstance(cluster_environment({"LOCAL_WORLD_SIZE": "2"}), TorchElasticEnvironment)
    assert isinstance(cluster_environment({"SLURM_NTASKS": "2"}), LightningEnvironment)
