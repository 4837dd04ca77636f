//! Files → Weir → Delta Lake, end to end through the `weir` binary: one Delta commit per batch
//! with its txn action, replays recognised and skipped, SIGKILL at every phase of a batch, and
//! `commit_every`. Every table is read twice: by our own reader (`weir_host::source::delta`) and
//! by an independent one, the Python `deltalake` package (`.ci/run` installs it; see
//! [`weir_tests::delta::python`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;
use weir_tests::delta::{commits, own_ids, py_read, txn_of};
use weir_tests::{Workspace, log_ids, orders_pipeline, run_killed_at, run_ok, weir};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn query_id(checkpoint: &Path) -> Result<String> {
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(checkpoint.join("metadata"))?)?;
    meta["id"].as_str().map(str::to_owned).context("query id")
}

fn delta_sink(tag: &str, extra: &str) -> String {
    format!("[sink]\nkind = \"delta\"\npath = \"tables/{tag}\"\n{extra}")
}

/// The order ids an uninterrupted run keeps (completed orders), from a files sink.
fn reference_ids(ws: &Workspace) -> Result<Vec<i64>> {
    let file = ws.pipeline(
        "reference.toml",
        &orders_pipeline(
            "reference",
            "drop",
            "[sink]\nkind = \"files\"\npath = \"out/reference\"\nformat = \"json\"\n",
        ),
    )?;
    run_ok(EXE, &cache(), &file, &[])?;
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(ws.path().join("out/reference"))? {
        for line in std::fs::read_to_string(entry?.path())?.lines() {
            let v: Value = serde_json::from_str(line)?;
            ids.push(v["order_id"].as_i64().context("order_id")?);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

#[test]
fn each_batch_is_one_streaming_update_commit_with_its_txn_and_python_reads_it() -> Result<()> {
    let ws = Workspace::new(3, 300)?;
    let reference = reference_ids(&ws)?;
    assert_eq!(reference.len() as u64, ws.orders.by_status[0]);
    let file = ws.pipeline(
        "q.toml",
        &orders_pipeline("q", "drop", &delta_sink("q", "")),
    )?;
    run_ok(EXE, &cache(), &file, &[])?;
    let table = ws.path().join("tables/q");
    let id = query_id(&ws.path().join("checkpoints/q"))?;

    let log = commits(&table)?;
    assert_eq!(log.len(), 4, "the create commit and one commit per batch");
    for (batch, actions) in log[1..].iter().enumerate() {
        assert_eq!(
            txn_of(actions),
            Some((id.clone(), batch as i64)),
            "commit {}",
            batch + 1
        );
        let info = actions
            .iter()
            .find_map(|a| a.get("commitInfo"))
            .context("commitInfo")?;
        assert_eq!(info["operation"], "STREAMING UPDATE");
        let params = &info["operationParameters"];
        assert_eq!(params["outputMode"], "Append", "{params}");
        assert_eq!(params["queryId"], id.as_str(), "{params}");
        assert_eq!(params["epochId"], batch.to_string().as_str(), "{params}");
        assert!(actions.iter().any(|a| a.get("add").is_some()));
    }

    assert_eq!(own_ids(&table, "order_id")?, reference);
    let py = py_read(&table, &id, &["order_id"])?;
    assert_eq!(py["version"], 3);
    assert_eq!(py["rows"], reference.len());
    assert_eq!(py["txn"], 2);
    let mut py_ids: Vec<i64> = serde_json::from_value(py["order_id"].clone())?;
    py_ids.sort_unstable();
    assert_eq!(py_ids, reference);
    assert_eq!(
        py["columns"],
        serde_json::json!([
            "order_id",
            "customer_id",
            "status",
            "amount",
            "occurred_at",
            "session_id"
        ])
    );
    assert_eq!(
        py["types"],
        serde_json::json!([
            "int64",
            "int64",
            "string",
            "decimal128(12, 2)",
            "timestamp[us, tz=UTC]",
            "string"
        ])
    );
    assert_eq!(
        py["operations"],
        serde_json::json!([
            "CREATE TABLE",
            "STREAMING UPDATE",
            "STREAMING UPDATE",
            "STREAMING UPDATE"
        ])
    );

    // Nothing new: no batch, no commit.
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(commits(&table)?.len(), 4);
    Ok(())
}

#[test]
fn a_crash_at_any_phase_then_a_restart_loses_and_duplicates_nothing() -> Result<()> {
    let ws = Workspace::new(4, 200)?;
    let reference = reference_ids(&ws)?;
    for phase in ["after-offsets", "in-transform", "in-sink", "before-commit"] {
        let file = ws.pipeline(
            &format!("{phase}.toml"),
            &orders_pipeline(phase, "drop", &delta_sink(phase, "")),
        )?;
        run_killed_at(EXE, &cache(), &file, &format!("{phase}@2"))?;
        let checkpoint = ws.path().join("checkpoints").join(phase);
        assert_eq!(log_ids(&checkpoint.join("commits"))?, vec![0, 1], "{phase}");
        let table = ws.path().join("tables").join(phase);
        let id = query_id(&checkpoint)?;
        let before: Vec<Option<(String, i64)>> =
            commits(&table)?.iter().map(|c| txn_of(c)).collect();
        let expected_txns: Vec<i64> = if phase == "before-commit" {
            vec![0, 1, 2]
        } else {
            vec![0, 1]
        };
        assert_eq!(
            before[1..]
                .iter()
                .map(|t| t.as_ref().map(|t| t.1))
                .collect::<Vec<_>>(),
            expected_txns.iter().map(|v| Some(*v)).collect::<Vec<_>>(),
            "{phase}: Delta commits after the crash"
        );

        run_ok(EXE, &cache(), &file, &[])?;
        assert_eq!(
            log_ids(&checkpoint.join("commits"))?,
            vec![0, 1, 2, 3],
            "{phase}"
        );
        let log = commits(&table)?;
        let txns: Vec<i64> = log[1..]
            .iter()
            .filter_map(|c| txn_of(c))
            .map(|t| t.1)
            .collect();
        assert_eq!(
            txns,
            vec![0, 1, 2, 3],
            "{phase}: one commit per batch, the replay skipped or redone once"
        );
        assert_eq!(
            own_ids(&table, "order_id")?,
            reference,
            "{phase}: own reader"
        );
        let py = py_read(&table, &id, &["order_id"])?;
        let mut py_ids: Vec<i64> = serde_json::from_value(py["order_id"].clone())?;
        py_ids.sort_unstable();
        assert_eq!(py_ids, reference, "{phase}: python reader");
        assert_eq!(py["txn"], 3, "{phase}");
    }
    Ok(())
}

#[test]
fn commit_every_groups_batches_and_stays_exactly_once_across_crashes() -> Result<()> {
    let ws = Workspace::new(5, 150)?;
    let reference = reference_ids(&ws)?;
    let sink = |tag: &str| delta_sink(tag, "commit_every = 2\ntarget_file_size = \"1 MiB\"\n");

    // Uninterrupted: batches 0..4 in commits for batches 1 and 3, then the stop commits 4.
    let file = ws.pipeline(
        "grouped.toml",
        &orders_pipeline("grouped", "drop", &sink("grouped")),
    )?;
    run_ok(EXE, &cache(), &file, &[])?;
    let table = ws.path().join("tables/grouped");
    let txns: Vec<i64> = commits(&table)?[1..]
        .iter()
        .filter_map(|c| txn_of(c))
        .map(|t| t.1)
        .collect();
    assert_eq!(txns, vec![1, 3, 4]);
    assert_eq!(own_ids(&table, "order_id")?, reference);
    let pending = ws.path().join("checkpoints/grouped/sinks/delta/pending");
    assert_eq!(
        std::fs::read_dir(&pending)?.count(),
        0,
        "nothing left pending"
    );

    // Killed while batch 2 is pending (written, listed, commits/2 missing), and while batch 3
    // (the committing one) has written its files but not committed them.
    for (tag, failpoint) in [("pend", "before-commit@2"), ("commit", "in-sink@3")] {
        let file = ws.pipeline(
            &format!("{tag}.toml"),
            &orders_pipeline(tag, "drop", &sink(tag)),
        )?;
        run_killed_at(EXE, &cache(), &file, failpoint)?;
        run_ok(EXE, &cache(), &file, &[])?;
        let table = ws.path().join("tables").join(tag);
        let txns: Vec<i64> = commits(&table)?[1..]
            .iter()
            .filter_map(|c| txn_of(c))
            .map(|t| t.1)
            .collect();
        assert_eq!(txns, vec![1, 3, 4], "{tag}");
        assert_eq!(own_ids(&table, "order_id")?, reference, "{tag}: own reader");
        let id = query_id(&ws.path().join("checkpoints").join(tag))?;
        let py = py_read(&table, &id, &["order_id"])?;
        let mut py_ids: Vec<i64> = serde_json::from_value(py["order_id"].clone())?;
        py_ids.sort_unstable();
        assert_eq!(py_ids, reference, "{tag}: python reader");
    }
    Ok(())
}

#[test]
fn partition_by_writes_hive_folders_that_python_reads_back() -> Result<()> {
    let ws = Workspace::new(2, 200)?;
    let text = orders_pipeline(
        "parts",
        "drop",
        &delta_sink("parts", "partition_by = [\"status\"]\n"),
    )
    .replace(
        "[[transform]]\nname = \"keep_completed\"",
        "[[transform]]\nname = \"keep_all\"",
    )
    .replace(
        "op = \"eq\", value = \"completed\"",
        "op = \"ne\", value = \"nothing\"",
    );
    let file = ws.pipeline("parts.toml", &text)?;
    run_ok(EXE, &cache(), &file, &[])?;
    let table = ws.path().join("tables/parts");
    let folders: BTreeSet<String> = std::fs::read_dir(&table)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("status="))
        .collect();
    assert!(folders.contains("status=completed"), "{folders:?}");
    let id = query_id(&ws.path().join("checkpoints/parts"))?;
    let py = py_read(&table, &id, &["status"])?;
    assert_eq!(py["partition_columns"], serde_json::json!(["status"]));
    let statuses: Vec<Option<String>> = serde_json::from_value(py["status"].clone())?;
    let completed = statuses
        .iter()
        .filter(|s| s.as_deref() == Some("completed"))
        .count();
    assert_eq!(completed as u64, ws.orders.by_status[0]);
    assert_eq!(own_ids(&table, "order_id")?.len(), statuses.len());
    Ok(())
}

#[test]
fn complete_mode_replaces_the_table_every_batch() -> Result<()> {
    let ws = Workspace::new(3, 200)?;
    let text = orders_pipeline("agg", "drop", "[aggregate]\ngroup_by = [\"status\"]\nselect = [\"count(*) AS orders\"]\n\n[sink]\nkind = \"delta\"\npath = \"tables/agg\"\n")
        .replace("trigger = \"available-now\"", "trigger = \"available-now\"\noutput_mode = \"complete\"");
    let file = ws.pipeline("agg.toml", &text)?;
    run_ok(EXE, &cache(), &file, &[])?;
    let table = ws.path().join("tables/agg");
    let log = commits(&table)?;
    assert_eq!(log.len(), 4);
    for (batch, actions) in log[2..].iter().enumerate() {
        assert!(
            actions.iter().any(|a| a.get("remove").is_some()),
            "commit of batch {} removes the previous output",
            batch + 1
        );
        let info = actions
            .iter()
            .find_map(|a| a.get("commitInfo"))
            .context("commitInfo")?;
        assert_eq!(info["operationParameters"]["outputMode"], "Complete");
    }
    let id = query_id(&ws.path().join("checkpoints/agg"))?;
    let py = py_read(&table, &id, &["status", "orders"])?;
    // Only completed orders pass the filter: one group holding them all.
    assert_eq!(py["rows"], 1, "{py}");
    assert_eq!(py["orders"], serde_json::json!([ws.orders.by_status[0]]));
    assert_eq!(py["txn"], 2);
    Ok(())
}

/// A pipeline reading the Delta table `from` and writing `sink`, with `middle` in between.
fn delta_pipeline(tag: &str, from: &str, source_extra: &str, middle: &str, sink: &str) -> String {
    format!(
        r#"
[query]
name = "{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"

[[source]]
name = "{from}"
kind = "delta"
path = "tables/{from}"
{source_extra}

{middle}

{sink}
"#
    )
}

const KEEP_COMPLETED: &str = "[[transform]]\nname = \"keep_completed\"\nplugin = \"plugins/filter_rows.wasm\"\nconfig = { column = \"status\", op = \"eq\", value = \"completed\" }\n";

#[test]
fn bronze_silver_gold_chain_through_delta_tables() -> Result<()> {
    let ws = Workspace::new(3, 200)?;
    let reference = reference_ids(&ws)?;
    // Bronze: every valid order, statuses normalised.
    let bronze = orders_pipeline("bronze", "drop", &delta_sink("bronze", "")).replace(
        "op = \"eq\", value = \"completed\"",
        "op = \"ne\", value = \"nothing\"",
    );
    let bronze = ws.pipeline("bronze.toml", &bronze)?;
    run_ok(EXE, &cache(), &bronze, &[])?;
    // Silver: the completed ones, one bronze file per batch.
    let silver = ws.pipeline(
        "silver.toml",
        &delta_pipeline(
            "silver",
            "bronze",
            "max_files_per_trigger = 1",
            KEEP_COMPLETED,
            &delta_sink("silver", ""),
        ),
    )?;
    run_ok(EXE, &cache(), &silver, &[])?;
    assert_eq!(
        own_ids(&ws.path().join("tables/silver"), "order_id")?,
        reference
    );
    let silver_commits = commits(&ws.path().join("tables/silver"))?;
    assert_eq!(
        silver_commits.len(),
        4,
        "bronze has 3 files: 3 silver batches"
    );
    let offsets = std::fs::read_to_string(ws.path().join("checkpoints/silver/sources/0/2"))?;
    assert!(
        offsets.contains("\"version\":3"),
        "the source log names the table version: {offsets}"
    );
    // Gold: revenue by status, the whole table rewritten each batch.
    let gold = ws.pipeline(
        "gold.toml",
        &delta_pipeline(
            "gold",
            "silver",
            "",
            "[aggregate]\ngroup_by = [\"status\"]\nselect = [\"count(*) AS orders\", \"sum(amount) AS revenue\"]\n",
            &delta_sink("gold", ""),
        )
        .replace("trigger = \"available-now\"", "trigger = \"available-now\"\noutput_mode = \"complete\""),
    )?;
    run_ok(EXE, &cache(), &gold, &[])?;
    let id = query_id(&ws.path().join("checkpoints/gold"))?;
    let py = py_read(&ws.path().join("tables/gold"), &id, &["status", "orders"])?;
    assert_eq!(py["status"], serde_json::json!(["completed"]));
    assert_eq!(py["orders"], serde_json::json!([reference.len()]));

    // New data flows through: one more file into bronze, then silver and gold again.
    let more = tempfile::tempdir()?;
    let extra = weir_host::examples::write_orders(
        more.path(),
        weir_tests::OrdersSpec {
            files: 1,
            lines_per_file: 100,
            seed: 99,
            malformed_every: 0,
        },
    )?;
    std::fs::copy(
        more.path().join("orders-00000.json"),
        ws.path().join("data/orders/late.json"),
    )?;
    run_ok(EXE, &cache(), &bronze, &[])?;
    run_ok(EXE, &cache(), &silver, &[])?;
    run_ok(EXE, &cache(), &gold, &[])?;
    let silver_ids = own_ids(&ws.path().join("tables/silver"), "order_id")?;
    assert_eq!(
        silver_ids.len(),
        reference.len() + extra.by_status[0] as usize
    );
    // (The late file's order ids restart at 1, so ids are not unique: count rows.)
    let py = py_read(&ws.path().join("tables/gold"), &id, &["orders"])?;
    assert_eq!(py["orders"], serde_json::json!([silver_ids.len()]));
    Ok(())
}

#[test]
fn a_delta_source_refuses_a_version_that_removes_data() -> Result<()> {
    let ws = Workspace::new(2, 100)?;
    // A complete-mode table: its second batch's commit removes the first one's file.
    let text = orders_pipeline("agg", "drop", "[aggregate]\ngroup_by = [\"status\"]\nselect = [\"count(*) AS orders\"]\n\n[sink]\nkind = \"delta\"\npath = \"tables/agg\"\n")
        .replace("trigger = \"available-now\"", "trigger = \"available-now\"\noutput_mode = \"complete\"");
    run_ok(EXE, &cache(), &ws.pipeline("agg.toml", &text)?, &[])?;
    let reader = ws.pipeline(
        "reader.toml",
        &delta_pipeline(
            "reader",
            "agg",
            "starting_version = 0",
            "",
            &delta_sink("copy", ""),
        ),
    )?;
    let out = weir(EXE, &cache(), &["run", reader.to_str().unwrap_or_default()])?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("version 2 removes data (STREAMING UPDATE")
            && stderr.contains("a delta source reads append-only tables"),
        "{stderr}"
    );
    Ok(())
}
