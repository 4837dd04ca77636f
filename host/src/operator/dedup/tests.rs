//! The operator's tests, over both state layouts: what Spark keeps, late
//! rows, eviction, replays and restarts, refused configurations, and the
//! integer-set layout against a model set of keys.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, StringArray, TimestampMicrosecondArray};
use arrow_schema::Schema;
use tempfile::TempDir;

use super::*;
use crate::operator::key_encoding::{TAG_VALUE, fnv1a};
use crate::state::StoreKind;

/// One minute in µs and in ms.
const MIN: i64 = 60_000_000;
const MIN_MS: i64 = 60_000;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("order_id", DataType::Int64, true),
        Field::new("status", DataType::Utf8, true),
        Field::new(
            "occurred_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            true,
        ),
    ]))
}

type Row = (Option<i64>, Option<&'static str>, Option<i64>);

fn batch(rows: &[Row]) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(
            rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.1).collect::<Vec<_>>(),
        )),
        Arc::new(
            TimestampMicrosecondArray::from(rows.iter().map(|r| r.2).collect::<Vec<_>>())
                .with_timezone("+00:00"),
        ),
    ];
    RecordBatch::try_new(schema(), columns).expect("columns match the schema")
}

fn config(dir: &std::path::Path, keys: &[&str], event_time: bool) -> DedupConfig {
    DedupConfig {
        keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        within_watermark: false,
        event_time: event_time.then(|| "occurred_at".to_owned()),
        delay_ms: 10 * MIN_MS,
        num_partitions: 2,
        state_dir: dir.to_path_buf(),
        state: StateOptions {
            kind: StoreKind::Memory,
            ..StateOptions::default()
        },
        one_entry_per_key: false,
    }
}

fn open(config: DedupConfig, version: Option<u64>) -> DedupOperator {
    let mut op = DedupOperator::new(config, &schema()).expect("valid config");
    op.load(version).expect("state loads");
    op
}

/// Runs batch `id` with late-row watermark `late_ms` and watermark
/// `wm_ms`, commits it, and returns the rows kept and the metrics.
fn step(
    op: &mut DedupOperator,
    id: u64,
    late_ms: i64,
    wm_ms: i64,
    batches: &[&[Row]],
) -> (Vec<Row>, OperatorMetrics) {
    let input: Vec<RecordBatch> = batches.iter().map(|rows| batch(rows)).collect();
    let ctx = StatefulContext {
        batch_id: id,
        late_ms,
        watermark_ms: wm_ms,
    };
    let out = op.process(&ctx, &input).expect("batch runs");
    let metrics = op.commit(id).expect("state commits");
    (rows_of(&out), metrics)
}

fn rows_of(batches: &[RecordBatch]) -> Vec<Row> {
    let mut rows = Vec::new();
    for b in batches {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let statuses = b.column(1).as_string::<i32>();
        let times = b.column(2).as_primitive::<TimestampMicrosecondType>();
        for r in 0..b.num_rows() {
            let status = statuses.is_valid(r).then(|| statuses.value(r));
            rows.push((
                ids.is_valid(r).then(|| ids.value(r)),
                // Tests only use these spellings; map back to 'static.
                ["a", "b", "c", "d", "e"]
                    .into_iter()
                    .find(|s| Some(*s) == status),
                times.is_valid(r).then(|| times.value(r)),
            ));
        }
    }
    rows
}

#[test]
fn the_first_occurrence_of_a_key_is_kept_within_a_batch_and_across_batches() {
    let dir = TempDir::new().expect("tempdir");
    let mut op = open(config(dir.path(), &["order_id"], false), None);
    let (out, m) = step(
        &mut op,
        0,
        0,
        0,
        &[
            &[
                (Some(1), Some("a"), Some(MIN)),
                (Some(2), Some("b"), Some(MIN)),
                (Some(1), Some("c"), Some(2 * MIN)),
            ],
            &[(Some(3), Some("d"), Some(MIN)), (Some(2), Some("e"), None)],
        ],
    );
    assert_eq!(
        out,
        vec![
            (Some(1), Some("a"), Some(MIN)),
            (Some(2), Some("b"), Some(MIN)),
            (Some(3), Some("d"), Some(MIN)),
        ]
    );
    assert_eq!(m.operator_name, "dedupe");
    assert_eq!((m.num_rows_total, m.num_rows_updated), (3, 3));
    assert_eq!(m.num_state_store_instances, 2);

    let (out, m) = step(
        &mut op,
        1,
        0,
        0,
        &[&[
            (Some(3), Some("a"), None),
            (Some(4), Some("b"), None),
            (Some(4), Some("c"), None),
        ]],
    );
    assert_eq!(out, vec![(Some(4), Some("b"), None)]);
    assert_eq!((m.num_rows_total, m.num_rows_updated), (4, 1));
    assert_eq!(m.num_rows_removed, 0);

    // A replay of batch 1 reloads version 0 and keeps what the first
    // attempt kept; a restarted operator reads the committed version.
    drop(op);
    let mut op = open(config(dir.path(), &["order_id"], false), Some(0));
    let (out, m) = step(
        &mut op,
        1,
        0,
        0,
        &[&[
            (Some(3), Some("a"), None),
            (Some(4), Some("b"), None),
            (Some(4), Some("c"), None),
        ]],
    );
    assert_eq!(out, vec![(Some(4), Some("b"), None)]);
    assert_eq!(m.num_rows_total, 4);
    drop(op);
    let mut op = open(config(dir.path(), &["order_id"], false), Some(1));
    let (out, m) = step(
        &mut op,
        2,
        0,
        0,
        &[&[(Some(1), Some("a"), None), (Some(5), Some("e"), None)]],
    );
    assert_eq!(out, vec![(Some(5), Some("e"), None)]);
    assert_eq!(m.num_rows_total, 5);
}

#[test]
fn a_null_key_is_one_value_like_any_other() {
    let dir = TempDir::new().expect("tempdir");
    let mut op = open(config(dir.path(), &["order_id", "status"], false), None);
    let (out, m) = step(
        &mut op,
        0,
        0,
        0,
        &[&[
            (None, Some("a"), None),
            (None, Some("a"), Some(MIN)),
            (None, None, None),
            (None, None, Some(MIN)),
            (Some(1), None, None),
            (Some(1), Some("a"), None),
        ]],
    );
    assert_eq!(
        out,
        vec![
            (None, Some("a"), None),
            (None, None, None),
            (Some(1), None, None),
            (Some(1), Some("a"), None),
        ]
    );
    assert_eq!(m.num_rows_total, 4);
    let (out, _) = step(&mut op, 1, 0, 0, &[&[(None, None, Some(MIN))]]);
    assert!(out.is_empty(), "the null key is in state: {out:?}");
}

#[test]
fn with_the_event_time_among_the_keys_state_is_evicted_by_the_watermark() {
    let dir = TempDir::new().expect("tempdir");
    let mut op = open(config(dir.path(), &["order_id", "occurred_at"], true), None);
    let (out, m) = step(
        &mut op,
        0,
        0,
        0,
        &[&[
            (Some(1), Some("a"), Some(MIN)),
            (Some(2), Some("a"), Some(2 * MIN)),
            (Some(3), Some("a"), Some(12 * MIN)),
            (Some(1), Some("b"), Some(MIN)),
            (Some(1), Some("c"), Some(MIN + 1)),
            (Some(9), Some("a"), None),
        ]],
    );
    assert_eq!(out.len(), 5, "{out:?}");
    assert_eq!(m.num_rows_total, 5);

    // No data, wm = 2 min: the keys at 1 min, 1 min + 1 µs and 2 min
    // (inclusive) leave; 12 min and the null event time stay.
    let (out, m) = step(&mut op, 1, 0, 2 * MIN_MS, &[]);
    assert!(out.is_empty());
    assert_eq!((m.num_rows_total, m.num_rows_removed), (2, 3));

    // Late rows (event time <= wm(b-1) = 2 min) are dropped before
    // deduplication and counted; a null event time is never late.
    let (out, m) = step(
        &mut op,
        2,
        2 * MIN_MS,
        2 * MIN_MS,
        &[&[
            (Some(1), Some("d"), Some(MIN)),
            (Some(2), Some("d"), Some(2 * MIN)),
            (Some(4), Some("d"), Some(2 * MIN + 1)),
            (Some(9), Some("d"), None),
            (Some(8), Some("d"), None),
        ]],
    );
    assert_eq!(
        out,
        vec![
            (Some(4), Some("d"), Some(2 * MIN + 1)),
            (Some(8), Some("d"), None),
        ]
    );
    assert_eq!(m.num_rows_dropped_by_watermark, 2);
    assert_eq!((m.num_rows_total, m.num_rows_updated), (4, 2));

    // A duplicate arriving in the batch whose watermark expires its key
    // is still a duplicate: eviction runs after the input.
    let (out, m) = step(
        &mut op,
        3,
        2 * MIN_MS,
        20 * MIN_MS,
        &[&[(Some(3), Some("e"), Some(12 * MIN))]],
    );
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(m.num_rows_dropped_by_watermark, 0);
    assert_eq!(
        (m.num_rows_total, m.num_rows_removed),
        (2, 2),
        "only the null event times remain"
    );
}

#[test]
fn within_watermark_a_key_expires_at_its_event_time_plus_the_delay() {
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path(), &["order_id"], true);
    c.within_watermark = true;
    let mut op = open(c, None);
    let (out, m) = step(
        &mut op,
        0,
        0,
        0,
        &[&[
            (Some(1), Some("a"), Some(MIN)),
            (Some(1), Some("b"), Some(30 * MIN)),
            (Some(2), Some("a"), None),
        ]],
    );
    assert_eq!(
        out,
        vec![(Some(1), Some("a"), Some(MIN)), (Some(2), Some("a"), None)]
    );
    assert_eq!(m.operator_name, "dedupeWithinWatermark");
    assert_eq!(m.num_rows_total, 2, "one row per key, not per store entry");

    // wm = 10 min: key 1 expires at 1 + 10 = 11 min and stays; key 2
    // (null event time, read as 0 like Spark) expires at 10 min.
    let (out, m) = step(
        &mut op,
        1,
        0,
        10 * MIN_MS,
        &[&[
            (Some(1), Some("c"), Some(5 * MIN)),
            (Some(2), Some("c"), None),
        ]],
    );
    assert!(out.is_empty(), "both are duplicates: {out:?}");
    assert_eq!((m.num_rows_total, m.num_rows_removed), (1, 1));

    let (out, m) = step(&mut op, 2, 10 * MIN_MS, 11 * MIN_MS - 1, &[]);
    assert!(out.is_empty());
    assert_eq!(m.num_rows_total, 1, "11 min - 1 ms does not reach 11 min");
    let (_, m) = step(&mut op, 3, 10 * MIN_MS, 11 * MIN_MS, &[]);
    assert_eq!((m.num_rows_total, m.num_rows_removed), (0, 1));

    // Expired keys are new again; late rows do not claim a key first.
    let (out, m) = step(
        &mut op,
        4,
        11 * MIN_MS,
        11 * MIN_MS,
        &[&[
            (Some(1), Some("d"), Some(11 * MIN)),
            (Some(1), Some("e"), Some(20 * MIN)),
            (Some(2), Some("e"), None),
        ]],
    );
    assert_eq!(
        out,
        vec![
            (Some(1), Some("e"), Some(20 * MIN)),
            (Some(2), Some("e"), None)
        ]
    );
    assert_eq!(m.num_rows_dropped_by_watermark, 1);
    // Key 2 (null event time) expired at once (0 + 10 min <= 11 min).
    assert_eq!((m.num_rows_total, m.num_rows_removed), (1, 1));
}

#[test]
fn a_configuration_that_cannot_run_is_refused_naming_why() {
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path(), &["order_id"], false);
    c.within_watermark = true;
    let err = DedupOperator::new(c, &schema()).expect_err("no watermark");
    assert!(err.to_string().contains("needs a watermark"), "{err}");
    let err = DedupOperator::new(config(dir.path(), &["nope"], false), &schema())
        .expect_err("unknown key");
    assert!(err.to_string().contains("\"nope\""), "{err}");
    assert!(
        err.to_string().contains("order_id, status, occurred_at"),
        "{err}"
    );
    let err = state_schema(
        &config(dir.path(), &["status"], false),
        &Arc::new(Schema::empty()),
    )
    .expect_err("unknown key");
    assert!(err.to_string().contains("\"status\""), "{err}");
}

#[test]
fn the_state_schema_holds_only_the_keys_with_the_event_time_first() {
    let dir = TempDir::new().expect("tempdir");
    let s = state_schema(
        &config(dir.path(), &["order_id", "occurred_at"], true),
        &schema(),
    )
    .expect("valid config");
    let names: Vec<&str> = s.key.iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["occurred_at", "order_id"]);
    assert!(s.value.is_empty());
    let mut c = config(dir.path(), &["order_id"], true);
    c.within_watermark = true;
    let s = state_schema(&c, &schema()).expect("valid config");
    assert_eq!(s.key.len(), 1);
    assert_eq!(s.value[0].name(), "expires_at");
    assert!(!dir.path().join("0").exists(), "no store was opened");
    // One integer key, never evicted: stored as integer sets.
    let s =
        state_schema(&config(dir.path(), &["order_id"], true), &schema()).expect("valid config");
    assert_eq!(s.key.len(), 1);
    assert_eq!(s.value[0].name(), BUCKET_MEMBERS);
}

/// A small deterministic generator (xorshift) for the model tests.
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Dense runs, sparse and extreme values, nulls and late rows over many
/// batches, with restarts and a replayed batch: the integer-set layout
/// keeps exactly the rows a set of seen keys keeps, on both stores.
#[test]
fn the_integer_set_layout_keeps_what_a_set_of_keys_keeps() {
    for kind in [StoreKind::Memory, StoreKind::RocksDb, StoreKind::Runs] {
        let dir = TempDir::new().expect("tempdir");
        let mut cfg = config(dir.path(), &["order_id"], true);
        cfg.state.kind = kind;
        cfg.state.snapshot_interval = 3;
        cfg.state.snapshot_min_bytes = 0;
        let mut op = open(cfg.clone(), None);
        assert!(
            op.int_key.is_some(),
            "one integer key uses the integer sets"
        );
        let mut seen = HashSet::new();
        let mut rng = Xorshift(0x9e37_79b9_7f4a_7c15);
        let extremes = [
            i64::MIN,
            i64::MIN + 1,
            -4097,
            -4096,
            -1,
            0,
            4095,
            4096,
            i64::MAX,
        ];
        for id in 0..12u64 {
            let mut rows: Vec<Row> = Vec::new();
            let base = id as i64 * 3_000;
            for i in 0..2_000i64 {
                let r = rng.next();
                let key = match r % 10 {
                    // Dense: fills buckets past 256 members (bitmaps).
                    0..=5 => Some(base + i),
                    6 => Some(base + i - 2_500),
                    7 => Some((rng.next() >> 1) as i64 * if r & 1 == 0 { 1 } else { -1 }),
                    8 => Some(extremes[(r >> 8) as usize % extremes.len()]),
                    _ => None,
                };
                // Event times: some rows late against a watermark of 5 min.
                let ts = if r.is_multiple_of(7) {
                    4 * MIN
                } else {
                    10 * MIN
                };
                rows.push((key, Some("a"), Some(ts)));
            }
            let expected: Vec<Row> = rows
                .iter()
                .filter(|r| r.2 > Some(5 * MIN))
                .filter(|r| seen.insert(r.0))
                .copied()
                .collect();
            let (out, m) = step(&mut op, id, 5 * MIN_MS, 5 * MIN_MS, &[&rows]);
            assert_eq!(out, expected, "{kind} batch {id}");
            assert_eq!(m.num_rows_total, seen.len() as u64, "{kind} batch {id}");
            assert_eq!(m.num_rows_updated, expected.len() as u64);
            assert_eq!(
                m.num_rows_dropped_by_watermark,
                rows.iter().filter(|r| r.2 <= Some(5 * MIN)).count() as u64
            );
            if id == 5 {
                // Restart from the checkpoint: the same state and count.
                drop(op);
                op = open(cfg.clone(), Some(id));
            }
            if id == 8 {
                // Batch 9 fails after processing and is replayed from 8.
                let input = batch(&[(Some(-7_777_777), Some("a"), Some(10 * MIN))]);
                let ctx = StatefulContext {
                    batch_id: 9,
                    late_ms: 0,
                    watermark_ms: 0,
                };
                assert_eq!(op.process(&ctx, &[input]).expect("runs")[0].num_rows(), 1);
                op.load(Some(8)).expect("reloads version 8");
            }
        }
        // One entry per bucket (plus the null key and each partition's
        // count), not one per key.
        let buckets: HashSet<u64> = seen
            .iter()
            .flatten()
            .map(|&k| int_set::bucket_of(int_set::ordered(k)))
            .collect();
        let entries: u64 = op
            .state
            .stores()
            .iter()
            .map(|s| s.metrics().num_rows_total)
            .sum();
        assert_eq!(entries, buckets.len() as u64 + 1 + 2, "{kind}");
        assert!(entries * 5 < seen.len() as u64, "{kind}: {entries} entries");
    }
}

/// Batches of the model test of one integer key type.
const TYPE_MODEL_BATCHES: u64 = 8;

/// The integer-set layout on one key column `k` of Arrow type `T` (`n` numbers the rows):
/// `wrap` makes a `T` of any u64 as `as` does (so dense runs wrap through -1 and 0, and
/// through the type's ends), `extremes` are the type's edge values. Over batches of dense
/// runs, random values, the extremes, a few repeated small values and nulls, with a
/// restart and a replayed batch, on both stores, the rows kept are those a set of seen
/// keys keeps, and a last batch of only the extremes and a null keeps none.
fn int_key_model<T>(wrap: fn(u64) -> T::Native, extremes: &[T::Native], layout: IntKey)
where
    T: arrow_array::ArrowPrimitiveType,
    T::Native: Hash + Eq + std::fmt::Debug,
{
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("k", T::DATA_TYPE, true),
        Field::new("n", DataType::Int64, false),
    ]));
    let input = |keys: Vec<Option<T::Native>>, first: i64| {
        let n: Vec<i64> = (first..first + keys.len() as i64).collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(keys.into_iter().collect::<arrow_array::PrimitiveArray<T>>()),
            Arc::new(Int64Array::from(n)),
        ];
        RecordBatch::try_new(schema.clone(), columns).expect("columns match the schema")
    };
    let rows_of = |batches: &[RecordBatch]| -> Vec<(Option<T::Native>, i64)> {
        let mut rows = Vec::new();
        for b in batches {
            let k = b.column(0).as_primitive::<T>();
            let n = b.column(1).as_primitive::<Int64Type>();
            for r in 0..b.num_rows() {
                rows.push((k.is_valid(r).then(|| k.value(r)), n.value(r)));
            }
        }
        rows
    };
    for kind in [StoreKind::Memory, StoreKind::RocksDb, StoreKind::Runs] {
        let what = format!("{} on {kind}", T::DATA_TYPE);
        let dir = TempDir::new().expect("tempdir");
        let mut cfg = config(dir.path(), &["k"], false);
        cfg.state.kind = kind;
        cfg.state.snapshot_interval = 3;
        cfg.state.snapshot_min_bytes = 0;
        let open = |version: Option<u64>| {
            let mut op = DedupOperator::new(cfg.clone(), &schema).expect("valid config");
            op.load(version).expect("state loads");
            op
        };
        let mut op = open(None);
        assert_eq!(op.int_key, Some(layout), "{what}: stored as integer sets");
        let mut seen: HashSet<Option<T::Native>> = HashSet::new();
        let mut rng = Xorshift(0x2545_f491_4f6c_dd1d);
        let mut first = 0i64;
        let ctx = |batch_id: u64| StatefulContext {
            batch_id,
            late_ms: 0,
            watermark_ms: 0,
        };
        for id in 0..TYPE_MODEL_BATCHES {
            // Batch 0's run starts 4,000 below zero: it wraps like the type does.
            let base = (id * 1_500).wrapping_sub(4_000);
            let keys: Vec<Option<T::Native>> = (0..2_000u64)
                .map(|i| {
                    let r = rng.next();
                    match r % 10 {
                        0..=4 => Some(wrap(base.wrapping_add(i))),
                        5 => Some(wrap(r >> 3)),
                        6 | 7 => Some(extremes[(r >> 8) as usize % extremes.len()]),
                        8 => Some(wrap(i % 5)),
                        _ => None,
                    }
                })
                .collect();
            let batch = input(keys, first);
            first += batch.num_rows() as i64;
            let expected: Vec<(Option<T::Native>, i64)> = rows_of(std::slice::from_ref(&batch))
                .into_iter()
                .filter(|(k, _)| seen.insert(*k))
                .collect();
            let out = op.process(&ctx(id), &[batch]).expect("batch runs");
            let m = op.commit(id).expect("state commits");
            assert_eq!(rows_of(&out), expected, "{what}: batch {id}");
            assert_eq!(m.num_rows_total, seen.len() as u64, "{what}: batch {id}");
            assert_eq!(
                m.num_rows_updated,
                expected.len() as u64,
                "{what}: batch {id}"
            );
            if id == 3 {
                // Restart from the checkpoint: the same state and count.
                drop(op);
                op = open(Some(id));
            }
            if id == 5 {
                // The next batch fails after processing and is replayed from this one.
                let keys = (0..500).map(|_| Some(wrap(rng.next()))).collect();
                op.process(&ctx(id + 1), &[input(keys, -1_000)])
                    .expect("runs");
                op.load(Some(id)).expect("reloads the committed version");
            }
        }
        for e in extremes {
            assert!(seen.contains(&Some(*e)), "{what}: {e:?} was in a batch");
        }
        let mut last: Vec<Option<T::Native>> = extremes.iter().copied().map(Some).collect();
        last.push(None);
        let out = op
            .process(&ctx(TYPE_MODEL_BATCHES), &[input(last, first)])
            .expect("batch runs");
        assert_eq!(
            rows_of(&out),
            Vec::new(),
            "{what}: every extreme is a duplicate"
        );
    }
}

/// Every key type the integer-set layout takes ([`IntKey::of`]), each with its extremes.
#[test]
fn the_integer_set_layout_keeps_what_a_set_of_keys_keeps_for_every_integer_type() {
    use arrow_array::types::{
        Int8Type, Int16Type, Int32Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
    };
    int_key_model::<Int8Type>(
        |v| v as i8,
        &[i8::MIN, i8::MIN + 1, -1, 0, 1, i8::MAX - 1, i8::MAX],
        IntKey::Signed,
    );
    int_key_model::<Int16Type>(
        |v| v as i16,
        &[
            i16::MIN,
            i16::MIN + 1,
            -4097,
            -4096,
            -1,
            0,
            1,
            4095,
            4096,
            i16::MAX,
        ],
        IntKey::Signed,
    );
    int_key_model::<Int32Type>(
        |v| v as i32,
        &[
            i32::MIN,
            i32::MIN + 1,
            -4097,
            -1,
            0,
            1,
            4095,
            4096,
            i32::MAX - 1,
            i32::MAX,
        ],
        IntKey::Signed,
    );
    int_key_model::<Int64Type>(
        |v| v as i64,
        &[
            i64::MIN,
            i64::MIN + 1,
            -4097,
            -4096,
            -1,
            0,
            1,
            4095,
            4096,
            i64::MAX - 1,
            i64::MAX,
        ],
        IntKey::Signed,
    );
    // Unsigned types have no -1: their maximum is its bit pattern.
    int_key_model::<UInt8Type>(|v| v as u8, &[0, 1, u8::MAX - 1, u8::MAX], IntKey::Signed);
    int_key_model::<UInt16Type>(
        |v| v as u16,
        &[0, 1, 4095, 4096, u16::MAX - 1, u16::MAX],
        IntKey::Signed,
    );
    int_key_model::<UInt32Type>(
        |v| v as u32,
        &[
            0,
            1,
            4095,
            4096,
            i32::MAX as u32,
            1 << 31,
            u32::MAX - 1,
            u32::MAX,
        ],
        IntKey::Signed,
    );
    int_key_model::<UInt64Type>(
        |v| v,
        &[
            0,
            1,
            4095,
            4096,
            i64::MAX as u64,
            1 << 63,
            u64::MAX - 4096,
            u64::MAX - 1,
            u64::MAX,
        ],
        IntKey::Unsigned,
    );
}

/// Any other key type, even one stored as an integer (dates, timestamps, decimals), keeps
/// one entry per key.
#[test]
fn the_integer_set_layout_takes_integer_keys_only() {
    let dir = TempDir::new().expect("tempdir");
    for data_type in [
        DataType::Boolean,
        DataType::Float64,
        DataType::Date32,
        DataType::Timestamp(TimeUnit::Microsecond, None),
        DataType::Decimal128(12, 2),
        DataType::Utf8,
    ] {
        let schema: SchemaRef =
            Arc::new(Schema::new(vec![Field::new("k", data_type.clone(), true)]));
        let op = DedupOperator::new(config(dir.path(), &["k"], false), &schema)
            .expect("a supported key type");
        assert_eq!(op.int_key, None, "{data_type}");
    }
}

#[test]
fn a_corrupt_bucket_fails_the_batch_naming_the_store_and_bucket() {
    let dir = TempDir::new().expect("tempdir");
    let mut op = open(config(dir.path(), &["order_id"], false), None);
    step(&mut op, 0, 0, 0, &[&[(Some(5), Some("a"), None)]]);
    let mut key = [0u8; 9];
    key[0] = TAG_VALUE;
    key[1..].copy_from_slice(&int_set::bucket_of(int_set::ordered(5)).to_be_bytes());
    let p = (fnv1a(&key) % 2) as usize;
    op.state.store_mut(p).put(&key, &[0x07]).expect("put");
    let ctx = StatefulContext {
        batch_id: 1,
        late_ms: 0,
        watermark_ms: 0,
    };
    let err = op
        .process(&ctx, &[batch(&[(Some(6), Some("a"), None)])])
        .expect_err("corrupt bucket");
    let text = err.to_string();
    let bucket = int_set::bucket_of(int_set::ordered(5));
    assert!(text.contains(&format!("bucket {bucket}")), "{text}");
    assert!(text.contains("unknown container tag 0x07"), "{text}");
    assert!(
        text.contains(&dir.path().join(p.to_string()).display().to_string()),
        "{text}"
    );
}

#[test]
fn a_checkpoint_written_before_integer_sets_keeps_one_entry_per_key() {
    let dir = TempDir::new().unwrap();
    let sets = vec![BUCKET_MEMBERS.to_owned()];
    // One integer key: integer sets, unless the checkpoint recorded another layout.
    let mut c = config(dir.path(), &["order_id"], false);
    assert!(
        keep_recorded_layout(&mut c, &sets, &schema())
            .unwrap()
            .is_none()
    );
    assert!(!c.one_entry_per_key);
    let kept = keep_recorded_layout(&mut c, &[], &schema())
        .unwrap()
        .expect("the layout changes");
    assert!(c.one_entry_per_key);
    assert!(kept.value.is_empty(), "{:?}", kept.value);
    // Once one entry per key, it stays so.
    assert!(
        keep_recorded_layout(&mut c, &[], &schema())
            .unwrap()
            .is_none()
    );
    // A string key never used sets: nothing to keep.
    let mut c = config(dir.path(), &["status"], false);
    assert!(
        keep_recorded_layout(&mut c, &[], &schema())
            .unwrap()
            .is_none()
    );
    assert!(!c.one_entry_per_key);
}

/// Per-key state on four partitions spread over three threads keeps, evicts, counts and
/// restores exactly what one thread does: for every eviction rule, over batches of repeated
/// and late keys, with a restart from a committed version in the middle.
#[test]
fn partitions_on_threads_keep_what_one_thread_keeps() {
    let statuses = ["a", "b", "c", "d", "e"];
    let mut rng = Xorshift(0x5eed_1234_abcd_0042);
    let batches: Vec<Vec<Row>> = (0..12i64)
        .map(|b| {
            (0..300)
                .map(|_| {
                    let id = (rng.next() % 400) as i64;
                    let status = statuses[(rng.next() % 5) as usize];
                    // Event times around the batch's minute, some far behind it.
                    let back = (rng.next() % 30) as i64;
                    let t = (b * 3 + 20 - back.min(b * 3 + 20)) * MIN;
                    let t = (!rng.next().is_multiple_of(50)).then_some(t);
                    (Some(id), Some(status), t)
                })
                .collect()
        })
        .collect();
    let cases: [(&[&str], bool); 3] = [
        (&["order_id", "status"], false),
        (&["order_id", "occurred_at"], false),
        (&["status", "order_id"], true),
    ];
    for (keys, within) in cases {
        let run = |threads: usize| {
            let dir = TempDir::new().expect("tempdir");
            let mut cfg = config(dir.path(), keys, true);
            cfg.within_watermark = within;
            cfg.num_partitions = 4;
            cfg.state.kind = StoreKind::RocksDb;
            cfg.state.threads =
                crate::threads::Threads::new(std::num::NonZeroUsize::new(threads).unwrap());
            let mut op = open(cfg.clone(), None);
            let mut seen = Vec::new();
            for (id, rows) in batches.iter().enumerate() {
                let id = id as u64;
                if id == 7 {
                    // A restart: the state of batch 6 loads on every thread.
                    drop(op);
                    op = open(cfg.clone(), Some(6));
                }
                let wm = (id as i64 * 3 + 5) * MIN_MS;
                let (out, m) = step(&mut op, id, wm - 3 * MIN_MS, wm, &[rows.as_slice()]);
                seen.push((
                    out,
                    m.num_rows_total,
                    m.num_rows_updated,
                    m.num_rows_removed,
                    m.num_rows_dropped_by_watermark,
                ));
            }
            seen
        };
        let one = run(1);
        assert_eq!(run(3), one, "{keys:?}, within watermark: {within}");
        // The case does what it is meant to: keys kept, some evicted, some late.
        assert!(
            one.iter().map(|s| s.0.len()).sum::<usize>() > 1000,
            "{keys:?}"
        );
        let evicts = within || keys.contains(&"occurred_at");
        assert_eq!(one.iter().any(|s| s.3 > 0), evicts, "{keys:?}: evicted");
        assert!(one.iter().any(|s| s.4 > 0), "{keys:?}: nothing late");
    }
}

/// What Spark keeps, row by row: a row is late when its event time is `<= late_ms * 1000`;
/// else it is emitted when its key is not held, and its key is then held (with its expiry).
/// After the input, `EventTimeKey` drops keys whose event time is `<= wm_ms * 1000`, within
/// the watermark drops keys whose `expiresAt` is `<= wm_ms * 1000`.
#[derive(Default)]
struct DedupModel {
    held: std::collections::HashMap<Vec<Option<String>>, Option<i64>>,
}

impl DedupModel {
    fn step(
        &mut self,
        keys: &[&str],
        expiry: Expiry,
        late_ms: i64,
        wm_ms: i64,
        batches: &[Vec<Row>],
    ) -> (Vec<Row>, u64, u64, u64) {
        let mut out = Vec::new();
        let (mut late, mut added) = (0, 0);
        for &row in batches.iter().flatten() {
            if row.2.is_some_and(|t| t <= late_ms * 1000) {
                late += 1;
                continue;
            }
            let key: Vec<Option<String>> = keys
                .iter()
                .map(|&k| match k {
                    "order_id" => row.0.map(|v| v.to_string()),
                    "status" => row.1.map(str::to_owned),
                    _ => row.2.map(|v| v.to_string()),
                })
                .collect();
            if self.held.contains_key(&key) {
                continue;
            }
            let expires = match expiry {
                Expiry::Never => None,
                Expiry::EventTimeKey => row.2,
                Expiry::WithinWatermark { delay_micros } => {
                    Some(row.2.unwrap_or(0).saturating_add(delay_micros))
                }
            };
            self.held.insert(key, expires);
            out.push(row);
            added += 1;
        }
        let before = self.held.len();
        if expiry != Expiry::Never {
            self.held
                .retain(|_, at| at.is_none_or(|at| at > wm_ms * 1000));
        }
        (out, added, (before - self.held.len()) as u64, late)
    }
}

/// Many input batches per micro-batch (empty ones among them), duplicates inside a batch,
/// across the batches of one micro-batch and across micro-batches, late rows, null keys and
/// every eviction rule, on every store with three partitions: the per-key layout
/// emits, counts and evicts exactly what a row-by-row model of Spark's rules does.
#[test]
fn the_per_key_layout_keeps_what_a_row_by_row_model_keeps() {
    let statuses = ["a", "b", "c", "d", "e"];
    let mut rng = Xorshift(0x0dd5_eed5_1234_5678);
    // Micro-batch b: 0 to 4 input batches of 0 to 120 rows.
    let micro_batches: Vec<Vec<Vec<Row>>> = (0..16i64)
        .map(|b| {
            let parts = rng.next() % 5;
            (0..parts)
                .map(|_| {
                    let rows = rng.next() % 121;
                    (0..rows)
                        .map(|_| {
                            // Mostly ascending ids with repeats, some far back.
                            let id = if rng.next().is_multiple_of(4) {
                                (rng.next() % 600) as i64
                            } else {
                                b * 40 + (rng.next() % 60) as i64
                            };
                            let id = (!rng.next().is_multiple_of(40)).then_some(id);
                            let status = (!rng.next().is_multiple_of(30))
                                .then(|| statuses[(rng.next() % 5) as usize]);
                            let back = (rng.next() % 30) as i64;
                            let t = (b * 3 + 20 - back.min(b * 3 + 20)) * MIN;
                            let t = (!rng.next().is_multiple_of(50)).then_some(t);
                            (id, status, t)
                        })
                        .collect()
                })
                .collect()
        })
        .collect();
    let cases: [(&[&str], bool, Expiry); 3] = [
        (&["order_id", "status"], false, Expiry::Never),
        (&["order_id", "occurred_at"], false, Expiry::EventTimeKey),
        (
            &["status", "order_id"],
            true,
            Expiry::WithinWatermark {
                delay_micros: 10 * MIN,
            },
        ),
    ];
    // RocksDB's batched lookup trusts the keys to come sorted; memory and runs do not.
    for kind in [StoreKind::Memory, StoreKind::RocksDb, StoreKind::Runs] {
        for (keys, within, expiry) in cases {
            let dir = TempDir::new().expect("tempdir");
            let mut cfg = config(dir.path(), keys, true);
            cfg.within_watermark = within;
            cfg.num_partitions = 3;
            cfg.state.kind = kind;
            let mut op = open(cfg, None);
            let mut model = DedupModel::default();
            let (mut emitted, mut evicted) = (0, 0);
            for (id, batches) in micro_batches.iter().enumerate() {
                let wm = (id as i64 * 3 + 5) * MIN_MS;
                let late = wm - 3 * MIN_MS;
                let parts: Vec<&[Row]> = batches.iter().map(Vec::as_slice).collect();
                let (out, m) = step(&mut op, id as u64, late, wm, &parts);
                let (want, added, removed, dropped) = model.step(keys, expiry, late, wm, batches);
                let at = format!("{kind:?} {keys:?} micro-batch {id}");
                assert_eq!(out, want, "{at}");
                assert_eq!(m.num_rows_updated, added, "{at}");
                assert_eq!(m.num_rows_removed, removed, "{at}");
                assert_eq!(m.num_rows_dropped_by_watermark, dropped, "{at}");
                assert_eq!(m.num_rows_total, model.held.len() as u64, "{at}");
                emitted += added;
                evicted += removed;
            }
            // The case does what it is meant to.
            assert!(emitted > 300, "{kind:?} {keys:?}: {emitted} emitted");
            assert_eq!(evicted > 0, expiry != Expiry::Never, "{kind:?} {keys:?}");
        }
    }
}

/// Keys sorted on their 16-byte integer head come out in byte order: keys shorter than the
/// head (zero-padded, so `ab` and `ab\0` tie on it), exactly as long, and longer ones that
/// share it.
#[test]
fn keys_sort_in_byte_order_on_their_head_and_tail() {
    let mut rng = Xorshift(0x50f7_ed00_1234_abcd);
    let mut keys: Vec<u8> = Vec::new();
    let mut ends = Vec::new();
    let mut want: Vec<Vec<u8>> = Vec::new();
    for _ in 0..5_000 {
        let len = (rng.next() % 34) as usize;
        // Few distinct bytes, zeros among them: equal heads and padded ties are common.
        let key: Vec<u8> = (0..len)
            .map(|_| [0u8, 0, 1, 0xff][(rng.next() % 4) as usize])
            .collect();
        if want.contains(&key) {
            continue;
        }
        keys.extend_from_slice(&key);
        ends.push(keys.len());
        want.push(key);
    }
    let key_of = |row: u32| {
        let row = row as usize;
        let start = if row == 0 { 0 } else { ends[row - 1] };
        &keys[start..ends[row]]
    };
    let rows: Vec<u32> = (0..want.len() as u32).collect();
    let got: Vec<Vec<u8>> = per_key::sorted_keys(&rows, &key_of)
        .into_iter()
        .map(|(row, key)| {
            assert_eq!(key, key_of(row));
            key.to_vec()
        })
        .collect();
    want.sort();
    assert_eq!(got, want);
}

/// A micro-batch larger than one pass of the per-key layout is taken in chunks of whole input
/// batches; a later chunk sees the keys an earlier one stored, so the rows kept are those one
/// pass would keep.
#[test]
fn a_micro_batch_larger_than_one_pass_keeps_what_one_pass_would() {
    let dir = TempDir::new().expect("tempdir");
    let mut op = open(config(dir.path(), &["order_id", "status"], false), None);
    let part = |ids: std::ops::Range<i64>| -> Vec<Row> {
        ids.map(|id| (Some(id), Some("a"), None)).collect()
    };
    // 100k-row batches: the first two make one pass (200k <= 2^18), the third a second one.
    let batches = [
        part(0..100_000),
        part(50_000..150_000),
        part(100_000..200_000),
    ];
    const { assert!(200_000 <= CHUNK_ROWS && 300_000 > CHUNK_ROWS) };
    let parts: Vec<&[Row]> = batches.iter().map(Vec::as_slice).collect();
    let (out, m) = step(&mut op, 0, 0, 0, &parts);
    let ids: Vec<i64> = out.iter().filter_map(|r| r.0).collect();
    assert_eq!(ids, (0..200_000).collect::<Vec<_>>());
    assert_eq!((m.num_rows_total, m.num_rows_updated), (200_000, 200_000));
}
