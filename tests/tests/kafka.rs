//! Kafka end to end: orders produced to a multi-partition topic of a Kafka-protocol broker
//! (librdkafka's mock cluster, in this process, over TCP on 127.0.0.1) are read by the `weir`
//! binary in a child process. The output must hold exactly the rows the same pipeline
//! produces from the same orders as files, after restarts and after SIGKILL at every phase.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use weir_tests::kafka::{Broker, order_lines};
use weir_tests::{
    SCHEMA, Workspace, commit_ids, files_reference, files_sink, jsonl_plugin_sink, lines,
    offset_ids, run_killed_at, run_ok, sorted_output, weir,
};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");
const PARTITIONS: i32 = 3;

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

/// A stateless pipeline over the Kafka topic `orders`.
fn kafka_pipeline(tag: &str, bootstrap: &str, source_extra: &str, rest: &str) -> String {
    format!(
        r#"
[query]
name = "kafka_{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"

[[source]]
name = "orders"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
subscribe = ["orders"]
starting_offsets = "earliest"
format = "json"
schema = "{SCHEMA}"
{source_extra}

{rest}
"#
    )
}

/// The orders of `ws` produced to a fresh broker.
fn broker_with_orders(ws: &Workspace) -> Result<(Broker, Vec<String>)> {
    let broker = Broker::start()?;
    broker.create_topic("orders", PARTITIONS)?;
    let orders = order_lines(&ws.path().join("data/orders"))?;
    broker.produce("orders", PARTITIONS, &orders)?;
    Ok((broker, orders))
}

fn last_progress(checkpoint: &Path) -> Result<serde_json::Value> {
    weir_tests::progress(checkpoint)?
        .pop()
        .context("no progress record")
}

#[test]
fn kafka_rows_are_exactly_the_rows_of_the_same_orders_as_files() -> Result<()> {
    let ws = Workspace::new(4, 250)?;
    let (broker, orders) = broker_with_orders(&ws)?;
    assert_eq!(orders.len(), 1000);

    let expected = files_reference(&ws, EXE, &cache())?;

    let file = ws.pipeline(
        "kafka.toml",
        &kafka_pipeline(
            "k",
            &broker.bootstrap(),
            "max_offsets_per_trigger = 300\non_malformed = \"drop\"",
            &files_sink("k"),
        ),
    )?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(sorted_output(&ws.path().join("out/k"))?, expected);

    // 1000 records, at most 300 a batch (Spark's rounding may add one per partition).
    let checkpoint = ws.path().join("checkpoints/k");
    let batches = commit_ids(&checkpoint)?;
    assert!((4..=5).contains(&batches.len()), "batches: {batches:?}");
    // offsets/N holds the end offset of every partition; the last batch reached the end.
    let last = *batches.last().unwrap_or(&0);
    let json: serde_json::Value = weir_tests::offset_entry(&checkpoint, last)?;
    let ends = &json["sources"][0]["kafka"]["orders"];
    for p in 0..PARTITIONS {
        let (_, high) = broker.watermarks("orders", p)?;
        assert_eq!(
            ends[p.to_string()],
            serde_json::json!(high),
            "partition {p}: {json}"
        );
    }
    assert_eq!(
        (0..PARTITIONS)
            .map(|p| ends[p.to_string()].as_i64().unwrap_or(0))
            .sum::<i64>(),
        1000
    );
    // Progress reports per-partition offsets and how far behind the latest the batch is.
    let progress = last_progress(&checkpoint)?;
    let source = &progress["sources"][0];
    assert_eq!(source["description"], "KafkaV2[Subscribe[orders]]");
    assert_eq!(source["endOffset"]["orders"], *ends);
    assert_eq!(source["latestOffset"]["orders"], *ends);
    assert_eq!(source["metrics"]["maxOffsetsBehindLatest"], "0");
    let first = weir_tests::progress(&checkpoint)?
        .into_iter()
        .next()
        .context("no progress record")?;
    let behind: i64 = first["sources"][0]["metrics"]["maxOffsetsBehindLatest"]
        .as_str()
        .unwrap_or("0")
        .parse()?;
    assert!(behind > 0, "the first batch is behind the latest: {first}");
    assert_eq!(first["sources"][0]["startOffset"]["orders"]["0"], 0);
    Ok(())
}

#[test]
fn a_restart_continues_where_the_last_batch_ended_and_new_partitions_are_read() -> Result<()> {
    let ws = Workspace::new(2, 150)?;
    let (broker, orders) = broker_with_orders(&ws)?;
    let file = ws.pipeline(
        "q.toml",
        &kafka_pipeline(
            "q",
            &broker.bootstrap(),
            "on_malformed = \"drop\"",
            &files_sink("q"),
        ),
    )?;
    run_ok(EXE, &cache(), &file, &[])?;
    let first = sorted_output(&ws.path().join("out/q"))?;
    let valid = |ls: &[String]| ls.iter().filter(|l| l.ends_with('}')).count();
    assert_eq!(first.len(), valid(&orders));
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(
        sorted_output(&ws.path().join("out/q"))?,
        first,
        "nothing new, nothing read"
    );
    assert_eq!(commit_ids(&ws.path().join("checkpoints/q"))?, vec![0]);

    // More orders, and a topic of the pattern appears: only the new records are read.
    let more: Vec<String> = orders
        .iter()
        .take(40)
        .map(|l| l.replacen("\"order_id\":1", "\"order_id\":9", 1))
        .collect();
    broker.produce("orders", PARTITIONS, &more)?;
    run_ok(EXE, &cache(), &file, &[])?;
    let after = sorted_output(&ws.path().join("out/q"))?;
    assert_eq!(after.len(), first.len() + valid(&more));
    assert_eq!(commit_ids(&ws.path().join("checkpoints/q"))?, vec![0, 1]);
    let progress = last_progress(&ws.path().join("checkpoints/q"))?;
    assert_eq!(progress["numInputRows"], 40);

    // A pattern subscription picks up a topic created later, from its earliest offset.
    let pattern = ws.pipeline(
        "p.toml",
        &kafka_pipeline(
            "p",
            &broker.bootstrap(),
            "on_malformed = \"drop\"",
            &files_sink("p"),
        )
        .replace(
            "subscribe = [\"orders\"]",
            "subscribe_pattern = \"orders.*\"",
        ),
    )?;
    run_ok(EXE, &cache(), &pattern, &[])?;
    let before = sorted_output(&ws.path().join("out/p"))?;
    assert_eq!(before.len(), after.len());
    broker.create_topic("orders-eu", 2)?;
    broker.produce("orders-eu", 2, &more[..10])?;
    run_ok(EXE, &cache(), &pattern, &[])?;
    assert_eq!(
        sorted_output(&ws.path().join("out/p"))?.len(),
        before.len() + valid(&more[..10])
    );
    Ok(())
}

#[test]
fn a_crash_at_any_phase_of_a_kafka_batch_loses_and_duplicates_nothing() -> Result<()> {
    let ws = Workspace::new(4, 200)?;
    let (broker, _) = broker_with_orders(&ws)?;
    // orders → normalize_status → keep completed → jsonl plugin sink; 4 batches of 200.
    let pipeline = |tag: &str| {
        weir_tests::orders_pipeline(tag, "permissive", &jsonl_plugin_sink(tag))
            .replace("kind = \"files\"\npath = \"data/orders\"", &format!(
                "kind = \"kafka\"\nbootstrap_servers = \"{}\"\nsubscribe = [\"orders\"]\nstarting_offsets = \"earliest\"",
                broker.bootstrap()
            ))
            .replace("max_files_per_trigger = 1", "max_offsets_per_trigger = 200")
    };
    std::fs::create_dir_all(ws.path().join("out/reference"))?;
    let reference_file = ws.pipeline("reference.toml", &pipeline("reference"))?;
    run_ok(EXE, &cache(), &reference_file, &[])?;
    let reference = lines(&ws.path().join("out/reference/orders.jsonl"))?;
    assert_eq!(reference.len() as u64, ws.orders.by_status[0]);
    let batches = commit_ids(&ws.path().join("checkpoints/reference"))?;
    assert!(batches.len() >= 4, "{batches:?}");

    // The first batch (the sink's first write) and a later one.
    for killed in [0u64, 2] {
        for phase in ["after-offsets", "in-transform", "in-sink", "before-commit"] {
            let tag = format!("{phase}-{killed}");
            let out_dir = ws.path().join("out").join(&tag);
            std::fs::create_dir_all(&out_dir)?;
            let file = ws.pipeline(&format!("{tag}.toml"), &pipeline(&tag))?;
            run_killed_at(EXE, &cache(), &file, &format!("{phase}@{killed}"))?;
            let checkpoint = ws.path().join("checkpoints").join(&tag);
            assert_eq!(
                offset_ids(&checkpoint)?,
                (0..=killed).collect::<Vec<_>>(),
                "{tag}"
            );
            assert_eq!(
                commit_ids(&checkpoint)?,
                (0..killed).collect::<Vec<_>>(),
                "{tag}"
            );
            let partial = lines(&out_dir.join("orders.jsonl"))?;
            assert!(
                partial.len() < reference.len() && reference.starts_with(&partial),
                "{tag}: the output after the crash is a prefix of the full output"
            );
            run_ok(EXE, &cache(), &file, &[])?;
            assert_eq!(
                lines(&out_dir.join("orders.jsonl"))?,
                reference,
                "{tag}: rows after recovery"
            );
            assert_eq!(commit_ids(&checkpoint)?, batches, "{tag}");
        }
    }
    Ok(())
}

#[test]
fn lost_offsets_fail_the_query_naming_the_partition_or_are_skipped_when_allowed() -> Result<()> {
    let ws = Workspace::new(1, 30)?;
    let (broker, _) = broker_with_orders(&ws)?;
    let (_, high) = broker.watermarks("orders", 1)?;
    let beyond = format!(
        "starting_offsets = '{{\"orders\":{{\"0\":-2,\"1\":{},\"2\":-2}}}}'\non_malformed = \"drop\"",
        high + 50
    );
    let text = kafka_pipeline("loss", &broker.bootstrap(), &beyond, &files_sink("loss"))
        .replace("starting_offsets = \"earliest\"\n", "");
    let file = ws.pipeline("loss.toml", &text)?;
    let out = weir(EXE, &cache(), &["run", file.to_str().unwrap_or_default()])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "orders-1: the query stands at offset {} but the partition now ends at {high}",
            high + 50
        )),
        "{stderr}"
    );
    assert!(stderr.contains("fail_on_data_loss = false"), "{stderr}");
    assert!(sorted_output(&ws.path().join("out/loss"))?.is_empty());

    // Allowed: a warning, and the partition is read from its earliest offset.
    let lenient = ws.pipeline(
        "lenient.toml",
        &text
            .replace("checkpoints/loss", "checkpoints/lenient")
            .replace("out/loss", "out/lenient")
            .replace(
                "on_malformed = \"drop\"",
                "on_malformed = \"drop\"\nfail_on_data_loss = false",
            ),
    )?;
    let out = run_ok(EXE, &cache(), &lenient, &[])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("data loss, skipped"), "{stderr}");
    assert_eq!(
        sorted_output(&ws.path().join("out/lenient"))?.len() as u64,
        ws.orders.lines - ws.orders.malformed
    );

    // Records removed by retention under a running query (the mock keeps 5 MiB per
    // partition): the next batch fails, naming the partition and the lost offsets.
    let small = ws.pipeline(
        "small.toml",
        &kafka_pipeline(
            "small",
            &broker.bootstrap(),
            "on_malformed = \"drop\"",
            &files_sink("small"),
        ),
    )?;
    run_ok(EXE, &cache(), &small, &[])?;
    let filler: Vec<String> = (0..70_000)
        .map(|i| format!("{{\"order_id\":{i},\"status\":\"{}\"}}", "x".repeat(80)))
        .collect();
    // Uncompressed on purpose: push partition 0 past the mock's 5 MiB.
    broker.produce_to("orders", 0, "none", &filler)?;
    let (low, _) = broker.watermarks("orders", 0)?;
    assert!(
        low > 0,
        "the mock dropped the oldest records of partition 0"
    );
    let out = weir(EXE, &cache(), &["run", small.to_str().unwrap_or_default()])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("orders-0: offsets "), "{stderr}");
    assert!(
        stderr.contains(&format!("are gone (the earliest offset is now {low}")),
        "{stderr}"
    );
    Ok(())
}
