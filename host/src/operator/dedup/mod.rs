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
//! column by column into one reused buffer, duplicates are found with a hash
//! set before the state is asked, each partition's store is asked once for all
//! its distinct keys in key order (one batched lookup, not one per key), and
//! each input batch is cut with one Arrow filter. The per-key layout takes a
//! micro-batch's input batches together (up to [`CHUNK_ROWS`] rows), so a
//! store is asked once per micro-batch rather than once per input batch, and
//! its new keys join the batch's writes in one sorted pass.
//!
//! # Layout
//! - this file: the configuration, its planning against the input schema
//!   (key columns, event time, eviction rule, which state layout), the
//!   operator and which layout a checkpoint keeps;
//! - [`per_key`]: one state entry per key (any key columns, eviction by
//!   event time or within the watermark);
//! - [`int_set`]: one integer key that is never evicted, stored as sets of
//!   integers.
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
use std::path::PathBuf;

use arrow_array::types::TimestampMicrosecondType;
use arrow_array::{Array, BooleanArray, RecordBatch};
use arrow_buffer::BooleanBuffer;
use arrow_schema::{DataType, Field, SchemaRef, TimeUnit};
use arrow_select::filter::filter_record_batch;

use crate::operator::key_encoding::key_type_supported;
use crate::operator::partitioned::{CountEntry, KeyCount, PartitionedConfig, PartitionedState};
use crate::operator::stateful::{
    OperatorError, OperatorMetrics, StateSchema, StatefulContext, StatefulOperator, resolve,
};
use crate::state::{StateError, StateOptions};

mod int_set;
mod per_key;
#[cfg(test)]
mod tests;

pub use int_set::BUCKET_MEMBERS;
use int_set::{COUNT_KEY, IntKey};

/// Input rows the per-key layout takes in one pass (whole input batches; one larger batch
/// is taken alone): large enough that a pass's sort and batched lookup are worth their fixed
/// cost, small enough that its buffers (about 40 bytes a row) stay a few megabytes.
const CHUNK_ROWS: usize = 1 << 18;

/// Spark's `shortName` of `StreamingDeduplicateExec`.
const NAME_DEDUP: &str = "dedupe";
/// Spark's `shortName` of `StreamingDeduplicateWithinWatermarkExec`.
const NAME_WITHIN_WATERMARK: &str = "dedupeWithinWatermark";

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

/// One key column, in state-key order.
#[derive(Debug, Clone)]
struct KeyColumn {
    index: usize,
    name: String,
    data_type: DataType,
}

/// Buffers reused from pass to pass (one input batch of the integer-set layout, one chunk of
/// a micro-batch's input of the per-key layout), kept to avoid reallocating them every time.
#[derive(Debug, Default)]
struct Scratch {
    /// Encoded keys of all rows, back to back.
    keys: Vec<u8>,
    /// `keys[ends[r - 1]..ends[r]]` is row r's key (empty for late rows).
    ends: Vec<usize>,
    /// Row ids (in the chunk) of first occurrences, grouped by partition.
    candidates: Vec<u32>,
    /// Within the watermark: when each row's key would expire (µs).
    expires: Vec<i64>,
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
    /// The stores; with integer sets, counting keys under [`COUNT_KEY`].
    state: PartitionedState,
    scratch: Scratch,
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
            .field("partitions", &self.state.partitions())
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
        let count = match (int_key, expiry) {
            (Some(_), _) => KeyCount::Stored(CountEntry::BigEndian(COUNT_KEY)),
            // Two store entries (key and expiry index) per deduplicated key.
            (None, Expiry::WithinWatermark { .. }) => KeyCount::Entries { per_key: 2 },
            (None, Expiry::Never | Expiry::EventTimeKey) => KeyCount::Entries { per_key: 1 },
        };
        let state = PartitionedState::open(&PartitionedConfig {
            dir: &config.state_dir,
            partitions: config.num_partitions,
            options: &config.state,
            count,
        })
        .map_err(|source| OperatorError::State {
            operator: name.to_owned(),
            source,
        })?;
        Ok(Self {
            name,
            schema: input.clone(),
            keys,
            event_time,
            expiry,
            int_key,
            state,
            scratch: Scratch::default(),
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
    /// earlier rows), storing the keys of the rows it keeps: the integer-set layout.
    fn process_batch(
        &mut self,
        kind: IntKey,
        late_micros: i64,
        batch: &RecordBatch,
    ) -> Result<Option<RecordBatch>, OperatorError> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(None);
        }
        if n > u32::MAX as usize {
            return Err(self.invalid_rows(n));
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = self.dedup_int_set(kind, late_micros, batch, &mut scratch);
        self.scratch = scratch;
        self.keep_rows(batch, result?)
    }

    /// Deduplicates a micro-batch's input against the state and its own earlier rows,
    /// storing the keys of the rows it keeps: the per-key layout, consecutive input batches
    /// taken as one up to [`CHUNK_ROWS`] rows (so that the buffers of one pass stay bounded
    /// however large the micro-batch; a later chunk sees an earlier one's keys among the
    /// batch's writes, so the result is the same).
    fn process_input(
        &mut self,
        late_micros: i64,
        input: &[RecordBatch],
    ) -> Result<Vec<RecordBatch>, OperatorError> {
        let mut out = Vec::with_capacity(input.len());
        let mut rest = input;
        while !rest.is_empty() {
            let mut rows = rest[0].num_rows();
            let mut take = 1;
            while let Some(next) = rest.get(take)
                && rows + next.num_rows() <= CHUNK_ROWS
            {
                rows += next.num_rows();
                take += 1;
            }
            let (chunk, after) = rest.split_at(take);
            rest = after;
            let mut scratch = std::mem::take(&mut self.scratch);
            let result = self.dedup_rows(late_micros, chunk, &mut scratch);
            self.scratch = scratch;
            for (batch, keep) in chunk.iter().zip(result?) {
                if let Some(kept) = self.keep_rows(batch, keep)? {
                    out.push(kept);
                }
            }
        }
        Ok(out)
    }

    /// The rows of `batch` that `keep` marks (`None` when it marks none).
    fn keep_rows(
        &self,
        batch: &RecordBatch,
        keep: BooleanBuffer,
    ) -> Result<Option<RecordBatch>, OperatorError> {
        let n = batch.num_rows();
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
        self.state.load(version)?;
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
        for batch in input {
            self.check_input(batch).map_err(|e| self.invalid(e))?;
        }
        let out = match self.int_key {
            Some(kind) => {
                let mut out = Vec::with_capacity(input.len());
                for batch in input {
                    if let Some(kept) = self.process_batch(kind, late_micros, batch)? {
                        out.push(kept);
                    }
                }
                out
            }
            None => self.process_input(late_micros, input)?,
        };
        // Spark evicts after the whole input (so a row that arrives in the
        // batch that expires its key is still recognised as a duplicate).
        self.evict(ctx.watermark_ms)
            .map_err(|e| self.state_error(e))?;
        Ok(out)
    }

    fn commit(&mut self, batch_id: u64) -> Result<OperatorMetrics, StateError> {
        let metrics = self
            .state
            .commit(batch_id, self.name, self.rows_dropped_late)?;
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

/// Keeps the state layout a checkpoint's deduplication was written with,
/// given the state value columns its fingerprint records (`recorded_value`):
/// one integer key stays one entry per key in a checkpoint written before
/// integer sets (no `bucket_members` column), so that its state is read as
/// written and its fingerprint matches as before; a new checkpoint stores
/// one integer key as integer sets. Returns the state schema when the
/// layout changed.
///
/// # Errors
/// As [`state_schema`].
pub fn keep_recorded_layout(
    config: &mut DedupConfig,
    recorded_value: &[String],
    input: &SchemaRef,
) -> Result<Option<StateSchema>, OperatorError> {
    let planned = state_schema(config, input)?;
    let uses_sets = planned.value.iter().any(|f| f.name() == BUCKET_MEMBERS);
    let recorded_sets = recorded_value.iter().any(|c| c == BUCKET_MEMBERS);
    if !uses_sets || recorded_sets {
        return Ok(None);
    }
    config.one_entry_per_key = true;
    tracing::info!(
        "the checkpoint's deduplication state has one entry per key (written before \
         integer sets): it keeps that layout; a new checkpoint stores one integer key \
         as integer sets"
    );
    state_schema(config, input).map(Some)
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
