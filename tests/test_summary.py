"""Summary: golden output, grouping, steady-state notes, unreadable files, formats."""

import json
import math
import shutil
from pathlib import Path

import pytest

from milarun.analysis.summary import summarize, summarize_dir
from milarun.cli import main
from milarun.errors import ResultFormatError
from milarun.formats.record import FORMAT_VERSION
from milarun.formats.summary import normalize_summary, read_summary

FIX = Path(__file__).parent / "fixtures"
RESULTS = FIX / "results"


def cli(args):
    """Run ``milarun ARGS``; returns the exit code (main() calls sys.exit)."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    return exc.value.code


def assert_close(actual, expected, path="$"):
    """Deep comparison with a relative tolerance on floats."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), path
        assert sorted(actual) == sorted(expected), path
        for k in expected:
            assert_close(actual[k], expected[k], f"{path}.{k}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, f"{path}[{i}]")
    elif isinstance(expected, float):
        assert actual == pytest.approx(expected, rel=1e-9, abs=1e-12), path
    else:
        assert actual == expected, path


def test_summary_matches_golden(capsys):
    summary, records = summarize_dir(RESULTS)
    expected = json.loads((FIX / "expected" / "summary.json").read_text())
    assert len(records) == 10
    assert_close(json.loads(json.dumps(summary)), expected)


def test_summary_values_by_hand():
    summary, _ = summarize_dir(RESULTS)
    t = summary["tests"]
    assert sorted(t) == [
        "standard.convnet",
        "standard.scaling.1",
        "standard.scaling.2",
        "standard.short",
        "standard.vae",
        "standard.wlm",
    ]
    conv = t["standard.convnet"]
    assert conv["n"] == 4 and conv["failures"] == 0
    assert conv["train"]["mean"] == pytest.approx(100.0)
    assert conv["train"]["std"] == pytest.approx(math.sqrt(32 / 3))
    assert conv["pergpu"]["0"]["mean"] == pytest.approx(102.0)
    assert conv["pergpu"]["1"]["mean"] == pytest.approx(98.0)
    assert conv["peak_memory"] == 5100.0
    vae = t["standard.vae"]
    assert (vae["n"], vae["failures"]) == (2, 1)
    assert vae["failure_reasons"] == {"oom-killed": 1}
    assert "Killed" in vae["failed"][0]["stderr_tail"]
    assert vae["train"]["n"] == 1 and vae["train"]["mean"] == pytest.approx(200.0)
    assert t["standard.scaling.2"]["pergpu"] == {
        "0-1": {"n": 1, "min": 560.0, "max": 560.0, "mean": 560.0, "std": 0.0}
    }
    assert t["standard.short"]["steady"] == {"full": 0, "short": 1, "none": 0}
    assert t["standard.wlm"]["train"]["mean"] is None
    assert t["standard.wlm"]["failure_reasons"] == {"timeout": 1}


def test_unreadable_files_skipped_with_one_warning_each(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert cli(["summary", str(RESULTS), "-o", str(out)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"milarun: warning: skipped {RESULTS / 'config.json'}: not a result record "
        "(no 'version' or 'name' key)",
        f"milarun: warning: skipped {RESULTS / 'standard.broken.J0.0.20261121-129990-000000.json'}"
        ": invalid JSON: Expecting property name enclosed in double quotes at line 45, column 5",
        f"milarun: warning: skipped {RESULTS / 'standard.future.J0.0.20261121-129991-000000.json'}"
        ": version: format version 99 is newer than this milarun (13)",
        f"milarun: warning: skipped {RESULTS / 'standard.xss.J0.0.20261121-120010-000000.json'}"
        ": name: 'standard.<script>alert(1)</script>' is not a valid test name (like "
        "'suite.test': letters, digits, '_', '-', and '.' between them)",
    ]
    data = json.loads(out.read_text())
    assert data["format"] == "milarun-summary" and data["version"] == 1
    assert len(data["skipped"]) == 4
    assert read_summary(out)["tests"]["standard.vae"]["n"] == 2


def test_malformed_samples_are_skipped(tmp_path):
    src = next(RESULTS.glob("standard.short.*.json"))
    rec = json.loads(src.read_text())
    rec["timings"]["train"]["samples"][5]["count"] = "lots"
    summary = summarize([(tmp_path / "bad.json", rec)])
    assert summary["tests"] == {} and summary["skipped"] == ["bad.json"]


def test_old_version_migrates(tmp_path):
    rec = json.loads(next(RESULTS.glob("standard.short.*.json")).read_text())
    old = {k: v for k, v in rec.items() if k != "version"}
    old["train"] = old["timings"].pop("train")
    shutil.copytree(RESULTS, tmp_path / "r", ignore=shutil.ignore_patterns("standard.short.*"))
    (tmp_path / "r" / "standard.short.J0.0.old.json").write_text(json.dumps(old))
    summary, _ = summarize_dir(tmp_path / "r")
    assert summary["tests"]["standard.short"]["train"]["mean"] == pytest.approx(40.0)


def test_reads_2020_flat_format():
    base = read_summary(FIX / "baseline2020.json")
    assert base["origin"] == "milarun-2020"
    assert base["tests"]["standard.convnet"]["train"]["mean"] == 80.0
    assert base["tests"]["standard.convnet"]["pergpu"]["1"]["n"] == 2


@pytest.mark.parametrize(
    "data,key",
    [
        ({"hello": "world"}, None),
        ([], None),
        ({"format": "milarun-summary", "version": 7, "tests": {}}, "version"),
        ({"format": "milarun-summary", "version": 1, "tests": {"a.b": {"n": 1}}}, "a.b.train"),
        ({"a.b": {"n": -1, "train": {}}}, "a.b.n"),
        ({"a.b": {"n": 1, "failures": 0, "train": {"mean": "fast"}}}, "a.b.train.mean"),
    ],
)
def test_neither_format_is_one_clear_error(data, key):
    with pytest.raises(ResultFormatError) as exc:
        normalize_summary(data, path="x.json")
    assert str(exc.value).startswith("x.json")
    if key:
        assert key in str(exc.value)


def test_missing_dir_is_cli_error(tmp_path, capsys):
    assert cli(["summary", str(tmp_path / "nope")]) == 2
    assert "milarun: error:" in capsys.readouterr().err


def test_interrupted_records_are_counted_apart_from_failures(tmp_path):
    # An interrupted launch is the operator's doing: it is listed, not a failure,
    # and left out of n (so of the failure rate); its samples do not score.
    for name in (
        "standard.convnet.J0.0.20261121-120000-000000.json",
        "standard.convnet.J0.1.20261121-120001-000000.json",
    ):
        shutil.copy(RESULTS / name, tmp_path / name)
    cut = json.loads((RESULTS / "standard.convnet.J1.0.20261121-120002-000000.json").read_text())
    cut["success"] = False
    cut["error"] = {"reason": "interrupted", "message": "stopped by the launcher"}
    (tmp_path / "standard.convnet.J1.0.FAIL.20261121-120002-000000.json").write_text(
        json.dumps(cut)
    )
    # what a session keeps beside its records is not read as results
    (tmp_path / ".milarun").mkdir()
    (tmp_path / ".milarun" / "session.json").write_text("{}")
    (tmp_path / "standard.convnet.J1.1.20261121-120003-000000.journal.jsonl").write_text("{")
    summary, records = summarize_dir(tmp_path)
    conv = summary["tests"]["standard.convnet"]
    assert len(records) == 3 and summary["skipped"] == []
    assert (conv["n"], conv["failures"], conv["interrupted"]) == (2, 0, 1)
    assert conv["failed"] == [] and conv["train"]["n"] == 2


def _with_failures(**entry):
    """A one-test summary with 4 results, 2 of them failed, and ``entry`` on top."""
    test = {
        "n": 4,
        "failures": 2,
        "train": {"n": 2, "min": 1.0, "max": 1.0, "mean": 1.0, "std": 0.0},
        **entry,
    }
    return {"format": "milarun-summary", "version": 1, "tests": {"s.t": test}}


@pytest.mark.parametrize(
    "entry,message",
    [
        (
            {"pernode_failures": {"node1": 2, "node2": 1}},
            "x.json: tests.s.t.pernode_failures: more failures per node (3) than failures (2)",
        ),
        (
            {"pernode_failures": {"node1": 0}},
            "x.json: tests.s.t.pernode_failures.node1: must be >= 1, not 0",
        ),
        (
            {"pernode_failures": {"../n": 1}},
            "x.json: tests.s.t.pernode_failures.'../n': '../n' is not a valid name",
        ),
        (
            {"failed": [{"device": "0", "node": "a/b"}]},
            "x.json: tests.s.t.failed.0.node: 'a/b' is not a valid name",
        ),
    ],
)
def test_bad_per_node_failures_are_one_line(entry, message):
    with pytest.raises(ResultFormatError) as exc:
        normalize_summary(_with_failures(**entry), path="x.json")
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


def test_per_node_failures_round_trip(tmp_path):
    good = _with_failures(
        pernode_failures={"node1": 2},
        failed=[{"device": "0", "node": "node1"}, {"device": "1", "node": None}, {"device": "2"}],
    )
    s = normalize_summary(good)
    t = s["tests"]["s.t"]
    assert t["pernode_failures"] == {"node1": 2}
    assert [f["node"] for f in t["failed"]] == ["node1", None, None]


# ---------------------------------------------------------------- one reading, in order


def _generate(directory, **sizes):
    """Result files as benchmarks/report_scale.py makes them."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "report_scale", Path(__file__).resolve().parent.parent / "benchmarks" / "report_scale.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.generate(directory, **sizes)


def test_results_read_as_one_by_one(tmp_path):
    """load_results gives the same records, the same skipped files and messages, in the
    same order, as reading each file alone (store.parse_results)."""
    from milarun.analysis import summary
    from milarun.formats.store import parse_results, result_files

    assert _generate(tmp_path, tests=3, devices=5, runs=30, nsamples=6) == 450
    names = sorted(p.name for p in tmp_path.iterdir())
    for k, name in enumerate(names[::37]):
        path = tmp_path / name
        rec = json.loads(path.read_text())
        if k % 4 == 0:
            rec["run"] = "first"  # the schema refuses it
        elif k % 4 == 1:  # version 0: migrated, not refused
            rec["train"] = rec["timings"].pop("train")
            rec["version"] = 0
        elif k % 4 == 2:
            rec["version"] = 99  # newer than ours
        else:
            path.write_text("{not json")
            continue
        path.write_text(json.dumps(rec))
    expected = list(parse_results(result_files(tmp_path)))
    records, skipped = summary.load_results(tmp_path)
    assert len(skipped) == 10 and len(records) == 440  # 13 bad, 3 of them migrated
    assert [(p, r) for p, r in records] + [(p, str(e)) for p, e in skipped] == [
        (p, r) for p, r in expected if not isinstance(r, Exception)
    ] + [(p, str(r)) for p, r in expected if isinstance(r, Exception)]
    migrated = {tmp_path / names[37 * k] for k in (1, 5, 9)}
    assert [r["version"] for p, r in records if p in migrated] == [FORMAT_VERSION] * 3


def test_summary_and_plots_drawn_with_it_are_those_drawn_alone(tmp_path):
    """summarize_with's plots (drawn from the steady states the summary computed) are
    those drawn from the records alone, and its summary is summarize's."""
    from milarun.analysis.summary import load_results, summarize_with
    from milarun.report.html import throughput_plot, throughput_plots

    _generate(tmp_path, tests=4, devices=2, runs=2, nsamples=20)
    records, _ = load_results(tmp_path)
    summary, drawn = summarize_with(records, extra=throughput_plot)
    assert summary == summarize(records)
    assert len(drawn) == 4 and all(v[0].startswith("<svg") for v in drawn.values())
    assert throughput_plots(records) == drawn


def _fixture_records():
    import copy

    recs = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("standard.convnet.J0.*.json"))]
    a, b = recs[0], copy.deepcopy(recs[1])
    b["host"] = copy.deepcopy(a["host"])
    for gpu in b["host"]["gpus"]:
        gpu["name"] = "OTHER " + gpu["name"]
    return a, b


def test_a_host_seen_again_after_another_is_folded_again():
    """Hosts A, B, A (same facts, other GPU names): the last one's names win, as when
    every record was folded (not B's, because A was seen before)."""
    import copy

    a, b = _fixture_records()
    aba = summarize([a, b, copy.deepcopy(a)])["hosts"]
    ba = summarize([b, copy.deepcopy(a)])["hosts"]
    assert aba == ba
    assert not any("OTHER" in name for host in aba for name in host["gpus"])


def test_warnings_before_an_error_come_out_as_from_one_record_after_another():
    """A record skipped (malformed samples), then one whose group is unknown: its
    warning is written before the error is raised, as one record after another did."""
    import copy
    import io

    a, _ = _fixture_records()
    bad = copy.deepcopy(a)
    bad["timings"]["train"]["samples"] = [{"start": 5, "end": 1, "rate": 1}]
    noname = copy.deepcopy(a)
    noname.pop("name")
    noname["partition"] = "nonesuch"
    warn = io.StringIO()
    with pytest.raises(KeyError):
        summarize([bad, a, noname], warn=warn)
    assert "end 1 is before start 5" in warn.getvalue()


def test_a_failing_test_summary_raises_the_first_in_order_after_the_warnings(monkeypatch):
    import copy
    import io

    from milarun.analysis import summary

    a, _ = _fixture_records()
    recs = []
    for name in ("t9", "t1", "t5"):
        rec = copy.deepcopy(a)
        rec["name"], rec["partition"] = name, "nonesuch"
        recs.append(rec)
    bad = copy.deepcopy(a)
    bad["timings"]["train"]["samples"] = [{"start": 5, "end": 1, "rate": 1}]
    recs.append(bad)

    def boom(gname, kept):
        raise ValueError(gname)

    monkeypatch.setattr(summary, "_summarize_group", boom)
    warn = io.StringIO()
    with pytest.raises(ValueError, match="t1"):
        summary.summarize_with(recs, warn=warn)
    assert "end 1 is before start 5" in warn.getvalue()
