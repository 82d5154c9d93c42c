"""The fabric tests (issue 37 §2): groups within a node, along a rail, in rounds of node
pairs, and the verdict that names a bad node or a bad link.

The pure part (:mod:`milarun.measure.fabric`) on hand-made figures; then
``milarun.models.collectives`` for real over gloo, with several torchrun agents on this
host standing for nodes (``$MILARUN_NODE`` names each, a static rendezvous joins them):
2 nodes × 2 ranks for the groups, 4 nodes × 1 rank slowed on purpose for the verdict
(``tests/fabric_slow.py`` delays one rank's operations).
"""

import itertools
import json
import os
import subprocess
import sys
from html import escape

import pytest
from conftest import ROOT
from test_acceptance import FAST

from milarun.formats.record import validate
from milarun.host.net import free_port
from milarun.measure import acceptance, fabric

# --- pure: groups and rounds ------------------------------------------------------------


def test_groups_follow_torchrun_numbering():
    assert fabric.node_groups(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert fabric.rail_groups(8, 4) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert fabric.pair_groups(8, 2, 3) == [
        [[0, 1, 6, 7], [2, 3, 4, 5]],
        [[0, 1, 4, 5], [2, 3, 6, 7]],
        [[0, 1, 2, 3], [4, 5, 6, 7]],
    ]
    with pytest.raises(ValueError, match="whole number of nodes"):
        fabric.node_groups(6, 4)
    with pytest.raises(ValueError, match="whole number of nodes"):
        fabric.rail_groups(4, 0)


@pytest.mark.parametrize("nodes", [2, 3, 4, 5, 7, 8, 16, 128])
@pytest.mark.parametrize("rounds", [1, 3, 5])
def test_pair_rounds_meet_new_partners_each_round(nodes, rounds):
    schedule = fabric.pair_rounds(nodes, rounds)
    m = nodes + nodes % 2
    assert len(schedule) == min(rounds, m - 1)
    met = set()
    for pairs in schedule:
        busy = [n for pair in pairs for n in pair]
        assert len(busy) == len(set(busy))  # a node is in one pair a round
        assert len(pairs) == nodes // 2  # every node plays, but one where odd
        for a, b in pairs:
            assert 0 <= a < b < nodes and (a, b) not in met
            met.add((a, b))
    if rounds >= m - 1:  # every pair met once: the whole round robin
        assert met == set(itertools.combinations(range(nodes), 2))


def test_bad_group_and_round_inputs():
    assert fabric.parse_groups("rail, world") == ["world", "rail"]
    assert fabric.parse_groups("all") == list(fabric.GROUP_KINDS)
    for text in ("", "world,nodes", " , "):
        with pytest.raises(ValueError, match="--groups must list"):
            fabric.parse_groups(text)
    with pytest.raises(ValueError, match="two nodes or more"):
        fabric.pair_rounds(1, 3)
    with pytest.raises(ValueError, match="--pair-rounds"):
        fabric.pair_rounds(4, 0)


# --- pure: the verdict ------------------------------------------------------------------


def _pairs(nodes, rounds, figure):
    """Every pair of the schedule with ``figure(a, b)`` GB/s."""
    names = [f"n{i}" for i in range(nodes)]
    return [
        {"a": names[a], "b": names[b], "busbw_gbps": figure(names[a], names[b])}
        for pairs in fabric.pair_rounds(nodes, rounds)
        for a, b in pairs
    ]


def test_a_node_slow_with_every_partner_is_the_bad_node():
    got = fabric.localise(_pairs(8, 3, lambda a, b: 60.0 if "n5" in (a, b) else 100.0))
    assert got["judged"] and got["reference_gbps"] == 100.0
    assert got["bad_nodes"] == ["n5"] and got["bad_links"] == [] and got["unresolved"] == []
    assert {(p["a"], p["b"]) for p in got["slow_pairs"]} == {
        tuple(sorted(("n5", x))) for x in ("n0", "n2", "n4")
    } or len(got["slow_pairs"]) == 3
    assert got["nodes"]["n5"] == {"median_gbps": 60.0, "pairs": 3, "slow": 3}
    lines = fabric.verdict_lines(got)
    assert any("bad node n5: slow with every partner (3 pairs" in line for line in lines)


def test_a_pair_slow_with_only_each_other_is_the_bad_link():
    pairs = _pairs(8, 3, lambda a, b: 70.0 if {a, b} == {"n1", "n6"} else 100.0)
    assert {"n1", "n6"} in [{p["a"], p["b"]} for p in pairs]
    got = fabric.localise(pairs)
    assert got["bad_nodes"] == [] and got["bad_links"] == [["n1", "n6"]]
    assert got["slow_pairs"][0]["ratio"] == pytest.approx(0.7)
    assert any("bad link n1 <-> n6: 70 GB/s (70% of" in line for line in fabric.verdict_lines(got))


def test_a_bad_node_and_a_bad_link_at_once_on_sixteen_nodes():
    def figure(a, b):
        if "n3" in (a, b):
            return 40.0
        return 80.0 if {a, b} == {"n0", "n15"} else 100.0

    got = fabric.localise(_pairs(16, 4, figure), tolerance=0.1)
    assert got["bad_nodes"] == ["n3"] and got["bad_links"] == [["n0", "n15"]]


def test_within_tolerance_is_not_slow_and_one_round_cannot_localise():
    ok = fabric.localise(_pairs(8, 3, lambda a, b: 91.0 if "n2" in (a, b) else 100.0))
    assert ok["slow_pairs"] == [] and fabric.verdict_lines(ok)[-1] == (
        "fabric: no bad node and no bad link"
    )
    one = fabric.localise(_pairs(8, 1, lambda a, b: 50.0 if "n2" in (a, b) else 100.0))
    assert one["bad_nodes"] == [] and one["bad_links"] == [] and len(one["unresolved"]) == 1
    assert "cannot be told from its link" in fabric.verdict_lines(one)[-1]


def test_two_nodes_are_not_judged_and_hostile_figures_are_unmeasured():
    two = fabric.localise([{"a": "x", "b": "y", "busbw_gbps": 10.0}])
    assert not two["judged"] and "3 or more are needed" in two["reason"]
    assert fabric.verdict_lines(two)[0].startswith("fabric: not judged: 2 node(s)")
    hostile = [
        {"a": "n0", "b": "n1", "busbw_gbps": float("nan")},
        {"a": "n0", "b": "n2", "busbw_gbps": -1},
        {"a": "n1", "b": "n2", "busbw_gbps": True},
        {"a": "n2", "b": "n3", "busbw_gbps": "fast"},
        {"a": "n1", "b": "n3"},
    ]
    got = fabric.localise(hostile)
    assert not got["judged"] and len(got["unmeasured"]) == 5
    zero = fabric.localise(_pairs(4, 3, lambda a, b: 0.0))
    assert not zero["judged"] and "0 GB/s" in zero["reason"]
    with pytest.raises(ValueError, match="tolerance"):
        fabric.localise([], tolerance=1.5)


def test_pair_figures_take_the_largest_all_reduce_row():
    def row(op, nbytes, figure):
        return {
            "op": op,
            "group": "pairs",
            "bytes": nbytes,
            "groups": [{"nodes": ["a", "b"], "busbw_gbps": figure}, {"nodes": ["c"]}],
        }

    rows = [row("all_reduce", 8, 1.0), row("all_reduce", 64, 2.0), row("broadcast", 128, 3.0)]
    rows += ["hostile", {"group": "world", "op": "all_reduce", "bytes": 1024}]
    assert fabric.pair_figures(rows) == [{"a": "a", "b": "b", "busbw_gbps": 2.0}]
    assert fabric.pair_figures(rows, "broadcast")[0]["busbw_gbps"] == 3.0
    assert fabric.pair_figures(rows[2:]) == [{"a": "a", "b": "b", "busbw_gbps": 3.0}]
    assert fabric.pair_figures([]) == []


# --- for real: agents on this host as nodes ---------------------------------------------


def _agents(tmp_path, nodes, per_node, argv, env=None, script=None):
    """``nodes`` torchrun agents of ``per_node`` ranks (a static rendezvous on this host),
    each with ``$MILARUN_NODE`` = ``node<i>``; returns rank 0's record."""
    out = tmp_path / "r.json"
    port = free_port("127.0.0.1")
    base = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        base.pop(key, None)
    base.update(env or {})
    extra = {"run": 0, "device": "all", "devices": list(range(per_node)), "partition": "njobs"}
    entry = [str(script)] if script else ["-m", "milarun"]
    procs = []
    for node in range(nodes):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(nodes),
            "--node-rank",
            str(node),
            "--nproc-per-node",
            str(per_node),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            *entry,
            "run",
            "milarun.models.collectives:main",
            "-o",
            str(out),
            "--experiment-name",
            "t.fabric",
            "--job-id",
            "0.all",
            "--extra",
            json.dumps(extra),
            "--",
            *argv,
        ]
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=dict(base, MILARUN_NODE=f"node{node}"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    errors = []
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        if proc.returncode:
            errors.append(err[-3000:])
    assert not errors, errors[0]
    res = json.loads(out.read_text())
    validate(res)
    assert res["success"], res["error"]
    return res


def test_groups_over_two_nodes_of_two_ranks(tmp_path):
    argv = FAST + ["--max-size", "1024", "--iters", "2", "--warmup-iters", "1"]
    res = _agents(tmp_path, 2, 2, argv + ["--groups", "all", "--ops", "all_reduce,all_to_all"])
    assert res["metrics"]["groups"] == "world,node,rail,pairs"
    rows = res["collectives"]
    sizes = acceptance.message_sizes(1024)
    for kind, ranks, groups in (
        ("world", 4, None),
        ("node", 2, 2),
        ("rail", 2, 2),
        ("pairs", 4, 1),
    ):
        mine = [r for r in rows if r["group"] == kind]
        assert len(mine) == 2 * len(sizes), kind
        for r in mine:
            assert r["ranks"] == ranks and r["busbw_gbps"] > 0
            if groups is None:
                assert "groups" not in r
                continue
            assert len(r["groups"]) == groups
            # the row is the slowest group's
            assert r["time_s"] == max(g["time_s"] for g in r["groups"])
            assert r["busbw_gbps"] == min(g["busbw_gbps"] for g in r["groups"])
    top = {r["group"]: r for r in rows if r["bytes"] == 1024 and r["op"] == "all_reduce"}
    assert [g["nodes"] for g in top["node"]["groups"]] == [["node0"], ["node1"]]
    assert [(g["nodes"], g["rail"]) for g in top["rail"]["groups"]] == [
        (["node0", "node1"], 0),
        (["node0", "node1"], 1),
    ]
    assert top["pairs"]["groups"][0]["nodes"] == ["node0", "node1"]
    assert top["pairs"]["groups"][0]["round"] == 0
    assert "busbw_all_reduce_rail_at_max_size_gbps" in res["metrics"]
    assert res["fabric"]["judged"] is False and "2 node(s)" in res["fabric"]["reason"]


def test_one_rank_per_node_skips_rails_and_one_node_skips_every_split(tmp_path):
    argv = FAST + ["--max-size", "64", "--iters", "1", "--warmup-iters", "0", "--groups", "all"]
    res = _agents(tmp_path, 1, 2, argv + ["--ops", "broadcast"])
    assert res["metrics"]["groups"] == "world"
    assert res["metrics"]["groups_skipped"] == "node,rail,pairs"
    assert {r["group"] for r in res["collectives"]} == {"world"}


@pytest.mark.parametrize(
    "env, nodes, links",
    [
        ({"FABRIC_SLOW_NODE": "node2"}, ["node2"], []),
        ({"FABRIC_SLOW_LINK": "node0,node3"}, [], [["node0", "node3"]]),
    ],
    ids=["slow-node", "slow-link"],
)
def test_a_slowed_node_and_a_slowed_link_are_named(tmp_path, env, nodes, links):
    argv = FAST + [
        "--ops",
        "all_reduce",
        "--min-size",
        "256",
        "--max-size",
        "1024",
        "--iters",
        "3",
        "--warmup-iters",
        "1",
        "--groups",
        "pairs",
        "--pair-rounds",
        "3",
        # a slowed pair takes ~6x the others' time (tests/fabric_slow.py)
        "--pair-tolerance",
        "0.5",
    ]
    res = _agents(tmp_path, 4, 1, argv, env=env, script=ROOT / "tests" / "fabric_slow.py")
    verdict = res["fabric"]
    assert verdict["judged"], verdict
    assert verdict["bad_nodes"] == nodes and verdict["bad_links"] == links, verdict
    # the report's figures are the record's rows again
    again = fabric.localise(fabric.pair_figures(res["collectives"]), verdict["tolerance"])
    assert again == verdict
    # the summary recomputes the verdict from the rows, whatever the record's own says
    res["fabric"]["bad_nodes"] = ["forged"]
    res["job"] = {"experiment": "milarun.models.collectives:main"}  # as milarun jobs records
    (tmp_path / "r.json").write_text(json.dumps(res))
    done = subprocess.run(
        [sys.executable, "-m", "milarun", "summary", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (test,) = json.loads(done.stdout)["tests"].values()
    summary = test["acceptance"]["collectives"]["fabric"]
    assert summary["pairs"]["bad_nodes"] == nodes and summary["pairs"]["bad_links"] == links
    (split,) = summary["splits"]
    assert split["group"] == "pairs" and split["groups"] == 6 and split["bytes"] == 1024
    if nodes:
        assert nodes[0] in split["slowest_nodes"]
    else:
        assert split["slowest_nodes"] == links[0]
    report = subprocess.run(
        [sys.executable, "-m", "milarun", "report", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    assert "the fabric: each group kind's slowest group" in report.stdout
    named = f"fabric: bad node {nodes[0]}" if nodes else "fabric: bad link node0 <-> node3"
    assert named in report.stdout, report.stdout
    html = tmp_path / "r.html"
    done = subprocess.run(
        [sys.executable, "-m", "milarun", "report", str(tmp_path), "--html", str(html)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert 'id="fabric-' in html.read_text() and escape(named) in html.read_text()


# --- verify: the rules' fabric -----------------------------------------------------------


def _fabric_record(figure, nodes=8, rounds=3, tolerance=0.5, run=0):
    """A multi-node collectives record of ``nodes`` nodes whose pairs measured
    ``figure(a, b)`` GB/s (run at ``--pair-tolerance`` ``tolerance``)."""
    from test_report_nodes import record

    names = [f"node{i}" for i in range(nodes)]
    rec = record(
        "acc.fabric",
        1e9,
        device=f"{nodes}x1",
        devices=[0],
        run=run,
        partition="multi-node",
        nodes=names,
        node_count=nodes,
        gpus_per_node=1,
    )
    rec["job"] = {**(rec.get("job") or {}), "experiment": "milarun.models.collectives:main"}
    groups = [
        {
            "nodes": [names[a], names[b]],
            "round": r,
            "time_s": 0.01,
            "algbw_gbps": figure(names[a], names[b]),
            "busbw_gbps": figure(names[a], names[b]),
        }
        for r, pairs in enumerate(fabric.pair_rounds(nodes, rounds))
        for a, b in pairs
    ]
    slowest = min(groups, key=lambda g: g["busbw_gbps"])
    rec["collectives"] = [
        {
            "op": "all_reduce",
            "bytes": 2**20,
            "ranks": 2,
            "group": "pairs",
            **slowest,
            "groups": groups,
        }
    ]
    del rec["collectives"][0]["nodes"], rec["collectives"][0]["round"]
    rec["fabric"] = {"tolerance": tolerance, "bad_nodes": [], "judged": True}
    return rec


def _judge(tmp_path, records, rule):
    from milarun.analysis.summary import summarize
    from milarun.formats.rules import read_rules
    from milarun.verify.check import Bundle, check_performance
    from milarun.verify.verdict import Verdict

    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"fabric": rule}))
    b = Bundle(tmp_path)
    b.entries = []
    b.records = {f"r{i}.json": rec for i, rec in enumerate(records)}
    for rec in records:
        validate(rec)
    b.summary = summarize(list(b.records.items()))
    v = Verdict(bundle=str(tmp_path))
    check_performance(b, v, read_rules(rules))
    return [c for c in v.clauses if c.name == "performance.fabric"]


def test_verify_recomputes_the_pairs_at_the_rules_tolerance(tmp_path):
    # a link at 75 %: within the bidder's own --pair-tolerance 0.5, outside the rules' 0.1
    figure = lambda a, b: 75.0 if {a, b} == {"node1", "node6"} else 100.0  # noqa: E731
    records = [_fabric_record(figure, run=r) for r in range(2)]
    (clause,) = _judge(tmp_path, records, {})
    assert not clause.ok and "bad link node1 <-> node6" in clause.detail
    (lenient,) = _judge(tmp_path, records, {"pair_tolerance": 0.3})
    assert lenient.ok and "no bad node and no bad link" in lenient.detail
    assert lenient.detail.startswith("acc.fabric")


def test_verify_fails_a_bad_node_too_few_nodes_and_no_pairs(tmp_path):
    slow = lambda a, b: 50.0 if "node3" in (a, b) else 100.0  # noqa: E731
    (clause,) = _judge(tmp_path, [_fabric_record(slow)], {})
    assert not clause.ok and "bad node node3" in clause.detail
    (two,) = _judge(tmp_path, [_fabric_record(lambda a, b: 9.0, nodes=2)], {})
    assert not two.ok and "not judged" in two.detail
    plain = _fabric_record(lambda a, b: 9.0)
    plain["collectives"][0]["group"] = "world"
    del plain["collectives"][0]["groups"]
    (none,) = _judge(tmp_path, [plain], {})
    assert not none.ok and "no successful collectives record with node pairs" in none.detail


@pytest.mark.parametrize("rule", [{"pair_tolerance": 0.95}, {"pair_tolerance": "x"}, {"k": 1}])
def test_a_bad_fabric_rule_is_one_line(tmp_path, rule):
    from milarun.formats.rules import RulesError, read_rules

    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"fabric": rule}))
    with pytest.raises(RulesError) as exc:
        read_rules(rules)
    assert "\n" not in str(exc.value) and ": fabric" in str(exc.value)
