"""The input-pipeline study: its datasets, the io workload, --profile-trace and the report view."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import SMOKE_ARGS, build_tiny, run_model, steady_samples

from milarun.bench.rate import RateLogger
from milarun.bench.trace import ProfileTrace
from milarun.datasets import prepare, resolve_params
from milarun.formats.record import new_result, validate
from milarun.formats.store import iter_results, write_result
from milarun.measure import stats


@pytest.fixture(scope="session")
def io_dataroot(tiny_dataroot):
    return build_tiny(tiny_dataroot, "fashion_mnist", "mydataset")


# --- datasets ---------------------------------------------------------------------------


def test_fashion_mnist_reads_back_through_torchvision(io_dataroot):
    from torchvision.datasets import FashionMNIST

    _, params = resolve_params("fashion_mnist", "tiny")
    root = io_dataroot / "fashion_mnist"
    raw = root / "FashionMNIST" / "raw"
    # the idx header: magic 0x00000803 (uint8, 3 dimensions), then the dimensions
    head = (raw / "train-images-idx3-ubyte").read_bytes()[:16]
    assert (
        head
        == bytes.fromhex("00000803")
        + params["count"].to_bytes(4, "big")
        + (28).to_bytes(4, "big") * 2
    )
    for train, key in ((True, "count"), (False, "test_count")):
        ds = FashionMNIST(str(root), train=train, download=False)
        assert len(ds) == params[key]
        assert ds.data.shape == (params[key], 28, 28)
        assert set(ds.targets.tolist()) == set(range(10))
    img, label = FashionMNIST(str(root), train=True, download=False)[0]
    assert img.size == (28, 28) and 0 <= label < 10
    # each class is a different silhouette: class means differ, images are not blank
    ds = FashionMNIST(str(root), train=True, download=False)
    means = [ds.data[ds.targets == c].float().mean().item() for c in range(10)]
    assert min(means) > 5 and len({round(m) for m in means}) >= 8


def test_fashion_mnist_is_deterministic(tmp_path):
    a = prepare(
        "fashion_mnist",
        tmp_path / "a",
        size="tiny",
        seed=3,
        overrides={"count": 64},
        log=lambda *_: None,
    )
    b = prepare(
        "fashion_mnist",
        tmp_path / "b",
        size="tiny",
        seed=3,
        overrides={"count": 64},
        log=lambda *_: None,
    )
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        assert (a / "FashionMNIST/raw" / name).read_bytes() == (
            b / "FashionMNIST/raw" / name
        ).read_bytes()


def test_mydataset_layout_and_reader(io_dataroot):
    from milarun.datasets.mydataset import MyDataset, sample_path

    _, params = resolve_params("mydataset", "tiny")
    folder = io_dataroot / "mydataset"
    index = json.loads((folder / "index.json").read_text())
    assert index["format"] == "milarun-mydataset" and index["count"] == params["count"]
    files = sorted((folder / "samples").rglob("*.npy"))
    assert len(files) == params["count"]
    labels = np.load(folder / "labels.npy")
    x = np.load(sample_path(folder, 7))  # plain numpy reads each sample
    assert x.dtype == np.float32 and x.shape == (1, 28, 28)
    ds = MyDataset(folder)
    assert len(ds) == params["count"] and ds.shape == (1, 28, 28)
    img, label = ds[7]
    assert np.array_equal(img, x) and label == labels[7]
    # the label shifts the brightness: something to learn
    means = [np.mean([ds[i][0].mean() for i in range(len(ds)) if ds[i][1] == c]) for c in (0, 9)]
    assert means[1] - means[0] > 0.1
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_mydataset_rejects_a_foreign_index(tmp_path):
    from milarun.datasets.mydataset import MyDataset

    (tmp_path / "index.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="index.json: format"):
        MyDataset(tmp_path)
    with pytest.raises(FileNotFoundError, match="milarun dataset mydataset"):
        MyDataset(tmp_path / "missing")


def test_dataset_cli_builds_mydataset_with_count_and_lists_both(tmp_path, capsys):
    from milarun.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["dataset", "mydataset", "--count", "1200", "-d", str(tmp_path)])
    assert exc.value.code == 0
    folder = tmp_path / "mydataset"
    assert json.loads((folder / "index.json").read_text())["count"] == 1200
    assert sorted(p.name for p in (folder / "samples").iterdir()) == ["00000", "00001"]
    with pytest.raises(SystemExit):
        main(["dataset", "--list-datasets"])
    listed = capsys.readouterr().out
    assert re.search(r"^fashion_mnist ", listed, re.M) and re.search(r"^mydataset ", listed, re.M)


# --- the io workload ----------------------------------------------------------------------

IO = "milarun.models.io:main"


@pytest.mark.parametrize(
    "mode,workers,dataset",
    [
        ("traverse", 0, "fashion_mnist"),
        ("traverse", 2, "mydataset"),
        ("train", 0, "mydataset"),
        ("train", 2, "fashion_mnist"),
    ],
)
def test_io_modes_and_workers(mode, workers, dataset, io_dataroot, tmp_path):
    res = run_model(
        IO,
        SMOKE_ARGS
        + [
            "--mode",
            mode,
            "--dataset",
            dataset,
            "--workers",
            str(workers),
            "--batch-size",
            "32",
            "--max-count",
            "640",
            "--persistent-workers",
            "--prefetch-factor",
            "3",
            "--device",
            "cpu",
        ],
        dataroot=io_dataroot,
        tmp_path=tmp_path,
    )
    assert res["_exit_code"] == 0, res["error"]
    assert len(steady_samples(res)) >= 2
    assert res["timings"]["train"]["count"] == 640
    metrics = res["metrics"]
    assert metrics["workers"] == workers
    assert metrics["persistent_workers"] is (workers > 0)
    assert metrics["prefetch_factor"] == (3 if workers else None)
    assert metrics["pin_memory"] is False  # CPU: nothing to pin for
    if mode == "train":
        assert math.isfinite(metrics["loss"])
    else:
        assert "loss" not in metrics


def test_io_rejects_bad_options_and_missing_dataset(io_dataroot, tmp_path):
    res = run_model(
        IO,
        SMOKE_ARGS + ["--mode", "fly", "--max-count", "64"],
        dataroot=io_dataroot,
        tmp_path=tmp_path,
    )
    assert res["success"] is False and "--mode must be one of" in res["error"]["message"]
    res = run_model(
        IO,
        SMOKE_ARGS + ["--dataset", "mydataset", "--max-count", "64"],
        dataroot=tmp_path,
        tmp_path=tmp_path,
    )
    assert res["success"] is False
    assert "milarun dataset mydataset" in res["error"]["message"]


def test_workers_pct_scales_with_cores():
    from milarun.models.io import resolve_workers

    assert [resolve_workers(0, pct, 8) for pct in (0, 25, 50, 100, 200)] == [0, 2, 4, 8, 16]
    assert [resolve_workers(0, pct, 2) for pct in (0, 25, 100)] == [0, 1, 2]  # never 0 but for 0
    assert resolve_workers(5, None, 8) == 5
    with pytest.raises(ValueError, match="--workers-pct"):
        resolve_workers(0, -1, 8)


# --- --profile-trace ----------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class FakeProfiler:
    def __init__(self, activities, clock, export_cost):
        self.activities = activities
        self.clock = clock
        self.export_cost = export_cost
        self.calls = []

    def start(self):
        self.calls.append("start")
        self.clock.t += 0.3  # starting a profiler is slow: it must fall in no sample

    def stop(self):
        self.calls.append("stop")

    def export_chrome_trace(self, path):
        self.calls.append("export")
        self.clock.t += self.export_cost
        Path(path).write_text('{"traceEvents": []}')


class FakeExp:
    def __init__(self, out):
        self.out = str(out)
        self.name = "t.model"
        self.device = None
        self.result = new_result("t.model")


def test_profiled_steps_are_flagged_and_left_out_of_the_steady_state(tmp_path):
    clock = FakeClock()
    exp = FakeExp(tmp_path / "rec.json")
    profilers = []

    def make(activities):
        profilers.append(FakeProfiler(activities, clock, export_cost=2.0))
        return profilers[-1]

    logger = RateLogger(sample_duration=1.0, max_count=300, warmup=2, host_clock=clock, origin=0.0)
    logger.tracer = ProfileTrace(exp, "traces", 5, profiler=make)
    for step in logger.steps():
        # 10 items per 0.1 s (100 items/s), but 10x slower under the profiler
        clock.t += 1.0 if logger.window_flags.get("profiled") else 0.1
        step.set_count(10)
    samples = logger.samples
    profiled = [s for s in samples if s.get("profiled")]
    assert profilers[0].calls == ["start", "stop", "export"]
    assert sum(s["count"] for s in profiled) == 50  # the 5 profiled steps
    assert all(not s["warmup"] for s in profiled)
    assert len([s for s in samples if s["warmup"]]) == 2  # profiling waited for them
    # the profiler's start and the export are in no sample
    for a, b in zip(samples, samples[1:]):
        assert b["start"] >= a["end"] - 1e-9
    assert sum(b["start"] - a["end"] for a, b in zip(samples, samples[1:])) == pytest.approx(2.3)
    rate, chosen, _ = stats.steady_state(samples)
    assert rate == pytest.approx(100.0)
    assert not any(s.get("profiled") for s in chosen)
    rec = exp.result["profile_trace"]
    assert rec["path"] == "traces/rec.trace.json" and rec["steps"] == 5
    assert rec["activities"] == ["cpu"] and rec["note"] is None
    assert (tmp_path / "traces" / "rec.trace.json").is_file()


def test_a_run_too_short_to_profile_says_so(tmp_path):
    clock = FakeClock()
    exp = FakeExp(tmp_path / "rec.json")
    logger = RateLogger(sample_duration=1.0, max_count=20, warmup=3, host_clock=clock, origin=0.0)
    logger.tracer = ProfileTrace(exp, "traces", 5, profiler=lambda a: FakeProfiler(a, clock, 0.0))
    for step in logger.steps():
        clock.t += 0.1
        step.set_count(10)
    assert exp.result["profile_trace"]["path"] is None
    assert "no step was profiled" in exp.result["profile_trace"]["note"]
    assert not any(s.get("profiled") for s in logger.samples)


def test_profile_steps_are_bounded(tmp_path):
    with pytest.raises(ValueError, match="--profile-steps"):
        ProfileTrace(FakeExp(tmp_path / "r.json"), "t", 0)


def test_profile_trace_writes_a_chrome_trace_linked_from_the_record(io_dataroot, tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    res = run_model(
        IO,
        [
            "--sample-duration",
            "0.05",
            "--warmup",
            "1",
            "--mode",
            "train",
            "--dataset",
            "fashion_mnist",
            "--batch-size",
            "16",
            "--max-count",
            "480",
            "--device",
            "cpu",
            "--profile-trace",
            "traces",
            "--profile-steps",
            "3",
        ],
        dataroot=io_dataroot,
        tmp_path=out,
    )
    assert res["_exit_code"] == 0, res["error"]
    link = res["profile_trace"]
    assert link["path"] == "traces/result.trace.json" and link["steps"] == 3
    assert link["note"] is None and link["start"] < link["end"]
    trace = json.loads((out / link["path"]).read_text())
    events = trace["traceEvents"]
    assert len(events) > 10
    assert all("ph" in e and "name" in e for e in events)
    steps = {e["name"] for e in events if e["name"].startswith("milarun step")}
    assert steps == {"milarun step 0", "milarun step 1", "milarun step 2"}
    assert any(e["name"].startswith("aten::conv") for e in events)  # the model ran in it
    samples = res["timings"]["train"]["samples"]
    profiled = [s for s in samples if s.get("profiled")]
    assert sum(s["count"] for s in profiled) == 3 * 16
    assert any(not s["warmup"] and not s.get("profiled") for s in samples)
    validate({k: v for k, v in res.items() if k != "_exit_code"})
    # the trace is in the results folder, yet no reader takes it for a record
    assert [p.name for p, _ in iter_results(out)] == ["result.json"]


def test_profile_trace_refuses_no_instrument(io_dataroot, tmp_path):
    res = run_model(
        "milarun.models.toy_reg:main",
        ["--no-instrument", "--profile-trace", "t", "--max-count", "64"],
        tmp_path=tmp_path,
    )
    assert res["success"] is False and "--no-instrument" in res["error"]["message"]


def test_profile_trace_reaches_the_child_through_jobs_and_rerun(tmp_path):
    """The option is a test argument: ``milarun jobs P -- --profile-trace DIR`` appends it to
    every test's command, and a rerun of the record replays it."""
    from milarun.host.devices import Devices
    from milarun.launcher.rerun import rerun_command
    from milarun.plan.launches import plan_job
    from milarun.profile.language import load_profile

    profile = tmp_path / "p.json"
    profile.write_text(
        json.dumps(
            {
                "t": {
                    "experiment": "milarun.models.toy_reg:main",
                    "partition_scheme": {"type": "normal"},
                }
            }
        )
    )
    (job,) = load_profile(profile)
    waves = plan_job(
        job, Devices("cpu", [0]), 0, tmp_path / "out", extra_args=["--profile-trace", "traces"]
    )
    argv = waves[0][0].argv
    assert argv[-2:] == ["--profile-trace", "traces"]
    record = new_result("p.t")
    record["call"] = {
        "function": job.experiment,
        "argv": argv[argv.index("--") + 1 :],
        "arguments": {},
    }
    replay, _ = rerun_command(record, ["--profile-steps", "4"])
    assert replay[-4:] == ["--profile-trace", "traces", "--profile-steps", "4"]


# --- the report view ----------------------------------------------------------------------


def io_record(mode, dataset, workers, rate, run=0, **fields):
    rec = new_result(f"io.io-{mode}-{dataset}-w{workers}", f"{run}.0", run=run)
    rec["success"] = True
    rec["call"] = {
        "function": IO,
        "argv": [],
        "arguments": {"mode": mode, "dataset": dataset, "workers": workers},
    }
    rec["metrics"] = {"workers": workers}
    rec["timings"]["program"] = {"start": 1.0e9, "end": 1.0e9 + 21, "duration": 21.0}
    rec["timings"]["train"]["samples"] = [
        {"start": float(i), "end": float(i + 1), "count": rate, "rate": rate, "warmup": i == 0}
        for i in range(20)
    ]
    rec["host"] = {"hostname": "h", "cpu_model": "EPYC", "cpu_count": 2, "gpus": []}
    rec.update(fields)
    return rec


RATES = {("traverse", 0): 1000.0, ("train", 0): 800.0, ("traverse", 2): 3000.0, ("train", 2): 900.0}


@pytest.fixture
def io_results(tmp_path):
    out = tmp_path / "results"
    for (mode, workers), rate in RATES.items():
        for dataset, scale in (("fashion_mnist", 1.0), ("mydataset", 0.5)):
            write_result(io_record(mode, dataset, workers, rate * scale), out)
    return out


def test_io_tables_pair_traverse_and_train_per_workers(io_results):
    from milarun.analysis.summary import summarize_dir
    from milarun.report.iostudy import io_tables

    summary, records = summarize_dir(io_results)
    tables = io_tables(summary, records)
    assert [t["dataset"] for t in tables] == ["fashion_mnist", "mydataset"]
    rows = tables[0]["rows"]
    assert [r["workers"] for r in rows] == [0, 2]
    assert rows[0]["traverse"] == pytest.approx(1000) and rows[0]["train"] == pytest.approx(800)
    assert rows[0]["ratio"] == pytest.approx(0.8) and rows[1]["ratio"] == pytest.approx(0.3)
    assert tables[1]["rows"][1]["train"] == pytest.approx(450)
    # a summary file alone: the test names say the same
    assert io_tables(summary, None) == tables


def test_io_tables_skip_other_tests_and_missing_modes(tmp_path):
    from milarun.analysis.summary import summarize
    from milarun.report.iostudy import io_tables

    other = io_record("train", "x", 1, 5.0)
    other["call"]["function"] = "milarun.models.convnet:main"
    lone = io_record("traverse", "fashion_mnist", 4, 10.0)
    summary = summarize([other, lone])
    (table,) = io_tables(summary, [other, lone])
    assert table["rows"] == [
        {
            "workers": 4,
            "traverse": 10.0,
            "train": None,
            "ratio": None,
            "tests": ["io.io-traverse-fashion_mnist-w4"],
        }
    ]


def test_report_shows_the_io_study_and_links_traces(io_results, tmp_path):
    from milarun.report import make_report

    # one record with a trace in the results folder, one pointing outside it
    trace_dir = io_results / "traces"
    trace_dir.mkdir()
    (trace_dir / "a.trace.json").write_text('{"traceEvents": []}')
    write_result(
        io_record(
            "train",
            "fashion_mnist",
            0,
            800.0,
            run=1,
            profile_trace={"path": "traces/a.trace.json", "steps": 3},
        ),
        io_results,
    )
    write_result(
        io_record(
            "train",
            "fashion_mnist",
            2,
            900.0,
            run=1,
            profile_trace={"path": "../../etc/passwd", "steps": 3},
        ),
        io_results,
    )
    html = tmp_path / "report" / "index.html"
    report, text = make_report(str(io_results), html=str(html), warn=open("/dev/null", "w"))
    assert "input-pipeline study (io), dataset fashion_mnist" in text
    line = next(ln for ln in text.splitlines() if ln.split()[:1] == ["2"])
    assert line.split() == ["2", "3000.0", "900.0", "0.300"]
    page = html.read_text()
    assert 'id="io-study"' in page and 'id="io-mydataset"' in page
    assert page.count("<svg") >= 2 + len(report.rows)  # two io plots + throughput plots
    links = re.findall(r'<a class="trace" href="([^"]+)"', page)
    assert links == ["../results/traces/a.trace.json"]
    assert (html.parent / links[0]).resolve() == (trace_dir / "a.trace.json").resolve()


def test_report_without_io_tests_has_no_io_section(tmp_path):
    from milarun.report import make_report

    rec = io_record("train", "fashion_mnist", 0, 5.0)
    rec["call"]["function"] = "milarun.models.convnet:main"
    write_result(rec, tmp_path / "r")
    _, text = make_report(str(tmp_path / "r"), html=str(tmp_path / "r.html"))
    assert "input-pipeline" not in text
    assert "io-study" not in (tmp_path / "r.html").read_text()


def test_profiled_spans_stay_out_of_the_effective_throughput():
    from milarun.measure import throughput

    def sample(start, end, rate, **flags):
        return {
            "start": start,
            "end": end,
            "count": rate * (end - start),
            "rate": rate,
            "warmup": False,
            **flags,
        }

    # 100 items/s, then 2 s under the profiler at 10 items/s, 1 s to start and export it
    a = [sample(t, t + 1, 100.0) for t in range(0, 10)]
    a += [sample(10.5, 12.5, 10.0, profiled=True)]
    a += [sample(13 + t, 14 + t, 100.0) for t in range(0, 10)]
    b = [sample(t, t + 1, 50.0) for t in range(0, 23)]
    assert throughput.profiled_spans(a) == [(10, 13)]
    w = throughput.wave(
        [{"label": "a", "anchor": 0.0, "samples": a}, {"label": "b", "anchor": 0.0, "samples": b}]
    )
    assert w["effective"]["a"] == pytest.approx(100.0)
    assert w["effective"]["b"] == pytest.approx(50.0)
    assert w["adjusted"] == pytest.approx(150.0)


# --- the shipped profiles ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name,axis,values,flag",
    [
        ("io", "c", [0, 25, 50, 100, 200], "--workers-pct"),
        ("io-seed", "w", [0, 32, 64, 128, 256], "--workers"),
    ],
)
def test_io_profiles_sweep_workers_mode_and_dataset(name, axis, values, flag):
    from conftest import ROOT

    from milarun.profile.language import load_profile

    jobs = load_profile(ROOT / "profiles" / f"{name}.json")
    # the two modes of one workers value run one after the other (drift hits both alike)
    assert [j.name for j in jobs] == [
        f"io-{mode}-{dataset}-{axis}{v}"
        for dataset in ("fashion_mnist", "mydataset")
        for v in values
        for mode in ("traverse", "train")
    ]
    for job in jobs:
        argv = job.argv({"cpu_per_gpu": 16})
        mode, dataset, value = re.fullmatch(r"io-(\w+?)-(\w+)-[cw](\d+)", job.name).groups()
        assert argv[argv.index("--mode") + 1] == mode
        assert argv[argv.index("--dataset") + 1] == dataset
        assert argv[argv.index(flag) + 1] == value
        assert "io" in job.tags and job.plan_type == "per-gpu"
        if name == "io":  # scaled to the student's cores, filled per launch
            assert job.placeholders == ["cpu_per_gpu"]
            assert argv[argv.index("--cores") + 1] == "16"
        else:
            assert job.placeholders == [] and "--workers-pct" not in argv
