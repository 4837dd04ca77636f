//! Streaming aggregation: Spark's `groupBy(window(...), keys).agg(...)` with
//! tumbling, sliding and session windows, in append, update and complete
//! output mode, over versioned [`StateStore`]s.
//!
//! Why it exists: a windowed aggregate is the query users most often run on
//! a stream, and its answer is only useful if it equals Spark's — the same
//! rows late, the same windows emitted in the same batch, the same decimal
//! digits. The rules below are Spark 4's (`StateStoreRestoreExec`,
//! `StateStoreSaveExec`, `SessionWindowStateStoreRestoreExec`/`SaveExec`,
//! `WatermarkSupport`, `TimeWindowing`, `MergingSessionsIterator`), checked
//! against measured runs (`bench/RESULTS.md` §5):
//!
//! - **Windows.** Rows with a null event time belong to no window. Tumbling:
//!   `start = ts − (ts mod size)` (floored, also before 1970), `end = start +
//!   size`. Sliding: every `[start, start+size)` with `start` a multiple of
//!   `slide` containing `ts`. Session: a row opens `[ts, ts+gap)`; sessions of
//!   the same keys merge when the next one starts at or before the current
//!   end (`start <= end`, as `MergingSessionsIterator`), within the batch and
//!   with the sessions in state.
//! - **Late data.** The late filter runs on partial aggregates, after the
//!   batch is grouped, with the previous batch's watermark `wm(b−1)`: a
//!   group is dropped when its event time — the window's end, or the value
//!   of a group key that is the watermark column — is `<= late_ms × 1000`
//!   µs. A row older than the watermark whose window has not ended is kept.
//!   `numRowsDroppedByWatermark` counts those dropped partial aggregates, not
//!   input rows (RESULTS.md §5.4, §5.9). Sessions are filtered per (keys,
//!   timestamp) partial, by `ts + gap`. Complete mode filters nothing
//!   (except sessions: Spark filters them before the merge in every mode).
//! - **Emission.** Append: a group is emitted once, in the batch whose
//!   watermark `wm(b)` reaches its end, then removed. Update: every group
//!   changed by the batch is emitted with its new totals, then groups whose
//!   end is `<= wm(b)` are removed silently. Complete: the whole state every
//!   batch, nothing removed. Without a watermark on a key nothing is late or
//!   removed.
//! - **Refused** (as Spark does, or because nothing could ever be emitted):
//!   append without a watermark or with a watermark on a column that is not
//!   a key, session windows in update mode or without keys.
//!
//! Aggregates: `count(*)`/`count(1)`, `count(col)` (non-null values),
//! `count(DISTINCT col)` (exact: each distinct value is a state entry under
//! its group; an extension — Spark refuses distinct aggregates on streams),
//! `approx_count_distinct(col)` (Spark's HyperLogLog++, equal to Spark's
//! answers, see `hll`), `sum` (integers → BIGINT and decimals → `DECIMAL(p+10,
//! s)` exact and checked as under Spark 4's ANSI mode; doubles → DOUBLE),
//! `avg`/`mean` (DOUBLE, or `DECIMAL(p+4, s+4)` rounded as Spark, see
//! `decimal`), `min`/`max` of any orderable type. Nulls are ignored except
//! by `count(*)`; a sum, average or extreme of only nulls is null.
//!
//! # Layout
//! - `expr`: the `select` expressions and Spark's default column names.
//! - `plan`: the configuration resolved against the input schema.
//! - `accumulate`: the columnar per-batch partial aggregation.
//! - `value`: a group's state value and how two merge.
//! - `output`: output rows from groups.
//! - `decimal`, `hll`: Spark's decimal rounding and HyperLogLog++.
//!
//! # State layout
//! Per partition store (partition = FNV-1a of the group key, or of the keys
//! without the session, modulo `num_partitions`):
//!
//! ```text
//! 0x00 ‖ T ‖ K                  → aggregate buffers       one entry per group (session)
//! 0x01 ‖ T ‖ K ‖ agg ‖ value    → ∅                       count(DISTINCT) values
//! 0x02 ‖ K ‖ start              → end                     sessions of K (session windows)
//! 0x03                          → u64 groups in the store
//! ```
//!
//! `T` is the window as `end ‖ start` (big-endian, sign flipped), or, without
//! a window, nothing — and the event-time key column comes first in `K`. So
//! "every group that ended at or before the watermark" is one key range.

mod accumulate;
mod decimal;
mod expr;
mod hll;
mod output;
mod plan;
mod value;

#[cfg(test)]
mod golden;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

pub use expr::{AggExpr, AggFunction, AggParseError, parse_agg_expr};
pub use plan::AggregateError;

use accumulate::Partials;
use output::OutputRows;
use plan::{Plan, TimeKey, WindowKind};

use crate::operator::key_encoding::{TAG_VALUE, flip_i64, unflip_i64};
use crate::operator::partitioned::{CountEntry, KeyCount, PartitionedConfig, PartitionedState};
use crate::operator::stateful::{
    OperatorError, OperatorMetrics, StateSchema, StatefulContext, StatefulOperator,
};
use crate::spec::{self, OutputMode, WindowSpec};
use crate::state::{StateError, StateOptions};

/// Prefix of group entries.
const GROUP: u8 = 0x00;
/// Prefix of `count(DISTINCT)` value entries.
const DISTINCT: u8 = 0x01;
/// Prefix of the session index.
const SESSION_INDEX: u8 = 0x02;
/// The key of a store's group count.
const META: &[u8] = &[0x03];

/// What to aggregate and how to keep its state.
#[derive(Debug, Clone)]
pub struct AggregateConfig {
    /// The pipeline's `aggregate.window`, as `weir validate` read it.
    pub window: Option<WindowSpec>,
    pub group_by: Vec<String>,
    /// From [`parse_agg_expr`], in output order.
    pub aggregates: Vec<AggExpr>,
    /// Spark's output mode: a group once, when the watermark passes its window's end
    /// (append); the groups a batch changed (update); the whole result every batch (complete).
    pub output_mode: OutputMode,
    /// The `[watermark]` column, if the query has one.
    pub watermark_column: Option<String>,
    /// How many state partitions (fixed for the checkpoint's lifetime).
    pub num_partitions: u32,
    /// `<checkpoint>/state/0`; partition `p` lives in `state_dir/p`.
    pub state_dir: PathBuf,
    pub state: StateOptions,
}

/// Buffers reused across the groups of one partition in a batch.
#[derive(Debug, Default)]
struct Scratch {
    key: Vec<u8>,
    distinct_key: Vec<u8>,
    partial: Vec<u8>,
    merged: Vec<u8>,
    distinct_new: Vec<i64>,
}

/// Spark's streaming aggregation (`stateStoreSave`).
pub struct AggregateOperator {
    plan: Arc<Plan>,
    /// The stores, counting groups under [`META`].
    state: PartitionedState,
    partials: Partials,
    /// Since the last load or commit: partial aggregates dropped as late
    /// and the input rows they held.
    rows_dropped: u64,
    input_rows_dropped: u64,
}

impl std::fmt::Debug for AggregateOperator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AggregateOperator")
            .field("name", &self.plan.name)
            .field("mode", &self.plan.mode)
            .field("window", &self.plan.window)
            .field("keys", &self.plan.keys)
            .field("time_key", &self.plan.time_key)
            .field("partitions", &self.state.partitions())
            .finish_non_exhaustive()
    }
}

/// The smallest key above every key that starts with `prefix` (`None`: none).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

impl AggregateOperator {
    /// Resolves `config` against the input schema and opens one state store
    /// per partition (empty until [`StatefulOperator::load`]).
    ///
    /// # Errors
    /// [`OperatorError::Invalid`] saying what is wrong and what to do: an
    /// unknown column, an aggregate over an unsupported type, append mode
    /// without a usable watermark, session windows in update mode or without
    /// keys; [`OperatorError::State`] when a store cannot be opened.
    pub fn new(config: AggregateConfig, input: &SchemaRef) -> Result<Self, OperatorError> {
        let plan = checked_plan(&config, input)?;
        let name = plan.name;
        let state = PartitionedState::open(&PartitionedConfig {
            dir: &config.state_dir,
            partitions: config.num_partitions,
            options: &config.state,
            count: KeyCount::Stored(CountEntry::LittleEndian(META)),
        })
        .map_err(|source| OperatorError::State {
            operator: name.to_owned(),
            source,
        })?;
        Ok(Self {
            plan: Arc::new(plan),
            state,
            partials: Partials::default(),
            rows_dropped: 0,
            input_rows_dropped: 0,
        })
    }

    /// Input rows inside the partial aggregates dropped as late since the
    /// last load or commit (Spark reports only the partial aggregates).
    pub fn input_rows_dropped(&self) -> u64 {
        self.input_rows_dropped
    }

    fn invalid(&self, e: AggregateError) -> OperatorError {
        OperatorError::Invalid {
            operator: self.plan.name.to_owned(),
            message: e.to_string(),
        }
    }

    fn state_error(&self, source: StateError) -> OperatorError {
        OperatorError::State {
            operator: self.plan.name.to_owned(),
            source,
        }
    }

    fn partition(&self, key: &[u8]) -> usize {
        self.state.partition_of(key)
    }

    /// The key range of `prefix` entries whose event time is `<= limit` µs.
    fn expired_range(plan: &Plan, prefix: u8, limit: i64) -> (Vec<u8>, Vec<u8>) {
        let mut start = vec![prefix];
        if plan.time_key == TimeKey::Column {
            // Null event times (tag 0x02) sort after every value: never expired.
            start.push(TAG_VALUE);
        }
        let end = match limit.checked_add(1) {
            Some(next) => {
                let mut end = start.clone();
                end.extend_from_slice(&flip_i64(next));
                end
            }
            None => prefix_end(&start).unwrap_or_else(|| vec![0xFF; 2]),
        };
        (start, end)
    }

    /// Merges each non-late partial group into the state (one get and one
    /// put per group), emitting the merged groups in update mode. The
    /// partitions run on the query's threads, each over its groups in group
    /// order; the merged groups are emitted in group order after all of them.
    /// (A failure is the first partition's, where one thread would have met
    /// another group's first; the batch fails either way.)
    fn merge_groups(
        &mut self,
        plan: &Plan,
        late: Option<i64>,
        out: &mut OutputRows<'_>,
    ) -> Result<(), OperatorError> {
        let distinct = if plan.has_distinct {
            self.partials.distinct_values()
        } else {
            Vec::new()
        };
        // Each non-late group, with the range of its distinct values, in its partition's list.
        let mut parts: Vec<Vec<(usize, std::ops::Range<usize>)>> =
            vec![Vec::new(); self.state.partitions()];
        let mut d = 0;
        for g in 0..self.partials.len() {
            let start = d;
            while d < distinct.len() && distinct[d].0 as usize == g {
                d += 1;
            }
            if let (Some(limit), Some(t)) = (late, self.partials.time[g])
                && t <= limit
            {
                self.rows_dropped += 1;
                self.input_rows_dropped += self.partials.rows[g];
                continue;
            }
            let p = self.state.partition_of(&self.partials.keys[g]);
            parts[p].push((g, start..d));
        }
        let partials = &self.partials;
        let update = plan.mode == OutputMode::Update;
        let state = |source| OperatorError::State {
            operator: plan.name.to_owned(),
            source,
        };
        let merged = self.state.each_store(|p, store| {
            let mut scratch = Scratch {
                distinct_new: vec![0; plan.aggs.len()],
                ..Scratch::default()
            };
            let mut new_groups = 0u64;
            let mut emitted = Vec::new();
            for (g, values) in &parts[p] {
                let (g, key) = (*g, &partials.keys[*g]);
                scratch.distinct_new.fill(0);
                for &(_, a, v) in &distinct[values.clone()] {
                    let dk = &mut scratch.distinct_key;
                    dk.clear();
                    dk.push(DISTINCT);
                    dk.extend_from_slice(key);
                    dk.push(a);
                    dk.extend_from_slice(v);
                    if !store.contains(dk).map_err(state)? {
                        store.put(dk, &[]).map_err(state)?;
                        scratch.distinct_new[usize::from(a)] += 1;
                    }
                }
                partials
                    .encode(plan, g, &scratch.distinct_new, &mut scratch.partial)
                    .map_err(|e| invalid(plan, e))?;
                scratch.key.clear();
                scratch.key.push(GROUP);
                scratch.key.extend_from_slice(key);
                let old = store.get(&scratch.key).map_err(state)?;
                let merged: &[u8] = match &old {
                    None => &scratch.partial,
                    Some(old) => {
                        value::merge(plan, old, &scratch.partial, &mut scratch.merged)
                            .map_err(|e| merge_error(plan, key, e))?;
                        &scratch.merged
                    }
                };
                store.put(&scratch.key, merged).map_err(state)?;
                if old.is_none() {
                    new_groups += 1;
                }
                if update {
                    emitted.push((g, merged.to_vec()));
                }
            }
            Ok::<_, OperatorError>((new_groups, parts[p].len() as u64, emitted))
        })?;
        let mut emitted = Vec::new();
        for (p, (new_groups, updated, merged)) in merged.into_iter().enumerate() {
            self.state.add_keys(p, new_groups);
            self.state.updated(updated);
            emitted.extend(merged);
        }
        emitted.sort_unstable_by_key(|(g, _)| *g);
        for (g, merged) in &emitted {
            out.add(&self.partials.keys[*g], merged)
                .map_err(|e| invalid(plan, e))?;
        }
        Ok(())
    }

    /// Merges the batch's (keys, timestamp) partials into the sessions in
    /// state, key by key.
    fn merge_sessions(
        &mut self,
        plan: &Plan,
        gap: i64,
        late: Option<i64>,
    ) -> Result<(), OperatorError> {
        let mut order: Vec<u32> = Vec::with_capacity(self.partials.len());
        for g in 0..self.partials.len() {
            let ts = self.partials.time[g].unwrap_or(i64::MIN);
            if late.is_some_and(|limit| ts.saturating_add(gap) <= limit) {
                self.rows_dropped += 1;
                self.input_rows_dropped += self.partials.rows[g];
            } else {
                order.push(g as u32);
            }
        }
        // Partial keys are `K ‖ ts`: sorting groups them by K, then by ts.
        let keys = &self.partials.keys;
        order.sort_by(|&a, &b| keys[a as usize].cmp(&keys[b as usize]));
        let mut i = 0;
        while i < order.len() {
            let first = &self.partials.keys[order[i] as usize];
            let k = first[..first.len().saturating_sub(8)].to_vec();
            let mut j = i + 1;
            while j < order.len() {
                let key = &self.partials.keys[order[j] as usize];
                if key.len() != first.len() || key[..k.len()] != k[..] {
                    break;
                }
                j += 1;
            }
            let members = order[i..j].to_vec();
            self.merge_session_key(plan, gap, &k, &members)?;
            i = j;
        }
        Ok(())
    }

    /// Merges the partials `members` (sorted by timestamp) of keys `k` with
    /// the sessions of `k` in state.
    fn merge_session_key(
        &mut self,
        plan: &Plan,
        gap: i64,
        k: &[u8],
        members: &[u32],
    ) -> Result<(), OperatorError> {
        #[derive(Clone, Copy)]
        enum Part {
            Existing(i64, i64),
            Partial(u32),
        }
        let p = self.partition(k);
        let state = |source| OperatorError::State {
            operator: plan.name.to_owned(),
            source,
        };
        let mut index_prefix = vec![SESSION_INDEX];
        index_prefix.extend_from_slice(k);
        let index_end = prefix_end(&index_prefix);
        let mut existing: Vec<(i64, i64)> = Vec::new();
        let mut bad = None;
        self.state
            .store_mut(p)
            .scan(&index_prefix, index_end.as_deref(), &mut |key, value| {
                let start = key.len().checked_sub(8).map(|s| &key[s..]);
                match (start, value.len()) {
                    (Some(s), 8) => {
                        let mut a = [0u8; 8];
                        let mut b = [0u8; 8];
                        a.copy_from_slice(s);
                        b.copy_from_slice(value);
                        existing.push((unflip_i64(a), unflip_i64(b)));
                    }
                    _ => bad = Some(key.to_vec()),
                }
                Ok(true)
            })
            .map_err(state)?;
        if let Some(key) = bad {
            return Err(invalid(
                plan,
                AggregateError::CorruptState {
                    key: format!("{key:02x?}"),
                    reason: "session index entry".into(),
                },
            ));
        }

        // Existing sessions and new (ts, ts + gap) partials, by start;
        // state first on equal starts.
        let mut parts: Vec<(i64, i64, Part)> = Vec::with_capacity(existing.len() + members.len());
        let (mut e, mut m) = (0, 0);
        while e < existing.len() || m < members.len() {
            let partial = members.get(m).map(|&g| {
                let ts = self.partials.time[g as usize].unwrap_or(i64::MIN);
                (ts, ts.saturating_add(gap), g)
            });
            match (existing.get(e), partial) {
                (Some(&(s, en)), Some((ts, _, _))) if s <= ts => {
                    parts.push((s, en, Part::Existing(s, en)));
                    e += 1;
                }
                (_, Some((ts, end, g))) => {
                    parts.push((ts, end, Part::Partial(g)));
                    m += 1;
                }
                (Some(&(s, en)), None) => {
                    parts.push((s, en, Part::Existing(s, en)));
                    e += 1;
                }
                (None, None) => break,
            }
        }

        let mut i = 0;
        while i < parts.len() {
            let (start, mut end, _) = parts[i];
            let mut j = i + 1;
            while j < parts.len() && parts[j].0 <= end {
                end = end.max(parts[j].1);
                j += 1;
            }
            let session = &parts[i..j];
            i = j;
            // Spark rewrites every session of a key that had input
            // (`updateSessions`): each counts as updated, changed or not.
            self.state.updated(1);
            if let [(_, _, Part::Existing(..))] = session {
                continue;
            }
            // The merged value, in start order.
            let mut value: Option<Vec<u8>> = None;
            for &(_, _, part) in session {
                let bytes = match part {
                    Part::Existing(s, en) => {
                        let key = session_key(s, en, k);
                        self.state
                            .store(p)
                            .get(&key)
                            .map_err(state)?
                            .ok_or_else(|| {
                                invalid(
                                    plan,
                                    AggregateError::CorruptState {
                                        key: format!("{key:02x?}"),
                                        reason: "session in the index but not in state".into(),
                                    },
                                )
                            })?
                    }
                    Part::Partial(g) => {
                        let mut bytes = Vec::new();
                        self.partials
                            .encode(plan, g as usize, &[], &mut bytes)
                            .map_err(|e| invalid(plan, e))?;
                        bytes
                    }
                };
                value = Some(match value {
                    None => bytes,
                    Some(acc) => {
                        let mut merged = Vec::with_capacity(acc.len());
                        let mut group = flip_i64(end).to_vec();
                        group.extend_from_slice(&flip_i64(start));
                        group.extend_from_slice(k);
                        value::merge(plan, &acc, &bytes, &mut merged)
                            .map_err(|e| merge_error(plan, &group, e))?;
                        merged
                    }
                });
            }
            let store = self.state.store_mut(p);
            let (mut replaced, mut absorbed) = (0, 0);
            for &(_, _, part) in session {
                if let Part::Existing(s, en) = part {
                    store.delete(&session_key(s, en, k)).map_err(state)?;
                    store.delete(&index_key(s, k)).map_err(state)?;
                    replaced += 1;
                    // Spark keys sessions by (keys, start): one absorbed by
                    // a session starting elsewhere is a removed state row.
                    if s != start {
                        absorbed += 1;
                    }
                }
            }
            let value = value.unwrap_or_default();
            store
                .put(&session_key(start, end, k), &value)
                .map_err(state)?;
            store
                .put(&index_key(start, k), &flip_i64(end))
                .map_err(state)?;
            self.state.remove_keys(p, replaced);
            self.state.removed(absorbed);
            self.state.add_keys(p, 1);
        }
        Ok(())
    }

    /// Removes the groups whose event time is `<= limit` µs from every
    /// store, adding them to `out` when given (append mode). The partitions
    /// run on the query's threads; the groups are added in partition order,
    /// each partition's in key order. (A failure is the first partition's,
    /// where one thread would have met another partition's first; the batch
    /// fails either way.)
    fn evict(
        &mut self,
        plan: &Plan,
        limit: i64,
        mut out: Option<&mut OutputRows<'_>>,
    ) -> Result<(), OperatorError> {
        let (start, end) = Self::expired_range(plan, GROUP, limit);
        let distinct_range = Self::expired_range(plan, DISTINCT, limit);
        let session = plan.is_session();
        let state = |source| OperatorError::State {
            operator: plan.name.to_owned(),
            source,
        };
        // Values are copied only when they are emitted.
        let emit = out.is_some();
        let evicted = self.state.each_store(|_, store| {
            let mut expired: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            store
                .scan(&start, Some(&end), &mut |k, v| {
                    let v = if emit { v.to_vec() } else { Vec::new() };
                    expired.push((k.to_vec(), v));
                    Ok(true)
                })
                .map_err(state)?;
            for (key, _) in &expired {
                let group = &key[1..];
                store.delete(key).map_err(state)?;
                if session && group.len() >= output::WINDOW_BYTES {
                    let mut s = [0u8; 8];
                    s.copy_from_slice(&group[8..16]);
                    store
                        .delete(&index_key(unflip_i64(s), &group[16..]))
                        .map_err(state)?;
                }
            }
            if plan.has_distinct {
                let mut keys: Vec<Vec<u8>> = Vec::new();
                store
                    .scan(&distinct_range.0, Some(&distinct_range.1), &mut |k, _| {
                        keys.push(k.to_vec());
                        Ok(true)
                    })
                    .map_err(state)?;
                for key in &keys {
                    store.delete(key).map_err(state)?;
                }
            }
            Ok::<_, OperatorError>(expired)
        })?;
        for (p, expired) in evicted.into_iter().enumerate() {
            let n = expired.len() as u64;
            self.state.remove_keys(p, n);
            self.state.removed(n);
            if let Some(out) = out.as_deref_mut() {
                for (key, value) in &expired {
                    out.add(&key[1..], value).map_err(|e| invalid(plan, e))?;
                }
            }
        }
        Ok(())
    }

    /// Adds every group in state to `out` (complete mode).
    fn emit_all(&self, plan: &Plan, out: &mut OutputRows<'_>) -> Result<(), OperatorError> {
        for store in self.state.stores() {
            let mut failed = None;
            store
                .scan(&[GROUP], Some(&[GROUP + 1]), &mut |k, v| {
                    if let Err(e) = out.add(&k[1..], v) {
                        failed = Some(e);
                        return Ok(false);
                    }
                    Ok(true)
                })
                .map_err(|e| self.state_error(e))?;
            if let Some(e) = failed {
                return Err(invalid(plan, e));
            }
        }
        Ok(())
    }
}

/// Resolves `config` against `input`, refusing what cannot run.
fn checked_plan(config: &AggregateConfig, input: &SchemaRef) -> Result<Plan, OperatorError> {
    let name = match &config.window {
        Some(WindowSpec {
            kind: spec::WindowKind::Session { .. },
            ..
        }) => plan::NAME_SESSION,
        _ => plan::NAME,
    };
    let plan = plan::plan(config, input).map_err(|e| OperatorError::Invalid {
        operator: name.to_owned(),
        message: e.to_string(),
    })?;
    if plan.aggs.len() > usize::from(u8::MAX) {
        return Err(OperatorError::Invalid {
            operator: name.to_owned(),
            message: format!("{} aggregates; at most 255 are supported", plan.aggs.len()),
        });
    }
    Ok(plan)
}

/// The shape of the state [`AggregateOperator::new`] would keep for
/// `config` over `input`, found without opening any store: the key is the
/// window (`window_start`, `window_end`) then the group keys in state-key
/// order; the value is every aggregate's buffer, named `<output>.<part>`.
///
/// # Errors
/// As [`AggregateOperator::new`] for a configuration that cannot run.
pub fn state_schema(
    config: &AggregateConfig,
    input: &SchemaRef,
) -> Result<StateSchema, OperatorError> {
    let plan = checked_plan(config, input)?;
    Ok(plan::state_schema(&plan))
}

/// The state key of session `[start, end)` of keys `k`.
fn session_key(start: i64, end: i64, k: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + 16 + k.len());
    key.push(GROUP);
    key.extend_from_slice(&flip_i64(end));
    key.extend_from_slice(&flip_i64(start));
    key.extend_from_slice(k);
    key
}

/// The session index key of the session of keys `k` starting at `start`.
fn index_key(start: i64, k: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + k.len() + 8);
    key.push(SESSION_INDEX);
    key.extend_from_slice(k);
    key.extend_from_slice(&flip_i64(start));
    key
}

fn invalid(plan: &Plan, e: AggregateError) -> OperatorError {
    OperatorError::Invalid {
        operator: plan.name.to_owned(),
        message: e.to_string(),
    }
}

fn merge_error(plan: &Plan, group: &[u8], e: value::MergeError) -> OperatorError {
    let e = match e {
        value::MergeError::Corrupt => AggregateError::CorruptState {
            key: output::describe_key(plan, group),
            reason: "value does not match the aggregates".into(),
        },
        value::MergeError::Overflow { index } => {
            let agg = &plan.aggs[index];
            AggregateError::Overflow {
                expr: agg.expr.text.clone(),
                result_type: agg.field.data_type().to_string(),
                group: output::describe_key(plan, group),
            }
        }
    };
    invalid(plan, e)
}

impl StatefulOperator for AggregateOperator {
    fn name(&self) -> &str {
        self.plan.name
    }

    fn output_schema(&self) -> &SchemaRef {
        &self.plan.output
    }

    fn load(&mut self, version: Option<u64>) -> Result<(), StateError> {
        self.state.load(version)?;
        self.rows_dropped = 0;
        self.input_rows_dropped = 0;
        Ok(())
    }

    fn process(
        &mut self,
        ctx: &StatefulContext,
        input: &[RecordBatch],
    ) -> Result<Vec<RecordBatch>, OperatorError> {
        let plan = Arc::clone(&self.plan);
        // Spark: late when `eventTime <= watermarkMs * 1000` (inclusive).
        let late = plan.late_filter.then(|| ctx.late_ms.saturating_mul(1000));
        let limit = plan.evicts.then(|| ctx.watermark_ms.saturating_mul(1000));

        let mut partials = std::mem::take(&mut self.partials);
        partials.reset(&plan);
        let mut result = Ok(());
        for batch in input {
            result = partials.add_batch(&plan, batch);
            if result.is_err() {
                break;
            }
        }
        if plan.window.is_none() && plan.keys.is_empty() {
            partials.ensure_global_group();
        }
        self.partials = partials;
        result.map_err(|e| self.invalid(e))?;

        let mut out = OutputRows::new(&plan);
        match plan.window.as_ref().map(|w| w.kind) {
            Some(WindowKind::Session { gap }) => self.merge_sessions(&plan, gap, late)?,
            _ => self.merge_groups(&plan, late, &mut out)?,
        }
        match plan.mode {
            OutputMode::Append => {
                if let Some(limit) = limit {
                    self.evict(&plan, limit, Some(&mut out))?;
                }
            }
            OutputMode::Update => {
                if let Some(limit) = limit {
                    self.evict(&plan, limit, None)?;
                }
            }
            OutputMode::Complete => self.emit_all(&plan, &mut out)?,
        }
        if self.input_rows_dropped > 0 {
            tracing::debug!(
                operator = plan.name,
                batch_id = ctx.batch_id,
                partial_aggregates = self.rows_dropped,
                input_rows = self.input_rows_dropped,
                "late rows dropped"
            );
        }
        let rows = out.len();
        let batch = out.finish().map_err(|source| OperatorError::Arrow {
            operator: plan.name.to_owned(),
            source,
        })?;
        debug_assert!(batch.as_ref().map_or(0, RecordBatch::num_rows) == rows);
        Ok(batch.into_iter().collect())
    }

    fn commit(&mut self, batch_id: u64) -> Result<OperatorMetrics, StateError> {
        let metrics = self
            .state
            .commit(batch_id, self.plan.name, self.rows_dropped)?;
        self.rows_dropped = 0;
        self.input_rows_dropped = 0;
        Ok(metrics)
    }
}
