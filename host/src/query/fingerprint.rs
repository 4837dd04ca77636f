//! What a checkpoint was built for. State and offsets only make sense for
//! the query that wrote them: resuming with another grouping key, watermark
//! column, source or state store would silently produce wrong answers, so
//! such a restart is refused, naming what changed. Changes that state does
//! not depend on (filters, new plugin builds, triggers, rate limits) are
//! accepted and logged.

use serde_json::{Value, json};

use crate::spec::{Pipeline, SinkSpec, SourceKind, StateStoreKind, WatermarkPolicy, WindowKind};

/// Parts of the fingerprint a restart may not change.
const FROZEN: &[(&str, &str)] = &[
    ("sources", "the sources (names, kinds, paths, formats)"),
    (
        "stateful",
        "the stateful operator (its keys, window and aggregates)",
    ),
    (
        "stateful_schema",
        "the schema of the stateful operator's state",
    ),
    ("watermark_column", "the watermark column"),
    ("watermark_policy", "the watermark policy"),
    ("state_store", "the state store"),
    ("state_partitions", "the number of state partitions"),
    ("output_mode", "the output mode of a stateful query"),
];

/// The fingerprint of `pipeline`; `stateful_schema` describes the stateful
/// operator's output (key and value columns with their types), if any.
pub fn of(
    pipeline: &Pipeline,
    stateful_schema: Option<&arrow_schema::Schema>,
    plugins: &[(String, String)],
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
            SourceKind::Delta(d) => json!({
                "name": s.name,
                "kind": "delta",
                "path": d.path.display().to_string(),
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
    let is_stateful = !stateful.is_null();
    json!({
        "sources": sources,
        "stateful": stateful,
        "stateful_schema": stateful_schema.map(|s| s
            .fields()
            .iter()
            .map(|f| format!("{} {}", f.name(), f.data_type()))
            .collect::<Vec<_>>()),
        "watermark_column": pipeline.watermark.as_ref().map(|w| w.column.clone()),
        "watermark_delay_ms": pipeline.watermark.as_ref().map(|w| w.delay.as_millis() as u64),
        "watermark_policy": match pipeline.query.watermark_policy {
            WatermarkPolicy::Min => "min",
            WatermarkPolicy::Max => "max",
        },
        "state_store": if is_stateful {
            Value::from(match pipeline.query.state_store {
                StateStoreKind::RocksDb => "rocksdb",
                StateStoreKind::Memory => "memory",
            })
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
            SinkSpec::Delta(_) => "delta",
        },
        "plugins": plugins.iter().map(|(name, sha)| json!({"name": name, "sha256": sha})).collect::<Vec<_>>(),
    })
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
        let sentence = format!("{key} was {a}, is now {b}");
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
}
