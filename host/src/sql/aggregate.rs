//! Expressions in `[aggregate]`: `sum(amount * 0.9) AS net`,
//! `count(*) FILTER (WHERE status = 'returned')`, `count_if(...)`,
//! `round(sum(amount) / count(*), 2)`, `group_by = ["lower(status) AS status"]`.
//!
//! The streaming aggregation keeps state for a function over one column; an
//! expression is lowered around it rather than into it. A projection before
//! the operator computes each grouping expression and each aggregate's
//! argument (a FILTER becomes `CASE WHEN cond THEN arg END`, which every
//! aggregate skips as NULL, as Spark's FILTER does); the operator aggregates
//! those columns; a projection after it computes what surrounds the
//! aggregates. A `[aggregate]` of plain columns is left exactly as it was, so
//! its state layout and fingerprint do not change.

use std::ops::ControlFlow;

use arrow_schema::SchemaRef;
use datafusion_sql::sqlparser::ast::{
    CaseWhen, DuplicateTreatment, Expr as SqlExpr, FunctionArg, FunctionArgExpr, FunctionArguments,
    Ident, SelectItem, Value, visit_expressions_mut,
};
use datafusion_sql::sqlparser::dialect::SparkSqlDialect;
use datafusion_sql::sqlparser::parser::Parser;
use datafusion_sql::sqlparser::tokenizer::Token;

use super::PlanError;
use super::plan::spark_name;
use crate::operator::aggregate::parse_agg_expr;

/// The aggregate functions the operator keeps state for, and Spark's
/// `count_if`, which is `count` of a condition.
const FUNCTIONS: &[&str] = &[
    "count",
    "sum",
    "avg",
    "mean",
    "min",
    "max",
    "approx_count_distinct",
    "count_if",
];

/// Prefix of the columns the lowering adds (never shown to a sink).
const ARG: &str = "__weir_arg_";
const AGG: &str = "__weir_agg_";

/// `[aggregate]` lowered around the streaming aggregation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lowered {
    /// The projection before the operator (over `input`).
    pub before: String,
    /// The grouping columns, as the projection before names them.
    pub group_by: Vec<String>,
    /// Aggregates of one column each, for the operator.
    pub select: Vec<String>,
    /// The projection after the operator (over its output as `input`).
    pub after: String,
}

/// One `group_by` or `select` entry: an expression and its alias.
fn entry(text: &str) -> Result<(SqlExpr, Option<Ident>), PlanError> {
    let dialect = SparkSqlDialect {};
    let syntax = |e: &dyn std::fmt::Display| PlanError::Syntax(format!("{text:?}: {e}"));
    let mut parser = Parser::new(&dialect)
        .try_with_sql(text)
        .map_err(|e| syntax(&e))?;
    let item = parser.parse_select_item().map_err(|e| syntax(&e))?;
    if parser.peek_token().token != Token::EOF {
        return Err(syntax(&"unexpected text after the expression"));
    }
    match item {
        SelectItem::UnnamedExpr(e) => Ok((e, None)),
        SelectItem::ExprWithAlias { expr, alias } => Ok((expr, Some(alias))),
        _ => Err(PlanError::Refused {
            what: format!("{text:?}"),
            pointer: "an aggregate entry is one expression, optionally with AS name",
        }),
    }
}

fn quoted(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// Whether the entries need lowering: an entry the operator cannot take as it is.
pub fn needs_lowering(group_by: &[String], select: &[String]) -> bool {
    let plain_group = |g: &String| matches!(entry(g), Ok((SqlExpr::Identifier(_), None)));
    !group_by.iter().all(plain_group) || select.iter().any(|s| parse_agg_expr(s).is_err())
}

/// Lowers `group_by` and `select` over an input of `schema`; `keep` names the
/// columns the operator reads besides the groups (the window and watermark
/// column), which the projection before must pass on; `windowed` says
/// whether the operator's output starts with `window_start`, `window_end`.
///
/// # Errors
/// A [`PlanError`] naming the entry: not an expression, an aggregate inside
/// an aggregate, a select entry with no aggregate (it belongs in group_by).
pub fn lower(
    group_by: &[String],
    select: &[String],
    schema: &SchemaRef,
    keep: &[&str],
    windowed: bool,
) -> Result<Lowered, PlanError> {
    let mut before: Vec<String> = Vec::new();
    let mut groups = Vec::new();
    // Grouping expressions' names: an input column of such a name is replaced, not passed on.
    let mut renamed: Vec<String> = Vec::new();
    let mut new_columns = Vec::new();
    for g in group_by {
        let (expr, alias) = entry(g)?;
        match (&expr, alias) {
            (SqlExpr::Identifier(id), None) => groups.push(id.value.clone()),
            (_, alias) => {
                let name = alias.map_or_else(|| spark_name(&expr), |a| a.value);
                if keep.contains(&name.as_str()) {
                    return Err(PlanError::DuplicateColumn(name));
                }
                new_columns.push(format!("{expr} AS {}", quoted(&name)));
                renamed.push(name.clone());
                groups.push(name);
            }
        }
    }
    let mut aggregates = Vec::new();
    let mut after = Vec::new();
    if windowed {
        after.push(quoted("window_start"));
        after.push(quoted("window_end"));
    }
    after.extend(groups.iter().map(|g| quoted(g)));
    for (i, text) in select.iter().enumerate() {
        let (mut expr, alias) = entry(text)?;
        let name = alias.map_or_else(|| spark_name(&expr), |a| a.value);
        let first = aggregates.len();
        let mut problem = None;
        let _ = visit_expressions_mut(&mut expr, |e| {
            match lower_call(e, &mut aggregates, &mut new_columns) {
                Ok(()) => ControlFlow::Continue(()),
                Err(p) => {
                    problem = Some(p);
                    ControlFlow::Break(())
                }
            }
        });
        if let Some(p) = problem {
            return Err(p);
        }
        if aggregates.len() == first {
            // `median(amount)`: a function the operator does not keep state for; its own words.
            if matches!(expr, SqlExpr::Function(_))
                && let Err(e) = parse_agg_expr(text)
            {
                return Err(PlanError::Planner(e.to_string()));
            }
            return Err(PlanError::Refused {
                what: format!("select[{i}] {text:?} without an aggregate"),
                pointer: "a grouping column goes in group_by; every select entry aggregates",
            });
        }
        after.push(format!("{expr} AS {}", quoted(&name)));
    }
    // The input's columns pass on, but for those a grouping expression renames.
    for field in schema.fields() {
        let name = field.name();
        if !renamed.contains(name) || keep.contains(&name.as_str()) {
            before.push(quoted(name));
        }
    }
    before.extend(new_columns);
    if before.is_empty() {
        before.push("*".to_owned());
    }
    Ok(Lowered {
        before: format!("SELECT {} FROM input", before.join(", ")),
        group_by: groups,
        select: aggregates,
        after: format!("SELECT {} FROM input", after.join(", ")),
    })
}

/// Replaces an aggregate call by the column the operator will name it, and
/// records the aggregate and its argument's column.
fn lower_call(
    e: &mut SqlExpr,
    aggregates: &mut Vec<String>,
    columns: &mut Vec<String>,
) -> Result<(), PlanError> {
    let SqlExpr::Function(f) = e else {
        return Ok(());
    };
    let name = f.name.to_string().to_ascii_lowercase();
    if !FUNCTIONS.contains(&name.as_str()) {
        return Ok(());
    }
    if f.over.is_some() {
        return Err(PlanError::Refused {
            what: format!("{name}() OVER (...)"),
            pointer: "window functions need rows of other batches: use a window in [aggregate]",
        });
    }
    let (distinct, args) = match &f.args {
        FunctionArguments::List(list) => (
            list.duplicate_treatment == Some(DuplicateTreatment::Distinct),
            list.args.clone(),
        ),
        FunctionArguments::None => (false, Vec::new()),
        FunctionArguments::Subquery(_) => {
            return Err(PlanError::Refused {
                what: "a sub-query".into(),
                pointer: "an aggregate reads the rows of its group",
            });
        }
    };
    let mut arg: Option<SqlExpr> = match args.as_slice() {
        [] | [FunctionArg::Unnamed(FunctionArgExpr::Wildcard)] => None,
        [FunctionArg::Unnamed(FunctionArgExpr::Expr(SqlExpr::Value(v)))]
            if name == "count" && matches!(v.value, Value::Number(_, _)) =>
        {
            None
        }
        [FunctionArg::Unnamed(FunctionArgExpr::Expr(a))] => Some(a.clone()),
        _ => {
            return Err(PlanError::Refused {
                what: format!("{e}"),
                pointer: "an aggregate here takes one argument (approx_count_distinct: no relative error)",
            });
        }
    };
    if arg.as_ref().is_some_and(|a| a.to_string().contains(AGG)) {
        return Err(PlanError::Refused {
            what: format!("an aggregate inside {name}()"),
            pointer: "aggregates do not nest",
        });
    }
    let function = if name == "count_if" {
        // count_if(cond) is count(*) FILTER (WHERE cond).
        let cond = arg.take().ok_or_else(|| PlanError::Refused {
            what: "count_if()".into(),
            pointer: "count_if takes a condition",
        })?;
        arg = Some(case_when(cond, None));
        "count".to_owned()
    } else {
        name
    };
    if let Some(filter) = f.filter.take() {
        arg = Some(case_when(*filter, arg));
    }
    let column = match arg {
        None => "*".to_owned(),
        Some(SqlExpr::Identifier(id)) => id.value,
        Some(a) => {
            let n = columns.iter().filter(|c| c.contains(ARG)).count();
            let column = format!("{ARG}{n}");
            columns.push(format!("{a} AS {column}"));
            column
        }
    };
    let out = format!("{AGG}{}", aggregates.len());
    let distinct = if distinct { "DISTINCT " } else { "" };
    let column = if column == "*" {
        column
    } else {
        quoted(&column)
    };
    aggregates.push(format!("{function}({distinct}{column}) AS {out}"));
    *e = SqlExpr::Identifier(Ident::new(out));
    Ok(())
}

/// `CASE WHEN cond THEN value END`, value 1 when there is none (a row to count).
fn case_when(cond: SqlExpr, value: Option<SqlExpr>) -> SqlExpr {
    let value = value.unwrap_or_else(|| SqlExpr::value(Value::Number("1".into(), false)));
    SqlExpr::Case {
        case_token: datafusion_sql::sqlparser::ast::helpers::attached_token::AttachedToken::empty(),
        end_token: datafusion_sql::sqlparser::ast::helpers::attached_token::AttachedToken::empty(),
        operand: None,
        conditions: vec![CaseWhen {
            condition: cond,
            result: value,
        }],
        else_result: None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("status", DataType::Utf8, true),
            Field::new("amount", DataType::Decimal128(12, 2), true),
        ]))
    }

    #[test]
    fn plain_aggregates_are_left_alone() {
        let select = ["sum(amount) AS revenue".to_owned(), "count(*)".to_owned()];
        assert!(!needs_lowering(&["status".to_owned()], &select));
        assert!(needs_lowering(
            &["lower(status) AS status".to_owned()],
            &select
        ));
        assert!(needs_lowering(
            &[],
            &["sum(amount * 0.9) AS net".to_owned()]
        ));
    }

    #[test]
    fn a_plain_grouping_column_passes_through_the_projection() {
        let l = lower(
            &["status".to_owned()],
            &["sum(amount * 0.9) AS net".to_owned()],
            &schema(),
            &[],
            false,
        )
        .unwrap();
        assert!(l.before.contains("`status`"), "{}", l.before);
        assert_eq!(l.group_by, ["status"]);
    }

    #[test]
    fn expressions_are_lowered_around_the_operator() {
        let l = lower(
            &["lower(status) AS status".to_owned()],
            &[
                "sum(amount * 0.9) AS net".to_owned(),
                "count(*) FILTER (WHERE amount > 100) AS big".to_owned(),
                "count_if(status = 'returned') AS returned".to_owned(),
                "round(sum(amount) / count(*), 2) AS mean".to_owned(),
            ],
            &schema(),
            &[],
            false,
        )
        .unwrap();
        assert_eq!(
            l.before,
            "SELECT `amount`, lower(status) AS `status`, amount * 0.9 AS __weir_arg_0, \
             CASE WHEN amount > 100 THEN 1 END AS __weir_arg_1, \
             CASE WHEN status = 'returned' THEN 1 END AS __weir_arg_2 FROM input"
        );
        assert_eq!(l.group_by, ["status"]);
        assert_eq!(
            l.select,
            [
                "sum(`__weir_arg_0`) AS __weir_agg_0",
                "count(`__weir_arg_1`) AS __weir_agg_1",
                "count(`__weir_arg_2`) AS __weir_agg_2",
                "sum(`amount`) AS __weir_agg_3",
                "count(*) AS __weir_agg_4",
            ]
        );
        assert_eq!(
            l.after,
            "SELECT `status`, __weir_agg_0 AS `net`, __weir_agg_1 AS `big`, \
             __weir_agg_2 AS `returned`, round(__weir_agg_3 / __weir_agg_4, 2) AS `mean` FROM input"
        );
    }

    #[test]
    fn what_cannot_be_lowered_is_named() {
        let e = lower(&[], &["amount + 1".to_owned()], &schema(), &[], false).unwrap_err();
        assert!(e.to_string().contains("without an aggregate"), "{e}");
        let e = lower(&[], &["sum(count(*))".to_owned()], &schema(), &[], false).unwrap_err();
        assert!(e.to_string().contains("do not nest"), "{e}");
        let e = lower(&[], &["sum(amount) AS".to_owned()], &schema(), &[], false).unwrap_err();
        assert!(matches!(e, PlanError::Syntax(_)), "{e}");
    }
}
