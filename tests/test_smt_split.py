"""Student cgroups and multi-process pinning take whole physical cores.

NVML's CPU affinity of a GPU holds its NUMA node's CPUs, SMT siblings included (its own
example: CPUs 0, 1, 32, 33). Taken in CPU order, those gave two students the two
hyperthreads of one core: on 2 x 56 cores with SMT, student0 0-27 and student2 112-139.
These tests build fake sysfs topologies (1 and 2 sockets, SMT on and off, siblings numbered
``i, i + cores`` as on Intel and most AMD hosts, or ``2i, 2i + 1``) and check that no two
students share a core, that each gets the same share, and that each keeps its GPU's NUMA
node."""

from pathlib import Path

import pytest

from milarun.host import isolation


def fake_host(root, sockets, per_socket, smt, numbering="split"):
    """Write a sysfs CPU and NUMA topology under ``root``; return ``(cpus, core_of,
    socket_of)``: every CPU id, and each CPU's physical core and socket."""
    total = sockets * per_socket
    core_of, socket_of = {}, {}
    for p in range(total):
        threads = (
            [p + t * total for t in range(smt)]
            if numbering == "split"
            else [p * smt + t for t in range(smt)]
        )
        for c in threads:
            core_of[c], socket_of[c] = p, p // per_socket
            topo = Path(root) / f"sys/devices/system/cpu/cpu{c}/topology"
            topo.mkdir(parents=True, exist_ok=True)
            (topo / "thread_siblings_list").write_text(isolation.format_cpus(threads) + "\n")
    for s in range(sockets):
        node = Path(root) / f"sys/devices/system/node/node{s}"
        node.mkdir(parents=True, exist_ok=True)
        mine = [c for c in core_of if socket_of[c] == s]
        (node / "cpulist").write_text(isolation.format_cpus(mine) + "\n")
    return sorted(core_of), core_of, socket_of


def gpu_affinity(gpus, sockets, socket_of):
    """Per GPU, NVML's CPU affinity: every CPU (siblings included) of its socket; the GPUs
    spread evenly over the sockets, in order."""
    per = gpus // sockets
    return [sorted(c for c, s in socket_of.items() if s == g // per) for g in range(gpus)]


TOPOLOGIES = [
    # (sockets, cores per socket, threads per core, sibling numbering)
    (1, 16, 1, "split"),
    (1, 16, 2, "split"),
    (1, 16, 2, "adjacent"),
    (2, 8, 1, "split"),
    (2, 8, 2, "split"),
    (2, 8, 2, "adjacent"),
    (2, 56, 2, "split"),  # the review's 2 x 56 cores with SMT
]


@pytest.mark.parametrize("gpus", [4, 8])
@pytest.mark.parametrize("sockets,per_socket,smt,numbering", TOPOLOGIES)
def test_students_take_whole_cores_equal_shares_on_their_numa_node(
    tmp_path, sockets, per_socket, smt, numbering, gpus
):
    cpus, core_of, socket_of = fake_host(tmp_path, sockets, per_socket, smt, numbering)
    affinity = gpu_affinity(gpus, sockets, socket_of)
    plan = isolation.split_students(
        gpus,
        cpus,
        64 * 2**30,
        gpu_cpus=affinity,
        numa_nodes=isolation.numa_nodes_of_cpus(root=tmp_path),
        cores=isolation.cpu_cores(cpus, root=tmp_path),
    )
    shares = [s["cpus"] for s in plan]
    # equal shares of the whole host (every core divides evenly here)
    assert [len(s) for s in shares] == [len(cpus) // gpus] * gpus
    # exclusive, and no physical core split between two students
    owners = {}
    for i, share in enumerate(shares):
        for c in share:
            assert owners.setdefault(core_of[c], i) == i, (
                f"core {core_of[c]} shared by students {owners[core_of[c]]} and {i}"
            )
    # whole cores: a student has every sibling of each core it has
    for share in shares:
        assert sorted(share) == sorted(c for c in cpus if core_of[c] in {core_of[x] for x in share})
    # NUMA locality: each student on its GPU's node, its memory node that one
    for g, s in enumerate(plan):
        node = socket_of[affinity[g][0]]
        assert {socket_of[c] for c in s["cpus"]} == {node} and s["mems"] == [node]
        assert s["memory_bytes"] == 64 * 2**30 // gpus


def test_the_reviews_example_two_sockets_of_56_cores_eight_gpus(tmp_path):
    cpus, core_of, socket_of = fake_host(tmp_path, 2, 56, 2)
    plan = isolation.split_students(
        8,
        cpus,
        2**30,
        gpu_cpus=gpu_affinity(8, 2, socket_of),
        numa_nodes=isolation.numa_nodes_of_cpus(root=tmp_path),
        cores=isolation.cpu_cores(cpus, root=tmp_path),
    )
    # before: student0 0-27 and student2 112-139, the siblings of the same 28 cores
    assert isolation.format_cpus(plan[0]["cpus"]) == "0-13,112-125"
    assert isolation.format_cpus(plan[2]["cpus"]) == "28-41,140-153"
    assert isolation.format_cpus(plan[4]["cpus"]) == "56-69,168-181"


def test_cores_of_unequal_sizes_give_equal_shares(tmp_path):
    # a cpuset holding one sibling of some cores: each student gets as many cores of
    # each size, so the same number of CPUs; the odd ones stay unused
    cpus, core_of, _ = fake_host(tmp_path, 1, 6, 2)
    usable = [c for c in cpus if c not in (10, 11)]  # cores 4 and 5: one thread left
    plan = isolation.split_students(
        2, usable, 2**30, cores=isolation.cpu_cores(usable, root=tmp_path)
    )
    assert [s["cpus"] for s in plan] == [[0, 1, 4, 6, 7], [2, 3, 5, 8, 9]]
    # fewer whole cores than students: CPUs are shared out one by one
    one = isolation.split_students(2, [0, 6], 2**30, cores=[[0, 6]])
    assert [s["cpus"] for s in one] == [[0], [6]]


def test_cpu_cores_reads_siblings_and_falls_back(tmp_path):
    fake_host(tmp_path, 1, 2, 2)  # cores {0, 2} and {1, 3}
    assert isolation.cpu_cores(root=tmp_path) == [[0, 2], [1, 3]]
    assert isolation.cpu_cores([0, 1, 7], root=tmp_path) == [[0, 2], [1, 3], [7]]
    newer = tmp_path / "new"  # only core_cpus_list
    topo = newer / "sys/devices/system/cpu/cpu0/topology"
    topo.mkdir(parents=True)
    (topo / "core_cpus_list").write_text("0-1\n")
    assert isolation.cpu_cores([0, 1], root=newer) == [[0, 1]]


@pytest.mark.parametrize("numbering", ["split", "adjacent"])
def test_processes_sharing_a_numa_node_split_it_by_whole_cores(tmp_path, numbering):
    cpus, core_of, socket_of = fake_host(tmp_path, 2, 56, 2, numbering)
    affinity = gpu_affinity(8, 2, socket_of)
    cores = isolation.cpu_cores(cpus, root=tmp_path)
    # four processes of two GPUs: two per NUMA node
    out = isolation.process_cpus([[0, 1], [2, 3], [4, 5], [6, 7]], affinity, cpus, cores=cores)
    assert [len(x) for x in out] == [56] * 4
    owners = {}
    for p, mine in enumerate(out):
        for c in mine:
            assert owners.setdefault(core_of[c], p) == p
    assert [{socket_of[c] for c in x} for x in out] == [{0}, {0}, {1}, {1}]
    # CPU slots split like the students
    slots = isolation.slot_cpus(4, cpus, cores=cores)
    assert len({core_of[c] for s in slots for c in s}) == sum(len(s) for s in slots) // 2


def test_student_plan_uses_the_hosts_cores(tmp_path, monkeypatch):
    # what scripts/cgroup_setup.sh applies (python -m milarun.host.students N)
    from milarun.host import devices, students

    cpus, core_of, socket_of = fake_host(tmp_path, 2, 8, 2)
    gpus = devices.Devices("gpu", list(range(4)), affinity=gpu_affinity(4, 2, socket_of))
    real = isolation.cpu_cores
    monkeypatch.setattr(students, "student_pool_cpus", lambda: cpus)
    monkeypatch.setattr(students, "cpu_cores", lambda c=None, root="/": real(c, tmp_path))
    monkeypatch.setattr(
        students, "numa_nodes_of_cpus", lambda root="/": {c: socket_of[c] for c in cpus}
    )
    monkeypatch.setattr(students, "find_gpus", lambda *a, **k: (gpus, {}))
    plan = students.student_plan(4, 4 * 2**30)
    assert [isolation.format_cpus(s["cpus"]) for s in plan] == [
        "0-3,16-19",
        "4-7,20-23",
        "8-11,24-27",
        "12-15,28-31",
    ]
    assert [s["mems"] for s in plan] == [[0], [0], [1], [1]]
