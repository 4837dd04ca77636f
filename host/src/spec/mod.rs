//! The pipeline file (TOML): loading, `--set` overrides and validation into typed specs.
//!
//! A streaming query can run for weeks, so every mistake in its file must surface before the first
//! batch, all at once, each with the key path to fix (`source.orders.schema`,
//! `transform[1].limits.memory`). Nothing downstream re-checks the settings: the rest of the host
//! receives a [`Pipeline`] whose values are already typed (durations, sizes, an Arrow schema,
//! resolved paths). The key names are the contract of DESIGN.md §8 and are never renamed.
//!
//! # Layout
//! - `mod.rs`: the public types, [`load`] and [`parse`].
//! - `overrides.rs`: `--set KEY=VALUE` applied to the TOML tree before anything else.
//! - `raw.rs`: the file as serde sees it (`deny_unknown_fields`), read tolerantly so that every
//!   unknown key and wrongly typed value is reported, not only the first. A `[[source]]` or
//!   `[sink]` is read as the struct of its `kind` (`RawFilesSource`, `RawDeltaSink`, ...), so an
//!   unknown key is reported with exactly that kind's keys.
//! - `validate.rs` (with `validate/kafka.rs`, `validate/merge.rs`): the semantic pass from the raw
//!   structs to [`Pipeline`].
//! - `stateful.rs`, `sink_modes.rs`: the rules across tables (Spark's output modes for stateful
//!   operators; which sink takes which output mode), run by validation and again by
//!   `Query::start` for a pipeline built in code, so `weir validate` and `weir run` refuse the
//!   same files with the same words.
//! - `ddl.rs`: Spark DDL schema strings → Arrow schemas.
//! - `merge.rs`: the settings of a Delta MERGE (sink and capability), its condition parser.
//! - `duration.rs`, `size.rs`: "30s" / "10 minutes" and "64 MiB" / "1 GiB".
//!
//! # Adding a key
//! A key of one source or sink kind touches that kind only: add an `Option` field to its raw
//! struct in `raw.rs` (which makes it a known key, listed in that kind's "unknown key" message),
//! read it in the kind's function in `validate.rs` (defaults, ranges, every problem pushed with
//! its key path), and add the typed field to the kind's spec struct here, which is what the
//! runtime (`source::open`, `sink/`, `query/`) receives. A new kind adds a raw struct, one arm
//! in `raw::read_source` / `raw::read_sink` (and its name in `SOURCE_KINDS` / `SINK_KINDS` and
//! `SOURCE_STRUCTS` / `SINK_STRUCTS`), a variant of [`SourceKind`] / [`SinkSpec`] and its
//! validating function. A setting that the runtime would refuse (an output mode a sink cannot
//! write, a combination Spark refuses) is a rule of `sink_modes.rs` or `stateful.rs`, never a
//! check at start only: `weir validate` must refuse what `weir run` refuses.

pub mod ddl;
pub mod duration;
pub mod json_schema;
pub mod merge;
mod overrides;
mod policy;
mod raw;
mod real_time;
mod sink_modes;
pub mod size;
mod stateful;
mod validate;

use std::fmt;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::decode::MalformedPolicy;
pub use crate::plugin::HttpGrant;
pub use crate::state::StoreKind;
pub use ddl::parse_schema;
pub use duration::{HumanDuration, format_duration, parse_duration};
pub use merge::{MergeDedup, MergeTableSpec, RowCondition, Sides, parse_condition, parse_dedup};
pub use policy::{Confinement, Policy, confinement_problems, load_policy, parse_policy};
pub use real_time::real_time_problems;
pub use sink_modes::sink_problems;
pub use size::{ByteSize, format_byte_size, parse_byte_size};
pub use stateful::{stateful_problems, stateful_warnings};

/// A validated pipeline file: one query, its sources, transforms and sink.
#[derive(Debug, Clone, PartialEq)]
pub struct Pipeline {
    /// The `[query]` table.
    pub query: QuerySpec,
    /// The `[[source]]` tables (exactly one for now).
    pub sources: Vec<SourceSpec>,
    /// The `[[transform]]` tables, in the order they apply.
    pub transforms: Vec<TransformSpec>,
    /// The `[[function]]` tables: plugins' scalar functions the SQL may call.
    pub functions: Vec<FunctionSpec>,
    /// The `[[listener]]` tables: who hears of the query's start, batches, idleness and end.
    pub listeners: Vec<ListenerSpec>,
    /// The `[[table]]` tables: static inputs of a join.
    pub tables: Vec<TableSpec>,
    /// The `[join]` table.
    pub join: Option<JoinSpec>,
    /// The `[watermark]` table.
    pub watermark: Option<WatermarkSpec>,
    /// The `[aggregate]` table.
    pub aggregate: Option<AggregateSpec>,
    /// The `[deduplicate]` table.
    pub deduplicate: Option<DeduplicateSpec>,
    /// The `[sink]` table.
    pub sink: SinkSpec,
    /// The folder relative paths were resolved against (the pipeline file's folder).
    pub base_dir: PathBuf,
}

/// The `[query]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct QuerySpec {
    /// `name`: `[A-Za-z0-9_.-]+`.
    pub name: String,
    /// `checkpoint`, resolved against the pipeline file's folder.
    pub checkpoint: PathBuf,
    /// `trigger`; [`Trigger::Continuous`] when absent.
    pub trigger: Trigger,
    /// `output_mode`; append when absent.
    pub output_mode: OutputMode,
    /// `max_batch_retries`: retries of a batch failing with a retryable error (default 2).
    pub max_batch_retries: u32,
    /// `state_store`: where stateful operators keep state. `None` (not set): the store the
    /// checkpoint's state was written with, or [`StoreKind::default`] for a new checkpoint.
    pub state_store: Option<StoreKind>,
    /// `state_partitions`: how many partitions state is split into (default 2, like the
    /// reference Spark runs); frozen in the checkpoint at the first start.
    pub state_partitions: u32,
    /// `watermark_policy`: how the watermarks of several inputs combine (default min).
    pub watermark_policy: WatermarkPolicy,
    /// `threads`: how many threads decode a batch's files (and read the next batch's ahead),
    /// work on the state partitions, and encode a Parquet file's columns; `None` (the
    /// default): as many as the machine has cores. It changes no result, so the fingerprint
    /// leaves it out.
    pub threads: Option<NonZeroUsize>,
}

/// `query.watermark_policy`: Spark's `spark.sql.streaming.multipleWatermarkPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatermarkPolicy {
    Min,
    Max,
}

/// The `[watermark]` table: event time and how late it may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatermarkSpec {
    pub column: String,
    pub delay: Duration,
    /// Opt-in: advance the watermark of an input idle for this long.
    pub idle_timeout: Option<Duration>,
}

/// The `[aggregate]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggregateSpec {
    pub window: Option<WindowSpec>,
    pub group_by: Vec<String>,
    /// Aggregate expressions such as `"sum(amount) AS revenue"`, checked by the operator.
    pub select: Vec<String>,
}

/// `aggregate.window`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowSpec {
    pub column: String,
    pub kind: WindowKind,
}

/// Tumbling (`size`), sliding (`size` + `slide`) or session (`gap`) windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    Tumbling { size: Duration },
    Sliding { size: Duration, slide: Duration },
    Session { gap: Duration },
}

/// The `[deduplicate]` table: Spark's `dropDuplicates` / `dropDuplicatesWithinWatermark`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeduplicateSpec {
    pub keys: Vec<String>,
    pub within_watermark: bool,
}

/// When batches start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// `"available-now"`: process everything available, in as many batches as the rate limits
    /// require, then stop.
    AvailableNow,
    /// `"once"`: one batch with everything available (rate limits ignored), then stop.
    Once,
    /// A duration such as `"30s"`: a batch starts every interval (or when the previous one ends,
    /// if it took longer).
    ProcessingTime(Duration),
    /// No `trigger` key: the next batch starts as soon as the previous one ends.
    Continuous,
    /// `"real-time"` or `{ real_time = "5 minutes", max_latency = "10ms" }`: rows flow through
    /// in small parts as they arrive, and a batch (offsets, state, the sink's commit) is made
    /// durable once per checkpoint interval (see `query::real_time`).
    RealTime(RealTime),
}

/// The settings of the real-time trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RealTime {
    /// `real_time`: how long a batch collects parts before it is made durable (Spark's
    /// `realTime` interval, which bounds the batch, not the latency). Default 5 minutes.
    pub checkpoint_interval: Duration,
    /// `max_latency`: how long a part waits for more rows after its first one. Default 10 ms.
    pub max_latency: Duration,
}

impl RealTime {
    /// Spark's default checkpoint interval of the real-time trigger.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(300);
    pub const DEFAULT_MAX_LATENCY: Duration = Duration::from_millis(10);
}

/// Which rows a batch hands to the sink (DESIGN.md §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    /// `"append"` (default).
    Append,
    /// `"update"`.
    Update,
    /// `"complete"`.
    Complete,
}

/// One `[[source]]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceSpec {
    /// `name`, unique among sources.
    pub name: String,
    /// `kind` and the keys that go with it.
    pub kind: SourceKind,
    /// `watermark`: this input's own event-time column and delay, the inputs of a
    /// stream-stream join having different columns (Spark's `withWatermark` on each side).
    pub watermark: Option<WatermarkSpec>,
}

/// The kind of a source, with its settings.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceKind {
    /// `kind = "files"`: new files appearing in a folder.
    Files(FilesSourceSpec),
    /// `kind = "kafka"`: records of Kafka topics, by offset range.
    Kafka(KafkaSourceSpec),
    /// `kind = "delta"`: the rows that new versions of a Delta table append.
    Delta(DeltaSourceSpec),
}

/// A `kind = "kafka"` source (Spark's Kafka source options, snake_cased).
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaSourceSpec {
    /// `bootstrap_servers`: `host:port[,host:port...]`.
    pub bootstrap_servers: String,
    /// `subscribe` (a list of topics) or `subscribe_pattern` (a regular expression).
    pub topics: KafkaTopics,
    /// `starting_offsets`: where a new query starts (default latest, as in Spark).
    pub starting_offsets: StartingOffsets,
    /// `max_offsets_per_trigger`: at most this many records per batch, over all partitions.
    pub max_offsets_per_trigger: Option<std::num::NonZeroU64>,
    /// `fail_on_data_loss` (default true): fail when offsets to read are gone.
    pub fail_on_data_loss: bool,
    /// `format` + `schema`: how the value is decoded (raw bytes when absent).
    pub value_format: KafkaValueFormat,
    /// `on_malformed` (JSON values only).
    pub on_malformed: MalformedPolicy,
    /// `dead_letter_path` (resolved), present iff `on_malformed = "dead-letter"`.
    pub dead_letter_path: Option<PathBuf>,
}

/// Which topics a Kafka source reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KafkaTopics {
    /// `subscribe = ["a", "b"]`.
    Subscribe(Vec<String>),
    /// `subscribe_pattern = "orders-.*"`: every topic whose whole name matches (checked valid).
    Pattern(String),
}

/// `starting_offsets`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartingOffsets {
    /// `"earliest"`.
    Earliest,
    /// `"latest"` (default).
    Latest,
    /// Spark's JSON, `{"topic":{"0":23,"1":-2}}`: -2 is earliest, -1 latest.
    Specific(std::collections::BTreeMap<String, std::collections::BTreeMap<i32, i64>>),
}

/// How the records of a Kafka source become rows.
#[derive(Debug, Clone, PartialEq)]
pub enum KafkaValueFormat {
    /// No `format`: Spark's columns key, value, topic, partition, offset, timestamp, timestampType.
    Raw,
    /// `format = "json"`: the value decoded as `from_json(value, schema)`.
    Json(arrow_schema::SchemaRef),
}

/// A Delta table read as a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaSourceSpec {
    /// `path` (resolved): the table's folder.
    pub path: PathBuf,
    /// At most this many data files per batch (Spark's `maxFilesPerTrigger`).
    pub max_files_per_trigger: Option<NonZeroUsize>,
    /// The first table version read; `None`: the table as it is at the first batch (its whole
    /// content), then every later version.
    pub starting_version: Option<u64>,
}

/// A `kind = "files"` source.
#[derive(Debug, Clone, PartialEq)]
pub struct FilesSourceSpec {
    /// `path`: the folder watched (resolved; it need not exist yet).
    pub path: PathBuf,
    /// `format` and, for CSV, the `csv` options.
    pub format: InputFormat,
    /// `schema`, parsed from Spark DDL: required for JSON and CSV; for Parquet, when absent,
    /// the schema of the folder's first file when the query starts.
    pub schema: Option<arrow_schema::SchemaRef>,
    /// `max_files_per_trigger`: at most this many new files per batch.
    pub max_files_per_trigger: Option<NonZeroUsize>,
    /// `on_malformed`: what to do with a row that does not match the schema (always the
    /// default for Parquet, which has no malformed rows).
    pub on_malformed: MalformedPolicy,
    /// `dead_letter_path` (resolved), present iff `on_malformed = "dead-letter"`.
    pub dead_letter_path: Option<PathBuf>,
}

/// The format of a files source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputFormat {
    /// `"json"`: JSON lines.
    Json,
    /// `"csv"`, with `csv = { header, delimiter }` (defaults: no header, as in Spark; ',').
    Csv {
        /// The first line of each file is a header, not data.
        header: bool,
        /// The field separator, one ASCII character.
        delimiter: u8,
    },
    /// `"parquet"`: Parquet files, columns by name.
    Parquet,
}

/// One `[[transform]]` table: a Wasm plugin or a SQL statement applied to every batch.
#[derive(Debug, Clone, PartialEq)]
pub struct TransformSpec {
    /// `name`; by default the plugin's file stem, or `sql_<index>` for SQL.
    pub name: String,
    /// `input`: the one source it applies to, before the inputs meet; every
    /// input (after they meet) when absent.
    pub input: Option<String>,
    /// What the transform runs.
    pub kind: TransformKind,
}

impl TransformSpec {
    /// The plugin's settings, for a Wasm transform.
    pub fn wasm(&self) -> Option<&WasmTransformSpec> {
        match &self.kind {
            TransformKind::Wasm(w) => Some(w),
            TransformKind::Sql { .. } => None,
        }
    }
}

/// What a `[[transform]]` runs.
#[derive(Debug, Clone, PartialEq)]
pub enum TransformKind {
    /// `plugin = "..."`: a Wasm component.
    Wasm(WasmTransformSpec),
    /// `sql = "SELECT ... FROM input WHERE ..."`: evaluated natively (`crate::sql`).
    Sql {
        /// The statement, as written.
        sql: String,
    },
}

/// A `[[table]]`: a static input, read into memory and read again when it changes.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSpec {
    /// `name`: what `[join]` calls it.
    pub name: String,
    /// `kind` and its keys.
    pub kind: TableKind,
    /// `max_size`: a snapshot larger than this (on disk, and in memory once read) is refused.
    pub max_bytes: u64,
}

/// The default `max_size` of a `[[table]]`.
pub const DEFAULT_TABLE_MAX_BYTES: u64 = 1 << 30;

/// Where a static table's rows come from.
#[derive(Debug, Clone, PartialEq)]
pub enum TableKind {
    /// `kind = "files"`: a file, or the files of a folder (hidden ones and `_`-prefixed ones
    /// left out), read whole; malformed lines are left out (counted in the log).
    Files {
        /// `path` (resolved).
        path: PathBuf,
        /// `format` (json, csv or parquet) and, for CSV, its options.
        format: InputFormat,
        /// `schema`: required for JSON and CSV; for Parquet, the files' own when absent.
        schema: Option<arrow_schema::SchemaRef>,
    },
    /// `kind = "delta"`: a Delta table's latest version (its own schema).
    Delta {
        /// `path` (resolved).
        path: PathBuf,
    },
}

/// One `[[listener]]`: Spark's `StreamingQueryListener`.
#[derive(Debug, Clone, PartialEq)]
pub struct ListenerSpec {
    /// `name`: in logs, progress and errors.
    pub name: String,
    pub kind: ListenerKind,
}

/// What a listener is.
#[derive(Debug, Clone, PartialEq)]
pub enum ListenerKind {
    /// `plugin`: a component of world `listener`, sandboxed like any plugin.
    Plugin(WasmTransformSpec),
    /// `url`: each event POSTed as JSON (`http://` or `https://`).
    Webhook { url: String },
}

/// `[join]`: the left input joined with the right one.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinSpec {
    /// `left`: a `[[source]]` or a `[[table]]`.
    pub left: String,
    /// `right`: a `[[table]]` (stream-static) or a `[[source]]`.
    pub right: String,
    /// `type`.
    pub kind: JoinType,
    /// `on`: columns of both inputs that must be equal; each appears once in the output.
    pub on: Vec<String>,
    /// `condition`: SQL over both rows, each qualified by its input's name.
    pub condition: Option<RowCondition>,
}

/// A join's type, Spark's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinType {
    Inner,
    Left,
    Right,
    Full,
    LeftSemi,
    LeftAnti,
}

impl JoinType {
    /// The pipeline file's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Inner => "inner",
            Self::Left => "left",
            Self::Right => "right",
            Self::Full => "full",
            Self::LeftSemi => "left_semi",
            Self::LeftAnti => "left_anti",
        }
    }
}

/// A `[[function]]`: a scalar function that a plugin of world `scalar-function` offers to SQL.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionSpec {
    /// `name`: the function's SQL name, lower case (SQL names are case-insensitive).
    pub name: String,
    /// `arguments`: the types the arguments are cast to before the call.
    pub arguments: Vec<arrow_schema::DataType>,
    /// `returns`: the type of its result.
    pub returns: arrow_schema::DataType,
    /// The plugin, its config, limits, grants and pin, as for a transform's plugin.
    pub plugin: WasmTransformSpec,
}

/// A Wasm plugin transform's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct WasmTransformSpec {
    /// `plugin`: the `.wasm` component (resolved; it exists).
    pub plugin: PathBuf,
    /// `config`, handed to the plugin as JSON (`{}` when absent).
    pub config: serde_json::Value,
    /// `limits`.
    pub limits: PluginLimits,
    /// `sha256`: the content hash the plugin file must have (lower-case hex),
    /// checked when the query starts and when a new build is loaded.
    pub sha256: Option<String>,
    /// `capabilities`: what the sandbox grants beyond nothing.
    pub capabilities: Capabilities,
}

/// Resource limits of a plugin instance (`limits = { memory, timeout, fuel }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginLimits {
    /// `memory`: the most linear memory the instance may grow to (default 256 MiB).
    pub memory_bytes: u64,
    /// `timeout`: wall-clock deadline of one call (default 30s).
    pub timeout: Duration,
    /// `fuel`: instructions budget of one call (default: unlimited).
    pub fuel: Option<u64>,
}

impl Default for PluginLimits {
    fn default() -> Self {
        Self {
            memory_bytes: 256 << 20,
            timeout: Duration::from_secs(30),
            fuel: None,
        }
    }
}

/// The `[sink]` table.
#[allow(
    clippy::large_enum_variant,
    reason = "one per pipeline, read once; boxing would only add noise where it is matched"
)]
#[derive(Debug, Clone, PartialEq)]
pub enum SinkSpec {
    /// `kind = "files"`: one file per batch, named by the batch id, under `path`.
    Files {
        /// `path` (resolved).
        path: PathBuf,
        /// `format` (default parquet).
        format: OutputFormat,
    },
    /// `kind = "console"`: print each batch as a table.
    Console {
        /// `max_rows` printed per batch (default 20).
        max_rows: usize,
    },
    /// `kind = "memory"`: keep the output in memory (tests, the REPL).
    Memory,
    /// `kind = "plugin"`: a Wasm foreachBatch sink.
    Plugin(PluginSinkSpec),
    /// `kind = "kafka"`: rows produced to a topic.
    Kafka(KafkaSinkSpec),
    /// `kind = "delta"`: a Delta Lake table, one commit per batch (or per `commit_every`).
    Delta(DeltaSinkSpec),
    /// `kind = "delta-merge"`: each batch upserted into a Delta table by key (MERGE).
    DeltaMerge(MergeTableSpec),
}

/// A `kind = "kafka"` sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSinkSpec {
    /// `bootstrap_servers`.
    pub bootstrap_servers: String,
    /// `topic`: where rows go.
    pub topic: String,
    /// `key`: the column holding the record key (none: no key).
    pub key: Option<String>,
    /// `value`: the column holding the record value (none: the whole row as JSON).
    pub value: Option<String>,
    /// `delivery` (default exactly-once).
    pub delivery: KafkaDelivery,
}

/// `sink.delivery` of a Kafka sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaDelivery {
    /// `"exactly-once"`: one transaction per batch, with a batch marker.
    ExactlyOnce,
    /// `"at-least-once"`: plain produce (brokers without transactions); a replay may duplicate.
    AtLeastOnce,
}

/// A Delta Lake table written by the query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaSinkSpec {
    /// `path` (resolved): the table's folder.
    pub path: PathBuf,
    /// `partition_by`: partition columns of a table the sink creates.
    pub partition_by: Vec<String>,
    /// `target_file_size`: data files are cut when they reach about this many bytes of Parquet.
    pub target_file_size: u64,
    /// `commit_every`: how often the sink commits (default every batch).
    pub commit_every: CommitEvery,
}

/// When the Delta sink commits: after every N batches, or at the first batch at least this
/// long after its last commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitEvery {
    Batches(std::num::NonZeroU64),
    Interval(Duration),
}

/// Default `target_file_size` of the Delta sink (Delta's own default for optimised files).
pub const DEFAULT_DELTA_TARGET_FILE_SIZE: u64 = 128 << 20;

/// The file format of a files sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// `"json"`: JSON lines.
    Json,
    /// `"csv"`, with a header line.
    Csv,
    /// `"parquet"` (default).
    Parquet,
}

/// A `kind = "plugin"` sink.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginSinkSpec {
    /// `name`; by default the plugin's file stem.
    pub name: String,
    /// `plugin`: the `.wasm` component (resolved; it exists).
    pub plugin: PathBuf,
    /// `config`, handed to the plugin as JSON (`{}` when absent).
    pub config: serde_json::Value,
    /// `limits`.
    pub limits: PluginLimits,
    /// `capabilities`: what the sandbox grants beyond nothing.
    pub capabilities: Capabilities,
    /// `sha256`: as [`WasmTransformSpec::sha256`].
    pub sha256: Option<String>,
}

/// What a plugin may reach outside its sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// `dirs`: host folders preopened in the guest.
    pub dirs: Vec<DirGrant>,
    /// `env`: names of the host's environment variables the plugin sees (with the values they
    /// have when the query starts); no others.
    pub env: Vec<String>,
    /// `http`: hosts the plugin may send HTTP requests to (`"host"`: any port, `"host:port"`:
    /// that port); empty: no HTTP.
    pub http: Vec<HttpGrant>,
    /// `delta_merge`: Delta tables the plugin may MERGE into, by the name it calls them.
    pub delta_merge: std::collections::BTreeMap<String, MergeTableSpec>,
}

/// One `{ host, guest, writable }` entry of `capabilities.dirs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirGrant {
    /// `host`: the folder on the host (resolved against the pipeline file's folder).
    pub host: PathBuf,
    /// `guest`: the absolute path the plugin sees, e.g. "/out".
    pub guest: String,
    /// `writable` (default false).
    pub writable: bool,
}

/// One thing wrong with a pipeline file.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// Where: a key path such as `source.orders.schema`, `transform[1].limits.memory`,
    /// `--set KEY` for a bad override, or `line L, column C` for a TOML syntax error.
    pub path: String,
    /// What is wrong and what is allowed instead.
    pub message: String,
}

impl Problem {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in one pipeline file.
#[derive(Debug, thiserror::Error)]
#[error("{}", render(self))]
pub struct SpecErrors {
    /// The file (or the `origin` given to [`parse`]).
    pub origin: String,
    /// The problems, in the order found; never empty.
    pub problems: Vec<Problem>,
}

fn render(errors: &SpecErrors) -> String {
    let mut text = format!("{}: {} problem(s):", errors.origin, errors.problems.len());
    for problem in &errors.problems {
        text.push_str("\n  - ");
        text.push_str(&problem.to_string());
    }
    text
}

/// Reads and validates the pipeline file at `path`, after applying `overrides` ("KEY=VALUE").
///
/// Relative paths in the file resolve against the file's folder.
///
/// # Errors
/// [`SpecErrors`] naming the file: one problem if it cannot be read or is not valid TOML,
/// otherwise every problem found (see [`parse`]).
pub fn load(path: &Path, overrides: &[String]) -> Result<Pipeline, SpecErrors> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|err| SpecErrors {
        origin: origin.clone(),
        problems: vec![Problem::new(
            "",
            format!("cannot read the pipeline file: {err}"),
        )],
    })?;
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    // `absolute` does no I/O; it fails only for an empty path, which `folder` never is.
    let base_dir = std::path::absolute(folder).unwrap_or_else(|_| folder.to_path_buf());
    parse(&text, &base_dir, &origin, overrides)
}

/// Validates pipeline-file text. `base_dir` is the folder relative paths resolve against;
/// `origin` names the text in errors; `overrides` ("KEY=VALUE") are applied before validation.
///
/// # Errors
/// [`SpecErrors`] with every problem found: TOML syntax (one problem, with line and column), bad
/// overrides, unknown keys, wrongly typed values, missing required keys, and semantic problems
/// (bad schema DDL, durations, sizes, enum values, duplicate names, missing plugin files, ...).
pub fn parse(
    text: &str,
    base_dir: &Path,
    origin: &str,
    overrides: &[String],
) -> Result<Pipeline, SpecErrors> {
    let fail = |problems: Vec<Problem>| SpecErrors {
        origin: origin.to_string(),
        problems,
    };
    let mut table: toml::Table = text
        .parse()
        .map_err(|err: toml::de::Error| fail(vec![syntax_problem(text, &err)]))?;
    let mut problems = Vec::new();
    overrides::apply(&mut table, overrides, &mut problems);
    let mut collector = validate::Collector::new(problems);
    let pipeline = raw::read(table, &mut collector)
        .and_then(|raw| validate::pipeline(raw, base_dir, &mut collector));
    let pipeline = pipeline.filter(|_| collector.problems.is_empty());
    if let Some(p) = &pipeline {
        collector.problems.extend(plugin_config_problems(p));
    }
    match pipeline {
        Some(pipeline) if collector.problems.is_empty() => Ok(pipeline),
        _ => {
            let mut problems = collector.problems;
            if problems.is_empty() {
                // Every path that yields no pipeline records a problem; this is a safety net.
                problems.push(Problem::new("", "the pipeline is incomplete"));
            }
            Err(fail(problems))
        }
    }
}

/// Each plugin's `config` checked against the JSON Schema its component carries (its
/// `weir:metadata` section), if it carries one.
fn plugin_config_problems(pipeline: &Pipeline) -> Vec<Problem> {
    let transforms = pipeline.transforms.iter().enumerate().filter_map(|(i, t)| {
        Some((
            format!("transform[{i}]"),
            &t.wasm()?.plugin,
            &t.wasm()?.config,
        ))
    });
    let functions = pipeline
        .functions
        .iter()
        .enumerate()
        .map(|(i, f)| (format!("function[{i}]"), &f.plugin.plugin, &f.plugin.config));
    let listeners = pipeline
        .listeners
        .iter()
        .enumerate()
        .filter_map(|(i, l)| match &l.kind {
            ListenerKind::Plugin(p) => Some((format!("listener[{i}]"), &p.plugin, &p.config)),
            ListenerKind::Webhook { .. } => None,
        });
    let sink = match &pipeline.sink {
        SinkSpec::Plugin(p) => Some(("sink".to_owned(), &p.plugin, &p.config)),
        _ => None,
    };
    let mut problems = Vec::new();
    for (label, path, config) in transforms.chain(functions).chain(listeners).chain(sink) {
        // A file that cannot be read or is not a component fails when the query starts, with
        // the plugin named; here only its schema counts.
        let Ok(bytes) = std::fs::read(path) else {
            continue;
        };
        let Ok(Some(meta)) = crate::plugin::read_metadata(&bytes) else {
            continue;
        };
        let Some(schema) = &meta.config_schema else {
            continue;
        };
        let mut found = Vec::new();
        json_schema::check(schema, config, &format!("{label}.config"), &mut found);
        problems.extend(found.into_iter().map(|(path, message)| {
            Problem::new(path, format!("{message} ({} {})", meta.name, meta.version))
        }));
    }
    problems
}

fn syntax_problem(text: &str, err: &toml::de::Error) -> Problem {
    let message = format!("invalid TOML: {}", err.message().trim_end());
    let Some(span) = err.span() else {
        return Problem::new("", message);
    };
    let offset = span.start.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    Problem::new(format!("line {line}, column {column}"), message)
}

#[cfg(test)]
mod tests;
