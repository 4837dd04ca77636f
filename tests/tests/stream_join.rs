//! Stream-stream joins through `weir run`: clicks attributed to orders (the guide's join, with a
//! 10-minute bound and 5-minute watermarks), buffered in RocksDB. A run killed with SIGKILL at
//! every phase of several batches and restarted writes, batch by batch, exactly what an
//! uninterrupted run writes; outer rows appear when the watermark lets their click go; late rows
//! are dropped and counted; `weir validate` refuses what Spark refuses, naming the key. Spark's
//! answers, batch by batch, are `golden.rs`'s `attribution_*` cases.

use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use weir_tests::{
    Workspace, commit_ids, jsonl_plugin_sink, lines, progress, run_killed_at, run_ok, weir,
};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");
const FILES: i64 = 6;

fn cache() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn at(minute: i64, second: i64) -> String {
    format!(
        "2024-03-01T{:02}:{:02}:{second:02}.000Z",
        minute / 60,
        minute % 60
    )
}

/// Six files of clicks and six of orders, file `i` of each arriving in minutes 10i..10i+10:
/// per file ten sessions, each clicked at minute 10i+k; an order 3 minutes after the click for
/// even k, none for odd k (their clicks are emitted with nulls by an outer join once the
/// watermark passes them); for k = 8 the order arrives one file later; a click without a
/// session; a click and an order far behind the watermark (dropped as late) from file 3 on.
fn write_inputs(dir: &Path) -> Result<()> {
    for (folder, _) in [("clicks", ()), ("orders", ())] {
        std::fs::create_dir_all(dir.join(folder))?;
    }
    let mut carried: Vec<String> = Vec::new();
    for i in 0..FILES {
        let mut clicks = Vec::new();
        let mut orders = std::mem::take(&mut carried);
        for k in 0..10 {
            let minute = 10 * i + k;
            let session = format!("s-{i}-{k}");
            clicks.push(format!(
                r#"{{"click_id":{},"session_id":"{session}","clicked_at":"{}","url":"/books/{k}"}}"#,
                100 * i + k,
                at(minute, 0)
            ));
            if k % 2 == 0 {
                let order = format!(
                    r#"{{"order_id":{},"session_id":"{session}","amount":{}.50,"occurred_at":"{}"}}"#,
                    1000 + 100 * i + k,
                    k + 1,
                    at(minute + 3, 0)
                );
                if k == 8 {
                    carried.push(order);
                } else {
                    orders.push(order);
                }
            }
        }
        clicks.push(format!(
            r#"{{"click_id":{},"session_id":null,"clicked_at":"{}","url":"/"}}"#,
            100 * i + 50,
            at(10 * i + 5, 30)
        ));
        if i >= 3 {
            clicks.push(format!(
                r#"{{"click_id":{},"session_id":"s-0-1","clicked_at":"{}","url":"/late"}}"#,
                100 * i + 60,
                at(1, 0)
            ));
            orders.push(format!(
                r#"{{"order_id":{},"session_id":"s-0-1","amount":1.00,"occurred_at":"{}"}}"#,
                1000 + 100 * i + 60,
                at(2, 0)
            ));
        }
        let mtime = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + i as u64);
        for (folder, rows) in [("clicks", clicks), ("orders", orders)] {
            let file = dir.join(folder).join(format!("{folder}-{i:05}.json"));
            std::fs::write(&file, rows.join("\n") + "\n")?;
            std::fs::File::options()
                .write(true)
                .open(&file)?
                .set_modified(mtime)?;
        }
    }
    Ok(())
}

fn pipeline(dir: &Path, tag: &str, kind: &str, extra: &str) -> Result<std::path::PathBuf> {
    let text = format!(
        r#"[query]
name = "{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"
state_store = "rocksdb"
state_partitions = 2

[[source]]
name = "clicks"
kind = "files"
path = "clicks"
format = "json"
schema = "click_id BIGINT, session_id STRING, clicked_at TIMESTAMP, url STRING"
max_files_per_trigger = 1
watermark = {{ column = "clicked_at", delay = "5 minutes" }}

[[source]]
name = "orders"
kind = "files"
path = "orders"
format = "json"
schema = "order_id BIGINT, session_id STRING, amount DECIMAL(10,2), occurred_at TIMESTAMP"
max_files_per_trigger = 1
watermark = {{ column = "occurred_at", delay = "5 minutes" }}

[[transform]]
name = "paths"
input = "clicks"
sql = "SELECT click_id, session_id, clicked_at, lower(url) AS url FROM input"

[join]
left = "clicks"
right = "orders"
type = "{kind}"
on = ["session_id"]
condition = "orders.occurred_at BETWEEN clicks.clicked_at AND clicks.clicked_at + INTERVAL 10 MINUTES"
{extra}
[sink]
kind = "files"
path = "out/{tag}"
format = "json"
"#
    );
    let file = dir.join(format!("{tag}.toml"));
    std::fs::write(&file, text)?;
    Ok(file)
}

/// Every batch's output lines (sorted), by batch id.
fn batches(dir: &Path, tag: &str) -> Result<Vec<(u64, Vec<String>)>> {
    let out = dir.join("out").join(tag);
    let mut all = Vec::new();
    for entry in std::fs::read_dir(&out).with_context(|| out.display().to_string())? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if let Some(id) = name
            .strip_prefix("batch-")
            .and_then(|n| n.strip_suffix(".json"))
        {
            let mut rows = lines(&path)?;
            rows.sort();
            all.push((id.parse()?, rows));
        }
    }
    all.sort();
    Ok(all)
}

#[test]
fn a_left_outer_attribution_emits_unmatched_clicks_when_the_watermark_passes_them() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_inputs(dir.path())?;
    let file = pipeline(dir.path(), "left", "left", "")?;
    run_ok(EXE, &cache(), &file, &[])?;
    let got = batches(dir.path(), "left")?;
    let rows: Vec<Value> = got
        .iter()
        .flat_map(|(_, rows)| rows.iter())
        .map(|l| serde_json::from_str(l).context("json row"))
        .collect::<Result<_>>()?;
    let matched = rows.iter().filter(|r| !r["order_id"].is_null()).count();
    let unmatched = rows.iter().filter(|r| r["order_id"].is_null()).count();
    // Five orders per file, each found once, but the last file's order for k = 8, which never
    // arrives; the late order of s-0-1 (files 3 on) is dropped.
    assert_eq!(matched, 5 * FILES as usize - 1, "{rows:#?}");
    // The clicks without an order (odd k) and without a session, each once, as far as the
    // last watermark (54:00, from the last file's 59:00) lets them go: at or below 43:59.999,
    // i.e. all of files 0..3 (4 x 6) and file 4's clicks at 41 and 43.
    assert_eq!(unmatched, 4 * 6 + 2, "{rows:#?}");
    let first_outer = got
        .iter()
        .find(|(_, rows)| rows.iter().any(|r| r.contains("\"s-0-1\"")))
        .map(|(id, _)| *id);
    assert_eq!(first_outer, Some(2));
    let p = progress(&dir.path().join("checkpoints/left"))?;
    let ops: Vec<&Value> = p.iter().map(|r| &r["stateOperators"][0]).collect();
    assert!(
        ops.iter().all(|o| o["operatorName"] == "symmetricHashJoin"),
        "{ops:#?}"
    );
    let dropped: u64 = ops
        .iter()
        .map(|o| o["numRowsDroppedByWatermark"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        dropped,
        2 * (FILES as u64 - 3),
        "the late click and order of files 3..6"
    );
    // The state holds about two files of rows, not all of them.
    let most = ops
        .iter()
        .map(|o| o["numRowsTotal"].as_u64().unwrap_or(0))
        .max()
        .unwrap_or(0);
    assert!(most > 0 && most < 50, "numRowsTotal peaked at {most}");
    // What a later row could still match stays: the clicks after 43:59.999 (file 4's from
    // minute 44 and its sessionless one, file 5's eleven) and the orders after 53:59.999.
    assert_eq!(
        ops.last().map(|o| o["numRowsTotal"].as_u64()),
        Some(Some(7 + 11 + 3)),
        "{ops:#?}"
    );
    // Each row's columns: the key, the clicks', the orders'.
    let first = rows.first().context("no rows")?;
    let keys: Vec<&str> = first
        .as_object()
        .context("object")?
        .keys()
        .map(String::as_str)
        .collect();
    for key in [
        "session_id",
        "click_id",
        "clicked_at",
        "url",
        "order_id",
        "amount",
        "occurred_at",
    ] {
        ensure!(keys.contains(&key), "{key} missing from {first}");
    }
    Ok(())
}

#[test]
fn a_stream_stream_join_killed_at_every_phase_writes_what_an_uninterrupted_run_writes() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    write_inputs(dir.path())?;
    let reference = pipeline(dir.path(), "reference", "full", "")?;
    run_ok(EXE, &cache(), &reference, &[])?;
    let want = batches(dir.path(), "reference")?;
    ensure!(want.len() >= FILES as usize, "{want:?}");
    for phase in ["after-offsets", "before-commit"] {
        for batch in [0, 2, 5, FILES as u64] {
            let tag = format!("kill-{phase}-{batch}");
            let file = pipeline(dir.path(), &tag, "full", "")?;
            run_killed_at(EXE, &cache(), &file, &format!("{phase}@{batch}"))?;
            run_ok(EXE, &cache(), &file, &[])?;
            let got = batches(dir.path(), &tag)?;
            assert_eq!(got, want, "killed at {phase}@{batch}");
            assert_eq!(
                commit_ids(&dir.path().join("checkpoints").join(&tag))?,
                commit_ids(&dir.path().join("checkpoints/reference"))?
            );
        }
    }
    Ok(())
}

#[test]
fn validation_refuses_what_spark_refuses_for_two_streams() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_inputs(dir.path())?;
    let validate = |file: &Path| -> Result<String> {
        let out = weir(EXE, &cache(), &["validate", file.to_str().context("path")?])?;
        ensure!(!out.status.success(), "validate passed {}", file.display());
        Ok(String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let base = std::fs::read_to_string(pipeline(dir.path(), "v", "left", "")?)?;
    let case = |name: &str, text: String| -> Result<String> {
        let file = dir.path().join(format!("{name}.toml"));
        std::fs::write(&file, text)?;
        validate(&file)
    };
    let no_bound = case(
        "no_bound",
        base.replace(
            "condition = \"orders.occurred_at BETWEEN clicks.clicked_at AND clicks.clicked_at + INTERVAL 10 MINUTES\"",
            "condition = \"orders.occurred_at >= clicks.clicked_at\"",
        ),
    )?;
    assert!(
        no_bound.contains("join.type")
            && no_bound.contains("the unmatched rows of clicks would never be emitted"),
        "{no_bound}"
    );
    let anti = case(
        "anti",
        base.replace("type = \"left\"", "type = \"left_anti\""),
    )?;
    assert!(
        anti.contains("a left anti join of two streams is not supported"),
        "{anti}"
    );
    let global = case(
        "global",
        base.replace(
            "[sink]",
            "[watermark]\ncolumn = \"clicked_at\"\ndelay = \"1 minute\"\n\n[sink]",
        ),
    )?;
    assert!(
        global.contains("set watermark = { column, delay } on each [[source]]"),
        "{global}"
    );
    let update = case(
        "update",
        base.replace("state_store", "output_mode = \"update\"\nstate_store"),
    )?;
    assert!(update.contains("\"append\" output mode only"), "{update}");
    let column = case(
        "column",
        base.replace(
            "column = \"clicked_at\", delay",
            "column = \"clicked\", delay",
        ),
    )?;
    assert!(
        column.contains("source.clicks.watermark.column")
            && column.contains("\"clicked\" is not a column of clicks"),
        "{column}"
    );
    // Inner joins need no bound, but say that state grows without one.
    let file = dir.path().join("unbounded.toml");
    std::fs::write(
        &file,
        base.replace("type = \"left\"", "type = \"inner\"").replace(
            "condition = \"orders.occurred_at BETWEEN clicks.clicked_at AND clicks.clicked_at + INTERVAL 10 MINUTES\"",
            "",
        ),
    )?;
    let out = run_ok(EXE, &cache(), &file, &[])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("its state grows without limit"), "{stderr}");
    let p = progress(&dir.path().join("checkpoints/v"))?;
    let total: Vec<u64> = p
        .iter()
        .map(|r| r["stateOperators"][0]["numRowsTotal"].as_u64().unwrap_or(0))
        .collect();
    assert!(
        total.windows(2).all(|w| w[0] <= w[1]),
        "state only grows: {total:?}"
    );
    Ok(())
}

/// The same join into a Wasm foreachBatch sink (`jsonl_sink`, which appends and keeps a sidecar
/// of the batches it wrote), killed also while the sink is writing: the rows it holds in the end
/// are an uninterrupted run's, each once.
#[test]
fn a_stream_stream_join_killed_inside_its_plugin_sink_writes_each_row_once() -> Result<()> {
    let ws = Workspace::new(1, 1)?;
    write_inputs(ws.path())?;
    let with_plugin_sink = |tag: &str| -> Result<std::path::PathBuf> {
        let file = pipeline(ws.path(), tag, "left", "")?;
        let text = std::fs::read_to_string(&file)?;
        let at = text.find("[sink]").context("[sink]")?;
        std::fs::write(&file, format!("{}{}", &text[..at], jsonl_plugin_sink(tag)))?;
        std::fs::create_dir_all(ws.path().join("out").join(tag))?;
        Ok(file)
    };
    let rows = |tag: &str| -> Result<Vec<String>> {
        let mut rows = lines(&ws.path().join("out").join(tag).join("orders.jsonl"))?;
        rows.sort();
        Ok(rows)
    };
    run_ok(EXE, &cache(), &with_plugin_sink("plugin-reference")?, &[])?;
    let want = rows("plugin-reference")?;
    ensure!(want.len() > 30, "{} rows", want.len());
    for phase in ["after-offsets", "in-sink", "before-commit"] {
        for batch in [1, 4] {
            let tag = format!("plugin-{phase}-{batch}");
            let file = with_plugin_sink(&tag)?;
            run_killed_at(EXE, &cache(), &file, &format!("{phase}@{batch}"))?;
            run_ok(EXE, &cache(), &file, &[])?;
            assert_eq!(rows(&tag)?, want, "killed at {phase}@{batch}");
        }
    }
    Ok(())
}

/// A clock the test sets; counts its reads so that the test knows the query has polled.
struct ManualClock {
    now: std::sync::atomic::AtomicI64,
    reads: std::sync::atomic::AtomicU64,
}

impl weir_host::query::Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.now.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// An input's own `idle_timeout`: the orders stop after two files, their watermark holds the
/// query's (the minimum) back, and the clicks after it stay buffered; once the orders have been
/// idle for the timeout their watermark follows the clock, the query's becomes the clicks', and a
/// batch without data lets the clicks go (a left join emits the unmatched ones).
#[test]
fn an_idle_input_s_own_timeout_lets_the_other_input_s_watermark_lead() -> Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir()?;
    write_inputs(dir.path())?;
    for i in 2..FILES {
        std::fs::remove_file(dir.path().join(format!("orders/orders-{i:05}.json")))?;
    }
    let text = std::fs::read_to_string(pipeline(dir.path(), "idle", "left", "")?)?
        .replace("trigger = \"available-now\"\n", "")
        .replace(
            "column = \"occurred_at\", delay = \"5 minutes\"",
            "column = \"occurred_at\", delay = \"5 minutes\", idle_timeout = \"1 minute\"",
        );
    let spec = weir_host::spec::parse(&text, dir.path(), "idle.toml", &[])
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let t0: i64 = 1_900_000_000_000;
    let clock = Arc::new(ManualClock {
        now: t0.into(),
        reads: 0.into(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let (thread_clock, thread_stop) = (Arc::clone(&clock), Arc::clone(&stop));
    let runner = std::thread::spawn(move || {
        let options = weir_host::query::QueryOptions {
            cache_dir: Some(cache()),
            clock: thread_clock,
            stop: thread_stop,
            ..weir_host::query::QueryOptions::default()
        };
        weir_host::query::Query::start(spec, options).and_then(|mut q| q.run())
    });
    let checkpoint = dir.path().join("checkpoints/idle");
    let committed = || commit_ids(&checkpoint).unwrap_or_default();
    let wait_for = |what: &str, done: &dyn Fn() -> bool| -> Result<()> {
        let until = std::time::Instant::now() + Duration::from_secs(60);
        while !done() {
            ensure!(
                std::time::Instant::now() < until,
                "timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    };
    let polled = |what: &str| -> Result<()> {
        let reads = clock.reads.load(Ordering::SeqCst);
        wait_for(what, &|| clock.reads.load(Ordering::SeqCst) >= reads + 5)
    };
    // The six files of clicks (two with orders), one batch each.
    wait_for("the data batches", &|| committed().len() >= FILES as usize)?;
    polled("the query to poll again")?;
    let before = committed();
    let last = *before.last().context("a batch")?;
    let minute = |m: i64| 1_709_251_200_000 + m * 60_000;
    // The orders' watermark (their latest at 19:00, minus 5 minutes) holds the query's.
    let wm = |n: u64| -> Result<i64> {
        Ok(
            weir_tests::offset_entry(&checkpoint, n)?["batchWatermarkMs"]
                .as_i64()
                .unwrap_or(i64::MIN),
        )
    };
    assert_eq!(wm(last)?, minute(14), "batches {before:?}");
    clock.now.store(t0 + 59_000, Ordering::SeqCst);
    polled("the query to poll at 59 s")?;
    assert_eq!(committed(), before, "not idle for a minute yet");
    clock.now.store(t0 + 60_000, Ordering::SeqCst);
    wait_for("the idle batch", &|| committed().len() > before.len())?;
    stop.store(true, Ordering::SeqCst);
    runner
        .join()
        .map_err(|_| anyhow::anyhow!("query thread panicked"))??;
    let after = *committed().last().context("a batch")?;
    // The clicks' watermark leads now: their latest (59:00) minus 5 minutes.
    assert_eq!(wm(after)?, minute(54));
    let p = progress(&checkpoint)?;
    let totals: Vec<u64> = p
        .iter()
        .map(|r| r["stateOperators"][0]["numRowsTotal"].as_u64().unwrap_or(0))
        .collect();
    let (held, let_go) = (totals[before.len() - 1], totals[totals.len() - 1]);
    assert!(let_go < held, "the idle batch lets clicks go: {totals:?}");
    let emitted = p.last().and_then(|r| r["sink"]["numOutputRows"].as_u64());
    assert!(
        emitted.is_some_and(|n| n > 0),
        "unmatched clicks emitted: {p:#?}"
    );
    Ok(())
}
