//! The state value of a group: every aggregate's buffer, back to back, and
//! how two of them merge (Spark's `mergeExpressions`).
//!
//! Why it exists: a batch's partial aggregate and the state's value of the
//! same group have the same layout, so merging is one pass over two byte
//! strings, whatever the aggregates; session windows merge several state
//! values the same way. Layout per aggregate (integers little-endian; a
//! nullable buffer starts with a flag byte, 0 = null):
//!
//! ```text
//! count(*), count(col), count(DISTINCT)    i64
//! sum of integers / doubles / decimals     flag ‖ i64 / f64 / i128
//! avg of numbers / decimals                f64 / i128 sum ‖ i64 count
//! min, max                                 flag ‖ i64 / u64 / f64 / i128, or flag ‖ u32 len ‖ bytes
//! approx_count_distinct                    512 registers, one byte each
//! ```

use std::cmp::Ordering;

use super::decimal;
use super::hll;
use super::plan::{AggKind, Plan, Shape};

/// Spark's ordering of doubles: NaN above everything, `-0.0 == 0.0`.
pub(super) fn float_cmp(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// Appends buffers to a value.
#[derive(Debug)]
pub(super) struct ValueWriter<'a>(pub &'a mut Vec<u8>);

impl ValueWriter<'_> {
    pub fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    pub fn f64(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_bits().to_le_bytes());
    }

    pub fn i128(&mut self, v: i128) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    pub fn raw(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    fn flag(&mut self, present: bool) {
        self.0.push(u8::from(present));
    }

    pub fn opt_i64(&mut self, v: Option<i64>) {
        self.flag(v.is_some());
        self.i64(v.unwrap_or(0));
    }

    pub fn opt_u64(&mut self, v: Option<u64>) {
        self.flag(v.is_some());
        self.0.extend_from_slice(&v.unwrap_or(0).to_le_bytes());
    }

    pub fn opt_f64(&mut self, v: Option<f64>) {
        self.flag(v.is_some());
        self.f64(v.unwrap_or(0.0));
    }

    pub fn opt_i128(&mut self, v: Option<i128>) {
        self.flag(v.is_some());
        self.i128(v.unwrap_or(0));
    }

    pub fn opt_bytes(&mut self, v: Option<&[u8]>) {
        self.flag(v.is_some());
        if let Some(b) = v {
            // Values come from Arrow arrays, whose offsets are at most i64;
            // a single string over 4 GiB is not a realistic extreme.
            self.0
                .extend_from_slice(&u32::try_from(b.len()).unwrap_or(u32::MAX).to_le_bytes());
            self.0.extend_from_slice(b);
        }
    }
}

/// A value that does not parse with the plan's layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Truncated;

/// Reads buffers from a value.
#[derive(Debug)]
pub(super) struct ValueReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> ValueReader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        let end = self.pos.checked_add(n).ok_or(Truncated)?;
        let out = self.bytes.get(self.pos..end).ok_or(Truncated)?;
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Truncated> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    pub fn i64(&mut self) -> Result<i64, Truncated> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64, Truncated> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub fn f64(&mut self) -> Result<f64, Truncated> {
        Ok(f64::from_bits(u64::from_le_bytes(self.array()?)))
    }

    pub fn i128(&mut self) -> Result<i128, Truncated> {
        Ok(i128::from_le_bytes(self.array()?))
    }

    pub fn raw(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        self.take(n)
    }

    fn flag(&mut self) -> Result<bool, Truncated> {
        Ok(self.take(1)?[0] != 0)
    }

    pub fn opt_i64(&mut self) -> Result<Option<i64>, Truncated> {
        let present = self.flag()?;
        let v = self.i64()?;
        Ok(present.then_some(v))
    }

    pub fn opt_u64(&mut self) -> Result<Option<u64>, Truncated> {
        let present = self.flag()?;
        let v = self.u64()?;
        Ok(present.then_some(v))
    }

    pub fn opt_f64(&mut self) -> Result<Option<f64>, Truncated> {
        let present = self.flag()?;
        let v = self.f64()?;
        Ok(present.then_some(v))
    }

    pub fn opt_i128(&mut self) -> Result<Option<i128>, Truncated> {
        let present = self.flag()?;
        let v = self.i128()?;
        Ok(present.then_some(v))
    }

    pub fn opt_bytes(&mut self) -> Result<Option<&'a [u8]>, Truncated> {
        if !self.flag()? {
            return Ok(None);
        }
        let len = u32::from_le_bytes(self.array()?) as usize;
        self.take(len).map(Some)
    }

    pub fn is_done(&self) -> bool {
        self.pos == self.bytes.len()
    }
}

/// Why two values could not be merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum MergeError {
    /// A value does not parse with the plan's layout.
    Corrupt,
    /// Aggregate `index` overflowed its result type.
    Overflow { index: usize },
}

impl From<Truncated> for MergeError {
    fn from(_: Truncated) -> Self {
        Self::Corrupt
    }
}

fn pick<T>(a: Option<T>, b: Option<T>, take_b: impl Fn(&T, &T) -> bool) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if take_b(&a, &b) { b } else { a }),
        (a, None) => a,
        (None, b) => b,
    }
}

/// Merges value `b` into value `a` (state first, as Spark's
/// `buffer.left op buffer.right`), writing the result to `out`.
pub(super) fn merge(plan: &Plan, a: &[u8], b: &[u8], out: &mut Vec<u8>) -> Result<(), MergeError> {
    out.clear();
    let (mut ra, mut rb) = (ValueReader::new(a), ValueReader::new(b));
    let mut w = ValueWriter(out);
    for (index, agg) in plan.aggs.iter().enumerate() {
        let overflow = MergeError::Overflow { index };
        match agg.kind {
            AggKind::CountAll | AggKind::Count | AggKind::CountDistinct => {
                let v = ra.i64()?.checked_add(rb.i64()?).ok_or(overflow)?;
                w.i64(v);
            }
            AggKind::ApproxCountDistinct => {
                let mut registers = ra.raw(hll::REGISTERS)?.to_vec();
                hll::merge(&mut registers, rb.raw(hll::REGISTERS)?);
                w.raw(&registers);
            }
            AggKind::SumInt => {
                let v = match (ra.opt_i64()?, rb.opt_i64()?) {
                    (Some(x), Some(y)) => Some(x.checked_add(y).ok_or(overflow)?),
                    (x, y) => x.or(y),
                };
                w.opt_i64(v);
            }
            AggKind::SumFloat => {
                let v = match (ra.opt_f64()?, rb.opt_f64()?) {
                    (Some(x), Some(y)) => Some(x + y),
                    (x, y) => x.or(y),
                };
                w.opt_f64(v);
            }
            AggKind::SumDecimal { precision, .. } => {
                let v = match (ra.opt_i128()?, rb.opt_i128()?) {
                    (Some(x), Some(y)) => {
                        let s = x.checked_add(y).ok_or(overflow.clone())?;
                        if !decimal::fits(s, precision) {
                            return Err(overflow);
                        }
                        Some(s)
                    }
                    (x, y) => x.or(y),
                };
                w.opt_i128(v);
            }
            AggKind::AvgFloat => {
                let sum = ra.f64()? + rb.f64()?;
                let count = ra.i64()?.checked_add(rb.i64()?).ok_or(overflow)?;
                w.f64(sum);
                w.i64(count);
            }
            AggKind::AvgDecimal { sum_precision, .. } => {
                let sum = ra.i128()?.checked_add(rb.i128()?).ok_or(overflow.clone())?;
                if !decimal::fits(sum, sum_precision) {
                    return Err(overflow);
                }
                let count = ra.i64()?.checked_add(rb.i64()?).ok_or(overflow)?;
                w.i128(sum);
                w.i64(count);
            }
            AggKind::Min(shape) | AggKind::Max(shape) => {
                let max = matches!(agg.kind, AggKind::Max(_));
                let better = |o: Ordering| if max { o.is_gt() } else { o.is_lt() };
                match shape {
                    Shape::Int => {
                        w.opt_i64(pick(ra.opt_i64()?, rb.opt_i64()?, |x, y| better(y.cmp(x))))
                    }
                    Shape::UInt => {
                        w.opt_u64(pick(ra.opt_u64()?, rb.opt_u64()?, |x, y| better(y.cmp(x))))
                    }
                    Shape::Float => w.opt_f64(pick(ra.opt_f64()?, rb.opt_f64()?, |x, y| {
                        better(float_cmp(*y, *x))
                    })),
                    Shape::Decimal => w.opt_i128(pick(ra.opt_i128()?, rb.opt_i128()?, |x, y| {
                        better(y.cmp(x))
                    })),
                    Shape::Bytes => w.opt_bytes(pick(ra.opt_bytes()?, rb.opt_bytes()?, |x, y| {
                        better(y.cmp(x))
                    })),
                }
            }
        }
    }
    if ra.is_done() && rb.is_done() {
        Ok(())
    } else {
        Err(MergeError::Corrupt)
    }
}
