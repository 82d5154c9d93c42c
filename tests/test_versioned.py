"""One versioned-file helper (milarun/formats/versioned.py) for results, summaries and sessions."""

import json

import pytest

from milarun.errors import ResultFormatError, SetupError
from milarun.formats import record, summary
from milarun.formats.versioned import Migration, VersionedFormat
from milarun.launcher import session


def test_steps_run_in_order_on_a_copy():
    fmt = VersionedFormat(
        2,
        {
            0: Migration(lambda d: {**d, "version": 1, "a": 1}),
            1: Migration(lambda d: {**d, "version": 2, "b": d["a"] + 1}),
        },
    )
    old = {"x": [1]}
    new = fmt.upgrade(old, fmt.version_of(old, default=0))
    assert new == {"x": [1], "version": 2, "a": 1, "b": 2} and old == {"x": [1]}
    current = {"version": 2}
    assert fmt.upgrade(current, 2) is current


@pytest.mark.parametrize(
    "data,message",
    [
        ({"version": 3}, "format version 3 is newer than this milarun (2)"),
        ({"version": -1}, "unknown format version -1"),
        ({"version": True}, "bad format version True"),
        ({"version": "1" * 200}, "bad format version '" + "1" * 60),
    ],
)
def test_versions_it_cannot_read_are_one_line(data, message):
    fmt = VersionedFormat(2, {0: Migration(lambda d: d), 1: Migration(lambda d: d)})
    with pytest.raises(ResultFormatError) as exc:
        fmt.upgrade(data, fmt.version_of(data, path="f.json"), path="f.json")
    assert str(exc.value) == f"f.json: version: {message}"


def test_a_failing_step_or_schema_says_so():
    fmt = VersionedFormat(1, {0: Migration(lambda d: d["missing"])}, what="thing ")
    with pytest.raises(
        ResultFormatError,
        match="cannot migrate from thing format version 0 \\(KeyError: 'missing'\\)",
    ):
        fmt.upgrade({}, 0)
    checked = VersionedFormat(1, {0: Migration(lambda d: d, schema="summary#/$defs/flat2020")})
    with pytest.raises(ResultFormatError):
        checked.upgrade({"s.t": {"n": "two", "train": {}}}, 0)


def test_the_three_formats_use_it():
    assert (
        record.RESULT_FORMAT.version == record.FORMAT_VERSION
        and 0 in record.RESULT_FORMAT.migrations
    )
    assert summary.FORMAT.version == summary.SUMMARY_VERSION
    assert summary.FORMAT.migrations[0].schema == "summary#/$defs/flat2020"
    assert session.SESSION.version == session.SESSION_VERSION


@pytest.mark.parametrize("version", [2, "1", None])
def test_a_session_file_of_another_version_is_refused(tmp_path, version):
    path = session.session_path(tmp_path)
    path.parent.mkdir()
    path.write_text(
        json.dumps(
            {"format": session.SESSION_FORMAT, "version": version, "invocation": {}, "sessions": []}
        )
    )
    with pytest.raises(
        SetupError, match=f"version: session format version {version!r} is not supported"
    ):
        session.read_session(tmp_path)
