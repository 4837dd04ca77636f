//! The SQL transform as the query runs it: a filter kernel and one
//! evaluation per output column for each batch, with the plan made once.

use std::sync::Arc;

use arrow_array::{Array, RecordBatch, RecordBatchOptions};
use arrow_schema::SchemaRef;
use arrow_select::filter::filter_record_batch;
use datafusion_common::cast::as_boolean_array;

use super::SqlError;
use super::functions::{BatchClock, Functions, PluginFunction};
use super::plan::{self, Checked, SqlPlan};
use crate::plugin::BatchInfo;

/// A `[[transform]] sql`, planned for its input schema.
pub struct SqlTransform {
    name: String,
    checked: Checked,
    functions: Functions,
    clock: BatchClock,
    plan: SqlPlan,
}

impl std::fmt::Debug for SqlTransform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlTransform")
            .field("name", &self.name)
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

impl SqlTransform {
    /// Checks and plans `sql` against `input`; it may call `plugins`' functions besides the
    /// built-in ones.
    ///
    /// # Errors
    /// [`SqlError::Plan`] naming the transform and the problem.
    pub fn new(
        name: &str,
        sql: &str,
        input: &SchemaRef,
        plugins: &[PluginFunction],
    ) -> Result<Self, SqlError> {
        let clock = BatchClock::default();
        let functions = Functions::with_plugins(&clock, plugins);
        let fail = |error| SqlError::Plan {
            transform: name.to_owned(),
            error,
        };
        let checked = plan::check(sql, &functions).map_err(fail)?;
        let plan = plan::plan(&checked, input, &functions).map_err(fail)?;
        Ok(Self {
            name: name.to_owned(),
            checked,
            functions,
            clock,
            plan,
        })
    }

    /// The transform's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The schema of the batches it produces.
    pub fn output_schema(&self) -> &SchemaRef {
        self.plan.output_schema()
    }

    /// Filters and projects one batch.
    ///
    /// # Errors
    /// [`SqlError::Evaluate`] when an expression fails on a row (a cast of
    /// text that is no number, a division by zero, …); the batch then fails.
    pub fn process(
        &mut self,
        batch: &RecordBatch,
        info: &BatchInfo,
    ) -> Result<RecordBatch, SqlError> {
        if !Arc::ptr_eq(batch.schema_ref(), &self.plan.input)
            && batch.schema_ref() != &self.plan.input
        {
            // Planned once per input schema, not per batch.
            let fail = |error| SqlError::Plan {
                transform: self.name.clone(),
                error,
            };
            self.plan =
                plan::plan(&self.checked, batch.schema_ref(), &self.functions).map_err(fail)?;
        }
        self.clock.begin(info);
        let fail = |e: &dyn std::fmt::Display| SqlError::Evaluate {
            transform: self.name.clone(),
            batch_id: info.batch_id,
            message: e.to_string(),
        };
        let filtered;
        let rows = match &self.plan.predicate {
            Some(predicate) => {
                let mask = predicate
                    .evaluate(batch)
                    .and_then(|v| v.into_array(batch.num_rows()))
                    .map_err(|e| fail(&e))?;
                let mask = as_boolean_array(&mask).map_err(|e| fail(&e))?;
                filtered = filter_record_batch(batch, mask).map_err(|e| fail(&e))?;
                &filtered
            }
            None => batch,
        };
        let n = rows.num_rows();
        let mut columns = Vec::with_capacity(self.plan.columns.len());
        for (expr, cast_to) in &self.plan.columns {
            let mut array = expr
                .evaluate(rows)
                .and_then(|v| v.into_array(n))
                .map_err(|e| fail(&e))?;
            if let Some(t) = cast_to {
                array = arrow_cast::cast(&array, t).map_err(|e| fail(&e))?;
            }
            debug_assert_eq!(array.len(), n);
            columns.push(array);
        }
        RecordBatch::try_new_with_options(
            Arc::clone(&self.plan.output),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(n)),
        )
        .map_err(|e| fail(&e))
    }
}
