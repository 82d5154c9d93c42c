"""The report's server-scenario part (milarun/report/llm.py) and its score rule
(milarun/report/table.py: a server test scores its measured level's goodput)."""

import pytest
from conftest import recorded_level

from milarun.analysis.llm import server_figures
from milarun.formats.summary import normalize_summary
from milarun.measure import stats
from milarun.report import build_report, render_html, render_text
from milarun.report.llm import (
    capacity_text,
    consistency_text,
    interactivity_plot,
    llm_rows,
    server_latency_plot,
    targets_text,
)
from milarun.report.table import NO_GOODPUT, goodput_factor

TARGETS = {"name": "llama3.1-8b-server", "ttft_s": 2.0, "tpot_s": 0.1, "percentile": 99}


#: The measured level: 4 requests of 11 tokens, TTFT 0.5 s; two at TPOT 50 ms (good),
#: two at 200 ms (over the 100 ms target). Window 0..3 + 0.5 + 10 x 0.2 = 5.5 s: 44
#: output tokens (8 tok/s), 22 of good requests (4 tok/s: half).
HALF = [(0, 0.5, 0.05, 11), (1, 0.5, 0.05, 11), (2, 0.5, 0.2, 11), (3, 0.5, 0.2, 11)]
GOOD = [(0, 0.1, 0.01, 11), (0, 0.1, 0.01, 11)]
BAD = [(0, 3.0, 0.3, 11)]


def record(capacity_rate, measured=HALF, consistency=True):
    """One server's record: the measured rate-4 level, then a capacity search that passes
    at ``capacity_rate`` and fails at rate 8."""
    return {
        "success": True,
        "serving_load": {
            "scenario": "server",
            "targets": TARGETS,
            "levels": [
                recorded_level("rate", 4.0, measured),
                recorded_level("rate", float(capacity_rate), GOOD),
                recorded_level("rate", 8.0, BAD),
            ],
            "capacity": {
                "kind": "rate",
                "capacity": capacity_rate,
                "reason": "converged",
                "steps": [[capacity_rate, True], [8, False]],
                "levels": [1, 2],
            },
            "consistency": {"prompts": 2, "tokens": 16, "matching": 2, "passed": consistency},
        },
    }


def entry(name, rates, server=None):
    out = {
        "name": name,
        "group": name,
        "partition": "per-gpu",
        "device_count": 1,
        "n": len(rates),
        "failures": 0,
        "failure_reasons": {},
        "failed": [],
        "train": stats.describe(rates),
        "total": stats.describe([]),
        "pergpu": {"0": stats.describe(rates)},
    }
    if server is not None:
        out["server"] = server
    return out


def summary(*entries):
    out = normalize_summary(
        {"format": "milarun-summary", "version": 1, "tests": {e["group"]: e for e in entries}}
    )
    for e in entries:  # the summary's reader keeps the server figures
        assert out["tests"][e["group"]].get("server") == e.get("server")
    return out


def report_of(summary_):
    """The report as ``milarun report`` builds it (the LLM rows added after the score)."""
    report = build_report(summary_)
    report.llm = llm_rows(summary_["tests"])
    return report


@pytest.fixture
def server():
    return server_figures([record(6), record(7)])


def test_server_figures_are_as_computed_by_hand(server):
    measured = server["levels"][[lv["value"] for lv in server["levels"]].index(4.0)]
    assert server["measured"] == {"load": "rate", "value": 4.0}
    assert measured["output_tokens_per_s"] == pytest.approx(8.0)
    assert measured["goodput_tokens_per_s"] == pytest.approx(4.0)
    assert server["capacity"] == {"load": "rate", "value": 6.5, "records": 2}


def test_text_shows_targets_levels_capacity_and_consistency(server):
    text = render_text(report_of(summary(entry("s.llm_server", [8.0, 8.0], server))))
    assert (
        "server scenario s.llm_server: targets TTFT ≤ 2000 ms and TPOT ≤ 100 ms at p99, "
        "preset llama3.1-8b-server" in text
    )
    assert "capacity: 6.5 requests/s at the targets, median of 2 servers" in text
    assert "consistency: server tokens = in-process tokens: passed on 2 of 2 servers" in text
    assert "WARNING" not in text
    assert "score: the test's rate × 0.50 (the measured level's goodput tokens/s" in text
    row = next(line.split() for line in text.splitlines() if line.strip().startswith("rate*"))
    # load, value, requests, failed, TTFT p50/p99, ITL p50/p99, TPOT p50/p99, E2E p50,
    # req/s (4 / 5.5), output tok/s, tok/s per user (median of 20, 20, 5, 5), goodput
    # req/s (2 / 5.5), goodput tok/s, goodput %, SLO met
    assert row == [
        "rate*", "4", "8", "0", "500.0", "500.0", "50.0", "200.0", "50.0", "200.0",
        "1000.0", "0.73", "8", "12.5", "0.36", "4", "50", "no",
    ]  # fmt: skip
    good = next(cells for line in text.splitlines() if (cells := line.split())[:2] == ["rate", "6"])
    assert good[-1] == "yes" and good[-2] == "100"


def test_the_score_counts_goodput_tokens(server):
    plain = build_report(summary(entry("s.llm_server", [8.0, 8.0])))
    served = build_report(summary(entry("s.llm_server", [8.0, 8.0], server)))
    assert goodput_factor(summary(entry("s.t", [8.0], server))["tests"]["s.t"]) == 0.5
    assert plain.rows[0]["perf"] == 8.0
    assert served.rows[0]["perf"] == pytest.approx(4.0)
    assert served.score == pytest.approx(plain.score / 2)
    assert served.rows[0]["node_perf"] == pytest.approx(plain.rows[0]["node_perf"] / 2)
    assert served.rows[0]["sample"][1] == pytest.approx(4.0)


def test_no_good_request_is_a_zero_with_its_reason():
    bad = server_figures([record(6, measured=BAD)])
    report = report_of(summary(entry("s.llm_server", [8.0, 8.0], bad), entry("s.x", [3.0])))
    assert report.zero == ["s.llm_server"]
    assert report.zero_reasons["s.llm_server"] == NO_GOODPUT
    assert report.score == pytest.approx(3.0)
    assert NO_GOODPUT in render_text(report)


def test_tests_without_server_figures_score_as_before():
    t = summary(entry("s.conv", [5.0, 5.0]))["tests"]["s.conv"]
    assert goodput_factor(t) is None
    assert build_report(summary(entry("s.conv", [5.0, 5.0]))).rows[0]["perf"] == 5.0


def test_failed_consistency_and_malformed_levels_are_loud():
    broken = record(7)
    broken["serving_load"]["levels"][2]["requests"]["send_s"].append(1.0)  # lengths differ
    server = server_figures([record(6, consistency=False), broken])
    text = render_text(report_of(summary(entry("s.llm_server", [8.0], server))))
    assert "consistency: FAILED on 1 of 2 servers" in text
    assert "WARNING: 1 load level(s) with malformed request timings" in text


def test_words_for_missing_parts():
    assert targets_text(None).startswith("unknown")
    assert capacity_text(None).startswith("not searched")
    assert capacity_text({"load": "rate", "value": None, "records": 2}).startswith("none found")
    assert (
        capacity_text({"load": "concurrency", "value": 12, "records": 1})
        == "12 concurrent requests at the targets, median of 1 server"
    )
    assert consistency_text(None).startswith("not checked")


def test_plots_render(server):
    pytest.importorskip("matplotlib")
    from milarun.report.plots import Plotter

    row = llm_rows({"s.llm_server": entry("s.llm_server", [8.0], server)})[0]
    assert row["gpus"] == 1 and not row["has_llm"]
    plotter = Plotter()
    latency = server_latency_plot(plotter, row)
    curve = interactivity_plot(plotter, row)
    assert latency and "<svg" in latency and "per GPU" in latency
    assert curve and "<svg" in curve
    assert server_latency_plot(plotter, {**row, "server": {**server, "levels": []}}) is None


def test_html_has_the_server_part(server):
    pytest.importorskip("matplotlib")
    html = render_html(report_of(summary(entry("s.llm_server", [8.0, 8.0], server))))
    assert 'id="server-s.llm_server"' in html
    assert "6.5 requests/s at the targets" in html
    assert html.count("<svg") >= 2
    assert 'id="llm-table"' not in html  # no LLM figures (TFLOP/s): no LLM table
