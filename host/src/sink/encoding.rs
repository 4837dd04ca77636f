//! How each column of a Parquet file is encoded: a dictionary only where it pays, and integers
//! the dictionary leaves alone as deltas.
//!
//! Why the dictionary question: the Parquet writer of the `parquet` crate dictionary-encodes
//! every column until the dictionary reaches 1 MB, hashing and interning each value on the way.
//! On a column of unique values (ids, timestamps, session strings) that work buys nothing: the
//! file holds every value once in the dictionary and an index per row besides, and it cost a
//! quarter of the CPU of a JSON → Parquet query. Spark's writer (parquet-mr) keeps a dictionary
//! only when it shrinks the first page (`isCompressionSatisfying`: dictionary plus indices
//! smaller than the plain values) and falls back to plain otherwise. We decide the same question
//! once per file, before writing, from a sample of the first batch, and leave the dictionary on
//! wherever in doubt.
//!
//! Why deltas: an integer column without a dictionary (ids, event times, amounts) written plain
//! takes 8 bytes a value, which snappy then scans and barely shrinks (ids and times to 0.5–0.65
//! of the bytes, amounts and foreign keys not at all). `DELTA_BINARY_PACKED` stores the
//! differences between neighbours in as few bits as a block of 32 needs: near-sorted ids and
//! times take a few bits, small values their own width, and random 64-bit values about 8 bytes,
//! as plain does. On the bookshop orders the files shrank by 22 % and snappy's share of the
//! CPU fell from 16 to 9 % (`BENCHMARKS.md` §13.1). The encoding is in the Parquet format since
//! 2.0 (2013), and writers choose it for their "v2" files; the pages around it stay version 1.
//! parquet-mr (Spark, Trino), Spark's vectorized reader since 3.3, arrow (pyarrow, deltalake,
//! DataFusion), DuckDB and Polars read it; Spark's vectorized reader before 3.3 does not.

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

/// Rows sampled per column.
const SAMPLE_ROWS: usize = 512;

/// `props` with, for each top-level column of `schema` (the file's) on which a dictionary would
/// not pay in the first non-empty batch of `batches` (see [`dictionary_columns`]), the
/// dictionary turned off, and integers stored as Parquet `INT32` or `INT64` written as deltas.
/// Columns are paired by position; a column whose type in the batch is not the file's keeps
/// plain values, and batches of another width leave `props` as they are.
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
        if dictionary {
            continue;
        }
        let path = ColumnPath::new(vec![field.name().clone()]);
        props = props.set_column_dictionary_enabled(path.clone(), false);
        if stored_as_integers(field.data_type()) && column.data_type() == field.data_type() {
            props = props.set_column_encoding(path, Encoding::DELTA_BINARY_PACKED);
        }
    }
    props
}

/// Whether the Parquet writer stores values of `data_type` as `INT32` or `INT64`, the types
/// `DELTA_BINARY_PACKED` encodes (decimals of up to 18 digits are stored as integers).
fn stored_as_integers(data_type: &DataType) -> bool {
    match data_type {
        DataType::Int32 | DataType::Int64 | DataType::Date32 | DataType::Timestamp(_, _) => true,
        DataType::Decimal128(precision, _) => *precision <= 18,
        _ => false,
    }
}

/// For each column of `batch` (top level, in order): `false` when dictionary encoding would
/// not pay on a file of this batch's values, `true` otherwise (the default).
///
/// The sample's distinct count `d` among `s` non-null values: `d < s / 2` is plainly low
/// cardinality; otherwise the sample's repeats estimate the batch's distinct values by the
/// birthday bound (`s² / (2 · repeats)`; no repeat at all: plain), and a dictionary whose values would be more than
/// half the batch's rows costs more than it saves (the dictionary stores them all, plus an
/// index of several bits per row). Types other than the flat primitives and strings keep the
/// dictionary.
fn dictionary_columns(batch: &RecordBatch) -> Vec<bool> {
    batch
        .columns()
        .iter()
        .map(|column| {
            let rows = column.len() - column.null_count();
            if rows < 2 * SAMPLE_ROWS {
                // Small files: the dictionary costs little either way.
                return true;
            }
            match sample_keys(column.as_ref()) {
                Some(mut keys) => pays(&mut keys, rows),
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

/// Whether a dictionary pays for a column of `rows` non-null values whose sample is `keys`.
fn pays(keys: &mut [u64], rows: usize) -> bool {
    let s = keys.len();
    if s < 2 {
        return true;
    }
    keys.sort_unstable();
    let distinct = 1 + keys.windows(2).filter(|w| w[0] != w[1]).count();
    if 2 * distinct < s {
        return true;
    }
    let repeats = s - distinct;
    if repeats == 0 {
        // No value seen twice: no evidence that a dictionary would be smaller.
        return false;
    }
    let estimated_distinct = (s * s) as f64 / (2.0 * repeats as f64);
    estimated_distinct < rows as f64 / 2.0
}

/// One 64-bit key per sampled non-null value (strings hashed), or `None` for a type this
/// module leaves alone.
fn sample_keys(column: &dyn Array) -> Option<Vec<u64>> {
    let len = column.len() as u64;
    // Rows at pseudo-random positions (the same on every run): evenly spaced ones would
    // alias with periodic data, seeing `i % 500` as 500 distinct values and no repeat.
    let rows = (0..SAMPLE_ROWS as u64)
        .map(|k| (mix(k) % len) as usize)
        .filter(|&i| column.is_valid(i));
    let keys = match column.data_type() {
        DataType::Int32 => {
            let values = column.as_primitive::<Int32Type>().values();
            rows.map(|i| values[i] as u64).collect()
        }
        DataType::Int64 => {
            let values = column.as_primitive::<Int64Type>().values();
            rows.map(|i| values[i] as u64).collect()
        }
        DataType::Date32 => {
            let values = column.as_primitive::<Date32Type>().values();
            rows.map(|i| values[i] as u64).collect()
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            let values = column.as_primitive::<TimestampMicrosecondType>().values();
            rows.map(|i| values[i] as u64).collect()
        }
        DataType::Float64 => {
            let values = column.as_primitive::<Float64Type>().values();
            rows.map(|i| values[i].to_bits()).collect()
        }
        DataType::Decimal128(_, _) => {
            let values = column.as_primitive::<Decimal128Type>().values();
            rows.map(|i| {
                let v = values[i] as u128;
                (v as u64) ^ ((v >> 64) as u64).rotate_left(29)
            })
            .collect()
        }
        DataType::Utf8 => {
            let values = column.as_string::<i32>();
            let hasher = FixedState::with_seed(0);
            rows.map(|i| hasher.hash_one(values.value(i))).collect()
        }
        DataType::Utf8View => {
            let values = column.as_string_view();
            let hasher = FixedState::with_seed(0);
            rows.map(|i| hasher.hash_one(values.value(i))).collect()
        }
        _ => return None,
    };
    Some(keys)
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

        let statuses = ["completed", "pending", "cancelled", "refunded"];
        let repeated = batch(
            (0..n).map(|i| i % 500).collect(),
            (0..n)
                .map(|i| statuses[i as usize % 4].to_owned())
                .collect(),
        );
        assert_eq!(dictionary_columns(&repeated), [true, true]);

        // A fifth as many distinct values as rows: every value about five times. Few repeats
        // in the sample, yet the birthday estimate sees that the dictionary pays.
        // Values drawn pseudo-randomly (an evenly spaced sample of `i % m` could alias).
        let draw = |i: i64| (mix(i as u64) % (n as u64 / 5)) as i64;
        let moderate = batch(
            (0..n).map(draw).collect(),
            (0..n).map(|i| format!("c{}", draw(i + n))).collect(),
        );
        assert_eq!(dictionary_columns(&moderate), [true, true]);
    }

    /// Columns without a dictionary: integers as Parquet stores them (`INT32` for dates and
    /// decimals of up to 9 digits, `INT64` up to 18) become deltas; strings and wide decimals
    /// stay plain. The file reads back as written.
    #[test]
    fn integers_without_a_dictionary_are_deltas() {
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
        let got: Vec<(&str, bool, bool)> = reader
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
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("id", false, true),
                ("at", false, true),
                ("day", false, true),
                ("small", false, true),
                ("amount", false, true),
                ("wide", false, false),
                ("session", false, false),
                ("few", true, false),
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
        let file = Schema::new(vec![
            Field::new("key", DataType::Float64, true),
            Field::new("name", DataType::Utf8, true),
        ]);
        let props = column_encodings(
            WriterProperties::builder(),
            &file,
            std::slice::from_ref(&unique),
        )
        .build();
        assert!(!props.dictionary_enabled(&path("key")));
        assert_eq!(props.encoding(&path("key")), None);
        assert!(props.dictionary_enabled(&path("id")));
        let narrower = Schema::new(vec![Field::new("id", DataType::Int64, true)]);
        let props = column_encodings(WriterProperties::builder(), &narrower, &[unique]).build();
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
