//! Misbehaving plugins are contained: each fails its batch with an error
//! that names the plugin and the limit or rule it broke, the host goes on,
//! and a poisoned instance is replaced by a fresh one.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use arrow_array::RecordBatch;
use weir_host::plugin::{
    BatchInfo, EngineOptions, PluginEngine, PluginError, PluginOptions, Sandbox, WasmTransform,
};
use weir_tests::{HOSTILE_WASM, SCHEMA, Workspace, log_ids, orders_batch, run_ok, weir};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn info(batch_id: u64) -> BatchInfo {
    BatchInfo {
        query_id: "sandbox-test".into(),
        batch_id,
        attempt: 0,
        timestamp_micros: 1_700_000_000_000_000,
        partition: 0,
    }
}

fn hostile(config: &str, sandbox: Sandbox, batch: &RecordBatch) -> Result<WasmTransform> {
    let engine = PluginEngine::new(EngineOptions {
        cache_dir: Some(cache()),
        fuel: sandbox.fuel.is_some(),
        ..EngineOptions::default()
    })?;
    let loaded = engine.load_bytes(
        "hostile",
        std::path::Path::new("hostile.wasm"),
        HOSTILE_WASM,
    )?;
    Ok(WasmTransform::open(
        &engine,
        loaded,
        PluginOptions {
            name: "hostile".into(),
            config_json: config.into(),
            sandbox,
            failpoint: None,
        },
        batch.schema(),
    )?)
}

#[test]
fn a_trap_fails_its_batch_and_the_instance_is_replaced() -> Result<()> {
    let batch = orders_batch(100)?;
    let mut t = hostile(r#"{"mode":"trap","batch":1}"#, Sandbox::default(), &batch)?;
    assert_eq!(t.process(&batch, &info(0))?.num_rows(), 100);
    let err = t.process(&batch, &info(1)).expect_err("batch 1 traps");
    assert!(matches!(err, PluginError::Trap { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("plugin hostile trapped in batch 1"), "{text}");
    assert!(
        text.contains("panicking on purpose"),
        "the guest's panic message is kept: {text}"
    );
    // The poisoned instance is gone; the next batch runs on a fresh one.
    assert_eq!(t.process(&batch, &info(2))?.num_rows(), 100);
    assert_eq!(t.usage().instantiations, 2);
    Ok(())
}

#[test]
fn an_endless_loop_hits_the_deadline() -> Result<()> {
    let batch = orders_batch(10)?;
    let sandbox = Sandbox {
        timeout: Duration::from_millis(200),
        ..Sandbox::default()
    };
    let mut t = hostile(r#"{"mode":"loop","batch":0}"#, sandbox, &batch)?;
    let started = Instant::now();
    let err = t.process(&batch, &info(0)).expect_err("loops forever");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(err, PluginError::Timeout { limit_ms: 200, .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("plugin hostile exceeded its time limit of 200 ms"),
        "{err}"
    );
    assert_eq!(t.process(&batch, &info(1))?.num_rows(), 10);
    Ok(())
}

#[test]
fn fuel_runs_out_in_an_endless_loop() -> Result<()> {
    let batch = orders_batch(10)?;
    let sandbox = Sandbox {
        fuel: Some(50_000_000),
        ..Sandbox::default()
    };
    let mut t = hostile(r#"{"mode":"loop","batch":0}"#, sandbox, &batch)?;
    let err = t.process(&batch, &info(0)).expect_err("loops forever");
    assert!(
        matches!(
            err,
            PluginError::OutOfFuel {
                fuel: 50_000_000,
                ..
            }
        ),
        "{err}"
    );
    Ok(())
}

#[test]
fn unbounded_allocation_hits_the_memory_limit() -> Result<()> {
    let batch = orders_batch(10)?;
    let sandbox = Sandbox {
        memory_bytes: 32 << 20,
        ..Sandbox::default()
    };
    let mut t = hostile(r#"{"mode":"alloc","batch":0}"#, sandbox, &batch)?;
    let err = t
        .process(&batch, &info(0))
        .expect_err("allocates without bound");
    assert!(
        matches!(err, PluginError::MemoryExceeded { limit, .. } if limit == 32 << 20),
        "{err}"
    );
    assert_eq!(t.process(&batch, &info(1))?.num_rows(), 10);
    Ok(())
}

#[test]
fn files_and_the_network_are_not_granted() -> Result<()> {
    let batch = orders_batch(10)?;
    let mut t = hostile(
        r#"{"mode":"read-file","file":"/etc/passwd"}"#,
        Sandbox::default(),
        &batch,
    )?;
    let err = t.process(&batch, &info(0)).expect_err("no filesystem");
    let text = err.to_string();
    assert!(text.contains("plugin hostile failed batch 0"), "{text}");
    assert!(text.contains("cannot read /etc/passwd"), "{text}");

    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let address = listener.local_addr()?;
    let config = format!(r#"{{"mode":"connect","address":"{address}"}}"#);
    let mut t = hostile(&config, Sandbox::default(), &batch)?;
    let err = t.process(&batch, &info(0)).expect_err("no network");
    assert!(
        err.to_string()
            .contains(&format!("cannot connect to {address}")),
        "{err}"
    );
    assert!(listener.accept().is_err(), "nothing may have connected");
    Ok(())
}

#[test]
fn a_malformed_result_and_an_error_value_are_reported() -> Result<()> {
    let batch = orders_batch(10)?;
    let mut t = hostile(r#"{"mode":"bad-output"}"#, Sandbox::default(), &batch)?;
    let err = t.process(&batch, &info(4)).expect_err("wrong length");
    assert!(
        matches!(err, PluginError::MalformedOutput { batch_id: 4, .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("has 9 values, the batch has 10 rows"),
        "{err}"
    );

    let mut t = hostile(r#"{"mode":"error"}"#, Sandbox::default(), &batch)?;
    let err = t.process(&batch, &info(5)).expect_err("refuses");
    assert_eq!(
        err.to_string(),
        "plugin hostile failed batch 5 (fatal) at row 3: hostile plugin: refusing this batch"
    );
    assert!(!err.is_retryable());
    Ok(())
}

#[test]
fn a_bad_config_is_refused_at_start() -> Result<()> {
    let batch = orders_batch(10)?;
    let err = hostile(r#"{"mode":"sulk"}"#, Sandbox::default(), &batch).expect_err("unknown mode");
    assert!(
        err.to_string()
            .contains("plugin hostile rejected its config"),
        "{err}"
    );
    assert!(err.to_string().contains("sulk"), "{err}");
    let err = hostile(r#"{"mood":"trap"}"#, Sandbox::default(), &batch).expect_err("unknown key");
    assert!(err.to_string().contains("mood"), "{err}");
    Ok(())
}

fn pipeline(mode: &str) -> String {
    format!(
        r#"
[query]
name = "hostile"
checkpoint = "checkpoints/hostile"
trigger = "available-now"
max_batch_retries = 1

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "{SCHEMA}"
max_files_per_trigger = 1
on_malformed = "drop"

[[transform]]
name = "hostile"
plugin = "plugins/hostile.wasm"
config = {{ mode = "{mode}", batch = 1 }}

[sink]
kind = "files"
path = "out"
format = "json"
"#
    )
}

#[test]
fn a_failed_batch_is_not_committed_and_reruns_once_the_plugin_is_fixed() -> Result<()> {
    let ws = Workspace::new(3, 100)?;
    for mode in ["trap", "retryable"] {
        let file = ws.pipeline("hostile.toml", &pipeline(mode))?;
        let out = weir(EXE, &cache(), &["run", file.to_str().unwrap_or_default()])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{mode}: {stderr}");
        let expected = if mode == "trap" {
            "plugin hostile trapped in batch 1"
        } else {
            "plugin hostile failed batch 1 (retryable)"
        };
        assert!(stderr.contains(expected), "{mode}: {stderr}");
        if mode == "retryable" {
            assert!(
                stderr.contains("retrying"),
                "a retryable error is retried: {stderr}"
            );
        }
        // The guest's own panic message is quoted in the error; the host's
        // threads never panic.
        assert!(
            !stderr.contains("thread 'main'"),
            "the host must not panic: {stderr}"
        );
        if mode == "trap" {
            assert!(
                stderr.contains("panicking on purpose in batch 1"),
                "{stderr}"
            );
        }
        let checkpoint = ws.path().join("checkpoints/hostile");
        assert_eq!(log_ids(&checkpoint.join("commits"))?, vec![0]);
        assert_eq!(log_ids(&checkpoint.join("offsets"))?, vec![0, 1]);
    }
    let file = ws.pipeline("hostile.toml", &pipeline("ok"))?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(
        log_ids(&ws.path().join("checkpoints/hostile/commits"))?,
        vec![0, 1, 2]
    );
    let mut rows = 0;
    for e in std::fs::read_dir(ws.path().join("out"))? {
        rows += std::fs::read_to_string(e?.path())?.lines().count() as u64;
    }
    assert_eq!(rows, ws.orders.lines - ws.orders.malformed, "no row lost");
    Ok(())
}
