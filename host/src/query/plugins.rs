//! The query's plugins: the engine they share (its pool sized for all of them), the sandbox
//! each is given from the pipeline file, and the scalar functions of `[[function]]`.

use std::sync::Arc;

use super::QueryError;
use super::QueryOptions;
use super::listeners::{Hearer, Listeners, webhook_target};
use crate::failpoint::Failpoint;
use crate::plugin::{
    EngineOptions, FunctionSignature, PluginEngine, PluginError, PluginOptions, PoolOptions,
    ReplayKey, Sandbox, SharedFunction, WasmFunction, WasmListener, env_from_host,
};
use crate::spec::{self, Pipeline, SinkSpec, TransformSpec};
use crate::sql::{PluginCall, PluginFunction};

/// What every plugin of a query is opened with.
pub(super) struct PluginContext<'a> {
    pub engine: &'a PluginEngine,
    pub replay_key: ReplayKey,
    /// Whether the host's policy lets plugins reach private networks.
    pub private_networks: bool,
    pub failpoint: Option<Failpoint>,
}

impl PluginContext<'_> {
    /// The sandbox of plugin `name` as the pipeline file sets it; granted
    /// environment variables are read from the host now.
    pub(super) fn sandbox(
        &self,
        name: &str,
        limits: &spec::PluginLimits,
        capabilities: &spec::Capabilities,
    ) -> Result<Sandbox, PluginError> {
        Ok(Sandbox {
            memory_bytes: limits.memory_bytes,
            timeout: limits.timeout,
            fuel: limits.fuel,
            dirs: capabilities.dirs.clone(),
            env: env_from_host(name, &capabilities.env)?,
            http: capabilities.http.clone(),
            delta_merge: capabilities.delta_merge.clone(),
            private_networks: self.private_networks,
        })
    }
}

/// The engine every plugin of `pipeline` runs on: fuel metering when any plugin asks for it,
/// an instance pool sized for the plugins and their largest memory limit.
///
/// # Errors
/// When the engine cannot be made.
pub(super) fn engine(
    pipeline: &Pipeline,
    options: &QueryOptions,
) -> Result<PluginEngine, QueryError> {
    let wasm = || {
        pipeline
            .transforms
            .iter()
            .filter_map(TransformSpec::wasm)
            .chain(pipeline.functions.iter().map(|f| &f.plugin))
            .chain(pipeline.listeners.iter().filter_map(|l| match &l.kind {
                spec::ListenerKind::Plugin(p) => Some(p),
                spec::ListenerKind::Webhook { .. } => None,
            }))
    };
    let fuel = wasm().any(|t| t.limits.fuel.is_some())
        || matches!(&pipeline.sink, SinkSpec::Plugin(p) if p.limits.fuel.is_some());
    let memory_limits = wasm()
        .map(|t| t.limits.memory_bytes)
        .chain(match &pipeline.sink {
            SinkSpec::Plugin(p) => Some(p.limits.memory_bytes),
            _ => None,
        });
    let plugins = memory_limits.clone().count();
    Ok(PluginEngine::new(EngineOptions {
        cache_dir: options.cache_dir.clone(),
        fuel,
        pool: Some(PoolOptions::for_plugins(
            plugins,
            memory_limits.max().unwrap_or(0),
        )),
    })?)
}

/// The plugins of `[[function]]`, one instance each: as the SQL planner sees them, and as the
/// query reports their usage.
///
/// # Errors
/// When a plugin does not load, is not its pinned build, or refuses its signature.
pub(super) fn functions(
    pipeline: &Pipeline,
    ctx: &PluginContext<'_>,
) -> Result<(Vec<PluginFunction>, Vec<Arc<SharedFunction>>), QueryError> {
    let mut functions = Vec::with_capacity(pipeline.functions.len());
    let mut function_plugins = Vec::with_capacity(pipeline.functions.len());
    for f in &pipeline.functions {
        let loaded = ctx.engine.load(&f.name, &f.plugin.plugin)?;
        loaded.check_pin(f.plugin.sha256.as_deref())?;
        let instance = WasmFunction::open(
            ctx.engine,
            loaded,
            PluginOptions {
                name: f.name.clone(),
                config_json: f.plugin.config.to_string(),
                sandbox: ctx.sandbox(&f.name, &f.plugin.limits, &f.plugin.capabilities)?,
                failpoint: ctx.failpoint,
                replay_key: ctx.replay_key.clone(),
            },
            vec![FunctionSignature {
                name: f.name.clone(),
                arguments: f.arguments.clone(),
                returns: f.returns.clone(),
            }],
        )?;
        let shared = SharedFunction::new(instance);
        functions.push(PluginFunction {
            name: f.name.clone(),
            arguments: f.arguments.clone(),
            returns: f.returns.clone(),
            call: Some(Arc::clone(&shared) as Arc<dyn PluginCall>),
        });
        function_plugins.push(shared);
    }
    Ok((functions, function_plugins))
}

/// The `[[listener]]`s of `pipeline`, opened (a plugin that does not load or refuses its config
/// fails the start, as any plugin's) and handed to their own thread.
///
/// # Errors
/// When a listener plugin does not load, is not its pinned build, or refuses its config.
pub(super) fn listeners(
    pipeline: &Pipeline,
    ctx: &PluginContext<'_>,
) -> Result<Listeners, QueryError> {
    let mut hearers = Vec::with_capacity(pipeline.listeners.len());
    for l in &pipeline.listeners {
        let hearer = match &l.kind {
            spec::ListenerKind::Plugin(p) => {
                let loaded = ctx.engine.load(&l.name, &p.plugin)?;
                loaded.check_pin(p.sha256.as_deref())?;
                let listener = WasmListener::open(
                    ctx.engine,
                    loaded,
                    PluginOptions {
                        name: l.name.clone(),
                        config_json: p.config.to_string(),
                        sandbox: ctx.sandbox(&l.name, &p.limits, &p.capabilities)?,
                        failpoint: None,
                        replay_key: ctx.replay_key.clone(),
                    },
                )?;
                Hearer::Plugin(Box::new(listener))
            }
            spec::ListenerKind::Webhook { url } => Hearer::Webhook {
                target: webhook_target(url).map_err(|message| QueryError::Invalid {
                    query: pipeline.query.name.clone(),
                    message: format!("listener {}: {message}", l.name),
                })?,
                private_networks: ctx.private_networks,
            },
        };
        hearers.push((l.name.clone(), hearer));
    }
    Ok(Listeners::start(&pipeline.query.name, hearers))
}
