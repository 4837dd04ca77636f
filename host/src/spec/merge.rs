//! The settings of a Delta MERGE (upsert by key): the `delta-merge` sink and the `delta_merge`
//! capability of a plugin sink share them, so a table is described the same way in both places.
//!
//! The conditions (`when_matched_update`, `when_matched_delete`, `when_not_matched_insert`) are
//! SQL, read when the file is, not when the first batch arrives: a typo in a condition of a query
//! that runs for weeks must stop it before it starts, with the key path and the text.

use std::path::PathBuf;

pub use crate::sql::{RowCondition, Sides};

/// One table that rows are merged into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeTableSpec {
    /// `path` (resolved): the table's folder; created from the first batch's schema if absent.
    pub path: PathBuf,
    /// `keys`: the columns that identify a row (the merge's `t.k = s.k AND ...`).
    pub keys: Vec<String>,
    /// `when_matched_delete`: a matched target row is deleted when this holds (checked before
    /// the update, as Delta checks its `whenMatched` clauses in order); absent: never.
    pub when_matched_delete: Option<RowCondition>,
    /// `when_matched_update`: a matched target row (not deleted) is replaced only when this
    /// holds; absent: always (`whenMatchedUpdateAll()`).
    pub when_matched_update: Option<RowCondition>,
    /// `when_not_matched_insert`: a batch row with a new key is inserted only when this holds
    /// (`s.` columns only); absent: always (`whenNotMatchedInsertAll()`).
    pub when_not_matched_insert: Option<RowCondition>,
    /// `dedup`: what to do with several rows of one batch that share a key.
    pub dedup: MergeDedup,
    /// `target_file_size`: rewritten and new files are cut at about this many bytes.
    pub target_file_size: u64,
}

/// Several rows of one batch with the same key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergeDedup {
    /// Refuse the batch, as Delta's MERGE does (the default).
    Refuse,
    /// `"latest-by:<column>"`: keep the row with the greatest value of the column; of equal
    /// values, the last one in the batch.
    LatestBy(String),
}

/// Reads the condition of a `when_*` key: a SQL condition over `s.` (the batch's row) and, for
/// the matched clauses, `t.` (the table's row with the same key).
///
/// # Errors
/// A sentence saying what is wrong, for the problem of the key that holds `text`.
pub fn parse_condition(text: &str, sides: Sides) -> Result<RowCondition, String> {
    RowCondition::parse(text, sides).map_err(|e| format!("{text:?}: {e}"))
}

/// Parses `dedup`: `"none"` (refuse duplicates) or `"latest-by:<column>"`.
///
/// # Errors
/// A sentence for the problem of the `dedup` key.
pub fn parse_dedup(text: &str) -> Result<MergeDedup, String> {
    if text == "none" {
        return Ok(MergeDedup::Refuse);
    }
    match text.strip_prefix("latest-by:").map(str::trim) {
        Some(column) if !column.is_empty() => Ok(MergeDedup::LatestBy(column.to_owned())),
        _ => Err(format!(
            "{text:?} is not a dedup policy: use \"none\" or \"latest-by:<column>\""
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_are_sql_over_both_rows() {
        let c = parse_condition(
            "s.occurred_at > t.occurred_at AND s.status <> 'void'",
            Sides::Both,
        )
        .unwrap();
        assert_eq!(
            c.to_string(),
            "s.occurred_at > t.occurred_at AND s.status <> 'void'"
        );
        let e = parse_condition("occurred_at > t.occurred_at", Sides::Both).unwrap_err();
        assert!(
            e.starts_with(
                "\"occurred_at > t.occurred_at\": the column occurred_at is not qualified"
            ),
            "{e}"
        );
        let e = parse_condition("t.deleted", Sides::SourceOnly).unwrap_err();
        assert!(e.contains("an inserted row has no table row"), "{e}");
    }

    #[test]
    fn dedup_policies() {
        assert_eq!(parse_dedup("none").unwrap(), MergeDedup::Refuse);
        assert_eq!(
            parse_dedup("latest-by:occurred_at").unwrap(),
            MergeDedup::LatestBy("occurred_at".into())
        );
        assert!(parse_dedup("latest-by:").is_err());
        assert!(
            parse_dedup("first")
                .unwrap_err()
                .contains("latest-by:<column>")
        );
    }
}
