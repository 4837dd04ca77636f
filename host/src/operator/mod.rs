//! Per-batch operators between source and sink: stateless transforms (Wasm
//! or native Rust) behind [`BatchTransform`], so that the query loop treats
//! them alike and programs embedding the host can add their own; and
//! stream-static joins ([`join`]), which hold a static table in memory; and
//! stateful operators (windowed aggregation, deduplication) behind
//! [`stateful::StatefulOperator`], which own their state stores while the
//! query loop owns time. Wasm transforms with keyed state
//! ([`wasm_state`]) stay transforms; the query holds them as themselves and
//! loads and commits their state with the operators'. All three keep their
//! state in `partitioned::PartitionedState`: N stores, key routing,
//! load and commit, key counts and progress figures.

pub mod aggregate;
pub mod dedup;
pub mod join;
mod key_encoding;
mod partitioned;
pub mod stateful;
pub mod wasm_state;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::plugin::{BatchInfo, PluginError, WasmTransform};

/// A transform failed a batch.
#[derive(Debug, thiserror::Error)]
pub enum TransformError {
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error(transparent)]
    Sql(#[from] crate::sql::SqlError),
    #[error("transform {name} failed batch {batch_id}: {message}")]
    Native {
        name: String,
        batch_id: u64,
        message: String,
    },
}

impl TransformError {
    /// Whether running the batch again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Plugin(e) => e.is_retryable(),
            Self::Sql(e) => e.is_retryable(),
            Self::Native { .. } => false,
        }
    }
}

/// A stateless batch-to-batch transform.
pub trait BatchTransform: Send {
    /// The name used in errors, logs and progress.
    fn name(&self) -> &str;

    /// The schema of the batches [`Self::process`] returns.
    fn output_schema(&self) -> &SchemaRef;

    /// Transforms one batch.
    ///
    /// # Errors
    /// When the batch cannot be transformed; it is then not committed.
    fn process(
        &mut self,
        batch: &RecordBatch,
        info: &BatchInfo,
    ) -> Result<RecordBatch, TransformError>;
}

impl BatchTransform for WasmTransform {
    fn name(&self) -> &str {
        WasmTransform::name(self)
    }

    fn output_schema(&self) -> &SchemaRef {
        WasmTransform::output_schema(self)
    }

    fn process(
        &mut self,
        batch: &RecordBatch,
        info: &BatchInfo,
    ) -> Result<RecordBatch, TransformError> {
        Ok(WasmTransform::process(self, batch, info)?)
    }
}
