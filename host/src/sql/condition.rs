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
use datafusion_sql::sqlparser::ast::{Expr as SqlExpr, Ident, visit_expressions_mut};
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
