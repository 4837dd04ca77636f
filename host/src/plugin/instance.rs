//! A live plugin instance: its sandbox, the one call per batch, and recovery.
//!
//! Each instance owns a `Store` (so tenants never share memory or state),
//! limited in memory, deadline and optionally fuel, with no filesystem,
//! network, environment or real clock unless granted. After a trap the
//! instance is poisoned (wasmtime refuses to re-enter it), so it is dropped
//! and the next batch gets a fresh instance, opened with the same config.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use wasmtime::component::{HasSelf, Linker, Resource};
use wasmtime::{Store, StoreLimitsBuilder, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use super::bindings::{merge_sink, sink, transform, wit};
use super::convert;
use super::engine::{EPOCH_TICK, LoadedPlugin, PluginEngine};
use super::error::{PluginError, PluginErrorKind};
use super::merge_capability;
use super::merge_capability::{MergeGrants, SharedGrants};
use super::state::{BatchInfo, CallState, HostBatch, HostState};
use crate::failpoint::{Failpoint, Phase};

/// A host directory made visible to the plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirGrant {
    pub host: PathBuf,
    pub guest: String,
    pub writable: bool,
}

/// Limits and grants of one plugin instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    pub memory_bytes: u64,
    pub timeout: Duration,
    pub fuel: Option<u64>,
    pub dirs: Vec<DirGrant>,
    /// Delta tables a sink may MERGE into (the `delta-merge` import), by name.
    pub delta_merge: std::collections::BTreeMap<String, crate::spec::MergeTableSpec>,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self {
            memory_bytes: 256 << 20,
            timeout: Duration::from_secs(30),
            fuel: None,
            dirs: Vec::new(),
            delta_merge: std::collections::BTreeMap::new(),
        }
    }
}

/// How to start a plugin.
#[derive(Debug, Clone)]
pub struct PluginOptions {
    /// The plugin's name in errors, logs and progress.
    pub name: String,
    /// Its `config` from the pipeline file, as JSON text.
    pub config_json: String,
    pub sandbox: Sandbox,
    /// Crash injection for recovery tests.
    pub failpoint: Option<Failpoint>,
}

/// What a plugin used, for the progress record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginUsage {
    pub calls: u64,
    pub call_time: Duration,
    pub instantiations: u64,
    pub fuel_consumed: u64,
}

/// Captured guest stderr (panic messages end up here).
const STDERR_CAPACITY: usize = 1 << 20;

struct Live<B> {
    store: Store<HostState>,
    bindings: B,
}

/// The parts shared by transforms and sinks.
struct Runtime {
    engine: PluginEngine,
    plugin: LoadedPlugin,
    options: PluginOptions,
    name: Arc<str>,
    usage: PluginUsage,
    /// The sink's granted MERGE tables, shared by its successive instances.
    delta_merge: Option<SharedGrants>,
}

impl Runtime {
    fn err_instantiate(&self, e: impl std::fmt::Display) -> PluginError {
        PluginError::Instantiate {
            plugin: self.options.name.clone(),
            reason: e.to_string(),
        }
    }

    fn new_store(&mut self) -> Result<Store<HostState>, PluginError> {
        let sandbox = &self.options.sandbox;
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let mut wasi = WasiCtxBuilder::new();
        wasi.stderr(stderr.clone());
        for grant in &sandbox.dirs {
            let perms = if grant.writable {
                FsPerms::ReadWrite
            } else {
                FsPerms::ReadOnly
            };
            wasi.preopened_dir(&grant.host, &grant.guest, perms)
                .map_err(|e| PluginError::Grant {
                    plugin: self.options.name.clone(),
                    host: grant.host.clone(),
                    reason: format!("{e:#}"),
                })?;
        }
        let limits = StoreLimitsBuilder::new()
            .memory_size(usize::try_from(sandbox.memory_bytes).unwrap_or(usize::MAX))
            .trap_on_grow_failure(true)
            .build();
        let state = HostState {
            wasi: wasi.build(),
            table: wasmtime::component::ResourceTable::new(),
            limits,
            plugin: Arc::clone(&self.name),
            stderr,
            call: CallState::default(),
            failpoint: self.options.failpoint,
            delta_merge: self.delta_merge.clone(),
        };
        let mut store = Store::new(self.engine.engine(), state);
        store.limiter(|s| &mut s.limits);
        // Instantiation runs guest code too: give it a deadline and fuel first.
        self.arm(&mut store)?;
        self.usage.instantiations += 1;
        Ok(store)
    }

    fn arm(&self, store: &mut Store<HostState>) -> Result<(), PluginError> {
        let ticks = (self.options.sandbox.timeout.as_millis() / EPOCH_TICK.as_millis()).max(1) + 1;
        store.set_epoch_deadline(u64::try_from(ticks).unwrap_or(u64::MAX));
        store.epoch_deadline_trap();
        if self.engine.fuel_enabled() {
            store
                .set_fuel(self.options.sandbox.fuel.unwrap_or(u64::MAX))
                .map_err(|e| self.err_instantiate(format!("{e:#}")))?;
        }
        Ok(())
    }

    /// Fuel left in the store; 0 when fuel is not metered (asking wasmtime
    /// then builds an error, which is not free on the per-call path).
    fn fuel_left(&self, store: &Store<HostState>) -> u64 {
        if self.engine.fuel_enabled() {
            store.get_fuel().unwrap_or(0)
        } else {
            0
        }
    }

    /// Turns a wasmtime error (trap, limit, deadline) into a typed error.
    fn classify(
        &self,
        store: &Store<HostState>,
        batch_id: u64,
        e: &wasmtime::Error,
    ) -> PluginError {
        let plugin = self.options.name.clone();
        let sandbox = &self.options.sandbox;
        if let Some(trap) = e.downcast_ref::<Trap>() {
            match trap {
                Trap::Interrupt => {
                    return PluginError::Timeout {
                        plugin,
                        batch_id,
                        limit_ms: u64::try_from(sandbox.timeout.as_millis()).unwrap_or(u64::MAX),
                    };
                }
                Trap::OutOfFuel => {
                    return PluginError::OutOfFuel {
                        plugin,
                        batch_id,
                        fuel: sandbox.fuel.unwrap_or(u64::MAX),
                    };
                }
                _ => {}
            }
        }
        let root = e.root_cause().to_string();
        if root.contains("forcing trap when growing memory") {
            return PluginError::MemoryExceeded {
                plugin,
                batch_id,
                limit: sandbox.memory_bytes,
            };
        }
        let stderr = String::from_utf8_lossy(&store.data().stderr.contents())
            .trim()
            .to_owned();
        let trap = match e.downcast_ref::<Trap>() {
            Some(t) => t.to_string(),
            None => root,
        };
        PluginError::Trap {
            plugin,
            batch_id,
            trap,
            stderr,
        }
    }

    fn plugin_failure(&self, batch_id: u64, e: wit::PluginError) -> PluginError {
        let kind = match e.kind {
            wit::ErrorKind::Retryable => PluginErrorKind::Retryable,
            wit::ErrorKind::InvalidInput => PluginErrorKind::InvalidInput,
            wit::ErrorKind::Fatal | wit::ErrorKind::InvalidConfig => PluginErrorKind::Fatal,
        };
        PluginError::Failed {
            plugin: self.options.name.clone(),
            batch_id,
            kind,
            message: e.message,
            row: e.row,
        }
    }
}

fn check_input(name: &str, schema: &SchemaRef) -> Result<Vec<wit::Field>, PluginError> {
    convert::wit_fields(schema).map_err(|(column, data_type)| PluginError::UnsupportedType {
        plugin: name.to_owned(),
        column,
        data_type,
    })
}

/// A transform plugin (world `transform`).
pub struct WasmTransform {
    rt: Runtime,
    pre: transform::TransformPre<HostState>,
    input_fields: Vec<wit::Field>,
    input_schema: SchemaRef,
    output_schema: SchemaRef,
    live: Option<Live<transform::Transform>>,
}

impl std::fmt::Debug for WasmTransform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmTransform")
            .field("plugin", &self.rt.plugin)
            .field("output_schema", &self.output_schema)
            .finish_non_exhaustive()
    }
}

impl WasmTransform {
    /// Instantiates the plugin and opens it with its config and input schema.
    ///
    /// # Errors
    /// When the component does not implement the `transform` world, traps
    /// while starting, or rejects its config.
    pub fn open(
        engine: &PluginEngine,
        plugin: LoadedPlugin,
        options: PluginOptions,
        input_schema: SchemaRef,
    ) -> Result<Self, PluginError> {
        let name: Arc<str> = options.name.as_str().into();
        let input_fields = check_input(&options.name, &input_schema)?;
        let rt = Runtime {
            engine: engine.clone(),
            plugin,
            options,
            name,
            usage: PluginUsage::default(),
            delta_merge: None,
        };
        let mut linker = Linker::<HostState>::new(engine.engine());
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| rt.err_instantiate(format!("{e:#}")))?;
        transform::Transform::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(|e| rt.err_instantiate(format!("{e:#}")))?;
        let pre = linker
            .instantiate_pre(&rt.plugin.component)
            .and_then(transform::TransformPre::new)
            .map_err(|e| rt.err_instantiate(format!("not a Weir transform: {e:#}")))?;
        let mut this = Self {
            rt,
            pre,
            input_fields,
            output_schema: Arc::clone(&input_schema),
            input_schema,
            live: None,
        };
        let fields = this.start()?;
        this.output_schema = convert::arrow_schema(&fields, &this.input_schema);
        Ok(this)
    }

    /// A fresh instance, opened; returns the output fields it declared.
    fn start(&mut self) -> Result<Vec<wit::Field>, PluginError> {
        let mut store = self.rt.new_store()?;
        let bindings = self.pre.instantiate(&mut store).map_err(|e| {
            let err = self.rt.classify(&store, 0, &e);
            self.rt.err_instantiate(err)
        })?;
        let config = self.rt.options.config_json.clone();
        let opened = bindings
            .weir_plugin_transformer()
            .call_open(&mut store, &config, &self.input_fields)
            .map_err(|e| self.rt.classify(&store, 0, &e))?;
        let fields = opened.map_err(|e| PluginError::InvalidConfig {
            plugin: self.rt.options.name.clone(),
            message: e.message,
        })?;
        self.live = Some(Live { store, bindings });
        Ok(fields)
    }

    /// The schema of the batches [`Self::process`] returns.
    pub fn output_schema(&self) -> &SchemaRef {
        &self.output_schema
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.rt.options.name
    }

    /// The plugin's content hash.
    pub fn sha256(&self) -> &str {
        &self.rt.plugin.sha256
    }

    /// Calls and resources used so far.
    pub fn usage(&self) -> &PluginUsage {
        &self.rt.usage
    }

    /// Transforms one batch (one call across the boundary).
    ///
    /// # Errors
    /// The plugin's own error, a trap, a limit, or a malformed result; the
    /// instance is replaced after anything but the plugin's own error.
    pub fn process(
        &mut self,
        batch: &RecordBatch,
        info: &BatchInfo,
    ) -> Result<RecordBatch, PluginError> {
        if self.live.is_none() {
            self.start()?;
        }
        let Some(live) = self.live.as_mut() else {
            return Err(self.rt.err_instantiate("no live instance"));
        };
        let started = Instant::now();
        self.rt.arm(&mut live.store)?;
        let fuel_before = self.rt.fuel_left(&live.store);
        live.store.data_mut().begin_call(info, Phase::InTransform);
        let resource = live
            .store
            .data_mut()
            .table
            .push(HostBatch {
                batch: batch.clone(),
            })
            .map_err(|e| self.rt.err_instantiate(e))?;
        let rep = Resource::<HostBatch>::new_borrow(resource.rep());
        let wit_info = wit_info(info);
        let result =
            live.bindings
                .weir_plugin_transformer()
                .call_process(&mut live.store, &wit_info, rep);
        // The guest only borrowed the batch; take it back out of the table.
        let _ = live.store.data_mut().table.delete(resource);
        live.store.data_mut().call.phase = None;
        self.rt.usage.calls += 1;
        self.rt.usage.call_time += started.elapsed();
        self.rt.usage.fuel_consumed +=
            fuel_before.saturating_sub(live.store.get_fuel().unwrap_or(0));
        let output = match result {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => return Err(self.rt.plugin_failure(info.batch_id, e)),
            Err(e) => {
                let err = self.rt.classify(&live.store, info.batch_id, &e);
                self.live = None;
                return Err(err);
            }
        };
        let malformed = |reason: String| PluginError::MalformedOutput {
            plugin: self.rt.options.name.clone(),
            batch_id: info.batch_id,
            reason,
        };
        let out = match output {
            wit::TransformOutput::Edit(edit) => {
                convert::apply_edit(batch, edit).map_err(malformed)?
            }
            wit::TransformOutput::Ipc(bytes) => {
                convert::from_ipc(&bytes).map_err(|e| malformed(e.to_string()))?
            }
        };
        self.conform(out).map_err(malformed)
    }

    /// Checks a result against the declared output schema and adopts the
    /// declared field metadata (names, types and order must match).
    fn conform(&self, out: RecordBatch) -> Result<RecordBatch, String> {
        let expected = &self.output_schema;
        let got = out.schema();
        if got.fields().len() != expected.fields().len()
            || got
                .fields()
                .iter()
                .zip(expected.fields())
                .any(|(g, e)| g.name() != e.name() || g.data_type() != e.data_type())
        {
            let show = |s: &arrow_schema::Schema| {
                s.fields()
                    .iter()
                    .map(|f| format!("{} {}", f.name(), f.data_type()))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(format!(
                "its columns are [{}] but it declared [{}]",
                show(&got),
                show(expected)
            ));
        }
        RecordBatch::try_new(Arc::clone(expected), out.columns().to_vec())
            .map_err(|e| e.to_string())
    }
}

/// A foreachBatch sink plugin (world `sink`).
pub struct WasmSink {
    rt: Runtime,
    pre: sink::SinkPre<HostState>,
    input_fields: Vec<wit::Field>,
    live: Option<Live<sink::Sink>>,
}

impl std::fmt::Debug for WasmSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmSink")
            .field("plugin", &self.rt.plugin)
            .finish_non_exhaustive()
    }
}

impl WasmSink {
    /// Instantiates the sink and opens it with its config and input schema.
    ///
    /// # Errors
    /// When the component does not implement the `sink` world, traps while
    /// starting, a granted directory cannot be opened, or it rejects its config.
    pub fn open(
        engine: &PluginEngine,
        plugin: LoadedPlugin,
        options: PluginOptions,
        input_schema: &SchemaRef,
    ) -> Result<Self, PluginError> {
        let name: Arc<str> = options.name.as_str().into();
        let input_fields = check_input(&options.name, input_schema)?;
        let delta_merge = (!options.sandbox.delta_merge.is_empty())
            .then(|| MergeGrants::new(options.sandbox.delta_merge.clone(), options.failpoint));
        let rt = Runtime {
            engine: engine.clone(),
            plugin,
            options,
            name,
            usage: PluginUsage::default(),
            delta_merge,
        };
        let mut linker = Linker::<HostState>::new(engine.engine());
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| rt.err_instantiate(format!("{e:#}")))?;
        sink::Sink::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(|e| rt.err_instantiate(format!("{e:#}")))?;
        // Every sink may import `delta-merge` (world `merge-sink`); calls without a grant fail.
        merge_sink::weir::plugin::delta_merge::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(|e| rt.err_instantiate(format!("{e:#}")))?;
        let imports_merge = rt
            .plugin
            .component
            .component_type()
            .imports(engine.engine())
            .any(|(name, _)| name == merge_capability::INTERFACE);
        if imports_merge && rt.delta_merge.is_none() {
            return Err(rt.err_instantiate(format!(
                "it imports {} but the pipeline file grants it no table: add \
                 [sink.capabilities.delta_merge.<name>] with path and keys",
                merge_capability::INTERFACE
            )));
        }
        let pre = linker
            .instantiate_pre(&rt.plugin.component)
            .and_then(sink::SinkPre::new)
            .map_err(|e| rt.err_instantiate(format!("not a Weir sink: {e:#}")))?;
        let mut this = Self {
            rt,
            pre,
            input_fields,
            live: None,
        };
        this.start()?;
        Ok(this)
    }

    fn start(&mut self) -> Result<(), PluginError> {
        let mut store = self.rt.new_store()?;
        let bindings = self.pre.instantiate(&mut store).map_err(|e| {
            let err = self.rt.classify(&store, 0, &e);
            self.rt.err_instantiate(err)
        })?;
        let config = self.rt.options.config_json.clone();
        let opened = bindings
            .weir_plugin_writer()
            .call_open(&mut store, &config, &self.input_fields)
            .map_err(|e| self.rt.classify(&store, 0, &e))?;
        opened.map_err(|e| PluginError::InvalidConfig {
            plugin: self.rt.options.name.clone(),
            message: e.message,
        })?;
        self.live = Some(Live { store, bindings });
        Ok(())
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.rt.options.name
    }

    /// The plugin's content hash.
    pub fn sha256(&self) -> &str {
        &self.rt.plugin.sha256
    }

    /// Calls and resources used so far.
    pub fn usage(&self) -> &PluginUsage {
        &self.rt.usage
    }

    /// Hands one batch to the sink.
    ///
    /// # Errors
    /// As [`WasmTransform::process`].
    pub fn write_batch(
        &mut self,
        batch: &RecordBatch,
        info: &BatchInfo,
    ) -> Result<(), PluginError> {
        if self.live.is_none() {
            self.start()?;
        }
        let Some(live) = self.live.as_mut() else {
            return Err(self.rt.err_instantiate("no live instance"));
        };
        let started = Instant::now();
        self.rt.arm(&mut live.store)?;
        let fuel_before = self.rt.fuel_left(&live.store);
        live.store.data_mut().begin_call(info, Phase::InSink);
        if let Some(grants) = &self.rt.delta_merge {
            grants.lock().unwrap_or_else(|p| p.into_inner()).begin(info);
        }
        let resource = live
            .store
            .data_mut()
            .table
            .push(HostBatch {
                batch: batch.clone(),
            })
            .map_err(|e| self.rt.err_instantiate(e))?;
        let rep = Resource::<HostBatch>::new_borrow(resource.rep());
        let result = live.bindings.weir_plugin_writer().call_write_batch(
            &mut live.store,
            &wit_info(info),
            rep,
        );
        let _ = live.store.data_mut().table.delete(resource);
        live.store.data_mut().call.phase = None;
        self.rt.usage.calls += 1;
        self.rt.usage.call_time += started.elapsed();
        self.rt.usage.fuel_consumed +=
            fuel_before.saturating_sub(live.store.get_fuel().unwrap_or(0));
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.rt.plugin_failure(info.batch_id, e)),
            Err(e) => {
                let err = self.rt.classify(&live.store, info.batch_id, &e);
                self.live = None;
                Err(err)
            }
        }
    }
}

fn wit_info(info: &BatchInfo) -> wit::BatchInfo {
    wit::BatchInfo {
        query_id: info.query_id.clone(),
        batch_id: info.batch_id,
        attempt: info.attempt,
        timestamp_micros: info.timestamp_micros,
        partition: info.partition,
    }
}
