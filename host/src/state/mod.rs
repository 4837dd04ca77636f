//! Versioned, partition-scoped key-value state for stateful operators.
//!
//! Why it exists: a stateful query is only exactly-once if batch N always
//! starts from exactly the state batch N−1 committed, however often N is
//! re-run after a crash. So state is versioned by batch id: `load(N−1)`,
//! read and write, `commit(N)`. Uncommitted writes live in an in-memory
//! overlay until `commit`, so abandoning a failed batch costs nothing and a
//! retry sees the committed state again.
//!
//! Durability follows Spark's RocksDB changelog checkpointing: every commit
//! writes one changelog file (the batch's net puts and deletes), and a full
//! snapshot follows at least `snapshot_interval` versions after the last one
//! (Spark's `minDeltasForSnapshot`, also a minimum), once the changelogs since
//! then hold `snapshot_min_bytes` or the versions since then reach ten times the
//! interval. A load replays those changelogs on top of the newest snapshot, so
//! recovery time does not grow with the number of batches run. The byte
//! threshold is what keeps snapshots cheap: a RocksDB snapshot must first flush
//! the memtable, and a flush every ten small batches fills the database with
//! small tables that compaction then rewrites over and over (17 % of the CPU of a
//! 10M-key deduplication, BENCHMARKS.md §12). Versions older than the retention
//! count are removed. The entries themselves live in a [`Backend`]: sorted run
//! files ([`StoreKind::Runs`], the default), an ordered map
//! ([`StoreKind::Memory`]) or RocksDB ([`StoreKind::RocksDb`]).
//!
//! One store serves one partition of one operator (`<checkpoint>/state/<op>/<partition>`),
//! so that partitions can later move between processes.

mod files;
mod memory;
mod record;
mod rocks;
mod runs;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::time::Instant;

use files::{FileIndex, SNAPSHOT_META, TMP_PREFIX};
use record::{FileKind, Header, RecordFile, RecordWriter};
pub use rocks::RocksMemory;

/// What [`StateStore::scan`] calls with each entry; returning false stops the scan.
pub type ScanFn<'a> = dyn FnMut(&[u8], &[u8]) -> Result<bool, StateError> + 'a;

/// Which backend holds a store's entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreKind {
    /// An ordered in-memory map: for small states and tests.
    Memory,
    /// RocksDB on local disk: for states larger than memory.
    RocksDb,
    /// Sorted run files on local disk, merged in generations: for states larger than memory
    /// written in sorted batches, as every commit is (`state/runs.rs`). The default.
    #[default]
    Runs,
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Memory => "memory",
            Self::RocksDb => "rocksdb",
            Self::Runs => "runs",
        })
    }
}

/// What an operator's state lookups mostly ask for. It decides whether a RocksDB store's tables
/// carry bloom filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lookups {
    /// Keys that may well be absent (deduplication's new keys, aggregation's new groups): a
    /// table's filter answers most of them without reading a block.
    #[default]
    MayMiss,
    /// Keys that are present (a join fetches only the buffered rows whose keys matched): a
    /// filter never spares a lookup that finds nothing, only the search of sorted runs that do
    /// not hold the key. On the attribution join, tables without filters took about 5 MB less
    /// peak memory (their builders in compactions, their blocks in the cache) at no measurable
    /// CPU cost (`BENCHMARKS.md` §14.2).
    Present,
}

/// Half of RocksDB's memtable: a snapshot's flush then writes a table of a useful size.
const SNAPSHOT_MIN_BYTES: u64 = 4 * 1024 * 1024;
/// However small the changelogs, a snapshot is due after this many intervals.
const SNAPSHOT_MAX_INTERVALS: u64 = 10;

/// How a store keeps its versions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateOptions {
    pub kind: StoreKind,
    /// At least this many versions between snapshots (Spark's
    /// `minDeltasForSnapshot`, 10 by default).
    pub snapshot_interval: u64,
    /// How many recent versions stay loadable (Spark's `minBatchesToRetain`).
    pub min_versions_to_retain: u64,
    /// Changelog bytes since the last snapshot below which a snapshot waits
    /// (up to ten times `snapshot_interval` versions); 0 snapshots every interval.
    pub snapshot_min_bytes: u64,
    /// The pool of cache and memtable memory the query's RocksDB stores share: clones of one
    /// `StateOptions` share it, so a query makes its options once for all its stores.
    pub rocks: RocksMemory,
    /// The query's threads, which an operator may spread its partitions' stores over.
    pub threads: crate::threads::Threads,
    /// What the operator's lookups ask for (set by the operator, not the query).
    pub lookups: Lookups,
}

impl Default for StateOptions {
    fn default() -> Self {
        Self {
            kind: StoreKind::default(),
            snapshot_interval: 10,
            min_versions_to_retain: 10,
            snapshot_min_bytes: SNAPSHOT_MIN_BYTES,
            rocks: RocksMemory::default(),
            threads: crate::threads::Threads::default(),
            lookups: Lookups::default(),
        }
    }
}

/// A state store failed; every variant names the file or directory.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state store: cannot {action} {}: {source}", file.display())]
    Io {
        file: PathBuf,
        action: &'static str,
        source: std::io::Error,
    },
    #[error("state file {} is corrupt: {reason}", file.display())]
    Corrupt { file: PathBuf, reason: String },
    #[error(
        "state store {}: version {version} cannot be loaded: {reason}; the checkpoint's state is \
         incomplete, restore it or start a new checkpoint",
        dir.display()
    )]
    MissingVersion {
        dir: PathBuf,
        version: u64,
        reason: String,
    },
    #[error(
        "state store {}: snapshot {version} was written by the {found} store but this query \
         uses {expected}; start a new checkpoint to change state_store",
        dir.display()
    )]
    WrongKind {
        dir: PathBuf,
        version: u64,
        found: StoreKind,
        expected: StoreKind,
    },
    #[error("state store {}: RocksDB: {message}", dir.display())]
    RocksDb { dir: PathBuf, message: String },
}

impl StateError {
    pub(crate) fn io(file: &Path, action: &'static str, source: std::io::Error) -> Self {
        Self::Io {
            file: file.to_path_buf(),
            action,
            source,
        }
    }

    pub(crate) fn corrupt(file: &Path, reason: impl Into<String>) -> Self {
        Self::Corrupt {
            file: file.to_path_buf(),
            reason: reason.into(),
        }
    }
}

/// Where committed entries live. Implementations only hold entries: the
/// versioning (changelogs, snapshots, retention) is [`StateStore`]'s.
trait Backend: Send + std::fmt::Debug {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError>;
    fn contains(&self, key: &[u8]) -> Result<bool, StateError>;
    /// Entries with `start <= key < end` in key order until `f` returns false.
    fn scan(&self, start: &[u8], end: Option<&[u8]>, f: &mut ScanFn<'_>) -> Result<(), StateError>;
    /// Appends to `found` whether each of `keys` is present; `sorted` when
    /// the keys ascend bytewise (lets RocksDB skip sorting them).
    fn exist(&self, keys: &[&[u8]], sorted: bool, found: &mut Vec<bool>) -> Result<(), StateError>;
    /// Appends the value of each of `keys` to `values`, as [`Self::exist`].
    fn get_many(
        &self,
        keys: &[&[u8]],
        sorted: bool,
        values: &mut Vec<Option<Vec<u8>>>,
    ) -> Result<(), StateError>;
    /// Applies puts (`Some`) and deletes (`None`) in order. On an error part of them may have
    /// been applied: the store is not ready until loaded again.
    fn apply<'a>(
        &mut self,
        changes: &mut dyn Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    ) -> Result<(), StateError>;
    /// Replaces every entry with the snapshot in `snapshot` (`None`: empty).
    fn reset(&mut self, snapshot: Option<&Path>) -> Result<(), StateError>;
    /// Writes every entry into the new directory `dir`.
    fn write_snapshot(&mut self, dir: &Path, version: u64) -> Result<(), StateError>;
    fn memory_used_bytes(&self) -> u64;
}

/// A store's figures for progress (`stateOperators[]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreMetrics {
    /// Entries in the state (committed plus this batch's changes).
    pub num_rows_total: u64,
    /// Bytes of memory the entries and pending changes take.
    pub memory_used_bytes: u64,
    /// Time the last commit took.
    pub commit_time_ms: u64,
    /// Bytes of the last changelog written.
    pub last_changelog_bytes: u64,
}

/// One partition of one operator's state, versioned by batch id.
#[derive(Debug)]
pub struct StateStore {
    dir: PathBuf,
    options: StateOptions,
    backend: Box<dyn Backend>,
    /// The committed version the backend holds; `None` before any load or
    /// for the empty state.
    loaded: Option<u64>,
    /// Whether the backend reflects `loaded` (false until the first load).
    ready: bool,
    /// This batch's writes: `Some` put, `None` delete.
    pending: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    pending_bytes: u64,
    /// Rows of the committed state, and of the state with `pending` applied.
    committed_rows: u64,
    rows: u64,
    /// The key most recently probed with `get`/`contains` and whether the
    /// committed state holds it: the usual read-then-write needs one lookup.
    probe: RefCell<Vec<u8>>,
    probe_hit: Cell<Option<bool>>,
    files: FileIndex,
    last_commit_ms: u64,
    last_changelog_bytes: u64,
    /// Bytes of the changelogs after the newest snapshot of the loaded version.
    changelog_bytes_since_snapshot: u64,
}

impl StateStore {
    /// Opens (creating) the store in `dir`, removing leftovers of interrupted
    /// writes. The store is empty until [`Self::load`].
    ///
    /// # Errors
    /// When the directory cannot be created or listed, or RocksDB cannot open.
    pub fn open(dir: &Path, options: &StateOptions) -> Result<Self, StateError> {
        std::fs::create_dir_all(dir).map_err(|e| StateError::io(dir, "create directory", e))?;
        let files = files::scan_dir(dir)?;
        let backend: Box<dyn Backend> = match options.kind {
            StoreKind::Memory => Box::new(memory::MemoryBackend::new()),
            StoreKind::RocksDb => Box::new(rocks::RocksBackend::open(
                &dir.join(files::WORK_DIR),
                &options.rocks,
                options.lookups,
            )?),
            StoreKind::Runs => Box::new(runs::RunsBackend::open(&dir.join(files::WORK_DIR))?),
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            options: StateOptions {
                snapshot_interval: options.snapshot_interval.max(1),
                ..options.clone()
            },
            backend,
            loaded: None,
            ready: false,
            pending: BTreeMap::new(),
            pending_bytes: 0,
            committed_rows: 0,
            rows: 0,
            probe: RefCell::new(Vec::new()),
            probe_hit: Cell::new(None),
            files,
            last_commit_ms: 0,
            last_changelog_bytes: 0,
            changelog_bytes_since_snapshot: 0,
        })
    }

    /// The directory of this store.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The committed version the store holds (`None`: empty state).
    pub fn version(&self) -> Option<u64> {
        self.loaded
    }

    /// Makes the store hold the state committed as `version` (`None`: the
    /// empty state), dropping uncommitted writes. Versions after `version`
    /// belong to a batch that never completed and are removed.
    ///
    /// # Errors
    /// When a file of the version's chain is missing or corrupt.
    pub fn load(&mut self, version: Option<u64>) -> Result<(), StateError> {
        self.clear_pending();
        if !(self.ready && self.loaded == version) {
            self.ready = false;
            self.rebuild(version)?;
            self.loaded = version;
            self.ready = true;
        }
        self.remove_after(version)?;
        Ok(())
    }

    fn clear_pending(&mut self) {
        self.pending.clear();
        self.pending_bytes = 0;
        self.rows = self.committed_rows;
        self.probe_hit.set(None);
    }

    /// Rebuilds the backend from the newest snapshot at or below `version`
    /// plus the changelogs after it.
    fn rebuild(&mut self, version: Option<u64>) -> Result<(), StateError> {
        let Some(target) = version else {
            self.changelog_bytes_since_snapshot = 0;
            self.backend.reset(None)?;
            self.committed_rows = 0;
            self.rows = 0;
            return Ok(());
        };
        // Walk back along the changelogs' parents to a snapshot or the start.
        let mut chain = Vec::new();
        let mut at = Some(target);
        let mut base = None;
        while let Some(v) = at {
            if self.files.snapshots.contains(&v) {
                base = Some(v);
                break;
            }
            if !self.files.changelogs.contains(&v) {
                return Err(StateError::MissingVersion {
                    dir: self.dir.clone(),
                    version: target,
                    reason: format!(
                        "neither a snapshot nor a changelog of version {v} exists (retained: {})",
                        self.describe_files()
                    ),
                });
            }
            let header = record::read_header(&self.dir.join(files::changelog_name(v)))?;
            chain.push(v);
            if header.parent.is_some_and(|p| p >= v) {
                return Err(StateError::corrupt(
                    &self.dir.join(files::changelog_name(v)),
                    format!("its parent version {:?} is not older", header.parent),
                ));
            }
            at = header.parent;
        }
        let mut rows = 0;
        match base {
            Some(v) => {
                let snap = self.dir.join(files::snapshot_name(v));
                let meta = RecordFile::read(&snap.join(SNAPSHOT_META), FileKind::SnapshotMeta)?;
                if let Some(found) = meta.header.store
                    && found != self.options.kind
                {
                    return Err(StateError::WrongKind {
                        dir: self.dir.clone(),
                        version: v,
                        found,
                        expected: self.options.kind,
                    });
                }
                self.backend.reset(Some(&snap))?;
                rows = meta.rows_total;
            }
            None => self.backend.reset(None)?,
        }
        self.changelog_bytes_since_snapshot = 0;
        for v in chain.into_iter().rev() {
            let file = RecordFile::read(
                &self.dir.join(files::changelog_name(v)),
                FileKind::Changelog,
            )?;
            self.changelog_bytes_since_snapshot += file.len();
            self.backend.apply(&mut file.records())?;
            rows = file.rows_total;
        }
        self.committed_rows = rows;
        self.rows = rows;
        Ok(())
    }

    fn describe_files(&self) -> String {
        format!(
            "snapshots {:?}, changelogs {:?}",
            self.files.snapshots, self.files.changelogs
        )
    }

    /// Removes changelogs and snapshots newer than `version`.
    fn remove_after(&mut self, version: Option<u64>) -> Result<(), StateError> {
        let from = version.map_or(0, |v| v + 1);
        let stale_logs: Vec<u64> = self.files.changelogs.range(from..).copied().collect();
        let stale_snaps: Vec<u64> = self.files.snapshots.range(from..).copied().collect();
        if stale_logs.is_empty() && stale_snaps.is_empty() {
            return Ok(());
        }
        for v in stale_logs {
            files::remove_path(&self.dir.join(files::changelog_name(v)))?;
            self.files.changelogs.remove(&v);
        }
        for v in stale_snaps {
            files::remove_path(&self.dir.join(files::snapshot_name(v)))?;
            self.files.snapshots.remove(&v);
        }
        files::sync_dir(&self.dir)
    }

    fn ensure_ready(&self) {
        debug_assert!(self.ready, "StateStore used before load()");
    }

    /// The value of `key`, including this batch's writes.
    ///
    /// # Errors
    /// When the backend cannot be read.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.ensure_ready();
        if let Some(pending) = self.pending.get(key) {
            return Ok(pending.clone());
        }
        let value = self.backend.get(key)?;
        self.remember_probe(key, value.is_some());
        Ok(value)
    }

    /// Whether `key` is in the state, including this batch's writes.
    ///
    /// # Errors
    /// When the backend cannot be read.
    pub fn contains(&self, key: &[u8]) -> Result<bool, StateError> {
        self.ensure_ready();
        if let Some(pending) = self.pending.get(key) {
            return Ok(pending.is_some());
        }
        let hit = self.backend.contains(key)?;
        self.remember_probe(key, hit);
        Ok(hit)
    }

    /// Replaces `found` with whether each of `keys` is in the state,
    /// including this batch's writes: one batched lookup instead of one per
    /// key. `sorted` when the keys ascend bytewise (RocksDB then skips
    /// sorting them). Keys found absent can be stored with [`Self::put_new`].
    ///
    /// # Errors
    /// When the backend cannot be read.
    pub fn contains_many(
        &self,
        keys: &[&[u8]],
        sorted: bool,
        found: &mut Vec<bool>,
    ) -> Result<(), StateError> {
        self.lookup_many(keys, found, Option::is_some, |unknown, out| {
            self.backend.exist(unknown, sorted, out)
        })
    }

    /// Replaces `values` with the value of each of `keys`, including this
    /// batch's writes, in one batched lookup as [`Self::contains_many`].
    ///
    /// # Errors
    /// When the backend cannot be read.
    pub fn get_many(
        &self,
        keys: &[&[u8]],
        sorted: bool,
        values: &mut Vec<Option<Vec<u8>>>,
    ) -> Result<(), StateError> {
        self.lookup_many(keys, values, Clone::clone, |unknown, out| {
            self.backend.get_many(unknown, sorted, out)
        })
    }

    /// A batched lookup: this batch's writes answer for their keys
    /// (`pending` turns one into the answer), `backend` for the rest.
    fn lookup_many<T: Default>(
        &self,
        keys: &[&[u8]],
        out: &mut Vec<T>,
        pending: impl Fn(&Option<Vec<u8>>) -> T,
        backend: impl Fn(&[&[u8]], &mut Vec<T>) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        self.ensure_ready();
        out.clear();
        self.probe_hit.set(None);
        if self.pending.is_empty() {
            return backend(keys, out);
        }
        let mut unknown = Vec::with_capacity(keys.len());
        let mut at = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            match self.pending.get(*key) {
                Some(write) => out.push(pending(write)),
                None => {
                    out.push(T::default());
                    unknown.push(*key);
                    at.push(i);
                }
            }
        }
        if unknown.is_empty() {
            return Ok(());
        }
        let mut committed = Vec::with_capacity(unknown.len());
        backend(&unknown, &mut committed)?;
        for (i, answer) in at.into_iter().zip(committed) {
            out[i] = answer;
        }
        Ok(())
    }

    /// The 8-byte big-endian counter stored under `key` (0 when absent):
    /// operators keep their key counts this way.
    ///
    /// # Errors
    /// When the backend cannot be read, or the entry is not 8 bytes.
    pub fn get_count(&self, key: &[u8]) -> Result<u64, StateError> {
        match self.get(key)? {
            None => Ok(0),
            Some(raw) => raw
                .as_slice()
                .try_into()
                .map(u64::from_be_bytes)
                .map_err(|_| {
                    StateError::corrupt(
                        &self.dir,
                        format!("its key count entry holds {} bytes, not 8", raw.len()),
                    )
                }),
        }
    }

    fn remember_probe(&self, key: &[u8], hit: bool) {
        let mut probe = self.probe.borrow_mut();
        probe.clear();
        probe.extend_from_slice(key);
        self.probe_hit.set(Some(hit));
    }

    /// Whether the committed state holds `key` (answered from the last probe
    /// when it was this key).
    fn committed_has(&self, key: &[u8]) -> Result<bool, StateError> {
        match self.probe_hit.get() {
            Some(hit) if self.probe.borrow().as_slice() == key => Ok(hit),
            _ => self.backend.contains(key),
        }
    }

    /// Sets `key` to `value` in this batch.
    ///
    /// # Errors
    /// When the backend cannot be read.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.ensure_ready();
        match self.pending.get_mut(key) {
            Some(slot) => {
                if slot.is_none() {
                    self.rows += 1;
                }
                let old = slot.as_ref().map_or(0, Vec::len) as u64;
                self.pending_bytes = self.pending_bytes - old + value.len() as u64;
                *slot = Some(value.to_vec());
            }
            None => {
                if !self.committed_has(key)? {
                    self.rows += 1;
                }
                self.pending_bytes += (key.len() + value.len()) as u64;
                self.pending.insert(key.to_vec(), Some(value.to_vec()));
            }
        }
        Ok(())
    }

    /// Sets `key`, which [`Self::contains_many`] (or [`Self::contains`])
    /// found absent in this batch, to `value`: no second lookup.
    ///
    /// # Errors
    /// When the backend cannot be read.
    pub fn put_new(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.ensure_ready();
        if self.pending.contains_key(key) {
            return self.put(key, value);
        }
        debug_assert!(
            !self.backend.contains(key)?,
            "put_new of a key the committed state holds"
        );
        self.rows += 1;
        self.pending_bytes += (key.len() + value.len()) as u64;
        self.pending.insert(key.to_vec(), Some(value.to_vec()));
        Ok(())
    }

    /// Sets keys that [`Self::contains_many`] found absent in this batch, given in
    /// ascending order and each once, to their values: no lookups, and the batch's
    /// writes take them in one pass (a sort that finds them in order, then one build),
    /// not one tree search per key. Keys out of order are still sorted correctly, only
    /// slower.
    ///
    /// When the batch already holds writes, the two are merged in one pass (or, when the
    /// batch's writes far outnumber the new keys, each new key inserted); a key this batch
    /// deleted before is then counted twice in [`Self::pending_memory_bytes`] until the
    /// commit.
    ///
    /// # Errors
    /// When the backend cannot be read (only checked in debug builds).
    pub fn put_new_sorted<'k>(
        &mut self,
        entries: impl Iterator<Item = (&'k [u8], &'k [u8])>,
    ) -> Result<(), StateError> {
        self.ensure_ready();
        let (mut added, mut bytes) = (0u64, 0u64);
        let mut built: BTreeMap<Vec<u8>, Option<Vec<u8>>> = entries
            .map(|(key, value)| {
                added += 1;
                bytes += (key.len() + value.len()) as u64;
                (key.to_vec(), Some(value.to_vec()))
            })
            .collect();
        debug_assert_eq!(
            built.len() as u64,
            added,
            "put_new_sorted of a repeated key"
        );
        #[cfg(debug_assertions)]
        for key in built.keys() {
            let absent = match self.pending.get(key) {
                Some(write) => write.is_none(),
                None => !self.backend.contains(key)?,
            };
            debug_assert!(absent, "put_new_sorted of a key the state holds");
        }
        self.rows += added;
        self.pending_bytes += bytes;
        // Into an empty batch the built map is moved whole. Else a merge rebuilds both in one
        // pass, which is worth it unless the batch's writes far outnumber the new keys: then
        // one tree search per new key is less work.
        let depth = (usize::BITS - self.pending.len().leading_zeros()) as usize;
        if built.len().saturating_mul(depth) < self.pending.len() {
            for (key, value) in built {
                self.pending.insert(key, value);
            }
        } else {
            self.pending.append(&mut built);
        }
        Ok(())
    }

    /// Removes `key` in this batch.
    ///
    /// # Errors
    /// When the backend cannot be read.
    pub fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
        self.ensure_ready();
        let has = match self.pending.get(key) {
            Some(v) => v.is_some(),
            None => self.committed_has(key)?,
        };
        if !has {
            // Nothing to delete; a pending delete stays as it is.
            return Ok(());
        }
        self.record_delete(key);
        Ok(())
    }

    /// Books the delete of `key`, which the state holds, in this batch's writes.
    fn record_delete(&mut self, key: &[u8]) {
        self.rows = self.rows.saturating_sub(1);
        match self.pending.entry(key.to_vec()) {
            Entry::Occupied(mut e) => {
                let old = e.get().as_ref().map_or(0, Vec::len) as u64;
                self.pending_bytes -= old;
                e.insert(None);
            }
            Entry::Vacant(e) => {
                self.pending_bytes += key.len() as u64;
                e.insert(None);
            }
        }
    }

    /// Removes `key`, which the caller knows the state holds (committed or written in this
    /// batch): no lookup.
    ///
    /// # Errors
    /// When the backend cannot be read.
    pub fn delete_present(&mut self, key: &[u8]) -> Result<(), StateError> {
        self.ensure_ready();
        debug_assert!(
            match self.pending.get(key) {
                Some(v) => v.is_some(),
                None => self.backend.contains(key)?,
            },
            "delete_present of a key the state does not hold"
        );
        self.record_delete(key);
        Ok(())
    }

    /// Calls `f` with every entry with `start <= key < end` (including this
    /// batch's writes) in key order, until it returns false.
    ///
    /// # Errors
    /// When the backend cannot be read, or `f` fails.
    pub fn scan(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        f: &mut ScanFn<'_>,
    ) -> Result<(), StateError> {
        self.ensure_ready();
        let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
        let mut overlay = self
            .pending
            .range::<[u8], _>((Bound::Included(start), upper))
            .peekable();
        let mut go_on = true;
        self.backend.scan(start, end, &mut |key, value| {
            // Pending entries that sort before this key come first.
            while let Some((pk, pv)) = overlay.peek() {
                if pk.as_slice() >= key {
                    break;
                }
                if let Some(pv) = pv
                    && !f(pk, pv)?
                {
                    go_on = false;
                    return Ok(false);
                }
                overlay.next();
            }
            if let Some((pk, pv)) = overlay.peek()
                && pk.as_slice() == key
            {
                // Overwritten or deleted in this batch.
                let keep = match pv {
                    Some(pv) => f(pk, pv)?,
                    None => true,
                };
                overlay.next();
                go_on = keep;
                return Ok(keep);
            }
            go_on = f(key, value)?;
            Ok(go_on)
        })?;
        if go_on {
            for (pk, pv) in overlay {
                if let Some(pv) = pv
                    && !f(pk, pv)?
                {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Makes this batch's writes durable as `version`: a changelog always, a
    /// snapshot when one is due (see the module doc), then removes versions
    /// beyond the retention count.
    ///
    /// # Errors
    /// When a file cannot be written; the store must then be loaded again.
    pub fn commit(&mut self, version: u64) -> Result<(), StateError> {
        self.ensure_ready();
        let started = Instant::now();
        if self.loaded.is_some_and(|v| v >= version) {
            return Err(StateError::MissingVersion {
                dir: self.dir.clone(),
                version,
                reason: format!(
                    "cannot commit it on top of version {:?}; load an older version first",
                    self.loaded
                ),
            });
        }
        self.ready = false;
        let header = Header {
            kind: FileKind::Changelog,
            store: None,
            version,
            parent: self.loaded,
        };
        let name = files::changelog_name(version);
        let tmp = self.dir.join(format!("{TMP_PREFIX}{name}"));
        let path = self.dir.join(&name);
        let io = |e| StateError::io(&tmp, "write", e);
        let mut writer = RecordWriter::new(files::create_new(&tmp)?, &header).map_err(io)?;
        for (k, v) in &self.pending {
            writer.record(k, v.as_deref()).map_err(io)?;
        }
        self.last_changelog_bytes = writer.finish(self.rows).map_err(io)?;
        files::publish(&tmp, &path)?;
        self.files.changelogs.insert(version);
        let pending = std::mem::take(&mut self.pending);
        self.backend
            .apply(&mut pending.iter().map(|(k, v)| (k.as_slice(), v.as_deref())))?;
        self.pending_bytes = 0;
        self.probe_hit.set(None);
        self.committed_rows = self.rows;
        self.loaded = Some(version);
        self.ready = true;
        self.changelog_bytes_since_snapshot += self.last_changelog_bytes;
        let last_snapshot = self.files.snapshots.range(..version).next_back().copied();
        let since = last_snapshot.map_or(version + 1, |s| version - s);
        let interval = self.options.snapshot_interval;
        let due = since >= interval
            && (self.changelog_bytes_since_snapshot >= self.options.snapshot_min_bytes
                || since >= interval.saturating_mul(SNAPSHOT_MAX_INTERVALS));
        if due {
            self.snapshot(version)?;
            self.changelog_bytes_since_snapshot = 0;
        }
        self.retain(version)?;
        self.last_commit_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(())
    }

    fn snapshot(&mut self, version: u64) -> Result<(), StateError> {
        let name = files::snapshot_name(version);
        let tmp = self.dir.join(format!("{TMP_PREFIX}{name}"));
        files::remove_path(&tmp)?;
        self.backend.write_snapshot(&tmp, version)?;
        let meta_path = tmp.join(SNAPSHOT_META);
        let header = Header {
            kind: FileKind::SnapshotMeta,
            store: Some(self.options.kind),
            version,
            parent: None,
        };
        let io = |e| StateError::io(&meta_path, "write", e);
        RecordWriter::new(files::create_new(&meta_path)?, &header)
            .map_err(io)?
            .finish(self.committed_rows)
            .map_err(io)?;
        files::sync_dir(&tmp)?;
        let path = self.dir.join(&name);
        files::remove_path(&path)?;
        files::publish(&tmp, &path)?;
        self.files.snapshots.insert(version);
        Ok(())
    }

    /// Removes what is no longer needed to load any of the last
    /// `min_versions_to_retain` versions: snapshots older than the newest
    /// snapshot at or below the oldest retained version, and changelogs at
    /// or below that snapshot.
    fn retain(&mut self, version: u64) -> Result<(), StateError> {
        let oldest = version.saturating_sub(self.options.min_versions_to_retain);
        let Some(&base) = self.files.snapshots.range(..=oldest).next_back() else {
            return Ok(());
        };
        let old_snaps: Vec<u64> = self.files.snapshots.range(..base).copied().collect();
        let old_logs: Vec<u64> = self.files.changelogs.range(..=base).copied().collect();
        if old_snaps.is_empty() && old_logs.is_empty() {
            return Ok(());
        }
        for v in old_logs {
            files::remove_path(&self.dir.join(files::changelog_name(v)))?;
            self.files.changelogs.remove(&v);
        }
        for v in old_snaps {
            files::remove_path(&self.dir.join(files::snapshot_name(v)))?;
            self.files.snapshots.remove(&v);
        }
        files::sync_dir(&self.dir)
    }

    /// What this batch's uncommitted writes take in memory (an estimate,
    /// as in [`Self::metrics`]).
    pub fn pending_memory_bytes(&self) -> u64 {
        self.pending_bytes + self.pending.len() as u64 * 64
    }

    /// Figures for progress.
    pub fn metrics(&self) -> StoreMetrics {
        StoreMetrics {
            num_rows_total: self.rows,
            memory_used_bytes: self.backend.memory_used_bytes()
                + self.pending_bytes
                + self.pending.len() as u64 * 64,
            commit_time_ms: self.last_commit_ms,
            last_changelog_bytes: self.last_changelog_bytes,
        }
    }

    /// The versions that can be loaded right now (for tests and `checkpoint inspect`).
    pub fn loadable_versions(&self) -> (Vec<u64>, Vec<u64>) {
        (
            self.files.snapshots.iter().copied().collect(),
            self.files.changelogs.iter().copied().collect(),
        )
    }
}

#[cfg(test)]
mod tests;
