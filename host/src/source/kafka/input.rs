//! The Kafka source as one of a query's inputs ([`Source`]): stages the next
//! offset range, records it where Spark keeps Kafka offsets (in `offsets/N`,
//! beside the source's initial offsets in `sources/<i>/0`), and reads exactly
//! the recorded range on a replay.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::SchemaRef;

use super::{KafkaPlan, KafkaSource, KafkaSourceError, PartitionOffsets};
use crate::checkpoint::Checkpoint;
use crate::decode::{self, Decoder, DecoderOptions};
use crate::source::{DECODE_BATCH_ROWS, Recorded, Source, SourceBatch, SourceError};
use crate::spec::{KafkaSourceSpec, KafkaValueFormat};

/// `offsets/N` field: the end offset of every partition (Spark's form).
const END: &str = "kafka";
/// `offsets/N` field: where the batch starts (the previous end, except for
/// new partitions and offsets skipped as lost).
const START: &str = "kafkaStart";

/// A Kafka source, batch by batch.
#[derive(Debug)]
pub struct KafkaInput {
    source: KafkaSource,
    dead_letter: Option<PathBuf>,
    /// Available-now: the latest offsets when the trigger started.
    frozen: Option<PartitionOffsets>,
    /// The next batch's range, chosen by [`Source::poll`].
    staged: Option<KafkaPlan>,
    /// The last range this run recorded (its latest offsets, for progress).
    last: Option<KafkaPlan>,
}

impl KafkaInput {
    /// Opens source `index` named `name`, resuming after the end offsets the
    /// last planned batch recorded in `offsets/N`.
    ///
    /// # Errors
    /// When the decoder or the client cannot be built, or the checkpoint
    /// cannot be read.
    pub fn open(
        name: String,
        index: usize,
        spec: &KafkaSourceSpec,
        checkpoint: &Checkpoint,
        last_planned: Option<u64>,
    ) -> Result<Self, SourceError> {
        let decoder = match &spec.value_format {
            KafkaValueFormat::Raw => None,
            KafkaValueFormat::Json(schema) => Some(
                Decoder::new(
                    Arc::clone(schema),
                    DecoderOptions {
                        format: decode::Format::JsonLines,
                        policy: spec.on_malformed,
                        batch_size: DECODE_BATCH_ROWS,
                    },
                )
                .map_err(|error| SourceError::Decode {
                    source_name: name.clone(),
                    error,
                })?,
            ),
        };
        let last_end = match last_planned {
            Some(n) => Some(recorded_offsets(&name, checkpoint, index, n, END)?),
            None => None,
        };
        let source = KafkaSource::open(name, index, spec.clone(), decoder, checkpoint, last_end)
            .map_err(boxed)?;
        Ok(Self {
            source,
            dead_letter: spec.dead_letter_path.clone(),
            frozen: None,
            staged: None,
            last: None,
        })
    }
}

fn boxed(e: KafkaSourceError) -> SourceError {
    SourceError::Kafka(Box::new(e))
}

/// Offsets field `field` of source `index` in `offsets/<batch>`.
fn recorded_offsets(
    name: &str,
    checkpoint: &Checkpoint,
    index: usize,
    batch: u64,
    field: &str,
) -> Result<PartitionOffsets, SourceError> {
    let entry: Option<serde_json::Value> = checkpoint.offsets().get(batch)?;
    let value = entry
        .as_ref()
        .and_then(|e| e["sources"].get(index))
        .and_then(|s| s.get(field))
        .cloned();
    from_field(name, batch, value)
}

fn from_field(
    name: &str,
    batch: u64,
    value: Option<serde_json::Value>,
) -> Result<PartitionOffsets, SourceError> {
    let missing = || SourceError::MissingLog {
        source_name: name.to_owned(),
        batch_id: batch,
    };
    let value = value.ok_or_else(missing)?;
    serde_json::from_value(value).map_err(|_| missing())
}

impl Source for KafkaInput {
    fn name(&self) -> &str {
        self.source.name()
    }

    fn description(&self) -> String {
        self.source.description()
    }

    fn schema(&self) -> &SchemaRef {
        self.source.schema()
    }

    fn freeze_available(&mut self) -> Result<(), SourceError> {
        self.frozen = Some(self.source.latest().map_err(boxed)?);
        Ok(())
    }

    fn poll(&mut self, checkpoint: &Checkpoint, unlimited: bool) -> Result<u64, SourceError> {
        self.staged = self
            .source
            .plan(checkpoint, self.frozen.as_ref(), unlimited)
            .map_err(boxed)?;
        Ok(self.staged.as_ref().map_or(0, KafkaPlan::len))
    }

    fn record(&mut self, checkpoint: &Checkpoint, _batch_id: u64) -> Result<Recorded, SourceError> {
        let plan = match self.staged.take() {
            Some(plan) => plan,
            None => self.source.empty_plan(checkpoint).map_err(boxed)?,
        };
        self.source.planned(&plan);
        let mut recorded = Recorded::new();
        recorded.insert(END.into(), plan.end.to_json());
        recorded.insert(START.into(), plan.start.to_json());
        self.last = Some(plan);
        Ok(recorded)
    }

    fn read(
        &mut self,
        _checkpoint: &Checkpoint,
        batch_id: u64,
        recorded: &Recorded,
    ) -> Result<SourceBatch, SourceError> {
        let name = self.source.name().to_owned();
        let end = from_field(&name, batch_id, recorded.get(END).cloned())?;
        let start = from_field(&name, batch_id, recorded.get(START).cloned())?;
        // Planned by this run: the latest offsets seen then are known; on a
        // replay after a restart the end stands for them.
        let latest = match &self.last {
            Some(last) if last.end == end && last.start == start => last.latest.clone(),
            _ => end.clone(),
        };
        let plan = KafkaPlan { start, end, latest };
        let decoded = self.source.read(batch_id, &plan).map_err(boxed)?;
        let mut metrics = BTreeMap::new();
        metrics.insert("numMalformedRows", decoded.num_malformed.to_string());
        let behind: Vec<i64> = plan
            .latest
            .0
            .iter()
            .map(|(tp, &latest)| latest.saturating_sub(plan.end.get(tp).unwrap_or(latest)))
            .collect();
        if !behind.is_empty() {
            let sum = behind.iter().fold(0i64, |a, &b| a.saturating_add(b));
            metrics.insert(
                "avgOffsetsBehindLatest",
                format!("{:.1}", sum as f64 / behind.len() as f64),
            );
            metrics.insert(
                "maxOffsetsBehindLatest",
                behind.iter().max().copied().unwrap_or(0).to_string(),
            );
            metrics.insert(
                "minOffsetsBehindLatest",
                behind.iter().min().copied().unwrap_or(0).to_string(),
            );
        }
        Ok(SourceBatch {
            decoded,
            start_offset: Some(plan.start.to_json()),
            end_offset: plan.end.to_json(),
            latest_offset: plan.latest.to_json(),
            metrics,
        })
    }

    fn dead_letter_dir(&self) -> Option<&Path> {
        self.dead_letter.as_deref()
    }
}
