//! Stateful queries: bounded state under a watermark, and a checkpoint that
//! refuses a query it was not written for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use weir_host::operator::{BatchTransform, TransformError};
use weir_host::plugin::BatchInfo;
use weir_host::query::{MakeTransform, Query, QueryOptions, RunSummary};
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

/// Runs `text` with native transforms added after the file's own.
fn run_with(dir: &Path, text: &str, extra: Vec<MakeTransform>) -> Result<RunSummary, String> {
    let spec = weir_host::spec::parse(text, dir, "test.toml", &[]).map_err(|e| e.to_string())?;
    let options = QueryOptions {
        cache_dir: Some(cache()),
        memory_sink: Some(MemorySink::new()),
        extra_transforms: extra,
        ..QueryOptions::default()
    };
    Query::start(spec, options)
        .and_then(|mut q| q.run())
        .map_err(|e| e.to_string())
}

/// A native transform that adds a column, `channel`, that no key or
/// aggregate reads; optionally it asks the query to stop after its batch.
struct AddChannel {
    schema: SchemaRef,
    stop: Option<Arc<AtomicBool>>,
}

impl BatchTransform for AddChannel {
    fn name(&self) -> &str {
        "add_channel"
    }

    fn output_schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn process(
        &mut self,
        batch: &RecordBatch,
        info: &BatchInfo,
    ) -> Result<RecordBatch, TransformError> {
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        columns.push(Arc::new(StringArray::from(vec!["web"; batch.num_rows()])));
        if let Some(stop) = &self.stop {
            stop.store(true, Ordering::SeqCst);
        }
        RecordBatch::try_new(Arc::clone(&self.schema), columns).map_err(|e| {
            TransformError::Native {
                name: "add_channel".into(),
                batch_id: info.batch_id,
                message: e.to_string(),
            }
        })
    }
}

fn add_channel(stop: Option<Arc<AtomicBool>>) -> MakeTransform {
    Box::new(move |input: &SchemaRef| -> Box<dyn BatchTransform> {
        let mut fields: Vec<Field> = input.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new("channel", DataType::Utf8, false));
        Box::new(AddChannel {
            schema: Arc::new(Schema::new(fields)),
            stop,
        })
    })
}

/// Every file of the checkpoint `dir` with its bytes, except the `lock`
/// file's content (it names the last process that took the lock).
fn snapshot(dir: &Path) -> Result<BTreeMap<PathBuf, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                out.insert(path.clone(), Vec::new());
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "lock") {
                out.insert(path, Vec::new());
            } else {
                let bytes = std::fs::read(&path)?;
                out.insert(path, bytes);
            }
        }
    }
    Ok(out)
}

/// Moves the data files from number `from` on out of the source folder;
/// the returned closure puts them back.
fn hold_back(ws: &Workspace, from: usize) -> Result<impl FnOnce() -> Result<()>> {
    let data = ws.path().join("data/orders");
    let held = ws.path().join("held");
    std::fs::create_dir_all(&held)?;
    let mut names: Vec<_> = std::fs::read_dir(&data)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    names.sort();
    let moved: Vec<_> = names.into_iter().skip(from).collect();
    for name in &moved {
        std::fs::rename(data.join(name), held.join(name))?;
    }
    Ok(move || {
        for name in &moved {
            std::fs::rename(held.join(name), data.join(name))?;
        }
        Ok(())
    })
}

/// The `order_id`s of the JSON lines a files sink wrote into `dir`, sorted.
fn sorted_order_ids(dir: &Path) -> Result<Vec<i64>> {
    let mut ids = sink_lines(dir)?
        .iter()
        .map(|l| {
            Ok(serde_json::from_str::<serde_json::Value>(l)?["order_id"]
                .as_i64()
                .unwrap_or(-1))
        })
        .collect::<Result<Vec<_>>>()?;
    ids.sort_unstable();
    Ok(ids)
}

/// The JSON lines a files sink wrote into `dir`, sorted.
fn sink_lines(dir: &Path) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if !path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        {
            lines.extend(std::fs::read_to_string(&path)?.lines().map(str::to_owned));
        }
    }
    lines.sort();
    Ok(lines)
}

fn to_files_sink(text: &str, out: &str) -> String {
    text.replace(
        "[sink]\nkind = \"memory\"",
        &format!("[sink]\nkind = \"files\"\npath = \"{out}\"\nformat = \"json\""),
    )
}

fn dedup(tag: &str, keys: &str, within_watermark: bool) -> String {
    revenue(tag, true, "", "[]").replace(
        "[aggregate]\nwindow = { column = \"occurred_at\", size = \"5 minutes\" }\ngroup_by = []\nselect = [\"sum(amount) AS revenue\", \"count(*) AS orders\"]",
        &format!("[deduplicate]\nkeys = {keys}\nwithin_watermark = {within_watermark}"),
    )
}

fn fingerprint(checkpoint: &Path) -> Result<serde_json::Value> {
    Ok(weir_tests::checkpoint_metadata(checkpoint)?
        .fingerprint
        .unwrap_or_default())
}

fn state_rows(checkpoint: &Path) -> Result<Vec<u64>> {
    Ok(weir_tests::progress(checkpoint)?
        .iter()
        .map(|v| {
            v["stateOperators"][0]["numRowsTotal"]
                .as_u64()
                .unwrap_or(u64::MAX)
        })
        .collect())
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

/// A pipeline that names no state store keeps the one its checkpoint was started with, so a
/// checkpoint of an older default (RocksDB) resumes as it was; a new checkpoint takes the
/// default, sorted runs, and records it.
#[test]
fn an_unnamed_state_store_is_the_one_the_checkpoint_was_started_with() -> Result<()> {
    let ws = Workspace::new(3, 50)?;
    let base = revenue("q", true, "", r#"["status"]"#);
    let rocks = base.replace("state_store = \"memory\"", "state_store = \"rocksdb\"");
    let unnamed = base.replace("state_store = \"memory\"\n", "");
    assert!(!unnamed.contains("state_store"), "{unnamed}");
    run(ws.path(), &rocks).map_err(anyhow::Error::msg)?;
    run(ws.path(), &unnamed).map_err(|e| anyhow::anyhow!("the unnamed store refused: {e}"))?;
    let recorded = |tag: &str| -> Result<String> {
        let metadata =
            std::fs::read_to_string(ws.path().join("checkpoints").join(tag).join("metadata"))?;
        let value: serde_json::Value = serde_json::from_str(&metadata)?;
        Ok(value["fingerprint"]["state_store"]
            .as_str()
            .unwrap_or("")
            .to_string())
    };
    assert_eq!(recorded("q")?, "rocksdb");
    // Naming another store is still refused.
    let runs = base.replace("state_store = \"memory\"", "state_store = \"runs\"");
    let err = run(ws.path(), &runs).expect_err("a switch to runs");
    assert!(err.contains("the state store"), "{err}");

    let fresh = unnamed.replace("checkpoints/q", "checkpoints/fresh");
    run(ws.path(), &fresh).map_err(anyhow::Error::msg)?;
    assert_eq!(recorded("fresh")?, "runs");
    let runs_on_disk = snapshot(&ws.path().join("checkpoints/fresh/state"))?
        .keys()
        .filter(|p| p.extension().is_some_and(|e| e == "run"))
        .count();
    assert!(
        runs_on_disk > 0,
        "no run files in the new checkpoint's state"
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
        (
            base.replace("\"count(*) AS orders\"", "\"avg(amount) AS orders\""),
            "the value schema of the stateful operator's state",
        ),
        (
            base.replace(
                "\"count(*) AS orders\"",
                "\"count(*) AS orders\", \"max(amount)\"",
            ),
            "the value schema of the stateful operator's state",
        ),
    ];
    let checkpoint = ws.path().join("checkpoints/q");
    let before = snapshot(&checkpoint)?;
    assert!(
        before
            .keys()
            .any(|p| p.starts_with(checkpoint.join("state/0/0"))),
        "the first run wrote state: {before:?}"
    );
    for (text, what) in refused {
        let err = run(ws.path(), &text).expect_err(what);
        assert!(err.contains("cannot be resumed"), "{what}: {err}");
        assert!(err.contains(what), "{what}: {err}");
        assert!(err.contains("Start a new checkpoint"), "{err}");
        // Refused before any state store was opened or created.
        assert_eq!(
            snapshot(&checkpoint)?,
            before,
            "{what} touched the checkpoint"
        );
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

/// A clock the test moves by hand, counting how often the query reads it.
///
/// A continuous query reads the clock once per poll of its sources and once per batch it plans
/// (before `offsets/N`), nowhere else. So once it has read the clock [`Self::SETTLED`] times
/// after a change, it has polled at the new time and any batch that time starts is committed:
/// the first read may have begun before the change, the second is a poll at the new time at
/// the latest (or a batch planned at the old one, then that batch's commit and a poll), the
/// batch that poll decides reads once more, and a poll follows its commit. With no new input
/// and a clock standing still, every poll decides the same.
#[derive(Debug)]
struct ManualClock {
    now: std::sync::atomic::AtomicI64,
    reads: std::sync::atomic::AtomicU64,
}

impl ManualClock {
    /// Reads after a change that show the query has acted on it (see the type's docs).
    const SETTLED: u64 = 5;

    fn new(now: i64) -> Self {
        Self {
            now: now.into(),
            reads: 0.into(),
        }
    }

    fn set(&self, now: i64) {
        self.now.store(now, Ordering::SeqCst);
    }

    fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }
}

impl weir_host::query::Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        let now = self.now.load(Ordering::SeqCst);
        self.reads.fetch_add(1, Ordering::SeqCst);
        now
    }
}

fn offsets_watermark(checkpoint: &Path, batch: u64) -> Result<i64> {
    let v = weir_tests::offset_entry(checkpoint, batch)?;
    Ok(v["batchWatermarkMs"].as_i64().unwrap_or(i64::MIN))
}

#[test]
fn an_idle_input_advances_the_watermark_after_its_timeout() -> Result<()> {
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
    let clock = Arc::new(ManualClock::new(t0));
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
    let committed = |checkpoint: &Path| weir_tests::commit_ids(checkpoint).unwrap_or_default();
    // The three files, then the no-data batch their watermark asks for.
    wait_for("the data batches", &|| committed(&checkpoint).len() >= 4)?;
    let reads = clock.reads();
    wait_for("the query to poll again", &|| {
        clock.reads() >= reads + ManualClock::SETTLED
    })?;
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

    // Not yet idle for a minute: the query polls at the new time, and nothing happens.
    clock.set(t0 + 59_000);
    let reads = clock.reads();
    wait_for("the query to poll at 59 s", &|| {
        clock.reads() >= reads + ManualClock::SETTLED
    })?;
    assert_eq!(committed(&checkpoint), before);

    // Idle for a minute: the watermark jumps to clock − delay, one batch runs
    // and emits and evicts every window.
    clock.set(t0 + 60_000);
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

#[test]
fn a_new_column_upstream_of_an_aggregation_or_a_dedup_is_accepted() -> Result<()> {
    // 30 minutes of orders: more than the 10-minute watermark delay, so
    // windows are emitted.
    let ws = Workspace::new(30, 10)?;
    let aggregation = to_files_sink(&revenue("agg", true, "", r#"["status"]"#), "out/agg");
    let by_order = to_files_sink(&dedup("dedup", r#"["order_id"]"#, false), "out/dedup");
    // The same queries, uninterrupted and unchanged, as the reference.
    run(
        ws.path(),
        &aggregation
            .replace("checkpoints/agg", "checkpoints/agg_ref")
            .replace("out/agg", "out/agg_ref"),
    )
    .map_err(anyhow::Error::msg)?;
    run(
        ws.path(),
        &by_order
            .replace("checkpoints/dedup", "checkpoints/dedup_ref")
            .replace("out/dedup", "out/dedup_ref"),
    )
    .map_err(anyhow::Error::msg)?;

    let put_back = hold_back(&ws, 15)?;
    for text in [&aggregation, &by_order] {
        let first = run(ws.path(), text).map_err(anyhow::Error::msg)?;
        assert!(first.batches >= 15, "{first:?}");
    }
    put_back()?;
    for (tag, text) in [("agg", &aggregation), ("dedup", &by_order)] {
        let checkpoint = ws.path().join("checkpoints").join(tag);
        let old_key = fingerprint(&checkpoint)?["state_key"].clone();
        let second = run_with(ws.path(), text, vec![add_channel(None)])
            .map_err(|e| anyhow::anyhow!("{tag}: a new column was refused: {e}"))?;
        assert!(
            second.batches >= 15,
            "{tag} resumed and ran the rest: {second:?}"
        );
        let recorded = fingerprint(&checkpoint)?;
        assert_eq!(recorded["state_key"], old_key, "{tag}");
        assert_eq!(recorded["plugins"], serde_json::json!([]), "{tag}");
    }
    // The aggregation's answer is the uninterrupted one.
    assert!(!sink_lines(&ws.path().join("out/agg_ref"))?.is_empty());
    assert_eq!(
        sink_lines(&ws.path().join("out/agg"))?,
        sink_lines(&ws.path().join("out/agg_ref"))?
    );
    // The dedup kept the same orders; the later rows carry the new column.
    let order_ids = |dir: &str| sorted_order_ids(&ws.path().join(dir));
    let (ids, reference) = (order_ids("out/dedup")?, order_ids("out/dedup_ref")?);
    assert!(!ids.is_empty());
    assert_eq!(ids, reference);
    let with_channel = sink_lines(&ws.path().join("out/dedup"))?
        .iter()
        .filter(|l| l.contains("\"channel\":\"web\""))
        .count();
    assert!(
        with_channel > 0 && with_channel < ids.len(),
        "{with_channel} of {}",
        ids.len()
    );
    Ok(())
}

#[test]
fn a_new_trigger_interval_is_accepted_and_recorded() -> Result<()> {
    let ws = Workspace::new(3, 20)?;
    let base = revenue("trig", true, "", r#"["status"]"#);
    let checkpoint = ws.path().join("checkpoints/trig");
    for (i, interval) in ["1s", "2s"].into_iter().enumerate() {
        let text = base.replace(
            "trigger = \"available-now\"",
            &format!("trigger = \"{interval}\""),
        );
        // The transform stops the query after its first batch.
        let stop = Arc::new(AtomicBool::new(false));
        let spec = weir_host::spec::parse(&text, ws.path(), "test.toml", &[])
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let options = QueryOptions {
            cache_dir: Some(cache()),
            memory_sink: Some(MemorySink::new()),
            stop: Arc::clone(&stop),
            extra_transforms: vec![add_channel(Some(stop))],
            ..QueryOptions::default()
        };
        let summary = Query::start(spec, options)
            .and_then(|mut q| q.run())
            .map_err(|e| anyhow::anyhow!("trigger {interval}: {e}"))?;
        assert_eq!(summary.batches, 1, "{interval}");
        assert_eq!(summary.last_batch_id, Some(i as u64), "{interval} resumed");
        let ms = if interval == "1s" { 1000 } else { 2000 };
        assert_eq!(
            fingerprint(&checkpoint)?["trigger"],
            format!("every {ms} ms"),
            "the accepted change is recorded"
        );
    }
    assert_eq!(weir_tests::commit_ids(&checkpoint)?, vec![0, 1]);
    Ok(())
}

#[test]
fn a_dedup_restart_refuses_other_keys_before_touching_state() -> Result<()> {
    let ws = Workspace::new(2, 20)?;
    let base = dedup("d", r#"["order_id"]"#, false);
    run(ws.path(), &base).map_err(anyhow::Error::msg)?;
    let checkpoint = ws.path().join("checkpoints/d");
    let before = snapshot(&checkpoint)?;
    for (text, what) in [
        (
            dedup("d", r#"["order_id", "customer_id"]"#, false),
            "the key schema of the stateful operator's state",
        ),
        (
            dedup("d", r#"["order_id"]"#, true),
            "the value schema of the stateful operator's state",
        ),
    ] {
        let err = run(ws.path(), &text).expect_err(what);
        assert!(err.contains(what), "{what}: {err}");
        assert_eq!(
            snapshot(&checkpoint)?,
            before,
            "{what} touched the checkpoint"
        );
    }
    Ok(())
}

#[test]
fn a_checkpoint_with_the_older_fingerprint_resumes_when_its_keys_match() -> Result<()> {
    let ws = Workspace::new(4, 20)?;
    let base = revenue("old", true, "", r#"["status"]"#);
    let checkpoint = ws.path().join("checkpoints/old");
    let put_back = hold_back(&ws, 2)?;
    let output: Vec<String> = {
        let spec = weir_host::spec::parse(&base, ws.path(), "test.toml", &[])
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let options = QueryOptions {
            cache_dir: Some(cache()),
            memory_sink: Some(MemorySink::new()),
            ..QueryOptions::default()
        };
        let mut q = Query::start(spec, options)?;
        let fields = q
            .output_schema()
            .fields()
            .iter()
            .map(|f| format!("{} {}", f.name(), f.data_type()))
            .collect();
        q.run()?;
        fields
    };
    put_back()?;
    // Rewrite the fingerprint as the previous format recorded it: the
    // operator's output schema under `stateful_schema`, no key or value
    // schema, no trigger or rate limits.
    let rewrite = |schema: &[String]| -> Result<()> {
        let path = checkpoint.join("metadata");
        let mut metadata: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        let fp = metadata["fingerprint"]
            .as_object_mut()
            .ok_or_else(|| anyhow::anyhow!("no fingerprint"))?;
        for key in ["state_key", "state_value", "trigger", "rate_limits"] {
            fp.remove(key);
        }
        fp.insert("stateful_schema".into(), serde_json::json!(schema));
        std::fs::write(&path, format!("{metadata}\n"))?;
        Ok(())
    };
    // A recorded schema without the key column `status`: refused.
    let without_status: Vec<String> = output
        .iter()
        .filter(|f| !f.starts_with("status "))
        .cloned()
        .collect();
    rewrite(&without_status)?;
    let err = run(ws.path(), &base).expect_err("a key column missing from the old schema");
    assert!(
        err.contains("the key schema of the stateful operator's state"),
        "{err}"
    );
    assert!(err.contains("status"), "{err}");

    // As the previous format wrote it: accepted, and the fingerprint upgraded.
    rewrite(&output)?;
    let summary = run(ws.path(), &base).map_err(anyhow::Error::msg)?;
    assert!(summary.batches >= 2, "{summary:?}");
    let fp = fingerprint(&checkpoint)?;
    assert!(fp.get("stateful_schema").is_none(), "{fp}");
    // The key: the window and the group key, as the output schema has them.
    let key: Vec<&String> = output
        .iter()
        .filter(|f| {
            ["window_start ", "window_end ", "status "]
                .iter()
                .any(|k| f.starts_with(k))
        })
        .collect();
    assert_eq!(key.len(), 3, "{output:?}");
    assert_eq!(fp["state_key"]["columns"], serde_json::json!(key), "{fp}");
    Ok(())
}

/// A checkpoint whose deduplication on one integer key was written with one
/// state entry per key (every build before integer sets recorded the value
/// schema `[]`) resumes in that layout instead of being refused or misread.
#[test]
fn a_dedup_checkpoint_with_one_entry_per_key_keeps_its_layout() -> Result<()> {
    let ws = Workspace::new(6, 20)?;
    let text = to_files_sink(&dedup("per_key", r#"["order_id"]"#, false), "out/per_key");
    let checkpoint = ws.path().join("checkpoints/per_key");
    // Created before any batch, then recorded as an older build did.
    let put_back_all = hold_back(&ws, 0)?;
    let empty = run(ws.path(), &text).map_err(anyhow::Error::msg)?;
    assert_eq!(empty.batches, 0, "{empty:?}");
    assert_eq!(
        fingerprint(&checkpoint)?["state_value"]["columns"],
        serde_json::json!(["bucket_members Binary"]),
        "a new checkpoint stores one integer key as integer sets"
    );
    let path = checkpoint.join("metadata");
    let mut metadata: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    metadata["fingerprint"]["state_value"]["columns"] = serde_json::json!([]);
    std::fs::write(&path, format!("{metadata}\n"))?;
    put_back_all()?;

    let put_back = hold_back(&ws, 3)?;
    let first = run(ws.path(), &text).map_err(anyhow::Error::msg)?;
    assert!(first.batches >= 3, "{first:?}");
    put_back()?;
    // Orders of the first batches again: duplicates across the restart.
    let data = ws.path().join("data/orders");
    let mut names: Vec<_> = std::fs::read_dir(&data)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    names.sort();
    let again: String = std::fs::read_to_string(&names[0])?
        .lines()
        .take(8)
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(data.join("zz-again.json"), again)?;
    let second = run(ws.path(), &text).map_err(anyhow::Error::msg)?;
    assert!(second.batches >= 4, "{second:?}");
    assert_eq!(
        fingerprint(&checkpoint)?["state_value"]["columns"],
        serde_json::json!([]),
        "the layout the checkpoint recorded is kept"
    );

    // The same input on a new checkpoint (integer sets), uninterrupted.
    let reference = text
        .replace("checkpoints/per_key", "checkpoints/sets")
        .replace("out/per_key", "out/sets");
    run(ws.path(), &reference).map_err(anyhow::Error::msg)?;
    let order_ids = |dir: &str| sorted_order_ids(&ws.path().join(dir));
    let ids = order_ids("out/per_key")?;
    let valid = ws.orders.lines - ws.orders.malformed;
    assert_eq!(
        ids.len() as u64,
        valid,
        "every order once, the repeats dropped"
    );
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "no order twice");
    assert_eq!(ids, order_ids("out/sets")?);
    Ok(())
}

#[test]
fn dedup_state_stays_bounded_with_the_event_time_among_its_keys_and_grows_without() -> Result<()> {
    // 150 one-minute files: 150 batches of 20 orders each.
    let ws = Workspace::new(150, 20)?;
    let keyed = dedup("dedup_bounded", r#"["order_id", "occurred_at"]"#, false);
    let summary = run(ws.path(), &keyed).map_err(anyhow::Error::msg)?;
    let valid = ws.orders.lines - ws.orders.malformed;
    assert_eq!(summary.output_rows, valid, "every order is distinct");
    let bounded = state_rows(&ws.path().join("checkpoints/dedup_bounded"))?;
    assert_eq!(bounded.len(), 151, "150 data batches and the no-data batch");
    // The watermark (10 minutes behind the newest order) keeps about 11
    // files of keys: the ten minutes of delay and the file just read.
    let ceiling: u64 = 13 * 20;
    assert!(
        bounded.iter().all(|&n| n <= ceiling),
        "state rows per batch: {bounded:?}"
    );
    assert!(
        bounded.iter().any(|&n| n > 10 * 18),
        "the delay's worth is kept: {bounded:?}"
    );

    let by_order = dedup("dedup_unbounded", r#"["order_id"]"#, false);
    run(ws.path(), &by_order).map_err(anyhow::Error::msg)?;
    let unbounded = state_rows(&ws.path().join("checkpoints/dedup_unbounded"))?;
    assert!(
        unbounded.windows(2).all(|w| w[0] <= w[1]),
        "never shrinks: {unbounded:?}"
    );
    assert_eq!(
        unbounded.last().copied(),
        Some(valid),
        "one key per order ever seen"
    );
    assert!(valid > 5 * ceiling);
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
        let entry = weir_tests::offset_entry(&checkpoint, 1)?;
        let per_input: Vec<i64> = entry["sources"]
            .as_array()
            .map(|a| a.iter().filter_map(|s| s["watermarkMs"].as_i64()).collect())
            .unwrap_or_default();
        assert_eq!(
            per_input,
            [ms(10, 20), ms(8, 50)],
            "{policy}: each input's own watermark is recorded"
        );
        let first = weir_tests::progress(&checkpoint)?
            .into_iter()
            .next()
            .unwrap_or_default();
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
        let last = *weir_tests::offset_ids(&checkpoint)?.last().unwrap_or(&0);
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

/// Threads change no result. A deduplication within the watermark on a composite key, over
/// RocksDB with four state partitions, one file a batch, into Parquet files: on three threads
/// (the next batch's file read ahead while a batch runs, the partitions' lookups, evictions
/// and commits spread over threads, the Parquet columns encoded on threads) it writes the same
/// files byte for byte as on one, with the same state figures and offsets batch by batch.
#[test]
fn threads_change_no_result() -> Result<()> {
    let ws = Workspace::new(8, 2_500)?;
    let text = |threads: usize| {
        let tag = format!("threads{threads}");
        // A short delay, so that keys expire batch after batch.
        dedup(&tag, r#"["customer_id", "status"]"#, true)
            .replace("delay = \"10 minutes\"", "delay = \"2 seconds\"")
            .replace(
                "state_store = \"memory\"",
                &format!("state_store = \"rocksdb\"\nstate_partitions = 4\nthreads = {threads}"),
            )
            .replace(
                "[sink]\nkind = \"memory\"",
                &format!("[sink]\nkind = \"files\"\npath = \"out/{tag}\"\nformat = \"parquet\""),
            )
    };
    let mut seen = Vec::new();
    for threads in [1, 3] {
        let summary = run(ws.path(), &text(threads)).map_err(anyhow::Error::msg)?;
        let tag = format!("threads{threads}");
        let mut files = BTreeMap::new();
        for entry in std::fs::read_dir(ws.path().join("out").join(&tag))? {
            let path = entry?.path();
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            files.insert(name, std::fs::read(&path)?);
        }
        let figures: Vec<serde_json::Value> =
            weir_tests::progress(&ws.path().join("checkpoints").join(&tag))?
                .into_iter()
                .map(|p| {
                    let s = &p["stateOperators"][0];
                    serde_json::json!([
                        p["batchId"],
                        p["numInputRows"],
                        p["sink"]["numOutputRows"],
                        p["sources"][0]["endOffset"],
                        p["sources"][0]["metrics"]["numMalformedRows"],
                        s["numRowsTotal"],
                        s["numRowsUpdated"],
                        s["numRowsRemoved"],
                        s["numRowsDroppedByWatermark"],
                    ])
                })
                .collect();
        seen.push((summary.batches, summary.output_rows, files, figures));
    }
    let (one, three) = (&seen[0], &seen[1]);
    // One batch per file, and a last one without data that the watermark's advance runs.
    assert_eq!(one.0, 9);
    assert!(one.1 > 100, "rows kept: {}", one.1);
    assert_eq!(one.2.len(), 8, "one Parquet file per batch with rows");
    assert_eq!(
        three.2.keys().collect::<Vec<_>>(),
        one.2.keys().collect::<Vec<_>>()
    );
    for (name, bytes) in &one.2 {
        assert!(
            three.2[name] == *bytes,
            "{name} differs between one and three threads"
        );
    }
    assert_eq!(three.3, one.3, "the batches' figures differ");
    assert_eq!(three.1, one.1);
    // The case is one where the partitions have work: keys stored and evicted.
    let total = |i: usize| {
        one.3
            .iter()
            .map(|f| f[i].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    assert!(total(6) > 10_000, "keys stored: {:?}", one.3);
    assert!(total(7) > 10_000, "keys evicted: {:?}", one.3);
    Ok(())
}
