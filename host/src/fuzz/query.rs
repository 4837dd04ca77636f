//! Fuzzing a restart over a damaged checkpoint: [`Query::start`] and [`Query::run`] on the
//! checkpoint of a stateful query (a windowed aggregation, or deduplication within the
//! watermark) after one of its files was damaged or deleted.
//!
//! The readers of single files are fuzzed in `checkpoint` and `state`; this target covers what
//! the query then does with the values it read back: watermarks of any `i64` (with the delay,
//! the windows and the eviction computed from them), batch timestamps, source offsets that
//! disagree with the source logs, changelogs whose parents or row counts do not add up, a
//! commit missing (a replay), a log entry missing. Property: the restart never panics; it
//! runs, or fails with a [`QueryError`].
//!
//! Budget: 160 restarts (each copies the checkpoint back and runs a batch), a few seconds.

use std::path::Path;

use proptest::prelude::*;
use serde_json::Value;

use super::checkpoint::{JsonEdit, apply_json, json_edits};
use super::{Reach, byte_edits, mutate, run};
use crate::query::{Query, QueryOptions};
use crate::sink::MemorySink;
use crate::spec;

const AGGREGATE: &str = r#"
[query]
name = "fuzz_aggregate"
checkpoint = "cp"
trigger = "available-now"
output_mode = "update"
state_store = "memory"
state_partitions = 2

[[source]]
name = "orders"
kind = "files"
path = "in"
format = "json"
schema = "id BIGINT, status STRING, amount DECIMAL(12,2), at TIMESTAMP"
max_files_per_trigger = 1

[watermark]
column = "at"
delay = "10 minutes"

[aggregate]
window = { column = "at", size = "5 minutes", slide = "1 minute" }
group_by = ["status"]
select = ["sum(amount) AS revenue", "count(*) AS n", "max(id) AS top"]

[sink]
kind = "memory"
"#;

const DEDUP: &str = r#"
[query]
name = "fuzz_dedup"
checkpoint = "cp"
trigger = "available-now"
output_mode = "append"
state_store = "memory"

[[source]]
name = "orders"
kind = "files"
path = "in"
format = "json"
schema = "id BIGINT, status STRING, amount DECIMAL(12,2), at TIMESTAMP"
max_files_per_trigger = 1

[watermark]
column = "at"
delay = "1 minute"

[deduplicate]
keys = ["id"]
within_watermark = true

[sink]
kind = "memory"
"#;

fn orders(first_id: i64, minute: i64) -> String {
    (0..4)
        .map(|i| {
            format!(
                "{{\"id\":{},\"status\":\"{}\",\"amount\":{}.25,\"at\":\"2024-03-01T00:{:02}:{:02}Z\"}}\n",
                first_id + i % 3,
                ["completed", "pending"][(i % 2) as usize],
                i + 1,
                minute,
                i * 7
            )
        })
        .collect()
}

fn write_input(dir: &Path, n: usize) {
    std::fs::create_dir_all(dir.join("in")).expect("input folder");
    let path = dir.join(format!("in/orders-{n}.json"));
    std::fs::write(&path, orders(10 * n as i64, 10 * n as i64)).expect("input file");
    // Files are taken oldest first: give them increasing modification times.
    let mtime = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000 + n as u64);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_modified(mtime))
        .expect("set mtime");
}

fn start(text: &str, dir: &Path) -> Result<Query, crate::query::QueryError> {
    let pipeline = spec::parse(text, dir, "fuzz.toml", &[]).expect("a valid pipeline");
    Query::start(
        pipeline,
        QueryOptions {
            memory_sink: Some(MemorySink::new()),
            ..QueryOptions::default()
        },
    )
}

fn files_under(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("list") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files_under(&path, out);
        } else if path.file_name().is_some_and(|n| n != "lock") {
            out.push(path);
        }
    }
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// What is done to one checkpoint file.
#[derive(Debug, Clone)]
enum Damage {
    Delete,
    Bytes(Vec<super::ByteEdit>),
    /// For `v1\n<json>\n` entries and `metadata`: a JSON-level edit.
    Json(Vec<JsonEdit>),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        1 => Just(Damage::Delete),
        1 => byte_edits(3).prop_map(Damage::Bytes),
        4 => json_edits().prop_map(Damage::Json),
    ]
}

/// `bytes` with `damage`; `None` deletes the file.
fn damaged(bytes: &[u8], damage: &Damage) -> Option<Vec<u8>> {
    match damage {
        Damage::Delete => None,
        Damage::Bytes(edits) => Some(mutate(bytes, edits)),
        Damage::Json(edits) => {
            let text = String::from_utf8_lossy(bytes);
            let (prefix, json) = match text.strip_prefix("v1\n") {
                Some(rest) => ("v1\n", rest),
                None => ("", text.as_ref()),
            };
            match serde_json::from_str::<Value>(json.trim_end()) {
                Ok(value) => Some(format!("{prefix}{}\n", apply_json(value, edits)).into_bytes()),
                // A binary state file: the JSON edits' positions as byte flips instead.
                Err(_) => Some(mutate(
                    bytes,
                    &edits
                        .iter()
                        .map(|e| {
                            let (JsonEdit::Replace(n, _) | JsonEdit::Remove(n)) = e;
                            super::ByteEdit::Flip(*n, 0x41)
                        })
                        .collect::<Vec<_>>(),
                )),
            }
        }
    }
}

fn fuzz_restarts(text: &str) {
    let root = tempfile::tempdir().expect("temp dir");
    let work = root.path().join("work");
    let template = root.path().join("template");
    for n in 0..2 {
        write_input(&work, n);
    }
    let summary = start(text, &work)
        .and_then(|mut q| q.run())
        .expect("the first run succeeds");
    assert!(summary.batches >= 2, "{summary:?}");
    write_input(&work, 2);
    copy_dir(&work, &template).expect("template");
    let mut files = Vec::new();
    files_under(&template.join("cp"), &mut files);
    files.sort();
    let files: Vec<_> = files
        .into_iter()
        .map(|p| p.strip_prefix(&template).expect("inside").to_path_buf())
        .collect();
    assert!(files.len() >= 8, "{files:?}");

    let ran = Reach::default();
    let strategy = (0..files.len(), damage());
    run(80, strategy, |(file, damage)| {
        let fail = |e: std::io::Error| TestCaseError::fail(e.to_string());
        std::fs::remove_dir_all(&work).map_err(fail)?;
        copy_dir(&template, &work).map_err(fail)?;
        let path = work.join(&files[file]);
        match damaged(&std::fs::read(&path).map_err(fail)?, &damage) {
            Some(bytes) => std::fs::write(&path, bytes).map_err(fail)?,
            None => std::fs::remove_file(&path).map_err(fail)?,
        }
        // Any outcome but a panic: the typed error names what is wrong.
        if start(text, &work).and_then(|mut q| q.run()).is_ok() {
            ran.hit();
        }
        Ok(())
    });
    ran.check("a restart that ran over a damaged checkpoint", 80);
}

#[test]
fn fuzz_query_restart_aggregate() {
    fuzz_restarts(AGGREGATE);
}

#[test]
fn fuzz_query_restart_dedup() {
    fuzz_restarts(DEDUP);
}
