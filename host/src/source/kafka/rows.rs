//! Kafka records to Arrow. Records are appended to column builders as they arrive from the
//! consumer (no per-record allocation); a JSON value goes through the files source's decoder,
//! one line per record, so that `from_json` semantics and the malformed-record policies are
//! exactly those of files.

use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, Int32Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

use crate::decode::{DecodeError, Decoded, Decoder};

use super::TopicPartition;

/// Spark's Kafka source schema (`timestamp` in µs, UTC, like every timestamp here).
pub fn raw_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Binary, true),
        Field::new("value", DataType::Binary, true),
        Field::new("topic", DataType::Utf8, false),
        Field::new("partition", DataType::Int32, false),
        Field::new("offset", DataType::Int64, false),
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            true,
        ),
        Field::new("timestampType", DataType::Int32, true),
    ]))
}

/// One record as the consumer hands it over (borrowed from librdkafka's buffer).
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub offset: i64,
    /// Milliseconds since the epoch and the Kafka timestamp type (0 create, 1 log append).
    pub timestamp: Option<(i64, i32)>,
}

/// Rows being built for one batch.
#[derive(Debug)]
pub enum Rows {
    Raw(Box<RawRows>),
    Json(JsonRows),
}

impl Rows {
    pub fn raw() -> Self {
        Self::Raw(Box::default())
    }

    pub fn json() -> Self {
        Self::Json(JsonRows::default())
    }

    pub fn push(&mut self, tp: &TopicPartition, r: &Record<'_>) {
        match self {
            Self::Raw(rows) => rows.push(tp, r),
            Self::Json(rows) => rows.push(r),
        }
    }
}

/// Builders of the raw schema.
#[derive(Debug, Default)]
pub struct RawRows {
    key: BinaryBuilder,
    value: BinaryBuilder,
    topic: StringBuilder,
    partition: Int32Builder,
    offset: Int64Builder,
    timestamp: TimestampMicrosecondBuilder,
    timestamp_type: Int32Builder,
    rows: usize,
}

impl RawRows {
    fn push(&mut self, tp: &TopicPartition, r: &Record<'_>) {
        self.key.append_option(r.key);
        self.value.append_option(r.value);
        self.topic.append_value(&tp.topic);
        self.partition.append_value(tp.partition);
        self.offset.append_value(r.offset);
        match r.timestamp {
            Some((ms, kind)) => {
                self.timestamp.append_value(ms.saturating_mul(1000));
                self.timestamp_type.append_value(kind);
            }
            None => {
                self.timestamp.append_null();
                self.timestamp_type.append_null();
            }
        }
        self.rows += 1;
    }

    /// The rows as one batch of [`raw_schema`] (none when empty).
    ///
    /// # Errors
    /// Only if Arrow refuses the columns, which are built consistent.
    pub fn finish(
        mut self,
        schema: &SchemaRef,
    ) -> Result<Option<RecordBatch>, arrow_schema::ArrowError> {
        if self.rows == 0 {
            return Ok(None);
        }
        let timestamps = self.timestamp.finish().with_timezone("+00:00");
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.key.finish()),
            Arc::new(self.value.finish()),
            Arc::new(self.topic.finish()),
            Arc::new(self.partition.finish()),
            Arc::new(self.offset.finish()),
            Arc::new(timestamps),
            Arc::new(self.timestamp_type.finish()),
        ];
        RecordBatch::try_new(Arc::clone(schema), columns).map(Some)
    }
}

/// JSON values of one partition's range, one line each, with the offset of every line.
#[derive(Debug, Default)]
pub struct JsonRows {
    lines: Vec<u8>,
    offsets: Vec<i64>,
}

impl JsonRows {
    fn push(&mut self, r: &Record<'_>) {
        // A line break inside a value would split it into two records. Outside strings it
        // is whitespace, so a space means the same; inside a string a raw line break is
        // invalid JSON anyway, and the record stays one malformed record. A null or empty
        // value is a blank line: no row, as `from_json(null)` yields no fields.
        let value = r.value.unwrap_or_default();
        let start = self.lines.len();
        self.lines.extend_from_slice(value);
        for b in &mut self.lines[start..] {
            if *b == b'\n' || *b == b'\r' {
                *b = b' ';
            }
        }
        self.lines.push(b'\n');
        self.offsets.push(r.offset);
    }

    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// Decodes the values of `tp` into `out`. Malformed records are named by partition and
    /// offset (`orders-1@57`), in errors and in dead letters alike.
    ///
    /// # Errors
    /// [`JsonError`] with the record's offset under the `fail` policy.
    pub fn decode(
        &self,
        tp: &TopicPartition,
        decoder: &mut Decoder,
        out: &mut Decoded,
    ) -> Result<(), JsonError> {
        let origin = tp.to_string();
        let mut local = Decoded::default();
        let offset_of = |line: u64| {
            usize::try_from(line)
                .ok()
                .and_then(|l| l.checked_sub(1))
                .and_then(|i| self.offsets.get(i).copied())
                .unwrap_or(-1)
        };
        decoder
            .decode(&self.lines, &origin, &mut local)
            .map_err(|error| match error {
                DecodeError::Malformed { line, reason, .. } => JsonError::Malformed {
                    tp: tp.clone(),
                    offset: offset_of(line),
                    reason,
                },
                other => JsonError::Decode(other),
            })?;
        for m in &mut local.malformed {
            m.origin = format!("{origin}@{}", offset_of(m.line));
        }
        out.batches.append(&mut local.batches);
        out.num_malformed += local.num_malformed;
        out.malformed.append(&mut local.malformed);
        Ok(())
    }
}

/// Decodes the values of several partitions' ranges as one run of lines, in the order given
/// (the partitions' order, so that a replay yields the same batches whatever order the
/// broker's fetch responses came in): one batch per [`DECODE_BATCH_ROWS`] rows or megabyte,
/// not one per partition, so that a small real-time part over many partitions is one batch
/// for the transforms. Malformed records are named as [`JsonRows::decode`] names them.
///
/// # Errors
/// [`JsonError`] with the record's partition and offset under the `fail` policy.
///
/// [`DECODE_BATCH_ROWS`]: crate::source::DECODE_BATCH_ROWS
pub fn decode_partitions(
    rows: &[(&TopicPartition, JsonRows)],
    decoder: &mut Decoder,
    out: &mut Decoded,
) -> Result<(), JsonError> {
    let filled: Vec<&(&TopicPartition, JsonRows)> =
        rows.iter().filter(|(_, r)| !r.is_empty()).collect();
    match filled.as_slice() {
        [] => return Ok(()),
        [(tp, r)] => return r.decode(tp, decoder, out),
        _ => {}
    }
    let mut lines = Vec::with_capacity(filled.iter().map(|(_, r)| r.lines.len()).sum());
    // Each line's partition (index into `filled`) and offset.
    let mut origins: Vec<(usize, i64)> =
        Vec::with_capacity(filled.iter().map(|(_, r)| r.len()).sum());
    for (i, (_, r)) in filled.iter().enumerate() {
        lines.extend_from_slice(&r.lines);
        origins.extend(r.offsets.iter().map(|&o| (i, o)));
    }
    let origin_of = |line: u64| {
        usize::try_from(line)
            .ok()
            .and_then(|l| l.checked_sub(1))
            .and_then(|i| origins.get(i).copied())
    };
    let mut local = Decoded::default();
    decoder
        .decode(&lines, "kafka", &mut local)
        .map_err(|error| match error {
            DecodeError::Malformed { line, reason, .. } => {
                let (i, offset) = origin_of(line).unwrap_or((0, -1));
                JsonError::Malformed {
                    tp: filled[i].0.clone(),
                    offset,
                    reason,
                }
            }
            other => JsonError::Decode(other),
        })?;
    for m in &mut local.malformed {
        if let Some((i, offset)) = origin_of(m.line) {
            m.origin = format!("{}@{offset}", filled[i].0);
        }
    }
    out.batches.append(&mut local.batches);
    out.num_malformed += local.num_malformed;
    out.malformed.append(&mut local.malformed);
    Ok(())
}

/// Decoding the JSON values of a partition failed.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    #[error("malformed record at {tp} offset {offset}: {reason}")]
    Malformed {
        tp: TopicPartition,
        offset: i64,
        reason: String,
    },
    #[error(transparent)]
    Decode(DecodeError),
}
