//! The per-key layout of deduplication state: one entry per distinct key
//! (any key columns), with an expiry index for `dropDuplicatesWithinWatermark`;
//! see the parent module for the byte layout. A micro-batch's input is taken
//! as one, in three passes (late filter and key encoding, duplicates within the
//! input, then per partition one sort, one batched state lookup and one write of
//! the new keys), and eviction scans only the expired key range. Sorting per
//! partition, not the whole input by partition, keeps ascending keys (increasing
//! ids) in order, so the sort finds them sorted instead of sorting them again.

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
    /// The three passes over a chunk of a micro-batch's input, its batches taken as
    /// one (one sort, one batched lookup and one write of the new keys per
    /// partition); returns, per input batch, the mask of its rows to emit.
    pub(super) fn dedup_rows(
        &mut self,
        late_micros: i64,
        input: &[RecordBatch],
        scratch: &mut Scratch,
    ) -> Result<Vec<BooleanBuffer>, OperatorError> {
        let total: usize = input.iter().map(RecordBatch::num_rows).sum();
        if total > u32::MAX as usize {
            return Err(self.invalid_rows(total));
        }
        let within = match self.expiry {
            Expiry::WithinWatermark { delay_micros } => Some(delay_micros),
            Expiry::Never | Expiry::EventTimeKey => None,
        };
        let prefix = within.map(|_| PREFIX_PRIMARY);

        // Pass 1: per batch, the late filter, then the key of every remaining row
        // (and, within the watermark, when it expires).
        scratch.keys.clear();
        scratch.ends.clear();
        scratch.ends.reserve(total);
        scratch.expires.clear();
        let mut lates = Vec::with_capacity(input.len());
        for batch in input {
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
            if let Some(delay_micros) = within {
                // Spark reads a null event time as 0 (`UnsafeRow.getLong`).
                scratch.expires.extend((0..n).map(|row| {
                    event_times
                        .filter(|ts| ts.is_valid(row))
                        .map_or(0, |ts| ts.value(row))
                        .saturating_add(delay_micros)
                }));
            }
            lates.push(late);
        }

        // Pass 2: the first occurrence of each key within the input.
        let mut firsts: Vec<(u32, u32)> = Vec::with_capacity(total);
        {
            let mut seen: HashSet<KeyRef<'_>, BuildHasherDefault<PassHasher>> =
                HashSet::with_capacity_and_hasher(total, BuildHasherDefault::default());
            let mut start = 0;
            let mut row = 0;
            for (batch, late) in input.iter().zip(&lates) {
                for i in 0..batch.num_rows() {
                    let end = scratch.ends[row];
                    let is_late = late.as_ref().is_some_and(|l| l.value(i));
                    if !is_late {
                        let bytes = &scratch.keys[start..end];
                        let hash = fnv1a(bytes);
                        if seen.insert(KeyRef { hash, bytes }) {
                            // `row < total <= u32::MAX`, checked above, and the
                            // partition is below `num_partitions: u32`.
                            firsts.push((row as u32, self.state.partition_of_hash(hash) as u32));
                        }
                    }
                    start = end;
                    row += 1;
                }
            }
        }
        if firsts.is_empty() {
            // Every row late or empty input: no store is asked.
            return Ok(input
                .iter()
                .map(|batch| BooleanBuffer::new_unset(batch.num_rows()))
                .collect());
        }
        // The first occurrences grouped by partition, each group in row order (a
        // counting sort: no key is compared here).
        let parts = self.state.partitions();
        let mut bounds = vec![0usize; parts + 1];
        for &(_, p) in &firsts {
            bounds[p as usize + 1] += 1;
        }
        for p in 0..parts {
            bounds[p + 1] += bounds[p];
        }
        scratch.candidates.clear();
        scratch.candidates.resize(firsts.len(), 0);
        let mut next = bounds.clone();
        for &(row, p) in &firsts {
            scratch.candidates[next[p as usize]] = row;
            next[p as usize] += 1;
        }
        drop(firsts);

        // Pass 3: per partition, its distinct keys in key order, one batched state
        // lookup of them, and one write of the new ones. The partitions run on
        // the query's threads.
        let Scratch {
            keys,
            ends,
            candidates,
            expires,
            ..
        } = scratch;
        let key_of = |row: u32| {
            let row = row as usize;
            let start = if row == 0 { 0 } else { ends[row - 1] };
            &keys[start..ends[row]]
        };
        let new_rows = self
            .state
            .each_store(|p, store| {
                let rows = &candidates[bounds[p]..bounds[p + 1]];
                if rows.is_empty() {
                    return Ok(Vec::new());
                }
                let lookup = sorted_keys(rows, &key_of);
                let mut found = Vec::with_capacity(lookup.len());
                store.contains_many(
                    &lookup.iter().map(|&(_, key)| key).collect::<Vec<_>>(),
                    true,
                    &mut found,
                )?;
                let new: Vec<(u32, &[u8])> = lookup
                    .into_iter()
                    .zip(found)
                    .filter_map(|(entry, present)| (!present).then_some(entry))
                    .collect();
                if within.is_none() {
                    store.put_new_sorted(new.iter().map(|&(_, key)| (key, &[][..])))?;
                } else {
                    // `0x00 ‖ key → expiresAt`, then the index `0x01 ‖ expiresAt ‖ key`
                    // ordered by expiry and key (a stable sort by expiry of the key-ordered
                    // rows): ascending as one sequence. The index entry of a key is absent
                    // when its primary entry is: the two are written and removed together.
                    let values: Vec<[u8; 8]> = new
                        .iter()
                        .map(|&(row, _)| expires[row as usize].to_be_bytes())
                        .collect();
                    let mut by_expiry: Vec<(i64, &[u8])> = new
                        .iter()
                        .map(|&(row, key)| (expires[row as usize], key))
                        .collect();
                    by_expiry.sort_by_key(|&(at, _)| at);
                    let mut index = Vec::new();
                    let mut index_ends = Vec::with_capacity(by_expiry.len());
                    for (at, key) in by_expiry {
                        index.push(PREFIX_EXPIRY);
                        index.extend_from_slice(&flip_i64(at));
                        index.extend_from_slice(&key[1..]);
                        index_ends.push(index.len());
                    }
                    let primary = new
                        .iter()
                        .zip(&values)
                        .map(|(&(_, key), value)| (key, &value[..]));
                    let index_starts = std::iter::once(0).chain(index_ends.iter().copied());
                    let index_entries = index_starts
                        .zip(&index_ends)
                        .map(|(start, &end)| (&index[start..end], &[][..]));
                    store.put_new_sorted(primary.chain(index_entries))?;
                }
                Ok(new.into_iter().map(|(row, _)| row).collect())
            })
            .map_err(|e| state_error(self.name, e))?;
        let mut keep = BooleanBufferBuilder::new(total);
        keep.append_n(total, false);
        for rows in new_rows {
            self.state.updated(rows.len() as u64);
            for row in rows {
                keep.set_bit(row as usize, true);
            }
        }
        let keep = keep.finish();
        let mut offset = 0;
        Ok(input
            .iter()
            .map(|batch| {
                let mask = keep.slice(offset, batch.num_rows());
                offset += batch.num_rows();
                mask
            })
            .collect())
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

/// Appends every non-late row's state key to `scratch.keys`, row after row.
fn encode_keys(
    encoders: &[ColumnEncoder<'_>],
    prefix: Option<u8>,
    late: Option<&BooleanBuffer>,
    n: usize,
    scratch: &mut Scratch,
) {
    let keys = &mut scratch.keys;
    let ends = &mut scratch.ends;
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

/// `rows`' keys in ascending order, each with its row. The sort compares the keys'
/// first 16 bytes as one integer and reads the rest only on a tie; keys that arrive
/// mostly ascending (increasing ids) are found in order in about one pass.
pub(super) fn sorted_keys<'k>(
    rows: &[u32],
    key_of: &impl Fn(u32) -> &'k [u8],
) -> Vec<(u32, &'k [u8])> {
    let mut order: Vec<(u128, u32)> = rows
        .iter()
        .map(|&row| {
            let key = key_of(row);
            let mut head = [0u8; 16];
            let n = key.len().min(16);
            head[..n].copy_from_slice(&key[..n]);
            (u128::from_be_bytes(head), row)
        })
        .collect();
    order.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| key_of(a.1).cmp(key_of(b.1))));
    order
        .into_iter()
        .map(|(_, row)| (row, key_of(row)))
        .collect()
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
