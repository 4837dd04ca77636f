use super::*;

fn kinds() -> [StoreKind; 3] {
    [StoreKind::Memory, StoreKind::RocksDb, StoreKind::Runs]
}

fn options(kind: StoreKind) -> StateOptions {
    StateOptions {
        kind,
        snapshot_interval: 3,
        min_versions_to_retain: 4,
        snapshot_min_bytes: 0,
        ..StateOptions::default()
    }
}

fn all(store: &StateStore) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    store
        .scan(b"", None, &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            Ok(true)
        })
        .unwrap();
    out
}

fn kv(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    pairs
        .iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

#[test]
fn uncommitted_writes_are_visible_and_rolled_back_by_load() {
    for kind in kinds() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = StateStore::open(dir.path(), &options(kind)).unwrap();
        store.load(None).unwrap();
        store.put(b"a", b"1").unwrap();
        store.put(b"c", b"3").unwrap();
        store.commit(0).unwrap();
        store.load(Some(0)).unwrap();
        store.put(b"b", b"2").unwrap();
        store.delete(b"a").unwrap();
        store.put(b"c", b"33").unwrap();
        assert_eq!(store.get(b"a").unwrap(), None, "{kind}");
        assert!(store.contains(b"b").unwrap());
        assert_eq!(all(&store), kv(&[("b", "2"), ("c", "33")]), "{kind}");
        assert_eq!(store.metrics().num_rows_total, 2);
        // A failed batch: reload the committed version.
        store.load(Some(0)).unwrap();
        assert_eq!(all(&store), kv(&[("a", "1"), ("c", "3")]), "{kind}");
        assert_eq!(store.metrics().num_rows_total, 2);
    }
}

#[test]
fn scan_merges_pending_and_committed_in_key_order_within_bounds() {
    for kind in kinds() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = StateStore::open(dir.path(), &options(kind)).unwrap();
        store.load(None).unwrap();
        for k in ["b", "d", "f", "h"] {
            store.put(k.as_bytes(), b"old").unwrap();
        }
        store.commit(0).unwrap();
        store.put(b"a", b"new").unwrap();
        store.put(b"d", b"new").unwrap();
        store.delete(b"f").unwrap();
        store.put(b"g", b"new").unwrap();
        let mut seen = Vec::new();
        store
            .scan(b"b", Some(b"h"), &mut |k, v| {
                seen.push(format!(
                    "{}={}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(v)
                ));
                Ok(true)
            })
            .unwrap();
        assert_eq!(seen, ["b=old", "d=new", "g=new"], "{kind}");
        // Early stop.
        let mut first = Vec::new();
        store
            .scan(b"", None, &mut |k, _| {
                first.push(k.to_vec());
                Ok(first.len() < 2)
            })
            .unwrap();
        assert_eq!(first, [b"a".to_vec(), b"b".to_vec()], "{kind}");
    }
}

#[test]
fn reopened_store_recovers_every_retained_version() {
    for kind in kinds() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = StateStore::open(dir.path(), &options(kind)).unwrap();
            store.load(None).unwrap();
            for v in 0..10u64 {
                store
                    .put(format!("k{v}").as_bytes(), &v.to_le_bytes())
                    .unwrap();
                if v >= 2 {
                    store.delete(format!("k{}", v - 2).as_bytes()).unwrap();
                }
                store.commit(v).unwrap();
            }
        }
        // Newest first: loading a version drops the versions after it.
        for v in (5..10u64).rev() {
            let mut store = StateStore::open(dir.path(), &options(kind)).unwrap();
            store.load(Some(v)).unwrap();
            let keys: Vec<Vec<u8>> = all(&store).into_iter().map(|(k, _)| k).collect();
            let expected: Vec<Vec<u8>> = [v - 1, v]
                .iter()
                .map(|i| format!("k{i}").into_bytes())
                .collect();
            assert_eq!(keys, expected, "{kind} version {v}");
            assert_eq!(store.metrics().num_rows_total, 2);
        }
    }
}

#[test]
fn snapshots_bound_the_files_kept_and_the_changelogs_replayed() {
    for kind in kinds() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = StateStore::open(dir.path(), &options(kind)).unwrap();
        store.load(None).unwrap();
        for v in 0..60u64 {
            store.put(&v.to_be_bytes(), b"x").unwrap();
            store.commit(v).unwrap();
        }
        let (snapshots, changelogs) = store.loadable_versions();
        assert!(snapshots.len() <= 3, "{kind}: snapshots {snapshots:?}");
        assert!(changelogs.len() <= 8, "{kind}: changelogs {changelogs:?}");
        // Everything after the oldest snapshot can be loaded.
        let oldest = snapshots[0];
        assert!(oldest <= 59 - 4, "{kind}: {snapshots:?}");
        drop(store);
        let mut reopened = StateStore::open(dir.path(), &options(kind)).unwrap();
        reopened.load(Some(59)).unwrap();
        assert_eq!(reopened.metrics().num_rows_total, 60);
        assert_eq!(all(&reopened).len(), 60);
    }
}

#[test]
fn a_snapshot_waits_for_enough_changelog_bytes_or_ten_intervals() {
    let snapshots_while = |store: &mut StateStore, versions: std::ops::Range<u64>, value: &[u8]| {
        let mut at = Vec::new();
        for v in versions {
            store.put(&v.to_be_bytes(), value).unwrap();
            store.commit(v).unwrap();
            if store.loadable_versions().0.contains(&v) {
                at.push(v);
            }
        }
        at
    };
    for kind in kinds() {
        // Each version writes a 1,000-byte value: the threshold of 5,000 bytes is met
        // five versions after a snapshot, later than the interval of 3.
        let dir = tempfile::tempdir().unwrap();
        let options = StateOptions {
            snapshot_min_bytes: 5_000,
            ..options(kind)
        };
        let mut store = StateStore::open(dir.path(), &options).unwrap();
        store.load(None).unwrap();
        assert_eq!(
            snapshots_while(&mut store, 0..12, &[7; 1000]),
            [4, 9],
            "{kind}"
        );
        // Reopened at 11, the store counts the changelogs of 10 and 11 again.
        drop(store);
        let mut store = StateStore::open(dir.path(), &options).unwrap();
        store.load(Some(11)).unwrap();
        assert_eq!(
            snapshots_while(&mut store, 12..16, &[7; 1000]),
            [14],
            "{kind}"
        );

        // Tiny changelogs: a snapshot every ten intervals (30 versions).
        let dir = tempfile::tempdir().unwrap();
        let options = StateOptions {
            snapshot_min_bytes: u64::MAX,
            ..options
        };
        let mut store = StateStore::open(dir.path(), &options).unwrap();
        store.load(None).unwrap();
        assert_eq!(snapshots_while(&mut store, 0..65, b"x"), [29, 59], "{kind}");
        drop(store);
        let mut store = StateStore::open(dir.path(), &options).unwrap();
        store.load(Some(64)).unwrap();
        assert_eq!(all(&store).len(), 65, "{kind}");
    }
}

#[test]
fn loading_an_older_version_removes_the_abandoned_newer_ones() {
    for kind in kinds() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = StateStore::open(dir.path(), &options(kind)).unwrap();
        store.load(None).unwrap();
        for v in 0..5u64 {
            store.put(b"n", &v.to_le_bytes()).unwrap();
            store.commit(v).unwrap();
        }
        // Batch 4's query commit never happened: batch 4 re-runs from version 3.
        drop(store);
        let mut store = StateStore::open(dir.path(), &options(kind)).unwrap();
        store.load(Some(3)).unwrap();
        assert_eq!(store.get(b"n").unwrap(), Some(3u64.to_le_bytes().to_vec()));
        assert!(!dir.path().join(files::changelog_name(4)).exists());
        store.put(b"n", b"again").unwrap();
        store.commit(4).unwrap();
        drop(store);
        let mut store = StateStore::open(dir.path(), &options(kind)).unwrap();
        store.load(Some(4)).unwrap();
        assert_eq!(store.get(b"n").unwrap(), Some(b"again".to_vec()));
    }
}

#[test]
fn a_damaged_changelog_is_reported_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = StateStore::open(dir.path(), &options(StoreKind::Memory)).unwrap();
    store.load(None).unwrap();
    store.put(b"a", b"1").unwrap();
    store.commit(0).unwrap();
    store.put(b"b", b"2").unwrap();
    store.commit(1).unwrap();
    let file = dir.path().join(files::changelog_name(1));
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 5]).unwrap();
    let mut store = StateStore::open(dir.path(), &options(StoreKind::Memory)).unwrap();
    let err = store.load(Some(1)).unwrap_err();
    assert!(
        matches!(&err, StateError::Corrupt { file: f, .. } if f == &file),
        "{err}"
    );
    assert!(err.to_string().contains("1.changelog"), "{err}");
}

#[test]
fn a_missing_version_is_an_error_that_names_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = StateStore::open(dir.path(), &options(StoreKind::RocksDb)).unwrap();
    let err = store.load(Some(7)).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("version 7 cannot be loaded"), "{text}");
    assert!(text.contains(&dir.path().display().to_string()), "{text}");
}

#[test]
fn a_snapshot_of_another_store_kind_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = StateStore::open(dir.path(), &options(StoreKind::Memory)).unwrap();
    store.load(None).unwrap();
    for v in 0..4 {
        store.put(b"k", b"v").unwrap();
        store.commit(v).unwrap();
    }
    drop(store);
    let mut other = StateStore::open(dir.path(), &options(StoreKind::RocksDb)).unwrap();
    let err = other.load(Some(3)).unwrap_err();
    assert!(matches!(err, StateError::WrongKind { .. }), "{err}");
}

#[test]
fn batched_lookups_see_committed_state_and_this_batch_s_writes() {
    for kind in kinds() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = StateStore::open(dir.path(), &options(kind)).unwrap();
        store.load(None).unwrap();
        for key in [&b"a"[..], b"c", b"e"] {
            store.put(key, b"").unwrap();
        }
        store.commit(0).unwrap();
        // Committed only, keys in order and out of order.
        let mut found = vec![true; 9];
        store
            .contains_many(&[b"a", b"b", b"c", b"d", b"e"], true, &mut found)
            .unwrap();
        assert_eq!(found, [true, false, true, false, true], "{kind}");
        store
            .contains_many(&[b"e", b"b", b"a"], false, &mut found)
            .unwrap();
        assert_eq!(found, [true, false, true], "{kind}");
        // This batch deletes `c` and adds `b`: they answer for those keys.
        store.delete(b"c").unwrap();
        store.put_new(b"d", b"4").unwrap();
        store.put(b"b", b"2").unwrap();
        store
            .contains_many(&[b"a", b"b", b"c", b"d", b"f"], true, &mut found)
            .unwrap();
        assert_eq!(found, [true, true, false, true, false], "{kind}");
        assert_eq!(store.metrics().num_rows_total, 4, "{kind}");
        store.commit(1).unwrap();
        store.load(Some(1)).unwrap();
        assert_eq!(
            all(&store),
            kv(&[("a", ""), ("b", "2"), ("d", "4"), ("e", "")]),
            "{kind}"
        );
        // `put_new` of a key this batch deleted is a put like any other.
        store.delete(b"a").unwrap();
        store.put_new(b"a", b"1").unwrap();
        assert_eq!(store.metrics().num_rows_total, 4, "{kind}");
        assert_eq!(store.get(b"a").unwrap(), Some(b"1".to_vec()), "{kind}");
    }
}

/// A query makes its options once: every store opened with them (or a clone) draws on one pool
/// of RocksDB memory, and leaves it when dropped.
#[test]
fn stores_opened_with_one_options_share_its_rocksdb_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let query = options(StoreKind::RocksDb);
    let a = StateStore::open(&tmp.path().join("a"), &query.clone()).unwrap();
    let b = StateStore::open(&tmp.path().join("b"), &query).unwrap();
    assert_eq!(query.rocks.shares().0, 2);
    let other = options(StoreKind::RocksDb);
    let c = StateStore::open(&tmp.path().join("c"), &other).unwrap();
    assert_eq!((query.rocks.shares().0, other.rocks.shares().0), (2, 1));
    drop(a);
    assert_eq!(query.rocks.shares().0, 1);
    drop((b, c));
    assert_eq!((query.rocks.shares().0, other.rocks.shares().0), (0, 0));
}

#[test]
fn keys_put_new_in_one_sorted_pass_join_this_batch_s_writes() {
    for kind in kinds() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = StateStore::open(dir.path(), &options(kind)).unwrap();
        store.load(None).unwrap();
        store.put(b"b", b"old").unwrap();
        store.put(b"d", b"old").unwrap();
        store.commit(0).unwrap();

        // Into an empty batch, in order; then into a batch holding a put and a delete (the
        // deleted key is absent, so it may be put new again), out of order.
        store
            .put_new_sorted([(&b"a"[..], &b"1"[..]), (b"c", b"3")].into_iter())
            .unwrap();
        assert_eq!(store.metrics().num_rows_total, 4, "{kind}");
        store.delete(b"d").unwrap();
        store.put(b"e", b"5").unwrap();
        store
            .put_new_sorted([(&b"f"[..], &b""[..]), (b"d", b"new")].into_iter())
            .unwrap();
        let want = kv(&[
            ("a", "1"),
            ("b", "old"),
            ("c", "3"),
            ("d", "new"),
            ("e", "5"),
            ("f", ""),
        ]);
        assert_eq!(all(&store), want, "{kind}");
        assert_eq!(store.metrics().num_rows_total, 6, "{kind}");
        store.commit(1).unwrap();
        store.load(Some(1)).unwrap();
        assert_eq!(all(&store), want, "{kind}");
        assert_eq!(store.metrics().num_rows_total, 6, "{kind}");
        let mut found = Vec::new();
        store
            .contains_many(&[b"a", b"d", b"f", b"g"], true, &mut found)
            .unwrap();
        assert_eq!(found, [true, true, true, false], "{kind}");
    }
}
