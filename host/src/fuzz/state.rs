//! Fuzzing the state store's readers: changelogs, the memory store's snapshot dumps, the
//! snapshot metadata files (`state/record.rs`), and the sorted-runs store's run files and
//! manifests (`state/runs.rs`), all reached through [`StateStore::load`].
//!
//! Inputs: a store directory written by the store itself (five versions, two snapshots), with
//! one file mutated byte by byte; half the time its checksum is then recomputed, so that the
//! mutation gets past the checksum into the header, record and count checks (and into what the
//! store does with the values it loaded: the row count, the parent chain). Properties: loading
//! any version never panics and fails only with a typed error naming a file or the store; a
//! store that loaded can be read, written and committed. And a model check: arbitrary puts and
//! deletes committed over several versions read back equal to a `BTreeMap`, from a reopened
//! store, at the last version and at an earlier retained one.
//!
//! Budget: about 600 loads of a copied directory (of either store) plus 60 model runs (their
//! commits fsync).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proptest::prelude::*;

use super::{Reach, byte_edits, mutate, run};
use crate::state::{StateError, StateOptions, StateStore, StoreKind};

/// The stores whose files are fuzzed (RocksDB's own files are RocksDB's to check).
const KINDS: [StoreKind; 2] = [StoreKind::Memory, StoreKind::Runs];

/// Recomputes the checksum of the file `name`: a run's CRC-32 (before its 8-byte magic, over
/// every byte before it), a runs manifest's trailing CRC-32, or a record file's trailing FNV-1a
/// 64 (the last 8 bytes).
fn fix_checksum(name: &Path, bytes: &mut [u8]) {
    let ext = name.extension().and_then(|e| e.to_str());
    if ext == Some("run") || ext == Some("manifest") {
        let tail = if ext == Some("run") { 12 } else { 4 };
        let Some(at) = bytes.len().checked_sub(tail) else {
            return;
        };
        let crc = crc32fast::hash(&bytes[..at]);
        bytes[at..at + 4].copy_from_slice(&crc.to_le_bytes());
        return;
    }
    if bytes.len() < 8 {
        return;
    }
    let at = bytes.len() - 8;
    let hash = crate::fnv::hash(&bytes[..at]);
    bytes[at..].copy_from_slice(&hash.to_le_bytes());
}

fn options(kind: StoreKind) -> StateOptions {
    StateOptions {
        kind,
        snapshot_interval: 2,
        min_versions_to_retain: 10,
        snapshot_min_bytes: 0,
        ..StateOptions::default()
    }
}

fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// Every entry of the loaded state.
fn entries(store: &StateStore) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, StateError> {
    let mut out = BTreeMap::new();
    store.scan(b"", None, &mut |k, v| {
        out.insert(k.to_vec(), v.to_vec());
        Ok(true)
    })?;
    Ok(out)
}

/// Writes versions 1 to 5 (snapshots at 2 and 4) into `dir`.
fn write_template(dir: &Path, kind: StoreKind) {
    let mut store = StateStore::open(dir, &options(kind)).expect("store opens");
    store.load(None).expect("empty state");
    for version in 1..=5u64 {
        for k in 0..version {
            let key = format!("key-{k}");
            store
                .put(key.as_bytes(), format!("value-{version}").as_bytes())
                .expect("put");
        }
        if version > 2 {
            store.delete(b"key-0").expect("delete");
        }
        store.commit(version).expect("commit");
    }
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("list") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// How a load of a damaged store ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loaded {
    Yes,
    /// Refused by the checksum.
    Checksum,
    /// Refused by another check.
    Other,
}

/// Loads `version` from the damaged `dir`; on success the store must be usable.
fn check_load(dir: &Path, kind: StoreKind, version: Option<u64>) -> Result<Loaded, TestCaseError> {
    let mut store = match StateStore::open(dir, &options(kind)) {
        Ok(store) => store,
        Err(e) => return Err(fail(format!("open failed on file contents: {e}"))),
    };
    match store.load(version) {
        Ok(()) => {
            let before = entries(&store).map_err(fail)?;
            // A loaded store can be written and committed (row counts stay consistent).
            store.put(b"key-1", b"new").map_err(fail)?;
            store.delete(b"key-2").map_err(fail)?;
            store.delete(b"key-0").map_err(fail)?;
            let _metrics = store.metrics();
            let next = version.map_or(1, |v| v + 1);
            store.commit(next).map_err(fail)?;
            let mut want = before;
            want.insert(b"key-1".to_vec(), b"new".to_vec());
            want.remove(&b"key-2"[..]);
            want.remove(&b"key-0"[..]);
            prop_assert_eq!(entries(&store).map_err(fail)?, want);
            Ok(Loaded::Yes)
        }
        Err(StateError::Corrupt { file, reason }) => {
            prop_assert!(file.starts_with(dir), "{file:?} is not in the store");
            prop_assert!(!reason.is_empty());
            Ok(if reason.contains("checksum") {
                Loaded::Checksum
            } else {
                Loaded::Other
            })
        }
        Err(StateError::MissingVersion { dir: d, .. } | StateError::WrongKind { dir: d, .. }) => {
            prop_assert_eq!(d.as_path(), dir);
            Ok(Loaded::Other)
        }
        Err(e) => Err(fail(format!("unexpected error: {e}"))),
    }
}

#[test]
fn fuzz_state_damaged_files() {
    let templates: Vec<(StoreKind, tempfile::TempDir, Vec<PathBuf>)> = KINDS
        .iter()
        .map(|&kind| {
            let template = tempfile::tempdir().expect("temp dir");
            write_template(template.path(), kind);
            // Not the work directory: opening a store removes it.
            let files: Vec<PathBuf> = files_under(template.path())
                .into_iter()
                .map(|p| {
                    p.strip_prefix(template.path())
                        .expect("inside")
                        .to_path_buf()
                })
                .filter(|p| !p.starts_with("work"))
                .collect();
            assert!(files.len() >= 7, "{kind}: {files:?}");
            (kind, template, files)
        })
        .collect();
    let strategy = (
        0..KINDS.len(),
        any::<usize>(),
        byte_edits(4),
        any::<bool>(),
        proptest::option::of(0..=6u64),
    );
    let (loaded, refused) = (Reach::default(), Reach::default());
    run(600, strategy, |(kind, file, edits, fix, version)| {
        let (kind, template, files) = &templates[kind];
        let file = &files[file % files.len()];
        let dir = tempfile::tempdir().map_err(fail)?;
        copy_dir(template.path(), dir.path()).map_err(fail)?;
        let path = dir.path().join(file);
        let mut bytes = mutate(&std::fs::read(&path).map_err(fail)?, &edits);
        if fix {
            fix_checksum(&path, &mut bytes);
        }
        std::fs::write(&path, &bytes).map_err(fail)?;
        match check_load(dir.path(), *kind, version)? {
            Loaded::Yes => loaded.hit(),
            Loaded::Other => refused.hit(),
            Loaded::Checksum => {}
        }
        Ok(())
    });
    loaded.check("a load of a damaged store", 600);
    refused.check("a refusal past the checksum", 600);
}

#[test]
fn fuzz_state_undamaged_template_loads() {
    for kind in KINDS {
        let template = tempfile::tempdir().expect("temp dir");
        write_template(template.path(), kind);
        for version in (1..=5u64).rev() {
            let dir = tempfile::tempdir().expect("temp dir");
            copy_dir(template.path(), dir.path()).expect("copy");
            let mut store = StateStore::open(dir.path(), &options(kind)).expect("opens");
            store.load(Some(version)).expect("loads");
            let keys = entries(&store).expect("scan").len() as u64;
            let want = if version > 2 { version - 1 } else { version };
            assert_eq!(keys, want, "{kind} version {version}");
            assert_eq!(
                check_load(dir.path(), kind, Some(version)).expect("usable"),
                Loaded::Yes
            );
        }
    }
}

/// One write of a batch.
#[derive(Debug, Clone)]
enum Op {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

fn op() -> impl Strategy<Value = Op> {
    // Few distinct keys, so that overwrites and deletes of existing keys are common.
    let key = proptest::collection::vec(0..4u8, 0..3);
    prop_oneof![
        3 => (key.clone(), proptest::collection::vec(any::<u8>(), 0..8))
            .prop_map(|(k, v)| Op::Put(k, v)),
        2 => key.prop_map(Op::Delete),
    ]
}

#[test]
fn fuzz_state_model_round_trip() {
    let batches = proptest::collection::vec(proptest::collection::vec(op(), 0..6), 1..6);
    let strategy = (batches, any::<usize>(), 1..=3u64, 0..KINDS.len());
    run(60, strategy, |(batches, back, interval, kind)| {
        let dir = tempfile::tempdir().map_err(fail)?;
        let options = StateOptions {
            kind: KINDS[kind],
            snapshot_interval: interval,
            min_versions_to_retain: 10,
            snapshot_min_bytes: 0,
            ..StateOptions::default()
        };
        let mut models = vec![BTreeMap::new()];
        {
            let mut store = StateStore::open(dir.path(), &options).map_err(fail)?;
            store.load(None).map_err(fail)?;
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            for (i, batch) in batches.iter().enumerate() {
                for op in batch {
                    match op {
                        Op::Put(k, v) => {
                            store.put(k, v).map_err(fail)?;
                            model.insert(k.clone(), v.clone());
                        }
                        Op::Delete(k) => {
                            store.delete(k).map_err(fail)?;
                            model.remove(k);
                        }
                    }
                }
                prop_assert_eq!(store.metrics().num_rows_total, model.len() as u64);
                store.commit(i as u64 + 1).map_err(fail)?;
                models.push(model.clone());
            }
        }
        let last = batches.len() as u64;
        let mut store = StateStore::open(dir.path(), &options).map_err(fail)?;
        store.load(Some(last)).map_err(fail)?;
        prop_assert_eq!(&entries(&store).map_err(fail)?, &models[last as usize]);
        prop_assert_eq!(
            store.metrics().num_rows_total,
            models[last as usize].len() as u64
        );
        let earlier = back % (last as usize + 1);
        let version = (earlier > 0).then_some(earlier as u64);
        store.load(version).map_err(fail)?;
        prop_assert_eq!(&entries(&store).map_err(fail)?, &models[earlier]);
        Ok(())
    });
}

#[test]
fn fuzz_state_checksum_helper_matches_the_store() {
    for kind in KINDS {
        let template = tempfile::tempdir().expect("temp dir");
        write_template(template.path(), kind);
        for file in files_under(template.path()) {
            let bytes = std::fs::read(&file).expect("read");
            let mut fixed = bytes.clone();
            fix_checksum(&file, &mut fixed);
            assert_eq!(fixed, bytes, "{}", file.display());
        }
    }
}
