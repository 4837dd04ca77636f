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

use weir_tests::query_id;

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

/// Delta's `whenMatchedDelete(c1).whenMatchedUpdateAll(c2).whenNotMatchedInsertAll(c3)`, each
/// condition SQL: a cancellation deletes the row, an older row never overwrites a newer one, and
/// only orders with a status other than `draft` are inserted.
#[test]
fn delete_update_and_insert_conditions_apply_in_delta_s_order() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_batches(
        dir.path(),
        &[
            &[
                (1, "new", "10:00"),
                (2, "new", "10:00"),
                (3, "draft", "10:00"),
                (4, "new", "10:00"),
            ],
            // 1: cancelled and newer, deleted; 2: cancelled but older, the delete does not hold
            // and neither does the update; 3 and 5: drafts, not inserted; 4: a newer status in
            // upper case, updated; 6: inserted.
            &[
                (1, "cancelled", "10:05"),
                (2, "CANCELLED", "09:00"),
                (3, "draft", "10:05"),
                (4, "PAID", "10:05"),
                (5, "draft", "10:05"),
                (6, "new", "10:05"),
            ],
        ],
    )?;
    let conditions = r#"
when_matched_delete = "lower(s.status) = 'cancelled' AND s.occurred_at > t.occurred_at"
when_matched_update = "s.occurred_at > t.occurred_at"
when_not_matched_insert = "s.status NOT IN ('draft')"
"#;
    let file = pipeline(dir.path(), "clauses", conditions)?;
    run_ok(EXE, &cache(), &file, &[])?;
    let table = dir.path().join("tables/clauses");
    let want: BTreeMap<i64, String> = [(2, "new"), (4, "PAID"), (6, "new")]
        .into_iter()
        .map(|(k, v)| (k, v.to_owned()))
        .collect();
    assert_eq!(own_statuses(&table)?, want);
    let id = query_id(&dir.path().join("checkpoints/clauses"))?;
    let py = py_read(&table, &id)?;
    assert_eq!(
        py["rows"],
        serde_json::json!([
            [2, "new", "10:00"],
            [4, "PAID", "10:05"],
            [6, "new", "10:05"]
        ])
    );
    assert_eq!(
        py["operations"],
        serde_json::json!(["CREATE TABLE", "MERGE", "MERGE"])
    );
    // The commit names its clauses as Delta's MERGE does.
    let log = std::fs::read_to_string(table.join("_delta_log/00000000000000000002.json"))?;
    let info: Value = log
        .lines()
        .map(serde_json::from_str::<Value>)
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .find_map(|a| a.get("commitInfo").cloned())
        .context("commitInfo")?;
    let parameters = info["operationParameters"].to_string();
    for clause in [
        "lower(s.status) = 'cancelled' AND s.occurred_at > t.occurred_at",
        "s.status NOT IN ('draft')",
        "delete",
        "insert",
    ] {
        assert!(parameters.contains(clause), "{clause}: {parameters}");
    }

    // A condition that does not plan against the batch stops the batch, naming the column.
    let typo = pipeline(
        dir.path(),
        "typo",
        "when_matched_delete = \"s.stauts = 'cancelled'\"",
    )?;
    let out = weir(
        EXE,
        &cache(),
        &["run", typo.to_str().context("utf-8 path")?],
    )?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no column \"s.stauts\" (did you mean s.status?)"),
        "{stderr}"
    );
    assert_eq!(
        commit_ids(&dir.path().join("checkpoints/typo"))?,
        Vec::<u64>::new()
    );
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
    language_plugin_pipeline(dir, tag, "plugins/merge_sink.wasm", tables, grants)
}

/// [`plugin_pipeline`] with the merge_sink of any language at `plugin`.
fn language_plugin_pipeline(
    dir: &Path,
    tag: &str,
    plugin: &str,
    tables: &[&str],
    grants: &str,
) -> Result<PathBuf> {
    weir_host::examples::write_plugins(&dir.join("plugins"))?;
    let tables: Vec<String> = tables.iter().map(|t| format!("{t:?}")).collect();
    let text = format!(
        r#"{}
[sink]
kind = "plugin"
name = "merge_sink"
plugin = "{plugin}"
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
    // The same plugin in Rust, Python and JavaScript: the same tables, logs and txns.
    for plugin in [
        "plugins/merge_sink.wasm",
        weir_tests::PYTHON_MERGE_SINK,
        weir_tests::JS_MERGE_SINK,
    ] {
        merges_exactly_once_across_a_kill(plugin)
            .with_context(|| format!("merge_sink {plugin}"))?;
    }
    Ok(())
}

fn merges_exactly_once_across_a_kill(plugin: &str) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut batches: Vec<Vec<(i64, &str, &str)>> = UPSERTS.iter().map(|b| b.to_vec()).collect();
    // Dropped by the plugin before the merge.
    batches[1].push((6, "cancelled", "10:03"));
    let refs: Vec<&[(i64, &str, &str)]> = batches.iter().map(Vec::as_slice).collect();
    write_batches(dir.path(), &refs)?;
    let file =
        language_plugin_pipeline(dir.path(), "wasm", plugin, &["orders", "history"], GRANTS)?;
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

/// How many orders the time-limit test merges per batch: enough that merging a batch of updates
/// into a table of as many rows (reading its keys, rewriting its file) takes far longer than the
/// sink's time limit, while the sink itself only hands the batch to the host.
const SLOW_MERGE_ROWS: i64 = 200_000;

/// The plugin sink merging every batch into the granted table `orders`, whole (no status
/// dropped, so the plugin reads no column before it calls `delta-merge`), under `timeout`.
fn timed_plugin_pipeline(dir: &Path, tag: &str, timeout: &str) -> Result<PathBuf> {
    weir_host::examples::write_plugins(&dir.join("plugins"))?;
    let text = format!(
        r#"{}
[sink]
kind = "plugin"
name = "merge_sink"
plugin = "plugins/merge_sink.wasm"
config = {{ tables = ["orders"] }}
limits = {{ timeout = "{timeout}" }}

[sink.capabilities.delta_merge.orders]
path = "tables/orders"
keys = ["order_id"]
when_matched_update = "s.occurred_at > t.occurred_at"
"#,
        query_head(tag)
    );
    let file = dir.join(format!("{tag}.toml"));
    std::fs::write(&file, text)?;
    Ok(file)
}

#[test]
fn a_wasm_sink_s_merge_past_its_time_limit_fails_the_batch_naming_the_plugin() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let checkpoint = dir.path().join("checkpoints/slow");
    let table = dir.path().join("tables/orders");
    // Batch 0, under the default limit: the table gets its 200,000 orders.
    let created: Vec<(i64, &str, &str)> = (0..SLOW_MERGE_ROWS)
        .map(|id| (id, "new", "10:00"))
        .collect();
    write_batches(dir.path(), &[created.as_slice()])?;
    let file = timed_plugin_pipeline(dir.path(), "slow", "30s")?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(commit_ids(&checkpoint)?, vec![0]);

    // Batch 1 updates every one of them: the host's MERGE reads the table and rewrites its
    // file, which takes far longer than 50 ms.
    let updated: Vec<(i64, &str, &str)> = (0..SLOW_MERGE_ROWS)
        .map(|id| (id, "paid", "10:05"))
        .collect();
    let later = tempfile::tempdir()?;
    write_batches(later.path(), &[updated.as_slice()])?;
    std::fs::copy(
        later.path().join("data/part-000.json"),
        dir.path().join("data/part-001.json"),
    )?;
    let file = timed_plugin_pipeline(dir.path(), "slow", "50ms")?;
    let out = weir(
        EXE,
        &cache(),
        &["run", file.to_str().context("utf-8 path")?],
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("plugin merge_sink exceeded its time limit of 50 ms in batch 1"),
        "{stderr}"
    );
    // It was the host's merge the limit ended, not the plugin's own code.
    let waited: Vec<&str> = stderr
        .lines()
        .filter(|l| {
            l.contains("the time limit passed while the plugin waited in delta-merge.merge")
        })
        .collect();
    assert!(
        !waited.is_empty(),
        "the call the limit ended is logged: {stderr}"
    );
    assert!(
        waited
            .iter()
            .all(|l| l.contains("merge_sink") && l.contains("batch_id=1")),
        "{waited:?}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        commit_ids(&checkpoint)?,
        vec![0],
        "batch 1 is not committed"
    );

    // With time enough, batch 1 runs again: every order updated, once (a merge that outlasted
    // the failed call and committed is skipped by its txn).
    let file = timed_plugin_pipeline(dir.path(), "slow", "30s")?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(commit_ids(&checkpoint)?, vec![0, 1]);
    let statuses = own_statuses(&table)?;
    assert_eq!(statuses.len(), usize::try_from(SLOW_MERGE_ROWS)?);
    assert!(
        statuses.values().all(|s| s == "paid"),
        "every order is updated"
    );
    Ok(())
}
