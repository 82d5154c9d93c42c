"""The reference floors per GPU model (milarun/formats/floors.py, its table
milarun/formats/data/gpu_floors.json): the strict reader's bad inputs, the model chosen by
GPU name (a fake name for every model, and names that have none), and the acceptance verdict
against the floors (milarun/analysis/acceptance.py) with figures generated from the table:
just above every floor passes, just below fails, and a tender's figure overrides a floor.
No GPU here: every figure is synthetic."""

import copy
import json

import pytest

from milarun.analysis.acceptance import verdict
from milarun.errors import MilarunError, ResultFormatError
from milarun.formats.floors import (
    default_path,
    detect,
    floor_of,
    model_for,
    read_floors,
    shipped_floors,
)
from milarun.formats.thresholds import read_thresholds
from milarun.report.acceptance import html_view, verdict_lines

GIB = 2**30

#: A name each model's GPUs report (NVML's nvmlDeviceGetName, amdsmi's market_name).
NAMES = {
    "h100_sxm": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200",
    "b200": "NVIDIA B200",
    "gb200": "NVIDIA GB200",
    "a100_sxm_80gb": "NVIDIA A100-SXM4-80GB",
    "l40s": "NVIDIA L40S",
    "mi300x": "AMD Instinct MI300X",
    "mi325x": "AMD Instinct MI325X",
}


@pytest.fixture(scope="module")
def table():
    return read_floors()


# --- the shipped table ----------------------------------------------------------------


def test_shipped_table_reads_and_covers_every_model(table):
    assert set(table["models"]) == set(NAMES)
    assert shipped_floors() == table
    for model, entry in table["models"].items():
        figures = [
            f for s in ("matmul", "bandwidth", "collectives", "network") for f in entry[s].values()
        ]
        assert figures, model
        for figure in figures:
            assert table["sources"][figure["source"]]["url"].startswith("https://")
            assert 0 < figure["fraction"] <= 1 and figure["reference"] > 0 and figure["measured"]
        # a figure left out is said so in the file
        if "fp8_e4m3" not in entry["matmul"]:
            assert any("fp8_e4m3" in text for text in entry["omitted"]), model


def test_floor_is_reference_times_fraction(table):
    h100 = table["models"]["h100_sxm"]
    assert floor_of(h100["matmul"]["bf16"]) == pytest.approx(675.3)  # 0.85 x 794.5 (MAMF)
    assert floor_of(h100["bandwidth"]["h2d_pinned_gbps"]) == 48  # Azure's floor as is
    assert floor_of(h100["collectives"]["all_reduce"]) == 460
    assert h100["collectives"]["all_reduce"]["at_bytes"] == 16 * GIB
    assert floor_of(table["models"]["h200"]["collectives"]["all_reduce"]) == 431


# --- the reader's bad inputs ------------------------------------------------------------


def _write(tmp_path, data):
    path = tmp_path / "floors.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def _shipped():
    with open(default_path(), encoding="utf-8") as f:
        return json.load(f)


def _mutate(edit):
    data = _shipped()
    edit(data)
    return data


def _fig(data, section="matmul", key="bf16", model="h100_sxm"):
    return data["models"][model][section][key]


@pytest.mark.parametrize(
    "edit, key, words",
    [
        (
            lambda d: _fig(d).update(reference=-1),
            "models.h100_sxm.matmul.bf16.reference",
            "must be a number of TFLOP/s from 0 to 1e6, not -1",
        ),
        (
            lambda d: _fig(d, "bandwidth", "h2d_pinned_gbps").update(reference=-48),
            "models.h100_sxm.bandwidth.h2d_pinned_gbps.reference",
            "must be a number of GB/s from 0 to 1e6, not -48",
        ),
        (
            lambda d: _fig(d).pop("source"),
            "models.h100_sxm.matmul.bf16.source",
            "missing (every figure names its source",
        ),
        (
            lambda d: _fig(d).pop("measured"),
            "models.h100_sxm.matmul.bf16.measured",
            "missing (what the source measured",
        ),
        (
            lambda d: _fig(d).update(source="a-blog"),
            "models.h100_sxm.matmul.bf16.source",
            "unknown source 'a-blog'",
        ),
        (
            lambda d: _fig(d).update(fraction=0),
            "models.h100_sxm.matmul.bf16.fraction",
            "must be a fraction above 0 and at most 1, not 0",
        ),
        (
            lambda d: _fig(d).update(fraction=1.5),
            "models.h100_sxm.matmul.bf16.fraction",
            "must be a fraction above 0 and at most 1, not 1.5",
        ),
        (
            lambda d: _fig(d).update(reference="794"),
            "models.h100_sxm.matmul.bf16.reference",
            "must be a number of TFLOP/s",
        ),
        (
            lambda d: d["models"]["h100_sxm"]["matmul"].update(fp16=_fig(d)),
            "models.h100_sxm.matmul.fp16",
            "unknown key",
        ),
        (
            lambda d: _fig(d, "collectives", "all_reduce").pop("at_bytes"),
            "models.h100_sxm.collectives.all_reduce.at_bytes",
            "missing (the message size",
        ),
        (
            lambda d: d["models"]["h100_sxm"].update(patterns=["NVIDIA H100 (80GB"]),
            "models.h100_sxm.patterns.0",
            "not a regular expression",
        ),
        (
            lambda d: d["models"]["h100_sxm"].pop("omitted"),
            "models.h100_sxm.omitted",
            "missing",
        ),
        (
            lambda d: d["sources"]["bekman-mamf"].update(url="ftp://x"),
            "sources.bekman-mamf.url",
            "must be an https:// address",
        ),
    ],
)
def test_bad_table_is_one_line_naming_the_file_and_the_key(tmp_path, edit, key, words):
    path = _write(tmp_path, _mutate(edit))
    with pytest.raises(ResultFormatError) as exc:
        read_floors(path)
    message = str(exc.value)
    assert "\n" not in message and str(path) in message and key in message, message
    assert words in message, message


@pytest.mark.parametrize(
    "text, words",
    [
        ("{", "invalid JSON: Expecting property name"),
        ("[]", "the floors table must be an object {description, sources, models}"),
    ],
)
def test_table_not_json_or_not_an_object(tmp_path, text, words):
    path = _write(tmp_path, text)
    with pytest.raises(MilarunError) as exc:
        read_floors(path)
    assert str(exc.value).startswith(f"{path}: {words}") and "\n" not in str(exc.value)


def test_missing_table_is_an_error(tmp_path):
    with pytest.raises(ResultFormatError, match="not found|cannot read|No such"):
        read_floors(tmp_path / "absent.json")


# --- the model by GPU name --------------------------------------------------------------


@pytest.mark.parametrize("model, name", sorted(NAMES.items()))
def test_model_by_gpu_name(table, model, name):
    assert model_for(name, table) == model
    # case and runs of white space are ignored; exactly one model matches
    assert model_for(f"  {name.upper().replace(' ', '   ')} ", table) == model
    hits = [m for m in table["models"] if model_for(name, {"models": {m: table["models"][m]}})]
    assert hits == [model]


@pytest.mark.parametrize(
    "name", ["AMD Instinct MI300X OAM", "AMD Instinct MI300X VF", "AMD Instinct MI325X OAM"]
)
def test_amd_name_variants(table, name):
    assert model_for(name, table) == ("mi300x" if "MI300X" in name else "mi325x")


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA L4",
        "NVIDIA GH200 480GB",  # not the H200's figures
        "NVIDIA H100 PCIe",  # not the SXM's
        "NVIDIA H200 NVL",
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA A100 80GB PCIe",
        "AMD Instinct MI250X",
        "cpu",
        "",
    ],
)
def test_unknown_gpu_has_no_model(table, name):
    assert model_for(name, table) is None


def test_detect_reads_the_summary_hosts(table):
    hosts = [
        {"hostname": "n1", "gpus": ["NVIDIA H100 80GB HBM3"] * 2},
        {"hostname": "n2", "gpus": ["NVIDIA H100 80GB HBM3", None]},
        {"hostname": "cpu-host", "gpus": []},
    ]
    got = detect(hosts, table)
    assert got["names"] == {"NVIDIA H100 80GB HBM3": "h100_sxm"}
    assert got["hosts"] == {"NVIDIA H100 80GB HBM3": ["n1", "n2"]}
    assert detect(None, table)["names"] == {}


# --- the verdict against the floors -----------------------------------------------------


def _tests(entry, scale, extra_multinode=False):
    """Summary ``tests`` whose acceptance figures are ``scale`` x each floor of ``entry``."""
    tests = {}
    matmul = [
        {
            "precision": p,
            "supported": True,
            "n": 8,
            "tflops": scale * floor_of(f),
            "best_tflops": scale * floor_of(f),
            "best_tflops_min": scale * floor_of(f),
            "best_shape": "8192x8192x8192",
            "peak_tflops": None,
        }
        for p, f in entry["matmul"].items()
    ]
    if matmul:
        tests["acc.matmul"] = {"acceptance": {"test": "matmul", "matmul": matmul}}
    bw = entry["bandwidth"]
    if bw:
        copies = [
            {
                "node": "n1",
                "gpu": g,
                **{
                    k: (scale * floor_of(bw[k]) if k in bw else None)
                    for k in ("h2d_pinned_gbps", "d2h_pinned_gbps")
                },
            }
            for g in range(2)
        ]
        stream = [
            {
                "node": "n1",
                "device": str(g),
                "triad_gbps": scale * floor_of(bw["stream_triad_gbps"]),
            }
            for g in range(2)
        ]
        tests["acc.bandwidth"] = {
            "acceptance": {
                "test": "bandwidth",
                "bandwidth": {
                    "not_applicable": False,
                    "copies": copies,
                    "d2d": [],
                    "stream": stream,
                },
            }
        }
    if "all_reduce" in entry["collectives"]:
        f = entry["collectives"]["all_reduce"]
        rows = [
            {"op": "all_reduce", "bytes": b, "ranks": 8, "busbw_gbps": scale * floor_of(f), "n": 1}
            for b in (GIB, f["at_bytes"])
        ]
        tests["acc.collectives"] = {
            "acceptance": {
                "test": "collectives",
                "collectives": {"rows": rows, "expected_busbw_gbps": None, "expected_bound": None},
            }
        }
        if extra_multinode:  # across nodes: far below the intra-node floor, never judged by it
            slow = [{**r, "busbw_gbps": 1.0} for r in rows]
            tests["acc.collectives.2x8"] = {
                "node_count": 2,
                "gpus_per_node": 8,
                "acceptance": {"test": "collectives", "collectives": {"rows": slow}},
            }
    return tests


def _hosts(name, nodes=2):
    return [{"hostname": f"n{i}", "gpus": [name] * 8} for i in range(1, nodes + 1)]


def _judged(entry):
    n = len(entry["matmul"]) + len(entry["bandwidth"]) + len(entry["collectives"])
    return n


@pytest.mark.parametrize("model", sorted(NAMES))
def test_figures_above_every_floor_pass(table, model):
    entry = table["models"][model]
    clauses = verdict({"floors": True}, _tests(entry, 1.01, True), _hosts(NAMES[model]))
    assert clauses and all(c["ok"] for c in clauses), clauses
    assert len(clauses) == _judged(entry)  # the 2-node collectives group is not judged
    for c in clauses:
        assert c["clause"].startswith("floor: ")
        assert c["floor"]["model"] == model and c["floor"]["label"] == entry["label"]
        assert f"floor of {entry['label']}" in c["detail"] and "(source: " in c["detail"]


@pytest.mark.parametrize("model", sorted(NAMES))
def test_figures_below_every_floor_fail(table, model):
    entry = table["models"][model]
    clauses = verdict({"floors": True}, _tests(entry, 0.99), _hosts(NAMES[model]))
    assert len(clauses) == _judged(entry) and not any(c["ok"] for c in clauses), clauses


def test_detail_names_the_floor_and_its_source(table):
    entry = table["models"]["h100_sxm"]
    clauses = verdict({"floors": True}, _tests(entry, 1.01), _hosts(NAMES["h100_sxm"]))
    by = {c["floor"]["figure"]: c for c in clauses}
    assert set(by) == {
        "matmul.bf16",
        "matmul.fp8_e4m3",
        "bandwidth.stream_triad_gbps",
        "bandwidth.h2d_pinned_gbps",
        "bandwidth.d2h_pinned_gbps",
        "collectives.all_reduce",
    }
    bf16 = by["matmul.bf16"]
    assert bf16["clause"] == "floor: matmul bf16 (acc.matmul)"
    assert bf16["detail"].endswith(
        "(needed: >= 675.3 TFLOP/s); floor of NVIDIA H100 SXM: 675.3 TFLOP/s = 0.85 x 794.5 "
        "(source: bekman-mamf)"
    )
    ar = by["collectives.all_reduce"]
    assert ar["clause"] == "floor: collectives all_reduce at 16 GiB (acc.collectives)"
    assert "floor of NVIDIA H100 SXM: 460 GB/s (source: azure-nhc-nd-h100-v5)" in ar["detail"]
    assert ar["floor"]["url"].startswith("https://github.com/Azure/azurehpc-health-checks/")


def test_all_reduce_floor_at_the_largest_size_when_its_size_was_not_measured(table):
    entry = table["models"]["h100_sxm"]
    tests = _tests(entry, 1.01)
    rows = tests["acc.collectives"]["acceptance"]["collectives"]["rows"]
    rows[-1]["bytes"] = 8 * GIB  # the acceptance profile's sweep stops at 8 GiB
    (c,) = [
        c
        for c in verdict({"floors": True}, tests, _hosts(NAMES["h100_sxm"]))
        if "all_reduce" in c["clause"]
    ]
    assert c["ok"] and "at the largest size" in c["clause"]
    assert "busbw 465 GB/s at 8 GiB" in c["detail"]
    assert "(the floor is stated at 16 GiB, not measured here)" in c["detail"]


def test_thresholds_override_a_floor(table):
    entry = table["models"]["h100_sxm"]
    tests = _tests(entry, 0.5)  # every figure half its floor
    thresholds = {
        "floors": True,
        "matmul": {"bf16": {"min_tflops": 300}},
        "bandwidth": {"h2d_pinned_gbps": 20},
        "collectives": {"all_reduce": {"min_busbw_gbps": 200, "at_bytes": 16 * GIB}},
    }
    clauses = verdict(thresholds, tests, _hosts(NAMES["h100_sxm"]))
    tender = [c for c in clauses if "floor" not in c]
    floors = [c for c in clauses if "floor" in c]
    # the tender's clauses judge bf16, H2D and all-reduce, and pass (their figures are lower)
    assert [c["clause"] for c in tender] == [
        "collectives all_reduce at 16 GiB (acc.collectives)",
        "bandwidth h2d_pinned_gbps >= 20 GB/s (acc.bandwidth)",
        "matmul bf16 (acc.matmul)",
    ]
    assert all(c["ok"] for c in tender)
    # the floors judge only what the tender left unset, and fail at half the floor
    assert sorted(c["floor"]["figure"] for c in floors) == [
        "bandwidth.d2h_pinned_gbps",
        "bandwidth.stream_triad_gbps",
        "matmul.fp8_e4m3",
    ]
    assert not any(c["ok"] for c in floors)


def test_without_the_switch_the_verdict_is_unchanged(table):
    entry = table["models"]["h100_sxm"]
    tests = _tests(entry, 0.5)
    thresholds = {"matmul": {"bf16": {"min_tflops": 300}}}
    assert verdict(thresholds, tests) == verdict(thresholds, tests, _hosts(NAMES["h100_sxm"]))
    assert [c["clause"] for c in verdict(thresholds, tests)] == ["matmul bf16 (acc.matmul)"]


@pytest.mark.parametrize(
    "hosts, detail",
    [
        ([{"hostname": "n1", "gpus": ["NVIDIA L4"] * 4}], "no reference floors for NVIDIA L4"),
        (None, "no GPU names given (the summary's hosts): no model"),
        ([{"hostname": "n1", "gpus": []}], "no GPU named in the records (host.gpus): no model"),
        (
            [
                {"hostname": "n1", "gpus": ["NVIDIA H100 80GB HBM3"]},
                {"hostname": "n2", "gpus": ["NVIDIA H200"]},
            ],
            "GPUs of several models (NVIDIA H100 SXM, NVIDIA H200 SXM): one model's floors cannot "
            "judge them all; set the figures in the thresholds",
        ),
    ],
)
def test_no_model_never_passes_silently(table, hosts, detail):
    tests = _tests(table["models"]["h100_sxm"], 2.0)
    clauses = verdict({"floors": True}, tests, hosts)
    assert clauses == [{"ok": False, "clause": "reference floors", "detail": detail}]


def test_unknown_gpu_beside_a_known_one_fails_and_the_known_is_judged(table):
    hosts = [{"hostname": "n1", "gpus": ["NVIDIA H100 80GB HBM3", "NVIDIA L4"]}]
    clauses = verdict({"floors": True}, _tests(table["models"]["h100_sxm"], 2.0), hosts)
    assert clauses[0] == {
        "ok": False,
        "clause": "reference floors",
        "detail": "no reference floors for NVIDIA L4",
    }
    assert len(clauses) == 7 and all(c["ok"] for c in clauses[1:])


def test_floors_with_no_test_to_judge_fail(table):
    clauses = verdict({"floors": True}, {"x.y": {"n": 1}}, _hosts("NVIDIA B200"))
    assert clauses == [
        {
            "ok": False,
            "clause": "reference floors",
            "detail": "no test of the results to judge against the floors of NVIDIA B200",
        }
    ]


def test_the_switch_in_a_thresholds_file(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"floors": True}))
    assert read_thresholds(path) == {"floors": True}
    path.write_text(json.dumps({"floors": "yes"}))
    with pytest.raises(ResultFormatError, match=r"floors: must be true or false, not 'yes'"):
        read_thresholds(path)


# --- the report shows which floor each clause used --------------------------------------


def test_report_lines_name_the_model_and_the_sources(table):
    entry = table["models"]["mi300x"]
    tests = _tests(entry, 1.01)
    clauses = verdict({"floors": True}, tests, _hosts("AMD Instinct MI300X"))
    lines = verdict_lines(clauses)
    assert (
        lines[0]
        == f"acceptance thresholds: PASS ({len(clauses)} of {len(clauses)} clause(s) passed)"
    )
    assert lines[1] == (
        "  reference floors of AMD Instinct MI300X (mi300x; GPUs named AMD Instinct MI300X) "
        "for the figures the thresholds leave unset"
    )
    assert lines[2].startswith("  not in its floors: matmul.fp8_e4m3: ")
    assert "  floor sources:" in lines
    sources = lines[lines.index("  floor sources:") + 1 :]
    assert [s.split(":")[0].strip() for s in sources] == [
        "bekman-mamf",
        "bekman-memory",
        "azure-nhc-nd-mi300x-v5",
    ]
    assert all("https://github.com/" in s for s in sources)


def test_html_view_gives_each_floor_clause_its_source(table):
    tests = _tests(table["models"]["h200"], 1.01)
    clauses = verdict({"floors": True}, tests, _hosts("NVIDIA H200"))
    view = html_view([], copy.deepcopy(clauses), None)["verdict"]
    assert view["ok"] and view["total"] == len(clauses)
    for shown in view["clauses"]:
        assert shown["floor"]["url"] in shown["detail"] and "measured: " in shown["detail"]
