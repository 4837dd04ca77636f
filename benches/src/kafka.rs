//! `weir-bench kafka`: Kafka → JSON decode → Parquet files.
//!
//! N orders are produced (lz4, so that 1M orders fit the mock's 5 MiB per partition) to a
//! topic of librdkafka's mock cluster running in this process, then `weir run` reads them
//! in a child process, whose own CPU seconds and peak RSS are measured (wait4): the broker's
//! work is not counted. The mock serves fetches from memory, so this measures Weir's side
//! (fetch, decode, write), not a broker's disk.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

use super::{flag, measure, median};

pub fn kafka(args: &[String]) -> Result<()> {
    let orders: usize = flag(args, "--orders").map_or(Ok(1_000_000), |r| r.parse())?;
    let partitions: i32 = flag(args, "--partitions").map_or(Ok(4), |r| r.parse())?;
    let runs: usize = flag(args, "--runs").map_or(Ok(3), |r| r.parse())?;
    let sink = flag(args, "--format").unwrap_or_else(|| "parquet".into());
    let work = match flag(args, "--work") {
        Some(w) => PathBuf::from(w),
        None => std::env::temp_dir().join(format!("weir-bench-kafka-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work)?;

    let cluster: MockCluster<'static, DefaultProducerContext> =
        MockCluster::new(1).context("starting the mock cluster")?;
    cluster.create_topic("orders", partitions, 1)?;
    let bootstrap = cluster.bootstrap_servers();

    let data = work.join("data");
    let files = 10usize;
    weir_host::examples::write_orders(
        &data,
        weir_host::examples::OrdersSpec {
            files,
            lines_per_file: orders.div_ceil(files),
            seed: 42,
            malformed_every: 0,
        },
    )?;
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("compression.codec", "lz4")
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .create()?;
    let started = Instant::now();
    let mut produced = 0usize;
    for f in 0..files {
        let text = std::fs::read_to_string(data.join(format!("orders-{f:05}.json")))?;
        for line in text.lines() {
            let mut record: BaseRecord<'_, (), str> = BaseRecord::to("orders")
                .partition((produced as i32) % partitions)
                .payload(line);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((e, r)) => {
                        if e.rdkafka_error_code()
                            != Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
                        {
                            bail!("producing: {e}");
                        }
                        record = r;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
            produced += 1;
        }
    }
    producer.flush(Duration::from_secs(120))?;
    let produce_s = started.elapsed().as_secs_f64();
    eprintln!(
        "produced {produced} orders to {partitions} partitions in {produce_s:.2} s ({:.0}/s)",
        produced as f64 / produce_s
    );

    std::fs::write(
        work.join("kafka.toml"),
        format!(
            r#"[query]
name = "bench_kafka"
checkpoint = "checkpoints/kafka"
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

[sink]
kind = "files"
path = "out/kafka"
format = "{sink}"
"#,
            weir_host::examples::ORDERS_SCHEMA
        ),
    )?;
    let exe = std::env::current_exe()?;
    let cache = work.join("plugin-cache");
    let mut samples = Vec::new();
    for _ in 0..runs.max(1) {
        let s = measure(&exe, &work, &cache, "kafka")?;
        if s.rows != produced as u64 {
            bail!("read {} rows, produced {produced}", s.rows);
        }
        eprintln!(
            "kafka: {} rows in {:.2} s wall, {:.2} CPU-s, peak RSS {} MB",
            s.rows,
            s.wall.as_secs_f64(),
            s.cpu.as_secs_f64(),
            s.max_rss_kb / 1024
        );
        samples.push(s);
    }
    let wall = median(samples.iter().map(|s| s.wall.as_secs_f64()).collect());
    let cpu = median(samples.iter().map(|s| s.cpu.as_secs_f64()).collect());
    let rss = samples.iter().map(|s| s.max_rss_kb).max().unwrap_or(0) / 1024;
    println!(
        "| pipeline | runs | rows | wall s (median) | CPU s (median) | rows per CPU-second | rows/s wall | peak RSS MB (max) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| kafka ({partitions} partitions) → json → {sink} | {} | {produced} | {wall:.3} | {cpu:.3} | {:.0} | {:.0} | {rss} |",
        samples.len(),
        produced as f64 / cpu,
        produced as f64 / wall
    );
    drop(cluster);
    Ok(())
}
