//! What a checkpoint was built for. State and offsets only make sense for
//! the query that wrote them: resuming with another grouping key, watermark
//! column, source or state store would silently produce wrong answers, so
//! such a restart is refused, naming what changed. Changes that state does
//! not depend on (filters, new plugin builds, triggers, rate limits) are
//! accepted and logged.
//!
//! What state depends on is the shape of its keys and values, not the whole
//! schema of the rows flowing past: a column added upstream that no key or
//! aggregate reads leaves the state readable, so the fingerprint records
//! each stateful operator's key and value schema and nothing wider.
//! Checkpoints written before that (with the operator's output schema under
//! `stateful_schema`) still resume: their key columns must all appear in the
//! recorded output schema, and the fingerprint is then rewritten.

use serde_json::{Map, Value, json};

use crate::operator::stateful::StateSchema;
use crate::spec::{
    KafkaTopics, KafkaValueFormat, Pipeline, SinkSpec, SourceKind, TableKind, TransformKind,
    Trigger, WatermarkPolicy, WindowKind,
};

/// Parts of the fingerprint a restart may not change.
const FROZEN: &[(&str, &str)] = &[
    ("sources", "the sources (names, kinds, paths, formats)"),
    (
        "stateful",
        "the stateful operator (its keys, window and aggregates)",
    ),
    (
        "state_key",
        "the key schema of the stateful operator's state",
    ),
    (
        "state_value",
        "the value schema of the stateful operator's state",
    ),
    (
        "stateful_plugins",
        "the stateful transforms (plugins that keep keyed state)",
    ),
    (
        "join",
        "the join (its inputs, the table's kind and path, the type, keys and condition)",
    ),
    ("watermark_column", "the watermark column"),
    (
        "source_watermark_columns",
        "the watermark columns of the sources",
    ),
    ("watermark_policy", "the watermark policy"),
    ("state_store", "the state store"),
    ("state_partitions", "the number of state partitions"),
    ("output_mode", "the output mode of a stateful query"),
];

/// Where fingerprints written before key and value schemas were recorded
/// kept the stateful operator's output schema.
const LEGACY_SCHEMA: &str = "stateful_schema";

/// `name type` of each field, the form schemas take in a fingerprint.
fn fields(fields: &[arrow_schema::Field]) -> Vec<String> {
    fields
        .iter()
        .map(|f| format!("{} {}", f.name(), f.data_type()))
        .collect()
}

/// The fingerprint of `pipeline`, whose stateful operator (if any) keeps
/// state of the shape `state`, and whose transforms named `stateful_plugins`
/// keep keyed state (a new build of one is fine; adding, removing or
/// reordering them is not, since their state folders follow that order).
pub fn of(
    pipeline: &Pipeline,
    state: Option<&StateSchema>,
    plugins: &[(String, String)],
    stateful_plugins: &[String],
) -> Value {
    let sources: Vec<Value> = pipeline
        .sources
        .iter()
        .map(|s| match &s.kind {
            SourceKind::Files(f) => json!({
                "name": s.name,
                "kind": "files",
                "path": f.path.display().to_string(),
                "format": format!("{:?}", f.format),
            }),
            // The broker addresses may change (the same cluster has many); the topics and
            // how values are read may not.
            SourceKind::Kafka(k) => json!({
                "name": s.name,
                "kind": "kafka",
                "topics": match &k.topics {
                    KafkaTopics::Subscribe(t) => json!({ "subscribe": t }),
                    KafkaTopics::Pattern(p) => json!({ "subscribe_pattern": p }),
                },
                "format": match &k.value_format {
                    KafkaValueFormat::Raw => "raw",
                    KafkaValueFormat::Json(_) => "json",
                },
            }),
            SourceKind::Delta(d) => json!({
                "name": s.name,
                "kind": "delta",
                "path": d.path.display().to_string(),
            }),
        })
        .collect();
    let rate_limits: Vec<Value> = pipeline
        .sources
        .iter()
        .map(|s| match &s.kind {
            SourceKind::Files(f) => json!({
                "source": s.name,
                "max_files_per_trigger": f.max_files_per_trigger.map(|n| n.get()),
            }),
            SourceKind::Kafka(k) => json!({
                "source": s.name,
                "max_offsets_per_trigger": k.max_offsets_per_trigger.map(|n| n.get()),
            }),
            SourceKind::Delta(d) => json!({
                "source": s.name,
                "max_files_per_trigger": d.max_files_per_trigger.map(|n| n.get()),
            }),
        })
        .collect();
    let stateful = if let Some(a) = &pipeline.aggregate {
        json!({
            "kind": "aggregate",
            "window": a.window.as_ref().map(|w| json!({
                "column": w.column,
                "spec": match w.kind {
                    WindowKind::Tumbling { size } => format!("tumbling {} ms", size.as_millis()),
                    WindowKind::Sliding { size, slide } => format!("sliding {} ms every {} ms", size.as_millis(), slide.as_millis()),
                    WindowKind::Session { gap } => format!("session gap {} ms", gap.as_millis()),
                },
            })),
            "group_by": a.group_by,
            "select": a.select,
        })
    } else if let Some(d) = &pipeline.deduplicate {
        json!({ "kind": "deduplicate", "keys": d.keys, "within_watermark": d.within_watermark })
    } else {
        Value::Null
    };
    let is_stateful = !stateful.is_null() || !stateful_plugins.is_empty() || state.is_some();
    // Each input's own watermark (a stream-stream join); absent without one.
    let source_watermarks: Vec<(&str, &crate::spec::WatermarkSpec)> = pipeline
        .sources
        .iter()
        .filter_map(|s| s.watermark.as_ref().map(|w| (s.name.as_str(), w)))
        .collect();
    let sql: Vec<Value> = pipeline
        .transforms
        .iter()
        .filter_map(|t| match &t.kind {
            TransformKind::Sql { sql } => {
                Some(json!({ "name": t.name, "input": t.input, "sql": sql }))
            }
            TransformKind::Wasm(_) => None,
        })
        .collect();
    // Absent (null) without a join, so that older checkpoints resume unchanged. A new snapshot
    // of the table is not a change of the query.
    let join = pipeline.join.as_ref().map(|j| {
        let table = pipeline
            .tables
            .iter()
            .find(|t| t.name == j.left || t.name == j.right)
            .map(|t| match &t.kind {
                TableKind::Files { path, format, .. } => json!({
                    "name": t.name,
                    "kind": "files",
                    "path": path.display().to_string(),
                    "format": format!("{format:?}"),
                }),
                TableKind::Delta { path } => json!({
                    "name": t.name,
                    "kind": "delta",
                    "path": path.display().to_string(),
                }),
            });
        json!({
            "left": j.left,
            "right": j.right,
            "type": j.kind.name(),
            "on": j.on,
            "condition": j.condition.as_ref().map(ToString::to_string),
            "table": table,
        })
    });
    json!({
        "sources": sources,
        "join": join,
        "rate_limits": rate_limits,
        "trigger": match pipeline.query.trigger {
            Trigger::AvailableNow => "available-now".to_owned(),
            Trigger::Once => "once".to_owned(),
            Trigger::ProcessingTime(d) => format!("every {} ms", d.as_millis()),
            Trigger::Continuous => "continuous".to_owned(),
            Trigger::RealTime(rt) => format!(
                "real-time, durable every {} ms",
                rt.checkpoint_interval.as_millis()
            ),
        },
        "stateful": stateful,
        // Absent (null) without any, so that older checkpoints resume unchanged.
        "stateful_plugins": if stateful_plugins.is_empty() { Value::Null } else { json!(stateful_plugins) },
        "state_key": state.map(|s| json!({ "operator": s.operator, "columns": fields(&s.key) })),
        "state_value": state.map(|s| json!({ "operator": s.operator, "columns": fields(&s.value) })),
        "watermark_column": pipeline.watermark.as_ref().map(|w| w.column.clone()),
        "watermark_delay_ms": pipeline.watermark.as_ref().map(|w| w.delay.as_millis() as u64),
        "source_watermark_columns": if source_watermarks.is_empty() { Value::Null } else {
            json!(source_watermarks.iter().map(|(s, w)| format!("{s}.{}", w.column)).collect::<Vec<_>>())
        },
        "source_watermark_delays_ms": if source_watermarks.is_empty() { Value::Null } else {
            json!(source_watermarks.iter().map(|(s, w)| json!({ "source": s, "delay_ms": w.delay.as_millis() as u64 })).collect::<Vec<_>>())
        },
        "watermark_policy": match pipeline.query.watermark_policy {
            WatermarkPolicy::Min => "min",
            WatermarkPolicy::Max => "max",
        },
        "state_store": if is_stateful {
            Value::from(pipeline.query.state_store.unwrap_or_default().to_string())
        } else {
            Value::Null
        },
        "state_partitions": if is_stateful { Value::from(pipeline.query.state_partitions) } else { Value::Null },
        "output_mode": if is_stateful { Value::from(format!("{:?}", pipeline.query.output_mode).to_lowercase()) } else { Value::Null },
        "sink": match &pipeline.sink {
            SinkSpec::Files { .. } => "files",
            SinkSpec::Console { .. } => "console",
            SinkSpec::Memory => "memory",
            SinkSpec::Plugin(_) => "plugin",
            SinkSpec::Kafka(_) => "kafka",
            SinkSpec::Delta(_) => "delta",
            SinkSpec::DeltaMerge(_) => "delta-merge",
        },
        "plugins": plugins.iter().map(|(name, sha)| json!({"name": name, "sha256": sha})).collect::<Vec<_>>(),
        // Logged when edited, never refused: what reaches state is checked by its schemas.
        "sql_transforms": if sql.is_empty() { Value::Null } else { json!(sql) },
    })
}

/// The state value columns (names) that the recorded fingerprint `old` gives
/// its deduplication, for deduplication to keep the layout its state was
/// written with; `None` when `old` records no deduplication, and no columns
/// when it predates recorded value schemas.
pub fn recorded_dedup_value(old: &Value) -> Option<Vec<String>> {
    let dedup = old
        .get("stateful")
        .and_then(|s| s.get("kind"))
        .and_then(Value::as_str)
        == Some("deduplicate");
    if !dedup {
        return None;
    }
    let columns = old
        .get("state_value")
        .and_then(|v| v.get("columns"))
        .and_then(Value::as_array)
        .map(|columns| {
            columns
                .iter()
                .filter_map(Value::as_str)
                .filter_map(|c| c.split(' ').next())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    Some(columns)
}

/// Outcome of comparing the recorded fingerprint with the current one.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Comparison {
    /// Changes that make the checkpoint unusable, as readable sentences.
    pub refused: Vec<String>,
    /// Changes that are safe, as readable sentences, for the log.
    pub accepted: Vec<String>,
}

/// Compares the fingerprint `old` (recorded in the checkpoint) with `new`.
pub fn compare(old: &Value, new: &Value) -> Comparison {
    let mut out = Comparison::default();
    let (Some(old), Some(new)) = (old.as_object(), new.as_object()) else {
        return out;
    };
    let mut old = old.clone();
    let mut new = new.clone();
    if old.contains_key(LEGACY_SCHEMA) && !old.contains_key("state_key") {
        upgrade(&mut old, &mut new, &mut out);
    }
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let (a, b) = (
            old.get(key).unwrap_or(&Value::Null),
            new.get(key).unwrap_or(&Value::Null),
        );
        if a == b {
            continue;
        }
        let sentence = match column_changes(a, b) {
            Some(columns) => format!("{columns} ({key} was {a}, is now {b})"),
            None => format!("{key} was {a}, is now {b}"),
        };
        match FROZEN.iter().find(|(k, _)| k == key) {
            // A stateless query that becomes stateful (or the reverse) has
            // no state to misread: only refuse when state existed before.
            Some(_) if a.is_null() && key != "sources" => out.accepted.push(sentence),
            Some((_, what)) => out.refused.push(format!("{what} changed: {sentence}")),
            None => out.accepted.push(sentence),
        }
    }
    out
}

/// For two recorded schemas (`{"columns": ["name type", ...]}`), the columns
/// that differ, named: "column amount was Decimal128(12, 2), is now Float64".
fn column_changes(old: &Value, new: &Value) -> Option<String> {
    let columns = |v: &Value| -> Option<Vec<(String, String)>> {
        v.get("columns")?
            .as_array()?
            .iter()
            .map(|c| {
                let (name, t) = c.as_str()?.split_once(' ')?;
                Some((name.to_owned(), t.to_owned()))
            })
            .collect()
    };
    let (old, new) = (columns(old)?, columns(new)?);
    let mut changes = Vec::new();
    for (name, t) in &old {
        match new.iter().find(|(n, _)| n == name) {
            Some((_, u)) if u != t => changes.push(format!("column {name} was {t}, is now {u}")),
            Some(_) => {}
            None => changes.push(format!("column {name} ({t}) is gone")),
        }
    }
    for (name, t) in &new {
        if !old.iter().any(|(n, _)| n == name) {
            changes.push(format!("column {name} ({t}) is new"));
        }
    }
    (!changes.is_empty()).then(|| changes.join("; "))
}

/// Compares what a fingerprint of the older format allows — every state
/// key column must be in its recorded output schema, which holds the
/// window, the group keys or the dedup keys under their names and types —
/// and takes the new key and value schema out of the comparison.
fn upgrade(old: &mut Map<String, Value>, new: &mut Map<String, Value>, out: &mut Comparison) {
    let legacy = old.remove(LEGACY_SCHEMA).unwrap_or(Value::Null);
    let Some(recorded) = legacy.as_array() else {
        // The old query had no state: the usual rules apply.
        return;
    };
    let key = new.remove("state_key").unwrap_or(Value::Null);
    let value = new.remove("state_value").unwrap_or(Value::Null);
    let columns = |v: &Value| -> Vec<Value> {
        v.get("columns")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let missing: Vec<Value> = columns(&key)
        .into_iter()
        .filter(|c| !recorded.contains(c))
        .collect();
    if missing.is_empty() {
        out.accepted.push(format!(
            "the checkpoint's fingerprint predates state key and value schemas: the key \
             columns {} match its recorded schema {legacy}; the value columns {} are recorded \
             from now on",
            Value::from(columns(&key)),
            Value::from(columns(&value)),
        ));
    } else {
        out.refused.push(format!(
            "the key schema of the stateful operator's state changed: the key columns {} are \
             not in the recorded schema {legacy}",
            Value::from(missing),
        ));
    }
}

/// Checks that the checkpoint was written by this query (§3.3): a refused change stops the
/// start, naming what changed; accepted changes are logged and recorded.
///
/// # Errors
/// [`QueryError::Changed`], or the checkpoint's metadata cannot be written.
pub(super) fn check(
    checkpoint: &mut crate::checkpoint::Checkpoint,
    fingerprint: Value,
    query: &str,
) -> Result<(), super::QueryError> {
    match checkpoint.metadata().fingerprint.clone() {
        Some(old) => {
            let diff = compare(&old, &fingerprint);
            if !diff.refused.is_empty() {
                return Err(super::QueryError::Changed {
                    checkpoint: checkpoint.dir().to_path_buf(),
                    changes: diff.refused,
                });
            }
            for change in &diff.accepted {
                tracing::info!(query, "accepted a change of the query: {change}");
            }
            if !diff.accepted.is_empty() {
                checkpoint.set_fingerprint(fingerprint)?;
            }
        }
        None => checkpoint.set_fingerprint(fingerprint)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_changes_are_refused_and_others_accepted() {
        let old = json!({"stateful": {"group_by": ["status"]}, "sink": "files", "plugins": [], "state_store": "rocksdb"});
        let new = json!({"stateful": {"group_by": ["status", "customer_id"]}, "sink": "files", "plugins": [{"name": "f"}], "state_store": "memory"});
        let c = compare(&old, &new);
        assert_eq!(c.refused.len(), 2, "{c:?}");
        assert!(
            c.refused[0].contains(
                "the state store changed: state_store was \"rocksdb\", is now \"memory\""
            ),
            "{c:?}"
        );
        assert!(c.refused[1].contains("the stateful operator"), "{c:?}");
        assert!(c.refused[1].contains("customer_id"), "{c:?}");
        assert_eq!(c.accepted.len(), 1);
        assert!(c.accepted[0].starts_with("plugins was []"));
        assert_eq!(compare(&old, &old), Comparison::default());
    }

    #[test]
    fn only_the_state_key_and_value_schema_are_frozen_not_the_rows_around_them() {
        let old = json!({
            "state_key": {"operator": "dedupe", "columns": ["order_id Int64"]},
            "state_value": {"operator": "dedupe", "columns": []},
        });
        let mut new = old.clone();
        new["input_columns"] = json!(["order_id Int64", "channel Utf8"]);
        let c = compare(&old, &new);
        assert!(c.refused.is_empty(), "{c:?}");
        new["state_key"]["columns"] = json!(["order_id Int64", "occurred_at Timestamp(µs)"]);
        let c = compare(&old, &new);
        assert_eq!(c.refused.len(), 1, "{c:?}");
        assert!(
            c.refused[0].starts_with("the key schema of the stateful operator's state changed"),
            "{c:?}"
        );
        assert!(c.refused[0].contains("occurred_at"), "{c:?}");
    }

    #[test]
    fn an_older_fingerprint_is_upgraded_when_its_schema_holds_the_key() {
        let old = json!({
            "stateful_schema": ["window_start T", "window_end T", "status Utf8", "revenue D"],
            "sink": "memory",
        });
        let new = json!({
            "state_key": {"operator": "stateStoreSave", "columns": ["window_start T", "window_end T", "status Utf8"]},
            "state_value": {"operator": "stateStoreSave", "columns": ["revenue.sum D"]},
            "sink": "memory",
            "trigger": "once",
        });
        let c = compare(&old, &new);
        assert!(c.refused.is_empty(), "{c:?}");
        assert_eq!(c.accepted.len(), 2, "{c:?}");
        assert!(
            c.accepted[0].contains("predates state key and value schemas"),
            "{c:?}"
        );
        assert!(c.accepted[1].starts_with("trigger was null"), "{c:?}");

        let mut other = new.clone();
        other["state_key"]["columns"] =
            json!(["window_start T", "window_end T", "customer_id Int64"]);
        let c = compare(&old, &other);
        assert_eq!(c.refused.len(), 1, "{c:?}");
        assert!(c.refused[0].contains("customer_id Int64"), "{c:?}");
        assert!(c.refused[0].contains("not in the recorded schema"), "{c:?}");

        // A stateless query of the older format becoming stateful: accepted.
        let stateless = json!({"stateful_schema": null, "sink": "memory"});
        let c = compare(&stateless, &new);
        assert!(c.refused.is_empty(), "{c:?}");
    }

    #[test]
    fn the_recorded_value_columns_of_a_deduplication_are_read() {
        let dedup =
            |value: Value| json!({ "stateful": { "kind": "deduplicate" }, "state_value": value });
        // The value schema `[]` (one entry per key), or none recorded at all.
        assert_eq!(
            recorded_dedup_value(&dedup(json!({ "operator": "dedupe", "columns": [] }))),
            Some(vec![])
        );
        assert_eq!(
            recorded_dedup_value(&json!({ "stateful": { "kind": "deduplicate" } })),
            Some(vec![])
        );
        assert_eq!(
            recorded_dedup_value(&dedup(
                json!({ "operator": "dedupe", "columns": ["bucket_members Binary"] })
            )),
            Some(vec!["bucket_members".to_owned()])
        );
        let aggregate =
            json!({ "stateful": { "kind": "aggregate" }, "state_value": { "columns": [] } });
        assert_eq!(recorded_dedup_value(&aggregate), None);
        assert_eq!(recorded_dedup_value(&json!({ "stateful": null })), None);
    }
}
