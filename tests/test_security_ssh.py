"""Security, the start barrier over ssh: the start barrier's secret never appears in a command line.

Every user of a host reads every command line (``ps``, ``/proc/PID/cmdline``); one who read
the secret could join the start barrier and release a wave early. Over ssh the secret now
stays in the local process's environment (readable by the same user and root only) and
reaches the remote command as one line on ssh's stdin, read by ``nodes.READ_SECRET``.
"""

import json
import os
import secrets
import subprocess
import sys

import pytest

from milarun.cli import main
from milarun.formats.barrier import ENV_SECRET
from milarun.host.devices import Devices
from milarun.launcher.child import Child
from milarun.plan import nodes
from milarun.plan.launches import Launch, plan_job
from milarun.profile.job import Job


def ssh_cluster(n):
    return nodes.Cluster(
        "ssh",
        [
            nodes.Node(f"n{i + 1}", f"host{i + 1}", "bench", 2222, "/k", main=(i == 0))
            for i in range(n)
        ],
        Devices("cpu", [0]),
    )


def words(argv):
    """Every argv word, the fanout's agents' words included."""
    out = list(argv)
    if argv[1:3] == ["-m", "milarun.launcher.fanout"]:
        out += [w for agent in json.loads(argv[3]) for w in agent]
    return out


@pytest.mark.parametrize("n", [1, 2])
def test_on_nodes_over_ssh_keeps_the_secret_out_of_every_argv(n):
    secret = secrets.token_hex(16)
    cluster = ssh_cluster(n)
    argv, env = cluster.on_nodes(
        ["python", "-m", "milarun"],
        {ENV_SECRET: secret, "MILARUN_DEVICE": "0"},
        [f"n{i + 1}" for i in range(n)],
    )
    assert not [w for w in words(argv) if secret in w]
    assert "MILARUN_DEVICE=0" in " ".join(words(argv))  # the rest still travel in argv
    assert env == {ENV_SECRET: secret}  # the local process's environment
    if n == 1:
        assert argv[0] == "ssh" and cluster.stdin(argv, env) == secret + "\n"
    else:  # the fanout feeds its agents itself, from its environment
        assert argv[1:3] == ["-m", "milarun.launcher.fanout"] and cluster.stdin(argv, env) is None
    for agent in [argv] if n == 1 else json.loads(argv[3]):
        assert nodes.READ_SECRET in agent[-1]


def test_without_a_secret_nothing_reads_stdin():
    cluster = ssh_cluster(1)
    argv, env = cluster.on_nodes(["true"], {"MILARUN_DEVICE": "0"}, ["n1"])
    assert env == {} and cluster.stdin(argv, env) is None
    assert "read -r" not in argv[-1]


def test_a_planned_ssh_wave_feeds_the_secret_on_stdin():
    secret = secrets.token_hex(16)
    job = Job(
        "s",
        "crawl",
        "milarun.models.faults:crawl",
        plan_type="per-gpu",
        definition={"partition_scheme": {"type": "per-gpu"}},
    )
    (wave,) = plan_job(
        job,
        ssh_cluster(2),
        0,
        "/o",
        python="python",
        barrier={"address": "host1:4000", "timeout": 60, "secret": secret},
    )
    assert len(wave) == 2
    for lch in wave:
        assert lch.barrier_wave and lch.argv[0] == "ssh"
        assert not [a for a in lch.argv if secret in a]
        assert lch.stdin == secret + "\n"
        # the remote command never names it; the local environment does (dry run: SECRET)
        remote = lch.argv[-1]
        assert nodes.READ_SECRET in remote and f"{ENV_SECRET}=" not in remote
        assert lch.env == {ENV_SECRET: secret}


def test_dry_run_over_ssh_shows_the_placeholder_fed_on_stdin(tmp_path, capsys):
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
    system = tmp_path / "system.json"
    system.write_text(
        json.dumps(
            {
                "nodes": [
                    {"name": "a", "address": "127.0.0.1"},
                    {"name": "b", "address": "localhost"},
                ]
            }
        )
    )
    (tmp_path / "d").mkdir()
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "jobs",
                str(profile),
                "--system",
                str(system),
                "--dry-run",
                "-d",
                str(tmp_path / "d"),
                "-o",
                str(tmp_path / "o"),
            ]
        )
    assert exc.value.code == 0
    out = capsys.readouterr().out
    # the placeholder shows in ssh's local environment only, and the remote reads stdin
    starts = [line for line in out.splitlines() if "ssh -o BatchMode=yes" in line]
    assert len(starts) == 2
    assert all(line.startswith(f"{ENV_SECRET}=SECRET ssh ") for line in starts)
    assert out.count(f"{ENV_SECRET}=") == 2
    assert out.count("IFS= read -r MILARUN_BARRIER_SECRET") == 4  # setpriv or not, per launch


# --- end to end, with an ``ssh`` that runs the remote command here -----------------------

FAKE_SSH = """#!/bin/sh
# ssh as the launcher calls it (options, "--", host, one remote command string), run locally;
# no exec: like ssh, it stays for the whole run with its command line on show
remote=$(while [ "$1" != "--" ]; do shift; done; printf '%s' "$3")
sh -c "$remote"
"""

# The remote payload: its environment's secret, and every command line on this host that
# shows it, while the launcher, the fanout, the fake ssh and the remote shells all run.
PAYLOAD = """
import os, sys
secret = os.environ.get("MILARUN_BARRIER_SECRET")
seen = []
for pid in os.listdir("/proc"):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if secret and secret.encode() in f.read():
                seen.append(pid)
    except OSError:
        pass
with open(sys.argv[1] + "." + os.environ["MILARUN_NODE"], "w") as f:
    f.write(repr((secret, seen, sys.stdin.read())))
"""


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text(FAKE_SSH)
    (bindir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("n", [1, 2])
def test_the_remote_side_gets_the_secret_in_its_environment_and_no_argv_shows_it(
    fake_ssh, tmp_path, n
):
    secret = secrets.token_hex(16)
    cluster = ssh_cluster(n)
    cluster.python = sys.executable
    names = [f"n{i + 1}" for i in range(n)]
    out = tmp_path / "seen"
    argv, env = cluster.on_nodes(
        [sys.executable, "-c", PAYLOAD, str(out)],
        {ENV_SECRET: secret, "MILARUN_DEVICE": "0"},
        names,
    )
    lch = Launch("s.j", None, 0, "0", [0], argv, env, cluster=cluster, log="j.log")
    child = Child(lch, tmp_path)
    child.start()
    assert child.proc.wait(timeout=60) == 0, list(child.tail)
    for name in names:
        # (secret in the environment, pids whose command line shows it, what stdin still had)
        assert eval((tmp_path / f"seen.{name}").read_text()) == (secret, [], "")


def test_a_remote_command_given_no_secret_line_stops_with_one_line(fake_ssh):
    argv, env = ssh_cluster(1).on_nodes(["true"], {ENV_SECRET: "x"}, ["n1"])
    done = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "milarun: no barrier secret on stdin"
