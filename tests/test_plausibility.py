"""The plausibility checks (milarun.measure.plausibility): failing checks (nan-loss,
no-steady-state) on hand-made records, on records written before the checks, and from real
tiny child runs; flags with thresholds from a profile; the summary and the report showing them."""

import ast
import copy
import json
import math
import subprocess
import sys

import pytest
from conftest import ROOT

from milarun.analysis.summary import summarize
from milarun.formats.record import new_result, validate
from milarun.formats.store import write_result
from milarun.formats.summary import check_summary, normalize_summary
from milarun.measure import plausibility
from milarun.profile.language import load_profile


def samples(n=20, rate=100.0, warmup=2, dt=1.0, loss=None):
    """``n`` samples of ``dt`` s at ``rate`` items/s from t = 1, the first ``warmup``
    flagged; ``loss(i)`` gives each sample's loss (no loss key when None)."""
    out = []
    for i in range(n):
        s = {
            "start": 1.0 + i * dt,
            "end": 1.0 + (i + 1) * dt,
            "count": rate * dt,
            "rate": rate,
            "warmup": i < warmup,
        }
        if loss is not None:
            s["loss"] = loss(i)
        out.append(s)
    return out


def record(name="s.t", device="0", run=0, samples_=None, metrics=None, job=None, **extra):
    rec = new_result(
        name, f"{run}.{device}", device=device, devices=[int(device)], run=run, plan_type="per-gpu"
    )
    rec["host"] = {
        "hostname": "h1",
        "cpu_model": "cpu",
        "cpu_count": 2,
        "gpus": [
            {"index": 0, "name": "G", "memory_total_mib": 1000.0},
            {"index": 1, "name": "G", "memory_total_mib": 1000.0},
        ],
    }
    rec["timings"]["train"]["samples"] = (
        samples(loss=lambda i: 1.0) if samples_ is None else samples_
    )
    rec["timings"]["program"] = {"start": 1.7e9, "end": 1.7e9 + 30, "duration": 30.0}
    rec["metrics"] = {"loss": 0.5} if metrics is None else metrics
    rec["job"] = job or {}
    rec["success"] = True
    rec.update(extra)
    return rec


# ------------------------------------------------------------- failing checks


@pytest.mark.parametrize(
    "samples_,metrics,where",
    [
        (samples(loss=lambda i: None if i >= 12 else 1.0), {"loss": None}, "sample 12"),
        (samples(loss=lambda i: math.nan if i == 0 else 1.0), {"loss": 1.0}, "warm-up sample 0"),
        (samples(), {"loss": math.inf}, "final loss is inf"),
        (samples(), {"loss_d": None, "loss": 0.3}, "final loss_d"),
        (samples(), {"content_loss": -math.inf}, "final content_loss is -inf"),
    ],
)
def test_a_non_finite_loss_fails_the_result(samples_, metrics, where):
    rec = record(samples_=samples_, metrics=metrics)
    reason, message = plausibility.fail_check(rec)
    assert reason == "nan-loss" and where in message
    judged = plausibility.judge(rec)
    assert judged["success"] is False and judged["error"]["reason"] == "nan-loss"
    assert rec["success"] is True and rec["error"] is None  # the input is left alone


def test_finite_losses_and_other_metrics_pass():
    rec = record(metrics={"loss": 0.1, "accuracy": None, "tflops_fp32": 1.5, "note": "x"})
    assert plausibility.fail_check(rec) is None
    assert plausibility.judge(rec) is rec
    assert plausibility.loss_status(rec) == "logged"


def test_a_test_without_a_loss_declares_it_and_is_not_checked():
    bare = record(samples_=samples(), metrics={})
    assert plausibility.loss_status(bare) == "missing"
    assert plausibility.loss_status({**bare, "no_loss": "no model"}) == "none"
    assert (
        plausibility.fail_check(bare) is None
        and plausibility.fail_check({**bare, "no_loss": "no model"}) is None
    )


def test_every_model_logs_a_loss_or_declares_it_has_none():
    """The NaN check relies on it: a new model that neither logs ``loss=`` nor sets
    ``NO_LOSS`` would go unchecked."""
    for path in sorted((ROOT / "milarun" / "models").glob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        if not any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
            continue  # a module the workloads share (models/llm.py), not a workload
        logs = any(
            isinstance(n, ast.Call)
            and getattr(n.func, "attr", None) == "log"
            and any(k.arg and plausibility.is_loss_key(k.arg) for k in n.keywords)
            for n in ast.walk(tree)
        )
        declares = any(
            isinstance(n, ast.Assign)
            and any(getattr(t, "id", None) == "NO_LOSS" for t in n.targets)
            for n in tree.body
        )
        assert logs or declares, f"{path.name} neither logs a loss nor declares NO_LOSS"


@pytest.mark.parametrize(
    "samples_,words",
    [
        (samples(n=3, warmup=3), "none of the 3 sample(s)"),
        ([], "none of the 0 sample(s)"),
        ([{**s, "count": 0, "rate": 0.0} for s in samples()], "0 items/s"),
    ],
)
def test_no_steady_state_fails_the_result(samples_, words):
    rec = record(samples_=samples_)
    reason, message = plausibility.fail_check(rec)
    assert reason == "no-steady-state" and words in message


def test_a_short_steady_state_is_allowed_by_the_window_rule():
    rec = record(samples_=samples(n=4, warmup=2, loss=lambda i: 1.0))  # 2 s of steady state
    assert plausibility.fail_check(rec) is None


def test_failed_records_are_not_judged_again():
    rec = record(
        samples_=[],
        metrics={"loss": None},
        success=False,
        error={"reason": "timeout", "message": "slow"},
    )
    assert plausibility.judge(rec) is rec


def test_records_written_before_the_checks_fail_in_the_summary(tmp_path):
    # written as successes, as an older milarun would have
    good = record(device="0")
    diverged = record(
        device="1", samples_=samples(loss=lambda i: None if i > 5 else 1.0), metrics={"loss": None}
    )
    empty = record(name="s.u", samples_=samples(n=2, warmup=2))
    for rec in (good, diverged, empty):
        write_result(rec, tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert not any(".FAIL." in n for n in names)
    from milarun.analysis.summary import summarize_dir

    summary, _ = summarize_dir(tmp_path)
    t = summary["tests"]["s.t"]
    assert (t["n"], t["failures"], t["failure_reasons"]) == (2, 1, {"nan-loss": 1})
    assert t["failed"][0]["device"] == "1" and "sample 6" in t["failed"][0]["message"]
    assert t["train"]["n"] == 1 and t["train"]["mean"] == pytest.approx(100.0)
    u = summary["tests"]["s.u"]
    assert u["failure_reasons"] == {"no-steady-state": 1} and u["train"]["n"] == 0


# -------------------------------------------------------------- real children


def _run(tmp_path, function, *argv):
    from milarun.cli.run import run_experiment

    out = tmp_path / "r.json"
    code = run_experiment(function, list(argv), out=str(out))
    return code, json.loads(out.read_text())


def test_a_child_whose_loss_turns_nan_writes_a_nan_loss_fail(tmp_path):
    code, rec = _run(
        tmp_path,
        "milarun.models.faults:nan",
        "--max-count",
        "30",
        "--sample-duration",
        "0.02",
        "--warmup",
        "1",
        "--after",
        "15",
        "--step-seconds",
        "0.002",
    )
    assert code == 1 and rec["success"] is False
    assert rec["error"]["reason"] == "nan-loss" and rec["error"]["type"] == "ValidationError"
    losses = [s.get("loss") for s in rec["timings"]["train"]["samples"]]
    assert losses[0] is not None and math.isfinite(losses[0]) and losses[-1] is None
    validate(rec)


def test_a_child_with_only_warm_up_samples_writes_a_no_steady_state_fail(tmp_path):
    code, rec = _run(tmp_path, "milarun.models.faults:crawl", "--max-count", "2")
    assert code == 1 and rec["error"]["reason"] == "no-steady-state"
    assert rec["no_loss"] == "fault-injection workloads train nothing"


def test_a_real_training_run_logs_its_loss_per_sample_and_passes(tmp_path):
    code, rec = _run(
        tmp_path,
        "milarun.models.toy_reg:main",
        "--max-count",
        "3000",
        "--batch-size",
        "16",
        "--sample-duration",
        "0.005",
        "--warmup",
        "1",
        "--device",
        "cpu",
    )
    assert code == 0 and rec["success"] is True, rec["error"]
    train = rec["timings"]["train"]["samples"]
    assert all(math.isfinite(s["loss"]) for s in train) and "no_loss" not in rec


def test_the_launcher_names_the_fail_file_and_keeps_the_reason(tmp_path):
    profile = tmp_path / "v.json"
    profile.write_text(
        json.dumps(
            {
                "nan": {
                    "experiment": "milarun.models.faults:nan",
                    "partition_scheme": {"type": "normal"},
                    "arguments": {
                        "max-count": 20,
                        "after": 5,
                        "sample-duration": 0.01,
                        "warmup": 0,
                        "step-seconds": 0.002,
                    },
                }
            }
        )
    )
    (tmp_path / "data").mkdir()
    proc = subprocess.run(
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
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    (name,) = [p.name for p in (tmp_path / "out").glob("*.json")]
    assert name.startswith("v.nan.J0.all.FAIL.")
    rec = json.loads((tmp_path / "out" / name).read_text())
    assert rec["error"]["reason"] == "nan-loss" and "loss is" in rec["error"]["message"]
    assert rec["host_load"]["suite_root"] == "launcher"


# ------------------------------------------------------------------ flags


def gpu_record(load=90.0, memory_mib=800.0, job=None, outside=0.0, steal=None, device="0"):
    """A GPU result (device 0, 1000 MiB) with monitor readings at ``load`` % and
    ``memory_mib``, and host-load samples with ``outside`` and ``steal`` cores (2 CPUs)."""
    readings = [
        {
            "t": 0.5 * k,
            "device": int(device),
            "load": load,
            "memory_mib": memory_mib,
            "power": 100.0,
        }
        for k in range(50)
    ]
    load_samples = []
    for k in range(1, 25):
        row = {"t": float(k), "dt": 1.0, "busy": outside + 1.0, "suite": 1.0, "outside": outside}
        if steal is not None:
            row["steal"] = steal
        load_samples.append(row)
    rec = record(device=device, job=job)
    rec["gpu_monitor"] = {"available": True, "reason": None, "interval": 0.5, "samples": readings}
    rec["host_load"] = {
        "available": True,
        "reason": None,
        "interval": 1.0,
        "cpu_count": 2,
        "suite_root": "launcher",
        "samples": load_samples,
    }
    return validate(rec)


def checks(rec):
    return {f.id: f.as_dict() for f in plausibility.flags(rec)}


def test_no_flag_on_a_busy_gpu_and_an_idle_host():
    assert plausibility.flags(gpu_record()) == []


def test_gpu_and_host_flags_with_the_default_thresholds():
    got = checks(gpu_record(load=20.0, memory_mib=50.0, outside=0.5, steal=0.2))
    assert set(got) == {"gpu-load", "gpu-memory", "host-busy", "cpu-steal"}
    assert got["gpu-load"]["value"] == pytest.approx(0.2) and got["gpu-load"]["threshold"] == 0.5
    assert (
        got["gpu-load"]["gpu"] == 0
        and "GPU 0: mean GPU load 20% < 50%" in got["gpu-load"]["message"]
    )
    assert got["gpu-memory"]["value"] == pytest.approx(0.05)
    assert got["host-busy"]["value"] == pytest.approx(0.25)  # 0.5 of 2 CPUs
    assert "0.50 of the host's 2 CPUs (25% > 10%)" in got["host-busy"]["message"]
    assert got["cpu-steal"]["value"] == pytest.approx(0.1)


def test_the_readings_outside_the_steady_state_do_not_count():
    rec = gpu_record()
    # idle GPU during the warm-up only (t < 3): still no flag
    for r in rec["gpu_monitor"]["samples"]:
        if r["t"] < 3.0:
            r["load"] = 0.0
    assert plausibility.flags(rec) == []
    start, end = plausibility.steady_window(rec)[1:3]
    assert (start, end) == (10.0, 20.0)  # the 10 s window before the last second


def test_thresholds_come_from_the_profile(tmp_path):
    profile = tmp_path / "p.json"
    profile.write_text(
        json.dumps(
            {
                "*": {
                    "validation": {
                        "usage": {"gpu_load_threshold": 0.1},
                        "host": {"outside_cpu_threshold": None},
                    }
                },
                "strict": {
                    "experiment": "milarun.models.toy_reg:main",
                    "validation": {
                        "usage": {"gpu_mem_threshold": 0.9},
                        "host": {"steal_threshold": 0.5},
                    },
                },
                "plain": {"experiment": "milarun.models.toy_reg:main"},
            }
        )
    )
    jobs = {j.name: j for j in load_profile(profile)}
    strict = checks(
        gpu_record(
            load=20.0, memory_mib=800.0, outside=0.5, steal=0.2, job=jobs["strict"].definition
        )
    )
    # load 20% > 0.1 (from "*"), memory 80% < 0.9, host-busy off (null), steal 10% < 50%
    assert set(strict) == {"gpu-memory"} and strict["gpu-memory"]["threshold"] == 0.9
    plain = checks(
        gpu_record(load=5.0, memory_mib=800.0, outside=0.5, job=jobs["plain"].definition)
    )
    assert set(plain) == {"gpu-load"} and plain["gpu-load"]["threshold"] == 0.1


def test_a_bad_validation_block_is_one_profile_error(tmp_path):
    from milarun.errors import ProfileError

    profile = tmp_path / "p.json"
    profile.write_text(
        json.dumps(
            {
                "t": {
                    "experiment": "milarun.models.toy_reg:main",
                    "validation": {"usage": {"gpu_load_threshold": 50}},
                }
            }
        )
    )
    with pytest.raises(ProfileError) as exc:
        load_profile(profile)
    assert str(exc.value).endswith(
        "job 't', key 'validation.usage.gpu_load_threshold': must be "
        "a fraction from 0 to 1, or null (check off)"
    )


def test_cpu_results_get_no_gpu_flag():
    rec = gpu_record(load=0.0)
    rec["gpu_monitor"] = {
        "available": False,
        "reason": "no visible GPU",
        "interval": 1.0,
        "samples": [],
    }
    assert plausibility.flags(rec) == []


def test_the_summary_and_the_report_show_the_flags(tmp_path):
    from milarun.report import build_report, render_html, render_text

    recs = [gpu_record(load=20.0, device="0"), gpu_record(device="1")]
    summary = summarize([(tmp_path / f"r{i}.json", r) for i, r in enumerate(recs)])
    check_summary(summary)
    flags = summary["tests"]["s.t"]["validation_flags"]
    assert [(f["device"], f["check"], f["node"], f["file"]) for f in flags] == [
        ("0", "gpu-load", "h1", "r0.json")
    ]
    again = normalize_summary(json.loads(json.dumps(summary)))
    assert again["tests"]["s.t"]["validation_flags"] == flags
    report = build_report(again)
    text = render_text(report)
    assert (
        "validation flags (counted in the score; see docs/report.md):\n"
        "  s.t run 0 device 0 node h1: gpu-load: GPU 0: mean GPU load 20% < 50% during the "
        "steady state\n"
    ) in text
    page = render_html(report)
    assert 'id="validation-flags"' in page and "gpu-load" in page
    assert report.n_total == 2 and report.fail_total == 0  # flagged, not failed


def test_no_flag_section_without_flags(tmp_path):
    summary = summarize([record()])
    assert "validation_flags" not in summary["tests"]["s.t"]
    from milarun.report import build_report, render_text

    assert "validation flags" not in render_text(build_report(normalize_summary(summary)))


def test_records_keep_their_new_fields_through_the_schema():
    rec = gpu_record(outside=0.2, steal=0.0)
    rec["no_loss"] = "why"
    validate(rec)
    bad = copy.deepcopy(rec)
    bad["host_load"]["samples"][0]["outside"] = -1
    from milarun.errors import ResultFormatError

    with pytest.raises(ResultFormatError, match="host_load.samples.0.outside"):
        validate(bad)
