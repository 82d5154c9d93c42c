"""The fault matrix of ``milarun jobs``, end to end: stop signals, a SIGKILLed parent,
two sessions on one folder, --resume, full and read-only disks, bad options.

Each case runs the real command in a subprocess with the torch-free fault
experiments and checks the records left behind and that no process of the
suite survives (``psutil``, by a marker in the children's environment)."""

import json
import os
import pty
import shutil
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest
from conftest import ROOT, cgroup_skip

CRAWL = {
    "experiment": "milarun.models.faults:crawl",
    "partition_scheme": {"type": "per-gpu"},
    "arguments": {"max-count": 1000000, "sample-duration": 0.1, "step-seconds": 0.01},
}


def write_profile(tmp_path, jobs, name="p"):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(jobs))
    return path


def _default_stop_signals():
    # The launcher honours inherited SIG_IGN (nohup, background jobs of a script), so a
    # test run under nohup would otherwise see SIGHUP and SIGINT ignored.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


class Suite:
    """One ``milarun jobs`` subprocess whose children carry a unique marker."""

    def __init__(self, tmp_path, profile, *args, out="out", stdio=None):
        self.marker = uuid.uuid4().hex
        self.out = tmp_path / out
        (tmp_path / "data").mkdir(exist_ok=True)
        env = dict(os.environ, MILARUN_TEST_MARKER=self.marker)
        env.pop("CI", None)
        stdio = stdio or {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "milarun",
                "jobs",
                str(profile),
                "--no-cgexec",
                "-d",
                str(tmp_path / "data"),
                "-o",
                str(self.out),
                *args,
            ],
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_default_stop_signals,
            **stdio,
        )

    def children(self):
        found = []
        for p in psutil.process_iter(["pid"]):
            try:
                if p.pid != self.proc.pid and p.environ().get("MILARUN_TEST_MARKER") == self.marker:
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return found

    def wait_for_samples(self, n_journals, timeout=90):
        deadline = time.time() + timeout
        while time.time() < deadline:
            journals = list(self.out.glob("*.journal.jsonl"))
            if len(journals) >= n_journals and all(
                j.read_text().count('"kind": "sample"') >= 2 for j in journals
            ):
                return journals
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.proc.kill()
        out = self.proc.stdout.read().decode() if self.proc.stdout else ""
        pytest.fail(f"children did not start measuring: {out}")

    def finish(self, timeout=60):
        out, _ = self.proc.communicate(timeout=timeout)
        return out.decode(errors="replace") if out else ""

    def records(self):
        return {p.name: json.loads(p.read_text()) for p in self.out.glob("*.json")}

    def assert_no_survivor(self, within=10):
        deadline = time.time() + within
        while self.children() and time.time() < deadline:
            time.sleep(0.2)
        assert self.children() == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_stop_signal_stops_everything_and_records_interrupted(tmp_path, sig):
    suite = Suite(tmp_path, write_profile(tmp_path, {"crawl": CRAWL}), "--cpu-slots", "2")
    suite.wait_for_samples(2)
    assert len(suite.children()) >= 2
    suite.proc.send_signal(sig)
    output = suite.finish()
    assert suite.proc.returncode == 128 + sig, output
    assert f"stopped by {signal.Signals(sig).name}; 0 passed, 0 failed, 2 interrupted" in output
    suite.assert_no_survivor()
    recs = suite.records()
    assert len(recs) == 2 and all(".FAIL." in name for name in recs)
    for rec in recs.values():
        assert rec["error"]["reason"] == "interrupted"
        assert len(rec["timings"]["train"]["samples"]) >= 2
    assert list(suite.out.glob("*.journal.jsonl")) == []


def test_sighup_after_the_terminal_closed(tmp_path):
    # A closed SSH session: the terminal is gone (writes fail with EIO), then SIGHUP.
    master, slave = pty.openpty()
    suite = Suite(
        tmp_path,
        write_profile(tmp_path, {"crawl": CRAWL}),
        "--cpu-slots",
        "2",
        stdio={"stdout": slave, "stderr": slave},
    )
    os.close(slave)
    suite.wait_for_samples(2)
    os.close(master)
    suite.proc.send_signal(signal.SIGHUP)
    suite.proc.wait(timeout=60)
    assert suite.proc.returncode == 128 + signal.SIGHUP
    suite.assert_no_survivor()
    reasons = [r["error"]["reason"] for r in suite.records().values()]
    assert reasons == ["interrupted", "interrupted"]


def test_sigkill_of_the_parent_takes_the_children_with_it(tmp_path):
    suite = Suite(tmp_path, write_profile(tmp_path, {"crawl": CRAWL}), "--cpu-slots", "2")
    suite.wait_for_samples(2)
    assert len(suite.children()) >= 2
    suite.proc.kill()
    suite.finish()
    suite.assert_no_survivor()
    # nobody was left to write records; the journals show how far they got
    assert suite.records() == {}
    assert len(list(suite.out.glob("*.journal.jsonl"))) == 2


def test_sigkill_also_reaches_torchrun_ranks(tmp_path):
    job = {
        "experiment": "milarun.models.faults:crawl",
        "launcher": "torchrun",
        "partition_scheme": {"type": "normal"},
        "arguments": CRAWL["arguments"],
    }
    suite = Suite(tmp_path, write_profile(tmp_path, {"ddp": job}), "--cpu-slots", "2")
    suite.wait_for_samples(1)
    deadline = time.time() + 30
    while len(suite.children()) < 3 and time.time() < deadline:  # agent + 2 ranks
        time.sleep(0.2)
    assert len(suite.children()) >= 3
    suite.proc.kill()
    suite.finish()
    suite.assert_no_survivor(within=15)


def test_second_session_on_the_same_folder_is_refused(tmp_path):
    profile = write_profile(tmp_path, {"crawl": CRAWL})
    first = Suite(tmp_path, profile, "--cpu-slots", "1")
    first.wait_for_samples(1)
    second = Suite(tmp_path, profile, "--cpu-slots", "1")
    output = second.finish()
    assert second.proc.returncode == 2
    assert output.strip() == (
        f"milarun: error: {first.out}: in use by another 'milarun jobs' "
        f"(pid {first.proc.pid}); wait for it or choose another -o"
    )
    first.proc.send_signal(signal.SIGTERM)
    first.finish()
    (rec,) = first.records().values()
    assert rec["error"]["reason"] == "interrupted"  # the second touched nothing


def test_a_finished_folder_is_not_reused_without_resume(tmp_path):
    profile = write_profile(tmp_path, {"ok": {**CRAWL, "arguments": {"max-count": 3, "warmup": 0}}})
    first = Suite(tmp_path, profile, "--cpu-slots", "1")
    assert "1 passed, 0 failed" in first.finish()
    again = Suite(tmp_path, profile, "--cpu-slots", "1")
    output = again.finish()
    assert again.proc.returncode == 2
    assert output.strip() == (
        f"milarun: error: {first.out}: holds the results of an earlier "
        "session: resume it with --resume, or choose another -o"
    )


def test_resume_runs_only_what_did_not_pass(tmp_path):
    flag = tmp_path / "flag"
    profile = write_profile(
        tmp_path,
        {
            "ok": {**CRAWL, "arguments": {"max-count": 3, "warmup": 0}},
            "flaky": {
                "experiment": "milarun.models.faults:flaky",
                "partition_scheme": {"type": "per-gpu"},
                "arguments": {"pass-if": str(flag), "max-count": 3, "warmup": 0},
            },
        },
    )
    first = Suite(tmp_path, profile, "--cpu-slots", "2")
    assert "2 passed, 2 failed" in first.finish()
    before = {name: (first.out / name).stat().st_mtime_ns for name in first.records()}
    flag.write_text("")
    # other options: one clear error naming the key
    wrong = run_jobs(
        tmp_path / "data", "--resume", str(first.out), "--cpu-slots", "1", profile=profile
    )
    assert wrong.returncode == 2
    assert wrong.stderr.strip() == (
        f"milarun: error: {first.out}/.milarun/session.json: invocation.cpu_slots: --resume: "
        "cpu_slots differs from the run that started this folder (was 2, now 1); resume with "
        "the same profile and options or use a new -o"
    )
    again = run_jobs(
        tmp_path / "data", "--resume", str(first.out), "--cpu-slots", "2", profile=profile
    )
    assert again.returncode == 0, again.stderr
    assert "2 launch(es) already passed; 2 to run" in again.stderr
    assert again.stdout.strip() == "2 passed, 0 failed"
    recs = {
        name: json.loads((first.out / name).read_text())
        for name in os.listdir(first.out)
        if name.endswith(".json")
    }
    for name, mtime in before.items():  # nothing of the first session was touched
        assert (first.out / name).stat().st_mtime_ns == mtime
    passed = sorted((r["name"], r["device"]) for r in recs.values() if r["success"])
    assert passed == [("p.flaky", "0"), ("p.flaky", "1"), ("p.ok", "0"), ("p.ok", "1")]
    session = json.loads((first.out / ".milarun" / "session.json").read_text())
    assert [s["resume"] for s in session["sessions"]] == [False, True]


def run_jobs(tmp_path, *args, profile=None):
    """``milarun jobs`` on ``profile`` (a crawl test by default), to completion."""
    profile = profile or write_profile(tmp_path, {"crawl": CRAWL})
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "milarun",
            "jobs",
            str(profile),
            "--no-cgexec",
            "-d",
            str(tmp_path),
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


def _mount_tmpfs(path, options):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        cgroup_skip("mounting a tmpfs needs root")
    path.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        cgroup_skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")


@pytest.fixture
def tmpfs():
    """``tmpfs(path, options)`` mounts a tmpfs there; every mount is undone afterwards."""
    made = []

    def mount(path, options):
        _mount_tmpfs(path, options)
        made.append(path)
        return path

    yield mount
    for path in made:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_read_only_results_folder_is_one_clear_error(tmp_path, tmpfs):
    ro = tmpfs(tmp_path / "ro", "ro,size=1m")
    proc = run_jobs(tmp_path, "-o", str(ro / "out"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"milarun: error: {ro}/out: results directory is not writable (Read-only file system)"
    )


def test_a_nearly_full_disk_is_refused_before_launching(tmp_path, tmpfs):
    small = tmpfs(tmp_path / "small", "size=4m")
    proc = run_jobs(tmp_path, "-o", str(small / "out"))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(f"milarun: error: {small}/out: results directory has ")
    assert proc.stderr.strip().endswith(
        "MiB free; milarun needs at least 32 MiB for records and logs"
    )


def test_disk_full_mid_suite_stops_cleanly_and_keeps_what_was_written(tmp_path, tmpfs):
    tmpfs(tmp_path / "disk", "size=40m")
    spam = "import sys; [print('x' * 4096) for _ in range(20000)]"  # ~80 MB of log
    profile = write_profile(
        tmp_path,
        {
            "first": {**CRAWL, "arguments": {"max-count": 3, "warmup": 0}},
            "filler": {
                "experiment": "milarun.models.faults:crawl",
                "partition_scheme": {"type": "per-gpu"},
                "exec_prefix": [
                    sys.executable,
                    "-c",
                    spam + "; import os; os.execvp(sys.argv[1], sys.argv[1:])",
                ],
                "arguments": {"max-count": 3, "warmup": 0},
            },
            "never": {**CRAWL, "arguments": {"max-count": 3, "warmup": 0}},
        },
    )
    suite = Suite(tmp_path, profile, "--cpu-slots", "1", out="disk/out")
    output = suite.finish(timeout=120)
    assert suite.proc.returncode == 1, output
    assert "No space left on device" in output
    assert "the suite stops here; 1 passed, 1 failed" in output
    recs = suite.records()
    names = sorted(r["name"] for r in recs.values())
    assert names == ["p.first"]  # kept, readable; 'never' never ran
    assert all(not n.startswith(".tmp-") for n in os.listdir(suite.out))
    suite.assert_no_survivor()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--repeat", "0"], "--repeat must be between 1 and 1000, not 0"),
        (["--repeat", "100000000000"], "--repeat must be between 1 and 1000, not 100000000000"),
        (
            ["--cpu-slots", "0"],
            "--cpu-slots must be between 1 and the {cores} core(s) of this host, not 0",
        ),
        (
            ["--cpu-slots", "999"],
            "--cpu-slots must be between 1 and the {cores} core(s) of this host, not 999",
        ),
        (["--timeout", "nan"], "--timeout must be a number of seconds in (0, 604800], not nan"),
        (["--timeout", "inf"], "--timeout must be a number of seconds in (0, 604800], not inf"),
        (["--timeout", "-1"], "--timeout must be a number of seconds in (0, 604800], not -1.0"),
        (
            ["--timeout", "1e9"],
            "--timeout must be a number of seconds in (0, 604800], not 1000000000.0",
        ),
    ],
)
def test_out_of_range_options_are_one_clear_error(tmp_path, capsys, args, message):
    from milarun.cli import main

    profile = write_profile(tmp_path, {"crawl": CRAWL})
    with pytest.raises(SystemExit) as exc:
        main(["jobs", str(profile), "-d", str(tmp_path), "-o", str(tmp_path / "out"), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == f"milarun: error: {message.format(cores=os.cpu_count())}\n"
    assert not (tmp_path / "out").exists()  # nothing written, nothing launched


def test_results_directory_that_is_a_file(tmp_path, capsys):
    from milarun.cli import main

    profile = write_profile(tmp_path, {"crawl": CRAWL})
    (tmp_path / "afile").write_text("keep me")
    with pytest.raises(SystemExit) as exc:
        main(["jobs", str(profile), "-d", str(tmp_path), "-o", str(tmp_path / "afile")])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        f"milarun: error: {tmp_path}/afile: results directory is a file, not a folder\n"
    )
    assert (tmp_path / "afile").read_text() == "keep me"


def test_resume_of_a_folder_without_session(tmp_path, capsys):
    from milarun.cli import main

    profile = write_profile(tmp_path, {"crawl": CRAWL})
    (tmp_path / "plain").mkdir()
    with pytest.raises(SystemExit) as exc:
        main(["jobs", str(profile), "-d", str(tmp_path), "--resume", str(tmp_path / "plain")])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        f"milarun: error: {tmp_path}/plain: --resume: no milarun session here "
        "(no .milarun/session.json)\n"
    )


def test_sighup_is_ignored_under_nohup(tmp_path):
    job = {**CRAWL, "arguments": {**CRAWL["arguments"], "max-count": 150}}
    profile = write_profile(tmp_path, {"crawl": job})
    (tmp_path / "data").mkdir()

    def nohup():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "milarun",
            "jobs",
            str(profile),
            "--no-cgexec",
            "-d",
            str(tmp_path / "data"),
            "-o",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=nohup,
    )
    deadline = time.time() + 60
    while not list((tmp_path / "out").glob("*.journal.jsonl")) and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGHUP)
    output = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 0, output
    assert "1 passed, 0 failed" in output
