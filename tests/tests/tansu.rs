//! The Kafka source and sink against a second, independent Kafka-protocol broker: tansu,
//! started as its own process on 127.0.0.1 (see [`weir_tests::tansu`]; `.ci/run` installs it
//! and sets `WEIR_TANSU`, and without it these tests fail naming that step). The mock cluster
//! shares librdkafka with Weir; tansu does not, so these catch protocol assumptions the mock
//! would mirror.
//!
//! What tansu 0.6.0 does not let us test: `read_committed` (it returns the records of aborted
//! transactions too) and true high watermarks (it reports the end of the most recently
//! modified stored batch, which can lie below the log end; every topic read here is sealed
//! first, [`Broker::seal`]). The end-to-end SIGKILL test on tansu is in `e2e_kafka.rs`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use weir_tests::kafka::{Broker, order_lines};
use weir_tests::{
    SCHEMA, Workspace, commit_ids, files_reference, files_sink, run_killed_at, run_ok,
    sorted_output,
};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");
const PARTITIONS: i32 = 4;

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn kafka_pipeline(tag: &str, bootstrap: &str, sink: &str) -> String {
    format!(
        r#"
[query]
name = "tansu_{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"

[[source]]
name = "orders"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
subscribe = ["orders"]
starting_offsets = "earliest"
max_offsets_per_trigger = 300
format = "json"
schema = "{SCHEMA}"
on_malformed = "drop"

{sink}
"#
    )
}

/// The orders of `ws` on a fresh tansu, sealed, and the rows the files source makes of them.
fn setup(ws: &Workspace) -> Result<(Broker, Vec<String>)> {
    let broker = Broker::tansu()?;
    broker.create_topic("orders", PARTITIONS)?;
    let orders = order_lines(&ws.path().join("data/orders"))?;
    broker.produce("orders", PARTITIONS, &orders)?;
    let sealed = broker.seal("orders", PARTITIONS)?;
    // After the seal, the high watermarks are the log ends: every record, and the seals.
    let mut total = 0;
    for p in 0..PARTITIONS {
        let (low, high) = broker.watermarks("orders", p)?;
        assert_eq!(low, 0, "partition {p}");
        total += high;
    }
    assert_eq!(total as usize, orders.len() + sealed);

    let expected = files_reference(ws, EXE, &cache())?;
    Ok((broker, expected))
}

#[test]
fn the_kafka_source_reads_every_partition_of_a_tansu_topic_in_offset_ranges() -> Result<()> {
    let ws = Workspace::new(4, 250)?;
    let (broker, expected) = setup(&ws)?;
    let file = ws.pipeline(
        "k.toml",
        &kafka_pipeline("k", &broker.bootstrap(), &files_sink("k")),
    )?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(sorted_output(&ws.path().join("out/k"))?, expected);

    // 1004 records (4 seals), at most 300 a batch; the last batch ends at the log ends.
    let checkpoint = ws.path().join("checkpoints/k");
    let batches = commit_ids(&checkpoint)?;
    assert!((4..=5).contains(&batches.len()), "batches: {batches:?}");
    let last = *batches.last().context("no batch")?;
    let json: serde_json::Value = weir_tests::offset_entry(&checkpoint, last)?;
    for p in 0..PARTITIONS {
        let (_, high) = broker.watermarks("orders", p)?;
        assert_eq!(
            json["sources"][0]["kafka"]["orders"][p.to_string()],
            serde_json::json!(high),
            "partition {p}: {json}"
        );
    }

    // A restart reads nothing more; new records are read once.
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(commit_ids(&checkpoint)?, batches);
    let more: Vec<String> = expected
        .iter()
        .take(40)
        .map(|l| l.replacen("\"order_id\":1", "\"order_id\":9", 1))
        .collect();
    broker.produce("orders", PARTITIONS, &more)?;
    broker.seal("orders", PARTITIONS)?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(
        sorted_output(&ws.path().join("out/k"))?.len(),
        expected.len() + more.len()
    );
    Ok(())
}

#[test]
fn the_kafka_sink_writes_each_batch_once_with_its_marker_to_tansu() -> Result<()> {
    let ws = Workspace::new(3, 200)?;
    let (broker, expected) = setup(&ws)?;
    // Killed after batch N's transaction committed, before commits/N: the restarted sink finds
    // batch N's marker on tansu and does not write it again. Batch 0 is the query's first
    // transaction on the topic (no marker before it), batch 1 one after another.
    for killed in [0u64, 1] {
        let (tag, topic) = (format!("q{killed}"), format!("out{killed}"));
        broker.create_topic(&topic, 2)?;
        let sink = format!(
            "[sink]\nkind = \"kafka\"\nbootstrap_servers = \"{}\"\ntopic = \"{topic}\"\ndelivery = \"exactly-once\"\n",
            broker.bootstrap()
        );
        let file = ws.pipeline(
            &format!("{tag}.toml"),
            &kafka_pipeline(&tag, &broker.bootstrap(), &sink),
        )?;
        run_killed_at(EXE, &cache(), &file, &format!("before-commit@{killed}"))?;
        let out = run_ok(EXE, &cache(), &file, &[])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("batch {killed} is already in the topic")),
            "{tag}: {stderr}"
        );
        let checkpoint = ws.path().join("checkpoints").join(&tag);
        let batches = commit_ids(&checkpoint)?;
        assert!(batches.len() >= 3, "{tag}: {batches:?}");
        let id = weir_tests::query_id(&checkpoint)?;

        let mut rows = Vec::new();
        let mut markers = Vec::new();
        for r in broker.read_all(&topic, 2)? {
            match (r.marker, r.value) {
                (Some(m), None) => markers.push(m),
                (None, Some(v)) => rows.push(String::from_utf8(v)?),
                other => anyhow::bail!("{tag}: unexpected record {other:?}"),
            }
        }
        rows.sort();
        // Whole rows, each once: the files reference, which has as many as the generator
        // wrote valid orders.
        assert_eq!(rows.len(), expected.len(), "{tag}");
        assert_eq!(rows, expected, "{tag}");
        assert_eq!(
            markers,
            batches
                .iter()
                .map(|b| format!("{id}/{b}"))
                .collect::<Vec<_>>(),
            "{tag}"
        );
    }
    Ok(())
}
