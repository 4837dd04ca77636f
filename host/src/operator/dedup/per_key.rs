//! The per-key layout of deduplication state: one entry per distinct key
//! (any key columns), with an expiry index for `dropDuplicatesWithinWatermark`;
//! see the parent module for the byte layout. Each batch is found in three
//! passes (late filter and key encoding, duplicates within the batch, one
//! batched state lookup per partition), and eviction scans only the expired
//! key range.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMicrosecondType;
use arrow_array::{Array, RecordBatch};
use arrow_buffer::{BooleanBuffer, BooleanBufferBuilder};

use super::{DedupOperator, Expiry, Scratch, late_rows, state_error};
use crate::operator::key_encoding::{ColumnEncoder, TAG_VALUE, flip_i64, fnv1a};
use crate::operator::stateful::OperatorError;
use crate::state::StateError;

/// Within-watermark: prefix of `key → expiresAt`.
const PREFIX_PRIMARY: u8 = 0x00;
/// Within-watermark: prefix of `expiresAt ‖ key → ∅`.
const PREFIX_EXPIRY: u8 = 0x01;
/// Length of `PREFIX_EXPIRY ‖ expiresAt`.
const EXPIRY_HEAD: usize = 9;
impl DedupOperator {
    /// The three passes over one batch; returns the mask of rows to emit.
    pub(super) fn dedup_rows(
        &mut self,
        late_micros: i64,
        batch: &RecordBatch,
        scratch: &mut Scratch,
    ) -> Result<BooleanBuffer, OperatorError> {
        let n = batch.num_rows();
        let event_times = match self.event_time {
            Some(i) => Some(
                batch
                    .column(i)
                    .as_primitive_opt::<TimestampMicrosecondType>()
                    .ok_or_else(|| self.invalid(self.event_time_type_error(i)))?,
            ),
            None => None,
        };
        let prefix = match self.expiry {
            Expiry::WithinWatermark { .. } => Some(PREFIX_PRIMARY),
            Expiry::Never | Expiry::EventTimeKey => None,
        };

        // Pass 1: the late filter, then the key of every remaining row.
        let late = event_times.map(|ts| late_rows(ts, late_micros));
        if let Some((_, dropped)) = &late {
            self.rows_dropped_late += dropped;
        }
        let late = late.map(|(mask, _)| mask);
        let encoders = self
            .keys
            .iter()
            .map(|k| ColumnEncoder::new(batch.column(k.index).as_ref()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| self.invalid(self.key_type_error()))?;
        encode_keys(&encoders, prefix, late.as_ref(), n, scratch);

        // Pass 2: the first occurrence of each key within the batch.
        scratch.candidates.clear();
        {
            let mut seen: HashSet<KeyRef<'_>, BuildHasherDefault<PassHasher>> =
                HashSet::with_capacity_and_hasher(n, BuildHasherDefault::default());
            let mut start = 0;
            for (row, &end) in scratch.ends.iter().enumerate() {
                let is_late = late.as_ref().is_some_and(|l| l.value(row));
                if !is_late {
                    let bytes = &scratch.keys[start..end];
                    let hash = fnv1a(bytes);
                    if seen.insert(KeyRef { hash, bytes }) {
                        // `row < n <= u32::MAX`, checked by the caller, and
                        // the partition is below `num_partitions: u32`.
                        scratch
                            .candidates
                            .push((row as u32, self.state.partition_of_hash(hash) as u32));
                    }
                }
                start = end;
            }
        }

        // Pass 3: per partition, one batched state lookup of its distinct
        // keys in key order (RocksDB then searches each table once for the
        // whole lookup); store the new ones. The partitions run on the
        // query's threads.
        let Scratch {
            keys,
            ends,
            candidates,
            ..
        } = scratch;
        let key_of = |row: u32| {
            let row = row as usize;
            let start = if row == 0 { 0 } else { ends[row - 1] };
            &keys[start..ends[row]]
        };
        // Stable: keys mostly arrive ascending, and its merge sort finds those runs.
        candidates.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| key_of(a.0).cmp(key_of(b.0))));
        let mut parts: Vec<&[(u32, u32)]> = vec![&[]; self.state.partitions()];
        for part in candidates.chunk_by(|a, b| a.1 == b.1) {
            parts[part[0].1 as usize] = part;
        }
        let expiry = self.expiry;
        let new_rows = self
            .state
            .each_store(|p, store| {
                let part = parts[p];
                let mut new = Vec::new();
                if part.is_empty() {
                    return Ok(new);
                }
                let lookup: Vec<&[u8]> = part.iter().map(|&(row, _)| key_of(row)).collect();
                let mut found = Vec::with_capacity(lookup.len());
                store.contains_many(&lookup, true, &mut found)?;
                let mut index_key = Vec::new();
                for (&(row, _), (&key, &present)) in
                    part.iter().zip(lookup.iter().zip(found.iter()))
                {
                    if present {
                        continue;
                    }
                    new.push(row);
                    match expiry {
                        Expiry::Never | Expiry::EventTimeKey => store.put_new(key, &[])?,
                        Expiry::WithinWatermark { delay_micros } => {
                            // Spark reads a null event time as 0 (`UnsafeRow.getLong`).
                            let row = row as usize;
                            let ts = event_times
                                .filter(|ts| ts.is_valid(row))
                                .map_or(0, |ts| ts.value(row));
                            let expires_at = ts.saturating_add(delay_micros);
                            store.put_new(key, &expires_at.to_be_bytes())?;
                            index_key.clear();
                            index_key.push(PREFIX_EXPIRY);
                            index_key.extend_from_slice(&flip_i64(expires_at));
                            index_key.extend_from_slice(&key[1..]);
                            store.put(&index_key, &[])?;
                        }
                    }
                }
                Ok(new)
            })
            .map_err(|e| state_error(self.name, e))?;
        let mut keep = BooleanBufferBuilder::new(n);
        keep.append_n(n, false);
        for rows in new_rows {
            self.state.updated(rows.len() as u64);
            for row in rows {
                keep.set_bit(row as usize, true);
            }
        }
        Ok(keep.finish())
    }

    /// The key range holding the entries that `watermark_ms` expires, or
    /// `None` when this operator never evicts.
    fn expired_range(&self, watermark_ms: i64) -> Option<(Vec<u8>, Vec<u8>)> {
        // Spark: entry expires when its time (µs) <= watermark_ms * 1000.
        let limit = watermark_ms.saturating_mul(1000);
        let first = match self.expiry {
            Expiry::Never => return None,
            Expiry::EventTimeKey => TAG_VALUE,
            Expiry::WithinWatermark { .. } => PREFIX_EXPIRY,
        };
        let end = match limit.checked_add(1) {
            Some(next) => {
                let mut end = vec![first];
                end.extend_from_slice(&flip_i64(next));
                end
            }
            None => vec![first + 1],
        };
        Some((vec![first], end))
    }

    /// Removes what `watermark_ms` expires from every partition, the partitions on the
    /// query's threads.
    pub(super) fn evict(&mut self, watermark_ms: i64) -> Result<(), StateError> {
        let Some((start, end)) = self.expired_range(watermark_ms) else {
            return Ok(());
        };
        let within = matches!(self.expiry, Expiry::WithinWatermark { .. });
        let removed = self.state.each_store(|_, store| {
            let mut expired = Vec::new();
            store.scan(&start, Some(&end), &mut |key, _| {
                expired.push(key.to_vec());
                Ok(true)
            })?;
            let mut primary = Vec::new();
            for key in &expired {
                store.delete(key)?;
                if within {
                    // The index entry's key ends with the primary key
                    // without its prefix.
                    primary.clear();
                    primary.push(PREFIX_PRIMARY);
                    primary.extend_from_slice(key.get(EXPIRY_HEAD..).unwrap_or_default());
                    store.delete(&primary)?;
                }
            }
            Ok::<_, StateError>(expired.len() as u64)
        })?;
        self.state.removed(removed.iter().sum());
        Ok(())
    }
}

/// Writes every non-late row's state key into `scratch.keys`, row after row.
fn encode_keys(
    encoders: &[ColumnEncoder<'_>],
    prefix: Option<u8>,
    late: Option<&BooleanBuffer>,
    n: usize,
    scratch: &mut Scratch,
) {
    let keys = &mut scratch.keys;
    let ends = &mut scratch.ends;
    keys.clear();
    ends.clear();
    ends.reserve(n);
    for row in 0..n {
        if late.is_none_or(|l| !l.value(row)) {
            if let Some(p) = prefix {
                keys.push(p);
            }
            for encoder in encoders {
                encoder.write(row, keys);
            }
        }
        ends.push(keys.len());
    }
}

/// A key of the batch being deduplicated, with its precomputed hash.
#[derive(Debug, Clone, Copy)]
struct KeyRef<'a> {
    hash: u64,
    bytes: &'a [u8],
}

impl PartialEq for KeyRef<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.bytes == other.bytes
    }
}

impl Eq for KeyRef<'_> {}

impl Hash for KeyRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// Hands the precomputed FNV-1a hash of a [`KeyRef`] to the hash set.
#[derive(Debug, Default)]
struct PassHasher(u64);

impl Hasher for PassHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used by `KeyRef`; mix anything else anyway.
        self.0 = crate::fnv::extend(self.0, bytes);
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}
