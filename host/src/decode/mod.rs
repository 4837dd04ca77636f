//! Decoding input files (JSON lines or CSV) into Arrow record batches of a declared schema.
//! Parquet files, which are columnar and have no malformed lines, are read by
//! [`ParquetDecoder`] (`parquet_file.rs`) instead.
//!
//! This is the engine's hot path: every input row passes through it once, so it is a
//! hand-written scanner appending into plain column buffers, with no allocation per row.
//! It exists as its own module (instead of arrow-json/arrow-csv) because queries must reproduce
//! Spark's malformed-record semantics, which need per-line and per-field outcomes:
//!
//! * a line that is not a valid record: every field null, the raw line in `_corrupt_record`;
//! * a field that cannot be converted (`"amount":"N/A"`): only that field null, the rest kept,
//!   the raw line in `_corrupt_record`;
//! * a number or boolean for a string column: its literal text, not an error;
//! * JSON `null`, a missing key: null, not an error; unknown keys are ignored.
//!
//! [`MalformedPolicy`] then chooses what happens to a malformed line: kept as above
//! (`Permissive`), left out (`Drop`), an error naming `origin:line` (`Fail`), or left out and
//! returned for a dead-letter file (`DeadLetter`, see [`dead_letter`]). Every policy counts
//! malformed lines, and every non-blank line counts as an input row (as in Spark).
//!
//! Conversions follow Spark's JSON reader: integers only from JSON integers, floats from
//! numbers or the strings `NaN`/`Infinity`, booleans only from `true`/`false`, decimals
//! exactly (digit by digit, rounded half-up) from a number or a string holding one, timestamps
//! from ISO-8601 strings (or an integer count of seconds), dates from `YYYY-MM-DD`. CSV fields
//! are text and go through the same text conversions (integers, booleans and floats included).
//! All output fields are nullable, as Spark makes file-source schemas nullable. A timestamp
//! with an offset is converted to UTC whatever the column's time zone (`None` included).
//!
//! CSV: RFC 4180 quoting (a doubled quote stands for itself), columns by position, the header
//! line skipped when configured, a wrong number of fields makes the line malformed (all
//! fields null), an empty unquoted field is null (a quoted empty field is `""` for a string
//! column, null otherwise). Limitation of this version: a quoted field may not contain a line
//! break (the file is split into lines first); such a record is reported as malformed.
//!
//! # Layout
//!
//! * `mod.rs` — public API, the line loop, policies, batch cutting.
//! * `json.rs` — the JSON-lines record scanner.
//! * `csv.rs` — the CSV line splitter.
//! * `cells.rs` — the batch's columns written a row at a time, text-to-value conversions.
//! * `timestamp.rs` — ISO-8601 date/timestamp parsing.
//! * [`dead_letter`] — atomic dead-letter files per batch.
//! * `parquet_file.rs` — Parquet files, columns by name, cast to the schema.

pub mod dead_letter;

mod cells;
mod csv;
mod json;
mod parquet_file;
mod timestamp;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchOptions};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};

use self::cells::{Column, Kind, Rows};

pub use self::dead_letter::write_dead_letters;
pub use self::parquet_file::{ParquetDecoder, weir_type};

/// Name of the column holding the raw text of a malformed line (Permissive only).
pub const CORRUPT_RECORD_COLUMN: &str = "_corrupt_record";

/// Largest line accepted as one record. With the batch byte budget below it keeps the string
/// offsets of a batch (i32) from overflowing: a corrupt record can triple in size when invalid
/// UTF-8 is replaced by U+FFFD.
const MAX_LINE_BYTES: usize = 256 << 20;
/// The longest line the JSON scan parses to its newline in one pass (see `decode_lines`);
/// longer ones are cut into lines first, so a row taken back never held more than this.
const ONE_PASS_BYTES: usize = 64 << 10;
// A line the one-pass scan ends is never too long.
const _: () = assert!(ONE_PASS_BYTES <= MAX_LINE_BYTES);
/// A batch is cut early once its lines add up to this many bytes.
const MAX_BATCH_BYTES: usize = 256 << 20;
/// A batch is cut at the first line at or after each multiple of this many bytes of a file,
/// where a file may be split to be decoded on several threads (see [`Decoder::decode`]).
/// About 7,000 orders: a sub-batch large enough that its fixed costs do not count.
pub const PART_BYTES: usize = 1 << 20;
/// Rows of column capacity allocated up front (more grow on demand).
const INITIAL_CAPACITY: usize = 16_384;

/// The input format of a file.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    /// One JSON object per line.
    JsonLines,
    /// Comma- (or other-) separated values; columns by position.
    Csv(CsvOptions),
}

/// CSV dialect.
#[derive(Debug, Clone, PartialEq)]
pub struct CsvOptions {
    /// The first non-blank line of each file is a header and is skipped.
    pub header: bool,
    /// Field separator.
    pub delimiter: u8,
    /// Quote character; doubled inside a quoted field to stand for itself.
    pub quote: u8,
}

impl Default for CsvOptions {
    fn default() -> Self {
        Self {
            header: true,
            delimiter: b',',
            quote: b'"',
        }
    }
}

/// What to do with a malformed line: a source's `on_malformed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MalformedPolicy {
    /// `"permissive"` (default): keep it, bad fields (or all fields) null, raw line in
    /// `_corrupt_record` (Spark's default).
    Permissive,
    /// `"drop"`: leave it out (counted).
    Drop,
    /// `"fail"`: stop decoding with [`DecodeError::Malformed`], failing the batch.
    Fail,
    /// `"dead-letter"`: leave it out and return it in [`Decoded::malformed`] for the
    /// source's `dead_letter_path`.
    DeadLetter,
}

/// Decoder configuration.
#[derive(Debug, Clone)]
pub struct DecoderOptions {
    /// Input format.
    pub format: Format,
    /// Malformed-line policy.
    pub policy: MalformedPolicy,
    /// Maximum rows per output batch (at least 1).
    pub batch_size: usize,
}

impl Default for DecoderOptions {
    fn default() -> Self {
        Self {
            format: Format::JsonLines,
            policy: MalformedPolicy::Permissive,
            batch_size: 65_536,
        }
    }
}

/// The output of one or more [`Decoder::decode`] calls (each call appends).
#[derive(Debug, Default)]
pub struct Decoded {
    /// Output batches, each of at most `batch_size` rows, never spanning two files.
    pub batches: Vec<RecordBatch>,
    /// Non-blank lines read (malformed ones included; a CSV header excluded).
    pub num_input_rows: u64,
    /// Malformed lines, whatever the policy did with them.
    pub num_malformed: u64,
    /// The malformed lines (filled under [`MalformedPolicy::DeadLetter`] only).
    pub malformed: Vec<MalformedRecord>,
}

impl Decoded {
    /// Adds `other`'s batches, counts and malformed lines after this one's.
    pub fn append(&mut self, mut other: Decoded) {
        self.batches.append(&mut other.batches);
        self.num_input_rows += other.num_input_rows;
        self.num_malformed += other.num_malformed;
        self.malformed.append(&mut other.malformed);
    }
}

/// One malformed line, for a dead-letter file.
#[derive(Debug, Clone, PartialEq)]
pub struct MalformedRecord {
    /// The file it came from.
    pub origin: String,
    /// 1-based line number in that file.
    pub line: u64,
    /// The line (lossy UTF-8, without its line break).
    pub raw: String,
    /// Why it is malformed.
    pub error: String,
}

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// A malformed line under [`MalformedPolicy::Fail`].
    #[error("malformed record at {origin}:{line}: {reason}")]
    Malformed {
        origin: String,
        line: u64,
        reason: String,
    },
    /// The schema has a field of a type the decoder cannot produce.
    #[error(
        "field \"{field}\": unsupported data type {data_type} (supported: Boolean, Int32, \
         Int64, Float64, Decimal128(p<=38, s>=0), Utf8, Timestamp, Date32)"
    )]
    UnsupportedType { field: String, data_type: DataType },
    /// The schema names a field twice, or uses the corrupt-record column's name.
    #[error("field \"{field}\": {reason}")]
    InvalidField { field: String, reason: &'static str },
    /// `batch_size` was 0.
    #[error("decoder batch_size must be at least 1")]
    ZeroBatchSize,
    /// One line is too long to be a record.
    #[error("line {origin}:{line} is {len} bytes long, over the {max}-byte limit of a record")]
    LineTooLong {
        origin: String,
        line: u64,
        len: usize,
        max: usize,
    },
    /// Assembling a batch failed (not expected: the buffers are built consistent).
    #[error("building a batch of {origin}: {source}")]
    Arrow {
        origin: String,
        #[source]
        source: ArrowError,
    },
    /// A file that cannot be read as Parquet (not Parquet, truncated, corrupt).
    #[error("cannot read {origin} as Parquet: {reason}")]
    Parquet { origin: String, reason: String },
    /// A column of a Parquet file that cannot be read as the schema's column (`reason` says
    /// why, as a phrase whose subject is the column).
    #[error("{origin}: column \"{column}\" {reason}")]
    ParquetColumn {
        origin: String,
        column: String,
        reason: String,
    },
    /// Writing a dead-letter file failed.
    #[error("writing dead letters to {path}: {source}")]
    DeadLetterIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A schema field as the scanners see it.
#[derive(Debug, Clone)]
pub(crate) struct FieldSpec {
    name: String,
    /// The name needs no JSON escaping (no `"`, `\\` or control characters), so a key can be
    /// matched against it byte for byte without scanning it first.
    plain_name: bool,
    /// `,"name":`, the bytes before this field's value when it follows the field before it in
    /// compact JSON, taken by the JSON scanner in one comparison; empty (never taken so) for a
    /// name that is not plain.
    lead: json::Lead,
    kind: Kind,
    sql: String,
}

/// What the parsers write a row into: the batch's columns, and state reused across rows.
#[derive(Debug, Default)]
pub(crate) struct RowState {
    /// The batch's columns, one per schema field, being written.
    out: Rows,
    /// Unescaped strings of this row.
    scratch: Vec<u8>,
    /// The first field error of this row.
    error: Option<String>,
    /// CSV field positions (reused).
    cells: Vec<csv::CsvCell>,
    /// The last date parsed (kept across rows).
    dates: timestamp::DateCache,
}

impl RowState {
    #[inline]
    fn reset(&mut self) {
        self.scratch.clear();
        self.error = None;
    }

    /// Records a field error (the first one of a row wins).
    fn field_error(&mut self, spec: &FieldSpec, what: fmt::Arguments<'_>) {
        if self.error.is_none() {
            self.error = Some(format!("field \"{}\": {what}", spec.name));
        }
    }

    /// Records `field "x": cannot parse "text" as TYPE`.
    fn cannot_parse(&mut self, spec: &FieldSpec, raw: &[u8], quoted: bool) {
        if self.error.is_some() {
            return;
        }
        const MAX_SHOWN: usize = 64;
        let shown = String::from_utf8_lossy(&raw[..raw.len().min(MAX_SHOWN)]);
        let more = if raw.len() > MAX_SHOWN { "..." } else { "" };
        let q = if quoted { "\"" } else { "" };
        self.field_error(
            spec,
            format_args!("cannot parse {q}{shown}{more}{q} as {}", spec.sql),
        );
    }
}

/// Decodes files of one schema and format into record batches.
#[derive(Debug)]
pub struct Decoder {
    output_schema: SchemaRef,
    options: DecoderOptions,
    fields: Vec<FieldSpec>,
    corrupt: Option<Column>,
    /// Rows since the last corrupt one, whose `_corrupt_record` nulls are appended in one go
    /// (before the next corrupt line, or when the batch is cut).
    corrupt_nulls: usize,
    row: RowState,
    /// Line bytes in the batch being built.
    batch_bytes: usize,
    /// Decode every line by the line path, never in one pass (tests compare the two).
    #[cfg(test)]
    pub(crate) line_by_line: bool,
}

/// A part of a file that a decoder can decode on its own: it starts where a batch starts
/// (the file's start, or the first line at or after a multiple of [`PART_BYTES`]), so its
/// batches are those of the whole file. See [`Decoder::parts`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Its bytes in the file.
    pub range: std::ops::Range<usize>,
    /// Whether its first non-blank line is a CSV header to skip (the first part's, when the
    /// format has one).
    pub header: bool,
}

/// Where the decoding of a file stands between two calls of the line loop: the bytes and
/// lines before the next line, the next cut by position, and whether a CSV header is still
/// to be skipped.
#[derive(Debug)]
struct Cursor {
    /// Bytes of the file before the next line.
    offset: usize,
    /// Lines before the next line: of the file, or of the part (see [`Decoder::decode_part`]).
    lines: u64,
    /// The next cut by position, in the file's bytes.
    next_cut: usize,
    /// The next non-blank line is a CSV header.
    skip_header: bool,
}

impl Cursor {
    /// At `offset`, the start of a file or of a part (see [`Decoder::parts`]): a batch starts
    /// there, so the next cut is the next multiple of [`PART_BYTES`] after it; lines are
    /// counted from 0.
    fn at(offset: usize, skip_header: bool) -> Self {
        Self {
            offset,
            lines: 0,
            next_cut: (offset / PART_BYTES + 1) * PART_BYTES,
            skip_header,
        }
    }
}

/// A file being decoded a piece at a time ([`Decoder::decode_piece`]): where it stands, and
/// what its pieces gave so far (handed over whole by [`Decoder::finish_pieces`], so that a
/// file that fails adds nothing: a failed piece consumes it).
#[derive(Debug)]
pub struct Pieces {
    cursor: Cursor,
    decoded: Decoded,
}

impl Decoder {
    /// Makes the JSON scanner take every key by its general steps, never with the comma
    /// before it in one comparison (tests compare the two).
    #[cfg(test)]
    pub(crate) fn without_leads(&mut self) {
        for field in &mut self.fields {
            field.lead = json::Lead::default();
        }
    }

    /// Creates a decoder for `schema`.
    ///
    /// # Errors
    ///
    /// [`DecodeError::UnsupportedType`] naming the first field of an unsupported type,
    /// [`DecodeError::InvalidField`] for a duplicate field name or a field named
    /// `_corrupt_record`, [`DecodeError::ZeroBatchSize`].
    pub fn new(schema: SchemaRef, options: DecoderOptions) -> Result<Self, DecodeError> {
        if options.batch_size == 0 {
            return Err(DecodeError::ZeroBatchSize);
        }
        let mut fields = Vec::with_capacity(schema.fields().len());
        for field in schema.fields() {
            let name = field.name();
            if name == CORRUPT_RECORD_COLUMN {
                return Err(DecodeError::InvalidField {
                    field: name.clone(),
                    reason: "this name is reserved for the corrupt-record column",
                });
            }
            if fields.iter().any(|f: &FieldSpec| &f.name == name) {
                return Err(DecodeError::InvalidField {
                    field: name.clone(),
                    reason: "the schema names this field twice",
                });
            }
            let kind = Kind::of(field.data_type()).ok_or_else(|| DecodeError::UnsupportedType {
                field: name.clone(),
                data_type: field.data_type().clone(),
            })?;
            let plain_name = !name.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20);
            fields.push(FieldSpec {
                name: name.clone(),
                plain_name,
                lead: if plain_name {
                    json::Lead::new(name)
                } else {
                    json::Lead::default()
                },
                sql: kind.sql_name(),
                kind,
            });
        }
        let mut out_fields: Vec<Field> = schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        let permissive = options.policy == MalformedPolicy::Permissive;
        if permissive {
            out_fields.push(Field::new(CORRUPT_RECORD_COLUMN, DataType::Utf8, true));
        }
        let output_schema = Arc::new(Schema::new_with_metadata(
            out_fields,
            schema.metadata().clone(),
        ));
        Ok(Self::with_fields(output_schema, options, fields))
    }

    /// A decoder of the same schema and options with buffers of its own, to decode other
    /// files on another thread.
    pub fn fork(&self) -> Self {
        Self {
            #[cfg(test)]
            line_by_line: self.line_by_line,
            ..Self::with_fields(
                Arc::clone(&self.output_schema),
                self.options.clone(),
                self.fields.clone(),
            )
        }
    }

    fn with_fields(
        output_schema: SchemaRef,
        options: DecoderOptions,
        fields: Vec<FieldSpec>,
    ) -> Self {
        let capacity = options.batch_size.min(INITIAL_CAPACITY);
        let columns = fields
            .iter()
            .map(|f| Column::new(f.kind.clone(), capacity))
            .collect();
        let permissive = options.policy == MalformedPolicy::Permissive;
        let corrupt = permissive.then(|| Column::new(Kind::Utf8, capacity));
        let row = RowState {
            out: Rows::new(columns),
            ..RowState::default()
        };
        Self {
            output_schema,
            options,
            fields,
            corrupt,
            corrupt_nulls: 0,
            row,
            batch_bytes: 0,
            #[cfg(test)]
            line_by_line: false,
        }
    }

    /// The schema of the output batches: the input schema (all fields nullable), plus a
    /// nullable Utf8 `_corrupt_record` column last under [`MalformedPolicy::Permissive`].
    pub fn output_schema(&self) -> &SchemaRef {
        &self.output_schema
    }

    /// Decodes the whole content of one file, appending batches and counts to `out`.
    ///
    /// `input` holds complete lines (a last line without `\n` is fine); `origin` names the
    /// file in errors and dead letters. Lines are split on `\n`, a trailing `\r` is removed,
    /// blank (whitespace-only) lines are skipped and not counted but still numbered.
    ///
    /// A batch is cut after `batch_size` rows, before a line that would take its lines past
    /// 256 MB, and before the first line that starts at or after each multiple of
    /// [`PART_BYTES`] of the file. That last cut depends on the bytes alone, so
    /// [`Decoder::parts`] finds it without parsing, and a file decoded in parts on several
    /// threads gives the same batches as one thread (a replay on another machine then gives
    /// a plugin the same calls).
    ///
    /// # Errors
    ///
    /// [`DecodeError::Malformed`] (under [`MalformedPolicy::Fail`]) naming `origin:line` and
    /// the reason, [`DecodeError::LineTooLong`], [`DecodeError::Arrow`]. On error `out` is
    /// left unchanged and the decoder is ready for the next file.
    pub fn decode(
        &mut self,
        input: &[u8],
        origin: &str,
        out: &mut Decoded,
    ) -> Result<(), DecodeError> {
        let pieces = self.decode_piece(self.start_pieces(), input, origin)?;
        self.finish_pieces(pieces, origin, out)
    }

    /// Starts decoding a file a piece at a time, as it is read: the pieces, in order, are the
    /// file, and the batches, counts, line numbers and errors are those [`Decoder::decode`]
    /// gives for the whole file. A piece that stays in the core's cache from the read to the
    /// scanner costs less than the whole file in one buffer (see `source/files.rs`).
    pub fn start_pieces(&self) -> Pieces {
        Pieces {
            cursor: Cursor::at(0, self.csv_header()),
            decoded: Decoded::default(),
        }
    }

    /// Decodes `piece`, the file's next bytes: whole lines, each ending in `\n`, except that
    /// the file's last piece may end without one. Rows may stay buffered for the next piece.
    ///
    /// # Errors
    /// As [`Decoder::decode`]; the file's rows so far are dropped with `pieces`, and the
    /// decoder is ready for the next file.
    pub fn decode_piece(
        &mut self,
        mut pieces: Pieces,
        piece: &[u8],
        origin: &str,
    ) -> Result<Pieces, DecodeError> {
        match self.decode_lines(piece, &mut pieces.cursor, origin, &mut pieces.decoded) {
            Ok(()) => Ok(pieces),
            Err(e) => {
                self.abandon();
                Err(e)
            }
        }
    }

    /// Ends a file decoded in pieces: its last rows are cut into a batch, and all it gave is
    /// appended to `out`.
    ///
    /// # Errors
    /// As [`Decoder::decode`] (`out` unchanged).
    pub fn finish_pieces(
        &mut self,
        mut pieces: Pieces,
        origin: &str,
        out: &mut Decoded,
    ) -> Result<(), DecodeError> {
        self.flush(origin, &mut pieces.decoded)
            .inspect_err(|_| self.abandon())?;
        out.append(pieces.decoded);
        Ok(())
    }

    /// Drops a file decoded in pieces that will not be finished (its reading failed): the
    /// rows it left buffered go with it.
    pub fn cancel_pieces(&mut self, pieces: Pieces) {
        drop(pieces);
        self.abandon();
    }

    /// Drops the rows buffered of a file that failed, so that the next file starts clean.
    fn abandon(&mut self) {
        self.row.out.clear();
        self.corrupt_nulls = 0;
        if let Some(c) = &mut self.corrupt {
            c.truncate(0);
        }
        self.batch_bytes = 0;
    }

    /// Whether each file starts with a CSV header line.
    fn csv_header(&self) -> bool {
        matches!(&self.options.format, Format::Csv(o) if o.header)
    }

    /// Splits a file where [`Decoder::decode`] cuts it by position (see there): parts of
    /// about [`PART_BYTES`], for [`Decoder::decode_part`] to decode on threads of their own.
    /// It reads one line end per part (and the lines up to a CSV header).
    pub fn parts(&self, input: &[u8]) -> Vec<Part> {
        let header = self.csv_header();
        // No cut before the header: the decoder would cut there with no row taken yet.
        let mut min_cut = 0;
        if header {
            let mut pos = 0;
            while pos < input.len() {
                let end = find_newline(&input[pos..]).map_or(input.len(), |k| pos + k);
                let blank = is_blank(&input[pos..end]);
                pos = end + 1;
                if !blank {
                    break;
                }
            }
            min_cut = pos;
        }
        let mut parts = Vec::new();
        let mut start = 0;
        let mut next = PART_BYTES;
        while next < input.len() {
            // The first line start at or after `next`: just past the first `\n` at or after
            // `next - 1`.
            let Some(k) = find_newline(&input[next - 1..]) else {
                break;
            };
            let cut = next + k;
            if cut >= input.len() {
                break;
            }
            if cut >= min_cut {
                parts.push(Part {
                    range: start..cut,
                    header: start == 0 && header,
                });
                start = cut;
            }
            next = (cut / PART_BYTES + 1) * PART_BYTES;
        }
        parts.push(Part {
            range: start..input.len(),
            header: start == 0 && header,
        });
        parts
    }

    /// Decodes `part` of the file `input` (see [`Decoder::parts`]), appending to `out` as
    /// [`Decoder::decode`] does for a whole file, with the file's line numbers.
    ///
    /// # Errors
    /// As [`Decoder::decode`].
    pub fn decode_part(
        &mut self,
        input: &[u8],
        part: &Part,
        origin: &str,
        out: &mut Decoded,
    ) -> Result<(), DecodeError> {
        let mut local = Decoded::default();
        // Line numbers are counted from the part's start, and moved by the lines before it
        // only when some are reported (counting them costs a pass over those bytes).
        let lines_before = || count_lines(&input[..part.range.start]);
        let mut cursor = Cursor::at(part.range.start, part.header);
        let decoded = self
            .decode_lines(&input[part.range.clone()], &mut cursor, origin, &mut local)
            .and_then(|()| self.flush(origin, &mut local));
        match decoded {
            Ok(()) => {
                if part.range.start > 0 && !local.malformed.is_empty() {
                    let before = lines_before();
                    for record in &mut local.malformed {
                        record.line += before;
                    }
                }
                out.append(local);
                Ok(())
            }
            Err(mut e) => {
                self.abandon();
                if let DecodeError::Malformed { line, .. } | DecodeError::LineTooLong { line, .. } =
                    &mut e
                    && part.range.start > 0
                {
                    *line += lines_before();
                }
                Err(e)
            }
        }
    }

    /// The line loop: decodes `input`, whole lines of a file at `cursor`, and moves the cursor
    /// past them. The rows of the last lines stay buffered (the caller flushes).
    fn decode_lines(
        &mut self,
        input: &[u8],
        cursor: &mut Cursor,
        origin: &str,
        out: &mut Decoded,
    ) -> Result<(), DecodeError> {
        // One validation pass over the whole input; per-line checks only if it fails. (It
        // starts at a line start, never inside a UTF-8 sequence.)
        let file_utf8 = input.is_ascii() || std::str::from_utf8(input).is_ok();
        let start = cursor.offset;
        let mut skip_header = cursor.skip_header;
        let mut pos = 0;
        let mut line_no = cursor.lines;
        let mut next_cut = cursor.next_cut;
        #[cfg(test)]
        let line_by_line = self.line_by_line;
        #[cfg(not(test))]
        let line_by_line = false;
        let json_in_one_pass =
            file_utf8 && self.options.format == Format::JsonLines && !line_by_line;
        while pos < input.len() {
            if start + pos >= next_cut {
                self.flush(origin, out)?;
                next_cut = ((start + pos) / PART_BYTES + 1) * PART_BYTES;
            }
            // The usual line, a well-formed JSON object, is parsed to its newline in one pass,
            // without a search for the newline first. Any other outcome (a syntax or field
            // error, a line longer than `ONE_PASS_BYTES` or past the batch's bytes) takes the
            // row back and decodes the line below, as if this had not been tried.
            if json_in_one_pass && input[pos] == b'{' && !skip_header {
                self.row.reset();
                let rest = &input[pos..input.len().min(pos + ONE_PASS_BYTES)];
                let scanned = json::scan_record(&self.fields, &mut self.row, rest);
                if let Some(len) = scanned
                    && (pos + len == input.len() || input[pos + len] == b'\n')
                    && self.row.error.is_none()
                {
                    let line = match &rest[..len] {
                        [line @ .., b'\r'] => line,
                        line => line,
                    };
                    if self.batch_bytes + line.len() <= MAX_BATCH_BYTES {
                        pos += len + 1;
                        line_no += 1;
                        out.num_input_rows += 1;
                        self.batch_bytes += line.len();
                        self.commit(line, false, true);
                        self.end_row(origin, out)?;
                        continue;
                    }
                }
                self.row.out.discard_row();
            }
            let end = find_newline(&input[pos..]).map_or(input.len(), |k| pos + k);
            let mut line = &input[pos..end];
            pos = end + 1;
            line_no += 1;
            if let [rest @ .., b'\r'] = line {
                line = rest;
            }
            if is_blank(line) {
                continue;
            }
            if skip_header {
                skip_header = false;
                continue;
            }
            out.num_input_rows += 1;
            if line.len() > MAX_LINE_BYTES {
                return Err(DecodeError::LineTooLong {
                    origin: origin.to_owned(),
                    line: line_no,
                    len: line.len(),
                    max: MAX_LINE_BYTES,
                });
            }
            if self.batch_bytes + line.len() > MAX_BATCH_BYTES {
                self.flush(origin, out)?;
            }
            self.batch_bytes += line.len();

            self.row.reset();
            let utf8_ok = file_utf8 || std::str::from_utf8(line).is_ok();
            let parsed = match &self.options.format {
                Format::JsonLines => json::parse_line(&self.fields, &mut self.row, line, utf8_ok),
                Format::Csv(o) => csv::parse_line(&self.fields, &mut self.row, line, utf8_ok, o),
            };
            let (reason, whole_line) = match parsed {
                Err(syntax) => (syntax, true),
                Ok(()) => match self.row.error.take() {
                    None if utf8_ok => {
                        self.commit(line, false, true);
                        self.end_row(origin, out)?;
                        continue;
                    }
                    None => ("invalid UTF-8".to_owned(), false),
                    Some(field_error) => (field_error, false),
                },
            };
            out.num_malformed += 1;
            // The line's fields are in the columns already: a line left out, or nulled
            // whole, takes them back.
            if whole_line || self.options.policy != MalformedPolicy::Permissive {
                self.row.out.discard_row();
            }
            match self.options.policy {
                MalformedPolicy::Permissive => {
                    self.commit(line, true, utf8_ok);
                    self.end_row(origin, out)?;
                }
                MalformedPolicy::Drop => {}
                MalformedPolicy::Fail => {
                    return Err(DecodeError::Malformed {
                        origin: origin.to_owned(),
                        line: line_no,
                        reason,
                    });
                }
                MalformedPolicy::DeadLetter => out.malformed.push(MalformedRecord {
                    origin: origin.to_owned(),
                    line: line_no,
                    raw: String::from_utf8_lossy(line).into_owned(),
                    error: reason,
                }),
            }
        }
        // (After an error the file is dropped, and its cursor with it.)
        cursor.offset += input.len();
        cursor.lines = line_no;
        cursor.next_cut = next_cut;
        cursor.skip_header = skip_header;
        Ok(())
    }

    /// Completes the row being written (fields it lacks are null); `corrupt` puts the raw
    /// line into `_corrupt_record`.
    #[inline]
    fn commit(&mut self, line: &[u8], corrupt: bool, utf8_ok: bool) {
        self.row.out.end_row();
        if let Some(c) = &mut self.corrupt {
            if !corrupt {
                self.corrupt_nulls += 1;
                return;
            }
            c.push_nulls(std::mem::take(&mut self.corrupt_nulls));
            if utf8_ok {
                c.push_str(line);
            } else {
                c.push_str(String::from_utf8_lossy(line).as_bytes());
            }
        }
    }

    #[inline]
    fn end_row(&mut self, origin: &str, out: &mut Decoded) -> Result<(), DecodeError> {
        if self.row.out.len() >= self.options.batch_size {
            self.flush(origin, out)?;
        }
        Ok(())
    }

    /// Cuts the rows buffered so far into a batch.
    fn flush(&mut self, origin: &str, out: &mut Decoded) -> Result<(), DecodeError> {
        self.batch_bytes = 0;
        let rows = self.row.out.len();
        if rows == 0 {
            return Ok(());
        }
        let arrow = |source| DecodeError::Arrow {
            origin: origin.to_owned(),
            source,
        };
        let arrays = self.row.out.finish();
        let corrupt = self.corrupt.as_mut().map(|c| {
            c.push_nulls(std::mem::take(&mut self.corrupt_nulls));
            c.finish()
        });
        let mut arrays = arrays.map_err(arrow)?;
        if let Some(corrupt) = corrupt {
            arrays.push(corrupt.map_err(arrow)?);
        }
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        let batch = RecordBatch::try_new_with_options(self.output_schema.clone(), arrays, &options)
            .map_err(arrow)?;
        out.batches.push(batch);
        Ok(())
    }
}

/// The eight bytes at `i` as a little-endian word (the caller checks `i + 8 <= s.len()`).
#[inline(always)]
fn load8(s: &[u8], i: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&s[i..i + 8]);
    u64::from_le_bytes(word)
}

/// How many `\n` `bytes` holds.
fn count_lines(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| b == b'\n').count() as u64
}

/// Whether a line holds only spaces, tabs and carriage returns.
#[inline]
fn is_blank(line: &[u8]) -> bool {
    line.iter().all(|&b| matches!(b, b' ' | b'\t' | b'\r'))
}

/// Position of the first `\n`: `memchr`'s vector search (32 bytes a step with AVX2), where an
/// eight-byte word loop took half of the line loop's time on lines of 150 bytes.
#[inline]
fn find_newline(s: &[u8]) -> Option<usize> {
    memchr::memchr(b'\n', s)
}

#[cfg(test)]
mod tests;
