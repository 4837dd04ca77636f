//! Builds output rows from groups (key bytes + state value): Spark's final
//! aggregation (`HashAggregate` in final mode) over the emitted groups.
//!
//! Why it exists: emitted groups come from two places — the batch's merged
//! groups (update mode) and state scans (append and complete mode) — and
//! both are `(T ‖ K, value)` pairs, so one builder decodes the window and
//! keys back into columns and evaluates every aggregate's result (`avg` =
//! sum / count, `approx_count_distinct` = the HLL++ estimate, …).

use std::sync::Arc;

use arrow_array::types::Decimal128Type;
use arrow_array::{
    ArrayRef, Float64Array, Int64Array, PrimitiveArray, RecordBatch, TimestampMicrosecondArray,
};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::{ArrowError, DataType};

use super::decimal;
use super::hll;
use super::plan::{AggKind, AggregateError, Plan, Shape};
use super::value::{Truncated, ValueReader};
use crate::operator::key_encoding::{ColumnCollector, unflip_i64};

/// Bytes of a window prefix: `end ‖ start`, order-preserving.
pub(super) const WINDOW_BYTES: usize = 16;

#[derive(Debug)]
enum AggColumn {
    Count(Vec<i64>),
    Int(Vec<Option<i64>>),
    Float(Vec<Option<f64>>),
    Decimal(Vec<Option<i128>>, u8, i8),
    Extreme(ColumnCollector),
}

/// The output rows of one batch, column by column.
#[derive(Debug)]
pub(super) struct OutputRows<'p> {
    plan: &'p Plan,
    window_start: Vec<i64>,
    window_end: Vec<i64>,
    keys: Vec<ColumnCollector>,
    aggs: Vec<AggColumn>,
    rows: usize,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn corrupt(key: &[u8], reason: impl Into<String>) -> AggregateError {
    AggregateError::CorruptState {
        key: hex(key),
        reason: reason.into(),
    }
}

/// A window's `(start, end)` in µs.
type Bounds = (i64, i64);

/// Splits a group key into its window and the rest.
pub(super) fn split_window<'k>(
    plan: &Plan,
    key: &'k [u8],
) -> Result<(Option<Bounds>, &'k [u8]), AggregateError> {
    if plan.window.is_none() {
        return Ok((None, key));
    }
    let head = key
        .get(..WINDOW_BYTES)
        .ok_or_else(|| corrupt(key, "shorter than a window"))?;
    let mut end = [0u8; 8];
    let mut start = [0u8; 8];
    end.copy_from_slice(&head[..8]);
    start.copy_from_slice(&head[8..]);
    Ok((
        Some((unflip_i64(start), unflip_i64(end))),
        &key[WINDOW_BYTES..],
    ))
}

impl<'p> OutputRows<'p> {
    pub fn new(plan: &'p Plan) -> Self {
        let keys = plan
            .keys
            .iter()
            .filter_map(|k| ColumnCollector::new(&k.data_type))
            .collect();
        let aggs = plan
            .aggs
            .iter()
            .map(|a| match a.kind {
                AggKind::CountAll
                | AggKind::Count
                | AggKind::CountDistinct
                | AggKind::ApproxCountDistinct => AggColumn::Count(Vec::new()),
                AggKind::SumInt => AggColumn::Int(Vec::new()),
                AggKind::SumFloat | AggKind::AvgFloat => AggColumn::Float(Vec::new()),
                AggKind::SumDecimal { precision, scale } => {
                    AggColumn::Decimal(Vec::new(), precision, scale)
                }
                AggKind::AvgDecimal { result, .. } => {
                    AggColumn::Decimal(Vec::new(), result.0, result.1)
                }
                AggKind::Min(_) | AggKind::Max(_) => {
                    // The plan only accepts orderable types, which the
                    // collector supports; fall back to a count column
                    // otherwise so that `finish` reports the mismatch.
                    ColumnCollector::new(a.field.data_type())
                        .map_or(AggColumn::Count(Vec::new()), AggColumn::Extreme)
                }
            })
            .collect();
        Self {
            plan,
            window_start: Vec::new(),
            window_end: Vec::new(),
            keys,
            aggs,
            rows: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    /// Adds the row of group `key` (`T ‖ K`) with state value `value`.
    pub fn add(&mut self, key: &[u8], value: &[u8]) -> Result<(), AggregateError> {
        let (window, mut rest) = split_window(self.plan, key)?;
        if let Some((start, end)) = window {
            self.window_start.push(start);
            self.window_end.push(end);
        }
        for collector in &mut self.keys {
            let used = collector
                .decode(rest)
                .map_err(|e| corrupt(key, e.to_string()))?;
            rest = &rest[used..];
        }
        if !rest.is_empty() {
            return Err(corrupt(key, "bytes left after the group columns"));
        }
        let mut r = ValueReader::new(value);
        let truncated = |_: Truncated| corrupt(key, "value shorter than its aggregates");
        for (agg, column) in self.plan.aggs.iter().zip(&mut self.aggs) {
            match (agg.kind, column) {
                (
                    AggKind::CountAll | AggKind::Count | AggKind::CountDistinct,
                    AggColumn::Count(v),
                ) => v.push(r.i64().map_err(truncated)?),
                (AggKind::ApproxCountDistinct, AggColumn::Count(v)) => {
                    v.push(hll::estimate(r.raw(hll::REGISTERS).map_err(truncated)?));
                }
                (AggKind::SumInt, AggColumn::Int(v)) => v.push(r.opt_i64().map_err(truncated)?),
                (AggKind::SumFloat, AggColumn::Float(v)) => {
                    v.push(r.opt_f64().map_err(truncated)?);
                }
                (AggKind::AvgFloat, AggColumn::Float(v)) => {
                    let sum = r.f64().map_err(truncated)?;
                    let count = r.i64().map_err(truncated)?;
                    v.push((count > 0).then(|| sum / count as f64));
                }
                (AggKind::SumDecimal { .. }, AggColumn::Decimal(v, ..)) => {
                    v.push(r.opt_i128().map_err(truncated)?);
                }
                (
                    AggKind::AvgDecimal {
                        sum_precision,
                        scale,
                        result,
                    },
                    AggColumn::Decimal(v, ..),
                ) => {
                    let sum = r.i128().map_err(truncated)?;
                    let count = r.i64().map_err(truncated)?;
                    let avg =
                        decimal::avg(sum, count, sum_precision, scale, result).map_err(|()| {
                            AggregateError::Overflow {
                                expr: agg.expr.text.clone(),
                                result_type: agg.field.data_type().to_string(),
                                group: describe_key(self.plan, key),
                            }
                        })?;
                    v.push(avg);
                }
                (AggKind::Min(shape) | AggKind::Max(shape), AggColumn::Extreme(c)) => match shape {
                    Shape::Int => match r.opt_i64().map_err(truncated)? {
                        Some(x) => c.push_i64(x),
                        None => c.push_null(),
                    },
                    Shape::UInt => match r.opt_u64().map_err(truncated)? {
                        Some(x) => c.push_u64(x),
                        None => c.push_null(),
                    },
                    Shape::Float => match r.opt_f64().map_err(truncated)? {
                        Some(x) => c.push_f64(x),
                        None => c.push_null(),
                    },
                    Shape::Decimal => match r.opt_i128().map_err(truncated)? {
                        Some(x) => c.push_i128(x),
                        None => c.push_null(),
                    },
                    Shape::Bytes => match r.opt_bytes().map_err(truncated)? {
                        Some(x) => c.push_bytes(x),
                        None => c.push_null(),
                    },
                },
                _ => return Err(corrupt(key, "aggregate layout does not match the plan")),
            }
        }
        if !r.is_done() {
            return Err(corrupt(key, "value longer than its aggregates"));
        }
        self.rows += 1;
        Ok(())
    }

    /// The rows as one batch of the plan's output schema (`None`: no rows).
    pub fn finish(self) -> Result<Option<RecordBatch>, ArrowError> {
        if self.rows == 0 {
            return Ok(None);
        }
        let plan = self.plan;
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(plan.output.fields().len());
        if let Some(w) = &plan.window {
            let tz = match &w.data_type {
                DataType::Timestamp(_, tz) => tz.clone(),
                _ => None,
            };
            columns.push(Arc::new(
                TimestampMicrosecondArray::from(self.window_start).with_timezone_opt(tz.clone()),
            ));
            columns.push(Arc::new(
                TimestampMicrosecondArray::from(self.window_end).with_timezone_opt(tz),
            ));
        }
        let mut keyed: Vec<(usize, ArrayRef)> = Vec::with_capacity(self.keys.len());
        for (collector, key) in self.keys.into_iter().zip(&plan.keys) {
            keyed.push((key.output, collector.finish()?));
        }
        keyed.sort_by_key(|(o, _)| *o);
        columns.extend(keyed.into_iter().map(|(_, a)| a));
        for column in self.aggs {
            let array: ArrayRef = match column {
                AggColumn::Count(v) => Arc::new(Int64Array::from(v)),
                AggColumn::Int(v) => Arc::new(Int64Array::from(v)),
                AggColumn::Float(v) => Arc::new(Float64Array::from(v)),
                AggColumn::Decimal(v, p, s) => Arc::new(
                    v.into_iter()
                        .collect::<PrimitiveArray<Decimal128Type>>()
                        .with_precision_and_scale(p, s)?,
                ),
                AggColumn::Extreme(c) => c.finish()?,
            };
            columns.push(array);
        }
        RecordBatch::try_new(plan.output.clone(), columns).map(Some)
    }
}

/// A group's window and keys for messages: `window_start=…, status=…`.
pub(super) fn describe_key(plan: &Plan, key: &[u8]) -> String {
    let describe = || -> Result<String, AggregateError> {
        let mut parts = Vec::new();
        let (window, mut rest) = split_window(plan, key)?;
        if let (Some((start, end)), Some(w)) = (window, &plan.window) {
            let tz = match &w.data_type {
                DataType::Timestamp(_, tz) => tz.clone(),
                _ => None,
            };
            let a = TimestampMicrosecondArray::from(vec![start, end]).with_timezone_opt(tz);
            let f = ArrayFormatter::try_new(&a, &FormatOptions::default())
                .map_err(|e| corrupt(key, e.to_string()))?;
            parts.push(format!("window_start={}", f.value(0)));
            parts.push(format!("window_end={}", f.value(1)));
        }
        let mut keyed = Vec::new();
        for k in &plan.keys {
            let mut c = ColumnCollector::new(&k.data_type)
                .ok_or_else(|| corrupt(key, "unsupported key type"))?;
            let used = c.decode(rest).map_err(|e| corrupt(key, e.to_string()))?;
            rest = &rest[used..];
            let array = c.finish().map_err(|e| corrupt(key, e.to_string()))?;
            let f = ArrayFormatter::try_new(array.as_ref(), &FormatOptions::default())
                .map_err(|e| corrupt(key, e.to_string()))?;
            keyed.push((k.output, format!("{}={}", k.name, f.value(0))));
        }
        keyed.sort_by_key(|(o, _)| *o);
        parts.extend(keyed.into_iter().map(|(_, p)| p));
        Ok(if parts.is_empty() {
            "(global)".to_owned()
        } else {
            parts.join(", ")
        })
    };
    describe().unwrap_or_else(|_| hex(key))
}
