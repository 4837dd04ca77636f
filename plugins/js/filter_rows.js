// Keeps the rows whose column compares true against a literal: `plugins/filter_rows` in
// JavaScript.
//
// Config, as for the Rust plugin: `{ "column": "status", "op": "eq", "value": "completed" }`
// with `op` one of eq, ne, gt, ge, lt, le, in (`value` an array), is_null, not_null (no
// `value`). A null never compares true. Literals by column type: utf8 a string (compared
// bytewise); int32/int64 an integer; float64 a number; decimal128 a number or a string,
// compared exactly at the column's scale; boolean true/false; timestamp an RFC 3339 string or
// integer microseconds; date a YYYY-MM-DD string or integer days.
//
// The comparison is compiled once at `open` into a function of one row; each batch pulls the
// one column it tests and returns a bit mask, so the other columns never leave the host.

import {
  Strings, andBits, bit, column, decimalAt, fieldIndex, invalidConfig, invalidInput, keep,
  maskFrom, parseConfig, typeName,
} from './weir-plugin.js';

const COMPARE = {
  eq: (c) => c === 0,
  ne: (c) => c !== 0,
  gt: (c) => c > 0,
  ge: (c) => c >= 0,
  lt: (c) => c < 0,
  le: (c) => c <= 0,
};
const OPS = [...Object.keys(COMPARE), 'in', 'is_null', 'not_null'];
const encoder = new TextEncoder();

/** Bytewise comparison of two byte arrays: -1, 0 or 1. */
function compareBytes(a, b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    if (a[i] !== b[i]) {
      return a[i] < b[i] ? -1 : 1;
    }
  }
  return a.length === b.length ? 0 : a.length < b.length ? -1 : 1;
}

const cmp = (a, b) => (a < b ? -1 : a > b ? 1 : 0);

/** `text` (digits, optional sign, fraction and exponent) times 10^scale, exactly, or null. */
function scaledDecimal(text, scale) {
  const m = /^([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$/.exec(text.trim());
  if (!m || (m[2] === '' && (m[3] ?? '') === '')) {
    return null;
  }
  let digits = m[2] + (m[3] ?? '');
  let exponent = scale + Number(m[4] ?? 0) - (m[3] ?? '').length;
  if (exponent < 0) {
    const dropped = digits.slice(exponent);
    if (/[^0]/.test(dropped)) {
      return null;
    }
    digits = digits.slice(0, exponent);
    exponent = 0;
  }
  const value = BigInt((digits || '0') + '0'.repeat(exponent));
  return m[1] === '-' ? -value : value;
}

/** RFC 3339 / ISO 8601 text as UTC microseconds (no offset means UTC), or null. */
function timestampMicros(text) {
  const m = /^(\d{4}-\d{2}-\d{2})(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?)?([Zz]|[+-]\d{2}(?::?\d{2})?)?$/.exec(text);
  if (!m) {
    return null;
  }
  const days = Date.parse(`${m[1]}T00:00:00Z`) / 86_400_000;
  if (Number.isNaN(days)) {
    return null;
  }
  let seconds = days * 86_400 + Number(m[2] ?? 0) * 3600 + Number(m[3] ?? 0) * 60 + Number(m[4] ?? 0);
  const zone = m[6] ?? 'Z';
  if (zone !== 'Z' && zone !== 'z') {
    const sign = zone[0] === '-' ? -1 : 1;
    const hm = zone.slice(1).replace(':', '');
    seconds -= sign * (Number(hm.slice(0, 2)) * 3600 + Number(hm.slice(2) || 0) * 60);
  }
  const micros = Number(((m[5] ?? '') + '000000').slice(0, 6));
  return BigInt(seconds) * 1_000_000n + BigInt(micros);
}

/** The config literal in the form the column's values take, or `invalid-config` naming it. */
function literal(value, field) {
  const kind = typeName(field.dataType);
  const bad = () => invalidConfig(
    `config.value: ${JSON.stringify(value)} is not a ${kind} literal for column \`${field.name}\``,
  );
  switch (kind) {
    case 'utf8':
      if (typeof value !== 'string') throw bad();
      return encoder.encode(value);
    case 'boolean':
      if (typeof value !== 'boolean') throw bad();
      return value;
    case 'int32':
    case 'date32':
      if (Number.isInteger(value)) return value;
      if (kind === 'date32' && typeof value === 'string' && /^\d{4}-\d{2}-\d{2}$/.test(value)) {
        const ms = Date.parse(`${value}T00:00:00Z`);
        if (!Number.isNaN(ms)) return ms / 86_400_000;
      }
      throw bad();
    case 'int64':
    case 'timestamp-micros':
      if (Number.isInteger(value)) return BigInt(value);
      if (kind === 'timestamp-micros' && typeof value === 'string') {
        const micros = timestampMicros(value);
        if (micros !== null) return micros;
      }
      throw bad();
    case 'float64':
      if (typeof value !== 'number') throw bad();
      return value;
    case 'decimal128': {
      if (typeof value !== 'number' && typeof value !== 'string') throw bad();
      const scaled = scaledDecimal(String(value), field.dataType.val.scale);
      if (scaled === null) throw bad();
      return scaled;
    }
    default:
      throw bad();
  }
}

/** `test(row)` for the column's layout: whether the row's value passes. */
function rowTest(op, lit, col) {
  const { tag, val } = col.values;
  if (tag === 'utf8') {
    const strings = new Strings(val);
    if (op === 'in') {
      return (i) => lit.some((l) => compareBytes(strings.bytes(i), l) === 0);
    }
    const pass = COMPARE[op];
    return (i) => pass(compareBytes(strings.bytes(i), lit));
  }
  const at = tag === 'decimal128' ? (i) => decimalAt(val, i) : tag === 'boolean' ? (i) => bit(val, i) : (i) => val[i];
  if (op === 'in') {
    const members = new Set(lit);
    return (i) => members.has(at(i));
  }
  if (op === 'eq') {
    return (i) => at(i) === lit;
  }
  const pass = COMPARE[op];
  return (i) => pass(cmp(at(i), lit));
}

class FilterRows {
  constructor(config, schema) {
    const cfg = parseConfig(config, { required: ['column', 'op'], optional: ['value'] });
    if (!OPS.includes(cfg.op)) {
      throw invalidConfig(`config.op: unknown op \`${cfg.op}\`, expected one of ${OPS.join(', ')}`);
    }
    this.op = cfg.op;
    this.field = schema[fieldIndex(schema, cfg.column)];
    if (this.op === 'is_null' || this.op === 'not_null') {
      if ('value' in cfg) throw invalidConfig(`config.value: \`${this.op}\` takes no value`);
    } else if (!('value' in cfg)) {
      throw invalidConfig(`config.value: missing (needed by \`${this.op}\`)`);
    } else if (this.op === 'in') {
      if (!Array.isArray(cfg.value)) throw invalidConfig('config.value: `in` needs an array');
      this.literal = cfg.value.map((v) => literal(v, this.field));
    } else {
      this.literal = literal(cfg.value, this.field);
    }
  }

  process(batch) {
    const col = column(batch, this.field.name);
    if (typeName(col.dataType) !== typeName(this.field.dataType)) {
      throw invalidInput(
        `filter_rows: column \`${col.name}\` is ${typeName(col.dataType)}, it was ${typeName(this.field.dataType)} when the plugin opened`,
      );
    }
    const rows = batch.numRows();
    const validity = col.validity;
    if (this.op === 'is_null') {
      return keep(maskFrom(rows, (i) => validity != null && !bit(validity, i)));
    }
    if (this.op === 'not_null') {
      return keep(validity ?? maskFrom(rows, () => true));
    }
    const mask = maskFrom(rows, rowTest(this.op, this.literal, col));
    // A null never compares true.
    return keep(validity == null ? mask : andBits(mask, validity));
  }
}

let filter;

export const transformer = {
  open(config, inputSchema) {
    filter = new FilterRows(config, inputSchema);
    return inputSchema;
  },
  process(_info, input) {
    return filter.process(input);
  },
};
