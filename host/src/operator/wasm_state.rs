//! Keyed state of a stateful Wasm transform (Spark's `transformWithState`):
//! the host side of the WIT interface `keyed-state`.
//!
//! A transform that keeps state in its own memory loses it on a restart and
//! keeps what a failed attempt wrote on a retry; only state versioned with
//! the batch, like the built-in operators', gives the same answers after a
//! crash. So the plugin's keys live in the query's state stores: batch N
//! loads version N−1, the plugin's puts and deletes stay in the stores'
//! overlay until the batch's commit writes version N, and a replay loads
//! N−1 again.
//!
//! Expiry is by event time, so that it is replayable: an entry whose
//! `expires_at` (µs) is at or before the batch's watermark wm(b) (the one
//! stateful operators emit and evict by) is invisible to `get` and is
//! removed at the end of the batch, counted in `numRowsRemoved`.
//!
//! Partitioning: the plugin is called once per batch as any transform, and
//! the host spreads its keys over `state_partitions` stores by FNV-1a 64 of
//! the key bytes, like deduplication does, so the layout on disk is the
//! same as every other operator's (`<state dir>/<partition>/`).
//!
//! # Layout in a store
//! - `0x00 ‖ key → 0x00 ‖ value` (no expiry) or `0x01 ‖ expires_at (i64 BE) ‖ value`;
//! - `0x01 ‖ expires_at (order-preserving) ‖ key → ∅`: the expiry index,
//!   scanned from its start up to the watermark;
//! - `0x02 → keys (u64 BE)`: how many plugin keys the store holds, so that
//!   `numRowsTotal` counts keys and not store entries without a scan.

use std::path::PathBuf;

use crate::operator::key_encoding::flip_i64;
use crate::operator::partitioned::{CountEntry, KeyCount, PartitionedConfig, PartitionedState};
use crate::operator::stateful::OperatorMetrics;
use crate::state::{StateError, StateOptions};

/// The operator name of plugin state in progress (`stateOperators[].operatorName`).
pub const OPERATOR_NAME: &str = "transformWithState";

const PREFIX_PRIMARY: u8 = 0x00;
const PREFIX_EXPIRY: u8 = 0x01;
const META_KEYS: &[u8] = &[0x02];
const VALUE_PLAIN: u8 = 0x00;
const VALUE_EXPIRING: u8 = 0x01;

/// Where and how a plugin's keyed state is stored.
#[derive(Debug, Clone)]
pub struct KeyedStateConfig {
    /// The transform's name, for errors and progress.
    pub plugin: String,
    /// How many partitions (fixed for the checkpoint's lifetime).
    pub num_partitions: u32,
    /// `<checkpoint>/state/<operator>`; partition `p` is stored in `p/`.
    pub state_dir: PathBuf,
    pub state: StateOptions,
}

/// One plugin's keyed state, across all its partitions.
#[derive(Debug)]
pub struct KeyedState {
    plugin: String,
    /// The stores, counting plugin keys under [`META_KEYS`].
    state: PartitionedState,
    /// wm(b) of the batch in µs.
    watermark_micros: i64,
    /// Reused key buffers.
    primary: Vec<u8>,
    index: Vec<u8>,
}

/// A stored value: its expiry and where the plugin's bytes start.
fn decode(raw: &[u8]) -> Option<(Option<i64>, &[u8])> {
    match raw.split_first()? {
        (&VALUE_PLAIN, rest) => Some((None, rest)),
        (&VALUE_EXPIRING, rest) => {
            let (at, value) = rest.split_first_chunk::<8>()?;
            Some((Some(i64::from_be_bytes(*at)), value))
        }
        _ => None,
    }
}

impl KeyedState {
    /// Opens one store per partition (empty until [`Self::load`]).
    ///
    /// # Errors
    /// When a store cannot be opened.
    pub fn open(config: &KeyedStateConfig) -> Result<Self, StateError> {
        let state = PartitionedState::open(&PartitionedConfig {
            dir: &config.state_dir,
            partitions: config.num_partitions.max(1),
            options: &config.state,
            count: KeyCount::Stored(CountEntry::BigEndian(META_KEYS)),
        })?;
        Ok(Self {
            plugin: config.plugin.clone(),
            state,
            watermark_micros: 0,
            primary: Vec::new(),
            index: Vec::new(),
        })
    }

    /// The plugin whose state this is.
    pub fn plugin(&self) -> &str {
        &self.plugin
    }

    /// Restores the state committed by batch `version` (`None`: empty) for
    /// a batch whose watermark is `watermark_ms`, dropping anything an
    /// earlier attempt wrote.
    ///
    /// # Errors
    /// When the state cannot be read.
    pub fn load(&mut self, version: Option<u64>, watermark_ms: i64) -> Result<(), StateError> {
        self.state.load(version)?;
        self.watermark_micros = watermark_ms.saturating_mul(1000);
        Ok(())
    }

    /// What this batch's puts and deletes take in memory until the commit
    /// (a plugin's write buffer, held to its memory limit).
    pub fn pending_memory_bytes(&self) -> u64 {
        self.state.pending_memory_bytes()
    }

    /// The batch's watermark in µs.
    pub fn watermark_micros(&self) -> i64 {
        self.watermark_micros
    }

    fn partition(&self, key: &[u8]) -> usize {
        self.state.partition_of(key)
    }

    fn set_primary(&mut self, key: &[u8]) {
        self.primary.clear();
        self.primary.push(PREFIX_PRIMARY);
        self.primary.extend_from_slice(key);
    }

    fn set_index(&mut self, expires_at: i64, key: &[u8]) {
        self.index.clear();
        self.index.push(PREFIX_EXPIRY);
        self.index.extend_from_slice(&flip_i64(expires_at));
        self.index.extend_from_slice(key);
    }

    fn corrupt(&self, p: usize, key: &[u8]) -> StateError {
        StateError::corrupt(
            self.state.store(p).dir(),
            format!(
                "plugin {}: the value of key {} has no valid header",
                self.plugin,
                hex::encode(key)
            ),
        )
    }

    /// The value of `key`, unless it is absent or expired.
    ///
    /// # Errors
    /// When the state cannot be read or holds a malformed value.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        let p = self.partition(key);
        self.set_primary(key);
        let Some(raw) = self.state.store(p).get(&self.primary)? else {
            return Ok(None);
        };
        let (expires_at, value) = decode(&raw).ok_or_else(|| self.corrupt(p, key))?;
        if expires_at.is_some_and(|at| at <= self.watermark_micros) {
            return Ok(None);
        }
        Ok(Some(value.to_vec()))
    }

    /// Sets `key` to `value`, expiring at `expires_at` (µs) if given.
    ///
    /// # Errors
    /// When the state cannot be read or written.
    pub fn put(
        &mut self,
        key: &[u8],
        value: &[u8],
        expires_at: Option<i64>,
    ) -> Result<(), StateError> {
        let p = self.partition(key);
        self.set_primary(key);
        let old = self.state.store(p).get(&self.primary)?;
        match &old {
            Some(raw) => {
                let (old_expiry, _) = decode(raw).ok_or_else(|| self.corrupt(p, key))?;
                if let Some(at) = old_expiry
                    && Some(at) != expires_at
                {
                    self.set_index(at, key);
                    self.state.store_mut(p).delete(&self.index)?;
                }
            }
            None => self.state.add_keys(p, 1),
        }
        let mut stored = Vec::with_capacity(value.len() + 9);
        match expires_at {
            Some(at) => {
                stored.push(VALUE_EXPIRING);
                stored.extend_from_slice(&at.to_be_bytes());
            }
            None => stored.push(VALUE_PLAIN),
        }
        stored.extend_from_slice(value);
        self.set_primary(key);
        self.state.store_mut(p).put(&self.primary, &stored)?;
        if let Some(at) = expires_at {
            self.set_index(at, key);
            self.state.store_mut(p).put(&self.index, &[])?;
        }
        self.state.updated(1);
        Ok(())
    }

    /// Removes `key` (nothing happens when it is absent).
    ///
    /// # Errors
    /// When the state cannot be read or written.
    pub fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
        let p = self.partition(key);
        self.set_primary(key);
        let Some(raw) = self.state.store(p).get(&self.primary)? else {
            return Ok(());
        };
        let (expires_at, _) = decode(&raw).ok_or_else(|| self.corrupt(p, key))?;
        self.state.store_mut(p).delete(&self.primary)?;
        if let Some(at) = expires_at {
            self.set_index(at, key);
            self.state.store_mut(p).delete(&self.index)?;
        }
        self.state.remove_keys(p, 1);
        self.state.removed(1);
        Ok(())
    }

    /// Removes every entry whose expiry is at or before the watermark.
    fn evict(&mut self) -> Result<(), StateError> {
        let start = [PREFIX_EXPIRY];
        let mut end = vec![PREFIX_EXPIRY];
        match self.watermark_micros.checked_add(1) {
            Some(after) => end.extend_from_slice(&flip_i64(after)),
            None => end = vec![PREFIX_EXPIRY + 1],
        }
        let mut expired: Vec<Vec<u8>> = Vec::new();
        for p in 0..self.state.partitions() {
            expired.clear();
            self.state
                .store_mut(p)
                .scan(&start, Some(&end), &mut |key, _| {
                    expired.push(key.to_vec());
                    Ok(true)
                })?;
            for index_key in &expired {
                self.state.store_mut(p).delete(index_key)?;
                self.primary.clear();
                self.primary.push(PREFIX_PRIMARY);
                self.primary
                    .extend_from_slice(index_key.get(9..).unwrap_or_default());
                self.state.store_mut(p).delete(&self.primary)?;
                self.state.remove_keys(p, 1);
                self.state.removed(1);
            }
        }
        Ok(())
    }

    /// Evicts what the watermark passed and commits every partition as
    /// version `batch_id`.
    ///
    /// # Errors
    /// When the state cannot be made durable.
    pub fn commit(&mut self, batch_id: u64) -> Result<OperatorMetrics, StateError> {
        self.evict()?;
        self.state.commit(batch_id, OPERATOR_NAME, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StoreKind;

    fn open(dir: &std::path::Path, kind: StoreKind) -> KeyedState {
        KeyedState::open(&KeyedStateConfig {
            plugin: "t".into(),
            num_partitions: 2,
            state_dir: dir.to_path_buf(),
            state: StateOptions {
                kind,
                snapshot_interval: 2,
                min_versions_to_retain: 3,
                snapshot_min_bytes: 0,
                ..StateOptions::default()
            },
        })
        .unwrap()
    }

    #[test]
    fn versions_follow_batches_and_replays_start_from_the_previous_one() {
        for kind in [StoreKind::Memory, StoreKind::RocksDb, StoreKind::Runs] {
            let dir = tempfile::tempdir().unwrap();
            let mut s = open(dir.path(), kind);
            s.load(None, 0).unwrap();
            s.put(b"a", b"1", None).unwrap();
            s.put(b"b", b"2", None).unwrap();
            let m = s.commit(0).unwrap();
            assert_eq!((m.num_rows_total, m.num_rows_updated), (2, 2), "{kind}");
            assert_eq!(m.num_state_store_instances, 2);

            s.load(Some(0), 0).unwrap();
            s.put(b"a", b"10", None).unwrap();
            s.delete(b"b").unwrap();
            s.delete(b"zz").unwrap();
            assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"10"[..]));
            // A failed attempt: the replay sees version 0 again.
            s.load(Some(0), 0).unwrap();
            assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
            assert_eq!(s.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
            s.delete(b"b").unwrap();
            let m = s.commit(1).unwrap();
            assert_eq!((m.num_rows_total, m.num_rows_removed), (1, 1));

            // Reopened from disk, as after a restart.
            drop(s);
            let mut s = open(dir.path(), kind);
            s.load(Some(1), 0).unwrap();
            assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
            assert_eq!(s.get(b"b").unwrap(), None);
            let m = s.commit(2).unwrap();
            assert_eq!(m.num_rows_total, 1);
        }
    }

    #[test]
    fn entries_expire_at_the_watermark_and_are_removed_at_commit() {
        for kind in [StoreKind::Memory, StoreKind::RocksDb, StoreKind::Runs] {
            let dir = tempfile::tempdir().unwrap();
            let mut s = open(dir.path(), kind);
            s.load(None, 0).unwrap();
            s.put(b"early", b"e", Some(5_000)).unwrap();
            s.put(b"late", b"l", Some(9_000)).unwrap();
            s.put(b"never", b"n", None).unwrap();
            // Re-putting moves the expiry; the old index entry goes.
            s.put(b"late", b"l2", Some(7_000)).unwrap();
            assert_eq!(s.commit(0).unwrap().num_rows_total, 3, "{kind}");

            // Watermark 5 ms = 5000 µs: `early` is at the watermark, so expired.
            s.load(Some(0), 5).unwrap();
            assert_eq!(s.get(b"early").unwrap(), None);
            assert_eq!(s.get(b"late").unwrap().as_deref(), Some(&b"l2"[..]));
            let m = s.commit(1).unwrap();
            assert_eq!((m.num_rows_total, m.num_rows_removed), (2, 1));

            s.load(Some(1), 6).unwrap();
            assert_eq!(s.commit(2).unwrap().num_rows_total, 2);
            s.load(Some(2), 7).unwrap();
            let m = s.commit(3).unwrap();
            assert_eq!((m.num_rows_total, m.num_rows_removed), (1, 1));
            s.load(Some(3), i64::MAX).unwrap();
            assert_eq!(s.get(b"never").unwrap().as_deref(), Some(&b"n"[..]));
            assert_eq!(s.commit(4).unwrap().num_rows_total, 1);
        }
    }

    #[test]
    fn a_put_after_expiry_before_eviction_revives_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(dir.path(), StoreKind::Memory);
        s.load(None, 10).unwrap();
        s.put(b"k", b"old", Some(1_000)).unwrap();
        assert_eq!(s.get(b"k").unwrap(), None, "expired as soon as it is put");
        s.put(b"k", b"new", Some(50_000)).unwrap();
        let m = s.commit(0).unwrap();
        assert_eq!((m.num_rows_total, m.num_rows_removed), (1, 0));
        s.load(Some(0), 10).unwrap();
        assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"new"[..]));
    }
}
