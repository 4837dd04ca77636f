//! The `delta-merge` host import: a foreachBatch sink MERGEs into Delta tables that the pipeline
//! file grants it, and the host does the work natively.
//!
//! Why a host capability rather than a plugin writing Delta itself: a plugin has no filesystem
//! and no Delta library, and MERGE must be idempotent by batch id across crashes, which only the
//! host can promise (it knows the query id and batch id, and commits the txn action with the
//! data). The sink decides *what* to merge (filtering, normalising, several tables per batch);
//! the host decides *how*.
//!
//! The tables live as long as the sink, across instance restarts after a trap, so a table is
//! opened once. Each table's txn app id is `<query id>/<table name>`: two names granted on one
//! path count their batches apart. A second merge into the same table within one batch is
//! refused: the txn would make it a silent no-op.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use wasmtime::component::Resource;

use super::bindings::merge_sink::weir::plugin::delta_merge;
use super::bindings::wit;
use super::convert;
use super::state::{BatchInfo, HostBatch, HostState};
use crate::failpoint::Failpoint;
use crate::sink::delta_merge::{DeltaMerge, DeltaMergeOptions, MergeOutcome};
use crate::spec::MergeTableSpec;

/// The interface's name as components import it.
pub(crate) const INTERFACE: &str = "weir:plugin/delta-merge@0.1.0";

/// The tables one sink may merge into, shared by its instances.
pub(crate) type SharedGrants = Arc<Mutex<MergeGrants>>;

/// The granted tables of one plugin sink and the batch in progress.
#[derive(Debug)]
pub(crate) struct MergeGrants {
    specs: BTreeMap<String, MergeTableSpec>,
    open: BTreeMap<String, DeltaMerge>,
    failpoint: Option<Failpoint>,
    query_id: String,
    batch_id: u64,
    /// Tables merged into during the current call.
    merged: Vec<String>,
}

impl MergeGrants {
    pub(crate) fn new(
        specs: BTreeMap<String, MergeTableSpec>,
        failpoint: Option<Failpoint>,
    ) -> SharedGrants {
        Arc::new(Mutex::new(Self {
            specs,
            open: BTreeMap::new(),
            failpoint,
            query_id: String::new(),
            batch_id: 0,
            merged: Vec::new(),
        }))
    }

    /// A `write-batch` call for `info` begins.
    pub(crate) fn begin(&mut self, info: &BatchInfo) {
        self.query_id.clone_from(&info.query_id);
        self.batch_id = info.batch_id;
        self.merged.clear();
    }

    fn merge(
        &mut self,
        plugin: &str,
        table: &str,
        rows: &RecordBatch,
    ) -> Result<delta_merge::MergeResult, wit::PluginError> {
        let batch_id = self.batch_id;
        let Some(spec) = self.specs.get(table) else {
            let granted: Vec<&str> = self.specs.keys().map(String::as_str).collect();
            return Err(fatal(format!(
                "delta-merge into table {table:?} is not granted to plugin {plugin} \
                 (granted: [{}]); grant it in the pipeline file as \
                 [sink.capabilities.delta_merge.{table}] with path and keys",
                granted.join(", ")
            )));
        };
        if self.merged.iter().any(|t| t == table) {
            return Err(fatal(format!(
                "plugin {plugin} merged into table {table:?} twice in batch {batch_id}; \
                 merge each table once per batch"
            )));
        }
        if !self.open.contains_key(table) {
            let merge = DeltaMerge::new(DeltaMergeOptions {
                table: spec.clone(),
                app_id: format!("{}/{table}", self.query_id),
                failpoint: self.failpoint,
            })
            .map_err(|e| fatal(format!("plugin {plugin}: {e}")))?;
            self.open.insert(table.to_owned(), merge);
        }
        let Some(merge) = self.open.get_mut(table) else {
            return Err(fatal(format!(
                "plugin {plugin}: table {table:?} was not opened"
            )));
        };
        self.merged.push(table.to_owned());
        match merge.merge(batch_id, rows) {
            Ok(MergeOutcome::Skipped) => Ok(delta_merge::MergeResult {
                skipped: true,
                updated: 0,
                inserted: 0,
            }),
            Ok(MergeOutcome::Empty) => Ok(delta_merge::MergeResult {
                skipped: false,
                updated: 0,
                inserted: 0,
            }),
            Ok(MergeOutcome::Merged { counts, .. }) => Ok(delta_merge::MergeResult {
                skipped: false,
                updated: counts.updated,
                inserted: counts.inserted,
            }),
            Err(e) => Err(wit::PluginError {
                kind: if e.is_retryable() {
                    wit::ErrorKind::Retryable
                } else {
                    wit::ErrorKind::Fatal
                },
                message: e.to_string(),
                row: None,
            }),
        }
    }
}

fn fatal(message: String) -> wit::PluginError {
    wit::PluginError {
        kind: wit::ErrorKind::Fatal,
        message,
        row: None,
    }
}

impl delta_merge::Host for HostState {
    fn merge(
        &mut self,
        table: String,
        input: Resource<HostBatch>,
        rows: Option<wit::TransformOutput>,
    ) -> wasmtime::Result<Result<delta_merge::MergeResult, wit::PluginError>> {
        self.at_host_call();
        let plugin = Arc::clone(&self.plugin);
        let Some(grants) = self.delta_merge.clone() else {
            return Ok(Err(fatal(format!(
                "plugin {plugin}: delta-merge is not granted: no [sink.capabilities.delta_merge] \
                 table in the pipeline file (asked for {table:?})"
            ))));
        };
        let batch = &self.table.get(&input)?.batch;
        let rows = match rows {
            None => batch.clone(),
            Some(wit::TransformOutput::Edit(edit)) => match convert::apply_edit(batch, edit) {
                Ok(rows) => rows,
                Err(e) => return Ok(Err(invalid(&plugin, &table, &e))),
            },
            Some(wit::TransformOutput::Ipc(bytes)) => match convert::from_ipc(&bytes) {
                Ok(rows) => rows,
                Err(e) => return Ok(Err(invalid(&plugin, &table, &e.to_string()))),
            },
        };
        // A poisoned lock only means an earlier call panicked; the grants stay consistent.
        let mut grants = grants.lock().unwrap_or_else(|p| p.into_inner());
        Ok(grants.merge(&plugin, &table, &rows))
    }
}

fn invalid(plugin: &str, table: &str, reason: &str) -> wit::PluginError {
    wit::PluginError {
        kind: wit::ErrorKind::InvalidInput,
        message: format!(
            "plugin {plugin}: the rows to merge into {table:?} are malformed: {reason}"
        ),
        row: None,
    }
}
