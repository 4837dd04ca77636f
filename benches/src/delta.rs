//! `weir-bench delta`: the cost of a Delta commit and the throughput of a Delta → Delta query.
//!
//! 1. Commit: `--commits` batches of `--rows` orders (10,000 by default) written by the Delta
//!    sink, one commit each (Parquet file + log entry with its txn action); the median and the
//!    90th percentile of the per-batch time.
//! 2. Chain: a silver table of `--chain-rows` orders, then the gold query (Delta source →
//!    Delta sink, no transform) run `--runs` times in this process, each into a fresh gold
//!    table: rows per second of wall time and per CPU second (getrusage of this process over
//!    the run), medians.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use arrow_array::RecordBatch;
use weir_host::plugin::BatchInfo;
use weir_host::query::{Query, QueryOptions};
use weir_host::sink::delta::{DeltaSink, DeltaSinkOptions, WriteMode};

use super::flag;

pub fn delta(args: &[String]) -> Result<()> {
    let rows: usize = flag(args, "--rows").map_or(Ok(10_000), |r| r.parse())?;
    let commits: u64 = flag(args, "--commits").map_or(Ok(50), |r| r.parse())?;
    let chain_rows: usize = flag(args, "--chain-rows").map_or(Ok(1_000_000), |r| r.parse())?;
    let runs: usize = flag(args, "--runs").map_or(Ok(3), |r| r.parse())?;
    let work = match flag(args, "--work") {
        Some(w) => PathBuf::from(w),
        None => std::env::temp_dir().join(format!("weir-bench-delta-{}", std::process::id())),
    };
    if work.exists() {
        std::fs::remove_dir_all(&work).with_context(|| format!("cleaning {}", work.display()))?;
    }
    std::fs::create_dir_all(&work)?;

    let batch = orders(&work.join("gen-commit"), rows)?;
    let mut sink = open_sink(&work, "commit")?;
    let schema = batch.schema();
    let mut times = Vec::new();
    for n in 0..commits {
        let started = Instant::now();
        sink.write(&info(n), &schema, std::slice::from_ref(&batch))?;
        times.push(started.elapsed());
    }
    times.sort_unstable();
    // The first commit also creates the table; the median is unaffected by it.
    println!(
        "delta commit of a {rows}-row batch: median {:.1} ms, p90 {:.1} ms, max {:.1} ms over {commits} commits",
        ms(times[times.len() / 2]),
        ms(times[times.len() * 9 / 10]),
        ms(times[times.len() - 1]),
    );

    // Silver: the chain's input, in batches of at most 100,000 rows.
    let chunk = orders(&work.join("gen-chain"), chain_rows.min(100_000))?;
    let mut silver = open_sink(&work, "silver")?;
    let mut written = 0;
    let mut n = 0;
    while written < chain_rows {
        let take = (chain_rows - written).min(chunk.num_rows());
        silver.write(&info(n), &chunk.schema(), &[chunk.slice(0, take)])?;
        written += take;
        n += 1;
    }
    let mut walls = Vec::new();
    let mut cpus = Vec::new();
    for run in 0..runs.max(1) {
        let pipeline = format!(
            "[query]\nname = \"gold\"\ncheckpoint = \"checkpoints/gold-{run}\"\n\
             trigger = \"available-now\"\n\n[[source]]\nname = \"silver\"\nkind = \"delta\"\n\
             path = \"tables/silver\"\n\n[sink]\nkind = \"delta\"\npath = \"tables/gold-{run}\"\n"
        );
        let pipeline = weir_host::spec::parse(&pipeline, &work, "gold.toml", &[])?;
        let cpu_before = cpu_time();
        let started = Instant::now();
        let mut query = Query::start(pipeline, QueryOptions::default())?;
        let summary = query.run()?;
        let wall = started.elapsed();
        let cpu = cpu_time().saturating_sub(cpu_before);
        if summary.output_rows != chain_rows as u64 {
            anyhow::bail!("gold got {} rows of {chain_rows}", summary.output_rows);
        }
        eprintln!(
            "silver → gold run {run}: {} rows in {} batches, {:.2} s wall, {:.2} CPU-s",
            summary.output_rows,
            summary.batches,
            wall.as_secs_f64(),
            cpu.as_secs_f64(),
        );
        walls.push(wall.as_secs_f64());
        cpus.push(cpu.as_secs_f64());
    }
    let wall = super::median(walls);
    let cpu = super::median(cpus);
    println!(
        "delta → delta (silver → gold), median of {runs}: {chain_rows} rows, {wall:.2} s wall, {cpu:.2} CPU-s: {:.0} rows/s, {:.0} rows per CPU-second",
        chain_rows as f64 / wall,
        chain_rows as f64 / cpu.max(1e-9),
    );
    std::fs::remove_dir_all(&work).with_context(|| format!("cleaning {}", work.display()))?;
    Ok(())
}

fn open_sink(work: &Path, name: &str) -> Result<DeltaSink> {
    Ok(DeltaSink::new(DeltaSinkOptions {
        spec: weir_host::spec::DeltaSinkSpec {
            path: work.join("tables").join(name),
            partition_by: Vec::new(),
            target_file_size: 128 << 20,
            commit_every: weir_host::spec::CommitEvery::Batches(std::num::NonZeroU64::MIN),
        },
        query_id: format!("bench-{name}"),
        mode: WriteMode::Append,
        pending_dir: work.join("pending").join(name),
        failpoint: None,
    })?)
}

fn info(batch_id: u64) -> BatchInfo {
    BatchInfo {
        query_id: "bench".into(),
        batch_id,
        attempt: 0,
        timestamp_micros: 0,
        partition: 0,
    }
}

/// `rows` generated orders, decoded into one batch.
fn orders(dir: &Path, rows: usize) -> Result<RecordBatch> {
    weir_host::examples::write_orders(
        dir,
        weir_host::examples::OrdersSpec {
            files: 1,
            lines_per_file: rows,
            seed: 11,
            malformed_every: 0,
        },
    )?;
    let schema = Arc::new(
        weir_host::spec::parse_schema(weir_host::examples::ORDERS_SCHEMA)
            .map_err(anyhow::Error::msg)?,
    );
    let mut decoder =
        weir_host::decode::Decoder::new(schema, weir_host::decode::DecoderOptions::default())?;
    let mut decoded = weir_host::decode::Decoded::default();
    decoder.decode(
        &std::fs::read(dir.join("orders-00000.json"))?,
        "orders",
        &mut decoded,
    )?;
    Ok(arrow_select::concat::concat_batches(
        decoder.output_schema(),
        &decoded.batches,
    )?)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// User + system CPU time of this process so far.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the struct we pass; RUSAGE_SELF is valid.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}
