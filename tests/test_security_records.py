"""Security, records: one bad reading never loses a record nor stops the suite,
--resume trusts only this folder's own records, and a prepare command leaves
no process behind. Hostile inputs: a journal of NaN, negative, string and huge
values; a record the schema refuses; unwritable records; foreign records."""

import errno
import json
import os
import sys
import time

import pytest
from test_launch import launch, writer

from milarun.formats.store import load_result
from milarun.launcher import failures
from milarun.launcher.waves import SuiteAborted, run_suite, tally

#: A journal as a buggy sensor or a hostile child could leave it: two good samples, one
#: good GPU reading; every other line has a NaN, negative, string or huge field.
GOOD_SAMPLES = [
    {"start": 0.0, "end": 1.0, "count": 8, "rate": 8.0, "warmup": False},
    {"start": 1.0, "end": 2.0, "count": 8, "rate": 8.0, "warmup": False},
]
GOOD_MONITOR = {"t": 1.0, "device": 0, "load": 0.5, "power": 100.0}
BAD_LINES = [
    '{"kind": "start", "pid": 1, "start": NaN}',
    '{"kind": "train", "sample_duration": -1, "warmup": "abc"}',
    '{"kind": "sample", "start": 2.0, "end": 3.0, "count": 8, "rate": -5.0, "warmup": false}',
    '{"kind": "sample", "start": 2.0, "end": 3.0, "count": "many", "rate": 8.0, "warmup": false}',
    '{"kind": "sample", "start": 2.0, "end": 3.0, "count": 8, "rate": 1e999, "warmup": false}',
    '{"kind": "sample", "start": 2.0, "end": 3.0, "count": 1e300, "rate": 8.0, "warmup": false}',
    '{"kind": "sample", "start": 2.0, "end": 3.0, "count": 1e300, "rate": 8.0, "warmup": false}',
    '{"kind": "monitor", "t": 2.0, "device": 0, "power": NaN}',
    '{"kind": "monitor", "t": 2.0, "device": 0, "power": -3.0}',
    '{"kind": "monitor", "t": 2.0, "device": 0, "temperature": "hot"}',
    '{"kind": "host_load", "t": 2.0, "dt": 1.0, "busy": 1e400, "suite": 1, "outside": 0}',
    '{"kind": "distributed", "world_size": 2}',
]


def bad_journal_launch(tmp_path, name="t.bad"):
    """A launch whose child writes the hostile journal, then exits 1 without a record."""
    lines = (
        [json.dumps({"kind": "sample", **s}) for s in GOOD_SAMPLES]
        + [json.dumps({"kind": "monitor", **GOOD_MONITOR})]
        + BAD_LINES
    )
    lch = launch(tmp_path, name=name)
    code = f"import sys; open(sys.argv[1], 'w').write({chr(10).join(lines)!r} + '\\n'); sys.exit(1)"
    lch.argv = [sys.executable, "-c", code, str(lch.journal_path)]
    return lch


def records_on_disk(folder):
    return sorted(p.name for p in folder.glob("*.json"))


def test_bad_journal_values_give_a_valid_fail_record_and_the_suite_goes_on(tmp_path):
    bad = bad_journal_launch(tmp_path)
    ok = writer(tmp_path, name="t.next")
    outs = run_suite([[bad], [ok]], tmp_path, None, on_outcome=lambda o: None)
    assert [o.success for o in outs] == [False, True]  # the next test ran
    rec = load_result(bad.fail_path)  # on disk, and passes the schema
    assert rec["timings"]["train"]["samples"] == GOOD_SAMPLES
    assert rec["timings"]["train"]["count"] == 16
    assert rec["gpu_monitor"]["samples"] == [GOOD_MONITOR]
    assert rec["error"]["journal_dropped"] == len(BAD_LINES)
    assert "distributed" not in rec and "host_load" not in rec
    # the tally and the folder agree: one PASS record, one FAIL record
    assert tally(outs) == "1 passed, 1 failed"
    assert records_on_disk(tmp_path) == sorted([bad.fail_path.name, ok.result_path.name])


def test_a_record_the_schema_refuses_falls_back_to_a_minimal_one(tmp_path):
    # an argument longer than the schema's 65536 characters: the full record is refused
    lch = bad_journal_launch(tmp_path)
    lch.test_argv = ["--a", "x" * 70000]
    (out,) = run_suite([[lch]], tmp_path, None, on_outcome=lambda o: None)
    assert out.result_path == lch.fail_path and out.write_error is None
    rec = load_result(lch.fail_path)
    assert (rec["name"], rec["job_id"], rec["run"], rec["device"]) == ("t.bad", "0.0", 0, "0")
    assert rec["success"] is False and rec["error"]["reason"] == "error"
    assert rec["written_by"] == "launcher"
    message = rec["error"]["message"]
    assert message.startswith("exited with status 1 without writing a result; ")
    assert "the FAIL record was unusable" in message and "call.argv.1" in message
    assert rec["call"]["argv"] == [] and rec["timings"]["train"]["samples"] == []


def test_a_forced_schema_failure_still_leaves_a_minimal_record(tmp_path, monkeypatch):
    real = failures.fail_record

    def refused(*args, **kw):
        rec = real(*args, **kw)
        rec["device_count"] = -1  # whatever the full record holds, it fails the schema
        return rec

    monkeypatch.setattr(failures, "fail_record", refused)
    lch = writer(tmp_path, ok=False, rc=1)  # with a record of its own, samples and all
    (out,) = run_suite([[lch]], tmp_path, None, on_outcome=lambda o: None)
    rec = load_result(out.result_path)
    assert out.result_path == lch.fail_path and rec["device_count"] == 1
    assert rec["error"]["message"].count("was unusable") == 2  # own record, then journal's
    assert records_on_disk(tmp_path) == [lch.fail_path.name]


def test_an_unwritable_record_is_one_loud_line_and_the_suite_goes_on(tmp_path, monkeypatch):
    real = failures.write_result

    def denied(rec, path):
        if ".t.one." in f".{os.path.basename(path)}":
            raise OSError(errno.EACCES, "Permission denied")
        return real(rec, path)

    monkeypatch.setattr(failures, "write_result", denied)
    first = launch(tmp_path, "import sys; sys.exit(1)", name="t.one")
    then = writer(tmp_path, name="t.two")
    lines = []
    outs = run_suite(
        [[first], [then]], tmp_path, None, on_outcome=lambda o: None, on_message=lines.append
    )
    assert [o.success for o in outs] == [False, True]  # the next launch still ran
    assert lines == [
        f"milarun: error: t.one J0.0: cannot write {first.fail_path}: "
        "Permission denied; counted as failed, with no record"
    ]
    assert records_on_disk(tmp_path) == [then.result_path.name]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_or_quota_stops_the_suite_with_one_line(tmp_path, monkeypatch, code):
    def full(rec, path):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(failures, "write_result", full)
    first = launch(tmp_path, "import sys; sys.exit(1)", name="t.one")
    never = launch(tmp_path, f"open({str(tmp_path / 'ran')!r}, 'w')", name="t.two")
    with pytest.raises(SuiteAborted) as exc:
        run_suite([[first], [never]], tmp_path, None, on_outcome=lambda o: None)
    assert str(exc.value) == (
        f"cannot write {first.fail_path}: {os.strerror(code)}; the suite stops here"
    )
    assert not (tmp_path / "ran").exists()


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_a_background_process_of_a_prepare_command_does_not_outlive_it(tmp_path):
    pidfile = tmp_path / "pid"
    lch = writer(tmp_path, prepare=[f"sleep 300 & echo $! > {pidfile}"])
    t0 = time.time()
    (out,) = run_suite([[lch]], tmp_path, None, on_outcome=lambda o: None, grace=1.0)
    assert out.success and time.time() - t0 < 20
    pid = int(pidfile.read_text())
    deadline = time.time() + 5
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def test_a_background_process_that_ignores_sigterm_is_killed(tmp_path):
    pidfile = tmp_path / "pid"
    cmd = f"sh -c 'trap \"\" TERM; sleep 300' & echo $! > {pidfile}"
    lch = writer(tmp_path, prepare=[cmd])
    t0 = time.time()
    (out,) = run_suite([[lch]], tmp_path, None, on_outcome=lambda o: None, grace=0.5)
    assert out.success and time.time() - t0 < 20
    pid = int(pidfile.read_text())
    deadline = time.time() + 5
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


# --- --resume counts only this folder's own records of the planned job ---------------------


def test_resume_ignores_foreign_and_mismatched_successful_records(tmp_path):
    import datetime

    from test_faults import run_jobs, write_profile

    from milarun.formats.store import result_filename, write_result
    from milarun.launcher.session import SESSION_ID_FORMAT

    flag = tmp_path / "flag"
    profile = write_profile(
        tmp_path,
        {
            "flaky": {
                "experiment": "milarun.models.faults:flaky",
                "partition_scheme": {"type": "per-gpu"},
                "arguments": {"pass-if": str(flag), "max-count": 3, "warmup": 0},
            }
        },
    )
    out = tmp_path / "out"
    first = run_jobs(tmp_path, "-o", str(out), "--cpu-slots", "1", profile=profile)
    assert first.stdout.strip() == "0 passed, 1 failed", first.stderr
    (sid,) = [s["id"] for s in json.loads((out / ".milarun/session.json").read_text())["sessions"]]
    (failed,) = out.glob("p.flaky.J0.0.FAIL.*.json")
    passing = {**load_result(failed), "success": True, "error": None}

    def forge(job, stamp):
        path = out / result_filename("p.flaky", 0, "0", True, stamp)
        write_result({**passing, "job": job}, path)
        return path.name

    # a passing record copied in from another folder: the right job, another session's stamp
    copied = forge(passing["job"], datetime.datetime(2099, 12, 31))
    # this session's stamp, but the record of another job definition
    other_job = forge(
        {**passing["job"], "arguments": {"max-count": 1}},
        datetime.datetime.strptime(sid, SESSION_ID_FORMAT),
    )
    flag.write_text("")
    again = run_jobs(tmp_path, "--resume", str(out), "--cpu-slots", "1", profile=profile)
    assert again.returncode == 0, again.stderr
    assert (
        "milarun: --resume: 2 successful record(s) not counted as passed (their launches "
        f"run again): {copied} (not written by a session of this folder), {other_job} "
        "(its job definition is not the profile's)"
    ) in again.stderr.splitlines()
    assert "already passed" not in again.stderr
    assert again.stdout.strip() == "1 passed, 0 failed"  # the launch ran again
    sessions = json.loads((out / ".milarun/session.json").read_text())["sessions"]
    assert (out / f"p.flaky.J0.0.{sessions[1]['id']}.json").exists()


def test_successful_keys_takes_only_records_named_by_the_folder_sessions(tmp_path):
    from milarun.formats.record import new_result
    from milarun.formats.store import result_filename, write_result
    from milarun.launcher.session import session_times, successful_keys

    saved = {"sessions": [{"id": "20261122-000000-000000"}, {"id": 5}, "junk", {"id": "../../etc"}]}
    (when,) = session_times(saved)  # malformed entries are left out
    rec = {**new_result("s.t", "0.0"), "success": True, "job": {"a": 1}}
    mine = write_result(rec, tmp_path / result_filename("s.t", 0, "0", True, when))
    (tmp_path / "sub").mkdir()
    nested = write_result(rec, tmp_path / "sub" / mine.name)  # right name, wrong folder
    # named for run 1, but the record inside is run 0's
    renamed = write_result(rec, tmp_path / result_filename("s.t", 1, "0", True, when))
    done, foreign = successful_keys(tmp_path, [when])
    assert done == {("s.t", 0, "0"): [(mine, {"a": 1})]}
    assert sorted(p for p, _ in foreign) == sorted([nested, renamed])
