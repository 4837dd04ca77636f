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
//! Why the rows live in the state store only: a buffer holds every row of the last hour or so of
//! event time, far more than memory should (a second copy in memory made the attribution join's
//! resident set 2.6 times its state on disk, BENCHMARKS.md §8). The store (RocksDB or memory,
//! versioned by batch id, partitioned by the join key's hash, one changelog per batch) is both
//! what survives a crash and what a probe reads. Memory keeps an index of about 31 bytes a row:
//! a 16-byte slot (sequence number, partition, flags, the low half of the key's hash, the next
//! row of its chain), a hash-table bucket per key, and the row's event time (four bytes above
//! its run's first) in the run the eviction walks. The rows a probe finds are read back in one
//! batched lookup per partition and decoded column by column (`arrow-row`); two keys whose
//! hashes share the low half share a chain, so the pairs are checked on the keys themselves
//! once their rows are read.
//!
//! A state entry per buffered row: key `[4 + side][sequence number]` (big-endian, so a batch's
//! rows are appended in key order), value the row (arrow-row encoded); a row that found a match
//! (what an outer join and a left semi join need to know) has a marker entry `[6 + side][sequence
//! number]`. A restart decodes the rows to index them again. A checkpoint written with the
//! earlier layout (`[side][join key][seq]`, markers `[2 + side][join key][seq]`) is rewritten to
//! this one when it is loaded.

use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{TimestampMicrosecondType, UInt32Type};
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array};
use arrow_row::{RowConverter, SortField};
use arrow_schema::{ArrowError, DataType, Field, SchemaRef, TimeUnit};

use super::{JoinError, key_nulls, output_schema};
use crate::fnv;
use crate::operator::partitioned::{KeyCount, PartitionedConfig, PartitionedState};
use crate::operator::stateful::{OperatorMetrics, StateSchema, StatefulContext};
use crate::spec::{JoinSpec, JoinType};
use crate::sql::ConditionPlan;
use crate::state::{Lookups, StateError, StateOptions};

/// Spark's name for the operator in `stateOperators`.
pub const OPERATOR: &str = "symmetricHashJoin";

const LEFT: usize = 0;
const RIGHT: usize = 1;
/// The first byte of a buffered row's key: this plus the side.
const ROW: u8 = 4;
/// The first byte of a matched marker's key: this plus the side.
const MARK: u8 = 6;
/// The first byte of a matched marker's key in the earlier layout, plus the side (a row's was
/// the side alone).
const LEGACY_MARK: u8 = 2;
/// The end of a chain.
const NONE: u32 = u32::MAX;
/// Rows decoded at a time when the buffer is rebuilt from the store.
const REBUILD_CHUNK: usize = 8192;

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

/// One buffered row in 16 bytes: its sequence number, partition and flags in one word, the
/// low half of its key hash, and the next row of its chain.
#[derive(Debug, Clone, Copy)]
struct Slot {
    word: u64,
    hash: u32,
    /// The next (older) row with the same hash, or [`NONE`].
    next: u32,
}

const SEQ_BITS: u32 = 48;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// Partitions fit in 10 bits (`state_partitions` is at most 1,024).
const PARTITION_MASK: u64 = (1 << 10) - 1;
const MATCHED_BIT: u64 = 1 << 62;
const LIVE_BIT: u64 = 1 << 63;

impl Slot {
    fn seq(&self) -> u64 {
        self.word & SEQ_MASK
    }
    fn partition(&self) -> usize {
        ((self.word >> SEQ_BITS) & PARTITION_MASK) as usize
    }
    fn matched(&self) -> bool {
        self.word & MATCHED_BIT != 0
    }
    fn live(&self) -> bool {
        self.word & LIVE_BIT != 0
    }
    fn set_matched(&mut self) {
        self.word |= MATCHED_BIT;
    }
}

/// The index's hash of a key hash: hashbrown takes its bucket from the low bits and its control
/// byte from the top seven, which the low half of an FNV hash alone would leave at zero.
fn spread(hash: u32) -> u64 {
    u64::from(hash).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The event times of rows one batch buffered, in ascending order, consumed from the front as
/// the watermark passes them. A time is held as its distance (µs) above the run's first, in
/// four bytes rather than eight: a batch whose times span more than `u32::MAX` µs (71 minutes)
/// is split into several runs.
#[derive(Debug, Default)]
struct Run {
    base: i64,
    offsets: Vec<u32>,
    ids: Vec<u32>,
    at: usize,
}

impl Run {
    /// How many of the unconsumed rows have a time at or below `threshold_us`.
    fn due(&self, threshold_us: i64) -> usize {
        let limit = match threshold_us.checked_sub(self.base) {
            Some(d) if d < 0 => return 0,
            Some(d) => u32::try_from(d).unwrap_or(u32::MAX),
            // Past the range of a difference: far above every time.
            None if threshold_us > self.base => u32::MAX,
            None => return 0,
        };
        self.offsets[self.at..].partition_point(|&o| o <= limit)
    }

    /// Lets go of the consumed front.
    fn drop_consumed(&mut self) {
        self.offsets.drain(..self.at);
        self.ids.drain(..self.at);
        self.at = 0;
    }
}

/// One input's buffer: the index of the rows the store holds for it.
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
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// The newest row of each key hash's chain (the hash is the slot's).
    index: hashbrown::HashTable<u32>,
    /// What the eviction walks: rows without an event time are in none.
    runs: Vec<Run>,
    next_seq: u64,
    live: u64,
}

impl Side {
    fn clear(&mut self) {
        self.slots = Vec::new();
        self.free = Vec::new();
        self.index = hashbrown::HashTable::new();
        self.runs = Vec::new();
        self.next_seq = 0;
        self.live = 0;
    }

    fn memory_bytes(&self) -> u64 {
        let slots = self.slots.capacity() * size_of::<Slot>() + self.free.capacity() * 4;
        // A hashbrown bucket: the slot number and one control byte.
        let index = self.index.capacity() * 5;
        let runs: usize = self
            .runs
            .iter()
            .map(|r| (r.offsets.capacity() + r.ids.capacity()) * 4)
            .sum();
        (slots + index + runs) as u64
    }

    /// The join key columns of `batch`, rows of this side.
    fn key_columns(&self, batch: &RecordBatch) -> Vec<ArrayRef> {
        self.keys
            .iter()
            .map(|&i| Arc::clone(batch.column(i)))
            .collect()
    }

    /// The newest row of `hash`'s chain.
    fn head(&self, hash: u32) -> u32 {
        let slots = &self.slots;
        self.index
            .find(spread(hash), |&id| slots[id as usize].hash == hash)
            .copied()
            .unwrap_or(NONE)
    }

    /// Indexes a buffered row of key hash `hash` (FNV-1a 64) in partition `partition`; its event
    /// time, if any, is added to a run by the caller.
    fn insert(&mut self, seq: u64, hash: u64, partition: usize, matched: bool) -> u32 {
        let mut word = (seq & SEQ_MASK) | ((partition as u64 & PARTITION_MASK) << SEQ_BITS);
        word |= LIVE_BIT;
        if matched {
            word |= MATCHED_BIT;
        }
        let slot = Slot {
            word,
            hash: hash as u32,
            next: NONE,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = slot;
                id
            }
            None => {
                if self.slots.len() == self.slots.capacity() {
                    // Grow by a quarter, not double: the slots are most of the index.
                    self.slots.reserve_exact(self.slots.len() / 4 + 1024);
                }
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        let h = slot.hash;
        let slots = &mut self.slots;
        match self
            .index
            .find_mut(spread(h), |&x| slots[x as usize].hash == h)
        {
            Some(head) => {
                slots[id as usize].next = *head;
                *head = id;
            }
            None => {
                self.index
                    .insert_unique(spread(h), id, |&x| spread(slots[x as usize].hash));
            }
        }
        self.live += 1;
        id
    }

    /// Adds rows with event times (any order) as one run, or several where their times span
    /// more than an offset holds.
    fn add_run(&mut self, mut pairs: Vec<(i64, u32)>) {
        pairs.sort_unstable();
        let mut rest = &pairs[..];
        while let Some(&(base, _)) = rest.first() {
            let fits = |&(t, _): &(i64, u32)| {
                t.checked_sub(base)
                    .is_some_and(|d| d <= i64::from(u32::MAX))
            };
            let (run, next) = rest.split_at(rest.partition_point(fits));
            self.runs.push(Run {
                base,
                offsets: run.iter().map(|&(t, _)| (t - base) as u32).collect(),
                ids: run.iter().map(|&(_, id)| id).collect(),
                at: 0,
            });
            rest = next;
        }
    }

    /// Indexes rows `rows` of a batch (key hashes `hashes` and partitions `partitions`, by row)
    /// as new rows, each with its matched flag and event time.
    fn add(
        &mut self,
        rows: &[u32],
        hashes: &[u64],
        partitions: &[usize],
        matched: &[bool],
        times: Option<&[Option<i64>]>,
    ) -> Result<Vec<u32>, String> {
        let mut ids = Vec::with_capacity(rows.len());
        let mut run = Vec::new();
        for &row in rows {
            let r = row as usize;
            let seq = self.next_seq;
            if seq > SEQ_MASK || self.slots.len() >= NONE as usize {
                return Err(format!(
                    "{} has buffered more rows than its state can number",
                    self.name
                ));
            }
            self.next_seq += 1;
            let id = self.insert(seq, hashes[r], partitions[r], matched[r]);
            if let Some(t) = times.and_then(|t| t[r]) {
                run.push((t, id));
            }
            ids.push(id);
        }
        self.add_run(run);
        Ok(ids)
    }

    /// The live rows of `hash`'s chain, oldest first, into `out`. Two key hashes may share
    /// their low half, and with it a chain: the caller checks the keys.
    fn chain(&self, hash: u64, out: &mut Vec<u32>) {
        out.clear();
        let mut id = self.head(hash as u32);
        while id != NONE {
            out.push(id);
            id = self.slots[id as usize].next;
        }
        out.reverse();
    }

    /// Takes every row whose eviction time is at or below `threshold_us` out of the index,
    /// returning them; their slots stay readable until [`Self::release`].
    fn evict(&mut self, threshold_us: i64) -> Vec<u32> {
        let mut ids = Vec::new();
        for run in &mut self.runs {
            let end = run.at + run.due(threshold_us);
            ids.extend_from_slice(&run.ids[run.at..end]);
            run.at = end;
            // Let the consumed front go once it is most of the run.
            if run.at > 0 && run.at * 2 >= run.offsets.len() && run.at < run.offsets.len() {
                run.drop_consumed();
                run.offsets.shrink_to_fit();
                run.ids.shrink_to_fit();
            }
        }
        self.runs.retain(|r| r.at < r.offsets.len());
        if ids.is_empty() {
            return ids;
        }
        for &id in &ids {
            self.slots[id as usize].word &= !LIVE_BIT;
        }
        // Each chain that lost rows is relinked once, whatever its length.
        let mut hashes: Vec<u32> = ids.iter().map(|&id| self.slots[id as usize].hash).collect();
        hashes.sort_unstable();
        hashes.dedup();
        for hash in hashes {
            let mut id = self.head(hash);
            let (mut head, mut tail) = (NONE, NONE);
            while id != NONE {
                let next = self.slots[id as usize].next;
                if self.slots[id as usize].live() {
                    if tail == NONE {
                        head = id;
                    } else {
                        self.slots[tail as usize].next = id;
                    }
                    tail = id;
                }
                id = next;
            }
            let slots = &self.slots;
            if let Ok(entry) = self
                .index
                .find_entry(spread(hash), |&x| slots[x as usize].hash == hash)
            {
                if tail == NONE {
                    entry.remove();
                } else {
                    *entry.into_mut() = head;
                }
            }
            if tail != NONE {
                self.slots[tail as usize].next = NONE;
            }
        }
        self.live -= ids.len() as u64;
        ids
    }

    /// Lets the slots of evicted rows be reused.
    fn release(&mut self, ids: &[u32]) {
        self.free.extend_from_slice(ids);
        // Many rows went at once: give the memory of a shrunken buffer back.
        if self.free.len() > 1024 && self.free.len() * 2 > self.slots.len() {
            self.compact();
        }
    }

    /// Renumbers the live slots densely (more than half the slots are free).
    fn compact(&mut self) {
        let mut renumber = vec![NONE; self.slots.len()];
        let mut slots = Vec::with_capacity(self.live as usize + self.live as usize / 4);
        for (id, slot) in self.slots.iter().enumerate() {
            if slot.live() {
                renumber[id] = slots.len() as u32;
                slots.push(*slot);
            }
        }
        for slot in &mut slots {
            if slot.next != NONE {
                slot.next = renumber[slot.next as usize];
            }
        }
        for head in self.index.iter_mut() {
            *head = renumber[*head as usize];
        }
        for run in &mut self.runs {
            run.drop_consumed();
            for id in &mut run.ids {
                *id = renumber[*id as usize];
            }
        }
        self.slots = slots;
        self.free = Vec::new();
        let slots = &self.slots;
        self.index
            .shrink_to_fit(|&x| spread(slots[x as usize].hash));
    }
}

/// `[tag][seq]`, the store key of a buffered row or its marker.
fn store_key(tag: u8, seq: u64) -> [u8; 9] {
    let mut key = [0u8; 9];
    key[0] = tag;
    key[1..].copy_from_slice(&seq.to_be_bytes());
    key
}

/// Columns `columns` of rows `idx` of `batch`.
fn take_columns(
    batch: &RecordBatch,
    idx: &[u32],
    columns: &[usize],
) -> Result<Vec<ArrayRef>, ArrowError> {
    let idx = UInt32Array::from(idx.to_vec());
    columns
        .iter()
        .map(|&c| arrow_select::take::take(batch.column(c).as_ref(), &idx, None))
        .collect()
}

/// Every column of rows `idx` of `batch`.
fn take_all(batch: &RecordBatch, idx: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
    let all: Vec<usize> = (0..batch.num_columns()).collect();
    take_columns(batch, idx, &all)
}

/// The join's figures since the last commit.
#[derive(Debug, Default, Clone, Copy)]
struct Figures {
    added: u64,
    removed: u64,
    dropped: u64,
}

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
                slots: Vec::new(),
                free: Vec::new(),
                index: hashbrown::HashTable::new(),
                runs: Vec::new(),
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
        if state.partitions as u64 > PARTITION_MASK + 1 {
            return Err(plan_err(format!(
                "a stream-stream join takes at most {} state partitions, not {}",
                PARTITION_MASK + 1,
                state.partitions
            )));
        }
        // The join fetches only rows whose keys matched.
        let options = StateOptions {
            lookups: Lookups::Present,
            ..state.options.clone()
        };
        let state = PartitionedState::open(&PartitionedConfig {
            dir: state.dir,
            partitions: state.partitions,
            options: &options,
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
        // A rewrite of the earlier layout is only in this attempt's uncommitted writes, which
        // the next load drops: that load must rebuild (and rewrite) again.
        if !self.rebuild()? {
            self.mirrors = Some(version);
        }
        Ok(())
    }

    /// Reads every buffered row's index entry back from the stores (each row decoded for its
    /// key's hash and event time), rewriting entries of the earlier layout into this one
    /// (written with the next commit); returns whether it rewrote any. The rewrite is a
    /// one-time cost of the first run after an upgrade: the old entries are held in memory
    /// until that commit.
    fn rebuild(&mut self) -> Result<bool, StateError> {
        for s in &mut self.sides {
            s.clear();
        }
        let mut all_seqs: [Vec<u64>; 2] = Default::default();
        let mut legacy: Vec<Rewrite> = Vec::new();
        let state = &self.state;
        let keys = &self.keys;
        let sides = &mut self.sides;
        for (p, store) in state.stores().iter().enumerate() {
            let dir = store.dir().to_path_buf();
            let corrupt = || StateError::corrupt(&dir, "a join state entry is malformed");
            let mut rebuilt = Rebuilt {
                partition: p,
                partitions: state,
                keys,
                dir: &dir,
                waiting: Default::default(),
                seqs: Default::default(),
                marks: Default::default(),
            };
            store.scan(&[], None, &mut |key, value| {
                if key.len() < 9 {
                    return Err(corrupt());
                }
                let (head, seq) = key.split_at(key.len() - 8);
                let seq = u64::from_be_bytes(seq.try_into().map_err(|_| corrupt())?);
                let tag = head[0];
                let (row, side) = match tag {
                    t if (ROW..MARK + 2).contains(&t) && head.len() == 1 => {
                        (t < MARK, (t & 1) as usize)
                    }
                    t if t < ROW => {
                        // The earlier layout: the join key itself between tag and seq.
                        let (row, side) = (t < LEGACY_MARK, (t & 1) as usize);
                        let tag = if row { ROW } else { MARK } + side as u8;
                        legacy.push(Rewrite {
                            partition: p,
                            old: key.to_vec(),
                            new: store_key(tag, seq),
                            value: value.to_vec(),
                        });
                        (row, side)
                    }
                    _ => return Err(corrupt()),
                };
                if seq > SEQ_MASK {
                    return Err(corrupt());
                }
                if row {
                    rebuilt.row(&mut sides[side], side, seq, value)?;
                } else {
                    rebuilt.marks[side].push(seq);
                }
                Ok(true)
            })?;
            rebuilt.finish(sides, &mut all_seqs)?;
        }
        // A sequence number is one row's, whatever its partition; the next is above them all.
        for (side, seqs) in all_seqs.iter_mut().enumerate() {
            seqs.sort_unstable();
            self.sides[side].next_seq = seqs.last().map_or(0, |s| s + 1);
            if seqs.windows(2).any(|w| w[0] == w[1]) {
                return Err(StateError::corrupt(
                    self.state.store(0).dir(),
                    format!(
                        "two buffered rows of {} have one sequence number",
                        self.sides[side].name
                    ),
                ));
            }
        }
        let migrated = !legacy.is_empty();
        for Rewrite {
            partition: p,
            old,
            new,
            value,
        } in legacy
        {
            let store = self.state.store_mut(p);
            store.delete_present(&old)?;
            store.put_new(&new, &value)?;
        }
        Ok(migrated)
    }

    /// The buffered rows `ids` of side `side` (distinct), read from the stores, in order.
    fn fetch(&self, side: usize, ids: &[u32]) -> Result<RecordBatch, String> {
        let s = &self.sides[side];
        let keys: Vec<[u8; 9]> = ids
            .iter()
            .map(|&id| store_key(ROW + side as u8, s.slots[id as usize].seq()))
            .collect();
        // Per partition, its keys in order: one batched lookup each.
        let mut order: Vec<u32> = (0..ids.len() as u32).collect();
        order.sort_unstable_by_key(|&i| {
            (
                s.slots[ids[i as usize] as usize].partition(),
                keys[i as usize],
            )
        });
        let mut values: Vec<Option<Vec<u8>>> = vec![None; ids.len()];
        let mut found = Vec::new();
        let mut start = 0;
        while start < order.len() {
            let p = s.slots[ids[order[start] as usize] as usize].partition();
            let end = start
                + order[start..]
                    .partition_point(|&i| s.slots[ids[i as usize] as usize].partition() == p);
            let part: Vec<&[u8]> = order[start..end]
                .iter()
                .map(|&i| &keys[i as usize][..])
                .collect();
            self.state
                .store(p)
                .get_many(&part, true, &mut found)
                .map_err(|e| e.to_string())?;
            for (&i, value) in order[start..end].iter().zip(found.drain(..)) {
                values[i as usize] = value;
            }
            start = end;
        }
        let mut present: Vec<&[u8]> = Vec::with_capacity(values.len());
        for (value, &id) in values.iter().zip(ids) {
            match value {
                Some(v) => present.push(v),
                None => {
                    return Err(format!(
                        "the state of {} lost buffered row {}",
                        s.name,
                        s.slots[id as usize].seq()
                    ));
                }
            }
        }
        decode_rows(s, &present).map_err(|e| format!("the buffered rows of {}: {e}", s.name))
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
            if self.sides[side].outer {
                // Read before the rows are deleted.
                let unmatched: Vec<u32> = gone
                    .iter()
                    .copied()
                    .filter(|&id| !self.sides[side].slots[id as usize].matched())
                    .collect();
                if !unmatched.is_empty() {
                    let rows = self.fetch(side, &unmatched).map_err(&fail)?;
                    let rows = rows.columns().to_vec();
                    out.push(
                        self.with_nulls(side, rows, unmatched.len())
                            .map_err(&fail)?,
                    );
                }
            }
            let marks = self.sides[side].marks;
            for &id in &gone {
                let slot = self.sides[side].slots[id as usize];
                let store = self.state.store_mut(slot.partition());
                store
                    .delete_present(&store_key(ROW + side as u8, slot.seq()))
                    .map_err(|e| fail(e.to_string()))?;
                // A marker is kept for the sides whose matches are asked about later.
                if slot.matched() && marks {
                    store
                        .delete_present(&store_key(MARK + side as u8, slot.seq()))
                        .map_err(|e| fail(e.to_string()))?;
                }
            }
            self.sides[side].release(&gone);
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
        let key_columns = self.sides[side].key_columns(batch);
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
            let columns = take_all(batch, &alone).map_err(arrow("take rows"))?;
            out.push(self.with_nulls(side, columns, alone.len())?);
        }
        let keys = self
            .keys
            .convert_columns(&key_columns)
            .map_err(arrow("encode the join keys"))?;
        let hashes: Vec<u64> = (0..n).map(|r| fnv::hash(keys.row(r).as_ref())).collect();
        let partitions: Vec<usize> = hashes
            .iter()
            .map(|&h| self.state.partition_of_hash(h))
            .collect();
        // Candidate pairs: each row with the other side's buffered rows of its key's hash.
        let semi_right = self.kind == JoinType::LeftSemi && side == RIGHT;
        let mut new_idx: Vec<u32> = Vec::new();
        let mut old_ids: Vec<u32> = Vec::new();
        let mut chain = Vec::new();
        for (r, &kept) in keep.iter().enumerate() {
            if !kept || nulls.as_ref().is_some_and(|v| v.is_null(r)) {
                continue;
            }
            self.sides[other].chain(hashes[r], &mut chain);
            for &id in &chain {
                if semi_right && self.sides[other].slots[id as usize].matched() {
                    continue;
                }
                new_idx.push(r as u32);
                old_ids.push(id);
            }
        }
        // The candidates' rows, read from the store once each.
        let mut distinct: Vec<u32> = old_ids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let (old_rows, mut old_idx) = if distinct.is_empty() {
            (None, Vec::new())
        } else {
            let rows = self.fetch(other, &distinct)?;
            let at: Vec<u32> = old_ids
                .iter()
                .map(|id| distinct.partition_point(|d| d < id) as u32)
                .collect();
            (Some(rows), at)
        };
        if let Some(rows) = &old_rows {
            // Only pairs whose keys are equal, not merely their hashes.
            let old_keys = self
                .keys
                .convert_columns(&self.sides[other].key_columns(rows))
                .map_err(arrow("encode the join keys"))?;
            let equal: Vec<bool> = new_idx
                .iter()
                .zip(&old_idx)
                .map(|(&r, &o)| keys.row(r as usize) == old_keys.row(o as usize))
                .collect();
            if equal.contains(&false) {
                let pick = |v: &[u32]| -> Vec<u32> {
                    v.iter()
                        .zip(&equal)
                        .filter(|(_, e)| **e)
                        .map(|(x, _)| *x)
                        .collect()
                };
                new_idx = pick(&new_idx);
                old_idx = pick(&old_idx);
                old_ids = pick(&old_ids);
            }
        }
        if let (Some(post), Some(rows)) = (&self.post, &old_rows)
            && !new_idx.is_empty()
        {
            let holds = if side == LEFT {
                evaluate_pairs(post, batch, &new_idx, rows, &old_idx)?
            } else {
                evaluate_pairs(post, rows, &old_idx, batch, &new_idx)?
            };
            let keep_pairs = |idx: &[u32]| -> Result<Vec<u32>, String> {
                let kept = arrow_select::filter::filter(&UInt32Array::from(idx.to_vec()), &holds)
                    .map_err(arrow("filter the pairs"))?;
                Ok(kept.as_primitive::<UInt32Type>().values().to_vec())
            };
            new_idx = keep_pairs(&new_idx)?;
            old_idx = keep_pairs(&old_idx)?;
            old_ids = keep_pairs(&old_ids)?;
        }
        let mut matched = vec![false; n];
        for &r in &new_idx {
            matched[r as usize] = true;
        }
        // The buffered rows matched now are remembered (an outer or semi join asks later).
        let remember = self.sides[other].marks;
        let mut semi_emitted: Vec<u32> = Vec::new();
        for (&id, &at) in old_ids.iter().zip(&old_idx) {
            let slot = &mut self.sides[other].slots[id as usize];
            if slot.matched() {
                continue;
            }
            slot.set_matched();
            let (partition, seq) = (slot.partition(), slot.seq());
            if semi_right {
                semi_emitted.push(at);
            }
            if remember {
                // No marker yet: the row was not matched before.
                self.state
                    .store_mut(partition)
                    .put_new(&store_key(MARK + other as u8, seq), &[])
                    .map_err(|e| e.to_string())?;
            }
        }
        // The joined rows.
        match (self.kind, &old_rows) {
            (JoinType::LeftSemi, _) => {
                let rows = if side == LEFT {
                    let firsts: Vec<u32> = (0..n as u32).filter(|r| matched[*r as usize]).collect();
                    take_all(batch, &firsts).map_err(arrow("take rows"))?
                } else if let Some(rows) = &old_rows {
                    take_all(rows, &semi_emitted).map_err(arrow("take rows"))?
                } else {
                    Vec::new()
                };
                let count = rows.first().map_or(0, |c| c.len());
                if count > 0 {
                    out.push(self.assemble(Some(rows), None, count, LEFT)?);
                }
            }
            (_, Some(rows)) if !new_idx.is_empty() => {
                let new_cols = take_all(batch, &new_idx).map_err(arrow("take rows"))?;
                let old_cols = take_all(rows, &old_idx).map_err(arrow("take rows"))?;
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
        let ids =
            self.sides[side].add(&buffered, &hashes, &partitions, &matched, times.as_deref())?;
        // Each buffered row is a new entry (its sequence number is new): no lookup.
        let marks = self.sides[side].marks;
        for (&r, &id) in buffered.iter().zip(&ids) {
            let slot = self.sides[side].slots[id as usize];
            let store = self.state.store_mut(slot.partition());
            store
                .put_new(
                    &store_key(ROW + side as u8, slot.seq()),
                    values.row(r as usize).as_ref(),
                )
                .map_err(|e| e.to_string())?;
            if slot.matched() && marks {
                store
                    .put_new(&store_key(MARK + side as u8, slot.seq()), &[])
                    .map_err(|e| e.to_string())?;
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
/// Decodes rows as the store holds them (arrow-row encoded) into a batch of `side`'s schema.
fn decode_rows(side: &Side, rows: &[&[u8]]) -> Result<RecordBatch, String> {
    let parser = side.rows.parser();
    // A hostile or damaged checkpoint's bytes must fail the batch, not the host.
    let columns = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        side.rows.convert_rows(rows.iter().map(|v| parser.parse(v)))
    }))
    .map_err(|_| "a row cannot be decoded".to_owned())?
    .map_err(|e| e.to_string())?;
    RecordBatch::try_new_with_options(
        Arc::clone(&side.schema),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows.len())),
    )
    .map_err(|e| e.to_string())
}

/// An entry of the earlier layout, to be written under its key in this one.
struct Rewrite {
    partition: usize,
    old: Vec<u8>,
    new: [u8; 9],
    value: Vec<u8>,
}

/// One partition's scan in a rebuild: rows waiting to be decoded, and the markers met.
struct Rebuilt<'a> {
    partition: usize,
    partitions: &'a PartitionedState,
    keys: &'a RowConverter,
    dir: &'a Path,
    /// Per side: rows (seq, value) not yet decoded.
    waiting: [Vec<(u64, Vec<u8>)>; 2],
    /// Per side: (seq, slot) of the rows indexed, to find a marker's row.
    seqs: [Vec<(u64, u32)>; 2],
    /// Per side: the sequence numbers of the matched markers.
    marks: [Vec<u64>; 2],
}

impl Rebuilt<'_> {
    /// A row entry of side `i`.
    fn row(&mut self, side: &mut Side, i: usize, seq: u64, value: &[u8]) -> Result<(), StateError> {
        self.waiting[i].push((seq, value.to_vec()));
        if self.waiting[i].len() >= REBUILD_CHUNK {
            self.absorb(side, i)?;
        }
        Ok(())
    }

    /// Indexes the waiting rows of side `i`, decoding them for their key's hash and event time.
    fn absorb(&mut self, side: &mut Side, i: usize) -> Result<(), StateError> {
        let waiting = std::mem::take(&mut self.waiting[i]);
        if waiting.is_empty() {
            return Ok(());
        }
        let (dir, name) = (self.dir, side.name.clone());
        let corrupt =
            |m: String| StateError::corrupt(dir, format!("the buffered rows of {name}: {m}"));
        let rows: Vec<&[u8]> = waiting.iter().map(|(_, v)| v.as_slice()).collect();
        let batch = decode_rows(side, &rows).map_err(&corrupt)?;
        let keys = self
            .keys
            .convert_columns(&side.key_columns(&batch))
            .map_err(|e| corrupt(e.to_string()))?;
        let times = side.eviction.map(|e| event_times(batch.column(e.column)));
        let mut run = Vec::new();
        for (r, (seq, _)) in waiting.iter().enumerate() {
            let hash = fnv::hash(keys.row(r).as_ref());
            if self.partitions.partition_of_hash(hash) != self.partition {
                return Err(corrupt("a row is in another key's partition".into()));
            }
            let id = side.insert(*seq, hash, self.partition, false);
            self.seqs[i].push((*seq, id));
            if let Some(t) = times.as_ref().and_then(|t| t[r]) {
                run.push((t, id));
            }
        }
        side.add_run(run);
        Ok(())
    }

    /// Indexes what is still waiting and marks the matched rows.
    fn finish(
        mut self,
        sides: &mut [Side; 2],
        all_seqs: &mut [Vec<u64>; 2],
    ) -> Result<(), StateError> {
        for (i, side) in sides.iter_mut().enumerate() {
            self.absorb(side, i)?;
            self.seqs[i].sort_unstable();
            all_seqs[i].extend(self.seqs[i].iter().map(|(seq, _)| *seq));
            for seq in &self.marks[i] {
                let at = self.seqs[i]
                    .binary_search_by_key(seq, |(s, _)| *s)
                    .map_err(|_| {
                        StateError::corrupt(
                            self.dir,
                            format!("a matched marker of {} has no buffered row", side.name),
                        )
                    })?;
                side.slots[self.seqs[i][at].1 as usize].set_matched();
            }
        }
        Ok(())
    }
}

/// The two-sided condition over aligned pairs of left and right rows.
fn evaluate_pairs(
    plan: &ConditionPlan,
    left: &RecordBatch,
    left_idx: &[u32],
    right: &RecordBatch,
    right_idx: &[u32],
) -> Result<BooleanArray, String> {
    let pick =
        |rows: &RecordBatch, idx: &[u32], names: &[String]| -> Result<Vec<ArrayRef>, String> {
            let schema = rows.schema();
            let wanted: Vec<usize> = names
                .iter()
                .map(|n| {
                    schema
                        .index_of(n)
                        .map_err(|_| format!("the condition's column {n} is missing"))
                })
                .collect::<Result<_, _>>()?;
            // Only the condition's columns: the output's are taken for the pairs that hold.
            take_columns(rows, idx, &wanted).map_err(|e| e.to_string())
        };
    let source = pick(left, left_idx, plan.source_columns())?;
    let target = pick(right, right_idx, plan.target_columns())?;
    plan.evaluate(left_idx.len(), source, target)
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
