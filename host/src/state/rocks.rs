//! The RocksDB backend: entries in a local RocksDB database, snapshots as
//! RocksDB checkpoints (hard links to immutable table files).
//!
//! Why it exists: states larger than memory (deduplication over tens of
//! millions of keys) must spill to disk while staying fast to look up. The
//! database in `work/` is a cache rebuilt from snapshot plus changelogs by
//! every load, so it runs without a write-ahead log: the changelogs the
//! store writes at commit are the durable record.

use std::path::{Path, PathBuf};

use rocksdb::checkpoint::Checkpoint;
use rocksdb::{BlockBasedOptions, DB, Options, ReadOptions, WriteBatch, WriteOptions};

use super::files::{self, SNAPSHOT_META};
use super::{Backend, ScanFn, StateError};

/// Memtable size: large enough that a batch's writes rarely flush mid-batch,
/// small enough to keep many partitions in a few hundred MB.
const WRITE_BUFFER_BYTES: usize = 16 * 1024 * 1024;

pub(super) struct RocksBackend {
    dir: PathBuf,
    db: Option<DB>,
    write: WriteOptions,
}

impl std::fmt::Debug for RocksBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksBackend")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl RocksBackend {
    /// Opens an empty database in `dir` (which must not exist).
    pub fn open(dir: &Path) -> Result<Self, StateError> {
        let mut write = WriteOptions::default();
        write.disable_wal(true);
        let mut backend = Self {
            dir: dir.to_path_buf(),
            db: None,
            write,
        };
        backend.reset(None)?;
        Ok(backend)
    }

    fn options() -> Options {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_write_buffer_size(WRITE_BUFFER_BYTES);
        opts.set_max_write_buffer_number(2);
        opts.set_max_open_files(256);
        opts.set_max_background_jobs(1);
        let mut table = BlockBasedOptions::default();
        // Most lookups of deduplication are for keys that are absent.
        table.set_bloom_filter(10.0, false);
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

    fn exist(&self, keys: &[&[u8]]) -> Result<Vec<bool>, StateError> {
        keys.iter().map(|k| self.contains(k)).collect()
    }

    fn apply<'a>(
        &mut self,
        changes: &mut dyn Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    ) -> Result<(), StateError> {
        let mut batch = WriteBatch::default();
        for (key, value) in changes {
            match value {
                Some(value) => batch.put(key, value),
                None => batch.delete(key),
            }
        }
        let db = self.db()?;
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
        let db = DB::open(&Self::options(), &self.dir).map_err(|e| self.err(e))?;
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
        [
            "rocksdb.cur-size-all-mem-tables",
            "rocksdb.estimate-table-readers-mem",
            "rocksdb.block-cache-usage",
        ]
        .iter()
        .filter_map(|p| db.property_int_value(*p).ok().flatten())
        .sum()
    }
}
