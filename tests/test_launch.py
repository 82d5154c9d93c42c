"""The launcher: exit codes, timeouts, signals, Ctrl-C cleanup, FAIL results."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from milarun.launch import fail_reason, run_suite, run_wave, tally
from milarun.plan import Launch
from milarun.profile import Job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(code, name="t.job", device="0", timeout=30.0, prepare=()):
    job = Job("t", name.split(".")[1], "m:f", partition="per-gpu", prepare=list(prepare),
              definition={"experiment": "m:f"})
    return Launch(name=name, job=job, run=0, device=device, devices=[0],
                  argv=[sys.executable, "-c", code], env={"MILARUN_X": "1"},
                  group=name, log=f"{name}.J0.{device}.log", test_argv=["--a", "1"],
                  timeout=timeout)


def result_of(outcome):
    return json.loads(outcome.result_path.read_text())


def test_child_writing_its_result_passes(tmp_path):
    code = ("import json,sys; from milarun.results import new_result, write_result; "
            "r=new_result('t.job','0.0'); r['success']=True; write_result(r, sys.argv[1])")
    lch = launch(code)
    lch.argv.append(str(tmp_path))
    (out,) = run_wave([lch], tmp_path, echo=False)
    assert out.success and out.returncode == 0 and out.reason is None
    assert ".FAIL." not in out.result_path.name


def test_nonzero_exit_without_result_becomes_fail_result(tmp_path):
    (out,) = run_wave([launch("import sys; print('boom', file=sys.stderr); sys.exit(3)")],
                      tmp_path, echo=False)
    assert not out.success and out.returncode == 3 and out.reason == "error"
    rec = result_of(out)
    assert ".FAIL." in out.result_path.name
    assert rec["success"] is False and rec["error"]["reason"] == "error"
    assert rec["error"]["returncode"] == 3 and "boom" in rec["error"]["stderr_tail"]
    assert rec["call"] == {"function": "m:f", "argv": ["--a", "1"], "arguments": {}}
    assert (tmp_path / "logs" / "t.job.J0.0.log").read_text() == "boom\n"


def test_exit_zero_without_result_is_a_failure(tmp_path):
    (out,) = run_wave([launch("pass")], tmp_path, echo=False)
    assert not out.success
    assert "without writing a result" in result_of(out)["error"]["message"]


def test_timeout_sigterm_then_fail_result(tmp_path):
    t0 = time.time()
    (out,) = run_wave([launch("import time; time.sleep(60)", timeout=0.5)], tmp_path,
                      echo=False, grace=1.0)
    assert time.time() - t0 < 10
    assert out.reason == "timeout" and out.returncode == -signal.SIGTERM
    assert result_of(out)["error"]["reason"] == "timeout"


def test_timeout_escalates_to_sigkill(tmp_path):
    code = ("import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "time.sleep(60)")
    (out,) = run_wave([launch(code, timeout=0.5)], tmp_path, echo=False, grace=0.5)
    assert out.reason == "timeout" and out.returncode == -signal.SIGKILL


def test_killed_by_signal(tmp_path):
    (out,) = run_wave([launch("import os,signal; os.kill(os.getpid(), signal.SIGKILL)")],
                      tmp_path, echo=False)
    rec = result_of(out)
    assert out.reason == "signal"
    assert rec["error"]["signal"] == 9 and "SIGKILL" in rec["error"]["message"]


def test_concurrent_launches_are_awaited_together(tmp_path):
    code = "import time; time.sleep(1)"
    t0 = time.time()
    outs = run_wave([launch(code, device="0"), launch(code, device="1")], tmp_path, echo=False)
    assert time.time() - t0 < 1.9  # not 2 s: they ran at once
    assert [o.launch.device for o in outs] == ["0", "1"]
    assert tally(outs) == "0 passed, 2 failed"


def test_failed_prepare_fails_the_test_and_the_suite_goes_on(tmp_path):
    bad = launch("pass", name="t.bad", prepare=["exit 4"])
    ok = launch("pass", name="t.next")
    outs = run_suite([[bad], [ok]], tmp_path, None, echo=False)
    assert len(outs) == 2
    assert outs[0].reason == "error"
    assert "prepare command failed with status 4" in result_of(outs[0])["error"]["message"]
    assert outs[1].returncode == 0  # the next test still ran


def test_fail_reason_classification():
    assert fail_reason(-15, True, 0, 0) == "timeout"
    assert fail_reason(-9, False, 0, 1) == "oom-killed"
    assert fail_reason(-9, False, 0, 0) == "signal"
    assert fail_reason(-11, False, None, None) == "signal"
    assert fail_reason(1, False, None, None) == "error"


def _default_sigint():
    # A shell's background job (nohup … &) ignores SIGINT, Python then keeps
    # it ignored, and "Ctrl-C" would never reach milarun.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_every_child_and_leaves_no_orphan(tmp_path):
    marker = uuid.uuid4().hex
    profile = tmp_path / "hang.json"
    profile.write_text(json.dumps({"hang": {"experiment": "milarun.models.faults:hang",
                                            "partition_scheme": {"type": "per-gpu"}}}))
    (tmp_path / "data").mkdir()
    env = dict(os.environ, MILARUN_TEST_MARKER=marker)
    proc = subprocess.Popen([sys.executable, "-m", "milarun", "jobs", str(profile),
                             "--cpu-slots", "2", "--no-cgexec", "-d", str(tmp_path / "data"),
                             "-o", str(tmp_path / "out")], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=_default_sigint)

    def marked():
        found = []
        for p in psutil.process_iter(["pid"]):
            try:
                if p.pid != proc.pid and p.environ().get("MILARUN_TEST_MARKER") == marker:
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return found

    deadline = time.time() + 60
    logs = tmp_path / "out" / "logs"
    while time.time() < deadline:
        if all((logs / f"hang.hang.J0.{i}.log").exists() and
               "sleeping" in (logs / f"hang.hang.J0.{i}.log").read_text() for i in (0, 1)):
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("children did not start")
    assert len(marked()) >= 2
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, output
    assert b"interrupted" in output
    time.sleep(0.5)
    assert marked() == []
    # an interruption is not the machine's failure: no FAIL result for it
    assert list((tmp_path / "out").glob("*.json")) == []
