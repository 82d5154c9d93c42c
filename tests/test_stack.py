"""The supported versions of milarun's dependencies, checked at start-up (host/stack)."""

import os
import subprocess
import sys
from importlib import metadata

import pytest
import tomllib
from conftest import ROOT
from packaging.requirements import Requirement

from milarun.host.stack import UnsupportedStack, check_stack, problems, requirements


def _versions(**installed):
    def version_of(name):
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    return version_of


def test_a_torch_out_of_range_or_missing_is_named():
    reqs = [Requirement("torch>=2.11,<2.14"), Requirement("coleo==0.3.4")]
    assert problems(reqs, _versions(torch="2.11.0+cu130", coleo="0.3.4")) == []
    assert problems(reqs, _versions(torch="2.13.0", coleo="0.3.4")) == []
    assert problems(reqs, _versions(torch="2.10.0", coleo="0.3.4")) == [
        "torch 2.10.0 is installed; milarun supports torch<2.14,>=2.11"
    ]
    assert problems(reqs, _versions(torch="2.14.0")) == [
        "torch 2.14.0 is installed; milarun supports torch<2.14,>=2.11",
        "coleo is not installed; milarun needs coleo==0.3.4",
    ]


def test_the_installed_metadata_is_pyprojects():
    """The check reads the installed metadata: it must be what pyproject.toml declares
    (a stale editable install would check old ranges)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        declared = {
            Requirement(r).name: str(Requirement(r).specifier)
            for r in tomllib.load(f)["project"]["dependencies"]
        }
    installed = {r.name: str(r.specifier) for r in requirements()}
    assert installed == declared
    assert Requirement(f"torch{declared['torch']}").specifier.contains("2.11.0")
    check_stack()  # this environment (the lock's) is supported


def test_an_extra_or_another_platforms_requirement_is_not_checked(monkeypatch):
    monkeypatch.setattr(
        metadata,
        "requires",
        lambda name: [
            "torch>=2.11",
            "pytest>=8; extra == 'dev'",
            "nosuchpkg; sys_platform == 'nosuch'",
        ],
    )
    assert [r.name for r in requirements()] == ["torch"]
    monkeypatch.setattr(metadata, "requires", lambda name: ["nosuchpkg>=1"])
    with pytest.raises(UnsupportedStack, match="nosuchpkg is not installed.*docs/setup.md"):
        check_stack()


@pytest.fixture
def old_torch(tmp_path):
    """An environment whose torch looks like 2.10.0: a dist-info first on sys.path."""
    info = tmp_path / "site" / "torch-2.10.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.10.0\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    return env


@pytest.mark.parametrize(
    "argv",
    [
        ["devices"],
        ["run", "milarun.models.toy_reg:main", "-o", "OUT"],
        ["jobs", str(ROOT / "profiles" / "cpu.json"), "--dry-run", "--no-cgexec", "-o", "OUT"],
    ],
)
def test_commands_refuse_an_unsupported_torch_in_one_line(old_torch, tmp_path, argv):
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    proc = subprocess.run(
        [sys.executable, "-m", "milarun", *argv],
        env=old_torch,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "milarun: error: torch 2.10.0 is installed; milarun supports torch<2.14,>=2.11 "
        "(see docs/setup.md)"
    ]
    assert not (tmp_path / "out").exists()  # nothing run, nothing written
