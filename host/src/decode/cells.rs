//! Typed columns, written a row at a time by the parsers ([`Rows`]).
//!
//! Whether (and how) a row is emitted is only known at its end: a syntax error at the last
//! byte nulls every field (Spark's PERMISSIVE), Drop/DeadLetter discard the whole row, and a
//! repeated JSON key replaces the earlier value. The parsers nonetheless write each field into
//! its column as soon as it is converted: taking a row back is a cut of each column to the
//! batch's row count, and rows are rarely taken back. Columns are plain `Vec`s turned into Arrow arrays
//! without copying when a batch is cut.
//!
//! The text conversions (integers, exact decimals, floats, booleans) live here too: they are
//! shared by the JSON scanner (string and number tokens) and the CSV splitter (every field).

use std::sync::Arc;

use arrow_array::{
    ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int32Array, Int64Array,
    StringArray, TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray,
    TimestampSecondArray,
};
use arrow_buffer::{BooleanBufferBuilder, Buffer, NullBufferBuilder, OffsetBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType, TimeUnit};

use super::timestamp::{self, DateCache};

/// The column types the decoder supports, with what their conversion needs.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Kind {
    Bool,
    I32,
    I64,
    F64,
    Decimal {
        precision: u8,
        scale: i8,
    },
    Utf8,
    Timestamp {
        unit: TimeUnit,
        tz: Option<Arc<str>>,
    },
    Date32,
}

impl Kind {
    /// Maps an Arrow type to a decoder kind, `None` when unsupported.
    pub(super) fn of(data_type: &DataType) -> Option<Self> {
        Some(match data_type {
            DataType::Boolean => Self::Bool,
            DataType::Int32 => Self::I32,
            DataType::Int64 => Self::I64,
            DataType::Float64 => Self::F64,
            DataType::Decimal128(p, s) if (1..=38).contains(p) && *s >= 0 && (*s as u8) <= *p => {
                Self::Decimal {
                    precision: *p,
                    scale: *s,
                }
            }
            DataType::Utf8 => Self::Utf8,
            DataType::Timestamp(unit, tz) => Self::Timestamp {
                unit: *unit,
                tz: tz.clone(),
            },
            DataType::Date32 => Self::Date32,
            _ => return None,
        })
    }

    /// Spark's SQL name of the type, used in field error messages.
    pub(super) fn sql_name(&self) -> String {
        match self {
            Self::Bool => "BOOLEAN".into(),
            Self::I32 => "INT".into(),
            Self::I64 => "BIGINT".into(),
            Self::F64 => "DOUBLE".into(),
            Self::Decimal { precision, scale } => format!("DECIMAL({precision},{scale})"),
            Self::Utf8 => "STRING".into(),
            Self::Timestamp { .. } => "TIMESTAMP".into(),
            Self::Date32 => "DATE".into(),
        }
    }
}

/// A converted non-string value of one field, on its way into the field's column.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Slot {
    Null,
    Bool(bool),
    I32(i32),
    I64(i64),
    F64(f64),
    I128(i128),
}

/// The output columns of the batch being built, written one row at a time as its fields are
/// parsed, in whatever order the line has them.
///
/// A row's fate is only known at its end (a syntax error at the last byte nulls every field,
/// Drop and DeadLetter leave the row out), so a row can be taken back: every column holds
/// exactly `rows` values before the row and at most one more during it, and
/// [`Rows::discard_row`] cuts them back to `rows`. A repeated JSON key replaces the value
/// its first occurrence wrote. Writing straight into the columns, rather than staging the row
/// first, spares every field a second store and load (the staging pass was 9 % of a
/// JSON → Parquet query's CPU).
#[derive(Debug, Default)]
pub(super) struct Rows {
    columns: Vec<Column>,
    /// Rows complete in every column.
    rows: usize,
    /// Columns written in the current row.
    written: usize,
}

impl Rows {
    pub(super) fn new(columns: Vec<Column>) -> Self {
        Self {
            columns,
            ..Self::default()
        }
    }

    /// Complete rows in the batch being built.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.rows
    }

    /// The column of field `f`, ready for its value of the current row.
    #[inline(always)]
    fn column(&mut self, f: usize) -> &mut Column {
        let column = &mut self.columns[f];
        if column.len > self.rows {
            column.truncate(self.rows);
        } else {
            self.written += 1;
        }
        column
    }

    /// Writes field `f` of the current row.
    #[inline(always)]
    pub(super) fn put(&mut self, f: usize, value: Slot) {
        self.column(f).push_slot(value);
    }

    /// Writes a string (already valid UTF-8) into field `f` of the current row.
    #[inline(always)]
    pub(super) fn put_str(&mut self, f: usize, s: &[u8]) {
        self.column(f).push_str(s);
    }

    /// Completes the current row: the fields it did not write are null.
    #[inline]
    pub(super) fn end_row(&mut self) {
        if self.written != self.columns.len() {
            for column in &mut self.columns {
                if column.len == self.rows {
                    column.push_null();
                }
            }
        }
        self.rows += 1;
        self.written = 0;
    }

    /// Takes back what the current row wrote.
    pub(super) fn discard_row(&mut self) {
        if self.written > 0 {
            for column in &mut self.columns {
                column.truncate(self.rows);
            }
        }
        self.written = 0;
    }

    /// Turns the complete rows into arrays and starts an empty batch (a row in progress is
    /// dropped). Every column starts empty, whatever fails.
    pub(super) fn finish(&mut self) -> Result<Vec<ArrayRef>, ArrowError> {
        self.discard_row();
        self.rows = 0;
        let arrays: Vec<_> = self.columns.iter_mut().map(Column::finish).collect();
        arrays.into_iter().collect()
    }

    /// Drops every row, complete or not, without building arrays of them.
    pub(super) fn clear(&mut self) {
        for column in &mut self.columns {
            column.truncate(0);
        }
        self.rows = 0;
        self.written = 0;
    }
}

#[derive(Debug)]
enum Values {
    Bool(BooleanBufferBuilder),
    I32(Vec<i32>),
    I64(Vec<i64>),
    F64(Vec<f64>),
    I128(Vec<i128>),
    Utf8 { offsets: Vec<i32>, bytes: Vec<u8> },
}

/// The growing values of one output column for the current batch.
#[derive(Debug)]
pub(super) struct Column {
    kind: Kind,
    nulls: NullBufferBuilder,
    values: Values,
    /// Values held (nulls included).
    len: usize,
    /// Rows (and string bytes) to allocate for the next batch: the last batch's, plus an
    /// eighth, at most the capacity the column was made with. Batches of a query are about
    /// the same size (a megabyte of input or `batch_size` rows), and a buffer much larger
    /// than its batch would be held, unused, until the batch is written.
    capacity: usize,
    bytes_capacity: usize,
    max_capacity: usize,
}

impl Column {
    pub(super) fn new(kind: Kind, capacity: usize) -> Self {
        let bytes_capacity = capacity * 16;
        let values = Self::empty_values(&kind, capacity, bytes_capacity);
        Self {
            kind,
            nulls: NullBufferBuilder::new(capacity),
            values,
            len: 0,
            capacity,
            bytes_capacity,
            max_capacity: capacity,
        }
    }

    fn empty_values(kind: &Kind, capacity: usize, bytes_capacity: usize) -> Values {
        match kind {
            Kind::Bool => Values::Bool(BooleanBufferBuilder::new(capacity)),
            Kind::I32 | Kind::Date32 => Values::I32(Vec::with_capacity(capacity)),
            Kind::I64 | Kind::Timestamp { .. } => Values::I64(Vec::with_capacity(capacity)),
            Kind::F64 => Values::F64(Vec::with_capacity(capacity)),
            Kind::Decimal { .. } => Values::I128(Vec::with_capacity(capacity)),
            Kind::Utf8 => {
                let mut offsets = Vec::with_capacity(capacity + 1);
                offsets.push(0);
                Values::Utf8 {
                    offsets,
                    bytes: Vec::with_capacity(bytes_capacity),
                }
            }
        }
    }

    /// Appends a null.
    #[inline]
    pub(super) fn push_null(&mut self) {
        self.nulls.append_null();
        self.len += 1;
        match &mut self.values {
            Values::Bool(v) => v.append(false),
            Values::I32(v) => v.push(0),
            Values::I64(v) => v.push(0),
            Values::F64(v) => v.push(0.0),
            Values::I128(v) => v.push(0),
            Values::Utf8 { offsets, bytes } => offsets.push(bytes.len() as i32),
        }
    }

    /// Appends `n` nulls.
    pub(super) fn push_nulls(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        self.nulls.append_n_nulls(n);
        self.len += n;
        match &mut self.values {
            Values::Bool(v) => v.append_n(n, false),
            Values::I32(v) => v.resize(v.len() + n, 0),
            Values::I64(v) => v.resize(v.len() + n, 0),
            Values::F64(v) => v.resize(v.len() + n, 0.0),
            Values::I128(v) => v.resize(v.len() + n, 0),
            Values::Utf8 { offsets, bytes } => {
                offsets.resize(offsets.len() + n, bytes.len() as i32)
            }
        }
    }

    /// Appends a string (only for Utf8 columns; other kinds get a null).
    ///
    /// The caller keeps the total bytes of a batch below `i32::MAX` (see `Decoder`).
    #[inline(always)]
    pub(super) fn push_str(&mut self, s: &[u8]) {
        if let Values::Utf8 { offsets, bytes } = &mut self.values {
            self.nulls.append_non_null();
            self.len += 1;
            bytes.extend_from_slice(s);
            offsets.push(bytes.len() as i32);
        } else {
            self.push_null();
        }
    }

    /// Appends a converted value. A value of the wrong kind cannot come out of the parsers
    /// (they convert by the column's kind); it would be appended as a null, not panic.
    #[inline(always)]
    fn push_slot(&mut self, value: Slot) {
        match (value, &mut self.values) {
            (Slot::Bool(b), Values::Bool(v)) => v.append(b),
            (Slot::I32(x), Values::I32(v)) => v.push(x),
            (Slot::I64(x), Values::I64(v)) => v.push(x),
            (Slot::F64(x), Values::F64(v)) => v.push(x),
            (Slot::I128(x), Values::I128(v)) => v.push(x),
            _ => return self.push_null(),
        }
        self.nulls.append_non_null();
        self.len += 1;
    }

    /// Keeps the first `len` values (`offsets` of a Utf8 column are never empty, nor negative).
    pub(super) fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        if len == 0 {
            // No bitmap for a batch that may have no null at all.
            self.nulls = NullBufferBuilder::new(self.capacity);
        } else {
            self.nulls.truncate(len);
        }
        self.len = len;
        match &mut self.values {
            Values::Bool(v) => v.truncate(len),
            Values::I32(v) => v.truncate(len),
            Values::I64(v) => v.truncate(len),
            Values::F64(v) => v.truncate(len),
            Values::I128(v) => v.truncate(len),
            Values::Utf8 { offsets, bytes } => {
                offsets.truncate(len + 1);
                bytes.truncate(offsets.last().map_or(0, |&o| o as usize));
            }
        }
    }

    /// Turns the buffered values into an array and starts an empty batch.
    pub(super) fn finish(&mut self) -> Result<ArrayRef, ArrowError> {
        let rows = self.nulls.len();
        self.len = 0;
        let with_slack = |n: usize| n + n / 8;
        self.capacity = with_slack(rows).clamp(1, self.max_capacity);
        if let Values::Utf8 { bytes, .. } = &self.values {
            self.bytes_capacity = with_slack(bytes.len()).max(16);
        }
        let nulls = self.nulls.finish();
        self.nulls = NullBufferBuilder::new(self.capacity);
        let values = std::mem::replace(
            &mut self.values,
            Self::empty_values(&self.kind, self.capacity, self.bytes_capacity),
        );
        let array: ArrayRef = match (values, &self.kind) {
            (Values::Bool(mut v), _) => Arc::new(BooleanArray::new(v.finish(), nulls)),
            (Values::I32(v), Kind::Date32) => Arc::new(Date32Array::new(v.into(), nulls)),
            (Values::I32(v), _) => Arc::new(Int32Array::new(v.into(), nulls)),
            (Values::I64(v), Kind::Timestamp { unit, tz }) => {
                let v = ScalarBuffer::from(v);
                match unit {
                    TimeUnit::Second => {
                        Arc::new(TimestampSecondArray::new(v, nulls).with_timezone_opt(tz.clone()))
                    }
                    TimeUnit::Millisecond => Arc::new(
                        TimestampMillisecondArray::new(v, nulls).with_timezone_opt(tz.clone()),
                    ),
                    TimeUnit::Microsecond => Arc::new(
                        TimestampMicrosecondArray::new(v, nulls).with_timezone_opt(tz.clone()),
                    ),
                    TimeUnit::Nanosecond => Arc::new(
                        TimestampNanosecondArray::new(v, nulls).with_timezone_opt(tz.clone()),
                    ),
                }
            }
            (Values::I64(v), _) => Arc::new(Int64Array::new(v.into(), nulls)),
            (Values::F64(v), _) => Arc::new(Float64Array::new(v.into(), nulls)),
            (Values::I128(v), Kind::Decimal { precision, scale }) => Arc::new(
                Decimal128Array::new(v.into(), nulls)
                    .with_precision_and_scale(*precision, *scale)?,
            ),
            (Values::I128(v), _) => Arc::new(Decimal128Array::new(v.into(), nulls)),
            (Values::Utf8 { offsets, bytes }, _) => Arc::new(StringArray::try_new(
                OffsetBuffer::new(ScalarBuffer::from(offsets)),
                Buffer::from_vec(bytes),
                nulls,
            )?),
        };
        Ok(array)
    }
}

/// Parses an integer with an optional sign (`+` only from CSV; JSON grammar excludes it).
#[inline(always)]
pub(super) fn parse_i64(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() {
        return None;
    }
    // Accumulate negatively so that i64::MIN parses.
    let mut acc: i64 = 0;
    for &b in digits {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        acc = acc.checked_mul(10)?.checked_sub(i64::from(d))?;
    }
    if neg { Some(acc) } else { acc.checked_neg() }
}

/// Parses a float the way Rust does (which accepts every JSON number and `NaN`/`inf`/`infinity`
/// in any case, covering Spark's CSV defaults `NaN`, `Inf`, `-Inf`).
pub(super) fn parse_f64(s: &[u8]) -> Option<f64> {
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// The strings Spark's JSON reader accepts for a float column (`allowNonNumericNumbers`).
pub(super) fn parse_json_f64_string(s: &[u8]) -> Option<f64> {
    match s {
        b"NaN" => Some(f64::NAN),
        b"Infinity" | b"+Infinity" | b"+INF" | b"INF" => Some(f64::INFINITY),
        b"-Infinity" | b"-INF" => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

/// Parses a decimal number exactly into an unscaled `i128` of `scale`, `None` when it is not a
/// number or does not fit `precision`.
///
/// Accepts what `java.math.BigDecimal` accepts after Spark removes `,` (its US-locale decimal
/// parser): `[+-]digits[.digits][e[+-]digits]`, also `.5` and `5.`. Extra fractional digits
/// are rounded half-up (away from zero on a tie), as Spark's cast does.
pub(super) fn parse_decimal(s: &[u8], precision: u8, scale: i8) -> Option<i128> {
    if let Some(v) = parse_decimal_short(s, scale) {
        return (v.unsigned_abs() < POW10[usize::from(precision).min(38)].unsigned_abs())
            .then_some(v);
    }
    // Pass 1: validate and measure.
    let mut i = 0;
    let neg = match s.first()? {
        b'-' => {
            i = 1;
            true
        }
        b'+' => {
            i = 1;
            false
        }
        _ => false,
    };
    let mut n_int = 0i64;
    let mut n_frac = 0i64;
    let mut seen_dot = false;
    let mut exp_at = s.len();
    while i < s.len() {
        match s[i] {
            b'0'..=b'9' if seen_dot => n_frac += 1,
            b'0'..=b'9' => n_int += 1,
            b'.' if !seen_dot => seen_dot = true,
            b',' => {}
            b'e' | b'E' => {
                exp_at = i;
                break;
            }
            _ => return None,
        }
        i += 1;
    }
    if n_int + n_frac == 0 {
        return None;
    }
    let mut exp = 0i64;
    if exp_at < s.len() {
        let e = &s[exp_at + 1..];
        let (eneg, edigits) = match e.first()? {
            b'-' => (true, &e[1..]),
            b'+' => (false, &e[1..]),
            _ => (false, e),
        };
        if edigits.is_empty() {
            return None;
        }
        for &b in edigits {
            let d = b.wrapping_sub(b'0');
            if d > 9 {
                return None;
            }
            // Saturate: any exponent this large means overflow or zero anyway.
            exp = (exp * 10 + i64::from(d)).min(1_000_000);
        }
        if eneg {
            exp = -exp;
        }
    }
    // value = D * 10^(exp - n_frac); we want round(D * 10^shift).
    let shift = i64::from(scale) - n_frac + exp;
    let total = n_int + n_frac;
    let keep = if shift < 0 { total + shift } else { total };
    // Pass 2: accumulate the kept digits; the next one decides the rounding.
    let mut acc: i128 = 0;
    let mut index = 0i64;
    let mut round_up = false;
    for &b in &s[..exp_at] {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            continue; // sign, '.', ','
        }
        if index < keep {
            acc = acc.checked_mul(10)?.checked_add(i128::from(d))?;
        } else {
            // Only the first dropped digit matters for half-up; when `keep` is negative the
            // value is below half a unit and rounds to zero.
            round_up = index == keep && d >= 5;
            break;
        }
        index += 1;
    }
    if round_up {
        acc += 1;
    }
    if shift > 0 && acc != 0 {
        let shift = u32::try_from(shift).ok().filter(|s| *s <= 38)?;
        acc = acc.checked_mul(10i128.checked_pow(shift)?)?;
    }
    if acc >= POW10[usize::from(precision).min(38)] {
        return None;
    }
    Some(if neg { -acc } else { acc })
}

/// `10^i` for every precision and scale a decimal column can have (0..=38).
const POW10: [i128; 39] = {
    let mut t = [1i128; 39];
    let mut i = 1;
    while i < 39 {
        t[i] = t[i - 1] * 10;
        i += 1;
    }
    t
};

/// The common case of [`parse_decimal`] in one pass: `[-]digits[.digits]` in at most 19
/// bytes (so the digits fit a `u64`), no more fractional digits than `scale`. `None` means
/// "use the general path" (which also reports errors).
#[inline]
fn parse_decimal_short(s: &[u8], scale: i8) -> Option<i128> {
    let (neg, digits) = match s.first()? {
        b'-' => (true, &s[1..]),
        _ => (false, s),
    };
    if digits.len() > 19 {
        return None;
    }
    let mut acc: u64 = 0;
    let mut dot = None;
    for (i, &b) in digits.iter().enumerate() {
        let d = b.wrapping_sub(b'0');
        if d <= 9 {
            acc = acc * 10 + u64::from(d);
        } else if b == b'.' && dot.is_none() {
            dot = Some(i);
        } else {
            return None;
        }
    }
    let (n_digits, frac) = match dot {
        None => (digits.len(), 0),
        Some(at) => (digits.len() - 1, digits.len() - 1 - at),
    };
    let scale = usize::try_from(scale).ok()?;
    if n_digits == 0 || frac > scale {
        return None;
    }
    let v = i128::from(acc).checked_mul(*POW10.get(scale - frac)?)?;
    Some(if neg { -v } else { v })
}

/// A decimal from the digits of a number without an exponent (at most 19 of them, `frac`
/// after the point), `None` when it has more fractional digits than `scale` (it needs
/// rounding: [`parse_decimal`] does that) or does not fit `precision`.
#[inline(always)]
pub(super) fn decimal_from_digits(
    mantissa: u64,
    frac: usize,
    neg: bool,
    precision: u8,
    scale: i8,
) -> Option<i128> {
    let scale = usize::try_from(scale).ok()?;
    if frac > scale {
        return None;
    }
    let shift = scale - frac;
    // In 64 bits when the scaled digits fit (amounts and prices always do): a 128-bit
    // multiply with an overflow check was most of this function's time.
    let v = match POW10_U64.get(shift).and_then(|&p| mantissa.checked_mul(p)) {
        Some(v) => i128::from(v),
        None => i128::from(mantissa).checked_mul(*POW10.get(shift)?)?,
    };
    if v >= POW10[usize::from(precision).min(38)] {
        return None;
    }
    Some(if neg { -v } else { v })
}

/// `10^i` for every power that fits a `u64` (0..=19).
pub(super) const POW10_U64: [u64; 20] = {
    let mut t = [1u64; 20];
    let mut i = 1;
    while i < 20 {
        t[i] = t[i - 1] * 10;
        i += 1;
    }
    t
};

/// Spark's CSV boolean: `true` / `false` in any case.
pub(super) fn parse_bool_text(s: &[u8]) -> Option<bool> {
    if s.eq_ignore_ascii_case(b"true") {
        Some(true)
    } else if s.eq_ignore_ascii_case(b"false") {
        Some(false)
    } else {
        None
    }
}

/// Converts a text value (a JSON string's contents or a CSV field) for a non-Utf8 column.
///
/// `json` selects Spark's JSON rules, which refuse strings for integer, boolean and (except
/// NaN/Infinity) float columns; CSV parses every type from text.
pub(super) fn convert_text(
    kind: &Kind,
    s: &[u8],
    json: bool,
    dates: &mut DateCache,
) -> Option<Slot> {
    Some(match kind {
        Kind::Bool if !json => Slot::Bool(parse_bool_text(s)?),
        Kind::I32 if !json => Slot::I32(i32::try_from(parse_i64(s)?).ok()?),
        Kind::I64 if !json => Slot::I64(parse_i64(s)?),
        Kind::F64 if json => Slot::F64(parse_json_f64_string(s)?),
        Kind::F64 => Slot::F64(parse_f64(s)?),
        Kind::Decimal { precision, scale } => Slot::I128(parse_decimal(s, *precision, *scale)?),
        Kind::Timestamp { unit, .. } => {
            let (secs, nanos) = timestamp::parse_timestamp(s, dates)?;
            Slot::I64(timestamp::to_unit(secs, nanos, *unit)?)
        }
        Kind::Date32 => Slot::I32(timestamp::parse_date(s, dates)?),
        Kind::Bool | Kind::I32 | Kind::I64 | Kind::Utf8 => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(s: &str, p: u8, sc: i8) -> Option<i128> {
        parse_decimal(s.as_bytes(), p, sc)
    }

    #[test]
    fn decimals_exact_and_rounded() {
        assert_eq!(dec("23.90", 12, 2), Some(2390));
        assert_eq!(dec("5", 12, 2), Some(500));
        assert_eq!(dec("-0.01", 12, 2), Some(-1));
        assert_eq!(dec("0.005", 12, 2), Some(1)); // half-up
        assert_eq!(dec("0.0049999", 12, 2), Some(0));
        assert_eq!(dec("-2.345", 12, 2), Some(-235)); // away from zero
        assert_eq!(dec("2.3449", 12, 2), Some(234));
        assert_eq!(dec("2.39e1", 12, 2), Some(2390));
        assert_eq!(dec("239E-2", 12, 2), Some(239));
        assert_eq!(dec("1e-9", 12, 2), Some(0));
        assert_eq!(dec("0.000", 12, 2), Some(0));
        assert_eq!(dec("1,234.5", 12, 2), Some(123_450));
        assert_eq!(dec(".5", 12, 2), Some(50));
        assert_eq!(dec("+5.", 12, 2), Some(500));
        assert_eq!(dec("9999999999.99", 12, 2), Some(999_999_999_999));
        assert_eq!(dec("9999999999.995", 12, 2), None); // rounds up past the precision
        assert_eq!(dec("10000000000", 12, 2), None);
        assert_eq!(dec("1e400", 12, 2), None);
        assert_eq!(dec("0e400", 12, 2), Some(0));
        assert_eq!(
            dec("12345678901234567890123456789012345678", 38, 0),
            Some(12_345_678_901_234_567_890_123_456_789_012_345_678)
        );
        assert_eq!(dec("123456789012345678901234567890123456789", 38, 0), None);
        assert_eq!(
            dec(
                "0.00000000000000000000000000000000000000000000012345",
                38,
                2
            ),
            Some(0)
        );
        for bad in [
            "N/A", "", "-", ".", "1.2.3", "1e", "1e+", " 1", "1 ", "0x10", "1-",
        ] {
            assert_eq!(dec(bad, 12, 2), None, "{bad}");
        }
    }

    /// Digits scaled in 64 bits where the product fits and in 128 where it does not (scales
    /// past 19 digits, nineteen nines scaled up) give the decimal the text parser gives, on
    /// both sides of the precision.
    #[test]
    fn decimals_from_digits_agree_with_the_text() {
        for (digits, frac) in [
            ("1400", 2),
            ("0", 0),
            ("9999999999999999999", 0),
            ("18446744073", 0),
            ("1844674407", 0),
            ("12345", 3),
            ("9999999999999999999", 19),
        ] {
            let mantissa: u64 = digits.parse().unwrap();
            let text = if frac == 0 {
                digits.to_owned()
            } else {
                let (int, fr) = digits.split_at(digits.len() - frac);
                format!("{int}.{fr}")
            };
            for (precision, scale) in [(12, 2), (18, 0), (19, 9), (38, 9), (38, 20), (38, 38)] {
                for neg in [false, true] {
                    let want = parse_decimal(
                        format!("{}{text}", if neg { "-" } else { "" }).as_bytes(),
                        precision,
                        scale,
                    );
                    let got = decimal_from_digits(mantissa, frac, neg, precision, scale);
                    // Fewer digits after the point than the scale: the two agree exactly;
                    // more need rounding, which only the text parser does.
                    if frac <= scale as usize {
                        assert_eq!(got, want, "{text} as ({precision},{scale})");
                    } else {
                        assert_eq!(got, None, "{text} as ({precision},{scale})");
                    }
                }
            }
        }
    }

    #[test]
    fn integers_and_floats() {
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
        assert_eq!(parse_i64(b"+12"), Some(12));
        assert_eq!(parse_i64(b"1.0"), None);
        assert_eq!(parse_i64(b"-"), None);
        assert_eq!(parse_f64(b"1.5e3"), Some(1500.0));
        assert!(parse_f64(b"NaN").is_some_and(f64::is_nan));
        assert_eq!(parse_f64(b"-Inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_json_f64_string(b"1.5"), None);
        assert_eq!(parse_bool_text(b"TRUE"), Some(true));
        assert_eq!(parse_bool_text(b"yes"), None);
    }
}
