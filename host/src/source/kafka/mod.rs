//! Kafka topics as a stream, with Spark's offset protocol: each batch is a range of offsets
//! per partition, `[start, end)`, where `end` is written to `offsets/N` before the batch runs
//! and `start` is the previous batch's `end` (for batch 0, the starting offsets, written once
//! to `sources/<i>/0` when first resolved, so that a restart before the first batch does not
//! move a `latest` start). The consumer reads a range by `assign()` at `start` and stops at
//! `end`; consumer groups and committed offsets play no part, so a replayed batch reads
//! exactly what it read before. The assignment is kept while each batch starts where the last
//! one ended, every partition with its own queue read only up to its range's end, so what the
//! consumer fetched ahead serves the next batch; a batch that starts elsewhere (a replay, a
//! new partition) assigns afresh.
//!
//! The plan trusts the broker's high watermark (ListOffsets latest) as the log end. A broker
//! that reports it too low (tansu 0.6.0 does, when several stored batches share a
//! modification time) loses nothing: the range ends early and the rest is read by a later
//! batch once the broker reports it; only an `available-now` run stops before the true end.
//! No client-side check could tell, short of reading past the reported end, which a broker
//! may answer with offset-out-of-range; the tests seal their topics on tansu instead
//! (`tests/src/tansu.rs`).
//!
//! # Layout
//! - `mod.rs`: the client side: metadata, watermarks, reading a range.
//! - [`offsets`]: offset planning (starting offsets, data loss, rate limit), without a broker.
//! - [`rows`]: records to Arrow, raw or through the JSON decoder.

mod input;
pub mod offsets;
pub mod rows;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, DefaultConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message, Timestamp};
use rdkafka::{Offset, TopicPartitionList};

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::decode::{Decoded, Decoder};
use crate::spec::{KafkaSourceSpec, KafkaTopics};

pub use self::input::KafkaInput;
pub use self::offsets::{Available, DataLoss, PartitionOffsets, StartError, TopicPartition};
use self::rows::{JsonError, Record, Rows};

/// How long one metadata or watermark request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A range that makes no progress for this long fails the batch (retryable).
const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a micro-batch read waits for fetches when no queue has a record.
const IDLE: Duration = Duration::from_millis(1);

/// `d` rounded up to whole milliseconds.
fn ceil_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX))
}

/// The range batch N reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KafkaPlan {
    pub start: PartitionOffsets,
    pub end: PartitionOffsets,
    /// The latest offsets when the batch was planned (Spark's `latestOffset`); the end
    /// offsets for a replayed batch.
    pub latest: PartitionOffsets,
}

impl KafkaPlan {
    /// Records in the range.
    pub fn len(&self) -> u64 {
        offsets::count(&self.start, &self.end)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A Kafka source failed. Every variant names the source, and the partition and offsets
/// where one is involved.
#[derive(Debug, thiserror::Error)]
pub enum KafkaSourceError {
    #[error("source {source_name}: cannot create a Kafka client for {bootstrap}: {error}")]
    Client {
        source_name: String,
        bootstrap: String,
        error: Box<KafkaError>,
    },
    #[error("source {source_name}: cannot read the topics of {bootstrap}: {error}")]
    Metadata {
        source_name: String,
        bootstrap: String,
        error: Box<KafkaError>,
    },
    #[error("source {source_name}: cannot read the offsets of {tp}: {error}")]
    Watermarks {
        source_name: String,
        tp: TopicPartition,
        error: Box<KafkaError>,
    },
    #[error(
        "source {source_name}: cannot read the offsets of {partitions} partition(s) of {topics}: {error}"
    )]
    ListOffsets {
        source_name: String,
        partitions: usize,
        topics: String,
        error: Box<KafkaError>,
    },
    #[error("source {source_name}: {error}")]
    Start {
        source_name: String,
        error: StartError,
    },
    #[error(
        "source {source_name}: data loss{}:\n  - {}\nSet fail_on_data_loss = false to skip lost offsets with a warning.",
        .batch_id.map(|b| format!(" in batch {b}")).unwrap_or_default(),
        .losses.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  - ")
    )]
    DataLoss {
        source_name: String,
        batch_id: Option<u64>,
        losses: Vec<DataLoss>,
    },
    #[error("source {source_name}: batch {batch_id}: reading {tp} [{start}, {end}): {error}")]
    Consume {
        source_name: String,
        batch_id: u64,
        tp: TopicPartition,
        start: i64,
        end: i64,
        error: Box<KafkaError>,
    },
    #[error("source {source_name}: batch {batch_id}: {error}")]
    Poll {
        source_name: String,
        batch_id: u64,
        error: Box<KafkaError>,
    },
    #[error(
        "source {source_name}: batch {batch_id}: {tp} stopped at offset {position} short of {end} for {}s",
        STALL_TIMEOUT.as_secs()
    )]
    Stalled {
        source_name: String,
        batch_id: u64,
        tp: TopicPartition,
        position: i64,
        end: i64,
    },
    #[error("source {source_name}: batch {batch_id}: {error}")]
    Json {
        source_name: String,
        batch_id: u64,
        error: JsonError,
    },
    #[error("source {source_name}: batch {batch_id}: building rows: {error}")]
    Arrow {
        source_name: String,
        batch_id: u64,
        error: arrow_schema::ArrowError,
    },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl KafkaSourceError {
    /// Broker trouble may pass; lost data and bad records do not.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Metadata { .. }
            | Self::Watermarks { .. }
            | Self::ListOffsets { .. }
            | Self::Consume { .. }
            | Self::Poll { .. }
            | Self::Stalled { .. } => true,
            Self::Client { .. }
            | Self::Start { .. }
            | Self::DataLoss { .. }
            | Self::Json { .. }
            | Self::Arrow { .. }
            | Self::Checkpoint(_) => false,
        }
    }
}

/// Records of Kafka topics read as a stream.
pub struct KafkaSource {
    name: String,
    index: usize,
    spec: KafkaSourceSpec,
    pattern: Option<regex::Regex>,
    consumer: Arc<BaseConsumer>,
    decoder: Option<Decoder>,
    schema: SchemaRef,
    /// Micro-batch mode: the assignment the last batch read its ranges by, kept for the next.
    held: Option<Held>,
    /// Where the next batch starts: the end of the last planned batch, or the starting
    /// offsets once resolved; `None` before that.
    next_start: Option<PartitionOffsets>,
    /// Real-time mode: the partitions the consumer is assigned while a batch's parts are read.
    streaming: Option<Streaming>,
}

/// Micro-batch mode: the consumer's assignment, kept from one batch to the next. Each
/// partition has its own queue, read only up to its range's end, so what the consumer fetched
/// ahead stays queued for the next batch, which starts where this one ended. (Assigning afresh
/// each batch threw it away: with 76 partitions and 121 records of each a batch, every record
/// was fetched and parsed about 25 times.)
struct Held {
    parts: BTreeMap<TopicPartition, HeldPartition>,
}

struct HeldPartition {
    queue: rdkafka::consumer::base_consumer::PartitionQueue<DefaultConsumerContext>,
    /// The offset the next batch must start at for this queue to serve it.
    next: i64,
    /// Records taken from the consumer but not yet read, in offset order: one the queue gave
    /// past the last range's end (that range ended in records a consumer never sees, such as a
    /// transaction's markers), or those queued before the partition's queue was split off.
    pending: std::collections::VecDeque<Carried>,
}

/// A record kept from one batch for the next.
struct Carried {
    offset: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    timestamp: Option<(i64, i32)>,
    /// A batch marker of Weir's Kafka sink: bookkeeping, not a row.
    marker: bool,
}

impl Carried {
    fn as_record(&self) -> Record<'_> {
        Record {
            key: self.key.as_deref(),
            value: self.value.as_deref(),
            offset: self.offset,
            timestamp: self.timestamp,
        }
    }

    fn of<M: Message>(message: &M) -> Self {
        Self {
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            value: message.payload().map(<[u8]>::to_vec),
            timestamp: record_timestamp(message.timestamp()),
            marker: crate::sink::kafka::is_marker(message),
        }
    }
}

/// Record `record` of a range ending at `end` (a row unless it is a batch marker of Weir's Kafka
/// sink, which is bookkeeping); whether the range is complete.
fn take(
    rows: &mut Rows,
    tp: &TopicPartition,
    record: &Record<'_>,
    marker: bool,
    count: &mut u64,
    next: &mut i64,
    end: i64,
) -> bool {
    if !marker {
        rows.push(tp, record);
        *count += 1;
    }
    *next = record.offset + 1;
    *next >= end
}

/// A record's timestamp as the rows keep it: ms and Spark's timestamp type.
fn record_timestamp(t: Timestamp) -> Option<(i64, i32)> {
    match t {
        Timestamp::NotAvailable => None,
        Timestamp::CreateTime(ms) => Some((ms, 0)),
        Timestamp::LogAppendTime(ms) => Some((ms, 1)),
    }
}

/// The consumer's assignment in real-time mode: every partition, from the end of the last
/// part on, fetched continuously.
#[derive(Debug)]
struct Streaming {
    /// The batch the last part was read for.
    batch_id: u64,
    /// Sorted, as [`PartitionOffsets`] are.
    partitions: Vec<TopicPartition>,
    index: BTreeMap<(String, i32), usize>,
    /// The next offset of each partition: where the next part starts.
    next: Vec<i64>,
}

/// One part read in real-time mode.
#[derive(Debug)]
pub struct Arrival {
    pub plan: KafkaPlan,
    pub decoded: Decoded,
    /// Each row's record timestamp (ms), in the rows' order.
    pub event_ms: Vec<i64>,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("name", &self.name)
            .field("topics", &self.spec.topics)
            .field("next_start", &self.next_start)
            .finish_non_exhaustive()
    }
}

impl KafkaSource {
    /// Connects (lazily: librdkafka connects on first use) and learns where the query stands:
    /// `last_end` is the end of the last planned batch (from `offsets/N`), else the starting
    /// offsets recorded in `sources/<index>/0` count, if any.
    ///
    /// # Errors
    /// When the client cannot be configured or the source log cannot be read.
    pub fn open(
        name: String,
        index: usize,
        spec: KafkaSourceSpec,
        decoder: Option<Decoder>,
        checkpoint: &Checkpoint,
        last_end: Option<PartitionOffsets>,
    ) -> Result<Self, KafkaSourceError> {
        let consumer = ClientConfig::new()
            .set("bootstrap.servers", &spec.bootstrap_servers)
            // Ranges are read by assignment; a group id is only a label here.
            .set("group.id", format!("weir-{name}"))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            // An offset out of range is data loss, never a silent jump.
            .set("auto.offset.reset", "error")
            // A long-poll fetch outstanding at the end of a range delays the next assign
            // by this much (librdkafka's default of 500 ms would add it to every batch). A
            // broker answers a waiting fetch as soon as data arrives, but librdkafka's mock
            // cluster only when this expires, which bounds what real-time mode waits there.
            .set("fetch.wait.max.ms", "5")
            // Output of a transactional Kafka sink is read committed (and so are the
            // watermarks: the high watermark is then the last stable offset).
            .set("isolation.level", "read_committed")
            // What the consumer fetches ahead of the reader, per partition in micro-batch mode
            // (each has its own queue there) and in all in real-time mode: about what the Java
            // consumer holds (one fetch, `max.partition.fetch.bytes`, of each partition), not
            // librdkafka's 64 MB, which a topic of many partitions would multiply.
            .set("queued.max.messages.kbytes", "1024")
            // … and the fetcher tries again this soon once the reader has taken from a full
            // queue (librdkafka waits a whole second by default: with 1 MB queues, most of a
            // batch's wall time).
            .set("fetch.queue.backoff.ms", "5")
            .create::<BaseConsumer>()
            .map(Arc::new)
            .map_err(|error| KafkaSourceError::Client {
                source_name: name.clone(),
                bootstrap: spec.bootstrap_servers.clone(),
                error: Box::new(error),
            })?;
        let pattern = match &spec.topics {
            // The pattern was checked by the spec; anchored, it must match a whole name.
            KafkaTopics::Pattern(p) => regex::Regex::new(&format!("^(?:{p})$")).ok(),
            KafkaTopics::Subscribe(_) => None,
        };
        let schema = match &decoder {
            Some(d) => Arc::clone(d.output_schema()),
            None => rows::raw_schema(),
        };
        let next_start = match last_end {
            Some(end) => Some(end),
            None => checkpoint.source_log(index).get::<PartitionOffsets>(0)?,
        };
        Ok(Self {
            name,
            index,
            spec,
            pattern,
            consumer,
            decoder,
            schema,
            held: None,
            next_start,
            streaming: None,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Spark's `sources[].description`.
    pub fn description(&self) -> String {
        match &self.spec.topics {
            KafkaTopics::Subscribe(t) => format!("KafkaV2[Subscribe[{}]]", t.join(",")),
            KafkaTopics::Pattern(p) => format!("KafkaV2[SubscribePattern[{p}]]"),
        }
    }

    /// The rows' schema: Spark's Kafka columns, or the decoded value.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Whether the source decodes JSON values (and so may have malformed records).
    pub fn decodes(&self) -> bool {
        self.decoder.is_some()
    }

    /// Assigns the consumer `partitions`, each to be read from its offset.
    fn assign<'a>(
        &mut self,
        batch_id: u64,
        partitions: impl Iterator<Item = (&'a TopicPartition, i64)>,
    ) -> Result<(), KafkaSourceError> {
        // An assignment ends the held one (its partition queues stop serving).
        self.held = None;
        let mut assignment = TopicPartitionList::new();
        for (tp, at) in partitions {
            assignment
                .add_partition_offset(&tp.topic, tp.partition, Offset::Offset(at))
                .map_err(|error| self.consume_error(batch_id, tp, at, at, error))?;
        }
        self.consumer
            .assign(&assignment)
            .map_err(|error| KafkaSourceError::Poll {
                source_name: self.name.clone(),
                batch_id,
                error: Box::new(error),
            })
    }

    /// The earliest (`Offset::Beginning`, the low watermark) or latest (`Offset::End`, the
    /// high watermark, or the last stable offset when reading committed) offset of each of
    /// `tps`, in that order: one ListOffsets request per leader for them all. (A request per
    /// partition, as `fetch_watermarks` asks, cost a batch of a 76-partition topic 300 round
    /// trips and most of its CPU.)
    fn list_offsets(
        &self,
        tps: &[TopicPartition],
        which: Offset,
    ) -> Result<Vec<i64>, KafkaSourceError> {
        if tps.is_empty() {
            return Ok(Vec::new());
        }
        let whole = |error: KafkaError| {
            let mut topics: Vec<&str> = tps.iter().map(|tp| tp.topic.as_str()).collect();
            topics.dedup();
            KafkaSourceError::ListOffsets {
                source_name: self.name.clone(),
                partitions: tps.len(),
                topics: topics.join(", "),
                error: Box::new(error),
            }
        };
        let mut list = TopicPartitionList::with_capacity(tps.len());
        for tp in tps {
            list.add_partition_offset(&tp.topic, tp.partition, which)
                .map_err(whole)?;
        }
        let answered = self
            .consumer
            .offsets_for_times(list, REQUEST_TIMEOUT)
            .map_err(whole)?;
        let mut out = Vec::with_capacity(tps.len());
        for tp in tps {
            let failed = |error: KafkaError| KafkaSourceError::Watermarks {
                source_name: self.name.clone(),
                tp: tp.clone(),
                error: Box::new(error),
            };
            let element = answered
                .find_partition(&tp.topic, tp.partition)
                .ok_or_else(|| {
                    failed(KafkaError::OffsetFetch(RDKafkaErrorCode::UnknownPartition))
                })?;
            element.error().map_err(failed)?;
            match element.offset() {
                Offset::Offset(at) if at >= 0 => out.push(at),
                _ => {
                    return Err(failed(KafkaError::OffsetFetch(
                        RDKafkaErrorCode::OffsetNotAvailable,
                    )));
                }
            }
        }
        Ok(out)
    }

    /// The partitions of the subscribed topics now, with their low and high watermarks.
    ///
    /// # Errors
    /// When the broker cannot be asked.
    pub fn available(&self) -> Result<Available, KafkaSourceError> {
        let tps = self.partitions()?;
        let low = self.list_offsets(&tps, Offset::Beginning)?;
        let high = self.list_offsets(&tps, Offset::End)?;
        let mut available = Available::default();
        for ((tp, low), high) in tps.into_iter().zip(low).zip(high) {
            available.earliest.0.insert(tp.clone(), low);
            available.latest.0.insert(tp, high);
        }
        Ok(available)
    }

    /// The partitions of the subscribed topics now.
    ///
    /// # Errors
    /// When the broker cannot be asked.
    fn partitions(&self) -> Result<Vec<TopicPartition>, KafkaSourceError> {
        let metadata = self
            .consumer
            .fetch_metadata(None, REQUEST_TIMEOUT)
            .map_err(|error| KafkaSourceError::Metadata {
                source_name: self.name.clone(),
                bootstrap: self.spec.bootstrap_servers.clone(),
                error: Box::new(error),
            })?;
        let mut partitions = Vec::new();
        for topic in metadata.topics() {
            let wanted = match (&self.spec.topics, &self.pattern) {
                (KafkaTopics::Subscribe(names), _) => names.iter().any(|n| n == topic.name()),
                (KafkaTopics::Pattern(_), Some(re)) => {
                    !topic.name().starts_with("__") && re.is_match(topic.name())
                }
                (KafkaTopics::Pattern(_), None) => false,
            };
            if !wanted || topic.error().is_some() {
                continue;
            }
            for partition in topic.partitions() {
                partitions.push(TopicPartition::new(topic.name(), partition.id()));
            }
        }
        partitions.sort();
        Ok(partitions)
    }

    /// The latest offsets now (the target of an available-now run).
    ///
    /// # Errors
    /// When the broker cannot be asked.
    pub fn latest(&self) -> Result<PartitionOffsets, KafkaSourceError> {
        Ok(self.available()?.latest)
    }

    /// Plans the next batch: from where the last one ended up to the latest offsets (at most
    /// `until`, the target of an available-now run), capped by `max_offsets_per_trigger`
    /// unless `unlimited`. `None` when there is nothing new to read. Resolving the starting
    /// offsets of a new query writes them to `sources/<i>/0` first.
    ///
    /// # Errors
    /// When the broker cannot be asked, the starting offsets name partitions wrongly, or
    /// offsets to read are gone and `fail_on_data_loss` holds.
    pub fn plan(
        &mut self,
        checkpoint: &Checkpoint,
        until: Option<&PartitionOffsets>,
        unlimited: bool,
    ) -> Result<Option<KafkaPlan>, KafkaSourceError> {
        let available = self.available()?;
        let previous = self.resolve_start(checkpoint, &available)?;
        let (start, losses) = offsets::reconcile(&previous, &available);
        if !losses.is_empty() {
            self.data_loss(None, losses)?;
        }
        let bound = match until {
            None => available.latest.clone(),
            Some(until) => PartitionOffsets(
                available
                    .latest
                    .0
                    .iter()
                    .map(|(tp, &latest)| {
                        let from = start.get(tp).unwrap_or(latest);
                        (tp.clone(), until.get(tp).map_or(from, |u| u.min(latest)))
                    })
                    .collect(),
            ),
        };
        let limit = if unlimited {
            None
        } else {
            self.spec.max_offsets_per_trigger.map(|n| n.get())
        };
        let end = offsets::end_offsets(&start, &bound, limit);
        let plan = KafkaPlan {
            start,
            end,
            latest: available.latest,
        };
        Ok((!plan.is_empty()).then_some(plan))
    }

    /// Where the next batch starts; for a new query, the starting offsets, resolved against
    /// `available` and written to `sources/<i>/0` the first time.
    fn resolve_start(
        &mut self,
        checkpoint: &Checkpoint,
        available: &Available,
    ) -> Result<PartitionOffsets, KafkaSourceError> {
        if let Some(p) = &self.next_start {
            return Ok(p.clone());
        }
        let initial =
            offsets::starting(&self.spec.starting_offsets, available).map_err(|error| {
                KafkaSourceError::Start {
                    source_name: self.name.clone(),
                    error,
                }
            })?;
        checkpoint.source_log(self.index).put(0, &initial)?;
        self.next_start = Some(initial.clone());
        Ok(initial)
    }

    /// A batch that reads nothing (a no-data batch run for the watermark).
    ///
    /// # Errors
    /// When a new query cannot resolve its starting offsets.
    pub fn empty_plan(&mut self, checkpoint: &Checkpoint) -> Result<KafkaPlan, KafkaSourceError> {
        let at = match &self.next_start {
            Some(at) => at.clone(),
            None => {
                let available = self.available()?;
                self.resolve_start(checkpoint, &available)?
            }
        };
        Ok(KafkaPlan {
            start: at.clone(),
            end: at.clone(),
            latest: at,
        })
    }

    /// Batch `plan` is planned: the next one starts where it ends.
    pub fn planned(&mut self, plan: &KafkaPlan) {
        self.next_start = Some(plan.end.clone());
    }

    fn data_loss(
        &self,
        batch_id: Option<u64>,
        losses: Vec<DataLoss>,
    ) -> Result<(), KafkaSourceError> {
        if self.spec.fail_on_data_loss {
            return Err(KafkaSourceError::DataLoss {
                source_name: self.name.clone(),
                batch_id,
                losses,
            });
        }
        for loss in &losses {
            tracing::warn!(source = %self.name, "data loss, skipped (fail_on_data_loss = false): {loss}");
        }
        Ok(())
    }

    /// Reads exactly `[start, end)` of every partition of `plan` and turns the records into
    /// rows. Offsets removed since the batch was planned are data loss.
    ///
    /// # Errors
    /// When the broker fails or stalls, offsets are gone (and `fail_on_data_loss` holds), or
    /// a value is malformed under the `fail` policy.
    pub fn read(&mut self, batch_id: u64, plan: &KafkaPlan) -> Result<Decoded, KafkaSourceError> {
        // A range is read by its own assignment.
        self.end_parts();
        // (partition, next offset wanted, end)
        let wanted: Vec<(&TopicPartition, i64, i64)> = plan
            .end
            .0
            .iter()
            .map(|(tp, &end)| (tp, plan.start.get(tp).unwrap_or(end), end))
            .filter(|(_, start, end)| start < end)
            .collect();
        let tps: Vec<TopicPartition> = wanted.iter().map(|(tp, _, _)| (*tp).clone()).collect();
        let lows = self.list_offsets(&tps, Offset::Beginning)?;
        let mut ranges: Vec<(TopicPartition, i64, i64)> = Vec::new();
        let mut losses = Vec::new();
        for ((tp, mut start, end), low) in wanted.into_iter().zip(lows) {
            if low > start {
                losses.push(DataLoss::Truncated {
                    tp: tp.clone(),
                    from: start,
                    earliest: low.min(end),
                });
                start = low;
            }
            if start < end {
                ranges.push((tp.clone(), start, end));
            }
        }
        if !losses.is_empty() {
            self.data_loss(Some(batch_id), losses)?;
        }
        let mut out = Decoded::default();
        if ranges.is_empty() {
            return Ok(out);
        }
        let reusable = self.held.as_ref().is_some_and(|h| {
            ranges
                .iter()
                .all(|(tp, start, _)| h.parts.get(tp).is_some_and(|p| p.next == *start))
        });
        if !reusable {
            self.hold(batch_id, &ranges)?;
        }
        let json = self.decoder.is_some();
        // One set of rows per partition, in partition order: a replay yields the same
        // batches whatever order the broker's fetch responses came in.
        let mut rows: Vec<Rows> = ranges
            .iter()
            .map(|_| if json { Rows::json() } else { Rows::raw() })
            .collect();
        let result = self.consume(batch_id, &ranges, &mut rows, &mut out.num_input_rows);
        if result.is_err() {
            // The queues stopped somewhere in their ranges: a retry assigns afresh.
            self.release();
        }
        result?;
        let partitions: Vec<&TopicPartition> = ranges.iter().map(|(tp, _, _)| tp).collect();
        self.finish_rows(batch_id, &partitions, rows, &mut out)?;
        Ok(out)
    }

    /// Real-time mode: reads the records that arrive next, from where the last part (or
    /// batch) ended: waits up to `wait` for the first, then takes what arrives within
    /// `linger` of it (at most `max_offsets_per_trigger` records, when set). The consumer
    /// stays assigned between calls, fetching ahead, until [`KafkaSource::end_parts`].
    /// `None` when nothing arrived. The part's range is planned: the next starts at its end.
    ///
    /// # Errors
    /// When the broker fails, offsets are gone (and `fail_on_data_loss` holds), or a value is
    /// malformed under the `fail` policy.
    pub fn arrive(
        &mut self,
        checkpoint: &Checkpoint,
        batch_id: u64,
        wait: Duration,
        linger: Duration,
    ) -> Result<Option<Arrival>, KafkaSourceError> {
        // A new batch looks for new partitions (one metadata request); the assignment, and
        // what the consumer fetched ahead, carry over from the last batch otherwise.
        if self
            .streaming
            .as_ref()
            .is_some_and(|s| s.batch_id != batch_id)
        {
            let now: std::collections::BTreeSet<TopicPartition> =
                self.partitions()?.into_iter().collect();
            let streaming = self.streaming.as_mut().map(|s| {
                s.batch_id = batch_id;
                s.partitions
                    .iter()
                    .cloned()
                    .collect::<std::collections::BTreeSet<_>>()
            });
            if streaming.is_some_and(|assigned| assigned != now) {
                self.end_parts();
            }
        }
        if self.streaming.is_none() {
            self.start_streaming(checkpoint, batch_id)?;
        }
        let Some(streaming) = self.streaming.as_mut() else {
            // No partition yet (no topic): nothing can arrive before the next look.
            std::thread::sleep(wait);
            return Ok(None);
        };
        let start: Vec<i64> = streaming.next.clone();
        let json = self.decoder.is_some();
        let mut rows: Vec<Rows> = streaming
            .partitions
            .iter()
            .map(|_| if json { Rows::json() } else { Rows::raw() })
            .collect();
        let limit = self
            .spec
            .max_offsets_per_trigger
            .map_or(u64::MAX, |n| n.get());
        let mut event_ms = Vec::new();
        let mut taken = 0u64;
        let mut count = 0u64;
        let first_until = Instant::now() + wait;
        let mut until = first_until;
        let mut arrived = false;
        loop {
            let now = Instant::now();
            if now >= until || taken >= limit {
                break;
            }
            // Whole milliseconds, rounded up: librdkafka's timeouts are in milliseconds, and
            // a remainder rounded down to 0 would spin.
            let Some(polled) = self.consumer.poll(ceil_ms(until - now)) else {
                continue;
            };
            let message = match polled {
                Ok(m) => m,
                Err(KafkaError::PartitionEOF(_)) => continue,
                Err(error) => {
                    return Err(KafkaSourceError::Poll {
                        source_name: self.name.clone(),
                        batch_id,
                        error: Box::new(error),
                    });
                }
            };
            let Some(&i) = streaming
                .index
                .get(&(message.topic().to_owned(), message.partition()))
            else {
                continue;
            };
            let offset = message.offset();
            if offset < streaming.next[i] {
                continue;
            }
            streaming.next[i] = offset + 1;
            taken += 1;
            if crate::sink::kafka::is_marker(&message) {
                continue;
            }
            let timestamp = record_timestamp(message.timestamp());
            if let Some((ms, _)) = timestamp {
                event_ms.push(ms);
            }
            rows[i].push(
                &streaming.partitions[i],
                &Record {
                    key: message.key(),
                    value: message.payload(),
                    offset,
                    timestamp,
                },
            );
            count += 1;
            if !arrived {
                arrived = true;
                until = Instant::now() + linger;
            }
        }
        if taken == 0 {
            return Ok(None);
        }
        let to_offsets = |next: &[i64]| {
            PartitionOffsets(
                streaming
                    .partitions
                    .iter()
                    .cloned()
                    .zip(next.iter().copied())
                    .collect(),
            )
        };
        let plan = KafkaPlan {
            start: to_offsets(&start),
            end: to_offsets(&streaming.next),
            latest: to_offsets(&streaming.next),
        };
        let partitions: Vec<TopicPartition> = streaming.partitions.clone();
        let partitions: Vec<&TopicPartition> = partitions.iter().collect();
        let mut decoded = Decoded {
            num_input_rows: count,
            ..Decoded::default()
        };
        self.finish_rows(batch_id, &partitions, rows, &mut decoded)?;
        self.planned(&plan);
        Ok(Some(Arrival {
            plan,
            decoded,
            event_ms,
        }))
    }

    /// Assigns every partition at the end of the last part or batch (new partitions at
    /// their start); offsets gone since then are data loss.
    fn start_streaming(
        &mut self,
        checkpoint: &Checkpoint,
        batch_id: u64,
    ) -> Result<(), KafkaSourceError> {
        let available = self.available()?;
        let previous = self.resolve_start(checkpoint, &available)?;
        let (start, losses) = offsets::reconcile(&previous, &available);
        if !losses.is_empty() {
            self.data_loss(Some(batch_id), losses)?;
        }
        if start.0.is_empty() {
            return Ok(());
        }
        self.assign(batch_id, start.0.iter().map(|(tp, &at)| (tp, at)))?;
        self.next_start = Some(start.clone());
        self.streaming = Some(Streaming {
            batch_id,
            index: start
                .0
                .keys()
                .enumerate()
                .map(|(i, tp)| ((tp.topic.clone(), tp.partition), i))
                .collect(),
            partitions: start.0.keys().cloned().collect(),
            next: start.0.values().copied().collect(),
        });
        Ok(())
    }

    /// Real-time mode: the batch's parts are over; nothing stays assigned.
    pub fn end_parts(&mut self) {
        if self.streaming.take().is_some() {
            let _ = self.consumer.unassign();
        }
    }

    /// Rows of each partition (in `partitions`' order) into `out`: decoded JSON, or Spark's
    /// Kafka columns.
    fn finish_rows(
        &mut self,
        batch_id: u64,
        partitions: &[&TopicPartition],
        rows: Vec<Rows>,
        out: &mut Decoded,
    ) -> Result<(), KafkaSourceError> {
        match (&mut self.decoder, rows) {
            (Some(decoder), rows) => {
                let rows: Vec<(&TopicPartition, rows::JsonRows)> = partitions
                    .iter()
                    .copied()
                    .zip(rows)
                    .filter_map(|(tp, r)| match r {
                        Rows::Json(j) => Some((tp, j)),
                        Rows::Raw(_) => None,
                    })
                    .collect();
                rows::decode_partitions(&rows, decoder, out).map_err(|error| {
                    KafkaSourceError::Json {
                        source_name: self.name.clone(),
                        batch_id,
                        error,
                    }
                })?;
            }
            (None, rows) => {
                let arrow = |error| KafkaSourceError::Arrow {
                    source_name: self.name.clone(),
                    batch_id,
                    error,
                };
                let mut batches = Vec::new();
                for r in rows {
                    if let Rows::Raw(raw) = r
                        && let Some(batch) = raw.finish(&self.schema).map_err(arrow)?
                    {
                        batches.push(batch);
                    }
                }
                // Small ones (a real-time part) as one batch for the partitions together, as
                // JSON values are decoded.
                let total: usize = batches.iter().map(RecordBatch::num_rows).sum();
                if batches.len() > 1 && total <= crate::source::DECODE_BATCH_ROWS {
                    let one = arrow_select::concat::concat_batches(&self.schema, &batches)
                        .map_err(arrow)?;
                    batches = vec![one];
                }
                out.batches.append(&mut batches);
            }
        }
        Ok(())
    }

    /// Assigns the partitions of `ranges` at their starts, each with its own queue, and keeps
    /// the assignment for the batches after.
    fn hold(
        &mut self,
        batch_id: u64,
        ranges: &[(TopicPartition, i64, i64)],
    ) -> Result<(), KafkaSourceError> {
        self.assign(batch_id, ranges.iter().map(|(tp, start, _)| (tp, *start)))?;
        let mut parts = BTreeMap::new();
        for (tp, start, end) in ranges {
            let queue = self
                .consumer
                .split_partition_queue(&tp.topic, tp.partition)
                .ok_or_else(|| {
                    self.consume_error(
                        batch_id,
                        tp,
                        *start,
                        *end,
                        KafkaError::OffsetFetch(RDKafkaErrorCode::UnknownPartition),
                    )
                })?;
            parts.insert(
                tp.clone(),
                HeldPartition {
                    queue,
                    next: *start,
                    pending: std::collections::VecDeque::new(),
                },
            );
        }
        // What the consumer queued before the queues were split off stays in its own queue:
        // taken now, it is read first, in order.
        while let Some(polled) = self.consumer.poll(Duration::ZERO) {
            match polled {
                Ok(message) => {
                    let tp = TopicPartition::new(message.topic(), message.partition());
                    if let Some(part) = parts.get_mut(&tp) {
                        part.pending.push_back(Carried::of(&message));
                    }
                }
                Err(KafkaError::PartitionEOF(_)) => {}
                Err(error) => {
                    let _ = self.consumer.unassign();
                    return Err(KafkaSourceError::Poll {
                        source_name: self.name.clone(),
                        batch_id,
                        error: Box::new(error),
                    });
                }
            }
        }
        self.held = Some(Held { parts });
        Ok(())
    }

    /// Micro-batch mode is over (or a read failed): nothing stays assigned.
    fn release(&mut self) {
        if self.held.take().is_some() {
            let _ = self.consumer.unassign();
        }
    }

    /// Reads every range from the held queues until it is complete: its last offset
    /// delivered, or the consumer's position past it (control records of transactions are
    /// never delivered). Each queue is read only up to its range's end.
    fn consume(
        &mut self,
        batch_id: u64,
        ranges: &[(TopicPartition, i64, i64)],
        rows: &mut [Rows],
        count: &mut u64,
    ) -> Result<(), KafkaSourceError> {
        let name = self.name.clone();
        let consumer = Arc::clone(&self.consumer);
        let Some(held) = self.held.as_mut() else {
            return Ok(());
        };
        let mut open = ranges.len();
        let mut done = vec![false; ranges.len()];
        let mut nexts: Vec<i64> = ranges.iter().map(|(_, start, _)| *start).collect();
        let mut last_progress = Instant::now();
        let by_topic: BTreeMap<(&str, i32), usize> = ranges
            .iter()
            .enumerate()
            .map(|(i, (tp, _, _))| ((tp.topic.as_str(), tp.partition), i))
            .collect();
        let consume_error =
            |tp: &TopicPartition, at: i64, end: i64, error: KafkaError| KafkaSourceError::Consume {
                source_name: name.clone(),
                batch_id,
                tp: tp.clone(),
                start: at,
                end,
                error: Box::new(error),
            };
        while open > 0 {
            let mut progressed = false;
            for (i, (tp, _, end)) in ranges.iter().enumerate() {
                if done[i] {
                    continue;
                }
                let Some(part) = held.parts.get_mut(tp) else {
                    return Err(consume_error(
                        tp,
                        nexts[i],
                        *end,
                        KafkaError::OffsetFetch(RDKafkaErrorCode::UnknownPartition),
                    ));
                };
                while !done[i] {
                    if let Some(record) = part.pending.pop_front() {
                        progressed = true;
                        if record.offset < nexts[i] {
                            continue;
                        }
                        if record.offset >= *end {
                            part.pending.push_front(record);
                            done[i] = true;
                            break;
                        }
                        done[i] = take(
                            &mut rows[i],
                            tp,
                            &record.as_record(),
                            record.marker,
                            count,
                            &mut nexts[i],
                            *end,
                        );
                        continue;
                    }
                    let message = match part.queue.poll(Duration::ZERO) {
                        None => break,
                        Some(Ok(message)) => message,
                        Some(Err(KafkaError::PartitionEOF(_))) => continue,
                        Some(Err(error)) => return Err(consume_error(tp, nexts[i], *end, error)),
                    };
                    progressed = true;
                    if message.offset() < nexts[i] {
                        continue;
                    }
                    if message.offset() >= *end {
                        part.pending.push_back(Carried::of(&message));
                        done[i] = true;
                        break;
                    }
                    let record = Record {
                        key: message.key(),
                        value: message.payload(),
                        offset: message.offset(),
                        timestamp: record_timestamp(message.timestamp()),
                    };
                    let marker = crate::sink::kafka::is_marker(&message);
                    done[i] = take(
                        &mut rows[i],
                        tp,
                        &record,
                        marker,
                        count,
                        &mut nexts[i],
                        *end,
                    );
                }
                if done[i] {
                    open -= 1;
                }
            }
            if open == 0 {
                break;
            }
            if progressed {
                last_progress = Instant::now();
                continue;
            }
            // Nothing queued: serve the consumer's callbacks, waiting a little for fetches.
            match consumer.poll(IDLE) {
                None | Some(Ok(_)) | Some(Err(KafkaError::PartitionEOF(_))) => {}
                Some(Err(error)) => {
                    return Err(KafkaSourceError::Poll {
                        source_name: name.clone(),
                        batch_id,
                        error: Box::new(error),
                    });
                }
            }
            let position = consumer
                .position()
                .map_err(|error| KafkaSourceError::Poll {
                    source_name: name.clone(),
                    batch_id,
                    error: Box::new(error),
                })?;
            for element in position.elements() {
                let Some(&i) = by_topic.get(&(element.topic(), element.partition())) else {
                    continue;
                };
                if let Offset::Offset(p) = element.offset()
                    && !done[i]
                    && p >= ranges[i].2
                    && held
                        .parts
                        .get(&ranges[i].0)
                        .is_some_and(|h| h.pending.is_empty())
                {
                    done[i] = true;
                    open -= 1;
                }
            }
            if open > 0 && last_progress.elapsed() > STALL_TIMEOUT {
                let i = done.iter().position(|d| !d).unwrap_or(0);
                let (tp, _, end) = &ranges[i];
                return Err(KafkaSourceError::Stalled {
                    source_name: name,
                    batch_id,
                    tp: tp.clone(),
                    position: nexts[i],
                    end: *end,
                });
            }
        }
        for (tp, _, end) in ranges {
            if let Some(part) = held.parts.get_mut(tp) {
                part.next = *end;
            }
        }
        Ok(())
    }

    fn consume_error(
        &self,
        batch_id: u64,
        tp: &TopicPartition,
        start: i64,
        end: i64,
        error: KafkaError,
    ) -> KafkaSourceError {
        KafkaSourceError::Consume {
            source_name: self.name.clone(),
            batch_id,
            tp: tp.clone(),
            start,
            end,
            error: Box::new(error),
        }
    }
}

#[cfg(test)]
mod tests;
