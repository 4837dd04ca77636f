//! The keys of a MERGE table, shared by the `delta-merge` sink (`sink.*`) and each table a
//! plugin sink is granted (`sink.capabilities.delta_merge.<name>.*`), so both report the same
//! problems under their own paths.

use std::path::Path;

use super::super::merge::{MergeDedup, MergeTableSpec, Sides, parse_condition, parse_dedup};
use super::super::raw::RawMergeTable;
use super::{Collector, file_size};

/// The table under `label` (`sink` or `sink.capabilities.delta_merge.<name>`).
pub(super) fn table(
    c: &mut Collector,
    label: &str,
    raw: RawMergeTable,
    base: &Path,
) -> Option<MergeTableSpec> {
    let key = |k: &str| format!("{label}.{k}");
    let path = c.path(&key("path"), raw.path, base);
    let keys = match c.required(&key("keys"), raw.keys) {
        None => None,
        Some(keys) if keys.is_empty() => {
            c.push(&key("keys"), "must name at least one column");
            None
        }
        Some(keys) => {
            let mut ok = true;
            for (i, column) in keys.iter().enumerate() {
                if column.trim().is_empty() {
                    ok = false;
                    c.push(&format!("{label}.keys[{i}]"), "must not be empty");
                } else if keys[..i].contains(column) {
                    ok = false;
                    c.push(
                        &format!("{label}.keys[{i}]"),
                        format!("column {column:?} is listed twice"),
                    );
                }
            }
            ok.then_some(keys)
        }
    };
    let mut condition = |name: &str, text: Option<String>, sides| match text {
        None => Some(None),
        Some(text) => match parse_condition(&text, sides) {
            Ok(condition) => Some(Some(condition)),
            Err(err) => {
                c.push(&key(name), err);
                None
            }
        },
    };
    let update = condition("when_matched_update", raw.when_matched_update, Sides::Both);
    let delete = condition("when_matched_delete", raw.when_matched_delete, Sides::Both);
    let insert = condition(
        "when_not_matched_insert",
        raw.when_not_matched_insert,
        Sides::SourceOnly,
    );
    let dedup = match raw.dedup {
        None => Some(MergeDedup::Refuse),
        Some(text) => match parse_dedup(&text) {
            Ok(d) => Some(d),
            Err(err) => {
                c.push(&key("dedup"), err);
                None
            }
        },
    };
    let target_file_size = file_size(c, &key("target_file_size"), raw.target_file_size);
    Some(MergeTableSpec {
        path: path?,
        keys: keys?,
        when_matched_delete: delete?,
        when_matched_update: update?,
        when_not_matched_insert: insert?,
        dedup: dedup?,
        target_file_size: target_file_size?,
    })
}
