"""Keeps the rows whose column compares true against a literal: `plugins/filter_rows` in Python.

Config, as for the Rust plugin: `{ "column": "status", "op": "eq", "value": "completed" }` with
`op` one of `eq`, `ne`, `gt`, `ge`, `lt`, `le`, `in` (`value` an array), `is_null`, `not_null`
(no `value`). A null never compares true. Literals by column type: utf8 a string (compared
bytewise); int32/int64 an integer; float64 a number; decimal128 a number or a string, compared
exactly at the column's scale; boolean `true`/`false`; timestamp an RFC 3339 string or integer
microseconds; date a `YYYY-MM-DD` string or integer days.

The comparison is compiled once at `open`; each batch pulls the one column it tests and returns
a bit mask, so the other columns never leave the host.
"""

from __future__ import annotations

import datetime
import decimal
import operator
from typing import Iterable

import weir_plugin as weir
from wit_world import exports
from wit_world.imports import types

_COMPARE = {
    "eq": operator.eq,
    "ne": operator.ne,
    "gt": operator.gt,
    "ge": operator.ge,
    "lt": operator.lt,
    "le": operator.le,
}
_OPS = [*_COMPARE, "in", "is_null", "not_null"]
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def _literal(value, field: types.Field):
    """The config literal as the column's Python value, or `invalid-config` naming it."""
    kind = weir.type_name(field.data_type)
    bad = weir.invalid_config(f"config.value: {value!r} is not a {kind} literal for column `{field.name}`")
    if kind == "utf8":
        if not isinstance(value, str):
            raise bad
        return value.encode()
    if kind == "boolean":
        if not isinstance(value, bool):
            raise bad
        return value
    if isinstance(value, bool):
        raise bad
    if kind in ("int32", "int64"):
        if not isinstance(value, int):
            raise bad
        return value
    if kind == "float64":
        if not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if kind == "decimal128":
        if not isinstance(value, (int, float, str)):
            raise bad
        try:
            exact = decimal.Decimal(str(value)).scaleb(field.data_type.value.scale)
        except decimal.InvalidOperation:
            raise bad from None
        if exact != exact.to_integral_value():
            raise weir.invalid_config(
                f"config.value: {value!r} has more digits than column `{field.name}`'s scale "
                f"{field.data_type.value.scale}"
            )
        return int(exact)
    if isinstance(value, int):  # timestamp micros or date days
        return value
    if not isinstance(value, str):
        raise bad
    try:
        if kind == "date32":
            return (datetime.date.fromisoformat(value) - _EPOCH.date()).days
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise bad from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _values(col: types.Column, rows: int) -> Iterable:
    """The column's `rows` values as Python values comparable with `_literal`'s."""
    values = col.values
    if isinstance(values, types.ColumnValues_Utf8):
        return weir.Strings(values.value)  # iterated lazily: no list of 65k slices
    if isinstance(values, types.ColumnValues_Decimal128):
        return weir.decimals(values.value)
    if isinstance(values, types.ColumnValues_Boolean):
        bits = int.from_bytes(values.value, "little")
        return [bool(bits >> i & 1) for i in range(rows)]
    return values.value


class FilterRows:
    """The comparison, compiled from the config for the input's column type."""

    def __init__(self, config: str, input_schema: list[types.Field]) -> None:
        cfg = weir.parse_config(config, required=["column", "op"], optional=["value"])
        name, op = cfg["column"], cfg["op"]
        if op not in _OPS:
            raise weir.invalid_config(f"config.op: unknown op `{op}`, expected one of {', '.join(_OPS)}")
        self.field = input_schema[weir.field_index(input_schema, name)]
        self.op = op
        if op in ("is_null", "not_null"):
            if "value" in cfg:
                raise weir.invalid_config(f"config.value: `{op}` takes no value")
        elif "value" not in cfg:
            raise weir.invalid_config(f"config.value: missing (needed by `{op}`)")
        elif op == "in":
            if not isinstance(cfg["value"], list):
                raise weir.invalid_config("config.value: `in` needs an array")
            self.literal = {_literal(v, self.field) for v in cfg["value"]}
        else:
            self.literal = _literal(cfg["value"], self.field)

    def process(self, info: types.BatchInfo, input: types.Batch) -> types.TransformOutput:
        col = weir.column(input, self.field.name)
        if type(col.data_type) is not type(self.field.data_type):
            raise weir.invalid_input(
                f"filter_rows: column `{col.name}` is {weir.type_name(col.data_type)}, "
                f"it was {weir.type_name(self.field.data_type)} when the plugin opened"
            )
        rows = input.num_rows()
        validity = col.validity
        if self.op == "is_null":
            return weir.keep(weir.not_bits(validity, rows) if validity else bytes((rows + 7) // 8))
        if self.op == "not_null":
            return weir.keep(validity or weir.not_bits(bytes((rows + 7) // 8), rows))
        values = _values(col, rows)
        lit = self.literal
        if self.op == "in":
            bits = [v in lit for v in values]
        elif self.op == "eq":  # the common case, without a call per row
            bits = [v == lit for v in values]
        else:
            compare = _COMPARE[self.op]
            bits = [compare(v, lit) for v in values]
        mask = weir.pack_bits(bits, rows)
        # A null never compares true.
        return weir.keep(weir.and_bits(mask, validity) if validity else mask)


# componentize-py makes a new `Transformer` for every call, so the opened filter lives here.
_filter: FilterRows | None = None


class Transformer(exports.Transformer):
    def open(self, config: str, input_schema: list[types.Field]) -> list[types.Field]:
        global _filter
        _filter = FilterRows(config, input_schema)
        return input_schema

    def process(self, info: types.BatchInfo, input: types.Batch) -> types.TransformOutput:
        if _filter is None:
            raise weir.fatal("filter_rows: process before open")
        return _filter.process(info, input)
