//! The Python, JavaScript and C example plugins against the same WIT as the Rust ones: each is
//! loaded by the same `weir run` and must produce byte for byte what the Rust plugin produces
//! on the same input, stateful ones across a SIGKILL too; the sinks are idempotent by batch id;
//! and a plugin's error value surfaces with the plugin's name.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use arrow_array::RecordBatch;
use weir_host::plugin::{
    BatchInfo, DirGrant, EngineOptions, PluginEngine, PluginOptions, Sandbox, WasmSink,
    WasmTransform,
};
use weir_tests::{
    C_FILTER_ROWS, C_JSONL_SINK, JS_FILTER_ROWS, JS_JSONL_SINK, JS_RUNNING_TOTAL,
    PYTHON_FILTER_ROWS, PYTHON_JSONL_SINK, PYTHON_RUNNING_TOTAL, SCHEMA, Workspace, commit_ids,
    lines, orders_batch, run_killed_at, run_ok, weir,
};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

/// A language's filter and sink, as paths a pipeline file can name.
#[derive(Debug, Clone, Copy)]
struct Language {
    name: &'static str,
    filter: &'static str,
    sink: &'static str,
}

/// The Rust plugins are written into the workspace by `Workspace::new`.
fn rust(ws: &Workspace) -> (String, String) {
    let dir = ws.path().join("plugins");
    (
        dir.join("filter_rows.wasm").display().to_string(),
        dir.join("jsonl_sink.wasm").display().to_string(),
    )
}

const PYTHON: Language = Language {
    name: "python",
    filter: PYTHON_FILTER_ROWS,
    sink: PYTHON_JSONL_SINK,
};
const JS: Language = Language {
    name: "js",
    filter: JS_FILTER_ROWS,
    sink: JS_JSONL_SINK,
};
const C: Language = Language {
    name: "c",
    filter: C_FILTER_ROWS,
    sink: C_JSONL_SINK,
};

/// orders → normalize_status (Rust) → four filters of `filter` → the jsonl sink `sink`, into
/// `out/<tag>/orders.jsonl`. The filters test a string, a decimal, an integer and a timestamp
/// column with `in`, `ge`, `lt` and `ge`, and the permissive decoder leaves nulls in the
/// malformed rows, which a filter must drop.
fn pipeline(tag: &str, filter: &str, sink: &str) -> String {
    format!(
        r#"
[query]
name = "polyglot_{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "{SCHEMA}"
max_files_per_trigger = 1
on_malformed = "permissive"

[[transform]]
name = "normalize_status"
plugin = "plugins/normalize_status.wasm"
config = {{ column = "status", lowercase = true, trim = true, map = {{ canceled = "cancelled" }} }}

[[transform]]
name = "{tag}_status"
plugin = "{filter}"
config = {{ column = "status", op = "in", value = ["completed", "returned"] }}

[[transform]]
name = "{tag}_amount"
plugin = "{filter}"
config = {{ column = "amount", op = "ge", value = "20.50" }}

[[transform]]
name = "{tag}_customer"
plugin = "{filter}"
config = {{ column = "customer_id", op = "lt", value = 40000 }}

[[transform]]
name = "{tag}_time"
plugin = "{filter}"
config = {{ column = "occurred_at", op = "ge", value = "2024-03-01T00:00:30Z" }}

[sink]
kind = "plugin"
name = "{tag}_sink"
plugin = "{sink}"
config = {{ path = "/out/orders.jsonl" }}
capabilities = {{ dirs = [ {{ host = "out/{tag}", guest = "/out", writable = true }} ] }}
"#
    )
}

fn run(ws: &Workspace, tag: &str, filter: &str, sink: &str) -> Result<String> {
    std::fs::create_dir_all(ws.path().join("out").join(tag))?;
    let file = ws.pipeline(&format!("{tag}.toml"), &pipeline(tag, filter, sink))?;
    run_ok(EXE, &cache(), &file, &[])?;
    let out = ws.path().join("out").join(tag).join("orders.jsonl");
    std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))
}

#[test]
fn python_js_and_c_plugins_produce_what_the_rust_plugins_produce() -> Result<()> {
    let ws = Workspace::new(3, 300)?;
    let (rust_filter, rust_sink) = rust(&ws);
    let expected = run(&ws, "rust", &rust_filter, &rust_sink)?;

    // The filters' meaning, checked on the Rust output itself so that the comparison below
    // is against something that is right.
    let rows: Vec<serde_json::Value> = expected
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    ensure!(rows.len() > 100, "too few rows survive: {}", rows.len());
    for row in &rows {
        let status = row["status"].as_str().context("status")?;
        ensure!(status == "completed" || status == "returned", "{row}");
        let amount: f64 = row["amount"].as_f64().context("amount")?;
        ensure!(amount >= 20.5, "{row}");
        ensure!(
            row["customer_id"].as_i64().context("customer_id")? < 40_000,
            "{row}"
        );
        ensure!(
            row["occurred_at"].as_str().context("time")? >= "2024-03-01T00:00:30",
            "{row}"
        );
    }

    for lang in [PYTHON, JS, C] {
        let got = run(&ws, lang.name, lang.filter, lang.sink)?;
        ensure!(
            got == expected,
            "{}: {} lines differ from Rust's {} (first difference: {:?})",
            lang.name,
            got.lines().count(),
            expected.lines().count(),
            got.lines().zip(expected.lines()).find(|(a, b)| a != b)
        );
        // Each batch once: the sidecar names the last batch, one per input file.
        let sidecar = std::fs::read_to_string(
            ws.path()
                .join("out")
                .join(lang.name)
                .join("orders.jsonl.batches"),
        )?;
        ensure!(
            sidecar == format!("2 {}\n", got.len()),
            "{}: sidecar {sidecar:?}",
            lang.name
        );
    }
    // Mixes in one query: the Python filter, then the JavaScript sink; the C filter, then
    // the Python sink.
    let mixed = run(&ws, "mixed", PYTHON.filter, JS.sink)?;
    ensure!(
        mixed == expected,
        "python filter + js sink differ from Rust"
    );
    let mixed = run(&ws, "mixed_c", C.filter, PYTHON.sink)?;
    ensure!(mixed == expected, "c filter + python sink differ from Rust");
    Ok(())
}

fn info(batch_id: u64, attempt: u32) -> BatchInfo {
    BatchInfo {
        query_id: "polyglot-test".into(),
        batch_id,
        attempt,
        timestamp_micros: 1_700_000_000_000_000,
        partition: 0,
    }
}

fn open_sink(
    engine: &PluginEngine,
    name: &str,
    wasm: &Path,
    out: &Path,
    batch: &RecordBatch,
) -> Result<WasmSink> {
    let loaded = engine.load(name, wasm)?;
    Ok(WasmSink::open(
        engine,
        loaded,
        PluginOptions {
            name: name.into(),
            config_json: r#"{"path": "/out/orders.jsonl"}"#.into(),
            sandbox: Sandbox {
                dirs: vec![DirGrant {
                    host: out.to_owned(),
                    guest: "/out".into(),
                    writable: true,
                }],
                ..Sandbox::default()
            },
            failpoint: None,
            replay_key: weir_tests::replay_key(),
        },
        &batch.schema(),
    )?)
}

#[test]
fn a_replayed_batch_is_not_written_twice_by_any_sink() -> Result<()> {
    let engine = PluginEngine::new(EngineOptions {
        cache_dir: Some(cache()),
        fuel: false,
        ..EngineOptions::default()
    })?;
    let batch = orders_batch(50)?;
    let (first, second) = (batch.slice(0, 30), batch.slice(30, 20));
    let scratch = tempfile::tempdir()?;
    let rust_wasm = scratch.path().join("jsonl_sink.wasm");
    std::fs::write(&rust_wasm, weir_host::examples::JSONL_SINK_WASM)?;
    let mut outputs = Vec::new();
    for (name, wasm) in [
        ("rust_sink", rust_wasm.as_path()),
        ("python_sink", Path::new(PYTHON_JSONL_SINK)),
        ("js_sink", Path::new(JS_JSONL_SINK)),
        ("c_sink", Path::new(C_JSONL_SINK)),
    ] {
        let out = scratch.path().join(name);
        std::fs::create_dir_all(&out)?;
        let data = out.join("orders.jsonl");
        let mut sink = open_sink(&engine, name, wasm, &out, &batch)?;
        sink.write_batch(&first, &info(0, 0))?;
        sink.write_batch(&second, &info(1, 0))?;
        let written = std::fs::read(&data)?;
        // The same batch again, from the same instance and from a new one (as after a restart).
        sink.write_batch(&second, &info(1, 1))?;
        let mut restarted = open_sink(&engine, name, wasm, &out, &batch)?;
        restarted.write_batch(&second, &info(1, 2))?;
        restarted.write_batch(&first, &info(0, 1))?;
        ensure!(
            std::fs::read(&data)? == written,
            "{name}: a replay changed the file"
        );
        ensure!(
            lines(&data)?.len() == 50,
            "{name}: {} lines",
            lines(&data)?.len()
        );

        // An interrupted attempt of batch 2 left half a line behind: the next attempt drops it.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&data)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"{\"order_id\":"))?;
        restarted.write_batch(&first.slice(0, 5), &info(2, 1))?;
        let text = std::fs::read_to_string(&data)?;
        ensure!(text.lines().count() == 55, "{name}: {text}");
        ensure!(
            std::fs::read_to_string(out.join("orders.jsonl.batches"))?
                == format!("2 {}\n", text.len()),
            "{name}: sidecar"
        );
        outputs.push((name, text));
    }
    for (name, text) in &outputs[1..] {
        ensure!(
            *text == outputs[0].1,
            "{name} wrote other bytes than the Rust sink"
        );
    }
    Ok(())
}

fn open_filter(
    engine: &PluginEngine,
    name: &str,
    wasm: &str,
    config: &str,
    batch: &RecordBatch,
) -> Result<WasmTransform, weir_host::plugin::PluginError> {
    let loaded = engine.load(name, Path::new(wasm))?;
    WasmTransform::open(
        engine,
        loaded,
        PluginOptions {
            name: name.into(),
            config_json: config.into(),
            sandbox: Sandbox::default(),
            failpoint: None,
            replay_key: weir_tests::replay_key(),
        },
        batch.schema(),
    )
}

#[test]
fn error_values_surface_with_the_plugin_name() -> Result<()> {
    let engine = PluginEngine::new(EngineOptions {
        cache_dir: Some(cache()),
        fuel: false,
        ..EngineOptions::default()
    })?;
    let batch = orders_batch(10)?;
    for (name, filter, sink) in [
        ("py_filter", PYTHON_FILTER_ROWS, PYTHON_JSONL_SINK),
        ("js_filter", JS_FILTER_ROWS, JS_JSONL_SINK),
        ("c_filter", C_FILTER_ROWS, C_JSONL_SINK),
    ] {
        // At open: an unknown column and an unknown key, each named.
        let err = open_filter(
            &engine,
            name,
            filter,
            r#"{"column":"nope","op":"eq","value":"x"}"#,
            &batch,
        )
        .expect_err("no such column");
        let text = err.to_string();
        ensure!(
            text.starts_with(&format!("plugin {name} rejected its config:"))
                && text.contains("no column `nope`"),
            "{text}"
        );
        let err = open_filter(
            &engine,
            name,
            filter,
            r#"{"column":"status","op":"eq","valu":"x"}"#,
            &batch,
        )
        .expect_err("unknown key");
        ensure!(
            err.to_string().contains("config.valu: unknown key"),
            "{err}"
        );

        // At a batch: a sink whose sidecar was damaged refuses the batch with a fatal error value.
        let out = tempfile::tempdir()?;
        let sink_name = name.replace("filter", "sink");
        let mut sink = open_sink(&engine, &sink_name, Path::new(sink), out.path(), &batch)?;
        std::fs::write(out.path().join("orders.jsonl.batches"), "garbage")?;
        let err = sink
            .write_batch(&batch, &info(7, 0))
            .expect_err("damaged sidecar");
        let text = err.to_string();
        ensure!(
            text.starts_with(&format!("plugin {sink_name} failed batch 7 (fatal): jsonl_sink: /out/orders.jsonl.batches is not `<batch id> <length>`")),
            "{text}"
        );
        ensure!(!err.is_retryable(), "{text}");
    }

    // And through `weir run`: the CLI's error names the plugin and the key path.
    let ws = Workspace::new(1, 10)?;
    let text =
        pipeline("bad", JS_FILTER_ROWS, JS_JSONL_SINK).replace(r#"op = "lt""#, r#"op = "less""#);
    std::fs::create_dir_all(ws.path().join("out/bad"))?;
    let file = ws.pipeline("bad.toml", &text)?;
    let out = weir(
        EXE,
        &cache(),
        &["run", file.to_str().context("utf-8 path")?],
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.code() == Some(1), "{stderr}");
    ensure!(
        stderr.contains("plugin bad_customer rejected its config: config.op: unknown op `less`"),
        "{stderr}"
    );
    Ok(())
}

#[test]
fn every_comparison_keeps_the_rows_the_rust_filter_keeps() -> Result<()> {
    let engine = PluginEngine::new(EngineOptions {
        cache_dir: Some(cache()),
        fuel: false,
        ..EngineOptions::default()
    })?;
    let batch = orders_batch(2_000)?;
    let scratch = tempfile::tempdir()?;
    let rust_wasm = scratch.path().join("filter_rows.wasm");
    std::fs::write(&rust_wasm, weir_host::examples::FILTER_ROWS_WASM)?;
    let rust_path = rust_wasm.display().to_string();
    for config in [
        r#"{"column":"status","op":"ne","value":"completed"}"#,
        r#"{"column":"order_id","op":"in","value":[10000003, 10000005, 10000999]}"#,
        r#"{"column":"amount","op":"lt","value":12.5}"#,
        r#"{"column":"session_id","op":"gt","value":"s-8"}"#,
        r#"{"column":"occurred_at","op":"le","value":1709251230000000}"#,
        r#"{"column":"status","op":"not_null"}"#,
        r#"{"column":"status","op":"is_null"}"#,
    ] {
        let mut expected = open_filter(&engine, "rust", &rust_path, config, &batch)?;
        let want = expected.process(&batch, &info(0, 0))?;
        for (name, wasm) in [
            ("python", PYTHON_FILTER_ROWS),
            ("js", JS_FILTER_ROWS),
            ("c", C_FILTER_ROWS),
        ] {
            let mut t = open_filter(&engine, name, wasm, config, &batch)?;
            let got = t.process(&batch, &info(0, 0))?;
            ensure!(
                got == want,
                "{name} {config}: {} rows, Rust {}",
                got.num_rows(),
                want.num_rows()
            );
        }
        ensure!(
            want.num_rows() < batch.num_rows() || config.contains("not_null"),
            "{config} filters nothing"
        );
    }
    Ok(())
}

/// orders → `plugin` (a running total of `amount` per `customer_id` that expires 20 s of event
/// time after a customer's latest order, with a 5-second watermark) → JSON files, one batch per
/// input file.
fn running_total_pipeline(tag: &str, plugin: &str) -> String {
    format!(
        r#"
[query]
name = "totals_{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"
state_store = "rocksdb"

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "{SCHEMA}"
max_files_per_trigger = 1
on_malformed = "drop"

[[transform]]
name = "running_total"
plugin = "{plugin}"
config = {{ key = "customer_id", value = "amount", event_time = "occurred_at", expire_after_ms = 20000 }}

[watermark]
column = "occurred_at"
delay = "5 seconds"

[sink]
kind = "files"
path = "out/{tag}"
format = "json"
"#
    )
}

/// Every file a files sink wrote under `dir`, by name, with its bytes.
fn written_files(dir: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .context("file name")?
            .to_string_lossy()
            .into_owned();
        if path.is_file() && !name.starts_with(['.', '_']) {
            files.push((name, std::fs::read(&path)?));
        }
    }
    files.sort();
    Ok(files)
}

#[test]
fn running_totals_are_byte_identical_in_every_language_across_a_kill() -> Result<()> {
    let ws = Workspace::new(4, 200)?;
    let rust_plugin = ws.path().join("plugins/running_total.wasm");
    let file = ws.pipeline(
        "rust.toml",
        &running_total_pipeline("rust", &rust_plugin.display().to_string()),
    )?;
    run_ok(EXE, &cache(), &file, &[])?;
    let expected = written_files(&ws.path().join("out/rust"))?;
    let rows: usize = expected
        .iter()
        .map(|(_, bytes)| bytes.iter().filter(|b| **b == b'\n').count())
        .sum();
    ensure!(rows > 700, "too few rows: {rows}");
    // The expiry happened, so the comparison covers it.
    let removed: u64 = weir_tests::progress(&ws.path().join("checkpoints/rust"))?
        .iter()
        .flat_map(|p| p["stateOperators"].as_array().cloned().unwrap_or_default())
        .map(|op| op["numRowsRemoved"].as_u64().unwrap_or(0))
        .sum();
    ensure!(removed > 0, "no total expired in the reference run");

    for (lang, plugin) in [("python", PYTHON_RUNNING_TOTAL), ("js", JS_RUNNING_TOTAL)] {
        // Uninterrupted, then killed in the transform of batch 2 and before the commit of
        // batch 1, each restarted to the end.
        for (tag, kill) in [
            (lang.to_owned(), None),
            (format!("{lang}_in_transform"), Some("in-transform@2")),
            (format!("{lang}_before_commit"), Some("before-commit@1")),
        ] {
            let file = ws.pipeline(
                &format!("{tag}.toml"),
                &running_total_pipeline(&tag, plugin),
            )?;
            if let Some(failpoint) = kill {
                run_killed_at(EXE, &cache(), &file, failpoint)?;
                let done = commit_ids(&ws.path().join("checkpoints").join(&tag))?;
                ensure!(done.len() < 4, "{tag}: killed after every commit: {done:?}");
            }
            run_ok(EXE, &cache(), &file, &[])?;
            let got = written_files(&ws.path().join("out").join(&tag))?;
            ensure!(
                got == expected,
                "{tag}: the files differ from Rust's ({} files, Rust {}; first differing: {:?})",
                got.len(),
                expected.len(),
                got.iter()
                    .zip(&expected)
                    .find(|(a, b)| a != b)
                    .map(|(a, _)| &a.0)
            );
        }
    }
    Ok(())
}
