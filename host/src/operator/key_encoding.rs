//! Order-preserving byte encoding of column values, shared by the stateful
//! operators (deduplication keys, aggregation groups and distinct values).
//!
//! Why it exists: state stores compare keys bytewise, and operators need
//! range scans ("every group whose window ended before the watermark") and
//! cheap equality on composite keys. Encoding each column into one reused
//! buffer gives both without per-row allocation; the decoder turns stored
//! keys back into Arrow columns when state is emitted.
//!
//! Per column: a tag (`0x01` value, `0x02` null: nulls sort last) then the
//! value — integers big-endian with the sign bit flipped, floats with their
//! order-preserving bit flip and NaN canonical, decimals as 128-bit integers,
//! strings and binaries with `0x00` escaped as `0x00 0xFF` and ended by
//! `0x00 0x01`. Every encoding is self-delimiting, so a concatenation of
//! columns is prefix-free and can be followed by more key material.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Date64Type, Decimal128Type, DurationMicrosecondType, DurationMillisecondType,
    DurationNanosecondType, DurationSecondType, Float32Type, Float64Type, Int8Type, Int16Type,
    Int32Type, Int64Type, Time32MillisecondType, Time32SecondType, Time64MicrosecondType,
    Time64NanosecondType, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{
    Array, ArrayRef, BinaryArray, BooleanArray, LargeBinaryArray, LargeStringArray, PrimitiveArray,
    StringArray,
};
use arrow_buffer::{
    BooleanBuffer, Buffer, NullBuffer, NullBufferBuilder, OffsetBuffer, ScalarBuffer,
};
use arrow_schema::{ArrowError, DataType, TimeUnit};

/// Tag of a non-null value.
pub(crate) const TAG_VALUE: u8 = 0x01;
/// Tag of a null value (after every value: eviction scans stop first).
pub(crate) const TAG_NULL: u8 = 0x02;

/// Whether a column of this type can be encoded (and decoded) as a key.
pub(crate) fn key_type_supported(data_type: &DataType) -> bool {
    use DataType as D;
    matches!(
        data_type,
        D::Boolean
            | D::Int8
            | D::Int16
            | D::Int32
            | D::Int64
            | D::UInt8
            | D::UInt16
            | D::UInt32
            | D::UInt64
            | D::Float32
            | D::Float64
            | D::Date32
            | D::Date64
            | D::Time32(_)
            | D::Time64(_)
            | D::Timestamp(_, _)
            | D::Duration(_)
            | D::Decimal128(_, _)
            | D::Utf8
            | D::LargeUtf8
            | D::Utf8View
            | D::Binary
            | D::LargeBinary
            | D::BinaryView
    )
}

/// Typed access to one key column of one batch.
enum ColumnValues<'a> {
    Bool(BooleanBuffer),
    I8(&'a [i8]),
    I16(&'a [i16]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    U8(&'a [u8]),
    U16(&'a [u16]),
    U32(&'a [u32]),
    U64(&'a [u64]),
    F32(&'a [f32]),
    F64(&'a [f64]),
    I128(&'a [i128]),
    Bytes32 { offsets: &'a [i32], data: &'a [u8] },
    Bytes64 { offsets: &'a [i64], data: &'a [u8] },
    StrView(&'a arrow_array::StringViewArray),
    BinView(&'a arrow_array::BinaryViewArray),
}

/// Writes the encoding of one column's rows.
pub(crate) struct ColumnEncoder<'a> {
    nulls: Option<&'a NullBuffer>,
    values: ColumnValues<'a>,
}

impl std::fmt::Debug for ColumnEncoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColumnEncoder").finish_non_exhaustive()
    }
}

impl<'a> ColumnEncoder<'a> {
    /// `None` for a type that [`key_type_supported`] rejects.
    pub(crate) fn new(array: &'a dyn Array) -> Option<Self> {
        use ColumnValues as V;
        use DataType as D;
        let values = match array.data_type() {
            D::Boolean => V::Bool(array.as_boolean_opt()?.values().clone()),
            D::Int8 => V::I8(array.as_primitive_opt::<Int8Type>()?.values()),
            D::Int16 => V::I16(array.as_primitive_opt::<Int16Type>()?.values()),
            D::Int32 => V::I32(array.as_primitive_opt::<Int32Type>()?.values()),
            D::Date32 => V::I32(array.as_primitive_opt::<Date32Type>()?.values()),
            D::Time32(TimeUnit::Second) => {
                V::I32(array.as_primitive_opt::<Time32SecondType>()?.values())
            }
            D::Time32(_) => V::I32(array.as_primitive_opt::<Time32MillisecondType>()?.values()),
            D::Int64 => V::I64(array.as_primitive_opt::<Int64Type>()?.values()),
            D::Date64 => V::I64(array.as_primitive_opt::<Date64Type>()?.values()),
            D::Time64(TimeUnit::Nanosecond) => {
                V::I64(array.as_primitive_opt::<Time64NanosecondType>()?.values())
            }
            D::Time64(_) => V::I64(array.as_primitive_opt::<Time64MicrosecondType>()?.values()),
            D::Timestamp(unit, _) => V::I64(match unit {
                TimeUnit::Second => array.as_primitive_opt::<TimestampSecondType>()?.values(),
                TimeUnit::Millisecond => array
                    .as_primitive_opt::<TimestampMillisecondType>()?
                    .values(),
                TimeUnit::Microsecond => array
                    .as_primitive_opt::<TimestampMicrosecondType>()?
                    .values(),
                TimeUnit::Nanosecond => array
                    .as_primitive_opt::<TimestampNanosecondType>()?
                    .values(),
            }),
            D::Duration(unit) => V::I64(match unit {
                TimeUnit::Second => array.as_primitive_opt::<DurationSecondType>()?.values(),
                TimeUnit::Millisecond => array
                    .as_primitive_opt::<DurationMillisecondType>()?
                    .values(),
                TimeUnit::Microsecond => array
                    .as_primitive_opt::<DurationMicrosecondType>()?
                    .values(),
                TimeUnit::Nanosecond => {
                    array.as_primitive_opt::<DurationNanosecondType>()?.values()
                }
            }),
            D::UInt8 => V::U8(array.as_primitive_opt::<UInt8Type>()?.values()),
            D::UInt16 => V::U16(array.as_primitive_opt::<UInt16Type>()?.values()),
            D::UInt32 => V::U32(array.as_primitive_opt::<UInt32Type>()?.values()),
            D::UInt64 => V::U64(array.as_primitive_opt::<UInt64Type>()?.values()),
            D::Float32 => V::F32(array.as_primitive_opt::<Float32Type>()?.values()),
            D::Float64 => V::F64(array.as_primitive_opt::<Float64Type>()?.values()),
            D::Decimal128(_, _) => V::I128(array.as_primitive_opt::<Decimal128Type>()?.values()),
            D::Utf8 => {
                let a = array.as_string_opt::<i32>()?;
                V::Bytes32 {
                    offsets: a.value_offsets(),
                    data: a.value_data(),
                }
            }
            D::Binary => {
                let a = array.as_binary_opt::<i32>()?;
                V::Bytes32 {
                    offsets: a.value_offsets(),
                    data: a.value_data(),
                }
            }
            D::LargeUtf8 => {
                let a = array.as_string_opt::<i64>()?;
                V::Bytes64 {
                    offsets: a.value_offsets(),
                    data: a.value_data(),
                }
            }
            D::LargeBinary => {
                let a = array.as_binary_opt::<i64>()?;
                V::Bytes64 {
                    offsets: a.value_offsets(),
                    data: a.value_data(),
                }
            }
            D::Utf8View => V::StrView(array.as_string_view_opt()?),
            D::BinaryView => V::BinView(array.as_binary_view_opt()?),
            _ => return None,
        };
        Some(Self {
            nulls: array.nulls(),
            values,
        })
    }

    /// Whether row `row` is null.
    #[inline]
    pub(crate) fn is_null(&self, row: usize) -> bool {
        self.nulls.is_some_and(|n| n.is_null(row))
    }

    /// Appends row `row`'s tagged, order-preserving encoding.
    #[inline]
    pub(crate) fn write(&self, row: usize, out: &mut Vec<u8>) {
        use ColumnValues as V;
        if self.is_null(row) {
            out.push(TAG_NULL);
            return;
        }
        out.push(TAG_VALUE);
        match &self.values {
            V::Bool(b) => out.push(u8::from(b.value(row))),
            V::I8(v) => out.push((v[row] as u8) ^ 0x80),
            V::I16(v) => out.extend_from_slice(&((v[row] as u16) ^ (1 << 15)).to_be_bytes()),
            V::I32(v) => out.extend_from_slice(&((v[row] as u32) ^ (1 << 31)).to_be_bytes()),
            V::I64(v) => out.extend_from_slice(&flip_i64(v[row])),
            V::U8(v) => out.push(v[row]),
            V::U16(v) => out.extend_from_slice(&v[row].to_be_bytes()),
            V::U32(v) => out.extend_from_slice(&v[row].to_be_bytes()),
            V::U64(v) => out.extend_from_slice(&v[row].to_be_bytes()),
            V::F32(v) => {
                let x = if v[row].is_nan() { f32::NAN } else { v[row] };
                let bits = x.to_bits();
                let bits = if bits >> 31 == 1 {
                    !bits
                } else {
                    bits ^ (1 << 31)
                };
                out.extend_from_slice(&bits.to_be_bytes());
            }
            V::F64(v) => {
                let x = if v[row].is_nan() { f64::NAN } else { v[row] };
                let bits = x.to_bits();
                let bits = if bits >> 63 == 1 {
                    !bits
                } else {
                    bits ^ (1 << 63)
                };
                out.extend_from_slice(&bits.to_be_bytes());
            }
            V::I128(v) => out.extend_from_slice(&((v[row] as u128) ^ (1 << 127)).to_be_bytes()),
            V::Bytes32 { offsets, data } => {
                let (s, e) = (offsets[row] as usize, offsets[row + 1] as usize);
                write_bytes(&data[s..e], out);
            }
            V::Bytes64 { offsets, data } => {
                let (s, e) = (offsets[row] as usize, offsets[row + 1] as usize);
                write_bytes(&data[s..e], out);
            }
            V::StrView(a) => write_bytes(a.value(row).as_bytes(), out),
            V::BinView(a) => write_bytes(a.value(row), out),
        }
    }
}

/// `0x00` → `0x00 0xFF`, then `0x00 0x01`: prefix-free and order-preserving.
#[inline]
pub(crate) fn write_bytes(bytes: &[u8], out: &mut Vec<u8>) {
    if bytes.contains(&0) {
        for &b in bytes {
            out.push(b);
            if b == 0 {
                out.push(0xFF);
            }
        }
    } else {
        out.extend_from_slice(bytes);
    }
    out.extend_from_slice(&[0x00, 0x01]);
}

/// Big-endian with the sign bit flipped: byte order = numeric order.
#[inline]
pub(crate) fn flip_i64(v: i64) -> [u8; 8] {
    ((v as u64) ^ (1 << 63)).to_be_bytes()
}

/// The inverse of [`flip_i64`].
#[inline]
pub(crate) fn unflip_i64(bytes: [u8; 8]) -> i64 {
    (u64::from_be_bytes(bytes) ^ (1 << 63)) as i64
}

/// FNV-1a 64: stable across runs and platforms (it picks the partition).
pub(crate) use crate::fnv::hash as fnv1a;

/// A stored key that does not decode as the column types it was written
/// with (a corrupt or foreign state entry).
#[derive(Debug, thiserror::Error)]
#[error("state key does not decode as {data_type} at byte {offset}")]
pub(crate) struct KeyDecodeError {
    pub data_type: DataType,
    pub offset: usize,
}

/// Values gathered row by row, in one of five physical shapes, and built
/// into an Arrow array of the column's type at the end.
#[derive(Debug)]
enum Collected {
    /// Booleans, signed integers, dates, times, timestamps, durations.
    I64(Vec<i64>),
    U64(Vec<u64>),
    F64(Vec<f64>),
    I128(Vec<i128>),
    Bytes {
        data: Vec<u8>,
        offsets: Vec<usize>,
    },
}

/// Builds one Arrow column from values pushed row by row (decoded keys,
/// aggregate results that keep their input's type).
#[derive(Debug)]
pub(crate) struct ColumnCollector {
    data_type: DataType,
    nulls: NullBufferBuilder,
    values: Collected,
}

impl ColumnCollector {
    /// `None` for a type that [`key_type_supported`] rejects.
    pub(crate) fn new(data_type: &DataType) -> Option<Self> {
        use DataType as D;
        if !key_type_supported(data_type) {
            return None;
        }
        let values = match data_type {
            D::UInt8 | D::UInt16 | D::UInt32 | D::UInt64 => Collected::U64(Vec::new()),
            D::Float32 | D::Float64 => Collected::F64(Vec::new()),
            D::Decimal128(_, _) => Collected::I128(Vec::new()),
            D::Utf8 | D::LargeUtf8 | D::Utf8View | D::Binary | D::LargeBinary | D::BinaryView => {
                Collected::Bytes {
                    data: Vec::new(),
                    offsets: vec![0],
                }
            }
            _ => Collected::I64(Vec::new()),
        };
        Some(Self {
            data_type: data_type.clone(),
            nulls: NullBufferBuilder::new(0),
            values,
        })
    }

    pub(crate) fn push_null(&mut self) {
        self.nulls.append_null();
        match &mut self.values {
            Collected::I64(v) => v.push(0),
            Collected::U64(v) => v.push(0),
            Collected::F64(v) => v.push(0.0),
            Collected::I128(v) => v.push(0),
            Collected::Bytes { data, offsets } => offsets.push(data.len()),
        }
    }

    /// For the signed-integer shape (booleans as 0/1).
    pub(crate) fn push_i64(&mut self, v: i64) {
        self.nulls.append_non_null();
        match &mut self.values {
            Collected::I64(values) => values.push(v),
            Collected::U64(values) => values.push(v as u64),
            Collected::F64(values) => values.push(v as f64),
            Collected::I128(values) => values.push(i128::from(v)),
            Collected::Bytes { data, offsets } => offsets.push(data.len()),
        }
    }

    pub(crate) fn push_u64(&mut self, v: u64) {
        match &mut self.values {
            Collected::U64(values) => {
                self.nulls.append_non_null();
                values.push(v);
            }
            _ => self.push_i64(v as i64),
        }
    }

    pub(crate) fn push_f64(&mut self, v: f64) {
        match &mut self.values {
            Collected::F64(values) => {
                self.nulls.append_non_null();
                values.push(v);
            }
            _ => self.push_i64(v as i64),
        }
    }

    pub(crate) fn push_i128(&mut self, v: i128) {
        match &mut self.values {
            Collected::I128(values) => {
                self.nulls.append_non_null();
                values.push(v);
            }
            _ => self.push_i64(v as i64),
        }
    }

    pub(crate) fn push_bytes(&mut self, bytes: &[u8]) {
        self.nulls.append_non_null();
        match &mut self.values {
            Collected::Bytes { data, offsets } => {
                data.extend_from_slice(bytes);
                offsets.push(data.len());
            }
            Collected::I64(v) => v.push(0),
            Collected::U64(v) => v.push(0),
            Collected::F64(v) => v.push(0.0),
            Collected::I128(v) => v.push(0),
        }
    }

    /// Reads one tagged value written by [`ColumnEncoder::write`] from the
    /// start of `input`; returns how many bytes it took.
    pub(crate) fn decode(&mut self, input: &[u8]) -> Result<usize, KeyDecodeError> {
        let fail = |offset| KeyDecodeError {
            data_type: self.data_type.clone(),
            offset,
        };
        match input.first() {
            Some(&TAG_NULL) => {
                self.push_null();
                return Ok(1);
            }
            Some(&TAG_VALUE) => {}
            _ => return Err(fail(0)),
        }
        let body = &input[1..];
        let fixed = |n: usize| body.get(..n).ok_or_else(|| fail(1));
        use DataType as D;
        let used = match &self.data_type {
            D::Boolean => {
                let b = fixed(1)?;
                self.push_i64(i64::from(b[0] != 0));
                1
            }
            D::Int8 => {
                let b = fixed(1)?;
                self.push_i64(i64::from((b[0] ^ 0x80) as i8));
                1
            }
            D::Int16 => {
                let b = fixed(2)?;
                let v = (u16::from_be_bytes([b[0], b[1]]) ^ (1 << 15)) as i16;
                self.push_i64(i64::from(v));
                2
            }
            D::Int32 | D::Date32 | D::Time32(_) => {
                let b = fixed(4)?;
                let v = (u32::from_be_bytes([b[0], b[1], b[2], b[3]]) ^ (1 << 31)) as i32;
                self.push_i64(i64::from(v));
                4
            }
            D::Int64 | D::Date64 | D::Time64(_) | D::Timestamp(_, _) | D::Duration(_) => {
                let b = fixed(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                self.push_i64(unflip_i64(a));
                8
            }
            D::UInt8 => {
                let b = fixed(1)?;
                self.push_u64(u64::from(b[0]));
                1
            }
            D::UInt16 => {
                let b = fixed(2)?;
                self.push_u64(u64::from(u16::from_be_bytes([b[0], b[1]])));
                2
            }
            D::UInt32 => {
                let b = fixed(4)?;
                self.push_u64(u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])));
                4
            }
            D::UInt64 => {
                let b = fixed(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                self.push_u64(u64::from_be_bytes(a));
                8
            }
            D::Float32 => {
                let b = fixed(4)?;
                let bits = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                let bits = if bits >> 31 == 1 {
                    bits ^ (1 << 31)
                } else {
                    !bits
                };
                self.push_f64(f64::from(f32::from_bits(bits)));
                4
            }
            D::Float64 => {
                let b = fixed(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                let bits = u64::from_be_bytes(a);
                let bits = if bits >> 63 == 1 {
                    bits ^ (1 << 63)
                } else {
                    !bits
                };
                self.push_f64(f64::from_bits(bits));
                8
            }
            D::Decimal128(_, _) => {
                let b = fixed(16)?;
                let mut a = [0u8; 16];
                a.copy_from_slice(b);
                self.push_i128((u128::from_be_bytes(a) ^ (1 << 127)) as i128);
                16
            }
            _ => {
                let Collected::Bytes { data, offsets } = &mut self.values else {
                    return Err(fail(1));
                };
                let mut i = 0;
                loop {
                    match (body.get(i), body.get(i + 1)) {
                        (Some(0), Some(0x01)) => break,
                        (Some(0), Some(0xFF)) => {
                            data.push(0);
                            i += 2;
                        }
                        (Some(&b), _) if b != 0 => {
                            data.push(b);
                            i += 1;
                        }
                        _ => {
                            let offset = 1 + i;
                            // Undo the partial value before reporting.
                            let start = offsets.last().copied().unwrap_or(0);
                            data.truncate(start);
                            return Err(KeyDecodeError {
                                data_type: self.data_type.clone(),
                                offset,
                            });
                        }
                    }
                }
                offsets.push(data.len());
                self.nulls.append_non_null();
                i + 2
            }
        };
        Ok(1 + used)
    }

    /// The column built so far, as an array of the collector's type.
    ///
    /// # Errors
    /// When string bytes are not UTF-8 or offsets overflow.
    pub(crate) fn finish(mut self) -> Result<ArrayRef, ArrowError> {
        use DataType as D;
        let nulls = self.nulls.finish();
        let dt = self.data_type.clone();
        let array: ArrayRef = match self.values {
            Collected::I64(v) => match &dt {
                D::Boolean => Arc::new(BooleanArray::new(
                    BooleanBuffer::from_iter(v.iter().map(|&x| x != 0)),
                    nulls,
                )),
                D::Int8 => prim::<Int8Type>(v.iter().map(|&x| x as i8), nulls),
                D::Int16 => prim::<Int16Type>(v.iter().map(|&x| x as i16), nulls),
                D::Int32 => prim::<Int32Type>(v.iter().map(|&x| x as i32), nulls),
                D::Date32 => prim::<Date32Type>(v.iter().map(|&x| x as i32), nulls),
                D::Time32(TimeUnit::Second) => {
                    prim::<Time32SecondType>(v.iter().map(|&x| x as i32), nulls)
                }
                D::Time32(_) => prim::<Time32MillisecondType>(v.iter().map(|&x| x as i32), nulls),
                D::Int64 => prim::<Int64Type>(v, nulls),
                D::Date64 => prim::<Date64Type>(v, nulls),
                D::Time64(TimeUnit::Nanosecond) => prim::<Time64NanosecondType>(v, nulls),
                D::Time64(_) => prim::<Time64MicrosecondType>(v, nulls),
                D::Timestamp(unit, tz) => {
                    let values = ScalarBuffer::from(v);
                    match unit {
                        TimeUnit::Second => Arc::new(
                            PrimitiveArray::<TimestampSecondType>::new(values, nulls)
                                .with_timezone_opt(tz.clone()),
                        ),
                        TimeUnit::Millisecond => Arc::new(
                            PrimitiveArray::<TimestampMillisecondType>::new(values, nulls)
                                .with_timezone_opt(tz.clone()),
                        ),
                        TimeUnit::Microsecond => Arc::new(
                            PrimitiveArray::<TimestampMicrosecondType>::new(values, nulls)
                                .with_timezone_opt(tz.clone()),
                        ),
                        TimeUnit::Nanosecond => Arc::new(
                            PrimitiveArray::<TimestampNanosecondType>::new(values, nulls)
                                .with_timezone_opt(tz.clone()),
                        ),
                    }
                }
                D::Duration(TimeUnit::Second) => prim::<DurationSecondType>(v, nulls),
                D::Duration(TimeUnit::Millisecond) => prim::<DurationMillisecondType>(v, nulls),
                D::Duration(TimeUnit::Microsecond) => prim::<DurationMicrosecondType>(v, nulls),
                D::Duration(TimeUnit::Nanosecond) => prim::<DurationNanosecondType>(v, nulls),
                other => return Err(unsupported(other)),
            },
            Collected::U64(v) => match &dt {
                D::UInt8 => prim::<UInt8Type>(v.iter().map(|&x| x as u8), nulls),
                D::UInt16 => prim::<UInt16Type>(v.iter().map(|&x| x as u16), nulls),
                D::UInt32 => prim::<UInt32Type>(v.iter().map(|&x| x as u32), nulls),
                D::UInt64 => prim::<UInt64Type>(v, nulls),
                other => return Err(unsupported(other)),
            },
            Collected::F64(v) => match &dt {
                D::Float32 => prim::<Float32Type>(v.iter().map(|&x| x as f32), nulls),
                D::Float64 => prim::<Float64Type>(v, nulls),
                other => return Err(unsupported(other)),
            },
            Collected::I128(v) => match &dt {
                D::Decimal128(p, s) => Arc::new(
                    PrimitiveArray::<Decimal128Type>::new(ScalarBuffer::from(v), nulls)
                        .with_precision_and_scale(*p, *s)?,
                ),
                other => return Err(unsupported(other)),
            },
            Collected::Bytes { data, offsets } => {
                let offsets = &offsets;
                let data = Buffer::from_vec(data);
                match &dt {
                    D::Utf8 | D::Utf8View => {
                        let a = StringArray::try_new(offsets32(offsets)?, data, nulls)?;
                        if matches!(dt, D::Utf8View) {
                            arrow_cast::cast(&a, &dt)?
                        } else {
                            Arc::new(a)
                        }
                    }
                    D::LargeUtf8 => {
                        Arc::new(LargeStringArray::try_new(offsets64(offsets)?, data, nulls)?)
                    }
                    D::Binary | D::BinaryView => {
                        let a = BinaryArray::try_new(offsets32(offsets)?, data, nulls)?;
                        if matches!(dt, D::BinaryView) {
                            arrow_cast::cast(&a, &dt)?
                        } else {
                            Arc::new(a)
                        }
                    }
                    D::LargeBinary => {
                        Arc::new(LargeBinaryArray::try_new(offsets64(offsets)?, data, nulls)?)
                    }
                    other => return Err(unsupported(other)),
                }
            }
        };
        Ok(array)
    }
}

fn prim<T: arrow_array::ArrowPrimitiveType>(
    values: impl IntoIterator<Item = T::Native>,
    nulls: Option<NullBuffer>,
) -> ArrayRef {
    let values: ScalarBuffer<T::Native> = values.into_iter().collect();
    Arc::new(PrimitiveArray::<T>::new(values, nulls))
}

fn unsupported(data_type: &DataType) -> ArrowError {
    ArrowError::InvalidArgumentError(format!("cannot build a key column of type {data_type}"))
}

fn offsets32(offsets: &[usize]) -> Result<OffsetBuffer<i32>, ArrowError> {
    let converted = offsets
        .iter()
        .map(|&o| i32::try_from(o))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| ArrowError::InvalidArgumentError("string column over 2 GiB".into()))?;
    Ok(OffsetBuffer::new(ScalarBuffer::from(converted)))
}

fn offsets64(offsets: &[usize]) -> Result<OffsetBuffer<i64>, ArrowError> {
    let converted = offsets.iter().map(|&o| o as i64).collect::<Vec<_>>();
    Ok(OffsetBuffer::new(ScalarBuffer::from(converted)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Decimal128Array, Float64Array, Int32Array, TimestampMicrosecondArray};

    fn round_trip(array: ArrayRef) {
        let encoder = ColumnEncoder::new(array.as_ref()).expect("supported");
        let mut collector = ColumnCollector::new(array.data_type()).expect("supported");
        for row in 0..array.len() {
            let mut buf = Vec::new();
            encoder.write(row, &mut buf);
            buf.push(0x77); // trailing key material must be left alone
            let used = collector.decode(&buf).expect("decodes");
            assert_eq!(used, buf.len() - 1);
        }
        let back = collector.finish().expect("builds");
        assert_eq!(back.as_ref(), array.as_ref());
    }

    #[test]
    fn decode_inverts_encode() {
        round_trip(Arc::new(Int32Array::from(vec![
            Some(-5),
            None,
            Some(i32::MAX),
        ])));
        round_trip(Arc::new(StringArray::from(vec![
            Some("a\0b"),
            None,
            Some(""),
            Some("zz"),
        ])));
        round_trip(Arc::new(Float64Array::from(vec![
            Some(-1.5),
            Some(0.0),
            None,
        ])));
        round_trip(Arc::new(
            Decimal128Array::from(vec![Some(-12345), None, Some(99)])
                .with_precision_and_scale(12, 2)
                .expect("valid"),
        ));
        round_trip(Arc::new(
            TimestampMicrosecondArray::from(vec![Some(-1), Some(1_700_000_000_000_000), None])
                .with_timezone("UTC"),
        ));
        round_trip(Arc::new(BooleanArray::from(vec![
            Some(true),
            None,
            Some(false),
        ])));
    }

    #[test]
    fn order_is_preserved() {
        let a = Int32Array::from(vec![-3, -1, 0, 7]);
        let e = ColumnEncoder::new(&a).expect("supported");
        let keys: Vec<Vec<u8>> = (0..a.len())
            .map(|r| {
                let mut v = Vec::new();
                e.write(r, &mut v);
                v
            })
            .collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
    }
}
