//! What a plugin's `Store` holds, and the host functions a plugin imports:
//! the batch resource it pulls columns from, logging (capped, see `logs`) and deterministic
//! randomness (drawn from the store's [`BatchSeed`], keyed by the query's secret), and the deadline of the
//! call in progress. Everything here is per instance, so tenants never share state.

use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::WasiHttpCtx;

use super::bindings::transform::weir::plugin::host;
use super::bindings::wit;
use super::convert;
use super::grants::HttpGuard;
use super::limiter::MemoryLimiter;
use super::logs::{Level, PluginLog};
use super::replay::BatchSeed;
use crate::failpoint::{Failpoint, Phase};

/// What a plugin is told about the batch it is called for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchInfo {
    pub query_id: String,
    pub batch_id: u64,
    /// 0 the first time the batch runs; higher on a retry or a replay.
    pub attempt: u32,
    /// The batch's timestamp (µs since the epoch), identical on replay.
    pub timestamp_micros: i64,
    pub partition: u32,
}

/// A batch lent to the guest for the length of one call.
#[derive(Debug)]
pub struct HostBatch {
    pub(crate) batch: RecordBatch,
}

/// The call in progress, for host functions that depend on it.
#[derive(Debug, Default)]
pub(crate) struct CallState {
    pub(crate) batch_id: u64,
    pub(crate) phase: Option<Phase>,
}

pub(crate) struct HostState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    /// The memory limit over memories and tables, and what is left of it
    /// for the results host calls build (see `limiter`).
    pub(crate) limits: MemoryLimiter,
    pub(crate) plugin: Arc<str>,
    /// The `log` import and stderr, capped per call (see `logs`).
    pub(crate) log: PluginLog,
    pub(crate) call: CallState,
    pub(crate) failpoint: Option<Failpoint>,
    /// A stateful transform's keyed state, lent for the length of one call.
    pub(crate) keyed: Option<crate::operator::wasm_state::KeyedState>,
    /// The batch clock and random stream the store's WASI context reads.
    pub(crate) seed: Arc<BatchSeed>,
    pub(crate) http: WasiHttpCtx,
    /// Where the guest may send HTTP requests, and what it was refused.
    pub(crate) http_guard: HttpGuard,
    /// The Delta tables a sink may MERGE into (`None`: not granted, or a transform).
    pub(crate) delta_merge: Option<super::merge_capability::SharedGrants>,
    /// When the call in progress must end (`limits.timeout` after it began):
    /// what bounds the host calls epoch interruption cannot stop (see
    /// `deadline`). `None`: no limit (a timeout too large to represent).
    pub(crate) deadline: Option<Instant>,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl HostState {
    /// Prepares per-call state: the batch id for logs and failpoints, and the
    /// clock and random source of the batch (see `replay`).
    pub(crate) fn begin_call(&mut self, info: &BatchInfo, phase: Phase) {
        self.seed.begin(info);
        self.call = CallState {
            batch_id: info.batch_id,
            phase: Some(phase),
        };
        self.log.begin(info.batch_id);
        self.http_guard.begin_call();
    }

    pub(super) fn at_host_call(&self) {
        if let Some(phase) = self.call.phase {
            Failpoint::check(self.failpoint.as_ref(), phase, self.call.batch_id);
        }
    }
}

impl wit::Host for HostState {}

impl wit::HostBatch for HostState {
    fn num_rows(&mut self, batch: Resource<HostBatch>) -> wasmtime::Result<u32> {
        let batch = &self.table.get(&batch)?.batch;
        Ok(u32::try_from(batch.num_rows())?)
    }

    fn schema(&mut self, batch: Resource<HostBatch>) -> wasmtime::Result<Vec<wit::Field>> {
        let batch = &self.table.get(&batch)?.batch;
        convert::wit_fields(batch.schema_ref()).map_err(|(column, ty)| {
            wasmtime::Error::msg(format!("column {column} has unsupported type {ty}"))
        })
    }

    fn column(&mut self, batch: Resource<HostBatch>, index: u32) -> wasmtime::Result<wit::Column> {
        self.at_host_call();
        let batch = &self.table.get(&batch)?.batch;
        let i = index as usize;
        if i >= batch.num_columns() {
            return Err(wasmtime::Error::msg(format!(
                "column index {index} out of range: the batch has {} columns",
                batch.num_columns()
            )));
        }
        let field = batch.schema_ref().field(i).clone();
        convert::wit_column(&field, batch.column(i)).map_err(|(column, ty)| {
            wasmtime::Error::msg(format!("column {column} has unsupported type {ty}"))
        })
    }

    fn to_ipc(&mut self, batch: Resource<HostBatch>) -> wasmtime::Result<Vec<u8>> {
        self.at_host_call();
        let batch = &self.table.get(&batch)?.batch;
        Ok(convert::to_ipc(batch)?)
    }

    fn drop(&mut self, batch: Resource<HostBatch>) -> wasmtime::Result<()> {
        self.table.delete(batch)?;
        Ok(())
    }
}

impl host::Host for HostState {
    fn log(&mut self, level: host::LogLevel, message: String) -> wasmtime::Result<()> {
        self.at_host_call();
        let level = match level {
            host::LogLevel::Trace => Level::Trace,
            host::LogLevel::Debug => Level::Debug,
            host::LogLevel::Info => Level::Info,
            host::LogLevel::Warn => Level::Warn,
            host::LogLevel::Error => Level::Error,
        };
        self.log.message(level, &message);
        Ok(())
    }

    fn random_u64(&mut self) -> wasmtime::Result<u64> {
        Ok(self.seed.next_u64())
    }
}
