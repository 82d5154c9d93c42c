"""``milarun verify``'s ``serving`` rules (milarun/verify/check.py ``check_serving``): every
load level recomputed from the records' raw request timings at the rules' targets."""

import copy
import json

import pytest
from conftest import recorded_level

from milarun.errors import MilarunError
from milarun.formats.rules import RulesError, read_rules
from milarun.verify.check import Bundle, check_performance, verify_bundle
from milarun.verify.verdict import Verdict

GROUP = "standard.llm_server"
#: The targets the vendor's records claim: looser than the rules' (TPOT 100 ms).
LOOSE = {"name": "loose", "ttft_s": 10.0, "tpot_s": 1.0, "percentile": 99}


#: 2 requests of 101 tokens sent at 0, TTFT 0.1 s, TPOT 10 ms: window 1.1 s, 202 tokens
#: -> 183.6 tokens/s, every one good at the rules' targets.
FAST = [(0, 0.1, 0.01, 101), (0, 0.1, 0.01, 101)]
#: The same at TPOT 500 ms: good under LOOSE, none good under the rules.
SLOW = [(0, 0.1, 0.5, 101), (0, 0.1, 0.5, 101)]


def record(device, measured=FAST, passes=(4.0,), fails=(8.0,), consistency=True):
    """A successful per-gpu record of GROUP: the measured rate-4 level, then a capacity
    search whose levels at ``passes`` are FAST and at ``fails`` SLOW."""
    search = [recorded_level("rate", x, FAST) for x in passes] + [
        recorded_level("rate", x, SLOW) for x in fails
    ]
    rec = {
        "name": GROUP,
        "partition": "per-gpu",
        "device": str(device),
        "run": 0,
        "success": True,
        "serving_load": {
            "scenario": "server",
            "targets": LOOSE,
            "levels": [recorded_level("rate", 4.0, measured), *search],
            "capacity": {
                "kind": "rate",
                "capacity": max(passes + fails),  # the vendor's claim: never read
                "reason": "converged",
                "steps": [[x, True] for x in passes + fails],
                "levels": list(range(1, 1 + len(search))),
            },
        },
    }
    if consistency is not None:
        rec["serving_load"]["consistency"] = {"prompts": 2, "passed": consistency}
    return rec


def judge(tmp_path, records, **rule):
    """The serving clauses of ``rule`` (with the rules' targets) on ``records``."""
    rule = {"targets": {"ttft_s": 2, "tpot_s": 0.1, "percentile": 99}, **rule}
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"serving": {"tests": {GROUP: rule}}}))
    rules = read_rules(path)
    b = Bundle(tmp_path)
    b.entries = []
    b.records = {f"r{i}.json": rec for i, rec in enumerate(records)}
    b.summary = {"tests": {GROUP: {}}}
    v = Verdict(bundle=str(tmp_path))
    check_performance(b, v, rules)
    return {c.name: c for c in v.clauses if c.name.startswith("performance.serving")}, v.clauses


ALL = {"min_goodput_tokens_per_s": 100, "min_capacity": 4, "require_consistency": True}


def test_an_honest_bundle_passes(tmp_path):
    clauses, every = judge(tmp_path, [record(0), record(1, passes=(4.0, 6.0))], **ALL)
    assert all(c.ok for c in every), [c.detail for c in every if not c.ok]
    assert set(clauses) == {
        "performance.serving-records",
        "performance.serving-goodput",
        "performance.serving-capacity",
        "performance.serving-consistency",
    }
    assert "goodput 183.6 tokens/s" in clauses["performance.serving-goodput"].detail
    assert "median over 2 record(s)" in clauses["performance.serving-goodput"].detail
    assert "capacity 5 requests/s" in clauses["performance.serving-capacity"].detail


def test_timings_over_the_rules_targets_fail(tmp_path):
    # good at the records' own (loose) targets; SLOW is over the rules' TPOT
    slow = [record(0, measured=SLOW, passes=(), fails=(4.0,)), record(1, measured=SLOW)]
    clauses, _ = judge(tmp_path, slow, min_goodput_tokens_per_s=100, min_capacity=4)
    goodput = clauses["performance.serving-goodput"]
    assert not goodput.ok and "goodput 0 tokens/s" in goodput.detail
    capacity = clauses["performance.serving-capacity"]
    assert not capacity.ok and "r0.json (no load met the targets)" in capacity.detail
    assert clauses["performance.serving-records"].ok


def test_capacity_below_the_floor_fails(tmp_path):
    clauses, _ = judge(tmp_path, [record(0, passes=(2.0,), fails=(3.0,))], min_capacity=4)
    assert not clauses["performance.serving-capacity"].ok
    assert "capacity 2 requests/s" in clauses["performance.serving-capacity"].detail


@pytest.mark.parametrize("consistency", [False, None, "skipped"])
def test_consistency_failed_or_missing_fails(tmp_path, consistency):
    bad = record(1, consistency=None if consistency == "skipped" else consistency)
    if consistency == "skipped":
        bad["serving_load"]["consistency"] = {"skipped": "no local model"}
    names = [c for c in judge(tmp_path, [record(0), bad], require_consistency=True)[1] if not c.ok]
    assert [c.name for c in names] == ["performance.serving-consistency"]
    assert names[0].paths == ["r1.json"]
    assert ("FAILED" in names[0].detail) == (consistency is False)


def test_malformed_columns_are_a_finding(tmp_path):
    broken = record(1)
    broken["serving_load"]["levels"][0]["requests"]["send_s"].pop()  # lengths differ
    del broken["serving_load"]["levels"][1]["warmup"]
    clauses, every = judge(tmp_path, [record(0), broken], min_goodput_tokens_per_s=100)
    found = [c for c in every if c.name == "performance.serving-records"]
    assert all(not c.ok for c in found) and len(found) == 2
    assert found[0].detail.startswith("r1.json: serving_load.levels[0]: ")
    assert found[1].detail == "r1.json: serving_load.levels[1].warmup: missing"
    # the malformed measured level counts 0: median of 183.6 and 0
    assert "goodput 91.82 tokens/s" in clauses["performance.serving-goodput"].detail


def test_a_group_without_serving_records_fails(tmp_path):
    other = copy.deepcopy(record(0))
    other["name"] = "standard.other"
    clauses, _ = judge(tmp_path, [other], min_goodput_tokens_per_s=1)
    assert not clauses["performance.serving-records"].ok
    assert "no successful record with serving_load" in clauses["performance.serving-records"].detail


@pytest.mark.parametrize(
    "serving, key",
    [
        ({}, "serving.tests"),
        ({"tests": {GROUP: {"min_capacity": 4}}}, f"serving.tests.{GROUP}.targets"),
        (
            {"tests": {GROUP: {"targets": {"ttft_s": 2, "tpot_s": 0.1, "percentile": 0}}}},
            f"serving.tests.{GROUP}.targets.percentile",
        ),
        (
            {
                "tests": {
                    GROUP: {
                        "targets": {"ttft_s": 2, "tpot_s": 0.1, "percentile": 99},
                        "min_goodput": 5,
                    }
                }
            },
            f"serving.tests.{GROUP}.min_goodput",
        ),
    ],
)
def test_bad_serving_rules_are_one_line_naming_the_key(tmp_path, serving, key):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"serving": serving}))
    with pytest.raises(RulesError) as err:
        read_rules(path)
    assert str(err.value).startswith(f"{path}: {key}:") and "\n" not in str(err.value)
    with pytest.raises(MilarunError):
        verify_bundle(tmp_path, rules=path)
