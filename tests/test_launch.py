"""The launcher: parent-owned paths, outcomes that agree with records, timeouts,
signals, journals, full disks. Children here are small ``python -c`` programs
or the torch-free fault experiments."""

import json
import os
import signal
import sys
import time

import pytest

from milarun.formats.journal import Journal
from milarun.launcher import failures
from milarun.launcher.child import Child
from milarun.launcher.outcome import conclude, fail_reason
from milarun.launcher.stopping import Interrupted, StopRequest
from milarun.launcher.waves import SuiteAborted, run_suite, run_wave, tally
from milarun.plan.launches import Launch
from milarun.profile.job import Job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAMP = "20261122-000000-000000"


def launch(tmp_path, code=None, name="t.job", device="0", timeout=30.0, prepare=(), argv=None):
    job = Job(
        "t",
        name.split(".")[1],
        "m:f",
        plan_type="per-gpu",
        prepare=list(prepare),
        definition={"experiment": "m:f"},
    )
    result = tmp_path / f"{name}.J0.{device}.{STAMP}.json"
    lch = Launch(
        name=name,
        job=job,
        run=0,
        device=device,
        devices=[0],
        argv=argv or [sys.executable, "-c", code],
        env={"MILARUN_X": "1"},
        group=name,
        log=f"{name}.J0.{device}.log",
        test_argv=["--a", "1"],
        timeout=timeout,
        result_path=result,
        fail_path=tmp_path / f"{name}.J0.{device}.FAIL.{STAMP}.json",
    )
    return lch


def fault(tmp_path, fn, *args, **kw):
    """A launch of ``milarun run milarun.models.faults:<fn>`` writing at its planned path."""
    lch = launch(tmp_path, argv=["x"], **kw)
    lch.argv = [
        sys.executable,
        "-m",
        "milarun",
        "run",
        f"milarun.models.faults:{fn}",
        "-o",
        str(lch.result_path),
        "--experiment-name",
        lch.name,
        "--job-id",
        lch.job_id,
        "--",
        *args,
    ]
    return lch


def record(outcome):
    return json.loads(outcome.result_path.read_text())


WRITE_OK = (
    "import sys; from milarun.formats.record import new_result; "
    "from milarun.formats.store import write_result; "
    "r=new_result('t.job','0.0'); r['success']={ok}; "
    "r['timings']['train']['samples']=[{{'start':0.0,'end':1.0,'count':5,'rate':5.0,"
    "'warmup':False}}]; write_result(r, sys.argv[1]); sys.exit({rc})"
)


def writer(tmp_path, ok=True, rc=0, **kw):
    lch = launch(tmp_path, WRITE_OK.format(ok=ok, rc=rc), **kw)
    lch.argv.append(str(lch.result_path))
    return lch


def test_child_writes_exactly_at_its_planned_path(tmp_path):
    lch = writer(tmp_path)
    (out,) = run_wave([lch], tmp_path)
    assert out.success and out.returncode == 0 and out.reason is None
    assert out.result_path == lch.result_path
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [lch.result_path.name]


def test_a_file_written_elsewhere_is_never_taken_for_the_result(tmp_path):
    # Another session's record with the same name/run/device (the old glob matched it).
    other = tmp_path / "t.job.J0.0.20991231-000000-000000.json"
    lch = writer(tmp_path)
    lch.argv[-1] = str(other)
    (out,) = run_wave([lch], tmp_path)
    assert not out.success and out.reason == "error"
    assert "without writing a result" in record(out)["error"]["message"]
    assert other.exists() and json.loads(other.read_text())["success"] is True


def test_nonzero_exit_without_result_becomes_fail_record(tmp_path):
    (out,) = run_wave(
        [launch(tmp_path, "import sys; print('boom', file=sys.stderr); sys.exit(3)")], tmp_path
    )
    assert not out.success and out.returncode == 3 and out.reason == "error"
    rec = record(out)
    assert out.result_path.name == f"t.job.J0.0.FAIL.{STAMP}.json"
    assert rec["success"] is False and rec["error"]["reason"] == "error"
    assert rec["error"]["returncode"] == 3 and "boom" in rec["error"]["stderr_tail"]
    assert rec["call"] == {"function": "m:f", "argv": ["--a", "1"], "arguments": {}}
    assert rec["written_by"] == "launcher"
    assert (tmp_path / "logs" / "t.job.J0.0.log").read_text() == "boom\n"


def test_exit_zero_without_result_is_a_failure(tmp_path):
    (out,) = run_wave([launch(tmp_path, "pass")], tmp_path)
    assert not out.success
    assert "exited with status 0 without writing a result" in record(out)["error"]["message"]


@pytest.mark.parametrize("rc", [3, -9])
def test_success_record_then_bad_exit_is_a_failure_in_tally_and_record(tmp_path, rc):
    code = WRITE_OK.format(ok=True, rc=0).replace(
        "sys.exit(0)", "import os,signal; os.kill(os.getpid(), 9)" if rc < 0 else f"sys.exit({rc})"
    )
    lch = launch(tmp_path, code)
    lch.argv.append(str(lch.result_path))
    (out,) = run_wave([lch], tmp_path)
    assert not out.success and out.reason == "exit-after-result"
    assert tally([out]) == "0 passed, 1 failed"
    rec = record(out)
    assert rec["success"] is False and rec["error"]["reason"] == "exit-after-result"
    assert rec["error"]["returncode"] == rc
    assert rec["timings"]["train"]["samples"][0]["count"] == 5  # samples kept
    assert not lch.result_path.exists()  # no success-named file left to contradict it
    words = "was killed by signal SIGKILL" if rc < 0 else "exited with status 3"
    assert rec["error"]["message"] == f"wrote a successful result, then {words}"


def test_success_record_then_hang_is_exit_after_result(tmp_path):
    code = WRITE_OK.format(ok=True, rc=0).replace("sys.exit(0)", "import time; time.sleep(60)")
    lch = launch(tmp_path, code, timeout=2.0)
    lch.argv.append(str(lch.result_path))
    (out,) = run_wave([lch], tmp_path, grace=0.5)
    assert out.reason == "exit-after-result"
    assert "did not exit within the 2 s timeout" in record(out)["error"]["message"]


def test_child_recorded_failure_moves_to_the_fail_path(tmp_path):
    lch = writer(tmp_path, ok=False, rc=1)
    (out,) = run_wave([lch], tmp_path)
    assert out.result_path == lch.fail_path and not lch.result_path.exists()
    assert record(out)["error"]["returncode"] == 1


def test_corrupt_child_record_is_reported_not_trusted(tmp_path):
    lch = launch(tmp_path, "import sys; open(sys.argv[1], 'w').write('{\"success\": tr')")
    lch.argv.append(str(lch.result_path))
    (out,) = run_wave([lch], tmp_path)
    assert not out.success
    assert "is unreadable" in record(out)["error"]["message"]


def test_timeout_keeps_the_samples_measured_so_far(tmp_path):
    lch = fault(
        tmp_path,
        "crawl",
        "--max-count",
        "100000",
        "--sample-duration",
        "0.1",
        "--step-seconds",
        "0.01",
        timeout=12.0,
    )  # start-up imports torch: seconds
    (out,) = run_wave([lch], tmp_path, grace=1.0)
    assert out.reason == "timeout" and out.returncode == -signal.SIGTERM
    rec = record(out)
    samples = rec["timings"]["train"]["samples"]
    assert len(samples) >= 3 and all(s["rate"] > 0 for s in samples)
    assert rec["timings"]["train"]["count"] == sum(s["count"] for s in samples)
    assert rec["timings"]["train"]["sample_duration"] == 0.1
    # the host-load readings streamed to the journal are kept too (1 s apart)
    load = rec["host_load"]["samples"]
    assert load and all(r["dt"] > 0 and r["busy"] >= r["outside"] >= 0 for r in load)
    assert not lch.journal_path.exists()  # folded into the record


def test_clean_run_removes_its_journal(tmp_path):
    lch = fault(tmp_path, "crawl", "--max-count", "20", "--sample-duration", "0.05")
    (out,) = run_wave([lch], tmp_path)
    assert out.success, record(out)
    assert len(record(out)["timings"]["train"]["samples"]) >= 2
    assert not lch.journal_path.exists()


def test_exit_after_result_from_a_real_experiment(tmp_path):
    lch = fault(tmp_path, "crawl", "--max-count", "10", "--warmup", "0", "--exit-code", "7")
    (out,) = run_wave([lch], tmp_path)
    assert out.reason == "exit-after-result" and out.returncode == 7
    assert record(out)["timings"]["train"]["count"] == 10


def test_timeout_escalates_to_sigkill(tmp_path):
    code = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    (out,) = run_wave([launch(tmp_path, code, timeout=0.5)], tmp_path, grace=0.5)
    assert out.reason == "timeout" and out.returncode == -signal.SIGKILL


def test_killed_by_signal(tmp_path):
    (out,) = run_wave([launch(tmp_path, "import os,signal; os.kill(os.getpid(), 9)")], tmp_path)
    rec = record(out)
    assert out.reason == "signal"
    assert rec["error"]["signal"] == 9 and "SIGKILL" in rec["error"]["message"]


def test_concurrent_launches_are_awaited_together(tmp_path):
    code = "import time; time.sleep(1)"
    t0 = time.time()
    outs = run_wave(
        [launch(tmp_path, code, device="0"), launch(tmp_path, code, device="1")], tmp_path
    )
    assert time.time() - t0 < 1.9  # not 2 s: they ran at once
    assert [o.launch.device for o in outs] == ["0", "1"]
    assert tally(outs) == "0 passed, 2 failed"


def test_stop_request_interrupts_and_keeps_the_samples(tmp_path):
    a = fault(tmp_path, "crawl", "--max-count", "100000", "--sample-duration", "0.1", device="0")
    b = fault(tmp_path, "crawl", "--max-count", "100000", "--sample-duration", "0.1", device="1")
    stop = StopRequest()
    deadline = time.time() + 60

    def later(launch_, line):
        if "crawl: started" in line:
            later.started.add(launch_.device)

    later.started = set()
    import threading

    def fire():
        while time.time() < deadline and (len(later.started) < 2 or not a.journal_path.exists()):
            time.sleep(0.1)
        time.sleep(1.0)  # a few windows
        stop(signal.SIGTERM)

    threading.Thread(target=fire, daemon=True).start()
    outs = run_wave([a, b], tmp_path, stop=stop, on_line=later, grace=2.0)
    assert [o.reason for o in outs] == ["interrupted", "interrupted"]
    assert tally(outs) == "0 passed, 0 failed, 2 interrupted"
    for o in outs:
        rec = record(o)
        assert rec["error"]["reason"] == "interrupted"
        assert len(rec["timings"]["train"]["samples"]) >= 2


def test_failed_prepare_fails_the_test_and_the_suite_goes_on(tmp_path):
    bad = launch(tmp_path, "pass", name="t.bad", prepare=["exit 4"])
    ok = writer(tmp_path, name="t.next")
    outs = run_suite([[bad], [ok]], tmp_path, None, on_outcome=lambda o: None)
    assert len(outs) == 2
    assert outs[0].reason == "error"
    assert "prepare command failed with status 4" in record(outs[0])["error"]["message"]
    assert outs[1].success  # the next test still ran


def test_stop_during_prepare_kills_it_and_raises(tmp_path):
    marker = tmp_path / "prepare-finished"
    lch = launch(tmp_path, "pass", prepare=[f"sleep 31.7 && touch {marker}"])
    stop = StopRequest()
    import threading

    threading.Timer(1.0, stop, args=(signal.SIGINT,)).start()
    t0 = time.time()
    with pytest.raises(Interrupted) as exc:
        run_suite([[lch]], tmp_path, None, stop=stop, on_outcome=lambda o: None, grace=1.0)
    assert time.time() - t0 < 10 and exc.value.signum == signal.SIGINT
    assert exc.value.outcomes == []  # nothing had started: no record
    import psutil

    survivors = [
        p for p in psutil.process_iter(["cmdline"]) if "31.7" in " ".join(p.info["cmdline"] or [])
    ]
    assert survivors == [] and not marker.exists()


def test_a_dying_log_never_kills_the_copy(tmp_path):
    # 4 MB of output through a log that fails: the pipe must still be drained.
    lch = launch(tmp_path, "import sys; [print('x' * 1000) for _ in range(4000)]; sys.exit(2)")
    child = Child(lch, tmp_path)

    class Full:
        def write(self, data):
            raise OSError(28, "No space left on device")

        def close(self):
            pass

    child.log = Full()
    child.start()
    t0 = time.time()
    while child.poll() is None and time.time() - t0 < 30:
        time.sleep(0.05)
    child.finish()
    out = conclude(child)
    assert out.returncode == 2
    assert "log writes stopped: No space left on device" in record(out)["error"]["message"]


def test_a_record_that_cannot_be_written_stops_the_suite(tmp_path, monkeypatch):
    def enospc(rec, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(failures, "write_result", enospc)
    first = launch(tmp_path, "import sys; sys.exit(1)", name="t.one")
    never = launch(tmp_path, "open('ran', 'w')", name="t.two")
    with pytest.raises(SuiteAborted) as exc:
        run_suite([[first], [never]], tmp_path, None, on_outcome=lambda o: None)
    assert "No space left on device" in str(exc.value)
    assert len(exc.value.outcomes) == 1 and exc.value.outcomes[0].result_path is None
    assert not (tmp_path / "ran").exists()


def test_journal_survives_a_truncated_line(tmp_path):
    from milarun.formats.journal import read_journal

    j = Journal(tmp_path / "j.jsonl")
    j.write("start", pid=1, start=10.0)
    j.write("sample", start=0.0, end=1.0, count=3, rate=3.0, warmup=True)
    j.write("sample", start=1.0, end=2.0, count=3, rate=float("nan"), warmup=False)
    j.close()
    with open(tmp_path / "j.jsonl", "a") as f:
        f.write('{"kind": "sample", "start": 2.0, "en')
    got = read_journal(tmp_path / "j.jsonl")
    assert got["start"] == 10.0 and len(got["samples"]) == 1  # NaN rate and cut line dropped
    assert got["bad_lines"] == 2


def test_journal_keeps_only_well_formed_host_load_readings(tmp_path):
    from milarun.formats.journal import read_journal

    j = Journal(tmp_path / "j.jsonl")
    row = {"t": 3.0, "dt": 1.0, "busy": 1.5, "suite": 1.2, "outside": 0.3}
    j.write("host_load", **row)
    j.write("host_load", **{**row, "steal": 0.1})
    j.write("host_load", **{**row, "busy": -1.0})  # negative cores
    j.write("host_load", **{**row, "outside": "0.3"})  # not a number
    j.write("host_load", t=4.0, dt=1.0)  # fields missing
    j.write("host_load", **row, extra=1)  # not in the schema
    j.close()
    got = read_journal(tmp_path / "j.jsonl")
    assert got["host_load"] == [row, {**row, "steal": 0.1}]
    assert got["bad_lines"] == 4


def test_fail_reason_classification():
    assert fail_reason(-15, True, 0, 0) == "timeout"
    assert fail_reason(-9, False, 0, 1) == "oom-killed"
    assert fail_reason(-9, False, 0, 0) == "signal"
    assert fail_reason(-11, False, None, None) == "signal"
    assert fail_reason(1, False, None, None) == "error"


def test_a_write_failure_mid_wave_still_counts_the_whole_wave(tmp_path, monkeypatch):
    real = failures.write_result

    def full_for_one(rec, path):
        if ".J0.1." in str(path):
            raise OSError(28, "No space left on device")
        return real(rec, path)

    monkeypatch.setattr(failures, "write_result", full_for_one)
    wave = [
        writer(tmp_path, device="0"),
        launch(tmp_path, "import sys; sys.exit(1)", device="1"),
        writer(tmp_path, device="2"),
    ]
    with pytest.raises(SuiteAborted) as exc:
        run_suite([wave], tmp_path, None, on_outcome=lambda o: None)
    assert [o.success for o in exc.value.outcomes] == [True, False, True]
    assert tally(exc.value.outcomes) == "2 passed, 1 failed"


def test_a_huge_stderr_line_still_gives_a_fail_record(tmp_path):
    # a progress bar redrawn with '\r' and no newline: one multi-megabyte line
    code = "import sys; sys.stderr.write('\\r' + 'x' * 3_000_000); sys.exit(1)"
    (out,) = run_wave([launch(tmp_path, code)], tmp_path)
    rec = record(out)
    assert out.reason == "error" and len(rec["error"]["stderr_tail"]) < 200_000


def test_a_nul_byte_in_an_argument_fails_that_launch_only(tmp_path):
    bad = launch(tmp_path, argv=[sys.executable, "-c", "pass\0"], name="t.bad")
    good = writer(tmp_path, name="t.good")
    outs = run_suite([[bad], [good]], tmp_path, None, on_outcome=lambda o: None)
    assert [o.success for o in outs] == [False, True]
    assert "cannot start" in record(outs[0])["error"]["message"]


def test_a_hung_prepare_times_out(tmp_path):
    lch = launch(tmp_path, "pass", prepare=["sleep 30"], timeout=1.0)
    t0 = time.time()
    (out,) = run_suite([[lch]], tmp_path, None, on_outcome=lambda o: None, grace=0.5)
    assert time.time() - t0 < 10
    assert "prepare command timed out after 1 s: sleep 30" in record(out)["error"]["message"]


def test_no_moment_with_both_a_pass_and_a_fail_record(tmp_path, monkeypatch):
    # When the FAIL record is written, the child's success record already left its name.
    seen = []
    real = failures.write_result

    def spy(rec, path):
        seen.append(sorted(p.name for p in tmp_path.glob("*.json")))
        return real(rec, path)

    monkeypatch.setattr(failures, "write_result", spy)
    lch = writer(tmp_path, rc=3)
    (out,) = run_wave([lch], tmp_path)
    assert out.reason == "exit-after-result"
    assert seen == [[]]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [lch.fail_path.name]


class _Limits:
    """A fake ``resource`` module: RLIMIT_NOFILE's (soft, hard) and the calls that set it."""

    RLIMIT_NOFILE = 7
    RLIM_INFINITY = -1

    def __init__(self, soft, hard):
        self.value = (soft, hard)
        self.set = []

    def getrlimit(self, which):
        assert which == self.RLIMIT_NOFILE
        return self.value

    def setrlimit(self, which, value):
        self.set.append(value)
        self.value = value


def test_a_wave_of_1024_raises_the_soft_descriptor_limit_to_what_it_needs():
    from milarun.launcher.child import FDS_PER_CHILD, FDS_SPARE, ensure_descriptors

    need = FDS_PER_CHILD * 1024 + FDS_SPARE
    limits = _Limits(1024, 1 << 20)  # the usual default soft limit stalled such a wave
    assert ensure_descriptors(1024, limits) == need
    assert limits.set == [(need, 1 << 20)]
    # enough already, or no limit: left alone
    for soft in (need, _Limits.RLIM_INFINITY):
        limits = _Limits(soft, _Limits.RLIM_INFINITY)
        assert ensure_descriptors(1024, limits) == soft and limits.set == []
    limits = _Limits(1024, _Limits.RLIM_INFINITY)
    assert ensure_descriptors(1024, limits) == need


def test_a_wave_above_the_hard_descriptor_limit_stops_before_it_starts():
    from milarun.errors import SetupError
    from milarun.launcher.child import ensure_descriptors

    limits = _Limits(1024, 4096)
    with pytest.raises(SetupError, match=r"1024 process\(es\) needs 4160 open files.*4096"):
        ensure_descriptors(1024, limits)
    assert limits.set == []


def test_ensure_descriptors_sets_the_real_limit_of_this_process():
    import subprocess

    code = (
        "import resource\n"
        "from milarun.launcher.child import ensure_descriptors\n"
        "N = resource.RLIMIT_NOFILE\n"
        "resource.setrlimit(N, (256, resource.getrlimit(N)[1]))\n"
        "print(ensure_descriptors(100), resource.getrlimit(N)[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["464", "464"]


def test_milarun_jobs_stops_before_a_wave_its_hard_descriptor_limit_cannot_hold(tmp_path):
    import resource
    import subprocess

    (tmp_path / "p.json").write_text(
        json.dumps(
            {
                "t": {
                    "experiment": "milarun.models.faults:crawl",
                    "partition_scheme": {"type": "per-gpu"},
                }
            }
        )
    )
    (tmp_path / "data").mkdir()

    def low():  # below FDS_PER_CHILD + FDS_SPARE, above what starting up takes
        resource.setrlimit(resource.RLIMIT_NOFILE, (50, 50))

    proc = subprocess.run(
        [sys.executable, "-m", "milarun", "jobs", "p.json", "-d", "data", "-o", "out"]
        + ["--cpu-slots", "1", "--no-cgexec"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        preexec_fn=low,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "needs 68 open files in the launcher, above this shell's hard limit of 50" in proc.stderr
    assert not list((tmp_path / "out").glob("*.json"))  # nothing launched
