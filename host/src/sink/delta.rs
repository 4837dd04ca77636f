//! The Delta Lake sink: each micro-batch (or each group of `commit_every` batches) becomes one
//! commit of a Delta table that any Delta reader opens.
//!
//! Why it is exactly-once: a Delta commit is atomic (one `_delta_log/N.json` file, created only if
//! absent), and ours carries a `txn` action `{appId: <query id>, version: <batch id>}` next to
//! its `add` (and, in complete mode, `remove`) actions, exactly as Spark's Delta sink does. The
//! table therefore remembers the last batch it holds. A batch replayed after a crash (its
//! `offsets/N` is in the checkpoint, its `commits/N` is not) whose id is not above the table's
//! txn version is already in the table and is skipped; otherwise it is written again. The
//! commitInfo says `STREAMING UPDATE` with Spark's `outputMode`, `queryId` and `epochId`.
//!
//! # Committing every N batches or every T (`commit_every`)
//!
//! Fewer commits mean fewer, larger files, but the query writes `commits/N` after every batch,
//! and a batch with `commits/N` is never replayed: its rows must be durable before
//! [`Sink::write_batch`](super::Sink::write_batch) returns, even when the Delta commit waits. So:
//!
//! 1. a batch that does not commit writes its Parquet files into the table folder (readers do
//!    not see them: no log entry names them) and then, atomically, the list of their `add`
//!    actions to `<checkpoint>/sinks/delta/pending/<batch id>.json`;
//! 2. the batch that commits puts the `add` actions of every pending batch and its own into one
//!    Delta commit whose txn version is its own id (the highest), then deletes the pending lists;
//! 3. on a replay of batch N: if the txn version is ≥ N the batch is skipped (and pending lists
//!    up to the txn version, left by a crash between 2's commit and its clean-up, are dropped);
//!    if a pending list for N exists (a crash after step 1 but before `commits/N`), its files
//!    are deleted and the batch is written again; lists below N stay and are committed later.
//! 4. when the query stops (the end of an available-now run, a stop signal), pending batches are
//!    committed with the txn version of the last of them, so a finished run leaves nothing
//!    behind.
//!
//! A pending list is read back from the checkpoint, so it is checked like any checkpoint file:
//! an `add` path that is absolute or leaves the table folder, or a batch id above
//! [`MAX_BATCH_ID`], is refused as [`CheckpointError::Corrupt`] naming the list before anything
//! is deleted or committed.
//!
//! A list is written only for batches whose data is not committed in the same call, so the
//! usual `commit_every = 1` costs no extra fsync. A crash between writing files and committing
//! them leaves unreferenced Parquet files in the table folder: invisible to readers, removed by
//! Delta's `VACUUM`. Complete mode rewrites the whole table every batch (the commit removes
//! every current file), so it always commits every batch.
//!
//! deltalake is async; the sink drives it on its own current-thread Tokio runtime, so the rest
//! of the host stays synchronous and no global runtime exists.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::kernel::{Action, Add, StructType, Transaction};
use deltalake::protocol::{DeltaOperation, OutputMode as DeltaOutputMode};
use deltalake::writer::{DeltaWriter, RecordBatchWriter};
use deltalake::{DeltaTable, DeltaTableError};
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::checkpoint::{CheckpointError, MAX_BATCH_ID};
use crate::failpoint::{Failpoint, Phase};
use crate::plugin::BatchInfo;
use crate::spec::{CommitEvery, DeltaSinkSpec};

/// How the sink writes each batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Each batch adds its rows.
    Append,
    /// Each batch is the whole table: its commit removes every earlier file.
    Complete,
}

/// Settings of a [`DeltaSink`].
#[derive(Debug, Clone)]
pub struct DeltaSinkOptions {
    /// The pipeline file's `[sink]`: the table's folder (created with the table on the first
    /// batch when absent), its partition columns, the size Parquet files are cut at, and when
    /// the sink commits (`commit_every`).
    pub spec: DeltaSinkSpec,
    /// The query id: the txn action's appId.
    pub query_id: String,
    pub mode: WriteMode,
    /// Where lists of written but not yet committed files are kept (in the checkpoint).
    pub pending_dir: PathBuf,
    pub failpoint: Option<Failpoint>,
}

/// The Delta sink failed; each variant names the table.
#[derive(Debug, thiserror::Error)]
pub enum DeltaSinkError {
    #[error("delta sink {}: cannot start its async runtime: {source}", table.display())]
    Runtime {
        table: PathBuf,
        source: std::io::Error,
    },
    #[error("delta sink {}, batch {batch_id}: cannot {op}: {source}", table.display())]
    Delta {
        table: PathBuf,
        batch_id: u64,
        op: &'static str,
        /// Boxed: deltalake's error is large.
        source: Box<DeltaTableError>,
    },
    #[error("delta sink {}: partition column {column:?} is not a column of the query's output ({columns})", table.display())]
    PartitionColumn {
        table: PathBuf,
        column: String,
        columns: String,
    },
    #[error("delta sink {}: the table is partitioned by [{existing}], but the sink says partition_by = [{wanted}]", table.display())]
    PartitionMismatch {
        table: PathBuf,
        existing: String,
        wanted: String,
    },
    #[error("delta sink {}: {} : cannot {op}: {source}", table.display(), file.display())]
    Io {
        table: PathBuf,
        file: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("delta sink {}: pending list {} is damaged: {source}", table.display(), file.display())]
    Pending {
        table: PathBuf,
        file: PathBuf,
        source: serde_json::Error,
    },
}

impl DeltaSinkError {
    /// Whether writing the batch again may succeed (I/O and commit conflicts may pass).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Delta { source, .. } => !matches!(
                **source,
                DeltaTableError::SchemaMismatch { .. } | DeltaTableError::Arrow { .. }
            ),
            Self::Checkpoint(e) => e.is_retryable(),
            Self::Io { .. } => true,
            Self::Runtime { .. }
            | Self::PartitionColumn { .. }
            | Self::PartitionMismatch { .. }
            | Self::Pending { .. } => false,
        }
    }
}

/// What one call of [`DeltaSink::write`] did, for tests and progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The batch was already in the table (txn version ≥ batch id): nothing written.
    Skipped,
    /// Files written and listed as pending; committed by a later batch.
    Pending,
    /// Committed as this table version.
    Committed(u64),
}

/// Writes micro-batches into a Delta table, one commit per batch (or per `commit_every`).
pub struct DeltaSink {
    options: DeltaSinkOptions,
    runtime: tokio::runtime::Runtime,
    table: Option<DeltaTable>,
    /// Batches written but not committed, with their files, by batch id.
    pending: BTreeMap<u64, Vec<Add>>,
    last_commit: Instant,
    description: String,
}

impl std::fmt::Debug for DeltaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeltaSink")
            .field("path", &self.options.spec.path)
            .field("pending", &self.pending.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl DeltaSink {
    /// A sink into the table at `options.spec.path`; the pending lists of an earlier run are read.
    ///
    /// # Errors
    /// When the runtime cannot start or a pending list cannot be read.
    pub fn new(options: DeltaSinkOptions) -> Result<Self, DeltaSinkError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| DeltaSinkError::Runtime {
                table: options.spec.path.clone(),
                source,
            })?;
        let pending = read_pending(&options.spec.path, &options.pending_dir)?;
        let description = format!("DeltaSink[{}]", options.spec.path.display());
        Ok(Self {
            options,
            runtime,
            table: None,
            pending,
            last_commit: Instant::now(),
            description,
        })
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    fn delta_error(
        &self,
        batch_id: u64,
        op: &'static str,
    ) -> impl Fn(DeltaTableError) -> DeltaSinkError + use<> {
        let table = self.options.spec.path.clone();
        move |source| DeltaSinkError::Delta {
            table: table.clone(),
            batch_id,
            op,
            source: Box::new(source),
        }
    }

    /// Opens (or creates from `schema`) the table on first use.
    fn ensure_table(&mut self, batch_id: u64, schema: &SchemaRef) -> Result<(), DeltaSinkError> {
        if self.table.is_none() {
            let table = self.open_or_create(batch_id, schema)?;
            self.table = Some(table);
        }
        Ok(())
    }

    fn open_or_create(
        &self,
        batch_id: u64,
        schema: &SchemaRef,
    ) -> Result<DeltaTable, DeltaSinkError> {
        let path = &self.options.spec.path;
        let err = self.delta_error(batch_id, "open the table");
        let url = deltalake::ensure_table_uri(path.to_string_lossy()).map_err(&err)?;
        let table = self
            .runtime
            .block_on(DeltaTable::try_from_url(url))
            .map_err(&err)?;
        let wanted = self.options.spec.partition_by.join(", ");
        if table.version().is_some() {
            let existing = table
                .snapshot()
                .map_err(&err)?
                .metadata()
                .partition_columns()
                .join(", ");
            if existing != wanted {
                return Err(DeltaSinkError::PartitionMismatch {
                    table: path.clone(),
                    existing,
                    wanted,
                });
            }
            return Ok(table);
        }
        for column in &self.options.spec.partition_by {
            if schema.field_with_name(column).is_err() {
                let columns: Vec<&str> =
                    schema.fields().iter().map(|f| f.name().as_str()).collect();
                return Err(DeltaSinkError::PartitionColumn {
                    table: path.clone(),
                    column: column.clone(),
                    columns: columns.join(", "),
                });
            }
        }
        let create = self.delta_error(batch_id, "create the table from the query's schema");
        let arrow = delta_schema(schema);
        let kernel: StructType = (&arrow).try_into_kernel().map_err(|e| create(e.into()))?;
        let name = path
            .file_name()
            .map_or_else(|| "table".to_owned(), |n| n.to_string_lossy().into_owned());
        self.runtime
            .block_on(
                table
                    .create()
                    .with_table_name(name)
                    .with_columns(kernel.fields().cloned())
                    .with_partition_columns(self.options.spec.partition_by.clone())
                    .into_future(),
            )
            .map_err(&create)
    }

    /// The last batch id the table holds for this query (the txn version), if any.
    ///
    /// # Errors
    /// When the table cannot be read.
    pub fn committed_batch(
        &mut self,
        batch_id: u64,
        schema: &SchemaRef,
    ) -> Result<Option<u64>, DeltaSinkError> {
        let app_id = self.options.query_id.clone();
        let err = self.delta_error(batch_id, "read the table's txn version");
        self.ensure_table(batch_id, schema)?;
        let table = self
            .table
            .as_ref()
            .ok_or_else(|| unreachable_table(&self.options.spec.path, batch_id))?;
        let log_store = table.log_store();
        let snapshot = table.snapshot().map_err(&err)?;
        let version = self
            .runtime
            .block_on(snapshot.transaction_version(log_store.as_ref(), app_id))
            .map_err(&err)?;
        Ok(version.and_then(|v| u64::try_from(v).ok()))
    }

    /// Writes batch `info.batch_id` (which may be a replay).
    ///
    /// # Errors
    /// When the table cannot be created, written or committed; nothing is committed then.
    pub fn write(
        &mut self,
        info: &BatchInfo,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<Written, DeltaSinkError> {
        let n = info.batch_id;
        let committed = self.committed_batch(n, schema)?;
        if let Some(c) = committed {
            // Lists of batches the table already holds: left by a crash after a commit.
            let done: Vec<u64> = self.pending.range(..=c).map(|(id, _)| *id).collect();
            for id in done {
                self.pending.remove(&id);
                remove_file(
                    &self.options.spec.path,
                    &pending_file(&self.options.pending_dir, id),
                )?;
            }
            if c >= n {
                tracing::info!(table = %self.options.spec.path.display(), batch_id = n, txn_version = c, "batch {n} is already in the Delta table: skipped");
                return Ok(Written::Skipped);
            }
        }
        if let Some(stale) = self.pending.remove(&n) {
            // A replay of a batch whose files were written but whose commits/N was not.
            let list = pending_file(&self.options.pending_dir, n);
            for add in &stale {
                // Checked when the list was read; checked again right before deleting.
                let file = table_file(&self.options.spec.path, &add.path).map_err(|why| {
                    CheckpointError::corrupt(&list, format!("add path {:?} {why}", add.path))
                })?;
                remove_file(&self.options.spec.path, &file)?;
            }
            remove_file(&self.options.spec.path, &list)?;
        }
        let adds = self.write_files(n, schema, batches)?;
        let due = match (self.options.mode, self.options.spec.commit_every) {
            (WriteMode::Complete, _) => true,
            (WriteMode::Append, CommitEvery::Batches(every)) => {
                self.pending.len() as u64 + 1 >= every.get()
            }
            (WriteMode::Append, CommitEvery::Interval(every)) => {
                self.last_commit.elapsed() >= every
            }
        };
        if !due {
            write_pending(&self.options.spec.path, &self.options.pending_dir, n, &adds)?;
            self.pending.insert(n, adds);
            return Ok(Written::Pending);
        }
        Failpoint::check(self.options.failpoint.as_ref(), Phase::InSink, n);
        let version = self.commit(n, adds)?;
        Ok(Written::Committed(version))
    }

    /// Commits what is pending, if anything (the query is stopping).
    ///
    /// # Errors
    /// When the commit fails; the lists stay for the next run.
    pub fn flush(&mut self) -> Result<Option<u64>, DeltaSinkError> {
        let Some((&last, _)) = self.pending.last_key_value() else {
            return Ok(None);
        };
        let Some(adds) = self.pending.remove(&last) else {
            return Ok(None);
        };
        remove_file(
            &self.options.spec.path,
            &pending_file(&self.options.pending_dir, last),
        )?;
        self.commit(last, adds).map(Some)
    }

    fn write_files(
        &mut self,
        n: u64,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<Vec<Add>, DeltaSinkError> {
        let err = self.delta_error(n, "write the batch's Parquet files");
        let target = self.options.spec.target_file_size;
        self.ensure_table(n, schema)?;
        let table = self
            .table
            .as_ref()
            .ok_or_else(|| unreachable_table(&self.options.spec.path, n))?;
        // deltalake's defaults (snappy), plus a dictionary only where it pays and integers
        // and strings without one as deltas (`encoding`).
        let properties = super::encoding::column_encodings(
            WriterProperties::builder()
                .set_compression(Compression::SNAPPY)
                .set_write_batch_size(super::encoding::WRITE_BATCH_VALUES),
            schema,
            batches,
        );
        let mut writer = RecordBatchWriter::for_table(table)
            .map_err(&err)?
            .with_target_file_size(target)
            .with_writer_properties(properties.build());
        self.runtime
            .block_on(async {
                let target = Arc::new(delta_schema(schema));
                for batch in batches.iter().filter(|b| b.num_rows() > 0) {
                    writer.write(relabel(batch, &target)?).await?;
                }
                writer.flush().await
            })
            .map_err(&err)
    }

    /// One Delta commit: the pending batches' files and `adds` (plus, in complete mode, the
    /// removal of every current file), with txn version `n`. Returns the table version.
    fn commit(&mut self, n: u64, adds: Vec<Add>) -> Result<u64, DeltaSinkError> {
        let err = self.delta_error(n, "commit to the table");
        let mode = self.options.mode;
        let query_id = self.options.query_id.clone();
        let pending = std::mem::take(&mut self.pending);
        let mut actions: Vec<Action> = Vec::new();
        let table = self
            .table
            .as_mut()
            .ok_or_else(|| unreachable_table(&self.options.spec.path, n))?;
        if mode == WriteMode::Complete {
            let snapshot = table.snapshot().map_err(&err)?;
            actions.extend(
                snapshot
                    .log_data()
                    .iter()
                    .map(|f| Action::Remove(f.remove_action(true))),
            );
        }
        actions.extend(pending.values().flatten().cloned().map(Action::Add));
        actions.extend(adds.into_iter().map(Action::Add));
        let epoch_id = i64::try_from(n).unwrap_or(i64::MAX);
        let operation = DeltaOperation::StreamingUpdate {
            output_mode: match mode {
                WriteMode::Append => DeltaOutputMode::Append,
                WriteMode::Complete => DeltaOutputMode::Complete,
            },
            query_id: query_id.clone(),
            epoch_id,
        };
        let properties = CommitProperties::default()
            .with_application_transaction(Transaction::new(&query_id, epoch_id));
        let snapshot = table.snapshot().map_err(&err)?;
        let log_store = table.log_store();
        let finalized = self.runtime.block_on(
            CommitBuilder::from(properties)
                .with_actions(actions)
                .build(Some(snapshot), log_store, operation)
                .into_future(),
        );
        let finalized = match finalized {
            Ok(f) => f,
            Err(e) => {
                self.pending = pending;
                return Err(err(e));
            }
        };
        let version = finalized.version();
        table.state = Some(finalized.snapshot());
        self.last_commit = Instant::now();
        for id in pending.keys() {
            remove_file(
                &self.options.spec.path,
                &pending_file(&self.options.pending_dir, *id),
            )?;
        }
        tracing::debug!(table = %self.options.spec.path.display(), batch_id = n, version, "delta commit");
        Ok(version)
    }
}

/// Delta's timestamp is microseconds in UTC, which Arrow spells with the zone "UTC"; Spark's
/// TIMESTAMP (here: any zone offset, such as "+00:00") is the same instant on the same scale.
pub(super) fn delta_schema(schema: &SchemaRef) -> arrow_schema::Schema {
    let fields: Vec<arrow_schema::Field> = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            arrow_schema::DataType::Timestamp(_, Some(_)) => {
                f.as_ref()
                    .clone()
                    .with_data_type(arrow_schema::DataType::Timestamp(
                        arrow_schema::TimeUnit::Microsecond,
                        Some("UTC".into()),
                    ))
            }
            _ => f.as_ref().clone(),
        })
        .collect();
    arrow_schema::Schema::new(fields)
}

/// `batch` with the schema `target` (same columns; timestamps relabelled to "UTC", a
/// metadata-only cast).
pub(super) fn relabel(
    batch: &RecordBatch,
    target: &SchemaRef,
) -> Result<RecordBatch, DeltaTableError> {
    if batch.schema().fields() == target.fields() {
        return Ok(batch.clone());
    }
    let columns = batch
        .columns()
        .iter()
        .zip(target.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(Arc::clone(c))
            } else {
                arrow_cast::cast(c, f.data_type())
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(Arc::clone(target), columns)?)
}

fn unreachable_table(path: &Path, batch_id: u64) -> DeltaSinkError {
    DeltaSinkError::Delta {
        table: path.to_path_buf(),
        batch_id,
        op: "use the table",
        source: Box::new(DeltaTableError::NotInitialized),
    }
}

fn pending_file(dir: &Path, batch_id: u64) -> PathBuf {
    dir.join(format!("{batch_id:020}.json"))
}

fn read_pending(table: &Path, dir: &Path) -> Result<BTreeMap<u64, Vec<Add>>, DeltaSinkError> {
    let io = |file: &Path, op, source| DeltaSinkError::Io {
        table: table.to_path_buf(),
        file: file.to_path_buf(),
        op,
        source,
    };
    let mut out = BTreeMap::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io(dir, "list the pending lists", e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io(dir, "list the pending lists", e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Only the names `pending_file` writes: another name would never be cleaned up.
        let Some(id) = name
            .strip_suffix(".json")
            .filter(|s| s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u64>().ok())
        else {
            continue;
        };
        let file = entry.path();
        if id > MAX_BATCH_ID {
            return Err(CheckpointError::corrupt(
                &file,
                format!("batch id {id} is above the largest batch id {MAX_BATCH_ID}"),
            )
            .into());
        }
        let text = std::fs::read(&file).map_err(|e| io(&file, "read", e))?;
        let adds: Vec<Add> =
            serde_json::from_slice(&text).map_err(|source| DeltaSinkError::Pending {
                table: table.to_path_buf(),
                file: file.clone(),
                source,
            })?;
        // The files of a pending batch are deleted on its replay and committed into the
        // table later: each must lie inside the table.
        for add in &adds {
            if let Err(why) = table_file(table, &add.path) {
                return Err(CheckpointError::corrupt(
                    &file,
                    format!(
                        "add path {:?} {why}; a pending list names files inside the table {} only",
                        add.path,
                        table.display()
                    ),
                )
                .into());
            }
        }
        out.insert(id, adds);
    }
    Ok(out)
}

fn write_pending(
    table: &Path,
    dir: &Path,
    batch_id: u64,
    adds: &[Add],
) -> Result<(), DeltaSinkError> {
    let file = pending_file(dir, batch_id);
    let json = serde_json::to_vec(adds).map_err(|source| DeltaSinkError::Pending {
        table: table.to_path_buf(),
        file: file.clone(),
        source,
    })?;
    crate::checkpoint::write_atomically(&file, &json)?;
    Ok(())
}

fn remove_file(table: &Path, file: &Path) -> Result<(), DeltaSinkError> {
    match std::fs::remove_file(file) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DeltaSinkError::Io {
            table: table.to_path_buf(),
            file: file.to_path_buf(),
            op: "remove",
            source,
        }),
    }
}

/// The data file that the `add` (or `remove`) path `raw` of a Delta log names inside `table`,
/// or why it is refused.
///
/// Delta allows absolute URIs here (shallow clones); Weir reads and deletes only inside the
/// table's own folder, so a path that is empty, an absolute URI (RFC 2396: a `:` in the first
/// segment), rooted, or climbs out with `..` (after undoing %-escapes) is refused: a log or a
/// pending list saying so is damaged or hostile.
///
/// # Errors
/// The reason, phrased to follow the path (`is absolute`).
pub(crate) fn table_file(table: &Path, raw: &str) -> Result<PathBuf, &'static str> {
    if raw
        .split('/')
        .next()
        .is_some_and(|first| first.contains(':'))
    {
        return Err("is an absolute URI");
    }
    let decoded = decode_path(raw);
    check_relative(&decoded)?;
    Ok(table.join(decoded))
}

/// Why `path` (already %-decoded) is not a path of a file inside a folder, if it is not.
pub(crate) fn check_relative(path: &str) -> Result<(), &'static str> {
    use std::path::Component;
    if path.is_empty() {
        return Err("is empty");
    }
    if path.contains('\0') {
        return Err("contains a NUL byte");
    }
    let mut normal = 0;
    for component in Path::new(path).components() {
        match component {
            Component::Normal(_) => normal += 1,
            Component::CurDir => {}
            Component::ParentDir => return Err("leaves the table folder (`..`)"),
            Component::RootDir | Component::Prefix(_) => return Err("is absolute"),
        }
    }
    if normal == 0 {
        return Err("names no file");
    }
    Ok(())
}

/// An `add` path is a URI path relative to the table (RFC 2396): undo its %-escapes.
pub(crate) fn decode_path(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = bytes.get(i + 1..i + 3)
            && let Ok(hex) = std::str::from_utf8(hex)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    fn batch(ids: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("kind", DataType::Utf8, true),
        ]));
        let kinds: Vec<&str> = ids
            .iter()
            .map(|i| if i % 2 == 0 { "even" } else { "odd" })
            .collect();
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(kinds)),
            ],
        )
        .unwrap()
    }

    fn info(batch_id: u64) -> BatchInfo {
        BatchInfo {
            query_id: "q".into(),
            batch_id,
            attempt: 0,
            timestamp_micros: 0,
            partition: 0,
        }
    }

    fn options(dir: &Path, mode: WriteMode, commit: CommitEvery) -> DeltaSinkOptions {
        DeltaSinkOptions {
            spec: DeltaSinkSpec {
                path: dir.join("table"),
                partition_by: Vec::new(),
                target_file_size: 128 << 20,
                commit_every: commit,
            },
            query_id: "query-1".into(),
            mode,
            pending_dir: dir.join("pending"),
            failpoint: None,
        }
    }

    fn ids(table: &Path) -> Vec<i64> {
        let (_, batches) = crate::source::delta::read_table(table).unwrap();
        let mut ids: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .iter()
                    .flatten()
                    .collect::<Vec<_>>()
            })
            .collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn one_commit_per_batch_and_a_replay_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = DeltaSink::new(options(
            dir.path(),
            WriteMode::Append,
            CommitEvery::Batches(std::num::NonZeroU64::MIN),
        ))
        .unwrap();
        let b = batch(&[1, 2, 3]);
        let schema = b.schema();
        assert_eq!(
            sink.write(&info(0), &schema, std::slice::from_ref(&b))
                .unwrap(),
            Written::Committed(1)
        );
        assert_eq!(
            sink.write(&info(1), &schema, &[batch(&[4])]).unwrap(),
            Written::Committed(2)
        );
        assert_eq!(sink.committed_batch(1, &schema).unwrap(), Some(1));
        // A new sink (a restart) replaying batch 1: already in the table.
        let mut again = DeltaSink::new(options(
            dir.path(),
            WriteMode::Append,
            CommitEvery::Batches(std::num::NonZeroU64::MIN),
        ))
        .unwrap();
        assert_eq!(
            again.write(&info(1), &schema, &[batch(&[4])]).unwrap(),
            Written::Skipped
        );
        assert_eq!(ids(&dir.path().join("table")), vec![1, 2, 3, 4]);
    }

    #[test]
    fn commit_every_keeps_written_batches_pending_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let policy = CommitEvery::Batches(std::num::NonZeroU64::new(3).unwrap());
        let mut sink = DeltaSink::new(options(dir.path(), WriteMode::Append, policy)).unwrap();
        let schema = batch(&[0]).schema();
        assert_eq!(
            sink.write(&info(0), &schema, &[batch(&[1])]).unwrap(),
            Written::Pending
        );
        assert_eq!(
            sink.write(&info(1), &schema, &[batch(&[2])]).unwrap(),
            Written::Pending
        );
        assert!(pending_file(&dir.path().join("pending"), 1).is_file());
        drop(sink);
        // Restart: batch 1 is replayed (its commits/1 was not written), then batch 2 commits all.
        let mut sink = DeltaSink::new(options(dir.path(), WriteMode::Append, policy)).unwrap();
        assert_eq!(
            sink.write(&info(1), &schema, &[batch(&[2])]).unwrap(),
            Written::Pending
        );
        assert_eq!(
            sink.write(&info(2), &schema, &[batch(&[3])]).unwrap(),
            Written::Committed(1)
        );
        assert_eq!(ids(&dir.path().join("table")), vec![1, 2, 3]);
        assert_eq!(
            std::fs::read_dir(dir.path().join("pending"))
                .unwrap()
                .count(),
            0
        );
        // Then a last pending batch, committed when the query stops.
        assert_eq!(
            sink.write(&info(3), &schema, &[batch(&[4])]).unwrap(),
            Written::Pending
        );
        assert_eq!(sink.flush().unwrap(), Some(2));
        assert_eq!(sink.committed_batch(3, &schema).unwrap(), Some(3));
        assert_eq!(ids(&dir.path().join("table")), vec![1, 2, 3, 4]);
    }

    #[test]
    fn complete_mode_replaces_the_rows_and_partitions_are_rebuilt_by_the_reader() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = options(
            dir.path(),
            WriteMode::Complete,
            CommitEvery::Batches(std::num::NonZeroU64::MIN),
        );
        opts.spec.partition_by = vec!["kind".into()];
        let mut sink = DeltaSink::new(opts).unwrap();
        let schema = batch(&[0]).schema();
        sink.write(&info(0), &schema, &[batch(&[1, 2])]).unwrap();
        sink.write(&info(1), &schema, &[batch(&[5, 6, 7])]).unwrap();
        assert_eq!(ids(&dir.path().join("table")), vec![5, 6, 7]);
        assert!(dir.path().join("table/kind=odd").is_dir());
        let (_, batches) = crate::source::delta::read_table(&dir.path().join("table")).unwrap();
        let kinds: usize = batches
            .iter()
            .map(|b| {
                let k = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
                k.iter().filter(|v| *v == Some("odd")).count()
            })
            .sum();
        assert_eq!(kinds, 2);
    }

    #[test]
    fn a_partition_column_missing_from_the_output_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = options(
            dir.path(),
            WriteMode::Append,
            CommitEvery::Batches(std::num::NonZeroU64::MIN),
        );
        opts.spec.partition_by = vec!["region".into()];
        let mut sink = DeltaSink::new(opts).unwrap();
        let b = batch(&[1]);
        let err = sink
            .write(&info(0), &b.schema(), std::slice::from_ref(&b))
            .unwrap_err();
        assert!(
            err.to_string().ends_with(
                "partition column \"region\" is not a column of the query's output (id, kind)"
            ),
            "{err}"
        );
    }

    #[test]
    fn paths_outside_the_table_are_refused() {
        let table = Path::new("/data/t");
        for (raw, why) in [
            ("../x.parquet", "leaves the table folder (`..`)"),
            ("a/../../x.parquet", "leaves the table folder (`..`)"),
            ("%2e%2e/x.parquet", "leaves the table folder (`..`)"),
            ("..%2fx.parquet", "leaves the table folder (`..`)"),
            ("/etc/x", "is absolute"),
            ("%2Fetc/x", "is absolute"),
            ("file:///etc/x", "is an absolute URI"),
            ("s3://bucket/x.parquet", "is an absolute URI"),
            ("", "is empty"),
            (".", "names no file"),
            ("a%00b", "contains a NUL byte"),
        ] {
            assert_eq!(table_file(table, raw), Err(why), "{raw}");
        }
        for (raw, file) in [
            ("part-0.parquet", "/data/t/part-0.parquet"),
            ("./part-0.parquet", "/data/t/part-0.parquet"),
            (
                "kind=a%20b/part-0.parquet",
                "/data/t/kind=a b/part-0.parquet",
            ),
            (
                "ts=2024-01-01 00%3A00/p.parquet",
                "/data/t/ts=2024-01-01 00:00/p.parquet",
            ),
        ] {
            assert_eq!(table_file(table, raw), Ok(PathBuf::from(file)), "{raw}");
        }
    }

    #[test]
    fn a_pending_list_naming_files_outside_the_table_is_corrupt_and_nothing_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let policy = CommitEvery::Batches(std::num::NonZeroU64::new(3).unwrap());
        let mut sink = DeltaSink::new(options(dir.path(), WriteMode::Append, policy)).unwrap();
        let schema = batch(&[0]).schema();
        assert_eq!(
            sink.write(&info(0), &schema, &[batch(&[1])]).unwrap(),
            Written::Pending
        );
        drop(sink);
        let victim = dir.path().join("victim.parquet");
        std::fs::write(&victim, "precious").unwrap();
        let list = pending_file(&dir.path().join("pending"), 0);
        let original = std::fs::read_to_string(&list).unwrap();
        let adds: Vec<serde_json::Value> = serde_json::from_str(&original).unwrap();
        let real = adds[0]["path"].as_str().unwrap().to_owned();
        for hostile in [victim.display().to_string(), "../victim.parquet".to_owned()] {
            std::fs::write(&list, original.replace(&real, &hostile)).unwrap();
            let err = DeltaSink::new(options(dir.path(), WriteMode::Append, policy)).unwrap_err();
            let DeltaSinkError::Checkpoint(CheckpointError::Corrupt { file, reason }) = &err else {
                panic!("expected Corrupt, got {err:?}");
            };
            assert_eq!(file, &list);
            assert!(
                reason.contains(&format!("add path {hostile:?}")),
                "{reason}"
            );
            assert!(!err.is_retryable());
            assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        }
        // A list named with a batch id no query reaches.
        std::fs::write(&list, &original).unwrap();
        let huge = pending_file(&dir.path().join("pending"), u64::MAX);
        std::fs::copy(&list, &huge).unwrap();
        let err = DeltaSink::new(options(dir.path(), WriteMode::Append, policy)).unwrap_err();
        assert!(
            matches!(&err, DeltaSinkError::Checkpoint(CheckpointError::Corrupt { file, .. }) if file == &huge),
            "{err:?}"
        );
        // Restored, the pending batch is committed as before.
        std::fs::remove_file(&huge).unwrap();
        let mut sink = DeltaSink::new(options(dir.path(), WriteMode::Append, policy)).unwrap();
        assert_eq!(
            sink.write(&info(1), &schema, &[batch(&[2])]).unwrap(),
            Written::Pending
        );
        assert_eq!(
            sink.write(&info(2), &schema, &[batch(&[3])]).unwrap(),
            Written::Committed(1)
        );
        assert_eq!(ids(&dir.path().join("table")), vec![1, 2, 3]);
    }

    #[test]
    fn add_paths_are_unescaped() {
        assert_eq!(
            decode_path("kind=a%20b/part-0.parquet"),
            "kind=a b/part-0.parquet"
        );
        assert_eq!(decode_path("100%"), "100%");
    }
}
