"""Hostile paths where milarun reads and writes (security: outputs and inputs).

Outputs (``--html``, ``summary -o``, the lock, logs, journals) never follow a
symlink nor replace a FIFO or device; inputs (profile, ``--system``,
``--weights``, ``--compare``, ``session.json``) are read only from regular
files, bounded, and a FIFO never blocks. Each is one line, exit 2. A record
symlinked from outside a results folder is not scored. Nothing here writes to a
real device: /dev/null is only ever the target of a symlink, and is checked to
still be a character device afterwards.
"""

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_bad_inputs import GOOD_RESULT, OK_JOB, RESULTS, cli, deep, write

from milarun.formats.outfile import UnsafeFileError, open_append, write_atomic

#: Seconds a command may take before it counts as hanging.
HANG_S = 30


def milarun(*args, cwd=None):
    """Run ``python -m milarun ARGS`` in a subprocess (a hang cannot stall the tests);
    return (exit code, stderr, seconds)."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "milarun", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        stdin=subprocess.DEVNULL,
    )
    return proc.returncode, proc.stderr, time.monotonic() - t0


def results_copy(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    shutil.copy(GOOD_RESULT, out)
    return out


@pytest.fixture(autouse=True)
def dev_null_stays_a_device():
    yield
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


# --- outputs: never replace a FIFO or device, never write through a symlink -------


def test_html_at_a_fifo_or_a_symlink_to_a_device_is_refused(tmp_path, capsys):
    results = results_copy(tmp_path)
    fifo = tmp_path / "page.html"
    os.mkfifo(fifo)
    code, err = cli(["report", results, "--html", fifo], capsys)
    assert (code, err) == (
        2,
        f"milarun: error: {fifo}: is a FIFO, not a regular file; "
        "not replaced (choose another path)\n",
    )
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    link = tmp_path / "null.html"
    link.symlink_to("/dev/null")
    code, err = cli(["report", results, "--html", link], capsys)
    assert (code, err) == (
        2,
        f"milarun: error: {link}: is a symbolic link; milarun does not "
        "write through links (remove it or choose another path)\n",
    )
    assert os.readlink(link) == "/dev/null"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_summary_output_at_a_fifo_is_refused(tmp_path):
    results = results_copy(tmp_path)
    fifo = tmp_path / "s.json"
    os.mkfifo(fifo)
    code, err, _ = milarun("summary", results, "-o", fifo)
    assert (code, err) == (
        2,
        f"milarun: error: {fifo}: is a FIFO, not a regular file; "
        "not replaced (choose another path)\n",
    )
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_summary_output_symlink_to_an_outside_file_is_not_replaced(tmp_path, capsys):
    results = results_copy(tmp_path)
    victim = write(tmp_path / "victim.txt", "KEEP\n")
    link = tmp_path / "s.json"
    link.symlink_to(victim)
    code, err = cli(["summary", results, "-o", link], capsys)
    assert code == 2 and err.count("\n") == 1 and "is a symbolic link" in err
    assert victim.read_text() == "KEEP\n" and link.is_symlink()


def test_target_swapped_for_a_fifo_while_writing_is_not_replaced(tmp_path, monkeypatch):
    # the second check, right before the rename
    target = tmp_path / "out.json"
    real_fdopen = os.fdopen

    def fdopen_then_swap(*args, **kw):
        if not target.exists():
            os.mkfifo(target)
        return real_fdopen(*args, **kw)

    monkeypatch.setattr(os, "fdopen", fdopen_then_swap)
    with pytest.raises(UnsafeFileError, match="is a FIFO"):
        write_atomic(target, "{}")
    assert stat.S_ISFIFO(os.lstat(target).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary left


def _jobs_folder(tmp_path):
    profile = write(tmp_path / "p.json", {"a": OK_JOB})
    (tmp_path / "d").mkdir()
    out = tmp_path / "out"
    (out / ".milarun").mkdir(parents=True)
    return profile, out


def test_lock_symlink_to_an_outside_file_is_refused_and_not_truncated(tmp_path, capsys):
    profile, out = _jobs_folder(tmp_path)
    victim = write(tmp_path / "victim.txt", "KEEP\n")
    lock = out / ".milarun" / "lock"
    lock.symlink_to(victim)
    code, err = cli(["jobs", profile, "-o", out, "-d", tmp_path / "d", "--no-cgexec"], capsys)
    assert (code, err) == (
        2,
        f"milarun: error: {lock}: is a symbolic link; milarun does not "
        "write through links (remove it or choose another path)\n",
    )
    assert victim.read_text() == "KEEP\n"
    assert sorted(p.name for p in out.rglob("*")) == [".milarun", "lock"]  # nothing ran


def test_dry_run_names_a_symlinked_lock_too(tmp_path, capsys):
    profile, out = _jobs_folder(tmp_path)
    lock = out / ".milarun" / "lock"
    lock.symlink_to(write(tmp_path / "victim.txt", "KEEP\n"))
    code, err = cli(
        ["jobs", profile, "-o", out, "-d", tmp_path / "d", "--no-cgexec", "--dry-run"], capsys
    )
    assert code == 2
    assert err.startswith(f"milarun: error: {lock}: is a symbolic link; ")


def test_meta_folder_symlinked_outside_is_refused(tmp_path, capsys):
    profile, out = _jobs_folder(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / ".milarun").rmdir()
    (out / ".milarun").symlink_to(elsewhere)
    code, err = cli(["jobs", profile, "-o", out, "-d", tmp_path / "d", "--no-cgexec"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"{out / '.milarun'}: is a symbolic link" in err
    assert list(elsewhere.iterdir()) == []


def test_log_and_journal_symlinks_are_not_appended_to(tmp_path):
    from milarun.formats.journal import Journal
    from milarun.launcher.prepare import run_prepare

    victim = write(tmp_path / "victim.txt", "KEEP\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "t.job.J0.prepare.log"
    log.symlink_to(victim)
    with pytest.raises(UnsafeFileError, match="is a symbolic link"):
        run_prepare(["echo APPENDED"], {}, log, echo=False)
    (tmp_path / "j.journal.jsonl").symlink_to(victim)
    journal = Journal(tmp_path / "j.journal.jsonl")
    journal.write("start", start=0)
    assert "is a symbolic link" in str(journal.error)
    assert victim.read_text() == "KEEP\n"


def test_launch_log_symlink_is_not_appended_to(tmp_path):
    from test_launch import launch

    from milarun.launcher.child import Child

    victim = write(tmp_path / "victim.txt", "KEEP\n")
    lch = launch(tmp_path, "print('APPENDED')")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / lch.log).symlink_to(victim)
    child = Child(lch, tmp_path)
    assert child.log is None and "is a symbolic link" in child.log_error
    assert victim.read_text() == "KEEP\n"


def test_sbatch_script_symlink_is_not_written_through(tmp_path):
    from conftest import ROOT

    from milarun.cli import slurm as slurm_cli
    from milarun.errors import SetupError

    (tmp_path / "d").mkdir()
    out = tmp_path / "r"
    out.mkdir()
    victim = write(tmp_path / "victim.txt", "KEEP\n")
    (out / "milarun.sbatch").symlink_to(victim)
    with pytest.raises(SetupError, match="milarun.sbatch: is a symbolic link"):
        slurm_cli.slurm(
            str(ROOT / "profiles/cpu.json"),
            [],
            dataroot=str(tmp_path / "d"),
            out=str(out),
            sbatch="/nonexistent/sbatch",
        )
    assert victim.read_text() == "KEEP\n"


def test_profile_trace_symlink_is_not_written_through(tmp_path):
    from test_io_study import FakeClock, FakeExp, FakeProfiler

    from milarun.bench.rate import RateLogger
    from milarun.bench.trace import ProfileTrace

    victim = write(tmp_path / "victim.txt", "KEEP\n")
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "rec.trace.json").symlink_to(victim)
    clock = FakeClock()
    exp = FakeExp(tmp_path / "rec.json")
    logger = RateLogger(sample_duration=1.0, max_count=300, warmup=2, host_clock=clock, origin=0.0)
    logger.tracer = ProfileTrace(exp, "traces", 5, profiler=lambda a: FakeProfiler(a, clock, 0))
    for step in logger.steps():
        clock.t += 0.1
        step.set_count(10)
    trace = exp.result["profile_trace"]
    assert trace["path"] is None and "is a symbolic link" in trace["note"]
    assert victim.read_text() == "KEEP\n"


def test_append_to_a_fifo_does_not_block(tmp_path):
    fifo = tmp_path / "x.log"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError, match="is a FIFO"):
        open_append(fifo)


# --- inputs: only regular files, bounded, never blocking -------------------------


def _fifo(tmp_path, name):
    path = tmp_path / name
    os.mkfifo(path)
    return path


def _one_line_exit_2(result, path, message):
    code, err, seconds = result
    assert (code, err) == (2, f"milarun: error: {path}: {message}\n")
    assert seconds < HANG_S


FIFO = "is a FIFO, not a regular file; not read"


def test_fifo_as_profile(tmp_path):
    path = _fifo(tmp_path, "p.json")
    _one_line_exit_2(milarun("jobs", path, "--dry-run"), path, FIFO)


def test_fifo_as_system_file(tmp_path):
    profile = write(tmp_path / "p.json", {"a": OK_JOB})
    path = _fifo(tmp_path, "system.json")
    _one_line_exit_2(milarun("jobs", profile, "--system", path, "--dry-run"), path, FIFO)


@pytest.mark.parametrize("option", ["--weights", "--compare"])
def test_fifo_as_weights_or_baseline(tmp_path, option):
    path = _fifo(tmp_path, "x.json")
    _one_line_exit_2(milarun("report", RESULTS, option, path), path, FIFO)


def test_symlink_loop_as_input_is_one_line(tmp_path, capsys):
    loop = tmp_path / "w.json"
    loop.symlink_to(loop)
    code, err = cli(["report", RESULTS, "--weights", loop], capsys)
    assert (code, err) == (
        2,
        f"milarun: error: {loop}: too many levels of symbolic links (a symlink loop)\n",
    )


def test_broken_symlink_as_input_is_one_line(tmp_path, capsys):
    link = tmp_path / "base.json"
    link.symlink_to(tmp_path / "gone.json")
    code, err = cli(["report", RESULTS, "--compare", link], capsys)
    assert (code, err) == (2, f"milarun: error: {link}: a broken symbolic link\n")


def test_deep_session_file_is_one_line(tmp_path, capsys):
    profile, out = _jobs_folder(tmp_path)
    session = write(out / ".milarun" / "session.json", deep(100_000))
    code, err = cli(["jobs", profile, "--resume", out, "-d", tmp_path / "d", "--no-cgexec"], capsys)
    assert (code, err) == (2, f"milarun: error: {session}: nested deeper than 64 levels\n")
    # summary reads the session file for its provenance: no RecursionError either
    write(out / GOOD_RESULT.name, GOOD_RESULT.read_text())
    code, err = cli(["summary", out, "-o", tmp_path / "s.json"], capsys)
    assert (code, err) == (0, "")


def test_session_file_symlink_to_dev_zero_is_one_line(tmp_path):
    profile, out = _jobs_folder(tmp_path)
    session = out / ".milarun" / "session.json"
    session.symlink_to("/dev/zero")
    _one_line_exit_2(
        milarun("jobs", profile, "--resume", out, "-d", tmp_path / "d", "--no-cgexec"),
        session,
        "is a character device, not a regular file; not read",
    )


# --- records symlinked from outside the results folder are not scored ------------


def test_record_symlinked_from_outside_is_not_scored(tmp_path, capsys):
    results = results_copy(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    rec = json.loads(GOOD_RESULT.read_text())
    rec["name"] = "standard.planted"
    rec["job_name"] = "planted"
    planted = write(outside / "planted.json", rec)
    link = results / "standard.planted.J0.0.20261121-120000-000000.json"
    link.symlink_to(planted)
    inner = results / "inner.json"
    inner.symlink_to(results / GOOD_RESULT.name)  # a link inside is read
    code, err = cli(["summary", results, "-o", tmp_path / "s.json"], capsys)
    assert (code, err) == (
        0,
        f"milarun: warning: skipped {link}: a symbolic link to outside "
        "the results folder (or a broken one); not read\n",
    )
    summary = json.loads((tmp_path / "s.json").read_text())
    assert list(summary["tests"]) == ["standard.convnet"]
    assert link.name in summary["skipped"]
    assert Path(os.readlink(link)) == planted


# --- dataset manifests (build stamps, the mydataset index) in a shared dataroot ----


def test_fifo_or_deep_dataset_stamp_is_not_built_and_does_not_hang(tmp_path):
    from milarun.datasets import STAMP

    fifo_root, deep_root = tmp_path / "a", tmp_path / "b"
    (fifo_root / "mnist").mkdir(parents=True)
    os.mkfifo(fifo_root / "mnist" / STAMP)
    (deep_root / "mnist").mkdir(parents=True)
    write(deep_root / "mnist" / STAMP, deep(100_000, "{}"))
    code = (
        "import sys; from milarun.datasets import is_complete, built; "
        "print([(is_complete(r, 'mnist'), built(r, 'mnist')[0]) for r in sys.argv[1:]])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(fifo_root), str(deep_root)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == "[(False, 'incomplete'), (False, 'incomplete')]\n"


def test_fifo_mydataset_index_is_one_line(tmp_path):
    index = _fifo(tmp_path, "index.json")
    code = (
        "import sys; from milarun.datasets.mydataset import MyDataset\n"
        "try:\n    MyDataset(sys.argv[1])\nexcept ValueError as e:\n    print(e)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=HANG_S
    )
    assert proc.stdout == f"{index}: {FIFO}\n"


def test_lock_hard_linked_to_another_file_is_not_truncated(tmp_path, capsys):
    profile, out = _jobs_folder(tmp_path)
    victim = write(tmp_path / "victim.txt", "KEEP\n")
    lock = out / ".milarun" / "lock"
    os.link(victim, lock)
    code, err = cli(["jobs", profile, "-o", out, "-d", tmp_path / "d", "--no-cgexec"], capsys)
    assert (code, err) == (
        2,
        f"milarun: error: {lock}: has 1 other hard link(s); not written "
        "(remove it or choose another path)\n",
    )
    assert victim.read_text() == "KEEP\n"


def test_summary_output_that_cannot_be_written_is_one_line(tmp_path, capsys):
    results = results_copy(tmp_path)
    not_a_folder = write(tmp_path / "file", "x")
    code, err = cli(["summary", results, "-o", not_a_folder / "s.json"], capsys)
    assert (code, err) == (
        2,
        f"milarun: error: {not_a_folder / 's.json'}: cannot write (Not a directory)\n",
    )
