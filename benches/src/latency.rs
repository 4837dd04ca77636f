//! `weir-bench latency [--rate N] [--seconds S] [--warmup S] [--query stateless|count]
//! [--mode real-time|micro-batch] [--interval DURATION] [--partitions P] [--tick MS]
//! [--work DIR]`:
//! end-to-end latency of Kafka → Weir → Kafka.
//!
//! A producer thread writes JSON events at a steady `--rate` per second (the events due every
//! `--tick` ms, default 20, sent at once, `linger.ms` = 0) to a topic of librdkafka's mock cluster, in this process and
//! reached over TCP. Each event carries `ts`, the time it was produced, which is also its Kafka
//! timestamp. `weir run` (a child process) reads the topic, runs a stateless Wasm transform
//! (`normalize_status` lowercasing `key`) or an update-mode count by key (with `max(ts)`, the
//! newest event a count includes), and writes to a second topic with the transactional Kafka
//! sink. The latency of an output record is its Kafka timestamp (set when the sink produced it)
//! minus its `ts`: produce time to the sink's write, both from record timestamps.
//!
//! Only events produced after `--warmup` seconds count, and the child's CPU is read from
//! `/proc/<pid>/stat` at the end of the warm-up and at the end of the run, so start-up
//! (plugin compilation, the consumer joining) is not part of the figures. `--mode micro-batch`
//! runs the same pipeline with the default trigger (each batch starts when the previous one
//! ends), the anchor of the CPU bar.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message, Timestamp};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use super::flag;

const OUT_PARTITIONS: i32 = 4;
/// The producer's pace (`--tick`, default 20 ms): every tick, the events due, sent at once
/// (one message set per partition), each stamped with the time it is sent, so the tick adds
/// nothing to a measured latency. The mock cluster finds an offset by walking a partition's
/// message sets from the oldest it keeps (the last 5 MiB, or 100,000 sets), and answers a
/// consumer's empty fetch after the same walk, so every set a tick adds makes each later fetch
/// slower: at 10,000 events/s with 5 ms ticks the broker's thread takes 40 CPU-seconds in a
/// minute and falls behind (Weir, 4), with 20 ms ticks 8 (BENCHMARKS.md §15).
const DEFAULT_TICK_MS: u64 = 20;
const SCHEMA: &str = "id BIGINT, key STRING, ts BIGINT, amount DOUBLE";

pub fn latency(args: &[String]) -> Result<()> {
    let rate: u64 = flag(args, "--rate").map_or(Ok(10_000), |r| r.parse())?;
    let seconds: u64 = flag(args, "--seconds").map_or(Ok(60), |r| r.parse())?;
    let warmup: u64 = flag(args, "--warmup").map_or(Ok(5), |r| r.parse())?;
    let partitions: i32 = flag(args, "--partitions").map_or(Ok(4), |r| r.parse())?;
    let query = flag(args, "--query").unwrap_or_else(|| "stateless".into());
    let mode = flag(args, "--mode").unwrap_or_else(|| "real-time".into());
    let interval = flag(args, "--interval").unwrap_or_else(|| "10s".into());
    let tick =
        Duration::from_millis(flag(args, "--tick").map_or(Ok(DEFAULT_TICK_MS), |r| r.parse())?);
    let work = match flag(args, "--work") {
        Some(w) => PathBuf::from(w),
        None => std::env::temp_dir().join(format!("weir-bench-latency-{}", std::process::id())),
    };
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    std::fs::create_dir_all(&work)?;
    weir_host::examples::write_plugins(&work.join("plugins"))?;

    let cluster: MockCluster<'static, DefaultProducerContext> =
        MockCluster::new(1).context("starting the mock cluster")?;
    cluster.create_topic("events", partitions, 1)?;
    // Several partitions: the mock keeps at most 5 MiB of each.
    cluster.create_topic("out", OUT_PARTITIONS, 1)?;
    let bootstrap = cluster.bootstrap_servers();

    let trigger = match mode.as_str() {
        "real-time" => format!("trigger = {{ real_time = \"{interval}\" }}\n"),
        "micro-batch" => String::new(),
        other => bail!("--mode {other}: use real-time or micro-batch"),
    };
    let (output_mode, stage) = match query.as_str() {
        "stateless" => (
            "append",
            "[[transform]]\nname = \"normalize\"\nplugin = \"plugins/normalize_status.wasm\"\n\
             config = { column = \"key\", lowercase = true }\n"
                .to_owned(),
        ),
        "count" => (
            "update",
            "[aggregate]\ngroup_by = [\"key\"]\nselect = [\"count(*) AS n\", \"max(ts) AS ts\"]\n"
                .to_owned(),
        ),
        other => bail!("--query {other}: use stateless or count"),
    };
    let pipeline = format!(
        r#"[query]
name = "latency"
checkpoint = "checkpoint"
output_mode = "{output_mode}"
{trigger}
[[source]]
name = "events"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
subscribe = ["events"]
starting_offsets = "earliest"
format = "json"
schema = "{SCHEMA}"

{stage}
[sink]
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topic = "out"
"#
    );
    let file = work.join("latency.toml");
    std::fs::write(&file, pipeline)?;

    let exe = std::env::current_exe()?;
    let mut child = Command::new(&exe)
        .args(["cli", "run"])
        .arg(&file)
        .arg("--cache-dir")
        .arg(work.join("plugin-cache"))
        .env("WEIR_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?;
    let pid = child.id();

    // The reader of the output, from its start as it is written (the mock keeps only the
    // last 5 MiB of a partition): the latency of every record whose event was produced in the
    // measured window.
    let window_from = Arc::new(AtomicI64::new(i64::MAX));
    let reader_stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (window_from, reader_stop, bootstrap) = (
            Arc::clone(&window_from),
            Arc::clone(&reader_stop),
            bootstrap.clone(),
        );
        std::thread::spawn(move || read_output(&bootstrap, &window_from, &reader_stop))
    };

    // The producer.
    let stop = Arc::new(AtomicBool::new(false));
    let produced = Arc::new(AtomicU64::new(0));
    let producer_thread = {
        let (stop, produced, bootstrap) =
            (Arc::clone(&stop), Arc::clone(&produced), bootstrap.clone());
        std::thread::spawn(move || -> Result<()> {
            let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("linger.ms", "0")
                .set("compression.codec", "lz4")
                .set("queue.buffering.max.messages", "1000000")
                .create()?;
            let started = Instant::now();
            let mut sent = 0u64;
            let mut line = String::new();
            while !stop.load(Ordering::Relaxed) {
                let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
                while sent < due {
                    let ts = now_ms();
                    line.clear();
                    use std::fmt::Write as _;
                    write!(
                        line,
                        r#"{{"id":{sent},"key":"K{}","ts":{ts},"amount":{}.5}}"#,
                        sent % 1000,
                        sent % 97
                    )?;
                    let record: BaseRecord<'_, (), String> = BaseRecord::to("events")
                        .partition((sent % partitions as u64) as i32)
                        .payload(&line)
                        .timestamp(ts);
                    if let Err((e, _)) = producer.send(record) {
                        bail!("producing: {e}");
                    }
                    sent += 1;
                }
                produced.store(sent, Ordering::Relaxed);
                std::thread::sleep(tick);
            }
            producer.flush(Duration::from_secs(30))?;
            Ok(())
        })
    };

    let run_started_ms = now_ms();
    std::thread::sleep(Duration::from_secs(warmup));
    let cpu_start = cpu_ticks(pid)?;
    let measured_from_ms = now_ms();
    window_from.store(measured_from_ms, Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    producer_thread
        .join()
        .map_err(|_| anyhow::anyhow!("the producer panicked"))??;
    // What was produced last reaches the sink.
    std::thread::sleep(Duration::from_secs(2));
    let cpu_end = cpu_ticks(pid)?;
    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    if !killed.success() {
        bail!("kill -TERM {pid}");
    }
    let started = Instant::now();
    let used = super::wait_measured(&child, started, "weir run")?;
    let _ = child.wait();

    reader_stop.store(true, Ordering::Relaxed);
    let (mut latencies, out_records) = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the reader panicked"))??;
    latencies.sort_unstable();
    let q = |p: f64| -> i64 {
        if latencies.is_empty() {
            return -1;
        }
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len());
        latencies[i - 1]
    };
    let events = produced.load(Ordering::Relaxed);
    let window_events = (rate * seconds) as f64;
    let ticks = clock_ticks_per_second();
    let cpu_s = (cpu_end - cpu_start) as f64 / ticks;
    eprintln!(
        "latency: {mode} {query} at {rate}/s: {events} events produced, {out_records} output records, started {} ms before the window",
        measured_from_ms - run_started_ms
    );
    println!(
        "| query | mode | events/s | seconds | outputs measured | p50 ms | p99 ms | p99.9 ms | max ms | CPU s in window | CPU µs per event | peak RSS MB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {query} | {mode}{} | {rate} | {seconds} | {} | {} | {} | {} | {} | {cpu_s:.2} | {:.2} | {} |",
        if mode == "real-time" {
            format!(" ({interval})")
        } else {
            String::new()
        },
        latencies.len(),
        q(0.5),
        q(0.99),
        q(0.999),
        latencies.last().copied().unwrap_or(-1),
        cpu_s * 1e6 / window_events,
        used.max_rss_kb / 1024
    );
    // Each durable batch's own account (real-time mode: latency percentiles and durations).
    if let Ok(text) = std::fs::read_to_string(work.join("checkpoint/progress.jsonl")) {
        for line in text.lines() {
            let p: serde_json::Value = serde_json::from_str(line)?;
            eprintln!(
                "batch {}: {} rows, durationMs {}, latencyMs {}",
                p["batchId"], p["numInputRows"], p["durationMs"], p["latencyMs"]
            );
        }
    }
    std::fs::remove_dir_all(&work)?;
    drop(cluster);
    if query == "stateless" && out_records != events {
        bail!("{events} events produced, but {out_records} output records");
    }
    Ok(())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// User plus system CPU of process `pid` so far, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').context("/proc stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let utime: u64 = fields.get(11).context("utime")?.parse()?;
    let stime: u64 = fields.get(12).context("stime")?.parse()?;
    Ok(utime + stime)
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// Reads `out` from its start until `stop` and then to its end: the latency (the record's
/// timestamp minus its `ts`) of each record whose `ts` is at or after `window_from`, and the
/// count of all records.
fn read_output(
    bootstrap: &str,
    window_from: &AtomicI64,
    stop: &AtomicBool,
) -> Result<(Vec<i64>, u64)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "latency-bench")
        // Records in open transactions count: their timestamps are when the sink wrote them.
        .set("isolation.level", "read_uncommitted")
        .set("fetch.wait.max.ms", "50")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..OUT_PARTITIONS {
        tpl.add_partition_offset("out", p, Offset::Offset(0))?;
    }
    consumer.assign(&tpl)?;
    let mut next = vec![0i64; OUT_PARTITIONS as usize];
    let mut latencies = Vec::new();
    let mut records = 0u64;
    let mut ends: Option<Vec<i64>> = None;
    loop {
        if ends.is_none() && stop.load(Ordering::Relaxed) {
            let mut e = Vec::new();
            for p in 0..OUT_PARTITIONS {
                e.push(
                    consumer
                        .fetch_watermarks("out", p, Duration::from_secs(10))?
                        .1,
                );
            }
            ends = Some(e);
        }
        if let Some(e) = &ends
            && next.iter().zip(e).all(|(n, e)| n >= e)
        {
            return Ok((latencies, records));
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let p = usize::try_from(m.partition())?;
                if m.offset() < next[p] {
                    bail!("out-{p}: offset {} again", m.offset());
                }
                if m.offset() > next[p] && next[p] == 0 {
                    bail!("out-{p} starts at {}: the mock dropped output", m.offset());
                }
                next[p] = m.offset() + 1;
                let Some(payload) = m.payload() else { continue };
                records += 1;
                let v: serde_json::Value = serde_json::from_slice(payload)?;
                let ts = v["ts"].as_i64().context("ts in an output record")?;
                let written = match m.timestamp() {
                    Timestamp::CreateTime(ms) | Timestamp::LogAppendTime(ms) => ms,
                    Timestamp::NotAvailable => bail!("an output record without a timestamp"),
                };
                if ts >= window_from.load(Ordering::Relaxed) {
                    latencies.push(written - ts);
                }
            }
            Some(Err(e)) => bail!("reading the output: {e}"),
            None => {}
        }
    }
}
