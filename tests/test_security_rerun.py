"""Security, reruns: ``milarun rerun`` of a record from elsewhere runs no code the
record names. Every payload here would create a marker file; each test asserts
the marker is absent (and, where the child must run, that it did)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from milarun.cli import main
from milarun.formats import trust
from milarun.host import facts as hostfacts
from milarun.launcher.rerun import SAFE_PATH, record_environ, rerun_command

CRAWL = "milarun.models.faults:crawl"
FAST = ["--max-count", "2", "--step-seconds", "0.01", "--warmup", "0"]


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code, capsys.readouterr()


def foreign_record(folder, function=CRAWL, environ=None, argv=FAST):
    """A valid record, as a vendor's folder would hold it (never written by milarun here)."""
    from milarun.formats.record import new_result

    rec = new_result("vendor.crawl", "0.0")
    rec["call"] = {"function": function, "argv": list(argv), "arguments": {}}
    rec["environ"] = dict(environ or {})
    rec["success"] = True
    path = Path(folder) / "vendor.crawl.J0.0.20261101-000000-000000.json"
    path.write_text(json.dumps(rec))
    return path


@pytest.fixture
def signed(tmp_path):
    """A record this host's milarun wrote (run in-process: fast), and its output folder."""
    from milarun.cli.run import run_experiment

    path = tmp_path / "mine.json"
    assert run_experiment(CRAWL, FAST, out=str(path), name="mine.crawl") == 0
    return path


def test_hostile_environ_is_dropped_and_its_payloads_do_not_run(tmp_path, capsys, monkeypatch):
    # git's core.fsmonitor (host facts run git), LD_PRELOAD and a sitecustomize.py on a
    # PYTHONPATH that points into the results folder, and a package milarun/ in the
    # results folder, the current one (python -m milarun): each would touch its marker
    results = tmp_path / "results"
    (results / "milarun").mkdir(parents=True)
    (results / "milarun" / "__init__.py").write_text(
        f"open({str(tmp_path / 'package-ran')!r}, 'w').close()\n"
    )
    (results / "sitecustomize.py").write_text(
        f"open({str(tmp_path / 'site-ran')!r}, 'w').close()\n"
    )
    environ = {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "core.fsmonitor",
        "GIT_CONFIG_VALUE_0": f"touch {tmp_path / 'git-ran'}; false",
        "PYTHONPATH": str(results),
        "MILARUN_DEVICE": "0",
        "CUDA_VISIBLE_DEVICES": "",
    }
    markers = ["git-ran", "site-ran", "package-ran"]
    if shutil.which("gcc"):
        src = tmp_path / "p.c"
        src.write_text(
            "#include <stdio.h>\n__attribute__((constructor)) static void p(void)"
            f'{{ fclose(fopen("{tmp_path / "preload-ran"}", "w")); }}\n'
        )
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-o", str(results / "p.so"), str(src)], check=True
        )
        environ["LD_PRELOAD"] = str(results / "p.so")
        markers.append("preload-ran")
    path = foreign_record(results, environ=environ)
    monkeypatch.chdir(results)
    out = tmp_path / "again.json"
    code, io = run_cli(["rerun", str(path), "--yes", "-o", str(out)], capsys)
    assert [m for m in markers if (tmp_path / m).exists()] == []
    assert code == 0, io.err
    assert json.loads(out.read_text())["success"] is True  # the child ran, host facts too
    dropped = next(line for line in io.err.splitlines() if "not taken from" in line)
    for name in set(environ) - {"MILARUN_DEVICE", "CUDA_VISIBLE_DEVICES"}:
        assert name in dropped
    assert "milarun: rerun: CUDA_VISIBLE_DEVICES='' MILARUN_DEVICE=0 " in io.err


@pytest.mark.parametrize(
    "name,value",
    [
        ("CUDA_VISIBLE_DEVICES", "0\nLD_PRELOAD=/tmp/x.so"),
        ("MILARUN_NODE", "a b"),
        ("OMP_NUM_THREADS", "1" * 2000),
        ("MILARUN_BACKEND", "cpu\0"),
        ("MILARUN_DEVICE", 5),
        ("NCCL_NET_PLUGIN", "/tmp/x.so"),
        ("MILARUN_WRITTEN", "/tmp/registry"),
        ("MILARUN_PDEATHSIG", "1"),
        ("MILARUN_BARRIER", "127.0.0.1:9"),
    ],
)
def test_only_plain_values_of_the_variables_milarun_sets_are_taken(name, value, monkeypatch):
    monkeypatch.delenv(name, raising=False)
    record = {
        "name": "a.b",
        "call": {"function": CRAWL, "argv": []},
        "environ": {name: value, "MILARUN_RUN": "3"},
    }
    assert record_environ(record) == ({"MILARUN_RUN": "3"}, [name])
    _, env = rerun_command(record, python="python")
    assert name not in env and env["MILARUN_RUN"] == "3"


@pytest.mark.parametrize(
    "function",
    ["evil:main", "milarun.models.evil:main", "milarun.models.faults.x:crawl", "os:system"],
)
def test_a_function_outside_milarun_models_is_not_imported(tmp_path, capsys, monkeypatch, function):
    # evil.py in the current folder (the results folder), and a milarun/models/evil.py
    # beside it: neither is imported, even with --yes
    payload = f"open({str(tmp_path / 'imported')!r}, 'w').close()\ndef main(e, a): pass\n"
    (tmp_path / "evil.py").write_text(payload)
    (tmp_path / "milarun" / "models").mkdir(parents=True)
    (tmp_path / "milarun" / "models" / "evil.py").write_text(payload)
    path = foreign_record(tmp_path, function=function)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, io = run_cli(["rerun", str(path), "--yes", "-o", str(tmp_path / "o.json")], capsys)
    assert code == 2
    assert io.err.startswith(f"milarun: error: {path}: call.function: ")
    assert "--function MODULE:FUNCTION" in io.err and "Traceback" not in io.err
    assert not (tmp_path / "imported").exists() and not (tmp_path / "o.json").exists()


def test_python_m_milarun_run_does_not_import_from_the_current_folder(tmp_path):
    (tmp_path / "evil.py").write_text(
        f"open({str(tmp_path / 'imported')!r}, 'w').close()\ndef main(e, a): pass\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    proc = subprocess.run(
        [sys.executable, "-m", "milarun", "run", "evil:main"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("milarun: error: cannot import module 'evil'")
    assert not (tmp_path / "imported").exists()


def test_a_foreign_record_without_yes_is_shown_and_not_run(tmp_path, capsys):
    assert trust.remember(b"a record of ours")  # the registry exists, without this one
    path = foreign_record(tmp_path)
    out = tmp_path / "o.json"
    code, io = run_cli(["rerun", str(path), "-o", str(out)], capsys)
    assert code == 2 and not out.exists()
    lines = io.err.splitlines()
    assert f" {SAFE_PATH} -m milarun run {CRAWL} -o {out} " in lines[-2]
    assert lines[-1] == (
        f"milarun: error: {path}: not run: it was not written by this host's milarun (or was "
        "changed since); read the command above and pass --yes to run it"
    )
    # --dry-run never runs anything, and says a run would need --yes
    code, io = run_cli(["rerun", str(path), "-o", str(out), "--dry-run"], capsys)
    assert code == 0 and not out.exists()
    assert io.err.splitlines()[-1].startswith("milarun: rerun: (dry run) it would need --yes")


def test_a_record_written_here_runs_and_a_changed_one_needs_yes(signed, tmp_path, capsys):
    out = tmp_path / "again.json"
    code, io = run_cli(["rerun", str(signed), "-o", str(out), "--dry-run"], capsys)
    assert code == 0 and "would need --yes" not in io.err
    code, io = run_cli(["rerun", str(signed), "-o", str(out)], capsys)
    assert code == 0, io.err
    assert json.loads(out.read_text())["name"] == "mine.crawl"
    # the rerun's own record is known too; one changed byte makes a record foreign
    assert trust.written_here(out.read_bytes())[0]
    text = signed.read_text()
    tampered = tmp_path / "tampered.json"
    tampered.write_text(text.replace('"0.01"', '"0.02"', 1))
    assert tampered.read_text() != text
    code, io = run_cli(["rerun", str(tampered), "-o", str(tmp_path / "t.json")], capsys)
    assert code == 2 and "pass --yes" in io.err and not (tmp_path / "t.json").exists()


def test_a_registry_others_can_write_vouches_for_nothing(tmp_path):
    registry = tmp_path / "written.sha256"
    assert trust.remember(b"record", registry)
    assert registry.stat().st_mode & 0o777 == 0o600
    assert trust.written_here(b"record", registry) == (True, None)
    assert not trust.written_here(b"record!", registry)[0]
    registry.chmod(0o622)
    ok, why = trust.written_here(b"record", registry)
    assert not ok and why == f"{registry} is not a private file of this user"


def test_user_named_function_replaces_the_records(tmp_path, capsys):
    path = foreign_record(tmp_path, function="evil:main")
    code, io = run_cli(["rerun", str(path), "--function", CRAWL, "--dry-run"], capsys)
    assert code == 0 and f" -m milarun run {CRAWL} " in io.err and "evil" not in io.err
    code, io = run_cli(["rerun", str(path), "--function", "m:f;touch x", "--dry-run"], capsys)
    assert code == 2 and "must look like 'module:function'" in io.err


def test_the_printed_command_shows_control_characters(tmp_path, capsys):
    path = foreign_record(tmp_path, argv=["--note", "a\n\x1b[2Kmilarun: rerun: ok"])
    code, io = run_cli(["rerun", str(path), "--dry-run"], capsys)
    assert code == 0 and "\x1b" not in io.err
    assert "--note $'a\\x0a\\x1b[2Kmilarun: rerun: ok'" in io.err


def _repo(tmp_path):
    """A clone holding a package ``milarun``, whose .git/config names an fsmonitor payload."""
    repo = tmp_path / "clone"
    (repo / "milarun").mkdir(parents=True)
    (repo / "milarun" / "a.py").write_text("x = 1\n")
    git = ["git", "-c", "user.email=a@b", "-c", "user.name=n", "-C", str(repo)]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "i"], check=True)
    subprocess.run(
        git + ["config", "core.fsmonitor", f"touch {tmp_path / 'repo-ran'}; false"], check=True
    )
    return repo


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_host_facts_run_git_without_the_environments_config(tmp_path, monkeypatch):
    repo = _repo(tmp_path)
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "core.fsmonitor")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", f"touch {tmp_path / 'env-ran'}; false")
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "nowhere"))
    monkeypatch.chdir(tmp_path)
    src = hostfacts.milarun_source(repo / "milarun")
    assert len(src["milarun_commit"] or "") == 40 and src["milarun_dirty"] is False
    assert not (tmp_path / "env-ran").exists()
    assert not (tmp_path / "repo-ran").exists()  # core.fsmonitor=false beats .git/config


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_host_facts_do_not_run_git_in_a_clone_someone_else_owns(tmp_path, monkeypatch):
    repo = _repo(tmp_path)
    owner = (repo / ".git").stat().st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)  # the clone is someone else's
    src = hostfacts.milarun_source(repo / "milarun")
    assert src["milarun_commit"] is None and not (tmp_path / "repo-ran").exists()


def test_a_cgroup_template_with_a_format_spec_is_not_expanded():
    from milarun.launcher.rerun import student_cgroup

    record = {
        "device": "1",
        "host": {"cgroup": "/student1"},
        "job": {"partition_scheme": {"cgroup": "cpuset:student{device:>999999999}"}},
    }
    assert student_cgroup(record) == (
        None,
        "its cgroup template 'cpuset:student{device:>999999999}' does not expand",
    )


def test_no_home_means_no_registry_not_one_in_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    environ = {"XDG_CONFIG_HOME": "rel"}
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(os.path, "expanduser", lambda p: p)  # no home: "~" stays
    assert trust.registry_path(environ) is None
    monkeypatch.delenv(trust.ENV)
    assert trust.remember(b"x") is False and list(tmp_path.iterdir()) == []
    assert trust.written_here(b"x")[0] is False


# Found by the hostile review of the first fix.


@pytest.mark.parametrize("where", ["argv", "dataroot"])
def test_option_values_are_never_evaluated(tmp_path, capfd, where):
    # coleo evaluates ":module:code" for every option not typed str; milarun.bench.literal_options
    # takes every value literally, for the workloads' options and milarun's own
    marker = tmp_path / "evaluated"
    payload = f":os:system('touch {marker}') or 0.01"
    argv = (
        ["--max-count", "2", "--warmup", "0", "--step-seconds", payload]
        if where == "argv"
        else FAST
    )
    path = foreign_record(tmp_path, argv=argv)
    if where == "dataroot":
        rec = json.loads(path.read_text())
        rec["dataroot"] = payload
        path.write_text(json.dumps(rec))
    code, io = run_cli(["rerun", str(path), "--yes", "-o", str(tmp_path / "o.json")], capfd)
    assert not marker.exists()
    if where == "argv":  # a float option: the value is not a number
        assert code != 0 and "invalid float value" in io.err
    else:  # an untyped option: the value is the text itself
        assert code == 0, io.err
        assert json.loads((tmp_path / "o.json").read_text())["dataroot"] == payload


def test_a_cgroup_path_that_climbs_out_is_not_entered():
    from milarun.launcher.rerun import student_cgroup

    record = {
        "device": "0",
        "host": {"cgroup": "cpu:../../../../tmp/x"},
        "job": {"partition_scheme": {"cgroup": "cpu:../../../../tmp/x"}},
    }
    spec, why = student_cgroup(record)
    assert spec is None and "not a plain controllers:group name" in why


def test_cgroup_lines_show_escape_sequences_escaped():
    from milarun.launcher.rerun import student_cgroup

    record = {
        "device": "0",
        "host": {"cgroup": "/\x1b]0;pwned\x07\x1b[1A"},
        "job": {"partition_scheme": {"cgroup": "cpu:/\x1b[2J\x1b[8mALL-GOOD"}},
    }
    spec, why = student_cgroup(record)
    assert spec is None and "\x1b" not in why and "\\x1b" in why
    record["job"]["partition_scheme"]["cgroup"] = "cpu:student{device}"
    spec, why = student_cgroup(record)
    assert spec is None and "\x1b" not in why and "\x07" not in why


def test_a_nul_or_an_oversized_command_is_one_line(tmp_path, capsys):
    path = foreign_record(tmp_path, argv=FAST + ["a\0b"])
    code, io = run_cli(["rerun", str(path), "--yes"], capsys)
    assert code == 2 and "Traceback" not in io.err
    assert io.err.splitlines()[-1].startswith(f"milarun: error: {path}: its command")
    # each argument within the schema's bound, together past the kernel's (E2BIG)
    path = foreign_record(tmp_path, argv=FAST + ["--x" + "a" * 65000] * 40)
    code, io = run_cli(["rerun", str(path), "--yes", "--no-cgexec"], capsys)
    assert code == 2 and "Traceback" not in io.err
    assert io.err.splitlines()[-1].startswith(f"milarun: error: {path}: cannot start the command")


@pytest.mark.parametrize("out", ["/dev/full", "afile/x"])
def test_run_refuses_an_output_it_cannot_write_before_training(tmp_path, capsys, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    code, io = run_cli(["run", CRAWL, "-o", out, "--"] + FAST, capsys)
    assert code == 2 and "Traceback" not in io.err
    assert io.err.strip().splitlines() == [
        f"milarun: error: -o {out}: {out.split('/x')[0]} is not a folder; the result could "
        "not be written"
    ]
    assert os.stat("/dev/full").st_mode & 0o170000 == 0o020000  # still a device


def test_slurm_output_folder_is_not_a_symlink(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "so").mkdir()
    (tmp_path / "victim").mkdir()
    (tmp_path / "so" / "logs").symlink_to(tmp_path / "victim")
    code, io = run_cli(
        ["slurm", "profiles/cpu.json", "-o", str(tmp_path / "so"), "-d", str(tmp_path / "data")],
        capsys,
    )
    assert code == 2 and "is a symbolic link" in io.err
    assert list((tmp_path / "victim").iterdir()) == []
