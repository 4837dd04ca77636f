use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, TimestampMicrosecondType};
use arrow_array::{
    Array, ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::*;
use crate::spec::RowCondition;
use crate::state::StoreKind;

const MIN: i64 = 60_000;
/// The guide's attribution, scaled: an order within 10 minutes after the click.
const CONDITION: &str =
    "orders.occurred_at BETWEEN clicks.clicked_at AND clicks.clicked_at + INTERVAL 10 MINUTES";

fn ts() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))
}

fn clicks_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("click_id", DataType::Int64, true),
        Field::new("session_id", DataType::Utf8, true),
        Field::new("clicked_at", ts(), true),
    ]))
}

fn orders_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("order_id", DataType::Int64, true),
        Field::new("session_id", DataType::Utf8, true),
        Field::new("occurred_at", ts(), true),
    ]))
}

/// Rows (id, session, minute) of a clicks or orders batch.
fn rows(schema: &SchemaRef, rows: &[(i64, Option<&str>, i64)]) -> RecordBatch {
    RecordBatch::try_new(
        Arc::clone(schema),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1))),
            Arc::new(
                TimestampMicrosecondArray::from_iter_values(rows.iter().map(|r| r.2 * MIN * 1000))
                    .with_timezone("+00:00"),
            ),
        ],
    )
    .unwrap()
}

fn spec(kind: JoinType) -> JoinSpec {
    JoinSpec {
        left: "clicks".into(),
        right: "orders".into(),
        kind,
        on: vec!["session_id".into()],
        condition: Some(RowCondition::parse_join(CONDITION, "clicks", "orders").unwrap()),
    }
}

fn inputs() -> (JoinInput, JoinInput) {
    (
        JoinInput {
            schema: clicks_schema(),
            watermark: Some("clicked_at".into()),
        },
        JoinInput {
            schema: orders_schema(),
            watermark: Some("occurred_at".into()),
        },
    )
}

fn open(dir: &Path, kind: JoinType, store: StoreKind) -> StreamJoin {
    let (l, r) = inputs();
    let options = StateOptions {
        kind: store,
        ..StateOptions::default()
    };
    StreamJoin::new(
        spec(kind),
        &l,
        &r,
        &StreamJoinState {
            dir,
            partitions: 2,
            options: &options,
        },
    )
    .unwrap()
}

/// Each output row as `session click order` (`-` for null), sorted.
fn show(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        let text = |name: &str, r: usize| -> String {
            let Some(c) = b.column_by_name(name) else {
                return String::new();
            };
            if c.is_null(r) {
                return "-".into();
            }
            match c.data_type() {
                DataType::Int64 => c.as_primitive::<Int64Type>().value(r).to_string(),
                DataType::Utf8 => c.as_string::<i32>().value(r).to_owned(),
                _ => {
                    (c.as_primitive::<TimestampMicrosecondType>().value(r) / MIN / 1000).to_string()
                }
            }
        };
        for r in 0..b.num_rows() {
            out.push(
                format!(
                    "{} {} {}",
                    text("session_id", r),
                    text("click_id", r),
                    text("order_id", r)
                )
                .trim_end()
                .to_owned(),
            );
        }
    }
    out.sort();
    out
}

fn ctx(batch_id: u64, late_min: i64, wm_min: i64) -> StatefulContext {
    StatefulContext {
        batch_id,
        late_ms: late_min * MIN,
        watermark_ms: wm_min * MIN,
    }
}

#[test]
fn the_condition_bounds_each_side_as_spark_computes_it() {
    let c = RowCondition::parse_join(CONDITION, "clicks", "orders").unwrap();
    // clicks.clicked_at >= orders.occurred_at - 10 min (a `<=`: one millisecond more).
    assert_eq!(
        c.lower_bound_ms(true, "clicked_at", "occurred_at"),
        Some(10 * MIN + 1)
    );
    // orders.occurred_at >= clicks.clicked_at.
    assert_eq!(
        c.lower_bound_ms(false, "occurred_at", "clicked_at"),
        Some(1)
    );
    let strict = RowCondition::parse_join(
        "orders.occurred_at > clicks.clicked_at AND orders.occurred_at < clicks.clicked_at + INTERVAL '1' HOUR",
        "clicks",
        "orders",
    )
    .unwrap();
    assert_eq!(
        strict.lower_bound_ms(true, "clicked_at", "occurred_at"),
        Some(60 * MIN)
    );
    assert_eq!(
        strict.lower_bound_ms(false, "occurred_at", "clicked_at"),
        Some(0)
    );
    // Only an upper bound on the orders: they can never be let go.
    let upper = RowCondition::parse_join(
        "orders.occurred_at <= clicks.clicked_at + INTERVAL 1 HOUR",
        "clicks",
        "orders",
    )
    .unwrap();
    assert_eq!(
        upper.lower_bound_ms(false, "occurred_at", "clicked_at"),
        None
    );
    assert_eq!(
        upper.lower_bound_ms(true, "clicked_at", "occurred_at"),
        Some(60 * MIN + 1)
    );
    // Another column than the watermark's bounds nothing.
    assert_eq!(c.lower_bound_ms(true, "other", "occurred_at"), None);
}

#[test]
fn the_condition_splits_into_each_side_s_part_and_the_pairs() {
    let c = RowCondition::parse_join(
        "clicks.url <> '/' AND (orders.amount > 10 AND orders.occurred_at >= clicks.clicked_at) AND 1 = 1",
        "clicks",
        "orders",
    )
    .unwrap();
    let parts = c.split_join().unwrap();
    assert_eq!(
        parts.left_only.unwrap().to_string(),
        "(clicks.url <> '/') AND (1 = 1)"
    );
    assert_eq!(
        parts.right_only.unwrap().to_string(),
        "(orders.amount > 10) AND (1 = 1)"
    );
    assert_eq!(
        parts.both.unwrap().to_string(),
        "(orders.occurred_at >= clicks.clicked_at)"
    );
}

#[test]
fn an_inner_join_pairs_rows_across_batches_once_and_evicts_by_the_watermark() {
    for store in [StoreKind::Memory, StoreKind::RocksDb, StoreKind::Runs] {
        let dir = tempfile::tempdir().unwrap();
        let mut join = open(dir.path(), JoinType::Inner, store);
        join.load(None).unwrap();
        // Batch 0: a click and its order in the same batch, a click whose order comes later,
        // an order too late for its click (15 min after), a null session, another session.
        let out = join
            .process(
                &ctx(0, 0, 0),
                [
                    &[rows(
                        &clicks_schema(),
                        &[
                            (1, Some("a"), 10),
                            (2, Some("b"), 10),
                            (3, Some("c"), 10),
                            (4, None, 10),
                        ],
                    )],
                    &[rows(
                        &orders_schema(),
                        &[(100, Some("a"), 15), (300, Some("c"), 25), (400, None, 12)],
                    )],
                ],
            )
            .unwrap();
        assert_eq!(show(&out), ["a 1 100"]);
        let m = join.commit(0).unwrap();
        // Clicks 1, 2, 3 and orders 100, 300 wait; the null keys are dropped.
        assert_eq!(
            (
                m.num_rows_total,
                m.num_rows_updated,
                m.operator_name.as_str()
            ),
            (5, 5, OPERATOR)
        );
        // Batch 1 (watermark 14): b's order, and a second click of session a that pairs with
        // order 100 (the order waits until the watermark passes 15).
        let out = join
            .process(
                &ctx(1, 0, 14),
                [
                    &[rows(&clicks_schema(), &[(5, Some("a"), 14)])],
                    &[rows(&orders_schema(), &[(200, Some("b"), 19)])],
                ],
            )
            .unwrap();
        assert_eq!(show(&out), ["a 5 100", "b 2 200"]);
        let m = join.commit(1).unwrap();
        // Evicted at watermark 14: orders at or below it (none), clicks at or below
        // 14 - 10 min - 1 ms (none: the clicks are at 10).
        assert_eq!(m.num_rows_total, 7);
        // Batch 2, watermark 30: every click (at or below 19:59.999) and order (at or below
        // 29:59.999) goes; a late click (at 14 <= the previous watermark 14) is dropped.
        let out = join
            .process(
                &ctx(2, 14, 30),
                [&[rows(&clicks_schema(), &[(6, Some("c"), 14)])], &[]],
            )
            .unwrap();
        assert!(out.is_empty());
        let m = join.commit(2).unwrap();
        assert_eq!(m.num_rows_dropped_by_watermark, 1);
        assert_eq!((m.num_rows_total, m.num_rows_removed), (0, 7), "{store}");
    }
}

#[test]
fn a_left_outer_join_emits_unmatched_clicks_when_the_watermark_lets_them_go() {
    let dir = tempfile::tempdir().unwrap();
    let mut join = open(dir.path(), JoinType::Left, StoreKind::RocksDb);
    join.load(None).unwrap();
    let out = join
        .process(
            &ctx(0, 0, 0),
            [
                &[rows(
                    &clicks_schema(),
                    &[(1, Some("a"), 10), (2, Some("b"), 10), (3, None, 11)],
                )],
                &[rows(&orders_schema(), &[(100, Some("a"), 12)])],
            ],
        )
        .unwrap();
    assert_eq!(show(&out), ["a 1 100"]);
    join.commit(0).unwrap();
    // Watermark 20: clicks at or below 9:59.999 go; none yet.
    let out = join.process(&ctx(1, 0, 20), [&[], &[]]).unwrap();
    assert!(out.is_empty());
    join.commit(1).unwrap();
    // Watermark 21: click 2 (unmatched) and the null-session click 3... only 2 (at 10) goes.
    let out = join.process(&ctx(2, 20, 21), [&[], &[]]).unwrap();
    assert_eq!(show(&out), ["b 2 -"]);
    join.commit(2).unwrap();

    // A restart reads the buffers back from the store: click 3 is still there, unmatched.
    drop(join);
    let mut again = open(dir.path(), JoinType::Left, StoreKind::RocksDb);
    again.load(Some(2)).unwrap();
    let out = again.process(&ctx(3, 21, 22), [&[], &[]]).unwrap();
    assert_eq!(show(&out), ["- 3 -"]);
    let m = again.commit(3).unwrap();
    assert_eq!(m.num_rows_total, 0);

    // A batch run again starts from the state before it, whatever the failed try did.
    again.load(Some(2)).unwrap();
    let out = again.process(&ctx(3, 21, 22), [&[], &[]]).unwrap();
    assert_eq!(show(&out), ["- 3 -"]);
}

#[test]
fn a_full_outer_join_emits_both_sides_unmatched_and_a_semi_join_each_click_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut join = open(dir.path(), JoinType::Full, StoreKind::Memory);
    join.load(None).unwrap();
    let out = join
        .process(
            &ctx(0, 0, 0),
            [
                &[rows(
                    &clicks_schema(),
                    &[(1, Some("a"), 10), (2, Some("b"), 10)],
                )],
                &[rows(
                    &orders_schema(),
                    &[
                        (100, Some("a"), 12),
                        (200, Some("z"), 12),
                        (300, Some("b"), 30),
                    ],
                )],
            ],
        )
        .unwrap();
    assert_eq!(show(&out), ["a 1 100"]);
    join.commit(0).unwrap();
    let out = join.process(&ctx(1, 0, 40), [&[], &[]]).unwrap();
    assert_eq!(show(&out), ["b - 300", "b 2 -", "z - 200"]);
    assert_eq!(join.commit(1).unwrap().num_rows_total, 0);

    let dir = tempfile::tempdir().unwrap();
    let mut join = open(dir.path(), JoinType::LeftSemi, StoreKind::Memory);
    join.load(None).unwrap();
    let out = join
        .process(
            &ctx(0, 0, 0),
            [
                &[rows(
                    &clicks_schema(),
                    &[(1, Some("a"), 10), (2, Some("b"), 10)],
                )],
                &[rows(
                    &orders_schema(),
                    &[(100, Some("a"), 12), (101, Some("a"), 13)],
                )],
            ],
        )
        .unwrap();
    assert_eq!(show(&out), ["a 1"]);
    join.commit(0).unwrap();
    let out = join
        .process(
            &ctx(1, 0, 0),
            [
                &[rows(&clicks_schema(), &[(3, Some("a"), 11)])],
                &[rows(
                    &orders_schema(),
                    &[(200, Some("b"), 12), (201, Some("b"), 12)],
                )],
            ],
        )
        .unwrap();
    // Click 3 meets the buffered orders of a at once; click 2 is emitted once for two orders.
    assert_eq!(show(&out), ["a 3", "b 2"]);
}

#[test]
fn rows_that_are_never_evicted_do_not_keep_every_batch_s_rows_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mut join = open(dir.path(), JoinType::Inner, StoreKind::Memory);
    join.load(None).unwrap();
    let with_null_time = |batch: u64| {
        let b = rows(
            &clicks_schema(),
            &(0..16)
                .map(|k| {
                    (
                        batch as i64 * 100 + k,
                        Some("s"),
                        batch as i64 * 10 + k % 10,
                    )
                })
                .collect::<Vec<_>>(),
        );
        // The last click has no time: never evicted.
        let mut columns = b.columns().to_vec();
        let times: TimestampMicrosecondArray = b
            .column(2)
            .as_primitive::<TimestampMicrosecondType>()
            .iter()
            .enumerate()
            .map(|(i, t)| if i == 15 { None } else { t })
            .collect::<TimestampMicrosecondArray>()
            .with_timezone("+00:00");
        columns[2] = Arc::new(times);
        RecordBatch::try_new(clicks_schema(), columns).unwrap()
    };
    for batch in 0..40u64 {
        let wm = batch as i64 * 10;
        join.process(
            &ctx(batch, wm.saturating_sub(10), wm),
            [&[with_null_time(batch)], &[]],
        )
        .unwrap();
        let m = join.commit(batch).unwrap();
        // The index holds the live rows, not every batch's: the runs of rows with a time are
        // let go, and the slots of evicted rows are reused.
        let held = &join.sides[LEFT];
        assert!(
            held.runs.len() <= 3,
            "batch {batch}: {} runs held",
            held.runs.len()
        );
        assert!(
            held.slots.len() <= 3 * 16 + batch as usize + 1,
            "batch {batch}: {} slots",
            held.slots.len()
        );
        // The clicks of the last two batches and every click without a time.
        assert!(m.num_rows_total <= 2 * 16 + batch + 1, "{m:?}");
    }
    // What the index holds is what a restart reads back from the store.
    let live = join.sides[LEFT].live;
    drop(join);
    let mut again = open(dir.path(), JoinType::Inner, StoreKind::Memory);
    again.load(Some(39)).unwrap();
    assert_eq!(again.sides[LEFT].live, live);
}

#[test]
fn rows_that_cannot_satisfy_the_condition_are_not_buffered_unless_an_outer_join_keeps_them() {
    let c = RowCondition::parse_join(
        "orders.occurred_at BETWEEN clicks.clicked_at AND clicks.clicked_at + INTERVAL 10 MINUTES AND upper(clicks.url) <> orders.status",
        "clicks",
        "orders",
    )
    .unwrap();
    // The function call may turn a NULL into a value: only the plain comparison counts.
    assert_eq!(
        c.null_rejecting_columns(),
        (
            vec!["clicked_at".to_owned()],
            vec!["occurred_at".to_owned()]
        )
    );
    let no_time = |schema: &SchemaRef, id: i64| {
        RecordBatch::try_new(
            Arc::clone(schema),
            vec![
                Arc::new(Int64Array::from(vec![id])),
                Arc::new(StringArray::from(vec![Some("a")])),
                Arc::new(
                    TimestampMicrosecondArray::from(vec![None::<i64>]).with_timezone("+00:00"),
                ),
            ],
        )
        .unwrap()
    };
    for (kind, buffered) in [
        (JoinType::Inner, 0),
        (JoinType::Left, 1),
        (JoinType::Full, 2),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut join = open(dir.path(), kind, StoreKind::Memory);
        join.load(None).unwrap();
        join.process(
            &ctx(0, 0, 0),
            [
                &[no_time(&clicks_schema(), 1)],
                &[no_time(&orders_schema(), 100)],
            ],
        )
        .unwrap();
        assert_eq!(join.commit(0).unwrap().num_rows_total, buffered, "{kind:?}");
    }
}

/// Runs one batch of `clicks` and `orders` (id, session, minute), returning what it emits as
/// [`show`] gives it.
fn step(
    join: &mut StreamJoin,
    ctx: &StatefulContext,
    clicks: &[(i64, Option<&str>, i64)],
    orders: &[(i64, Option<&str>, i64)],
) -> Vec<String> {
    let batch = |schema: &SchemaRef, r: &[(i64, Option<&str>, i64)]| {
        if r.is_empty() {
            Vec::new()
        } else {
            vec![rows(schema, r)]
        }
    };
    let (clicks, orders) = (
        batch(&clicks_schema(), clicks),
        batch(&orders_schema(), orders),
    );
    show(&join.process(ctx, [&clicks, &orders]).unwrap())
}

/// Writes buffered rows of `side` straight into the join's stores under store keys `key(row)`,
/// and commits them as version `version`.
fn write_raw(
    join: &mut StreamJoin,
    side: usize,
    batch: &RecordBatch,
    key: impl Fn(usize) -> (Vec<u8>, Vec<u8>),
    version: u64,
) {
    let values = join.sides[side]
        .rows
        .convert_columns(batch.columns())
        .unwrap();
    for r in 0..batch.num_rows() {
        let (partition_key, store_key) = key(r);
        let p = join.state.partition_of(&partition_key);
        join.state
            .store_mut(p)
            .put(&store_key, values.row(r).as_ref())
            .unwrap();
    }
    join.state.commit(version, OPERATOR, 0).unwrap();
}

/// The tags (first bytes) of every entry in the join's stores.
fn tags(join: &StreamJoin) -> Vec<u8> {
    let mut tags = Vec::new();
    for store in join.state.stores() {
        store
            .scan(&[], None, &mut |key, _| {
                tags.push(key[0]);
                Ok(true)
            })
            .unwrap();
    }
    tags.sort_unstable();
    tags
}

#[test]
fn a_checkpoint_of_the_earlier_layout_is_read_and_rewritten_to_the_current_one() {
    for store in [StoreKind::Memory, StoreKind::RocksDb, StoreKind::Runs] {
        let dir = tempfile::tempdir().unwrap();
        let mut join = open(dir.path(), JoinType::Left, store);
        join.load(None).unwrap();
        // The earlier layout: `[side][join key][seq]`, and a matched marker `[2 + side]...`.
        let clicks = rows(&clicks_schema(), &[(1, Some("a"), 10), (2, Some("b"), 10)]);
        let encoded = join
            .keys
            .convert_columns(&[Arc::clone(clicks.column(1))])
            .unwrap();
        let old_key = |tag: u8, r: usize| {
            let mut k = vec![tag];
            k.extend_from_slice(encoded.row(r).as_ref());
            k.extend_from_slice(&(r as u64).to_be_bytes());
            k
        };
        let key_of = |r: usize| encoded.row(r).as_ref().to_vec();
        // Click 2 had found its order before the upgrade.
        let p = join.state.partition_of(&key_of(1));
        join.state
            .store_mut(p)
            .put(&old_key(LEGACY_MARK, 1), &[])
            .unwrap();
        write_raw(&mut join, LEFT, &clicks, |r| (key_of(r), old_key(0, r)), 0);
        drop(join);

        let mut join = open(dir.path(), JoinType::Left, store);
        join.load(Some(0)).unwrap();
        // A batch retried before it ran loads again: the rewrite, dropped with the attempt's
        // writes, is made again.
        join.load(Some(0)).unwrap();
        assert_eq!(join.sides[LEFT].live, 2);
        assert_eq!(join.sides[LEFT].next_seq, 2);
        // Click 1 pairs with a new order now, click 2 had before: when the watermark lets them
        // go, neither is emitted unmatched.
        let out = step(&mut join, &ctx(1, 0, 12), &[], &[(100, Some("a"), 12)]);
        assert_eq!(out, ["a 1 100"]);
        join.commit(1).unwrap();
        // Rewritten: rows `[4 + side]`, markers `[6 + side]`, nothing of the earlier layout.
        assert_eq!(tags(&join), [ROW, ROW, ROW + 1, MARK, MARK], "{store}");
        assert!(step(&mut join, &ctx(2, 12, 40), &[], &[]).is_empty());
        let m = join.commit(2).unwrap();
        assert_eq!(m.num_rows_total, 0);
        assert!(tags(&join).is_empty(), "{store}");
    }
}

#[test]
fn rows_whose_key_hashes_collide_are_not_paired() {
    let dir = tempfile::tempdir().unwrap();
    let mut join = open(dir.path(), JoinType::Inner, StoreKind::RocksDb);
    join.load(None).unwrap();
    // Two sessions whose keys' hashes share the low half the index is keyed by (found by
    // search: a 32-bit birthday collision among a few hundred thousand names).
    let names: Vec<String> = (0..400_000).map(|i| format!("s{i}")).collect();
    let encoded = join
        .keys
        .convert_columns(&[Arc::new(StringArray::from_iter_values(&names)) as ArrayRef])
        .unwrap();
    let mut seen: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    let (a, b) = (0..names.len())
        .find_map(|i| {
            let low = fnv::hash(encoded.row(i).as_ref()) as u32;
            seen.insert(low, i).map(|j| (j, i))
        })
        .expect("a collision of 32-bit hashes among 400,000 names");
    let hash_a = fnv::hash(encoded.row(a).as_ref());
    let (a, b) = (names[a].as_str(), names[b].as_str());
    assert_ne!(a, b);
    // Both clicks wait in one chain; the order of session a pairs with a's click only.
    assert!(
        step(
            &mut join,
            &ctx(0, 0, 0),
            &[(1, Some(b), 10), (2, Some(a), 10)],
            &[]
        )
        .is_empty()
    );
    join.commit(0).unwrap();
    let mut chain = Vec::new();
    join.sides[LEFT].chain(hash_a, &mut chain);
    assert_eq!(chain.len(), 2, "the two clicks share one chain");
    let out = step(
        &mut join,
        &ctx(1, 0, 0),
        &[],
        &[(100, Some(a), 12), (200, Some(b), 13)],
    );
    let mut want = [format!("{a} 2 100"), format!("{b} 1 200")];
    want.sort();
    assert_eq!(out, want, "{a} and {b}");
    join.commit(1).unwrap();
    // A restart indexes them the same way.
    drop(join);
    let mut join = open(dir.path(), JoinType::Inner, StoreKind::RocksDb);
    join.load(Some(1)).unwrap();
    let out = step(&mut join, &ctx(2, 0, 0), &[], &[(300, Some(b), 14)]);
    assert_eq!(out, [format!("{b} 1 300")]);
}

#[test]
fn a_restarted_outer_join_remembers_which_rows_matched() {
    let dir = tempfile::tempdir().unwrap();
    let mut join = open(dir.path(), JoinType::Full, StoreKind::RocksDb);
    join.load(None).unwrap();
    let out = step(
        &mut join,
        &ctx(0, 0, 0),
        &[(1, Some("a"), 10), (2, Some("b"), 10)],
        &[(100, Some("a"), 12), (300, Some("c"), 12)],
    );
    assert_eq!(out, ["a 1 100"]);
    join.commit(0).unwrap();
    drop(join);
    // After a restart the markers say click 1 and order 100 matched: only click 2 and order
    // 300 come out with nulls when the watermark lets them go.
    let mut join = open(dir.path(), JoinType::Full, StoreKind::RocksDb);
    join.load(Some(0)).unwrap();
    assert_eq!(
        step(&mut join, &ctx(1, 0, 40), &[], &[]),
        ["b 2 -", "c - 300"]
    );
    let m = join.commit(1).unwrap();
    assert_eq!(m.num_rows_total, 0);
    assert!(tags(&join).is_empty());
}

#[test]
fn a_checkpoint_with_one_sequence_number_twice_is_refused_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let mut join = open(dir.path(), JoinType::Inner, StoreKind::Memory);
    join.load(None).unwrap();
    let clicks = rows(&clicks_schema(), &[(1, Some("a"), 10)]);
    let key = join
        .keys
        .convert_columns(&[Arc::clone(clicks.column(1))])
        .unwrap()
        .row(0)
        .as_ref()
        .to_vec();
    // Row 0 of the clicks under both layouts.
    let mut old = vec![0u8];
    old.extend_from_slice(&key);
    old.extend_from_slice(&0u64.to_be_bytes());
    write_raw(&mut join, LEFT, &clicks, |_| (key.clone(), old.clone()), 0);
    write_raw(
        &mut join,
        LEFT,
        &clicks,
        |_| (key.clone(), store_key(ROW, 0).to_vec()),
        1,
    );
    drop(join);
    let mut join = open(dir.path(), JoinType::Inner, StoreKind::Memory);
    let err = join.load(Some(1)).unwrap_err().to_string();
    assert!(
        err.contains("two buffered rows of clicks have one sequence number"),
        "{err}"
    );
}

#[test]
fn slots_are_renumbered_when_most_rows_are_gone_and_the_chains_still_hold() {
    let dir = tempfile::tempdir().unwrap();
    let mut join = open(dir.path(), JoinType::Inner, StoreKind::Memory);
    join.load(None).unwrap();
    // 3,000 clicks over 300 sessions: most at minute 0, the last 400 at minute 30.
    let sessions: Vec<String> = (0..300).map(|i| format!("s{i}")).collect();
    let clicks: Vec<(i64, Option<&str>, i64)> = (0..3000)
        .map(|i| {
            (
                i,
                Some(sessions[i as usize % 300].as_str()),
                if i >= 2600 { 30 } else { 0 },
            )
        })
        .collect();
    assert!(step(&mut join, &ctx(0, 0, 0), &clicks, &[]).is_empty());
    join.commit(0).unwrap();
    // Watermark 20: the 2,600 clicks at minute 0 go (their bound is 10).
    assert!(step(&mut join, &ctx(1, 0, 20), &[], &[]).is_empty());
    let m = join.commit(1).unwrap();
    assert_eq!(m.num_rows_total, 400);
    let side = &join.sides[LEFT];
    assert_eq!(side.slots.len(), 400, "renumbered densely");
    assert!(side.free.is_empty());
    // Each session's clicks at minute 30 still pair with its order.
    let out = step(&mut join, &ctx(2, 20, 20), &[], &[(100, Some("s7"), 35)]);
    let mut want: Vec<String> = (2600..3000)
        .filter(|i| i % 300 == 7)
        .map(|i| format!("s7 {i} 100"))
        .collect();
    want.sort();
    assert_eq!(out, want);
}

#[test]
fn a_batch_whose_times_span_hours_is_held_in_several_runs_and_evicted_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let mut join = open(dir.path(), JoinType::Left, StoreKind::RocksDb);
    join.load(None).unwrap();
    // Five hours of clicks in one batch (after minute 0, the watermark's: a click at it
    // would be late): an offset holds 71 minutes, so four runs.
    let clicks = [
        (1, Some("a"), 1),
        (2, Some("b"), 51),
        (3, Some("c"), 101),
        (4, Some("d"), 201),
        (5, Some("e"), 301),
    ];
    assert!(step(&mut join, &ctx(0, 0, 0), &clicks, &[]).is_empty());
    join.commit(0).unwrap();
    let runs: Vec<usize> = join.sides[LEFT]
        .runs
        .iter()
        .map(|r| r.offsets.len())
        .collect();
    assert_eq!(runs, [2, 1, 1, 1]);
    // A click goes once the watermark is more than 10 minutes past it, not a minute before.
    let expected: [(i64, &[&str]); 6] = [
        (11, &[]),
        (12, &["a 1 -"]),
        (61, &[]),
        (62, &["b 2 -"]),
        (212, &["c 3 -", "d 4 -"]),
        (312, &["e 5 -"]),
    ];
    for (batch, (wm, emitted)) in (1..).zip(expected) {
        let out = step(&mut join, &ctx(batch, 0, wm), &[], &[]);
        assert_eq!(out, emitted, "watermark at minute {wm}");
        join.commit(batch).unwrap();
    }
    assert!(join.sides[LEFT].runs.is_empty());
}

#[test]
fn a_run_compares_thresholds_far_from_its_times() {
    let run = Run {
        base: 1_000,
        offsets: vec![0, 5, u32::MAX],
        ids: vec![0, 1, 2],
        at: 0,
    };
    assert_eq!(run.due(999), 0);
    assert_eq!(run.due(i64::MIN), 0);
    assert_eq!(run.due(1_000), 1);
    assert_eq!(run.due(1_005), 2);
    assert_eq!(run.due(1_000 + i64::from(u32::MAX) - 1), 2);
    assert_eq!(run.due(i64::MAX), 3);
    let low = Run {
        base: i64::MIN,
        offsets: vec![0, 7],
        ids: vec![0, 1],
        at: 1,
    };
    // The difference overflows: far above every time.
    assert_eq!(low.due(i64::MAX), 1);
    assert_eq!(low.due(i64::MIN + 6), 0);
}
