"""Shared fixtures. Tests run on CPU; cgroup tests need root (CI runs as root).

The cluster fixtures (``slurm_cluster``, ``ssh_nodes``) use the local test cluster of
scripts/slurm-local.sh and scripts/sshd-local.sh, which .ci/run starts and stops.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from milarun.host import isolation
from milarun.host import students as students_module

ROOT = Path(__file__).resolve().parent.parent

# The report's cache (milarun.formats.cache) of this test run: a fresh folder, so that
# every report a test makes twice is read the second time from the cache, and no
# entry reaches the user's own cache. tests/test_report_cache.py checks it.
_OWN_CACHE = None
if "MILARUN_CACHE_DIR" not in os.environ:
    import tempfile

    _OWN_CACHE = os.environ["MILARUN_CACHE_DIR"] = tempfile.mkdtemp(prefix="milarun-test-cache-")


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


def cgroup_skip(reason):
    """Skip a cgroup test, or fail it when $MILARUN_REQUIRE_CGROUPS=1 (set by .ci/run)."""
    if os.environ.get("MILARUN_REQUIRE_CGROUPS") == "1":
        pytest.fail(f"cgroup test cannot run but MILARUN_REQUIRE_CGROUPS=1: {reason}")
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def no_smt_siblings(monkeypatch):
    """Plans pin processes to whole physical cores of this host (``isolation.cpu_cores``
    reads its SMT siblings from sysfs): in tests every CPU is a core of its own, so
    expected CPU lists do not depend on the test host. A fake sysfs ``root`` still reads
    the fake tree (tests/test_smt_split.py)."""
    real = isolation.cpu_cores
    fake = lambda cpus=None, root="/": (  # noqa: E731
        real(cpus, root) if str(root) != "/" or cpus is None else [[c] for c in sorted(cpus)]
    )
    monkeypatch.setattr(isolation, "cpu_cores", fake)
    monkeypatch.setattr(students_module, "cpu_cores", fake)  # imported by name there


@pytest.fixture(scope="session", autouse=True)
def written_registry(tmp_path_factory):
    """The registry of records written (milarun.formats.trust) for the whole session,
    children included: tests never add to the real ~/.config/milarun."""
    path = tmp_path_factory.mktemp("trust") / "written.sha256"
    old = os.environ.get("MILARUN_WRITTEN")
    os.environ["MILARUN_WRITTEN"] = str(path)
    yield path
    if old is None:
        os.environ.pop("MILARUN_WRITTEN", None)
    else:
        os.environ["MILARUN_WRITTEN"] = old


@pytest.fixture(scope="session")
def tiny_dataroot(tmp_path_factory):
    """A dataroot shared by the whole session; builders fill it on demand."""
    return tmp_path_factory.mktemp("dataroot")


def cli(args, capsys):
    """Run ``milarun ARGS`` in-process; return (exit code, stdout, stderr)."""
    from milarun.cli import main

    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def summary_of(folder):
    """The summary of the records under ``folder``, as ``milarun summary`` writes it and a
    reader reads it back (through its JSON and its schema: ``normalize_summary``)."""
    import io
    import json

    from milarun.analysis.summary import summarize_dir
    from milarun.formats.summary import normalize_summary

    s, _ = summarize_dir(folder, warn=io.StringIO())
    return normalize_summary(json.loads(json.dumps(s)))


def build_tiny(dataroot, *names):
    """Build the tiny size of each named dataset under ``dataroot``."""
    from milarun.datasets import prepare

    for name in names:
        prepare(name, dataroot, size="tiny", log=lambda *a: None)
    return dataroot


def run_model(function, argv, dataroot=None, tmp_path=None, name="test.model"):
    """Run ``module:function`` in-process like ``milarun run`` and return the result dict."""
    from milarun.cli.run import run_experiment

    out = Path(tmp_path) / "result.json"
    code = run_experiment(
        function, list(argv), out=str(out), dataroot=str(dataroot) if dataroot else None, name=name
    )
    result = json.loads(out.read_text())
    result["_exit_code"] = code
    return result


def recorded_level(load, value, requests, warmup=0):
    """A server-scenario level as ``serving_load.levels[]`` records it (llm_server), from
    ``requests`` = ``[(send_s, ttft_s, tpot_s, output_tokens)]``: every token ``tpot_s``
    after the one before, 100 prompt tokens, no error."""
    cols = {k: [] for k in ("send_s", "ttft_s", "e2e_s", "prompt_tokens", "output_tokens")}
    cols.update(itl_us=[], error=[])
    for send, ttft, tpot, out in requests:
        cols["send_s"].append(send)
        cols["ttft_s"].append(ttft)
        cols["e2e_s"].append(ttft + (out - 1) * tpot)
        cols["prompt_tokens"].append(100)
        cols["output_tokens"].append(out)
        cols["itl_us"].append([round(tpot * 1e6)] * (out - 1))
        cols["error"].append(None)
    return {"load": load, "value": value, "warmup": warmup, "duration_s": 10.0, "requests": cols}


def steady_samples(result):
    """Samples not flagged as warm-up."""
    return [s for s in result["timings"]["train"]["samples"] if not s["warmup"]]


# A window shorter than any step makes every step its own sample, so "at least 2
# steady samples" means "at least 3 steps" whatever the machine's speed.
SMOKE_ARGS = ["--sample-duration", "0.001", "--warmup", "1"]


# --- The local test cluster (scripts/slurm-local.sh, scripts/sshd-local.sh) ---


def venv_python():
    """The python of the repository being tested (``<repo>/.venv/bin/python``), else this one.

    An absolute path, so that a command started over ssh or srun finds torch.
    """
    py = ROOT / ".venv" / "bin" / "python"
    return str(py) if py.exists() else sys.executable


def cluster_skip(reason):
    """Skip a test that needs the local cluster, or fail it when $MILARUN_REQUIRE_CLUSTER=1
    (set by .ci/run)."""
    if os.environ.get("MILARUN_REQUIRE_CLUSTER") == "1":
        pytest.fail(f"cluster test cannot run but MILARUN_REQUIRE_CLUSTER=1: {reason}")
    pytest.skip(reason)


def read_env_file(path):
    """The ``export NAME=VALUE`` lines of a state folder's ``env`` file, as a dict (shell
    quoting undone)."""
    values = {}
    for line in Path(path).read_text().splitlines():
        if line.startswith("export ") and "=" in line:
            name, _, value = line[len("export ") :].partition("=")
            values[name] = " ".join(shlex.split(value))
    return values


@dataclass(frozen=True)
class SlurmCluster:
    """The running two-node cluster of scripts/slurm-local.sh.

    ``env`` is this process's environment with ``SLURM_CONF`` pointing at the cluster and no
    other ``SLURM_*`` variable (so an enclosing allocation cannot leak in): pass it to
    srun/sbatch/scancel/scontrol. ``nodes`` are the Slurm node names, ``partition`` the default one.
    """

    state: Path
    conf: Path
    env: dict
    nodes: tuple = ("node1", "node2")
    partition: str = "debug"


@dataclass(frozen=True)
class SshNodes:
    """The sshd of scripts/sshd-local.sh: two node names (``nodes``) that are both this host.

    ``port``: int; ``key``: the client private key; ``known_hosts``: holds the host key under both
    names; ``config``: an ssh client config (``ssh -F config NODE CMD``) with all of these set.
    """

    state: Path
    port: int
    user: str
    key: Path
    known_hosts: Path
    config: Path
    nodes: tuple

    def ssh_argv(self, node, command):
        """The OpenSSH argv that runs the shell string ``command`` on ``node`` with no prompt."""
        return [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "IdentitiesOnly=yes",
            "-i",
            str(self.key),
            "-p",
            str(self.port),
            f"{self.user}@{node}",
            command,
        ]


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local two-node Slurm cluster (``SlurmCluster``); skips, or fails under
    $MILARUN_REQUIRE_CLUSTER=1, when it is not up. Its state folder is $MILARUN_SLURM_STATE,
    else /tmp/milarun-slurm (the default of scripts/slurm-local.sh)."""
    state = Path(os.environ.get("MILARUN_SLURM_STATE") or "/tmp/milarun-slurm")
    hint = "start it with: sudo scripts/slurm-local.sh start"
    for tool in ("srun", "sbatch", "scancel", "scontrol", "sinfo"):
        if shutil.which(tool) is None:
            cluster_skip(f"{tool} not installed (scripts/install-cluster-packages.sh)")
    if not (state / "env").is_file():
        cluster_skip(f"no local Slurm cluster ({state}/env missing); {hint}")
    conf = Path(read_env_file(state / "env")["SLURM_CONF"])
    # A stale state folder: sinfo would retry a dead controller for ~10 s, so check its pid first.
    pid_file = state / "run" / "slurmctld.pid"
    try:
        comm = Path(f"/proc/{int(pid_file.read_text())}/comm").read_text().strip()
    except (OSError, ValueError):
        comm = None
    if comm != "slurmctld":
        cluster_skip(f"local Slurm cluster not running (no live slurmctld in {pid_file}); {hint}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(conf)
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"],
            env=env,
            capture_output=True,
            text=True,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        cluster_skip(f"sinfo did not answer in 20 s (SLURM_CONF={conf}); {hint}")
    states = dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)
    cluster = SlurmCluster(state=state, conf=conf, env=env)
    # alloc/mix: in service, only busy with another test's job.
    down = [n for n in cluster.nodes if states.get(n) not in ("idle", "alloc", "mix", "comp")]
    if out.returncode != 0 or down:
        cluster_skip(
            f"local Slurm cluster not up (SLURM_CONF={conf}): sinfo exit {out.returncode}, "
            f"node states {states}, {out.stderr.strip()[-200:]}; {hint}"
        )
    return cluster


@pytest.fixture(scope="session")
def ssh_nodes():
    """The local sshd (``SshNodes``); skips, or fails under $MILARUN_REQUIRE_CLUSTER=1, when ssh
    in BatchMode to either node name does not work. Its state folder is $MILARUN_SSH_STATE, else
    /tmp/milarun-sshd (the default of scripts/sshd-local.sh)."""
    state = Path(os.environ.get("MILARUN_SSH_STATE") or "/tmp/milarun-sshd")
    hint = "start it with: sudo scripts/sshd-local.sh start"
    if shutil.which("ssh") is None:
        cluster_skip("ssh not installed (scripts/install-cluster-packages.sh)")
    if not (state / "env").is_file():
        cluster_skip(f"no local sshd ({state}/env missing); {hint}")
    values = read_env_file(state / "env")
    nodes = SshNodes(
        state=state,
        port=int(values["MILARUN_SSH_PORT"]),
        user=values["MILARUN_SSH_USER"],
        key=Path(values["MILARUN_SSH_KEY"]),
        known_hosts=Path(values["MILARUN_SSH_KNOWN_HOSTS"]),
        config=Path(values["MILARUN_SSH_CONFIG"]),
        nodes=tuple(values["MILARUN_SSH_NODES"].split()),
    )
    for node in nodes.nodes:
        try:
            out = subprocess.run(
                nodes.ssh_argv(node, "true"),
                capture_output=True,
                text=True,
                timeout=20,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            cluster_skip(f"ssh to {node}:{nodes.port} did not answer in 20 s; {hint}")
        if out.returncode != 0:
            cluster_skip(f"ssh to {node}:{nodes.port} fails ({out.stderr.strip()[-200:]}); {hint}")
    return nodes


MEMORY = "2G"  # per student: small enough for a quick OOM, big enough for the cpu profile


@pytest.fixture(scope="module")
def students():
    """Student cgroups student0 and student1 (2 GiB each), created for the module and
    removed after it (or given back their default split when they existed before).
    Yields ``{group: [cpu ids]}``; skips (fails under $MILARUN_REQUIRE_CGROUPS=1) without root,
    cgexec or cgroups."""
    if os.geteuid() != 0:
        cgroup_skip("needs root to create cgroups")
    if shutil.which("cgexec") is None:
        cgroup_skip("cgexec not installed (scripts/install-apt-packages.sh)")
    if isolation.cgroup_version() is None:
        cgroup_skip("no cgroup v1 cpuset or v2 hierarchy under /sys/fs/cgroup")
    if len(os.sched_getaffinity(0)) < 2:
        cgroup_skip("needs at least 2 CPUs for 2 exclusive students")
    existed = not isolation.missing_groups(["cpuset,memory:student0", "cpuset,memory:student1"])
    setup = subprocess.run(
        ["bash", "scripts/cgroup_setup.sh", "--students", "2", "--memory", MEMORY],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if setup.returncode != 0:
        cgroup_skip(f"cgroup_setup.sh failed: {setup.stderr.strip()}")
    plan = {}
    for line in setup.stdout.splitlines():
        group, rest = line.split(":", 1)
        cpus = rest.split()[0].split("=")[1]
        plan[group] = isolation.parse_cpus(cpus)
    yield plan
    # Leave the host as found: remove the students we created, or give
    # existing ones back the default split (RAM/N) instead of our 2 GiB.
    undo = ["--remove"] if not existed else []
    subprocess.run(
        ["bash", "scripts/cgroup_setup.sh", "--students", "2", *undo], cwd=ROOT, capture_output=True
    )


#: One short per-gpu launch of a torch-free workload: a real session, records and chain.
CRAWL_PROFILE = {
    "ok": {
        "experiment": "milarun.models.faults:crawl",
        "partition_scheme": {"type": "per-gpu"},
        "arguments": {
            "sample-duration": 0.1,
            "step-seconds": 0.01,
            "warmup": 2,
            "min-steady": 1,
            "max-count": 100,
        },
    },
}


def crawl_run(base, name="run"):
    """Run :data:`CRAWL_PROFILE` (the suite "tiny") with ``milarun jobs`` on one CPU slot into
    ``base/name`` (data in ``base/data``); returns that results folder."""
    (base / "data").mkdir(exist_ok=True)
    profile = base / "tiny.json"  # the suite "tiny": records tiny.ok.*.json
    profile.write_text(json.dumps(CRAWL_PROFILE))
    out = base / name
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "milarun",
            "jobs",
            str(profile),
            "--no-cgexec",
            "--cpu-slots",
            "1",
            "-d",
            str(base / "data"),
            "-o",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    return out
