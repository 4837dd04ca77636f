//! Conditions that compare two rows: a Delta MERGE's `s.` (the batch's row) and `t.` (the
//! table's row with the same key), as in Delta's `whenMatchedUpdate(condition = "s.v > t.v")`,
//! and a join's, whose rows are qualified by their inputs' names (`orders.amount > 10 AND
//! customers.tier = 'gold'`).
//!
//! The text is read when the pipeline file is (every column qualified, no aggregate, sub-query
//! or clock), so a typo stops the query before it starts. It is planned with the transforms'
//! planner once per batch schema, as a projection over a batch whose columns are named
//! `s.<column>` and `t.<column>`: the matched pairs' columns, each taken once. A condition that is
//! NULL does not hold, as in SQL.

use std::ops::ControlFlow;
use std::sync::Arc;

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::{ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use datafusion_sql::sqlparser::ast::{
    BinaryOperator, Expr as SqlExpr, Ident, visit_expressions_mut,
};
use datafusion_sql::sqlparser::dialect::SparkSqlDialect;
use datafusion_sql::sqlparser::parser::Parser;
use datafusion_sql::sqlparser::tokenizer::Token;

use super::PlanError;
use super::functions::{BatchClock, Functions};
use super::plan::{self, SqlPlan, nearest};

/// The functions a condition may not call: a MERGE has no batch clock to give them.
const CLOCK: &[&str] = &["current_timestamp", "now", "current_date"];

/// Which rows a condition reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sides {
    /// A matched pair: `s.` and `t.` columns.
    Both,
    /// A batch row with no table row (an insert): `s.` columns only.
    SourceOnly,
}

/// How a condition's columns are qualified.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Qualifiers {
    /// A MERGE: `s.` (the batch's row) and, unless inserting, `t.` (the table's row).
    Merge(Sides),
    /// A join: each input by its name, the left one first.
    Join { left: String, right: String },
}

impl Qualifiers {
    /// The names the condition's columns are planned under: `<label>.<column>`.
    fn labels(&self) -> (&str, &str) {
        match self {
            Self::Merge(_) => ("s", "t"),
            Self::Join { left, right } => (left, right),
        }
    }
}

/// A condition over a batch row (`s.`) and the table row it matched (`t.`), or over the two
/// rows a join pairs, read and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowCondition {
    /// As written.
    text: String,
    qualifiers: Qualifiers,
    /// `SELECT <condition> AS holds FROM input`, columns renamed to `s.<c>` / `t.<c>`.
    select: String,
    /// The batch's columns it reads, as written, in order of first use.
    source: Vec<String>,
    /// The table's columns it reads, as written, in order of first use.
    target: Vec<String>,
}

impl std::fmt::Display for RowCondition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

fn not_here(what: impl Into<String>) -> PlanError {
    PlanError::NotInCondition { what: what.into() }
}

impl RowCondition {
    /// Reads `text` and runs every check that needs no schema.
    ///
    /// # Errors
    /// A [`PlanError`] naming the first problem.
    pub fn parse(text: &str, sides: Sides) -> Result<Self, PlanError> {
        Self::parse_with(text, Qualifiers::Merge(sides))
    }

    /// Reads a join's `condition`, whose columns are qualified by the inputs' names (`left` and
    /// `right`, matched without regard to case), and runs every check that needs no schema.
    ///
    /// # Errors
    /// A [`PlanError`] naming the first problem.
    pub fn parse_join(text: &str, left: &str, right: &str) -> Result<Self, PlanError> {
        Self::parse_with(
            text,
            Qualifiers::Join {
                left: left.to_owned(),
                right: right.to_owned(),
            },
        )
    }

    fn parse_with(text: &str, qualifiers: Qualifiers) -> Result<Self, PlanError> {
        let (source_label, target_label) = qualifiers.labels();
        let (source_label, target_label) = (source_label.to_owned(), target_label.to_owned());
        let not_here = |what: String| match &qualifiers {
            Qualifiers::Merge(_) => not_here(what),
            Qualifiers::Join { .. } => PlanError::NotInJoinCondition { what },
        };
        let dialect = SparkSqlDialect {};
        let syntax = |e: &dyn std::fmt::Display| PlanError::Syntax(e.to_string());
        let mut parser = Parser::new(&dialect)
            .try_with_sql(text)
            .map_err(|e| syntax(&e))?;
        let mut expr = parser.parse_expr().map_err(|e| syntax(&e))?;
        if parser.peek_token().token != Token::EOF {
            return Err(syntax(&"unexpected text after the condition"));
        }
        let mut source: Vec<String> = Vec::new();
        let mut target: Vec<String> = Vec::new();
        let mut problem = None;
        // Post-order: a renamed column is a new leaf and is not visited again.
        let _ = visit_expressions_mut(&mut expr, |e| {
            let outcome = match e {
                SqlExpr::Identifier(id) => Err(match &qualifiers {
                    Qualifiers::Merge(_) => PlanError::Unqualified {
                        column: id.value.clone(),
                    },
                    Qualifiers::Join { left, right } => PlanError::UnqualifiedJoin {
                        column: id.value.clone(),
                        left: left.clone(),
                        right: right.clone(),
                    },
                }),
                SqlExpr::CompoundIdentifier(parts) => match parts.as_slice() {
                    [side, column] => {
                        let side = side.value.to_ascii_lowercase();
                        let column = column.value.clone();
                        let is_source = side == source_label.to_ascii_lowercase();
                        let is_target = side == target_label.to_ascii_lowercase();
                        match (&qualifiers, is_source, is_target) {
                            (_, true, _) => {
                                if !source.contains(&column) {
                                    source.push(column.clone());
                                }
                                Ok(Some(format!("{source_label}.{column}")))
                            }
                            (Qualifiers::Merge(Sides::SourceOnly), _, true) => {
                                Err(not_here(format!(
                                    "t.{column} (an inserted row has no table row; use s. columns)"
                                )))
                            }
                            (_, _, true) => {
                                if !target.contains(&column) {
                                    target.push(column.clone());
                                }
                                Ok(Some(format!("{target_label}.{column}")))
                            }
                            (Qualifiers::Merge(_), _, _) => Err(PlanError::UnknownSide {
                                column: format!("{side}.{column}"),
                                side,
                            }),
                            (Qualifiers::Join { left, right }, _, _) => {
                                Err(PlanError::UnknownInput {
                                    column: format!("{side}.{column}"),
                                    side,
                                    left: left.clone(),
                                    right: right.clone(),
                                })
                            }
                        }
                    }
                    _ => Err(PlanError::Unqualified {
                        column: e.to_string(),
                    }),
                },
                SqlExpr::Function(f)
                    if CLOCK.contains(&f.name.to_string().to_ascii_lowercase().as_str()) =>
                {
                    Err(not_here(format!(
                        "{}() (add the timestamp as a column with a [[transform]] sql)",
                        f.name
                    )))
                }
                _ => Ok(None),
            };
            match outcome {
                Ok(Some(name)) => {
                    *e = SqlExpr::Identifier(Ident::with_quote('`', name));
                    ControlFlow::Continue(())
                }
                Ok(None) => ControlFlow::Continue(()),
                Err(p) => {
                    problem = Some(p);
                    ControlFlow::Break(())
                }
            }
        });
        if let Some(p) = problem {
            return Err(p);
        }
        let select = format!("SELECT {expr} AS holds FROM input");
        let functions = Functions::new(&BatchClock::default());
        plan::check(&select, &functions).map_err(|e| match e {
            PlanError::Refused { what, .. } => not_here(what),
            other => other,
        })?;
        Ok(Self {
            text: text.to_owned(),
            qualifiers,
            select,
            source,
            target,
        })
    }

    /// Plans the condition for batches of `batch`'s schema; the table's columns have the types
    /// of the batch's columns of the same name (a MERGE does not evolve the table's schema).
    ///
    /// # Errors
    /// An unknown column (with the nearest one), or a condition that is not a BOOLEAN.
    pub fn plan(&self, batch: &SchemaRef) -> Result<ConditionPlan, PlanError> {
        self.plan_two(batch, batch)
    }

    /// Plans the condition for rows of `left` (the source's, or a join's left input) paired
    /// with rows of `right`.
    ///
    /// # Errors
    /// As [`Self::plan`].
    pub fn plan_two(
        &self,
        left: &SchemaRef,
        right: &SchemaRef,
    ) -> Result<ConditionPlan, PlanError> {
        let (source_label, target_label) = self.qualifiers.labels();
        let resolve =
            |batch: &SchemaRef, side: &str, column: &str| -> Result<(String, Field), PlanError> {
                let names = || batch.fields().iter().map(|f| f.name().as_str());
                let found = batch
                    .fields()
                    .iter()
                    .find(|f| f.name() == column)
                    .or_else(|| {
                        let mut same = batch
                            .fields()
                            .iter()
                            .filter(|f| f.name().eq_ignore_ascii_case(column));
                        match (same.next(), same.next()) {
                            (Some(one), None) => Some(one),
                            _ => None,
                        }
                    })
                    .ok_or_else(|| PlanError::UnknownRowColumn {
                        column: format!("{side}.{column}"),
                        nearest: nearest(column, names()).map(|n| format!("{side}.{n}")),
                        columns: names().map(|n| format!("{side}.{n}")).collect(),
                    })?;
                Ok((
                    found.name().clone(),
                    Field::new(
                        format!("{side}.{}", found.name()),
                        found.data_type().clone(),
                        true,
                    ),
                ))
            };
        let mut fields = Vec::new();
        let mut source = Vec::new();
        let mut target = Vec::new();
        for c in &self.source {
            let (name, field) = resolve(left, source_label, c)?;
            source.push(name);
            fields.push(field);
        }
        for c in &self.target {
            let (name, field) = resolve(right, target_label, c)?;
            target.push(name);
            fields.push(field);
        }
        let pair = Arc::new(Schema::new(fields));
        let functions = Functions::new(&BatchClock::default());
        let checked = plan::check(&self.select, &functions)?;
        let planned = plan::plan(&checked, &pair, &functions)?;
        let returns = planned.output_schema().field(0).data_type();
        if returns != &DataType::Boolean {
            return Err(PlanError::Planner(format!(
                "the condition {:?} is a {returns} value, not a condition (BOOLEAN)",
                self.text
            )));
        }
        Ok(ConditionPlan {
            plan: planned,
            pair,
            source,
            target,
        })
    }
}

/// A [`RowCondition`] planned for one batch schema.
#[derive(Debug)]
pub struct ConditionPlan {
    plan: SqlPlan,
    pair: SchemaRef,
    source: Vec<String>,
    target: Vec<String>,
}

impl ConditionPlan {
    /// The batch's columns the condition reads, as the batch names them.
    pub fn source_columns(&self) -> &[String] {
        &self.source
    }

    /// The table's columns the condition reads (by the batch's names).
    pub fn target_columns(&self) -> &[String] {
        &self.target
    }

    /// Whether the condition holds for each pair of rows: `source` holds the
    /// [`Self::source_columns`] and `target` the [`Self::target_columns`], aligned, each already
    /// of the batch's type. NULL is false.
    ///
    /// # Errors
    /// The evaluation's error (a failed cast, a division by zero, …) as text.
    pub fn evaluate(
        &self,
        rows: usize,
        source: Vec<ArrayRef>,
        target: Vec<ArrayRef>,
    ) -> Result<BooleanArray, String> {
        let mut columns = source;
        columns.extend(target);
        let batch = RecordBatch::try_new_with_options(
            Arc::clone(&self.pair),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )
        .map_err(|e| e.to_string())?;
        let (expr, _) = self
            .plan
            .columns
            .first()
            .ok_or_else(|| "the condition has no expression".to_owned())?;
        let value = expr
            .evaluate(&batch)
            .and_then(|v| v.into_array(rows))
            .map_err(|e| e.to_string())?;
        let holds = value
            .as_boolean_opt()
            .ok_or_else(|| format!("the condition gave {} values", value.data_type()))?;
        Ok(if holds.null_count() > 0 {
            arrow_select::filter::prep_null_mask_filter(holds)
        } else {
            holds.clone()
        })
    }
}

/// A join's condition split the way a stream-stream join evaluates it (Spark's
/// `JoinConditionSplitPredicates`): the conjuncts that read only the left input, only the right
/// one, and both. A row failing its side's part can match no row at all, so it is never buffered
/// (and an outer join emits it at once).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JoinConditionParts {
    pub left_only: Option<RowCondition>,
    pub right_only: Option<RowCondition>,
    pub both: Option<RowCondition>,
}

/// Which inputs an expression's columns belong to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Reads {
    left: bool,
    right: bool,
}

impl RowCondition {
    /// The parsed expression, columns still qualified as written.
    fn expr(&self) -> Option<SqlExpr> {
        let dialect = SparkSqlDialect {};
        Parser::new(&dialect)
            .try_with_sql(&self.text)
            .ok()?
            .parse_expr()
            .ok()
    }

    fn join_labels(&self) -> Option<(&str, &str)> {
        match &self.qualifiers {
            Qualifiers::Join { left, right } => Some((left, right)),
            Qualifiers::Merge(_) => None,
        }
    }

    /// Splits a join's condition into its left-only, right-only and two-sided conjuncts.
    ///
    /// # Errors
    /// When a part cannot be read again (it was read whole, so this is not expected).
    pub fn split_join(&self) -> Result<JoinConditionParts, PlanError> {
        let Some((left, right)) = self.join_labels() else {
            return Ok(JoinConditionParts {
                both: Some(self.clone()),
                ..JoinConditionParts::default()
            });
        };
        let Some(expr) = self.expr() else {
            return Err(PlanError::Syntax(self.text.clone()));
        };
        let mut conjuncts = Vec::new();
        split_and(expr, &mut conjuncts);
        let (mut l, mut r, mut b) = (Vec::new(), Vec::new(), Vec::new());
        for c in conjuncts {
            let reads = reads(&c, left, right);
            let text = format!("({c})");
            match (reads.left, reads.right) {
                (true, false) => l.push(text),
                (false, true) => r.push(text),
                (true, true) => b.push(text),
                // A constant: each side's filter, as Spark splits it.
                (false, false) => {
                    l.push(text.clone());
                    r.push(text);
                }
            }
        }
        let part = |texts: Vec<String>| -> Result<Option<RowCondition>, PlanError> {
            if texts.is_empty() {
                return Ok(None);
            }
            RowCondition::parse_join(&texts.join(" AND "), left, right).map(Some)
        };
        Ok(JoinConditionParts {
            left_only: part(l)?,
            right_only: part(r)?,
            both: part(b)?,
        })
    }

    /// How far below the watermark a row of this input may still match a later row of the other
    /// input, as the condition bounds it (Spark's `StreamingJoinHelper.getStateValueWatermark`):
    /// `Some(c)` when some conjunct says `this.this_column > other.other_column - c` (a `BETWEEN`
    /// is two conjuncts), in milliseconds. Rows of the other input arriving later have event
    /// times above the watermark `wm`, so a row of this input whose `this_column` is at most
    /// `wm - c` can match none of them. As Spark computes it: a `>=` (or `<=`) conjunct gives one
    /// millisecond more than a strict one, and of several conjuncts the largest `c` counts.
    pub fn lower_bound_ms(
        &self,
        this_is_left: bool,
        this_column: &str,
        other_column: &str,
    ) -> Option<i64> {
        let (left, right) = self.join_labels()?;
        let (this, other) = if this_is_left {
            (left, right)
        } else {
            (right, left)
        };
        let expr = self.expr()?;
        let mut conjuncts = Vec::new();
        split_and(expr, &mut conjuncts);
        // (lo, hi, strict): lo < hi, or lo <= hi.
        let mut comparisons: Vec<(SqlExpr, SqlExpr, bool)> = Vec::new();
        for c in conjuncts {
            match c {
                SqlExpr::BinaryOp {
                    left: a,
                    op,
                    right: b,
                } => match op {
                    BinaryOperator::Lt => comparisons.push((*a, *b, true)),
                    BinaryOperator::LtEq => comparisons.push((*a, *b, false)),
                    BinaryOperator::Gt => comparisons.push((*b, *a, true)),
                    BinaryOperator::GtEq => comparisons.push((*b, *a, false)),
                    _ => {}
                },
                SqlExpr::Between {
                    expr,
                    negated: false,
                    low,
                    high,
                } => {
                    comparisons.push((*low, (*expr).clone(), false));
                    comparisons.push((*expr, *high, false));
                }
                _ => {}
            }
        }
        let mut best: Option<i64> = None;
        for (lo, hi, strict) in comparisons {
            // lo <= hi, i.e. hi - lo >= 0.
            let mut terms = Vec::new();
            let mut constant = 0i64;
            if !linear(&hi, 1, &mut terms, &mut constant)
                || !linear(&lo, -1, &mut terms, &mut constant)
            {
                continue;
            }
            let is = |t: &(String, String, i64), side: &str, column: &str, sign: i64| {
                t.0.eq_ignore_ascii_case(side) && t.1.eq_ignore_ascii_case(column) && t.2 == sign
            };
            // this - other + constant >= 0: this >= other - constant.
            if let [a, b] = terms.as_slice()
                && ((is(a, this, this_column, 1) && is(b, other, other_column, -1))
                    || (is(b, this, this_column, 1) && is(a, other, other_column, -1)))
            {
                let c = constant + i64::from(!strict);
                best = Some(best.map_or(c, |b: i64| b.max(c)));
            }
        }
        best
    }
}

impl RowCondition {
    /// The columns of each input (left, right) that a conjunct comparing both inputs reads:
    /// a row with a null in one of them can match no row, since the comparison is NULL. Spark's
    /// optimizer filters such rows out before a join (`InferFiltersFromConstraints`), except on
    /// the side an outer join keeps.
    pub fn null_rejecting_columns(&self) -> (Vec<String>, Vec<String>) {
        let (mut l, mut r) = (Vec::new(), Vec::new());
        let (Some((left, right)), Some(expr)) = (self.join_labels(), self.expr()) else {
            return (l, r);
        };
        let mut conjuncts = Vec::new();
        split_and(expr, &mut conjuncts);
        for c in conjuncts {
            let comparison = match &c {
                SqlExpr::BinaryOp { op, .. } => matches!(
                    op,
                    BinaryOperator::Eq
                        | BinaryOperator::Lt
                        | BinaryOperator::LtEq
                        | BinaryOperator::Gt
                        | BinaryOperator::GtEq
                ),
                SqlExpr::Between { negated: false, .. } => true,
                _ => false,
            };
            // Only plain columns and arithmetic inside: a function could turn a NULL into a value.
            let plain = |e: &SqlExpr| {
                let mut terms = Vec::new();
                let mut constant = 0;
                linear(e, 1, &mut terms, &mut constant)
            };
            let operands: Vec<&SqlExpr> = match &c {
                SqlExpr::BinaryOp {
                    left: a, right: b, ..
                } => vec![a, b],
                SqlExpr::Between {
                    expr, low, high, ..
                } => vec![expr, low, high],
                _ => Vec::new(),
            };
            if !comparison || !operands.iter().all(|e| plain(e)) || !reads(&c, left, right).left {
                continue;
            }
            if !reads(&c, left, right).right {
                continue;
            }
            let _ = datafusion_sql::sqlparser::ast::visit_expressions(&c, |e| {
                if let SqlExpr::CompoundIdentifier(parts) = e
                    && let [side, column] = parts.as_slice()
                {
                    let list = if side.value.eq_ignore_ascii_case(left) {
                        &mut l
                    } else {
                        &mut r
                    };
                    if !list.contains(&column.value) {
                        list.push(column.value.clone());
                    }
                }
                ControlFlow::<()>::Continue(())
            });
        }
        (l, r)
    }
}

/// `a AND b AND …` as its conjuncts (parentheses dropped).
fn split_and(expr: SqlExpr, out: &mut Vec<SqlExpr>) {
    match expr {
        SqlExpr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            split_and(*left, out);
            split_and(*right, out);
        }
        SqlExpr::Nested(inner)
            if matches!(
                *inner,
                SqlExpr::BinaryOp {
                    op: BinaryOperator::And,
                    ..
                }
            ) =>
        {
            split_and(*inner, out);
        }
        other => out.push(other),
    }
}

/// Which of the inputs `left` and `right` the columns of `expr` belong to.
fn reads(expr: &SqlExpr, left: &str, right: &str) -> Reads {
    let mut found = Reads::default();
    let _ = datafusion_sql::sqlparser::ast::visit_expressions(expr, |e| {
        if let SqlExpr::CompoundIdentifier(parts) = e
            && let [side, _] = parts.as_slice()
        {
            if side.value.eq_ignore_ascii_case(left) {
                found.left = true;
            } else if side.value.eq_ignore_ascii_case(right) {
                found.right = true;
            }
        }
        ControlFlow::<()>::Continue(())
    });
    found
}

/// Reads `expr` as a sum of qualified columns (each `+` or `-`) and interval constants, adding
/// it times `sign` to `terms` (input, column, sign) and `constant` (ms). False when it is not.
fn linear(
    expr: &SqlExpr,
    sign: i64,
    terms: &mut Vec<(String, String, i64)>,
    constant: &mut i64,
) -> bool {
    match expr {
        SqlExpr::Nested(inner) => linear(inner, sign, terms, constant),
        SqlExpr::Cast { expr, .. } => linear(expr, sign, terms, constant),
        SqlExpr::CompoundIdentifier(parts) => match parts.as_slice() {
            [side, column] => {
                terms.push((side.value.clone(), column.value.clone(), sign));
                true
            }
            _ => false,
        },
        SqlExpr::UnaryOp {
            op: datafusion_sql::sqlparser::ast::UnaryOperator::Minus,
            expr,
        } => linear(expr, -sign, terms, constant),
        SqlExpr::BinaryOp { left, op, right } => match op {
            BinaryOperator::Plus => {
                linear(left, sign, terms, constant) && linear(right, sign, terms, constant)
            }
            BinaryOperator::Minus => {
                linear(left, sign, terms, constant) && linear(right, -sign, terms, constant)
            }
            _ => false,
        },
        SqlExpr::Interval(interval) => match interval_ms(interval) {
            Some(ms) => {
                *constant += sign * ms;
                true
            }
            None => false,
        },
        _ => false,
    }
}

/// An interval literal of a fixed length (`INTERVAL 1 HOUR`, `INTERVAL '90' MINUTE`,
/// `INTERVAL '1 hour 30 minutes'`) in milliseconds; months and years have none.
fn interval_ms(interval: &datafusion_sql::sqlparser::ast::Interval) -> Option<i64> {
    use datafusion_sql::sqlparser::ast::Value;
    if interval.last_field.is_some() {
        return None;
    }
    let value = match interval.value.as_ref() {
        SqlExpr::Value(v) => match &v.value {
            Value::Number(n, _) => n.clone(),
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
            _ => return None,
        },
        _ => return None,
    };
    let text = match &interval.leading_field {
        Some(field) => format!("{value} {}", field.to_string().to_ascii_lowercase()),
        None => value,
    };
    let text = text.trim();
    let (text, negative) = match text.strip_prefix('-') {
        Some(rest) => (rest, true),
        None => (text, false),
    };
    let ms = i64::try_from(crate::spec::parse_duration(text).ok()?.as_millis()).ok()?;
    Some(if negative { -ms } else { ms })
}

#[cfg(test)]
mod tests {
    use arrow_array::{Int64Array, StringArray};

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("status", DataType::Utf8, true),
            Field::new("at", DataType::Int64, true),
        ]))
    }

    #[test]
    fn a_condition_reads_both_sides_and_null_does_not_hold() {
        let c = RowCondition::parse(
            "s.at > t.at AND S.Status <> 'cancelled' OR s.at IS NULL",
            Sides::Both,
        )
        .unwrap();
        assert_eq!(
            c.to_string(),
            "s.at > t.at AND S.Status <> 'cancelled' OR s.at IS NULL"
        );
        let p = c.plan(&schema()).unwrap();
        assert_eq!(p.source_columns(), ["at", "status"]);
        assert_eq!(p.target_columns(), ["at"]);
        let holds = p
            .evaluate(
                4,
                vec![
                    Arc::new(Int64Array::from(vec![Some(2), Some(2), Some(0), Some(5)])),
                    Arc::new(StringArray::from(vec![
                        Some("paid"),
                        Some("cancelled"),
                        Some("paid"),
                        None,
                    ])),
                ],
                vec![Arc::new(Int64Array::from(vec![1, 1, 1, 1]))],
            )
            .unwrap();
        assert_eq!(holds, BooleanArray::from(vec![true, false, false, false]));
    }

    #[test]
    fn refusals_name_the_problem() {
        let e = |text: &str, sides| RowCondition::parse(text, sides).unwrap_err().to_string();
        assert_eq!(
            e("at > t.at", Sides::Both),
            "the column at is not qualified: write s.at for the batch's row or t.at for the table's"
        );
        assert_eq!(
            e("X.at > t.at", Sides::Both),
            "x.at: x is neither s (the batch's row) nor t (the table's row of the same key)"
        );
        assert!(
            e("t.at > 0", Sides::SourceOnly)
                .starts_with("t.at (an inserted row has no table row; use s. columns) is not supported in a MERGE condition"),
            "{}",
            e("t.at > 0", Sides::SourceOnly)
        );
        assert!(e("sum(s.at) > 0", Sides::Both).contains("the aggregate sum()"));
        assert!(e("s.at > (SELECT 1)", Sides::Both).contains("a sub-query"));
        assert!(e("now() > t.at", Sides::Both).starts_with("now() (add the timestamp"));
        assert!(
            e("uper(s.status) = 'A'", Sides::Both).contains("did you mean upper?"),
            "{}",
            e("uper(s.status) = 'A'", Sides::Both)
        );
        assert!(e("s.at >", Sides::Both).starts_with("the SQL does not parse"));
        let c = RowCondition::parse("s.stat > t.at", Sides::Both).unwrap();
        assert_eq!(
            c.plan(&schema()).unwrap_err().to_string(),
            "no column \"s.stat\" (did you mean s.status?); the columns are s.id, s.status, s.at"
        );
        let c = RowCondition::parse("s.at + t.at", Sides::Both).unwrap();
        assert!(
            c.plan(&schema())
                .unwrap_err()
                .to_string()
                .contains("not a condition (BOOLEAN)")
        );
    }
}
