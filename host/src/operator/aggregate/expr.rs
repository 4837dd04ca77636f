//! The aggregate expressions of `[aggregate] select`, parsed from Spark SQL
//! text (`"sum(amount) AS revenue"`).
//!
//! Why it exists: pipeline files carry aggregates as the SQL users already
//! write for Spark, and output columns must get Spark's default names
//! (`count(1)` for `count(*)`) so that sinks and dashboards see the same
//! schema. Only a function over one column is accepted: expressions inside
//! the call belong in a transform before the aggregation.

use std::fmt;

/// An aggregate function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggFunction {
    /// `count(*)`, `count(1)` (every row) or `count(col)` (non-null values).
    Count,
    /// `count(DISTINCT col)`, exact.
    CountDistinct,
    /// `approx_count_distinct(col)`: HyperLogLog++ with Spark's defaults.
    ApproxCountDistinct,
    Sum,
    /// `avg` and its alias `mean`.
    Avg,
    Min,
    Max,
}

impl fmt::Display for AggFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Count => "count",
            Self::CountDistinct => "count(DISTINCT)",
            Self::ApproxCountDistinct => "approx_count_distinct",
            Self::Sum => "sum",
            Self::Avg => "avg",
            Self::Min => "min",
            Self::Max => "max",
        })
    }
}

/// One parsed aggregate: function, input column and output name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggExpr {
    pub function: AggFunction,
    /// The input column as written; `None` for `count(*)` / `count(1)`.
    pub column: Option<String>,
    /// The output column: the alias, or Spark's default name.
    pub name: String,
    /// The expression as written (for error messages).
    pub text: String,
}

/// Why an aggregate expression could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AggParseError {
    #[error(
        "aggregate {text:?}: expected `function(column)` optionally followed by `AS name`, \
         e.g. \"sum(amount) AS revenue\""
    )]
    Syntax { text: String },
    #[error(
        "aggregate {text:?}: unknown function {function:?}; supported: count, sum, avg, mean, \
         min, max, approx_count_distinct"
    )]
    UnknownFunction { text: String, function: String },
    #[error(
        "aggregate {text:?}: {function} takes one column name; compute expressions in a \
         transform before the aggregation"
    )]
    Argument { text: String, function: String },
    #[error(
        "aggregate {text:?}: DISTINCT is only supported as count(DISTINCT column) (use \
         approx_count_distinct for a bounded-memory estimate)"
    )]
    Distinct { text: String },
    #[error(
        "aggregate {text:?}: approx_count_distinct takes only a column here (Spark's default \
         relative error 0.05)"
    )]
    RelativeSd { text: String },
}

/// Parses one aggregate such as `"sum(amount) AS revenue"`, `"count(*)"`,
/// `"count(DISTINCT customer_id) AS customers"` or `"avg(amount)"`.
/// Without an alias the output column gets Spark's name (`sum(amount)`,
/// `count(1)` for `count(*)`, `count(DISTINCT customer_id)`).
///
/// # Errors
/// [`AggParseError`] saying what is wrong and what is accepted.
pub fn parse_agg_expr(text: &str) -> Result<AggExpr, AggParseError> {
    let syntax = || AggParseError::Syntax {
        text: text.to_owned(),
    };
    let trimmed = text.trim();
    let open = trimmed.find('(').ok_or_else(syntax)?;
    let close = matching_paren(trimmed, open).ok_or_else(syntax)?;
    let function_text = trimmed[..open].trim();
    if function_text.is_empty() || !function_text.chars().all(is_ident_char) {
        return Err(syntax());
    }
    let inner = trimmed[open + 1..close].trim();
    let alias = parse_alias(trimmed[close + 1..].trim()).ok_or_else(syntax)?;

    let lower = function_text.to_ascii_lowercase();
    let (function, spelled) = match lower.as_str() {
        "count" => (AggFunction::Count, "count"),
        "sum" => (AggFunction::Sum, "sum"),
        "avg" => (AggFunction::Avg, "avg"),
        "mean" => (AggFunction::Avg, "mean"),
        "min" => (AggFunction::Min, "min"),
        "max" => (AggFunction::Max, "max"),
        "approx_count_distinct" => (AggFunction::ApproxCountDistinct, "approx_count_distinct"),
        _ => {
            return Err(AggParseError::UnknownFunction {
                text: text.to_owned(),
                function: function_text.to_owned(),
            });
        }
    };
    let argument_error = || AggParseError::Argument {
        text: text.to_owned(),
        function: spelled.to_owned(),
    };

    let (distinct, argument) = split_distinct(inner);
    if distinct && function != AggFunction::Count {
        return Err(AggParseError::Distinct {
            text: text.to_owned(),
        });
    }
    if function == AggFunction::ApproxCountDistinct && argument.contains(',') {
        return Err(AggParseError::RelativeSd {
            text: text.to_owned(),
        });
    }
    let (function, column, default_name) = if function == AggFunction::Count && !distinct {
        if argument == "*" || argument == "1" {
            (AggFunction::Count, None, "count(1)".to_owned())
        } else {
            let column = parse_column(argument).ok_or_else(argument_error)?;
            let name = format!("count({column})");
            (AggFunction::Count, Some(column), name)
        }
    } else if distinct {
        let column = parse_column(argument).ok_or_else(argument_error)?;
        let name = format!("count(DISTINCT {column})");
        (AggFunction::CountDistinct, Some(column), name)
    } else {
        let column = parse_column(argument).ok_or_else(argument_error)?;
        let name = format!("{spelled}({column})");
        (function, Some(column), name)
    };
    Ok(AggExpr {
        function,
        column,
        name: alias.unwrap_or(default_name),
        text: trimmed.to_owned(),
    })
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The index of the `)` closing the `(` at `open`, which must end the call
/// (only an alias may follow).
fn matching_paren(s: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_backticks = false;
    for (i, c) in s.char_indices().skip_while(|(i, _)| *i < open) {
        match c {
            '`' => in_backticks = !in_backticks,
            '(' if !in_backticks => depth += 1,
            ')' if !in_backticks => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `DISTINCT x` → (true, "x"); anything else → (false, text).
fn split_distinct(inner: &str) -> (bool, &str) {
    let mut parts = inner.splitn(2, char::is_whitespace);
    match (parts.next(), parts.next()) {
        (Some(first), Some(rest)) if first.eq_ignore_ascii_case("distinct") => (true, rest.trim()),
        _ => (false, inner),
    }
}

/// A column reference: an identifier or a backquoted name.
fn parse_column(text: &str) -> Option<String> {
    let text = text.trim();
    if let Some(quoted) = text.strip_prefix('`') {
        let name = quoted.strip_suffix('`')?;
        if name.is_empty() || name.contains('`') {
            return None;
        }
        return Some(name.to_owned());
    }
    if !text.is_empty() && text.chars().all(is_ident_char) && !text.starts_with(char::is_numeric) {
        Some(text.to_owned())
    } else {
        None
    }
}

/// What follows the call: nothing, `name`, `AS name` (case-insensitive AS).
/// `None` when it is not one of those; `Some(None)` when there is no alias.
fn parse_alias(rest: &str) -> Option<Option<String>> {
    if rest.is_empty() {
        return Some(None);
    }
    let mut words = rest.splitn(2, char::is_whitespace);
    let first = words.next()?;
    let name = match words.next() {
        Some(name) if first.eq_ignore_ascii_case("as") => name.trim(),
        Some(_) => return None,
        // A lone `AS` is a keyword without its alias, not a name.
        None if first.eq_ignore_ascii_case("as") => return None,
        None => first,
    };
    parse_column(name).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> (AggFunction, Option<String>, String) {
        let e = parse_agg_expr(text).expect("parses");
        (e.function, e.column, e.name)
    }

    #[test]
    fn spark_default_names_and_aliases() {
        assert_eq!(
            parsed("sum(amount) AS revenue"),
            (AggFunction::Sum, Some("amount".into()), "revenue".into())
        );
        assert_eq!(
            parsed("count(*) as orders"),
            (AggFunction::Count, None, "orders".into())
        );
        assert_eq!(
            parsed("count(*)"),
            (AggFunction::Count, None, "count(1)".into())
        );
        assert_eq!(
            parsed("COUNT(1)"),
            (AggFunction::Count, None, "count(1)".into())
        );
        assert_eq!(
            parsed("count(DISTINCT customer_id) AS customers"),
            (
                AggFunction::CountDistinct,
                Some("customer_id".into()),
                "customers".into()
            )
        );
        assert_eq!(
            parsed("count(distinct customer_id)"),
            (
                AggFunction::CountDistinct,
                Some("customer_id".into()),
                "count(DISTINCT customer_id)".into()
            )
        );
        assert_eq!(
            parsed("approx_count_distinct(customer_id) AS c"),
            (
                AggFunction::ApproxCountDistinct,
                Some("customer_id".into()),
                "c".into()
            )
        );
        assert_eq!(
            parsed("avg(amount)"),
            (
                AggFunction::Avg,
                Some("amount".into()),
                "avg(amount)".into()
            )
        );
        assert_eq!(
            parsed("mean(amount)"),
            (
                AggFunction::Avg,
                Some("amount".into()),
                "mean(amount)".into()
            )
        );
        assert_eq!(
            parsed("min(occurred_at) as first"),
            (AggFunction::Min, Some("occurred_at".into()), "first".into())
        );
        assert_eq!(
            parsed(" max( `odd col` )  `top` "),
            (AggFunction::Max, Some("odd col".into()), "top".into())
        );
        assert_eq!(
            parsed("count(status) n"),
            (AggFunction::Count, Some("status".into()), "n".into())
        );
    }

    #[test]
    fn rejects_what_it_cannot_run() {
        let err = |t: &str| parse_agg_expr(t).expect_err(t).to_string();
        assert!(err("median(x)").contains("unknown function"));
        assert!(err("sum(a + b)").contains("one column name"));
        assert!(err("sum(DISTINCT a)").contains("DISTINCT is only supported"));
        assert!(err("sum(a) AS").contains("expected `function(column)`"));
        assert!(err("sum(a) AS x y").contains("expected"));
        assert!(err("amount").contains("expected"));
        assert!(err("approx_count_distinct(a, 0.01)").contains("relative error"));
        assert!(err("count(2)").contains("one column name"));
    }
}
