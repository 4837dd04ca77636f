//! The state stores of one stateful stage, partitioned by key.
//!
//! Aggregation, deduplication and the keyed state of Wasm transforms (and
//! the joins to come) keep their state the same way: `num_partitions`
//! stores, `<state dir>/<partition>/`, a key in partition FNV-1a 64 of its
//! bytes modulo the number of stores; batch N loads version N−1 of every
//! store and its commit writes version N; progress reports the keys held,
//! the memory taken and the commit time. This is that, once; what a key and
//! a value hold stays with each stage.
//!
//! The stores are independent, so work that touches each of them — loading, committing (a
//! changelog written and synced per store), and an operator's per-partition lookups — runs
//! on the query's free threads, a partition at a time ([`PartitionedState::each_store`]):
//! with as many threads as partitions, a batch's state work takes the time of its largest
//! partition, not of their sum.

use std::path::Path;
use std::time::Instant;

use crate::operator::key_encoding::fnv1a;
use crate::operator::stateful::OperatorMetrics;
use crate::state::{StateError, StateOptions, StateStore};
use crate::threads::Threads;

/// How a stage's keys are counted for `numRowsTotal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyCount {
    /// From the stores' entries: `per_key` entries hold one key.
    Entries { per_key: u64 },
    /// Kept by the stage ([`PartitionedState::add_keys`],
    /// [`PartitionedState::remove_keys`]) and stored in each store under its
    /// own entry, read at load and written at commit when it changed.
    Stored(CountEntry),
}

/// The entry under which a store keeps its key count (a `u64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountEntry {
    /// Big-endian; an entry of another length is reported corrupt.
    BigEndian(&'static [u8]),
    /// Little-endian, as aggregation has always written it; an entry of
    /// another length reads as 0.
    LittleEndian(&'static [u8]),
}

/// Where and how a stage's stores are kept.
#[derive(Debug, Clone, Copy)]
pub struct PartitionedConfig<'a> {
    /// `<checkpoint>/state/<stage>`; partition `p` lives in `p/`.
    pub dir: &'a Path,
    /// How many partitions (fixed for the checkpoint's lifetime).
    pub partitions: u32,
    pub options: &'a StateOptions,
    pub count: KeyCount,
}

/// The stores of one stage, with its key counts and per-batch figures.
#[derive(Debug)]
pub struct PartitionedState {
    stores: Vec<StateStore>,
    count: KeyCount,
    /// Keys per store (committed plus this batch's), with [`KeyCount::Stored`].
    keys: Vec<u64>,
    /// … and as the store holds them.
    keys_stored: Vec<u64>,
    /// Since the last load or commit: keys written and removed.
    rows_updated: u64,
    rows_removed: u64,
    /// The query's threads, which the stores are spread over.
    threads: Threads,
}

impl PartitionedState {
    /// Opens (creating) one store per partition, empty until [`Self::load`].
    ///
    /// # Errors
    /// When a store cannot be opened.
    pub fn open(config: &PartitionedConfig<'_>) -> Result<Self, StateError> {
        let stores = (0..config.partitions)
            .map(|p| StateStore::open(&config.dir.join(p.to_string()), config.options))
            .collect::<Result<Vec<_>, _>>()?;
        let n = stores.len();
        Ok(Self {
            stores,
            count: config.count,
            keys: vec![0; n],
            keys_stored: vec![0; n],
            rows_updated: 0,
            rows_removed: 0,
            threads: config.options.threads.clone(),
        })
    }

    /// How many stores (partitions).
    pub fn partitions(&self) -> usize {
        self.stores.len()
    }

    /// The partition of `key`: FNV-1a 64 of its bytes modulo the stores.
    pub fn partition_of(&self, key: &[u8]) -> usize {
        self.partition_of_hash(fnv1a(key))
    }

    /// The partition of a key whose FNV-1a 64 hash is `hash`.
    pub fn partition_of_hash(&self, hash: u64) -> usize {
        // Below the number of stores, which is a `u32`.
        (hash % self.stores.len().max(1) as u64) as usize
    }

    /// The store of partition `p`.
    pub fn store(&self, p: usize) -> &StateStore {
        &self.stores[p]
    }

    /// The store of partition `p`, to write.
    pub fn store_mut(&mut self, p: usize) -> &mut StateStore {
        &mut self.stores[p]
    }

    /// Every store, in partition order.
    pub fn stores(&self) -> &[StateStore] {
        &self.stores
    }

    /// Runs `f` on every store, with the partition's number, on this thread and the query's
    /// free threads ([`Threads::try_map`]). Returns the results in partition order, or the
    /// error of the first partition that failed (no partition after it starts).
    ///
    /// # Errors
    /// The first error `f` returned, by partition order.
    pub fn each_store<T, E, F>(&mut self, f: F) -> Result<Vec<T>, E>
    where
        T: Send,
        E: Send,
        F: Fn(usize, &mut StateStore) -> Result<T, E> + Sync,
    {
        let stores: Vec<&mut StateStore> = self.stores.iter_mut().collect();
        self.threads.try_map(stores, f)
    }

    /// Restores every store to the version committed by batch `version`
    /// (`None`: empty), dropping anything an earlier attempt wrote, and
    /// reads the key counts.
    ///
    /// # Errors
    /// When a store cannot be read.
    pub fn load(&mut self, version: Option<u64>) -> Result<(), StateError> {
        let count = self.count;
        let keys = self.each_store(|_, store| {
            store.load(version)?;
            Ok::<_, StateError>(match count {
                KeyCount::Entries { .. } => 0,
                KeyCount::Stored(CountEntry::BigEndian(key)) => store.get_count(key)?,
                KeyCount::Stored(CountEntry::LittleEndian(key)) => store.get(key)?.map_or(0, |v| {
                    <[u8; 8]>::try_from(v.as_slice()).map_or(0, u64::from_le_bytes)
                }),
            })
        })?;
        self.keys_stored.clone_from(&keys);
        self.keys = keys;
        self.rows_updated = 0;
        self.rows_removed = 0;
        Ok(())
    }

    /// The stored key count of partition `p` grew by `n`.
    pub fn add_keys(&mut self, p: usize, n: u64) {
        self.keys[p] += n;
    }

    /// The stored key count of partition `p` shrank by `n`.
    pub fn remove_keys(&mut self, p: usize, n: u64) {
        self.keys[p] = self.keys[p].saturating_sub(n);
    }

    /// `n` keys were written (new or changed) in this batch.
    pub fn updated(&mut self, n: u64) {
        self.rows_updated += n;
    }

    /// `n` keys were removed in this batch.
    pub fn removed(&mut self, n: u64) {
        self.rows_removed += n;
    }

    /// What this batch's writes take in memory until the commit.
    pub fn pending_memory_bytes(&self) -> u64 {
        self.stores
            .iter()
            .map(StateStore::pending_memory_bytes)
            .sum()
    }

    /// Writes the key counts that changed, commits every store as version
    /// `version`, and reports the batch as `operator` with
    /// `rows_dropped_by_watermark`; the batch's figures start again.
    ///
    /// # Errors
    /// When the state cannot be made durable.
    pub fn commit(
        &mut self,
        version: u64,
        operator: &str,
        rows_dropped_by_watermark: u64,
    ) -> Result<OperatorMetrics, StateError> {
        let started = Instant::now();
        let (count, keys, keys_stored) = (self.count, self.keys.clone(), self.keys_stored.clone());
        self.each_store(|p, store| {
            if keys[p] != keys_stored[p] {
                match count {
                    KeyCount::Entries { .. } => {}
                    KeyCount::Stored(CountEntry::BigEndian(key)) => {
                        store.put(key, &keys[p].to_be_bytes())?;
                    }
                    KeyCount::Stored(CountEntry::LittleEndian(key)) => {
                        store.put(key, &keys[p].to_le_bytes())?;
                    }
                }
            }
            store.commit(version)
        })?;
        self.keys_stored = keys;
        let commit_time_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (mut entries, mut memory_used_bytes) = (0u64, 0u64);
        for store in &self.stores {
            let m = store.metrics();
            entries += m.num_rows_total;
            memory_used_bytes += m.memory_used_bytes;
        }
        let num_rows_total = match self.count {
            KeyCount::Entries { per_key } => entries / per_key.max(1),
            KeyCount::Stored(_) => self.keys.iter().sum(),
        };
        let metrics = OperatorMetrics {
            operator_name: operator.to_owned(),
            num_rows_total,
            num_rows_updated: self.rows_updated,
            num_rows_removed: self.rows_removed,
            memory_used_bytes,
            num_rows_dropped_by_watermark: rows_dropped_by_watermark,
            commit_time_ms,
            num_state_store_instances: self.stores.len() as u64,
        };
        self.rows_updated = 0;
        self.rows_removed = 0;
        Ok(metrics)
    }
}
