//! The batch a plugin is handed. In the guest it wraps the host's `batch` resource and pulls only
//! what the plugin asks for (a filter on one column of a wide batch copies one column); in native
//! tests it wraps a [`MemoryBatch`]. Plugin code is the same for both.

use std::cell::OnceCell;

use crate::column::Column;
use crate::error::PluginError;
use crate::schema::Schema;
use crate::testing::MemoryBatch;

/// What the plugin is being called for. A replayed batch has the same `batch_id` and
/// `timestamp_micros` and a higher `attempt`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BatchInfo {
    /// The query's stable id.
    pub query_id: String,
    /// The micro-batch id.
    pub batch_id: u64,
    /// 0 the first time the batch runs; higher on a retry or a replay after a restart.
    pub attempt: u32,
    /// The batch's timestamp: the plugin's clock, identical on replay.
    pub timestamp_micros: i64,
    /// The partition this call is for.
    pub partition: u32,
}

impl BatchInfo {
    /// Info for batch `batch_id`, first attempt, everything else zero (handy in tests).
    pub fn new(batch_id: u64) -> Self {
        Self {
            batch_id,
            ..Self::default()
        }
    }
}

/// The host side of a batch, implemented for each world's generated resource type.
#[cfg(all(
    target_arch = "wasm32",
    any(feature = "transform", feature = "sink", feature = "scalar-function")
))]
pub(crate) trait HostBatch {
    fn num_rows(&self) -> u32;
    fn schema(&self) -> Schema;
    /// Column `index`, which the caller has checked is in range.
    fn column(&self, index: u32, rows: usize) -> Column;
    fn to_ipc(&self) -> Vec<u8>;
    /// The generated resource itself, to lend it back to the host (`delta-merge`).
    #[cfg(feature = "merge-sink")]
    fn as_any(&self) -> &dyn std::any::Any;
}

enum Source<'a> {
    Memory(&'a MemoryBatch),
    #[cfg(all(
        target_arch = "wasm32",
        any(feature = "transform", feature = "sink", feature = "scalar-function")
    ))]
    Host(&'a dyn HostBatch),
}

/// One micro-batch, borrowed for the duration of a call.
pub struct Batch<'a> {
    source: Source<'a>,
    schema: OnceCell<Schema>,
    rows: OnceCell<usize>,
}

impl std::fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("rows", &self.rows.get())
            .field("schema", &self.schema.get())
            .finish_non_exhaustive()
    }
}

impl<'a> Batch<'a> {
    /// A batch over an in-memory batch (what [`crate::testing`] hands to plugins).
    pub fn from_memory(batch: &'a MemoryBatch) -> Self {
        Self::new(Source::Memory(batch))
    }

    #[cfg(all(
        target_arch = "wasm32",
        any(feature = "transform", feature = "sink", feature = "scalar-function")
    ))]
    pub(crate) fn from_host(batch: &'a dyn HostBatch) -> Self {
        Self::new(Source::Host(batch))
    }

    /// The host's batch behind this one (none for an in-memory batch).
    #[cfg(all(target_arch = "wasm32", feature = "merge-sink"))]
    pub(crate) fn host(&self) -> Option<&'a dyn HostBatch> {
        match self.source {
            Source::Host(h) => Some(h),
            Source::Memory(_) => None,
        }
    }

    fn new(source: Source<'a>) -> Self {
        Self {
            source,
            schema: OnceCell::new(),
            rows: OnceCell::new(),
        }
    }

    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        *self.rows.get_or_init(|| match &self.source {
            Source::Memory(m) => m.num_rows(),
            #[cfg(all(
                target_arch = "wasm32",
                any(feature = "transform", feature = "sink", feature = "scalar-function")
            ))]
            Source::Host(h) => h.num_rows() as usize,
        })
    }

    /// The batch's schema (fetched from the host once, then cached).
    pub fn schema(&self) -> &Schema {
        self.schema.get_or_init(|| match &self.source {
            Source::Memory(m) => m.schema(),
            #[cfg(all(
                target_arch = "wasm32",
                any(feature = "transform", feature = "sink", feature = "scalar-function")
            ))]
            Source::Host(h) => h.schema(),
        })
    }

    /// The column named `name` (one copy across the boundary per call: keep it if you need it
    /// twice).
    ///
    /// # Errors
    /// [`PluginError::invalid_input`] naming the column and the batch's columns when it has none
    /// of that name.
    pub fn column(&self, name: &str) -> Result<Column, PluginError> {
        match self.schema().index_of(name) {
            Some(index) => self.column_at(index),
            None => {
                let names: Vec<&str> = self
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect();
                Err(PluginError::invalid_input(format!(
                    "the batch has no column `{name}` (columns: {})",
                    names.join(", ")
                )))
            }
        }
    }

    /// The column at position `index` of [`Batch::schema`].
    ///
    /// # Errors
    /// [`PluginError::invalid_input`] when `index` is out of range.
    pub fn column_at(&self, index: usize) -> Result<Column, PluginError> {
        let width = self.schema().len();
        if index >= width {
            return Err(PluginError::invalid_input(format!(
                "column index {index} is out of range for a batch of {width} columns"
            )));
        }
        match &self.source {
            Source::Memory(m) => Ok(m.columns()[index].clone()),
            #[cfg(all(
                target_arch = "wasm32",
                any(feature = "transform", feature = "sink", feature = "scalar-function")
            ))]
            Source::Host(h) => {
                let index = u32::try_from(index).map_err(|_| {
                    PluginError::invalid_input(format!("column index {index} exceeds u32"))
                })?;
                Ok(h.column(index, self.num_rows()))
            }
        }
    }

    /// The whole batch as an Arrow IPC stream, for plugins that carry their own Arrow library.
    ///
    /// # Errors
    /// Natively, [`PluginError::invalid_input`] unless the [`MemoryBatch`] was given IPC bytes with
    /// [`MemoryBatch::with_ipc`] (the SDK has no Arrow encoder of its own). In the guest it does not
    /// fail.
    pub fn to_ipc(&self) -> Result<Vec<u8>, PluginError> {
        match &self.source {
            Source::Memory(m) => m.ipc().map(<[u8]>::to_vec).ok_or_else(|| {
                PluginError::invalid_input(
                    "this MemoryBatch has no IPC bytes: give them with MemoryBatch::with_ipc",
                )
            }),
            #[cfg(all(
                target_arch = "wasm32",
                any(feature = "transform", feature = "sink", feature = "scalar-function")
            ))]
            Source::Host(h) => Ok(h.to_ipc()),
        }
    }
}
