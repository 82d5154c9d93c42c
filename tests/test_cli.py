"""CLI: one clear line and a non-zero exit for bad input; run and rerun round trip."""

import json
import subprocess
import sys
import time

import pytest

from milarun.cli import main, split_argv

PROFILE = {
    "t": {
        "experiment": "milarun.models.toy_reg:main",
        "partition_scheme": {"type": "per-gpu", "cgroup": "cpuset,memory:nosuch{device}"},
    }
}


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code, capsys.readouterr()


def test_split_argv():
    assert split_argv(["jobs", "p", "--", "--x", "--", "y"]) == (["jobs", "p"], ["--x", "--", "y"])
    assert split_argv(["jobs"]) == (["jobs"], [])


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PROFILE))
    return path


def test_missing_dataroot(profile, capsys, monkeypatch):
    monkeypatch.delenv("MILARUN_DATAROOT", raising=False)
    code, io = run_cli(["jobs", str(profile), "-o", "/tmp/x"], capsys)
    assert code == 2
    assert io.err == "milarun: error: no dataroot: pass -d DATAROOT or set $MILARUN_DATAROOT\n"


def test_dataroot_that_does_not_exist(profile, capsys, tmp_path):
    code, io = run_cli(["jobs", str(profile), "-d", str(tmp_path / "no"), "-o", "/tmp/x"], capsys)
    assert code == 2
    assert io.err.startswith(f"milarun: error: dataroot {tmp_path / 'no'} does not exist")


def test_missing_outdir(profile, capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("MILARUN_OUTROOT", raising=False)
    code, io = run_cli(["jobs", str(profile), "-d", str(tmp_path)], capsys)
    assert code == 2
    assert io.err == (
        "milarun: error: no results directory: pass -o OUTDIR or set $MILARUN_OUTROOT\n"
    )


def test_outroot_default_is_dated(monkeypatch, tmp_path):
    from milarun.launcher.session import default_outdir

    monkeypatch.setenv("MILARUN_OUTROOT", str(tmp_path))
    assert default_outdir().startswith(str(tmp_path / "results-20"))


def test_missing_cgroups_launch_nothing(profile, capsys, tmp_path):
    out = tmp_path / "out"
    code, io = run_cli(
        ["jobs", str(profile), "-d", str(tmp_path), "-o", str(out), "--cpu-slots", "2"], capsys
    )
    assert code == 2
    assert io.err.count("\n") == 1 and "nosuch0" in io.err and "--no-cgexec" in io.err
    assert not out.exists()


def test_corrupt_result_for_rerun(tmp_path, capsys):
    bad = tmp_path / "r.json"
    bad.write_text('{"version": 1,')
    code, io = run_cli(["rerun", str(bad)], capsys)
    assert code == 2
    assert io.err.startswith(f"milarun: error: {bad}: invalid JSON")
    assert "Traceback" not in io.err


def test_run_bad_function(capsys):
    code, io = run_cli(["run", "milarun.models.toy_reg:nope"], capsys)
    assert code == 2
    assert io.err == "milarun: error: module 'milarun.models.toy_reg' has no function 'nope'\n"


def test_dataset_unknown_name_and_size(tmp_path, capsys):
    code, io = run_cli(["dataset", "imagenet22k", "-d", str(tmp_path)], capsys)
    assert code == 2 and io.err.startswith("milarun: error: unknown dataset 'imagenet22k'")
    code, io = run_cli(["dataset", "mnist", "-d", str(tmp_path), "--size", "huge"], capsys)
    assert code == 2 and "unknown size 'huge'" in io.err


def test_help_is_fast_and_does_not_import_torch():
    code = (
        "import sys, time; t=time.perf_counter(); from milarun.cli import COMMANDS; "
        "print('torch' in sys.modules, 'pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


#: What ``--help`` must not import: torch, coleo and what it pulls in (ptera, giving,
#: reactivex and asyncio, varname, codefind, which walks every code object), and
#: the report's and numbers' libraries. It costs hundreds of ms before any help shows.
HEAVY = (
    "torch",
    "coleo",
    "ptera",
    "giving",
    "reactivex",
    "asyncio",
    "varname",
    "codefind",
    "numpy",
    "pandas",
    "jinja2",
    "matplotlib",
    "jsonschema",
)


@pytest.mark.parametrize(
    "command",
    [
        None,
        "run",
        "jobs",
        "profile",
        "slurm",
        "rerun",
        "dataset",
        "devices",
        "summary",
        "report",
        "seal",
        "keygen",
        "verify",
        "tender",
        "audit",
    ],
)
def test_help_imports_nothing_heavy_and_only_its_command(command):
    from milarun.cli import COMMANDS

    assert command is None or command in COMMANDS
    argv = ["--help"] if command is None else [command, "--help"]
    code = (
        "import json, sys\nfrom milarun.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    modules = set(json.loads(out.stderr.splitlines()[-1]))
    assert out.stdout.startswith("usage: milarun")
    assert not {m.split(".")[0] for m in modules} & set(HEAVY)
    commands = {m.split(".")[2] for m in modules if m.startswith("milarun.cli.")} - {"options"}
    assert commands == (set(COMMANDS) if command is None else {command})


def test_version_prints_the_package_version(capsys):
    from importlib.metadata import version

    import milarun

    code, io = run_cli(["--version"], capsys)
    assert code == 0 and io.err == ""
    assert io.out == f"milarun {milarun.__version__}\n"
    assert milarun.__version__ == version("milarun")  # the records carry __version__
    proc = subprocess.run(
        [sys.executable, "-m", "milarun", "--version"], capture_output=True, text=True
    )
    assert (proc.returncode, proc.stdout) == (0, f"milarun {milarun.__version__}\n")


def test_version_and_a_wrong_command_import_no_command():
    """Only the help lists the commands' descriptions: ``--version`` and an error
    about the command line name the commands, and import none of them."""
    code = (
        "import json, sys\nfrom milarun.cli import main\n"
        "for argv in (['--version'], ['--vers'], ['nosuch']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    modules = set(json.loads(out.stderr.splitlines()[-1]))
    import milarun

    assert out.stdout == f"milarun {milarun.__version__}\n" * 2
    assert "invalid choice: 'nosuch'" in out.stderr
    assert {m for m in modules if m.startswith("milarun.cli.")} == {"milarun.cli.options"}


def test_a_run_imports_coleos_code_registry_before_torch(tmp_path):
    """codefind (coleo's code registry) walks every live object when first imported: after
    torch, about 1.5 s of every test process's start (benchmarks/run_startup.py)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "milarun", "run"]
        + ["milarun.models.toy_reg:main", "-o", str(tmp_path / "r.json"), "--"]
        + ["--max-count", "256", "--batch-size", "64", "--warmup", "1", "--sample-duration"]
        + ["0.001", "--min-steady", "0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # -X importtime prints a line as each import completes
    done = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()]
    done = [name for name in done if name in ("codefind", "torch")]
    assert done == ["codefind", "torch"], done


def test_run_then_rerun_with_extra_args(tmp_path):
    first = tmp_path / "first.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "milarun",
            "run",
            "milarun.models.toy_reg:main",
            "-o",
            str(first),
            "--experiment-name",
            "cli.toy",
            "--job-id",
            "4.1",
            "--",
            "--warmup",
            "0",
            "--max-count",
            "5000",
            "--batch-size",
            "16",
        ],
        check=True,
        capture_output=True,
    )
    rec = json.loads(first.read_text())
    assert rec["success"] and rec["name"] == "cli.toy" and rec["job_id"] == "4.1"
    second = tmp_path / "second.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "milarun",
            "rerun",
            str(first),
            "-o",
            str(second),
            "--",
            "--batch-size",
            "32",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "milarun: rerun:" in proc.stderr and "--batch-size 16 --batch-size 32" in proc.stderr
    again = json.loads(second.read_text())
    assert again["call"]["argv"] == [
        "--warmup",
        "0",
        "--max-count",
        "5000",
        "--batch-size",
        "16",
        "--batch-size",
        "32",
    ]
    assert again["call"]["arguments"]["batch_size"] == 32
    assert (again["name"], again["job_id"], again["run"]) == ("cli.toy", "4.1", 4)


def test_run_names_a_record_outside_a_profile_run_dot_module(tmp_path):
    from milarun.cli.run import run_experiment

    out = tmp_path / "r.json"
    assert (
        run_experiment(
            "milarun.models.faults:crawl", ["--max-count", "2", "--warmup", "0"], out=str(out)
        )
        == 0
    )
    assert json.loads(out.read_text())["name"] == "run.faults"


def test_run_refuses_a_bad_experiment_name_before_training(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                "milarun.models.faults:crawl",
                "--experiment-name",
                "../x",
                "-o",
                str(tmp_path / "r.json"),
                "--",
                "--max-count",
                "2",
            ]
        )
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        "milarun: error: --experiment-name/--job-id/--extra: name: '../x' is not a valid test "
        "name (like 'suite.test': letters, digits, '_', '-', and '.' between them)\n"
    )
    assert not (tmp_path / "r.json").exists()


def test_run_and_rerun_say_when_the_result_has_no_steady_state(tmp_path):
    # 2 steps of 0.01 s: one window, a warm-up one; no steady-state sample. The record
    # is a failure (milarun.measure.plausibility), said on stderr, and the exit status is 1.
    first = tmp_path / "first.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "milarun",
            "run",
            "milarun.models.faults:crawl",
            "-o",
            str(first),
            "--experiment-name",
            "cli.crawl",
            "--",
            "--max-count",
            "2",
            "--step-seconds",
            "0.01",
        ],
        capture_output=True,
        text=True,
    )
    said = "milarun: no-steady-state: no steady state: none of the 1 sample(s)"
    assert proc.returncode == 1 and said in proc.stderr
    assert json.loads(first.read_text())["error"]["reason"] == "no-steady-state"
    proc = subprocess.run(
        [sys.executable, "-m", "milarun", "rerun", str(first), "-o", str(tmp_path / "second.json")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and said in proc.stderr


def _cgroup_record(tmp_path, host_cgroup):
    from milarun.formats.record import new_result

    rec = new_result("cpu.toy", "0.1", device="1", devices=[1], plan_type="per-gpu")
    rec["call"]["function"] = "milarun.models.toy_reg:main"
    rec["job"] = {
        "partition_scheme": {"type": "per-gpu", "cgroup": "cpuset,memory:student{device}"}
    }
    rec["host"] = {"hostname": "h", "cgroup": host_cgroup}
    rec["success"] = True
    path = tmp_path / "r.json"
    path.write_text(json.dumps(rec))
    return path


@pytest.mark.parametrize(
    "host_cgroup,exists,cgexec,said",
    [
        (
            "cpuset:/student1,memory:/student1",
            True,
            True,
            "milarun: rerun: in student cgroup cpuset,memory:student1, as the original",
        ),
        (
            "/student1",
            True,
            True,  # cgroup v2: the unified path
            "milarun: rerun: in student cgroup cpuset,memory:student1, as the original",
        ),
        (
            "cpuset:/student1,memory:/student1",
            False,
            True,
            "milarun: rerun: not in a student cgroup: its student cgroup "
            "cpuset,memory:student1 does not exist here: sudo scripts/cgroup_setup.sh creates it",
        ),
        (
            "cpuset:/student1,memory:/student1",
            True,
            False,
            "milarun: rerun: not in a student cgroup: cgexec is not installed "
            "(package cgroup-tools) to enter cpuset,memory:student1",
        ),
        (
            "cpuset:/,memory:/",
            True,
            True,
            "milarun: rerun: not in a student cgroup: the original ran outside its student cgroup "
            "cpuset,memory:student1 (in cpuset:/,memory:/; --no-cgexec?)",
        ),
    ],
)
def test_rerun_keeps_the_original_student_cgroup_or_says_why_not(
    tmp_path, capsys, monkeypatch, host_cgroup, exists, cgexec, said
):
    import shutil

    from milarun.host import isolation

    path = _cgroup_record(tmp_path, host_cgroup)
    monkeypatch.setattr(isolation, "missing_groups", lambda specs: [] if exists else specs)
    real_which = shutil.which
    monkeypatch.setattr(
        shutil,
        "which",
        lambda name: (
            "/usr/bin/cgexec"
            if name == "cgexec" and cgexec
            else None
            if name == "cgexec"
            else real_which(name)
        ),
    )
    code, out = run_cli(["rerun", str(path), "--dry-run"], capsys)
    assert code == 0
    lines = out.err.splitlines()
    assert said in lines
    command = next(line for line in lines if line.startswith("milarun: rerun: ") and " -m " in line)
    wrapped = "/usr/bin/cgexec -g cpuset,memory:student1 " in command
    assert wrapped == said.endswith("as the original")
    # --no-cgexec: no cgroup, no line about it
    code, out = run_cli(["rerun", str(path), "--dry-run", "--no-cgexec"], capsys)
    assert "cgexec" not in out.err and "student cgroup" not in out.err


@pytest.mark.parametrize(
    "command", ["run", "jobs", "slurm", "rerun", "dataset", "summary", "report"]
)
def test_help_names_verbose_and_the_pass_through(command):
    out = subprocess.run(
        [sys.executable, "-m", "milarun", command, "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--verbose, -v" in out
    takes_args = command in ("run", "jobs", "slurm", "rerun")
    assert ("[-- ARGS ...]" in out) == takes_args
    assert ('-- ARGS               everything after the first "--" goes' in out) == takes_args
    assert out.startswith(f"usage: milarun {command} ")


def test_list_datasets_is_a_table_with_sizes_on_disk(tmp_path, capsys):
    from milarun import datasets

    datasets.prepare("bsds500", tmp_path, size="tiny", log=lambda *_: None)
    (tmp_path / "coco.partial").mkdir()
    code, out = run_cli(["dataset", "--list-datasets", "-d", str(tmp_path)], capsys)
    assert code == 0
    lines = out.out.splitlines()
    assert lines[0].split() == ["dataset", "standard", "on", "disk", "in", str(tmp_path)]
    rows = {line.split()[0]: line for line in lines[1 : 1 + len(datasets.BUILDERS)]}
    assert set(rows) == set(datasets.BUILDERS)
    bsds = rows["bsds500"].split()
    assert bsds[1:4] == ["about", "20", "MB"] and bsds[4] == "tiny,"
    assert 0 < float(bsds[5]) < 5 and bsds[6] == "MiB"
    assert rows["coco"].endswith("incomplete, 0.0 MiB")
    assert rows["mnist"].endswith("not built")
    assert "{" not in out.out  # no Python dicts
    assert "  bsds500        tiny      count=12 val_count=4 test_count=4 image_size=64" in lines


SAFE_FOLDER = r"[A-Za-z0-9._-]+"


def test_result_folder_names_are_safe_for_scp_and_windows(monkeypatch, tmp_path):
    import datetime
    import re
    from pathlib import Path

    from milarun.launcher.session import default_outdir

    monkeypatch.setenv("MILARUN_OUTROOT", str(tmp_path))
    assert re.fullmatch(SAFE_FOLDER, Path(default_outdir()).name)
    script = (Path(__file__).parent.parent / "scripts" / "quickstart.sh").read_text()
    fmt = re.search(r'outdir="\$outroot/cpu-\$\(date \'\+([^\']+)\'\)"', script).group(1)
    assert re.fullmatch(SAFE_FOLDER, "cpu-" + datetime.datetime.now().strftime(fmt))
    # and the quickstart says which cgroups it made and how to remove them
    assert "student0 and student1" in script
    assert script.count("sudo scripts/cgroup_setup.sh --remove") == 2


WORKLOAD = """
import atexit, pathlib, threading, time
from milarun.models.faults import crawl

HERE = pathlib.Path(__file__).parent

class Teardown:
    def __del__(self):  # runs only when the interpreter finalizes its modules
        (HERE / "teardown").write_text("ran")

KEEP = Teardown()

def main(exp, argv):
    atexit.register(lambda: (HERE / "atexit").write_text("ran"))
    # a stray non-daemon thread would hold a normal interpreter exit
    threading.Thread(target=time.sleep, args=(3,)).start()
    return crawl(exp, argv)
"""


@pytest.mark.parametrize("world_size", ["1", "2"])
def test_a_run_child_skips_the_interpreter_teardown_unless_it_is_a_rank(tmp_path, world_size):
    import os
    from pathlib import Path

    (tmp_path / "teardown_probe.py").write_text(WORKLOAD)
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{Path.cwd()}",
        "WORLD_SIZE": world_size,
        "RANK": "0",
    }
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "milarun",
            "run",
            "teardown_probe:main",
            "-o",
            str(tmp_path / "r.json"),
            "--",
            "--max-count",
            "12",
            "--sample-duration",
            "0.02",
            "--step-seconds",
            "0.005",
            "--warmup",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["success"] is True
    assert (tmp_path / "atexit").exists()  # atexit handlers ran either way
    if world_size == "1":
        assert not (tmp_path / "teardown").exists()  # os._exit: no module teardown
    else:
        assert (tmp_path / "teardown").exists() and elapsed >= 3  # waited for the thread


def test_a_failed_run_child_still_exits_1_on_the_fast_path(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "milarun",
            "run",
            "milarun.models.faults:flaky",
            "-o",
            str(tmp_path / "r.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "deliberate failure" in proc.stderr  # stderr flushed before os._exit
    assert json.loads((tmp_path / "r.json").read_text())["success"] is False


def test_the_fast_exit_flushes_what_c_code_printed(tmp_path):
    # os._exit skips libc's exit(), which flushes C stdio: a run by hand, stdout to a file
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "import ctypes; ctypes.CDLL(None).printf(b'from C\\n'); "
                "print('from Python'); from milarun.cli import _exit_now; _exit_now(3)",
            ],
            stdout=f,
            env=env,
            timeout=60,
        )
    assert proc.returncode == 3
    assert sorted(out.read_text().splitlines()) == ["from C", "from Python"]
