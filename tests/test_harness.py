"""The harness of milarun.bench: workers per rank, the device helper, gradient sync under
accumulation, the warm-up + cosine schedule and the loss declaration. Small and fast."""

import contextlib
import math
import types
from pathlib import Path

import pytest
import torch
from conftest import run_model

from milarun.bench import device as devices
from milarun.bench import setup
from milarun.bench.distributed import World
from milarun.bench.experiment import LOSS_MUST_FALL, NO_LOSS, loss_declaration
from milarun.bench.step import gradient_sync, warmup_cosine, warmup_cosine_factor

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def eight_cores(monkeypatch):
    monkeypatch.setattr(setup, "current_cpuset", lambda: set(range(8)))


def test_workers_minus_one_is_the_rank_share_of_the_cpuset(eight_cores):
    one = {}
    assert setup.dataloader_workers(-1, environ=one) == 7  # one process: cpuset - 1
    rank = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "RANK": "3", "LOCAL_RANK": "1"}
    assert setup.dataloader_workers(-1, environ=rank) == 3  # 8 // 2 - 1
    assert setup.dataloader_workers(-1, environ={"WORLD_SIZE": "4"}) == 1  # 8 // 4 - 1
    assert setup.dataloader_workers(-1, local_size=16) == 0  # never negative
    assert setup.dataloader_workers(5, environ=rank) == 5  # given: as is


def test_rank_loader_gives_each_rank_its_share_of_the_workers(eight_cores):
    data = torch.utils.data.TensorDataset(torch.arange(40))
    world = World(size=4, rank=1, local_rank=1, local_size=4)
    loader = setup.rank_loader(data, 2, -1, torch.device("cpu"), world, 0, "items")
    assert loader.num_workers == 1  # 8 // 4 - 1, not 7
    assert len(loader) == 5  # 40 items over 4 ranks, batches of 2


def test_every_workload_leaves_workers_to_the_harness():
    """No workload resolves --workers -1 itself (it would give a rank the whole cpuset)."""
    for path in sorted((ROOT / "milarun" / "models").glob("*.py")):
        text = path.read_text()
        assert "current_cpuset()) //" not in text, path.name
        assert "if workers < 0 else workers" not in text, path.name


def test_device_helper_kinds():
    assert devices.kind(None) is None and devices.kind("cuda") == "cuda"
    assert devices.is_cuda(torch.device("cuda", 1)) and not devices.is_cuda(None)
    assert devices.is_xpu(torch.device("xpu")) and not devices.is_accelerator("cpu")
    assert devices.module(torch.device("cpu")) is None
    assert devices.sync_function(torch.device("cpu")) is None
    devices.synchronize(torch.device("cpu"))  # nothing queued: returns at once
    assert devices.name(torch.device("cpu")) is None
    assert devices.peak_memory_mib(None) > 0  # the process's peak RSS


class FakeDDP:
    """Counts ``no_sync()`` entries, as ``DistributedDataParallel.no_sync`` is entered."""

    def __init__(self):
        self.skipped = []
        self.micro = None

    @contextlib.contextmanager
    def no_sync(self):
        self.skipped.append(self.micro)
        yield


def test_ddp_all_reduces_on_the_last_micro_batch_only():
    net = FakeDDP()
    for micro in range(8):
        net.micro = micro
        with gradient_sync(net, micro, 4):
            pass
    assert net.skipped == [0, 1, 2, 4, 5, 6]  # micro-batches 3 and 7 all-reduce
    net.skipped.clear()
    for micro in range(3):
        with gradient_sync(net, micro, 1):  # no accumulation: every step all-reduces
            pass
    assert net.skipped == []
    model = torch.nn.Linear(2, 2)  # not wrapped (one process, FSDP): nothing to skip
    with gradient_sync(model, 0, 4):
        pass


def test_warmup_cosine_shape():
    warmup, total = 10, 100
    f = [warmup_cosine_factor(s, warmup, total) for s in range(120)]
    assert f[0] == pytest.approx(0.1) and f[warmup - 1] == pytest.approx(1.0)
    assert all(b > a for a, b in zip(f[:warmup], f[1:warmup]))  # linear warm-up
    assert f[warmup] == pytest.approx(1.0)  # the peak
    assert all(b <= a for a, b in zip(f[warmup:total], f[warmup + 1 : total + 1]))
    middle = warmup + (total - warmup) // 2
    assert f[middle] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f[total] == pytest.approx(0.1) and f[119] == pytest.approx(0.1)  # then flat


def test_warmup_cosine_drives_the_optimizer_learning_rate():
    params = [torch.nn.Parameter(torch.zeros(1))]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    schedule = warmup_cosine(optimizer, 50)  # warm-up: 5 steps
    lrs = []
    for _ in range(60):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert lrs[0] == pytest.approx(2e-4) and lrs[4] == pytest.approx(1e-3)
    assert max(lrs) == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-4)


def test_llm_pretrain_schedule_spans_the_count():
    from milarun.models.llm_pretrain import optimizer_steps

    assert optimizer_steps(1000, 64) == 16  # ceil(1000 / 64)
    assert optimizer_steps(64, 64) == 1 and optimizer_steps(0, 64) == 1


def test_loss_declaration():
    from milarun.models import llm_pretrain, loader, vit

    assert loss_declaration(loader) == (NO_LOSS, loader.NO_LOSS)
    assert loss_declaration(vit)[0] == LOSS_MUST_FALL
    assert loss_declaration(llm_pretrain)[0] == LOSS_MUST_FALL
    assert loss_declaration(types.ModuleType("plain")) == (None, None)
    assert loss_declaration(None) == (None, None)
    both = types.ModuleType("both")
    both.NO_LOSS, both.LOSS_MUST_FALL = "a", "b"
    with pytest.raises(TypeError, match="both"):
        loss_declaration(both)
    empty = types.ModuleType("empty")
    empty.LOSS_MUST_FALL = ""
    with pytest.raises(TypeError, match="non-empty"):
        loss_declaration(empty)


def test_workloads_declare_a_falling_loss_in_one_place():
    """``metrics.learning_check`` is the harness's to write, from ``LOSS_MUST_FALL``."""
    for path in sorted((ROOT / "milarun" / "models").glob("*.py")):
        assert "learning_check" not in path.read_text(), path.name


def test_real_ddp_skips_the_all_reduce_until_the_last_micro_batch():
    """``gradient_sync`` enters ``DistributedDataParallel.no_sync`` (a world of one, gloo)."""
    import torch.distributed as dist

    from milarun.host.net import free_port

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port('127.0.0.1')}", rank=0, world_size=1
    )
    try:
        net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
        seen = []
        for micro in range(4):
            with gradient_sync(net, micro, 2):
                seen.append(net.require_backward_grad_sync)
                net(torch.ones(1, 2)).sum().backward()
        assert seen == [False, True, False, True]
    finally:
        dist.destroy_process_group()


def test_no_instrument_records_one_sample_over_the_whole_run(tmp_path):
    res = run_model(
        "milarun.models.toy_reg:main",
        ["--device", "cpu", "--no-instrument", "--max-count", "640", "--batch-size", "64"],
        tmp_path=tmp_path,
    )
    assert res["success"], res["error"]
    (sample,) = res["timings"]["train"]["samples"]
    assert sample["count"] == 640 and not sample["warmup"]
    assert sample["rate"] == pytest.approx(640 / (sample["end"] - sample["start"]))
    assert res["timings"]["train"]["count"] == 640
