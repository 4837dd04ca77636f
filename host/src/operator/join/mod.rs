//! Stream-static joins: each batch of the stream joined with a static table (`[join]` with a
//! `[[table]]` on one side), Spark's `orders.join(customers, "customer_id", "left")`.
//!
//! A hash join on Arrow. The table is the build side: its key columns are encoded once per
//! snapshot with `arrow-row` (one comparable byte string per row, whatever the key types) into a
//! map key → first row, duplicates chained through one `next` array, so building allocates once
//! per distinct key and probing allocates nothing per row. Each batch is the probe side: its keys
//! are encoded the same way and looked up, giving aligned lists of (stream row, table row)
//! pairs; the optional condition is evaluated once over the pairs' `take`n columns; the output is
//! built with `take` (and nulls for the stream rows an outer join keeps unmatched). A null key
//! matches nothing, as in SQL.
//!
//! Which types a stream-static join allows follows Spark: with the stream on the left inner,
//! left outer, left semi and left anti; with the stream on the right inner and right outer (the
//! outer side is always the stream: a static side's unmatched rows would have to be emitted in
//! every batch). `spec::validate` refuses the others before anything runs.

mod stream;
mod table;

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::UInt32Type;
use arrow_array::{ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array};
use arrow_buffer::NullBuffer;
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{ArrowError, Field, Schema, SchemaRef};

use crate::plugin::BatchInfo;
use crate::spec::{JoinSpec, JoinType};
use crate::sql::{ConditionPlan, PlanError};

pub use stream::{
    Eviction, JoinInput, OPERATOR as STREAM_JOIN_OPERATOR, StreamJoin, StreamJoinState,
    eviction_rules, evictions,
};
pub use table::{StaticTable, TableError, TableSnapshot};

/// A join that cannot be planned or failed a batch.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("join {left} with {right}: {message}")]
    Plan {
        left: String,
        right: String,
        message: String,
    },
    #[error("join {left} with {right}: the condition: {source}")]
    Condition {
        left: String,
        right: String,
        source: Box<PlanError>,
    },
    #[error("join {left} with {right}, batch {batch_id}: {message}")]
    Batch {
        left: String,
        right: String,
        batch_id: u64,
        message: String,
    },
    #[error(transparent)]
    Table(#[from] TableError),
    #[error("join {left} with {right}: {source}")]
    State {
        left: String,
        right: String,
        source: crate::state::StateError,
    },
}

impl JoinError {
    /// Whether running the batch again may succeed: a table that could not be read may be
    /// readable later; the rest fails again on the same rows.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Table(e) => e.is_retryable(),
            Self::State { .. } => true,
            Self::Plan { .. } | Self::Condition { .. } | Self::Batch { .. } => false,
        }
    }
}

/// What the stream's rows become, whichever side the stream is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Matched pairs only.
    Inner,
    /// Matched pairs, and unmatched stream rows with nulls for the table's columns.
    StreamOuter,
    /// Stream rows with at least one match, once each, stream columns only.
    Semi,
    /// Stream rows with no match, stream columns only.
    Anti,
}

/// The output schema of `spec` for a left and a right input of these schemas: the `on` columns,
/// then the left input's other columns, then the right's (only the left's for semi and anti
/// joins), as Spark's `join(other, usingColumns, type)` lays them out. The side that may lack a
/// match has its columns nullable.
///
/// # Errors
/// A sentence naming the problem: an `on` column missing from a side, or of other types on the
/// two sides, or another column name on both sides.
pub fn output_schema(
    spec: &JoinSpec,
    left: &SchemaRef,
    right: &SchemaRef,
) -> Result<SchemaRef, String> {
    let mut fields: Vec<Field> = Vec::new();
    for key in &spec.on {
        let l = left.field_with_name(key).map_err(|_| {
            format!(
                "the join column {key:?} is not a column of {} ({})",
                spec.left,
                names(left)
            )
        })?;
        let r = right.field_with_name(key).map_err(|_| {
            format!(
                "the join column {key:?} is not a column of {} ({})",
                spec.right,
                names(right)
            )
        })?;
        if l.data_type() != r.data_type() {
            return Err(format!(
                "the join column {key:?} is {} in {} and {} in {}: CAST one of them in a [[transform]] sql of that input",
                l.data_type(),
                spec.left,
                r.data_type(),
                spec.right
            ));
        }
        // The stream's key: it is there for every output row (the outer side is the stream).
        fields.push(Field::new(key, l.data_type().clone(), true));
    }
    let others = |s: &SchemaRef| -> Vec<Field> {
        s.fields()
            .iter()
            .filter(|f| !spec.on.contains(f.name()))
            .map(|f| Field::new(f.name(), f.data_type().clone(), true))
            .collect()
    };
    let (l_others, r_others) = (others(left), others(right));
    if let Some(both) = l_others
        .iter()
        .find(|l| r_others.iter().any(|r| r.name() == l.name()))
    {
        return Err(format!(
            "the column {:?} is in both {} and {}: rename it on one side with a [[transform]] sql with input = that side, or add it to `on`",
            both.name(),
            spec.left,
            spec.right
        ));
    }
    fields.extend(l_others);
    if !matches!(spec.kind, JoinType::LeftSemi | JoinType::LeftAnti) {
        fields.extend(r_others);
    }
    Ok(Arc::new(Schema::new(fields)))
}

fn names(s: &SchemaRef) -> String {
    s.fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The table side, built once per snapshot.
struct Built {
    snapshot: TableSnapshot,
    rows: RecordBatch,
    /// Key bytes → the first table row with that key.
    heads: HashMap<Box<[u8]>, u32>,
    /// For each table row, the next row with the same key (`u32::MAX`: none).
    next: Vec<u32>,
}

/// A stream-static join as the query runs it.
pub struct StaticJoin {
    spec: JoinSpec,
    table: StaticTable,
    /// Whether the stream is the left input.
    stream_left: bool,
    mode: Mode,
    stream_schema: SchemaRef,
    output: SchemaRef,
    /// The `on` columns' positions in the stream's and the table's batches.
    stream_keys: Vec<usize>,
    table_keys: Vec<usize>,
    /// The other columns' positions, in output order.
    stream_others: Vec<usize>,
    table_others: Vec<usize>,
    converter: RowConverter,
    condition: Option<ConditionPlan>,
    built: Option<Built>,
    /// How many times the table was read (once per snapshot joined, not per batch).
    reads: u64,
}

impl std::fmt::Debug for StaticJoin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticJoin")
            .field("spec", &self.spec)
            .field("output", &self.output)
            .finish_non_exhaustive()
    }
}

impl StaticJoin {
    /// Plans the join of batches of `stream_schema` with `table`.
    ///
    /// # Errors
    /// [`JoinError::Plan`] or [`JoinError::Condition`] naming the problem.
    pub fn new(
        spec: JoinSpec,
        table: StaticTable,
        stream_schema: SchemaRef,
    ) -> Result<Self, JoinError> {
        let stream_left = spec.right == table.name();
        let plan_err = |message: String| JoinError::Plan {
            left: spec.left.clone(),
            right: spec.right.clone(),
            message,
        };
        let mode = match (spec.kind, stream_left) {
            (JoinType::Inner, _) => Mode::Inner,
            (JoinType::Left, true) | (JoinType::Right, false) => Mode::StreamOuter,
            (JoinType::LeftSemi, true) => Mode::Semi,
            (JoinType::LeftAnti, true) => Mode::Anti,
            (kind, _) => {
                return Err(plan_err(format!(
                    "a {} join with the stream on the {} is not supported (Spark refuses it too)",
                    kind.name(),
                    if stream_left { "left" } else { "right" }
                )));
            }
        };
        let table_schema = table.schema().clone();
        let (left, right) = if stream_left {
            (&stream_schema, &table_schema)
        } else {
            (&table_schema, &stream_schema)
        };
        let output = output_schema(&spec, left, right).map_err(plan_err)?;
        let position = |s: &SchemaRef, key: &str| {
            s.index_of(key)
                .map_err(|e| plan_err(format!("the join column {key:?}: {e}")))
        };
        let stream_keys = spec
            .on
            .iter()
            .map(|k| position(&stream_schema, k))
            .collect::<Result<Vec<_>, _>>()?;
        let table_keys = spec
            .on
            .iter()
            .map(|k| position(&table_schema, k))
            .collect::<Result<Vec<_>, _>>()?;
        let others = |s: &SchemaRef| -> Vec<usize> {
            s.fields()
                .iter()
                .enumerate()
                .filter(|(_, f)| !spec.on.contains(f.name()))
                .map(|(i, _)| i)
                .collect()
        };
        let stream_others = others(&stream_schema);
        let table_others = others(&table_schema);
        let converter = RowConverter::new(
            stream_keys
                .iter()
                .map(|i| SortField::new(stream_schema.field(*i).data_type().clone()))
                .collect(),
        )
        .map_err(|e| plan_err(format!("cannot encode the join keys: {e}")))?;
        let condition = spec
            .condition
            .as_ref()
            .map(|c| {
                c.plan_two(left, right)
                    .map_err(|source| JoinError::Condition {
                        left: spec.left.clone(),
                        right: spec.right.clone(),
                        source: Box::new(source),
                    })
            })
            .transpose()?;
        Ok(Self {
            spec,
            table,
            stream_left,
            mode,
            stream_schema,
            output,
            stream_keys,
            table_keys,
            stream_others,
            table_others,
            converter,
            condition,
            built: None,
            reads: 0,
        })
    }

    /// The name used in errors, logs and progress.
    pub fn name(&self) -> String {
        format!("join {} with {}", self.spec.left, self.spec.right)
    }

    /// The schema of the joined batches.
    pub fn output_schema(&self) -> &SchemaRef {
        &self.output
    }

    /// What the table is now, for `offsets/N` of the batch being planned (cheap: a listing or
    /// the Delta log's newest version, no rows read).
    ///
    /// # Errors
    /// When the table cannot be looked at.
    pub fn current_snapshot(&self) -> Result<TableSnapshot, JoinError> {
        Ok(self.table.current_snapshot()?)
    }

    /// Makes sure the table is the one `recorded` for this batch (read and built again only
    /// when it is another snapshot than the one held).
    ///
    /// # Errors
    /// When the table cannot be read, is too large, or does not fit the planned schema.
    pub fn prepare(&mut self, recorded: Option<&TableSnapshot>) -> Result<(), JoinError> {
        let wanted = match recorded {
            Some(r) => r.clone(),
            // A batch planned before this query had a join: the table as it is now.
            None => self.table.current_snapshot()?,
        };
        if self
            .built
            .as_ref()
            .is_some_and(|b| b.snapshot.same_state(&wanted))
        {
            return Ok(());
        }
        self.built = None;
        let (snapshot, rows) = self.table.read(&wanted)?;
        self.reads += 1;
        self.built = Some(self.build(snapshot, rows)?);
        Ok(())
    }

    fn build(&self, snapshot: TableSnapshot, rows: RecordBatch) -> Result<Built, JoinError> {
        let keys: Vec<ArrayRef> = self
            .table_keys
            .iter()
            .map(|i| Arc::clone(rows.column(*i)))
            .collect();
        let encoded = self
            .converter
            .convert_columns(&keys)
            .map_err(|e| self.plan_err(format!("cannot encode the table's keys: {e}")))?;
        let valid = key_nulls(&keys);
        let n = rows.num_rows();
        let mut heads: HashMap<Box<[u8]>, u32> = HashMap::with_capacity(n);
        let mut next = vec![u32::MAX; n];
        // Backwards, so that each chain lists its rows in table order.
        for row in (0..n).rev() {
            if valid.as_ref().is_some_and(|v| v.is_null(row)) {
                continue;
            }
            let row_u32 = u32::try_from(row).map_err(|_| {
                self.plan_err(format!(
                    "table {} has more than 2^32 rows",
                    self.table.name()
                ))
            })?;
            let key = encoded.row(row);
            match heads.get_mut(key.as_ref()) {
                Some(head) => {
                    next[row] = *head;
                    *head = row_u32;
                }
                None => {
                    heads.insert(key.as_ref().into(), row_u32);
                }
            }
        }
        tracing::info!(
            table = self.table.name(),
            rows = n,
            keys = heads.len(),
            bytes = rows.get_array_memory_size(),
            "static table read for {}",
            self.name()
        );
        Ok(Built {
            snapshot,
            rows,
            heads,
            next,
        })
    }

    fn plan_err(&self, message: String) -> JoinError {
        JoinError::Plan {
            left: self.spec.left.clone(),
            right: self.spec.right.clone(),
            message,
        }
    }

    /// Joins one batch of the stream with the table.
    ///
    /// # Errors
    /// [`JoinError::Batch`] when the batch is not of the planned schema or the condition fails
    /// on a pair (a failed cast, a division by zero, …).
    pub fn process(
        &mut self,
        batch: &RecordBatch,
        info: &BatchInfo,
    ) -> Result<RecordBatch, JoinError> {
        if self.built.is_none() {
            self.prepare(None)?;
        }
        let fail = |message: String| JoinError::Batch {
            left: self.spec.left.clone(),
            right: self.spec.right.clone(),
            batch_id: info.batch_id,
            message,
        };
        if batch.schema().fields() != self.stream_schema.fields() {
            return Err(fail(format!(
                "the stream's columns changed to ({}); restart the query to plan it again",
                names(batch.schema_ref())
            )));
        }
        let Some(built) = &self.built else {
            return Err(fail("the table is not read".into()));
        };
        let arrow = |op: &str| {
            let op = op.to_owned();
            move |e: ArrowError| fail(format!("cannot {op}: {e}"))
        };
        let keys: Vec<ArrayRef> = self
            .stream_keys
            .iter()
            .map(|i| Arc::clone(batch.column(*i)))
            .collect();
        let encoded: Rows = self
            .converter
            .convert_columns(&keys)
            .map_err(arrow("encode the batch's keys"))?;
        let valid = key_nulls(&keys);
        // Every candidate pair, in stream order.
        let rows = batch.num_rows();
        let mut stream_idx: Vec<u32> = Vec::with_capacity(rows);
        let mut table_idx: Vec<u32> = Vec::with_capacity(rows);
        for row in 0..rows {
            if valid.as_ref().is_some_and(|v| v.is_null(row)) {
                continue;
            }
            let Some(&first) = built.heads.get(encoded.row(row).as_ref()) else {
                continue;
            };
            let row = u32::try_from(row).map_err(|_| fail("more than 2^32 rows".into()))?;
            let mut t = first;
            while t != u32::MAX {
                stream_idx.push(row);
                table_idx.push(t);
                t = built.next[t as usize];
            }
        }
        let mut stream_idx = UInt32Array::from(stream_idx);
        let mut table_idx = UInt32Array::from(table_idx);
        if let Some(condition) = &self.condition {
            let holds = self
                .condition_holds(condition, batch, &built.rows, &stream_idx, &table_idx)
                .map_err(&fail)?;
            let keep = |idx: &UInt32Array| -> Result<UInt32Array, JoinError> {
                let kept =
                    arrow_select::filter::filter(idx, &holds).map_err(arrow("filter the pairs"))?;
                Ok(kept.as_primitive::<UInt32Type>().clone())
            };
            stream_idx = keep(&stream_idx)?;
            table_idx = keep(&table_idx)?;
        }
        let (stream_idx, table_idx): (UInt32Array, Option<UInt32Array>) = match self.mode {
            Mode::Inner => (stream_idx, Some(table_idx)),
            Mode::StreamOuter => {
                // Each stream row's pairs, or one row with a null table side when it has none.
                let mut s_out: Vec<u32> = Vec::with_capacity(stream_idx.len() + rows);
                let mut t_out: Vec<Option<u32>> = Vec::with_capacity(stream_idx.len() + rows);
                let mut pair = 0;
                for row in 0..rows {
                    let row = row as u32;
                    let before = pair;
                    while pair < stream_idx.len() && stream_idx.value(pair) == row {
                        s_out.push(row);
                        t_out.push(Some(table_idx.value(pair)));
                        pair += 1;
                    }
                    if pair == before {
                        s_out.push(row);
                        t_out.push(None);
                    }
                }
                (UInt32Array::from(s_out), Some(UInt32Array::from(t_out)))
            }
            Mode::Semi | Mode::Anti => {
                let mut matched = vec![false; rows];
                for s in stream_idx.values() {
                    matched[*s as usize] = true;
                }
                let want = self.mode == Mode::Semi;
                let keep: Vec<u32> = (0..rows)
                    .filter(|r| matched[*r] == want)
                    .map(|r| r as u32)
                    .collect();
                (UInt32Array::from(keep), None)
            }
        };
        let take = |array: &ArrayRef, idx: &UInt32Array| {
            arrow_select::take::take(array.as_ref(), idx, None)
                .map_err(arrow("take the joined rows"))
        };
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.output.fields().len());
        for i in &self.stream_keys {
            columns.push(take(batch.column(*i), &stream_idx)?);
        }
        let stream_others = self
            .stream_others
            .iter()
            .map(|i| take(batch.column(*i), &stream_idx))
            .collect::<Result<Vec<_>, _>>()?;
        let table_others = match &table_idx {
            Some(idx) => self
                .table_others
                .iter()
                .map(|i| take(built.rows.column(*i), idx))
                .collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
        if self.stream_left {
            columns.extend(stream_others);
            columns.extend(table_others);
        } else {
            columns.extend(table_others);
            columns.extend(stream_others);
        }
        RecordBatch::try_new_with_options(
            Arc::clone(&self.output),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(stream_idx.len())),
        )
        .map_err(arrow("assemble the joined batch"))
    }

    /// Whether the condition holds for each candidate pair (NULL: it does not).
    fn condition_holds(
        &self,
        condition: &ConditionPlan,
        batch: &RecordBatch,
        table: &RecordBatch,
        stream_idx: &UInt32Array,
        table_idx: &UInt32Array,
    ) -> Result<BooleanArray, String> {
        // The condition's "source" columns are the left input's, its "target" the right's.
        let (left, left_idx, right, right_idx) = if self.stream_left {
            (batch, stream_idx, table, table_idx)
        } else {
            (table, table_idx, batch, stream_idx)
        };
        let pick = |rows: &RecordBatch, idx: &UInt32Array, names: &[String]| {
            names
                .iter()
                .map(|name| {
                    let column = rows
                        .column_by_name(name)
                        .ok_or_else(|| format!("the condition's column {name} is missing"))?;
                    arrow_select::take::take(column.as_ref(), idx, None).map_err(|e| e.to_string())
                })
                .collect::<Result<Vec<_>, String>>()
        };
        let source = pick(left, left_idx, condition.source_columns())?;
        let target = pick(right, right_idx, condition.target_columns())?;
        condition.evaluate(stream_idx.len(), source, target)
    }

    /// How many times the table was read so far.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// The table's name.
    pub fn table_name(&self) -> &str {
        self.table.name()
    }

    /// Whether `name` is the stream side of this join.
    pub fn is_stream(&self, name: &str) -> bool {
        if self.stream_left {
            self.spec.left == name
        } else {
            self.spec.right == name
        }
    }
}

/// The rows with a null in some key column (they match nothing); `None` when there is none.
fn key_nulls(keys: &[ArrayRef]) -> Option<NullBuffer> {
    keys.iter()
        .fold(None, |acc, k| {
            NullBuffer::union(acc.as_ref(), k.logical_nulls().as_ref())
        })
        .filter(|n| n.null_count() > 0)
}

#[cfg(test)]
mod tests;
