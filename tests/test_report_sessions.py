"""``milarun report`` of a folder with a session: the rule of ``--resume``
(:func:`milarun.launcher.session.successful_keys`) decides which records count, and the
seal's own files are not records (milarun/report/inputs.py). One real short run is made
once (one launch on a CPU slot) and sealed.
"""

import json
import shutil

import pytest
from conftest import crawl_run

from milarun.cli import main
from milarun.verify.seal import seal


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return crawl_run(tmp_path_factory.mktemp("sessions"))


@pytest.fixture
def folder(run, tmp_path):
    out = tmp_path / "r"
    shutil.copytree(run, out, symlinks=True)
    return out


def report(folder, capsys, *more):
    with pytest.raises(SystemExit) as exc:
        main(["report", str(folder), "--unweighted", *more])
    got = capsys.readouterr()
    assert exc.value.code == 0, got.err
    return got


def score(text):
    return next(line for line in text.splitlines() if line.startswith("score"))


def _copy_in(folder):
    """A successful record of another folder: the same record, the stamp of another
    session, its rate tripled (what a vendor would like counted)."""
    src = next(folder.glob("tiny.ok.*.json"))
    stamp = src.name.rsplit(".", 2)[-2]
    other = folder / src.name.replace(stamp, "20261101-090000-000000")
    rec = json.loads(src.read_text())
    for s in rec["timings"]["train"]["samples"]:
        s["rate"] = s["rate"] * 3
    other.write_text(json.dumps(rec))
    return other


@pytest.mark.parametrize("cache", [True, False])
def test_a_record_copied_in_is_named_and_not_scored(folder, capsys, cache):
    flag = [] if cache else ["--no-cache"]
    before = report(folder, capsys, *flag)
    other = _copy_in(folder)
    for _ in range(2):  # the second from the cache when there is one
        after = report(folder, capsys, *flag)
        assert score(after.out) == score(before.out)
        header = next(line for line in after.out.splitlines() if line.startswith("not counted"))
        assert "1 record(s) not written by a session of this folder" in header
        assert other.name in header
        assert f"skipped {other}: not written by a session of this folder" in after.err


def test_a_record_in_a_sub_folder_is_not_scored(folder, capsys):
    before = report(folder, capsys, "--no-cache")
    (folder / "more").mkdir()
    shutil.copy(next(folder.glob("tiny.ok.*.json")), folder / "more" / "best.json")
    after = report(folder, capsys, "--no-cache")
    assert score(after.out) == score(before.out)
    assert "more/best.json" in after.out


def test_a_sealed_folder_names_none_of_the_seal_s_files(folder, tmp_path, capsys):
    weights = tmp_path / "w.json"
    weights.write_text('{"tiny.ok": {"weight": 1}}\n')
    seal(folder, weights=weights, say=lambda line: None, warn=lambda line: None)
    got = report(folder, capsys)
    assert "bundle.json" not in got.err
    assert "weights.json" not in got.err
    assert "skipped" not in got.out
    rules = tmp_path / "rules.json"
    rules.write_text("{}")
    with pytest.raises(SystemExit) as exc:
        main(["tender", str(folder), "--rules", str(rules)])
    got = capsys.readouterr()
    assert exc.value.code in (1, 3), got.err  # verified or not: no warning of the seal
    assert "bundle.json" not in got.err
    assert "skipped" not in got.err
