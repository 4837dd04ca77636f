//! `weir-bench threads`: a batch's files decoded on one thread and on several (issue 18,
//! point 2). One batch over every file of `--input` (files → JSON → Parquet, no transform,
//! the default trigger), run with `query.threads = 1` and `= --threads` (default: the cores)
//! in turn; the medians of wall and CPU time of each, and their ratios.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::{Sample, Summary, flag, measure, summarise};

pub(crate) fn threads(args: &[String]) -> Result<()> {
    let input =
        PathBuf::from(flag(args, "--input").context("--input DIR (orders from gen_orders.py)")?);
    let runs: usize = flag(args, "--runs").map_or(Ok(3), |r| r.parse())?;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let threads: usize = flag(args, "--threads").map_or(Ok(cores), |t| t.parse())?;
    if threads < 2 {
        bail!("--threads must be at least 2 to compare with one thread");
    }
    let work = match flag(args, "--work") {
        Some(w) => PathBuf::from(w),
        None => std::env::temp_dir().join(format!("weir-bench-threads-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work)?;
    // Each run in folders of its own, deleted only once all are measured (see `pipeline`).
    let runs_dir = work.join("runs");
    if runs_dir.exists() {
        std::fs::remove_dir_all(&runs_dir)?;
    }
    let exe = std::env::current_exe()?;
    let cache = work.join("plugin-cache");
    let file = |t: usize, run: &str| -> Result<PathBuf> {
        let path = work.join(format!("threads-{t}-{run}.toml"));
        std::fs::write(&path, pipeline_file(&input, t, run))?;
        Ok(path)
    };
    // Warm-up: fills the page cache.
    let _ = measure(&exe, &cache, "none", &file(1, "warm-up")?)?;
    let counts = [1, threads];
    let mut samples: Vec<(usize, Sample)> = Vec::new();
    for run in 0..runs {
        for t in counts {
            let s = measure(&exe, &cache, "none", &file(t, &run.to_string())?)?;
            eprintln!("{t} thread(s): {s}");
            samples.push((t, s));
        }
    }
    std::fs::remove_dir_all(&runs_dir)?;

    println!(
        "| threads | runs | rows | wall s (median) | CPU s (median) | rows per CPU-second | peak RSS MB (max) |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut medians = Vec::new();
    for t in counts {
        let Summary {
            runs,
            rows,
            wall,
            cpu,
            rss_mb,
        } = summarise(&samples, &t);
        if samples.iter().any(|(_, s)| s.rows != rows) {
            bail!("the runs read different row counts");
        }
        println!(
            "| {t} | {runs} | {rows} | {wall:.3} | {cpu:.3} | {:.0} | {rss_mb} |",
            rows as f64 / cpu
        );
        medians.push((wall, cpu));
    }
    println!();
    println!(
        "{threads} threads / 1 thread (medians): wall {:.3}, CPU {:.3}",
        medians[1].0 / medians[0].0,
        medians[1].1 / medians[0].1
    );
    Ok(())
}

fn pipeline_file(input: &Path, threads: usize, run: &str) -> String {
    format!(
        r#"[query]
name = "bench_threads"
checkpoint = "runs/{run}/t{threads}/checkpoint"
trigger = "available-now"
threads = {threads}

[[source]]
name = "orders"
kind = "files"
path = "{}"
format = "json"
schema = "{}"

[sink]
kind = "files"
path = "runs/{run}/t{threads}/out"
format = "parquet"
"#,
        input.display(),
        weir_host::examples::ORDERS_SCHEMA
    )
}
