//! Stateful Wasm transforms (`plugins/running_total`, world
//! `stateful-transform`): keyed state stored in the query's state stores and
//! versioned with the batch, so totals carry across batches, restarts and
//! crashes exactly, and expire by the watermark.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use weir_host::query::{Query, QueryOptions, RunSummary};
use weir_tests::{commit_ids, offset_ids, run_killed_at, run_ok};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

const SCHEMA: &str =
    "order_id BIGINT, customer_id BIGINT, amount DECIMAL(12,2), occurred_at TIMESTAMP";

/// One order: (order id, customer, cents, event time as RFC 3339).
type Order = (u64, i64, i64, String);

/// `files` files of `lines` orders of five customers, one minute of event time per file.
fn orders(files: usize, lines: usize) -> Vec<Vec<Order>> {
    (0..files)
        .map(|f| {
            (0..lines)
                .map(|i| {
                    let id = (f * lines + i) as u64;
                    let customer = ((i * 7 + f * 3) % 5 + 1) as i64;
                    let cents = 100 + ((id * 37) % 900) as i64;
                    let at = format!("2024-03-01T10:{f:02}:{:02}Z", i % 60);
                    (id, customer, cents, at)
                })
                .collect()
        })
        .collect()
}

fn write_file(dir: &Path, index: usize, orders: &[Order]) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let text: String = orders
        .iter()
        .map(|(id, c, cents, at)| {
            format!(
                "{{\"order_id\":{id},\"customer_id\":{c},\"amount\":{}.{:02},\"occurred_at\":\"{at}\"}}\n",
                cents / 100,
                cents % 100
            )
        })
        .collect();
    std::fs::write(dir.join(format!("orders-{index:05}.json")), text)?;
    Ok(())
}

/// A workspace with the example plugins and a data folder.
fn workspace() -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    weir_host::examples::write_plugins(&dir.path().join("plugins"))?;
    Ok(dir)
}

fn pipeline(tag: &str, store: &str, config: &str, watermark: &str) -> String {
    format!(
        r#"
[query]
name = "{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"
state_store = "{store}"

[[source]]
name = "orders"
kind = "files"
path = "data"
format = "json"
schema = "{SCHEMA}"
max_files_per_trigger = 1

[[transform]]
name = "running_total"
plugin = "plugins/running_total.wasm"
config = {config}

{watermark}
[sink]
kind = "files"
path = "out/{tag}"
format = "json"
"#
    )
}

const TOTALS: &str = r#"{ key = "customer_id", value = "amount" }"#;

fn run(dir: &Path, text: &str) -> Result<RunSummary> {
    let spec = weir_host::spec::parse(text, dir, "test.toml", &[]).map_err(anyhow::Error::msg)?;
    let options = QueryOptions {
        cache_dir: Some(cache()),
        ..QueryOptions::default()
    };
    Ok(Query::start(spec, options)?.run()?)
}

fn cents(v: &Value) -> Result<i64> {
    let x = v.as_f64().with_context(|| format!("{v} is not a number"))?;
    Ok((x * 100.0).round() as i64)
}

/// One output row: (batch id, order id, customer, amount cents, running total cents).
type Row = (u64, u64, i64, i64, i64);

/// The rows the files sink wrote, batch by batch in order, as
/// (batch id, order id, customer, amount cents, running total cents).
fn output(dir: &Path) -> Result<Vec<Row>> {
    let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(|e| {
            let path = e.ok()?.path();
            // `batch-<id>.json`, one file per batch.
            let batch = path
                .file_stem()?
                .to_str()?
                .strip_prefix("batch-")?
                .parse()
                .ok()?;
            Some((batch, path))
        })
        .collect();
    files.sort();
    let mut rows = Vec::new();
    for (batch, path) in files {
        for line in std::fs::read_to_string(&path)?.lines() {
            let v: Value = serde_json::from_str(line)?;
            rows.push((
                batch,
                v["order_id"].as_u64().context("order_id")?,
                v["customer_id"].as_i64().context("customer_id")?,
                cents(&v["amount"])?,
                cents(&v["running_total"])?,
            ));
        }
    }
    Ok(rows)
}

/// The `stateOperators` entry of the stateful transform, per batch.
fn state_progress(checkpoint: &Path) -> Result<Vec<Value>> {
    Ok(weir_tests::progress(checkpoint)?
        .iter()
        .map(|v| v["stateOperators"][0].clone())
        .collect())
}

/// Every row's total is its customer's previous total plus its amount, and
/// each customer's last total is the sum of all its amounts in the input.
fn check_totals(rows: &[Row], input: &[Vec<Order>]) -> Result<()> {
    let expected_rows: usize = input.iter().map(Vec::len).sum();
    ensure!(
        rows.len() == expected_rows,
        "{} rows, expected {expected_rows}",
        rows.len()
    );
    let mut running: BTreeMap<i64, i64> = BTreeMap::new();
    for &(batch, order, customer, amount, total) in rows {
        let t = running.entry(customer).or_insert(0);
        *t += amount;
        ensure!(
            total == *t,
            "batch {batch}, order {order}: total {total}, expected {t}"
        );
    }
    let mut sums: BTreeMap<i64, i64> = BTreeMap::new();
    for (_, c, cents, _) in input.iter().flatten() {
        *sums.entry(*c).or_insert(0) += cents;
    }
    ensure!(
        running == sums,
        "final totals {running:?}, input sums {sums:?}"
    );
    Ok(())
}

#[test]
fn running_totals_carry_across_batches_in_both_state_stores() -> Result<()> {
    let input = orders(4, 30);
    for store in ["memory", "rocksdb", "runs"] {
        let ws = workspace()?;
        for (i, file) in input.iter().enumerate() {
            write_file(&ws.path().join("data"), i, file)?;
        }
        let summary = run(ws.path(), &pipeline(store, store, TOTALS, ""))?;
        assert_eq!(summary.batches, 4, "{store}");
        let rows = output(&ws.path().join("out").join(store))?;
        check_totals(&rows, &input)?;
        let progress = state_progress(&ws.path().join("checkpoints").join(store))?;
        assert_eq!(progress.len(), 4);
        for p in &progress {
            assert_eq!(p["operatorName"], "transformWithState", "{store}");
            assert_eq!(p["numRowsTotal"], 5, "five customers, one key each: {p}");
            assert_eq!(
                p["numRowsUpdated"], 5,
                "one put per customer per batch: {p}"
            );
            assert_eq!(p["numStateStoreInstances"], 2, "state_partitions' default");
        }
        // Versioned by batch id, in the transform's own folder.
        let state = ws
            .path()
            .join(format!("checkpoints/{store}/state/transform-0"));
        assert!(
            state.join("0").is_dir() && state.join("1").is_dir(),
            "{store}"
        );
        assert!(
            !ws.path()
                .join(format!("checkpoints/{store}/state/0"))
                .exists()
        );
    }
    Ok(())
}

#[test]
fn a_restart_mid_stream_gives_the_output_of_an_uninterrupted_run() -> Result<()> {
    let input = orders(5, 20);
    for store in ["memory", "rocksdb", "runs"] {
        let ws = workspace()?;
        let data = ws.path().join("data");
        for (i, file) in input.iter().enumerate() {
            write_file(&data, i, file)?;
        }
        run(ws.path(), &pipeline("whole", store, TOTALS, ""))?;

        // The same input arriving in two parts, with a stop in between.
        let parts = ws.path().join("parts");
        let text =
            pipeline("parts", store, TOTALS, "").replace("path = \"data\"", "path = \"parts\"");
        for (i, file) in input.iter().enumerate().take(2) {
            write_file(&parts, i, file)?;
        }
        assert_eq!(run(ws.path(), &text)?.batches, 2);
        for (i, file) in input.iter().enumerate().skip(2) {
            write_file(&parts, i, file)?;
        }
        assert_eq!(run(ws.path(), &text)?.batches, 3);

        let whole = output(&ws.path().join("out/whole"))?;
        check_totals(&whole, &input)?;
        assert_eq!(output(&ws.path().join("out/parts"))?, whole, "{store}");
    }
    Ok(())
}

#[test]
fn a_crash_in_any_phase_recovers_the_exact_totals() -> Result<()> {
    let input = orders(4, 25);
    let ws = workspace()?;
    for (i, file) in input.iter().enumerate() {
        write_file(&ws.path().join("data"), i, file)?;
    }
    run(ws.path(), &pipeline("reference", "rocksdb", TOTALS, ""))?;
    let reference = output(&ws.path().join("out/reference"))?;
    check_totals(&reference, &input)?;
    for phase in ["after-offsets", "in-transform", "before-commit"] {
        let tag = phase.replace('-', "_");
        let file = ws.path().join(format!("{tag}.toml"));
        std::fs::write(&file, pipeline(&tag, "rocksdb", TOTALS, ""))?;
        run_killed_at(EXE, &cache(), &file, &format!("{phase}@2"))?;
        let checkpoint = ws.path().join("checkpoints").join(&tag);
        assert_eq!(commit_ids(&checkpoint)?, vec![0, 1], "{phase}");
        assert_eq!(offset_ids(&checkpoint)?, vec![0, 1, 2], "{phase}");
        run_ok(EXE, &cache(), &file, &[])?;
        assert_eq!(commit_ids(&checkpoint)?, vec![0, 1, 2, 3], "{phase}");
        assert_eq!(
            output(&ws.path().join("out").join(&tag))?,
            reference,
            "{phase}: the replayed batch 2 started from state version 1"
        );
    }
    Ok(())
}

#[test]
fn totals_expire_when_the_watermark_passes_them() -> Result<()> {
    let ws = workspace()?;
    let data = ws.path().join("data");
    let files: [&[(u64, i64, i64, &str)]; 4] = [
        &[(1, 1, 100, "10:00"), (2, 2, 200, "10:00")],
        &[(3, 1, 100, "10:30")],
        // wm(2) = 10:29 passes customer 2's expiry (10:01): removed at the end of batch 2.
        &[(4, 3, 500, "11:00")],
        // wm(3) = 10:59 passes customer 1's (10:31): its total starts again.
        &[(5, 2, 300, "11:00"), (6, 1, 100, "11:00")],
    ];
    for (i, file) in files.iter().enumerate() {
        let orders: Vec<Order> = file
            .iter()
            .map(|&(id, c, cents, at)| (id, c, cents, format!("2024-03-01T{at}:00Z")))
            .collect();
        write_file(&data, i, &orders)?;
    }
    let config = r#"{ key = "customer_id", value = "amount", event_time = "occurred_at", expire_after_ms = 60000 }"#;
    let watermark = "[watermark]\ncolumn = \"occurred_at\"\ndelay = \"1 minute\"\n";
    run(ws.path(), &pipeline("expiry", "rocksdb", config, watermark))?;
    let totals: Vec<(u64, u64, i64)> = output(&ws.path().join("out/expiry"))?
        .into_iter()
        .map(|(b, order, _, _, total)| (b, order, total))
        .collect();
    assert_eq!(
        totals,
        [
            (0, 1, 100),
            (0, 2, 200),
            (1, 3, 200),
            (2, 4, 500),
            (3, 5, 300),
            (3, 6, 100)
        ]
    );
    let progress = state_progress(&ws.path().join("checkpoints/expiry"))?;
    let figures: Vec<(u64, u64)> = progress
        .iter()
        .map(|p| {
            (
                p["numRowsTotal"].as_u64().unwrap_or(u64::MAX),
                p["numRowsRemoved"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect();
    assert_eq!(figures[..4], [(2, 0), (2, 0), (2, 1), (3, 0)]);
    Ok(())
}

#[test]
fn removing_a_stateful_transform_on_restart_is_refused() -> Result<()> {
    let ws = workspace()?;
    let input = orders(2, 10);
    write_file(&ws.path().join("data"), 0, &input[0])?;
    let stateful = pipeline("change", "memory", TOTALS, "");
    run(ws.path(), &stateful)?;
    write_file(&ws.path().join("data"), 1, &input[1])?;
    let without = stateful
        .replace(
            "[[transform]]\nname = \"running_total\"\nplugin = \"plugins/running_total.wasm\"",
            "[[transform]]\nname = \"keep_all\"\nplugin = \"plugins/filter_rows.wasm\"",
        )
        .replace(
            &format!("config = {TOTALS}"),
            "config = { column = \"order_id\", op = \"ge\", value = 0 }",
        );
    let e = run(ws.path(), &without).expect_err("the stateful transform was removed");
    let message = format!("{e:#}");
    assert!(message.contains("the stateful transforms"), "{message}");
    // Nothing ran: the refused start left the checkpoint as it was.
    let checkpoint = ws.path().join("checkpoints/change");
    assert_eq!(commit_ids(&checkpoint)?, vec![0]);
    // The unchanged query resumes.
    assert_eq!(run(ws.path(), &stateful)?.batches, 1);
    check_totals(&output(&ws.path().join("out/change"))?, &input)?;
    Ok(())
}
