"""scaling under torchrun: two CPU ranks (gloo), one result from rank 0."""

import json
import os
import subprocess
import sys

from conftest import ROOT, SMOKE_ARGS, steady_samples


def _torchrun(tmp_path, *args):
    out = tmp_path / "r.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env.pop("MASTER_ADDR", None)
    env.pop("MASTER_PORT", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", "-m", "milarun", "run", "milarun.models.scaling:main",
           "-o", str(out), "--experiment-name", "t.scaling", "--job-id", "0.0-1", "--",
           *SMOKE_ARGS, "--batch-size", "4", "--width", "4", "--blocks", "1",
           "--image-size", "8", "--classes", "10", "--device", "cpu", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
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
