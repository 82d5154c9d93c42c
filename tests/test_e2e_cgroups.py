"""End to end under real student cgroups (root only; CI runs as root).

Skips with the reason where cgroups cannot be created, unless
$MILARUN_REQUIRE_CGROUPS=1, which turns the skip into a failure.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MEMORY, ROOT, cgroup_skip  # noqa: F401 (students: conftest)

pytestmark = [pytest.mark.cgroup]


def milarun(*args):
    return subprocess.run(
        [sys.executable, "-m", "milarun", *args], cwd=ROOT, capture_output=True, text=True
    )


def results(outdir):
    return {p.name: json.loads(p.read_text()) for p in Path(outdir).glob("*.json")}


def test_setup_script_is_idempotent_and_exclusive(students):
    assert sorted(students) == ["student0", "student1"]
    assert not set(students["student0"]) & set(students["student1"])
    again = subprocess.run(
        ["bash", "scripts/cgroup_setup.sh", "--students", "2", "--memory", MEMORY],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert again.returncode == 0, again.stderr
    assert "student1: cpus=" in again.stdout


@pytest.mark.slow
def test_cpu_profile_in_student_cgroups(students, tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    proc = milarun("jobs", "profiles/cpu.json", "--cpu-slots", "2", "-d", str(data), "-o", str(out))
    res = results(out)
    failed = {n: (r.get("error") or {}) for n, r in res.items() if not r.get("success")}
    assert proc.returncode == 0, (failed, proc.stdout + proc.stderr[-3000:])
    assert res and proc.stdout.strip().endswith(f"{len(res)} passed, 0 failed")
    limit_mib = int(MEMORY[:-1]) * 1024
    per_gpu = [r for r in res.values() if r["partition"] == "per-gpu"]
    assert per_gpu
    for r in res.values():
        assert r["success"], (r["name"], r["error"])
        steady = [s for s in r["timings"]["train"]["samples"] if not s["warmup"]]
        assert steady, r["name"]
    for r in per_gpu:
        dev = r["devices"][0]
        assert r["host"]["cpuset"] == students[f"student{dev}"], r["name"]
        assert r["host"]["memory_limit_mib"] == pytest.approx(limit_mib), r["name"]
        assert f"student{dev}" in r["host"]["cgroup"]
    # both students ran every per-gpu test
    names = {r["name"] for r in per_gpu}
    for name in names:
        assert sorted(r["device"] for r in per_gpu if r["name"] == name) == ["0", "1"]


def test_memory_hog_is_oom_killed_and_the_rest_pass(students, tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    proc = milarun(
        "jobs", "tests/profiles/oom.json", "--cpu-slots", "2", "-d", str(data), "-o", str(out)
    )
    assert proc.returncode == 1
    assert proc.stdout.strip().endswith("2 passed, 2 failed")
    res = results(out)
    hogs = [r for r in res.values() if r["name"] == "oom.memhog"]
    toys = [r for r in res.values() if r["name"] == "oom.toy_reg"]
    assert len(hogs) == 2 and len(toys) == 2
    for r in hogs:
        assert r["success"] is False
        assert r["error"]["reason"] == "oom-killed"
        assert r["error"]["signal"] == 9
    for r in toys:
        assert r["success"] is True
        assert r["host"]["cpuset"] == students[f"student{r['devices'][0]}"]
    assert all(".FAIL." in name for name, r in res.items() if r["name"] == "oom.memhog")
