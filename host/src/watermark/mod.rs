//! Event-time watermarks, Spark's way: the watermark of batch b is the
//! largest event time seen in batches before b, minus the declared delay,
//! never decreasing, and 0 (the epoch) before any data. It is computed at
//! the end of a batch, recorded in the offsets log of the next one, and so
//! a replayed batch sees exactly the watermark it saw the first time.
//! Milliseconds, as in Spark, although timestamps are microseconds.

use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMicrosecondType;
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Schema, TimeUnit};

/// A watermark could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum WatermarkError {
    #[error("watermark column {column:?} is not in the stream (its columns: {columns})")]
    MissingColumn { column: String, columns: String },
    #[error("watermark column {column:?} is {data_type}, not TIMESTAMP")]
    NotATimestamp { column: String, data_type: String },
}

/// Event-time range of one batch, in ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTimeRange {
    pub min_ms: i64,
    pub max_ms: i64,
}

impl EventTimeRange {
    /// The range covering both.
    #[must_use]
    pub fn union(self, other: Self) -> Self {
        Self {
            min_ms: self.min_ms.min(other.min_ms),
            max_ms: self.max_ms.max(other.max_ms),
        }
    }
}

/// Watches the event-time column of a stream.
#[derive(Debug, Clone)]
pub struct Watermark {
    column: String,
    index: usize,
    delay_ms: i64,
}

impl Watermark {
    /// # Errors
    /// When `column` is missing from `schema` or is not a timestamp.
    pub fn new(column: &str, delay_ms: i64, schema: &Schema) -> Result<Self, WatermarkError> {
        let index = schema
            .index_of(column)
            .map_err(|_| WatermarkError::MissingColumn {
                column: column.to_owned(),
                columns: schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        match schema.field(index).data_type() {
            DataType::Timestamp(TimeUnit::Microsecond, _) => Ok(Self {
                column: column.to_owned(),
                index,
                delay_ms,
            }),
            other => Err(WatermarkError::NotATimestamp {
                column: column.to_owned(),
                data_type: other.to_string(),
            }),
        }
    }

    pub fn column(&self) -> &str {
        &self.column
    }

    pub fn delay_ms(&self) -> i64 {
        self.delay_ms
    }

    /// The event-time range of `batches` (null event times ignored), if any row has one.
    pub fn observe(&self, batches: &[RecordBatch]) -> Option<EventTimeRange> {
        let mut range: Option<EventTimeRange> = None;
        for batch in batches {
            let times = batch
                .column(self.index)
                .as_primitive::<TimestampMicrosecondType>();
            let mut fold = |v: i64| {
                let ms = v.div_euclid(1000);
                range = Some(match range {
                    None => EventTimeRange {
                        min_ms: ms,
                        max_ms: ms,
                    },
                    Some(r) => EventTimeRange {
                        min_ms: r.min_ms.min(ms),
                        max_ms: r.max_ms.max(ms),
                    },
                });
            };
            match times.nulls().filter(|n| n.null_count() > 0) {
                None => times.values().iter().for_each(|&v| fold(v)),
                Some(nulls) => nulls.valid_indices().for_each(|i| fold(times.values()[i])),
            }
        }
        range
    }

    /// The watermark after a batch that ran at `current_ms` and saw `range`.
    pub fn next(&self, current_ms: i64, range: Option<EventTimeRange>) -> i64 {
        match range {
            Some(r) => current_ms.max(r.max_ms.saturating_sub(self.delay_ms)),
            None => current_ms,
        }
    }
}

/// The query's watermark from those of its inputs, by Spark's
/// `multipleWatermarkPolicy`: the minimum (no input's late data is lost) or
/// the maximum (the fastest input decides; slower ones lose more rows). An
/// input that has seen no data counts as 0, as in Spark's `WatermarkTracker`,
/// so under `min` it holds the query back until it has data or its idle
/// timeout passes. The result never goes below `previous`.
pub fn combine(previous_ms: i64, inputs_ms: &[i64], take_max: bool) -> i64 {
    let chosen = if take_max {
        inputs_ms.iter().copied().max()
    } else {
        inputs_ms.iter().copied().min()
    };
    chosen.map_or(previous_ms, |c| c.max(previous_ms))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::TimestampMicrosecondArray;
    use arrow_schema::Field;

    use super::*;

    #[test]
    fn several_inputs_combine_by_policy_and_never_go_back() {
        // min: the slowest input holds the watermark; one without data holds it at 0.
        assert_eq!(combine(0, &[5_000, 0], false), 0);
        assert_eq!(combine(0, &[5_000, 3_000], false), 3_000);
        assert_eq!(combine(0, &[5_000, 3_000], true), 5_000);
        // Never below the previous watermark (an input may lag behind it).
        assert_eq!(combine(4_000, &[5_000, 3_000], false), 4_000);
        // A single input: the rule of a single watermark.
        assert_eq!(combine(1_000, &[7_000], false), 7_000);
        assert_eq!(combine(1_000, &[], false), 1_000);
    }

    fn batch(values: Vec<Option<i64>>) -> RecordBatch {
        let array = TimestampMicrosecondArray::from(values).with_timezone("+00:00");
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new(
                "t",
                array.data_type().clone(),
                true,
            )])),
            vec![Arc::new(array)],
        )
        .expect("valid batch")
    }

    #[test]
    fn max_minus_delay_never_decreasing_in_ms() {
        let b = batch(vec![Some(60_000_999), None, Some(1_000)]);
        let w = Watermark::new("t", 10_000, &b.schema()).expect("timestamp column");
        let range = w.observe(&[b]);
        assert_eq!(
            range,
            Some(EventTimeRange {
                min_ms: 1,
                max_ms: 60_000
            })
        );
        assert_eq!(w.next(0, range), 50_000);
        assert_eq!(w.next(55_000, range), 55_000, "never decreases");
        assert_eq!(w.next(7, None), 7, "no data, no change");
        assert_eq!(w.observe(&[batch(vec![None])]), None);
    }

    #[test]
    fn the_column_must_be_a_timestamp() {
        let b = batch(vec![]);
        assert!(matches!(
            Watermark::new("x", 0, &b.schema()),
            Err(WatermarkError::MissingColumn { .. })
        ));
        let s = Schema::new(vec![Field::new("t", DataType::Int64, true)]);
        let err = Watermark::new("t", 0, &s).expect_err("not a timestamp");
        assert_eq!(
            err.to_string(),
            "watermark column \"t\" is Int64, not TIMESTAMP"
        );
    }
}
