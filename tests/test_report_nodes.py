"""Nodes in the summary and the report: per-node statistics, --compare-nodes, the
scaling efficiency of node-progression groups and their weights."""

import json
import math
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import cli

from milarun.analysis.summary import summarize, summarize_dir
from milarun.formats.record import new_result
from milarun.formats.store import write_result
from milarun.formats.summary import normalize_summary, read_summary
from milarun.report import build_report, render_text

FIX = Path(__file__).parent / "fixtures"


def record(
    name, rate, *, device="0", devices=(0,), partition="per-gpu", run=0, hostname="node1", **fields
):
    """A successful record whose steady-state rate is exactly ``rate`` items/s
    (20 one-second samples, the first a warm-up); ``fields`` are top-level extras."""
    rec = new_result(
        name, f"{run}.{device}", device=device, devices=list(devices), run=run, plan_type=partition
    )
    rec["success"] = True
    rec["timings"]["program"] = {"start": 1.0e9, "end": 1.0e9 + 21, "duration": 21.0}
    rec["timings"]["train"]["samples"] = [
        {"start": float(i), "end": float(i + 1), "count": rate, "rate": rate, "warmup": i == 0}
        for i in range(20)
    ]
    rec["host"] = {
        "hostname": hostname,
        "cpu_model": "EPYC",
        "cpu_count": 64,
        "torch": "2.13.0",
        "cuda": None,
        "gpus": [],
    }
    rec.update(fields)
    return rec


def per_gpu(name, node, index, rate, run=0):
    """A per-gpu record of device ``index`` on ``node`` of a multi-node cluster."""
    return record(
        name,
        rate,
        device=f"{node}.{index}",
        devices=[index],
        run=run,
        hostname=node,
        node=node,
        nodes=[node],
        node_count=1,
        gpus_per_node=1,
    )


def progression(name, n, g, rate):
    """A node-progression record of ``n`` nodes × ``g`` GPUs per node (whole-job rate)."""
    nodes = [f"node{i + 1}" for i in range(n)]
    return record(
        name,
        rate,
        device=f"{n}x{g}",
        devices=list(range(g)),
        partition="node-progression",
        nodes=nodes,
        node_count=n,
        gpus_per_node=g,
    )


#: mean rate of each node: node3 is 10% below the median in conv, 2% in mm
CONV = {"node1": 100.0, "node2": 100.0, "node3": 90.0}
MM = {"node1": 50.0, "node2": 50.0, "node3": 49.0}
#: the handmade scaling study: 1x1, 1x2, 2x1, 2x2 → 100%, 95%, 90%, 85%
DDP = {(1, 1): 100.0, (1, 2): 190.0, (2, 1): 180.0, (2, 2): 340.0}


def cluster_records(skip=()):
    recs = []
    for name, rates in (("c.conv", CONV), ("c.mm", MM)):
        for node, rate in rates.items():
            # two devices per node, each a little off the node mean
            recs += [per_gpu(name, node, 0, rate + 1), per_gpu(name, node, 1, rate - 1)]
    recs += [progression("c.ddp", n, g, rate) for (n, g), rate in DDP.items() if (n, g) not in skip]
    return recs


@pytest.fixture
def cluster(tmp_path):
    """A results folder as written by milarun's writer: per-gpu tests on three nodes
    and a node-progression study."""
    out = tmp_path / "results"
    out.mkdir()
    for rec in cluster_records():
        write_result(rec, out)
    return out


# --- summary ---------------------------------------------------------------------------


def test_summary_has_per_node_statistics(cluster):
    summary, records = summarize_dir(cluster)
    assert len(records) == 16
    conv = summary["tests"]["c.conv"]
    assert list(conv["pernode"]) == ["node1", "node2", "node3"]
    assert conv["pernode"]["node3"] == {
        "n": 2,
        "min": 89.0,
        "max": 91.0,
        "mean": 90.0,
        "std": pytest.approx(math.sqrt(2)),
    }
    # per-gpu keys carry the node, so they stay distinct across nodes
    assert sorted(conv["pergpu"]) == [f"node{i}.{d}" for i in (1, 2, 3) for d in (0, 1)]
    assert "node_count" not in conv and "gpus_per_node" not in conv
    # node-progression groups: their shape; a record spanning nodes is no node's rate
    for (n, g), rate in DDP.items():
        t = summary["tests"][f"c.ddp.{n}x{g}"]
        assert (t["node_count"], t["gpus_per_node"]) == (n, g)
        assert t["train"]["mean"] == pytest.approx(rate)
        assert t["pernode"] == ({"node1": pytest.approx(t["train"])} if n == 1 else {})


def test_pernode_falls_back_to_the_hostname():
    recs = [record("s.t", 10.0, device=str(d), devices=[d], hostname="gpu-box") for d in range(2)]
    recs.append(record("s.t", 10.0, device="2", devices=[2], hostname="bad name/"))
    t = summarize(recs)["tests"]["s.t"]
    assert list(t["pernode"]) == ["gpu-box"] and t["pernode"]["gpu-box"]["n"] == 2
    assert t["train"]["n"] == 3  # an unsafe host name leaves pernode, not the test


def test_pernode_orders_node_names_naturally():
    recs = [per_gpu("s.t", node, 0, 10.0) for node in ("node10", "node2", "node1")]
    assert list(summarize(recs)["tests"]["s.t"]["pernode"]) == ["node1", "node2", "node10"]


def test_summary_with_nodes_round_trips(cluster, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert cli(["summary", cluster, "-o", out], capsys)[0] == 0
    back = read_summary(out)
    direct = summarize_dir(cluster)[0]
    assert back["tests"]["c.conv"]["pernode"] == direct["tests"]["c.conv"]["pernode"]
    assert back["tests"]["c.ddp.2x2"]["node_count"] == 2
    assert back["tests"]["c.ddp.2x2"]["partition"] == "node-progression"


def test_old_summary_without_nodes_still_reads():
    old = json.loads((FIX / "expected" / "summary.json").read_text())
    for t in old["tests"].values():
        del t["pernode"], t["pernode_failures"]
        for f in t["failed"]:
            del f["node"]
    s = normalize_summary(old)
    assert all(
        t["pernode"] == {} and t["pernode_failures"] == {} and t["node_count"] is None
        for t in s["tests"].values()
    )
    assert s["tests"]["standard.vae"]["failed"][0]["node"] is None
    rep = build_report(s, compare_nodes=True)
    assert rep.node_compare["tests"] == [] and rep.scaling == []


# --- milarun report --compare-nodes ----------------------------------------------------


def test_compare_nodes_flags_a_node_10_percent_below_not_2(cluster):
    rep = build_report(summarize_dir(cluster)[0], compare_nodes=True)
    cmp = rep.node_compare
    assert cmp["threshold"] == 5.0
    by_test = {t["test"]: t for t in cmp["tests"]}
    assert sorted(by_test) == ["c.conv", "c.mm"]  # node-progression: one node per group
    conv = {row["node"]: row for row in by_test["c.conv"]["nodes"]}
    # each node against the median of the OTHER nodes' means
    assert conv["node3"]["ref"] == pytest.approx(100.0)
    assert conv["node3"]["ratio"] == pytest.approx(0.9) and conv["node3"]["slow"]
    assert conv["node1"]["ref"] == pytest.approx(95.0)  # median(100, 90)
    assert conv["node1"]["ratio"] == pytest.approx(100 / 95)
    assert not conv["node1"]["slow"] and not conv["node2"]["slow"]
    mm = {row["node"]: row for row in by_test["c.mm"]["nodes"]}
    assert mm["node3"]["ratio"] == pytest.approx(0.98) and not mm["node3"]["slow"]
    assert cmp["slow"] == {"node3": [("c.conv", pytest.approx(0.9))]}
    assert cmp["failed"] == {}
    assert all(row["fail"] == 0 and not row["failed"] for t in cmp["tests"] for row in t["nodes"])


def test_compare_nodes_text(cluster, capsys):
    code, out, err = cli(["report", cluster, "--compare-nodes"], capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("node comparison:"))
    assert lines[start] == (
        "node comparison: mean steady-state throughput (items/s) of each node / ref = median "
        "of the OTHER nodes' means (2 nodes: the peer's mean); SLOW: more than 5% below ref; "
        "FAILED: failures, no successful result"
    )
    table = lines[start + 1 : start + 9]  # header, index names, 6 rows
    assert table[0].split() == ["n", "fail", "mean", "ref", "ratio", "flag"]
    assert table[1].split() == ["test", "node"]
    assert table[2].split() == ["c.conv", "node1", "2", "0", "100.00", "95.00", "1.053"]
    assert table[4].split() == ["node3", "2", "0", "90.00", "100.00", "0.900", "SLOW"]
    assert table[7].split() == ["node3", "2", "0", "49.00", "50.00", "0.980"]
    assert lines[start + 9] == (
        "verdict: slow nodes (more than 5% below the median of the other "
        "nodes): node3 (c.conv 0.900)"
    )
    assert not lines[start + 10].startswith("verdict")


def failed(rec, reason="error"):
    """``rec`` turned into a FAIL record (its samples kept, as the launcher keeps them)."""
    rec["success"] = False
    rec["error"] = {"reason": reason, "message": "boom"}
    return rec


def test_summary_keys_failures_by_node():
    recs = [per_gpu("s.t", "node1", 0, 100.0), failed(per_gpu("s.t", "node1", 1, 100.0))]
    recs += [failed(per_gpu("s.t", "node2", i, 100.0, run=r)) for i in (0, 1) for r in (0, 1)]
    recs.append(failed(per_gpu("s.t", "node3", 0, 100.0), reason="interrupted"))
    # a record spanning nodes measured the job: it is no node's failure
    recs.append(failed(record("s.t", 1.0, device="2x1", nodes=["node1", "node2"], node="node1")))
    t = summarize(recs)["tests"]["s.t"]
    assert (t["n"], t["failures"], t["interrupted"]) == (7, 6, 1)
    assert list(t["pernode"]) == ["node1"]  # node2: every run failed
    assert t["pernode_failures"] == {"node1": 1, "node2": 4}
    nodes = sorted((f["device"], f["node"]) for f in t["failed"])
    assert nodes == [
        ("2x1", None),
        ("node1.1", "node1"),
        ("node2.0", "node2"),
        ("node2.0", "node2"),
        ("node2.1", "node2"),
        ("node2.1", "node2"),
    ]


def broken_cluster(tmp_path):
    """The cluster plus node4, whose every c.conv run failed, and one failed c.mm run
    on node2 (beside its successful ones)."""
    out = tmp_path / "broken"
    out.mkdir()
    recs = cluster_records()
    recs += [failed(per_gpu("c.conv", "node4", i, 100.0), reason="oom-killed") for i in (0, 1)]
    recs.append(failed(per_gpu("c.mm", "node2", 0, 50.0, run=1)))
    for rec in recs:
        write_result(rec, out)
    return out


def test_a_node_whose_runs_all_failed_is_flagged_failed(tmp_path):
    summary = summarize_dir(broken_cluster(tmp_path))[0]
    assert "node4" not in summary["tests"]["c.conv"]["pernode"]
    assert summary["tests"]["c.conv"]["pernode_failures"] == {"node4": 2}
    cmp = build_report(summary, compare_nodes=True).node_compare
    by_test = {t["test"]: {row["node"]: row for row in t["nodes"]} for t in cmp["tests"]}
    node4 = by_test["c.conv"]["node4"]
    assert (node4["n"], node4["fail"], node4["mean"], node4["ratio"]) == (0, 2, None, None)
    assert node4["failed"] and not node4["slow"]
    assert node4["ref"] == pytest.approx(100.0)  # median(100, 100, 90)
    # a node without a mean is left out of the others' reference
    assert by_test["c.conv"]["node1"]["ref"] == pytest.approx(95.0)
    assert by_test["c.conv"]["node3"]["slow"]
    # a failure beside successful runs is counted, not FAILED
    node2 = by_test["c.mm"]["node2"]
    assert (node2["n"], node2["fail"], node2["failed"]) == (2, 1, False)
    assert cmp["failed"] == {"node4": [("c.conv", 2)]}
    assert cmp["slow"] == {"node3": [("c.conv", pytest.approx(0.9))]}
    assert cmp["nodes"] == ["node1", "node2", "node3", "node4"]


def test_failed_node_in_text(tmp_path, capsys):
    code, out, err = cli(["report", broken_cluster(tmp_path), "--compare-nodes"], capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("node comparison:"))
    rows = [line.split() for line in lines[start + 3 : start + 10]]
    assert rows[3] == ["node4", "0", "2", "-", "100.00", "-", "FAILED"]
    assert rows[5] == ["node2", "2", "1", "50.00", "49.50", "1.010"]
    assert lines[start + 10 : start + 12] == [
        "verdict: slow nodes (more than 5% below the median of the other nodes): "
        "node3 (c.conv 0.900)",
        "verdict: failed nodes (failures, no successful result): node4 (c.conv: 2 failed)",
    ]


def test_two_nodes_one_all_failed_is_compared():
    # before pernode_failures this test had one node in pernode: nothing to compare
    recs = [per_gpu("s.t", "node1", 0, 100.0), failed(per_gpu("s.t", "node2", 0, 100.0))]
    cmp = build_report(summarize(recs), compare_nodes=True).node_compare
    (t,) = cmp["tests"]
    node1, node2 = t["nodes"]
    assert (node1["node"], node1["ref"], node1["ratio"], node1["slow"]) == (
        "node1",
        None,
        None,
        False,
    )
    assert (node2["node"], node2["ref"], node2["failed"]) == ("node2", 100.0, True)
    assert cmp["failed"] == {"node2": [("s.t", 1)]} and cmp["slow"] == {}


def test_two_nodes_each_is_compared_with_its_peer():
    recs = [per_gpu("s.t", "node1", 0, 100.0), per_gpu("s.t", "node2", 0, 91.0)]
    cmp = build_report(summarize(recs), compare_nodes=True).node_compare
    node1, node2 = cmp["tests"][0]["nodes"]
    # against the median of both (95.5) node2 would be 0.953: not flagged at 5%
    assert 91.0 / ((100.0 + 91.0) / 2) > 0.95
    assert node2["ref"] == 100.0 and node2["ratio"] == pytest.approx(0.91) and node2["slow"]
    assert node1["ref"] == 91.0 and node1["ratio"] == pytest.approx(100 / 91)
    assert not node1["slow"]
    assert cmp["slow"] == {"node2": [("s.t", pytest.approx(0.91))]}
    # 4% below the peer is within the default 5%
    recs = [per_gpu("s.t", "node1", 0, 100.0), per_gpu("s.t", "node2", 0, 96.0)]
    assert build_report(summarize(recs), compare_nodes=True).node_compare["slow"] == {}


@pytest.mark.parametrize(
    "threshold,slow,verdict",
    [
        (
            "1",
            {"node3": ["c.conv", "c.mm"]},
            "verdict: slow nodes (more than 1% below the median of "
            "the other nodes): node3 (c.conv 0.900, c.mm 0.980)",
        ),
        (
            "15",
            {},
            "verdict: no slow node (none more than 15% below the median of the other "
            "nodes), no failed node",
        ),
        ("10", {}, None),  # exactly 10% below is not more than 10% below
    ],
)
def test_node_threshold_option(cluster, capsys, threshold, slow, verdict):
    # --node-threshold alone turns the comparison on
    code, out, _ = cli(["report", cluster, "--node-threshold", threshold], capsys)
    assert code == 0
    rep = build_report(
        summarize_dir(cluster)[0], compare_nodes=True, node_threshold=float(threshold)
    )
    assert {n: [t for t, _ in v] for n, v in rep.node_compare["slow"].items()} == slow
    if verdict:
        assert verdict in out.splitlines()
    flagged = [line.split()[-7] for line in out.splitlines() if line.endswith(" SLOW")]
    assert flagged == ["node3"] * sum(map(len, slow.values()))


def test_nothing_to_compare_is_one_line(capsys):
    code, out, err = cli(["report", FIX / "results", "--compare-nodes"], capsys)
    assert code == 0
    found = [line for line in out.splitlines() if line.startswith("node comparison")]
    assert found == [
        "node comparison: nothing to compare: no test has results from 2 or more "
        "nodes (nodes seen: fixture-host)"
    ]
    assert "SLOW" not in out and "verdict:" not in out


def test_without_the_option_no_node_table(cluster, capsys):
    code, out, _ = cli(["report", cluster], capsys)
    assert code == 0 and "node comparison" not in out


@pytest.mark.parametrize(
    "value,shown", [("-5", "-5.0"), ("101", "101.0"), ("nan", "nan"), ("=-0.5", "-0.5")]
)
def test_bad_node_threshold_is_one_line(cluster, capsys, value, shown):
    arg = f"--node-threshold{value}" if value.startswith("=") else "--node-threshold"
    args = ["report", cluster, arg] + ([] if value.startswith("=") else [value])
    code, out, err = cli(args, capsys)
    assert (code, out) == (2, "")
    assert err == (
        f"milarun: error: --node-threshold must be a percentage from 0 to 100, not {shown}\n"
    )


# --- scaling efficiency ----------------------------------------------------------------


def test_scaling_efficiency_by_hand(cluster):
    rep = build_report(summarize_dir(cluster)[0])
    (tab,) = rep.scaling
    assert tab["test"] == "c.ddp" and tab["nodes"] == [1, 2] and tab["gpus"] == [1, 2]
    assert tab["base"] == pytest.approx(100.0)
    eff = {k: c["efficiency"] for k, c in tab["cells"].items()}
    # efficiency(n, g) = T(n, g) / (n * g * T(1, 1))
    assert eff == {
        (1, 1): pytest.approx(1.0),
        (1, 2): pytest.approx(0.95),
        (2, 1): pytest.approx(0.90),
        (2, 2): pytest.approx(0.85),
    }
    assert tab["cells"][(2, 2)]["throughput"] == pytest.approx(340.0)


def test_scaling_table_in_text(cluster, capsys):
    code, out, _ = cli(["report", cluster], capsys)
    assert code == 0
    lines = out.splitlines()
    i = lines.index(
        "scaling of c.ddp: mean steady-state throughput in items/s (scaling efficiency)"
    )
    assert lines[i + 1].split() == ["1", "GPU/node", "2", "GPU/node"]
    assert lines[i + 2].split() == ["nodes"]
    assert lines[i + 3].split() == ["1", "node(s)", "100.00", "(100.0%)", "190.00", "(95.0%)"]
    assert lines[i + 4].split() == ["2", "node(s)", "180.00", "(90.0%)", "340.00", "(85.0%)"]
    assert lines[i + 5] == (
        "efficiency = throughput / (nodes x GPUs per node x 100.00 items/s, the 1x1 throughput)"
    )


def test_scaling_without_1x1_invents_no_baseline(tmp_path):
    recs = [r for r in cluster_records(skip=[(1, 1)]) if r["name"] == "c.ddp"]
    rep = build_report(summarize(recs))
    (tab,) = rep.scaling
    assert tab["base"] is None
    assert all(c["efficiency"] is None for c in tab["cells"].values())
    text = render_text(rep)
    assert (
        "no 1x1 result for c.ddp: there is no per-GPU baseline, so no efficiency is shown" in text
    )
    assert "%)" not in text.split("scaling of c.ddp")[1]
    assert "190.00" in text and "-" in text.split("1 node(s)")[1].split("\n")[0]


def test_failed_1x1_is_no_baseline():
    recs = [progression("c.ddp", n, g, rate) for (n, g), rate in DDP.items()]
    recs[0]["success"] = False
    recs[0]["error"] = {"reason": "error", "message": "boom"}
    (tab,) = build_report(summarize(recs)).scaling
    assert tab["base"] is None and tab["cells"][(2, 2)]["efficiency"] is None


# --- weights ---------------------------------------------------------------------------


def test_node_progression_groups_take_the_suite_job_weight(cluster, tmp_path):
    w = {"c.ddp": 2.0, "c.conv": 1.0}
    rep = build_report(summarize_dir(cluster)[0], weights=w)
    weights = {r["test"]: r["weight"] for r in rep.rows}
    assert {g: weights[g] for g in weights if g.startswith("c.ddp.")} == {
        "c.ddp.1x1": 2.0,
        "c.ddp.1x2": 2.0,
        "c.ddp.2x1": 2.0,
        "c.ddp.2x2": 2.0,
    }
    mm = next(r for r in rep.rows if r["test"] == "c.mm")
    assert not mm["weight"] and not mm["counted"] and rep.missing == []
    # the score: weighted geometric mean over the weighted groups (one result each: std 0)
    conv = next(r for r in rep.rows if r["test"] == "c.conv")
    adj = {"c.conv": conv["perf_adj"], **{f"c.ddp.{n}x{g}": v for (n, g), v in DDP.items()}}
    ws = {"c.conv": 1.0, **{f"c.ddp.{n}x{g}": 2.0 for n, g in DDP}}
    expected = math.exp(sum(ws[k] * math.log(adj[k]) for k in adj) / sum(ws.values()))
    assert rep.score == pytest.approx(expected)
    # a group's own entry wins over the suite.job one
    rep = build_report(summarize_dir(cluster)[0], weights={**w, "c.ddp.2x2": 0.5})
    assert next(r for r in rep.rows if r["test"] == "c.ddp.2x2")["weight"] == 0.5


# --- HTML ------------------------------------------------------------------------------


class Ids(HTMLParser):
    """Text of elements by id, and the ids of SVG-holding figures."""

    def __init__(self):
        super().__init__()
        self.ids, self._stack, self.figures = {}, [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "figure":
            self.figures.append(attrs.get("class"))
        self._stack.append((tag, attrs.get("id")))

    def handle_endtag(self, tag):
        while self._stack:
            if self._stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        for _, ident in self._stack:
            if ident:
                self.ids[ident] = self.ids.get(ident, "") + " " + data


def test_html_has_the_node_and_scaling_sections(cluster, tmp_path, capsys):
    page = tmp_path / "r.html"
    assert cli(["report", cluster, "--compare-nodes", "--html", page], capsys)[0] == 0
    text = page.read_text()
    scan = Ids()
    scan.feed(text)
    cells = scan.ids["node-compare"].split()
    assert "SLOW" in cells and cells.count("SLOW") == 1
    assert "node3 (c.conv 0.900)" in scan.ids["node-verdict"]
    scaling = scan.ids["scaling-c.ddp"].split()
    assert ["340.00", "(85.0%)"] == scaling[scaling.index("340.00") : scaling.index("340.00") + 2]
    assert "100.00 (100.0%)" in scan.ids["scaling-c.ddp"]
    assert "scaling-plot" in scan.figures
    # the plot: one line per GPUs-per-node value and the ideal line, labelled by numbers
    plot = text.split('class="scaling-plot"')[1].split("</figure>")[0]
    assert "<svg" in plot and "1 GPU/node" in plot and "2 GPU/node" in plot
    assert "ideal: n × g × 1x1" in plot
    assert "<script" not in text


def test_html_shows_failed_nodes(tmp_path, capsys):
    page = tmp_path / "r.html"
    args = ["report", broken_cluster(tmp_path), "--compare-nodes", "--html", page]
    assert cli(args, capsys)[0] == 0
    scan = Ids()
    scan.feed(page.read_text())
    cells = scan.ids["node-compare"].split()
    assert cells.count("FAILED") == 1 and cells.count("SLOW") == 1
    assert "node4 (c.conv: 2 failed)" in scan.ids["node-verdict"]
    assert "node3 (c.conv 0.900)" in scan.ids["node-verdict"]
    assert "median of the OTHER nodes' means" in scan.ids["nodes-header"]


def test_html_nothing_to_compare(tmp_path, capsys):
    page = tmp_path / "r.html"
    assert cli(["report", FIX / "results", "--compare-nodes", "--html", page], capsys)[0] == 0
    scan = Ids()
    scan.feed(page.read_text())
    assert scan.ids["nodes-empty"].strip().startswith("node comparison: nothing to compare")
    assert "node-compare" not in scan.ids and "scaling" not in scan.ids
