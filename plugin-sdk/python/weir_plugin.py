"""Weir's Python plugin SDK: write a transform or a foreachBatch sink as a plain class, built into
a WebAssembly component with componentize-py. Copy this file beside your plugin.

    import weir_plugin as weir

    class KeepCompleted(weir.Transform):
        required = ("column",)                     # config keys; unknown keys are refused
        optional = {"equals": "completed"}         # with their defaults

        def __init__(self, config, schema):
            self.column, self.equals = config["column"], config["equals"]

        def process(self, batch, info):
            status = batch.column(self.column)     # one column crosses the boundary
            return weir.Output.keep([s == self.equals for s in status])

    Transformer = weir.export_transform(KeepCompleted)   # a sink: Writer = weir.export_sink(...)

The WIT contract (`wit/weir.wit`) hands columns over in Arrow's layout: strings as offsets plus
one byte buffer, booleans and validity as packed bitmaps, decimals as 16 little-endian bytes per
value. That layout is what makes a batch cheap to cross the boundary, but it is not what Python
code wants to read. This module turns it into Python values and back (`Batch`, `Column`,
`Output`), keeps the opened instance for you (`export_transform` / `export_sink`), reads the
config the way the Rust SDK does (same error messages), and wraps the host's imports: logging,
`random_u64`, keyed state (`state`) and Delta MERGE (`delta_merge`). Nothing here is per-row
across the boundary: each call reads whole buffers that have already been copied into the guest.

Bitmaps are handled as Python integers (`int.from_bytes`), which does the bit work in C rather
than in a Python loop.

The functions of the first version (`parse_config`, `column`, `Strings`, `keep`, ...) remain for
plugins written against the generated bindings directly (`plugins/python/filter_rows.py`).
"""

from __future__ import annotations

import copy
import datetime
import decimal
import json
import re
import struct
from itertools import islice
from typing import Any, Callable, Iterable, Iterator, Sequence

from componentize_py_types import Err
from wit_world.imports import host, types

# The world-specific imports: present only in the worlds that import them.
try:
    from wit_world.imports import keyed_state as _keyed_state
except ImportError:  # not world `stateful-transform`
    _keyed_state = None
try:
    from wit_world.imports import delta_merge as _delta_merge
except ImportError:  # not world `merge-sink`
    _delta_merge = None

__all__ = [
    # entry points
    "Transform",
    "RowTransform",
    "Sink",
    "export_transform",
    "export_sink",
    # data
    "Field",
    "Schema",
    "Batch",
    "BatchInfo",
    "Column",
    "Output",
    "Edit",
    "Selection",
    # errors
    "PluginError",
    "fatal",
    "retryable",
    "invalid_config",
    "invalid_input",
    # host
    "log",
    "log_trace",
    "log_debug",
    "log_info",
    "log_warn",
    "log_error",
    "random_u64",
    "state",
    "delta_merge",
    "MergeResult",
    # the first version's helpers
    "read_config",
    "parse_config",
    "type_name",
    "field_index",
    "column",
    "Strings",
    "is_valid",
    "pack_bits",
    "and_bits",
    "or_bits",
    "not_bits",
    "keep",
    "int32_column",
    "signature_text",
    "decimals",
]


# --- errors -----------------------------------------------------------------------------------
# The exported functions return `result<_, plugin-error>`; componentize-py maps a raised
# `Err(plugin-error)` to the error case. `PluginError` is such an `Err`, so an error is
# `raise weir.fatal("...")` both in a class given to `export_transform` and in a plugin written
# against the generated bindings.

_KINDS = {
    "fatal": types.ErrorKind.FATAL,
    "retryable": types.ErrorKind.RETRYABLE,
    "invalid-config": types.ErrorKind.INVALID_CONFIG,
    "invalid-input": types.ErrorKind.INVALID_INPUT,
}
_KIND_NAMES = {v: k for k, v in _KINDS.items()}
# As Rust's `ErrorKind` displays them.
_KIND_TEXT = {
    "fatal": "fatal",
    "retryable": "retryable",
    "invalid-config": "invalid config",
    "invalid-input": "invalid input",
}


class _ErrType(type):
    """componentize-py recognises an error by `Err == type(exception)`, an exact type test (a
    subclass of `Err` would trap). This metaclass makes `PluginError` compare equal to `Err`
    there, so that `raise weir.fatal(...)` works in a class given to `export_transform` and in a
    plugin on the generated bindings alike."""

    def __eq__(cls, other: object) -> bool:
        return other is Err or cls is other

    def __ne__(cls, other: object) -> bool:
        return not cls.__eq__(other)

    __hash__ = type.__hash__


class PluginError(Err, metaclass=_ErrType):
    """A plugin's failure as a value: `kind` (`"fatal"`, `"retryable"`, `"invalid-config"`,
    `"invalid-input"`), `message` and, when one row is to blame, `row`. Raise it; the SDK (or
    componentize-py, for a plugin on the generated bindings) returns it to the host as the WIT
    `plugin-error`. Any other exception is a trap: the host fails the batch quoting stderr."""

    __hash__ = object.__hash__

    def __init__(self, kind: str | types.ErrorKind, message: str, row: int | None = None) -> None:
        if isinstance(kind, str):
            try:
                kind = _KINDS[kind.replace("_", "-")]
            except KeyError:
                raise ValueError(f"unknown error kind {kind!r}, expected one of {', '.join(_KINDS)}") from None
        # `Err` is a frozen dataclass: its one field is set the way its own __init__ does.
        object.__setattr__(self, "value", types.PluginError(kind=kind, message=str(message), row=row))
        Exception.__init__(self, str(message))

    @property
    def kind(self) -> str:
        return _KIND_NAMES[self.value.kind]

    @property
    def message(self) -> str:
        return self.value.message

    @property
    def row(self) -> int | None:
        return self.value.row

    def at_row(self, row: int) -> "PluginError":
        """This error, blaming row `row` of the batch (returns itself)."""
        self.value.row = row
        return self

    def __str__(self) -> str:
        row = f" (row {self.row})" if self.row is not None else ""
        return f"{_KIND_TEXT[self.kind]}: {self.message}{row}"

    def __repr__(self) -> str:
        return f"PluginError({self.kind!r}, {self.message!r}, row={self.row!r})"

    @classmethod
    def _from_err(cls, e: Err) -> "PluginError":
        if isinstance(e, PluginError):
            return e
        v = e.value
        return cls(v.kind, v.message, v.row)


def fatal(message: str, row: int | None = None) -> PluginError:
    """The batch cannot be processed and retrying will not help."""
    return PluginError("fatal", message, row)


def retryable(message: str, row: int | None = None) -> PluginError:
    """A transient failure: the host may run the batch again."""
    return PluginError("retryable", message, row)


def invalid_config(message: str) -> PluginError:
    """The plugin's `config` from the pipeline file was rejected."""
    return PluginError("invalid-config", message, None)


def invalid_input(message: str, row: int | None = None) -> PluginError:
    """The batch does not have the shape the plugin needs."""
    return PluginError("invalid-input", message, row)


# --- config: the Rust SDK's way ---------------------------------------------------------------
# `export_transform`/`export_sink` read the config against the class's `required`, `optional`
# and `config_types`, and word every refusal exactly as the Rust SDK (serde with
# `deny_unknown_fields`, through serde_path_to_error) does, position included: `config.colum:
# unknown field `colum`, expected one of `column`, `equals` at line 1 column 8`. Positions are
# counted in the JSON text the host hands over, so the same pipeline gives the same message in
# either language.


class _Node:
    """A JSON value with where it is in the text (byte offsets)."""

    __slots__ = ("kind", "value", "start", "end", "items")

    def __init__(self, kind: str, value: Any, start: int, end: int, items=None) -> None:
        self.kind, self.value, self.start, self.end, self.items = kind, value, start, end, items


_WS = b" \t\n\r"
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def _skip(b: bytes, i: int) -> int:
    while i < len(b) and b[i] in _WS:
        i += 1
    return i


def _scan(b: bytes, i: int) -> tuple[_Node, int]:
    """One value of already validated JSON from offset `i`."""
    i = _skip(b, i)
    c = b[i : i + 1]
    if c == b"{":
        pairs, j = [], _skip(b, i + 1)
        if b[j : j + 1] != b"}":
            while True:
                key, j = _scan(b, j)
                j = _skip(b, j) + 1  # the colon
                value, j = _scan(b, j)
                pairs.append((key.value, key.end, value))
                j = _skip(b, j)
                if b[j : j + 1] == b",":
                    j += 1
                    continue
                break
        return _Node("map", {k: v.value for k, _, v in pairs}, i, j + 1, pairs), j + 1
    if c == b"[":
        items, j = [], _skip(b, i + 1)
        if b[j : j + 1] != b"]":
            while True:
                item, j = _scan(b, j)
                items.append(item)
                j = _skip(b, j)
                if b[j : j + 1] == b",":
                    j += 1
                    continue
                break
        return _Node("list", [n.value for n in items], i, j + 1, items), j + 1
    if c == b'"':
        j = i + 1
        while b[j] != 0x22:
            j += 2 if b[j] == 0x5C else 1
        return _Node("str", json.loads(b[i : j + 1]), i, j + 1), j + 1
    for word, kind, value in ((b"true", "bool", True), (b"false", "bool", False), (b"null", "null", None)):
        if b.startswith(word, i):
            return _Node(kind, value, i, i + len(word)), i + len(word)
    m = _NUMBER.match(b, i)
    text = m.group(0)
    if m.group(1) or m.group(2):
        return _Node("float", float(text), i, m.end()), m.end()
    n = int(text)
    # serde_json reads an integer as u64 (i64 when negative), and one past those as f64.
    if not (-(2**63) <= n < 2**64):
        return _Node("float", float(n), i, m.end()), m.end()
    return _Node("int", n, i, m.end()), m.end()


def _rust_debug(s: str) -> str:
    """`{:?}` of a Rust `str`, for `invalid type: string "..."`."""
    out = []
    for ch in s:
        if ch in "\"\\":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\0":
            out.append("\\0")
        elif ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0:
            out.append(f"\\u{{{ord(ch):x}}}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _unexpected(node: _Node) -> str:
    return {
        "str": lambda v: f"string {_rust_debug(v)}",
        "int": lambda v: f"integer `{v}`",
        "float": lambda v: f"floating point `{v!r}`",
        "bool": lambda v: f"boolean `{'true' if v else 'false'}`",
        "null": lambda v: "null",
        "map": lambda v: "map",
        "list": lambda v: "sequence",
    }[node.kind](node.value)


def _expected(spec) -> str:
    if isinstance(spec, list):
        return "a sequence"
    return {str: "a string", int: "i64", float: "f64", bool: "a boolean", dict: "a map"}[spec]


class _ConfigReader:
    """Checks one config text against a class's declared keys."""

    def __init__(self, text: str) -> None:
        self.b = text.encode()

    def at(self, offset: int) -> str:
        line = self.b.count(b"\n", 0, offset) + 1
        column = offset - self.b.rfind(b"\n", 0, offset) - 1
        return f"at line {line} column {column}"

    def where(self, node: _Node) -> int:
        # serde_json reports a scalar of the wrong type after reading it, and a map or a list
        # before its bracket (it only peeks at it).
        return node.start if node.kind in ("map", "list") else node.end

    def check(self, path: str, node: _Node, spec, nullable: bool) -> Any:
        if spec is None or (nullable and node.kind == "null"):
            return node.value
        if isinstance(spec, list):
            if node.kind != "list":
                raise self.bad_type(path, node, spec)
            inner = spec[0] if spec else None
            return [self.check(f"{path}[{i}]", item, inner, False) for i, item in enumerate(node.items)]
        ok = {
            str: node.kind == "str",
            int: node.kind == "int",
            float: node.kind in ("int", "float"),
            bool: node.kind == "bool",
            dict: node.kind == "map",
        }[spec]
        if not ok:
            raise self.bad_type(path, node, spec)
        if spec is int and not -(2**63) <= node.value < 2**63:
            raise invalid_config(
                f"{path}: invalid value: integer `{node.value}`, expected i64 {self.at(self.where(node))}"
            )
        return float(node.value) if spec is float else node.value

    def bad_type(self, path: str, node: _Node, spec) -> PluginError:
        return invalid_config(
            f"{path}: invalid type: {_unexpected(node)}, expected {_expected(spec)} {self.at(self.where(node))}"
        )


def _one_of(names: list[str]) -> str:
    quoted = [f"`{n}`" for n in names]
    if not quoted:
        return "there are no fields"
    if len(quoted) == 1:
        return f"expected {quoted[0]}"
    if len(quoted) == 2:
        return f"expected {quoted[0]} or {quoted[1]}"
    return "expected one of " + ", ".join(quoted)


def read_config(text: str, required: Iterable[str] = (), optional: dict[str, Any] | None = None,
                config_types: dict[str, Any] | None = None) -> dict[str, Any]:
    """Reads a plugin's JSON `config` as the Rust SDK reads it into a `#[serde(deny_unknown_fields)]`
    struct of the fields `required` then `optional` (in that order): an unknown key, a missing
    required key or a value of the wrong type (`config_types`: `str`, `int` (i64), `float`,
    `bool`, `dict`, `[str]` for a list of strings, ...) is an `invalid-config` error worded as
    serde words it. Returns the config with the defaults of `optional` filled in (copied); a key
    whose default is `None` also takes `null`. An empty text reads as `{}`."""
    optional = dict(optional or {})
    config_types = config_types or {}
    text = text if text.strip() else "{}"
    try:
        json.loads(text)
    except ValueError as e:
        raise invalid_config(f"config: {e}") from None
    reader = _ConfigReader(text)
    node, _ = _scan(reader.b, 0)
    fields = [*required, *(k for k in optional if k not in required)]
    if node.kind != "map":
        raise invalid_config(
            f"config: invalid type: {_unexpected(node)}, expected struct Config {reader.at(reader.where(node))}"
        )
    config: dict[str, Any] = {}
    for key, key_end, value in node.items:
        if key not in fields:
            raise invalid_config(f"config.{key}: unknown field `{key}`, {_one_of(fields)} {reader.at(key_end)}")
        if key in config:
            raise invalid_config(f"config: duplicate field `{key}` {reader.at(key_end)}")
        nullable = key in optional and optional[key] is None
        config[key] = reader.check(f"config.{key}", value, config_types.get(key), nullable)
    for key in fields:
        if key not in config:
            if key not in optional:
                raise invalid_config(f"config: missing field `{key}` {reader.at(node.end)}")
            config[key] = copy.deepcopy(optional[key])
    return config


# --- the first version's config reader (kept for plugins on the generated bindings) ------------


def parse_config(text: str, required: Iterable[str], optional: Iterable[str] = ()) -> dict[str, Any]:
    """Reads the plugin's JSON `config`, rejecting unknown and missing keys by name
    (`config.colum: unknown key`). Classes given to `export_transform` get `read_config`'s
    Rust-worded messages instead."""
    try:
        config = json.loads(text)
    except ValueError as e:
        raise invalid_config(f"config is not JSON: {e}") from None
    if not isinstance(config, dict):
        raise invalid_config("config must be a table")
    required = list(required)
    allowed = set(required) | set(optional)
    problems = [f"config.{k}: unknown key" for k in config if k not in allowed]
    problems += [f"config.{k}: missing" for k in required if k not in config]
    if problems:
        raise invalid_config("; ".join(problems))
    return config


# --- types and schemas ------------------------------------------------------------------------
# A type is named as the Rust SDK's `DataType` displays it, so that messages read the same in
# every language: boolean, int32, int64, float64, decimal128(P, S), utf8, timestamp-micros,
# date32.

_SIMPLE = {
    types.DataType_Boolean: "boolean",
    types.DataType_Int32: "int32",
    types.DataType_Int64: "int64",
    types.DataType_Float64: "float64",
    types.DataType_Utf8: "utf8",
    types.DataType_TimestampMicros: "timestamp-micros",
    types.DataType_Date32: "date32",
}
_BY_NAME = {name: cls for cls, name in _SIMPLE.items()}
_ALIASES = {"bool": "boolean", "string": "utf8", "timestamp": "timestamp-micros", "date": "date32",
            "timestamp_micros": "timestamp-micros"}
_DECIMAL = re.compile(r"decimal(?:128)?\(\s*(\d+)\s*,\s*(-?\d+)\s*\)")


def _type_text(data_type: types.DataType) -> str:
    if isinstance(data_type, types.DataType_Decimal128):
        return f"decimal128({data_type.value.precision}, {data_type.value.scale})"
    return _SIMPLE[type(data_type)]


def _data_type(text: str | types.DataType) -> types.DataType:
    if not isinstance(text, str):
        return text
    name = text.strip().lower()
    name = _ALIASES.get(name, name)
    cls = _BY_NAME.get(name)
    if cls is not None:
        return cls()
    m = _DECIMAL.fullmatch(name)
    if m:
        return types.DataType_Decimal128(types.DecimalType(precision=int(m.group(1)), scale=int(m.group(2))))
    raise ValueError(f"unknown type {text!r}: expected one of {', '.join(_BY_NAME)} or decimal128(P, S)")


class _Typed:
    """`type`, `precision` and `scale` of anything with a WIT `data_type` (fields, columns)."""

    data_type: types.DataType

    @property
    def type(self) -> str:
        """The type's name, `"int64"`, `"decimal128(12, 2)"`, ..."""
        return _type_text(self.data_type)

    @property
    def precision(self) -> int | None:
        d = self.data_type
        return d.value.precision if isinstance(d, types.DataType_Decimal128) else None

    @property
    def scale(self) -> int | None:
        d = self.data_type
        return d.value.scale if isinstance(d, types.DataType_Decimal128) else None


class Field(_Typed):
    """One named, typed column: `Field("total", "int64", True)`. `type` is the type's name
    (`"decimal128(38, 2)"`); `precision` and `scale` are set for decimals."""

    __slots__ = ("name", "data_type", "nullable")

    def __init__(self, name: str, type: str | types.DataType, nullable: bool = True) -> None:
        self.name = name
        self.data_type = _data_type(type)
        self.nullable = nullable


    def __eq__(self, other: object) -> bool:
        return isinstance(other, Field) and (self.name, self.type, self.nullable) == (other.name, other.type, other.nullable)

    def __hash__(self) -> int:
        return hash((self.name, self.type, self.nullable))

    def __repr__(self) -> str:
        return f"Field({self.name!r}, {self.type!r}, {self.nullable!r})"

    @classmethod
    def _from_wit(cls, f: types.Field) -> "Field":
        return cls(f.name, f.data_type, f.nullable)

    def _to_wit(self) -> types.Field:
        return types.Field(name=self.name, data_type=self.data_type, nullable=self.nullable)


class Schema(Sequence[Field]):
    """The ordered fields of a batch: a read-only list of `Field`s with lookups by name."""

    __slots__ = ("_fields",)

    def __init__(self, fields: Iterable[Field] = ()) -> None:
        self._fields = tuple(f if isinstance(f, Field) else Field._from_wit(f) for f in fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __getitem__(self, i):  # type: ignore[override]
        return self._fields[i] if isinstance(i, int) else list(self._fields[i])

    def __iter__(self) -> Iterator[Field]:
        return iter(self._fields)

    def __contains__(self, item: object) -> bool:
        if isinstance(item, str):
            return self.index(item) is not None
        return item in self._fields

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self._fields == other._fields

    def __repr__(self) -> str:
        return f"Schema({list(self._fields)!r})"

    @property
    def names(self) -> list[str]:
        return [f.name for f in self._fields]

    def index(self, name: str) -> int | None:  # type: ignore[override]
        """The position of the column named `name`, or None."""
        for i, f in enumerate(self._fields):
            if f.name == name:
                return i
        return None

    def field(self, name: str) -> Field | None:
        """The field named `name`, or None."""
        i = self.index(name)
        return None if i is None else self._fields[i]

    def with_field(self, field: Field) -> "Schema":
        """A new schema with `field` added at the end, or replacing the field of its name in
        place (what the host does with an output's `set_column`)."""
        i = self.index(field.name)
        if i is None:
            return Schema((*self._fields, field))
        return Schema((*self._fields[:i], field, *self._fields[i + 1 :]))

    def without_field(self, name: str) -> "Schema":
        """A new schema without the field named `name` (unchanged when there is none)."""
        return Schema(f for f in self._fields if f.name != name)

    def _to_wit(self) -> list[types.Field]:
        return [f._to_wit() for f in self._fields]


# --- values -----------------------------------------------------------------------------------


class Strings(Sequence[bytes]):
    """A utf8 column's values as a sequence of `bytes` (no decoding, so comparisons are
    bytewise, i.e. by code point, as in the Rust SDK). `text(i)` decodes one value."""

    __slots__ = ("offsets", "data")

    def __init__(self, values: types.Utf8Values) -> None:
        self.offsets = values.offsets
        self.data = values.data

    @classmethod
    def from_values(cls, values: Iterable[str | bytes]) -> "Strings":
        """Strings of `str` (encoded as UTF-8) or `bytes` values (`None`: empty)."""
        encoded = [v.encode() if isinstance(v, str) else b"" if v is None else bytes(v) for v in values]
        offsets, total = [0], 0
        for v in encoded:
            total += len(v)
            offsets.append(total)
        return cls(types.Utf8Values(offsets=offsets, data=b"".join(encoded)))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        return self.data[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[bytes]:
        data, offsets = self.data, self.offsets
        return (data[a:b] for a, b in zip(offsets, islice(offsets, 1, None)))

    def text(self, i: int) -> str:
        return self[i].decode()

    def texts(self) -> list[str]:
        """Every value decoded (one decode of the whole buffer when it is ASCII)."""
        data, offsets = self.data, self.offsets
        pairs = zip(offsets, islice(offsets, 1, None))
        if data.isascii():
            text = data.decode("ascii")
            return [text[a:b] for a, b in pairs]
        return [data[a:b].decode() for a, b in pairs]

    def _to_wit(self) -> types.Utf8Values:
        return types.Utf8Values(offsets=self.offsets, data=self.data)


def decimals(raw: bytes) -> list[int]:
    """A decimal128 column's unscaled values (16 little-endian bytes each)."""
    return [hi * 18446744073709551616 + lo for lo, hi in struct.iter_unpack("<Qq", raw)]


def _decimal_bytes(unscaled: Iterable[int]) -> bytes:
    return b"".join([v.to_bytes(16, "little", signed=True) for v in unscaled])


def is_valid(validity: bytes | None, row: int) -> bool:
    """Whether value `row` is not null (`validity` absent: every value is valid)."""
    return validity is None or bool(validity[row >> 3] >> (row & 7) & 1)


def pack_bits(bits: Iterable[bool], length: int) -> bytes:
    """Packs one bool per row into an Arrow bitmap (least significant bit first)."""
    # A string of digits read as one integer: the packing happens in C.
    digits = "".join(["1" if b else "0" for b in bits])[::-1]
    return int(digits or "0", 2).to_bytes((length + 7) // 8, "little")


def _unpack_bits(bitmap: bytes, length: int) -> list[bool]:
    """A bitmap's first `length` bits as bools."""
    if length == 0:
        return []
    bits = int.from_bytes(bitmap, "little") & ((1 << length) - 1)
    return [c == "1" for c in format(bits, f"0{length}b")[::-1]]


def and_bits(a: bytes, b: bytes) -> bytes:
    """Bitwise AND of two bitmaps of the same length."""
    return (int.from_bytes(a, "little") & int.from_bytes(b, "little")).to_bytes(len(a), "little")


def or_bits(a: bytes, b: bytes) -> bytes:
    """Bitwise OR of two bitmaps of the same length."""
    return (int.from_bytes(a, "little") | int.from_bytes(b, "little")).to_bytes(len(a), "little")


def not_bits(a: bytes, length: int) -> bytes:
    """Bitwise NOT of a bitmap of `length` bits (padding bits stay 0)."""
    full = (1 << length) - 1
    return (full & ~int.from_bytes(a, "little")).to_bytes((length + 7) // 8, "little")


def _bitmap(bits, length: int | None) -> bytes | None:
    """A validity or mask argument: None, a bitmap (bytes) or one bool per row."""
    if bits is None:
        return None
    if isinstance(bits, (bytes, bytearray, memoryview)):
        return bytes(bits)
    bits = list(bits)
    return pack_bits(bits, len(bits) if length is None else length)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()
_MICRO = datetime.timedelta(microseconds=1)
_DECIMAL_CONTEXT = decimal.Context(prec=100, Emax=1000, Emin=-1000)


def _timestamp(micros: int) -> datetime.datetime:
    return _EPOCH + datetime.timedelta(microseconds=micros)


def _micros(moment: datetime.datetime | int) -> int:
    if isinstance(moment, int):
        return moment
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return (moment - _EPOCH) // _MICRO


def _days(day: datetime.date | int) -> int:
    if isinstance(day, int):
        return day
    if isinstance(day, datetime.datetime):
        day = day.date()
    return day.toordinal() - _EPOCH_ORDINAL


def _unscaled(value, scale: int) -> int:
    """A number as an unscaled int at `scale`, exactly (a value with more digits is refused)."""
    if isinstance(value, int):
        return value * 10**scale if scale >= 0 else _unscaled(decimal.Decimal(value), scale)
    d = value if isinstance(value, decimal.Decimal) else decimal.Decimal(repr(value) if isinstance(value, float) else str(value))
    scaled = _DECIMAL_CONTEXT.scaleb(d, scale)
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{value} has more digits than scale {scale} holds (round it first, e.g. with Decimal.quantize)")
    return int(scaled)


def _decimal_value(unscaled: int, scale: int) -> decimal.Decimal:
    return _DECIMAL_CONTEXT.scaleb(decimal.Decimal(unscaled), -scale)


# --- columns ----------------------------------------------------------------------------------


class Column(_Typed):
    """One column, pulled from a batch (`batch.column(name)`) or built for an output
    (`Column.int64("total", values)`, `Column.from_values("total", "int64", [1, None])`).

    - `raw`: the values as they crossed the boundary: `list[int]` for int32, int64,
      timestamp-micros (µs) and date32 (days), `list[float]`, `Strings` for utf8 (`bytes`
      values), `bytes` for boolean (a bitmap) and decimal128 (16 bytes each; `unscaled()` gives
      the ints). A null's slot holds some value: check `validity`.
    - `validity`: a bitmap (bytes), or None when every value is valid.
    - `column[i]`, `to_list()`, iteration: Python values, `None` for null: int, float, bool,
      str, `decimal.Decimal` (exact, at the column's scale), `datetime.datetime` (UTC) for
      timestamps, `datetime.date`.
    """

    __slots__ = ("name", "data_type", "validity", "raw", "_length", "_values")

    def __init__(self, name: str, data_type: str | types.DataType, raw, validity=None, length: int | None = None) -> None:
        self.name = name
        self.data_type = _data_type(data_type)
        if isinstance(self.data_type, types.DataType_Utf8) and not isinstance(raw, Strings):
            raw = Strings.from_values(raw)
        self.raw = raw
        if length is None:
            length = None if isinstance(self.data_type, types.DataType_Boolean) else len(raw)
        self._length = length
        self.validity = _bitmap(validity, length)
        self._values: list | None = None

    # -- constructors --

    @classmethod
    def int64(cls, name: str, values: Sequence[int], validity=None) -> "Column":
        return cls(name, "int64", list(values), validity)

    @classmethod
    def int32(cls, name: str, values: Sequence[int], validity=None) -> "Column":
        return cls(name, "int32", list(values), validity)

    @classmethod
    def float64(cls, name: str, values: Sequence[float], validity=None) -> "Column":
        return cls(name, "float64", [float(v) for v in values], validity)

    @classmethod
    def boolean(cls, name: str, values: Sequence[bool], validity=None) -> "Column":
        values = list(values)
        return cls(name, "boolean", pack_bits(values, len(values)), validity, len(values))

    @classmethod
    def utf8(cls, name: str, values: Iterable[str | bytes], validity=None) -> "Column":
        return cls(name, "utf8", Strings.from_values(values), validity)

    @classmethod
    def decimal128(cls, name: str, precision: int, scale: int, unscaled: Sequence[int], validity=None) -> "Column":
        unscaled = list(unscaled)
        return cls(name, f"decimal128({precision}, {scale})", _decimal_bytes(unscaled), validity, len(unscaled))

    @classmethod
    def timestamp_micros(cls, name: str, micros: Sequence[int], validity=None) -> "Column":
        return cls(name, "timestamp-micros", list(micros), validity)

    @classmethod
    def date32(cls, name: str, days: Sequence[int], validity=None) -> "Column":
        return cls(name, "date32", list(days), validity)

    @classmethod
    def from_values(cls, name: str, type: str, values: Sequence[Any]) -> "Column":
        """A column of Python values of type `type` (a name as `Field.type` gives it), `None`
        being null; the validity is built for you and is absent when nothing is null. Decimals
        take Decimal, int, str or float values, which must fit the scale exactly; timestamps
        datetime (naive: UTC) or int µs; dates date or int days."""
        data_type = _data_type(type)
        values = list(values)
        validity = None
        if any(v is None for v in values):
            validity = pack_bits([v is not None for v in values], len(values))
        kind = type_name(data_type)
        if kind == "decimal128":
            scale = data_type.value.scale
            unscaled = []
            for row, v in enumerate(values):
                try:
                    unscaled.append(0 if v is None else _unscaled(v, scale))
                except (ValueError, ArithmeticError) as e:
                    raise fatal(f"column `{name}` ({_type_text(data_type)}): {e}", row) from None
            return cls(name, data_type, _decimal_bytes(unscaled), validity, len(values))
        if kind == "boolean":
            return cls(name, data_type, pack_bits(values, len(values)), validity, len(values))
        if kind == "utf8":
            return cls(name, data_type, Strings.from_values(["" if v is None else v for v in values]), validity)
        if kind == "timestamp":
            return cls(name, data_type, [0 if v is None else _micros(v) for v in values], validity)
        if kind == "date32":
            return cls(name, data_type, [0 if v is None else _days(v) for v in values], validity)
        if kind == "float64":
            return cls(name, data_type, [0.0 if v is None else float(v) for v in values], validity)
        return cls(name, data_type, [0 if v is None else v for v in values], validity)

    # -- reading --


    def __len__(self) -> int:
        if self._length is None:
            raise TypeError(f"column `{self.name}`: a boolean column built from a bitmap has no known length")
        return self._length

    def is_valid(self, i: int) -> bool:
        """Whether value `i` is not null."""
        return is_valid(self.validity, i)

    def valid_list(self) -> list[bool]:
        """One bool per row: True where the value is not null."""
        if self.validity is None:
            return [True] * len(self)
        return _unpack_bits(self.validity, len(self))

    @property
    def null_count(self) -> int:
        if self.validity is None:
            return 0
        return len(self) - bin(int.from_bytes(self.validity, "little") & ((1 << len(self)) - 1)).count("1")

    def unscaled(self) -> list[int]:
        """A decimal column's unscaled ints (a null's slot holds some value)."""
        return decimals(self.raw)

    def plain(self) -> list:
        """Every value as a Python value, ignoring validity (a null's slot holds some value)."""
        kind = type_name(self.data_type)
        raw = self.raw
        if kind in ("int32", "int64", "float64"):
            return raw
        if kind == "utf8":
            return raw.texts()
        if kind == "boolean":
            return _unpack_bits(raw, len(self))
        if kind == "decimal128":
            scale = self.data_type.value.scale
            return [_decimal_value(v, scale) for v in decimals(raw)]
        if kind == "timestamp":
            return [_EPOCH + datetime.timedelta(microseconds=v) for v in raw]
        fromordinal = datetime.date.fromordinal
        return [fromordinal(_EPOCH_ORDINAL + v) for v in raw]

    def to_list(self) -> list:
        """Every value as a Python value, `None` for null (computed once, then cached)."""
        if self._values is None:
            values = self.plain()
            if self.validity is not None:
                values = [v if ok else None for v, ok in zip(values, self.valid_list())]
            elif values is self.raw:
                values = list(values)
            self._values = values
        return self._values

    def __iter__(self) -> Iterator[Any]:
        return iter(self.to_list())

    def __getitem__(self, i):
        if self._values is not None or isinstance(i, slice):
            return self.to_list()[i]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} of column `{self.name}` ({len(self)} rows)")
        if not self.is_valid(i):
            return None
        kind, raw = type_name(self.data_type), self.raw
        if kind in ("int32", "int64", "float64"):
            return raw[i]
        if kind == "utf8":
            return raw.text(i)
        if kind == "boolean":
            return bool(raw[i >> 3] >> (i & 7) & 1)
        if kind == "decimal128":
            v = int.from_bytes(raw[16 * i : 16 * i + 16], "little", signed=True)
            return _decimal_value(v, self.data_type.value.scale)
        if kind == "timestamp":
            return _timestamp(raw[i])
        return datetime.date.fromordinal(_EPOCH_ORDINAL + raw[i])

    def get(self, i: int) -> Any:
        """`column[i]`: row i's value, or None."""
        return self[i]

    def __repr__(self) -> str:
        return f"Column({self.name!r}, {self.type!r}, {len(self) if self._length is not None else '?'} rows)"

    # -- crossing the boundary --

    @classmethod
    def _from_wit(cls, c: types.Column, rows: int) -> "Column":
        values = c.values.value
        if isinstance(c.values, types.ColumnValues_Utf8):
            values = Strings(values)
        col = cls.__new__(cls)
        col.name, col.data_type, col.validity, col.raw = c.name, c.data_type, c.validity, values
        col._length, col._values = rows, None
        return col

    def _to_wit(self) -> types.Column:
        raw = self.raw
        values = {
            "boolean": types.ColumnValues_Boolean,
            "int32": types.ColumnValues_Int32,
            "int64": types.ColumnValues_Int64,
            "float64": types.ColumnValues_Float64,
            "decimal128": types.ColumnValues_Decimal128,
            "timestamp": types.ColumnValues_TimestampMicros,
            "date32": types.ColumnValues_Date32,
        }.get(type_name(self.data_type))
        wit_values = types.ColumnValues_Utf8(raw._to_wit()) if values is None else values(raw)
        return types.Column(name=self.name, data_type=self.data_type, validity=self.validity, values=wit_values)


# --- batches ----------------------------------------------------------------------------------


class BatchInfo:
    """What the plugin is being called for. A replayed batch has the same `batch_id` and
    `timestamp_micros` and a higher `attempt`. `timestamp` is the batch clock as a UTC
    `datetime`: use it rather than the wall clock, so that a replay computes the same."""

    __slots__ = ("query_id", "batch_id", "attempt", "timestamp_micros", "partition")

    def __init__(self, query_id: str = "", batch_id: int = 0, attempt: int = 0, timestamp_micros: int = 0,
                 partition: int = 0) -> None:
        self.query_id, self.batch_id, self.attempt = query_id, batch_id, attempt
        self.timestamp_micros, self.partition = timestamp_micros, partition

    @classmethod
    def _from_wit(cls, i: types.BatchInfo) -> "BatchInfo":
        return cls(i.query_id, i.batch_id, i.attempt, i.timestamp_micros, i.partition)

    @property
    def timestamp(self) -> datetime.datetime:
        return _timestamp(self.timestamp_micros)

    def __repr__(self) -> str:
        return (f"BatchInfo(query_id={self.query_id!r}, batch_id={self.batch_id}, attempt={self.attempt}, "
                f"timestamp_micros={self.timestamp_micros}, partition={self.partition})")


class Batch:
    """One micro-batch, owned by the host. Columns are pulled by name, each once per batch (then
    cached): only what the plugin reads crosses the boundary. `raw` is the host's resource."""

    __slots__ = ("raw", "_rows", "_schema", "_columns")

    def __init__(self, raw: types.Batch) -> None:
        self.raw = raw
        self._rows: int | None = None
        self._schema: Schema | None = None
        self._columns: dict[int, Column] = {}

    @property
    def num_rows(self) -> int:
        if self._rows is None:
            self._rows = self.raw.num_rows()
        return self._rows

    def __len__(self) -> int:
        return self.num_rows

    @property
    def schema(self) -> Schema:
        if self._schema is None:
            self._schema = Schema(self.raw.schema())
        return self._schema

    def column(self, name: str) -> Column:
        """The column named `name`, or an `invalid-input` error naming it and the batch's
        columns (as in Rust: `the batch has no column `x` (columns: a, b)`)."""
        index = self.schema.index(name)
        if index is None:
            raise invalid_input(f"the batch has no column `{name}` (columns: {', '.join(self.schema.names)})")
        return self.column_at(index)

    def column_at(self, index: int) -> Column:
        """The column at position `index` of `schema`."""
        col = self._columns.get(index)
        if col is None:
            width = len(self.schema)
            if not 0 <= index < width:
                raise invalid_input(f"column index {index} is out of range for a batch of {width} columns")
            col = self._columns[index] = Column._from_wit(self.raw.column(index), self.num_rows)
        return col

    def to_ipc(self) -> bytes:
        """The whole batch as an Arrow IPC stream."""
        return self.raw.to_ipc()

    def rows(self, *names: str) -> Iterator[dict[str, Any]]:
        """The rows as dicts of the named columns (every column when none is named), values as
        `Column.to_list` gives them. The columns are pulled once; only Python loops."""
        names = names or tuple(self.schema.names)
        lists = [self.column(n).to_list() for n in names]
        if not lists:
            return (dict() for _ in range(self.num_rows))
        return (dict(zip(names, values)) for values in zip(*lists))


# --- output -----------------------------------------------------------------------------------


class Selection:
    """Which rows to keep: `Selection.mask(bitmap)` (one bit per row, least significant bit
    first), `Selection.from_bools([...])` or `Selection.indices([...])` (ascending)."""

    __slots__ = ("_wit",)

    def __init__(self, wit) -> None:
        self._wit = wit

    @classmethod
    def mask(cls, bitmap: bytes) -> "Selection":
        return cls(types.Selection_Mask(bytes(bitmap)))

    @classmethod
    def from_bools(cls, keep: Iterable[bool]) -> "Selection":
        keep = list(keep)
        return cls(types.Selection_Mask(pack_bits(keep, len(keep))))

    @classmethod
    def indices(cls, rows: Iterable[int]) -> "Selection":
        return cls(types.Selection_Indices(list(rows)))

    @classmethod
    def _of(cls, selection) -> "Selection":
        if isinstance(selection, Selection):
            return selection
        if isinstance(selection, (bytes, bytearray, memoryview)):
            return cls.mask(selection)
        return cls.from_bools(selection)


class Output:
    """What a transform's `process` returns (and what `delta_merge.merge` takes as `rows`):
    edits of the input, so that columns the plugin does not touch never cross back.

    - `Output.keep(selection)`: keep some rows (a bitmap, one bool per row, or a `Selection`);
    - `Output.unchanged()`: the input as it is;
    - `Output.edit().set_column(col).drop_column("x").keep(selection)`: chainable;
    - `Output.ipc(data)`: a whole new batch as an Arrow IPC stream.
    """

    @staticmethod
    def keep(selection) -> "Edit":
        return Edit().keep(selection)

    @staticmethod
    def unchanged() -> "Edit":
        return Edit()

    @staticmethod
    def edit() -> "Edit":
        return Edit()

    @staticmethod
    def ipc(data: bytes) -> "Output":
        return _Ipc(bytes(data))

    def _to_wit(self) -> types.TransformOutput:
        raise NotImplementedError


class Edit(Output):
    """Edits of the input batch: columns to set (add, or replace by name), columns to drop, and
    the rows to keep (applied after the column edits)."""

    __slots__ = ("set_columns", "drop_columns", "selection")

    def __init__(self) -> None:
        self.set_columns: list[Column] = []
        self.drop_columns: list[str] = []
        self.selection: Selection | None = None

    def set_column(self, column: Column) -> "Edit":
        self.set_columns.append(column)
        return self

    def drop_column(self, name: str) -> "Edit":
        self.drop_columns.append(name)
        return self

    def keep(self, selection) -> "Edit":  # type: ignore[override]
        self.selection = Selection._of(selection)
        return self

    def _to_wit(self) -> types.TransformOutput:
        return types.TransformOutput_Edit(
            types.Edit(
                set_columns=[c._to_wit() for c in self.set_columns],
                drop_columns=list(self.drop_columns),
                keep=None if self.selection is None else self.selection._wit,
            )
        )


class _Ipc(Output):
    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def _to_wit(self) -> types.TransformOutput:
        return types.TransformOutput_Ipc(self.data)


def _output_to_wit(output, what: str) -> types.TransformOutput:
    if isinstance(output, Output):
        return output._to_wit()
    if isinstance(output, (types.TransformOutput_Edit, types.TransformOutput_Ipc)):
        return output
    raise fatal(
        f"{what} returned {type(output).__name__}, not an Output "
        "(return weir.Output.unchanged() to keep the batch as it is)"
    )


# --- entry points -----------------------------------------------------------------------------


class Transform:
    """A transform: subclass it, then `Transformer = weir.export_transform(YourClass)`.

    - `required`: the config keys that must be given; `optional`: the others with their
      defaults; `config_types`: a key's type (`str`, `int`, `float`, `bool`, `dict`, `[str]`),
      checked with Rust's messages. Unknown keys are refused, naming them.
    - `__init__(config, schema)`: once per instance, with the config (defaults filled in) and
      the input's `Schema`; raise `invalid_config` / `invalid_input` to refuse them.
    - `output_schema(schema)`: the output's schema (by default the input's).
    - `process(batch, info)`: once per micro-batch; returns an `Output`.
    """

    required: Sequence[str] = ()
    optional: dict[str, Any] = {}
    config_types: dict[str, Any] = {}

    def __init__(self, config: dict[str, Any], schema: Schema) -> None:
        self.config = config
        self.input_schema = schema

    def output_schema(self, schema: Schema) -> Schema:
        return schema

    def process(self, batch: Batch, info: BatchInfo) -> Output:
        raise NotImplementedError(f"{type(self).__name__}.process")


class Sink:
    """A foreachBatch sink: subclass it, then `Writer = weir.export_sink(YourClass)`. Config as
    for `Transform`; `write_batch(batch, info)` once per micro-batch. The same `info.batch_id`
    may come again after a failure: the output must then look as if it came once."""

    required: Sequence[str] = ()
    optional: dict[str, Any] = {}
    config_types: dict[str, Any] = {}

    def __init__(self, config: dict[str, Any], schema: Schema) -> None:
        self.config = config
        self.input_schema = schema

    def write_batch(self, batch: Batch, info: BatchInfo) -> None:
        raise NotImplementedError(f"{type(self).__name__}.write_batch")


_MISSING = object()


class RowTransform(Transform):
    """A transform written one row at a time: define `row(self, row, info)`, where `row` is a
    dict of the columns named in `columns` (default: every column). Return `True` to keep the
    row as it is, `False`/`None` to drop it, or a dict to keep it and set the columns it names
    (each must be in `output_schema`, e.g. `schema.with_field(weir.Field("x", "int64"))`).
    The SDK builds the keep mask and the output columns, so the result crosses back as one edit.
    A `PluginError` raised without a row gets the current row's index."""

    columns: Sequence[str] | None = None

    def row(self, row: dict[str, Any], info: BatchInfo):
        return True

    def process(self, batch: Batch, info: BatchInfo) -> Output:
        rows = batch.num_rows
        names = list(self.columns) if self.columns is not None else batch.schema.names
        lists = [batch.column(n).to_list() for n in names]
        records = (dict(zip(names, values)) for values in zip(*lists)) if lists else (dict() for _ in range(rows))
        keep = [False] * rows
        sets: dict[str, list] = {}
        row_fn = self.row
        for i, record in enumerate(records):
            try:
                result = row_fn(record, info)
            except PluginError as e:
                if e.row is None:
                    e.at_row(i)
                raise
            if result is True:
                keep[i] = True
            elif result is None or result is False:
                pass
            elif isinstance(result, dict):
                keep[i] = True
                for name, value in result.items():
                    values = sets.get(name)
                    if values is None:
                        values = sets[name] = [_MISSING] * rows
                    values[i] = value
            else:
                raise fatal(f"{type(self).__name__}.row returned {type(result).__name__}: return True, False/None or a dict", i)
        out = Output.edit()
        schema = getattr(self, "_weir_output_schema", None) or batch.schema
        for name, values in sets.items():
            field = schema.field(name)
            if field is None:
                raise fatal(f"{type(self).__name__}.row set column `{name}`, which output_schema does not declare")
            if batch.schema.index(name) is not None:
                base = batch.column(name).to_list()
                values = [base[i] if v is _MISSING else v for i, v in enumerate(values)]
            else:
                values = [None if v is _MISSING else v for v in values]
            out.set_column(Column.from_values(name, field.data_type, values))
        if not all(keep):
            out.keep(keep)
        return out


def _open_instance(cls, config: str, input_schema: list[types.Field]):
    schema = Schema(input_schema)
    parsed = read_config(config, cls.required, cls.optional, cls.config_types)
    return cls(parsed, schema), schema


def _not_open() -> PluginError:
    return fatal("the host called the plugin before `open` succeeded")


def export_transform(cls: type[Transform]):
    """The class componentize-py exports for a transform: `Transformer = export_transform(C)`.
    It keeps the instance that `open` creates and hands it every batch."""
    if not (isinstance(cls, type) and issubclass(cls, Transform)):
        raise TypeError(f"export_transform takes a subclass of weir_plugin.Transform, not {cls!r}")
    from wit_world import exports

    instance: list[Transform | None] = [None]
    process_what = f"{cls.__name__}.process"

    class Transformer(exports.Transformer):
        def open(self, config: str, input_schema: list[types.Field]) -> list[types.Field]:
            instance[0] = None
            transform, schema = _open_instance(cls, config, input_schema)
            output = transform.output_schema(schema)
            output = output if isinstance(output, Schema) else Schema(output)
            try:
                transform._weir_output_schema = output  # what RowTransform builds columns by
            except AttributeError:  # a class with __slots__
                pass
            instance[0] = transform
            return output._to_wit()

        def process(self, info: types.BatchInfo, input: types.Batch) -> types.TransformOutput:
            transform = instance[0]
            if transform is None:
                raise _not_open()
            output = transform.process(Batch(input), BatchInfo._from_wit(info))
            return _output_to_wit(output, process_what)

    Transformer.__qualname__ = Transformer.__name__ = "Transformer"
    return Transformer


def export_sink(cls: type[Sink]):
    """The class componentize-py exports for a sink: `Writer = export_sink(C)`."""
    if not (isinstance(cls, type) and issubclass(cls, Sink)):
        raise TypeError(f"export_sink takes a subclass of weir_plugin.Sink, not {cls!r}")
    from wit_world import exports

    instance: list[Sink | None] = [None]

    class Writer(exports.Writer):
        def open(self, config: str, input_schema: list[types.Field]) -> None:
            instance[0] = None
            sink, _ = _open_instance(cls, config, input_schema)
            instance[0] = sink

        def write_batch(self, info: types.BatchInfo, input: types.Batch) -> None:
            sink = instance[0]
            if sink is None:
                raise _not_open()
            sink.write_batch(Batch(input), BatchInfo._from_wit(info))

    Writer.__qualname__ = Writer.__name__ = "Writer"
    return Writer


# --- the host ---------------------------------------------------------------------------------

_LEVELS = {
    "trace": host.LogLevel.TRACE,
    "debug": host.LogLevel.DEBUG,
    "info": host.LogLevel.INFO,
    "warn": host.LogLevel.WARN,
    "warning": host.LogLevel.WARN,
    "error": host.LogLevel.ERROR,
}


def log(message: str, level: str | host.LogLevel = "info") -> None:
    """Logs through the host's logger, tagged with the plugin and the batch. `level`: "trace",
    "debug", "info", "warn" or "error" (or a `host.LogLevel`)."""
    if isinstance(level, str):
        if level not in _LEVELS:
            raise ValueError(f"log level {level!r}: expected one of trace, debug, info, warn, error")
        level = _LEVELS[level]
    host.log(level, message)


def log_trace(message: str) -> None:
    host.log(host.LogLevel.TRACE, message)


def log_debug(message: str) -> None:
    host.log(host.LogLevel.DEBUG, message)


def log_info(message: str) -> None:
    host.log(host.LogLevel.INFO, message)


def log_warn(message: str) -> None:
    host.log(host.LogLevel.WARN, message)


def log_error(message: str) -> None:
    host.log(host.LogLevel.ERROR, message)


def random_u64() -> int:
    """A random number from the host's source seeded by (query, batch, partition): a replayed
    batch draws the same numbers."""
    return host.random_u64()


def _key(key: bytes | str) -> bytes:
    if type(key) is bytes:
        return key
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, (bytearray, memoryview)):
        return bytes(key)
    raise TypeError(f"a state key is bytes or str, not {type(key).__name__}")


_I128_MIN, _I128_MAX = -(2**127), 2**127 - 1


class _State:
    """Keyed state (world `stateful-transform`): the host's store, versioned with the batch, so
    that batch N always starts from what batch N-1 committed, however often it is replayed.
    Keys and values are bytes (a `str` key is UTF-8 encoded). In another world every function
    is a fatal error saying so."""

    @staticmethod
    def _wit():
        if _keyed_state is None:
            raise fatal("weir.state: keyed state needs the world `stateful-transform` (componentize-py -w stateful-transform)")
        return _keyed_state

    def get(self, key: bytes | str) -> bytes | None:
        """The value of `key`, or None (never put, deleted, or expired by the watermark)."""
        return self._wit().get(_key(key))

    def get_many(self, keys: Sequence[bytes | str]) -> list[bytes | None]:
        """`get` for many keys in one call across the boundary: the values in the order of `keys`."""
        return self._wit().get_many([_key(k) for k in keys])

    def put(self, key: bytes | str, value: bytes, expires_at_micros: int | None = None) -> None:
        """Sets `key` to `value`; with `expires_at_micros`, it expires once the event-time
        watermark reaches that time (UTC µs). Putting again replaces value and expiry."""
        self._wit().put(_key(key), bytes(value), expires_at_micros)

    def delete(self, key: bytes | str) -> None:
        """Removes `key` (nothing happens when it is absent)."""
        self._wit().delete(_key(key))

    def watermark_micros(self) -> int:
        """The batch's event-time watermark in UTC µs (0 before any event time, or without a
        watermark); the same on replay."""
        return self._wit().watermark_micros()

    @staticmethod
    def i128_bytes(n: int) -> bytes:
        """`n` as 16 little-endian bytes (Rust's `i128::to_le_bytes`), saturated to i128."""
        return max(_I128_MIN, min(_I128_MAX, n)).to_bytes(16, "little", signed=True)

    @staticmethod
    def bytes_i128(b: bytes) -> int:
        """16 little-endian bytes as an int (Rust's `i128::from_le_bytes`)."""
        if len(b) != 16:
            raise ValueError(f"an i128 is 16 bytes, not {len(b)}")
        return int.from_bytes(b, "little", signed=True)


state = _State()


class MergeResult:
    """What the host did with one merge: `skipped` (the table already held this batch: a
    replay), `updated` target rows, `inserted` rows."""

    __slots__ = ("skipped", "updated", "inserted")

    def __init__(self, skipped: bool, updated: int, inserted: int) -> None:
        self.skipped, self.updated, self.inserted = skipped, updated, inserted

    def __repr__(self) -> str:
        return f"MergeResult(skipped={self.skipped}, updated={self.updated}, inserted={self.inserted})"


class _DeltaMerge:
    """MERGE into the Delta tables the pipeline file grants the sink (world `merge-sink`)."""

    @staticmethod
    def merge(table: str, batch: Batch | types.Batch, rows: Output | None = None) -> MergeResult:
        """Merges `batch` into the granted table `table`, or with `rows`, the batch as changed by
        that output (`Output.keep(...)`, an edit, or IPC), exactly once per batch and table. The
        host's refusal (not granted, merged twice, duplicate keys, a commit conflict: retryable)
        is raised as a `PluginError`."""
        if _delta_merge is None:
            raise fatal("weir.delta_merge: merging needs the world `merge-sink` (componentize-py -w merge-sink)")
        raw = batch.raw if isinstance(batch, Batch) else batch
        wit_rows = None if rows is None else _output_to_wit(rows, "delta_merge.merge rows")
        try:
            r = _delta_merge.merge(table, raw, wit_rows)
        except Err as e:
            raise PluginError._from_err(e) from None
        return MergeResult(r.skipped, r.updated, r.inserted)


delta_merge = _DeltaMerge()


# --- the first version's helpers (for plugins on the generated bindings) ------------------------

_TYPE_NAMES = {
    types.DataType_Boolean: "boolean",
    types.DataType_Int32: "int32",
    types.DataType_Int64: "int64",
    types.DataType_Float64: "float64",
    types.DataType_Decimal128: "decimal128",
    types.DataType_Utf8: "utf8",
    types.DataType_TimestampMicros: "timestamp",
    types.DataType_Date32: "date32",
}


def type_name(data_type: types.DataType) -> str:
    """A short name without parameters, for dispatch on a column's type: `utf8`, `int64`,
    `decimal128`, `timestamp`, ... (`Field.type` / `Column.type` give the full, Rust name)."""
    return _TYPE_NAMES[type(data_type)]


def signature_text(signature) -> str:
    """A scalar function's declared signature as text, `count_char(utf8, utf8) -> int32`, for
    the messages of `open` (the argument is a `wit_world.exports.scalar.Signature`)."""
    arguments = ", ".join(type_name(t) for t in signature.arguments)
    return f"{signature.name}({arguments}) -> {type_name(signature.returns)}"


def field_index(schema: Sequence[types.Field] | Schema, name: str) -> int:
    """The position of column `name`, or an `invalid-input` error naming it."""
    for i, field in enumerate(schema):
        if field.name == name:
            return i
    raise invalid_input(f"the input has no column `{name}`")


def column(batch: types.Batch, name: str) -> types.Column:
    """Pulls one column of a WIT batch by name: only this column crosses the boundary."""
    return batch.column(field_index(batch.schema(), name))


def keep(mask: bytes) -> types.TransformOutput:
    """A WIT transform output that keeps the rows whose bit is set and leaves every column as it
    is: the host applies the mask to its own Arrow arrays."""
    return types.TransformOutput_Edit(
        types.Edit(set_columns=[], drop_columns=[], keep=types.Selection_Mask(mask))
    )


def int32_column(values: Sequence[int | None], name: str = "result") -> types.Column:
    """A WIT int32 column of `values`, `None` being null: what a scalar function of world
    `scalar-function` returns (the host ignores the name). The validity is absent when no value
    is null."""
    validity = None
    if None in values:
        validity = pack_bits([v is not None for v in values], len(values))
        values = [0 if v is None else v for v in values]
    return types.Column(
        name=name,
        data_type=types.DataType_Int32(),
        validity=validity,
        values=types.ColumnValues_Int32(list(values)),
    )
