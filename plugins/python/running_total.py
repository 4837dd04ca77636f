"""A running total per key (e.g. of `amount` per `customer_id`): `plugins/running_total` in
Python (world `stateful-transform`), with the same config, errors and output, byte for byte.
The totals live in the host's keyed state, so they survive restarts and a replayed batch starts
from exactly the totals the previous batch committed.

Config: `{ "key": "customer_id", "value": "amount", "output": "running_total",
"event_time": "occurred_at", "expire_after_ms": 3600000 }`. `key` (int64 or utf8) and `value`
(int64 or decimal) are required; `output` defaults to `running_total`. With `expire_after_ms`
(which needs `event_time`), a key's total expires that long (in event time) after its latest
row, once the watermark passes: the next row of that key starts from zero. Each row gets the
total of its key up to and including it; a null value adds nothing, a null key gets a null
total. A decimal total keeps the value's scale at precision 38; totals saturate at i128's
bounds, and an int64 total at int64's.

Per batch the state is asked once (`get_many` of the batch's distinct keys) and written once
per key; the loops run over columns already copied into the plugin.
"""

from __future__ import annotations

import weir_plugin as weir

_I128_MIN, _I128_MAX = -(2**127), 2**127 - 1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def _invalid(message: str) -> weir.PluginError:
    return weir.invalid_input(f"running_total: {message}")


class RunningTotal(weir.Transform):
    required = ("key", "value")
    optional = {"output": "running_total", "event_time": None, "expire_after_ms": None}
    config_types = {"key": str, "value": str, "output": str, "event_time": str, "expire_after_ms": int}

    def __init__(self, config: dict, schema: weir.Schema) -> None:
        self.key, self.value, self.output = config["key"], config["value"], config["output"]
        self.event_time, self.expire_after_ms = config["event_time"], config["expire_after_ms"]
        key = schema.field(self.key)
        if key is None:
            raise _invalid(f"the input has no column `{self.key}`")
        if key.type not in ("int64", "utf8"):
            raise _invalid(f"key column `{self.key}` is {key.type}, not int64 or utf8")
        value = schema.field(self.value)
        if value is None:
            raise _invalid(f"the input has no column `{self.value}`")
        if value.type == "int64":
            self.output_type = "int64"
        elif value.scale is not None:
            self.output_type = f"decimal128(38, {value.scale})"
        else:
            raise _invalid(f"value column `{self.value}` is {value.type}, not int64 or decimal")
        if self.expire_after_ms is not None and self.event_time is None:
            raise weir.invalid_config(
                "running_total: expire_after_ms needs event_time (the column its expiry is counted from)"
            )
        if self.expire_after_ms is not None and self.expire_after_ms < 0:
            raise weir.invalid_config(f"running_total: expire_after_ms is {self.expire_after_ms}, expected 0 or more")
        if self.event_time is not None:
            event_time = schema.field(self.event_time)
            if event_time is None:
                raise _invalid(f"the input has no column `{self.event_time}`")
            if event_time.type != "timestamp-micros":
                raise _invalid(f"event_time column `{self.event_time}` is {event_time.type}, not a timestamp")

    def output_schema(self, schema: weir.Schema) -> weir.Schema:
        return schema.with_field(weir.Field(self.output, self.output_type, True))

    def process(self, batch: weir.Batch, info: weir.BatchInfo) -> weir.Output:
        rows = batch.num_rows
        keys = batch.column(self.key)
        values = batch.column(self.value)
        expiring = self.event_time is not None and self.expire_after_ms is not None
        event_time = batch.column(self.event_time) if expiring else None

        # The batch's distinct keys in order of first appearance, and each row's slot (None: a
        # null key). int64 keys are grouped as ints and encoded once per key, as Rust encodes
        # them (8 little-endian bytes); utf8 keys are their bytes.
        slots: dict = {}
        row_slot: list = [None] * rows
        key_valid = keys.valid_list() if keys.validity is not None else None
        if keys.type == "int64" or keys.type == "utf8":
            for row, k in enumerate(keys.raw):
                if key_valid is not None and not key_valid[row]:
                    continue
                slot = slots.get(k)
                if slot is None:
                    slot = slots[k] = len(slots)
                row_slot[row] = slot
        if keys.type == "int64":
            distinct = [k.to_bytes(8, "little", signed=True) for k in slots]
        else:
            distinct = list(slots)

        totals = [
            weir.state.bytes_i128(v) if v is not None and len(v) == 16 else 0
            for v in weir.state.get_many(distinct)
        ]

        # What each row adds: an int64 or a decimal's unscaled int; nothing for a null (or for
        # a column of another type, as in Rust).
        if values.type == "int64":
            adds = values.raw
        elif values.scale is not None:
            adds = values.unscaled()
        else:
            adds = [0] * rows
        if values.validity is not None:
            adds = [a if ok else 0 for a, ok in zip(adds, values.valid_list())]

        out = [0] * rows
        for row, slot in enumerate(row_slot):
            if slot is None:
                continue
            t = totals[slot] + adds[row]
            if t > _I128_MAX:
                t = _I128_MAX
            elif t < _I128_MIN:
                t = _I128_MIN
            totals[slot] = out[row] = t

        latest: list = [None] * len(distinct)
        if event_time is not None and event_time.type == "timestamp-micros":
            times, time_valid = event_time.raw, event_time.valid_list()
            for row, slot in enumerate(row_slot):
                if slot is not None and time_valid[row]:
                    t, l = times[row], latest[slot]
                    if l is None or t > l:
                        latest[slot] = t

        i128_bytes = weir.state.i128_bytes
        put = weir.state.put
        # Rust's `t.saturating_add(ms.saturating_mul(1000))`.
        after = min(_I64_MAX, self.expire_after_ms * 1000) if expiring else 0
        for slot, key in enumerate(distinct):
            at = latest[slot]
            if at is not None:
                put(key, i128_bytes(totals[slot]), max(_I64_MIN, min(_I64_MAX, at + after)))
            else:
                put(key, i128_bytes(totals[slot]))

        validity = None
        if None in row_slot:
            validity = [slot is not None for slot in row_slot]
        if self.output_type == "int64":
            column = weir.Column.int64(self.output, [max(_I64_MIN, min(_I64_MAX, t)) for t in out], validity)
        else:
            scale = weir.Field("", self.output_type).scale
            column = weir.Column.decimal128(self.output, 38, scale, out, validity)
        return weir.Output.edit().set_column(column)


Transformer = weir.export_transform(RunningTotal)
