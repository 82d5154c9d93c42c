"""The small shared helpers: each concept written once."""

import socket

import pytest

from milarun.formats import entrypoint
from milarun.host import accel
from milarun.host.kernel import read_text
from milarun.host.net import free_port


def test_free_port_can_be_bound():
    port = free_port("127.0.0.1")
    assert 1 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_free_port_default_when_none_can_be_had():
    # an address this host does not have: binding fails
    assert free_port("192.0.2.1", default=29400) == 29400
    with pytest.raises(OSError):
        free_port("192.0.2.1")


def test_gpu_backends_follow_the_one_discovery_order():
    assert accel.GPU_BACKENDS == ("nvidia", "amd", "intel")
    order = list(accel.BACKENDS)
    assert [order.index(n) for n in accel.GPU_BACKENDS] == sorted(
        order.index(n) for n in accel.GPU_BACKENDS
    )


@pytest.mark.parametrize(
    "spec, message",
    [
        (5, "must be a string 'module:function'"),
        ("milarun.models.toy_reg", "'milarun.models.toy_reg' must look like 'module:function'"),
        (":main", "':main' must look like 'module:function'"),
        ("a.b:c.d", "'a.b:c.d' must look like 'module:function'"),
    ],
)
def test_entrypoint_parse_refuses(spec, message):
    with pytest.raises(ValueError) as exc:
        entrypoint.parse(spec)
    assert str(exc.value) == message


def test_entrypoint_parse_and_load():
    assert entrypoint.parse("milarun.models.toy_reg:main") == ("milarun.models.toy_reg", "main")
    assert entrypoint.load("os.path:join") is __import__("os").path.join
    assert entrypoint.load("os.path:no_such_name") is None


def test_world_from_the_torchrun_environment():
    from milarun.bench.distributed import World  # the child's side: bench

    alone = World.from_environment({})
    assert (alone.size, alone.rank, alone.local_rank, alone.local_size) == (1, 0, 0, 1)
    assert not alone.torchrun and alone.master_addr is None and alone.backend is None
    world = World.from_environment(
        {
            "WORLD_SIZE": "8",
            "RANK": "5",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "4",
            "GROUP_RANK": "1",
            "MASTER_ADDR": "node0",
            "MASTER_PORT": "29400",
            "TORCHELASTIC_RUN_ID": "abc",
        }
    )
    assert (world.size, world.rank, world.local_rank, world.local_size, world.node_rank) == (
        8,
        5,
        1,
        4,
        1,
    )
    assert (world.master_addr, world.master_port, world.run_id) == ("node0", "29400", "abc")
    assert world.torchrun
    # LOCAL_WORLD_SIZE defaults to the world; an empty variable to its default
    assert World.from_environment({"WORLD_SIZE": "2", "RANK": ""}).local_size == 2
    assert World.from_environment({"LOCAL_RANK": "0"}).torchrun
    with pytest.raises(ValueError):
        World.from_environment({"RANK": "x"})


def test_read_text_of_kernel_files(tmp_path):
    (tmp_path / "cpulist").write_text("0-3\n")
    (tmp_path / "bad").write_bytes(b"\xff\xfe")
    assert read_text(tmp_path / "cpulist") == "0-3"
    assert read_text(tmp_path / "missing") is None
    assert read_text(tmp_path / "bad") is None  # not UTF-8
    assert read_text(tmp_path) is None  # a folder: unreadable


def _group_of(script):
    import subprocess

    return subprocess.Popen(
        ["sh", "-c", script],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_terminate_group_kills_a_group_that_ignores_sigterm_after_the_grace():
    import time

    from milarun.host import supervise

    # the shell and its background child both ignore SIGTERM
    proc = _group_of("trap '' TERM; sleep 100 & trap '' TERM; wait")
    time.sleep(0.3)
    group = supervise.ProcessGroup(proc, until="members")
    t0 = time.monotonic()
    assert supervise.terminate_group(group, grace_s=0.5) == []
    took = time.monotonic() - t0
    assert 0.5 <= took < 5, took
    assert proc.poll() == -9 and supervise.group_members(proc.pid) == []


def test_terminate_group_sweeps_what_a_leader_left_and_can_be_cut_short():
    import time

    from milarun.host import supervise

    proc = _group_of("sleep 100 & exec sleep 100")
    time.sleep(0.3)
    members = supervise.group_members(proc.pid)
    assert len(members) == 2
    t0 = time.monotonic()
    # SIGTERM ends the leader; its group (the background sleep) is swept with it
    assert (
        supervise.terminate_group([supervise.ProcessGroup(proc)], 30, cut_short=lambda: True) == []
    )
    assert time.monotonic() - t0 < 5
    time.sleep(0.1)
    assert supervise.group_members(proc.pid) == []


def test_group_stop_steps_a_plain_process_to_sigkill():
    import subprocess
    import time

    from milarun.host import supervise

    proc = subprocess.Popen(["sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"])
    time.sleep(0.3)
    t0 = time.monotonic()
    stop = supervise.GroupStop(proc, 0.3, abandon_s=10, now=t0)
    assert stop.step(t0 + 0.1) is False and proc.poll() is None  # SIGTERM ignored
    stop.step(t0 + 0.5)  # grace over: SIGKILL
    proc.wait(timeout=5)
    assert proc.returncode == -9 and stop.step() is True and not stop.abandoned


def test_periodic_sampler_reads_until_stop_then_once_more():
    import time

    from milarun.bench.sampler import PeriodicSampler

    class Counter(PeriodicSampler):
        sample_at_start = True

        def _sample(self):
            row = {"n": len(self.samples)}
            self.samples.append(row)
            self._notify(row)

    seen = []
    with Counter(interval=0.02, on_reading=seen.append) as s:
        assert s.available
        time.sleep(0.2)
    n = len(s.samples)
    assert n >= 3 and seen == s.samples and s.reason is None
    time.sleep(0.1)
    assert len(s.samples) == n  # the thread ended


def test_periodic_sampler_failure_ends_the_thread_with_a_reason():
    import time

    from milarun.bench.sampler import PeriodicSampler

    class Broken(PeriodicSampler):
        def _init(self):
            self.reason = None
            return True

        def _sample(self):
            raise OSError("gone")

        def _last(self):
            pass

    s = Broken(interval=0.01, reason="not started").start()
    time.sleep(0.2)
    s.stop()
    assert s.reason == "sampling stopped: OSError: gone"

    class Nothing(PeriodicSampler):
        def _init(self):
            self.reason = "no GPU"
            return False

    n = Nothing().start()
    assert not n.available and n._thread is None and n.reason == "no GPU"
