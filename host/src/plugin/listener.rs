//! A query-listener plugin (world `listener`): the instance a query's listener thread hands
//! each event to (see `query::listeners`).
//!
//! It runs in the same sandbox as every other plugin (`instance::Runtime`: memory limit, deadline,
//! fuel, grants), because a listener is tenant code like any other; a trap or a limit replaces the
//! instance, and the next event starts a fresh one.

use std::time::Instant;

use wasmtime::component::HasSelf;

use super::bindings::listener as world;
use super::engine::{LoadedPlugin, PluginEngine};
use super::error::PluginError;
use super::instance::{Live, PluginOptions, PluginUsage, Runtime};
use super::state::{BatchInfo, HostState};
use crate::failpoint::Phase;

/// One event of a query, as a listener hears it.
#[derive(Debug, Clone, PartialEq)]
pub enum QueryEvent {
    Started {
        id: String,
        run_id: String,
        name: String,
    },
    /// A committed batch's progress record (JSON).
    Progress { batch_id: u64, json: String },
    Idle {
        id: String,
        run_id: String,
        timestamp: String,
    },
    Terminated {
        id: String,
        run_id: String,
        error: Option<String>,
    },
}

impl QueryEvent {
    /// Spark's name for the event (`StreamingQueryListener`'s `onQuery...`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Started { .. } => "queryStarted",
            Self::Progress { .. } => "queryProgress",
            Self::Idle { .. } => "queryIdle",
            Self::Terminated { .. } => "queryTerminated",
        }
    }
}

/// A live listener plugin.
pub struct WasmListener {
    rt: Runtime,
    pre: world::ListenerPre<HostState>,
    live: Option<Live<world::Listener>>,
}

impl std::fmt::Debug for WasmListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmListener")
            .field("plugin", &self.rt.plugin)
            .finish_non_exhaustive()
    }
}

impl WasmListener {
    /// Instantiates the plugin and opens it with its config.
    ///
    /// # Errors
    /// When the component is not of world `listener`, traps while starting, or refuses its config.
    pub fn open(
        engine: &PluginEngine,
        plugin: LoadedPlugin,
        options: PluginOptions,
    ) -> Result<Self, PluginError> {
        let rt = Runtime::new(engine, plugin, options);
        let mut linker = rt.linker()?;
        world::Listener::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(|e| rt.err_instantiate(format!("{e:#}")))?;
        let pre = linker
            .instantiate_pre(&rt.plugin.component)
            .and_then(world::ListenerPre::new)
            .map_err(|e| rt.err_instantiate(format!("not a Weir listener plugin: {e:#}")))?;
        let mut this = Self {
            rt,
            pre,
            live: None,
        };
        this.start()?;
        Ok(this)
    }

    fn start(&mut self) -> Result<(), PluginError> {
        let (live, ()) = self.rt.start(
            |store| self.pre.instantiate(store),
            |bindings: &world::Listener, store, config| {
                bindings.weir_plugin_query_events().call_open(store, config)
            },
        )?;
        self.live = Some(live);
        Ok(())
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.rt.options.name
    }

    /// Calls and resources used so far.
    pub fn usage(&self) -> &PluginUsage {
        &self.rt.usage
    }

    /// Hands `event` to the plugin, under its deadline and fuel.
    ///
    /// # Errors
    /// The plugin's own error, a trap or a limit; the instance is replaced after anything but the
    /// plugin's own error.
    pub fn notify(&mut self, event: &QueryEvent) -> Result<(), PluginError> {
        if self.live.is_none() {
            self.start()?;
        }
        let Some(l) = self.live.as_mut() else {
            return Err(self.rt.err_instantiate("no live instance"));
        };
        let batch_id = match event {
            QueryEvent::Progress { batch_id, .. } => *batch_id,
            _ => 0,
        };
        let started = Instant::now();
        self.rt.arm(&mut l.store)?;
        let fuel_before = self.rt.fuel_left(&l.store);
        let info = BatchInfo {
            query_id: String::new(),
            batch_id,
            attempt: 0,
            timestamp_micros: 0,
            partition: 0,
        };
        l.store.data_mut().begin_call(&info, Phase::InSink);
        let events = l.bindings.weir_plugin_query_events();
        let store = &mut l.store;
        let result = match event {
            QueryEvent::Started { id, run_id, name } => {
                events.call_query_started(&mut *store, id, run_id, name)
            }
            QueryEvent::Progress { json, .. } => events.call_query_progress(&mut *store, json),
            QueryEvent::Idle {
                id,
                run_id,
                timestamp,
            } => events.call_query_idle(&mut *store, id, run_id, timestamp),
            QueryEvent::Terminated { id, run_id, error } => {
                events.call_query_terminated(&mut *store, id, run_id, error.as_deref())
            }
        };
        l.store.data_mut().call.phase = None;
        l.store.data().log.end();
        self.rt.account(&l.store, started, fuel_before);
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.rt.plugin_failure(batch_id, e)),
            Err(e) => {
                let err = self.rt.classify(&l.store, batch_id, &e);
                self.live = None;
                Err(err)
            }
        }
    }
}
