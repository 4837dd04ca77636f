//! The keys of a MERGE table, shared by the `delta-merge` sink (`sink.*`) and each table a
//! plugin sink is granted (`sink.capabilities.delta_merge.<name>.*`), so both report the same
//! problems under their own paths.

use std::path::Path;

use super::super::merge::{MergeDedup, MergeTableSpec, parse_condition, parse_dedup};
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
    let condition = match raw.when_matched_update {
        None => Some(None),
        Some(text) => match parse_condition(&text) {
            Ok(condition) => Some(Some(condition)),
            Err(err) => {
                c.push(&key("when_matched_update"), err);
                None
            }
        },
    };
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
        when_matched_update: condition?,
        dedup: dedup?,
        target_file_size: target_file_size?,
    })
}
