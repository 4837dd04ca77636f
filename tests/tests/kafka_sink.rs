//! Kafka → Weir → Kafka: each batch is one transaction that also writes the batch's marker,
//! and a recovered batch is written again or not by what the marker says.
//!
//! What the mock broker shows, and these tests check: the rows, the markers (one per batch
//! id, never two), and the recovery decision. What it cannot show: `read_committed` — it
//! neither filters aborted transactions nor writes control records, so the rows of a
//! transaction aborted by a crash stay visible on it. The in-sink crash test asserts exactly
//! that extra, visible copy, which a real broker hides from committed readers.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use weir_tests::kafka::{Broker, Read, order_lines};
use weir_tests::{SCHEMA, Workspace, commit_ids, query_id, run_killed_at, run_ok};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn pipeline(tag: &str, bootstrap: &str, delivery: &str) -> String {
    with_sink(
        tag,
        bootstrap,
        &format!(
            "[sink]\nkind = \"kafka\"\nbootstrap_servers = \"{bootstrap}\"\ntopic = \"out-{tag}\"\ndelivery = \"{delivery}\"\n"
        ),
    )
}

fn with_sink(tag: &str, bootstrap: &str, sink: &str) -> String {
    format!(
        r#"
[query]
name = "to_kafka_{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"

[[source]]
name = "orders"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
subscribe = ["orders"]
starting_offsets = "earliest"
max_offsets_per_trigger = 250
format = "json"
schema = "{SCHEMA}"
on_malformed = "drop"

{sink}
"#
    )
}

struct Topic {
    rows: Vec<String>,
    markers: Vec<String>,
}

fn read_topic(broker: &Broker, topic: &str) -> Result<Topic> {
    let records: Vec<Read> = broker.read_all(topic, 2)?;
    let mut rows = Vec::new();
    let mut markers = Vec::new();
    for r in records {
        match (&r.marker, &r.value) {
            (Some(m), None) => {
                assert_eq!(r.partition, 0, "markers go to partition 0");
                markers.push(m.clone());
            }
            (None, Some(v)) => rows.push(String::from_utf8(v.clone())?),
            other => anyhow::bail!("unexpected record {other:?}"),
        }
    }
    rows.sort();
    Ok(Topic { rows, markers })
}

/// The same orders written by the files sink: the expected values, sorted.
fn expected_rows(ws: &Workspace, bootstrap: &str) -> Result<Vec<String>> {
    let text = with_sink(
        "reference",
        bootstrap,
        "[sink]\nkind = \"files\"\npath = \"out/reference\"\nformat = \"json\"\n",
    );
    let file = ws.pipeline("reference.toml", &text)?;
    run_ok(EXE, &cache(), &file, &[])?;
    let mut rows = Vec::new();
    for entry in std::fs::read_dir(ws.path().join("out/reference"))? {
        rows.extend(weir_tests::lines(&entry?.path())?);
    }
    rows.sort();
    Ok(rows)
}

fn setup() -> Result<(Workspace, Broker, Vec<String>)> {
    let ws = Workspace::new(3, 200)?;
    let broker = Broker::start()?;
    broker.create_topic("orders", 3)?;
    broker.produce("orders", 3, &order_lines(&ws.path().join("data/orders"))?)?;
    let expected = expected_rows(&ws, &broker.bootstrap())?;
    assert_eq!(expected.len() as u64, ws.orders.lines - ws.orders.malformed);
    Ok((ws, broker, expected))
}

/// Rows the sink took in the batches that completed (from the progress log; none before the
/// first batch completed).
fn completed_output_rows(checkpoint: &Path) -> Result<usize> {
    if !checkpoint.exists() {
        return Ok(0);
    }
    let mut rows = 0;
    for record in weir_tests::progress(checkpoint)? {
        rows += record["sink"]["numOutputRows"]
            .as_u64()
            .context("sink.numOutputRows")? as usize;
    }
    Ok(rows)
}

fn markers_of(id: &str, batches: &[u64]) -> Vec<String> {
    batches.iter().map(|b| format!("{id}/{b}")).collect()
}

#[test]
fn each_batch_is_written_once_with_its_marker() -> Result<()> {
    let (ws, broker, expected) = setup()?;
    for delivery in ["exactly-once", "at-least-once"] {
        let tag = delivery.replace('-', "");
        broker.create_topic(&format!("out-{tag}"), 2)?;
        let file = ws.pipeline(
            &format!("{tag}.toml"),
            &pipeline(&tag, &broker.bootstrap(), delivery),
        )?;
        run_ok(EXE, &cache(), &file, &[])?;
        let checkpoint = ws.path().join("checkpoints").join(&tag);
        let batches = commit_ids(&checkpoint)?;
        assert!(batches.len() >= 3, "{delivery}: {batches:?}");
        let out = read_topic(&broker, &format!("out-{tag}"))?;
        assert_eq!(out.rows, expected, "{delivery}");
        assert_eq!(
            out.markers,
            markers_of(&query_id(&checkpoint)?, &batches),
            "{delivery}"
        );
        // Nothing new: nothing written.
        run_ok(EXE, &cache(), &file, &[])?;
        assert_eq!(
            read_topic(&broker, &format!("out-{tag}"))?.markers.len(),
            batches.len()
        );
    }
    Ok(())
}

#[test]
fn a_recovered_batch_is_written_again_or_not_as_its_marker_says() -> Result<()> {
    let (ws, broker, expected) = setup()?;
    // The first batch (the first transaction: no marker before it) and a later one.
    for killed in [0u64, 1] {
        for phase in ["after-offsets", "in-sink", "before-commit"] {
            let tag = format!("{}{killed}", phase.replace('-', ""));
            let topic = format!("out-{tag}");
            broker.create_topic(&topic, 2)?;
            let file = ws.pipeline(
                &format!("{tag}.toml"),
                &pipeline(&tag, &broker.bootstrap(), "exactly-once"),
            )?;
            run_killed_at(EXE, &cache(), &file, &format!("{phase}@{killed}"))?;
            let checkpoint = ws.path().join("checkpoints").join(&tag);
            let id = query_id(&checkpoint)?;
            let before = read_topic(&broker, &topic)?;
            let completed = completed_output_rows(&checkpoint)?;
            let out = run_ok(EXE, &cache(), &file, &[])?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            let after = read_topic(&broker, &topic)?;
            let batches = commit_ids(&checkpoint)?;
            assert!(batches.len() >= 3, "{tag}: {batches:?}");
            // One marker per batch id, whatever happened.
            assert_eq!(after.markers, markers_of(&id, &batches), "{tag}");
            let skipped = stderr.contains(&format!("batch {killed} is already in the topic"));
            let earlier: Vec<u64> = (0..killed).collect();
            match phase {
                // The killed batch's transaction committed, only its commits/N was lost: not
                // written again.
                "before-commit" => {
                    let marked: Vec<u64> = (0..=killed).collect();
                    assert_eq!(before.markers, markers_of(&id, &marked), "{tag}");
                    assert!(skipped, "{tag}: {stderr}");
                    assert_eq!(after.rows, expected, "{tag}");
                }
                // Nothing of the killed batch was produced: written once now.
                "after-offsets" => {
                    assert_eq!(before.markers, markers_of(&id, &earlier), "{tag}");
                    assert!(!skipped, "{tag}: {stderr}");
                    assert_eq!(after.rows, expected, "{tag}");
                }
                // Killed inside the batch's transaction, before its marker: written again in a
                // new transaction. The mock still shows the aborted copy (a real broker hides
                // it from read_committed readers): every row is there, the killed batch's
                // twice.
                _ => {
                    assert_eq!(before.markers, markers_of(&id, &earlier), "{tag}");
                    assert!(!skipped, "{tag}: {stderr}");
                    let aborted = before.rows.len() - completed;
                    assert!(
                        aborted > 0,
                        "{tag}: the killed batch's rows reached the broker before the kill"
                    );
                    assert_eq!(after.rows.len(), expected.len() + aborted, "{tag}");
                    let mut distinct = after.rows.clone();
                    distinct.dedup();
                    assert_eq!(distinct, expected, "{tag}");
                }
            }
        }
    }
    Ok(())
}
