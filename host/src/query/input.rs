//! The query's input, whatever its kind. Sources differ in what a batch's input is (a list of
//! files, offset ranges) and where it is recorded (the source log, `offsets/N`), but the loop
//! asks the same four things of each: what is there now, the next batch's input, recording it
//! before it runs, and reading it again exactly on a replay.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use arrow_schema::SchemaRef;

use super::{OffsetEntry, QueryError, SourceOffset};
use crate::checkpoint::Checkpoint;
use crate::decode::{self, Decoded, Decoder, DecoderOptions};
use crate::source::kafka::{KafkaPlan, KafkaSource, PartitionOffsets};
use crate::source::{FileEntry, FilesSource};
use crate::spec::{self, KafkaValueFormat, SourceKind, SourceSpec};

/// The source of a query.
#[derive(Debug)]
pub(super) enum Input {
    Files(Box<FilesSource>),
    Kafka(Box<KafkaSource>),
}

/// What one batch reads.
#[derive(Debug, Clone)]
pub(super) enum Plan {
    Files(Vec<FileEntry>),
    Kafka(KafkaPlan),
}

/// What an available-now or once run reads, fixed when it starts.
#[derive(Debug)]
pub(super) enum Target {
    Files(Vec<FileEntry>),
    Kafka(PartitionOffsets),
}

fn policy(p: spec::OnMalformed) -> decode::MalformedPolicy {
    match p {
        spec::OnMalformed::Permissive => decode::MalformedPolicy::Permissive,
        spec::OnMalformed::Drop => decode::MalformedPolicy::Drop,
        spec::OnMalformed::Fail => decode::MalformedPolicy::Fail,
        spec::OnMalformed::DeadLetter => decode::MalformedPolicy::DeadLetter,
    }
}

impl Input {
    /// Opens source 0 of the query and the dead-letter folder it writes to, if any.
    pub fn open(
        spec: &SourceSpec,
        checkpoint: &Checkpoint,
        last_planned: Option<u64>,
    ) -> Result<(Self, Option<PathBuf>), QueryError> {
        let decoder_error = |error| QueryError::Decoder {
            source_name: spec.name.clone(),
            error,
        };
        match &spec.kind {
            SourceKind::Files(files) => {
                let decoder = Decoder::new(
                    Arc::clone(&files.schema),
                    DecoderOptions {
                        format: match &files.format {
                            spec::InputFormat::Json => decode::Format::JsonLines,
                            spec::InputFormat::Csv { header, delimiter } => {
                                decode::Format::Csv(decode::CsvOptions {
                                    header: *header,
                                    delimiter: *delimiter,
                                    quote: b'"',
                                })
                            }
                        },
                        policy: policy(files.on_malformed),
                        batch_size: 65_536,
                    },
                )
                .map_err(decoder_error)?;
                let source = FilesSource::open(
                    spec.name.clone(),
                    0,
                    files.path.clone(),
                    files.max_files_per_trigger,
                    decoder,
                    checkpoint,
                    last_planned,
                )?;
                Ok((
                    Self::Files(Box::new(source)),
                    files.dead_letter_path.clone(),
                ))
            }
            SourceKind::Kafka(kafka) => {
                let decoder = match &kafka.value_format {
                    KafkaValueFormat::Raw => None,
                    KafkaValueFormat::Json(schema) => Some(
                        Decoder::new(
                            Arc::clone(schema),
                            DecoderOptions {
                                format: decode::Format::JsonLines,
                                policy: policy(kafka.on_malformed),
                                batch_size: 65_536,
                            },
                        )
                        .map_err(decoder_error)?,
                    ),
                };
                let last_end = match last_planned {
                    Some(n) => Some(kafka_end(checkpoint, n)?),
                    None => None,
                };
                let source = KafkaSource::open(
                    spec.name.clone(),
                    0,
                    kafka.clone(),
                    decoder,
                    checkpoint,
                    last_end,
                )?;
                Ok((
                    Self::Kafka(Box::new(source)),
                    kafka.dead_letter_path.clone(),
                ))
            }
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Self::Files(s) => s.name(),
            Self::Kafka(s) => s.name(),
        }
    }

    pub fn description(&self) -> String {
        match self {
            Self::Files(s) => s.description(),
            Self::Kafka(s) => s.description(),
        }
    }

    pub fn schema(&self) -> &SchemaRef {
        match self {
            Self::Files(s) => s.schema(),
            Self::Kafka(s) => s.schema(),
        }
    }

    /// What is there now, for an available-now or once run.
    pub fn target(&mut self) -> Result<Target, QueryError> {
        Ok(match self {
            Self::Files(s) => Target::Files(s.list_new()?),
            Self::Kafka(s) => Target::Kafka(s.latest()?),
        })
    }

    /// The next batch towards `target`; `None` when it is reached.
    pub fn next(
        &mut self,
        checkpoint: &Checkpoint,
        target: &mut Target,
        unlimited: bool,
    ) -> Result<Option<Plan>, QueryError> {
        Ok(match (self, target) {
            (Self::Files(s), Target::Files(remaining)) => {
                let files = s.take(remaining, unlimited);
                remaining.drain(..files.len());
                (!files.is_empty()).then_some(Plan::Files(files))
            }
            (Self::Kafka(s), Target::Kafka(until)) => s
                .plan(checkpoint, Some(&*until), unlimited)?
                .map(Plan::Kafka),
            _ => None,
        })
    }

    /// The next batch of a long-running query, if there is new input.
    pub fn poll(&mut self, checkpoint: &Checkpoint) -> Result<Option<Plan>, QueryError> {
        Ok(match self {
            Self::Files(s) => {
                let files = s.take(&s.list_new()?, false);
                (!files.is_empty()).then_some(Plan::Files(files))
            }
            Self::Kafka(s) => s.plan(checkpoint, None, false)?.map(Plan::Kafka),
        })
    }

    /// A batch without input (run when the watermark moved).
    pub fn empty(&mut self, checkpoint: &Checkpoint) -> Result<Plan, QueryError> {
        Ok(match self {
            Self::Files(_) => Plan::Files(Vec::new()),
            Self::Kafka(s) => Plan::Kafka(s.empty_plan(checkpoint)?),
        })
    }

    /// Records batch `n`'s input where the source keeps it and returns the source's part of
    /// `offsets/N` (which the caller writes next).
    pub fn record(
        &mut self,
        checkpoint: &Checkpoint,
        n: u64,
        plan: &Plan,
    ) -> Result<SourceOffset, QueryError> {
        let name = self.name().to_owned();
        let (kafka, kafka_start) = match (self, plan) {
            (Self::Files(s), Plan::Files(files)) => {
                s.record(checkpoint, n, files)?;
                (None, None)
            }
            (Self::Kafka(s), Plan::Kafka(p)) => {
                s.planned(p);
                (Some(p.end.clone()), Some(p.start.clone()))
            }
            _ => {
                return Err(QueryError::Protocol {
                    batch_id: n,
                    message: "a plan of another source kind".into(),
                });
            }
        };
        Ok(SourceOffset {
            name,
            log_offset: n,
            kafka,
            kafka_start,
        })
    }

    /// What batch `n` reads, as recorded.
    pub fn planned(&self, checkpoint: &Checkpoint, n: u64) -> Result<Plan, QueryError> {
        Ok(match self {
            Self::Files(s) => Plan::Files(s.planned(checkpoint, n)?),
            Self::Kafka(_) => {
                let end = kafka_end(checkpoint, n)?;
                let recorded: Option<OffsetEntry> = checkpoint.offsets().get(n)?;
                let recorded = recorded
                    .and_then(|e| e.sources.into_iter().next())
                    .and_then(|s| s.kafka_start);
                let start = match (recorded, n.checked_sub(1)) {
                    (Some(start), _) => start,
                    (None, Some(previous)) => kafka_end(checkpoint, previous)?,
                    (None, None) => checkpoint
                        .source_log(0)
                        .get::<PartitionOffsets>(0)?
                        .ok_or_else(|| QueryError::Protocol {
                            batch_id: n,
                            message: "the Kafka starting offsets (sources/0/0) are missing; the checkpoint is damaged".into(),
                        })?,
                };
                Plan::Kafka(KafkaPlan {
                    start,
                    latest: end.clone(),
                    end,
                })
            }
        })
    }

    /// Reads exactly the input of batch `n`.
    pub fn read(&mut self, n: u64, plan: &Plan) -> Result<Decoded, QueryError> {
        match (self, plan) {
            (Self::Files(s), Plan::Files(files)) => Ok(s.read(n, files)?),
            (Self::Kafka(s), Plan::Kafka(p)) => Ok(s.read(n, p)?),
            _ => Err(QueryError::Protocol {
                batch_id: n,
                message: "a plan of another source kind".into(),
            }),
        }
    }
}

impl Plan {
    /// Spark's `startOffset`, `endOffset`, `latestOffset` and source metrics of batch `n`.
    pub fn progress(
        &self,
        n: u64,
    ) -> (
        Option<serde_json::Value>,
        serde_json::Value,
        serde_json::Value,
        BTreeMap<&'static str, String>,
    ) {
        let mut metrics = BTreeMap::new();
        match self {
            Self::Files(files) => {
                metrics.insert("numFiles", files.len().to_string());
                (
                    n.checked_sub(1)
                        .map(|p| serde_json::json!({ "logOffset": p })),
                    serde_json::json!({ "logOffset": n }),
                    serde_json::json!({ "logOffset": n }),
                    metrics,
                )
            }
            Self::Kafka(p) => {
                // Spark's Kafka source metrics: how far the batch's end is behind the latest.
                let behind: Vec<i64> = p
                    .latest
                    .0
                    .iter()
                    .map(|(tp, &latest)| latest - p.end.get(tp).unwrap_or(latest))
                    .collect();
                if !behind.is_empty() {
                    let sum: i64 = behind.iter().sum();
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
                (
                    Some(p.start.to_json()),
                    p.end.to_json(),
                    p.latest.to_json(),
                    metrics,
                )
            }
        }
    }
}

/// The Kafka end offsets batch `n` recorded in `offsets/N`.
fn kafka_end(checkpoint: &Checkpoint, n: u64) -> Result<PartitionOffsets, QueryError> {
    let entry: Option<OffsetEntry> = checkpoint.offsets().get(n)?;
    entry
        .and_then(|e| e.sources.into_iter().next())
        .and_then(|s| s.kafka)
        .ok_or_else(|| QueryError::Protocol {
            batch_id: n,
            message: format!(
                "offsets/{n} holds no Kafka offsets for source 0; the checkpoint is damaged or was written by another source"
            ),
        })
}
