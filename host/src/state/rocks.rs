//! The RocksDB backend: entries in a local RocksDB database, snapshots as
//! RocksDB checkpoints (hard links to immutable table files).
//!
//! Why it exists: states larger than memory (deduplication over tens of
//! millions of keys) must spill to disk while staying fast to look up. The
//! database in `work/` is a cache rebuilt from snapshot plus changelogs by
//! every load, so it runs without a write-ahead log: the changelogs the
//! store writes at commit are the durable record.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use rocksdb::checkpoint::Checkpoint;
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, DBCompactionStyle,
    DEFAULT_COLUMN_FAMILY_NAME, Options, ReadOptions, WriteBatch, WriteBufferManager, WriteOptions,
};

use super::files::{self, SNAPSHOT_META};
use super::{Backend, Lookups, ScanFn, StateError};

/// Memtable size: large enough that a batch's writes rarely flush mid-batch
/// (a batch of 25,000 new keys takes about 1 MB), small enough to keep the
/// resident set of many partitions small. It is also each store's share of
/// its query's memtable budget ([`RocksMemory`]).
const WRITE_BUFFER_BYTES: usize = 8 * 1024 * 1024;
/// Each store's share of its query's block cache. Lookups are mostly for
/// absent keys, which the bloom filters (held outside the cache) answer;
/// only hits and false positives read data blocks, so a small cache keeps
/// the resident set small (RocksDB's default is 32 MB per database).
const BLOCK_CACHE_BYTES: usize = 2 * 1024 * 1024;
/// Share of the memtable given to its own bloom filter, so that a lookup of
/// an absent key skips the memtable's skip list (most deduplication lookups).
const MEMTABLE_BLOOM_RATIO: f64 = 0.05;
/// Keys per batched lookup (RocksDB itself works through 32 at a time).
const MULTI_GET_CHUNK: usize = 1024;
/// A commit's changes are written in `WriteBatch`es of about this size.
const WRITE_SLICE_BYTES: usize = 256 * 1024;

pub(super) struct RocksBackend {
    dir: PathBuf,
    db: Option<DB>,
    write: WriteOptions,
    memory: RocksMemory,
    /// This store's handles on its query's pool.
    cache: Cache,
    buffers: WriteBufferManager,
    lookups: Lookups,
}

/// The memory the RocksDB stores of one query share: one block cache, and one budget for all
/// their memtables (a `WriteBufferManager`), each as large as the shares of the stores open.
///
/// Why: a store alone may hold a full memtable, a second one being flushed and a cache of its
/// own, and across a query's partitions and operators most of that is idle at any moment: the
/// attribution join's two partitions held 25 MB of memtables and 8 MB of caches
/// (`BENCHMARKS.md` §8.3). Pooled, the query's memtables together stay within one memtable per
/// store (when they pass 7/8 of the budget, the store being written flushes, however small its
/// own memtable), and a busy store's blocks use the cache an idle one leaves; Spark's
/// `boundedMemoryUsage` bounds an executor's RocksDB instances the same way, with one shared
/// cache and write-buffer manager. The pool is per query, not per process, so that one
/// tenant's stores never flush for another's writes.
#[derive(Clone, Default)]
pub struct RocksMemory(Arc<Mutex<Option<Pool>>>);

struct Pool {
    cache: Cache,
    buffers: WriteBufferManager,
    stores: usize,
}

impl RocksMemory {
    /// Adds a store's share to the pool (creating it for the first store) and returns its handles.
    fn join(&self) -> (Cache, WriteBufferManager) {
        let mut pool = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let pool = pool.get_or_insert_with(|| Pool {
            cache: Cache::new_lru_cache(BLOCK_CACHE_BYTES),
            buffers: WriteBufferManager::new_write_buffer_manager(WRITE_BUFFER_BYTES, false),
            stores: 0,
        });
        pool.stores += 1;
        pool.resize();
        (pool.cache.clone(), pool.buffers.clone())
    }

    /// Takes a closed store's share out of the pool.
    fn leave(&self) {
        let mut guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pool) = guard.as_mut() {
            pool.stores = pool.stores.saturating_sub(1);
            if pool.stores == 0 {
                *guard = None;
            } else {
                pool.resize();
            }
        }
    }

    /// The stores open on the pool, and the memtable budget RocksDB holds for them (bytes).
    pub fn shares(&self) -> (usize, usize) {
        let pool = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        pool.as_ref()
            .map_or((0, 0), |p| (p.stores, p.buffers.get_buffer_size()))
    }
}

impl Pool {
    fn resize(&mut self) {
        self.cache.set_capacity(BLOCK_CACHE_BYTES * self.stores);
        self.buffers
            .set_buffer_size(WRITE_BUFFER_BYTES * self.stores);
    }
}

impl std::fmt::Debug for RocksMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksMemory")
            .field("stores", &self.shares().0)
            .finish()
    }
}

/// Two handles are equal when they are the same pool.
impl PartialEq for RocksMemory {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for RocksMemory {}

impl Drop for RocksBackend {
    fn drop(&mut self) {
        // Close first: the database's memtables are charged to the pool until then.
        self.db = None;
        self.memory.leave();
    }
}

impl std::fmt::Debug for RocksBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksBackend")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// RocksDB allocates memtable memory in blocks of an eighth of the memtable
/// (1 MB). glibc's dynamic mmap threshold rises to the size of the first
/// such block freed, after which the blocks come from the heap and stay
/// resident when the memtable is dropped; a fixed threshold keeps them
/// mmapped, so a flushed memtable returns its memory (16 MB less peak RSS
/// over 10M keys stored one per entry). At 1 MB rather than glibc's initial
/// 128 KB: the per-batch buffers below it (Arrow columns, lookup arrays)
/// are then reused from the heap instead of being mapped, zero-filled and
/// unmapped every batch, which cost 45 % of the 10M-order deduplication's
/// CPU time (BENCHMARKS.md §2.2).
const MMAP_THRESHOLD_BYTES: i32 = 1024 * 1024;

fn fix_mmap_threshold() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: `mallopt` only changes an allocator setting; it is called
        // once, with a valid parameter and value.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        }
    });
}

impl RocksBackend {
    /// Opens an empty database in `dir` (which must not exist).
    pub fn open(dir: &Path, memory: &RocksMemory, lookups: Lookups) -> Result<Self, StateError> {
        fix_mmap_threshold();
        let (cache, buffers) = memory.join();
        let mut write = WriteOptions::default();
        write.disable_wal(true);
        // A commit writes the batch's changes in key order: each memtable
        // insert starts its search where the previous one ended.
        write.set_memtable_insert_hint_per_batch(true);
        let mut backend = Self {
            dir: dir.to_path_buf(),
            db: None,
            write,
            memory: memory.clone(),
            cache,
            buffers,
            lookups,
        };
        backend.reset(None)?;
        Ok(backend)
    }

    fn options(&self) -> Options {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_write_buffer_size(WRITE_BUFFER_BYTES);
        opts.set_max_write_buffer_number(2);
        opts.set_write_buffer_manager(&self.buffers);
        opts.set_max_open_files(256);
        opts.set_max_background_jobs(1);
        opts.set_memtable_whole_key_filtering(true);
        opts.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO);
        // Every batch's new keys span the whole key range, so with levelled
        // compaction each L0 to L1 compaction rewrites all of L1 and holds
        // its inputs and outputs in memory at once; universal compaction
        // merges sorted runs of similar size instead (13 MB less peak RSS
        // over 10M keys, the same CPU). A database written with levelled
        // compaction opens unchanged: its levels are read as sorted runs.
        opts.set_compaction_style(DBCompactionStyle::Universal);
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&self.cache);
        // Most lookups of deduplication are for keys that are absent; a join's are for rows
        // that are present ([`Lookups::Present`]).
        if self.lookups == Lookups::MayMiss {
            table.set_bloom_filter(10.0, false);
        }
        table.set_cache_index_and_filter_blocks(false);
        opts.set_block_based_table_factory(&table);
        opts
    }

    fn err(&self, e: rocksdb::Error) -> StateError {
        StateError::RocksDb {
            dir: self.dir.clone(),
            message: e.into_string(),
        }
    }

    fn default_cf<'d>(&self, db: &'d DB) -> Result<&'d rocksdb::ColumnFamily, StateError> {
        db.cf_handle(DEFAULT_COLUMN_FAMILY_NAME)
            .ok_or_else(|| StateError::RocksDb {
                dir: self.dir.clone(),
                message: "the default column family is not open".into(),
            })
    }

    fn db(&self) -> Result<&DB, StateError> {
        self.db.as_ref().ok_or_else(|| StateError::RocksDb {
            dir: self.dir.clone(),
            message: "the database is closed after a failed reset; load the store again".into(),
        })
    }
}

impl Backend for RocksBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        let db = self.db()?;
        db.get_pinned(key)
            .map(|v| v.map(|v| v.to_vec()))
            .map_err(|e| self.err(e))
    }

    fn contains(&self, key: &[u8]) -> Result<bool, StateError> {
        // One lookup: `key_may_exist` would search memtables and filters
        // once more for every key that is present.
        let db = self.db()?;
        db.get_pinned(key)
            .map(|v| v.is_some())
            .map_err(|e| self.err(e))
    }

    fn scan(&self, start: &[u8], end: Option<&[u8]>, f: &mut ScanFn<'_>) -> Result<(), StateError> {
        let db = self.db()?;
        let mut read = ReadOptions::default();
        if let Some(end) = end {
            read.set_iterate_upper_bound(end.to_vec());
        }
        let mut it = db.raw_iterator_opt(read);
        it.seek(start);
        while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else {
                break;
            };
            if !f(k, v)? {
                return Ok(());
            }
            it.next();
        }
        it.status().map_err(|e| self.err(e))
    }

    fn exist(&self, keys: &[&[u8]], sorted: bool, found: &mut Vec<bool>) -> Result<(), StateError> {
        let db = self.db()?;
        let cf = self.default_cf(db)?;
        // Batched lookups: RocksDB probes the filters of a whole chunk with
        // prefetching and searches each table once per chunk. Chunks keep
        // its per-call arrays small enough to be reused from the heap.
        for chunk in keys.chunks(MULTI_GET_CHUNK) {
            for value in db.batched_multi_get_cf(cf, chunk.iter().copied(), sorted) {
                found.push(value.map_err(|e| self.err(e))?.is_some());
            }
        }
        Ok(())
    }

    fn get_many(
        &self,
        keys: &[&[u8]],
        sorted: bool,
        values: &mut Vec<Option<Vec<u8>>>,
    ) -> Result<(), StateError> {
        let db = self.db()?;
        let cf = self.default_cf(db)?;
        for chunk in keys.chunks(MULTI_GET_CHUNK) {
            for value in db.batched_multi_get_cf(cf, chunk.iter().copied(), sorted) {
                values.push(value.map_err(|e| self.err(e))?.map(|v| v.to_vec()));
            }
        }
        Ok(())
    }

    fn apply<'a>(
        &mut self,
        changes: &mut dyn Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    ) -> Result<(), StateError> {
        // In slices: the changelog is the durable copy and a failed commit reloads the store,
        // so one write needs no atomicity, and a whole batch's `WriteBatch` (megabytes, per
        // partition, beside the memtable it is copied into) would only raise the peak.
        let db = self.db()?;
        let mut batch = WriteBatch::default();
        for (key, value) in changes {
            match value {
                Some(value) => batch.put(key, value),
                None => batch.delete(key),
            }
            if batch.size_in_bytes() >= WRITE_SLICE_BYTES {
                let full = std::mem::take(&mut batch);
                db.write_opt(full, &self.write).map_err(|e| self.err(e))?;
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        db.write_opt(batch, &self.write).map_err(|e| self.err(e))
    }

    fn reset(&mut self, snapshot: Option<&Path>) -> Result<(), StateError> {
        // Close before removing the files under it.
        self.db = None;
        files::remove_path(&self.dir)?;
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| StateError::io(&self.dir, "create directory", e))?;
        if let Some(snapshot) = snapshot {
            files::link_or_copy_dir(snapshot, &self.dir, SNAPSHOT_META)?;
        }
        // The default column family opened by name, so that batched lookups
        // can address it; its options are the database's.
        let options = self.options();
        let default = ColumnFamilyDescriptor::new(DEFAULT_COLUMN_FAMILY_NAME, options.clone());
        let db =
            DB::open_cf_descriptors(&options, &self.dir, [default]).map_err(|e| self.err(e))?;
        self.db = Some(db);
        Ok(())
    }

    fn write_snapshot(&mut self, dir: &Path, _version: u64) -> Result<(), StateError> {
        let db = self.db()?;
        // Writes skip the WAL, so only a flush puts them in the checkpoint.
        db.flush().map_err(|e| self.err(e))?;
        Checkpoint::new(db)
            .and_then(|c| c.create_checkpoint(dir))
            .map_err(|e| self.err(e))
    }

    fn memory_used_bytes(&self) -> u64 {
        let Ok(db) = self.db() else { return 0 };
        let own: u64 = [
            "rocksdb.cur-size-all-mem-tables",
            "rocksdb.estimate-table-readers-mem",
        ]
        .iter()
        .filter_map(|p| db.property_int_value(*p).ok().flatten())
        .sum();
        // The cache is the query's: each store counts its share, so that the stores add up.
        let stores = self.memory.shares().0.max(1);
        own + (self.cache.get_usage() / stores) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stores of one query draw on one memtable budget: two stores holding 7 MB of values
    /// each (about 8.4 MB of arena, under the point where a store alone would flush) are over
    /// 7/8 of the two shares together, so one of them switches to a new memtable and flushes;
    /// each store's share comes and goes with it.
    #[test]
    fn the_stores_of_one_query_share_one_memtable_budget() {
        let tmp = tempfile::tempdir().unwrap();
        let memory = RocksMemory::default();
        let mut stores: Vec<RocksBackend> = ["a", "b"]
            .iter()
            .map(|d| RocksBackend::open(&tmp.path().join(d), &memory, Lookups::MayMiss).unwrap())
            .collect();
        assert_eq!(memory.shares(), (2, 2 * WRITE_BUFFER_BYTES));
        let value = vec![7u8; 1024];
        let keys: Vec<[u8; 4]> = (0u32..7 * 1024).map(u32::to_be_bytes).collect();
        for store in &mut stores {
            for chunk in keys.chunks(512) {
                store
                    .apply(&mut chunk.iter().map(|k| (&k[..], Some(&value[..]))))
                    .unwrap();
            }
        }
        // The switch to a new memtable happens in the write that passed the budget; the flush
        // that follows may still be running.
        let switched: u64 = stores.iter().map(switched_memtables).sum();
        assert!(switched > 0, "no store flushed at 14 MB of 16");
        for store in &stores {
            assert_eq!(store.get(&keys[1234]).unwrap().as_deref(), Some(&value[..]));
        }
        stores.pop();
        assert_eq!(memory.shares(), (1, WRITE_BUFFER_BYTES));
        stores.clear();
        assert_eq!(memory.shares(), (0, 0));
    }

    /// Memtables a store has switched away from: flushing or flushed.
    fn switched_memtables(store: &RocksBackend) -> u64 {
        let db = store.db().unwrap();
        [
            "rocksdb.num-immutable-mem-table",
            "rocksdb.num-files-at-level0",
        ]
        .iter()
        .map(|p| db.property_int_value(*p).unwrap().unwrap_or(0))
        .sum()
    }

    /// The flush above comes from the budget, not from the data: with a third store's share in
    /// the pool (24 MB), the same 14 MB stay in the memtables.
    #[test]
    fn a_larger_pool_keeps_the_same_writes_in_memory() {
        let tmp = tempfile::tempdir().unwrap();
        let memory = RocksMemory::default();
        let mut stores: Vec<RocksBackend> = ["a", "b", "c"]
            .iter()
            .map(|d| RocksBackend::open(&tmp.path().join(d), &memory, Lookups::MayMiss).unwrap())
            .collect();
        let value = vec![7u8; 1024];
        let keys: Vec<[u8; 4]> = (0u32..7 * 1024).map(u32::to_be_bytes).collect();
        for store in &mut stores[..2] {
            for chunk in keys.chunks(512) {
                store
                    .apply(&mut chunk.iter().map(|k| (&k[..], Some(&value[..]))))
                    .unwrap();
            }
        }
        for store in &stores {
            assert_eq!(switched_memtables(store), 0);
        }
    }

    /// A commit of several write slices lands whole, and so does a second one of deletes over
    /// more than one slice. Tables of a store of present keys carry no bloom filter; the
    /// default store's do.
    #[test]
    fn large_commits_land_whole_and_stores_of_present_keys_write_no_filters() {
        let tmp = tempfile::tempdir().unwrap();
        let value = [3u8; 100];
        let keys: Vec<[u8; 8]> = (0u64..60_000).map(u64::to_be_bytes).collect();
        for (dir, lookups) in [
            ("filtered", Lookups::MayMiss),
            ("present", Lookups::Present),
        ] {
            let memory = RocksMemory::default();
            let mut store = RocksBackend::open(&tmp.path().join(dir), &memory, lookups).unwrap();
            // About 6.7 MB of puts, then 30,000 deletes of 10 bytes: both more than a slice.
            store
                .apply(&mut keys.iter().map(|k| (&k[..], Some(&value[..]))))
                .unwrap();
            store
                .apply(&mut keys.iter().step_by(2).map(|k| (&k[..], None)))
                .unwrap();
            let mut seen = Vec::new();
            store
                .scan(&[], None, &mut |k, v| {
                    assert_eq!(v, &value[..]);
                    seen.push(u64::from_be_bytes(k.try_into().unwrap()));
                    Ok(true)
                })
                .unwrap();
            let odd: Vec<u64> = (0u64..60_000).filter(|k| k % 2 == 1).collect();
            assert_eq!(seen, odd, "{dir}");
            let db = store.db().unwrap();
            db.flush().unwrap();
            let properties = db
                .property_value("rocksdb.aggregated-table-properties")
                .unwrap()
                .unwrap();
            let filter_bytes: u64 = properties
                .split("; ")
                .find_map(|p| p.strip_prefix("filter block size="))
                .unwrap_or_else(|| panic!("no filter size in {properties}"))
                .trim()
                .parse()
                .unwrap();
            match lookups {
                Lookups::MayMiss => assert!(filter_bytes > 1000, "{dir}: {properties}"),
                Lookups::Present => assert_eq!(filter_bytes, 0, "{dir}: {properties}"),
            }
        }
    }

    /// Snapshots written before the switch to universal compaction hold
    /// files in levels 1 to 6; they must open and read as before.
    #[test]
    fn opens_a_snapshot_written_with_levelled_compaction() {
        let tmp = tempfile::tempdir().unwrap();
        let old = tmp.path().join("old");
        {
            let mut opts = Options::default();
            opts.create_if_missing(true);
            opts.set_compaction_style(DBCompactionStyle::Level);
            let db = DB::open(&opts, &old).unwrap();
            for i in 0u32..1000 {
                db.put(i.to_be_bytes(), i.to_le_bytes()).unwrap();
            }
            db.flush().unwrap();
            db.compact_range::<&[u8], &[u8]>(None, None);
            let levels: Vec<String> = (0..7)
                .map(|l| {
                    db.property_value(format!("rocksdb.num-files-at-level{l}").as_str())
                        .unwrap()
                        .unwrap()
                })
                .collect();
            assert_eq!(levels[0], "0", "files left in L0: {levels:?}");
        }
        let mut backend = RocksBackend::open(
            &tmp.path().join("work"),
            &RocksMemory::default(),
            Lookups::MayMiss,
        )
        .unwrap();
        backend.reset(Some(&old)).unwrap();
        assert_eq!(
            backend.get(&7u32.to_be_bytes()).unwrap(),
            Some(7u32.to_le_bytes().to_vec())
        );
        let new = 1000u32.to_be_bytes();
        let value: &[u8] = b"new";
        backend
            .apply(&mut std::iter::once((new.as_slice(), Some(value))))
            .unwrap();
        let mut found = Vec::new();
        let keys = [
            999u32.to_be_bytes(),
            1000u32.to_be_bytes(),
            1001u32.to_be_bytes(),
        ];
        let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        backend.exist(&keys, true, &mut found).unwrap();
        assert_eq!(found, [true, true, false]);
    }
}
