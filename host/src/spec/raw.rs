//! The pipeline file as serde sees it, read so that every structural problem is reported.
//!
//! serde stops at the first error, but a user fixing a file wants the whole list. So the TOML tree
//! is deserialised again and again: each error is recorded with its key path, the offending key is
//! removed from the tree, and its path is remembered so that the semantic pass does not report the
//! same key a second time as "missing". Every field is optional here; what is required is decided
//! by `validate.rs`, which knows the kinds and can say what is allowed.

use serde::Deserialize;
use serde_path_to_error::Segment;
use toml::{Table, Value};

use super::validate::Collector;

/// At most this many structural problems are collected; each one removes a key, so a file would
/// need this many bad keys to reach it.
const MAX_ROUNDS: usize = 200;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPipeline {
    pub query: Option<RawQuery>,
    pub source: Option<Vec<RawSource>>,
    pub transform: Option<Vec<RawTransform>>,
    pub watermark: Option<RawWatermark>,
    pub aggregate: Option<RawAggregate>,
    pub deduplicate: Option<RawDeduplicate>,
    pub sink: Option<RawSink>,
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
    pub trigger: Option<String>,
    pub output_mode: Option<String>,
    pub max_batch_retries: Option<i64>,
    pub state_store: Option<String>,
    pub state_partitions: Option<i64>,
    pub watermark_policy: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSource {
    pub name: Option<String>,
    pub kind: Option<String>,
    pub path: Option<String>,
    pub format: Option<String>,
    pub schema: Option<String>,
    pub max_files_per_trigger: Option<i64>,
    pub on_malformed: Option<String>,
    pub dead_letter_path: Option<String>,
    pub csv: Option<RawCsv>,
    // kind = "kafka"
    pub bootstrap_servers: Option<String>,
    pub subscribe: Option<Vec<String>>,
    pub subscribe_pattern: Option<String>,
    pub starting_offsets: Option<String>,
    pub max_offsets_per_trigger: Option<i64>,
    pub fail_on_data_loss: Option<bool>,
    pub starting_version: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCsv {
    pub header: Option<bool>,
    pub delimiter: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTransform {
    pub name: Option<String>,
    pub plugin: Option<String>,
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

/// All keys of every sink kind; `validate.rs` refuses the ones a kind does not take.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSink {
    pub kind: Option<String>,
    pub path: Option<String>,
    pub format: Option<String>,
    pub max_rows: Option<i64>,
    pub name: Option<String>,
    pub plugin: Option<String>,
    pub config: Option<Table>,
    pub limits: Option<RawLimits>,
    pub capabilities: Option<RawCapabilities>,
    pub sha256: Option<String>,
    // kind = "kafka"
    pub bootstrap_servers: Option<String>,
    pub topic: Option<String>,
    pub key: Option<String>,
    pub value: Option<String>,
    pub delivery: Option<String>,
    pub partition_by: Option<Vec<String>>,
    /// A string such as "128 MiB" or an integer number of bytes.
    pub target_file_size: Option<Value>,
    /// An integer (batches) or a duration string ("30s").
    pub commit_every: Option<Value>,
    // kind = "delta-merge"
    pub keys: Option<Vec<String>>,
    pub when_matched_update: Option<String>,
    pub dedup: Option<String>,
}

/// One table of a `delta-merge` sink or of `capabilities.delta_merge`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMergeTable {
    pub path: Option<String>,
    pub keys: Option<Vec<String>>,
    pub when_matched_update: Option<String>,
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

/// Deserialises `table`, recording every structural problem in `collector`.
/// `None` if the tree could not be repaired (the problems say why).
pub(super) fn read(table: Table, collector: &mut Collector) -> Option<RawPipeline> {
    let mut tree = Value::Table(table);
    for _ in 0..MAX_ROUNDS {
        let err = match serde_path_to_error::deserialize::<_, RawPipeline>(tree.clone()) {
            Ok(raw) => return Some(raw),
            Err(err) => err,
        };
        let segments: Vec<Segment> = err.path().iter().cloned().collect();
        let path = display_path(&tree, &segments);
        collector.push(&path, describe(err.inner().message(), &segments));
        collector.suppress(path);
        if !remove(&mut tree, &segments) {
            return None;
        }
    }
    collector.push("", format!("too many problems: stopped after {MAX_ROUNDS}"));
    None
}

/// Renders a serde path the way users address keys: `query.trigger`, `source.orders.csv.header`,
/// `transform[1].limits.memory`.
fn display_path(tree: &Value, segments: &[Segment]) -> String {
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
                if parent_key == Some("source") && out == "source" {
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

/// Turns serde's message into one that speaks TOML.
fn describe(message: &str, segments: &[Segment]) -> String {
    if let Some(rest) = message.strip_prefix("unknown field `") {
        if rest.contains("there are no fields") {
            return "unknown key (this table takes no keys)".to_string();
        }
        // "x`, expected one of `a`, `b`" / "x`, expected `a` or `b`"
        let known: Vec<&str> = rest
            .split_once("`, expected ")
            .map(|(_, list)| list.split('`').skip(1).step_by(2).collect())
            .unwrap_or_default();
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
