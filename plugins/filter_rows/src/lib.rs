//! Keeps the rows whose column compares true against a literal: Weir's benchmark transform, and
//! the example of a fast plugin. It pulls the one column it reads, compiles the comparison once
//! at `open` into a typed literal (so no row is parsed or allocated), and returns a bit mask that
//! the host applies natively to the other columns.
//!
//! Config: `{ "column": "status", "op": "eq", "value": "completed" }` with `op` one of `eq`, `ne`,
//! `gt`, `ge`, `lt`, `le`, `in` (`value` an array), `is_null`, `not_null` (no `value`). A null never
//! compares true (so `ne` does not keep nulls), as in SQL.
//!
//! Literals by column type: utf8 a string (compared bytewise, i.e. by code point); int32/int64 an
//! integer; float64 a number; decimal128 a number or a string, compared exactly at the column's
//! scale; boolean `true`/`false`; timestamp an RFC 3339 string or integer microseconds; date a
//! `YYYY-MM-DD` string or integer days.

use serde::Deserialize;
use weir_plugin_sdk::text::{parse_date32, parse_decimal, parse_timestamp_micros};
use weir_plugin_sdk::{
    Batch, BatchInfo, Bitmap, Column, DataType, Output, PluginError, Schema, Selection, Transform,
    Values,
};

/// The plugin's `config`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The column to test.
    pub column: String,
    /// The comparison.
    pub op: Op,
    /// The literal (an array for `in`; absent for `is_null` / `not_null`).
    #[serde(default)]
    pub value: Option<Literal>,
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `column = value`
    Eq,
    /// `column <> value`
    Ne,
    /// `column > value`
    Gt,
    /// `column >= value`
    Ge,
    /// `column < value`
    Lt,
    /// `column <= value`
    Le,
    /// `column IN (values...)`
    In,
    /// `column IS NULL`
    IsNull,
    /// `column IS NOT NULL`
    NotNull,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Eq => "eq",
            Self::Ne => "ne",
            Self::Gt => "gt",
            Self::Ge => "ge",
            Self::Lt => "lt",
            Self::Le => "le",
            Self::In => "in",
            Self::IsNull => "is_null",
            Self::NotNull => "not_null",
        })
    }
}

/// A literal as JSON gives it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Literal {
    /// `true` / `false`
    Bool(bool),
    /// An integer that fits `i64`.
    Int(i64),
    /// Any other number.
    Float(f64),
    /// A string.
    Str(String),
    /// An array (for `in`).
    List(Vec<Literal>),
}

impl std::fmt::Display for Literal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bool(b) => write!(f, "{b}"),
            Self::Int(i) => write!(f, "{i}"),
            Self::Float(x) => write!(f, "{x}"),
            Self::Str(s) => write!(f, "{s:?}"),
            Self::List(l) => write!(f, "an array of {}", l.len()),
        }
    }
}

/// A scalar comparison (everything but `in` and the null tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmp {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

/// The test compiled for the column's type: one variant per layout, so the per-row loop is a
/// single typed comparison.
#[derive(Debug, Clone, PartialEq)]
enum Predicate {
    IsNull,
    NotNull,
    Utf8(Cmp, Vec<u8>),
    Utf8In(Vec<Vec<u8>>),
    Int(Cmp, i64),
    IntIn(Vec<i64>),
    Float(Cmp, f64),
    FloatIn(Vec<f64>),
    Decimal(Cmp, i128),
    DecimalIn(Vec<i128>),
    Bool(Cmp, bool),
    BoolIn(Vec<bool>),
}

/// The transform.
#[derive(Debug)]
pub struct FilterRows {
    column: String,
    data_type: DataType,
    predicate: Predicate,
}

impl Transform for FilterRows {
    type Config = Config;

    fn new(config: Config, input: &Schema) -> Result<Self, PluginError> {
        let field = input.field(&config.column).ok_or_else(|| {
            PluginError::invalid_input(format!(
                "filter_rows: the input has no column `{}`",
                config.column
            ))
        })?;
        let predicate = compile(&config, field.data_type)?;
        Ok(Self {
            column: config.column,
            data_type: field.data_type,
            predicate,
        })
    }

    fn process(&mut self, batch: &Batch<'_>, _info: &BatchInfo) -> Result<Output, PluginError> {
        let column = batch.column(&self.column)?;
        if column.data_type != self.data_type {
            return Err(PluginError::invalid_input(format!(
                "filter_rows: column `{}` is {}, it was {} when the plugin opened",
                self.column, column.data_type, self.data_type
            )));
        }
        Ok(Output::keep(Selection::mask(self.mask(&column)?)))
    }
}

impl FilterRows {
    /// One bit per row of `column`: whether the row passes.
    fn mask(&self, column: &Column) -> Result<Bitmap, PluginError> {
        let rows = column.len();
        let validity = column.validity.as_ref();
        let bits = match (&self.predicate, &column.values) {
            (Predicate::IsNull, _) => {
                return Ok(match validity {
                    Some(v) => Bitmap::from_fn(rows, |i| !v.get(i)),
                    None => Bitmap::new_zeroed(rows),
                });
            }
            (Predicate::NotNull, _) => {
                return Ok(validity.cloned().unwrap_or_else(|| Bitmap::new_set(rows)));
            }
            (Predicate::Utf8(cmp, lit), Values::Utf8 { offsets, data }) => {
                let lit = lit.as_slice();
                match cmp {
                    Cmp::Eq => utf8_eq_mask(offsets, data, lit, true),
                    Cmp::Ne => utf8_eq_mask(offsets, data, lit, false),
                    Cmp::Gt => utf8_mask(offsets, data, |s| s > lit),
                    Cmp::Ge => utf8_mask(offsets, data, |s| s >= lit),
                    Cmp::Lt => utf8_mask(offsets, data, |s| s < lit),
                    Cmp::Le => utf8_mask(offsets, data, |s| s <= lit),
                }
            }
            (Predicate::Utf8In(set), Values::Utf8 { offsets, data }) => {
                utf8_mask(offsets, data, |s| set.iter().any(|v| v.as_slice() == s))
            }
            (Predicate::Int(cmp, lit), Values::Int64(v) | Values::TimestampMicros(v)) => {
                cmp_mask(v, *cmp, *lit)
            }
            (Predicate::Int(cmp, lit), Values::Int32(v) | Values::Date32(v)) => {
                match i32::try_from(*lit) {
                    Ok(lit) => cmp_mask(v, *cmp, lit),
                    Err(_) => slice_mask(v, |x| compare(*cmp, &i64::from(x), lit)),
                }
            }
            (Predicate::IntIn(set), Values::Int64(v) | Values::TimestampMicros(v)) => {
                slice_mask(v, |x| set.contains(&x))
            }
            (Predicate::IntIn(set), Values::Int32(v) | Values::Date32(v)) => {
                slice_mask(v, |x| set.contains(&i64::from(x)))
            }
            (Predicate::Float(cmp, lit), Values::Float64(v)) => cmp_mask(v, *cmp, *lit),
            (Predicate::FloatIn(set), Values::Float64(v)) => slice_mask(v, |x| set.contains(&x)),
            (Predicate::Decimal(cmp, lit), Values::Decimal128(v)) => cmp_mask(v, *cmp, *lit),
            (Predicate::DecimalIn(set), Values::Decimal128(v)) => {
                slice_mask(v, |x| set.contains(&x))
            }
            (Predicate::Bool(cmp, lit), Values::Boolean(b)) => {
                Bitmap::from_fn(rows, |i| compare(*cmp, &b.get(i), lit))
            }
            (Predicate::BoolIn(set), Values::Boolean(b)) => {
                Bitmap::from_fn(rows, |i| set.contains(&b.get(i)))
            }
            _ => {
                return Err(PluginError::invalid_input(format!(
                    "filter_rows: column `{}` holds values that do not match its type {}",
                    self.column, column.data_type
                )));
            }
        };
        // A null never compares true: clear its bit, a byte at a time.
        Ok(match validity {
            Some(v) => bits.and(v),
            None => bits,
        })
    }
}

#[inline(always)]
fn compare<T: PartialOrd + ?Sized>(cmp: Cmp, a: &T, b: &T) -> bool {
    match cmp {
        Cmp::Eq => a == b,
        Cmp::Ne => a != b,
        Cmp::Gt => a > b,
        Cmp::Ge => a >= b,
        Cmp::Lt => a < b,
        Cmp::Le => a <= b,
    }
}

/// Packs `keep(x)` for every value, eight values per byte, with no per-bit bounds checks.
#[inline(always)]
fn slice_mask<T: Copy>(values: &[T], keep: impl Fn(T) -> bool) -> Bitmap {
    let mut bytes = Vec::with_capacity(values.len().div_ceil(8));
    let chunks = values.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        let mut byte = 0u8;
        for (bit, &x) in chunk.iter().enumerate() {
            byte |= u8::from(keep(x)) << bit;
        }
        bytes.push(byte);
    }
    if !rest.is_empty() {
        let mut byte = 0u8;
        for (bit, &x) in rest.iter().enumerate() {
            byte |= u8::from(keep(x)) << bit;
        }
        bytes.push(byte);
    }
    Bitmap::from_bytes(bytes, values.len())
}

/// [`slice_mask`] with the comparison chosen outside the loop, so each loop is one instruction
/// pattern the compiler can vectorise.
fn cmp_mask<T: Copy + PartialOrd>(values: &[T], cmp: Cmp, lit: T) -> Bitmap {
    match cmp {
        Cmp::Eq => slice_mask(values, |x| x == lit),
        Cmp::Ne => slice_mask(values, |x| x != lit),
        Cmp::Gt => slice_mask(values, |x| x > lit),
        Cmp::Ge => slice_mask(values, |x| x >= lit),
        Cmp::Lt => slice_mask(values, |x| x < lit),
        Cmp::Le => slice_mask(values, |x| x <= lit),
    }
}

/// The bytes of string `i`. Offsets from the host are ascending and inside `data` (Arrow's
/// invariant); a broken pair reads as an empty string rather than panicking.
#[inline(always)]
fn value_at<'d>(offsets: &[i32], data: &'d [u8], i: usize) -> &'d [u8] {
    // A negative offset wraps to a huge usize, which `get` then rejects.
    #[allow(
        clippy::cast_sign_loss,
        reason = "negative offsets are rejected by `get`"
    )]
    let (start, end) = (offsets[i] as usize, offsets[i + 1] as usize);
    data.get(start..end).unwrap_or_default()
}

/// Packs `keep(i)` for rows `0..rows`, eight rows per mask byte.
#[inline(always)]
fn pack_rows(rows: usize, keep: impl Fn(usize) -> bool) -> Bitmap {
    let mut bytes = Vec::with_capacity(rows.div_ceil(8));
    let mut base = 0;
    while base < rows {
        let n = (rows - base).min(8);
        let mut byte = 0u8;
        for bit in 0..n {
            byte |= u8::from(keep(base + bit)) << bit;
        }
        bytes.push(byte);
        base += n;
    }
    Bitmap::from_bytes(bytes, rows)
}

/// One bit per string: `keep` sees each value's bytes in place.
#[inline(always)]
fn utf8_mask(offsets: &[i32], data: &[u8], keep: impl Fn(&[u8]) -> bool) -> Bitmap {
    let rows = offsets.len().saturating_sub(1);
    pack_rows(rows, |i| keep(value_at(offsets, data, i)))
}

/// `eq` (or `ne` when `equal` is false) on strings: the lengths come from the offsets, so most
/// rows are decided without touching their bytes.
fn utf8_eq_mask(offsets: &[i32], data: &[u8], lit: &[u8], equal: bool) -> Bitmap {
    let rows = offsets.len().saturating_sub(1);
    let len = i64::try_from(lit.len()).unwrap_or(i64::MAX);
    pack_rows(rows, |i| {
        let same_len = i64::from(offsets[i + 1]) - i64::from(offsets[i]) == len;
        (same_len && bytes_eq(value_at(offsets, data, i), lit)) == equal
    })
}

/// Equality of two byte strings, inlined for short ones (two overlapping word compares instead
/// of a `memcmp` call per row, which dominates a filter on short strings).
#[inline(always)]
fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    fn word8(s: &[u8], at: usize) -> u64 {
        s.get(at..at + 8)
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map_or(0, u64::from_ne_bytes)
    }
    fn word4(s: &[u8], at: usize) -> u32 {
        s.get(at..at + 4)
            .and_then(|w| <[u8; 4]>::try_from(w).ok())
            .map_or(0, u32::from_ne_bytes)
    }
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n {
        8..=16 => word8(a, 0) == word8(b, 0) && word8(a, n - 8) == word8(b, n - 8),
        4..=7 => word4(a, 0) == word4(b, 0) && word4(a, n - 4) == word4(b, n - 4),
        0..=3 => a.iter().zip(b).all(|(x, y)| x == y),
        _ => a == b,
    }
}

fn compile(config: &Config, data_type: DataType) -> Result<Predicate, PluginError> {
    let column = &config.column;
    let cmp = match config.op {
        Op::IsNull | Op::NotNull => {
            if let Some(value) = &config.value {
                return Err(PluginError::invalid_config(format!(
                    "filter_rows: op `{}` takes no value, got {value}",
                    config.op
                )));
            }
            return Ok(if config.op == Op::IsNull {
                Predicate::IsNull
            } else {
                Predicate::NotNull
            });
        }
        Op::In => None,
        Op::Eq => Some(Cmp::Eq),
        Op::Ne => Some(Cmp::Ne),
        Op::Gt => Some(Cmp::Gt),
        Op::Ge => Some(Cmp::Ge),
        Op::Lt => Some(Cmp::Lt),
        Op::Le => Some(Cmp::Le),
    };
    let value = config.value.as_ref().ok_or_else(|| {
        PluginError::invalid_config(format!("filter_rows: op `{}` needs a `value`", config.op))
    })?;
    let literals: Vec<&Literal> = match (cmp, value) {
        (None, Literal::List(items)) => items.iter().collect(),
        (None, other) => {
            return Err(PluginError::invalid_config(format!(
                "filter_rows: op `in` needs an array `value`, got {other}"
            )));
        }
        (Some(_), Literal::List(_)) => {
            return Err(PluginError::invalid_config(format!(
                "filter_rows: op `{}` needs a single `value`, got an array",
                config.op
            )));
        }
        (Some(_), scalar) => vec![scalar],
    };
    macro_rules! typed {
        ($convert:expr, $single:path, $set:path) => {{
            let values = literals
                .iter()
                .map(|l| $convert(l))
                .collect::<Result<Vec<_>, PluginError>>()?;
            match cmp {
                Some(cmp) => $single(cmp, values.into_iter().next().unwrap_or_default()),
                None => $set(values),
            }
        }};
    }
    let mismatch = |l: &Literal| {
        PluginError::invalid_config(format!(
            "filter_rows: value {l} does not fit column `{column}` of type {data_type}"
        ))
    };
    let predicate = match data_type {
        DataType::Utf8 => typed!(
            |l: &Literal| match l {
                Literal::Str(s) => Ok(s.as_bytes().to_vec()),
                other => Err(mismatch(other)),
            },
            Predicate::Utf8,
            Predicate::Utf8In
        ),
        DataType::Int32 | DataType::Int64 => typed!(
            |l: &Literal| match l {
                Literal::Int(i) => Ok(*i),
                other => Err(mismatch(other)),
            },
            Predicate::Int,
            Predicate::IntIn
        ),
        DataType::Float64 => typed!(
            |l: &Literal| match l {
                // i64 → f64 is the closest float, which is what comparing a float column to an
                // integer literal means.
                #[allow(clippy::cast_precision_loss, reason = "nearest float is intended")]
                Literal::Int(i) => Ok(*i as f64),
                Literal::Float(x) => Ok(*x),
                other => Err(mismatch(other)),
            },
            Predicate::Float,
            Predicate::FloatIn
        ),
        DataType::Decimal128 { scale, .. } => typed!(
            |l: &Literal| {
                // A JSON number arrives as the nearest f64; its shortest round-trip text is what
                // the author wrote (23.90 → "23.9"), which is then read exactly.
                let text = match l {
                    Literal::Int(i) => i.to_string(),
                    Literal::Float(x) => x.to_string(),
                    Literal::Str(s) => s.clone(),
                    other => return Err(mismatch(other)),
                };
                parse_decimal(&text, scale).map_err(|e| {
                    PluginError::invalid_config(format!("filter_rows: column `{column}`: {e}"))
                })
            },
            Predicate::Decimal,
            Predicate::DecimalIn
        ),
        DataType::Boolean => typed!(
            |l: &Literal| match l {
                Literal::Bool(b) => Ok(*b),
                other => Err(mismatch(other)),
            },
            Predicate::Bool,
            Predicate::BoolIn
        ),
        DataType::TimestampMicros => typed!(
            |l: &Literal| match l {
                Literal::Int(i) => Ok(*i),
                Literal::Str(s) => parse_timestamp_micros(s).map_err(|e| {
                    PluginError::invalid_config(format!("filter_rows: column `{column}`: {e}"))
                }),
                other => Err(mismatch(other)),
            },
            Predicate::Int,
            Predicate::IntIn
        ),
        DataType::Date32 => typed!(
            |l: &Literal| match l {
                Literal::Int(i) => Ok(*i),
                Literal::Str(s) => parse_date32(s).map(i64::from).map_err(|e| {
                    PluginError::invalid_config(format!("filter_rows: column `{column}`: {e}"))
                }),
                other => Err(mismatch(other)),
            },
            Predicate::Int,
            Predicate::IntIn
        ),
    };
    Ok(predicate)
}

weir_plugin_sdk::export_transform!(FilterRows);

weir_plugin_sdk::plugin_metadata!(
    r#"{
    "name": "filter_rows",
    "version": "0.1.0",
    "description": "Keeps the rows whose column compares true with a literal (eq, ne, gt, ge, lt, le, in, is_null, not_null).",
    "config_schema": {
        "type": "object",
        "properties": {
            "column": {"type": "string", "minLength": 1},
            "op": {"enum": ["eq", "ne", "gt", "ge", "lt", "le", "in", "is_null", "not_null"]},
            "value": {"type": ["string", "number", "boolean", "array"]}
        },
        "required": ["column", "op"],
        "additionalProperties": false
    }
}"#
);

#[cfg(test)]
mod tests {
    use super::*;
    use weir_plugin_sdk::ErrorKind;
    use weir_plugin_sdk::testing::{MemoryBatch, run_transform};

    fn orders() -> MemoryBatch {
        MemoryBatch::new(vec![
            Column::int64("order_id", vec![1, 2, 3, 4, 5], None),
            Column::utf8_from_iter(
                "status",
                [
                    Some("completed"),
                    Some("pending"),
                    None,
                    Some("completed"),
                    Some("cancelled"),
                ],
            ),
            Column::decimal128(
                "amount",
                12,
                2,
                vec![2390, 1000, 5, 99_999, 2390],
                Some(Bitmap::from_bools(&[true, true, true, false, true])),
            ),
            Column::float64("score", vec![0.5, 1.5, f64::NAN, -2.0, 1.5], None),
            Column::int32("qty", vec![1, 2, 3, 4, 5], None),
            Column::boolean(
                "paid",
                Bitmap::from_bools(&[true, false, true, false, true]),
                None,
            ),
            Column::timestamp_micros(
                "occurred_at",
                vec![
                    1_714_566_896_000_000,
                    1_714_566_897_000_000,
                    1_714_566_898_000_000,
                    1_714_566_899_000_000,
                    1_714_566_900_000_000,
                ],
                None,
            ),
            Column::date32("day", vec![19_844, 19_845, 19_846, 19_847, 19_848], None),
        ])
    }

    fn ids(config: &str) -> Vec<i64> {
        let out = run_transform::<FilterRows>(config, &orders()).unwrap();
        let c = out.column("order_id").unwrap();
        (0..out.num_rows()).filter_map(|i| c.i64(i)).collect()
    }

    fn error(config: &str) -> PluginError {
        run_transform::<FilterRows>(config, &orders()).unwrap_err()
    }

    #[test]
    fn utf8_comparisons_skip_nulls() {
        assert_eq!(
            ids(r#"{"column":"status","op":"eq","value":"completed"}"#),
            [1, 4]
        );
        assert_eq!(
            ids(r#"{"column":"status","op":"ne","value":"completed"}"#),
            [2, 5]
        );
        assert_eq!(
            ids(r#"{"column":"status","op":"gt","value":"completed"}"#),
            [2]
        );
        assert_eq!(
            ids(r#"{"column":"status","op":"le","value":"completed"}"#),
            [1, 4, 5]
        );
        assert_eq!(
            ids(r#"{"column":"status","op":"in","value":["pending","cancelled","x"]}"#),
            [2, 5]
        );
        assert_eq!(ids(r#"{"column":"status","op":"is_null"}"#), [3]);
        assert_eq!(ids(r#"{"column":"status","op":"not_null"}"#), [1, 2, 4, 5]);
    }

    #[test]
    fn the_output_keeps_every_column() {
        let out = run_transform::<FilterRows>(r#"{"column":"qty","op":"ge","value":4}"#, &orders())
            .unwrap();
        assert_eq!(out.num_rows(), 2);
        assert_eq!(out.columns().len(), 8);
        assert_eq!(out.column("status").unwrap().str(0), Some("completed"));
        assert_eq!(out.column("status").unwrap().str(1), Some("cancelled"));
    }

    #[test]
    fn numeric_comparisons() {
        assert_eq!(ids(r#"{"column":"order_id","op":"gt","value":3}"#), [4, 5]);
        assert_eq!(ids(r#"{"column":"qty","op":"lt","value":3}"#), [1, 2]);
        assert_eq!(
            ids(r#"{"column":"qty","op":"lt","value":9999999999}"#),
            [1, 2, 3, 4, 5]
        );
        assert_eq!(ids(r#"{"column":"qty","op":"in","value":[5,1]}"#), [1, 5]);
        assert_eq!(ids(r#"{"column":"score","op":"ge","value":1.5}"#), [2, 5]);
        assert_eq!(ids(r#"{"column":"score","op":"lt","value":1}"#), [1, 4]);
        assert_eq!(
            ids(r#"{"column":"score","op":"in","value":[0.5, -2]}"#),
            [1, 4]
        );
    }

    #[test]
    fn decimals_compare_exactly_at_the_column_scale() {
        assert_eq!(
            ids(r#"{"column":"amount","op":"eq","value":23.90}"#),
            [1, 5]
        );
        assert_eq!(
            ids(r#"{"column":"amount","op":"eq","value":"23.9"}"#),
            [1, 5]
        );
        assert_eq!(
            ids(r#"{"column":"amount","op":"ge","value":10}"#),
            [1, 2, 5]
        );
        assert_eq!(ids(r#"{"column":"amount","op":"lt","value":"0.06"}"#), [3]);
        assert_eq!(
            ids(r#"{"column":"amount","op":"in","value":["0.05", 10]}"#),
            [2, 3]
        );
        let e = error(r#"{"column":"amount","op":"eq","value":"23.901"}"#);
        assert_eq!(e.kind, ErrorKind::InvalidConfig);
        assert_eq!(
            e.message,
            "filter_rows: column `amount`: `23.901` has more decimal places than scale 2"
        );
    }

    #[test]
    fn booleans_timestamps_and_dates() {
        assert_eq!(
            ids(r#"{"column":"paid","op":"eq","value":true}"#),
            [1, 3, 5]
        );
        assert_eq!(ids(r#"{"column":"paid","op":"lt","value":true}"#), [2, 4]);
        assert_eq!(
            ids(r#"{"column":"occurred_at","op":"ge","value":"2024-05-01T14:34:59+02:00"}"#),
            [4, 5]
        );
        assert_eq!(
            ids(r#"{"column":"occurred_at","op":"eq","value":1714566896000000}"#),
            [1]
        );
        assert_eq!(
            ids(r#"{"column":"day","op":"le","value":"2024-05-02"}"#),
            [1, 2]
        );
        assert_eq!(
            ids(r#"{"column":"day","op":"in","value":["2024-05-05", 19844]}"#),
            [1, 5]
        );
    }

    #[test]
    fn bad_configs_are_rejected_at_open() {
        let e = error(r#"{"column":"nope","op":"eq","value":"x"}"#);
        assert_eq!(e.kind, ErrorKind::InvalidInput);
        assert_eq!(e.message, "filter_rows: the input has no column `nope`");

        let e = error(r#"{"column":"status","op":"like","value":"x"}"#);
        assert_eq!(e.kind, ErrorKind::InvalidConfig);
        assert!(
            e.message.starts_with("config.op: unknown variant `like`"),
            "{e}"
        );

        let e = error(r#"{"column":"status","op":"eq","value":3}"#);
        assert_eq!(e.kind, ErrorKind::InvalidConfig);
        assert_eq!(
            e.message,
            "filter_rows: value 3 does not fit column `status` of type utf8"
        );

        let e = error(r#"{"column":"qty","op":"eq","value":2.5}"#);
        assert_eq!(
            e.message,
            "filter_rows: value 2.5 does not fit column `qty` of type int32"
        );

        let e = error(r#"{"column":"status","op":"in","value":"x"}"#);
        assert!(e.message.contains("op `in` needs an array `value`"), "{e}");
        let e = error(r#"{"column":"status","op":"eq"}"#);
        assert_eq!(e.message, "filter_rows: op `eq` needs a `value`");
        let e = error(r#"{"column":"status","op":"is_null","value":"x"}"#);
        assert_eq!(
            e.message,
            r#"filter_rows: op `is_null` takes no value, got "x""#
        );
        let e = error(r#"{"column":"day","op":"eq","value":"2024-13-01"}"#);
        assert!(e.message.contains("`2024-13-01` is not a date"), "{e}");
        let e = error(r#"{"column":"status","op":"eq","value":"x","extra":1}"#);
        assert!(e.message.contains("unknown field `extra`"), "{e}");
    }

    #[test]
    fn a_batch_without_the_column_is_invalid_input() {
        let mut plugin = FilterRows::new(
            Config {
                column: "status".into(),
                op: Op::Eq,
                value: Some(Literal::Str("x".into())),
            },
            &orders().schema(),
        )
        .unwrap();
        let other = MemoryBatch::new(vec![Column::int64("order_id", vec![1], None)]);
        let e = plugin
            .process(&Batch::from_memory(&other), &BatchInfo::new(1))
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput);
        assert!(e.message.contains("no column `status`"), "{e}");
    }

    #[test]
    fn short_string_equality_is_exact() {
        let words = [
            "",
            "a",
            "ab",
            "abc",
            "abcd",
            "abcdefg",
            "abcdefgh",
            "abcdefghijklmnop",
            "abcdefghijklmnopq",
        ];
        for a in words {
            for b in words {
                assert_eq!(bytes_eq(a.as_bytes(), b.as_bytes()), a == b, "{a} {b}");
            }
            let mut changed = a.as_bytes().to_vec();
            for i in 0..changed.len() {
                changed[i] ^= 1;
                assert!(!bytes_eq(a.as_bytes(), &changed), "{a} at {i}");
                changed[i] ^= 1;
            }
        }
    }

    #[test]
    fn masks_are_exact_on_large_batches() {
        let n = 65_537;
        let values: Vec<i64> = (0..n).collect();
        let validity = Bitmap::from_fn(n as usize, |i| i % 7 != 0);
        let batch = MemoryBatch::new(vec![Column::int64("x", values, Some(validity))]);
        let out = run_transform::<FilterRows>(r#"{"column":"x","op":"gt","value":1000}"#, &batch)
            .unwrap();
        let expected = (1001..n).filter(|i| i % 7 != 0).count();
        assert_eq!(out.num_rows(), expected);
        let strings = MemoryBatch::new(vec![Column::utf8_from_iter(
            "s",
            (0..n).map(|i| Some(if i % 3 == 0 { "completed" } else { "pending" })),
        )]);
        let out = run_transform::<FilterRows>(
            r#"{"column":"s","op":"eq","value":"completed"}"#,
            &strings,
        )
        .unwrap();
        assert_eq!(out.num_rows(), (0..n).filter(|i| i % 3 == 0).count());
    }
}
