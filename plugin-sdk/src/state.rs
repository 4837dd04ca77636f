//! Keyed state for stateful transforms (WIT interface `keyed-state`, Spark's
//! `transformWithState`), behind plain Rust functions.
//!
//! State kept in the plugin's own memory is lost when the host restarts the query, and keeps
//! what a failed attempt wrote when a batch is retried; state kept here is the host's: it is
//! stored in the query's state store and versioned with the batch, so a batch — however often it
//! is replayed — always starts from exactly what the previous batch committed. Keys and values
//! are bytes; encode them as you like (little-endian integers are cheapest).
//!
//! In a `wasm32` build this module exists only with the SDK's `stateful-transform` feature,
//! which makes the component import `keyed-state`; the host gives such a component a store.
//! Natively it is a per-thread map, driven by [`crate::testing`]'s state helpers.

/// The value of `key`, or `None` when it was never put, was deleted, or has expired (its expiry
/// is at or before the batch's watermark).
pub fn get(key: &[u8]) -> Option<Vec<u8>> {
    imp::get(key)
}

/// [`get`] for many keys in one call across the boundary: the values in the order of `keys`.
pub fn get_many(keys: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    imp::get_many(keys)
}

/// Sets `key` to `value`; it never expires.
pub fn put(key: &[u8], value: &[u8]) {
    imp::put(key, value, None);
}

/// Sets `key` to `value`, expiring once the event-time watermark reaches `expires_at_micros`
/// (UTC µs): from then on [`get`] does not see it, and the host removes it at the end of that
/// batch. Putting the key again replaces value and expiry.
pub fn put_expiring(key: &[u8], value: &[u8], expires_at_micros: i64) {
    imp::put(key, value, Some(expires_at_micros));
}

/// Removes `key` (nothing happens when it is absent).
pub fn delete(key: &[u8]) {
    imp::delete(key);
}

/// The batch's event-time watermark in UTC µs (0 before any event time was seen, or without a
/// watermark); identical when the batch is replayed.
pub fn watermark_micros() -> i64 {
    imp::watermark_micros()
}

#[cfg(all(target_arch = "wasm32", feature = "stateful-transform"))]
mod imp {
    use crate::guest::transform::bindings::weir::plugin::keyed_state as wit;

    pub(super) fn get(key: &[u8]) -> Option<Vec<u8>> {
        wit::get(key)
    }

    pub(super) fn get_many(keys: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
        wit::get_many(keys)
    }

    pub(super) fn put(key: &[u8], value: &[u8], expires_at: Option<i64>) {
        wit::put(key, value, expires_at);
    }

    pub(super) fn delete(key: &[u8]) {
        wit::delete(key);
    }

    pub(super) fn watermark_micros() -> i64 {
        wit::watermark_micros()
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod imp {
    use std::cell::{Cell, RefCell};
    use std::collections::BTreeMap;

    /// A value and its expiry (µs).
    type Entry = (Vec<u8>, Option<i64>);

    thread_local! {
        static ENTRIES: RefCell<BTreeMap<Vec<u8>, Entry>> = const { RefCell::new(BTreeMap::new()) };
        static WATERMARK: Cell<i64> = const { Cell::new(0) };
    }

    fn live(entry: &Entry) -> bool {
        entry.1.is_none_or(|at| at > WATERMARK.get())
    }

    pub(crate) fn get(key: &[u8]) -> Option<Vec<u8>> {
        ENTRIES.with_borrow(|m| m.get(key).filter(|e| live(e)).map(|e| e.0.clone()))
    }

    pub(crate) fn get_many(keys: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
        keys.iter().map(|k| get(k)).collect()
    }

    pub(crate) fn put(key: &[u8], value: &[u8], expires_at: Option<i64>) {
        ENTRIES.with_borrow_mut(|m| m.insert(key.to_vec(), (value.to_vec(), expires_at)));
    }

    pub(crate) fn delete(key: &[u8]) {
        ENTRIES.with_borrow_mut(|m| m.remove(key));
    }

    pub(crate) fn watermark_micros() -> i64 {
        WATERMARK.get()
    }

    /// Sets the watermark and removes what it expired, as the host does between batches.
    pub(crate) fn set_watermark(micros: i64) {
        WATERMARK.set(micros);
        ENTRIES.with_borrow_mut(|m| m.retain(|_, e| live(e)));
    }

    pub(crate) fn len() -> usize {
        ENTRIES.with_borrow(BTreeMap::len)
    }

    pub(crate) fn clear() {
        ENTRIES.with_borrow_mut(BTreeMap::clear);
        WATERMARK.set(0);
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    #[test]
    fn native_state_expires_by_watermark() {
        imp::clear();
        put(b"a", b"1");
        put_expiring(b"b", b"2", 100);
        assert_eq!(
            get_many(&[b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]),
            [Some(b"1".to_vec()), Some(b"2".to_vec()), None]
        );
        imp::set_watermark(100);
        assert_eq!(get(b"b"), None);
        assert_eq!(imp::len(), 1);
        delete(b"a");
        assert_eq!(imp::len(), 0);
        assert_eq!(watermark_micros(), 100);
    }
}
