//! `weir-bench latency [--rate N] [--seconds S] [--warmup S] [--query stateless|count]
//! [--mode real-time|micro-batch] [--interval DURATION] [--partitions P] [--tick MS]
//! [--engine weir|spark] [--spark-python PY] [--work DIR]`:
//! end-to-end latency of Kafka → Weir → Kafka, or of the same pipeline in Spark.
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
//! The warm-up (`--warmup` seconds) starts when the first output record arrives, so start-up
//! (plugin compilation, the consumer joining, a JVM starting) and the backlog it leaves are not
//! part of the figures: only events produced after it count, and the engine's CPU (every
//! process of its process group, from `/proc`) is read at its end and at the end of the run.
//! `--mode micro-batch` runs the same pipeline with the default trigger (each batch starts when
//! the previous one ends), the anchor of the CPU bar.
//!
//! `--engine spark --spark-python PY` runs `benches/spark_latency.py` with that Python (pyspark
//! 4.3 and confluent-kafka) instead of `weir run`: the same queries in Spark on its default
//! trigger, reading and writing Kafka through pyspark's Python streaming data sources, since
//! Spark's Kafka connector is not in pyspark's wheel (the script says more). `--mode real-time`
//! there asks for Spark's real-time mode.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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
    let engine = flag(args, "--engine").unwrap_or_else(|| "weir".into());
    let spark_python = flag(args, "--spark-python");
    if !matches!(engine.as_str(), "weir" | "spark") {
        bail!("--engine {engine}: use weir or spark");
    }
    if (engine == "spark") != spark_python.is_some() {
        bail!("--engine spark and --spark-python PY go together");
    }
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

    let mut child = match &spark_python {
        None => Command::new(std::env::current_exe()?)
            .args(["cli", "run"])
            .arg(&file)
            .arg("--cache-dir")
            .arg(work.join("plugin-cache"))
            .env("WEIR_LOG", "warn")
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()?,
        Some(python) => Command::new(python)
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("spark_latency.py"))
            .args(["--bootstrap", &bootstrap])
            .args(["--partitions", &partitions.to_string()])
            .args(["--query", &query])
            .arg("--checkpoint")
            .arg(work.join("spark-checkpoint"))
            .args([
                "--trigger",
                if mode == "real-time" {
                    "realtime"
                } else {
                    "default"
                },
            ])
            .args(["--interval", &interval])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(work.join("spark.log"))?)
            .process_group(0)
            .spawn()?,
    };
    let pid = child.id();
    let engine_name = if engine == "spark" {
        "spark"
    } else {
        "weir run"
    };

    // The reader of the output, from its start as it is written (the mock keeps only the
    // last 5 MiB of a partition): the latency of every record whose event was produced in the
    // measured window.
    let window_from = Arc::new(AtomicI64::new(i64::MAX));
    let reader_stop = Arc::new(AtomicBool::new(false));
    let outputs = Arc::new(AtomicU64::new(0));
    let reader = {
        let (window_from, reader_stop, outputs, bootstrap) = (
            Arc::clone(&window_from),
            Arc::clone(&reader_stop),
            Arc::clone(&outputs),
            bootstrap.clone(),
        );
        std::thread::spawn(move || read_output(&bootstrap, &window_from, &reader_stop, &outputs))
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
    // The warm-up starts with the first output record.
    while outputs.load(Ordering::Relaxed) == 0 {
        if let Some(status) = child.try_wait()? {
            bail!(
                "{engine_name} ended before any output ({status}){}",
                log_hint(&work)
            );
        }
        if now_ms() - run_started_ms > 300_000 {
            kill_group(&mut child);
            bail!("no output from {engine_name} in 300 s{}", log_hint(&work));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let first_output_ms = now_ms();
    let peak_rss_kb = Arc::new(AtomicU64::new(0));
    let sampler_stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (Arc::clone(&peak_rss_kb), Arc::clone(&sampler_stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(group_usage(pid).rss_kb, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    std::thread::sleep(Duration::from_secs(warmup));
    let cpu_start = group_usage(pid).cpu_ticks;
    let measured_from_ms = now_ms();
    window_from.store(measured_from_ms, Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    producer_thread
        .join()
        .map_err(|_| anyhow::anyhow!("the producer panicked"))??;
    // What was produced last reaches the sink (a Spark micro-batch may take seconds).
    std::thread::sleep(Duration::from_secs(if engine == "spark" { 15 } else { 2 }));
    let cpu_end = group_usage(pid).cpu_ticks;
    sampler_stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let mut peak_rss_mb = peak_rss_kb.load(Ordering::Relaxed) / 1024;
    if engine == "weir" {
        let killed = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        if !killed.success() {
            bail!("kill -TERM {pid}");
        }
        let used = super::wait_measured(&child, Instant::now(), "weir run")?;
        let _ = child.wait();
        peak_rss_mb = peak_rss_mb.max(u64::try_from(used.max_rss_kb / 1024).unwrap_or(0));
    } else {
        // Spark's side does not stop on a signal by itself: the JVM and the Python workers
        // are ended with it.
        kill_group(&mut child);
    }

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
        "latency: {engine} {mode} {query} at {rate}/s: {events} events produced, {out_records} output records, first output {} ms after the start, window {} ms after it",
        first_output_ms - run_started_ms,
        measured_from_ms - first_output_ms
    );
    println!(
        "| engine | query | mode | events/s | seconds | outputs measured | p50 ms | p99 ms | p99.9 ms | max ms | CPU s in window | CPU µs per event | peak RSS MB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {engine} | {query} | {mode}{} | {rate} | {seconds} | {} | {} | {} | {} | {} | {cpu_s:.2} | {:.2} | {peak_rss_mb} |",
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

/// What the processes of process group `group` use now: their CPU so far (user plus system,
/// in clock ticks) and their resident memory. A process that ended is not counted, which the
/// engines here never do while measured (Spark reuses its Python workers).
struct GroupUsage {
    cpu_ticks: u64,
    rss_kb: u64,
}

fn group_usage(group: u32) -> GroupUsage {
    let mut usage = GroupUsage {
        cpu_ticks: 0,
        rss_kb: 0,
    };
    let page_kb = {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(p).unwrap_or(4096) / 1024
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return usage;
    };
    for entry in entries.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // The fields after the command name (which may hold spaces) in parentheses: the
        // process group is field 5 of the line, utime and stime 14 and 15, rss 24.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        if field(2) != u64::from(group) {
            continue;
        }
        usage.cpu_ticks += field(11) + field(12);
        usage.rss_kb += field(21) * page_kb;
    }
    usage
}

/// Ends `child` and every process of its group.
fn kill_group(child: &mut Child) {
    if let Ok(group) = i32::try_from(child.id()) {
        // SAFETY: signals the process group this bench created for the child; a group
        // already gone only makes `kill` return ESRCH.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
    }
    let _ = child.wait();
}

fn log_hint(work: &Path) -> String {
    let log = work.join("spark.log");
    std::fs::read_to_string(&log)
        .map(|text| {
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("; the end of {}:\n{}", log.display(), tail.join("\n"))
        })
        .unwrap_or_default()
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
    outputs: &AtomicU64,
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
                outputs.store(records, Ordering::Relaxed);
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
