//! Misbehaving plugins are contained: each fails its batch with an error
//! that names the plugin and the limit or rule it broke, the host goes on,
//! and a poisoned instance is replaced by a fresh one. Grants (environment
//! variables, HTTP hosts) open exactly what they name, and a plugin's clock
//! and random numbers make a replayed batch byte-identical.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use arrow_array::RecordBatch;
use weir_host::plugin::{
    BatchInfo, EngineOptions, HttpGrant, PluginEngine, PluginError, PluginOptions, Sandbox,
    WasmTransform,
};
use weir_tests::{
    HOSTILE_WASM, SCHEMA, Workspace, commit_ids, offset_ids, orders_batch, run_ok, weir,
};

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
            replay_key: weir_tests::replay_key(),
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

    let mut t = hostile(r#"{"mode":"bad-type"}"#, Sandbox::default(), &batch)?;
    let err = t.process(&batch, &info(6)).expect_err("wrong type");
    assert!(
        matches!(err, PluginError::MalformedOutput { batch_id: 6, .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.starts_with(
            "plugin hostile returned a malformed batch in batch 6: its columns are [order_id Utf8,"
        ),
        "{text}"
    );
    assert!(text.contains("but it declared [order_id Int64,"), "{text}");

    let mut t = hostile(r#"{"mode":"error"}"#, Sandbox::default(), &batch)?;
    let err = t.process(&batch, &info(5)).expect_err("refuses");
    assert_eq!(
        err.to_string(),
        "plugin hostile failed batch 5 (fatal) at row 3: hostile plugin: refusing this batch"
    );
    assert!(!err.is_retryable());
    Ok(())
}

/// Each way a plugin's result can lie about itself (a `hostile` mode) and
/// what the host says about it.
const LYING_OUTPUT: [(&str, &str); 6] = [
    (
        "ipc-huge-body",
        "body length 4611686018427387904 runs past the end of the stream",
    ),
    ("ipc-negative-body", "body length -8 is negative"),
    (
        "ipc-unknown-type",
        "column 0 (\"order_id\"): unknown type 99 is not a type plugins may return",
    ),
    (
        "ipc-bad-bit-width",
        "column 0 (\"order_id\"): type Int of bit width 7 is not a type plugins may return",
    ),
    (
        "ipc-decimal-scale-90",
        "column 3 (\"amount\"): decimal128(12, 90) is not a valid decimal: the scale must be 0 to the precision (12)",
    ),
    (
        "decimal-scale-90",
        "column \"amount\": decimal128(38, 90) is not a valid decimal: the scale must be 0 to the precision (38)",
    ),
];

#[test]
fn output_that_lies_about_itself_fails_its_batch_and_the_next_batch_runs() -> Result<()> {
    let batch = orders_batch(20)?;
    for (mode, problem) in LYING_OUTPUT {
        let config = format!(r#"{{"mode":"{mode}","batch":1}}"#);
        let mut t = hostile(&config, Sandbox::default(), &batch)?;
        assert_eq!(
            t.process(&batch, &info(0))?,
            batch,
            "{mode}: batch 0 passes"
        );
        let err = t.process(&batch, &info(1)).expect_err(mode);
        assert!(
            matches!(err, PluginError::MalformedOutput { batch_id: 1, .. }),
            "{mode}: {err}"
        );
        let text = err.to_string();
        assert!(
            text.starts_with("plugin hostile returned a malformed batch in batch 1: "),
            "{mode}: {text}"
        );
        assert!(
            text.contains(problem),
            "{mode}: {text} should say {problem}"
        );
        // The host is still here, and so is the instance: the next batch runs on it.
        assert_eq!(
            t.process(&batch, &info(2))?,
            batch,
            "{mode}: batch 2 passes"
        );
        assert_eq!(t.usage().instantiations, 1, "{mode}");
    }
    Ok(())
}

#[test]
fn a_declared_decimal_outside_precision_and_scale_is_refused_at_start() -> Result<()> {
    let batch = orders_batch(10)?;
    let err = hostile(
        r#"{"mode":"declare-decimal-scale-90"}"#,
        Sandbox::default(),
        &batch,
    )
    .expect_err("an invalid declared decimal");
    let err = err.downcast::<PluginError>()?;
    assert!(matches!(err, PluginError::MalformedSchema { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "plugin hostile declared an output schema the host cannot use: column \"tiny\": \
         decimal128(38, 90) is not a valid decimal: the scale must be 0 to the precision (38)"
    );
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
        assert_eq!(commit_ids(&checkpoint)?, vec![0]);
        assert_eq!(offset_ids(&checkpoint)?, vec![0, 1]);
    }
    let file = ws.pipeline("hostile.toml", &pipeline("ok"))?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(
        commit_ids(&ws.path().join("checkpoints/hostile"))?,
        vec![0, 1, 2]
    );
    let mut rows = 0;
    for e in std::fs::read_dir(ws.path().join("out"))? {
        rows += std::fs::read_to_string(e?.path())?.lines().count() as u64;
    }
    assert_eq!(rows, ws.orders.lines - ws.orders.malformed, "no row lost");
    Ok(())
}

#[test]
fn a_batch_with_lying_output_is_not_committed_and_reruns_once_the_plugin_is_fixed() -> Result<()> {
    let ws = Workspace::new(3, 100)?;
    let checkpoint = ws.path().join("checkpoints/hostile");
    for (mode, problem) in LYING_OUTPUT {
        let file = ws.pipeline("hostile.toml", &pipeline(mode))?;
        let out = weir(EXE, &cache(), &["run", file.to_str().unwrap_or_default()])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        // A clean failure of the query (exit 1), not a crash or an abort.
        assert_eq!(out.status.code(), Some(1), "{mode}: {stderr}");
        assert!(
            stderr.contains("plugin hostile returned a malformed batch in batch 1"),
            "{mode}: {stderr}"
        );
        assert!(stderr.contains(problem), "{mode}: {stderr}");
        assert!(
            !stderr.contains("panicked"),
            "{mode}: the host must not panic: {stderr}"
        );
        assert_eq!(commit_ids(&checkpoint)?, vec![0], "{mode}");
        assert_eq!(offset_ids(&checkpoint)?, vec![0, 1], "{mode}");
    }
    let file = ws.pipeline("hostile.toml", &pipeline("ok"))?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(commit_ids(&checkpoint)?, vec![0, 1, 2]);
    let mut rows = 0;
    for e in std::fs::read_dir(ws.path().join("out"))? {
        rows += std::fs::read_to_string(e?.path())?.lines().count() as u64;
    }
    assert_eq!(rows, ws.orders.lines - ws.orders.malformed, "no row lost");
    Ok(())
}

/// Arrow IPC stream bytes of `batch`: what "byte-identical" is measured on.
fn ipc_bytes(batch: &RecordBatch) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(&mut bytes, &batch.schema())?;
    writer.write(batch)?;
    writer.finish()?;
    drop(writer);
    Ok(bytes)
}

fn int64_column(batch: &RecordBatch, name: &str) -> Result<Vec<i64>> {
    let column = batch
        .column_by_name(name)
        .with_context(|| format!("no column {name}"))?
        .as_any()
        .downcast_ref::<arrow_array::Int64Array>()
        .with_context(|| format!("{name} is not Int64"))?;
    Ok(column.values().to_vec())
}

fn utf8_value(batch: &RecordBatch, name: &str) -> Result<String> {
    let column = batch
        .column_by_name(name)
        .with_context(|| format!("no column {name}"))?
        .as_any()
        .downcast_ref::<arrow_array::StringArray>()
        .with_context(|| format!("{name} is not Utf8"))?;
    Ok(column.value(0).to_owned())
}

#[test]
fn a_replayed_batch_reads_the_same_clock_and_random_numbers() -> Result<()> {
    let batch = orders_batch(50)?;
    let config = r#"{"mode":"replay"}"#;
    let first = hostile(config, Sandbox::default(), &batch)?.process(&batch, &info(3))?;
    // A replay after a restart: a new engine and instance, a higher attempt.
    let mut again = hostile(config, Sandbox::default(), &batch)?;
    let replay = again.process(
        &batch,
        &BatchInfo {
            attempt: 1,
            ..info(3)
        },
    )?;
    assert_eq!(ipc_bytes(&first)?, ipc_bytes(&replay)?, "byte-identical");

    let ts = info(3).timestamp_micros;
    assert_eq!(int64_column(&first, "wall_micros")?, vec![ts; 50]);
    assert_eq!(
        int64_column(&first, "monotonic_nanos")?,
        vec![ts * 1000; 50]
    );
    for name in ["random", "wasi_random", "wasi_insecure"] {
        let values = int64_column(&first, name)?;
        let distinct: std::collections::BTreeSet<i64> = values.iter().copied().collect();
        assert_eq!(distinct.len(), 50, "{name} draws fresh numbers per row");
    }

    // Another batch on the same instance: other numbers, its own clock.
    let other = again.process(
        &batch,
        &BatchInfo {
            timestamp_micros: ts + 5_000_000,
            ..info(4)
        },
    )?;
    assert_eq!(int64_column(&other, "wall_micros")?[0], ts + 5_000_000);
    for name in ["random", "wasi_random", "wasi_insecure"] {
        assert_ne!(
            int64_column(&first, name)?,
            int64_column(&other, name)?,
            "{name} differs between batches"
        );
    }
    // And batch 3 once more on that instance: the same bytes as the first run.
    let third = again.process(&batch, &info(3))?;
    assert_eq!(ipc_bytes(&first)?, ipc_bytes(&third)?);
    Ok(())
}

#[test]
fn only_granted_environment_variables_are_visible() -> Result<()> {
    let batch = orders_batch(5)?;
    let mut t = hostile(r#"{"mode":"env"}"#, Sandbox::default(), &batch)?;
    let out = t.process(&batch, &info(0))?;
    assert_eq!(utf8_value(&out, "env")?, "", "nothing is inherited");

    let sandbox = Sandbox {
        env: vec![
            ("WEIR_REGION".into(), "eu-west".into()),
            ("WEIR_MODE".into(), "strict".into()),
        ],
        ..Sandbox::default()
    };
    let mut t = hostile(r#"{"mode":"env"}"#, sandbox, &batch)?;
    let out = t.process(&batch, &info(0))?;
    assert_eq!(
        utf8_value(&out, "env")?,
        "WEIR_MODE=strict;WEIR_REGION=eu-west"
    );
    Ok(())
}

/// A one-response-per-connection HTTP server on 127.0.0.1:0; returns its
/// address and the count of connections it accepted.
fn http_server() -> Result<(std::net::SocketAddr, Arc<AtomicUsize>)> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            count.fetch_add(1, Ordering::SeqCst);
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\nconnection: close\r\n\r\nhello weir!",
            );
        }
    });
    Ok((address, accepted))
}

#[test]
fn http_reaches_only_allow_listed_hosts() -> Result<()> {
    let batch = orders_batch(5)?;
    let (address, accepted) = http_server()?;
    let config = format!(r#"{{"mode":"http","address":"{address}"}}"#);

    let granted = Sandbox {
        http: vec![HttpGrant::parse(&address.to_string()).map_err(anyhow::Error::msg)?],
        ..Sandbox::default()
    };
    let mut t = hostile(&config, granted, &batch)?;
    let out = t.process(&batch, &info(0))?;
    assert_eq!(utf8_value(&out, "http")?, "200 hello weir!");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    let mut t = hostile(&config, Sandbox::default(), &batch)?;
    let err = t.process(&batch, &info(1)).expect_err("no grant");
    assert!(
        matches!(err, PluginError::Denied { batch_id: 1, .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "plugin hostile broke its sandbox in batch 1: HTTP to {address} refused: the plugin has no `capabilities.http` grant"
        )
    );

    let elsewhere = Sandbox {
        http: vec![HttpGrant::parse("127.0.0.1:1").map_err(anyhow::Error::msg)?],
        ..Sandbox::default()
    };
    let mut t = hostile(&config, elsewhere, &batch)?;
    let err = t.process(&batch, &info(2)).expect_err("not on the list");
    assert!(
        err.to_string().contains(&format!(
            "HTTP to {address} refused: not in its `capabilities.http` allow-list [127.0.0.1:1]"
        )),
        "{err}"
    );
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "a refused request never connects"
    );
    Ok(())
}

/// A granted name is checked against the address it resolves to: `localhost` is loopback, so
/// its grant does not reach 127.0.0.1 (only a grant of the address does), and a policy without
/// private networks refuses even that; nothing connects.
#[test]
fn http_grants_are_checked_against_the_resolved_address() -> Result<()> {
    let batch = orders_batch(3)?;
    let (address, accepted) = http_server()?;
    let port = address.port();
    let by_name = format!(r#"{{"mode":"http","address":"localhost:{port}"}}"#);
    let named = Sandbox {
        http: vec![HttpGrant::parse(&format!("localhost:{port}")).map_err(anyhow::Error::msg)?],
        ..Sandbox::default()
    };
    let mut t = hostile(&by_name, named, &batch)?;
    let err = t
        .process(&batch, &info(0))
        .expect_err("localhost is loopback");
    assert!(
        matches!(err, PluginError::Denied { batch_id: 0, .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains(&format!(
            "HTTP to localhost:{port} refused: localhost resolves to 127.0.0.1, a loopback address, which only a grant of \"127.0.0.1:{port}\" itself may reach"
        )),
        "{err}"
    );

    let by_address = format!(r#"{{"mode":"http","address":"{address}"}}"#);
    let closed = Sandbox {
        http: vec![HttpGrant::parse(&address.to_string()).map_err(anyhow::Error::msg)?],
        private_networks: false,
        ..Sandbox::default()
    };
    let mut t = hostile(&by_address, closed, &batch)?;
    let err = t
        .process(&batch, &info(1))
        .expect_err("the policy closes private networks");
    assert!(
        err.to_string().contains(
            "127.0.0.1 is a loopback address, and the operator's policy lets plugins reach public addresses only"
        ),
        "{err}"
    );
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "a refused request never connects"
    );

    // The same plugin, granted the address under the default policy, gets its answer.
    let open = Sandbox {
        http: vec![HttpGrant::parse(&address.to_string()).map_err(anyhow::Error::msg)?],
        ..Sandbox::default()
    };
    let mut t = hostile(&by_address, open, &batch)?;
    let out = t.process(&batch, &info(2))?;
    assert_eq!(utf8_value(&out, "http")?, "200 hello weir!");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    Ok(())
}

#[test]
fn grants_and_usage_from_the_pipeline_file_reach_the_plugin_and_the_progress_record() -> Result<()>
{
    let ws = Workspace::new(2, 50)?;
    let text = format!(
        r#"
[query]
name = "granted"
checkpoint = "checkpoints/granted"
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
name = "env_reader"
plugin = "plugins/hostile.wasm"
config = {{ mode = "env" }}
limits = {{ memory = "64 MiB", timeout = "5s", fuel = 1000000000 }}
capabilities = {{ env = ["WEIR_TEST_GRANTED"] }}

[sink]
kind = "files"
path = "out"
format = "json"
"#
    );
    let file = ws.pipeline("granted.toml", &text)?;
    let out = std::process::Command::new(EXE)
        .args(["run", file.to_str().unwrap_or_default(), "--cache-dir"])
        .arg(cache())
        .env_remove("WEIR_LOG")
        .env("WEIR_TEST_GRANTED", "visible")
        .env("WEIR_TEST_SECRET", "must not leak")
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut rows = 0;
    for entry in std::fs::read_dir(ws.path().join("out"))? {
        for line in std::fs::read_to_string(entry?.path())?.lines() {
            let row: serde_json::Value = serde_json::from_str(line)?;
            assert_eq!(row["env"], "WEIR_TEST_GRANTED=visible", "{line}");
            rows += 1;
        }
    }
    assert_eq!(rows, ws.orders.lines - ws.orders.malformed);

    let progress = std::fs::read_to_string(ws.path().join("checkpoints/granted/progress.jsonl"))?;
    let records: Vec<serde_json::Value> = progress
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert_eq!(records.len(), 2);
    for record in &records {
        let plugin = &record["plugins"][0];
        assert_eq!(plugin["name"], "env_reader", "{record}");
        assert_eq!(plugin["calls"], 1, "{record}");
        assert_eq!(plugin["memoryLimitBytes"], 64u64 << 20, "{record}");
        assert_eq!(plugin["timeoutMs"], 5000, "{record}");
        assert_eq!(plugin["fuelLimit"], 1_000_000_000u64, "{record}");
        let peak = plugin["memoryPeakBytes"]
            .as_u64()
            .context("memoryPeakBytes")?;
        assert!(peak > 0 && peak <= 64 << 20, "{record}");
        let fuel = plugin["fuelConsumed"].as_u64().context("fuelConsumed")?;
        assert!(fuel > 0 && fuel < 1_000_000_000, "{record}");
        assert!(
            plugin["callTimeMs"].as_f64().is_some_and(|ms| ms > 0.0),
            "{record}"
        );
    }

    // A granted variable the host does not have stops the start, named.
    let out = std::process::Command::new(EXE)
        .args(["run", file.to_str().unwrap_or_default(), "--cache-dir"])
        .arg(cache())
        .env_remove("WEIR_LOG")
        .env_remove("WEIR_TEST_GRANTED")
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "plugin env_reader: environment variable WEIR_TEST_GRANTED is granted but not set on the host"
        ),
        "{stderr}"
    );
    Ok(())
}

/// Checks that `err` is the time-limit error of batch `batch_id` and that it
/// came at the limit, not long after: the deadline covers host calls too.
fn assert_time_limit(err: &PluginError, limit_ms: u64, batch_id: u64, elapsed: Duration) {
    assert!(
        matches!(err, PluginError::Timeout { limit_ms: l, batch_id: b, .. } if *l == limit_ms && *b == batch_id),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        format!("plugin hostile exceeded its time limit of {limit_ms} ms in batch {batch_id}")
    );
    let limit = Duration::from_millis(limit_ms);
    assert!(
        elapsed >= limit && elapsed < limit + Duration::from_secs(5),
        "failed after {elapsed:?}, the limit is {limit:?}"
    );
}

#[test]
fn a_plugin_that_sleeps_forever_fails_at_its_time_limit() -> Result<()> {
    let batch = orders_batch(10)?;
    let sandbox = Sandbox {
        timeout: Duration::from_millis(500),
        ..Sandbox::default()
    };
    let mut t = hostile(r#"{"mode":"sleep","batch":0}"#, sandbox, &batch)?;
    let started = Instant::now();
    let err = t.process(&batch, &info(0)).expect_err("sleeps forever");
    assert_time_limit(&err, 500, 0, started.elapsed());
    // The instance that timed out is replaced; the next batch runs.
    assert_eq!(t.process(&batch, &info(1))?.num_rows(), 10);
    assert_eq!(t.usage().instantiations, 2);
    Ok(())
}

/// How a stalling server treats the connections it accepts.
#[derive(Debug, Clone, Copy)]
enum Stall {
    /// Reads nothing and answers nothing: no TLS handshake, no first byte.
    Silent,
    /// Reads the request, sends the headers and 5 of the 100 bytes of body it
    /// announces, and then nothing.
    Body,
}

/// A server on 127.0.0.1:0 that accepts connections and stalls them as
/// `stall` says, holding each open; returns its address and the count of
/// connections it accepted.
fn stalling_server(stall: Stall) -> Result<(std::net::SocketAddr, Arc<AtomicUsize>)> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            count.fetch_add(1, Ordering::SeqCst);
            if let Stall::Body = stall {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nhello");
            }
            held.push(stream);
        }
    });
    Ok((address, accepted))
}

#[test]
fn a_granted_http_server_that_stalls_fails_the_call_at_its_time_limit() -> Result<()> {
    let batch = orders_batch(10)?;
    // The first byte never comes; the body stops halfway; the TLS handshake never ends.
    for (mode, stall) in [
        ("http", Stall::Silent),
        ("http", Stall::Body),
        ("https", Stall::Silent),
    ] {
        let (address, accepted) = stalling_server(stall)?;
        let sandbox = Sandbox {
            timeout: Duration::from_millis(500),
            http: vec![HttpGrant::parse(&address.to_string()).map_err(anyhow::Error::msg)?],
            ..Sandbox::default()
        };
        let config = format!(r#"{{"mode":"{mode}","address":"{address}"}}"#);
        let mut t = hostile(&config, sandbox, &batch)?;
        let started = Instant::now();
        let err = t
            .process(&batch, &info(0))
            .expect_err("the server never answers in full");
        let elapsed = started.elapsed();
        assert!(
            accepted.load(Ordering::SeqCst) >= 1,
            "{mode} {stall:?}: the request reached the server"
        );
        assert_time_limit(&err, 500, 0, elapsed);
        // The host goes on: the next batch gets a fresh instance, which is
        // stopped at its limit in turn.
        let started = Instant::now();
        let err = t.process(&batch, &info(1)).expect_err("still stalled");
        assert_time_limit(&err, 500, 1, started.elapsed());
        assert_eq!(t.usage().instantiations, 2, "{mode} {stall:?}");
    }
    Ok(())
}

#[test]
fn a_batch_that_sleeps_past_the_time_limit_is_not_committed_and_reruns_once_fixed() -> Result<()> {
    let ws = Workspace::new(3, 100)?;
    let checkpoint = ws.path().join("checkpoints/hostile");
    let text = pipeline("sleep").replace(
        "batch = 1 }\n",
        "batch = 1 }\nlimits = { timeout = \"1s\" }\n",
    );
    assert!(text.contains("limits = "), "{text}");
    let file = ws.pipeline("hostile.toml", &text)?;
    let started = Instant::now();
    let out = weir(EXE, &cache(), &["run", file.to_str().unwrap_or_default()])?;
    let elapsed = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("plugin hostile exceeded its time limit of 1000 ms in batch 1"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Batch 0, then batch 1 up to its limit: nowhere near forever.
    assert!(elapsed < Duration::from_secs(30), "{elapsed:?}");
    assert_eq!(commit_ids(&checkpoint)?, vec![0]);
    assert_eq!(offset_ids(&checkpoint)?, vec![0, 1]);

    let file = ws.pipeline("hostile.toml", &pipeline("ok"))?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(commit_ids(&checkpoint)?, vec![0, 1, 2]);
    let mut rows = 0;
    for e in std::fs::read_dir(ws.path().join("out"))? {
        rows += std::fs::read_to_string(e?.path())?.lines().count() as u64;
    }
    assert_eq!(rows, ws.orders.lines - ws.orders.malformed, "no row lost");
    Ok(())
}

// --- Host budgets: what the host builds or keeps for a plugin is held to its limits.

/// The stateful misbehaving plugin (`plugins/hostile_state`), built by this crate's build script.
const HOSTILE_STATE_WASM: &[u8] = include_bytes!(env!("WEIR_PLUGIN_HOSTILE_STATE"));

/// `hostile_state` opened under `sandbox`, with keyed state in `state_dir`
/// loaded from its empty start.
fn hostile_state(
    config: &str,
    sandbox: Sandbox,
    batch: &RecordBatch,
    state_dir: &std::path::Path,
) -> Result<WasmTransform> {
    hostile_state_in(
        config,
        sandbox,
        batch,
        state_dir,
        weir_host::state::StoreKind::Memory,
    )
}

/// As [`hostile_state`], with the keyed state in a store of `kind`.
fn hostile_state_in(
    config: &str,
    sandbox: Sandbox,
    batch: &RecordBatch,
    state_dir: &std::path::Path,
    kind: weir_host::state::StoreKind,
) -> Result<WasmTransform> {
    use weir_host::operator::wasm_state::{KeyedState, KeyedStateConfig};
    let engine = PluginEngine::new(EngineOptions {
        cache_dir: Some(cache()),
        ..EngineOptions::default()
    })?;
    let loaded = engine.load_bytes(
        "hostile_state",
        std::path::Path::new("hostile_state.wasm"),
        HOSTILE_STATE_WASM,
    )?;
    let mut t = WasmTransform::open(
        &engine,
        loaded,
        PluginOptions {
            name: "hostile_state".into(),
            config_json: config.into(),
            sandbox,
            failpoint: None,
            replay_key: weir_tests::replay_key(),
        },
        batch.schema(),
    )?;
    let mut state = KeyedState::open(&KeyedStateConfig {
        plugin: "hostile_state".into(),
        num_partitions: 2,
        state_dir: state_dir.to_path_buf(),
        state: weir_host::state::StateOptions {
            kind,
            ..weir_host::state::StateOptions::default()
        },
    })?;
    state.load(None, 0)?;
    t.attach_state(state);
    Ok(t)
}

/// The process's resident set now, in bytes.
fn rss_bytes() -> Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .context("statm has a resident field")?
        .parse()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Ok(pages * u64::try_from(page)?)
}

/// The most the resident set has been since [`reset_peak_rss`], in bytes.
fn peak_rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .context("status has VmHWM")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib << 10)
}

/// Makes the peak resident set the current one (Linux's `clear_refs` 5).
fn reset_peak_rss() -> Result<()> {
    std::fs::write("/proc/self/clear_refs", "5").context("resetting VmHWM")
}

/// Runs the test `name` of this file alone in a child process of its own,
/// with `WEIR_SANDBOX_CHILD` set, so that what it measures of the process
/// is its own and not the other tests' that run on threads beside it.
fn in_own_process(name: &str) -> Result<bool> {
    if std::env::var_os("WEIR_SANDBOX_CHILD").is_some() {
        return Ok(false);
    }
    let out = std::process::Command::new(std::env::current_exe()?)
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env("WEIR_SANDBOX_CHILD", "1")
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name} in its own process: {text}");
    assert!(text.contains("1 passed"), "{name} ran: {text}");
    Ok(true)
}

#[test]
fn get_many_of_a_huge_value_fails_at_the_memory_limit_and_the_host_stays_small() -> Result<()> {
    if in_own_process(
        "get_many_of_a_huge_value_fails_at_the_memory_limit_and_the_host_stays_small",
    )? {
        return Ok(());
    }
    let batch = orders_batch(10)?;
    let dir = tempfile::tempdir()?;
    let limit = 64u64 << 20;
    let sandbox = Sandbox {
        memory_bytes: limit,
        ..Sandbox::default()
    };
    // Batch 0 puts a 1 MiB value under `big`; batch 1 asks for 10,000 copies of it.
    let config = r#"{"mode":"get-many","batch":1,"value_bytes":1048576,"copies":10000}"#;
    let mut t = hostile_state(config, sandbox, &batch, dir.path())?;
    assert_eq!(t.process(&batch, &info(0))?.num_rows(), 10);
    t.keyed_state_mut().context("stateful")?.commit(0)?;
    t.keyed_state_mut().context("stateful")?.load(Some(0), 0)?;

    reset_peak_rss()?;
    let before = rss_bytes()?;
    let err = t
        .process(&batch, &info(1))
        .expect_err("10 GiB of values in a 64 MiB plugin");
    let peak = peak_rss_bytes()?;
    let after = rss_bytes()?;
    let text = err.to_string();
    assert!(
        matches!(
            err,
            PluginError::HostBudget {
                batch_id: 1,
                budget: weir_host::plugin::Budget::Memory { limit: l },
                ..
            } if l == limit
        ),
        "{text}"
    );
    assert!(
        text.starts_with(
            "plugin hostile_state exceeded its memory limit of 67108864 bytes in batch 1: \
             keyed-state.get-many: the values of the first "
        ),
        "{text}"
    );
    assert!(text.contains("of its 10000 keys already take"), "{text}");
    let grew = peak.saturating_sub(before);
    assert!(
        grew < 128 << 20,
        "the host's resident set grew by {grew} bytes at its peak"
    );
    assert!(
        after.saturating_sub(before) < 128 << 20,
        "{before} -> {after}"
    );

    // Nothing of batch 1 is kept; the batch runs again from version 0 on a
    // fresh instance, and the next one passes.
    t.keyed_state_mut().context("stateful")?.load(Some(0), 0)?;
    assert_eq!(t.process(&batch, &info(2))?.num_rows(), 10);
    assert_eq!(t.usage().instantiations, 2);
    Ok(())
}

#[test]
fn the_keyed_state_writes_of_a_batch_are_held_to_the_memory_limit() -> Result<()> {
    let batch = orders_batch(10)?;
    let dir = tempfile::tempdir()?;
    let sandbox = Sandbox {
        memory_bytes: 32 << 20,
        ..Sandbox::default()
    };
    // 100 distinct keys of 1 MiB each: 100 MiB buffered until the commit.
    let config = r#"{"mode":"put-many","batch":0,"value_bytes":1048576,"copies":100}"#;
    let mut t = hostile_state(config, sandbox, &batch, dir.path())?;
    let err = t.process(&batch, &info(0)).expect_err("over the limit");
    let text = err.to_string();
    assert!(
        matches!(
            err,
            PluginError::HostBudget {
                batch_id: 0,
                budget: weir_host::plugin::Budget::Memory { limit },
                ..
            } if limit == 32 << 20
        ),
        "{text}"
    );
    assert!(
        text.starts_with(
            "plugin hostile_state exceeded its memory limit of 33554432 bytes in batch 0: \
             keyed-state.put: the keyed-state writes of this batch, held in host memory until \
             its commit, would take "
        ),
        "{text}"
    );
    // Batch 0 again, from the empty state: its buffer was dropped with the batch.
    t.keyed_state_mut().context("stateful")?.load(None, 0)?;
    assert!(t.process(&batch, &info(0)).is_err(), "still over the limit");
    t.keyed_state_mut().context("stateful")?.load(None, 0)?;
    assert_eq!(t.process(&batch, &info(1))?.num_rows(), 10);
    Ok(())
}

#[test]
fn a_plugin_that_hoards_host_resources_fails_at_their_limit() -> Result<()> {
    let batch = orders_batch(10)?;
    let mut t = hostile(
        r#"{"mode":"resources","batch":0}"#,
        Sandbox::default(),
        &batch,
    )?;
    let err = t.process(&batch, &info(0)).expect_err("hoards pollables");
    assert!(
        matches!(
            err,
            PluginError::HostBudget {
                batch_id: 0,
                budget: weir_host::plugin::Budget::Resources { limit: 100_000 },
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().starts_with(
            "plugin hostile exceeded its limit of 100000 live host resources in batch 0"
        ),
        "{err}"
    );
    // The hoard went with the instance.
    assert_eq!(t.process(&batch, &info(1))?.num_rows(), 10);
    Ok(())
}

#[test]
fn a_flood_of_logs_or_stderr_is_capped_and_the_batch_passes() -> Result<()> {
    let ws = Workspace::new(3, 100)?;
    for (mode, marker) in [("log-spam", "spam "), ("stderr-spam", "stderr: zzz")] {
        let tag = format!("flood_{mode}");
        let text = pipeline(mode)
            .replace("checkpoints/hostile", &format!("checkpoints/{tag}"))
            .replace("path = \"out\"", &format!("path = \"out/{tag}\""));
        let file = ws.pipeline(&format!("{tag}.toml"), &text)?;
        let started = Instant::now();
        let out = run_ok(EXE, &cache(), &file, &[])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{mode}: {:?}",
            started.elapsed()
        );
        let logged = stderr.lines().filter(|l| l.contains(marker)).count();
        assert!(
            (1..=1_000).contains(&logged),
            "{mode}: {logged} lines of the flood reached the log"
        );
        let drops: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("dropped") && l.contains("plugin=\"hostile\""))
            .collect();
        assert_eq!(drops.len(), 1, "{mode}: said once: {drops:?}");
        assert!(drops[0].contains("batch_id=1"), "{mode}: {}", drops[0]);
        assert!(
            stderr.len() < 4 << 20,
            "{mode}: the log took {} bytes",
            stderr.len()
        );
        let checkpoint = ws.path().join(format!("checkpoints/{tag}"));
        assert_eq!(commit_ids(&checkpoint)?, vec![0, 1, 2], "{mode}");
    }
    Ok(())
}

#[test]
fn a_batch_over_a_host_budget_is_not_committed_and_reruns_once_fixed() -> Result<()> {
    let ws = Workspace::new(3, 100)?;
    std::fs::write(
        ws.path().join("plugins/hostile_state.wasm"),
        HOSTILE_STATE_WASM,
    )?;
    let checkpoint = ws.path().join("checkpoints/hostile");
    let stateful = |mode: &str| {
        pipeline(mode)
            .replace(
                "name = \"hostile\"\nplugin = \"plugins/hostile.wasm\"",
                "name = \"hostile_state\"\nplugin = \"plugins/hostile_state.wasm\"",
            )
            .replace(
                "batch = 1 }\n",
                "batch = 1 }\nlimits = { memory = \"64 MiB\" }\n",
            )
    };
    let text = stateful("get-many");
    assert!(text.contains("plugins/hostile_state.wasm"), "{text}");
    assert!(text.contains("limits = "), "{text}");
    let file = ws.pipeline("hostile.toml", &text)?;
    let out = weir(EXE, &cache(), &["run", file.to_str().unwrap_or_default()])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "plugin hostile_state exceeded its memory limit of 67108864 bytes in batch 1: \
             keyed-state.get-many"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(commit_ids(&checkpoint)?, vec![0]);
    assert_eq!(offset_ids(&checkpoint)?, vec![0, 1]);

    let file = ws.pipeline("hostile.toml", &stateful("ok"))?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(commit_ids(&checkpoint)?, vec![0, 1, 2]);
    let mut rows = 0;
    for e in std::fs::read_dir(ws.path().join("out"))? {
        rows += std::fs::read_to_string(e?.path())?.lines().count() as u64;
    }
    assert_eq!(rows, ws.orders.lines - ws.orders.malformed, "no row lost");
    Ok(())
}

/// How many copies of the key `big` (holding one byte) the plugin asks
/// `get-many` for: two million reads of the state store, seconds of host
/// time, while the plugin builds its list of keys in a few tens of
/// milliseconds. The result would take 26 MB, far below the memory limit the
/// test gives it, so only the time limit can end the call.
const SLOW_GET_MANY_COPIES: u64 = 2_000_000;

#[test]
fn a_keyed_state_call_past_the_time_limit_fails_at_it_and_the_query_goes_on() -> Result<()> {
    // In the host: the typed error, at the limit.
    let batch = orders_batch(10)?;
    let dir = tempfile::tempdir()?;
    let sandbox = Sandbox {
        memory_bytes: 1 << 30,
        timeout: Duration::from_millis(500),
        ..Sandbox::default()
    };
    let config = format!(
        r#"{{"mode":"get-many","batch":1,"value_bytes":1,"copies":{SLOW_GET_MANY_COPIES}}}"#
    );
    let mut t = hostile_state_in(
        &config,
        sandbox,
        &batch,
        dir.path(),
        weir_host::state::StoreKind::RocksDb,
    )?;
    assert_eq!(t.process(&batch, &info(0))?.num_rows(), 10);
    t.keyed_state_mut().context("stateful")?.commit(0)?;
    t.keyed_state_mut().context("stateful")?.load(Some(0), 0)?;
    let started = Instant::now();
    let err = t
        .process(&batch, &info(1))
        .expect_err("two million reads of the state store");
    let elapsed = started.elapsed();
    assert!(
        matches!(
            err,
            PluginError::Timeout {
                batch_id: 1,
                limit_ms: 500,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "plugin hostile_state exceeded its time limit of 500 ms in batch 1"
    );
    let limit = Duration::from_millis(500);
    assert!(
        elapsed >= limit && elapsed < limit + Duration::from_secs(5),
        "failed after {elapsed:?}, the limit is {limit:?}"
    );
    // The instance that timed out is replaced, the state is loaded again,
    // and the next batch runs.
    t.keyed_state_mut().context("stateful")?.load(Some(0), 0)?;
    assert_eq!(t.process(&batch, &info(2))?.num_rows(), 10);
    assert_eq!(t.usage().instantiations, 2);

    // In a query: the log says it was the keyed-state call the limit ended
    // (not the plugin's own code, not memory), the batch is not committed,
    // and it runs again once the plugin is fixed.
    let ws = Workspace::new(3, 100)?;
    std::fs::write(
        ws.path().join("plugins/hostile_state.wasm"),
        HOSTILE_STATE_WASM,
    )?;
    let checkpoint = ws.path().join("checkpoints/hostile");
    let stateful = |mode: &str, timeout: &str| {
        pipeline(mode)
            .replace(
                "name = \"hostile\"\nplugin = \"plugins/hostile.wasm\"",
                "name = \"hostile_state\"\nplugin = \"plugins/hostile_state.wasm\"",
            )
            .replace(
                &format!("mode = \"{mode}\", batch = 1 }}\n"),
                &format!(
                    "mode = \"{mode}\", batch = 1, value_bytes = 1, \
                     copies = {SLOW_GET_MANY_COPIES} }}\n\
                     limits = {{ memory = \"1 GiB\", timeout = \"{timeout}\" }}\n"
                ),
            )
    };
    let text = stateful("get-many", "500ms");
    assert!(text.contains("plugins/hostile_state.wasm"), "{text}");
    assert!(
        text.contains(&format!("copies = {SLOW_GET_MANY_COPIES} }}\nlimits = ")),
        "{text}"
    );
    assert!(text.contains("timeout = \"500ms\""), "{text}");
    let file = ws.pipeline("hostile.toml", &text)?;
    let started = Instant::now();
    let out = weir(EXE, &cache(), &["run", file.to_str().unwrap_or_default()])?;
    let elapsed = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("plugin hostile_state exceeded its time limit of 500 ms in batch 1"),
        "{stderr}"
    );
    let waited: Vec<&str> = stderr
        .lines()
        .filter(|l| {
            l.contains("the time limit passed while the plugin waited in keyed-state.get-many")
        })
        .collect();
    assert!(
        !waited.is_empty(),
        "the call the limit ended is logged: {stderr}"
    );
    assert!(
        waited
            .iter()
            .all(|l| l.contains("hostile_state") && l.contains("batch_id=1")),
        "{waited:?}"
    );
    assert!(!stderr.contains("exceeded its memory limit"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(elapsed < Duration::from_secs(60), "{elapsed:?}");
    assert_eq!(commit_ids(&checkpoint)?, vec![0]);
    assert_eq!(offset_ids(&checkpoint)?, vec![0, 1]);

    let file = ws.pipeline("hostile.toml", &stateful("ok", "30s"))?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(commit_ids(&checkpoint)?, vec![0, 1, 2]);
    let mut rows = 0;
    for e in std::fs::read_dir(ws.path().join("out"))? {
        rows += std::fs::read_to_string(e?.path())?.lines().count() as u64;
    }
    assert_eq!(rows, ws.orders.lines - ws.orders.malformed, "no row lost");
    Ok(())
}
