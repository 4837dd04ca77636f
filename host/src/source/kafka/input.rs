//! The Kafka source as one of a query's inputs ([`Source`]): stages the next
//! offset range, records it where Spark keeps Kafka offsets (in `offsets/N`,
//! beside the source's initial offsets in `sources/<i>/0`), and reads exactly
//! the recorded range on a replay.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arrow_schema::SchemaRef;

use super::{Arrival, KafkaPlan, KafkaSource, KafkaSourceError, PartitionOffsets, TopicPartition};
use crate::checkpoint::Checkpoint;
use crate::decode::{self, Decoder, DecoderOptions};
use crate::source::{DECODE_BATCH_ROWS, Part, Recorded, Source, SourceBatch, SourceError};
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

    fn arrive(
        &mut self,
        checkpoint: &Checkpoint,
        batch_id: u64,
        wait: Duration,
        linger: Duration,
    ) -> Result<Option<Part>, SourceError> {
        let Some(arrival) = self
            .source
            .arrive(checkpoint, batch_id, wait, linger)
            .map_err(boxed)?
        else {
            return Ok(None);
        };
        let Arrival {
            plan,
            decoded,
            event_ms,
        } = arrival;
        let mut recorded = Recorded::new();
        recorded.insert(END.into(), plan.end.to_json());
        recorded.insert(START.into(), plan.start.to_json());
        let mut metrics = BTreeMap::new();
        metrics.insert("numMalformedRows", decoded.num_malformed.to_string());
        let batch = SourceBatch {
            decoded,
            start_offset: Some(plan.start.to_json()),
            end_offset: plan.end.to_json(),
            latest_offset: plan.latest.to_json(),
            metrics,
        };
        self.last = Some(plan);
        Ok(Some(Part {
            recorded,
            batch,
            event_ms,
        }))
    }

    fn end_parts(&mut self) {
        self.source.end_parts();
    }

    /// The batch's range is from the first part's start to the last one's end; the cuts are
    /// each part's end, one offset per partition in the order of `partitions`.
    fn join_parts(
        &mut self,
        checkpoint: &Checkpoint,
        batch_id: u64,
        parts: Vec<Recorded>,
    ) -> Result<(Recorded, serde_json::Value), SourceError> {
        if parts.is_empty() {
            self.staged = None;
            let whole = self.record(checkpoint, batch_id)?;
            return Ok((whole, serde_json::json!({ "partitions": [], "ends": [] })));
        }
        join(self.source.name(), batch_id, &parts)
    }

    fn split_parts(
        &self,
        batch_id: u64,
        whole: &Recorded,
        cuts: &serde_json::Value,
    ) -> Result<Vec<Recorded>, SourceError> {
        split(self.source.name(), batch_id, whole, cuts)
    }
}

/// The entry of a real-time batch made of `parts` (at least one) and its cuts: each part's end
/// offset per partition, in the order of `partitions`.
fn join(
    name: &str,
    batch_id: u64,
    parts: &[Recorded],
) -> Result<(Recorded, serde_json::Value), SourceError> {
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return Err(SourceError::Parts {
            source_name: name.to_owned(),
            batch_id,
            problem: "are none".to_owned(),
        });
    };
    let start = from_field(name, batch_id, first.get(START).cloned())?;
    let end = from_field(name, batch_id, last.get(END).cloned())?;
    let partitions: Vec<TopicPartition> = end.0.keys().cloned().collect();
    let mut ends = Vec::with_capacity(parts.len());
    for part in parts {
        let part_end = from_field(name, batch_id, part.get(END).cloned())?;
        ends.push(
            partitions
                .iter()
                .map(|tp| part_end.get(tp).or_else(|| start.get(tp)).unwrap_or(0))
                .collect::<Vec<i64>>(),
        );
    }
    let mut whole = Recorded::new();
    whole.insert(END.into(), end.to_json());
    whole.insert(START.into(), start.to_json());
    let cuts = serde_json::json!({
        "partitions": partitions.iter().map(|tp| (tp.topic.clone(), tp.partition)).collect::<Vec<_>>(),
        "ends": ends,
    });
    Ok((whole, cuts))
}

/// The parts of a real-time batch from its entry and cuts (see [`join`]).
fn split(
    name: &str,
    batch_id: u64,
    whole: &Recorded,
    cuts: &serde_json::Value,
) -> Result<Vec<Recorded>, SourceError> {
    let problem = |p: &str| SourceError::Parts {
        source_name: name.to_owned(),
        batch_id,
        problem: p.to_owned(),
    };
    #[derive(serde::Deserialize)]
    struct Cuts {
        partitions: Vec<(String, i32)>,
        ends: Vec<Vec<i64>>,
    }
    let cuts: Cuts = serde_json::from_value(cuts.clone())
        .map_err(|_| problem("are not partitions and their ends"))?;
    let start = from_field(name, batch_id, whole.get(START).cloned())?;
    let end = from_field(name, batch_id, whole.get(END).cloned())?;
    let partitions: Vec<TopicPartition> = cuts
        .partitions
        .into_iter()
        .map(|(topic, partition)| TopicPartition::new(topic, partition))
        .collect();
    let mut at = start.clone();
    let mut parts = Vec::with_capacity(cuts.ends.len());
    for row in cuts.ends {
        if row.len() != partitions.len() {
            return Err(problem("have a part with the wrong number of partitions"));
        }
        let mut next = at.clone();
        for (tp, offset) in partitions.iter().zip(row) {
            if at.get(tp).is_some_and(|a| a > offset) {
                return Err(problem(&format!("go back in {tp}")));
            }
            next.0.insert(tp.clone(), offset);
        }
        let mut part = Recorded::new();
        part.insert(END.into(), next.to_json());
        part.insert(START.into(), at.to_json());
        parts.push(part);
        at = next;
    }
    if !parts.is_empty() && at != end {
        return Err(problem("do not end where the batch ends"));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::{END, START, join, split};
    use crate::source::Recorded;
    use serde_json::json;

    fn part(start: serde_json::Value, end: serde_json::Value) -> Recorded {
        let mut r = Recorded::new();
        r.insert(START.into(), start);
        r.insert(END.into(), end);
        r
    }

    #[test]
    fn a_batchs_parts_are_recorded_as_cuts_and_given_back() {
        let parts = vec![
            part(
                json!({"t": {"0": 5, "1": 0}}),
                json!({"t": {"0": 9, "1": 0}}),
            ),
            part(
                json!({"t": {"0": 9, "1": 0}}),
                json!({"t": {"0": 9, "1": 4}}),
            ),
            part(
                json!({"t": {"0": 9, "1": 4}}),
                json!({"t": {"0": 12, "1": 7}}),
            ),
        ];
        let (whole, cuts) = join("s", 3, &parts).unwrap();
        assert_eq!(whole[START], json!({"t": {"0": 5, "1": 0}}));
        assert_eq!(whole[END], json!({"t": {"0": 12, "1": 7}}));
        assert_eq!(
            cuts,
            json!({"partitions": [["t", 0], ["t", 1]], "ends": [[9, 0], [9, 4], [12, 7]]})
        );
        assert_eq!(split("s", 3, &whole, &cuts).unwrap(), parts);
        // Cuts that do not fit the batch are refused, naming the batch.
        let short = json!({"partitions": [["t", 0], ["t", 1]], "ends": [[9, 0]]});
        let e = split("s", 3, &whole, &short).unwrap_err().to_string();
        assert!(
            e.contains("batch 3") && e.contains("do not end where the batch ends"),
            "{e}"
        );
        let back = json!({"partitions": [["t", 0], ["t", 1]], "ends": [[4, 0], [12, 7]]});
        let e = split("s", 3, &whole, &back).unwrap_err().to_string();
        assert!(e.contains("go back in t-0"), "{e}");
        assert!(split("s", 3, &whole, &json!([1, 2])).is_err());
    }
}
