"""The fleet view (docs/acceptance.md, The fleet view): each node against the fleet's median
and MAD, the nodes to send back, in the report and in ``milarun verify``'s ``fleet`` rule.
Synthetic summaries and records only."""

import json
import math
import statistics

import pytest
from test_report_nodes import cli, failed, per_gpu

from milarun.analysis.fleet import MAD_SCALE, fleet_nodes, fleet_view, health_counts
from milarun.analysis.summary import summarize
from milarun.errors import MilarunError
from milarun.formats.rules import RulesError, read_rules
from milarun.formats.store import write_result
from milarun.report import make_report
from milarun.report.verify import text_lines
from milarun.verify.check import Bundle, check_performance
from milarun.verify.verdict import Verdict

#: 16 nodes around 100 items/s, a spread of about 0.5 %; node7 is 8 % slow.
SPREAD = [-0.6, -0.4, -0.3, -0.2, -0.1, 0.0, 0.1, 0.15, 0.2, 0.3, 0.35, 0.4, 0.5, 0.55, 0.6]


def fleet16(slow=92.0):
    """``{node: mean}`` of 16 nodes: 15 around 100 items/s and node7 at ``slow``."""
    means = {}
    spread = iter(SPREAD)
    for i in range(1, 17):
        means[f"node{i}"] = slow if i == 7 else 100.0 + next(spread)
    return means


def entry(means, failures=None, flags=None):
    """A normalized summary's test entry with these node means (items/s)."""
    t = {"pernode": {n: {"n": 2, "mean": m} for n, m in means.items()}}
    t["pernode_failures"] = failures or {}
    if flags:
        t["validation_flags"] = flags
    return t


def health_flag(node, check="gpu-health-error"):
    return {"check": check, "node": node, "device": f"{node}.0", "gpu": 0, "message": "x"}


# --- the figures -------------------------------------------------------------------------------


def test_sixteen_nodes_one_eight_percent_slow_node_is_outside_alone():
    means = fleet16()
    view = fleet_view({"s.bert": entry(means)})
    (t,) = view["tests"]
    values = list(means.values())
    med = statistics.median(values)
    mad = statistics.median(abs(x - med) for x in values)
    assert t["judged"] and t["n"] == 16 and t["reason"] is None
    assert (t["median"], t["mad"]) == (pytest.approx(med), pytest.approx(mad))
    assert t["scaled_mad"] == pytest.approx(1.4826 * mad) and MAD_SCALE == 1.4826
    rows = {r["node"]: r for r in t["nodes"]}
    assert rows["node7"]["z"] == pytest.approx((92.0 - med) / (1.4826 * mad))
    assert rows["node7"]["relative"] == pytest.approx(92.0 / med - 1)
    assert [r["node"] for r in t["nodes"] if r["outside"]] == ["node7"]
    assert view["outside"] == {
        "node7": [("s.bert", 92.0, pytest.approx(med), pytest.approx(rows["node7"]["z"]))]
    }
    (back,) = view["send_back"]
    assert back["node"] == "node7"
    assert back["reasons"][0].startswith(
        "outside in s.bert: 92 items/s, -8.1% vs the median 100.1, z -18"
    )
    # natural order: node2 before node10
    assert [r["node"] for r in t["nodes"]][:3] == ["node1", "node2", "node3"]
    assert view["nodes"][-1] == "node16" and view["judged"] == 1


def test_a_fast_node_is_never_outside():
    means = fleet16(slow=100.0)
    means["node3"] = 110.0
    view = fleet_view({"s.bert": entry(means)})
    assert view["outside"] == {} and view["send_back"] == []
    assert {r["node"]: r["z"] for r in view["tests"][0]["nodes"]}["node3"] > 3


def test_a_uniform_fleet_with_zero_mad_flags_nothing_below_the_floor():
    means = {f"node{i}": 100.0 for i in range(1, 17)}
    means["node5"] = 99.9  # 0.1 % below: an infinite z, but not 2 % below
    view = fleet_view({"s.t": entry(means)})
    (t,) = view["tests"]
    assert t["mad"] == 0 and t["scaled_mad"] == 0
    row = {r["node"]: r for r in t["nodes"]}["node5"]
    assert row["z"] == -math.inf and not row["outside"]
    assert view["send_back"] == []
    # 3 % below with a MAD of 0: the floor alone decides
    means["node5"] = 97.0
    assert list(fleet_view({"s.t": entry(means)})["outside"]) == ["node5"]


def test_exactly_the_floor_below_is_not_outside():
    means = {"node1": 50.0, "node2": 50.0, "node3": 49.0}  # 49 = 50 less exactly 2 %
    assert fleet_view({"s.t": entry(means)})["outside"] == {}
    assert fleet_view({"s.t": entry(means)}, min_relative=0.01)["outside"] == {
        "node3": [("s.t", 49.0, 50.0, -math.inf)]
    }


def test_two_nodes_are_not_judged_and_say_so():
    view = fleet_view({"s.t": entry({"node1": 100.0, "node2": 50.0})})
    (t,) = view["tests"]
    assert not t["judged"] and t["median"] is None
    assert t["reason"] == (
        "not judged: 2 node(s) with a figure, fewer than 3 (with fewer there is no robust spread)"
    )
    assert all(r["z"] is None and not r["outside"] for r in t["nodes"])
    assert view["judged"] == 0 and view["send_back"] == []


def test_health_errors_are_counted_per_node_and_send_it_back():
    flags = [
        health_flag("node2"),
        health_flag("node2"),
        health_flag("node3", "gpu-health-warning"),
        health_flag(None),  # a record that spanned several nodes: no node's
        {"check": "gpu-load-low", "node": "node1", "message": "x"},  # not a health flag
    ]
    tests = {
        "s.a": entry({"node1": 100.0, "node2": 100.0, "node3": 100.0}, flags=flags),
        "s.b": entry({"node2": 10.0}, flags=[health_flag("node2")]),
    }
    assert health_counts(tests["s.a"]) == {
        "node2": {"errors": 2, "warnings": 0},
        "node3": {"errors": 0, "warnings": 1},
    }
    view = fleet_view(tests)
    assert view["health"] == {
        "node2": {"errors": 3, "warnings": 0},
        "node3": {"errors": 0, "warnings": 1},
    }
    rows = {r["node"]: r for r in view["tests"][0]["nodes"]}
    assert (rows["node2"]["errors"], rows["node3"]["warnings"]) == (2, 1)
    # a warning alone sends nothing back
    assert view["send_back"] == [{"node": "node2", "reasons": ["3 GPU health error(s)"]}]


def test_a_node_whose_every_run_failed_is_sent_back():
    t = entry(fleet16(slow=100.0), failures={"node17": 2, "node3": 1})
    view = fleet_view({"s.t": t})
    rows = {r["node"]: r for r in view["tests"][0]["nodes"]}
    assert rows["node17"]["failed"] and rows["node17"]["figure"] is None
    assert rows["node3"]["fail"] == 1 and not rows["node3"]["failed"]  # beside its successes
    assert view["failed"] == {"node17": [("s.t", 2)]}
    assert view["send_back"] == [{"node": "node17", "reasons": ["every run of s.t failed (2)"]}]
    assert fleet_nodes({"s.t": t})[-1] == "node17"


def test_reasons_of_one_node_are_gathered_in_order():
    means = fleet16()
    tests = {
        "s.a": entry(means, flags=[health_flag("node7")]),
        "s.b": entry(means),
        "s.c": entry({"node1": 1.0, "node2": 1.0}, failures={"node7": 3}),
    }
    (back,) = fleet_view(tests)["send_back"]
    assert back["node"] == "node7"
    assert [r.split(":")[0] for r in back["reasons"]] == [
        "outside in s.a",
        "outside in s.b",
        "1 GPU health error(s)",
        "every run of s.c failed (3)",
    ]


@pytest.mark.parametrize(
    "bad,note",
    [
        ({"n": 2}, "s.t node9: no mean: left out of the fleet"),
        ({"mean": None}, "s.t node9: no mean: left out of the fleet"),
        ({"mean": math.nan}, "s.t node9: mean is not a finite number >= 0 (nan): left out"),
        ({"mean": -5.0}, "s.t node9: mean is not a finite number >= 0 (-5.0): left out"),
        ({"mean": math.inf}, "s.t node9: mean is not a finite number >= 0 (inf): left out"),
        ({"mean": "fast"}, "s.t node9: mean is not a number (str): left out"),
        ({"mean": True}, "s.t node9: mean is not a number (bool): left out"),
        ("x", "s.t node9: no mean: left out of the fleet"),
    ],
)
def test_a_bad_figure_is_one_line_never_a_crash(bad, note):
    t = entry(fleet16())
    t["pernode"]["node9"] = bad
    view = fleet_view({"s.t": t})
    assert len(view["notes"]) == 1 and view["notes"][0].startswith(note)
    (row,) = [r for r in view["tests"][0]["nodes"] if r["node"] == "node9"]
    assert row["figure"] is None and not row["failed"] and not row["outside"]
    assert view["tests"][0]["n"] == 15 and list(view["outside"]) == ["node7"]


def test_hostile_tests_never_crash():
    tests = {
        "s.a": "not a test",
        "s.b": {"pernode": [1, 2], "pernode_failures": {"node1": "x", "node2": True}},
        "s.c": {"pernode": {"node1": {"mean": 1.0}}, "validation_flags": "x"},
        "s.d": entry({"node1": 1.0, "node2": 1.0, "node3": 1.0}),
    }
    view = fleet_view(tests)
    assert view["notes"] == ["s.a: not an object: left out of the fleet"]
    assert [t["test"] for t in view["tests"]] == ["s.b", "s.c", "s.d"]
    assert view["send_back"] == []
    assert fleet_view(["not", "a", "dict"])["notes"] == [
        "the summary's tests are not an object (list)"
    ]
    assert fleet_view({})["tests"] == [] and fleet_view({})["send_back"] == []


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"k": 0}, "fleet k must be"),
        ({"k": math.nan}, "fleet k must be"),
        ({"k": "3"}, "fleet k must be"),
        ({"min_relative": -0.1}, "fleet min_relative must be"),
        ({"min_relative": 2}, "fleet min_relative must be"),
        ({"min_nodes": 2}, "fleet min_nodes must be"),
        ({"min_nodes": 3.0}, "fleet min_nodes must be"),
    ],
)
def test_bad_parameters_are_one_error(kwargs, match):
    with pytest.raises(MilarunError, match=match):
        fleet_view({}, **kwargs)


# --- the report --------------------------------------------------------------------------------


def fleet_folder(tmp_path, nodes=16, slow=92.0):
    """A results folder of ``nodes`` nodes × 2 GPUs in s.bert (node7 at ``slow`` when there
    are 7 nodes or more); node3's GPU 0 has a health error; s.conv on the first 3 nodes,
    node2's runs all failed."""
    out = tmp_path / "results"
    out.mkdir()
    spread = iter(SPREAD + [0.0] * 32)
    recs = []
    for i in range(1, nodes + 1):
        node = f"node{i}"
        rate = slow if i == 7 else 100.0 + next(spread)
        recs += [per_gpu("s.bert", node, 0, rate + 1), per_gpu("s.bert", node, 1, rate - 1)]
    health = recs[4] if nodes >= 3 else {}
    health["health"] = {
        "available": True,
        "reason": None,
        "source": "nvml",
        "gpus": [],
        "findings": [
            {
                "gpu": 0,
                "counter": "xid",
                "severity": "error",
                "before": 0,
                "after": 1,
                "message": "XID 79 (fell off the bus)",
            }
        ],
    }
    for node in ("node1", "node2", "node3")[:nodes]:
        rec = per_gpu("s.conv", node, 0, 50.0)
        recs.append(failed(rec) if node == "node2" else rec)
    for rec in recs:
        write_result(rec, out)
    return out


def test_the_report_shows_the_fleet_and_the_nodes_to_send_back(tmp_path, capsys):
    folder = fleet_folder(tmp_path)
    code, out, err = cli(["report", folder], capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("fleet view: per test"))
    assert "1.4826 x MAD" in lines[start] and "OUTSIDE: z below -3" in lines[start]
    assert lines[start + 1] == (
        "s.bert: 16 nodes, median 100.12 items/s, MAD 0.30, 1.4826 x MAD 0.44 (0.44% of the median)"
    )
    assert lines[start + 2].split() == [
        "figure", "median", "vs", "median", "z", "fail", "health", "flag"
    ]  # fmt: skip
    rows = {ln.split()[0]: ln.split() for ln in lines[start + 4 : start + 20]}
    assert rows["node7"][1:3] == ["92.00", "100.12"] and rows["node7"][-1] == "OUTSIDE"
    assert rows["node7"][3:5] == ["-8.11%", "-18.27"]
    assert rows["node3"][-2:] == ["1E", "0W"] and rows["node16"][-2:] == ["+1.07", "0"]
    assert sum(1 for r in rows.values() if r[-1] == "OUTSIDE") == 1
    assert lines[start + 20].startswith("not judged (fewer than 3 nodes with a figure")
    assert lines[start + 20].endswith(": s.conv (2)")
    assert lines[start + 21] == "nodes to send back (3):"
    back = lines[start + 22 : start + 25]
    assert back[0] == "  node2: every run of s.conv failed (1)"
    assert back[1] == "  node3: 1 GPU health error(s)"
    assert back[2].startswith("  node7: outside in s.bert: 92 items/s, -8.1% vs the median")
    # the leave-one-out node comparison is still there with --compare-nodes
    code, out, _ = cli(["report", folder, "--compare-nodes"], capsys)
    assert "node comparison: mean steady-state" in out and "nodes to send back (3):" in out


def test_the_html_report_shows_the_fleet(tmp_path):
    html = tmp_path / "r.html"
    report, _ = make_report(fleet_folder(tmp_path), html=html)
    page = html.read_text()
    section = page[page.index('<section id="fleet">') :]
    section = section[: section.index("</section>")]
    assert section.count('<table class="fleet">') == 1  # s.conv: 2 nodes with a figure
    assert '<td class="failcell">OUTSIDE</td>' in section
    assert "node7: outside in s.bert" in section and 'id="fleet-send-back" class="warn"' in section
    assert report.fleet["judged"] == 1


def test_two_nodes_show_no_fleet_unless_asked(tmp_path, capsys):
    folder = fleet_folder(tmp_path, nodes=2)
    code, out, _ = cli(["report", folder], capsys)
    assert code == 0 and "fleet view" not in out
    code, out, _ = cli(["report", folder, "--compare-nodes"], capsys)
    assert "fleet view: not judged: fewer than 3 nodes with a figure in every test (most: 2;" in out


def test_a_hostile_summary_file_is_one_line_in_the_report(tmp_path, capsys):
    from milarun.analysis.summary import summarize_dir

    summary = summarize_dir(fleet_folder(tmp_path))[0]
    summary["tests"]["s.bert"]["pernode"]["node9"]["mean"] = None
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    code, out, err = cli(["report", path], capsys)
    assert code == 0, err
    assert "fleet view: s.bert node9: no mean: left out of the fleet" in out.splitlines()


# --- verify ------------------------------------------------------------------------------------


def judge(tmp_path, records, rule):
    """The performance clauses of ``{"fleet": rule}`` on ``records`` (as verify recomputes
    them), by name, and the verdict."""
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"fleet": rule}))
    b = Bundle(tmp_path)
    b.entries = []
    b.records = {f"r{i}.json": rec for i, rec in enumerate(records)}
    b.summary = summarize(list(b.records.items()))
    v = Verdict(bundle=str(tmp_path))
    check_performance(b, v, read_rules(rules))
    out = {}
    for c in v.clauses:
        out.setdefault(c.name, []).append(c)
    return out, v


def records_of(nodes, slow=None):
    spread = iter(SPREAD + [0.0] * 32)
    recs = []
    for i in range(1, nodes + 1):
        rate = slow if (slow and i == 7) else 100.0 + next(spread)
        recs.append(per_gpu("s.bert", f"node{i}", 0, rate))
    return recs


def test_the_verify_rule_passes_a_healthy_fleet(tmp_path):
    clauses, v = judge(tmp_path, records_of(16), {})
    (fleet,) = clauses["performance.fleet"]
    assert fleet.ok and fleet.detail.startswith("s.bert: 16 nodes, median ")
    assert "none outside (z below -3 and more than 2% below the median)" in fleet.detail
    (back,) = clauses["performance.fleet-send-back"]
    assert back.ok and back.detail.startswith("no node to send back of 16")


def test_the_verify_rule_fails_a_slow_node_and_lists_it(tmp_path):
    clauses, v = judge(tmp_path, records_of(16, slow=92.0), {"k": 3.0, "min_relative": 0.02})
    (fleet,) = clauses["performance.fleet"]
    assert not fleet.ok and "outside (z below -3" in fleet.detail
    assert "node7 92 items/s (-8.1%, z " in fleet.detail
    (back,) = clauses["performance.fleet-send-back"]
    assert not back.ok and back.detail.startswith("1 of 16 node(s) to send back: node7: outside")
    shown = "\n".join(text_lines(v))
    assert "FAIL  performance.fleet: s.bert: 16 nodes" in shown
    assert "FAIL  performance.fleet-send-back: 1 of 16 node(s) to send back: node7" in shown
    # a looser rule lets it through
    clauses, _ = judge(tmp_path, records_of(16, slow=92.0), {"min_relative": 0.1})
    assert clauses["performance.fleet"][0].ok


def test_the_verify_rule_says_not_judged_with_two_nodes(tmp_path):
    clauses, _ = judge(tmp_path, records_of(2), {"min_nodes": 3})
    (fleet,) = clauses["performance.fleet"]
    assert fleet.ok
    assert fleet.detail == "not judged: fewer than 3 nodes in every test (most: 2)"
    clauses, _ = judge(tmp_path, records_of(4), {"min_nodes": 5})
    assert clauses["performance.fleet"][0].detail.startswith("not judged: fewer than 5 nodes")


def test_the_verify_rule_sends_back_a_failed_node(tmp_path):
    recs = records_of(4) + [failed(per_gpu("s.bert", "node5", 0, 100.0))]
    clauses, _ = judge(tmp_path, recs, {})
    assert clauses["performance.fleet"][0].ok
    (back,) = clauses["performance.fleet-send-back"]
    assert not back.ok and "node5: every run of s.bert failed (1)" in back.detail


@pytest.mark.parametrize(
    "rule,key",
    [
        ({"k": 0}, "fleet.k"),
        ({"min_relative": 1.5}, "fleet.min_relative"),
        ({"min_nodes": 2}, "fleet.min_nodes"),
        ({"min_nodes": 3.5}, "fleet.min_nodes"),
        ({"median": True}, "fleet"),
        ([], "fleet"),
    ],
)
def test_a_bad_fleet_rule_is_one_line(tmp_path, rule, key):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"fleet": rule}))
    with pytest.raises(RulesError) as exc:
        read_rules(rules)
    message = str(exc.value)
    assert "\n" not in message and f": {key}" in message
