//! Rows produced to a Kafka topic, exactly once.
//!
//! A topic cannot replace what a batch wrote before a crash, so idempotence comes from
//! transactions: each batch is one transaction of a producer whose `transactional.id` is
//! stable per query (`weir-<query id>`), and the transaction also writes a marker, a record
//! on partition 0 with no key and no value and the header `weir.batch` = `<query id>/<batch
//! id>`. Starting the producer (`init_transactions`) fences a zombie of an earlier run and
//! aborts its open transaction. Before the first batch of a run the sink reads back the last
//! marker of its query, and the batch being recovered (planned, but without `commits/N`) is
//! then either already written — its transaction committed before the crash, only the
//! checkpoint commit was lost: nothing is produced — or written again in a new transaction.
//!
//! `delivery = "at-least-once"` (for brokers without transactions) produces without a
//! transaction, still writes markers and still skips a batch whose marker is there, so a
//! replay duplicates only a batch interrupted between its rows and its marker.
//!
//! Readers of the topic must use `isolation.level = read_committed`, and skip records with
//! the `weir.batch` header (Weir's Kafka source does both).
//!
//! What cannot be tested here: librdkafka's mock cluster (the test broker) neither hides
//! aborted transactions from `read_committed` readers nor writes transaction control
//! records, so on it the rows of a transaction aborted by a crash stay visible. The tests
//! check what the mock shows — the markers, the recovery decision, no batch id marked twice,
//! and the rows of batches that were not interrupted inside their transaction — and the
//! filtering of aborted rows is left to a real broker.

use std::sync::Mutex;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, SchemaRef};
use rdkafka::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use super::Sink;
use crate::failpoint::{Failpoint, Phase};
use crate::plugin::BatchInfo;
use crate::spec::{KafkaDelivery, KafkaSinkSpec};

/// The header naming the batch of a marker record.
pub const MARKER_HEADER: &str = "weir.batch";
/// How long a transaction step or a flush may take.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Records read back per step when looking for the last marker.
const SCAN_WINDOW: i64 = 1_000;

/// A Kafka sink failed; each variant names the topic.
#[derive(Debug, thiserror::Error)]
pub enum KafkaSinkError {
    #[error("kafka sink {topic}: column {column:?} {problem}")]
    Column {
        topic: String,
        column: String,
        problem: String,
    },
    #[error("kafka sink {topic}: cannot create the producer for {bootstrap}: {error}")]
    Client {
        topic: String,
        bootstrap: String,
        error: Box<KafkaError>,
    },
    #[error("kafka sink {topic}: batch {batch_id}: {step}: {error}")]
    Produce {
        topic: String,
        batch_id: u64,
        step: &'static str,
        error: Box<KafkaError>,
    },
    #[error(
        "kafka sink {topic}: batch {batch_id}: {failed} record(s) were not delivered, first: {first}"
    )]
    Delivery {
        topic: String,
        batch_id: u64,
        failed: u64,
        first: String,
    },
    #[error("kafka sink {topic}: reading back the markers of partition 0: {error}")]
    Markers {
        topic: String,
        error: Box<KafkaError>,
    },
    #[error("kafka sink {topic}: batch {batch_id}: encoding rows as JSON: {error}")]
    Encode {
        topic: String,
        batch_id: u64,
        error: std::io::Error,
    },
}

impl KafkaSinkError {
    /// Broker trouble may pass; a wrong column does not.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Client { .. }
            | Self::Produce { .. }
            | Self::Delivery { .. }
            | Self::Markers { .. } => true,
            Self::Column { .. } | Self::Encode { .. } => false,
        }
    }
}

/// Counts failed deliveries (librdkafka reports them on its own thread).
#[derive(Debug, Default)]
pub struct DeliveryTracker {
    failures: Mutex<(u64, Option<String>)>,
}

impl ClientContext for DeliveryTracker {}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _opaque: ()) {
        if let Err((error, message)) = result {
            // A poisoned lock only means a panic elsewhere; the counter is still usable.
            let mut f = self
                .failures
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            f.0 += 1;
            if f.1.is_none() {
                f.1 = Some(format!(
                    "{error} ({}-{} )",
                    message.topic(),
                    message.partition()
                ));
            }
        }
    }
}

impl DeliveryTracker {
    fn take(&self) -> (u64, Option<String>) {
        let mut f = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        std::mem::take(&mut *f)
    }
}

/// Where the bytes of a record come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bytes {
    Column(usize),
    RowJson,
}

/// A topic as a sink.
pub struct KafkaSink {
    spec: KafkaSinkSpec,
    key: Option<usize>,
    value: Bytes,
    failpoint: Option<Failpoint>,
    query_id: String,
    producer: ThreadedProducer<DeliveryTracker>,
    /// The last batch id marked by this query, once read back (`Some(None)`: none).
    last_marked: Option<Option<u64>>,
    /// The batch whose rows are being produced (its transaction open, with exactly-once).
    open: Option<u64>,
    /// Real-time mode: the batch whose parts pass is in the topic already.
    skipping: bool,
    json: Vec<u8>,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("topic", &self.spec.topic)
            .field("delivery", &self.spec.delivery)
            .field("last_marked", &self.last_marked)
            .finish_non_exhaustive()
    }
}

fn is_bytes(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Binary | DataType::LargeBinary
    )
}

fn bytes_at(array: &ArrayRef, row: usize) -> Option<&[u8]> {
    if array.is_null(row) {
        return None;
    }
    Some(match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().value(row).as_bytes(),
        DataType::LargeUtf8 => array.as_string::<i64>().value(row).as_bytes(),
        DataType::Binary => array.as_binary::<i32>().value(row),
        DataType::LargeBinary => array.as_binary::<i64>().value(row),
        _ => return None,
    })
}

impl KafkaSink {
    /// A sink for rows of `schema` written by query `query_id`. With exactly-once delivery
    /// this starts the transactional producer, fencing any earlier run of the query.
    ///
    /// # Errors
    /// When `key` or `value` names no column of a string or binary type, (without `value`)
    /// a column cannot be written as JSON, or the producer cannot start.
    pub fn new(
        spec: KafkaSinkSpec,
        schema: &SchemaRef,
        query_id: &str,
        failpoint: Option<Failpoint>,
    ) -> Result<Self, KafkaSinkError> {
        let column = |name: &str| -> Result<usize, KafkaSinkError> {
            let problem = |problem: &str| KafkaSinkError::Column {
                topic: spec.topic.clone(),
                column: name.to_owned(),
                problem: problem.to_owned(),
            };
            let (i, field) = schema
                .column_with_name(name)
                .ok_or_else(|| problem("is not a column of the output"))?;
            if !is_bytes(field.data_type()) {
                return Err(problem(&format!(
                    "is {}, but a key or value must be a string or binary column",
                    field.data_type()
                )));
            }
            Ok(i)
        };
        let key = spec.key.as_deref().map(column).transpose()?;
        let value = match spec.value.as_deref() {
            Some(v) => Bytes::Column(column(v)?),
            None => {
                if let Some(f) = schema
                    .fields()
                    .iter()
                    .find(|f| !super::files::text_supports(f.data_type()))
                {
                    return Err(KafkaSinkError::Column {
                        topic: spec.topic.clone(),
                        column: f.name().clone(),
                        problem: format!("is {}, which JSON values cannot hold", f.data_type()),
                    });
                }
                Bytes::RowJson
            }
        };
        let producer = Self::start_producer(&spec, query_id)?;
        Ok(Self {
            spec,
            key,
            value,
            failpoint,
            query_id: query_id.to_owned(),
            producer,
            last_marked: None,
            open: None,
            skipping: false,
            json: Vec::new(),
        })
    }

    fn marker(query_id: &str, batch_id: u64) -> String {
        format!("{query_id}/{batch_id}")
    }

    fn start_producer(
        spec: &KafkaSinkSpec,
        query_id: &str,
    ) -> Result<ThreadedProducer<DeliveryTracker>, KafkaSinkError> {
        let client = |error| KafkaSinkError::Client {
            topic: spec.topic.clone(),
            bootstrap: spec.bootstrap_servers.clone(),
            error: Box::new(error),
        };
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &spec.bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("compression.codec", "lz4");
        if spec.delivery == KafkaDelivery::ExactlyOnce {
            config.set("transactional.id", format!("weir-{query_id}"));
        }
        let producer: ThreadedProducer<DeliveryTracker> = config
            .create_with_context(DeliveryTracker::default())
            .map_err(client)?;
        if spec.delivery == KafkaDelivery::ExactlyOnce {
            // Fences an earlier run of the query and aborts its open transaction.
            producer.init_transactions(TIMEOUT).map_err(client)?;
        }
        Ok(producer)
    }

    /// The last batch id this query marked in partition 0, reading back from the end.
    fn read_last_marker(&self, query_id: &str) -> Result<Option<u64>, KafkaSinkError> {
        let err = |error| KafkaSinkError::Markers {
            topic: self.spec.topic.clone(),
            error: Box::new(error),
        };
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.spec.bootstrap_servers)
            .set("group.id", format!("weir-markers-{query_id}"))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .set("fetch.wait.max.ms", "20")
            .set("isolation.level", "read_committed")
            .create()
            .map_err(err)?;
        let topic = self.spec.topic.as_str();
        let (low, high) = match consumer.fetch_watermarks(topic, 0, TIMEOUT) {
            Ok(w) => w,
            // No topic yet: nothing was ever written.
            Err(KafkaError::MetadataFetch(_)) => return Ok(None),
            Err(e) => return Err(err(e)),
        };
        let prefix = format!("{query_id}/");
        let mut end = high;
        let mut window = SCAN_WINDOW;
        while end > low {
            let start = (end - window).max(low);
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, 0, Offset::Offset(start))
                .map_err(err)?;
            consumer.assign(&tpl).map_err(err)?;
            let mut found = None;
            let mut next = start;
            let mut idle = 0;
            while next < end && idle < 200 {
                match consumer.poll(Duration::from_millis(50)) {
                    Some(Ok(m)) => {
                        idle = 0;
                        next = m.offset() + 1;
                        if m.offset() >= end {
                            break;
                        }
                        if let Some(id) = marker_of(&m, &prefix) {
                            found = Some(found.map_or(id, |f: u64| f.max(id)));
                        }
                    }
                    Some(Err(e)) => return Err(err(e)),
                    None => {
                        idle += 1;
                        if let Ok(pos) = consumer.position()
                            && let Some(Offset::Offset(p)) =
                                pos.find_partition(topic, 0).map(|e| e.offset())
                            && p >= end
                        {
                            break;
                        }
                    }
                }
            }
            let _ = consumer.unassign();
            if found.is_some() {
                return Ok(found);
            }
            end = start;
            window = window.saturating_mul(4);
        }
        Ok(None)
    }
}

/// Whether `m` is a batch marker of a Kafka sink (of any query).
pub fn is_marker<M: Message>(m: &M) -> bool {
    m.payload().is_none()
        && m.headers()
            .is_some_and(|h| h.iter().any(|h| h.key == MARKER_HEADER))
}

/// The batch id of a marker record of the query whose header value starts with `prefix`.
pub fn marker_of<M: Message>(m: &M, prefix: &str) -> Option<u64> {
    let headers = m.headers()?;
    headers.iter().find_map(|h| {
        if h.key != MARKER_HEADER {
            return None;
        }
        let v = std::str::from_utf8(h.value?).ok()?;
        v.strip_prefix(prefix)?.parse().ok()
    })
}

impl Sink for KafkaSink {
    fn description(&self) -> String {
        format!("KafkaSink[{}]", self.spec.topic)
    }

    fn write_batch(
        &mut self,
        info: &BatchInfo,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<u64, super::SinkError> {
        let result = self.write(info, schema, batches);
        if result.is_err() {
            // The outcome of a failed transaction step is unknown: look again next time.
            self.last_marked = None;
        }
        Ok(result?)
    }

    fn part_writer(&mut self) -> Option<&mut dyn super::PartWriter> {
        Some(self)
    }
}

/// Real-time mode: a batch's transaction is opened by its first part and committed, with the
/// batch's marker, when its parts end; readers with `read_committed` see the rows then, others
/// as they pass. With `delivery = "at-least-once"` every reader sees them as they pass.
impl super::PartWriter for KafkaSink {
    fn begin_parts(&mut self, info: &BatchInfo) -> Result<(), super::SinkError> {
        if self.open.is_some() {
            self.abandon();
        }
        self.skipping = self.already_written(info.batch_id)?;
        Ok(())
    }

    fn write_part(
        &mut self,
        info: &BatchInfo,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<u64, super::SinkError> {
        let n = info.batch_id;
        let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
        if self.skipping || rows == 0 {
            return Ok(rows);
        }
        if self.open.is_none() {
            self.begin(n)?;
        }
        if let Err(e) = self.send_rows(n, schema, batches) {
            self.abandon();
            return Err(e.into());
        }
        Ok(rows)
    }

    fn finish_parts(&mut self, info: &BatchInfo) -> Result<(), super::SinkError> {
        let n = info.batch_id;
        if self.skipping {
            self.skipping = false;
            return Ok(());
        }
        if self.open.is_none() {
            self.begin(n)?;
        }
        Ok(self.finish(n, Ok(()))?)
    }
}

impl KafkaSink {
    fn write(
        &mut self,
        info: &BatchInfo,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<u64, KafkaSinkError> {
        let n = info.batch_id;
        let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
        if self.already_written(n)? {
            return Ok(rows);
        }
        self.begin(n)?;
        let sent = self.send_rows(n, schema, batches);
        self.finish(n, sent)?;
        Ok(rows)
    }

    /// Whether batch `n` is in the topic already (its marker is there), reading the last
    /// marker back first when it is not known.
    fn already_written(&mut self, n: u64) -> Result<bool, KafkaSinkError> {
        if self.last_marked.is_none() {
            let query_id = self.query_id.clone();
            self.last_marked = Some(self.read_last_marker(&query_id)?);
        }
        let written = self.last_marked.flatten().is_some_and(|m| m >= n);
        if written {
            tracing::info!(topic = %self.spec.topic, batch_id = n, "batch {n} is already in the topic (its marker is there): not producing it again");
        }
        Ok(written)
    }

    fn produce_error(&self, n: u64, step: &'static str, error: KafkaError) -> KafkaSinkError {
        KafkaSinkError::Produce {
            topic: self.spec.topic.clone(),
            batch_id: n,
            step,
            error: Box::new(error),
        }
    }

    /// Opens batch `n`'s transaction (exactly-once delivery).
    fn begin(&mut self, n: u64) -> Result<(), KafkaSinkError> {
        if self.spec.delivery == KafkaDelivery::ExactlyOnce {
            self.producer
                .begin_transaction()
                .map_err(|e| self.produce_error(n, "begin transaction", e))?;
        }
        self.open = Some(n);
        Ok(())
    }

    /// Ends batch `n` whose rows were `sent`: every row delivered, then the marker, then the
    /// commit; on any failure the transaction is aborted.
    fn finish(&mut self, n: u64, sent: Result<(), KafkaSinkError>) -> Result<(), KafkaSinkError> {
        let transactional = self.spec.delivery == KafkaDelivery::ExactlyOnce;
        let topic = self.spec.topic.clone();
        let query_id = self.query_id.clone();
        let produce_err = |step, error| KafkaSinkError::Produce {
            topic: topic.clone(),
            batch_id: n,
            step,
            error: Box::new(error),
        };
        let producer = &self.producer;
        let delivered = |step: &'static str| -> Result<(), KafkaSinkError> {
            drain(producer).map_err(|e| produce_err(step, e))?;
            match producer.context().take() {
                (0, _) => Ok(()),
                (failed, first) => Err(KafkaSinkError::Delivery {
                    topic: topic.clone(),
                    batch_id: n,
                    failed,
                    first: first.unwrap_or_default(),
                }),
            }
        };
        let finish = sent.and_then(|()| {
            // Every row is at the broker before the marker is sent, so that a marker never
            // stands for rows that failed (which matters without a transaction).
            delivered("flushing the rows")?;
            Failpoint::check(self.failpoint.as_ref(), Phase::InSink, n);
            let headers = OwnedHeaders::new().insert(Header {
                key: MARKER_HEADER,
                value: Some(Self::marker(&query_id, n).as_bytes()),
            });
            let marker: BaseRecord<'_, (), ()> =
                BaseRecord::to(&topic).partition(0).headers(headers);
            send(producer, marker).map_err(|e| produce_err("producing the batch marker", e))?;
            // Delivered before the commit, whose own flush would wait in 100 ms steps.
            delivered("flushing the batch marker")?;
            if transactional {
                producer
                    .commit_transaction(TIMEOUT)
                    .map_err(|e| produce_err("commit transaction", e))
            } else {
                Ok(())
            }
        });
        self.open = None;
        if let Err(e) = finish {
            self.abandon();
            return Err(e);
        }
        self.last_marked = Some(Some(n));
        Ok(())
    }

    /// Drops an attempt: aborts its transaction; its outcome is unknown, so the last marker
    /// is read back again before the next batch.
    fn abandon(&mut self) {
        if self.spec.delivery == KafkaDelivery::ExactlyOnce {
            let _ = self.producer.abort_transaction(TIMEOUT);
        }
        // Failures of this attempt are reported; the next one starts counting afresh.
        let _ = self.producer.context().take();
        self.open = None;
        self.last_marked = None;
    }

    fn send_rows(
        &mut self,
        n: u64,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<(), KafkaSinkError> {
        let producer = &self.producer;
        let topic = self.spec.topic.as_str();
        let produce_err = |error| KafkaSinkError::Produce {
            topic: topic.to_owned(),
            batch_id: n,
            step: "producing a row",
            error: Box::new(error),
        };
        for batch in batches {
            let key = self.key.map(|k| batch.column(k));
            match self.value {
                Bytes::Column(v) => {
                    let value = batch.column(v);
                    for row in 0..batch.num_rows() {
                        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic);
                        if let Some(k) = key.and_then(|k| bytes_at(k, row)) {
                            record = record.key(k);
                        }
                        if let Some(v) = bytes_at(value, row) {
                            record = record.payload(v);
                        }
                        send(producer, record).map_err(produce_err)?;
                    }
                }
                Bytes::RowJson => {
                    self.json.clear();
                    super::files::write_json(&mut self.json, schema, std::slice::from_ref(batch))
                        .map_err(|error| KafkaSinkError::Encode {
                        topic: topic.to_owned(),
                        batch_id: n,
                        error,
                    })?;
                    let mut lines = self.json.split(|&b| b == b'\n');
                    for row in 0..batch.num_rows() {
                        let line = lines.next().unwrap_or_default();
                        let mut record: BaseRecord<'_, [u8], [u8]> =
                            BaseRecord::to(topic).payload(line);
                        if let Some(k) = key.and_then(|k| bytes_at(k, row)) {
                            record = record.key(k);
                        }
                        send(producer, record).map_err(produce_err)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Waits until every record sent is delivered (or failed) and its report served.
///
/// Not `flush`: rdkafka's flush waits for reports in 100 ms polls of its own, which the
/// producer's polling thread answers first, so each flush would take 100 ms.
fn drain(producer: &ThreadedProducer<DeliveryTracker>) -> Result<(), KafkaError> {
    let deadline = std::time::Instant::now() + TIMEOUT;
    while producer.in_flight_count() > 0 {
        if std::time::Instant::now() >= deadline {
            return Err(KafkaError::Flush(
                rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
            ));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

/// Sends one record, waiting while the producer's queue is full.
fn send<K, P>(
    producer: &ThreadedProducer<DeliveryTracker>,
    mut record: BaseRecord<'_, K, P>,
) -> Result<(), KafkaError>
where
    K: rdkafka::message::ToBytes + ?Sized,
    P: rdkafka::message::ToBytes + ?Sized,
{
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((
                KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                r,
            )) => {
                record = r;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err((e, _)) => return Err(e),
        }
    }
}
