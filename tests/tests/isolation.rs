//! One process, two queries: a query whose plugin spins until its deadline,
//! again and again, must not hold back a healthy query running beside it.
//! Each query has its own engine, stores and epoch ticker, so the only thing
//! they share is the machine.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use weir_host::query::{Query, QueryError, QueryOptions};
use weir_host::sink::MemorySink;
use weir_tests::{SCHEMA, Workspace, commit_ids, offset_ids};

const FILES: usize = 12;
const LINES: usize = 500;
/// The spinning plugin's deadline per call.
const HOSTILE_TIMEOUT_MS: u64 = 500;

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn pipeline(tag: &str, mode: &str) -> String {
    format!(
        r#"
[query]
name = "{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"
max_batch_retries = 0

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "{SCHEMA}"
max_files_per_trigger = 1
on_malformed = "drop"

[[transform]]
name = "{tag}_plugin"
plugin = "plugins/hostile.wasm"
config = {{ mode = "{mode}" }}
limits = {{ timeout = "{HOSTILE_TIMEOUT_MS}ms" }}

[sink]
kind = "memory"
"#
    )
}

fn start(dir: &Path, tag: &str, mode: &str, sink: &MemorySink) -> Result<Query, QueryError> {
    let spec =
        weir_host::spec::parse(&pipeline(tag, mode), dir, "test.toml", &[]).map_err(|e| {
            QueryError::Invalid {
                query: tag.into(),
                message: e.to_string(),
            }
        })?;
    Query::start(
        spec,
        QueryOptions {
            cache_dir: Some(cache()),
            memory_sink: Some(sink.clone()),
            ..QueryOptions::default()
        },
    )
}

/// Runs the healthy query to the end; returns how long its batches took.
fn run_good(ws: &Workspace, tag: &str) -> Result<Duration> {
    let sink = MemorySink::new();
    let mut query = start(ws.path(), tag, "ok", &sink)?;
    let started = Instant::now();
    let summary = query.run()?;
    let took = started.elapsed();
    assert_eq!(summary.batches, FILES as u64, "{tag}");
    assert_eq!(
        summary.output_rows,
        ws.orders.lines - ws.orders.malformed,
        "{tag}: no row lost"
    );
    assert_eq!(
        commit_ids(&ws.path().join("checkpoints").join(tag))?,
        (0..FILES as u64).collect::<Vec<_>>(),
        "{tag}: every batch committed"
    );
    Ok(took)
}

#[test]
fn a_query_stuck_on_deadlines_does_not_slow_a_healthy_one() -> Result<()> {
    let ws = Workspace::new(FILES, LINES)?;
    // Warm the compiled-plugin cache and measure the healthy query alone.
    run_good(&ws, "warmup")?;
    let solo = run_good(&ws, "solo")?;

    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let hostile = {
        let (stop, failures) = (Arc::clone(&stop), Arc::clone(&failures));
        let dir = ws.path().to_owned();
        std::thread::spawn(move || -> Result<Vec<String>> {
            let mut errors = Vec::new();
            // Like a supervisor restarting a failed query: the same batch again.
            while !stop.load(Ordering::SeqCst) {
                let sink = MemorySink::new();
                let mut query = start(&dir, "hostile", "loop", &sink)?;
                match query.run() {
                    Ok(summary) => bail!("the spinning query finished: {summary:?}"),
                    Err(e) => errors.push(e.to_string()),
                }
                failures.fetch_add(1, Ordering::SeqCst);
            }
            Ok(errors)
        })
    };
    // Polls `done` until it holds, or the spinner's thread ended (its error is reported below).
    let wait_for = |what: &str, done: &dyn Fn() -> bool| -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !done() && !hostile.is_finished() {
            if Instant::now() > deadline {
                bail!("timed out waiting for {what}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    };
    // Measure once the spinning query has planned its batch: it is in its plugin.
    let planned = ws.path().join("checkpoints/hostile/offsets/0");
    let beside = wait_for("the spinning query's batch", &|| planned.exists())
        .and_then(|()| run_good(&ws, "beside"));
    // Keep the spinner going until it has failed at least twice.
    let waited = if beside.is_ok() {
        wait_for("two failures of the spinning query", &|| {
            failures.load(Ordering::SeqCst) >= 2
        })
    } else {
        Ok(())
    };
    stop.store(true, Ordering::SeqCst);
    let errors = match hostile.join() {
        Ok(result) => result?,
        Err(_) => bail!("the hostile query's thread panicked"),
    };
    waited?;
    let beside = beside?;

    assert!(errors.len() >= 2, "{errors:?}");
    for e in &errors {
        assert_eq!(
            e,
            &format!(
                "plugin hostile_plugin exceeded its time limit of {HOSTILE_TIMEOUT_MS} ms in batch 0"
            )
        );
    }
    let checkpoint = ws.path().join("checkpoints/hostile");
    assert_eq!(commit_ids(&checkpoint)?, Vec::<u64>::new());
    assert_eq!(
        offset_ids(&checkpoint)?,
        vec![0],
        "planned once, never committed"
    );

    // Sharing the process (and one of two cores) with a spinner may cost some
    // speed; being held up by its deadlines would cost a deadline per batch:
    // FILES × 500 ms = 6 s on top of the solo time.
    let bound = solo * 4 + Duration::from_secs(2);
    assert!(
        beside <= bound,
        "beside a spinning query the healthy one took {beside:?}, alone {solo:?} (bound {bound:?}); the spinner failed {} times",
        errors.len()
    );
    Ok(())
}
