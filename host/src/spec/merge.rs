//! The settings of a Delta MERGE (upsert by key): the `delta-merge` sink and the `delta_merge`
//! capability of a plugin sink share them, so a table is described the same way in both places.
//!
//! The condition of `when_matched_update` is parsed here, when the file is read, not when the
//! first batch arrives: a typo in a condition of a query that runs for weeks must stop it before
//! it starts, with the key path and the text.

use std::fmt;
use std::path::PathBuf;

/// One table that rows are merged into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeTableSpec {
    /// `path` (resolved): the table's folder; created from the first batch's schema if absent.
    pub path: PathBuf,
    /// `keys`: the columns that identify a row (the merge's `t.k = s.k AND ...`).
    pub keys: Vec<String>,
    /// `when_matched_update`: a matched target row is replaced only when this holds; absent:
    /// always (`whenMatchedUpdateAll()`).
    pub when_matched_update: Option<MergeCondition>,
    /// `dedup`: what to do with several rows of one batch that share a key.
    pub dedup: MergeDedup,
    /// `target_file_size`: rewritten and new files are cut at about this many bytes.
    pub target_file_size: u64,
}

/// `s.<column> <op> t.<column>`: a source column compared with a target column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeCondition {
    /// The source (batch) column.
    pub source: String,
    pub op: CompareOp,
    /// The target (table) column.
    pub target: String,
}

/// The comparison of a [`MergeCondition`], read as `source <op> target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
    Ne,
}

impl CompareOp {
    fn symbol(self) -> &'static str {
        match self {
            Self::Gt => ">",
            Self::Ge => ">=",
            Self::Lt => "<",
            Self::Le => "<=",
            Self::Eq => "=",
            Self::Ne => "!=",
        }
    }

    /// The same comparison with its sides swapped (`a < b` is `b > a`).
    fn flipped(self) -> Self {
        match self {
            Self::Gt => Self::Lt,
            Self::Ge => Self::Le,
            Self::Lt => Self::Gt,
            Self::Le => Self::Ge,
            Self::Eq | Self::Ne => self,
        }
    }
}

impl fmt::Display for MergeCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "s.{} {} t.{}",
            self.source,
            self.op.symbol(),
            self.target
        )
    }
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

/// Parses `s.<column> <op> t.<column>` (either side first; `==` and `<>` are also accepted).
///
/// # Errors
/// A sentence saying what is wrong, for the problem of the key that holds `text`.
pub fn parse_condition(text: &str) -> Result<MergeCondition, String> {
    const FORM: &str = "expected a comparison of a source and a target column such as \
                        \"s.occurred_at > t.occurred_at\" (operators: > >= < <= = !=)";
    // Longest operators first, so that ">=" is not read as ">".
    const OPS: [(&str, CompareOp); 8] = [
        (">=", CompareOp::Ge),
        ("<=", CompareOp::Le),
        ("!=", CompareOp::Ne),
        ("<>", CompareOp::Ne),
        ("==", CompareOp::Eq),
        (">", CompareOp::Gt),
        ("<", CompareOp::Lt),
        ("=", CompareOp::Eq),
    ];
    let Some((at, symbol, op)) = OPS
        .iter()
        .filter_map(|(s, op)| text.find(s).map(|at| (at, *s, *op)))
        .min_by_key(|(at, s, _)| (*at, usize::MAX - s.len()))
    else {
        return Err(format!("{text:?}: no comparison operator; {FORM}"));
    };
    let left = text[..at].trim();
    let right = text[at + symbol.len()..].trim();
    let side = |operand: &str| -> Result<(char, String), String> {
        let (alias, column) = operand.split_once('.').ok_or_else(|| {
            format!("{text:?}: {operand:?} is not s.<column> or t.<column>; {FORM}")
        })?;
        let alias = match alias.trim() {
            "s" => 's',
            "t" => 't',
            other => {
                return Err(format!(
                    "{text:?}: {other:?} is neither s (the batch) nor t (the table); {FORM}"
                ));
            }
        };
        let column = column.trim();
        let plain = !column.is_empty()
            && column
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !plain {
            return Err(format!("{text:?}: {column:?} is not a column name; {FORM}"));
        }
        Ok((alias, column.to_owned()))
    };
    let (l_alias, l_column) = side(left)?;
    let (r_alias, r_column) = side(right)?;
    match (l_alias, r_alias) {
        ('s', 't') => Ok(MergeCondition {
            source: l_column,
            op,
            target: r_column,
        }),
        ('t', 's') => Ok(MergeCondition {
            source: r_column,
            op: op.flipped(),
            target: l_column,
        }),
        _ => Err(format!(
            "{text:?}: compares two columns of the same side; compare a source column (s.) \
             with a target column (t.)"
        )),
    }
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
    fn conditions_of_either_order_are_read_as_source_op_target() {
        let c = parse_condition("s.occurred_at > t.occurred_at").unwrap();
        assert_eq!(
            c,
            MergeCondition {
                source: "occurred_at".into(),
                op: CompareOp::Gt,
                target: "occurred_at".into()
            }
        );
        assert_eq!(c.to_string(), "s.occurred_at > t.occurred_at");
        let c = parse_condition("t.version<s.v").unwrap();
        assert_eq!(c.to_string(), "s.v > t.version");
        assert_eq!(parse_condition("s.a >= t.b").unwrap().op, CompareOp::Ge);
        assert_eq!(parse_condition("s.a <> t.b").unwrap().op, CompareOp::Ne);
        assert_eq!(parse_condition("s.a == t.b").unwrap().op, CompareOp::Eq);
    }

    #[test]
    fn bad_conditions_show_the_text() {
        let e = parse_condition("s.a > s.b").unwrap_err();
        assert!(
            e.starts_with("\"s.a > s.b\": compares two columns of the same side"),
            "{e}"
        );
        let e = parse_condition("occurred_at").unwrap_err();
        assert!(e.contains("no comparison operator"), "{e}");
        let e = parse_condition("x.a > t.a").unwrap_err();
        assert!(e.contains("\"x\" is neither s"), "{e}");
        let e = parse_condition("s.a + 1 > t.a").unwrap_err();
        assert!(e.contains("\"a + 1\" is not a column name"), "{e}");
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
