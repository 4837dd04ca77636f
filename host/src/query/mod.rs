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

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::decode::{self, DecodeError, Decoder, DecoderOptions};
use crate::failpoint::{Failpoint, Phase};
use crate::operator::aggregate::{AggOutputMode, AggregateConfig, AggregateOperator, WindowConfig};
use crate::operator::dedup::{DedupConfig, DedupOperator};
use crate::operator::stateful::{
    OperatorError, OperatorMetrics, StatefulContext, StatefulOperator,
};
use crate::operator::{BatchTransform, TransformError};
use crate::plugin::{
    BatchInfo, DirGrant, EngineOptions, PluginEngine, PluginError, PluginOptions, PluginUsage,
    Sandbox, WasmSink, WasmTransform,
};
use crate::progress::{self, PluginProgress, QueryProgress, SinkProgress, SourceProgress};
use crate::sink::{self, ConsoleSink, FilesSink, MemorySink, PluginSink, Sink, SinkError};
use crate::source::{DeltaSource, FilesSource, Input, InputError, Units};
use crate::spec::{self, OutputMode, Pipeline, SinkSpec, SourceKind, Trigger};
use crate::state::{StateError, StateOptions, StoreKind};
use crate::watermark::{EventTimeRange, Watermark, WatermarkError};

/// How long the continuous trigger waits before looking for new files again.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Offsets and commits kept for inspection (Spark's `minBatchesToRetain`).
const BATCHES_TO_RETAIN: u64 = 100;

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
    /// Crash injection for recovery tests.
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
}

impl std::fmt::Debug for QueryOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryOptions")
            .field("cache_dir", &self.cache_dir)
            .field("failpoint", &self.failpoint)
            .finish_non_exhaustive()
    }
}

impl Default for QueryOptions {
    fn default() -> Self {
        Self {
            cache_dir: None,
            failpoint: None,
            stop: Arc::new(AtomicBool::new(false)),
            clock: Arc::new(SystemClock),
            console: None,
            memory_sink: None,
            extra_transforms: Vec::new(),
        }
    }
}

/// A query failed. Each variant names what failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Source(#[from] InputError),
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
}

/// Where one source stands after batch N: the entry of its own log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceOffset {
    pub name: String,
    pub log_offset: u64,
}

/// `commits/N`: batch N finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommitEntry {
    pub next_batch_watermark_ms: i64,
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
    source: Input,
    dead_letter: Option<PathBuf>,
    transforms: Vec<Box<dyn BatchTransform>>,
    watermark: Option<Watermark>,
    stateful: Option<Box<dyn StatefulOperator>>,
    /// wm of the last planned batch, i.e. wm(b−1) for the next one.
    last_watermark_ms: i64,
    /// wm for the next batch to plan.
    next_watermark_ms: i64,
    sink: Box<dyn Sink>,
    output_schema: SchemaRef,
    /// A planned batch without a commit, to run again first.
    pending: Option<u64>,
    next_batch: u64,
    options: QueryOptions,
    last_trigger: Option<Instant>,
    /// Clock time of the last batch that had input (for the idle timeout).
    last_input_ms: i64,
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
    pub fn start(pipeline: Pipeline, mut options: QueryOptions) -> Result<Self, QueryError> {
        let mut checkpoint = Checkpoint::open(&pipeline.query.checkpoint)?;
        let last_planned = checkpoint.offsets().latest()?;
        let last_committed = checkpoint.commits().latest()?;
        // Read the newest entries now: a damaged log is reported before
        // anything runs, naming the file.
        if let Some(n) = last_planned {
            let _: Option<OffsetEntry> = checkpoint.offsets().get(n)?;
        }
        if let Some(n) = last_committed {
            let _: Option<CommitEntry> = checkpoint.commits().get(n)?;
        }
        let (pending, next_batch) = match last_planned {
            None => (None, 0),
            Some(n) if last_committed.is_some_and(|c| c >= n) => (None, n + 1),
            Some(n) => (Some(n), n + 1),
        };

        let source_spec = &pipeline.sources[0];
        let (source, dead_letter) = match &source_spec.kind {
            SourceKind::Files(files) => {
                let source = files_source(&source_spec.name, files, &checkpoint, last_planned)?;
                (Input::Files(source), files.dead_letter_path.clone())
            }
            SourceKind::Delta(d) => (
                Input::Delta(
                    DeltaSource::open(
                        source_spec.name.clone(),
                        0,
                        d.path.clone(),
                        d.max_files_per_trigger,
                        d.starting_version,
                        &checkpoint,
                        last_planned,
                    )
                    .map_err(InputError::from)?,
                ),
                None,
            ),
        };

        let fuel = pipeline.transforms.iter().any(|t| t.limits.fuel.is_some())
            || matches!(&pipeline.sink, SinkSpec::Plugin(p) if p.limits.fuel.is_some());
        let engine = PluginEngine::new(EngineOptions {
            cache_dir: options.cache_dir.clone(),
            fuel,
        })?;
        let mut schema = Arc::clone(source.schema());
        let mut transforms: Vec<Box<dyn BatchTransform>> = Vec::new();
        for t in &pipeline.transforms {
            let loaded = engine.load(&t.name, &t.plugin)?;
            let transform = WasmTransform::open(
                &engine,
                loaded,
                PluginOptions {
                    name: t.name.clone(),
                    config_json: t.config.to_string(),
                    sandbox: Sandbox {
                        memory_bytes: t.limits.memory_bytes,
                        timeout: t.limits.timeout,
                        fuel: t.limits.fuel,
                        dirs: Vec::new(),
                    },
                    failpoint: options.failpoint,
                },
                Arc::clone(&schema),
            )?;
            schema = Arc::clone(transform.output_schema());
            transforms.push(Box::new(transform));
        }
        for make in std::mem::take(&mut options.extra_transforms) {
            let transform = make(&schema);
            schema = Arc::clone(transform.output_schema());
            transforms.push(transform);
        }

        let watermark = match &pipeline.watermark {
            Some(w) => Some(Watermark::new(
                &w.column,
                i64::try_from(w.delay.as_millis()).unwrap_or(i64::MAX),
                &schema,
            )?),
            None => None,
        };
        let stateful = build_stateful(&pipeline, checkpoint.dir(), &schema)?;
        if let Some(op) = &stateful {
            schema = Arc::clone(op.output_schema());
        }

        // The checkpoint must have been written by this query (§3.3).
        let plugins: Vec<(String, String)> = transforms
            .iter()
            .filter_map(|t| t.plugin_usage())
            .map(|(name, sha, _)| (name, sha))
            .collect();
        let fingerprint = fingerprint::of(
            &pipeline,
            stateful.as_ref().map(|op| op.output_schema().as_ref()),
            &plugins,
        );
        match checkpoint.metadata().fingerprint.clone() {
            Some(old) => {
                let diff = fingerprint::compare(&old, &fingerprint);
                if !diff.refused.is_empty() {
                    return Err(QueryError::Changed {
                        checkpoint: checkpoint.dir().to_path_buf(),
                        changes: diff.refused,
                    });
                }
                for change in &diff.accepted {
                    tracing::info!(query = %pipeline.query.name, "accepted a change of the query: {change}");
                }
                if !diff.accepted.is_empty() {
                    checkpoint.set_fingerprint(fingerprint)?;
                }
            }
            None => checkpoint.set_fingerprint(fingerprint)?,
        }

        // Where the watermark stands (§3.1): the last planned batch's, and
        // the one its commit computed for the next batch.
        let (mut last_watermark_ms, mut next_watermark_ms) = (0, 0);
        if let Some(n) = last_planned {
            let entry: Option<OffsetEntry> = checkpoint.offsets().get(n)?;
            let wm = entry.map_or(0, |e| e.batch_watermark_ms);
            last_watermark_ms = wm;
            next_watermark_ms = wm;
            if pending.is_none() {
                let commit: Option<CommitEntry> = checkpoint.commits().get(n)?;
                next_watermark_ms = commit.map_or(wm, |c| c.next_batch_watermark_ms);
            } else if n > 0 {
                let previous: Option<OffsetEntry> = checkpoint.offsets().get(n - 1)?;
                last_watermark_ms = previous.map_or(0, |e| e.batch_watermark_ms);
            }
        }

        let sink: Box<dyn Sink> = match &pipeline.sink {
            SinkSpec::Files { path, format } => Box::new(FilesSink::new(
                path.clone(),
                match format {
                    spec::OutputFormat::Json => sink::files::FileFormat::Json,
                    spec::OutputFormat::Csv => sink::files::FileFormat::Csv,
                    spec::OutputFormat::Parquet => sink::files::FileFormat::Parquet,
                },
            )?),
            SinkSpec::Console { max_rows } => Box::new(ConsoleSink::new(
                options
                    .console
                    .take()
                    .unwrap_or_else(|| Box::new(std::io::stdout())),
                *max_rows,
            )),
            SinkSpec::Memory => Box::new(options.memory_sink.clone().unwrap_or_default()),
            SinkSpec::Delta(d) => Box::new(delta_sink(
                d,
                &pipeline.query,
                checkpoint.dir(),
                checkpoint.query_id(),
                options.failpoint,
            )?),
            SinkSpec::Plugin(p) => {
                let loaded = engine.load(&p.name, &p.plugin)?;
                let plugin = WasmSink::open(
                    &engine,
                    loaded,
                    PluginOptions {
                        name: p.name.clone(),
                        config_json: p.config.to_string(),
                        sandbox: Sandbox {
                            memory_bytes: p.limits.memory_bytes,
                            timeout: p.limits.timeout,
                            fuel: p.limits.fuel,
                            dirs: p
                                .capabilities
                                .dirs
                                .iter()
                                .map(|d| DirGrant {
                                    host: d.host.clone(),
                                    guest: d.guest.clone(),
                                    writable: d.writable,
                                })
                                .collect(),
                        },
                        failpoint: options.failpoint,
                    },
                    &schema,
                )?;
                Box::new(PluginSink::new(plugin))
            }
        };
        let started_ms = options.clock.now_ms();
        if let Some(n) = pending {
            tracing::info!(
                batch_id = n,
                "batch {n} was planned but not committed: running it again"
            );
        }
        Ok(Self {
            pipeline,
            run_id: uuid::Uuid::new_v4().to_string(),
            checkpoint,
            source,
            dead_letter,
            transforms,
            watermark,
            stateful,
            last_watermark_ms,
            next_watermark_ms,
            sink,
            output_schema: schema,
            pending,
            next_batch,
            options,
            last_trigger: None,
            last_input_ms: started_ms,
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

    fn stopped(&self) -> bool {
        self.options.stop.load(Ordering::Relaxed)
    }

    /// Runs batches as the trigger says, until the trigger is done, a stop is
    /// requested, or a batch fails.
    ///
    /// # Errors
    /// The first batch that fails for good; it is left uncommitted, so the
    /// next start runs it again.
    pub fn run(&mut self) -> Result<RunSummary, QueryError> {
        if let Some(n) = self.pending.take() {
            self.run_planned(n, true, 0, Instant::now())?;
        }
        match self.pipeline.query.trigger {
            Trigger::AvailableNow => {
                // Spark's availableNow: what is there at start, in as many
                // batches as the rate limit gives, then stop.
                let mut remaining = self.source.list_new()?;
                while !remaining.is_empty() && !self.stopped() {
                    let files = self.source.take(&remaining, false);
                    remaining.drain_front(files.len());
                    self.plan_and_run(files)?;
                }
                // Then, like Spark, one batch without data if the watermark
                // moved, so that what it passed is emitted.
                if !self.stopped() && self.wants_no_data_batch() {
                    self.plan_and_run(self.source.nothing())?;
                }
            }
            Trigger::Once => {
                if self.summary.batches == 0 {
                    let all = self.source.list_new()?;
                    if !all.is_empty() {
                        let files = self.source.take(&all, true);
                        self.plan_and_run(files)?;
                    }
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
        }
        // Every batch run so far is committed: the sink may now publish what it held back.
        self.sink.close()?;
        Ok(self.summary.clone())
    }

    /// One trigger of a long-running query: a batch of new files, or a
    /// no-data batch when the watermark moved. Whether a batch ran.
    fn trigger_once(&mut self) -> Result<bool, QueryError> {
        let files = self.source.take(&self.source.list_new()?, false);
        if !files.is_empty() {
            self.last_input_ms = self.options.clock.now_ms();
            self.plan_and_run(files)?;
            return Ok(true);
        }
        self.advance_idle_watermark();
        if self.wants_no_data_batch() {
            self.plan_and_run(self.source.nothing())?;
            return Ok(true);
        }
        Ok(false)
    }

    /// The opt-in idle timeout (`[watermark] idle_timeout`): an input without
    /// data for that long no longer holds the watermark back; it advances as
    /// if event time kept pace with the clock (clock − delay). The value
    /// goes into the next batch's offsets entry, so a replay sees it.
    fn advance_idle_watermark(&mut self) {
        let Some(spec) = &self.pipeline.watermark else {
            return;
        };
        let Some(idle) = spec.idle_timeout else {
            return;
        };
        let now = self.options.clock.now_ms();
        if now.saturating_sub(self.last_input_ms) < millis_i64(idle) {
            return;
        }
        let candidate = now.saturating_sub(millis_i64(spec.delay));
        if candidate > self.next_watermark_ms {
            tracing::info!(
                query = %self.pipeline.query.name,
                idle_ms = now.saturating_sub(self.last_input_ms),
                "source {} is idle: the watermark advances to {}",
                self.source.name(),
                progress::rfc3339_ms(candidate)
            );
            self.next_watermark_ms = candidate;
        }
    }

    /// Spark runs a batch without new data when a stateful operator could
    /// emit or evict because the watermark advanced (not in complete mode).
    fn wants_no_data_batch(&self) -> bool {
        self.stateful.is_some()
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

    /// Plans the next batch over `files` (durably) and runs it.
    fn plan_and_run(&mut self, files: Units) -> Result<(), QueryError> {
        let n = self.next_batch;
        let started = Instant::now();
        self.source.record(&self.checkpoint, n, &files)?;
        self.checkpoint.offsets().put(
            n,
            &OffsetEntry {
                batch_watermark_ms: self.next_watermark_ms,
                late_row_watermark_ms: self.last_watermark_ms,
                batch_timestamp_ms: self.options.clock.now_ms(),
                sources: vec![SourceOffset {
                    name: self.source.name().to_owned(),
                    log_offset: n,
                }],
            },
        )?;
        let wal_ms = millis(started.elapsed());
        Failpoint::check(self.options.failpoint.as_ref(), Phase::AfterOffsets, n);
        self.next_batch = n + 1;
        self.run_planned(n, false, wal_ms, started)
    }

    fn run_planned(
        &mut self,
        n: u64,
        replay: bool,
        wal_ms: u64,
        trigger_start: Instant,
    ) -> Result<(), QueryError> {
        tracing::debug!(batch_id = n, replay, "starting batch {n}");
        let entry: OffsetEntry =
            self.checkpoint
                .offsets()
                .get(n)?
                .ok_or_else(|| QueryError::Protocol {
                    batch_id: n,
                    message: "offsets entry vanished".into(),
                })?;
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
                Err(e) if info.attempt < retries + u32::from(replay) && is_retryable(&e) => {
                    let backoff = Duration::from_millis(100 << info.attempt.min(6));
                    tracing::warn!(batch_id = n, attempt = info.attempt, error = %e, "batch failed; retrying in {backoff:?}");
                    self.sleep(backoff);
                    info.attempt += 1;
                }
                Err(e) => return Err(e),
            }
        };
        Failpoint::check(self.options.failpoint.as_ref(), Phase::BeforeCommit, n);
        let commit_started = Instant::now();
        // State first (version n), then the batch (§3 step 4).
        let state_metrics = match &mut self.stateful {
            Some(op) => Some(op.commit(n)?),
            None => None,
        };
        let next_watermark_ms = match &self.watermark {
            Some(w) => w.next(entry.batch_watermark_ms, outcome.event_time),
            None => entry.batch_watermark_ms,
        };
        self.checkpoint.commits().put(
            n,
            &CommitEntry {
                next_batch_watermark_ms: next_watermark_ms,
            },
        )?;
        self.last_watermark_ms = entry.batch_watermark_ms;
        self.next_watermark_ms = next_watermark_ms;
        if n >= BATCHES_TO_RETAIN {
            let keep_from = n + 1 - BATCHES_TO_RETAIN;
            self.checkpoint.offsets().purge_before(keep_from)?;
            self.checkpoint.commits().purge_before(keep_from)?;
        }
        let commit_ms = millis(commit_started.elapsed());
        let total_ms = millis(trigger_start.elapsed());
        let record = self.progress(
            n,
            &entry,
            &outcome,
            state_metrics,
            usage_before,
            since_last,
            [wal_ms, commit_ms, total_ms],
        );
        let json = serde_json::to_value(&record).map_err(|e| QueryError::Protocol {
            batch_id: n,
            message: format!("cannot serialise progress: {e}"),
        })?;
        self.checkpoint.append_progress(&json)?;
        tracing::info!(query = %self.pipeline.query.name, batch_id = n, "{}", record.summary());
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
        state_metrics: Option<OperatorMetrics>,
        usage_before: Vec<(String, String, PluginUsage)>,
        since_last: Option<Duration>,
        [wal_ms, commit_ms, total_ms]: [u64; 3],
    ) -> QueryProgress {
        let mut duration_ms = BTreeMap::new();
        duration_ms.insert("latestOffset", 0);
        duration_ms.insert("walCommit", wal_ms);
        duration_ms.insert("getBatch", outcome.get_batch_ms);
        duration_ms.insert("addBatch", outcome.add_batch_ms);
        duration_ms.insert("commitOffsets", commit_ms);
        duration_ms.insert("triggerExecution", total_ms);
        let input_rate = since_last.map_or(0.0, |d| progress::rate(outcome.input_rows, millis(d)));
        let processed_rate = progress::rate(outcome.input_rows, total_ms.max(1));
        let mut metrics = BTreeMap::new();
        metrics.insert("numMalformedRows", outcome.malformed_rows.to_string());
        metrics.insert("numFiles", outcome.files.to_string());
        let mut event_time = BTreeMap::new();
        if self.watermark.is_some() {
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
            batch_id: n,
            batch_duration: total_ms,
            num_input_rows: outcome.input_rows,
            input_rows_per_second: input_rate,
            processed_rows_per_second: processed_rate,
            duration_ms,
            event_time,
            state_operators,
            sources: vec![SourceProgress {
                description: self.source.description(),
                start_offset: n
                    .checked_sub(1)
                    .map(|p| serde_json::json!({ "logOffset": p })),
                end_offset: serde_json::json!({ "logOffset": n }),
                latest_offset: serde_json::json!({ "logOffset": n }),
                num_input_rows: outcome.input_rows,
                input_rows_per_second: input_rate,
                processed_rows_per_second: processed_rate,
                metrics,
            }],
            sink: SinkProgress {
                description: self.sink.description(),
                num_output_rows: outcome.output_rows,
                metrics: BTreeMap::new(),
            },
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
                    }
                })
                .collect(),
        }
    }

    fn plugin_usages(&self) -> Vec<(String, String, PluginUsage)> {
        self.transforms
            .iter()
            .filter_map(|t| t.plugin_usage())
            .chain(self.sink.plugin_usage())
            .collect()
    }

    /// Reads, transforms, runs the stateful operator and writes batch
    /// `info.batch_id`; writes nothing to the checkpoint but state pending
    /// its commit.
    fn execute(&mut self, info: &BatchInfo, entry: &OffsetEntry) -> Result<Outcome, QueryError> {
        let n = info.batch_id;
        let get_started = Instant::now();
        let (decoded, files) = self.source.read(&self.checkpoint, n)?;
        if let Some(dir) = &self.dead_letter
            && !decoded.malformed.is_empty()
        {
            decode::write_dead_letters(dir, n, &decoded.malformed).map_err(|error| {
                QueryError::Decoder {
                    source_name: self.source.name().to_owned(),
                    error,
                }
            })?;
        }
        let get_batch_ms = millis(get_started.elapsed());
        let add_started = Instant::now();
        let mut outputs: Vec<RecordBatch> = Vec::with_capacity(decoded.batches.len());
        for batch in decoded.batches {
            let mut batch = batch;
            for t in &mut self.transforms {
                if batch.num_rows() == 0 {
                    break;
                }
                batch = t.process(&batch, info)?;
            }
            if batch.num_rows() > 0 {
                outputs.push(batch);
            }
        }
        let event_time = self.watermark.as_ref().and_then(|w| w.observe(&outputs));
        if let Some(op) = &mut self.stateful {
            // Every attempt starts from the state the previous batch committed.
            op.load(n.checked_sub(1))?;
            let ctx = StatefulContext {
                batch_id: n,
                late_ms: entry.late_row_watermark_ms,
                watermark_ms: entry.batch_watermark_ms,
            };
            outputs = op.process(&ctx, &outputs)?;
        }
        let output_rows = self.sink.write_batch(info, &self.output_schema, &outputs)?;
        Ok(Outcome {
            files,
            input_rows: decoded.num_input_rows,
            malformed_rows: decoded.num_malformed,
            output_rows,
            event_time,
            get_batch_ms,
            add_batch_ms: millis(add_started.elapsed()),
        })
    }
}

struct Outcome {
    files: usize,
    input_rows: u64,
    malformed_rows: u64,
    output_rows: u64,
    event_time: Option<EventTimeRange>,
    get_batch_ms: u64,
    add_batch_ms: u64,
}

fn is_retryable(e: &QueryError) -> bool {
    match e {
        QueryError::Transform(t) => t.is_retryable(),
        QueryError::Plugin(p) => p.is_retryable(),
        QueryError::Sink(s) => s.is_retryable(),
        QueryError::Source(e) => e.is_retryable(),
        _ => false,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The stateful operator of the pipeline, if any, checked against Spark's
/// rules for output modes.
fn build_stateful(
    pipeline: &Pipeline,
    checkpoint_dir: &std::path::Path,
    schema: &SchemaRef,
) -> Result<Option<Box<dyn StatefulOperator>>, QueryError> {
    let query = &pipeline.query;
    let invalid = |message: String| QueryError::Invalid {
        query: query.name.clone(),
        message,
    };
    let state = StateOptions {
        kind: match query.state_store {
            spec::StateStoreKind::RocksDb => StoreKind::RocksDb,
            spec::StateStoreKind::Memory => StoreKind::Memory,
        },
        ..StateOptions::default()
    };
    let state_dir = checkpoint_dir.join("state").join("0");
    let delay_ms = pipeline.watermark.as_ref().map_or(0, |w| {
        i64::try_from(w.delay.as_millis()).unwrap_or(i64::MAX)
    });
    if let Some(a) = &pipeline.aggregate {
        let aggregates = a
            .select
            .iter()
            .enumerate()
            .map(|(i, text)| {
                crate::operator::aggregate::parse_agg_expr(text)
                    .map_err(|e| invalid(format!("aggregate.select[{i}]: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let window = a.window.as_ref().map(|w| WindowConfig {
            column: w.column.clone(),
            spec: match w.kind {
                spec::WindowKind::Tumbling { size } => {
                    crate::operator::aggregate::WindowSpec::Tumbling {
                        size_ms: millis_i64(size),
                    }
                }
                spec::WindowKind::Sliding { size, slide } => {
                    crate::operator::aggregate::WindowSpec::Sliding {
                        size_ms: millis_i64(size),
                        slide_ms: millis_i64(slide),
                    }
                }
                spec::WindowKind::Session { gap } => {
                    crate::operator::aggregate::WindowSpec::Session {
                        gap_ms: millis_i64(gap),
                    }
                }
            },
        });
        if pipeline.watermark.is_none() {
            tracing::warn!(
                query = %query.name,
                "the aggregation has no [watermark]: its state grows without bound; declare one so old windows can be evicted"
            );
        }
        let op = AggregateOperator::new(
            AggregateConfig {
                window,
                group_by: a.group_by.clone(),
                aggregates,
                output_mode: match query.output_mode {
                    OutputMode::Append => AggOutputMode::Append,
                    OutputMode::Update => AggOutputMode::Update,
                    OutputMode::Complete => AggOutputMode::Complete,
                },
                watermark_column: pipeline.watermark.as_ref().map(|w| w.column.clone()),
                num_partitions: query.state_partitions,
                state_dir,
                state,
            },
            schema,
        )?;
        return Ok(Some(Box::new(op)));
    }
    if let Some(d) = &pipeline.deduplicate {
        if query.output_mode == OutputMode::Complete {
            return Err(invalid(
                "complete output mode needs an aggregation; deduplication supports append and update".into(),
            ));
        }
        let event_time = pipeline.watermark.as_ref().map(|w| w.column.clone());
        if !event_time.as_ref().is_some_and(|c| d.keys.contains(c)) && !d.within_watermark {
            tracing::warn!(
                query = %query.name,
                "deduplication keys do not include the watermarked event time: its state grows without bound (use within_watermark = true, or add the event-time column to the keys)"
            );
        }
        let op = DedupOperator::new(
            DedupConfig {
                keys: d.keys.clone(),
                within_watermark: d.within_watermark,
                event_time,
                delay_ms,
                num_partitions: query.state_partitions,
                state_dir,
                state,
            },
            schema,
        )?;
        return Ok(Some(Box::new(op)));
    }
    if query.output_mode == OutputMode::Complete {
        return Err(invalid(
            "complete output mode is only for queries with an [aggregate]: use append".into(),
        ));
    }
    Ok(None)
}

/// The files source of the pipeline, with its decoder.
fn files_source(
    name: &str,
    files: &spec::FilesSourceSpec,
    checkpoint: &Checkpoint,
    last_planned: Option<u64>,
) -> Result<FilesSource, QueryError> {
    let decoder = Decoder::new(
        Arc::clone(&files.schema),
        DecoderOptions {
            format: match &files.format {
                spec::InputFormat::Json => decode::Format::JsonLines,
                spec::InputFormat::Csv { header, delimiter } => {
                    decode::Format::Csv(decode::CsvOptions {
                        header: *header,
                        delimiter: *delimiter,
                        quote: b'"',
                    })
                }
            },
            policy: match files.on_malformed {
                spec::OnMalformed::Permissive => decode::MalformedPolicy::Permissive,
                spec::OnMalformed::Drop => decode::MalformedPolicy::Drop,
                spec::OnMalformed::Fail => decode::MalformedPolicy::Fail,
                spec::OnMalformed::DeadLetter => decode::MalformedPolicy::DeadLetter,
            },
            batch_size: 65_536,
        },
    )
    .map_err(|error| QueryError::Decoder {
        source_name: name.to_owned(),
        error,
    })?;
    let source = FilesSource::open(
        name.to_owned(),
        0,
        files.path.clone(),
        files.max_files_per_trigger,
        decoder,
        checkpoint,
        last_planned,
    )
    .map_err(InputError::from)?;
    Ok(source)
}

/// The Delta sink of the pipeline, checked against the query's output mode.
fn delta_sink(
    spec: &spec::DeltaSinkSpec,
    query: &spec::QuerySpec,
    checkpoint_dir: &std::path::Path,
    query_id: &str,
    failpoint: Option<Failpoint>,
) -> Result<sink::delta::DeltaSink, QueryError> {
    use sink::delta::{CommitPolicy, DeltaSink, DeltaSinkOptions, WriteMode};
    let invalid = |message: String| QueryError::Invalid {
        query: query.name.clone(),
        message,
    };
    let mode = match query.output_mode {
        OutputMode::Append => WriteMode::Append,
        OutputMode::Complete => WriteMode::Complete,
        OutputMode::Update => {
            return Err(invalid(
                "a delta sink takes output_mode \"append\" or \"complete\", not \"update\" (as in Spark; upserts need MERGE)".into(),
            ));
        }
    };
    let commit = match spec.commit_every {
        spec::CommitEvery::Batches(n) => CommitPolicy::Batches(n.get()),
        spec::CommitEvery::Interval(d) => CommitPolicy::Interval(d),
    };
    if mode == WriteMode::Complete && commit != CommitPolicy::Batches(1) {
        return Err(invalid(
            "sink.commit_every: complete mode rewrites the whole table every batch, so it commits every batch; remove commit_every".into(),
        ));
    }
    let sink = DeltaSink::new(DeltaSinkOptions {
        path: spec.path.clone(),
        query_id: query_id.to_owned(),
        mode,
        partition_by: spec.partition_by.clone(),
        target_file_size: spec.target_file_size,
        commit,
        pending_dir: checkpoint_dir.join("sinks").join("delta").join("pending"),
        failpoint,
    })
    .map_err(SinkError::from)?;
    Ok(sink)
}

fn millis_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
