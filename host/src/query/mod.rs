//! One streaming query run micro-batch after micro-batch with Spark's
//! checkpoint protocol, which is what makes it exactly-once:
//!
//! 1. plan: choose the input of batch N, write it to the source log and
//!    `offsets/N` (atomically) before anything runs;
//! 2. run: read exactly that input, decode, transform, hand the output to
//!    the sink with batch id N (sinks are idempotent by batch id);
//! 3. commit: write `commits/N`.
//!
//! After a crash the last `offsets/N` without `commits/N` is run again with
//! the same input and timestamp, so the sink sees the same batch again and
//! replaces it. See DESIGN.md §3.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use serde::{Deserialize, Serialize};

mod fingerprint;
mod listeners;
mod plan;
mod plugins;
mod real_time;
mod recovery;
mod reload;
mod sinks;
mod stage;

pub use listeners::{WebhookTarget, webhook_target};
pub use reload::ReloadOutcome;

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::decode::{self, DecodeError};
use crate::failpoint::{Failpoint, Phase};
use crate::operator::join::{JoinError, StaticJoin, StreamJoin, TableSnapshot};
use crate::operator::stateful::{
    OperatorError, OperatorMetrics, StatefulContext, StatefulOperator,
};
use crate::operator::wasm_state::{KeyedState, KeyedStateConfig};
use crate::operator::{BatchTransform, TransformError};
use crate::plugin::{
    BatchInfo, PluginEngine, PluginError, PluginUsage, QueryEvent, ReplayKey, SharedFunction,
};
use crate::progress::{self, PluginProgress, QueryProgress, SinkProgress, SourceProgress};
use crate::sink::{MemorySink, SinkError};
use crate::source::{self as sources, Source, SourceBatch, SourceError};
use crate::spec::{self, OutputMode, Pipeline, Trigger, WatermarkPolicy};
use crate::sql::SqlTransform;
use crate::state::{StateError, StateOptions, StoreKind};
use crate::threads::Threads;
use crate::watermark::{self, EventTimeRange, Watermark, WatermarkError};
use plugins::PluginContext;
use recovery::Watermarks;
use stage::{QuerySink, StatefulStage, Transform};

/// How long the continuous trigger waits before looking for new files again.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How long an ending query waits for its listeners to hear the last events.
const LISTENERS_GRACE: Duration = Duration::from_secs(5);
/// Offsets and commits kept for inspection (Spark's `minBatchesToRetain`).
const BATCHES_TO_RETAIN: u64 = 100;
// A files source keeps the file lists of up to this many batches in `offsets/N` only.
const _: () = assert!(crate::source::files::LOG_EVERY < BATCHES_TO_RETAIN);

/// A source of time, so that tests control batch timestamps.
pub trait Clock: Send + Sync {
    /// Milliseconds since the epoch.
    fn now_ms(&self) -> i64;
}

/// The machine's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

/// Builds a transform for the schema it will receive.
pub type MakeTransform = Box<dyn FnOnce(&SchemaRef) -> Box<dyn BatchTransform>>;

/// Process-level settings of a query run (not part of the pipeline file).
pub struct QueryOptions {
    /// Where compiled plugins are cached.
    pub cache_dir: Option<PathBuf>,
    /// Crash injection for recovery tests (the `failpoints` feature only).
    #[cfg(feature = "failpoints")]
    pub failpoint: Option<Failpoint>,
    /// Set to stop after the current batch (SIGINT/SIGTERM).
    pub stop: Arc<AtomicBool>,
    pub clock: Arc<dyn Clock>,
    /// Where a console sink prints.
    pub console: Option<Box<dyn std::io::Write + Send>>,
    /// The table a `memory` sink writes into.
    pub memory_sink: Option<MemorySink>,
    /// Transforms added after those of the pipeline file (native ones, from programs embedding the host).
    pub extra_transforms: Vec<MakeTransform>,
    /// Set (SIGHUP) to look for new plugin builds before the next batch:
    /// every plugin file is hashed again. Cleared when done.
    pub reload: Arc<AtomicBool>,
    /// Look for new plugin builds before every batch (a `stat` per plugin
    /// file; hashed only when its size or modification time changed).
    pub watch_plugins: bool,
    /// The operator's policy (`--policy`): what the pipeline's paths, grants and limits may
    /// be. `None`: [`spec::Policy::permissive`].
    pub policy: Option<Arc<spec::Policy>>,
    /// Called with each batch's progress record once it is written (`weir serve`'s status and
    /// metrics, `weir run --metrics`).
    pub on_progress: Option<ProgressHook>,
    /// Called after every look for new builds that `reload` asked for, with what it did (`weir
    /// serve` answers a plugin upload with it).
    pub on_reload: Option<ReloadHook>,
}

/// See [`QueryOptions::on_progress`]: the record, and the same as JSON (as the checkpoint's
/// `progress.jsonl` has it), so that a hook need not serialise it again.
pub type ProgressHook = Arc<dyn Fn(&QueryProgress, &serde_json::Value) + Send + Sync>;
/// See [`QueryOptions::on_reload`].
pub type ReloadHook = Arc<dyn Fn(&[ReloadOutcome]) + Send + Sync>;

impl std::fmt::Debug for QueryOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryOptions")
            .field("cache_dir", &self.cache_dir)
            .field("failpoint", &self.failpoint())
            .finish_non_exhaustive()
    }
}

impl QueryOptions {
    /// Where this run kills itself, if anywhere (never without the `failpoints` feature).
    pub(crate) fn failpoint(&self) -> Option<Failpoint> {
        #[cfg(feature = "failpoints")]
        {
            self.failpoint
        }
        #[cfg(not(feature = "failpoints"))]
        {
            None
        }
    }
}

impl Default for QueryOptions {
    fn default() -> Self {
        Self {
            cache_dir: None,
            #[cfg(feature = "failpoints")]
            failpoint: None,
            stop: Arc::new(AtomicBool::new(false)),
            clock: Arc::new(SystemClock),
            console: None,
            memory_sink: None,
            extra_transforms: Vec::new(),
            reload: Arc::new(AtomicBool::new(false)),
            watch_plugins: false,
            policy: None,
            on_progress: None,
            on_reload: None,
        }
    }
}

/// A query failed. Each variant names what failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("source {source_name}: {error}")]
    Decoder {
        source_name: String,
        error: DecodeError,
    },
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error(transparent)]
    Transform(#[from] TransformError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("batch {batch_id}: {message}")]
    Protocol { batch_id: u64, message: String },
    #[error(transparent)]
    Operator(#[from] OperatorError),
    #[error(transparent)]
    Join(#[from] JoinError),
    #[error(transparent)]
    Watermark(#[from] WatermarkError),
    #[error("state: {0}")]
    State(#[from] StateError),
    #[error("query {query}: {message}")]
    Invalid { query: String, message: String },
    #[error("the checkpoint {} was written by another query and cannot be resumed:\n  - {}\nStart a new checkpoint (change query.checkpoint), or undo the change.", checkpoint.display(), changes.join("\n  - "))]
    Changed {
        checkpoint: PathBuf,
        changes: Vec<String>,
    },
}

/// `offsets/N`: what batch N reads, written before it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OffsetEntry {
    /// wm(b): what stateful operators emit and evict by.
    pub batch_watermark_ms: i64,
    /// wm(b−1): what late rows are filtered by (Spark ≥ 3.4 keeps both).
    #[serde(default)]
    pub late_row_watermark_ms: i64,
    pub batch_timestamp_ms: i64,
    pub sources: Vec<SourceOffset>,
    /// The plugin builds batch N runs with, in pipeline order (the sink's
    /// last), so that a replay knows when it runs another build.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plugins: Vec<PluginBuild>,
    /// The static tables batch N joins against, as they were when it was planned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<TableSnapshot>,
}

/// One plugin build, as `offsets/N` records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginBuild {
    pub name: String,
    pub sha256: String,
}

/// Where one source stands after batch N: the entry of its own log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceOffset {
    pub name: String,
    pub log_offset: u64,
    /// This input's own watermark going into the batch (with a `[watermark]`),
    /// from which the query's is combined by `query.watermark_policy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark_ms: Option<i64>,
    /// A real-time batch: where its parts were cut (see `real_time`), so that a replay runs
    /// the same parts.
    #[serde(
        default,
        rename = "realTimeParts",
        skip_serializing_if = "Option::is_none"
    )]
    pub parts: Option<serde_json::Value>,
    /// What the source keeps here itself (a Kafka source: `kafka`, the end
    /// offset of every partition as Spark writes it, and `kafkaStart`).
    #[serde(flatten)]
    pub recorded: sources::Recorded,
}

/// `commits/N`: batch N finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommitEntry {
    pub next_batch_watermark_ms: i64,
    /// Each input's watermark for the next batch, in source order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub next_source_watermarks_ms: Vec<i64>,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    pub batches: u64,
    pub input_rows: u64,
    pub output_rows: u64,
    pub malformed_rows: u64,
    /// The progress records of this run's batches.
    pub last_batch_id: Option<u64>,
}

/// A started query: checkpoint locked, plugins instantiated.
pub struct Query {
    pipeline: Pipeline,
    checkpoint: Checkpoint,
    run_id: String,
    /// The query's inputs, unioned; index i owns `sources/<i>/`.
    sources: Vec<Box<dyn Source>>,
    transforms: Vec<Transform>,
    /// The source each transform applies to (`input`), or `None` for every one.
    transform_inputs: Vec<Option<usize>>,
    /// What surrounds the aggregates of `[aggregate] select`, when it has expressions.
    after_aggregate: Option<SqlTransform>,
    /// The plugins of `[[function]]`, which the SQL transforms call.
    functions: Vec<Arc<SharedFunction>>,
    /// The stream-static `[join]`, applied before `transforms[join_at]` (after all of them when
    /// it is their count): after the transforms of one input, before those of all.
    join: Option<StaticJoin>,
    join_at: usize,
    /// The stream-stream `[join]`: where the inputs meet, after their own transforms.
    stream_join: Option<StreamJoin>,
    /// With a stream-stream join, each source's own watermark (`[[source]] watermark`),
    /// observed on its rows where they reach the join.
    input_watermarks: Vec<Option<Watermark>>,
    /// Whether a transform keeps keyed state (loaded and committed per batch).
    stateful_transforms: bool,
    watermark: Option<Watermark>,
    stateful: Option<Box<dyn StatefulOperator>>,
    /// wm of the last planned batch, i.e. wm(b−1) for the next one.
    last_watermark_ms: i64,
    /// wm for the next batch to plan.
    next_watermark_ms: i64,
    /// Each input's watermark for the next batch to plan.
    source_watermarks_ms: Vec<i64>,
    sink: QuerySink,
    output_schema: SchemaRef,
    /// A planned batch without a commit, to run again first.
    pending: Option<u64>,
    next_batch: u64,
    options: QueryOptions,
    /// The engine every plugin of the query runs on, which loads new builds.
    engine: PluginEngine,
    /// The plugin files, watched for new builds.
    watched: Vec<reload::Watched>,
    last_trigger: Option<Instant>,
    /// Per input: clock time it last had data (for the idle timeout).
    last_input_ms: Vec<i64>,
    /// Time spent asking the sources for new input since the last batch
    /// (Spark's `durationMs.latestOffset`).
    poll_time: Duration,
    /// The `[[listener]]`s, on their own thread.
    listeners: listeners::Listeners,
    /// Whether the last trigger found no data (the listeners heard `queryIdle` once for it).
    idle: bool,
    summary: RunSummary,
}

impl std::fmt::Debug for Query {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Query")
            .field("name", &self.pipeline.query.name)
            .field("run_id", &self.run_id)
            .field("next_batch", &self.next_batch)
            .field("pending", &self.pending)
            .finish_non_exhaustive()
    }
}

impl Query {
    /// Locks the checkpoint, finds where the query stands, and starts the
    /// source, the plugins and the sink.
    ///
    /// # Errors
    /// When the checkpoint is locked or damaged, or a plugin or the sink
    /// cannot start.
    pub fn start(mut pipeline: Pipeline, mut options: QueryOptions) -> Result<Self, QueryError> {
        // The rules `weir validate` checks too, again for a pipeline built in code (a parsed
        // one has been through them), before anything is opened.
        let confinement = spec::Confinement {
            policy: options.policy.as_deref(),
            cache_dir: options.cache_dir.as_deref(),
        };
        let problems: Vec<String> = spec::stateful_problems(&pipeline)
            .into_iter()
            .chain(spec::sink_problems(&pipeline))
            .chain(spec::confinement_problems(&pipeline, confinement))
            .map(|p| p.to_string())
            .collect();
        if !problems.is_empty() {
            return Err(QueryError::Invalid {
                query: pipeline.query.name.clone(),
                message: problems.join("; "),
            });
        }
        let private_networks = options.policy.as_ref().is_none_or(|p| p.private_networks);
        let mut checkpoint = Checkpoint::open(&pipeline.query.checkpoint)?;
        // Unset, the state store is the one the checkpoint's state was written with: a default
        // that changes between releases must not strand a checkpoint.
        if pipeline.query.state_store.is_none() {
            pipeline.query.state_store = recorded_state_store(&checkpoint);
        }
        let position = recovery::position(&checkpoint)?;
        let (last_planned, pending, next_batch) =
            (position.last_planned, position.pending, position.next_batch);

        // One budget for everything the query runs in parallel.
        let threads = Threads::new(pipeline.query.threads.unwrap_or_else(|| {
            std::thread::available_parallelism().unwrap_or(std::num::NonZeroUsize::MIN)
        }));
        let mut sources = Vec::with_capacity(pipeline.sources.len());
        for (index, spec) in pipeline.sources.iter().enumerate() {
            sources.push(sources::open(
                spec,
                index,
                &checkpoint,
                last_planned,
                threads.clone(),
            )?);
        }
        let engine = plugins::engine(&pipeline, &options)?;
        let plugins_ctx = PluginContext {
            engine: &engine,
            // Every plugin of the query draws its random numbers from the checkpoint's secret.
            replay_key: ReplayKey::new(checkpoint.secret(), checkpoint.secret_since()),
            private_networks,
            failpoint: options.failpoint(),
        };
        // The plugins' scalar functions, one instance per `[[function]]`, shared by every SQL
        // expression that calls them.
        let (functions, function_plugins) = plugins::functions(&pipeline, &plugins_ctx)?;
        let store_options = state_options(&pipeline.query, threads.clone());
        // Inputs → their own transforms → join → transforms (→ the stateful operator, below).
        let plan::Stages {
            mut transforms,
            transform_inputs,
            join,
            stream_join,
            join_at,
            input_watermarks,
            mut watched,
            mut schema,
            stateful_plugins,
            lowered_pipeline,
            after_aggregate,
        } = plan::stages(
            &pipeline,
            &sources,
            &checkpoint,
            &plugins_ctx,
            &functions,
            std::mem::take(&mut options.extra_transforms),
            &store_options,
        )?;
        let stateful_pipeline = lowered_pipeline.as_ref().unwrap_or(&pipeline);

        let watermark = match &pipeline.watermark {
            Some(w) => Some(Watermark::new(
                &w.column,
                i64::try_from(w.delay.as_millis()).unwrap_or(i64::MAX),
                &schema,
            )?),
            None => None,
        };
        // Planned, not opened: no state store is touched before the
        // fingerprint check, so a refused restart leaves the checkpoint as it was.
        let mut planned = plan::plan_stateful(
            stateful_pipeline,
            checkpoint.state_dir("0"),
            &schema,
            &store_options,
        )?;
        if let (Some(p), Some(recorded)) = (&mut planned, &checkpoint.metadata().fingerprint) {
            p.keep_recorded_layout(recorded, &schema)?;
        }

        // The checkpoint must have been written by this query (§3.3).
        let plugins: Vec<(String, String)> = transforms
            .iter()
            .filter_map(Transform::plugin_usage)
            .map(|(name, sha, _)| (name, sha))
            .collect();
        let join_state = stream_join.as_ref().map(StreamJoin::state_schema);
        let fingerprint = fingerprint::of(
            &pipeline,
            planned
                .as_ref()
                .map(|p| &p.state_schema)
                .or(join_state.as_ref()),
            &plugins,
            &stateful_plugins
                .iter()
                .map(|(_, name)| name.clone())
                .collect::<Vec<_>>(),
        );
        fingerprint::check(&mut checkpoint, fingerprint, &pipeline.query.name)?;
        for (rank, (i, name)) in stateful_plugins.iter().enumerate() {
            let state = KeyedState::open(&KeyedStateConfig {
                plugin: name.clone(),
                num_partitions: pipeline.query.state_partitions,
                state_dir: checkpoint.state_dir(&format!("transform-{rank}")),
                state: store_options.clone(),
            })?;
            if let Transform::Wasm(t) = &mut transforms[*i] {
                t.attach_state(state);
            }
        }
        let stateful = planned.map(|p| p.open(&schema)).transpose()?;
        if let Some(op) = &stateful {
            schema = Arc::clone(op.output_schema());
        }
        let after_aggregate = match after_aggregate {
            Some(sql) => {
                let t = SqlTransform::new("[aggregate] select", &sql, &schema, &functions)
                    .map_err(|e| QueryError::Transform(TransformError::Sql(e)))?;
                schema = Arc::clone(t.output_schema());
                Some(t)
            }
            None => None,
        };

        let Watermarks {
            last_watermark_ms,
            next_watermark_ms,
            source_watermarks_ms,
        } = recovery::watermarks(&checkpoint, position, sources.len())?;

        let (sink, sink_watched) = sinks::open(
            &pipeline,
            &schema,
            sinks::SinkContext {
                plugins: &plugins_ctx,
                checkpoint: &checkpoint,
                options: &mut options,
                threads,
            },
        )?;
        watched.extend(sink_watched);
        let listeners = plugins::listeners(&pipeline, &plugins_ctx)?;
        let started_ms = options.clock.now_ms();
        if let Some(n) = pending {
            tracing::info!(
                batch_id = n,
                "batch {n} was planned but not committed: running it again"
            );
            let entry: Option<OffsetEntry> = checkpoint.offsets().get(n)?;
            for recorded in entry.map(|e| e.plugins).unwrap_or_default() {
                if let Some(now) = watched.iter().find(|w| w.file.name() == recorded.name)
                    && now.file.sha256() != recorded.sha256
                {
                    tracing::warn!(
                        batch_id = n,
                        plugin = %recorded.name,
                        "batch {n} first ran with build {} of plugin {}; it is replayed with build {}",
                        recorded.sha256,
                        recorded.name,
                        now.file.sha256()
                    );
                }
            }
        }
        Ok(Self {
            pipeline,
            run_id: uuid::Uuid::new_v4().to_string(),
            checkpoint,
            last_input_ms: vec![started_ms; sources.len()],
            poll_time: Duration::ZERO,
            sources,
            transforms,
            transform_inputs,
            after_aggregate,
            functions: function_plugins,
            join,
            join_at,
            stream_join,
            input_watermarks,
            stateful_transforms: !stateful_plugins.is_empty(),
            watermark,
            stateful,
            last_watermark_ms,
            next_watermark_ms,
            source_watermarks_ms,
            sink,
            output_schema: schema,
            pending,
            next_batch,
            options,
            engine,
            watched,
            last_trigger: None,
            listeners,
            idle: false,
            summary: RunSummary::default(),
        })
    }

    /// The query's id (stable across restarts).
    pub fn id(&self) -> &str {
        self.checkpoint.query_id()
    }

    /// The schema of what the sink receives.
    pub fn output_schema(&self) -> &SchemaRef {
        &self.output_schema
    }

    /// Whether the query has event time: a `[watermark]`, or its inputs' own.
    fn has_watermark(&self) -> bool {
        self.watermark.is_some() || self.input_watermarks.iter().any(Option::is_some)
    }

    fn stopped(&self) -> bool {
        self.options.stop.load(Ordering::Relaxed)
    }

    /// Looks for new builds of the query's plugins and swaps in those that
    /// pass (see `reload`); with `force` every plugin file is hashed, else
    /// only those whose size or modification time changed. The query runs
    /// this before planning a batch when asked to (SIGHUP, `watch_plugins`);
    /// programs embedding the host may call it between batches.
    pub fn reload_plugins(&mut self, force: bool) -> Vec<ReloadOutcome> {
        let mut outcomes = Vec::new();
        for watched in &mut self.watched {
            let outcome = match watched.stage {
                reload::Stage::Transform(i) => {
                    let Some(plugin) = self.transforms.get_mut(i).and_then(Transform::wasm_mut)
                    else {
                        continue;
                    };
                    reload::check(&self.engine, watched, force, |new| plugin.replace(new))
                }
                reload::Stage::Sink => {
                    let Some(plugin) = self.sink.wasm_mut() else {
                        continue;
                    };
                    reload::check(&self.engine, watched, force, |new| plugin.replace(new))
                }
            };
            match &outcome {
                Some(ReloadOutcome::Replaced {
                    plugin,
                    from_sha256,
                    to_sha256,
                }) => tracing::info!(
                    query = %self.pipeline.query.name,
                    plugin = %plugin,
                    "plugin {plugin} replaced: build {from_sha256} → {to_sha256}, from batch {} on",
                    self.next_batch
                ),
                Some(ReloadOutcome::Refused(e)) => {
                    tracing::warn!(query = %self.pipeline.query.name, "{e}");
                }
                None => {}
            }
            outcomes.extend(outcome);
        }
        outcomes
    }

    /// Looks for new plugin builds when SIGHUP asked for it (every file
    /// hashed) or `watch_plugins` is on (changed files only).
    fn reload_if_asked(&mut self) {
        let force = self.options.reload.swap(false, Ordering::Relaxed);
        if force || self.options.watch_plugins {
            let outcomes = self.reload_plugins(force);
            if force && let Some(hook) = &self.options.on_reload {
                hook(&outcomes);
            }
        }
    }

    /// The plugin builds the next batch runs with.
    fn plugin_builds(&self) -> Vec<PluginBuild> {
        self.plugin_usages()
            .into_iter()
            .map(|(name, sha256, _)| PluginBuild { name, sha256 })
            .collect()
    }

    /// Runs batches as the trigger says, until the trigger is done, a stop is
    /// requested, or a batch fails.
    ///
    /// # Errors
    /// The first batch that fails for good; it is left uncommitted, so the
    /// next start runs it again.
    pub fn run(&mut self) -> Result<RunSummary, QueryError> {
        let (id, run_id) = (self.checkpoint.query_id().to_owned(), self.run_id.clone());
        self.listeners.send(QueryEvent::Started {
            id: id.clone(),
            run_id: run_id.clone(),
            name: self.pipeline.query.name.clone(),
        });
        let result = self.run_batches();
        // Nothing is read ahead for a batch that this run will not start.
        for source in &mut self.sources {
            source.end_parts();
        }
        self.listeners.send(QueryEvent::Terminated {
            id,
            run_id,
            error: result.as_ref().err().map(ToString::to_string),
        });
        self.listeners.finish(LISTENERS_GRACE);
        result
    }

    fn run_batches(&mut self) -> Result<RunSummary, QueryError> {
        if let Some(n) = self.pending.take() {
            self.run_planned(n, true, 0, Instant::now())?;
        }
        match self.pipeline.query.trigger {
            Trigger::AvailableNow => {
                // Spark's availableNow: what is there at start, in as many
                // batches as the rate limits give, then stop.
                for source in &mut self.sources {
                    source.freeze_available()?;
                }
                while !self.stopped() && self.poll(false)? > 0 {
                    self.plan_and_run()?;
                }
                // Then, like Spark, one batch without data if the watermark
                // moved, so that what it passed is emitted.
                if !self.stopped() && self.wants_no_data_batch() {
                    self.poll(false)?;
                    self.plan_and_run()?;
                }
            }
            Trigger::Once => {
                if self.summary.batches == 0 && self.poll(true)? > 0 {
                    self.plan_and_run()?;
                }
            }
            Trigger::ProcessingTime(interval) => {
                while !self.stopped() {
                    let started = Instant::now();
                    self.trigger_once()?;
                    self.sleep(interval.saturating_sub(started.elapsed()));
                }
            }
            Trigger::Continuous => {
                while !self.stopped() {
                    if !self.trigger_once()? {
                        self.sleep(POLL_INTERVAL);
                    }
                }
            }
            Trigger::RealTime(settings) => {
                while !self.stopped() {
                    self.run_interval(settings)?;
                }
                self.sources[0].end_parts();
            }
        }
        // Every batch run so far is committed: the sink may now publish what it held back.
        self.sink.close()?;
        Ok(self.summary.clone())
    }

    /// One trigger of a long-running query: a batch of new input, or a
    /// no-data batch when the watermark moved. Whether a batch ran.
    fn trigger_once(&mut self) -> Result<bool, QueryError> {
        // An idle query takes a new build too, not only once data arrives.
        self.reload_if_asked();
        if self.poll(false)? > 0 || self.wants_no_data_batch() {
            self.plan_and_run()?;
            self.idle = false;
            return Ok(true);
        }
        self.note_idle();
        Ok(false)
    }

    /// Stages the next batch's input of every source and returns how much
    /// was staged in all; applies the idle timeout to the inputs without data.
    fn poll(&mut self, unlimited: bool) -> Result<u64, QueryError> {
        let now = self.options.clock.now_ms();
        let mut total = 0;
        for i in 0..self.sources.len() {
            let started = Instant::now();
            let staged = self.sources[i].poll(&self.checkpoint, unlimited);
            self.poll_time += started.elapsed();
            let staged = staged?;
            if staged > 0 {
                self.last_input_ms[i] = now;
            } else {
                self.advance_idle_watermark(i, now);
            }
            total += staged;
        }
        Ok(total)
    }

    /// The opt-in idle timeout (`[watermark] idle_timeout`): an input without
    /// data for that long no longer holds the watermark back; its watermark
    /// advances as if event time kept pace with the clock (clock − delay).
    /// The values go into the next batch's offsets entry, so a replay sees them.
    fn advance_idle_watermark(&mut self, input: usize, now: i64) {
        // The query's `[watermark]`, or this input's own (a stream-stream join's).
        let Some(spec) = self
            .pipeline
            .watermark
            .as_ref()
            .or(self.pipeline.sources[input].watermark.as_ref())
        else {
            return;
        };
        let Some(idle) = spec.idle_timeout else {
            return;
        };
        let idle_ms = now.saturating_sub(self.last_input_ms[input]);
        if idle_ms < millis_i64(idle) {
            return;
        }
        let candidate = now.saturating_sub(millis_i64(spec.delay));
        if candidate > self.source_watermarks_ms[input] {
            self.source_watermarks_ms[input] = candidate;
            // With inputs' own watermarks, only the inputs that have one take part.
            let inputs: Vec<i64> = if self.input_watermarks.is_empty() {
                self.source_watermarks_ms.clone()
            } else {
                self.source_watermarks_ms
                    .iter()
                    .zip(&self.input_watermarks)
                    .filter(|(_, w)| w.is_some())
                    .map(|(wm, _)| *wm)
                    .collect()
            };
            let combined = watermark::combine(
                self.next_watermark_ms,
                &inputs,
                self.pipeline.query.watermark_policy == WatermarkPolicy::Max,
            );
            tracing::info!(
                query = %self.pipeline.query.name,
                idle_ms,
                "source {} is idle: its watermark advances to {}",
                self.sources[input].name(),
                progress::rfc3339_ms(candidate)
            );
            self.next_watermark_ms = combined;
        }
    }

    /// Spark runs a batch without new data when a stateful operator could
    /// emit or evict because the watermark advanced (not in complete mode).
    fn wants_no_data_batch(&self) -> bool {
        if let Some(join) = &self.stream_join {
            // Spark's `StreamingSymmetricHashJoinExec.shouldRunAnotherBatch`.
            return join.evicts() && self.next_watermark_ms > self.last_watermark_ms;
        }
        (self.stateful.is_some() || self.stateful_transforms)
            && self.watermark.is_some()
            && self.pipeline.query.output_mode != OutputMode::Complete
            && self.next_watermark_ms > self.last_watermark_ms
    }

    /// Sleeps, waking early when a stop is requested.
    fn sleep(&self, total: Duration) {
        let until = Instant::now() + total;
        while !self.stopped() {
            let now = Instant::now();
            if now >= until {
                break;
            }
            std::thread::sleep((until - now).min(Duration::from_millis(50)));
        }
    }

    /// The entry of `offsets/N` for the batch planned now over `sources`: the watermarks, the
    /// plugin builds and the static tables' snapshots it runs with.
    fn new_entry(&self, sources: Vec<SourceOffset>) -> Result<OffsetEntry, QueryError> {
        Ok(OffsetEntry {
            batch_watermark_ms: self.next_watermark_ms,
            late_row_watermark_ms: self.last_watermark_ms,
            batch_timestamp_ms: self.options.clock.now_ms(),
            sources,
            plugins: self.plugin_builds(),
            tables: self
                .join
                .as_ref()
                .map(StaticJoin::current_snapshot)
                .transpose()?
                .into_iter()
                .collect(),
        })
    }

    /// Plans the next batch over what the sources staged (durably) and runs it.
    fn plan_and_run(&mut self) -> Result<(), QueryError> {
        self.reload_if_asked();
        let n = self.next_batch;
        let started = Instant::now();
        let mut offsets = Vec::with_capacity(self.sources.len());
        let with_watermark = self.has_watermark();
        for (i, source) in self.sources.iter_mut().enumerate() {
            let recorded = source.record(&self.checkpoint, n)?;
            offsets.push(SourceOffset {
                name: source.name().to_owned(),
                log_offset: n,
                watermark_ms: with_watermark.then(|| self.source_watermarks_ms[i]),
                parts: None,
                recorded,
            });
        }
        // The batch runs on the entry as the log holds it, parsed from the bytes written (the
        // same as reading the file back), as a replay of it will.
        let entry: OffsetEntry = self
            .checkpoint
            .offsets()
            .put_and_get(n, &self.new_entry(offsets)?)?;
        let wal_ms = millis(started.elapsed());
        Failpoint::check(self.options.failpoint().as_ref(), Phase::AfterOffsets, n);
        self.next_batch = n + 1;
        self.run_entry(n, entry, false, wal_ms, started)
    }

    /// Runs batch `n` from its offsets entry, read from the log: a batch planned before a
    /// restart, or one run again.
    fn run_planned(
        &mut self,
        n: u64,
        replay: bool,
        wal_ms: u64,
        trigger_start: Instant,
    ) -> Result<(), QueryError> {
        let entry: OffsetEntry =
            self.checkpoint
                .offsets()
                .get(n)?
                .ok_or_else(|| QueryError::Protocol {
                    batch_id: n,
                    message: "offsets entry vanished".into(),
                })?;
        self.run_entry(n, entry, replay, wal_ms, trigger_start)
    }

    /// Runs batch `n` planned as `entry` (as its offsets log holds it) and commits it.
    fn run_entry(
        &mut self,
        n: u64,
        entry: OffsetEntry,
        replay: bool,
        wal_ms: u64,
        trigger_start: Instant,
    ) -> Result<(), QueryError> {
        tracing::debug!(batch_id = n, replay, "starting batch {n}");
        let since_last = self.last_trigger.map(|t| trigger_start.duration_since(t));
        self.last_trigger = Some(trigger_start);
        let mut info = BatchInfo {
            query_id: self.checkpoint.query_id().to_owned(),
            batch_id: n,
            attempt: u32::from(replay),
            timestamp_micros: entry.batch_timestamp_ms.saturating_mul(1000),
            partition: 0,
        };
        let retries = self.pipeline.query.max_batch_retries;
        let usage_before = self.plugin_usages();
        let outcome = loop {
            match self.execute(&info, &entry) {
                Ok(outcome) => break outcome,
                Err(e) if info.attempt < retries + u32::from(replay) && e.is_retryable() => {
                    let backoff = Duration::from_millis(100 << info.attempt.min(6));
                    tracing::warn!(batch_id = n, attempt = info.attempt, error = %e, "batch failed; retrying in {backoff:?}");
                    self.sleep(backoff);
                    info.attempt += 1;
                }
                Err(e) => return Err(e),
            }
        };
        self.commit_batch(
            n,
            &entry,
            outcome,
            usage_before,
            since_last,
            wal_ms,
            trigger_start,
        )
    }

    /// Commits batch `n` once the sink has it: state, then `commits/N` with the next
    /// watermarks, then its progress record.
    #[allow(
        clippy::too_many_arguments,
        reason = "two call sites, the batch's own figures"
    )]
    fn commit_batch(
        &mut self,
        n: u64,
        entry: &OffsetEntry,
        outcome: Outcome,
        usage_before: Vec<(String, String, PluginUsage)>,
        since_last: Option<Duration>,
        wal_ms: u64,
        trigger_start: Instant,
    ) -> Result<(), QueryError> {
        Failpoint::check(self.options.failpoint().as_ref(), Phase::BeforeCommit, n);
        let commit_started = Instant::now();
        // State first (version n), then the batch (§3 step 4).
        let mut state_metrics = Vec::new();
        for stage in self.stateful_stages_mut() {
            state_metrics.push(stage.commit(n)?);
        }
        // Each input's watermark moves by its own event times; the query's
        // is their combination (§3.1).
        let (next_watermark_ms, next_source_watermarks_ms) = match &self.watermark {
            None if !self.input_watermarks.is_empty() => {
                // Only the inputs with a watermark take part (Spark's `withWatermark` nodes).
                let before = per_source_watermarks(entry, self.sources.len());
                let mut inputs = Vec::new();
                let mut each = Vec::with_capacity(before.len());
                for ((wm, s), w) in before
                    .into_iter()
                    .zip(&outcome.sources)
                    .zip(&self.input_watermarks)
                {
                    match w {
                        Some(w) => {
                            let next = w.next(wm, s.event_time);
                            inputs.push(next);
                            each.push(next);
                        }
                        None => each.push(wm),
                    }
                }
                let global = watermark::combine(
                    entry.batch_watermark_ms,
                    &inputs,
                    self.pipeline.query.watermark_policy == WatermarkPolicy::Max,
                );
                (global, each)
            }
            Some(w) => {
                let inputs: Vec<i64> = per_source_watermarks(entry, self.sources.len())
                    .into_iter()
                    .zip(&outcome.sources)
                    .map(|(wm, s)| w.next(wm, s.event_time))
                    .collect();
                let global = watermark::combine(
                    entry.batch_watermark_ms,
                    &inputs,
                    self.pipeline.query.watermark_policy == WatermarkPolicy::Max,
                );
                (global, inputs)
            }
            None => (entry.batch_watermark_ms, Vec::new()),
        };
        self.checkpoint.commits().put(
            n,
            &CommitEntry {
                next_batch_watermark_ms: next_watermark_ms,
                next_source_watermarks_ms: next_source_watermarks_ms.clone(),
            },
        )?;
        self.last_watermark_ms = entry.batch_watermark_ms;
        self.next_watermark_ms = next_watermark_ms;
        if !next_source_watermarks_ms.is_empty() {
            self.source_watermarks_ms = next_source_watermarks_ms;
        }
        if n >= BATCHES_TO_RETAIN {
            let keep_from = n + 1 - BATCHES_TO_RETAIN;
            self.checkpoint.offsets().purge_before(keep_from)?;
            self.checkpoint.commits().purge_before(keep_from)?;
        }
        let commit_ms = millis(commit_started.elapsed());
        let total_ms = millis(trigger_start.elapsed());
        let latest_offset_ms = millis(std::mem::take(&mut self.poll_time));
        let record = self.progress(
            n,
            entry,
            &outcome,
            state_metrics,
            usage_before,
            since_last,
            [latest_offset_ms, wal_ms, commit_ms, total_ms],
        );
        let json = serde_json::to_value(&record).map_err(|e| QueryError::Protocol {
            batch_id: n,
            message: format!("cannot serialise progress: {e}"),
        })?;
        self.checkpoint.append_progress(&json)?;
        tracing::info!(query = %self.pipeline.query.name, batch_id = n, "{}", record.summary());
        if let Some(hook) = &self.options.on_progress {
            hook(&record, &json);
        }
        if self.listeners.any() {
            self.listeners.send(QueryEvent::Progress {
                batch_id: n,
                json: json.to_string(),
            });
        }
        self.summary.batches += 1;
        self.summary.input_rows += outcome.input_rows;
        self.summary.output_rows += outcome.output_rows;
        self.summary.malformed_rows += outcome.malformed_rows;
        self.summary.last_batch_id = Some(n);
        Ok(())
    }

    /// The progress record of batch `n` (Spark's `StreamingQueryProgress`).
    #[allow(
        clippy::too_many_arguments,
        reason = "one call site; the pieces are unrelated"
    )]
    fn progress(
        &self,
        n: u64,
        entry: &OffsetEntry,
        outcome: &Outcome,
        state_metrics: Vec<OperatorMetrics>,
        usage_before: Vec<(String, String, PluginUsage)>,
        since_last: Option<Duration>,
        [latest_offset_ms, wal_ms, commit_ms, total_ms]: [u64; 4],
    ) -> QueryProgress {
        let mut duration_ms = BTreeMap::new();
        // Finding the input: listing the source since the last record.
        // Finding the input: asking the sources what is new since the last batch.
        duration_ms.insert("latestOffset", latest_offset_ms);
        duration_ms.insert("walCommit", wal_ms);
        duration_ms.insert("getBatch", outcome.get_batch_ms);
        duration_ms.insert("addBatch", outcome.add_batch_ms);
        duration_ms.insert("commitOffsets", commit_ms);
        duration_ms.insert("triggerExecution", total_ms);
        let input_rate = since_last.map_or(0.0, |d| progress::rate(outcome.input_rows, millis(d)));
        let processed_rate = progress::rate(outcome.input_rows, total_ms.max(1));
        let mut event_time = BTreeMap::new();
        if self.has_watermark() {
            event_time.insert("watermark", progress::rfc3339_ms(entry.batch_watermark_ms));
            if let Some(r) = outcome.event_time {
                event_time.insert("min", progress::rfc3339_ms(r.min_ms));
                event_time.insert("max", progress::rfc3339_ms(r.max_ms));
            }
        }
        let state_operators = state_metrics
            .into_iter()
            .filter_map(|m| serde_json::to_value(m).ok())
            .collect();
        QueryProgress {
            id: self.checkpoint.query_id().to_owned(),
            run_id: self.run_id.clone(),
            name: self.pipeline.query.name.clone(),
            timestamp: progress::rfc3339_ms(entry.batch_timestamp_ms),
            timestamp_ms: entry.batch_timestamp_ms,
            watermark_ms: self.has_watermark().then_some(entry.batch_watermark_ms),
            listeners: self.listeners.progress(),
            batch_id: n,
            batch_duration: total_ms,
            num_input_rows: outcome.input_rows,
            input_rows_per_second: input_rate,
            processed_rows_per_second: processed_rate,
            duration_ms,
            event_time,
            state_operators,
            sources: outcome
                .sources
                .iter()
                .map(|src| {
                    let rate =
                        since_last.map_or(0.0, |d| progress::rate(src.input_rows, millis(d)));
                    SourceProgress {
                        description: src.description.clone(),
                        start_offset: src.start_offset.clone(),
                        end_offset: src.end_offset.clone(),
                        latest_offset: src.latest_offset.clone(),
                        num_input_rows: src.input_rows,
                        input_rows_per_second: rate,
                        processed_rows_per_second: progress::rate(src.input_rows, total_ms.max(1)),
                        metrics: src.metrics.clone(),
                    }
                })
                .collect(),
            sink: SinkProgress {
                description: self.sink.description(),
                num_output_rows: outcome.output_rows,
                metrics: BTreeMap::new(),
            },
            latency_ms: outcome.latency.clone(),
            plugins: self
                .plugin_usages()
                .into_iter()
                .map(|(name, sha256, after)| {
                    let before = usage_before
                        .iter()
                        .find(|(n, _, _)| *n == name)
                        .map(|(_, _, u)| u.clone())
                        .unwrap_or_default();
                    PluginProgress {
                        name,
                        sha256,
                        calls: after.calls - before.calls,
                        call_time_ms: (after.call_time.saturating_sub(before.call_time))
                            .as_secs_f64()
                            * 1000.0,
                        instantiations: after.instantiations - before.instantiations,
                        fuel_consumed: after.fuel_consumed - before.fuel_consumed,
                        memory_peak_bytes: after.memory_peak_bytes,
                        memory_limit_bytes: after.memory_limit_bytes,
                        timeout_ms: millis(after.timeout),
                        fuel_limit: after.fuel_limit,
                    }
                })
                .collect(),
        }
    }

    /// Every stage that keeps state, in the order it is committed: the stateful operator, then
    /// the transforms' keyed state in pipeline order.
    fn stateful_stages_mut(&mut self) -> impl Iterator<Item = StatefulStage<'_>> {
        let operator = self.stream_join.iter_mut().map(StatefulStage::Join).chain(
            self.stateful
                .iter_mut()
                .map(|op| StatefulStage::Operator(op.as_mut())),
        );
        let keyed = self
            .transforms
            .iter_mut()
            .filter_map(|t| t.keyed_state_mut().map(StatefulStage::Keyed));
        operator.chain(keyed)
    }

    fn plugin_usages(&self) -> Vec<(String, String, PluginUsage)> {
        self.transforms
            .iter()
            .filter_map(Transform::plugin_usage)
            .chain(self.functions.iter().map(|f| f.usage()))
            .chain(self.sink.plugin_usage())
            .collect()
    }

    /// Reads, transforms, runs the stateful operator and writes batch
    /// `info.batch_id`; writes nothing to the checkpoint but state pending
    /// its commit. A real-time batch is run again part by part, as its parts first ran.
    fn execute(&mut self, info: &BatchInfo, entry: &OffsetEntry) -> Result<Outcome, QueryError> {
        let n = info.batch_id;
        let mut run = BatchRun::new(self.sources.len());
        self.begin_batch(n, entry, &mut run)?;
        if let Some(first) = entry.sources.first()
            && let Some(cuts) = &first.parts
        {
            self.sink.begin_parts(info)?;
            self.sources[0].end_parts();
            let parts = self.sources[0].split_parts(n, &first.recorded, cuts)?;
            if parts.is_empty() {
                self.run_part(info, entry, None, &mut run)?;
            }
            for recorded in parts {
                let started = Instant::now();
                let read = self.sources[0].read(&self.checkpoint, n, &recorded)?;
                run.get_batch += started.elapsed();
                self.run_part(info, entry, Some(read), &mut run)?;
            }
            self.finish_parts(info, &mut run)?;
            return Ok(run.outcome());
        }
        let none = sources::Recorded::new();
        for i in 0..self.sources.len() {
            let get_started = Instant::now();
            let recorded = entry.sources.get(i).map_or(&none, |s| &s.recorded);
            let read = self.sources[i].read(&self.checkpoint, n, recorded)?;
            run.get_batch += get_started.elapsed();
            self.take_input(i, info, read, false, &mut run)?;
        }
        let add_started = Instant::now();
        let outputs = self.operate(info, entry, &mut run)?;
        run.output_rows += self.sink.write_batch(info, &self.output_schema, &outputs)?;
        run.add_batch += add_started.elapsed();
        Ok(run.outcome())
    }

    /// Loads the state the previous batch committed (every attempt starts from it, keyed state
    /// expiring by this batch's watermark), and the static table as batch `n` was planned;
    /// loading counts as adding the batch.
    fn begin_batch(
        &mut self,
        n: u64,
        entry: &OffsetEntry,
        run: &mut BatchRun,
    ) -> Result<(), QueryError> {
        let load_started = Instant::now();
        for stage in self.stateful_stages_mut() {
            stage.load(n.checked_sub(1), entry.batch_watermark_ms)?;
        }
        if let Some(join) = &mut self.join {
            let recorded = entry.tables.iter().find(|t| t.name == join.table_name());
            join.prepare(recorded)?;
        }
        run.add_batch += load_started.elapsed();
        Ok(())
    }

    /// One part of a real-time batch through the whole pipeline and into the sink (`None`: a
    /// batch without input, run for the watermark). Returns the rows the sink took.
    fn run_part(
        &mut self,
        info: &BatchInfo,
        entry: &OffsetEntry,
        read: Option<SourceBatch>,
        run: &mut BatchRun,
    ) -> Result<u64, QueryError> {
        if let Some(read) = read {
            self.take_input(0, info, read, true, run)?;
        }
        let add_started = Instant::now();
        let outputs = self.operate(info, entry, run)?;
        let rows = self.sink.write_part(info, &self.output_schema, outputs)?;
        run.output_rows += rows;
        run.add_batch += add_started.elapsed();
        Ok(rows)
    }

    /// The end of a real-time batch's parts: its dead letters, then the sink's commit.
    fn finish_parts(&mut self, info: &BatchInfo, run: &mut BatchRun) -> Result<(), QueryError> {
        let started = Instant::now();
        if let Some(dir) = self.sources[0].dead_letter_dir()
            && !run.malformed.is_empty()
        {
            decode::write_dead_letters(dir, info.batch_id, &run.malformed).map_err(|error| {
                QueryError::Decoder {
                    source_name: self.sources[0].name().to_owned(),
                    error,
                }
            })?;
        }
        run.malformed.clear();
        run.output_rows += self.sink.finish_parts(info, &self.output_schema)?;
        run.add_batch += started.elapsed();
        Ok(())
    }

    /// Input `i`'s rows through the transforms before the stateful stages: to its side of a
    /// stream-stream join, or to the batch's outputs. Its malformed records are written as
    /// dead letters now, or held in `run` (`hold`) until a real-time batch's parts end.
    fn take_input(
        &mut self,
        i: usize,
        info: &BatchInfo,
        read: SourceBatch,
        hold: bool,
        run: &mut BatchRun,
    ) -> Result<(), QueryError> {
        let n = info.batch_id;
        let SourceBatch {
            mut decoded,
            start_offset,
            end_offset,
            latest_offset,
            metrics,
        } = read;
        let source = &self.sources[i];
        if let Some(dir) = source.dead_letter_dir()
            && !decoded.malformed.is_empty()
        {
            if hold {
                run.malformed.append(&mut decoded.malformed);
            } else {
                decode::write_dead_letters(dir, n, &decoded.malformed).map_err(|error| {
                    QueryError::Decoder {
                        source_name: source.name().to_owned(),
                        error,
                    }
                })?;
            }
        }
        let add_started = Instant::now();
        let event_time = if self.stream_join.is_some() {
            // Through the transforms of this input, to its side of the join.
            let side = usize::from(
                self.pipeline
                    .join
                    .as_ref()
                    .is_some_and(|j| j.right == source.name()),
            );
            let first = run.join_inputs[side].len();
            for batch in decoded.batches {
                let mut batch = batch;
                for (t, input) in self.transforms[..self.join_at]
                    .iter_mut()
                    .zip(&self.transform_inputs)
                {
                    if batch.num_rows() == 0 {
                        break;
                    }
                    if input.is_some_and(|j| j != i) {
                        continue;
                    }
                    batch = t.process(&batch, info)?;
                }
                if batch.num_rows() > 0 {
                    run.join_inputs[side].push(batch);
                }
            }
            self.input_watermarks
                .get(i)
                .and_then(Option::as_ref)
                .and_then(|w| w.observe(&run.join_inputs[side][first..]))
        } else {
            let first_output = run.outputs.len();
            for batch in decoded.batches {
                let mut batch = batch;
                for (k, (t, input)) in self
                    .transforms
                    .iter_mut()
                    .zip(&self.transform_inputs)
                    .enumerate()
                {
                    if k == self.join_at
                        && let Some(join) = &mut self.join
                    {
                        batch = join.process(&batch, info)?;
                    }
                    if batch.num_rows() == 0 {
                        break;
                    }
                    if input.is_some_and(|j| j != i) {
                        continue;
                    }
                    batch = t.process(&batch, info)?;
                }
                if self.join_at >= self.transforms.len()
                    && batch.num_rows() > 0
                    && let Some(join) = &mut self.join
                {
                    batch = join.process(&batch, info)?;
                }
                if batch.num_rows() > 0 {
                    run.outputs.push(batch);
                }
            }
            self.watermark
                .as_ref()
                .and_then(|w| w.observe(&run.outputs[first_output..]))
        };
        run.add_batch += add_started.elapsed();
        let outcome = SourceOutcome {
            description: self.sources[i].description(),
            input_rows: decoded.num_input_rows,
            malformed_rows: decoded.num_malformed,
            event_time,
            start_offset,
            end_offset,
            latest_offset,
            metrics,
        };
        match &mut run.sources[i] {
            Some(earlier) => earlier.absorb(outcome),
            slot @ None => *slot = Some(outcome),
        }
        Ok(())
    }

    /// The stateful stages over what the inputs gave (taken from `run`): the stream-stream
    /// join, the stateful operator and what surrounds its aggregates. The rows for the sink.
    fn operate(
        &mut self,
        info: &BatchInfo,
        entry: &OffsetEntry,
        run: &mut BatchRun,
    ) -> Result<Vec<RecordBatch>, QueryError> {
        let n = info.batch_id;
        let mut outputs = std::mem::take(&mut run.outputs);
        let join_inputs = std::mem::take(&mut run.join_inputs);
        if let Some(join) = &mut self.stream_join {
            let ctx = StatefulContext {
                batch_id: n,
                late_ms: entry.late_row_watermark_ms,
                watermark_ms: entry.batch_watermark_ms,
            };
            let [left, right] = &join_inputs;
            for batch in join.process(&ctx, [left, right])? {
                let mut batch = batch;
                for t in &mut self.transforms[self.join_at..] {
                    if batch.num_rows() == 0 {
                        break;
                    }
                    batch = t.process(&batch, info)?;
                }
                if batch.num_rows() > 0 {
                    outputs.push(batch);
                }
            }
        }
        if let Some(op) = &mut self.stateful {
            let ctx = StatefulContext {
                batch_id: n,
                late_ms: entry.late_row_watermark_ms,
                watermark_ms: entry.batch_watermark_ms,
            };
            outputs = op.process(&ctx, &outputs)?;
            if let Some(after) = &mut self.after_aggregate {
                outputs = outputs
                    .iter()
                    .map(|b| after.process(b, info))
                    .collect::<Result<_, _>>()
                    .map_err(|e| QueryError::Transform(TransformError::Sql(e)))?;
            }
        }
        Ok(outputs)
    }
}

/// What a batch has gathered so far, over its inputs (and a real-time batch's parts).
struct BatchRun {
    /// Rows on their way to the stateful stages and the sink.
    outputs: Vec<RecordBatch>,
    /// A stream-stream join's new rows, left and right.
    join_inputs: [Vec<RecordBatch>; 2],
    /// Per input, once it was read.
    sources: Vec<Option<SourceOutcome>>,
    /// Dead letters held until a real-time batch's parts end.
    malformed: Vec<decode::MalformedRecord>,
    output_rows: u64,
    get_batch: Duration,
    add_batch: Duration,
}

impl BatchRun {
    fn new(sources: usize) -> Self {
        Self {
            outputs: Vec::new(),
            join_inputs: [Vec::new(), Vec::new()],
            sources: (0..sources).map(|_| None).collect(),
            malformed: Vec::new(),
            output_rows: 0,
            get_batch: Duration::ZERO,
            add_batch: Duration::ZERO,
        }
    }

    fn outcome(self) -> Outcome {
        let per_source: Vec<SourceOutcome> = self.sources.into_iter().flatten().collect();
        Outcome {
            latency: None,
            input_rows: per_source.iter().map(|s| s.input_rows).sum(),
            malformed_rows: per_source.iter().map(|s| s.malformed_rows).sum(),
            event_time: per_source
                .iter()
                .filter_map(|s| s.event_time)
                .reduce(EventTimeRange::union),
            sources: per_source,
            output_rows: self.output_rows,
            get_batch_ms: millis(self.get_batch),
            add_batch_ms: millis(self.add_batch),
        }
    }
}

struct Outcome {
    /// Real-time mode, a batch run as its parts arrived: their latency.
    latency: Option<progress::LatencyProgress>,
    input_rows: u64,
    malformed_rows: u64,
    output_rows: u64,
    /// Over all inputs.
    event_time: Option<EventTimeRange>,
    sources: Vec<SourceOutcome>,
    get_batch_ms: u64,
    add_batch_ms: u64,
}

/// What one input contributed to a batch.
#[derive(Debug)]
struct SourceOutcome {
    description: String,
    input_rows: u64,
    malformed_rows: u64,
    event_time: Option<EventTimeRange>,
    start_offset: Option<serde_json::Value>,
    end_offset: serde_json::Value,
    latest_offset: serde_json::Value,
    metrics: BTreeMap<&'static str, String>,
}

impl SourceOutcome {
    /// Adds a later part of the same batch: its rows, and the offsets it ends at.
    fn absorb(&mut self, later: SourceOutcome) {
        self.input_rows += later.input_rows;
        self.malformed_rows += later.malformed_rows;
        self.event_time = match (self.event_time, later.event_time) {
            (Some(a), Some(b)) => Some(EventTimeRange::union(a, b)),
            (a, b) => a.or(b),
        };
        self.end_offset = later.end_offset;
        self.latest_offset = later.latest_offset;
        let malformed = self.malformed_rows.to_string();
        self.metrics = later.metrics;
        if self.metrics.contains_key("numMalformedRows") {
            self.metrics.insert("numMalformedRows", malformed);
        }
    }
}

/// Each input's watermark going into the batch of `entry`; an entry written
/// before per-input watermarks were kept gives every input the query's.
fn per_source_watermarks(entry: &OffsetEntry, sources: usize) -> Vec<i64> {
    let recorded: Vec<i64> = entry
        .sources
        .iter()
        .filter_map(|s| s.watermark_ms)
        .collect();
    if recorded.len() == sources {
        recorded
    } else {
        vec![entry.batch_watermark_ms; sources]
    }
}

impl QueryError {
    /// Whether running the batch again may succeed (a broker, a disk or a plugin's own
    /// retryable error), as opposed to an error that a retry would only repeat. Every
    /// variant is listed, so a new one must be classified.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Transform(e) => e.is_retryable(),
            Self::Plugin(e) => e.is_retryable(),
            Self::Sink(e) => e.is_retryable(),
            Self::Source(e) => e.is_retryable(),
            Self::Join(e) => e.is_retryable(),
            // The query's own logs: a failed write there stops the run, and a restart
            // recovers from what is durable.
            Self::Checkpoint(_) => false,
            Self::Decoder { .. }
            | Self::Protocol { .. }
            | Self::Operator(_)
            | Self::Watermark(_)
            | Self::State(_)
            | Self::Invalid { .. }
            | Self::Changed { .. } => false,
        }
    }
}

/// The state store a checkpoint's fingerprint records, if any.
fn recorded_state_store(checkpoint: &Checkpoint) -> Option<StoreKind> {
    let recorded = checkpoint
        .metadata()
        .fingerprint
        .as_ref()?
        .get("state_store")?;
    [StoreKind::Runs, StoreKind::RocksDb, StoreKind::Memory]
        .into_iter()
        .find(|k| recorded.as_str() == Some(k.to_string().as_str()))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How the query's state stores keep their versions (`query.state_store`); made once per query,
/// whose stores share its RocksDB memory.
fn state_options(query: &spec::QuerySpec, threads: Threads) -> StateOptions {
    StateOptions {
        kind: query.state_store.unwrap_or_default(),
        threads,
        ..StateOptions::default()
    }
}

fn millis_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
