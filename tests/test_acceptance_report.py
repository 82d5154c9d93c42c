"""The acceptance report: the summary's ``tests[g].acceptance``, the
text and HTML sections (bus bandwidth plot, device-to-device heatmap, per-GPU burn-in table)
and the verdict of ``milarun report --thresholds``, on synthetic records of a two-node run."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import cli, summary_of

from milarun.analysis.acceptance import acceptance_figures, kind_of
from milarun.analysis.summary import node_of, summarize_dir
from milarun.cli import main
from milarun.formats.record import new_result
from milarun.formats.store import write_result
from milarun.formats.summary import write_summary
from milarun.formats.thresholds import read_thresholds
from milarun.report.acceptance import burn_table, size_text

ROOT = Path(__file__).parent.parent
SUITE = "acc"
GIB = 2**30
NODES = ("node1", "node2")


def record(
    test,
    experiment,
    *,
    device="0",
    devices=(0,),
    partition="per-gpu",
    node="node1",
    rate=100.0,
    metrics=None,
    success=True,
    error=None,
    **fields,
):
    """A record of ``SUITE.test`` run by ``experiment`` whose steady-state rate is ``rate``."""
    rec = new_result(
        f"{SUITE}.{test}",
        f"0.{device}",
        device=device,
        devices=list(devices),
        plan_type=partition,
        node=node,
        nodes=[node],
        gpus_per_node=len(devices),
    )
    rec["job"] = {"experiment": f"milarun.models.{experiment}:main"}
    rec["success"] = success
    if error:
        rec["error"] = error
    rec["timings"]["program"] = {"start": 1.0e9, "end": 1.0e9 + 21, "duration": 21.0}
    rec["timings"]["train"]["samples"] = (
        [
            {"start": float(i), "end": float(i + 1), "count": rate, "rate": rate, "warmup": i == 0}
            for i in range(20)
        ]
        if success
        else []
    )
    rec["host"] = {
        "hostname": node,
        "cpu_model": "EPYC",
        "cpu_count": 64,
        "torch": "2.13.0",
        "cuda": "13.0",
        "gpus": [],
    }
    rec["metrics"] = dict(metrics or {})
    rec.update(fields)
    return rec


def busbw(op, nbytes):
    """A bus bandwidth curve that saturates: 380 GB/s for all-reduce at 1 GiB."""
    top = {"all_reduce": 400.0, "all_gather": 300.0}[op]
    return top * nbytes / (nbytes + 2**26)


def records():
    sizes = [8 * 4**i for i in range(15)] + [GIB]  # 8 B ... 2 GiB by 4, and 1 GiB
    sizes = sorted(set(s for s in sizes if s <= 2 * GIB))
    rows = [
        {
            "op": op,
            "bytes": s,
            "ranks": 4,
            "time_s": 1e-3,
            "algbw_gbps": busbw(op, s) / 1.5,
            "busbw_gbps": busbw(op, s),
        }
        for op in ("all_reduce", "all_gather")
        for s in sizes
    ]
    out = [
        record(
            "collectives",
            "collectives",
            device="all",
            devices=(0, 1),
            partition="njobs",
            metrics={
                "expected_busbw_gbps": 450.0,
                "expected_bound": "nvlink",
                "busbw_all_reduce_max_gbps": 390.0,
            },
            collectives=rows,
        )
    ]
    for n, node in enumerate(NODES):
        m = {"gpus": 2, "host_buffer_numa_nodes": "0"}
        for g in (0, 1):
            for key, v in (
                ("h2d_pinned", 25.0),
                ("h2d_pageable", 12.0),
                ("d2h_pinned", 26.0),
                ("d2h_pageable", 11.0),
                ("bidir_pinned", 40.0),
                ("bidir_pageable", 20.0),
            ):
                m[f"{key}_gbps_gpu{g}"] = v - (10.0 if (n, g, key) == (1, 1, "h2d_pinned") else 0)
            for k, v in (("copy", 3000.0), ("scale", 2990.0), ("add", 3100.0), ("triad", 3105.0)):
                m[f"stream_{k}_gbps_gpu{g}"] = v
        m.update(
            {
                "d2d_gbps_0_1": 370.0,
                "d2d_gbps_1_0": 365.0,
                "d2d_peer_0_1": True,
                "d2d_peer_1_0": n == 0,
            }
        )
        out.append(
            record(
                "bandwidth",
                "bandwidth",
                device="all",
                devices=(0, 1),
                partition="normal",
                node=node,
                metrics=m,
            )
        )
    for n, node in enumerate(NODES):
        for g in (0, 1):
            best = 700.0 - 30 * (2 * n + g)
            out.append(
                record(
                    "matmul",
                    "matmul",
                    device=str(g),
                    node=node,
                    metrics={
                        "tflops_bf16": 600.0,
                        "mamf_tflops_bf16": best,
                        "mamf_shape_bf16": "8192x8192x8192",
                        "peak_tflops_bf16": 989.4,
                        "tflops_fp8_e4m3": "not supported on this device",
                        "unsupported_fp8_e4m3": "not supported on this device (cc 8.0)",
                    },
                )
            )
    for n, node in enumerate(NODES):
        for g in (0, 1):
            slow = (n, g) == (1, 1)
            m = {
                "tflops": 500.0 * (0.9 if slow else 1.0),
                "throttled_fraction": 0.0,
                "throttled": False,
                "throttle_reasons": "",
                "clock_start_mhz": 1980.0,
                "clock_steady_mhz": 1975.0,
                "clock_low_fraction": 0.0,
                "clock_drop": False,
            }
            if (n, g) == (0, 1):
                m.update(
                    {
                        "throttled_fraction": 0.3,
                        "throttled": True,
                        "throttle_reasons": "sw_power_cap",
                        "clock_steady_mhz": 1700.0,
                        "clock_low_fraction": 0.6,
                        "clock_drop": True,
                    }
                )
            out.append(record("burn", "burn", device=str(g), node=node, metrics=m))
    out.append(
        record(
            "burn",
            "burn",
            device="2",
            node="node2",
            success=False,
            error={
                "reason": "data-corruption",
                "message": "iteration 5: the result differs from the reference",
            },
            metrics={"iterations": 4},
        )
    )
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("acceptance")
    for rec in records():
        write_result(rec, out)
    return out


@pytest.fixture(scope="module")
def summary(results):
    return summary_of(results)


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# --- the summary -----------------------------------------------------------------------------


def test_summary_entry_per_acceptance_test(summary):
    tests = summary["tests"]
    assert {g: t["acceptance"]["test"] for g, t in tests.items()} == {
        "acc.collectives": "collectives",
        "acc.bandwidth": "bandwidth",
        "acc.matmul": "matmul",
        "acc.burn": "burn",
    }
    coll = tests["acc.collectives"]["acceptance"]["collectives"]
    assert coll["expected_busbw_gbps"] == 450.0 and coll["expected_bound"] == "nvlink"
    at_gib = [r for r in coll["rows"] if r["op"] == "all_reduce" and r["bytes"] == GIB]
    assert at_gib[0]["busbw_gbps"] == pytest.approx(busbw("all_reduce", GIB))
    bw = tests["acc.bandwidth"]["acceptance"]["bandwidth"]
    assert len(bw["copies"]) == 4 and len(bw["d2d"]) == 4 and len(bw["stream"]) == 4
    low = [c for c in bw["copies"] if c["node"] == "node2" and c["gpu"] == 1][0]
    assert low["h2d_pinned_gbps"] == 15.0 and low["d2h_pinned_gbps"] == 26.0
    assert [c["peer"] for c in bw["d2d"]] == [True, True, True, False]
    (bf16, fp8) = tests["acc.matmul"]["acceptance"]["matmul"]
    assert bf16 == {
        "precision": "bf16",
        "supported": True,
        "n": 4,
        "tflops": 600.0,
        "best_tflops": 655.0,
        "best_tflops_min": 610.0,
        "best_shape": "8192x8192x8192",
        "peak_tflops": 989.4,
    }
    assert fp8["precision"] == "fp8_e4m3" and not fp8["supported"]
    gpus = tests["acc.burn"]["acceptance"]["burn"]["gpus"]
    assert [(g["node"], g["device"]) for g in gpus] == [
        ("node1", "0"),
        ("node1", "1"),
        ("node2", "0"),
        ("node2", "1"),
        ("node2", "2"),
    ]
    assert gpus[1]["throttled"] and gpus[1]["clock_drop"] and gpus[1]["throttled_fraction"] == 0.3
    assert gpus[4]["failure"] == "data-corruption" and gpus[4]["tflops"] is None


def test_only_acceptance_tests_have_the_entry():
    plain = record("matmul", "matmul", metrics={"tflops_fp32": 10.0})  # no shape sweep
    assert kind_of(plain) is None and acceptance_figures([plain], node_of) is None
    other = record("convnet", "convnet", metrics={"loss": 1.0})
    assert acceptance_figures([other], node_of) is None
    # hostile figures are dropped, not kept
    bad = record(
        "burn",
        "burn",
        metrics={"tflops": float("nan"), "throttled": "yes", "throttled_fraction": 1e300},
    )
    (row,) = acceptance_figures([bad], node_of)["burn"]["gpus"]
    assert row["tflops"] is None and row["throttled"] is None
    assert row["throttled_fraction"] is None


def test_burn_table_flags_against_the_median_of_all_gpus():
    gpus = [
        {"node": n, "device": d, "tflops": t, "failure": None}
        for n, d, t in (("a", "0", 100.0), ("a", "1", 99.0), ("b", "0", 101.0), ("b", "1", 94.0))
    ]
    table = burn_table(gpus, 5.0)
    assert table["median"] == 99.5
    assert [g["flags"] for g in table["gpus"]] == [[], [], [], ["SLOW"]]
    assert burn_table(gpus, 6.0)["gpus"][3]["flags"] == []
    assert size_text(GIB) == "1 GiB" and size_text(8) == "8 B" and size_text(3 << 19) == "1.5 MiB"


# --- the text report and the verdict -----------------------------------------------------------

PASSING = {
    "description": "tender 2026-17, lot 2",
    "collectives": {"all_reduce": {"min_busbw_fraction": 0.8, "at_bytes": GIB}},
    "bandwidth": {"d2h_pinned_gbps": 20, "stream_triad_gbps": 2500},
    "matmul": {"bf16": {"min_peak_fraction": 0.6}},
}
FAILING = {
    "collectives": {
        "all_reduce": {"min_busbw_fraction": 0.9, "at_bytes": GIB},
        "all_gather": {"min_busbw_gbps": 100, "at_bytes": 3 * GIB},
    },
    "burn": {
        "max_below_median_pct": 5,
        "data_corruption": False,
        "throttled": False,
        "clock_drop": False,
    },
    "matmul": {"bf16": {"min_peak_fraction": 0.7}, "fp8_e4m3": {"min_tflops": 1}},
    "bandwidth": {"h2d_pinned_gbps": 20, "d2h_pinned_gbps": 20},
}


def test_text_section_and_passing_thresholds(results, tmp_path, capsys):
    path = write(tmp_path, "pass.json", PASSING)
    code, out, err = cli(["report", results, "--thresholds", path], capsys)
    assert code == 0, err
    assert "acceptance acc.collectives: collectives, bus bandwidth" in out
    assert "expected peak 450 GB/s (nvlink)" in out
    assert re.search(r"all_reduce\s+4\s+388\s+2 GiB\s+86\.2%\s+388\s+2 GiB", out)
    assert "busbw (GB/s) by message size:" in out and re.search(r"1 GiB\s+376", out)
    assert "device to device on node2 (row: source, column: destination; * no peer access)" in out
    assert re.search(r"1\s+365\*\s+-", out)  # no peer access on node2
    assert re.search(r"bf16\s+600\s+655\s+610\s+8192x8192x8192\s+989\.4\s+66\.2%", out)
    assert re.search(r"fp8_e4m3.*not supported on this device", out)
    assert "SLOW: more than 5% below it" in out
    assert re.search(
        r"node1:1\s+0\s+500\s+\+0\.0%\s+30\.0%\s+1980\s+1700\s+THROTTLED CLOCK-DROP", out
    )
    assert re.search(r"node2:1\s+0\s+450\s+-10\.0%.*SLOW", out)
    assert re.search(r"node2:2\s+0\s+-\s+-.*DATA-CORRUPTION", out)
    assert "acceptance thresholds: PASS (4 of 4 clause(s) passed)" in out
    assert (
        "PASS  collectives all_reduce at 1 GiB (acc.collectives): busbw 376 GB/s at 1 GiB; "
        "= 83.7% of the expected 450 GB/s (needed: >= 80.0%)"
    ) in out
    assert (
        "PASS  bandwidth stream_triad_gbps >= 2500 GB/s (acc.bandwidth): lowest 3105 GB/s "
        "(node1:0) of 4"
    ) in out
    # --burn-threshold moves the SLOW line
    code, out, _ = cli(["report", results, "--burn-threshold", "12"], capsys)
    assert code == 0 and "SLOW: more than 12% below it" in out
    assert not re.search(r"node2:1 .*SLOW", out) and "acceptance thresholds" not in out


def test_failing_thresholds_exit_1_with_one_line_per_clause(results, tmp_path, capsys):
    path = write(tmp_path, "fail.json", FAILING)
    code, out, err = cli(["report", results, "--thresholds", path], capsys)
    assert code == 1
    assert err.strip().splitlines()[-1] == (
        f"milarun: error: --thresholds {path}: 9 of 10 acceptance clause(s) failed"
    )
    verdict = out[out.index("acceptance thresholds:") :].splitlines()
    assert verdict[0] == "acceptance thresholds: FAIL (1 of 10 clause(s) passed)"
    clauses = [line.split(":")[0].strip() for line in verdict[1:11]]
    assert clauses == [
        "FAIL  collectives all_reduce at 1 GiB (acc.collectives)",
        "FAIL  collectives all_gather at 3 GiB (acc.collectives)",
        "FAIL  bandwidth h2d_pinned_gbps >= 20 GB/s (acc.bandwidth)",
        "PASS  bandwidth d2h_pinned_gbps >= 20 GB/s (acc.bandwidth)",
        "FAIL  matmul bf16 (acc.matmul)",
        "FAIL  matmul fp8_e4m3 (acc.matmul)",
        "FAIL  burn no GPU more than 5% below the median (acc.burn)",
        "FAIL  burn no data corruption (acc.burn)",
        "FAIL  burn no throttling (acc.burn)",
        "FAIL  burn no clock drop (acc.burn)",
    ]
    text = "\n".join(verdict)
    assert "all_gather not measured at 3 GiB" in text
    assert "lowest 15 GB/s (node2:1) of 4; below: node2:1" in text
    assert "= 61.7% of the peak 989.4 (needed: >= 70.0%)" in text
    assert "fp8_e4m3 (acc.matmul): not supported on this device" in text
    assert "lowest node2:1 -10.0%; flagged: node2:1" in text
    assert "burn no data corruption (acc.burn): 5 GPU run(s) checked; flagged: node2:2" in text
    assert "burn no throttling (acc.burn): 4 GPU(s) with clock readings; flagged: node1:1" in text


def test_thresholds_on_results_without_the_test(tmp_path, capsys):
    out_dir = tmp_path / "res"
    write_result(record("burn", "burn", metrics={"tflops": 1.0}), out_dir)
    path = write(tmp_path, "t.json", {"matmul": {"fp64": {"min_tflops": 1}}})
    code, out, _ = cli(["report", out_dir, "--thresholds", path], capsys)
    assert code == 1 and "FAIL  matmul fp64: no matmul results" in out


@pytest.mark.parametrize(
    "data, key, message",
    [
        (
            {"collectives": {"all_reduce": {"min_busbw_fraction": 80}}},
            "collectives.all_reduce.min_busbw_fraction",
            "must be a fraction from 0 to 1, not 80",
        ),
        (
            {"collectives": {"allreduce": {"min_busbw_fraction": 0.8}}},
            "collectives.allreduce",
            "unknown collective",
        ),
        (
            {"collectives": {"all_reduce": {"at_bytes": GIB}}},
            "collectives.all_reduce",
            "must hold min_busbw_fraction or min_busbw_gbps",
        ),
        ({"burn": {"data_corruption": True}}, "burn.data_corruption", "must be false"),
        ({"burn": {"max_below_median_pct": -1}}, "burn.max_below_median_pct", "percentage"),
        ({"bandwidth": {"h2d_gbps": 20}}, "bandwidth.h2d_gbps", "unknown key"),
        (
            {"matmul": {"bf16": {"min_peak_fraction": "70%"}}},
            "matmul.bf16.min_peak_fraction",
            "must be a fraction",
        ),
        ({"burns": {}}, "burns", "unknown key"),
    ],
)
def test_malformed_thresholds_file_is_one_error_line(results, tmp_path, capsys, data, key, message):
    path = write(tmp_path, "bad.json", data)
    code, out, err = cli(["report", results, "--thresholds", path], capsys)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith(f"milarun: error: {path}: {key}: ") and message in line, line


def test_thresholds_not_json_and_bad_burn_threshold(results, tmp_path, capsys):
    path = write(tmp_path, "bad.json", '{"burn": {"data_corruption": false,}}')
    code, out, err = cli(["report", results, "--thresholds", path], capsys)
    assert code == 2 and out == "" and err.startswith(f"milarun: error: {path}")
    assert len(err.strip().splitlines()) == 1
    code, out, err = cli(["report", results, "--burn-threshold", "150"], capsys)
    assert code == 2 and "--burn-threshold must be a percentage from 0 to 100" in err


@pytest.mark.parametrize("name", ["acceptance.json"])
def test_shipped_thresholds_file_is_valid(name):
    data = read_thresholds(ROOT / "thresholds" / name)
    assert data["collectives"]["all_reduce"]["at_bytes"] == GIB
    assert data["burn"]["data_corruption"] is False


def test_summary_file_round_trip_keeps_the_section(results, tmp_path, capsys):
    import io

    summary = tmp_path / "summary.json"
    s, _ = summarize_dir(results, warn=io.StringIO())
    write_summary(s, summary)
    code, out, err = cli(["report", summary], capsys)
    assert code == 0, err
    assert "acceptance acc.burn: burn-in per GPU" in out
    assert "device to device on node1" in out


# --- HTML --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def page(results, tmp_path_factory):
    path = tmp_path_factory.mktemp("html") / "acceptance.html"
    thresholds = tmp_path_factory.mktemp("th") / "t.json"
    thresholds.write_text(json.dumps(FAILING))
    with pytest.raises(SystemExit):
        main(["report", str(results), "--html", str(path), "--thresholds", str(thresholds)])
    return path


def test_html_section_has_the_plots_and_tables(page):
    text = page.read_text()
    section = text[text.index('<section id="acceptance">') :]
    section = section[: section.index("</section>")]
    assert '<figure class="busbw-plot">' in section
    assert len(re.findall(r'<figure class="d2d-heatmap">', section)) == 2  # one per node
    assert len(re.findall(r"<svg\b", section)) == 3
    busbw_svg = section[section.index('<figure class="busbw-plot">') :]
    assert "all_reduce" in busbw_svg[: busbw_svg.index("</svg>")]
    assert "bus bandwidth (GB/s)" in busbw_svg and "message size (bytes)" in busbw_svg
    assert "destination GPU" in section and "source GPU" in section
    assert 'id="burn-acc.burn"' in section and "THROTTLED CLOCK-DROP" in section
    assert "DATA-CORRUPTION" in section and ">SLOW<" in section
    assert "Thresholds: FAIL (1 of 10 clauses passed)" in section
    assert "<script" not in text
    # the verdict is also in the score boxes at the top, linked to the clause table
    score = text[text.index('<section id="score">') :]
    score = score[: score.index("</section>")]
    assert re.search(
        r"Acceptance thresholds \(1 of 10 clauses passed\).*"
        r'<a href="#acceptance-verdict" id="acceptance-box" class="FAIL">FAIL</a>',
        score,
        re.S,
    )


CHROMIUM = "/usr/bin/chromium"


@pytest.mark.browser
def test_acceptance_section_in_headless_chromium(page, tmp_path):
    import shutil

    exe = shutil.which("chromium") or (CHROMIUM if os.path.exists(CHROMIUM) else None)
    if exe is None:
        reason = "chromium is not installed (run scripts/install-browser.sh)"
        if os.environ.get("MILARUN_REQUIRE_BROWSER") == "1":
            pytest.fail(f"MILARUN_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)
    flags = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    proc = subprocess.run(
        [*flags, "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    section = dom[dom.index('<section id="acceptance">') :]
    section = section[: section.index("</section>")]
    assert len(re.findall(r"<svg\b", section)) == 3
    shot = Path(os.environ.get("MILARUN_SCREENSHOT_DIR", tmp_path)) / "acceptance.png"
    anchor = page.resolve().as_uri() + "#acceptance"
    proc = subprocess.run(
        [*flags, "--window-size=1400,3000", f"--screenshot={shot}", anchor],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_collectives_across_node_counts(tmp_path, capsys):
    out_dir = tmp_path / "prog"
    for n, top in ((1, 400.0), (2, 300.0)):
        nodes = [f"node{i + 1}" for i in range(n)]
        rows = [
            {
                "op": "all_reduce",
                "bytes": s,
                "ranks": 2 * n,
                "time_s": 1e-3,
                "algbw_gbps": top / 2,
                "busbw_gbps": top * s / GIB,
            }
            for s in (GIB // 2, GIB)
        ]
        rec = record(
            "collectives_nodes",
            "collectives",
            device=f"{n}x2",
            devices=(0, 1),
            partition="node-progression",
            collectives=rows,
            metrics={
                "expected_busbw_gbps": 450.0 if n == 1 else 500.0,
                "expected_bound": "nvlink" if n == 1 else "network",
            },
        )
        rec.pop("node")
        rec.update({"nodes": nodes, "node_count": n})
        write_result(rec, out_dir)
    path = write(tmp_path, "t.json", {"collectives": {"all_reduce": {"min_busbw_fraction": 0.8}}})
    html = tmp_path / "p.html"
    code, out, _ = cli(["report", out_dir, "--thresholds", path, "--html", html], capsys)
    assert code == 1
    page_text = html.read_text()
    assert 'id="collectives-scaling"' in page_text and "<td>300 (60.0%)</td>" in page_text
    assert len(re.findall(r'<figure class="busbw-plot">', page_text)) == 2
    assert "acceptance collectives across groups: best busbw" in out
    assert re.search(r"acc\.collectives_nodes\.1x2\s+1x2\s+2\s+400 \(88\.9%\)\s+450", out)
    assert re.search(r"acc\.collectives_nodes\.2x2\s+2x2\s+4\s+300 \(60\.0%\)\s+500", out)
    assert (
        "PASS  collectives all_reduce at the largest size (acc.collectives_nodes.1x2): "
        "busbw 400 GB/s at 1 GiB; = 88.9% of the expected 450 GB/s"
    ) in out
    assert (
        "FAIL  collectives all_reduce at the largest size (acc.collectives_nodes.2x2): "
        "busbw 300 GB/s at 1 GiB; = 60.0% of the expected 500 GB/s"
    ) in out
