//! `weir-bench kafka`: Kafka → JSON decode → Parquet files, JSON files or a Delta table.
//!
//! N orders (generated, or the lines of `--input DIR`) are produced (lz4) to a topic of a
//! broker, then `weir run` reads them in a child process, whose own CPU seconds and peak RSS
//! are measured (wait4): the broker's work is not counted. The broker is librdkafka's mock
//! cluster in this process (`--broker mock`), which keeps at most 5 MiB per partition (1M
//! orders need 16 partitions), or tansu (`--broker tansu`, the binary at `$WEIR_TANSU`, as
//! the tests use it), which keeps everything in memory, so 1M orders fit on 4 partitions.
//! Both serve fetches from memory, so this measures Weir's side (fetch, decode, write), not a
//! broker's disk.
//!
//! tansu 0.6.0 can report a high watermark below the log end (it takes the end of the most
//! recently modified stored batch); after producing, one record that is not JSON is added to
//! each partition after a pause, which makes it the newest batch and its end the true one, and
//! the pipeline drops it as malformed (`tests/src/tansu.rs` explains it for the tests).

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

use super::{flag, measure, median};

pub fn kafka(args: &[String]) -> Result<()> {
    let orders: usize = flag(args, "--orders").map_or(Ok(1_000_000), |r| r.parse())?;
    let partitions: i32 = flag(args, "--partitions").map_or(Ok(4), |r| r.parse())?;
    let runs: usize = flag(args, "--runs").map_or(Ok(3), |r| r.parse())?;
    let sink = flag(args, "--format").unwrap_or_else(|| "parquet".into());
    let input = flag(args, "--input").map(PathBuf::from);
    let broker_kind = flag(args, "--broker").unwrap_or_else(|| "mock".into());
    let work = match flag(args, "--work") {
        Some(w) => PathBuf::from(w),
        None => std::env::temp_dir().join(format!("weir-bench-kafka-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work)?;

    let broker = match broker_kind.as_str() {
        "mock" => {
            let cluster: MockCluster<'static, DefaultProducerContext> =
                MockCluster::new(1).context("starting the mock cluster")?;
            cluster.create_topic("orders", partitions, 1)?;
            Broker::Mock(cluster)
        }
        "tansu" => {
            let tansu = Tansu::start()?;
            tansu.create_topic("orders", partitions)?;
            Broker::Tansu(tansu)
        }
        other => bail!("--broker {other}: use mock or tansu"),
    };
    let bootstrap = broker.bootstrap();

    let data = match &input {
        Some(dir) => dir.clone(),
        None => {
            let data = work.join("data");
            weir_host::examples::write_orders(
                &data,
                weir_host::examples::OrdersSpec {
                    files: 10,
                    lines_per_file: orders.div_ceil(10),
                    seed: 42,
                    malformed_every: 0,
                },
            )?;
            data
        }
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&data)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("compression.codec", "lz4")
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .create()?;
    let started = Instant::now();
    let mut produced = 0usize;
    for f in &files {
        let text = std::fs::read_to_string(f)?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let record: BaseRecord<'_, (), str> = BaseRecord::to("orders")
                .partition((produced as i32) % partitions)
                .payload(line);
            send(&producer, record)?;
            produced += 1;
        }
    }
    producer.flush(Duration::from_secs(120))?;
    let produce_s = started.elapsed().as_secs_f64();
    let records = produced + broker.seal(&producer, partitions)?;
    let high = broker.high_watermarks(partitions)?;
    if high != records as i64 {
        bail!("the broker reports {high} records, {records} were produced");
    }
    eprintln!(
        "produced {produced} orders to {partitions} partitions in {produce_s:.2} s ({:.0}/s)",
        produced as f64 / produce_s
    );

    // Each run in folders of its own, deleted only once all are measured (see `pipeline`).
    let runs_dir = work.join("runs");
    if runs_dir.exists() {
        std::fs::remove_dir_all(&runs_dir)?;
    }
    let pipeline = |run: usize| {
        format!(
            r#"[query]
name = "bench_kafka"
checkpoint = "runs/{run}/checkpoints/kafka"
trigger = "available-now"

[[source]]
name = "orders"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
subscribe = ["orders"]
starting_offsets = "earliest"
max_offsets_per_trigger = 200000
format = "json"
schema = "{}"
on_malformed = "drop"

{}
"#,
            weir_host::examples::ORDERS_SCHEMA,
            if sink == "delta" {
                format!("[sink]\nkind = \"delta\"\npath = \"runs/{run}/out/kafka\"\n")
            } else {
                format!(
                    "[sink]\nkind = \"files\"\npath = \"runs/{run}/out/kafka\"\nformat = \"{sink}\"\n"
                )
            }
        )
    };
    let exe = std::env::current_exe()?;
    let cache = work.join("plugin-cache");
    let mut samples = Vec::new();
    for run in 0..runs.max(1) {
        let file = work.join(format!("kafka-{run}.toml"));
        std::fs::write(&file, pipeline(run))?;
        let s = measure(&exe, &cache, "kafka", &file)?;
        if s.rows != records as u64 {
            bail!("read {} records, produced {records}", s.rows);
        }
        eprintln!("kafka: {s}");
        samples.push(s);
    }
    std::fs::remove_dir_all(&runs_dir)?;
    let wall = median(samples.iter().map(|s| s.wall.as_secs_f64()).collect());
    let cpu = median(samples.iter().map(|s| s.cpu.as_secs_f64()).collect());
    let rss = samples.iter().map(|s| s.max_rss_kb).max().unwrap_or(0) / 1024;
    println!(
        "| pipeline | runs | rows | wall s (median) | CPU s (median) | rows per CPU-second | rows/s wall | peak RSS MB (max) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| kafka ({broker_kind}, {partitions} partitions) → json → {sink} | {} | {produced} | {wall:.3} | {cpu:.3} | {:.0} | {:.0} | {rss} |",
        samples.len(),
        produced as f64 / cpu,
        produced as f64 / wall
    );
    drop(broker);
    Ok(())
}

enum Broker {
    Mock(MockCluster<'static, DefaultProducerContext>),
    Tansu(Tansu),
}

impl Broker {
    fn bootstrap(&self) -> String {
        match self {
            Broker::Mock(cluster) => cluster.bootstrap_servers(),
            Broker::Tansu(tansu) => tansu.addr.to_string(),
        }
    }

    /// On tansu, one record that is not JSON per partition, alone and after a pause, so that
    /// the reported high watermarks are the log ends (see the module docs). Returns the
    /// records added.
    fn seal(
        &self,
        producer: &ThreadedProducer<DefaultProducerContext>,
        partitions: i32,
    ) -> Result<usize> {
        if matches!(self, Broker::Mock(_)) {
            return Ok(0);
        }
        std::thread::sleep(Duration::from_millis(50));
        for p in 0..partitions {
            let record: BaseRecord<'_, (), str> =
                BaseRecord::to("orders").partition(p).payload("seal");
            producer
                .send(record)
                .map_err(|(e, _)| anyhow::anyhow!("sealing partition {p}: {e}"))?;
        }
        producer.flush(Duration::from_secs(30))?;
        Ok(partitions as usize)
    }

    /// The sum of the high watermarks of `orders`.
    fn high_watermarks(&self, partitions: i32) -> Result<i64> {
        high_watermark_sum(&self.bootstrap(), "orders", partitions)
    }
}

/// The sum of the high watermarks of partitions `0..partitions` of `topic`, each of which
/// must still start at offset 0 (the broker dropped nothing).
pub(crate) fn high_watermark_sum(bootstrap: &str, topic: &str, partitions: i32) -> Result<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let mut sum = 0;
    for p in 0..partitions {
        let (low, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        if low != 0 {
            bail!("{topic}-{p} starts at {low}: the broker dropped records");
        }
        sum += high;
    }
    Ok(sum)
}

/// A tansu broker on a free port of 127.0.0.1, in-memory storage; killed when dropped.
struct Tansu {
    child: Child,
    binary: PathBuf,
    addr: SocketAddr,
}

impl Tansu {
    fn start() -> Result<Self> {
        let binary = match std::env::var_os("WEIR_TANSU") {
            Some(p) => PathBuf::from(p),
            None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?)
                .join(".cache/weir/tansu-venv/bin/tansu"),
        };
        let addr = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?;
        let url = format!("tcp://{addr}");
        let child = Command::new(&binary)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/", "--silent"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| {
                format!(
                    "starting tansu at {} (.ci/run installs it; or set WEIR_TANSU)",
                    binary.display()
                )
            })?;
        let tansu = Self {
            child,
            binary,
            addr,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
            if Instant::now() > deadline {
                bail!("tansu did not listen on {addr} in 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(tansu)
    }

    fn create_topic(&self, topic: &str, partitions: i32) -> Result<()> {
        let out = Command::new(&self.binary)
            .args([
                "topic",
                "create",
                "--broker",
                &format!("tcp://{}", self.addr),
            ])
            .args(["--partitions", &partitions.to_string(), topic])
            .output()?;
        if !out.status.success() {
            bail!(
                "tansu topic create {topic}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `record`, waiting while the producer's queue is full.
pub(crate) fn send(
    producer: &ThreadedProducer<DefaultProducerContext>,
    mut record: BaseRecord<'_, (), str>,
) -> Result<()> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((e, r)) => {
                if e.rdkafka_error_code() != Some(rdkafka::types::RDKafkaErrorCode::QueueFull) {
                    bail!("producing to {}: {e}", r.topic);
                }
                record = r;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}
