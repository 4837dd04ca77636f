//! Per-batch operators between source and sink: stateless transforms (Wasm
//! or native Rust) behind [`BatchTransform`], so that the query loop treats
//! them alike and programs embedding the host can add their own; and
//! stateful operators (windowed aggregation, deduplication) behind
//! [`stateful::StatefulOperator`], which own their state stores while the
//! query loop owns time. Wasm transforms with keyed state
//! ([`wasm_state`]) stay transforms; the query loads and commits their state
//! with the operators'.

pub mod aggregate;
pub mod dedup;
mod int_set;
mod key_encoding;
pub mod stateful;
pub mod wasm_state;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::operator::wasm_state::KeyedState;
use crate::plugin::{BatchInfo, PluginError, PluginUsage, WasmTransform};

/// A transform failed a batch.
#[derive(Debug, thiserror::Error)]
pub enum TransformError {
    #[error(transparent)]
    Plugin(#[from] PluginError),
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

    /// For Wasm transforms: (name, sha256, usage), for progress.
    fn plugin_usage(&self) -> Option<(String, String, PluginUsage)> {
        None
    }

    /// For Wasm transforms: the plugin, for replacing it by a new build.
    fn wasm_plugin(&mut self) -> Option<&mut WasmTransform> {
        None
    }

    /// Whether the transform keeps keyed state (a Wasm component importing
    /// `keyed-state`), which the query then stores and versions.
    fn is_stateful(&self) -> bool {
        false
    }

    /// Gives a stateful transform its keyed state.
    fn attach_keyed_state(&mut self, _state: KeyedState) {}

    /// The keyed state given by [`Self::attach_keyed_state`].
    fn keyed_state_mut(&mut self) -> Option<&mut KeyedState> {
        None
    }
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

    fn plugin_usage(&self) -> Option<(String, String, PluginUsage)> {
        Some((
            self.name().to_owned(),
            self.sha256().to_owned(),
            self.usage().clone(),
        ))
    }

    fn wasm_plugin(&mut self) -> Option<&mut WasmTransform> {
        Some(self)
    }

    fn is_stateful(&self) -> bool {
        WasmTransform::is_stateful(self)
    }

    fn attach_keyed_state(&mut self, state: KeyedState) {
        self.attach_state(state);
    }

    fn keyed_state_mut(&mut self) -> Option<&mut KeyedState> {
        WasmTransform::keyed_state_mut(self)
    }
}
