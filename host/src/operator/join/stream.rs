//! Stream-stream joins: two `[[source]]`s joined in `[join]`, Spark's
//! `clicks.join(orders, expr("... AND orders.occurred_at BETWEEN clicks.clicked_at AND
//! clicks.clicked_at + interval 1 hour"))`, run as Spark 4's `StreamingSymmetricHashJoinExec`.
//!
//! Every row of either input may meet a row of the other that arrives later, so both inputs are
//! buffered: each batch, the left input's new rows are joined with the right input's buffer and
//! then buffered; the right's new rows are joined with the left's buffer (now holding the left's
//! new rows too, so each pair is found once) and buffered. What the watermarks and the condition
//! say no future row can match is then evicted; an outer join emits its unmatched rows with
//! nulls when they are evicted, in the batch Spark emits them. Rows at or below the previous
//! batch's watermark are dropped as late and counted.
//!
//! Why two copies of the buffer: the state store (RocksDB or memory, versioned by batch id,
//! partitioned by the join key, one changelog per batch) is what survives a crash; the rows it
//! holds are also kept in memory as Arrow batches with a hash index by key, so a probe costs a
//! hash lookup and the joined rows are gathered column by column (`interleave`), never decoded
//! from the store per batch. The memory copy is rebuilt from the store only when the query
//! restarts or a batch is run again.
//!
//! A state entry per buffered row: key `[side][join key, arrow-row encoded][sequence number]`,
//! value the row (arrow-row encoded); a row that found a match (what an outer join and a left
//! semi join need to know) has a marker entry beside it.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{TimestampMicrosecondType, UInt32Type};
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{ArrowError, DataType, Field, SchemaRef, TimeUnit};

use super::{JoinError, key_nulls, output_schema};
use crate::operator::partitioned::{KeyCount, PartitionedConfig, PartitionedState};
use crate::operator::stateful::{OperatorMetrics, StateSchema, StatefulContext};
use crate::spec::{JoinSpec, JoinType};
use crate::sql::ConditionPlan;
use crate::state::{StateError, StateOptions};

/// Spark's name for the operator in `stateOperators`.
pub const OPERATOR: &str = "symmetricHashJoin";

const LEFT: usize = 0;
const RIGHT: usize = 1;
/// The first byte of a matched marker's key: the side's byte plus this.
const MATCHED: u8 = 2;

/// What the query knows about one input of the join.
#[derive(Debug, Clone)]
pub struct JoinInput {
    /// Its rows' schema where they reach the join.
    pub schema: SchemaRef,
    /// Its `watermark` column, if it has one.
    pub watermark: Option<String>,
}

/// When a side's buffered rows can no longer match: rows whose `column` is at or below the
/// batch's watermark plus `offset_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eviction {
    pub column: usize,
    pub offset_ms: i64,
}

/// Which column of each side (by name) its buffered rows are let go by, and how far below the
/// watermark (ms), as Spark derives it (`getStateWatermarkPredicates`): with the watermark column
/// of either input among the `on` keys, both sides by that key; else a side by its own watermark
/// column when the condition bounds it from below by the other input's watermark column.
/// `None`: its buffer grows forever. `weir validate` asks the same to refuse an outer join whose
/// unmatched rows could never be emitted.
pub fn eviction_rules(
    spec: &JoinSpec,
    left_watermark: Option<&str>,
    right_watermark: Option<&str>,
) -> [Option<(String, i64)>; 2] {
    let key = spec.on.iter().find(|k| {
        [left_watermark, right_watermark]
            .iter()
            .any(|w| w.is_some_and(|w| w.eq_ignore_ascii_case(k)))
    });
    if let Some(key) = key {
        return [Some((key.clone(), 0)), Some((key.clone(), 0))];
    }
    let one = |this: Option<&str>, other: Option<&str>, this_is_left: bool| {
        let (this, other, condition) = (this?, other?, spec.condition.as_ref()?);
        let c = condition.lower_bound_ms(this_is_left, this, other)?;
        Some((this.to_owned(), -c))
    };
    [
        one(left_watermark, right_watermark, true),
        one(right_watermark, left_watermark, false),
    ]
}

/// [`eviction_rules`] with each column's position in its input.
///
/// # Errors
/// A sentence when a named column is missing.
pub fn evictions(
    spec: &JoinSpec,
    left: &JoinInput,
    right: &JoinInput,
) -> Result<[Option<Eviction>; 2], String> {
    let rules = eviction_rules(spec, left.watermark.as_deref(), right.watermark.as_deref());
    let mut out = [None, None];
    for (i, (rule, input)) in rules.into_iter().zip([left, right]).enumerate() {
        if let Some((column, offset_ms)) = rule {
            let column = input.schema.index_of(&column).map_err(|_| {
                format!("the column {column:?} is not where the join reads its input")
            })?;
            out[i] = Some(Eviction { column, offset_ms });
        }
    }
    Ok(out)
}

/// One buffered row: where its values are, and what the store knows it by.
#[derive(Debug)]
struct Slot {
    chunk: u32,
    row: u32,
    seq: u64,
    key: Arc<[u8]>,
    matched: bool,
    live: bool,
}

/// One input's buffer in memory.
#[derive(Debug)]
struct Side {
    name: String,
    schema: SchemaRef,
    keys: Vec<usize>,
    /// The whole row, for the store.
    rows: RowConverter,
    watermark: Option<usize>,
    eviction: Option<Eviction>,
    /// Whether its unmatched rows are emitted with nulls (an outer join's preserved side).
    outer: bool,
    /// Whether a later batch asks if its rows found a match (an outer side, a left semi join's
    /// left): a matched row then has a marker entry in the store.
    marks: bool,
    /// Columns a null in which means the row can match nothing (the condition's comparisons):
    /// such rows are dropped before the join unless the side is preserved, as Spark does.
    null_rejecting: Vec<usize>,
    chunks: Vec<Option<RecordBatch>>,
    chunk_live: Vec<u32>,
    /// The slots of each chunk, by row (a compacted chunk's rows are moved to a new one).
    chunk_slots: Vec<Vec<u32>>,
    /// The chunk the last compaction made: the next one takes its rows along, so that rows
    /// that stay for long end up in one chunk, not one per compaction.
    residue: Option<usize>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    index: HashMap<Arc<[u8]>, Vec<u32>, foldhash::fast::RandomState>,
    by_time: BTreeMap<i64, Vec<u32>>,
    next_seq: u64,
    live: u64,
}

impl Side {
    fn clear(&mut self) {
        self.chunks.clear();
        self.chunk_live.clear();
        self.chunk_slots.clear();
        self.residue = None;
        self.slots.clear();
        self.free.clear();
        self.index.clear();
        self.by_time.clear();
        self.next_seq = 0;
        self.live = 0;
    }

    fn memory_bytes(&self) -> u64 {
        let chunks: usize = self
            .chunks
            .iter()
            .flatten()
            .map(RecordBatch::get_array_memory_size)
            .sum();
        let slots = self.slots.capacity() * size_of::<Slot>();
        let index = self.index.capacity() * (size_of::<Arc<[u8]>>() + 32);
        (chunks + slots + index) as u64
    }

    /// Buffers rows `rows` of `batch` (keys `keys`), each with its matched flag.
    fn add(
        &mut self,
        batch: &RecordBatch,
        rows: &[u32],
        keys: &Rows,
        matched: &[bool],
        times: Option<&[Option<i64>]>,
    ) -> Result<Vec<u32>, ArrowError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let idx = UInt32Array::from(rows.to_vec());
        let chunk = arrow_select::take::take_record_batch(batch, &idx)?;
        let chunk_id = self.chunks.len() as u32;
        self.chunks.push(Some(chunk));
        self.chunk_live.push(rows.len() as u32);
        self.chunk_slots.push(Vec::with_capacity(rows.len()));
        let mut ids = Vec::with_capacity(rows.len());
        for (i, &row) in rows.iter().enumerate() {
            let key = keys.row(row as usize);
            let seq = self.next_seq;
            self.next_seq += 1;
            let time = times.and_then(|t| t[row as usize]);
            let id = self.insert(
                chunk_id,
                i as u32,
                seq,
                key.as_ref(),
                time,
                matched[row as usize],
            );
            ids.push(id);
        }
        Ok(ids)
    }

    fn insert(
        &mut self,
        chunk: u32,
        row: u32,
        seq: u64,
        key: &[u8],
        time: Option<i64>,
        matched: bool,
    ) -> u32 {
        let key: Arc<[u8]> = match self.index.get_key_value(key) {
            Some((k, _)) => Arc::clone(k),
            None => Arc::from(key),
        };
        let slot = Slot {
            chunk,
            row,
            seq,
            key: Arc::clone(&key),
            matched,
            live: true,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = slot;
                id
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.index.entry(key).or_default().push(id);
        self.chunk_slots[chunk as usize].push(id);
        if let Some(t) = time {
            self.by_time.entry(t).or_default().push(id);
        }
        self.live += 1;
        id
    }

    /// Removes every row whose eviction time is at or below `threshold_us`, returning them.
    fn evict(&mut self, threshold_us: i64) -> Vec<u32> {
        let keep = self.by_time.split_off(&threshold_us.saturating_add(1));
        let gone = std::mem::replace(&mut self.by_time, keep);
        let ids: Vec<u32> = gone.into_values().flatten().collect();
        for &id in &ids {
            let slot = &mut self.slots[id as usize];
            slot.live = false;
            let key = Arc::clone(&slot.key);
            let chunk = slot.chunk as usize;
            if let Some(list) = self.index.get_mut(&key) {
                list.retain(|x| *x != id);
                if list.is_empty() {
                    self.index.remove(&key);
                }
            }
            self.chunk_live[chunk] -= 1;
            self.live -= 1;
        }
        ids
    }

    /// Lets evicted slots be reused and their chunks go, once nothing refers to them any more;
    /// a chunk mostly evicted has its few remaining rows moved to a new chunk (rows that are
    /// never evicted, such as those without an event time, would otherwise keep every chunk).
    fn release(&mut self, ids: &[u32]) -> Result<(), ArrowError> {
        let mut touched: Vec<usize> = Vec::new();
        for &id in ids {
            let slot = &mut self.slots[id as usize];
            slot.key = Arc::from(&[][..]);
            touched.push(slot.chunk as usize);
            self.free.push(id);
        }
        touched.sort_unstable();
        touched.dedup();
        let compacting = touched.iter().any(|&c| {
            self.chunk_live[c] > 0 && self.chunk_live[c] as usize * 8 <= self.chunk_slots[c].len()
        });
        if compacting
            && let Some(r) = self.residue
            && self.chunk_live[r] > 0
            && !touched.contains(&r)
        {
            touched.push(r);
        }
        let mut sparse: Vec<u32> = Vec::new();
        for chunk in touched {
            let live = self.chunk_live[chunk] as usize;
            if live == 0 {
                self.chunks[chunk] = None;
                self.chunk_slots[chunk] = Vec::new();
            } else if live * 8 <= self.chunk_slots[chunk].len() || Some(chunk) == self.residue {
                let chunk_id = chunk as u32;
                let slots = &self.slots;
                sparse.extend(
                    self.chunk_slots[chunk].iter().copied().filter(|&id| {
                        slots[id as usize].live && slots[id as usize].chunk == chunk_id
                    }),
                );
            }
        }
        if sparse.is_empty() {
            return Ok(());
        }
        let columns = self.gather(&sparse)?;
        let batch = RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(sparse.len())),
        )?;
        let new_chunk = self.chunks.len() as u32;
        for (row, &id) in sparse.iter().enumerate() {
            let old = self.slots[id as usize].chunk as usize;
            self.chunk_live[old] -= 1;
            if self.chunk_live[old] == 0 {
                self.chunks[old] = None;
                self.chunk_slots[old] = Vec::new();
            }
            let slot = &mut self.slots[id as usize];
            slot.chunk = new_chunk;
            slot.row = row as u32;
        }
        self.residue = Some(self.chunks.len());
        self.chunks.push(Some(batch));
        self.chunk_live.push(sparse.len() as u32);
        self.chunk_slots.push(sparse);
        Ok(())
    }

    /// The columns of buffered rows `ids`, in order.
    fn gather(&self, ids: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        let all: Vec<usize> = (0..self.schema.fields().len()).collect();
        self.gather_columns(ids, &all)
    }

    /// Columns `columns` of buffered rows `ids`, in order.
    fn gather_columns(&self, ids: &[u32], columns: &[usize]) -> Result<Vec<ArrayRef>, ArrowError> {
        let mut positions: HashMap<u32, usize> = HashMap::new();
        let mut chunks: Vec<&RecordBatch> = Vec::new();
        let mut indices: Vec<(usize, usize)> = Vec::with_capacity(ids.len());
        for &id in ids {
            let slot = &self.slots[id as usize];
            let position = *positions.entry(slot.chunk).or_insert_with(|| {
                chunks.push(
                    self.chunks[slot.chunk as usize]
                        .as_ref()
                        .unwrap_or_else(|| unreachable!("a live row's chunk is kept")),
                );
                chunks.len() - 1
            });
            indices.push((position, slot.row as usize));
        }
        columns
            .iter()
            .map(|&c| {
                if chunks.is_empty() {
                    return Ok(arrow_array::new_empty_array(
                        self.schema.field(c).data_type(),
                    ));
                }
                let arrays: Vec<&dyn Array> = chunks.iter().map(|b| b.column(c).as_ref()).collect();
                arrow_select::interleave::interleave(&arrays, &indices)
            })
            .collect()
    }
}

/// `[side][join key][seq]` into `out`.
fn write_store_key(out: &mut Vec<u8>, side: u8, key: &[u8], seq: u64) {
    out.clear();
    out.push(side);
    out.extend_from_slice(key);
    out.extend_from_slice(&seq.to_be_bytes());
}

/// Where the rows of one side of a batch come from.
enum Rows2<'a> {
    /// Rows of this batch's input.
    New(&'a RecordBatch),
    /// Buffered rows.
    Buffered(&'a Side),
}

impl Rows2<'_> {
    /// Every column of rows `idx`.
    fn columns(&self, idx: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        let all: Vec<usize> = (0..self.schema().fields().len()).collect();
        self.columns_at(idx, &all)
    }

    /// Columns `columns` of rows `idx`.
    fn columns_at(&self, idx: &[u32], columns: &[usize]) -> Result<Vec<ArrayRef>, ArrowError> {
        match self {
            Self::New(batch) => {
                let idx = UInt32Array::from(idx.to_vec());
                columns
                    .iter()
                    .map(|&c| arrow_select::take::take(batch.column(c).as_ref(), &idx, None))
                    .collect()
            }
            Self::Buffered(side) => side.gather_columns(idx, columns),
        }
    }

    fn schema(&self) -> SchemaRef {
        match self {
            Self::New(batch) => batch.schema(),
            Self::Buffered(side) => Arc::clone(&side.schema),
        }
    }
}

/// The join's figures since the last commit.
#[derive(Debug, Default, Clone, Copy)]
struct Figures {
    added: u64,
    removed: u64,
    dropped: u64,
}

/// A buffered row as the store holds it: sequence number, join key, row.
type Entry = (u64, Vec<u8>, Vec<u8>);

/// Where the stream-stream join keeps its state, and how.
#[derive(Debug, Clone, Copy)]
pub struct StreamJoinState<'a> {
    pub dir: &'a Path,
    pub partitions: u32,
    pub options: &'a StateOptions,
}

/// A stream-stream join as the query runs it.
pub struct StreamJoin {
    spec: JoinSpec,
    output: SchemaRef,
    kind: JoinType,
    sides: [Side; 2],
    keys: RowConverter,
    /// The one-sided parts of the condition, per side, and the two-sided part.
    pre: [Option<ConditionPlan>; 2],
    post: Option<ConditionPlan>,
    state: PartitionedState,
    /// The committed version the memory copy holds, if it holds one untouched by a batch.
    mirrors: Option<Option<u64>>,
    figures: Figures,
}

impl std::fmt::Debug for StreamJoin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamJoin")
            .field("spec", &self.spec)
            .field("output", &self.output)
            .finish_non_exhaustive()
    }
}

impl StreamJoin {
    /// Plans the join of `left` with `right` (their rows as they reach it) and opens its state
    /// stores, empty until [`Self::load`].
    ///
    /// # Errors
    /// [`JoinError::Plan`] or [`JoinError::Condition`] naming the problem, or the state.
    pub fn new(
        spec: JoinSpec,
        left: &JoinInput,
        right: &JoinInput,
        state: &StreamJoinState<'_>,
    ) -> Result<Self, JoinError> {
        let plan_err = |message: String| JoinError::Plan {
            left: spec.left.clone(),
            right: spec.right.clone(),
            message,
        };
        if spec.kind == JoinType::LeftAnti {
            return Err(plan_err(
                "a left anti join of two streams is not supported, as in Spark".into(),
            ));
        }
        let output = output_schema(&spec, &left.schema, &right.schema).map_err(plan_err)?;
        let evictions = evictions(&spec, left, right).map_err(plan_err)?;
        let outer = match spec.kind {
            JoinType::Left => [true, false],
            JoinType::Right => [false, true],
            JoinType::Full => [true, true],
            _ => [false, false],
        };
        let null_rejecting: [Vec<String>; 2] = match &spec.condition {
            Some(c) => {
                let (l, r) = c.null_rejecting_columns();
                [l, r]
            }
            None => [Vec::new(), Vec::new()],
        };
        let side = |i: usize, input: &JoinInput, name: &str| -> Result<Side, JoinError> {
            let keys = spec
                .on
                .iter()
                .map(|k| {
                    input
                        .schema
                        .index_of(k)
                        .map_err(|e| plan_err(format!("the join column {k:?}: {e}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let watermark = match &input.watermark {
                None => None,
                Some(w) => {
                    let at = input.schema.index_of(w).map_err(|_| {
                        plan_err(format!(
                            "the watermark column {w:?} of {name} is not a column where it reaches the join"
                        ))
                    })?;
                    if !matches!(
                        input.schema.field(at).data_type(),
                        DataType::Timestamp(TimeUnit::Microsecond, _)
                    ) {
                        return Err(plan_err(format!(
                            "the watermark column {w:?} of {name} is {}, not TIMESTAMP",
                            input.schema.field(at).data_type()
                        )));
                    }
                    Some(at)
                }
            };
            let rows = RowConverter::new(
                input
                    .schema
                    .fields()
                    .iter()
                    .map(|f| SortField::new(f.data_type().clone()))
                    .collect(),
            )
            .map_err(|e| plan_err(format!("cannot encode the rows of {name}: {e}")))?;
            Ok(Side {
                name: name.to_owned(),
                schema: Arc::clone(&input.schema),
                keys,
                rows,
                watermark,
                eviction: evictions[i],
                outer: outer[i],
                marks: outer[i] || (i == LEFT && spec.kind == JoinType::LeftSemi),
                null_rejecting: null_rejecting[i]
                    .iter()
                    .filter_map(|c| input.schema.index_of(c).ok())
                    .collect(),
                chunks: Vec::new(),
                chunk_live: Vec::new(),
                chunk_slots: Vec::new(),
                residue: None,
                slots: Vec::new(),
                free: Vec::new(),
                index: HashMap::default(),
                by_time: BTreeMap::new(),
                next_seq: 0,
                live: 0,
            })
        };
        let sides = [
            side(LEFT, left, &spec.left)?,
            side(RIGHT, right, &spec.right)?,
        ];
        for s in &sides {
            if s.eviction.is_none() {
                tracing::warn!(
                    input = %s.name,
                    "the join of {} with {} keeps every row of {} forever: its state grows without limit. Give both inputs a watermark and bound the event time of {} in the condition (e.g. {}.t BETWEEN other.t AND other.t + INTERVAL 1 HOUR)",
                    spec.left, spec.right, s.name, s.name, s.name
                );
            }
        }
        let keys = RowConverter::new(
            sides[LEFT]
                .keys
                .iter()
                .map(|i| SortField::new(left.schema.field(*i).data_type().clone()))
                .collect(),
        )
        .map_err(|e| plan_err(format!("cannot encode the join keys: {e}")))?;
        let condition_err = |source| JoinError::Condition {
            left: spec.left.clone(),
            right: spec.right.clone(),
            source: Box::new(source),
        };
        let (pre, post) = match &spec.condition {
            None => ([None, None], None),
            Some(c) => {
                let parts = c.split_join().map_err(condition_err)?;
                let plan = |part: Option<crate::sql::RowCondition>| {
                    part.map(|p| p.plan_two(&left.schema, &right.schema))
                        .transpose()
                        .map_err(condition_err)
                };
                (
                    [plan(parts.left_only)?, plan(parts.right_only)?],
                    plan(parts.both)?,
                )
            }
        };
        let state = PartitionedState::open(&PartitionedConfig {
            dir: state.dir,
            partitions: state.partitions,
            options: state.options,
            count: KeyCount::Entries { per_key: 1 },
        })
        .map_err(|source| JoinError::State {
            left: spec.left.clone(),
            right: spec.right.clone(),
            source,
        })?;
        Ok(Self {
            kind: spec.kind,
            spec,
            output,
            sides,
            keys,
            pre,
            post,
            state,
            mirrors: None,
            figures: Figures::default(),
        })
    }

    /// The name in errors, logs and progress.
    pub fn name(&self) -> String {
        format!("join {} with {}", self.spec.left, self.spec.right)
    }

    /// The schema of the joined rows.
    pub fn output_schema(&self) -> &SchemaRef {
        &self.output
    }

    /// The shape of the state, for the checkpoint's fingerprint: the join keys, and each input's
    /// columns (its rows are stored whole).
    pub fn state_schema(&self) -> StateSchema {
        let fields = |s: &Side| -> Vec<Field> {
            s.schema
                .fields()
                .iter()
                .map(|f| {
                    Field::new(
                        format!("{}.{}", s.name, f.name()),
                        f.data_type().clone(),
                        true,
                    )
                })
                .collect()
        };
        StateSchema {
            operator: OPERATOR,
            key: self.sides[LEFT]
                .keys
                .iter()
                .map(|i| self.sides[LEFT].schema.field(*i).clone())
                .collect(),
            value: [fields(&self.sides[LEFT]), fields(&self.sides[RIGHT])].concat(),
        }
    }

    /// The eviction rule of each side (`None`: it keeps every row).
    pub fn evictions(&self) -> [Option<Eviction>; 2] {
        [self.sides[LEFT].eviction, self.sides[RIGHT].eviction]
    }

    /// Whether a batch without data would evict something: a watermark that moved matters to
    /// a join that evicts (Spark's `shouldRunAnotherBatch`).
    pub fn evicts(&self) -> bool {
        self.sides.iter().any(|s| s.eviction.is_some())
    }

    /// Restores the state committed by batch `version` (`None`: empty).
    ///
    /// # Errors
    /// When the state cannot be read or is corrupt.
    pub fn load(&mut self, version: Option<u64>) -> Result<(), StateError> {
        self.state.load(version)?;
        self.figures = Figures::default();
        if self.mirrors == Some(version) {
            return Ok(());
        }
        self.mirrors = None;
        self.rebuild()?;
        self.mirrors = Some(version);
        Ok(())
    }

    /// Reads every buffered row back from the stores.
    fn rebuild(&mut self) -> Result<(), StateError> {
        for s in &mut self.sides {
            s.clear();
        }
        // Per side: (seq, key, row bytes); and the matched markers.
        let mut entries: [Vec<Entry>; 2] = [Vec::new(), Vec::new()];
        let mut matched: [std::collections::HashSet<(Vec<u8>, u64)>; 2] = Default::default();
        for store in self.state.stores() {
            let dir = store.dir().to_path_buf();
            store.scan(&[], None, &mut |key, value| {
                let corrupt = || StateError::corrupt(&dir, "a join state entry is malformed");
                if key.len() < 9 {
                    return Err(corrupt());
                }
                let (head, seq) = key.split_at(key.len() - 8);
                let seq = u64::from_be_bytes(seq.try_into().map_err(|_| corrupt())?);
                let (kind, join_key) = (head[0], &head[1..]);
                match kind {
                    0 | 1 => entries[kind as usize].push((seq, join_key.to_vec(), value.to_vec())),
                    k if k == MATCHED || k == MATCHED + 1 => {
                        matched[(k - MATCHED) as usize].insert((join_key.to_vec(), seq));
                    }
                    _ => return Err(corrupt()),
                }
                Ok(true)
            })?;
        }
        for (i, mut rows) in entries.into_iter().enumerate() {
            rows.sort_by_key(|(seq, _, _)| *seq);
            let side = &mut self.sides[i];
            side.next_seq = rows.last().map_or(0, |(seq, _, _)| seq + 1);
            if rows.is_empty() {
                continue;
            }
            let dir = self.state.store(0).dir().to_path_buf();
            let parser = side.rows.parser();
            let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                side.rows
                    .convert_rows(rows.iter().map(|(_, _, v)| parser.parse(v)))
            }))
            .map_err(|_| StateError::corrupt(&dir, "a buffered join row cannot be decoded"))?
            .map_err(|e| StateError::corrupt(&dir, format!("a buffered join row: {e}")))?;
            let chunk = RecordBatch::try_new_with_options(
                Arc::clone(&side.schema),
                decoded,
                &RecordBatchOptions::new().with_row_count(Some(rows.len())),
            )
            .map_err(|e| {
                StateError::corrupt(&dir, format!("the buffered rows of {}: {e}", side.name))
            })?;
            let times = side.eviction.map(|e| event_times(chunk.column(e.column)));
            side.chunks.push(Some(chunk));
            side.chunk_live.push(rows.len() as u32);
            side.chunk_slots.push(Vec::with_capacity(rows.len()));
            for (r, (seq, key, _)) in rows.iter().enumerate() {
                let is_matched = matched[i].contains(&(key.clone(), *seq));
                let time = times.as_ref().and_then(|t| t[r]);
                side.insert(0, r as u32, *seq, key, time, is_matched);
            }
        }
        Ok(())
    }

    /// Joins one batch: `inputs[0]` the left input's new rows, `inputs[1]` the right's.
    ///
    /// # Errors
    /// When the state cannot be written, or the condition fails on a pair.
    pub fn process(
        &mut self,
        ctx: &StatefulContext,
        inputs: [&[RecordBatch]; 2],
    ) -> Result<Vec<RecordBatch>, JoinError> {
        self.mirrors = None;
        let (left_name, right_name) = (self.spec.left.clone(), self.spec.right.clone());
        let fail = |message: String| JoinError::Batch {
            left: left_name.clone(),
            right: right_name.clone(),
            batch_id: ctx.batch_id,
            message,
        };
        let mut out: Vec<RecordBatch> = Vec::new();
        for side in [LEFT, RIGHT] {
            let schema = Arc::clone(&self.sides[side].schema);
            let batch =
                arrow_select::concat::concat_batches(&schema, inputs[side]).map_err(|e| {
                    fail(format!(
                        "cannot gather the rows of {}: {e}",
                        self.sides[side].name
                    ))
                })?;
            if batch.num_rows() > 0 {
                self.one_side(ctx, side, &batch, &mut out).map_err(&fail)?;
            }
        }
        // What the watermark lets go: an outer side's unmatched rows are emitted now.
        for side in [LEFT, RIGHT] {
            let Some(e) = self.sides[side].eviction else {
                continue;
            };
            let threshold = ctx
                .watermark_ms
                .saturating_add(e.offset_ms)
                .saturating_mul(1000);
            let gone = self.sides[side].evict(threshold);
            if gone.is_empty() {
                continue;
            }
            // Spark counts the rows removed without being emitted: none of an outer side's.
            if !self.sides[side].outer {
                self.figures.removed += gone.len() as u64;
            }
            let mut unmatched = Vec::new();
            let mut buf = Vec::new();
            for &id in &gone {
                let slot = &self.sides[side].slots[id as usize];
                let was_matched = slot.matched;
                write_store_key(&mut buf, side as u8, &slot.key, slot.seq);
                let p = self.state.partition_of(&slot.key);
                self.state
                    .store_mut(p)
                    .delete_present(&buf)
                    .map_err(|e| fail(e.to_string()))?;
                if was_matched {
                    // A marker is kept for the sides whose matches are asked about later.
                    if self.sides[side].marks {
                        write_store_key(&mut buf, side as u8 + MATCHED, &slot.key, slot.seq);
                        self.state
                            .store_mut(p)
                            .delete_present(&buf)
                            .map_err(|e| fail(e.to_string()))?;
                    }
                } else if self.sides[side].outer {
                    unmatched.push(id);
                }
            }
            if !unmatched.is_empty() {
                let columns = self.sides[side]
                    .gather(&unmatched)
                    .map_err(|e| fail(e.to_string()))?;
                out.push(
                    self.with_nulls(side, columns, unmatched.len())
                        .map_err(&fail)?,
                );
            }
            // The slots are free now, and the chunks whose rows are all gone.
            self.sides[side]
                .release(&gone)
                .map_err(|e| fail(format!("cannot compact the buffered rows: {e}")))?;
        }
        Ok(out)
    }

    /// The new rows of one side: dropped when late, joined with the other side's buffer, and
    /// buffered.
    fn one_side(
        &mut self,
        ctx: &StatefulContext,
        side: usize,
        batch: &RecordBatch,
        out: &mut Vec<RecordBatch>,
    ) -> Result<(), String> {
        let other = 1 - side;
        let n = batch.num_rows();
        let arrow = |what: &'static str| move |e: ArrowError| format!("cannot {what}: {e}");
        let key_columns: Vec<ArrayRef> = self.sides[side]
            .keys
            .iter()
            .map(|i| Arc::clone(batch.column(*i)))
            .collect();
        let nulls = key_nulls(&key_columns);
        let outer = self.sides[side].outer;
        // Which rows go on: a null key matches nothing (kept only by an outer side, to be
        // emitted); a late row is dropped and counted.
        let mut keep = vec![true; n];
        if !outer {
            if let Some(nulls) = &nulls {
                for (r, k) in keep.iter_mut().enumerate() {
                    *k = nulls.is_valid(r);
                }
            }
            for &c in &self.sides[side].null_rejecting {
                let column = batch.column(c);
                if column.null_count() > 0 {
                    for (r, k) in keep.iter_mut().enumerate() {
                        *k = *k && column.is_valid(r);
                    }
                }
            }
        }
        if let Some(w) = self.sides[side].watermark {
            let times = batch.column(w).as_primitive::<TimestampMicrosecondType>();
            let late_us = ctx.late_ms.saturating_mul(1000);
            for (r, k) in keep.iter_mut().enumerate() {
                if *k && times.is_valid(r) && times.value(r) <= late_us {
                    *k = false;
                    self.figures.dropped += 1;
                }
            }
        }
        // The condition's part on this side alone: a row failing it matches nothing.
        let mut alone: Vec<u32> = Vec::new();
        if let Some(pre) = &self.pre[side] {
            let holds = evaluate_one(pre, batch)?;
            for (r, k) in keep.iter_mut().enumerate() {
                if *k && !holds.value(r) {
                    *k = false;
                    if outer {
                        alone.push(r as u32);
                    }
                }
            }
        }
        if !alone.is_empty() {
            let columns = Rows2::New(batch)
                .columns(&alone)
                .map_err(arrow("take rows"))?;
            out.push(self.with_nulls(side, columns, alone.len())?);
        }
        let keys = self
            .keys
            .convert_columns(&key_columns)
            .map_err(arrow("encode the join keys"))?;
        // Candidate pairs: each row with the other side's buffered rows of its key.
        let semi_right = self.kind == JoinType::LeftSemi && side == RIGHT;
        let mut new_idx: Vec<u32> = Vec::new();
        let mut old_idx: Vec<u32> = Vec::new();
        for (r, &kept) in keep.iter().enumerate() {
            if !kept || nulls.as_ref().is_some_and(|v| v.is_null(r)) {
                continue;
            }
            if let Some(ids) = self.sides[other].index.get(keys.row(r).as_ref()) {
                for &id in ids {
                    if semi_right && self.sides[other].slots[id as usize].matched {
                        continue;
                    }
                    new_idx.push(r as u32);
                    old_idx.push(id);
                }
            }
        }
        if let Some(post) = &self.post
            && !new_idx.is_empty()
        {
            let (l, li, r, ri) = if side == LEFT {
                (
                    Rows2::New(batch),
                    &new_idx,
                    Rows2::Buffered(&self.sides[other]),
                    &old_idx,
                )
            } else {
                (
                    Rows2::Buffered(&self.sides[other]),
                    &old_idx,
                    Rows2::New(batch),
                    &new_idx,
                )
            };
            let holds = evaluate_pairs(post, &l, li, &r, ri)?;
            let keep_pairs = |idx: &[u32]| -> Result<Vec<u32>, String> {
                let kept = arrow_select::filter::filter(&UInt32Array::from(idx.to_vec()), &holds)
                    .map_err(arrow("filter the pairs"))?;
                Ok(kept.as_primitive::<UInt32Type>().values().to_vec())
            };
            new_idx = keep_pairs(&new_idx)?;
            old_idx = keep_pairs(&old_idx)?;
        }
        let mut matched = vec![false; n];
        for &r in &new_idx {
            matched[r as usize] = true;
        }
        // The buffered rows matched now are remembered (an outer or semi join asks later).
        let remember = self.sides[other].marks;
        let mut semi_emitted: Vec<u32> = Vec::new();
        let mut buf = Vec::new();
        for &id in &old_idx {
            let slot = &mut self.sides[other].slots[id as usize];
            if slot.matched {
                continue;
            }
            slot.matched = true;
            if semi_right {
                semi_emitted.push(id);
            }
            if remember {
                // No marker yet: the row was not matched before.
                write_store_key(&mut buf, other as u8 + MATCHED, &slot.key, slot.seq);
                let p = self.state.partition_of(&slot.key);
                self.state
                    .store_mut(p)
                    .put_new(&buf, &[])
                    .map_err(|e| e.to_string())?;
            }
        }
        // The joined rows.
        match self.kind {
            JoinType::LeftSemi => {
                let rows = if side == LEFT {
                    let firsts: Vec<u32> = (0..n as u32).filter(|r| matched[*r as usize]).collect();
                    Rows2::New(batch)
                        .columns(&firsts)
                        .map_err(arrow("take rows"))?
                } else {
                    self.sides[LEFT]
                        .gather(&semi_emitted)
                        .map_err(arrow("gather rows"))?
                };
                let count = rows.first().map_or(0, |c| c.len());
                if count > 0 {
                    out.push(self.assemble(Some(rows), None, count, LEFT)?);
                }
            }
            _ if !new_idx.is_empty() => {
                let new_cols = Rows2::New(batch)
                    .columns(&new_idx)
                    .map_err(arrow("take rows"))?;
                let old_cols = self.sides[other]
                    .gather(&old_idx)
                    .map_err(arrow("gather rows"))?;
                let (l, r) = if side == LEFT {
                    (new_cols, old_cols)
                } else {
                    (old_cols, new_cols)
                };
                out.push(self.assemble(Some(l), Some(r), new_idx.len(), LEFT)?);
            }
            _ => {}
        }
        // Buffered: the rows that may still match a later row of the other side.
        let times = self.sides[side]
            .eviction
            .map(|e| event_times(batch.column(e.column)));
        let threshold = self.sides[side].eviction.map(|e| {
            ctx.watermark_ms
                .saturating_add(e.offset_ms)
                .saturating_mul(1000)
        });
        // As Spark 4 decides (SPARK-49829): a left row always (but a left semi join's matched
        // one); a right row unless this batch would evict it, and then still when an outer join
        // must emit it unmatched.
        let semi_left = self.kind == JoinType::LeftSemi && side == LEFT;
        let buffered: Vec<u32> = (0..n)
            .filter(|&r| keep[r])
            .filter(|&r| !(semi_left && matched[r]))
            .filter(|&r| {
                side == LEFT
                    || (outer && !matched[r])
                    || match (&times, threshold) {
                        (Some(t), Some(th)) => t[r].is_none_or(|t| t > th),
                        _ => true,
                    }
            })
            .map(|r| r as u32)
            .collect();
        if buffered.is_empty() {
            return Ok(());
        }
        let values = self.sides[side]
            .rows
            .convert_columns(batch.columns())
            .map_err(arrow("encode the buffered rows"))?;
        let ids = self.sides[side]
            .add(batch, &buffered, &keys, &matched, times.as_deref())
            .map_err(arrow("buffer rows"))?;
        // Each buffered row is a new entry (its sequence number is new): no lookup.
        for (&r, &id) in buffered.iter().zip(&ids) {
            let slot = &self.sides[side].slots[id as usize];
            let p = self.state.partition_of(&slot.key);
            let store = self.state.store_mut(p);
            write_store_key(&mut buf, side as u8, &slot.key, slot.seq);
            store
                .put_new(&buf, values.row(r as usize).as_ref())
                .map_err(|e| e.to_string())?;
            if slot.matched && self.sides[side].marks {
                write_store_key(&mut buf, side as u8 + MATCHED, &slot.key, slot.seq);
                store.put_new(&buf, &[]).map_err(|e| e.to_string())?;
            }
        }
        self.figures.added += buffered.len() as u64;
        Ok(())
    }

    /// Rows of one side with nulls for the other's columns.
    fn with_nulls(
        &self,
        side: usize,
        columns: Vec<ArrayRef>,
        rows: usize,
    ) -> Result<RecordBatch, String> {
        let other = 1 - side;
        let nulls: Vec<ArrayRef> = self.sides[other]
            .schema
            .fields()
            .iter()
            .map(|f| arrow_array::new_null_array(f.data_type(), rows))
            .collect();
        if side == LEFT {
            self.assemble(Some(columns), Some(nulls), rows, LEFT)
        } else {
            self.assemble(Some(nulls), Some(columns), rows, RIGHT)
        }
    }

    /// The output rows from the left and right columns (each the whole input's, aligned): the
    /// keys from side `keys_from`, then the left's other columns, then the right's.
    fn assemble(
        &self,
        left: Option<Vec<ArrayRef>>,
        right: Option<Vec<ArrayRef>>,
        rows: usize,
        keys_from: usize,
    ) -> Result<RecordBatch, String> {
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.output.fields().len());
        let (ls, rs) = (&self.sides[LEFT], &self.sides[RIGHT]);
        for (&li, &ri) in ls.keys.iter().zip(&rs.keys) {
            let key = match (keys_from, &left, &right) {
                (LEFT, Some(l), _) => Arc::clone(&l[li]),
                (_, _, Some(r)) => Arc::clone(&r[ri]),
                (_, Some(l), None) => Arc::clone(&l[li]),
                (_, None, None) => return Err("no rows to assemble".into()),
            };
            columns.push(key);
        }
        let others = |s: &Side, cols: &Option<Vec<ArrayRef>>| -> Vec<ArrayRef> {
            match cols {
                Some(cols) => (0..s.schema.fields().len())
                    .filter(|i| !s.keys.contains(i))
                    .map(|i| Arc::clone(&cols[i]))
                    .collect(),
                None => Vec::new(),
            }
        };
        columns.extend(others(ls, &left));
        if self.kind != JoinType::LeftSemi {
            columns.extend(others(rs, &right));
        }
        RecordBatch::try_new_with_options(
            Arc::clone(&self.output),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )
        .map_err(|e| format!("cannot assemble the joined rows: {e}"))
    }

    /// Commits the state as version `batch_id`.
    ///
    /// # Errors
    /// When the state cannot be made durable.
    pub fn commit(&mut self, batch_id: u64) -> Result<OperatorMetrics, StateError> {
        let figures = std::mem::take(&mut self.figures);
        let mut metrics = self.state.commit(batch_id, OPERATOR, figures.dropped)?;
        self.mirrors = Some(Some(batch_id));
        metrics.num_rows_total = self.sides.iter().map(|s| s.live).sum();
        metrics.num_rows_updated = figures.added;
        metrics.num_rows_removed = figures.removed;
        metrics.memory_used_bytes += self.sides.iter().map(Side::memory_bytes).sum::<u64>();
        Ok(metrics)
    }
}

/// Event times in µs of a TIMESTAMP column (`None` for null).
fn event_times(column: &ArrayRef) -> Vec<Option<i64>> {
    let times = column.as_primitive::<TimestampMicrosecondType>();
    times.iter().collect()
}

/// A one-sided condition over the rows of `batch`.
fn evaluate_one(plan: &ConditionPlan, batch: &RecordBatch) -> Result<BooleanArray, String> {
    let pick = |names: &[String]| -> Result<Vec<ArrayRef>, String> {
        names
            .iter()
            .map(|n| {
                batch
                    .column_by_name(n)
                    .cloned()
                    .ok_or_else(|| format!("the condition's column {n} is missing"))
            })
            .collect()
    };
    // A one-sided part reads columns of `batch`'s input only, under either label.
    let (source, target) = (pick(plan.source_columns())?, pick(plan.target_columns())?);
    plan.evaluate(batch.num_rows(), source, target)
}

/// The two-sided condition over aligned pairs of left and right rows.
fn evaluate_pairs(
    plan: &ConditionPlan,
    left: &Rows2<'_>,
    left_idx: &[u32],
    right: &Rows2<'_>,
    right_idx: &[u32],
) -> Result<BooleanArray, String> {
    let pick = |rows: &Rows2<'_>, idx: &[u32], names: &[String]| -> Result<Vec<ArrayRef>, String> {
        let schema = rows.schema();
        let wanted: Vec<usize> = names
            .iter()
            .map(|n| {
                schema
                    .index_of(n)
                    .map_err(|_| format!("the condition's column {n} is missing"))
            })
            .collect::<Result<_, _>>()?;
        // Only the condition's columns: the output's are gathered for the pairs that hold.
        rows.columns_at(idx, &wanted).map_err(|e| e.to_string())
    };
    let source = pick(left, left_idx, plan.source_columns())?;
    let target = pick(right, right_idx, plan.target_columns())?;
    plan.evaluate(left_idx.len(), source, target)
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
