//! From a transform's SQL text to physical expressions over one input schema.
//!
//! Two passes. The first reads the statement alone (no schema needed, so
//! `weir validate` runs it on every transform): it refuses what a per-batch
//! transform cannot mean, each with the pipeline table that does it, checks
//! every function name, resolves column names without regard to case (as
//! Spark does) and names unaliased columns as Spark would. The second plans
//! the statement with DataFusion against the input schema, coerces types, and
//! turns the projection and the filter into physical expressions, once per
//! input schema; batches then only evaluate them.

use std::ops::ControlFlow;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion_common::config::ConfigOptions;
use datafusion_common::{DFSchema, DataFusionError, SchemaError, TableReference};
use datafusion_expr::logical_plan::builder::LogicalTableSource;
use datafusion_expr::planner::{ContextProvider, ExprPlanner};
use datafusion_expr::{
    AggregateUDF, Expr, HigherOrderUDF, LogicalPlan, ScalarUDF, TableSource, WindowUDF,
};
use datafusion_optimizer::analyzer::AnalyzerRule;
use datafusion_optimizer::analyzer::type_coercion::TypeCoercion;
use datafusion_optimizer::simplify_expressions::SimplifyExpressions;
use datafusion_optimizer::{OptimizerContext, OptimizerRule};
use datafusion_physical_expr::{PhysicalExpr, create_physical_expr};
use datafusion_sql::planner::{ParserOptions, SqlToRel};
use datafusion_sql::sqlparser::ast::{
    Distinct, Expr as SqlExpr, FunctionArguments, GroupByExpr, Ident, ObjectNamePart, Query,
    Select, SelectItem, SetExpr, Statement, TableFactor, Value, visit_expressions,
    visit_expressions_mut,
};
use datafusion_sql::sqlparser::dialect::SparkSqlDialect;
use datafusion_sql::sqlparser::parser::Parser;

use super::functions::{BatchClock, Functions, UTC_OFFSET};

/// The name a transform's SQL reads its batch by (`FROM input`).
pub const INPUT_TABLE: &str = "input";

const AGGREGATE: &str =
    "aggregation keeps state across batches: use [aggregate] (group_by, window, select)";
const WINDOW: &str = "window functions need rows of other batches: use [aggregate] with a window, or a stateful plugin";
const JOIN: &str = "a transform reads one batch of one input: joins belong to [join], with [[table]] for static inputs";
const SUBQUERY: &str = "a transform reads one batch of one input: sub-queries are not supported (use [join] to bring in another input)";
const ORDER: &str = "a stream has neither an order nor an end: sort or limit in the sink's reader, or in [aggregate] for top-N";
const DISTINCT: &str = "use [deduplicate] (Spark's dropDuplicates) to drop repeated rows";
const ONE_SELECT: &str = "a transform is one `SELECT ... FROM input [WHERE ...]`: chain [[transform]] tables for more steps";

/// Why a statement cannot be a transform; the text says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("the SQL does not parse: {0}")]
    Syntax(String),
    #[error("{what} is not supported in a transform: {pointer}")]
    Refused { what: String, pointer: &'static str },
    #[error("no column {column:?} in the transform's input{}; its columns are {}", nearest_text(.nearest), .columns.join(", "))]
    UnknownColumn {
        column: String,
        nearest: Option<String>,
        columns: Vec<String>,
    },
    #[error("unknown function {function}(){}", nearest_text(.nearest))]
    UnknownFunction {
        function: String,
        nearest: Option<String>,
    },
    #[error("column {column:?} would be {data_type}, a type Weir's batches do not carry: {hint}")]
    UnsupportedType {
        column: String,
        data_type: String,
        hint: &'static str,
    },
    #[error("two output columns are named {0:?}: give one of them another name with AS")]
    DuplicateColumn(String),
    #[error(
        "the column {column} is not qualified: write s.{column} for the batch's row or t.{column} for the table's"
    )]
    Unqualified { column: String },
    #[error(
        "{column}: {side} is neither s (the batch's row) nor t (the table's row of the same key)"
    )]
    UnknownSide { column: String, side: String },
    #[error(
        "{what} is not supported in a MERGE condition: it compares one row of the batch (s.) with the table's row of the same key (t.)"
    )]
    NotInCondition { what: String },
    #[error("the column {column} is not qualified: write {left}.{column} or {right}.{column}")]
    UnqualifiedJoin {
        column: String,
        left: String,
        right: String,
    },
    #[error(
        "{column}: {side} is neither {left} (the join's left input) nor {right} (its right input)"
    )]
    UnknownInput {
        column: String,
        side: String,
        left: String,
        right: String,
    },
    #[error(
        "{what} is not supported in a join condition: it compares a row of one input with a row of the other"
    )]
    NotInJoinCondition { what: String },
    #[error("no column {column:?}{}; the columns are {}", nearest_text(.nearest), .columns.join(", "))]
    UnknownRowColumn {
        column: String,
        nearest: Option<String>,
        columns: Vec<String>,
    },
    #[error("{0}")]
    Planner(String),
}

fn nearest_text(nearest: &Option<String>) -> String {
    nearest
        .as_ref()
        .map(|n| format!(" (did you mean {n}?)"))
        .unwrap_or_default()
}

/// A statement read and checked, not yet planned against a schema.
#[derive(Debug, Clone)]
pub struct Checked {
    statement: Statement,
}

/// Reads `sql` and runs every check that needs no schema.
///
/// # Errors
/// A [`PlanError`] naming the first problem.
pub fn check(sql: &str, functions: &Functions) -> Result<Checked, PlanError> {
    let mut statements = Parser::parse_sql(&SparkSqlDialect {}, sql)
        .map_err(|e| PlanError::Syntax(e.to_string()))?;
    if statements.len() != 1 {
        return Err(refused(
            format!("{} statements", statements.len()),
            ONE_SELECT,
        ));
    }
    let statement = statements.remove(0);
    let Statement::Query(query) = &statement else {
        return Err(refused("a statement other than SELECT", ONE_SELECT));
    };
    let select = check_query(query)?;
    check_select(select)?;
    check_expressions(&statement, functions)?;
    Ok(Checked { statement })
}

fn refused(what: impl Into<String>, pointer: &'static str) -> PlanError {
    PlanError::Refused {
        what: what.into(),
        pointer,
    }
}

fn check_query(query: &Query) -> Result<&Select, PlanError> {
    if query.with.is_some() {
        return Err(refused("WITH", ONE_SELECT));
    }
    if query.order_by.is_some() {
        return Err(refused("ORDER BY", ORDER));
    }
    if query.limit_clause.is_some() || query.fetch.is_some() {
        return Err(refused("LIMIT", ORDER));
    }
    if !query.pipe_operators.is_empty() || !query.locks.is_empty() || query.for_clause.is_some() {
        return Err(refused("this clause", ONE_SELECT));
    }
    match query.body.as_ref() {
        SetExpr::Select(select) => Ok(select),
        SetExpr::SetOperation { op, .. } => Err(refused(
            op.to_string(),
            "the [[source]] tables of a query are unioned already; use [join] to combine inputs",
        )),
        SetExpr::Query(_) => Err(refused("a parenthesised query", SUBQUERY)),
        _ => Err(refused("this statement", ONE_SELECT)),
    }
}

fn check_select(select: &Select) -> Result<(), PlanError> {
    if matches!(select.distinct, Some(Distinct::Distinct | Distinct::On(_))) {
        return Err(refused("DISTINCT", DISTINCT));
    }
    match &select.group_by {
        GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty() => {}
        _ => return Err(refused("GROUP BY", AGGREGATE)),
    }
    if select.having.is_some() {
        return Err(refused("HAVING", AGGREGATE));
    }
    if !select.named_window.is_empty() {
        return Err(refused("WINDOW", WINDOW));
    }
    if select.qualify.is_some() {
        return Err(refused("QUALIFY", WINDOW));
    }
    if !select.sort_by.is_empty() || !select.cluster_by.is_empty() {
        return Err(refused("SORT BY", ORDER));
    }
    if !select.distribute_by.is_empty() {
        return Err(refused("DISTRIBUTE BY", ORDER));
    }
    if !select.lateral_views.is_empty() {
        return Err(refused("LATERAL VIEW", JOIN));
    }
    if select.top.is_some() {
        return Err(refused("TOP", ORDER));
    }
    if select.into.is_some() || select.prewhere.is_some() || !select.connect_by.is_empty() {
        return Err(refused("this clause", ONE_SELECT));
    }
    match select.from.as_slice() {
        [] => Err(refused("a SELECT without FROM", ONE_SELECT)),
        [one] => {
            if !one.joins.is_empty() {
                return Err(refused("JOIN", JOIN));
            }
            match &one.relation {
                TableFactor::Table { name, args, .. } if args.is_none() => {
                    let is_input = matches!(name.0.as_slice(),
                        [ObjectNamePart::Identifier(id)] if id.value.eq_ignore_ascii_case(INPUT_TABLE));
                    if is_input {
                        Ok(())
                    } else {
                        Err(refused(
                            format!("FROM {name}"),
                            "a transform reads its input batch as `input`: write FROM input (other inputs come in through [join])",
                        ))
                    }
                }
                TableFactor::Derived { .. } => Err(refused("a sub-query in FROM", SUBQUERY)),
                _ => Err(refused("this FROM", JOIN)),
            }
        }
        _ => Err(refused("several tables in FROM", JOIN)),
    }
}

fn check_expressions(statement: &Statement, functions: &Functions) -> Result<(), PlanError> {
    let flow = visit_expressions(statement, |e| {
        let problem = match e {
            SqlExpr::Subquery(_) | SqlExpr::InSubquery { .. } | SqlExpr::Exists { .. } => {
                Some(refused("a sub-query", SUBQUERY))
            }
            SqlExpr::Function(f) => {
                let name = f.name.to_string();
                if f.over.is_some() {
                    Some(refused(format!("{name}() OVER (...)"), WINDOW))
                } else if functions.is_aggregate(&name) || f.filter.is_some() {
                    Some(refused(format!("the aggregate {name}()"), AGGREGATE))
                } else if matches!(f.args, FunctionArguments::Subquery(_)) {
                    Some(refused("a sub-query", SUBQUERY))
                } else if functions.scalar(&name).is_none() {
                    Some(PlanError::UnknownFunction {
                        nearest: nearest(&name, functions.names()),
                        function: name,
                    })
                } else {
                    None
                }
            }
            _ => None,
        };
        match problem {
            Some(p) => ControlFlow::Break(p),
            None => ControlFlow::Continue(()),
        }
    });
    match flow {
        ControlFlow::Break(p) => Err(p),
        ControlFlow::Continue(()) => Ok(()),
    }
}

/// The closest of `candidates` to `name` when it is close enough to be a typo.
pub(crate) fn nearest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    candidates
        .map(|c| (strsim::levenshtein(&lower, &c.to_ascii_lowercase()), c))
        .filter(|(d, c)| *d <= (c.len().max(lower.len()) / 3).max(1))
        .min_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)))
        .map(|(_, c)| c.to_owned())
}

/// A transform's statement planned against one input schema.
pub struct SqlPlan {
    /// The input schema this plan was made for.
    pub(crate) input: SchemaRef,
    /// The WHERE clause, if any: a Boolean per row.
    pub(crate) predicate: Option<Arc<dyn PhysicalExpr>>,
    /// One expression per output column, with the type to cast its result
    /// to when DataFusion's type is not one Weir's batches carry.
    pub(crate) columns: Vec<(Arc<dyn PhysicalExpr>, Option<DataType>)>,
    /// The output schema.
    pub(crate) output: SchemaRef,
}

impl std::fmt::Debug for SqlPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlPlan")
            .field("output", &self.output)
            .finish_non_exhaustive()
    }
}

impl SqlPlan {
    /// The schema of the batches the plan produces.
    pub fn output_schema(&self) -> &SchemaRef {
        &self.output
    }
}

/// Plans a checked statement against `input`.
///
/// # Errors
/// A [`PlanError`]: an unknown column (with the nearest one), an output type
/// Weir does not carry, or DataFusion's own planning error.
pub fn plan(
    checked: &Checked,
    input: &SchemaRef,
    functions: &Functions,
) -> Result<SqlPlan, PlanError> {
    let mut statement = checked.statement.clone();
    resolve_names(&mut statement, input)?;
    let provider = Provider::new(input, functions);
    let planner = SqlToRel::new_with_options(
        &provider,
        ParserOptions {
            parse_float_as_decimal: true,
            enable_ident_normalization: false,
            map_string_types_to_utf8view: false,
            ..ParserOptions::default()
        },
    );
    let logical = planner
        .sql_statement_to_plan(statement)
        .map_err(|e| planner_error(e, input))?;
    let logical = TypeCoercion::new()
        .analyze(logical, &provider.options)
        .map_err(|e| planner_error(e, input))?;
    // Some functions exist only to be rewritten (`coalesce` into `CASE`); constants fold.
    let logical = SimplifyExpressions::new()
        .rewrite(
            logical,
            &OptimizerContext::new_with_config_options(Arc::new(provider.options.clone())),
        )
        .map_err(|e| planner_error(e, input))?
        .data;
    let Shape {
        exprs,
        output: out_schema,
        predicate,
        reads: scan_schema,
    } = shape(&logical)?;
    let props = datafusion_expr::execution_props::ExecutionProps::new();
    let ctx = datafusion_expr::physical_planning_context::PhysicalPlanningContext::default();
    let physical = |e: &Expr| {
        create_physical_expr(e, &scan_schema, &props, &ctx).map_err(|e| planner_error(e, input))
    };
    let predicate = predicate.as_ref().map(&physical).transpose()?;
    let mut fields = Vec::with_capacity(exprs.len());
    let mut columns = Vec::with_capacity(exprs.len());
    for (i, e) in exprs.iter().enumerate() {
        let field = out_schema.field(i);
        if fields.iter().any(|f: &Field| f.name() == field.name()) {
            return Err(PlanError::DuplicateColumn(field.name().clone()));
        }
        let expr = physical(e)?;
        // The type the physical expression returns (it sees literal arguments, such as
        // round's digits, that the logical plan's type did not).
        let returns = expr
            .data_type(scan_schema.as_arrow())
            .map_err(|e| planner_error(e, input))?;
        let target = weir_type(field.name(), &returns)?;
        let data_type = target.clone().unwrap_or(returns);
        fields.push(Field::new(field.name(), data_type, field.is_nullable()));
        columns.push((expr, target));
    }
    if let Some(p) = &predicate {
        let t = p
            .data_type(scan_schema.as_arrow())
            .map_err(|e| planner_error(e, input))?;
        if t != DataType::Boolean {
            return Err(PlanError::Planner(format!(
                "WHERE must be a condition, not a {t} value"
            )));
        }
    }
    Ok(SqlPlan {
        input: Arc::clone(input),
        predicate,
        columns,
        output: Arc::new(Schema::new(fields)),
    })
}

/// Column names as Spark resolves them (without regard to case), and the
/// names of unaliased output columns as Spark prints them.
fn resolve_names(statement: &mut Statement, input: &SchemaRef) -> Result<(), PlanError> {
    let columns: Vec<&str> = input.fields().iter().map(|f| f.name().as_str()).collect();
    let exact = |ident: &mut Ident| -> Result<(), PlanError> {
        if columns.contains(&ident.value.as_str()) {
            return Ok(());
        }
        let matching: Vec<&&str> = columns
            .iter()
            .filter(|c| c.eq_ignore_ascii_case(&ident.value))
            .collect();
        match matching.as_slice() {
            [one] => {
                ident.value = (**one).to_owned();
                ident.quote_style = Some('`');
                Ok(())
            }
            _ => Err(PlanError::UnknownColumn {
                nearest: nearest(&ident.value, columns.iter().copied()),
                column: ident.value.clone(),
                columns: columns.iter().map(|c| (*c).to_owned()).collect(),
            }),
        }
    };
    // Unaliased expressions first, while they still read as the user wrote them.
    if let Statement::Query(query) = statement
        && let SetExpr::Select(select) = query.body.as_mut()
    {
        for item in &mut select.projection {
            if let SelectItem::UnnamedExpr(e) = item
                && !matches!(e, SqlExpr::Identifier(_) | SqlExpr::CompoundIdentifier(_))
            {
                let name = spark_name(e);
                *item = SelectItem::ExprWithAlias {
                    expr: e.clone(),
                    alias: Ident::with_quote('`', name),
                };
            }
        }
    }
    let flow = visit_expressions_mut(statement, |e| {
        let result = match e {
            SqlExpr::Identifier(ident) => exact(ident),
            SqlExpr::CompoundIdentifier(parts) => match parts.as_mut_slice() {
                [_table, column] => exact(column),
                _ => Err(PlanError::UnknownColumn {
                    column: e.to_string(),
                    nearest: None,
                    columns: columns.iter().map(|c| (*c).to_owned()).collect(),
                }),
            },
            _ => Ok(()),
        };
        match result {
            Ok(()) => ControlFlow::Continue(()),
            Err(p) => ControlFlow::Break(p),
        }
    });
    match flow {
        ControlFlow::Break(p) => Err(p),
        ControlFlow::Continue(()) => Ok(()),
    }
}

/// Spark's name for an unaliased expression: its text, binary operations in
/// parentheses (`(amount * 2)`), string literals without quotes.
pub(crate) fn spark_name(e: &SqlExpr) -> String {
    match e {
        SqlExpr::BinaryOp { .. } => format!("({e})"),
        SqlExpr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
            _ => e.to_string(),
        },
        _ => e.to_string(),
    }
}

/// A planned statement taken apart: what each output column and the WHERE
/// clause compute, over the rows as the scan names them.
struct Shape {
    exprs: Vec<Expr>,
    output: Arc<DFSchema>,
    predicate: Option<Expr>,
    reads: Arc<DFSchema>,
}

/// The projection over an optional filter over the scan; any other plan
/// node is refused.
fn shape(plan: &LogicalPlan) -> Result<Shape, PlanError> {
    let LogicalPlan::Projection(projection) = plan else {
        return Err(unexpected(plan));
    };
    let mut below = projection.input.as_ref();
    let mut predicate = None;
    loop {
        match below {
            LogicalPlan::Filter(filter) => {
                if predicate.is_some() {
                    return Err(unexpected(below));
                }
                predicate = Some(filter.predicate.clone());
                below = filter.input.as_ref();
            }
            LogicalPlan::SubqueryAlias(alias) => below = alias.input.as_ref(),
            LogicalPlan::TableScan(_) => break,
            other => return Err(unexpected(other)),
        }
    }
    Ok(Shape {
        exprs: projection.expr.clone(),
        output: Arc::clone(&projection.schema),
        predicate,
        // The filter and the projection read the rows as the scan (or its alias) names them.
        reads: Arc::clone(projection.input.schema()),
    })
}

fn unexpected(plan: &LogicalPlan) -> PlanError {
    refused(format!("a {} step", plan.display()), ONE_SELECT)
}

/// The type a column of this type becomes in Weir's batches, or `None` when
/// it is one already; an error for types with no faithful counterpart.
fn weir_type(column: &str, t: &DataType) -> Result<Option<DataType>, PlanError> {
    let unsupported = |hint| PlanError::UnsupportedType {
        column: column.to_owned(),
        data_type: t.to_string(),
        hint,
    };
    Ok(match t {
        DataType::Boolean
        | DataType::Int32
        | DataType::Int64
        | DataType::Float64
        | DataType::Utf8
        | DataType::Date32
        | DataType::Decimal128(_, _) => None,
        DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => None,
        DataType::Timestamp(_, _) => Some(DataType::Timestamp(
            TimeUnit::Microsecond,
            Some(UTC_OFFSET.into()),
        )),
        DataType::Int8 | DataType::Int16 | DataType::UInt8 | DataType::UInt16 => {
            Some(DataType::Int32)
        }
        DataType::UInt32 | DataType::UInt64 => Some(DataType::Int64),
        DataType::Float16 | DataType::Float32 => Some(DataType::Float64),
        DataType::Utf8View | DataType::LargeUtf8 | DataType::Null => Some(DataType::Utf8),
        DataType::Date64 => Some(DataType::Date32),
        DataType::Decimal32(p, s) | DataType::Decimal64(p, s) => Some(DataType::Decimal128(*p, *s)),
        DataType::Decimal256(_, _) => {
            return Err(unsupported(
                "decimals have at most 38 digits: CAST the result to DECIMAL(38, s)",
            ));
        }
        DataType::List(_)
        | DataType::LargeList(_)
        | DataType::ListView(_)
        | DataType::LargeListView(_)
        | DataType::FixedSizeList(_, _)
        | DataType::Struct(_)
        | DataType::Map(_, _) => {
            return Err(unsupported(
                "take the parts you need out of it (an element, a field, get_json_object, to_json)",
            ));
        }
        _ => {
            return Err(unsupported(
                "CAST it to STRING, BIGINT, DOUBLE, DECIMAL, DATE or TIMESTAMP",
            ));
        }
    })
}

/// DataFusion's error, as Weir's: an unknown column gets the nearest one.
fn planner_error(error: DataFusionError, input: &SchemaRef) -> PlanError {
    let columns: Vec<String> = input.fields().iter().map(|f| f.name().clone()).collect();
    if let DataFusionError::SchemaError(schema_error, _) = error.find_root()
        && let SchemaError::FieldNotFound { field, .. } = schema_error.as_ref()
    {
        return PlanError::UnknownColumn {
            nearest: nearest(&field.name, columns.iter().map(String::as_str)),
            column: field.name.clone(),
            columns,
        };
    }
    // DataFusion's messages carry a "Error during planning: " style prefix.
    let text = error.find_root().to_string();
    if let Some((_, rest)) = text.split_once("unqualified field name ") {
        // "qualified field name input.x and unqualified field name x", "duplicate ...".
        let name = rest.split_whitespace().next().unwrap_or(rest);
        return PlanError::DuplicateColumn(name.to_owned());
    }
    if let Some((_, rest)) = text.split_once("non-boolean predicate ") {
        return PlanError::Planner(format!("WHERE must be a condition (BOOLEAN), not {rest}"));
    }
    let text = text
        .split_once(": ")
        .filter(|(head, _)| head.starts_with("Error during") || head.ends_with("error"))
        .map_or(text.as_str(), |(_, rest)| rest)
        .to_owned();
    PlanError::Planner(text)
}

/// What DataFusion's planner may look up: the input as `input`, and the functions.
struct Provider<'a> {
    table: Arc<dyn TableSource>,
    functions: &'a Functions,
    options: ConfigOptions,
    planners: Vec<Arc<dyn ExprPlanner>>,
}

impl<'a> Provider<'a> {
    fn new(input: &SchemaRef, functions: &'a Functions) -> Self {
        let mut options = ConfigOptions::default();
        options.execution.time_zone = Some(UTC_OFFSET.to_owned());
        Self {
            table: Arc::new(LogicalTableSource::new(Arc::clone(input))),
            functions,
            options,
            planners: vec![
                Arc::new(datafusion_spark::planner::SparkFunctionPlanner),
                Arc::new(datafusion_functions::core::planner::CoreFunctionPlanner::default()),
                Arc::new(datafusion_functions::unicode::planner::UnicodeFunctionPlanner),
                Arc::new(datafusion_functions::datetime::planner::DatetimeFunctionPlanner),
            ],
        }
    }
}

impl ContextProvider for Provider<'_> {
    fn get_table_source(
        &self,
        name: TableReference,
    ) -> datafusion_common::Result<Arc<dyn TableSource>> {
        if name.schema().is_none() && name.table().eq_ignore_ascii_case(INPUT_TABLE) {
            Ok(Arc::clone(&self.table))
        } else {
            datafusion_common::plan_err!("no table {name}: a transform reads `input`")
        }
    }

    fn get_expr_planners(&self) -> &[Arc<dyn ExprPlanner>] {
        &self.planners
    }

    fn get_function_meta(&self, name: &str) -> Option<Arc<ScalarUDF>> {
        self.functions.scalar(name)
    }

    fn get_higher_order_meta(&self, _name: &str) -> Option<Arc<HigherOrderUDF>> {
        None
    }

    fn get_aggregate_meta(&self, _name: &str) -> Option<Arc<AggregateUDF>> {
        None
    }

    fn get_window_meta(&self, _name: &str) -> Option<Arc<WindowUDF>> {
        None
    }

    fn get_variable_type(&self, _variable_names: &[String]) -> Option<DataType> {
        None
    }

    fn options(&self) -> &ConfigOptions {
        &self.options
    }

    fn udf_names(&self) -> Vec<String> {
        self.functions.names().map(str::to_owned).collect()
    }

    fn higher_order_function_names(&self) -> Vec<String> {
        Vec::new()
    }

    fn udaf_names(&self) -> Vec<String> {
        Vec::new()
    }

    fn udwf_names(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Checks and plans `sql` in one go, with its own clock (for validation): `plugins` are the
/// `[[function]]`s it may call besides the built-in functions.
///
/// # Errors
/// As [`check`] and [`plan`].
pub fn plan_sql(
    sql: &str,
    input: &SchemaRef,
    plugins: &[super::PluginFunction],
) -> Result<SqlPlan, PlanError> {
    let functions = Functions::with_plugins(&BatchClock::default(), plugins);
    plan(&check(sql, &functions)?, input, &functions)
}
