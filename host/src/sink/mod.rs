//! Where a query's output goes. Every sink is told the batch id, and every
//! built-in sink is idempotent by it: a batch replayed after a crash
//! replaces its own output instead of adding to it. That, with the offsets
//! log, is what makes the query exactly-once.
//!
//! # Layout
//! - `files`: one JSON-lines, CSV or Parquet file per batch.
//! - `console`: Spark's console sink, for people watching a terminal.
//! - `memory`: batches kept in memory, for programs embedding the host.
//! - `plugin`: a Wasm foreachBatch sink.
//! - [`kafka`]: a Kafka topic, one transaction per batch.
//! - `delta`: a Delta Lake table, one commit with a txn action per batch.
//! - [`delta_merge`]: MERGE (upsert by key) into a Delta table, one commit per batch.

pub mod console;
pub mod delta;
pub mod delta_merge;
mod encoding;
pub mod files;
pub mod kafka;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::plugin::{BatchInfo, PluginError, WasmSink};

/// A sink failed to take a batch.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("{0}")]
    Files(#[from] files::SinkFileError),
    #[error("console sink: {0}")]
    Console(std::io::Error),
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error(transparent)]
    Kafka(#[from] kafka::KafkaSinkError),
    /// Boxed: deltalake's errors are large, and every query result carries this type.
    #[error(transparent)]
    Delta(Box<delta::DeltaSinkError>),
    /// Boxed for the same reason.
    #[error(transparent)]
    DeltaMerge(Box<delta_merge::DeltaMergeError>),
    #[error("sink {sink}: cannot combine the batch's parts: {source}")]
    Arrow {
        sink: String,
        source: arrow_schema::ArrowError,
    },
}

impl From<delta::DeltaSinkError> for SinkError {
    fn from(e: delta::DeltaSinkError) -> Self {
        Self::Delta(Box::new(e))
    }
}

impl From<delta_merge::DeltaMergeError> for SinkError {
    fn from(e: delta_merge::DeltaMergeError) -> Self {
        Self::DeltaMerge(Box::new(e))
    }
}

impl SinkError {
    /// Whether writing the same batch again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Plugin(e) => e.is_retryable(),
            Self::Kafka(e) => e.is_retryable(),
            Self::Delta(e) => e.is_retryable(),
            Self::DeltaMerge(e) => e.is_retryable(),
            Self::Files(_) | Self::Console(_) => true,
            Self::Arrow { .. } => false,
        }
    }
}

/// The output end of a query.
pub trait Sink: Send {
    /// Spark's `sink.description` in progress records.
    fn description(&self) -> String;

    /// Writes the whole output of batch `info.batch_id` (which may be a
    /// replay of a batch written before a crash). Returns the rows written.
    ///
    /// # Errors
    /// When the output could not be written; the batch is then not committed.
    fn write_batch(
        &mut self,
        info: &BatchInfo,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<u64, SinkError>;

    /// The query is stopping after its last committed batch: make durable anything held back
    /// (the Delta sink's `commit_every`).
    ///
    /// # Errors
    /// When that fails; what was held back stays for the next run.
    fn close(&mut self) -> Result<(), SinkError> {
        Ok(())
    }

    /// Real-time mode: the sink's writer of a batch's parts as they pass, if it has one;
    /// without, the query holds the parts and hands them to [`Sink::write_batch`] when the
    /// batch ends.
    fn part_writer(&mut self) -> Option<&mut dyn PartWriter> {
        None
    }
}

/// Real-time mode (`query::real_time`): a sink that takes a batch's rows as its parts pass,
/// before the batch is durable, and makes them visible to readers of committed data only
/// when the batch ends, so that exactly-once holds per batch.
pub trait PartWriter {
    /// A batch's parts begin; after a failed attempt, what that attempt wrote is dropped.
    ///
    /// # Errors
    /// When what an earlier attempt wrote cannot be dropped.
    fn begin_parts(&mut self, info: &BatchInfo) -> Result<(), SinkError>;

    /// Writes one part's rows. Returns the rows written.
    ///
    /// # Errors
    /// When the rows could not be written; the batch then fails and runs again.
    fn write_part(
        &mut self,
        info: &BatchInfo,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<u64, SinkError>;

    /// The batch's parts are over and `offsets/N` records them: commit what they wrote.
    ///
    /// # Errors
    /// When the commit fails; the batch then runs again.
    fn finish_parts(&mut self, info: &BatchInfo) -> Result<(), SinkError>;
}

impl Sink for delta::DeltaSink {
    fn description(&self) -> String {
        delta::DeltaSink::description(self).to_owned()
    }

    fn write_batch(
        &mut self,
        info: &BatchInfo,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<u64, SinkError> {
        self.write(info, schema, batches)?;
        Ok(batches.iter().map(|b| b.num_rows() as u64).sum())
    }

    fn close(&mut self) -> Result<(), SinkError> {
        self.flush()?;
        Ok(())
    }
}

impl Sink for delta_merge::DeltaMerge {
    fn description(&self) -> String {
        delta_merge::DeltaMerge::description(self).to_owned()
    }

    fn write_batch(
        &mut self,
        info: &BatchInfo,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<u64, SinkError> {
        // MERGE sees the micro-batch whole: duplicates across its parts are duplicates.
        let batch = arrow_select::concat::concat_batches(schema, batches).map_err(|source| {
            SinkError::Arrow {
                sink: delta_merge::DeltaMerge::description(self).to_owned(),
                source,
            }
        })?;
        self.merge(info.batch_id, &batch)?;
        Ok(batch.num_rows() as u64)
    }
}

/// One file per batch, named by batch id.
#[derive(Debug)]
pub struct FilesSink {
    writer: files::FilesWriter,
    description: String,
}

impl FilesSink {
    /// A sink writing into `dir`; leftovers of crashed attempts are removed.
    ///
    /// # Errors
    /// When leftover temporary files cannot be removed.
    pub fn new(
        dir: std::path::PathBuf,
        format: crate::spec::OutputFormat,
    ) -> Result<Self, SinkError> {
        let description = format!("FileSink[{}]", dir.display());
        let writer = files::FilesWriter::new(dir, format);
        writer.clean_temp_files()?;
        Ok(Self {
            writer,
            description,
        })
    }

    /// Encodes a Parquet file's columns on the free ones of the query's `threads`.
    #[must_use]
    pub fn with_threads(mut self, threads: crate::threads::Threads) -> Self {
        self.writer = self.writer.with_threads(threads);
        self
    }
}

impl Sink for FilesSink {
    fn description(&self) -> String {
        self.description.clone()
    }

    fn write_batch(
        &mut self,
        info: &BatchInfo,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<u64, SinkError> {
        Ok(self
            .writer
            .write_batch(info.batch_id, schema, batches)?
            .rows as u64)
    }
}

/// Prints each batch, like Spark's console sink.
pub struct ConsoleSink {
    writer: console::ConsoleWriter<Box<dyn Write + Send>>,
}

impl std::fmt::Debug for ConsoleSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConsoleSink")
    }
}

impl ConsoleSink {
    pub fn new(out: Box<dyn Write + Send>, max_rows: usize) -> Self {
        Self {
            writer: console::ConsoleWriter::new(out, max_rows),
        }
    }
}

impl Sink for ConsoleSink {
    fn description(&self) -> String {
        "ConsoleSink".into()
    }

    fn write_batch(
        &mut self,
        info: &BatchInfo,
        _schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<u64, SinkError> {
        let rows = batches.iter().map(|b| b.num_rows() as u64).sum();
        self.writer
            .write_batch(info.batch_id, batches)
            .map_err(|e| SinkError::Console(std::io::Error::other(e.to_string())))?;
        Ok(rows)
    }
}

/// The output of each batch, by batch id; a replay replaces its batch.
pub type MemoryTable = Arc<Mutex<BTreeMap<u64, Vec<RecordBatch>>>>;

/// Keeps every batch in memory, for programs that embed the host.
#[derive(Debug, Default, Clone)]
pub struct MemorySink {
    table: MemoryTable,
}

impl MemorySink {
    pub fn new() -> Self {
        Self::default()
    }

    /// A handle on the batches written so far.
    pub fn table(&self) -> MemoryTable {
        Arc::clone(&self.table)
    }
}

impl Sink for MemorySink {
    fn description(&self) -> String {
        "MemorySink".into()
    }

    fn write_batch(
        &mut self,
        info: &BatchInfo,
        _schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<u64, SinkError> {
        let rows = batches.iter().map(|b| b.num_rows() as u64).sum();
        // A poisoned lock only means another thread panicked while holding
        // it; the map itself is still consistent, so keep going.
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.insert(info.batch_id, batches.to_vec());
        Ok(rows)
    }
}

/// A Wasm foreachBatch sink: one call per micro-batch with its batch id.
#[derive(Debug)]
pub struct PluginSink {
    plugin: WasmSink,
}

impl PluginSink {
    pub fn new(plugin: WasmSink) -> Self {
        Self { plugin }
    }

    /// The plugin, for its build and usage in progress.
    pub fn plugin(&self) -> &WasmSink {
        &self.plugin
    }

    /// The plugin, for replacing it by a new build.
    pub fn plugin_mut(&mut self) -> &mut WasmSink {
        &mut self.plugin
    }
}

impl Sink for PluginSink {
    fn description(&self) -> String {
        format!("ForeachBatchSink[{}]", self.plugin.name())
    }

    fn write_batch(
        &mut self,
        info: &BatchInfo,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<u64, SinkError> {
        // foreachBatch sees the micro-batch as one batch, in one call.
        let batch = arrow_select::concat::concat_batches(schema, batches).map_err(|source| {
            SinkError::Arrow {
                sink: self.description(),
                source,
            }
        })?;
        self.plugin.write_batch(&batch, info)?;
        Ok(batch.num_rows() as u64)
    }
}
