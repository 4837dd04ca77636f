//! The contract between the query loop and stateful operators (windowed
//! aggregation, deduplication): the loop owns time — it hands every batch its
//! two watermarks and decides when a batch runs without data — while each
//! operator owns its state stores and what it emits.

use arrow_array::RecordBatch;
use arrow_schema::{ArrowError, Field, Schema, SchemaRef};
use serde::Serialize;

use crate::state::StateError;

/// What a stateful operator is told about the batch it runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatefulContext {
    pub batch_id: u64,
    /// wm(b−1) in ms: rows older than this are dropped as late (Spark ≥ 3.4).
    pub late_ms: i64,
    /// wm(b) in ms: what state this watermark passes is emitted and evicted.
    pub watermark_ms: i64,
}

/// The shape of an operator's state: what its state keys and values hold.
/// A checkpoint records it (DESIGN.md §3.3), because state written with one
/// shape cannot be read back with another — while anything else about the
/// input (a column no key or aggregate reads) may change freely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSchema {
    /// Spark's operator name (e.g. `stateStoreSave`, `dedupe`).
    pub operator: &'static str,
    /// The state key's columns, in key order.
    pub key: Vec<Field>,
    /// The state value's columns (aggregate buffers, expiry times).
    pub value: Vec<Field>,
}

/// Spark's `stateOperators[]` entry of a progress record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorMetrics {
    pub operator_name: String,
    pub num_rows_total: u64,
    pub num_rows_updated: u64,
    pub num_rows_removed: u64,
    pub memory_used_bytes: u64,
    /// Rows dropped as late, as Spark counts them: input rows for
    /// deduplication, partial aggregates (one per window and key in the
    /// batch) for aggregations.
    pub num_rows_dropped_by_watermark: u64,
    pub commit_time_ms: u64,
    pub num_state_store_instances: u64,
}

/// A stateful operator failed a batch.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("operator {operator}: {source}")]
    State {
        operator: String,
        source: StateError,
    },
    #[error("operator {operator}: {source}")]
    Arrow {
        operator: String,
        source: ArrowError,
    },
    #[error("operator {operator}: {message}")]
    Invalid { operator: String, message: String },
}

/// A stateful operator between the stateless transforms and the sink.
pub trait StatefulOperator: Send {
    /// The name in errors, logs and progress (e.g. `stateStoreSave`, `dedupe`).
    fn name(&self) -> &str;

    /// The schema of the rows [`Self::process`] returns.
    fn output_schema(&self) -> &SchemaRef;

    /// Restores the state committed by batch `version` (`None`: empty).
    ///
    /// # Errors
    /// When the state cannot be read.
    fn load(&mut self, version: Option<u64>) -> Result<(), StateError>;

    /// Runs one micro-batch (with no input rows for a no-data batch) and
    /// returns the rows for the sink.
    ///
    /// # Errors
    /// When the state cannot be read or written, or the input is not what
    /// the operator was configured for.
    fn process(
        &mut self,
        ctx: &StatefulContext,
        input: &[RecordBatch],
    ) -> Result<Vec<RecordBatch>, OperatorError>;

    /// Commits the state as version `batch_id`, after the sink wrote the batch.
    ///
    /// # Errors
    /// When the state cannot be made durable.
    fn commit(&mut self, batch_id: u64) -> Result<OperatorMetrics, StateError>;
}

/// Column index by name: exact match first, else the one column equal
/// ignoring ASCII case (Spark resolves column names case-insensitively).
pub(crate) fn resolve(schema: &Schema, name: &str) -> Option<usize> {
    if let Ok(i) = schema.index_of(name) {
        return Some(i);
    }
    let mut found = schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| f.name().eq_ignore_ascii_case(name));
    match (found.next(), found.next()) {
        (Some((i, _)), None) => Some(i),
        _ => None,
    }
}
