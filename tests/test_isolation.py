"""Isolation helpers on fake cgroup trees (v1 and v2) and the student split."""

import pytest

from milarun.host import isolation


def test_split_students_even_exclusive():
    plan = isolation.split_students(2, [0, 1, 2, 3, 4], 8 * 2**30)
    assert [p["cpus"] for p in plan] == [[0, 1], [2, 3]]
    assert all(p["memory_bytes"] == 4 * 2**30 for p in plan)


def test_split_students_prefers_gpu_local_numa_cores():
    numa = {c: (0 if c < 4 else 1) for c in range(8)}
    # GPU 0 sits on NUMA node 1, GPU 1 on node 0
    plan = isolation.split_students(
        2, list(range(8)), 2**30, gpu_cpus=[[4, 5, 6, 7], [0, 1, 2, 3]], numa_nodes=numa
    )
    assert plan[0]["cpus"] == [4, 5, 6, 7] and plan[0]["mems"] == [1]
    assert plan[1]["cpus"] == [0, 1, 2, 3] and plan[1]["mems"] == [0]


def test_split_students_too_few_cpus():
    with pytest.raises(ValueError, match="cannot be split"):
        isolation.split_students(3, [0, 1], 2**30)


def test_cpu_list_syntax_round_trip():
    assert isolation.format_cpus([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert isolation.parse_cpus("0-2,5,7-8") == [0, 1, 2, 5, 7, 8]


def test_oom_counter_v1_and_v2(tmp_path, monkeypatch):
    monkeypatch.setattr(isolation, "CGROOT", tmp_path)
    (tmp_path / "memory" / "student0").mkdir(parents=True)
    (tmp_path / "memory" / "student0" / "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"
    )
    assert isolation.oom_kill_count("cpuset,memory:student0") == 3
    (tmp_path / "student1").mkdir()
    (tmp_path / "student1" / "memory.events").write_text(
        "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n"
    )
    assert isolation.oom_kill_count("cpuset,memory:student1") == 1
    assert isolation.oom_kill_count("memory:nowhere") is None


def test_cgroup_version_detection_and_missing_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(isolation, "CGROOT", tmp_path)
    assert isolation.cgroup_version() is None
    (tmp_path / "cgroup.controllers").write_text("cpuset memory\n")
    assert isolation.cgroup_version() == 2
    (tmp_path / "student0").mkdir()
    assert isolation.missing_groups(["cpuset,memory:student0", "cpuset,memory:student1"]) == [
        "cpuset,memory:student1"
    ]


def test_wrap_order():
    argv = isolation.wrap(["python", "x"], "cpuset:student0", ["nocache"], use_cgexec=True)
    assert argv[1:3] == ["-g", "cpuset:student0"] and argv[3:] == ["nocache", "python", "x"]
    assert isolation.wrap(["python"], "cpuset:s", [], use_cgexec=False) == ["python"]


def test_current_facts_are_this_process():
    import os

    assert isolation.current_cpuset() == sorted(os.sched_getaffinity(0))
    limit = isolation.current_memory_limit_mib()
    assert limit is None or limit > 0
