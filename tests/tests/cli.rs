//! The command line: validation lists every problem at once; the demo runs.

use std::path::PathBuf;

use anyhow::Result;
use weir_tests::{Workspace, weir};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

const BAD: &str = r#"
[query]
name = "bad"
checkpoint = "checkpoints/bad"
trigger = "whenever"
colour = "blue"

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "order_id BIGINT, amount DECIMAL(50,2)"
max_files_per_trigger = 0

[sink]
kind = "files"
path = "out"
format = "xlsx"
"#;

#[test]
fn validate_and_run_list_every_problem_with_its_key() -> Result<()> {
    let ws = Workspace::new(1, 10)?;
    let file = ws.pipeline("bad.toml", BAD)?;
    for command in ["validate", "run"] {
        let out = weir(EXE, &cache(), &[command, file.to_str().unwrap_or_default()])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        for key in [
            "query.trigger",
            "query.colour",
            "source.orders.schema",
            "source.orders.max_files_per_trigger",
            "sink.format",
        ] {
            assert!(
                stderr.contains(key),
                "{command}: {key} missing from:\n{stderr}"
            );
        }
        assert!(
            !ws.path().join("checkpoints/bad").exists(),
            "nothing may run"
        );
    }
    Ok(())
}

#[test]
fn set_overrides_a_key() -> Result<()> {
    let ws = Workspace::new(1, 10)?;
    let file = ws.pipeline("bad.toml", BAD)?;
    let out = weir(
        EXE,
        &cache(),
        &[
            "validate",
            file.to_str().unwrap_or_default(),
            "--set",
            "query.trigger=once",
        ],
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("query.trigger"), "{stderr}");
    assert!(stderr.contains("sink.format"), "{stderr}");
    Ok(())
}

#[test]
fn the_demo_runs_end_to_end() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let out = weir(
        EXE,
        &cache(),
        &[
            "demo",
            "--dir",
            dir.path().to_str().unwrap_or_default(),
            "--files",
            "3",
            "--lines",
            "300",
        ],
    )?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("result:"), "{stdout}");
    // One progress line per batch on stderr, and records in the checkpoint.
    assert_eq!(stderr.matches("rows in").count(), 3, "{stderr}");
    let progress = std::fs::read_to_string(dir.path().join("checkpoints/demo/progress.jsonl"))?;
    assert_eq!(progress.lines().count(), 3);
    // Spark's StreamingQueryProgress field names, so its dashboards read ours.
    let mut input_rows = 0;
    for (i, line) in progress.lines().enumerate() {
        let p: serde_json::Value = serde_json::from_str(line)?;
        for key in [
            "id",
            "runId",
            "name",
            "timestamp",
            "batchId",
            "numInputRows",
            "inputRowsPerSecond",
            "processedRowsPerSecond",
        ] {
            assert!(!p[key].is_null(), "{key} missing in {p}");
        }
        for key in ["getBatch", "walCommit", "addBatch", "triggerExecution"] {
            assert!(
                p["durationMs"][key].is_u64(),
                "durationMs.{key} missing in {p}"
            );
        }
        assert_eq!(p["batchId"], i as u64);
        assert_eq!(p["name"], "demo");
        let source = &p["sources"][0];
        assert_eq!(source["endOffset"]["logOffset"], i as u64);
        assert_eq!(source["numInputRows"], p["numInputRows"]);
        assert!(p["sink"]["numOutputRows"].is_u64());
        assert_eq!(
            p["plugins"].as_array().map(Vec::len),
            Some(3),
            "two transforms and the sink"
        );
        input_rows += p["numInputRows"].as_u64().unwrap_or(0);
    }
    assert_eq!(input_rows, 900);
    let rows = std::fs::read_to_string(dir.path().join("out/completed_orders.jsonl"))?
        .lines()
        .count();
    assert!(rows > 0);
    Ok(())
}
