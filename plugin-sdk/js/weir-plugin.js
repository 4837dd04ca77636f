// Helpers for Weir plugins written in JavaScript and built with componentize-js.
//
// The WIT contract (`wit/weir.wit`) hands columns over in Arrow's layout: strings as offsets
// plus one byte buffer, booleans and validity as packed bitmaps, decimals as 16 little-endian
// bytes per value, 64-bit integers as BigInt64Array. That layout is what makes a batch cheap to
// cross the boundary; this module makes it pleasant to read from JavaScript and turns errors
// into one `throw`, so that a plugin is its logic and nothing else. Everything works on buffers
// already copied into the guest: nothing here calls the host per row.

import { log as hostLog } from 'weir:plugin/host@0.1.0';

// --- errors ----------------------------------------------------------------------------------
// An exported function returns `result<_, plugin-error>`: componentize-js turns a thrown
// `{ kind, message, row }` into the error case. (Anything else thrown is a trap.)

/** A `plugin-error` value to throw. `kind`: fatal | retryable | invalid-config | invalid-input. */
export function pluginError(kind, message, row) {
  return { kind, message, row };
}
export const fatal = (message, row) => pluginError('fatal', message, row);
export const retryable = (message, row) => pluginError('retryable', message, row);
export const invalidConfig = (message) => pluginError('invalid-config', message);
export const invalidInput = (message, row) => pluginError('invalid-input', message, row);

// --- config ----------------------------------------------------------------------------------

/**
 * Reads the plugin's JSON `config`, rejecting unknown and missing keys by name
 * (`config.colum: unknown key`), as the Rust SDK's `deny_unknown_fields` does.
 */
export function parseConfig(text, { required = [], optional = [] } = {}) {
  let config;
  try {
    config = JSON.parse(text);
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

// --- schema ----------------------------------------------------------------------------------

/** `utf8`, `int64`, `decimal128`, `timestamp-micros`, ...: a data type's tag. */
export const typeName = (dataType) => dataType.tag;

/** The position of column `name`, or an `invalid-input` error naming it. */
export function fieldIndex(schema, name) {
  const i = schema.findIndex((f) => f.name === name);
  if (i < 0) {
    throw invalidInput(`the input has no column \`${name}\``);
  }
  return i;
}

/** Pulls one column by name: only this column crosses the boundary. */
export function column(batch, name) {
  return batch.column(fieldIndex(batch.schema(), name));
}

// --- values ----------------------------------------------------------------------------------

const decoder = new TextDecoder();

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
}

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

// --- results ---------------------------------------------------------------------------------

/** A transform output keeping the rows whose bit is set; the host applies it to every column. */
export function keep(mask) {
  return { tag: 'edit', val: { setColumns: [], dropColumns: [], keep: { tag: 'mask', val: mask } } };
}

// --- host ------------------------------------------------------------------------------------

/** Logs through the host's logger, tagged with the plugin and batch. `level`: trace..error. */
export function log(message, level = 'info') {
  hostLog(level, message);
}
