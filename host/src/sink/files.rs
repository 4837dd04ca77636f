//! The files sink's writer: one file per micro-batch, in JSON lines, CSV or Parquet.
//!
//! Why it exists: exactly-once output to a directory needs a file name that is a function of the
//! batch id (so a replayed batch replaces its own earlier output instead of adding a copy) and a
//! write that readers never see half done (hidden temp file, fsync, rename, fsync of the directory).
//! The text formats are written by hand, column by column over typed Arrow arrays, because Spark's
//! value formatting (nulls omitted, `2024-03-01T00:03:07.123Z`, `23.90`) is the contract and a
//! generic JSON value per row would be slow.
//!
//! # Layout
//!
//! `dir/batch-00000000000000000007.json` holds all rows of batch 7. Temp files are
//! `dir/.batch-<id>.<ext>.<uuid>.tmp`; [`FilesWriter::clean_temp_files`] removes leftovers.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type,
    Int64Type, TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{
    Array, ArrayRef, BooleanArray, GenericStringArray, RecordBatch, StringViewArray,
};
use arrow_buffer::{NullBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType, SchemaRef, TimeUnit};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::{ArrowColumnChunk, ArrowColumnWriter, compute_leaves};
use parquet::basic::Compression;
use parquet::errors::ParquetError;
use parquet::file::properties::WriterProperties;

use crate::spec::OutputFormat;
use crate::threads::Threads;

/// Rows per Parquet row group at most.
const PARQUET_ROW_GROUP_ROWS: usize = 1_000_000;
/// Size of the write buffer of the text formats.
const WRITE_BUFFER_BYTES: usize = 256 * 1024;

/// The files a [`FilesWriter`] writes: JSON lines (keys in schema order, nulls omitted), CSV
/// with a header line (RFC 4180 quoting, `\n` line ends, null as an empty field) or Parquet
/// (snappy-compressed, dictionary-encoded only where it pays, other integers and strings as
/// deltas).
impl OutputFormat {
    /// The file name extension, without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Csv => "csv",
            Self::Parquet => "parquet",
        }
    }
}

/// What [`FilesWriter::write_batch`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesWritten {
    /// Rows written.
    pub rows: usize,
    /// The file written, `None` when the batch held no rows.
    pub path: Option<PathBuf>,
}

/// Errors of the file and console sink writers; each names the file (or batch) involved.
#[derive(Debug, thiserror::Error)]
pub enum SinkFileError {
    /// The file system refused an operation.
    #[error("{}: cannot {op}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A column's type cannot be written in this format.
    #[error(
        "{}: column `{column}` has type {data_type}, which the {format:?} format cannot write \
         (supported: boolean, integers, floats, decimal128, strings, timestamps, date32; \
         Parquet writes any type)",
        file.display()
    )]
    UnsupportedType {
        /// The file that was to be written.
        file: PathBuf,
        /// The column.
        column: String,
        /// Its type.
        data_type: DataType,
        /// The format.
        format: OutputFormat,
    },
    /// A batch does not have the schema given for the micro-batch.
    #[error("{}: record batch {index} does not match the sink schema: {reason}", file.display())]
    SchemaMismatch {
        /// The file that was to be written.
        file: PathBuf,
        /// Index of the batch in the slice.
        index: usize,
        /// What differs.
        reason: String,
    },
    /// The Parquet writer failed.
    #[error("{}: cannot write Parquet: {source}", file.display())]
    Parquet {
        /// The file that was to be written.
        file: PathBuf,
        /// The writer's error.
        source: ParquetError,
    },
    /// The console could not be written.
    #[error("console sink, batch {batch_id}: cannot write the output: {source}")]
    Console {
        /// The micro-batch.
        batch_id: u64,
        /// The OS error.
        source: std::io::Error,
    },
    /// A batch could not be rendered as a table.
    #[error("console sink, batch {batch_id}: cannot format the rows: {source}")]
    ConsoleFormat {
        /// The micro-batch.
        batch_id: u64,
        /// Arrow's error.
        source: ArrowError,
    },
}

/// Writes each micro-batch into one file of a directory.
#[derive(Debug, Clone)]
pub struct FilesWriter {
    dir: PathBuf,
    format: OutputFormat,
    /// The query's threads, which encode a Parquet file's columns.
    threads: Threads,
}

impl FilesWriter {
    /// A writer into `dir` (created on first write).
    pub fn new(dir: PathBuf, format: OutputFormat) -> Self {
        Self {
            dir,
            format,
            threads: Threads::default(),
        }
    }

    /// Encodes a Parquet file's columns on the free ones of `threads` (one thread until this
    /// is called). The file's bytes are the same whatever the count.
    #[must_use]
    pub fn with_threads(mut self, threads: Threads) -> Self {
        self.threads = threads;
        self
    }

    /// The output directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file format.
    pub fn format(&self) -> OutputFormat {
        self.format
    }

    /// The file that holds batch `batch_id`: `dir/batch-<20-digit id>.<ext>`.
    pub fn batch_path(&self, batch_id: u64) -> PathBuf {
        self.dir
            .join(format!("batch-{batch_id:020}.{}", self.format.extension()))
    }

    /// Writes all rows of micro-batch `batch_id` into one file, atomically, replacing the file of an
    /// earlier attempt of the same batch. When the batches hold no rows, no file is written and a
    /// file of an earlier attempt is removed, so the directory always holds exactly the output of
    /// the last attempt of each batch.
    ///
    /// # Errors
    ///
    /// [`SinkFileError::SchemaMismatch`] when a batch's column types differ from `schema`,
    /// [`SinkFileError::UnsupportedType`] for a column the text formats cannot write,
    /// [`SinkFileError::Parquet`] or [`SinkFileError::Io`] when writing fails. All name the file.
    /// On error no partial file is left under the final name.
    pub fn write_batch(
        &self,
        batch_id: u64,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<FilesWritten, SinkFileError> {
        let path = self.batch_path(batch_id);
        check_schemas(&path, schema, batches)?;
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        if rows == 0 {
            match std::fs::remove_file(&path) {
                Ok(()) => sync_dir(&self.dir)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error(&path, "remove the file of an earlier attempt", e)),
            }
            return Ok(FilesWritten {
                rows: 0,
                path: None,
            });
        }
        if self.format != OutputFormat::Parquet {
            check_text_types(&path, schema, self.format)?;
        }
        // Written under a hidden `.batch-….tmp` name, synced, renamed, the folder synced.
        crate::durable::replace_with(&path, |file| self.write_file(file, &path, schema, batches))?;
        Ok(FilesWritten {
            rows,
            path: Some(path),
        })
    }

    fn write_file(
        &self,
        file: &mut File,
        path: &Path,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<(), SinkFileError> {
        match self.format {
            OutputFormat::Parquet => write_parquet(
                file,
                path,
                schema,
                batches,
                &self.threads,
                PARQUET_ROW_GROUP_ROWS,
            ),
            OutputFormat::Json | OutputFormat::Csv => {
                let mut out = BufWriter::with_capacity(WRITE_BUFFER_BYTES, file);
                let written = if self.format == OutputFormat::Json {
                    write_json(&mut out, schema, batches)
                } else {
                    write_csv(&mut out, schema, batches)
                };
                written
                    .and_then(|()| out.flush())
                    .map_err(|e| io_error(path, "write", e))
            }
        }
    }

    /// Removes temp files left by crashed attempts and returns how many were removed.
    ///
    /// Call it only while no other writer writes into the directory.
    ///
    /// # Errors
    ///
    /// [`SinkFileError::Io`] naming the directory or the file that could not be removed.
    pub fn clean_temp_files(&self) -> Result<usize, SinkFileError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io_error(&self.dir, "list", e)),
        };
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(|e| io_error(&self.dir, "list", e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if !(name.starts_with(".batch-") && name.ends_with(".tmp")) {
                continue;
            }
            let path = entry.path();
            match std::fs::remove_file(&path) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error(&path, "remove the leftover temporary file", e)),
            }
        }
        Ok(removed)
    }
}

fn io_error(path: &Path, op: &'static str, source: std::io::Error) -> SinkFileError {
    SinkFileError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

fn sync_dir(dir: &Path) -> Result<(), SinkFileError> {
    Ok(crate::durable::sync_dir(dir)?)
}

impl From<crate::durable::FsError> for SinkFileError {
    fn from(e: crate::durable::FsError) -> Self {
        io_error(&e.path, e.action, e.source)
    }
}

fn check_schemas(
    path: &Path,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<(), SinkFileError> {
    for (index, batch) in batches.iter().enumerate() {
        let mismatch = |reason: String| SinkFileError::SchemaMismatch {
            file: path.to_path_buf(),
            index,
            reason,
        };
        if batch.num_columns() != schema.fields().len() {
            return Err(mismatch(format!(
                "it has {} columns, the schema {}",
                batch.num_columns(),
                schema.fields().len()
            )));
        }
        for (field, column) in schema.fields().iter().zip(batch.columns()) {
            if field.data_type() != column.data_type() {
                return Err(mismatch(format!(
                    "column `{}` is {}, the schema says {}",
                    field.name(),
                    column.data_type(),
                    field.data_type()
                )));
            }
        }
    }
    Ok(())
}

fn check_text_types(
    path: &Path,
    schema: &SchemaRef,
    format: OutputFormat,
) -> Result<(), SinkFileError> {
    for field in schema.fields() {
        if !text_supports(field.data_type()) {
            return Err(SinkFileError::UnsupportedType {
                file: path.to_path_buf(),
                column: field.name().clone(),
                data_type: field.data_type().clone(),
                format,
            });
        }
    }
    Ok(())
}

pub(crate) fn text_supports(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Null
            | DataType::Boolean
            | DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
            | DataType::Float32
            | DataType::Float64
            | DataType::Decimal128(_, _)
            | DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Timestamp(_, _)
            | DataType::Date32
    )
}

/// Writes `batches` as one Parquet file of row groups of `row_group_rows` rows; a flat
/// schema's columns are encoded on the free ones of `threads`, into the same bytes.
fn write_parquet(
    file: &mut File,
    path: &Path,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    threads: &Threads,
    row_group_rows: usize,
) -> Result<(), SinkFileError> {
    let parquet_error = |source| SinkFileError::Parquet {
        file: path.to_path_buf(),
        source,
    };
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(row_group_rows))
        .set_write_batch_size(super::encoding::WRITE_BATCH_VALUES);
    // A dictionary only where it pays, as Spark's writer decides, and integers and strings
    // without one as deltas (see `encoding`).
    let props = super::encoding::column_encodings(props, schema, batches).build();
    let mut writer =
        ArrowWriter::try_new(file, Arc::clone(schema), Some(props)).map_err(parquet_error)?;
    // The types were checked; rebinding to the sink schema drops differences in field
    // metadata that would make the writer refuse the batch, and refuses a null in a column
    // the schema declares non-nullable.
    let batches = batches
        .iter()
        .filter(|b| b.num_rows() > 0)
        .map(|b| RecordBatch::try_new(Arc::clone(schema), b.columns().to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| parquet_error(ParquetError::from(e)))?;
    let flat = schema.fields().iter().all(|f| !f.data_type().is_nested());
    if threads.get() > 1 && flat && schema.fields().len() > 1 {
        let (mut file_writer, factory) = writer.into_serialized_writer().map_err(parquet_error)?;
        for (index, group) in row_groups(&batches, row_group_rows).into_iter().enumerate() {
            let writers = factory
                .create_column_writers(index)
                .map_err(parquet_error)?;
            let chunks = encode_columns(writers, schema, &group, threads).map_err(parquet_error)?;
            let mut row_group = file_writer.next_row_group().map_err(parquet_error)?;
            for chunk in chunks {
                chunk
                    .append_to_row_group(&mut row_group)
                    .map_err(parquet_error)?;
            }
            row_group.close().map_err(parquet_error)?;
        }
        // Writes the footer into `file`, which the caller syncs.
        file_writer.into_inner().map_err(parquet_error)?;
        return Ok(());
    }
    for batch in &batches {
        writer.write(batch).map_err(parquet_error)?;
    }
    // Flushes the footer into `file`, which the caller syncs.
    writer.into_inner().map_err(parquet_error)?;
    Ok(())
}

/// `batches` cut into row groups of `max` rows, where `ArrowWriter` cuts them: a batch that
/// would overfill a group is sliced (no copy), and empty batches are left out.
fn row_groups(batches: &[RecordBatch], max: usize) -> Vec<Vec<RecordBatch>> {
    let mut groups = Vec::new();
    let mut group = Vec::new();
    let mut rows = 0;
    for batch in batches {
        let mut rest = batch.clone();
        while rest.num_rows() > 0 {
            let take = rest.num_rows().min(max - rows);
            group.push(rest.slice(0, take));
            rest = rest.slice(take, rest.num_rows() - take);
            rows += take;
            if rows == max {
                groups.push(std::mem::take(&mut group));
                rows = 0;
            }
        }
    }
    if rows > 0 {
        groups.push(group);
    }
    groups
}

/// Encodes the columns of one row group of a flat schema (one writer per column), a column
/// at a time on the free ones of `threads`: each column's chunk holds what `ArrowWriter`
/// would have encoded for it, so the file is the same.
fn encode_columns(
    writers: Vec<ArrowColumnWriter>,
    schema: &SchemaRef,
    group: &[RecordBatch],
    threads: &Threads,
) -> Result<Vec<ArrowColumnChunk>, ParquetError> {
    if writers.len() != schema.fields().len() {
        return Err(ParquetError::General(format!(
            "{} column writers for {} columns of a flat schema",
            writers.len(),
            schema.fields().len()
        )));
    }
    threads.try_map(writers, |c, mut writer| {
        let field = schema.field(c);
        for batch in group {
            for leaf in compute_leaves(field, batch.column(c))? {
                writer.write(&leaf)?;
            }
        }
        writer.close()
    })
}

// ---------------------------------------------------------------------------------------------
// Text formats

/// A column downcast once per record batch, so the per-row loop only indexes.
enum Column<'a> {
    Null,
    Boolean(&'a BooleanArray),
    Int(IntColumn<'a>),
    Float32(&'a ScalarBuffer<f32>),
    Float64(&'a ScalarBuffer<f64>),
    Decimal(&'a ScalarBuffer<i128>, i8),
    Utf8(&'a GenericStringArray<i32>),
    LargeUtf8(&'a GenericStringArray<i64>),
    Utf8View(&'a StringViewArray),
    Timestamp(&'a ScalarBuffer<i64>, TimeUnit),
    Date32(&'a ScalarBuffer<i32>),
}

enum IntColumn<'a> {
    I8(&'a ScalarBuffer<i8>),
    I16(&'a ScalarBuffer<i16>),
    I32(&'a ScalarBuffer<i32>),
    I64(&'a ScalarBuffer<i64>),
    U8(&'a ScalarBuffer<u8>),
    U16(&'a ScalarBuffer<u16>),
    U32(&'a ScalarBuffer<u32>),
    U64(&'a ScalarBuffer<u64>),
}

struct TypedColumn<'a> {
    nulls: Option<&'a NullBuffer>,
    values: Column<'a>,
}

impl TypedColumn<'_> {
    fn is_null(&self, row: usize) -> bool {
        matches!(self.values, Column::Null) || self.nulls.is_some_and(|n| n.is_null(row))
    }
}

fn values<T: arrow_array::ArrowPrimitiveType>(array: &ArrayRef) -> &ScalarBuffer<T::Native> {
    array.as_primitive::<T>().values()
}

/// Downcasts `array`; its type was accepted by [`text_supports`].
fn typed_column(array: &ArrayRef) -> std::io::Result<TypedColumn<'_>> {
    let values = match array.data_type() {
        DataType::Null => Column::Null,
        DataType::Boolean => Column::Boolean(array.as_boolean()),
        DataType::Int8 => Column::Int(IntColumn::I8(values::<Int8Type>(array))),
        DataType::Int16 => Column::Int(IntColumn::I16(values::<Int16Type>(array))),
        DataType::Int32 => Column::Int(IntColumn::I32(values::<Int32Type>(array))),
        DataType::Int64 => Column::Int(IntColumn::I64(values::<Int64Type>(array))),
        DataType::UInt8 => Column::Int(IntColumn::U8(values::<UInt8Type>(array))),
        DataType::UInt16 => Column::Int(IntColumn::U16(values::<UInt16Type>(array))),
        DataType::UInt32 => Column::Int(IntColumn::U32(values::<UInt32Type>(array))),
        DataType::UInt64 => Column::Int(IntColumn::U64(values::<UInt64Type>(array))),
        DataType::Float32 => Column::Float32(values::<Float32Type>(array)),
        DataType::Float64 => Column::Float64(values::<Float64Type>(array)),
        DataType::Decimal128(_, scale) => Column::Decimal(values::<Decimal128Type>(array), *scale),
        DataType::Utf8 => Column::Utf8(array.as_string::<i32>()),
        DataType::LargeUtf8 => Column::LargeUtf8(array.as_string::<i64>()),
        DataType::Utf8View => Column::Utf8View(array.as_string_view()),
        DataType::Timestamp(unit, _) => {
            let v = match unit {
                TimeUnit::Second => values::<TimestampSecondType>(array),
                TimeUnit::Millisecond => values::<TimestampMillisecondType>(array),
                TimeUnit::Microsecond => values::<TimestampMicrosecondType>(array),
                TimeUnit::Nanosecond => values::<TimestampNanosecondType>(array),
            };
            Column::Timestamp(v, *unit)
        }
        DataType::Date32 => Column::Date32(values::<Date32Type>(array)),
        other => {
            // Unreachable after `check_text_types`; reported rather than panicking.
            return Err(std::io::Error::other(format!(
                "unsupported column type {other}"
            )));
        }
    };
    Ok(TypedColumn {
        nulls: array.nulls(),
        values,
    })
}

fn typed_columns(batch: &RecordBatch) -> std::io::Result<Vec<TypedColumn<'_>>> {
    batch.columns().iter().map(typed_column).collect()
}

pub(crate) fn write_json<W: Write>(
    out: &mut W,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> std::io::Result<()> {
    // `"name":` for every column, escaped once per file.
    let mut keys = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let mut key = Vec::with_capacity(field.name().len() + 3);
        serde_json::to_writer(&mut key, field.name().as_str())?;
        key.push(b':');
        keys.push(key);
    }
    for batch in batches {
        let columns = typed_columns(batch)?;
        for row in 0..batch.num_rows() {
            out.write_all(b"{")?;
            let mut first = true;
            for (key, column) in keys.iter().zip(&columns) {
                if column.is_null(row) {
                    continue;
                }
                if !first {
                    out.write_all(b",")?;
                }
                first = false;
                out.write_all(key)?;
                write_json_value(out, &column.values, row)?;
            }
            out.write_all(b"}\n")?;
        }
    }
    Ok(())
}

fn write_json_value<W: Write>(out: &mut W, column: &Column<'_>, row: usize) -> std::io::Result<()> {
    match column {
        Column::Utf8(a) => write_json_str(out, a.value(row)),
        Column::LargeUtf8(a) => write_json_str(out, a.value(row)),
        Column::Utf8View(a) => write_json_str(out, a.value(row)),
        Column::Timestamp(..) | Column::Date32(_) => {
            out.write_all(b"\"")?;
            write_plain_value(out, column, row, NonFinite::QuotedInJson)?;
            out.write_all(b"\"")
        }
        _ => write_plain_value(out, column, row, NonFinite::QuotedInJson),
    }
}

fn write_json_str<W: Write>(out: &mut W, s: &str) -> std::io::Result<()> {
    serde_json::to_writer(out, s).map_err(std::io::Error::from)
}

/// How NaN and infinities are spelled: JSON has no literal for them, so they become strings as
/// Spark (Jackson) writes them; CSV writes the bare words.
#[derive(Clone, Copy)]
enum NonFinite {
    QuotedInJson,
    Bare,
}

/// Writes a non-string value with no quoting.
fn write_plain_value<W: Write>(
    out: &mut W,
    column: &Column<'_>,
    row: usize,
    non_finite: NonFinite,
) -> std::io::Result<()> {
    match column {
        Column::Null => Ok(()),
        Column::Boolean(a) => out.write_all(if a.value(row) { b"true" } else { b"false" }),
        Column::Int(i) => match i {
            IntColumn::I8(v) => write!(out, "{}", v[row]),
            IntColumn::I16(v) => write!(out, "{}", v[row]),
            IntColumn::I32(v) => write!(out, "{}", v[row]),
            IntColumn::I64(v) => write!(out, "{}", v[row]),
            IntColumn::U8(v) => write!(out, "{}", v[row]),
            IntColumn::U16(v) => write!(out, "{}", v[row]),
            IntColumn::U32(v) => write!(out, "{}", v[row]),
            IntColumn::U64(v) => write!(out, "{}", v[row]),
        },
        Column::Float32(v) => write_float(
            out,
            f64::from(v[row]),
            v[row].is_finite(),
            non_finite,
            |o| write!(o, "{:?}", v[row]),
        ),
        Column::Float64(v) => write_float(out, v[row], v[row].is_finite(), non_finite, |o| {
            write!(o, "{:?}", v[row])
        }),
        Column::Decimal(v, scale) => write_decimal(out, v[row], *scale),
        Column::Timestamp(v, unit) => write_timestamp(out, v[row], *unit),
        Column::Date32(v) => write_date(out, i64::from(v[row])),
        Column::Utf8(a) => out.write_all(a.value(row).as_bytes()),
        Column::LargeUtf8(a) => out.write_all(a.value(row).as_bytes()),
        Column::Utf8View(a) => out.write_all(a.value(row).as_bytes()),
    }
}

/// Finite floats use Rust's shortest round-trip form (`1.0`, `0.1`, `1e20`), which is valid JSON.
fn write_float<W: Write>(
    out: &mut W,
    value: f64,
    finite: bool,
    non_finite: NonFinite,
    finite_form: impl FnOnce(&mut W) -> std::io::Result<()>,
) -> std::io::Result<()> {
    if finite {
        return finite_form(out);
    }
    let word: &[u8] = if value.is_nan() {
        b"NaN"
    } else if value > 0.0 {
        b"Infinity"
    } else {
        b"-Infinity"
    };
    match non_finite {
        NonFinite::QuotedInJson => {
            out.write_all(b"\"")?;
            out.write_all(word)?;
            out.write_all(b"\"")
        }
        NonFinite::Bare => out.write_all(word),
    }
}

/// Writes `value / 10^scale` with exactly `scale` fraction digits (`2390`, 2 → `23.90`).
fn write_decimal<W: Write>(out: &mut W, value: i128, scale: i8) -> std::io::Result<()> {
    if scale <= 0 {
        write!(out, "{value}")?;
        if value != 0 {
            for _ in 0..scale.unsigned_abs() {
                out.write_all(b"0")?;
            }
        }
        return Ok(());
    }
    let scale = usize::from(scale.unsigned_abs());
    // 39 digits for u128::MAX, plus room for leading zeros up to scale 76.
    let mut digits = [b'0'; 80];
    let mut n = value.unsigned_abs();
    let mut len = 0;
    while n > 0 {
        digits[digits.len() - 1 - len] = b'0' + (n % 10) as u8;
        n /= 10;
        len += 1;
    }
    let len = len.max(scale + 1).min(digits.len());
    let text = &digits[digits.len() - len..];
    if value < 0 {
        out.write_all(b"-")?;
    }
    let (int_part, frac_part) = text.split_at(len - scale);
    out.write_all(int_part)?;
    out.write_all(b".")?;
    out.write_all(frac_part)
}

/// RFC 3339 UTC: `2024-03-01T00:03:07.123Z`, with 3, 6 or 9 fraction digits as the value needs
/// (always at least milliseconds, as Spark writes them).
fn write_timestamp<W: Write>(out: &mut W, value: i64, unit: TimeUnit) -> std::io::Result<()> {
    let (per_second, nanos_per_tick): (i64, i64) = match unit {
        TimeUnit::Second => (1, 1_000_000_000),
        TimeUnit::Millisecond => (1_000, 1_000_000),
        TimeUnit::Microsecond => (1_000_000, 1_000),
        TimeUnit::Nanosecond => (1_000_000_000, 1),
    };
    let secs = value.div_euclid(per_second);
    let nanos = value.rem_euclid(per_second) * nanos_per_tick;
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    write_date(out, days)?;
    write!(
        out,
        "T{:02}:{:02}:{:02}",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )?;
    if nanos % 1_000_000 == 0 {
        write!(out, ".{:03}Z", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        write!(out, ".{:06}Z", nanos / 1_000)
    } else {
        write!(out, ".{nanos:09}Z")
    }
}

/// `YYYY-MM-DD` of `days` since 1970-01-01.
fn write_date<W: Write>(out: &mut W, days: i64) -> std::io::Result<()> {
    let (y, m, d) = crate::calendar::civil_from_days(days);
    if (0..=9999).contains(&y) {
        write!(out, "{y:04}-{m:02}-{d:02}")
    } else {
        // ISO 8601 expanded years carry a sign.
        write!(out, "{y:+05}-{m:02}-{d:02}")
    }
}

fn write_csv<W: Write>(
    out: &mut W,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> std::io::Result<()> {
    for (i, field) in schema.fields().iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        write_csv_str(out, field.name())?;
    }
    out.write_all(b"\n")?;
    for batch in batches {
        let columns = typed_columns(batch)?;
        for row in 0..batch.num_rows() {
            for (i, column) in columns.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                if column.is_null(row) {
                    continue;
                }
                match &column.values {
                    Column::Utf8(a) => write_csv_str(out, a.value(row))?,
                    Column::LargeUtf8(a) => write_csv_str(out, a.value(row))?,
                    Column::Utf8View(a) => write_csv_str(out, a.value(row))?,
                    other => write_plain_value(out, other, row, NonFinite::Bare)?,
                }
            }
            out.write_all(b"\n")?;
        }
    }
    Ok(())
}

/// RFC 4180: quoted when it holds a comma, quote, CR or LF, with quotes doubled. The empty string
/// is written `""` so that it stays distinct from null (an empty field), as Spark does.
fn write_csv_str<W: Write>(out: &mut W, s: &str) -> std::io::Result<()> {
    let needs_quotes = s.is_empty() || s.bytes().any(|b| matches!(b, b',' | b'"' | b'\n' | b'\r'));
    if !needs_quotes {
        return out.write_all(s.as_bytes());
    }
    out.write_all(b"\"")?;
    for (i, part) in s.split('"').enumerate() {
        if i > 0 {
            out.write_all(b"\"\"")?;
        }
        out.write_all(part.as_bytes())?;
    }
    out.write_all(b"\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{
        BooleanArray, Date32Array, Decimal128Array, Float64Array, Int32Array, Int64Array,
        StringArray, TimestampMicrosecondArray,
    };
    use arrow_schema::{Field, Schema};
    use arrow_select::concat::concat_batches;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("ok", DataType::Boolean, true),
            Field::new("n", DataType::Int32, true),
            Field::new("x", DataType::Float64, true),
            Field::new("price", DataType::Decimal128(10, 2), true),
            Field::new("name", DataType::Utf8, true),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("day", DataType::Date32, true),
        ]))
    }

    /// 2024-03-01T00:03:07Z in microseconds.
    const T0: i64 = 1_709_251_387_000_000;

    fn batch_a() -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(BooleanArray::from(vec![Some(true), None])),
                Arc::new(Int32Array::from(vec![Some(-7), None])),
                Arc::new(Float64Array::from(vec![Some(1.0), Some(0.1)])),
                Arc::new(
                    Decimal128Array::from(vec![Some(2390), Some(-5)])
                        .with_precision_and_scale(10, 2)
                        .unwrap(),
                ),
                Arc::new(StringArray::from(vec![Some("plain"), Some("a,\"b\"\nc")])),
                Arc::new(
                    TimestampMicrosecondArray::from(vec![Some(T0 + 123_000), Some(T0 + 123_456)])
                        .with_timezone("UTC"),
                ),
                Arc::new(Date32Array::from(vec![Some(19_783), None])),
            ],
        )
        .unwrap()
    }

    fn batch_b() -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(vec![3])),
                Arc::new(BooleanArray::from(vec![Some(false)])),
                Arc::new(Int32Array::from(vec![Some(0)])),
                Arc::new(Float64Array::from(vec![Some(f64::NAN)])),
                Arc::new(
                    Decimal128Array::from(vec![None])
                        .with_precision_and_scale(10, 2)
                        .unwrap(),
                ),
                Arc::new(StringArray::from(vec![Some("")])),
                Arc::new(TimestampMicrosecondArray::from(vec![Some(-1)]).with_timezone("UTC")),
                Arc::new(Date32Array::from(vec![Some(-1)])),
            ],
        )
        .unwrap()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn columns_encoded_on_threads_give_the_same_parquet_file() {
        let tmp = tempfile::tempdir().unwrap();
        // Batches of 80, 0, 80 and 1 rows.
        let large = |seed: i64| {
            let batches: Vec<RecordBatch> = (0..40).map(|_| batch_a()).collect();
            let mut b = concat_batches(&schema(), &batches).unwrap();
            let ids = Int64Array::from_iter_values((0..80).map(|i| seed * 1000 + i));
            let mut columns = b.columns().to_vec();
            columns[0] = Arc::new(ids);
            b = RecordBatch::try_new(schema(), columns).unwrap();
            b
        };
        let batches = [large(1), batch_b().slice(0, 0), large(2), batch_b()];
        let mut files = Vec::new();
        for threads in [1, 2, 3, 16] {
            let writer = FilesWriter::new(
                tmp.path().join(format!("t{threads}")),
                OutputFormat::Parquet,
            )
            .with_threads(threads_of(threads));
            let written = writer.write_batch(0, &schema(), &batches).unwrap();
            assert_eq!(written.rows, 161);
            files.push(std::fs::read(written.path.unwrap()).unwrap());
        }
        assert!(files.iter().all(|f| *f == files[0]), "the files differ");
        // And it reads back as the rows written.
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(
            bytes::Bytes::from(files.pop().unwrap()),
            1024,
        )
        .unwrap();
        let read: Vec<RecordBatch> = reader.collect::<Result<_, _>>().unwrap();
        let expected = concat_batches(&schema(), &batches).unwrap();
        let read = concat_batches(&read[0].schema(), &read).unwrap();
        assert_eq!(read.columns(), expected.columns());
    }

    fn threads_of(n: usize) -> Threads {
        Threads::new(std::num::NonZeroUsize::new(n).unwrap())
    }

    #[test]
    fn columns_on_threads_give_the_same_file_over_several_row_groups() {
        let tmp = tempfile::tempdir().unwrap();
        let batches = [batch_a(), batch_b(), batch_a(), batch_a(), batch_b()];
        let write = |threads: usize| {
            let path = tmp.path().join(format!("rg{threads}.parquet"));
            let mut file = File::create(&path).unwrap();
            // Row groups of 3 rows: batches sliced across groups.
            write_parquet(
                &mut file,
                &path,
                &schema(),
                &batches,
                &threads_of(threads),
                3,
            )
            .unwrap();
            std::fs::read(&path).unwrap()
        };
        let one = write(1);
        assert_eq!(write(3), one);
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(one)).unwrap();
        assert_eq!(reader.metadata().num_row_groups(), 3);
        let rows: usize = reader.build().unwrap().map(|b| b.unwrap().num_rows()).sum();
        assert_eq!(rows, 8);
    }

    #[test]
    fn a_null_in_a_non_nullable_column_fails_the_file_on_any_thread_count() {
        let tmp = tempfile::tempdir().unwrap();
        // `id` is non-nullable in the sink schema; this batch's `id` holds a null.
        let mut fields: Vec<Field> = schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields[0] = fields[0].clone().with_nullable(true);
        let loose = Arc::new(Schema::new(fields));
        let mut columns = batch_a().columns().to_vec();
        columns[0] = Arc::new(Int64Array::from(vec![Some(1), None]));
        let batch = RecordBatch::try_new(loose, columns).unwrap();
        for threads in [1, 2] {
            let writer = FilesWriter::new(
                tmp.path().join(format!("n{threads}")),
                OutputFormat::Parquet,
            )
            .with_threads(threads_of(threads));
            let err = writer
                .write_batch(0, &schema(), std::slice::from_ref(&batch))
                .unwrap_err()
                .to_string();
            assert!(err.contains("non-nullable"), "{threads}: {err}");
            assert!(!writer.batch_path(0).exists(), "{threads}");
        }
    }

    #[test]
    fn row_groups_are_cut_where_the_arrow_writer_cuts_them() {
        let sizes = |batches: &[usize], max: usize| {
            let batches: Vec<RecordBatch> = batches
                .iter()
                .map(|&n| {
                    let all: Vec<RecordBatch> = (0..n.div_ceil(2)).map(|_| batch_a()).collect();
                    let b = concat_batches(&schema(), &all).unwrap();
                    b.slice(0, n)
                })
                .collect();
            row_groups(&batches, max)
                .iter()
                .map(|g| g.iter().map(RecordBatch::num_rows).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        };
        assert_eq!(sizes(&[3, 0, 4, 5], 5), [vec![3, 2], vec![2, 3], vec![2]]);
        assert_eq!(sizes(&[10], 5), [vec![5], vec![5]]);
        assert_eq!(sizes(&[0, 0], 5), Vec::<Vec<usize>>::new());
    }

    #[test]
    fn json_lines_exact_text() {
        let tmp = tempfile::tempdir().unwrap();
        let writer = FilesWriter::new(tmp.path().join("out"), OutputFormat::Json);
        let written = writer
            .write_batch(7, &schema(), &[batch_a(), batch_b()])
            .unwrap();
        let path = tmp.path().join("out/batch-00000000000000000007.json");
        assert_eq!(
            written,
            FilesWritten {
                rows: 3,
                path: Some(path.clone())
            }
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let expected = concat!(
            r#"{"id":1,"ok":true,"n":-7,"x":1.0,"price":23.90,"name":"plain","ts":"2024-03-01T00:03:07.123Z","day":"2024-03-01"}"#,
            "\n",
            r#"{"id":2,"x":0.1,"price":-0.05,"name":"a,\"b\"\nc","ts":"2024-03-01T00:03:07.123456Z"}"#,
            "\n",
            r#"{"id":3,"ok":false,"n":0,"x":"NaN","name":"","ts":"1969-12-31T23:59:59.999999Z","day":"1969-12-31"}"#,
            "\n",
        );
        assert_eq!(text, expected);
        for line in text.lines() {
            serde_json::from_str::<serde_json::Value>(line).unwrap();
        }
        assert_eq!(
            names(&tmp.path().join("out")),
            vec!["batch-00000000000000000007.json"]
        );
    }

    #[test]
    fn csv_exact_text() {
        let tmp = tempfile::tempdir().unwrap();
        let writer = FilesWriter::new(tmp.path().to_path_buf(), OutputFormat::Csv);
        let written = writer
            .write_batch(0, &schema(), &[batch_a(), batch_b()])
            .unwrap();
        assert_eq!(written.rows, 3);
        let text =
            std::fs::read_to_string(tmp.path().join("batch-00000000000000000000.csv")).unwrap();
        let expected = "id,ok,n,x,price,name,ts,day\n\
            1,true,-7,1.0,23.90,plain,2024-03-01T00:03:07.123Z,2024-03-01\n\
            2,,,0.1,-0.05,\"a,\"\"b\"\"\nc\",2024-03-01T00:03:07.123456Z,\n\
            3,false,0,NaN,,\"\",1969-12-31T23:59:59.999999Z,1969-12-31\n";
        assert_eq!(text, expected);
    }

    #[test]
    fn parquet_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let writer = FilesWriter::new(tmp.path().to_path_buf(), OutputFormat::Parquet);
        let written = writer
            .write_batch(12, &schema(), &[batch_a(), batch_b()])
            .unwrap();
        let path = written.path.unwrap();
        assert_eq!(path, tmp.path().join("batch-00000000000000000012.parquet"));
        let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap();
        let meta = builder.metadata().clone();
        assert_eq!(meta.num_row_groups(), 1);
        assert_eq!(
            meta.row_group(0).column(0).compression(),
            Compression::SNAPPY
        );
        let read: Vec<RecordBatch> = builder.build().unwrap().map(Result::unwrap).collect();
        let read = concat_batches(&schema(), &read).unwrap();
        let expected = concat_batches(&schema(), &[batch_a(), batch_b()]).unwrap();
        assert_eq!(read.num_rows(), 3);
        for (i, field) in schema().fields().iter().enumerate() {
            let (got, want) = (read.column(i), expected.column(i));
            assert_eq!(got.data_type(), want.data_type(), "{}", field.name());
            if field.name() == "x" {
                let (got, want) = (
                    got.as_primitive::<Float64Type>(),
                    want.as_primitive::<Float64Type>(),
                );
                assert_eq!(got.value(0), want.value(0));
                assert_eq!(got.value(1), want.value(1));
                assert!(got.value(2).is_nan());
            } else {
                assert_eq!(got.to_data(), want.to_data(), "{}", field.name());
            }
        }
    }

    #[test]
    fn parquet_dictionary_only_on_columns_where_it_pays() {
        let tmp = tempfile::tempdir().unwrap();
        let writer = FilesWriter::new(tmp.path().to_path_buf(), OutputFormat::Parquet);
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("status", DataType::Utf8, true),
            Field::new("session", DataType::Utf8, true),
        ]));
        let n = 20_000_i64;
        let statuses = ["completed", "pending", "returned"];
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from_iter_values(10_000_000..10_000_000 + n)),
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| statuses[i as usize % 3]),
                )),
                Arc::new(StringArray::from_iter_values((0..n).map(|i| {
                    format!("s-{:016x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
                }))),
            ],
        )
        .unwrap();
        let path = writer
            .write_batch(0, &schema, std::slice::from_ref(&batch))
            .unwrap()
            .path
            .unwrap();
        let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap();
        let with = |encoding| -> Vec<bool> {
            let columns = builder.metadata().row_group(0).columns();
            columns
                .iter()
                .map(|c| c.encodings().any(|e| e == encoding))
                .collect()
        };
        assert_eq!(
            with(parquet::basic::Encoding::RLE_DICTIONARY),
            [false, true, false]
        );
        // Without a dictionary, the ids are integer deltas and the session strings deltas of
        // byte arrays.
        let delta = with(parquet::basic::Encoding::DELTA_BINARY_PACKED);
        assert_eq!(delta, [true, false, false]);
        let delta = with(parquet::basic::Encoding::DELTA_BYTE_ARRAY);
        assert_eq!(delta, [false, false, true]);
        // Consecutive ids take a few bytes, not 8 a row.
        let ids = builder.metadata().row_group(0).column(0);
        assert!(
            ids.uncompressed_size() < 4_000,
            "{}",
            ids.uncompressed_size()
        );
        let read: Vec<RecordBatch> = builder.build().unwrap().map(Result::unwrap).collect();
        assert_eq!(concat_batches(&schema, &read).unwrap(), batch);
    }

    #[test]
    fn replayed_batch_replaces_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let writer = FilesWriter::new(tmp.path().to_path_buf(), OutputFormat::Json);
        writer
            .write_batch(1, &schema(), &[batch_a(), batch_b()])
            .unwrap();
        writer.write_batch(1, &schema(), &[batch_b()]).unwrap();
        writer.write_batch(2, &schema(), &[batch_a()]).unwrap();
        assert_eq!(
            names(tmp.path()),
            vec![
                "batch-00000000000000000001.json",
                "batch-00000000000000000002.json"
            ]
        );
        let text =
            std::fs::read_to_string(tmp.path().join("batch-00000000000000000001.json")).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.starts_with(r#"{"id":3,"#), "{text}");
    }

    #[test]
    fn no_rows_no_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        for format in [OutputFormat::Json, OutputFormat::Csv, OutputFormat::Parquet] {
            let writer = FilesWriter::new(dir.clone(), format);
            let empty = batch_a().slice(0, 0);
            assert_eq!(
                writer.write_batch(3, &schema(), &[empty]).unwrap(),
                FilesWritten {
                    rows: 0,
                    path: None
                }
            );
            assert_eq!(writer.write_batch(4, &schema(), &[]).unwrap().rows, 0);
        }
        assert!(!dir.exists());
        // An empty replay of a batch removes the earlier attempt's file.
        let writer = FilesWriter::new(dir.clone(), OutputFormat::Csv);
        writer.write_batch(5, &schema(), &[batch_a()]).unwrap();
        writer.write_batch(5, &schema(), &[]).unwrap();
        assert!(names(&dir).is_empty());
    }

    #[test]
    fn temp_files_are_cleaned() {
        let tmp = tempfile::tempdir().unwrap();
        let writer = FilesWriter::new(tmp.path().to_path_buf(), OutputFormat::Parquet);
        assert_eq!(
            FilesWriter::new(tmp.path().join("missing"), OutputFormat::Json)
                .clean_temp_files()
                .unwrap(),
            0
        );
        writer.write_batch(0, &schema(), &[batch_a()]).unwrap();
        std::fs::write(
            tmp.path()
                .join(".batch-00000000000000000001.parquet.abc.tmp"),
            "x",
        )
        .unwrap();
        std::fs::write(
            tmp.path().join(".batch-00000000000000000002.json.def.tmp"),
            "x",
        )
        .unwrap();
        std::fs::write(tmp.path().join("keep.tmp"), "x").unwrap();
        assert_eq!(writer.clean_temp_files().unwrap(), 2);
        assert_eq!(
            names(tmp.path()),
            vec!["batch-00000000000000000000.parquet", "keep.tmp"]
        );
    }

    #[test]
    fn errors_name_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let writer = FilesWriter::new(tmp.path().to_path_buf(), OutputFormat::Json);
        let other = Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, false)]));
        let err = writer.write_batch(9, &other, &[batch_a()]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("batch-00000000000000000009.json"), "{msg}");
        assert!(msg.contains("record batch 0"), "{msg}");

        let list_schema = Arc::new(Schema::new(vec![Field::new(
            "l",
            DataType::List(Arc::new(Field::new("item", DataType::Int32, true))),
            true,
        )]));
        let list = arrow_array::ListArray::from_iter_primitive::<Int32Type, _, _>(vec![Some(
            vec![Some(1)],
        )]);
        let batch = RecordBatch::try_new(list_schema.clone(), vec![Arc::new(list)]).unwrap();
        let err = writer
            .write_batch(9, &list_schema, std::slice::from_ref(&batch))
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("batch-00000000000000000009.json") && msg.contains("column `l`"),
            "{msg}"
        );
        assert!(names(tmp.path()).is_empty());
        // Parquet writes any type.
        let parquet = FilesWriter::new(tmp.path().to_path_buf(), OutputFormat::Parquet);
        assert_eq!(
            parquet.write_batch(9, &list_schema, &[batch]).unwrap().rows,
            1
        );

        let blocked = tmp.path().join("file");
        std::fs::write(&blocked, "x").unwrap();
        let err = FilesWriter::new(blocked.join("sub"), OutputFormat::Csv)
            .write_batch(0, &schema(), &[batch_a()])
            .unwrap_err();
        assert!(
            err.to_string()
                .contains(&blocked.join("sub").display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn value_formatting() {
        fn dec(v: i128, s: i8) -> String {
            let mut out = Vec::new();
            write_decimal(&mut out, v, s).unwrap();
            String::from_utf8(out).unwrap()
        }
        assert_eq!(dec(2390, 2), "23.90");
        assert_eq!(dec(0, 2), "0.00");
        assert_eq!(dec(-1, 3), "-0.001");
        assert_eq!(dec(123, 0), "123");
        assert_eq!(dec(12, -2), "1200");
        assert_eq!(dec(0, -2), "0");
        assert_eq!(
            dec(i128::MAX, 38),
            "1.70141183460469231731687303715884105727"
        );
        assert_eq!(
            dec(i128::MIN, 38),
            "-1.70141183460469231731687303715884105728"
        );

        fn ts(v: i64, unit: TimeUnit) -> String {
            let mut out = Vec::new();
            write_timestamp(&mut out, v, unit).unwrap();
            String::from_utf8(out).unwrap()
        }
        assert_eq!(ts(0, TimeUnit::Second), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            ts(1_709_251_387_123, TimeUnit::Millisecond),
            "2024-03-01T00:03:07.123Z"
        );
        assert_eq!(
            ts(1_709_251_387_000_000_001, TimeUnit::Nanosecond),
            "2024-03-01T00:03:07.000000001Z"
        );
        assert_eq!(
            ts(253_402_300_800, TimeUnit::Second),
            "+10000-01-01T00:00:00.000Z"
        );

        fn float(v: f64) -> String {
            let mut out = Vec::new();
            write_plain_value(
                &mut out,
                &Column::Float64(&ScalarBuffer::from(vec![v])),
                0,
                NonFinite::QuotedInJson,
            )
            .unwrap();
            String::from_utf8(out).unwrap()
        }
        assert_eq!(float(1e20), "1e20");
        assert_eq!(float(-2.5), "-2.5");
        assert_eq!(float(f64::INFINITY), "\"Infinity\"");
        assert_eq!(float(f64::NEG_INFINITY), "\"-Infinity\"");
    }
}
