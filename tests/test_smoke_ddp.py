"""Whole-node and multi-node DDP inside the child: ddp_convnet under torchrun, the
``distributed`` record (world, rendezvous, every node's host facts), the node fields
the launcher passes through ``--extra``, and a world of one without torchrun."""

import json
import math
import os
import socket
import subprocess
import sys

import pytest
from conftest import ROOT, SMOKE_ARGS, build_tiny, run_model, steady_samples

from milarun.bench.experiment import Experiment, _torchrun_rendezvous, host_facts
from milarun.errors import MilarunError, ResultFormatError
from milarun.formats.journal import Journal, read_journal
from milarun.formats.record import validate

# resnet18 on 32 px crops, 4 images per rank: a step is a few tens of ms on one core.
DDP_ARGS = [
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
]
SCALING_ARGS = [
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
]


@pytest.fixture(scope="module")
def imagenet_root(tiny_dataroot):
    return build_tiny(tiny_dataroot, "fake_imagenet")


def _env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", **extra)
    for key in (
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "SLURMD_NODENAME",
    ):
        if key not in extra:
            env.pop(key, None)
    return env


def _milarun_run(function, out, extra, argv, dataroot=None):
    cmd = [
        "-m",
        "milarun",
        "run",
        function,
        "-o",
        str(out),
        "--experiment-name",
        "t.ddp",
        "--job-id",
        "0.all",
        "--extra",
        json.dumps(extra),
    ]
    if dataroot is not None:
        cmd += ["-d", str(dataroot)]
    return [*cmd, "--", *argv]


def _check_ran(proc, out):
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr, proc.stderr[-3000:]
    assert [p for p in out.parent.iterdir() if p.suffix == ".json"] == [out]  # rank 0 only
    res = json.loads(out.read_text())
    validate(res)
    assert res["success"] is True, res["error"]
    return res


def test_ddp_convnet_whole_node_under_torchrun(imagenet_root, tmp_path):
    # An njobs launch on a CPU host: one torchrun over the node's two CPU slots.
    out = tmp_path / "r" / "r.json"
    extra = {
        "run": 0,
        "device": "all",
        "devices": [0, 1],
        "partition": "njobs",
        "node": "node1",
        "nodes": ["node1"],
        "node_count": 1,
        "gpus_per_node": 2,
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        *_milarun_run(
            "milarun.models.ddp_convnet:main",
            out,
            extra,
            [*DDP_ARGS, "--max-count", "48"],
            imagenet_root,
        ),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=240)
    res = _check_ran(proc, out)
    assert res["partition"] == "njobs"
    assert (res["node"], res["nodes"], res["node_count"], res["gpus_per_node"]) == (
        "node1",
        ["node1"],
        1,
        2,
    )
    # the whole job's rate: each step counts the global batch of 2 × 4 images
    assert res["metrics"]["world_size"] == 2 and res["metrics"]["global_batch"] == 8
    train = res["timings"]["train"]
    assert train["count"] >= 48 and train["count"] % 8 == 0
    assert len(steady_samples(res)) >= 2
    assert all(s["rate"] > 0 for s in steady_samples(res))
    assert math.isfinite(res["metrics"]["loss"])
    dist = res["distributed"]
    assert dist["world_size"] == 2 and dist["backend"] == "gloo"
    assert dist["node_names"] == ["node1"]  # the launcher's name for this node
    assert len(dist["hosts"]) == 1
    assert dist["hosts"][0]["hostname"] == socket.gethostname()
    assert dist["hosts"][0]["cpu_count"] == os.cpu_count()
    assert dist["rendezvous"]["backend"] == "c10d" and dist["rendezvous"]["id"]
    assert dist["master"].rsplit(":", 1)[1].isdigit()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_agents_gather_both_nodes(tmp_path):
    # multi-node on one host: two agents (nodes "nodeA", "nodeB") join one c10d
    # rendezvous; rank 0 records both nodes' host facts.
    out = tmp_path / "r" / "r.json"
    rdzv = {"backend": "c10d", "endpoint": f"127.0.0.1:{_free_port()}", "id": "t-two-nodes"}
    procs = []
    for node in ("nodeA", "nodeB"):
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
            *_milarun_run(
                "milarun.models.scaling:main", out, extra, [*SCALING_ARGS, "--max-count", "40"]
            ),
        ]
        procs.append(
            subprocess.Popen(
                cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    try:
        outputs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    res = json.loads(out.read_text())
    validate(res)
    assert res["success"] is True, res["error"]
    dist = res["distributed"]
    assert dist["world_size"] == 2
    assert dist["rendezvous"] == rdzv  # as the launcher gave it
    # either agent may win node rank 0; its own node comes first
    assert sorted(dist["node_names"]) == ["nodeA", "nodeB"]
    assert dist["node_names"][0] == res["node"]
    assert len(dist["hosts"]) == 2 and all(h["hostname"] for h in dist["hosts"])
    assert res["timings"]["train"]["count"] >= 40


def test_ddp_convnet_world_of_one_without_torchrun(imagenet_root, tmp_path, monkeypatch):
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    res = run_model(
        "milarun.models.ddp_convnet:main",
        [*DDP_ARGS, "--max-count", "16"],
        dataroot=imagenet_root,
        tmp_path=tmp_path,
    )
    assert res["_exit_code"] == 0 and res["success"] is True, res["error"]
    assert res["metrics"]["world_size"] == 1 and res["metrics"]["global_batch"] == 4
    assert len(steady_samples(res)) >= 2
    assert "distributed" not in res  # no torchrun job to describe


def test_ddp_convnet_says_when_the_dataset_gives_no_batch(imagenet_root, tmp_path):
    # tiny fake_imagenet has 256 training images
    res = run_model(
        "milarun.models.ddp_convnet:main",
        [*DDP_ARGS, "--batch-size", "512", "--max-count", "16"],
        dataroot=imagenet_root,
        tmp_path=tmp_path,
    )
    assert res["success"] is False
    assert "256 images give no batch of 512 per rank" in res["error"]["message"]


# --- the record fields, without a process group -------------------------------------


def test_node_fields_from_extra_are_recorded_only_when_given():
    exp = Experiment(
        "s.t",
        extra={"node": "n1", "nodes": ["n1", "n2"], "gpus_per_node": 4, "partition": "multi-node"},
    )
    rec = validate(exp.result)
    assert (rec["node"], rec["nodes"], rec["node_count"], rec["gpus_per_node"]) == (
        "n1",
        ["n1", "n2"],
        2,
        4,
    )
    assert rec["partition"] == "multi-node"
    bare = Experiment("s.t").result
    assert not {"node", "nodes", "node_count", "gpus_per_node", "distributed"} & set(bare)


@pytest.mark.parametrize(
    "extra,message",
    [
        ({"node": "a/b"}, "node: 'a/b' is not a valid name"),
        ({"nodes": "node1"}, "nodes: must be a list, not string"),
        ({"node_count": 0}, "node_count: must be >= 1, not 0"),
        ({"partition": "everywhere"}, "partition: 'everywhere' is not one of"),
    ],
)
def test_bad_node_fields_in_extra_fail_validation(extra, message):
    with pytest.raises(ResultFormatError, match=message):
        validate(Experiment("s.t", extra=extra).result)


@pytest.mark.parametrize(
    "rdzv,message",
    [
        ({"endpoint": "h:1"}, "--extra: rendezvous.backend: missing"),
        ({"backend": "c10d", "port": 1}, "--extra: rendezvous.port: unknown key"),
        ({"backend": "c10d", "endpoint": 29400}, "--extra: rendezvous.endpoint: must be"),
        ("c10d", "--extra: rendezvous: must be an object"),
    ],
)
def test_bad_rendezvous_in_extra_is_one_clear_error(rdzv, message):
    with pytest.raises(MilarunError) as exc:
        Experiment("s.t", extra={"rendezvous": rdzv})
    assert str(exc.value).startswith(message), str(exc.value)


def test_rendezvous_from_torchrun_environment():
    assert _torchrun_rendezvous(
        {"TORCHELASTIC_RUN_ID": "abc", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    ) == {"backend": "c10d", "endpoint": None, "id": "abc"}
    # torchrun's static rendezvous has the run id "none"; its endpoint is the master
    assert _torchrun_rendezvous(
        {"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
    ) == {"backend": "static", "endpoint": "h:29500", "id": None}


def test_gather_hosts_outside_torchrun_records_nothing(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    exp = Experiment("s.t")
    assert exp.gather_hosts() is None and "distributed" not in exp.result


def test_gather_hosts_in_a_world_of_one_with_torchrun_variables(monkeypatch, tmp_path):
    # torchrun --nproc-per-node 1 (an njobs launch on a one-GPU node): still a job to record
    import torch.distributed as dist

    env = {
        "WORLD_SIZE": "1",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "TORCHELASTIC_RUN_ID": "none",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SLURMD_NODENAME", "node7")
    exp = Experiment("s.t", out=str(tmp_path / "r.json"), extra={"node": "other"})
    exp.result["host"] = host_facts()
    exp._open_journal(0.0)
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        info = exp.gather_hosts()
    finally:
        dist.destroy_process_group()
    assert info == exp.result["distributed"]
    assert info["world_size"] == 1 and info["backend"] == "gloo"
    assert info["node_names"] == ["node7"]  # srun's name for the node wins
    assert info["rendezvous"] == {
        "backend": "static",
        "endpoint": f"127.0.0.1:{env['MASTER_PORT']}",
        "id": None,
    }
    assert info["hosts"][0]["hostname"] == socket.gethostname()
    validate(exp.result)
    # streamed, so a FAIL record of a job that dies later still has it
    exp.journal.close()
    assert read_journal(exp.journal.path)["distributed"] == info


def test_journal_reads_back_a_distributed_event(tmp_path):
    j = Journal(tmp_path / "j.jsonl")
    j.write("distributed", world_size=4, backend="nccl", node_names=["a", "b"])
    j.write("distributed", world_size="4")  # malformed: not taken
    j.close()
    got = read_journal(tmp_path / "j.jsonl")
    assert got["distributed"] == {"world_size": 4, "backend": "nccl", "node_names": ["a", "b"]}
    assert got["bad_lines"] == 1
