//! Kafka → Weir → Delta and Kafka → Weir → Kafka, end to end through the `weir` binary: JSON
//! orders (some malformed) on a 4-partition topic, a Wasm transform, and the process killed
//! with SIGKILL at every phase of a batch ([`Phase::ALL`]), in the first batch (which creates
//! the Delta table, or opens the first Kafka transaction) and in a later one, then restarted.
//! Every valid input row must come out exactly once, whole.
//!
//! The reference is an uninterrupted run of the same source into a files sink, which writes
//! one file per batch: it says which rows each batch holds, so the output is checked batch by
//! batch, not only as a whole; how many rows it holds is checked against what the generator
//! wrote. Delta tables are read by our own reader and by the Python `deltalake` package, and
//! must hold the reference's rows with every column; the Delta log must hold one commit per
//! batch whose txn version is the batch id, none twice.
//!
//! The brokers: librdkafka's mock cluster (in this process, over TCP), and tansu as its own
//! process (the `_on_tansu` test; see [`weir_tests::tansu`]). What neither lets us test, and
//! these tests therefore do not claim:
//! - `read_committed` isolation. Neither broker filters the records of an aborted
//!   transaction, so the rows of the transaction a kill in the sink left open stay visible to
//!   every reader. The Kafka test instead checks what is observable: one marker per committed
//!   batch id, never two; the recovery decision the restarted sink logs; the offsets in the
//!   checkpoint; and, batch by batch, that the rows of a batch are exactly its rows — for the
//!   batch killed inside its transaction, its rows twice (the aborted attempt, visible, and
//!   the committed one), nothing else.
//! - That the broker aborts the open transaction of a fenced producer: both accept
//!   `init_transactions` of the restarted sink, but the aborted attempt's records stay.
//! - Retention pressure at scale: the mock drops records beyond 5 MiB per partition, so the
//!   volumes here stay small (lz4); tansu keeps everything in memory.
//! - True high watermarks on tansu 0.6.0, which reports the end of the most recently
//!   *modified* stored batch; the tests seal each topic they read ([`Broker::seal`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use weir_host::failpoint::Phase;
use weir_tests::delta::{commits, own_rows, py_read, py_rows, txn_of};
use weir_tests::kafka::{Broker, order_lines};
use weir_tests::{
    SCHEMA, Workspace, commit_ids, json_rows, offset_ids, query_id, run_killed_at, run_ok,
    same_rows,
};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");
const PARTITIONS: i32 = 4;
/// The batches runs are killed in: the first one, and one with two batches committed before
/// it and more after it.
const KILLED: [u64; 2] = [0, 2];

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn phases() -> impl Iterator<Item = &'static str> {
    Phase::ALL.iter().map(|(name, _)| *name)
}

/// orders (Kafka) → normalize_status (Wasm) → `sink`, 200 offsets a batch.
fn pipeline(tag: &str, bootstrap: &str, sink: &str) -> String {
    format!(
        r#"
[query]
name = "e2e_{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"

[[source]]
name = "orders"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
subscribe = ["orders"]
starting_offsets = "earliest"
max_offsets_per_trigger = 200
format = "json"
schema = "{SCHEMA}"
on_malformed = "drop"

[[transform]]
name = "normalize_status"
plugin = "plugins/normalize_status.wasm"
config = {{ column = "status", lowercase = true, trim = true, map = {{ canceled = "cancelled" }} }}

{sink}
"#
    )
}

/// What an uninterrupted run wrote, batch by batch.
struct Reference {
    /// Each output row (a JSON line) with the batch that wrote it.
    batch_of: HashMap<String, u64>,
    /// Rows per batch, in batch order.
    rows: BTreeMap<u64, Vec<String>>,
    /// Every row whole, in the canonical form of [`weir_tests::canonical_rows`].
    canonical: Vec<Value>,
}

impl Reference {
    fn batches(&self) -> Vec<u64> {
        self.rows.keys().copied().collect()
    }
}

struct Setup {
    ws: Workspace,
    broker: Broker,
    reference: Reference,
}

fn setup(broker: Broker) -> Result<Setup> {
    let ws = Workspace::new(4, 200)?;
    broker.create_topic("orders", PARTITIONS)?;
    let orders = order_lines(&ws.path().join("data/orders"))?;
    broker.produce("orders", PARTITIONS, &orders)?;
    let sealed = broker.seal("orders", PARTITIONS)?;
    let mut total = 0;
    for p in 0..PARTITIONS {
        let (low, high) = broker.watermarks("orders", p)?;
        ensure!(low == 0, "partition {p} starts at {low}");
        total += high;
    }
    ensure!(
        total as usize == orders.len() + sealed,
        "the broker holds {total} records, {} were produced",
        orders.len() + sealed
    );

    let file = ws.pipeline(
        "reference.toml",
        &pipeline(
            "reference",
            &broker.bootstrap(),
            "[sink]\nkind = \"files\"\npath = \"out/reference\"\nformat = \"json\"\n",
        ),
    )?;
    run_ok(EXE, &cache(), &file, &[])?;
    let mut reference = Reference {
        batch_of: HashMap::new(),
        rows: BTreeMap::new(),
        canonical: Vec::new(),
    };
    let mut all = Vec::new();
    for b in commit_ids(&ws.path().join("checkpoints/reference"))? {
        let path = ws.path().join(format!("out/reference/batch-{b:020}.json"));
        let rows = weir_tests::lines(&path)?;
        for row in &rows {
            ensure!(
                reference.batch_of.insert(row.clone(), b).is_none(),
                "row twice in the reference: {row}"
            );
        }
        all.extend(rows.iter().cloned());
        reference.rows.insert(b, rows);
    }
    // The count is the generator's, not the reference run's: every valid order (the seals
    // tansu needs are not JSON and dropped), each once.
    ensure!(
        all.len() as u64 == ws.orders.lines - ws.orders.malformed,
        "the reference holds {} rows, the generator wrote {} valid orders",
        all.len(),
        ws.orders.lines - ws.orders.malformed
    );
    reference.canonical = json_rows(&all, SCHEMA)?;
    let mut ids = reference
        .canonical
        .iter()
        .map(|r| r["order_id"].as_i64().context("order_id"))
        .collect::<Result<Vec<i64>>>()?;
    ids.sort_unstable();
    ids.dedup();
    ensure!(ids.len() == all.len(), "an order twice in the reference");
    let last = KILLED.iter().max().copied().unwrap_or_default();
    ensure!(
        reference.rows.len() as u64 > last + 1,
        "batches: {:?}",
        reference.batches()
    );
    Ok(Setup {
        ws,
        broker,
        reference,
    })
}

/// The last `offsets/N` of the checkpoint holds the log end of every input partition.
fn assert_offsets_reach_the_end(s: &Setup, checkpoint: &Path, what: &str) -> Result<()> {
    let last = *offset_ids(checkpoint)?.last().context("no offsets")?;
    let json: Value = weir_tests::offset_entry(checkpoint, last)?;
    let ends = &json["sources"][0]["kafka"]["orders"];
    for p in 0..PARTITIONS {
        let (_, high) = s.broker.watermarks("orders", p)?;
        assert_eq!(
            ends[p.to_string()],
            serde_json::json!(high),
            "{what}: partition {p} in offsets/{last}"
        );
    }
    Ok(())
}

/// Records per Delta commit, from the `add` actions' statistics.
fn rows_in(actions: &[Value]) -> Result<u64> {
    let mut n = 0;
    for add in actions.iter().filter_map(|a| a.get("add")) {
        let stats: Value = serde_json::from_str(add["stats"].as_str().context("add.stats")?)?;
        n += stats["numRecords"].as_u64().context("numRecords")?;
    }
    Ok(n)
}

fn kafka_to_delta(s: &Setup) -> Result<()> {
    let batches = s.reference.batches();
    for killed in KILLED {
        for phase in phases() {
            let tag = format!("{phase}-{killed}");
            let file = s.ws.pipeline(
                &format!("delta-{tag}.toml"),
                &pipeline(
                    &tag,
                    &s.broker.bootstrap(),
                    &format!("[sink]\nkind = \"delta\"\npath = \"tables/{tag}\"\n"),
                ),
            )?;
            run_killed_at(EXE, &cache(), &file, &format!("{phase}@{killed}"))?;
            let checkpoint = s.ws.path().join("checkpoints").join(&tag);
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
            let table = s.ws.path().join("tables").join(&tag);
            let id = query_id(&checkpoint)?;
            // Every commit after the first (CREATE TABLE; no commit at all when the kill came
            // before the sink's first write), with its txn.
            let txns = |log: &[Vec<Value>]| -> Vec<Option<(String, i64)>> {
                log.iter().skip(1).map(|c| txn_of(c)).collect()
            };
            // Only a kill after the sink committed leaves the killed batch in the table.
            let in_table: Vec<u64> = if phase == "before-commit" {
                (0..=killed).collect()
            } else {
                (0..killed).collect()
            };
            assert_eq!(
                txns(&commits(&table)?),
                in_table
                    .iter()
                    .map(|b| Some((id.clone(), *b as i64)))
                    .collect::<Vec<_>>(),
                "{tag}: Delta commits after the kill"
            );

            let out = run_ok(EXE, &cache(), &file, &[])?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            let skipped = stderr.contains(&format!(
                "batch {killed} is already in the Delta table: skipped"
            ));
            assert_eq!(skipped, phase == "before-commit", "{tag}: {stderr}");
            assert_eq!(commit_ids(&checkpoint)?, batches, "{tag}");
            assert_offsets_reach_the_end(s, &checkpoint, &tag)?;

            // One commit per batch, txn version = batch id, each with exactly the batch's rows.
            let log = commits(&table)?;
            assert_eq!(
                txns(&log),
                batches
                    .iter()
                    .map(|b| Some((id.clone(), *b as i64)))
                    .collect::<Vec<_>>(),
                "{tag}: one commit per batch"
            );
            for (b, actions) in batches.iter().zip(log.iter().skip(1)) {
                assert_eq!(
                    rows_in(actions)? as usize,
                    s.reference.rows[b].len(),
                    "{tag}: rows of batch {b}"
                );
            }
            // And the rows themselves, every column, by both readers.
            same_rows(
                &own_rows(&table)?,
                &s.reference.canonical,
                &format!("{tag}: own reader"),
            )?;
            let py = py_read(&table, &id, &[])?;
            same_rows(
                &py_rows(&py)?,
                &s.reference.canonical,
                &format!("{tag}: python reader"),
            )?;
            assert_eq!(
                py["txn"],
                serde_json::json!(batches.last()),
                "{tag}: python txn version"
            );
        }
    }
    Ok(())
}

/// The output topic as the tests can see it: rows by the batch the reference puts them in,
/// and the batch ids of the markers, in offset order.
struct Output {
    rows: BTreeMap<u64, Vec<String>>,
    markers: Vec<String>,
}

fn read_output(s: &Setup, topic: &str, id: &str, what: &str) -> Result<Output> {
    let mut out = Output {
        rows: BTreeMap::new(),
        markers: Vec::new(),
    };
    // Partition 0 holds the markers after their batch's rows: the rows between two markers
    // belong to the batch of the second one.
    let mut since_marker: Vec<u64> = Vec::new();
    for r in s.broker.read_all(topic, 2)? {
        match (&r.marker, &r.value) {
            (Some(m), None) => {
                assert_eq!(r.partition, 0, "{what}: markers go to partition 0");
                let batch: u64 = m
                    .strip_prefix(&format!("{id}/"))
                    .with_context(|| format!("{what}: marker {m} of another query"))?
                    .parse()?;
                assert!(
                    since_marker.iter().all(|b| *b == batch),
                    "{what}: rows of batches {since_marker:?} before the marker of batch {batch}"
                );
                since_marker.clear();
                out.markers.push(m.clone());
            }
            (None, Some(v)) => {
                let row = String::from_utf8(v.clone())?;
                let batch = *s
                    .reference
                    .batch_of
                    .get(&row)
                    .with_context(|| format!("{what}: a row no batch wrote: {row}"))?;
                if r.partition == 0 {
                    since_marker.push(batch);
                }
                out.rows.entry(batch).or_default().push(row);
            }
            other => anyhow::bail!("{what}: unexpected record {other:?}"),
        }
    }
    for rows in out.rows.values_mut() {
        rows.sort();
    }
    Ok(out)
}

fn markers(id: &str, batches: &[u64]) -> Vec<String> {
    batches.iter().map(|b| format!("{id}/{b}")).collect()
}

fn kafka_to_kafka(s: &Setup) -> Result<()> {
    let batches = s.reference.batches();
    let mut expected = s.reference.rows.clone();
    for rows in expected.values_mut() {
        rows.sort();
    }
    for killed in KILLED {
        for phase in phases() {
            let tag = format!("kafka-{phase}-{killed}");
            let topic = format!("out-{phase}-{killed}");
            s.broker.create_topic(&topic, 2)?;
            let sink = format!(
                "[sink]\nkind = \"kafka\"\nbootstrap_servers = \"{}\"\ntopic = \"{topic}\"\ndelivery = \"exactly-once\"\n",
                s.broker.bootstrap()
            );
            let file = s.ws.pipeline(
                &format!("{tag}.toml"),
                &pipeline(&tag, &s.broker.bootstrap(), &sink),
            )?;
            run_killed_at(EXE, &cache(), &file, &format!("{phase}@{killed}"))?;
            let checkpoint = s.ws.path().join("checkpoints").join(&tag);
            let id = query_id(&checkpoint)?;
            assert_eq!(
                commit_ids(&checkpoint)?,
                (0..killed).collect::<Vec<_>>(),
                "{tag}"
            );
            let before = read_output(s, &topic, &id, &tag)?;
            // Only a kill after the transaction committed leaves the killed batch's marker.
            let marked: Vec<u64> = if phase == "before-commit" {
                (0..=killed).collect()
            } else {
                (0..killed).collect()
            };
            assert_eq!(
                before.markers,
                markers(&id, &marked),
                "{tag}: after the kill"
            );

            let out = run_ok(EXE, &cache(), &file, &[])?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            let skipped = stderr.contains(&format!("batch {killed} is already in the topic"));
            assert_eq!(skipped, phase == "before-commit", "{tag}: {stderr}");
            assert_eq!(commit_ids(&checkpoint)?, batches, "{tag}");
            assert_offsets_reach_the_end(s, &checkpoint, &tag)?;

            let after = read_output(s, &topic, &id, &tag)?;
            assert_eq!(
                after.markers,
                markers(&id, &batches),
                "{tag}: one marker per batch id, never two"
            );
            for b in &batches {
                let got = after.rows.get(b).cloned().unwrap_or_default();
                if phase == "in-sink" && *b == killed {
                    // The kill came after the rows were flushed, before the marker: the
                    // aborted attempt stays visible on these brokers, so every row of the
                    // batch is there twice, and nothing that is not the batch's.
                    let twice: Vec<String> = expected[b]
                        .iter()
                        .flat_map(|r| [r.clone(), r.clone()])
                        .collect();
                    assert_eq!(got, twice, "{tag}: rows of batch {b}");
                } else {
                    assert_eq!(got, expected[b], "{tag}: rows of batch {b}");
                }
            }
        }
    }
    Ok(())
}

#[test]
fn kafka_to_delta_survives_a_kill_at_every_phase_of_a_batch() -> Result<()> {
    kafka_to_delta(&setup(Broker::start()?)?)
}

#[test]
fn kafka_to_kafka_survives_a_kill_at_every_phase_of_a_batch() -> Result<()> {
    kafka_to_kafka(&setup(Broker::start()?)?)
}

#[test]
fn kafka_to_delta_on_tansu_survives_a_kill_at_every_phase_of_a_batch() -> Result<()> {
    kafka_to_delta(&setup(Broker::tansu()?)?)
}
