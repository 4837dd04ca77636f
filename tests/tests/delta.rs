//! Files → Weir → Delta Lake, end to end through the `weir` binary: one Delta commit per batch
//! with its txn action, replays recognised and skipped, SIGKILL at every phase of the first
//! batch (which creates the table) and of a later one, and `commit_every`. Every table is read
//! twice: by our own reader (`weir_host::source::delta`) and by an independent one, the Python
//! `deltalake` package (`.ci/run` installs it; see [`weir_tests::delta::python`]), and must hold
//! an uninterrupted run's rows with every column; how many rows that run keeps is the data
//! generator's count.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use weir_host::failpoint::Phase;
use weir_tests::delta::{commits, own_ids, own_rows, py_read, py_rows, txn_of};
use weir_tests::{
    SCHEMA, Workspace, commit_ids, files_sink, json_rows, orders_pipeline, query_id, run_killed_at,
    run_ok, same_rows, sorted_output, weir,
};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn delta_sink(tag: &str, extra: &str) -> String {
    format!("[sink]\nkind = \"delta\"\npath = \"tables/{tag}\"\n{extra}")
}

/// What an uninterrupted run keeps (completed orders), from a files sink: every row whole, in
/// the canonical form of [`weir_tests::canonical_rows`], and the order ids. How many rows that
/// is comes from the generator, not from this run.
struct Reference {
    rows: Vec<Value>,
    ids: Vec<i64>,
}

fn reference(ws: &Workspace) -> Result<Reference> {
    let file = ws.pipeline(
        "reference.toml",
        &orders_pipeline("reference", "drop", &files_sink("reference")),
    )?;
    run_ok(EXE, &cache(), &file, &[])?;
    let lines = sorted_output(&ws.path().join("out/reference"))?;
    ensure!(
        lines.len() as u64 == ws.orders.by_status[0],
        "the reference holds {} rows, the generator wrote {} valid completed orders",
        lines.len(),
        ws.orders.by_status[0]
    );
    let rows = json_rows(&lines, SCHEMA)?;
    let mut ids = rows
        .iter()
        .map(|r| r["order_id"].as_i64().context("order_id"))
        .collect::<Result<Vec<i64>>>()?;
    ids.sort_unstable();
    ensure!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "an order twice in the reference"
    );
    Ok(Reference { rows, ids })
}

/// Both readers find exactly the reference's rows, whole, in `table`; returns what the Python
/// reader said (for its txn version and history).
fn assert_rows(table: &Path, id: &str, reference: &Reference, what: &str) -> Result<Value> {
    same_rows(
        &own_rows(table)?,
        &reference.rows,
        &format!("{what}: own reader"),
    )?;
    let py = py_read(table, id, &[])?;
    same_rows(
        &py_rows(&py)?,
        &reference.rows,
        &format!("{what}: python reader"),
    )?;
    Ok(py)
}

/// The txn version of every commit after the first (`CREATE TABLE`, which has none); empty
/// when the table does not exist.
fn txn_versions(table: &Path) -> Result<Vec<Option<i64>>> {
    let log = commits(table)?;
    if let Some(create) = log.first() {
        ensure!(
            txn_of(create).is_none(),
            "{}: the first commit has a txn",
            table.display()
        );
    }
    Ok(log.iter().skip(1).map(|c| txn_of(c).map(|t| t.1)).collect())
}

#[test]
fn each_batch_is_one_streaming_update_commit_with_its_txn_and_python_reads_it() -> Result<()> {
    let ws = Workspace::new(3, 300)?;
    let reference = reference(&ws)?;
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

    let py = assert_rows(&table, &id, &reference, "q")?;
    assert_eq!(py["version"], 3);
    assert_eq!(py["rows"], reference.rows.len());
    assert_eq!(py["txn"], 2);
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
    let reference = reference(&ws)?;
    let all: Vec<u64> = (0..4).collect();
    // Batch 0 creates the table (its first commit) and makes the first batch commit; batch 2
    // appends to a table that has some.
    for killed in [0u64, 2] {
        for (phase, _) in Phase::ALL {
            let tag = format!("{phase}-{killed}");
            let file = ws.pipeline(
                &format!("{tag}.toml"),
                &orders_pipeline(&tag, "drop", &delta_sink(&tag, "")),
            )?;
            run_killed_at(EXE, &cache(), &file, &format!("{phase}@{killed}"))?;
            let checkpoint = ws.path().join("checkpoints").join(&tag);
            assert_eq!(commit_ids(&checkpoint)?, all[..killed as usize], "{tag}");
            let table = ws.path().join("tables").join(&tag);
            // Only a kill after the sink committed leaves the killed batch in the table.
            let in_table = if phase == "before-commit" {
                killed + 1
            } else {
                killed
            };
            assert_eq!(
                txn_versions(&table)?,
                (0..in_table as i64).map(Some).collect::<Vec<_>>(),
                "{tag}: Delta commits after the crash"
            );
            // The table is created by the sink's first write: a kill before it leaves none,
            // a kill in it leaves the bare table.
            let created = !(killed == 0 && ["after-offsets", "in-transform"].contains(&phase));
            assert_eq!(
                table.join("_delta_log").exists(),
                created,
                "{tag}: the table after the crash"
            );

            let out = run_ok(EXE, &cache(), &file, &[])?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                stderr.contains(&format!(
                    "batch {killed} is already in the Delta table: skipped"
                )),
                phase == "before-commit",
                "{tag}: {stderr}"
            );
            assert_eq!(commit_ids(&checkpoint)?, all, "{tag}");
            assert_eq!(
                txn_versions(&table)?,
                all.iter().map(|b| Some(*b as i64)).collect::<Vec<_>>(),
                "{tag}: one commit per batch, the replay skipped or redone once"
            );
            let id = query_id(&checkpoint)?;
            let py = assert_rows(&table, &id, &reference, &tag)?;
            assert_eq!(py["txn"], 3, "{tag}");
            assert_eq!(
                py["version"], 4,
                "{tag}: the create commit and one per batch"
            );
        }
    }
    Ok(())
}

#[test]
fn commit_every_groups_batches_and_stays_exactly_once_across_crashes() -> Result<()> {
    let ws = Workspace::new(5, 150)?;
    let reference = reference(&ws)?;
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
    let id = query_id(&ws.path().join("checkpoints/grouped"))?;
    assert_rows(&table, &id, &reference, "grouped")?;
    let pending = ws.path().join("checkpoints/grouped/sinks/delta/pending");
    assert_eq!(
        std::fs::read_dir(&pending)?.count(),
        0,
        "nothing left pending"
    );

    // Killed while batch 0 (which created the table) or batch 2 is pending (written, listed,
    // its commits/N missing), before batch 0 ran, and while batch 3 (the committing one) has
    // written its files but not committed them.
    for (tag, failpoint) in [
        ("first", "after-offsets@0"),
        ("pend0", "before-commit@0"),
        ("pend", "before-commit@2"),
        ("commit", "in-sink@3"),
    ] {
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
        let id = query_id(&ws.path().join("checkpoints").join(tag))?;
        assert_rows(&table, &id, &reference, tag)?;
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
    let reference = reference(&ws)?;
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
    let silver_id = query_id(&ws.path().join("checkpoints/silver"))?;
    assert_rows(
        &ws.path().join("tables/silver"),
        &silver_id,
        &reference,
        "silver",
    )?;
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
    assert_eq!(py["orders"], serde_json::json!([reference.ids.len()]));

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
        reference.ids.len() + extra.by_status[0] as usize
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
