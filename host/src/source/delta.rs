//! A Delta Lake table as a stream, like Spark's Delta source: each batch takes the data files
//! that new table versions add, in version order (and in log order within a version), at most
//! `max_files_per_trigger` of them. The source is append-only: a version that removes data
//! (a DELETE, an overwrite, a complete-mode sink) cannot be expressed as new rows, so it stops
//! the query with an error naming the version.
//!
//! Why it reads `_delta_log/<version>.json` itself: the Delta protocol makes each commit file
//! the exact list of what a version changed, which is what a stream needs; deltalake (without
//! datafusion) offers snapshots, not per-version changes. Data files are read with the
//! `parquet` crate and the partition columns, which Delta keeps in the log rather than in the
//! files, are rebuilt from each file's `partitionValues`.
//!
//! Paths come from two logs, the table's and the checkpoint's source log; both are checked
//! before a file is opened: an `add` path that is absolute or leaves the table folder is refused
//! ([`DeltaSourceError::Corrupt`] naming the commit file, or [`CheckpointError::Corrupt`]
//! naming the source log entry), so the source never reads outside the table.
//!
//! # Offsets
//! Where the source stands is a position `(version, index)`: the next file to take is file
//! `index` (counting the data-changing `add` actions of that commit, from 0) of table version
//! `version`. The source log entry of batch N records the files it takes and the position after
//! them, so a replay reads exactly the same files, and a restart continues from the position
//! of the last planned batch. Without `starting_version` the first batch takes the whole table
//! as of its latest version (the files of its snapshot), then the versions after it.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray, new_null_array};
use arrow_schema::{Schema, SchemaRef};
use deltalake::kernel::StructType;
use deltalake::kernel::engine::arrow_conversion::TryIntoArrow;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checkpoint::MAX_BATCH_ID;
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::sink::delta::table_file;

/// Rows per batch read from a data file.
const READ_BATCH_ROWS: usize = 65_536;

/// A Delta source (or the table reader) failed; each variant names the table.
#[derive(Debug, thiserror::Error)]
pub enum DeltaSourceError {
    #[error("delta table {}: {} : cannot {op}: {source}", table.display(), file.display())]
    Io {
        table: PathBuf,
        file: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    #[error("delta table {}: version {version}: {message}", table.display())]
    Log {
        table: PathBuf,
        version: u64,
        message: String,
    },
    #[error("delta table {}: no table here (no _delta_log/00000000000000000000.json)", table.display())]
    NotATable { table: PathBuf },
    #[error(
        "delta table {}: version {version} removes data ({operation}, file {file}); a delta \
         source reads append-only tables: start a new query (new checkpoint) with \
         starting_version after {version}",
        table.display()
    )]
    DataChanged {
        table: PathBuf,
        version: u64,
        operation: String,
        file: String,
    },
    #[error("delta table {}: {} : cannot read Parquet: {source}", table.display(), file.display())]
    Parquet {
        table: PathBuf,
        file: PathBuf,
        source: parquet::errors::ParquetError,
    },
    #[error("delta table {}: {} : {message}", table.display(), file.display())]
    Data {
        table: PathBuf,
        file: PathBuf,
        message: String,
    },
    #[error(
        "source {source_name}: batch {batch_id} has no entry in the source log; the checkpoint is damaged"
    )]
    MissingLog { source_name: String, batch_id: u64 },
    /// The table's log says something no Delta writer writes, such as a data file outside the
    /// table; nothing is read.
    #[error("delta table {}: {} : {reason}; the table's log is damaged, refusing to read it", table.display(), file.display())]
    Corrupt {
        table: PathBuf,
        /// The commit file.
        file: PathBuf,
        reason: String,
    },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl DeltaSourceError {
    /// Whether reading again may succeed: only I/O (object store, disk) may pass.
    /// Every variant is listed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Io { .. } => true,
            Self::Log { .. }
            | Self::NotATable { .. }
            | Self::DataChanged { .. }
            | Self::Parquet { .. }
            | Self::Data { .. }
            | Self::MissingLog { .. }
            | Self::Corrupt { .. }
            | Self::Checkpoint(_) => false,
        }
    }
}

/// One data file a batch reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaFile {
    /// The table version that added it.
    pub version: u64,
    /// Its index among that version's data-changing `add` actions.
    pub index: u64,
    /// Path relative to the table, as in the log (%-escaped).
    pub path: String,
    pub size: i64,
    #[serde(default)]
    pub partition_values: BTreeMap<String, Option<String>>,
    /// Taken from the snapshot of `version` (the first batches without `starting_version`),
    /// `index` counting the snapshot's files.
    #[serde(default)]
    pub snapshot: bool,
}

/// Where the source stands: the next file is file `index` of table version `version`, or,
/// with `snapshot`, file `index` of the snapshot of the table as of `version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub version: u64,
    pub index: u64,
    #[serde(default)]
    pub snapshot: bool,
}

/// The source log entry of one batch (`sources/<i>/<N>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaLogEntry {
    pub files: Vec<DeltaFile>,
    /// Where the next batch starts; `None` while nothing was ever taken.
    pub next: Option<Position>,
}

impl DeltaLogEntry {
    /// Refuses an entry naming a file outside the table or a version no Delta table has
    /// (versions are `i64`); `entry` is the log file, named in the error.
    fn check(&self, table: &Path, entry: &Path) -> Result<(), CheckpointError> {
        for file in &self.files {
            if let Err(why) = table_file(table, &file.path) {
                return Err(CheckpointError::corrupt(
                    entry,
                    format!(
                        "data file path {:?} {why}; a source log names files inside the table {} only",
                        file.path,
                        table.display()
                    ),
                ));
            }
        }
        let versions = self
            .files
            .iter()
            .map(|f| (f.version, f.index))
            .chain(self.next.map(|p| (p.version, p.index)));
        for (version, index) in versions {
            if version > MAX_BATCH_ID || index > MAX_BATCH_ID {
                return Err(CheckpointError::corrupt(
                    entry,
                    format!(
                        "table version {version} (file index {index}) is above the largest a \
                         Delta table has ({MAX_BATCH_ID})"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What one commit file says, as far as a stream cares.
#[derive(Debug, Default)]
struct Commit {
    adds: Vec<DeltaFile>,
    /// The first data-changing remove, if any.
    remove: Option<String>,
    operation: String,
    metadata: Option<(StructType, Vec<String>)>,
}

fn log_file(table: &Path, version: u64) -> PathBuf {
    table.join("_delta_log").join(format!("{version:020}.json"))
}

/// Reads commit `version`; `None` when it does not exist (yet).
fn read_commit(table: &Path, version: u64) -> Result<Option<Commit>, DeltaSourceError> {
    let file = log_file(table, version);
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(DeltaSourceError::Io {
                table: table.to_path_buf(),
                file,
                op: "read",
                source,
            });
        }
    };
    let bad = |message: String| DeltaSourceError::Log {
        table: table.to_path_buf(),
        version,
        message,
    };
    let mut commit = Commit::default();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let action: Value = serde_json::from_str(line)
            .map_err(|e| bad(format!("line {}: not JSON: {e}", i + 1)))?;
        if let Some(add) = action.get("add") {
            if add.get("dataChange").and_then(Value::as_bool) == Some(false) {
                continue;
            }
            let path = add["path"]
                .as_str()
                .ok_or_else(|| bad(format!("line {}: add without a path", i + 1)))?;
            if let Err(why) = table_file(table, path) {
                return Err(DeltaSourceError::Corrupt {
                    table: table.to_path_buf(),
                    file,
                    reason: format!("line {}: add path {path:?} {why}", i + 1),
                });
            }
            let partition_values = match add.get("partitionValues") {
                Some(v) if !v.is_null() => serde_json::from_value(v.clone())
                    .map_err(|e| bad(format!("line {}: partitionValues: {e}", i + 1)))?,
                _ => BTreeMap::new(),
            };
            commit.adds.push(DeltaFile {
                version,
                index: commit.adds.len() as u64,
                path: path.to_owned(),
                size: add["size"].as_i64().unwrap_or(0),
                partition_values,
                snapshot: false,
            });
        } else if let Some(remove) = action.get("remove") {
            if remove.get("dataChange").and_then(Value::as_bool) != Some(false)
                && commit.remove.is_none()
            {
                commit.remove = Some(remove["path"].as_str().unwrap_or("?").to_owned());
            }
        } else if let Some(info) = action.get("commitInfo") {
            commit.operation = info["operation"].as_str().unwrap_or("?").to_owned();
        } else if let Some(meta) = action.get("metaData") {
            let schema: StructType = meta["schemaString"]
                .as_str()
                .ok_or_else(|| bad("metaData without schemaString".into()))
                .and_then(|s| {
                    serde_json::from_str(s).map_err(|e| bad(format!("schemaString: {e}")))
                })?;
            let partitions: Vec<String> = serde_json::from_value(meta["partitionColumns"].clone())
                .map_err(|e| bad(format!("partitionColumns: {e}")))?;
            commit.metadata = Some((schema, partitions));
        }
    }
    Ok(Some(commit))
}

/// The table's latest version, its schema (as Arrow) and partition columns, and the files of
/// its latest snapshot, by replaying the log from version 0.
#[derive(Debug)]
struct Snapshot {
    version: u64,
    schema: SchemaRef,
    partition_columns: Vec<String>,
    files: Vec<DeltaFile>,
}

fn snapshot(table: &Path, at: Option<u64>) -> Result<Snapshot, DeltaSourceError> {
    let mut files: Vec<DeltaFile> = Vec::new();
    let mut meta: Option<(StructType, Vec<String>)> = None;
    let mut version = 0;
    let mut latest = None;
    while at.is_none_or(|at| version <= at)
        && let Some(commit) = read_commit(table, version)?
    {
        if commit.remove.is_some() {
            // Replay the removes precisely: read the file again for all of them.
            let removed = removed_paths(table, version)?;
            files.retain(|f| !removed.contains(&f.path));
        }
        files.extend(commit.adds);
        if commit.metadata.is_some() {
            meta = commit.metadata;
        }
        latest = Some(version);
        version += 1;
    }
    let (Some(version), Some((schema, partition_columns))) = (latest, meta) else {
        return Err(DeltaSourceError::NotATable {
            table: table.to_path_buf(),
        });
    };
    for (i, f) in files.iter_mut().enumerate() {
        f.version = version;
        f.index = i as u64;
        f.snapshot = true;
    }
    Ok(Snapshot {
        version,
        schema: arrow_schema(table, version, &schema)?,
        partition_columns,
        files,
    })
}

fn removed_paths(table: &Path, version: u64) -> Result<Vec<String>, DeltaSourceError> {
    let file = log_file(table, version);
    let text = std::fs::read_to_string(&file).map_err(|source| DeltaSourceError::Io {
        table: table.to_path_buf(),
        file,
        op: "read",
        source,
    })?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|a| a.get("remove")?.get("path")?.as_str().map(str::to_owned))
        .collect())
}

fn arrow_schema(
    table: &Path,
    version: u64,
    schema: &StructType,
) -> Result<SchemaRef, DeltaSourceError> {
    let arrow: Schema = schema.try_into_arrow().map_err(|e| DeltaSourceError::Log {
        table: table.to_path_buf(),
        version,
        message: format!("the schema has no Arrow equivalent: {e}"),
    })?;
    Ok(Arc::new(arrow))
}

/// Reads one data file as batches of the table schema (partition columns rebuilt).
fn read_file(
    table: &Path,
    schema: &SchemaRef,
    partition_columns: &[String],
    file: &DeltaFile,
    out: &mut Vec<RecordBatch>,
) -> Result<u64, DeltaSourceError> {
    // Checked where the path was read (the table's log, the source log); checked again here,
    // right before the file is opened.
    let path = table_file(table, &file.path).map_err(|why| DeltaSourceError::Corrupt {
        table: table.to_path_buf(),
        file: log_file(table, file.version),
        reason: format!("add path {:?} {why}", file.path),
    })?;
    let handle = std::fs::File::open(&path).map_err(|source| DeltaSourceError::Io {
        table: table.to_path_buf(),
        file: path.clone(),
        op: "open",
        source,
    })?;
    let parquet = |source| DeltaSourceError::Parquet {
        table: table.to_path_buf(),
        file: path.clone(),
        source,
    };
    let data = |message: String| DeltaSourceError::Data {
        table: table.to_path_buf(),
        file: path.clone(),
        message,
    };
    let reader = ParquetRecordBatchReaderBuilder::try_new(handle)
        .map_err(parquet)?
        .with_batch_size(READ_BATCH_ROWS)
        .build()
        .map_err(parquet)?;
    let mut rows = 0;
    for batch in reader {
        let batch = batch.map_err(|e| data(format!("cannot decode: {e}")))?;
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
        for field in schema.fields() {
            let column = if partition_columns.contains(field.name()) {
                let value = file.partition_values.get(field.name()).cloned().flatten();
                match value {
                    None => new_null_array(field.data_type(), batch.num_rows()),
                    Some(v) => {
                        let strings: ArrayRef =
                            Arc::new(StringArray::from(vec![v.as_str(); batch.num_rows()]));
                        arrow_cast::cast(&strings, field.data_type()).map_err(|e| {
                            data(format!("partition value {v:?} of {}: {e}", field.name()))
                        })?
                    }
                }
            } else {
                let column = batch
                    .column_by_name(field.name())
                    .ok_or_else(|| data(format!("the file has no column {:?}", field.name())))?;
                if column.data_type() == field.data_type() {
                    Arc::clone(column)
                } else {
                    arrow_cast::cast(column, field.data_type())
                        .map_err(|e| data(format!("column {}: {e}", field.name())))?
                }
            };
            columns.push(column);
        }
        let batch = RecordBatch::try_new(Arc::clone(schema), columns)
            .map_err(|e| data(format!("cannot assemble a batch: {e}")))?;
        rows += batch.num_rows() as u64;
        out.push(batch);
    }
    Ok(rows)
}

/// The whole table as of its latest version: its schema and rows. The tests' own reader, and
/// what a batch query over the table would see.
///
/// # Errors
/// When the log or a data file cannot be read.
pub fn read_table(table: &Path) -> Result<(SchemaRef, Vec<RecordBatch>), DeltaSourceError> {
    let at = TableVersion::list(table, None)?;
    let rows = at.read(table)?;
    Ok((at.snap.schema, rows))
}

/// The newest version of the table at `table` and its schema, without reading its data.
///
/// # Errors
/// When the log cannot be read or holds no table.
pub fn table_schema(table: &Path) -> Result<(u64, SchemaRef), DeltaSourceError> {
    let at = TableVersion::list(table, None)?;
    Ok((at.version(), at.snap.schema))
}

/// One version of a table, its log read and its data files listed but not read: what the
/// static side of a join decides on (the version, its size) before reading anything.
#[derive(Debug)]
pub struct TableVersion {
    snap: Snapshot,
}

impl TableVersion {
    /// The table at `table` as of `version` (its newest without one).
    ///
    /// # Errors
    /// When the log cannot be read or holds no table.
    pub fn list(table: &Path, version: Option<u64>) -> Result<Self, DeltaSourceError> {
        Ok(Self {
            snap: snapshot(table, version)?,
        })
    }

    /// The version listed.
    pub fn version(&self) -> u64 {
        self.snap.version
    }

    /// The table's schema at that version.
    pub fn schema(&self) -> &SchemaRef {
        &self.snap.schema
    }

    /// How many data files, and their bytes as the log records them.
    pub fn files_and_bytes(&self) -> (u64, u64) {
        let bytes = self
            .snap
            .files
            .iter()
            .map(|f| u64::try_from(f.size).unwrap_or(0))
            .sum();
        (
            u64::try_from(self.snap.files.len()).unwrap_or(u64::MAX),
            bytes,
        )
    }

    /// Reads every row of the version.
    ///
    /// # Errors
    /// When a data file cannot be read.
    pub fn read(&self, table: &Path) -> Result<Vec<RecordBatch>, DeltaSourceError> {
        let mut out = Vec::new();
        for file in &self.snap.files {
            read_file(
                table,
                &self.snap.schema,
                &self.snap.partition_columns,
                file,
                &mut out,
            )?;
        }
        Ok(out)
    }
}

/// The newest version of the table at `table` by the names of its log's commit files (nothing
/// is parsed), `None` when it has none.
///
/// # Errors
/// When the log folder cannot be listed.
pub fn latest_version(table: &Path) -> Result<Option<u64>, DeltaSourceError> {
    let log = table.join("_delta_log");
    let entries = match std::fs::read_dir(&log) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(DeltaSourceError::Io {
                table: table.to_path_buf(),
                file: log,
                op: "list",
                source,
            });
        }
    };
    let mut latest = None;
    for entry in entries {
        let entry = entry.map_err(|source| DeltaSourceError::Io {
            table: table.to_path_buf(),
            file: log.clone(),
            op: "list",
            source,
        })?;
        let name = entry.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
            continue;
        };
        if stem.len() == 20
            && let Ok(v) = stem.parse::<u64>()
        {
            latest = latest.max(Some(v));
        }
    }
    Ok(latest)
}

/// A Delta table read as a stream of appended rows.
#[derive(Debug)]
pub struct DeltaSource {
    name: String,
    index: usize,
    table: PathBuf,
    max_files: Option<NonZeroUsize>,
    schema: SchemaRef,
    partition_columns: Vec<String>,
    /// The position after the last planned batch; `None`: nothing taken yet.
    position: Option<Position>,
    starting_version: Option<u64>,
}

impl DeltaSource {
    /// Opens the source: the schema from the table's latest version, the position from the
    /// source log (entries past `last_planned` are dropped, as in the files source).
    ///
    /// # Errors
    /// When the table or the source log cannot be read.
    pub fn open(
        name: String,
        index: usize,
        table: PathBuf,
        max_files: Option<NonZeroUsize>,
        starting_version: Option<u64>,
        checkpoint: &Checkpoint,
        last_planned: Option<u64>,
    ) -> Result<Self, DeltaSourceError> {
        let snap = snapshot(&table, None)?;
        let log = checkpoint.source_log(index);
        let mut position = None;
        for id in log.ids()? {
            if last_planned.is_none_or(|last| id > last) {
                log.remove(id)?;
                continue;
            }
            let entry: Option<DeltaLogEntry> = log.get(id)?;
            if let Some(entry) = entry {
                entry.check(&table, &log.entry_path(id))?;
                if let Some(next) = entry.next {
                    position = Some(next);
                }
            }
        }
        Ok(Self {
            name,
            index,
            table,
            max_files,
            schema: snap.schema,
            partition_columns: snap.partition_columns,
            position,
            starting_version,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Spark's `sources[].description`.
    pub fn description(&self) -> String {
        format!("DeltaSource[{}]", self.table.display())
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The files not yet planned, in the order batches take them.
    ///
    /// # Errors
    /// When the log cannot be read, or a new version removes data.
    pub fn list_new(&self) -> Result<Vec<DeltaFile>, DeltaSourceError> {
        let position = match (self.position, self.starting_version) {
            (Some(p), _) => p,
            (None, Some(version)) => Position {
                version,
                index: 0,
                snapshot: false,
            },
            (None, None) => Position {
                version: 0,
                index: 0,
                snapshot: true,
            },
        };
        let mut files = Vec::new();
        let mut version = position.version;
        if position.snapshot {
            // The snapshot as of the position's version, or the latest one at the first batch.
            let at = self.position.map(|p| p.version);
            let snap = match snapshot(&self.table, at) {
                Ok(s) => s,
                Err(DeltaSourceError::NotATable { .. }) if at.is_none() => return Ok(files),
                Err(e) => return Err(e),
            };
            files.extend(snap.files.into_iter().filter(|f| f.index >= position.index));
            version = snap.version + 1;
        }
        while let Some(commit) = read_commit(&self.table, version)? {
            self.check_append_only(version, &commit)?;
            let skip = if !position.snapshot && version == position.version {
                position.index
            } else {
                0
            };
            files.extend(commit.adds.into_iter().filter(|f| f.index >= skip));
            version += 1;
        }
        Ok(files)
    }

    fn check_append_only(&self, version: u64, commit: &Commit) -> Result<(), DeltaSourceError> {
        if let Some(file) = &commit.remove {
            return Err(DeltaSourceError::DataChanged {
                table: self.table.clone(),
                version,
                operation: commit.operation.clone(),
                file: file.clone(),
            });
        }
        Ok(())
    }

    /// Chooses the files of the next batch, honouring `max_files_per_trigger` unless `unlimited`.
    pub fn take(&self, candidates: &[DeltaFile], unlimited: bool) -> Vec<DeltaFile> {
        let n = match (unlimited, self.max_files) {
            (false, Some(max)) => max.get().min(candidates.len()),
            _ => candidates.len(),
        };
        candidates[..n].to_vec()
    }

    /// Records the files of batch `batch_id` and the position after them.
    ///
    /// # Errors
    /// When the log entry cannot be written.
    pub fn record(
        &mut self,
        checkpoint: &Checkpoint,
        batch_id: u64,
        files: &[DeltaFile],
    ) -> Result<(), DeltaSourceError> {
        let next = match files.last() {
            Some(f) => Some(Position {
                version: f.version,
                index: f.index + 1,
                snapshot: f.snapshot,
            }),
            None => self.position,
        };
        checkpoint.source_log(self.index).put(
            batch_id,
            &DeltaLogEntry {
                files: files.to_vec(),
                next,
            },
        )?;
        self.position = next;
        Ok(())
    }

    /// The files batch `batch_id` took, from the source log.
    ///
    /// # Errors
    /// When the entry is missing or unreadable, or names a file outside the table
    /// ([`CheckpointError::Corrupt`]).
    pub fn planned(
        &self,
        checkpoint: &Checkpoint,
        batch_id: u64,
    ) -> Result<Vec<DeltaFile>, DeltaSourceError> {
        let log = checkpoint.source_log(self.index);
        let entry: DeltaLogEntry =
            log.get(batch_id)?
                .ok_or_else(|| DeltaSourceError::MissingLog {
                    source_name: self.name.clone(),
                    batch_id,
                })?;
        entry.check(&self.table, &log.entry_path(batch_id))?;
        Ok(entry.files)
    }

    /// Reads the rows of `files`.
    ///
    /// # Errors
    /// When a data file cannot be read.
    pub fn read(&self, files: &[DeltaFile]) -> Result<(Vec<RecordBatch>, u64), DeltaSourceError> {
        let mut out = Vec::new();
        let mut rows = 0;
        for file in files {
            rows += read_file(
                &self.table,
                &self.schema,
                &self.partition_columns,
                file,
                &mut out,
            )?;
        }
        Ok((out, rows))
    }
}

/// The Delta source as one of a query's inputs ([`super::Source`]).
#[derive(Debug)]
pub struct DeltaInput {
    source: DeltaSource,
    /// What the next batch takes, chosen by `poll`.
    staged: Vec<DeltaFile>,
    /// Available-now: the files present when the trigger started, not yet taken.
    frozen: Option<Vec<DeltaFile>>,
}

impl DeltaInput {
    pub fn new(source: DeltaSource) -> Self {
        Self {
            source,
            staged: Vec::new(),
            frozen: None,
        }
    }
}

fn boxed(e: DeltaSourceError) -> super::SourceError {
    super::SourceError::Delta(Box::new(e))
}

impl super::Source for DeltaInput {
    fn name(&self) -> &str {
        self.source.name()
    }

    fn description(&self) -> String {
        self.source.description()
    }

    fn schema(&self) -> &SchemaRef {
        self.source.schema()
    }

    fn freeze_available(&mut self) -> Result<(), super::SourceError> {
        self.frozen = Some(self.source.list_new().map_err(boxed)?);
        Ok(())
    }

    fn poll(
        &mut self,
        _checkpoint: &Checkpoint,
        unlimited: bool,
    ) -> Result<u64, super::SourceError> {
        let candidates = match &self.frozen {
            Some(frozen) => frozen.clone(),
            None => self.source.list_new().map_err(boxed)?,
        };
        self.staged = self.source.take(&candidates, unlimited);
        Ok(self.staged.len() as u64)
    }

    fn record(
        &mut self,
        checkpoint: &Checkpoint,
        batch_id: u64,
    ) -> Result<super::Recorded, super::SourceError> {
        let files = std::mem::take(&mut self.staged);
        self.source
            .record(checkpoint, batch_id, &files)
            .map_err(boxed)?;
        if let Some(frozen) = &mut self.frozen {
            frozen.drain(..files.len().min(frozen.len()));
        }
        Ok(super::Recorded::new())
    }

    fn read(
        &mut self,
        checkpoint: &Checkpoint,
        batch_id: u64,
        _recorded: &super::Recorded,
    ) -> Result<super::SourceBatch, super::SourceError> {
        let files = self.source.planned(checkpoint, batch_id).map_err(boxed)?;
        let (batches, rows) = self.source.read(&files).map_err(boxed)?;
        let mut metrics = BTreeMap::new();
        metrics.insert("numFiles", files.len().to_string());
        let offset = |f: Option<&DeltaFile>| {
            f.map(|f| serde_json::json!({ "reservoirVersion": f.version, "index": f.index }))
        };
        let end =
            offset(files.last()).unwrap_or_else(|| serde_json::json!({ "logOffset": batch_id }));
        Ok(super::SourceBatch {
            decoded: crate::decode::Decoded {
                batches,
                num_input_rows: rows,
                ..crate::decode::Decoded::default()
            },
            start_offset: offset(files.first()),
            latest_offset: end.clone(),
            end_offset: end,
            metrics,
        })
    }

    fn dead_letter_dir(&self) -> Option<&Path> {
        None
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use arrow_array::Int64Array;
    use arrow_schema::{DataType, Field};

    use super::*;
    use crate::plugin::BatchInfo;
    use crate::sink::delta::{DeltaSink, DeltaSinkOptions, WriteMode};

    /// Writes batch `batch_id` of ids into the Delta table `dir/table` (the join's tests too).
    pub(crate) fn write(dir: &Path, query: &str, mode: WriteMode, batch_id: u64, ids: &[i64]) {
        let mut sink = DeltaSink::new(DeltaSinkOptions {
            spec: crate::spec::DeltaSinkSpec {
                path: dir.join("table"),
                partition_by: Vec::new(),
                target_file_size: 128 << 20,
                commit_every: crate::spec::CommitEvery::Batches(std::num::NonZeroU64::MIN),
            },
            query_id: query.into(),
            mode,
            pending_dir: dir.join("pending"),
            failpoint: None,
        })
        .unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from(ids.to_vec()))],
        )
        .unwrap();
        let info = BatchInfo {
            query_id: query.into(),
            batch_id,
            attempt: 0,
            timestamp_micros: 0,
            partition: 0,
        };
        sink.write(&info, &schema, &[batch]).unwrap();
    }

    fn rows(source: &DeltaSource, files: &[DeltaFile]) -> Vec<i64> {
        let (batches, _) = source.read(files).unwrap();
        batches
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect()
    }

    #[test]
    fn snapshot_first_then_new_versions_with_the_position_in_the_log() {
        let dir = tempfile::tempdir().unwrap();
        for (n, ids) in [&[1, 2][..], &[3], &[4, 5]].iter().enumerate() {
            write(dir.path(), "up", WriteMode::Append, n as u64, ids);
        }
        let checkpoint = Checkpoint::open(&dir.path().join("cp")).unwrap();
        let open = |last| {
            DeltaSource::open(
                "t".into(),
                0,
                dir.path().join("table"),
                NonZeroUsize::new(2),
                None,
                &checkpoint,
                last,
            )
            .unwrap()
        };
        let mut source = open(None);
        let all = source.list_new().unwrap();
        assert_eq!(all.len(), 3);
        assert!(all.iter().all(|f| f.snapshot && f.version == 3));
        let first = source.take(&all, false);
        assert_eq!(first.len(), 2);
        source.record(&checkpoint, 0, &first).unwrap();
        assert_eq!(
            rows(&source, &source.planned(&checkpoint, 0).unwrap()),
            vec![1, 2, 3]
        );

        write(dir.path(), "up", WriteMode::Append, 3, &[6]);
        let next = source.list_new().unwrap();
        assert_eq!(
            next.iter()
                .map(|f| (f.version, f.index, f.snapshot))
                .collect::<Vec<_>>(),
            vec![(3, 2, true), (4, 0, false)]
        );
        source.record(&checkpoint, 1, &next).unwrap();
        assert_eq!(rows(&source, &next), vec![4, 5, 6]);

        // A restart finds the position in the source log: nothing new.
        let source = open(Some(1));
        assert!(source.list_new().unwrap().is_empty());
        // A version that removes data stops the stream, naming it.
        write(dir.path(), "other", WriteMode::Complete, 0, &[9]);
        let err = source.list_new().unwrap_err().to_string();
        assert!(
            err.contains("version 5 removes data (STREAMING UPDATE"),
            "{err}"
        );
    }

    #[test]
    fn add_paths_outside_the_table_are_corrupt_and_not_read() {
        for hostile in [
            "../x.parquet",
            "/etc/x",
            "file:///etc/x",
            "%2e%2e/x.parquet",
        ] {
            let dir = tempfile::tempdir().unwrap();
            write(dir.path(), "up", WriteMode::Append, 0, &[1]);
            let table = dir.path().join("table");
            let checkpoint = Checkpoint::open(&dir.path().join("cp")).unwrap();
            let open =
                || DeltaSource::open("t".into(), 0, table.clone(), None, None, &checkpoint, None);
            let source = open().unwrap();
            let commit = log_file(&table, 2);
            std::fs::write(
                &commit,
                format!(
                    "{{\"add\":{{\"path\":{hostile:?},\"partitionValues\":{{}},\"size\":1,\
                     \"modificationTime\":0,\"dataChange\":true}}}}\n"
                ),
            )
            .unwrap();
            for err in [source.list_new().unwrap_err(), open().unwrap_err()] {
                let DeltaSourceError::Corrupt { file, reason, .. } = &err else {
                    panic!("{hostile}: expected Corrupt, got {err:?}");
                };
                assert_eq!(file, &commit);
                assert!(
                    reason.starts_with(&format!("line 1: add path {hostile:?} ")),
                    "{reason}"
                );
                assert!(err.to_string().contains("refusing to read it"), "{err}");
            }
        }
    }

    #[test]
    fn a_source_log_naming_files_outside_the_table_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "up", WriteMode::Append, 0, &[1]);
        let table = dir.path().join("table");
        let checkpoint = Checkpoint::open(&dir.path().join("cp")).unwrap();
        let open =
            |last| DeltaSource::open("t".into(), 0, table.clone(), None, None, &checkpoint, last);
        let mut source = open(None).unwrap();
        let files = source.list_new().unwrap();
        source.record(&checkpoint, 0, &files).unwrap();
        assert_eq!(
            rows(&source, &source.planned(&checkpoint, 0).unwrap()),
            vec![1]
        );
        let log = checkpoint.source_log(0);
        let entry_file = log.entry_path(0);
        let original: DeltaLogEntry = log.get(0).unwrap().unwrap();
        let outside = dir.path().join("outside.parquet");
        std::fs::copy(table.join(&files[0].path), &outside).unwrap();
        for (path, version, reason) in [
            (
                "../outside.parquet",
                0,
                "data file path \"../outside.parquet\" leaves the table",
            ),
            (outside.to_str().unwrap(), 0, "is absolute"),
            (
                "part.parquet",
                u64::MAX,
                "table version 18446744073709551615",
            ),
        ] {
            let mut entry = original.clone();
            entry.files[0].path = path.to_owned();
            entry.files[0].version = version;
            std::fs::remove_file(&entry_file).unwrap();
            log.put(0, &entry).unwrap();
            let err = source.planned(&checkpoint, 0).unwrap_err();
            let DeltaSourceError::Checkpoint(CheckpointError::Corrupt { file, reason: why }) = &err
            else {
                panic!("{path}: expected Corrupt, got {err:?}");
            };
            assert_eq!(file, &entry_file);
            assert!(why.contains(reason), "{why}");
            let err = open(Some(0)).unwrap_err();
            assert!(
                matches!(&err, DeltaSourceError::Checkpoint(CheckpointError::Corrupt { file, .. }) if file == &entry_file),
                "{err:?}"
            );
        }
        // Reading a file that bypassed the checks (e.g. a future caller) is refused as well.
        let mut hostile = original.files[0].clone();
        hostile.path = "../outside.parquet".into();
        let err = source.read(&[hostile]).unwrap_err();
        assert!(matches!(err, DeltaSourceError::Corrupt { .. }), "{err:?}");
    }

    #[test]
    fn starting_version_skips_earlier_versions() {
        let dir = tempfile::tempdir().unwrap();
        for (n, ids) in [&[1][..], &[2], &[3]].iter().enumerate() {
            write(dir.path(), "up", WriteMode::Append, n as u64, ids);
        }
        let checkpoint = Checkpoint::open(&dir.path().join("cp")).unwrap();
        let source = DeltaSource::open(
            "t".into(),
            0,
            dir.path().join("table"),
            None,
            Some(2),
            &checkpoint,
            None,
        )
        .unwrap();
        let files = source.list_new().unwrap();
        assert_eq!(rows(&source, &files), vec![2, 3]);
    }
}
