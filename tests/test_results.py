"""Result records: round trip, atomic writes, naming, migration, corrupt files."""

import json
import re

import pytest

from milarun.errors import ResultFormatError
from milarun.formats.record import FORMAT_VERSION, migrate, new_result
from milarun.formats.store import iter_results, load_result, result_filename, write_result


def test_round_trip(tmp_path):
    rec = new_result("cpu.vae", "2.1", device="1", devices=[1], run=2, plan_type="per-gpu")
    rec["timings"]["train"]["samples"] = [
        {"start": 0, "end": 0.5, "count": 10, "rate": 20.0, "warmup": True}
    ]
    rec["success"] = True
    path = write_result(rec, tmp_path)
    assert re.fullmatch(r"cpu\.vae\.J2\.1\.\d{8}-\d{6}-\d{6}\.json", path.name)
    assert load_result(path) == rec
    assert not list(tmp_path.glob(".tmp-*"))


def test_results_get_the_mode_of_a_new_file(tmp_path):
    # a temporary file is 0600; results on a shared disk must stay readable
    import os

    old = os.umask(0o027)
    try:
        path = write_result(new_result("s.t"), tmp_path)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o640


def test_fail_name_and_explicit_file(tmp_path):
    rec = new_result("s.t")
    assert ".FAIL." in result_filename("s.t", 0, "0", False)
    path = write_result(rec, tmp_path / "x.json")
    assert path == tmp_path / "x.json"


def test_migration_from_version_0():
    sample = {"start": 0.0, "end": 1.0, "count": 1, "rate": 1.0, "warmup": False}
    old = {k: v for k, v in new_result("s.t").items() if k != "version"}
    old["timings"] = {"program": {}}
    old["train"] = {"samples": [sample]}
    rec = migrate(old)
    assert rec["version"] == FORMAT_VERSION
    assert rec["timings"]["train"]["samples"] == [sample]
    assert "train" not in rec and "train" in old  # the input is not modified


@pytest.mark.parametrize(
    "data,key",
    [
        ({"version": 99}, "version"),
        ({"version": "1"}, "version"),
        ({"version": 1, "name": "x"}, "suite"),  # the first missing required field
        ({**new_result("s.t"), "name": "x"}, "name"),  # not 'suite.test'
        ({**new_result("s.t"), "run": -1}, "run"),
    ],
)
def test_bad_records(data, key):
    with pytest.raises(ResultFormatError) as exc:
        migrate(data, path="f.json")
    assert exc.value.key == key and str(exc.value).startswith("f.json: ")


def test_iter_results_yields_errors_for_corrupt_files(tmp_path):
    good = new_result("s.t")
    write_result(good, tmp_path)
    (tmp_path / "trunc.json").write_text('{"version": 1, "name": ')
    (tmp_path / "notes.txt").write_text("hello")
    found = dict(iter_results(tmp_path))
    assert len(found) == 2
    err = found[tmp_path / "trunc.json"]
    assert isinstance(err, ResultFormatError) and "invalid JSON" in str(err)


def _accepted_per_item(record):
    """fastjsonschema's answer with every sample checked on its own (no columns)."""
    import fastjsonschema

    from milarun.formats import jsonfile

    check = fastjsonschema.compile(
        jsonfile._fast_schema(jsonfile._inlined("result")),
        use_default=False,
        detailed_exceptions=False,
    )
    try:
        check(record)
    except fastjsonschema.JsonSchemaValueException:
        return False
    return True


def test_sample_columns_give_the_per_item_answer():
    # the samples and GPU readings are checked by column (milarun.formats.jsonfile); any
    # value the columns cannot vouch for goes through the per-item check
    import copy
    import random

    from milarun.formats.jsonfile import accepts

    rec = new_result("s.t")
    rec["timings"]["train"]["samples"] = [
        {"start": 0.5 * i, "end": 0.5 * i + 0.5, "count": 10, "rate": 20.0, "warmup": i < 2}
        for i in range(12)
    ]
    rec["gpu_monitor"] = {
        "available": True,
        "reason": None,
        "interval": 1.0,
        "samples": [
            {"t": float(i), "device": 0, "load": 50.0, "memory_mib": 10.0, "power": 100.0}
            for i in range(6)
        ],
    }
    values = [
        None,
        True,
        False,
        -1,
        -1.0,
        0,
        2.5,
        3.0,
        1e9,
        1e9 + 1,
        1e13,
        1e16,
        2**60,
        "x",
        [],
        {},
        float("inf"),
    ]
    keys = [
        "start",
        "end",
        "count",
        "rate",
        "warmup",
        "profiled",
        "loss",
        "extra",
        "t",
        "device",
        "load",
        "error",
    ]
    rng = random.Random(0)
    answers = set()
    for _ in range(300):
        r = copy.deepcopy(rec)
        array = rng.choice([r["timings"]["train"]["samples"], r["gpu_monitor"]["samples"]])
        i = rng.randrange(len(array))
        if rng.random() < 0.8:
            array[i][rng.choice(keys)] = rng.choice(values)
        elif rng.random() < 0.5:
            del array[i][rng.choice(sorted(array[i]))]
        else:
            array[i] = rng.choice(values)
        answer = accepts(r, "result")
        assert answer == _accepted_per_item(r), array[i]
        answers.add(answer)
    assert answers == {True, False}


def test_a_bad_sample_is_named_by_its_index(tmp_path):
    rec = new_result("s.t")
    rec["timings"]["train"]["samples"] = [
        {"start": 0.0, "end": 1.0, "count": 1, "rate": 1.0, "warmup": False}
    ] * 3
    rec["timings"]["train"]["samples"][2] = {**rec["timings"]["train"]["samples"][2], "rate": -5}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(rec))
    with pytest.raises(
        ResultFormatError,
        match=r"timings\.train\.samples\.2\.rate: must be "
        r">= 0, not -5",
    ):
        load_result(path)


def _rglob_results(directory):
    """The walk of ``iter_results`` before it used ``os.scandir`` (``Path.rglob``), its
    reference: ``[(path, "record" or the error's message)]``."""
    from milarun.formats.outfile import TMP_PREFIX
    from milarun.formats.store import TRACE_SUFFIX, inside

    out = []
    for path in sorted(directory.rglob("*.json*")):
        parts = path.relative_to(directory).parts
        if any(p.startswith(".") for p in parts[:-1]):
            continue
        link, stale = path.is_symlink(), path.name.startswith(TMP_PREFIX)
        if not stale and (
            path.name.startswith(".") or path.suffix != ".json" or path.name.endswith(TRACE_SUFFIX)
        ):
            continue
        if not (link or path.is_file()):
            if not path.is_dir():
                out.append((path, "not a regular file"))
            continue
        if link and inside(directory, path) is None:
            out.append((path, "link outside"))
        elif stale:
            out.append((path, "stale"))
        else:
            try:
                load_result(path)
                out.append((path, "record"))
            except ResultFormatError as exc:
                out.append((path, str(exc)))
    return out


def test_iter_results_walks_as_rglob_did(tmp_path, monkeypatch):
    import os

    record = json.dumps(new_result("s.t"))
    for rel in (
        "a.json",
        "a-1.json",
        "a/b.json",
        "A.json",
        "b.json.bak",
        "c.jsonl",
        "x.trace.json",
        ".hidden/h.json",
        ".h.json",
        "sub/s.json",
        "sub.json/in.json",
        "a.json.d/x.json",
        "z/.tmp-abc.json",
        ".tmp-top.json",
        "z/zz/deep.json",
        "bad.json",
        "locked/l.json",
        "locked.json/l.json",
        ".hid/locked/x.json",
    ):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{" if "tmp" in rel or "bad" in rel else record)
    (tmp_path / "empty.json").mkdir()
    os.mkfifo(tmp_path / "fifo.json")
    for name, target in (
        ("in.json", "a.json"),
        ("out.json", "/etc/passwd"),
        ("broken.json", "nowhere.json"),
        ("loop.json", "loop.json"),
        ("linkdir", "sub"),
        ("linkdir.json", "sub"),
        ("hidden-target.json", ".hidden/h.json"),
    ):
        (tmp_path / name).symlink_to(target)
    # a sub-folder that cannot be listed (a user's lost+found): rglob passed over it
    real = os.scandir

    def scandir(path="."):
        if os.path.basename(os.fspath(path)) in ("locked", "locked.json"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    expected = _rglob_results(tmp_path)
    assert [p for p, _ in expected].count(tmp_path / "a.json") == 1
    got = [(p, "record" if isinstance(r, dict) else str(r)) for p, r in iter_results(tmp_path)]
    assert [p for p, _ in got] == [p for p, _ in expected]
    for (path, want), (_, have) in zip(expected, got):
        assert (want == "record") == (have == "record"), path
        if want not in ("record", "not a regular file", "link outside", "stale"):
            assert have == want
