"""``milarun tender``: every bidder verified and ranked (milarun/report/tender.py).

Three real bundles are made once per session on CPU slots: ``acme`` (the profile as
written), ``slowco`` (the same profile with ``-- --batch-size 4``: clearly slower) and
``cheat``, a copy of acme whose rate samples are multiplied by 3 (a tampered bundle: the
best score, and it must fail verification). Verification is faked (``verify_one`` is
monkeypatched to return Verdicts): the real ``milarun.verify.check`` is tested on its own.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from milarun.cli import main
from milarun.errors import MilarunError
from milarun.formats.bundle import bundle_path, signature_path
from milarun.formats.manifest import entry_hash, file_digest, manifest_path
from milarun.report import make_report
from milarun.report import tender as tender_module
from milarun.report.tender import build_tender, parse_bidders, rank
from milarun.verify import keys
from milarun.verify.seal import seal
from milarun.verify.verdict import Verdict

ROOT = Path(__file__).resolve().parent.parent

#: One test on 2 CPU slots (2 rates: intervals exist), a short steady state: the whole
#: fixture is two concurrent `milarun jobs` of one wave each (~20 s idle, ~40 s loaded).
PROFILE = {
    "*": {
        "partition_scheme": {"type": "per-gpu", "cgroup": "cpuset,memory:student{device}"},
        "arguments": {
            "--sample-duration": 0.2,
            "--warmup": 3,
            "--min-steady": 2,
            "--max-count": 1,
            "--device": "cpu",
        },
        "timeout": 120,
    },
    "fit": {
        "experiment": "milarun.models.toy_reg:main",
        "arguments": {"--batch-size": 64},
        "tags": ["compute"],
    },
}


def _jobs(profile, dataroot, out, extra=()):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "milarun",
            "jobs",
            str(profile),
            "-d",
            str(dataroot),
            "-o",
            str(out),
            "--no-cgexec",
            "--cpu-slots",
            "2",
            *extra,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _inflate(folder, factor):
    """Multiply every rate sample (and count) of every record in ``folder``: tampering."""
    for path in folder.glob("*.json"):
        if path.name == "bundle.json":
            continue
        rec = json.loads(path.read_text())
        train = rec["timings"]["train"]
        for s in train["samples"]:
            s["count"] *= factor
            s["rate"] *= factor
        train["count"] *= factor
        path.write_text(json.dumps(rec))


@pytest.fixture(scope="session")
def bundles(tmp_path_factory):
    """``{name: folder}`` of acme, slowco and cheat (see the module doc)."""
    base = tmp_path_factory.mktemp("tender")
    profile = base / "tender.json"
    profile.write_text(json.dumps(PROFILE))
    (base / "data").mkdir()
    acme, slowco, cheat = base / "acme", base / "slowco", base / "cheat"
    runs = [
        _jobs(profile, base / "data", acme),
        _jobs(profile, base / "data", slowco, ["--", "--batch-size", "4"]),
    ]
    for proc in runs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
    for folder in (acme, slowco):  # each vendor seals its bundle
        seal(folder, say=lambda line: None)
    shutil.copytree(acme, cheat)
    _inflate(cheat, 3)
    return {"acme": acme, "slowco": slowco, "cheat": cheat}


def _verdict(path, ok):
    v = Verdict(bundle=str(path))
    v.add("integrity", "integrity.chain", True, "the chain is unbroken")
    if not ok:
        v.add("integrity", "integrity.file-changed", False, "acme.fit.J0.0.json changed")
    return v


@pytest.fixture
def fake_verify(monkeypatch):
    """verify_one faked: every bundle passes but those named in ``failing``."""
    state = SimpleNamespace(failing={"cheat"}, calls=[])

    def fake(path, rules, expect_head=None, public_key=None):
        state.calls.append((str(path), rules))
        return _verdict(path, Path(path).name not in state.failing)

    monkeypatch.setattr(tender_module, "verify_one", fake)
    return state


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code, capsys.readouterr()


def _args(bundles, *names):
    return [str(bundles[n]) for n in names]


# --- ranking --------------------------------------------------------------------------


def test_failing_bidder_is_last_even_with_the_best_score(bundles, fake_verify, tmp_path):
    t = build_tender(_args(bundles, "cheat", "slowco", "acme"), "rules.json")
    by = {b.name: b for b in t.bidders}
    # the tampered copy has the best score by far, and is still last, without a rank
    assert by["cheat"].score > 2.5 * by["acme"].score
    assert [b.name for b in t.bidders] == ["acme", "slowco", "cheat"]
    assert [b.rank for b in t.bidders] == [1, 2, None]
    assert by["cheat"].status == "NOT VERIFIED: 1 clause(s) failed"
    assert by["acme"].status == "VERIFIED"
    # the rules file was handed to the verification of every bundle
    assert sorted(c[1] for c in fake_verify.calls) == ["rules.json"] * 3
    assert t.exit_code == 0


def test_verified_bidders_ranked_by_score(bundles, fake_verify):
    fake_verify.failing = set()
    t = build_tender(_args(bundles, "slowco", "acme", "cheat"), "rules.json")
    assert [b.name for b in t.bidders] == ["cheat", "acme", "slowco"]
    scores = [b.score for b in t.bidders]
    assert scores == sorted(scores, reverse=True)


def test_scores_are_the_reports(bundles, fake_verify):
    """One score formula: the tender's score, node score and intervals are those of
    `milarun report` on the same bundle (unweighted: no --weights, no shipped weights)."""
    t = build_tender(_args(bundles, "acme", "slowco"), "rules.json")
    for b in t.bidders:
        report, _ = make_report(str(bundles[b.name]), unweighted=True)
        assert b.score == report.score
        assert b.report.node_score == report.node_score
        assert b.report.score_ci == report.score_ci
        assert b.report.node_score_ci == report.node_score_ci
        assert {f["label"]: f["score"] for f in b.report.families} == {
            f["label"]: f["score"] for f in report.families
        }
        assert {f["label"] for f in report.families} == {"compute"}


def test_family_columns_in_family_order():
    def R(*fams):
        return SimpleNamespace(
            families=[{"family": f, "label": f.upper(), "score": 1.0} for f in fams]
        )

    bidders = [
        SimpleNamespace(report=R("vision", "other")),
        SimpleNamespace(report=None),
        SimpleNamespace(report=R("llm", "vision")),
    ]
    assert tender_module.family_labels(bidders) == ["LLM", "vision", "other"]


def test_rank_without_files():
    B = lambda name, ok, score: SimpleNamespace(name=name, verified=ok, score=score, rank=0)  # noqa: E731
    ordered = rank(
        [
            B("x", False, 100.0),
            B("y", True, None),
            B("z", True, 2.0),
            B("w", True, 3.0),
            B("v", False, None),
        ]
    )
    assert [b.name for b in ordered] == ["w", "z", "y", "x", "v"]
    assert [b.rank for b in ordered] == [1, 2, 3, None, None]


def test_parse_bidders(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "x=y").mkdir()
    assert parse_bidders([str(tmp_path / "a"), f"vendor2={tmp_path / 'a'}"]) == [
        ("a", str(tmp_path / "a")),
        ("vendor2", str(tmp_path / "a")),
    ]
    # an existing folder is a path, even with "=" in its name (then it needs NAME=PATH)
    with pytest.raises(MilarunError, match="'x=y' is not a bidder name"):
        parse_bidders([str(tmp_path / "x=y")])
    assert parse_bidders([f"xy={tmp_path / 'x=y'}"]) == [("xy", str(tmp_path / "x=y"))]
    with pytest.raises(MilarunError, match="two bidders named 'a'"):
        parse_bidders([str(tmp_path / "a"), f"a={tmp_path / 'a'}"])
    with pytest.raises(MilarunError, match="no such bundle folder"):
        parse_bidders([str(tmp_path / "nope")])
    with pytest.raises(MilarunError, match="not a bidder name"):
        parse_bidders([f"bad name={tmp_path / 'a'}"])


# --- prices ---------------------------------------------------------------------------


def _row(text, name):
    """The line of bidder ``name`` in the ranking table of the text output."""
    return next(line for line in text.splitlines() if line.startswith(name + " "))


def _money(value):
    return f"{value:,.2f}" if value >= 1 else f"{value:.3g}"


def test_price_per_point_by_hand(bundles, fake_verify, tmp_path, capsys):
    prices = tmp_path / "prices.json"
    prices.write_text(
        json.dumps({"currency": "EUR", "bidders": {"acme": 412000, "slowco": 1234.5}})
    )
    out = tmp_path / "t.json"
    code, io = run_cli(
        [
            "tender",
            *_args(bundles, "acme", "slowco", "cheat"),
            "--rules",
            "r.json",
            "--prices",
            str(prices),
            "--json",
            str(out),
        ],
        capsys,
    )
    assert code == 0, io.err
    data = {b["name"]: b for b in json.loads(out.read_text())["bidders"]}
    for name, price in (("acme", 412000.0), ("slowco", 1234.5)):
        score, node = data[name]["score"], data[name]["node_score"]
        assert data[name]["price_per_score"] == pytest.approx(price / score, rel=1e-12)
        assert data[name]["price_per_node_score"] == pytest.approx(price / node, rel=1e-12)
        # the last three columns: price, price / score, price / node score
        assert _row(io.out, name).split()[-3:] == [
            f"{price:,.2f}",
            _money(price / score),
            _money(price / node),
        ]
    # no price: "-" in the three price columns, null in the JSON
    assert _row(io.out, "cheat").split()[-3:] == ["-", "-", "-"]
    assert data["cheat"]["price_per_score"] is None


@pytest.mark.parametrize(
    "content, key",
    [
        ({"currency": "EUR", "bidders": {"acme": 1, "initech": 2}}, "bidders.initech"),
        ({"currency": "EUR", "bidders": {"acme": -5}}, "bidders.acme"),
        ({"currency": "euro", "bidders": {"acme": 5}}, "currency"),
        ({"bidders": {"acme": 5}}, "currency"),
    ],
)
def test_prices_file_errors(bundles, fake_verify, tmp_path, capsys, content, key):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps(content))
    code, io = run_cli(
        ["tender", *_args(bundles, "acme"), "--rules", "r.json", "--prices", str(prices)], capsys
    )
    assert code == 2
    assert io.err.startswith(f"milarun: error: {prices}: {key}: ")
    assert io.err.count("\n") == 1 and io.out == ""
    assert fake_verify.calls == []  # refused before any bundle is verified


def test_bad_inputs_exit_2(bundles, fake_verify, tmp_path, capsys):
    code, io = run_cli(["tender", str(tmp_path / "missing"), "--rules", "r.json"], capsys)
    assert (code, io.err) == (2, f"milarun: error: {tmp_path / 'missing'}: no such bundle folder\n")
    code, io = run_cli(
        [
            "tender",
            *_args(bundles, "acme"),
            "--rules",
            "r.json",
            "--weights",
            str(tmp_path / "w.json"),
        ],
        capsys,
    )
    assert code == 2 and io.err.startswith(f"milarun: error: {tmp_path / 'w.json'}")
    assert io.err.count("\n") == 1
    code, io = run_cli(["tender", *_args(bundles, "acme")], capsys)
    assert code == 2 and "--rules is required" in io.err


def test_none_verified_exits_1(bundles, fake_verify, capsys):
    fake_verify.failing = {"acme", "slowco"}
    code, io = run_cli(["tender", *_args(bundles, "acme", "slowco"), "--rules", "r"], capsys)
    assert code == 1
    assert "no bidder's bundle verified" in io.err
    assert "acme: not verified:" in io.out and "integrity.file-changed" in io.out


def test_unreadable_bundle_is_shown_not_ranked(bundles, monkeypatch, tmp_path):
    """An error naming a file inside a bundle marks that bidder unreadable; an error
    naming any other file (the rules) is bad input."""

    def fake(path, rules, expect_head=None, public_key=None):
        if Path(path).name == "slowco":
            raise MilarunError(
                "bad chain", path=Path(path) / ".milarun" / "manifest.jsonl", key="3.prev"
            )
        if Path(path).name == "cheat":
            raise MilarunError("bad rule", path=rules, key="performance")
        return _verdict(path, True)

    monkeypatch.setattr(tender_module, "verify_one", fake)
    t = build_tender(_args(bundles, "slowco", "acme"), str(tmp_path / "rules.json"))
    assert [(b.name, b.rank, b.status) for b in t.bidders] == [
        ("acme", 1, "VERIFIED"),
        ("slowco", None, "unreadable"),
    ]
    assert "manifest.jsonl: 3.prev: bad chain" in t.bidders[1].error
    with pytest.raises(MilarunError, match="rules.json: performance: bad rule"):
        build_tender(_args(bundles, "acme", "cheat"), str(tmp_path / "rules.json"))


# --- significance ---------------------------------------------------------------------


def test_pairwise_significance(bundles, fake_verify, tmp_path, capsys):
    """A copy of acme whose rates are 10 times as high vs acme: significant; acme vs itself:
    within noise; and each pair's interval is exactly `milarun report ROW --compare COLUMN`'s
    score / baseline one. (Two real runs on this noisy machine are not reliably apart.)"""
    fast = tmp_path / "fast"
    shutil.copytree(bundles["acme"], fast)
    _inflate(fast, 10)
    args = [f"fast={fast}", str(bundles["acme"]), f"twin={bundles['acme']}"]
    t = build_tender(args, "rules.json")
    fast_slow = t.pairs[("fast", "acme")]
    assert fast_slow.sig == "significant" and fast_slow.ratio > 2
    assert t.pairs[("acme", "fast")].sig == "significant"
    twin = t.pairs[("acme", "twin")]
    assert twin.ratio == pytest.approx(1.0) and twin.sig == "within noise"
    assert twin.ci.lo < 1 < twin.ci.hi
    # the same test as --compare
    summary = tmp_path / "acme.json"
    code, _ = run_cli(["summary", str(bundles["acme"]), "-o", str(summary)], capsys)
    assert code == 0
    report, text = make_report(str(fast), compare=str(summary), unweighted=True)
    assert report.score_ratio == fast_slow.ratio
    assert report.score_ratio_ci == fast_slow.ci
    assert "(significant)" in text
    # the marks in the text matrix
    text = tender_module.render_text(t)
    matrix = text[text.index("row / column") :].splitlines()
    row = next(line for line in matrix if line.startswith("acme "))
    assert f"{t.pairs[('acme', 'fast')].ratio:.3f} *" in row and "1.000 =" in row
    assert (
        f"fast / acme: {fast_slow.ratio:.3f}, 95% CI "
        f"{fast_slow.ci.lo:.3f} to {fast_slow.ci.hi:.3f}: significant"
    ) in text


# --- outputs --------------------------------------------------------------------------


def test_html_page(bundles, fake_verify, tmp_path, capsys):
    page = tmp_path / "tender.html"
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"currency": "USD", "bidders": {"acme": 100}}))
    code, io = run_cli(
        [
            "tender",
            *_args(bundles, "acme", "slowco", "cheat"),
            "--rules",
            "r.json",
            "--prices",
            str(prices),
            "--html",
            str(page),
        ],
        capsys,
    )
    assert code == 0, io.err
    html = page.read_text()
    table = html[html.index('<table id="tender">') :]
    table = table[: table.index("</table>")]
    rows = table.split('<tr class="')[1:]
    assert [r.split('id="bidder-')[1].split('"')[0] for r in rows] == ["acme", "slowco", "cheat"]
    assert rows[2].startswith("unverified") and "NOT VERIFIED: 1 clause(s) failed" in rows[2]
    assert "<th>price / node score</th>" in table and "<th>compute score</th>" in table
    assert "integrity.file-changed: acme.fit.J0.0.json changed" in html
    assert '<table id="pairs">' in html and 'class="good">' in html


def test_noise_unknown_with_one_result_per_test(bundles, fake_verify, tmp_path):
    """One result per test on both sides: no interval, `?` in the matrix, never a
    zero-width interval called significant."""
    single = {}
    for name in ("acme", "slowco"):
        single[name] = tmp_path / name
        shutil.copytree(bundles[name], single[name])
        for path in single[name].glob("*.J0.1.*.json"):
            path.unlink()
    t = build_tender([str(single["acme"]), str(single["slowco"])], "rules.json")
    p = t.pairs[("acme", "slowco")]
    assert p.ratio > 2 and p.ci is None and p.sig == "noise unknown"
    assert tender_module.pair_cell(p) == f"{p.ratio:.3f} ?"
    assert "no interval (fewer than 2 results in" in tender_module.render_text(t)


def test_real_verification_never_ranks_the_tampered_bundle_first(bundles, tmp_path, capsys):
    # no fake: milarun verify runs on the three sealed bundles; cheat's records were edited
    # after the seal, so its chain no longer matches them
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"allowed_overrides": ["no_cgexec", "cpu_slots", "extra_args"]}))
    code, io = run_cli(
        [
            "tender",
            *_args(bundles, "cheat", "slowco", "acme"),
            "--rules",
            str(rules),
            "--json",
            str(tmp_path / "t.json"),
        ],
        capsys,
    )
    # BUNDLE arguments carry no head: the best is CONSISTENT, NOT PINNED (exit 3)
    assert code == 3, io.err
    assert "none was pinned" in io.err
    data = json.loads((tmp_path / "t.json").read_text())
    rows = {b["name"]: b for b in data["bidders"]}
    for name in ("acme", "slowco"):
        assert rows[name]["level"] == "CONSISTENT, NOT PINNED", io.out
        assert not rows[name]["verified"] and rows[name]["pinned"] is False
    assert rows["cheat"]["level"] == "NOT VERIFIED" and rows["cheat"]["rank"] is None
    table = [
        line.split()
        for line in io.out.splitlines()
        if len(line.split()) > 2 and line.split()[0] in rows
    ]
    assert [(r[0], r[1]) for r in table][:3] == [("acme", "1"), ("slowco", "2"), ("cheat", "-")]
    assert "integrity.file-changed" in io.out


def test_a_record_outside_the_chain_is_not_scored(bundles, tmp_path, fake_verify):
    # a planted, faster record beside the chained ones: verify names it; the score ignores it
    planted = tmp_path / "planted"
    shutil.copytree(bundles["acme"], planted)
    src = sorted(p for p in planted.glob("*.json") if p.name != "bundle.json")[0]
    extra = planted / src.name.replace(".J0.", ".J7.")
    shutil.copy(src, extra)
    _inflate_one(extra, 50)
    t = build_tender([str(bundles["acme"]), str(planted)], "rules.json")
    by = {b.name: b for b in t.bidders}
    assert by["planted"].score == pytest.approx(by["acme"].score)


def _inflate_one(path, factor):
    rec = json.loads(path.read_text())
    rec["run"] = 7
    for s in rec["timings"]["train"]["samples"]:
        s["count"] *= factor
        s["rate"] *= factor
    path.write_text(json.dumps(rec))


# --- the bidders file: every bidder pinned ---------------------------------------------------

RULES_SIGNED = {
    "allowed_overrides": ["no_cgexec", "cpu_slots", "extra_args"],
    "require_signature": True,
}


def _reseal(folder, private):
    """The bidder's own seal, signed with its own key (an earlier seal removed)."""
    for done in (bundle_path(folder), signature_path(folder)):
        if done.exists():
            done.unlink()
    seal(folder, sign=private, say=lambda line: None)
    return json.loads(bundle_path(folder).read_text())["head"]


def _rewrite_end_to_end(folder, factor=2):
    """Every PASS record ``factor`` times faster, consistently (rates from counts), every
    manifest hash recomputed: what a bidder who owns its folder and its key can do."""
    mpath = manifest_path(folder)
    entries = [json.loads(line) for line in mpath.read_text().splitlines()]
    for e in entries:
        if e["kind"] == "record" and e.get("success"):
            path = folder / e["path"]
            rec = json.loads(path.read_text())
            train = rec["timings"]["train"]
            for s in train["samples"]:
                s["count"] *= factor
                s["rate"] = s["count"] / (s["end"] - s["start"])
            train["count"] *= factor
            path.write_text(json.dumps(rec))
    prev = "0" * 64
    for i, e in enumerate(entries):
        if e.get("path") and (folder / e["path"]).is_file():
            e["sha256"], e["bytes"] = file_digest(folder / e["path"])
        e["seq"], e["prev"] = i, prev
        e["hash"] = prev = entry_hash(e)
    mpath.write_text(
        "".join(json.dumps(e, sort_keys=True, separators=(",", ":")) + "\n" for e in entries)
    )


@pytest.fixture(scope="module")
def signed(bundles, tmp_path_factory):
    """Bidders sealed and signed with their own keys: ``acme`` and ``slowco`` as run;
    ``forger`` (acme's run, rewritten end to end twice as fast and sealed again with its
    own key) and ``acme``'s original head; ``rules``."""
    base = tmp_path_factory.mktemp("signed")
    out = SimpleNamespace(base=base, heads={}, rules=base / "rules.json")
    out.rules.write_text(json.dumps(RULES_SIGNED))
    for name, src in (("acme", "acme"), ("slowco", "slowco"), ("forger", "acme")):
        folder = base / "bids" / name
        shutil.copytree(bundles[src], folder)
        keys.keygen(base / f"{name}.pem", base / f"{name}.pub")
        out.heads[name] = _reseal(folder, base / f"{name}.pem")
    _rewrite_end_to_end(base / "bids" / "forger")
    out.heads["forger-new"] = _reseal(base / "bids" / "forger", base / "forger.pem")
    return out


def _bidders_file(where, bidders, name="bidders.json"):
    path = Path(where) / name
    path.write_text(json.dumps({"version": 1, "bidders": bidders}))
    return path


def _entry(name, folder=None, head=None, key=None, **more):
    e = {"name": name, "bundle": f"bids/{folder or name}"}
    if head:
        e["head"] = head
    if key:
        e["public_key"] = f"{key}.pub"
    return {**e, **more}


def test_bidders_file_pins_every_bidder(signed, capsys):
    """acme pinned and signed: VERIFIED; forger rewritten end to end, re-sealed with its
    own key, pinned to the head it first sent: NOT VERIFIED (the head), never ranked;
    slowco unpinned: CONSISTENT, NOT PINNED, ranked after acme though acme is the
    only pinned one; `require_signature` holds for every correctly signed bidder."""
    path = _bidders_file(
        signed.base,
        [
            _entry("slowco", key="slowco", price=1000, currency="EUR"),
            _entry(
                "forger",
                head=signed.heads["forger"],
                key="forger",
                head_received="2026-11-26T10:49:12Z",
                price=100,
                currency="EUR",
            ),
            _entry(
                "acme",
                head=signed.heads["acme"].upper(),
                key="acme",
                head_received="2026-11-26T10:50:00+01:00",
                price=412000,
                currency="EUR",
            ),
        ],
    )
    out = signed.base / "t.json"
    code, io = run_cli(
        [
            "tender",
            "--bidders",
            str(path),
            "--rules",
            str(signed.rules),
            "--json",
            str(out),
            "--html",
            str(signed.base / "t.html"),
        ],
        capsys,
    )
    assert code == 0, io.err
    data = json.loads(out.read_text())
    rows = {b["name"]: b for b in data["bidders"]}
    assert [b["name"] for b in data["bidders"]] == ["acme", "slowco", "forger"]
    assert rows["acme"]["level"] == "VERIFIED" and rows["acme"]["rank"] == 1
    assert rows["acme"]["signed"] == "yes" and rows["acme"]["pinned"] is True
    assert rows["slowco"]["level"] == "CONSISTENT, NOT PINNED" and rows["slowco"]["rank"] == 2
    assert rows["slowco"]["signed"] == "yes" and rows["slowco"]["pinned"] is False
    assert rows["forger"]["level"] == "NOT VERIFIED" and rows["forger"]["rank"] is None
    assert [c["name"] for c in rows["forger"]["failed"]] == ["integrity.expected-head"]
    # the rewrite is consistent and signed: only the head catches it; it scores best
    assert rows["forger"]["signed"] == "yes"
    assert rows["forger"]["score"] > 1.5 * rows["acme"]["score"]
    # paths resolved against the bidders file's folder; prices folded in
    assert rows["acme"]["bundle"] == str(signed.base / "bids" / "acme")
    assert data["currency"] == "EUR" and rows["acme"]["price"] == 412000
    assert rows["acme"]["price_per_score"] == pytest.approx(412000 / rows["acme"]["score"])
    # the text: levels, signed, the head's arrival, the unpinned mark
    assert _row(io.out, "acme").split()[1:5] == [
        "1",
        "VERIFIED",
        "yes",
        "2026-11-26T10:50:00+01:00",
    ]
    assert _row(io.out, "slowco").split()[1:7] == [
        "2",
        "(unpinned)",
        "CONSISTENT,",
        "NOT",
        "PINNED",
        "yes",
    ]
    assert "forger: not verified:" in io.out and "integrity.expected-head" in io.out
    assert "slowco: CONSISTENT, NOT PINNED: every clause held, but no head" in io.out
    html = (signed.base / "t.html").read_text()
    assert 'class="unpinned" id="bidder-slowco" data-level="CONSISTENT, NOT PINNED"' in html
    assert 'class="verified" id="bidder-acme" data-level="VERIFIED"' in html


def test_require_signature_without_keys_fails_every_bidder(signed, capsys):
    # correctly signed bidders, but no key given: the rules' signature clause fails
    path = _bidders_file(
        signed.base, [_entry("acme", head=signed.heads["acme"])], name="nokey.json"
    )
    code, io = run_cli(["tender", "--bidders", str(path), "--rules", str(signed.rules)], capsys)
    assert code == 1 and "no bidder's bundle verified" in io.err
    assert "integrity.signature" in io.out and "require a signed bundle" in io.out
    assert "1 clause(s) failed  no key" in _row(io.out, "acme")
    # the same bundle under another bidder's key: a bad signature, not ranked
    path = _bidders_file(
        signed.base, [_entry("acme", head=signed.heads["acme"], key="slowco")], name="otherkey.json"
    )
    code, io = run_cli(["tender", "--bidders", str(path), "--rules", str(signed.rules)], capsys)
    assert code == 1 and _row(io.out, "acme").split()[1:5] == ["-", "NOT", "VERIFIED:", "1"]
    assert "BAD" in _row(io.out, "acme")


def test_a_torn_manifest_is_unreadable_not_clauses(signed, tmp_path, capsys):
    torn = tmp_path / "bids" / "torn"
    shutil.copytree(signed.base / "bids" / "acme", torn)
    mpath = manifest_path(torn)
    raw = mpath.read_bytes()
    mpath.write_bytes(raw[: len(raw) - 40])  # cut mid-line
    shutil.copy(signed.base / "acme.pub", tmp_path / "acme.pub")
    path = _bidders_file(tmp_path, [_entry("torn", head=signed.heads["acme"], key="acme")])
    code, io = run_cli(
        [
            "tender",
            "--bidders",
            str(path),
            "--rules",
            str(signed.rules),
            "--json",
            str(tmp_path / "t.json"),
        ],
        capsys,
    )
    assert code == 1
    row = json.loads((tmp_path / "t.json").read_text())["bidders"][0]
    assert (row["level"], row["status"], row["rank"]) == ("unreadable", "unreadable", None)
    assert row["failure_rate"] is None and row["score"] is None and row["failed"] == []
    assert "manifest" in row["error"]
    assert "clause(s) failed" not in io.out and "torn: unreadable: " in io.out


@pytest.mark.parametrize(
    "make, key",
    [
        (
            lambda: {
                "version": 1,
                "bidders": [{"name": "acme", "bundle": "bids/acme", "pirce": 1}],
            },
            "bidders.0.pirce",
        ),
        (
            lambda: {
                "version": 1,
                "bidders": [
                    {"name": "acme", "bundle": "bids/acme"},
                    {"name": "x", "bundle": "bids/nope"},
                ],
            },
            "bidders.1.bundle",
        ),
        (lambda: {"version": 1, "bidders": [{"name": "acme"}]}, "bidders.0.bundle"),
        (
            lambda: {
                "version": 1,
                "bidders": [
                    {"name": "acme", "bundle": "bids/acme"},
                    {"name": "acme", "bundle": "bids/slowco"},
                ],
            },
            "bidders.1.name",
        ),
        (
            lambda: {
                "version": 1,
                "bidders": [{"name": "acme", "bundle": "bids/acme", "head": "xyz" * 21 + "a"}],
            },
            "bidders.0.head",
        ),
        (
            lambda: {
                "version": 1,
                "bidders": [{"name": "acme", "bundle": "bids/acme", "price": 5}],
            },
            "bidders.0.currency",
        ),
        (
            lambda: {
                "version": 1,
                "bidders": [
                    {"name": "acme", "bundle": "bids/acme", "price": 5, "currency": "EUR"},
                    {"name": "b", "bundle": "bids/slowco", "price": 5, "currency": "USD"},
                ],
            },
            "bidders.1.currency",
        ),
        (
            lambda: {
                "version": 1,
                "bidders": [{"name": "acme", "bundle": "bids/acme", "head_received": "2026-11-26"}],
            },
            "bidders.0.head_received",
        ),
        (
            lambda: {
                "version": 1,
                "bidders": [
                    {"name": "acme", "bundle": "bids/acme", "head_received": "2026-11-26T10:00Z"}
                ],
            },
            "bidders.0.head",
        ),
        (
            lambda: {
                "version": 1,
                "bidders": [
                    {
                        "name": "acme",
                        "bundle": "bids/acme",
                        "head": "ab" * 32,
                        "head_received": "2026-13-40T10:00Z",
                    }
                ],
            },
            "bidders.0.head_received",
        ),
        (
            lambda: {
                "version": 1,
                "bidders": [{"name": "acme", "bundle": "bids/acme", "public_key": "nope.pub"}],
            },
            "bidders.0.public_key",
        ),
        (
            lambda: {
                "version": 1,
                "bidders": [{"name": "acme", "bundle": "bids/acme", "public_key": "rules.json"}],
            },
            "bidders.0.public_key",
        ),
        (lambda: {"version": 2, "bidders": []}, "version"),
    ],
)
def test_bad_bidders_file_is_one_line_exit_2(signed, fake_verify, capsys, make, key):
    path = signed.base / "bad-bidders.json"
    path.write_text(json.dumps(make()))
    code, io = run_cli(["tender", "--bidders", str(path), "--rules", str(signed.rules)], capsys)
    assert code == 2, io.err
    assert io.err.startswith(f"milarun: error: {path}: {key}: "), io.err
    assert io.err.count("\n") == 1 and io.out == "" and "Traceback" not in io.err
    assert fake_verify.calls == []  # refused before any bundle is verified


def test_bidders_file_refuses_prices_and_bundle_arguments(signed, fake_verify, capsys):
    path = _bidders_file(signed.base, [_entry("acme")], name="one.json")
    prices = signed.base / "prices.json"
    prices.write_text(json.dumps({"currency": "EUR", "bidders": {"acme": 1}}))
    code, io = run_cli(
        ["tender", "--bidders", str(path), "--rules", "r.json", "--prices", str(prices)], capsys
    )
    assert code == 2 and "--prices folds into --bidders" in io.err
    code, io = run_cli(
        ["tender", str(signed.base / "bids" / "acme"), "--bidders", str(path), "--rules", "r.json"],
        capsys,
    )
    assert code == 2 and "not both" in io.err
    code, io = run_cli(["tender", "--rules", "r.json"], capsys)
    assert code == 2 and "no bidder given" in io.err
    assert fake_verify.calls == []


def test_perf_per_watt_column_only_where_a_report_has_energy():
    """The report's own perf/W (items/J) beside the price columns, only when some bidder's
    records hold GPU energy (the CPU bundles above have none)."""

    def bidder(name, ppw):
        report = SimpleNamespace(
            perf_per_watt=ppw,
            families=[],
            node_score=None,
            score=None,
            score_ci=None,
            node_score_ci=None,
            failure_rate=0.0,
            rpp=None,
            node_rpp=None,
        )
        return tender_module.Bidder(
            name=name, path=name, report=report, verdict=_verdict(name, True)
        )

    t = tender_module.Tender(bidders=[bidder("a", 12.345678), bidder("b", None)], rules="r")
    assert "perf/W (items/J)" in tender_module.columns(t)
    assert tender_module.cells(t, t.bidders[0])["perf/W (items/J)"] == "12.35"
    assert tender_module.cells(t, t.bidders[1])["perf/W (items/J)"] == "-"
    # energy per score point: 1 / 12.345678 items/J = 0.0810 J per point, and in the JSON
    assert "energy / score (J)" in tender_module.columns(t)
    assert tender_module.cells(t, t.bidders[0])["energy / score (J)"] == "0.081"
    assert tender_module.cells(t, t.bidders[1])["energy / score (J)"] == "-"
    t.pairs = {}
    rows = {b["name"]: b for b in tender_module.to_json(t)["bidders"]}
    assert rows["a"]["energy_per_score_j"] == pytest.approx(1 / 12.345678)
    assert rows["b"]["energy_per_score_j"] is None
    t.bidders = [bidder("b", None)]
    assert "perf/W (items/J)" not in tender_module.columns(t)
    assert "energy / score (J)" not in tender_module.columns(t)
