"""The plan: exact argv, env and cgroup for each scheme, with nothing launched."""

import json

from milarun.host.devices import Devices
from milarun.plan.launches import plan_job, plan_suite
from milarun.profile.job import Job

PY = "/py"


def job(partition, cgroup="cpuset,memory:student{device}", **kw):
    return Job(
        "std",
        "vae",
        "milarun.models.vae:main",
        arguments={"--batch-size": 32},
        plan_type=partition,
        cgroup=cgroup,
        definition={"d": 1},
        **kw,
    )


def extra(run, label, devices, partition):
    return json.dumps(
        {"devices": devices, "device": label, "job": {"d": 1}, "partition": partition, "run": run},
        sort_keys=True,
    )


def test_per_gpu_one_concurrent_launch_per_device(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    waves = plan_job(
        job("per-gpu"),
        Devices("gpu", [0, 1]),
        3,
        "/out",
        "/data",
        extra_args=["--max-count", "10"],
        python=PY,
    )
    assert len(waves) == 1 and len(waves[0]) == 2
    a, b = waves[0]
    assert a.argv == [
        "/usr/bin/cgexec",
        "-g",
        "cpuset,memory:student0",
        PY,
        "-m",
        "milarun",
        "run",
        "milarun.models.vae:main",
        "-o",
        "/out/std.vae.J3.0.19700101-000000-000000.json",
        "-d",
        "/data",
        "--experiment-name",
        "std.vae",
        "--job-id",
        "3.0",
        "--extra",
        extra(3, "0", [0], "per-gpu"),
        "--",
        "--batch-size",
        "32",
        "--max-count",
        "10",
    ]
    assert a.env == {
        "CUDA_VISIBLE_DEVICES": "0",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "MILARUN_BACKEND": "nvidia",
        "MILARUN_DEVICE": "0",
        "MILARUN_RUN": "3",
    }
    assert b.env["CUDA_VISIBLE_DEVICES"] == "1" and b.cgroup == "cpuset,memory:student1"
    assert a.concurrent and b.concurrent
    assert (a.job_id, b.job_id) == ("3.0", "3.1")
    assert a.log == "std.vae.J3.0.log" and a.group == "std.vae"


def test_the_plan_names_every_path_with_the_session_stamp():
    import datetime
    from pathlib import Path

    when = datetime.datetime(2026, 11, 22, 1, 2, 3, 456789, tzinfo=datetime.timezone.utc)
    prog = Job("std", "ddp", "milarun.models.vae:main", plan_type="gpu-progression")
    waves = plan_suite(
        [job("per-gpu"), prog], Devices("gpu", [0, 1]), 1, "/out", python=PY, session=when
    )
    launches = [lch for w in waves for lch in w]
    stamp = "20261122-010203-456789"
    assert [lch.result_path for lch in launches] == [
        Path(f"/out/std.{n}.J0.{d}.{stamp}.json")
        for n, d in (("vae", "0"), ("vae", "1"), ("ddp", "0"), ("ddp", "0-1"))
    ]
    assert launches[3].fail_path == Path(f"/out/std.ddp.J0.0-1.FAIL.{stamp}.json")
    assert launches[0].journal_path == Path(f"/out/std.vae.J0.0.{stamp}.journal.jsonl")
    # the child is told exactly where to write
    for lch in launches:
        assert lch.argv[lch.argv.index("-o") + 1] == str(lch.result_path)
    # no two launches share a path
    assert len({lch.result_path for lch in launches}) == len(launches)


def test_per_gpu_without_cgexec_and_with_exec_prefix():
    waves = plan_job(
        job("per-gpu", exec_prefix=["nocache"]),
        Devices("cpu", [0, 1]),
        0,
        "/out",
        None,
        use_cgexec=False,
        python=PY,
    )
    a = waves[0][0]
    assert a.cgroup is None
    assert a.argv[:5] == ["nocache", PY, "-m", "milarun", "run"]
    assert "-d" not in a.argv
    # CPU slots see no GPU
    assert a.env["CUDA_VISIBLE_DEVICES"] == "" and "CUDA_DEVICE_ORDER" not in a.env


def test_gpu_progression_sequential_1_to_n():
    waves = plan_job(
        job("gpu-progression", launcher="torchrun"),
        Devices("gpu", [0, 1, 2]),
        0,
        "/out",
        "/data",
        python=PY,
    )
    assert [len(w) for w in waves] == [1, 1, 1]
    launches = [w[0] for w in waves]
    assert [lch.group for lch in launches] == ["std.vae.1", "std.vae.2", "std.vae.3"]
    assert [lch.env["CUDA_VISIBLE_DEVICES"] for lch in launches] == ["0", "0,1", "0,1,2"]
    assert [lch.device for lch in launches] == ["0", "0-1", "0-2"]
    assert all(lch.cgroup is None and not lch.concurrent for lch in launches)
    third = launches[2]
    assert third.argv[:10] == [
        PY,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "3",
        "-m",
        "milarun",
        "run",
        "milarun.models.vae:main",
    ]
    assert third.argv[third.argv.index("--extra") + 1] == extra(
        0, "0-2", [0, 1, 2], "gpu-progression"
    )


def test_normal_one_launch_on_all_devices():
    waves = plan_job(job("normal"), Devices("gpu", [0, 1]), 1, "/out", "/d", python=PY, timeout=7)
    assert len(waves) == 1 and len(waves[0]) == 1
    lch = waves[0][0]
    assert lch.device == "all" and lch.devices == [0, 1] and lch.cgroup is None
    assert lch.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert lch.timeout == 7.0
    assert "--job-id" in lch.argv and lch.argv[lch.argv.index("--job-id") + 1] == "1.all"


def test_suite_repeats_every_job_in_order():
    jobs = [job("per-gpu"), Job("std", "toy", "m:f", plan_type="normal")]
    waves = plan_suite(jobs, Devices("cpu", [0]), 2, "/o", dataroot="/d", python=PY)
    assert [(w[0].name, w[0].run) for w in waves] == [
        ("std.vae", 0),
        ("std.toy", 0),
        ("std.vae", 1),
        ("std.toy", 1),
    ]


def test_dry_run_prints_commands_and_starts_nothing(tmp_path, capsys, monkeypatch):
    import pytest

    from milarun.cli import main
    from milarun.host import isolation

    monkeypatch.setattr(isolation, "missing_groups", lambda specs: [])  # as if they existed
    profile = tmp_path / "p.json"
    profile.write_text(
        json.dumps(
            {
                "a": {
                    "experiment": "milarun.models.toy_reg:main",
                    "partition_scheme": {"type": "per-gpu", "cgroup": "cpuset:student{device}"},
                    "prepare": ["echo {dataroot}"],
                }
            }
        )
    )
    (tmp_path / "data").mkdir()
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "jobs",
                str(profile),
                "--dry-run",
                "--cpu-slots",
                "2",
                "-d",
                str(tmp_path / "data"),
                "-o",
                str(tmp_path / "out"),
                "--",
                "--max-count",
                "5",
            ]
        )
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert f"# prepare: echo {tmp_path / 'data'}" in out
    assert out.count("-m milarun run milarun.models.toy_reg:main") == 2
    assert "cgroup: cpuset:student1" in out and "CUDA_VISIBLE_DEVICES=''" in out
    assert "--max-count 5" in out
    assert not (tmp_path / "out").exists()
