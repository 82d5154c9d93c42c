"""parse_json's fast path (orjson, key counting) gives exactly what the strict
standard-library parse gives: the same value (types, float bits, key order) or the
same one-line error, on a fuzz of documents and on the edge cases orjson handles
differently (integers beyond 64 bits, lone surrogates, NaN, BOM, nesting)."""

import json
import math
import os
import random
import struct
import types
from pathlib import Path

import orjson
import pytest

from milarun.errors import ResultFormatError
from milarun.formats import jsonfile

FIXTURE = (
    Path(__file__).parent
    / "fixtures"
    / "results"
    / "standard.convnet.J0.0.20261121-120000-000000.json"
)


# --- the reference: the strict standard-library parse, as parse_json had it -----------


class _Refused(ValueError):
    pass


def _ref_constant(name):
    raise _Refused(f"{name} is not allowed (numbers must be finite)")


def _ref_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"number {text[:60]} is out of range")
    return value


def _ref_pairs(pairs):
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise _Refused(f"duplicate key {jsonfile._show(key)}")
        seen.add(key)
    return dict(pairs)


def _ref_depth(value):
    if isinstance(value, dict):
        return 1 + max(map(_ref_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_ref_depth, value), default=0)
    return 0


def _reference(raw):
    """parse_json before orjson, by its strict path alone (the hook on every object,
    every float checked), to which its fast path deferred for every message:
    ``("ok", value)`` or ``("error", message)``."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", errors="surrogatepass")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "error", f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
    too_deep = f"nested deeper than {jsonfile.MAX_DEPTH} levels"
    try:
        data = json.loads(
            text, parse_constant=_ref_constant, parse_float=_ref_float, object_pairs_hook=_ref_pairs
        )
    except json.JSONDecodeError as exc:
        return "error", f"invalid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
    except _Refused as exc:
        return "error", f"invalid JSON: {exc}"
    except RecursionError:
        return "error", too_deep
    except ValueError as exc:
        return "error", f"invalid JSON: {jsonfile._one_line(str(exc))}"
    if _ref_depth(data) > jsonfile.MAX_DEPTH:
        return "error", too_deep
    return "ok", data


def _actual(raw):
    try:
        return "ok", jsonfile.parse_json(raw)
    except ResultFormatError as exc:
        return "error", str(exc)


def _same(a, b):
    """Exactly equal: same types all the way down, float bits, key order."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return struct.pack("<d", a) == struct.pack("<d", b)
    if type(a) is dict:
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b


def _assert_agrees(raw):
    want, got = _reference(raw), _actual(raw)
    assert want[0] == got[0], (raw[:300], want, got)
    if want[0] == "ok":
        assert repr(want[1]) == repr(got[1]) and _same(want[1], got[1]), raw[:300]
    else:
        assert want[1] == got[1], raw[:300]


# --- the fuzz ---------------------------------------------------------------------------

_INTS = [
    0,
    1,
    -1,
    2**31,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**63 + 1,
    -(2**63),
    -(2**63) - 1,
    -(2**63) + 1,
    2**64 - 1,
    2**64,
    2**64 + 1,
    -(2**64),
    10**18,
    10**19 - 1,
    10**19,
    -(10**18),
    -(10**19),
    10**20,
    -(10**20),
    10**300,
    -(10**299),
]
_FLOATS = [
    "-0.0",
    "0.0",
    "1e308",
    "1.7976931348623157e308",
    "-1.7976931348623157e308",
    "5e-324",
    "4.9e-324",
    "2.2250738585072014e-308",
    "2.225073858507201e-308",
    "0.1",
    "1E+2",
    "1e-05",
    "1.5e-07",
    "123456789012345678e-30",
    "0.30000000000000004",
    "1234567890.123456789",
    "0.12345678901234567890123",
    "1e400",
    "-1e400",
    "1.7976931348623159e308",
    "2e-400",
    "1e-0000000000000000001",
    "-0",
    "1.0e+99",
    "1" + "0" * 210 + "e99",
    "9" * 19 + ".5",
    "1e0309",
    "7e22",
    "8.98846567431158e307",
]
_CHARS = [
    "a",
    "z",
    " ",
    "é",
    "中",
    "😀",
    "\x7f",
    "\u2028",
    "0",
    "9",
    "-",
    ":",
    ",",
    "{",
    "}",
    "[",
    "]",
    "e",
]
_ESCAPES = [
    '\\"',
    "\\\\",
    "\\/",
    "\\b",
    "\\f",
    "\\n",
    "\\r",
    "\\t",
    "\\u0000",
    "\\u00e9",
    "\\u4e2d",
    "\\ud83d\\ude00",
    "\\uFFFF",
    "\\u001f",
]
# lone surrogates: the standard library takes them, orjson refuses them
_LONE = ["\\ud800", "\\udc00", "\\ud800\\ud800", "\\udfff\\ud800", "\\udbff"]
_BAD_IN_STRINGS = ["\x01", "\\x", "\t", "\\u12", "\\U0041"]


def _random_float(rng):
    kind = rng.random()
    if kind < 0.4:  # any bit pattern, subnormals included
        while True:
            value = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
            if math.isfinite(value):
                return repr(value)
    if kind < 0.5:  # a subnormal
        return repr(struct.unpack("<d", rng.getrandbits(52).to_bytes(8, "little"))[0])
    if kind < 0.6:  # a long mantissa, written by hand
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 25)))
        exp = rng.choice(["", f"e{rng.randint(-30, 30)}", f"E+{rng.randint(0, 99)}"])
        return f"{rng.choice(['', '-'])}{rng.randint(0, 9)}.{digits}{exp}"
    if kind < 0.7:
        return repr(rng.uniform(-1e6, 1e6))
    return rng.choice(_FLOATS)


def _random_int(rng):
    kind = rng.random()
    if kind < 0.5:
        return str(rng.randint(-(10**6), 10**6))
    if kind < 0.8:
        return str(rng.choice(_INTS) + rng.randint(-2, 2))
    digits = rng.choice([17, 18, 19, 20, 21, 300, 310])
    return (
        rng.choice(["", "-"])
        + str(rng.randint(1, 9))
        + "".join(rng.choice("0123456789") for _ in range(digits - 1))
    )


def _random_string(rng, bad):
    parts = []
    for _ in range(rng.randint(0, 6)):
        kind = rng.random()
        if kind < 0.6:
            parts.append(rng.choice(_CHARS))
        elif kind < 0.9:
            parts.append(rng.choice(_ESCAPES))
        elif kind < 0.92:
            parts.append(rng.choice(_LONE))
        elif kind < 0.95:
            # a run of digits and dashes, as in session ids and dates
            parts.append(rng.choice(["20261121-120000-000000", "1" * 19, "2026-11-21T12:00:00"]))
        elif rng.random() < bad * 2:
            parts.append(rng.choice(_BAD_IN_STRINGS))
    return '"' + "".join(parts) + '"'


def _ws(rng):
    return rng.choice(["", "", "", " ", "\n  ", "\t", "\r\n"])


def _value(rng, depth, bad, container=False):
    kind = rng.random() * (0.6 if container else 1)
    if depth > 0 and kind < 0.35:
        keys = [_random_string(rng, bad) for _ in range(rng.randint(0, 5))]
        if keys and rng.random() < bad * 2:  # a duplicate key, at any depth
            keys.insert(rng.randrange(len(keys) + 1), rng.choice(keys))
        items = [f"{_ws(rng)}{k}{_ws(rng)}:{_ws(rng)}{_value(rng, depth - 1, bad)}" for k in keys]
        if items and rng.random() < bad / 4:
            items.append("")  # a trailing comma
        return "{" + ",".join(items) + _ws(rng) + "}"
    if depth > 0 and kind < 0.6:
        items = [_ws(rng) + _value(rng, depth - 1, bad) for _ in range(rng.randint(0, 5))]
        if items and rng.random() < bad / 4:
            items.append("")
        return "[" + ",".join(items) + _ws(rng) + "]"
    if kind < 0.7:
        return _random_float(rng)
    if kind < 0.82:
        return _random_int(rng)
    if kind < 0.94:
        return _random_string(rng, bad)
    if rng.random() < bad:
        return rng.choice(["NaN", "Infinity", "-Infinity", "nan", "tru", "01", "1.", ".5"])
    return rng.choice(["true", "false", "null"])


def _document(rng):
    bad = rng.choice([0.0, 0.0, 0.05, 0.3])
    text = _value(rng, rng.randint(1, 6), bad, container=rng.random() < 0.9)
    if rng.random() < 0.05:
        text = "[" * rng.randint(60, 70) + text + "]" * rng.randint(60, 70)
    if rng.random() < bad / 4:
        text = "\ufeff" + text
    if rng.random() < bad / 4:
        text = text[: rng.randrange(len(text) + 1)]
    if rng.random() < 0.2:
        text = _ws(rng) + text + _ws(rng)
    raw = text.encode("utf-8", errors="surrogatepass")
    if rng.random() < bad / 8:
        at = rng.randrange(len(raw) + 1)
        raw = raw[:at] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80"]) + raw[at:]
    return raw


def test_fuzz_agrees_with_the_strict_parse():
    rng = random.Random(20261126)
    outcomes = {"fast": 0, "refused": 0, "ok": 0, "error": 0, "big": 0, "duplicate": 0}
    for _ in range(4000):
        raw = _document(rng)
        _assert_agrees(raw)
        kind, result = _reference(raw)
        outcomes[kind] += 1
        outcomes["duplicate"] += kind == "error" and "duplicate key" in result
        if kind == "ok" and isinstance(result, (dict, list)):
            if jsonfile._number_risks(raw)[1]:
                outcomes["big"] += 1
            else:
                try:
                    orjson.loads(raw)
                    outcomes["fast"] += 1  # the fast path took it
                except orjson.JSONDecodeError:
                    outcomes["refused"] += 1
    # the fuzz covers each way through parse_json, not one of them only
    assert outcomes["fast"] > 1000 and outcomes["big"] > 100 and outcomes["refused"] > 20, sorted(
        outcomes.items()
    )
    assert outcomes["error"] > 200 and outcomes["duplicate"] > 50, sorted(outcomes.items())


def _nest(depth, inner="1"):
    return "[" * depth + inner + "]" * depth


@pytest.mark.parametrize(
    "text",
    [
        *(f"[{n}]" for n in _INTS),
        *(f"[{f}]" for f in _FLOATS),
        *_FLOATS,
        *map(str, _INTS),
        "[" + "9" * 5000 + "]",  # beyond the int-to-str digit limit: one line
        '["\\ud800"]',
        '{"\\udc00": ["\\ud83d\\ude00", "\\ud800\\ud800"]}',
        '"\\ud800"',
        "\ufeff[1]",
        "\ufeff",
        "[1,]",
        '{"a": 1,}',
        "[NaN]",
        "[-Infinity]",
        '{"a": Infinity}',
        "",
        " ",
        "[1] x",
        "[1]\x00",
        "[\x0c1]",
        '["a\x1f"]',
        "null",
        "true",
        "1.5",
        '"x"',
        _nest(jsonfile.MAX_DEPTH),
        _nest(jsonfile.MAX_DEPTH + 1),
        _nest(jsonfile.MAX_DEPTH - 1, "{}"),
        _nest(jsonfile.MAX_DEPTH, "{}"),
        _nest(1100),
        _nest(1100, "NaN"),
        '{"a": {"b": [{"c": 1, "c": 2}]}}',
        '[{"a": [{}], "a": 1}]',
        '{"a": 1, "a": 1}',
        '{"20261121-120000-000000": 18446744073709551616}',
    ],
)
def test_edge_cases_agree_with_the_strict_parse(text):
    _assert_agrees(text)
    _assert_agrees(text.encode("utf-8", errors="surrogatepass"))


def test_integers_beyond_64_bits_keep_their_value():
    """orjson would make them floats; parse_json must not."""
    for n in (2**64, -(2**63) - 1, 10**19, -(10**19), 10**300):
        value = jsonfile.parse_json(f'{{"n": [{n}]}}')["n"][0]
        assert type(value) is int and value == n


def test_a_long_mantissa_with_a_short_exponent_beyond_a_float_is_refused():
    """210 digits and e99 is beyond 1.8e308, though its exponent has two digits."""
    with pytest.raises(ResultFormatError, match="is out of range"):
        jsonfile.parse_json("[1" + "0" * 210 + "e99]")
    assert jsonfile.parse_json("[1" + "0" * 200 + "e99]") == [1e299]


def test_duplicate_keys_at_depth_are_refused():
    doc = {"s": [{"a": 1, "b": {"x": [1, 2, {"k": 1}]}}] * 3, "t": {"u": {"v": 1}}}
    text = json.dumps(doc)
    assert jsonfile.parse_json(text) == doc
    for bad in (
        text.replace('"k": 1', '"k": 1, "k": 2', 1),
        text.replace('"v": 1', '"v": 1, "v": 1'),
        text.replace('"s":', '"t": 1, "s":'),
    ):
        with pytest.raises(ResultFormatError, match="duplicate key"):
            jsonfile.parse_json(bad)


def test_a_result_file_is_parsed_by_orjson(monkeypatch):
    """The speed is the point: a usual result file never reaches the standard library."""
    calls = []
    fake_json = types.SimpleNamespace(
        loads=lambda *a, **k: calls.append(a) or json.loads(*a, **k),
        JSONDecodeError=json.JSONDecodeError,
        dumps=json.dumps,
    )
    monkeypatch.setattr(jsonfile, "json", fake_json)
    raw = FIXTURE.read_bytes()
    assert jsonfile.parse_json(raw) == json.loads(raw)
    assert calls == []
    # an integer beyond 64 bits goes to the standard library
    assert jsonfile.parse_json(b'{"n": 18446744073709551616}') == {"n": 2**64}
    assert len(calls) == 1


def test_read_bytes_reads_past_the_size_fstat_gives(tmp_path):
    """The read asks for the file's own size first: a file whose size says 0 (a /proc
    file) is still read whole, and the size limit still holds."""
    from milarun.errors import ResultFormatError
    from milarun.formats.jsonfile import read_bytes

    proc = "/proc/self/mountinfo"
    with open(proc, "rb") as f:
        whole = f.read()
    assert os.stat(proc).st_size == 0 and len(whole) > 100
    got = read_bytes(proc)
    assert got[:80] == whole[:80] and abs(len(got) - len(whole)) < 200
    with pytest.raises(ResultFormatError, match="too large"):
        read_bytes(proc, max_bytes=50)
    small = tmp_path / "r.json"
    small.write_bytes(b'{"a": 1}')
    assert read_bytes(small) == b'{"a": 1}'
    with pytest.raises(ResultFormatError, match="too large"):
        read_bytes(small, max_bytes=7)
    assert read_bytes(small, max_bytes=8) == b'{"a": 1}'
