//! `weir-bench plugin-state`: what keyed state costs a plugin in each language. The same
//! `running_total` (Rust, Python, JavaScript) runs over the decoded orders with a state store
//! of its own, as `weir run` drives it: load version n−1, one `process` call (one `get-many`
//! of the batch's distinct customers, then one `put` each), commit version n. Keyed-state
//! operations per second are those gets and puts over the thread's CPU time of the whole loop,
//! so the figure is what a plugin author can expect of the language, host side included.
//!
//! The store is the in-memory one, so that the figure is the boundary's and the language's,
//! not the disk's (RocksDB adds the same cost to every language).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use arrow_array::RecordBatch;
use weir_host::operator::wasm_state::{KeyedState, KeyedStateConfig};
use weir_host::plugin::{
    BatchInfo, EngineOptions, PluginEngine, PluginOptions, Sandbox, WasmTransform,
};
use weir_host::state::{StateOptions, StoreKind};

use crate::loading::{decode, thread_cpu};
use crate::{flag, median};

const CONFIG: &str = r#"{"key":"customer_id","value":"amount"}"#;

/// The running_total of each language: (language, component path).
fn plugins(work: &std::path::Path) -> Result<Vec<(&'static str, PathBuf)>> {
    let rust = work.join("running_total.wasm");
    std::fs::write(&rust, weir_host::examples::RUNNING_TOTAL_WASM)?;
    Ok(vec![
        ("Rust", rust),
        (
            "Python",
            PathBuf::from(env!("WEIR_PLUGIN_PYTHON_RUNNING_TOTAL")),
        ),
        (
            "JavaScript",
            PathBuf::from(env!("WEIR_PLUGIN_JS_RUNNING_TOTAL")),
        ),
    ])
}

/// One run over every batch: (state operations, thread CPU seconds, wall seconds, keys at the
/// end, seconds inside the plugin's calls).
fn run_once(
    engine: &PluginEngine,
    path: &std::path::Path,
    batches: &[RecordBatch],
    state_dir: PathBuf,
) -> Result<(u64, f64, f64, u64, f64)> {
    let loaded = engine.load("running_total", path)?;
    let mut t = WasmTransform::open(
        engine,
        loaded,
        PluginOptions {
            name: "running_total".into(),
            config_json: CONFIG.into(),
            sandbox: Sandbox::default(),
            failpoint: None,
            replay_key: weir_host::plugin::ReplayKey::new(
                &weir_host::checkpoint::QuerySecret::from_bytes([7; 32]),
                0,
            ),
        },
        batches.first().context("no batches")?.schema(),
    )?;
    t.attach_state(KeyedState::open(&KeyedStateConfig {
        plugin: "running_total".into(),
        num_partitions: 1,
        state_dir,
        state: StateOptions {
            kind: StoreKind::Memory,
            ..StateOptions::default()
        },
    })?);
    let mut ops = 0;
    let mut keys = 0;
    let (cpu0, wall0) = (thread_cpu(), Instant::now());
    for (n, batch) in batches.iter().enumerate() {
        let batch_id = n as u64;
        let state = t.keyed_state_mut().context("state attached")?;
        state.load(batch_id.checked_sub(1), 0)?;
        let info = BatchInfo {
            query_id: "bench".into(),
            batch_id,
            attempt: 0,
            timestamp_micros: 0,
            partition: 0,
        };
        t.process(batch, &info)?;
        let m = t
            .keyed_state_mut()
            .context("state attached")?
            .commit(batch_id)?;
        // One get (inside get-many) and one put per distinct key of the batch.
        ops += 2 * m.num_rows_updated;
        keys = m.num_rows_total;
    }
    let cpu = (thread_cpu() - cpu0).as_secs_f64();
    let in_calls = t.usage().call_time.as_secs_f64();
    Ok((ops, cpu, wall0.elapsed().as_secs_f64(), keys, in_calls))
}

pub fn plugin_state(args: &[String]) -> Result<()> {
    let runs: usize = flag(args, "--runs").map_or(Ok(3), |r| r.parse())?;
    let input = PathBuf::from(flag(args, "--input").context("--input DIR (the 1M orders)")?);
    let work = flag(args, "--work").map_or_else(
        || std::env::temp_dir().join(format!("weir-plugin-state-{}", std::process::id())),
        PathBuf::from,
    );
    std::fs::create_dir_all(&work)?;
    let batches = decode(&input)?;
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    eprintln!("decoded {rows} rows in {} batches", batches.len());
    let engine = PluginEngine::new(EngineOptions {
        cache_dir: Some(work.join("cache")),
        fuel: false,
        pool: None,
    })?;
    println!(
        "| running_total over {rows} orders, medians of {runs} | keyed-state ops | CPU s (all) | of which in the plugin's calls | ops per CPU-second | rows per CPU-second | keys at the end |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (language, path) in plugins(&work)? {
        let mut cpus = Vec::new();
        let mut calls = Vec::new();
        let mut result = (0, 0.0, 0.0, 0, 0.0);
        for run in 0..runs {
            let state_dir = work.join(format!("state-{language}-{run}"));
            result = run_once(&engine, &path, &batches, state_dir.clone())
                .with_context(|| language.to_owned())?;
            let _ = std::fs::remove_dir_all(&state_dir);
            eprintln!(
                "{language} run {run}: {} ops, {:.3} s CPU, {:.3} s wall",
                result.0, result.1, result.2
            );
            cpus.push(result.1);
            calls.push(result.4);
        }
        let cpu = median(cpus);
        println!(
            "| {language} | {} | {cpu:.3} | {:.3} | {:.0} | {:.0} | {} |",
            result.0,
            median(calls),
            result.0 as f64 / cpu,
            rows as f64 / cpu,
            result.3
        );
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}
