//! Where a query's input comes from. A source plans a batch (which data it
//! will read, recorded in the checkpoint before anything runs) and later
//! reads exactly that data, as often as a replay asks for it.
//!
//! Every source kind implements [`Source`], so the query loop is the same
//! for all of them and a query may union several sources, each with its own
//! log under `sources/<index>/` and its own event-time watermark.
//!
//! # Layout
//! - `files`: a folder of JSON-lines, CSV or Parquet files, new files each batch.
//! - [`kafka`]: Kafka topics, a range of offsets per partition each batch.
//! - [`delta`]: a Delta Lake table, the files its new versions append.

pub mod delta;
pub mod files;
pub mod kafka;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_schema::SchemaRef;

pub use delta::{DeltaFile, DeltaInput, DeltaSource, DeltaSourceError};
pub use files::{FileDecoder, FileEntry, FilesSource, SourceError};

use crate::checkpoint::Checkpoint;
use crate::decode::{self, Decoded, Decoder, DecoderOptions};
use crate::spec::{self, SourceKind, SourceSpec};

/// Rows per decoded batch.
pub(crate) const DECODE_BATCH_ROWS: usize = 65_536;

/// A stream of input, planned and read batch by batch.
///
/// The protocol, per batch N: [`Source::poll`] stages what N would read;
/// the query decides whether N runs at all (some source staged input, or a
/// no-data batch is due) and then calls [`Source::record`], which writes the
/// staged input to the source's log *before* `offsets/N`; [`Source::read`]
/// reads exactly what the log says, on the first run and on every replay.
pub trait Source: Send {
    /// The source's name in the pipeline file.
    fn name(&self) -> &str;

    /// Spark's `sources[].description`.
    fn description(&self) -> String;

    /// The schema of the rows [`Source::read`] returns.
    fn schema(&self) -> &SchemaRef;

    /// Available-now trigger: from now on, stage only what is available at
    /// this moment, so that the query ends once that is processed.
    ///
    /// # Errors
    /// When the source cannot be listed or asked for its latest offsets.
    fn freeze_available(&mut self) -> Result<(), SourceError>;

    /// Stages the input of the next batch (honouring the rate limit unless
    /// `unlimited`) and returns how much was staged in the source's unit
    /// (files, records); 0 when there is nothing new.
    ///
    /// # Errors
    /// When the source cannot be listed or asked for its latest offsets.
    fn poll(&mut self, checkpoint: &Checkpoint, unlimited: bool) -> Result<u64, SourceError>;

    /// Writes the staged input (possibly nothing) to the source log as
    /// batch `batch_id`, and moves past it. Returns what the source keeps in
    /// `offsets/N` itself (Kafka's offsets, as Spark keeps them there); the
    /// query writes it and hands it back to [`Source::read`].
    ///
    /// # Errors
    /// When the log entry cannot be written.
    fn record(&mut self, checkpoint: &Checkpoint, batch_id: u64) -> Result<Recorded, SourceError>;

    /// Reads and decodes exactly the input recorded for `batch_id`.
    ///
    /// # Errors
    /// When the log entry is missing, the input cannot be read or has
    /// changed, or a record is malformed under the `fail` policy.
    fn read(
        &mut self,
        checkpoint: &Checkpoint,
        batch_id: u64,
        recorded: &Recorded,
    ) -> Result<SourceBatch, SourceError>;

    /// Where a malformed record goes under `on_malformed = "dead-letter"`.
    fn dead_letter_dir(&self) -> Option<&std::path::Path>;

    /// Real-time mode (`query::real_time`): the next part of batch `batch_id`, read as soon as
    /// input arrives. Waits up to `wait` for input; once some has arrived, takes what arrives
    /// within `linger` more. Returns what [`Source::record`] would have recorded for exactly
    /// this part, with its rows; `None` when nothing arrived. Nothing is written to the
    /// checkpoint but what [`Source::record`] writes.
    ///
    /// The default stages with [`Source::poll`] (looking again every [`POLL_STEP`]) and reads
    /// what it staged; a source that can be read continuously does better.
    ///
    /// # Errors
    /// As [`Source::poll`], [`Source::record`] and [`Source::read`].
    fn arrive(
        &mut self,
        checkpoint: &Checkpoint,
        batch_id: u64,
        wait: Duration,
        _linger: Duration,
    ) -> Result<Option<Part>, SourceError> {
        let until = Instant::now() + wait;
        loop {
            if self.poll(checkpoint, false)? > 0 {
                let recorded = self.record(checkpoint, batch_id)?;
                let batch = self.read(checkpoint, batch_id, &recorded)?;
                return Ok(Some(Part {
                    recorded,
                    batch,
                    event_ms: Vec::new(),
                }));
            }
            let now = Instant::now();
            if now >= until {
                return Ok(None);
            }
            std::thread::sleep((until - now).min(POLL_STEP));
        }
    }

    /// Stop reading ahead: in real-time mode, the parts of a batch are over (until the next
    /// [`Source::arrive`], and before any [`Source::read`]); in any mode, the query stops.
    fn end_parts(&mut self) {}

    /// Real-time mode: the entry of `offsets/N` for batch `batch_id` made of `parts` (in the
    /// order they arrived; none for a batch without input), which [`Source::read`] would read
    /// at once, and the cuts between the parts, from which [`Source::split_parts`] gives the
    /// parts back for a replay.
    ///
    /// # Errors
    /// When the source does not run in real-time mode (validation refuses it first), or an
    /// empty batch cannot be recorded.
    fn join_parts(
        &mut self,
        checkpoint: &Checkpoint,
        batch_id: u64,
        parts: Vec<Recorded>,
    ) -> Result<(Recorded, serde_json::Value), SourceError> {
        let _ = (checkpoint, parts);
        Err(SourceError::Parts {
            source_name: self.name().to_owned(),
            batch_id,
            problem: "cannot be made: this kind of source does not run in real-time mode"
                .to_owned(),
        })
    }

    /// Real-time mode: the parts of batch `batch_id` from the entry and cuts
    /// [`Source::join_parts`] made.
    ///
    /// # Errors
    /// When the cuts do not fit the entry.
    fn split_parts(
        &self,
        batch_id: u64,
        whole: &Recorded,
        cuts: &serde_json::Value,
    ) -> Result<Vec<Recorded>, SourceError> {
        let _ = (whole, cuts);
        Err(SourceError::Parts {
            source_name: self.name().to_owned(),
            batch_id,
            problem: "cannot be read: this kind of source does not run in real-time mode"
                .to_owned(),
        })
    }
}

/// How often the default [`Source::arrive`] looks for new input.
pub const POLL_STEP: Duration = Duration::from_millis(10);

/// One part of a real-time batch (see [`Source::arrive`]).
#[derive(Debug)]
pub struct Part {
    /// What [`Source::record`] would have recorded for this part.
    pub recorded: Recorded,
    pub batch: SourceBatch,
    /// When each input row was produced (ms since the epoch), where the source knows it
    /// (Kafka's record timestamps), for the latency of real-time progress.
    pub event_ms: Vec<i64>,
}

/// A source's own fields of its `offsets/N` entry.
pub type Recorded = serde_json::Map<String, serde_json::Value>;

/// What one source read for one batch.
#[derive(Debug, Default)]
pub struct SourceBatch {
    pub decoded: Decoded,
    /// Spark's `sources[].startOffset` (absent for the first batch).
    pub start_offset: Option<serde_json::Value>,
    /// Spark's `sources[].endOffset`.
    pub end_offset: serde_json::Value,
    /// Spark's `sources[].latestOffset`: the newest input known when planned.
    pub latest_offset: serde_json::Value,
    /// Spark's `sources[].metrics`.
    pub metrics: BTreeMap<&'static str, String>,
}

/// The schema of the batches `spec` will produce, when the pipeline file
/// alone says it (files and Kafka; a Delta table's schema is the table's, a
/// Parquet files source's without `schema` its first file's).
/// `weir validate` plans SQL transforms against it.
pub fn schema_before_open(spec: &SourceSpec) -> Option<SchemaRef> {
    let decoded = |schema: &SchemaRef, policy| {
        Decoder::new(
            Arc::clone(schema),
            DecoderOptions {
                policy,
                ..DecoderOptions::default()
            },
        )
        .ok()
        .map(|d| Arc::clone(d.output_schema()))
    };
    match &spec.kind {
        SourceKind::Files(files) => match (&files.format, &files.schema) {
            // No `_corrupt_record` column: Parquet has no malformed rows.
            (spec::InputFormat::Parquet, Some(schema)) => {
                decode::ParquetDecoder::new(Arc::clone(schema), DECODE_BATCH_ROWS)
                    .ok()
                    .map(|d| Arc::clone(d.output_schema()))
            }
            (_, Some(schema)) => decoded(schema, files.on_malformed),
            (_, None) => None,
        },
        SourceKind::Kafka(kafka) => match &kafka.value_format {
            spec::KafkaValueFormat::Raw => Some(kafka::rows::raw_schema()),
            spec::KafkaValueFormat::Json(schema) => decoded(schema, kafka.on_malformed),
        },
        SourceKind::Delta(_) => None,
    }
}

/// Opens the source `spec`, number `index` in the pipeline, resuming from
/// what the checkpoint's log says earlier batches took (entries past
/// `last_planned` were never planned and are dropped). A files source decodes
/// a batch's files on the query's `threads`.
///
/// # Errors
/// When the decoder cannot be built for the schema or the source log cannot
/// be read.
pub fn open(
    spec: &SourceSpec,
    index: usize,
    checkpoint: &Checkpoint,
    last_planned: Option<u64>,
    threads: crate::threads::Threads,
) -> Result<Box<dyn Source>, SourceError> {
    match &spec.kind {
        SourceKind::Files(files) => {
            let decode_error = |error: decode::DecodeError| SourceError::Decode {
                source_name: spec.name.clone(),
                error,
            };
            let lines = |schema: &SchemaRef, format| {
                Decoder::new(
                    Arc::clone(schema),
                    DecoderOptions {
                        format,
                        policy: files.on_malformed,
                        batch_size: DECODE_BATCH_ROWS,
                    },
                )
                .map(FileDecoder::from)
                .map_err(decode_error)
            };
            let decoder = match (&files.format, &files.schema) {
                (spec::InputFormat::Parquet, Some(schema)) => FileDecoder::from(
                    decode::ParquetDecoder::new(Arc::clone(schema), DECODE_BATCH_ROWS)
                        .map_err(decode_error)?,
                ),
                // The schema of the folder's first file, read now (one must exist).
                (spec::InputFormat::Parquet, None) => FileDecoder::from(files::infer_parquet(
                    &spec.name,
                    &files.path,
                    DECODE_BATCH_ROWS,
                )?),
                (spec::InputFormat::Json, Some(schema)) => {
                    lines(schema, decode::Format::JsonLines)?
                }
                (spec::InputFormat::Csv { header, delimiter }, Some(schema)) => lines(
                    schema,
                    decode::Format::Csv(decode::CsvOptions {
                        header: *header,
                        delimiter: *delimiter,
                        quote: b'"',
                    }),
                )?,
                // Validation requires the schema of JSON and CSV sources.
                (_, None) => {
                    return Err(SourceError::NoSchema {
                        source_name: spec.name.clone(),
                        reason: "a JSON or CSV files source needs `schema`".to_owned(),
                    });
                }
            };
            Ok(Box::new(
                FilesSource::open(
                    spec.name.clone(),
                    index,
                    files.path.clone(),
                    files.max_files_per_trigger,
                    decoder,
                    files.dead_letter_path.clone(),
                    checkpoint,
                    last_planned,
                )?
                .with_threads(threads),
            ))
        }
        SourceKind::Delta(d) => Ok(Box::new(DeltaInput::new(
            DeltaSource::open(
                spec.name.clone(),
                index,
                d.path.clone(),
                d.max_files_per_trigger,
                d.starting_version,
                checkpoint,
                last_planned,
            )
            .map_err(Box::new)?,
        ))),
        SourceKind::Kafka(k) => Ok(Box::new(kafka::KafkaInput::open(
            spec.name.clone(),
            index,
            k,
            checkpoint,
            last_planned,
        )?)),
    }
}
