//! Stateful queries: bounded state under a watermark, and a checkpoint that
//! refuses a query it was not written for.

use std::path::{Path, PathBuf};

use anyhow::Result;
use weir_host::query::{Query, QueryOptions, RunSummary};
use weir_host::sink::MemorySink;
use weir_tests::{SCHEMA, Workspace};

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn revenue(tag: &str, watermark: bool, extra_query: &str, group_by: &str) -> String {
    let watermark = if watermark {
        "[watermark]\ncolumn = \"occurred_at\"\ndelay = \"10 minutes\"\n"
    } else {
        ""
    };
    let mode = if watermark.is_empty() {
        "update"
    } else {
        "append"
    };
    format!(
        r#"
[query]
name = "{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"
output_mode = "{mode}"
state_store = "memory"
{extra_query}

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "{SCHEMA}, shipped_at TIMESTAMP"
max_files_per_trigger = 1
on_malformed = "drop"

{watermark}
[aggregate]
window = {{ column = "occurred_at", size = "5 minutes" }}
group_by = {group_by}
select = ["sum(amount) AS revenue", "count(*) AS orders"]

[sink]
kind = "memory"
"#
    )
}

fn run(dir: &Path, text: &str) -> Result<RunSummary, String> {
    let spec = weir_host::spec::parse(text, dir, "test.toml", &[]).map_err(|e| e.to_string())?;
    let options = QueryOptions {
        cache_dir: Some(cache()),
        memory_sink: Some(MemorySink::new()),
        ..QueryOptions::default()
    };
    Query::start(spec, options)
        .and_then(|mut q| q.run())
        .map_err(|e| e.to_string())
}

fn state_rows(checkpoint: &Path) -> Result<Vec<u64>> {
    let text = std::fs::read_to_string(checkpoint.join("progress.jsonl"))?;
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l)?;
            Ok(v["stateOperators"][0]["numRowsTotal"]
                .as_u64()
                .unwrap_or(u64::MAX))
        })
        .collect()
}

#[test]
fn state_stays_bounded_with_a_watermark_and_grows_without() -> Result<()> {
    // 200 one-minute files: 200 batches of 20 orders each.
    let ws = Workspace::new(200, 20)?;
    run(ws.path(), &revenue("bounded", true, "", r#"["status"]"#)).map_err(anyhow::Error::msg)?;
    let bounded = state_rows(&ws.path().join("checkpoints/bounded"))?;
    assert_eq!(
        bounded.len(),
        201,
        "200 data batches and the trailing no-data batch"
    );
    // 12 distinct status spellings (4 statuses × 3 spellings) × the windows a
    // 10-minute watermark keeps open: two 5-minute windows of delay, the
    // current one and one awaiting emission.
    let ceiling = 12 * 4;
    assert!(
        bounded.iter().all(|&n| n <= ceiling),
        "state rows per batch: {bounded:?}"
    );

    run(ws.path(), &revenue("unbounded", false, "", r#"["status"]"#))
        .map_err(anyhow::Error::msg)?;
    let unbounded = state_rows(&ws.path().join("checkpoints/unbounded"))?;
    assert_eq!(unbounded.len(), 200, "no watermark, no no-data batch");
    assert!(
        unbounded.windows(2).all(|w| w[0] <= w[1]),
        "never shrinks: {unbounded:?}"
    );
    assert!(
        *unbounded.last().unwrap_or(&0) >= 4 * 40 - 4,
        "one row per (window, status): {unbounded:?}"
    );
    assert!(
        *unbounded.last().unwrap_or(&0) > 5 * ceiling,
        "grows past any ceiling: {unbounded:?}"
    );
    Ok(())
}

#[test]
fn a_restart_with_an_incompatible_change_is_refused_naming_it() -> Result<()> {
    let ws = Workspace::new(3, 50)?;
    let base = revenue("q", true, "", r#"["status"]"#);
    run(ws.path(), &base).map_err(anyhow::Error::msg)?;
    let refused = [
        (
            revenue("q", true, "", r#"["status", "customer_id"]"#),
            "customer_id",
        ),
        (
            base.replace(
                "column = \"occurred_at\"\ndelay",
                "column = \"shipped_at\"\ndelay",
            )
            .replace(
                "window = { column = \"occurred_at\"",
                "window = { column = \"shipped_at\"",
            ),
            "the watermark column",
        ),
        (
            base.replace("state_store = \"memory\"", "state_store = \"rocksdb\""),
            "the state store",
        ),
        (
            base.replace("name = \"orders\"", "name = \"purchases\""),
            "the sources",
        ),
        (
            revenue("q", true, "state_partitions = 4", r#"["status"]"#),
            "the number of state partitions",
        ),
    ];
    for (text, what) in refused {
        let err = run(ws.path(), &text).expect_err(what);
        assert!(err.contains("cannot be resumed"), "{what}: {err}");
        assert!(err.contains(what), "{what}: {err}");
        assert!(err.contains("Start a new checkpoint"), "{err}");
    }
    // Safe changes are accepted, each on its own and then kept: a trigger, a
    // rate limit, a filter in front of the aggregation, the watermark delay,
    // another sink.
    let filter = "[[transform]]\nname = \"keep_completed\"\nplugin = \"plugins/filter_rows.wasm\"\nconfig = { column = \"status\", op = \"eq\", value = \"completed\" }\n\n[aggregate]";
    let safe = [
        base.replace("trigger = \"available-now\"", "trigger = \"once\""),
        base.replace("max_files_per_trigger = 1", "max_files_per_trigger = 5"),
        base.replace("[aggregate]", filter),
        base.replace("delay = \"10 minutes\"", "delay = \"15 minutes\""),
        base.replace("[sink]\nkind = \"memory\"", "[sink]\nkind = \"console\""),
    ];
    for (i, text) in safe.iter().enumerate() {
        assert_ne!(text, &base, "change {i} must change the pipeline");
        run(ws.path(), text).map_err(|e| anyhow::anyhow!("safe change {i} refused: {e}"))?;
    }
    Ok(())
}

/// A clock the test moves by hand.
#[derive(Debug)]
struct ManualClock(std::sync::atomic::AtomicI64);

impl weir_host::query::Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

fn offsets_watermark(checkpoint: &Path, batch: u64) -> Result<i64> {
    let text = std::fs::read_to_string(checkpoint.join("offsets").join(batch.to_string()))?;
    let json = text.lines().nth(1).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(json)?;
    Ok(v["batchWatermarkMs"].as_i64().unwrap_or(i64::MIN))
}

#[test]
fn an_idle_input_advances_the_watermark_after_its_timeout() -> Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    let ws = Workspace::new(3, 40)?;
    let text = revenue("idle", true, "", r#"["status"]"#)
        .replace("trigger = \"available-now\"\n", "")
        .replace(
            "delay = \"10 minutes\"",
            "delay = \"10 minutes\"\nidle_timeout = \"1 minute\"",
        );
    let spec = weir_host::spec::parse(&text, ws.path(), "test.toml", &[])
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // The clock stands far after every event time of the data.
    let t0: i64 = 1_900_000_000_000;
    let clock = Arc::new(ManualClock(AtomicI64::new(t0)));
    let stop = Arc::new(AtomicBool::new(false));
    let checkpoint = ws.path().join("checkpoints/idle");
    let (thread_clock, thread_stop) = (clock.clone(), stop.clone());
    let runner = std::thread::spawn(move || {
        let options = QueryOptions {
            cache_dir: Some(cache()),
            memory_sink: Some(MemorySink::new()),
            clock: thread_clock,
            stop: thread_stop,
            ..QueryOptions::default()
        };
        Query::start(spec, options).and_then(|mut q| q.run())
    });
    let wait_for = |what: &str, done: &dyn Fn() -> bool| -> Result<()> {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !done() {
            anyhow::ensure!(
                std::time::Instant::now() < until,
                "timed out waiting for {what}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(())
    };
    let committed =
        |checkpoint: &Path| weir_tests::log_ids(&checkpoint.join("commits")).unwrap_or_default();
    // The three files, then the no-data batch their watermark asks for.
    wait_for("the data batches", &|| committed(&checkpoint).len() >= 4)?;
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = committed(&checkpoint);
    assert_eq!(
        before.len(),
        4,
        "nothing more runs while the clock stands still: {before:?}"
    );
    let held = state_rows(&checkpoint)?;
    assert!(
        held.last().is_some_and(|&n| n > 0),
        "windows wait for the watermark: {held:?}"
    );

    // Not yet idle for a minute: nothing happens.
    clock.0.store(t0 + 59_000, Ordering::SeqCst);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(committed(&checkpoint), before);

    // Idle for a minute: the watermark jumps to clock − delay, one batch runs
    // and emits and evicts every window.
    clock.0.store(t0 + 60_000, Ordering::SeqCst);
    wait_for("the idle batch", &|| {
        committed(&checkpoint).len() > before.len()
    })?;
    stop.store(true, Ordering::SeqCst);
    let summary = runner
        .join()
        .map_err(|_| anyhow::anyhow!("query thread panicked"))??;
    let last = *committed(&checkpoint).last().unwrap_or(&0);
    assert_eq!(offsets_watermark(&checkpoint, last)?, t0 + 60_000 - 600_000);
    assert_eq!(
        state_rows(&checkpoint)?.last(),
        Some(&0),
        "every window emitted"
    );
    assert!(summary.output_rows > 0);
    Ok(())
}

/// Two inputs, unioned, each with its own watermark; the query's is their
/// minimum or maximum by `query.watermark_policy`, and each input's survives
/// a restart through the checkpoint.
#[test]
fn several_inputs_combine_their_watermarks_by_policy() -> Result<()> {
    fn line(id: u64, at: &str) -> String {
        format!(
            "{{\"order_id\":{id},\"customer_id\":1,\"status\":\"completed\",\"amount\":1.00,\"occurred_at\":\"{at}\",\"session_id\":\"s\"}}\n"
        )
    }
    /// Milliseconds of 2024-03-01 at `h:m` UTC.
    fn ms(h: i64, m: i64) -> i64 {
        (1_709_251_200 + h * 3600 + m * 60) * 1000
    }
    for (policy, expected_first) in [("min", ms(8, 50)), ("max", ms(10, 20))] {
        let dir = tempfile::tempdir()?;
        let (east, west) = (dir.path().join("data/east"), dir.path().join("data/west"));
        std::fs::create_dir_all(&east)?;
        std::fs::create_dir_all(&west)?;
        std::fs::write(
            east.join("e-0.json"),
            line(1, "2024-03-01T10:00:00Z") + &line(2, "2024-03-01T10:30:00Z"),
        )?;
        // West lags an hour behind.
        std::fs::write(west.join("w-0.json"), line(3, "2024-03-01T09:00:00Z"))?;
        let text = format!(
            r#"
[query]
name = "two_inputs"
checkpoint = "checkpoints/two"
trigger = "available-now"
output_mode = "append"
state_store = "memory"
watermark_policy = "{policy}"

[[source]]
name = "east"
kind = "files"
path = "data/east"
format = "json"
schema = "{SCHEMA}"

[[source]]
name = "west"
kind = "files"
path = "data/west"
format = "json"
schema = "{SCHEMA}"

[watermark]
column = "occurred_at"
delay = "10 minutes"

[aggregate]
window = {{ column = "occurred_at", size = "5 minutes" }}
group_by = ["status"]
select = ["count(*) AS orders"]

[sink]
kind = "memory"
"#
        );
        let summary = run(dir.path(), &text).map_err(anyhow::Error::msg)?;
        assert_eq!(summary.input_rows, 3, "{policy}: both inputs are read");
        let checkpoint = dir.path().join("checkpoints/two");
        // Batch 0 read both files; batch 1 (no data) runs on the combined watermark.
        assert_eq!(offsets_watermark(&checkpoint, 0)?, 0);
        assert_eq!(
            offsets_watermark(&checkpoint, 1)?,
            expected_first,
            "{policy}"
        );
        let entry = offsets_entry(&checkpoint, 1)?;
        let per_input: Vec<i64> = entry["sources"]
            .as_array()
            .map(|a| a.iter().filter_map(|s| s["watermarkMs"].as_i64()).collect())
            .unwrap_or_default();
        assert_eq!(
            per_input,
            [ms(10, 20), ms(8, 50)],
            "{policy}: each input's own watermark is recorded"
        );
        let progress = std::fs::read_to_string(checkpoint.join("progress.jsonl"))?;
        let first: serde_json::Value =
            serde_json::from_str(progress.lines().next().unwrap_or_default())?;
        let rows: Vec<u64> = first["sources"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s["numInputRows"].as_u64())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(rows, [2, 1], "{policy}: progress reports each input");

        // West catches up after a restart: its watermark came from the
        // checkpoint, east's too, and the combination moves on.
        std::fs::write(west.join("w-1.json"), line(4, "2024-03-01T11:00:00Z"))?;
        run(dir.path(), &text).map_err(anyhow::Error::msg)?;
        let last = *weir_tests::log_ids(&checkpoint.join("offsets"))?
            .last()
            .unwrap_or(&0);
        let expected_after = if policy == "min" {
            ms(10, 20)
        } else {
            ms(10, 50)
        };
        assert_eq!(
            offsets_watermark(&checkpoint, last)?,
            expected_after,
            "{policy}"
        );
    }
    Ok(())
}

fn offsets_entry(checkpoint: &Path, batch: u64) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(checkpoint.join("offsets").join(batch.to_string()))?;
    Ok(serde_json::from_str(
        text.lines().nth(1).unwrap_or_default(),
    )?)
}
