//! MERGE into a Delta table (upsert by key), the `delta-merge` sink and the `delta-merge` host
//! capability of Wasm foreachBatch sinks: Spark's
//! `foreachBatch { t.merge(s, "t.k = s.k").whenMatchedDelete(c1).whenMatchedUpdateAll(c2)
//! .whenNotMatchedInsertAll(c3) }`, each condition optional and written in SQL.
//!
//! deltalake's own `MergeBuilder` needs DataFusion, which would triple the build; this module
//! does what Delta's MERGE does without it, copy-on-write at file granularity:
//!
//! 1. read the table's current snapshot (its files) and the txn version of our app id: a batch
//!    already in the table (a replay after a crash) is skipped;
//! 2. read the key columns (and the columns the conditions read) of every file, find the matched
//!    rows and which clause applies to each (`plan`, columnar);
//! 3. rewrite each file with updates or deletes: its rows in order, matched ones replaced or
//!    left out; write the unmatched source rows (those the insert condition admits) as new files;
//! 4. commit once: `remove` for the rewritten files, `add` for the new ones, and a `txn` action
//!    (app id, version = batch id), so the batch is applied exactly once.
//!
//! Concurrency is optimistic, as in Delta: the commit declares that it read the whole table, so
//! a concurrent commit that removed or changed data fails ours with a conflict (retryable: the
//! next attempt reads the new snapshot). Concurrent blind appends do not conflict
//! (WriteSerializable, Delta's default).
//!
//! The snapshot's file paths come from the table's log; one that is absolute or leaves the table
//! folder is refused ([`DeltaMergeError::Corrupt`]) before any file is read.
//!
//! Not handled: partitioned tables and deletion vectors are refused with an error naming the
//! table; every file's key columns are read on every batch (no pruning by the files' min/max
//! statistics yet); a file with updates is held in memory while it is rewritten.
//!
//! # Layout
//! - `plan`: which rows update which, on Arrow batches (no Delta).
//! - this file: the table — snapshot, file reads, writes, the commit.

mod plan;

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, SchemaRef};
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties, TransactionError};
use deltalake::kernel::{Action, Remove, StructType, Transaction};
use deltalake::protocol::{DeltaOperation, MergePredicate};
use deltalake::writer::{DeltaWriter, RecordBatchWriter};
use deltalake::{DeltaTable, DeltaTableError};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

pub use plan::{MergeCounts, PlanError};

use crate::failpoint::{Failpoint, Phase};
use crate::spec::MergeTableSpec;

/// Settings of a [`DeltaMerge`].
#[derive(Debug, Clone)]
pub struct DeltaMergeOptions {
    pub table: MergeTableSpec,
    /// The txn action's app id: the query id (the sink), or the query id and the capability's
    /// table name (a plugin), so that each writer of the table has its own batch counter.
    pub app_id: String,
    pub failpoint: Option<Failpoint>,
}

/// A merge failed; each variant names the table (and the batch).
#[derive(Debug, thiserror::Error)]
pub enum DeltaMergeError {
    #[error("delta merge into {}: cannot start its async runtime: {source}", table.display())]
    Runtime {
        table: PathBuf,
        source: std::io::Error,
    },
    #[error("delta merge into {}, batch {batch_id}: cannot {op}: {source}", table.display())]
    Delta {
        table: PathBuf,
        batch_id: u64,
        op: &'static str,
        /// Boxed: deltalake's error is large.
        source: Box<DeltaTableError>,
    },
    #[error("delta merge into {}, batch {batch_id}: another writer committed to the table while the batch was merged ({source}); the batch can be retried on the new snapshot", table.display())]
    Conflict {
        table: PathBuf,
        batch_id: u64,
        source: Box<DeltaTableError>,
    },
    #[error("delta merge into {}, batch {batch_id}: {source}", table.display())]
    Plan {
        table: PathBuf,
        batch_id: u64,
        source: Box<PlanError>,
    },
    #[error("delta merge into {}, batch {batch_id}: file {}: {message}", table.display(), file.display())]
    File {
        table: PathBuf,
        batch_id: u64,
        file: PathBuf,
        message: String,
    },
    #[error("delta merge into {}: the table is partitioned by [{columns}]; MERGE supports unpartitioned tables only", table.display())]
    Partitioned { table: PathBuf, columns: String },
    /// The table's log names a data file outside the table: nothing is read or rewritten.
    #[error("delta merge into {}, batch {batch_id}: the table's log names the data file {path:?}, which {reason}; the log is damaged, refusing to read it", table.display())]
    Corrupt {
        table: PathBuf,
        batch_id: u64,
        /// The path as the log gives it (%-decoded).
        path: String,
        reason: &'static str,
    },
}

impl DeltaMergeError {
    /// Whether merging the same batch again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Conflict { .. } => true,
            Self::Delta { source, .. } => !matches!(
                **source,
                DeltaTableError::SchemaMismatch { .. } | DeltaTableError::Arrow { .. }
            ),
            Self::Runtime { .. }
            | Self::Plan { .. }
            | Self::File { .. }
            | Self::Partitioned { .. }
            | Self::Corrupt { .. } => false,
        }
    }
}

/// What one call of [`DeltaMerge::merge`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeOutcome {
    /// The table's txn version for this app id is ≥ the batch id: already merged.
    Skipped,
    /// The batch had no rows: nothing to commit.
    Empty,
    /// Committed as table version `version`.
    Merged {
        version: u64,
        counts: MergeCounts,
        files_removed: u64,
        files_added: u64,
    },
}

/// A merge prepared against one snapshot, not yet committed.
#[derive(Debug)]
struct Prepared {
    actions: Vec<Action>,
    counts: MergeCounts,
    files_removed: u64,
    files_added: u64,
}

/// Merges batches into one Delta table.
pub struct DeltaMerge {
    options: DeltaMergeOptions,
    runtime: tokio::runtime::Runtime,
    table: Option<DeltaTable>,
    /// The conditions planned for the last batch schema (planned again only when it changes).
    conditions: Option<(SchemaRef, Arc<plan::Conditions>)>,
    description: String,
}

impl std::fmt::Debug for DeltaMerge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeltaMerge")
            .field("path", &self.options.table.path)
            .field("app_id", &self.options.app_id)
            .finish_non_exhaustive()
    }
}

impl DeltaMerge {
    /// A merger into the table at `options.table.path` (opened, or created, at the first batch).
    ///
    /// # Errors
    /// When the async runtime cannot start.
    pub fn new(options: DeltaMergeOptions) -> Result<Self, DeltaMergeError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| DeltaMergeError::Runtime {
                table: options.table.path.clone(),
                source,
            })?;
        let description = format!("DeltaMergeSink[{}]", options.table.path.display());
        Ok(Self {
            options,
            runtime,
            table: None,
            conditions: None,
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
    ) -> impl Fn(DeltaTableError) -> DeltaMergeError + use<> {
        let table = self.options.table.path.clone();
        move |source| DeltaMergeError::Delta {
            table: table.clone(),
            batch_id,
            op,
            source: Box::new(source),
        }
    }

    /// Merges batch `batch_id` (which may be a replay) into the table.
    ///
    /// # Errors
    /// Duplicate keys (without dedup), a missing column, a conflict with another writer, a
    /// failed read, write or commit; nothing is committed then.
    pub fn merge(
        &mut self,
        batch_id: u64,
        batch: &RecordBatch,
    ) -> Result<MergeOutcome, DeltaMergeError> {
        let Some(prepared) = self.prepare(batch_id, batch)? else {
            return Ok(if batch.num_rows() == 0 {
                MergeOutcome::Empty
            } else {
                MergeOutcome::Skipped
            });
        };
        Failpoint::check(self.options.failpoint.as_ref(), Phase::InSink, batch_id);
        self.commit(batch_id, prepared)
    }

    /// Steps 1–3: `None` when the batch is empty or already in the table.
    fn prepare(
        &mut self,
        batch_id: u64,
        batch: &RecordBatch,
    ) -> Result<Option<Prepared>, DeltaMergeError> {
        if batch.num_rows() == 0 {
            return Ok(None);
        }
        let schema = Arc::new(super::delta::delta_schema(&batch.schema()));
        let source = super::delta::relabel(batch, &schema)
            .map_err(self.delta_error(batch_id, "align the batch with Delta's types"))?;
        self.open(batch_id, &schema)?;
        let path = self.options.table.path.clone();
        let app_id = self.options.app_id.clone();
        let read_err = self.delta_error(batch_id, "read the table's snapshot");
        let missing = || DeltaMergeError::Delta {
            table: path.clone(),
            batch_id,
            op: "use the table",
            source: Box::new(DeltaTableError::NotInitialized),
        };
        // The latest snapshot: another writer may have committed since the last batch.
        let table = self.table.as_mut().ok_or_else(missing)?;
        self.runtime
            .block_on(table.update_state())
            .map_err(&read_err)?;
        let table = self.table.as_ref().ok_or_else(missing)?;
        let snapshot = table.snapshot().map_err(&read_err)?;
        let partitions = snapshot.metadata().partition_columns();
        if !partitions.is_empty() {
            return Err(DeltaMergeError::Partitioned {
                table: path,
                columns: partitions.join(", "),
            });
        }
        let txn = self
            .runtime
            .block_on(snapshot.transaction_version(table.log_store().as_ref(), app_id))
            .map_err(&read_err)?;
        if let Some(v) = txn.and_then(|v| u64::try_from(v).ok())
            && v >= batch_id
        {
            tracing::info!(table = %path.display(), batch_id, txn_version = v, "batch {batch_id} is already merged into the Delta table: skipped");
            return Ok(None);
        }
        // Statistics only serve integer keys (`plan::Target::key_range`).
        let integer_key = self.options.table.keys.iter().any(|k| {
            source.schema().field_with_name(k).is_ok_and(|f| {
                matches!(
                    f.data_type(),
                    DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64
                )
            })
        });
        let mut files = Vec::new();
        let mut stats = Vec::new();
        for view in snapshot.log_data().iter() {
            let remove = view.remove_action(true);
            if view.deletion_vector_descriptor().is_some() {
                return Err(DeltaMergeError::File {
                    table: path.clone(),
                    batch_id,
                    file: PathBuf::from(&remove.path),
                    message: "has a deletion vector, which MERGE does not support yet".into(),
                });
            }
            // deltalake gives the path %-decoded; it is read and rewritten below.
            if let Err(reason) = super::delta::check_relative(&remove.path) {
                return Err(DeltaMergeError::Corrupt {
                    table: path.clone(),
                    batch_id,
                    path: remove.path,
                    reason,
                });
            }
            files.push(remove);
            stats.push(if integer_key {
                view.stats().and_then(|s| serde_json::from_str(&s).ok())
            } else {
                None
            });
        }
        let writer = RecordBatchWriter::for_table(table)
            .map_err(self.delta_error(batch_id, "start writing Parquet files"))?
            .with_target_file_size(self.options.table.target_file_size);
        let mut target = TableFiles {
            table: &path,
            batch_id,
            runtime: &self.runtime,
            schema: &schema,
            files: &files,
            stats: &stats,
            writer,
            rewritten: Vec::new(),
        };
        let spec = &self.options.table;
        let conditions = match &self.conditions {
            Some((planned_for, c)) if planned_for == &schema => Arc::clone(c),
            _ => {
                let c = Arc::new(plan::Conditions::plan(spec, &schema).map_err(|source| {
                    DeltaMergeError::Plan {
                        table: path.clone(),
                        batch_id,
                        source: Box::new(source),
                    }
                })?);
                self.conditions = Some((Arc::clone(&schema), Arc::clone(&c)));
                c
            }
        };
        let counts = plan::Plan {
            keys: &spec.keys,
            conditions: &conditions,
            dedup: &spec.dedup,
        }
        .run(&source, &mut target)
        .map_err(|e| match e {
            plan::RunError::Plan(source) => DeltaMergeError::Plan {
                table: path.clone(),
                batch_id,
                source: Box::new(source),
            },
            plan::RunError::Target(e) => e,
        })?;
        let TableFiles {
            mut writer,
            rewritten,
            ..
        } = target;
        let adds = self
            .runtime
            .block_on(writer.flush())
            .map_err(self.delta_error(batch_id, "write the merged Parquet files"))?;
        let files_removed = rewritten.len() as u64;
        let files_added = adds.len() as u64;
        let mut actions: Vec<Action> = rewritten
            .into_iter()
            .map(|i| Action::Remove(files[i].clone()))
            .collect();
        actions.extend(adds.into_iter().map(Action::Add));
        Ok(Some(Prepared {
            actions,
            counts,
            files_removed,
            files_added,
        }))
    }

    /// Opens (or creates from `schema`) the table on first use.
    fn open(&mut self, batch_id: u64, schema: &SchemaRef) -> Result<(), DeltaMergeError> {
        if self.table.is_some() {
            return Ok(());
        }
        let path = &self.options.table.path;
        let err = self.delta_error(batch_id, "open the table");
        let url = deltalake::ensure_table_uri(path.to_string_lossy()).map_err(&err)?;
        let table = self
            .runtime
            .block_on(DeltaTable::try_from_url(url))
            .map_err(&err)?;
        let table = if table.version().is_some() {
            table
        } else {
            let create = self.delta_error(batch_id, "create the table from the batch's schema");
            let kernel: StructType = schema
                .as_ref()
                .try_into_kernel()
                .map_err(|e| create(e.into()))?;
            let name = path
                .file_name()
                .map_or_else(|| "table".to_owned(), |n| n.to_string_lossy().into_owned());
            self.runtime
                .block_on(
                    table
                        .create()
                        .with_table_name(name)
                        .with_columns(kernel.fields().cloned())
                        .into_future(),
                )
                .map_err(&create)?
        };
        self.table = Some(table);
        Ok(())
    }

    /// Step 4: one commit with the removes, adds and the txn action.
    fn commit(
        &mut self,
        batch_id: u64,
        prepared: Prepared,
    ) -> Result<MergeOutcome, DeltaMergeError> {
        let path = self.options.table.path.clone();
        let err = self.delta_error(batch_id, "commit the merge");
        let spec = &self.options.table;
        let on = spec
            .keys
            .iter()
            .map(|k| format!("t.{k} = s.{k}"))
            .collect::<Vec<_>>()
            .join(" AND ");
        let operation = DeltaOperation::Merge {
            predicate: None,
            merge_predicate: Some(on),
            matched_predicates: spec
                .when_matched_delete
                .iter()
                .map(|c| MergePredicate {
                    action_type: "delete".into(),
                    predicate: Some(c.to_string()),
                })
                .chain(std::iter::once(MergePredicate {
                    action_type: "update".into(),
                    predicate: spec.when_matched_update.as_ref().map(ToString::to_string),
                }))
                .collect(),
            not_matched_predicates: vec![MergePredicate {
                action_type: "insert".into(),
                predicate: spec
                    .when_not_matched_insert
                    .as_ref()
                    .map(ToString::to_string),
            }],
            not_matched_by_source_predicates: Vec::new(),
        };
        let version = i64::try_from(batch_id).unwrap_or(i64::MAX);
        let properties = CommitProperties::default()
            .with_application_transaction(Transaction::new(&self.options.app_id, version));
        let table = self.table.as_mut().ok_or_else(|| DeltaMergeError::Delta {
            table: path.clone(),
            batch_id,
            op: "use the table",
            source: Box::new(DeltaTableError::NotInitialized),
        })?;
        let snapshot = table.snapshot().map_err(&err)?;
        let log_store = table.log_store();
        let finalized = self
            .runtime
            .block_on(
                CommitBuilder::from(properties)
                    .with_actions(prepared.actions)
                    .build(Some(snapshot), log_store, operation)
                    .into_future(),
            )
            .map_err(|e| match e {
                DeltaTableError::Transaction {
                    source: TransactionError::CommitConflict(_),
                } => DeltaMergeError::Conflict {
                    table: path.clone(),
                    batch_id,
                    source: Box::new(e),
                },
                e => err(e),
            })?;
        let version = finalized.version();
        table.state = Some(finalized.snapshot());
        tracing::debug!(table = %path.display(), batch_id, version, updated = prepared.counts.updated, deleted = prepared.counts.deleted, inserted = prepared.counts.inserted, files_pruned = prepared.counts.files_pruned, "delta merge");
        Ok(MergeOutcome::Merged {
            version,
            counts: prepared.counts,
            files_removed: prepared.files_removed,
            files_added: prepared.files_added,
        })
    }
}

/// The table's files as the plan sees them: read with the parquet crate, written with
/// deltalake's writer (which collects the new files' `add` actions and statistics).
struct TableFiles<'a> {
    table: &'a std::path::Path,
    batch_id: u64,
    runtime: &'a tokio::runtime::Runtime,
    /// The batch's schema (in Delta's types): what full reads are cast to.
    schema: &'a SchemaRef,
    /// The snapshot's files, as the `remove` actions that drop them.
    files: &'a [Remove],
    /// Each file's statistics (Delta's `stats` JSON), when recorded.
    stats: &'a [Option<serde_json::Value>],
    writer: RecordBatchWriter,
    /// Indices into `files` of the files rewritten.
    rewritten: Vec<usize>,
}

impl TableFiles<'_> {
    fn file_error(&self, file: &std::path::Path, message: String) -> DeltaMergeError {
        DeltaMergeError::File {
            table: self.table.to_path_buf(),
            batch_id: self.batch_id,
            file: file.to_path_buf(),
            message,
        }
    }

    fn write(&mut self, rows: RecordBatch) -> Result<(), DeltaMergeError> {
        let table = self.table.to_path_buf();
        let batch_id = self.batch_id;
        self.runtime
            .block_on(self.writer.write(rows))
            .map_err(|source| DeltaMergeError::Delta {
                table,
                batch_id,
                op: "write the merged rows",
                source: Box::new(source),
            })
    }
}

impl plan::Target for TableFiles<'_> {
    type Error = DeltaMergeError;

    fn key_range(&self, file: usize, column: &str) -> Option<(i64, i64)> {
        let stats = self.stats.get(file)?.as_ref()?;
        let lo = stats.get("minValues")?.get(column)?.as_i64()?;
        let hi = stats.get("maxValues")?.get(column)?.as_i64()?;
        Some((lo, hi))
    }

    fn files(&self) -> usize {
        self.files.len()
    }

    fn read(
        &mut self,
        file: usize,
        columns: Option<&[&str]>,
    ) -> Result<RecordBatch, DeltaMergeError> {
        let path = self.table.join(&self.files[file].path);
        let handle = std::fs::File::open(&path)
            .map_err(|e| self.file_error(&path, format!("cannot open: {e}")))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(handle)
            .map_err(|e| self.file_error(&path, format!("cannot read: {e}")))?;
        let builder = match columns {
            Some(names) => {
                let mask = ProjectionMask::columns(builder.parquet_schema(), names.iter().copied());
                builder.with_projection(mask)
            }
            None => builder,
        };
        let file_schema = Arc::clone(builder.schema());
        let reader = builder
            .build()
            .map_err(|e| self.file_error(&path, format!("cannot read: {e}")))?;
        let mut batches = Vec::new();
        for batch in reader {
            batches.push(batch.map_err(|e| self.file_error(&path, format!("cannot decode: {e}")))?);
        }
        let read_schema = batches
            .first()
            .map_or_else(|| projected(&file_schema, columns), RecordBatch::schema);
        let rows = arrow_select::concat::concat_batches(&read_schema, &batches)
            .map_err(|e| self.file_error(&path, format!("cannot combine its row groups: {e}")))?;
        match columns {
            Some(_) => Ok(rows),
            None => self.conform(&path, &rows),
        }
    }

    fn rewrite(&mut self, file: usize, rows: RecordBatch) -> Result<(), DeltaMergeError> {
        self.rewritten.push(file);
        // A file whose every row was deleted is only removed.
        if rows.num_rows() == 0 {
            return Ok(());
        }
        self.write(rows)
    }

    fn insert(&mut self, rows: RecordBatch) -> Result<(), DeltaMergeError> {
        self.write(rows)
    }
}

impl TableFiles<'_> {
    /// A whole file's rows with the batch's schema, columns by name.
    fn conform(
        &self,
        path: &std::path::Path,
        rows: &RecordBatch,
    ) -> Result<RecordBatch, DeltaMergeError> {
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for field in self.schema.fields() {
            let column = rows.column_by_name(field.name()).ok_or_else(|| {
                self.file_error(
                    path,
                    format!(
                        "has no column {:?}, which the batch has (MERGE does not evolve the table's schema)",
                        field.name()
                    ),
                )
            })?;
            columns.push(if column.data_type() == field.data_type() {
                Arc::clone(column)
            } else {
                arrow_cast::cast(column, field.data_type())
                    .map_err(|e| self.file_error(path, format!("column {}: {e}", field.name())))?
            });
        }
        RecordBatch::try_new(Arc::clone(self.schema), columns)
            .map_err(|e| self.file_error(path, format!("cannot assemble its rows: {e}")))
    }
}

/// The schema of a read of `columns` of a file with no row groups.
fn projected(schema: &SchemaRef, columns: Option<&[&str]>) -> SchemaRef {
    match columns {
        None => Arc::clone(schema),
        Some(names) => Arc::new(arrow_schema::Schema::new(
            schema
                .fields()
                .iter()
                .filter(|f| names.contains(&f.name().as_str()))
                .cloned()
                .collect::<Vec<_>>(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::Int64Array;
    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::spec::{MergeDedup, Sides, parse_condition};

    fn options(dir: &std::path::Path, app_id: &str) -> DeltaMergeOptions {
        DeltaMergeOptions {
            table: MergeTableSpec {
                path: dir.join("t"),
                keys: vec!["id".into()],
                when_matched_delete: None,
                when_matched_update: Some(parse_condition("s.v > t.v", Sides::Both).unwrap()),
                when_not_matched_insert: None,
                dedup: MergeDedup::Refuse,
                target_file_size: 128 << 20,
            },
            app_id: app_id.into(),
            failpoint: None,
        }
    }

    fn batch(rows: &[(i64, i64)]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("v", DataType::Int64, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap()
    }

    fn rows(dir: &std::path::Path) -> Vec<(i64, i64)> {
        let (_, batches) = crate::source::delta::read_table(&dir.join("t")).unwrap();
        let mut out = Vec::new();
        for b in &batches {
            let id = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let v = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
            out.extend((0..b.num_rows()).map(|r| (id.value(r), v.value(r))));
        }
        out.sort_unstable();
        out
    }

    #[test]
    fn merges_commit_once_per_batch_and_a_replay_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = DeltaMerge::new(options(dir.path(), "q")).unwrap();
        assert!(matches!(
            m.merge(0, &batch(&[(1, 1), (2, 1)])).unwrap(),
            MergeOutcome::Merged {
                version: 1,
                files_removed: 0,
                ..
            }
        ));
        let MergeOutcome::Merged {
            version,
            counts,
            files_removed,
            ..
        } = m.merge(1, &batch(&[(1, 5), (2, 0), (3, 1)])).unwrap()
        else {
            panic!("batch 1 was not merged")
        };
        assert_eq!((version, files_removed), (2, 1));
        assert_eq!((counts.updated, counts.inserted, counts.skipped), (1, 1, 1));
        // A restart replaying batch 1: the table's txn says it is there.
        let mut again = DeltaMerge::new(options(dir.path(), "q")).unwrap();
        assert_eq!(
            again.merge(1, &batch(&[(1, 9)])).unwrap(),
            MergeOutcome::Skipped
        );
        assert_eq!(again.merge(2, &batch(&[])).unwrap(), MergeOutcome::Empty);
        assert_eq!(rows(dir.path()), vec![(1, 5), (2, 1), (3, 1)]);
    }

    #[test]
    fn files_whose_key_statistics_miss_the_batch_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = DeltaMerge::new(options(dir.path(), "q")).unwrap();
        m.merge(0, &batch(&[(1, 1), (2, 1)])).unwrap();
        m.merge(1, &batch(&[(100, 1), (101, 1)])).unwrap();
        // Key 100 lies only in the second file's range (100..=101).
        let MergeOutcome::Merged {
            counts,
            files_removed,
            ..
        } = m.merge(2, &batch(&[(100, 7), (102, 1)])).unwrap()
        else {
            panic!("batch 2 was not merged")
        };
        assert_eq!((counts.updated, counts.inserted), (1, 1));
        assert_eq!((counts.files_pruned, files_removed), (1, 1));
        assert_eq!(
            rows(dir.path()),
            vec![(1, 1), (2, 1), (100, 7), (101, 1), (102, 1)]
        );
    }

    #[test]
    fn data_files_outside_the_table_are_corrupt_and_not_read() {
        for hostile in ["../victim.parquet", "%2e%2e/victim.parquet", "/VICTIM"] {
            let dir = tempfile::tempdir().unwrap();
            let mut m = DeltaMerge::new(options(dir.path(), "q")).unwrap();
            m.merge(0, &batch(&[(1, 1)])).unwrap();
            // A real data file, copied outside the table: reading it would succeed.
            let table = dir.path().join("t");
            let data = std::fs::read_dir(&table)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| p.extension().is_some_and(|e| e == "parquet"))
                .unwrap();
            let victim = dir.path().join("victim.parquet");
            std::fs::copy(&data, &victim).unwrap();
            let size = std::fs::metadata(&victim).unwrap().len();
            let path = hostile.replace("/VICTIM", victim.to_str().unwrap());
            std::fs::write(
                table.join("_delta_log/00000000000000000002.json"),
                format!(
                    "{{\"add\":{{\"path\":{path:?},\"partitionValues\":{{}},\"size\":{size},\
                     \"modificationTime\":0,\"dataChange\":true}}}}\n"
                ),
            )
            .unwrap();
            let mut again = DeltaMerge::new(options(dir.path(), "q")).unwrap();
            let err = again.merge(1, &batch(&[(1, 5)])).unwrap_err();
            let DeltaMergeError::Corrupt { path: named, .. } = &err else {
                panic!("{hostile}: expected Corrupt, got {err:?}");
            };
            assert!(named.ends_with("victim.parquet"), "{named}");
            assert!(!err.is_retryable());
            assert!(err.to_string().contains("refusing to read it"), "{err}");
            assert_eq!(
                std::fs::read(&victim).unwrap(),
                std::fs::read(&data).unwrap()
            );
        }
    }

    #[test]
    fn a_commit_by_another_writer_in_between_is_a_retryable_conflict() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = DeltaMerge::new(options(dir.path(), "a")).unwrap();
        a.merge(0, &batch(&[(1, 1), (2, 1)])).unwrap();
        let mut b = DeltaMerge::new(options(dir.path(), "b")).unwrap();
        let from_a = a.prepare(1, &batch(&[(1, 2)])).unwrap().unwrap();
        let from_b = b.prepare(1, &batch(&[(2, 2)])).unwrap().unwrap();
        a.commit(1, from_a).unwrap();
        let err = b.commit(1, from_b).unwrap_err();
        assert!(matches!(err, DeltaMergeError::Conflict { .. }), "{err}");
        assert!(err.is_retryable());
        assert!(
            err.to_string().contains("another writer committed"),
            "{err}"
        );
        // The retry reads the new snapshot, so a's update survives.
        assert!(matches!(
            b.merge(1, &batch(&[(2, 2)])).unwrap(),
            MergeOutcome::Merged { .. }
        ));
        assert_eq!(rows(dir.path()), vec![(1, 2), (2, 2)]);
    }
}
