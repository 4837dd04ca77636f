//! The per-batch partial aggregation: Spark's map-side `HashAggregate`
//! (partial mode), columnar.
//!
//! Why it exists: the state store is the expensive part of a stateful query,
//! so every input row is first folded into an in-memory partial aggregate of
//! its group; the store then sees one get and one put per group and batch,
//! not per row. Per batch: the window and the group key of every row are
//! computed from the Arrow arrays into one reused buffer, the key is looked
//! up in a hash map (group id per row), then each aggregate runs over its
//! input column with the row → group ids, into plain vectors indexed by
//! group. No allocation per row beyond a new group's key.
//!
//! A group's key is `T ‖ K`: `T` the window (`end ‖ start`, 16 bytes,
//! order-preserving) or nothing, `K` the group columns in state-key order
//! (see `operator::key_encoding`). For session windows the partial
//! groups are `K ‖ ts` (Spark aggregates rows of equal key and timestamp
//! before merging sessions).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Date64Type, Decimal128Type, DurationMicrosecondType, DurationMillisecondType,
    DurationNanosecondType, DurationSecondType, Float32Type, Float64Type, Int8Type, Int16Type,
    Int32Type, Int64Type, Time32MillisecondType, Time32SecondType, Time64MicrosecondType,
    Time64NanosecondType, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrowPrimitiveType, RecordBatch};
use arrow_schema::{DataType, TimeUnit};

use super::hll;
use super::plan::{AggKind, AggPlan, AggregateError, Plan, Shape, TimeKey, WindowKind};
use super::value::{ValueWriter, float_cmp};
use crate::operator::key_encoding::{ColumnEncoder, flip_i64};

/// A row that belongs to no group in this pass.
const SKIP: u32 = u32::MAX;

/// A fast, deterministic hasher for encoded keys (word at a time, then a
/// final mix so that the low bits the table uses are spread).
#[derive(Debug, Default)]
pub(super) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }

    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(a)).wrapping_mul(K);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut a = [0u8; 8];
            a[..rest.len()].copy_from_slice(rest);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(a)).wrapping_mul(K);
        }
    }

    fn write_usize(&mut self, v: usize) {
        self.0 = (self.0.rotate_left(5) ^ v as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

type KeyBuild = BuildHasherDefault<KeyHasher>;

/// Per-group partial state of one aggregate, indexed by group id.
#[derive(Debug)]
enum Acc {
    Count(Vec<i64>),
    SumInt {
        sum: Vec<i64>,
        seen: Vec<bool>,
    },
    SumFloat {
        sum: Vec<f64>,
        seen: Vec<bool>,
    },
    SumDecimal {
        sum: Vec<i128>,
        seen: Vec<bool>,
    },
    AvgFloat {
        sum: Vec<f64>,
        count: Vec<i64>,
    },
    AvgDecimal {
        sum: Vec<i128>,
        count: Vec<i64>,
    },
    ExtremeInt {
        v: Vec<i64>,
        seen: Vec<bool>,
    },
    ExtremeUInt {
        v: Vec<u64>,
        seen: Vec<bool>,
    },
    ExtremeFloat {
        v: Vec<f64>,
        seen: Vec<bool>,
    },
    ExtremeDecimal {
        v: Vec<i128>,
        seen: Vec<bool>,
    },
    ExtremeBytes {
        v: Vec<Vec<u8>>,
        seen: Vec<bool>,
    },
    /// Values live in [`Partials::distinct`]; the count is known at merge.
    Distinct,
    /// `hll::REGISTERS` registers per group.
    Hll(Vec<u8>),
}

impl Acc {
    fn new(kind: AggKind) -> Self {
        match kind {
            AggKind::CountAll | AggKind::Count => Self::Count(Vec::new()),
            AggKind::CountDistinct => Self::Distinct,
            AggKind::ApproxCountDistinct => Self::Hll(Vec::new()),
            AggKind::SumInt => Self::SumInt {
                sum: Vec::new(),
                seen: Vec::new(),
            },
            AggKind::SumFloat => Self::SumFloat {
                sum: Vec::new(),
                seen: Vec::new(),
            },
            AggKind::SumDecimal { .. } => Self::SumDecimal {
                sum: Vec::new(),
                seen: Vec::new(),
            },
            AggKind::AvgFloat => Self::AvgFloat {
                sum: Vec::new(),
                count: Vec::new(),
            },
            AggKind::AvgDecimal { .. } => Self::AvgDecimal {
                sum: Vec::new(),
                count: Vec::new(),
            },
            AggKind::Min(shape) | AggKind::Max(shape) => match shape {
                Shape::Int => Self::ExtremeInt {
                    v: Vec::new(),
                    seen: Vec::new(),
                },
                Shape::UInt => Self::ExtremeUInt {
                    v: Vec::new(),
                    seen: Vec::new(),
                },
                Shape::Float => Self::ExtremeFloat {
                    v: Vec::new(),
                    seen: Vec::new(),
                },
                Shape::Decimal => Self::ExtremeDecimal {
                    v: Vec::new(),
                    seen: Vec::new(),
                },
                Shape::Bytes => Self::ExtremeBytes {
                    v: Vec::new(),
                    seen: Vec::new(),
                },
            },
        }
    }

    fn clear(&mut self) {
        match self {
            Self::Count(c) => c.clear(),
            Self::SumInt { sum, seen } => {
                sum.clear();
                seen.clear();
            }
            Self::SumFloat { sum, seen } => {
                sum.clear();
                seen.clear();
            }
            Self::SumDecimal { sum, seen } => {
                sum.clear();
                seen.clear();
            }
            Self::AvgFloat { sum, count } => {
                sum.clear();
                count.clear();
            }
            Self::AvgDecimal { sum, count } => {
                sum.clear();
                count.clear();
            }
            Self::ExtremeInt { v, seen } => {
                v.clear();
                seen.clear();
            }
            Self::ExtremeUInt { v, seen } => {
                v.clear();
                seen.clear();
            }
            Self::ExtremeFloat { v, seen } => {
                v.clear();
                seen.clear();
            }
            Self::ExtremeDecimal { v, seen } => {
                v.clear();
                seen.clear();
            }
            Self::ExtremeBytes { v, seen } => {
                v.clear();
                seen.clear();
            }
            Self::Distinct => {}
            Self::Hll(r) => r.clear(),
        }
    }

    /// Adds an empty group.
    fn push_group(&mut self) {
        match self {
            Self::Count(c) => c.push(0),
            Self::SumInt { sum, seen } => {
                sum.push(0);
                seen.push(false);
            }
            Self::SumFloat { sum, seen } => {
                sum.push(0.0);
                seen.push(false);
            }
            Self::SumDecimal { sum, seen } => {
                sum.push(0);
                seen.push(false);
            }
            Self::AvgFloat { sum, count } => {
                sum.push(0.0);
                count.push(0);
            }
            Self::AvgDecimal { sum, count } => {
                sum.push(0);
                count.push(0);
            }
            Self::ExtremeInt { v, seen } => {
                v.push(0);
                seen.push(false);
            }
            Self::ExtremeUInt { v, seen } => {
                v.push(0);
                seen.push(false);
            }
            Self::ExtremeFloat { v, seen } => {
                v.push(0.0);
                seen.push(false);
            }
            Self::ExtremeDecimal { v, seen } => {
                v.push(0);
                seen.push(false);
            }
            Self::ExtremeBytes { v, seen } => {
                v.push(Vec::new());
                seen.push(false);
            }
            Self::Distinct => {}
            Self::Hll(r) => r.resize(r.len() + hll::REGISTERS, 0),
        }
    }
}

/// Calls `f(group, value)` for every non-null row of a primitive column
/// that belongs to a group. `None` when the array is not of type `T`.
#[inline]
fn visit<T: ArrowPrimitiveType>(
    array: &dyn Array,
    groups: &[u32],
    mut f: impl FnMut(usize, T::Native),
) -> Option<()> {
    let a = array.as_primitive_opt::<T>()?;
    let values = a.values();
    match a.nulls() {
        None => {
            for (r, &g) in groups.iter().enumerate() {
                if g != SKIP {
                    f(g as usize, values[r]);
                }
            }
        }
        Some(nulls) => {
            for (r, &g) in groups.iter().enumerate() {
                if g != SKIP && nulls.is_valid(r) {
                    f(g as usize, values[r]);
                }
            }
        }
    }
    Some(())
}

/// [`visit`] over any integer-like column, widened to `i64` (booleans as 0/1).
fn visit_i64(array: &dyn Array, groups: &[u32], mut f: impl FnMut(usize, i64)) -> Option<()> {
    use DataType as D;
    match array.data_type() {
        D::Boolean => {
            let a = array.as_boolean_opt()?;
            for (r, &g) in groups.iter().enumerate() {
                if g != SKIP && a.is_valid(r) {
                    f(g as usize, i64::from(a.value(r)));
                }
            }
            Some(())
        }
        D::Int8 => visit::<Int8Type>(array, groups, |g, v| f(g, i64::from(v))),
        D::Int16 => visit::<Int16Type>(array, groups, |g, v| f(g, i64::from(v))),
        D::Int32 => visit::<Int32Type>(array, groups, |g, v| f(g, i64::from(v))),
        D::Int64 => visit::<Int64Type>(array, groups, f),
        D::UInt8 => visit::<UInt8Type>(array, groups, |g, v| f(g, i64::from(v))),
        D::UInt16 => visit::<UInt16Type>(array, groups, |g, v| f(g, i64::from(v))),
        D::UInt32 => visit::<UInt32Type>(array, groups, |g, v| f(g, i64::from(v))),
        D::Date32 => visit::<Date32Type>(array, groups, |g, v| f(g, i64::from(v))),
        D::Date64 => visit::<Date64Type>(array, groups, f),
        D::Time32(TimeUnit::Second) => {
            visit::<Time32SecondType>(array, groups, |g, v| f(g, i64::from(v)))
        }
        D::Time32(_) => visit::<Time32MillisecondType>(array, groups, |g, v| f(g, i64::from(v))),
        D::Time64(TimeUnit::Nanosecond) => visit::<Time64NanosecondType>(array, groups, f),
        D::Time64(_) => visit::<Time64MicrosecondType>(array, groups, f),
        D::Timestamp(TimeUnit::Second, _) => visit::<TimestampSecondType>(array, groups, f),
        D::Timestamp(TimeUnit::Millisecond, _) => {
            visit::<TimestampMillisecondType>(array, groups, f)
        }
        D::Timestamp(TimeUnit::Microsecond, _) => {
            visit::<TimestampMicrosecondType>(array, groups, f)
        }
        D::Timestamp(TimeUnit::Nanosecond, _) => visit::<TimestampNanosecondType>(array, groups, f),
        D::Duration(TimeUnit::Second) => visit::<DurationSecondType>(array, groups, f),
        D::Duration(TimeUnit::Millisecond) => visit::<DurationMillisecondType>(array, groups, f),
        D::Duration(TimeUnit::Microsecond) => visit::<DurationMicrosecondType>(array, groups, f),
        D::Duration(TimeUnit::Nanosecond) => visit::<DurationNanosecondType>(array, groups, f),
        _ => None,
    }
}

/// [`visit`] over a numeric column as `f64` (Spark casts to DOUBLE for avg).
fn visit_f64(array: &dyn Array, groups: &[u32], mut f: impl FnMut(usize, f64)) -> Option<()> {
    match array.data_type() {
        DataType::Float64 => visit::<Float64Type>(array, groups, f),
        DataType::Float32 => visit::<Float32Type>(array, groups, |g, v| f(g, f64::from(v))),
        DataType::UInt64 => visit::<UInt64Type>(array, groups, |g, v| f(g, v as f64)),
        _ => visit_i64(array, groups, |g, v| f(g, v as f64)),
    }
}

/// [`visit`] over a string or binary column.
fn visit_bytes(array: &dyn Array, groups: &[u32], mut f: impl FnMut(usize, &[u8])) -> Option<()> {
    fn each<'a>(
        groups: &[u32],
        valid: impl Fn(usize) -> bool,
        value: impl Fn(usize) -> &'a [u8],
        f: &mut impl FnMut(usize, &[u8]),
    ) {
        for (r, &g) in groups.iter().enumerate() {
            if g != SKIP && valid(r) {
                f(g as usize, value(r));
            }
        }
    }
    use DataType as D;
    match array.data_type() {
        D::Utf8 => {
            let a = array.as_string_opt::<i32>()?;
            each(groups, |r| a.is_valid(r), |r| a.value(r).as_bytes(), &mut f);
        }
        D::LargeUtf8 => {
            let a = array.as_string_opt::<i64>()?;
            each(groups, |r| a.is_valid(r), |r| a.value(r).as_bytes(), &mut f);
        }
        D::Utf8View => {
            let a = array.as_string_view_opt()?;
            each(groups, |r| a.is_valid(r), |r| a.value(r).as_bytes(), &mut f);
        }
        D::Binary => {
            let a = array.as_binary_opt::<i32>()?;
            each(groups, |r| a.is_valid(r), |r| a.value(r), &mut f);
        }
        D::LargeBinary => {
            let a = array.as_binary_opt::<i64>()?;
            each(groups, |r| a.is_valid(r), |r| a.value(r), &mut f);
        }
        D::BinaryView => {
            let a = array.as_binary_view_opt()?;
            each(groups, |r| a.is_valid(r), |r| a.value(r), &mut f);
        }
        _ => return None,
    }
    Some(())
}

/// Spark's hash of every non-null row (see [`hll`]).
fn visit_hash(array: &dyn Array, groups: &[u32], mut f: impl FnMut(usize, u64)) -> Option<()> {
    use DataType as D;
    match array.data_type() {
        D::Boolean | D::Int8 | D::Int16 | D::Int32 | D::Date32 => {
            visit_i64(array, groups, |g, v| f(g, hll::hash_int(v as i32)))
        }
        D::Int64 | D::Timestamp(TimeUnit::Microsecond, _) => {
            visit_i64(array, groups, |g, v| f(g, hll::hash_long(v)))
        }
        D::Float32 => visit::<Float32Type>(array, groups, |g, v| f(g, hll::hash_f32(v))),
        D::Float64 => visit::<Float64Type>(array, groups, |g, v| f(g, hll::hash_f64(v))),
        D::Decimal128(p, _) => {
            let p = *p;
            visit::<Decimal128Type>(array, groups, |g, v| f(g, hll::hash_decimal(v, p)))
        }
        _ => visit_bytes(array, groups, |g, v| f(g, hll::hash_bytes(v))),
    }
}

/// The partial aggregates of one micro-batch.
#[derive(Debug, Default)]
pub(super) struct Partials {
    index: HashMap<Arc<[u8]>, u32, KeyBuild>,
    /// Group key bytes by group id.
    pub keys: Vec<Arc<[u8]>>,
    /// The event time compared with the late watermark: the window's end,
    /// the event-time key's value, or (sessions) the row's timestamp.
    pub time: Vec<Option<i64>>,
    /// Input rows per group.
    pub rows: Vec<u64>,
    accs: Vec<Acc>,
    /// `group u32 BE ‖ aggregate u8 ‖ value key` of every distinct value seen.
    distinct: HashSet<Box<[u8]>, KeyBuild>,
    /// Reused per-row buffers.
    buf: Vec<u8>,
    distinct_buf: Vec<u8>,
    groups: Vec<u32>,
}

impl Partials {
    /// Empties the partials for a new batch of `plan` (keeping capacity).
    pub fn reset(&mut self, plan: &Plan) {
        self.index.clear();
        self.keys.clear();
        self.time.clear();
        self.rows.clear();
        self.distinct.clear();
        if self.accs.len() == plan.aggs.len() {
            self.accs.iter_mut().for_each(Acc::clear);
        } else {
            self.accs = plan.aggs.iter().map(|a| Acc::new(a.kind)).collect();
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// The group of the key in `self.buf`, created when new.
    #[inline]
    fn group(&mut self, time: Option<i64>) -> u32 {
        if let Some(&g) = self.index.get(&self.buf[..]) {
            return g;
        }
        let g = self.keys.len() as u32;
        let key: Arc<[u8]> = Arc::from(&self.buf[..]);
        self.index.insert(key.clone(), g);
        self.keys.push(key);
        self.time.push(time);
        self.rows.push(0);
        for acc in &mut self.accs {
            acc.push_group();
        }
        g
    }

    /// Makes sure the global group (no window, no keys) exists: Spark's
    /// global aggregation outputs a row even for a batch without input.
    pub fn ensure_global_group(&mut self) {
        if self.keys.is_empty() {
            self.buf.clear();
            self.group(None);
        }
    }

    /// Folds one input batch into the partials.
    pub fn add_batch(&mut self, plan: &Plan, batch: &RecordBatch) -> Result<(), AggregateError> {
        check_input(plan, batch)?;
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let encoders = plan
            .keys
            .iter()
            .map(|k| ColumnEncoder::new(batch.column(k.index).as_ref()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| mismatch(plan, batch))?;
        let mut groups = std::mem::take(&mut self.groups);
        groups.clear();
        groups.resize(n, SKIP);
        let result = match &plan.window {
            None => {
                let time = match plan.time_key {
                    TimeKey::Column => Some(
                        batch
                            .column(plan.keys[0].index)
                            .as_primitive_opt::<TimestampMicrosecondType>()
                            .ok_or_else(|| mismatch(plan, batch))?,
                    ),
                    TimeKey::None | TimeKey::Window => None,
                };
                for (r, slot) in groups.iter_mut().enumerate() {
                    self.buf.clear();
                    for e in &encoders {
                        e.write(r, &mut self.buf);
                    }
                    let t = time.filter(|t| t.is_valid(r)).map(|t| t.value(r));
                    *slot = self.group(t);
                    self.rows[*slot as usize] += 1;
                }
                self.accumulate(plan, batch, &groups)
            }
            Some(w) => {
                let ts = batch
                    .column(w.column)
                    .as_primitive_opt::<TimestampMicrosecondType>()
                    .ok_or_else(|| mismatch(plan, batch))?;
                let range = |micros: i64| AggregateError::EventTimeRange {
                    column: w.name.clone(),
                    micros,
                };
                match w.kind {
                    WindowKind::Session { .. } => {
                        for (r, slot) in groups.iter_mut().enumerate() {
                            if ts.is_null(r) {
                                continue;
                            }
                            let t = ts.value(r);
                            self.buf.clear();
                            for e in &encoders {
                                e.write(r, &mut self.buf);
                            }
                            self.buf.extend_from_slice(&flip_i64(t));
                            *slot = self.group(Some(t));
                            self.rows[*slot as usize] += 1;
                        }
                        self.accumulate(plan, batch, &groups)
                    }
                    WindowKind::Tumbling { size } | WindowKind::Sliding { size, .. } => {
                        let slide = match w.kind {
                            WindowKind::Sliding { slide, .. } => slide,
                            _ => size,
                        };
                        // Spark's `ceil(size / slide)` candidate windows per row,
                        // `i`-th starting `i * slide` before the last start.
                        let windows = (size + slide - 1) / slide;
                        let mut result = Ok(());
                        for i in 0..windows {
                            for (r, slot) in groups.iter_mut().enumerate() {
                                *slot = SKIP;
                                if ts.is_null(r) {
                                    continue;
                                }
                                let t = ts.value(r);
                                let start = t
                                    .checked_sub(t.rem_euclid(slide))
                                    .and_then(|last| last.checked_sub(i * slide))
                                    .ok_or_else(|| range(t))?;
                                let end = start.checked_add(size).ok_or_else(|| range(t))?;
                                if t >= end {
                                    continue;
                                }
                                self.buf.clear();
                                self.buf.extend_from_slice(&flip_i64(end));
                                self.buf.extend_from_slice(&flip_i64(start));
                                for e in &encoders {
                                    e.write(r, &mut self.buf);
                                }
                                *slot = self.group(Some(end));
                                self.rows[*slot as usize] += 1;
                            }
                            result = self.accumulate(plan, batch, &groups);
                            if result.is_err() {
                                break;
                            }
                        }
                        result
                    }
                }
            }
        };
        self.groups = groups;
        result
    }

    /// Runs every aggregate over `batch` with the row → group ids `groups`.
    fn accumulate(
        &mut self,
        plan: &Plan,
        batch: &RecordBatch,
        groups: &[u32],
    ) -> Result<(), AggregateError> {
        for (a, (acc, agg)) in self.accs.iter_mut().zip(&plan.aggs).enumerate() {
            let Some(column) = agg.column else {
                // count(*): every grouped row.
                if let Acc::Count(c) = acc {
                    for &g in groups {
                        if g != SKIP {
                            c[g as usize] += 1;
                        }
                    }
                }
                continue;
            };
            let array = batch.column(column).as_ref();
            let mut overflow = None;
            let ok = match acc {
                Acc::Count(c) => match array.logical_nulls() {
                    None => {
                        for &g in groups {
                            if g != SKIP {
                                c[g as usize] += 1;
                            }
                        }
                        Some(())
                    }
                    Some(nulls) => {
                        for (r, &g) in groups.iter().enumerate() {
                            if g != SKIP && nulls.is_valid(r) {
                                c[g as usize] += 1;
                            }
                        }
                        Some(())
                    }
                },
                Acc::SumInt { sum, seen } => visit_i64(array, groups, |g, v| {
                    seen[g] = true;
                    match sum[g].checked_add(v) {
                        Some(s) => sum[g] = s,
                        None => overflow = Some(g),
                    }
                }),
                Acc::SumFloat { sum, seen } => visit_f64(array, groups, |g, v| {
                    seen[g] = true;
                    sum[g] += v;
                }),
                Acc::SumDecimal { sum, seen } => visit::<Decimal128Type>(array, groups, |g, v| {
                    seen[g] = true;
                    match sum[g].checked_add(v) {
                        Some(s) => sum[g] = s,
                        None => overflow = Some(g),
                    }
                }),
                Acc::AvgFloat { sum, count } => visit_f64(array, groups, |g, v| {
                    sum[g] += v;
                    count[g] += 1;
                }),
                Acc::AvgDecimal { sum, count } => visit::<Decimal128Type>(array, groups, |g, v| {
                    count[g] += 1;
                    match sum[g].checked_add(v) {
                        Some(s) => sum[g] = s,
                        None => overflow = Some(g),
                    }
                }),
                Acc::ExtremeInt { v, seen } => {
                    let max = matches!(agg.kind, AggKind::Max(_));
                    visit_i64(array, groups, |g, x| {
                        if !seen[g] || (max && x > v[g]) || (!max && x < v[g]) {
                            v[g] = x;
                            seen[g] = true;
                        }
                    })
                }
                Acc::ExtremeUInt { v, seen } => {
                    let max = matches!(agg.kind, AggKind::Max(_));
                    let mut f = |g: usize, x: u64| {
                        if !seen[g] || (max && x > v[g]) || (!max && x < v[g]) {
                            v[g] = x;
                            seen[g] = true;
                        }
                    };
                    match array.data_type() {
                        DataType::UInt64 => visit::<UInt64Type>(array, groups, f),
                        _ => visit_i64(array, groups, |g, x| f(g, x as u64)),
                    }
                }
                Acc::ExtremeFloat { v, seen } => {
                    let want = if matches!(agg.kind, AggKind::Max(_)) {
                        std::cmp::Ordering::Greater
                    } else {
                        std::cmp::Ordering::Less
                    };
                    visit_f64(array, groups, |g, x| {
                        if !seen[g] || float_cmp(x, v[g]) == want {
                            v[g] = x;
                            seen[g] = true;
                        }
                    })
                }
                Acc::ExtremeDecimal { v, seen } => {
                    let max = matches!(agg.kind, AggKind::Max(_));
                    visit::<Decimal128Type>(array, groups, |g, x| {
                        if !seen[g] || (max && x > v[g]) || (!max && x < v[g]) {
                            v[g] = x;
                            seen[g] = true;
                        }
                    })
                }
                Acc::ExtremeBytes { v, seen } => {
                    let max = matches!(agg.kind, AggKind::Max(_));
                    visit_bytes(array, groups, |g, x| {
                        let better = !seen[g]
                            || (max && x > v[g].as_slice())
                            || (!max && x < v[g].as_slice());
                        if better {
                            v[g].clear();
                            v[g].extend_from_slice(x);
                            seen[g] = true;
                        }
                    })
                }
                Acc::Distinct => {
                    let encoder = ColumnEncoder::new(array).ok_or_else(|| mismatch(plan, batch))?;
                    let buf = &mut self.distinct_buf;
                    let set = &mut self.distinct;
                    for (r, &g) in groups.iter().enumerate() {
                        if g == SKIP || encoder.is_null(r) {
                            continue;
                        }
                        buf.clear();
                        buf.extend_from_slice(&g.to_be_bytes());
                        buf.push(a as u8);
                        encoder.write(r, buf);
                        if !set.contains(&buf[..]) {
                            set.insert(Box::from(&buf[..]));
                        }
                    }
                    Some(())
                }
                Acc::Hll(registers) => visit_hash(array, groups, |g, h| {
                    let start = g * hll::REGISTERS;
                    hll::update(&mut registers[start..start + hll::REGISTERS], h);
                }),
            };
            if ok.is_none() {
                return Err(mismatch(plan, batch));
            }
            if let Some(g) = overflow {
                return Err(AggregateError::Overflow {
                    expr: agg.expr.text.clone(),
                    result_type: agg.field.data_type().to_string(),
                    group: super::output::describe_key(plan, &self.keys[g]),
                });
            }
        }
        Ok(())
    }

    /// The distinct values seen this batch, sorted by group then aggregate:
    /// `(group, aggregate, value key)`.
    pub fn distinct_values(&self) -> Vec<(u32, u8, &[u8])> {
        let mut out: Vec<&[u8]> = self.distinct.iter().map(|b| &b[..]).collect();
        out.sort_unstable();
        out.into_iter()
            .filter_map(|b| {
                let g = u32::from_be_bytes(b.get(..4)?.try_into().ok()?);
                Some((g, *b.get(4)?, b.get(5..)?))
            })
            .collect()
    }

    /// Writes group `g`'s partial aggregates as a state value; `distinct[a]`
    /// is the number of aggregate `a`'s values new to the state.
    pub fn encode(
        &self,
        plan: &Plan,
        g: usize,
        distinct: &[i64],
        out: &mut Vec<u8>,
    ) -> Result<(), AggregateError> {
        out.clear();
        let mut w = ValueWriter(out);
        for (a, (acc, agg)) in self.accs.iter().zip(&plan.aggs).enumerate() {
            match acc {
                Acc::Count(c) => w.i64(c[g]),
                Acc::SumInt { sum, seen } => w.opt_i64(seen[g].then_some(sum[g])),
                Acc::SumFloat { sum, seen } => w.opt_f64(seen[g].then_some(sum[g])),
                Acc::SumDecimal { sum, seen } => {
                    check_decimal(plan, agg, &self.keys[g], sum[g])?;
                    w.opt_i128(seen[g].then_some(sum[g]));
                }
                Acc::AvgFloat { sum, count } => {
                    w.f64(sum[g]);
                    w.i64(count[g]);
                }
                Acc::AvgDecimal { sum, count } => {
                    check_decimal(plan, agg, &self.keys[g], sum[g])?;
                    w.i128(sum[g]);
                    w.i64(count[g]);
                }
                Acc::ExtremeInt { v, seen } => w.opt_i64(seen[g].then_some(v[g])),
                Acc::ExtremeUInt { v, seen } => w.opt_u64(seen[g].then_some(v[g])),
                Acc::ExtremeFloat { v, seen } => w.opt_f64(seen[g].then_some(v[g])),
                Acc::ExtremeDecimal { v, seen } => w.opt_i128(seen[g].then_some(v[g])),
                Acc::ExtremeBytes { v, seen } => w.opt_bytes(seen[g].then_some(&v[g][..])),
                Acc::Distinct => w.i64(distinct.get(a).copied().unwrap_or(0)),
                Acc::Hll(registers) => {
                    let start = g * hll::REGISTERS;
                    w.raw(&registers[start..start + hll::REGISTERS]);
                }
            }
        }
        Ok(())
    }
}

/// A decimal sum must fit its buffer type (Spark's `DECIMAL(p+10, s)`).
fn check_decimal(plan: &Plan, agg: &AggPlan, key: &[u8], v: i128) -> Result<(), AggregateError> {
    let precision = match agg.kind {
        AggKind::SumDecimal { precision, .. } => precision,
        AggKind::AvgDecimal { sum_precision, .. } => sum_precision,
        _ => return Ok(()),
    };
    if super::decimal::fits(v, precision) {
        Ok(())
    } else {
        Err(AggregateError::Overflow {
            expr: agg.expr.text.clone(),
            result_type: format!("Decimal128({precision}, _)"),
            group: super::output::describe_key(plan, key),
        })
    }
}

/// Checks that a batch has the plan's columns, by index, name and type.
pub(super) fn check_input(plan: &Plan, batch: &RecordBatch) -> Result<(), AggregateError> {
    let schema = batch.schema();
    for index in plan.used_columns() {
        let expected = plan.input.field(index);
        let found = schema.fields().get(index);
        let ok = found
            .is_some_and(|f| f.name() == expected.name() && f.data_type() == expected.data_type());
        if !ok {
            return Err(AggregateError::InputMismatch {
                index,
                column: expected.name().clone(),
                data_type: expected.data_type().clone(),
                found: found.map_or_else(|| "<none>".to_owned(), |f| f.name().clone()),
                found_type: found.map_or(DataType::Null, |f| f.data_type().clone()),
            });
        }
    }
    Ok(())
}

/// A batch whose arrays are not what the plan was built for.
fn mismatch(plan: &Plan, batch: &RecordBatch) -> AggregateError {
    check_input(plan, batch)
        .err()
        .unwrap_or_else(|| AggregateError::InputMismatch {
            index: 0,
            column: String::new(),
            data_type: DataType::Null,
            found: "an array of an unexpected physical type".to_owned(),
            found_type: DataType::Null,
        })
}
