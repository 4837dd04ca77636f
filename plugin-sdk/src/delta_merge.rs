//! MERGE into Delta tables from a foreachBatch sink (cargo feature `merge-sink`).
//!
//! The pipeline file grants the sink tables by name, each with its path, keys, condition and
//! dedup policy (`[sink.capabilities.delta_merge.<name>]`); the sink decides which rows go where
//! and the host performs the merge natively, exactly once per batch id and table. A sink may merge
//! into several tables per batch, each at most once.
//!
//! ```no_run
//! use weir_plugin_sdk::{Batch, BatchInfo, Output, PluginError, Selection};
//!
//! // The body of a sink's `write_batch`: paid orders go into the granted table "orders".
//! fn write_batch(batch: &Batch<'_>, _info: &BatchInfo) -> Result<(), PluginError> {
//!     let status = batch.column("status")?;
//!     let paid = Selection::from_fn(batch.num_rows(), |r| status.str(r) == Some("paid"));
//!     weir_plugin_sdk::delta_merge::merge("orders", batch, Some(Output::keep(paid)))?;
//!     Ok(())
//! }
//! ```

use crate::batch::Batch;
use crate::error::PluginError;
use crate::output::Output;

/// What the host did with one merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MergeResult {
    /// The table already held this batch (a replay after a crash): nothing changed.
    pub skipped: bool,
    /// Target rows replaced by rows of the batch.
    pub updated: u64,
    /// Rows of the batch inserted.
    pub inserted: u64,
}

/// Merges `batch` into the granted table `table`; with `rows`, the batch as changed by that
/// output (an edit of the batch, such as [`Output::keep`], or a whole batch as Arrow IPC), as a
/// transform would return it.
///
/// # Errors
/// The host's error as a [`PluginError`]: the table is not granted, merged twice in one batch,
/// duplicate keys, a missing column, a commit conflict (retryable). Outside the host (native
/// tests, a build without the `merge-sink` feature) always an error.
pub fn merge(
    table: &str,
    batch: &Batch<'_>,
    rows: Option<Output>,
) -> Result<MergeResult, PluginError> {
    imp(table, batch, rows)
}

#[cfg(all(target_arch = "wasm32", feature = "merge-sink"))]
fn imp(table: &str, batch: &Batch<'_>, rows: Option<Output>) -> Result<MergeResult, PluginError> {
    crate::guest::merge::merge(table, batch, rows)
}

#[cfg(not(all(target_arch = "wasm32", feature = "merge-sink")))]
fn imp(table: &str, _batch: &Batch<'_>, _rows: Option<Output>) -> Result<MergeResult, PluginError> {
    Err(PluginError::fatal(format!(
        "delta-merge into {table:?}: only the Weir host can merge, in a wasm32 build with the \
         SDK's `merge-sink` feature"
    )))
}
