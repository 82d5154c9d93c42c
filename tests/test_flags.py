"""One flag model (milarun.measure.flags): every check of the validation flags and of the
anomalies has its Rule, both are stored through one pair of functions, and the report's two
sections render them through one text function and one HTML function."""

import io
import json
import shutil
from pathlib import Path

import pytest

from milarun.analysis.summary import summarize_dir
from milarun.formats.jsonfile import load_schema
from milarun.measure import anomalies, plausibility
from milarun.measure.flags import (
    ANOMALY,
    GROUP,
    RESULT,
    RULES,
    VALIDATION,
    WARNING,
    Flag,
    flag,
    from_summary,
    to_summary,
)
from milarun.report import checks, html, make_report, text

RESULTS = Path(__file__).parent / "fixtures" / "results"


def test_every_check_of_both_modules_has_a_rule():
    assert set(RULES) == set(plausibility.FLAG_CHECKS) | set(anomalies.KINDS)
    assert all(RULES[c].family == VALIDATION for c in plausibility.FLAG_CHECKS)
    assert all(RULES[k].family == ANOMALY for k in anomalies.KINDS)
    assert {r.scope for r in RULES.values()} == {RESULT, GROUP}
    assert [r.id for r in RULES.values() if r.scope == GROUP] == ["outlier"]
    assert all(r.severity == WARNING and r.description for r in RULES.values())
    # the failing checks are failures (error.reason), not flags
    assert not set(plausibility.FAIL_CHECKS) & set(RULES)
    # the summary schema's enum of anomaly kinds is the anomaly rules
    assert _kind_enums(load_schema("summary")) == [list(anomalies.KINDS)]


def _kind_enums(node):
    """The ``enum`` of every ``kind`` property in a schema."""
    out = []
    if isinstance(node, dict):
        kind = (node.get("properties") or {}).get("kind")
        if isinstance(kind, dict) and "enum" in kind:
            out.append(kind["enum"])
        for value in node.values():
            out += _kind_enums(value)
    elif isinstance(node, list):
        for value in node:
            out += _kind_enums(value)
    return out


VALIDATION_ENTRY = {
    "device": "0",
    "node": "n1",
    "run": 2,
    "check": "gpu-load",
    "gpu": 0,
    "value": 0.2,
    "threshold": 0.5,
    "message": "GPU 0: mean GPU load 20% < 50%",
    "file": "a.json",
}
ANOMALY_ENTRY = {
    "kind": "outlier",
    "device": "1",
    "run": 0,
    "rate": 50.0,
    "ref": 100.0,
    "ratio": 0.5,
    "direction": "low",
    "others": 1,
    "file": "b.json",
    "node": "n2",
}


@pytest.mark.parametrize("entry", [VALIDATION_ENTRY, ANOMALY_ENTRY])
def test_the_summary_shapes_round_trip_in_their_key_order(entry):
    f = from_summary(entry)
    assert isinstance(f, Flag) and f.rule is RULES[f.id] and f.severity == WARNING
    assert (f.device, f.node, f.run, f.file) == (
        entry["device"],
        entry["node"],
        entry["run"],
        entry["file"],
    )
    assert list(to_summary(f).items()) == list(entry.items())


def test_constructors_and_the_message_of_an_anomaly():
    f = flag(
        "stall",
        where={"device": "0", "run": 1},
        start=3.0,
        end=9.0,
        seconds=6.0,
        count=1,
        threshold=2.0,
        at_end=False,
    )
    assert f.family == ANOMALY and f.scope == RESULT
    assert f.message == "no window closed for 6.0 s, from t=3.0 to 9.0 s; a stall is over 2.0 s"
    # the summary keeps no message for an anomaly: it is made again from the figures
    assert "message" not in to_summary(f) and from_summary(to_summary(f)) == f
    assert anomalies.describe(f.at(node="n")) == f"node n device 0 run 1: {f.message}"
    v = flag("cpu-steal", "steal", value=0.2, threshold=0.05)
    assert v.family == VALIDATION and to_summary(v) == {
        "check": "cpu-steal",
        "value": 0.2,
        "threshold": 0.05,
        "message": "steal",
    }


@pytest.fixture(scope="module")
def flagged_summary(tmp_path_factory):
    """The fixture results' summary with flags of both families added."""
    root = tmp_path_factory.mktemp("flags")
    shutil.copytree(RESULTS, root / "results")
    summary, _ = summarize_dir(root / "results", warn=io.StringIO())
    test = sorted(summary["tests"])[0]
    summary["tests"][test]["validation_flags"] = [VALIDATION_ENTRY]
    summary["tests"][test]["anomalies"] = [ANOMALY_ENTRY]
    path = root / "summary.json"
    path.write_text(json.dumps(summary))
    return path, test


def test_both_sections_render_through_the_one_flag_functions(
    flagged_summary, monkeypatch, tmp_path
):
    path, test = flagged_summary
    calls = []

    def spy(name, real):
        def wrapper(t, f):
            calls.append((name, f.family))
            return real(t, f)

        return wrapper

    line, row = checks.flag_line, checks.flag_html
    monkeypatch.setattr(checks, "flag_line", spy("line", line))
    monkeypatch.setattr(text, "flag_line", spy("line", line))
    monkeypatch.setattr(html, "flag_html", spy("html", row))
    report, out = make_report(str(path), html=str(tmp_path / "r.html"), warn=io.StringIO())
    assert sorted(set(calls)) == [
        ("html", ANOMALY),
        ("html", VALIDATION),
        ("line", ANOMALY),
        ("line", VALIDATION),
    ]
    page = (tmp_path / "r.html").read_text()
    v, a = from_summary(VALIDATION_ENTRY), from_summary(ANOMALY_ENTRY)
    assert f"  {line(test, v)}\n" in out and f"  {line(test, a)}\n" in out
    assert line(test, v) == (
        f"{test} run 2 device 0 node n1: gpu-load: GPU 0: mean GPU load 20% < 50%"
    )
    assert line(test, a) == (
        f"{test} outlier: node n2 device 1 run 0: 50 items/s, 50% below "
        "the other result of the test (100)"
    )
    assert str(row(test, v)) in page and str(row(test, a)) in page
    assert "&lt; 50%" in str(row(test, v))  # escaped
