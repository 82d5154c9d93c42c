"""The report's cache (milarun.formats.cache, milarun.report.inputs): the same text and HTML
as without it, a miss on any change of the inputs, never an error, never in a results folder."""

import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from milarun.formats import cache as cache_mod
from milarun.formats.cache import Cache, cache_dir
from milarun.report import inputs as inputs_mod
from milarun.report import make_report

FIX = Path(__file__).parent / "fixtures"
STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00")


@pytest.fixture
def results(tmp_path):
    out = tmp_path / "results"
    shutil.copytree(FIX / "results", out)
    return out


@pytest.fixture
def store(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("MILARUN_CACHE_DIR", str(root))
    return root


def report(results, tmp_path, cache=True, html=True, **options):
    """(text, html page without its time stamp, warnings, cached?) of one report."""
    page = tmp_path / "report.html"
    warn = io.StringIO()
    seen = []
    real = inputs_mod.load_inputs

    def spy(*args, **kwargs):
        got = real(*args, **kwargs)
        seen.append(got.cached)
        return got

    inputs_mod_load = pytest.MonkeyPatch()
    inputs_mod_load.setattr("milarun.report.load_inputs", spy)
    try:
        _, text = make_report(
            str(results),
            weights=str(FIX / "weights.json"),
            price=30000.0,
            compare_gpus=True,
            html=str(page) if html else None,
            warn=warn,
            cache=cache,
            **options,
        )
    finally:
        inputs_mod_load.undo()
    body = STAMP.sub("", page.read_text()) if html else None
    return text, body, warn.getvalue(), seen[0]


def test_a_second_report_is_read_from_the_cache_and_is_the_same(results, store, tmp_path):
    cold = report(results, tmp_path, cache=False)
    first = report(results, tmp_path)
    second = report(results, tmp_path)
    assert (cold[3], first[3], second[3]) == (False, False, True)
    assert cold[:3] == first[:3] == second[:3]
    assert "<svg" in second[1] and "skipped" in second[2]  # plots and warnings replayed
    # the entry is in the cache folder, nothing was added to the results folder
    assert [p.name.split("-")[0] for p in store.iterdir()] == ["report"]
    assert not list(results.rglob("*cache*"))
    assert oct(store.stat().st_mode & 0o777) == "0o700"


def test_other_options_reuse_the_entry(results, store, tmp_path):
    report(results, tmp_path)
    text, _, _, cached = report(results, tmp_path, html=False, compare_nodes=True)
    assert cached
    assert text == report(results, tmp_path, cache=False, html=False, compare_nodes=True)[0]


def test_an_entry_without_plots_is_computed_again_for_the_html(results, store, tmp_path):
    assert report(results, tmp_path, html=False)[3] is False
    assert report(results, tmp_path)[3] is False  # drawn now, and kept
    assert report(results, tmp_path, html=False)[3] is True
    assert report(results, tmp_path)[3] is True


def _record(results):
    return sorted(
        p for p in results.glob("*.json") if "FAIL" not in p.name and "convnet" in p.name
    )[0]


@pytest.mark.parametrize("change", ["one byte", "added", "removed", "renamed"])
def test_any_change_of_a_result_file_is_a_miss(results, store, tmp_path, change):
    report(results, tmp_path)
    path = _record(results)
    if change == "one byte":
        data = json.loads(path.read_text())
        data["timings"]["train"]["samples"][-1]["rate"] *= 2
        path.write_text(json.dumps(data))
    elif change == "added":
        shutil.copy(path, path.with_name(path.name.replace("J0.0", "J7.0")))
    elif change == "removed":
        path.unlink()
    else:
        path.rename(path.with_name(path.name.replace("J0.0", "J8.0")))
    text, page, warnings, cached = report(results, tmp_path)
    assert cached is False
    assert (text, page, warnings) == report(results, tmp_path, cache=False)[:3]


def test_the_digest_holds_python_and_the_libraries(monkeypatch):
    from importlib import metadata

    monkeypatch.setattr(cache_mod, "_code_digest", None)
    first = cache_mod.code_digest()
    real = metadata.version
    monkeypatch.setattr(
        metadata, "version", lambda name: "9.9" if name == "matplotlib" else real(name)
    )
    monkeypatch.setattr(cache_mod, "_code_digest", None)
    assert cache_mod.code_digest() != first


def test_a_changed_milarun_is_a_miss(results, store, tmp_path, monkeypatch):
    report(results, tmp_path)
    monkeypatch.setattr(cache_mod, "_code_digest", "0" * 64)
    assert report(results, tmp_path)[3] is False


def _session(results, profile, stamps):
    from milarun.launcher.session import SESSION_FORMAT, SESSION_VERSION

    session = results / ".milarun" / "session.json"
    session.parent.mkdir(exist_ok=True)
    session.write_text(
        json.dumps(
            {
                "format": SESSION_FORMAT,
                "version": SESSION_VERSION,
                "invocation": {"profile": profile},
                "sessions": [{"id": s} for s in stamps],
            }
        )
    )


def test_the_session_file_is_read_every_time(results, store, tmp_path):
    assert not (results / ".milarun" / "session.json").exists()
    # every record's stamp a session of the folder: all of them count
    stamps = sorted({p.name.rsplit(".", 2)[-2] for p in results.glob("*.json")})
    _session(results, "profiles/one.json", stamps)
    report(results, tmp_path, html=False)
    _session(results, "profiles/other.json", stamps)
    got = inputs_mod.load_inputs(results, io.StringIO(), cache=Cache.from_env())
    assert got.cached and got.summary["provenance"]["profile"] == "profiles/other.json"


def test_other_sessions_are_another_key(results, store, tmp_path):
    stamps = sorted({p.name.rsplit(".", 2)[-2] for p in results.glob("*.json")})
    _session(results, "profiles/one.json", stamps)
    first = inputs_mod.load_inputs(results, io.StringIO(), cache=Cache.from_env())
    _session(results, "profiles/one.json", stamps[1:])  # a record no session wrote now
    got = inputs_mod.load_inputs(results, io.StringIO(), cache=Cache.from_env())
    assert not got.cached and got.foreign and not first.foreign


def test_no_cache_reads_and_writes_nothing(results, store, tmp_path):
    report(results, tmp_path, cache=False)
    assert not store.exists()


@pytest.mark.parametrize("bad", ["world-writable", "symlink", "a file", "off", "relative"])
def test_an_unusable_cache_folder_is_not_used(results, tmp_path, monkeypatch, bad):
    root = tmp_path / "cache"
    if bad == "world-writable":
        root.mkdir()
        root.chmod(0o777)
    elif bad == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        root.symlink_to(tmp_path / "elsewhere")
    elif bad == "a file":
        root.write_text("not a folder")
    monkeypatch.setenv("MILARUN_CACHE_DIR", {"off": "off", "relative": "cache"}.get(bad, str(root)))
    expected = report(results, tmp_path, cache=False)[:3]
    for _ in range(2):
        got = report(results, tmp_path)
        assert got[3] is False and got[:3] == expected
    if bad in ("world-writable", "symlink"):
        assert not list((tmp_path / ("elsewhere" if bad == "symlink" else "cache")).iterdir())


@pytest.mark.parametrize(
    "damage",
    [
        "truncated",
        "not json",
        "other key",
        "wrong shape",
        "a list",
        "warnings",
        "summary edited",
        "a fifo",
    ],
)
def test_a_malformed_entry_is_a_miss_and_is_written_again(results, store, tmp_path, damage):
    expected = report(results, tmp_path)[:3]
    (entry,) = store.iterdir()
    data = json.loads(entry.read_text())
    entry.unlink()
    if damage == "truncated":
        entry.write_text(json.dumps(data)[:1000])
    elif damage == "not json":
        entry.write_bytes(b"\xff\x00garbage")
    elif damage == "other key":
        entry.write_text(json.dumps({**data, "key": "0" * 64}))
    elif damage == "wrong shape":
        entry.write_text(
            json.dumps({**data, "value": {**data["value"], "count": "many", "traces": 7}})
        )
    elif damage == "a list":
        entry.write_text(json.dumps({**data, "value": []}))
    elif damage == "warnings":
        entry.write_text(json.dumps({**data, "value": {**data["value"], "warnings": 7}}))
    elif damage == "summary edited":  # JSON of the right shape outside, not a summary
        entry.write_text(json.dumps({**data, "value": {**data["value"], "summary": {"tests": {}}}}))
    else:
        os.mkfifo(entry)
    got = report(results, tmp_path)
    assert got[3] is False and got[:3] == expected
    if damage != "a fifo":  # an entry that is not a file is never written over
        assert report(results, tmp_path)[3] is True


def test_a_full_disk_only_costs_the_entry(results, store, tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_mod, "write_atomic", full)
    expected = report(results, tmp_path, cache=False)[:3]
    got = report(results, tmp_path)
    assert got[3] is False and got[:3] == expected
    assert not [p for p in store.iterdir() if p.name.startswith("report-")]


def test_the_least_recently_used_entries_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_mod, "MAX_ENTRIES", 3)
    store = Cache(tmp_path / "c")
    for i in range(5):
        assert store.put("report", f"{i:064x}", {"i": i})
        os.utime(store._path("report", f"{i:064x}"), (1000 + i, 1000 + i))
    assert store.get("report", f"{2:064x}") == {"i": 2}  # used: now the newest
    store.put("report", f"{9:064x}", {"i": 9})
    kept = sorted(p.name[7:-5].lstrip("0") or "0" for p in (tmp_path / "c").iterdir())
    assert kept == ["2", "4", "9"]


def test_where_the_cache_is(tmp_path):
    assert cache_dir({"MILARUN_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert cache_dir({"MILARUN_CACHE_DIR": "off"}) is None
    assert cache_dir({"MILARUN_CACHE_DIR": ""}) is None
    assert cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "milarun"
    home = cache_dir({"XDG_CACHE_HOME": "relative", "HOME": str(tmp_path / "home")})
    assert home == tmp_path / "home" / ".cache" / "milarun"
    assert cache_dir({"HOME": "relative"}) is None


def test_the_cli_has_no_cache(results, store, tmp_path, capsys):
    from milarun.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["report", str(results), "--no-cache"])
    assert exc.value.code == 0 and not store.exists()
    with pytest.raises(SystemExit):
        main(["report", str(results)])
    assert [p.name.split("-")[0] for p in store.iterdir()] == ["report"]


def test_pruning_removes_entries_only(tmp_path, monkeypatch):
    # $MILARUN_CACHE_DIR may name a folder that holds other files (a results folder, notes):
    # pruning must never delete one of them, even when they look like "a-b.json"
    monkeypatch.setattr(cache_mod, "MAX_ENTRIES", 2)
    root = tmp_path / "mine"
    root.mkdir(mode=0o700)
    theirs = [root / f"notes-{i}.json" for i in range(5)]
    theirs.append(root / f"other-{0:064x}.json.bak")
    for i, path in enumerate(theirs):
        path.write_text("{}")
        os.utime(path, (1000 + i, 1000 + i))
    store = Cache(root)
    for i in range(4):
        assert store.put("report", f"{i:064x}", {"i": i})
        os.utime(store._path("report", f"{i:064x}"), (2000 + i, 2000 + i))
    assert all(path.exists() for path in theirs)
    assert sorted(p.name for p in root.iterdir() if p not in theirs) == [
        f"report-{2:064x}.json",
        f"report-{3:064x}.json",
    ]


def test_the_warnings_name_the_folder_as_given(results, store, tmp_path, monkeypatch):
    # the same folder named two ways: the warnings replayed name it as this run does
    monkeypatch.chdir(results.parent)
    relative = report(Path(results.name), tmp_path, html=False)
    absolute = report(results, tmp_path, html=False)
    assert f"skipped {results.name}{os.sep}" in relative[2]
    assert absolute[2] == report(results, tmp_path, cache=False, html=False)[2]
    assert f"skipped {results}{os.sep}" in absolute[2]
    assert report(Path(results.name), tmp_path, html=False)[2:] == (relative[2], True)


def test_an_unreadable_file_of_milarun_is_not_an_error(results, store, tmp_path, monkeypatch):
    # a file in milarun's folder this user may not read (root's 0600 backup of a module)
    real = Path.read_bytes

    def read_bytes(path):
        if path.name == "cache.py" and path.parent.name == "formats":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(cache_mod, "_code_digest", None)
    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    expected = report(results, tmp_path, cache=False, html=False)[:3]
    assert report(results, tmp_path, html=False)[:3] == expected
    assert report(results, tmp_path, html=False)[3] is True


def test_entries_are_private_whatever_the_umask(tmp_path):
    # a folder others may enter (0755 is allowed) and umask 0: an entry must not be 0666
    root = tmp_path / "c"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    old = os.umask(0)
    try:
        assert Cache(root).put("report", "0" * 64, {"a": 1})
    finally:
        os.umask(old)
    assert oct((root / f"report-{'0' * 64}.json").stat().st_mode & 0o777) == "0o600"
