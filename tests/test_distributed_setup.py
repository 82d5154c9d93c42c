"""The DDP set-up inside the child, against fakes: threads per
rank on CUDA, the process group's timeout and ``device_id``, the follower ranks of the
stop decision, the GPU monitor only on each node's LOCAL_RANK 0."""

import datetime
import types

import pytest

from milarun.bench import distributed
from milarun.bench.distributed import group_timeout_s, rank_threads


class FakeExp:
    def __init__(self):
        self.result = {"host": {}}
        self.metrics = {}
        self.device = None

    def gather_hosts(self):
        return None

    def gather_monitors(self):
        return None


@pytest.fixture
def fake_dist(monkeypatch):
    """torch.distributed and torch.cuda.set_device faked: what init_process_group got."""
    import torch
    import torch.distributed as dist

    calls = {}
    monkeypatch.setattr(
        dist, "init_process_group", lambda backend, **kw: calls.update(backend=backend, **kw)
    )
    monkeypatch.setattr(dist, "destroy_process_group", lambda: None)
    monkeypatch.setattr(dist, "barrier", lambda: None)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.update(set_device=device))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    threads = torch.get_num_threads()
    yield calls
    torch.set_num_threads(threads)


def _torchrun_env(monkeypatch, local_rank=1, local_size=4, **extra):
    env = {
        "WORLD_SIZE": str(local_size),
        "RANK": str(local_rank),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "OMP_NUM_THREADS": "1",
        **extra,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("MILARUN_BARRIER", "MILARUN_BARRIER_TIMEOUT"):
        if k not in extra:
            monkeypatch.delenv(k, raising=False)


def test_cuda_ranks_share_the_node_cpus_like_cpu_ranks(monkeypatch, fake_dist):
    # Item 8: 4 CUDA ranks on an 8-core cpuset got 8 threads each (32 on 8 cores).
    import torch

    _torchrun_env(monkeypatch, local_rank=1, local_size=4)
    torch.set_num_threads(8)  # what init_torch set: the cpuset's size
    exp = FakeExp()
    with distributed.process_group(exp, torch.device("cuda")) as world:
        assert torch.get_num_threads() == 2
        assert world.device == torch.device("cuda", 1)
    assert exp.result["host"]["threads"] == 2
    assert exp.device == torch.device("cuda", 1)
    assert fake_dist["set_device"] == torch.device("cuda", 1)


def test_rank_threads():
    assert rank_threads(64, 8) == 8
    assert rank_threads(3, 8) == 1  # never 0
    assert rank_threads(12, 0) == 12  # a bad LOCAL_WORLD_SIZE divides by 1


def test_nccl_group_gets_device_id_and_a_timeout_past_the_barrier(monkeypatch, fake_dist):
    # Item 12: with --barrier-timeout 3600, NCCL's default 10 min would time out the
    # ranks waiting for rank 0 at the start barrier.
    import torch

    _torchrun_env(
        monkeypatch,
        local_rank=0,
        local_size=2,
        MILARUN_BARRIER="127.0.0.1:5000",
        MILARUN_BARRIER_TIMEOUT="3600",
    )
    with distributed.process_group(FakeExp(), torch.device("cuda")):
        pass
    assert fake_dist["backend"] == "nccl"
    assert fake_dist["device_id"] == torch.device("cuda", 0)
    assert fake_dist["timeout"] >= datetime.timedelta(seconds=3600)


def test_gloo_group_keeps_torch_default_timeout_and_no_device_id(monkeypatch, fake_dist):
    import torch

    _torchrun_env(
        monkeypatch,
        local_rank=0,
        local_size=2,
        MILARUN_BARRIER="127.0.0.1:5000",
        MILARUN_BARRIER_TIMEOUT="30",
    )
    with distributed.process_group(FakeExp(), torch.device("cpu")):
        pass
    assert fake_dist["backend"] == "gloo" and "device_id" not in fake_dist
    assert fake_dist["timeout"] == datetime.timedelta(minutes=30)


def test_group_timeout_s():
    assert group_timeout_s("nccl", {}) == 600.0
    assert group_timeout_s("gloo", {}) == 1800.0
    env = {"MILARUN_BARRIER": "127.0.0.1:5000", "MILARUN_BARRIER_TIMEOUT": "7200"}
    assert group_timeout_s("nccl", env) == 7200.0 + distributed.BARRIER_MARGIN_S
    env["MILARUN_BARRIER_TIMEOUT"] = "soon"  # malformed: torch's default
    assert group_timeout_s("nccl", env) == 600.0


def test_only_rank_0_times_its_windows():
    from milarun.bench.rate import CudaEventTimer, PerfCounterTimer, RateLogger

    for rank, follows in ((0, False), (1, True)):
        exp = FakeExp()
        exp.rate = RateLogger(timer=CudaEventTimer(None), min_steady=1.0)
        world = distributed.World(2, rank, rank, 2, "nccl", "cuda")
        distributed.agree_on_counts(exp, world)
        assert exp.rate.agree is not None
        assert isinstance(exp.rate.timer, PerfCounterTimer) is follows
        assert exp.rate.votes is not follows


@pytest.mark.parametrize("local_rank,started", [("1", False), ("0", True), (None, True)])
def test_only_local_rank_0_samples_the_nodes_gpus(monkeypatch, local_rank, started):
    # Item 12: every torchrun rank sampled all of the node's GPUs; only LOCAL_RANK 0 does
    # now (a per-GPU launch has no LOCAL_RANK: it samples its own GPU).
    from milarun.bench import experiment

    starts = []

    class Fake:
        def __init__(self, **kw):
            pass

        def start(self):
            starts.append(self)
            return self

    monkeypatch.setattr(experiment, "GPUMonitor", Fake)
    monkeypatch.setattr(experiment, "HostLoadMonitor", Fake)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    exp = experiment.Experiment("s.t")
    exp.options = {"no_instrument": False, "monitor_interval": 1.0}
    exp.start_monitor()
    assert bool(starts) is started


def test_several_mig_instances_in_one_whole_node_test_are_refused_with_one_line(
    monkeypatch, fake_dist
):
    # Item 12: CUDA shows a process one MIG instance; rank 1 would die on set_device.
    import torch

    from milarun.bench.setup import WrongDevice

    _torchrun_env(monkeypatch, local_rank=1, local_size=2, CUDA_VISIBLE_DEVICES="MIG-aaaa,MIG-bbbb")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(WrongDevice, match="2 MIG instances cannot work"):
        with distributed.process_group(FakeExp(), torch.device("cuda")):
            pass
    assert "set_device" not in fake_dist and "backend" not in fake_dist


def test_a_local_rank_past_the_gpus_torch_sees_is_a_wrong_device(monkeypatch):
    from milarun.bench.setup import WrongDevice

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(device_count=lambda: 2))
    monkeypatch.setattr(distributed, "torch", fake)
    distributed.check_local_device(1, {})
    with pytest.raises(WrongDevice, match="LOCAL_RANK 2 has no GPU: torch sees 2"):
        distributed.check_local_device(2, {"CUDA_VISIBLE_DEVICES": "0,1"})
