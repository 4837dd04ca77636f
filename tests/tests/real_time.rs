//! Real-time mode end to end through the `weir` binary: JSON orders (some malformed) on a
//! 4-partition topic, a Wasm transform, parts of at most 40 records, a 300 ms checkpoint
//! interval; a second wave of orders is produced once batch 0 is committed, and the process is
//! killed with SIGKILL at every phase of batch 1 ([`Phase::ALL`]; `in-transform` is while its
//! parts run, before anything of it is durable), restarted, and stopped with SIGTERM once every
//! record is committed. Every valid order must come out exactly once, whole, into files, Delta
//! and Kafka.
//!
//! The reference is the same pipeline on the available-now trigger over a topic holding both
//! waves. Real-time batches are cut by time, so rows are compared as a whole, not batch by
//! batch. What the Kafka test cannot check is what `e2e_kafka.rs` says of the mock cluster:
//! it shows the rows of an aborted transaction, so the test checks the markers (one per
//! batch, none twice) and that any row seen twice is one of the killed batch's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use weir_host::failpoint::Phase;
use weir_tests::delta::{commits, own_rows, txn_of};
use weir_tests::kafka::{Broker, order_lines};
use weir_tests::{
    SCHEMA, Workspace, commit_ids, json_rows, offset_entry, query_id, run_ok, same_rows,
    sorted_output,
};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");
const PARTITIONS: i32 = 4;
const KILLED: u64 = 1;
const TIMEOUT: Duration = Duration::from_secs(90);

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

/// `topic` (Kafka) → normalize_status (Wasm) → `sink`.
fn pipeline(tag: &str, bootstrap: &str, topic: &str, trigger: &str, sink: &str) -> String {
    format!(
        r#"
[query]
name = "rt_{tag}"
checkpoint = "checkpoints/{tag}"
trigger = {trigger}

[[source]]
name = "orders"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
subscribe = ["{topic}"]
starting_offsets = "earliest"
max_offsets_per_trigger = 40
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

const REAL_TIME: &str = r#"{ real_time = "300ms", max_latency = "5ms" }"#;

struct Setup {
    ws: Workspace,
    broker: Broker,
    /// The order lines, in two waves.
    waves: [Vec<String>; 2],
    /// The reference's rows (JSON lines), sorted.
    reference: Vec<String>,
}

impl Setup {
    /// Writes `{tag}.toml`: [`pipeline`] on topic `tag` into `sink`, on [`REAL_TIME`].
    fn real_time(&self, tag: &str, sink: &str) -> Result<PathBuf> {
        let text = pipeline(tag, &self.broker.bootstrap(), tag, REAL_TIME, sink);
        self.ws.pipeline(&format!("{tag}.toml"), &text)
    }
}

fn setup() -> Result<Setup> {
    let ws = Workspace::new(4, 200)?;
    let broker = Broker::start()?;
    let orders = order_lines(&ws.path().join("data/orders"))?;
    let (a, b) = orders.split_at(orders.len() / 2);
    broker.create_topic("reference", PARTITIONS)?;
    broker.produce("reference", PARTITIONS, &orders)?;
    let file = ws.pipeline(
        "reference.toml",
        &pipeline(
            "reference",
            &broker.bootstrap(),
            "reference",
            "\"available-now\"",
            "[sink]\nkind = \"files\"\npath = \"out/reference\"\nformat = \"json\"\n",
        ),
    )?;
    run_ok(EXE, &cache(), &file, &[])?;
    let reference = sorted_output(&ws.path().join("out/reference"))?;
    ensure!(
        reference.len() as u64 == ws.orders.lines - ws.orders.malformed,
        "the reference holds {} rows, the generator wrote {} valid orders",
        reference.len(),
        ws.orders.lines - ws.orders.malformed
    );
    Ok(Setup {
        ws,
        broker,
        waves: [a.to_vec(), b.to_vec()],
        reference,
    })
}

fn spawn(s: &Setup, file: &Path, failpoint: Option<&str>, log: &str) -> Result<Child> {
    let mut cmd = Command::new(EXE);
    cmd.arg("run")
        .arg(file)
        .arg("--cache-dir")
        .arg(cache())
        .env_remove("WEIR_LOG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(s.ws.path().join(log))?);
    if let Some(f) = failpoint {
        cmd.args(["--failpoint", f]);
    }
    cmd.spawn().context("starting weir")
}

fn wait_until(what: &str, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let started = Instant::now();
    while !done()? {
        if started.elapsed() > TIMEOUT {
            bail!("timed out waiting until {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Records in `topic` (every partition's high watermark, summed).
fn records(s: &Setup, topic: &str) -> Result<i64> {
    let mut total = 0;
    for p in 0..PARTITIONS {
        total += s.broker.watermarks(topic, p)?.1;
    }
    Ok(total)
}

/// The offsets the last committed batch read up to, summed over the partitions.
fn committed_end(checkpoint: &Path, topic: &str) -> Result<i64> {
    let Some(&last) = commit_ids(checkpoint)?.last() else {
        return Ok(0);
    };
    let entry: Value = offset_entry(checkpoint, last)?;
    let ends = entry["sources"][0]["kafka"][topic]
        .as_object()
        .context("kafka ends")?;
    Ok(ends.values().filter_map(Value::as_i64).sum())
}

/// Runs `file` on `topic` (with the two waves of `s`) through a kill at `phase` of batch
/// [`KILLED`] (none: uninterrupted), and a restart stopped by SIGTERM once all is committed.
/// Returns the restart's stderr.
fn run_through(
    s: &Setup,
    file: &Path,
    tag: &str,
    topic: &str,
    phase: Option<&str>,
) -> Result<String> {
    run_waves(s, file, tag, phase, topic, &s.waves)
}

fn run_waves(
    s: &Setup,
    file: &Path,
    tag: &str,
    phase: Option<&str>,
    topic: &str,
    waves: &[Vec<String>; 2],
) -> Result<String> {
    let checkpoint = s.ws.path().join("checkpoints").join(tag);
    s.broker.create_topic(topic, PARTITIONS)?;
    run_with(
        s,
        file,
        tag,
        phase,
        || s.broker.produce(topic, PARTITIONS, &waves[0]),
        || s.broker.produce(topic, PARTITIONS, &waves[1]),
        || Ok(committed_end(&checkpoint, topic)? >= records(s, topic)?),
    )
}

/// Runs `file`: `first` before it starts, `second` once batch 0 is committed, through a
/// kill at `phase` of batch [`KILLED`] (none: uninterrupted) and a restart, stopped by SIGTERM
/// once `done`. Returns the last run's stderr.
fn run_with(
    s: &Setup,
    file: &Path,
    tag: &str,
    phase: Option<&str>,
    first: impl FnOnce() -> Result<()>,
    second: impl FnOnce() -> Result<()>,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<String> {
    use std::os::unix::process::ExitStatusExt;
    let checkpoint = s.ws.path().join("checkpoints").join(tag);
    first()?;
    let failpoint = phase.map(|p| format!("{p}@{KILLED}"));
    let mut child = spawn(s, file, failpoint.as_deref(), &format!("{tag}-1.log"))?;
    wait_until(&format!("{tag}: batch 0 is committed"), || {
        Ok(commit_ids(&checkpoint)?.contains(&0))
    })?;
    second()?;
    if phase.is_some() {
        let status = child.wait()?;
        ensure!(
            status.signal() == Some(9),
            "{tag}: the failpoint should have killed weir, it ended with {status}: {}",
            std::fs::read_to_string(s.ws.path().join(format!("{tag}-1.log")))?
        );
        ensure!(
            !commit_ids(&checkpoint)?.contains(&KILLED),
            "{tag}: batch {KILLED} committed before its kill"
        );
        child = spawn(s, file, None, &format!("{tag}-2.log"))?;
    }
    wait_until(&format!("{tag}: every record is committed"), &mut done)?;
    let pid = child.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status()?;
    ensure!(killed.success(), "kill -TERM {pid}");
    let status = child.wait()?;
    let log = std::fs::read_to_string(
        s.ws.path()
            .join(format!("{tag}-{}.log", if phase.is_some() { 2 } else { 1 })),
    )?;
    ensure!(status.success(), "{tag}: weir ended with {status}: {log}");
    // Every batch committed has its offsets, and the parts of each are recorded.
    for b in commit_ids(&checkpoint)? {
        let entry = offset_entry(&checkpoint, b)?;
        ensure!(
            !entry["sources"][0]["realTimeParts"].is_null(),
            "{tag}: offsets/{b} lacks its parts: {entry}"
        );
    }
    Ok(log)
}

/// The order ids of those of `lines` that are JSON with one.
fn order_ids(lines: &[String]) -> std::collections::HashSet<i64> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["order_id"].as_i64())
        .collect()
}

/// The lines a files sink wrote, batch after batch, in the order written.
fn lines_in_order(dir: &Path) -> Result<Vec<String>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "json"));
    files.sort();
    let mut out = Vec::new();
    for f in files {
        out.extend(weir_tests::lines(&f)?);
    }
    Ok(out)
}

fn phases() -> impl Iterator<Item = Option<&'static str>> {
    std::iter::once(None).chain(Phase::ALL.iter().map(|(name, _)| Some(*name)))
}

fn tag_of(sink: &str, phase: Option<&str>) -> String {
    format!("{sink}-{}", phase.unwrap_or("uninterrupted"))
}

#[test]
fn kafka_to_files_in_real_time_survives_a_kill_at_every_phase() -> Result<()> {
    let s = setup()?;
    for phase in phases() {
        // The files sink takes a batch when its interval ends and has no in-sink point.
        if phase == Some("in-sink") {
            continue;
        }
        let tag = tag_of("files", phase);
        let file = s.real_time(
            &tag,
            &format!("[sink]\nkind = \"files\"\npath = \"out/{tag}\"\nformat = \"json\"\n"),
        )?;
        run_through(&s, &file, &tag, &tag, phase)?;
        let got = sorted_output(&s.ws.path().join("out").join(&tag))?;
        assert_eq!(got.len(), s.reference.len(), "{tag}: rows");
        assert_eq!(got, s.reference, "{tag}: every order exactly once");
        // A batch's progress has the latency of its rows.
        let progress = weir_tests::progress(&s.ws.path().join("checkpoints").join(&tag))?;
        let with_latency = progress
            .iter()
            .filter(|p| p["latencyMs"]["rows"].as_u64().is_some_and(|r| r > 0))
            .count();
        assert!(with_latency > 0, "{tag}: no latency in {progress:?}");
    }
    Ok(())
}

#[test]
fn kafka_to_delta_in_real_time_survives_a_kill_at_every_phase() -> Result<()> {
    let s = setup()?;
    let expected = json_rows(&s.reference, SCHEMA)?;
    for phase in phases() {
        let tag = tag_of("delta", phase);
        let file = s.real_time(
            &tag,
            &format!("[sink]\nkind = \"delta\"\npath = \"tables/{tag}\"\n"),
        )?;
        run_through(&s, &file, &tag, &tag, phase)?;
        let table = s.ws.path().join("tables").join(&tag);
        same_rows(&own_rows(&table)?, &expected, &tag)?;
        // One commit per batch, its txn version the batch id, none twice.
        let checkpoint = s.ws.path().join("checkpoints").join(&tag);
        let id = query_id(&checkpoint)?;
        let txns: Vec<Option<(String, i64)>> =
            commits(&table)?.iter().skip(1).map(|c| txn_of(c)).collect();
        let batches: Vec<Option<(String, i64)>> = commit_ids(&checkpoint)?
            .into_iter()
            .map(|b| Some((id.clone(), b as i64)))
            .collect();
        assert_eq!(txns, batches, "{tag}: Delta commits");
    }
    Ok(())
}

#[test]
fn kafka_to_kafka_in_real_time_survives_a_kill_at_every_phase() -> Result<()> {
    let s = setup()?;
    for phase in phases() {
        let tag = tag_of("kafka", phase);
        let out_topic = format!("{tag}-out");
        s.broker.create_topic(&out_topic, 1)?;
        let file = s.real_time(
            &tag,
            &format!(
                "[sink]\nkind = \"kafka\"\nbootstrap_servers = \"{}\"\ntopic = \"{out_topic}\"\n",
                s.broker.bootstrap()
            ),
        )?;
        let log = run_through(&s, &file, &tag, &tag, phase)?;
        let checkpoint = s.ws.path().join("checkpoints").join(&tag);
        let id = query_id(&checkpoint)?;
        let read = s.broker.read_all(&out_topic, 1)?;
        let markers: Vec<String> = read.iter().filter_map(|r| r.marker.clone()).collect();
        let batches = commit_ids(&checkpoint)?;
        assert_eq!(
            markers,
            batches
                .iter()
                .map(|b| format!("{id}/{b}"))
                .collect::<Vec<_>>(),
            "{tag}: one marker per batch, in order"
        );
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for r in &read {
            if r.marker.is_none()
                && let Some(v) = &r.value
                && v.first() == Some(&b'{')
            {
                *counts.entry(String::from_utf8(v.clone())?).or_default() += 1;
            }
        }
        let mut distinct: Vec<String> = counts.keys().cloned().collect();
        distinct.sort();
        assert_eq!(distinct, s.reference, "{tag}: every order, whole");
        // Rows twice only where the mock shows an aborted transaction: the killed batch's
        // (its second wave), killed while its transaction was open.
        let twice: Vec<&String> = counts
            .iter()
            .filter(|(_, c)| **c > 1)
            .map(|(r, _)| r)
            .collect();
        assert!(counts.values().all(|&c| c <= 2), "{tag}: a row thrice");
        let aborted_possible = matches!(phase, Some("in-transform" | "after-offsets" | "in-sink"));
        if !aborted_possible {
            assert!(twice.is_empty(), "{tag}: rows twice: {twice:?}");
        }
        let first_wave = order_ids(&s.waves[0]);
        ensure!(!first_wave.is_empty(), "no orders in the first wave");
        for row in twice {
            let v: Value = serde_json::from_str(row)?;
            assert!(
                !first_wave.contains(&v["order_id"].as_i64().unwrap_or_default()),
                "{tag}: a row of batch 0 twice: {row}"
            );
        }
        if phase == Some("before-commit") {
            assert!(
                log.contains(&format!("batch {KILLED} is already in the topic")),
                "{tag}: the restart should have found batch {KILLED} written: {log}"
            );
        }
    }
    Ok(())
}

#[test]
fn update_mode_counts_and_dedup_in_real_time_survive_a_kill() -> Result<()> {
    let s = setup()?;
    // The count of each status, from the reference's rows.
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    for row in json_rows(&s.reference, SCHEMA)? {
        *want
            .entry(row["status"].as_str().unwrap_or("null").to_owned())
            .or_default() += 1;
    }
    let aggregate = "[aggregate]\ngroup_by = [\"status\"]\nselect = [\"count(*) AS n\"]\n";
    for phase in [None, Some("after-offsets"), Some("in-transform")] {
        let tag = tag_of("count", phase);
        let text = pipeline(
            &tag,
            &s.broker.bootstrap(),
            &tag,
            REAL_TIME,
            &format!(
                "{aggregate}\n[sink]\nkind = \"files\"\npath = \"out/{tag}\"\nformat = \"json\"\n"
            ),
        )
        .replace("trigger = {", "output_mode = \"update\"\ntrigger = {");
        let file = s.ws.pipeline(&format!("{tag}.toml"), &text)?;
        run_through(&s, &file, &tag, &tag, phase)?;
        // Each update replaces the last one of its status; the last ones are the counts.
        let mut got: BTreeMap<String, i64> = BTreeMap::new();
        let updates = lines_in_order(&s.ws.path().join("out").join(&tag))?;
        for line in &updates {
            let v: Value = serde_json::from_str(line)?;
            got.insert(
                v["status"].as_str().unwrap_or("null").to_owned(),
                v["n"].as_i64().context("n")?,
            );
        }
        assert_eq!(got, want, "{tag}: counts");
        // Parts emit as they pass: more updates than statuses.
        assert!(
            updates.len() > want.len(),
            "{tag}: {} updates",
            updates.len()
        );
    }

    // The second wave repeats the first: dedup on order_id keeps each order once.
    let dedup = "[deduplicate]\nkeys = [\"order_id\"]\n";
    let repeated = [s.waves[0].clone(), s.waves[0].clone()];
    let first_wave: Vec<String> = {
        let ids = order_ids(&s.waves[0]);
        s.reference
            .iter()
            .filter(|line| {
                serde_json::from_str::<Value>(line)
                    .ok()
                    .and_then(|v| v["order_id"].as_i64())
                    .is_some_and(|id| ids.contains(&id))
            })
            .cloned()
            .collect()
    };
    ensure!(!first_wave.is_empty(), "no rows of the first wave");
    for phase in [None, Some("after-offsets"), Some("before-commit")] {
        let tag = tag_of("dedup", phase);
        let file = s.real_time(
            &tag,
            &format!(
                "{dedup}\n[sink]\nkind = \"files\"\npath = \"out/{tag}\"\nformat = \"json\"\n"
            ),
        )?;
        run_waves(&s, &file, &tag, phase, &tag, &repeated)?;
        let got = sorted_output(&s.ws.path().join("out").join(&tag))?;
        assert_eq!(got, first_wave, "{tag}: each order once");
    }
    Ok(())
}

#[test]
fn a_files_source_in_real_time_survives_a_kill() -> Result<()> {
    let s = setup()?;
    let expected = weir_tests::files_reference(&s.ws, EXE, &cache())?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(s.ws.path().join("data/orders"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.sort();
    ensure!(files.len() == 4, "{files:?}");
    for phase in [None, Some("after-offsets"), Some("before-commit")] {
        let tag = tag_of("folder", phase);
        let incoming = s.ws.path().join("incoming").join(&tag);
        std::fs::create_dir_all(&incoming)?;
        let file = s.ws.pipeline(
            &format!("{tag}.toml"),
            &format!(
                "[query]\nname = \"{tag}\"\ncheckpoint = \"checkpoints/{tag}\"\ntrigger = {REAL_TIME}\n\n\
                 [[source]]\nname = \"orders\"\nkind = \"files\"\npath = \"incoming/{tag}\"\nformat = \"json\"\n\
                 schema = \"{SCHEMA}\"\non_malformed = \"drop\"\nmax_files_per_trigger = 1\n\n\
                 [sink]\nkind = \"files\"\npath = \"out/{tag}\"\nformat = \"json\"\n"
            ),
        )?;
        let checkpoint = s.ws.path().join("checkpoints").join(&tag);
        // Written whole, then renamed in: the source must never see half a file.
        let copy = |from: &[PathBuf]| -> Result<()> {
            for f in from {
                let name = f.file_name().context("name")?;
                let tmp = s.ws.path().join("incoming").join(name);
                std::fs::copy(f, &tmp)?;
                std::fs::rename(&tmp, incoming.join(name))?;
            }
            Ok(())
        };
        run_with(
            &s,
            &file,
            &tag,
            phase,
            || copy(&files[..2]),
            || copy(&files[2..]),
            || {
                let mut taken = 0;
                for b in commit_ids(&checkpoint)? {
                    let entry = offset_entry(&checkpoint, b)?;
                    taken += entry["sources"][0]["files"].as_array().map_or(0, Vec::len);
                }
                Ok(taken >= files.len())
            },
        )?;
        let got = sorted_output(&s.ws.path().join("out").join(&tag))?;
        assert_eq!(got, expected, "{tag}: every order exactly once");
        // A part per file (max_files_per_trigger = 1): batch 0 took two.
        let entry = offset_entry(&checkpoint, 0)?;
        assert_eq!(
            entry["sources"][0]["realTimeParts"],
            serde_json::json!([1, 1]),
            "{tag}"
        );
    }
    Ok(())
}

#[test]
fn a_stream_static_join_in_real_time_survives_a_kill() -> Result<()> {
    let s = setup()?;
    weir_host::examples::write_customers(&s.ws.path().join("data/customers"), 50_000)?;
    let join = "[[table]]\nname = \"customers\"\nkind = \"files\"\npath = \"data/customers\"\n\
                format = \"json\"\nschema = \"customer_id BIGINT, name STRING, country STRING, tier STRING\"\n\n\
                [join]\nleft = \"orders\"\nright = \"customers\"\ntype = \"left\"\non = [\"customer_id\"]\n";
    let sink = |tag: &str| {
        format!("{join}\n[sink]\nkind = \"files\"\npath = \"out/{tag}\"\nformat = \"json\"\n")
    };
    // The same join over both waves at once, on the available-now trigger.
    let reference = s.ws.pipeline(
        "join-reference.toml",
        &pipeline(
            "join-reference",
            &s.broker.bootstrap(),
            "reference",
            "\"available-now\"",
            &sink("join-reference"),
        ),
    )?;
    run_ok(EXE, &cache(), &reference, &[])?;
    let expected = sorted_output(&s.ws.path().join("out/join-reference"))?;
    ensure!(expected.len() == s.reference.len(), "the join's reference");
    ensure!(
        expected.iter().all(|l| l.contains("\"country\"")),
        "the reference rows lack the customers' columns"
    );
    for phase in [None, Some("after-offsets")] {
        let tag = tag_of("join", phase);
        let file = s.real_time(&tag, &sink(&tag))?;
        run_through(&s, &file, &tag, &tag, phase)?;
        let got = sorted_output(&s.ws.path().join("out").join(&tag))?;
        assert_eq!(got, expected, "{tag}: every order joined, exactly once");
        // Each batch recorded the snapshot of the table it joined.
        let checkpoint = s.ws.path().join("checkpoints").join(&tag);
        for b in commit_ids(&checkpoint)? {
            let entry = offset_entry(&checkpoint, b)?;
            assert!(
                entry["tables"].as_array().is_some_and(|t| t.len() == 1),
                "{tag}: offsets/{b}"
            );
        }
    }
    Ok(())
}
