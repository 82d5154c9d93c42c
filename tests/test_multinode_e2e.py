"""Several nodes for real: `milarun slurm` on the local two-node Slurm cluster, scancel, and
the system-file path over a local sshd (scripts/slurm-local.sh, scripts/sshd-local.sh).

CI starts both daemons; elsewhere these skip with the reason, unless
$MILARUN_REQUIRE_CLUSTER=1 turns the skip into a failure. The first test runs its per-GPU
children in student cgroups (root); the others use --no-cgexec (the two "nodes" are one host).
"""

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, venv_python

pytestmark = pytest.mark.cluster

#: Shorter runs than the profile's: enough windows for a steady state, seconds each.
SHORT = ["--max-count", "2500", "--sample-duration", "0.2", "--warmup", "2", "--min-steady", "0.6"]


def records(outdir):
    out = {}
    for path in Path(outdir).glob("*.json"):
        rec = json.loads(path.read_text())
        out[path.name] = rec
    return out


def wait_job(cluster, job, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        m = re.search(r"JobState=(\S+)", out.stdout)
        if m and m.group(1) not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return m.group(1)
        time.sleep(1)
    raise AssertionError(f"Slurm job {job} still running after {timeout} s")


def submit(cluster, outdir, dataroot, names, extra=(), slots=1, cgroups=False):
    argv = (
        [
            venv_python(),
            "-m",
            "milarun",
            "slurm",
            "profiles/cluster-cpu.json",
            "--nodes",
            "2",
            "--cpu-slots",
            str(slots),
            "-d",
            str(dataroot),
            "-o",
            str(outdir),
            "--name",
            *names,
        ]
        + ([] if cgroups else ["--no-cgexec"])
        + ["--", *extra]
    )
    done = subprocess.run(
        argv, cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    m = re.search(r"submitted Slurm job (\d+) \(2 node\(s\)\); results in (\S+)", done.stdout)
    assert m and m.group(2) == str(outdir), done.stdout
    return m.group(1)


def leftover(outdir):
    """Processes on this host (both nodes) that still run a test of ``outdir``."""
    out = subprocess.run(["pgrep", "-af", str(outdir)], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


def test_milarun_slurm_runs_every_plan_type_across_two_nodes(slurm_cluster, students, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    out = tmp_path / "results"
    job = submit(
        slurm_cluster,
        out,
        data,
        ["toy_reg", "ddp", "scaling", "fabric"],
        SHORT,
        slots=2,
        cgroups=True,
    )
    state = wait_job(slurm_cluster, job, 600)
    log = (out / "logs" / f"slurm-{job}.out").read_text()
    assert state == "COMPLETED", log
    assert "× 2 nodes (node1, node2, slurm)" in log
    recs = records(out)
    assert not [n for n in recs if "FAIL" in n], log
    # per-gpu: one record per slot of each node, named after the node
    per_gpu = sorted(
        (r["node"], r["device"]) for r in recs.values() if r["name"] == "cluster-cpu.toy_reg"
    )
    assert per_gpu == [
        ("node1", "node1.0"),
        ("node1", "node1.1"),
        ("node2", "node2.0"),
        ("node2", "node2.1"),
    ]
    assert all(
        f"J0.{r['device']}." in n for n, r in recs.items() if r["name"] == "cluster-cpu.toy_reg"
    )
    # ... each in the student cgroup of its slot, on its node
    assert all(
        r["host"]["cgroup"].endswith(f"student{r['device'][-1]}")
        for r in recs.values()
        if r["name"] == "cluster-cpu.toy_reg"
    )
    # multi-node: one record, 2 nodes x 2 slots, both node names, the rendezvous
    (ddp,) = [r for r in recs.values() if r["name"] == "cluster-cpu.ddp"]
    assert ddp["distributed"]["world_size"] == 4
    assert sorted(ddp["distributed"]["node_names"]) == ["node1", "node2"]
    assert len(ddp["distributed"]["hosts"]) == 2
    assert ddp["nodes"] == ["node1", "node2"]
    assert ddp["distributed"]["rendezvous"]["backend"] == "c10d"
    # the fabric groups over 4 ranks as 2 nodes: each node's ranks, each rail across both
    (fab,) = [r for r in recs.values() if r["name"] == "cluster-cpu.fabric"]
    assert fab["metrics"]["groups"] == "world,node,rail,pairs"
    top = {
        r["group"]: r for r in fab["collectives"] if r["op"] == "all_to_all" and r["bytes"] == 4096
    }
    assert sorted(g["nodes"] for g in top["node"]["groups"]) == [["node1"], ["node2"]]
    assert [sorted(g["nodes"]) for g in top["rail"]["groups"]] == [["node1", "node2"]] * 2
    assert top["rail"]["ranks"] == 2 and top["pairs"]["ranks"] == 4
    assert fab["fabric"]["judged"] is False  # two nodes: one pair, nothing to compare it with
    # node-progression: 1x1, 1x2, 2x1, 2x2, grouped by shape
    from milarun.analysis.summary import summarize_dir

    summary, _ = summarize_dir(out)
    groups = sorted(g for g in summary["tests"] if g.startswith("cluster-cpu.scaling."))
    assert groups == [
        "cluster-cpu.scaling.1x1",
        "cluster-cpu.scaling.1x2",
        "cluster-cpu.scaling.2x1",
        "cluster-cpu.scaling.2x2",
    ]
    assert all(summary["tests"][g]["train"]["mean"] > 0 for g in groups)
    report = subprocess.run(
        [venv_python(), "-m", "milarun", "report", str(out), "--compare-nodes"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    assert "scaling of cluster-cpu.scaling" in report.stdout
    assert "node comparison" in report.stdout
    assert leftover(out) == []


def test_scancel_leaves_interrupted_records_and_no_process(slurm_cluster, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    out = tmp_path / "results"
    job = submit(
        slurm_cluster,
        out,
        data,
        ["toy_reg"],
        ["--max-count", "1000000000", "--sample-duration", "0.2"],
    )
    # wait until both tests have closed sample windows (start-up is slow under load)
    deadline = time.time() + 180
    while time.time() < deadline:
        journals = list(out.glob("*.journal.jsonl"))
        if len(journals) == 2 and all(j.read_text().count('"sample"') >= 2 for j in journals):
            break
        time.sleep(0.5)
    else:
        raise AssertionError("the tests never measured a sample window")
    subprocess.run(["scancel", job], env=slurm_cluster.env, check=True, timeout=30)
    wait_job(slurm_cluster, job, 120)
    deadline = time.time() + 30
    while time.time() < deadline and leftover(out):
        time.sleep(0.5)
    assert leftover(out) == []
    recs = records(out)
    log = (out / "logs" / f"slurm-{job}.out").read_text()
    assert sorted(r["node"] for r in recs.values()) == ["node1", "node2"], log
    for name, rec in recs.items():
        assert "FAIL" in name and rec["error"]["reason"] == "interrupted", (name, rec["error"])
        assert rec["timings"]["train"]["samples"], "the samples measured were lost"


def system_file(tmp_path, ssh_nodes, names=("a", "b"), ports=None):
    nodes = []
    for name, address in zip(names, ssh_nodes.nodes):
        nodes.append(
            {
                "name": name,
                "address": address,
                "user": ssh_nodes.user,
                "port": (ports or {}).get(name, ssh_nodes.port),
                "key": str(ssh_nodes.key),
            }
        )
    path = tmp_path / "system.json"
    path.write_text(json.dumps({"ssh_config": str(ssh_nodes.config), "nodes": nodes}))
    return path


def jobs_over_ssh(system, tmp_path, names, extra=SHORT):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    out = tmp_path / "results"
    argv = [
        venv_python(),
        "-m",
        "milarun",
        "jobs",
        "profiles/cluster-cpu.json",
        "--system",
        str(system),
        "--cpu-slots",
        "1",
        "--no-cgexec",
        "-d",
        str(data),
        "-o",
        str(out),
        "--name",
        *names,
        "--",
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return done, out


def test_system_file_runs_per_gpu_and_multi_node_over_ssh(ssh_nodes, tmp_path):
    system = system_file(tmp_path, ssh_nodes)
    done, out = jobs_over_ssh(system, tmp_path, ["toy_reg", "ddp"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed, 0 failed" in done.stdout
    recs = records(out)
    assert sorted(r["node"] for r in recs.values() if r["name"] == "cluster-cpu.toy_reg") == [
        "a",
        "b",
    ]
    (ddp,) = [r for r in recs.values() if r["name"] == "cluster-cpu.ddp"]
    assert ddp["distributed"]["world_size"] == 2
    assert sorted(ddp["distributed"]["node_names"]) == ["a", "b"]
    assert ddp["distributed"]["rendezvous"]["endpoint"].startswith(ssh_nodes.nodes[0] + ":")
    assert leftover(out) == []


def test_an_unreachable_node_stops_before_anything_runs(ssh_nodes, tmp_path):
    system = system_file(tmp_path, ssh_nodes, ports={"b": 1})
    done, out = jobs_over_ssh(system, tmp_path, ["toy_reg"])
    assert done.returncode == 2
    assert done.stderr.startswith("milarun: error: node b: cannot write to the results folder")
    assert done.stderr.count("\n") == 1
    assert not list(out.glob("*.json"))


def test_a_node_lost_mid_run_is_a_fail_record_and_leaves_no_process(ssh_nodes, tmp_path):
    # The agent on node b is killed from the outside (its sshd session ends, as when a node
    # dies); node a's agent is then ended by the fan-out and the record says node-lost.
    system = system_file(tmp_path, ssh_nodes)
    data = tmp_path / "data"
    data.mkdir()
    out = tmp_path / "results"
    argv = [
        venv_python(),
        "-m",
        "milarun",
        "jobs",
        "profiles/cluster-cpu.json",
        "--system",
        str(system),
        "--cpu-slots",
        "1",
        "--no-cgexec",
        "-d",
        str(data),
        "-o",
        str(out),
        "--name",
        "ddp",
        "--",
        "--max-count",
        "100000000",
        "--sample-duration",
        "0.2",
    ]
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        # wait for the multi-node agents of ddp
        deadline = time.time() + 180
        victims = []
        while time.time() < deadline and not victims:
            ps = subprocess.run(["ps", "-ewwo", "pid,args"], capture_output=True, text=True).stdout
            victims = [
                int(line.split()[0])
                for line in ps.splitlines()
                if "sshd: " in line and "notty" in line
            ]
            if not any(
                "torch.distributed.run" in line and str(out) in line for line in ps.splitlines()
            ):
                victims = []
            time.sleep(0.5)
        assert victims, "the multi-node agents never started"
        time.sleep(3)
        # one node "dies": its sshd session ends (the newest session: node b's agent)
        os.kill(max(victims), 9)
        text, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, text
    recs = records(out)
    (ddp,) = [(n, r) for n, r in recs.items() if r["name"] == "cluster-cpu.ddp"]
    assert "FAIL" in ddp[0] and ddp[1]["error"]["reason"] == "node-lost", ddp[1]["error"]
    # The lost node's own processes (here on this host too) end when they find their session
    # gone, a few seconds later on a loaded machine; node a's are ended by the launcher.
    deadline = time.time() + 30
    while leftover(out) and time.time() < deadline:
        time.sleep(0.5)
    assert leftover(out) == []


def test_lightning_trains_across_two_slurm_nodes(slurm_cluster, tmp_path):
    # PyTorch Lightning's Trainer (DDP strategy) under a real two-node allocation:
    # one torchrun agent per node, Lightning's version and both nodes in the record.
    data = tmp_path / "data"
    data.mkdir()
    out = tmp_path / "results"
    job = submit(
        slurm_cluster,
        out,
        data,
        ["lightning"],
        ["--max-count", "320", "--sample-duration", "0.2", "--warmup", "1", "--min-steady", "0.4"],
    )
    state = wait_job(slurm_cluster, job, 600)
    log = (out / "logs" / f"slurm-{job}.out").read_text()
    assert state == "COMPLETED", log
    (rec,) = [r for r in records(out).values() if r["name"] == "cluster-cpu.lightning"]
    assert rec["success"], rec["error"]
    assert rec["host"]["lightning"].count(".") >= 1
    assert rec["distributed"]["world_size"] == 2
    assert sorted(rec["distributed"]["node_names"]) == ["node1", "node2"]
    assert rec["nodes"] == ["node1", "node2"]
    assert not leftover(out)


def test_a_soak_restarts_every_node_from_the_checkpoint(slurm_cluster, tmp_path):
    # the soak across two Slurm nodes: one rank killed at its seeded step, torchrun's c10d
    # rendezvous restarting both nodes' ranks (the node whose rank lived counts no restart),
    # the job resumed from the checkpoint on the shared folder and the figures in one record
    from milarun.models.soak import fault_plan

    data = tmp_path / "data"
    data.mkdir()
    out = tmp_path / "results"
    job = submit(slurm_cluster, out, data, ["soak_multinode"])
    state = wait_job(slurm_cluster, job, 600)
    log = (out / "logs" / f"slurm-{job}.out").read_text()
    assert state == "COMPLETED", log
    (rec,) = [r for r in records(out).values() if r["name"] == "cluster-cpu.soak_multinode"]
    assert rec["success"], rec["error"]
    assert sorted(rec["distributed"]["node_names"]) == ["node1", "node2"]
    m = rec["metrics"]
    assert (m["soak_fault_step"], m["soak_fault_rank"]) == fault_plan(rec["seed"], 20, 4, 2)
    assert m["soak_restarts"] == 1 and m["soak_load_s"] > 0 and m["soak_restart_s"] > 0
    assert m["soak_lost_steps"] == m["soak_fault_step"] % 4
    assert 0 < m["soak_ettr"] < 1
    assert not list(data.glob("milarun-soak-*"))  # the folder removed at the end
    assert not leftover(out)
