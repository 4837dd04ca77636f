//! One column in Arrow's memory layout. Plugins read values in place (a string is a slice of the
//! data buffer, never a fresh `String`) and build new columns as whole buffers, which is what lets
//! a batch cross the Wasm boundary as a handful of copies instead of one per value.

use crate::bitmap::Bitmap;
use crate::error::PluginError;
use crate::schema::{DataType, Field};

/// The values of a column, as Arrow lays them out.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// Bit-packed booleans.
    Boolean(Bitmap),
    /// 32-bit integers.
    Int32(Vec<i32>),
    /// 64-bit integers.
    Int64(Vec<i64>),
    /// 64-bit floats.
    Float64(Vec<f64>),
    /// Unscaled decimal values; the scale is in the column's [`DataType::Decimal128`].
    Decimal128(Vec<i128>),
    /// Strings: value `i` is `data[offsets[i]..offsets[i + 1]]`.
    Utf8 {
        /// `len + 1` ascending byte offsets into `data`.
        offsets: Vec<i32>,
        /// The UTF-8 bytes of every value, back to back.
        data: Vec<u8>,
    },
    /// UTC microseconds since the epoch.
    TimestampMicros(Vec<i64>),
    /// Days since the epoch.
    Date32(Vec<i32>),
}

impl Values {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Self::Boolean(b) => b.len(),
            Self::Int32(v) | Self::Date32(v) => v.len(),
            Self::Int64(v) | Self::TimestampMicros(v) => v.len(),
            Self::Float64(v) => v.len(),
            Self::Decimal128(v) => v.len(),
            Self::Utf8 { offsets, .. } => offsets.len().saturating_sub(1),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether these values have the layout of `data_type`.
    pub fn matches(&self, data_type: DataType) -> bool {
        matches!(
            (self, data_type),
            (Self::Boolean(_), DataType::Boolean)
                | (Self::Int32(_), DataType::Int32)
                | (Self::Int64(_), DataType::Int64)
                | (Self::Float64(_), DataType::Float64)
                | (Self::Decimal128(_), DataType::Decimal128 { .. })
                | (Self::Utf8 { .. }, DataType::Utf8)
                | (Self::TimestampMicros(_), DataType::TimestampMicros)
                | (Self::Date32(_), DataType::Date32)
        )
    }
}

/// A named column: its type, its validity and its values.
///
/// Accessors such as [`Column::str`] return `None` for a null, for an index out of range and for a
/// column of another type; read [`Column::values`] directly for tight loops.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// The column's name.
    pub name: String,
    /// The column's type; must agree with `values`.
    pub data_type: DataType,
    /// Validity, one bit per value (1 = valid); `None` when every value is valid.
    pub validity: Option<Bitmap>,
    /// The values (a null's slot holds an unspecified value).
    pub values: Values,
}

impl Column {
    /// A column of `values`, typed from them. For decimals use [`Column::decimal128`].
    pub fn new(name: impl Into<String>, values: Values, validity: Option<Bitmap>) -> Self {
        let data_type = match &values {
            Values::Boolean(_) => DataType::Boolean,
            Values::Int32(_) => DataType::Int32,
            Values::Int64(_) => DataType::Int64,
            Values::Float64(_) => DataType::Float64,
            Values::Decimal128(_) => DataType::Decimal128 {
                precision: 38,
                scale: 0,
            },
            Values::Utf8 { .. } => DataType::Utf8,
            Values::TimestampMicros(_) => DataType::TimestampMicros,
            Values::Date32(_) => DataType::Date32,
        };
        Self {
            name: name.into(),
            data_type,
            validity,
            values,
        }
    }

    /// A boolean column.
    pub fn boolean(name: impl Into<String>, values: Bitmap, validity: Option<Bitmap>) -> Self {
        Self::new(name, Values::Boolean(values), validity)
    }

    /// An int32 column.
    pub fn int32(name: impl Into<String>, values: Vec<i32>, validity: Option<Bitmap>) -> Self {
        Self::new(name, Values::Int32(values), validity)
    }

    /// An int64 column.
    pub fn int64(name: impl Into<String>, values: Vec<i64>, validity: Option<Bitmap>) -> Self {
        Self::new(name, Values::Int64(values), validity)
    }

    /// A float64 column.
    pub fn float64(name: impl Into<String>, values: Vec<f64>, validity: Option<Bitmap>) -> Self {
        Self::new(name, Values::Float64(values), validity)
    }

    /// A decimal column of unscaled `values` (`23.90` at scale 2 is `2390`).
    pub fn decimal128(
        name: impl Into<String>,
        precision: u8,
        scale: i8,
        values: Vec<i128>,
        validity: Option<Bitmap>,
    ) -> Self {
        Self {
            name: name.into(),
            data_type: DataType::Decimal128 { precision, scale },
            validity,
            values: Values::Decimal128(values),
        }
    }

    /// A timestamp column of UTC microseconds since the epoch.
    pub fn timestamp_micros(
        name: impl Into<String>,
        values: Vec<i64>,
        validity: Option<Bitmap>,
    ) -> Self {
        Self::new(name, Values::TimestampMicros(values), validity)
    }

    /// A date column of days since the epoch.
    pub fn date32(name: impl Into<String>, values: Vec<i32>, validity: Option<Bitmap>) -> Self {
        Self::new(name, Values::Date32(values), validity)
    }

    /// A string column from Arrow buffers (`offsets` has one more entry than there are values).
    pub fn utf8(
        name: impl Into<String>,
        offsets: Vec<i32>,
        data: Vec<u8>,
        validity: Option<Bitmap>,
    ) -> Self {
        Self::new(name, Values::Utf8 { offsets, data }, validity)
    }

    /// A string column of `values`, `None` being null. Builds the buffers directly (no `String` per
    /// value); the validity is `None` when no value is null.
    ///
    /// # Panics
    /// When the strings total more than `i32::MAX` bytes (Arrow's `Utf8` limit; a batch column
    /// that large cannot cross the boundary anyway).
    pub fn utf8_from_iter<'s>(
        name: impl Into<String>,
        values: impl IntoIterator<Item = Option<&'s str>>,
    ) -> Self {
        let values = values.into_iter();
        let mut offsets = Vec::with_capacity(values.size_hint().0 + 1);
        let mut data = Vec::new();
        let mut valid = Vec::with_capacity(values.size_hint().0);
        offsets.push(0i32);
        for value in values {
            if let Some(s) = value {
                data.extend_from_slice(s.as_bytes());
            }
            valid.push(value.is_some());
            #[expect(
                clippy::expect_used,
                reason = "documented panic: Arrow's i32 offset limit"
            )]
            offsets.push(i32::try_from(data.len()).expect("utf8 column exceeds i32::MAX bytes"));
        }
        let validity = valid.contains(&false).then(|| Bitmap::from_bools(&valid));
        Self::utf8(name, offsets, data, validity)
    }

    /// This column renamed to `name`.
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The field describing this column (nullable when it has a validity bitmap).
    pub fn field(&self) -> Field {
        Field::new(self.name.clone(), self.data_type, self.validity.is_some())
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Whether value `i` is null.
    #[inline]
    pub fn is_null(&self, i: usize) -> bool {
        self.validity.as_ref().is_some_and(|v| !v.get(i))
    }

    /// Whether value `i` is present (not null and in range).
    #[inline]
    pub fn is_valid(&self, i: usize) -> bool {
        i < self.len() && !self.is_null(i)
    }

    /// Number of nulls.
    pub fn null_count(&self) -> usize {
        self.validity
            .as_ref()
            .map_or(0, |v| v.len() - v.count_ones())
    }

    /// The bytes of string `i`, borrowed from the column.
    #[inline]
    pub fn bytes(&self, i: usize) -> Option<&[u8]> {
        match &self.values {
            Values::Utf8 { offsets, data } if i + 1 < offsets.len() && !self.is_null(i) => {
                let start = usize::try_from(offsets[i]).ok()?;
                let end = usize::try_from(offsets[i + 1]).ok()?;
                data.get(start..end)
            }
            _ => None,
        }
    }

    /// String `i`, borrowed from the column (no allocation). Also `None` if the bytes are not
    /// UTF-8, which a host-provided column never is.
    #[inline]
    pub fn str(&self, i: usize) -> Option<&str> {
        self.bytes(i).and_then(|b| std::str::from_utf8(b).ok())
    }

    /// Boolean `i`.
    #[inline]
    pub fn bool(&self, i: usize) -> Option<bool> {
        match &self.values {
            Values::Boolean(b) if i < b.len() && !self.is_null(i) => Some(b.get(i)),
            _ => None,
        }
    }

    /// Integer `i` of an int32 column.
    #[inline]
    pub fn i32(&self, i: usize) -> Option<i32> {
        match &self.values {
            Values::Int32(v) if !self.is_null(i) => v.get(i).copied(),
            _ => None,
        }
    }

    /// Integer `i` of an int64 or int32 column.
    #[inline]
    pub fn i64(&self, i: usize) -> Option<i64> {
        match &self.values {
            Values::Int64(v) if !self.is_null(i) => v.get(i).copied(),
            Values::Int32(v) if !self.is_null(i) => v.get(i).map(|x| i64::from(*x)),
            _ => None,
        }
    }

    /// Float `i` of a float64 column.
    #[inline]
    pub fn f64(&self, i: usize) -> Option<f64> {
        match &self.values {
            Values::Float64(v) if !self.is_null(i) => v.get(i).copied(),
            _ => None,
        }
    }

    /// Unscaled decimal `i` (see [`Column::decimal_scale`]).
    #[inline]
    pub fn decimal(&self, i: usize) -> Option<i128> {
        match &self.values {
            Values::Decimal128(v) if !self.is_null(i) => v.get(i).copied(),
            _ => None,
        }
    }

    /// The scale of a decimal column.
    pub fn decimal_scale(&self) -> Option<i8> {
        match self.data_type {
            DataType::Decimal128 { scale, .. } => Some(scale),
            _ => None,
        }
    }

    /// Timestamp `i` in UTC microseconds since the epoch.
    #[inline]
    pub fn timestamp_micros_at(&self, i: usize) -> Option<i64> {
        match &self.values {
            Values::TimestampMicros(v) if !self.is_null(i) => v.get(i).copied(),
            _ => None,
        }
    }

    /// Date `i` in days since the epoch.
    #[inline]
    pub fn date32_at(&self, i: usize) -> Option<i32> {
        match &self.values {
            Values::Date32(v) if !self.is_null(i) => v.get(i).copied(),
            _ => None,
        }
    }

    /// An iterator over the strings of a utf8 column (`None` for nulls; empty for another type).
    pub fn strs(&self) -> impl Iterator<Item = Option<&str>> + '_ {
        let n = if matches!(self.values, Values::Utf8 { .. }) {
            self.len()
        } else {
            0
        };
        (0..n).map(move |i| self.str(i))
    }

    /// The rows at `indices`, in that order (a gather: it copies).
    ///
    /// # Errors
    /// [`PluginError::fatal`] naming the column when an index is out of range.
    pub fn take(&self, indices: &[usize]) -> Result<Column, PluginError> {
        let len = self.len();
        if let Some(bad) = indices.iter().find(|&&i| i >= len) {
            return Err(PluginError::fatal(format!(
                "row {bad} is out of range for column `{}` of {len} rows",
                self.name
            )));
        }
        fn gather<T: Copy>(v: &[T], idx: &[usize]) -> Vec<T> {
            idx.iter().map(|&i| v[i]).collect()
        }
        let values = match &self.values {
            Values::Boolean(b) => {
                Values::Boolean(Bitmap::from_fn(indices.len(), |k| b.get(indices[k])))
            }
            Values::Int32(v) => Values::Int32(gather(v, indices)),
            Values::Int64(v) => Values::Int64(gather(v, indices)),
            Values::Float64(v) => Values::Float64(gather(v, indices)),
            Values::Decimal128(v) => Values::Decimal128(gather(v, indices)),
            Values::TimestampMicros(v) => Values::TimestampMicros(gather(v, indices)),
            Values::Date32(v) => Values::Date32(gather(v, indices)),
            Values::Utf8 { offsets, data } => {
                let mut new_offsets = Vec::with_capacity(indices.len() + 1);
                let mut new_data = Vec::new();
                new_offsets.push(0i32);
                for &i in indices {
                    let start = usize::try_from(offsets[i]).unwrap_or(0);
                    let end = usize::try_from(offsets[i + 1]).unwrap_or(0);
                    new_data.extend_from_slice(data.get(start..end).unwrap_or_default());
                    new_offsets.push(i32::try_from(new_data.len()).map_err(|_| {
                        PluginError::fatal(format!("column `{}` exceeds i32::MAX bytes", self.name))
                    })?);
                }
                Values::Utf8 {
                    offsets: new_offsets,
                    data: new_data,
                }
            }
        };
        let validity = self
            .validity
            .as_ref()
            .map(|v| Bitmap::from_fn(indices.len(), |k| v.get(indices[k])));
        Ok(Column {
            name: self.name.clone(),
            data_type: self.data_type,
            validity,
            values,
        })
    }

    /// Checks what the host checks of a column a plugin returns: the values agree with the type,
    /// there are `rows` of them, the validity has `rows` bits, and string offsets are ascending
    /// and inside the data.
    ///
    /// # Errors
    /// [`PluginError::fatal`] naming the column and the broken rule.
    pub fn validate(&self, rows: usize) -> Result<(), PluginError> {
        let name = &self.name;
        if !self.values.matches(self.data_type) {
            return Err(PluginError::fatal(format!(
                "column `{name}` is declared {} but holds other values",
                self.data_type
            )));
        }
        if self.len() != rows {
            return Err(PluginError::fatal(format!(
                "column `{name}` has {} rows, the batch has {rows}",
                self.len()
            )));
        }
        if let Some(v) = &self.validity
            && v.len() != rows
        {
            return Err(PluginError::fatal(format!(
                "column `{name}` has a validity of {} bits for {rows} rows",
                v.len()
            )));
        }
        if let Values::Utf8 { offsets, data } = &self.values {
            let ascending = offsets.windows(2).all(|w| w[0] <= w[1]);
            let first_ok = offsets.first().is_none_or(|&o| o >= 0);
            let last_ok = offsets
                .last()
                .is_none_or(|&o| usize::try_from(o).is_ok_and(|o| o <= data.len()));
            if offsets.is_empty() || !ascending || !first_ok || !last_ok {
                return Err(PluginError::fatal(format!(
                    "column `{name}` has string offsets that are empty, descending or past its {} data bytes",
                    data.len()
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_from_iter_builds_arrow_buffers() {
        let c = Column::utf8_from_iter("s", [Some("ab"), None, Some(""), Some("é")]);
        assert_eq!(
            c.values,
            Values::Utf8 {
                offsets: vec![0, 2, 2, 2, 4],
                data: "abé".as_bytes().to_vec()
            }
        );
        assert_eq!(
            c.validity.as_ref().map(Bitmap::as_bytes),
            Some(&[0b1101u8][..])
        );
        assert_eq!(c.len(), 4);
        assert_eq!(c.null_count(), 1);
        assert_eq!(c.str(0), Some("ab"));
        assert_eq!(c.str(1), None);
        assert_eq!(c.str(2), Some(""));
        assert_eq!(c.str(3), Some("é"));
        assert_eq!(c.str(4), None);
        assert_eq!(
            c.strs().collect::<Vec<_>>(),
            [Some("ab"), None, Some(""), Some("é")]
        );
        let no_nulls = Column::utf8_from_iter("s", [Some("x")]);
        assert!(no_nulls.validity.is_none());
        assert!(no_nulls.validate(1).is_ok());
    }

    #[test]
    fn typed_accessors_respect_nulls_and_types() {
        let validity = Some(Bitmap::from_bools(&[true, false, true]));
        let c = Column::int32("n", vec![1, 2, 3], validity);
        assert_eq!(c.i32(0), Some(1));
        assert_eq!(c.i32(1), None);
        assert_eq!(c.i64(2), Some(3));
        assert_eq!(c.f64(0), None);
        assert_eq!(c.i32(3), None);
        let d = Column::decimal128("d", 12, 2, vec![2390], None);
        assert_eq!(d.decimal(0), Some(2390));
        assert_eq!(d.decimal_scale(), Some(2));
        let b = Column::boolean("b", Bitmap::from_bools(&[false, true]), None);
        assert_eq!(b.bool(1), Some(true));
        assert_eq!(b.bool(2), None);
    }

    #[test]
    fn take_gathers_values_and_validity() {
        let c = Column::utf8_from_iter("s", [Some("a"), None, Some("ccc")]);
        let t = c.take(&[2, 1, 0, 2]).unwrap();
        assert_eq!(
            t.strs().collect::<Vec<_>>(),
            [Some("ccc"), None, Some("a"), Some("ccc")]
        );
        let e = c.take(&[3]).unwrap_err();
        assert!(
            e.message.contains("row 3 is out of range for column `s`"),
            "{e}"
        );
    }

    #[test]
    fn validate_names_the_column_and_rule() {
        let mut c = Column::int64("amount", vec![1, 2], None);
        assert!(c.validate(2).is_ok());
        let e = c.validate(3).unwrap_err();
        assert_eq!(e.message, "column `amount` has 2 rows, the batch has 3");
        c.data_type = DataType::Utf8;
        let e = c.validate(2).unwrap_err();
        assert_eq!(
            e.message,
            "column `amount` is declared utf8 but holds other values"
        );
        let bad = Column::utf8("s", vec![0, 3, 1], b"abc".to_vec(), None);
        assert!(
            bad.validate(2)
                .unwrap_err()
                .message
                .contains("column `s` has string offsets")
        );
    }
}
