//! The in-memory backend: an ordered map, snapshotted as one dump file.
//!
//! Why it exists: small states and tests should not pay for RocksDB, and the versioning logic
//! (changelogs, snapshots, recovery) must behave identically whatever holds the entries, so this
//! backend is deliberately the simplest possible one behind the same trait.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;

use super::files::{self, SNAPSHOT_META};
use super::record::{FileKind, Header, RecordFile, RecordWriter};
use super::{Backend, ScanFn, StateError, StoreKind};

/// The dump file inside a memory snapshot directory.
const DUMP_FILE: &str = "state.dump";

/// Estimated heap cost of one entry beyond its bytes: two `Vec` headers in a B-tree node that is
/// about two-thirds full, plus two allocations' bookkeeping.
const ENTRY_OVERHEAD: u64 = 96;

#[derive(Debug, Default)]
pub(super) struct MemoryBackend {
    map: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Sum of key and value lengths.
    bytes: u64,
}

impl MemoryBackend {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Backend for MemoryBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self.map.get(key).cloned())
    }

    fn contains(&self, key: &[u8]) -> Result<bool, StateError> {
        Ok(self.map.contains_key(key))
    }

    fn scan(&self, start: &[u8], end: Option<&[u8]>, f: &mut ScanFn<'_>) -> Result<(), StateError> {
        let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
        for (k, v) in self.map.range::<[u8], _>((Bound::Included(start), upper)) {
            if !f(k, v)? {
                break;
            }
        }
        Ok(())
    }

    fn exist(
        &self,
        keys: &[&[u8]],
        _sorted: bool,
        found: &mut Vec<bool>,
    ) -> Result<(), StateError> {
        found.extend(keys.iter().map(|k| self.map.contains_key(*k)));
        Ok(())
    }

    fn get_many(
        &self,
        keys: &[&[u8]],
        _sorted: bool,
        values: &mut Vec<Option<Vec<u8>>>,
    ) -> Result<(), StateError> {
        values.extend(keys.iter().map(|k| self.map.get(*k).cloned()));
        Ok(())
    }

    fn apply<'a>(
        &mut self,
        changes: &mut dyn Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    ) -> Result<(), StateError> {
        for (key, value) in changes {
            match value {
                Some(value) => {
                    if let Some(slot) = self.map.get_mut(key) {
                        self.bytes -= slot.len() as u64;
                        slot.clear();
                        slot.extend_from_slice(value);
                    } else {
                        self.bytes += key.len() as u64;
                        self.map.insert(key.to_vec(), value.to_vec());
                    }
                    self.bytes += value.len() as u64;
                }
                None => {
                    if let Some(old) = self.map.remove(key) {
                        self.bytes -= (key.len() + old.len()) as u64;
                    }
                }
            }
        }
        Ok(())
    }

    fn reset(&mut self, snapshot: Option<&Path>) -> Result<(), StateError> {
        self.map.clear();
        self.bytes = 0;
        if let Some(dir) = snapshot {
            let dump = RecordFile::read(&dir.join(DUMP_FILE), FileKind::Dump)?;
            self.apply(&mut dump.records())?;
        }
        Ok(())
    }

    fn write_snapshot(&mut self, dir: &Path, version: u64) -> Result<(), StateError> {
        std::fs::create_dir(dir).map_err(|e| StateError::io(dir, "create directory", e))?;
        let path = dir.join(DUMP_FILE);
        debug_assert_ne!(DUMP_FILE, SNAPSHOT_META);
        let header = Header {
            kind: FileKind::Dump,
            store: Some(StoreKind::Memory),
            version,
            parent: None,
        };
        let io = |e| StateError::io(&path, "write", e);
        let mut writer = RecordWriter::new(files::create_new(&path)?, &header).map_err(io)?;
        for (k, v) in &self.map {
            writer.record(k, Some(v)).map_err(io)?;
        }
        writer.finish(self.map.len() as u64).map_err(io)?;
        Ok(())
    }

    fn memory_used_bytes(&self) -> u64 {
        self.bytes + self.map.len() as u64 * ENTRY_OVERHEAD
    }
}
