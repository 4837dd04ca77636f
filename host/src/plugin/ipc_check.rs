//! Checks a guest's Arrow IPC stream before arrow-ipc reads it.
//!
//! arrow-ipc trusts its input: it allocates whatever `bodyLength` a message
//! announces (2^62 bytes aborts the process), slices buffers at whatever
//! offsets the metadata gives (out of range panics) and panics on a type, bit
//! width or decimal it does not know. A plugin may return any bytes, and must
//! not be able to take the host down with them, so this module walks the
//! stream's framing and flatbuffer metadata first and refuses, with a reason,
//! anything arrow-ipc could choke on or that is not one of the column types
//! the WIT allows (`data-type` in `wit/weir.wit`). Only what passes reaches
//! [`arrow_ipc::reader::StreamReader`], whose own validation (string offsets
//! inside their data, UTF-8, lengths) then applies.
//!
//! The metadata itself is read with arrow-ipc's generated accessors after
//! `root_as_message`, which runs the flatbuffers verifier: every offset in
//! the metadata is inside it before any accessor follows one.

use arrow_ipc::{DateUnit, Endianness, MessageHeader, MetadataVersion, Precision, TimeUnit, Type};

use super::convert;

/// Most rows one result may hold, over all its record batches: WIT row
/// counts are 32-bit and Arrow's string offsets are `i32`.
pub(crate) const MAX_ROWS: u64 = i32::MAX as u64;

/// What precedes a message's metadata length (the format since Arrow 0.15;
/// older streams start with the length, and arrow-ipc reads both).
const CONTINUATION: [u8; 4] = [0xff; 4];

/// The column types plugins may return, as the WIT names them.
const ALLOWED: &str = "boolean, int32, int64, float64, decimal128, utf8, timestamp-micros, date32";

/// Why a guest's IPC stream was refused, and where.
#[derive(Debug, thiserror::Error)]
#[error("Arrow IPC message {message} (at byte {offset}): {problem}")]
pub(crate) struct MalformedIpc {
    /// Index of the message in the stream (0 is the schema).
    pub message: usize,
    /// Where its framing starts.
    pub offset: usize,
    pub problem: Problem,
}

/// One way an IPC stream can be unreadable or not what a plugin may return.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Problem {
    #[error("the stream has no schema message")]
    NoSchema,
    #[error("the stream ends inside a message's length prefix ({left} bytes left)")]
    TruncatedPrefix { left: usize },
    #[error("metadata length {0} is negative")]
    NegativeMetadataLength(i32),
    #[error("metadata length {length} runs past the end of the stream ({left} bytes left)")]
    MetadataPastEnd { length: i32, left: usize },
    #[error("the metadata is not an Arrow IPC message: {0}")]
    NotAMessage(String),
    #[error("metadata version {0} is not V4 or V5")]
    Version(String),
    #[error("body length {0} is negative")]
    NegativeBodyLength(i64),
    #[error("body length {length} runs past the end of the stream ({left} bytes left)")]
    BodyPastEnd { length: i64, left: usize },
    #[error("a {0} message comes first, where the schema must")]
    SchemaNotFirst(String),
    #[error("a {0} message follows the schema, where only record batches may")]
    Unexpected(String),
    #[error("the {0} message has no header")]
    NoHeader(&'static str),
    #[error("the schema is big-endian; plugins write little-endian Arrow")]
    BigEndian,
    #[error("the schema has no field list")]
    NoFields,
    #[error("column {index} ({name:?}): {reason}")]
    Column {
        index: usize,
        name: String,
        reason: String,
    },
    #[error("the record batch is compressed; plugins write uncompressed Arrow")]
    Compressed,
    #[error("the record batch has variadic buffer counts, which only view types use")]
    Variadic,
    #[error("the record batch has {0} rows; a batch has 0 to {max}", max = MAX_ROWS)]
    Rows(i64),
    #[error("the record batches hold {0} rows in all, more than {max}", max = MAX_ROWS)]
    TotalRows(u64),
    #[error("the record batch has {nodes} field nodes for {columns} columns")]
    Nodes { nodes: usize, columns: usize },
    #[error("the record batch has {buffers} buffers; its columns need {expected}")]
    Buffers { buffers: usize, expected: usize },
    #[error("buffer {index} (offset {offset}, length {length}) lies outside the {body}-byte body")]
    BufferOutside {
        index: usize,
        offset: i64,
        length: i64,
        body: usize,
    },
}

/// How a column's values are laid out, which says how many buffers it has
/// and how long they must be for its rows.
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// One bit per value (boolean).
    Bits,
    /// This many bytes per value.
    Fixed(u64),
    /// `i32` offsets and the string bytes.
    Utf8,
}

impl Layout {
    /// Buffers per column, the validity bitmap first.
    fn buffers(self) -> usize {
        match self {
            Self::Bits | Self::Fixed(_) => 2,
            Self::Utf8 => 3,
        }
    }
}

#[derive(Debug)]
struct Column {
    name: String,
    layout: Layout,
}

/// Checks `bytes` as an Arrow IPC stream a plugin may return: its framing,
/// every length and buffer inside the bytes given, a schema of WIT types only
/// and then record batches only, with sane row counts.
///
/// # Errors
/// [`MalformedIpc`]: which message, where, and what is wrong with it.
pub(crate) fn check(bytes: &[u8]) -> Result<(), MalformedIpc> {
    let mut stream = Stream {
        bytes,
        columns: None,
        rows: 0,
    };
    let mut pos = 0;
    let mut message = 0;
    loop {
        let next = stream.message(pos).map_err(|problem| MalformedIpc {
            message,
            offset: pos,
            problem,
        })?;
        match next {
            Some(end) => pos = end,
            None => break,
        }
        message += 1;
    }
    if stream.columns.is_none() {
        return Err(MalformedIpc {
            message,
            offset: pos,
            problem: Problem::NoSchema,
        });
    }
    Ok(())
}

/// What has been read of a stream so far.
struct Stream<'a> {
    bytes: &'a [u8],
    /// The schema's columns, once it was read.
    columns: Option<Vec<Column>>,
    /// Rows of the record batches read.
    rows: u64,
}

impl Stream<'_> {
    /// Checks the message at `pos`; returns where the next one starts, or
    /// `None` at the end of the stream.
    fn message(&mut self, pos: usize) -> Result<Option<usize>, Problem> {
        let Some((start, len)) = frame(self.bytes, pos)? else {
            return Ok(None);
        };
        let meta = self.bytes.get(start..start + len).unwrap_or_default();
        let message =
            arrow_ipc::root_as_message(meta).map_err(|e| Problem::NotAMessage(e.to_string()))?;
        let version = message.version();
        if version != MetadataVersion::V4 && version != MetadataVersion::V5 {
            return Err(Problem::Version(format!("{version:?}")));
        }
        let body_start = start + len;
        let left = self.bytes.len().saturating_sub(body_start);
        let length = message.bodyLength();
        if length < 0 {
            return Err(Problem::NegativeBodyLength(length));
        }
        let body = usize::try_from(length)
            .ok()
            .filter(|b| *b <= left)
            .ok_or(Problem::BodyPastEnd { length, left })?;
        let header = message.header_type();
        match &self.columns {
            None if header == MessageHeader::Schema => {
                let schema = message
                    .header_as_schema()
                    .ok_or(Problem::NoHeader("schema"))?;
                self.columns = Some(schema_columns(schema)?);
            }
            None => return Err(Problem::SchemaNotFirst(header_name(header))),
            Some(columns) if header == MessageHeader::RecordBatch => {
                let batch = message
                    .header_as_record_batch()
                    .ok_or(Problem::NoHeader("record batch"))?;
                let rows = check_batch(batch, columns, body)?;
                self.rows += rows;
                if self.rows > MAX_ROWS {
                    return Err(Problem::TotalRows(self.rows));
                }
            }
            Some(_) => return Err(Problem::Unexpected(header_name(header))),
        }
        Ok(Some(body_start + body))
    }
}

/// The metadata of the message at `pos` (its start and length), or `None`
/// at the end of the stream (no bytes left, or a zero length).
fn frame(bytes: &[u8], pos: usize) -> Result<Option<(usize, usize)>, Problem> {
    let rest = bytes.get(pos..).unwrap_or_default();
    if rest.is_empty() {
        return Ok(None);
    }
    let prefix = if rest.starts_with(&CONTINUATION) {
        8
    } else {
        4
    };
    let Some(&[a, b, c, d]) = rest.get(prefix - 4..prefix) else {
        return Err(Problem::TruncatedPrefix { left: rest.len() });
    };
    let length = i32::from_le_bytes([a, b, c, d]);
    if length == 0 {
        return Ok(None);
    }
    let left = rest.len() - prefix;
    let len = usize::try_from(length).map_err(|_| Problem::NegativeMetadataLength(length))?;
    if len > left {
        return Err(Problem::MetadataPastEnd { length, left });
    }
    Ok(Some((pos + prefix, len)))
}

fn header_name(header: MessageHeader) -> String {
    header
        .variant_name()
        .map_or_else(|| format!("unknown ({})", header.0), str::to_owned)
}

/// The schema's columns, each of a type the WIT allows.
fn schema_columns(schema: arrow_ipc::Schema<'_>) -> Result<Vec<Column>, Problem> {
    if schema.endianness() != Endianness::Little {
        return Err(Problem::BigEndian);
    }
    let fields = schema.fields().ok_or(Problem::NoFields)?;
    fields
        .iter()
        .enumerate()
        .map(|(index, field)| {
            let name = field.name().unwrap_or_default().to_owned();
            let reason = if field.dictionary().is_some() {
                Some("is dictionary-encoded; plugins return plain columns".to_owned())
            } else if field.children().is_some_and(|c| !c.is_empty()) {
                Some("has child fields; plugins return flat columns".to_owned())
            } else {
                None
            };
            match reason.map_or_else(|| layout(field), Err) {
                Ok(layout) => Ok(Column { name, layout }),
                Err(reason) => Err(Problem::Column {
                    index,
                    name,
                    reason,
                }),
            }
        })
        .collect()
}

/// The layout of a field's type, or why plugins may not return it.
fn layout(field: arrow_ipc::Field<'_>) -> Result<Layout, String> {
    let ty = field.type_type();
    let not_allowed = |what: String| format!("{what} is not a type plugins may return ({ALLOWED})");
    let missing = || format!("type {} comes without its parameters", type_name(ty));
    match ty {
        Type::Bool => Ok(Layout::Bits),
        Type::Int => {
            let int = field.type_as_int().ok_or_else(missing)?;
            match (int.bitWidth(), int.is_signed()) {
                (32, true) => Ok(Layout::Fixed(4)),
                (64, true) => Ok(Layout::Fixed(8)),
                (width, signed) => Err(not_allowed(format!(
                    "type Int of bit width {width}{}",
                    if signed { "" } else { ", unsigned" }
                ))),
            }
        }
        Type::FloatingPoint => {
            let float = field.type_as_floating_point().ok_or_else(missing)?;
            match float.precision() {
                Precision::DOUBLE => Ok(Layout::Fixed(8)),
                p => Err(not_allowed(format!(
                    "type FloatingPoint of precision {p:?}"
                ))),
            }
        }
        Type::Decimal => {
            let decimal = field.type_as_decimal().ok_or_else(missing)?;
            if decimal.bitWidth() != 128 {
                return Err(not_allowed(format!(
                    "type Decimal of bit width {}",
                    decimal.bitWidth()
                )));
            }
            convert::valid_decimal(decimal.precision(), decimal.scale())?;
            Ok(Layout::Fixed(16))
        }
        Type::Utf8 => Ok(Layout::Utf8),
        Type::Timestamp => {
            let timestamp = field.type_as_timestamp().ok_or_else(missing)?;
            if timestamp.unit() != TimeUnit::MICROSECOND {
                return Err(not_allowed(format!(
                    "type Timestamp in unit {:?}",
                    timestamp.unit()
                )));
            }
            if let Some(tz) = timestamp.timezone()
                && tz.parse::<arrow_array::timezone::Tz>().is_err()
            {
                return Err(format!(
                    "has timestamps in time zone {tz:?}, which Arrow does not know"
                ));
            }
            Ok(Layout::Fixed(8))
        }
        Type::Date => {
            let date = field.type_as_date().ok_or_else(missing)?;
            match date.unit() {
                DateUnit::DAY => Ok(Layout::Fixed(4)),
                unit => Err(not_allowed(format!("type Date in unit {unit:?}"))),
            }
        }
        other => Err(not_allowed(type_name(other))),
    }
}

fn type_name(ty: Type) -> String {
    ty.variant_name().map_or_else(
        || format!("unknown type {}", ty.0),
        |name| format!("type {name}"),
    )
}

/// Checks a record batch against the schema's columns and its body of
/// `body` bytes; returns its row count.
fn check_batch(
    batch: arrow_ipc::RecordBatch<'_>,
    columns: &[Column],
    body: usize,
) -> Result<u64, Problem> {
    if batch.compression().is_some() {
        return Err(Problem::Compressed);
    }
    if batch.variadicBufferCounts().is_some_and(|v| !v.is_empty()) {
        return Err(Problem::Variadic);
    }
    let length = batch.length();
    let rows = u64::try_from(length)
        .ok()
        .filter(|r| *r <= MAX_ROWS)
        .ok_or(Problem::Rows(length))?;
    let nodes: Vec<(i64, i64)> = batch
        .nodes()
        .map(|n| n.iter().map(|n| (n.length(), n.null_count())).collect())
        .unwrap_or_default();
    if nodes.len() != columns.len() {
        return Err(Problem::Nodes {
            nodes: nodes.len(),
            columns: columns.len(),
        });
    }
    let buffers: Vec<(i64, i64)> = batch
        .buffers()
        .map(|b| b.iter().map(|b| (b.offset(), b.length())).collect())
        .unwrap_or_default();
    let expected = columns.iter().map(|c| c.layout.buffers()).sum();
    if buffers.len() != expected {
        return Err(Problem::Buffers {
            buffers: buffers.len(),
            expected,
        });
    }
    // Every buffer inside the body: arrow-ipc slices them without asking.
    let mut lengths = Vec::with_capacity(buffers.len());
    for (index, &(offset, length)) in buffers.iter().enumerate() {
        let end = offset.checked_add(length);
        let inside = offset >= 0
            && length >= 0
            && end
                .and_then(|e| usize::try_from(e).ok())
                .is_some_and(|e| e <= body);
        if !inside {
            return Err(Problem::BufferOutside {
                index,
                offset,
                length,
                body,
            });
        }
        lengths.push(length.unsigned_abs());
    }
    let mut first = 0;
    for (index, (column, &(node_rows, nulls))) in columns.iter().zip(&nodes).enumerate() {
        let bad = |reason: String| Problem::Column {
            index,
            name: column.name.clone(),
            reason,
        };
        if node_rows != length {
            return Err(bad(format!("has {node_rows} rows in a batch of {length}")));
        }
        if !(0..=length).contains(&nulls) {
            return Err(bad(format!(
                "null count {nulls} is not 0 to its {length} rows"
            )));
        }
        let own = lengths.get(first..first + column.layout.buffers());
        first += column.layout.buffers();
        let Some(&[validity, values, ..]) = own else {
            return Err(Problem::Buffers {
                buffers: buffers.len(),
                expected,
            });
        };
        let too_short = |what: &str, have: u64, need: u64| {
            bad(format!(
                "its {what} buffer has {have} bytes, {rows} rows need {need}"
            ))
        };
        if nulls > 0 && validity < rows.div_ceil(8) {
            return Err(too_short("validity", validity, rows.div_ceil(8)));
        }
        let need = match column.layout {
            Layout::Bits => rows.div_ceil(8),
            Layout::Fixed(width) => rows * width,
            Layout::Utf8 if rows == 0 => 0,
            Layout::Utf8 => (rows + 1) * 4,
        };
        // arrow reads the whole offsets buffer as `i32`s and asserts (panics) when its length
        // is not a whole number of them.
        if matches!(column.layout, Layout::Utf8) && values % 4 != 0 {
            return Err(bad(format!(
                "its offsets buffer has {values} bytes, not a whole number of 4-byte offsets"
            )));
        }
        if values < need {
            let what = if matches!(column.layout, Layout::Utf8) {
                "offsets"
            } else {
                "values"
            };
            return Err(too_short(what, values, need));
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{
        ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int32Array, Int64Array,
        RecordBatch, StringArray, TimestampMicrosecondArray,
    };
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    /// One column of every type plugins may return, three rows, with nulls.
    fn every_type() -> RecordBatch {
        let columns: Vec<(&str, ArrayRef)> = vec![
            (
                "b",
                Arc::new(BooleanArray::from(vec![Some(true), None, Some(false)])),
            ),
            (
                "i",
                Arc::new(Int32Array::from(vec![Some(1), Some(2), None])),
            ),
            ("l", Arc::new(Int64Array::from(vec![7, 8, 9]))),
            ("f", Arc::new(Float64Array::from(vec![0.5, 1.5, -2.0]))),
            (
                "d",
                Arc::new(
                    Decimal128Array::from(vec![Some(2390), None, Some(-5)])
                        .with_precision_and_scale(12, 2)
                        .expect("valid decimal"),
                ),
            ),
            (
                "s",
                Arc::new(StringArray::from(vec![Some("a"), None, Some("ccc")])),
            ),
            (
                "t",
                Arc::new(TimestampMicrosecondArray::from(vec![1, 2, 3]).with_timezone("+00:00")),
            ),
            (
                "n",
                Arc::new(TimestampMicrosecondArray::from(vec![1, 2, 3])),
            ),
            (
                "u",
                Arc::new(TimestampMicrosecondArray::from(vec![4, 5, 6]).with_timezone("UTC")),
            ),
            ("e", Arc::new(Date32Array::from(vec![19000, 19001, 19002]))),
        ];
        RecordBatch::try_from_iter(columns).expect("valid batch")
    }

    fn ipc(batches: &[RecordBatch]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut writer =
            arrow_ipc::writer::StreamWriter::try_new(&mut out, batches[0].schema_ref())
                .expect("writer");
        for b in batches {
            writer.write(b).expect("write");
        }
        writer.finish().expect("finish");
        drop(writer);
        out
    }

    /// The messages of a stream: where each one's metadata starts and how long it is.
    fn messages(bytes: &[u8]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut pos = 0;
        while let Ok(Some((start, len))) = frame(bytes, pos) {
            let message = arrow_ipc::root_as_message(&bytes[start..start + len]).expect("valid");
            out.push((start, len));
            pos = start + len + usize::try_from(message.bodyLength()).expect("positive");
        }
        out
    }

    /// Reads the flatbuffer table at `table` of `meta`: where field slot `id` lives.
    fn slot(meta: &[u8], table: usize, id: usize) -> usize {
        let at = |p: usize, n: usize| &meta[p..p + n];
        let soffset = i32::from_le_bytes(at(table, 4).try_into().expect("4 bytes"));
        let vtable = usize::try_from(i64::try_from(table).expect("small") - i64::from(soffset))
            .expect("inside");
        let field = u16::from_le_bytes(at(vtable + 4 + 2 * id, 2).try_into().expect("2 bytes"));
        assert_ne!(field, 0, "slot {id} is present");
        table + usize::from(field)
    }

    /// Follows the offset stored at `pos`.
    fn follow(meta: &[u8], pos: usize) -> usize {
        pos + usize::try_from(u32::from_le_bytes(
            meta[pos..pos + 4].try_into().expect("4"),
        ))
        .expect("fits")
    }

    /// The table of field `index` in a schema message.
    fn field_table(meta: &[u8], index: usize) -> usize {
        let message = follow(meta, 0);
        let schema = follow(meta, slot(meta, message, 2));
        let fields = follow(meta, slot(meta, schema, 1));
        follow(meta, fields + 4 + 4 * index)
    }

    /// `bytes` with `value` written at `pos` of message `m`'s metadata.
    fn patched(bytes: &[u8], m: usize, patch: impl Fn(&[u8]) -> (usize, Vec<u8>)) -> Vec<u8> {
        let (start, len) = messages(bytes)[m];
        let (pos, value) = patch(&bytes[start..start + len]);
        let mut out = bytes.to_vec();
        out[start + pos..start + pos + value.len()].copy_from_slice(&value);
        out
    }

    fn problem(bytes: &[u8]) -> Problem {
        check(bytes).expect_err("refused").problem
    }

    fn body_length(bytes: &[u8], value: i64) -> Vec<u8> {
        patched(bytes, 1, |meta| {
            (slot(meta, follow(meta, 0), 3), value.to_le_bytes().to_vec())
        })
    }

    #[test]
    fn every_type_plugins_may_return_passes_and_reads_back() {
        let b = every_type();
        let bytes = ipc(&[b.clone(), b.slice(1, 2), b.slice(0, 0)]);
        check(&bytes).expect("valid");
        let read: Vec<RecordBatch> = arrow_ipc::reader::StreamReader::try_new(&bytes[..], None)
            .expect("schema")
            .collect::<Result<_, _>>()
            .expect("batches");
        assert_eq!(read, [b.clone(), b.slice(1, 2), b.slice(0, 0)]);
        // Without the end-of-stream marker, and in the pre-0.15 framing (no
        // continuation marker), both of which arrow-ipc reads.
        check(&bytes[..bytes.len() - 8]).expect("no end marker");
        let mut legacy = Vec::new();
        let options = arrow_ipc::writer::IpcWriteOptions::try_new(8, true, MetadataVersion::V4)
            .expect("options");
        let mut writer = arrow_ipc::writer::StreamWriter::try_new_with_options(
            &mut legacy,
            b.schema_ref(),
            options,
        )
        .expect("writer");
        writer.write(&b).expect("write");
        writer.finish().expect("finish");
        drop(writer);
        assert_ne!(legacy[..4], CONTINUATION);
        check(&legacy).expect("legacy framing");
        check(&ipc(&[b.slice(0, 0)])).expect("an empty batch");
    }

    #[test]
    fn a_huge_or_negative_body_length_is_refused_before_any_allocation() {
        let bytes = ipc(&[every_type()]);
        let (start, len) = messages(&bytes)[1];
        let left = bytes.len() - start - len;
        let err = check(&body_length(&bytes, 1 << 62)).expect_err("huge body");
        assert_eq!(err.message, 1);
        assert_eq!(
            err.problem,
            Problem::BodyPastEnd {
                length: 1 << 62,
                left
            }
        );
        assert!(
            err.to_string()
                .contains("body length 4611686018427387904 runs past the end of the stream"),
            "{err}"
        );
        assert_eq!(
            problem(&body_length(&bytes, -8)),
            Problem::NegativeBodyLength(-8)
        );
        // One byte more than there is.
        assert!(matches!(
            problem(&body_length(
                &bytes,
                i64::try_from(left + 1).expect("small")
            )),
            Problem::BodyPastEnd { .. }
        ));
    }

    #[test]
    fn broken_framing_is_refused() {
        let bytes = ipc(&[every_type()]);
        assert_eq!(problem(&[]), Problem::NoSchema);
        assert_eq!(
            problem(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]),
            Problem::NoSchema
        );
        assert_eq!(problem(&bytes[..6]), Problem::TruncatedPrefix { left: 6 });
        let mut negative = bytes.clone();
        negative[4..8].copy_from_slice(&(-16i32).to_le_bytes());
        assert_eq!(problem(&negative), Problem::NegativeMetadataLength(-16));
        let mut long = bytes.clone();
        long[4..8].copy_from_slice(&i32::MAX.to_le_bytes());
        assert!(matches!(
            problem(&long),
            Problem::MetadataPastEnd {
                length: i32::MAX,
                ..
            }
        ));
        // Metadata that is no flatbuffer at all.
        let mut garbage = vec![0xff, 0xff, 0xff, 0xff, 16, 0, 0, 0];
        garbage.extend([0xab; 16]);
        assert!(matches!(problem(&garbage), Problem::NotAMessage(_)));
        // Cut inside the record batch's body.
        assert!(matches!(
            problem(&bytes[..bytes.len() - 20]),
            Problem::BodyPastEnd { .. }
        ));
        // A record batch first: no schema before it.
        let (start, _) = messages(&bytes)[1];
        let err = check(&bytes[start - 8..]).expect_err("no schema first");
        assert_eq!(err.problem, Problem::SchemaNotFirst("RecordBatch".into()));
    }

    #[test]
    fn an_unknown_type_or_bit_width_is_refused() {
        let bytes = ipc(&[every_type()]);
        // Field 2 ("l") is Int64: make its type 99, then its bit width 7.
        let unknown = patched(&bytes, 0, |meta| {
            (slot(meta, field_table(meta, 2), 2), vec![99])
        });
        let err = check(&unknown).expect_err("unknown type");
        assert_eq!(err.message, 0);
        assert!(
            err.to_string()
                .contains("column 2 (\"l\"): unknown type 99 is not a type plugins may return"),
            "{err}"
        );
        let width = patched(&bytes, 0, |meta| {
            let int = follow(meta, slot(meta, field_table(meta, 2), 3));
            (slot(meta, int, 0), 7i32.to_le_bytes().to_vec())
        });
        assert!(
            problem(&width)
                .to_string()
                .contains("type Int of bit width 7 is not a type plugins may return"),
        );
    }

    #[test]
    fn a_decimal_outside_precision_1_to_38_and_scale_0_to_precision_is_refused() {
        let bytes = ipc(&[every_type()]);
        // Field 4 ("d") is decimal128(12, 2).
        let decimal = |id: usize, value: i32| {
            patched(&bytes, 0, move |meta| {
                let d = follow(meta, slot(meta, field_table(meta, 4), 3));
                (slot(meta, d, id), value.to_le_bytes().to_vec())
            })
        };
        let text = problem(&decimal(1, 90)).to_string();
        assert_eq!(
            text,
            "column 4 (\"d\"): decimal128(12, 90) is not a valid decimal: the scale must be 0 to the precision (12)"
        );
        assert!(
            problem(&decimal(1, -1))
                .to_string()
                .contains("decimal128(12, -1)")
        );
        assert!(
            problem(&decimal(0, 39)).to_string().contains(
                "decimal128(39, 2) is not a valid decimal: the precision must be 1 to 38"
            )
        );
        assert!(
            problem(&decimal(0, 300))
                .to_string()
                .contains("decimal128(300, 2)")
        );
        assert!(
            problem(&decimal(0, 0))
                .to_string()
                .contains("decimal128(0, 2)")
        );
    }

    #[test]
    fn types_outside_the_wit_are_refused() {
        for (data_type, expected) in [
            (DataType::UInt8, "type Int of bit width 8, unsigned"),
            (DataType::Float32, "type FloatingPoint of precision SINGLE"),
            (DataType::LargeUtf8, "type LargeUtf8"),
            (DataType::Date64, "type Date in unit MILLISECOND"),
            (
                DataType::Timestamp(arrow_schema::TimeUnit::Nanosecond, None),
                "type Timestamp in unit NANOSECOND",
            ),
            (
                DataType::List(Arc::new(Field::new("x", DataType::Int64, true))),
                "has child fields",
            ),
            (
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                "is dictionary-encoded",
            ),
        ] {
            let schema = Arc::new(Schema::new(vec![Field::new("x", data_type, true)]));
            let batch = RecordBatch::new_empty(schema);
            let text = problem(&ipc(&[batch])).to_string();
            assert!(text.starts_with("column 0 (\"x\"): "), "{text}");
            assert!(text.contains(expected), "{text} should say {expected}");
        }
        // A timestamp in a zone nobody knows.
        let schema = Arc::new(Schema::new(vec![Field::new(
            "t",
            DataType::Timestamp(
                arrow_schema::TimeUnit::Microsecond,
                Some("Mars/Olympus".into()),
            ),
            true,
        )]));
        let text = problem(&ipc(&[RecordBatch::new_empty(schema)])).to_string();
        assert!(text.contains("time zone \"Mars/Olympus\""), "{text}");
    }

    /// `bytes` with the record batch's field `id` (a vector of 16-byte
    /// structs) element `element`, its 8-byte half `half`, set to `value`.
    fn batch_struct(bytes: &[u8], id: usize, element: usize, half: usize, value: i64) -> Vec<u8> {
        patched(bytes, 1, |meta| {
            let batch = follow(meta, slot(meta, follow(meta, 0), 2));
            let vector = follow(meta, slot(meta, batch, id));
            (
                vector + 4 + 16 * element + 8 * half,
                value.to_le_bytes().to_vec(),
            )
        })
    }

    fn rows(bytes: &[u8], value: i64) -> Vec<u8> {
        patched(bytes, 1, |meta| {
            let batch = follow(meta, slot(meta, follow(meta, 0), 2));
            (slot(meta, batch, 0), value.to_le_bytes().to_vec())
        })
    }

    #[test]
    fn absurd_row_counts_and_buffers_outside_the_body_are_refused() {
        let bytes = ipc(&[every_type()]);
        assert_eq!(problem(&rows(&bytes, -1)), Problem::Rows(-1));
        assert_eq!(problem(&rows(&bytes, 1 << 40)), Problem::Rows(1 << 40));
        // A row count the buffers cannot hold: node 0 still says 3.
        assert!(
            problem(&rows(&bytes, 1000))
                .to_string()
                .contains("column 0 (\"b\"): has 3 rows in a batch of 1000")
        );
        // Nodes (length, null count): column 2's length and null count.
        let text = problem(&batch_struct(&bytes, 1, 2, 0, 1 << 50)).to_string();
        assert!(
            text.contains("column 2 (\"l\"): has 1125899906842624 rows"),
            "{text}"
        );
        let text = problem(&batch_struct(&bytes, 1, 2, 1, -3)).to_string();
        assert!(
            text.contains("null count -3 is not 0 to its 3 rows"),
            "{text}"
        );
        // Buffers (offset, length): buffer 5 is column 2's values.
        for (half, value) in [
            (0, 1i64 << 62),
            (0, -64),
            (1, 1 << 62),
            (1, -1),
            (1, i64::MAX),
        ] {
            assert!(
                matches!(
                    problem(&batch_struct(&bytes, 2, 5, half, value)),
                    Problem::BufferOutside { index: 5, .. }
                ),
                "half {half} = {value}"
            );
        }
        // Inside the body but too short for three int64s.
        let text = problem(&batch_struct(&bytes, 2, 5, 1, 16)).to_string();
        assert!(
            text.contains("column 2 (\"l\"): its values buffer has 16 bytes, 3 rows need 24"),
            "{text}"
        );
        // Column 1 has a null: its validity bitmap may not be empty.
        let text = problem(&batch_struct(&bytes, 2, 2, 1, 0)).to_string();
        assert!(text.contains("its validity buffer has 0 bytes"), "{text}");
    }

    #[test]
    fn dictionary_batches_and_second_schemas_are_refused() {
        let bytes = ipc(&[every_type()]);
        let (schema_start, schema_len) = messages(&bytes)[0];
        // The stream's schema message twice.
        let mut twice = bytes[..schema_start + schema_len].to_vec();
        twice.extend_from_slice(&bytes[..schema_start + schema_len]);
        let err = check(&twice).expect_err("two schemas");
        assert_eq!(err.message, 1);
        assert_eq!(err.problem, Problem::Unexpected("Schema".into()));
        // The record batch relabelled as a dictionary batch (which the
        // flatbuffers verifier may already refuse: the tables differ).
        let dict = patched(&bytes, 1, |meta| (slot(meta, follow(meta, 0), 1), vec![2]));
        let p = problem(&dict);
        assert!(
            p == Problem::Unexpected("DictionaryBatch".into())
                || matches!(p, Problem::NotAMessage(_)),
            "{p}"
        );
    }
}
