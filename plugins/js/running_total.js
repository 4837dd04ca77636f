// A running total per key (e.g. of `amount` per `customer_id`), the example of a stateful
// transform: `plugins/running_total` in JavaScript, with the same config, errors, state
// encoding and output, so either can resume the other's checkpoint.
//
// Config: `{ "key": "customer_id", "value": "amount", "output": "running_total",
// "event_time": "occurred_at", "expire_after_ms": 3600000 }`. `key` (int64 or utf8) and `value`
// (int64 or decimal) are required; `output` defaults to `running_total`. With `expire_after_ms`
// (which needs `event_time`), a key's total expires that long (in event time) after its latest
// row, once the watermark passes: the next row of that key starts from zero. Each row gets the
// total of its key up to and including it; a null value adds nothing, a null key gets a null
// total. A decimal total keeps the value's scale at precision 38.
//
// State: key = the int64 as 8 little-endian bytes, or the string's UTF-8 bytes; value = the
// total as a 16-byte little-endian i128. Per call the state is asked once (`getMany` of the
// batch's distinct keys) and written once per key.
//
// weir-plugin.js and weir-state.js are plugin-sdk/js/, staged beside this file by build.sh.

import { Column, Field, Output, Transform, exportTransform, invalidConfig, invalidInput, setDecimalAt } from './weir-plugin.js';
import * as state from './weir-state.js';

const I64_MIN = -(1n << 63n);
const I64_MAX = (1n << 63n) - 1n;
const saturatingI64 = (v) => (v > I64_MAX ? I64_MAX : v < I64_MIN ? I64_MIN : v);

const invalid = (message) => invalidInput(`running_total: ${message}`);

/** The field `name` of `schema` if its type passes `ok`, else the error Rust gives. */
function typedField(schema, role, name, ok, expected) {
  const field = schema.field(name);
  if (field === undefined) {
    throw invalid(`the input has no column \`${name}\``);
  }
  if (!ok(field.type)) {
    throw invalid(`${role} column \`${name}\` is ${field.type}, not ${expected}`);
  }
  return field;
}

class RunningTotal extends Transform {
  static required = ['key', 'value'];
  static optional = { output: 'running_total', event_time: null, expire_after_ms: null };
  static configTypes = { key: 'string', value: 'string', output: 'string', event_time: 'string', expire_after_ms: 'i64' };

  constructor(config, schema) {
    super();
    typedField(schema, 'key', config.key, (t) => t === 'int64' || t === 'utf8', 'int64 or utf8');
    const value = typedField(schema, 'value', config.value, (t) => t === 'int64' || t.startsWith('decimal128('), 'int64 or decimal');
    this.scale = value.scale ?? 0;
    this.outputType = value.type === 'int64' ? 'int64' : `decimal128(38, ${this.scale})`;
    const { event_time: eventTime, expire_after_ms: ms } = config;
    if (eventTime === null && ms !== null) {
      throw invalidConfig('running_total: expire_after_ms needs event_time (the column its expiry is counted from)');
    }
    if (ms !== null && ms < 0) {
      throw invalidConfig(`running_total: expire_after_ms is ${ms}, expected 0 or more`);
    }
    if (eventTime !== null) {
      typedField(schema, 'event_time', eventTime, (t) => t === 'timestamp-micros', 'a timestamp');
    }
    this.config = config;
    // Rust: t.saturating_add(ms.saturating_mul(1000)), in i64.
    this.expireMicros = ms === null ? null : saturatingI64(BigInt(ms) * 1000n);
  }

  outputSchema(schema) {
    return schema.withField(new Field(this.config.output, this.outputType, true));
  }

  process(batch) {
    const { key, value, output, event_time: eventTime } = this.config;
    const rows = batch.numRows;
    const keys = batch.column(key);
    const values = batch.column(value);
    const times = eventTime !== null && this.expireMicros !== null ? batch.column(eventTime) : null;

    // The batch's distinct keys, in order of first appearance, and each row's key slot (-1: null).
    const slots = new Map();
    const distinct = [];
    const rowSlot = new Int32Array(rows);
    const kv = keys.validity;
    const numeric = keys.dataType.tag === 'int64' || keys.dataType.tag === 'int32';
    const strings = keys.type === 'utf8' ? keys.raw : null;
    for (let row = 0; row < rows; row++) {
      if ((kv !== null && ((kv[row >> 3] >> (row & 7)) & 1) === 0) || (!numeric && strings === null)) {
        rowSlot[row] = -1;
        continue;
      }
      const k = numeric ? BigInt(keys.raw[row]) : strings.text(row);
      let slot = slots.get(k);
      if (slot === undefined) {
        slot = distinct.length;
        slots.set(k, slot);
        distinct.push(numeric ? state.i64Bytes(k) : strings.bytes(row).slice());
      }
      rowSlot[row] = slot;
    }

    const totals = state.getMany(distinct).map((v) => state.bytesI128(v) ?? 0n);
    const latest = new Array(distinct.length).fill(null);
    const vv = values.validity;
    const decimals = values.dataType.tag === 'decimal128' ? values.raw : null;
    const ints = values.dataType.tag === 'int64' || values.dataType.tag === 'int32' ? values.raw : null;
    const view = decimals === null ? null : new DataView(decimals.buffer, decimals.byteOffset, decimals.byteLength);
    const tv = times?.validity ?? null;
    const tr = times === null || times.dataType.tag !== 'timestamp-micros' ? null : times.raw;

    const decimalOut = this.outputType !== 'int64';
    const out = decimalOut ? new Uint8Array(16 * rows) : new BigInt64Array(rows);
    let validity = null;
    for (let row = 0; row < rows; row++) {
      const slot = rowSlot[row];
      if (slot < 0) {
        validity ??= new Uint8Array((rows + 7) >> 3).fill(0xff);
        validity[row >> 3] &= ~(1 << (row & 7));
        continue;
      }
      if (vv === null || ((vv[row >> 3] >> (row & 7)) & 1) === 1) {
        let add = 0n;
        if (ints !== null) {
          add = BigInt(ints[row]);
        } else if (view !== null) {
          add = (view.getBigInt64(16 * row + 8, true) << 64n) | view.getBigUint64(16 * row, true);
        }
        totals[slot] = state.saturatingAddI128(totals[slot], add);
      }
      if (decimalOut) {
        setDecimalAt(out, row, totals[slot]);
      } else {
        out[row] = saturatingI64(totals[slot]);
      }
      if (tr !== null && (tv === null || ((tv[row >> 3] >> (row & 7)) & 1) === 1)) {
        const t = tr[row];
        if (latest[slot] === null || t > latest[slot]) latest[slot] = t;
      }
    }

    for (let slot = 0; slot < distinct.length; slot++) {
      const bytes = state.i128Bytes(totals[slot]);
      if (this.expireMicros !== null && latest[slot] !== null) {
        state.put(distinct[slot], bytes, saturatingI64(latest[slot] + this.expireMicros));
      } else {
        state.put(distinct[slot], bytes);
      }
    }

    const column = decimalOut
      ? Column.decimal128(output, 38, this.scale, out, validity)
      : Column.int64(output, out, validity);
    return Output.edit().setColumn(column);
  }
}

export const transformer = exportTransform(RunningTotal);
