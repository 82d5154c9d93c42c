"""``milarun audit plan|check``: audit reruns of a vendor's bundle.

One real vendor run (``milarun jobs`` on CPU slots, the ``crawl`` workload, which imports
no torch: about 10 s a session) is shared by the module; the round trip plans, reruns the
written audit profile with ``milarun jobs`` and checks, then does it again with the test
slowed on purpose, and with another machine's identity.
"""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from milarun.cli import main
from milarun.formats import manifest as mf
from milarun.verify import audit

ROOT = Path(__file__).resolve().parent.parent

#: Each step sleeps 10 ms (about 1000 items/s); 1 s of steady state after 2 warm-up windows.
PROFILE = {
    "*": {
        "partition_scheme": {"type": "per-gpu", "cgroup": None},
        "timeout": 60,
        "arguments": {"--sample-duration": 0.1, "--warmup": 2, "--max-count": 1, "--min-steady": 1},
    },
    "crawl": {
        "experiment": "milarun.models.faults:crawl",
        "arguments": {"--step-seconds": 0.01, "--per-step": 10},
    },
}

#: A node identity as host/identity.py records it (the session file's
#: ``sessions[i]["identity"][node]``), for the runs made before it recorded one.
IDENTITY = {
    "hostname": "vm",
    "cpu_model": "AMD EPYC",
    "memory_mib": 24105,
    "gpus": [
        {"uuid": "GPU-aaaa", "serial": "1320000000001", "pci_bus_id": "0:1:0.0", "name": "H100"},
        {"uuid": "GPU-bbbb", "serial": "1320000000002", "pci_bus_id": "0:2:0.0", "name": "H100"},
    ],
    "dmi": {"product_uuid": "4c4c4544-0001"},
    "nics": {"eth0": "02:00:00:00:00:01"},
}


def jobs(profile, out, dataroot, *extra):
    """``milarun jobs`` on two CPU slots, without cgroups; the finished process."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "milarun",
            "jobs",
            str(profile),
            "-o",
            str(out),
            "-d",
            str(dataroot),
            "--cpu-slots",
            "2",
            "--no-cgexec",
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def rechain(outdir):
    """Enter again every file of ``outdir``'s manifest as it is now (what a session that
    recorded the identity itself would have entered): new digests, new hashes."""
    path = mf.manifest_path(outdir)
    entries, prev, lines = mf.read_manifest(path), mf.GENESIS, []
    for e in entries:
        if e["kind"] not in mf.EVENTS:
            e["sha256"], e["bytes"] = mf.file_digest(Path(outdir) / e["path"])
        e["prev"] = prev
        e["hash"] = prev = mf.entry_hash(e)
        lines.append(json.dumps(e, sort_keys=True, separators=(",", ":")) + "\n")
    path.write_text("".join(lines))


def set_identity(outdir, identity, force=False, chain=True):
    """Give every session of ``outdir`` ``identity`` for each node its records name (only
    where none is recorded, unless ``force``); re-chain the bundle when asked."""
    path = Path(outdir) / ".milarun" / "session.json"
    data = json.loads(path.read_text())
    changed = False
    for s in data["sessions"]:
        if force or not s.get("identity"):
            s["identity"] = {"vm": identity}
            changed = True
    if changed:
        path.write_text(json.dumps(data))
        if chain:
            rechain(outdir)


@pytest.fixture(scope="module")
def vendor(tmp_path_factory):
    """The vendor's bundle: 2 runs × 2 CPU slots of crawl (4 launches), with an identity."""
    base = tmp_path_factory.mktemp("audit")
    profile = base / "tender.json"
    profile.write_text(json.dumps(PROFILE))
    out = base / "vendor"
    proc = jobs(profile, out, base, "--repeat", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not mf.check_chain(mf.read_manifest(mf.manifest_path(out)))
    # the whole round trip: the vendor seals, the buyer verifies, then plans the audit
    assert json.loads((out / ".milarun" / "session.json").read_text())["sessions"][0]["identity"]
    with pytest.raises(SystemExit) as exc:
        main(["seal", str(out)])
    assert exc.value.code in (0, None)
    head = mf.head_of(mf.read_manifest(mf.manifest_path(out)))
    with pytest.raises(SystemExit) as exc:
        main(["verify", str(out), "--expect-head", head])
    assert exc.value.code == 0
    return base, out


def cli(*argv):
    """``milarun ARGV`` in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    return exc.value.code


def plan(vendor_out, target, sample=2, seed=26, tolerance=None):
    argv = [
        "audit",
        "plan",
        str(vendor_out),
        "--sample",
        str(sample),
        "--seed",
        str(seed),
        "-o",
        str(target),
    ]
    if tolerance is not None:
        argv += ["--tolerance", str(tolerance)]
    return cli(*argv)


def chosen(profile):
    return [
        (c["name"], c["run"], c["device"])
        for c in json.loads(Path(profile).read_text())["_audit"]["chosen"]
    ]


def test_plan_same_seed_same_launches(vendor, tmp_path, capsys):
    base, out = vendor
    assert plan(out, tmp_path / "a.json", seed=5) == 0
    assert plan(out, tmp_path / "b.json", seed=5) == 0
    first = chosen(tmp_path / "a.json")
    assert first == chosen(tmp_path / "b.json") and len(first) == 2
    picks = set()
    for seed in range(12):
        assert plan(out, tmp_path / f"s{seed}.json", seed=seed) == 0
        picks.add(tuple(chosen(tmp_path / f"s{seed}.json")))
    assert len(picks) > 1  # another seed can pick other launches
    # the plan next to the profile is the one embedded in it, with the records' hashes
    embedded = json.loads((tmp_path / "a.json").read_text())
    written = json.loads((tmp_path / "a.plan.json").read_text())
    assert embedded["_audit"] == written
    assert written["seed"] == 5 and written["sample"] == 2 and written["launches"] == 4
    assert written["head"] == mf.head_of(mf.read_manifest(mf.manifest_path(out)))
    for c in written["chosen"]:
        assert mf.file_digest(out / c["record"])[0] == c["sha256"]
    # the job to rerun, with its arguments in the order the vendor's command line had
    assert list(embedded["crawl"]["arguments"]) == [
        "--sample-duration",
        "--warmup",
        "--max-count",
        "--min-steady",
        "--step-seconds",
        "--per-step",
    ]
    assert "milarun jobs" in capsys.readouterr().out
    assert written["review"] == {}  # crawl has no prepare command nor exec_prefix
    # the tender's rules file: its SHA-256 goes in the plan
    rules = tmp_path / "rules.json"
    rules.write_text('{"description": "the tender rules", "min_repeats": 2}')
    assert (
        cli(
            "audit",
            "plan",
            str(out),
            "--sample",
            "1",
            "--seed",
            "5",
            "-o",
            str(tmp_path / "r.json"),
            "--rules",
            str(rules),
        )
        == 0
    )
    recorded = json.loads((tmp_path / "r.plan.json").read_text())["rules"]
    assert recorded["sha256"] == hashlib.sha256(rules.read_bytes()).hexdigest()


def test_round_trip_reproduced_slowed_and_other_machine(vendor, tmp_path, capsys):
    base, out = vendor
    profile = tmp_path / "audit.json"
    assert plan(out, profile, sample=2, seed=3, tolerance=0.25) == 0
    rerun = tmp_path / "rerun"
    proc = jobs(profile, rerun, base)
    assert proc.returncode == 0, proc.stderr[-2000:]
    set_identity(rerun, IDENTITY, chain=False)
    capsys.readouterr()
    report = tmp_path / "check.json"
    assert cli("audit", "check", str(out), str(rerun), "--json", str(report)) == 0
    text = capsys.readouterr().out
    assert "2 of 2 launch(es) reproduced; AUDIT PASSED" in text
    data = json.loads(report.read_text())
    assert data["ok"] is True
    assert [r["verdict"] for r in data["launches"]] == ["reproduced"] * 2
    for r in data["launches"]:
        assert 0.75 < r["ratio"] < 1.33 and r["ratio_ci"][0] < r["ratio"] < r["ratio_ci"][1]
    names = {c["name"] for c in data["clauses"]}
    assert {
        "audit.identity",
        "audit.throughput",
        "audit.command",
        "audit.bundle-head",
        "audit.vendor-record",
    } <= names

    # another machine: the same rerun, with other GPUs in its identity
    other = json.loads(json.dumps(IDENTITY))
    other["gpus"][1]["uuid"], other["gpus"][1]["serial"] = "GPU-cccc", "1320000000009"
    set_identity(rerun, other, force=True, chain=False)
    assert cli("audit", "check", str(out), str(rerun)) == 1
    text = capsys.readouterr().out
    assert "identity: MISMATCH" in text and "GPU-cccc" in text
    verdict, rows, _ = audit.check_audit(out, rerun)
    assert [c.name for c in verdict.failed] == ["audit.identity"]
    assert all(r["verdict"] == "reproduced" for r in rows)

    # the test slowed on purpose: steps of 40 ms instead of 10 (a quarter of the rate)
    slow = tmp_path / "slow"
    proc = jobs(profile, slow, base, "--", "--step-seconds", "0.04")
    assert proc.returncode == 0, proc.stderr[-2000:]
    set_identity(slow, IDENTITY, chain=False)
    verdict, rows, _ = audit.check_audit(out, slow)
    assert [r["verdict"] for r in rows] == ["not reproduced"] * 2
    assert all(0.15 < r["ratio"] < 0.4 for r in rows)
    failed = {c.name for c in verdict.failed}
    assert failed == {"audit.throughput", "audit.command"}
    capsys.readouterr()
    assert cli("audit", "check", str(out), str(slow)) == 1
    assert "not reproduced" in capsys.readouterr().out


def test_check_catches_a_changed_record_and_a_moved_head(vendor, tmp_path, capsys):
    base, out = vendor
    profile = tmp_path / "audit.json"
    assert plan(out, profile, sample=1, seed=1) == 0
    copy = tmp_path / "vendor"
    shutil.copytree(out, copy)
    # an audit folder made by hand: the profile copy and the vendor's own record as the rerun
    rerun = tmp_path / "rerun"
    c = json.loads(profile.read_text())["_audit"]["chosen"][0]
    sid = "20990101-000000-000000"
    (rerun / ".milarun" / f"profile-{sid}").mkdir(parents=True)
    shutil.copy(profile, rerun / ".milarun" / f"profile-{sid}" / "0-audit.json")
    # the same machine: the identity the vendor's session recorded
    ident = json.loads((out / ".milarun" / "session.json").read_text())["sessions"][0]["identity"]
    (rerun / ".milarun" / "session.json").write_text(
        json.dumps(
            {
                "format": "milarun-session",
                "version": 1,
                "invocation": {},
                "sessions": [{"id": sid, "identity": ident}],
            }
        )
    )
    shutil.copy(out / c["record"], rerun / c["record"])
    verdict, rows, _ = audit.check_audit(copy, rerun)
    assert verdict.ok and rows[0]["ratio"] == pytest.approx(1.0)
    # the vendor's record edited after planning: named, not compared
    rec = copy / c["record"]
    rec.write_text(rec.read_text().replace('"run": ', '"run":  ', 1))
    verdict, rows, _ = audit.check_audit(copy, rerun)
    assert [x.name for x in verdict.failed] == ["audit.vendor-record"]
    assert rows[0]["verdict"] == "not compared"
    shutil.copy(out / c["record"], rec)
    # the bundle grew after planning (a resumed session): the head moved
    mf.Manifest(copy, "20990101-000000-000001").event("end", status="done")
    verdict, _, _ = audit.check_audit(copy, rerun)
    assert [x.name for x in verdict.failed] == ["audit.bundle-head"]


def _append_by_hand(outdir, kind, path):
    """Append one manifest entry of ``kind`` for ``path`` to ``outdir``'s chain, in the last
    entry's session, as a bidder's own tools would (hashlib and json, from the documented
    canonical form: the entry without ``hash``, keys sorted, compact)."""
    mpath = Path(outdir) / ".milarun" / "manifest.jsonl"
    entries = [json.loads(line) for line in mpath.read_text().splitlines()]
    data = (Path(outdir) / path).read_bytes()
    last = entries[-1]
    e = {
        "seq": len(entries),
        "session": last["session"],
        "kind": kind,
        "time": last["time"] + 1,
        "path": path,
        "prev": last["hash"],
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
    }
    e["hash"] = hashlib.sha256(
        json.dumps(e, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    ).hexdigest()
    with open(mpath, "a") as f:
        f.write(json.dumps(e, sort_keys=True, separators=(",", ":")) + "\n")


@pytest.mark.parametrize("kind", ["session", "weights"])
def test_check_reads_the_identity_only_from_a_chain_verify_accepts(vendor, tmp_path, kind):
    base, out = vendor
    copy = tmp_path / "vendor"
    shutil.copytree(out, copy)
    # the bidder's session file rewritten with the delivered machine's identity, entered
    # again after its session's end, before the folder is sent
    spath = copy / ".milarun" / "session.json"
    session = json.loads(spath.read_text())
    for s in session["sessions"]:
        s["identity"] = {node: IDENTITY for node in s["identity"]}
    spath.write_text(json.dumps(session))
    _append_by_hand(copy, kind, ".milarun/session.json")
    profile = tmp_path / "audit.json"
    if kind == "weights":  # not the session file's own entry: no audit is planned on it
        assert plan(copy, profile, sample=1, seed=1) == 2
        return
    assert plan(copy, profile, sample=1, seed=1) == 0
    # the rerun, on the delivered machine (IDENTITY): the vendor's own record as its record
    rerun = tmp_path / "rerun"
    c = json.loads(profile.read_text())["_audit"]["chosen"][0]
    sid = "20990101-000000-000000"
    (rerun / ".milarun" / f"profile-{sid}").mkdir(parents=True)
    shutil.copy(profile, rerun / ".milarun" / f"profile-{sid}" / "0-audit.json")
    (rerun / ".milarun" / "session.json").write_text(
        json.dumps(
            {
                "format": "milarun-session",
                "version": 1,
                "invocation": {},
                "sessions": [{"id": sid, "identity": session["sessions"][0]["identity"]}],
            }
        )
    )
    shutil.copy(copy / c["record"], rerun / c["record"])
    verdict, rows, _ = audit.check_audit(copy, rerun)
    failed = {x.name for x in verdict.failed}
    assert {"audit.vendor-record", "audit.identity"} <= failed, [
        (x.name, x.detail) for x in verdict.failed
    ]
    assert any(
        "does not accept" in x.detail for x in verdict.failed if x.name == "audit.vendor-record"
    )
    assert "GPU-aaaa" not in next(x.detail for x in verdict.failed if x.name == "audit.identity")


@pytest.mark.parametrize(
    "plan_entry, key",
    [
        ({"format": "other"}, "_audit.format"),
        (
            {
                "format": "milarun-audit-plan",
                "version": 1,
                "head": "x",
                "tolerance": 2,
                "chosen": [{}],
            },
            "_audit.tolerance",
        ),
        (
            {
                "format": "milarun-audit-plan",
                "version": 1,
                "head": "x",
                "tolerance": 0.1,
                "chosen": [{"name": "a", "job": "a", "run": "0"}],
            },
            "_audit.chosen.0.run",
        ),
    ],
)
def test_check_refuses_a_malformed_audit_plan(vendor, tmp_path, capsys, plan_entry, key):
    base, out = vendor
    sid = "20990101-000000-000000"
    folder = tmp_path / "rerun" / ".milarun" / f"profile-{sid}"
    folder.mkdir(parents=True)
    (folder / "0-audit.json").write_text(json.dumps({"_audit": plan_entry}))
    (folder.parent / "session.json").write_text(
        json.dumps(
            {"format": "milarun-session", "version": 1, "invocation": {}, "sessions": [{"id": sid}]}
        )
    )
    assert cli("audit", "check", str(out), str(tmp_path / "rerun")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"0-audit.json: {key}: " in err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--sample", "5"], "more than the 4 launch(es)"),
        (["--sample", "0"], "--sample must be a whole number >= 1"),
        (["--sample", "-2"], "--sample must be a whole number >= 1"),
        (["--sample", "1", "--tolerance", "1.5"], "--tolerance must be a fraction"),
    ],
)
def test_plan_bad_numbers(vendor, tmp_path, capsys, argv, says):
    base, out = vendor
    assert cli("audit", "plan", str(out), "--seed", "1", "-o", str(tmp_path / "a.json"), *argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("milarun: error: ") and says in err
    assert not (tmp_path / "a.json").exists()


def test_plan_pins_the_head_the_bidder_sent(vendor, tmp_path, capsys):
    """--expect-head: the head received plans the audit and the plan says it was pinned;
    another head (a bundle other than the one bid) or a malformed one plans nothing."""
    base, out = vendor
    head = mf.head_of(mf.read_manifest(mf.manifest_path(out)))
    args = ("audit", "plan", str(out), "--sample", "1", "--seed", "3")
    assert cli(*args, "-o", str(tmp_path / "u.json")) == 0
    assert "not pinned" in capsys.readouterr().out
    assert json.loads((tmp_path / "u.plan.json").read_text())["pinned"] is False
    assert cli(*args, "-o", str(tmp_path / "p.json"), "--expect-head", head.upper()) == 0
    assert f"{head} (pinned: the head you received)" in capsys.readouterr().out
    assert json.loads((tmp_path / "p.plan.json").read_text())["pinned"] is True
    other = "0" * 64
    assert cli(*args, "-o", str(tmp_path / "x.json"), "--expect-head", other) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"chain head is {head}, not {other}" in err
    assert cli(*args, "-o", str(tmp_path / "y.json"), "--expect-head", "abc") == 2
    assert "--expect-head must be 64 hex digits" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "y.json").exists()


def test_bad_inputs_are_one_line(vendor, tmp_path, capsys):
    base, out = vendor
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    path = mf.manifest_path(broken)
    lines = path.read_text().splitlines(keepends=True)
    entry = json.loads(lines[3])
    entry["reason"] = "edited"
    lines[3] = json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n"
    path.write_text("".join(lines))
    bad_rules = tmp_path / "rules.json"
    bad_rules.write_text('{"a": 1, "a": 2}')
    not_rules = tmp_path / "not-rules.json"  # JSON, but not a rules file
    not_rules.write_text('{"format": 5}')
    cases = [
        (
            [
                "audit",
                "plan",
                str(out),
                "--sample",
                "1",
                "--seed",
                "1",
                "-o",
                str(tmp_path / "a.json"),
                "--rules",
                str(not_rules),
            ],
            "format: unknown key",
        ),
        (
            [
                "audit",
                "plan",
                str(out),
                "--sample",
                "1",
                "--seed",
                "1",
                "-o",
                str(tmp_path / "a.json"),
                "--rules",
                str(bad_rules),
            ],
            "duplicate",
        ),
        (
            [
                "audit",
                "plan",
                str(broken),
                "--sample",
                "1",
                "--seed",
                "1",
                "-o",
                str(tmp_path / "a.json"),
            ],
            "the entry was edited",
        ),
        (
            [
                "audit",
                "plan",
                str(tmp_path / "nowhere"),
                "--sample",
                "1",
                "--seed",
                "1",
                "-o",
                str(tmp_path / "a.json"),
            ],
            "not a results folder",
        ),
        (["audit", "check", str(out), str(tmp_path / "nowhere")], "not a results folder"),
        (["audit", "check", str(out), str(out)], "was not run from an audit profile"),
        (["audit", "check", str(broken), str(out)], "the entry was edited"),
        (
            ["audit", "plan", str(out), "--seed", "1", "-o", str(tmp_path / "a.json")],
            "needs --sample",
        ),
        (["audit", "check", str(out)], "takes OUTDIR AUDITDIR"),
        (["audit", "sample", str(out)], "unknown action"),
    ]
    for argv, says in cases:
        assert cli(*argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, (argv, err)
        assert "Traceback" not in err


def test_plan_refuses_a_record_that_names_other_code(vendor, tmp_path, capsys):
    base, out = vendor
    copy = tmp_path / "vendor"
    shutil.copytree(out, copy)
    for rec in copy.glob("*.json"):
        rec.write_text(rec.read_text().replace("milarun.models.faults:crawl", "evil.module:main"))
    rechain(copy)
    assert plan(copy, tmp_path / "a.json", sample=1) == 2
    err = capsys.readouterr().err
    assert "is not a workload of milarun.models" in err and err.count("\n") == 1
    assert "evil" not in sys.modules


def test_plan_refuses_a_record_reached_through_a_link_to_outside(vendor, tmp_path, capsys):
    base, out = vendor
    copy, elsewhere = tmp_path / "vendor", tmp_path / "elsewhere"
    shutil.copytree(out, copy)
    elsewhere.mkdir()
    (copy / "sub").symlink_to(elsewhere)  # every record now lies outside the bundle
    path = mf.manifest_path(copy)
    entries = mf.read_manifest(path)
    for e in entries:
        if e["kind"] == "record":
            shutil.move(copy / e["path"], elsewhere / e["path"])
            e["path"] = f"sub/{e['path']}"
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    rechain(copy)
    assert plan(copy, tmp_path / "a.json", sample=1) == 2
    err = capsys.readouterr().err
    assert "reached through a symbolic link to outside the folder" in err


def test_plan_refuses_a_job_definition_the_profile_copy_lacks(vendor, tmp_path, capsys):
    # a prepare command edited into the records alone would run on the buyer's machine
    base, out = vendor
    copy = tmp_path / "vendor"
    shutil.copytree(out, copy)
    for rec in copy.glob("*.json"):
        data = json.loads(rec.read_text())
        if "job" in data:
            data["job"]["prepare"] = ["touch /tmp/owned"]
            rec.write_text(json.dumps(data))
    rechain(copy)
    assert plan(copy, tmp_path / "a.json", sample=1) == 2
    err = capsys.readouterr().err
    assert "is not the one of the profile its session ran" in err and err.count("\n") == 1
    assert not (tmp_path / "a.json").exists()


# --- the numbers -------------------------------------------------------------------------


def test_compare_rates():
    vendor = (1000.0, (20, 1000.0, 10.0))
    same = audit.compare_rates(vendor, (1001.0, (20, 1001.0, 12.0)))
    assert same["reproduced"] and same["basis"] == "welch"
    assert same["ratio_ci"][0] < 1.001 < same["ratio_ci"][1]
    assert same["vendor_ci"][0] < 1000 < same["vendor_ci"][1]
    # 10 % slower, well outside the noise: past the 5 % tolerance
    slow = audit.compare_rates(vendor, (900.0, (20, 900.0, 10.0)))
    assert not slow["reproduced"] and slow["t"] < 0
    # 3 % slower: significant by itself, but within the tolerance
    assert audit.compare_rates(vendor, (970.0, (20, 970.0, 10.0)))["reproduced"]
    assert not audit.compare_rates(vendor, (970.0, (20, 970.0, 10.0)), tolerance=0)["reproduced"]
    # 10 % slower but as noisy as that: not significant
    assert audit.compare_rates(vendor, (900.0, (3, 900.0, 300.0)))["reproduced"]
    # faster than the claim: reproduced
    assert audit.compare_rates(vendor, (1200.0, (20, 1200.0, 10.0)))["reproduced"]
    # one sample on a side: the ratio against the tolerance
    unknown = audit.compare_rates(vendor, (940.0, (1, 940.0, 0.0)))
    assert unknown["basis"] == "noise unknown" and not unknown["reproduced"]
    assert audit.compare_rates(vendor, (960.0, (1, 960.0, 0.0)))["reproduced"]


def test_compare_identity():
    ok, detail = audit.compare_identity(IDENTITY, json.loads(json.dumps(IDENTITY)))
    assert ok and "2 GPU uuids" in detail
    swapped = json.loads(json.dumps(IDENTITY))
    swapped["gpus"][0]["serial"] = "999"
    ok, detail = audit.compare_identity(IDENTITY, swapped)
    assert not ok and "1320000000001" in detail and "999" in detail
    dmi = json.loads(json.dumps(IDENTITY))
    dmi["dmi"]["product_uuid"] = "other"
    assert not audit.compare_identity(IDENTITY, dmi)[0]
    assert audit.compare_identity(None, IDENTITY) == (False, "identity not recorded in the bundle")
    assert audit.compare_identity(IDENTITY, None) == (False, "identity not recorded in the rerun")
    cpu = {"cpu_model": "X", "gpus": [], "dmi": {}, "nics": {"eth0": "m1", "veth": "m2"}}
    assert audit.compare_identity(cpu, {**cpu, "nics": {"eth0": "m1"}})[0]
    assert not audit.compare_identity(cpu, {**cpu, "nics": {"eth0": "m3"}})[0]
    assert not audit.compare_identity(cpu, {**cpu, "cpu_model": "Y"})[0]
    # GPUs on one side only: not the same machine
    assert not audit.compare_identity(cpu, {**cpu, "gpus": IDENTITY["gpus"]})[0]


def test_identity_from_the_plan_file(tmp_path):
    """A session that put its identity in its plan file (SessionChain.start's ``identity``)
    rather than in the session file: read there, and only when the chain entered that file."""
    sid = "20990101-000000-000000"
    meta = tmp_path / ".milarun"
    meta.mkdir()
    plan_file = meta / f"plan-{sid}.json"
    plan_file.write_text(json.dumps({"format": "milarun-plan", "identity": {"vm": IDENTITY}}))
    session = {"sessions": [{"id": sid}]}
    assert audit.recorded_identity(tmp_path, session, sid, "vm") == IDENTITY
    m = mf.Manifest(tmp_path, sid)
    m.add("plan", plan_file)
    entries = mf.read_manifest(mf.manifest_path(tmp_path))
    assert audit.recorded_identity(tmp_path, session, sid, "vm", entries) == IDENTITY
    plan_file.write_text(json.dumps({"identity": {"vm": {**IDENTITY, "gpus": []}}}))
    assert audit.recorded_identity(tmp_path, session, sid, "vm", entries) is None
    # the session file's identity comes first
    other = {"sessions": [{"id": sid, "identity": {"vm": {"cpu_model": "Z"}}}]}
    assert audit.recorded_identity(tmp_path, other, sid, "vm") == {"cpu_model": "Z"}


def test_check_lists_each_configuration_difference(vendor, tmp_path, capsys):
    """The rerun on the bundle's machine, its kernel changed in its identity's
    configuration: ``audit.config`` fails, naming both values; the rest holds."""
    base, out = vendor
    profile = tmp_path / "audit.json"
    assert plan(out, profile, sample=1, seed=1) == 0
    rerun = tmp_path / "rerun"
    c = json.loads(profile.read_text())["_audit"]["chosen"][0]
    sid = "20990101-000000-000000"
    (rerun / ".milarun" / f"profile-{sid}").mkdir(parents=True)
    shutil.copy(profile, rerun / ".milarun" / f"profile-{sid}" / "0-audit.json")
    ident = json.loads((out / ".milarun" / "session.json").read_text())["sessions"][0]["identity"]
    ((node, mine),) = ident.items()
    assert mine["version"] == 2 and "config" in mine
    delivered = json.loads(json.dumps(mine))
    delivered["config"]["node"]["kernel"] = "0.0.1-delivered"
    (rerun / ".milarun" / "session.json").write_text(
        json.dumps(
            {
                "format": "milarun-session",
                "version": 1,
                "invocation": {},
                "sessions": [{"id": sid, "identity": {node: delivered}}],
            }
        )
    )
    shutil.copy(out / c["record"], rerun / c["record"])
    verdict, rows, _ = audit.check_audit(out, rerun)
    (failed,) = verdict.failed
    assert failed.name == "audit.config" and "0.0.1-delivered delivered" in failed.detail
    assert rows[0]["verdict"] == "reproduced"
    capsys.readouterr()
    assert cli("audit", "check", str(out), str(rerun)) == 1
    assert "FAILED audit.config" in capsys.readouterr().out
