"""The child protocol (milarun/formats/child.py): one builder and one parser of the child's
command line, and the `milarun jobs` command line that `milarun slurm` writes."""

import json
import shlex

import pytest

from milarun.cli import jobs as jobs_cli
from milarun.cli import parser, split_argv
from milarun.cli.options import as_argv
from milarun.formats import child

HEAD = ["/py", *child.RUN_MODULE]


def parse_run(argv):
    """``argv`` (from ``milarun`` on) parsed as the child parses it."""
    assert argv[: len(HEAD)] == HEAD
    own, rest = split_argv(["run"] + argv[len(HEAD) :])
    return parser("run").parse_args(own), rest


def test_every_option_of_the_child_round_trips():
    values = {
        "function": "milarun.models.toy_reg:main",
        "out": "/o/r.json",
        "dataroot": "/d",
        "experiment_name": "s.t",
        "job_id": "2.0-3",
        "extra": {"run": 2, "device": "0-3", "job": {"arguments": {"--x": "{y}"}}},
    }
    assert [name for name, *_ in child.OPTIONS] == list(values)
    argv = child.child_argv(
        HEAD,
        values["function"],
        out=values["out"],
        dataroot=values["dataroot"],
        name=values["experiment_name"],
        job_id=values["job_id"],
        extra=values["extra"],
        test_argv=["--max-count", "3", "--", "-o"],
    )
    opts, rest = parse_run(argv)
    for name in values:
        got = getattr(opts, name)
        assert (child.decode_extra(got) if name == "extra" else got) == values[name], name
    assert rest == ["--max-count", "3", "--", "-o"]


def test_options_left_out_take_the_parsers_defaults():
    opts, rest = parse_run(child.child_argv(HEAD, "m:f"))
    defaults = {name: default for name, _, default, _ in child.OPTIONS}
    assert {name: getattr(opts, name) for name in defaults} == dict(defaults, function="m:f")
    assert rest == []


def test_the_plan_and_rerun_build_the_same_command_line():
    from milarun.launcher.rerun import SAFE_PATH, rerun_command
    from milarun.plan.launches import child_argv
    from milarun.profile.job import Job

    job = Job(
        suite="s",
        name="t",
        experiment="milarun.models.toy_reg:main",
        definition={"experiment": "milarun.models.toy_reg:main"},
    )
    argv = child_argv(job, 1, "0", [0], "/o/r.json", "/d", ["--max-count", "3"], python="/py")
    opts, rest = parse_run(argv)
    record = {
        "name": opts.experiment_name,
        "job_id": opts.job_id,
        "dataroot": opts.dataroot,
        "call": {"function": opts.function, "argv": rest},
        **{k: v for k, v in json.loads(opts.extra).items()},
    }
    again, _ = rerun_command(record, out="/o/r.json", python="/py")
    assert again == argv[:1] + [SAFE_PATH] + argv[1:]
    assert set(json.loads(opts.extra)) <= set(child.EXTRA_FIELDS)


def test_the_jobs_options_slurm_passes_on_read_back_the_same():
    values = {
        "repeat": 3,
        "timeout": 90.0,
        "join_timeout": 2.5,
        "barrier_timeout": 60.0,
        "cpu_slots": 2,
        "name": ["a", "b"],
        "select": ["g"],
        "exclude": ["x", "y"],
        "no_cgexec": True,
    }
    argv = as_argv(jobs_cli.OPTIONS, values)
    opts = parser("jobs").parse_args(["jobs", "p.json"] + argv)
    assert {name: getattr(opts, name) for name in values} == values
    assert as_argv(jobs_cli.OPTIONS, dict.fromkeys(values)) == []


def test_slurm_writes_the_jobs_options_in_its_script(capsys):
    from milarun.cli import main

    with pytest.raises(SystemExit):
        main(
            [
                "slurm",
                "profiles/cpu.json",
                "-d",
                "/d",
                "-o",
                "/r",
                "--dry-run",
                "--repeat",
                "2",
                "--timeout",
                "60",
                "--name",
                "toy_reg",
                "--no-cgexec",
            ]
        )
    last = shlex.split(capsys.readouterr().out.splitlines()[-1])
    assert last[6:] == [
        "-d",
        "/d",
        "-o",
        "/r",
        "--repeat",
        "2",
        "--timeout",
        "60",
        "--name",
        "toy_reg",
        "--no-cgexec",
    ]


def test_the_common_option_defaults_are_the_child_protocols():
    from milarun.bench.options import common_options

    assert common_options() == child.COMMON_DEFAULTS
