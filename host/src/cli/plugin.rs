//! `weir plugin inspect FILE`: what a component is before anyone runs it: its hash, the Weir
//! world it implements, its metadata (name, version, description, config schema) and every
//! import and export.

use std::path::Path;
use std::process::ExitCode;

use sha2::{Digest, Sha256};

use super::{complain, say};
use crate::plugin::{PluginMetadata, read_metadata};

/// What the inspection found.
#[derive(Debug, serde::Serialize)]
struct Inspection {
    file: String,
    sha256: String,
    bytes: usize,
    world: Option<&'static str>,
    metadata: Option<Metadata>,
    imports: Vec<String>,
    exports: Vec<String>,
}

#[derive(Debug, serde::Serialize)]
struct Metadata {
    name: String,
    version: String,
    description: String,
    config_schema: Option<serde_json::Value>,
}

impl From<PluginMetadata> for Metadata {
    fn from(m: PluginMetadata) -> Self {
        Self {
            name: m.name,
            version: m.version,
            description: m.description,
            config_schema: m.config_schema,
        }
    }
}

/// The Weir world a component's exports and imports make it.
fn world(imports: &[String], exports: &[String]) -> Option<&'static str> {
    let exports_ = |i: &str| {
        exports
            .iter()
            .any(|e| e.starts_with(&format!("weir:plugin/{i}@")))
    };
    let imports_ = |i: &str| {
        imports
            .iter()
            .any(|e| e.starts_with(&format!("weir:plugin/{i}@")))
    };
    if exports_("transformer") {
        Some(if imports_("keyed-state") {
            "stateful-transform"
        } else {
            "transform"
        })
    } else if exports_("writer") {
        Some(if imports_("delta-merge") {
            "merge-sink"
        } else {
            "sink"
        })
    } else if exports_("scalar") {
        Some("scalar-function")
    } else if exports_("query-events") {
        Some("listener")
    } else {
        None
    }
}

fn inspection(file: &Path) -> Result<Inspection, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read it: {e}"))?;
    let metadata = read_metadata(&bytes)?.map(Metadata::from);
    let engine = wasmtime::Engine::default();
    let component = wasmtime::component::Component::from_binary(&engine, &bytes)
        .map_err(|e| format!("not a WebAssembly component: {e:#}"))?;
    let ty = component.component_type();
    let imports: Vec<String> = ty.imports(&engine).map(|(n, _)| n.to_owned()).collect();
    let exports: Vec<String> = ty.exports(&engine).map(|(n, _)| n.to_owned()).collect();
    Ok(Inspection {
        file: file.display().to_string(),
        sha256: hex::encode(Sha256::digest(&bytes)),
        bytes: bytes.len(),
        world: world(&imports, &exports),
        metadata,
        imports,
        exports,
    })
}

pub(super) fn inspect(file: &Path, json: bool) -> ExitCode {
    let found = match inspection(file) {
        Ok(found) => found,
        Err(e) => {
            complain(&format!("{}: {e}", file.display()));
            return ExitCode::from(1);
        }
    };
    if json {
        match serde_json::to_string_pretty(&found) {
            Ok(text) => say(&text),
            Err(e) => {
                complain(&e.to_string());
                return ExitCode::from(1);
            }
        }
        return ExitCode::SUCCESS;
    }
    let mut text = format!(
        "{}\n  sha256   {}\n  size     {} bytes\n  world    {}\n",
        found.file,
        found.sha256,
        found.bytes,
        found.world.map_or(
            "none of Weir's (weir:plugin@0.1.0)".to_owned(),
            |w| format!("{w} (weir:plugin@0.1.0)")
        ),
    );
    match &found.metadata {
        Some(m) => {
            text.push_str(&format!("  name     {} {}\n", m.name, m.version));
            if !m.description.is_empty() {
                text.push_str(&format!("  about    {}\n", m.description));
            }
            if let Some(schema) = &m.config_schema {
                let pretty = serde_json::to_string_pretty(schema).unwrap_or_default();
                text.push_str(&format!(
                    "  config   {}\n",
                    pretty.replace('\n', "\n           ")
                ));
            }
        }
        None => text.push_str("  metadata none (weir_plugin_sdk::plugin_metadata! adds it)\n"),
    }
    text.push_str(&format!(
        "  imports  {}\n",
        found.imports.join("\n           ")
    ));
    text.push_str(&format!(
        "  exports  {}",
        found.exports.join("\n           ")
    ));
    say(&text);
    ExitCode::SUCCESS
}

/// What `weir plugin test` runs a plugin with.
pub(super) struct TestOptions {
    pub config: String,
    pub rows: usize,
    pub batches: usize,
    /// Writable folders to grant, `HOST=GUEST`.
    pub dirs: Vec<String>,
    pub cache_dir: Option<std::path::PathBuf>,
}

/// `weir plugin test FILE`: runs a transform or a sink in the real host, sandboxed as a
/// pipeline would run it (default limits, fuel metered), on batches of the sample orders, and
/// prints what came out and what it cost.
pub(super) fn test(file: &Path, options: TestOptions) -> ExitCode {
    match run_test(file, options) {
        Ok(report) => {
            say(&report);
            ExitCode::SUCCESS
        }
        Err(e) => {
            complain(&format!("{}: {e}", file.display()));
            ExitCode::from(1)
        }
    }
}

/// A scratch folder removed however the test ends (an error returns early).
struct ScratchDir(std::path::PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Fuel each call may burn in a test: enough for any honest batch of the sample size.
const TEST_FUEL: u64 = 50_000_000_000;

fn run_test(file: &Path, options: TestOptions) -> Result<String, String> {
    use crate::plugin::{
        BatchInfo, EngineOptions, PluginEngine, PluginOptions, ReplayKey, Sandbox, WasmSink,
        WasmTransform,
    };
    let found = inspection(file)?;
    let name = file
        .file_stem()
        .map_or_else(|| "plugin".to_owned(), |s| s.to_string_lossy().into_owned());
    let batches = sample_batches(options.rows, options.batches)?;
    let schema = batches[0].schema();
    let engine = PluginEngine::new(EngineOptions {
        cache_dir: options.cache_dir,
        fuel: true,
        pool: None,
    })
    .map_err(|e| e.to_string())?;
    let loaded = engine.load(&name, file).map_err(|e| e.to_string())?;
    let mut dirs = Vec::new();
    for grant in &options.dirs {
        let (host, guest) = grant
            .split_once('=')
            .ok_or_else(|| format!("--dir {grant}: write HOST=GUEST, e.g. out=/out"))?;
        let host = std::path::absolute(host).map_err(|e| format!("--dir {grant}: {e}"))?;
        std::fs::create_dir_all(&host).map_err(|e| format!("--dir {grant}: {e}"))?;
        dirs.push(crate::spec::DirGrant {
            host,
            guest: guest.to_owned(),
            writable: true,
        });
    }
    let plugin_options = PluginOptions {
        name: name.clone(),
        config_json: options.config,
        sandbox: Sandbox {
            fuel: Some(TEST_FUEL),
            dirs,
            ..Sandbox::default()
        },
        failpoint: None,
        replay_key: ReplayKey::new(&crate::checkpoint::QuerySecret::from_bytes([0; 32]), 0),
    };
    let info = |batch_id: u64| BatchInfo {
        query_id: "weir-plugin-test".into(),
        batch_id,
        attempt: 0,
        timestamp_micros: 1_709_251_200_000_000,
        partition: 0,
    };
    let mut text = format!(
        "{} ({}), {} batch(es) of {} sample orders\n",
        found.file,
        found.world.unwrap_or("not a Weir world"),
        batches.len(),
        options.rows
    );
    // A stateful transform's keyed state lives in a throw-away store, committed batch by
    // batch as a query commits it, so that batch n sees what batch n-1 put.
    let scratch = ScratchDir(
        std::env::temp_dir().join(format!("weir-plugin-test-state-{}", std::process::id())),
    );
    let usage = match found.world {
        Some(world @ ("transform" | "stateful-transform")) => {
            let mut t = WasmTransform::open(&engine, loaded, plugin_options, schema)
                .map_err(|e| e.to_string())?;
            if world == "stateful-transform" {
                let state = crate::operator::wasm_state::KeyedState::open(
                    &crate::operator::wasm_state::KeyedStateConfig {
                        plugin: name.clone(),
                        num_partitions: 1,
                        state_dir: scratch.0.clone(),
                        state: crate::state::StateOptions {
                            kind: crate::state::StoreKind::Memory,
                            ..crate::state::StateOptions::default()
                        },
                    },
                )
                .map_err(|e| e.to_string())?;
                t.attach_state(state);
            }
            for (n, batch) in batches.iter().enumerate() {
                let batch_id = n as u64;
                if let Some(state) = t.keyed_state_mut() {
                    state
                        .load(batch_id.checked_sub(1), 0)
                        .map_err(|e| e.to_string())?;
                }
                let out = t
                    .process(batch, &info(batch_id))
                    .map_err(|e| e.to_string())?;
                text.push_str(&format!(
                    "batch {n}: {} rows in, {} rows out",
                    batch.num_rows(),
                    out.num_rows()
                ));
                if let Some(state) = t.keyed_state_mut() {
                    let m = state.commit(batch_id).map_err(|e| e.to_string())?;
                    text.push_str(&format!(
                        ", state: {} keys ({} put, {} removed)",
                        m.num_rows_total, m.num_rows_updated, m.num_rows_removed
                    ));
                }
                text.push('\n');
                if n == 0 {
                    let shown = out.slice(0, out.num_rows().min(10));
                    let table = arrow_cast::pretty::pretty_format_batches(&[shown])
                        .map_err(|e| e.to_string())?;
                    text.push_str(&format!("{table}\n"));
                }
            }
            t.usage().clone()
        }
        Some("sink") => {
            let mut s = WasmSink::open(&engine, loaded, plugin_options, &schema)
                .map_err(|e| e.to_string())?;
            for (n, batch) in batches.iter().enumerate() {
                s.write_batch(batch, &info(n as u64))
                    .map_err(|e| e.to_string())?;
                text.push_str(&format!("batch {n}: {} rows written\n", batch.num_rows()));
            }
            s.usage().clone()
        }
        Some("listener") => {
            let mut l = crate::plugin::WasmListener::open(&engine, loaded, plugin_options)
                .map_err(|e| e.to_string())?;
            for event in sample_events(&batches) {
                l.notify(&event).map_err(|e| e.to_string())?;
                text.push_str(&format!("{}: delivered\n", event.kind()));
            }
            l.usage().clone()
        }
        Some(other) => {
            return Err(format!(
                "a {other} plugin: `weir plugin test` runs transforms (stateful too), sinks and listeners; run it in a pipeline"
            ));
        }
        None => return Err("not a plugin of any Weir world".into()),
    };
    let per_call = if usage.calls == 0 {
        0.0
    } else {
        usage.call_time.as_secs_f64() * 1000.0 / usage.calls as f64
    };
    text.push_str(&format!(
        "cost: {} call(s), {:.2} ms in all ({per_call:.3} ms a call), {} fuel, {} instantiation(s), memory peak {} KiB of {} MiB",
        usage.calls,
        usage.call_time.as_secs_f64() * 1000.0,
        usage.fuel_consumed,
        usage.instantiations,
        usage.memory_peak_bytes / 1024,
        usage.memory_limit_bytes >> 20
    ));
    Ok(text)
}

/// What a listener hears of a query that runs the sample batches: started, one progress
/// record per batch (the fields Spark's `StreamingQueryProgress` always has), idle, terminated.
fn sample_events(batches: &[arrow_array::RecordBatch]) -> Vec<crate::plugin::QueryEvent> {
    use crate::plugin::QueryEvent;
    let id = "00000000-0000-4000-8000-000000000001".to_owned();
    let run_id = "00000000-0000-4000-8000-000000000002".to_owned();
    let mut events = vec![QueryEvent::Started {
        id: id.clone(),
        run_id: run_id.clone(),
        name: "weir-plugin-test".into(),
    }];
    for (n, batch) in batches.iter().enumerate() {
        let json = serde_json::json!({
            "id": id,
            "runId": run_id,
            "name": "weir-plugin-test",
            "timestamp": "2024-03-01T00:00:00.000Z",
            "batchId": n,
            "numInputRows": batch.num_rows(),
            "inputRowsPerSecond": 0.0,
            "processedRowsPerSecond": 0.0,
            "durationMs": {"triggerExecution": 0},
            "stateOperators": [],
            "sources": [],
            "sink": {"description": "weir plugin test", "numOutputRows": batch.num_rows()},
        });
        events.push(QueryEvent::Progress {
            batch_id: n as u64,
            json: json.to_string(),
        });
    }
    events.push(QueryEvent::Idle {
        id: id.clone(),
        run_id: run_id.clone(),
        timestamp: "2024-03-01T00:00:10.000Z".into(),
    });
    events.push(QueryEvent::Terminated {
        id,
        run_id,
        error: None,
    });
    events
}

/// `count` batches of `rows` sample orders (1 line in 100 malformed, left out).
fn sample_batches(rows: usize, count: usize) -> Result<Vec<arrow_array::RecordBatch>, String> {
    let dir = std::env::temp_dir().join(format!("weir-plugin-test-{}", std::process::id()));
    let written = crate::examples::write_orders(
        &dir,
        crate::examples::OrdersSpec {
            files: count.max(1),
            lines_per_file: rows.max(1),
            seed: 7,
            malformed_every: 0,
        },
    );
    let read = written.map_err(|e| e.to_string()).and_then(|_| {
        let schema = std::sync::Arc::new(
            crate::spec::parse_schema(crate::examples::ORDERS_SCHEMA).map_err(|e| e.to_string())?,
        );
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| e.to_string())?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        files.sort();
        let mut out = Vec::new();
        for f in files {
            let file = std::fs::File::open(&f).map_err(|e| e.to_string())?;
            let reader = arrow_json::ReaderBuilder::new(std::sync::Arc::clone(&schema))
                .with_batch_size(rows.max(1))
                .build(std::io::BufReader::new(file))
                .map_err(|e| e.to_string())?;
            for batch in reader {
                out.push(batch.map_err(|e| e.to_string())?);
            }
        }
        Ok(out)
    });
    let _ = std::fs::remove_dir_all(&dir);
    read
}
