//! A live plugin instance: its sandbox, the one call per batch, and recovery.
//!
//! Each instance owns a `Store` (so tenants never share memory or state),
//! limited in memory (its memories and tables together, and what the host
//! holds for it: see `limiter`), deadline (in Wasm code by epoch
//! interruption, in host calls by `deadline`), live host resources, logs
//! (see `logs`) and optionally fuel, with no filesystem,
//! network, environment or real clock unless granted. After a trap the
//! instance is poisoned (wasmtime refuses to re-enter it), so it is dropped
//! and the next batch gets a fresh instance, opened with the same config.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use wasmtime::component::ResourceTableError;
use wasmtime::component::{HasSelf, Linker, Resource};
use wasmtime::{Store, Trap};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi_http::WasiHttpCtx;

use super::bindings::{merge_sink, sink, stateful_transform, transform, wit};
use super::convert;
use super::deadline::{self, DeadlineExceeded};
use super::engine::{EPOCH_TICK, LoadedPlugin, PluginEngine};
use super::error::{Budget, PluginError, PluginErrorKind};
use super::grants::{self, HttpAllowList, HttpGrant, HttpGuard};
use super::limiter::{BudgetExceeded, MAX_RESOURCES, MemoryLimiter};
use super::logs::PluginLog;
use super::merge_capability;
use super::merge_capability::{MergeGrants, SharedGrants};
use super::replay::{BatchSeed, ReplayKey};
use super::state::{BatchInfo, CallState, HostBatch, HostState};
use crate::failpoint::{Failpoint, Phase};
use crate::spec::DirGrant;

/// Limits and grants of one plugin instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    pub memory_bytes: u64,
    pub timeout: Duration,
    pub fuel: Option<u64>,
    pub dirs: Vec<DirGrant>,
    /// Environment variables the plugin sees, with their values; no others.
    pub env: Vec<(String, String)>,
    /// Hosts the plugin may send HTTP requests to; empty: no HTTP at all.
    pub http: Vec<HttpGrant>,
    /// Delta tables a sink may MERGE into (the `delta-merge` import), by name.
    pub delta_merge: std::collections::BTreeMap<String, crate::spec::MergeTableSpec>,
    /// Whether loopback, private and link-local addresses may be reached, by a grant of the
    /// address itself (the operator's policy; true without one).
    pub private_networks: bool,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self {
            memory_bytes: 256 << 20,
            timeout: Duration::from_secs(30),
            fuel: None,
            dirs: Vec::new(),
            env: Vec::new(),
            http: Vec::new(),
            delta_merge: std::collections::BTreeMap::new(),
            private_networks: true,
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
    /// What the plugin's random numbers are drawn from: the query's secret (see `replay`).
    pub replay_key: ReplayKey,
}

/// What a plugin used, and the limits it ran under, for the progress record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginUsage {
    pub calls: u64,
    pub call_time: Duration,
    pub instantiations: u64,
    pub fuel_consumed: u64,
    /// The most its instances' memories and tables held (a high-water mark).
    pub memory_peak_bytes: u64,
    /// `limits.memory`.
    pub memory_limit_bytes: u64,
    /// `limits.timeout`, per call.
    pub timeout: Duration,
    /// `limits.fuel`, per call; `None`: not metered.
    pub fuel_limit: Option<u64>,
}

impl PluginUsage {
    fn new(sandbox: &Sandbox) -> Self {
        Self {
            memory_limit_bytes: sandbox.memory_bytes,
            timeout: sandbox.timeout,
            fuel_limit: sandbox.fuel,
            ..Self::default()
        }
    }
}

pub(super) struct Live<B> {
    pub(super) store: Store<HostState>,
    pub(super) bindings: B,
}

/// The parts shared by transforms, sinks and scalar functions.
pub(super) struct Runtime {
    engine: PluginEngine,
    pub(super) plugin: LoadedPlugin,
    pub(super) options: PluginOptions,
    name: Arc<str>,
    pub(super) usage: PluginUsage,
    allow_http: Arc<HttpAllowList>,
    /// The sink's granted MERGE tables, shared by its successive instances.
    delta_merge: Option<SharedGrants>,
}

impl Runtime {
    pub(super) fn new(engine: &PluginEngine, plugin: LoadedPlugin, options: PluginOptions) -> Self {
        Self {
            engine: engine.clone(),
            plugin,
            name: options.name.as_str().into(),
            usage: PluginUsage::new(&options.sandbox),
            allow_http: Arc::new(HttpAllowList::new(
                &options.sandbox.http,
                options.sandbox.timeout,
                options.sandbox.private_networks,
            )),
            options,
            delta_merge: None,
        }
    }

    /// The WASI (and, when granted, wasi:http) imports every plugin links against.
    pub(super) fn linker(&self) -> Result<Linker<HostState>, PluginError> {
        let mut linker = Linker::<HostState>::new(self.engine.engine());
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| self.err_instantiate(format!("{e:#}")))?;
        grants::add_http_to_linker(&mut linker)
            .map_err(|e| self.err_instantiate(format!("{e:#}")))?;
        // Over wasmtime-wasi's own: every wait of the guest ends at the call's deadline.
        deadline::add_to_linker(&mut linker).map_err(|e| self.err_instantiate(format!("{e:#}")))?;
        Ok(linker)
    }

    /// Books a finished call: its time, fuel and the memory high-water mark.
    pub(super) fn account(&mut self, store: &Store<HostState>, started: Instant, fuel_before: u64) {
        self.usage.calls += 1;
        self.usage.call_time += started.elapsed();
        self.usage.fuel_consumed += fuel_before.saturating_sub(self.fuel_left(store));
        self.usage.memory_peak_bytes = self
            .usage
            .memory_peak_bytes
            .max(store.data().limits.peak_bytes());
    }

    pub(super) fn err_instantiate(&self, e: impl std::fmt::Display) -> PluginError {
        PluginError::Instantiate {
            plugin: self.options.name.clone(),
            reason: e.to_string(),
        }
    }

    pub(super) fn new_store(&mut self) -> Result<Store<HostState>, PluginError> {
        let sandbox = &self.options.sandbox;
        // Stderr (panic messages end up there) goes to the log, capped.
        let log = PluginLog::new(Arc::clone(&self.name));
        let mut wasi = WasiCtxBuilder::new();
        wasi.stderr(log.stderr());
        grants::apply(&self.options.name, sandbox, &mut wasi)?;
        let seed = BatchSeed::new(&self.options.replay_key);
        seed.install(&mut wasi);
        let limits =
            MemoryLimiter::new(usize::try_from(sandbox.memory_bytes).unwrap_or(usize::MAX));
        let mut table = wasmtime::component::ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES);
        let state = HostState {
            wasi: wasi.build(),
            table,
            limits,
            plugin: Arc::clone(&self.name),
            log,
            call: CallState::default(),
            failpoint: self.options.failpoint,
            keyed: None,
            seed,
            http: WasiHttpCtx::new(),
            http_guard: HttpGuard::new(Arc::clone(&self.allow_http), Arc::clone(&self.name)),
            delta_merge: self.delta_merge.clone(),
            deadline: None,
        };
        let mut store = Store::new(self.engine.engine(), state);
        store.limiter(|s| &mut s.limits);
        // Instantiation runs guest code too: give it a deadline and fuel first.
        self.arm(&mut store)?;
        self.usage.instantiations += 1;
        Ok(store)
    }

    /// Starts the clock of a call (or of instantiation and `open`): the
    /// epoch deadline for guest code, and the same deadline as an instant for
    /// the host calls the epoch cannot interrupt (see `deadline`).
    pub(super) fn arm(&self, store: &mut Store<HostState>) -> Result<(), PluginError> {
        let timeout = self.options.sandbox.timeout;
        let ticks = (timeout.as_millis() / EPOCH_TICK.as_millis()).max(1) + 1;
        store.set_epoch_deadline(u64::try_from(ticks).unwrap_or(u64::MAX));
        store.epoch_deadline_trap();
        let deadline = Instant::now().checked_add(timeout);
        let state = store.data_mut();
        state.limits.begin_call();
        state.log.begin(0);
        state.deadline = deadline;
        state.http_guard.deadline = deadline;
        if self.engine.fuel_enabled() {
            store
                .set_fuel(self.options.sandbox.fuel.unwrap_or(u64::MAX))
                .map_err(|e| self.err_instantiate(format!("{e:#}")))?;
        }
        Ok(())
    }

    /// Fuel left in the store; 0 when fuel is not metered (asking wasmtime
    /// then builds an error, which is not free on the per-call path).
    pub(super) fn fuel_left(&self, store: &Store<HostState>) -> u64 {
        if self.engine.fuel_enabled() {
            store.get_fuel().unwrap_or(0)
        } else {
            0
        }
    }

    /// Turns a wasmtime error (trap, limit, deadline) into a typed error.
    pub(super) fn classify(
        &self,
        store: &Store<HostState>,
        batch_id: u64,
        e: &wasmtime::Error,
    ) -> PluginError {
        let plugin = self.options.name.clone();
        let sandbox = &self.options.sandbox;
        let timeout = || PluginError::Timeout {
            plugin: plugin.clone(),
            batch_id,
            limit_ms: u64::try_from(sandbox.timeout.as_millis()).unwrap_or(u64::MAX),
        };
        if let Some(waiting) = e.downcast_ref::<DeadlineExceeded>() {
            tracing::warn!(
                plugin = %plugin,
                batch_id,
                "{waiting}: failing the call at its time limit"
            );
            return timeout();
        }
        if let Some(trap) = e.downcast_ref::<Trap>() {
            match trap {
                Trap::Interrupt => return timeout(),
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
        if let Some(over) = e.downcast_ref::<BudgetExceeded>() {
            return PluginError::HostBudget {
                plugin,
                batch_id,
                budget: over.budget,
                reason: over.reason.clone(),
            };
        }
        if resources_exhausted(e) {
            return self.err_resources(batch_id);
        }
        // The limiter's own record, whatever the trap's text says.
        if let Some(refusal) = store.data().limits.refusal() {
            tracing::warn!(plugin = %plugin, batch_id, "{refusal}");
            return PluginError::MemoryExceeded {
                plugin,
                batch_id,
                limit: sandbox.memory_bytes,
            };
        }
        let root = e.root_cause().to_string();
        let stderr = store.data().log.stderr_tail();
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

    /// A fresh instance: a new store (its limits, grants, clock and random numbers),
    /// `instantiate` from the prepared component, then the guest's `open` with the plugin's
    /// config, whose error value refuses the config.
    pub(super) fn start<B, R>(
        &mut self,
        instantiate: impl FnOnce(&mut Store<HostState>) -> wasmtime::Result<B>,
        open: impl FnOnce(
            &B,
            &mut Store<HostState>,
            &str,
        ) -> wasmtime::Result<Result<R, wit::PluginError>>,
    ) -> Result<(Live<B>, R), PluginError> {
        let mut store = self.new_store()?;
        let bindings = instantiate(&mut store).map_err(|e| {
            let err = self.classify(&store, 0, &e);
            self.err_instantiate(err)
        })?;
        let config = self.options.config_json.clone();
        let opened = open(&bindings, &mut store, &config);
        store.data().log.end();
        let opened = opened.map_err(|e| self.classify(&store, 0, &e))?;
        let value = opened.map_err(|e| PluginError::InvalidConfig {
            plugin: self.options.name.clone(),
            message: e.message,
        })?;
        Ok((Live { store, bindings }, value))
    }

    /// One call of the guest for batch `info`, with `batch` lent to it as a borrowed resource:
    /// the deadline and fuel armed, the call booked, a sandbox refusal made the batch's failure
    /// whatever the guest made of it, a trap or a limit classified. After anything but the
    /// guest's own error the instance is dropped (`live` becomes `None`), and the next call
    /// starts a fresh one.
    pub(super) fn call<B, R>(
        &mut self,
        live: &mut Option<Live<B>>,
        batch: &RecordBatch,
        info: &BatchInfo,
        phase: Phase,
        call: impl FnOnce(
            &B,
            &mut Store<HostState>,
            Resource<HostBatch>,
        ) -> wasmtime::Result<Result<R, wit::PluginError>>,
    ) -> Result<R, PluginError> {
        let Some(l) = live.as_mut() else {
            return Err(self.err_instantiate("no live instance"));
        };
        let started = Instant::now();
        self.arm(&mut l.store)?;
        let fuel_before = self.fuel_left(&l.store);
        l.store.data_mut().begin_call(info, phase);
        let pushed = l.store.data_mut().table.push(HostBatch {
            batch: batch.clone(),
        });
        let Ok(resource) = pushed else {
            // Resources it kept from earlier calls fill the table: start afresh.
            let err = self.err_resources(info.batch_id);
            *live = None;
            return Err(err);
        };
        let rep = Resource::<HostBatch>::new_borrow(resource.rep());
        let result = call(&l.bindings, &mut l.store, rep);
        // The guest only borrowed the batch; take it back out of the table.
        let _ = l.store.data_mut().table.delete(resource);
        l.store.data_mut().call.phase = None;
        l.store.data().log.end();
        self.account(&l.store, started, fuel_before);
        if let Some(reason) = l.store.data_mut().http_guard.take_denied() {
            // Whatever the guest made of the refusal, the batch fails on it.
            if result.is_err() {
                *live = None;
            }
            return Err(PluginError::Denied {
                plugin: self.options.name.clone(),
                batch_id: info.batch_id,
                reason,
            });
        }
        match result {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(self.plugin_failure(info.batch_id, e)),
            Err(e) => {
                let err = self.classify(&l.store, info.batch_id, &e);
                *live = None;
                Err(err)
            }
        }
    }

    /// The instance holds as many host resources as it may.
    pub(super) fn err_resources(&self, batch_id: u64) -> PluginError {
        PluginError::HostBudget {
            plugin: self.options.name.clone(),
            batch_id,
            budget: Budget::Resources {
                limit: MAX_RESOURCES as u64,
            },
            reason: "the host could not hand it another resource (stream, pollable, \
                     request...): drop the ones it no longer needs"
                .to_owned(),
        }
    }

    pub(super) fn plugin_failure(&self, batch_id: u64, e: wit::PluginError) -> PluginError {
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

/// Whether `e` comes from a full resource table (more than
/// [`MAX_RESOURCES`] live host resources).
fn resources_exhausted(e: &wasmtime::Error) -> bool {
    e.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<ResourceTableError>(),
            Some(ResourceTableError::Full)
        )
    })
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
    /// What downstream was opened with: the first build's declared output.
    output_schema: SchemaRef,
    /// What the running build declared; differs from `output_schema` only
    /// after a replacement that added columns.
    declared_schema: SchemaRef,
    /// For each column of `output_schema`, its index in `declared_schema`,
    /// when they differ.
    projection: Option<Vec<usize>>,
    live: Option<Live<transform::Transform>>,
    /// Whether the component imports `keyed-state` (world `stateful-transform`).
    stateful: bool,
    /// Its keyed state between calls (moved into the store during one).
    keyed: Option<crate::operator::wasm_state::KeyedState>,
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
        let input_fields = check_input(&options.name, &input_schema)?;
        let rt = Runtime::new(engine, plugin, options);
        let mut linker = rt.linker()?;
        transform::Transform::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(|e| rt.err_instantiate(format!("{e:#}")))?;
        // Offered to every transform; only a component that imports it is stateful.
        stateful_transform::weir::plugin::keyed_state::add_to_linker::<_, HasSelf<_>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| rt.err_instantiate(format!("{e:#}")))?;
        let stateful = rt
            .plugin
            .component
            .component_type()
            .imports(engine.engine())
            .any(|(name, _)| name == super::keyed_state::INTERFACE);
        let pre = linker
            .instantiate_pre(&rt.plugin.component)
            .and_then(transform::TransformPre::new)
            .map_err(|e| rt.err_instantiate(format!("not a Weir transform: {e:#}")))?;
        let mut this = Self {
            rt,
            pre,
            input_fields,
            output_schema: Arc::clone(&input_schema),
            declared_schema: Arc::clone(&input_schema),
            projection: None,
            input_schema,
            live: None,
            stateful,
            keyed: None,
        };
        let fields = this.start()?;
        this.output_schema =
            convert::arrow_schema(&fields, &this.input_schema).map_err(|reason| {
                PluginError::MalformedSchema {
                    plugin: this.rt.options.name.clone(),
                    reason,
                }
            })?;
        this.declared_schema = Arc::clone(&this.output_schema);
        Ok(this)
    }

    /// Replaces the running build by `plugin` (between batches): opens it
    /// with the same config and input, checks its declared output against
    /// the one downstream was opened with (see `reload`), and only then
    /// drops the old instance. On refusal the old build keeps running.
    ///
    /// # Errors
    /// [`PluginError::Replacement`], saying why the build was refused.
    pub fn replace(&mut self, plugin: LoadedPlugin) -> Result<(), PluginError> {
        let refused = |plugin: &LoadedPlugin, reason: String| PluginError::Replacement {
            plugin: self.rt.options.name.clone(),
            path: plugin.path.clone(),
            sha256: plugin.sha256.clone(),
            reason,
        };
        let new = match Self::open(
            &self.rt.engine,
            plugin.clone(),
            self.rt.options.clone(),
            Arc::clone(&self.input_schema),
        ) {
            Ok(new) => new,
            Err(e) => return Err(refused(&plugin, e.to_string())),
        };
        if new.stateful != self.stateful {
            let reason = if self.stateful {
                "the running build keeps keyed state (imports `keyed-state`) and this one does not"
            } else {
                "this build keeps keyed state (imports `keyed-state`) and the running one does not: start a new checkpoint"
            };
            return Err(refused(&plugin, reason.to_owned()));
        }
        let projection = super::reload::check_output(&self.output_schema, &new.declared_schema)
            .map_err(|reason| refused(&plugin, reason))?;
        let identity = projection.len() == new.declared_schema.fields().len()
            && projection.iter().enumerate().all(|(i, j)| i == *j);
        self.rt.usage.instantiations += new.rt.usage.instantiations;
        self.rt.plugin = new.rt.plugin;
        self.pre = new.pre;
        self.live = new.live;
        self.declared_schema = new.declared_schema;
        self.projection = (!identity).then_some(projection);
        Ok(())
    }

    /// A fresh instance, opened; returns the output fields it declared.
    fn start(&mut self) -> Result<Vec<wit::Field>, PluginError> {
        let (live, fields) = self.rt.start(
            |store| self.pre.instantiate(store),
            |bindings: &transform::Transform, store, config| {
                bindings
                    .weir_plugin_transformer()
                    .call_open(store, config, &self.input_fields)
            },
        )?;
        self.live = Some(live);
        Ok(fields)
    }

    /// Drops the live instance and starts a fresh one of the same build from
    /// the prepared component: a new store, instantiation from the pool and
    /// `open`. What a trap costs the next batch, and what the benchmark
    /// measures as instantiation.
    ///
    /// # Errors
    /// As [`Self::open`].
    pub fn reinstantiate(&mut self) -> Result<(), PluginError> {
        self.live = None;
        self.start().map(drop)
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

    /// Whether the component imports `keyed-state` and so needs a state store.
    pub fn is_stateful(&self) -> bool {
        self.stateful
    }

    /// Gives a stateful transform its keyed state.
    pub fn attach_state(&mut self, state: crate::operator::wasm_state::KeyedState) {
        self.keyed = Some(state);
    }

    /// The keyed state, for the query to load and commit it.
    pub fn keyed_state_mut(&mut self) -> Option<&mut crate::operator::wasm_state::KeyedState> {
        self.keyed.as_mut()
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
        let keyed = &mut self.keyed;
        let output = self.rt.call(
            &mut self.live,
            batch,
            info,
            Phase::InTransform,
            |bindings: &transform::Transform, store, rep| {
                // The keyed state lives in the store for the length of the call.
                store.data_mut().keyed = keyed.take();
                let result = bindings.weir_plugin_transformer().call_process(
                    &mut *store,
                    &wit_info(info),
                    rep,
                );
                *keyed = store.data_mut().keyed.take();
                result
            },
        )?;
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
        let out = self.conform(out).map_err(malformed)?;
        match &self.projection {
            None => Ok(out),
            Some(columns) => RecordBatch::try_new(
                Arc::clone(&self.output_schema),
                columns.iter().map(|i| Arc::clone(out.column(*i))).collect(),
            )
            .map_err(|e| malformed(e.to_string())),
        }
    }

    /// Checks a result against the declared output schema and adopts the
    /// declared field metadata (names, types and order must match).
    fn conform(&self, out: RecordBatch) -> Result<RecordBatch, String> {
        let expected = &self.declared_schema;
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
    input_schema: SchemaRef,
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
        let input_fields = check_input(&options.name, input_schema)?;
        let delta_merge = (!options.sandbox.delta_merge.is_empty())
            .then(|| MergeGrants::new(options.sandbox.delta_merge.clone(), options.failpoint));
        let mut rt = Runtime::new(engine, plugin, options);
        rt.delta_merge = delta_merge;
        let mut linker = rt.linker()?;
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
            input_schema: Arc::clone(input_schema),
            live: None,
        };
        this.start()?;
        Ok(this)
    }

    /// Replaces the running build by `plugin` (between batches): opens it
    /// with the same config, grants and input, and only then drops the old
    /// instance. On refusal the old build keeps running.
    ///
    /// # Errors
    /// [`PluginError::Replacement`], saying why the build was refused.
    pub fn replace(&mut self, plugin: LoadedPlugin) -> Result<(), PluginError> {
        let new = Self::open(
            &self.rt.engine,
            plugin.clone(),
            self.rt.options.clone(),
            &self.input_schema,
        )
        .map_err(|e| PluginError::Replacement {
            plugin: self.rt.options.name.clone(),
            path: plugin.path.clone(),
            sha256: plugin.sha256.clone(),
            reason: e.to_string(),
        })?;
        self.rt.usage.instantiations += new.rt.usage.instantiations;
        self.rt.plugin = new.rt.plugin;
        self.pre = new.pre;
        self.live = new.live;
        Ok(())
    }

    fn start(&mut self) -> Result<(), PluginError> {
        let (live, ()) = self.rt.start(
            |store| self.pre.instantiate(store),
            |bindings: &sink::Sink, store, config| {
                bindings
                    .weir_plugin_writer()
                    .call_open(store, config, &self.input_fields)
            },
        )?;
        self.live = Some(live);
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
        if let Some(grants) = &self.rt.delta_merge {
            grants.lock().unwrap_or_else(|p| p.into_inner()).begin(info);
        }
        self.rt.call(
            &mut self.live,
            batch,
            info,
            Phase::InSink,
            |bindings: &sink::Sink, store, rep| {
                bindings
                    .weir_plugin_writer()
                    .call_write_batch(store, &wit_info(info), rep)
            },
        )
    }
}

pub(super) fn wit_info(info: &BatchInfo) -> wit::BatchInfo {
    wit::BatchInfo {
        query_id: info.query_id.clone(),
        batch_id: info.batch_id,
        attempt: info.attempt,
        timestamp_micros: info.timestamp_micros,
        partition: info.partition,
    }
}
