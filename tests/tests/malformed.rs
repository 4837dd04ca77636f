//! Malformed input under each `on_malformed` policy: counted, routed, and
//! never lost silently. Runs the query in-process into a memory sink.

use std::path::{Path, PathBuf};

use anyhow::Result;
use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use weir_host::query::{Query, QueryOptions, RunSummary};
use weir_host::sink::MemorySink;
use weir_tests::{SCHEMA, Workspace};

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn pipeline(policy: &str) -> String {
    let dead_letter = if policy == "dead-letter" {
        "dead_letter_path = \"dead-letter\""
    } else {
        ""
    };
    format!(
        r#"
[query]
name = "malformed_{}"
checkpoint = "checkpoints/{policy}"
trigger = "available-now"

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "{SCHEMA}"
on_malformed = "{policy}"
{dead_letter}

[sink]
kind = "memory"
"#,
        policy.replace('-', "_")
    )
}

fn run(dir: &Path, policy: &str) -> Result<(Result<RunSummary, String>, Vec<RecordBatch>)> {
    let spec = weir_host::spec::parse(&pipeline(policy), dir, "test.toml", &[])?;
    let sink = MemorySink::new();
    let table = sink.table();
    let options = QueryOptions {
        cache_dir: Some(cache()),
        memory_sink: Some(sink),
        ..QueryOptions::default()
    };
    let result = Query::start(spec, options)
        .and_then(|mut q| q.run())
        .map_err(|e| e.to_string());
    let batches = table
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .values()
        .flatten()
        .cloned()
        .collect();
    Ok((result, batches))
}

fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::num_rows).sum()
}

#[test]
fn permissive_keeps_the_raw_line_in_corrupt_record() -> Result<()> {
    let ws = Workspace::new(2, 500)?;
    let (result, batches) = run(ws.path(), "permissive")?;
    let summary = result.map_err(anyhow::Error::msg)?;
    assert_eq!(summary.input_rows, ws.orders.lines);
    assert_eq!(summary.malformed_rows, ws.orders.malformed);
    assert_eq!(rows(&batches) as u64, ws.orders.lines, "no row is lost");
    let mut corrupt = 0;
    for b in &batches {
        let col = b
            .column_by_name("_corrupt_record")
            .expect("permissive adds _corrupt_record");
        let raw = col.as_string::<i32>();
        for i in 0..raw.len() {
            if raw.is_valid(i) {
                corrupt += 1;
                assert!(
                    raw.value(i).starts_with("{\"order_id\":"),
                    "the raw line: {}",
                    raw.value(i)
                );
                assert!(b.column_by_name("order_id").expect("column").is_null(i));
            }
        }
    }
    assert_eq!(corrupt, ws.orders.malformed);
    // Progress records count malformed rows per batch.
    let progress = weir_tests::progress(&ws.path().join("checkpoints/permissive"))?;
    let counted: u64 = progress
        .iter()
        .map(|v| -> Result<u64> {
            Ok(v["sources"][0]["metrics"]["numMalformedRows"]
                .as_str()
                .unwrap_or("0")
                .parse()?)
        })
        .sum::<Result<u64>>()?;
    assert_eq!(counted, ws.orders.malformed);
    Ok(())
}

#[test]
fn drop_leaves_malformed_lines_out_but_counts_them() -> Result<()> {
    let ws = Workspace::new(2, 500)?;
    let (result, batches) = run(ws.path(), "drop")?;
    let summary = result.map_err(anyhow::Error::msg)?;
    assert_eq!(summary.malformed_rows, ws.orders.malformed);
    assert!(ws.orders.malformed > 0);
    assert_eq!(rows(&batches) as u64, ws.orders.lines - ws.orders.malformed);
    assert!(
        batches
            .iter()
            .all(|b| b.column_by_name("_corrupt_record").is_none())
    );
    Ok(())
}

#[test]
fn fail_stops_the_batch_naming_file_and_line() -> Result<()> {
    let ws = Workspace::new(2, 500)?;
    let (result, batches) = run(ws.path(), "fail")?;
    let err = result.expect_err("a malformed line must fail the batch");
    // Order ids start at 10_000_001 and every 100th line is malformed: line 100 of the first file.
    assert!(err.contains("orders-00000.json:100"), "{err}");
    assert_eq!(rows(&batches), 0, "the failed batch wrote nothing");
    // The batch is planned but not committed: a fixed input or policy runs it again.
    assert!(ws.path().join("checkpoints/fail/offsets/0").is_file());
    assert!(!ws.path().join("checkpoints/fail/commits/0").exists());
    Ok(())
}

#[test]
fn dead_letter_writes_line_error_and_origin() -> Result<()> {
    let ws = Workspace::new(2, 500)?;
    let (result, batches) = run(ws.path(), "dead-letter")?;
    let summary = result.map_err(anyhow::Error::msg)?;
    assert_eq!(rows(&batches) as u64, ws.orders.lines - ws.orders.malformed);
    assert_eq!(summary.malformed_rows, ws.orders.malformed);
    let mut letters = Vec::new();
    for entry in std::fs::read_dir(ws.path().join("dead-letter"))? {
        let text = std::fs::read_to_string(entry?.path())?;
        letters.extend(text.lines().map(str::to_owned));
    }
    assert_eq!(letters.len() as u64, ws.orders.malformed);
    let first: serde_json::Value = serde_json::from_str(&letters[0])?;
    assert!(
        first["origin"].as_str().unwrap_or("").ends_with(".json"),
        "{first}"
    );
    assert!(
        first["line"].as_u64().is_some_and(|l| l % 100 == 0),
        "{first}"
    );
    assert!(
        first["raw"]
            .as_str()
            .unwrap_or("")
            .starts_with("{\"order_id\""),
        "{first}"
    );
    assert!(!first["error"].as_str().unwrap_or("").is_empty(), "{first}");
    Ok(())
}
