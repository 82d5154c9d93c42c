"""Shared fixtures. Tests run on CPU; cgroup tests need root (CI runs as root)."""

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def cgroup_skip(reason):
    """Skip a cgroup test, or fail it when $MILARUN_REQUIRE_CGROUPS=1 (set by .ci/run)."""
    if os.environ.get("MILARUN_REQUIRE_CGROUPS") == "1":
        pytest.fail(f"cgroup test cannot run but MILARUN_REQUIRE_CGROUPS=1: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def tiny_dataroot(tmp_path_factory):
    """A dataroot shared by the whole session; builders fill it on demand."""
    return tmp_path_factory.mktemp("dataroot")


def build_tiny(dataroot, *names):
    """Build the tiny size of each named dataset under ``dataroot``."""
    from milarun.datasets import prepare
    for name in names:
        prepare(name, dataroot, size="tiny", log=lambda *a: None)
    return dataroot


def run_model(function, argv, dataroot=None, tmp_path=None, name="test.model"):
    """Run ``module:function`` in-process like ``milarun run`` and return the result dict."""
    from milarun.cli.run import run_experiment
    out = Path(tmp_path) / "result.json"
    code = run_experiment(function, list(argv), out=str(out),
                          dataroot=str(dataroot) if dataroot else None, name=name)
    result = json.loads(out.read_text())
    result["_exit_code"] = code
    return result


def steady_samples(result):
    """Samples not flagged as warm-up."""
    return [s for s in result["timings"]["train"]["samples"] if not s["warmup"]]


# A window shorter than any step makes every step its own sample, so "at least 2
# steady samples" means "at least 3 steps" whatever the machine's speed.
SMOKE_ARGS = ["--sample-duration", "0.001", "--warmup", "1"]
