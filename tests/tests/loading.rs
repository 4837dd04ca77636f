//! Loading plugins: a pinned sha256 is enforced at start, instances come
//! from the pooling allocator (Python and JavaScript fit in it), and a new
//! build of a running plugin replaces it between batches — recorded in the
//! checkpoint per batch — unless it is refused, when the old build keeps
//! running.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, ensure};
use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_schema::SchemaRef;
use sha2::{Digest, Sha256};
use weir_host::operator::{BatchTransform, TransformError};
use weir_host::plugin::{
    BatchInfo, EngineOptions, PluginEngine, PluginOptions, PoolOptions, Sandbox, WasmTransform,
};
use weir_host::query::{Query, QueryOptions, ReloadOutcome};
use weir_host::sink::MemorySink;
use weir_tests::{
    HOSTILE_WASM, JS_FILTER_ROWS, PYTHON_FILTER_ROWS, SCHEMA, Workspace, orders_batch, weir,
};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// orders (one file per batch) → `keep_completed` from `plugins/swap.wasm` → `sink`.
fn pipeline(pin: Option<&str>, sink: &str) -> String {
    let pin = pin
        .map(|p| format!("sha256 = \"{p}\"\n"))
        .unwrap_or_default();
    format!(
        r#"
[query]
name = "loading"
checkpoint = "checkpoints/loading"
trigger = "available-now"

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "{SCHEMA}"
max_files_per_trigger = 1
on_malformed = "drop"

[[transform]]
name = "keep_completed"
plugin = "plugins/swap.wasm"
config = {{ column = "status", op = "eq", value = "completed" }}
{pin}
{sink}
"#
    )
}

fn workspace(files: usize) -> Result<Workspace> {
    let ws = Workspace::new(files, 200)?;
    std::fs::copy(
        ws.path().join("plugins/filter_rows.wasm"),
        ws.path().join("plugins/swap.wasm"),
    )?;
    Ok(ws)
}

#[test]
fn a_pinned_sha256_is_enforced_when_the_query_starts() -> Result<()> {
    let ws = workspace(1)?;
    let actual = sha256(weir_host::examples::FILTER_ROWS_WASM);
    let wrong = "0".repeat(64);
    let file = ws.pipeline(
        "pinned.toml",
        &pipeline(Some(&wrong), "[sink]\nkind = \"console\"\n"),
    )?;
    let out = weir(EXE, &cache(), &["run", file.to_str().unwrap_or_default()])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("plugin keep_completed"), "{stderr}");
    assert!(stderr.contains(&format!("has sha256 {actual}")), "{stderr}");
    assert!(
        stderr.contains(&format!("pins sha256 = \"{wrong}\"")),
        "{stderr}"
    );
    assert!(!ws.path().join("checkpoints/loading/offsets/0").exists());

    // The right hash, in capitals as `sha256sum` users may paste it: runs.
    let file = ws.pipeline(
        "pinned.toml",
        &pipeline(Some(&actual.to_uppercase()), "[sink]\nkind = \"console\"\n"),
    )?;
    let out = weir(EXE, &cache(), &["run", file.to_str().unwrap_or_default()])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(ws.path().join("checkpoints/loading/commits/0").exists());
    Ok(())
}

/// A native transform after the plugin that, while batch `at` runs, puts
/// `bytes` into the plugin's file (what an operator's deploy does) and
/// optionally raises the reload flag (what SIGHUP does).
struct Deploy {
    schema: SchemaRef,
    at: u64,
    path: PathBuf,
    bytes: &'static [u8],
    signal: Option<Arc<AtomicBool>>,
}

impl BatchTransform for Deploy {
    fn name(&self) -> &str {
        "deploy"
    }

    fn output_schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn process(
        &mut self,
        batch: &RecordBatch,
        info: &BatchInfo,
    ) -> Result<RecordBatch, TransformError> {
        if info.batch_id == self.at {
            std::fs::write(&self.path, self.bytes).map_err(|e| TransformError::Native {
                name: "deploy".into(),
                batch_id: info.batch_id,
                message: e.to_string(),
            })?;
            if let Some(flag) = &self.signal {
                flag.store(true, Ordering::Relaxed);
            }
        }
        Ok(batch.clone())
    }
}

fn deploy_in_batch(
    at: u64,
    path: &Path,
    bytes: &'static [u8],
    signal: Option<Arc<AtomicBool>>,
) -> weir_host::query::MakeTransform {
    let path = path.to_owned();
    Box::new(move |schema: &SchemaRef| {
        Box::new(Deploy {
            schema: Arc::clone(schema),
            at,
            path,
            bytes,
            signal,
        }) as Box<dyn BatchTransform>
    })
}

/// The rows of each batch the memory sink got, by batch id, with how many are not "completed".
fn per_batch(table: &weir_host::sink::MemoryTable) -> Result<Vec<(usize, usize)>> {
    let table = table
        .lock()
        .map_err(|_| anyhow::anyhow!("memory sink poisoned"))?;
    Ok(table
        .values()
        .map(|batches| {
            let rows = batches.iter().map(RecordBatch::num_rows).sum();
            let other = batches
                .iter()
                .flat_map(|b| {
                    let status = b.column_by_name("status").map(|c| c.as_string::<i32>());
                    status
                        .into_iter()
                        .flat_map(|s| s.iter())
                        .filter(|s| *s != Some("completed"))
                        .collect::<Vec<_>>()
                })
                .count();
            (rows, other)
        })
        .collect())
}

/// The plugin builds `offsets/<n>` records, as (name, sha256).
fn recorded_builds(checkpoint: &Path, n: u64) -> Result<Vec<(String, String)>> {
    let entry = weir_tests::offset_entry(checkpoint, n)?;
    Ok(entry["plugins"]
        .as_array()
        .map(|plugins| {
            plugins
                .iter()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap_or_default().to_owned(),
                        p["sha256"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

/// The sha256 of each plugin in each progress record, by batch.
fn progress_builds(checkpoint: &Path) -> Result<Vec<(u64, String)>> {
    let mut out = Vec::new();
    for record in weir_tests::progress(checkpoint)? {
        let batch = record["batchId"].as_u64().unwrap_or(u64::MAX);
        for p in record["plugins"].as_array().into_iter().flatten() {
            out.push((batch, p["sha256"].as_str().unwrap_or_default().to_owned()));
        }
    }
    Ok(out)
}

#[test]
fn a_new_build_of_a_running_plugin_takes_over_from_the_next_batch_and_is_recorded() -> Result<()> {
    let ws = workspace(3)?;
    let swap = ws.path().join("plugins/swap.wasm");
    let spec = weir_host::spec::parse(
        &pipeline(None, "[sink]\nkind = \"memory\"\n"),
        ws.path(),
        "swap.toml",
        &[],
    )?;
    let sink = MemorySink::new();
    let table = sink.table();
    let mut query = Query::start(
        spec,
        QueryOptions {
            cache_dir: Some(cache()),
            memory_sink: Some(sink),
            watch_plugins: true,
            // While batch 0 runs, the file gets the pass-through build.
            extra_transforms: vec![deploy_in_batch(0, &swap, HOSTILE_WASM, None)],
            ..QueryOptions::default()
        },
    )?;
    let summary = query.run()?;
    assert_eq!(summary.batches, 3);
    let batches = per_batch(&table)?;
    assert_eq!(batches.len(), 3, "{batches:?}");
    // Batch 0 ran the filter: only completed orders.
    assert!(batches[0].0 > 0, "{batches:?}");
    assert_eq!(batches[0].1, 0, "{batches:?}");
    // Batches 1 and 2 ran the new build, which keeps every row.
    for (rows, other) in &batches[1..] {
        assert!(*other > 0, "{batches:?}");
        assert!(*rows > batches[0].0, "{batches:?}");
    }

    let checkpoint = ws.path().join("checkpoints/loading");
    let (old, new) = (
        sha256(weir_host::examples::FILTER_ROWS_WASM),
        sha256(HOSTILE_WASM),
    );
    let name = "keep_completed".to_owned();
    assert_eq!(
        recorded_builds(&checkpoint, 0)?,
        vec![(name.clone(), old.clone())]
    );
    assert_eq!(
        recorded_builds(&checkpoint, 1)?,
        vec![(name.clone(), new.clone())]
    );
    assert_eq!(recorded_builds(&checkpoint, 2)?, vec![(name, new.clone())]);
    let progress = progress_builds(&checkpoint)?;
    assert_eq!(progress, vec![(0, old), (1, new.clone()), (2, new)]);
    Ok(())
}

#[test]
fn a_build_that_cannot_open_is_refused_by_name_and_the_running_build_keeps_going() -> Result<()> {
    let ws = workspace(2)?;
    let swap = ws.path().join("plugins/swap.wasm");
    let spec = weir_host::spec::parse(
        &pipeline(None, "[sink]\nkind = \"memory\"\n"),
        ws.path(),
        "refuse.toml",
        &[],
    )?;
    let sink = MemorySink::new();
    let table = sink.table();
    let mut query = Query::start(
        spec,
        QueryOptions {
            cache_dir: Some(cache()),
            memory_sink: Some(sink),
            ..QueryOptions::default()
        },
    )?;
    // normalize_status does not take filter_rows' config.
    std::fs::write(&swap, weir_host::examples::NORMALIZE_STATUS_WASM)?;
    let outcomes = query.reload_plugins(false);
    let [ReloadOutcome::Refused(e)] = &outcomes[..] else {
        anyhow::bail!("expected one refusal, got {outcomes:?}");
    };
    let message = e.to_string();
    let normalize = sha256(weir_host::examples::NORMALIZE_STATUS_WASM);
    assert!(
        message.starts_with(&format!(
            "plugin keep_completed: the new build {} (sha256 {normalize}) is refused: ",
            swap.display()
        )),
        "{message}"
    );
    assert!(message.contains("rejected its config"), "{message}");
    assert!(
        message.ends_with("still running the previous build"),
        "{message}"
    );
    // Looking again without a change reports nothing new; forcing it reports it again.
    assert!(query.reload_plugins(false).is_empty());
    assert_eq!(query.reload_plugins(true).len(), 1);

    let summary = query.run()?;
    assert_eq!(summary.batches, 2);
    let batches = per_batch(&table)?;
    assert_eq!(batches.len(), 2, "{batches:?}");
    assert!(
        batches.iter().all(|(rows, other)| *rows > 0 && *other == 0),
        "{batches:?}"
    );
    let old = sha256(weir_host::examples::FILTER_ROWS_WASM);
    let checkpoint = ws.path().join("checkpoints/loading");
    for n in 0..2 {
        assert_eq!(
            recorded_builds(&checkpoint, n)?,
            vec![("keep_completed".to_owned(), old.clone())]
        );
    }
    Ok(())
}

#[test]
fn a_pinned_plugin_refuses_other_builds_on_sighup_and_at_the_next_start() -> Result<()> {
    let ws = workspace(2)?;
    let swap = ws.path().join("plugins/swap.wasm");
    let old = sha256(weir_host::examples::FILTER_ROWS_WASM);
    let text = pipeline(Some(&old), "[sink]\nkind = \"memory\"\n");
    let spec = weir_host::spec::parse(&text, ws.path(), "pinned.toml", &[])?;
    let sink = MemorySink::new();
    let table = sink.table();
    let reload = Arc::new(AtomicBool::new(false));
    let mut query = Query::start(
        spec,
        QueryOptions {
            cache_dir: Some(cache()),
            memory_sink: Some(sink),
            reload: Arc::clone(&reload),
            // While batch 0 runs: a deploy, then what SIGHUP does.
            extra_transforms: vec![deploy_in_batch(
                0,
                &swap,
                HOSTILE_WASM,
                Some(Arc::clone(&reload)),
            )],
            ..QueryOptions::default()
        },
    )?;
    let summary = query.run()?;
    assert_eq!(summary.batches, 2);
    // The request was taken before batch 1, and the pin refused the build.
    assert!(!reload.load(Ordering::Relaxed));
    let batches = per_batch(&table)?;
    assert!(
        batches.iter().all(|(rows, other)| *rows > 0 && *other == 0),
        "{batches:?}"
    );
    let checkpoint = ws.path().join("checkpoints/loading");
    assert_eq!(
        recorded_builds(&checkpoint, 1)?,
        vec![("keep_completed".to_owned(), old.clone())]
    );
    drop(query);

    let spec = weir_host::spec::parse(&text, ws.path(), "pinned.toml", &[])?;
    let err = Query::start(
        spec,
        QueryOptions {
            cache_dir: Some(cache()),
            ..QueryOptions::default()
        },
    )
    .expect_err("the pin refuses the new file")
    .to_string();
    assert!(
        err.contains(&format!("has sha256 {}", sha256(HOSTILE_WASM))),
        "{err}"
    );
    assert!(err.contains(&format!("pins sha256 = \"{old}\"")), "{err}");
    Ok(())
}

#[test]
fn instances_of_every_language_come_from_the_pool() -> Result<()> {
    let engine = PluginEngine::new(EngineOptions {
        cache_dir: Some(cache()),
        pool: Some(PoolOptions::for_plugins(3, 256 << 20)),
        ..EngineOptions::default()
    })?;
    ensure!(engine.pooled(), "the pool could not be reserved");
    let batch = orders_batch(100)?;
    let info = BatchInfo {
        query_id: "pool".into(),
        batch_id: 0,
        attempt: 0,
        timestamp_micros: 0,
        partition: 0,
    };
    let options = PluginOptions {
        name: "keep_completed".into(),
        config_json: r#"{"column":"status","op":"not_null"}"#.into(),
        sandbox: Sandbox::default(),
        failpoint: None,
        replay_key: weir_tests::replay_key(),
    };
    let scratch = tempfile::tempdir()?;
    let rust = scratch.path().join("filter_rows.wasm");
    std::fs::write(&rust, weir_host::examples::FILTER_ROWS_WASM)?;
    let mut live = Vec::new();
    // Six instances alive at once, two per language: what three plugins
    // being replaced at the same time need.
    for path in [
        rust.as_path(),
        Path::new(PYTHON_FILTER_ROWS),
        Path::new(JS_FILTER_ROWS),
    ] {
        let loaded = engine.load("keep_completed", path)?;
        for _ in 0..2 {
            let mut t =
                WasmTransform::open(&engine, loaded.clone(), options.clone(), batch.schema())
                    .with_context(|| path.display().to_string())?;
            let kept = t.process(&batch, &info)?.num_rows();
            live.push((t, kept));
        }
    }
    let kept: Vec<usize> = live.iter().map(|(_, k)| *k).collect();
    assert!(kept.iter().all(|k| *k == kept[0] && *k > 0), "{kept:?}");

    // The pool is full: a seventh is refused with wasmtime's reason, not a crash.
    let loaded = engine.load("keep_completed", &rust)?;
    let err = WasmTransform::open(&engine, loaded.clone(), options.clone(), batch.schema())
        .expect_err("the pool holds six")
        .to_string();
    assert!(
        err.starts_with("plugin keep_completed: cannot instantiate"),
        "{err}"
    );
    assert!(err.contains("limit"), "{err}");
    // A dropped instance gives its slot back.
    drop(live.pop());
    WasmTransform::open(&engine, loaded, options, batch.schema())?;
    Ok(())
}

/// Waits until `done`, polling (a condition, not a guess at how long something takes).
fn wait_for(what: &str, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let start = std::time::Instant::now();
    while !done()? {
        ensure!(
            start.elapsed() < std::time::Duration::from_secs(90),
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

fn signal(child: &std::process::Child, sig: i32) -> Result<()> {
    let pid = i32::try_from(child.id())?;
    // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
    ensure!(
        unsafe { libc::kill(pid, sig) } == 0,
        "kill failed: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// The statuses of the rows the files sink wrote for batch `n`.
fn statuses(out: &Path, n: u64) -> Result<Vec<String>> {
    let path = out.join(format!("batch-{n:020}.json"));
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l)?;
            Ok(v["status"].as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

#[test]
fn weir_run_takes_a_new_build_on_sighup_between_batches() -> Result<()> {
    use std::io::BufRead;
    let ws = workspace(1)?;
    let swap = ws.path().join("plugins/swap.wasm");
    // No trigger: continuous, waiting for new files after the one there.
    let text = pipeline(
        None,
        "[sink]\nkind = \"files\"\npath = \"out\"\nformat = \"json\"\n",
    )
    .replace("trigger = \"available-now\"\n", "");
    let file = ws.pipeline("hup.toml", &text)?;
    let mut child = std::process::Command::new(EXE)
        .arg("run")
        .arg(&file)
        .arg("--cache-dir")
        .arg(cache())
        .env_remove("WEIR_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().context("stderr")?;
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let checkpoint = ws.path().join("checkpoints/loading");
    let result = (|| -> Result<()> {
        wait_for("batch 0", || Ok(checkpoint.join("commits/0").exists()))?;
        std::fs::write(&swap, HOSTILE_WASM)?;
        signal(&child, libc::SIGHUP)?;
        // The idle query takes the build before any new data arrives.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
        let replaced = loop {
            let wait = deadline.saturating_duration_since(std::time::Instant::now());
            let line = lines.recv_timeout(wait).context("no replacement logged")?;
            ensure!(!line.contains("is refused"), "{line}");
            if line.contains("plugin keep_completed replaced") {
                break line;
            }
        };
        assert!(replaced.contains(&sha256(HOSTILE_WASM)), "{replaced}");
        // Then a new file: batch 1, run by the new build.
        let staging = ws.path().join("staging");
        weir_host::examples::write_orders(
            &staging,
            weir_tests::OrdersSpec {
                files: 1,
                lines_per_file: 200,
                seed: 11,
                malformed_every: 0,
            },
        )?;
        std::fs::rename(
            staging.join("orders-00000.json"),
            ws.path().join("data/orders/orders-10000.json"),
        )?;
        wait_for("batch 1", || Ok(checkpoint.join("commits/1").exists()))?;
        Ok(())
    })();
    signal(&child, libc::SIGTERM)?;
    let status = child.wait()?;
    drop(lines);
    let _ = reader.join();
    result?;
    assert_eq!(status.code(), Some(0));
    let out = ws.path().join("out");
    let first = statuses(&out, 0)?;
    assert!(
        !first.is_empty() && first.iter().all(|s| s == "completed"),
        "{first:?}"
    );
    let second = statuses(&out, 1)?;
    assert_eq!(second.len(), 200);
    assert!(second.iter().any(|s| s != "completed"), "{second:?}");
    assert_eq!(
        recorded_builds(&checkpoint, 1)?,
        vec![("keep_completed".to_owned(), sha256(HOSTILE_WASM))]
    );
    Ok(())
}
