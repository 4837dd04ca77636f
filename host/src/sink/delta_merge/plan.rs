//! The columnar half of MERGE: which source rows update which target rows, computed with Arrow
//! kernels and no Delta in sight, so that it is tested on plain batches.
//!
//! The batch's keys are encoded once with `arrow-row` (one byte string per row, comparable and
//! hashable whatever the key columns' types) into a map key → source row. A target file whose
//! recorded range of an integer key column misses the batch's is skipped unread; each other file's key
//! columns are encoded the same way and looked up, giving aligned lists of (target row, source
//! row) matches; the clauses' SQL conditions (planned once per batch schema) are evaluated once
//! per file over the matched pairs' `take`n columns; a file with updates or deletes is rebuilt by
//! one `interleave` of its rows and the batch's. No step allocates per row.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{ArrayRef, BooleanArray, RecordBatch, UInt32Array};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{ArrowError, SortOptions};

use crate::spec::{MergeDedup, MergeTableSpec};
use crate::sql::ConditionPlan;

/// What the plan needs from a table: its files' columns, and where rewritten and new rows go.
pub(super) trait Target {
    type Error;
    /// How many data files the table has.
    fn files(&self) -> usize;
    /// The least and greatest value of the integer column `column` in file `file`, when the
    /// table records them (Delta's file statistics). A file whose range of some key column
    /// misses every key of the batch holds no match and is not read.
    fn key_range(&self, file: usize, column: &str) -> Option<(i64, i64)>;
    /// The named columns of file `file` (in that order), or with `None` all of them with the
    /// batch's schema.
    fn read(&mut self, file: usize, columns: Option<&[&str]>) -> Result<RecordBatch, Self::Error>;
    /// File `file` is replaced by `rows`.
    fn rewrite(&mut self, file: usize, rows: RecordBatch) -> Result<(), Self::Error>;
    /// `rows` are new.
    fn insert(&mut self, rows: RecordBatch) -> Result<(), Self::Error>;
}

/// What one merge changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeCounts {
    /// Source rows that replaced a target row (one per target row replaced).
    pub updated: u64,
    /// Source rows inserted (no target row had their key).
    pub inserted: u64,
    /// Target rows deleted by `when_matched_delete`.
    pub deleted: u64,
    /// Source rows that changed nothing: matched with no clause's condition holding, or new
    /// with `when_not_matched_insert` not holding.
    pub skipped: u64,
    /// Source rows dropped by `dedup = "latest-by:..."`.
    pub deduplicated: u64,
    /// Target files not read: their key ranges miss every key of the batch.
    pub files_pruned: u64,
}

/// A merge that cannot be planned; the table's module adds the table and the batch id.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("the {role} column {column:?} is not a column of the {side} ({columns})")]
    MissingColumn {
        role: &'static str,
        column: String,
        side: &'static str,
        columns: String,
    },
    #[error(
        "Cannot perform Merge as multiple source rows matched and attempted to modify the same target row in the Delta table in possibly conflicting ways. The key {key} is in rows {first} and {second} of the batch; set dedup = \"latest-by:<column>\" to keep the latest of them"
    )]
    DuplicateKey {
        key: String,
        first: usize,
        second: usize,
    },
    #[error("the {clause} condition {condition:?} failed: {message}")]
    Condition {
        clause: &'static str,
        condition: String,
        message: String,
    },
    #[error("the {clause} condition: {source}")]
    ConditionPlan {
        clause: &'static str,
        source: crate::sql::PlanError,
    },
    #[error("cannot {op}: {source}")]
    Arrow {
        op: &'static str,
        source: ArrowError,
    },
}

/// A failed merge: the plan's own problem, or the target's.
#[derive(Debug)]
pub(super) enum RunError<E> {
    Plan(PlanError),
    Target(E),
}

impl<E> From<PlanError> for RunError<E> {
    fn from(e: PlanError) -> Self {
        Self::Plan(e)
    }
}

fn arrow(op: &'static str) -> impl Fn(ArrowError) -> PlanError {
    move |source| PlanError::Arrow { op, source }
}

/// A table's conditions planned for one batch schema, with the clause each belongs to.
#[derive(Debug, Default)]
pub(super) struct Conditions {
    pub delete: Option<(ConditionPlan, String)>,
    pub update: Option<(ConditionPlan, String)>,
    pub insert: Option<(ConditionPlan, String)>,
}

impl Conditions {
    /// Plans the table's conditions for batches of `schema` (once per schema, not per batch).
    ///
    /// # Errors
    /// [`PlanError::ConditionPlan`] naming the clause.
    pub fn plan(
        spec: &MergeTableSpec,
        schema: &arrow_schema::SchemaRef,
    ) -> Result<Self, PlanError> {
        let one = |clause: &'static str, c: &Option<crate::spec::RowCondition>| {
            c.as_ref()
                .map(|c| {
                    c.plan(schema)
                        .map(|p| (p, c.to_string()))
                        .map_err(|source| PlanError::ConditionPlan { clause, source })
                })
                .transpose()
        };
        Ok(Self {
            delete: one("when_matched_delete", &spec.when_matched_delete)?,
            update: one("when_matched_update", &spec.when_matched_update)?,
            insert: one("when_not_matched_insert", &spec.when_not_matched_insert)?,
        })
    }
}

/// The settings of one merge, with column names checked against the batch.
#[derive(Debug)]
pub(super) struct Plan<'a> {
    pub keys: &'a [String],
    pub conditions: &'a Conditions,
    pub dedup: &'a MergeDedup,
}

/// Evaluates `condition` over the pairs (`source` rows `s_idx`, `existing` rows `t_idx`).
fn holds(
    clause: &'static str,
    (condition, text): &(ConditionPlan, String),
    source: &RecordBatch,
    s_idx: &UInt32Array,
    existing: Option<(&RecordBatch, &UInt32Array)>,
) -> Result<BooleanArray, PlanError> {
    let mut s_cols = Vec::with_capacity(condition.source_columns().len());
    for c in condition.source_columns() {
        let column = source.column(column_index(source, c, "condition", "batch")?);
        s_cols.push(
            arrow_select::take::take(column, s_idx, None)
                .map_err(arrow("take the batch's condition columns"))?,
        );
    }
    let mut t_cols = Vec::with_capacity(condition.target_columns().len());
    if let Some((existing, t_idx)) = existing {
        for c in condition.target_columns() {
            let column = existing.column(column_index(existing, c, "condition", "table")?);
            let like = source.column(column_index(source, c, "condition", "batch")?);
            t_cols.push(cast_to(
                &arrow_select::take::take(column, t_idx, None)
                    .map_err(arrow("take the table's condition columns"))?,
                like,
            )?);
        }
    }
    condition
        .evaluate(s_idx.len(), s_cols, t_cols)
        .map_err(|message| PlanError::Condition {
            clause,
            condition: text.clone(),
            message,
        })
}

fn column_index(
    batch: &RecordBatch,
    column: &str,
    role: &'static str,
    side: &'static str,
) -> Result<usize, PlanError> {
    batch
        .schema()
        .index_of(column)
        .map_err(|_| PlanError::MissingColumn {
            role,
            column: column.to_owned(),
            side,
            columns: batch
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

impl Plan<'_> {
    /// Merges `source` into `target`.
    ///
    /// # Errors
    /// A missing column, a duplicate key (without dedup), an Arrow failure, or the target's own.
    pub fn run<T: Target>(
        &self,
        source: &RecordBatch,
        target: &mut T,
    ) -> Result<MergeCounts, RunError<T::Error>> {
        let mut counts = MergeCounts::default();
        let key_idx = self
            .keys
            .iter()
            .map(|k| column_index(source, k, "key", "batch"))
            .collect::<Result<Vec<_>, _>>()?;
        let key_columns = |b: &RecordBatch| -> Vec<ArrayRef> {
            key_idx.iter().map(|i| Arc::clone(b.column(*i))).collect()
        };
        let converter = RowConverter::new(
            key_idx
                .iter()
                .map(|i| SortField::new(source.column(*i).data_type().clone()))
                .collect(),
        )
        .map_err(arrow("encode the key columns"))?;
        let source = self.deduplicate(source, &converter, &key_columns, &mut counts)?;
        let source_keys = converter
            .convert_columns(&key_columns(&source))
            .map_err(arrow("encode the batch's keys"))?;
        let by_key = index(&source_keys);
        let ranges: Vec<Option<(i64, i64)>> = key_idx
            .iter()
            .map(|&i| int_range(source.column(i)))
            .collect::<Result<_, _>>()?;
        let mut wanted: Vec<&str> = self.keys.iter().map(String::as_str).collect();
        for (c, _) in [&self.conditions.delete, &self.conditions.update]
            .into_iter()
            .flatten()
        {
            for column in c.target_columns() {
                if !wanted.contains(&column.as_str()) {
                    wanted.push(column);
                }
            }
        }
        let mut matched = vec![false; source.num_rows()];
        let mut target_rows: Vec<u32> = Vec::new();
        let mut source_rows: Vec<u32> = Vec::new();
        for file in 0..target.files() {
            let misses = self.keys.iter().zip(&ranges).any(|(k, range)| {
                range
                    .zip(target.key_range(file, k))
                    .is_some_and(|((lo, hi), (file_lo, file_hi))| file_hi < lo || file_lo > hi)
            });
            if misses {
                counts.files_pruned += 1;
                continue;
            }
            let existing = target.read(file, Some(&wanted)).map_err(RunError::Target)?;
            let mut keys = Vec::with_capacity(self.keys.len());
            for (k, source_key) in self.keys.iter().zip(&key_idx) {
                let column =
                    Arc::clone(existing.column(column_index(&existing, k, "key", "table")?));
                keys.push(cast_to(&column, source.column(*source_key))?);
            }
            let rows = converter
                .convert_columns(&keys)
                .map_err(arrow("encode the table's keys"))?;
            target_rows.clear();
            source_rows.clear();
            for t in 0..rows.num_rows() {
                if let Some(&s) = by_key.get(&rows.row(t)) {
                    target_rows.push(u32::try_from(t).unwrap_or(u32::MAX));
                    source_rows.push(s);
                    matched[s as usize] = true;
                }
            }
            if target_rows.is_empty() {
                continue;
            }
            let t_idx = UInt32Array::from(std::mem::take(&mut target_rows));
            let s_idx = UInt32Array::from(std::mem::take(&mut source_rows));
            let pairs = Some((&existing, &t_idx));
            // Delta checks its whenMatched clauses in order: delete, then update.
            let delete = match &self.conditions.delete {
                Some(c) => holds("when_matched_delete", c, &source, &s_idx, pairs)?,
                None => BooleanArray::from(vec![false; t_idx.len()]),
            };
            let update = match &self.conditions.update {
                Some(c) => holds("when_matched_update", c, &source, &s_idx, pairs)?,
                None => BooleanArray::from(vec![true; t_idx.len()]),
            };
            let mut picks: Option<Vec<Option<(usize, usize)>>> = None;
            for (i, (t, s)) in t_idx.values().iter().zip(s_idx.values()).enumerate() {
                let action = if delete.value(i) {
                    counts.deleted += 1;
                    None
                } else if update.value(i) {
                    counts.updated += 1;
                    Some((1, *s as usize))
                } else {
                    counts.skipped += 1;
                    continue;
                };
                let picks = picks.get_or_insert_with(|| {
                    (0..existing.num_rows()).map(|r| Some((0, r))).collect()
                });
                picks[*t as usize] = action;
            }
            let Some(picks) = picks else {
                continue;
            };
            let full = target.read(file, None).map_err(RunError::Target)?;
            let picks: Vec<(usize, usize)> = picks.into_iter().flatten().collect();
            let rows = arrow_select::interleave::interleave_record_batch(&[&full, &source], &picks)
                .map_err(arrow("rebuild a file with its updated rows"))?;
            target.rewrite(file, rows).map_err(RunError::Target)?;
        }
        let unmatched = BooleanArray::from_iter(matched.iter().map(|m| Some(!m)));
        let mut inserts = arrow_select::filter::filter_record_batch(&source, &unmatched)
            .map_err(arrow("select the rows to insert"))?;
        if let Some(c) = &self.conditions.insert
            && inserts.num_rows() > 0
        {
            let all = UInt32Array::from_iter_values(
                0..u32::try_from(inserts.num_rows()).unwrap_or(u32::MAX),
            );
            let keep = holds("when_not_matched_insert", c, &inserts, &all, None)?;
            let before = inserts.num_rows();
            inserts = arrow_select::filter::filter_record_batch(&inserts, &keep)
                .map_err(arrow("select the rows to insert"))?;
            counts.skipped += (before - inserts.num_rows()) as u64;
        }
        counts.inserted = inserts.num_rows() as u64;
        if inserts.num_rows() > 0 {
            target.insert(inserts).map_err(RunError::Target)?;
        }
        Ok(counts)
    }

    /// `source` with one row per key: refused, or the latest by the dedup column.
    fn deduplicate(
        &self,
        source: &RecordBatch,
        converter: &RowConverter,
        key_columns: &dyn Fn(&RecordBatch) -> Vec<ArrayRef>,
        counts: &mut MergeCounts,
    ) -> Result<RecordBatch, PlanError> {
        let rows = converter
            .convert_columns(&key_columns(source))
            .map_err(arrow("encode the batch's keys"))?;
        let latest = match self.dedup {
            MergeDedup::Refuse => None,
            MergeDedup::LatestBy(column) => {
                let c = source.column(column_index(source, column, "dedup", "batch")?);
                Some(
                    arrow_ord::ord::make_comparator(c, c, SortOptions::default())
                        .map_err(arrow("compare the dedup column"))?,
                )
            }
        };
        let mut chosen: HashMap<arrow_row::Row<'_>, u32> = HashMap::with_capacity(rows.num_rows());
        let mut duplicates = false;
        for r in 0..rows.num_rows() {
            let row = u32::try_from(r).unwrap_or(u32::MAX);
            match chosen.entry(rows.row(r)) {
                Entry::Vacant(v) => {
                    v.insert(row);
                }
                Entry::Occupied(mut o) => {
                    duplicates = true;
                    let Some(cmp) = &latest else {
                        return Err(PlanError::DuplicateKey {
                            key: key_text(self.keys, &key_columns(source), r),
                            first: *o.get() as usize,
                            second: r,
                        });
                    };
                    // Nulls sort first, so a null never wins; equal values: the later row.
                    if cmp(r, *o.get() as usize) != Ordering::Less {
                        o.insert(row);
                    }
                }
            }
        }
        if !duplicates {
            return Ok(source.clone());
        }
        let mut keep: Vec<u32> = chosen.into_values().collect();
        keep.sort_unstable();
        counts.deduplicated = (source.num_rows() - keep.len()) as u64;
        arrow_select::take::take_record_batch(source, &UInt32Array::from(keep))
            .map_err(arrow("keep the latest row of each key"))
    }
}

/// Key → row of `rows` (unique by construction: the batch is deduplicated first).
fn index(rows: &Rows) -> HashMap<arrow_row::Row<'_>, u32> {
    let mut map = HashMap::with_capacity(rows.num_rows());
    for r in 0..rows.num_rows() {
        map.insert(rows.row(r), u32::try_from(r).unwrap_or(u32::MAX));
    }
    map
}

/// `column` with the type of `like` (a table written by another writer may differ, e.g. in a
/// timestamp's zone label).
/// The least and greatest value of an integer key column without nulls (a null key matches a
/// null key, which no range describes); `None` for other columns.
fn int_range(column: &ArrayRef) -> Result<Option<(i64, i64)>, PlanError> {
    use arrow_schema::DataType as D;
    if column.is_empty()
        || column.null_count() > 0
        || !matches!(column.data_type(), D::Int8 | D::Int16 | D::Int32 | D::Int64)
    {
        return Ok(None);
    }
    let wide = arrow_cast::cast(column, &D::Int64).map_err(arrow("widen a key column"))?;
    let values = wide
        .as_primitive::<arrow_array::types::Int64Type>()
        .values();
    let lo = values.iter().copied().min();
    let hi = values.iter().copied().max();
    Ok(lo.zip(hi))
}

fn cast_to(column: &ArrayRef, like: &ArrayRef) -> Result<ArrayRef, PlanError> {
    if column.data_type() == like.data_type() {
        Ok(Arc::clone(column))
    } else {
        arrow_cast::cast(column, like.data_type())
            .map_err(arrow("cast a table column to the batch's type"))
    }
}

/// `order_id=7, region="eu"`: the key of row `row`, for the duplicate-key error.
fn key_text(names: &[String], columns: &[ArrayRef], row: usize) -> String {
    let options = FormatOptions::default().with_null("null");
    names
        .iter()
        .zip(columns)
        .map(|(name, column)| {
            let value = ArrayFormatter::try_new(column.as_ref(), &options)
                .map(|f| f.value(row).to_string())
                .unwrap_or_else(|_| "?".into());
            if column.data_type() == &arrow_schema::DataType::Utf8 {
                format!("{name}={value:?}")
            } else {
                format!("{name}={value}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::spec::{RowCondition, Sides};

    /// The conditions of the clauses given, planned for [`batch`]'s schema.
    fn conditions(update: Option<&str>, delete: Option<&str>, insert: Option<&str>) -> Conditions {
        let schema = batch(&[]).schema();
        let plan = |text: Option<&str>, sides| {
            text.map(|t| {
                let c = RowCondition::parse(t, sides).unwrap();
                (c.plan(&schema).unwrap(), t.to_owned())
            })
        };
        Conditions {
            delete: plan(delete, Sides::Both),
            update: plan(update, Sides::Both),
            insert: plan(insert, Sides::SourceOnly),
        }
    }

    /// A table in memory: a list of files.
    #[derive(Default)]
    struct Files {
        files: Vec<RecordBatch>,
        rewritten: Vec<usize>,
        inserted: Vec<RecordBatch>,
        /// Whether the table records key ranges (as Delta's statistics).
        with_ranges: bool,
        /// Files read, in order.
        reads: Vec<usize>,
    }

    impl Target for Files {
        type Error = PlanError;
        fn files(&self) -> usize {
            self.files.len()
        }
        fn key_range(&self, file: usize, column: &str) -> Option<(i64, i64)> {
            if !self.with_ranges {
                return None;
            }
            let b = &self.files[file];
            let c = b.column(b.schema().index_of(column).ok()?);
            int_range(c).ok().flatten()
        }
        fn read(
            &mut self,
            file: usize,
            columns: Option<&[&str]>,
        ) -> Result<RecordBatch, PlanError> {
            self.reads.push(file);
            let b = &self.files[file];
            Ok(match columns {
                None => b.clone(),
                Some(names) => {
                    let idx: Vec<usize> = names
                        .iter()
                        .map(|n| b.schema().index_of(n).unwrap())
                        .collect();
                    b.project(&idx).unwrap()
                }
            })
        }
        fn rewrite(&mut self, file: usize, rows: RecordBatch) -> Result<(), PlanError> {
            self.files[file] = rows;
            self.rewritten.push(file);
            Ok(())
        }
        fn insert(&mut self, rows: RecordBatch) -> Result<(), PlanError> {
            self.inserted.push(rows.clone());
            self.files.push(rows);
            Ok(())
        }
    }

    fn batch(rows: &[(i64, &str, i64)]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("status", DataType::Utf8, true),
            Field::new("at", DataType::Int64, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
            ],
        )
        .unwrap()
    }

    fn contents(files: &Files) -> Vec<(i64, String, i64)> {
        let mut out = Vec::new();
        for b in &files.files {
            let id = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let s = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
            let at = b.column(2).as_any().downcast_ref::<Int64Array>().unwrap();
            for r in 0..b.num_rows() {
                out.push((id.value(r), s.value(r).to_owned(), at.value(r)));
            }
        }
        out.sort();
        out
    }

    fn rows(v: &[(i64, &str, i64)]) -> Vec<(i64, String, i64)> {
        v.iter()
            .map(|(a, b, c)| (*a, (*b).to_owned(), *c))
            .collect()
    }

    #[test]
    fn files_whose_key_ranges_miss_the_batch_are_not_read() {
        let keys = vec!["id".to_owned()];
        let plan = Plan {
            keys: &keys,
            conditions: &Conditions::default(),
            dedup: &MergeDedup::Refuse,
        };
        let table = vec![
            batch(&[(1, "old", 1), (5, "old", 1)]),
            batch(&[(10, "old", 1), (20, "old", 1)]),
            batch(&[(30, "old", 1), (40, "old", 1)]),
        ];
        // Keys 12 and 20 fall only in the second file's range 10..=20.
        let source = batch(&[(20, "new", 2), (12, "new", 2)]);
        let mut pruned = Files {
            files: table.clone(),
            with_ranges: true,
            ..Files::default()
        };
        let counts = plan.run(&source, &mut pruned).unwrap();
        assert_eq!(
            pruned.reads,
            vec![1, 1],
            "the key columns, then the whole file"
        );
        assert_eq!(
            (counts.updated, counts.inserted, counts.files_pruned),
            (1, 1, 2)
        );
        // The same result as reading every file.
        let mut every = Files {
            files: table,
            ..Files::default()
        };
        let all = plan.run(&source, &mut every).unwrap();
        assert_eq!(every.reads, vec![0, 1, 1, 2]);
        assert_eq!((all.updated, all.inserted, all.files_pruned), (1, 1, 0));
        assert_eq!(contents(&pruned), contents(&every));
        // A null key in the batch matches a null in any file: nothing is pruned.
        let with_null = RecordBatch::try_new(
            source.schema(),
            vec![
                Arc::new(Int64Array::from(vec![Some(20), None])),
                Arc::new(StringArray::from_iter_values(["new", "new"])),
                Arc::new(Int64Array::from_iter_values([2, 2])),
            ],
        )
        .unwrap();
        let mut files = Files {
            files: every.files.clone(),
            with_ranges: true,
            ..Files::default()
        };
        let counts = plan.run(&with_null, &mut files).unwrap();
        assert_eq!(counts.files_pruned, 0);
    }

    #[test]
    fn newer_rows_update_older_ones_and_untouched_files_stay() {
        let keys = vec!["id".to_owned()];
        let conditions = conditions(Some("s.at > t.at"), None, None);
        let plan = Plan {
            keys: &keys,
            conditions: &conditions,
            dedup: &MergeDedup::Refuse,
        };
        let mut files = Files {
            files: vec![
                batch(&[(1, "new", 10), (2, "new", 10)]),
                batch(&[(3, "new", 10)]),
            ],
            ..Files::default()
        };
        // 1: newer → update; 2: older → skipped; 4: new → insert; file 1 (key 3) untouched.
        let counts = plan
            .run(
                &batch(&[(1, "paid", 11), (2, "stale", 9), (4, "new", 1)]),
                &mut files,
            )
            .unwrap();
        assert_eq!(
            counts,
            MergeCounts {
                updated: 1,
                inserted: 1,
                deleted: 0,
                skipped: 1,
                deduplicated: 0,
                files_pruned: 0
            }
        );
        assert_eq!(files.rewritten, vec![0]);
        assert_eq!(
            contents(&files),
            rows(&[
                (1, "paid", 11),
                (2, "new", 10),
                (3, "new", 10),
                (4, "new", 1)
            ])
        );
    }

    #[test]
    fn deletes_come_before_updates_and_inserts_have_their_own_condition() {
        let keys = vec!["id".to_owned()];
        let clauses = conditions(
            Some("s.at > t.at AND t.status <> 'final'"),
            Some("s.status = 'cancelled'"),
            Some("s.status <> 'cancelled' AND s.at % 2 = 0"),
        );
        let plan = Plan {
            keys: &keys,
            conditions: &clauses,
            dedup: &MergeDedup::Refuse,
        };
        let mut files = Files {
            files: vec![
                batch(&[(1, "new", 10), (2, "final", 10), (3, "new", 10)]),
                batch(&[(4, "new", 10)]),
            ],
            ..Files::default()
        };
        let counts = plan
            .run(
                &batch(&[
                    (1, "paid", 11),     // newer: update
                    (2, "paid", 11),     // the table's row is final: skipped
                    (3, "cancelled", 1), // deleted, though older (delete comes first)
                    (5, "new", 2),       // new, even: inserted
                    (6, "new", 3),       // new, odd: not inserted
                    (7, "cancelled", 4), // new but cancelled: not inserted
                ]),
                &mut files,
            )
            .unwrap();
        assert_eq!(
            counts,
            MergeCounts {
                updated: 1,
                inserted: 1,
                deleted: 1,
                skipped: 3,
                deduplicated: 0,
                files_pruned: 0
            }
        );
        assert_eq!(files.rewritten, vec![0], "file 1 (key 4) is untouched");
        assert_eq!(
            contents(&files),
            rows(&[
                (1, "paid", 11),
                (2, "final", 10),
                (4, "new", 10),
                (5, "new", 2)
            ])
        );
        // A file whose every row is deleted is rewritten empty.
        let delete_all = conditions(None, Some("true"), None);
        let counts = Plan {
            keys: &keys,
            conditions: &delete_all,
            dedup: &MergeDedup::Refuse,
        }
        .run(&batch(&[(4, "x", 0)]), &mut files)
        .unwrap();
        assert_eq!((counts.deleted, counts.updated, counts.inserted), (1, 0, 0));
        assert_eq!(files.files[1].num_rows(), 0);
    }

    #[test]
    fn a_condition_that_fails_names_its_clause() {
        let keys = vec!["id".to_owned()];
        let conditions = conditions(Some("CAST(s.status AS INT) > t.at"), None, None);
        let plan = Plan {
            keys: &keys,
            conditions: &conditions,
            dedup: &MergeDedup::Refuse,
        };
        let mut files = Files {
            files: vec![batch(&[(1, "new", 10)])],
            ..Files::default()
        };
        let Err(RunError::Plan(err)) = plan.run(&batch(&[(1, "paid", 11)]), &mut files) else {
            panic!("a cast of 'paid' to INT holds")
        };
        let text = err.to_string();
        assert!(
            text.starts_with(
                "the when_matched_update condition \"CAST(s.status AS INT) > t.at\" failed: "
            ),
            "{text}"
        );
    }

    #[test]
    fn duplicate_keys_are_refused_with_delta_s_words_and_the_key() {
        let keys = vec!["id".to_owned(), "status".to_owned()];
        let plan = Plan {
            keys: &keys,
            conditions: &Conditions::default(),
            dedup: &MergeDedup::Refuse,
        };
        let err = plan
            .run(
                &batch(&[(1, "a", 1), (2, "a", 1), (1, "a", 2)]),
                &mut Files::default(),
            )
            .unwrap_err();
        let RunError::Plan(err) = err else {
            panic!("{err:?}")
        };
        assert_eq!(
            err.to_string(),
            "Cannot perform Merge as multiple source rows matched and attempted to modify the same target row in the Delta table in possibly conflicting ways. The key id=1, status=\"a\" is in rows 0 and 2 of the batch; set dedup = \"latest-by:<column>\" to keep the latest of them"
        );
    }

    #[test]
    fn latest_by_keeps_the_greatest_and_of_ties_the_last() {
        let keys = vec!["id".to_owned()];
        let dedup = MergeDedup::LatestBy("at".into());
        let plan = Plan {
            keys: &keys,
            conditions: &Conditions::default(),
            dedup: &dedup,
        };
        let mut files = Files {
            files: vec![batch(&[(1, "old", 0)])],
            ..Files::default()
        };
        let counts = plan
            .run(
                &batch(&[
                    (1, "b", 5),
                    (1, "c", 7),
                    (1, "a", 3),
                    (2, "x", 1),
                    (2, "y", 1),
                ]),
                &mut files,
            )
            .unwrap();
        assert_eq!(counts.deduplicated, 3);
        assert_eq!(contents(&files), rows(&[(1, "c", 7), (2, "y", 1)]));
    }

    #[test]
    fn a_missing_key_column_is_named() {
        let keys = vec!["order_id".to_owned()];
        let plan = Plan {
            keys: &keys,
            conditions: &Conditions::default(),
            dedup: &MergeDedup::Refuse,
        };
        let Err(RunError::Plan(err)) = plan.run(&batch(&[(1, "a", 1)]), &mut Files::default())
        else {
            panic!("the missing column is not reported")
        };
        assert_eq!(
            err.to_string(),
            "the key column \"order_id\" is not a column of the batch (id, status, at)"
        );
    }
}
