//! Golden cases recorded from Spark 4.0.5 (pyspark, `local[1]`, one shuffle
//! partition, file source with `maxFilesPerTrigger = 1`, a 10-minute
//! watermark, `trigger(availableNow = True)`, `foreachBatch` sink): the rows
//! each batch emitted and the `stateOperators[0]` figures of its progress.
//! The operator gets the same input batch by batch, with the late filter at
//! the previous batch's watermark and eviction at the batch's own, and must
//! produce the same rows in the same batches and the same metrics.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, TimestampMicrosecondType};
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use tempfile::TempDir;

use super::*;
use crate::spec::WindowKind;
use crate::state::StoreKind;

const MIN: i64 = 60_000_000;
const MIN_MS: i64 = 60_000;

/// A window length of `ms` milliseconds.
const fn ms(ms: i64) -> std::time::Duration {
    std::time::Duration::from_millis(ms.unsigned_abs())
}
/// 2024-03-01T00:00:00Z in µs: minute 0 of every case.
const BASE: i64 = 1_709_251_200_000_000;

/// The input, one file (micro-batch) per line: (key, minute, amount).
const INPUT: [&[(&str, f64, i64)]; 5] = [
    &[
        ("a", 0.0, 100),
        ("a", 3.0, 100),
        ("b", 1.0, 100),
        ("a", 20.0, 100),
    ],
    &[("a", 8.0, 1), ("a", 10.0, 1), ("b", 30.0, 1)],
    &[
        ("a", 15.0, 7),
        ("a", 2.0, 7),
        ("b", 4.0, 7),
        ("a", 40.0, 7),
        ("b", 4.5, 7),
    ],
    &[("b", 45.0, 3), ("a", 33.0, 3), ("a", 36.0, 3)],
    &[("a", 70.0, 5), ("b", 44.0, 5)],
];

/// (batch, watermark minute (None: 1970), numRowsTotal, numRowsUpdated,
/// numRowsRemoved, numRowsDroppedByWatermark).
type Progress = (u64, Option<i64>, u64, u64, u64, u64);
/// (batch, window start minute, window end minute, k, count(*), sum(amount)).
type Emitted = (u64, i64, i64, &'static str, i64, i64);

struct Case {
    name: &'static str,
    kind: WindowKind,
    mode: OutputMode,
    operator: &'static str,
    out: &'static [Emitted],
    progress: &'static [Progress],
}

const CASES: [Case; 4] = [
    Case {
        name: "session_append",
        kind: WindowKind::Session {
            gap: ms(5 * MIN_MS),
        },
        mode: OutputMode::Append,
        operator: "sessionWindowStateStoreSaveExec",
        out: &[
            (1, 1, 6, "b", 1, 100),
            (3, 0, 25, "a", 6, 309),
            (4, 30, 35, "b", 1, 1),
            (5, 33, 45, "a", 3, 13),
            (5, 44, 50, "b", 2, 8),
        ],
        progress: &[
            (0, None, 3, 3, 0, 0),
            (1, Some(10), 3, 4, 1, 0),
            (2, Some(20), 3, 2, 1, 3),
            (3, Some(30), 3, 4, 2, 0),
            (4, Some(35), 3, 4, 2, 0),
            (5, Some(60), 1, 0, 2, 0),
        ],
    },
    Case {
        name: "session_complete",
        kind: WindowKind::Session {
            gap: ms(5 * MIN_MS),
        },
        mode: OutputMode::Complete,
        operator: "sessionWindowStateStoreSaveExec",
        out: &[
            (0, 0, 8, "a", 2, 200),
            (0, 1, 6, "b", 1, 100),
            (0, 20, 25, "a", 1, 100),
            (1, 0, 15, "a", 4, 202),
            (1, 1, 6, "b", 1, 100),
            (1, 20, 25, "a", 1, 100),
            (1, 30, 35, "b", 1, 1),
            (2, 0, 25, "a", 6, 309),
            (2, 1, 6, "b", 1, 100),
            (2, 30, 35, "b", 1, 1),
            (2, 40, 45, "a", 1, 7),
            (3, 0, 25, "a", 6, 309),
            (3, 1, 6, "b", 1, 100),
            (3, 30, 35, "b", 1, 1),
            (3, 33, 45, "a", 3, 13),
            (3, 45, 50, "b", 1, 3),
            (4, 0, 25, "a", 6, 309),
            (4, 1, 6, "b", 1, 100),
            (4, 30, 35, "b", 1, 1),
            (4, 33, 45, "a", 3, 13),
            (4, 44, 50, "b", 2, 8),
            (4, 70, 75, "a", 1, 5),
        ],
        progress: &[
            (0, None, 3, 3, 0, 0),
            (1, Some(10), 4, 4, 0, 0),
            (2, Some(20), 4, 2, 1, 3),
            (3, Some(30), 5, 5, 1, 0),
            (4, Some(35), 6, 6, 1, 0),
        ],
    },
    Case {
        name: "sliding_update",
        kind: WindowKind::Sliding {
            size: ms(10 * MIN_MS),
            slide: ms(5 * MIN_MS),
        },
        mode: OutputMode::Update,
        operator: "stateStoreSave",
        out: &[
            (0, -5, 5, "a", 2, 200),
            (0, -5, 5, "b", 1, 100),
            (0, 0, 10, "a", 2, 200),
            (0, 0, 10, "b", 1, 100),
            (0, 15, 25, "a", 1, 100),
            (0, 20, 30, "a", 1, 100),
            (1, 0, 10, "a", 3, 201),
            (1, 5, 15, "a", 2, 2),
            (1, 10, 20, "a", 1, 1),
            (1, 25, 35, "b", 1, 1),
            (1, 30, 40, "b", 1, 1),
            (2, 10, 20, "a", 2, 8),
            (2, 15, 25, "a", 2, 107),
            (2, 35, 45, "a", 1, 7),
            (2, 40, 50, "a", 1, 7),
            (3, 25, 35, "a", 1, 3),
            (3, 30, 40, "a", 2, 6),
            (3, 35, 45, "a", 2, 10),
            (3, 40, 50, "b", 1, 3),
            (3, 45, 55, "b", 1, 3),
            (4, 35, 45, "b", 1, 5),
            (4, 40, 50, "b", 2, 8),
            (4, 65, 75, "a", 1, 5),
            (4, 70, 80, "a", 1, 5),
        ],
        progress: &[
            (0, None, 6, 6, 0, 0),
            (1, Some(10), 6, 5, 4, 0),
            (2, Some(20), 6, 4, 2, 4),
            (3, Some(30), 8, 5, 2, 0),
            (4, Some(35), 9, 4, 2, 0),
            (5, Some(60), 2, 0, 7, 0),
        ],
    },
    Case {
        name: "tumbling_append",
        kind: WindowKind::Tumbling {
            size: ms(5 * MIN_MS),
        },
        mode: OutputMode::Append,
        operator: "stateStoreSave",
        out: &[
            (1, 0, 5, "a", 2, 200),
            (1, 0, 5, "b", 1, 100),
            (1, 5, 10, "a", 1, 1),
            (2, 10, 15, "a", 1, 1),
            (2, 15, 20, "a", 1, 7),
            (3, 20, 25, "a", 1, 100),
            (4, 30, 35, "a", 1, 3),
            (4, 30, 35, "b", 1, 1),
            (5, 35, 40, "a", 1, 3),
            (5, 40, 45, "a", 1, 7),
            (5, 40, 45, "b", 1, 5),
            (5, 45, 50, "b", 1, 3),
        ],
        progress: &[
            (0, None, 3, 3, 0, 0),
            (1, Some(10), 3, 3, 3, 0),
            (2, Some(20), 3, 2, 2, 2),
            (3, Some(30), 5, 3, 1, 0),
            (4, Some(35), 5, 2, 2, 0),
            (5, Some(60), 1, 0, 4, 0),
        ],
    },
];

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, true),
        Field::new(
            "t",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            true,
        ),
        Field::new("amount", DataType::Int64, true),
    ]))
}

fn input(rows: &[(&str, f64, i64)]) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        )),
        Arc::new(
            TimestampMicrosecondArray::from(
                rows.iter()
                    .map(|r| BASE + (r.1 * MIN as f64) as i64)
                    .collect::<Vec<_>>(),
            )
            .with_timezone("+00:00"),
        ),
        Arc::new(Int64Array::from(
            rows.iter().map(|r| r.2).collect::<Vec<_>>(),
        )),
    ];
    RecordBatch::try_new(schema(), columns).expect("valid batch")
}

fn watermark_ms(minute: Option<i64>) -> i64 {
    minute.map_or(0, |m| BASE / 1000 + m * MIN_MS)
}

#[test]
fn spark_golden_cases() {
    for case in CASES {
        let dir = TempDir::new().expect("tempdir");
        let config = AggregateConfig {
            window: Some(WindowSpec {
                column: "t".into(),
                kind: case.kind,
            }),
            group_by: vec!["k".into()],
            aggregates: ["count(*) AS n", "sum(amount) AS s"]
                .iter()
                .map(|t| parse_agg_expr(t).expect("valid"))
                .collect(),
            output_mode: case.mode,
            watermark_column: Some("t".into()),
            num_partitions: 2,
            state_dir: dir.path().to_path_buf(),
            state: StateOptions {
                kind: StoreKind::RocksDb,
                ..StateOptions::default()
            },
        };
        let mut op = AggregateOperator::new(config, &schema()).expect("valid config");
        op.load(None).expect("empty state");
        assert_eq!(op.name(), case.operator, "{}", case.name);
        let mut rows = Vec::new();
        let mut late_ms = 0;
        for &(batch_id, wm, total, updated, removed, dropped) in case.progress {
            let wm_ms = watermark_ms(wm);
            let ctx = StatefulContext {
                batch_id,
                late_ms,
                watermark_ms: wm_ms,
            };
            let data: Vec<RecordBatch> = INPUT
                .get(batch_id as usize)
                .map(|r| vec![input(r)])
                .unwrap_or_default();
            for b in op.process(&ctx, &data).expect("batch runs") {
                let start = b.column(0).as_primitive::<TimestampMicrosecondType>();
                let end = b.column(1).as_primitive::<TimestampMicrosecondType>();
                let k = b.column(2).as_string::<i32>();
                let n = b.column(3).as_primitive::<Int64Type>();
                let s = b.column(4).as_primitive::<Int64Type>();
                for r in 0..b.num_rows() {
                    rows.push((
                        batch_id,
                        (start.value(r) - BASE) / MIN,
                        (end.value(r) - BASE) / MIN,
                        k.value(r).to_owned(),
                        n.value(r),
                        s.value(r),
                    ));
                }
            }
            let m = op.commit(batch_id).expect("commit");
            assert_eq!(
                (
                    m.num_rows_total,
                    m.num_rows_updated,
                    m.num_rows_removed,
                    m.num_rows_dropped_by_watermark
                ),
                (total, updated, removed, dropped),
                "{} batch {batch_id}: (total, updated, removed, dropped)",
                case.name
            );
            late_ms = wm_ms;
        }
        rows.sort();
        let expected: Vec<_> = case
            .out
            .iter()
            .map(|&(b, s, e, k, n, sum)| (b, s, e, k.to_owned(), n, sum))
            .collect();
        assert_eq!(rows, expected, "{}", case.name);
    }
}
