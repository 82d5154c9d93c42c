"""Host facts (milarun.host.facts): sysfs and NVML facts from fakes, milarun's version and
commit, the facts in a real record, in the summary and the report header, and the
``--compare`` warning when they differ from the baseline's."""

import io
import json
import re
import sys
import types

import pytest
from conftest import ROOT

from milarun.host import facts as hostfacts
from milarun.host import isolation


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def test_cpu_facts_from_sysfs(tmp_path):
    for c, gov, khz in (
        (0, "performance", 3500000),
        (1, "performance", 3700000),
        (2, "powersave", 3700000),
    ):
        _write(tmp_path / f"cpu{c}/cpufreq/scaling_governor", gov)
        _write(tmp_path / f"cpu{c}/cpufreq/cpuinfo_max_freq", str(khz))
        _write(tmp_path / f"cpu{c}/cpufreq/scaling_driver", "acpi-cpufreq")
    _write(tmp_path / "cpufreq/boost", "1")
    facts = hostfacts.cpu_facts([0, 1], sysfs=tmp_path)
    assert facts["cpu_governor"] == "performance" and facts["cpu_boost"] is True
    assert facts["cpu_max_mhz"] == 3700.0 and facts["cpu_freq_driver"] == "acpi-cpufreq"
    assert facts["kernel"]
    assert (
        hostfacts.cpu_facts([0, 2], sysfs=tmp_path)["cpu_governor"]
        == "mixed: performance, powersave"
    )


def test_intel_no_turbo_and_a_host_without_cpufreq(tmp_path):
    _write(tmp_path / "intel_pstate/no_turbo", "1")
    assert hostfacts.cpu_facts([0], sysfs=tmp_path)["cpu_boost"] is False
    bare = hostfacts.cpu_facts([0], sysfs=tmp_path / "none")
    assert {
        k: bare[k] for k in ("cpu_governor", "cpu_boost", "cpu_max_mhz", "cpu_freq_driver")
    } == dict.fromkeys(("cpu_governor", "cpu_boost", "cpu_max_mhz", "cpu_freq_driver"))


def fake_nvml(supported=True):
    nv = types.ModuleType("pynvml")
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_FEATURE_ENABLED = 1, 2, 1

    def need(value):
        def call(handle, *args):
            if not supported:
                raise RuntimeError("Not Supported")
            return value(*args) if callable(value) else value

        return call

    nv.nvmlDeviceGetEnforcedPowerLimit = need(700000)
    nv.nvmlDeviceGetPowerManagementDefaultLimit = need(700000)
    nv.nvmlDeviceGetMaxClockInfo = need(lambda kind: {1: 1980, 2: 2619}[kind])
    nv.nvmlDeviceGetApplicationsClock = need(lambda kind: {1: 1755, 2: 2619}[kind])
    nv.nvmlDeviceGetClockInfo = need(lambda kind: {1: 345, 2: 2619}[kind])
    nv.nvmlDeviceGetPersistenceMode = need(1)
    nv.nvmlDeviceGetEccMode = need((1, 1))
    return nv


def test_gpu_facts_from_nvml():
    assert hostfacts.gpu_facts(fake_nvml(), object()) == {
        "power_limit_w": 700.0,
        "power_limit_default_w": 700.0,
        "sm_clock_max_mhz": 1980,
        "mem_clock_max_mhz": 2619,
        "sm_clock_app_mhz": 1755,
        "mem_clock_app_mhz": 2619,
        "sm_clock_mhz": 345,
        "persistence_mode": True,
        "ecc_mode": True,
    }
    assert set(hostfacts.gpu_facts(fake_nvml(supported=False), object()).values()) == {None}


def test_host_facts_take_the_gpu_facts(monkeypatch):
    from milarun.bench.experiment import host_facts

    nv = fake_nvml()
    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetCount = lambda: 1
    nv.nvmlDeviceGetHandleByIndex = lambda i: object()
    nv.nvmlSystemGetDriverVersion = lambda: "999.1"
    nv.nvmlDeviceGetName = lambda h: "Fake GPU"
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=2**30)
    nv.nvmlDeviceGetUUID = lambda h: "GPU-0"
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (gpu,) = host_facts()["gpus"]
    assert gpu["power_limit_w"] == 700.0 and gpu["ecc_mode"] is True


def test_milarun_version_and_commit():
    src = hostfacts.milarun_source()
    from milarun import __version__

    assert src["milarun_version"] == __version__
    if (ROOT / ".git").exists():
        assert re.fullmatch(r"[0-9a-f]{40}", src["milarun_commit"])
        assert isinstance(src["milarun_dirty"], bool)


def test_no_commit_outside_a_clone(tmp_path):
    (tmp_path / "pkg" / "milarun").mkdir(parents=True)
    src = hostfacts.milarun_source(tmp_path / "pkg" / "milarun")
    assert src["milarun_commit"] is None and src["milarun_dirty"] is None


@pytest.mark.parametrize(
    "v2,files,cores",
    [
        (True, {"cpu.max": "200000 100000"}, 2.0),
        (True, {"cpu.max": "max 100000"}, None),
        (False, {"cpu.cfs_quota_us": "150000", "cpu.cfs_period_us": "100000"}, 1.5),
        (False, {"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000"}, None),
    ],
)
def test_cgroup_cpu_quota(tmp_path, monkeypatch, v2, files, cores):
    group = tmp_path / ("student0" if v2 else "cpu/student0")
    for name, text in files.items():
        _write(group / name, text)
    monkeypatch.setattr(isolation, "CGROOT", tmp_path)
    monkeypatch.setattr(
        isolation, "_proc_cgroups", lambda pid="self": {"" if v2 else "cpu": "/student0"}
    )
    assert isolation.current_cpu_quota() == cores


def test_a_real_record_holds_the_host_facts_and_the_host_load(tmp_path):
    from milarun.cli.run import run_experiment

    out = tmp_path / "r.json"
    assert (
        run_experiment(
            "milarun.models.faults:crawl",
            [
                "--max-count",
                "20",
                "--warmup",
                "0",
                "--sample-duration",
                "0.05",
                "--step-seconds",
                "0.01",
            ],
            out=str(out),
        )
        == 0
    )
    rec = json.loads(out.read_text())
    host = rec["host"]
    for key in (
        "milarun_version",
        "milarun_commit",
        "kernel",
        "cpu_governor",
        "cpu_boost",
        "cgroup_cpu_quota",
        "memory_limit_mib",
        "cpuset",
    ):
        assert key in host, key
    assert host["kernel"] and host["milarun_version"]
    load = rec["host_load"]
    assert load["available"] is True and load["suite_root"] == "self" and load["cpu_count"]
    assert all(s["outside"] >= 0 and s["busy"] >= 0 for s in load["samples"])


def summary_with(facts, cpus=4):
    from milarun.analysis.summary import summarize
    from milarun.formats.record import new_result

    recs = []
    for dev in (0, 1):
        rec = new_result("s.t", f"0.{dev}", device=str(dev), devices=[dev])
        rec["host"] = {
            "hostname": "h",
            "cpu_model": "cpu",
            "cpuset": list(range(cpus + dev)),
            "memory_limit_mib": 4096.0 - dev,
            "gpus": [
                {
                    "index": dev,
                    "name": "G",
                    "driver": "1",
                    "power_limit_w": 700.0 if dev == 0 else 650.0,
                    "sm_clock_max_mhz": 1980,
                    "ecc_mode": True,
                }
            ],
            **facts,
        }
        rec["timings"]["train"]["samples"] = [
            {"start": 1.0, "end": 2.0, "count": 10, "rate": 10.0, "warmup": False}
        ]
        rec["success"] = True
        recs.append(rec)
    return summarize(recs)


FACTS = {
    "milarun_version": "0.1.0",
    "milarun_commit": "a" * 40,
    "milarun_dirty": False,
    "kernel": "6.8.0",
    "cpu_governor": "performance",
    "cpu_boost": True,
}


def test_the_summary_keeps_the_facts_per_host():
    from milarun.formats.summary import check_summary, normalize_summary

    summary = summary_with(FACTS)
    check_summary(summary)
    (host,) = summary["hosts"]
    assert {k: host[k] for k in FACTS} == FACTS
    # GPUs that differ show both values; the student limits are the tightest seen
    assert host["power_limit_w"] == "650/700" and host["sm_clock_max_mhz"] == 1980
    assert host["ecc_mode"] is True
    assert (host["student_cpus"], host["memory_limit_mib"]) == (4, 4095.0)
    assert normalize_summary(json.loads(json.dumps(summary)))["hosts"] == summary["hosts"]


def test_the_report_header_shows_the_facts():
    from milarun.formats.summary import normalize_summary
    from milarun.report import build_report, render_html, render_text

    report = build_report(normalize_summary(summary_with(FACTS)))
    text = render_text(report)
    assert (
        "host facts (h): milarun 0.1.0 (aaaaaaaaaaaa) | kernel 6.8.0 | CPU governor "
        "performance | boost on | GPU power limit 650/700 W | SM clock max 1980 MHz | "
        "ECC on | CPUs per student 4 | memory per student 4095 MiB\n"
    ) in text
    assert "Host facts: milarun 0.1.0 (aaaaaaaaaaaa) · kernel 6.8.0" in render_html(report)


def test_compare_warns_when_facts_differ_from_the_baseline(tmp_path):
    from milarun.formats.summary import write_summary
    from milarun.report import make_report

    base = tmp_path / "base.json"
    write_summary(
        summary_with({**FACTS, "cpu_governor": "powersave", "kernel": None}, cpus=8), base
    )
    results = tmp_path / "results"
    from milarun.formats.record import new_result
    from milarun.formats.store import write_result

    for dev in (0, 1):
        rec = new_result("s.t", f"0.{dev}", device=str(dev), devices=[dev])
        rec["host"] = {
            "hostname": "h",
            "cpu_model": "cpu",
            "cpuset": list(range(4 + dev)),
            "memory_limit_mib": 4096.0 - dev,
            "gpus": [],
            **FACTS,
        }
        rec["timings"]["train"]["samples"] = [
            {"start": 1.0, "end": 2.0, "count": 10, "rate": 10.0, "warmup": False}
        ]
        rec["metrics"] = {"loss": 1.0}
        rec["success"] = True
        write_result(rec, results)
    warn = io.StringIO()
    report, text = make_report(str(results), compare=str(base), warn=warn)
    assert [d[0] for d in report.host_diffs] == ["CPU governor", "CPUs per student"]
    assert warn.getvalue() == (
        f"milarun: warning: {base}: host fact differs from the baseline's: CPU governor: "
        "performance (baseline: powersave)\n"
        f"milarun: warning: {base}: host fact differs from the baseline's: CPUs per student: "
        "4 (baseline: 8)\n"
    )
    assert (
        "host facts differ from the baseline's (results may not be comparable):\n"
        "  CPU governor: performance (baseline: powersave)\n"
    ) in text
    # the kernel is not in the baseline: not compared; a 2020 baseline has no facts at all
    warn = io.StringIO()
    report, _ = make_report(
        str(results), compare=str(ROOT / "tests/fixtures/baseline2020.json"), warn=warn
    )
    assert report.host_diffs == [] and warn.getvalue() == ""


def test_the_accelerator_record_reaches_the_header_and_compare():
    from milarun.formats.summary import normalize_summary
    from milarun.report import build_report, render_text

    amd = {
        "backend": "amd",
        "vendor": "AMD",
        "driver": "6.7.0",
        "runtime": "6.2.1",
        "runtime_name": "ROCm",
    }
    nvidia = {
        "backend": "nvidia",
        "vendor": "NVIDIA",
        "driver": "550.54",
        "runtime": "12.4",
        "runtime_name": "CUDA",
    }
    ours = normalize_summary(summary_with({**FACTS, "accelerator": amd}))
    (host,) = ours["hosts"]
    assert (host["gpu_vendor"], host["gpu_backend"], host["gpu_runtime"]) == (
        "AMD",
        "amd",
        "ROCm 6.2.1",
    )
    assert "GPU vendor AMD | backend amd | runtime ROCm 6.2.1 | kernel 6.8.0" in render_text(
        build_report(ours)
    )
    base = normalize_summary(summary_with({**FACTS, "accelerator": nvidia}))
    assert hostfacts.differences(ours, base)[:3] == [
        ("GPU vendor", "AMD", "NVIDIA"),
        ("device backend", "amd", "nvidia"),
        ("GPU runtime", "ROCm 6.2.1", "CUDA 12.4"),
    ]
    # a record without the field (older, or CPU slots) adds nothing
    assert "gpu_vendor" not in hostfacts.machine_facts(FACTS)
