"""Helpers for Weir plugins written in Python and built with componentize-py.

The WIT contract (`wit/weir.wit`) hands columns over in Arrow's layout: strings as offsets plus
one byte buffer, booleans and validity as packed bitmaps, decimals as 16 little-endian bytes per
value. That layout is what makes a batch cheap to cross the boundary, but it is not what Python
code wants to read. This module turns it into Python values and back, and makes errors one
`raise` away, so that a plugin is its logic and nothing else. Nothing here is per-row across the
boundary: each call reads whole buffers that have already been copied into the guest.

Bitmaps are handled as Python integers (`int.from_bytes`), which does the bit work in C rather
than in a Python loop.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Iterator, Sequence

from componentize_py_types import Err
from wit_world.imports import host, types

__all__ = [
    "fatal",
    "retryable",
    "invalid_config",
    "invalid_input",
    "parse_config",
    "type_name",
    "field_index",
    "column",
    "Strings",
    "is_valid",
    "pack_bits",
    "and_bits",
    "not_bits",
    "keep",
    "int32_column",
    "signature_text",
    "decimals",
    "log",
]


# --- errors -----------------------------------------------------------------------------------
# The exported functions return `result<_, plugin-error>`; componentize-py maps a raised
# `Err(plugin-error)` to the error case, so an error is `raise weir_plugin.fatal("...")`.


def _error(kind: types.ErrorKind, message: str, row: int | None) -> Err:
    return Err(types.PluginError(kind=kind, message=message, row=row))


def fatal(message: str, row: int | None = None) -> Err:
    """The batch cannot be processed and retrying will not help."""
    return _error(types.ErrorKind.FATAL, message, row)


def retryable(message: str, row: int | None = None) -> Err:
    """A transient failure: the host may run the batch again."""
    return _error(types.ErrorKind.RETRYABLE, message, row)


def invalid_config(message: str) -> Err:
    """The plugin's `config` from the pipeline file was rejected."""
    return _error(types.ErrorKind.INVALID_CONFIG, message, None)


def invalid_input(message: str, row: int | None = None) -> Err:
    """The batch does not have the shape the plugin needs."""
    return _error(types.ErrorKind.INVALID_INPUT, message, row)


# --- config -----------------------------------------------------------------------------------


def parse_config(text: str, required: Iterable[str], optional: Iterable[str] = ()) -> dict[str, Any]:
    """Reads the plugin's JSON `config`, rejecting unknown and missing keys by name
    (`config.colum: unknown key`), as the Rust SDK's `deny_unknown_fields` does."""
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


# --- schema -----------------------------------------------------------------------------------

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
    """`utf8`, `int64`, `decimal128`, ... for messages and for dispatch on a column's type."""
    return _TYPE_NAMES[type(data_type)]


def signature_text(signature) -> str:
    """A scalar function's declared signature as text, `count_char(utf8, utf8) -> int32`, for
    the messages of `open` (the argument is a `wit_world.exports.scalar.Signature`)."""
    arguments = ", ".join(type_name(t) for t in signature.arguments)
    return f"{signature.name}({arguments}) -> {type_name(signature.returns)}"


def field_index(schema: Sequence[types.Field], name: str) -> int:
    """The position of column `name`, or an `invalid-input` error naming it."""
    for i, field in enumerate(schema):
        if field.name == name:
            return i
    raise invalid_input(f"the input has no column `{name}`")


def column(batch: types.Batch, name: str) -> types.Column:
    """Pulls one column by name: only this column crosses the boundary."""
    return batch.column(field_index(batch.schema(), name))


# --- values -----------------------------------------------------------------------------------


class Strings(Sequence[bytes]):
    """A utf8 column's values as a sequence of `bytes` (no decoding, so comparisons are
    bytewise, i.e. by code point, as in the Rust SDK). `text(i)` decodes one value."""

    __slots__ = ("offsets", "data")

    def __init__(self, values: types.Utf8Values) -> None:
        self.offsets = values.offsets
        self.data = values.data

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.data[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[bytes]:
        data, offsets = self.data, self.offsets
        return (data[a:b] for a, b in zip(offsets, offsets[1:]))

    def text(self, i: int) -> str:
        return self[i].decode()


def decimals(raw: bytes) -> list[int]:
    """A decimal128 column's unscaled values (16 little-endian bytes each)."""
    return [int.from_bytes(raw[i : i + 16], "little", signed=True) for i in range(0, len(raw), 16)]


def is_valid(validity: bytes | None, row: int) -> bool:
    """Whether value `row` is not null (`validity` absent: every value is valid)."""
    return validity is None or bool(validity[row >> 3] >> (row & 7) & 1)


def pack_bits(bits: Iterable[bool], length: int) -> bytes:
    """Packs one bool per row into an Arrow bitmap (least significant bit first)."""
    # A string of digits read as one integer: the packing happens in C.
    digits = "".join(["1" if b else "0" for b in bits])[::-1]
    return int(digits or "0", 2).to_bytes((length + 7) // 8, "little")


def and_bits(a: bytes, b: bytes) -> bytes:
    """Bitwise AND of two bitmaps of the same length."""
    return (int.from_bytes(a, "little") & int.from_bytes(b, "little")).to_bytes(len(a), "little")


def not_bits(a: bytes, length: int) -> bytes:
    """Bitwise NOT of a bitmap of `length` bits (padding bits stay 0)."""
    full = (1 << length) - 1
    return (full & ~int.from_bytes(a, "little")).to_bytes((length + 7) // 8, "little")


# --- results ----------------------------------------------------------------------------------


def keep(mask: bytes) -> types.TransformOutput:
    """A transform output that keeps the rows whose bit is set and leaves every column as it
    is: the host applies the mask to its own Arrow arrays."""
    return types.TransformOutput_Edit(
        types.Edit(set_columns=[], drop_columns=[], keep=types.Selection_Mask(mask))
    )


def int32_column(values: Sequence[int | None], name: str = "result") -> types.Column:
    """An int32 column of `values`, `None` being null: what a scalar function of world
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


# --- host -------------------------------------------------------------------------------------


def log(message: str, level: host.LogLevel = host.LogLevel.INFO) -> None:
    """Logs through the host's logger, tagged with the plugin and the batch."""
    host.log(level, message)
