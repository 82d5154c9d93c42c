"""The manifest (``OUTDIR/.milarun/manifest.jsonl``): an append-only hash chain of what a
session wrote (milarun/formats/manifest.py, milarun/launcher/chain.py)."""

import json
import os

import pytest

from milarun.errors import MilarunError
from milarun.formats import manifest as mf


def _folder(tmp_path, n=3):
    out = tmp_path / "out"
    (out / ".milarun").mkdir(parents=True)
    m = mf.Manifest(out, "S1")
    for i in range(n):
        f = out / f"r{i}.json"
        f.write_text(json.dumps({"i": i}))
        m.add("record", f, launch={"name": "s.t", "run": 0, "device": str(i)}, success=True)
    m.event("end", status="complete")
    return out, m


def test_entries_link_and_the_head_is_the_last_hash(tmp_path):
    out, m = _folder(tmp_path)
    entries = mf.read_manifest(mf.manifest_path(out))
    assert [e["seq"] for e in entries] == [0, 1, 2, 3]
    assert entries[0]["prev"] == mf.GENESIS
    assert all(b["prev"] == a["hash"] for a, b in zip(entries, entries[1:]))
    assert mf.check_chain(entries) == [] and mf.head_of(entries) == m.head
    assert entries[1]["path"] == "r1.json"
    assert entries[1]["sha256"] == mf.file_digest(out / "r1.json")[0]


def _rewrite(out, entries):
    mf.manifest_path(out).write_text("".join(json.dumps(e) + "\n" for e in entries))


@pytest.mark.parametrize(
    "tamper, words",
    [
        ("edit", "hash does not match its content"),
        ("rehash", "prev does not match"),  # an edited entry re-hashed: the next link breaks
        ("delete", "seq is 2, expected 1"),
        ("swap", "seq is 2, expected 1"),
    ],
)
def test_any_change_to_the_chain_is_found(tmp_path, tamper, words):
    out, _ = _folder(tmp_path)
    entries = mf.read_manifest(mf.manifest_path(out))
    if tamper == "edit":
        entries[1]["sha256"] = "0" * 64
    elif tamper == "rehash":
        entries[1]["sha256"] = "0" * 64
        entries[1]["hash"] = mf.entry_hash(entries[1])
    elif tamper == "delete":
        del entries[1]
    else:
        entries[1], entries[2] = entries[2], entries[1]
    _rewrite(out, entries)
    problems = mf.check_chain(mf.read_manifest(mf.manifest_path(out)))
    assert problems and any(words in p for p in problems), problems


def test_a_new_writer_continues_the_chain_and_refuses_a_broken_one(tmp_path):
    out, m = _folder(tmp_path)
    again = mf.Manifest(out, "S2")
    assert again.head == m.head and again.seq == 4
    again.event("end", status="complete")
    entries = mf.read_manifest(mf.manifest_path(out))
    assert mf.check_chain(entries) == [] and entries[-1]["session"] == "S2"
    entries[0]["session"] = "forged"
    _rewrite(out, entries)
    with pytest.raises(mf.ManifestError, match="does not extend a broken chain"):
        mf.Manifest(out, "S3")


@pytest.mark.parametrize(
    "text, ok",
    [
        ("r.json", True),
        ("logs/a.log", True),
        (".milarun/plan-1.json", True),
        ("./r.json", False),
        ("logs//a.log", False),
        ("logs/./a.log", False),
        ("logs/", False),
        ("../r.json", False),
        ("/etc/passwd", False),
        ("a\0b", False),
        ("a\\b", False),
        ("", False),
    ],
)
def test_a_manifest_names_each_file_one_way_only(text, ok):
    assert mf.is_safe_relative(text) is ok


def test_a_write_cut_off_by_a_full_disk_leaves_the_chain_readable(tmp_path, monkeypatch):
    out, m = _folder(tmp_path)
    before = mf.manifest_path(out).read_bytes()
    real = os.write

    def full(fd, data):  # the disk fills half-way through the line
        real(fd, bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mf.os, "write", full)
    with pytest.raises(OSError):
        m.event("end", status="complete")
    monkeypatch.setattr(mf.os, "write", real)
    assert mf.manifest_path(out).read_bytes() == before
    m.event("end", status="complete")  # the space is back: the chain goes on
    entries = mf.read_manifest(mf.manifest_path(out))
    assert mf.check_chain(entries) == [] and len(entries) == 5


@pytest.mark.parametrize(
    "line, words",
    [
        ('{"seq": 0', "incomplete"),  # torn last line
        ("[1, 2]\n", "not a JSON object"),
        (
            '{"seq": 0, "session": "s", "kind": "record", "time": 1, "prev": "%s", "hash": "%s", '
            '"path": "../etc/passwd", "sha256": "%s", "bytes": 1}\n'
            % ("0" * 64, "0" * 64, "0" * 64),
            "path: line 1: must be a relative path",
        ),
        (
            '{"seq": 0, "session": "s", "kind": "exec", "time": 1, "prev": "%s", "hash": "%s"}\n'
            % ("0" * 64, "0" * 64),
            "unknown kind",
        ),
        (
            '{"seq": true, "session": "s", "kind": "end", "time": 1, "prev": "%s", "hash": "%s"}\n'
            % ("0" * 64, "0" * 64),
            "seq: line 1: must be int",
        ),
    ],
)
def test_a_malformed_manifest_is_one_line_naming_the_line_and_key(tmp_path, line, words):
    path = tmp_path / "manifest.jsonl"
    path.write_text(line)
    with pytest.raises(mf.ManifestError) as exc:
        mf.read_manifest(path)
    assert words in str(exc.value) and str(path) in str(exc.value)
    assert "\n" not in str(exc.value)


def test_files_are_hashed_never_through_a_symlink_or_a_fifo(tmp_path):
    out, m = _folder(tmp_path, n=0)
    (out / "link.json").symlink_to(out / ".milarun" / "manifest.jsonl")
    with pytest.raises(OSError):
        m.add("record", out / "link.json")
    os.mkfifo(out / "fifo.json")
    with pytest.raises(OSError):
        m.add("record", out / "fifo.json")
    with pytest.raises(ValueError):
        m.add("record", tmp_path / "outside.json")
    assert isinstance(mf.ManifestError("x"), MilarunError)


@pytest.mark.slow
def test_a_jobs_session_chains_what_it_wrote_and_resume_refuses_a_broken_chain(tmp_path, capsys):
    from milarun.cli import main

    root, out = tmp_path / "data", tmp_path / "out"
    root.mkdir()
    profile = tmp_path / "p.json"
    profile.write_text(
        json.dumps(
            {
                "toy": {
                    "experiment": "milarun.models.toy_reg:main",
                    "partition_scheme": {"type": "per-gpu"},
                    "arguments": {
                        "--max-count": 1,
                        "--min-steady": 1,
                        "--device": "cpu",
                        "--sample-duration": 0.25,
                        "--warmup": 1,
                    },
                }
            }
        )
    )
    with pytest.raises(SystemExit) as exit_:
        main(["jobs", str(profile), "-d", str(root), "-o", str(out), "--no-cgexec"])
    assert exit_.value.code == 0
    err = capsys.readouterr().err
    entries = mf.read_manifest(mf.manifest_path(out))
    assert mf.check_chain(entries) == []
    assert f"manifest head {mf.head_of(entries)}" in err
    kinds = [e["kind"] for e in entries]
    assert kinds[:3] == ["session", "profile", "plan"] and kinds[-1] == "end"
    record = next(e for e in entries if e["kind"] == "record")
    assert record["success"] is True and record["launch"]["device"] == "0"
    assert (out / record["path"]).is_file()
    copy = next(e for e in entries if e["kind"] == "profile")
    assert (out / copy["path"]).read_bytes() == profile.read_bytes()
    plan = json.loads((out / next(e for e in entries if e["kind"] == "plan")["path"]).read_text())
    assert [(x["name"], x["run"], x["device"]) for x in plan["launches"]] == [("p.toy", 0, "0")]
    # a broken chain: --resume refuses it in one line and leaves the session file as it was
    entries[1]["bytes"] += 1
    _rewrite(out, entries)
    session = (out / ".milarun" / "session.json").read_bytes()
    with pytest.raises(SystemExit) as exit_:
        main(["jobs", str(profile), "-d", str(root), "--resume", str(out), "--no-cgexec"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1, err
    assert "does not extend a broken chain" in err[0]
    assert (out / ".milarun" / "session.json").read_bytes() == session
