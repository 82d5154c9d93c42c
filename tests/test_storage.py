"""The storage acceptance tests (docs/acceptance.md), on the CPU and the local disk.

``checkpoint``: the DCP round trip in one process and over 2 gloo ranks under torchrun
(every shard written, read back and its hashes equal, the figures recomputed from the
record), a shard corrupted between the save and the load (a module-level hook) as a FAIL
``checkpoint-mismatch`` naming the shard file, a full disk (the free-space reader
patched) as a FAIL ``no-space`` before anything is written, a disk that fills during the
save, a folder that is missing or not shared as one error; ``smallfiles``: its own folder
over 1 and 2 ranks, the ``fake_imagenet`` dataset read in place, the space check; after
each, success or failure, nothing is left under the folder. Nothing ran on a GPU or on a
parallel filesystem.
"""

import errno
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, run_model, steady_samples

from milarun.datasets import prepare
from milarun.formats.record import validate
from milarun.models import checkpoint, smallfiles

FAST = ["--device", "cpu", "--sample-duration", "0.001"]
CKPT = "milarun.models.checkpoint:main"
SMALL = "milarun.models.smallfiles:main"


def _valid(res):
    validate({k: v for k, v in res.items() if k != "_exit_code"})
    return res


def _left(folder):
    """Every path left under ``folder``."""
    return [os.path.join(d, n) for d, dirs, files in os.walk(folder) for n in dirs + files]


def _torchrun(function, out, argv, ranks):
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    extra = {"run": 0, "device": "all", "devices": list(range(ranks)), "partition": "njobs"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    cmd += [str(ranks), "-m", "milarun", "run", function, "-o", str(out)]
    cmd += ["--experiment-name", "t.storage", "--job-id", "0.all", "--extra", json.dumps(extra)]
    proc = subprocess.run(
        [*cmd, "--", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    validate(res)
    assert res["success"], res["error"]
    return res


# --- checkpoint --------------------------------------------------------------------------


def test_the_state_is_deterministic_per_rank_and_sized_by_shape():
    a = checkpoint.build_state(3 * 2**10, rank=1, seed=0)
    b = checkpoint.build_state(3 * 2**10, rank=1, seed=0)
    c = checkpoint.build_state(3 * 2**10, rank=0, seed=0)
    digests = {n: checkpoint.tensor_digest(t) for n, t in a.items()}
    assert digests == {n: checkpoint.tensor_digest(t) for n, t in b.items()}
    assert set(digests) == {
        "rank1.model.0",
        "rank1.optim.0.master",
        "rank1.optim.0.exp_avg",
        "rank1.optim.0.exp_avg_sq",
    }
    assert set(digests.values()).isdisjoint(checkpoint.tensor_digest(t) for t in c.values())
    # 14 bytes a parameter: bf16 weights, fp32 master weights and two Adam moments
    assert sum(t.numel() * t.element_size() for t in a.values()) == 14 * 3 * 2**10
    # the 70B-class shape: 987.8 GB in all, 15.4 GB a rank over 64 GPUs
    per_rank = checkpoint.state_params("70b", 0, 64) * checkpoint.BYTES_PER_PARAM
    assert per_rank == pytest.approx(70_553_706_496 * 14 / 64, rel=1e-9)
    assert round(per_rank / 1e9, 1) == 15.4
    assert checkpoint.state_params("tiny", 2, 8) == 2 * 2**20 // 14


def _check_figures(m, ranks):
    assert m["world_size"] == ranks and m["backend"] == "gloo"
    assert m["bytes_per_rank"] >= m["state_bytes_per_rank"]  # DCP's headers on top
    assert m["checkpoint_bytes"] >= ranks * m["state_bytes_per_rank"]
    for kind, key in (("write", "save_s"), ("read", "load_s")):
        assert m[key] > 0
        if m["repeat"] == 1:  # else medians of the rounds' figures, each recomputed so
            by_hand = m["checkpoint_bytes"] / m[key] / 1e9
            assert m[f"{kind}_gbps_aggregate"] == pytest.approx(by_hand)
        assert m[f"{kind}_gbps_rank_min"] <= m[f"{kind}_gbps_per_rank"]
        assert m[f"{kind}_gbps_node_min"] <= m[f"{kind}_gbps_per_node"]
    assert m["page_cache_method"] in ("fadvise", "drop_caches", "none")
    assert 0.0 <= m["page_cache_resident_fraction"] <= 1.0
    assert m["cleaned_up"] is True


def test_checkpoint_round_trip_in_one_process(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "someone_elses.txt").write_text("untouched")
    res = run_model(CKPT, FAST + ["--state-mib", "8", "--folder", str(folder)], tmp_path=tmp_path)
    assert res["success"], res["error"]
    _valid(res)
    m = res["metrics"]
    _check_figures(m, 1)
    assert m["shape"] == "custom" and m["state_bytes_per_rank"] == 8 * 2**20 // 14 * 14
    # one sample per save and per load, each of every byte of the checkpoint
    assert [s["count"] for s in steady_samples(res)] == [m["checkpoint_bytes"]] * 2
    assert _left(folder) == [str(folder / "someone_elses.txt")]
    assert (folder / "someone_elses.txt").read_text() == "untouched"


def test_checkpoint_round_trip_over_two_gloo_ranks(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    argv = FAST + ["--shape", "tiny", "--folder", str(folder), "--repeat", "2"]
    res = _torchrun(CKPT, tmp_path / "r.json", argv, 2)
    m = res["metrics"]
    # the tiny shape (2**20 parameters) divided over the two ranks, at 14 bytes each
    assert m["params"] == 2**20 and m["state_bytes_per_rank"] == 2**19 * 14
    assert m["repeat"] == 2 and m["nodes"] == 1
    assert len(res["timings"]["train"]["samples"]) == 4  # 2 rounds of a save and a load
    _check_figures(m, 2)
    assert _left(folder) == []


def test_a_corrupted_shard_is_a_checkpoint_mismatch_naming_it(tmp_path, monkeypatch):
    folder = tmp_path / "shared"
    folder.mkdir()
    corrupted = []

    def corrupt(ckpt, rank):
        path = os.path.join(ckpt, "__0_0.distcp")
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)  # inside the first tensor's bytes
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        corrupted.append(path)

    monkeypatch.setattr(checkpoint, "_hook_saved", corrupt)
    res = run_model(CKPT, FAST + ["--state-mib", "4", "--folder", str(folder)], tmp_path=tmp_path)
    assert corrupted and res["success"] is False
    assert res["error"]["reason"] == "checkpoint-mismatch"
    assert "__0_0.distcp" in res["error"]["message"]
    assert "shard file(s) changed since the save: __0_0.distcp" in res["error"]["message"]
    assert res["metrics"]["write_gbps_aggregate"] > 0  # the figures measured so far
    assert res["metrics"]["cleaned_up"] is True
    _valid(res)
    assert _left(folder) == []


def test_a_full_disk_is_no_space_before_anything_is_written(tmp_path, monkeypatch):
    folder = tmp_path / "shared"
    folder.mkdir()
    monkeypatch.setattr(checkpoint, "free_bytes", lambda path: 10 * 2**20)
    res = run_model(CKPT, FAST + ["--state-mib", "4", "--folder", str(folder)], tmp_path=tmp_path)
    assert res["success"] is False and res["error"]["reason"] == "no-space"
    assert "10485760 B free" in res["error"]["message"]
    assert res["metrics"]["space_needed_bytes"] > 10 * 2**20
    _valid(res)
    assert _left(folder) == []
    # the same check for the small files, through the same reader: 100 files of 110 KB
    # take 28 blocks of 4 KiB each, and one for the inode
    assert smallfiles.space_needed(100, 110_000, 100) == 100 * 28 * 4096 + 101 * 4096 + 2**26
    res = run_model(SMALL, FAST + ["--files", "100", "--folder", str(folder)], tmp_path=tmp_path)
    assert res["success"] is False and res["error"]["reason"] == "no-space"
    assert _left(folder) == []


def test_a_disk_that_fills_during_the_save_keeps_the_first_rounds_figures(tmp_path, monkeypatch):
    folder = tmp_path / "shared"
    folder.mkdir()
    save = checkpoint.dcp.save
    calls = []

    def filling(state, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(state, **kw)

    monkeypatch.setattr(checkpoint.dcp, "save", filling)
    argv = FAST + ["--state-mib", "2", "--folder", str(folder), "--repeat", "3"]
    res = run_model(CKPT, argv, tmp_path=tmp_path)
    assert res["success"] is False and res["error"]["reason"] == "no-space"
    assert "ran out of space during the test" in res["error"]["message"]
    assert res["metrics"]["read_gbps_aggregate"] > 0  # round 1's
    _valid(res)
    assert _left(folder) == []


def test_a_folder_not_shared_is_one_error(tmp_path, monkeypatch):
    folder = tmp_path / "shared"
    folder.mkdir()
    monkeypatch.setattr(checkpoint, "_read_marker", lambda path: None)
    res = run_model(CKPT, FAST + ["--state-mib", "1", "--folder", str(folder)], tmp_path=tmp_path)
    assert res["success"] is False and res["error"]["reason"] == "error"
    assert res["error"]["type"] == "StorageError"
    assert "is not shared" in res["error"]["message"]
    assert _left(folder) == []


def test_a_folder_not_writable_is_one_error(tmp_path, monkeypatch):
    # the tests run as root, whom permissions do not stop: the refusal is played by mkdir
    def refuse(path, mode=0o777):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    folder = tmp_path / "shared"
    folder.mkdir()
    monkeypatch.setattr(checkpoint.os, "mkdir", refuse)
    res = run_model(CKPT, FAST + ["--state-mib", "1", "--folder", str(folder)], tmp_path=tmp_path)
    assert res["success"] is False and res["error"]["reason"] == "error"
    assert "cannot write in it (Permission denied)" in res["error"]["message"]
    assert _left(folder) == []


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--shape", "13b"], "--shape must be one of tiny, 1b, 8b, 70b"),
        (["--state-mib", "-1"], "--state-mib must be between 0"),
        (["--repeat", "0"], "--repeat must be between 1"),
        (["--folder", "/nonexistent/milarun"], "no such folder"),
        (["--folder", "FILE"], "not a folder"),
    ],
)
def test_checkpoint_bad_inputs_are_one_error(tmp_path, argv, message):
    (tmp_path / "file").write_text("")
    argv = [str(tmp_path / "file") if a == "FILE" else a for a in argv]
    res = run_model(CKPT, FAST + argv, dataroot=tmp_path, tmp_path=tmp_path)
    assert res["success"] is False and res["error"]["reason"] == "error"
    assert message in res["error"]["message"]
    assert "save_s" not in res["metrics"]
    assert sorted(os.listdir(tmp_path)) == ["file", "result.json"]


# --- smallfiles ----------------------------------------------------------------------------


def _check_small(m, files, ranks):
    assert m["world_size"] == ranks and m["files"] == files
    if m["repeat"] == 1:  # else medians of the rounds' figures
        assert m["read_files_per_s_aggregate"] == pytest.approx(files / m["read_s"])
        assert m["read_mbps_aggregate"] == pytest.approx(m["bytes"] / 1e6 / m["read_s"])
        assert m["list_files_per_s_aggregate"] == pytest.approx(files * ranks / m["list_s"])
    assert m["read_files_per_s_rank_min"] <= m["read_files_per_s_per_rank"]
    assert m["page_cache_method"] in ("fadvise", "drop_caches", "none")


def test_smallfiles_creates_lists_and_reads_its_own_folder(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    argv = ["--files", "300", "--file-size", "3000", "--classes", "7", "--repeat", "2"]
    res = run_model(SMALL, FAST + argv + ["--folder", str(folder)], tmp_path=tmp_path)
    assert res["success"], res["error"]
    _valid(res)
    m = res["metrics"]
    _check_small(m, 300, 1)
    assert m["bytes"] == 300 * 3000 and m["mean_file_bytes"] == 3000
    assert m["create_files_per_s"] == pytest.approx(300 / m["create_s"])
    assert [s["count"] for s in steady_samples(res)] == [300] * 5  # create, 2 x (list, read)
    assert m["cleaned_up"] is True and _left(folder) == []


def test_smallfiles_over_two_gloo_ranks(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    argv = FAST + ["--files", "200", "--file-size", "1000", "--folder", str(folder)]
    res = _torchrun(SMALL, tmp_path / "r.json", argv, 2)
    _check_small(res["metrics"], 200, 2)
    assert res["metrics"]["bytes"] == 200 * 1000
    assert _left(folder) == []


def test_smallfiles_reads_fake_imagenet_in_place_and_writes_nothing(tmp_path):
    data = tmp_path / "data"
    prepare("fake_imagenet", str(data), log=lambda *a: None)
    before = sorted(_left(data))
    res = run_model(
        SMALL, FAST + ["--dataset", "fake_imagenet/train"], dataroot=data, tmp_path=tmp_path
    )
    assert res["success"], res["error"]
    _valid(res)
    _check_small(res["metrics"], 256, 1)  # the tiny build's training images
    assert res["metrics"]["space_needed_bytes"] == 0 and "create_s" not in res["metrics"]
    assert sorted(_left(data)) == before


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--files", "0"], "--files must be between 1"),
        (["--file-size", str(2**30)], "--file-size must be between 1"),
        (["--dataset", "nothing/here"], "no such folder"),
    ],
)
def test_smallfiles_bad_inputs_are_one_error(tmp_path, argv, message):
    res = run_model(SMALL, FAST + argv, dataroot=tmp_path, tmp_path=tmp_path)
    assert res["success"] is False and res["error"]["reason"] == "error"
    assert message in res["error"]["message"]
    assert os.listdir(tmp_path) == ["result.json"]


def test_smallfiles_disk_full_while_creating_is_no_space_and_cleaned(tmp_path, monkeypatch):
    folder = tmp_path / "shared"
    folder.mkdir()

    def full(root, indices, classes, block, size):
        raise OSError(errno.ENOSPC, "No space left on device", str(root))

    monkeypatch.setattr(smallfiles, "_write_files", full)
    res = run_model(SMALL, FAST + ["--files", "10", "--folder", str(folder)], tmp_path=tmp_path)
    assert res["success"] is False and res["error"]["reason"] == "no-space"
    assert "No space left on device" in res["error"]["message"]
    _valid(res)
    assert _left(folder) == []


def test_drop_caches_refused_falls_back_to_fadvise(tmp_path, monkeypatch):
    # never the real /proc/sys/vm/drop_caches: it would empty the whole host's page cache
    monkeypatch.setattr(checkpoint, "drop_node_caches", lambda level: False)
    folder = tmp_path / "shared"
    folder.mkdir()
    argv = FAST + ["--state-mib", "1", "--folder", str(folder), "--drop-caches"]
    res = run_model(CKPT, argv, tmp_path=tmp_path)
    assert res["success"], res["error"]
    m = res["metrics"]
    assert m["drop_caches_refused"] is True and m["page_cache_method"] == "fadvise"
    assert m["page_cache_dropped"] == (m["page_cache_resident_fraction"] < 0.01)


def test_spread_by_hand():
    """Rank rates, and node rates as a node's amount over its slowest rank's time."""
    spread = checkpoint.spread
    ranks = [
        {"node": "a", "n": 100, "s": 1.0},
        {"node": "a", "n": 100, "s": 4.0},  # node a is done at 4 s: 200 / 4 = 50
        {"node": "b", "n": 300, "s": 2.0},  # node b: 150
    ]
    assert spread(ranks, "n", "s") == {
        "per_rank": (100 + 25 + 150) / 3,
        "rank_min": 25,
        "per_node": (50 + 150) / 2,
        "node_min": 50,
    }
    # a time of 0 has no rate: its level is left out, not reported as infinite
    ranks[2]["s"] = 0.0
    assert spread(ranks, "n", "s") == {}
    ranks[0]["s"] = ranks[1]["s"] = 0.0
    ranks[2]["s"] = 2.0
    assert spread(ranks, "n", "s") == {}
