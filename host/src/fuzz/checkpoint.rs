//! Fuzzing the readers of a checkpoint directory and of the logs the sources keep in it.
//!
//! A checkpoint lives for weeks and is damaged by crashes, disks, copies and people; every file
//! in it is read back as untrusted input. Targets: the `metadata` and `secret` files
//! ([`Checkpoint::open`]), the `lock` file's holder record (read when the lock is taken), the
//! numbered entries of `offsets/`, `commits/` and `sources/<i>/` read as every entry type the host
//! stores ([`BatchLog::get`], [`BatchLog::ids`]), the files source and the Delta source reading
//! damaged source-log entries, the Delta source reading damaged commit files of its table, and
//! the Delta sink reading (and replaying) damaged lists of its pending files.
//! Inputs are arbitrary bytes, byte mutations of valid files, and JSON-level mutations (a value
//! replaced by one of another type or an extreme number, a key removed), which get past the JSON
//! parser into the typed checks. Properties: no panic; a damaged entry is
//! [`CheckpointError::Corrupt`] naming the file; an entry that reads back was written as
//! `v1\n<json>\n`; entries round-trip through `put`/`get`; a source never reads a file outside
//! its folder or table, and the sink never deletes one outside its table.
//!
//! Budget: about 5 000 cases, a few seconds; the slow part is the fsync of each `put`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::{ByteEdit, Reach, byte_edits, mutate, run};
use crate::checkpoint::{BatchLog, Checkpoint, CheckpointError, MAX_BATCH_ID, Metadata};
use crate::decode::{Decoder, DecoderOptions};
use crate::query::{CommitEntry, OffsetEntry, PluginBuild, SourceOffset};
use crate::source::delta::{DeltaFile, DeltaLogEntry, Position};
use crate::source::files::{FileEntry, FilesLogEntry};
use crate::source::{DeltaSource, FilesSource, Recorded, Source};

/// One JSON-level mutation: the `n`-th node (pre-order, modulo the count) replaced or removed.
#[derive(Debug, Clone)]
pub(super) enum JsonEdit {
    Replace(usize, Value),
    Remove(usize),
}

fn hostile_json() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => proptest::sample::select(vec![
            Value::Null,
            json!(true),
            json!(0),
            json!(-1),
            json!(i64::MIN),
            json!(i64::MAX),
            json!(u64::MAX),
            json!(MAX_BATCH_ID),
            json!(1.5),
            json!(-1e308),
            json!(""),
            json!(".."),
            json!("../outside.json"),
            json!("../outside.parquet"),
            json!("/etc/passwd"),
            json!("a/b"),
            json!("%2e%2e/outside.parquet"),
            json!("a\u{0}b"),
            json!([]),
            json!({}),
            json!([null]),
            json!({ "files": [] }),
            json!({ "version": 0, "index": u64::MAX, "snapshot": true }),
            json!({ "version": u64::MAX, "index": 0 }),
        ]),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => any::<String>().prop_map(Value::from),
    ]
}

pub(super) fn json_edits() -> impl Strategy<Value = Vec<JsonEdit>> {
    let edit = prop_oneof![
        4 => (any::<usize>(), hostile_json()).prop_map(|(n, v)| JsonEdit::Replace(n, v)),
        1 => any::<usize>().prop_map(JsonEdit::Remove),
    ];
    proptest::collection::vec(edit, 1..4)
}

fn count_nodes(v: &Value) -> usize {
    1 + match v {
        Value::Array(items) => items.iter().map(count_nodes).sum(),
        Value::Object(map) => map.values().map(count_nodes).sum(),
        _ => 0,
    }
}

/// Applies `edit` to the node numbered `*n` (counting down); true once done.
fn edit_node(v: &mut Value, n: &mut usize, edit: &JsonEdit) -> bool {
    if *n == 0 {
        if let JsonEdit::Replace(_, new) = edit {
            *v = new.clone();
        }
        return true;
    }
    *n -= 1;
    match v {
        Value::Array(items) => {
            for i in 0..items.len() {
                if *n == 0 && matches!(edit, JsonEdit::Remove(_)) {
                    items.remove(i);
                    return true;
                }
                if edit_node(&mut items[i], n, edit) {
                    return true;
                }
            }
        }
        Value::Object(map) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                if *n == 0 && matches!(edit, JsonEdit::Remove(_)) {
                    map.remove(&key);
                    return true;
                }
                if let Some(child) = map.get_mut(&key)
                    && edit_node(child, n, edit)
                {
                    return true;
                }
            }
        }
        _ => {}
    }
    false
}

pub(super) fn apply_json(mut v: Value, edits: &[JsonEdit]) -> Value {
    for edit in edits {
        let (JsonEdit::Replace(n, _) | JsonEdit::Remove(n)) = edit;
        let mut n = n % count_nodes(&v);
        edit_node(&mut v, &mut n, edit);
    }
    v
}

fn entry_bytes(v: &Value) -> Vec<u8> {
    format!("v1\n{v}\n").into_bytes()
}

/// How a damaged file's bytes are made.
#[derive(Debug, Clone)]
enum Damage {
    Bytes(Vec<u8>),
    Mutated(Vec<ByteEdit>),
    Json(Vec<JsonEdit>),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..200).prop_map(Damage::Bytes),
        2 => byte_edits(4).prop_map(Damage::Mutated),
        3 => json_edits().prop_map(Damage::Json),
    ]
}

/// The damaged version of the entry `v1\n<valid>\n`.
fn damaged_entry(valid: &Value, damage: &Damage) -> Vec<u8> {
    match damage {
        Damage::Bytes(bytes) => bytes.clone(),
        Damage::Mutated(edits) => mutate(&entry_bytes(valid), edits),
        Damage::Json(edits) => entry_bytes(&apply_json(valid.clone(), edits)),
    }
}

fn sample_offsets() -> Value {
    json!({
        "batchWatermarkMs": 1_709_251_200_000i64,
        "lateRowWatermarkMs": 1_709_251_100_000i64,
        "batchTimestampMs": 1_709_251_300_000i64,
        "sources": [
            { "name": "orders", "logOffset": 3, "watermarkMs": 1_709_251_200_000i64 },
            { "name": "k", "logOffset": 3, "kafka": { "t": { "0": 10, "1": 20 } }, "kafkaStart": { "t": { "0": 5 } } }
        ],
        "plugins": [ { "name": "filter", "sha256": "00ff" } ]
    })
}

fn sample_commit() -> Value {
    json!({ "nextBatchWatermarkMs": 5, "nextSourceWatermarksMs": [5, i64::MIN] })
}

fn sample_files_entry() -> Value {
    json!({ "files": [
        { "name": "a.json", "size": 18, "mtime_ms": 1_700_000_000_000i64 },
        { "name": "b.json", "size": 9, "mtime_ms": 1_700_000_000_001i64 }
    ] })
}

fn sample_delta_entry() -> Value {
    json!({
        "files": [
            { "version": 0, "index": 0, "path": "p=1/part-0.parquet", "size": 500,
              "partition_values": { "p": "1" }, "snapshot": true },
            { "version": 1, "index": 0, "path": "part-1.parquet", "size": 500 }
        ],
        "next": { "version": 1, "index": 1, "snapshot": false }
    })
}

/// Checks that entry `n` of `log`, holding `bytes`, reads as every entry type without a panic;
/// returns how many types it read as.
fn check_get(log: &BatchLog<'_>, n: u64, bytes: &[u8]) -> Result<usize, TestCaseError> {
    let path = log.entry_path(n);
    let well_formed = bytes.starts_with(b"v1\n") && bytes.ends_with(b"\n");
    fn outcome<T>(
        r: Result<Option<T>, CheckpointError>,
        path: &Path,
        well_formed: bool,
    ) -> Result<usize, TestCaseError> {
        match r {
            Ok(Some(_)) => {
                prop_assert!(well_formed, "a damaged entry was read");
                return Ok(1);
            }
            Ok(None) => prop_assert!(false, "the entry exists"),
            Err(CheckpointError::Corrupt { file, reason }) => {
                prop_assert_eq!(&file, path);
                prop_assert!(!reason.is_empty());
            }
            Err(e) => prop_assert!(false, "not a Corrupt error: {e}"),
        }
        Ok(0)
    }
    Ok(outcome(log.get::<OffsetEntry>(n), &path, well_formed)?
        + outcome(log.get::<CommitEntry>(n), &path, well_formed)?
        + outcome(log.get::<Value>(n), &path, well_formed)?
        + outcome(log.get::<FilesLogEntry>(n), &path, well_formed)?
        + outcome(log.get::<DeltaLogEntry>(n), &path, well_formed)?
        + outcome(
            log.get::<crate::source::kafka::PartitionOffsets>(n),
            &path,
            well_formed,
        )?
        + outcome(log.get::<Metadata>(n), &path, well_formed)?)
}

#[test]
fn fuzz_checkpoint_log_entries() {
    let dir = tempfile::tempdir().expect("temp dir");
    let checkpoint = Checkpoint::open(dir.path()).expect("new checkpoint");
    let samples = [
        sample_offsets(),
        sample_commit(),
        sample_files_entry(),
        sample_delta_entry(),
    ];
    let strategy = (0..samples.len(), damage(), 0..=MAX_BATCH_ID);
    let typed = Reach::default();
    run(1_500, strategy, |(sample, damage, n)| {
        let bytes = damaged_entry(&samples[sample], &damage);
        let log = checkpoint.source_log(sample);
        std::fs::create_dir_all(log.dir()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        std::fs::write(log.entry_path(n), &bytes)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        // `Value` reads any JSON; reading as a typed entry means the mutation got that far.
        if check_get(&log, n, &bytes)? > 1 {
            typed.hit();
        }
        prop_assert_eq!(
            log.ids().map_err(|e| TestCaseError::fail(e.to_string()))?,
            vec![n]
        );
        // Writing over a damaged entry is refused (or a no-op for the same value), never a panic.
        match log.put(n, &samples[sample]) {
            Ok(()) | Err(CheckpointError::Conflict { .. } | CheckpointError::Corrupt { .. }) => {}
            Err(e) => prop_assert!(false, "put over a damaged entry: {e}"),
        }
        std::fs::remove_file(log.entry_path(n)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        Ok(())
    });
    for (sample, value) in samples.iter().enumerate() {
        let log = checkpoint.source_log(sample);
        std::fs::create_dir_all(log.dir()).expect("log folder");
        std::fs::write(log.entry_path(0), entry_bytes(value)).expect("write");
        let types = check_get(&log, 0, &entry_bytes(value)).expect("no panic");
        assert!(types >= 2, "sample {sample} reads as its own type");
    }
    typed.check("a damaged entry read as a typed entry", 1_500);
}

#[test]
fn fuzz_checkpoint_log_ids() {
    let dir = tempfile::tempdir().expect("temp dir");
    let checkpoint = Checkpoint::open(dir.path()).expect("new checkpoint");
    let next = AtomicUsize::new(0);
    let name = prop_oneof![
        "[0-9]{1,3}",
        "[1-9][0-9]{17,21}",
        "0[0-9]{1,3}",
        "\\.[0-9]{1,3}\\.tmp",
        "[+-][0-9]{1,3}",
        "[a-z0-9.]{1,8}".prop_filter("a file name", |s| s != "." && s != ".."),
    ];
    run(300, proptest::collection::vec(name, 0..6), |names| {
        let log = checkpoint.source_log(next.fetch_add(1, Ordering::Relaxed));
        std::fs::create_dir_all(log.dir()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for name in &names {
            std::fs::write(log.dir().join(name), b"v1\n{}\n")
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        let canonical =
            |s: &str| s == "0" || (!s.starts_with('0') && s.bytes().all(|b| b.is_ascii_digit()));
        let too_large = names
            .iter()
            .any(|s| canonical(s) && !s.parse::<u64>().is_ok_and(|v| v <= MAX_BATCH_ID));
        match log.ids() {
            Ok(ids) => {
                prop_assert!(!too_large);
                let mut want: Vec<u64> = names
                    .iter()
                    .filter(|s| canonical(s))
                    .filter_map(|s| s.parse().ok())
                    .collect();
                want.sort_unstable();
                want.dedup();
                prop_assert_eq!(&ids, &want);
                prop_assert_eq!(log.latest().ok().flatten(), want.last().copied());
            }
            Err(CheckpointError::Corrupt { file, .. }) => {
                prop_assert!(too_large);
                prop_assert_eq!(file.parent(), Some(log.dir()));
            }
            Err(e) => prop_assert!(false, "{e}"),
        }
        Ok(())
    });
}

fn offset_entry() -> impl Strategy<Value = OffsetEntry> {
    let source = (
        any::<String>(),
        any::<u64>(),
        proptest::option::of(any::<i64>()),
        proptest::collection::btree_map("[a-z]{1,6}", any::<i64>(), 0..3),
    )
        .prop_map(|(name, log_offset, watermark_ms, kafka)| SourceOffset {
            name,
            log_offset,
            watermark_ms,
            // A real-time batch's cuts, on entries with offsets.
            parts: (!kafka.is_empty())
                .then(|| json!({ "partitions": [["t", 0]], "ends": [[1], [3]] })),
            recorded: if kafka.is_empty() {
                Recorded::new()
            } else {
                let mut r = Recorded::new();
                r.insert("kafka".into(), json!({ "t": kafka }));
                r
            },
        });
    let plugin =
        (any::<String>(), "[0-9a-f]{0,64}").prop_map(|(name, sha256)| PluginBuild { name, sha256 });
    (
        any::<i64>(),
        any::<i64>(),
        any::<i64>(),
        proptest::collection::vec(source, 0..3),
        proptest::collection::vec(plugin, 0..2),
    )
        .prop_map(
            |(batch_watermark_ms, late_row_watermark_ms, batch_timestamp_ms, sources, plugins)| {
                OffsetEntry {
                    batch_watermark_ms,
                    late_row_watermark_ms,
                    batch_timestamp_ms,
                    sources,
                    plugins,
                    tables: Vec::new(),
                }
            },
        )
}

fn files_entry() -> impl Strategy<Value = FilesLogEntry> {
    let file = (any::<String>(), any::<u64>(), any::<i64>()).prop_map(|(name, size, mtime_ms)| {
        FileEntry {
            name,
            size,
            mtime_ms,
        }
    });
    proptest::collection::vec(file, 0..4).prop_map(|files| FilesLogEntry { files })
}

fn delta_entry() -> impl Strategy<Value = DeltaLogEntry> {
    let file = (
        any::<u64>(),
        any::<u64>(),
        any::<String>(),
        any::<i64>(),
        proptest::collection::btree_map(
            any::<String>(),
            proptest::option::of(any::<String>()),
            0..2,
        ),
        any::<bool>(),
    )
        .prop_map(
            |(version, index, path, size, partition_values, snapshot)| DeltaFile {
                version,
                index,
                path,
                size,
                partition_values,
                snapshot,
            },
        );
    let next =
        (any::<u64>(), any::<u64>(), any::<bool>()).prop_map(|(version, index, snapshot)| {
            Position {
                version,
                index,
                snapshot,
            }
        });
    (
        proptest::collection::vec(file, 0..3),
        proptest::option::of(next),
    )
        .prop_map(|(files, next)| DeltaLogEntry { files, next })
}

/// Whatever is written reads back equal; the same value again is a no-op, another a conflict.
fn check_round_trip<T>(
    log: &BatchLog<'_>,
    n: u64,
    value: &T,
    other: &T,
) -> Result<(), TestCaseError>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let fail = |e: CheckpointError| TestCaseError::fail(e.to_string());
    log.put(n, value).map_err(fail)?;
    let back = log.get::<T>(n).map_err(fail)?;
    prop_assert_eq!(back.as_ref(), Some(value));
    log.put(n, value).map_err(fail)?;
    if other != value {
        match log.put(n, other) {
            Err(CheckpointError::Conflict { batch, .. }) => prop_assert_eq!(batch, n),
            r => prop_assert!(false, "a different value over entry {n}: {r:?}"),
        }
    }
    log.remove(n).map_err(fail)?;
    prop_assert_eq!(log.get::<T>(n).map_err(fail)?, None);
    Ok(())
}

#[test]
fn fuzz_checkpoint_log_round_trip() {
    let dir = tempfile::tempdir().expect("temp dir");
    let checkpoint = Checkpoint::open(dir.path()).expect("new checkpoint");
    let n = prop_oneof![0..10u64, Just(MAX_BATCH_ID), 0..=MAX_BATCH_ID];
    run(
        40,
        (n.clone(), offset_entry(), offset_entry()),
        |(n, a, b)| check_round_trip(&checkpoint.offsets(), n, &a, &b),
    );
    run(
        30,
        (n.clone(), files_entry(), files_entry()),
        |(n, a, b)| check_round_trip(&checkpoint.source_log(0), n, &a, &b),
    );
    run(30, (n, delta_entry(), delta_entry()), |(n, a, b)| {
        check_round_trip(&checkpoint.source_log(1), n, &a, &b)
    });
}

/// How the `secret` beside `metadata` is damaged.
#[derive(Debug, Clone)]
enum SecretDamage {
    Intact,
    Mutated(Vec<ByteEdit>),
    Bytes(Vec<u8>),
    Missing,
}

fn secret_damage() -> impl Strategy<Value = SecretDamage> {
    prop_oneof![
        3 => Just(SecretDamage::Intact),
        3 => byte_edits(3).prop_map(SecretDamage::Mutated),
        1 => proptest::collection::vec(any::<u8>(), 0..64).prop_map(SecretDamage::Bytes),
        1 => Just(SecretDamage::Missing),
    ]
}

/// `metadata` (damaged in most cases) and the `secret` beside it (damaged in some): a checkpoint
/// opens with the secret's own 32 bytes, or the error is `Corrupt` naming the damaged file.
#[test]
fn fuzz_checkpoint_metadata() {
    let template = tempfile::tempdir().expect("temp dir");
    let valid = {
        let checkpoint = Checkpoint::open(template.path()).expect("new checkpoint");
        serde_json::to_value(checkpoint.metadata()).expect("metadata is JSON")
    };
    let valid_bytes = std::fs::read(template.path().join("metadata")).expect("metadata written");
    // The secret beside it, which the valid metadata says is there.
    let secret = std::fs::read(template.path().join("secret")).expect("secret written");
    let opened = Reach::default();
    let secret_refused = Reach::default();
    let strategy = (proptest::option::weighted(0.7, damage()), secret_damage());
    run(300, strategy, |(damage, secret_damage)| {
        let io = |e: std::io::Error| TestCaseError::fail(e.to_string());
        let bytes = match &damage {
            None => valid_bytes.clone(),
            Some(Damage::Bytes(bytes)) => bytes.clone(),
            Some(Damage::Mutated(edits)) => mutate(&valid_bytes, edits),
            Some(Damage::Json(edits)) => {
                format!("{}\n", apply_json(valid.clone(), edits)).into_bytes()
            }
        };
        let secret_bytes = match &secret_damage {
            SecretDamage::Intact => Some(secret.clone()),
            SecretDamage::Mutated(edits) => Some(mutate(&secret, edits)),
            SecretDamage::Bytes(bytes) => Some(bytes.clone()),
            SecretDamage::Missing => None,
        };
        let dir = tempfile::tempdir().map_err(io)?;
        let path = dir.path().join("metadata");
        let secret_path = dir.path().join("secret");
        std::fs::write(&path, &bytes).map_err(io)?;
        if let Some(secret_bytes) = &secret_bytes {
            std::fs::write(&secret_path, secret_bytes).map_err(io)?;
        }
        match Checkpoint::open(dir.path()) {
            Ok(checkpoint) => {
                prop_assert_eq!(
                    checkpoint.metadata().version,
                    crate::checkpoint::FORMAT_VERSION
                );
                prop_assert!(bytes.ends_with(b"\n"));
                // The secret the query's plugins are keyed by is the file's, whole: the one
                // written (a damaged one is never used) or, for a checkpoint without
                // `secret_since`, one created in its place.
                let on_disk = std::fs::read(&secret_path).map_err(io)?;
                prop_assert_eq!(on_disk.len(), crate::checkpoint::SECRET_LEN);
                prop_assert_eq!(&on_disk[..], &checkpoint.secret().expose()[..]);
                if let Some(secret_bytes) = &secret_bytes {
                    prop_assert_eq!(secret_bytes, &on_disk);
                }
                if damage.is_some() {
                    opened.hit();
                }
            }
            Err(CheckpointError::Corrupt { file, reason }) => {
                prop_assert!(!reason.is_empty());
                if file == secret_path {
                    prop_assert!(
                        !matches!(secret_damage, SecretDamage::Intact),
                        "an intact secret was refused: {reason}"
                    );
                    secret_refused.hit();
                } else {
                    prop_assert_eq!(file, path);
                    prop_assert!(damage.is_some(), "intact metadata was refused: {reason}");
                }
            }
            Err(e) => prop_assert!(false, "not a Corrupt error: {e}"),
        }
        Ok(())
    });
    opened.check("a damaged metadata file that opens", 300);
    secret_refused.check("a damaged secret refused naming the file", 300);
}

#[test]
fn fuzz_checkpoint_lock_holder() {
    let dir = tempfile::tempdir().expect("temp dir");
    let holder = Checkpoint::open(dir.path()).expect("new checkpoint");
    let lock = dir.path().join("lock");
    let valid = std::fs::read(&lock).expect("lock written");
    run(200, damage(), |damage| {
        let bytes = match &damage {
            Damage::Bytes(bytes) => bytes.clone(),
            Damage::Mutated(edits) => mutate(&valid, edits),
            Damage::Json(edits) => {
                let v: Value = serde_json::from_slice(&valid)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                format!("{}\n", apply_json(v, edits)).into_bytes()
            }
        };
        std::fs::write(&lock, &bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        match Checkpoint::open(dir.path()) {
            Err(CheckpointError::Locked { dir: d, holder }) => {
                prop_assert_eq!(d.as_path(), dir.path());
                prop_assert!(!holder.is_empty());
            }
            other => prop_assert!(false, "the checkpoint is held: {other:?}"),
        }
        Ok(())
    });
    drop(holder);
}

/// What `weir checkpoint inspect` reads, without the lock: `metadata`, the latest entries and
/// `progress.jsonl`, all damaged at once.
#[test]
fn fuzz_checkpoint_reader() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (valid_metadata, valid_progress) = {
        let checkpoint = Checkpoint::open(dir.path()).expect("new checkpoint");
        checkpoint
            .offsets()
            .put(0, &sample_offsets())
            .expect("offsets");
        checkpoint
            .commits()
            .put(0, &sample_commit())
            .expect("commit");
        for batch in 0..3 {
            let record = json!({ "batchId": batch, "numInputRows": 10, "sources": [] });
            checkpoint.append_progress(&record).expect("progress");
        }
        (
            std::fs::read(dir.path().join("metadata")).expect("metadata"),
            std::fs::read(dir.path().join("progress.jsonl")).expect("progress"),
        )
    };
    let progress_path = dir.path().join("progress.jsonl");
    let metadata_path = dir.path().join("metadata");
    let offsets_entry = dir.path().join("offsets/0");
    let strategy = (byte_edits(3), byte_edits(4), damage(), 0..4u8);
    let read = Reach::default();
    run(400, strategy, |(metadata, progress, offsets, which)| {
        let io = |e: std::io::Error| TestCaseError::fail(e.to_string());
        // Damage one file (or all three).
        let damage_metadata = which == 0 || which == 3;
        let damage_progress = which == 1 || which == 3;
        let damage_offsets = which == 2 || which == 3;
        let metadata_bytes = if damage_metadata {
            mutate(&valid_metadata, &metadata)
        } else {
            valid_metadata.clone()
        };
        let progress_bytes = if damage_progress {
            mutate(&valid_progress, &progress)
        } else {
            valid_progress.clone()
        };
        let offsets_bytes = if damage_offsets {
            damaged_entry(&sample_offsets(), &offsets)
        } else {
            entry_bytes(&sample_offsets())
        };
        std::fs::write(&metadata_path, &metadata_bytes).map_err(io)?;
        std::fs::write(&progress_path, &progress_bytes).map_err(io)?;
        std::fs::write(&offsets_entry, &offsets_bytes).map_err(io)?;
        let reader = match crate::checkpoint::CheckpointReader::open(dir.path()) {
            Ok(reader) => reader,
            Err(CheckpointError::Corrupt { file, .. }) => {
                prop_assert!(damage_metadata);
                prop_assert_eq!(&file, &metadata_path);
                return Ok(());
            }
            Err(e) => return Err(TestCaseError::fail(format!("open: {e}"))),
        };
        match reader.progress() {
            Ok(records) => {
                prop_assert!(
                    records.len() <= progress_bytes.iter().filter(|&&b| b == b'\n').count()
                );
                read.hit();
            }
            Err(CheckpointError::Corrupt { file, .. } | CheckpointError::Io { path: file, .. }) => {
                prop_assert!(damage_progress);
                prop_assert_eq!(&file, &progress_path);
            }
            Err(e) => return Err(TestCaseError::fail(format!("progress: {e}"))),
        }
        let log = reader.offsets();
        prop_assert_eq!(
            log.ids().map_err(|e| TestCaseError::fail(e.to_string()))?,
            vec![0]
        );
        match log.get::<OffsetEntry>(0) {
            Ok(entry) => prop_assert!(entry.is_some()),
            Err(CheckpointError::Corrupt { file, .. }) => {
                prop_assert!(damage_offsets);
                prop_assert_eq!(&file, &offsets_entry);
            }
            Err(e) => return Err(TestCaseError::fail(format!("offsets: {e}"))),
        }
        Ok(())
    });
    read.check("damaged progress records that read", 400);
}

// ---------------------------------------------------------------- the files source

const OUTSIDE_ID: i64 = 666;

/// `dir/in` with two files, `dir/outside.json`, and a checkpoint in `dir/cp` whose batch 0 took
/// both files: listed in `offsets/0` as the query plans a batch, or (`old_layout`) in the source
/// log entry `sources/0/0`, as a Weir before the lists moved to `offsets/N` wrote them.
fn files_setup(dir: &Path, old_layout: bool) -> Checkpoint {
    std::fs::create_dir_all(dir.join("in")).expect("input folder");
    std::fs::write(dir.join("in/a.json"), "{\"id\":1}\n{\"id\":2}\n").expect("a.json");
    std::fs::write(dir.join("in/b.json"), "{\"id\":3}\n").expect("b.json");
    std::fs::write(
        dir.join("outside.json"),
        format!("{{\"id\":{OUTSIDE_ID}}}\n"),
    )
    .expect("outside");
    std::fs::create_dir_all(dir.join("in/sub")).expect("sub folder");
    std::fs::write(
        dir.join("in/sub/c.json"),
        format!("{{\"id\":{OUTSIDE_ID}}}\n"),
    )
    .expect("c.json");
    let checkpoint = Checkpoint::open(&dir.join("cp")).expect("checkpoint");
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
    let mut source = FilesSource::open(
        "orders".into(),
        0,
        dir.join("in"),
        None,
        Decoder::new(schema, DecoderOptions::default()).expect("decoder"),
        None,
        &checkpoint,
        None,
    )
    .expect("source opens");
    assert_eq!(source.poll(&checkpoint, false).expect("poll"), 2);
    let mut recorded = source.record(&checkpoint, 0).expect("record");
    if old_layout {
        let files = recorded.remove("files").expect("the files are recorded");
        checkpoint
            .source_log(0)
            .put(0, &json!({ "files": files }))
            .expect("source log");
    }
    checkpoint
        .offsets()
        .put(0, &json!({ "sources": [recorded] }))
        .expect("offsets");
    checkpoint
}

fn open_files_source(
    dir: &Path,
    checkpoint: &Checkpoint,
) -> Result<FilesSource, crate::source::SourceError> {
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
    FilesSource::open(
        "orders".into(),
        0,
        dir.join("in"),
        None,
        Decoder::new(schema, DecoderOptions::default()).expect("decoder"),
        None,
        checkpoint,
        Some(0),
    )
}

/// What `offsets/0` records for the source, as the query hands it to `read`; `None` when
/// the entry does not parse that far (the query refuses it before the source sees it).
fn recorded_at_0(checkpoint: &Checkpoint) -> Option<Recorded> {
    let entry: Value = checkpoint.offsets().get(0).ok()??;
    serde_json::from_value(entry.get("sources")?.get(0)?.clone()).ok()
}

/// The ids in the first column of `batches`. A damaged log may declare that column with another
/// type (a string, say); its values are then read as integers where they parse, so that a file
/// from outside the table is still recognised by its id.
fn ids_read(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            let ids = arrow_cast::cast::cast(b.column(0), &DataType::Int64).ok();
            ids.map(|ids| {
                ids.as_primitive::<Int64Type>()
                    .iter()
                    .flatten()
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
        })
        .collect()
}

/// Damaged or arbitrary file lists, in `offsets/0` or (`old_layout`) in the source log: the
/// source refuses them or reads only the folder's own files.
fn fuzz_files_lists(old_layout: bool) {
    let dir = tempfile::tempdir().expect("temp dir");
    let checkpoint = files_setup(dir.path(), old_layout);
    let entry = if old_layout {
        checkpoint.source_log(0).entry_path(0)
    } else {
        checkpoint.offsets().entry_path(0)
    };
    let valid: Value = serde_json::from_slice(
        std::fs::read(&entry)
            .expect("entry")
            .strip_prefix(b"v1\n")
            .expect("version line"),
    )
    .expect("JSON");
    let wrap = move |e: FilesLogEntry| {
        let files = serde_json::to_value(e.files).expect("JSON");
        if old_layout {
            json!({ "files": files })
        } else {
            json!({ "sources": [{ "files": files }] })
        }
    };
    let strategy = prop_oneof![
        3 => damage().prop_map(|d| damaged_entry(&valid, &d)),
        1 => files_entry().prop_map(move |e| entry_bytes(&wrap(e))),
    ];
    let read = Reach::default();
    run(600, strategy, |bytes| {
        std::fs::write(&entry, &bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let Some(recorded) = recorded_at_0(&checkpoint) else {
            return Ok(());
        };
        let mut source = match open_files_source(dir.path(), &checkpoint) {
            Ok(source) => source,
            Err(_typed) => return Ok(()),
        };
        if let Ok(batch) = source.read(&checkpoint, 0, &recorded) {
            let ids = ids_read(&batch.decoded.batches);
            prop_assert!(
                !ids.contains(&OUTSIDE_ID),
                "read a file outside the folder: {ids:?}"
            );
            prop_assert!(ids.len() <= 3);
            read.hit();
        }
        Ok(())
    });
    read.check("a damaged list of files that reads", 600);
    std::fs::write(&entry, entry_bytes(&valid)).expect("restore");
    let mut source = open_files_source(dir.path(), &checkpoint).expect("opens");
    let recorded = recorded_at_0(&checkpoint).expect("recorded");
    let batch = source.read(&checkpoint, 0, &recorded).expect("reads");
    assert_eq!(ids_read(&batch.decoded.batches), vec![1, 2, 3]);
}

#[test]
fn fuzz_files_source_offsets_entry() {
    fuzz_files_lists(false);
}

#[test]
fn fuzz_files_source_log() {
    fuzz_files_lists(true);
}

// ---------------------------------------------------------------- the Delta source

fn write_parquet(path: &Path, ids: &[i64]) -> u64 {
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![Arc::new(Int64Array::from(ids.to_vec()))],
    )
    .expect("batch");
    std::fs::create_dir_all(path.parent().expect("parent")).expect("folder");
    let file = std::fs::File::create(path).expect("parquet file");
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, schema, None).expect("writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
    std::fs::metadata(path).expect("written").len()
}

/// A Delta table in `dir/table` partitioned by an integer `p`: version 0 adds `p=1/part-0`
/// (ids 1, 2), version 1 adds `part-1` (id 3, `p` null); `dir/outside.parquet` holds
/// [`OUTSIDE_ID`].
fn delta_setup(dir: &Path) -> PathBuf {
    let table = dir.join("table");
    let size0 = write_parquet(&table.join("p=1/part-0.parquet"), &[1, 2]);
    let size1 = write_parquet(&table.join("part-1.parquet"), &[3]);
    write_parquet(&dir.join("outside.parquet"), &[OUTSIDE_ID]);
    let schema = json!({ "type": "struct", "fields": [
        { "name": "id", "type": "long", "nullable": true, "metadata": {} },
        { "name": "p", "type": "integer", "nullable": true, "metadata": {} }
    ] });
    let v0 = [
        json!({ "protocol": { "minReaderVersion": 1, "minWriterVersion": 2 } }),
        json!({ "metaData": { "id": "t", "format": { "provider": "parquet", "options": {} },
            "schemaString": schema.to_string(), "partitionColumns": ["p"], "configuration": {},
            "createdTime": 0 } }),
        json!({ "add": { "path": "p=1/part-0.parquet", "partitionValues": { "p": "1" },
            "size": size0, "modificationTime": 0, "dataChange": true } }),
        json!({ "commitInfo": { "operation": "WRITE" } }),
    ];
    let v1 = [
        json!({ "add": { "path": "part-1.parquet", "partitionValues": { "p": null },
            "size": size1, "modificationTime": 0, "dataChange": true } }),
        json!({ "commitInfo": { "operation": "WRITE" } }),
    ];
    let log = table.join("_delta_log");
    std::fs::create_dir_all(&log).expect("log folder");
    for (version, actions) in [(0, &v0[..]), (1, &v1[..])] {
        let text: String = actions.iter().map(|a| format!("{a}\n")).collect();
        std::fs::write(log.join(format!("{version:020}.json")), text).expect("commit file");
    }
    table
}

fn open_delta(
    table: &Path,
    checkpoint: &Checkpoint,
    last_planned: Option<u64>,
) -> Result<DeltaSource, crate::source::DeltaSourceError> {
    DeltaSource::open(
        "t".into(),
        0,
        table.to_path_buf(),
        None,
        None,
        checkpoint,
        last_planned,
    )
}

/// Opens the source over `table` and reads what it can; the rows read must come from the table.
fn exercise_delta(
    table: &Path,
    checkpoint: &Checkpoint,
    last_planned: Option<u64>,
) -> Result<usize, TestCaseError> {
    let Ok(source) = open_delta(table, checkpoint, last_planned) else {
        return Ok(0);
    };
    let mut read = 0;
    let mut files = source.list_new().unwrap_or_default();
    if let Ok(planned) = source.planned(checkpoint, 0) {
        files.extend(planned);
    }
    for file in &files {
        if let Ok((batches, rows)) = source.read(std::slice::from_ref(file)) {
            prop_assert_eq!(
                rows,
                batches.iter().map(|b| b.num_rows() as u64).sum::<u64>()
            );
            let ids = ids_read(&batches);
            prop_assert!(
                !ids.contains(&OUTSIDE_ID),
                "read {:?}, outside the table: {ids:?}",
                file.path
            );
            read += 1;
        }
    }
    let _whole = crate::source::delta::read_table(table);
    Ok(read)
}

#[test]
fn fuzz_delta_source_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let table = delta_setup(dir.path());
    let checkpoint = Checkpoint::open(&dir.path().join("cp")).expect("checkpoint");
    {
        let mut source = open_delta(&table, &checkpoint, None).expect("the table opens");
        let files = source.list_new().expect("lists");
        assert_eq!(files.len(), 2, "{files:?}");
        source.record(&checkpoint, 0, &files).expect("record");
        let (batches, rows) = source.read(&files).expect("reads");
        assert_eq!((ids_read(&batches), rows), (vec![1, 2, 3], 3));
    }
    let entry = checkpoint.source_log(0).entry_path(0);
    let valid: Value = checkpoint
        .source_log(0)
        .get(0)
        .expect("entry")
        .expect("exists");
    let strategy = prop_oneof![
        3 => damage().prop_map(|d| damaged_entry(&valid, &d)),
        1 => delta_entry().prop_map(|e| entry_bytes(&serde_json::to_value(e).expect("JSON"))),
    ];
    let read = Reach::default();
    run(500, strategy, |bytes| {
        std::fs::write(&entry, &bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        if exercise_delta(&table, &checkpoint, Some(0))? > 0 {
            read.hit();
        }
        Ok(())
    });
    read.check("a damaged source log entry whose files read", 500);
}

#[test]
fn fuzz_delta_table_commits() {
    let dir = tempfile::tempdir().expect("temp dir");
    let table = delta_setup(dir.path());
    let checkpoint = Checkpoint::open(&dir.path().join("cp")).expect("checkpoint");
    let commits: Vec<(PathBuf, Vec<u8>)> = (0..2)
        .map(|v| {
            let path = table.join("_delta_log").join(format!("{v:020}.json"));
            let bytes = std::fs::read(&path).expect("commit file");
            (path, bytes)
        })
        .collect();
    // A commit file damaged as a whole or in one of its action lines.
    let strategy = (0..2usize, any::<usize>(), damage());
    let read = Reach::default();
    run(600, strategy, |(version, line, damage)| {
        let (path, valid) = &commits[version];
        let text = String::from_utf8_lossy(valid);
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let at = line % lines.len();
        let bytes = match &damage {
            Damage::Bytes(bytes) => bytes.clone(),
            Damage::Mutated(edits) => mutate(valid, edits),
            Damage::Json(edits) => {
                let action: Value = serde_json::from_str(&lines[at])
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                lines[at] = apply_json(action, edits).to_string();
                (lines.join("\n") + "\n").into_bytes()
            }
        };
        std::fs::write(path, &bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let result = exercise_delta(&table, &checkpoint, None);
        std::fs::write(path, valid).map_err(|e| TestCaseError::fail(e.to_string()))?;
        if result? > 0 {
            read.hit();
        }
        Ok(())
    });
    read.check("a damaged table whose files read", 600);
}

// ---------------------------------------------------------------- the Delta sink's pending lists

/// How a pending list of the Delta sink is damaged.
#[derive(Debug, Clone)]
enum ListDamage {
    /// As any checkpoint file is.
    Damaged(Damage),
    /// The `path` of one `add` (the n-th, modulo their count) replaced by one of the ways out
    /// of the table (the m-th, modulo their count).
    Escape(usize, usize),
}

/// `v` with every string `/etc/passwd` (one of [`hostile_json`]'s) replaced by `victim`: a
/// pending list names files the sink deletes, so its hostile paths aim at a file of the test's
/// own, never at one of the machine's.
fn retarget(v: &mut Value, victim: &str) {
    match v {
        Value::String(s) if s.as_str() == "/etc/passwd" => *s = victim.to_owned(),
        Value::Array(items) => items.iter_mut().for_each(|item| retarget(item, victim)),
        Value::Object(map) => map.values_mut().for_each(|item| retarget(item, victim)),
        _ => {}
    }
}

/// A Delta sink into `dir/table` that commits every 3 batches, its pending lists in
/// `dir/cp/sinks/delta/pending`.
fn delta_sink_options(dir: &Path) -> crate::sink::delta::DeltaSinkOptions {
    crate::sink::delta::DeltaSinkOptions {
        spec: crate::spec::DeltaSinkSpec {
            path: dir.join("table"),
            partition_by: Vec::new(),
            target_file_size: 128 << 20,
            commit_every: crate::spec::CommitEvery::Batches(
                std::num::NonZeroU64::new(3).expect("not zero"),
            ),
        },
        query_id: "fuzz-query".into(),
        mode: crate::sink::delta::WriteMode::Append,
        pending_dir: dir.join("cp/sinks/delta/pending"),
        failpoint: None,
    }
}

fn sink_batch(batch_id: u64) -> crate::plugin::BatchInfo {
    crate::plugin::BatchInfo {
        query_id: "fuzz-query".into(),
        batch_id,
        attempt: 0,
        timestamp_micros: 0,
        partition: 0,
    }
}

/// The pending list of batch 0 (written, not committed) damaged, sometimes beside a second list
/// under another batch id: opening the sink reads them all ([`crate::sink::delta::DeltaSink::new`])
/// and either succeeds or fails naming one of the lists (`Corrupt`, or `Pending` for a list that
/// is not a list of `add` actions); a list that opens is replayed (its files are deleted, the
/// batch written again). The file beside the table that the hostile paths aim at is never
/// touched.
#[test]
fn fuzz_delta_sink_pending_lists() {
    use crate::sink::delta::{DeltaSink, DeltaSinkError, Written};
    let dir = tempfile::tempdir().expect("temp dir");
    let victim = dir.path().join("outside.parquet");
    std::fs::write(&victim, b"precious").expect("the file outside the table");
    let victim_path = victim.display().to_string();
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
    let rows = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![Arc::new(Int64Array::from(vec![1, 2, 3]))],
    )
    .expect("batch");
    let options = delta_sink_options(dir.path());
    let pending = options.pending_dir.clone();
    let list = pending.join(format!("{:020}.json", 0));
    {
        let mut sink = DeltaSink::new(options).expect("the sink opens");
        let written = sink
            .write(&sink_batch(0), &schema, std::slice::from_ref(&rows))
            .expect("batch 0");
        assert_eq!(written, Written::Pending);
    }
    let valid_bytes = std::fs::read(&list).expect("the pending list of batch 0");
    let valid: Value = serde_json::from_slice(&valid_bytes).expect("a JSON list");
    assert!(
        valid.as_array().is_some_and(|adds| !adds.is_empty()),
        "{valid}"
    );
    // Ways out of `dir/table` to `dir/outside.parquet`, and paths that name no file.
    let escapes: Vec<String> = vec![
        "../outside.parquet".into(),
        "%2e%2e/outside.parquet".into(),
        "..%2foutside.parquet".into(),
        "part/../../outside.parquet".into(),
        victim_path.clone(),
        format!("%2F{}", victim_path.trim_start_matches('/')),
        format!("file://{victim_path}"),
        String::new(),
        ".".into(),
    ];
    let list_damage = prop_oneof![
        3 => damage().prop_map(ListDamage::Damaged),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(a, e)| ListDamage::Escape(a, e)),
    ];
    // A second list: under a batch id no query reaches, or a valid one.
    let extra = proptest::option::weighted(
        0.2,
        prop_oneof![Just(u64::MAX), MAX_BATCH_ID..=u64::MAX, 1..=MAX_BATCH_ID],
    );
    let opened = Reach::default();
    let refused = Reach::default();
    run(200, (list_damage, extra), |(damage, extra)| {
        let io = |e: std::io::Error| TestCaseError::fail(e.to_string());
        // This case's lists only.
        for entry in std::fs::read_dir(&pending).map_err(io)? {
            std::fs::remove_file(entry.map_err(io)?.path()).map_err(io)?;
        }
        let bytes = match &damage {
            ListDamage::Damaged(Damage::Bytes(bytes)) => bytes.clone(),
            ListDamage::Damaged(Damage::Mutated(edits)) => mutate(&valid_bytes, edits),
            ListDamage::Damaged(Damage::Json(edits)) => {
                let mut v = apply_json(valid.clone(), edits);
                retarget(&mut v, &victim_path);
                v.to_string().into_bytes()
            }
            ListDamage::Escape(add, escape) => {
                let mut v = valid.clone();
                if let Some(adds) = v.as_array_mut() {
                    let n = add % adds.len();
                    adds[n]["path"] = Value::from(escapes[escape % escapes.len()].clone());
                }
                v.to_string().into_bytes()
            }
        };
        std::fs::write(&list, &bytes).map_err(io)?;
        let extra = extra.map(|id| pending.join(format!("{id:020}.json")));
        if let Some(extra) = &extra {
            std::fs::write(extra, &valid_bytes).map_err(io)?;
        }
        let is_list = |file: &Path| file == list.as_path() || extra.as_deref() == Some(file);
        match DeltaSink::new(delta_sink_options(dir.path())) {
            Ok(mut sink) => {
                prop_assert!(
                    !matches!(damage, ListDamage::Escape(..)),
                    "a list naming a file outside the table was read"
                );
                opened.hit();
                // The replay of batch 0: the files of its list are deleted, the batch written
                // again. What the list names is checked again before each deletion.
                // Otherwise written again, or refused with a typed error (an I/O error deleting
                // a path inside the table that is a folder).
                if let Err(DeltaSinkError::Checkpoint(CheckpointError::Corrupt { file, .. })) =
                    sink.write(&sink_batch(0), &schema, std::slice::from_ref(&rows))
                {
                    prop_assert!(is_list(file.as_path()), "Corrupt names {}", file.display());
                }
            }
            Err(DeltaSinkError::Checkpoint(CheckpointError::Corrupt { file, reason })) => {
                prop_assert!(is_list(file.as_path()), "Corrupt names {}", file.display());
                prop_assert!(!reason.is_empty());
                refused.hit();
            }
            Err(DeltaSinkError::Pending { file, .. }) => {
                prop_assert!(is_list(file.as_path()), "Pending names {}", file.display());
            }
            Err(e) => prop_assert!(false, "not an error naming a pending list: {e}"),
        }
        prop_assert_eq!(
            std::fs::read(&victim).map_err(io)?,
            b"precious".to_vec(),
            "the file outside the table changed"
        );
        Ok(())
    });
    opened.check("a damaged pending list that opens", 200);
    refused.check("a pending list refused as Corrupt", 200);
    // The valid list, alone again, opens.
    for entry in std::fs::read_dir(&pending).expect("pending folder") {
        std::fs::remove_file(entry.expect("entry").path()).expect("remove");
    }
    std::fs::write(&list, &valid_bytes).expect("restore");
    DeltaSink::new(delta_sink_options(dir.path())).expect("the valid list opens");
    assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
}

#[test]
fn fuzz_checkpoint_json_edits_reach_every_node() {
    let v = json!({ "a": [1, { "b": 2 }], "c": null });
    assert_eq!(count_nodes(&v), 6);
    assert_eq!(
        apply_json(v.clone(), &[JsonEdit::Replace(4, json!("x"))]),
        json!({ "a": [1, { "b": "x" }], "c": null })
    );
    assert_eq!(
        apply_json(v.clone(), &[JsonEdit::Remove(5)]),
        json!({ "a": [1, { "b": 2 }] })
    );
    assert_eq!(apply_json(v, &[JsonEdit::Replace(6, json!(0))]), json!(0));
}
