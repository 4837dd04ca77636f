//! The pipeline file as serde sees it, read so that every structural problem is reported.
//!
//! serde stops at the first error, but a user fixing a file wants the whole list. So the TOML tree
//! is deserialised again and again: each error is recorded with its key path, the offending key is
//! removed from the tree, and its path is remembered so that the semantic pass does not report the
//! same key a second time as "missing". Every field is optional here; what is required is decided
//! by `validate.rs`, which knows the kinds and can say what is allowed.
//!
//! A `[[source]]` or `[sink]` is one struct per `kind` (`deny_unknown_fields`), gathered in the
//! enums [`RawSource`] and [`RawSink`]. They are not serde's internally tagged enums: those buffer
//! the table, so serde_path_to_error loses the key path inside it and an unknown key's message
//! loses the list of known keys. Instead [`read`] reads `kind` itself, then deserialises the rest
//! of the table into that kind's struct with the same repair loop, under the table's path; an
//! unknown key is then reported with exactly that kind's keys.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_path_to_error::Segment;
use toml::{Table, Value};

use super::validate::Collector;

/// At most this many structural problems are collected per table read; each one removes a key,
/// so a file would need this many bad keys to reach it.
const MAX_ROUNDS: usize = 200;

/// The values of `source.kind`, in the order messages list them.
pub(super) const SOURCE_KINDS: [&str; 3] = ["files", "kafka", "delta"];

/// The values of `sink.kind`, in the order messages list them.
pub(super) const SINK_KINDS: [&str; 7] = [
    "files",
    "console",
    "plugin",
    "memory",
    "kafka",
    "delta",
    "delta-merge",
];

/// The whole file, with each source and the sink read as the struct of its kind.
#[derive(Debug, Default)]
pub(super) struct RawPipeline {
    pub query: Option<RawQuery>,
    pub source: Option<Vec<RawSource>>,
    pub transform: Option<Vec<RawTransform>>,
    pub function: Option<Vec<RawFunction>>,
    pub listener: Option<Vec<RawListener>>,
    pub table: Option<Vec<RawTable>>,
    pub join: Option<RawJoin>,
    pub watermark: Option<RawWatermark>,
    pub aggregate: Option<RawAggregate>,
    pub deduplicate: Option<RawDeduplicate>,
    pub sink: Option<RawSink>,
}

/// The top level as serde reads it: sources and the sink stay TOML tables, read by kind after.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTop {
    query: Option<RawQuery>,
    source: Option<Vec<Table>>,
    transform: Option<Vec<RawTransform>>,
    function: Option<Vec<RawFunction>>,
    listener: Option<Vec<RawListener>>,
    table: Option<Vec<RawTable>>,
    join: Option<RawJoin>,
    watermark: Option<RawWatermark>,
    aggregate: Option<RawAggregate>,
    deduplicate: Option<RawDeduplicate>,
    sink: Option<Table>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWatermark {
    pub column: Option<String>,
    pub delay: Option<String>,
    pub idle_timeout: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAggregate {
    pub window: Option<RawWindow>,
    pub group_by: Option<Vec<String>>,
    pub select: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWindow {
    pub column: Option<String>,
    pub size: Option<String>,
    pub slide: Option<String>,
    pub gap: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDeduplicate {
    pub keys: Option<Vec<String>>,
    pub within_watermark: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQuery {
    pub name: Option<String>,
    pub checkpoint: Option<String>,
    /// A word or an interval, or the real-time trigger's table (read in `validate`).
    pub trigger: Option<Value>,
    pub output_mode: Option<String>,
    pub max_batch_retries: Option<i64>,
    pub state_store: Option<String>,
    pub state_partitions: Option<i64>,
    pub watermark_policy: Option<String>,
    pub threads: Option<i64>,
}

/// One `[[source]]` table, read as the struct of its `kind`.
#[derive(Debug)]
pub(super) enum RawSource {
    Files(RawFilesSource),
    Kafka(RawKafkaSource),
    Delta(RawDeltaSource),
    /// No `kind` (or not a string): read as a files source, so that its missing keys are named
    /// in the same report.
    NoKind(RawFilesSource),
    /// A `kind` that is no source kind; its other keys belong to nothing and are not read.
    UnknownKind {
        name: Option<String>,
        kind: String,
    },
}

impl RawSource {
    /// Takes the source's own `watermark`, whatever the kind.
    pub fn take_watermark(&mut self) -> Option<RawWatermark> {
        match self {
            Self::Files(s) | Self::NoKind(s) => s.watermark.take(),
            Self::Kafka(s) => s.watermark.take(),
            Self::Delta(s) => s.watermark.take(),
            Self::UnknownKind { .. } => None,
        }
    }

    /// `name`, whatever the kind.
    pub fn name(&self) -> Option<&str> {
        match self {
            Self::Files(s) | Self::NoKind(s) => s.name.as_deref(),
            Self::Kafka(s) => s.name.as_deref(),
            Self::Delta(s) => s.name.as_deref(),
            Self::UnknownKind { name, .. } => name.as_deref(),
        }
    }
}

/// `kind = "files"` (`kind` itself is read by [`read`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFilesSource {
    pub name: Option<String>,
    pub path: Option<String>,
    pub format: Option<String>,
    pub schema: Option<String>,
    pub max_files_per_trigger: Option<i64>,
    pub on_malformed: Option<String>,
    pub dead_letter_path: Option<String>,
    pub csv: Option<RawCsv>,
    /// `watermark = { column, delay }`: this input's own event time (a stream-stream join).
    pub watermark: Option<RawWatermark>,
}

/// `kind = "kafka"`: Spark's Kafka source options, snake_cased.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKafkaSource {
    pub name: Option<String>,
    pub bootstrap_servers: Option<String>,
    pub subscribe: Option<Vec<String>>,
    pub subscribe_pattern: Option<String>,
    pub starting_offsets: Option<String>,
    pub max_offsets_per_trigger: Option<i64>,
    pub fail_on_data_loss: Option<bool>,
    pub format: Option<String>,
    pub schema: Option<String>,
    pub on_malformed: Option<String>,
    pub dead_letter_path: Option<String>,
    /// `watermark = { column, delay }`: this input's own event time (a stream-stream join).
    pub watermark: Option<RawWatermark>,
}

/// `kind = "delta"`: the schema is the table's.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDeltaSource {
    pub name: Option<String>,
    pub path: Option<String>,
    pub max_files_per_trigger: Option<i64>,
    pub starting_version: Option<i64>,
    /// `watermark = { column, delay }`: this input's own event time (a stream-stream join).
    pub watermark: Option<RawWatermark>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCsv {
    pub header: Option<bool>,
    pub delimiter: Option<String>,
}

/// One `[[table]]`: a static input of a stream-static join. One struct for both kinds; the keys
/// that do not apply to a kind are reported by validation.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTable {
    pub name: Option<String>,
    pub kind: Option<String>,
    pub path: Option<String>,
    pub format: Option<String>,
    pub schema: Option<String>,
    pub csv: Option<RawCsv>,
    pub max_size: Option<Value>,
}

/// `[join]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJoin {
    pub left: Option<String>,
    pub right: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub on: Option<Vec<String>>,
    pub condition: Option<String>,
}

/// One `[[function]]`: a scalar function of a plugin (world `scalar-function`) that SQL calls.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFunction {
    pub name: Option<String>,
    pub plugin: Option<String>,
    pub arguments: Option<Vec<String>>,
    pub returns: Option<String>,
    pub config: Option<Table>,
    pub limits: Option<RawLimits>,
    pub sha256: Option<String>,
    pub capabilities: Option<RawCapabilities>,
}

/// One `[[listener]]`: a plugin of world `listener`, or a webhook URL.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListener {
    pub name: Option<String>,
    pub plugin: Option<String>,
    pub url: Option<String>,
    pub config: Option<Table>,
    pub limits: Option<RawLimits>,
    pub sha256: Option<String>,
    pub capabilities: Option<RawCapabilities>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTransform {
    pub name: Option<String>,
    pub input: Option<String>,
    pub plugin: Option<String>,
    pub sql: Option<String>,
    pub config: Option<Table>,
    pub limits: Option<RawLimits>,
    pub sha256: Option<String>,
    pub capabilities: Option<RawCapabilities>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    /// A string such as "64 MiB" or an integer number of bytes.
    pub memory: Option<Value>,
    pub timeout: Option<String>,
    pub fuel: Option<i64>,
}

/// The `[sink]` table, read as the struct of its `kind`.
#[derive(Debug)]
pub(super) enum RawSink {
    Files(RawFilesSink),
    Console(RawConsoleSink),
    Memory(RawMemorySink),
    Plugin(RawPluginSink),
    Kafka(RawKafkaSink),
    Delta(RawDeltaSink),
    DeltaMerge(RawMergeTable),
    /// No `kind` (or not a string): nothing else is read.
    NoKind,
    /// A `kind` that is no sink kind; its other keys are not read.
    UnknownKind(String),
}

/// `kind = "files"`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFilesSink {
    pub path: Option<String>,
    pub format: Option<String>,
}

/// `kind = "console"`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConsoleSink {
    pub max_rows: Option<i64>,
}

/// `kind = "memory"`: no keys besides `kind`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMemorySink {}

/// `kind = "plugin"`: a Wasm foreachBatch sink.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPluginSink {
    pub name: Option<String>,
    pub plugin: Option<String>,
    pub config: Option<Table>,
    pub limits: Option<RawLimits>,
    pub capabilities: Option<RawCapabilities>,
    pub sha256: Option<String>,
}

/// `kind = "kafka"`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKafkaSink {
    pub bootstrap_servers: Option<String>,
    pub topic: Option<String>,
    pub key: Option<String>,
    pub value: Option<String>,
    pub delivery: Option<String>,
}

/// `kind = "delta"`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDeltaSink {
    pub path: Option<String>,
    pub partition_by: Option<Vec<String>>,
    /// A string such as "128 MiB" or an integer number of bytes.
    pub target_file_size: Option<Value>,
    /// An integer (batches) or a duration string ("30s").
    pub commit_every: Option<Value>,
}

/// One table of a `kind = "delta-merge"` sink or of `capabilities.delta_merge`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMergeTable {
    pub path: Option<String>,
    pub keys: Option<Vec<String>>,
    pub when_matched_update: Option<String>,
    pub when_matched_delete: Option<String>,
    pub when_not_matched_insert: Option<String>,
    pub dedup: Option<String>,
    pub target_file_size: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCapabilities {
    pub dirs: Option<Vec<RawDirGrant>>,
    /// Names of host environment variables the plugin may read.
    pub env: Option<Vec<String>>,
    /// Hosts (`host` or `host:port`) the plugin may send HTTP requests to.
    pub http: Option<Vec<String>>,
    /// Tables the plugin may MERGE into, by the name it calls them.
    pub delta_merge: Option<std::collections::BTreeMap<String, RawMergeTable>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDirGrant {
    pub host: Option<String>,
    pub guest: Option<String>,
    pub writable: Option<bool>,
}

/// The label of `[[source]]` number `index` in problem paths: `source.<name>` when it has a
/// name, else `source[<index>]`. `validate.rs` uses the same rule so that paths agree.
pub(super) fn source_label(index: usize, name: Option<&str>) -> String {
    match name {
        Some(name) if !name.is_empty() => format!("source.{name}"),
        _ => format!("source[{index}]"),
    }
}

/// One structural problem, with the rank of the top-level key it is under: problems are
/// reported in the order of the file's keys, as one pass of serde over the whole tree would.
struct Found {
    rank: usize,
    path: String,
    message: String,
}

/// Where a table is read: its key path (empty for the top level), its rank, and, for the table
/// of a source or sink, what its kind is called in messages.
struct Place<'a> {
    label: &'a str,
    rank: usize,
    kind: Option<Kind<'a>>,
}

/// The kind of a source or sink table, for its unknown keys' message.
#[derive(Clone, Copy)]
struct Kind<'a> {
    /// The kind's name ("files"); `None` when the table has no `kind`.
    name: Option<&'a str>,
    /// "source" or "sink".
    table: &'a str,
    /// Appended to the list of known keys.
    hint: &'a str,
    /// Every kind of this table, with whether its struct takes a key.
    kinds: &'a [(&'a str, Takes)],
}

/// Whether a kind's struct has a key of this name.
type Takes = fn(&str) -> bool;

/// Whether `T` has a field `key`: a table of that one key is read without "unknown field".
fn takes<T: DeserializeOwned>(key: &str) -> bool {
    let mut table = Table::new();
    table.insert(key.to_owned(), Value::Boolean(false));
    match T::deserialize(Value::Table(table)) {
        Ok(_) => true,
        Err(err) => !err.message().starts_with("unknown field"),
    }
}

static SOURCE_STRUCTS: [(&str, Takes); 3] = [
    ("files", takes::<RawFilesSource>),
    ("kafka", takes::<RawKafkaSource>),
    ("delta", takes::<RawDeltaSource>),
];

static SINK_STRUCTS: [(&str, Takes); 7] = [
    ("files", takes::<RawFilesSink>),
    ("console", takes::<RawConsoleSink>),
    ("plugin", takes::<RawPluginSink>),
    ("memory", takes::<RawMemorySink>),
    ("kafka", takes::<RawKafkaSink>),
    ("delta", takes::<RawDeltaSink>),
    ("delta-merge", takes::<RawMergeTable>),
];

/// Deserialises `table`, recording every structural problem in `collector`.
/// `None` if the tree could not be repaired (the problems say why).
pub(super) fn read(table: Table, collector: &mut Collector) -> Option<RawPipeline> {
    let ranks: Vec<String> = table.keys().cloned().collect();
    let rank_of = |key: &str| ranks.iter().position(|k| k == key).unwrap_or(ranks.len());
    let mut found = Vec::new();
    let top = repaired::<RawTop>(
        Value::Table(table),
        &Place {
            label: "",
            rank: 0,
            kind: None,
        },
        &rank_of,
        &mut found,
    );
    let raw = top.and_then(|top| {
        let sources = match top.source {
            None => None,
            Some(tables) => Some(
                tables
                    .into_iter()
                    .enumerate()
                    .map(|(i, t)| read_source(i, t, rank_of("source"), &mut found))
                    .collect::<Option<Vec<_>>>()?,
            ),
        };
        let sink = match top.sink {
            None => None,
            Some(t) => Some(read_sink(t, rank_of("sink"), &mut found)?),
        };
        Some(RawPipeline {
            query: top.query,
            source: sources,
            transform: top.transform,
            function: top.function,
            listener: top.listener,
            table: top.table,
            join: top.join,
            watermark: top.watermark,
            aggregate: top.aggregate,
            deduplicate: top.deduplicate,
            sink,
        })
    });
    // Stable: within one top-level key, problems stay in the order serde met them.
    found.sort_by_key(|f| f.rank);
    for f in found {
        collector.push(&f.path, f.message);
        collector.suppress(f.path);
    }
    raw
}

/// `[[source]]` number `index`, read as the struct of its `kind`.
fn read_source(
    index: usize,
    mut table: Table,
    rank: usize,
    found: &mut Vec<Found>,
) -> Option<RawSource> {
    let name = table.get("name").and_then(Value::as_str).map(str::to_owned);
    let label = source_label(index, name.as_deref());
    let kind = take_kind(&mut table, &label, rank, found);
    let tree = Value::Table(table);
    let place = |name: Option<&'static str>, hint: &'static str| Place {
        label: &label,
        rank,
        kind: Some(Kind {
            name,
            table: "source",
            hint,
            kinds: &SOURCE_STRUCTS,
        }),
    };
    let none = |_: &str| 0;
    Some(match kind.as_deref() {
        None => RawSource::NoKind(repaired(tree, &place(None, ""), &none, found)?),
        Some("files") => RawSource::Files(repaired(tree, &place(Some("files"), ""), &none, found)?),
        Some("kafka") => RawSource::Kafka(repaired(tree, &place(Some("kafka"), ""), &none, found)?),
        Some("delta") => RawSource::Delta(repaired(
            tree,
            &place(Some("delta"), "; the schema is the table's"),
            &none,
            found,
        )?),
        Some(_) => RawSource::UnknownKind {
            name,
            kind: kind.unwrap_or_default(),
        },
    })
}

/// The `[sink]` table, read as the struct of its `kind`.
fn read_sink(mut table: Table, rank: usize, found: &mut Vec<Found>) -> Option<RawSink> {
    let kind = take_kind(&mut table, "sink", rank, found);
    let tree = Value::Table(table);
    let place = |name: &'static str| Place {
        label: "sink",
        rank,
        kind: Some(Kind {
            name: Some(name),
            table: "sink",
            hint: "",
            kinds: &SINK_STRUCTS,
        }),
    };
    let none = |_: &str| 0;
    Some(match kind.as_deref() {
        None => RawSink::NoKind,
        Some("files") => RawSink::Files(repaired(tree, &place("files"), &none, found)?),
        Some("console") => RawSink::Console(repaired(tree, &place("console"), &none, found)?),
        Some("memory") => RawSink::Memory(repaired(tree, &place("memory"), &none, found)?),
        Some("plugin") => RawSink::Plugin(repaired(tree, &place("plugin"), &none, found)?),
        Some("kafka") => RawSink::Kafka(repaired(tree, &place("kafka"), &none, found)?),
        Some("delta") => RawSink::Delta(repaired(tree, &place("delta"), &none, found)?),
        Some("delta-merge") => {
            RawSink::DeltaMerge(repaired(tree, &place("delta-merge"), &none, found)?)
        }
        Some(_) => RawSink::UnknownKind(kind.unwrap_or_default()),
    })
}

/// Removes `kind` from a source or sink table: its value if it is a string, else `None` (a
/// wrongly typed kind is recorded as a problem).
fn take_kind(
    table: &mut Table,
    label: &str,
    rank: usize,
    found: &mut Vec<Found>,
) -> Option<String> {
    match table.remove("kind")? {
        Value::String(kind) => Some(kind),
        other => {
            let message = match String::deserialize(other) {
                Err(err) => describe(err.message(), &[], None),
                Ok(_) => "expected a string".to_owned(),
            };
            found.push(Found {
                rank,
                path: format!("{label}.kind"),
                message,
            });
            None
        }
    }
}

/// Deserialises `tree` as a `T`, again and again: each error is recorded under `place` and the
/// offending key removed. `None` if the tree could not be repaired.
fn repaired<T: DeserializeOwned>(
    mut tree: Value,
    place: &Place<'_>,
    rank: &dyn Fn(&str) -> usize,
    found: &mut Vec<Found>,
) -> Option<T> {
    for _ in 0..MAX_ROUNDS {
        let err = match serde_path_to_error::deserialize::<_, T>(tree.clone()) {
            Ok(raw) => return Some(raw),
            Err(err) => err,
        };
        let segments: Vec<Segment> = err.path().iter().cloned().collect();
        let inner = display_path(&tree, &segments, place.label.is_empty());
        let path = match (place.label, inner.is_empty()) {
            ("", _) => inner,
            (label, true) => label.to_owned(),
            (label, false) => format!("{label}.{inner}"),
        };
        let rank = match (place.label, segments.first()) {
            ("", Some(Segment::Map { key })) => rank(key),
            _ => place.rank,
        };
        found.push(Found {
            rank,
            path,
            message: describe(err.inner().message(), &segments, place.kind),
        });
        if !remove(&mut tree, &segments) {
            return None;
        }
    }
    found.push(Found {
        rank: usize::MAX,
        path: String::new(),
        message: format!("too many problems: stopped after {MAX_ROUNDS}"),
    });
    None
}

/// Renders a serde path the way users address keys: `query.trigger`, `source.orders.csv.header`,
/// `transform[1].limits.memory`. At the top level (`top`), a source is named by its name.
fn display_path(tree: &Value, segments: &[Segment], top: bool) -> String {
    let mut out = String::new();
    let mut node = Some(tree);
    let mut parent_key: Option<&str> = None;
    for segment in segments {
        match segment {
            Segment::Map { key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
                node = node.and_then(|n| n.get(key.as_str()));
                parent_key = Some(key);
            }
            Segment::Seq { index } => {
                let element = node.and_then(|n| n.get(*index));
                if top && parent_key == Some("source") && out == "source" {
                    let name = element.and_then(|e| e.get("name")).and_then(Value::as_str);
                    out = source_label(*index, name);
                } else {
                    out.push_str(&format!("[{index}]"));
                }
                node = element;
                parent_key = None;
            }
            Segment::Enum { .. } | Segment::Unknown => node = None,
        }
    }
    out
}

/// Turns serde's message into one that speaks TOML. An unknown key directly in a source's or
/// sink's table (`kind` given) is named with its kind and that kind's keys, `kind` first.
fn describe(message: &str, segments: &[Segment], kind: Option<Kind<'_>>) -> String {
    if let Some(rest) = message.strip_prefix("unknown field `") {
        // "x`, expected one of `a`, `b`" / "x`, expected `a` or `b`" / "x`, there are no fields"
        let mut known: Vec<&str> = rest
            .split_once("`, expected ")
            .map(|(_, list)| list.split('`').skip(1).step_by(2).collect())
            .unwrap_or_default();
        let kind = kind.filter(|_| segments.len() == 1);
        if let Some(kind) = kind {
            known.insert(0, "kind");
            let of = kind
                .name
                .map(|name| format!(" of a {name} {}", kind.table))
                .unwrap_or_default();
            let key = rest.split('`').next().unwrap_or_default();
            let others: Vec<&str> = kind
                .kinds
                .iter()
                .filter(|(name, takes)| Some(*name) != kind.name && takes(key))
                .map(|(name, _)| *name)
                .collect();
            let elsewhere = match others.split_last() {
                None => String::new(),
                Some((last, [])) => format!("; it is a key of {last} {}s", kind.table),
                Some((last, rest)) => {
                    format!(
                        "; it is a key of {} and {last} {}s",
                        rest.join(", "),
                        kind.table
                    )
                }
            };
            return format!(
                "unknown key{of} (known keys: {}{}){elsewhere}",
                known.join(", "),
                kind.hint
            );
        }
        if known.is_empty() {
            return "unknown key (this table takes no keys)".to_string();
        }
        return format!("unknown key (known keys: {})", known.join(", "));
    }
    if let [Segment::Map { key }] = segments
        && (key == "source" || key == "transform")
        && message.contains("expected a sequence")
    {
        return format!("expected an array of tables: write [[{key}]] for each {key}");
    }
    message
        .replace("expected i64", "expected an integer")
        .replace("expected a map", "expected a table")
        .replace("expected a sequence", "expected an array")
        .replace("invalid type: map", "invalid type: table")
        .replace("invalid type: sequence", "invalid type: array")
}

/// Removes the node at `segments` (an array element is replaced by an empty table, so that the
/// indices of the others stay). False if there is nothing to remove.
fn remove(tree: &mut Value, segments: &[Segment]) -> bool {
    let Some((last, parents)) = segments.split_last() else {
        return false;
    };
    let mut node = tree;
    for segment in parents {
        let next = match segment {
            Segment::Map { key } => node.get_mut(key.as_str()),
            Segment::Seq { index } => node.get_mut(*index),
            Segment::Enum { .. } | Segment::Unknown => None,
        };
        match next {
            Some(next) => node = next,
            None => return false,
        }
    }
    match (last, node) {
        (Segment::Map { key }, Value::Table(table)) => table.remove(key).is_some(),
        (Segment::Seq { index }, Value::Array(items)) => match items.get_mut(*index) {
            Some(Value::Table(table)) if table.is_empty() => false,
            Some(item) => {
                *item = Value::Table(Table::new());
                true
            }
            None => false,
        },
        _ => false,
    }
}
