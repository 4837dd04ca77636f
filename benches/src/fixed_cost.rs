//! `weir-bench fixed-cost`: what one micro-batch of a stateful query costs when it carries
//! (almost) no data: planning, the offsets log, the source log, the state store's load and
//! commit, the commits log and the progress record (issue 18, point 3).
//!
//! The query is the guide's windowed revenue (a 5-minute window per status, 10-minute
//! watermark, RocksDB state) over one-line files, one file per batch. It runs twice in a child
//! process (`weir-bench cli run`, measured with `wait4`): over 1 file and over `1 + batches`
//! files. The difference divided by `batches` is the cost of a batch, start-up excluded; a
//! one-row batch is as close to an empty one as a files source gets (an empty poll runs no
//! batch).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{flag, median, wait_measured};

const PIPELINE: &str = r#"
[query]
name = "fixed_cost"
checkpoint = "checkpoints/fc"
trigger = "available-now"
state_store = "rocksdb"

[[source]]
name = "orders"
kind = "files"
path = "data"
format = "json"
schema = "order_id BIGINT, customer_id BIGINT, status STRING, amount DECIMAL(12,2), occurred_at TIMESTAMP, session_id STRING"
max_files_per_trigger = 1

[watermark]
column = "occurred_at"
delay = "10 minutes"

[aggregate]
window = { column = "occurred_at", size = "5 minutes" }
group_by = ["status"]
select = ["sum(amount) AS revenue", "count(*) AS orders"]

[sink]
kind = "files"
path = "out"
format = "parquet"
"#;

/// A work folder with `files` one-line order files, one second of event time apart.
fn workspace(dir: &Path, files: usize) -> Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("data"))?;
    for i in 0..files {
        let line = format!(
            "{{\"order_id\":{i},\"customer_id\":{},\"status\":\"completed\",\"amount\":10.50,\"occurred_at\":\"2024-03-01T{:02}:{:02}:{:02}Z\",\"session_id\":\"s-{i}\"}}\n",
            i % 7,
            i / 3600,
            i / 60 % 60,
            i % 60
        );
        std::fs::write(dir.join("data").join(format!("o-{i:06}.json")), line)?;
    }
    std::fs::write(dir.join("pipeline.toml"), PIPELINE)?;
    Ok(())
}

/// One child run over the workspace: (user, system) CPU and wall time.
fn run(dir: &Path) -> Result<(Duration, Duration, Duration)> {
    let exe = std::env::current_exe()?;
    let started = Instant::now();
    let child = Command::new(exe)
        .args(["cli", "run", "pipeline.toml"])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let used = wait_measured(&child, started, &format!("weir run in {}", dir.display()))?;
    Ok((used.user, used.system, used.wall))
}

/// Batches committed in the checkpoint of `dir`.
fn commits(dir: &Path) -> Result<usize> {
    Ok(std::fs::read_dir(dir.join("checkpoints/fc/commits"))
        .context("no commits log")?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().parse::<u64>().is_ok())
        .count())
}

pub fn fixed_cost(args: &[String]) -> Result<()> {
    let batches: usize = flag(args, "--batches").map_or(Ok(300), |r| r.parse())?;
    let runs: usize = flag(args, "--runs").map_or(Ok(3), |r| r.parse())?;
    let work = flag(args, "--work").map_or_else(
        || std::env::temp_dir().join(format!("weir-fixed-cost-{}", std::process::id())),
        PathBuf::from,
    );
    let (mut user, mut system, mut wall) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..runs {
        // A folder per run, all removed at the end: ext4 without a journal skips every
        // inode freed in the last 30 s when it allocates one, so deleting the previous
        // run's files just before would charge this run for them.
        let (one, many) = (
            work.join(format!("r{r}/one")),
            work.join(format!("r{r}/many")),
        );
        workspace(&one, 1)?;
        workspace(&many, batches + 1)?;
        let (u1, s1, w1) = run(&one)?;
        let (u, s, w) = run(&many)?;
        let done = commits(&many)?;
        // The commits log keeps the last 100 entries; a shorter run must have all of them.
        if done < (batches + 1).min(100) {
            bail!("only {done} batches committed of {}", batches + 1);
        }
        let per =
            |a: Duration, b: Duration| a.saturating_sub(b).as_secs_f64() * 1000.0 / batches as f64;
        eprintln!(
            "run {r}: per batch {:.3} ms user, {:.3} ms system, {:.3} ms wall",
            per(u, u1),
            per(s, s1),
            per(w, w1)
        );
        user.push(per(u, u1));
        system.push(per(s, s1));
        wall.push(per(w, w1));
    }
    let (u, s, w) = (median(user), median(system), median(wall));
    println!(
        "| one-row batch of a stateful query (RocksDB, {batches} batches, medians of {runs}) | CPU ms (user + system) | user ms | system ms | wall ms |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| per batch, start-up excluded | {:.3} | {u:.3} | {s:.3} | {w:.3} |",
        u + s
    );
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}
