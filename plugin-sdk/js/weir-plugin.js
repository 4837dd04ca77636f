// Weir plugins in JavaScript, built with componentize-js.
//
// A plugin is a class and one line:
//
//   class MyFilter extends Transform { constructor(config, schema) { ... } process(batch, info) { ... } }
//   export const transformer = exportTransform(MyFilter);      // a sink: exportSink(MySink) as `writer`
//
// The WIT contract (`wit/weir.wit`) hands columns over in Arrow's layout: strings as offsets
// plus one byte buffer, booleans and validity as packed bitmaps, decimals as 16 little-endian
// bytes per value, 64-bit integers as BigInt64Array. That layout is what makes a batch cheap to
// cross the boundary. This module wraps it (Batch, Column, Schema, Output), keeps the opened
// instance, reads the config and turns errors into the WIT error, so that a plugin is its logic.
// Nothing here calls the host per row: a column crosses once, as whole buffers, and the output
// goes back as one edit.
//
// Keyed state (world `stateful-transform`) is in weir-state.js and MERGE into Delta tables
// (world `merge-sink`) in weir-merge.js: componentize-js refuses an import that the world lacks,
// so each lives in a module of its own that only plugins of that world import.

import { log as hostLog, randomU64 as hostRandomU64 } from 'weir:plugin/host@0.1.0';

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/**
 * Whether `v` is a typed array of class `name` ('Uint8Array', 'BigInt64Array', ...). Buffers that
 * come from the host are made in the bindings' realm, where `instanceof Uint8Array` is false.
 */
export const isTypedArray = (v, name) => Object.prototype.toString.call(v) === `[object ${name}]`;
const isError = (e) => e instanceof Error || Object.prototype.toString.call(e) === '[object Error]';

// --- errors ----------------------------------------------------------------------------------
// An exported function returns `result<_, plugin-error>`. A thrown PluginError becomes the error
// case (its `payload` is what componentize-js reads); anything else thrown is a trap, which the
// host reports with the plugin's stderr, as a panic in Rust.

const KINDS = new Set(['fatal', 'retryable', 'invalid-config', 'invalid-input']);

/** A plugin error: `kind` (fatal | retryable | invalid-config | invalid-input), message, row. */
export class PluginError extends Error {
  constructor(kind, message, row) {
    super(message);
    this.name = 'PluginError';
    this.kind = kind;
    this.row = row ?? undefined;
    // componentize-js returns an exception's own `payload` as the error case, and traps on any
    // other Error: this makes a PluginError thrown from a bare export work too.
    Object.defineProperty(this, 'payload', {
      get: () => ({ kind: this.kind, message: String(this.message), row: rowIndex(this.row) }),
      enumerable: false,
    });
  }
}

const rowIndex = (row) => (Number.isInteger(row) && row >= 0 ? Math.min(row, 0xffffffff) : undefined);

/** A `plugin-error` to throw. `kind`: fatal | retryable | invalid-config | invalid-input. */
export function pluginError(kind, message, row) {
  return new PluginError(kind, message, row);
}
/** The plugin cannot process this batch; retrying will not help. */
export const fatal = (message, row) => pluginError('fatal', message, row);
/** A transient failure (a remote service was down): the host may retry the batch. */
export const retryable = (message, row) => pluginError('retryable', message, row);
/** The plugin's `config` was rejected. */
export const invalidConfig = (message) => pluginError('invalid-config', message);
/** The batch does not have the shape the plugin needs (a missing column, a wrong type). */
export const invalidInput = (message, row) => pluginError('invalid-input', message, row);

/** The WIT `plugin-error` of a thrown value, or null when it is not a plugin error. */
function witError(e) {
  if (e instanceof PluginError) {
    return e.payload;
  }
  if (e !== null && typeof e === 'object') {
    // A `{ kind, message, row }` record (the older helpers, or written by hand), or the
    // ComponentError of a host call that failed (its payload is the host's plugin-error).
    const v = Object.prototype.hasOwnProperty.call(e, 'payload') ? e.payload : isError(e) ? null : e;
    if (v !== null && typeof v === 'object' && KINDS.has(v.kind)) {
      return { kind: v.kind, message: String(v.message ?? ''), row: rowIndex(v.row) };
    }
  }
  return null;
}

/** Runs `f`, turning a plugin error into the WIT error value and anything else into a trap. */
function guarded(f) {
  try {
    return f();
  } catch (e) {
    const error = witError(e);
    if (error !== null) {
      throw error;
    }
    // A bug, not a value: say what it was on stderr (the host quotes it with the trap).
    console.error(isError(e) ? `uncaught ${e.name}: ${e.message}\n${e.stack ?? ''}` : `uncaught exception: ${String(e)}`);
    throw e;
  }
}

// --- config ----------------------------------------------------------------------------------

/**
 * Reads the plugin's JSON `config`, rejecting unknown and missing keys by name
 * (`config.colum: unknown key`): the first version's reader, kept for plugins on the bare
 * exports. Classes given to `exportTransform`/`exportSink` get `readConfig`'s Rust-worded
 * messages instead. An empty config reads as `{}`, as in the Rust SDK.
 */
export function parseConfig(text, { required = [], optional = [] } = {}) {
  let config;
  try {
    config = JSON.parse(text.trim() === '' ? '{}' : text);
  } catch (e) {
    throw invalidConfig(`config is not JSON: ${e.message}`);
  }
  if (config === null || typeof config !== 'object' || Array.isArray(config)) {
    throw invalidConfig('config must be a table');
  }
  const allowed = new Set([...required, ...optional]);
  const problems = [
    ...Object.keys(config).filter((k) => !allowed.has(k)).map((k) => `config.${k}: unknown key`),
    ...required.filter((k) => !(k in config)).map((k) => `config.${k}: missing`),
  ];
  if (problems.length > 0) {
    throw invalidConfig(problems.join('; '));
  }
  return config;
}

// --- config: the Rust SDK's way --------------------------------------------------------------
// `exportTransform`/`exportSink` read the config against the class's `required`, `optional` and
// `configTypes`, and word every refusal exactly as the Rust SDK (serde with
// `deny_unknown_fields`, through serde_path_to_error) does, position included: `config.colum:
// unknown field `colum`, expected one of `column`, `equals` at line 1 column 8`. Positions are
// byte offsets in the JSON text the host hands over, so the same pipeline gives the same message
// in Rust, Python and JavaScript.

const SPACE = new Set([0x20, 0x09, 0x0a, 0x0d]);

/** One JSON value of already validated text `b` (bytes) from offset `i`, with its extent. */
function scan(b, i) {
  while (SPACE.has(b[i])) i++;
  const c = b[i];
  const skip = (j) => {
    while (SPACE.has(b[j])) j++;
    return j;
  };
  if (c === 0x7b || c === 0x5b) {
    const map = c === 0x7b;
    const items = [];
    let j = skip(i + 1);
    if (b[j] !== (map ? 0x7d : 0x5d)) {
      for (;;) {
        if (map) {
          const key = scan(b, j);
          const value = scan(b, skip(key.end) + 1);
          items.push({ key: key.value, keyEnd: key.end, value });
          j = skip(value.end);
        } else {
          const item = scan(b, j);
          items.push(item);
          j = skip(item.end);
        }
        if (b[j] !== 0x2c) break;
        j++;
      }
    }
    return { kind: map ? 'map' : 'list', start: i, end: j + 1, items };
  }
  if (c === 0x22) {
    let j = i + 1;
    while (b[j] !== 0x22) j += b[j] === 0x5c ? 2 : 1;
    return { kind: 'str', value: JSON.parse(decoder.decode(b.subarray(i, j + 1))), start: i, end: j + 1 };
  }
  for (const [word, kind, value] of [['true', 'bool', true], ['false', 'bool', false], ['null', 'null', null]]) {
    if (decoder.decode(b.subarray(i, i + word.length)) === word) {
      return { kind, value, start: i, end: i + word.length };
    }
  }
  let j = i;
  while (j < b.length && /[-+0-9.eE]/.test(String.fromCharCode(b[j]))) j++;
  const text = decoder.decode(b.subarray(i, j));
  if (/[.eE]/.test(text)) {
    return { kind: 'float', value: Number(text), text, start: i, end: j };
  }
  // serde_json reads an integer as u64 (i64 when negative), and one past those as f64.
  const n = BigInt(text);
  if (n < -(1n << 63n) || n >= 1n << 64n) {
    return { kind: 'float', value: Number(text), text: String(Number(text)), start: i, end: j };
  }
  return { kind: 'int', value: Number.isSafeInteger(Number(n)) ? Number(n) : n, big: n, start: i, end: j };
}

/** `{:?}` of a Rust `str`, for `invalid type: string "..."`. */
function rustDebug(s) {
  let out = '"';
  for (const ch of s) {
    const code = ch.codePointAt(0);
    if (ch === '"' || ch === '\\') out += `\\${ch}`;
    else if (ch === '\n') out += '\\n';
    else if (ch === '\r') out += '\\r';
    else if (ch === '\t') out += '\\t';
    else if (ch === '\0') out += '\\0';
    else if (code < 0x20 || (code >= 0x7f && code < 0xa0)) out += `\\u{${code.toString(16)}}`;
    else out += ch;
  }
  return `${out}"`;
}

// serde's words for a value that is not of the expected type.
function unexpected(node) {
  switch (node.kind) {
    case 'str':
      return `string ${rustDebug(node.value)}`;
    case 'int':
      return `integer \`${node.big}\``;
    case 'float':
      // The host writes the JSON, and its text of a float is the text serde prints (`1.0`,
      // `1e+16`); a float written by hand shows as written.
      return `floating point \`${node.text}\``;
    case 'bool':
      return `boolean \`${node.value}\``;
    case 'null':
      return 'null';
    case 'map':
      return 'map';
    default:
      return 'sequence';
  }
}

// A config type: string, i64, f64, bool, object (a map), or [type] / 'type[]' (a list).
const CONFIG_TYPES = {
  string: ['a string', (n) => n.kind === 'str'],
  i64: ['i64', (n) => n.kind === 'int'],
  f64: ['f64', (n) => n.kind === 'int' || n.kind === 'float'],
  bool: ['a boolean', (n) => n.kind === 'bool'],
  object: ['a map', (n) => n.kind === 'map'],
};
const TYPE_ALIASES = { str: 'string', int: 'i64', integer: 'i64', float: 'f64', number: 'f64', boolean: 'bool', map: 'object' };

function configType(spec) {
  if (Array.isArray(spec)) return { list: spec.length > 0 ? configType(spec[0]) : null };
  const name = TYPE_ALIASES[spec] ?? spec;
  if (typeof name === 'string' && name.endsWith('[]')) return { list: configType(name.slice(0, -2)) };
  if (!(name in CONFIG_TYPES)) {
    throw new TypeError(`config type ${JSON.stringify(spec)}: expected one of ${Object.keys(CONFIG_TYPES).join(', ')}, or a list ([type] or 'type[]')`);
  }
  return { name };
}

class ConfigReader {
  constructor(bytes) {
    this.b = bytes;
  }

  at(offset) {
    let line = 1;
    let lastNewline = -1;
    for (let i = 0; i < offset; i++) {
      if (this.b[i] === 0x0a) {
        line++;
        lastNewline = i;
      }
    }
    return `at line ${line} column ${offset - lastNewline - 1}`;
  }

  // serde_json reports a scalar of the wrong type after reading it, and a map or a list before
  // its bracket (it only peeks at it).
  where(node) {
    return node.kind === 'map' || node.kind === 'list' ? node.start : node.end;
  }

  plain(node) {
    switch (node.kind) {
      case 'map':
        return Object.fromEntries(node.items.map(({ key, value }) => [key, this.plain(value)]));
      case 'list':
        return node.items.map((n) => this.plain(n));
      default:
        return node.value;
    }
  }

  check(path, node, type, nullable) {
    if (type === null || (nullable && node.kind === 'null')) return this.plain(node);
    if ('list' in type) {
      if (node.kind !== 'list') throw this.badType(path, node, 'a sequence');
      return node.items.map((item, i) => this.check(`${path}[${i}]`, item, type.list, false));
    }
    const [expected, ok] = CONFIG_TYPES[type.name];
    if (!ok(node)) throw this.badType(path, node, expected);
    if (type.name === 'i64' && node.big >= 1n << 63n) {
      throw invalidConfig(`${path}: invalid value: integer \`${node.big}\`, expected i64 ${this.at(this.where(node))}`);
    }
    return this.plain(node);
  }

  badType(path, node, expected) {
    return invalidConfig(`${path}: invalid type: ${unexpected(node)}, expected ${expected} ${this.at(this.where(node))}`);
  }
}

function oneOf(names) {
  const quoted = names.map((n) => `\`${n}\``);
  if (quoted.length === 0) return 'there are no fields';
  if (quoted.length === 1) return `expected ${quoted[0]}`;
  if (quoted.length === 2) return `expected ${quoted[0]} or ${quoted[1]}`;
  return `expected one of ${quoted.join(', ')}`;
}

/**
 * Reads a plugin's JSON `config` as the Rust SDK reads it into a `#[serde(deny_unknown_fields)]`
 * struct of the fields `required` then `optional` (in that order): an unknown key, a missing
 * required key or a value of the wrong type (`configTypes`: key → string, i64, f64, bool,
 * object, or a list: ['string'] / 'string[]') is an `invalid-config` error worded as serde words
 * it. `optional` maps a key to its default (copied in when the key is absent; `null` also lets
 * the key be null; `undefined` leaves an absent key out), or is a list of keys without
 * defaults. An i64 beyond 2^53 comes as a BigInt. An empty text reads as `{}`.
 */
export function readConfig(text, { required = [], optional = {}, configTypes = {} } = {}) {
  const defaults = Array.isArray(optional) ? Object.fromEntries(optional.map((k) => [k, undefined])) : optional;
  const source = String(text ?? '').trim() === '' ? '{}' : String(text);
  try {
    JSON.parse(source);
  } catch (e) {
    throw invalidConfig(`config: ${e.message}`);
  }
  const reader = new ConfigReader(encoder.encode(source));
  const node = scan(reader.b, 0);
  const fields = [...required, ...Object.keys(defaults).filter((k) => !required.includes(k))];
  if (node.kind !== 'map') {
    throw invalidConfig(`config: invalid type: ${unexpected(node)}, expected struct Config ${reader.at(reader.where(node))}`);
  }
  const types = Object.fromEntries(Object.entries(configTypes).map(([k, t]) => [k, configType(t)]));
  const config = {};
  for (const { key, keyEnd, value } of node.items) {
    if (!fields.includes(key)) {
      throw invalidConfig(`config.${key}: unknown field \`${key}\`, ${oneOf(fields)} ${reader.at(keyEnd)}`);
    }
    if (Object.prototype.hasOwnProperty.call(config, key)) {
      throw invalidConfig(`config: duplicate field \`${key}\` ${reader.at(keyEnd)}`);
    }
    const nullable = key in defaults && !required.includes(key) && defaults[key] === null;
    config[key] = reader.check(`config.${key}`, value, types[key] ?? null, nullable);
  }
  for (const key of fields) {
    if (!Object.prototype.hasOwnProperty.call(config, key)) {
      if (required.includes(key)) {
        throw invalidConfig(`config: missing field \`${key}\` ${reader.at(node.end)}`);
      }
      const value = defaults[key];
      if (value !== undefined) {
        config[key] = value !== null && typeof value === 'object' ? JSON.parse(JSON.stringify(value)) : value;
      }
    }
  }
  return config;
}

/** The config of a plugin class: its `static required`, `optional` and `configTypes`. */
function classConfig(Cls, text) {
  return readConfig(text, { required: Cls.required ?? [], optional: Cls.optional ?? {}, configTypes: Cls.configTypes ?? {} });
}

// --- types -----------------------------------------------------------------------------------
// A type is named as the Rust SDK prints it, so errors read the same in every language:
// boolean, int32, int64, float64, utf8, timestamp-micros, date32, decimal128(P, S).

const SIMPLE_TYPES = new Set(['boolean', 'int32', 'int64', 'float64', 'utf8', 'timestamp-micros', 'date32']);

/** A WIT data type (`{ tag, val }`) as its name: `int64`, `decimal128(12, 2)`. */
export function typeString(dataType) {
  return dataType.tag === 'decimal128'
    ? `decimal128(${dataType.val.precision}, ${dataType.val.scale})`
    : dataType.tag;
}

const TYPE_NAME_ALIASES = { bool: 'boolean', string: 'utf8', timestamp: 'timestamp-micros', timestamp_micros: 'timestamp-micros', date: 'date32' };

/** A type name (or a WIT data type) as the WIT data type; `string`, `bool`, `timestamp`, `date` and `decimal(P, S)` are accepted too. */
export function dataTypeOf(type) {
  if (type !== null && typeof type === 'object' && typeof type.tag === 'string') {
    return type;
  }
  const text = String(type).trim();
  const name = TYPE_NAME_ALIASES[text] ?? text;
  if (SIMPLE_TYPES.has(name)) {
    return { tag: name };
  }
  const m = /^decimal(?:128)?\(\s*(\d+)\s*,\s*(-?\d+)\s*\)$/.exec(name);
  if (m) {
    return { tag: 'decimal128', val: { precision: Number(m[1]), scale: Number(m[2]) } };
  }
  throw new TypeError(
    `unknown type \`${text}\`: expected one of ${[...SIMPLE_TYPES].join(', ')}, decimal128(P, S)`,
  );
}

/** `utf8`, `int64`, `decimal128`, `timestamp-micros`, ...: a WIT data type's tag. */
export const typeName = (dataType) => dataType.tag;

/** One named, typed column of a schema. `type` is a type name (`int64`, `decimal128(38, 2)`). */
export class Field {
  constructor(name, type, nullable = true) {
    this.name = name;
    this.dataType = dataTypeOf(type);
    this.nullable = nullable;
  }

  /** The type's name: `int64`, `decimal128(12, 2)`, `timestamp-micros`, ... */
  get type() {
    return typeString(this.dataType);
  }

  /** A decimal's precision (undefined for other types). */
  get precision() {
    return this.dataType.val?.precision;
  }

  /** A decimal's scale (undefined for other types). */
  get scale() {
    return this.dataType.val?.scale;
  }

  static fromWit(f) {
    return new Field(f.name, f.dataType, f.nullable);
  }

  toWit() {
    return { name: this.name, dataType: this.dataType, nullable: this.nullable };
  }
}

/** The ordered fields of a batch: an array of Field with lookups by name. */
export class Schema extends Array {
  // map, filter, slice... return plain arrays.
  static get [Symbol.species]() {
    return Array;
  }

  constructor(fields = []) {
    super();
    for (const f of fields) {
      this.push(f instanceof Field ? f : Field.fromWit(f));
    }
  }

  /** The field named `name`, or undefined. */
  field(name) {
    return this.find((f) => f.name === name);
  }

  /** The position of the field named `name`, or -1. */
  index(name) {
    return this.findIndex((f) => f.name === name);
  }

  /** The names, in column order. */
  get names() {
    return this.map((f) => f.name);
  }

  /** A new schema with `field` added at the end, or replacing the field of its name in place. */
  withField(field) {
    const out = new Schema(this);
    const i = out.index(field.name);
    if (i < 0) {
      out.push(field);
    } else {
      out[i] = field;
    }
    return out;
  }

  /** A new schema without the field named `name`. */
  withoutField(name) {
    return new Schema(this.filter((f) => f.name !== name));
  }

  toWit() {
    return this.map((f) => f.toWit());
  }
}

/** A schema (a Schema, or an array of fields in either form) as WIT fields. */
function schemaToWit(schema) {
  return Array.from(schema, (f) => (f instanceof Field ? f.toWit() : f));
}

// --- bitmaps and values ----------------------------------------------------------------------

/** Whether bit `i` of an Arrow bitmap is set. */
export const bit = (bitmap, i) => ((bitmap[i >> 3] >> (i & 7)) & 1) === 1;

/** Whether value `row` is not null (`validity` absent: every value is valid). */
export const isValid = (validity, row) => validity == null || bit(validity, row);

/** A bitmap of `length` bits with bit i = `keep(i)`, least significant bit first. */
export function maskFrom(length, keep) {
  const out = new Uint8Array((length + 7) >> 3);
  for (let i = 0; i < length; i++) {
    if (keep(i)) {
      out[i >> 3] |= 1 << (i & 7);
    }
  }
  return out;
}

/** Bitwise AND of two bitmaps of the same length. */
export function andBits(a, b) {
  const out = new Uint8Array(a.length);
  for (let i = 0; i < a.length; i++) {
    out[i] = a[i] & b[i];
  }
  return out;
}

/** Value i of a decimal128 column (16 little-endian bytes each) as an unscaled BigInt. */
export function decimalAt(raw, i) {
  const view = new DataView(raw.buffer, raw.byteOffset + 16 * i, 16);
  return (view.getBigInt64(8, true) << 64n) | view.getBigUint64(0, true);
}

/** Writes `value` (an i128 BigInt) as value i of a decimal128 buffer. */
export function setDecimalAt(raw, i, value) {
  const view = new DataView(raw.buffer, raw.byteOffset + 16 * i, 16);
  view.setBigUint64(0, BigInt.asUintN(64, value), true);
  view.setBigInt64(8, BigInt.asIntN(64, value >> 64n), true);
}

/** A utf8 column's values: `bytes(i)` (a view, no copy), `text(i)`, `length`. */
export class Strings {
  constructor({ offsets, data }) {
    this.offsets = offsets;
    this.data = data;
    this.length = offsets.length - 1;
  }

  bytes(i) {
    return this.data.subarray(this.offsets[i], this.offsets[i + 1]);
  }

  text(i) {
    return decoder.decode(this.bytes(i));
  }

  /** Strings of `values` (null and undefined are stored as empty strings). */
  static from(values) {
    const n = values.length;
    const offsets = new Int32Array(n + 1);
    let capacity = 0;
    for (let i = 0; i < n; i++) {
      if (values[i] != null) capacity += 3 * String(values[i]).length;
    }
    const data = new Uint8Array(capacity);
    let end = 0;
    for (let i = 0; i < n; i++) {
      if (values[i] != null) {
        end += encoder.encodeInto(String(values[i]), data.subarray(end)).written;
      }
      offsets[i + 1] = end;
    }
    return new Strings({ offsets, data: data.subarray(0, end) });
  }
}

// --- text forms of timestamps, dates and decimals ---------------------------------------------

const pad = (n, width) => String(n).padStart(width, '0');

/** UTC microseconds as RFC 3339 with `Z` and 0, 3 or 6 fractional digits. */
export function timestampText(micros) {
  const m = BigInt(micros);
  const secs = m / 1_000_000n - (m % 1_000_000n < 0n ? 1n : 0n);
  const frac = Number(m - secs * 1_000_000n);
  const text = new Date(Number(secs) * 1000).toISOString().slice(0, 19);
  if (frac === 0) return `${text}Z`;
  if (frac % 1000 === 0) return `${text}.${pad(frac / 1000, 3)}Z`;
  return `${text}.${pad(frac, 6)}Z`;
}

/** Days since the epoch as YYYY-MM-DD. */
export const dateText = (days) => new Date(days * 86_400_000).toISOString().slice(0, 10);

/** An unscaled decimal at `scale` as exact text: (2390n, 2) → "23.90". */
export function decimalText(unscaled, scale) {
  if (scale <= 0) return String(unscaled * 10n ** BigInt(-scale));
  const negative = unscaled < 0n;
  const digits = String(negative ? -unscaled : unscaled).padStart(scale + 1, '0');
  return `${negative ? '-' : ''}${digits.slice(0, -scale)}.${digits.slice(-scale)}`;
}

/** Decimal text (sign, digits, fraction, exponent) times 10^scale exactly, or null if it is not exact. */
export function parseDecimal(text, scale) {
  const m = /^([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$/.exec(String(text).trim());
  if (!m || (m[2] === '' && (m[3] ?? '') === '')) {
    return null;
  }
  let digits = m[2] + (m[3] ?? '');
  let exponent = scale + Number(m[4] ?? 0) - (m[3] ?? '').length;
  if (exponent < 0) {
    if (/[^0]/.test(digits.slice(exponent))) {
      return null;
    }
    digits = digits.slice(0, exponent);
    exponent = 0;
  }
  const value = BigInt((digits || '0') + '0'.repeat(exponent));
  return m[1] === '-' ? -value : value;
}

// --- columns ---------------------------------------------------------------------------------

const DAY_MS = 86_400_000;

/** `length` bits from an array of booleans (or a bitmap, returned as it is). */
function toBitmap(bits, length) {
  if (bits == null || isTypedArray(bits, 'Uint8Array')) {
    return bits ?? null;
  }
  return maskFrom(length, (i) => Boolean(bits[i]));
}

/**
 * A column in Arrow's layout. `raw` is what crossed the boundary: an Int32Array (int32, date32),
 * BigInt64Array (int64, timestamp-micros), Float64Array (float64), a bitmap Uint8Array (boolean),
 * 16 bytes per value in a Uint8Array (decimal128) or Strings (utf8). `validity` is a bitmap or
 * null (every value valid). `get(i)` gives value i as JavaScript: number (int32, float64, date32
 * as days since the epoch), BigInt (int64, timestamp-micros as UTC microseconds), boolean,
 * string (utf8, and decimal128 as exact text at the column's scale), or null.
 */
export class Column {
  constructor(name, type, raw, validity = null, length = undefined) {
    this.name = name;
    this.dataType = dataTypeOf(type);
    this.raw = raw;
    this.validity = validity ?? null;
    this.length = length ?? (this.dataType.tag === 'decimal128' ? raw.length / 16 : raw.length);
    this._at = undefined;
  }

  /** The type's name: `int64`, `decimal128(12, 2)`, ... */
  get type() {
    return typeString(this.dataType);
  }

  get precision() {
    return this.dataType.val?.precision;
  }

  get scale() {
    return this.dataType.val?.scale;
  }

  /** The field describing this column (nullable when it has a validity bitmap). */
  get field() {
    return new Field(this.name, this.dataType, this.validity !== null);
  }

  isValid(i) {
    return this.validity === null || bit(this.validity, i);
  }

  isNull(i) {
    return !this.isValid(i);
  }

  get nullCount() {
    let n = 0;
    if (this.validity !== null) {
      for (let i = 0; i < this.length; i++) if (!bit(this.validity, i)) n++;
    }
    return n;
  }

  /** A function from row to value that ignores validity: the fast path of `get`. */
  valueAt() {
    if (this._at === undefined) {
      const raw = this.raw;
      switch (this.dataType.tag) {
        case 'boolean':
          this._at = (i) => bit(raw, i);
          break;
        case 'utf8':
          this._at = (i) => raw.text(i);
          break;
        case 'decimal128': {
          const scale = this.scale;
          this._at = (i) => decimalText(decimalAt(raw, i), scale);
          break;
        }
        default:
          this._at = (i) => raw[i];
      }
    }
    return this._at;
  }

  /** Value i, or null. */
  get(i) {
    return this.isValid(i) ? this.valueAt()(i) : null;
  }

  /** Value i of a decimal column as an unscaled BigInt (`23.90` at scale 2 is 2390n), or null. */
  unscaled(i) {
    return this.isValid(i) ? decimalAt(this.raw, i) : null;
  }

  /** String i of a utf8 column as bytes (a view, no copy), or null. */
  bytes(i) {
    return this.isValid(i) ? this.raw.bytes(i) : null;
  }

  /** Every value, null where null. */
  toArray() {
    const at = this.valueAt();
    const out = new Array(this.length);
    for (let i = 0; i < this.length; i++) {
      out[i] = this.isValid(i) ? at(i) : null;
    }
    return out;
  }

  *[Symbol.iterator]() {
    for (let i = 0; i < this.length; i++) yield this.get(i);
  }

  /** This column under another name (the buffers are shared). */
  withName(name) {
    return new Column(name, this.dataType, this.raw, this.validity, this.length);
  }

  static fromWit(c, rows) {
    const { tag, val } = c.values;
    return new Column(c.name, c.dataType, tag === 'utf8' ? new Strings(val) : val, c.validity ?? null, rows);
  }

  toWit() {
    const tag = this.dataType.tag;
    const raw = this.raw;
    return {
      name: this.name,
      dataType: this.dataType,
      validity: this.validity ?? undefined,
      values: { tag, val: tag === 'utf8' ? { offsets: raw.offsets, data: raw.data } : raw },
    };
  }

  // Constructors. `values` is either the buffer itself (a typed array of the column's layout,
  // Strings, or the bytes of decimals) or an array of values where null is null; `validity`
  // is a bitmap, an array of booleans, or absent (built from the nulls of an array, and left
  // absent when there are none).

  static boolean(name, values, validity, length) {
    if (isTypedArray(values, 'Uint8Array')) {
      return new Column(name, 'boolean', values, toBitmap(validity, length), length);
    }
    return Column.fromValues(name, 'boolean', values, validity);
  }

  static int32(name, values, validity) {
    return typed(name, 'int32', Int32Array, values, validity);
  }

  static int64(name, values, validity) {
    return typed(name, 'int64', BigInt64Array, values, validity);
  }

  static float64(name, values, validity) {
    return typed(name, 'float64', Float64Array, values, validity);
  }

  static timestampMicros(name, values, validity) {
    return typed(name, 'timestamp-micros', BigInt64Array, values, validity);
  }

  static date32(name, values, validity) {
    return typed(name, 'date32', Int32Array, values, validity);
  }

  static utf8(name, values, validity) {
    if (values instanceof Strings) {
      return new Column(name, 'utf8', values, toBitmap(validity, values.length), values.length);
    }
    return Column.fromValues(name, 'utf8', values, validity);
  }

  /** Unscaled values (BigInt, `23.90` at scale 2 is 2390n) or their 16-byte buffer. */
  static decimal128(name, precision, scale, values, validity) {
    const type = { tag: 'decimal128', val: { precision, scale } };
    if (isTypedArray(values, 'Uint8Array')) {
      return new Column(name, type, values, toBitmap(validity, values.length / 16), values.length / 16);
    }
    const n = values.length;
    const raw = new Uint8Array(16 * n);
    for (let i = 0; i < n; i++) {
      if (values[i] != null) setDecimalAt(raw, i, BigInt(values[i]));
    }
    return new Column(name, type, raw, validity === undefined ? nullsOf(values) : toBitmap(validity, n), n);
  }

  /**
   * A column of `type` from row values as `get` returns them, null being null; also accepted:
   * numbers for int64 and timestamps, Date for timestamps and dates, YYYY-MM-DD for dates,
   * numbers and BigInts (whole units) for decimals. A value that does not fit is a fatal error
   * naming its row.
   */
  static fromValues(name, type, values, validity) {
    const dataType = dataTypeOf(type);
    const n = values.length;
    const valid = validity === undefined ? nullsOf(values) : toBitmap(validity, n);
    const convert = converter(name, dataType);
    let raw;
    switch (dataType.tag) {
      case 'boolean':
        raw = maskFrom(n, (i) => values[i] != null && convert(values[i], i));
        break;
      case 'utf8':
        raw = Strings.from(values);
        break;
      case 'decimal128':
        raw = new Uint8Array(16 * n);
        for (let i = 0; i < n; i++) {
          if (values[i] != null) setDecimalAt(raw, i, convert(values[i], i));
        }
        break;
      default: {
        const Typed = ARRAY_OF[dataType.tag];
        raw = new Typed(n);
        for (let i = 0; i < n; i++) {
          if (values[i] != null) raw[i] = convert(values[i], i);
        }
      }
    }
    return new Column(name, dataType, raw, valid, n);
  }
}

const ARRAY_OF = {
  int32: Int32Array,
  date32: Int32Array,
  int64: BigInt64Array,
  'timestamp-micros': BigInt64Array,
  float64: Float64Array,
};

/** A bitmap of the non-null entries of `values`, or null when none is null. */
function nullsOf(values) {
  for (let i = 0; i < values.length; i++) {
    if (values[i] == null) {
      return maskFrom(values.length, (j) => values[j] != null);
    }
  }
  return null;
}

function typed(name, type, Typed, values, validity) {
  if (isTypedArray(values, Typed.name)) {
    return new Column(name, type, values, toBitmap(validity, values.length), values.length);
  }
  return Column.fromValues(name, type, values, validity);
}

const I64_MIN = -(1n << 63n);
const I64_MAX = (1n << 63n) - 1n;

/** The function that turns a row value into the buffer's value for `dataType`. */
function converter(name, dataType) {
  const type = typeString(dataType);
  const bad = (v, i) => fatal(`column \`${name}\`: ${typeof v === 'bigint' ? `${v}n` : JSON.stringify(String(v))} is not a ${type} value`, i);
  const integer = (v, i) => {
    if (typeof v === 'bigint') return v;
    if (Number.isInteger(v)) return BigInt(v);
    throw bad(v, i);
  };
  const i64 = (v, i) => {
    const x = integer(v, i);
    if (x < I64_MIN || x > I64_MAX) throw bad(v, i);
    return x;
  };
  switch (dataType.tag) {
    case 'boolean':
      return (v, i) => {
        if (typeof v !== 'boolean') throw bad(v, i);
        return v;
      };
    case 'int32':
      return (v, i) => {
        const x = typeof v === 'bigint' ? Number(v) : v;
        if (!Number.isInteger(x) || x < -2147483648 || x > 2147483647) throw bad(v, i);
        return x;
      };
    case 'float64':
      return (v, i) => {
        if (typeof v !== 'number' && typeof v !== 'bigint') throw bad(v, i);
        return Number(v);
      };
    case 'int64':
      return i64;
    case 'timestamp-micros':
      return (v, i) => (v instanceof Date ? BigInt(v.getTime()) * 1000n : i64(v, i));
    case 'date32':
      return (v, i) => {
        let days = v;
        if (v instanceof Date) days = Math.floor(v.getTime() / DAY_MS);
        else if (typeof v === 'string' && /^\d{4}-\d{2}-\d{2}$/.test(v)) days = Date.parse(`${v}T00:00:00Z`) / DAY_MS;
        else if (typeof v === 'bigint') days = Number(v);
        if (!Number.isInteger(days)) throw bad(v, i);
        return days;
      };
    case 'decimal128': {
      const { precision, scale } = dataType.val;
      const limit = 10n ** BigInt(precision);
      return (v, i) => {
        const x = typeof v === 'bigint' ? v * 10n ** BigInt(Math.max(scale, 0)) : parseDecimal(String(v), scale);
        if (x === null || x >= limit || x <= -limit) throw bad(v, i);
        return x;
      };
    }
    default:
      return (v) => v;
  }
}

// --- batches ---------------------------------------------------------------------------------

/** What a batch call is for. `timestamp` is the batch clock: identical on a replay. */
export class BatchInfo {
  constructor(info) {
    this.queryId = info.queryId;
    this.batchId = info.batchId;
    this.attempt = info.attempt;
    this.timestampMicros = info.timestampMicros;
    this.partition = info.partition;
  }

  /** The batch's timestamp as a Date (millisecond precision; `timestampMicros` is exact). */
  get timestamp() {
    const m = BigInt(this.timestampMicros);
    return new Date(Number(m / 1000n - (m % 1000n < 0n ? 1n : 0n)));
  }
}

/**
 * The batch handed to a plugin. It pulls only what the plugin asks for, once: `column(name)` copies
 * that one column out of the host and caches it for the rest of the call.
 */
export class Batch {
  constructor(host) {
    /** The host's `batch` resource (for weir-merge.js and the WIT-level helpers). */
    this.host = host;
    this._rows = undefined;
    this._schema = undefined;
    this._columns = new Map();
  }

  get numRows() {
    if (this._rows === undefined) this._rows = this.host.numRows();
    return this._rows;
  }

  get schema() {
    if (this._schema === undefined) this._schema = new Schema(this.host.schema());
    return this._schema;
  }

  /** The column named `name`, or an `invalid-input` error listing the batch's columns. */
  column(name) {
    const i = this.schema.index(name);
    if (i < 0) {
      throw invalidInput(`the batch has no column \`${name}\` (columns: ${this.schema.names.join(', ')})`);
    }
    return this.columnAt(i);
  }

  /** The column at position `index` of the schema. */
  columnAt(index) {
    let c = this._columns.get(index);
    if (c === undefined) {
      if (!(index >= 0 && index < this.schema.length)) {
        throw invalidInput(`column index ${index} is out of range for a batch of ${this.schema.length} columns`);
      }
      c = Column.fromWit(this.host.column(index), this.numRows);
      this._columns.set(index, c);
    }
    return c;
  }

  /** The named columns (every column when none is named). */
  columns(...names) {
    return names.length === 0 ? this.schema.map((_, i) => this.columnAt(i)) : names.map((n) => this.column(n));
  }

  /**
   * The rows as objects of the named columns (every column when none is named), values as
   * `Column.get` gives them. The columns cross once; only this loop is per row.
   */
  *rows(...names) {
    const columns = this.columns(...names);
    const keys = columns.map((c) => c.name);
    const at = columns.map((c) => c.valueAt());
    const validity = columns.map((c) => c.validity);
    const rows = this.numRows;
    for (let i = 0; i < rows; i++) {
      const row = {};
      for (let c = 0; c < columns.length; c++) {
        row[keys[c]] = validity[c] === null || bit(validity[c], i) ? at[c](i) : null;
      }
      yield row;
    }
  }

  /** The whole batch as an Arrow IPC stream. */
  toIpc() {
    return this.host.toIpc();
  }
}

// --- output ----------------------------------------------------------------------------------

/** A selection of rows: a bitmap (Uint8Array), an array of booleans, or indices (Uint32Array). */
function selection(keep) {
  if (isTypedArray(keep, 'Uint32Array')) return { tag: 'indices', val: keep };
  if (isTypedArray(keep, 'Uint8Array')) return { tag: 'mask', val: keep };
  if (Array.isArray(keep)) return { tag: 'mask', val: maskFrom(keep.length, (i) => Boolean(keep[i])) };
  if (keep !== null && typeof keep === 'object' && (keep.tag === 'mask' || keep.tag === 'indices')) return keep;
  throw new TypeError(`a selection is a bitmap (Uint8Array), an array of booleans or indices (Uint32Array), not ${String(keep)}`);
}

/** A transform's result: an edit of its input (`Output.keep`, `Output.edit()...`) or Arrow IPC. */
export class Output {
  /** Keeps the selected rows, every column as it is. */
  static keep(keep) {
    return new Edit().keep(keep);
  }

  /** The batch as it came. */
  static unchanged() {
    return new Edit();
  }

  /** An edit to chain: `.setColumn(column).dropColumn(name).keep(selection)`. */
  static edit() {
    return new Edit();
  }

  /** A whole new batch as an Arrow IPC stream. */
  static ipc(bytes) {
    return new Ipc(bytes);
  }
}

/** Columns to add or replace, columns to drop, rows to keep: untouched columns never cross back. */
export class Edit extends Output {
  constructor() {
    super();
    this.setColumns = [];
    this.dropColumns = [];
    this.selection = undefined;
  }

  /** Adds `column`, or replaces the column of its name; it has the input's row count. */
  setColumn(column) {
    this.setColumns.push(column);
    return this;
  }

  dropColumn(name) {
    this.dropColumns.push(name);
    return this;
  }

  /** Keeps these rows (after the column edits). */
  keep(keep) {
    this.selection = selection(keep);
    return this;
  }

  toWit() {
    return {
      tag: 'edit',
      val: {
        setColumns: this.setColumns.map((c) => (c instanceof Column ? c.toWit() : c)),
        dropColumns: this.dropColumns,
        keep: this.selection,
      },
    };
  }
}

class Ipc extends Output {
  constructor(bytes) {
    super();
    this.bytes = bytes;
  }

  toWit() {
    return { tag: 'ipc', val: this.bytes };
  }
}

/** An Output (or a WIT `transform-output` written by hand) as the WIT value. */
export function outputToWit(output, who = 'process') {
  if (output instanceof Output) return output.toWit();
  if (output !== null && typeof output === 'object' && (output.tag === 'edit' || output.tag === 'ipc')) return output;
  throw fatal(`${who} returned ${String(output)}, not an Output (Output.keep, Output.edit(), Output.unchanged())`);
}

/** A transform output keeping the rows whose bit is set (WIT form; `Output.keep` is the same). */
export function keep(mask) {
  return { tag: 'edit', val: { setColumns: [], dropColumns: [], keep: { tag: 'mask', val: mask } } };
}

// --- plugins ---------------------------------------------------------------------------------

/**
 * A transform. Subclass it: `constructor(config, schema)` (config: the pipeline's `config` with
 * defaults filled in; see `static required`, `optional`, `configTypes` and readConfig), optionally
 * `outputSchema(schema)`, and `process(batch, info)` returning an Output.
 */
export class Transform {
  /** The output schema for input `schema`: by default the input's. */
  outputSchema(schema) {
    return schema;
  }

  process(_batch, _info) {
    throw fatal(`${this.constructor.name} does not implement process(batch, info)`);
  }
}

/** A foreachBatch sink: `constructor(config, schema)` and `writeBatch(batch, info)`. */
export class Sink {
  writeBatch(_batch, _info) {
    throw fatal(`${this.constructor.name} does not implement writeBatch(batch, info)`);
  }
}

const SCHEMAS = Symbol('weir schemas');
const NOT_OPEN = 'the host called the plugin before `open` succeeded';

function checkClass(Cls, Base, what, method) {
  if (typeof Cls !== 'function' || !(Cls.prototype instanceof Base) || typeof Cls.prototype[method] !== 'function') {
    throw new TypeError(`${what}: ${Cls?.name ?? String(Cls)} is not a class extending ${Base.name}`);
  }
}

/** The `transformer` export for the transform class `Cls`: `export const transformer = exportTransform(Cls)`. */
export function exportTransform(Cls) {
  checkClass(Cls, Transform, 'exportTransform', 'process');
  let instance = null;
  return {
    open(config, inputSchema) {
      return guarded(() => {
        instance = null;
        const schema = new Schema(inputSchema);
        const t = new Cls(classConfig(Cls, config), schema);
        const output = new Schema(t.outputSchema(schema) ?? schema);
        t[SCHEMAS] = { input: schema, output };
        instance = t;
        return schemaToWit(output);
      });
    },
    process(info, input) {
      if (instance === null) throw fatal(NOT_OPEN).payload;
      return guarded(() => outputToWit(instance.process(new Batch(input), new BatchInfo(info)), `${Cls.name}.process`));
    },
  };
}

/** The `writer` export for the sink class `Cls`: `export const writer = exportSink(Cls)`. */
export function exportSink(Cls) {
  checkClass(Cls, Sink, 'exportSink', 'writeBatch');
  let instance = null;
  return {
    open(config, inputSchema) {
      guarded(() => {
        instance = null;
        const schema = new Schema(inputSchema);
        instance = new Cls(classConfig(Cls, config), schema);
      });
    },
    writeBatch(info, input) {
      if (instance === null) throw fatal(NOT_OPEN).payload;
      guarded(() => {
        instance.writeBatch(new Batch(input), new BatchInfo(info));
      });
    },
  };
}

/**
 * A transform written one row at a time. Define `row(row, info)`: `row` is an object of the
 * columns named by `static columns` (default: every column); return false/null/undefined to drop
 * the row, true to keep it as it is, or an object to keep it and set the columns it names, which
 * the output schema must have (add new ones in `outputSchema` with `schema.withField(...)`). The
 * SDK builds the columns and the keep mask: the result still crosses back as one edit. An error
 * thrown without a row gets the current row.
 */
export class RowTransform extends Transform {
  row(_row, _info) {
    throw fatal(`${this.constructor.name} does not implement row(row, info)`);
  }

  process(batch, info) {
    const { input, output } = this[SCHEMAS] ?? { input: batch.schema, output: batch.schema };
    const names = this.constructor.columns ?? batch.schema.names;
    const rows = batch.numRows;
    const mask = new Uint8Array((rows + 7) >> 3);
    let kept = 0;
    const sets = new Map();
    const values = batch.rows(...names);
    for (let i = 0; i < rows; i++) {
      const row = values.next().value;
      let result;
      try {
        result = this.row(row, info);
      } catch (e) {
        if (e instanceof PluginError && e.row === undefined) e.row = i;
        throw e;
      }
      if (result === false || result == null) continue;
      mask[i >> 3] |= 1 << (i & 7);
      kept++;
      if (result === true) continue;
      if (typeof result !== 'object') {
        throw fatal(`${this.constructor.name}.row returned ${String(result)}: expected true, false, null or an object of columns`, i);
      }
      for (const key of Object.keys(result)) {
        let set = sets.get(key);
        if (set === undefined) {
          const field = output.field(key);
          if (field === undefined) {
            throw fatal(`${this.constructor.name}.row set column \`${key}\`, which the output schema does not have (add it in outputSchema)`, i);
          }
          set = { field, values: new Array(rows).fill(undefined) };
          sets.set(key, set);
        }
        set.values[i] = result[key] ?? null;
      }
    }
    const edit = Output.edit();
    for (const field of output) {
      const inInput = input.index(field.name) >= 0;
      const set = sets.get(field.name);
      if (set === undefined && inInput) continue;
      const values = set?.values ?? new Array(rows).fill(null);
      if (inInput) {
        // Rows that did not name the column keep the input's value.
        const old = batch.column(field.name);
        for (let i = 0; i < rows; i++) if (values[i] === undefined) values[i] = old.get(i);
      }
      for (let i = 0; i < rows; i++) if (values[i] === undefined) values[i] = null;
      edit.setColumn(Column.fromValues(field.name, field.dataType, values));
    }
    for (const field of input) {
      if (output.index(field.name) < 0) edit.dropColumn(field.name);
    }
    if (kept < rows) edit.keep(mask);
    return edit;
  }
}

// --- host ------------------------------------------------------------------------------------

/** Logs through the host's logger, tagged with the plugin and batch. `level`: trace..error. */
export function log(message, level = 'info') {
  hostLog(level, String(message));
}
export const logTrace = (message) => log(message, 'trace');
export const logDebug = (message) => log(message, 'debug');
export const logInfo = (message) => log(message, 'info');
export const logWarn = (message) => log(message, 'warn');
export const logError = (message) => log(message, 'error');

/** A random u64 (BigInt) from a source seeded by (query, batch, partition): the same on replay. */
export const randomU64 = () => hostRandomU64();

// --- WIT-level helpers (the first version of this module; the classes above wrap them) -------

/** The position of column `name` in WIT fields, or an `invalid-input` error naming it. */
export function fieldIndex(schema, name) {
  const i = schema.findIndex((f) => f.name === name);
  if (i < 0) {
    throw invalidInput(`the input has no column \`${name}\``);
  }
  return i;
}

/** Pulls one column by name from a host batch resource: only this column crosses the boundary. */
export function column(batch, name) {
  return batch.column(fieldIndex(batch.schema(), name));
}
