"""Hostile and malformed inputs: every one is one exact line.

Profiles, weights and baselines/summaries end the command with one line
``milarun: error: <file>: <where>: <message>`` and exit 2. A bad result file in
a results folder is one warning line naming it and the key; the others are
used and the command exits 0. The schemas and their documentation agree.
"""

import json
import re
import shutil
from pathlib import Path

import pytest

from milarun.cli import main
from milarun.formats import jsonfile
from milarun.formats import record as result_schema
from milarun.formats.record import FORMAT_VERSION

FIX = Path(__file__).parent / "fixtures"
RESULTS = FIX / "results"
GOOD_RESULT = RESULTS / "standard.convnet.J0.0.20261121-120000-000000.json"
OK_JOB = {"experiment": "milarun.models.toy_reg:main"}
NAME_RULE = "letters, digits, '_', '-', and '.' between them"
TEST_NAME = f"is not a valid test name (like 'suite.test': {NAME_RULE})"
TOO_DEEP = f"nested deeper than {jsonfile.MAX_DEPTH} levels"
NAN = "invalid JSON: NaN is not allowed (numbers must be finite)"


def cli(args, capsys):
    """Run ``milarun ARGS``; return (exit code, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    return exc.value.code, capsys.readouterr().err


def write(path, content):
    """Write bytes, text, or a JSON value to ``path``."""
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))
    return path


def deep(levels, inner="1"):
    return "[" * levels + inner + "]" * levels


# --- profiles: `milarun jobs PROFILE --dry-run` -------------------------------------


def _job(**kw):
    return {"a": {**OK_JOB, **kw}}


BAD_PROFILES = [
    (
        b'{"a": {"experiment": "milarun.models.toy_reg:main", "description": "caf\xe9"}}',
        "not valid UTF-8 (byte 0xe9 at offset 71)",
    ),
    (b"\xff\xfe{}", "not valid UTF-8 (byte 0xff at offset 0)"),
    ('{"a": {"experiment": "milarun.models.toy_reg:main", "timeout": NaN}}', NAN),
    (
        '{"a": {"experiment": "milarun.models.toy_reg:main", "timeout": Infinity}}',
        "invalid JSON: Infinity is not allowed (numbers must be finite)",
    ),
    (
        '{"a": {"experiment": "milarun.models.toy_reg:main", "timeout": 1e999}}',
        "invalid JSON: number 1e999 is out of range",
    ),
    (
        _job(timeout=1e12),
        "job 'a', key 'timeout': must be at most 604800 seconds (7 days), not 1000000000000.0",
    ),
    (_job(timeout=True), "job 'a', key 'timeout': must be a positive number of seconds"),
    (
        _job(partition_scheme={"cgroup": "cpuset:student{"}),
        "job 'a', key 'partition_scheme.cgroup': bad template 'cpuset:student{' "
        "(Single '{' encountered in format string)",
    ),
    (
        _job(partition_scheme={"cgroup": "cpuset:student{device.real}"}),
        "job 'a', key 'partition_scheme.cgroup': unknown placeholder {device.real} (only {device})",
    ),
    (
        _job(partition_scheme={"cgroup": "cpuset:student}"}),
        "job 'a', key 'partition_scheme.cgroup': bad template 'cpuset:student}' "
        "(Single '}' encountered in format string)",
    ),
    (
        _job(prepare=["ls {dataroot"]),
        "job 'a', key 'prepare': bad template 'ls {dataroot' (expected '}' before end of string)",
    ),
    (
        _job(prepare=["ls {}"]),
        "job 'a', key 'prepare': unknown placeholder {} (known: dataroot, milarun, outdir, python)",
    ),
    (
        _job(prepare=["ls {dataroot[0]}"]),
        "job 'a', key 'prepare': unknown placeholder {dataroot[0]} "
        "(known: dataroot, milarun, outdir, python)",
    ),
    (_job(exec_prefix=["nocache", 3]), "job 'a', key 'exec_prefix.1': must be a string"),
    (_job(description=["x"]), "job 'a', key 'description': must be a string"),
    ({"../x": OK_JOB}, "job '../x': job names may hold only letters, digits, '_' and '-'"),
    ({"a\nb": OK_JOB}, "job 'a\\nb': job names may hold only letters, digits, '_' and '-'"),
    ({"a" * 65: OK_JOB}, f"job '{'a' * 65}': job names may hold at most 64 characters"),
    ('{"a": ' + deep(10000) + "}", TOO_DEEP),
    (
        '{"a": {"experiment": "milarun.models.toy_reg:main"}, "a": {}}',
        "invalid JSON: duplicate key 'a'",
    ),
    ("", "invalid JSON: Expecting value at line 1, column 1"),
]


@pytest.mark.parametrize(
    "content,message", BAD_PROFILES, ids=[f"profile-{i}" for i in range(len(BAD_PROFILES))]
)
def test_bad_profile(tmp_path, capsys, content, message):
    path = write(tmp_path / "bad.json", content)
    code, err = cli(["jobs", path, "--dry-run"], capsys)
    assert (code, err) == (2, f"milarun: error: {path}: {message}\n")


def test_profile_too_large(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(jsonfile, "MAX_BYTES", 100)
    path = write(tmp_path / "big.json", {"a": {**OK_JOB, "description": "x" * 200}})
    code, err = cli(["jobs", path, "--dry-run"], capsys)
    assert (code, err) == (2, f"milarun: error: {path}: file too large (more than 100 bytes)\n")


def test_profile_file_name_is_the_suite_and_must_be_safe(tmp_path, capsys):
    path = write(tmp_path / "my profile.json", {"a": OK_JOB})
    code, err = cli(["jobs", path, "--dry-run"], capsys)
    assert (code, err) == (
        2,
        f"milarun: error: {path}: the file name 'my profile' is not a "
        "valid suite name: it becomes the suite of every result "
        "(letters, digits, '_' and '-')\n",
    )


# --- weights: `milarun report RESULTS --weights W` ----------------------------------

BAD_WEIGHTS = [
    (
        b'{"standard.convnet": {"weight": 1}, "caf\xc3": {"weight": 1}}',
        "not valid UTF-8 (byte 0xc3 at offset 40)",
    ),
    ('{"standard.convnet": {"weight": NaN}}', NAN),
    (
        '{"standard.convnet": {"weight": -Infinity}}',
        "invalid JSON: -Infinity is not allowed (numbers must be finite)",
    ),
    (
        {"standard.convnet": {"weight": -1}},
        "standard.convnet.weight: weight must be a finite number >= 0, not -1",
    ),
    (
        {"standard.convnet": {"weight": "2"}},
        "standard.convnet.weight: weight must be a finite number >= 0, not '2'",
    ),
    ({"convnet": {"weight": 1}}, f"convnet: 'convnet' {TEST_NAME}"),
    ({"../etc.passwd": {"weight": 1}}, f"'../etc.passwd': '../etc.passwd' {TEST_NAME}"),
    (
        {"standard.convnet\n": {"weight": 1}},
        f"'standard.convnet\\n': 'standard.convnet\\n' {TEST_NAME}",
    ),
    ({"standard.convnet": 1}, 'standard.convnet: must be an object {"weight": w}'),
    ({"standard.convnet": {}}, "standard.convnet.weight: missing"),
    (
        {"standard.convnet": {"weight": 1, "note": "x"}},
        "standard.convnet.note: unknown key (known: weight)",
    ),
    ([{"standard.convnet": 1}], 'weights must be an object {"suite.test": {"weight": w}}'),
    ('{"standard.convnet": ' + deep(100, "{}") + "}", TOO_DEEP),
]


@pytest.mark.parametrize(
    "content,message", BAD_WEIGHTS, ids=[f"weights-{i}" for i in range(len(BAD_WEIGHTS))]
)
def test_bad_weights(tmp_path, capsys, content, message):
    path = write(tmp_path / "w.json", content)
    code, err = cli(["report", RESULTS, "--weights", path], capsys)
    assert (code, err) == (2, f"milarun: error: {path}: {message}\n")


def test_weights_too_large(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(jsonfile, "MAX_BYTES", 2**20)
    path = write(tmp_path / "w.json", " " * (2**20 + 1))
    code, err = cli(["report", RESULTS, "--weights", path], capsys)
    assert (code, err) == (2, f"milarun: error: {path}: file too large (more than 1 MiB)\n")


# --- baselines and summaries: `milarun report RESULTS --compare B` ------------------


def _summary(**test):
    entry = {
        "n": 4,
        "failures": 0,
        "train": {"n": 4, "min": 76.0, "max": 84.0, "mean": 80.0, "std": 4.0},
        **test,
    }
    return {"format": "milarun-summary", "version": 1, "tests": {"standard.convnet": entry}}


BAD_BASELINES = [
    (
        b'{"format": "milarun-summary", "version": 1, "tests": {}, "origin": "\xe9t\xe9"}',
        "not valid UTF-8 (byte 0xe9 at offset 68)",
    ),
    (
        '{"standard.convnet": {"n": 4, "train": {"n": 4, "mean": Infinity}}}',
        "invalid JSON: Infinity is not allowed (numbers must be finite)",
    ),
    (
        _summary(train={"n": 4, "mean": -80.0}),
        "tests.standard.convnet.train.mean: must be >= 0, not -80.0",
    ),
    (_summary(n="4"), "tests.standard.convnet.n: must be an integer, not string"),
    (_summary(failures=5), "tests.standard.convnet.failures: more failures (5) than results (4)"),
    (_summary(runs=5), "tests.standard.convnet.runs: more runs with a rate (5) than rates (4)"),
    (
        _summary(pergpu={"../0": {"n": 1, "mean": 1.0}}),
        f"tests.standard.convnet.pergpu.'../0': '../0' is not a valid name ({NAME_RULE})",
    ),
    (
        {
            "format": "milarun-summary",
            "version": 1,
            "tests": {"standard.convnet\n": _summary()["tests"]["standard.convnet"]},
        },
        f"tests.'standard.convnet\\n': 'standard.convnet\\n' {TEST_NAME}",
    ),
    (
        {"format": "milarun-summary", "version": 7, "tests": {}},
        "version: summary format version 7 is not supported (expected 1)",
    ),
    ({"format": "milarun-summary", "version": 1}, "tests: missing"),
    (
        {**_summary(), "colour": "red"},
        "colour: unknown key (known: date, format, hosts, origin, provenance, skipped, "
        "steady_state, tests, version)",
    ),
    ({"standard.convnet": {"n": -1, "train": {}}}, "standard.convnet.n: must be >= 0, not -1"),
    (
        {"standard.convnet": {"n": 1, "train": {"mean": "fast"}}},
        "standard.convnet.train.mean: must be a finite number or null, not string",
    ),
    ('{"format": "milarun-summary", "version": 1, "tests": ' + deep(70, "{}") + "}", TOO_DEEP),
]


@pytest.mark.parametrize(
    "content,message", BAD_BASELINES, ids=[f"baseline-{i}" for i in range(len(BAD_BASELINES))]
)
def test_bad_baseline(tmp_path, capsys, content, message):
    path = write(tmp_path / "b.json", content)
    code, err = cli(["report", RESULTS, "--compare", path], capsys)
    assert (code, err) == (2, f"milarun: error: {path}: {message}\n")


def test_bad_summary_as_report_source(tmp_path, capsys):
    path = write(tmp_path / "s.json", _summary(train={"n": 4, "mean": 80.0, "std": -4.0}))
    code, err = cli(["report", path], capsys)
    assert (code, err) == (
        2,
        f"milarun: error: {path}: tests.standard.convnet.train.std: must be >= 0, not -4.0\n",
    )


# --- result files in a results folder: one warning each, the rest is used ------------


def _record(**changes):
    rec = json.loads(GOOD_RESULT.read_text())
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = rec
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value
    return rec


SAMPLE0 = "timings__train__samples__0"
BAD_RESULTS = [
    (b'{"version": 1, "name": "caf\xe9"}', "not valid UTF-8 (byte 0xe9 at offset 27)"),
    (
        json.dumps(_record(**{f"{SAMPLE0}__rate": 1.0})).replace('"rate": 1.0', '"rate": NaN', 1),
        NAN,
    ),
    (
        json.dumps(_record(**{f"{SAMPLE0}__rate": 1.0})).replace(
            '"rate": 1.0', '"rate": Infinity', 1
        ),
        "invalid JSON: Infinity is not allowed (numbers must be finite)",
    ),
    (
        json.dumps(_record(peak_memory_mib=1.0)).replace(
            '"peak_memory_mib": 1.0', '"peak_memory_mib": -1e400', 1
        ),
        "invalid JSON: number -1e400 is out of range",
    ),
    (_record(**{f"{SAMPLE0}__rate": -5.0}), "timings.train.samples.0.rate: must be >= 0, not -5.0"),
    (
        _record(**{f"{SAMPLE0}__rate": "fast"}),
        "timings.train.samples.0.rate: must be a finite number, not string",
    ),
    (
        _record(**{f"{SAMPLE0}__start": -1.0}),
        "timings.train.samples.0.start: must be >= 0, not -1.0",
    ),
    (_record(**{f"{SAMPLE0}__warmup": KeyError}), "timings.train.samples.0.warmup: missing"),
    (
        _record(**{"timings__program__duration": -3.0}),
        "timings.program.duration: must be >= 0, not -3.0",
    ),
    (
        _record(**{"timings__train__samples": {}}),
        "timings.train.samples: must be a list, not object",
    ),
    (_record(name="standard.../../../x"), f"name: 'standard.../../../x' {TEST_NAME}"),
    (
        _record(device="../../../../etc/hostname"),
        f"device: '../../../../etc/hostname' is not a valid name ({NAME_RULE})",
    ),
    (_record(name="standard.convnet\n"), f"name: 'standard.convnet\\n' {TEST_NAME}"),
    (_record(job_id="0.0\n"), f"job_id: '0.0\\n' is not a valid name ({NAME_RULE})"),
    (_record(success=KeyError), "success: missing"),
    (_record(success="yes"), "success: must be true or false, not string"),
    (_record(run=-1), "run: must be >= 0, not -1"),
    (_record(node="../node1"), f"node: '../node1' is not a valid name ({NAME_RULE})"),
    (_record(nodes=["node1", "a/b"]), f"nodes.1: 'a/b' is not a valid name ({NAME_RULE})"),
    (_record(node_count=0), "node_count: must be >= 1, not 0"),
    (_record(gpus_per_node=0), "gpus_per_node: must be >= 1, not 0"),
    (_record(distributed={"backend": "gloo"}), "distributed.world_size: missing"),
    (
        _record(distributed={"world_size": 2, "backend": "gloo", "hosts": [{"cpuset": [-1]}]}),
        "distributed.hosts.0.cpuset.0: must be >= 0, not -1",
    ),
    (
        _record(
            distributed={
                "world_size": 2,
                "backend": "gloo",
                "rendezvous": {"backend": "c10d", "port": 1},
            }
        ),
        "distributed.rendezvous.port: unknown key (known: backend, endpoint, id)",
    ),
    (_record(devices=["0"]), "devices.0: must be an integer, not string"),
    (_record(peak_memory_mib=-1.0), "peak_memory_mib: must be >= 0, not -1.0"),
    (
        _record(metrics={"loss": [1, 2]}),
        "metrics.loss: must be a string, a finite number, true or false or null, not list",
    ),
    (
        _record(success=False, error={"reason": "crashed"}),
        "error.reason: 'crashed' is not one of " + ", ".join(result_schema.FAIL_REASONS),
    ),
    (_record(success=False, error={"message": "?"}), "error.reason: missing"),
    (_record(version="1"), "version: bad format version '1'"),
    (_record(version=99), "version: format version 99 is newer than this milarun (13)"),
    (
        _record(colour="red"),
        "colour: unknown key (known: call, collectives, dataroot, device, device_count, "
        "devices, distributed, environ, error, fabric, finished, gpu_monitor, "
        "gpus_per_node, health, host, host_load, job, job_id, job_name, metrics, "
        "name, no_loss, node, node_count, nodes, partition, peak_memory_mib, "
        "placeholders, profile_trace, run, seed, serving, serving_load, started, "
        "success, suite, tags, timings, version, written_by)",
    ),
    ([1, 2], "not a result record (no 'version' or 'name' key)"),
    ('{"version": 1, "name": "s.t", "version": 1}', "invalid JSON: duplicate key 'version'"),
    ('{"version": 1, "metrics": {"x": ' + deep(10000) + "}}", TOO_DEEP),
    ('{"version": 1, "name": ', "invalid JSON: Expecting value at line 1, column 24"),
]


def _results_dir(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    shutil.copy(GOOD_RESULT, out)
    return out


@pytest.mark.parametrize(
    "content,message", BAD_RESULTS, ids=[f"result-{i}" for i in range(len(BAD_RESULTS))]
)
def test_bad_result_is_skipped_with_one_warning(tmp_path, capsys, content, message):
    results = _results_dir(tmp_path)
    bad = write(results / "standard.bad.J0.0.20261121-120000-000000.json", content)
    code, err = cli(["summary", results, "-o", tmp_path / "s.json"], capsys)
    assert (code, err) == (0, f"milarun: warning: skipped {bad}: {message}\n")
    summary = json.loads((tmp_path / "s.json").read_text())
    assert list(summary["tests"]) == ["standard.convnet"]
    assert summary["skipped"] == [bad.name]


def test_result_too_large(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(jsonfile, "MAX_BYTES", GOOD_RESULT.stat().st_size)
    results = _results_dir(tmp_path)
    bad = write(results / "big.json", " " * (GOOD_RESULT.stat().st_size + 1))
    code, err = cli(["summary", results, "-o", tmp_path / "s.json"], capsys)
    size = GOOD_RESULT.stat().st_size
    assert (code, err) == (
        0,
        f"milarun: warning: skipped {bad}: file too large (more than {size} bytes)\n",
    )


def test_stale_temporary_file_hidden_folders_and_journals(tmp_path, capsys):
    results = _results_dir(tmp_path)
    stale = write(results / ".tmp-abc123.json", '{"version": 1, "na')
    (results / ".milarun").mkdir()
    write(results / ".milarun" / "state.json", {"anything": 1})
    write(results / "standard.convnet.J0.0.journal.jsonl", '{"start": 0}\n')
    code, err = cli(["summary", results, "-o", tmp_path / "s.json"], capsys)
    assert (code, err) == (
        0,
        f"milarun: warning: skipped {stale}: stale temporary file (a "
        "writer died before its rename); not a result\n",
    )


def test_no_usable_result_is_one_error(tmp_path, capsys):
    results = tmp_path / "r"
    results.mkdir()
    bad = write(results / "x.json", _record(run=-1))
    code, err = cli(["report", results], capsys)
    assert code == 2
    assert err == (
        f"milarun: warning: skipped {bad}: run: must be >= 0, not -1\n"
        f"milarun: error: no usable result in {results} (1 file(s) skipped)\n"
    )


def test_rerun_of_a_bad_result_is_one_error(tmp_path, capsys):
    bad = write(tmp_path / "r.json", _record(device="../x"))
    code, err = cli(["rerun", bad, "--dry-run"], capsys)
    assert (code, err) == (
        2,
        f"milarun: error: {bad}: device: '../x' is not a valid name ({NAME_RULE})\n",
    )


# --- the report: bad values never reach the table; logs only from inside ------------


def test_negative_and_nan_rates_never_reach_the_table(tmp_path, capsys):
    results = _results_dir(tmp_path)
    neg = _record(name="standard.neg", job_name="neg", **{f"{SAMPLE0}__rate": -1e9})
    write(results / "neg.json", neg)
    write(
        results / "nan.json",
        json.dumps(_record(name="standard.nan", job_name="nan")).replace(
            '"rate": ', '"rate": NaN, "x": ', 1
        ),
    )
    with pytest.raises(SystemExit) as exc:
        main(["report", str(results)])
    out, err = capsys.readouterr()
    assert exc.value.code == 0 and err.count("milarun: warning: skipped") == 2
    assert "standard.convnet" in out
    assert "standard.neg" not in out and "standard.nan" not in out


def test_html_never_embeds_files_outside_the_results_folder(tmp_path, capsys):
    results = tmp_path / "r"
    shutil.copytree(RESULTS, results)
    secret = write(tmp_path / "secret.txt", "TOP-SECRET-LINE\n")
    log = results / "logs" / "standard.vae.J0.1.log"
    log.unlink()
    log.symlink_to(secret)
    # a crafted result pointing its log at /etc/hostname through '../'
    crafted = _record(
        name="standard.x",
        job_name="x",
        success=False,
        device="../../../../../etc/hostname",
        error={"reason": "error", "stderr_tail": "CRAFTED-TAIL"},
    )
    write(results / "crafted.json", crafted)
    out = tmp_path / "r.html"
    code, err = cli(["report", results, "--html", out], capsys)
    page = out.read_text()
    assert code == 0
    assert f"skipped {results / 'crafted.json'}: device:" in err
    assert "TOP-SECRET-LINE" not in page and "CRAFTED-TAIL" not in page
    assert "logs/standard.vae.J0.1.log" not in page
    assert "Killed" in page  # the result's own stderr tail is shown instead


def test_log_symlink_to_etc_hostname_is_not_read(tmp_path):
    from milarun.report.html import log_tail

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "s.t.J0.0.log").symlink_to("/etc/hostname")
    failure = {"name": "s.t", "run": 0, "device": "0", "stderr_tail": "own tail"}
    assert log_tail(tmp_path, failure) == ("own tail", "stderr")
    # a log that is inside is read
    (tmp_path / "logs" / "s.t.J0.0.log").unlink()
    (tmp_path / "logs" / "s.t.J0.0.log").write_text("inside\n")
    assert log_tail(tmp_path, failure) == ("inside", "logs/s.t.J0.0.log")


# --- the schemas and their documentation agree --------------------------------------


def test_every_schema_is_valid_draft_2020_12():
    from jsonschema import Draft202012Validator

    for name in jsonfile.SCHEMAS:
        Draft202012Validator.check_schema(jsonfile.load_schema(name))


def test_fail_reasons_agree_with_the_schema():
    enum = jsonfile.load_schema("result")["$defs"]["error"]["properties"]["reason"]["enum"]
    assert tuple(enum) == result_schema.FAIL_REASONS


def _documented_fields():
    doc = result_schema.__doc__
    section = doc[doc.index("Fields of a record") :]
    fields = set()
    for line in section.splitlines():
        m = re.match(r"^((?:``\w+``(?:, )?)+)", line)
        if m:
            fields |= set(re.findall(r"``(\w+)``", m.group(1)))
    return fields


def test_documented_result_fields_are_the_schema_fields():
    schema = jsonfile.load_schema("result")
    assert schema["additionalProperties"] is False
    assert _documented_fields() == set(schema["properties"])
    assert set(schema["required"]) <= set(schema["properties"])


def test_new_result_and_fixtures_validate():
    from milarun.formats.record import migrate, new_result, validate

    validate(new_result("s.t"))
    # the fixtures are of version 1: read through the no-op migrations to the current one
    for path in RESULTS.glob("standard.*.json"):
        if not any(k in path.name for k in ("broken", "future", "xss")):
            migrate(json.loads(path.read_text()), path)


def test_writer_check_rejects_what_json_cannot_carry():
    from milarun.errors import ResultFormatError
    from milarun.formats.record import new_result, validate

    rec = new_result("s.t")
    rec["metrics"]["loss"] = float("nan")
    with pytest.raises(ResultFormatError) as exc:
        validate(rec)
    assert (
        str(exc.value) == "metrics.loss: must be a string, a finite number, true or false or "
        "null, not nan"
    )


def test_schemas_ship_inside_the_package():
    from importlib import resources

    folder = resources.files("milarun.formats") / "schemas"
    assert sorted(p.name for p in folder.iterdir() if p.name.endswith(".json")) == sorted(
        f"{n}.schema.json" for n in jsonfile.SCHEMAS
    )


def _mutants(doc, rng, count):
    """``count`` copies of ``doc``, each with a few random values replaced, keys
    deleted or keys added (values drawn from a pool of edge cases)."""
    import copy

    pool = [
        0,
        1,
        -1,
        0.5,
        -0.5,
        1e308,
        2**1100,
        3.0,
        float("nan"),
        float("inf"),
        True,
        False,
        None,
        "x",
        "",
        "a.b",
        "../x",
        "a\n",
        "error",
        "per-gpu",
        [],
        {},
        [1],
        {"a": 1},
        [{"start": 0, "end": 1, "count": 1, "rate": -1, "warmup": False}],
    ]

    def nodes(x, path=()):
        yield path, x
        items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
        for k, v in items:
            yield from nodes(v, path + (k,))

    for _ in range(count):
        out = copy.deepcopy(doc)
        for _ in range(rng.randint(1, 3)):
            found = list(nodes(out))
            path, _ = rng.choice(found[1:])
            parent = out
            for k in path[:-1]:
                parent = parent[k]
            action = rng.random()
            if action < 0.7:
                parent[path[-1]] = copy.deepcopy(rng.choice(pool))
            elif action < 0.85 and isinstance(parent, dict):
                del parent[path[-1]]
            elif isinstance(parent, dict):
                parent[rng.choice(["extra", "a.b", "name", "0"])] = copy.deepcopy(rng.choice(pool))
        yield out


@pytest.mark.parametrize(
    "ref,doc",
    [
        ("result", GOOD_RESULT),
        ("result", RESULTS / "standard.vae.J0.1.FAIL.20261121-120005-000000.json"),
        ("summary", FIX / "expected" / "summary.json"),
        ("summary#/$defs/flat2020", FIX / "baseline2020.json"),
        ("weights", FIX / "weights.json"),
    ],
    ids=["result", "fail-result", "summary", "flat2020", "weights"],
)
def test_fast_check_agrees_with_jsonschema(ref, doc):
    # Valid documents skip jsonschema through fastjsonschema (and, in invalid
    # ones, long arrays are checked item by item with it); with milarun's finite
    # numbers, it must accept exactly what jsonschema itself accepts.
    import random

    import jsonschema

    schema = jsonfile.validator(ref).schema
    fast = jsonfile._accepts(schema)
    stock = jsonschema.validators.extend(
        jsonschema.Draft202012Validator, type_checker=jsonfile._validator_class().TYPE_CHECKER
    )
    slow = stock(schema)
    data = json.loads(doc.read_text())
    if ref == "result":  # fixtures of an older version: the schema is the current one's
        data["version"] = FORMAT_VERSION
    assert fast(data) and slow.is_valid(data)
    valid = 0
    for mutant in _mutants(data, random.Random(ref), 300):
        verdict = slow.is_valid(mutant)
        assert fast(mutant) == verdict, mutant
        valid += verdict
    assert 0 < valid < 300


@pytest.mark.parametrize(
    "text,message",
    [
        # inside an array of objects (whose values the count does not look into)
        ('{"s": [{"a": 1, "b": 2}, {"a": 1, "a": 2}]}', "duplicate key 'a'"),
        # inside an object held by an object of such an array
        ('{"s": [{"a": {"x": 1, "x": 2}}, {"a": 1}]}', "duplicate key 'x'"),
        # a duplicate whose first value held objects (they vanish from the parsed value)
        ('[{"a": [{}], "a": 1}]', "duplicate key 'a'"),
        # colons, brackets and escaped quotes inside strings count for nothing
        ('{"a:{": "[\\"", "b": ["]:", {"c\\\\": 1, "c\\\\": 2}]}', "duplicate key 'c\\\\'"),
        # the first problem the strict parse meets is the one named (an object's keys
        # are checked when it closes)
        ('[{"a": 1, "a": 2}, NaN]', "duplicate key 'a'"),
        ('[NaN, {"a": 1, "a": 2}]', "NaN is not allowed"),
        ('{"a": 1, "a": NaN}', "NaN is not allowed"),
    ],
)
def test_duplicate_keys_are_found_anywhere(text, message):
    """parse_json's fast path counts pairs, objects and arrays instead of hooking every
    object; whatever it cannot vouch for goes through the strict parse."""
    with pytest.raises(jsonfile.ResultFormatError, match=re.escape(message)):
        jsonfile.parse_json(text)


def test_a_valid_document_parses_the_same_by_either_path():
    text = (
        '{"s": [{"a": 1, "b": [1, {"c": 2}]}, {"a": 2.5}], "k:": "{[:", "e": [], '
        '"o": {}, "n": [[], [{}], [[1]]], "q": "\\"]"}'
    )
    assert jsonfile.parse_json(text) == json.loads(text)
