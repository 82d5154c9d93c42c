"""Strict JSON reading and schema checks for every file milarun reads.

Profiles, result records, summaries/baselines and weights all go through
:func:`read_json` (bounded size, strict UTF-8, finite numbers, bounded nesting,
no duplicate keys) and :func:`check` (the file type's JSON Schema in
``milarun/formats/schemas/``). Every problem is one ``MilarunError`` line naming the
file and the key path, e.g. ``r.json: timings.train.samples.3.rate: must be
>= 0, not -5``. fastjsonschema says whether a document is valid; only for an
invalid one does jsonschema say why. Likewise ``orjson`` parses the usual file and
the standard library's strict parse runs only for a file orjson cannot vouch for
(see :func:`parse_json`): the values and messages are the standard library's.

In milarun's schemas ``"type": "number"`` means a *finite* number (the
validator's type checker rejects NaN and ±Infinity, which the writer could
otherwise hand it), and ``x-message`` is a milarun annotation: the message
shown when that subschema fails (a string, or ``{keyword: message}``;
``{value}`` is the offending value and ``{type}`` its Python type name).
``x-missing`` on a property schema is the message when that property is
missing.
"""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from typing import IO, Any, Protocol, TypeAlias

import orjson

from ..errors import MilarunError, ResultFormatError
from .outfile import StrPath, kind

#: The error class a reader raises (a :class:`milarun.errors.MilarunError` subclass).
ErrorClass: TypeAlias = "type[MilarunError]"

#: Largest file read (bytes): 64 MiB.
MAX_BYTES = 64 * 2**20
#: Deepest nesting of arrays and objects accepted.
MAX_DEPTH = 64
#: How many schema errors are considered when choosing the one reported.
_MAX_ERRORS = 100
#: Longest rendering of a value inside a message (characters).
_VALUE_CHARS = 60


class Accepts(Protocol):
    """A predicate "this schema accepts ``value``" (``nan_free``: see :func:`first_error`)."""

    def __call__(self, value: Any, nan_free: bool = False) -> bool: ...


class _Reject(ValueError):
    """A value JSON allows but milarun does not (NaN, overflow, duplicate key)."""


def _constant(name: str) -> Any:
    raise _Reject(f"{name} is not allowed (numbers must be finite)")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Reject(f"number {text[:_VALUE_CHARS]} is out of range")
    return value


#: Marks a document that the fast path of :func:`parse_json` leaves to the strict one.
_AGAIN = object()


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _Reject(f"duplicate key {_show(key)}")
            seen.add(key)
    return out


# Bytes of valid JSON that matter for nesting, key counts and number overflow.
_ESCAPE = re.compile(rb"\\.", re.S)
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'[]{}":')
_STRING = re.compile(rb'"[^"]*"')
# digits -> "0", signs -> "1", exponent marks -> "e", anything else -> " "
_NUMBER_SHAPE = bytes(
    48 if c in b"0123456789" else 49 if c in b"+-" else 101 if c in b"eE" else 32
    for c in range(256)
)
#: A run of this many digits may be an integer orjson cannot hold (beyond int64/uint64).
_LONG_RUN = b"0" * 19


def _shape(raw: bytes) -> tuple[int, tuple[int, int, int]]:
    """``(depth, (pairs, objects, arrays))`` of valid JSON ``raw`` (bytes): its nesting
    depth, up to ``MAX_DEPTH + 1``, and how many key-value pairs, objects and
    arrays its text holds.

    Everything is C-speed: escapes dropped, then all but brackets, colons and
    quotes, then strings (``""`` pairs first: removing one either drops an empty
    string or joins two strings across a gap without brackets or colons); what
    is left are the brackets and the colons outside strings, one colon per
    key-value pair. Then innermost ``[]``/``{}`` pairs are peeled one level per pass.
    """
    if b"\\" in raw:
        raw = _ESCAPE.sub(b"", raw)
    rest = _STRING.sub(b"", raw.translate(None, _NOT_STRUCTURE).replace(b'""', b""))
    counts = rest.count(b":"), rest.count(b"{"), rest.count(b"[")
    rest = rest.replace(b":", b"")
    depth = 0
    while rest and depth <= MAX_DEPTH:
        rest = rest.replace(b"[]", b"x").replace(b"{}", b"x").replace(b"x", b"")
        depth += 1
    return depth, counts


def _depth(raw: bytes) -> int:
    """Nesting depth of valid JSON ``raw`` (bytes), up to ``MAX_DEPTH + 1`` (:func:`_shape`)."""
    return _shape(raw)[0]


def _parsed_counts(data: dict[str, Any] | list[Any]) -> tuple[int, int, int]:
    """``(pairs, objects, arrays)`` that the parsed ``data`` holds, except inside the
    objects of an array that holds only objects (rate samples, GPU readings:
    their pairs and they are counted, their values not looked into). Equal to
    :func:`_shape`'s counts of the text only when no object lost a key to a
    duplicate (the objects and arrays all counted, no pair missing)."""
    pairs = objects = arrays = 0
    values: Iterable[Any]
    stack = [data]
    pop, push = stack.pop, stack.extend
    while stack:
        node = pop()
        if type(node) is dict:
            objects += 1
            pairs += len(node)
            values = node.values()
        else:
            arrays += 1
            types = set(map(type, node))
            if types == {dict}:
                objects += len(node)
                pairs += sum(map(len, node))
                continue
            if dict not in types and list not in types:
                continue
            values = node
        push([v for v in values if type(v) is dict or type(v) is list])
    return pairs, objects, arrays


def _number_risks(raw: bytes) -> tuple[bool, bool]:
    """``(may_overflow, may_be_big)`` of JSON ``raw`` (bytes), from one C-speed
    ``translate`` (a cheap, conservative test: digits inside strings count too).

    ``may_be_big``: a run of 19 digits or more, so maybe an integer beyond
    ``-2**63 .. 2**64 - 1``, which ``orjson`` turns into a float (a wrong value);
    such a file is left to the standard library.

    ``may_overflow``: maybe a number beyond a float's range, so the standard
    library's parse checks each float (:func:`_float`): an exponent of three
    characters or more (digits, or a sign and two digits), or a long digit run
    (with an exponent of at most 99, only 210 digits or more can overflow).
    """
    shape = raw.translate(_NUMBER_SHAPE)
    big = _LONG_RUN in shape
    return big or b"0e000" in shape or b"0e100" in shape, big


def _read_upto(f: IO[bytes], size: int, most: int) -> bytes:
    """At most ``most`` bytes of file ``f`` whose ``fstat`` size is ``size``.

    ``f.read(most)`` alone would allocate ``most`` bytes (64 MiB) for every small
    file (a third of the time of reading a folder of 10,000 results); the size
    asked first is the file's own, plus one byte that finds a file grown since."""
    raw = f.read(min(size, most - 1) + 1)
    if len(raw) > size and len(raw) < most:
        raw += f.read(most - len(raw))
    return raw


def read_bytes(
    path: StrPath,
    error_cls: ErrorClass = ResultFormatError,
    max_bytes: int | None = None,
    what: str = "file",
) -> bytes:
    """The bytes of input file ``path``, read safely: only a regular file (a
    symlink to one is followed), at most ``max_bytes`` (default :data:`MAX_BYTES`).

    A FIFO, device, socket or folder is refused after ``stat``, without being
    opened (a FIFO would block forever, ``/dev/zero`` never end); the file is
    then opened with ``O_NONBLOCK`` and checked again with ``fstat``, so one
    swapped in meanwhile cannot block either.

    Raises:
        error_cls: missing, a broken symlink or a symlink loop, not a regular
            file, unreadable, or larger than ``max_bytes``; one line naming
            the file.
    """
    limit = MAX_BYTES if max_bytes is None else max_bytes
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISREG(mode):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            with open(fd, "rb") as f:
                st = os.fstat(fd)
                mode = st.st_mode
                raw = _read_upto(f, st.st_size, limit + 1) if stat.S_ISREG(mode) else b""
    except FileNotFoundError:
        if os.path.islink(path):
            raise error_cls("a broken symbolic link", path=path)
        raise error_cls(f"{what} not found", path=path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise error_cls("too many levels of symbolic links (a symlink loop)", path=path)
        raise error_cls(f"cannot read {what} ({exc.strerror})", path=path)
    if stat.S_ISDIR(mode):
        raise error_cls(
            f"is a directory, not a {what}" if what != "file" else "is a directory", path=path
        )
    if not stat.S_ISREG(mode):
        raise error_cls(f"is {kind(mode)}, not a regular file; not read", path=path)
    if len(raw) > limit:
        raise error_cls(f"file too large (more than {_size(limit)})", path=path)
    return raw


def read_json(
    path: StrPath,
    error_cls: ErrorClass = ResultFormatError,
    max_bytes: int | None = None,
    what: str = "file",
) -> Any:
    """Read one JSON file strictly.

    Args:
        path: the file.
        error_cls: the ``MilarunError`` subclass raised (``ProfileError`` for
            profiles, ``ResultFormatError`` for the others).
        max_bytes: size limit in bytes (default :data:`MAX_BYTES`, 64 MiB).
        what: the word used in "<what> not found" (e.g. ``"profile"``).

    Returns:
        the parsed value (dict, list, str, int, float, bool or None).

    Raises:
        error_cls: missing or unreadable file, not a regular file (a FIFO,
            device, socket or folder, never opened: see :func:`read_bytes`), a
            symlink loop, larger than ``max_bytes``, not UTF-8, not JSON,
            NaN/Infinity or an out-of-range number, a duplicate key, or nesting
            deeper than :data:`MAX_DEPTH`; the message names the file.
    """
    raw = read_bytes(path, error_cls=error_cls, max_bytes=max_bytes, what=what)
    return parse_json(raw, path=path, error_cls=error_cls)


def parse_json(
    raw: bytes | str, path: StrPath | None = None, error_cls: ErrorClass = ResultFormatError
) -> Any:
    """Parse JSON ``raw`` (bytes or str) with the rules of :func:`read_json`, without
    its size limit.

    The result and every message are those of the standard library's ``json``
    with a duplicate-key hook and finite floats (``tests/test_jsonfile_fast.py``
    compares them on a fuzz); most files are parsed by ``orjson`` instead, 4.5
    times faster, with the checks done by counting (see the comments below).

    Raises:
        error_cls: not UTF-8, not JSON, NaN/Infinity or an out-of-range number,
            a duplicate key, or nesting deeper than :data:`MAX_DEPTH`; one line
            naming ``path``.
    """
    if isinstance(raw, str):
        raw = raw.encode("utf-8", errors="surrogatepass")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error_cls(
            f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})", path=path
        )
    too_deep = f"nested deeper than {MAX_DEPTH} levels"
    may_overflow, may_be_big = _number_risks(raw)
    parse_float = _float if may_overflow else float
    # The usual file is parsed by orjson (4.5 times faster than the standard
    # library on result files). orjson refuses NaN, Infinity, a number beyond a
    # float, a lone surrogate escape, a BOM and nesting beyond 1024, and otherwise
    # gives the standard library's values but for an integer beyond 64 bits (a
    # float): a file that may hold one is not given to it. A file orjson refuses
    # or is not given, or a lone number or string, is parsed by the standard
    # library, still without a hook called for each object (a third of its time).
    # Either way the keys are counted instead of hooked: as many pairs as colons
    # in the text, and as many objects and arrays as brackets, means no duplicate
    # key (orjson, like the standard library, keeps the last value of a
    # duplicate). Anything else (an error, a duplicate, a shape the count does
    # not cover) is parsed again below, the strict way, which says what is wrong
    # as it always has.
    data: Any = _AGAIN
    if not may_be_big:
        try:
            data = orjson.loads(raw)
        except (ValueError, RecursionError):  # orjson.JSONDecodeError is a ValueError
            pass
    if type(data) is not dict and type(data) is not list:
        try:
            data = json.loads(text, parse_constant=_constant, parse_float=parse_float)
        except (ValueError, RecursionError):
            data = _AGAIN
    if isinstance(data, (dict, list)):
        depth, counts = _shape(raw)
        if _parsed_counts(data) == counts:
            if depth > MAX_DEPTH:
                raise error_cls(too_deep, path=path)
            return data
        data = _AGAIN
    if data is not _AGAIN:
        return data
    try:
        data = json.loads(
            text, parse_constant=_constant, parse_float=parse_float, object_pairs_hook=_pairs
        )
    except json.JSONDecodeError as exc:
        raise error_cls(
            f"invalid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}", path=path
        )
    except _Reject as exc:
        raise error_cls(f"invalid JSON: {exc}", path=path)
    except RecursionError:
        raise error_cls(too_deep, path=path)
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise error_cls(f"invalid JSON: {_one_line(str(exc))}", path=path)
    if isinstance(data, (dict, list)) and _depth(raw) > MAX_DEPTH:
        raise error_cls(too_deep, path=path)
    return data


def _size(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n} bytes"


def _one_line(text: str, limit: int = 200) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit] + "…"


def _show(value: Any) -> str:
    """A short one-line rendering of a value for messages."""
    if isinstance(value, str):
        text = repr(value)
    elif isinstance(value, (dict, list)):
        text = "an object" if isinstance(value, dict) else "a list"
        return text
    else:
        text = (
            json.dumps(value)
            if value is not None and not isinstance(value, float)
            else ("null" if value is None else repr(value))
        )
    return text if len(text) <= _VALUE_CHARS else text[:_VALUE_CHARS] + "…"


# --- schemas -------------------------------------------------------------------------

_BASE = "https://milarun.invalid/schemas/"
SCHEMAS = (
    "common",
    "profile",
    "result",
    "summary",
    "weights",
    "system",
    "thresholds",
    "bundle",
    "prices",
    "rules",
    "bidders",
)


#: Largest float; a bigger int is not a finite "number".
_MAX_FLOAT = sys.float_info.max


def _finite_number(checker: Any, instance: Any) -> bool:
    if isinstance(instance, bool):
        return False
    if isinstance(instance, int):
        return -_MAX_FLOAT <= instance <= _MAX_FLOAT
    return isinstance(instance, float) and math.isfinite(instance)


def _finite_integer(checker: Any, instance: Any) -> bool:
    return _finite_number(checker, instance) and (
        isinstance(instance, int) or instance.is_integer()
    )


def load_schema(name: str) -> dict[str, Any]:
    """The parsed schema ``milarun/formats/schemas/<name>.schema.json`` (a dict, as in the file)."""
    return _schemas()[name]


@functools.cache
def _schemas() -> dict[str, dict[str, Any]]:
    folder = resources.files("milarun.formats") / "schemas"
    return {
        name: json.loads((folder / f"{name}.schema.json").read_text(encoding="utf-8"))
        for name in SCHEMAS
    }


def _inline(node: Any, base: str) -> Any:
    """``node`` with every ``$ref`` replaced by its (inlined) target. Our schemas
    are not recursive; inlined, they need no registry and validate faster."""
    if isinstance(node, list):
        return [_inline(v, base) for v in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        ref = node["$ref"]
        name, _, fragment = ref.partition("#")
        if name.startswith(_BASE):
            name = name[len(_BASE) :]
        target_base = name.removesuffix(".schema.json") if name else base
        target = _schemas()[target_base]
        for part in filter(None, fragment.split("/")):
            target = target[part]
        out = _inline(target, target_base)
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return {"allOf": [out, _inline(rest, base)]} if rest else out
    return {
        k: (v if k in ("enum", "const") else _inline(v, base))
        for k, v in node.items()
        if k not in ("$defs", "$schema", "$id")
    }


@functools.cache
def _validator_class() -> Any:
    import jsonschema

    base = jsonschema.Draft202012Validator
    types = base.TYPE_CHECKER.redefine_many({"number": _finite_number, "integer": _finite_integer})
    items = base.VALIDATORS["items"]

    def fast_items(validator: Any, subschema: Any, instance: Any, schema: Any) -> Any:
        # In an invalid document, long arrays (rate samples, GPU readings) are
        # checked item by item with fastjsonschema; only failing items go through
        # jsonschema, which then words the error.
        if "prefixItems" in schema or not isinstance(instance, list):
            yield from items(validator, subschema, instance, schema)
            return
        accepts = _accepts(subschema)
        for index, item in enumerate(instance):
            if not accepts(item):
                yield from validator.descend(item, subschema, path=index)

    return jsonschema.validators.extend(base, validators={"items": fast_items}, type_checker=types)


@functools.cache
def _inlined(ref: str) -> Any:
    name, _, fragment = ref.partition("#")
    return _inline({"$ref": f"{name}.schema.json" + (f"#{fragment}" if fragment else "")}, name)


@functools.cache
def validator(ref: str) -> Any:
    """A validator for ``ref``: ``"result"`` (a whole schema) or
    ``"summary#/$defs/flat2020"`` (a part of one)."""
    return _validator_class()(_inlined(ref))


# --- whether: fastjsonschema ------------------------------------------------------------

# Keywords holding one schema, a list of schemas, or a map of names to schemas.
_ONE = ("items", "additionalProperties", "propertyNames", "not", "if", "then", "else")
_LIST = ("allOf", "anyOf", "oneOf")
_MAP = ("properties", "patternProperties")
_fast_cache: dict[int, tuple[Any, Accepts]] = {}


def _fast_schema(node: Any) -> Any:
    """``node`` (inlined) as fastjsonschema gets it: every "number" and "integer"
    also bounded by ±max float (fastjsonschema's numbers include ±Infinity and
    ints beyond a float), and ``const`` as a one-value ``enum`` (fastjsonschema
    2.22 cannot compile ``const`` with ``detailed_exceptions=False``)."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    out.update({k: _fast_schema(node[k]) for k in _ONE if k in node})
    out.update({k: [_fast_schema(s) for s in node[k]] for k in _LIST if k in node})
    out.update({k: {n: _fast_schema(s) for n, s in node[k].items()} for k in _MAP if k in node})
    types = node.get("type", ())
    if {"number", "integer"} & set([types] if isinstance(types, str) else types):
        out.setdefault("minimum", -_MAX_FLOAT)
        out.setdefault("maximum", _MAX_FLOAT)
    if "const" in out:
        out["allOf"] = [*out.get("allOf", ()), {"enum": [out.pop("const")]}]
    return out


def _has_nan(value: Any) -> bool:
    t = type(value)
    if t is float:
        return value != value
    if t is dict:
        return any(map(_has_nan, value.values()))
    if t is list:
        return any(map(_has_nan, value))
    return False


# --- long arrays of flat objects, checked by columns ---------------------------------
#
# fastjsonschema checks a rate sample in ~30 Python steps; a record holds hundreds of
# them. An array whose items are flat objects of typed scalars (rate samples, GPU
# readings) is checked a column at a time instead (the types of a column, then its
# least and greatest value), all in C loops. Whatever this cannot vouch for goes
# through the compiled per-item check, so the answer is always fastjsonschema's.

#: Python types of each JSON Schema type, as parsed JSON holds them (no bool in
#: "number"; a float in an "integer" column is left to the per-item check).
_COLUMN_TYPES: dict[str, tuple[type, ...]] = {
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "string": (str,),
    "null": (type(None),),
}
#: Keywords that say nothing about the value.
_NOTES = frozenset(("$comment", "x-message", "x-missing", "description", "title"))
_NUMBERS = frozenset((int, float))


def _column_rule(
    prop: Any,
) -> tuple[frozenset[type], Any, Any, int | None] | None:
    """``(types, minimum, maximum, max_length)`` of a property schema made only of
    ``type`` (scalars), ``minimum``, ``maximum`` and ``maxLength``; else None."""
    if not isinstance(prop, dict) or set(prop) - _NOTES - {
        "type",
        "minimum",
        "maximum",
        "maxLength",
    }:
        return None
    names = prop.get("type")
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not names or any(n not in _COLUMN_TYPES for n in names):
        return None
    low, high = bounds = [prop.get(k) for k in ("minimum", "maximum")]
    if any(b is not None and type(b) not in (int, float) for b in bounds):
        return None
    length = prop.get("maxLength")
    if length is not None and type(length) is not int:
        return None
    return (frozenset(t for n in names for t in _COLUMN_TYPES[n]), low, high, length)


def _column_checker(items: Any) -> Callable[[Sequence[Any]], bool] | None:
    """A predicate ``list -> bool`` that is True only when every element follows
    ``items`` (a flat object schema: ``type: object``, ``required``, ``properties``
    of :func:`_column_rule`), or None for any other schema. False means "not
    vouched for", not "invalid". An element with a key outside ``properties`` is
    not vouched for."""
    if (
        not isinstance(items, dict)
        or items.get("type") != "object"
        or set(items) - _NOTES - {"type", "required", "properties", "additionalProperties"}
        or not isinstance(items.get("properties"), dict)
    ):
        return None
    found = {k: _column_rule(p) for k, p in items["properties"].items()}
    required = items.get("required", [])
    if None in found.values() or not isinstance(required, list):
        return None
    rules = {k: rule for k, rule in found.items() if rule is not None}  # all of them
    known, required = frozenset(rules), frozenset(required)

    def check(array: Sequence[Any]) -> bool:
        if set(map(type, array)) != {dict}:
            return not array
        # key tuples hash faster than key sets; the items share one or two orders
        shapes = set(map(frozenset, set(map(tuple, array))))
        if not all(required <= keys <= known for keys in shapes):
            return False
        everywhere = frozenset.intersection(*shapes)
        for key, (types, low, high, length) in rules.items():
            if key in everywhere:
                column = [d[key] for d in array]
            elif any(key in keys for keys in shapes):
                column = [d[key] for d in array if key in d]
            else:
                continue
            seen = set(map(type, column))
            if not seen <= types:
                return False
            if low is not None or high is not None:
                numbers = column if seen <= _NUMBERS else [v for v in column if type(v) in _NUMBERS]
                # a NaN makes min/max give NaN or skip it: the test then fails or
                # holds for the other values (the NaN walk has the last word)
                if numbers and (
                    (low is not None and not min(numbers) >= low)
                    or (high is not None and not max(numbers) <= high)
                ):
                    return False
            if length is not None and str in seen:
                if max(len(v) for v in column if type(v) is str) > length:
                    return False
        return True

    return check


def _split_columns(
    schema: Any,
) -> tuple[Any, list[tuple[tuple[str, ...], Callable[[Sequence[Any]], bool], Any]]]:
    """``(schema', arrays)``: ``schema`` without the ``items`` of the arrays that
    :func:`_column_checker` can check, and those arrays as ``(keys, checker, items)``:
    the property names that lead to the array from the document's root, its
    checker and its items schema. Only arrays reached through ``properties``
    (which always apply) are taken."""
    arrays: list[tuple[tuple[str, ...], Callable[[Sequence[Any]], bool], Any]] = []

    def walk(node: Any, keys: tuple[str, ...]) -> Any:
        if not isinstance(node, dict):
            return node
        if (
            node.get("type") == "array"
            and "prefixItems" not in node
            and _column_checker(node.get("items")) is not None
        ):
            checker = _column_checker(node["items"])
            assert checker is not None  # just tested
            arrays.append((keys, checker, node["items"]))
            return {k: v for k, v in node.items() if k != "items"}
        if isinstance(node.get("properties"), dict):
            node = {
                **node,
                "properties": {k: walk(v, keys + (k,)) for k, v in node["properties"].items()},
            }
        return node

    return walk(schema, ()), arrays


def _accepts(schema: Any) -> Accepts:
    """The predicate ``(value, nan_free=False) -> bool`` "``schema`` (inlined) accepts
    ``value``", compiled by fastjsonschema once per schema object. ``nan_free``: the
    caller knows ``value`` holds no NaN (see :func:`first_error`)."""
    entry = _fast_cache.get(id(schema))
    if entry is None:
        import fastjsonschema

        # Our Draft 2020-12 schemas use only keywords with the same meaning in
        # draft 7 (fastjsonschema's default); inlined, they hold no $ref.
        fast = _fast_schema(schema)
        rest, arrays = _split_columns(fast)
        whole = fastjsonschema.compile(rest, use_default=False, detailed_exceptions=False)
        compiled = [
            (
                keys,
                check,
                fastjsonschema.compile(items, use_default=False, detailed_exceptions=False),
            )
            for keys, check, items in arrays
        ]

        def validate(value: Any) -> None:
            """fastjsonschema's check of ``value`` against ``fast``, long arrays by column."""
            whole(value)
            for keys, check, item in compiled:
                array = value
                for key in keys:
                    array = array.get(key) if isinstance(array, dict) else None
                if isinstance(array, (list, tuple)) and not check(array):
                    for element in array:
                        item(element)

        def accepts(value: Any, nan_free: bool = False) -> bool:
            try:
                validate(value)
            except fastjsonschema.JsonSchemaValueException:
                return False
            except TypeError:  # e.g. a non-str key of an in-memory dict
                pass
            else:
                if nan_free or not _has_nan(value):
                    return True
            # NaN passes every bound. Files cannot hold one (parse_json), but
            # in-memory documents can (write_summary checks before finite_json):
            # jsonschema's type checker then decides.
            return _validator_class()(schema).is_valid(value)

        entry = _fast_cache[id(schema)] = (schema, accepts)
    return entry[1]


def accepts(data: Any, ref: str, nan_free: bool = False) -> bool:
    """True when ``data`` follows schema ``ref`` (see :func:`validator`). Builds no
    message, so it is cheap for many small documents (journal events).
    ``nan_free``: as for :func:`first_error`."""
    return _accepts(_inlined(ref))(data, nan_free)


def first_error(data: Any, ref: str, nan_free: bool = False) -> tuple[list[str | int], str] | None:
    """Check ``data`` against schema ``ref`` (see :func:`validator`).

    ``nan_free``: True when ``data`` cannot hold a NaN, because it comes from
    :func:`parse_json` (which refuses NaN and infinities) or was made finite by
    the writer; the second walk that looks for one is then skipped (it is most
    of the cost of checking a large valid document). Every other check is the same.

    Returns:
        None when valid, else ``(key_path, message)``: ``key_path`` is the list
        of keys and indices to the offending value (a missing or unknown key
        included) and ``message`` one human line.
    """
    if _accepts(_inlined(ref))(data, nan_free):
        return None  # valid: jsonschema is not even imported
    from jsonschema.exceptions import best_match

    errors = validator(ref).iter_errors(data)
    first = next(errors, None)
    if first is None:
        # The two engines disagree (e.g. on "$" before a final newline): refuse,
        # since a hostile file is what finds such corners.
        return [], "does not follow its schema (refused by the fast validator)"
    pool = [first]
    for err in errors:
        pool.append(err)
        if len(pool) >= _MAX_ERRORS:
            break
    return describe(best_match([min(pool, key=_depth_of_key)]))


def _depth_of_key(error: Any) -> int:
    """Depth of the key an error names: a missing, unknown or badly named key is
    one level below the object that holds it. The shallowest error is reported
    (the first one, in schema order, among equals), since a deep error is often
    a consequence of a shallow one."""
    named_key = (
        error.validator in ("required", "additionalProperties")
        or "propertyNames" in error.absolute_schema_path
    )
    return len(error.absolute_path) + named_key


def check(
    data: Any,
    ref: str,
    path: StrPath | None = None,
    error_cls: ErrorClass = ResultFormatError,
    key_prefix: str | None = None,
    nan_free: bool = False,
) -> Any:
    """Validate ``data`` against schema ``ref``; return ``data`` when valid.
    ``nan_free``: as for :func:`first_error`.

    Raises:
        error_cls: one line ``<path>: <key.path>: <message>`` for the most
            relevant error (``key_prefix``, e.g. a group name, is put in
            front of the key path).
    """
    found = first_error(data, ref, nan_free)
    if found is None:
        return data
    keys, message = found
    if key_prefix is not None:
        keys = [key_prefix, *keys]
    raise error_cls(message, path=path, key=key_path(keys) or None)


def key_path(keys: Iterable[str | int]) -> str:
    """``["tests", "a.b", "n"]`` → ``"tests.a.b.n"`` (odd keys shown quoted)."""
    return ".".join(
        str(k) if isinstance(k, int) or re.fullmatch(r"[\w.@+-]{1,80}", k) else _show(k)
        for k in keys
    )


_TYPE_WORDS = {
    "string": "a string",
    "number": "a finite number",
    "integer": "an integer",
    "boolean": "true or false",
    "object": "an object",
    "array": "a list",
    "null": "null",
}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return repr(value)
        return "number"
    names: dict[type, str] = {str: "string", list: "list", dict: "object"}
    return names.get(type(value), type(value).__name__)


def _expected(types: str | list[str]) -> str:
    words = [_TYPE_WORDS.get(t, t) for t in ([types] if isinstance(types, str) else types)]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def describe(error: Any) -> tuple[list[str | int], str]:
    """``(key_path, message)`` of one ``jsonschema`` error, in milarun's words."""
    keys = list(error.absolute_path)
    kw, value, instance = error.validator, error.validator_value, error.instance
    schema = error.schema if isinstance(error.schema, dict) else {}
    if "propertyNames" in error.absolute_schema_path:
        # the offending thing is a key: name it in the path, not as a value
        keys.append(instance)
    if kw == "required":
        missing = next((k for k in value if k not in instance), value[0])
        keys.append(missing)
        prop = schema.get("properties", {}).get(missing, {})
        return keys, prop.get("x-missing", "missing") if isinstance(prop, dict) else "missing"
    if kw in ("additionalProperties", "unevaluatedProperties"):
        known = sorted(schema.get("properties", {}))
        extra = sorted(
            k
            for k in instance
            if k not in known
            and not any(re.search(p, k) for p in schema.get("patternProperties", {}))
        )
        if extra and value is False:
            keys.append(extra[0])
            return keys, f"unknown key (known: {', '.join(known)})"
    custom = schema.get("x-message")
    if isinstance(custom, dict):
        custom = custom.get(kw)
    if custom:
        return keys, (
            custom.replace("{value}", _show(instance)).replace("{type}", type(instance).__name__)
        )
    shown = _show(instance)
    if kw == "type":
        message = f"must be {_expected(value)}, not {_json_type(instance)}"
    elif kw == "enum":
        message = f"{shown} is not one of {', '.join(str(v) for v in value)}"
    elif kw == "const":
        message = f"must be {_show(value)}, not {shown}"
    elif kw == "minimum":
        message = f"must be >= {value:g}, not {shown}"
    elif kw == "exclusiveMinimum":
        message = f"must be > {value:g}, not {shown}"
    elif kw == "maximum":
        message = f"must be <= {value:g}, not {shown}"
    elif kw == "exclusiveMaximum":
        message = f"must be < {value:g}, not {shown}"
    elif kw == "maxLength":
        message = f"longer than {value} characters"
    elif kw == "minLength":
        message = "must not be empty" if value == 1 else f"shorter than {value} characters"
    elif kw == "maxItems":
        message = f"more than {value} items"
    elif kw == "minItems":
        message = "must not be empty" if value == 1 else f"fewer than {value} items"
    elif kw == "maxProperties":
        message = f"more than {value} keys"
    elif kw == "pattern":
        message = f"{shown} does not match {value}"
    else:
        message = _one_line(error.message)
    return keys, message
