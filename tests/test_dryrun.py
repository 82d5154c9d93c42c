"""``milarun jobs --dry-run`` makes the checks of a real run and fails on the same errors."""

import json
import os
import shutil

import pytest

from milarun.cli import main
from milarun.host import isolation

TEST = {
    "experiment": "milarun.models.toy_reg:main",
    "partition_scheme": {"type": "per-gpu", "cgroup": "cpuset,memory:student{device}"},
    "prepare": ["{milarun} dataset mnist -d {dataroot}", "echo {outdir} {python}"],
}


def run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"a": TEST}))
    return path


@pytest.fixture
def env(monkeypatch, tmp_path):
    """No $MILARUN_* variables; cgexec installed; student cgroups as the test says."""
    monkeypatch.delenv("MILARUN_DATAROOT", raising=False)
    monkeypatch.delenv("MILARUN_OUTROOT", raising=False)
    real = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name: "/usr/bin/cgexec" if name == "cgexec" else real(name)
    )
    existing = {"cpuset,memory:student0", "cpuset,memory:student1"}
    monkeypatch.setattr(
        isolation, "missing_groups", lambda specs: [s for s in specs if s not in existing]
    )
    (tmp_path / "data").mkdir()
    return tmp_path


def test_missing_dataroot_and_outdir_fail_the_dry_run_as_the_real_run(profile, env, capsys):
    code, out, err = run(["jobs", profile, "--dry-run", "--cpu-slots", "2"], capsys)
    assert code == 2
    assert err.splitlines() == [
        "milarun: error: no dataroot: pass -d DATAROOT or set $MILARUN_DATAROOT",
        "milarun: error: no results directory: pass -o OUTDIR or set $MILARUN_OUTROOT",
        "milarun: --dry-run: 2 problem(s); a real run would stop at the first one",
    ]
    assert out.count("-m milarun run milarun.models.toy_reg:main") == 2  # the plan still shows
    # the real run stops on the first of them, with the same line
    code, _, real = run(["jobs", profile, "--cpu-slots", "2"], capsys)
    assert (code, real) == (2, err.splitlines()[0] + "\n")


def test_a_third_cpu_slot_needs_student2(profile, env, capsys, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    args = ["jobs", profile, "--cpu-slots", "3", "-d", env / "data", "-o", env / "out"]
    code, out, err = run(args + ["--dry-run"], capsys)
    assert code == 2
    line = (
        "milarun: error: student cgroup(s) cpuset,memory:student2 do not exist: run "
        "'sudo scripts/cgroup_setup.sh --students 3' or pass --no-cgexec"
    )
    assert err.splitlines()[0] == line
    assert "cgroup: cpuset,memory:student2" in out
    assert not (env / "out").exists()  # a dry run creates nothing
    code, _, real = run(args, capsys)
    assert (code, real) == (2, line + "\n")
    # --no-cgexec: nothing to check there
    code, out, err = run(args + ["--dry-run", "--no-cgexec"], capsys)
    assert (code, err) == (0, "")
    assert (
        out.splitlines()[-1] == "# checks passed: dataroot, results folder, cgroups, exec prefixes"
    )


def test_missing_exec_prefix_and_bad_results_folder(tmp_path, env, capsys):
    path = tmp_path / "q.json"
    path.write_text(json.dumps({"a": {**TEST, "exec_prefix": ["no-such-prefix-program"]}}))
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, err = run(
        ["jobs", path, "--dry-run", "--cpu-slots", "2", "-d", env / "data", "-o", afile], capsys
    )
    assert code == 2
    assert err.splitlines()[:2] == [
        f"milarun: error: {afile}: results directory is a file, not a folder",
        "milarun: error: exec_prefix program 'no-such-prefix-program' is not installed "
        "(scripts/install-apt-packages.sh installs nocache)",
    ]
    # a folder that holds an earlier session; --resume of one that has none
    done = tmp_path / "done"
    (done / ".milarun").mkdir(parents=True)
    (done / ".milarun" / "session.json").write_text(
        json.dumps({"format": "milarun-session", "version": 1, "invocation": {}, "sessions": []})
    )
    code, _, err = run(
        [
            "jobs",
            path,
            "--dry-run",
            "--cpu-slots",
            "2",
            "--no-cgexec",
            "-d",
            env / "data",
            "-o",
            done,
        ],
        capsys,
    )
    assert f"milarun: error: {done}: holds the results of an earlier session" in err
    code, _, err = run(
        [
            "jobs",
            path,
            "--dry-run",
            "--cpu-slots",
            "2",
            "--no-cgexec",
            "-d",
            env / "data",
            "--resume",
            env / "data",
        ],
        capsys,
    )
    assert code == 2
    assert f"milarun: error: {env / 'data'}: --resume: no milarun session here" in err


def test_placeholders_are_expanded_and_long_values_summarized(profile, env, capsys):
    import sys

    code, out, err = run(
        [
            "jobs",
            profile,
            "--dry-run",
            "--cpu-slots",
            "2",
            "-d",
            env / "data",
            "-o",
            env / "out",
            "--",
            "--max-count",
            "5",
        ],
        capsys,
    )
    assert (code, err) == (0, "")
    data, res = env / "data", env / "out"
    assert f"# prepare: {sys.executable} -m milarun dataset mnist -d {data}" in out
    assert f"# prepare: echo {res} {sys.executable}" in out
    assert "{dataroot}" not in out.replace('"job": {…}', "") and "$MILARUN" not in out
    assert f"-o {res}/p.a.J0.0." in out and f"-d {data}" in out
    # the job definition inside --extra is summarized, lines wrap with "\"
    assert out.count('"job": {…}') == 2 and "partition_scheme" not in out
    command = [line for line in out.splitlines() if not line.startswith("#")]
    assert all(
        line.endswith(" \\")
        for line in command[:-1]
        if not command[command.index(line) + 1].startswith("CUDA")
    )
    # at most 100 columns, but for the program line and a lone long path
    assert all(
        len(line) <= 100
        for line in command
        if "-m milarun run" not in line and not line.startswith(f"    -o {res}/")
    )
    assert "--max-count 5" in out


def test_job_summary_skips_braces_inside_strings():
    from milarun.plan.launches import _shorten_job

    word = '\'{"device": "0", "job": {"prepare": ["echo {a} \\"}\\""], "x": {"y": 1}}, "run": 0}\''
    assert _shorten_job(word) == '\'{"device": "0", "job": {…}, "run": 0}\''
    assert _shorten_job('"job": {"open') == '"job": {"open'  # does not close: as is
