//! `weir plugin inspect` and plugin metadata: a component's world, hash, imports, exports and
//! metadata (the `weir:metadata` section the SDK's `plugin_metadata!` writes), and `weir
//! validate` checking a pipeline's `config` against the schema the plugin carries.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use weir_tests::{Workspace, jsonl_plugin_sink, orders_pipeline, weir};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn inspect(ws: &Workspace, plugin: &str) -> Result<Value> {
    let file = ws.path().join("plugins").join(plugin);
    let out = weir(
        EXE,
        &cache(),
        &[
            "plugin",
            "inspect",
            file.to_str().context("path")?,
            "--json",
        ],
    )?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

#[test]
fn inspect_names_the_world_metadata_imports_and_exports() -> Result<()> {
    let ws = Workspace::new(1, 10)?;
    let filter = inspect(&ws, "filter_rows.wasm")?;
    let bytes = std::fs::read(ws.path().join("plugins/filter_rows.wasm"))?;
    ensure!(
        filter["sha256"] == weir_tests::serve::sha(&bytes),
        "{filter}"
    );
    ensure!(filter["world"] == "transform", "{filter}");
    ensure!(filter["metadata"]["name"] == "filter_rows", "{filter}");
    ensure!(
        filter["metadata"]["config_schema"]["required"][0] == "column",
        "{filter}"
    );
    ensure!(
        filter["exports"] == serde_json::json!(["weir:plugin/transformer@0.1.0"]),
        "{filter}"
    );
    let expected = [
        ("jsonl_sink.wasm", "sink"),
        ("merge_sink.wasm", "merge-sink"),
        ("running_total.wasm", "stateful-transform"),
        ("count_char.wasm", "scalar-function"),
        ("query_log.wasm", "listener"),
    ];
    for (file, world) in expected {
        let found = inspect(&ws, file)?;
        ensure!(found["world"] == world, "{file}: {found}");
        ensure!(found["metadata"].is_null(), "{file}: {found}");
    }
    // Not a component: refused, naming the file.
    let junk = ws.path().join("junk.wasm");
    std::fs::write(&junk, b"\0asm\x01\0\0\0")?;
    let out = weir(
        EXE,
        &cache(),
        &["plugin", "inspect", junk.to_str().context("path")?],
    )?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success()
            && err.contains("junk.wasm")
            && err.contains("not a WebAssembly component"),
        "{err}"
    );
    Ok(())
}

#[test]
fn validate_checks_a_config_against_the_plugins_schema() -> Result<()> {
    let ws = Workspace::new(1, 10)?;
    std::fs::create_dir_all(ws.path().join("out/good"))?;
    let good = orders_pipeline("good", "drop", &jsonl_plugin_sink("good"));
    let file = ws.pipeline("good.toml", &good)?;
    let out = weir(EXE, &cache(), &["validate", file.to_str().context("path")?])?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let bad = good.replace(
        r#"config = { column = "status", op = "eq", value = "completed" }"#,
        r#"config = { column = "", op = "like", value = "completed", negate = true }"#,
    );
    ensure!(bad != good);
    let file = ws.pipeline("bad.toml", &bad)?;
    let out = weir(EXE, &cache(), &["validate", file.to_str().context("path")?])?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.code() == Some(2), "{err}");
    for (key, says) in [
        ("transform[1].config.column", "at least 1"),
        ("transform[1].config.op", "\"like\""),
        ("transform[1].config.negate", "not a key the plugin takes"),
    ] {
        ensure!(
            err.lines()
                .any(|l| l.contains(key) && l.contains(says) && l.contains("filter_rows 0.1.0")),
            "{key}: {err}"
        );
    }
    // `weir run` refuses it the same way, before anything runs.
    let out = weir(EXE, &cache(), &["run", file.to_str().context("path")?])?;
    ensure!(
        out.status.code() == Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn plugin_test_runs_a_transform_and_a_sink_in_the_host() -> Result<()> {
    let ws = Workspace::new(1, 10)?;
    let plugin = |name: &str| ws.path().join("plugins").join(name);
    let filter = plugin("filter_rows.wasm");
    let out = weir(
        EXE,
        &cache(),
        &[
            "plugin",
            "test",
            filter.to_str().context("path")?,
            "--config",
            r#"{"column":"status","op":"eq","value":"completed"}"#,
            "--rows",
            "200",
            "--batches",
            "2",
        ],
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        text.contains("(transform), 2 batch(es) of 200 sample orders"),
        "{text}"
    );
    let kept: Vec<usize> = text
        .lines()
        .filter_map(|l| l.split(" rows in, ").nth(1))
        .filter_map(|r| r.split(' ').next()?.parse().ok())
        .collect();
    ensure!(
        kept.len() == 2 && kept.iter().all(|k| *k > 0 && *k < 200),
        "{text}"
    );
    ensure!(
        text.contains("| completed |") && !text.contains("| pending"),
        "{text}"
    );
    let cost = text.lines().last().unwrap_or_default();
    ensure!(
        cost.starts_with("cost: 2 call(s)") && !cost.contains(" 0 fuel"),
        "{cost}"
    );

    // A sink, granted a folder, writes what it was given.
    let sink = plugin("jsonl_sink.wasm");
    let granted = ws.path().join("tested");
    let out = weir(
        EXE,
        &cache(),
        &[
            "plugin",
            "test",
            sink.to_str().context("path")?,
            "--config",
            r#"{"path":"/out/orders.jsonl"}"#,
            "--rows",
            "50",
            "--dir",
            &format!("{}=/out", granted.display()),
        ],
    )?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = std::fs::read_to_string(granted.join("orders.jsonl"))?
        .lines()
        .count();
    ensure!(lines == 150, "3 batches of 50 rows: {lines}");
    // Without the grant, the sink's failure is named.
    let out = weir(
        EXE,
        &cache(),
        &[
            "plugin",
            "test",
            sink.to_str().context("path")?,
            "--config",
            r#"{"path":"/out/x.jsonl"}"#,
        ],
    )?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success() && err.contains("jsonl_sink"), "{err}");
    Ok(())
}
