"""Nodes in the summary and the report: per-node statistics, --compare-nodes, the
scaling efficiency of node-progression groups and their weights."""

import io
import json
import math
from html.parser import HTMLParser
from pathlib import Path

import pytest

from milarun.cli import main
from milarun.cli.report import run_report
from milarun.report import build_report, render_text
from milarun.results.schema import new_result
from milarun.results.store import write_result
from milarun.summary import normalize_summary, read_summary, summarize, summarize_dir

FIX = Path(__file__).parent / "fixtures"


def cli(args, capsys):
    """Run ``milarun ARGS``; return (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def record(name, rate, *, device="0", devices=(0,), partition="per-gpu", run=0,
           hostname="node1", **fields):
    """A successful record whose steady-state rate is exactly ``rate`` items/s
    (20 one-second samples, the first a warm-up); ``fields`` are top-level extras."""
    rec = new_result(name, f"{run}.{device}", device=device, devices=list(devices), run=run,
                     partition=partition)
    rec["success"] = True
    rec["timings"]["program"] = {"start": 1.0e9, "end": 1.0e9 + 21, "duration": 21.0}
    rec["timings"]["train"]["samples"] = [
        {"start": float(i), "end": float(i + 1), "count": rate, "rate": rate, "warmup": i == 0}
        for i in range(20)]
    rec["host"] = {"hostname": hostname, "cpu_model": "EPYC", "cpu_count": 64,
                   "torch": "2.13.0", "cuda": None, "gpus": []}
    rec.update(fields)
    return rec


def per_gpu(name, node, index, rate, run=0):
    """A per-gpu record of device ``index`` on ``node`` of a multi-node cluster."""
    return record(name, rate, device=f"{node}.{index}", devices=[index], run=run,
                  hostname=node, node=node, nodes=[node], node_count=1, gpus_per_node=1)


def progression(name, n, g, rate):
    """A node-progression record of ``n`` nodes × ``g`` GPUs per node (whole-job rate)."""
    nodes = [f"node{i + 1}" for i in range(n)]
    return record(name, rate, device=f"{n}x{g}", devices=list(range(g)),
                  partition="node-progression", nodes=nodes, node_count=n, gpus_per_node=g)


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
    recs += [progression("c.ddp", n, g, rate) for (n, g), rate in DDP.items()
             if (n, g) not in skip]
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
    assert conv["pernode"]["node3"] == {"n": 2, "min": 89.0, "max": 91.0, "mean": 90.0,
                                        "std": pytest.approx(math.sqrt(2))}
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
    recs = [record("s.t", 10.0, device=str(d), devices=[d], hostname="gpu-box")
            for d in range(2)]
    recs.append(record("s.t", 10.0, device="2", devices=[2], hostname="bad name/"))
    t = summarize(recs)["tests"]["s.t"]
    assert list(t["pernode"]) == ["gpu-box"] and t["pernode"]["gpu-box"]["n"] == 2
    assert t["train"]["n"] == 3        # an unsafe host name leaves pernode, not the test


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
        del t["pernode"]
    s = normalize_summary(old)
    assert all(t["pernode"] == {} and t["node_count"] is None for t in s["tests"].values())
    rep = build_report(s, compare_nodes=True)
    assert rep.node_compare["tests"] == [] and rep.scaling == []


# --- milarun report --compare-nodes ----------------------------------------------------

def test_compare_nodes_flags_a_node_10_percent_below_not_2(cluster):
    rep = build_report(summarize_dir(cluster)[0], compare_nodes=True)
    cmp = rep.node_compare
    assert cmp["threshold"] == 5.0
    by_test = {t["test"]: t for t in cmp["tests"]}
    assert sorted(by_test) == ["c.conv", "c.mm"]     # node-progression: one node per group
    conv = {row["node"]: row for row in by_test["c.conv"]["nodes"]}
    assert by_test["c.conv"]["median"] == pytest.approx(100.0)
    assert conv["node3"]["ratio"] == pytest.approx(0.9) and conv["node3"]["slow"]
    assert not conv["node1"]["slow"] and not conv["node2"]["slow"]
    mm = {row["node"]: row for row in by_test["c.mm"]["nodes"]}
    assert mm["node3"]["ratio"] == pytest.approx(0.98) and not mm["node3"]["slow"]
    assert cmp["slow"] == {"node3": [("c.conv", pytest.approx(0.9))]}


def test_compare_nodes_text(cluster, capsys):
    code, out, err = cli(["report", cluster, "--compare-nodes"], capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("node comparison:"))
    assert "more than 5% below" in lines[start]
    table = lines[start + 1:start + 9]     # header, index names, 6 rows
    assert table[0].split() == ["n", "mean", "median", "ratio", "flag"]
    assert table[1].split() == ["test", "node"]
    assert table[2].split() == ["c.conv", "node1", "2", "100.00", "100.00", "1.000"]
    assert table[4].split() == ["node3", "2", "90.00", "100.00", "0.900", "SLOW"]
    assert table[7].split() == ["node3", "2", "49.00", "50.00", "0.980"]
    assert lines[start + 9] == ("verdict: slow nodes (more than 5% below the cluster median): "
                                "node3 (c.conv 0.900)")


@pytest.mark.parametrize("threshold,slow,verdict", [
    ("1", {"node3": ["c.conv", "c.mm"]}, "verdict: slow nodes (more than 1% below the cluster "
                                         "median): node3 (c.conv 0.900, c.mm 0.980)"),
    ("15", {}, "verdict: no slow node (none more than 15% below the cluster median)"),
    ("10", {}, None),          # exactly 10% below is not more than 10% below
])
def test_node_threshold_option(cluster, capsys, threshold, slow, verdict):
    # --node-threshold alone turns the comparison on
    code, out, _ = cli(["report", cluster, "--node-threshold", threshold], capsys)
    assert code == 0
    rep = build_report(summarize_dir(cluster)[0], compare_nodes=True,
                       node_threshold=float(threshold))
    assert {n: [t for t, _ in v] for n, v in rep.node_compare["slow"].items()} == slow
    if verdict:
        assert verdict in out.splitlines()
    flagged = [line.split()[-6] for line in out.splitlines() if line.endswith(" SLOW")]
    assert flagged == ["node3"] * sum(map(len, slow.values()))


def test_nothing_to_compare_is_one_line(capsys):
    code, out, err = cli(["report", FIX / "results", "--compare-nodes"], capsys)
    assert code == 0
    found = [line for line in out.splitlines() if line.startswith("node comparison")]
    assert found == ["node comparison: nothing to compare: no test has results from 2 or more "
                     "nodes (nodes seen: fixture-host)"]
    assert "SLOW" not in out and "verdict:" not in out


def test_without_the_option_no_node_table(cluster, capsys):
    code, out, _ = cli(["report", cluster], capsys)
    assert code == 0 and "node comparison" not in out


@pytest.mark.parametrize("value,shown", [("-5", "-5.0"), ("101", "101.0"), ("nan", "nan"),
                                         ("=-0.5", "-0.5")])
def test_bad_node_threshold_is_one_line(cluster, capsys, value, shown):
    arg = f"--node-threshold{value}" if value.startswith("=") else "--node-threshold"
    args = ["report", cluster, arg] + ([] if value.startswith("=") else [value])
    code, out, err = cli(args, capsys)
    assert (code, out) == (2, "")
    assert err == ("milarun: error: --node-threshold must be a percentage from 0 to 100, "
                   f"not {shown}\n")


# --- scaling efficiency ----------------------------------------------------------------

def test_scaling_efficiency_by_hand(cluster):
    rep = build_report(summarize_dir(cluster)[0])
    (tab,) = rep.scaling
    assert tab["test"] == "c.ddp" and tab["nodes"] == [1, 2] and tab["gpus"] == [1, 2]
    assert tab["base"] == pytest.approx(100.0)
    eff = {k: c["efficiency"] for k, c in tab["cells"].items()}
    # efficiency(n, g) = T(n, g) / (n * g * T(1, 1))
    assert eff == {(1, 1): pytest.approx(1.0), (1, 2): pytest.approx(0.95),
                   (2, 1): pytest.approx(0.90), (2, 2): pytest.approx(0.85)}
    assert tab["cells"][(2, 2)]["throughput"] == pytest.approx(340.0)


def test_scaling_table_in_text(cluster, capsys):
    code, out, _ = cli(["report", cluster], capsys)
    assert code == 0
    lines = out.splitlines()
    i = lines.index("scaling of c.ddp: mean steady-state throughput in items/s "
                    "(scaling efficiency)")
    assert lines[i + 1].split() == ["1", "GPU/node", "2", "GPU/node"]
    assert lines[i + 2].split() == ["nodes"]
    assert lines[i + 3].split() == ["1", "node(s)", "100.00", "(100.0%)", "190.00", "(95.0%)"]
    assert lines[i + 4].split() == ["2", "node(s)", "180.00", "(90.0%)", "340.00", "(85.0%)"]
    assert lines[i + 5] == ("efficiency = throughput / (nodes x GPUs per node x 100.00 items/s, "
                            "the 1x1 throughput)")


def test_scaling_without_1x1_invents_no_baseline(tmp_path):
    recs = [r for r in cluster_records(skip=[(1, 1)]) if r["name"] == "c.ddp"]
    rep = build_report(summarize(recs))
    (tab,) = rep.scaling
    assert tab["base"] is None
    assert all(c["efficiency"] is None for c in tab["cells"].values())
    text = render_text(rep)
    assert "no 1x1 result for c.ddp: there is no per-GPU baseline, so no efficiency is " \
           "shown" in text
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
        "c.ddp.1x1": 2.0, "c.ddp.1x2": 2.0, "c.ddp.2x1": 2.0, "c.ddp.2x2": 2.0}
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
    assert ["340.00", "(85.0%)"] == scaling[scaling.index("340.00"):scaling.index("340.00") + 2]
    assert "100.00 (100.0%)" in scan.ids["scaling-c.ddp"]
    assert "scaling-plot" in scan.figures
    # the plot: one line per GPUs-per-node value and the ideal line, labelled by numbers
    plot = text.split('class="scaling-plot"')[1].split("</figure>")[0]
    assert "<svg" in plot and "1 GPU/node" in plot and "2 GPU/node" in plot
    assert "ideal: n × g × 1x1" in plot
    assert "<script" not in text


def test_html_nothing_to_compare(tmp_path, capsys):
    page = tmp_path / "r.html"
    assert cli(["report", FIX / "results", "--compare-nodes", "--html", page], capsys)[0] == 0
    scan = Ids()
    scan.feed(page.read_text())
    assert scan.ids["nodes-empty"].strip().startswith("node comparison: nothing to compare")
    assert "node-compare" not in scan.ids and "scaling" not in scan.ids
