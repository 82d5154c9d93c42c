"""The soak mode's runtime, on CPU and without processes: the fault's draw, the profile's
``restarts`` and torchrun's ``--max-restarts``, the figures from the soak folder's ledger
(the split of the wall time, a restart that never trained), the data position of a resumed
run, and a restarted job that does not wait at the wave's barrier again. The whole soak, a
rank killed and torchrun's restart through ``milarun jobs``, runs in
tests/test_acceptance.py (the acceptance-cpu profile)."""

import contextlib
import json
from types import SimpleNamespace

import pytest
import torch
from conftest import SMOKE_ARGS, build_tiny, run_model
from torch.distributed.checkpoint.api import CheckpointException
from torch.utils.data import DataLoader, DistributedSampler

from milarun.bench import Epochs
from milarun.bench.distributed import World
from milarun.bench.sync import synchronize
from milarun.errors import ProfileError
from milarun.formats.barrier import BarrierTimeout
from milarun.host.devices import Devices
from milarun.models import soak as soak_module
from milarun.models.soak import FAULT, LATEST, LEDGER, Soak, fault_plan
from milarun.plan.launches import plan_job
from milarun.profile.job import Job
from milarun.profile.language import load_profile

LLM = "milarun.models.llm_pretrain:main"


# --- the fault's draw --------------------------------------------------------------------


def test_the_fault_is_drawn_from_the_seed_after_the_first_checkpoint_and_before_the_end():
    draws = {fault_plan(seed, 20, 4, 2) for seed in range(200)}
    assert {step for step, _ in draws} == set(range(5, 20))  # every step from 5 to 19
    assert {rank for _, rank in draws} == {0, 1}
    assert fault_plan(7, 20, 4, 2) == fault_plan(7, 20, 4, 2)  # the same seed, the same fault
    with pytest.raises(ValueError, match="needs at least 6"):
        fault_plan(0, 5, 4, 2)


# --- the profile's restarts, torchrun's --max-restarts -------------------------------------


def _profile(tmp_path, entry):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"soak": {"experiment": LLM, **entry}}))
    return path


def test_restarts_reach_torchrun_as_max_restarts(tmp_path):
    path = _profile(tmp_path, {"partition_scheme": {"type": "njobs"}, "restarts": 2})
    (job,) = load_profile(path)
    assert job.restarts == 2 and job.as_entry()["restarts"] == 2
    ((launch,),) = plan_job(job, Devices("gpu", [0, 1]), 0, "/o", "/d", python="/py")
    argv = launch.argv
    assert argv[argv.index("--max-restarts") + 1] == "2"
    # without restarts a standalone torchrun gets no --max-restarts (its own default, 0)
    ((launch,),) = plan_job(
        Job("s", "j", LLM, plan_type="njobs"), Devices("gpu", [0, 1]), 0, "/o", "/d", python="/py"
    )
    assert "--max-restarts" not in launch.argv


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"restarts": 1}, "restarts are torchrun's"),  # per-gpu: python, no torchrun
        ({"restarts": -1}, "must be 0 or more restarts"),
        ({"restarts": 101}, "at most 100 restarts"),
        ({"restarts": "1"}, "must be a whole number of restarts"),
    ],
)
def test_bad_restarts_are_one_error_naming_the_key(tmp_path, entry, message):
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(_profile(tmp_path, entry))
    assert "restarts" in str(info.value) and "p.json" in str(info.value)


def test_a_soak_without_torchrun_restarts_is_a_one_line_failure(tiny_dataroot, tmp_path):
    root = build_tiny(tiny_dataroot, "llm_corpus")
    argv = [*SMOKE_ARGS, "--device", "cpu", "--shape", "tiny", "--precision", "fp32"]
    argv += ["--seq-len", "32", "--batch-size", "4", "--workers", "0", "--max-count", "2048"]
    res = run_model(LLM, [*argv, "--soak-every", "2"], root, tmp_path)
    assert not res["success"] and res["error"]["type"] == "ValueError"
    assert "needs torchrun's restarts" in res["error"]["message"]
    assert not list(root.glob("milarun-soak-*"))  # nothing written


# --- the figures from the ledger ------------------------------------------------------------


def _world(restarts=1, max_restarts=1, run_id="r/1"):
    return World(restart_count=restarts, max_restarts=max_restarts, run_id=run_id)


def _folder(tmp_path, lines, fault=None):
    path = tmp_path / "milarun-soak-r_1"
    path.mkdir()
    (path / LEDGER).write_text("".join(json.dumps(e) + "\n" for e in lines))
    if fault is not None:
        (path / FAULT).write_text(json.dumps(fault))
    return path


def _started_at(soak, t, monkeypatch):
    """This attempt's first step at Unix time ``t`` (its ledger line says so)."""
    monkeypatch.setattr(soak_module, "time", SimpleNamespace(time=lambda: t))
    soak.started()
    monkeypatch.undo()


#: The first attempt: trained from t=100, saved at steps 4 and 8 (3 s of training and 1 s of
#: save each), killed after step 10 at t=110.5 (2.5 s after the last save ended).
FIRST = [
    {"kind": "start", "attempt": 0, "t_first": 100.0, "resumed_step": 0, "load_s": None},
    {"kind": "checkpoint", "attempt": 0, "step": 4, "trained_s": 3.0, "save_s": 1.0, "t_end": 104},
    {"kind": "checkpoint", "attempt": 0, "step": 8, "trained_s": 3.0, "save_s": 1.0, "t_end": 108},
]
FAULT_10 = {"rank": 1, "step": 10, "t": 110.5}


def test_the_figures_split_the_wall_time_into_its_parts(tmp_path, monkeypatch):
    path = _folder(tmp_path, FIRST, fault=FAULT_10)
    soak = Soak(SimpleNamespace(metrics={}), _world(), str(tmp_path), 4, 20, 1000, 0)
    assert soak.path == str(path) and soak.attempt == 1  # one attempt started before
    soak.start_step = 8
    _started_at(soak, 120.0, monkeypatch)  # the restarted attempt trained from t=120 ...
    m = soak.figures(130.0, ok=True)  # ... to the end at t=130, with no save
    assert m["soak_productive_s"] == pytest.approx(3 + 3 + 10)
    assert m["soak_checkpoint_s"] == 2.0 and m["soak_checkpoints"] == 2 and m["soak_save_s"] == 1
    assert m["soak_lost_s"] == pytest.approx(2.5) and m["soak_lost_steps"] == 2
    assert m["soak_restart_s"] == pytest.approx(9.5)
    assert m["soak_wall_s"] == 30.0 and m["soak_ettr"] == pytest.approx(16 / 30)
    assert m["soak_restarts"] == 1 and m["soak_every_steps"] == 4


def test_a_failure_that_was_not_injected_counts_from_its_attempts_last_event(tmp_path, monkeypatch):
    # the restarted attempt saved at step 12 (t=126) and died unplanned; the third trained on
    restarted = {"kind": "start", "attempt": 1, "t_first": 120.0, "resumed_step": 8, "load_s": 0.5}
    saved = {"kind": "checkpoint", "attempt": 1, "step": 12, "trained_s": 5.0, "save_s": 1.0}
    _folder(tmp_path, [*FIRST, restarted, {**saved, "t_end": 126.0}], fault=FAULT_10)
    soak = Soak(SimpleNamespace(metrics={}), _world(2, 2), str(tmp_path), 4, 20, 1, 0)
    assert soak.attempt == 2
    soak.start_step = 12
    _started_at(soak, 140.0, monkeypatch)
    m = soak.figures(150.0, ok=True)
    assert m["soak_productive_s"] == pytest.approx(3 + 3 + 5 + 10)
    # its failure time is unknown: no lost work after t=126, and 14 s of restart
    assert m["soak_lost_s"] == pytest.approx(2.5)
    assert m["soak_restart_s"] == pytest.approx(9.5 + 14)
    assert m["soak_restarts"] == 2 and m["soak_wall_s"] == 50.0


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, optimizer


def _train(model, optimizer, steps):
    for _ in range(steps):
        model(torch.ones(3, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def test_a_checkpoint_saved_by_one_attempt_is_what_the_next_one_resumes_from(tmp_path):
    # the first attempt (its folder made and named by the run id), 4 steps, a checkpoint
    exp = SimpleNamespace(metrics={}, rate=None)
    first = Soak(exp, _world(0), str(tmp_path), 4, 20, 1000, 0)
    assert first.attempt == 0 and first.path == str(tmp_path / "milarun-soak-r_1")
    model, optimizer = _model()
    first.started()
    _train(model, optimizer, 4)
    first.after_step(4, model, optimizer, contextlib.nullcontext)
    assert (tmp_path / "milarun-soak-r_1" / LATEST).read_text() == "step-4"
    # the next attempt: a fresh model and optimizer take the saved state, step included
    second = Soak(SimpleNamespace(metrics={}), _world(1), str(tmp_path), 4, 20, 1000, 0)
    fresh, fresh_optimizer = _model()
    _train(fresh, fresh_optimizer, 1)  # different from the saved state before the load
    assert second.attempt == 1 and second.resume(fresh, fresh_optimizer) == 4
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)
    saved = optimizer.state_dict()["state"][0]
    loaded = fresh_optimizer.state_dict()["state"][0]
    assert torch.equal(saved["exp_avg_sq"], loaded["exp_avg_sq"]) and loaded["step"] == 4
    # a shard gone: the load fails, and the last attempt's record keeps the figures so far
    for shard in (tmp_path / "milarun-soak-r_1" / "step-4").glob("*.distcp"):
        shard.unlink()
    third = Soak(second.exp, _world(1), str(tmp_path), 4, 20, 1000, 0)
    with pytest.raises(CheckpointException, match="ranks"):
        third.resume(*_model())
    third.finish(ok=False)
    m = third.exp.metrics
    assert m["soak_checkpoints"] == 1 and m["soak_restarts"] == 1
    assert not (tmp_path / "milarun-soak-r_1").exists()  # torchrun's last attempt: removed


def test_a_restart_with_no_complete_checkpoint_starts_over(tmp_path, monkeypatch):
    # the first attempt died at step 3, before its first checkpoint: nothing to load
    path = _folder(tmp_path, FIRST[:1], fault={"rank": 0, "step": 3, "t": 103.0})
    soak = Soak(SimpleNamespace(metrics={}), _world(), str(tmp_path), 4, 20, 1000, 0)
    assert soak.resume(*_model()) == 0 and soak.load_s is None
    _started_at(soak, 110.0, monkeypatch)
    m = soak.figures(130.0, ok=True)
    # the first attempt's 3 s are lost; 7 s from the fault to the new first step
    assert m["soak_productive_s"] == 20 and m["soak_lost_s"] == 3 and m["soak_restart_s"] == 7
    assert path.exists()  # the run's end removes it (finish), not the figures


def test_the_first_attempt_checks_the_folders_space_before_writing(tmp_path):
    from milarun.models.checkpoint import NoSpace

    with pytest.raises(NoSpace, match="nothing was written"):
        Soak(SimpleNamespace(metrics={}), _world(0), str(tmp_path), 4, 20, 10**15, 0)
    assert not list(tmp_path.iterdir())


# --- the data position, the wave's barrier ---------------------------------------------


def test_a_resumed_run_goes_on_with_the_batches_an_uninterrupted_one_would_have(tmp_path):
    data = list(range(10))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=2, sampler=sampler)  # 5 batches an epoch

    def batches(epochs, n):
        out = []
        while len(out) < n:
            out += [b.tolist() for b in epochs]
        return out[:n]

    whole = batches(Epochs(loader), 15)
    assert batches(Epochs(loader, skip=7), 8) == whole[7:]  # epoch 1, from its third batch
    assert batches(Epochs(loader, skip=5), 10) == whole[5:]


def test_a_restarted_job_does_not_wait_at_the_waves_barrier_again():
    # an address nothing listens on: a wait there would fail; a restart does not go there
    env = {
        "MILARUN_BARRIER": "127.0.0.1:9",
        "MILARUN_BARRIER_WAVE": "w",
        "MILARUN_BARRIER_TIMEOUT": "1",
        "MILARUN_BARRIER_SECRET": "s",
        "MILARUN_DEVICE": "all",
        "TORCHELASTIC_RESTART_COUNT": "1",
    }
    exp = SimpleNamespace(result={"timings": {}}, journal=None, origin=0.0)
    assert synchronize(exp, env) is None and "barrier" not in exp.result["timings"]
    with pytest.raises(BarrierTimeout):  # the first attempt waits there
        synchronize(exp, {**env, "TORCHELASTIC_RESTART_COUNT": "0"})
