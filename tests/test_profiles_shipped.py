"""The shipped profiles and weights are valid and consistent."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT

from milarun.bench.setup import PRECISIONS
from milarun.profile.language import load_profile
from milarun.profile.templates import EXAMPLE_VALUES

STANDARD_TESTS = [
    "toy_reg",
    "toy_lstm",
    "vae",
    "loader",
    "convnet",
    "convnet_fp16",
    "reso",
    "fast_style",
    "dcgan",
    "wlm",
    "wlmfp16",
    "translator",
    "ssd",
    "recom",
    "cart",
    "ppo",
    "ddp_convnet",
    "scaling",
    "matmul",
]
#: The inference section (multi-process plan type): too slow to start on CPU slots for
#: the cpu profile (torch and torchvision import on one pinned core each).
INFERENCE_TESTS = ["infer_resnet50", "infer_encoder"]
WITH_INFERENCE = ["standard", "lite", "legacy2020"]
#: The LLM section: every GPU profile; the cpu profile has no tensor-parallel
#: serving (a 2-rank TP test adds little on CPU slots that the 2-rank FSDP one lacks).
LLM_TESTS = [
    "llm_pretrain",
    "llm_fsdp",
    "llm_lora",
    "llm_lora_ddp",
    "llm_serve",
    "llm_serve_tp",
    "llm_server",
    "llm_server_tp",
]
#: llm_moe over 2 slots shards its dense part with FSDP2 as llm_fsdp does: llm_fsdp left the
#: cpu profile for it (the quickstart's 5 minutes; it stays in the GPU profiles).
CPU_LLM_TESTS = ["llm_pretrain", "llm_lora", "llm_server", "llm_moe"]
#: Mixture-of-experts pre-training: the profiles whose GPUs hold the GPT-OSS-20B class (40 GB
#: a GPU on 8), and the cpu profile's tiny shape.
MOE_TESTS = {"standard": ["llm_moe"], "lite": ["llm_moe"]}
#: The cpu profile keeps one test per workload family of the 2020 suite (room for the LLM
#: tests within the quickstart's 5 minutes; docs/profiles.md says what left).
CPU_TESTS = [
    "toy_reg",
    "loader",
    "convnet",
    "wlm",
    "translator",
    "recom",
    "ppo",
    "ddp_convnet",
    "matmul",
]
#: Diffusion and vision transformers: every GPU profile (5gb and 10gb leave out
#: what cannot fit: SD 2 training, and ViT-L on 5 GB); tiny versions on CPU.
VISION_TESTS = {
    "standard": ["diffusion", "diffusion_ddp", "txt2img", "vit_b", "vit_l", "vit_ddp"],
    "lite": ["diffusion", "diffusion_ddp", "txt2img", "vit_b", "vit_l", "vit_ddp"],
    "10gb": ["txt2img", "vit_b", "vit_l", "vit_ddp"],
    "5gb": ["txt2img", "vit_b", "vit_ddp"],
    "cpu": ["diffusion", "vit"],
}
#: The 2020 suite alone, for comparisons with 2020 baselines under the 2020 weights.
LEGACY_PROFILES = ["legacy2020"]
PROFILES = sorted(p.stem for p in (ROOT / "profiles").glob("*.json"))
#: The cluster profiles hold only what several nodes add (one test per plan type across nodes).
CLUSTER_PROFILES = ["cluster", "cluster-cpu"]
#: The input-pipeline study (milarun.models.io, tests/test_io_study.py): its own tests only.
STUDY_PROFILES = ["io", "io-seed"]
#: The acceptance profiles (docs/acceptance.md): their own tests only, each
#: sweep or burn-in ending the test by itself (no --min-steady floor).
ACCEPTANCE_TESTS = {
    "acceptance": [
        "collectives",
        "collectives_nodes",
        "collectives_all_nodes",
        "collectives_fabric",
        "checkpoint",
        "checkpoint_all_nodes",
        "smallfiles",
        "smallfiles_all_nodes",
        "soak",
        "soak_all_nodes",
        "bandwidth",
        "bandwidth_remote_numa",
        "matmul",
        "matmul_sustained",
        "burn",
    ],
    "acceptance-cpu": [
        "collectives",
        "bandwidth",
        "matmul",
        "burn",
        "checkpoint",
        "smallfiles",
        "soak",
    ],
}


def test_standard_dry_run_lists_every_test(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "milarun",
            "jobs",
            "profiles/standard.json",
            "--dry-run",
            "--no-cgexec",
            "-d",
            str(tmp_path),
            "-o",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    # the dry run checks the exec prefix (nocache) as a real run does; nothing else may fail
    errors = [line for line in proc.stderr.splitlines() if line.startswith("milarun: error:")]
    assert all("exec_prefix program 'nocache'" in line for line in errors), proc.stderr
    assert proc.returncode == (2 if errors else 0)
    out = proc.stdout
    listed = {
        line.split()[1].split(".")[1] for line in out.splitlines() if line.startswith("# standard.")
    }
    assert listed == set(
        STANDARD_TESTS
        + INFERENCE_TESTS
        + LLM_TESTS
        + VISION_TESTS["standard"]
        + MOE_TESTS["standard"]
    )


@pytest.mark.parametrize("name", PROFILES)
def test_profile_validates_and_weights_match(name):
    jobs = load_profile(ROOT / "profiles" / f"{name}.json")
    weights = json.loads((ROOT / "weights" / f"{name}.json").read_text())
    weighted = {k for k in weights if not k.startswith("_")}
    assert weighted == {j.full_name for j in jobs}
    if name in CLUSTER_PROFILES:
        kinds = {j.plan_type for j in jobs}
        assert {"per-gpu", "njobs", "multi-node", "node-progression"} <= kinds
    elif name in STUDY_PROFILES:
        assert {j.experiment for j in jobs} == {"milarun.models.io:main"}
    elif name in ACCEPTANCE_TESTS:
        assert sorted(j.name for j in jobs) == sorted(ACCEPTANCE_TESTS[name])
        kinds = {j.name: j.plan_type for j in jobs}
        assert kinds["collectives"] == "njobs" and kinds["burn"] == "per-gpu"
        assert all(weights[j.full_name]["weight"] > 0 for j in jobs)
    else:
        extra = INFERENCE_TESTS if name in WITH_INFERENCE else []
        if name == "cpu":
            expected = CPU_TESTS + CPU_LLM_TESTS + VISION_TESTS["cpu"]
        elif name in LEGACY_PROFILES:
            expected = STANDARD_TESTS + INFERENCE_TESTS
        else:
            expected = STANDARD_TESTS + extra + LLM_TESTS + VISION_TESTS[name]
            expected += MOE_TESTS.get(name, [])
        assert sorted(j.name for j in jobs) == sorted(expected)
    for job in jobs:
        if job.name in INFERENCE_TESTS:
            assert job.plan_type == "multi-process" and weights[job.full_name]["weight"] > 0


def test_acceptance_profile_dry_runs_on_a_cpu_host(tmp_path):
    (tmp_path / "data").mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "milarun",
            "jobs",
            "profiles/acceptance.json",
            "--dry-run",
            "--no-cgexec",
            "-d",
            str(tmp_path / "data"),
            "-o",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    listed = {
        line.split()[1].split(".")[1]
        for line in proc.stdout.splitlines()
        if line.startswith("# acceptance.")
    }
    assert listed == set(ACCEPTANCE_TESTS["acceptance"])


def test_cpu_profile_prepares_its_own_data():
    jobs = load_profile(ROOT / "profiles" / "cpu.json")
    for job in jobs:
        if any(
            word in job.experiment
            for word in ("vae", "loader", "convnet", "reso", "dcgan", "wlm", "translator", "recom")
        ):
            assert job.prepare and "dataset" in job.prepare[0], job.name


@pytest.mark.parametrize(
    "name,floor", [("standard", 30), ("5gb", 30), ("10gb", 30), ("lite", 12), ("cluster", 30)]
)
def test_gpu_profiles_guarantee_their_steady_state(name, floor):
    # --min-steady makes the steady-state length hold on any GPU, whatever
    # the --max-count estimates are worth there.
    for job in load_profile(ROOT / "profiles" / f"{name}.json"):
        assert job.arguments.get("--min-steady", 0) >= floor, job.name
        assert job.timeout >= 10 * floor, job.name


class _ParseOnly:
    """Stands in for an Experiment: parses the test's options, trains nothing."""

    def cli(self, fn, argv):
        from coleo import make_cli

        from milarun.bench.experiment import _entry
        from milarun.bench.options import common_options

        self.opts, _ = make_cli(_entry, argv=list(argv), extras=[common_options, fn])


@pytest.mark.parametrize("name", PROFILES)
def test_every_shipped_argument_is_an_option_of_its_test(name, capsys):
    # The GPU profiles never run here; a misspelt option would only show on
    # the first GPU run, as a FAIL for every device.
    import importlib

    for job in load_profile(ROOT / "profiles" / f"{name}.json"):
        module, fn = job.experiment.split(":")
        main = getattr(importlib.import_module(module), fn)
        exp = _ParseOnly()
        argv = job.argv(EXAMPLE_VALUES)  # launch placeholders filled as for an 8-core student
        try:
            main(exp, argv)
        except SystemExit as exc:
            pytest.fail(
                f"{name}.{job.name}: {argv} rejected: "
                f"{capsys.readouterr().err.strip()} (exit {exc.code})"
            )
        parsed = vars(exp.opts)
        for flag, value in job.arguments.items():
            key = flag.lstrip("-").replace("-", "_")
            if isinstance(value, str):
                value = value.format(**EXAMPLE_VALUES)
            if value is not False and value is not True:
                assert str(parsed[key]) == str(value) or parsed[key] == value, (job.name, flag)
        if "--precision" in job.arguments:
            assert job.arguments["--precision"] in PRECISIONS, job.name


BASELINES = sorted((ROOT / "baselines").glob("*/*.json"))


@pytest.mark.parametrize("path", BASELINES, ids=[p.stem for p in BASELINES])
def test_committed_baselines_read_and_match_their_profile(path):
    # baselines/<profile>/<machine>.json: a summary of that profile, with its HTML report
    from milarun.formats.summary import read_summary

    summary = read_summary(path)
    profile = path.parent.name
    jobs = load_profile(ROOT / "profiles" / f"{profile}.json")
    names = {j.full_name for j in jobs}
    groups = set(summary["tests"])
    # a gpu-progression test has one group per device count: suite.job.<k>
    assert {g if g in names else g.rsplit(".", 1)[0] for g in groups} == names
    assert all(t["n"] > 0 for t in summary["tests"].values())
    assert path.with_suffix(".html").is_file()


def test_there_is_a_baseline_for_the_embedded_default():
    assert any(p.parent.name == "cpu" for p in BASELINES)
