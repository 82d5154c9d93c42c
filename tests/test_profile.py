"""Profile validation: every bad input is one exact line and exit code 2."""

import json

import pytest

from milarun.cli import main
from milarun.profile.language import load_profile
from milarun.profile.resolve import deep_merge

OK = {"experiment": "milarun.models.toy_reg:main"}
KNOWN = (
    "arguments, description, enabled, exec_prefix, experiment, group, inherits, launcher, "
    "matrix, name, partition_scheme, prepare, restarts, tags, timeout, validation"
)

BAD = [
    # (profile text or object, expected message after "<path>: ")
    (
        "{not json",
        "invalid JSON: Expecting property name enclosed in double quotes at line 1, column 2",
    ),
    ([1, 2], "a profile must be a JSON object of job name → definition"),
    ({}, "the profile defines no job"),
    ({"*": OK}, "the profile defines no job"),
    ({"*": [], "a": OK}, "job '*': defaults must be a JSON object"),
    ({"a": 3}, "job 'a': definition must be a JSON object"),
    ({"a.b": OK}, "job 'a.b': job names may hold only letters, digits, '_' and '-'"),
    ({"a": {**OK, "colour": 1}}, f"job 'a', key 'colour': unknown key (known: {KNOWN})"),
    ({"a": {"arguments": {}}}, "job 'a', key 'experiment': missing; give 'module:function'"),
    ({"a": {"experiment": 5}}, "job 'a', key 'experiment': must be a string 'module:function'"),
    (
        {"a": {"experiment": "milarun.models.toy_reg"}},
        "job 'a', key 'experiment': 'milarun.models.toy_reg' must look like 'module:function'",
    ),
    (
        {"a": {"experiment": "milarun.models.nope:main"}},
        "job 'a', key 'experiment': cannot import module 'milarun.models.nope' (no such module)",
    ),
    (
        {"a": {"experiment": "milarun.models.toy_reg:nope"}},
        "job 'a', key 'experiment': module 'milarun.models.toy_reg' has no function 'nope'",
    ),
    (
        {"a": {**OK, "arguments": ["--x"]}},
        "job 'a', key 'arguments': must be an object of flag → value",
    ),
    (
        {"a": {**OK, "arguments": {"--x": [1]}}},
        "job 'a', key 'arguments.--x': must be a string, number or boolean, not list",
    ),
    (
        {"a": {**OK, "partition_scheme": "per-gpu"}},
        "job 'a', key 'partition_scheme': must be an object with 'type' and 'cgroup'",
    ),
    (
        {"a": {**OK, "partition_scheme": {"type": "per-node"}}},
        "job 'a', key 'partition_scheme.type': 'per-node' is not one of per-gpu, "
        "gpu-progression, normal, njobs, multi-node, node-progression, multi-process",
    ),
    (
        {"a": {**OK, "partition_scheme": {"kind": "normal"}}},
        "job 'a', key 'partition_scheme.kind': unknown key (known: cgroup, "
        "devices_per_process, gpus_per_node, nodes, processes, type)",
    ),
    (
        {"a": {**OK, "partition_scheme": {"cgroup": "student{device}"}}},
        "job 'a', key 'partition_scheme.cgroup': must look like 'controllers:group', "
        "e.g. 'cpuset,memory:student{device}'",
    ),
    (
        {"a": {**OK, "partition_scheme": {"cgroup": "cpuset:student{gpu}"}}},
        "job 'a', key 'partition_scheme.cgroup': unknown placeholder {gpu} (only {device})",
    ),
    ({"a": {**OK, "prepare": "sync"}}, "job 'a', key 'prepare': must be a list of strings"),
    (
        {"a": {**OK, "prepare": ["ls {data}"]}},
        "job 'a', key 'prepare': unknown placeholder {data} "
        "(known: dataroot, milarun, outdir, python)",
    ),
    (
        {"a": {**OK, "exec_prefix": "nocache"}},
        "job 'a', key 'exec_prefix': must be a list of strings",
    ),
    ({"a": {**OK, "timeout": -1}}, "job 'a', key 'timeout': must be a positive number of seconds"),
    (
        {"a": {**OK, "timeout": "1h"}},
        "job 'a', key 'timeout': must be a positive number of seconds",
    ),
    (
        {"a": {**OK, "launcher": "mpirun"}},
        "job 'a', key 'launcher': 'mpirun' is not one of python, torchrun",
    ),
    (
        {"*": {"timeout": 0}, "a": OK},
        "job 'a', key 'timeout': must be a positive number of seconds",
    ),
]


def _write(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.mark.parametrize("content,message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_profile_is_one_line_and_exit_2(tmp_path, capsys, content, message):
    path = _write(tmp_path, content)
    with pytest.raises(SystemExit) as exc:
        main(["jobs", str(path), "--dry-run"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == f"milarun: error: {path}: {message}\n"


def test_missing_profile_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["jobs", str(tmp_path / "nope.json"), "--dry-run"])
    assert exc.value.code == 2
    assert (
        capsys.readouterr().err == f"milarun: error: {tmp_path / 'nope.json'}: profile not found\n"
    )


def test_unknown_name(tmp_path, capsys):
    path = _write(tmp_path, {"a": OK, "b": OK})
    with pytest.raises(SystemExit) as exc:
        main(["jobs", str(path), "--dry-run", "--name", "c"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        f"milarun: error: {path}: unknown job name 'c' (--name); known: a, b\n"
    )


def test_verbose_shows_traceback(tmp_path, capsys):
    path = _write(tmp_path, {"a": 3})
    with pytest.raises(SystemExit):
        main(["jobs", str(path), "--dry-run", "--verbose"])
    err = capsys.readouterr().err
    assert "Traceback" in err and err.endswith("definition must be a JSON object\n")


def test_deep_merge_keeps_cgroup_template(tmp_path):
    path = _write(
        tmp_path,
        {
            "*": {
                "partition_scheme": {"type": "per-gpu", "cgroup": "cpuset,memory:student{device}"},
                "arguments": {"--seed": 1},
            },
            "a": {**OK, "partition_scheme": {"type": "normal"}, "arguments": {"--batch-size": 8}},
            "_ignored": {"anything": True},
        },
    )
    (job,) = load_profile(path)
    assert job.plan_type == "normal"
    assert job.cgroup == "cpuset,memory:student{device}"
    assert job.arguments == {"--seed": 1, "--batch-size": 8}
    assert job.suite == "bad" and job.full_name == "bad.a"


def test_deep_merge_does_not_alias():
    base = {"x": {"y": [1]}}
    out = deep_merge(base, {"x": {"z": 2}})
    out["x"]["y"].append(2)
    assert base == {"x": {"y": [1]}}


def test_arguments_render_flags():
    from milarun.profile.job import Job

    job = Job("s", "a", "m:f", arguments={"--batch-size": 8, "amp": True, "--no": False, "lr": 0.5})
    assert job.argv() == ["--batch-size", "8", "--amp", "--lr", "0.5"]


def test_validation_does_not_import_torch(tmp_path):
    import subprocess
    import sys

    path = _write(tmp_path, {"a": {"experiment": "milarun.models.toy_reg:main"}})
    code = (
        "import sys; from milarun.profile.language import load_profile; "
        f"load_profile({str(path)!r}); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
