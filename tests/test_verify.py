"""``milarun verify``: a corpus of tampered bundles, each caught by its named clause.

One real bundle is made once per session (:func:`pristine`): ``milarun jobs`` on a tiny
profile (a crawl test that passes and a crash test that fails on purpose, 2 CPU slots,
``--repeat 2``, ``--no-cgexec``), sealed and signed. Each test copies it and applies one
tampering. A naive tampering (a file edited, the manifest left alone) is caught by
integrity; a vendor who also rewrites the chain, the seal and the signature
(:func:`rechain`: the vendor owns the signing key) is caught by the clause that reads
the content: those tests name it.
"""

import base64
import copy
import datetime
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from milarun.analysis.summary import summarize
from milarun.cli import main
from milarun.formats.bundle import bundle_path, signature_path
from milarun.formats.jsonfile import check, read_json
from milarun.formats.manifest import Manifest, entry_hash, file_digest, manifest_path, read_manifest
from milarun.formats.rules import RulesError, read_rules
from milarun.launcher.session import new_session_id, read_session
from milarun.measure.confidence import mean_interval
from milarun.measure.stats import steady_state
from milarun.report.verify import render_html, render_text
from milarun.verify import keys
from milarun.verify.check import launch_key, verify_bundle
from milarun.verify.seal import seal as seal_bundle

PROFILE = {
    "ok": {
        "experiment": "milarun.models.faults:crawl",
        "partition_scheme": {"type": "per-gpu"},
        "arguments": {
            "sample-duration": 0.1,
            "step-seconds": 0.01,
            "warmup": 2,
            "min-steady": 1,
            "max-count": 100,
        },
    },
    "bad": {
        "experiment": "milarun.models.faults:crash",
        "partition_scheme": {"type": "per-gpu"},
        "arguments": {"after": 0.01},
    },
}


# --- the pristine bundle and the tools of a tamperer --------------------------------------

#: The tender's weights the vendor seals with (``milarun seal --weights``).
WEIGHTS_TEXT = '{"tiny.ok": {"weight": 1}, "tiny.bad": {"weight": 1}}\n'
WEIGHTS_SHA = hashlib.sha256(WEIGHTS_TEXT.encode()).hexdigest()


def seal(out, key=None):
    """``milarun seal OUTDIR --sign KEY --weights W``: the real seal; an earlier seal is
    removed first (a tamperer who owns the key re-seals after rewriting the chain)."""
    for done in (bundle_path(out), signature_path(out)):
        if done.exists():
            done.unlink()
    weights = Path(out).parent / "tender-weights.json"
    weights.write_text(WEIGHTS_TEXT)
    seal_bundle(out, sign=key, weights=weights, say=lambda line: None, warn=lambda line: None)


@pytest.fixture(scope="session")
def pristine(tmp_path_factory):
    """``(bundle folder, vendor private key, vendor public key)``: made once."""
    base = tmp_path_factory.mktemp("verify")
    (base / "data").mkdir()
    profile = base / "tiny.json"
    profile.write_text(json.dumps(PROFILE))
    out = base / "bundle"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "milarun",
            "jobs",
            str(profile),
            "--no-cgexec",
            "--cpu-slots",
            "2",
            "--repeat",
            "2",
            "-d",
            str(base / "data"),
            "-o",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 1, proc.stderr  # the crash test fails on purpose
    assert proc.stdout.strip() == "4 passed, 4 failed"
    private, public = base / "vendor.pem", base / "vendor.pub"
    keys.keygen(private, public)
    seal(out, private)
    return out, private, public


@pytest.fixture
def bundle(pristine, tmp_path):
    """A fresh copy of the pristine bundle, with helpers."""
    src, private, public = pristine
    out = tmp_path / "b"
    shutil.copytree(src, out, symlinks=True)
    return Tampered(out, private, public, tmp_path)


class Tampered:
    def __init__(self, out, private, public, tmp):
        self.out, self.private, self.public, self.tmp = out, private, public, tmp

    def records(self, success=None):
        """Paths of the chained records (sorted), optionally only PASS or FAIL ones."""
        out = []
        for e in self.entries():
            if e["kind"] == "record" and (success is None or e["success"] is success):
                out.append(self.out / e["path"])
        return sorted(set(out))

    def entries(self):
        return read_manifest(manifest_path(self.out))

    def write_entries(self, entries, raw_lines=None):
        text = "".join(json.dumps(e, sort_keys=True, separators=(",", ":")) + "\n" for e in entries)
        manifest_path(self.out).write_text(text)

    def edit_json(self, path, fn):
        data = json.loads(path.read_text())
        fn(data)
        path.write_text(json.dumps(data, indent=1))

    def rechain(self, entries=None):
        """What a vendor who doctors everything does: every file entry's digest taken
        from the disk, every hash recomputed, the bundle sealed and signed again."""
        entries = self.entries() if entries is None else entries
        prev = "0" * 64
        for i, e in enumerate(entries):
            if e.get("path") and (self.out / e["path"]).exists():
                e["sha256"], e["bytes"] = file_digest(self.out / e["path"])
            e["seq"], e["prev"] = i, prev
            e["hash"] = entry_hash(e)
            prev = e["hash"]
        self.write_entries(entries)
        seal(self.out, self.private)

    def rules(self, **rules):
        path = self.tmp / "rules.json"
        path.write_text(json.dumps(rules))
        return path

    def verify(self, **kw):
        kw.setdefault("public_key", self.public)
        return verify_bundle(self.out, **kw)


def failed(verdict):
    return {c.name for c in verdict.failed}


def assert_caught(verdict, name):
    assert name in failed(verdict), render_text(verdict)
    assert verdict.exit_code == 1


# --- the untouched bundle ---------------------------------------------------------------------


def test_pristine_bundle_verifies(bundle, capsys):
    head = bundle.entries()[-1]["hash"]
    v = bundle.verify(expect_head=head)
    assert v.ok and v.exit_code == 0, render_text(v)
    assert v.sessions == 1 and v.head == head
    names = {c.name for c in v.clauses}
    for name in (
        "integrity.chain",
        "integrity.signature",
        "integrity.expected-head",
        "completeness.missing",
        "completeness.profile",
        "consistency.sample-rate",
        "consistency.host-facts",
        "consistency.barrier",
    ):
        assert name in names
    # the overrides of this run are listed even without rules
    assert any(o.startswith("no_cgexec:") for o in v.overrides)
    assert any(o.startswith("cpu_slots:") for o in v.overrides)
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "verify",
                str(bundle.out),
                "--expect-head",
                head,
                "--public-key",
                str(bundle.public),
                "--json",
                str(bundle.tmp / "v.json"),
                "--html",
                str(bundle.tmp / "v.html"),
            ]
        )
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.rstrip().splitlines()[-1].startswith("VERIFIED: all ")
    assert json.loads((bundle.tmp / "v.json").read_text())["ok"] is True
    assert 'id="verify-integrity"' in (bundle.tmp / "v.html").read_text()
    # the head the run printed (its end entry) verifies too: seal --weights added one entry
    entries = bundle.entries()
    assert entries[-1]["kind"] == "weights" and entries[-2]["kind"] == "end"
    assert bundle.verify(expect_head=entries[-2]["hash"]).ok
    assert not bundle.verify(expect_head=entries[-3]["hash"]).ok


def test_rules_that_allow_the_runs_overrides_pass(bundle):
    src = read_session(bundle.out)["invocation"]["profile_sha256"]
    rules = bundle.rules(
        profile_sha256=src,
        weights_sha256=WEIGHTS_SHA,
        allowed_overrides=["no_cgexec", "cpu_slots"],
        min_repeats=2,
        milarun_version={"min": "0.1.0", "max": "0.1.99"},
        require_signature=True,
        min_throughput={"tiny.ok": 1.0},
        max_failure_rate=0.5,
        max_node_spread=0.1,
    )
    v = bundle.verify(rules=rules)
    assert v.ok, render_text(v)
    assert {
        "compliance.profile-sha256",
        "performance.min-throughput",
        "performance.failure-rate",
    } <= {c.name for c in v.clauses}


# --- integrity ------------------------------------------------------------------------------


def test_edited_rate_is_a_changed_file(bundle):
    rec = bundle.records(success=True)[0]
    bundle.edit_json(
        rec,
        lambda r: r["timings"]["train"]["samples"][5].update(
            rate=r["timings"]["train"]["samples"][5]["rate"] * 3
        ),
    )
    assert_caught(bundle.verify(), "integrity.file-changed")


def test_edited_rate_with_a_rewritten_chain_is_caught_by_the_samples(bundle):
    rec = bundle.records(success=True)[0]
    bundle.edit_json(
        rec,
        lambda r: r["timings"]["train"]["samples"][5].update(
            rate=r["timings"]["train"]["samples"][5]["rate"] * 3
        ),
    )
    bundle.rechain()
    v = bundle.verify()
    assert "integrity.file-changed" not in failed(v)
    assert_caught(v, "consistency.sample-rate")


def test_inflated_counts_with_a_rewritten_chain_are_caught(bundle):
    def inflate(r):
        for s in r["timings"]["train"]["samples"]:
            s["count"] *= 2
            s["rate"] = s["count"] / (s["end"] - s["start"])

    bundle.edit_json(bundle.records(success=True)[0], inflate)
    bundle.rechain()
    v = bundle.verify()
    assert "consistency.sample-rate" not in failed(v)
    assert_caught(v, "consistency.counts")


def test_deleted_fail_record_is_missing(bundle):
    bundle.records(success=False)[0].unlink()
    assert_caught(bundle.verify(), "integrity.file-missing")


def test_deleted_fail_record_and_its_entry_is_a_missing_launch(bundle):
    gone = bundle.records(success=False)[0]
    gone.unlink()
    name = gone.relative_to(bundle.out).as_posix()
    bundle.rechain([e for e in bundle.entries() if e.get("path") != name])
    v = bundle.verify()
    assert not {"integrity.chain", "integrity.file-missing"} & failed(v)
    assert_caught(v, "completeness.missing")


def test_renamed_file_is_missing_and_unchained(bundle):
    rec = bundle.records(success=False)[0]
    rec.rename(rec.with_name(rec.name.replace(".FAIL", "")))
    v = bundle.verify()
    assert_caught(v, "integrity.file-missing")
    assert_caught(v, "integrity.unchained-file")


def test_result_file_outside_the_chain_is_named(bundle):
    (bundle.out / "more").mkdir()
    shutil.copy(bundle.records(success=True)[0], bundle.out / "more" / "best.json")
    v = bundle.verify()
    assert_caught(v, "integrity.unchained-file")
    assert any("more/best.json" in c.paths for c in v.failed)


def test_a_fifo_named_like_a_record_outside_the_chain_is_named_not_opened(bundle):
    fifo = bundle.out / bundle.records(success=True)[0].name.replace(".J0.", ".J9.")
    os.mkfifo(fifo)
    t0 = time.monotonic()
    v = bundle.verify()
    assert time.monotonic() - t0 < 30  # never opened: a reader would block
    assert_caught(v, "integrity.unchained-file")
    assert fifo.name in render_text(v)


def test_a_record_reached_through_a_folder_link_to_outside_is_not_read(bundle):
    elsewhere = bundle.tmp / "elsewhere"
    elsewhere.mkdir()
    (bundle.out / "sub").symlink_to(elsewhere)
    rec = bundle.records(success=True)[0]
    shutil.move(rec, elsewhere / rec.name)
    entries = bundle.entries()
    for e in entries:
        if e.get("path") == rec.name:
            e["path"] = f"sub/{rec.name}"
    bundle.rechain(entries)
    v = bundle.verify()
    assert_caught(v, "integrity.file-changed")
    assert "reached through a symbolic link to outside the folder" in render_text(v)


def test_a_summary_outside_the_chain_is_not_result_like(bundle):
    rec = json.loads(bundle.records(success=True)[0].read_text())
    (bundle.out / "summary.json").write_text(json.dumps(summarize([rec])))
    assert bundle.verify().ok
    (bundle.out / "summary.json").write_text(json.dumps({"format": "milarun-summarY"}))
    assert_caught(bundle.verify(), "integrity.unchained-file")


def test_reordered_chain_is_broken(bundle):
    lines = manifest_path(bundle.out).read_text().splitlines(keepends=True)
    lines[4], lines[5] = lines[5], lines[4]
    manifest_path(bundle.out).write_text("".join(lines))
    assert_caught(bundle.verify(), "integrity.chain")


def test_truncated_manifest_is_a_failed_clause_not_an_error(bundle, capsys):
    raw = manifest_path(bundle.out).read_bytes()
    manifest_path(bundle.out).write_bytes(raw[:-40])
    v = bundle.verify()
    assert_caught(v, "integrity.manifest")
    with pytest.raises(SystemExit) as exit_:
        main(["verify", str(bundle.out)])
    assert exit_.value.code == 1
    assert "FAIL  integrity.manifest:" in capsys.readouterr().out


def test_edited_entry_with_its_own_hash_recomputed_breaks_the_chain_after_it(bundle):
    entries = bundle.entries()
    entries[3]["success"] = not entries[3].get("success")
    entries[3]["hash"] = entry_hash(entries[3])
    bundle.write_entries(entries)
    v = bundle.verify()
    assert_caught(v, "integrity.chain")
    assert "entry 4" in next(c.detail for c in v.failed if c.name == "integrity.chain")


def test_bundle_weights_hash_that_is_not_the_chained_copys(bundle):
    # a re-signed bundle.json claiming the tender's weights over another weights copy
    bundle.edit_json(bundle_path(bundle.out), lambda b: b.update(weights_sha256="cd" * 32))
    (bundle.out / "bundle.json.sig").write_text(
        keys.sign(bundle_path(bundle.out).read_bytes(), bundle.private)
    )
    v = bundle.verify(public_key=bundle.public)
    assert "integrity.signature" not in failed(v)
    assert_caught(v, "integrity.bundle-head")
    assert "weights copy" in next(c.detail for c in v.failed if c.name == "integrity.bundle-head")


def test_appended_fake_entry_does_not_match_the_seal(bundle):
    entries = bundle.entries()
    end = next(e for e in reversed(entries) if e["kind"] == "end")  # the head sent at the end
    fake = dict(end, seq=len(entries), prev=entries[-1]["hash"], passed=99)
    fake["hash"] = entry_hash(fake)
    bundle.write_entries(entries + [fake])
    v = bundle.verify(expect_head=end["hash"])
    assert "integrity.chain" not in failed(v)
    assert_caught(v, "integrity.bundle-head")
    assert_caught(v, "integrity.expected-head")


def test_deleted_log_is_missing(bundle):
    next((bundle.out / "logs").glob("*.log")).unlink()
    assert_caught(bundle.verify(), "integrity.file-missing")


def test_wrong_expected_head(bundle):
    assert_caught(bundle.verify(expect_head="0" * 64), "integrity.expected-head")


def test_forged_signature(bundle):
    other = bundle.tmp / "other.pem"
    keys.keygen(other, bundle.tmp / "other.pub")
    signature_path(bundle.out).write_text(keys.sign(bundle_path(bundle.out).read_bytes(), other))
    assert_caught(bundle.verify(), "integrity.signature")


def test_bundle_file_edited_after_signing(bundle):
    bundle.edit_json(bundle_path(bundle.out), lambda b: b.update(sealed="2020-01-01T00:00:00Z"))
    v = bundle.verify()
    assert "integrity.bundle-head" not in failed(v)
    assert_caught(v, "integrity.signature")


def test_unsealed_folder(bundle):
    bundle_path(bundle.out).unlink()
    assert_caught(bundle.verify(public_key=None), "integrity.bundle-head")


def test_signature_required_by_the_rules(bundle):
    assert_caught(
        bundle.verify(public_key=None, rules=bundle.rules(require_signature=True)),
        "integrity.signature",
    )


# --- completeness ------------------------------------------------------------------------------


def test_extra_record_from_another_session(bundle):
    src = bundle.records(success=True)[0]
    stamp = src.name.rsplit(".", 2)[-2]
    other = src.with_name(src.name.replace(stamp, "20261101-090000-000000"))
    shutil.copy(src, other)
    entries = bundle.entries()
    twin = dict(next(e for e in entries if e.get("path") == src.name), path=other.name)
    bundle.rechain(entries[:-1] + [twin, entries[-1]])
    v = bundle.verify()
    assert "integrity.unchained-file" not in failed(v)
    assert_caught(v, "completeness.extra")


def test_duplicated_launch(bundle):
    entries = bundle.entries()
    first = next(e for e in entries if e["kind"] == "record" and e["success"])
    bundle.rechain(entries[:-1] + [dict(first), entries[-1]])
    assert_caught(bundle.verify(), "completeness.duplicate")


def test_record_that_is_not_its_entrys_launch(bundle):
    bundle.edit_json(bundle.records(success=True)[0], lambda r: r.update(run=7))
    bundle.rechain()
    assert_caught(bundle.verify(), "completeness.record-launch")


def test_edited_profile_copy(bundle):
    copy_ = next((bundle.out / ".milarun").glob("profile-*/0-*.json"))
    bundle.edit_json(copy_, lambda p: p["ok"]["arguments"].update({"max-count": 1}))
    bundle.rechain()
    v = bundle.verify()
    assert "integrity.file-changed" not in failed(v)
    assert_caught(v, "completeness.profile")


def test_plan_without_a_launch_of_the_profile(bundle):
    plan = next((bundle.out / ".milarun").glob("plan-*.json"))
    gone = [r for r in bundle.records() if ".J1.1." in r.name]
    bundle.edit_json(
        plan,
        lambda p: p.update(
            launches=[lch for lch in p["launches"] if (lch["run"], lch["device"]) != (1, "1")]
        ),
    )
    for r in gone:
        r.unlink()
    names = {r.name for r in gone} | {f"logs/{r.name}" for r in gone}
    bundle.rechain(
        [
            e
            for e in bundle.entries()
            if not (e.get("launch") and (e["launch"]["run"], e["launch"]["device"]) == (1, "1"))
        ]
    )
    v = bundle.verify()
    assert names and not {"completeness.missing", "integrity.file-missing"} & failed(v)
    assert_caught(v, "completeness.profile-jobs")


def test_plan_rewritten_without_a_device_is_caught_against_the_recorded_devices(bundle):
    # a vendor drops device 1 from every test: its records, their entries and its launches
    # in the plan, then re-chains and re-seals; the plan is self-consistent (every run of
    # every test on every device it names), but the session recorded devices 0 and 1
    plan = next((bundle.out / ".milarun").glob("plan-*.json"))
    bundle.edit_json(
        plan, lambda p: p.update(launches=[lch for lch in p["launches"] if lch["device"] != "1"])
    )
    gone = [r for r in bundle.records() if read_json(r)["device"] == "1"]
    for r in gone:
        r.unlink()
    entries = [
        e for e in bundle.entries() if not (e.get("launch") and e["launch"]["device"] == "1")
    ]
    for e in entries:
        if e["kind"] == "end":
            e["passed"], e["failed"] = e["passed"] // 2, e["failed"] // 2
    bundle.rechain(entries)
    v = bundle.verify()
    assert gone and not {
        "completeness.missing",
        "completeness.tally",
        "integrity.file-missing",
    } & failed(v), render_text(v)
    assert_caught(v, "completeness.profile-jobs")
    assert "recorded devices give 0, 1" in render_text(v)


def _fail_to_pass(bundle, content=None, rename=False):
    """Make the first FAIL record say it passed (its content replaced by ``content(fail
    record, pass record)`` when given), renamed to its PASS name with ``rename``, its entry
    and the session's tally edited to match, the chain rewritten and re-sealed."""
    bad, good = bundle.records(success=False)[0], bundle.records(success=True)[0]
    data = read_json(bad)
    data = content(data, read_json(good)) if content else dict(data, success=True, error=None)
    new = bad.with_name(bad.name.replace(".FAIL", "")) if rename else bad
    bad.unlink()
    new.write_text(json.dumps(data))
    entries = bundle.entries()
    for e in entries:
        if e.get("path") == bad.name:
            e["success"], e["path"] = True, new.name
        if e["kind"] == "end":
            e["passed"], e["failed"] = e["passed"] + 1, e["failed"] - 1
    bundle.rechain(entries)
    v = bundle.verify()
    assert not {"completeness.tally", "integrity.file-changed"} & failed(v), render_text(v)
    return v


def test_fail_record_flipped_to_success_is_caught(bundle):
    assert_caught(_fail_to_pass(bundle), "completeness.record-launch")


def test_fail_record_renamed_to_its_pass_name_without_samples_is_caught(bundle):
    v = _fail_to_pass(bundle, rename=True)
    assert "completeness.record-launch" not in failed(v)
    assert_caught(v, "consistency.counts")


def test_fail_record_replaced_by_a_copy_of_a_pass_record_is_caught(bundle):
    def forge(bad, good):
        keep = ("name", "job_name", "job_id", "run", "device", "devices", "call", "job")
        return dict(good, **{k: bad[k] for k in keep})

    v = _fail_to_pass(bundle, content=forge, rename=True)
    assert not {"completeness.record-launch", "consistency.counts"} & failed(v)
    assert_caught(v, "consistency.sample-copy")


def test_a_job_definition_edited_in_the_records_alone_is_caught(bundle):
    # what an audit would rerun on the buyer's side: a prepare command the profile lacks
    for rec in bundle.records():
        bundle.edit_json(rec, lambda r: r["job"].update(prepare=["touch /tmp/owned"]))
    bundle.rechain()
    v = bundle.verify()
    assert_caught(v, "completeness.profile-jobs")
    assert "another job definition than the recorded profile's" in render_text(v)


def resume(bundle, rerun_passed=False, resume_flag=True):
    """Append a second session to the bundle as ``milarun jobs --resume`` does, through the
    manifest writer itself: the session file, a profile copy, a plan of the launches to
    rerun (the failed ones, or with ``rerun_passed`` one that passed), their new records
    (the first session's, re-stamped and moved into this session's time), the end."""
    sid = new_session_id()[0]
    out = bundle.out
    meta = out / ".milarun"
    chain = Manifest(out, sid)
    bundle.edit_json(
        meta / "session.json",
        lambda s: s["sessions"].append(
            {"id": sid, "pid": 1, "resume": resume_flag, "started": "2026-11-26T12:00:00+00:00"}
        ),
    )
    chain.add("session", meta / "session.json", resume=resume_flag)
    first_plan = next(meta.glob("plan-*.json"))
    old_sid = first_plan.stem[len("plan-") :]
    (meta / f"profile-{sid}").mkdir()
    for src in (meta / f"profile-{old_sid}").iterdir():
        shutil.copy(src, meta / f"profile-{sid}" / src.name)
        chain.add("profile", meta / f"profile-{sid}" / src.name)
    plan = json.loads(first_plan.read_text())
    records = {launch_key(json.loads(r.read_text())): r for r in bundle.records()}
    wanted = [
        lch for lch in plan["launches"] if ("FAIL" in records[launch_key(lch)].name) != rerun_passed
    ][:2]
    for lch in wanted:
        lch["result"] = lch["result"].replace(old_sid, sid)
        lch["fail"] = lch["fail"].replace(old_sid, sid)
    plan.update(session=sid, resume=resume_flag, launches=wanted, skipped=[])
    (meta / f"plan-{sid}.json").write_text(json.dumps(plan))
    chain.add("plan", meta / f"plan-{sid}.json")
    for lch in wanted:
        rec = json.loads(records[launch_key(lch)].read_text())
        shift = time.time() - rec["timings"]["program"]["start"]
        for key in ("start", "end", "origin"):
            rec["timings"]["program"][key] += shift
        rec["timings"].pop("barrier", None)
        name = lch["fail"] if not rec["success"] else lch["result"]
        (out / name).write_text(json.dumps(rec))
        chain.add(
            "record",
            out / name,
            launch={"name": lch["name"], "run": lch["run"], "device": lch["device"]},
            success=rec["success"],
            reason=None,
        )
    chain.event("end", status="complete", passed=0, failed=len(wanted), interrupted=0, unchained=0)
    seal(out, bundle.private)
    return sid


def test_a_resumed_session_that_reran_failures_verifies(bundle):
    sid = resume(bundle)
    v = bundle.verify()
    assert v.ok, render_text(v)
    assert v.sessions == 2
    assert f"{sid} (--resume)" in next(
        c.detail for c in v.clauses if c.name == "completeness.sessions"
    )


def test_every_session_shows_when_it_ended_and_the_head_it_printed(bundle):
    # what a buyer compares with the heads a vendor sent (a run kept out of two is not sent)
    resume(bundle)
    detail = next(c.detail for c in bundle.verify().clauses if c.name == "completeness.sessions")
    ends = [e for e in bundle.entries() if e["kind"] == "end"]
    assert len(ends) == 2
    for e in ends:
        when = datetime.datetime.fromtimestamp(e["time"], datetime.timezone.utc)
        assert f"ended {when:%Y-%m-%d %H:%M:%S} UTC, head {e['hash']}" in detail


def test_a_second_session_without_resume_is_a_duplicate(bundle):
    resume(bundle, resume_flag=False)
    assert_caught(bundle.verify(), "completeness.duplicate")


def test_a_resume_that_reran_a_passed_launch_is_a_duplicate(bundle):
    resume(bundle, rerun_passed=True)
    assert_caught(bundle.verify(), "completeness.duplicate")


def test_end_tally_that_is_not_the_chains(bundle):
    entries = bundle.entries()
    end = next(e for e in reversed(entries) if e["kind"] == "end")
    end["passed"] += 1
    end["failed"] -= 1
    bundle.rechain(entries)
    assert_caught(bundle.verify(), "completeness.tally")


def test_session_id_that_is_not_its_start(bundle):
    entries = bundle.entries()
    for e in entries:
        e["time"] -= 3600
    bundle.rechain(entries)
    v = bundle.verify()
    assert_caught(v, "consistency.session-time")
    assert any("its id is not the time its first entry was written" in c.detail for c in v.failed)


# --- compliance --------------------------------------------------------------------------------


def test_changed_profile_hash(bundle):
    assert_caught(
        bundle.verify(rules=bundle.rules(profile_sha256="12" * 32)), "compliance.profile-sha256"
    )


def test_changed_weights_hash(bundle):
    assert_caught(
        bundle.verify(rules=bundle.rules(weights_sha256="12" * 32)), "compliance.weights-sha256"
    )


def test_double_dash_override(bundle):
    bundle.edit_json(
        bundle.out / ".milarun" / "session.json",
        lambda s: s["invocation"].update(extra_args=["--batch-size", "4096"]),
    )
    bundle.rechain()
    v = bundle.verify()
    assert v.ok and any(o.startswith("extra_args: -- --batch-size 4096") for o in v.overrides)
    v = bundle.verify(rules=bundle.rules(allowed_overrides=["no_cgexec", "cpu_slots"]))
    assert_caught(v, "compliance.extra-args")
    assert v.overrides and failed(v) == {"compliance.extra-args"}


def test_cgroups_off(bundle):
    v = bundle.verify(rules=bundle.rules(allowed_overrides=["cpu_slots"]))
    assert_caught(v, "compliance.no-cgexec")
    assert "compliance.cpu-slots" not in failed(v)


def test_record_run_with_other_arguments_than_its_plan(bundle):
    bundle.edit_json(
        bundle.records(success=True)[0],
        lambda r: r["call"]["argv"].extend(["--step-seconds", "0.001"]),
    )
    bundle.rechain()
    v = bundle.verify(rules=bundle.rules(allowed_overrides=["no_cgexec", "cpu_slots"]))
    assert any(o.startswith("argv:") for o in v.overrides)
    assert_caught(v, "compliance.argv")


def test_too_few_repeats(bundle):
    assert_caught(bundle.verify(rules=bundle.rules(min_repeats=3)), "compliance.repeats")


def test_milarun_version_out_of_range(bundle):
    assert_caught(
        bundle.verify(rules=bundle.rules(milarun_version={"min": "0.2"})),
        "compliance.milarun-version",
    )


def test_dataset_preset_of_the_profile(bundle):
    copy_ = next((bundle.out / ".milarun").glob("profile-*/0-*.json"))
    bundle.edit_json(
        copy_,
        lambda p: p["ok"].update(prepare=["{milarun} dataset mnist --size tiny -d {dataroot}"]),
    )
    entry = read_session(bundle.out)
    bundle.edit_json(
        bundle.out / ".milarun" / "session.json",
        lambda s: s["invocation"].update(profile_sha256=file_digest(copy_)[0]),
    )
    bundle.rechain()
    v = bundle.verify(rules=bundle.rules(dataset_preset="standard"))
    assert entry and "completeness.profile" not in failed(v)
    assert_caught(v, "compliance.datasets")
    assert "compliance.datasets" not in failed(
        bundle.verify(rules=bundle.rules(dataset_preset="tiny"))
    )


# --- consistency -------------------------------------------------------------------------------


def test_samples_moved_outside_the_program(bundle):
    def shift(r):
        for s in r["timings"]["train"]["samples"]:
            s["start"] += 100
            s["end"] += 100

    bundle.edit_json(bundle.records(success=True)[0], shift)
    bundle.rechain()
    assert_caught(bundle.verify(), "consistency.sample-window")


def test_samples_reordered(bundle):
    bundle.edit_json(
        bundle.records(success=True)[0], lambda r: r["timings"]["train"]["samples"].reverse()
    )
    bundle.rechain()
    assert_caught(bundle.verify(), "consistency.sample-order")


def test_record_from_another_time(bundle):
    def older(r):
        for key in ("start", "end", "origin"):
            r["timings"]["program"][key] -= 86400
        r["timings"]["barrier"]["released"] -= 86400

    bundle.edit_json(bundle.records(success=True)[0], older)
    bundle.rechain()
    assert_caught(bundle.verify(), "consistency.session-time")


def test_barrier_release_out_of_its_wave(bundle):
    bundle.edit_json(
        bundle.records(success=True)[0],
        lambda r: r["timings"]["barrier"].update(released=r["timings"]["barrier"]["released"] + 30),
    )
    bundle.rechain()
    assert_caught(bundle.verify(), "consistency.barrier")


def test_record_from_another_host(bundle):
    bundle.edit_json(
        bundle.records(success=True)[0], lambda r: r["host"].update(hostname="faster-box")
    )
    bundle.rechain()
    assert_caught(bundle.verify(), "consistency.host-facts")


def test_other_cpu_in_one_record(bundle):
    bundle.edit_json(
        bundle.records(success=True)[-1], lambda r: r["host"].update(cpu_model="Faster CPU 9999")
    )
    bundle.rechain()
    assert_caught(bundle.verify(), "consistency.host-facts")


def _gpus(r, uuids=("GPU-1111", "GPU-2222")):
    r["host"]["gpus"] = [
        {"index": i, "name": "NVIDIA H100 80GB HBM3", "uuid": u, "memory_total_mib": 81559}
        for i, u in enumerate(uuids)
    ]


def test_swapped_gpu_uuid(bundle):
    for rec in bundle.records():
        bundle.edit_json(rec, _gpus)
    bundle.rechain()
    assert bundle.verify().ok  # the same GPUs in every record: consistent
    bundle.edit_json(bundle.records(success=True)[1], lambda r: _gpus(r, ("GPU-1111", "GPU-9999")))
    bundle.rechain()
    v = bundle.verify()
    assert_caught(v, "consistency.host-facts")
    assert "GPU-9999" in next(c.detail for c in v.failed)


def test_gpu_uuid_not_in_the_sessions_identity(bundle):
    for rec in bundle.records():
        bundle.edit_json(rec, _gpus)
    hostname = json.loads(bundle.records()[0].read_text())["host"]["hostname"]
    bundle.edit_json(
        bundle.out / ".milarun" / "session.json",
        lambda s: s["sessions"][0].update(
            identity={
                hostname: {
                    "hostname": hostname,
                    "gpus": [{"uuid": "GPU-1111"}, {"uuid": "GPU-3333"}],
                }
            }
        ),
    )
    bundle.rechain()
    v = bundle.verify()
    assert_caught(v, "consistency.host-facts")
    assert "GPU-2222" in " ".join(c.detail for c in v.failed)


def _monitor(r, inflate=0.0):
    """A realistic GPU monitor: one reading a second over the run, 300 W, its energy counter."""
    program = r["timings"]["program"]
    t0, t1 = program["start"] - program["origin"], program["end"] - program["origin"]
    samples, t, joules = [], t0, 1e6
    while t <= t1 + 1:
        samples.append(
            {
                "t": t,
                "device": 0,
                "load": 0.97,
                "memory_mib": 40000.0,
                "temperature": 61,
                "power": 300.0,
                "energy": joules,
            }
        )
        t += 0.25
        joules += 300.0 * 0.25
    samples[-1]["energy"] += inflate
    r["gpu_monitor"] = {"available": True, "reason": None, "interval": 0.25, "samples": samples}


def test_inflated_energy_counter(bundle):
    rec = bundle.records(success=True)[0]
    bundle.edit_json(rec, _monitor)
    bundle.rechain()
    v = bundle.verify()
    assert v.ok, render_text(v)
    assert "1 GPU series" in next(c.detail for c in v.clauses if c.name == "consistency.energy")
    bundle.edit_json(rec, lambda r: _monitor(r, inflate=5e5))
    bundle.rechain()
    assert_caught(bundle.verify(), "consistency.energy")


def test_energy_counter_going_back(bundle):
    def back(r):
        _monitor(r)
        r["gpu_monitor"]["samples"][2]["energy"] += 1e4

    bundle.edit_json(bundle.records(success=True)[0], back)
    bundle.rechain()
    assert_caught(bundle.verify(), "consistency.energy")


# --- performance -------------------------------------------------------------------------------


def test_min_throughput_is_judged_on_the_lower_bound(bundle):
    rates = [
        steady_state(json.loads(rec.read_text())["timings"]["train"]["samples"])[0]
        for rec in bundle.records(success=True)
    ]
    mean = statistics.mean(rates)
    lower = mean_interval(len(rates), mean, statistics.stdev(rates)).lo
    assert lower < mean
    v = bundle.verify(rules=bundle.rules(min_throughput={"tiny.ok": lower * 0.99}))
    assert "performance.min-throughput" not in failed(v)
    # the mean is above this floor, the interval's lower bound is not: it fails
    v = bundle.verify(
        rules=bundle.rules(min_throughput={"tiny.ok": (lower + mean) / 2, "tiny.absent": 1.0})
    )
    assert_caught(v, "performance.min-throughput")
    assert sum(c.name == "performance.min-throughput" for c in v.failed) == 2


def test_failure_rate(bundle):
    assert_caught(
        bundle.verify(rules=bundle.rules(max_failure_rate=0.25)), "performance.failure-rate"
    )
    assert "performance.failure-rate" not in failed(
        bundle.verify(rules=bundle.rules(max_failure_rate=0.5))
    )


def test_node_power_envelope(bundle):
    for rec in bundle.records(success=True):
        bundle.edit_json(rec, _monitor)
    bundle.rechain()
    assert "performance.node-power" not in failed(
        bundle.verify(rules=bundle.rules(max_node_power_w=700))
    )
    assert_caught(bundle.verify(rules=bundle.rules(max_node_power_w=500)), "performance.node-power")


def test_acceptance_thresholds_reuse_the_report_verdict(bundle):
    v = bundle.verify(rules=bundle.rules(acceptance={"burn": {"data_corruption": False}}))
    assert_caught(v, "performance.acceptance")
    assert "no burn results" in next(
        c.detail for c in v.failed if c.name == "performance.acceptance"
    )


def test_hostile_plan_and_session_are_failed_clauses_not_errors(bundle):
    plan = next((bundle.out / ".milarun").glob("plan-*.json"))

    def garble(p):
        p["launches"][0].update(name=["a", {"b": 1}], nodes=7, test_argv=3, device=None)
        p["launches"][1].update(run=[1])
        p["skipped"] = [[["x"], {}, None], "junk"]
        p["identity"] = {"vm": {"gpus": 5, "hostname": ["vm"]}}

    bundle.edit_json(plan, garble)
    bundle.edit_json(
        bundle.out / ".milarun" / "session.json",
        lambda s: (
            s["invocation"].update(extra_args={"x": 1}, names="ok", repeat="2"),
            s["sessions"][0].update(identity=[1, 2]),
        ),
    )
    bundle.rechain()
    v = bundle.verify(rules=bundle.rules(min_repeats=2, dataset_preset="tiny"))
    assert v.exit_code == 1
    assert not [c.name for c in v.clauses if c.name.endswith(".error")], render_text(v)
    assert {
        "completeness.missing",
        "completeness.extra",
        "completeness.profile-jobs",
        "compliance.repeats",
    } <= failed(v)


# --- bad input, renderers, the rules file ----------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda b: ["--rules", str(b.rules(min_repeats=0))], "min_repeats: must be a whole number"),
        (lambda b: ["--rules", str(b.tmp / "absent.json")], "absent.json"),
        (lambda b: ["--public-key", str(b.rules())], "not a PEM public key"),
        (lambda b: ["--expect-head", "xyz"], "--expect-head must be 64 hex digits"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(bundle, capsys, make, message):
    with pytest.raises(SystemExit) as exit_:
        main(["verify", str(bundle.out), *make(bundle)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("milarun: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_text_lists_failures_first_and_html_escapes(bundle):
    bundle.edit_json(
        bundle.out / ".milarun" / "session.json",
        lambda s: s["invocation"].update(extra_args=["<script>"]),
    )
    bundle.rechain()
    rec = bundle.records(success=True)[0]
    rec.write_text(rec.read_text() + " ")
    v = bundle.verify()
    lines = render_text(v).splitlines()
    section = lines[lines.index(next(ln for ln in lines if ln.startswith("integrity:"))) + 1 :]
    assert section[0].startswith("  FAIL  integrity.file-changed:")
    assert lines[-1].startswith("NOT VERIFIED: 1 of ")
    html = render_html(v)
    assert "&lt;script&gt;" in html and "<script>" not in html


def test_example_rules_file_is_valid():
    rules = read_rules(ROOT / "docs" / "examples" / "tender-rules.json")
    documented = (ROOT / "docs" / "tender.md").read_text()
    for key in read_json(ROOT / "milarun" / "formats" / "schemas" / "rules.schema.json")[
        "properties"
    ]:
        assert f"`{key}`" in documented, key
    assert rules["require_signature"] is True
    bad = copy.deepcopy(rules)
    bad["max_failure_rate"] = 2
    with pytest.raises(RulesError, match="max_failure_rate: must be a fraction"):
        check(bad, "rules", path="tender-rules.json", error_cls=RulesError)


# --- after the head: what a bidder's own tools can append -----------------------------------
#
# These forgeries are made the way a dishonest bidder's tools would make them: from the
# documented formats (the manifest's canonical entry, bundle.json, an Ed25519 signature in
# base64), with hashlib, json and cryptography, not milarun's hashing or sealing helpers.


def _forged_digest(path):
    data = Path(path).read_bytes()
    return hashlib.sha256(data).hexdigest(), len(data)


def _forged_hash(entry):
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    ).hexdigest()


def _forged_entries(out):
    return [
        json.loads(line)
        for line in (Path(out) / ".milarun" / "manifest.jsonl").read_text().splitlines()
    ]


def _forged_chain(out, entries):
    """Every entry's file digest taken from the disk, every hash recomputed, written."""
    prev = "0" * 64
    for i, e in enumerate(entries):
        if e.get("path") and (Path(out) / e["path"]).is_file():
            e["sha256"], e["bytes"] = _forged_digest(Path(out) / e["path"])
        e["seq"], e["prev"] = i, prev
        e["hash"] = prev = _forged_hash(e)
    (Path(out) / ".milarun" / "manifest.jsonl").write_text(
        "".join(json.dumps(e, sort_keys=True, separators=(",", ":")) + "\n" for e in entries)
    )
    return entries


def _forged_append(out, entries, kind, path):
    """``entries`` and one entry of ``kind`` naming ``path`` after them (the last
    session's), chained."""
    last = entries[-1]
    e = {
        "seq": len(entries),
        "session": last["session"],
        "kind": kind,
        "time": last["time"] + 1,
        "path": path,
        "prev": last["hash"],
    }
    e["sha256"], e["bytes"] = _forged_digest(Path(out) / path)
    e["hash"] = _forged_hash(e)
    (Path(out) / ".milarun" / "manifest.jsonl").write_text(
        "".join(json.dumps(x, sort_keys=True, separators=(",", ":")) + "\n" for x in entries + [e])
    )
    return entries + [e]


def _forged_seal(out, private_pem, **changes):
    """bundle.json made again for the chain as it is now (head, entry count, ``changes``),
    signed with the bidder's own key."""
    entries = _forged_entries(out)
    data = json.loads((Path(out) / "bundle.json").read_text())
    data.update(head=entries[-1]["hash"], entries=len(entries), **changes)
    raw = (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()
    (Path(out) / "bundle.json").write_bytes(raw)
    key = load_pem_private_key(Path(private_pem).read_bytes(), password=None)
    (Path(out) / "bundle.json.sig").write_text(base64.b64encode(key.sign(raw)).decode() + "\n")
    return data


def _run_head(out):
    """The head the run printed: its last ``end`` entry's hash."""
    return next(e for e in reversed(_forged_entries(out)) if e["kind"] == "end")["hash"]


def _up_to_run_head(out):
    """The chain up to the head the run printed (the seal's weights entry dropped)."""
    entries = _forged_entries(out)
    while entries[-1]["kind"] != "end":
        entries.pop()
    return entries


#: Another machine's GPUs: eight of them on another host.
OTHER_GPUS = [
    {
        "uuid": f"GPU-0000000{i}-feed-beef",
        "serial": f"99{i:011d}",
        "pci_bus_id": f"0000:{i + 16:02x}:00.0",
        "name": "NVIDIA H200",
    }
    for i in range(8)
]


def _pinned(bundle, head, **kw):
    return bundle.verify(expect_head=head, public_key=bundle.public, **kw)


def test_a_fail_record_entered_after_the_head_as_the_weights_copy_is_caught(bundle):
    head = _run_head(bundle.out)
    fail = next(
        e for e in _forged_entries(bundle.out) if e["kind"] == "record" and e["success"] is False
    )
    good = read_json(
        next(
            bundle.out / e["path"]
            for e in _forged_entries(bundle.out)
            if e["kind"] == "record" and e["success"] is True
        )
    )
    bad = read_json(bundle.out / fail["path"])
    forged = dict(good, **{k: bad[k] for k in ("name", "run", "device", "devices", "call")})
    for s in forged["timings"]["train"]["samples"]:  # ten times faster
        s["rate"] *= 10
        s["end"] = s["start"] + (s["end"] - s["start"]) / 10
    (bundle.out / fail["path"]).write_text(json.dumps(forged))
    # the seal's one entry after the head, naming the record instead of the weights copy
    entries = _forged_append(bundle.out, _up_to_run_head(bundle.out), "weights", fail["path"])
    _forged_seal(
        bundle.out, bundle.private, weights_sha256=entries[-1]["sha256"], weights=fail["path"]
    )
    v = _pinned(bundle, head)
    assert not {"integrity.chain", "integrity.file-changed", "integrity.signature"} & failed(v)
    for name in (
        "integrity.after-head",
        "integrity.entry-kind",
        "integrity.expected-head",
        "integrity.bundle-head",
    ):
        assert_caught(v, name)
    # the record is read and checked though its last entry is not a record's
    assert "completeness.record-launch" in failed(v)
    assert v.level == "NOT VERIFIED"


def test_a_session_file_entered_after_the_head_with_other_gpus_is_caught(bundle):
    head = _run_head(bundle.out)
    spath = bundle.out / ".milarun" / "session.json"
    session = json.loads(spath.read_text())
    for s in session["sessions"]:
        for ident in (s.get("identity") or {}).values():
            ident["gpus"] = OTHER_GPUS
    spath.write_text(json.dumps(session))
    entries = _forged_append(
        bundle.out, _up_to_run_head(bundle.out), "weights", ".milarun/session.json"
    )
    identity = {n: i for s in session["sessions"] for n, i in (s.get("identity") or {}).items()}
    _forged_seal(
        bundle.out,
        bundle.private,
        identity=identity,
        weights_sha256=entries[-1]["sha256"],
        weights=".milarun/session.json",
    )
    v = _pinned(bundle, head)
    assert not {
        "integrity.chain",
        "integrity.file-changed",
        "integrity.signature",
        "integrity.bundle-session",
    } & failed(v)
    for name in ("integrity.after-head", "integrity.entry-kind", "integrity.expected-head"):
        assert_caught(v, name)
    # unpinned, the same chain is caught too: its shape is not what seal writes
    assert_caught(bundle.verify(), "integrity.after-head")


def test_a_session_entry_appended_after_its_end_is_caught_unpinned(bundle):
    spath = bundle.out / ".milarun" / "session.json"
    session = json.loads(spath.read_text())
    session["sessions"][0]["identity"] = {
        "forged-host": {"hostname": "forged-host", "gpus": OTHER_GPUS}
    }
    spath.write_text(json.dumps(session))
    _forged_append(bundle.out, _up_to_run_head(bundle.out), "session", ".milarun/session.json")
    _forged_seal(
        bundle.out, bundle.private, weights_sha256=None, identity=session["sessions"][0]["identity"]
    )
    v = bundle.verify()
    assert_caught(v, "integrity.after-head")
    assert "after the end of its session" in next(
        c.detail for c in v.failed if c.name == "integrity.after-head"
    )


def test_a_bundle_file_with_another_machines_gpus_re_signed_is_caught(bundle):
    head = _run_head(bundle.out)
    data = json.loads((bundle.out / "bundle.json").read_text())
    node = next(iter(data["identity"]))
    other = dict(data["identity"][node], hostname="elsewhere", gpus=OTHER_GPUS)
    _forged_seal(bundle.out, bundle.private, identity={"elsewhere": other})
    v = _pinned(bundle, head)
    assert not {"integrity.signature", "integrity.bundle-head", "integrity.expected-head"} & failed(
        v
    )
    assert_caught(v, "integrity.bundle-session")
    details = " ".join(c.detail for c in v.failed)
    assert "node elsewhere" in details and f"node {node}" in details
    # one node's GPUs changed, the host kept: every node is compared
    _forged_seal(
        bundle.out, bundle.private, identity={node: dict(data["identity"][node], gpus=OTHER_GPUS)}
    )
    assert_caught(_pinned(bundle, head), "integrity.bundle-session")
    # the profile hash
    _forged_seal(bundle.out, bundle.private, identity=data["identity"], profile_sha256="ab" * 32)
    assert_caught(_pinned(bundle, head), "integrity.bundle-session")


def test_a_chain_rewritten_end_to_end_is_consistent_not_pinned(bundle, capsys):
    pinned_head = _run_head(bundle.out)
    for e in _forged_entries(bundle.out):  # every PASS record twice as fast
        if e["kind"] == "record" and e["success"]:
            path = bundle.out / e["path"]
            rec = json.loads(path.read_text())
            train = rec["timings"]["train"]
            for s in train["samples"]:
                s["count"] *= 2
                s["rate"] = s["count"] / (s["end"] - s["start"])
            train["count"] *= 2
            path.write_text(json.dumps(rec))
    _forged_chain(bundle.out, _forged_entries(bundle.out))
    _forged_seal(bundle.out, bundle.private)
    v = bundle.verify()
    assert v.ok and v.level == "CONSISTENT, NOT PINNED" and v.exit_code == 3, render_text(v)
    assert render_text(v).rstrip().splitlines()[-1].startswith("CONSISTENT, NOT PINNED: all ")
    assert "not pinned" in render_text(v).splitlines()[1]
    assert v.to_json()["level"] == "CONSISTENT, NOT PINNED" and v.to_json()["pinned"] is False
    html = render_html(v)
    assert 'data-level="CONSISTENT, NOT PINNED"' in html and 'class="bad"' in html
    # the head the bidder sent when the run ended: the rewrite is caught
    assert_caught(_pinned(bundle, pinned_head), "integrity.expected-head")
    # rules that require pinning make an unpinned verdict a failed clause
    v = bundle.verify(rules=bundle.rules(require_pinned=True))
    assert_caught(v, "integrity.expected-head")
    assert "require a pinned" in next(
        c.detail for c in v.failed if c.name == "integrity.expected-head"
    )
    with pytest.raises(SystemExit) as exit_:
        main(["verify", str(bundle.out)])
    assert exit_.value.code == 3
    assert capsys.readouterr().out.rstrip().splitlines()[-1].startswith("CONSISTENT, NOT PINNED")


def test_the_pinned_verdict_says_what_was_checked(bundle):
    head = _run_head(bundle.out)
    v = _pinned(bundle, head)
    assert v.level == "VERIFIED" and v.exit_code == 0
    assert (
        render_text(v)
        .rstrip()
        .endswith("(chain head pinned; signature checked under --public-key)")
    )
    v = bundle.verify(expect_head=head, public_key=None)
    assert v.exit_code == 0 and render_text(v).rstrip().endswith(
        "signature not checked: no --public-key)"
    )
    assert v.to_json()["signed"] is False and v.to_json()["pinned"] is True


def test_a_weights_copy_that_is_not_a_weights_file_is_caught(bundle):
    copy = bundle.out / ".milarun" / "weights.json"
    copy.write_text('{"tiny.ok": "heavy"}\n')
    entries = _forged_append(
        bundle.out, _up_to_run_head(bundle.out), "weights", ".milarun/weights.json"
    )
    _forged_seal(bundle.out, bundle.private, weights_sha256=entries[-1]["sha256"])
    v = _pinned(bundle, _run_head(bundle.out))
    assert not {"integrity.file-changed", "integrity.bundle-head"} & failed(v)
    assert_caught(v, "integrity.after-head")
