"""The profile language: include, inherits, matrix, tags, --select/--exclude, launch
placeholders, the 2020 profile shape, and the shipped profiles' resolved jobs."""

import json
from pathlib import Path

import profile_golden
import pytest
from conftest import ROOT

from milarun.cli import main
from milarun.errors import ProfileError, SetupError
from milarun.host.devices import Devices
from milarun.plan.launches import placeholder_values, plan_job
from milarun.plan.nodes import Cluster, Node
from milarun.profile.includes import profile_files
from milarun.profile.language import load_profile

TOY = "milarun.models.toy_reg:main"
CONV = "milarun.models.convnet:main"
PY = "python"
GPUS = Devices("gpu", [0, 1], cores=16, memory_mib=[81559.0, 40960.0])


def write(folder, name, content):
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def names(jobs):
    return [j.name for j in jobs]


def extra_of(argv):
    return json.loads(argv[argv.index("--extra") + 1])


# --- include --------------------------------------------------------------------------


def test_include_merges_the_included_file_first(tmp_path):
    write(
        tmp_path,
        "base/std.json",
        {
            "*": {"arguments": {"--min-steady": 30}, "timeout": 1800},
            "a": {"experiment": TOY, "arguments": {"--batch-size": 256, "--max-count": 10}},
            "b": {"experiment": TOY},
        },
    )
    top = write(
        tmp_path,
        "small.json",
        {
            "include": ["base/std.json"],
            "*": {"description": "small"},
            "a": {"arguments": {"--batch-size": 64}},
            "c": {"experiment": TOY},
        },
    )
    jobs = load_profile(top)
    assert names(jobs) == ["a", "b", "c"]  # included entries first, in their order
    a = jobs[0]
    assert a.suite == "small" and a.full_name == "small.a"
    # the override keeps the included argument order: the command line does not move
    assert a.argv() == ["--min-steady", "30", "--batch-size", "64", "--max-count", "10"]
    assert a.definition["description"] == "small" and a.timeout == 1800
    assert [p.name for p in profile_files(top)] == ["small.json", "std.json"]


def test_includes_nest_and_apply_in_order(tmp_path):
    write(tmp_path, "a.json", {"x": {"experiment": TOY, "arguments": {"--n": 1}}})
    write(tmp_path, "sub/b.json", {"include": ["../a.json"], "x": {"arguments": {"--n": 2}}})
    write(tmp_path, "c.json", {"x": {"arguments": {"--n": 3, "--m": 1}}})
    top = write(tmp_path, "top.json", {"include": ["sub/b.json", "c.json"]})
    (x,) = load_profile(top)
    assert x.arguments == {"--n": 3, "--m": 1}


def test_an_included_file_twice_is_no_cycle(tmp_path):
    write(tmp_path, "d.json", {"x": {"experiment": TOY}})
    write(tmp_path, "b.json", {"include": ["d.json"]})
    write(tmp_path, "c.json", {"include": ["d.json"]})
    top = write(tmp_path, "a.json", {"include": ["b.json", "c.json"]})
    assert names(load_profile(top)) == ["x"]


def test_includes_that_fan_out_or_nest_too_deep_are_one_error_not_a_hang(tmp_path):
    # each file includes the next twice: 2^25 reads (it hung) before the bound
    for i in range(25):
        write(tmp_path, f"fan/f{i}.json", {"include": [f"f{i + 1}.json"] * 2})
    write(tmp_path, "fan/f25.json", {"x": {"experiment": TOY}})
    with pytest.raises(ProfileError, match="more than 256 profile files read"):
        load_profile(tmp_path / "fan/f0.json")
    # a chain of 1000 files: "nested deeper than 64 levels" of JSON was blamed on a
    # file that has none, from a RecursionError
    for i in range(100):
        write(tmp_path, f"deep/d{i}.json", {"include": [f"d{i + 1}.json"]})
    write(tmp_path, "deep/d100.json", {"x": {"experiment": TOY}})
    with pytest.raises(ProfileError, match="includes nested deeper than 32 files") as info:
        load_profile(tmp_path / "deep/d0.json")
    assert str(info.value).startswith(str(tmp_path / "deep/d31.json"))
    # within the bounds, a chain still loads
    write(tmp_path, "deep/d30.json", {"x": {"experiment": TOY}})
    assert names(load_profile(tmp_path / "deep/d0.json")) == ["x"]


def test_resume_digest_covers_the_included_files(tmp_path):
    from milarun.launcher.session import profile_digest

    base = write(tmp_path, "base.json", {"x": {"experiment": TOY}})
    top = write(tmp_path, "top.json", {"include": ["base.json"]})
    before = profile_digest(top)
    write(tmp_path, "base.json", {"x": {"experiment": TOY, "timeout": 5}})
    assert profile_digest(top) != before
    import hashlib  # a single file keeps the digest of its bytes (older sessions resume)

    assert profile_digest(base) == hashlib.sha256(base.read_bytes()).hexdigest()


# --- inherits --------------------------------------------------------------------------


def test_inherits_chains_through_templates_and_jobs(tmp_path):
    path = write(
        tmp_path,
        "p.json",
        {
            "*": {"arguments": {"--seed": 1}},
            "_base": {
                "experiment": CONV,
                "arguments": {"--arch": "resnet18", "--batch-size": 64},
                "tags": ["vision"],
                "prepare": ["echo {dataroot}"],
            },
            "convnet": {"inherits": "_base", "arguments": {"--max-count": 100}},
            "convnet_fp16": {
                "inherits": "convnet",
                "arguments": {"--precision": "fp16"},
                "tags": ["vision", "fp16"],
            },
            "_unused": {"inherits": "_base"},
            "_comment": "templates that are not objects are fine until inherited",
        },
    )
    jobs = load_profile(path)
    assert names(jobs) == ["convnet", "convnet_fp16"]
    fp16 = jobs[1]
    assert fp16.argv() == [
        "--seed",
        "1",
        "--arch",
        "resnet18",
        "--batch-size",
        "64",
        "--max-count",
        "100",
        "--precision",
        "fp16",
    ]
    assert fp16.tags == ["vision", "fp16"] and jobs[0].tags == ["vision"]
    assert fp16.prepare == ["echo {dataroot}"]
    # the recorded definition is a plain one: no language key
    assert "inherits" not in fp16.definition and "tags" not in fp16.definition


def test_enabled_false_drops_an_included_job_but_keeps_it_inheritable(tmp_path):
    write(
        tmp_path,
        "std.json",
        {"a": {"experiment": TOY, "arguments": {"--n": 1}}, "b": {"experiment": TOY}},
    )
    top = write(
        tmp_path,
        "small.json",
        {
            "include": ["std.json"],
            "a": {"enabled": False},
            "c": {"inherits": "a", "arguments": {"--m": 2}},
        },
    )
    jobs = load_profile(top)
    assert names(jobs) == ["b", "c"]
    assert jobs[1].argv() == ["--n", "1", "--m", "2"] and "enabled" not in jobs[1].definition
    with pytest.raises(ProfileError, match="unknown job name 'a'"):
        load_profile(top, names=["a"])


# --- matrix ----------------------------------------------------------------------------


def test_matrix_expands_in_place_last_axis_fastest(tmp_path):
    path = write(
        tmp_path,
        "p.json",
        {
            "first": {"experiment": TOY},
            "sweep": {
                "experiment": CONV,
                "matrix": {"bs": [32, 64], "prec": ["fp32", "fp16"]},
                "name": "resnet50-bs{bs}-{prec}",
                "arguments": {
                    "--arch": "resnet50",
                    "--batch-size": "{bs}",
                    "--precision": "{prec}",
                    "--note": "bs={bs}",
                },
            },
            "last": {"experiment": TOY},
        },
    )
    jobs = load_profile(path)
    assert names(jobs) == [
        "first",
        "resnet50-bs32-fp32",
        "resnet50-bs32-fp16",
        "resnet50-bs64-fp32",
        "resnet50-bs64-fp16",
        "last",
    ]
    j = jobs[3]
    # a value that is exactly "{axis}" takes the axis value's type
    assert j.arguments == {
        "--arch": "resnet50",
        "--batch-size": 64,
        "--precision": "fp32",
        "--note": "bs=64",
    }
    assert j.matrix == {"bs": 64, "prec": "fp32"} and j.group == "sweep"
    assert j.definition["arguments"]["--batch-size"] == 64 and "matrix" not in j.definition


def test_matrix_inherits_and_is_inherited(tmp_path):
    path = write(
        tmp_path,
        "p.json",
        {
            "_io": {
                "experiment": CONV,
                "matrix": {"w": [0, 2]},
                "name": "io-w{w}",
                "arguments": {"--workers": "{w}"},
            },
            "io_pin": {
                "inherits": "_io",
                "name": "io-pin-w{w}",
                "matrix": {"pin": [True]},
                "arguments": {"--pin-memory": "{pin}"},
            },
        },
    )
    jobs = load_profile(path)
    assert names(jobs) == ["io-pin-w0", "io-pin-w2"]
    assert jobs[1].argv() == ["--workers", "2", "--pin-memory"]  # true: a bare flag


def test_matrix_value_may_be_a_launch_placeholder(tmp_path):
    path = write(
        tmp_path,
        "p.json",
        {
            "io": {
                "experiment": CONV,
                "matrix": {"workers": [0, "{cpu_per_gpu}"]},
                "name": "io-w{workers}",
                "arguments": {"--workers": "{workers}"},
            }
        },
    )
    jobs = load_profile(path)
    assert names(jobs) == ["io-w0", "io-wcpu_per_gpu"]
    assert jobs[0].placeholders == [] and jobs[1].placeholders == ["cpu_per_gpu"]
    (wave,) = plan_job(jobs[1], GPUS, 0, "/out", "/data", python=PY)
    assert [lch.test_argv for lch in wave] == [["--workers", "8"], ["--workers", "8"]]


# --- tags, groups, --select, --exclude -----------------------------------------------

SELECT = {
    "*": {"tags": ["all"]},
    "toy": {"experiment": TOY, "tags": ["all", "toy"]},
    "conv": {"experiment": CONV, "tags": ["all", "vision"]},
    "sweep": {
        "experiment": CONV,
        "matrix": {"bs": [1, 2]},
        "name": "conv-bs{bs}",
        "arguments": {"--batch-size": "{bs}"},
    },
    "grouped": {"experiment": TOY, "group": "toys"},
}


@pytest.mark.parametrize(
    "select,exclude,expected",
    [
        (None, None, ["toy", "conv", "conv-bs1", "conv-bs2", "grouped"]),
        (["vision"], None, ["conv"]),
        (["sweep"], None, ["conv-bs1", "conv-bs2"]),  # a matrix entry is a group
        (["toys", "conv-bs2"], None, ["conv-bs2", "grouped"]),  # an explicit group; a name
        (None, ["sweep", "toy"], ["conv", "grouped"]),
        (["all"], ["vision"], ["toy", "conv-bs1", "conv-bs2", "grouped"]),  # "*" tags every job
    ],
)
def test_select_and_exclude(tmp_path, select, exclude, expected):
    path = write(tmp_path, "p.json", SELECT)
    assert names(load_profile(path, select=select, exclude=exclude)) == expected


def test_jobs_dry_run_selects(tmp_path, capsys):
    path = write(tmp_path, "p.json", SELECT)
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "jobs",
                str(path),
                "--dry-run",
                "--cpu-slots",
                "1",
                "--select",
                "sweep",
                "--exclude",
                "conv-bs1",
                "--no-cgexec",
                "-d",
                str(tmp_path),
                "-o",
                str(tmp_path / "out"),
            ]
        )
    assert exc.value.code == 0
    heads = [
        line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("# p.")
    ]
    assert heads == ["p.conv-bs2"]


# --- launch placeholders ---------------------------------------------------------------

PLACEHOLDERS = {
    "experiment": TOY,
    "arguments": {
        "--workers": "{cpu_per_gpu}",
        "--gpus": "{n_gpu}",
        "--mem": "{gpu_memory_gb}",
        "--data": "{dataroot}/x",
        "--out": "{outdir}",
        "--arch": "{arch}",
        "--raw": "a{{b}}",
    },
}


def test_placeholders_resolve_per_launch_and_are_recorded(tmp_path):
    job_def = {**PLACEHOLDERS, "partition_scheme": {"type": "gpu-progression"}}
    (job,) = load_profile(write(tmp_path, "p.json", {"a": job_def}))
    assert job.placeholders == [
        "arch",
        "cpu_per_gpu",
        "dataroot",
        "gpu_memory_gb",
        "n_gpu",
        "outdir",
    ]
    waves = plan_job(job, GPUS, 0, "/out", "/data", python=PY)
    one, two = (wave[0] for wave in waves)
    assert one.test_argv == [
        "--workers",
        "8",
        "--gpus",
        "1",
        "--mem",
        "80",
        "--data",
        "/data/x",
        "--out",
        "/out",
        "--arch",
        "cuda",
        "--raw",
        "a{b}",
    ]
    # two GPUs: 16 cores // 2 GPUs per student; the smaller card's 40 GiB
    assert two.test_argv[:6] == ["--workers", "8", "--gpus", "2", "--mem", "40"]
    assert extra_of(two.argv)["placeholders"] == {
        "arch": "cuda",
        "cpu_per_gpu": 8,
        "dataroot": "/data",
        "gpu_memory_gb": 40,
        "n_gpu": 2,
        "outdir": "/out",
    }
    assert two.placeholders == extra_of(two.argv)["placeholders"]
    assert two.argv[-len(two.test_argv) :] == two.test_argv
    # the recorded definition keeps the templates
    assert extra_of(two.argv)["job"]["arguments"]["--workers"] == "{cpu_per_gpu}"


def test_placeholders_on_cpu_slots_and_across_nodes(tmp_path):
    (job,) = load_profile(
        write(
            tmp_path,
            "p.json",
            {
                "a": {
                    **PLACEHOLDERS,
                    "partition_scheme": {"type": "multi-node"},
                    "launcher": "torchrun",
                }
            },
        )
    )
    cpus = Devices("cpu", [0, 1, 2], cores=7, memory_mib=[2048.0] * 3)
    cluster = Cluster("ssh", [Node("n1", "n1", main=True), Node("n2", "n2")], cpus)
    values = placeholder_values(job, cpus, [0, 1, 2], ["n1", "n2"], "/o", "/d")
    assert values == {
        "arch": "cpu",
        "cpu_per_gpu": 2,
        "dataroot": "/d",
        "gpu_memory_gb": 2,
        "n_gpu": 6,
        "outdir": "/o",
    }
    (wave,) = plan_job(job, cluster, 0, "/o", "/d", python=PY)
    assert wave[0].placeholders == values
    assert wave[0].test_argv[:6] == ["--workers", "2", "--gpus", "6", "--mem", "2"]


def test_a_job_without_placeholders_has_no_placeholders_field(tmp_path):
    (job,) = load_profile(write(tmp_path, "p.json", {"a": {"experiment": TOY}}))
    (wave,) = plan_job(job, Devices("cpu", [0]), 0, "/o", "/d", python=PY)
    assert "placeholders" not in extra_of(wave[0].argv) and wave[0].placeholders is None


@pytest.mark.parametrize(
    "devices,name,message",
    [
        (Devices("cpu", [0]), "cpu_per_gpu", "the node's CPU cores are unknown"),
        (Devices("gpu", [0], cores=4), "gpu_memory_gb", "the memory of its devices is unknown"),
    ],
)
def test_a_placeholder_the_host_cannot_fill_is_one_line(tmp_path, devices, name, message):
    (job,) = load_profile(
        write(tmp_path, "p.json", {"a": {"experiment": TOY, "arguments": {"--x": f"{{{name}}}"}}})
    )
    with pytest.raises(SetupError) as exc:
        plan_job(job, devices, 0, "/o", "/d", python=PY)
    assert str(exc.value) == f"p.a: cannot fill {{{name}}} in its arguments: {message}"


def test_no_dataroot_for_a_dataroot_placeholder(tmp_path):
    (job,) = load_profile(
        write(tmp_path, "p.json", {"a": {"experiment": TOY, "arguments": {"--data": "{dataroot}"}}})
    )
    with pytest.raises(SetupError, match=r"cannot fill \{dataroot\}.*no dataroot"):
        plan_job(job, GPUS, 0, "/o", None, python=PY)


def test_fail_record_and_rerun_carry_the_placeholders(tmp_path):
    from milarun.formats.record import validate
    from milarun.launcher.failures import base_record
    from milarun.launcher.rerun import rerun_command

    (job,) = load_profile(
        write(
            tmp_path,
            "p.json",
            {"a": {"experiment": TOY, "arguments": {"--workers": "{cpu_per_gpu}"}}},
        )
    )
    (wave,) = plan_job(job, GPUS, 0, tmp_path, "/d", python=PY)
    rec = base_record(wave[0])
    assert rec["placeholders"] == {"cpu_per_gpu": 8}
    validate(rec)
    argv, _ = rerun_command(rec, python=PY)
    assert extra_of(argv)["placeholders"] == {"cpu_per_gpu": 8}
    assert argv[-2:] == ["--workers", "8"]


def test_the_child_records_the_placeholders(tmp_path):
    from milarun.bench.experiment import Experiment

    exp = Experiment("p.a", "0.0", extra={"placeholders": {"n_gpu": 2, "arch": "cuda"}})
    assert exp.result["placeholders"] == {"n_gpu": 2, "arch": "cuda"}


# --- milarun 2020 ----------------------------------------------------------------------


def test_the_2020_standard_profile_shape_loads_and_plans(capsys, monkeypatch, tmp_path):
    # tests/profiles/legacy2020.json: the 2020 standard profile's structure ("*" with
    # prepare, exec_prefix and the student{CUDA_VISIBLE_DEVICES} cgroup; plain jobs;
    # a gpu-progression scaling test) with this project's test names
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    path = ROOT / "tests" / "profiles" / "legacy2020.json"
    jobs = load_profile(path)
    assert names(jobs)[:2] == ["toy_reg", "toy_lstm"] and names(jobs)[-1] == "scaling"
    toy = jobs[0]
    assert (
        toy.definition["partition_scheme"]["cgroup"]
        == "cpuset,memory:student{CUDA_VISIBLE_DEVICES}"
    )
    assert toy.prepare == ["sync", "sysctl vm.drop_caches=3"]
    (wave,) = plan_job(toy, GPUS, 0, "/out", "/data", python=PY)
    assert [lch.argv[:5] for lch in wave] == [
        ["/usr/bin/cgexec", "-g", "cpuset,memory:student0", "nocache", PY],
        ["/usr/bin/cgexec", "-g", "cpuset,memory:student1", "nocache", PY],
    ]
    scaling = plan_job(jobs[-1], GPUS, 0, "/out", "/data", python=PY)
    assert [w[0].group for w in scaling] == ["legacy2020.scaling.1", "legacy2020.scaling.2"]
    # a dry run checks what a real run checks: here, as if the student cgroups existed
    monkeypatch.setattr("milarun.host.isolation.missing_groups", lambda specs: [])
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "jobs",
                str(path),
                "--dry-run",
                "--cpu-slots",
                "1",
                "--name",
                "vae",
                "-d",
                str(tmp_path),
                "-o",
                str(tmp_path / "out"),
            ]
        )
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "# prepare: sync\n# prepare: sysctl vm.drop_caches=3" in out
    assert "-g cpuset,memory:student0 nocache " in out


# --- the shipped profiles --------------------------------------------------------------

SHIPPED = sorted((ROOT / "tests" / "fixtures" / "profiles_resolved").glob("*.json"))


@pytest.mark.parametrize("golden", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_profiles_resolve_to_the_same_jobs_and_command_lines(golden):
    # The golden files were written from the profiles before they used the profile
    # language: names, definitions, arguments and plan command lines must not move.
    expected = json.loads(golden.read_text())
    actual = json.loads(
        profile_golden.dumps(profile_golden.resolved(ROOT / "profiles" / golden.name))
    )
    assert list(actual) == list(expected)
    for name, job in expected.items():
        # serialised, 64 and 64.0 differ: equal text here means the same --extra
        # argument (json.dumps({**extra, "job": definition}, sort_keys=True)), byte for byte
        assert json.dumps(actual[name], sort_keys=True) == json.dumps(job, sort_keys=True), name
        assert [
            profile_golden.extra_json(actual[name], lch) for lch in actual[name]["launches"]
        ] == [profile_golden.extra_json(job, lch) for lch in job["launches"]]


def test_shipped_profiles_are_checked_against_their_golden_file():
    assert {p.name for p in SHIPPED} <= {p.name for p in (ROOT / "profiles").glob("*.json")}
    assert len(SHIPPED) >= 7


# --- every bad input is one line naming the file, the entry and the key; exit 2 ---------

OK = {"experiment": TOY}
KNOWN = (
    "arguments, description, enabled, exec_prefix, experiment, group, inherits, launcher, "
    "matrix, name, partition_scheme, prepare, restarts, tags, timeout, validation"
)
LAUNCH = "arch, cpu_per_gpu, dataroot, gpu_memory_gb, n_gpu, numa_node, numa_remote, outdir"


def _m(**kw):
    """A matrix entry 'm' over bs = 1, 2."""
    return {
        "m": {
            **OK,
            "matrix": {"bs": [1, 2]},
            "name": "m{bs}",
            "arguments": {"--batch-size": "{bs}"},
            **kw,
        }
    }


# (files: {name: content} with the profile run first, extra CLI args, file named, message)
BAD_LANGUAGE = [
    (
        {"p.json": {"include": "base.json", "a": OK}},
        [],
        "p.json",
        "key 'include': must be a list of profile files (paths relative to this file)",
    ),
    (
        {"p.json": {"include": ["nope.json"], "a": OK}},
        [],
        "p.json",
        "key 'include': 'nope.json' is not a file ({tmp}/nope.json)",
    ),
    (
        {"p.json": {"include": ["b.json"], "a": OK}, "b.json": {"include": ["p.json"]}},
        [],
        "b.json",
        "key 'include': include cycle p.json → b.json → p.json",
    ),
    (
        {"p.json": {"include": ["p.json"], "a": OK}},
        [],
        "p.json",
        "key 'include': include cycle p.json → p.json",
    ),
    (
        {
            "p.json": {"include": ["b.json"], "a": {"arguments": {}}},
            "b.json": {"a": {"experiment": 5}},
        },
        [],
        "b.json",
        "job 'a', key 'experiment': must be a string 'module:function'",
    ),
    (
        {
            "p.json": {"include": ["b.json"], "a": {**OK, "inherits": "_t"}},
            "b.json": {"_t": {"inherits": "_gone"}},
        },
        [],
        "b.json",
        "template '_t', key 'inherits': unknown entry '_gone' (chain a → _t → _gone)",
    ),
    (
        {"p.json": {"_t": {"inherits": "_gone"}, "a": OK}},
        [],
        "p.json",
        "template '_t', key 'inherits': unknown entry '_gone' (chain _t → _gone)",
    ),
    (
        {"p.json": {"a": {**OK, "inherits": "_nope"}}},
        [],
        "p.json",
        "job 'a', key 'inherits': unknown entry '_nope' (chain a → _nope)",
    ),
    (
        {
            "p.json": {
                "a": {**OK, "inherits": "b"},
                "b": {**OK, "inherits": "_c"},
                "_c": {"inherits": "a"},
            }
        },
        [],
        "p.json",
        "template '_c', key 'inherits': inherits cycle a → b → _c → a",
    ),
    (
        {"p.json": {"a": {**OK, "inherits": "*"}}},
        [],
        "p.json",
        "job 'a', key 'inherits': '*' is merged into every job already; it cannot be inherited",
    ),
    (
        {"p.json": {"_c": "a comment", "a": {**OK, "inherits": "_c"}}},
        [],
        "p.json",
        "job 'a', key 'inherits': entry '_c' is not an object (chain a → _c)",
    ),
    (
        {"p.json": {"a": {**OK, "inherits": 3}}},
        [],
        "p.json",
        "job 'a', key 'inherits': must be the name of another entry (a string)",
    ),
    (
        {"p.json": {"_t": {"colour": 1}, "a": {**OK, "inherits": "_t"}}},
        [],
        "p.json",
        f"job 'a' (from '_t'), key 'colour': unknown key (known: {KNOWN})",
    ),
    (
        {
            "p.json": {"include": ["b.json"], "a": {**OK, "inherits": "_t"}},
            "b.json": {"_t": {"timeout": -1}},
        },
        [],
        "b.json",
        "job 'a' (from '_t'), key 'timeout': must be a positive number of seconds",
    ),
    (
        {"p.json": {"*": {"inherits": "a"}, "a": OK}},
        [],
        "p.json",
        "job '*', key 'inherits': not allowed in the defaults",
    ),
    (
        {"p.json": {"m": {**OK, "matrix": {"bs": [1]}, "arguments": {"--b": "{bs}"}}}},
        [],
        "p.json",
        "job 'm', key 'matrix': a matrix needs a 'name' template, e.g. \"name-{axis}\"",
    ),
    (
        {"p.json": {"a": {**OK, "name": "x{y}"}}},
        [],
        "p.json",
        "job 'a', key 'name': a name template needs a 'matrix' to expand",
    ),
    (
        {"p.json": _m(name="m")},
        [],
        "p.json",
        "job 'm', key 'name': makes job 'm' again (already made by entry 'm')",
    ),
    (
        {"p.json": {"m2": OK, **_m()}},
        [],
        "p.json",
        "job 'm', key 'name': makes job 'm2' again (already made by entry 'm2')",
    ),
    (
        {"p.json": _m(name="m{b}")},
        [],
        "p.json",
        "job 'm', key 'name': unknown placeholder {b} (the axes: bs)",
    ),
    (
        {"p.json": _m(name="m.{bs}")},
        [],
        "p.json",
        "job 'm', key 'name': makes 'm.1': job names may hold only letters, digits, '_' and '-'",
    ),
    (
        {"p.json": _m(matrix={"bs": 3})},
        [],
        "p.json",
        "job 'm', key 'matrix.bs': must be a list of the axis's values",
    ),
    (
        {"p.json": _m(matrix={"bs": []})},
        [],
        "p.json",
        "job 'm', key 'matrix.bs': must hold at least one value",
    ),
    (
        {"p.json": _m(matrix={"bs": [[1]]})},
        [],
        "p.json",
        "job 'm', key 'matrix.bs.0': must be a string, number or boolean, not list",
    ),
    (
        {"p.json": _m(matrix={"bs": [1], "1x": [2]})},
        [],
        "p.json",
        "job 'm', key 'matrix.1x': is not a valid axis name (letters, digits and '_', not first a "
        "digit)",
    ),
    (
        {"p.json": _m(matrix={"bs": [1], "n_gpu": [2]})},
        [],
        "p.json",
        "job 'm', key 'matrix.n_gpu': axis 'n_gpu' is a launch placeholder; give the axis another "
        "name",
    ),
    (
        {"p.json": _m(matrix={"bs": [1], "w": [2]})},
        [],
        "p.json",
        "job 'm', key 'matrix.w': axis used in neither 'name' nor 'arguments'",
    ),
    (
        {"p.json": _m(matrix={"bs": list(range(33)), "w": list(range(32))}, name="m{bs}-{w}")},
        [],
        "p.json",
        "job 'm', key 'matrix': 1056 combinations; at most 1024",
    ),
    (
        {
            "p.json": {
                "m": {
                    **OK,
                    "matrix": {"bs": [1]},
                    "name": "m{bs}",
                    "arguments": {"--b": "{bs}", "--c": "{bs"},
                }
            }
        },
        [],
        "p.json",
        "job 'm1' (from 'm'), key 'arguments.--c': bad template '{bs' (expected '}' before end "
        "of string)",
    ),
    (
        {"p.json": {"a": {**OK, "arguments": {"--x": "{cpus}"}}}},
        [],
        "p.json",
        f"job 'a', key 'arguments.--x': unknown placeholder {{cpus}} (known: {LAUNCH})",
    ),
    (
        {"p.json": {"a": {**OK, "arguments": {"--x": "{n_gpu:>9}"}}}},
        [],
        "p.json",
        "job 'a', key 'arguments.--x': placeholder {n_gpu} takes no format spec or conversion",
    ),
    (
        {"p.json": {"a": {**OK, "arguments": {"--x": "a}b"}}}},
        [],
        "p.json",
        "job 'a', key 'arguments.--x': bad template 'a}b' (Single '}' encountered in format "
        "string)",
    ),
    (
        {"p.json": _m(arguments={"--batch-size": "{bs}", "--w": "{worker}"})},
        [],
        "p.json",
        f"job 'm1' (from 'm'), key 'arguments.--w': unknown placeholder {{worker}} (known: "
        f"{LAUNCH})",
    ),
    (
        {"p.json": {"a": {**OK, "tags": "vision"}}},
        [],
        "p.json",
        "job 'a', key 'tags': must be a list of tags",
    ),
    (
        {"p.json": {"a": {**OK, "tags": ["vi sion"]}}},
        [],
        "p.json",
        "job 'a', key 'tags.0': 'vi sion' is not a valid tag (letters, digits, '_' and '-')",
    ),
    (
        {"p.json": {"_t": {"tags": "x"}, "a": OK}},
        [],
        "p.json",
        "template '_t', key 'tags': must be a list of tags",
    ),
    (
        {"p.json": {"a": {**OK, "enabled": "no"}}},
        [],
        "p.json",
        "job 'a', key 'enabled': must be true or false",
    ),
    ({"p.json": {"a": {**OK, "enabled": False}}}, [], "p.json", "the profile defines no job"),
    (
        {"p.json": {"a": {**OK, "group": "a.b"}}},
        [],
        "p.json",
        "job 'a', key 'group': 'a.b' is not a valid group (letters, digits, '_' and '-')",
    ),
    (
        {"p.json": {"a": {**OK, "tags": ["x"]}}},
        ["--select", "gpu"],
        "p.json",
        "'gpu' (--select) is no job name, group or tag of this profile; tags: x",
    ),
    (
        {"p.json": {"a": OK}},
        ["--exclude", "b"],
        "p.json",
        "'b' (--exclude) is no job name, group or tag of this profile; tags: none",
    ),
    (
        {"p.json": {"a": {**OK, "tags": ["x"]}}},
        ["--exclude", "x"],
        "p.json",
        "no job left after --name/--select/--exclude",
    ),
    (
        {"p.json": {"a": {**OK, "partition_scheme": {"cgroup": "cpuset:s{CUDA_DEVICE}"}}}},
        [],
        "p.json",
        "job 'a', key 'partition_scheme.cgroup': unknown placeholder {CUDA_DEVICE} (only {device})",
    ),
]


@pytest.mark.parametrize(
    "files,args,named,message",
    BAD_LANGUAGE,
    ids=[f"language-{i}" for i in range(len(BAD_LANGUAGE))],
)
@pytest.mark.parametrize("command", ["jobs", "profile"])
def test_bad_profile_language(tmp_path, capsys, files, args, named, message, command):
    for name, content in files.items():
        write(tmp_path, name, content)
    first = tmp_path / next(iter(files))
    argv = [command, str(first), *args] + (["--dry-run"] if command == "jobs" else [])
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    expected = message.replace("{tmp}", str(tmp_path))
    assert capsys.readouterr() == ("", f"milarun: error: {tmp_path / named}: {expected}\n")


def test_enough_bad_cases():
    assert len({m for *_, m in BAD_LANGUAGE}) >= 15


# --- milarun profile -------------------------------------------------------------------

EXPECTED = ROOT / "tests" / "fixtures" / "expected"


@pytest.mark.parametrize(
    "argv,golden",
    [
        (["tests/profiles/tender.json", "--select", "tender"], "profile-tender.json"),
        (["profiles/5gb.json", "--select", "half"], "profile-5gb-half.json"),
    ],
)
def test_milarun_profile_output(capsys, monkeypatch, argv, golden):
    # Regenerate (for an intended change) from the repository root with
    # `milarun profile ARGV > tests/fixtures/expected/GOLDEN`.
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exc:
        main(["profile", *argv])
    assert exc.value.code == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out == (EXPECTED / golden).read_text()


ROUND_TRIP = sorted((ROOT / "profiles").glob("*.json")) + [
    ROOT / "tests" / "profiles" / "tender.json",
    ROOT / "tests" / "profiles" / "legacy2020.json",
]


@pytest.mark.parametrize("path", ROUND_TRIP, ids=[p.stem for p in ROUND_TRIP])
def test_milarun_profile_output_loads_to_the_same_jobs(tmp_path, path):
    from milarun.cli.profile import resolved_profile

    plain = resolved_profile(path)
    assert plain["_resolved_from"]["suite"] == path.stem
    again = load_profile(write(tmp_path, path.name, plain))
    for a, b in zip(load_profile(path), again, strict=True):
        assert (a.full_name, a.argv(), a.tags, a.group, a.cgroup, a.prepare, a.exec_prefix) == (
            b.full_name,
            b.argv(),
            b.tags,
            b.group,
            b.cgroup,
            b.prepare,
            b.exec_prefix,
        )
        assert json.dumps(a.definition, sort_keys=True) == json.dumps(b.definition, sort_keys=True)


def test_the_docs_example_is_the_tender_fixture():
    text = (ROOT / "docs" / "profiles.md").read_text()
    section = text[text.index("## Writing a tender's profile") :]
    block = section[section.index("```json") + len("```json") :]
    block = block[: block.index("```")]
    assert json.loads(block) == json.loads(
        (ROOT / "tests" / "profiles" / "tender.json").read_text()
    )


def test_discovery_gives_the_facts_placeholders_need(monkeypatch):
    import sys

    from test_monitor import fake_pynvml

    from milarun.host import devices, isolation

    monkeypatch.setattr(isolation, "student_pool_cpus", lambda: list(range(12)))
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=3))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    gpus = devices.discover()
    assert (gpus.indices, gpus.cores, gpus.memory_mib) == ([2, 0], 12, [81920.0, 81920.0])
    assert gpus.first(1).memory_mib == [81920.0] and gpus.first(1).cores == 12
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    slots = devices.discover(cpu_slots=3)
    assert slots.kind == "cpu" and slots.cores == 12
    assert len(slots.memory_mib) == 3 and slots.memory_mib[0] > 0


def test_a_run_records_its_placeholders(tmp_path, capsys):
    # end to end on one CPU slot: the child trains with the filled value and records it
    from conftest import SMOKE_ARGS

    args = dict(zip(SMOKE_ARGS[::2], SMOKE_ARGS[1::2]))
    path = write(
        tmp_path,
        "p.json",
        {
            "a": {
                "experiment": TOY,
                "arguments": {
                    **args,
                    "--batch-size": "{cpu_per_gpu}",
                    "--max-count": 400,
                    "--device": "{arch}",
                },
            }
        },
    )
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "jobs",
                str(path),
                "--no-cgexec",
                "--cpu-slots",
                "1",
                "-d",
                str(tmp_path),
                "-o",
                str(out),
            ]
        )
    assert exc.value.code == 0, capsys.readouterr()
    from milarun.host.isolation import student_pool_cpus

    (result,) = out.glob("p.a.J0.0.*.json")
    rec = json.loads(result.read_text())
    cores = len(student_pool_cpus())
    assert rec["placeholders"] == {"arch": "cpu", "cpu_per_gpu": cores}
    argv = rec["call"]["argv"]
    assert argv[-6:] == ["--batch-size", str(cores), "--max-count", "400", "--device", "cpu"]
    assert rec["job"]["arguments"]["--batch-size"] == "{cpu_per_gpu}"


def test_milabench_matrix_form_is_read(tmp_path):
    # milabench's own example (shared/reference/milabench-plans-and-config.md): a matrix
    # beside a "job" object with name, inherits and argv, and an axis with a hyphen
    from milarun.profile.language import load_profile

    path = tmp_path / "mb.json"
    path.write_text(
        json.dumps(
            {
                "_resnet": {
                    "experiment": "milarun.models.convnet:main",
                    "arguments": {"--arch": "resnet18"},
                },
                "resnet-matrix-noio": {
                    "matrix": {"batch-size": [32, 64]},
                    "job": {
                        "name": "resnet18-bs{batch-size}",
                        "inherits": "_resnet",
                        "argv": {
                            "--batch-size": "{batch-size}",
                            "--image-size": 32,
                            "--channels-last": True,
                        },
                    },
                },
            }
        )
    )
    jobs = load_profile(path)
    assert [j.name for j in jobs] == ["resnet18-bs32", "resnet18-bs64"]
    assert jobs[1].arguments == {
        "--arch": "resnet18",
        "--batch-size": 64,
        "--image-size": 32,
        "--channels-last": True,
    }
    assert {j.group for j in jobs} == {"resnet-matrix-noio"}
    # a malformed one is the usual one-line error, naming the file
    path.write_text(
        json.dumps(
            {
                "m": {
                    "matrix": {"bs": [1]},
                    "job": {
                        "name": "x{bs}",
                        "argv": ["--bs"],
                        "experiment": "milarun.models.vae:main",
                    },
                }
            }
        )
    )
    with pytest.raises(ProfileError, match=f"^{path}: .*arguments"):
        load_profile(path)
