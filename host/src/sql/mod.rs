//! SQL expressions: `[[transform]] sql = "SELECT ... FROM input WHERE ..."`,
//! evaluated natively on Arrow.
//!
//! Weir takes DataFusion's SQL planner, type coercion and physical
//! expressions, not its execution engine: a transform is one projection over
//! one filter of one batch, so sessions, optimiser passes and operators would
//! only add cost. The statement is planned once per input schema; a batch is
//! one predicate evaluation, one filter kernel and one evaluation per output
//! column. Spark's functions come first (`datafusion-spark`), DataFusion's
//! fill the rest, and the batch clock stands in for `now()` so that a replayed
//! batch computes the same bytes as its first run.

mod aggregate;
mod condition;
mod functions;
mod plan;
mod transform;

pub use aggregate::{Lowered, lower as lower_aggregate, needs_lowering};
pub use condition::{ConditionPlan, JoinConditionParts, RowCondition, Sides};
pub use functions::{PluginCall, PluginFunction};
pub use plan::{INPUT_TABLE, PlanError, SqlPlan, plan_sql};
pub use transform::SqlTransform;

/// Whether `name` (any case) is a function of Weir's SQL, scalar or aggregate: a plugin's
/// `[[function]]` may not take such a name.
pub fn is_builtin_function(name: &str) -> bool {
    let functions = functions::Functions::new(&functions::BatchClock::default());
    functions.scalar(name).is_some() || functions.is_aggregate(name)
}

/// A SQL transform that could not be planned or failed a batch.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    #[error("transform {transform}: {error}")]
    Plan {
        transform: String,
        #[source]
        error: PlanError,
    },
    #[error("transform {transform} failed batch {batch_id}: {message}")]
    Evaluate {
        transform: String,
        batch_id: u64,
        message: String,
    },
}

impl SqlError {
    /// Whether running the batch again may succeed: never, the same rows
    /// give the same failure.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Plan { .. } | Self::Evaluate { .. } => false,
        }
    }
}

/// The SQL check `weir validate` runs when the input schema is not known
/// until the query starts: everything but column names and types.
///
/// # Errors
/// The first [`PlanError`] found.
pub fn check_sql(sql: &str, plugins: &[PluginFunction]) -> Result<(), PlanError> {
    let functions = functions::Functions::with_plugins(&functions::BatchClock::default(), plugins);
    plan::check(sql, &functions).map(drop)
}

#[cfg(test)]
mod tests;
