"""The fabric tests' groups and the verdict that names a bad node or a bad link.

Pure functions, no torch and no I/O: ``milarun.models.collectives`` builds its process groups
from them in the child, the report and ``verify`` recompute the verdict from a record's figures.

**Groups** (NVIDIA nccl-tests' ``NCCL_TESTS_SPLIT``, ``src/common.cu``: a rank's group is
``color = f(rank)``). Ranks are numbered node by node, as torchrun numbers them
(``rank = node_rank × L + local_rank`` with ``L`` ranks per node):

* ``world``: every rank, one group;
* ``node``: the ``L`` ranks of each node (NVLink, PCIe: nothing crosses the network);
* ``rail``: the GPU of local rank ``i`` on every node, one group per ``i`` (one rank per node:
  only the network, rail by rail, as nccl-tests' split ``MOD L`` does);
* ``pairs``: the nodes paired in rounds (:func:`pair_rounds`), each pair's ``2L`` ranks one
  group; every pair of a round runs at once, as the fabric carries them in production.

**Rounds** (the circle method of round-robin tournaments, Kirkman 1847, in any text on
scheduling round-robin tournaments): node 0 stays, the others turn one place a round, and in
round ``r`` position ``i`` meets position ``m - 1 - i`` (``m`` the nodes, plus one bye where
odd). In ``m - 1`` rounds every node meets every other once; milarun runs the first ``R``
(``--pair-rounds``), so each node meets ``R`` different partners in ``R`` rounds, not ``n²``.

**Localisation** (:func:`localise`). Each pair has one figure (bus bandwidth, GB/s). A node's
figure is the median of its pairs'; the reference is the median of the nodes' figures, so a
bad node, which drags down every pair it is in, moves the reference by at most one node. A
pair is *slow* below ``(1 - tolerance) × reference``. A node whose pairs (two or more) are all
slow is a **bad node**; a slow pair neither of whose nodes is bad is a **bad link** (the two
nodes' NICs, cables or switch ports between them). A node met only once cannot be told from
its link: the pair is *unresolved*. Fewer than three nodes measured: no reference (the verdict
says so and judges nothing).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: The group kinds of ``--groups``, in the order a run measures them.
GROUP_KINDS = ("world", "node", "rail", "pairs")
#: Default fraction below the reference at which a pair is slow.
TOLERANCE = 0.10
#: Nodes needed for a reference (two nodes are one pair: nothing to compare it with).
MIN_NODES = 3


def parse_groups(text: str) -> list[str]:
    """The kinds of ``--groups`` (comma-separated among :data:`GROUP_KINDS`; ``all``: every
    one), in :data:`GROUP_KINDS` order.

    Raises:
        ValueError: an unknown or empty list.
    """
    if str(text).strip() == "all":
        return list(GROUP_KINDS)
    kinds = [k.strip() for k in str(text).split(",") if k.strip()]
    bad = [k for k in kinds if k not in GROUP_KINDS]
    if not kinds or bad:
        raise ValueError(
            f"--groups must list some of {', '.join(GROUP_KINDS)} (or all); "
            f"unknown: {', '.join(bad) or '(none given)'}"
        )
    return [k for k in GROUP_KINDS if k in kinds]


def node_groups(size: int, local_size: int) -> list[list[int]]:
    """The ranks of each node: ``[[0..L-1], [L..2L-1], ...]``.

    Raises:
        ValueError: ``size`` is not a whole number of nodes of ``local_size`` ranks.
    """
    _check_shape(size, local_size)
    return [list(range(s, s + local_size)) for s in range(0, size, local_size)]


def rail_groups(size: int, local_size: int) -> list[list[int]]:
    """The ranks of each rail: local rank ``i`` of every node, ``[[i, i+L, i+2L, ...]]``.

    Raises:
        ValueError: as :func:`node_groups`.
    """
    _check_shape(size, local_size)
    return [list(range(i, size, local_size)) for i in range(local_size)]


def pair_rounds(nodes: int, rounds: int) -> list[list[tuple[int, int]]]:
    """The first ``rounds`` rounds of the circle method over ``nodes`` nodes (module doc):
    per round, the ``(a, b)`` node pairs with ``a < b``; a node without a partner (an odd
    count) sits the round out. ``rounds`` is capped at the rounds that meet new partners.

    Raises:
        ValueError: ``nodes`` < 2 or ``rounds`` < 1.
    """
    if nodes < 2:
        raise ValueError(f"pairs need two nodes or more, not {nodes}")
    if rounds < 1:
        raise ValueError(f"--pair-rounds must be 1 or more, not {rounds}")
    m = nodes + nodes % 2  # the last position is a bye where odd
    order = list(range(m))
    out = []
    for _ in range(min(rounds, m - 1)):
        pairs = []
        for i in range(m // 2):
            a, b = order[i], order[m - 1 - i]
            if a < nodes and b < nodes:
                pairs.append((min(a, b), max(a, b)))
        out.append(sorted(pairs))
        order = [order[0], order[-1], *order[1:-1]]
    return out


def pair_groups(size: int, local_size: int, rounds: int) -> list[list[list[int]]]:
    """Per round of :func:`pair_rounds`, the ranks of each pair's two nodes.

    Raises:
        ValueError: as :func:`node_groups` and :func:`pair_rounds`.
    """
    nodes = node_groups(size, local_size)
    return [[nodes[a] + nodes[b] for a, b in r] for r in pair_rounds(len(nodes), rounds)]


def _check_shape(size: int, local_size: int) -> None:
    if local_size < 1 or size < local_size or size % local_size:
        raise ValueError(
            f"{size} ranks are not a whole number of nodes of {local_size} ranks: "
            "the fabric groups need the same ranks on every node"
        )


def _figure(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


def localise(pairs: Iterable[Mapping[str, Any]], tolerance: float = TOLERANCE) -> dict[str, Any]:
    """The bad nodes and bad links of a pairwise test (module doc).

    Args:
        pairs: ``{"a": node, "b": node, "busbw_gbps": GB/s}`` per pair; a figure that is
            missing, not a finite number >= 0, is *unmeasured* (listed, judged nowhere).
        tolerance: fraction below the reference at which a pair is slow (0 to 1).

    Returns:
        ``{"tolerance", "reference_gbps": GB/s or None, "nodes": {node: {"median_gbps",
        "pairs", "slow"}}, "slow_pairs": [{"a", "b", "busbw_gbps", "ratio"}], "bad_nodes":
        [node], "bad_links": [[a, b]], "unresolved": [[a, b]], "unmeasured": [[a, b]],
        "judged": bool, "reason": str or None}`` (``reason`` says why nothing was judged).

    Raises:
        ValueError: ``tolerance`` outside [0, 1).
    """
    if not 0 <= tolerance < 1:
        raise ValueError(f"the pairs' tolerance must be from 0 to 1, not {tolerance!r}")
    measured: list[tuple[str, str, float]] = []
    unmeasured = []
    for p in pairs:
        a, b = str(p.get("a")), str(p.get("b"))
        fig = _figure(p.get("busbw_gbps"))
        if fig is None:
            unmeasured.append(sorted([a, b]))
        else:
            measured.append((a, b, fig))
    per_node: dict[str, list[float]] = {}
    for a, b, fig in measured:
        per_node.setdefault(a, []).append(fig)
        per_node.setdefault(b, []).append(fig)
    medians = {n: statistics.median(v) for n, v in per_node.items()}
    out: dict[str, Any] = {
        "tolerance": tolerance,
        "reference_gbps": None,
        "nodes": {},
        "slow_pairs": [],
        "bad_nodes": [],
        "bad_links": [],
        "unresolved": [],
        "unmeasured": sorted(unmeasured),
        "judged": False,
        "reason": None,
    }
    if len(medians) < MIN_NODES:
        out["reason"] = (
            f"{len(medians)} node(s) measured in pairs: {MIN_NODES} or more are needed "
            "for a reference (two nodes are one pair, with nothing to compare it with)"
        )
        return out
    ref = statistics.median(medians.values())
    out["reference_gbps"] = ref
    out["judged"] = True
    if ref <= 0:
        out["judged"], out["reason"] = False, "every pair measured 0 GB/s: no reference"
        return out
    slow = [(a, b, f) for a, b, f in measured if f < (1 - tolerance) * ref]
    slow_count: dict[str, int] = {}
    for a, b, _ in slow:
        slow_count[a] = slow_count.get(a, 0) + 1
        slow_count[b] = slow_count.get(b, 0) + 1
    bad = {n for n, v in per_node.items() if len(v) >= 2 and slow_count.get(n, 0) == len(v)}
    for n in sorted(per_node):
        out["nodes"][n] = {
            "median_gbps": medians[n],
            "pairs": len(per_node[n]),
            "slow": slow_count.get(n, 0),
        }
    for a, b, f in sorted(slow):
        out["slow_pairs"].append({"a": a, "b": b, "busbw_gbps": f, "ratio": f / ref})
        if a in bad or b in bad:
            continue
        if len(per_node[a]) < 2 or len(per_node[b]) < 2:
            out["unresolved"].append([a, b])
        else:
            out["bad_links"].append([a, b])
    out["bad_nodes"] = sorted(bad)
    return out


def verdict_lines(result: Mapping[str, Any]) -> list[str]:
    """The verdict of :func:`localise` as lines (the report and ``verify`` print them)."""
    if not result.get("judged"):
        return [f"fabric: not judged: {result.get('reason')}"]
    ref = result["reference_gbps"]
    pct = round(100 * result["tolerance"])
    lines = [
        f"fabric: pairs against the median node's {ref:.3g} GB/s (slow: more than {pct} % below)"
    ]
    nodes = result["nodes"]
    for n in result["bad_nodes"]:
        lines.append(
            f"fabric: bad node {n}: slow with every partner "
            f"({nodes[n]['pairs']} pairs, median {nodes[n]['median_gbps']:.3g} GB/s)"
        )
    slow = {(p["a"], p["b"]): p for p in result["slow_pairs"]}
    for a, b in result["bad_links"]:
        p = slow[(a, b)]
        lines.append(
            f"fabric: bad link {a} <-> {b}: {p['busbw_gbps']:.3g} GB/s "
            f"({p['ratio']:.0%} of the reference); both nodes are fast with their other partners"
        )
    for a, b in result["unresolved"]:
        p = slow[(a, b)]
        lines.append(
            f"fabric: slow pair {a} <-> {b}: {p['busbw_gbps']:.3g} GB/s; a node met only "
            "once cannot be told from its link (more --pair-rounds)"
        )
    for a, b in result["unmeasured"]:
        lines.append(f"fabric: pair {a} <-> {b} has no figure")
    if len(lines) == 1:
        lines.append("fabric: no bad node and no bad link")
    return lines


def pair_figures(rows: Sequence[Mapping[str, Any]], op: str | None = None) -> list[dict]:
    """The pairs' figures a record's ``collectives`` rows give: those of the ``pairs``
    rows of ``op`` (``all_reduce`` where measured, else the first op) at the largest size,
    as :func:`localise` takes them. Hostile rows (not mappings, no groups) are skipped."""
    rows = [r for r in rows if isinstance(r, Mapping) and r.get("group") == "pairs"]
    ops = [r.get("op") for r in rows]
    if op is None:
        op = "all_reduce" if "all_reduce" in ops else (ops[0] if ops else None)
    mine = [r for r in rows if r.get("op") == op and isinstance(r.get("bytes"), int)]
    if not mine:
        return []
    top = max(mine, key=lambda r: r["bytes"])
    out = []
    for g in top.get("groups") or []:
        if isinstance(g, Mapping) and isinstance(g.get("nodes"), list) and len(g["nodes"]) == 2:
            out.append({"a": g["nodes"][0], "b": g["nodes"][1], "busbw_gbps": g.get("busbw_gbps")})
    return out
