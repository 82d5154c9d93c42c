"""Plan types over nodes: exact srun, ssh and torchrun command lines, with nothing launched."""

import json
import shlex
import subprocess
import sys

import pytest

from milarun.cli import main
from milarun.errors import SetupError
from milarun.formats.jsonfile import load_schema
from milarun.host.devices import Devices
from milarun.plan import nodes
from milarun.plan import types as plantypes
from milarun.plan.launches import plan_job
from milarun.profile.job import Job

PY = "/py"


def job(partition, launcher="python", scheme=None, cgroup="cpuset,memory:student{device}"):
    definition = {"partition_scheme": dict(scheme or {}, type=partition)}
    return Job(
        "std",
        "ddp",
        "milarun.models.scaling:main",
        arguments={"--batch-size": 8},
        plan_type=partition,
        cgroup=cgroup,
        launcher=launcher,
        definition=definition,
    )


def slurm(n=2, devices=(0, 1), kind="gpu"):
    names = [f"node{i + 1}" for i in range(n)]
    return nodes.Cluster(
        "slurm",
        [nodes.Node(x, f"10.0.0.{i + 1}", main=(i == 0)) for i, x in enumerate(names)],
        Devices(kind, list(devices)),
        job_id="42",
        python=PY,
    )


def ssh(n=2, devices=(0,)):
    return nodes.Cluster(
        "ssh",
        [
            nodes.Node(f"n{i + 1}", f"host{i + 1}", "bench", 2222, "/k", main=(i == 0))
            for i in range(n)
        ],
        Devices("cpu", list(devices)),
        python=PY,
    )


def extra_of(argv):
    return json.loads(argv[argv.index("--extra") + 1])


def torchrun_flags(argv):
    i = argv.index("torch.distributed.run")
    j = argv.index("milarun", i)
    return argv[i + 1 : j - 1]


def test_registry_names_match_the_profile_schema():
    enum = load_schema("profile")["$defs"]["job"]["properties"]["partition_scheme"]["properties"][
        "type"
    ]["enum"]
    assert enum == list(plantypes.TYPES)


def test_per_gpu_on_two_slurm_nodes_is_one_srun_step_per_device(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    (wave,) = plan_job(job("per-gpu"), slurm(), 0, "/out", "/data", python=PY)
    assert [lch.device for lch in wave] == ["node1.0", "node1.1", "node2.0", "node2.1"]
    assert all(lch.concurrent for lch in wave)
    a = wave[2]
    assert a.argv[:10] == [
        "srun",
        "--nodes=1",
        "--ntasks=1",
        "--ntasks-per-node=1",
        "--nodelist=node2",
        "--overlap",
        "--kill-on-bad-exit=1",
        "--cpu-bind=none",
        "--export=ALL",
        "--job-name=std.ddp.node2.0",
    ]
    # the environment travels in the command: Slurm would overwrite CUDA_VISIBLE_DEVICES
    assert a.argv[10:17] == [
        "env",
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES=0",
        "MILARUN_BACKEND=nvidia",
        "MILARUN_DEVICE=node2.0",
        "MILARUN_PDEATHSIG=1",
        "MILARUN_RUN=0",
    ]
    assert a.env == {}
    assert a.argv[17:20] == ["/usr/bin/cgexec", "-g", "cpuset,memory:student0"]
    assert a.result_path.name == "std.ddp.J0.node2.0.19700101-000000-000000.json"
    assert a.group == "std.ddp"
    assert extra_of(a.argv)["node"] == "node2"
    assert extra_of(a.argv)["nodes"] == ["node2"]


def test_single_host_keeps_its_command_lines_and_names():
    (wave,) = plan_job(job("per-gpu", cgroup=None), Devices("cpu", [0]), 0, "/o", "/d", python=PY)
    (lch,) = wave
    assert lch.argv[:4] == [PY, "-m", "milarun", "run"]
    assert lch.env["CUDA_VISIBLE_DEVICES"] == ""
    assert "node" not in extra_of(lch.argv)
    assert lch.result_path.name == "std.ddp.J0.0.19700101-000000-000000.json"


def test_njobs_is_one_standalone_torchrun_per_node_all_at_once():
    (wave,) = plan_job(
        job("njobs", launcher="torchrun"), slurm(devices=(0, 1, 2, 3)), 1, "/o", "/d", python=PY
    )
    assert [lch.device for lch in wave] == ["node1.all", "node2.all"]
    assert all(lch.concurrent and lch.cgroup is None for lch in wave)
    assert torchrun_flags(wave[0].argv) == ["--standalone", "--nproc-per-node", "4"]
    assert "--nodelist=node1" in wave[0].argv and "--nodelist=node2" in wave[1].argv
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in wave[0].argv
    assert {lch.group for lch in wave} == {"std.ddp"}


def test_multi_node_is_one_srun_over_every_node_with_a_c10d_rendezvous():
    when = __import__("datetime").datetime(
        2026, 11, 22, 4, 5, 6, tzinfo=__import__("datetime").timezone.utc
    )
    (wave,) = plan_job(
        job("multi-node"),
        slurm(devices=(0, 1)),
        0,
        "/o",
        "/d",
        python=PY,
        session=when,
        rdzv_port=29555,
    )
    (lch,) = wave
    assert lch.argv[:5] == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--nodelist=node1,node2",
    ]
    assert torchrun_flags(lch.argv) == [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "10.0.0.1:29555",
        "--rdzv-id",
        "std.ddp.J0.2x2.20261122-040506",
        "--rdzv-conf",
        f"join_timeout={plantypes.JOIN_TIMEOUT_S}",
        "--max-restarts",
        "0",
    ]
    assert lch.device == "2x2" and lch.group == "std.ddp"
    assert lch.result_path.name == "std.ddp.J0.2x2.20261122-040506-000000.json"
    extra = extra_of(lch.argv)
    assert extra["nodes"] == ["node1", "node2"] and extra["node_count"] == 2
    assert extra["gpus_per_node"] == 2
    assert extra["rendezvous"] == {
        "backend": "c10d",
        "endpoint": "10.0.0.1:29555",
        "id": "std.ddp.J0.2x2.20261122-040506",
    }


def test_node_progression_gives_every_nodes_by_gpus_step_in_sequence():
    waves = plan_job(job("node-progression"), slurm(devices=(0, 1)), 0, "/o", "/d", python=PY)
    assert [w[0].group for w in waves] == [
        "std.ddp.1x1",
        "std.ddp.1x2",
        "std.ddp.2x1",
        "std.ddp.2x2",
    ]
    assert all(len(w) == 1 and not w[0].concurrent for w in waves)
    one = waves[1][0]
    assert "--nodelist=node1" in one.argv and "--nnodes" in one.argv
    assert torchrun_flags(one.argv)[:4] == ["--nnodes", "1", "--nproc-per-node", "2"]


def test_node_progression_takes_the_profiles_lists_and_skips_what_the_cluster_lacks():
    j = job("node-progression", scheme={"nodes": [1, 2, 8], "gpus_per_node": [2, 16]})
    waves = plan_job(j, slurm(devices=(0, 1)), 0, "/o", "/d", python=PY)
    assert [w[0].device for w in waves] == ["1x2", "2x2"]


def test_ssh_cluster_runs_each_node_through_batchmode_ssh_and_fans_out():
    (wave,) = plan_job(job("multi-node"), ssh(), 0, "/o", "/d", python=PY)
    (lch,) = wave
    assert lch.argv[:3] == [PY, "-m", "milarun.launcher.fanout"]
    agents = json.loads(lch.argv[3])
    assert len(agents) == 2
    first = agents[0]
    assert first[: first.index("host1")] == [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=15",
        "-o",
        "ServerAliveInterval=10",
        "-o",
        "ServerAliveCountMax=3",
        "-p",
        "2222",
        "-i",
        "/k",
        "-o",
        "IdentitiesOnly=yes",
        "-l",
        "bench",
        "--",
    ]
    assert agents[1][agents[1].index("--") + 1] == "host2"
    remote = first[-1]
    assert "--pdeathsig KILL" in remote
    assert "torch.distributed.run --nnodes 2" in remote
    assert "--rdzv-endpoint host1:29400" in remote
    # the variables travel in the remote command: ssh passes none
    assert (
        "env MILARUN_NODE=n1 env CUDA_VISIBLE_DEVICES= MILARUN_BACKEND=cpu MILARUN_DEVICE=2x1"
        in remote
    )


def test_ssh_per_gpu_launch_is_one_ssh_command():
    (wave,) = plan_job(job("per-gpu", cgroup=None), ssh(), 0, "/o", "/d", python=PY)
    assert [lch.argv[0] for lch in wave] == ["ssh", "ssh"]
    assert wave[1].argv[wave[1].argv.index("--") + 1] == "host2"


def test_gpu_progression_and_normal_stay_on_the_main_node():
    waves = plan_job(job("gpu-progression", launcher="torchrun"), slurm(), 0, "/o", "/d", python=PY)
    assert [w[0].device for w in waves] == ["node1.0", "node1.0-1"]
    assert all("--nodelist=node1" in w[0].argv for w in waves)
    (wave,) = plan_job(job("normal"), slurm(), 0, "/o", "/d", python=PY)
    assert wave[0].device == "node1.all"


@pytest.mark.parametrize(
    "record,group",
    [
        ({"name": "s.j", "partition": "per-gpu", "devices": [0]}, "s.j"),
        ({"name": "s.j", "partition": "gpu-progression", "devices": [0, 1]}, "s.j.2"),
        (
            {"name": "s.j", "partition": "node-progression", "node_count": 2, "gpus_per_node": 4},
            "s.j.2x4",
        ),
        ({"name": "s.j", "partition": "multi-node", "node_count": 2}, "s.j"),
        ({"name": "s.j", "partition": "something-else"}, "s.j"),
    ],
)
def test_group_names_come_from_the_plan_type(record, group):
    assert plantypes.group_name(record) == group


def test_weights_of_progressions_fall_back_to_the_test():
    w = {"s.j": 2.0, "s.k.2x2": 5.0}
    assert plantypes.weight_for("s.j.2x4", w, "node-progression") == (2.0, "s.j")
    assert plantypes.weight_for("s.j.3", w, "gpu-progression") == (2.0, "s.j")
    assert plantypes.weight_for("s.j.3", w, "per-gpu") == (None, None)
    assert plantypes.weight_for("s.k.2x2", w, None) == (5.0, "s.k.2x2")
    assert plantypes.weight_for("s.j.1x1", w, None) == (2.0, "s.j")


def test_plan_type_keys_are_checked_per_type(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(
        json.dumps(
            {
                "a": {
                    "experiment": "milarun.models.scaling:main",
                    "partition_scheme": {"type": "per-gpu", "nodes": [1]},
                }
            }
        )
    )
    with pytest.raises(SystemExit) as exc:
        main(["jobs", str(path), "--dry-run"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        f"milarun: error: {path}: job 'a', key 'partition_scheme.nodes': not used by plan "
        "type 'per-gpu' (its keys: type, cgroup)\n"
    )


def fake_scontrol(argv):
    if argv[:3] == ["scontrol", "show", "hostnames"]:
        assert argv[3] == "node[1-2]"
        return "node1\nnode2\n"
    if argv[:3] == ["scontrol", "show", "node"]:
        return (
            "NodeName=node1 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 Port=17001\n"
            "NodeName=node2 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.2 Port=17002\n"
        )
    raise AssertionError(argv)


def test_slurm_allocation_gives_its_nodes_and_addresses():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]"}
    c = nodes.slurm_cluster(Devices("cpu", [0]), env, run=fake_scontrol)
    assert [(n.name, n.address, n.main) for n in c.nodes] == [
        ("node1", "127.0.0.1", True),
        ("node2", "127.0.0.2", False),
    ]
    assert c.kind == "slurm" and c.job_id == "7" and c.multi


def test_slurm_gpus_on_node_limits_the_devices():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_GPUS_ON_NODE": "2"}
    devs = Devices("gpu", [0, 1, 2, 3], ["a"] * 4, [[]] * 4)
    c = nodes.slurm_cluster(devs, env, run=fake_scontrol)
    assert c.devices.indices == [0, 1]


def test_discover_picks_system_then_slurm_then_this_host(tmp_path):
    devs = Devices("cpu", [0])
    assert nodes.discover(devs, environ={}).kind == "local"
    assert nodes.discover(devs, single_node=True, environ={"SLURM_JOB_ID": "1"}).kind == "local"
    path = tmp_path / "system.json"
    path.write_text(
        json.dumps(
            {
                "nodes": [
                    {"name": "a", "address": "h1"},
                    {"name": "b", "address": "h2", "main": True},
                ]
            }
        )
    )
    c = nodes.discover(devs, system=path, environ={"SLURM_JOB_ID": "1"})
    assert c.kind == "ssh" and [n.name for n in c.nodes] == ["b", "a"]
    with pytest.raises(SetupError, match="contradict"):
        nodes.discover(devs, system=path, single_node=True, environ={})


BAD_SYSTEMS = [
    ("[]", "a system file must be a JSON object with a 'nodes' list"),
    ("{}", "nodes: missing; give a list of nodes"),
    ('{"nodes": []}', "nodes: must name at least one node"),
    (
        '{"nodes": [{"name": "a"}]}',
        "nodes.0.address: missing; give the host name or IP address ssh reaches the node at",
    ),
    (
        '{"nodes": [{"name": "a", "address": "h; rm -rf /"}]}',
        "nodes.0.address: must be a host name or an IP address",
    ),
    (
        '{"nodes": [{"name": "a/b", "address": "h"}]}',
        "nodes.0.name: job names may hold only letters, digits, '_' and '-'",
    ),
    (
        '{"nodes": [{"name": "a", "address": "h", "port": 0}]}',
        "nodes.0.port: must be a port number from 1 to 65535",
    ),
    (
        '{"nodes": [{"name": "a", "address": "h", "pasword": "x"}]}',
        "nodes.0.pasword: unknown key (known: address, key, main, name, port, user)",
    ),
    (
        '{"nodes": [{"name": "a", "address": "h"}, {"name": "a", "address": "g"}]}',
        "nodes.1.name: 'a' is given twice",
    ),
    (
        '{"nodes": [{"name": "a", "address": "h", "main": true}, '
        '{"name": "b", "address": "g", "main": true}]}',
        "nodes.1.main: only one node can be the main node",
    ),
    (
        '{"nodes": [{"name": "a", "address": "h", "main": "yes"}]}',
        "nodes.0.main: must be true or false",
    ),
]


@pytest.mark.parametrize("content,message", BAD_SYSTEMS, ids=[m[:40] for _, m in BAD_SYSTEMS])
def test_bad_system_file_is_one_line_and_exit_2(tmp_path, capsys, content, message):
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"a": {"experiment": "milarun.models.toy_reg:main"}}))
    path = tmp_path / "system.json"
    path.write_text(content)
    with pytest.raises(SystemExit) as exc:
        main(["jobs", str(profile), "--system", str(path), "--dry-run"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == f"milarun: error: {path}: {message}\n"


def test_dry_run_with_a_system_file_shows_the_ssh_commands(tmp_path, capsys):
    profile = tmp_path / "p.json"
    profile.write_text(
        json.dumps(
            {
                "a": {
                    "experiment": "milarun.models.toy_reg:main",
                    "partition_scheme": {"type": "per-gpu"},
                }
            }
        )
    )
    path = tmp_path / "system.json"
    path.write_text(
        json.dumps({"nodes": [{"name": "a", "address": "h1"}, {"name": "b", "address": "h2"}]})
    )
    (tmp_path / "d").mkdir()
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "jobs",
                str(profile),
                "--system",
                str(path),
                "--dry-run",
                "-d",
                str(tmp_path / "d"),
                "-o",
                str(tmp_path / "o"),
            ]
        )
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "× 2 nodes (ssh: a, b)" in out
    assert out.count("ssh -o BatchMode=yes") == 2
    assert "p.a.J0.b.0." in out


def test_fanout_ends_every_agent_when_one_fails_and_says_node_lost():
    agents = [
        [sys.executable, "-c", "import time; time.sleep(60)"],
        [sys.executable, "-c", "import sys; sys.exit(255)"],
    ]
    done = subprocess.run(
        [sys.executable, "-m", "milarun.launcher.fanout", json.dumps(agents)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 255
    assert "milarun.launcher.fanout: node-lost 1" in done.stderr


def test_fanout_passes_when_every_agent_passes():
    agents = [[sys.executable, "-c", "print('a')"], [sys.executable, "-c", "print('b')"]]
    done = subprocess.run(
        [sys.executable, "-m", "milarun.launcher.fanout", json.dumps(agents)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert sorted(done.stdout.split()) == ["a", "b"]


def test_fanout_refuses_a_malformed_list():
    done = subprocess.run(
        [sys.executable, "-m", "milarun.launcher.fanout", '[["ok"], 3]'],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "milarun.launcher.fanout: error" in done.stderr


@pytest.mark.parametrize(
    "tail,launcher,reason",
    [
        (
            ["torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"],
            "rendezvous",
            "rendezvous-timeout",
        ),
        (
            ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"],
            "torchrun",
            "rank-failed",
        ),
        (["srun: error: Node failure on node2"], "rendezvous", "node-lost"),
        (["ChildFailedError"], "python", None),
    ],
)
def test_distributed_failures_are_named(tail, launcher, reason):
    from milarun.launcher.outcome import distributed_reason
    from milarun.plan.launches import Launch

    lch = Launch("s.j", None, 0, "0", [0], ["x"], {}, cluster=slurm(), launcher=launcher)
    assert distributed_reason(lch, 1, tail) == reason


def test_ssh_status_255_is_a_lost_node():
    from milarun.launcher.outcome import distributed_reason
    from milarun.plan.launches import Launch

    lch = Launch("s.j", None, 0, "0", [0], ["ssh"], {}, cluster=ssh())
    assert distributed_reason(lch, 255, []) == "node-lost"
    assert distributed_reason(lch, 1, []) is None


def test_slurm_dry_run_prints_a_complete_script(capsys):
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "slurm",
                "profiles/cpu.json",
                "--nodes",
                "2",
                "--partition",
                "debug",
                "--time",
                "1:00:00",
                "--cpu-slots",
                "1",
                "-d",
                "/data",
                "-o",
                "/res",
                "--dry-run",
                "--",
                "--max-count",
                "10",
            ]
        )
    assert exc.value.code == 0
    script = capsys.readouterr().out
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for want in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --partition=debug",
        "#SBATCH --time=1:00:00",
        "#SBATCH --output=/res/logs/slurm-%j.out",
    ):
        assert want in lines
    last = shlex.split(lines[-1])
    assert last[0] == "exec" and last[2:5] == ["-m", "milarun", "jobs"]
    assert last[6:] == ["-d", "/data", "-o", "/res", "--cpu-slots", "1", "--", "--max-count", "10"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--nodes", "0"], "--nodes must be between 1 and 4096, not 0"),
        (["--time", "soon"], "--time 'soon' is not a Slurm time"),
        (["--partition", "a b"], "--partition 'a b' is not a Slurm name"),
        (["--gpus-per-node", "0"], "--gpus-per-node must be between 1 and 1024, not 0"),
    ],
)
def test_slurm_bad_options_are_one_line(capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        main(["slurm", "profiles/cpu.json", "--dry-run"] + args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"milarun: error: {message}") and err.count("\n") == 1


def test_slurm_without_sbatch_says_so_and_keeps_the_script(tmp_path):
    from milarun.cli import slurm as slurm_cli

    data = tmp_path / "d"
    data.mkdir()
    with pytest.raises(SetupError, match="sbatch is not installed"):
        slurm_cli.slurm(
            "profiles/cpu.json",
            [],
            dataroot=str(data),
            out=str(tmp_path / "r"),
            sbatch="/nonexistent/sbatch",
        )
    assert (tmp_path / "r" / "milarun.sbatch").read_text().startswith("#!/bin/bash")


def test_join_timeout_reaches_torchrun_as_a_whole_number_of_seconds():
    (wave,) = plan_job(job("multi-node"), slurm(), 0, "/o", "/d", python=PY, join_timeout=2.5)
    assert "join_timeout=3" in wave[0].argv


def test_a_record_over_several_nodes_names_them_all_but_no_single_node():
    (wave,) = plan_job(job("multi-node"), slurm(), 0, "/o", "/d", python=PY)
    extra = extra_of(wave[0].argv)
    assert "node" not in extra and extra["nodes"] == ["node1", "node2"]


def test_node_progression_says_which_steps_it_leaves_out_and_refuses_when_none_fits():
    kind = plantypes.TYPES["node-progression"]
    j = job("node-progression", scheme={"nodes": [1, 2, 4], "gpus_per_node": [2]})
    (note,) = kind.notes(j, slurm(devices=(0, 1)))
    assert note.startswith("node-progression steps 4x2 left out")
    j = job("node-progression", scheme={"nodes": [4], "gpus_per_node": [8]})
    with pytest.raises(SetupError, match="no step of its node-progression fits"):
        kind.notes(j, slurm(devices=(0, 1)))


def test_system_file_port_and_address_never_become_ssh_options(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"nodes": [{"name": "a", "address": "h", "port": 2222.0}]}))
    c = nodes.load_system(path, Devices("cpu", [0]))
    argv = nodes.ssh_argv(c.nodes[0], ["true"])
    assert argv[argv.index("-p") + 1] == "2222"
    assert argv[-3:-1] == ["--", "h"]
    path.write_text(json.dumps({"nodes": [{"name": "a", "address": "-Jevil"}]}))
    with pytest.raises(SetupError, match="nodes.0.address: must be a host name"):
        nodes.load_system(path, Devices("cpu", [0]))


def test_system_file_paths_are_relative_to_the_file(tmp_path, monkeypatch):
    path = tmp_path / "s.json"
    path.write_text(
        json.dumps(
            {"ssh_config": "cfg", "nodes": [{"name": "a", "address": "h", "key": "keys/id"}]}
        )
    )
    monkeypatch.chdir("/")
    node = nodes.load_system(path, Devices("cpu", [0])).nodes[0]
    assert node.key == str(tmp_path / "keys" / "id") and node.config == str(tmp_path / "cfg")


@pytest.mark.parametrize(
    "own_reason,tail,done,reason",
    [
        # rank 0 wrote "error" (its peer vanished) while torchrun reports the failed rank
        (
            "error",
            ["RuntimeError: Connection closed by peer", "ChildFailedError"],
            True,
            "rank-failed",
        ),
        # past the rendezvous, a lost store is a lost peer, not a node that never joined
        ("interrupted", ["RendezvousConnectionError"], True, "rank-failed"),
        ("interrupted", ["RendezvousTimeoutError"], False, "rendezvous-timeout"),
        ("error", ["ValueError: bad"], False, "error"),
    ],
)
def test_a_rank_0_record_of_a_failed_distributed_job_gets_the_job_reason(
    tmp_path, own_reason, tail, done, reason
):
    from milarun.formats.record import new_result
    from milarun.formats.store import write_result
    from milarun.launcher.outcome import conclude

    (wave,) = plan_job(job("multi-node"), slurm(), 0, tmp_path, "/d", python=PY)
    lch = wave[0]
    rec = new_result(
        lch.name, lch.job_id, device=lch.device, devices=lch.devices, plan_type="multi-node"
    )
    rec["error"] = {"reason": own_reason, "type": "RuntimeError", "message": "m"}
    if done:
        rec["distributed"] = {"world_size": 4, "backend": "gloo"}
    write_result(rec, lch.result_path)

    class Child:
        launch, proc, timed_out, stopped, abandoned = lch, None, False, False, False
        t0, start_error, log_error, oom_before = 0.0, None, None, None

        def poll(self):
            return 1

    child = Child()
    child.tail = list(tail)
    outcome = conclude(child)
    assert outcome.reason == reason


@pytest.mark.parametrize("command", ["jobs", "slurm"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9"])
def test_join_timeout_out_of_range_is_one_line_for_jobs_and_slurm(capsys, command, value):
    with pytest.raises(SystemExit) as exc:
        main([command, "profiles/cpu.json", "--dry-run", "--join-timeout", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("milarun: error: --join-timeout must be a number of seconds in (0, ")
    assert err.count("\n") == 1


def test_fanout_kills_an_agent_that_ignores_sigterm_after_the_grace():
    import signal
    import time

    from milarun.launcher import fanout

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    agents = [["sh", "-c", "trap '' TERM; exec sleep 60"], ["sh", "-c", "sleep 0.3; exit 3"]]
    t0 = time.monotonic()
    try:
        assert fanout.run(agents, grace=0.5) == 3
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert time.monotonic() - t0 < 10
