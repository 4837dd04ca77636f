//! The transforms and the sink as the query holds them. A Wasm plugin is
//! held as itself, beside the trait objects of native stages, because the
//! query does more with it than run it: it replaces the plugin by a new
//! build (`reload`), reports its usage in progress, and loads and commits
//! its keyed state with the batch (a [`StatefulStage`], as the stateful
//! operator is). The traits [`BatchTransform`] and [`Sink`] stay what every
//! stage is, without optional methods that only one kind of stage implements.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::operator::join::StreamJoin;
use crate::operator::stateful::{OperatorMetrics, StatefulOperator};
use crate::operator::wasm_state::KeyedState;
use crate::operator::{BatchTransform, TransformError};
use crate::plugin::{BatchInfo, PluginUsage, WasmSink, WasmTransform};
use crate::sink::{PluginSink, Sink, SinkError};
use crate::sql::SqlTransform;
use crate::state::StateError;

/// A plugin's name, build (sha256) and usage so far, for progress.
pub(super) type Usage = (String, String, PluginUsage);

/// One transform of the query.
pub(super) enum Transform {
    /// Added by a program embedding the host.
    Native(Box<dyn BatchTransform>),
    /// A `[[transform]] plugin` of the pipeline file.
    Wasm(Box<WasmTransform>),
    /// A `[[transform]] sql` of the pipeline file.
    Sql(Box<SqlTransform>),
}

impl Transform {
    pub(super) fn name(&self) -> &str {
        match self {
            Self::Native(t) => t.name(),
            Self::Wasm(t) => t.name(),
            Self::Sql(t) => t.name(),
        }
    }

    pub(super) fn output_schema(&self) -> &SchemaRef {
        match self {
            Self::Native(t) => t.output_schema(),
            Self::Wasm(t) => t.output_schema(),
            Self::Sql(t) => t.output_schema(),
        }
    }

    pub(super) fn process(
        &mut self,
        batch: &RecordBatch,
        info: &BatchInfo,
    ) -> Result<RecordBatch, TransformError> {
        match self {
            Self::Native(t) => t.process(batch, info),
            Self::Wasm(t) => Ok(t.process(batch, info)?),
            Self::Sql(t) => Ok(t.process(batch, info)?),
        }
    }

    /// The Wasm plugin, for replacing it by a new build.
    pub(super) fn wasm_mut(&mut self) -> Option<&mut WasmTransform> {
        match self {
            Self::Native(_) | Self::Sql(_) => None,
            Self::Wasm(t) => Some(t),
        }
    }

    /// Whether the transform keeps keyed state (a Wasm component importing
    /// `keyed-state`), which the query then stores and versions.
    pub(super) fn is_stateful(&self) -> bool {
        matches!(self, Self::Wasm(t) if t.is_stateful())
    }

    /// The keyed state of a stateful Wasm transform, once attached.
    pub(super) fn keyed_state_mut(&mut self) -> Option<&mut KeyedState> {
        match self {
            Self::Native(_) | Self::Sql(_) => None,
            Self::Wasm(t) => t.keyed_state_mut(),
        }
    }

    /// For a Wasm transform: its build and usage, for progress.
    pub(super) fn plugin_usage(&self) -> Option<Usage> {
        match self {
            Self::Native(_) | Self::Sql(_) => None,
            Self::Wasm(t) => Some(usage(t.name(), t.sha256(), t.usage())),
        }
    }
}

/// A stage whose state the query loads before each batch and commits after it: the
/// stateful operator (`[aggregate]`, `[deduplicate]`) or the keyed state of a Wasm transform.
pub(super) enum StatefulStage<'a> {
    /// A stream-stream join's buffers.
    Join(&'a mut StreamJoin),
    Operator(&'a mut dyn StatefulOperator),
    Keyed(&'a mut KeyedState),
}

impl StatefulStage<'_> {
    /// Restores the state committed by batch `version` (`None`: empty), dropping what an
    /// earlier attempt wrote, for a batch whose watermark is `watermark_ms` (what keyed
    /// state expires by; the operator is handed its watermarks with each batch instead).
    pub(super) fn load(self, version: Option<u64>, watermark_ms: i64) -> Result<(), StateError> {
        match self {
            Self::Join(join) => join.load(version),
            Self::Operator(op) => op.load(version),
            Self::Keyed(state) => state.load(version, watermark_ms),
        }
    }

    /// Commits the state as version `batch_id`, after the sink wrote the batch.
    pub(super) fn commit(self, batch_id: u64) -> Result<OperatorMetrics, StateError> {
        match self {
            Self::Join(join) => join.commit(batch_id),
            Self::Operator(op) => op.commit(batch_id),
            Self::Keyed(state) => state.commit(batch_id),
        }
    }
}

/// The sink of the query, with what it has not yet been handed of a real-time batch.
pub(super) struct QuerySink {
    kind: SinkKind,
    /// Real-time mode, a sink without a [`PartWriter`]: the batch's rows so far, written as
    /// one batch when its parts end.
    held: Vec<RecordBatch>,
}

enum SinkKind {
    Native(Box<dyn Sink>),
    /// A Wasm foreachBatch sink.
    Wasm(Box<PluginSink>),
}

impl QuerySink {
    pub(super) fn native(sink: Box<dyn Sink>) -> Self {
        Self {
            kind: SinkKind::Native(sink),
            held: Vec::new(),
        }
    }

    pub(super) fn wasm(sink: Box<PluginSink>) -> Self {
        Self {
            kind: SinkKind::Wasm(sink),
            held: Vec::new(),
        }
    }

    fn sink(&self) -> &dyn Sink {
        match &self.kind {
            SinkKind::Native(s) => s.as_ref(),
            SinkKind::Wasm(s) => s.as_ref(),
        }
    }

    fn sink_mut(&mut self) -> &mut dyn Sink {
        match &mut self.kind {
            SinkKind::Native(s) => s.as_mut(),
            SinkKind::Wasm(s) => s.as_mut(),
        }
    }

    pub(super) fn description(&self) -> String {
        self.sink().description()
    }

    pub(super) fn write_batch(
        &mut self,
        info: &BatchInfo,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<u64, SinkError> {
        self.sink_mut().write_batch(info, schema, batches)
    }

    /// Real-time mode: a batch's parts begin (again, after a failed attempt).
    pub(super) fn begin_parts(&mut self, info: &BatchInfo) -> Result<(), SinkError> {
        self.held.clear();
        match self.sink_mut().part_writer() {
            Some(writer) => writer.begin_parts(info),
            None => Ok(()),
        }
    }

    /// Real-time mode: one part's rows, written now by a sink that can, else held. The rows
    /// written now.
    pub(super) fn write_part(
        &mut self,
        info: &BatchInfo,
        schema: &SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Result<u64, SinkError> {
        match self.sink_mut().part_writer() {
            Some(writer) => writer.write_part(info, schema, &batches),
            None => {
                self.held.extend(batches);
                Ok(0)
            }
        }
    }

    /// Real-time mode: the batch's parts are over (and recorded in `offsets/N`): the sink
    /// commits them, or is handed what was held. The rows written now.
    pub(super) fn finish_parts(
        &mut self,
        info: &BatchInfo,
        schema: &SchemaRef,
    ) -> Result<u64, SinkError> {
        if let Some(writer) = self.sink_mut().part_writer() {
            writer.finish_parts(info)?;
            return Ok(0);
        }
        let held = std::mem::take(&mut self.held);
        self.sink_mut().write_batch(info, schema, &held)
    }

    /// Whether the sink writes a real-time batch's rows as they pass.
    pub(super) fn writes_parts(&mut self) -> bool {
        self.sink_mut().part_writer().is_some()
    }

    pub(super) fn close(&mut self) -> Result<(), SinkError> {
        self.sink_mut().close()
    }

    /// The Wasm plugin, for replacing it by a new build.
    pub(super) fn wasm_mut(&mut self) -> Option<&mut WasmSink> {
        match &mut self.kind {
            SinkKind::Native(_) => None,
            SinkKind::Wasm(s) => Some(s.plugin_mut()),
        }
    }

    /// For a Wasm sink: its build and usage, for progress.
    pub(super) fn plugin_usage(&self) -> Option<Usage> {
        match &self.kind {
            SinkKind::Native(_) => None,
            SinkKind::Wasm(s) => {
                let p = s.plugin();
                Some(usage(p.name(), p.sha256(), p.usage()))
            }
        }
    }
}

fn usage(name: &str, sha256: &str, usage: &PluginUsage) -> Usage {
    (name.to_owned(), sha256.to_owned(), usage.clone())
}
