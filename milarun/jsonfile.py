"""Strict JSON reading and schema checks for every file milarun reads.

Profiles, result records, summaries/baselines and weights all go through
:func:`read_json` (bounded size, strict UTF-8, finite numbers, bounded nesting,
no duplicate keys) and :func:`check` (the file type's JSON Schema in
``milarun/schemas/``). Every problem is one ``MilarunError`` line naming the
file and the key path, e.g. ``r.json: timings.train.samples.3.rate: must be
>= 0, not -5``.

In milarun's schemas ``"type": "number"`` means a *finite* number (the
validator's type checker rejects NaN and ±Infinity, which the writer could
otherwise hand it), and ``x-message`` is a milarun annotation: the message
shown when that subschema fails (a string, or ``{keyword: message}``;
``{value}`` is the offending value and ``{type}`` its Python type name).
``x-missing`` on a property schema is the message when that property is
missing.
"""

import functools
import json
import math
import re
from importlib import resources

from .errors import ResultFormatError

#: Largest file read (bytes): 64 MiB.
MAX_BYTES = 64 * 2**20
#: Deepest nesting of arrays and objects accepted.
MAX_DEPTH = 64
#: How many schema errors are considered when choosing the one reported.
_MAX_ERRORS = 100
#: Longest rendering of a value inside a message (characters).
_VALUE_CHARS = 60

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]")
_EMPTY_PAIR = re.compile(r"\[\]|\{\}")


class _Reject(ValueError):
    """A value JSON allows but milarun does not (NaN, overflow, duplicate key)."""


def _constant(name):
    raise _Reject(f"{name} is not allowed (numbers must be finite)")


def _float(text):
    value = float(text)
    if not math.isfinite(value):
        raise _Reject(f"number {text[:_VALUE_CHARS]} is out of range")
    return value


def _pairs(pairs):
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _Reject(f"duplicate key {_show(key)}")
            seen.add(key)
    return out


def _depth(text):
    """Nesting depth of valid JSON ``text``: strings dropped, then innermost
    ``[]``/``{}`` pairs peeled one level per pass (C-speed regex passes)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = 0
    while brackets and depth <= MAX_DEPTH:
        brackets = _EMPTY_PAIR.sub("", brackets)
        depth += 1
    return depth


def read_json(path, error_cls=ResultFormatError, max_bytes=None, what="file"):
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
        error_cls: missing or unreadable file, larger than ``max_bytes``, not
            UTF-8, not JSON, NaN/Infinity or an out-of-range number, a
            duplicate key, or nesting deeper than :data:`MAX_DEPTH`; the
            message names the file.
    """
    limit = MAX_BYTES if max_bytes is None else max_bytes
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except FileNotFoundError:
        raise error_cls(f"{what} not found", path=path)
    except IsADirectoryError:
        raise error_cls(f"is a directory, not a {what}" if what != "file"
                        else "is a directory", path=path)
    except OSError as exc:
        raise error_cls(f"cannot read {what} ({exc.strerror})", path=path)
    if len(raw) > limit:
        raise error_cls(f"file too large (more than {_size(limit)})", path=path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error_cls(f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                        path=path)
    return parse_json(text, path=path, error_cls=error_cls)


def parse_json(text, path=None, error_cls=ResultFormatError):
    """Parse JSON ``text`` with the rules of :func:`read_json` (no size limit)."""
    too_deep = f"nested deeper than {MAX_DEPTH} levels"
    try:
        data = json.loads(text, parse_constant=_constant, parse_float=_float,
                          object_pairs_hook=_pairs)
    except json.JSONDecodeError as exc:
        raise error_cls(f"invalid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}",
                        path=path)
    except _Reject as exc:
        raise error_cls(f"invalid JSON: {exc}", path=path)
    except RecursionError:
        raise error_cls(too_deep, path=path)
    except ValueError as exc:   # e.g. an integer of more than 4300 digits
        raise error_cls(f"invalid JSON: {_one_line(str(exc))}", path=path)
    if isinstance(data, (dict, list)) and _depth(text) > MAX_DEPTH:
        raise error_cls(too_deep, path=path)
    return data


def _size(n):
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n} bytes"


def _one_line(text, limit=200):
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit] + "…"


def _show(value):
    """A short one-line rendering of a value for messages."""
    if isinstance(value, str):
        text = repr(value)
    elif isinstance(value, (dict, list)):
        text = "an object" if isinstance(value, dict) else "a list"
        return text
    else:
        text = json.dumps(value) if value is not None and not isinstance(value, float) \
            else ("null" if value is None else repr(value))
    return text if len(text) <= _VALUE_CHARS else text[:_VALUE_CHARS] + "…"


# --- schemas -------------------------------------------------------------------------

_BASE = "https://milarun.invalid/schemas/"
SCHEMAS = ("common", "profile", "result", "summary", "weights")


def _finite_number(checker, instance):
    if isinstance(instance, bool):
        return False
    if isinstance(instance, int):
        return -1.7976931348623157e308 <= instance <= 1.7976931348623157e308
    return isinstance(instance, float) and math.isfinite(instance)


def _finite_integer(checker, instance):
    return _finite_number(checker, instance) and (
        isinstance(instance, int) or instance.is_integer())


def load_schema(name):
    """The parsed schema ``milarun/schemas/<name>.schema.json`` (a dict)."""
    return _schemas()[name]


@functools.lru_cache(maxsize=None)
def _schemas():
    folder = resources.files("milarun") / "schemas"
    return {name: json.loads((folder / f"{name}.schema.json").read_text(encoding="utf-8"))
            for name in SCHEMAS}


@functools.lru_cache(maxsize=None)
def _validator_class():
    import jsonschema

    base = jsonschema.Draft202012Validator
    types = base.TYPE_CHECKER.redefine_many({"number": _finite_number,
                                             "integer": _finite_integer})
    return jsonschema.validators.extend(base, type_checker=types)


@functools.lru_cache(maxsize=None)
def validator(ref):
    """A validator for ``ref``: ``"result"`` (a whole schema) or
    ``"summary#/$defs/flat2020"`` (a part of one)."""
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    # "$schema" is dropped: jsonschema would pick its stock validator class for
    # a schema that names its dialect, and lose milarun's finite "number".
    registry = Registry().with_resources(
        (_BASE + f"{n}.schema.json",
         Resource({k: v for k, v in s.items() if k != "$schema"}, specification=DRAFT202012))
        for n, s in _schemas().items())
    name, _, fragment = ref.partition("#")
    uri = _BASE + f"{name}.schema.json" + (f"#{fragment}" if fragment else "")
    return _validator_class()({"$ref": uri}, registry=registry)


def first_error(data, ref):
    """Check ``data`` against schema ``ref`` (see :func:`validator`).

    Returns:
        None when valid, else ``(key_path, message)``: ``key_path`` is the list
        of keys and indices to the offending value (a missing or unknown key
        included) and ``message`` one human line.
    """
    from jsonschema.exceptions import best_match

    errors = validator(ref).iter_errors(data)
    first = next(errors, None)
    if first is None:
        return None
    pool = [first]
    for err in errors:
        pool.append(err)
        if len(pool) >= _MAX_ERRORS:
            break
    return describe(best_match([min(pool, key=_depth_of_key)]))


def _depth_of_key(error):
    """Depth of the key an error names: a missing, unknown or badly named key is
    one level below the object that holds it. The shallowest error is reported
    (the first one, in schema order, among equals), since a deep error is often
    a consequence of a shallow one."""
    named_key = (error.validator in ("required", "additionalProperties")
                 or "propertyNames" in error.absolute_schema_path)
    return len(error.absolute_path) + named_key


def check(data, ref, path=None, error_cls=ResultFormatError, key_prefix=None):
    """Validate ``data`` against schema ``ref``; return ``data`` when valid.

    Raises:
        error_cls: one line ``<path>: <key.path>: <message>`` for the most
            relevant error (``key_prefix``, e.g. a group name, is put in
            front of the key path).
    """
    found = first_error(data, ref)
    if found is None:
        return data
    keys, message = found
    if key_prefix is not None:
        keys = [key_prefix, *keys]
    raise error_cls(message, path=path, key=key_path(keys) or None)


def key_path(keys):
    """``["tests", "a.b", "n"]`` → ``"tests.a.b.n"`` (odd keys shown quoted)."""
    return ".".join(str(k) if isinstance(k, int) or re.fullmatch(r"[\w.@+-]{1,80}", k)
                    else _show(k) for k in keys)


_TYPE_WORDS = {"string": "a string", "number": "a finite number", "integer": "an integer",
               "boolean": "true or false", "object": "an object", "array": "a list",
               "null": "null"}


def _json_type(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return repr(value)
        return "number"
    return {str: "string", list: "list", dict: "object"}.get(type(value), type(value).__name__)


def _expected(types):
    words = [_TYPE_WORDS.get(t, t) for t in ([types] if isinstance(types, str) else types)]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def describe(error):
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
        extra = sorted(k for k in instance if k not in known
                       and not any(re.search(p, k) for p in schema.get("patternProperties", {})))
        if extra and value is False:
            keys.append(extra[0])
            return keys, f"unknown key (known: {', '.join(known)})"
    custom = schema.get("x-message")
    if isinstance(custom, dict):
        custom = custom.get(kw)
    if custom:
        return keys, (custom.replace("{value}", _show(instance))
                      .replace("{type}", type(instance).__name__))
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
