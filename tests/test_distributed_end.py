"""The one end of every distributed workload: ``bench.distributed.process_group``
meets the ranks at a barrier, destroys the group and frees it before the record is written.

A group that outlives ``destroy_process_group`` (FSDP2's device mesh kept by torch's DTensor
caches, a model a workload still holds) keeps gloo's threads until the interpreter's exit,
where a gloo thread releasing its last work aborts the rank (``terminate called without an
active exception``) after rank 0 wrote a successful record: a FAIL ``exit-after-result``.
"""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SMOKE_ARGS, build_tiny

LINUX_TASKS = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    for key in (
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "TORCHELASTIC_RUN_ID",
    ):
        env.pop(key, None)
    return env


# In a fresh interpreter, a world of one: an FSDP2 step inside process_group, then the
# threads of gloo and of the store left after the block; then a body that keeps its
# device mesh (emptied of its groups, which are freed); then one that keeps the group
# itself. One line per case: its name, how the block ended, the threads left.
_FSDP_CASES = """
import os
import torch
from milarun.bench.distributed import process_group

class Exp:
    def __init__(self):
        self.result, self.metrics, self.device = {"host": {}}, {}, None
    def gather_hosts(self):
        return None
    def gather_monitors(self):
        return None

kept = []

def fsdp_step(case):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (1,))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if case == "keep-mesh":
        kept.append(mesh)
    if case == "keep-group":
        kept.append(mesh.get_group())

def threads():
    names = [open(f"/proc/self/task/{t}/comm").read().strip()
             for t in os.listdir("/proc/self/task")]
    return [n for n in names if "gloo" in n or "tcpstore" in n]

for case in ("clean", "keep-mesh", "keep-group"):
    exp = Exp()
    with process_group(exp, torch.device("cpu")):
        fsdp_step(case)
    print(case, exp.metrics.get("process_groups_left", 0), *threads(), flush=True)
"""


@LINUX_TASKS
def test_fsdp_group_is_freed_when_the_block_ends_even_from_a_kept_mesh():
    proc = subprocess.run(
        [sys.executable, "-c", _FSDP_CASES],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    # torch's DTensor caches hold the mesh, which held the group (and its gloo threads)
    # past destroy_process_group until the interpreter's exit
    assert lines["clean"] == "0", proc.stdout
    # a mesh kept by the body (as torch 2.11 keeps one from C++) no longer holds its group
    assert lines["keep-mesh"] == "0", proc.stdout
    # a body that keeps the group itself: counted in the metrics and said in one line
    assert lines["keep-group"].startswith("1"), proc.stdout
    assert proc.stderr.count("milarun: warning: 1 process group(s) still referenced") == 1


def test_the_record_is_written_after_the_barrier_and_the_destroyed_group(monkeypatch):
    import torch
    import torch.distributed as dist

    from milarun.bench.distributed import process_group
    from milarun.bench.experiment import Experiment

    events = []
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: events.append("init"))
    monkeypatch.setattr(dist, "barrier", lambda *a, **kw: events.append("barrier"))
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a: events.append("destroy"))
    for key in ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    threads = torch.get_num_threads()

    def run(fail):
        def workload(exp, argv):
            with process_group(exp, torch.device("cpu")):
                events.append("body")
                if fail:
                    raise ValueError("the body failed")

        exp = Experiment("t.end", job_id="0.0")
        monkeypatch.setattr(exp, "write", lambda: events.append("write"))
        events.clear()
        exp.execute("t:workload", workload, [])
        return list(events)

    try:
        assert run(False) == ["init", "body", "barrier", "destroy", "write"]
        # after an error no barrier (the other ranks may never reach it), still destroyed
        assert run(True) == ["init", "body", "destroy", "write"]
    finally:
        torch.set_num_threads(threads)


def test_no_workload_makes_or_destroys_a_process_group_of_its_own():
    """Every group is bench.distributed.process_group's, so every distributed test ends the
    same way (barrier, destroy, freed) before its record is written."""
    allowed = {Path("milarun/bench/distributed.py")}
    found = []
    for path in sorted((ROOT / "milarun").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(rel))):
            name = (
                node.func.attr
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                else None
            )
            if name in ("init_process_group", "destroy_process_group"):
                found.append(f"{rel}:{node.lineno} {name}")
    assert found == []


# Under torchrun: a rank runs a record through milarun's child entry point, then prints
# the threads of gloo and of the store still alive once the test returned.
_RANK_THEN_THREADS = """
import os, sys
from milarun.cli.run import run_experiment
code = run_experiment(sys.argv[1], sys.argv[4:], out=sys.argv[2], dataroot=sys.argv[3])
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print("rank", os.environ["RANK"], code, *[n for n in names if "gloo" in n or "tcpstore" in n])
"""


#: Two-rank workloads whose process group must be gone when the record is written: FSDP2
#: (device meshes cached by torch) and DDP with its model bound in the coleo function.
_TWO_RANK = {
    "llm_pretrain": (
        "llm_corpus",
        ["--shape", "tiny", "--precision", "fp32", "--seq-len", "16", "--batch-size", "2"]
        + ["--max-count", "1024"],
        "fsdp",
    ),
    "ddp_convnet": (
        "fake_imagenet",
        ["--arch", "resnet18", "--batch-size", "4", "--image-size", "32", "--max-count", "48"],
        "ddp",
    ),
}


@pytest.mark.slow
@LINUX_TASKS
@pytest.mark.parametrize("workload", sorted(_TWO_RANK))
def test_a_two_rank_workload_leaves_no_group_on_either_rank(workload, tiny_dataroot, tmp_path):
    dataset, args, parallelism = _TWO_RANK[workload]
    root = build_tiny(tiny_dataroot, dataset)
    script = tmp_path / "rank.py"
    script.write_text(_RANK_THEN_THREADS)
    out = tmp_path / "r.json"
    argv = [*SMOKE_ARGS, "--device", "cpu", "--workers", "0", *args]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(script),
        f"milarun.models.{workload}:main",
        str(out),
        str(root),
        *argv,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr
    assert "still referenced" not in proc.stderr, proc.stderr[-3000:]
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank "))
    assert lines == ["rank 0 0", "rank 1 0"], proc.stdout + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["success"], res["error"]
    if parallelism == "fsdp":
        assert res["metrics"]["parallelism"] == "fsdp"
    assert "process_groups_left" not in res["metrics"]
