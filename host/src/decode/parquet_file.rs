//! Parquet files (`format = "parquet"`): whole files, not lines.
//!
//! The schema's columns are read by name — the column of exactly that name, else the one
//! column whose name differs only in ASCII case (Spark resolves Parquet columns ignoring case
//! by default) — and cast to the schema's types; a column the file lacks is null in every row
//! (all fields are nullable), a column the schema lacks is not read at all. Without a declared
//! schema, the schema is one file's own ([`ParquetDecoder::infer`]), each column given the Weir
//! type that holds it ([`weir_type`]): narrower integers widen, floats become DOUBLE, any
//! timestamp becomes TIMESTAMP (µs, UTC), large and view strings STRING.
//!
//! A Parquet file has no malformed rows: a file that cannot be read (not Parquet, truncated,
//! corrupt), a column whose type cannot become the schema's, or a value that cannot be
//! converted (an overflow, a string that is not a number) fails the whole file with an error
//! naming it (and the column). Every row read counts as an input row.

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, RecordBatchOptions, new_null_array};
use arrow_cast::{CastOptions, can_cast_types, cast_with_options};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::reader::ChunkReader;

use super::cells::Kind;
use super::{DecodeError, Decoded};

/// The Weir type that holds values of the Arrow type `data_type` (as the Parquet reader
/// returns it), `None` when there is none (lists, structs, maps, binary, times, intervals).
///
/// Signed integers of up to 32 bits become INT, 64-bit ones BIGINT; unsigned ones the next
/// wider type, UINT64 DECIMAL(20,0) (as Spark reads them); floats DOUBLE; decimals of at most
/// 38 digits DECIMAL(p,s); any string STRING; dates DATE; timestamps of any unit and time zone
/// (none included: read as UTC) TIMESTAMP; a dictionary its values' type.
pub fn weir_type(data_type: &DataType) -> Option<DataType> {
    use DataType as T;
    Some(match data_type {
        T::Boolean => T::Boolean,
        T::Int8 | T::Int16 | T::Int32 | T::UInt8 | T::UInt16 => T::Int32,
        T::Int64 | T::UInt32 => T::Int64,
        T::UInt64 => T::Decimal128(20, 0),
        T::Float16 | T::Float32 | T::Float64 => T::Float64,
        T::Decimal32(p, s) | T::Decimal64(p, s) | T::Decimal128(p, s) | T::Decimal256(p, s)
            if (1..=38).contains(p) && *s >= 0 && i16::from(*s) <= i16::from(*p) =>
        {
            T::Decimal128(*p, *s)
        }
        T::Utf8 | T::LargeUtf8 | T::Utf8View => T::Utf8,
        T::Date32 | T::Date64 => T::Date32,
        T::Timestamp(_, _) => T::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
        T::Dictionary(_, values) => return weir_type(values),
        _ => return None,
    })
}

/// Reads Parquet files into batches of one schema.
#[derive(Debug, Clone)]
pub struct ParquetDecoder {
    /// The output schema: the declared (or inferred) fields, all nullable.
    schema: SchemaRef,
    /// Rows per output batch, at most.
    batch_size: usize,
}

impl ParquetDecoder {
    /// A decoder producing batches of `schema` (its fields made nullable) of at most
    /// `batch_size` rows.
    ///
    /// # Errors
    /// [`DecodeError::UnsupportedType`] for a field of a type Weir batches do not carry,
    /// [`DecodeError::InvalidField`] for a name given twice, [`DecodeError::ZeroBatchSize`].
    pub fn new(schema: SchemaRef, batch_size: usize) -> Result<Self, DecodeError> {
        if batch_size == 0 {
            return Err(DecodeError::ZeroBatchSize);
        }
        let mut names = HashSet::with_capacity(schema.fields().len());
        for field in schema.fields() {
            if !names.insert(field.name().as_str()) {
                return Err(DecodeError::InvalidField {
                    field: field.name().clone(),
                    reason: "the schema names this field twice",
                });
            }
            if Kind::of(field.data_type()).is_none() {
                return Err(DecodeError::UnsupportedType {
                    field: field.name().clone(),
                    data_type: field.data_type().clone(),
                });
            }
        }
        let fields: Vec<Field> = schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        Ok(Self {
            schema: Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())),
            batch_size,
        })
    }

    /// A decoder whose schema is the file `file`'s own (only its footer is read), each column
    /// of the type [`weir_type`] gives it; `origin` names the file in errors.
    ///
    /// # Errors
    /// [`DecodeError::Parquet`] when the file cannot be read as Parquet,
    /// [`DecodeError::ParquetColumn`] naming a column no Weir type holds.
    pub fn infer<R: ChunkReader + 'static>(
        file: R,
        origin: &str,
        batch_size: usize,
    ) -> Result<Self, DecodeError> {
        let builder =
            ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| unreadable(origin, &e))?;
        let mut fields = Vec::with_capacity(builder.schema().fields().len());
        for field in builder.schema().fields() {
            let Some(data_type) = weir_type(field.data_type()) else {
                return Err(column_error(
                    origin,
                    field.name(),
                    format!(
                        "is {} in the file, which no Weir type holds (BOOLEAN, INT, BIGINT, \
                         DOUBLE, DECIMAL, STRING, DATE, TIMESTAMP): declare a `schema` that \
                         leaves it out",
                        field.data_type()
                    ),
                ));
            };
            fields.push(Field::new(field.name(), data_type, true));
        }
        Self::new(Arc::new(Schema::new(fields)), batch_size)
    }

    /// The schema of the output batches (all fields nullable; no `_corrupt_record` column).
    pub fn output_schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Reads the whole Parquet file `file`, appending its batches (never spanning two files)
    /// and its rows to `out`; `origin` names the file in errors.
    ///
    /// # Errors
    /// [`DecodeError::Parquet`] when the file cannot be read, [`DecodeError::ParquetColumn`]
    /// naming a column that cannot be read as the schema's, [`DecodeError::Arrow`]. On error
    /// `out` is left unchanged.
    pub fn decode<R: ChunkReader + 'static>(
        &self,
        file: R,
        origin: &str,
        out: &mut Decoded,
    ) -> Result<(), DecodeError> {
        let mut batches = Vec::new();
        let rows = self.read(file, origin, &mut batches)?;
        out.batches.append(&mut batches);
        out.num_input_rows += rows;
        Ok(())
    }

    fn read<R: ChunkReader + 'static>(
        &self,
        file: R,
        origin: &str,
        out: &mut Vec<RecordBatch>,
    ) -> Result<u64, DecodeError> {
        let builder =
            ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| unreadable(origin, &e))?;
        let file_schema = Arc::clone(builder.schema());
        // Per output field, the file's (top-level) column holding it.
        let mut sources: Vec<Option<usize>> = Vec::with_capacity(self.schema.fields().len());
        for field in self.schema.fields() {
            let found = column_index(&file_schema, field.name())
                .map_err(|reason| column_error(origin, field.name(), reason))?;
            if let Some(i) = found {
                let from = file_schema.field(i).data_type();
                if weir_type(from).is_none() || !can_cast_types(from, field.data_type()) {
                    return Err(column_error(
                        origin,
                        field.name(),
                        format!(
                            "is {from} in the file, which cannot be read as {}",
                            type_name(field.data_type())
                        ),
                    ));
                }
            }
            sources.push(found);
        }
        let mut roots: Vec<usize> = sources.iter().flatten().copied().collect();
        roots.sort_unstable();
        roots.dedup();
        if roots.is_empty() {
            // None of the schema's columns is in the file: its rows, every field null.
            let rows = u64::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
            let mut left = rows;
            while left > 0 {
                let n = usize::try_from(left).map_or(self.batch_size, |l| l.min(self.batch_size));
                let columns = self
                    .schema
                    .fields()
                    .iter()
                    .map(|f| new_null_array(f.data_type(), n))
                    .collect();
                out.push(self.assemble(origin, columns, n)?);
                left -= n as u64;
            }
            return Ok(rows);
        }
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots.iter().copied());
        let reader = builder
            .with_projection(mask)
            .with_batch_size(self.batch_size)
            .build()
            .map_err(|e| unreadable(origin, &e))?;
        let options = CastOptions {
            safe: false,
            ..CastOptions::default()
        };
        let mut rows = 0u64;
        for batch in reader {
            let batch = batch.map_err(|e| unreadable(origin, &e))?;
            let n = batch.num_rows();
            let mut columns: Vec<ArrayRef> = Vec::with_capacity(sources.len());
            for (field, source) in self.schema.fields().iter().zip(&sources) {
                let column = match source {
                    None => new_null_array(field.data_type(), n),
                    Some(root) => {
                        // The projection keeps the file's order of columns.
                        let column = roots
                            .binary_search(root)
                            .ok()
                            .and_then(|at| batch.columns().get(at))
                            .ok_or_else(|| {
                                column_error(
                                    origin,
                                    field.name(),
                                    "is missing from the rows read".to_owned(),
                                )
                            })?;
                        if column.data_type() == field.data_type() {
                            Arc::clone(column)
                        } else {
                            cast_with_options(column, field.data_type(), &options).map_err(|e| {
                                column_error(
                                    origin,
                                    field.name(),
                                    format!(
                                        "cannot be read as {}: {e}",
                                        type_name(field.data_type())
                                    ),
                                )
                            })?
                        }
                    }
                };
                columns.push(column);
            }
            out.push(self.assemble(origin, columns, n)?);
            rows += n as u64;
        }
        Ok(rows)
    }

    fn assemble(
        &self,
        origin: &str,
        columns: Vec<ArrayRef>,
        rows: usize,
    ) -> Result<RecordBatch, DecodeError> {
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options).map_err(
            |source| DecodeError::Arrow {
                origin: origin.to_owned(),
                source,
            },
        )
    }
}

/// The top-level column of `schema` that the field `name` reads: the one of exactly that name,
/// else the only one equal ignoring ASCII case; an error when several are.
fn column_index(schema: &Schema, name: &str) -> Result<Option<usize>, String> {
    let fields = schema.fields();
    if let Some(i) = fields.iter().position(|f| f.name() == name) {
        return Ok(Some(i));
    }
    let mut matching = fields
        .iter()
        .enumerate()
        .filter(|(_, f)| f.name().eq_ignore_ascii_case(name));
    match (matching.next(), matching.next()) {
        (None, _) => Ok(None),
        (Some((i, _)), None) => Ok(Some(i)),
        (Some((_, a)), Some((_, b))) => Err(format!(
            "matches both {:?} and {:?} of the file (names are compared ignoring case)",
            a.name(),
            b.name()
        )),
    }
}

/// Spark's name of a Weir type, for messages.
fn type_name(data_type: &DataType) -> String {
    Kind::of(data_type).map_or_else(|| data_type.to_string(), |k| k.sql_name())
}

fn unreadable(origin: &str, error: &dyn std::fmt::Display) -> DecodeError {
    DecodeError::Parquet {
        origin: origin.to_owned(),
        reason: error.to_string(),
    }
}

fn column_error(origin: &str, column: &str, reason: String) -> DecodeError {
    DecodeError::ParquetColumn {
        origin: origin.to_owned(),
        column: column.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{
        Array, Float32Array, Int32Array, Int64Array, LargeStringArray, StringArray,
        TimestampMillisecondArray,
    };
    use bytes::Bytes;
    use parquet::arrow::ArrowWriter;

    use super::*;

    /// A Parquet file of `batch`, in memory.
    fn parquet_bytes(batch: &RecordBatch) -> Bytes {
        let mut buf = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut buf, batch.schema(), None).unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
        Bytes::from(buf)
    }

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).unwrap()
    }

    #[test]
    fn columns_are_read_by_name_widened_and_missing_ones_are_null() {
        // `id` is INT in the file and BIGINT in the schema; `extra` is not in the schema;
        // `note` is not in the second file.
        let first = parquet_bytes(&batch(vec![
            (
                "extra",
                Arc::new(StringArray::from(vec!["x", "y"])) as ArrayRef,
            ),
            ("id", Arc::new(Int32Array::from(vec![1, 2])) as ArrayRef),
            (
                "note",
                Arc::new(LargeStringArray::from(vec![Some("a"), None])) as ArrayRef,
            ),
        ]));
        let second = parquet_bytes(&batch(vec![(
            "ID",
            Arc::new(Int64Array::from(vec![3_000_000_000_i64])) as ArrayRef,
        )]));
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("note", DataType::Utf8, true),
        ]));
        let decoder = ParquetDecoder::new(schema, 65_536).unwrap();
        let mut out = Decoded::default();
        decoder.decode(first, "a.parquet", &mut out).unwrap();
        decoder.decode(second, "b.parquet", &mut out).unwrap();
        assert_eq!(out.num_input_rows, 3);
        assert_eq!(out.num_malformed, 0);
        assert_eq!(out.batches.len(), 2);
        for b in &out.batches {
            assert_eq!(b.schema(), *decoder.output_schema());
            assert!(b.schema().fields().iter().all(|f| f.is_nullable()));
        }
        let ids: Vec<i64> = out
            .batches
            .iter()
            .flat_map(|b| {
                let ids = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                ids.values().to_vec()
            })
            .collect();
        assert_eq!(ids, [1, 2, 3_000_000_000]);
        let notes = out.batches[0]
            .column(1)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!(notes.value(0), "a");
        assert!(notes.is_null(1));
        assert_eq!(out.batches[1].column(1).null_count(), 1);
    }

    #[test]
    fn the_inferred_schema_holds_weir_types() {
        let file = parquet_bytes(&batch(vec![
            ("n", Arc::new(Int32Array::from(vec![7])) as ArrayRef),
            ("x", Arc::new(Float32Array::from(vec![1.5])) as ArrayRef),
            (
                "at",
                Arc::new(TimestampMillisecondArray::from(vec![1_000_i64])) as ArrayRef,
            ),
        ]));
        let decoder = ParquetDecoder::infer(file.clone(), "a.parquet", 10).unwrap();
        let types: Vec<&DataType> = decoder
            .output_schema()
            .fields()
            .iter()
            .map(|f| f.data_type())
            .collect();
        assert_eq!(
            types,
            [
                &DataType::Int32,
                &DataType::Float64,
                &DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            ]
        );
        let mut out = Decoded::default();
        decoder.decode(file, "a.parquet", &mut out).unwrap();
        assert_eq!(out.num_input_rows, 1);
        assert_eq!(out.batches[0].num_columns(), 3);
    }

    #[test]
    fn bad_files_and_columns_are_named() {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int32, true)]));
        let decoder = ParquetDecoder::new(schema, 10).unwrap();
        let mut out = Decoded::default();
        let err = decoder
            .decode(Bytes::from_static(b"{\"id\":1}\n"), "a.json", &mut out)
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot read a.json as Parquet: "),
            "{err}"
        );
        // A value that does not fit fails the file, naming the column.
        let file = parquet_bytes(&batch(vec![(
            "id",
            Arc::new(Int64Array::from(vec![1, i64::MAX])) as ArrayRef,
        )]));
        let err = decoder.decode(file, "b.parquet", &mut out).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("b.parquet: column \"id\" cannot be read as INT: "),
            "{err}"
        );
        assert_eq!(out.num_input_rows, 0);
        assert!(out.batches.is_empty());
    }
}
