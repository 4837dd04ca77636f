//! Files → Weir → MERGE into a Delta table, end to end through the `weir` binary: upserts with
//! the seeds' condition (older rows never overwrite newer ones), duplicate keys refused with
//! Delta's words or reduced by `dedup = "latest-by:..."`, and a SIGKILL before and after the
//! Delta commit of the first batch (which creates the table) and of a later one, which must
//! neither lose nor re-apply it: the table then holds an uninterrupted run's rows, every column.
//! Every table is read by our own reader and by the independent Python `deltalake` package, as
//! `tests/delta.rs` does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use serde_json::Value;
use weir_tests::delta::{own_rows, py_rows};
use weir_tests::{commit_ids, run_killed_at, run_ok, same_rows, weir};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

/// The table as the Python `deltalake` package sees it: rows sorted by order_id.
const PY_READER: &str = r#"
import json, os, sys
from deltalake import DeltaTable
t = DeltaTable(sys.argv[1])
rows = sorted(t.to_pyarrow_table().to_pylist(), key=lambda r: r["order_id"])
print(json.dumps({
    "version": t.version(),
    "txn": t.transaction_version(sys.argv[2]),
    "operations": [h.get("operation") for h in sorted(t.history(), key=lambda h: h["version"])],
    "rows": [[r["order_id"], r["status"], r["occurred_at"].strftime("%H:%M")] for r in rows],
}))
sys.stdout.flush()
os._exit(0)
"#;

fn py_read(table: &Path, app_id: &str) -> Result<Value> {
    weir_tests::delta::py_json(PY_READER, table, &[app_id])
}

/// The table by the shared Python reader, with every row whole ([`py_rows`]).
fn py_read_all(table: &Path, app_id: &str) -> Result<Value> {
    weir_tests::delta::py_read(table, app_id, &[])
}

/// The table by our own reader: order_id → status.
fn own_statuses(table: &Path) -> Result<BTreeMap<i64, String>> {
    let (_, batches) = weir_host::source::delta::read_table(table)?;
    let mut out = BTreeMap::new();
    for b in &batches {
        let ids = b.column_by_name("order_id").context("order_id")?;
        let status = b.column_by_name("status").context("status")?;
        let ids = ids.as_primitive::<Int64Type>();
        let status = status.as_string::<i32>();
        for r in 0..b.num_rows() {
            let previous = out.insert(ids.value(r), status.value(r).to_owned());
            ensure!(
                previous.is_none(),
                "order {} is in the table twice",
                ids.value(r)
            );
        }
    }
    Ok(out)
}

fn query_id(checkpoint: &Path) -> Result<String> {
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(checkpoint.join("metadata"))?)?;
    meta["id"].as_str().map(str::to_owned).context("query id")
}

/// Writes one input file per batch: `(order_id, status, "HH:MM")` rows.
fn write_batches(dir: &Path, batches: &[&[(i64, &str, &str)]]) -> Result<()> {
    let data = dir.join("data");
    std::fs::create_dir_all(&data)?;
    for (i, rows) in batches.iter().enumerate() {
        let text: String = rows
            .iter()
            .map(|(id, status, at)| {
                format!(
                    "{{\"order_id\":{id},\"status\":\"{status}\",\"occurred_at\":\"2024-05-01T{at}:00Z\"}}\n"
                )
            })
            .collect();
        std::fs::write(data.join(format!("part-{i:03}.json")), text)?;
    }
    Ok(())
}

/// The query and its files source, shared by the built-in and the plugin sink's pipelines.
fn query_head(tag: &str) -> String {
    format!(
        r#"
[query]
name = "merge_{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"

[[source]]
name = "orders"
kind = "files"
path = "data"
format = "json"
schema = "order_id BIGINT, status STRING, occurred_at TIMESTAMP"
max_files_per_trigger = 1
"#
    )
}

fn pipeline(dir: &Path, tag: &str, sink_extra: &str) -> Result<PathBuf> {
    let text = format!(
        r#"{}
[sink]
kind = "delta-merge"
path = "tables/{tag}"
keys = ["order_id"]
{sink_extra}
"#,
        query_head(tag)
    );
    let file = dir.join(format!("{tag}.toml"));
    std::fs::write(&file, text)?;
    Ok(file)
}

const CONDITION: &str = "when_matched_update = \"s.occurred_at > t.occurred_at\"";

/// Three batches of upserts, and what the table holds after them.
const UPSERTS: [&[(i64, &str, &str)]; 3] = [
    &[
        (1, "new", "10:00"),
        (2, "new", "10:00"),
        (3, "new", "10:00"),
    ],
    // 1 is newer: updated; 2 is older than the table's row: left as it is; 4 is inserted.
    &[
        (1, "paid", "10:05"),
        (2, "stale", "09:00"),
        (4, "new", "10:01"),
    ],
    &[
        (3, "shipped", "10:10"),
        (5, "new", "10:02"),
        (4, "late", "10:01"),
    ],
];

fn expected() -> BTreeMap<i64, String> {
    [
        (1, "paid"),
        (2, "new"),
        (3, "shipped"),
        (4, "new"),
        (5, "new"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .collect()
}

fn python_expected() -> Value {
    serde_json::json!([
        [1, "paid", "10:05"],
        [2, "new", "10:00"],
        [3, "shipped", "10:10"],
        [4, "new", "10:01"],
        [5, "new", "10:02"]
    ])
}

#[test]
fn upserts_with_the_condition_keep_the_newest_row_and_python_reads_one_merge_per_batch()
-> Result<()> {
    let dir = tempfile::tempdir()?;
    write_batches(dir.path(), &UPSERTS)?;
    let file = pipeline(dir.path(), "q", CONDITION)?;
    run_ok(EXE, &cache(), &file, &[])?;
    let table = dir.path().join("tables/q");
    assert_eq!(own_statuses(&table)?, expected());
    let id = query_id(&dir.path().join("checkpoints/q"))?;
    let py = py_read(&table, &id)?;
    assert_eq!(py["rows"], python_expected());
    assert_eq!(py["txn"], 2);
    assert_eq!(
        py["operations"],
        serde_json::json!(["CREATE TABLE", "MERGE", "MERGE", "MERGE"])
    );
    // Batch 1 rewrote the file holding order 1: one remove, and its txn is the batch id.
    let log = std::fs::read_to_string(table.join("_delta_log/00000000000000000002.json"))?;
    let actions: Vec<Value> = log
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert_eq!(
        actions.iter().filter(|a| a.get("remove").is_some()).count(),
        1
    );
    let txn = actions.iter().find_map(|a| a.get("txn")).context("txn")?;
    assert_eq!(txn["appId"], id.as_str());
    assert_eq!(txn["version"], 1);

    // Nothing new: no batch, no commit.
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(py_read(&table, &id)?["version"], 3);
    Ok(())
}

#[test]
fn duplicate_keys_are_refused_with_delta_s_error_or_reduced_to_the_latest() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_batches(
        dir.path(),
        &[&[
            (7, "new", "10:00"),
            (8, "new", "10:00"),
            (7, "paid", "10:09"),
            (7, "old", "10:01"),
        ]],
    )?;
    let refused = pipeline(dir.path(), "refused", CONDITION)?;
    let out = weir(
        EXE,
        &cache(),
        &["run", refused.to_str().context("utf-8 path")?],
    )?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "batch 0: Cannot perform Merge as multiple source rows matched and attempted to modify the same target row in the Delta table in possibly conflicting ways. The key order_id=7 is in rows 0 and 2 of the batch"
        ),
        "{stderr}"
    );
    assert_eq!(
        commit_ids(&dir.path().join("checkpoints/refused"))?,
        Vec::<u64>::new()
    );

    let latest = pipeline(
        dir.path(),
        "latest",
        &format!("{CONDITION}\ndedup = \"latest-by:occurred_at\""),
    )?;
    run_ok(EXE, &cache(), &latest, &[])?;
    let table = dir.path().join("tables/latest");
    let rows = own_statuses(&table)?;
    assert_eq!(rows.get(&7).map(String::as_str), Some("paid"));
    assert_eq!(rows.get(&8).map(String::as_str), Some("new"));
    let py = py_read(&table, &query_id(&dir.path().join("checkpoints/latest"))?)?;
    assert_eq!(
        py["rows"],
        serde_json::json!([[7, "paid", "10:09"], [8, "new", "10:00"]])
    );
    Ok(())
}

#[test]
fn a_kill_before_or_after_the_delta_commit_neither_loses_nor_reapplies_the_batch() -> Result<()> {
    // The uninterrupted run: its rows, whole, by both readers, are what every killed and
    // restarted run must hold; how many there are is the model's (`expected`), not its own.
    let dir = tempfile::tempdir()?;
    write_batches(dir.path(), &UPSERTS)?;
    let file = pipeline(dir.path(), "reference", CONDITION)?;
    run_ok(EXE, &cache(), &file, &[])?;
    let table = dir.path().join("tables/reference");
    let id = query_id(&dir.path().join("checkpoints/reference"))?;
    let own_reference = own_rows(&table)?;
    assert_eq!(own_reference.len(), expected().len());
    let py_reference = py_rows(&py_read_all(&table, &id)?)?;
    same_rows(
        &py_reference,
        &own_reference,
        "the readers of the reference",
    )?;

    // Batch 0 creates the table (CREATE TABLE, then its MERGE), batch 1 merges into it.
    for killed in [0u64, 1] {
        for phase in ["in-sink", "before-commit"] {
            let tag = format!("{phase}-{killed}");
            let dir = tempfile::tempdir()?;
            // Applying the batch twice would show as a fourth MERGE in the table's history.
            write_batches(dir.path(), &UPSERTS)?;
            let file = pipeline(dir.path(), &tag, CONDITION)?;
            run_killed_at(EXE, &cache(), &file, &format!("{phase}@{killed}"))?;
            let checkpoint = dir.path().join("checkpoints").join(&tag);
            assert_eq!(
                commit_ids(&checkpoint)?,
                (0..killed).collect::<Vec<_>>(),
                "{tag}"
            );
            let table = dir.path().join("tables").join(&tag);
            let id = query_id(&checkpoint)?;
            let txn = &py_read(&table, &id)?["txn"];
            // Killed before the commit: the table holds the batches before the killed one (the
            // bare table for batch 0); killed after it: the killed batch too, which the
            // checkpoint does not know.
            let want = match phase {
                "in-sink" => killed.checked_sub(1),
                _ => Some(killed),
            };
            assert_eq!(txn, &serde_json::json!(want), "{tag}");
            let out = run_ok(EXE, &cache(), &file, &[])?;
            assert_eq!(own_statuses(&table)?, expected(), "{tag}");
            same_rows(
                &own_rows(&table)?,
                &own_reference,
                &format!("{tag}: own reader"),
            )?;
            let py = py_read(&table, &id)?;
            assert_eq!(py["rows"], python_expected(), "{tag}");
            same_rows(
                &py_rows(&py_read_all(&table, &id)?)?,
                &py_reference,
                &format!("{tag}: python reader"),
            )?;
            assert_eq!(
                py["operations"],
                serde_json::json!(["CREATE TABLE", "MERGE", "MERGE", "MERGE"]),
                "{tag}: one MERGE per batch"
            );
            assert_eq!(commit_ids(&checkpoint)?, vec![0, 1, 2]);
            if phase == "before-commit" {
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(
                    stderr.contains(&format!(
                        "batch {killed} is already merged into the Delta table: skipped"
                    )),
                    "{tag}: {stderr}"
                );
            }
        }
    }
    Ok(())
}

/// A foreachBatch sink (`plugins/merge_sink`) that drops cancelled orders and merges each batch
/// into the tables named in its config, through the host's `delta-merge` capability.
fn plugin_pipeline(dir: &Path, tag: &str, tables: &[&str], grants: &str) -> Result<PathBuf> {
    weir_host::examples::write_plugins(&dir.join("plugins"))?;
    let tables: Vec<String> = tables.iter().map(|t| format!("{t:?}")).collect();
    let text = format!(
        r#"{}
[sink]
kind = "plugin"
name = "merge_sink"
plugin = "plugins/merge_sink.wasm"
config = {{ tables = [{}], drop_statuses = ["cancelled"] }}
{grants}
"#,
        query_head(tag),
        tables.join(", ")
    );
    let file = dir.join(format!("{tag}.toml"));
    std::fs::write(&file, text)?;
    Ok(file)
}

const GRANTS: &str = r#"
[sink.capabilities.delta_merge.orders]
path = "tables/orders"
keys = ["order_id"]
when_matched_update = "s.occurred_at > t.occurred_at"

[sink.capabilities.delta_merge.history]
path = "tables/history"
keys = ["order_id", "status"]
"#;

#[test]
fn a_wasm_sink_merges_into_granted_tables_exactly_once_across_a_kill() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut batches: Vec<Vec<(i64, &str, &str)>> = UPSERTS.iter().map(|b| b.to_vec()).collect();
    // Dropped by the plugin before the merge.
    batches[1].push((6, "cancelled", "10:03"));
    let refs: Vec<&[(i64, &str, &str)]> = batches.iter().map(Vec::as_slice).collect();
    write_batches(dir.path(), &refs)?;
    let file = plugin_pipeline(dir.path(), "wasm", &["orders", "history"], GRANTS)?;
    // Killed after batch 1 was merged into both tables, before its commits/1.
    run_killed_at(EXE, &cache(), &file, "before-commit@1")?;
    let checkpoint = dir.path().join("checkpoints/wasm");
    assert_eq!(commit_ids(&checkpoint)?, vec![0]);
    let out = run_ok(EXE, &cache(), &file, &[])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("merge_sink: batch 1 into orders: 0 updated, 0 inserted (already merged)"),
        "{stderr}"
    );
    assert_eq!(commit_ids(&checkpoint)?, vec![0, 1, 2]);

    let id = query_id(&checkpoint)?;
    let orders = dir.path().join("tables/orders");
    assert_eq!(own_statuses(&orders)?, expected());
    let py = py_read(&orders, &format!("{id}/orders"))?;
    assert_eq!(py["rows"], python_expected());
    assert_eq!(py["txn"], 2);
    assert_eq!(
        py["operations"],
        serde_json::json!(["CREATE TABLE", "MERGE", "MERGE", "MERGE"])
    );
    // Keyed by (order_id, status): every distinct pair once, no cancelled order.
    let history = py_read(&dir.path().join("tables/history"), &format!("{id}/history"))?;
    let pairs: Vec<(i64, String)> = history["rows"]
        .as_array()
        .context("rows")?
        .iter()
        .map(|r| {
            (
                r[0].as_i64().unwrap_or(-1),
                r[1].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let mut want: Vec<(i64, String)> = UPSERTS
        .iter()
        .flat_map(|b| b.iter().map(|(id, s, _)| (*id, (*s).to_owned())))
        .collect();
    want.sort();
    let mut got = pairs;
    got.sort();
    assert_eq!(got, want);
    assert_eq!(history["txn"], 2);
    Ok(())
}

#[test]
fn a_wasm_sink_without_the_grant_is_refused_naming_the_plugin() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_batches(dir.path(), &UPSERTS[..1])?;
    // No table granted at all: refused before the first batch.
    let none = plugin_pipeline(dir.path(), "none", &["orders"], "")?;
    let out = weir(
        EXE,
        &cache(),
        &["run", none.to_str().context("utf-8 path")?],
    )?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("merge_sink"), "{stderr}");
    assert!(
        stderr.contains(
            "it imports weir:plugin/delta-merge@0.1.0 but the pipeline file grants it no table"
        ),
        "{stderr}"
    );
    // A table asked for that is not granted: the batch fails, naming plugin and table.
    let other = plugin_pipeline(
        dir.path(),
        "other",
        &["secret"],
        "[sink.capabilities.delta_merge.orders]\npath = \"tables/o\"\nkeys = [\"order_id\"]\n",
    )?;
    let out = weir(
        EXE,
        &cache(),
        &["run", other.to_str().context("utf-8 path")?],
    )?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "plugin merge_sink failed batch 0 (fatal): delta-merge into table \"secret\" is not granted to plugin merge_sink (granted: [orders])"
        ),
        "{stderr}"
    );
    assert!(!dir.path().join("tables/o").exists());
    Ok(())
}
