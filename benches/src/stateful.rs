//! `weir-bench stateful`: the revenue and dedup queries of the reference
//! workload, Weir and Spark side by side in one run.
//!
//! Weir runs in a child process measured with `wait4` (its own CPU seconds
//! and peak RSS: it is one process). Spark runs under the reference
//! harness's `measure.py`, which samples the python + JVM process tree
//! (pyspark never waits for its JVM, so rusage would miss it). Both read the
//! same files one per micro-batch; the results are compared row for row.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{flag, median};

/// One measured run of either engine.
#[derive(Debug, Clone)]
struct Run {
    wall_s: f64,
    cpu_s: f64,
    peak_rss_mb: f64,
    rows: u64,
    state_bytes: u64,
    state_rows: u64,
    result: Vec<String>,
}

pub fn stateful(args: &[String]) -> Result<()> {
    let input = PathBuf::from(flag(args, "--input").context("--input DIR (orders-*.json)")?);
    let query = flag(args, "--query").unwrap_or_else(|| "revenue".into());
    let runs: usize = flag(args, "--runs").map_or(Ok(2), |r| r.parse())?;
    let store = flag(args, "--store").unwrap_or_else(|| "rocksdb".into());
    let work = flag(args, "--work").map_or_else(
        || std::env::temp_dir().join(format!("weir-bench-stateful-{}", std::process::id())),
        PathBuf::from,
    );
    let spark_python = flag(args, "--spark-python");
    let spark_bench = flag(args, "--spark-bench").map(PathBuf::from);
    if !matches!(query.as_str(), "revenue" | "dedup") {
        bail!("--query revenue|dedup");
    }
    std::fs::create_dir_all(&work)?;
    let exe = std::env::current_exe()?;
    let cache = work.join("cache");

    let mut weir = Vec::new();
    let mut spark = Vec::new();
    for run in 1..=runs {
        let w = weir_run(&exe, &work, &cache, &input, &query, &store)?;
        eprintln!(
            "weir  run {run}: {:.2} s wall, {:.2} CPU-s, {:.0} MB peak RSS, {} rows, state {} rows / {} KB",
            w.wall_s,
            w.cpu_s,
            w.peak_rss_mb,
            w.rows,
            w.state_rows,
            w.state_bytes / 1024
        );
        weir.push(w);
        if let (Some(py), Some(dir)) = (&spark_python, &spark_bench) {
            let s = spark_run(py, dir, &work, &input, &query, run)?;
            eprintln!(
                "spark run {run}: {:.2} s wall, {:.2} CPU-s, {:.0} MB peak RSS, {} rows",
                s.wall_s, s.cpu_s, s.peak_rss_mb, s.rows
            );
            spark.push(s);
        }
    }

    let same = spark.first().map(|s| s.result == weir[0].result);
    println!(
        "### {query} ({} input rows, Weir state store {store})\n",
        weir[0].rows
    );
    println!(
        "| engine | runs | wall s (median) | CPU s (median) | rows per CPU-s | peak RSS MB (max) | state on disk KB | state rows at end | result rows |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let line = |name: &str, v: &[Run]| {
        let wall = median(v.iter().map(|r| r.wall_s).collect());
        let cpu = median(v.iter().map(|r| r.cpu_s).collect());
        let rss = v.iter().map(|r| r.peak_rss_mb).fold(0.0, f64::max);
        println!(
            "| {name} | {} | {wall:.2} | {cpu:.2} | {:.0} | {rss:.0} | {} | {} | {} |",
            v.len(),
            v[0].rows as f64 / cpu,
            v[0].state_bytes / 1024,
            v[0].state_rows,
            v[0].result.len()
        );
        (cpu, rss)
    };
    let (weir_cpu, weir_rss) = line("Weir", &weir);
    if !spark.is_empty() {
        let (spark_cpu, spark_rss) = line("Spark local[2]", &spark);
        println!();
        println!(
            "Weir / Spark: {:.1}× rows per CPU-second, {:.1}× less peak RSS; results identical: {}",
            spark_cpu / weir_cpu,
            spark_rss / weir_rss,
            same.unwrap_or(false)
        );
        if same == Some(false) {
            let weir_set: std::collections::BTreeSet<_> = weir[0].result.iter().collect();
            let spark_set: std::collections::BTreeSet<_> = spark[0].result.iter().collect();
            for row in spark_set.difference(&weir_set).take(10) {
                println!("  only Spark: {row}");
            }
            for row in weir_set.difference(&spark_set).take(10) {
                println!("  only Weir:  {row}");
            }
        }
    }
    Ok(())
}

fn pipeline_file(input: &Path, query: &str, store: &str) -> String {
    let stateful = match query {
        "revenue" => {
            r#"[aggregate]
window = { column = "occurred_at", size = "5m" }
group_by = ["status"]
select = ["count(*) AS orders", "sum(amount) AS revenue"]
"#
        }
        _ => {
            r#"[deduplicate]
keys = ["order_id"]
"#
        }
    };
    format!(
        r#"[query]
name = "bench_{query}"
checkpoint = "checkpoint"
trigger = "available-now"
output_mode = "append"
state_store = "{store}"
state_partitions = 2

[[source]]
name = "orders"
kind = "files"
path = "{}"
format = "json"
schema = "{}"
max_files_per_trigger = 1

[watermark]
column = "occurred_at"
delay = "10m"

{stateful}
[sink]
kind = "files"
path = "out"
format = "csv"
"#,
        input.display(),
        weir_host::examples::ORDERS_SCHEMA
    )
}

fn weir_run(
    exe: &Path,
    work: &Path,
    cache: &Path,
    input: &Path,
    query: &str,
    store: &str,
) -> Result<Run> {
    let dir = work.join(format!("weir-{query}"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("pipeline.toml");
    std::fs::write(&file, pipeline_file(input, query, store))?;
    let started = Instant::now();
    let child = Command::new(exe)
        .args(["cli", "run"])
        .arg(&file)
        .arg("--cache-dir")
        .arg(cache)
        .env("WEIR_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?;
    let pid = i32::try_from(child.id())?;
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own child, not yet reaped; the pointers are valid.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = started.elapsed();
    if reaped != pid || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("weir {query} run failed (status {status})");
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    let progress = std::fs::read_to_string(dir.join("checkpoint").join("progress.jsonl"))?;
    let mut rows = 0;
    let mut state_rows = 0;
    for line in progress.lines() {
        let p: serde_json::Value = serde_json::from_str(line)?;
        rows += p["numInputRows"].as_u64().unwrap_or(0);
        state_rows = p["stateOperators"][0]["numRowsTotal"]
            .as_u64()
            .unwrap_or(state_rows);
    }
    Ok(Run {
        wall_s: wall.as_secs_f64(),
        cpu_s: (tv(usage.ru_utime) + tv(usage.ru_stime)).as_secs_f64(),
        peak_rss_mb: usage.ru_maxrss as f64 / 1024.0,
        rows,
        state_bytes: du(&dir.join("checkpoint").join("state"))?,
        state_rows,
        result: weir_result(&dir.join("out"), query)?,
    })
}

/// Bytes of the files under `dir`.
fn du(dir: &Path) -> Result<u64> {
    let mut total = 0;
    if !dir.exists() {
        return Ok(0);
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            du(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// The comparable result: for revenue the sorted rows
/// `window_start,window_end,status,orders,revenue`; for dedup the number of
/// rows per 5-minute window and status (as the reference harness counts).
fn weir_result(out: &Path, query: &str) -> Result<Vec<String>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(out)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    let mut rows = Vec::new();
    let mut header: Option<Vec<String>> = None;
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        let mut lines = text.lines();
        if let Some(h) = lines.next() {
            header.get_or_insert_with(|| h.split(',').map(str::to_owned).collect());
        }
        rows.extend(lines.map(str::to_owned));
    }
    let Some(header) = header else {
        return Ok(Vec::new());
    };
    let col = |name: &str| header.iter().position(|h| h == name);
    if query == "revenue" {
        let idx = ["window_start", "window_end", "status", "orders", "revenue"]
            .map(|c| col(c).with_context(|| format!("no column {c} in Weir's output")));
        let idx: Vec<usize> = idx.into_iter().collect::<Result<_>>()?;
        let mut out: Vec<String> = rows
            .iter()
            .map(|r| {
                let f: Vec<&str> = r.split(',').collect();
                idx.iter()
                    .map(|&i| normalise_ts(f.get(i).copied().unwrap_or("")))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect();
        out.sort();
        Ok(out)
    } else {
        Ok(vec![format!("rows={}", rows.len())])
    }
}

/// `2024-03-01T00:05:00.000000Z` (or with a space) → `2024-03-01T00:05:00Z`.
fn normalise_ts(v: &str) -> String {
    let v = v.trim_matches('"');
    if v.len() >= 19
        && v.as_bytes()
            .get(10)
            .is_some_and(|b| *b == b'T' || *b == b' ')
    {
        let base = &v[..19];
        if v[19..]
            .trim_start_matches('.')
            .trim_start_matches('0')
            .trim_end_matches('Z')
            .is_empty()
            || v[19..]
                .chars()
                .all(|c| c == '.' || c == '0' || c == 'Z' || c == '+' || c == ':')
        {
            return format!("{}Z", base.replacen(' ', "T", 1));
        }
    }
    v.to_owned()
}

fn spark_run(
    python: &str,
    bench: &Path,
    work: &Path,
    input: &Path,
    query: &str,
    run: usize,
) -> Result<Run> {
    let results = work.join("spark-results");
    std::fs::create_dir_all(&results)?;
    let tag = format!("{query}.r{run}");
    let measure = results.join(format!("{tag}.measure.json"));
    let spark_work = work.join(format!("spark-{query}"));
    let status = Command::new(python)
        .arg(bench.join("measure.py"))
        .arg(&measure)
        .arg("--")
        .arg(python)
        .arg(bench.join("spark_revenue.py"))
        .args(["--query", query, "--state-store", "rocksdb", "--tag", &tag])
        .arg("--input")
        .arg(input)
        .arg("--work")
        .arg(&spark_work)
        .arg("--results")
        .arg(&results)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if !status.success() {
        bail!(
            "spark {query} run failed ({status}); see {}",
            results.display()
        );
    }
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&measure)?)?;
    let t: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        results.join(format!("{tag}.timing.json")),
    )?)?;
    let result = if query == "revenue" {
        let text = std::fs::read_to_string(results.join(format!("{tag}.csv")))?;
        let mut rows: Vec<String> = text.lines().skip(1).map(str::to_owned).collect();
        rows.sort();
        rows
    } else {
        vec![format!("rows={}", t["result_rows"].as_u64().unwrap_or(0))]
    };
    let state_bytes = du(&spark_work.join("checkpoint").join("state"))?;
    if spark_work.exists() {
        std::fs::remove_dir_all(&spark_work)?;
    }
    Ok(Run {
        wall_s: m["wall_s"].as_f64().unwrap_or(0.0),
        cpu_s: m["sampled_cpu_s_total"].as_f64().unwrap_or(0.0),
        peak_rss_mb: m["sampled_peak_tree_rss_kb"].as_f64().unwrap_or(0.0) / 1024.0,
        rows: t["input_rows"].as_u64().unwrap_or(0),
        state_bytes,
        state_rows: t["state_rows_max"].as_u64().unwrap_or(0),
        result,
    })
}
