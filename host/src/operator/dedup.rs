//! Streaming deduplication: Spark's `dropDuplicates(keys)` and
//! `dropDuplicatesWithinWatermark(keys)`.
//!
//! Producers retry, so sources deliver some records twice; only state that
//! outlives a micro-batch can tell a retry from a new record. This module
//! keeps that state (one key per distinct record, in [`StateStore`]s) and
//! reproduces Spark's rules to the row, read from Spark's
//! `BaseStreamingDeduplicateExec`, `StreamingDeduplicateExec`,
//! `StreamingDeduplicateWithinWatermarkExec` and `WatermarkSupport`:
//!
//! - with a watermark, a row is late — dropped before deduplication, counted
//!   in `numRowsDroppedByWatermark` — when its event time in microseconds is
//!   `<= late_ms * 1000` (Spark compares the microsecond timestamp with the
//!   millisecond watermark times 1000, not the truncated milliseconds); a null
//!   event time is never late;
//! - a row is emitted when its key (null is a value like any other) is
//!   neither in state nor on an earlier row of the batch; its key is then
//!   stored. Duplicates never refresh the state;
//! - after the input, state is evicted with `watermark_ms`:
//!   `dropDuplicates` evicts only when the event-time column is one of the
//!   keys, the entries whose event time is `<= watermark_ms * 1000` (null
//!   event times are never evicted); `dropDuplicatesWithinWatermark` stores
//!   `expiresAt = event time + delay` (microseconds) of the first row and
//!   evicts when `watermark_ms * 1000 >= expiresAt`. As in Spark, a null event
//!   time counts as 0 there (`UnsafeRow.getLong` of a null field), so such a
//!   key expires at `delay`.
//!
//! Speed is the point (the bar is 20× Spark's throughput): keys are encoded
//! column by column into one reused buffer, duplicates inside the batch are
//! found with a hash set before the state is asked, each partition's store is
//! asked once per batch for all its distinct keys in key order (one batched
//! RocksDB lookup, not one per key), and the batch is cut with one Arrow
//! filter.
//!
//! # State layout
//! Keys are order-preserving bytes: per key column a tag (`0x01` value,
//! `0x02` null: nulls sort last) then the value (integers big-endian with the
//! sign bit flipped, floats with their order-preserving bit flip and NaN
//! canonical, strings and binaries with `0x00` escaped as `0x00 0xFF` and
//! ended by `0x00 0x01`). When the event-time column is a key it comes
//! first, so eviction scans read only expired entries. Within-watermark
//! state holds two entries per key: `0x00 ‖ key → expiresAt` (big-endian),
//! looked up per row, and the index `0x01 ‖ expiresAt ‖ key → ∅`, scanned
//! for eviction. Partition of a key: FNV-1a 64 of its state key bytes modulo
//! `num_partitions`; the store of partition `p` lives in `state_dir/p`.
//!
//! One integer key with no eviction (`dropDuplicates(["order_id"])`, the
//! usual case) is stored as sets of integers instead ([`int_set`]): one
//! entry per bucket of 4,096 consecutive values, `0x01 ‖ bucket (8 bytes,
//! big-endian) → container`, the null key as `0x02 → ∅`, and the number of
//! keys of the partition under `0x00`. The state's value schema
//! (`bucket_members`) records the layout in the checkpoint's fingerprint, so
//! a checkpoint of the other layout is refused, never misread.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::path::PathBuf;
use std::time::Instant;

use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMicrosecondType;
use arrow_array::{Array, BooleanArray, RecordBatch};
use arrow_buffer::{BooleanBuffer, BooleanBufferBuilder};
use arrow_schema::{DataType, Field, SchemaRef, TimeUnit};
use arrow_select::filter::filter_record_batch;

use crate::operator::int_set::{self, Bucket};
use crate::operator::key_encoding::{
    ColumnEncoder, TAG_NULL, TAG_VALUE, flip_i64, fnv1a, key_type_supported,
};
use crate::operator::stateful::{
    OperatorError, OperatorMetrics, StateSchema, StatefulContext, StatefulOperator, resolve,
};
use crate::state::{StateError, StateOptions, StateStore};

/// Spark's `shortName` of `StreamingDeduplicateExec`.
const NAME_DEDUP: &str = "dedupe";
/// Spark's `shortName` of `StreamingDeduplicateWithinWatermarkExec`.
const NAME_WITHIN_WATERMARK: &str = "dedupeWithinWatermark";

/// Within-watermark: prefix of `key → expiresAt`.
const PREFIX_PRIMARY: u8 = 0x00;
/// Within-watermark: prefix of `expiresAt ‖ key → ∅`.
const PREFIX_EXPIRY: u8 = 0x01;
/// Length of `PREFIX_EXPIRY ‖ expiresAt`.
const EXPIRY_HEAD: usize = 9;
/// Integer-set layout: the key of a partition's key count.
const COUNT_KEY: &[u8] = &[0x00];
/// Integer-set layout: the value column recorded in the state schema.
pub const BUCKET_MEMBERS: &str = "bucket_members";

/// How to deduplicate a stream.
#[derive(Debug, Clone)]
pub struct DedupConfig {
    /// The key columns; empty means every column (Spark's `dropDuplicates()`).
    pub keys: Vec<String>,
    /// `dropDuplicatesWithinWatermark` instead of `dropDuplicates`.
    pub within_watermark: bool,
    /// The watermark's event-time column, when the stream has a watermark.
    pub event_time: Option<String>,
    /// The watermark delay in ms (used by `within_watermark`).
    pub delay_ms: i64,
    /// How many state partitions (fixed for the checkpoint's lifetime).
    pub num_partitions: u32,
    /// `<checkpoint>/state/<operator>`; partition `p` is stored in `p/`.
    pub state_dir: PathBuf,
    pub state: StateOptions,
    /// One state entry per key even for one integer key: the layout of
    /// checkpoints written before integer sets, which keep it.
    pub one_entry_per_key: bool,
}

/// What is wrong with a [`DedupConfig`] or an input batch.
#[derive(Debug, thiserror::Error)]
pub enum DedupError {
    #[error("dedup key column {column:?} is not in the input (columns: {available})")]
    UnknownKeyColumn { column: String, available: String },
    #[error("event-time column {column:?} is not in the input (columns: {available})")]
    UnknownEventTimeColumn { column: String, available: String },
    #[error(
        "dropDuplicatesWithinWatermark needs a watermark: its state expires at event time + \
         watermark delay, so set a watermark (event-time column and delay) on the stream"
    )]
    WithinWatermarkWithoutWatermark,
    #[error("dropDuplicatesWithinWatermark: watermark delay {delay_ms} ms is negative")]
    NegativeDelay { delay_ms: i64 },
    #[error("num_partitions is 0: dedup state needs at least one partition")]
    NoPartitions,
    #[error("event-time column {column:?} has type {data_type}, expected Timestamp(Microsecond)")]
    EventTimeType { column: String, data_type: DataType },
    #[error("dedup key column {column:?} has type {data_type}, which cannot be a dedup key")]
    UnsupportedKeyType { column: String, data_type: DataType },
    #[error("input column {index} is {found:?} ({found_type}), expected {column:?} ({data_type})")]
    InputMismatch {
        index: usize,
        column: String,
        data_type: DataType,
        found: String,
        found_type: DataType,
    },
}

/// When state entries leave the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    /// No event time among the keys: state only grows (Spark, RESULTS.md §5.8).
    Never,
    /// The event time is the first key: evict event time ≤ watermark.
    EventTimeKey,
    /// Within watermark: evict when event time + delay ≤ watermark.
    WithinWatermark { delay_micros: i64 },
}

/// How one integer key column maps to the ordered values of [`int_set`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IntKey {
    /// Any signed or unsigned type up to 32 bits, and Int64: as an i64.
    Signed,
    /// UInt64: the value itself.
    Unsigned,
}

impl IntKey {
    /// The integer-set layout applies to one integer key that is never
    /// evicted, unless `config` keeps one entry per key.
    fn of(config: &DedupConfig, keys: &[KeyColumn], expiry: Expiry) -> Option<Self> {
        use DataType as D;
        let [key] = keys else { return None };
        if expiry != Expiry::Never || config.one_entry_per_key {
            return None;
        }
        match key.data_type {
            D::Int8 | D::Int16 | D::Int32 | D::Int64 | D::UInt8 | D::UInt16 | D::UInt32 => {
                Some(Self::Signed)
            }
            D::UInt64 => Some(Self::Unsigned),
            _ => None,
        }
    }
}

/// The integer-set layout's state of one batch in one partition.
#[derive(Debug, Default, Clone, Copy)]
struct IntSetCount {
    /// Keys in the partition (committed plus this batch's).
    keys: u64,
    /// Whether this batch added keys (the count is then written at commit).
    changed: bool,
}

/// One key column, in state-key order.
#[derive(Debug, Clone)]
struct KeyColumn {
    index: usize,
    name: String,
    data_type: DataType,
}

/// Reused per-batch buffers (kept to avoid reallocating every batch).
#[derive(Debug, Default)]
struct Scratch {
    /// Encoded keys of all rows, back to back.
    keys: Vec<u8>,
    /// `keys[ends[r - 1]..ends[r]]` is row r's key (empty for late rows).
    ends: Vec<usize>,
    /// Row ids (in the batch) of first occurrences, with their partitions.
    candidates: Vec<(u32, u32)>,
    /// Whether the state holds each key of one partition's lookup.
    found: Vec<bool>,
    /// Within-watermark index key being built.
    index_key: Vec<u8>,
    /// State keys found by an eviction scan.
    expired: Vec<Vec<u8>>,
    /// Integer-set layout: (ordered value, row) of every keyed row.
    values: Vec<(u64, u32)>,
    /// Integer-set layout: per bucket touched, its key, partition and the
    /// range of `values` it holds.
    buckets: Vec<([u8; 9], u32, std::ops::Range<usize>)>,
    /// Integer-set layout: containers read from a store.
    containers: Vec<Option<Vec<u8>>>,
    /// Integer-set layout: one encoded container.
    encoded: Vec<u8>,
}

/// Spark's streaming `dropDuplicates` / `dropDuplicatesWithinWatermark`.
pub struct DedupOperator {
    name: &'static str,
    schema: SchemaRef,
    keys: Vec<KeyColumn>,
    /// Column index of the watermark's event time, when there is a watermark.
    event_time: Option<usize>,
    expiry: Expiry,
    /// `Some` when the state is stored as integer sets.
    int_key: Option<IntKey>,
    /// Integer-set layout: keys per partition.
    int_counts: Vec<IntSetCount>,
    stores: Vec<StateStore>,
    scratch: Scratch,
    /// State keys written since the last load or commit.
    rows_updated: u64,
    /// State keys evicted since the last load or commit.
    rows_removed: u64,
    /// Late input rows since the last load or commit.
    rows_dropped_late: u64,
}

impl std::fmt::Debug for DedupOperator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DedupOperator")
            .field("name", &self.name)
            .field("keys", &self.keys)
            .field("event_time", &self.event_time)
            .field("expiry", &self.expiry)
            .field("partitions", &self.stores.len())
            .finish_non_exhaustive()
    }
}

impl DedupOperator {
    /// Validates `config` against the input schema and opens one state store
    /// per partition (empty until [`StatefulOperator::load`]).
    ///
    /// # Errors
    /// [`OperatorError::Invalid`] naming the key or event-time column that is
    /// missing or of an unusable type, or saying why within-watermark dedup
    /// cannot run (no watermark, negative delay); [`OperatorError::State`]
    /// when a store cannot be opened.
    pub fn new(config: DedupConfig, input: &SchemaRef) -> Result<Self, OperatorError> {
        let name = if config.within_watermark {
            NAME_WITHIN_WATERMARK
        } else {
            NAME_DEDUP
        };
        let invalid = |e: DedupError| OperatorError::Invalid {
            operator: name.to_owned(),
            message: e.to_string(),
        };
        let (keys, event_time, expiry) = plan(&config, input).map_err(invalid)?;
        let int_key = IntKey::of(&config, &keys, expiry);
        let mut stores = Vec::with_capacity(config.num_partitions as usize);
        for partition in 0..config.num_partitions {
            let dir = config.state_dir.join(partition.to_string());
            let store =
                StateStore::open(&dir, &config.state).map_err(|source| OperatorError::State {
                    operator: name.to_owned(),
                    source,
                })?;
            stores.push(store);
        }
        Ok(Self {
            name,
            schema: input.clone(),
            keys,
            event_time,
            expiry,
            int_key,
            int_counts: vec![IntSetCount::default(); stores.len()],
            stores,
            scratch: Scratch::default(),
            rows_updated: 0,
            rows_removed: 0,
            rows_dropped_late: 0,
        })
    }

    fn state_error(&self, source: StateError) -> OperatorError {
        OperatorError::State {
            operator: self.name.to_owned(),
            source,
        }
    }

    fn invalid(&self, e: DedupError) -> OperatorError {
        OperatorError::Invalid {
            operator: self.name.to_owned(),
            message: e.to_string(),
        }
    }

    /// Checks that a batch has the key and event-time columns at the
    /// positions and with the types seen by [`Self::new`].
    fn check_input(&self, batch: &RecordBatch) -> Result<(), DedupError> {
        let schema = batch.schema();
        let expected = self.keys.iter().map(|k| (k.index, &k.name, &k.data_type));
        let event_time = self.event_time.map(|i| {
            let f = self.schema.field(i);
            (i, f.name(), f.data_type())
        });
        for (index, column, data_type) in expected.chain(event_time) {
            let found = schema.fields().get(index);
            let ok = found.is_some_and(|f| f.name() == column && f.data_type() == data_type);
            if !ok {
                return Err(DedupError::InputMismatch {
                    index,
                    column: column.clone(),
                    data_type: data_type.clone(),
                    found: found.map_or_else(|| "<none>".to_owned(), |f| f.name().clone()),
                    found_type: found.map_or(DataType::Null, |f| f.data_type().clone()),
                });
            }
        }
        Ok(())
    }

    /// Deduplicates one input batch against the state (and the batch's
    /// earlier rows), storing the keys of the rows it keeps.
    fn process_batch(
        &mut self,
        late_micros: i64,
        batch: &RecordBatch,
    ) -> Result<Option<RecordBatch>, OperatorError> {
        self.check_input(batch).map_err(|e| self.invalid(e))?;
        let n = batch.num_rows();
        if n == 0 {
            return Ok(None);
        }
        if n > u32::MAX as usize {
            return Err(self.invalid_rows(n));
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = match self.int_key {
            Some(kind) => self.dedup_int_set(kind, late_micros, batch, &mut scratch),
            None => self.dedup_rows(late_micros, batch, &mut scratch),
        };
        self.scratch = scratch;
        let keep = result?;
        let kept = keep.count_set_bits();
        if kept == 0 {
            return Ok(None);
        }
        if kept == n {
            return Ok(Some(batch.clone()));
        }
        let mask = BooleanArray::new(keep, None);
        filter_record_batch(batch, &mask)
            .map(Some)
            .map_err(|source| OperatorError::Arrow {
                operator: self.name.to_owned(),
                source,
            })
    }

    fn invalid_rows(&self, n: usize) -> OperatorError {
        OperatorError::Invalid {
            operator: self.name.to_owned(),
            message: format!("input batch of {n} rows is larger than 2^32 - 1 rows"),
        }
    }

    /// The three passes over one batch; returns the mask of rows to emit.
    fn dedup_rows(
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
        let partitions = self.stores.len() as u64;
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
                            .push((row as u32, (hash % partitions) as u32));
                    }
                }
                start = end;
            }
        }

        // Pass 3: per partition, one batched state lookup of its distinct
        // keys in key order (RocksDB then searches each table once for the
        // whole lookup); store the new ones.
        let mut keep = BooleanBufferBuilder::new(n);
        keep.append_n(n, false);
        let Scratch {
            keys,
            ends,
            candidates,
            found,
            index_key,
            ..
        } = scratch;
        let key_of = |row: u32| {
            let row = row as usize;
            let start = if row == 0 { 0 } else { ends[row - 1] };
            &keys[start..ends[row]]
        };
        // Stable: keys mostly arrive ascending, and its merge sort finds those runs.
        candidates.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| key_of(a.0).cmp(key_of(b.0))));
        for part in candidates.chunk_by(|a, b| a.1 == b.1) {
            let store = &mut self.stores[part[0].1 as usize];
            let lookup: Vec<&[u8]> = part.iter().map(|&(row, _)| key_of(row)).collect();
            store
                .contains_many(&lookup, true, found)
                .map_err(|e| state_error(self.name, e))?;
            for (&(row, _), (&key, &present)) in part.iter().zip(lookup.iter().zip(found.iter())) {
                if present {
                    continue;
                }
                let row = row as usize;
                keep.set_bit(row, true);
                self.rows_updated += 1;
                match self.expiry {
                    Expiry::Never | Expiry::EventTimeKey => {
                        store
                            .put_new(key, &[])
                            .map_err(|e| state_error(self.name, e))?;
                    }
                    Expiry::WithinWatermark { delay_micros } => {
                        // Spark reads a null event time as 0 (`UnsafeRow.getLong`).
                        let ts = event_times
                            .filter(|ts| ts.is_valid(row))
                            .map_or(0, |ts| ts.value(row));
                        let expires_at = ts.saturating_add(delay_micros);
                        store
                            .put_new(key, &expires_at.to_be_bytes())
                            .map_err(|e| state_error(self.name, e))?;
                        index_key.clear();
                        index_key.push(PREFIX_EXPIRY);
                        index_key.extend_from_slice(&flip_i64(expires_at));
                        index_key.extend_from_slice(&key[1..]);
                        store
                            .put(index_key, &[])
                            .map_err(|e| state_error(self.name, e))?;
                    }
                }
            }
        }
        Ok(keep.finish())
    }

    /// [`Self::dedup_rows`] for the integer-set layout: the batch's keyed
    /// rows sorted by value (the first row of each value wins), grouped by
    /// bucket, each partition's buckets read in one batched lookup, updated
    /// and written back.
    fn dedup_int_set(
        &mut self,
        kind: IntKey,
        late_micros: i64,
        batch: &RecordBatch,
        scratch: &mut Scratch,
    ) -> Result<BooleanBuffer, OperatorError> {
        let n = batch.num_rows();
        let late = match self.event_time {
            Some(i) => {
                let ts = batch
                    .column(i)
                    .as_primitive_opt::<TimestampMicrosecondType>()
                    .ok_or_else(|| self.invalid(self.event_time_type_error(i)))?;
                let (mask, dropped) = late_rows(ts, late_micros);
                self.rows_dropped_late += dropped;
                Some(mask)
            }
            None => None,
        };
        let column = batch.column(self.keys[0].index);
        let nulls = column.logical_nulls();
        let on_time = |row: usize| late.as_ref().is_none_or(|l| !l.value(row));
        let values = &mut scratch.values;
        values.clear();
        values.reserve(n);
        let mut null_row = None;
        macro_rules! collect {
            ($t:ty, $image:expr) => {{
                let array = column
                    .as_primitive_opt::<$t>()
                    .ok_or_else(|| self.invalid(self.key_type_error()))?;
                for (row, &v) in array.values().iter().enumerate() {
                    if !on_time(row) {
                        continue;
                    }
                    if nulls.as_ref().is_some_and(|nulls| nulls.is_null(row)) {
                        null_row.get_or_insert(row);
                        continue;
                    }
                    // `row < n <= u32::MAX`, checked by the caller.
                    values.push(($image(v), row as u32));
                }
            }};
        }
        {
            use arrow_array::types::{
                Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type,
                UInt64Type,
            };
            match (kind, column.data_type()) {
                (IntKey::Signed, DataType::Int8) => {
                    collect!(Int8Type, |v: i8| int_set::ordered(i64::from(v)))
                }
                (IntKey::Signed, DataType::Int16) => {
                    collect!(Int16Type, |v: i16| int_set::ordered(i64::from(v)))
                }
                (IntKey::Signed, DataType::Int32) => {
                    collect!(Int32Type, |v: i32| int_set::ordered(i64::from(v)))
                }
                (IntKey::Signed, DataType::Int64) => collect!(Int64Type, int_set::ordered),
                (IntKey::Signed, DataType::UInt8) => {
                    collect!(UInt8Type, |v: u8| int_set::ordered(i64::from(v)))
                }
                (IntKey::Signed, DataType::UInt16) => {
                    collect!(UInt16Type, |v: u16| int_set::ordered(i64::from(v)))
                }
                (IntKey::Signed, DataType::UInt32) => {
                    collect!(UInt32Type, |v: u32| int_set::ordered(i64::from(v)))
                }
                (IntKey::Unsigned, DataType::UInt64) => collect!(UInt64Type, |v: u64| v),
                _ => return Err(self.invalid(self.key_type_error())),
            }
        }
        // Equal values end up ordered by row, so the first occurrence stays.
        values.sort_unstable();
        values.dedup_by_key(|v| v.0);

        let partitions = self.stores.len() as u64;
        let buckets = &mut scratch.buckets;
        buckets.clear();
        let mut start = 0;
        while start < values.len() {
            let bucket = int_set::bucket_of(values[start].0);
            let mut end = start + 1;
            while end < values.len() && int_set::bucket_of(values[end].0) == bucket {
                end += 1;
            }
            let mut key = [0u8; 9];
            key[0] = TAG_VALUE;
            key[1..].copy_from_slice(&bucket.to_be_bytes());
            // The partition is below `num_partitions: u32`.
            let partition = (fnv1a(&key) % partitions) as u32;
            buckets.push((key, partition, start..end));
            start = end;
        }
        // Stable: each partition's buckets stay in key order.
        buckets.sort_by_key(|b| b.1);

        let mut keep = BooleanBufferBuilder::new(n);
        keep.append_n(n, false);
        for part in buckets.chunk_by(|a, b| a.1 == b.1) {
            let p = part[0].1 as usize;
            let store = &mut self.stores[p];
            let keys: Vec<&[u8]> = part.iter().map(|b| b.0.as_slice()).collect();
            store
                .get_many(&keys, true, &mut scratch.containers)
                .map_err(|e| state_error(self.name, e))?;
            let mut added = 0u64;
            for ((key, _, range), stored) in part.iter().zip(scratch.containers.iter()) {
                let mut bucket = match stored {
                    Some(bytes) => Bucket::decode(bytes)
                        .map_err(|e| corrupt_bucket(self.name, store, key, &e))?,
                    None => Bucket::default(),
                };
                let before = bucket.len();
                for &(value, row) in &values[range.clone()] {
                    if bucket.insert(value) {
                        keep.set_bit(row as usize, true);
                    }
                }
                let new = (bucket.len() - before) as u64;
                if new > 0 {
                    added += new;
                    bucket.encode(&mut scratch.encoded);
                    // The lookup above said whether the bucket exists: a new
                    // one is stored without asking the store again.
                    let written = if stored.is_none() {
                        store.put_new(key, &scratch.encoded)
                    } else {
                        store.put(key, &scratch.encoded)
                    };
                    written.map_err(|e| state_error(self.name, e))?;
                }
            }
            self.rows_updated += added;
            let count = &mut self.int_counts[p];
            count.keys += added;
            count.changed |= added > 0;
        }
        if let Some(row) = null_row {
            let p = (fnv1a(&[TAG_NULL]) % partitions) as usize;
            let store = &mut self.stores[p];
            if !store
                .contains(&[TAG_NULL])
                .map_err(|e| state_error(self.name, e))?
            {
                store
                    .put_new(&[TAG_NULL], &[])
                    .map_err(|e| state_error(self.name, e))?;
                keep.set_bit(row, true);
                self.rows_updated += 1;
                let count = &mut self.int_counts[p];
                count.keys += 1;
                count.changed = true;
            }
        }
        Ok(keep.finish())
    }

    fn event_time_type_error(&self, index: usize) -> DedupError {
        let f = self.schema.field(index);
        DedupError::EventTimeType {
            column: f.name().clone(),
            data_type: f.data_type().clone(),
        }
    }

    fn key_type_error(&self) -> DedupError {
        let k = self.keys.first();
        DedupError::UnsupportedKeyType {
            column: k.map_or_else(String::new, |k| k.name.clone()),
            data_type: k.map_or(DataType::Null, |k| k.data_type.clone()),
        }
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

    /// Removes what `watermark_ms` expires from every partition.
    fn evict(&mut self, watermark_ms: i64) -> Result<(), StateError> {
        let Some((start, end)) = self.expired_range(watermark_ms) else {
            return Ok(());
        };
        let mut expired = std::mem::take(&mut self.scratch.expired);
        let mut primary = std::mem::take(&mut self.scratch.index_key);
        let mut result = Ok(());
        for store in &mut self.stores {
            expired.clear();
            result = store.scan(&start, Some(&end), &mut |key, _| {
                expired.push(key.to_vec());
                Ok(true)
            });
            if result.is_err() {
                break;
            }
            for key in &expired {
                if let Err(e) = store.delete(key) {
                    result = Err(e);
                    break;
                }
                if matches!(self.expiry, Expiry::WithinWatermark { .. }) {
                    // The index entry's key ends with the primary key
                    // without its prefix.
                    primary.clear();
                    primary.push(PREFIX_PRIMARY);
                    primary.extend_from_slice(key.get(EXPIRY_HEAD..).unwrap_or_default());
                    if let Err(e) = store.delete(&primary) {
                        result = Err(e);
                        break;
                    }
                }
                self.rows_removed += 1;
            }
            if result.is_err() {
                break;
            }
        }
        expired.clear();
        self.scratch.expired = expired;
        self.scratch.index_key = primary;
        result
    }
}

/// A stored container of the integer-set layout that cannot be read.
fn corrupt_bucket(
    operator: &str,
    store: &StateStore,
    key: &[u8; 9],
    e: &int_set::CorruptBucket,
) -> OperatorError {
    let mut bucket = [0u8; 8];
    bucket.copy_from_slice(&key[1..]);
    state_error(
        operator,
        StateError::corrupt(
            store.dir(),
            format!("the entry of bucket {}: {e}", u64::from_be_bytes(bucket)),
        ),
    )
}

fn state_error(operator: &str, source: StateError) -> OperatorError {
    OperatorError::State {
        operator: operator.to_owned(),
        source,
    }
}

impl StatefulOperator for DedupOperator {
    fn name(&self) -> &str {
        self.name
    }

    fn output_schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn load(&mut self, version: Option<u64>) -> Result<(), StateError> {
        for store in &mut self.stores {
            store.load(version)?;
        }
        if self.int_key.is_some() {
            for (store, count) in self.stores.iter().zip(self.int_counts.iter_mut()) {
                *count = IntSetCount {
                    keys: store.get_count(COUNT_KEY)?,
                    changed: false,
                };
            }
        }
        self.rows_updated = 0;
        self.rows_removed = 0;
        self.rows_dropped_late = 0;
        Ok(())
    }

    fn process(
        &mut self,
        ctx: &StatefulContext,
        input: &[RecordBatch],
    ) -> Result<Vec<RecordBatch>, OperatorError> {
        // Spark: `eventTime <= watermarkMs * 1000` is late (inclusive).
        let late_micros = ctx.late_ms.saturating_mul(1000);
        let mut out = Vec::with_capacity(input.len());
        for batch in input {
            if let Some(kept) = self.process_batch(late_micros, batch)? {
                out.push(kept);
            }
        }
        // Spark evicts after the whole input (so a row that arrives in the
        // batch that expires its key is still recognised as a duplicate).
        self.evict(ctx.watermark_ms)
            .map_err(|e| self.state_error(e))?;
        Ok(out)
    }

    fn commit(&mut self, batch_id: u64) -> Result<OperatorMetrics, StateError> {
        let started = Instant::now();
        for (store, count) in self.stores.iter_mut().zip(self.int_counts.iter_mut()) {
            if count.changed {
                store.put(COUNT_KEY, &count.keys.to_be_bytes())?;
                count.changed = false;
            }
        }
        for store in &mut self.stores {
            store.commit(batch_id)?;
        }
        let commit_time_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (mut total, mut memory) = (0u64, 0u64);
        for store in &self.stores {
            let m = store.metrics();
            total += m.num_rows_total;
            memory += m.memory_used_bytes;
        }
        if matches!(self.expiry, Expiry::WithinWatermark { .. }) {
            // Two store entries (key and expiry index) per deduplicated key.
            total /= 2;
        }
        if self.int_key.is_some() {
            total = self.int_counts.iter().map(|c| c.keys).sum();
        }
        let metrics = OperatorMetrics {
            operator_name: self.name.to_owned(),
            num_rows_total: total,
            num_rows_updated: self.rows_updated,
            num_rows_removed: self.rows_removed,
            memory_used_bytes: memory,
            num_rows_dropped_by_watermark: self.rows_dropped_late,
            commit_time_ms,
            num_state_store_instances: self.stores.len() as u64,
        };
        self.rows_updated = 0;
        self.rows_removed = 0;
        self.rows_dropped_late = 0;
        Ok(metrics)
    }
}

/// The shape of the state [`DedupOperator::new`] would keep for `config`
/// over `input`, found without opening any store: the key is the dedup
/// keys in state-key order (every input column when `keys` is empty, as
/// Spark's `dropDuplicates()`); the value is empty, or for
/// `dropDuplicatesWithinWatermark` the key's `expires_at`.
///
/// # Errors
/// As [`DedupOperator::new`] for a configuration that cannot run.
pub fn state_schema(config: &DedupConfig, input: &SchemaRef) -> Result<StateSchema, OperatorError> {
    let name = if config.within_watermark {
        NAME_WITHIN_WATERMARK
    } else {
        NAME_DEDUP
    };
    let (keys, _, expiry) = plan(config, input).map_err(|e| OperatorError::Invalid {
        operator: name.to_owned(),
        message: e.to_string(),
    })?;
    let key = keys
        .iter()
        .map(|k| Field::new(&k.name, k.data_type.clone(), true))
        .collect();
    let value = match expiry {
        _ if IntKey::of(config, &keys, expiry).is_some() => {
            vec![Field::new(BUCKET_MEMBERS, DataType::Binary, false)]
        }
        Expiry::WithinWatermark { .. } => vec![Field::new(
            "expires_at",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        )],
        Expiry::Never | Expiry::EventTimeKey => Vec::new(),
    };
    Ok(StateSchema {
        operator: name,
        key,
        value,
    })
}

/// Resolves the key and event-time columns and the eviction rule.
fn plan(
    config: &DedupConfig,
    input: &SchemaRef,
) -> Result<(Vec<KeyColumn>, Option<usize>, Expiry), DedupError> {
    if config.num_partitions == 0 {
        return Err(DedupError::NoPartitions);
    }
    let available = || {
        input
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let event_time = match &config.event_time {
        Some(column) => {
            let index =
                resolve(input, column).ok_or_else(|| DedupError::UnknownEventTimeColumn {
                    column: column.clone(),
                    available: available(),
                })?;
            let data_type = input.field(index).data_type();
            if !matches!(data_type, DataType::Timestamp(TimeUnit::Microsecond, _)) {
                return Err(DedupError::EventTimeType {
                    column: column.clone(),
                    data_type: data_type.clone(),
                });
            }
            Some(index)
        }
        None => None,
    };
    let mut indices = Vec::new();
    if config.keys.is_empty() {
        indices.extend(0..input.fields().len());
    }
    for column in &config.keys {
        let index = resolve(input, column).ok_or_else(|| DedupError::UnknownKeyColumn {
            column: column.clone(),
            available: available(),
        })?;
        if !indices.contains(&index) {
            indices.push(index);
        }
    }
    // The event time first, so that eviction scans only read old entries.
    let event_time_is_key = event_time.is_some_and(|e| indices.contains(&e));
    if let Some(e) = event_time.filter(|_| event_time_is_key) {
        indices.retain(|&i| i != e);
        indices.insert(0, e);
    }
    let mut keys = Vec::with_capacity(indices.len());
    for index in indices {
        let field = input.field(index);
        if !key_type_supported(field.data_type()) {
            return Err(DedupError::UnsupportedKeyType {
                column: field.name().clone(),
                data_type: field.data_type().clone(),
            });
        }
        keys.push(KeyColumn {
            index,
            name: field.name().clone(),
            data_type: field.data_type().clone(),
        });
    }
    let expiry = if config.within_watermark {
        if event_time.is_none() {
            return Err(DedupError::WithinWatermarkWithoutWatermark);
        }
        if config.delay_ms < 0 {
            return Err(DedupError::NegativeDelay {
                delay_ms: config.delay_ms,
            });
        }
        Expiry::WithinWatermark {
            delay_micros: config.delay_ms.saturating_mul(1000),
        }
    } else if event_time_is_key {
        Expiry::EventTimeKey
    } else {
        Expiry::Never
    };
    Ok((keys, event_time, expiry))
}

/// Rows whose event time is `<= late_micros` (null: never late), and how many.
fn late_rows(
    ts: &arrow_array::PrimitiveArray<TimestampMicrosecondType>,
    late_micros: i64,
) -> (BooleanBuffer, u64) {
    let values = ts.values();
    let mut late = BooleanBuffer::collect_bool(values.len(), |i| values[i] <= late_micros);
    if let Some(nulls) = ts.nulls() {
        late = &late & nulls.inner();
    }
    let dropped = late.count_set_bits() as u64;
    (late, dropped)
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
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{ArrayRef, Int64Array, StringArray, TimestampMicrosecondArray};
    use arrow_schema::Schema;
    use tempfile::TempDir;

    use super::*;
    use crate::state::StoreKind;

    /// One minute in µs and in ms.
    const MIN: i64 = 60_000_000;
    const MIN_MS: i64 = 60_000;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("order_id", DataType::Int64, true),
            Field::new("status", DataType::Utf8, true),
            Field::new(
                "occurred_at",
                DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
                true,
            ),
        ]))
    }

    type Row = (Option<i64>, Option<&'static str>, Option<i64>);

    fn batch(rows: &[Row]) -> RecordBatch {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            )),
            Arc::new(
                TimestampMicrosecondArray::from(rows.iter().map(|r| r.2).collect::<Vec<_>>())
                    .with_timezone("+00:00"),
            ),
        ];
        RecordBatch::try_new(schema(), columns).expect("columns match the schema")
    }

    fn config(dir: &std::path::Path, keys: &[&str], event_time: bool) -> DedupConfig {
        DedupConfig {
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            within_watermark: false,
            event_time: event_time.then(|| "occurred_at".to_owned()),
            delay_ms: 10 * MIN_MS,
            num_partitions: 2,
            state_dir: dir.to_path_buf(),
            state: StateOptions {
                kind: StoreKind::Memory,
                ..StateOptions::default()
            },
            one_entry_per_key: false,
        }
    }

    fn open(config: DedupConfig, version: Option<u64>) -> DedupOperator {
        let mut op = DedupOperator::new(config, &schema()).expect("valid config");
        op.load(version).expect("state loads");
        op
    }

    /// Runs batch `id` with late-row watermark `late_ms` and watermark
    /// `wm_ms`, commits it, and returns the rows kept and the metrics.
    fn step(
        op: &mut DedupOperator,
        id: u64,
        late_ms: i64,
        wm_ms: i64,
        batches: &[&[Row]],
    ) -> (Vec<Row>, OperatorMetrics) {
        let input: Vec<RecordBatch> = batches.iter().map(|rows| batch(rows)).collect();
        let ctx = StatefulContext {
            batch_id: id,
            late_ms,
            watermark_ms: wm_ms,
        };
        let out = op.process(&ctx, &input).expect("batch runs");
        let metrics = op.commit(id).expect("state commits");
        (rows_of(&out), metrics)
    }

    fn rows_of(batches: &[RecordBatch]) -> Vec<Row> {
        let mut rows = Vec::new();
        for b in batches {
            let ids = b.column(0).as_primitive::<Int64Type>();
            let statuses = b.column(1).as_string::<i32>();
            let times = b.column(2).as_primitive::<TimestampMicrosecondType>();
            for r in 0..b.num_rows() {
                let status = statuses.is_valid(r).then(|| statuses.value(r));
                rows.push((
                    ids.is_valid(r).then(|| ids.value(r)),
                    // Tests only use these spellings; map back to 'static.
                    ["a", "b", "c", "d", "e"]
                        .into_iter()
                        .find(|s| Some(*s) == status),
                    times.is_valid(r).then(|| times.value(r)),
                ));
            }
        }
        rows
    }

    #[test]
    fn the_first_occurrence_of_a_key_is_kept_within_a_batch_and_across_batches() {
        let dir = TempDir::new().expect("tempdir");
        let mut op = open(config(dir.path(), &["order_id"], false), None);
        let (out, m) = step(
            &mut op,
            0,
            0,
            0,
            &[
                &[
                    (Some(1), Some("a"), Some(MIN)),
                    (Some(2), Some("b"), Some(MIN)),
                    (Some(1), Some("c"), Some(2 * MIN)),
                ],
                &[(Some(3), Some("d"), Some(MIN)), (Some(2), Some("e"), None)],
            ],
        );
        assert_eq!(
            out,
            vec![
                (Some(1), Some("a"), Some(MIN)),
                (Some(2), Some("b"), Some(MIN)),
                (Some(3), Some("d"), Some(MIN)),
            ]
        );
        assert_eq!(m.operator_name, "dedupe");
        assert_eq!((m.num_rows_total, m.num_rows_updated), (3, 3));
        assert_eq!(m.num_state_store_instances, 2);

        let (out, m) = step(
            &mut op,
            1,
            0,
            0,
            &[&[
                (Some(3), Some("a"), None),
                (Some(4), Some("b"), None),
                (Some(4), Some("c"), None),
            ]],
        );
        assert_eq!(out, vec![(Some(4), Some("b"), None)]);
        assert_eq!((m.num_rows_total, m.num_rows_updated), (4, 1));
        assert_eq!(m.num_rows_removed, 0);

        // A replay of batch 1 reloads version 0 and keeps what the first
        // attempt kept; a restarted operator reads the committed version.
        drop(op);
        let mut op = open(config(dir.path(), &["order_id"], false), Some(0));
        let (out, m) = step(
            &mut op,
            1,
            0,
            0,
            &[&[
                (Some(3), Some("a"), None),
                (Some(4), Some("b"), None),
                (Some(4), Some("c"), None),
            ]],
        );
        assert_eq!(out, vec![(Some(4), Some("b"), None)]);
        assert_eq!(m.num_rows_total, 4);
        drop(op);
        let mut op = open(config(dir.path(), &["order_id"], false), Some(1));
        let (out, m) = step(
            &mut op,
            2,
            0,
            0,
            &[&[(Some(1), Some("a"), None), (Some(5), Some("e"), None)]],
        );
        assert_eq!(out, vec![(Some(5), Some("e"), None)]);
        assert_eq!(m.num_rows_total, 5);
    }

    #[test]
    fn a_null_key_is_one_value_like_any_other() {
        let dir = TempDir::new().expect("tempdir");
        let mut op = open(config(dir.path(), &["order_id", "status"], false), None);
        let (out, m) = step(
            &mut op,
            0,
            0,
            0,
            &[&[
                (None, Some("a"), None),
                (None, Some("a"), Some(MIN)),
                (None, None, None),
                (None, None, Some(MIN)),
                (Some(1), None, None),
                (Some(1), Some("a"), None),
            ]],
        );
        assert_eq!(
            out,
            vec![
                (None, Some("a"), None),
                (None, None, None),
                (Some(1), None, None),
                (Some(1), Some("a"), None),
            ]
        );
        assert_eq!(m.num_rows_total, 4);
        let (out, _) = step(&mut op, 1, 0, 0, &[&[(None, None, Some(MIN))]]);
        assert!(out.is_empty(), "the null key is in state: {out:?}");
    }

    #[test]
    fn with_the_event_time_among_the_keys_state_is_evicted_by_the_watermark() {
        let dir = TempDir::new().expect("tempdir");
        let mut op = open(config(dir.path(), &["order_id", "occurred_at"], true), None);
        let (out, m) = step(
            &mut op,
            0,
            0,
            0,
            &[&[
                (Some(1), Some("a"), Some(MIN)),
                (Some(2), Some("a"), Some(2 * MIN)),
                (Some(3), Some("a"), Some(12 * MIN)),
                (Some(1), Some("b"), Some(MIN)),
                (Some(1), Some("c"), Some(MIN + 1)),
                (Some(9), Some("a"), None),
            ]],
        );
        assert_eq!(out.len(), 5, "{out:?}");
        assert_eq!(m.num_rows_total, 5);

        // No data, wm = 2 min: the keys at 1 min, 1 min + 1 µs and 2 min
        // (inclusive) leave; 12 min and the null event time stay.
        let (out, m) = step(&mut op, 1, 0, 2 * MIN_MS, &[]);
        assert!(out.is_empty());
        assert_eq!((m.num_rows_total, m.num_rows_removed), (2, 3));

        // Late rows (event time <= wm(b-1) = 2 min) are dropped before
        // deduplication and counted; a null event time is never late.
        let (out, m) = step(
            &mut op,
            2,
            2 * MIN_MS,
            2 * MIN_MS,
            &[&[
                (Some(1), Some("d"), Some(MIN)),
                (Some(2), Some("d"), Some(2 * MIN)),
                (Some(4), Some("d"), Some(2 * MIN + 1)),
                (Some(9), Some("d"), None),
                (Some(8), Some("d"), None),
            ]],
        );
        assert_eq!(
            out,
            vec![
                (Some(4), Some("d"), Some(2 * MIN + 1)),
                (Some(8), Some("d"), None),
            ]
        );
        assert_eq!(m.num_rows_dropped_by_watermark, 2);
        assert_eq!((m.num_rows_total, m.num_rows_updated), (4, 2));

        // A duplicate arriving in the batch whose watermark expires its key
        // is still a duplicate: eviction runs after the input.
        let (out, m) = step(
            &mut op,
            3,
            2 * MIN_MS,
            20 * MIN_MS,
            &[&[(Some(3), Some("e"), Some(12 * MIN))]],
        );
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(m.num_rows_dropped_by_watermark, 0);
        assert_eq!(
            (m.num_rows_total, m.num_rows_removed),
            (2, 2),
            "only the null event times remain"
        );
    }

    #[test]
    fn within_watermark_a_key_expires_at_its_event_time_plus_the_delay() {
        let dir = TempDir::new().expect("tempdir");
        let mut c = config(dir.path(), &["order_id"], true);
        c.within_watermark = true;
        let mut op = open(c, None);
        let (out, m) = step(
            &mut op,
            0,
            0,
            0,
            &[&[
                (Some(1), Some("a"), Some(MIN)),
                (Some(1), Some("b"), Some(30 * MIN)),
                (Some(2), Some("a"), None),
            ]],
        );
        assert_eq!(
            out,
            vec![(Some(1), Some("a"), Some(MIN)), (Some(2), Some("a"), None)]
        );
        assert_eq!(m.operator_name, "dedupeWithinWatermark");
        assert_eq!(m.num_rows_total, 2, "one row per key, not per store entry");

        // wm = 10 min: key 1 expires at 1 + 10 = 11 min and stays; key 2
        // (null event time, read as 0 like Spark) expires at 10 min.
        let (out, m) = step(
            &mut op,
            1,
            0,
            10 * MIN_MS,
            &[&[
                (Some(1), Some("c"), Some(5 * MIN)),
                (Some(2), Some("c"), None),
            ]],
        );
        assert!(out.is_empty(), "both are duplicates: {out:?}");
        assert_eq!((m.num_rows_total, m.num_rows_removed), (1, 1));

        let (out, m) = step(&mut op, 2, 10 * MIN_MS, 11 * MIN_MS - 1, &[]);
        assert!(out.is_empty());
        assert_eq!(m.num_rows_total, 1, "11 min - 1 ms does not reach 11 min");
        let (_, m) = step(&mut op, 3, 10 * MIN_MS, 11 * MIN_MS, &[]);
        assert_eq!((m.num_rows_total, m.num_rows_removed), (0, 1));

        // Expired keys are new again; late rows do not claim a key first.
        let (out, m) = step(
            &mut op,
            4,
            11 * MIN_MS,
            11 * MIN_MS,
            &[&[
                (Some(1), Some("d"), Some(11 * MIN)),
                (Some(1), Some("e"), Some(20 * MIN)),
                (Some(2), Some("e"), None),
            ]],
        );
        assert_eq!(
            out,
            vec![
                (Some(1), Some("e"), Some(20 * MIN)),
                (Some(2), Some("e"), None)
            ]
        );
        assert_eq!(m.num_rows_dropped_by_watermark, 1);
        // Key 2 (null event time) expired at once (0 + 10 min <= 11 min).
        assert_eq!((m.num_rows_total, m.num_rows_removed), (1, 1));
    }

    #[test]
    fn a_configuration_that_cannot_run_is_refused_naming_why() {
        let dir = TempDir::new().expect("tempdir");
        let mut c = config(dir.path(), &["order_id"], false);
        c.within_watermark = true;
        let err = DedupOperator::new(c, &schema()).expect_err("no watermark");
        assert!(err.to_string().contains("needs a watermark"), "{err}");
        let err = DedupOperator::new(config(dir.path(), &["nope"], false), &schema())
            .expect_err("unknown key");
        assert!(err.to_string().contains("\"nope\""), "{err}");
        assert!(
            err.to_string().contains("order_id, status, occurred_at"),
            "{err}"
        );
        let err = state_schema(
            &config(dir.path(), &["status"], false),
            &Arc::new(Schema::empty()),
        )
        .expect_err("unknown key");
        assert!(err.to_string().contains("\"status\""), "{err}");
    }

    #[test]
    fn the_state_schema_holds_only_the_keys_with_the_event_time_first() {
        let dir = TempDir::new().expect("tempdir");
        let s = state_schema(
            &config(dir.path(), &["order_id", "occurred_at"], true),
            &schema(),
        )
        .expect("valid config");
        let names: Vec<&str> = s.key.iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["occurred_at", "order_id"]);
        assert!(s.value.is_empty());
        let mut c = config(dir.path(), &["order_id"], true);
        c.within_watermark = true;
        let s = state_schema(&c, &schema()).expect("valid config");
        assert_eq!(s.key.len(), 1);
        assert_eq!(s.value[0].name(), "expires_at");
        assert!(!dir.path().join("0").exists(), "no store was opened");
        // One integer key, never evicted: stored as integer sets.
        let s = state_schema(&config(dir.path(), &["order_id"], true), &schema())
            .expect("valid config");
        assert_eq!(s.key.len(), 1);
        assert_eq!(s.value[0].name(), BUCKET_MEMBERS);
    }

    /// A small deterministic generator (xorshift) for the model tests.
    struct Xorshift(u64);

    impl Xorshift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// Dense runs, sparse and extreme values, nulls and late rows over many
    /// batches, with restarts and a replayed batch: the integer-set layout
    /// keeps exactly the rows a set of seen keys keeps, on both stores.
    #[test]
    fn the_integer_set_layout_keeps_what_a_set_of_keys_keeps() {
        for kind in [StoreKind::Memory, StoreKind::RocksDb] {
            let dir = TempDir::new().expect("tempdir");
            let mut cfg = config(dir.path(), &["order_id"], true);
            cfg.state.kind = kind;
            cfg.state.snapshot_interval = 3;
            let mut op = open(cfg.clone(), None);
            assert!(
                op.int_key.is_some(),
                "one integer key uses the integer sets"
            );
            let mut seen = HashSet::new();
            let mut rng = Xorshift(0x9e37_79b9_7f4a_7c15);
            let extremes = [
                i64::MIN,
                i64::MIN + 1,
                -4097,
                -4096,
                -1,
                0,
                4095,
                4096,
                i64::MAX,
            ];
            for id in 0..12u64 {
                let mut rows: Vec<Row> = Vec::new();
                let base = id as i64 * 3_000;
                for i in 0..2_000i64 {
                    let r = rng.next();
                    let key = match r % 10 {
                        // Dense: fills buckets past 256 members (bitmaps).
                        0..=5 => Some(base + i),
                        6 => Some(base + i - 2_500),
                        7 => Some((rng.next() >> 1) as i64 * if r & 1 == 0 { 1 } else { -1 }),
                        8 => Some(extremes[(r >> 8) as usize % extremes.len()]),
                        _ => None,
                    };
                    // Event times: some rows late against a watermark of 5 min.
                    let ts = if r.is_multiple_of(7) {
                        4 * MIN
                    } else {
                        10 * MIN
                    };
                    rows.push((key, Some("a"), Some(ts)));
                }
                let expected: Vec<Row> = rows
                    .iter()
                    .filter(|r| r.2 > Some(5 * MIN))
                    .filter(|r| seen.insert(r.0))
                    .copied()
                    .collect();
                let (out, m) = step(&mut op, id, 5 * MIN_MS, 5 * MIN_MS, &[&rows]);
                assert_eq!(out, expected, "{kind} batch {id}");
                assert_eq!(m.num_rows_total, seen.len() as u64, "{kind} batch {id}");
                assert_eq!(m.num_rows_updated, expected.len() as u64);
                assert_eq!(
                    m.num_rows_dropped_by_watermark,
                    rows.iter().filter(|r| r.2 <= Some(5 * MIN)).count() as u64
                );
                if id == 5 {
                    // Restart from the checkpoint: the same state and count.
                    drop(op);
                    op = open(cfg.clone(), Some(id));
                }
                if id == 8 {
                    // Batch 9 fails after processing and is replayed from 8.
                    let input = batch(&[(Some(-7_777_777), Some("a"), Some(10 * MIN))]);
                    let ctx = StatefulContext {
                        batch_id: 9,
                        late_ms: 0,
                        watermark_ms: 0,
                    };
                    assert_eq!(op.process(&ctx, &[input]).expect("runs")[0].num_rows(), 1);
                    op.load(Some(8)).expect("reloads version 8");
                }
            }
            // One entry per bucket (plus the null key and each partition's
            // count), not one per key.
            let buckets: HashSet<u64> = seen
                .iter()
                .flatten()
                .map(|&k| int_set::bucket_of(int_set::ordered(k)))
                .collect();
            let entries: u64 = op.stores.iter().map(|s| s.metrics().num_rows_total).sum();
            assert_eq!(entries, buckets.len() as u64 + 1 + 2, "{kind}");
            assert!(entries * 5 < seen.len() as u64, "{kind}: {entries} entries");
        }
    }

    #[test]
    fn a_corrupt_bucket_fails_the_batch_naming_the_store_and_bucket() {
        let dir = TempDir::new().expect("tempdir");
        let mut op = open(config(dir.path(), &["order_id"], false), None);
        step(&mut op, 0, 0, 0, &[&[(Some(5), Some("a"), None)]]);
        let mut key = [0u8; 9];
        key[0] = TAG_VALUE;
        key[1..].copy_from_slice(&int_set::bucket_of(int_set::ordered(5)).to_be_bytes());
        let p = (fnv1a(&key) % 2) as usize;
        op.stores[p].put(&key, &[0x07]).expect("put");
        let ctx = StatefulContext {
            batch_id: 1,
            late_ms: 0,
            watermark_ms: 0,
        };
        let err = op
            .process(&ctx, &[batch(&[(Some(6), Some("a"), None)])])
            .expect_err("corrupt bucket");
        let text = err.to_string();
        let bucket = int_set::bucket_of(int_set::ordered(5));
        assert!(text.contains(&format!("bucket {bucket}")), "{text}");
        assert!(text.contains("unknown container tag 0x07"), "{text}");
        assert!(
            text.contains(&dir.path().join(p.to_string()).display().to_string()),
            "{text}"
        );
    }
}
