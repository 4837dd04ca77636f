// Keyed state for JavaScript transforms of world `stateful-transform` (Spark's
// `transformWithState`): the host keeps it in the query's state store, versioned with the batch,
// so batch N always starts from what batch N-1 committed, however often N is replayed.
//
// Only a plugin built for world `stateful-transform` may import this module: it imports
// `weir:plugin/keyed-state`, which componentize-js refuses in any other world.
//
//   import * as state from './weir-state.js';
//   const values = state.getMany(keys);          // once per batch, for its distinct keys
//   state.put(key, value, expiresAtMicros);      // expiry optional: event time, not wall clock
//
// Keys and values are bytes (Uint8Array); a string key is taken as its UTF-8 bytes.

import * as keyedState from 'weir:plugin/keyed-state@0.1.0';

const encoder = new TextEncoder();
// Buffers from the host are made in the bindings' realm: `instanceof Uint8Array` is false there.
const isBytes = (v) => Object.prototype.toString.call(v) === '[object Uint8Array]';

function bytes(what, v) {
  if (isBytes(v)) return v;
  if (typeof v === 'string') return encoder.encode(v);
  throw new TypeError(`state ${what}: expected a Uint8Array or a string, not ${String(v)}`);
}

/** The value of `key` (a Uint8Array), or null when it was never put, was deleted, or expired. */
export function get(key) {
  return keyedState.get(bytes('key', key)) ?? null;
}

/** `get` for many keys in one call across the boundary: the values (or null) in key order. */
export function getMany(keys) {
  return keyedState.getMany(Array.from(keys, (k) => bytes('key', k))).map((v) => v ?? null);
}

/**
 * Sets `key` to `value` in this batch. With `expiresAtMicros` (UTC microseconds, BigInt or
 * number), the entry expires once the event-time watermark reaches it. Putting again replaces
 * value and expiry.
 */
export function put(key, value, expiresAtMicros = null) {
  keyedState.put(bytes('key', key), bytes('value', value), expiresAtMicros == null ? undefined : BigInt(expiresAtMicros));
}

/** Removes `key` in this batch (nothing happens when it is absent). */
function deleteKey(key) {
  keyedState.delete(bytes('key', key));
}
export { deleteKey as delete, deleteKey as remove };

/** The batch's watermark in UTC microseconds (BigInt; 0n before any event time or without one). */
export function watermarkMicros() {
  return keyedState.watermarkMicros();
}

// --- encodings of numbers (little-endian, as the Rust examples store them) ---------------------

/** An i128 (BigInt; saturated to the i128 range) as 16 little-endian bytes. */
export function i128Bytes(n) {
  const out = new Uint8Array(16);
  const view = new DataView(out.buffer);
  let v = BigInt(n);
  v = v > I128_MAX ? I128_MAX : v < I128_MIN ? I128_MIN : v;
  view.setBigUint64(0, BigInt.asUintN(64, v), true);
  view.setBigInt64(8, BigInt.asIntN(64, v >> 64n), true);
  return out;
}

/** 16 little-endian bytes as an i128 BigInt; null unless `b` is 16 bytes. */
export function bytesI128(b) {
  if (!isBytes(b) || b.length !== 16) return null;
  const view = new DataView(b.buffer, b.byteOffset, 16);
  return (view.getBigInt64(8, true) << 64n) | view.getBigUint64(0, true);
}

/** An i64 (BigInt or integer number) as 8 little-endian bytes: an int64 key as Rust's `to_le_bytes`. */
export function i64Bytes(n) {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigInt64(0, BigInt.asIntN(64, BigInt(n)), true);
  return out;
}

/** 8 little-endian bytes as an i64 BigInt; null unless `b` is 8 bytes. */
export function bytesI64(b) {
  if (!isBytes(b) || b.length !== 8) return null;
  return new DataView(b.buffer, b.byteOffset, 8).getBigInt64(0, true);
}

/** The i128 range, and addition saturating at its ends (Rust's `i128::saturating_add`). */
export const I128_MAX = (1n << 127n) - 1n;
export const I128_MIN = -(1n << 127n);
export function saturatingAddI128(a, b) {
  const s = a + b;
  return s > I128_MAX ? I128_MAX : s < I128_MIN ? I128_MIN : s;
}
