use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMicrosecondType;
use arrow_array::{
    Array, ArrayRef, Decimal128Array, Float64Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use tempfile::TempDir;

use super::*;
use crate::spec::WindowKind;
use crate::state::StoreKind;

/// One minute in µs and in ms.
const MIN: i64 = 60_000_000;
const MIN_MS: i64 = 60_000;

/// A window length of `ms` milliseconds.
const fn ms(ms: i64) -> std::time::Duration {
    std::time::Duration::from_millis(ms.unsigned_abs())
}

fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("customer_id", DataType::Int64, true),
        Field::new("status", DataType::Utf8, true),
        Field::new("amount", DataType::Decimal128(12, 2), true),
        Field::new("occurred_at", ts_type(), true),
        Field::new("score", DataType::Float64, true),
        Field::new("shipped_at", ts_type(), true),
    ]))
}

#[derive(Debug, Clone, Copy)]
struct Row {
    customer: Option<i64>,
    status: Option<&'static str>,
    cents: Option<i128>,
    at: Option<i64>,
    score: Option<f64>,
}

/// An order of `cents` with `status` at `at` µs.
fn row(status: &'static str, cents: i128, at: i64) -> Row {
    Row {
        customer: Some(1),
        status: Some(status),
        cents: Some(cents),
        at: Some(at),
        score: None,
    }
}

fn batch(rows: &[Row]) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(
            rows.iter().map(|r| r.customer).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.status).collect::<Vec<_>>(),
        )),
        Arc::new(
            Decimal128Array::from(rows.iter().map(|r| r.cents).collect::<Vec<_>>())
                .with_precision_and_scale(12, 2)
                .expect("valid decimal type"),
        ),
        Arc::new(
            TimestampMicrosecondArray::from(rows.iter().map(|r| r.at).collect::<Vec<_>>())
                .with_timezone("+00:00"),
        ),
        Arc::new(Float64Array::from(
            rows.iter().map(|r| r.score).collect::<Vec<_>>(),
        )),
        Arc::new(
            TimestampMicrosecondArray::from(rows.iter().map(|r| r.at).collect::<Vec<_>>())
                .with_timezone("+00:00"),
        ),
    ];
    RecordBatch::try_new(schema(), columns).expect("valid batch")
}

fn aggs(texts: &[&str]) -> Vec<AggExpr> {
    texts
        .iter()
        .map(|t| parse_agg_expr(t).expect("valid aggregate"))
        .collect()
}

/// Tumbling 5-minute windows on `occurred_at` by `status`, revenue and
/// orders, append mode, watermark on `occurred_at`, two partitions.
fn config(dir: &Path) -> AggregateConfig {
    AggregateConfig {
        window: Some(WindowSpec {
            column: "occurred_at".into(),
            kind: WindowKind::Tumbling {
                size: ms(5 * MIN_MS),
            },
        }),
        group_by: vec!["status".into()],
        aggregates: aggs(&["sum(amount) AS revenue", "count(*) AS orders"]),
        output_mode: OutputMode::Append,
        watermark_column: Some("occurred_at".into()),
        num_partitions: 2,
        state_dir: dir.to_path_buf(),
        state: StateOptions {
            kind: StoreKind::Memory,
            ..StateOptions::default()
        },
    }
}

fn open(config: AggregateConfig) -> AggregateOperator {
    let mut op = AggregateOperator::new(config, &schema()).expect("valid config");
    op.load(None).expect("empty state loads");
    op
}

/// One cell for assertions: timestamps in minutes (`5m`) or seconds.
fn cell(array: &dyn Array, row: usize) -> String {
    if array.is_null(row) {
        return "null".into();
    }
    if let Some(ts) = array.as_primitive_opt::<TimestampMicrosecondType>() {
        let v = ts.value(row);
        return if v % MIN == 0 {
            format!("{}m", v / MIN)
        } else {
            format!("{}s", v as f64 / 1e6)
        };
    }
    let options = FormatOptions::default();
    let f = ArrayFormatter::try_new(array, &options).expect("formattable");
    f.value(row).to_string()
}

/// Every output row as `col col …`, sorted.
fn render(batches: &[RecordBatch]) -> Vec<String> {
    let mut rows = render_in_order(batches);
    rows.sort();
    rows
}

/// Runs and commits batch `id` with late filter `late_ms` and watermark `wm_ms`.
fn step(
    op: &mut AggregateOperator,
    id: u64,
    late_ms: i64,
    wm_ms: i64,
    rows: &[Row],
) -> (Vec<String>, OperatorMetrics) {
    let ctx = StatefulContext {
        batch_id: id,
        late_ms,
        watermark_ms: wm_ms,
    };
    let input = if rows.is_empty() {
        Vec::new()
    } else {
        vec![batch(rows)]
    };
    let out = op.process(&ctx, &input).expect("batch processes");
    for b in &out {
        assert_eq!(b.schema(), *op.output_schema());
    }
    let metrics = op.commit(id).expect("commit");
    (render(&out), metrics)
}

fn strings(rows: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = rows.iter().map(|s| (*s).to_owned()).collect();
    v.sort();
    v
}

#[test]
fn output_schema_is_window_keys_then_aggregates() {
    let dir = TempDir::new().expect("tempdir");
    let op = open(config(dir.path()));
    let schema = op.output_schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(
        names,
        ["window_start", "window_end", "status", "revenue", "orders"]
    );
    assert_eq!(schema.field(0).data_type(), &ts_type());
    assert_eq!(schema.field(3).data_type(), &DataType::Decimal128(22, 2));
    assert_eq!(schema.field(4).data_type(), &DataType::Int64);
    assert_eq!(op.name(), "stateStoreSave");
}

#[test]
fn tumbling_append_emits_once_when_the_watermark_passes_and_evicts() {
    let dir = TempDir::new().expect("tempdir");
    let mut op = open(config(dir.path()));

    // Batch 0: two windows open, nothing emitted.
    let (out, m) = step(
        &mut op,
        0,
        0,
        0,
        &[
            row("completed", 1000, MIN),
            row("completed", 250, 2 * MIN),
            row("pending", 99, 6 * MIN),
        ],
    );
    assert!(out.is_empty());
    assert_eq!((m.num_rows_total, m.num_rows_updated), (2, 2));

    // Batch 1: the watermark (4 min) has not reached the first end (5 min).
    let (out, m) = step(&mut op, 1, 0, 4 * MIN_MS, &[row("completed", 1, 3 * MIN)]);
    assert!(out.is_empty());
    assert_eq!((m.num_rows_total, m.num_rows_updated), (2, 1));

    // Batch 2 (no data): wm = 5 min emits [0, 5) and evicts it.
    let (out, m) = step(&mut op, 2, 4 * MIN_MS, 5 * MIN_MS, &[]);
    assert_eq!(out, strings(&["0m 5m completed 12.51 3"]));
    assert_eq!((m.num_rows_total, m.num_rows_removed), (1, 1));

    // Batch 3: rows for the emitted window are late (end 5 min <= 5 min): one
    // partial aggregate dropped, not two rows; nothing emitted again.
    let (out, m) = step(
        &mut op,
        3,
        5 * MIN_MS,
        5 * MIN_MS,
        &[row("completed", 7, 4 * MIN), row("completed", 8, 2 * MIN)],
    );
    assert!(out.is_empty());
    assert_eq!(m.num_rows_dropped_by_watermark, 1);
    assert_eq!(m.num_rows_total, 1);

    // Batch 4: wm = 10 min emits [5, 10).
    let (out, m) = step(&mut op, 4, 5 * MIN_MS, 10 * MIN_MS, &[]);
    assert_eq!(out, strings(&["5m 10m pending 0.99 1"]));
    assert_eq!(m.num_rows_total, 0);
}

#[test]
fn late_filter_is_per_window_not_per_row() {
    // RESULTS.md §5.4: with the late filter at 00:10:00.000, rows at 00:08:00
    // and 00:09:59.999 (window end 00:10) are dropped as ONE partial
    // aggregate; 00:10:00.000 and 00:10:00.001 are kept although the first
    // is not newer than the watermark.
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path());
    c.output_mode = OutputMode::Update;
    let mut op = open(c);
    let (out, m) = step(
        &mut op,
        0,
        10 * MIN_MS,
        10 * MIN_MS,
        &[
            row("completed", 100, 8 * MIN),
            row("completed", 100, 10 * MIN - 1_000),
            row("completed", 100, 10 * MIN),
            row("completed", 100, 10 * MIN + 1_000),
        ],
    );
    assert_eq!(out, strings(&["10m 15m completed 2.00 2"]));
    assert_eq!(m.num_rows_dropped_by_watermark, 1);
    assert_eq!(op.input_rows_dropped(), 0, "reset by commit");
}

#[test]
fn a_row_older_than_the_watermark_is_kept_while_its_window_is_open() {
    let dir = TempDir::new().expect("tempdir");
    let mut op = open(config(dir.path()));
    // Late filter at 7 min: a row at 6 min is older, but [5, 10) is open.
    let (out, m) = step(
        &mut op,
        0,
        7 * MIN_MS,
        7 * MIN_MS,
        &[row("pending", 500, 6 * MIN)],
    );
    assert!(out.is_empty());
    assert_eq!((m.num_rows_dropped_by_watermark, m.num_rows_total), (0, 1));
    let (out, _) = step(&mut op, 1, 7 * MIN_MS, 10 * MIN_MS, &[]);
    assert_eq!(out, strings(&["5m 10m pending 5.00 1"]));
}

#[test]
fn windows_emitted_in_the_batch_that_created_them() {
    // RESULTS.md §5.3: in batch 1 rows whose window ends before wm(1) are
    // not late yet (the filter uses wm(0) = 0) and are emitted at once.
    let dir = TempDir::new().expect("tempdir");
    let mut op = open(config(dir.path()));
    let (out, m) = step(
        &mut op,
        1,
        0,
        50 * MIN_MS,
        &[
            row("completed", 100, 20 * MIN),
            row("completed", 100, 60 * MIN),
        ],
    );
    assert_eq!(out, strings(&["20m 25m completed 1.00 1"]));
    assert_eq!(
        (m.num_rows_updated, m.num_rows_removed, m.num_rows_total),
        (2, 1, 1)
    );
}

#[test]
fn update_mode_emits_changed_groups_then_evicts_silently() {
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path());
    c.output_mode = OutputMode::Update;
    let mut op = open(c);
    let (out, _) = step(
        &mut op,
        0,
        0,
        0,
        &[
            row("completed", 100, MIN),
            row("pending", 200, MIN),
            row("completed", 300, 7 * MIN),
        ],
    );
    assert_eq!(
        out,
        strings(&[
            "0m 5m completed 1.00 1",
            "0m 5m pending 2.00 1",
            "5m 10m completed 3.00 1",
        ])
    );
    // Only the touched group, with its new total; then wm = 5 min evicts
    // both [0, 5) groups without emitting them.
    let (out, m) = step(&mut op, 1, 0, 5 * MIN_MS, &[row("completed", 50, 2 * MIN)]);
    assert_eq!(out, strings(&["0m 5m completed 1.50 2"]));
    assert_eq!((m.num_rows_updated, m.num_rows_removed), (1, 2));
    assert_eq!(m.num_rows_total, 1);
    // The evicted window's rows are now late.
    let (out, m) = step(
        &mut op,
        2,
        5 * MIN_MS,
        5 * MIN_MS,
        &[row("completed", 50, 3 * MIN), row("completed", 1, 8 * MIN)],
    );
    assert_eq!(out, strings(&["5m 10m completed 3.01 2"]));
    assert_eq!(m.num_rows_dropped_by_watermark, 1);
}

#[test]
fn update_mode_without_watermark_never_evicts() {
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path());
    c.output_mode = OutputMode::Update;
    c.watermark_column = None;
    let mut op = open(c);
    step(&mut op, 0, 0, 0, &[row("completed", 100, MIN)]);
    let (out, m) = step(
        &mut op,
        1,
        100 * MIN_MS,
        100 * MIN_MS,
        &[row("completed", 100, 2 * MIN)],
    );
    assert_eq!(out, strings(&["0m 5m completed 2.00 2"]));
    assert_eq!((m.num_rows_total, m.num_rows_removed), (1, 0));
}

#[test]
fn complete_mode_emits_all_state_every_batch_and_never_evicts() {
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path());
    c.output_mode = OutputMode::Complete;
    let mut op = open(c);
    step(&mut op, 0, 0, 0, &[row("completed", 100, MIN)]);
    let (out, m) = step(
        &mut op,
        1,
        30 * MIN_MS,
        30 * MIN_MS,
        &[row("pending", 100, 6 * MIN), row("completed", 1, 2 * MIN)],
    );
    // Complete mode filters no late data and keeps everything (Spark).
    assert_eq!(
        out,
        strings(&["0m 5m completed 1.01 2", "5m 10m pending 1.00 1"])
    );
    assert_eq!((m.num_rows_total, m.num_rows_dropped_by_watermark), (2, 0));
    let (out, _) = step(&mut op, 2, 30 * MIN_MS, 30 * MIN_MS, &[]);
    assert_eq!(out.len(), 2);
}

#[test]
fn sliding_windows_put_each_row_in_every_window_that_contains_it() {
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path());
    c.output_mode = OutputMode::Complete;
    c.window = Some(WindowSpec {
        column: "occurred_at".into(),
        kind: WindowKind::Sliding {
            size: ms(10 * MIN_MS),
            slide: ms(5 * MIN_MS),
        },
    });
    let mut op = open(c);
    let (out, _) = step(&mut op, 0, 0, 0, &[row("completed", 100, 7 * MIN)]);
    assert_eq!(
        out,
        strings(&["0m 10m completed 1.00 1", "5m 15m completed 1.00 1"])
    );

    // A slide that does not divide the size: starts are multiples of 3 min.
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path());
    c.output_mode = OutputMode::Complete;
    c.window = Some(WindowSpec {
        column: "occurred_at".into(),
        kind: WindowKind::Sliding {
            size: ms(10 * MIN_MS),
            slide: ms(3 * MIN_MS),
        },
    });
    let mut op = open(c);
    let (out, _) = step(&mut op, 0, 0, 0, &[row("completed", 100, 7 * MIN)]);
    assert_eq!(
        out,
        strings(&[
            "0m 10m completed 1.00 1",
            "3m 13m completed 1.00 1",
            "6m 16m completed 1.00 1",
        ])
    );
}

#[test]
fn tumbling_windows_floor_before_the_epoch() {
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path());
    c.output_mode = OutputMode::Complete;
    let mut op = open(c);
    let (out, _) = step(&mut op, 0, 0, 0, &[row("completed", 100, -MIN)]);
    assert_eq!(out, strings(&["-5m 0m completed 1.00 1"]));
}

fn session_config(dir: &Path, mode: OutputMode) -> AggregateConfig {
    let mut c = config(dir);
    c.window = Some(WindowSpec {
        column: "occurred_at".into(),
        kind: WindowKind::Session {
            gap: ms(5 * MIN_MS),
        },
    });
    c.output_mode = mode;
    c
}

#[test]
fn sessions_merge_within_a_batch_and_with_state() {
    let dir = TempDir::new().expect("tempdir");
    let mut op = open(session_config(dir.path(), OutputMode::Complete));
    assert_eq!(op.name(), "sessionWindowStateStoreSaveExec");
    let (out, m) = step(
        &mut op,
        0,
        0,
        0,
        &[
            row("completed", 100, 0),
            row("completed", 100, 3 * MIN),
            row("completed", 100, 20 * MIN),
            row("pending", 100, 2 * MIN),
        ],
    );
    assert_eq!(
        out,
        strings(&[
            "0m 8m completed 2.00 2",
            "20m 25m completed 1.00 1",
            "2m 7m pending 1.00 1",
        ])
    );
    assert_eq!(m.num_rows_total, 3);

    // A row at 8 min touches [0, 8) (start <= end merges); one at 10 min
    // then overlaps the extended session; one at 15 min touches it and
    // opens [15, 20), which touches [20, 25): a single session.
    let (out, m) = step(
        &mut op,
        1,
        0,
        0,
        &[
            row("completed", 1, 8 * MIN),
            row("completed", 1, 10 * MIN),
            row("completed", 1, 15 * MIN),
        ],
    );
    assert_eq!(
        out,
        strings(&["0m 25m completed 3.03 6", "2m 7m pending 1.00 1"])
    );
    assert_eq!(m.num_rows_total, 2);

    // Restart from the committed state and add a separate session.
    drop(op);
    let mut op =
        AggregateOperator::new(session_config(dir.path(), OutputMode::Complete), &schema())
            .expect("valid config");
    op.load(Some(1)).expect("loads");
    let (out, _) = step(&mut op, 2, 0, 0, &[row("completed", 7, 40 * MIN)]);
    assert_eq!(
        out,
        strings(&[
            "0m 25m completed 3.03 6",
            "40m 45m completed 0.07 1",
            "2m 7m pending 1.00 1",
        ])
    );
}

#[test]
fn sessions_in_append_mode_are_emitted_when_they_end_before_the_watermark() {
    let dir = TempDir::new().expect("tempdir");
    let mut op = open(session_config(dir.path(), OutputMode::Append));
    step(
        &mut op,
        0,
        0,
        0,
        &[row("completed", 100, 0), row("completed", 100, 3 * MIN)],
    );
    let (out, m) = step(&mut op, 1, 0, 8 * MIN_MS, &[]);
    assert_eq!(out, strings(&["0m 8m completed 2.00 2"]));
    assert_eq!((m.num_rows_total, m.num_rows_removed), (0, 1));
    // A row whose session [ts, ts + gap) ends at or before the late
    // watermark is dropped (one partial per keys and timestamp).
    let (out, m) = step(
        &mut op,
        2,
        8 * MIN_MS,
        8 * MIN_MS,
        &[
            row("completed", 1, 3 * MIN),
            row("completed", 1, 3 * MIN),
            row("completed", 1, 4 * MIN),
        ],
    );
    assert!(out.is_empty());
    assert_eq!(m.num_rows_dropped_by_watermark, 1);
    assert_eq!(m.num_rows_total, 1, "the 4-minute row opens [4, 9)");
    // Nothing left in the store but the new session and its index entry.
    let mut entries = 0;
    for s in op.state.stores() {
        s.scan(&[GROUP], Some(&[META[0]]), &mut |_, _| {
            entries += 1;
            Ok(true)
        })
        .expect("scan");
    }
    assert_eq!(entries, 2);
}

#[test]
fn decimal_sum_is_exact_with_sparks_precision_and_scale() {
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path());
    c.output_mode = OutputMode::Complete;
    c.aggregates = aggs(&["sum(amount)", "count(amount)", "min(amount)", "max(amount)"]);
    let mut op = open(c);
    let names: Vec<String> = op
        .output_schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(
        names[3..],
        ["sum(amount)", "count(amount)", "min(amount)", "max(amount)"]
    );
    assert_eq!(
        op.output_schema().field(5).data_type(),
        &DataType::Decimal128(12, 2)
    );
    let max = 999_999_999_999; // 9,999,999,999.99: the largest DECIMAL(12,2)
    let (out, _) = step(
        &mut op,
        0,
        0,
        0,
        &[
            row("a", 10, MIN),
            row("a", 20, MIN),
            row("b", max, MIN),
            row("b", max, MIN),
        ],
    );
    step(
        &mut op,
        1,
        0,
        0,
        &[row("b", max, 2 * MIN), row("a", -5, 2 * MIN)],
    );
    assert_eq!(
        out,
        strings(&[
            "0m 5m a 0.30 2 0.10 0.20",
            "0m 5m b 19999999999.98 2 9999999999.99 9999999999.99",
        ])
    );
    let (out, _) = step(&mut op, 2, 0, 0, &[]);
    assert_eq!(
        out,
        strings(&[
            "0m 5m a 0.25 3 -0.05 0.20",
            "0m 5m b 29999999999.97 3 9999999999.99 9999999999.99",
        ])
    );
}

#[test]
fn decimal_avg_rounds_half_up_to_scale_plus_four() {
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path());
    c.output_mode = OutputMode::Complete;
    c.aggregates = aggs(&["avg(amount) AS a"]);
    let mut op = open(c);
    assert_eq!(
        op.output_schema().field(3).data_type(),
        &DataType::Decimal128(16, 6)
    );
    let mut rows = vec![
        row("third", 1, MIN),
        row("third", 0, MIN),
        row("third", 0, MIN),
        row("two_thirds", 1, MIN),
        row("two_thirds", 1, MIN),
        row("two_thirds", 0, MIN),
        row("negative", -1, MIN),
        row("negative", -1, MIN),
        row("negative", 0, MIN),
    ];
    // 0.01 / 32 = 0.0003125 → 0.000313 (HALF_UP, not HALF_EVEN's 0.000312).
    rows.push(row("half", 1, MIN));
    rows.extend(std::iter::repeat_n(row("half", 0, MIN), 31));
    let mut nulls = row("nulls", 0, MIN);
    nulls.cents = None;
    rows.push(nulls);
    let (out, _) = step(&mut op, 0, 0, 0, &rows);
    assert_eq!(
        out,
        strings(&[
            "0m 5m half 0.000313",
            "0m 5m negative -0.006667",
            "0m 5m nulls null",
            "0m 5m third 0.003333",
            "0m 5m two_thirds 0.006667",
        ])
    );
}

#[test]
fn nulls_are_ignored_except_by_count_star() {
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path());
    c.output_mode = OutputMode::Update;
    c.aggregates = aggs(&[
        "count(*)",
        "count(amount)",
        "sum(amount)",
        "min(amount)",
        "avg(score)",
        "max(status)",
    ]);
    let mut op = open(c);
    let mut a = row("x", 0, MIN);
    a.cents = None;
    let mut b = a;
    b.status = None;
    let mut no_time = row("x", 100, 0);
    no_time.at = None;
    let (out, _) = step(&mut op, 0, 0, 0, &[a, b, no_time]);
    // The row without event time is in no window; a null status is a group.
    assert_eq!(
        out,
        strings(&[
            "0m 5m null 1 0 null null null null",
            "0m 5m x 1 0 null null null x",
        ])
    );
}

#[test]
fn count_distinct_is_exact_across_batches_and_evicted_with_its_group() {
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path());
    c.output_mode = OutputMode::Update;
    c.aggregates = aggs(&["count(DISTINCT customer_id) AS customers", "count(*)"]);
    let mut op = open(c);
    let with = |customer, at| Row {
        customer,
        ..row("completed", 1, at)
    };
    let (out, _) = step(
        &mut op,
        0,
        0,
        0,
        &[
            with(Some(1), MIN),
            with(Some(2), MIN),
            with(Some(2), MIN),
            with(None, MIN),
        ],
    );
    assert_eq!(out, strings(&["0m 5m completed 2 4"]));
    let (out, m) = step(
        &mut op,
        1,
        0,
        0,
        &[with(Some(2), 2 * MIN), with(Some(3), 2 * MIN)],
    );
    assert_eq!(out, strings(&["0m 5m completed 3 6"]));
    assert_eq!(m.num_rows_total, 1, "distinct values are not groups");
    // Eviction removes the group and its distinct values.
    let (_, m) = step(&mut op, 2, 0, 5 * MIN_MS, &[]);
    assert_eq!((m.num_rows_total, m.num_rows_removed), (0, 1));
    for s in op.state.stores() {
        s.scan(&[GROUP], Some(&[META[0]]), &mut |k, _| {
            panic!("left in state: {k:?}")
        })
        .expect("scan");
    }
}

#[test]
fn approx_count_distinct_counts_small_sets_exactly() {
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path());
    c.output_mode = OutputMode::Update;
    c.aggregates = aggs(&[
        "approx_count_distinct(customer_id) AS c",
        "approx_count_distinct(status)",
    ]);
    let mut op = open(c);
    let rows: Vec<Row> = (0..40)
        .map(|i| Row {
            customer: Some(i % 5),
            ..row("completed", 1, MIN)
        })
        .collect();
    let (out, _) = step(&mut op, 0, 0, 0, &rows);
    assert_eq!(out, strings(&["0m 5m completed 5 1"]));
    let more: Vec<Row> = (3..8)
        .map(|i| Row {
            customer: Some(i),
            ..row("completed", 1, MIN)
        })
        .collect();
    let (out, _) = step(&mut op, 1, 0, 0, &more);
    assert_eq!(out, strings(&["0m 5m completed 8 1"]));
}

#[test]
fn min_max_keep_their_types() {
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path());
    c.output_mode = OutputMode::Complete;
    c.window = None;
    c.watermark_column = None;
    c.aggregates = aggs(&[
        "min(occurred_at) AS first",
        "max(occurred_at) AS last",
        "min(status)",
        "max(score)",
        "sum(score)",
        "avg(customer_id)",
        "sum(customer_id)",
    ]);
    let mut op = open(c);
    let with = |status, at, score, customer| Row {
        customer: Some(customer),
        score,
        ..row(status, 1, at)
    };
    step(
        &mut op,
        0,
        0,
        0,
        &[
            with("b", 3 * MIN, Some(1.5), 1),
            with("b", MIN, Some(f64::NAN), 2),
        ],
    );
    let (out, _) = step(&mut op, 1, 0, 0, &[with("b", 7 * MIN, Some(-2.0), 4)]);
    let schema = op.output_schema().clone();
    assert_eq!(schema.field(1).data_type(), &ts_type());
    assert_eq!(schema.field(3).data_type(), &DataType::Utf8);
    assert_eq!(schema.field(6).data_type(), &DataType::Float64);
    assert_eq!(schema.field(7).data_type(), &DataType::Int64);
    // NaN is the largest double (Spark's ordering) and poisons the sum.
    assert_eq!(out, strings(&["b 1m 7m b NaN NaN 2.3333333333333335 7"]));
}

#[test]
fn event_time_group_key_drives_late_filter_and_eviction() {
    // No window: the watermark column is a group key, compared as is.
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path());
    c.window = None;
    c.group_by = vec!["status".into(), "occurred_at".into()];
    c.aggregates = aggs(&["count(*) AS n"]);
    let mut op = open(c);
    let names: Vec<String> = op
        .output_schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["status", "occurred_at", "n"]);
    let mut no_time = row("a", 1, 0);
    no_time.at = None;
    let (out, _) = step(
        &mut op,
        0,
        0,
        2 * MIN_MS,
        &[
            row("a", 1, MIN),
            row("a", 1, MIN),
            row("a", 1, 3 * MIN),
            no_time,
        ],
    );
    assert_eq!(out, strings(&["a 1m 2"]));
    // Late: event time <= 3 min (row level, as the key is the event time).
    let (out, m) = step(
        &mut op,
        1,
        3 * MIN_MS,
        10 * MIN_MS,
        &[row("a", 1, 3 * MIN), row("a", 1, 3 * MIN + 1)],
    );
    assert_eq!(out, strings(&["a 3m 1", "a 180.000001s 1"]));
    assert_eq!(m.num_rows_dropped_by_watermark, 1);
    // A null event time is never late nor evicted.
    assert_eq!(m.num_rows_total, 1);
}

#[test]
fn global_aggregation_emits_one_row_per_batch_in_update_mode() {
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path());
    c.window = None;
    c.group_by = Vec::new();
    c.output_mode = OutputMode::Update;
    c.watermark_column = None;
    c.aggregates = aggs(&["count(*)", "sum(amount)"]);
    let mut op = open(c);
    let (out, _) = step(&mut op, 0, 0, 0, &[row("a", 100, 0), row("b", 1, MIN)]);
    assert_eq!(out, strings(&["2 1.01"]));
    let (out, m) = step(&mut op, 1, 0, 0, &[]);
    assert_eq!(out, strings(&["2 1.01"]));
    assert_eq!(m.num_rows_total, 1);
}

fn revenue_batches() -> Vec<Vec<Row>> {
    vec![
        vec![
            row("completed", 100, MIN),
            row("pending", 200, 2 * MIN),
            row("completed", 300, 6 * MIN),
        ],
        vec![row("completed", 400, 7 * MIN), row("returned", 50, 9 * MIN)],
        vec![
            row("completed", 1, 3 * MIN),
            row("completed", 2, 11 * MIN),
            row("pending", 3, 12 * MIN),
        ],
    ]
}

#[test]
fn a_replayed_batch_gives_identical_output_after_restart() {
    for kind in [StoreKind::Memory, StoreKind::RocksDb, StoreKind::Runs] {
        let dir = TempDir::new().expect("tempdir");
        let mut c = config(dir.path());
        c.state.kind = kind;
        c.aggregates = aggs(&[
            "sum(amount) AS revenue",
            "count(*) AS orders",
            "count(DISTINCT customer_id) AS customers",
            "avg(amount)",
        ]);
        let batches = revenue_batches();
        let watermarks = [(0, 0), (0, 5 * MIN_MS), (5 * MIN_MS, 10 * MIN_MS)];

        let mut op = open(c.clone());
        step(&mut op, 0, watermarks[0].0, watermarks[0].1, &batches[0]);
        step(&mut op, 1, watermarks[1].0, watermarks[1].1, &batches[1]);
        let ctx = StatefulContext {
            batch_id: 2,
            late_ms: watermarks[2].0,
            watermark_ms: watermarks[2].1,
        };
        let first = render(
            &op.process(&ctx, &[batch(&batches[2])])
                .expect("batch 2 runs"),
        );
        assert_eq!(
            first,
            strings(&[
                "5m 10m completed 7.00 2 1 3.500000",
                "5m 10m returned 0.50 1 1 0.500000"
            ])
        );

        // Same operator: the uncommitted batch is discarded by load.
        op.load(Some(1)).expect("reload");
        let again = render(&op.process(&ctx, &[batch(&batches[2])]).expect("replay"));
        assert_eq!(again, first, "{kind}");

        // A new process: open the stores again and replay.
        drop(op);
        let mut op = AggregateOperator::new(c.clone(), &schema()).expect("reopen");
        op.load(Some(1)).expect("load version 1");
        let replayed = render(&op.process(&ctx, &[batch(&batches[2])]).expect("replay"));
        assert_eq!(replayed, first, "{kind}");
        let m = op.commit(2).expect("commit");
        assert_eq!(m.num_rows_dropped_by_watermark, 1);
        assert_eq!(m.num_rows_total, 2, "[10, 15) completed and pending");
    }
}

#[test]
fn invalid_configurations_are_refused_with_the_reason() {
    let dir = TempDir::new().expect("tempdir");
    let refused = |c: AggregateConfig| match AggregateOperator::new(c, &schema()) {
        Err(OperatorError::Invalid { message, .. }) => message,
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("accepted"),
    };

    let mut c = config(dir.path());
    c.watermark_column = None;
    let m = refused(c);
    assert!(
        m.contains("append") && m.contains("needs a watermark"),
        "{m}"
    );

    let mut c = config(dir.path());
    c.window = None;
    let m = refused(c);
    assert!(m.contains("window column or a group_by key"), "{m}");

    let m = refused(session_config(dir.path(), OutputMode::Update));
    assert!(m.contains("session windows do not support"), "{m}");

    let mut c = session_config(dir.path(), OutputMode::Append);
    c.group_by.clear();
    let m = refused(c);
    assert!(m.contains("at least one group_by key"), "{m}");

    let mut c = config(dir.path());
    c.group_by = vec!["nope".into()];
    let m = refused(c);
    assert!(
        m.contains("group_by column \"nope\" is not in the input"),
        "{m}"
    );

    let mut c = config(dir.path());
    c.aggregates = aggs(&["sum(status)"]);
    let m = refused(c);
    assert!(m.contains("sum does not accept column \"status\""), "{m}");

    let mut c = config(dir.path());
    c.window = Some(WindowSpec {
        column: "status".into(),
        kind: WindowKind::Tumbling { size: ms(1000) },
    });
    let m = refused(c);
    assert!(m.contains("windows need an event time"), "{m}");

    let mut c = config(dir.path());
    c.window = Some(WindowSpec {
        column: "shipped_at".into(),
        kind: WindowKind::Tumbling { size: ms(1000) },
    });
    c.group_by = vec!["status".into(), "occurred_at".into()];
    let m = refused(c);
    assert!(
        m.contains("is a group_by key while the window is on"),
        "{m}"
    );

    let mut c = session_config(dir.path(), OutputMode::Append);
    c.aggregates = aggs(&["count(DISTINCT customer_id)"]);
    let m = refused(c);
    assert!(m.contains("not supported with session windows"), "{m}");

    let mut c = config(dir.path());
    c.window = Some(WindowSpec {
        column: "occurred_at".into(),
        kind: WindowKind::Sliding {
            size: ms(1000),
            slide: ms(2000),
        },
    });
    let m = refused(c);
    assert!(m.contains("must not exceed size"), "{m}");
}

#[test]
fn integer_sum_overflow_fails_naming_the_group() {
    let dir = TempDir::new().expect("tempdir");
    let mut c = config(dir.path());
    c.output_mode = OutputMode::Update;
    c.aggregates = aggs(&["sum(customer_id)"]);
    let mut op = open(c);
    let big = |at| Row {
        customer: Some(i64::MAX),
        ..row("completed", 1, at)
    };
    let ctx = StatefulContext {
        batch_id: 0,
        late_ms: 0,
        watermark_ms: 0,
    };
    let err = op
        .process(&ctx, &[batch(&[big(MIN), big(MIN)])])
        .expect_err("overflows");
    let message = err.to_string();
    assert!(message.contains("overflowed Int64"), "{message}");
    assert!(message.contains("status=completed"), "{message}");
}

#[test]
fn input_of_another_schema_is_refused() {
    let dir = TempDir::new().expect("tempdir");
    let mut op = open(config(dir.path()));
    let other = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, true)])),
        vec![Arc::new(Int64Array::from(vec![1]))],
    )
    .expect("batch");
    let ctx = StatefulContext {
        batch_id: 0,
        late_ms: 0,
        watermark_ms: 0,
    };
    let err = op.process(&ctx, &[other]).expect_err("refused");
    assert!(err.to_string().contains("expected"), "{err}");
}

/// Every output row as `col col …`, in the order emitted.
fn render_in_order(batches: &[RecordBatch]) -> Vec<String> {
    let mut rows = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            let cells: Vec<String> = b.columns().iter().map(|c| cell(c.as_ref(), r)).collect();
            rows.push(cells.join(" "));
        }
    }
    rows
}

/// Four partitions on three threads merge, evict, emit (in the same order), count and restore
/// exactly what one thread does, in append and update mode, with a distinct count among the
/// aggregates and a restart from a committed version in the middle.
#[test]
fn partitions_on_threads_aggregate_what_one_thread_aggregates() {
    let statuses = ["placed", "paid", "shipped", "returned"];
    let mut seed = 0x0bad_5eed_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let batches: Vec<Vec<Row>> = (0..10i64)
        .map(|b| {
            (0..400)
                .map(|_| Row {
                    customer: Some((next() % 60) as i64),
                    status: Some(statuses[(next() % 4) as usize]),
                    cents: Some((next() % 10_000) as i128),
                    // Around the batch's minutes, some far behind them.
                    at: Some((b * 4 + 10) * MIN - (next() % (20 * MIN as u64)) as i64),
                    score: None,
                })
                .collect()
        })
        .collect();
    for mode in [OutputMode::Append, OutputMode::Update] {
        let run = |threads: usize| {
            let dir = TempDir::new().expect("tempdir");
            let mut cfg = config(dir.path());
            cfg.group_by = vec!["customer_id".into()];
            cfg.aggregates = aggs(&[
                "sum(amount) AS revenue",
                "count(*) AS orders",
                "count(DISTINCT status) AS statuses",
            ]);
            cfg.output_mode = mode;
            cfg.num_partitions = 4;
            cfg.state.kind = StoreKind::RocksDb;
            cfg.state.threads =
                crate::threads::Threads::new(std::num::NonZeroUsize::new(threads).unwrap());
            let mut op = open(cfg.clone());
            let mut seen = Vec::new();
            for (id, rows) in batches.iter().enumerate() {
                let id = id as u64;
                if id == 6 {
                    drop(op);
                    op = AggregateOperator::new(cfg.clone(), &schema()).expect("valid config");
                    op.load(Some(5)).expect("batch 5's state loads");
                }
                let wm = (id as i64 * 4 + 2) * MIN_MS;
                let ctx = StatefulContext {
                    batch_id: id,
                    late_ms: wm - 4 * MIN_MS,
                    watermark_ms: wm,
                };
                let out = op.process(&ctx, &[batch(rows)]).expect("batch processes");
                let m = op.commit(id).expect("commit");
                // Everything but the commit's duration.
                let figures = (
                    m.num_rows_total,
                    m.num_rows_updated,
                    m.num_rows_removed,
                    m.num_rows_dropped_by_watermark,
                    m.memory_used_bytes,
                );
                seen.push((render_in_order(&out), figures));
            }
            seen
        };
        let one = run(1);
        assert_eq!(run(3), one, "{mode:?}");
        let emitted: usize = one.iter().map(|(rows, _)| rows.len()).sum();
        assert!(emitted > 100, "{mode:?}: {emitted} rows emitted");
        assert!(
            one.iter().any(|(_, m)| m.2 > 0),
            "{mode:?}: nothing evicted"
        );
        assert!(one.iter().any(|(_, m)| m.3 > 0), "{mode:?}: nothing late");
    }
}
