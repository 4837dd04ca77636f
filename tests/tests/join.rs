//! Stream-static joins through `weir run`: the table is read again only when it changed, each
//! batch's `offsets/N` records the snapshot it joined, a batch replayed after a SIGKILL joins it
//! again and writes the same bytes, a table over its `max_size` is refused naming it, and
//! `weir validate` refuses what Spark refuses. Spark's answers are `golden.rs`'s `join_*` cases.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;
use weir_tests::{SCHEMA, Workspace, commit_ids, lines, offset_entry, run_killed_at, run_ok, weir};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

/// Orders (one file per batch) left-joined with `customers`, into JSON files.
fn pipeline(tag: &str, join: &str, table: &str) -> String {
    format!(
        r#"[query]
name = "{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "{SCHEMA}"
max_files_per_trigger = 1
on_malformed = "drop"

[[table]]
name = "customers"
kind = "files"
path = "customers"
format = "json"
schema = "customer_id BIGINT, name STRING, tier STRING"
{table}

[join]
left = "orders"
right = "customers"
{join}

[sink]
kind = "files"
path = "out/{tag}"
format = "json"
"#
    )
}

/// Customers 1..=`n` named `prefix-<id>`.
fn write_customers(
    dir: &Path,
    file: &str,
    ids: std::ops::RangeInclusive<u64>,
    prefix: &str,
) -> Result<()> {
    std::fs::create_dir_all(dir.join("customers"))?;
    let text: String = ids
        .map(|id| {
            format!(
                "{{\"customer_id\":{id},\"name\":\"{prefix}-{id}\",\"tier\":\"{}\"}}\n",
                if id % 2 == 0 { "gold" } else { "basic" }
            )
        })
        .collect();
    std::fs::write(dir.join("customers").join(file), text)?;
    Ok(())
}

fn batch_rows(dir: &Path, tag: &str, n: u64) -> Result<Vec<Value>> {
    let path = dir.join(format!("out/{tag}/batch-{n:020}.json"));
    lines(&path)?
        .iter()
        .map(|l| serde_json::from_str(l).with_context(|| format!("{}: {l}", path.display())))
        .collect()
}

#[test]
fn each_batch_joins_the_snapshot_its_offsets_record_and_a_changed_table_is_read_again() -> Result<()>
{
    let ws = Workspace::new(3, 200)?;
    let dir = ws.path();
    // Customers 1..=25,000: about half the orders (ids up to 50,000) find theirs.
    write_customers(dir, "a.json", 1..=25_000, "first")?;
    let file = ws.pipeline(
        "left.toml",
        &pipeline("left", "type = \"left\"\non = [\"customer_id\"]", ""),
    )?;
    // Orders 2 and 3 arrive later.
    let data = dir.join("data/orders");
    let later = dir.join("later");
    std::fs::create_dir_all(&later)?;
    let mut names: Vec<_> = std::fs::read_dir(&data)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()?;
    names.sort();
    for name in &names[1..] {
        std::fs::rename(data.join(name), later.join(name))?;
    }
    run_ok(EXE, &cache(), &file, &[])?;
    let checkpoint = dir.join("checkpoints/left");
    assert_eq!(commit_ids(&checkpoint)?, [0]);
    let first = offset_entry(&checkpoint, 0)?["tables"][0].clone();
    assert_eq!(first["name"], "customers");
    assert_eq!(first["files"], 1);
    assert!(first["listing"].is_string(), "{first}");

    // The next batch with the table unchanged: the same snapshot.
    std::fs::rename(later.join(&names[1]), data.join(&names[1]))?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(offset_entry(&checkpoint, 1)?["tables"][0], first);

    // The table changes (customers above 25,000 are added): the third batch joins them.
    write_customers(dir, "b.json", 25_001..=50_000, "second")?;
    std::fs::rename(later.join(&names[2]), data.join(&names[2]))?;
    run_ok(EXE, &cache(), &file, &[])?;
    let third = offset_entry(&checkpoint, 2)?["tables"][0].clone();
    assert_eq!(third["files"], 2);
    assert_ne!(third["listing"], first["listing"]);

    // The key comes first, then the stream's columns, then the table's.
    let written = lines(&dir.join(format!("out/left/batch-{:020}.json", 0)))?;
    let line = written
        .iter()
        .find(|l| l.contains("\"name\""))
        .context("a joined row")?;
    assert!(line.starts_with("{\"customer_id\":"), "{line}");
    let (order, name) = (line.find("\"order_id\""), line.find("\"name\""));
    assert!(order.is_some() && order < name, "{line}");
    let mut joined = 0;
    for n in 0..3_u64 {
        let rows = batch_rows(dir, "left", n)?;
        assert!(!rows.is_empty());
        for row in &rows {
            let id = row["customer_id"].as_u64().context("customer_id")?;
            let want = match (n, id) {
                (_, 1..=25_000) => Value::from(format!("first-{id}")),
                (2, _) => Value::from(format!("second-{id}")),
                _ => Value::Null,
            };
            assert_eq!(row["name"], want, "batch {n}: {row}");
            joined += u64::from(!row["name"].is_null());
        }
    }
    assert!(joined > 0);
    Ok(())
}

#[test]
fn a_replayed_batch_joins_again_and_writes_the_same_bytes() -> Result<()> {
    let ws = Workspace::new(3, 200)?;
    write_customers(ws.path(), "a.json", 1..=30_000, "c")?;
    let join = "type = \"inner\"\non = [\"customer_id\"]\ncondition = \"customers.tier = 'gold' OR orders.amount > 100\"";
    let reference = ws.pipeline("reference.toml", &pipeline("reference", join, ""))?;
    run_ok(EXE, &cache(), &reference, &[])?;
    let killed = ws.pipeline("killed.toml", &pipeline("killed", join, ""))?;
    run_killed_at(EXE, &cache(), &killed, "before-commit@1")?;
    assert_eq!(commit_ids(&ws.path().join("checkpoints/killed"))?, [0]);
    run_ok(EXE, &cache(), &killed, &[])?;
    for n in 0..3_u64 {
        let read =
            |tag: &str| std::fs::read(ws.path().join(format!("out/{tag}/batch-{n:020}.json")));
        let (a, b) = (read("reference")?, read("killed")?);
        assert!(!a.is_empty());
        assert_eq!(a, b, "batch {n}");
        for row in batch_rows(ws.path(), "reference", n)? {
            let gold = row["tier"] == "gold";
            let amount = row["amount"]
                .as_f64()
                .or_else(|| row["amount"].as_str().and_then(|a| a.parse().ok()))
                .context("amount")?;
            assert!(gold || amount > 100.0, "{row}");
        }
    }
    Ok(())
}

#[test]
fn a_table_over_its_max_size_stops_the_batch_naming_it() -> Result<()> {
    let ws = Workspace::new(1, 50)?;
    write_customers(ws.path(), "a.json", 1..=1_000, "c")?;
    let file = ws.pipeline(
        "small.toml",
        &pipeline(
            "small",
            "type = \"left\"\non = [\"customer_id\"]",
            "max_size = \"1 KiB\"",
        ),
    )?;
    let out = weir(EXE, &cache(), &["run", file.to_str().context("path")?])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("table customers is ")
            && stderr.contains("bytes on disk, over its max_size of 1024 bytes"),
        "{stderr}"
    );
    assert!(commit_ids(&ws.path().join("checkpoints/small"))?.is_empty());
    Ok(())
}

#[test]
fn validation_refuses_what_spark_refuses_naming_the_key() -> Result<()> {
    let ws = Workspace::new(1, 10)?;
    write_customers(ws.path(), "a.json", 1..=10, "c")?;
    let cases = [
        (
            "type = \"right\"\non = [\"customer_id\"]",
            "join.type: a right outer join with the stream (orders) on the left is not supported",
        ),
        (
            "type = \"full_outer\"\non = [\"customer_id\"]",
            "join.type: a full outer join of a stream with a static table is not supported",
        ),
        (
            "type = \"leftOuter\"\non = [\"order_id\"]",
            "join.on: the join column \"order_id\" is not a column of customers",
        ),
        (
            "type = \"left\"\non = [\"customer_id\"]\ncondition = \"tier = 'gold'\"",
            "join.condition: \"tier = 'gold'\": the column tier is not qualified: write orders.tier or customers.tier",
        ),
        (
            "type = \"left\"\non = [\"customer_id\"]\ncondition = \"customers.tierr = 'gold'\"",
            "did you mean customers.tier?",
        ),
        (
            "type = \"sideways\"\non = [\"customer_id\"]",
            "join.type: \"sideways\" is not a join type",
        ),
    ];
    for (i, (join, problem)) in cases.iter().enumerate() {
        let file = ws.pipeline(
            &format!("case{i}.toml"),
            &pipeline(&format!("case{i}"), join, ""),
        )?;
        for command in ["validate", "run"] {
            let out = weir(EXE, &cache(), &[command, file.to_str().context("path")?])?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "case {i} {command}: {stderr}");
            assert!(stderr.contains(problem), "case {i} {command}: {stderr}");
        }
    }
    // A column on both sides, and a stream joined with a stream.
    let both = pipeline("both", "on = [\"customer_id\"]", "").replace(
        "customer_id BIGINT, name STRING, tier STRING",
        "customer_id BIGINT, status STRING",
    );
    let file = ws.pipeline("both.toml", &both)?;
    let out = weir(EXE, &cache(), &["validate", file.to_str().context("path")?])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the column \"status\" is in both orders and customers"),
        "{stderr}"
    );
    let streams = pipeline("streams", "type = \"left\"\non = [\"customer_id\"]", "").replace(
        "[[table]]\nname = \"customers\"\nkind = \"files\"",
        "[[source]]\nname = \"customers\"\nkind = \"files\"",
    );
    let file = ws.pipeline("streams.toml", &streams)?;
    let out = weir(EXE, &cache(), &["validate", file.to_str().context("path")?])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Two streams: a left join needs watermarks and a time bound to ever emit its outer rows.
    assert!(
        stderr.contains("join.type: a left join of two streams needs what Spark needs"),
        "{stderr}"
    );
    Ok(())
}

#[test]
fn a_restart_with_another_join_is_refused_naming_it() -> Result<()> {
    let ws = Workspace::new(1, 50)?;
    write_customers(ws.path(), "a.json", 1..=100, "c")?;
    let text = pipeline("edits", "type = \"left\"\non = [\"customer_id\"]", "");
    let file = ws.pipeline("edits.toml", &text)?;
    run_ok(EXE, &cache(), &file, &[])?;
    std::fs::write(&file, text.replace("type = \"left\"", "type = \"inner\""))?;
    let out = weir(EXE, &cache(), &["run", file.to_str().context("path")?])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "the join (its inputs, the table's kind and path, the type, keys and condition) changed"
        ),
        "{stderr}"
    );
    Ok(())
}
