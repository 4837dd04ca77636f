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
//!
//! A MERGE is bounded by the call's deadline (`limits.timeout`, see `deadline`): it runs on a
//! thread of its own while the call waits for it until the deadline, then fails with the
//! plugin's time-limit error. A merge cannot be stopped halfway safely, so one that outlasts its
//! call runs on to its end (its commit, if any, carries the batch's txn, so the rerun of the
//! batch skips it); the next merge into that table first waits for it, within its own call's
//! deadline, so that one sink never has two merges into a table in flight.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arrow_array::RecordBatch;
use wasmtime::component::Resource;

use super::bindings::merge_sink::weir::plugin::delta_merge;
use super::bindings::wit;
use super::convert;
use super::deadline::{self, DeadlineExceeded};
use super::state::{BatchInfo, HostBatch, HostState};
use crate::failpoint::Failpoint;
use crate::sink::delta_merge::{DeltaMerge, DeltaMergeError, DeltaMergeOptions, MergeOutcome};
use crate::spec::MergeTableSpec;

/// The interface's name as components import it.
pub(crate) const INTERFACE: &str = "weir:plugin/delta-merge@0.1.0";

/// The tables one sink may merge into, shared by its instances.
pub(crate) type SharedGrants = Arc<Mutex<MergeGrants>>;

/// What a merge's thread hands back: the merger, for the next batch, and the outcome.
type Merged = (Box<DeltaMerge>, Result<MergeOutcome, DeltaMergeError>);

/// A granted table once opened.
#[derive(Debug)]
enum Table {
    /// No merge in flight.
    Idle(Box<DeltaMerge>),
    /// A merge that outlasted the call that started it, still running.
    Busy(Running<Merged>),
}

/// Work running on a thread of its own, and where its result arrives.
#[derive(Debug)]
struct Running<T> {
    result: mpsc::Receiver<T>,
}

/// How waiting for [`Running`] work ended.
enum Waited<T> {
    Done(T),
    /// The deadline came first; the work goes on.
    Late(Running<T>),
    /// The work's thread ended without a result (it panicked).
    Lost,
}

impl<T: Send + 'static> Running<T> {
    fn start(name: &str, work: impl FnOnce() -> T + Send + 'static) -> std::io::Result<Self> {
        let (send, result) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                // Nobody waits any more when the sink is gone; the result is dropped.
                let _ = send.send(work());
            })?;
        Ok(Self { result })
    }

    /// Waits for the result until `deadline` (`None`: as long as it takes).
    fn wait(self, deadline: Option<Instant>) -> Waited<T> {
        let got = match deadline {
            None => self
                .result
                .recv()
                .map_err(|_| RecvTimeoutError::Disconnected),
            Some(deadline) => self
                .result
                .recv_timeout(deadline.saturating_duration_since(Instant::now())),
        };
        match got {
            Ok(value) => Waited::Done(value),
            Err(RecvTimeoutError::Timeout) => Waited::Late(self),
            Err(RecvTimeoutError::Disconnected) => Waited::Lost,
        }
    }
}

/// The granted tables of one plugin sink and the batch in progress.
#[derive(Debug)]
pub(crate) struct MergeGrants {
    specs: BTreeMap<String, MergeTableSpec>,
    open: BTreeMap<String, Table>,
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

    /// Merges `rows` into granted `table` for the batch in progress, within `deadline`.
    ///
    /// # Errors
    /// The outer error, [`DeadlineExceeded`], fails the call with the plugin's time-limit
    /// error; the inner one is the plugin's to handle (not granted, twice in one batch, a
    /// failed merge).
    fn merge(
        &mut self,
        plugin: &str,
        table: &str,
        rows: &RecordBatch,
        deadline: Option<Instant>,
    ) -> wasmtime::Result<Result<delta_merge::MergeResult, wit::PluginError>> {
        const DURING: &str = "delta-merge.merge";
        let batch_id = self.batch_id;
        let Some(spec) = self.specs.get(table) else {
            let granted: Vec<&str> = self.specs.keys().map(String::as_str).collect();
            return Ok(Err(fatal(format!(
                "delta-merge into table {table:?} is not granted to plugin {plugin} \
                 (granted: [{}]); grant it in the pipeline file as \
                 [sink.capabilities.delta_merge.{table}] with path and keys",
                granted.join(", ")
            ))));
        };
        if self.merged.iter().any(|t| t == table) {
            return Ok(Err(fatal(format!(
                "plugin {plugin} merged into table {table:?} twice in batch {batch_id}; \
                 merge each table once per batch"
            ))));
        }
        let merger = match self.open.remove(table) {
            Some(Table::Idle(merger)) => Some(merger),
            // An earlier call's merge that outlasted it: wait for it first.
            Some(Table::Busy(running)) => match running.wait(deadline) {
                Waited::Done((merger, outcome)) => {
                    tracing::info!(
                        plugin,
                        table,
                        "a merge that outlasted its call has ended: {}",
                        match outcome {
                            Ok(outcome) => format!("{outcome:?}"),
                            Err(e) => e.to_string(),
                        }
                    );
                    Some(merger)
                }
                Waited::Late(running) => {
                    self.open.insert(table.to_owned(), Table::Busy(running));
                    return Err(wasmtime::Error::new(DeadlineExceeded {
                        during: "delta-merge.merge (waiting for an earlier merge into the table)",
                    }));
                }
                Waited::Lost => None,
            },
            None => None,
        };
        let merger = match merger {
            Some(merger) => Ok(merger),
            None => DeltaMerge::new(DeltaMergeOptions {
                table: spec.clone(),
                app_id: format!("{}/{table}", self.query_id),
                failpoint: self.failpoint,
            })
            .map(Box::new),
        };
        let mut merger = match merger {
            Ok(merger) => merger,
            Err(e) => return Ok(Err(fatal(format!("plugin {plugin}: {e}")))),
        };
        if let Err(e) = deadline::check(deadline, DURING) {
            self.open.insert(table.to_owned(), Table::Idle(merger));
            return Err(e);
        }
        self.merged.push(table.to_owned());
        let rows = rows.clone();
        let running = Running::start("weir-delta-merge", move || {
            let outcome = merger.merge(batch_id, &rows);
            (merger, outcome)
        });
        let running = match running {
            Ok(running) => running,
            Err(e) => {
                return Ok(Err(wit::PluginError {
                    kind: wit::ErrorKind::Retryable,
                    message: format!("plugin {plugin}: cannot start the merge into {table:?}: {e}"),
                    row: None,
                }));
            }
        };
        let (merger, outcome) = match running.wait(deadline) {
            Waited::Done(merged) => merged,
            Waited::Late(running) => {
                self.open.insert(table.to_owned(), Table::Busy(running));
                return Err(wasmtime::Error::new(DeadlineExceeded { during: DURING }));
            }
            Waited::Lost => {
                return Ok(Err(fatal(format!(
                    "plugin {plugin}: the merge into {table:?} in batch {batch_id} stopped \
                     without a result"
                ))));
            }
        };
        self.open.insert(table.to_owned(), Table::Idle(merger));
        Ok(match outcome {
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
        })
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
        grants.merge(&plugin, &table, &rows, self.deadline)
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn work_that_outlasts_the_deadline_goes_on_and_is_waited_for_later() {
        let started = Instant::now();
        let running = Running::start("test-work", || {
            std::thread::sleep(Duration::from_millis(500));
            7
        })
        .unwrap();
        let running = match running.wait(Some(started + Duration::from_millis(50))) {
            Waited::Late(running) => running,
            Waited::Done(_) | Waited::Lost => panic!("the work takes longer than the deadline"),
        };
        assert!(started.elapsed() < Duration::from_millis(450));
        // The next call waits for it, within its own deadline.
        match running.wait(Some(Instant::now() + Duration::from_secs(30))) {
            Waited::Done(value) => assert_eq!(value, 7),
            Waited::Late(_) | Waited::Lost => panic!("the work ends well within 30 s"),
        }
        let quick = Running::start("test-work", || 8).unwrap();
        assert!(matches!(quick.wait(None), Waited::Done(8)));
    }

    #[test]
    fn work_that_panics_is_lost_not_waited_for_forever() {
        let running = Running::start("test-work", || -> u32 { panic!("on purpose") }).unwrap();
        assert!(matches!(running.wait(None), Waited::Lost));
    }
}
