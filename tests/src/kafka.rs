//! A Kafka-protocol broker for the tests: librdkafka's mock cluster, started inside the test
//! process on 127.0.0.1 with a random port, or tansu ([`crate::tansu`]) as its own process.
//! The `weir` child process reaches either over TCP like any broker. The mock keeps at most
//! 5 MiB per partition, so records are produced with lz4.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

/// A running broker: the mock cluster of one broker, or tansu.
pub struct Broker {
    backend: Backend,
}

enum Backend {
    Mock(MockCluster<'static, DefaultProducerContext>),
    Tansu(crate::tansu::Tansu),
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("bootstrap", &self.bootstrap())
            .finish()
    }
}

/// Key of the records [`Broker::seal`] adds.
pub const SEAL_KEY: &str = "weir-tests.seal";
/// Value of the records [`Broker::seal`] adds: not JSON.
pub const SEAL_VALUE: &str = "seal";

/// One record read back from a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// Header `weir.batch`, if any.
    pub marker: Option<String>,
}

impl Broker {
    /// Starts a mock broker on a random port of 127.0.0.1.
    pub fn start() -> Result<Self> {
        let cluster = MockCluster::new(1).context("starting the mock cluster")?;
        Ok(Self {
            backend: Backend::Mock(cluster),
        })
    }

    /// Starts tansu on a free port of 127.0.0.1 (see [`crate::tansu`]).
    pub fn tansu() -> Result<Self> {
        Ok(Self {
            backend: Backend::Tansu(crate::tansu::Tansu::start()?),
        })
    }

    /// `host:port` of the broker.
    pub fn bootstrap(&self) -> String {
        match &self.backend {
            Backend::Mock(cluster) => cluster.bootstrap_servers(),
            Backend::Tansu(tansu) => tansu.bootstrap(),
        }
    }

    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<()> {
        match &self.backend {
            Backend::Mock(cluster) => cluster
                .create_topic(topic, partitions, 1)
                .with_context(|| format!("creating topic {topic}")),
            Backend::Tansu(tansu) => tansu.create_topic(topic, partitions),
        }
    }

    /// Produces `values` to `topic`, value `i` to partition `i % partitions`, key `k<i>`,
    /// lz4-compressed, and waits until all are acknowledged.
    pub fn produce(&self, topic: &str, partitions: i32, values: &[String]) -> Result<()> {
        self.send(topic, |i| (i as i32) % partitions, "lz4", values)
    }

    /// Produces `values` to one partition with compression `codec` ("none", "lz4", ...).
    pub fn produce_to(
        &self,
        topic: &str,
        partition: i32,
        codec: &str,
        values: &[String],
    ) -> Result<()> {
        self.send(topic, |_| partition, codec, values)
    }

    fn send(
        &self,
        topic: &str,
        partition_of: impl Fn(usize) -> i32,
        codec: &str,
        values: &[String],
    ) -> Result<()> {
        let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .set("compression.codec", codec)
            .set("linger.ms", "5")
            .create()
            .context("creating a producer")?;
        for (i, v) in values.iter().enumerate() {
            let key = format!("k{i}");
            let partition = partition_of(i);
            let mut record = BaseRecord::to(topic)
                .partition(partition)
                .key(key.as_bytes())
                .payload(v.as_bytes());
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((e, r)) => {
                        if e.rdkafka_error_code()
                            != Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
                        {
                            bail!("producing to {topic}: {e}");
                        }
                        record = r;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
        }
        producer
            .flush(Duration::from_secs(30))
            .context("flushing the producer")?;
        Ok(())
    }

    /// On tansu, makes the high watermarks of `topic` true (see [`crate::tansu`]): after a
    /// pause, one record per partition with key [`SEAL_KEY`] and a value that is not JSON
    /// (a JSON source with `on_malformed = "drop"` drops it; [`Broker::read_all`] skips it).
    /// Returns the records added: none on the mock, whose watermarks are exact.
    pub fn seal(&self, topic: &str, partitions: i32) -> Result<usize> {
        if matches!(self.backend, Backend::Mock(_)) {
            return Ok(0);
        }
        // Longer than tansu's clock resolution, so the seal's batch is the newest one.
        std::thread::sleep(Duration::from_millis(50));
        let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .context("creating a producer")?;
        for p in 0..partitions {
            let record = BaseRecord::to(topic)
                .partition(p)
                .key(SEAL_KEY)
                .payload(SEAL_VALUE);
            producer
                .send(record)
                .map_err(|(e, _)| anyhow::anyhow!("sealing {topic}-{p}: {e}"))?;
        }
        producer
            .flush(Duration::from_secs(30))
            .context("flushing the seal records")?;
        Ok(partitions as usize)
    }

    /// Low and high watermark of one partition.
    pub fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64)> {
        let consumer = self.consumer()?;
        Ok(consumer.fetch_watermarks(topic, partition, Duration::from_secs(10))?)
    }

    fn consumer(&self) -> Result<BaseConsumer> {
        Ok(ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .set("group.id", "weir-tests")
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "20")
            .create()?)
    }

    /// Every record of `topic`, partition by partition in offset order, but the seal records
    /// (on tansu the topic is sealed first, so that the high watermarks are the log end).
    pub fn read_all(&self, topic: &str, partitions: i32) -> Result<Vec<Read>> {
        self.seal(topic, partitions)?;
        let consumer = self.consumer()?;
        let mut out = Vec::new();
        for p in 0..partitions {
            let (low, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
            if high <= low {
                continue;
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, p, Offset::Offset(low))?;
            consumer.assign(&tpl)?;
            let mut next = low;
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while next < high {
                if std::time::Instant::now() > deadline {
                    bail!("reading {topic}-{p}: stuck at {next} of {high}");
                }
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) => {
                        next = m.offset() + 1;
                        if m.key() == Some(SEAL_KEY.as_bytes()) {
                            continue;
                        }
                        let marker = m.headers().and_then(|h| {
                            h.iter()
                                .find(|h| h.key == "weir.batch")
                                .and_then(|h| h.value)
                                .map(|v| String::from_utf8_lossy(v).into_owned())
                        });
                        out.push(Read {
                            partition: p,
                            offset: m.offset(),
                            key: m.key().map(<[u8]>::to_vec),
                            value: m.payload().map(<[u8]>::to_vec),
                            marker,
                        });
                    }
                    Some(Err(e)) => bail!("reading {topic}-{p}: {e}"),
                    // The last offsets may be transaction control records, never delivered.
                    None => {
                        let position = consumer.position()?;
                        if let Some(Offset::Offset(at)) =
                            position.find_partition(topic, p).map(|e| e.offset())
                        {
                            next = next.max(at);
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

/// The non-blank lines of the `orders-*.json` files in `dir`, in file order.
pub fn order_lines(dir: &std::path::Path) -> Result<Vec<String>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    let mut lines = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f)?;
        lines.extend(
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_owned),
        );
    }
    Ok(lines)
}
