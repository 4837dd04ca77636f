//! How each column of a Parquet file is encoded: a dictionary only where it pays, and the
//! integers and strings the dictionary leaves alone as deltas.
//!
//! Why the dictionary question: the Parquet writer of the `parquet` crate dictionary-encodes
//! every column until the dictionary reaches 1 MB, hashing and interning each value on the way.
//! On a column of unique values (ids, timestamps, session strings) that work buys nothing: the
//! file holds every value once in the dictionary and an index per row besides, and it cost a
//! quarter of the CPU of a JSON → Parquet query. Spark's writer (parquet-mr) keeps a dictionary
//! only when it shrinks the first page (`isCompressionSatisfying`: dictionary plus indices
//! smaller than the plain values) and falls back to plain otherwise. We decide the same question
//! once per file, before writing, from a sample of the first batch, and leave the dictionary on
//! wherever in doubt, except that for integers the alternative is deltas (below), which beat a
//! dictionary of thousands of values in a narrow range (amounts, counts): there the sample
//! weighs the two sizes.
//!
//! Why deltas: an integer column without a dictionary (ids, event times, amounts) written plain
//! takes 8 bytes a value, which snappy then scans and barely shrinks (ids and times to 0.5–0.65
//! of the bytes, amounts and foreign keys not at all). `DELTA_BINARY_PACKED` stores the
//! differences between neighbours in as few bits as a block of 32 needs: near-sorted ids and
//! times take a few bits, small values their own width, and random 64-bit values about 8 bytes,
//! as plain does. On the bookshop orders the files shrank by 22 % and snappy's share of the
//! CPU fell from 16 to 9 % (`BENCHMARKS.md` §13.1).
//!
//! Strings without a dictionary (session ids, URLs, free text) are written `DELTA_BYTE_ARRAY`:
//! each value as the length of the prefix it shares with the previous one and the rest, the
//! lengths as deltas. Plain strings carry a 4-byte length each, and neighbours' shared prefixes
//! in full, which snappy then has to find again; the delta form leaves both out, so the file
//! is smaller before compression (session ids: 217 KB plain, 163 KB as deltas, 166 KB plain
//! after snappy) and snappy, which finds little left to shrink, passes over it quickly
//! (`BENCHMARKS.md` §13.2).
//!
//! Both encodings are in the Parquet format since 2.0 (2013), and writers choose them for their
//! "v2" files (parquet-mr's v2 writer picks `DELTA_BYTE_ARRAY` for strings); the pages around
//! them stay version 1. parquet-mr (Spark, Trino), Spark's vectorized reader since 3.3, arrow
//! (pyarrow, deltalake, DataFusion), DuckDB (0.8 and later) and Polars read them; Spark's
//! vectorized reader before 3.3 does not.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Schema, TimeUnit};
use foldhash::fast::FixedState;
use parquet::basic::Encoding;
use parquet::file::properties::WriterPropertiesBuilder;
use parquet::schema::types::ColumnPath;
use std::hash::BuildHasher;

/// Values the Parquet writer takes per step in both sinks (its default is 1,024): each step
/// computes levels, statistics and whether the page is full, a fixed cost that was measurable
/// per row (BENCHMARKS §13.3).
pub(super) const WRITE_BATCH_VALUES: usize = 8192;

/// Rows sampled per column.
const SAMPLE_ROWS: usize = 512;

/// `props` with, for each top-level column of `schema` (the file's) on which a dictionary would
/// not pay in the first non-empty batch of `batches` (see [`dictionary_columns`]), the
/// dictionary turned off, integers stored as Parquet `INT32` or `INT64` written as
/// `DELTA_BINARY_PACKED` and strings and binaries as `DELTA_BYTE_ARRAY`.
/// Columns are paired by position; a column whose type in the batch is not the file's keeps
/// plain values, a name the schema holds twice keeps the defaults (the properties are by
/// name, and the parquet crate panics on an encoding its column's type lacks), and batches of
/// another width leave `props` as they are.
pub(crate) fn column_encodings(
    mut props: WriterPropertiesBuilder,
    schema: &Schema,
    batches: &[RecordBatch],
) -> WriterPropertiesBuilder {
    let Some(first) = batches.iter().find(|b| b.num_rows() > 0) else {
        return props;
    };
    if first.num_columns() != schema.fields().len() {
        return props;
    }
    for ((field, column), dictionary) in schema
        .fields()
        .iter()
        .zip(first.columns())
        .zip(dictionary_columns(first))
    {
        let named_once = || {
            schema
                .fields()
                .iter()
                .filter(|f| f.name() == field.name())
                .count()
                == 1
        };
        if dictionary || !named_once() {
            continue;
        }
        let path = ColumnPath::new(vec![field.name().clone()]);
        props = props.set_column_dictionary_enabled(path.clone(), false);
        let data_type = field.data_type();
        if column.data_type() != data_type {
            continue;
        }
        if integer_width(data_type).is_some() {
            props = props.set_column_encoding(path, Encoding::DELTA_BINARY_PACKED);
        } else if stored_as_bytes(data_type) {
            props = props.set_column_encoding(path, Encoding::DELTA_BYTE_ARRAY);
        }
    }
    props
}

/// The bytes of one value when the Parquet writer stores values of `data_type` as `INT32` (4)
/// or `INT64` (8), the types `DELTA_BINARY_PACKED` encodes (decimals of up to 18 digits are
/// stored as integers); `None` for other types.
fn integer_width(data_type: &DataType) -> Option<usize> {
    match data_type {
        DataType::Int32 | DataType::Date32 => Some(4),
        DataType::Int64 | DataType::Timestamp(_, _) => Some(8),
        DataType::Decimal128(precision, _) if *precision <= 9 => Some(4),
        DataType::Decimal128(precision, _) if *precision <= 18 => Some(8),
        _ => None,
    }
}

/// Whether the Parquet writer stores values of `data_type` as `BYTE_ARRAY`.
fn stored_as_bytes(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
    )
}

/// For each column of `batch` (top level, in order): `false` when dictionary encoding would
/// not pay on a file of this batch's values, `true` otherwise (the default).
///
/// The sample's distinct count `d` among `s` non-null values: `d < s / 2` is plainly low
/// cardinality; otherwise the sample's repeats estimate the batch's distinct values by the
/// birthday bound (`s² / (2 · repeats)`; no repeat at all: plain), and a dictionary whose
/// values would be more than half the batch's rows costs more than it saves (the dictionary
/// stores them all, plus an index of several bits per row). For values Parquet stores as
/// integers the alternative is deltas, not plain values, and the dictionary must also beat
/// them (see [`Integers`]). Types other than the flat primitives and strings keep the
/// dictionary.
fn dictionary_columns(batch: &RecordBatch) -> Vec<bool> {
    // Rows at pseudo-random positions (the same on every run): evenly spaced ones would alias
    // with periodic data, seeing `i % 500` as 500 distinct values and no repeat. The columns
    // of a batch are equally long, so they share the positions.
    let len = batch.num_rows() as u64;
    let positions: Vec<usize> = if len < 2 * SAMPLE_ROWS as u64 {
        // Every column keeps its dictionary (below): no sample is drawn.
        Vec::new()
    } else {
        (0..SAMPLE_ROWS as u64)
            .map(|k| (mix(k) % len) as usize)
            .collect()
    };
    batch
        .columns()
        .iter()
        .map(|column| {
            let rows = column.len() - column.null_count();
            if rows < 2 * SAMPLE_ROWS {
                // Small files: the dictionary costs little either way.
                return true;
            }
            match sample(column.as_ref(), &positions) {
                Some(mut sample) => pays(&mut sample, rows),
                None => true,
            }
        })
        .collect()
}

/// A 64-bit finaliser (splitmix64): spreads consecutive integers over the whole range.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What the dictionary decision reads from a column.
struct Sample {
    /// One 64-bit key per sampled non-null value (strings hashed).
    keys: Vec<u64>,
    /// For values Parquet stores as integers: what deltas would cost.
    integers: Option<Integers>,
}

/// The size of an integer column's two encodings, from its sample.
///
/// Deltas take, per value, the bits of the largest difference between neighbours in a block
/// (at most the sample's range, and a sign bit); a dictionary takes each distinct value at
/// full width plus an index of `log2(distinct)` bits per row. Amounts in cents between 5 and
/// 50 currency units, 4,500 values in 10,000 rows, are the case in point: a dictionary of
/// 36 KB plus 13-bit indices, or 14-bit deltas, less than half of it.
struct Integers {
    /// Bits of `max - min` over the sample.
    range_bits: u32,
    /// Bytes of one value as Parquet stores it (4 or 8).
    width: usize,
}

/// Whether a dictionary pays for a column of `rows` non-null values with this sample.
fn pays(sample: &mut Sample, rows: usize) -> bool {
    let keys = &mut sample.keys;
    let s = keys.len();
    if s < 2 {
        return true;
    }
    keys.sort_unstable();
    let distinct = 1 + keys.windows(2).filter(|w| w[0] != w[1]).count();
    let estimated_distinct = if 2 * distinct < s {
        distinct as f64
    } else {
        let repeats = s - distinct;
        if repeats == 0 {
            // No value seen twice: no evidence that a dictionary would be smaller.
            return false;
        }
        let estimated = (s * s) as f64 / (2.0 * repeats as f64);
        if estimated >= rows as f64 / 2.0 {
            return false;
        }
        estimated
    };
    let Some(integers) = &sample.integers else {
        return true;
    };
    let rows = rows as f64;
    let index_bits = estimated_distinct.max(2.0).log2().ceil();
    let dictionary = estimated_distinct * integers.width as f64 + rows * index_bits / 8.0;
    let deltas = rows * f64::from(integers.range_bits + 1) / 8.0;
    dictionary < deltas
}

/// Bits of the difference between the largest and the smallest of `values`.
fn range_bits(values: impl Iterator<Item = i128>) -> u32 {
    let (lo, hi) = values.fold((i128::MAX, i128::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return 0;
    }
    128 - hi.abs_diff(lo).leading_zeros()
}

/// The hashes of the byte strings `value` gives at `rows`.
fn hashed<'a>(rows: &[usize], value: impl Fn(usize) -> &'a [u8]) -> Vec<u64> {
    let hasher = FixedState::with_seed(0);
    rows.iter().map(|&i| hasher.hash_one(value(i))).collect()
}

/// The sample of `column` at `positions` (its non-null values there), or `None` for a type
/// this module leaves alone.
fn sample(column: &dyn Array, positions: &[usize]) -> Option<Sample> {
    let rows: Vec<usize> = positions
        .iter()
        .copied()
        .filter(|&i| column.is_valid(i))
        .collect();
    // Integers: their keys, and the bits of their range at the width Parquet stores.
    let width = integer_width(column.data_type());
    let integers = |values: Vec<i128>| Sample {
        keys: values.iter().map(|&v| v as u64).collect(),
        integers: width.map(|width| Integers {
            range_bits: range_bits(values.into_iter()),
            width,
        }),
    };
    let keys = |keys: Vec<u64>| Sample {
        keys,
        integers: None,
    };
    Some(match column.data_type() {
        DataType::Int32 => {
            let values = column.as_primitive::<Int32Type>().values();
            integers(rows.iter().map(|&i| i128::from(values[i])).collect())
        }
        DataType::Int64 => {
            let values = column.as_primitive::<Int64Type>().values();
            integers(rows.iter().map(|&i| i128::from(values[i])).collect())
        }
        DataType::Date32 => {
            let values = column.as_primitive::<Date32Type>().values();
            integers(rows.iter().map(|&i| i128::from(values[i])).collect())
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            let values = column.as_primitive::<TimestampMicrosecondType>().values();
            integers(rows.iter().map(|&i| i128::from(values[i])).collect())
        }
        DataType::Float64 => {
            let values = column.as_primitive::<Float64Type>().values();
            keys(rows.iter().map(|&i| values[i].to_bits()).collect())
        }
        DataType::Decimal128(precision, _) if *precision <= 18 => {
            let values = column.as_primitive::<Decimal128Type>().values();
            integers(rows.iter().map(|&i| values[i]).collect())
        }
        DataType::Decimal128(_, _) => {
            let values = column.as_primitive::<Decimal128Type>().values();
            keys(
                rows.iter()
                    .map(|&i| {
                        let v = values[i] as u128;
                        (v as u64) ^ ((v >> 64) as u64).rotate_left(29)
                    })
                    .collect(),
            )
        }
        DataType::Utf8 => {
            let values = column.as_string::<i32>();
            keys(hashed(&rows, |i| values.value(i).as_bytes()))
        }
        DataType::Utf8View => {
            let values = column.as_string_view();
            keys(hashed(&rows, |i| values.value(i).as_bytes()))
        }
        DataType::LargeUtf8 => {
            let values = column.as_string::<i64>();
            keys(hashed(&rows, |i| values.value(i).as_bytes()))
        }
        DataType::Binary => {
            let values = column.as_binary::<i32>();
            keys(hashed(&rows, |i| values.value(i)))
        }
        DataType::LargeBinary => {
            let values = column.as_binary::<i64>();
            keys(hashed(&rows, |i| values.value(i)))
        }
        DataType::BinaryView => {
            let values = column.as_binary_view();
            keys(hashed(&rows, |i| values.value(i)))
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{Field, Schema};

    use super::*;

    fn batch(ids: Vec<i64>, names: Vec<String>) -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(ids)),
                Arc::new(StringArray::from(names)),
            ],
        )
        .unwrap()
    }

    #[test]
    fn unique_columns_are_plain_and_repeated_ones_keep_the_dictionary() {
        let n = 10_000;
        let unique = batch(
            (0..n).map(|i| i * 7919).collect(),
            (0..n).map(|i| format!("session-{i:08}")).collect(),
        );
        assert_eq!(dictionary_columns(&unique), [false, false]);

        // Four ids far apart: a 2-bit index beats 33-bit deltas.
        let statuses = ["completed", "pending", "cancelled", "refunded"];
        let repeated = batch(
            (0..n)
                .map(|i| 1_000_000_000_000 + (i % 4) * 1_000_000_007)
                .collect(),
            (0..n)
                .map(|i| statuses[i as usize % 4].to_owned())
                .collect(),
        );
        assert_eq!(dictionary_columns(&repeated), [true, true]);

        // A fifth as many distinct values as rows: every value about five times. Few repeats
        // in the sample, yet the birthday estimate sees that the dictionary pays (for the
        // strings; the integers, all below 2,000, are smaller as deltas).
        // Values drawn pseudo-randomly (an evenly spaced sample of `i % m` could alias).
        let draw = |i: i64| (mix(i as u64) % (n as u64 / 5)) as i64;
        let moderate = batch(
            (0..n).map(draw).collect(),
            (0..n).map(|i| format!("c{}", draw(i + n))).collect(),
        );
        assert_eq!(dictionary_columns(&moderate), [false, true]);
    }

    /// Integers weigh a dictionary against deltas: few values far apart keep it; amounts
    /// (thousands of distinct values in a narrow range) and small cycles are deltas.
    #[test]
    fn integers_keep_the_dictionary_only_where_it_beats_deltas() {
        use arrow_array::Decimal128Array;
        let n = 10_000_i64;
        let decide = |values: Vec<i128>, precision: u8| {
            let column = Decimal128Array::from_iter_values(values)
                .with_precision_and_scale(precision, 2)
                .unwrap();
            let schema = Schema::new(vec![Field::new("v", column.data_type().clone(), true)]);
            let batch = RecordBatch::try_new(Arc::new(schema), vec![Arc::new(column)]).unwrap();
            dictionary_columns(&batch)[0]
        };
        // Amounts from 5.00 to 49.99: about 4,500 values, 13 bits of range.
        let amounts = |i: i64| 500 + i128::from(mix(i as u64) % 4_500);
        assert!(!decide((0..n).map(amounts).collect(), 12));
        assert!(!decide((0..n).map(amounts).collect(), 9));
        // Seven prices, from 10.00 to 10,000,000.00: the dictionary.
        let prices = |i: i64| 100 * 10_i128.pow((mix(i as u64) % 20) as u32 / 3 + 1);
        assert!(decide((0..n).map(prices).collect(), 12));
        let ids = |values: Vec<i64>| {
            let b = batch(values, (0..n).map(|i| i.to_string()).collect());
            dictionary_columns(&b)[0]
        };
        assert!(!ids((0..n).map(|i| i % 500).collect()));
        assert!(ids((0..n).map(|i| (i % 3) << 40).collect()));
    }

    /// Columns without a dictionary: integers as Parquet stores them (`INT32` for dates and
    /// decimals of up to 9 digits, `INT64` up to 18) and strings become deltas; wide decimals
    /// stay plain. The file reads back as written, nulls and empty strings included.
    #[test]
    fn integers_and_strings_without_a_dictionary_are_deltas() {
        use arrow_array::{ArrayRef, Date32Array, Decimal128Array, TimestampMicrosecondArray};
        use parquet::arrow::ArrowWriter;
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        use parquet::file::properties::WriterProperties;
        let n = 10_000_i64;
        let decimal = |precision: u8, step: i128| -> ArrayRef {
            Arc::new(
                Decimal128Array::from_iter_values((0..n).map(|i| i128::from(i) * step))
                    .with_precision_and_scale(precision, 2)
                    .unwrap(),
            )
        };
        let columns: Vec<(&str, ArrayRef)> = vec![
            ("id", Arc::new(Int64Array::from_iter_values(0..n))),
            (
                "at",
                Arc::new(TimestampMicrosecondArray::from_iter_values(
                    (0..n).map(|i| 1_700_000_000_000_000 + i * 997),
                )),
            ),
            (
                "day",
                Arc::new(Date32Array::from_iter_values((0..n).map(|i| i as i32))),
            ),
            ("small", decimal(9, 3)),
            ("amount", decimal(12, 37)),
            ("wide", decimal(30, 1)),
            (
                "session",
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| format!("s-{:016x}", mix(i as u64))),
                )),
            ),
            (
                "url",
                Arc::new(StringArray::from_iter((0..n).map(|i| match i % 500 {
                    0 | 250 => None,
                    1 => Some(String::new()),
                    _ => Some(format!("https://example.com/book/{i}")),
                }))),
            ),
            (
                "few",
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i % 7))),
            ),
        ];
        let schema = Arc::new(Schema::new(
            columns
                .iter()
                .map(|(name, c)| Field::new(*name, c.data_type().clone(), true))
                .collect::<Vec<_>>(),
        ));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            columns.iter().map(|(_, c)| Arc::clone(c)).collect(),
        )
        .unwrap();
        let props = column_encodings(
            WriterProperties::builder(),
            &schema,
            std::slice::from_ref(&batch),
        )
        .build();
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f.parquet");
        let mut writer =
            ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, Some(props))
                .unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let reader =
            ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap()).unwrap();
        let got: Vec<(&str, bool, bool, bool)> = reader
            .metadata()
            .row_group(0)
            .columns()
            .iter()
            .zip(&columns)
            .map(|(c, (name, _))| {
                let has = |e| c.encodings().any(|x| x == e);
                (
                    *name,
                    has(Encoding::RLE_DICTIONARY),
                    has(Encoding::DELTA_BINARY_PACKED),
                    has(Encoding::DELTA_BYTE_ARRAY),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("id", false, true, false),
                ("at", false, true, false),
                ("day", false, true, false),
                ("small", false, true, false),
                ("amount", false, true, false),
                ("wide", false, false, false),
                ("session", false, false, true),
                ("url", false, false, true),
                ("few", true, false, false),
            ]
        );
        let read: Vec<RecordBatch> = reader.build().unwrap().map(Result::unwrap).collect();
        assert_eq!(
            arrow_select::concat::concat_batches(&batch.schema(), &read).unwrap(),
            batch
        );
    }

    /// Names and types are the file's: a column the batch holds with another type gets no
    /// deltas, and a batch of another width changes nothing.
    #[test]
    fn the_file_schema_decides_and_a_mismatch_keeps_the_defaults() {
        use parquet::file::properties::WriterProperties;
        let unique = batch(
            (0..10_000).map(|i| i * 7919).collect(),
            (0..10_000).map(|i| format!("session-{i:08}")).collect(),
        );
        let path = |name: &str| ColumnPath::new(vec![name.to_owned()]);
        let props_for = |file: &Schema| {
            column_encodings(
                WriterProperties::builder(),
                file,
                std::slice::from_ref(&unique),
            )
            .build()
        };
        let props = props_for(&Schema::new(vec![
            Field::new("key", DataType::Float64, true),
            Field::new("name", DataType::Utf8, true),
        ]));
        assert!(!props.dictionary_enabled(&path("key")));
        assert_eq!(props.encoding(&path("key")), None);
        assert_eq!(
            props.encoding(&path("name")),
            Some(Encoding::DELTA_BYTE_ARRAY)
        );
        assert!(props.dictionary_enabled(&path("id")));
        // Two columns of one name (one integer, one string) share their properties: neither
        // gets an encoding the other's type lacks.
        let props = props_for(&Schema::new(vec![
            Field::new("x", DataType::Int64, true),
            Field::new("x", DataType::Utf8, true),
        ]));
        assert!(props.dictionary_enabled(&path("x")));
        assert_eq!(props.encoding(&path("x")), None);
        let props = props_for(&Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        assert!(props.dictionary_enabled(&path("id")));
        assert_eq!(props.encoding(&path("id")), None);
    }

    #[test]
    fn small_batches_and_other_types_keep_the_dictionary() {
        let small = batch(
            (0..100).collect(),
            (0..100).map(|i| i.to_string()).collect(),
        );
        assert_eq!(dictionary_columns(&small), [true, true]);
        let nulls = Int64Array::from(vec![None::<i64>; 5_000]);
        let schema = Schema::new(vec![Field::new("n", DataType::Int64, true)]);
        let all_null = RecordBatch::try_new(Arc::new(schema), vec![Arc::new(nulls)]).unwrap();
        assert_eq!(dictionary_columns(&all_null), [true]);
    }
}
