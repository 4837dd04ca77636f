//! The static side of a join (`[[table]]`): which snapshot of it a batch joins against, and
//! reading that snapshot whole into memory.
//!
//! Looking costs little and reading costs a lot, so the two are apart: planning a batch records
//! what the table is ([`TableSnapshot`]: a Delta table's version; a folder's listing, sizes and
//! modification times, hashed) in `offsets/N`, and the join reads the table again only when the
//! recorded snapshot is not the one it holds. A replayed batch joins the Delta version it was
//! planned with (Delta keeps old versions); a files table has no old versions, so a replay whose
//! files changed since joins the current ones and says so in the log.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::decode::{self, Decoded, Decoder, DecoderOptions, MalformedPolicy, ParquetDecoder};

/// Rows per batch read (the table becomes one batch once read).
const BATCH_ROWS: usize = 65_536;
use crate::spec::{InputFormat, TableKind, TableSpec};

/// A static table that cannot be looked at or read.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("table {table}: {} : cannot {op}: {source}", path.display())]
    Io {
        table: String,
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    #[error("table {table}: {source}")]
    Delta {
        table: String,
        source: Box<crate::source::delta::DeltaSourceError>,
    },
    #[error("table {table}: {} : {message}", path.display())]
    Read {
        table: String,
        path: PathBuf,
        message: String,
    },
    #[error(
        "table {table} is {size} bytes {what}, over its max_size of {limit} bytes: raise `max_size` of [[table]] {table} or make the table smaller"
    )]
    TooLarge {
        table: String,
        what: &'static str,
        size: u64,
        limit: u64,
    },
    #[error("table {table}: {message}")]
    Schema { table: String, message: String },
}

impl TableError {
    /// Whether reading again may succeed: files being written or replaced, a Delta commit in
    /// progress. A table too large, or of the wrong columns, stays so.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Io { .. } | Self::Delta { .. } | Self::Read { .. } => true,
            Self::TooLarge { .. } | Self::Schema { .. } => false,
        }
    }
}

/// Which state of a table a batch joins against, as `offsets/N` records it. The state is its
/// name with its Delta version or its files' listing ([`Self::same_state`]); `files` and
/// `bytes` describe it (a Delta version's are known once its log is read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TableSnapshot {
    /// The `[[table]]`'s name.
    pub name: String,
    /// A Delta table's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// A files table's listing: the SHA-256 of its files' names, sizes and modification times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listing: Option<String>,
    /// How many files, and their bytes on disk.
    pub files: u64,
    pub bytes: u64,
}

impl TableSnapshot {
    /// Whether `other` is the same state of the same table (what is joined), whatever either
    /// says of its size.
    pub fn same_state(&self, other: &Self) -> bool {
        self.name == other.name && self.version == other.version && self.listing == other.listing
    }
}

/// A `[[table]]` of the query.
#[derive(Debug)]
pub struct StaticTable {
    spec: TableSpec,
    schema: SchemaRef,
}

/// One file of a files table.
struct Listed {
    path: PathBuf,
}

impl StaticTable {
    /// Opens `spec`: its schema is the declared one, or for Parquet without one the first file's,
    /// or a Delta table's own.
    ///
    /// # Errors
    /// When the schema cannot be found (no file yet, no Delta table), or has a type Weir's
    /// batches do not carry.
    pub fn open(spec: TableSpec) -> Result<Self, TableError> {
        let schema = match &spec.kind {
            TableKind::Files {
                schema: Some(schema),
                ..
            } => Arc::clone(schema),
            TableKind::Files { path, .. } => {
                let (files, _) = list(&spec.name, path)?;
                let first = files.first().ok_or_else(|| TableError::Schema {
                    table: spec.name.clone(),
                    message: format!(
                        "{} holds no Parquet file to take the schema from: give `schema`",
                        path.display()
                    ),
                })?;
                let file = open(&spec.name, &first.path)?;
                let origin = first.path.display().to_string();
                let decoder = ParquetDecoder::infer(file, &origin, BATCH_ROWS).map_err(|e| {
                    TableError::Read {
                        table: spec.name.clone(),
                        path: first.path.clone(),
                        message: e.to_string(),
                    }
                })?;
                Arc::clone(decoder.output_schema())
            }
            TableKind::Delta { path } => {
                let (_, schema) =
                    crate::source::delta::table_schema(path).map_err(|e| TableError::Delta {
                        table: spec.name.clone(),
                        source: Box::new(e),
                    })?;
                weir_schema(&spec.name, &schema)?
            }
        };
        Ok(Self { spec, schema })
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The columns of its rows.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// What the table is now: its Delta version, or its files' listing.
    ///
    /// # Errors
    /// When the folder or the Delta log cannot be listed.
    pub fn current_snapshot(&self) -> Result<TableSnapshot, TableError> {
        match &self.spec.kind {
            TableKind::Files { path, .. } => Ok(list(&self.spec.name, path)?.1),
            TableKind::Delta { path } => {
                let version =
                    crate::source::delta::latest_version(path).map_err(|e| TableError::Delta {
                        table: self.spec.name.clone(),
                        source: Box::new(e),
                    })?;
                Ok(TableSnapshot {
                    name: self.spec.name.clone(),
                    version,
                    listing: None,
                    files: 0,
                    bytes: 0,
                })
            }
        }
    }

    /// Reads the table as `wanted` recorded it (a files table: as it is now, see the module
    /// docs), into one batch of [`Self::schema`]; returns the snapshot it read.
    ///
    /// # Errors
    /// When it cannot be read, is over `max_size` on disk or in memory, or its rows do not fit
    /// the schema.
    pub fn read(&self, wanted: &TableSnapshot) -> Result<(TableSnapshot, RecordBatch), TableError> {
        let name = &self.spec.name;
        let limit = self.spec.max_bytes;
        let too_large = |what, size| TableError::TooLarge {
            table: name.clone(),
            what,
            size,
            limit,
        };
        let (snapshot, batches) = match &self.spec.kind {
            TableKind::Files { path, format, .. } => {
                let (files, now) = list(name, path)?;
                if now.listing != wanted.listing {
                    tracing::warn!(
                        table = %name,
                        "the files of table {name} changed since the batch was planned: it joins the current files"
                    );
                }
                if now.bytes > limit {
                    return Err(too_large("on disk", now.bytes));
                }
                let mut batches = Vec::new();
                let mut malformed = 0;
                for file in &files {
                    malformed += read_file(name, &file.path, *format, &self.schema, &mut batches)?;
                }
                if malformed > 0 {
                    tracing::warn!(table = %name, malformed, "table {name}: {malformed} malformed lines left out");
                }
                (now, batches)
            }
            TableKind::Delta { path } => {
                let delta = |e| TableError::Delta {
                    table: name.clone(),
                    source: Box::new(e),
                };
                let at = crate::source::delta::TableVersion::list(path, wanted.version)
                    .map_err(delta)?;
                let (files, bytes) = at.files_and_bytes();
                // The log says the size: a table too large is refused before it is read.
                if bytes > limit {
                    return Err(too_large("on disk", bytes));
                }
                let version = at.version();
                if weir_schema(name, at.schema())?.fields() != self.schema.fields() {
                    return Err(TableError::Schema {
                        table: name.clone(),
                        message: format!(
                            "version {version} has other columns than the query was started with: restart the query"
                        ),
                    });
                }
                let batches = at
                    .read(path)
                    .map_err(delta)?
                    .iter()
                    .map(|b| conform(name, path, b, &self.schema))
                    .collect::<Result<Vec<_>, _>>()?;
                let snapshot = TableSnapshot {
                    name: name.clone(),
                    version: Some(version),
                    listing: None,
                    files,
                    bytes,
                };
                (snapshot, batches)
            }
        };
        let rows = arrow_select::concat::concat_batches(&self.schema, &batches).map_err(|e| {
            TableError::Schema {
                table: name.clone(),
                message: format!("cannot put its rows together: {e}"),
            }
        })?;
        let in_memory = u64::try_from(rows.get_array_memory_size()).unwrap_or(u64::MAX);
        if in_memory > limit {
            return Err(too_large("in memory", in_memory));
        }
        Ok((snapshot, rows))
    }
}

/// The files of a files table (a file, or a folder's files but hidden and `_`-prefixed ones, in
/// name order) and its snapshot.
fn list(table: &str, path: &Path) -> Result<(Vec<Listed>, TableSnapshot), TableError> {
    let io = |path: &Path, op, source| TableError::Io {
        table: table.to_owned(),
        path: path.to_path_buf(),
        op,
        source,
    };
    let meta = std::fs::metadata(path).map_err(|e| io(path, "look at", e))?;
    let mut paths = Vec::new();
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).map_err(|e| io(path, "list", e))? {
            let entry = entry.map_err(|e| io(path, "list", e))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || name.starts_with('_') {
                continue;
            }
            if entry
                .file_type()
                .map_err(|e| io(&entry.path(), "look at", e))?
                .is_file()
            {
                paths.push(entry.path());
            }
        }
        paths.sort();
    } else {
        paths.push(path.to_path_buf());
    }
    let mut hash = Sha256::new();
    let mut files = Vec::with_capacity(paths.len());
    let mut bytes = 0u64;
    for p in paths {
        let m = std::fs::metadata(&p).map_err(|e| io(&p, "look at", e))?;
        let modified = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        hash.update(p.to_string_lossy().as_bytes());
        hash.update([0]);
        hash.update(m.len().to_le_bytes());
        hash.update(modified.to_le_bytes());
        bytes = bytes.saturating_add(m.len());
        files.push(Listed { path: p });
    }
    let snapshot = TableSnapshot {
        name: table.to_owned(),
        version: None,
        listing: Some(hex::encode(hash.finalize())),
        files: u64::try_from(files.len()).unwrap_or(u64::MAX),
        bytes,
    };
    Ok((files, snapshot))
}

/// Appends the rows of one file to `out`; returns how many lines were malformed (left out).
fn read_file(
    table: &str,
    path: &Path,
    format: InputFormat,
    schema: &SchemaRef,
    out: &mut Vec<RecordBatch>,
) -> Result<u64, TableError> {
    let read_err = |message: String| TableError::Read {
        table: table.to_owned(),
        path: path.to_path_buf(),
        message,
    };
    let text_format = match format {
        InputFormat::Json => decode::Format::JsonLines,
        InputFormat::Csv { header, delimiter } => decode::Format::Csv(decode::CsvOptions {
            header,
            delimiter,
            quote: b'"',
        }),
        InputFormat::Parquet => {
            let decoder = ParquetDecoder::new(Arc::clone(schema), BATCH_ROWS)
                .map_err(|e| read_err(e.to_string()))?;
            let mut decoded = Decoded::default();
            decoder
                .decode(
                    open(table, path)?,
                    &path.display().to_string(),
                    &mut decoded,
                )
                .map_err(|e| read_err(e.to_string()))?;
            out.extend(decoded.batches);
            return Ok(0);
        }
    };
    let bytes = std::fs::read(path).map_err(|source| TableError::Io {
        table: table.to_owned(),
        path: path.to_path_buf(),
        op: "read",
        source,
    })?;
    let mut decoder = Decoder::new(
        Arc::clone(schema),
        DecoderOptions {
            format: text_format,
            policy: MalformedPolicy::Drop,
            ..DecoderOptions::default()
        },
    )
    .map_err(|e| read_err(e.to_string()))?;
    let mut decoded = Decoded::default();
    decoder
        .decode(&bytes, &path.display().to_string(), &mut decoded)
        .map_err(|e| read_err(e.to_string()))?;
    out.extend(decoded.batches);
    Ok(decoded.num_malformed)
}

fn open(table: &str, path: &Path) -> Result<std::fs::File, TableError> {
    std::fs::File::open(path).map_err(|source| TableError::Io {
        table: table.to_owned(),
        path: path.to_path_buf(),
        op: "open",
        source,
    })
}

/// `schema` with the types Weir's batches carry ([`decode::weir_type`]), every field nullable.
fn weir_schema(table: &str, schema: &SchemaRef) -> Result<SchemaRef, TableError> {
    let fields = schema
        .fields()
        .iter()
        .map(|f| {
            let t = decode::weir_type(f.data_type()).ok_or_else(|| TableError::Schema {
                table: table.to_owned(),
                message: format!(
                    "column {} is {}, a type Weir's batches do not carry",
                    f.name(),
                    f.data_type()
                ),
            })?;
            Ok(arrow_schema::Field::new(f.name(), t, true))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(arrow_schema::Schema::new(fields)))
}

/// `batch`'s columns by name, cast to `schema`'s types (a missing column is all nulls).
fn conform(
    table: &str,
    path: &Path,
    batch: &RecordBatch,
    schema: &SchemaRef,
) -> Result<RecordBatch, TableError> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
            Some(c) if c.data_type() == f.data_type() => Ok(Arc::clone(c)),
            Some(c) => arrow_cast::cast(c, f.data_type()).map_err(|e| TableError::Read {
                table: table.to_owned(),
                path: path.to_path_buf(),
                message: format!("column {}: {e}", f.name()),
            }),
            None => Ok(arrow_array::new_null_array(f.data_type(), batch.num_rows())),
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &arrow_array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )
    .map_err(|e| TableError::Read {
        table: table.to_owned(),
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}
